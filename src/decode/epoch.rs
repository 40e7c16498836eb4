//! One epoch of image batches, in order, a few decoded ahead of the one handed out.

use super::pool::Job;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::device::{DeviceStage, RouteCounts};
use super::phases::{Phase, PhaseSnap};
use super::ImageSpec;
use crate::batch::BatchMeta;
use crate::error::{Error, ErrorKind, Result};
use crate::loader::{BatchTiming, FrontDoor, Holders, LoaderStats, StallStats};
use crate::util::Unpoison;

use super::batch::ImageBatch;
use super::loader::{decode_bytes, Feed};

/// The image batches of one epoch, in order: a feeder thread queues each host batch for the
/// decode threads as soon as the loader delivers it, up to `prefetch_batches` ahead of the one
/// handed out. Dropping it stops the reading and the decoding of what is not claimed.
pub struct ImageEpoch {
    pub(super) rx: Option<Receiver<Result<Arc<Job>>>>,
    pub(super) feeder: Option<JoinHandle<()>>,
    pub(super) shared: Arc<Feed>,
    pub(super) spec: Arc<ImageSpec>,
    pub(super) batches: u32,
    pub(super) stats: LoaderStats,
    /// The reading's stall figures at the previous batch (to split this wait like them).
    pub(super) read_seen: StallStats,
    /// The caller's limit on one wait for a batch.
    pub(super) timeout: Option<Duration>,
    pub(super) door: FrontDoor,
    /// The loader epoch's ledger of who holds the read buffers.
    pub(super) holders: Arc<Holders>,
    pub(super) threads: usize,
    pub(super) epoch: u64,
    /// The index of the batch to hand out next.
    pub(super) next: u32,
    /// When the wait for the next batch began (polls continue it).
    pub(super) waiting_since: Option<Instant>,
    /// The next batch's job once the feeder queued it, and when it arrived.
    pub(super) current: Option<(Arc<Job>, Instant)>,
    /// The host tensors' bytes alive, and the device stage: the decoded batches' memory.
    pub(super) tensor_bytes: Arc<AtomicU64>,
    pub(super) device_stage: Option<Arc<DeviceStage>>,
    /// The device stage's phase totals and route counts when the epoch began.
    pub(super) phases_from: Option<Box<(PhaseSnap, RouteCounts)>>,
}

impl ImageEpoch {
    /// Batches in this epoch (from batch 0).
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// Figures so far: the reading's (reads, bytes, the I/O thread's CPU), the consumer's
    /// waits split into storage / copy / verify / decode / other, and the decode threads' CPU.
    pub fn stats(&self) -> &LoaderStats {
        &self.stats
    }
}

impl ImageEpoch {
    /// Waits up to `wait` for the next decoded batch, as [`Epoch::poll_next`](crate::Epoch::poll_next) does:
    /// `Poll::Pending` if it is not ready yet (the wait goes on at the next call), and with a
    /// timeout, `Ready(Some(Err))` of kind `TimedOut` once one wait passes it (the epoch stays
    /// usable).
    pub fn poll_next(&mut self, wait: Duration) -> Poll<Option<Result<ImageBatch>>> {
        let start = Instant::now();
        let t0 = *self.waiting_since.get_or_insert(start);
        let mut until = start + wait;
        if let Some(t) = self.timeout {
            until = until.min(t0 + t);
        }
        if self.current.is_none() {
            let Some(rx) = self.rx.as_ref() else {
                self.waiting_since = None;
                return Poll::Ready(None);
            };
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(Ok(j)) => self.current = Some((j, Instant::now())),
                Ok(Err(e)) => {
                    self.rx = None;
                    self.waiting_since = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Err(RecvTimeoutError::Timeout) => return self.pending_or_timed_out(t0),
                Err(RecvTimeoutError::Disconnected) => {
                    self.rx = None;
                    self.waiting_since = None;
                    return Poll::Ready(None);
                }
            }
        }
        let (job, t1) = self.current.clone().expect("a job is current");
        let Some((failed, cpu_s)) = job.wait_until(until) else {
            return self.pending_or_timed_out(t0);
        };
        self.current = None;
        self.waiting_since = None;
        let batch = match self.device_stage.clone() {
            None => self.hand_out(&job, failed, cpu_s, t0, t1),
            Some(stage) => {
                let b = stage.clock.time(Phase::Handoff, || {
                    self.hand_out(&job, failed, cpu_s, t0, t1)
                });
                if let Some((p0, r0)) = self.phases_from.as_deref() {
                    self.stats.device_phases = Some(super::phases::table(
                        (p0, &stage.clock.snapshot()),
                        (r0, &stage.counters.snapshot()),
                        self.stats.decode_cpu_s,
                        self.stats.io_thread_cpu_s,
                    ));
                }
                b
            }
        };
        Poll::Ready(Some(Ok(batch)))
    }

