//! gpufeed's CUDA kernels without a GPU: NVRTC compiles each for sm_80 and sm_90 (where the
//! `nvidia-cuda-nvrtc` library loads; CI installs it and sets `GPUFEED_REQUIRE_NVRTC`, so there
//! a missing library fails), and the exact `.cu` sources run on the CPU through
//! `kernels/host_shim.h` (compiled by the C++ compiler), compared with the CPU decode stage and
//! with crc32c.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gpufeed::decode::{ImageSpec, Layout, PixelType, RgbDecoder, SampleDecoder};
use gpufeed::testing::kernels::{self, GfEmit, GfSample, GfSpan};
use gpufeed::testing::Rng;

use crate::common::disk_dir;

fn root() -> PathBuf {
    let built = crate::common::repo_root();
    if built.join("kernels").exists() {
        built
    } else {
        PathBuf::from(".") // a test binary shipped to another machine runs in a copy of the tree
    }
}

/// Whether NVRTC is there; without it the test skips, unless CI asked for it.
fn nvrtc() -> bool {
    if kernels::nvrtc_present() {
        return true;
    }
    assert!(
        std::env::var_os("GPUFEED_REQUIRE_NVRTC").is_none(),
        "GPUFEED_REQUIRE_NVRTC is set but libnvrtc.so.13 does not load (LD_LIBRARY_PATH?)"
    );
    eprintln!(
        "skipped: NVRTC is not loadable (pip install 'nvidia-cuda-nvrtc==13.0.*' and put \
         nvidia/cu13/lib on LD_LIBRARY_PATH; .ci/run does)"
    );
    false
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    if !nvrtc() {
        return;
    }
    let (major, minor) = kernels::nvrtc_version().unwrap();
    eprintln!("NVRTC {major}.{minor}");
    for k in kernels::ALL {
        for arch in [80, 90] {
            let cubin = kernels::compile_cubin(k.name, &k.full_source(), arch)
                .unwrap_or_else(|e| panic!("{}", e.report()));
            assert!(
                cubin.starts_with(b"\x7fELF"),
                "{} sm_{arch}: not an ELF CUBIN",
                k.name
            );
            // The entry point is in the CUBIN's symbol table.
            assert!(
                cubin
                    .windows(k.entry.len())
                    .any(|w| w == k.entry.as_bytes()),
                "{} sm_{arch}: no symbol {}",
                k.name,
                k.entry
            );
        }
    }
    // A compile error is an error carrying NVRTC's log, not a panic.
    let e = kernels::compile_cubin("broken", "extern \"C\" __global__ void f() { nope; }", 90)
        .unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn compiled_kernels_are_cached_on_disk() {
    if !nvrtc() {
        return;
    }
    let dir = disk_dir();
    let (a, cached) =
        kernels::cubin_cached(&kernels::RESIZE, 90, "test", Some(dir.path())).unwrap();
    assert!(!cached);
    let (b, cached) =
        kernels::cubin_cached(&kernels::RESIZE, 90, "test", Some(dir.path())).unwrap();
    assert!(cached, "the second call reads the cache");
    assert_eq!(a, b);
    // Another architecture is another entry.
    let (_, cached) =
        kernels::cubin_cached(&kernels::RESIZE, 80, "test", Some(dir.path())).unwrap();
    assert!(!cached);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// The host build of the kernels (one per test run); `None` without a C++ compiler.
fn host_driver() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        if Command::new("c++").arg("--version").output().is_err() {
            eprintln!("skipped: no C++ compiler (c++); CI installs g++");
            return None;
        }
        let exe = crate::common::test_tmp().join("gpufeed-kernels-host");
        let r = root();
        let out = Command::new("c++")
            .args([
                "-O1",
                "-ffp-contract=off",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-include",
            ])
            .arg(r.join("kernels/host_shim.h"))
            .arg("-I")
            .arg(r.join("kernels"))
            .arg(r.join("tests/kernels/host_driver.cpp"))
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the kernels do not compile on the host:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(exe)
    })
    .as_deref()
}

fn run_host(mode: &str, input: &[u8], dir: &Path) -> Vec<u8> {
    let exe = host_driver().expect("checked by the caller");
    let (i, o) = (
        dir.join(format!("{mode}.in")),
        dir.join(format!("{mode}.out")),
    );
    std::fs::write(&i, input).unwrap();
    let st = Command::new(exe)
        .arg(mode)
        .arg(&i)
        .arg(&o)
        .status()
        .unwrap();
    assert!(st.success(), "host kernel {mode} failed");
    std::fs::read(&o).unwrap()
}

