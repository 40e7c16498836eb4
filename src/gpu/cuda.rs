//! The CUDA driver calls gpufeed makes, through cudarc's run-time-loaded bindings.
//!
//! cudarc panics when a library it is asked to load is missing, so nothing here is reached before
//! [`driver_present`] said `libcuda` loads. Every failed call becomes an [`Error`] naming the
//! call, with the driver's result as its source. Context, streams, events and device memory are
//! cudarc's safe types (`CudaContext`, `CudaStream`, `CudaEvent`, `CudaSlice`) behind the small
//! API the copy stage needs; raw driver calls remain only where that layer cannot say what is
//! needed (docs/DECISIONS.md): registering memory that gpufeed mapped itself (the arena), an
//! asynchronous copy from that registered memory, the driver version, and waiting on or
//! recording into a stream that another library owns (a consumer's `CUstream`).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result as cu, sys, CudaContext, CudaEvent, CudaSlice, CudaStream};
use cudarc::driver::{DevicePtr, DriverError};

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
    inner: Arc<CudaContext>,
    ordinal: u32,
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
        let inner =
            CudaContext::new(ordinal as usize).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: gpufeed orders its device memory itself, as cudarc then requires: a buffer is
        // used by other streams only after its allocating stream was synchronised
        // (`DeviceBuffer::new`); a region is written only by the one copy stream, after the
        // release event of its last reader (`gpu::copy`); and no buffer is freed before its
        // copies and release events completed (`CopyStage` waits at drop, `DevicePool` waits
        // for pending release events at drop). cudarc's per-use events would add an event
        // record per copy for nothing. The flag belongs to this `CudaContext` value only.
        unsafe { inner.disable_event_tracking() };
        Ok(Arc::new(Context { inner, ordinal }))
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
    pub fn load_kernel(&self, cubin: Vec<u8>, entry: &str) -> Result<LoadedKernel> {
        let module = self
            .inner
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(driver("cuModuleLoadData"))?;
        let func = module
            .load_function(entry)
            .map_err(driver("cuModuleGetFunction"))?;
        Ok(LoadedKernel { func })
    }

    /// Makes this context current on the calling thread.
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

/// A non-blocking stream.
#[derive(Debug)]
pub struct Stream {
    inner: Arc<CudaStream>,
}

impl Stream {
    /// A new non-blocking stream on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        let inner = ctx.inner.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(Stream { inner })
    }

    /// The raw `CUstream` (for DLPack consumers and tests; this stream stays its owner).
    pub fn raw(&self) -> u64 {
        self.inner.cu_stream() as u64
    }

    /// Waits for all work enqueued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    /// Makes this stream's later work wait for `event` (no host synchronisation).
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.inner
            .wait(&event.inner)
            .map_err(driver("cuStreamWaitEvent"))
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
            unsafe {
                sys::cuStreamWaitEvent(raw_stream as sys::CUstream, event.inner.cu_event(), 0)
            },
            "cuStreamWaitEvent",
        )
    }
}

/// An event without timing.
#[derive(Debug)]
pub struct Event {
    inner: CudaEvent,
}

impl Event {
    /// A new event (without timing) on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        let inner = ctx.inner.new_event(None).map_err(driver("cuEventCreate"))?;
        Ok(Event { inner })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.inner
            .record(&stream.inner)
            .map_err(driver("cuEventRecord"))
    }

    /// Records the event at the current end of `raw_stream`.
    ///
    /// # Safety
    /// As for [`Stream::wait_raw`]: a live stream of this event's context (or 0 or 2), the
    /// context current on this thread.
    pub unsafe fn record_raw(&self, raw_stream: u64) -> Result<()> {
        // SAFETY: the caller vouches for the stream; the event is ours and live.
        check(
            unsafe { sys::cuEventRecord(self.inner.cu_event(), raw_stream as sys::CUstream) },
            "cuEventRecord",
        )
    }

    /// Whether the work before the last record has completed.
    pub fn done(&self) -> Result<bool> {
        self.inner.try_is_complete().map_err(driver("cuEventQuery"))
    }

    /// Waits for the work before the last record.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .synchronize()
            .map_err(driver("cuEventSynchronize"))
    }

    /// The raw `CUevent` (for DLPack consumers; this event stays its owner).
    pub fn raw(&self) -> u64 {
        self.inner.cu_event() as u64
    }
}

/// A kernel's entry point in a module loaded on a device (the module stays loaded while this
/// lives).
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    func: cudarc::driver::CudaFunction,
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

/// Device memory (a cudarc `CudaSlice`, zeroed once at allocation).
#[derive(Debug)]
pub struct DeviceBuffer {
    mem: CudaSlice<u8>,
    /// `mem`'s address, read once (cudarc hands it out with bookkeeping per use).
    ptr: u64,
    len: usize,
}

impl DeviceBuffer {
    /// `len` bytes of zeroed device memory on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<DeviceBuffer> {
        // Allocated (stream-ordered where the device supports it) and zeroed on the legacy
        // default stream, which is then waited for, so any stream may use it from here on.
        let stream = ctx.inner.default_stream();
        let mem = stream
            .alloc_zeros::<u8>(len.max(1))
            .map_err(driver("cuMemAlloc"))?;
        stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        let ptr = mem.device_ptr(&stream).0;
        Ok(DeviceBuffer { mem, ptr, len })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes from `offset` to the host, synchronously (tests, checks).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let end = self.range_end(offset, dst.len())?;
        let stream = self.mem.stream().clone();
        stream
            .memcpy_dtoh(&self.mem.slice(offset..end), dst)
            .map_err(driver("cuMemcpyDtoH"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    /// Copies `src` to `offset`, synchronously, from any host memory (the naive path).
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        let end = self.range_end(offset, src.len())?;
        let stream = self.mem.stream().clone();
        stream
            .memcpy_htod(src, &mut self.mem.slice_mut(offset..end))
            .map_err(driver("cuMemcpyHtoD"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
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
        ctx.bind()?;
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
        let _ = self.ctx.bind();
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
