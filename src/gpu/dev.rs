//! One seam for the device work of the copy and decode stages: device memory, streams, events,
//! copies both ways, memsets, kernel launches, and the copy stage's checks — as traits, each
//! implemented twice, side by side with the rest of its device: CUDA ([`super::cuda`]), and the
//! adversarial simulator ([`super::sim`]), where every operation is queued on its stream,
//! completes late and in any order the streams allow, and is checked against the memory other
//! pending operations touch. The pipelines are written once against the handles here ([`Gpu`],
//! [`DBuf`], [`DStream`], [`DEvent`], [`Kernels`]), which hold the trait objects, check what
//! every device must (a copy's bounds), and leave the rest to the device. Adding a kernel is one
//! [`KernelOps`] method and its two implementations.

use std::any::Any;
use std::sync::Arc;

use super::cuda::{Context, CtxGuard};
use super::kernels::GfEmit;
use crate::error::{invalid, Result};

/// What a device does. The handles below hold one; the CUDA device is
/// [`super::cuda::CudaGpu`], the simulator [`super::sim::SimDev`].
pub(crate) trait DeviceOps: Send + Sync + std::fmt::Debug {
    /// Makes the device current on this thread until the guard drops.
    fn enter(&self) -> Result<Entered>;
    /// CUDA's primary context (`None` on the simulator).
    fn ctx(&self) -> Option<&Arc<Context>> {
        None
    }
    /// Whether this is the simulated device (its memory is host memory).
    fn is_simulated(&self) -> bool {
        false
    }
    /// A new non-blocking stream.
    fn stream(&self) -> Result<DStream>;
    /// A new event.
    fn event(&self) -> Result<DEvent>;
    /// `len` bytes of zeroed device memory.
    fn alloc(&self, len: usize) -> Result<DBuf>;
    /// Waits for everything queued on the device.
    fn synchronize(&self) -> Result<()>;
    /// gpufeed's kernels on this device, or why they cannot run there.
    fn kernels(&self) -> Result<Kernels>;
    /// The device's batched JPEG decoder (nvJPEG on the JPEG engines; on the simulator,
    /// `cpu` standing in for them), or why there is none.
    fn jpeg(&self, cpu: CpuJpeg) -> Result<JpegEngine>;
    /// A copy stage's copy of `len` bytes at `src` into a region starts (`held`: batches still
    /// view the region, which the copy stage must never let happen): what the device keeps to
    /// check the copy when it completes.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    unsafe fn copy_started(&self, held: bool, src: *const u8, len: usize) -> CopyCheck {
        let _ = (held, src, len);
        CopyCheck(0)
    }
    /// `n` copies of a copy stage are in flight.
    fn copies_in_flight(&self, n: usize) {
        let _ = n;
    }
    /// A copy stage's copy of `len` bytes into `dst` was seen complete.
    fn copy_completed(&self, dst: &DBuf, len: usize, check: CopyCheck) -> Result<()> {
        let _ = (dst, len, check);
        Ok(())
    }
    /// A copy stage's pause between polls of its copies.
    fn poll_pause(&self) {}
}

/// Device memory.
pub(crate) trait BufOps: Send + Sync + std::fmt::Debug {
    /// The device address of its first byte.
    fn ptr(&self) -> u64;
    fn len(&self) -> usize;
    fn as_any(&self) -> &dyn Any;
}

