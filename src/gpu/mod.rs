//! ④ To the GPU: the arena pinned for CUDA, one host → device copy per read group on a copy
//! stream, device batches with a ready event, and cuFile (GPUDirect Storage) where it exists.
//!
//! CUDA is loaded at run time (cudarc's dynamic loading, CUDA 13.0 API). cudarc panics when a
//! library is missing, so every entry point first checks that the library loads
//! ([`cuda::driver_present`], [`cufile::library_present`]): without a GPU, callers get an
//! `Unsupported` error that says why, never a panic.
//!
//! Pinning order, on the machine that runs the GPU checks (`scripts/gpu-check.sh`): the arena
//! is mapped (huge pages, touched), registered with CUDA once when the loader is built
//! (`cuMemHostRegister`), and registered with io_uring by each epoch's ring; the GPU tests read
//! through io_uring into a CUDA-registered arena and copy it to the device in both registration
//! orders.

pub(crate) mod copy;
pub(crate) mod cuda;
pub(crate) mod cufile;
pub(crate) mod dev;
pub(crate) mod host_kernels;
pub(crate) mod kernels;
pub(crate) mod nvjpeg;
pub(crate) mod sim;

use std::sync::Arc;

pub use copy::{DevicePool, DeviceRegion};
#[doc(hidden)]
pub use sim::{SimDevice, SimDeviceStats};

use crate::error::{Error, ErrorKind, Result};

/// Where a loader delivers batches.
#[derive(Debug, Clone, Default)]
pub enum Device {
    /// Host memory (the arena's slots).
    #[default]
    Host,
    /// CUDA device memory of device `ordinal`.
    Cuda(u32),
    /// A simulated device in host memory, for tests of the copy stage without a GPU (hidden:
    /// the tests', as [`LoaderBuilder::backend`](crate::loader::LoaderBuilder) is).
    #[doc(hidden)]
    Simulated(SimDevice),
}

/// How reads reach a CUDA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuPath {
    /// The platform's best path. Today the loader always takes io_uring → pinned → H2D:
    /// routing large aligned reads to cuFile under true GDS waits on measurements from a GPU
    /// machine (`gpufeed bench gpu` measures both).
    #[default]
    Auto,
    /// io_uring into the pinned arena, then one copy per read group.
    Uring,
    /// cuFile reads into device memory (GDS, or cuFile's compatibility mode).
    Cufile,
}

/// What CUDA reports about the machine.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    /// CUDA devices visible.
    pub devices: u32,
    /// Device 0's name.
    pub name: String,
    /// Device 0's memory in bytes.
    pub total_mem: usize,
    /// The driver's CUDA version (13000 for 13.0).
    pub driver_version: i32,
    /// cuFile's state: "gds", "compat", or why it is unavailable.
    pub cufile: String,
}

/// Whether a CUDA device is usable, and what it is; an `Unsupported` error that says why not.
pub fn gpu_available() -> Result<GpuInfo> {
    let devices = cuda::device_count()?;
    if devices == 0 {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "no CUDA device is visible (CUDA_VISIBLE_DEVICES hides them, or none is installed)",
        ));
    }
    let ctx = cuda::Context::new(0)?;
    let (name, total_mem) = ctx.describe()?;
    Ok(GpuInfo {
        devices,
        name,
        total_mem,
        driver_version: cuda::driver_version()?,
        cufile: match cufile::status() {
            Ok(m) => m.name().to_string(),
            Err(e) => format!("unavailable: {}", e.report()),
        },
    })
}

/// The context of device `ordinal`, or why there is none.
pub fn context(ordinal: u32) -> Result<Arc<cuda::Context>> {
    cuda::Context::new(ordinal)
}
