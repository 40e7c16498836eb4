//! gpufeed's CUDA kernels (`kernels/*.cu`): embedded sources, compiled at run time by NVRTC to a
//! CUBIN for the device's architecture and cached on disk, and the `#[repr(C)]` parameter
//! structs the kernels read. NVRTC is loaded at run time like the driver (cudarc's
//! dynamic loading); it needs no GPU, so CI compiles every kernel for sm_80 and sm_90 with the
//! `nvidia-cuda-nvrtc` wheel's library, and the tests run the same sources on the CPU through
//! `kernels/host_shim.h` against the CPU decode stage.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as rtc, sys as rtc_sys};

use crate::error::{Error, ErrorKind, Result};

/// One kernel source: its name, entry point and text (with `#include "common.h"` resolved when
/// compiled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// Short name (file stem).
    pub name: &'static str,
    /// The `extern "C" __global__` function to launch.
    pub entry: &'static str,
    /// The `.cu` text.
    pub source: &'static str,
}

/// The header every kernel includes.
pub const COMMON_H: &str = include_str!("../../kernels/common.h");

/// The fused crop / resize / flip / normalise / cast / layout pass.
pub const RESIZE: Kernel = Kernel {
    name: "resize",
    entry: "gf_resize",
    source: include_str!("../../kernels/resize.cu"),
};

/// crc32c of each sample of a group in device memory: `gf_crc32c` (a block per sample, a
/// lane's share per thread), then `gf_crc32c_combine` (entry [`CRC32C_COMBINE`]) in the same
/// module.
pub const CRC32C: Kernel = Kernel {
    name: "crc32c",
    entry: "gf_crc32c",
    source: include_str!("../../kernels/crc32c.cu"),
};

/// The second entry point of [`CRC32C`]'s module: joins each sample's lanes.
pub const CRC32C_COMBINE: &str = "gf_crc32c_combine";

/// Threads (lanes) of `gf_crc32c` per sample (`GF_CRC_LANES`): the scratch holds this many
/// u32 per sample between the two launches.
pub const CRC_LANES: u32 = 128;

/// Every kernel.
pub const ALL: [Kernel; 2] = [RESIZE, CRC32C];

impl Kernel {
    /// The source NVRTC compiles: `#include "common.h"` replaced by the header's text (NVRTC
    /// has no file system to search).
    pub fn full_source(&self) -> String {
        self.source.replace("#include \"common.h\"", COMMON_H)
    }
}

/// One sample of the resize kernel (`struct gf_sample` in `kernels/resize.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GfSample {
    /// Byte offset of the decoded image (packed 8-bit RGB) in the source buffer.
    pub src: u64,
    /// Width of the decoded image.
    pub src_w: u32,
    /// Height of the decoded image.
    pub src_h: u32,
    /// Bytes per row of the decoded image.
    pub src_pitch: u32,
    /// Width the box is resized to.
    pub full_w: u32,
    /// Height the box is resized to.
    pub full_h: u32,
    /// Left of the kept window in the resized image.
    pub win_x: u32,
    /// Top of the kept window.
    pub win_y: u32,
    /// Nonzero: mirror.
    pub flip: u32,
    /// Left, top, right, bottom of the box in source pixels.
    pub r#box: [f32; 4],
    /// 0: the sample failed; the kernel writes zeros.
    pub valid: u32,
    /// Zero.
    pub reserved: u32,
}

/// The output description of the resize kernel (`struct gf_emit`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GfEmit {
    /// Output width.
    pub out_w: u32,
    /// Output height.
    pub out_h: u32,
    /// 0 u8, 1 f16, 2 bf16, 3 f32.
    pub dtype: u32,
    /// 0 NCHW, 1 NHWC.
    pub layout: u32,
    /// Per-channel scale of the 0–255 value (float types).
    pub scale: [f32; 3],
    /// Per-channel bias after the scale.
    pub bias: [f32; 3],
}

/// A sample span of the crc32c kernel (`struct gf_span`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GfSpan {
    /// Byte offset in the group's buffer.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<GfSample>() == 64);
const _: () = assert!(std::mem::size_of::<GfEmit>() == 40);
const _: () = assert!(std::mem::size_of::<GfSpan>() == 16);

/// The kernel parameter structs: `#[repr(C)]`, plain integers and floats, no padding (the
/// `Pod` derive refuses a struct with padding at compile time).
pub trait KernelParam: bytemuck::Pod + sealed::Sealed {}
impl KernelParam for GfSample {}
impl KernelParam for GfSpan {}
impl KernelParam for GfEmit {}
mod sealed {
    pub trait Sealed {}
    impl Sealed for super::GfSample {}
    impl Sealed for super::GfSpan {}
    impl Sealed for super::GfEmit {}
}