/// A stream. The handle has checked that each copy's or memset's bytes lie in its buffer.
pub(crate) trait StreamOps: Send + Sync + std::fmt::Debug {
    /// The raw handle (a `CUstream`, or the simulator's id).
    fn raw(&self) -> u64;
    /// Waits (on the host) for everything queued on the stream.
    fn synchronize(&self) -> Result<()>;
    /// Makes this stream's later work wait for `event`.
    fn wait(&self, event: &DEvent) -> Result<()>;
    /// Starts copying `len` host bytes at `src` to byte `off` of `dst`.
    ///
    /// # Safety
    /// As for [`DStream::copy_htod`]; `off..off + len` lies in `dst`.
    unsafe fn copy_htod(
        &self,
        dst: &DBuf,
        off: usize,
        src: *const u8,
        len: usize,
        what: &str,
    ) -> Result<()>;
    /// Starts copying `len` bytes at `off` of `src` to the host at `dst`.
    ///
    /// # Safety
    /// As for [`DStream::copy_dtoh`]; `off..off + len` lies in `src`.
    unsafe fn copy_dtoh(
        &self,
        src: &DBuf,
        off: usize,
        dst: *mut u8,
        len: usize,
        what: &str,
    ) -> Result<()>;
    /// Zeroes `len` bytes at `off` of `dst` (they lie in it).
    fn memset(&self, dst: &DBuf, off: usize, len: usize, what: &str) -> Result<()>;
    fn as_any(&self) -> &dyn Any;
}

/// An event.
pub(crate) trait EventOps: Send + Sync + std::fmt::Debug {
    /// Records the event at the current end of the raw stream `raw`.
    ///
    /// # Safety
    /// As for [`DEvent::record_raw`].
    unsafe fn record_raw(&self, raw: u64) -> Result<()>;
    /// Makes the raw stream `raw` wait for this event.
    ///
    /// # Safety
    /// As for [`DEvent::record_raw`].
    unsafe fn wait_raw(&self, raw: u64) -> Result<()>;
    /// Whether the work before the last record has completed.
    fn done(&self) -> Result<bool>;
    /// Waits (on the host) for the work before the last record.
    fn synchronize(&self) -> Result<()>;
    /// The raw handle a consumer may wait on (`CUevent`; `None` on the simulator).
    fn raw(&self) -> Option<u64>;
    fn as_any(&self) -> &dyn Any;
}

/// gpufeed's kernels (`kernels/*.cu`) on a device: loaded on CUDA, the host build on the
/// simulator. The handle has checked the outputs' bounds.
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
pub(crate) trait KernelOps: Send + Sync + std::fmt::Debug {
    /// As for [`Kernels::crc32c`].
    ///
    /// # Safety
    /// As for [`Kernels::crc32c`].
    #[allow(
        clippy::too_many_arguments,
        reason = "the kernel's own parameters, one for one, as the launch passes them"
    )]
    unsafe fn crc32c(
        &self,
        stream: &DStream,
        data: &DBuf,
        data_len: usize,
        spans: &DBuf,
        n: u32,
        lanes: &DBuf,
        out: &DBuf,
    ) -> Result<()>;
    /// As for [`Kernels::resize`].
    ///
    /// # Safety
    /// As for [`Kernels::resize`].
    #[allow(
        clippy::too_many_arguments,
        reason = "the kernel's own parameters, one for one, as the launch passes them"
    )]
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
    ) -> Result<()>;
}

/// One image of a batched JPEG decode: its bitstream (bytes `bits` of the source buffer),
/// where its packed 8-bit RGB goes (byte `out` of the output buffer, at the pitch of its width),
/// and its size (from its bitstream's frame header).
#[derive(Debug, Clone)]
pub(crate) struct JpegImage {
    pub(crate) bits: std::ops::Range<usize>,
    pub(crate) out: usize,
    pub(crate) size: (u32, u32),
}

/// A JPEG decoded on the CPU to packed RGB, with its size (the error as a sentence): the
/// simulated engine's stand-in for the hardware.
pub(crate) type CpuJpeg =
    Box<dyn FnMut(&[u8]) -> std::result::Result<((u32, u32), Vec<u8>), String> + Send>;

/// A batched JPEG decoder on a device.
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
pub(crate) trait JpegOps: Send + std::fmt::Debug {
    /// As for [`JpegEngine::decode`].
    ///
    /// # Safety
    /// As for [`JpegEngine::decode`].
    unsafe fn decode(
        &mut self,
        src: &DBuf,
        images: &[JpegImage],
        out: &DBuf,
        stream: &DStream,
    ) -> Result<()>;
}

/// A device's batched JPEG decoder.
#[derive(Debug)]
pub(crate) struct JpegEngine(Box<dyn JpegOps>);

