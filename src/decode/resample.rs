//! The transform's arithmetic, pure and on the CPU: torchvision's crop geometry (random
//! resized crop, resize + centre crop), the antialiased bilinear filter Pillow uses (a triangle
//! stretched by the downscale factor, weights normalised per output pixel), and the one fused
//! pass that crops, resizes, flips, normalises, casts and lays out straight into a batch tensor.
//! The GPU stage computes the same geometry here and must match the pass within the tolerance
//! the tests state.

#![forbid(unsafe_code)]

use crate::rng::Rng;

/// A crop of the source image in pixels: left, top, width, height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    /// Left column.
    pub x: u32,
    /// Top row.
    pub y: u32,
    /// Width.
    pub w: u32,
    /// Height.
    pub h: u32,
}

/// What the fused pass makes of one image: the source box that maps onto an output of
/// `full` (width, height) pixels, of which the window at `window_origin` of the output's size
/// is kept (for a centre crop after a resize), and whether it is mirrored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// Source box (left, top, right, bottom), in source pixels.
    pub src: [f64; 4],
    /// Size the source box is resized to (width, height).
    pub full: (u32, u32),
    /// Top-left of the kept window in the resized image (x, y).
    pub window_origin: (u32, u32),
    /// Mirror left–right.
    pub flip: bool,
}

