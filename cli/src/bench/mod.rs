//! Measurements behind `gpufeed bench`: what the disk and each engine deliver.
//!
//! Each bench runs one configuration for a fixed time and reports throughput, latency
//! percentiles, CPU-seconds per GiB (user + system of the whole process, worker threads
//! included, from `getrusage`) and syscalls per read, as a [`IoBenchResult`] that serialises to
//! the JSON the CLI prints with `--json`.

#[cfg(feature = "decode")]
pub mod decode;
pub mod gpu;
pub mod io;
pub mod load;
pub mod plot;
#[cfg(feature = "remote")]
pub mod remote;
pub mod scale;
#[cfg(feature = "tokio-uring")]
pub mod tokio_uring;

pub use crate::util::{SizeMix, IMAGENET_MIX};
pub use io::{ensure_file, run_io_bench, IoBenchResult, IoBenchSpec, Pattern, SubmitPolicy};
