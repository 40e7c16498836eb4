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

mod jpeg;
mod other;
mod pool;
mod resample;
pub mod synth;

pub use jpeg::{JpegColorspace, JpegError, JpegHeader};

pub use pool::{Element, ImageBatch, ImageEpoch, ImageLoader};
/// The geometry and filter arithmetic, for the GPU stage and for checks.
pub use resample::Geometry;
pub use resample::{Layout, PixelType};

use crate::error::{invalid, Result};
use jpeg::Turbo;
use resample::{Emit, Scratch, Source};

/// ImageNet's per-channel mean (RGB, 0–1 scale), torchvision's default normalisation.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation (RGB, 0–1 scale).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The transform applied before normalisation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transform {
    /// torchvision's `RandomResizedCrop(size, scale, ratio)` then `RandomHorizontalFlip(p)`.
    Train {
        /// Area fraction range (torchvision: (0.08, 1.0)).
        scale: (f64, f64),
        /// Aspect ratio range (torchvision: (3/4, 4/3)).
        ratio: (f64, f64),
        /// Mirror probability (0.5).
        flip_p: f64,
    },
    /// torchvision's `Resize(resize)` (shorter side) then `CenterCrop(size)`.
    Eval {
        /// The shorter side before the crop (256 for 224 outputs by convention).
        resize: u32,
    },
}

/// What a batch of images becomes. Defaults: ImageNet mean/std, `float32`, NCHW, this rank's
/// share of the cores ([`default_decode_threads`]), 2 batches decoded ahead, images above 64 megapixels refused, DCT-domain scaling on.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    /// Output width and height.
    pub size: (u32, u32),
    /// The geometric transform.
    pub transform: Transform,
    /// Per-channel mean (0–1 scale); float types only.
    pub mean: [f32; 3],
    /// Per-channel standard deviation (0–1 scale); float types only.
    pub std: [f32; 3],
    /// Element type.
    pub dtype: PixelType,
    /// Layout.
    pub layout: Layout,
    /// Decode threads (0: [`default_decode_threads`]).
    pub threads: usize,
    /// Batches decoded ahead of the one handed out.
    pub prefetch_batches: usize,
    /// Images with more pixels are refused (a per-sample error) before any allocation.
    pub max_pixels: u64,
    /// Decode at 1/2, 1/4 or 1/8 scale in the DCT domain when the crop is still at least four
    /// times the output then (much less work, within its own stated tolerance: DECISIONS).
    pub dct_scaling: bool,
}

/// `GPUFEED_DECODE_THREADS`, if set: a positive count, or an error naming the variable.
fn decode_threads_env() -> Result<Option<usize>> {
    match std::env::var("GPUFEED_DECODE_THREADS") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(invalid(format!(
                "GPUFEED_DECODE_THREADS={v:?}: expected a count of threads, at least 1"
            ))),
        },
    }
}

/// The decode threads a spec with `threads: 0` gets: `GPUFEED_DECODE_THREADS` if set; else the
/// cores this process may run on (its CPU affinity and cgroup quota, as
/// [`std::thread::available_parallelism`] reads them) shared evenly by the ranks on this node
/// (`LOCAL_WORLD_SIZE`, which `torchrun` sets), at least one. A single process on 2 cores
/// decodes on both (measured: 306 images/s against 187 with one thread, issue 22).
///
/// `OMP_NUM_THREADS` is not read: `torchrun` sets it to 1 for every rank unless told otherwise,
/// which would leave each rank a single decode thread on a node with cores to spare.
pub fn default_decode_threads() -> usize {
    if let Ok(Some(n)) = decode_threads_env() {
        return n;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ranks = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1);
    (cores / ranks).max(1)
}

impl ImageSpec {
    /// The training transform to `size`×`size` with torchvision's defaults.
    pub fn train(size: u32) -> ImageSpec {
        ImageSpec::with_transform(
            size,
            Transform::Train {
                scale: (0.08, 1.0),
                ratio: (3.0 / 4.0, 4.0 / 3.0),
                flip_p: 0.5,
            },
        )
    }

    /// The evaluation transform: the shorter side to `size * 8 / 7` (256 for 224), then the
    /// centre `size`×`size`.
    pub fn eval(size: u32) -> ImageSpec {
        ImageSpec::with_transform(
            size,
            Transform::Eval {
                resize: (size as u64 * 8 / 7) as u32,
            },
        )
    }

    fn with_transform(size: u32, transform: Transform) -> ImageSpec {
        ImageSpec {
            size: (size, size),
            transform,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            dtype: PixelType::F32,
            layout: Layout::Nchw,
            threads: 0,
            prefetch_batches: 2,
            max_pixels: 64 << 20,
            dct_scaling: true,
        }
    }