#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
impl JpegEngine {
    pub(crate) fn new(ops: Box<dyn JpegOps>) -> JpegEngine {
        JpegEngine(ops)
    }

    /// One batched decode on `stream` of `images`' bitstreams in `src` into `out` (the
    /// decoder's state is re-initialised on the host first: the previous batch's decode must
    /// have completed). A batch that fails may already have queued writes into its outputs.
    ///
    /// # Safety
    /// The previous batch's decode has completed. Each bitstream lies in `src` and each image
    /// (width × height × 3 bytes at `out`) in `out`; `src` stays allocated and unchanged, and
    /// `out` allocated and untouched by others, until work recorded on `stream` after this call
    /// has completed.
    pub(crate) unsafe fn decode(
        &mut self,
        src: &DBuf,
        images: &[JpegImage],
        out: &DBuf,
        stream: &DStream,
    ) -> Result<()> {
        for i in images {
            src.check(i.bits.start, i.bits.len())?;
            out.check(i.out, i.size.0 as usize * i.size.1 as usize * 3)?;
        }
        // SAFETY: forwarded under the caller's guarantees; the ranges are checked.
        unsafe { self.0.decode(src, images, out, stream) }
    }
}

/// What a device keeps of a copy's source when the copy starts, to check the copy when it
/// completes (nothing on CUDA; the source's crc32c on the simulator).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyCheck(pub(crate) u32);

/// A device: CUDA's primary context, or the simulated GPU.
#[derive(Debug, Clone)]
pub(crate) struct Gpu(Arc<dyn DeviceOps>);

/// The context current on this thread while it lives (nothing on the simulator).
pub(crate) struct Entered(
    #[allow(
        dead_code,
        reason = "held for its drop: the context is current while it lives"
    )]
    pub(crate) Option<CtxGuard>,
);

impl Gpu {
    /// The device `ops` implements.
    pub(crate) fn new(ops: Arc<dyn DeviceOps>) -> Gpu {
        Gpu(ops)
    }

    /// Makes the device current on this thread until the guard drops (then the thread's
    /// previous context is current again).
    pub(crate) fn enter(&self) -> Result<Entered> {
        self.0.enter()
    }

    pub(crate) fn ctx(&self) -> Option<&Arc<Context>> {
        self.0.ctx()
    }

    /// Whether this is the simulated device (its memory is host memory).
    pub(crate) fn is_simulated(&self) -> bool {
        self.0.is_simulated()
    }

    /// A new non-blocking stream.
    pub(crate) fn stream(&self) -> Result<DStream> {
        self.0.stream()
    }

    /// A new event.
    pub(crate) fn event(&self) -> Result<DEvent> {
        self.0.event()
    }

    /// `len` bytes of zeroed device memory.
    pub(crate) fn alloc(&self, len: usize) -> Result<DBuf> {
        self.0.alloc(len)
    }

    /// Waits for everything queued on the device.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }

    /// See [`DeviceOps::jpeg`].
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn jpeg(&self, cpu: CpuJpeg) -> Result<JpegEngine> {
        self.0.jpeg(cpu)
    }

    /// See [`DeviceOps::copy_started`].
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    pub(crate) unsafe fn copy_started(&self, held: bool, src: *const u8, len: usize) -> CopyCheck {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.0.copy_started(held, src, len) }
    }

    /// See [`DeviceOps::copies_in_flight`].
    pub(crate) fn copies_in_flight(&self, n: usize) {
        self.0.copies_in_flight(n)
    }

    /// See [`DeviceOps::copy_completed`].
    pub(crate) fn copy_completed(&self, dst: &DBuf, len: usize, check: CopyCheck) -> Result<()> {
        self.0.copy_completed(dst, len, check)
    }

    /// See [`DeviceOps::poll_pause`].
    pub(crate) fn poll_pause(&self) {
        self.0.poll_pause()
    }
}

/// Device memory (freed when dropped; its owner keeps it until the work using it is done).
#[derive(Debug)]
pub(crate) struct DBuf(Box<dyn BufOps>);

