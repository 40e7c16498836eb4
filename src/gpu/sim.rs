//! The adversarial simulated GPU: device memory in host memory, and every asynchronous
//! operation — copies both ways, memsets, kernel launches, the JPEG engine's batched decode —
//! queued on its stream and completed after a seeded delay, in any order the streams and events
//! allow. Each operation declares the memory it reads and writes (device buffers, host ranges,
//! a decoder's state); the simulator reports a *hazard* when
//!
//! - an operation runs while an operation enqueued before it, touching the same memory with
//!   a write on either side, is still pending (nothing ordered the two: on a GPU they race), or
//! - the host writes, frees, re-initialises or reads memory that a pending operation touches.
//!
//! Hazards are counted in [`SimDeviceStats`](super::SimDeviceStats) with a description of
//! each of the first few, which tests assert empty. Work makes progress only when the host
//! calls into the simulator (each call advances the clock by one tick; a wait advances it until
//! the work waited for has run), so a pipeline that forgot a wait sees its operations still
//! pending where a fast GPU might have hidden the bug.
//!
//! Addresses: buffer `id`'s byte `o` is at `id << 40 | o`, so kernel parameters and DLPack
//! pointers resolve to a buffer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::copy::DevicePool;
use super::dev::{
    other_device, BufOps, CopyCheck, CpuJpeg, DBuf, DEvent, DStream, DeviceOps, Entered, EventOps,
    Gpu, JpegEngine, JpegImage, JpegOps, KernelOps, Kernels, StreamOps,
};
use super::kernels::{GfEmit, GfSample, GfSpan};
use crate::error::{Error, ErrorKind, Result};
use crate::rng::Rng;
use crate::util::lock;

const ADDR_SHIFT: u32 = 40;

/// The legacy default stream's handle (`CU_STREAM_LEGACY`); 0 and 2 name it too here.
pub(crate) const LEGACY: u64 = 1;

/// Memory an operation touches.
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the JPEG engine's state"
    )
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Res {
    /// A device buffer, by id.
    Dev(u64),
    /// Host memory (absolute addresses).
    Host,
    /// A library's state (the JPEG decoder's), by id.
    State(u64),
}

/// One access: what, which bytes, whether written.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub(crate) res: Res,
    pub(crate) range: Range<u64>,
    pub(crate) write: bool,
}

impl Access {
    pub(crate) fn read(res: Res, range: Range<u64>) -> Access {
        Access {
            res,
            range,
            write: false,
        }
    }
    pub(crate) fn write(res: Res, range: Range<u64>) -> Access {
        Access {
            res,
            range,
            write: true,
        }
    }
    /// The whole of buffer `id`.
    pub(crate) fn buf(id: u64, write: bool) -> Access {
        Access {
            res: Res::Dev(id),
            range: 0..u64::MAX,
            write,
        }
    }
    fn conflicts(&self, o: &Access) -> bool {
        self.res == o.res
            && (self.write || o.write)
            && self.range.start < o.range.end
            && o.range.start < self.range.end
    }
}

/// Device memory: buffers by id.
#[derive(Default)]
pub(crate) struct Memory {
    bufs: HashMap<u64, Vec<u8>>,
}

impl Memory {
    /// Takes buffer `id` out (to be put back with [`Memory::put`]), so several can be used at
    /// once; an empty vector if it was freed.
    pub(crate) fn take(&mut self, id: u64) -> Vec<u8> {
        self.bufs.remove(&id).unwrap_or_default()
    }
    pub(crate) fn put(&mut self, id: u64, v: Vec<u8>) {
        self.bufs.insert(id, v);
    }
    /// Buffer `id`'s bytes (empty if freed).
    pub(crate) fn get_mut(&mut self, id: u64) -> &mut [u8] {
        self.bufs.get_mut(&id).map_or(&mut [], |v| v.as_mut_slice())
    }
}

type Run = Box<dyn FnOnce(&mut Memory) + Send>;

/// What holds an operation back besides its stream and delay, and what it is.
#[derive(Default)]
struct Gate {
    after: Option<u64>,
    not_before: Option<Instant>,
    device_side: bool,
}

struct Op {
    stream: u64,
    what: String,
    /// An operation that must complete first (a stream's wait on an event).
    after: Option<u64>,
    delay: u32,
    /// A modelled operation (the JPEG engines' batch) does not complete before this time.
    not_before: Option<Instant>,
    /// The device's own work (a DMA from pinned memory, a kernel): on a device whose work
    /// costs nothing ([`SimDevice::free_work`]), the host CPU its run takes here is counted in
    /// [`SimDeviceStats::device_cpu_ns`], to be taken out of the host's figures.
    device_side: bool,
    access: Vec<Access>,
    run: Option<Run>,
}

#[derive(Default)]
struct State {
    next: u64,
    mem: Memory,
    /// Pending operations by id (ids grow in enqueue order).
    pending: BTreeMap<u64, Op>,
    /// Each stream's pending operations, in order.
    streams: HashMap<u64, VecDeque<u64>>,
    /// Each event's marker: the last operation of the stream it was recorded on (`None`: that
    /// stream was idle, or never recorded).
    events: HashMap<u64, Option<u64>>,
}

