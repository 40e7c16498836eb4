//! Compiles every gpufeed kernel with NVRTC (no GPU needed) into a kernel cache directory, for
//! a GPU machine without NVRTC: `scripts/gpu-check.sh build` ships the result and points
//! `GPUFEED_KERNEL_CACHE` at it.
//!
//! `cargo run --release --example kernel_cache -- DIR [ARCH...]` (default architectures 80 90).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: kernel_cache DIR [ARCH...]")?);
    let mut archs: Vec<u32> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if archs.is_empty() {
        archs = vec![80, 90];
    }
    for k in gpufeed::testing::kernels::ALL {
        for &arch in &archs {
            gpufeed::testing::kernels::cubin_cached(&k, arch, "prebuilt", Some(&dir))
                .map_err(|e| e.report())?;
            println!("{} sm_{arch}", k.name);
        }
    }
    Ok(())
}
