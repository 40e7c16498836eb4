//! The decode pool: threads that turn host batches into image tensors, a few batches ahead of
//! the trainer. A batch is a job; its samples are claimed one at a time by whichever thread is
//! free, and each is decoded straight into its own part of the batch tensor. Memory is the
//! tensors of the batches in flight plus each thread's scratch: flat whatever the dataset size.

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::device::{DeviceOut, Lead};
use super::{ImageDecoder, ImageSpec};
use crate::batch::Batch;
use crate::dataset::Dataset;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::util::Unpoison;

/// Alignment of a batch tensor (a cache line; what vector loads and DLPack consumers like).
const TENSOR_ALIGN: usize = 64;

/// One batch tensor: zeroed, aligned memory written by the decode threads, each into the
/// samples it claimed, then read-only once the job is complete.
pub(super) struct Tensor {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    /// The stage's count of tensor bytes alive, which this tensor is part of.
    gauge: Arc<AtomicU64>,
}

// SAFETY: the memory is owned by the tensor; writers touch disjoint sample ranges (each
// sample is claimed by exactly one thread through `Job::next`), and readers only read after
// the job is complete (the `done` count under its mutex orders the writes before the reads).
unsafe impl Send for Tensor {}
// SAFETY: as above.
unsafe impl Sync for Tensor {}

impl Tensor {
    pub(super) fn new(len: usize, gauge: &Arc<AtomicU64>) -> Result<Tensor> {
        if len == 0 {
            return Ok(Tensor {
                ptr: NonNull::dangling(),
                len: 0,
                gauge: gauge.clone(),
            });
        }
        let layout = AllocLayout::from_size_align(len, TENSOR_ALIGN)
            .map_err(|_| invalid(format!("a batch tensor of {len} bytes is too large")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::new(
                ErrorKind::Busy,
                format!("out of memory allocating a {len}-byte batch tensor"),
            )
        })?;
        gauge.fetch_add(len as u64, Ordering::Relaxed);
        Ok(Tensor {
            ptr,
            len,
            gauge: gauge.clone(),
        })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialised (zeroed) bytes owned by the tensor; called only once the
        // job is complete, when no thread writes any more.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes of sample `i` of `per` bytes each, for its one writer.
    ///
    /// # Safety
    /// The caller must be the only one to access sample `i` until the job is complete.
    #[allow(
        clippy::mut_from_ref,
        reason = "disjoint samples of one tensor, each written by its one decode thread (the unsafe contract)"
    )]
    unsafe fn sample_mut(&self, i: usize, per: usize) -> &mut [u8] {
        assert!((i + 1) * per <= self.len, "sample {i} outside the tensor");
        // SAFETY: inside the allocation (asserted); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(i * per), per) }
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if self.len > 0 {
            self.gauge.fetch_sub(self.len as u64, Ordering::Relaxed);
            // SAFETY: allocated in `new` with this size and alignment; freed once.
            unsafe {
                dealloc(
                    self.ptr.as_ptr(),
                    AllocLayout::from_size_align_unchecked(self.len, TENSOR_ALIGN),
                )
            }
        }
    }
}

/// Where a batch's tensor is made.
#[derive(Clone)]
pub(super) enum Target {
    /// Host memory: each sample decoded and resampled on the CPU straight into its place.
    Host(Arc<Tensor>),
    /// Device memory: each sample decoded whole (the hardware decoder, or the CPU stage for
    /// what it refuses), then one resize launch writes the tensor.
    Device(Arc<DeviceOut>),
}

/// A batch being decoded.
pub(super) struct Job {
    pub(super) batch: Batch,
    pub(super) target: Target,
    pub(super) spec: Arc<ImageSpec>,
    pub(super) dataset: Arc<Dataset>,
    pub(super) seed: u64,
    /// The next sample to claim.
    pub(super) next: AtomicUsize,
    /// The epoch was dropped: skip what is not claimed yet.
    pub(super) cancelled: Arc<AtomicBool>,
    /// Host target: each sample's checksum is verified by the decode thread before it decodes
    /// it (the loader left it, unframed and with checksums, to this stage).
    pub(super) verify_here: bool,
    pub(super) state: Mutex<JobState>,
    pub(super) finished: Condvar,
}

