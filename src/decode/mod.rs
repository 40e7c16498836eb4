//! ⑤ Decode and augment: compressed image samples → one contiguous tensor per batch.
//!
//! [`ImageSpec`] says what a batch of images should become (output size, the training or
//! evaluation transform, normalisation, element type, layout); [`ImageLoader`] wraps a host
//! [`Loader`](crate::Loader) and hands out [`ImageBatch`]es: one tensor plus labels, decoded by
//! a pool of threads while the trainer uses the previous batches. This module owns the
//! transform's spec and its CPU implementation — the no-GPU path, and the oracle the GPU stage
//! is held to.
//!
//! JPEGs are decoded by libjpeg-turbo (only the region a crop needs, at 1/2–1/8 scale when the
//! crop is far larger than the output); PNG and WebP by pure-Rust decoders, whole.
//!
//! Every random parameter (the crop, the flip) is a pure function of (seed, epoch, sample id):
//! a sample gets the same tensor whatever the rank count, the thread count, the resume point.
//! A sample that cannot be decoded (truncated, corrupt, not an image, too large) is zero-filled
//! and its error, naming the file, the sample and the reason, is in [`ImageBatch::errors`];
//! the other samples arrive.
//!
//! ```no_run
//! # fn main() -> gpufeed::Result<()> {
//! use gpufeed::decode::{ImageSpec, PixelType};
//! let loader = gpufeed::Loader::builder(gpufeed::Dataset::open("imagenet/train")?)
//!     .batch_size(256)
//!     .build()?;
//! let images = loader.decode_images(ImageSpec::train(224).dtype(PixelType::F16))?;
//! for batch in images.epoch(0)? {
//!     let batch = batch?;
//!     let x: &[half::f16] = batch.view().expect("f16 tensor"); // [256, 3, 224, 224]
//!     let y = batch.labels();
//!     # let _ = (x, y);
//! }
//! # Ok(())
//! # }
//! ```

mod batch;
mod cpu;
pub(crate) mod device;
mod epoch;
mod jpeg;
mod loader;
mod other;
pub(crate) mod phases;
mod pool;
mod resample;
mod settings;
mod spec;
pub(crate) mod synth;

pub use batch::{Element, ImageBatch};
pub use cpu::{jpeg_header, RgbDecoder, SampleDecoder};
pub use device::{route, Route, RouteCounts};
pub use epoch::ImageEpoch;
pub use jpeg::{JpegColorspace, JpegError, JpegHeader};
pub use loader::ImageLoader;
/// The geometry and filter arithmetic, for the GPU stage and for checks.
pub use resample::Geometry;
pub use resample::{Layout, PixelType};
pub use settings::{ImageSetting, IMAGE_SETTINGS};
pub use spec::{default_decode_threads, ImageSpec, Transform, IMAGENET_MEAN, IMAGENET_STD};

pub(crate) use cpu::ImageDecoder;