/// A uniform f64 in [lo, hi).
fn uniform(r: &mut Rng, lo: f64, hi: f64) -> f64 {
    lo + (r.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * (hi - lo)
}

/// The generator for one sample's augmentation: a pure function of (seed, epoch, sample id),
/// so the crop and flip do not depend on ranks, threads, the resume point or the device.
pub fn sample_rng(seed: u64, epoch: u64, sample: u64) -> Rng {
    // Each input goes through its own SplitMix round before mixing, so nearby seeds, epochs
    // and ids give unrelated streams.
    let mix = |x: u64, k: u64| Rng::new(x ^ k).next_u64();
    Rng::new(
        mix(seed, 0x6175_676d_656e_7431)
            ^ mix(epoch, 0x6570_6f63_6800_0000).rotate_left(21)
            ^ mix(sample, 0x7361_6d70_6c65_0000).rotate_left(42),
    )
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at an area fraction in `scale` and
/// a log-uniform aspect ratio in `ratio`, then the centre crop clamped to `ratio`.
/// Python rounds half to even, and so does this.
pub fn random_resized_crop(
    r: &mut Rng,
    (width, height): (u32, u32),
    scale: (f64, f64),
    ratio: (f64, f64),
) -> CropBox {
    let area = width as f64 * height as f64;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * uniform(r, scale.0, scale.1);
        let aspect = uniform(r, lr0, lr1).exp();
        let w = (target * aspect).sqrt().round_ties_even();
        let h = (target / aspect).sqrt().round_ties_even();
        if w > 0.0 && w <= width as f64 && h > 0.0 && h <= height as f64 {
            let (w, h) = (w as u32, h as u32);
            let y = r.below((height - h + 1) as u64) as u32;
            let x = r.below((width - w + 1) as u64) as u32;
            return CropBox { x, y, w, h };
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (min_r, max_r) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (w, h) = if in_ratio < min_r {
        (
            width,
            ((width as f64 / min_r).round_ties_even() as u32).max(1),
        )
    } else if in_ratio > max_r {
        (
            ((height as f64 * max_r).round_ties_even() as u32).max(1),
            height,
        )
    } else {
        (width, height)
    };
    CropBox {
        x: (width - w.min(width)) / 2,
        y: (height - h.min(height)) / 2,
        w: w.min(width),
        h: h.min(height),
    }
}

/// The training transform's geometry: a random resized crop to `out`, mirrored with
/// probability `flip_p`.
pub fn train_geometry(
    r: &mut Rng,
    size: (u32, u32),
    out: (u32, u32),
    scale: (f64, f64),
    ratio: (f64, f64),
    flip_p: f64,
) -> Geometry {
    let c = random_resized_crop(r, size, scale, ratio);
    let flip = r.chance(flip_p);
    Geometry {
        src: [
            c.x as f64,
            c.y as f64,
            (c.x + c.w) as f64,
            (c.y + c.h) as f64,
        ],
        full: out,
        window_origin: (0, 0),
        flip,
    }
}

/// The evaluation transform's geometry (torchvision `Resize(resize)` then `CenterCrop(out)`):
/// the shorter side to `resize` (the longer truncated as torchvision does), then the centre
/// window of `out`. An image smaller than the window is padded with zeros by torchvision; here
/// the window is clamped to the resized image and the rest stays zero likewise.
pub fn eval_geometry((width, height): (u32, u32), resize: u32, out: (u32, u32)) -> Geometry {
    let (short, long) = (width.min(height), width.max(height));
    let new_long = (resize as u64 * long as u64 / short as u64).max(1) as u32;
    let (nw, nh) = if width <= height {
        (resize, new_long)
    } else {
        (new_long, resize)
    };
    // torchvision: int(round((h - crop_h) / 2.0)); negative when the crop is larger (padding).
    let origin = |full: u32, o: u32| -> u32 {
        ((full as f64 - o as f64) / 2.0).round_ties_even().max(0.0) as u32
    };
    Geometry {
        src: [0.0, 0.0, width as f64, height as f64],
        full: (nw, nh),
        window_origin: (origin(nw, out.0), origin(nh, out.1)),
        flip: false,
    }
}

/// One axis's filter: for each output pixel, the first source pixel and its weights.
#[derive(Debug, Default)]
pub struct Taps {
    /// First source index per output pixel.
    pub start: Vec<u32>,
    /// Number of weights per output pixel.
    pub len: Vec<u32>,
    /// `taps_max` weights per output pixel (zero-padded).
    pub weights: Vec<f32>,
    /// Stride of `weights`.
    pub taps_max: usize,
}

impl Taps {
    /// Pillow's `precompute_coeffs` for the bilinear (triangle) filter: the box `[in0, in1)`
    /// of an axis of `in_size` pixels onto `out_size` pixels, kept for outputs
    /// `first..first + count`, into this value's buffers (a decode thread keeps one `Plan` and
    /// refills it per image: no allocation once they have grown).
    pub fn fill(
        &mut self,
        in_size: u32,
        in0: f64,
        in1: f64,
        out_size: u32,
        first: u32,
        count: u32,
    ) {
        let scale = (in1 - in0) / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filterscale; // the triangle's support is 1
        let taps_max = (support.ceil() as usize) * 2 + 1;
        self.taps_max = taps_max;
        self.start.clear();
        self.len.clear();
        self.weights.clear();
        self.weights.resize(taps_max * count as usize, 0.0);
        let ss = 1.0 / filterscale;
        let weight = |x: usize, xmin: i64, center: f64| {
            let d = ((x as i64 + xmin) as f64 - center + 0.5) * ss;
            (1.0 - d.abs()).max(0.0)
        };
        for (n, xx) in (first..first + count).enumerate() {
            let center = in0 + (xx as f64 + 0.5) * scale;
            // C casts truncate toward zero, as Pillow's do.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
            let len = (xmax - xmin).clamp(0, taps_max as i64) as usize;
            let sum: f64 = (0..len).map(|x| weight(x, xmin, center)).sum();
            for x in 0..len {
                self.weights[n * taps_max + x] = if sum != 0.0 {
                    (weight(x, xmin, center) / sum) as f32
                } else {
                    0.0
                };
            }
            self.start.push(xmin as u32);
            self.len.push(len as u32);
        }
    }

    /// The source range the taps read.
    pub fn span(&self) -> (u32, u32) {
        let lo = self.start.iter().copied().min().unwrap_or(0);
        let hi = self
            .start
            .iter()
            .zip(&self.len)
            .map(|(s, l)| s + l)
            .max()
            .unwrap_or(0);
        (lo, hi.max(lo))
    }
}

/// The element type of an output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PixelType {
    /// Unnormalised 0–255 pixels (mean/std not applied).
    U8,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single.
    F32,
}

impl PixelType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            PixelType::U8 => 1,
            PixelType::F16 | PixelType::Bf16 => 2,
            PixelType::F32 => 4,
        }
    }
    /// The name Python and the CLI use.
    pub fn as_str(self) -> &'static str {
        match self {
            PixelType::U8 => "uint8",
            PixelType::F16 => "float16",
            PixelType::Bf16 => "bfloat16",
            PixelType::F32 => "float32",
        }
    }
}

/// Where channels go in an output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// [N, 3, H, W] (PyTorch's default).
    Nchw,
    /// [N, H, W, 3] (channels last).
    Nhwc,
}

/// How output values are written: type, layout and per-channel normalisation
/// `(x / 255 − mean) / std` (float types only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Emit {
    /// Element type.
    pub dtype: PixelType,
    /// Layout.
    pub layout: Layout,
    /// Per-channel mean, on the 0–1 scale.
    pub mean: [f32; 3],
    /// Per-channel standard deviation, on the 0–1 scale.
    pub std: [f32; 3],
}

/// Scratch the pass reuses between images (one per decode thread).
#[derive(Debug, Default)]
pub struct Scratch {
    rows: Vec<f32>,
    acc: Vec<f32>,
    line: Vec<f32>,
}

