//! nvJPEG, loaded at run time (`libnvjpeg.so.13`: the CUDA toolkit's, or the `nvidia-nvjpeg`
//! wheel's, on `LD_LIBRARY_PATH` or named by `GPUFEED_NVJPEG`). cudarc has no nvJPEG module and
//! the `nvjpeg-sys` crate needs CUDA at build time, so the subset the GPU decode stage uses is
//! bound here by hand from `nvjpeg.h` (13.0), every symbol looked up when the library loads: a
//! missing one is an error naming it. The library loads without a driver, so CI checks loading,
//! symbol lookup, the version and the error path of creating a handle with no GPU.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, OnceLock};

use super::dev::{DBuf, DStream, JpegImage, JpegOps};
use crate::error::{Error, ErrorKind, Result};

/// `nvjpegStatus_t`.
pub type Status = c_int;
type Handle = *mut c_void;
type State = *mut c_void;
type CudaStream = *mut c_void;

/// `nvjpegImage_t`: up to four planes (device pointers) and their pitches.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvjpegImage {
    /// Plane pointers.
    pub channel: [*mut u8; 4],
    /// Bytes per row of each plane.
    pub pitch: [usize; 4],
}

/// `nvjpegBackend_t` values.
pub mod backend {
    /// The library's choice.
    pub const DEFAULT: i32 = 0;
    /// Huffman decode on the CPU.
    pub const HYBRID: i32 = 1;
    /// Huffman decode on the GPU for baseline streams.
    pub const GPU_HYBRID: i32 = 2;
    /// The JPEG engines (A100, H100, H200): baseline, single scan.
    pub const HARDWARE: i32 = 3;
    /// GPU hybrid, bitstreams in device memory.
    pub const GPU_HYBRID_DEVICE: i32 = 4;
    /// The JPEG engines, bitstreams in device memory.
    pub const HARDWARE_DEVICE: i32 = 5;
}

