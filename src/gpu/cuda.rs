//! The CUDA driver calls gpufeed makes, through cudarc's run-time-loaded bindings.
//!
//! cudarc panics when a library it is asked to load is missing, so nothing here is reached before
//! [`driver_present`] said `libcuda` loads. Every failed call becomes an [`Error`] naming the
//! call, with the driver's result as its source. Context, streams, events and device memory are
//! cudarc's safe types (`CudaContext`, `CudaStream`) behind the small
//! API the copy stage needs; raw driver calls remain only where that layer cannot say what is
//! needed (docs/DECISIONS.md): registering memory that gpufeed mapped itself (the arena), an
//! asynchronous copy from that registered memory, the driver version, and waiting on or
//! recording into a stream that another library owns (a consumer's `CUstream`).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::DriverError;
use cudarc::driver::{result as cu, sys, CudaContext, CudaStream};

use super::dev::{
    other_device, BufOps, CpuJpeg, DBuf, DEvent, DStream, DeviceOps, Entered, EventOps, JpegEngine,
    KernelOps, Kernels, StreamOps,
};
use super::kernels::GfEmit;
use crate::error::{Error, ErrorKind, Result};

/// Whether the CUDA driver library can be loaded (cudarc would panic on first use otherwise).
pub fn driver_present() -> bool {
    // SAFETY: loads (and drops) the library by name; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// A failed `CUresult`, kept as the cause of the [`Error`] that names the call: its name and
/// description come from the driver when displayed.
#[derive(Debug, Clone, Copy)]
pub struct CudaError(pub sys::CUresult);

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A CudaError exists only after a driver call returned it, so the library is loaded.
        let e = cudarc::driver::DriverError(self.0);
        match (e.error_name(), e.error_string()) {
            (Ok(n), Ok(t)) => write!(f, "{} ({})", n.to_string_lossy(), t.to_string_lossy()),
            _ => write!(f, "{:?}", self.0),
        }
    }
}

impl std::error::Error for CudaError {}

/// Turns a `CUresult` into a `Result`, naming the call; the result is the error's source.
pub(crate) fn check(r: sys::CUresult, call: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let kind = match r {
        sys::CUresult::CUDA_ERROR_NO_DEVICE | sys::CUresult::CUDA_ERROR_NOT_SUPPORTED => {
            ErrorKind::Unsupported
        }
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => ErrorKind::Busy,
        _ => ErrorKind::Io,
    };
    Err(Error::new(kind, format!("{call} failed")).with_source(CudaError(r)))
}

/// Maps a cudarc error from `call` as [`check`] does.
fn driver(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| match check(e.0, call) {
        Err(e) => e,
        Ok(()) => Error::new(ErrorKind::Io, format!("{call} failed")),
    }
}

/// `cuInit` once per process (later calls return the first result).
pub(crate) fn init() -> Result<()> {
    static INIT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    if !driver_present() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "no CUDA driver: libcuda.so could not be loaded",
        ));
    }
    INIT.get_or_init(|| cu::init().map_err(|e| driver("cuInit")(e).report()))
        .clone()
        .map_err(|m| Error::new(ErrorKind::Unsupported, m))
}

/// Number of visible devices (0 when `CUDA_VISIBLE_DEVICES=` hides them all).
pub(crate) fn device_count() -> Result<u32> {
    init()?;
    match cu::device::get_count() {
        Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => Ok(0),
        r => r
            .map(|n| n.max(0) as u32)
            .map_err(driver("cuDeviceGetCount")),
    }
}

/// The driver's CUDA version (e.g. 13000).
pub(crate) fn driver_version() -> Result<i32> {
    init()?;
    let mut v = 0;
    // SAFETY: writes one int (cudarc's safe layer has no call for this).
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    check(r, "cuDriverGetVersion")?;
    Ok(v)
}

/// A device's primary context (the one the CUDA runtime and PyTorch use), retained for as long
/// as this lives.
#[derive(Debug)]
pub struct Context {
    /// Dropped in `Drop` with the thread's current context restored afterwards (cudarc's drop
    /// makes its context current).
    inner: ManuallyDrop<Arc<CudaContext>>,
    ordinal: u32,
}