/// A simulated device, for tests: device memory in host memory, and every device operation —
/// copies, memsets, kernel launches, the JPEG engine's decode — completing late and out of
/// order, checked against what other pending operations touch (see `gpu::sim`).
#[derive(Debug, Clone)]
pub struct SimDevice {
    /// Seeds the simulated operations' delays and order (mixed with `GPUFEED_SIM_SEED` when
    /// that is set, so a whole suite can run under other seeds).
    pub seed: u64,
    /// An operation completes after 0..=delay_max ticks of the simulated clock (one tick per
    /// call into the device).
    pub delay_max: u32,
    /// Every n-th launch of the resize kernel fails as a failed `cuLaunchKernel` would
    /// (0: none).
    pub fail_launch_every: u32,
    /// For benchmarking only, never for tests of pixels: the device's own work costs nothing,
    /// so that what a bench measures is the pipeline's host work. The resize kernel and the
    /// JPEG engine's stand-in do not run (their outputs keep what they held), operations
    /// complete at the next tick, copies are not checked, and the host CPU that the rest of
    /// the device's work takes here (the DMA of a group from the arena, the crc32c kernel) is
    /// counted in [`SimDeviceStats::device_cpu_ns`], for the bench to take out.
    pub free_work: bool,
    /// A modelled JPEG engine: each batched decode keeps the engines busy for `per batch +
    /// n × per image` of wall time, one batch after another, from when it is submitted
    /// (whatever its stream's order, as the engines do); the host's waits sleep until then.
    pub engine_time: Option<(Duration, Duration)>,
    /// Figures the test reads afterwards.
    pub stats: Arc<SimDeviceStats>,
    gpu: Arc<OnceLock<Arc<SimGpu>>>,
}

impl SimDevice {
    /// A simulated device with `seed` and the default delays.
    pub fn new(seed: u64) -> SimDevice {
        let extra = std::env::var("GPUFEED_SIM_SEED")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |v| v.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        SimDevice {
            seed: seed ^ extra,
            delay_max: 16,
            fail_launch_every: 0,
            free_work: false,
            engine_time: None,
            stats: Arc::default(),
            gpu: Arc::default(),
        }
    }

    /// A simulated device whose own work costs nothing ([`SimDevice::free_work`]), for
    /// measuring the host's share of the device pipeline: never for tests of pixels.
    pub fn free(seed: u64) -> SimDevice {
        SimDevice {
            delay_max: 0,
            free_work: true,
            ..SimDevice::new(seed)
        }
    }

    /// The simulated GPU (made at first use, with the settings then).
    pub(crate) fn gpu(&self) -> Arc<SimGpu> {
        self.gpu.get_or_init(|| SimGpu::new(self)).clone()
    }

    /// The simulated GPU as the device seam's handle.
    pub(crate) fn handle(&self) -> Gpu {
        Gpu::new(Arc::new(SimDev(self.gpu())))
    }

    /// A new stream on the simulated device, as a consumer (a trainer) would make: its raw
    /// handle, for [`crate::Batch::wait_on`] and [`SimDevice::read_on`].
    pub fn consumer_stream(&self) -> u64 {
        self.gpu().stream()
    }

    /// Enqueues on `stream` a kernel that reads `len` bytes at device address `ptr` (a
    /// consumer's work on a batch: `ptr` from `ImageBatch::sim_ptr`); it completes
    /// late, like every simulated operation, and is checked like them.
    pub fn read_on(&self, stream: u64, ptr: u64, len: usize) -> Result<()> {
        let (id, off) = SimGpu::resolve(ptr);
        let access = vec![Access::read(Res::Dev(id), off..off + len as u64)];
        self.gpu().enqueue(
            stream,
            "a consumer's kernel reading a batch",
            access,
            |_| {},
        )
    }

    /// Waits for everything queued on the simulated device.
    pub fn synchronize(&self) {
        self.gpu().sync_all();
    }

    /// The first hazards seen (at most 16), each said in a sentence; empty when none.
    pub fn hazards(&self) -> Vec<String> {
        lock(&self.stats.hazard_log).clone()
    }
}

/// What the simulated device saw.
#[derive(Debug, Default)]
pub struct SimDeviceStats {
    /// Copies completed.
    pub copies: AtomicU64,
    /// Copies whose source slot changed while the copy was in flight (must stay 0).
    pub source_changed: AtomicU64,
    /// Copies into a region that batches still held (must stay 0).
    pub region_in_use: AtomicU64,
    /// Most copies in flight at once.
    pub in_flight_max: AtomicU64,
    /// Device operations that raced another on the same memory, or memory the host touched
    /// while an operation on it was pending (must stay 0; see [`SimDevice::hazards`]).
    pub hazards: AtomicU64,
    /// The first hazards, described.
    pub hazard_log: Mutex<Vec<String>>,
    /// With [`SimDevice::free_work`]: host CPU nanoseconds the device's own work took here
    /// (to be taken out of the host's figures).
    pub device_cpu_ns: AtomicU64,
    /// JPEG engine batches submitted.
    pub engine_batches: AtomicU64,
    /// Images in the JPEG engine batches submitted.
    pub engine_images: AtomicU64,
}

impl DevicePool {
    /// `regions` buffers of `region_bytes` on the simulated device.
    pub fn sim(dev: &SimDevice, regions: usize, region_bytes: usize) -> Result<Arc<Self>> {
        Self::on(dev.handle(), regions, region_bytes)
    }
}

/// The simulated GPU behind the device seam ([`super::dev`]): each handle's operation queued on
/// its stream, completing late, checked against what other pending operations touch.
#[derive(Debug)]
pub(crate) struct SimDev(Arc<SimGpu>);