/// A decoded image: packed 8-bit RGB rows, `origin` being where its first pixel sits in the
/// (scaled) image the geometry's box refers to.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// RGB bytes, `stride` per row.
    pub pixels: &'a [u8],
    /// Bytes per row.
    pub stride: usize,
    /// Where `pixels` starts in it (a decoded region).
    pub origin: (u32, u32),
    /// Width and height of `pixels`.
    pub extent: (u32, u32),
}

/// The filter of both axes for one image, and what the pass writes.
#[derive(Debug, Default)]
pub struct Plan {
    /// Horizontal taps.
    pub tx: Taps,
    /// Vertical taps.
    pub ty: Taps,
    /// Mirror left–right.
    pub flip: bool,
    /// Output width and height.
    pub out: (u32, u32),
}

impl Plan {
    /// The plan for a geometry on an image of `size`, keeping an output of `out`, into this
    /// value's buffers.
    pub fn set(&mut self, g: &Geometry, size: (u32, u32), out: (u32, u32)) {
        let cw = out.0.min(g.full.0.saturating_sub(g.window_origin.0));
        let ch = out.1.min(g.full.1.saturating_sub(g.window_origin.1));
        let (o, f) = (g.window_origin, g.full);
        self.tx.fill(size.0, g.src[0], g.src[2], f.0, o.0, cw);
        self.ty.fill(size.1, g.src[1], g.src[3], f.1, o.1, ch);
        self.flip = g.flip;
        self.out = out;
    }
}

/// The fused pass: resample `src` through `plan` and write one sample into `dst` (3 × width ×
/// height elements of `emit.dtype`, little endian). Output pixels the taps do not cover (a
/// window larger than the resized image) are zero.
pub fn resample_into(
    src: &Source<'_>,
    plan: &Plan,
    emit: &Emit,
    scratch: &mut Scratch,
    dst: &mut [u8],
) {
    let Plan { tx, ty, flip, out } = plan;
    let flip = *flip;
    let (ow, oh) = (out.0 as usize, out.1 as usize);
    let cw = tx.start.len();
    let ch = ty.start.len();
    let (y_lo, y_hi) = ty.span();
    let rows = (y_hi - y_lo) as usize;
    // Horizontal pass over the rows the vertical taps need, into f32.
    scratch.rows.resize(rows * cw * 3, 0.0); // every element is written below
    let (ox, oy) = (src.origin.0 as usize, src.origin.1 as usize);
    for r in 0..rows {
        let sy = (y_lo as usize + r)
            .saturating_sub(oy)
            .min(src.extent.1 as usize - 1);
        let line = &src.pixels[sy * src.stride..sy * src.stride + src.extent.0 as usize * 3];
        let dst_row = &mut scratch.rows[r * cw * 3..(r + 1) * cw * 3];
        for x in 0..cw {
            let s = (tx.start[x] as usize).saturating_sub(ox);
            let n = tx.len[x] as usize;
            let w = &tx.weights[x * tx.taps_max..x * tx.taps_max + n];
            let px = &line[s * 3..(s + n) * 3];
            let (mut a, mut b, mut c) = (0.0f32, 0.0f32, 0.0f32);
            for (k, wk) in w.iter().enumerate() {
                a += wk * px[k * 3] as f32;
                b += wk * px[k * 3 + 1] as f32;
                c += wk * px[k * 3 + 2] as f32;
            }
            dst_row[x * 3] = a;
            dst_row[x * 3 + 1] = b;
            dst_row[x * 3 + 2] = c;
        }
    }
    // Every output element is written below unless the window reaches past the resized image;
    // only then do the uncovered ones need zeroing first.
    if cw < ow || ch < oh {
        dst.fill(0);
    }
    scratch.acc.clear();
    scratch.acc.resize(cw * 3, 0.0);
    let scale = [
        1.0 / (255.0 * emit.std[0]),
        1.0 / (255.0 * emit.std[1]),
        1.0 / (255.0 * emit.std[2]),
    ];
    let bias = [
        -emit.mean[0] / emit.std[0],
        -emit.mean[1] / emit.std[1],
        -emit.mean[2] / emit.std[2],
    ];
    let es = emit.dtype.size();
    for y in 0..ch {
        // Vertical pass for output row y.
        let acc = &mut scratch.acc;
        acc.fill(0.0);
        let s = (ty.start[y] - y_lo) as usize;
        for k in 0..ty.len[y] as usize {
            let wk = ty.weights[y * ty.taps_max + k];
            let row = &scratch.rows[(s + k) * cw * 3..(s + k + 1) * cw * 3];
            for (a, v) in acc.iter_mut().zip(row) {
                *a += wk * v;
            }
        }
        // Emit: mirror, normalise, cast, lay out. `line` holds one output row per channel
        // (NCHW) or interleaved (NHWC), as f32 before the cast.
        let line = &mut scratch.line;
        line.resize(cw * 3, 0.0); // every element is written before it is read
        for x in 0..cw {
            let xo = if flip { cw - 1 - x } else { x };
            for c in 0..3 {
                let v = acc[x * 3 + c];
                let v = match emit.dtype {
                    PixelType::U8 => v.clamp(0.0, 255.0).round(),
                    _ => v.clamp(0.0, 255.0) * scale[c] + bias[c],
                };
                match emit.layout {
                    Layout::Nchw => line[c * cw + xo] = v,
                    Layout::Nhwc => line[xo * 3 + c] = v,
                }
            }
        }
        match emit.layout {
            Layout::Nchw => {
                for c in 0..3 {
                    let at = ((c * oh + y) * ow) * es;
                    write_elems(
                        &line[c * cw..(c + 1) * cw],
                        emit.dtype,
                        &mut dst[at..at + cw * es],
                    );
                }
            }
            Layout::Nhwc => {
                let at = (y * ow) * 3 * es;
                write_elems(line, emit.dtype, &mut dst[at..at + cw * 3 * es]);
            }
        }
    }
}