/// The calling thread's current context (null when none).
fn current() -> sys::CUcontext {
    let mut c: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    let _ = unsafe { sys::cuCtxGetCurrent(&mut c) };
    c
}

/// Makes `c` (possibly null) the calling thread's current context again.
fn restore(c: sys::CUcontext) {
    // SAFETY: `c` was current on this thread a moment ago (or null: none).
    let _ = unsafe { sys::cuCtxSetCurrent(c) };
}

impl Drop for Context {
    fn drop(&mut self) {
        let prev = current();
        let own = self.inner.cu_ctx();
        // SAFETY: dropped once, here; not used after.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
        // The primary context may be released now: it is not made current again.
        restore(if prev == own {
            std::ptr::null_mut()
        } else {
            prev
        });
    }
}

impl Context {
    /// Retains device `ordinal`'s primary context and makes it current on this thread.
    pub fn new(ordinal: u32) -> Result<Arc<Context>> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("CUDA device {ordinal} does not exist ({n} visible)"),
            ));
        }
        // cudarc makes the context current on this thread (maybe a trainer's): undone below.
        let prev = current();
        let inner = CudaContext::new(ordinal as usize).map_err(driver("cuDevicePrimaryCtxRetain"));
        restore(prev);
        let inner = inner?;
        // SAFETY: gpufeed orders its device memory itself, as cudarc then requires: a buffer is
        // zeroed on a stream that is synchronised before any other uses it
        // (`DeviceBuffer::new`); a region is written only after the release events of its
        // last readers (`gpu::copy`); and no buffer is freed before its copies and release
        // events completed (`CopyStage` waits at drop, `DevicePool` waits for pending release
        // events at drop). Besides, gpufeed allocates with `cuMemAlloc`, not through cudarc.
        // The flag belongs to this `CudaContext` value only.
        unsafe { inner.disable_event_tracking() };
        Ok(Arc::new(Context {
            inner: ManuallyDrop::new(inner),
            ordinal,
        }))
    }

    /// The device's compute capability as an architecture number (90 for sm_90).
    pub fn arch(&self) -> Result<u32> {
        let (major, minor) = self
            .inner
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        Ok((major * 10 + minor) as u32)
    }

    /// Loads `cubin` (for this device's architecture) and finds `entry` in it.
    pub fn load_kernel(self: &Arc<Self>, cubin: Vec<u8>, entry: &str) -> Result<LoadedKernel> {
        let _g = self.enter()?;
        let module = self
            .inner
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(driver("cuModuleLoadData"))?;
        let func = module
            .load_function(entry)
            .map_err(driver("cuModuleGetFunction"))?;
        Ok(LoadedKernel {
            func: ManuallyDrop::new(func),
            ctx: self.clone(),
        })
    }

    /// Makes this context current on the calling thread until the guard drops, then restores
    /// the thread's previous one (`cuCtxPushCurrent` / `cuCtxPopCurrent`): for calls on threads
    /// that are not gpufeed's (a consumer's `__dlpack__`, a batch dropped by the trainer), where
    /// a lasting `cuCtxSetCurrent` would leave the caller's next CUDA calls on this device.
    pub fn enter(self: &Arc<Self>) -> Result<CtxGuard> {
        // SAFETY: the primary context is retained while `inner` lives, which the guard keeps.
        let r = unsafe { sys::cuCtxPushCurrent_v2(self.inner.cu_ctx()) };
        check(r, "cuCtxPushCurrent")?;
        Ok(CtxGuard {
            _ctx: self.clone(),
            _not_send: std::marker::PhantomData,
        })
    }

    /// Makes this context current on the calling thread (gpufeed's own threads).
    pub fn bind(&self) -> Result<()> {
        self.inner
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device's name and total memory.
    pub fn describe(&self) -> Result<(String, usize)> {
        let name = self.inner.name().map_err(driver("cuDeviceGetName"))?;
        let mem = self.inner.total_mem().map_err(driver("cuDeviceTotalMem"))?;
        Ok((name, mem))
    }

    /// Waits for all work of this context (a last resort where an event could not be recorded).
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize().map_err(driver("cuCtxSynchronize"))
    }
}