/// Simulated device memory: a buffer of the simulated GPU's memory, freed when dropped (a
/// hazard if an operation pending on it has not completed).
#[derive(Debug)]
struct SimBuf {
    gpu: Arc<SimGpu>,
    id: u64,
    len: usize,
}

#[derive(Debug)]
struct SimStream {
    gpu: Arc<SimGpu>,
    id: u64,
}

#[derive(Debug)]
struct SimEvent {
    gpu: Arc<SimGpu>,
    id: u64,
}

/// The kernels built for the host (`host_kernels`), launched as simulated operations.
#[derive(Debug)]
struct SimKernels;

/// The simulated buffer `b` is (an error for another device's).
fn sim_buf(b: &DBuf) -> Result<&SimBuf> {
    b.downcast::<SimBuf>()
        .ok_or_else(|| other_device("a buffer"))
}

fn sim_stream(s: &DStream) -> Result<&SimStream> {
    s.downcast::<SimStream>()
        .ok_or_else(|| other_device("a stream"))
}

impl SimBuf {
    /// The simulator's access to bytes `range` of this buffer.
    fn access(&self, range: Range<usize>, write: bool) -> Access {
        Access {
            res: Res::Dev(self.id),
            range: range.start as u64..range.end as u64,
            write,
        }
    }
}

impl Drop for SimBuf {
    fn drop(&mut self) {
        self.gpu.free(self.id);
    }
}