    /// Sets the element type.
    pub fn dtype(mut self, dtype: PixelType) -> Self {
        self.dtype = dtype;
        self
    }
    /// Sets the layout.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }
    /// Sets the decode threads (0: [`default_decode_threads`]).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }
    /// Sets the normalisation.
    pub fn normalize(mut self, mean: [f32; 3], std: [f32; 3]) -> Self {
        self.mean = mean;
        self.std = std;
        self
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<()> {
        let (w, h) = self.size;
        if w == 0 || h == 0 || w > 16384 || h > 16384 {
            return Err(invalid(format!(
                "image size {w}x{h}: each side must be 1 to 16384"
            )));
        }
        if self.std.iter().any(|s| !(s.is_finite() && *s > 0.0))
            || self.mean.iter().any(|m| !m.is_finite())
        {
            return Err(invalid("normalisation: std must be positive, mean finite"));
        }
        if self.prefetch_batches == 0 {
            return Err(invalid("prefetch_batches must be at least 1"));
        }
        if self.max_pixels == 0 {
            return Err(invalid("max_pixels must be at least 1"));
        }
        if self.threads == 0 {
            decode_threads_env()?;
        }
        match self.transform {
            Transform::Train {
                scale,
                ratio,
                flip_p,
            } => {
                if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                    return Err(invalid(format!(
                        "scale {scale:?}: need 0 < low <= high <= 1"
                    )));
                }
                if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
                    return Err(invalid(format!("ratio {ratio:?}: need 0 < low <= high")));
                }
                if !(0.0..=1.0).contains(&flip_p) {
                    return Err(invalid(format!("flip probability {flip_p} is not in 0..1")));
                }
            }
            Transform::Eval { resize } => {
                if resize == 0 {
                    return Err(invalid("eval resize must be at least 1"));
                }
            }
        }
        Ok(())
    }

    /// Elements per sample (3 × width × height).
    pub fn sample_elems(&self) -> usize {
        3 * self.size.0 as usize * self.size.1 as usize
    }

    /// The decode threads this spec asks for, resolved.
    pub fn thread_count(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            default_decode_threads()
        }
    }

    /// The geometry of a sample of `size` (width, height) in `epoch`.
    pub fn geometry(&self, seed: u64, epoch: u64, sample: u64, size: (u32, u32)) -> Geometry {
        match self.transform {
            Transform::Train {
                scale,
                ratio,
                flip_p,
            } => {
                let mut r = resample::sample_rng(seed, epoch, sample);
                resample::train_geometry(&mut r, size, self.size, scale, ratio, flip_p)
            }
            Transform::Eval { resize } => resample::eval_geometry(size, resize, self.size),
        }
    }

    fn emit(&self) -> Emit {
        Emit {
            dtype: self.dtype,
            layout: self.layout,
            mean: self.mean,
            std: self.std,
        }
    }
}

/// Reads a JPEG's header (dimensions, colour space, subsampling, progressive): only the bytes
/// before the first scan are parsed.
pub fn jpeg_header(data: &[u8]) -> Result<JpegHeader, JpegError> {
    Turbo::decompressor(1000, u64::MAX)?.header(data)
}

/// Decodes whole JPEGs to packed RGB (gray expanded, CMYK converted as Pillow converts it):
/// decode alone, for benchmarks and checks.
pub struct RgbDecoder {
    turbo: Turbo,
    cmyk: Vec<u8>,
}

impl std::fmt::Debug for RgbDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RgbDecoder").finish_non_exhaustive()
    }
}

impl RgbDecoder {
    /// A decoder (one per thread).
    pub fn new() -> Result<RgbDecoder, JpegError> {
        Ok(RgbDecoder {
            turbo: Turbo::decompressor(1000, 1 << 30)?,
            cmyk: Vec::new(),
        })
    }