/// This context current on the thread until dropped (see [`Context::enter`]).
#[derive(Debug)]
pub struct CtxGuard {
    _ctx: Arc<Context>,
    /// Popped on the thread that pushed it: neither `Send` nor `Sync`.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what `enter` pushed on this thread (a guard is not `Send`: dropped on
        // the thread that made it, in reverse order).
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut prev) };
    }
}

/// A non-blocking stream.
#[derive(Debug)]
pub struct Stream {
    /// Dropped in `Drop` inside a push/pop of its context (cudarc's drop makes it current).
    inner: ManuallyDrop<Arc<CudaStream>>,
    ctx: Arc<Context>,
    /// A blocking-sync event the host waits on in [`Stream::synchronize`]:
    /// `cuStreamSynchronize` spins a core under the primary context's default scheduling.
    done: Event,
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _g = self.ctx.enter();
        // SAFETY: dropped once, here; not used after.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
    }
}

impl Stream {
    /// A new non-blocking stream on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        let _g = ctx.enter()?;
        let inner = ctx.inner.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(Stream {
            inner: ManuallyDrop::new(inner),
            ctx: ctx.clone(),
            done: Event::new(ctx)?,
        })
    }

    /// The raw `CUstream` (for DLPack consumers and tests; this stream stays its owner).
    pub fn raw(&self) -> u64 {
        self.inner.cu_stream() as u64
    }

    /// Waits for all work enqueued on the stream, blocking the thread (an event with
    /// `CU_EVENT_BLOCKING_SYNC` recorded at its end; `cuStreamSynchronize` would spin a core
    /// under the primary context's `CU_CTX_SCHED_AUTO`). Two threads waiting at once share
    /// the event: each then waits at least until its own point.
    pub fn synchronize(&self) -> Result<()> {
        self.done.record(self)?;
        self.done.synchronize()
    }

    /// Makes this stream's later work wait for `event` (no host synchronisation).
    pub fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: our stream, live; the event is live while borrowed.
        check(
            unsafe { sys::cuStreamWaitEvent(self.inner.cu_stream(), event.raw, 0) },
            "cuStreamWaitEvent",
        )
    }

    /// Makes `raw_stream`'s later work wait for `event` (no host synchronisation).
    ///
    /// # Safety
    /// `raw_stream` must be a live stream of `event`'s context, or one of the special handles
    /// 0 or 1 (`CU_STREAM_LEGACY`, the legacy default stream) and 2 (`CU_STREAM_PER_THREAD`),
    /// and the context must be current on this thread.
    pub unsafe fn wait_raw(raw_stream: u64, event: &Event) -> Result<()> {
        // SAFETY: the caller vouches for the stream; the event is live while borrowed.
        check(
            unsafe { sys::cuStreamWaitEvent(raw_stream as sys::CUstream, event.raw, 0) },
            "cuStreamWaitEvent",
        )
    }
}

/// An event without timing, whose waits block the thread instead of spinning
/// (`CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`: cudarc's `new_event` takes one flag).
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: a CUevent may be used from any thread of the process (the driver locks it).
unsafe impl Send for Event {}
// SAFETY: as above; every call through `&self` is thread-safe in the driver.
unsafe impl Sync for Event {}