impl DeviceOps for SimDev {
    fn enter(&self) -> Result<Entered> {
        Ok(Entered(None))
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn stream(&self) -> Result<DStream> {
        Ok(DStream::new(Box::new(SimStream {
            gpu: self.0.clone(),
            id: self.0.stream(),
        })))
    }

    fn event(&self) -> Result<DEvent> {
        Ok(DEvent::new(Box::new(SimEvent {
            gpu: self.0.clone(),
            id: self.0.event(),
        })))
    }

    fn alloc(&self, len: usize) -> Result<DBuf> {
        Ok(DBuf::new(Box::new(SimBuf {
            gpu: self.0.clone(),
            id: self.0.alloc(len),
            len,
        })))
    }

    fn synchronize(&self) -> Result<()> {
        self.0.sync_all();
        Ok(())
    }

    /// The CPU decoder `cpu` standing in for the JPEG engines.
    fn jpeg(&self, cpu: CpuJpeg) -> Result<JpegEngine> {
        Ok(JpegEngine::new(Box::new(SimJpeg {
            state: self.0.alloc(0),
            gpu: self.0.clone(),
            dec: cpu,
            queue: self.0.stream(),
            done: self.0.event(),
        })))
    }

    fn kernels(&self) -> Result<Kernels> {
        if super::host_kernels::available() {
            Ok(Kernels::new(Box::new(SimKernels)))
        } else {
            Err(Error::new(
                ErrorKind::Unsupported,
                "the simulated device's kernels are not in this build (feature `sim` with a C++ \
                 compiler at build time)",
            ))
        }
    }

    /// Counts a copy into a region batches still view, and keeps the source's crc32c.
    unsafe fn copy_started(&self, held: bool, src: *const u8, len: usize) -> CopyCheck {
        if held {
            self.0.stats.region_in_use.fetch_add(1, Ordering::Relaxed);
        }
        self.0.dma_from(src as usize, len);
        if self.0.free {
            return CopyCheck(0); // not checked: the host's work is what is measured
        }
        // SAFETY: valid for `len` bytes per the caller's contract.
        CopyCheck(crate::util::crc32c(unsafe {
            std::slice::from_raw_parts(src, len)
        }))
    }

    /// A bench's device (free work, a modelled engine) pauses between polls as CUDA's does,
    /// so that the host's figures are not a spin of the simulator's; the tests' does not.
    fn poll_pause(&self) {
        if self.0.free || self.0.engine_time.is_some() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn copies_in_flight(&self, n: usize) {
        self.0
            .stats
            .in_flight_max
            .fetch_max(n as u64, Ordering::Relaxed);
    }

    /// The region holds what the source held when the copy started (a slot reused early shows
    /// here).
    fn copy_completed(&self, dst: &DBuf, len: usize, check: CopyCheck) -> Result<()> {
        self.0.stats.copies.fetch_add(1, Ordering::Relaxed);
        if self.0.free {
            return Ok(());
        }
        let got = self.0.peek(
            sim_buf(dst)?.id,
            0,
            len,
            "the copy stage's check of a completed copy",
        );
        if crate::util::crc32c(&got) != check.0 {
            self.0.stats.source_changed.fetch_add(1, Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::Io,
                "simulated device: a slot changed while its copy was in flight",
            ));
        }
        Ok(())
    }
}

impl BufOps for SimBuf {
    fn ptr(&self) -> u64 {
        SimGpu::addr(self.id, 0)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl StreamOps for SimStream {
    fn raw(&self) -> u64 {
        self.id
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.sync_stream(self.id);
        Ok(())
    }

    fn wait(&self, event: &DEvent) -> Result<()> {
        match event.downcast::<SimEvent>() {
            Some(e) => self.gpu.wait(self.id, e.id),
            None => Err(crate::error::invalid(
                "a stream and an event of two devices",
            )),
        }
    }

    unsafe fn copy_htod(
        &self,
        dst: &DBuf,
        off: usize,
        src: *const u8,
        len: usize,
        what: &str,
    ) -> Result<()> {
        let dst = sim_buf(dst)?;
        let (id, addr) = (dst.id, src as usize);
        let access = vec![
            Access::read(Res::Host, addr as u64..(addr + len) as u64),
            dst.access(off..off + len, true),
        ];
        // The copy stage's copy from the arena is a DMA on a GPU; others go through the
        // driver's staging (pageable memory), the host's work.
        let run = move |m: &mut Memory| {
            // SAFETY: the caller keeps the source valid until this operation has run (a stream
            // wait or an event on it says so).
            let src = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            if let Some(d) = m.get_mut(id).get_mut(off..off + len) {
                d.copy_from_slice(src);
            }
        };
        if self.gpu.is_dma(addr, len) {
            self.gpu.enqueue_device(self.id, what, None, access, run)
        } else {
            self.gpu.enqueue(self.id, what, access, run)
        }
    }

    unsafe fn copy_dtoh(
        &self,
        src: &DBuf,
        off: usize,
        dst: *mut u8,
        len: usize,
        what: &str,
    ) -> Result<()> {
        let src = sim_buf(src)?;
        let (id, addr) = (src.id, dst as usize);
        let access = vec![
            src.access(off..off + len, false),
            Access::write(Res::Host, addr as u64..(addr + len) as u64),
        ];
        self.gpu.enqueue(self.id, what, access, move |m| {
            // SAFETY: the caller keeps `dst` valid until this operation has run.
            let d = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
            if let Some(s) = m.get_mut(id).get(off..off + len) {
                d.copy_from_slice(s);
            }
        })
    }

    fn memset(&self, dst: &DBuf, off: usize, len: usize, what: &str) -> Result<()> {
        let dst = sim_buf(dst)?;
        let id = dst.id;
        self.gpu.enqueue(
            self.id,
            what,
            vec![dst.access(off..off + len, true)],
            move |m| {
                if let Some(d) = m.get_mut(id).get_mut(off..off + len) {
                    d.fill(0);
                }
            },
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl EventOps for SimEvent {
    unsafe fn record_raw(&self, raw: u64) -> Result<()> {
        self.gpu.record(self.id, raw)
    }

    unsafe fn wait_raw(&self, raw: u64) -> Result<()> {
        self.gpu.wait(raw, self.id)
    }

    fn done(&self) -> Result<bool> {
        Ok(self.gpu.done(self.id))
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.sync_event(self.id);
        Ok(())
    }

    fn raw(&self) -> Option<u64> {
        None
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl KernelOps for SimKernels {
    unsafe fn crc32c(
        &self,
        stream: &DStream,
        data: &DBuf,
        data_len: usize,
        spans: &DBuf,
        n: u32,
        lanes: &DBuf,
        out: &DBuf,
    ) -> Result<()> {
        let st = sim_stream(stream)?;
        let (data, spans, lanes, out) = (
            sim_buf(data)?,
            sim_buf(spans)?,
            sim_buf(lanes)?,
            sim_buf(out)?,
        );
        let lane_bytes = n as usize * 4 * super::kernels::CRC_LANES as usize;
        let (d, sp, o) = (data.id, spans.id, out.id);
        let nb = n as usize;
        let access = vec![
            data.access(0..data_len, false),
            spans.access(0..nb * 16, false),
            lanes.access(0..lane_bytes, true),
            out.access(0..nb * 4, true),
        ];
        let stats = st.gpu.stats.clone();
        st.gpu
            .enqueue_device(st.id, "the crc32c kernel", None, access, move |m| {
                let mut spans = vec![GfSpan::default(); nb];
                bytemuck::cast_slice_mut::<GfSpan, u8>(&mut spans)
                    .copy_from_slice(&m.get_mut(sp)[..nb * 16]);
                let data = m.take(d);
                let got = super::host_kernels::crc32c(&data[..data_len.min(data.len())], &spans);
                m.put(d, data);
                match got {
                    Ok(c) => m.get_mut(o)[..nb * 4].copy_from_slice(bytemuck::cast_slice(&c)),
                    Err(_) => note_fault(&stats, "the crc32c kernel read out of bounds"),
                }
            })
    }

    unsafe fn resize(
        &self,
        stream: &DStream,
        src: &DBuf,
        src_len: usize,
        samples: &DBuf,
        n: u32,
        emit: &GfEmit,
        out: &DBuf,
        out_off: usize,
        out_len: usize,
    ) -> Result<()> {
        let st = sim_stream(stream)?;
        if st.gpu.fail_launch() {
            return Err(Error::new(
                ErrorKind::Io,
                "cuLaunchKernel failed (the simulated device's injected fault)",
            ));
        }
        let (src, samples, out) = (sim_buf(src)?, sim_buf(samples)?, sim_buf(out)?);
        let (s, sa, o) = (src.id, samples.id, out.id);
        let nb = n as usize * std::mem::size_of::<GfSample>();
        let access = vec![
            src.access(0..src_len, false),
            samples.access(0..nb, false),
            out.access(out_off..out_off + out_len, true),
        ];
        let emit = *emit;
        let stats = st.gpu.stats.clone();
        let free = st.gpu.free;
        st.gpu
            .enqueue_device(st.id, "the resize kernel", None, access, move |m| {
                if free {
                    return; // its cost is the device's: not run
                }
                let mut samples = vec![GfSample::default(); n as usize];
                bytemuck::cast_slice_mut::<GfSample, u8>(&mut samples)
                    .copy_from_slice(&m.get_mut(sa)[..nb]);
                let src = m.take(s);
                let mut dst = m.take(o);
                let r = match (src.get(..src_len), dst.get_mut(out_off..out_off + out_len)) {
                    (Some(a), Some(b)) => super::host_kernels::resize(a, &samples, &emit, b),
                    _ => Err(crate::error::invalid("out of bounds")),
                };
                m.put(o, dst);
                if s != o {
                    m.put(s, src);
                }
                if r.is_err() {
                    note_fault(&stats, "the resize kernel touched memory out of bounds");
                }
            })
    }
}

/// The simulated device's JPEG engine: a CPU decoder standing in for the hardware, with
/// nvJPEG's contract — the decoder state is re-initialised by each batch on the host, the
/// engine reads the bitstreams when the batch is submitted (a stream wait is not assumed to
/// order it), and writes the images on the stream; a batch that fails may already have queued
/// writes into its outputs.
struct SimJpeg {
    gpu: Arc<SimGpu>,
    state: u64,
    dec: CpuJpeg,
    /// The engines' own queue: their writes run there, not after the earlier work of the
    /// stream a batch is given (the engines ignore it); that stream's later work waits for
    /// them through `done`.
    queue: u64,
    done: u64,
}

impl std::fmt::Debug for SimJpeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimJpeg")
            .field("state", &self.state)
            .finish()
    }
}

impl JpegOps for SimJpeg {
    /// The stand-in for `nvjpegDecodeBatchedInitialize` + `nvjpegDecodeBatched`.
    unsafe fn decode(
        &mut self,
        src: &DBuf,
        images: &[JpegImage],
        out: &DBuf,
        stream: &DStream,
    ) -> Result<()> {
        let (src_id, staging_id) = (sim_buf(src)?.id, sim_buf(out)?.id);
        let st = sim_stream(stream)?;
        let g = &self.gpu;
        // Initialisation rewrites the decoder's state on the host.
        g.host_access(
            &[Access::write(Res::State(self.state), 0..u64::MAX)],
            "nvjpegDecodeBatchedInitialize",
        );
        let mut done = Vec::with_capacity(images.len());
        let mut failed = None;
        // A device whose work costs nothing decodes nothing (its outputs keep what they held).
        let images_decoded = if g.free { &[][..] } else { images };
        for h in images_decoded {
            // The engine reads the bitstream when the batch is submitted.
            let data = g.peek(
                src_id,
                h.bits.start as u64,
                h.bits.len(),
                "the JPEG engine reads a bitstream",
            );
            match (self.dec)(&data) {
                Ok((size, px)) if size == h.size => done.push((h.out, px)),
                Ok(((w, hh), _)) if w as u64 * hh as u64 > h.size.0 as u64 * h.size.1 as u64 => {
                    // The engine writes the image its bitstream holds, past the slot it was
                    // given: on a GPU, other images' pixels or an illegal address.
                    let at = h.out as u64;
                    g.fault(format!(
                        "the JPEG engine wrote a {w}x{hh} image into a slot for {}x{} at byte \
                         {at} of the staging",
                        h.size.0, h.size.1
                    ));
                    failed.get_or_insert(format!("an image larger than its slot ({w}x{hh})"));
                }
                Ok(((w, hh), _)) => {
                    failed.get_or_insert(format!(
                        "an image decodes as {w}x{hh}, not the {}x{} it was given",
                        h.size.0, h.size.1
                    ));
                }
                // The engines decode a truncated bitstream without an error (nvJPEG's hardware
                // backend on an H200): its image comes back whole-sized, the rows its data
                // lacks made up. So does the stand-in (mid-gray where libjpeg-turbo stopped),
                // so that only the pipeline's own check keeps such an image off this route.
                Err(e) if e.contains("truncated JPEG") => {
                    done.push((h.out, vec![0x80; h.size.0 as usize * h.size.1 as usize * 3]));
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let mut access: Vec<Access> = images
            .iter()
            .map(|h| {
                let o = h.out as u64;
                Access::write(
                    Res::Dev(staging_id),
                    o..o + h.size.0 as u64 * h.size.1 as u64 * 3,
                )
            })
            .collect();
        access.push(Access::write(Res::State(self.state), 0..u64::MAX));
        if let Some(why) = failed {
            // A failed batch may have queued work already: its outputs are written (garbage).
            let spans: Vec<(usize, usize)> = images
                .iter()
                .map(|h| (h.out, h.size.0 as usize * h.size.1 as usize * 3))
                .collect();
            g.enqueue(
                self.queue,
                "a failed JPEG batch's queued work",
                access,
                move |m| {
                    let b = m.get_mut(staging_id);
                    for (o, n) in spans {
                        if let Some(d) = b.get_mut(o..o + n) {
                            d.fill(0x5a);
                        }
                    }
                },
            )?;
            self.ordered_after(st.id)?;
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("nvjpegDecodeBatched failed: NVJPEG_STATUS_BAD_JPEG (3) ({why})"),
            ));
        }
        let not_before = g.engine_batch(images.len());
        g.enqueue_device(
            self.queue,
            "the JPEG engine's batched decode",
            not_before,
            access,
            move |m| {
                let b = m.get_mut(staging_id);
                for (o, px) in done {
                    if let Some(d) = b.get_mut(o..o + px.len()) {
                        d.copy_from_slice(&px);
                    }
                }
            },
        )?;
        self.ordered_after(st.id)
    }
}

impl SimJpeg {
    /// The later work of stream `stream` waits for what the engines were given.
    fn ordered_after(&self, stream: u64) -> Result<()> {
        self.gpu.record(self.done, self.queue)?;
        self.gpu.wait(stream, self.done)
    }
}

/// A simulated kernel's fault (what would be an illegal address on a GPU), counted as a hazard.
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
fn note_fault(stats: &SimDeviceStats, what: &str) {
    stats.hazards.fetch_add(1, Ordering::Relaxed);
    let mut log = lock(&stats.hazard_log);
    if log.len() < 16 {
        log.push(what.to_string());
    }
}

/// The simulated GPU of one [`SimDevice`].
pub(crate) struct SimGpu {
    st: Mutex<(State, Rng)>,
    seed: u64,
    delay_max: u32,
    fail_every: u32,
    launches: std::sync::atomic::AtomicU64,
    pub(crate) stats: Arc<SimDeviceStats>,
    /// [`SimDevice::free_work`].
    pub(crate) free: bool,
    /// [`SimDevice::engine_time`], and when the modelled engines are next free.
    engine_time: Option<(Duration, Duration)>,
    engine_free_at: Mutex<Instant>,
    /// Sources of the copy stage's copies now starting (pinned memory on a GPU: a DMA).
    dma_src: Mutex<Vec<(usize, usize)>>,
}

impl std::fmt::Debug for SimGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGpu").field("seed", &self.seed).finish()
    }
}

/// Which handle a raw stream names (0 and 2, the default streams, are the legacy one here).
fn stream_of(raw: u64) -> u64 {
    if raw <= 2 {
        LEGACY
    } else {
        raw
    }
}

impl SimGpu {
    pub(crate) fn new(cfg: &SimDevice) -> Arc<SimGpu> {
        let mut s = State {
            next: 16, // ids below are special handles
            ..State::default()
        };
        s.streams.insert(LEGACY, VecDeque::new());
        Arc::new(SimGpu {
            st: Mutex::new((s, Rng::new(cfg.seed ^ 0x05ee_d9b0))),
            seed: cfg.seed,
            delay_max: cfg.delay_max,
            fail_every: cfg.fail_launch_every,
            launches: Default::default(),
            stats: cfg.stats.clone(),
            free: cfg.free_work,
            engine_time: cfg.engine_time,
            engine_free_at: Mutex::new(Instant::now()),
            dma_src: Mutex::new(Vec::new()),
        })
    }

    fn state(&self) -> MutexGuard<'_, (State, Rng)> {
        lock(&self.st)
    }

    fn id(s: &mut State) -> u64 {
        s.next += 1;
        s.next
    }

    /// The address of byte `off` of buffer `id`.
    pub(crate) fn addr(id: u64, off: u64) -> u64 {
        id << ADDR_SHIFT | off
    }

    /// The buffer and offset an address names.
    pub(crate) fn resolve(addr: u64) -> (u64, u64) {
        (addr >> ADDR_SHIFT, addr & ((1 << ADDR_SHIFT) - 1))
    }

    /// Whether this launch fails (every `fail_launch_every`-th).
    pub(crate) fn fail_launch(&self) -> bool {
        let n = self.launches.fetch_add(1, Ordering::Relaxed) + 1;
        self.fail_every > 0 && n.is_multiple_of(self.fail_every as u64)
    }

    /// `len` zeroed bytes of device memory; its id.
    pub(crate) fn alloc(&self, len: usize) -> u64 {
        let mut g = self.state();
        let id = Self::id(&mut g.0);
        g.0.mem.put(id, vec![0; len]);
        id
    }

    /// Frees buffer `id`: a hazard if a pending operation touches it.
    pub(crate) fn free(&self, id: u64) {
        self.host_access(&[Access::buf(id, true)], "free a device buffer");
        self.state().0.mem.bufs.remove(&id);
    }

    pub(crate) fn stream(&self) -> u64 {
        let mut g = self.state();
        let id = Self::id(&mut g.0);
        g.0.streams.insert(id, VecDeque::new());
        id
    }

    pub(crate) fn event(&self) -> u64 {
        let mut g = self.state();
        let id = Self::id(&mut g.0);
        g.0.events.insert(id, None);
        id
    }

    /// Enqueues `run` on `stream` (raw handle), touching `access`; it completes after a seeded
    /// delay, once everything before it on the stream has.
    pub(crate) fn enqueue(
        &self,
        stream: u64,
        what: impl Into<String>,
        access: Vec<Access>,
        run: impl FnOnce(&mut Memory) + Send + 'static,
    ) -> Result<()> {
        self.push(
            stream,
            what.into(),
            Gate::default(),
            access,
            Some(Box::new(run)),
        )
    }

    /// As [`enqueue`](Self::enqueue), for the device's own work (see [`Op::device_side`]),
    /// not completing before `not_before`.
    pub(crate) fn enqueue_device(
        &self,
        stream: u64,
        what: impl Into<String>,
        not_before: Option<Instant>,
        access: Vec<Access>,
        run: impl FnOnce(&mut Memory) + Send + 'static,
    ) -> Result<()> {
        let gate = Gate {
            after: None,
            not_before,
            device_side: true,
        };
        self.push(stream, what.into(), gate, access, Some(Box::new(run)))
    }

    /// The copy stage starts a copy from `src` (pinned memory on a GPU): the copy enqueued
    /// next from there is a DMA, the device's own work.
    /// Kept only where it counts: on a device whose work costs nothing.
    pub(crate) fn dma_from(&self, src: usize, len: usize) {
        if self.free {
            lock(&self.dma_src).push((src, len));
        }
    }

    /// Whether a copy from `src` is the copy stage's DMA (noted by [`dma_from`](Self::dma_from)).
    fn is_dma(&self, src: usize, len: usize) -> bool {
        if !self.free {
            return false; // `device_side` counts only where the device's work costs nothing
        }
        let mut v = lock(&self.dma_src);
        match v.iter().position(|&d| d == (src, len)) {
            Some(k) => {
                v.swap_remove(k);
                true
            }
            None => false,
        }
    }

    /// When a modelled engine batch of `n` images submitted now completes (`None`: no model).
    pub(crate) fn engine_batch(&self, n: usize) -> Option<Instant> {
        self.stats.engine_batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .engine_images
            .fetch_add(n as u64, Ordering::Relaxed);
        let (per_batch, per_image) = self.engine_time?;
        let mut free = lock(&self.engine_free_at);
        let start = (*free).max(Instant::now());
        *free = start + per_batch + per_image * n as u32;
        Some(*free)
    }

    fn push(
        &self,
        stream: u64,
        what: String,
        gate: Gate,
        access: Vec<Access>,
        run: Option<Run>,
    ) -> Result<()> {
        let stream = stream_of(stream);
        let mut g = self.state();
        let (s, rng) = &mut *g;
        if !s.streams.contains_key(&stream) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("simulated device: no stream {stream}"),
            ));
        }
        let id = Self::id(s);
        let delay = rng.below(self.delay_max as u64 + 1) as u32;
        s.pending.insert(
            id,
            Op {
                stream,
                what,
                after: gate.after,
                delay,
                not_before: gate.not_before,
                device_side: gate.device_side,
                access,
                run,
            },
        );
        s.streams.get_mut(&stream).expect("checked").push_back(id);
        self.tick(&mut g);
        Ok(())
    }