fn bytes_of<T: Copy>(v: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(v);
    let mut out = vec![0u8; n];
    // SAFETY: reading the plain-old-data structs (`#[repr(C)]`, no padding: their sizes are
    // asserted in src/gpu/kernels.rs) and floats as bytes; `out` holds exactly `n` bytes.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().cast::<u8>(), out.as_mut_ptr(), n) };
    out
}

/// The value of element `i` of a tensor of `dtype`, on the 0–255 scale of channel `c`.
fn level(out: &[u8], dtype: PixelType, i: usize, spec: &ImageSpec, c: usize) -> f32 {
    let v = match dtype {
        PixelType::U8 => return out[i] as f32,
        PixelType::F32 => f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap()),
        PixelType::F16 => half::f16::from_le_bytes([out[i * 2], out[i * 2 + 1]]).to_f32(),
        PixelType::Bf16 => half::bf16::from_le_bytes([out[i * 2], out[i * 2 + 1]]).to_f32(),
    };
    (v * spec.std[c] + spec.mean[c]) * 255.0
}

#[test]
fn the_resize_kernel_on_the_host_matches_the_cpu_stage() {
    if host_driver().is_none() {
        return;
    }
    let dir = disk_dir();
    // Generated JPEGs of every kind (gray, CMYK, progressive, 4:4:4, 4:2:2, restarts).
    let jpegs: Vec<Vec<u8>> = (0..20)
        .map(|i| gpufeed::testing::synth::jpeg(5, i).unwrap())
        .collect();
    let mut dec = RgbDecoder::new().unwrap();
    let (mut src, mut sizes, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
    for j in &jpegs {
        let mut px = Vec::new();
        sizes.push(dec.decode(j, &mut px).unwrap());
        offsets.push(src.len() as u64);
        src.extend_from_slice(&px);
    }
    let specs = [
        ImageSpec::train(64).dtype(PixelType::F32),
        ImageSpec::eval(48)
            .dtype(PixelType::U8)
            .layout(Layout::Nhwc),
        ImageSpec::train(40)
            .dtype(PixelType::F16)
            .layout(Layout::Nhwc),
        ImageSpec::train(32).dtype(PixelType::Bf16),
    ];
    // Largest |kernel − CPU stage| in levels (0–255), by type: f32 is the same arithmetic up to
    // summation order; u8 may round the other way at .5; f16 and bf16 add a rounding of ±½ ulp.
    let limits = [0.01f32, 1.0, 0.25, 2.0];
    for (spec, limit) in specs.iter().zip(limits) {
        let mut spec = spec.clone();
        spec.dct_scaling = false; // the GPU path decodes at full size
        let mut samples: Vec<GfSample> = (0..jpegs.len())
            .map(|i| {
                let g = spec.geometry(3, 1, 100 + i as u64, sizes[i]);
                GfSample::new(&g, offsets[i], sizes[i])
            })
            .collect();
        samples[7].valid = 0; // a failed sample: zeros
        let emit = GfEmit::new(&spec);
        let mut input = Vec::new();
        input.extend_from_slice(&(samples.len() as u32).to_le_bytes());
        input.extend_from_slice(&(src.len() as u64).to_le_bytes());
        input.extend_from_slice(&bytes_of(&[emit]));
        input.extend_from_slice(&bytes_of(&samples));
        input.extend_from_slice(&src);
        let out = run_host("resize", &input, dir.path());
        let mut cpu = SampleDecoder::new(spec.clone()).unwrap();
        let per = cpu.sample_bytes();
        assert_eq!(out.len(), per * jpegs.len());
        let mut want = vec![0u8; per];
        let (mut worst, mut sum, mut n) = (0f32, 0f64, 0usize);
        for (i, j) in jpegs.iter().enumerate() {
            let got = &out[i * per..(i + 1) * per];
            if i == 7 {
                assert!(got.iter().all(|&b| b == 0), "a failed sample is zeros");
                continue;
            }
            cpu.decode(j, 3, 1, 100 + i as u64, &mut want).unwrap();
            let (w, h) = spec.size;
            for e in 0..(3 * w * h) as usize {
                let c = match spec.layout {
                    Layout::Nchw => e / (w * h) as usize,
                    Layout::Nhwc => e % 3,
                };
                let d = (level(got, spec.dtype, e, &spec, c)
                    - level(&want, spec.dtype, e, &spec, c))
                .abs();
                worst = worst.max(d);
                sum += d as f64;
                n += 1;
            }
        }
        eprintln!(
            "{:?} {:?}: worst {worst:.4} levels, mean {:.5}",
            spec.dtype,
            spec.layout,
            sum / n as f64
        );
        assert!(
            worst <= limit,
            "{:?}: kernel differs from the CPU stage by {worst} levels",
            spec.dtype
        );
    }
}

#[test]
fn the_half_conversions_round_as_the_half_crate_does() {
    if host_driver().is_none() {
        return;
    }
    let dir = disk_dir();
    let mut r = Rng::new(8);
    let mut v: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -2.5,
        65504.0,
        65520.0,
        1e9,
        -1e9,
        6.1e-5,
        5.96e-8,
        2.98e-8,
        1e-10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        0.333_333_34,
        2.117_904,
        -2.117_904,
    ];
    // Values around the normalised range, and random bit patterns (NaNs included).
    v.extend((0..20_000).map(|_| (r.below(1 << 20) as f32 / (1 << 20) as f32) * 6.0 - 3.0));
    v.extend((0..20_000).map(|_| f32::from_bits(r.next_u64() as u32)));
    let input: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let out = run_host("half", &input, dir.path());
    let n = v.len();
    let bits = |i: usize| u16::from_le_bytes([out[i * 2], out[i * 2 + 1]]);
    for (i, x) in v.iter().enumerate() {
        let (h, b) = (half::f16::from_f32(*x), half::bf16::from_f32(*x));
        if x.is_nan() {
            assert!(
                half::f16::from_bits(bits(i)).is_nan(),
                "f16 of NaN {:#x}",
                x.to_bits()
            );
            assert!(
                half::bf16::from_bits(bits(n + i)).is_nan(),
                "bf16 of NaN {:#x}",
                x.to_bits()
            );
        } else {
            assert_eq!(bits(i), h.to_bits(), "f16 of {x:e} ({:#x})", x.to_bits());
            assert_eq!(
                bits(n + i),
                b.to_bits(),
                "bf16 of {x:e} ({:#x})",
                x.to_bits()
            );
        }
    }
}

