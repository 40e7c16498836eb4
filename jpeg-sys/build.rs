//! Builds the bundled libjpeg-turbo 3.1 (`libjpeg-turbo/`, the upstream sources unchanged) into
//! one static `libturbojpeg.a` with the `cc` crate: no cmake. The source lists and the
//! per-precision defines are those of upstream's CMakeLists.txt for `turbojpeg-static` (8-bit
//! sources, plus the 12- and 16-bit precision sources compiled again with `BITS_IN_JSAMPLE`);
//! `jconfig.h`, `jconfigint.h` and `jversion.h` are made from upstream's `.in` templates as its
//! `configure_file` would.
//!
//! SIMD: on x86-64, libjpeg-turbo's SSE2/AVX2 code is NASM assembly. Where `nasm` (or the
//! program `$NASM` names) runs, it is assembled and linked in, and libjpeg-turbo picks the
//! code paths at run time from CPUID as upstream does; where it does not, the library is built
//! with its C code only and one build warning says so. `GPUFEED_JPEG_SIMD=0` builds without SIMD
//! even where NASM is present (to measure the difference), `GPUFEED_JPEG_SIMD=1` fails the build
//! where it cannot have it. Other architectures build without SIMD.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = "3.1.0";
const VERSION_NUMBER: &str = "3001000";
const COPYRIGHT_YEAR: &str = "1991-2024";

/// Built at 8, 12 and 16 bits per sample (upstream's JPEG16_SOURCES).
const SOURCES_16: &[&str] = &[
    "jcapistd.c",
    "jccolor.c",
    "jcdiffct.c",
    "jclossls.c",
    "jcmainct.c",
    "jcprepct.c",
    "jcsample.c",
    "jdapistd.c",
    "jdcolor.c",
    "jddiffct.c",
    "jdlossls.c",
    "jdmainct.c",
    "jdpostct.c",
    "jdsample.c",
    "jutils.c",
];
/// Built at 8 and 12 bits too (JPEG12_SOURCES less JPEG16_SOURCES).
const SOURCES_12: &[&str] = &[
    "jccoefct.c",
    "jcdctmgr.c",
    "jdcoefct.c",
    "jddctmgr.c",
    "jdmerge.c",
    "jfdctfst.c",
    "jfdctint.c",
    "jidctflt.c",
    "jidctfst.c",
    "jidctint.c",
    "jidctred.c",
    "jquant1.c",
    "jquant2.c",
];
/// 8 bits only: the rest of JPEG_SOURCES (arithmetic coding on, as upstream's default), and
/// TurboJPEG's own.
const SOURCES_8: &[&str] = &[
    "jcapimin.c",
    "jchuff.c",
    "jcicc.c",
    "jcinit.c",
    "jclhuff.c",
    "jcmarker.c",
    "jcmaster.c",
    "jcomapi.c",
    "jcparam.c",
    "jcphuff.c",
    "jctrans.c",
    "jdapimin.c",
    "jdatadst.c",
    "jdatasrc.c",
    "jdhuff.c",
    "jdicc.c",
    "jdinput.c",
    "jdlhuff.c",
    "jdmarker.c",
    "jdmaster.c",
    "jdphuff.c",
    "jdtrans.c",
    "jerror.c",
    "jfdctflt.c",
    "jmemmgr.c",
    "jmemnobs.c",
    "jpeg_nbits.c",
    "jaricom.c",
    "jcarith.c",
    "jdarith.c",
    "turbojpeg.c",
    "transupp.c",
    "jdatadst-tj.c",
    "jdatasrc-tj.c",
    "rdbmp.c",
    "rdppm.c",
    "wrbmp.c",
    "wrppm.c",
];
/// TurboJPEG's image file I/O, built again at 12 and 16 bits.
const SOURCES_TJ_MP: &[&str] = &["rdppm.c", "wrppm.c"];