    /// Records `event` at the current end of `stream`.
    pub(crate) fn record(&self, event: u64, stream: u64) -> Result<()> {
        let stream = stream_of(stream);
        let mut g = self.state();
        let marker = match g.0.streams.get(&stream) {
            Some(q) => q.back().copied(),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("simulated device: no stream {stream}"),
                ))
            }
        };
        g.0.events.insert(event, marker);
        self.tick(&mut g);
        Ok(())
    }

    /// Makes `stream`'s later work wait for `event`.
    pub(crate) fn wait(&self, stream: u64, event: u64) -> Result<()> {
        let marker = self.state().0.events.get(&event).copied().flatten();
        let gate = Gate {
            after: marker,
            ..Gate::default()
        };
        self.push(stream, "a wait on an event".into(), gate, Vec::new(), None)
    }

    /// Whether the work before `event`'s record has completed (advances the clock).
    pub(crate) fn done(&self, event: u64) -> bool {
        let mut g = self.state();
        self.tick(&mut g);
        Self::event_done(&g.0, event)
    }

    fn event_done(s: &State, event: u64) -> bool {
        match s.events.get(&event).copied().flatten() {
            Some(op) => !s.pending.contains_key(&op),
            None => true,
        }
    }

    /// Runs the simulated device until `event`'s work has completed — that work and what it
    /// depends on only: a wait does not let unrelated work finish by the way.
    pub(crate) fn sync_event(&self, event: u64) {
        self.settle(|s| s.events.get(&event).copied().flatten());
    }

    /// Runs the simulated device until `stream` is idle (and only what that needs).
    pub(crate) fn sync_stream(&self, stream: u64) {
        let stream = stream_of(stream);
        self.settle(|s| s.streams.get(&stream).and_then(|q| q.back()).copied());
    }

    /// Runs the simulated device until nothing is pending.
    pub(crate) fn sync_all(&self) {
        self.settle(|s| s.pending.keys().next().copied());
    }

    /// Drives the operation `target` names until none is left; where a modelled operation's
    /// time has not come, sleeps until it has without holding the device (other threads go
    /// on submitting, as they would on a GPU).
    fn settle(&self, target: impl Fn(&State) -> Option<u64>) {
        loop {
            let gate = {
                let mut g = self.state();
                let Some(op) = target(&g.0).filter(|op| g.0.pending.contains_key(op)) else {
                    return;
                };
                match self.drive(&mut g.0, op) {
                    Some(t) => t,
                    None => continue,
                }
            };
            std::thread::sleep(gate.saturating_duration_since(Instant::now()));
        }
    }

    /// Completes operation `target`, with what must complete before it (earlier work on its
    /// stream, the operations its waits name), regardless of their delays; stops at a
    /// modelled operation whose time has not come (returns that time).
    fn drive(&self, s: &mut State, target: u64) -> Option<Instant> {
        let mut want = vec![target];
        while let Some(&t) = want.last() {
            if !s.pending.contains_key(&t) {
                want.pop();
                continue;
            }
            let stream = s.pending[&t].stream;
            let head = *s.streams[&stream]
                .front()
                .expect("a pending op is on its stream");
            let op = &s.pending[&head];
            if let Some(nb) = op.not_before.filter(|&nb| nb > Instant::now()) {
                return Some(nb);
            }
            match op.after.filter(|a| s.pending.contains_key(a)) {
                Some(a) => want.push(a),
                None => self.complete(s, head),
            }
        }
        None
    }

    /// The host touches `access` now: a hazard for each pending operation it conflicts with.
    pub(crate) fn host_access(&self, access: &[Access], what: &str) {
        let g = self.state();
        for op in g.0.pending.values() {
            if op
                .access
                .iter()
                .any(|b| access.iter().any(|a| a.conflicts(b)))
            {
                self.hazard(format!(
                    "the host did \"{what}\" while \"{}\" (stream {}) touching the same memory \
                     was pending",
                    op.what, op.stream
                ));
            }
        }
    }

    /// A copy of `len` bytes at `off` of buffer `id`, read by the host now (a hazard if a
    /// pending operation writes them).
    pub(crate) fn peek(&self, id: u64, off: u64, len: usize, what: &str) -> Vec<u8> {
        self.host_access(&[Access::read(Res::Dev(id), off..off + len as u64)], what);
        let mut g = self.state();
        let b = g.0.mem.get_mut(id);
        let end = (off as usize + len).min(b.len());
        b.get(off as usize..end)
            .map_or_else(Vec::new, |s| s.to_vec())
    }

    /// A fault of the simulated hardware (what a GPU would answer with an illegal address or
    /// corrupt memory), counted as a hazard.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the JPEG engine's stand-in"
        )
    )]
    pub(crate) fn fault(&self, what: String) {
        self.hazard(what);
    }

    fn hazard(&self, what: String) {
        let st = &self.stats;
        st.hazards.fetch_add(1, Ordering::Relaxed);
        let mut log = lock(&st.hazard_log);
        if log.len() < 16 {
            log.push(what);
        }
    }

    /// One tick: every pending operation's delay counts down, then stream heads whose delay
    /// ran out and whose waits are met complete, in a seeded random order (some are left
    /// for a later tick).
    fn tick(&self, g: &mut (State, Rng)) {
        let (s, rng) = g;
        for op in s.pending.values_mut() {
            op.delay = op.delay.saturating_sub(1);
        }
        let now = Instant::now();
        loop {
            let mut ready: Vec<u64> = s
                .streams
                .values()
                .filter_map(|q| q.front().copied())
                .filter(|id| {
                    let op = &s.pending[id];
                    op.delay == 0
                        && op.after.is_none_or(|a| !s.pending.contains_key(&a))
                        && op.not_before.is_none_or(|t| t <= now)
                })
                .collect();
            if ready.is_empty() {
                return;
            }
            ready.sort_unstable();
            let id = ready[rng.below(ready.len() as u64) as usize];
            self.complete(s, id);
            if rng.chance(0.3) {
                return;
            }
        }
    }

    fn complete(&self, s: &mut State, id: u64) {
        let mut op = s.pending.remove(&id).expect("pending");
        s.streams
            .get_mut(&op.stream)
            .expect("its stream")
            .pop_front();
        for (other_id, other) in s.pending.range(..id) {
            if op
                .access
                .iter()
                .any(|a| other.access.iter().any(|b| a.conflicts(b)))
            {
                self.hazard(format!(
                    "\"{}\" (stream {}) ran while \"{}\" (stream {}, op {other_id}, enqueued \
                     before it) touching the same memory was pending: nothing ordered them",
                    op.what, op.stream, other.what, other.stream
                ));
            }
        }
        if let Some(run) = op.run.take() {
            if self.free && op.device_side {
                let c0 = crate::sys::thread_cpu_seconds();
                run(&mut s.mem);
                let ns = (crate::sys::thread_cpu_seconds() - c0) * 1e9;
                self.stats
                    .device_cpu_ns
                    .fetch_add(ns.max(0.0) as u64, Ordering::Relaxed);
            } else {
                run(&mut s.mem);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::copy::CopyStage;

    /// The simulator's check can fail: a source changed while its copy is in flight is caught,
    /// and a copy into a region batches still view is counted.
    #[test]
    fn simulator_catches_a_source_reused_early_and_a_region_in_use() {
        let mut dev = SimDevice::new(1);
        dev.delay_max = 1_000; // the copy stays pending while its source changes
        let pool = DevicePool::sim(&dev, 2, 64).unwrap();
        let mut stage = CopyStage::new(&pool).unwrap();
        let mut src = vec![7u8; 64];
        let r = pool.take().unwrap();
        // SAFETY: `src` outlives the copy (polled below before it is dropped).
        unsafe { stage.start(r, src.as_ptr(), 64, 1).unwrap() };
        src[3] = 8; // the slot "reused" while the copy is in flight
        let mut done = Vec::new();
        assert!(stage.poll(&mut done, true).is_err());
        assert_eq!(dev.stats.source_changed.load(Ordering::Relaxed), 1);

        let mut stage = CopyStage::new(&pool).unwrap();
        let region = pool.region(r, 64); // batches view region r
                                         // SAFETY: as above.
        unsafe { stage.start(r, src.as_ptr(), 64, 2).unwrap() };
        assert_eq!(dev.stats.region_in_use.load(Ordering::Relaxed), 1);
        stage.drain(&mut done).unwrap();
        assert_eq!(done, vec![2]);
        assert_eq!(region.to_host().unwrap(), src);
        drop(region);
        assert_eq!(pool.free_regions(), 2);
    }
}