    fn pending_or_timed_out(&mut self, t0: Instant) -> Poll<Option<Result<ImageBatch>>> {
        let Some(limit) = self.timeout else {
            return Poll::Pending;
        };
        let waited = t0.elapsed();
        if waited < limit {
            return Poll::Pending;
        }
        self.waiting_since = None;
        self.stats.consumer_wait_s += waited.as_secs_f64();
        self.stats.stall.other_s += waited.as_secs_f64();
        let what = match &self.current {
            Some((job, _)) => format!(
                "its decode has finished {} of its {} samples on {} decode thread(s)",
                job.done(),
                job.len(),
                self.threads
            ),
            None => format!(
                "it is not read yet (the decode stage holds the batches it was handed until \
                 you take them decoded); {}",
                self.holders.report(&self.holders.snapshot())
            ),
        };
        Poll::Ready(Some(Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "no batch for {:.1} s ({} is {:.1} s): epoch {} waits for batch {}: {what}",
                waited.as_secs_f64(),
                self.door.timeout(),
                limit.as_secs_f64(),
                self.epoch,
                self.next
            ),
        ))))
    }

    /// The decoded batch of `job`, its wait (from `t0`; queued at `t1`) split by cause.
    fn hand_out(
        &mut self,
        job: &Job,
        failed: Vec<(usize, Error)>,
        cpu_s: f64,
        t0: Instant,
        t1: Instant,
    ) -> ImageBatch {
        let t2 = Instant::now();
        // Waiting for the job is decode; waiting for it to be queued is the reading's, split
        // as the reading's own waits were since the last batch.
        let read = self.shared.stats.lock().unpoisoned().clone();
        let part = read.stall.since(&self.read_seen);
        self.read_seen = read.stall;
        let queued = (t1 - t0).as_secs_f64();
        let mut stall = StallStats::default();
        if part.total_s() > 0.0 {
            let k = queued / part.total_s();
            stall.storage_s = part.storage_s * k;
            stall.remote_s = part.remote_s * k;
            stall.copy_s = part.copy_s * k;
            stall.verify_s = part.verify_s * k;
            stall.other_s = part.other_s * k;
        } else {
            stall.other_s = queued;
        }
        stall.decode_s = (t2 - t1).as_secs_f64();
        let mut errors: Vec<Option<Arc<Error>>> = vec![None; job.len()];
        for (i, e) in failed {
            errors[i] = Some(Arc::new(e));
        }
        let b = &job.batch;
        let timing = BatchTiming {
            stall,
            read_s: b.timing().read_s,
            copy_s: b.timing().copy_s,
            queue_s: b.timing().queue_s,
        };
        let decode_cpu_s = self.stats.decode_cpu_s + cpu_s;
        let (mut st, wait) = (read, self.stats.consumer_wait_s + stall.total_s());
        let mut all = self.stats.stall;
        all.add(&stall);
        st.stall = all;
        st.consumer_wait_s = wait;
        st.decode_cpu_s = decode_cpu_s;
        st.memory.decode_bytes = decode_bytes(&self.tensor_bytes, self.device_stage.as_deref());
        self.stats = st;
        self.next = b.index() + 1;
        ImageBatch {
            meta: BatchMeta {
                timing,
                ..b.meta.clone()
            },
            errors,
            tensor: job.target.clone(),
            size: self.spec.size,
            dtype: self.spec.dtype,
            layout: self.spec.layout,
        }
    }
}

/// Waits for each batch as long as it takes, unless the loader has a timeout.
impl Iterator for ImageEpoch {
    type Item = Result<ImageBatch>;

    fn next(&mut self) -> Option<Result<ImageBatch>> {
        loop {
            if let Poll::Ready(r) = self.poll_next(Duration::from_secs(3600)) {
                return r;
            }
        }
    }
}

impl Drop for ImageEpoch {
    fn drop(&mut self) {
        // Unclaimed samples are skipped; claimed ones finish into tensors that live as long
        // as their job (the threads hold it), so nothing is freed under a writer. Closing the
        // channel ends the feeder, which drops the loader's epoch (waiting for its reads).
        self.shared.cancelled.store(true, Ordering::Relaxed);
        self.rx = None;
        if let Some(f) = self.feeder.take() {
            let _ = f.join();
        }
    }
}

impl std::fmt::Debug for ImageEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageEpoch")
            .field("batches", &self.batches)
            .finish_non_exhaustive()
    }
}