/// upstream's simd/CMakeLists.txt, x86_64.
const SIMD_X86_64: &[&str] = &[
    "jsimdcpu",
    "jfdctflt-sse",
    "jccolor-sse2",
    "jcgray-sse2",
    "jchuff-sse2",
    "jcphuff-sse2",
    "jcsample-sse2",
    "jdcolor-sse2",
    "jdmerge-sse2",
    "jdsample-sse2",
    "jfdctfst-sse2",
    "jfdctint-sse2",
    "jidctflt-sse2",
    "jidctfst-sse2",
    "jidctint-sse2",
    "jidctred-sse2",
    "jquantf-sse2",
    "jquanti-sse2",
    "jccolor-avx2",
    "jcgray-avx2",
    "jcsample-avx2",
    "jdcolor-avx2",
    "jdmerge-avx2",
    "jdsample-avx2",
    "jfdctint-avx2",
    "jidctint-avx2",
    "jquanti-avx2",
];

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("libjpeg-turbo");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let src = root.join("src");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=libjpeg-turbo");
    println!("cargo:rerun-if-env-changed=GPUFEED_JPEG_SIMD");
    println!("cargo:rerun-if-env-changed=NASM");

    let simd = simd_objects(&root, &out);
    println!("cargo:rustc-check-cfg=cfg(gpufeed_jpeg_simd)");
    if simd.is_some() {
        println!("cargo:rustc-cfg=gpufeed_jpeg_simd");
    }

    let include = out.join("include");
    std::fs::create_dir_all(&include).unwrap();
    configure(&src, &include, simd.is_some());

    // One build per precision, each in its own folder (the same file names recur), joined into
    // one archive: libturbojpeg.a.
    let base = || {
        let mut b = cc::Build::new();
        b.include(&include)
            .include(&src)
            .opt_level(3) // libjpeg-turbo unoptimised is several times slower, even in tests.
            .define("NDEBUG", None)
            .warnings(false)
            .flag_if_supported("-fvisibility=hidden")
            .cargo_metadata(false);
        b
    };
    let mut objects = Vec::new();
    for (bits, extra) in [("12", SOURCES_12), ("16", &[][..])] {
        let mut b = base();
        b.out_dir(out.join(format!("j{bits}")))
            .define("BITS_IN_JSAMPLE", bits)
            .files(SOURCES_16.iter().chain(extra).map(|f| src.join(f)));
        objects.extend(b.compile_intermediates());
        let mut b = base();
        b.out_dir(out.join(format!("tj{bits}")))
            .define("BITS_IN_JSAMPLE", bits)
            .define("PPM_SUPPORTED", None)
            .files(SOURCES_TJ_MP.iter().map(|f| src.join(f)));
        objects.extend(b.compile_intermediates());
    }
    let mut b = base();
    b.out_dir(out.join("j8"))
        .define("BMP_SUPPORTED", None)
        .define("PPM_SUPPORTED", None)
        .files(
            SOURCES_16
                .iter()
                .chain(SOURCES_12)
                .chain(SOURCES_8)
                .map(|f| src.join(f)),
        );
    if let Some(simd) = &simd {
        b.file(root.join("simd/x86_64/jsimd.c"));
        objects.extend(simd.iter().cloned());
    }
    b.objects(objects).cargo_metadata(true).compile("turbojpeg");
    println!("cargo:include={}", src.display());
}