impl DBuf {
    pub(crate) fn new(ops: Box<dyn BufOps>) -> DBuf {
        DBuf(ops)
    }

    /// The device address of its first byte.
    pub(crate) fn ptr(&self) -> u64 {
        self.0.ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The implementation, for its device to recognise (`None`: another device's).
    pub(crate) fn downcast<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        match off.checked_add(len) {
            Some(e) if e <= self.len() => Ok(()),
            _ => Err(invalid(format!(
                "{len} bytes at {off} lie past the end of a {}-byte device buffer",
                self.len()
            ))),
        }
    }
}

/// A stream.
#[derive(Debug)]
pub(crate) struct DStream(Box<dyn StreamOps>);

impl DStream {
    pub(crate) fn new(ops: Box<dyn StreamOps>) -> DStream {
        DStream(ops)
    }

    /// The implementation, for its device to recognise (`None`: another device's).
    pub(crate) fn downcast<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }

    /// The raw handle (a `CUstream`, or the simulator's id).
    pub(crate) fn raw(&self) -> u64 {
        self.0.raw()
    }

    /// Waits (on the host) for everything queued on the stream.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }

    /// Makes this stream's later work wait for `event`.
    pub(crate) fn wait(&self, event: &DEvent) -> Result<()> {
        self.0.wait(event)
    }

    /// Starts copying `len` host bytes at `src` to byte `off` of `dst`.
    ///
    /// # Safety
    /// `src .. src + len` must stay valid and unchanged until work recorded on this stream
    /// after this call has completed; `dst` must stay allocated until then.
    pub(crate) unsafe fn copy_htod(
        &self,
        dst: &DBuf,
        off: usize,
        src: *const u8,
        len: usize,
        what: &str,
    ) -> Result<()> {
        dst.check(off, len)?;
        // SAFETY: the range lies in `dst` (checked); the caller vouches for the rest.
        unsafe { self.0.copy_htod(dst, off, src, len, what) }
    }

    /// Copies `src` to byte `off` of `dst` on this stream and waits for it.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn write(&self, dst: &DBuf, off: usize, src: &[u8], what: &str) -> Result<()> {
        // SAFETY: `src` is borrowed until the stream is synchronised below.
        unsafe { self.copy_htod(dst, off, src.as_ptr(), src.len(), what)? };
        self.synchronize()
    }

    /// Copies `dst.len()` bytes at `off` of `src` to the host on this stream and waits for it.
    pub(crate) fn read(&self, src: &DBuf, off: usize, dst: &mut [u8], what: &str) -> Result<()> {
        // SAFETY: `dst` is borrowed until the stream is synchronised below.
        unsafe { self.copy_dtoh(src, off, dst.as_mut_ptr(), dst.len(), what)? };
        self.synchronize()
    }

    /// Starts copying `len` bytes at `off` of `src` to the host at `dst`.
    ///
    /// # Safety
    /// `dst .. dst + len` must stay valid and untouched by the host, and `src` allocated,
    /// until work recorded on this stream after this call has completed.
    pub(crate) unsafe fn copy_dtoh(
        &self,
        src: &DBuf,
        off: usize,
        dst: *mut u8,
        len: usize,
        what: &str,
    ) -> Result<()> {
        src.check(off, len)?;
        // SAFETY: the range lies in `src` (checked); the caller vouches for the rest.
        unsafe { self.0.copy_dtoh(src, off, dst, len, what) }
    }

    /// Zeroes `len` bytes at `off` of `dst`, which its owner keeps allocated until this
    /// stream's later work has completed.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn memset(&self, dst: &DBuf, off: usize, len: usize, what: &str) -> Result<()> {
        dst.check(off, len)?;
        self.0.memset(dst, off, len, what)
    }
}

/// An event.
#[derive(Debug)]
pub(crate) struct DEvent(Box<dyn EventOps>);

impl DEvent {
    pub(crate) fn new(ops: Box<dyn EventOps>) -> DEvent {
        DEvent(ops)
    }