impl Event {
    /// A new event (blocking sync, no timing) on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        let _g = ctx.enter()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: writes one handle; the context is current.
        let r = unsafe { sys::cuEventCreate(&mut raw, flags) };
        check(r, "cuEventCreate")?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: our stream and event, both live.
        unsafe { self.record_raw(stream.raw()) }
    }

    /// Records the event at the current end of `raw_stream`.
    ///
    /// # Safety
    /// As for [`Stream::wait_raw`]: a live stream of this event's context (or 0, 1 or 2).
    pub unsafe fn record_raw(&self, raw_stream: u64) -> Result<()> {
        let _g = self.ctx.enter()?;
        // SAFETY: the caller vouches for the stream; the event is ours and live.
        check(
            unsafe { sys::cuEventRecord(self.raw, raw_stream as sys::CUstream) },
            "cuEventRecord",
        )
    }

    /// Whether the work before the last record has completed.
    pub fn done(&self) -> Result<bool> {
        // SAFETY: a live event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuEventQuery").map(|()| false),
        }
    }

    /// Waits (blocking the thread) for the work before the last record.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event.
        check(
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
        )
    }

    /// The raw `CUevent` (for DLPack consumers; this event stays its owner).
    pub fn raw(&self) -> u64 {
        self.raw as u64
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _g = self.ctx.enter();
        // SAFETY: created by cuEventCreate, destroyed once (the driver defers the release
        // until work recorded on it completes).
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// A kernel's entry point in a module loaded on a device (the module stays loaded while this
/// lives).
#[derive(Debug)]
pub struct LoadedKernel {
    /// Dropped in `Drop` inside a push/pop of its context (cudarc's module drop makes it
    /// current).
    func: ManuallyDrop<cudarc::driver::CudaFunction>,
    ctx: Arc<Context>,
}

impl Drop for LoadedKernel {
    fn drop(&mut self) {
        let _g = self.ctx.enter();
        // SAFETY: dropped once, here; not used after.
        unsafe { ManuallyDrop::drop(&mut self.func) };
    }
}

impl LoadedKernel {
    /// Launches the kernel on `stream` over a `grid` of blocks of `block` threads.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, in order, each to a value of the
    /// parameter's exact type (read during this call); every device address among those
    /// values must be valid for everything the kernel reads or writes through it, and stay
    /// allocated and unused by other writers until work recorded on `stream` after this call
    /// has completed.
    pub unsafe fn launch(
        &self,
        grid: (u32, u32),
        block: u32,
        params: &mut [*mut c_void],
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: forwarded under the caller's guarantees; the function's module is alive
        // (held by `func`), the stream is ours and live; no shared memory, no extra options.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.func.cu_function(),
                    grid.0,
                    grid.1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.inner.cu_stream(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }
}

/// Device memory from `cuMemAlloc` (not the stream-ordered pool: cuFile registers only such
/// memory), zeroed once at allocation, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    ctx: Arc<Context>,
}

impl DeviceBuffer {
    /// `len` bytes of zeroed device memory on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<DeviceBuffer> {
        let _g = ctx.enter()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one device address; the context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) };
        check(r, "cuMemAlloc")?;
        let buf = DeviceBuffer {
            ptr,
            len,
            ctx: ctx.clone(),
        };
        // Zeroed on a stream of its own, waited for: the synchronous cuMemsetD8 would queue on
        // the legacy stream (behind a trainer's work) and race gpufeed's non-blocking streams.
        let s = Stream::new(ctx)?;
        // SAFETY: the allocation just made, `len.max(1)` bytes, on our live stream.
        unsafe { memset_async(ptr, len.max(1), &s)? };
        s.synchronize()?;
        Ok(buf)
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes from `offset` to the host, synchronously (tests, checks: on
    /// the legacy stream, behind what it has queued).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range_end(offset, dst.len())?;
        let _g = self.ctx.enter()?;
        // SAFETY: the range lies inside the allocation (checked); `dst` is writable for its
        // length; the copy is synchronous.
        check(
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    dst.as_mut_ptr() as *mut c_void,
                    self.ptr + offset as u64,
                    dst.len(),
                )
            },
            "cuMemcpyDtoH",
        )
    }

    /// Copies `src` to `offset`, synchronously, from any host memory (the naive path).
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.range_end(offset, src.len())?;
        let _g = self.ctx.enter()?;
        // SAFETY: the range lies inside the allocation (checked); `src` is readable for its
        // length; the copy is synchronous.
        check(
            unsafe {
                sys::cuMemcpyHtoD_v2(
                    self.ptr + offset as u64,
                    src.as_ptr() as *const c_void,
                    src.len(),
                )
            },
            "cuMemcpyHtoD",
        )
    }

    fn range_end(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(end),
            _ => Err(crate::error::invalid(format!(
                "{len} bytes at {offset} lie past the end of a {}-byte device buffer",
                self.len
            ))),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _g = self.ctx.enter();
        // SAFETY: allocated by cuMemAlloc, freed once. Whoever owns the buffer waited for the
        // work that uses it first (cuMemFree also waits for the device to be idle on it).
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Host memory registered (page-locked) with CUDA; unregistered on drop. cudarc's safe layer
/// only registers memory it allocates itself; the arena is gpufeed's own mapping.
#[derive(Debug)]
pub struct HostRegistration {
    /// The registered address (kept as a number: it is only handed back to the driver).
    addr: usize,
    ctx: Arc<Context>,
}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` (portable: usable from every context).
    ///
    /// # Safety
    /// `ptr .. ptr + len` must stay mapped until this is dropped.
    pub unsafe fn new(ctx: &Arc<Context>, ptr: *mut u8, len: usize) -> Result<HostRegistration> {
        let _g = ctx.enter()?;
        // SAFETY: the caller keeps the range mapped for our lifetime.
        let r = unsafe {
            sys::cuMemHostRegister_v2(ptr as *mut c_void, len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        };
        check(r, "cuMemHostRegister")?;
        Ok(HostRegistration {
            addr: ptr as usize,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _g = self.ctx.enter();
        // SAFETY: unregisters what `new` registered (the range is still mapped, per `new`).
        let _ = unsafe { sys::cuMemHostUnregister(self.addr as *mut c_void) };
    }
}

/// Starts an asynchronous host → device copy on `stream`.
///
/// # Safety
/// `src .. src + len` must stay valid and unmodified, and `dst .. dst + len` must stay allocated,
/// until work recorded on `stream` after this call has completed.
pub unsafe fn memcpy_htod_async(
    dst: u64,
    src: *const u8,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    // SAFETY: forwarded under the caller's guarantees; the stream is ours and live.
    check(
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream.inner.cu_stream())
        },
        "cuMemcpyHtoDAsync",
    )
}

/// Starts an asynchronous device → host copy on `stream`.
///
/// # Safety
/// `dst .. dst + len` must stay valid (and unread by the host) and `src .. src + len` allocated
/// and unchanged until work recorded on `stream` after this call has completed.
pub unsafe fn memcpy_dtoh_async(dst: *mut u8, src: u64, len: usize, stream: &Stream) -> Result<()> {
    // SAFETY: forwarded under the caller's guarantees; the stream is ours and live.
    check(
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream.inner.cu_stream())
        },
        "cuMemcpyDtoHAsync",
    )
}

/// Starts setting `len` bytes at `dst` to zero on `stream`.
///
/// # Safety
/// `dst .. dst + len` must stay allocated until work recorded on `stream` after this call has
/// completed.
pub unsafe fn memset_async(dst: u64, len: usize, stream: &Stream) -> Result<()> {
    // SAFETY: forwarded under the caller's guarantees; the stream is ours and live.
    check(
        unsafe { sys::cuMemsetD8Async(dst, 0, len, stream.inner.cu_stream()) },
        "cuMemsetD8Async",
    )
}

/// The CUDA device behind the device seam ([`super::dev`]): the primary context, and each
/// handle's operation as the driver API makes it.
#[derive(Debug)]
pub(crate) struct CudaGpu(pub(crate) Arc<Context>);

/// The device address of `b`, which must be CUDA memory (another device's address would be
/// a wild one here).
pub(crate) fn dev_ptr(b: &DBuf) -> Result<u64> {
    b.downcast::<DeviceBuffer>()
        .map(DeviceBuffer::ptr)
        .ok_or_else(|| other_device("a buffer"))
}

pub(crate) fn cuda_stream(s: &DStream) -> Result<&Stream> {
    s.downcast::<Stream>()
        .ok_or_else(|| other_device("a stream"))
}

impl DeviceOps for CudaGpu {
    fn enter(&self) -> Result<Entered> {
        Ok(Entered(Some(self.0.enter()?)))
    }

    fn ctx(&self) -> Option<&Arc<Context>> {
        Some(&self.0)
    }

    fn stream(&self) -> Result<DStream> {
        let _g = self.0.enter()?;
        Ok(DStream::new(Box::new(Stream::new(&self.0)?)))
    }

    fn event(&self) -> Result<DEvent> {
        Ok(DEvent::new(Box::new(Event::new(&self.0)?)))
    }

    fn alloc(&self, len: usize) -> Result<DBuf> {
        Ok(DBuf::new(Box::new(DeviceBuffer::new(&self.0, len)?)))
    }

    fn synchronize(&self) -> Result<()> {
        let _g = self.0.enter()?;
        self.0.synchronize()
    }

    fn kernels(&self) -> Result<Kernels> {
        Ok(Kernels::new(Box::new(super::kernels::DeviceKernels::load(
            &self.0,
        )?)))
    }

    /// nvJPEG on the JPEG engines (`cpu` is the simulator's; the CUDA device decodes on the
    /// CPU only through the image stage's own route).
    fn jpeg(&self, _cpu: CpuJpeg) -> Result<JpegEngine> {
        Ok(JpegEngine::new(
            Box::new(super::nvjpeg::hardware_decoder()?),
        ))
    }

    /// Copies take a few ms: 50 µs between polls of their events, no host sync of the stream.
    fn poll_pause(&self) {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

impl BufOps for DeviceBuffer {
    fn ptr(&self) -> u64 {
        DeviceBuffer::ptr(self)
    }

    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl StreamOps for Stream {
    fn raw(&self) -> u64 {
        Stream::raw(self)
    }

    fn synchronize(&self) -> Result<()> {
        Stream::synchronize(self)
    }

    fn wait(&self, event: &DEvent) -> Result<()> {
        match event.downcast::<Event>() {
            Some(e) => Stream::wait(self, e),
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
        _what: &str,
    ) -> Result<()> {
        let d = dev_ptr(dst)?;
        // SAFETY: the range lies in `dst` (the handle checked); the caller vouches for the
        // source and keeps `dst` allocated.
        unsafe { memcpy_htod_async(d + off as u64, src, len, self) }
    }

    unsafe fn copy_dtoh(
        &self,
        src: &DBuf,
        off: usize,
        dst: *mut u8,
        len: usize,
        _what: &str,
    ) -> Result<()> {
        let s = dev_ptr(src)?;
        // SAFETY: the range lies in `src` (the handle checked); the caller vouches for `dst`.
        unsafe { memcpy_dtoh_async(dst, s + off as u64, len, self) }
    }

    fn memset(&self, dst: &DBuf, off: usize, len: usize, _what: &str) -> Result<()> {
        let d = dev_ptr(dst)?;
        // SAFETY: the range lies in `dst` (the handle checked), which its owner keeps
        // allocated until this stream's later work has completed.
        unsafe { memset_async(d + off as u64, len, self) }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl EventOps for Event {
    unsafe fn record_raw(&self, raw: u64) -> Result<()> {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { Event::record_raw(self, raw) }
    }

    unsafe fn wait_raw(&self, raw: u64) -> Result<()> {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { Stream::wait_raw(raw, self) }
    }

    fn done(&self) -> Result<bool> {
        Event::done(self)
    }

    fn synchronize(&self) -> Result<()> {
        Event::synchronize(self)
    }

    fn raw(&self) -> Option<u64> {
        Some(Event::raw(self))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl KernelOps for super::kernels::DeviceKernels {
    unsafe fn crc32c(
        &self,
        stream: &DStream,
        data: &DBuf,
        _data_len: usize,
        spans: &DBuf,
        n: u32,
        lanes: &DBuf,
        out: &DBuf,
    ) -> Result<()> {
        let s = cuda_stream(stream)?;
        let (d, sp, l, o) = (
            dev_ptr(data)?,
            dev_ptr(spans)?,
            dev_ptr(lanes)?,
            dev_ptr(out)?,
        );
        // SAFETY: forwarded under the caller's guarantees (`Kernels::crc32c`).
        unsafe { super::kernels::DeviceKernels::crc32c(self, s, d, sp, n, l, o) }
    }

    unsafe fn resize(
        &self,
        stream: &DStream,
        src: &DBuf,
        _src_len: usize,
        samples: &DBuf,
        n: u32,
        emit: &GfEmit,
        out: &DBuf,
        out_off: usize,
        _out_len: usize,
    ) -> Result<()> {
        let s = cuda_stream(stream)?;
        let (sr, sa, o) = (dev_ptr(src)?, dev_ptr(samples)?, dev_ptr(out)?);
        // SAFETY: forwarded under the caller's guarantees (`Kernels::resize`).
        unsafe {
            super::kernels::DeviceKernels::resize(self, s, sr, sa, n, emit, o + out_off as u64)
        }
    }
}
