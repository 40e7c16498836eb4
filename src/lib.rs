//! # gpufeed — keeps GPUs fed
//!
//! Training reads millions of small samples in a new random order every epoch. gpufeed moves
//! them from NVMe towards the GPU with as few copies, syscalls and interrupts as the hardware
//! allows: the CPU plans and submits, the disk and the copy engine move the bytes.
//!
//! ## The way the data flows
//! ```text
//! dataset files ──► dataset::Dataset (sample → file, offset, len, label, key; packed shards,
//!                     │   WebDataset tars, TFRecord, token corpora, ImageFolder)
//! epoch order ──────► plan::EpochPlan (global / shard-buffer / block order, rank sharding,
//!                     │   coalescing into read groups, scatter map, shuffle quality)
//!                     ▼
//!                   io::Engine (io_uring: fixed files, fixed buffers, O_DIRECT)
//!                     │   a group's reads land in one slot of a huge-page arena (buf::Arena)
//!                     ▼
//!                   gpu (one H2D copy per group on a copy stream, event-ordered; cuFile)
//!                     ▼
//!                   Loader → Batch (host slot or device region; DLPack for Python and C)
//!                     ▼
//!                   decode::ImageLoader (the CPU stage on the host; on a device: crc32c
//!                       kernel, nvJPEG or the CPU per image, one resize launch per batch)
//! ```
//!
//! ## An epoch
//! Every sample exactly once: the last batch may be short ([`LastBatch`]).
//! ```no_run
//! use gpufeed::{Dataset, LastBatch, Loader, Order};
//!
//! let loader = Loader::builder(Dataset::open("/nvme/imagenet-gpf")?)
//!     .batch_size(256)
//!     .order(Order::Global)
//!     .seed(0)
//!     .last_batch(LastBatch::Short) // the default; Drop, or Pad to even out ranks
//!     .build()?;
//! for batch in loader.epoch(3)? {
//!     let batch = batch?;
//!     for i in 0..batch.len() {
//!         match batch.sample(i) {
//!             Ok(bytes) => { let _ = (bytes, batch.labels()[i]); }
//!             Err(e) => eprintln!("{}", e.report()), // file, sample, cause; the others arrive
//!         }
//!     }
//! }
//! # Ok::<(), gpufeed::Error>(())
//! ```
//!
//! ## Any dataset, with options
//! The options have the same names as the CLI's flags, Python's keyword arguments and the C
//! struct's fields ([`dataset::DATASET_OPTIONS`]).
//! ```no_run
//! use gpufeed::dataset::OpenOptions;
//! use gpufeed::Dataset;
//!
//! let mut opts = OpenOptions::default();
//! opts.set("format", "tfrecord")?; // TensorFlow's ImageNet shards have no extension
//! opts.set("label_offset", "1")?; // its labels are 1..=1000
//! let ds = Dataset::open_with("/data/imagenet/train", &opts)?;
//! println!("{} samples; options {}", ds.len(), ds.options().to_json());
//! # Ok::<(), gpufeed::Error>(())
//! ```
//!
//! ## A first read
//! ```no_run
//! use gpufeed::{Engine, EngineConfig, EngineKind, ReadSpec};
//!
//! // 32 reads in flight, 32 slots of 1 MiB in a huge-page arena registered with io_uring.
//! let mut engine = Engine::new(EngineConfig::new(EngineKind::Uring, 32, 1 << 20))?;
//! let file = engine.open("/data/train-00000.bin")?; // O_DIRECT where the file system allows
//! let slot = engine.arena().take().expect("a free slot");
//! // Any offset and length: the engine widens to the O_DIRECT alignment and trims on delivery.
//! let read = ReadSpec { file, offset: 1_000_003, len: 70_000, buf_offset: 0 };
//! engine.submit_one(slot, read, /* user_data */ 1).map_err(|r| r.error)?;
//! engine.wait(1)?;
//! let done = engine.pop().expect("a completion");
//! match done.outcome() {
//!     Ok(range) => println!("{} bytes", engine.arena().bytes(&done.slot)[range.clone()].len()),
//!     Err(e) => eprintln!("{}", e.report()), // the file, offset and length, and the OS error
//! }
//! engine.arena().put(done.slot);
//! # Ok::<(), gpufeed::Error>(())
//! ```
//!
//! ## Glossary
//! - **arena** ([`buf::Arena`]): one 2 MiB-aligned, huge-page-backed mapping, registered with
//!   io_uring as fixed buffers (and pinned with CUDA on a device loader) — never moved, never
//!   regrown.
//! - **group**: consecutive batches read together into one slot (and copied to the device in
//!   one DMA); their samples are sorted by file and offset and merged into few reads.
//! - **slot** ([`buf::Slot`]): an equal part of the arena, and the token that owns it.
//! - **job**: one slot plus the reads ([`ReadSpec`]) that land in it; it completes as a whole
//!   ([`Completion`]) with one outcome per read.
//! - **engine kind** ([`EngineKind`]): `uring` (O_DIRECT), `uring-buffered`, `pread-pool` (no
//!   io_uring), `std` (synchronous baseline). `GPUFEED_ENGINE` forces one.
//! - **backend** ([`io::Backend`]): what moves raw aligned reads; the engine logic above it is
//!   shared, and `io::sim` (feature `sim`) simulates a faulty device to test it.
//!
//! ## Safety model
//! A slot has exactly one owner at every instant — the arena's free list, an engine while a read
//! targets it, or the caller — because [`buf::Slot`] is neither `Clone` nor `Copy`: the engine
//! takes it by value on submission and returns it in a [`Completion`] only after every raw read
//! into it has been reaped. Nothing lends a borrowed `&mut [u8]` to the kernel, so soundness
//! never depends on a destructor running (`mem::forget` of anything leaks, never corrupts).
//! Dropping an [`Engine`] cancels, waits for every completion, then unregisters the buffers and
//! unmaps; if draining fails, the arena is leaked instead of freed. Every `unsafe` block argues
//! its invariant in a `SAFETY:` comment.
//!
//! ## Errors
//! One [`Error`] type: a [`ErrorKind`], a short lower-case message, and the file, offset,
//! length and sample when known, with its cause (an OS error, a CUDA error, the failed read a
//! sample was in) kept whole as `source()`; [`Error::report`] writes the chain. Bad input (a missing or
//! unreadable file, a file that shrinks mid-read, an I/O error) is an error for that read alone;
//! the other reads go on.

