//! The CUDA driver calls gpufeed makes, through cudarc's run-time-loaded bindings.
//!
//! cudarc panics when a library it is asked to load is missing, so nothing here is reached before
//! [`driver_present`] said `libcuda` loads. Every call's `CUresult` becomes an [`Error`] naming the
//! call. Handles (context, stream, event, device memory, host registration) are owned types whose
//! `Drop` releases them; a context is made current on the calling thread by [`Context::bind`]
//! before any call that needs one.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudarc::driver::sys;

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

/// `cuInit` once per process (later calls return the first result).
pub(crate) fn init() -> Result<()> {
    static INIT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    if !driver_present() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "no CUDA driver: libcuda.so could not be loaded",
        ));
    }
    INIT.get_or_init(|| {
        // SAFETY: cuInit takes flags 0; the library is present (checked above).
        check(unsafe { sys::cuInit(0) }, "cuInit").map_err(|e| e.report())
    })
    .clone()
    .map_err(|m| Error::new(ErrorKind::Unsupported, m))
}

/// Number of visible devices (0 when `CUDA_VISIBLE_DEVICES=` hides them all).
pub(crate) fn device_count() -> Result<u32> {
    init()?;
    let mut n = 0;
    // SAFETY: writes one int.
    match unsafe { sys::cuDeviceGetCount(&mut n) } {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
        r => check(r, "cuDeviceGetCount").map(|()| n.max(0) as u32),
    }
}

/// The driver's CUDA version (e.g. 13000).
pub(crate) fn driver_version() -> Result<i32> {
    init()?;
    let mut v = 0;
    // SAFETY: writes one int.
    check(
        unsafe { sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion",
    )?;
    Ok(v)
}

/// A device's primary context, retained for as long as this lives.
#[derive(Debug)]
pub struct Context {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    ordinal: u32,
}

// SAFETY: a CUDA context handle may be used from any thread once made current there (`bind`);
// the driver synchronises its own state.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only hands out the handle.
unsafe impl Sync for Context {}

impl Context {
    /// Retains device `ordinal`'s primary context (the one the CUDA runtime and PyTorch use).
    pub fn new(ordinal: u32) -> Result<Arc<Context>> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("CUDA device {ordinal} does not exist ({n} visible)"),
            ));
        }
        let mut dev = 0;
        // SAFETY: writes one device handle; ordinal < count.
        check(
            unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) },
            "cuDeviceGet",
        )?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle for a valid device.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let c = Arc::new(Context { dev, ctx, ordinal });
        c.bind()?;
        Ok(c)
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context (alive while `self` is).
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device's name and total memory.
    pub fn describe(&self) -> Result<(String, usize)> {
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: writes at most 256 bytes, NUL-terminated.
        check(
            unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, self.dev) },
            "cuDeviceGetName",
        )?;
        let mut mem = 0usize;
        // SAFETY: writes one size.
        check(
            unsafe { sys::cuDeviceTotalMem_v2(&mut mem, self.dev) },
            "cuDeviceTotalMem",
        )?;
        // SAFETY: the buffer is NUL-terminated by the driver.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok((name, mem))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// A non-blocking stream.
#[derive(Debug)]
pub struct Stream {
    pub(crate) raw: sys::CUstream,
    ctx: Arc<Context>,
}

// SAFETY: stream handles may be used from any thread with the context current.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one stream handle.
        check(
            unsafe {
                sys::cuStreamCreate(
                    &mut raw,
                    sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32,
                )
            },
            "cuStreamCreate",
        )?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn raw(&self) -> u64 {
        self.raw as u64
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live stream.
        check(
            unsafe { sys::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
        )
    }

    /// Makes `raw_stream`'s later work wait for `event` (no host synchronisation).
    pub fn wait_raw(raw_stream: u64, event: &Event) -> Result<()> {
        // SAFETY: the caller passes a live stream of this context (or 0, the legacy stream);
        // the event is live while borrowed.
        check(
            unsafe { sys::cuStreamWaitEvent(raw_stream as sys::CUstream, event.raw, 0) },
            "cuStreamWaitEvent",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: destroys our own stream; pending work completes first (driver semantics).
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}

/// An event without timing.
#[derive(Debug)]
pub struct Event {
    pub(crate) raw: sys::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: event handles may be used from any thread with the context current.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        check(
            unsafe {
                sys::cuEventCreate(
                    &mut raw,
                    sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32,
                )
            },
            "cuEventCreate",
        )?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Records the event at the current end of `raw_stream`.
    pub fn record_raw(&self, raw_stream: u64) -> Result<()> {
        // SAFETY: live event; the caller passes a live stream of this context.
        check(
            unsafe { sys::cuEventRecord(self.raw, raw_stream as sys::CUstream) },
            "cuEventRecord",
        )
    }

    /// Whether the work before the last record has completed.
    pub fn done(&self) -> Result<bool> {
        // SAFETY: live event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuEventQuery").map(|()| true),
        }
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: live event.
        check(
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
        )
    }

    pub fn raw(&self) -> u64 {
        self.raw as u64
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: destroys our own event.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// Device memory from `cuMemAlloc`.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub(crate) ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<Context>,
}

// SAFETY: a device pointer is a number; access goes through driver calls.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<DeviceBuffer> {
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: writes one device pointer.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) },
            "cuMemAlloc",
        )?;
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes from `offset` to the host, synchronously (tests, checks).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.len) {
            return Err(crate::error::invalid("read past the end of device memory"));
        }
        self.ctx.bind()?;
        // SAFETY: the range lies inside our allocation (checked); `dst` is valid for writes.
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
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: frees our own allocation; owners keep it alive while copies may target it.
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Host memory registered (page-locked) with CUDA; unregistered on drop.
#[derive(Debug)]
pub struct HostRegistration {
    ptr: *mut c_void,
    ctx: Arc<Context>,
}

// SAFETY: holds an address; the registration is process-wide.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` (portable: usable from every context).
    ///
    /// # Safety
    /// `ptr .. ptr + len` must stay mapped until this is dropped.
    pub unsafe fn new(ctx: &Arc<Context>, ptr: *mut u8, len: usize) -> Result<HostRegistration> {
        ctx.bind()?;
        // SAFETY: the caller keeps the range mapped for our lifetime.
        check(
            unsafe {
                sys::cuMemHostRegister_v2(ptr as *mut c_void, len, sys::CU_MEMHOSTREGISTER_PORTABLE)
            },
            "cuMemHostRegister",
        )?;
        Ok(HostRegistration {
            ptr: ptr as *mut c_void,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: unregisters what `new` registered.
        let _ = unsafe { sys::cuMemHostUnregister(self.ptr) };
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
    // SAFETY: forwarded under the caller's guarantees.
    check(
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream.raw) },
        "cuMemcpyHtoDAsync",
    )
}

/// A synchronous host → device copy from any host memory (the naive path).
///
/// # Safety
/// `dst .. dst + src.len()` must be allocated device memory of the current context.
pub unsafe fn memcpy_htod_sync(dst: u64, src: &[u8]) -> Result<()> {
    // SAFETY: forwarded under the caller's guarantee; `src` is a valid slice.
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len()) },
        "cuMemcpyHtoD",
    )
}
