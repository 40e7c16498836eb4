//! The TurboJPEG 3 functions and constants gpufeed calls, from the bundled libjpeg-turbo 3.1
//! (`libjpeg-turbo/src/turbojpeg.h`), which `build.rs` compiles with the `cc` crate — no cmake,
//! and NASM only for the x86-64 SIMD code. The declarations follow `turbojpeg.h`; the names
//! are those bindgen gives them (as in the `turbojpeg-sys` crate gpufeed used before), so
//! `TJPARAM_TJPARAM_QUALITY` is `turbojpeg.h`'s `TJPARAM_QUALITY`.
//!
//! `SIMD` says whether the SIMD code was built in.
#![no_std]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use core::ffi::{c_char, c_int, c_uchar, c_uint, c_ulong, c_void};

/// Whether libjpeg-turbo's SIMD code (SSE2/AVX2, chosen at run time from CPUID) was built in.
pub const SIMD: bool = cfg!(gpufeed_jpeg_simd);

/// `size_t`.
pub type size_t = c_ulong;
/// A TurboJPEG instance.
pub type tjhandle = *mut c_void;

/// `enum TJINIT`: what an instance is for.
pub type TJINIT = c_uint;
/// Compression.
pub const TJINIT_TJINIT_COMPRESS: TJINIT = 0;
/// Decompression.
pub const TJINIT_TJINIT_DECOMPRESS: TJINIT = 1;
/// Lossless transformation.
pub const TJINIT_TJINIT_TRANSFORM: TJINIT = 2;

/// `enum TJSAMP`: chroma subsampling.
pub type TJSAMP = c_int;
/// 4:4:4.
pub const TJSAMP_TJSAMP_444: TJSAMP = 0;
/// 4:2:2.
pub const TJSAMP_TJSAMP_422: TJSAMP = 1;
/// 4:2:0.
pub const TJSAMP_TJSAMP_420: TJSAMP = 2;
/// Grayscale.
pub const TJSAMP_TJSAMP_GRAY: TJSAMP = 3;
/// 4:4:0.
pub const TJSAMP_TJSAMP_440: TJSAMP = 4;
/// 4:1:1.
pub const TJSAMP_TJSAMP_411: TJSAMP = 5;
/// 4:4:1.
pub const TJSAMP_TJSAMP_441: TJSAMP = 6;
/// Unknown subsampling.
pub const TJSAMP_TJSAMP_UNKNOWN: TJSAMP = -1;

/// `enum TJPF`: pixel formats (those gpufeed uses).
pub type TJPF = c_int;
/// RGB, 3 bytes a pixel.
pub const TJPF_TJPF_RGB: TJPF = 0;
/// Grayscale, 1 byte a pixel.
pub const TJPF_TJPF_GRAY: TJPF = 6;
/// CMYK, 4 bytes a pixel.
pub const TJPF_TJPF_CMYK: TJPF = 11;

/// `enum TJCS`: JPEG colour spaces.
pub type TJCS = c_uint;
/// RGB.
pub const TJCS_TJCS_RGB: TJCS = 0;
/// YCbCr.
pub const TJCS_TJCS_YCbCr: TJCS = 1;
/// Grayscale.
pub const TJCS_TJCS_GRAY: TJCS = 2;
/// CMYK.
pub const TJCS_TJCS_CMYK: TJCS = 3;
/// YCCK.
pub const TJCS_TJCS_YCCK: TJCS = 4;

/// `enum TJPARAM`: the parameters of `tj3Set`/`tj3Get` (those gpufeed uses).
pub type TJPARAM = c_uint;
/// Compression quality, 1–100.
pub const TJPARAM_TJPARAM_QUALITY: TJPARAM = 3;
/// Chroma subsampling (a `TJSAMP`).
pub const TJPARAM_TJPARAM_SUBSAMP: TJPARAM = 4;
/// The JPEG's width (after `tj3DecompressHeader`).
pub const TJPARAM_TJPARAM_JPEGWIDTH: TJPARAM = 5;
/// The JPEG's height.
pub const TJPARAM_TJPARAM_JPEGHEIGHT: TJPARAM = 6;
/// The JPEG's colour space (a `TJCS`).
pub const TJPARAM_TJPARAM_COLORSPACE: TJPARAM = 8;
/// Progressive coding.
pub const TJPARAM_TJPARAM_PROGRESSIVE: TJPARAM = 12;
/// The most progressive scans a decompression accepts.
pub const TJPARAM_TJPARAM_SCANLIMIT: TJPARAM = 13;
/// MCU rows between restart markers.
pub const TJPARAM_TJPARAM_RESTARTROWS: TJPARAM = 19;
/// The most pixels a decompression accepts.
pub const TJPARAM_TJPARAM_MAXPIXELS: TJPARAM = 24;

/// `enum TJERR`: how bad the last error was.
pub type TJERR = c_uint;
/// A warning: the image may still be usable.
pub const TJERR_TJERR_WARNING: TJERR = 0;
/// Fatal.
pub const TJERR_TJERR_FATAL: TJERR = 1;

