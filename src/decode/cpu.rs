//! The CPU side of the decode stage: libjpeg-turbo (the region a crop needs, at 1/2–1/8 scale
//! when the crop is far larger than the output) and the pure-Rust PNG and WebP decoders, then
//! the fused resample pass; the no-GPU path, and the oracle the device side is held to.

use super::jpeg::{JpegError, JpegHeader, Turbo};
use super::other;
use super::resample::{self, Geometry, Scratch, Source};
use super::spec::check_pixels;
use super::ImageSpec;
use crate::error::{invalid, Result};
use crate::image::{sniff, ImageKind};

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
        if matches!(sniff(data), Some(ImageKind::Png | ImageKind::Webp)) {
            return other::decode_rgb(data, 1 << 30, &mut self.cmyk, out).map_err(JpegError::Fatal);
        }
        let h = self.turbo.header(data)?;
        jpeg_whole(&mut self.turbo, &mut self.cmyk, data, &h, out)
    }
}

/// A JPEG whose header is `h`, decoded whole into `out` as packed RGB (CMYK through `cmyk`).
fn jpeg_whole(
    turbo: &mut Turbo,
    cmyk: &mut Vec<u8>,
    data: &[u8],
    h: &JpegHeader,
    out: &mut Vec<u8>,
) -> Result<(u32, u32), JpegError> {
    let (w, hh) = (h.width, h.height);
    let n = w as usize * hh as usize;
    out.resize(n * 3, 0);
    if h.colorspace.is_cmyk() {
        cmyk.resize(n * 4, 0);
        turbo.decode(data, 1, None, 4, cmyk, (w, hh))?;
        cmyk_to_rgb(cmyk, out);
    } else {
        turbo.decode(data, 1, None, 3, out, (w, hh))?;
    }
    Ok((w, hh))
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

/// Decodes single samples exactly as an [`ImageLoader`](super::ImageLoader) does (the same geometry from (seed,
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

/// What [`ImageDecoder::decode_region`] decoded: the image's size, the decoded region's, and
/// the crop's geometry in the region's pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) image: (u32, u32),
    pub(crate) size: (u32, u32),
    pub(crate) geometry: Geometry,
}

/// What the transform of a JPEG reads ([`ImageDecoder::jpeg_cut`]).
struct JpegCut {
    /// The image's size (its header's).
    full: (u32, u32),
    cmyk: bool,
    denom: u32,
    /// The region to decode (`None`: the whole scaled image)...
    crop: Option<(u32, u32, u32, u32)>,
    /// ... and what that is: x, y, width, height in scaled pixels.
    region: (u32, u32, u32, u32),
    /// The crop's geometry in the scaled image.
    geometry: Geometry,
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
            turbo: Turbo::decompressor(1000, spec.pixels_max)?,
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
        match sniff(data) {
            Some(ImageKind::Jpeg) => {}
            Some(ImageKind::Png | ImageKind::Webp) => {
                return self.decode_other(spec, seed, epoch, sample, data, dst)
            }
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
        let cut = self.jpeg_cut(spec, (seed, epoch, sample), data)?;
        let (x0, y0, rw, rh) = cut.region;
        let n = rw as usize * rh as usize;
        self.pixels.resize(n * 3, 0);
        let mut pixels = std::mem::take(&mut self.pixels);
        let result = self.jpeg_region(data, &cut, &mut pixels);
        self.pixels = pixels;
        self.resample(result, (x0, y0), (rw, rh), spec, dst)
    }

    /// What the transform of JPEG `data` (sample `sample` of `epoch`) reads: its header, the
    /// DCT scale (the largest 1/d that still leaves the crop's box [`DCT_MARGIN`] times the
    /// output on both axes, where the spec allows it), the geometry at that scale, and the
    /// region of the scaled image the filter's taps read (x on an iMCU boundary). The plan is
    /// set for it.
    fn jpeg_cut(
        &mut self,
        spec: &ImageSpec,
        (seed, epoch, sample): (u64, u64, u64),
        data: &[u8],
    ) -> Result<JpegCut, String> {
        let h = self.turbo.header(data).map_err(|e| e.to_string())?;
        check_pixels(h.width, h.height, spec.pixels_max)?;
        let g = spec.geometry(seed, epoch, sample, (h.width, h.height));
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
        let (x0, x1) = self.plan.tx.span();
        let (y0, y1) = self.plan.ty.span();
        if x1 <= x0 || y1 <= y0 {
            return Err("the crop is empty".into());
        }
        let crop = self.turbo.region_for((x0, x1), (y0, y1), size, denom);
        Ok(JpegCut {
            full: (h.width, h.height),
            cmyk: h.colorspace.is_cmyk(),
            denom,
            crop,
            region: crop.unwrap_or((0, 0, size.0, size.1)),
            geometry: gs,
        })
    }