    /// Decodes `data` (JPEG, PNG or WebP) into `out` (resized to width × height × 3); returns
    /// (width, height).
    pub fn decode(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(u32, u32), JpegError> {
        if matches!(crate::dataset::image::sniff(data), Some("png" | "webp")) {
            return other::decode_rgb(data, 1 << 30, &mut self.cmyk, out).map_err(JpegError::Fatal);
        }
        let h = self.turbo.header(data)?;
        let (w, hh) = (h.width, h.height);
        out.resize(w as usize * hh as usize * 3, 0);
        if h.colorspace.is_cmyk() {
            self.cmyk.resize(w as usize * hh as usize * 4, 0);
            self.turbo
                .decode(data, 1, None, 4, &mut self.cmyk, (w, hh))?;
            cmyk_to_rgb(&self.cmyk, out);
        } else {
            self.turbo.decode(data, 1, None, 3, out, (w, hh))?;
        }
        Ok((w, hh))
    }
}

/// Pillow's CMYK → RGB for a JPEG stored in Adobe's inverted convention (what libjpeg-turbo
/// and Photoshop write): `R = K' − K'·C'/255` with C' = 255 − stored C, K' = stored K.
fn cmyk_to_rgb(cmyk: &[u8], rgb: &mut [u8]) {
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    for (o, i) in rgb.chunks_exact_mut(3).zip(cmyk.chunks_exact(4)) {
        let nk = i[3] as u32;
        for c in 0..3 {
            let v = 255 - i[c] as u32;
            o[c] = nk.saturating_sub(muldiv255(v, nk)).min(255) as u8;
        }
    }
}

/// Decodes single samples exactly as an [`ImageLoader`] does (the same geometry from (seed,
/// epoch, sample id), the same arithmetic): for checks, tests and tools. One per thread.
pub struct SampleDecoder {
    spec: ImageSpec,
    inner: ImageDecoder,
}

impl std::fmt::Debug for SampleDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleDecoder")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl SampleDecoder {
    /// A decoder for `spec`.
    pub fn new(spec: ImageSpec) -> Result<SampleDecoder> {
        spec.validate()?;
        let inner = ImageDecoder::new(&spec).map_err(|e| invalid(e.to_string()))?;
        Ok(SampleDecoder { spec, inner })
    }

    /// Bytes of one decoded sample (3 × width × height elements).
    pub fn sample_bytes(&self) -> usize {
        self.spec.sample_elems() * self.spec.dtype.size()
    }

    /// Decodes `data` as sample `sample` of `epoch` under `seed` into `dst`
    /// ([`sample_bytes`](Self::sample_bytes) long); the error is the reason in a few words.
    pub fn decode(
        &mut self,
        data: &[u8],
        seed: u64,
        epoch: u64,
        sample: u64,
        dst: &mut [u8],
    ) -> Result<(), String> {
        if dst.len() != self.sample_bytes() {
            return Err(format!(
                "the output holds {} bytes, a sample takes {}",
                dst.len(),
                self.sample_bytes()
            ));
        }
        self.inner
            .decode_into(&self.spec, seed, epoch, sample, data, dst)
    }
}

/// One decode thread's state: its TurboJPEG instance and buffers (grown to the largest image
/// seen, given back after one above 16 megapixels, so memory stays flat).
pub(crate) struct ImageDecoder {
    turbo: Turbo,
    pixels: Vec<u8>,
    cmyk: Vec<u8>,
    scratch: Scratch,
    /// The filter of the image being decoded (its buffers reused from image to image).
    plan: resample::Plan,
}

/// The per-sample error for an image whose header declares more than `max` pixels: checked
/// before any buffer is sized from it.
fn check_pixels(w: u32, h: u32, max: u64) -> Result<(), String> {
    let pixels = w as u64 * h as u64;
    if pixels > max {
        return Err(format!(
            "{w}x{h} is {pixels} pixels, above the limit of {max}"
        ));
    }
    Ok(())
}

/// DCT-domain scaling by 1/d is used only when the box is still this many times the output
/// at 1/d.
const DCT_MARGIN: f64 = 4.0;

/// Buffers above this many pixels are freed after use.
const KEEP_PIXELS_MAX: usize = 16 << 20;

impl ImageDecoder {
    pub(crate) fn new(spec: &ImageSpec) -> Result<ImageDecoder, JpegError> {
        Ok(ImageDecoder {
            // A progressive JPEG has a dozen scans; thousands are an attack on the decoder.
            turbo: Turbo::decompressor(1000, spec.max_pixels)?,
            pixels: Vec::new(),
            cmyk: Vec::new(),
            scratch: Scratch::default(),
            plan: resample::Plan::default(),
        })
    }