/// `v`'s bytes as the kernel reads them (for an upload), without a copy.
pub fn as_bytes<T: KernelParam>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl GfEmit {
    /// Bytes of one output element (`dtype`: 0 u8, 1 f16, 2 bf16, 3 f32).
    pub fn elem_bytes(&self) -> usize {
        match self.dtype {
            0 => 1,
            3 => 4,
            _ => 2,
        }
    }
}

/// Checks what `gf_resize` trusts before it is launched, on the host or a device: an output
/// of exactly `samples.len()` tensors of `emit`'s size and type, and every valid sample's
/// rows inside the `src_len`-byte source.
pub fn check_resize(
    src_len: usize,
    samples: &[GfSample],
    emit: &GfEmit,
    out_len: usize,
) -> Result<()> {
    let pixels = emit.out_w as u64 * emit.out_h as u64;
    let want = samples.len() as u64 * 3 * pixels * emit.elem_bytes() as u64;
    if out_len as u64 != want || emit.dtype > 3 || emit.layout > 1 {
        return Err(crate::error::invalid(format!(
            "resize launch: a {out_len}-byte output for {} samples of {}x{} (type {}, layout {})",
            samples.len(),
            emit.out_w,
            emit.out_h,
            emit.dtype,
            emit.layout
        )));
    }
    for (i, s) in samples.iter().enumerate().filter(|(_, s)| s.valid != 0) {
        let end = s.src as u128
            + (s.src_h as u128).saturating_sub(1) * s.src_pitch as u128
            + s.src_w as u128 * 3;
        if s.src_pitch < s.src_w.saturating_mul(3) || end > src_len as u128 {
            return Err(crate::error::invalid(format!(
                "resize launch: sample {i}'s {}x{} image at byte {} (pitch {}) is outside the \
                 {src_len}-byte source",
                s.src_w, s.src_h, s.src, s.src_pitch
            )));
        }
    }
    Ok(())
}

/// Checks what `gf_crc32c` trusts: every span inside the `data_len`-byte group.
pub fn check_spans(data_len: usize, spans: &[GfSpan]) -> Result<()> {
    for (i, s) in spans.iter().enumerate() {
        if s.offset as u128 + s.len as u128 > data_len as u128 {
            return Err(crate::error::invalid(format!(
                "crc32c launch: span {i} ({} bytes at {}) is outside the {data_len}-byte group",
                s.len, s.offset
            )));
        }
    }
    Ok(())
}

/// Whether NVRTC (`libnvrtc.so`) loads: cudarc panics on first use otherwise.
pub fn nvrtc_present() -> bool {
    // SAFETY: loads (and drops) the library by name; no symbol is called.
    unsafe { rtc_sys::is_culib_present() }
}

fn no_nvrtc() -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "NVRTC (libnvrtc.so.13) is not loadable: install the CUDA toolkit or the \
         nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH",
    )
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(no_nvrtc());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library loads (checked); two writable ints.
    let r = unsafe { rtc_sys::nvrtcVersion(&mut major, &mut minor) };
    r.result()
        .map_err(|e| Error::new(ErrorKind::Io, format!("nvrtcVersion failed: {e:?}")))?;
    Ok((major, minor))
}

