//! What a batch of images becomes: the [`ImageSpec`] both sides of the decode stage (the CPU's
//! and the device's) follow, its defaults and its checks, and the per-sample geometry drawn
//! from (seed, epoch, sample id).

use super::resample::{self, Emit, Geometry, Layout, PixelType};
use crate::error::{invalid, Result};

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

/// What a batch of images becomes. Its defaults, and each setting's name at every door, are
/// [`IMAGE_SETTINGS`](super::IMAGE_SETTINGS): the training transform to 224×224, ImageNet
/// mean/std, `float32`, NCHW, this rank's share of the cores ([`default_decode_threads`]), 2
/// batches decoded ahead, images above 64 megapixels refused, DCT-domain scaling on.
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
    pub pixels_max: u64,
    /// Decode at 1/2, 1/4 or 1/8 scale in the DCT domain when the crop is still at least four
    /// times the output then (much less work, within its own stated tolerance: DECISIONS).
    /// The CPU stage only: the device decodes whole images.
    pub dct_scaling: bool,
    /// Device path: baseline JPEGs go to the GPU's hardware JPEG decoder (nvJPEG) where it has
    /// one; off, every image takes the CPU route (for comparisons).
    pub hardware_decoder: bool,
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
    /// The training transform to `size`×`size` with torchvision's defaults (and every other
    /// setting [`IMAGE_SETTINGS`](super::IMAGE_SETTINGS)' default).
    pub fn train(size: u32) -> ImageSpec {
        ImageSpec {
            size: (size, size),
            ..ImageSpec::default()
        }
    }

    /// The evaluation transform: the shorter side to `size * 8 / 7` (256 for 224), then the
    /// centre `size`×`size`.
    pub fn eval(size: u32) -> ImageSpec {
        ImageSpec {
            size: (size, size),
            transform: Transform::Eval {
                resize: super::settings::eval_resize((size, size)),
            },
            ..ImageSpec::default()
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
        use super::settings::{PREFETCH_BATCHES_MAX, SIDE_MAX, THREADS_MAX};
        let (w, h) = self.size;
        if w == 0 || h == 0 || w > SIDE_MAX || h > SIDE_MAX {
            return Err(invalid(format!(
                "image size {h}x{w} (height x width): each side must be 1 to {SIDE_MAX}"
            )));
        }
        if self.std.iter().any(|s| !(s.is_finite() && *s > 0.0))
            || self.mean.iter().any(|m| !m.is_finite())
        {
            return Err(invalid("normalisation: std must be positive, mean finite"));
        }
        if !(1..=PREFETCH_BATCHES_MAX).contains(&(self.prefetch_batches as u64)) {
            return Err(invalid(format!(
                "prefetch_batches {}: expected 1 to {PREFETCH_BATCHES_MAX}",
                self.prefetch_batches
            )));
        }
        if self.threads as u64 > THREADS_MAX {
            return Err(invalid(format!(
                "threads {}: expected 0 (the default) to {THREADS_MAX}",
                self.threads
            )));
        }
        if self.pixels_max == 0 {
            return Err(invalid(
                "the pixel limit (Python max_pixels=, ImageSpec::pixels_max) must be at least 1",
            ));
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
                check_scale(scale)?;
                check_ratio(ratio)?;
                check_flip_p(flip_p)?;
            }
            Transform::Eval { resize } => {
                if !(1..=SIDE_MAX * 4).contains(&resize) {
                    return Err(invalid(format!(
                        "resize {resize}: expected 1 to {}",
                        SIDE_MAX * 4
                    )));
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

    pub(super) fn emit(&self) -> Emit {
        Emit {
            dtype: self.dtype,
            layout: self.layout,
            mean: self.mean,
            std: self.std,
        }
    }
}

/// The training crop's area fraction range, checked.
pub(super) fn check_scale(scale: (f64, f64)) -> Result<()> {
    if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
        return Err(invalid(format!(
            "scale {scale:?}: need 0 < low <= high <= 1"
        )));
    }
    Ok(())
}

/// The training crop's aspect ratio range, checked.
pub(super) fn check_ratio(ratio: (f64, f64)) -> Result<()> {
    if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
        return Err(invalid(format!("ratio {ratio:?}: need 0 < low <= high")));
    }
    Ok(())
}

/// The mirror probability, checked.
pub(super) fn check_flip_p(p: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        return Err(invalid(format!(
            "flip_p {p}: expected a probability, 0 to 1"
        )));
    }
    Ok(())
}

/// The per-sample error for an image whose header declares more than `max` pixels: checked
/// before any buffer is sized from it.
pub(super) fn check_pixels(w: u32, h: u32, max: u64) -> Result<(), String> {
    let pixels = w as u64 * h as u64;
    if pixels > max {
        return Err(format!(
            "{w}x{h} is {pixels} pixels, above the limit of {max}"
        ));
    }
    Ok(())
}