/// Casts `v` into `out` as little-endian elements of `t`.
fn write_elems(v: &[f32], t: PixelType, out: &mut [u8]) {
    match t {
        PixelType::U8 => {
            for (o, x) in out.iter_mut().zip(v) {
                *o = *x as u8;
            }
        }
        PixelType::F32 => {
            for (o, x) in out.chunks_exact_mut(4).zip(v) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        PixelType::F16 => {
            for (o, x) in out.chunks_exact_mut(2).zip(v) {
                o.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
            }
        }
        PixelType::Bf16 => {
            for (o, x) in out.chunks_exact_mut(2).zip(v) {
                o.copy_from_slice(&half::bf16::from_f32(*x).to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_and_stay_inside() {
        for (inn, out) in [(500u32, 224u32), (224, 224), (100, 224), (375, 7)] {
            let mut t = Taps::default();
            t.fill(inn, 0.0, inn as f64, out, 0, out);
            for i in 0..out as usize {
                let s: f32 = t.weights[i * t.taps_max..(i + 1) * t.taps_max].iter().sum();
                assert!((s - 1.0).abs() < 1e-5, "{inn}->{out} at {i}: {s}");
                assert!(t.start[i] + t.len[i] <= inn);
            }
        }
    }

    #[test]
    fn crops_stay_inside_and_follow_the_fallback() {
        let mut r = Rng::new(3);
        for _ in 0..2000 {
            let (w, h) = (1 + r.below(900) as u32, 1 + r.below(900) as u32);
            let c = random_resized_crop(&mut r, (w, h), (0.08, 1.0), (0.75, 4.0 / 3.0));
            assert!(
                c.w >= 1 && c.h >= 1 && c.x + c.w <= w && c.y + c.h <= h,
                "{c:?} in {w}x{h}"
            );
        }
        // A 1000x10 strip never fits the ratio: the centre crop clamped to 4/3.
        let c = random_resized_crop(&mut r, (1000, 10), (0.08, 1.0), (0.75, 4.0 / 3.0));
        assert_eq!(
            c,
            CropBox {
                x: 493,
                y: 0,
                w: 13,
                h: 10
            }
        );
    }

    #[test]
    fn eval_geometry_matches_torchvision() {
        // Resize(256) on 500x375 -> 341x256 (int(256*500/375)), CenterCrop(224) -> origin
        // (round(58.5)=58, round(16.0)=16).
        let g = eval_geometry((500, 375), 256, (224, 224));
        assert_eq!(g.full, (341, 256));
        assert_eq!(g.window_origin, (58, 16));
    }

    #[test]
    fn the_augmentation_stream_is_pinned() {
        let mut r = sample_rng(0, 0, 0);
        let a = r.next_u64();
        let mut again = sample_rng(0, 0, 0);
        assert_eq!(a, again.next_u64());
        assert_ne!(a, sample_rng(0, 0, 1).next_u64());
        assert_ne!(a, sample_rng(0, 1, 0).next_u64());
        assert_ne!(a, sample_rng(1, 0, 0).next_u64());
        // The crops of every saved run depend on this stream: changing it changes them.
        assert_eq!(a, PINNED_FIRST);
    }

    const PINNED_FIRST: u64 = 9711570167395668161;
}