#[derive(Default)]
pub(super) struct JobState {
    pub(super) done: usize,
    /// Every sample is done and the tensor written (device: the resize launch has run).
    pub(super) complete: bool,
    pub(super) errors: Vec<(usize, Error)>,
    /// CPU seconds the decode threads spent on this batch.
    pub(super) cpu_s: f64,
}

impl Job {
    pub(super) fn len(&self) -> usize {
        self.batch.len()
    }

    /// Claims and decodes samples until none is left to claim.
    pub(super) fn work(&self, dec: &mut Result<ImageDecoder, String>) {
        let per = self.spec.sample_elems() * self.spec.dtype.size();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.len() {
                return;
            }
            let c0 = crate::sys::thread_cpu_seconds();
            let err = if self.cancelled.load(Ordering::Relaxed) {
                None
            } else {
                match &self.target {
                    Target::Host(t) => {
                        // SAFETY: `i` came from `next.fetch_add`, so this thread alone holds it.
                        let dst = unsafe { t.sample_mut(i, per) };
                        self.decode_one(i, dec, dst)
                    }
                    Target::Device(d) => match d.lead.get_or_init(|| self.lead(d)) {
                        Lead::Pipelined(plan) => self.decode_planned(i, dec, d, plan),
                        Lead::Chunked => self.decode_whole(i, dec, d),
                        Lead::Failed(e) => {
                            d.stage.counted(None);
                            Some(e.clone())
                        }
                    },
                }
            };
            let cpu = crate::sys::thread_cpu_seconds() - c0;
            let mut st = self.state.lock().unpoisoned();
            st.cpu_s += cpu;
            if let Some(e) = err {
                st.errors.push((i, e));
            }
            st.done += 1;
            if st.done < self.len() {
                continue;
            }
            if let Target::Device(d) = &self.target {
                // The last sample is in: the resize launch, outside the lock.
                drop(st);
                let c0 = crate::sys::thread_cpu_seconds();
                let failed = self.resize(d, dec);
                let cpu = crate::sys::thread_cpu_seconds() - c0;
                st = self.state.lock().unpoisoned();
                st.cpu_s += cpu;
                if let Ok(lost) = &failed {
                    st.errors.extend(lost.iter().cloned());
                }
                if let Err(e) = failed {
                    // Every sample's image is lost with the launch.
                    let mut had: Vec<bool> = vec![false; self.len()];
                    for (k, _) in &st.errors {
                        had[*k] = true;
                    }
                    for (k, h) in had.into_iter().enumerate() {
                        if !h {
                            st.errors.push((k, e.clone()));
                        }
                    }
                }
            }
            st.complete = true;
            self.finished.notify_all();
        }
    }

    fn decode_one(
        &self,
        i: usize,
        dec: &mut Result<ImageDecoder, String>,
        dst: &mut [u8],
    ) -> Option<Error> {
        let id = self.batch.sample_ids()[i];
        let data = match self.batch.sample(i) {
            Ok(d) => d,
            // Already an error (read, frame or checksum): zero-filled, the error stays.
            Err(e) => return Some(e.clone()),
        };
        if self.verify_here {
            // The loader left this unframed sample's checksum to this thread.
            if let Err(e) = self.dataset.check_sample(id as usize, data, true) {
                dst.fill(0);
                return Some(e);
            }
        }
        let reason = match dec {
            Ok(d) => match d.decode_into(
                &self.spec,
                self.seed,
                self.batch.epoch(),
                id as u64,
                data,
                dst,
            ) {
                Ok(()) => return None,
                Err(r) => {
                    dst.fill(0);
                    r
                }
            },
            Err(e) => e.clone(),
        };
        Some(self.decode_error(id, reason))
    }

    /// The error of sample `id` that could not be decoded for `reason`.
    pub(super) fn decode_error(&self, id: u32, reason: String) -> Error {
        let s = self.dataset.sample(id as usize);
        let e = Error::new(
            ErrorKind::InvalidInput,
            format!(
                "sample {} ({}): cannot decode: {reason}",
                id,
                self.dataset.key(id as usize)
            ),
        )
        .with_path(self.dataset.file(s.file).path)
        .with_range(s.offset, s.len as u64)
        .with_sample(id as u64);
        self.dataset.sources.named(e)
    }

    /// Waits until every sample is done or `until` passes; the failed ones and the decode CPU
    /// seconds, or `None` if samples are still being decoded.
    pub(super) fn wait_until(&self, until: Instant) -> Option<(Vec<(usize, Error)>, f64)> {
        let mut st = self.state.lock().unpoisoned();
        while !st.complete && self.len() > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self.finished.wait_timeout(st, left).unpoisoned().0;
        }
        Some((std::mem::take(&mut st.errors), st.cpu_s))
    }

    /// Samples decoded so far.
    pub(super) fn done(&self) -> usize {
        self.state.lock().unpoisoned().done
    }
}

