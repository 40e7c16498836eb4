//! The decode pool: threads that turn host batches into image tensors, a few batches ahead of
//! the trainer. A batch is a job; its samples are claimed one at a time by whichever thread is
//! free, and each is decoded straight into its own part of the batch tensor. Memory is the
//! tensors of the batches in flight plus each thread's scratch: flat whatever the dataset size.

use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::device::{DeviceStage, HardwareImage, Route, RouteCounts};
use super::{ImageDecoder, ImageSpec, Layout, PixelType};
use crate::batch::{Batch, BatchMeta};
use crate::dataset::Dataset;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::gpu::kernels::GfSample;
use crate::gpu::DeviceRegion;
use crate::loader::{
    BatchTiming, Checker, Epoch, FrontDoor, Holders, Loader, LoaderStats, StallStats, Taker,
};
use crate::util::Unpoison;

/// Alignment of a batch tensor (a cache line; what vector loads and DLPack consumers like).
const TENSOR_ALIGN: usize = 64;

/// One batch tensor: zeroed, aligned memory written by the decode threads, each into the
/// samples it claimed, then read-only once the job is complete.
struct Tensor {
    ptr: NonNull<u8>,
    len: usize,
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
    fn new(len: usize, gauge: &Arc<AtomicU64>) -> Result<Tensor> {
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

    fn bytes(&self) -> &[u8] {
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
enum Target {
    /// Host memory: each sample decoded and resampled on the CPU straight into its place.
    Host(Arc<Tensor>),
    /// Device memory: each sample decoded whole (the hardware decoder, or the CPU stage for
    /// what it refuses), then one resize launch writes the tensor.
    Device(Arc<DeviceOut>),
}

/// A device sample's image: decoded whole on the CPU (width, height, packed 8-bit RGB), or
/// left to the hardware decoder (its size from the image record).
enum Decoded {
    Pixels(u32, u32, Vec<u8>),
    Hardware(u32, u32),
}

/// A device batch's tensor and what its samples went through.
struct DeviceOut {
    /// The output tensor: a region of the stage's pool, with its ready event.
    tensor: DeviceRegion,
    stage: Arc<DeviceStage>,
    /// Each sample's checksum error, from the device's crc32c over the group.
    crc: Vec<Option<Error>>,
    /// Each sample's bytes on the host, read in one gathered copy when the job was made: all
    /// of a CPU-route sample, the header of a hardware-route one (`None`: failed already).
    host: Mutex<Vec<Option<Result<Vec<u8>>>>>,
    /// The last bytes of a hardware-route sample that `host` does not hold whole.
    tails: Vec<Vec<u8>>,
    /// Each sample decoded whole: width, height, packed RGB (the decoder's output buffer).
    decoded: Mutex<Vec<Option<Decoded>>>,
}

/// The reason of an image that decodes to another size than its record says (the device
/// path sizes its buffers from the records).
fn record_mismatch((w, h): (u32, u32), (rw, rh): (u32, u32)) -> String {
    format!("it decodes as {w}x{h} but its image record says {rw}x{rh}")
}

/// A batch being decoded.
struct Job {
    batch: Batch,
    target: Target,
    spec: Arc<ImageSpec>,
    dataset: Arc<Dataset>,
    seed: u64,
    /// The next sample to claim.
    next: AtomicUsize,
    /// The epoch was dropped: skip what is not claimed yet.
    cancelled: Arc<AtomicBool>,
    /// Host target: each sample's checksum is verified by the decode thread before it decodes
    /// it (the loader left it, unframed and with checksums, to this stage).
    verify_here: bool,
    state: Mutex<JobState>,
    finished: Condvar,
}

#[derive(Default)]
struct JobState {
    done: usize,
    /// Every sample is done and the tensor written (device: the resize launch has run).
    complete: bool,
    errors: Vec<(usize, Error)>,
    /// CPU seconds the decode threads spent on this batch.
    cpu_s: f64,
}

impl Job {
    fn len(&self) -> usize {
        self.batch.len()
    }

    /// Claims and decodes samples until none is left to claim.
    fn work(&self, dec: &mut Result<ImageDecoder, String>) {
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
                    Target::Device(d) => self.decode_whole(i, dec, d),
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

    /// Device path: sample `i` decoded whole into the job's decoded images, routed as the
    /// GPU routes it (the simulated device: the CPU stage stands in for nvJPEG). Its checksum
    /// was checked on the device when the job was made.
    fn decode_whole(
        &self,
        i: usize,
        dec: &mut Result<ImageDecoder, String>,
        d: &DeviceOut,
    ) -> Option<Error> {
        let id = self.batch.sample_ids()[i];
        if let Some(e) = &d.crc[i] {
            d.stage.counted(None);
            return Some(e.clone());
        }
        let whole_len = match self.batch.sample_range(i) {
            Ok(r) => r.len(),
            Err(e) => {
                // Already an error (read, frame): zero-filled, the error stays.
                d.stage.counted(None);
                return Some(e.clone());
            }
        };
        // Routed by the image's record (format v2 shards carry them; other formats had their
        // headers read once when the image loader was made), as the GPU routes without
        // reading the bytes on the host.
        let info = self
            .dataset
            .image_info()
            .ok()
            .and_then(|v| v.get(id as usize).copied());
        let way = d.stage.route_of(info.as_ref());
        // Taken, not copied: sample `i` is this thread's alone.
        let mut data = match d.host.lock().unpoisoned()[i].take() {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                d.stage.counted(None);
                return Some(e);
            }
            None => Vec::new(),
        };
        if way == Route::Hardware {
            // The engines decode it with the batch, straight from device memory, into a slot
            // sized from its own frame header (read from the bytes gathered to the host): a
            // record that understates the image cannot make the engine write past its slot.
            // Its end, to see that the image is all there (the engines would make up what a
            // truncated one lacks, without an error).
            let end = if data.len() == whole_len {
                &data[..]
            } else {
                &d.tails[i][..]
            };
            match crate::image::info(&data) {
                Some(h)
                    if super::device::route(Some(&h)) == Route::Hardware
                        && super::device::ends_complete(end) =>
                {
                    let r = info.expect("the hardware route needs a record");
                    if (h.width, h.height) != (r.width, r.height) {
                        d.stage.counted(None);
                        return Some(self.decode_error(
                            id,
                            record_mismatch((h.width, h.height), (r.width, r.height)),
                        ));
                    }
                    if let Err(reason) =
                        super::spec::check_pixels(h.width, h.height, self.spec.pixels_max)
                    {
                        d.stage.counted(None);
                        return Some(self.decode_error(id, reason));
                    }
                    d.decoded.lock().unpoisoned()[i] = Some(Decoded::Hardware(h.width, h.height));
                    return None;
                }
                // Its header is not where the engines could take it (beyond the bytes read,
                // or another kind than its record says), or its data does not end with the
                // image: the CPU route, on its whole bytes.
                _ => data.clear(),
            }
        }
        if data.is_empty() {
            if let Err(e) = DeviceStage::sample_bytes(&self.batch, i, &mut data) {
                d.stage.counted(None);
                return Some(e);
            }
        }
        let way = Route::Cpu;
        let dec = match dec {
            Ok(d) => d,
            Err(e) => {
                d.stage.counted(None);
                return Some(self.decode_error(id, e.clone()));
            }
        };
        let mut px = Vec::new();
        match dec.decode_rgb(&self.spec, &data, &mut px) {
            Ok((w, h))
                if info.is_some_and(|r| {
                    r.width > 0 && r.height > 0 && (r.width, r.height) != (w, h)
                }) =>
            {
                // The output buffers are sized from the records: one that lies is an error.
                let r = info.expect("checked");
                d.stage.counted(None);
                Some(self.decode_error(id, record_mismatch((w, h), (r.width, r.height))))
            }
            Ok((w, h)) => {
                d.stage.counted(Some(way));
                d.decoded.lock().unpoisoned()[i] = Some(Decoded::Pixels(w, h, px));
                None
            }
            Err(reason) => {
                d.stage.counted(None);
                Some(self.decode_error(id, reason))
            }
        }
    }

    /// Device path, once every sample is decoded: the batch in chunks whose decoded images
    /// fit the staging budget — per chunk, the CPU-decoded images packed and uploaded, the
    /// engines' batched decode of the rest into their slots (an image the engine rejects is
    /// decoded on the CPU instead), then one resize launch writing the chunk's part of the
    /// output tensor (a failed sample's `valid` is 0: zeros). Returns the samples lost on the
    /// way with their errors; on an error the whole tensor is zeroed.
    fn resize(
        &self,
        d: &DeviceOut,
        dec: &mut Result<ImageDecoder, String>,
    ) -> Result<Vec<(usize, Error)>> {
        let decoded = std::mem::take(&mut *d.decoded.lock().unpoisoned());
        if self.cancelled.load(Ordering::Relaxed) {
            return Ok(Vec::new()); // nobody will see this batch
        }
        let (r, len) = (d.tensor.index(), d.tensor.len());
        let got = self.resize_chunks(d, dec, decoded, r, len);
        if got.is_err() {
            // Every sample is lost: the tensor says so with zeros, not an older batch's pixels.
            let _ = d.stage.zero(r, len);
        }
        got
    }

    fn resize_chunks(
        &self,
        d: &DeviceOut,
        dec: &mut Result<ImageDecoder, String>,
        mut decoded: Vec<Option<Decoded>>,
        r: usize,
        len: usize,
    ) -> Result<Vec<(usize, Error)>> {
        use super::device::{STAGING_ALIGN, STAGING_MAX};
        let n = decoded.len();
        let per = len.checked_div(n).unwrap_or(0);
        let ids = self.batch.sample_ids();
        let bytes_of = |img: &Option<Decoded>| match img {
            Some(Decoded::Pixels(w, h, _) | Decoded::Hardware(w, h)) => {
                (*w as usize * *h as usize * 3).next_multiple_of(STAGING_ALIGN)
            }
            None => 0,
        };
        let mut lost = Vec::new();
        let mut start = 0;
        while start < n {
            // The chunk: samples from `start` while their images fit the budget (one at least).
            let mut end = start;
            let mut total = 0;
            while end < n && (end == start || total + bytes_of(&decoded[end]) <= STAGING_MAX) {
                total += bytes_of(&decoded[end]);
                end += 1;
            }
            // CPU-decoded images first (uploaded), then the engines' slots (not uploaded).
            let mut cpu = Vec::new();
            let mut samples = vec![GfSample::default(); end - start]; // valid = 0
            let mut slots = Vec::new();
            for (k, img) in decoded[start..end].iter_mut().enumerate() {
                let i = start + k;
                let (w, h) = match img {
                    Some(Decoded::Pixels(w, h, _) | Decoded::Hardware(w, h)) => (*w, *h),
                    None => continue,
                };
                let g = self
                    .spec
                    .geometry(self.seed, self.batch.epoch(), ids[i] as u64, (w, h));
                match img.take() {
                    Some(Decoded::Pixels(_, _, px)) => {
                        cpu.resize(cpu.len().next_multiple_of(STAGING_ALIGN), 0);
                        samples[k] = GfSample::new(&g, cpu.len() as u64, (w, h));
                        cpu.extend_from_slice(&px);
                    }
                    _ => slots.push((k, g, (w, h))),
                }
            }
            let mut at = cpu.len().next_multiple_of(STAGING_ALIGN);
            let mut hw = Vec::with_capacity(slots.len());
            for (k, g, (w, h)) in slots {
                samples[k] = GfSample::new(&g, at as u64, (w, h));
                hw.push(HardwareImage {
                    sample: start + k,
                    staging: at,
                    size: (w, h),
                });
                at = (at + w as usize * h as usize * 3).next_multiple_of(STAGING_ALIGN);
            }
            let staging_len = at.max(cpu.len());
            d.stage.stage_chunk(r, staging_len, &cpu)?;
            drop(cpu);
            let rejected = d.stage.decode_on_engine(r, &self.batch, &hw)?;
            let mut engine_ok = vec![true; hw.len()];
            // The engine's reason is dropped: the CPU decoder's, if it fails too, is kept.
            for (k, _) in rejected {
                engine_ok[k] = false;
                let h = hw[k];
                let id = ids[h.sample];
                let mut data = Vec::new();
                let mut px = Vec::new();
                let got = DeviceStage::sample_bytes(&self.batch, h.sample, &mut data)
                    .map_err(|e| e.to_string())
                    .and_then(|()| match dec {
                        Ok(dec) => dec.decode_rgb(&self.spec, &data, &mut px),
                        Err(e) => Err(e.clone()),
                    });
                match got {
                    Ok(size) if size == h.size => {
                        d.stage.stage_image(r, h.staging, &px)?;
                        d.stage.counted(Some(Route::Cpu));
                    }
                    Ok((w, hh)) => {
                        samples[h.sample - start].valid = 0;
                        d.stage.counted(None);
                        lost.push((
                            h.sample,
                            self.decode_error(id, record_mismatch((w, hh), h.size)),
                        ));
                    }
                    Err(reason) => {
                        samples[h.sample - start].valid = 0;
                        d.stage.counted(None);
                        lost.push((h.sample, self.decode_error(id, reason)));
                    }
                }
            }
            d.stage
                .launch(r, start * per, (end - start) * per, staging_len, &samples)?;
            for ok in engine_ok {
                if ok {
                    d.stage.counted(Some(Route::Hardware));
                }
            }
            start = end;
        }
        Ok(lost)
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
    fn decode_error(&self, id: u32, reason: String) -> Error {
        let s = self.dataset.sample(id as usize);
        Error::new(
            ErrorKind::InvalidInput,
            format!(
                "sample {} ({}): cannot decode: {reason}",
                id,
                self.dataset.key(id as usize)
            ),
        )
        .with_path(self.dataset.file(s.file).path)
        .with_range(s.offset, s.len as u64)
        .with_sample(id as u64)
    }

    /// Waits until every sample is done or `until` passes; the failed ones and the decode CPU
    /// seconds, or `None` if samples are still being decoded.
    fn wait_until(&self, until: Instant) -> Option<(Vec<(usize, Error)>, f64)> {
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
    fn done(&self) -> usize {
        self.state.lock().unpoisoned().done
    }
}

/// The threads and their queue of jobs.
struct Pool {
    queue: Mutex<PoolQueue>,
    wake: Condvar,
}

#[derive(Default)]
struct PoolQueue {
    jobs: VecDeque<Arc<Job>>,
    closing: bool,
}

/// Stops and joins the pool's threads when the last [`ImageLoader`] clone goes.
struct PoolHandle {
    pool: Arc<Pool>,
    threads: Vec<JoinHandle<()>>,
    /// Bytes of the host batch tensors alive (made by the feeder, dropped with their batches).
    tensor_bytes: Arc<AtomicU64>,
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
    fn start(spec: &Arc<ImageSpec>) -> Result<PoolHandle> {
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

    fn run(&self, spec: &ImageSpec) {
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

    fn submit(&self, job: Arc<Job>) {
        self.queue.lock().unpoisoned().jobs.push_back(job);
        self.wake.notify_all();
    }
}

/// A [`Loader`] whose batches are decoded into image tensors ([`Loader::decode_images`]).
/// Clones share the loader and the decode threads.
#[derive(Clone)]
pub struct ImageLoader {
    loader: Loader,
    spec: Arc<ImageSpec>,
    pool: Arc<PoolHandle>,
    /// The device side, for a loader whose batches are in device memory.
    device: Option<Arc<DeviceStage>>,
}

impl std::fmt::Debug for ImageLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageLoader")
            .field("spec", &self.spec)
            .field("threads", &self.pool.threads.len())
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// This loader's batches decoded and transformed by `spec`, on the loader's device: on the
    /// host, by the CPU stage into host tensors; on a device (CUDA or simulated), by the device
    /// pipeline — checksums by the crc32c kernel over the group in device memory, each image
    /// decoded whole, then one resize launch per batch into an output tensor from a pool made
    /// here, with a ready event — whose tensors equal the CPU stage's with `dct_scaling` off
    /// within the kernel's tolerance. Starts the decode threads.
    ///
    /// Images go to the GPU's JPEG engines (nvJPEG's batched decode, bitstreams read in device
    /// memory) or, for what those refuse, to the CPU ([`ImageLoader::routes`] counts them); on
    /// the simulated device the engines' stand-in is libjpeg-turbo. The CUDA side has not run
    /// on a GPU yet.
    pub fn decode_images(&self, spec: ImageSpec) -> Result<ImageLoader> {
        spec.validate()?;
        if self.is_device() {
            // The device pipeline routes by the image records: read now, once, for a format
            // that does not carry them (a progress line on a large folder).
            self.dataset().image_info()?;
        }
        let device = match self.device_pool() {
            None => None,
            Some(p) => Some(Arc::new(DeviceStage::new(
                p,
                &spec,
                self.plan_config().batch_size as usize,
                // The batches decoded ahead, the one being handed out, and two held by the
                // consumer.
                spec.prefetch_batches + 3,
            )?)),
        };
        let spec = Arc::new(spec);
        Ok(ImageLoader {
            loader: self.clone(),
            pool: Arc::new(Pool::start(&spec)?),
            spec,
            device,
        })
    }
}

impl ImageLoader {
    /// The underlying loader.
    pub fn loader(&self) -> &Loader {
        &self.loader
    }

    /// The spec in effect.
    pub fn spec(&self) -> &ImageSpec {
        &self.spec
    }

    /// Decode threads.
    pub fn threads(&self) -> usize {
        self.pool.threads.len()
    }

    /// The memory this loader holds: the reading's ([`Loader::memory`]) and its decoded
    /// batches ([`MemoryStats::decode_bytes`](crate::MemoryStats::decode_bytes), as now).
    pub fn memory(&self) -> crate::MemoryStats {
        crate::MemoryStats {
            decode_bytes: decode_bytes(&self.pool.tensor_bytes, self.device.as_deref()),
            ..self.loader.memory()
        }
    }

    /// Whether image batches are in device memory.
    pub fn is_device(&self) -> bool {
        self.device.is_some()
    }

    /// Device path: images by decoder route since this loader was made (`None` on the host).
    pub fn routes(&self) -> Option<RouteCounts> {
        self.device.as_ref().map(|d| d.counters.snapshot())
    }

    /// Device path: (free, total) output tensors of the pool made with this loader (`None` on
    /// the host). All are free when no batch is held and no epoch is running.
    pub fn output_tensors(&self) -> Option<(usize, usize)> {
        self.device
            .as_ref()
            .map(|d| (d.outputs.free_regions(), d.outputs.regions()))
    }

    /// The image batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: u64) -> Result<ImageEpoch> {
        self.epoch_from(epoch, 0)
    }

    /// The image batches of `epoch` from batch `start` (resuming): the same tensors an
    /// uninterrupted epoch gives from there.
    pub fn epoch_from(&self, epoch: u64, start: u32) -> Result<ImageEpoch> {
        Ok(self.decode_epoch(self.read_epoch(epoch, &[], start)?))
    }

    /// The image batches of what is left of `epoch` after it stopped at `stops` on other rank
    /// counts, from batch `start` of it ([`Loader::epoch_resumed`]).
    pub fn epoch_resumed(
        &self,
        epoch: u64,
        stops: &[crate::plan::Stop],
        start: u32,
    ) -> Result<ImageEpoch> {
        Ok(self.decode_epoch(self.read_epoch(epoch, stops, start)?))
    }

    /// The underlying loader's epoch for [`decode_epoch`](Self::decode_epoch), from batch
    /// `start`, with the checksums of unframed samples left to this stage: on the device path
    /// the crc32c kernel verifies them; on the host each decode thread, just before it decodes
    /// the sample (its bytes then come through the cache once, for both). An epoch asked of the
    /// loader directly is verified by it instead.
    pub fn read_epoch(&self, epoch: u64, stops: &[crate::plan::Stop], start: u32) -> Result<Epoch> {
        let taker = match self.device {
            Some(_) => Taker::Device,
            None => Taker::DecodeThreads,
        };
        self.loader.epoch_checked(epoch, stops, start, taker)
    }

    /// Decodes an epoch already asked of the underlying loader (one asked ahead, say).
    pub fn decode_epoch(&self, mut inner: Epoch) -> ImageEpoch {
        let batches = inner.batches();
        // The caller's time limit applies to its own waits for decoded batches; the feeder
        // waits for the reading as long as it takes (its pace is the consumer's).
        let timeout = inner.take_timeout();
        let holders = inner.holders().clone();
        let (epoch, next) = (inner.epoch(), inner.position());
        let shared = Arc::new(Feed {
            cancelled: Arc::new(AtomicBool::new(false)),
            stats: Mutex::new(LoaderStats::default()),
        });
        let (tx, rx) = sync_channel(self.spec.prefetch_batches);
        let feeder = {
            let (spec, pool, shared) = (self.spec.clone(), self.pool.clone(), shared.clone());
            let dataset = self.loader.dataset().clone();
            let seed = self.loader.plan_config().seed;
            let device = self.device.clone();
            let checker = inner.checker();
            std::thread::Builder::new()
                .name("gpufeed-decode-feed".into())
                .spawn(move || {
                    let ctx = FeedCtx {
                        spec: &spec,
                        pool: &pool,
                        shared: &shared,
                        dataset,
                        seed,
                        device,
                        checker,
                    };
                    feed(inner, tx, &ctx)
                })
        };
        let (rx, feeder) = match feeder {
            Ok(h) => (Some(rx), Some(h)),
            Err(e) => {
                // No thread: the epoch yields this error and ends.
                let (tx2, rx2) = sync_channel(1);
                let _ = tx2.send(Err(Error::io("cannot start the decode feeder thread", e)));
                (Some(rx2), None)
            }
        };
        ImageEpoch {
            rx,
            feeder,
            shared,
            spec: self.spec.clone(),
            batches,
            stats: LoaderStats {
                memory: self.memory(),
                ..LoaderStats::default()
            },
            tensor_bytes: self.pool.tensor_bytes.clone(),
            device_stage: self.device.clone(),
            read_seen: StallStats::default(),
            timeout,
            door: self.loader.front_door(),
            holders,
            threads: self.pool.threads.len(),
            epoch,
            next,
            waiting_since: None,
            current: None,
        }
    }
}

/// The image stage's decoded batches' bytes now: host tensors alive, or the device's pool of
/// output tensors.
fn decode_bytes(tensors: &AtomicU64, device: Option<&DeviceStage>) -> u64 {
    tensors.load(Ordering::Relaxed)
        + device.map_or(0, |d| {
            (d.outputs.regions() * d.outputs.region_bytes()) as u64
        })
}

/// What the feeder thread shares with its epoch.
struct Feed {
    cancelled: Arc<AtomicBool>,
    /// The reading's figures, after the latest host batch.
    stats: Mutex<LoaderStats>,
}

/// The feeder: takes the epoch's host batches in order, queues each as a decode job and hands
/// it to the consumer through `tx` (bounded: `prefetch_batches` jobs ahead). Ends at the epoch's
/// end, on an error (sent), or when the consumer is gone; dropping `inner` then waits for its
/// reads.
struct FeedCtx<'a> {
    spec: &'a Arc<ImageSpec>,
    pool: &'a PoolHandle,
    shared: &'a Feed,
    dataset: Arc<Dataset>,
    seed: u64,
    device: Option<Arc<DeviceStage>>,
    /// Who checks the epoch's samples: the decode threads ([`Job::verify_here`]) or the
    /// device's crc32c kernel, where the loader left the checksums to this stage.
    checker: Checker,
}

fn feed(mut inner: Epoch, tx: SyncSender<Result<Arc<Job>>>, ctx: &FeedCtx<'_>) {
    let FeedCtx {
        spec,
        pool,
        shared,
        ref dataset,
        seed,
        ref device,
        checker,
    } = *ctx;
    let verify_here = checker.decode_threads_verify();
    loop {
        let next = inner.next_patiently();
        *shared.stats.lock().unpoisoned() = inner.stats().clone();
        let job = match next {
            None => return,
            Some(Err(e)) => {
                let _ = tx.send(Err(e));
                return;
            }
            Some(Ok(batch)) => {
                let bytes = batch.len() * spec.sample_elems() * spec.dtype.size();
                let target = match device {
                    None => {
                        Tensor::new(bytes, &pool.tensor_bytes).map(|t| Target::Host(Arc::new(t)))
                    }
                    Some(stage) => {
                        // Flat memory: a tensor of the pool, waiting while the consumer holds
                        // them all; the checksums by the device's crc32c over the group.
                        let Some(r) = stage.outputs.take_waiting(&shared.cancelled) else {
                            return;
                        };
                        let tensor = stage.outputs.region(r, bytes);
                        let crc = stage.check_crcs(&batch, dataset, r, checker.device_verifies());
                        let records = dataset.image_info().ok();
                        let host = stage.host_bytes(&batch, records, &crc);
                        Ok(Target::Device(Arc::new(DeviceOut {
                            tensor,
                            stage: stage.clone(),
                            crc,
                            host: Mutex::new(host.head),
                            tails: host.tail,
                            decoded: Mutex::new((0..batch.len()).map(|_| None).collect()),
                        })))
                    }
                };
                target.map(|target| {
                    Arc::new(Job {
                        batch,
                        target,
                        spec: spec.clone(),
                        dataset: dataset.clone(),
                        seed,
                        next: AtomicUsize::new(0),
                        cancelled: shared.cancelled.clone(),
                        verify_here,
                        state: Mutex::new(JobState::default()),
                        finished: Condvar::new(),
                    })
                })
            }
        };
        if let Ok(j) = &job {
            pool.pool.submit(j.clone());
        }
        let failed = job.is_err();
        if tx.send(job).is_err() || failed {
            return;
        }
    }
}

/// The image batches of one epoch, in order: a feeder thread queues each host batch for the
/// decode threads as soon as the loader delivers it, up to `prefetch_batches` ahead of the one
/// handed out. Dropping it stops the reading and the decoding of what is not claimed.
pub struct ImageEpoch {
    rx: Option<Receiver<Result<Arc<Job>>>>,
    feeder: Option<JoinHandle<()>>,
    shared: Arc<Feed>,
    spec: Arc<ImageSpec>,
    batches: u32,
    stats: LoaderStats,
    /// The reading's stall figures at the previous batch (to split this wait like them).
    read_seen: StallStats,
    /// The caller's limit on one wait for a batch.
    timeout: Option<Duration>,
    door: FrontDoor,
    /// The loader epoch's ledger of who holds the read buffers.
    holders: Arc<Holders>,
    threads: usize,
    epoch: u64,
    /// The index of the batch to hand out next.
    next: u32,
    /// When the wait for the next batch began (polls continue it).
    waiting_since: Option<Instant>,
    /// The next batch's job once the feeder queued it, and when it arrived.
    current: Option<(Arc<Job>, Instant)>,
    /// The host tensors' bytes alive, and the device stage: the decoded batches' memory.
    tensor_bytes: Arc<AtomicU64>,
    device_stage: Option<Arc<DeviceStage>>,
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
    /// Waits up to `wait` for the next decoded batch, as [`Epoch::poll_next`] does:
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
        Poll::Ready(Some(Ok(self.hand_out(&job, failed, cpu_s, t0, t1))))
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

/// An element type a batch tensor can be viewed as.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The pixel type it stands for.
    const TYPE: PixelType;
}
impl Element for u8 {
    const TYPE: PixelType = PixelType::U8;
}
impl Element for f32 {
    const TYPE: PixelType = PixelType::F32;
}
impl Element for half::f16 {
    const TYPE: PixelType = PixelType::F16;
}
impl Element for half::bf16 {
    const TYPE: PixelType = PixelType::Bf16;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A batch of decoded images: one contiguous tensor ([N, 3, H, W] or [N, H, W, 3]) plus the
/// labels, ids and per-sample errors. Cheap to clone (the tensor is shared).
#[derive(Clone)]
pub struct ImageBatch {
    /// Epoch, place, ids, labels, padding, timing (decode included): what every batch says.
    meta: BatchMeta,
    errors: Vec<Option<Arc<Error>>>,
    tensor: Target,
    size: (u32, u32),
    dtype: PixelType,
    layout: Layout,
}

impl std::ops::Deref for ImageBatch {
    type Target = BatchMeta;
    fn deref(&self) -> &BatchMeta {
        &self.meta
    }
}

impl ImageBatch {
    /// The element type.
    pub fn dtype(&self) -> PixelType {
        self.dtype
    }
    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// The tensor's shape: [N, 3, H, W] (NCHW) or [N, H, W, 3] (NHWC).
    pub fn shape(&self) -> [usize; 4] {
        let (n, w, h) = (self.len(), self.size.0 as usize, self.size.1 as usize);
        match self.layout {
            Layout::Nchw => [n, 3, h, w],
            Layout::Nhwc => [n, h, w, 3],
        }
    }
    /// Strides in elements (compact, row-major).
    pub fn strides(&self) -> [usize; 4] {
        let s = self.shape();
        [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1]
    }
    /// The tensor's bytes (little-endian elements) for a host batch; empty for a device
    /// batch (see [`to_host`](Self::to_host)).
    pub fn bytes(&self) -> &[u8] {
        match &self.tensor {
            Target::Host(t) => t.bytes(),
            Target::Device(_) => &[],
        }
    }
    /// Whether the tensor is in device memory (a CUDA or simulated device).
    pub fn is_device(&self) -> bool {
        matches!(self.tensor, Target::Device(_))
    }
    /// The tensor's CUDA device address (`None` on the host or the simulated device).
    pub fn device_ptr(&self) -> Option<u64> {
        match &self.tensor {
            Target::Device(d) if d.tensor.device().is_some() => Some(d.tensor.ptr()),
            _ => None,
        }
    }
    /// The CUDA device holding the tensor (`None` on the host or the simulated device).
    pub fn device(&self) -> Option<u32> {
        match &self.tensor {
            Target::Device(d) => d.tensor.device(),
            Target::Host(_) => None,
        }
    }
    /// The event recorded after the kernel that wrote the tensor (`None` unless on CUDA): a
    /// consumer's stream waits on it ([`wait_on`](Self::wait_on)) rather than the host.
    pub fn ready_event(&self) -> Option<u64> {
        match &self.tensor {
            Target::Device(d) => d.tensor.ready_event(),
            Target::Host(_) => None,
        }
    }
    /// Makes `stream` wait for the tensor to be written, and orders the tensor's reuse after
    /// the work enqueued on `stream` before the last clone of this batch is dropped (nothing
    /// to do on the host; on the simulated device, a stream of
    /// [`SimDevice::consumer_stream`](crate::gpu::SimDevice::consumer_stream)). Every stream
    /// waited on is released, not only the last.
    ///
    /// # Safety
    /// As [`Batch::wait_on`](crate::Batch::wait_on): `stream` must be a live `CUstream` of the
    /// device's primary context (or 0, 1, 2) and stay live until the batch is dropped.
    pub unsafe fn wait_on(&self, stream: u64) -> Result<()> {
        match &self.tensor {
            // SAFETY: forwarded under the caller's guarantees.
            Target::Device(d) => unsafe { d.tensor.wait_on(stream) },
            Target::Host(_) => Ok(()),
        }
    }

    /// Orders the tensor's reuse after the work enqueued on `stream` before the last clone of
    /// this batch is dropped, without a wait (DLPack's `stream=-1`: the consumer orders its
    /// reads itself, on the legacy default stream as far as gpufeed can know).
    ///
    /// # Safety
    /// As for [`ImageBatch::wait_on`].
    pub unsafe fn release_after(&self, stream: u64) {
        if let Target::Device(d) = &self.tensor {
            // SAFETY: forwarded under the caller's guarantees.
            unsafe { d.tensor.release_after(stream) }
        }
    }
    /// The simulated device's address and length of the tensor (`None` elsewhere): what a
    /// test's simulated consumer kernel reads ([`crate::gpu::SimDevice::read_on`]).
    pub fn sim_ptr(&self) -> Option<(u64, usize)> {
        match &self.tensor {
            Target::Device(d) if d.tensor.is_simulated() => Some((d.tensor.ptr(), d.tensor.len())),
            _ => None,
        }
    }

    /// A copy of the tensor's bytes in host memory, wherever it is (for checks and tests: a
    /// device batch's copy waits for it).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        Ok(match &self.tensor {
            Target::Host(t) => t.bytes().to_vec(),
            Target::Device(d) => d.tensor.to_host()?,
        })
    }
    /// The tensor as elements of `T`, or `None` if `T` is not its type or the tensor is in
    /// device memory.
    pub fn view<T: Element>(&self) -> Option<&[T]> {
        if T::TYPE != self.dtype {
            return None;
        }
        let Target::Host(t) = &self.tensor else {
            return None;
        };
        let b = t.bytes();
        let n = b.len() / std::mem::size_of::<T>();
        // The tensor is 64-byte aligned and every bit pattern is a valid element (`Pod`), so
        // the cast cannot fail; it borrows the bytes, immutable while the batch lives.
        bytemuck::try_cast_slice(&b[..n * std::mem::size_of::<T>()]).ok()
    }
    /// The address of the tensor's first byte in host memory (stable while any clone lives);
    /// null for a device batch.
    pub fn as_ptr(&self) -> *const u8 {
        match &self.tensor {
            Target::Host(t) => t.ptr.as_ptr(),
            Target::Device(_) => std::ptr::null(),
        }
    }
    /// Sample `i`'s error, if it could not be delivered (its image is zero-filled).
    pub fn error(&self, i: usize) -> Option<&Error> {
        self.errors[i].as_deref()
    }
    /// The samples that failed, with their position in the batch.
    pub fn errors(&self) -> impl Iterator<Item = (usize, &Error)> {
        self.errors
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_deref().map(|e| (i, e)))
    }
    /// A value keeping the tensor's memory alive (for DLPack exports).
    pub fn keep_alive(&self) -> Box<dyn std::any::Any + Send> {
        match &self.tensor {
            Target::Host(t) => Box::new(t.clone()),
            Target::Device(d) => Box::new(d.clone()),
        }
    }
}

impl std::fmt::Debug for ImageBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageBatch")
            .field("epoch", &self.meta.epoch)
            .field("index", &self.meta.index)
            .field("shape", &self.shape())
            .field("dtype", &self.dtype)
            .field("errors", &self.errors().count())
            .finish()
    }
}
