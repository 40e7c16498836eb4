//! cuFile (GPUDirect Storage): detected at run time; reads straight into device memory.
//!
//! `libcufile` may be absent (then [`status`] says so); present, `cuFileDriverOpen` may fail, or
//! succeed in *compatibility mode* (cuFile reads through a host bounce buffer when the
//! `nvidia-fs` kernel module is not loaded or the file system is not supported). [`status`]
//! tells which: true GDS needs `nvidia-fs` loaded and NVMe support in the driver's flags.

use std::ffi::c_void;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use cudarc::cufile::sys;

use super::cuda::{Context, DeviceBuffer};
use crate::error::{Error, ErrorKind, Result};

/// Whether `libcufile` loads.
pub fn library_present() -> bool {
    // SAFETY: loads (and drops) the library by name; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// How cuFile moves data on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CufileMode {
    /// Storage DMAs straight into GPU memory (nvidia-fs loaded, NVMe supported).
    Gds,
    /// cuFile's compatibility mode: POSIX reads into a bounce buffer, then a copy.
    Compat,
}

impl CufileMode {
    /// The mode's name, as `bench gpu` reports it ("gds" or "compat").
    pub fn name(self) -> &'static str {
        match self {
            CufileMode::Gds => "gds",
            CufileMode::Compat => "compat",
        }
    }
}

fn op_error(call: &str, e: sys::CUfileError) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("{call} failed: {:?} (cu {:?})", e.err, e.cu_err),
    )
}

/// Opens the cuFile driver once per process; how it runs, or why it cannot.
pub fn status() -> Result<CufileMode> {
    static STATUS: OnceLock<Result<CufileMode, String>> = OnceLock::new();
    if !super::cuda::driver_present() || !library_present() {
        // cudarc loads cuFile by the names `libcufile.so` and `libcufile.so.<major>`; the
        // runtime packages (and the nvidia-cufile wheel) ship `libcufile.so.0` alone.
        // SAFETY: loads (and drops) the library by name; no symbol is called.
        let only_so0 = unsafe { libloading::Library::new("libcufile.so.0") }.is_ok();
        return Err(Error::new(
            ErrorKind::Unsupported,
            if only_so0 {
                "cuFile is installed as libcufile.so.0 only, a name the CUDA bindings do not \
                 try: link libcufile.so to it in its directory (or install the CUDA toolkit's \
                 development files)"
            } else {
                "cuFile is not installed (libcufile.so could not be loaded)"
            },
        ));
    }
    STATUS
        .get_or_init(|| {
            super::cuda::init().map_err(|e| e.report())?;
            // SAFETY: no arguments; the library is present (checked above).
            let r = unsafe { sys::cuFileDriverOpen() };
            if r.err != sys::CUfileOpError::CU_FILE_SUCCESS {
                return Err(op_error("cuFileDriverOpen", r).report());
            }
            let mut props = std::mem::MaybeUninit::<sys::CUfileDrvProps>::uninit();
            // SAFETY: writes one properties struct.
            let r = unsafe { sys::cuFileDriverGetProperties(props.as_mut_ptr()) };
            if r.err != sys::CUfileOpError::CU_FILE_SUCCESS {
                return Err(op_error("cuFileDriverGetProperties", r).report());
            }
            // SAFETY: initialised by the successful call above.
            let props = unsafe { props.assume_init() };
            let nvme = props.nvfs.dstatusflags
                & (1 << sys::CUfileDriverStatusFlags::CU_FILE_NVME_SUPPORTED as u32)
                != 0;
            let nvfs = Path::new("/proc/driver/nvidia-fs").exists();
            Ok(if nvme && nvfs {
                CufileMode::Gds
            } else {
                CufileMode::Compat
            })
        })
        .clone()
        .map_err(|m| Error::new(ErrorKind::Unsupported, m))
}

/// A file registered with cuFile (opened with O_DIRECT).
pub struct CufileFile {
    handle: sys::CUfileHandle_t,
    _file: File,
}

impl std::fmt::Debug for CufileFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CufileFile").finish_non_exhaustive()
    }
}

// SAFETY: cuFile handles may be used from several threads (cuFile is thread-safe).
unsafe impl Send for CufileFile {}
// SAFETY: as above.
unsafe impl Sync for CufileFile {}

