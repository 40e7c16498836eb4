//! The consumer's side of an epoch: groups arrive out of order, batches leave in order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::batch::{Batch, BatchMeta, Memory};
use crate::dataset::{Dataset, SampleSpan};
use crate::error::{Error, ErrorKind, Result};

use super::holders::Holders;
use super::worker::{GroupDone, Msg, Retired, Service};
use super::{BatchTiming, Checker, FrontDoor, LoaderStats, StallStats};

/// How long a consumer waits, with the loader blocked on memory, before it is told who holds it.
pub(crate) const STALL_NOTICE_AFTER: Duration = Duration::from_secs(30);

/// A group's timeline, kept with each of its batches until handed out.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupTimes {
    read_done: Instant,
    remote: bool,
    copy_done: Option<Instant>,
    checks_done: Option<Instant>,
    arrived: Instant,
    read_s: f64,
    copy_s: f64,
}

/// The batches of one epoch, in order. Dropping it stops the I/O thread (batches already
/// handed out stay valid).
pub struct Epoch {
    pub(super) epoch: u64,
    pub(super) dataset: Arc<Dataset>,
    /// Who checks the samples: the consumer checks what the I/O thread had not.
    pub(super) checker: Checker,
    pub(super) rx: Option<Receiver<Msg>>,
    /// Keeps the loader's I/O thread alive while this epoch is read.
    pub(super) service: Option<Arc<Service>>,
    pub(super) retired: Arc<Retired>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) next: u32,
    pub(super) batches: u32,
    pub(super) batch_size: usize,
    /// Positions of the rank's order from here on are padding.
    pub(super) padding_from: usize,
    /// Batches received, by index: groups complete out of order, batches leave in order.
    /// With each: how many of its samples (from the first) the I/O thread checked; the
    /// consumer checks the rest of a host batch as it hands it out.
    pub(super) queue: std::collections::BTreeMap<u32, (Batch, usize, GroupTimes)>,
    /// The batch this epoch's consumer is waiting for, for the I/O thread.
    pub(super) wants: Arc<super::worker::Wants>,
    /// The I/O thread's CPU seconds at the first and the latest group of this epoch.
    pub(super) io_cpu: Option<(f64, f64)>,
    pub(super) stats: LoaderStats,
    pub(super) failed: bool,
    /// Who holds the read buffers (for a long wait's report).
    pub(super) holders: Arc<Holders>,
    /// The caller's limit on one wait for a batch.
    pub(super) timeout: Option<Duration>,
    pub(super) door: FrontDoor,
    /// When the wait for the next batch began (polls continue it).
    pub(super) waiting_since: Option<Instant>,
    /// A long wait was reported this epoch.
    pub(super) noticed: bool,
}

impl Epoch {
    /// Batches in this epoch (from batch 0).
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// Figures so far.
    pub fn stats(&self) -> &LoaderStats {
        &self.stats
    }

    /// The epoch's number.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The index of the batch `next` gives next.
    pub fn position(&self) -> u32 {
        self.next
    }

    /// Waits up to `wait` for the next batch: `Poll::Ready(None)` at the epoch's end,
    /// `Poll::Pending` if it has not come yet (call again: the wait goes on, and its time counts
    /// as one wait in the stats and against the timeout). With a
    /// [`timeout`](super::LoaderBuilder::timeout), a wait that passes it gives
    /// `Ready(Some(Err))` of kind [`ErrorKind::TimedOut`], naming what holds the read buffers;
    /// the epoch stays usable. For callers that must stay responsive while waiting (a Python
    /// binding checking for Ctrl-C, an event loop); the iterator waits as long as it takes.
    pub fn poll_next(&mut self, wait: Duration) -> Poll<Option<Result<Batch>>> {
        if self.failed || self.next >= self.batches {
            return Poll::Ready(None);
        }
        let start = Instant::now();
        let t0 = *self.waiting_since.get_or_insert(start);
        let c0 = crate::sys::thread_cpu_seconds();
        let mut until = start + wait;
        if let Some(t) = self.timeout {
            until = until.min(t0 + t);
        }
        while !self.queue.contains_key(&self.next) {
            let Some(rx) = self.rx.as_ref() else {
                return Poll::Ready(None);
            };
            // The I/O thread hands this batch's group over as soon as it is read, checked
            // or not (the rest of its checks are done here).
            self.wants.set(self.next);
            let msg = rx.recv_timeout(until.saturating_duration_since(Instant::now()));
            match msg {
                Ok(Msg::Group(g)) => self.take_group(g),
                Ok(Msg::Engine(name)) => self.stats.engine = name,
                Ok(Msg::Failed(e)) => {
                    self.failed = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.stats.consumer_cpu_s += crate::sys::thread_cpu_seconds() - c0;
                    if self.timeout.is_some_and(|t| t0.elapsed() >= t) {
                        self.waiting_since = None;
                        let waited = t0.elapsed();
                        self.stats.consumer_wait_s += waited.as_secs_f64();
                        self.stats.stall.other_s += waited.as_secs_f64();
                        return Poll::Ready(Some(Err(self.timed_out(waited))));
                    }
                    return Poll::Pending;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.failed = true;
                    return Poll::Ready(Some(Err(Error::new(
                        ErrorKind::Io,
                        "the I/O thread ended before the epoch was complete",
                    ))));
                }
            }
        }
        self.wants.clear();
        self.waiting_since = None;
        Poll::Ready(Some(Ok(self.hand_out(t0, c0))))
    }