/// The SIMD objects, assembled with NASM; `None` where the library goes without SIMD.
fn simd_objects(root: &Path, out: &Path) -> Option<Vec<PathBuf>> {
    let want = env::var("GPUFEED_JPEG_SIMD").ok();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap();
    let refuse = |why: &str| {
        if want.as_deref() == Some("1") {
            panic!("GPUFEED_JPEG_SIMD=1, but {why}");
        }
        None
    };
    if want.as_deref() == Some("0") {
        println!(
            "cargo:warning=GPUFEED_JPEG_SIMD=0: libjpeg-turbo built without its SIMD code \
             (JPEG decoding about half as fast)"
        );
        return None;
    }
    if arch != "x86_64" || os == "windows" || os == "macos" {
        println!(
            "cargo:warning=libjpeg-turbo is built without SIMD on {arch}-{os} (gpufeed builds its \
             x86-64 Linux SIMD only): JPEG decoding about half as fast as with it"
        );
        return refuse("SIMD is built only on x86-64 Linux");
    }
    let nasm = env::var("NASM").unwrap_or_else(|_| "nasm".into());
    let works = Command::new(&nasm)
        .arg("-v")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !works {
        println!(
            "cargo:warning=NASM not found ({nasm} -v did not run): libjpeg-turbo is built without \
             its SSE2/AVX2 code, and JPEG decoding (the decode stage, bench decode, the image \
             loader) runs about half as fast (BENCHMARKS.md). For the SIMD: install nasm \
             (apt-get install nasm), then `cargo clean -p gpufeed-jpeg-sys` and build again."
        );
        return refuse("NASM does not run");
    }
    let dir = out.join("simd");
    std::fs::create_dir_all(&dir).unwrap();
    let mut objects = Vec::new();
    for name in SIMD_X86_64 {
        let asm = root.join("simd/x86_64").join(format!("{name}.asm"));
        let obj = dir.join(format!("{name}.o"));
        let status = Command::new(&nasm)
            .args(["-felf64", "-DELF", "-D__x86_64__", "-DPIC"])
            .arg(format!("-I{}/", root.join("simd/nasm").display()))
            .arg(format!("-I{}/", root.join("simd/x86_64").display()))
            .arg("-o")
            .arg(&obj)
            .arg(&asm)
            .status()
            .unwrap_or_else(|e| panic!("{nasm} {}: {e}", asm.display()));
        if !status.success() {
            // A NASM that runs but cannot assemble these (older than 2.13: no AVX2) is no
            // reason to fail the build.
            println!(
                "cargo:warning={nasm} could not assemble {} (NASM 2.13 or later is needed): \
                 libjpeg-turbo is built without its SIMD code, JPEG decoding about half as fast",
                asm.display()
            );
            return refuse("NASM failed");
        }
        objects.push(obj);
    }
    Some(objects)
}

/// `jconfig.h`, `jconfigint.h` and `jversion.h` from upstream's templates, with the values its
/// CMakeLists.txt finds on Linux with GCC or Clang.
fn configure(src: &Path, include: &Path, simd: bool) {
    let pointer_width = env::var("CARGO_CFG_TARGET_POINTER_WIDTH").unwrap();
    let size_t = if pointer_width == "64" { "8" } else { "4" };
    let vars: &[(&str, &str)] = &[
        ("JPEG_LIB_VERSION", "62"),
        ("VERSION", VERSION),
        ("LIBJPEG_TURBO_VERSION_NUMBER", VERSION_NUMBER),
        ("BUILD", "gpufeed"),
        ("HIDDEN", "__attribute__((visibility(\"hidden\")))"),
        ("INLINE", "__inline__ __attribute__((always_inline))"),
        ("THREAD_LOCAL", "__thread"),
        ("CMAKE_PROJECT_NAME", "libjpeg-turbo"),
        ("SIZE_T", size_t),
        ("COPYRIGHT_YEAR", COPYRIGHT_YEAR),
    ];
    let defined = |name: &str| match name {
        "C_ARITH_CODING_SUPPORTED" | "D_ARITH_CODING_SUPPORTED" | "HAVE_BUILTIN_CTZL" => true,
        "WITH_SIMD" => simd,
        // RIGHT_SHIFT_IS_UNSIGNED, HAVE_INTRIN_H: not on GCC/Clang targets.
        _ => false,
    };
    for name in ["jconfig.h", "jconfigint.h", "jversion.h"] {
        let template = std::fs::read_to_string(src.join(format!("{name}.in"))).unwrap();
        let mut text = String::with_capacity(template.len());
        for line in template.lines() {
            let line = match line.trim_start().strip_prefix("#cmakedefine ") {
                Some(rest) => {
                    let name = rest.split_whitespace().next().unwrap();
                    if defined(name) {
                        format!("#define {rest}")
                    } else {
                        format!("/* #undef {name} */")
                    }
                }
                None => line.to_string(),
            };
            let mut line = line;
            for (var, value) in vars {
                line = line.replace(&format!("@{var}@"), value);
            }
            assert!(
                !line.contains('@'),
                "{name}: unreplaced variable in {line:?}"
            );
            text.push_str(&line);
            text.push('\n');
        }
        std::fs::write(include.join(name), text).unwrap();
    }
}