    /// The implementation, for its device to recognise (`None`: another device's).
    pub(crate) fn downcast<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }

    /// Records the event at the current end of `stream`.
    pub(crate) fn record(&self, stream: &DStream) -> Result<()> {
        // SAFETY: our own stream, live while borrowed.
        unsafe { self.record_raw(stream.raw()) }
    }

    /// Records the event at the current end of the raw stream `raw`.
    ///
    /// # Safety
    /// On CUDA, `raw` must be a live stream of the event's context (or 0, 1, 2).
    pub(crate) unsafe fn record_raw(&self, raw: u64) -> Result<()> {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.0.record_raw(raw) }
    }

    /// Makes the raw stream `raw` wait for this event.
    ///
    /// # Safety
    /// As for [`DEvent::record_raw`].
    pub(crate) unsafe fn wait_raw(&self, raw: u64) -> Result<()> {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.0.wait_raw(raw) }
    }

    /// Whether the work before the last record has completed.
    pub(crate) fn done(&self) -> Result<bool> {
        self.0.done()
    }

    /// Waits (on the host) for the work before the last record.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }

    /// The raw handle (`CUevent`; `None` on the simulator).
    pub(crate) fn raw(&self) -> Option<u64> {
        self.0.raw()
    }
}

/// gpufeed's kernels on a device: loaded on CUDA, the host build on the simulator.
#[derive(Debug)]
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
pub(crate) struct Kernels(Box<dyn KernelOps>);

#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
impl Kernels {
    pub(crate) fn new(ops: Box<dyn KernelOps>) -> Kernels {
        Kernels(ops)
    }

    /// The kernels of `gpu`, or why they cannot run there.
    pub(crate) fn load(gpu: &Gpu) -> Result<Kernels> {
        gpu.0.kernels()
    }

    /// crc32c over `n` spans (at `spans`) of the `data_len` bytes of `data`, one u32 each into
    /// `out`, through `lanes` ([`CRC_LANES`](super::kernels::CRC_LANES) u32s per span).
    ///
    /// # Safety
    /// The spans must lie inside `data_len <= data.len()` bytes (checked by the caller with
    /// `check_spans`), `spans` and `out` hold `n` entries and `lanes` `n × CRC_LANES`, and all
    /// stay allocated (and `data`, `spans` unchanged) until work recorded on `stream` later has
    /// completed.
    #[allow(
        clippy::too_many_arguments,
        reason = "the kernel's own parameters, one for one, as the launch passes them"
    )]
    pub(crate) unsafe fn crc32c(
        &self,
        stream: &DStream,
        data: &DBuf,
        data_len: usize,
        spans: &DBuf,
        n: u32,
        lanes: &DBuf,
        out: &DBuf,
    ) -> Result<()> {
        let lane_bytes = n as usize * 4 * super::kernels::CRC_LANES as usize;
        lanes.check(0, lane_bytes)?;
        // SAFETY: forwarded under the caller's guarantees; the lanes' size is checked.
        unsafe { self.0.crc32c(stream, data, data_len, spans, n, lanes, out) }
    }

    /// The resize kernel over `n` samples (at `samples`) whose images lie in the first
    /// `src_len` bytes of `src`, writing `out_len` bytes at byte `out_off` of `out`.
    ///
    /// # Safety
    /// The launch's bounds must have been checked (`check_resize`), and the buffers stay
    /// allocated (and `src`, `samples` unchanged) until work recorded on `stream` later has
    /// completed.
    #[allow(
        clippy::too_many_arguments,
        reason = "the kernel's own parameters, one for one, as the launch passes them"
    )]
    pub(crate) unsafe fn resize(
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
        out.check(out_off, out_len)?;
        // SAFETY: forwarded under the caller's guarantees; the output range is checked.
        unsafe {
            self.0.resize(
                stream, src, src_len, samples, n, emit, out, out_off, out_len,
            )
        }
    }
}

/// The error of a handle given to another device's operation.
pub(crate) fn other_device(what: &str) -> crate::error::Error {
    invalid(format!("{what} of another device"))
}