    /// The error for a wait that passed the caller's timeout.
    fn timed_out(&self, waited: Duration) -> Error {
        let s = self.holders.snapshot();
        Error::new(
            ErrorKind::TimedOut,
            format!(
                "no batch for {:.1} s ({} is {:.1} s): epoch {} waits for batch {}; {}",
                waited.as_secs_f64(),
                self.door.timeout(),
                self.timeout.unwrap_or_default().as_secs_f64(),
                self.epoch,
                self.next,
                self.holders.report(&s)
            ),
        )
    }

    /// Once an epoch, when the consumer has waited 30 s for a batch while
    /// the loader is blocked on memory (nothing free, nothing being read or copied): what holds
    /// the read buffers. Not an error: another thread may be about to drop its batches.
    pub fn stall_notice(&mut self) -> Option<String> {
        let since = self.waiting_since?;
        if self.noticed || since.elapsed() < STALL_NOTICE_AFTER {
            return None;
        }
        let s = self.holders.snapshot();
        if !Holders::blocked_on_memory(&s) {
            return None;
        }
        self.noticed = true;
        Some(format!(
            "epoch {} has waited {:.0} s for batch {} and no read can start: {}. The loader \
             waits on (set {} to make such a wait an error).",
            self.epoch,
            since.elapsed().as_secs_f64(),
            self.next,
            self.holders.report(&s),
            self.door.timeout()
        ))
    }

    /// Waits for the next batch as long as it takes, with no notice (the decode stage's feeder:
    /// it holds batches only until the consumer takes decoded ones, so a long wait there is the
    /// consumer's pace, not a stall).
    #[cfg(feature = "decode")]
    pub(crate) fn next_patiently(&mut self) -> Option<Result<Batch>> {
        loop {
            if let Poll::Ready(r) = self.poll_next(Duration::from_secs(3600)) {
                return r;
            }
        }
    }