impl CufileFile {
    /// Opens `path` with O_DIRECT and registers it with cuFile.
    pub fn open(path: &Path) -> Result<CufileFile> {
        status()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| Error::io("cannot open for cuFile", e).with_path(path.to_path_buf()))?;
        // Built field by field: the handle-type enum has no zero variant, so a zeroed
        // descriptor is not a valid value (Rust aborts on `mem::zeroed` of it).
        let mut descr = sys::CUfileDescr_t {
            type_: sys::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: sys::CUfileDescr_t__bindgen_ty_1 {
                fd: file.as_raw_fd(),
            },
            fs_ops: std::ptr::null(),
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: `descr` describes an open fd that outlives the handle (both owned here).
        let r = unsafe { sys::cuFileHandleRegister(&mut handle, &mut descr) };
        if r.err != sys::CUfileOpError::CU_FILE_SUCCESS {
            let mut e = op_error("cuFileHandleRegister", r);
            if r.err == sys::CUfileOpError::CU_FILE_HANDLE_NOT_REGISTERED {
                // Seen on a Firecracker VM: cuFile asks udev for the volume's attributes and
                // refuses a virtio disk that has no udev record.
                e = Error::new(
                    ErrorKind::Io,
                    format!(
                        "{}: cuFile would not take the file; its log (cufile.log) says why \
                         (for example no udev record for the disk, or a file system it does \
                         not support)",
                        e.message()
                    ),
                );
            }
            return Err(e.with_path(path.to_path_buf()));
        }
        Ok(CufileFile {
            handle,
            _file: file,
        })
    }

    /// Reads `len` bytes at `offset` into the start of `buf`; returns the bytes read (fewer at
    /// end of file). `buf`'s CUDA context is made current for the call (cuFile needs it on the
    /// calling thread) and the thread's own restored after.
    pub fn read(&self, buf: &mut CufileBuffer, len: usize, offset: u64) -> Result<usize> {
        if len > buf.len {
            return Err(crate::error::invalid(format!(
                "cuFile read of {len} bytes into a {}-byte buffer",
                buf.len
            )));
        }
        let _g = buf.mem.context().enter()?;
        // SAFETY: `buf` is registered device memory of at least `len` bytes (checked), borrowed
        // exclusively for this synchronous call; the handle is live.
        let n = unsafe {
            sys::cuFileRead(
                self.handle,
                buf.mem.ptr() as *mut c_void,
                len,
                offset as sys::off_t,
                0,
            )
        };
        if n >= 0 {
            Ok(n as usize)
        } else if n == -1 {
            Err(Error::io(
                "cuFileRead failed",
                std::io::Error::last_os_error(),
            ))
        } else {
            Err(Error::new(
                ErrorKind::Io,
                format!("cuFileRead failed: cuFile error {}", -n),
            ))
        }
    }
}

impl Drop for CufileFile {
    fn drop(&mut self) {
        // SAFETY: deregisters our own handle before the fd closes (field order).
        unsafe { sys::cuFileHandleDeregister(self.handle) };
    }
}

/// Device memory registered with cuFile (its pinned BAR mapping for GDS); deregistered on drop,
/// before the memory is freed.
#[derive(Debug)]
pub struct CufileBuffer {
    mem: DeviceBuffer,
    len: usize,
}

impl CufileBuffer {
    /// Allocates `len` bytes on `ctx`'s device and registers them.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<CufileBuffer> {
        status()?;
        let mem = DeviceBuffer::new(ctx, len)?;
        // cuFile registers memory of the calling thread's current context: without it,
        // CU_FILE_CUDA_DRIVER_ERROR (CUDA_ERROR_INVALID_CONTEXT), as seen on an H200 where the
        // buffer was made on a thread with no context current.
        let _g = ctx.enter()?;
        // SAFETY: `mem` is our own allocation of at least `len` bytes; it is deregistered in
        // `drop` before `mem` (a field) is freed.
        let r = unsafe { sys::cuFileBufRegister(mem.ptr() as *const c_void, len, 0) };
        if r.err != sys::CUfileOpError::CU_FILE_SUCCESS {
            return Err(op_error("cuFileBufRegister", r));
        }
        Ok(CufileBuffer { mem, len })
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device memory (to read back, or to hand to kernels).
    pub fn memory(&self) -> &DeviceBuffer {
        &self.mem
    }
}

impl Drop for CufileBuffer {
    fn drop(&mut self) {
        // Deregistered under its own context, as registered (a failure leaves only cuFile's
        // bookkeeping of memory freed next).
        let _g = self.mem.context().enter();
        // SAFETY: registered in `new`; no read is in flight (reads borrow the buffer mutably and
        // return when done).
        let _ = unsafe { sys::cuFileBufDeregister(self.mem.ptr() as *const c_void) };
    }
}