#![warn(missing_debug_implementations)]

pub mod batch;
pub mod buf;
pub mod cache;
pub mod config;
pub mod crc32c;
pub mod dataset;
#[cfg(feature = "decode")]
pub mod decode;
pub mod dlpack;
pub mod error;
pub mod gpu;
pub mod image;
pub mod io;
pub mod loader;
pub mod plan;
pub mod progress;
#[cfg(feature = "remote")]
pub mod remote;
mod rng;
mod stats;
pub(crate) mod sys;
pub(crate) mod util;

pub use batch::{Batch, BatchMeta};
pub use config::{EngineConfig, EngineKind};
pub use dataset::Dataset;
pub use error::{Error, ErrorKind, Result};
pub use gpu::{gpu_available, Device, GpuPath};
pub use io::{Completion, Engine, FileId, ReadSpec};
pub use loader::{
    BatchTiming, Epoch, Loader, LoaderStats, MemoryStats, PhaseTable, PhaseTime, StallStats,
};
pub use plan::{LastBatch, Order, PlanConfig};
pub use progress::{set_progress, ProgressEvent, ProgressFn};

/// What the tests, benchmarks, examples and fuzz targets reach that is not the library's
/// promise: the seeded RNG, the size syntax of the command line, the simulated disk, and the
/// CUDA, cuFile, nvJPEG and kernel internals the GPU tests drive one by one. Hidden from the
/// documentation; it changes when they do.
#[doc(hidden)]
pub mod testing {
    pub use crate::rng::Rng;

    /// The seeded simulated disk ([`crate::io::Backend`] with latency, reordering, short reads
    /// and errors; feature `sim`).
    #[cfg(any(test, feature = "sim"))]
    pub mod sim {
        pub use crate::io::sim::*;
    }
    /// A real S3 server on loopback (SeaweedFS's `weed mini`) for the remote tests and the
    /// soak (features `sim` and `remote`).
    #[cfg(all(feature = "remote", any(test, feature = "sim")))]
    pub mod s3 {
        pub use crate::remote::weed::*;
    }
    /// The CUDA driver API as gpufeed wraps it.
    pub mod cuda {
        pub use crate::gpu::cuda::*;
    }
    /// cuFile (GPUDirect Storage).
    pub mod cufile {
        pub use crate::gpu::cufile::*;
    }
    /// The kernels of `kernels/*.cu`: their parameters, compilation and launches.
    pub mod kernels {
        pub use crate::gpu::kernels::*;
    }
    /// The same kernels built for the host (feature `sim`).
    pub mod host_kernels {
        pub use crate::gpu::host_kernels::*;
    }
    /// nvJPEG's batched decoder.
    pub mod nvjpeg {
        pub use crate::gpu::nvjpeg::*;
    }
    pub use crate::gpu::context;
    /// The node cache's eviction policies, replayed over epochs' orders (issue 25).
    pub mod cache_policy {
        pub use crate::cache::policy::*;
    }
    /// The `tf.train.Example` parser (fuzzed on its own).
    pub mod example {
        pub use crate::dataset::example::*;
    }
    /// The few system calls the command's benchmarks make beside the engine's: CPU seconds,
    /// dropping a file's cached pages, the file system's O_DIRECT alignment.
    pub mod sys {
        pub use crate::sys::{fadvise, open_read, process_cpu_seconds, statx_fd, Advice};
    }
    /// The folder `pack` stages a shard in before it is renamed into place.
    pub use crate::dataset::pack::STAGING;
    /// TFRecord framing: the masked crc32c that writers put around lengths and data.
    pub use crate::dataset::tfrecord::masked_crc;
    /// The storage → GPU copy pipeline `gpufeed bench gpu` drives on its own.
    pub use crate::gpu::copy::CopyPipeline;
    /// A notice on stderr, once per text (`GPUFEED_QUIET=1` silences it).
    pub use crate::util::notice;
    /// Generated images for tests and benchmarks (feature `decode`).
    #[cfg(feature = "decode")]
    pub mod synth {
        pub use crate::decode::synth::*;
    }
}

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
