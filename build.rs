//! With the `sim` feature (test and simulation builds), compiles the CUDA kernels'
//! `kernels/*.cu` sources for the host through `kernels/host_shim.h`, so the simulated device
//! runs the arithmetic the GPU will run. The default build compiles nothing here: kernels
//! reach a GPU through NVRTC at run time. Without a C++ compiler the simulated device says so
//! when asked to launch a kernel (cfg `gf_host_kernels` is then unset), rather than the build
//! failing.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(gf_host_kernels)");
    println!("cargo::rerun-if-changed=build.rs");
    // Build scripts see the package's features as cfg: nothing to do without `sim`.
    #[cfg(feature = "sim")]
    host_kernels();
}

#[cfg(feature = "sim")]
fn host_kernels() {
    for f in [
        "kernels/host_entry.cpp",
        "kernels/host_shim.h",
        "kernels/common.h",
        "kernels/resize.cu",
        "kernels/crc32c.cu",
    ] {
        println!("cargo::rerun-if-changed={f}");
    }
    let root = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let k = root.join("kernels");
    let mut b = cc::Build::new();
    b.cpp(true)
        .file(k.join("host_entry.cpp"))
        .include(&k)
        .flag("-include")
        .flag(k.join("host_shim.h").to_string_lossy().as_ref())
        // As the kernel tests' host build: no contraction, so the host's arithmetic is plain.
        .flag("-ffp-contract=off")
        .flag("-std=c++17")
        .opt_level(2)
        .warnings(false)
        .cargo_warnings(false);
    match b.try_compile("gpufeed_host_kernels") {
        Ok(()) => println!("cargo::rustc-cfg=gf_host_kernels"),
        Err(e) => println!(
            "cargo::warning=the simulated device's kernels are not built (no C++ compiler?): {e}"
        ),
    }
}