/// `tjscalingfactor`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct tjscalingfactor {
    /// Numerator.
    pub num: c_int,
    /// Denominator.
    pub denom: c_int,
}

/// `tjregion`: a cropping region.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct tjregion {
    /// Left edge (a multiple of the iMCU width).
    pub x: c_int,
    /// Top edge.
    pub y: c_int,
    /// Width (0: to the right edge).
    pub w: c_int,
    /// Height (0: to the bottom edge).
    pub h: c_int,
}

extern "C" {
    /// A new instance (`TJINIT`), or null.
    pub fn tj3Init(initType: c_int) -> tjhandle;
    /// Frees an instance.
    pub fn tj3Destroy(handle: tjhandle);
    /// The last error's text (the instance's, or a global one for a null handle).
    pub fn tj3GetErrorStr(handle: tjhandle) -> *mut c_char;
    /// The last error's `TJERR`.
    pub fn tj3GetErrorCode(handle: tjhandle) -> c_int;
    /// Sets a `TJPARAM`; 0 or -1.
    pub fn tj3Set(handle: tjhandle, param: c_int, value: c_int) -> c_int;
    /// Reads a `TJPARAM`; -1 when unknown.
    pub fn tj3Get(handle: tjhandle, param: c_int) -> c_int;
    /// Frees a buffer TurboJPEG allocated.
    pub fn tj3Free(buffer: *mut c_void);
    /// Compresses 8-bit pixels into a JPEG TurboJPEG allocates (`*jpegBuf`, freed with
    /// `tj3Free`); 0 or -1.
    pub fn tj3Compress8(
        handle: tjhandle,
        srcBuf: *const c_uchar,
        width: c_int,
        pitch: c_int,
        height: c_int,
        pixelFormat: c_int,
        jpegBuf: *mut *mut c_uchar,
        jpegSize: *mut size_t,
    ) -> c_int;
    /// Reads a JPEG's header into the instance's parameters; 0 or -1.
    pub fn tj3DecompressHeader(
        handle: tjhandle,
        jpegBuf: *const c_uchar,
        jpegSize: size_t,
    ) -> c_int;
    /// The scaling factor for the next decompression; 0 or -1.
    pub fn tj3SetScalingFactor(handle: tjhandle, scalingFactor: tjscalingfactor) -> c_int;
    /// The cropping region for the next decompression; 0 or -1.
    pub fn tj3SetCroppingRegion(handle: tjhandle, croppingRegion: tjregion) -> c_int;
    /// Decompresses an 8-bit JPEG into `dstBuf` (`pitch` bytes a row); 0 or -1.
    pub fn tj3Decompress8(
        handle: tjhandle,
        jpegBuf: *const c_uchar,
        jpegSize: size_t,
        dstBuf: *mut c_uchar,
        pitch: c_int,
        pixelFormat: c_int,
    ) -> c_int;
}

#[cfg(test)]
mod tests {
    extern crate std;

    #[test]
    fn links_and_reads_a_header() {
        // A 1×1 gray JPEG, compressed and read back through the library this crate built.
        let pixel = [128u8];
        // SAFETY: each handle comes from tj3Init and is checked for null; the buffers outlive
        // the calls; the JPEG buffer TurboJPEG allocates is freed with tj3Free.
        unsafe {
            let c = super::tj3Init(super::TJINIT_TJINIT_COMPRESS as _);
            assert!(!c.is_null());
            assert_eq!(
                super::tj3Set(
                    c,
                    super::TJPARAM_TJPARAM_SUBSAMP as _,
                    super::TJSAMP_TJSAMP_GRAY
                ),
                0
            );
            assert_eq!(super::tj3Set(c, super::TJPARAM_TJPARAM_QUALITY as _, 90), 0);
            let mut buf = core::ptr::null_mut();
            let mut size: super::size_t = 0;
            let rc = super::tj3Compress8(
                c,
                pixel.as_ptr(),
                1,
                1,
                1,
                super::TJPF_TJPF_GRAY,
                &mut buf,
                &mut size,
            );
            assert_eq!(rc, 0);
            let d = super::tj3Init(super::TJINIT_TJINIT_DECOMPRESS as _);
            assert_eq!(super::tj3DecompressHeader(d, buf, size), 0);
            assert_eq!(super::tj3Get(d, super::TJPARAM_TJPARAM_JPEGWIDTH as _), 1);
            assert_eq!(
                super::tj3Get(d, super::TJPARAM_TJPARAM_COLORSPACE as _),
                super::TJCS_TJCS_GRAY as _
            );
            let mut out = [0u8];
            assert_eq!(
                super::tj3Decompress8(d, buf, size, out.as_mut_ptr(), 1, super::TJPF_TJPF_GRAY),
                0
            );
            assert!(out[0].abs_diff(128) <= 1, "{}", out[0]);
            super::tj3Free(buf.cast());
            super::tj3Destroy(c);
            super::tj3Destroy(d);
        }
    }
}