/// The threads and their queue of jobs.
pub(super) struct Pool {
    queue: Mutex<PoolQueue>,
    wake: Condvar,
}

#[derive(Default)]
struct PoolQueue {
    pub(super) jobs: VecDeque<Arc<Job>>,
    closing: bool,
}

/// Stops and joins the pool's threads when the last [`ImageLoader`] clone goes.
pub(super) struct PoolHandle {
    pub(super) pool: Arc<Pool>,
    pub(super) threads: Vec<JoinHandle<()>>,
    /// Bytes of the host batch tensors alive (made by the feeder, dropped with their batches).
    pub(super) tensor_bytes: Arc<AtomicU64>,
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        self.pool.queue.lock().unpoisoned().closing = true;
        self.pool.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Pool {
    pub(super) fn start(spec: &Arc<ImageSpec>) -> Result<PoolHandle> {
        let pool = Arc::new(Pool {
            queue: Mutex::new(PoolQueue::default()),
            wake: Condvar::new(),
        });
        let mut threads = Vec::new();
        for n in 0..spec.thread_count() {
            let (p, s) = (pool.clone(), spec.clone());
            let t = std::thread::Builder::new()
                .name(format!("gpufeed-decode-{n}"))
                .spawn(move || p.run(&s))
                .map_err(|e| Error::io("cannot start a decode thread", e))?;
            threads.push(t);
        }
        Ok(PoolHandle {
            pool,
            threads,
            tensor_bytes: Arc::default(),
        })
    }

    pub(super) fn run(&self, spec: &ImageSpec) {
        let mut dec = ImageDecoder::new(spec).map_err(|e| e.to_string());
        loop {
            let job = {
                let mut q = self.queue.lock().unpoisoned();
                loop {
                    // Jobs whose samples are all claimed leave the queue.
                    while q
                        .jobs
                        .front()
                        .is_some_and(|j| j.next.load(Ordering::Relaxed) >= j.len())
                    {
                        q.jobs.pop_front();
                    }
                    if let Some(j) = q.jobs.front() {
                        break j.clone();
                    }
                    if q.closing {
                        return;
                    }
                    q = self.wake.wait(q).unpoisoned();
                }
            };
            job.work(&mut dec);
            // A job fully claimed leaves the queue now, not at the next wake-up: it holds its
            // tensor (a device job, one of the pool's), which must return once its batch goes.
            self.queue
                .lock()
                .unpoisoned()
                .jobs
                .retain(|j| j.next.load(Ordering::Relaxed) < j.len());
            drop(job);
        }
    }

    pub(super) fn submit(&self, job: Arc<Job>) {
        self.queue.lock().unpoisoned().jobs.push_back(job);
        self.wake.notify_all();
    }
}