    /// Decodes `data` (sample `sample` of `epoch`) through `spec` into `dst`, one sample of
    /// the batch tensor. The error is a short reason; the caller adds file and sample.
    pub(crate) fn decode_into(
        &mut self,
        spec: &ImageSpec,
        seed: u64,
        epoch: u64,
        sample: u64,
        data: &[u8],
        dst: &mut [u8],
    ) -> Result<(), String> {
        match crate::dataset::image::sniff(data) {
            Some("jpeg") => {}
            Some("png" | "webp") => return self.decode_other(spec, seed, epoch, sample, data, dst),
            Some(other) => {
                return Err(format!(
                    "{other} images are not decoded (JPEG, PNG and WebP are)"
                ))
            }
            None => {
                return Err(if data.is_empty() {
                    "empty sample, not an image".into()
                } else {
                    "not an image (no JPEG, PNG or WebP signature)".into()
                })
            }
        }
        let h = self.turbo.header(data).map_err(|e| e.to_string())?;
        check_pixels(h.width, h.height, spec.max_pixels)?;
        let g = spec.geometry(seed, epoch, sample, (h.width, h.height));
        // DCT-domain scaling: the largest 1/d that still leaves the box DCT_MARGIN times the
        // output on both axes.
        let (bw, bh) = (g.src[2] - g.src[0], g.src[3] - g.src[1]);
        let (fx, fy) = (bw / g.full.0 as f64, bh / g.full.1 as f64);
        let denom = if spec.dct_scaling {
            [8u32, 4, 2]
                .into_iter()
                .find(|&d| fx / d as f64 >= DCT_MARGIN && fy / d as f64 >= DCT_MARGIN)
                .unwrap_or(1)
        } else {
            1
        };
        let scaled = |v: u32| v.div_ceil(denom);
        let size = (scaled(h.width), scaled(h.height));
        let (kx, ky) = (
            size.0 as f64 / h.width as f64,
            size.1 as f64 / h.height as f64,
        );
        let gs = Geometry {
            src: [g.src[0] * kx, g.src[1] * ky, g.src[2] * kx, g.src[3] * ky],
            ..g
        };
        self.plan.set(&gs, size, spec.size);
        // Decode only the rows and columns the taps read (x on an iMCU boundary).
        let (x0, x1) = self.plan.tx.span();
        let (y0, y1) = self.plan.ty.span();
        if x1 <= x0 || y1 <= y0 {
            return Err("the crop is empty".into());
        }
        let region = self.turbo.region_for((x0, x1), (y0, y1), size, denom);
        let (x0, y0, rw, rh) = region.unwrap_or((0, 0, size.0, size.1));
        let n = rw as usize * rh as usize;
        self.pixels.resize(n * 3, 0);
        let result = if h.colorspace.is_cmyk() {
            self.cmyk.resize(n * 4, 0);
            let r = self
                .turbo
                .decode(data, denom, region, 4, &mut self.cmyk, (rw, rh));
            cmyk_to_rgb(&self.cmyk, &mut self.pixels);
            r
        } else {
            self.turbo
                .decode(data, denom, region, 3, &mut self.pixels, (rw, rh))
        };
        self.resample(
            result.map_err(|e| e.to_string()),
            (x0, y0),
            (rw, rh),
            spec,
            dst,
        )
    }

    /// The fused pass over the decoded pixels (`extent` of them, at `origin` of the image the
    /// plan refers to) into `dst`, then the buffers trimmed; or, after a failed decode, only
    /// the trim.
    fn resample(
        &mut self,
        decoded: Result<(), String>,
        origin: (u32, u32),
        extent: (u32, u32),
        spec: &ImageSpec,
        dst: &mut [u8],
    ) -> Result<(), String> {
        if decoded.is_ok() {
            let src = Source {
                pixels: &self.pixels,
                stride: extent.0 as usize * 3,
                origin,
                extent,
            };
            resample::resample_into(&src, &self.plan, &spec.emit(), &mut self.scratch, dst);
        }
        self.trim();
        decoded
    }

    /// PNG and WebP: decoded whole, then the same pass.
    fn decode_other(
        &mut self,
        spec: &ImageSpec,
        seed: u64,
        epoch: u64,
        sample: u64,
        data: &[u8],
        dst: &mut [u8],
    ) -> Result<(), String> {
        let r = other::decode_rgb(data, spec.max_pixels, &mut self.cmyk, &mut self.pixels);
        let (w, h) = match r {
            Ok(s) => s,
            Err(e) => return self.resample(Err(e), (0, 0), (0, 0), spec, dst),
        };
        let g = spec.geometry(seed, epoch, sample, (w, h));
        self.plan.set(&g, (w, h), spec.size);
        self.resample(Ok(()), (0, 0), (w, h), spec, dst)
    }

    fn trim(&mut self) {
        if self.pixels.capacity() > KEEP_PIXELS_MAX * 3 {
            self.pixels = Vec::new();
        }
        if self.cmyk.capacity() > KEEP_PIXELS_MAX * 4 {
            self.cmyk = Vec::new();
        }
    }
}