    /// Decodes `cut`'s region of JPEG `data` to packed RGB in `out` (its size).
    fn jpeg_region(&mut self, data: &[u8], cut: &JpegCut, out: &mut [u8]) -> Result<(), String> {
        let (_, _, rw, rh) = cut.region;
        let r = if cut.cmyk {
            self.cmyk.resize(rw as usize * rh as usize * 4, 0);
            let r = self
                .turbo
                .decode(data, cut.denom, cut.crop, 4, &mut self.cmyk, (rw, rh));
            cmyk_to_rgb(&self.cmyk, out);
            r
        } else {
            self.turbo
                .decode(data, cut.denom, cut.crop, 3, out, (rw, rh))
        };
        r.map_err(|e| e.to_string())
    }

    /// Decodes of `data` (sample `sample` of `epoch`) only what the transform of `spec` reads —
    /// a JPEG's region under the crop, DCT-scaled where the spec allows; another image whole —
    /// to packed 8-bit RGB in `out`, and returns the image's size and the geometry of the crop
    /// in the pixels of `out` (`full_size`, `(width, height)` of `out`, the geometry): what the
    /// device path's resize kernel reads for an image the CPU decodes. The error is a short
    /// reason.
    pub(crate) fn decode_region(
        &mut self,
        spec: &ImageSpec,
        (seed, epoch, sample): (u64, u64, u64),
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Region, String> {
        let r = match sniff(data) {
            Some(ImageKind::Jpeg) => {
                self.jpeg_cut(spec, (seed, epoch, sample), data)
                    .and_then(|cut| {
                        let (x0, y0, rw, rh) = cut.region;
                        out.clear();
                        out.resize(rw as usize * rh as usize * 3, 0);
                        self.jpeg_region(data, &cut, out)?;
                        let (x, y) = (f64::from(x0), f64::from(y0));
                        let g = &cut.geometry;
                        Ok(Region {
                            image: cut.full,
                            size: (rw, rh),
                            geometry: Geometry {
                                src: [g.src[0] - x, g.src[1] - y, g.src[2] - x, g.src[3] - y],
                                ..*g
                            },
                        })
                    })
            }
            _ => self.decode_rgb(spec, data, out).map(|size| Region {
                image: size,
                size,
                geometry: spec.geometry(seed, epoch, sample, size),
            }),
        };
        self.trim();
        r
    }

    /// Decodes `data` whole, at full size, to packed 8-bit RGB in `out` (gray expanded, CMYK
    /// converted as Pillow converts it) and returns (width, height): what nvJPEG writes for the
    /// device pipeline (`NVJPEG_OUTPUT_RGBI`), and its stand-in on the simulated device. The
    /// error is a short reason.
    pub(crate) fn decode_rgb(
        &mut self,
        spec: &ImageSpec,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(u32, u32), String> {
        let r = match sniff(data) {
            Some(ImageKind::Jpeg) => self.jpeg_rgb(spec, data, out),
            Some(ImageKind::Png | ImageKind::Webp) => {
                other::decode_rgb(data, spec.pixels_max, &mut self.cmyk, out)
            }
            Some(other) => Err(format!(
                "{other} images are not decoded (JPEG, PNG and WebP are)"
            )),
            None if data.is_empty() => Err("empty sample, not an image".into()),
            None => Err("not an image (no JPEG, PNG or WebP signature)".into()),
        };
        self.trim();
        r
    }

    fn jpeg_rgb(
        &mut self,
        spec: &ImageSpec,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(u32, u32), String> {
        let h = self.turbo.header(data).map_err(|e| e.to_string())?;
        check_pixels(h.width, h.height, spec.pixels_max)?;
        jpeg_whole(&mut self.turbo, &mut self.cmyk, data, &h, out).map_err(|e| e.to_string())
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
        let r = other::decode_rgb(data, spec.pixels_max, &mut self.cmyk, &mut self.pixels);
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