    /// Who checks the samples (what is left to an image stage).
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the image stage checks what was left to it"
        )
    )]
    pub(crate) fn checker(&self) -> Checker {
        self.checker
    }

    /// The ledger of who holds the read buffers, shared with a stage that consumes this epoch.
    #[cfg(feature = "decode")]
    pub(crate) fn holders(&self) -> &Arc<Holders> {
        &self.holders
    }

    /// Takes the caller's timeout off this epoch (a stage that consumes it applies it to its
    /// own consumer instead).
    #[cfg(feature = "decode")]
    pub(crate) fn take_timeout(&mut self) -> Option<Duration> {
        self.timeout.take()
    }

    fn take_group(&mut self, g: GroupDone) {
        let GroupDone { meta: mut g, mem } = g;
        let arrived = Instant::now();
        let times = GroupTimes {
            read_done: g.read_done,
            remote: g.remote,
            copy_done: g.copy_done,
            checks_done: g.checks_done,
            arrived,
            read_s: (g.read_done - g.submitted).as_secs_f64(),
            copy_s: g.copy_done.map_or(0.0, |c| (c - g.read_done).as_secs_f64()),
        };
        let delivered = g.batches.start.max(self.next)..g.batches.end.max(self.next);
        self.holders.received(&mem, delivered);
        let first = self.io_cpu.map_or(g.io_cpu_s, |(f, _)| f);
        self.io_cpu = Some((first, g.io_cpu_s));
        self.stats.io_thread_cpu_s = g.io_cpu_s - first;
        self.stats.check_cpu_s += g.check_cpu_s;
        // Labels are looked up here, on the consumer's thread, unless a check already found the
        // data's own.
        if g.labels.is_empty() {
            g.labels.extend(self.dataset.index_labels(&g.ids));
        }
        // Batches are full but for the epoch's last, which ends its group.
        let b = self.batch_size;
        self.stats.reads += g.reads;
        self.stats.bytes_read += g.bytes_read;
        let mut ids = g.ids.into_iter();
        let mut spans = g.spans.into_iter();
        let mut labels = g.labels.into_iter();
        let mut checked = g.checked;
        for index in g.batches {
            let batch_checked = checked.min(b);
            checked -= batch_checked;
            let bids: Vec<u32> = ids.by_ref().take(b).collect();
            let bspans: Vec<SampleSpan> = spans.by_ref().take(b).collect();
            let blabels: Vec<i64> = labels.by_ref().take(b).collect();
            if index < self.next {
                continue; // resuming: batches before the start point are not handed out
            }
            let padding_from = self
                .padding_from
                .saturating_sub(index as usize * b)
                .min(bids.len());
            self.queue.insert(
                index,
                (
                    Batch {
                        meta: BatchMeta {
                            epoch: self.epoch,
                            index,
                            labels: blabels,
                            padding_from,
                            ids: bids,
                            timing: BatchTiming::default(),
                        },
                        spans: bspans,
                        mem: mem.clone(),
                    },
                    batch_checked,
                    times,
                ),
            );
        }
    }
}

impl Epoch {
    /// Takes batch `self.next` out of the queue (it is there), checks it on the host, and
    /// accounts the wait that began at `t0`.
    fn hand_out(&mut self, t0: Instant, c0: f64) -> Batch {
        let t1 = Instant::now();
        self.stats.consumer_wait_s += (t1 - t0).as_secs_f64();
        let (mut batch, checked, times) = self.queue.remove(&self.next).expect("batch is queued");
        let mut verify_s = 0.0;
        if let Memory::Host(region) = &batch.mem {
            let n = batch.meta.ids.len();
            if checked < n && self.checker.loader_checks() {
                // What the I/O thread had not checked when the consumer came for it.
                self.dataset.check_spans(
                    region.bytes(),
                    &batch.meta.ids,
                    &mut batch.spans,
                    &mut batch.meta.labels,
                    self.checker.loader_verifies(),
                    checked..n,
                );
                verify_s = t1.elapsed().as_secs_f64();
            }
        }
        let stall = StallStats::of_wait(
            t0,
            t1,
            times.read_done,
            times.copy_done,
            times.checks_done,
            verify_s,
            times.remote,
        );
        self.stats.stall.add(&stall);
        self.stats.consumer_cpu_s += crate::sys::thread_cpu_seconds() - c0;
        batch.meta.timing = BatchTiming {
            stall,
            read_s: times.read_s,
            copy_s: times.copy_s,
            queue_s: (t1.max(times.arrived) - times.arrived).as_secs_f64(),
        };
        self.holders.handed_out(&batch.mem);
        self.next = batch.index + 1;
        self.stats.batches += 1;
        self.stats.samples += batch.len() as u64;
        self.stats.padding += batch.padding_count() as u64;
        self.stats.sample_errors += batch.errors().count() as u64;
        self.stats.bytes_delivered += batch.bytes();
        batch
    }
}

/// Waits for each batch as long as it takes (a slow step or a pause is never an error), unless
/// the loader has a [`timeout`](super::LoaderBuilder::timeout). A wait with the loader blocked
/// on memory for 30 s prints, once, who holds the read buffers.
impl Iterator for Epoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        loop {
            match self.poll_next(Duration::from_secs(1)) {
                Poll::Ready(r) => return r,
                Poll::Pending => {
                    if let Some(n) = self.stall_notice() {
                        crate::io::notice(&n);
                    }
                }
            }
        }
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver makes the worker's next send fail; queued groups return their
        // slots as they drop.
        self.queue.clear();
        self.rx = None;
        // Until none of this epoch's reads or copies is in flight (they finish and are
        // discarded), so its slots and regions are back when this returns.
        self.retired.wait();
        self.service = None;
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("epoch", &self.epoch)
            .field("next", &self.next)
            .field("batches", &self.batches)
            .finish()
    }
}