#[test]
fn the_crc32c_kernel_on_the_host_matches_crc32c() {
    if host_driver().is_none() {
        return;
    }
    let dir = disk_dir();
    let mut r = Rng::new(12);
    let data: Vec<u8> = (0..300_000).map(|_| r.next_u64() as u8).collect();
    let spans: Vec<GfSpan> = (0..200)
        .map(|i| {
            let len = if i == 0 { 0 } else { r.below(5000) as u32 };
            GfSpan {
                offset: r.below((data.len() - len as usize) as u64),
                len,
                reserved: 0,
            }
        })
        .collect();
    let mut input = Vec::new();
    input.extend_from_slice(&(spans.len() as u32).to_le_bytes());
    input.extend_from_slice(&(data.len() as u64).to_le_bytes());
    input.extend_from_slice(&bytes_of(&spans));
    input.extend_from_slice(&data);
    let out = run_host("crc", &input, dir.path());
    for (i, s) in spans.iter().enumerate() {
        let got = u32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
        let want = crc32c::crc32c(&data[s.offset as usize..s.offset as usize + s.len as usize]);
        assert_eq!(got, want, "span {i} ({} bytes at {})", s.len, s.offset);
    }
}

/// nvJPEG loads, every bound symbol resolves, its version is 13, and with no GPU creating a
/// handle is an error naming nvJPEG's status (not a crash); with a GPU the handle works.
#[test]
fn nvjpeg_loads_and_fails_cleanly_without_a_gpu() {
    use gpufeed::testing::nvjpeg;
    let lib = match nvjpeg::load() {
        Ok(l) => l,
        Err(e) => {
            assert!(
                std::env::var_os("GPUFEED_REQUIRE_NVJPEG").is_none(),
                "GPUFEED_REQUIRE_NVJPEG is set but: {e}"
            );
            eprintln!("skipped: {e}");
            return;
        }
    };
    assert!(nvjpeg::SYMBOLS.len() >= 16);
    let (major, minor, patch) = lib.version().unwrap();
    eprintln!("nvJPEG {major}.{minor}.{patch} from {}", lib.path);
    assert_eq!(major, 13);
    let h = nvjpeg::NvJpegHandle::new(
        &lib,
        nvjpeg::backend::DEFAULT,
        nvjpeg::FLAGS_UPSAMPLING_WITH_INTERPOLATION,
    );
    if gpufeed::gpu_available().is_ok() {
        let h = h.unwrap_or_else(|e| panic!("a GPU is here but: {e}"));
        let (n, _css, w, hh) = h
            .image_info(&gpufeed::testing::synth::jpeg(1, 0).unwrap())
            .unwrap();
        assert_eq!(n, 3);
        assert!(w[0] > 0 && hh[0] > 0);
        eprintln!("hardware decoder: {:?}", h.hardware_decoder_info());
    } else {
        let e = h.unwrap_err();
        assert!(e.to_string().contains("NVJPEG_STATUS"), "{e}");
        eprintln!("without a GPU: {e}");
    }
}