/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`: chroma upsampling as libjpeg-turbo's fancy
/// upsampling, so the output matches the CPU stage's oracle.
pub const FLAGS_UPSAMPLING_WITH_INTERPOLATION: c_uint = 1 << 5;

/// The name of an `nvjpegStatus_t`.
pub fn status_name(s: Status) -> &'static str {
    match s {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => "unknown nvjpegStatus_t",
    }
}

fn check(s: Status, call: &str) -> Result<()> {
    if s == 0 {
        return Ok(());
    }
    let kind = match s {
        3 | 4 | 10 => ErrorKind::InvalidInput,
        7 | 9 => ErrorKind::Unsupported,
        5 => ErrorKind::Busy,
        _ => ErrorKind::Io,
    };
    Err(Error::new(
        kind,
        format!("{call} failed: {} ({s})", status_name(s)),
    ))
}

macro_rules! nvjpeg_fns {
    ($($field:ident = $sym:literal : fn($($arg:ty),*);)*) => {
        /// The bound subset of nvJPEG: one function pointer per symbol.
        #[allow(missing_docs, reason = "each field is the nvJPEG function of its name")]
        pub struct Functions {
            $(pub $field: unsafe extern "C" fn($($arg),*) -> Status,)*
        }

        impl std::fmt::Debug for Functions {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Functions").finish_non_exhaustive()
            }
        }

        /// Every symbol bound (for checks and messages).
        pub const SYMBOLS: &[&str] = &[$($sym),*];

        impl Functions {
            fn load(lib: &libloading::Library) -> Result<Functions> {
                Ok(Functions {
                    $($field: {
                        // SAFETY: the symbol's type is the prototype in nvjpeg.h (13.0), written
                        // out above. The pointer outlives the `Symbol` borrow but not the
                        // library: `load` keeps the one `NvJpeg` (which owns `lib`) in a static
                        // for the rest of the process, so the library is never unloaded.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> Status>($sym.as_bytes())
                        };
                        *s.map_err(|e| Error::new(
                            ErrorKind::Unsupported,
                            format!("libnvjpeg lacks {}: {e}", $sym),
                        ))?
                    },)*
                })
            }
        }
    };
}

nvjpeg_fns! {
    get_property = "nvjpegGetProperty": fn(c_int, *mut c_int);
    create_ex = "nvjpegCreateEx": fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle);
    destroy = "nvjpegDestroy": fn(Handle);
    hardware_decoder_info = "nvjpegGetHardwareDecoderInfo": fn(Handle, *mut c_uint, *mut c_uint);
    state_create = "nvjpegJpegStateCreate": fn(Handle, *mut State);
    state_destroy = "nvjpegJpegStateDestroy": fn(State);
    image_info = "nvjpegGetImageInfo": fn(Handle, *const u8, usize, *mut c_int, *mut c_int, *mut c_int, *mut c_int);
    batched_initialize = "nvjpegDecodeBatchedInitialize": fn(Handle, State, c_int, c_int, c_int);
    batched_pre_allocate = "nvjpegDecodeBatchedPreAllocate": fn(Handle, State, c_int, c_int, c_int, c_int, c_int);
    decode_batched = "nvjpegDecodeBatched": fn(Handle, State, *const *const u8, *const usize, *mut NvjpegImage, CudaStream);
    decode_batched_ex = "nvjpegDecodeBatchedEx": fn(Handle, State, *const *const u8, *const usize, *mut NvjpegImage, *mut *mut c_void, CudaStream);
    params_create = "nvjpegDecodeParamsCreate": fn(Handle, *mut *mut c_void);
    params_destroy = "nvjpegDecodeParamsDestroy": fn(*mut c_void);
    params_set_output_format = "nvjpegDecodeParamsSetOutputFormat": fn(*mut c_void, c_int);
    params_set_roi = "nvjpegDecodeParamsSetROI": fn(*mut c_void, c_int, c_int, c_int, c_int);
    params_set_allow_cmyk = "nvjpegDecodeParamsSetAllowCMYK": fn(*mut c_void, c_int);
}

/// The loaded library and its functions (one per process, never unloaded: see [`load`]).
pub struct NvJpeg {
    /// The bound functions (valid for the process's life: the library stays loaded).
    pub fns: Functions,
    _lib: libloading::Library,
    /// Where it was loaded from.
    pub path: String,
}

impl std::fmt::Debug for NvJpeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvJpeg")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Loads nvJPEG once per process: `GPUFEED_NVJPEG` (a path), else `libnvjpeg.so.13`, else
/// `libnvjpeg.so`, through the dynamic loader's search (LD_LIBRARY_PATH included).
pub fn load() -> Result<Arc<NvJpeg>> {
    static LIB: OnceLock<std::result::Result<Arc<NvJpeg>, Error>> = OnceLock::new();
    LIB.get_or_init(|| {
        let names: Vec<String> = match std::env::var("GPUFEED_NVJPEG") {
            Ok(p) => vec![p],
            Err(_) => vec!["libnvjpeg.so.13".into(), "libnvjpeg.so".into()],
        };
        let mut last = String::new();
        for n in &names {
            // SAFETY: loading nvJPEG runs its initialisers, which only set up the library
            // (it links the CUDA runtime statically and opens the driver lazily).
            match unsafe { libloading::Library::new(n) } {
                Ok(lib) => {
                    let fns = Functions::load(&lib)?;
                    return Ok(Arc::new(NvJpeg {
                        fns,
                        _lib: lib,
                        path: n.clone(),
                    }));
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "nvJPEG is not loadable ({last}): install the CUDA toolkit or the nvidia-nvjpeg \
                 wheel and put its lib folder on LD_LIBRARY_PATH, or name the library in \
                 GPUFEED_NVJPEG"
            ),
        ))
    })
    .clone()
}

impl NvJpeg {
    /// The library's version (major, minor, patch).
    pub fn version(&self) -> Result<(i32, i32, i32)> {
        let mut v = [0; 3];
        for (i, x) in v.iter_mut().enumerate() {
            // SAFETY: libraryPropertyType 0, 1, 2 (MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL);
            // `x` is writable.
            let s = unsafe { (self.fns.get_property)(i as c_int, x) };
            check(s, "nvjpegGetProperty")?;
        }
        Ok((v[0], v[1], v[2]))
    }
}

/// An nvJPEG handle (`nvjpegHandle_t`), destroyed on drop.
pub struct NvJpegHandle {
    lib: Arc<NvJpeg>,
    raw: Handle,
}

// SAFETY: an nvJPEG handle may be used from any thread (not from two at once: `&mut self` or
// one owner).
unsafe impl Send for NvJpegHandle {}

impl std::fmt::Debug for NvJpegHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvJpegHandle").finish_non_exhaustive()
    }
}

impl NvJpegHandle {
    /// A handle on `backend` with `flags` (e.g. [`FLAGS_UPSAMPLING_WITH_INTERPOLATION`]) and the
    /// default allocators. Without a GPU or driver this is an error naming the status.
    pub fn new(lib: &Arc<NvJpeg>, backend: i32, flags: c_uint) -> Result<NvJpegHandle> {
        let mut raw: Handle = std::ptr::null_mut();
        // SAFETY: null allocators ask for nvJPEG's defaults; `raw` is writable.
        let s = unsafe {
            (lib.fns.create_ex)(
                backend,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                flags,
                &mut raw,
            )
        };
        check(s, "nvjpegCreateEx")?;
        Ok(NvJpegHandle {
            lib: lib.clone(),
            raw,
        })
    }

    /// JPEG engines and cores per engine (`nvjpegGetHardwareDecoderInfo`; 0 where there are
    /// none).
    pub fn hardware_decoder_info(&self) -> Result<(u32, u32)> {
        let (mut engines, mut cores) = (0, 0);
        // SAFETY: a live handle and two writable values.
        let s = unsafe { (self.lib.fns.hardware_decoder_info)(self.raw, &mut engines, &mut cores) };
        check(s, "nvjpegGetHardwareDecoderInfo")?;
        Ok((engines, cores))
    }

    /// Components, chroma subsampling (`nvjpegChromaSubsampling_t`) and each component's width
    /// and height, from the header of `data`.
    pub fn image_info(&self, data: &[u8]) -> Result<(i32, i32, [i32; 4], [i32; 4])> {
        let (mut n, mut css) = (0, 0);
        let (mut w, mut h) = ([0; 4], [0; 4]);
        // SAFETY: a live handle; `data` for its length; four ints per output array, as
        // NVJPEG_MAX_COMPONENT.
        let s = unsafe {
            (self.lib.fns.image_info)(
                self.raw,
                data.as_ptr(),
                data.len(),
                &mut n,
                &mut css,
                w.as_mut_ptr(),
                h.as_mut_ptr(),
            )
        };
        check(s, "nvjpegGetImageInfo")?;
        Ok((n, css, w, h))
    }
}

impl Drop for NvJpegHandle {
    fn drop(&mut self) {
        // SAFETY: created by nvjpegCreateEx, destroyed once; errors are not panicked on.
        let _ = unsafe { (self.lib.fns.destroy)(self.raw) };
    }
}

/// `NVJPEG_OUTPUT_RGBI`: interleaved 8-bit RGB, one plane.
pub const OUTPUT_RGBI: c_int = 5;
/// `NVJPEG_CSS_444`: the largest buffers a pre-allocation can ask for.
pub const CSS_444: c_int = 0;

/// nvJPEG's batched decode (`nvjpegDecodeBatched`) on one backend: a handle and its decode
/// state, used by one thread at a time.
pub struct BatchDecoder {
    handle: NvJpegHandle,
    state: State,
    backend: i32,
}

// SAFETY: the handle and state are used only through `&mut self` (one thread at a time); nvJPEG
// allows a state to move between threads.
unsafe impl Send for BatchDecoder {}

impl std::fmt::Debug for BatchDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchDecoder")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl BatchDecoder {
    /// A decoder on `backend` (e.g. [`backend::HARDWARE_DEVICE`]: the JPEG engines, reading
    /// bitstreams in device memory), upsampling chroma with interpolation as libjpeg-turbo.
    pub fn new(lib: &Arc<NvJpeg>, backend: i32) -> Result<BatchDecoder> {
        let handle = NvJpegHandle::new(lib, backend, FLAGS_UPSAMPLING_WITH_INTERPOLATION)?;
        let mut state: State = std::ptr::null_mut();
        // SAFETY: a live handle; `state` is writable.
        let s = unsafe { (lib.fns.state_create)(handle.raw, &mut state) };
        check(s, "nvjpegJpegStateCreate")?;
        Ok(BatchDecoder {
            handle,
            state,
            backend,
        })
    }

    /// The handle (for [`NvJpegHandle::hardware_decoder_info`]).
    pub fn handle(&self) -> &NvJpegHandle {
        &self.handle
    }

    /// Allocates the internal buffers for batches of up to `batch` images of up to
    /// `width` × `height` up front (`nvjpegDecodeBatchedPreAllocate`), so decoding allocates
    /// nothing later.
    /// Documented for [`backend::HARDWARE`] only: refused on other backends.
    pub fn pre_allocate(&mut self, batch: usize, width: u32, height: u32) -> Result<()> {
        if self.backend != backend::HARDWARE {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "nvjpegDecodeBatchedPreAllocate is for the HARDWARE backend only",
            ));
        }
        let f = &self.handle.lib.fns;
        // SAFETY: a live handle and state; plain values.
        let s = unsafe {
            (f.batched_pre_allocate)(
                self.handle.raw,
                self.state,
                batch as c_int,
                width as c_int,
                height as c_int,
                CSS_444,
                OUTPUT_RGBI,
            )
        };
        check(s, "nvjpegDecodeBatchedPreAllocate")
    }

    /// Decodes `data.len()` JPEGs into interleaved RGB at `dst` on `stream`
    /// (`nvjpegDecodeBatchedInitialize` for this count, then `nvjpegDecodeBatched`).
    ///
    /// # Safety
    /// `data[i]` must point to `lengths[i]` bytes of a JPEG — in device memory for the
    /// `*_DEVICE` backends, host memory otherwise — and each `dst[i].channel[0]` to device
    /// memory holding `height × pitch[0]` bytes with `pitch[0] >= 3 × width`, all staying valid
    /// and unchanged until work recorded on `stream` (a `CUstream` of the current context)
    /// after this call has completed.
    pub unsafe fn decode(
        &mut self,
        data: &[*const u8],
        lengths: &[usize],
        dst: &mut [NvjpegImage],
        stream: u64,
    ) -> Result<()> {
        let n = data.len();
        if n == 0 {
            return Ok(());
        }
        if lengths.len() != n || dst.len() != n {
            return Err(crate::error::invalid("nvJPEG batch: mismatched lengths"));
        }
        let f = &self.handle.lib.fns;
        // SAFETY: a live handle and state; one CPU thread (this one) for the host parts.
        let s = unsafe {
            (f.batched_initialize)(self.handle.raw, self.state, n as c_int, 1, OUTPUT_RGBI)
        };
        check(s, "nvjpegDecodeBatchedInitialize")?;
        // SAFETY: the arrays hold `n` entries each (checked), and the caller vouches for the
        // memory they point to and for the stream.
        let s = unsafe {
            (f.decode_batched)(
                self.handle.raw,
                self.state,
                data.as_ptr(),
                lengths.as_ptr(),
                dst.as_mut_ptr(),
                stream as CudaStream,
            )
        };
        check(s, "nvjpegDecodeBatched")
    }
}

impl Drop for BatchDecoder {
    fn drop(&mut self) {
        // SAFETY: created by nvjpegJpegStateCreate on this handle, destroyed once before the
        // handle (a field, dropped after this body); errors are not panicked on.
        let _ = unsafe { (self.handle.lib.fns.state_destroy)(self.state) };
    }
}

/// nvJPEG's batched decoder on the JPEG engines with bitstreams in device memory, or why not.
/// Nothing is pre-allocated: `nvjpegDecodeBatchedPreAllocate` is documented for the
/// `HARDWARE` backend only, and its size (batch × the largest image) is what the staging
/// budget exists to avoid; the engines' buffers grow to the batches they see.
pub(crate) fn hardware_decoder() -> Result<BatchDecoder> {
    let lib = load()?;
    let d = BatchDecoder::new(&lib, backend::HARDWARE_DEVICE)?;
    let (engines, _) = d.handle().hardware_decoder_info()?;
    if engines == 0 {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "this GPU has no JPEG engines",
        ));
    }
    Ok(d)
}

/// The CUDA device's batched JPEG decode: nvJPEG on the JPEG engines.
impl JpegOps for BatchDecoder {
    unsafe fn decode(
        &mut self,
        src: &DBuf,
        images: &[JpegImage],
        out: &DBuf,
        stream: &DStream,
    ) -> Result<()> {
        let (src, out) = (super::cuda::dev_ptr(src)?, super::cuda::dev_ptr(out)?);
        let raw = super::cuda::cuda_stream(stream)?.raw();
        let data: Vec<*const u8> = images
            .iter()
            .map(|i| (src + i.bits.start as u64) as *const u8)
            .collect();
        let lengths: Vec<usize> = images.iter().map(|i| i.bits.len()).collect();
        let mut dst: Vec<_> = images
            .iter()
            .map(|i| NvjpegImage {
                channel: [
                    (out + i.out as u64) as *mut u8,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                ],
                pitch: [i.size.0 as usize * 3, 0, 0, 0],
            })
            .collect();
        // SAFETY: each bitstream lies inside `src` and each output inside `out` at the pitch of
        // its width, sized from the bitstream's own frame header (checked by `JpegEngine`);
        // both stay allocated, `src` unchanged and `out` untouched by others, until the stream
        // has passed this work (the caller's contract); the stream is CUDA's.
        unsafe { BatchDecoder::decode(self, &data, &lengths, &mut dst, raw) }
    }
}