/// Compiles `source` (named `name` in messages) to a CUBIN for `sm_{arch}` (e.g. 90). A compile
/// error is an `InvalidInput` error carrying NVRTC's log.
pub fn compile_cubin(name: &str, source: &str, arch: u32) -> Result<Vec<u8>> {
    if !nvrtc_present() {
        return Err(no_nvrtc());
    }
    let fail = |what: &str, e: rtc::NvrtcError| {
        Error::new(
            ErrorKind::Io,
            format!("{what} failed for kernel {name}: {e:?}"),
        )
    };
    let src = CString::new(source).map_err(|_| crate::error::invalid("a NUL in a kernel"))?;
    let cname = CString::new(format!("{name}.cu")).expect("no NUL");
    // `src` and `cname` outlive the program: destroyed below before they drop.
    let prog =
        rtc::create_program(&src, Some(&cname)).map_err(|e| fail("nvrtcCreateProgram", e))?;
    let opts = [
        format!("--gpu-architecture=sm_{arch}"),
        "--std=c++17".to_string(),
        // The host shim runs these sources without contraction: keep the device's plain too.
        "--fmad=false".to_string(),
    ];
    // SAFETY: `prog` was just created and is destroyed once, at the end.
    let compiled = unsafe { rtc::compile_program(prog, &opts) };
    let out = match compiled {
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` is live and compiled; `size` is writable.
            let r = unsafe { rtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
            r.result()
                .map_err(|e| fail("nvrtcGetCUBINSize", e))
                .and_then(|()| {
                    let mut cubin = vec![0u8; size];
                    // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
                    let r =
                        unsafe { rtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) };
                    r.result().map_err(|e| fail("nvrtcGetCUBIN", e))?;
                    Ok(cubin)
                })
        }
        Err(e) => {
            // SAFETY: `prog` is live.
            let log = unsafe { rtc::get_program_log(prog) }.unwrap_or_default();
            let log: Vec<u8> = log
                .iter()
                .map(|&c| c as u8)
                .take_while(|&c| c != 0)
                .collect();
            Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "kernel {name} does not compile for sm_{arch} ({e:?}):\n{}",
                    String::from_utf8_lossy(&log).trim_end()
                ),
            ))
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { rtc::destroy_program(prog) };
    out
}

/// A CUBIN in `dir` of kernel `name` for `sm_{arch}` compiled from the source whose crc32c
/// is `crc`, by any NVRTC for any driver.
fn prebuilt(dir: &Path, name: &str, arch: u32, crc: u32) -> Option<Vec<u8>> {
    let (head, tail) = (format!("{name}-sm{arch}-"), format!("-{crc:08x}.cubin"));
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let file = e.file_name().to_string_lossy().into_owned();
        (file.starts_with(&head) && file.ends_with(&tail))
            .then(|| std::fs::read(e.path()).ok())
            .flatten()
            .filter(|b| b.starts_with(b"\x7fELF"))
    })
}

/// Where compiled kernels are kept: `GPUFEED_KERNEL_CACHE`, else `$XDG_CACHE_HOME/gpufeed`, else
/// `~/.cache/gpufeed`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GPUFEED_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("gpufeed").join("kernels"))
}

/// The CUBIN of `k` for `sm_{arch}`, from `dir` if compiled before (keyed by the source's
/// crc32c, the architecture and NVRTC's version, and `extra`, e.g. the driver version), else
/// compiled and written there (atomically; a cache that cannot be written is only a slower
/// first run). Returns the CUBIN and whether it came from the cache.
pub fn cubin_cached(
    k: &Kernel,
    arch: u32,
    extra: &str,
    dir: Option<&Path>,
) -> Result<(Vec<u8>, bool)> {
    let source = k.full_source();
    let crc = crate::util::crc32c(source.as_bytes());
    if !nvrtc_present() {
        // No compiler here (a GPU machine without the CUDA toolkit): a CUBIN of this exact
        // source and architecture compiled elsewhere (`scripts/gpu-check.sh build` ships
        // them) is taken whatever NVRTC and driver built it; loading it says if the driver
        // cannot run it.
        return dir
            .and_then(|d| prebuilt(d, k.name, arch, crc))
            .map(|b| (b, true))
            .ok_or_else(no_nvrtc);
    }
    let (major, minor) = nvrtc_version()?;
    let key = format!(
        "{}-sm{arch}-nvrtc{major}.{minor}-{extra}-{crc:08x}.cubin",
        k.name
    );
    if let Some(d) = dir {
        if let Ok(b) = std::fs::read(d.join(&key)) {
            if b.starts_with(b"\x7fELF") {
                return Ok((b, true));
            }
        }
    }
    let cubin = compile_cubin(k.name, &source, arch)?;
    if let Some(d) = dir {
        let tmp = d.join(format!("{key}.{}.tmp", std::process::id()));
        let written = std::fs::create_dir_all(d)
            .and_then(|()| std::fs::write(&tmp, &cubin))
            .and_then(|()| std::fs::rename(&tmp, d.join(&key)));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok((cubin, false))
}

/// The kernels loaded on one device: compiled by NVRTC for its architecture (or read from the
/// disk cache), loaded once, launched on the caller's streams.
#[derive(Debug)]
pub struct DeviceKernels {
    resize: super::cuda::LoadedKernel,
    crc32c: super::cuda::LoadedKernel,
    crc32c_combine: super::cuda::LoadedKernel,
}

/// Threads per block of every launch.
pub const BLOCK: u32 = 128;

impl DeviceKernels {
    /// Compiles (or finds in [`cache_dir`]) and loads every kernel on `ctx`'s device.
    pub fn load(ctx: &std::sync::Arc<super::cuda::Context>) -> Result<DeviceKernels> {
        let _g = ctx.enter()?;
        let arch = ctx.arch()?;
        let extra = format!("drv{}", super::cuda::driver_version()?);
        let dir = cache_dir();
        let load = |k: &Kernel, entry: &str| -> Result<super::cuda::LoadedKernel> {
            let (cubin, _) = cubin_cached(k, arch, &extra, dir.as_deref())?;
            ctx.load_kernel(cubin, entry)
        };
        Ok(DeviceKernels {
            resize: load(&RESIZE, RESIZE.entry)?,
            crc32c: load(&CRC32C, CRC32C.entry)?,
            crc32c_combine: load(&CRC32C, CRC32C_COMBINE)?,
        })
    }

    /// `gf_resize` over `n` samples on `stream`: the images at device address `src`, the
    /// `n` [`GfSample`]s at `samples`, writing the batch tensor at `out`.
    ///
    /// # Safety
    /// `samples` must hold `n` valid `GfSample`s whose images lie inside the allocation at
    /// `src` (each `src + pitch × (h − 1) + 3w` within it), `out` must hold `n × 3 × out_w ×
    /// out_h` elements of `emit`'s type, and all three must stay allocated, and `samples`
    /// and `src` unchanged, until work recorded on `stream` after this call has completed.
    pub unsafe fn resize(
        &self,
        stream: &super::cuda::Stream,
        src: u64,
        samples: u64,
        n: u32,
        emit: &GfEmit,
        out: u64,
    ) -> Result<()> {
        let pixels = emit.out_w as u64 * emit.out_h as u64;
        if n == 0 || pixels == 0 {
            return Ok(());
        }
        let grid_x = u32::try_from(pixels.div_ceil(BLOCK as u64))
            .map_err(|_| crate::error::invalid("resize launch: output too large"))?;
        if n > 65_535 {
            return Err(crate::error::invalid(
                "resize launch: more than 65,535 samples (the grid's y limit)",
            ));
        }
        let (mut src, mut samples, mut emit, mut out) = (src, samples, *emit, out);
        let mut params = [
            (&raw mut src).cast(),
            (&raw mut samples).cast(),
            (&raw mut emit).cast(),
            (&raw mut out).cast(),
        ];
        // SAFETY: one pointer per parameter of `gf_resize(const u8*, const gf_sample*,
        // gf_emit, u8*)`, to values of those types (device addresses are u64; `GfEmit` is the
        // `#[repr(C)]` twin of `gf_emit`), read during the call; the caller vouches for the
        // memory behind the addresses.
        unsafe { self.resize.launch((grid_x, n), BLOCK, &mut params, stream) }
    }

    /// crc32c of `n` spans on `stream`: the group at device address `data`, the `n`
    /// [`GfSpan`]s at `spans`, [`CRC_LANES`] u32s per span of scratch at `lanes`, one u32 per
    /// span written at `out` (two launches: the lanes, then their combination).
    ///
    /// # Safety
    /// `spans` must hold `n` spans inside the allocation at `data`, `lanes` room for
    /// `n × CRC_LANES` u32s, `out` room for `n` u32s, all staying allocated (and `data`,
    /// `spans` unchanged) until work recorded on `stream` after this call has completed.
    pub unsafe fn crc32c(
        &self,
        stream: &super::cuda::Stream,
        data: u64,
        spans: u64,
        n: u32,
        lanes: u64,
        out: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let (mut data, mut spans, mut n2, mut lanes, mut out) = (data, spans, n, lanes, out);
        let mut params = [
            (&raw mut data).cast(),
            (&raw mut spans).cast(),
            (&raw mut n2).cast(),
            (&raw mut lanes).cast(),
        ];
        // SAFETY: one pointer per parameter of `gf_crc32c(const u8*, const gf_span*, u32,
        // u32*)`, to values of those types, read during the call; the caller vouches for the
        // memory. A block of CRC_LANES threads per span.
        unsafe { self.crc32c.launch((n, 1), CRC_LANES, &mut params, stream)? };
        let mut params = [
            (&raw mut spans).cast(),
            (&raw mut n2).cast(),
            (&raw mut lanes).cast(),
            (&raw mut out).cast(),
        ];
        // SAFETY: one pointer per parameter of `gf_crc32c_combine(const gf_span*, u32, const
        // u32*, u32*)`, read during the call; ordered after the first launch on `stream`.
        unsafe {
            self.crc32c_combine
                .launch((n.div_ceil(64), 1), 64, &mut params, stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prebuilt_cubin_is_found_by_kernel_arch_and_source_only() {
        let dir = std::env::temp_dir().join(format!("gpufeed-prebuilt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let elf = b"\x7fELF and the rest".to_vec();
        std::fs::write(
            dir.join("resize-sm90-nvrtc13.0-prebuilt-0000abcd.cubin"),
            &elf,
        )
        .unwrap();
        std::fs::write(
            dir.join("resize-sm80-nvrtc13.0-prebuilt-0000abcd.cubin"),
            b"x",
        )
        .unwrap();
        assert_eq!(prebuilt(&dir, "resize", 90, 0xabcd), Some(elf));
        assert_eq!(prebuilt(&dir, "resize", 90, 0xabce), None, "another source");
        assert_eq!(prebuilt(&dir, "crc32c", 90, 0xabcd), None, "another kernel");
        assert_eq!(prebuilt(&dir, "resize", 80, 0xabcd), None, "not an ELF");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
