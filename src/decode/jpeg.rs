//! libjpeg-turbo through its TurboJPEG 3 API (`gpufeed-jpeg-sys`, which builds the bundled 3.1
//! with the cc crate, and NASM for its SIMD where present): the one place that calls it. Decoding uses the accurate integer IDCT
//! and fancy chroma upsampling — libjpeg-turbo's defaults, and what Pillow's decoder gives, so
//! Pillow is the oracle for both this decoder and the GPU one. Encoding is for generated test
//! and bench sets only.

use std::ffi::{c_int, CStr};

use gpufeed_jpeg_sys as tj;

/// What a JPEG's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The colour space the file stores.
    pub colorspace: JpegColorspace,
    /// Chroma subsampling (`None` when TurboJPEG does not name it, e.g. unusual factors).
    pub subsampling: Option<&'static str>,
    /// Progressive (multi-scan) coding.
    pub progressive: bool,
}

/// The colour space a JPEG stores its pixels in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JpegColorspace {
    /// YCbCr (almost every photo).
    Ycbcr,
    /// RGB without a colour transform.
    Rgb,
    /// One channel.
    Gray,
    /// CMYK (print; Adobe's convention stores it inverted).
    Cmyk,
    /// CMYK stored as YCbCr + K.
    Ycck,
}

impl JpegColorspace {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            JpegColorspace::Ycbcr => "ycbcr",
            JpegColorspace::Rgb => "rgb",
            JpegColorspace::Gray => "gray",
            JpegColorspace::Cmyk => "cmyk",
            JpegColorspace::Ycck => "ycck",
        }
    }
    /// Four channels to convert (CMYK or YCCK).
    pub fn is_cmyk(self) -> bool {
        matches!(self, JpegColorspace::Cmyk | JpegColorspace::Ycck)
    }
}

/// How a decode failed: `Fatal` means no usable image; a `Truncated` file decoded as far as its
/// data went (libjpeg-turbo fills the rest), which Pillow also refuses by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JpegError {
    /// The data is not a JPEG libjpeg-turbo can decode (the message is its own).
    Fatal(String),
    /// The data ended before the image did.
    Truncated,
}

impl std::fmt::Display for JpegError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JpegError::Fatal(m) => write!(f, "libjpeg-turbo: {m}"),
            JpegError::Truncated => f.write_str("truncated JPEG: the data ends before the image"),
        }
    }
}

/// How a generated JPEG is encoded (`synth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// 1 (gray), 3 (RGB → YCbCr) or 4 (CMYK → YCCK).
    pub channels: u32,
    /// Quality, 1–100.
    pub quality: u32,
    /// Chroma subsampling: `"4:4:4"`, `"4:2:2"`, `"4:2:0"`, `"4:4:0"`, `"4:1:1"`.
    pub subsampling: &'static str,
    /// Progressive coding.
    pub progressive: bool,
    /// MCU rows between restart markers (0: none).
    pub restart_rows: u32,
}

/// A TurboJPEG instance (decompressor or compressor); not shared between threads.
///
/// After any failed call the instance is replaced by a fresh one: `tj3DecompressHeader`
/// returns from libjpeg's error jump without aborting the decompressor (turbojpeg.c, 3.1), so
/// the next header read resumes the damaged stream's marker state and reports the damaged
/// image's dimensions for a good one (a JPEG cut inside its headers zeroed the next image).
pub struct Turbo {
    handle: tj::tjhandle,
    kind: tj::TJINIT,
    /// The decompressor's limits, set again on a fresh instance.
    limits: Option<(u32, u64)>,
    /// A replacement could not be made (out of memory): made before the next call instead.
    stale: bool,
}

// SAFETY: a TurboJPEG handle has no thread affinity; it is only used through `&mut self`, so
// one thread at a time.
unsafe impl Send for Turbo {}

impl Drop for Turbo {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once, here.
        unsafe { tj::tj3Destroy(self.handle) }
    }
}

impl Turbo {
    fn init(kind: tj::TJINIT, limits: Option<(u32, u64)>) -> Result<Turbo, JpegError> {
        // SAFETY: tj3Init has no preconditions; a null handle is checked.
        let handle = unsafe { tj::tj3Init(kind as c_int) };
        if handle.is_null() {
            return Err(JpegError::Fatal("tj3Init failed (out of memory?)".into()));
        }
        let mut t = Turbo {
            handle,
            kind,
            limits,
            stale: false,
        };
        if let Some((scan_limit, pixels_max)) = limits {
            t.set(
                tj::TJPARAM_TJPARAM_SCANLIMIT,
                scan_limit.min(i32::MAX as u32) as c_int,
            )?;
            t.set(
                tj::TJPARAM_TJPARAM_MAXPIXELS,
                pixels_max.min(i32::MAX as u64) as c_int,
            )?;
        }
        Ok(t)
    }

    /// A decompressor. `scan_limit` caps progressive scans (a crafted file can have thousands,
    /// each a pass over the image); `pixels_max` refuses larger images before any allocation.
    pub fn decompressor(scan_limit: u32, pixels_max: u64) -> Result<Turbo, JpegError> {
        Turbo::init(tj::TJINIT_TJINIT_DECOMPRESS, Some((scan_limit, pixels_max)))
    }

    /// A compressor.
    pub fn compressor() -> Result<Turbo, JpegError> {
        Turbo::init(tj::TJINIT_TJINIT_COMPRESS, None)
    }

    /// Replaces the instance by a fresh one with the same limits (after a failed call, whose
    /// state the next image must not inherit). If none can be made now, the next call tries
    /// again and fails until one is made.
    fn renew(&mut self) {
        match Turbo::init(self.kind, self.limits) {
            Ok(fresh) => *self = fresh,
            Err(_) => self.stale = true,
        }
    }

    /// Runs `call` on a ready instance (a fresh one if the last renewal could not make one)
    /// and renews the instance if it fails, so that no state of a failed call reaches the next.
    fn guarded<T>(
        &mut self,
        call: impl FnOnce(&mut Turbo) -> Result<T, JpegError>,
    ) -> Result<T, JpegError> {
        if self.stale {
            *self = Turbo::init(self.kind, self.limits)?;
        }
        let r = call(self);
        if r.is_err() {
            self.renew();
        }
        r
    }

    fn error(&mut self) -> (bool, String) {
        // SAFETY: the handle is live; the string is owned by the handle and copied at once.
        let (code, msg) = unsafe {
            (
                tj::tj3GetErrorCode(self.handle),
                CStr::from_ptr(tj::tj3GetErrorStr(self.handle))
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        (code == tj::TJERR_TJERR_WARNING as c_int, msg)
    }

    fn set(&mut self, param: tj::TJPARAM, value: c_int) -> Result<(), JpegError> {
        // SAFETY: the handle is live; tj3Set checks the parameter and value.
        if unsafe { tj::tj3Set(self.handle, param as c_int, value) } != 0 {
            return Err(JpegError::Fatal(self.error().1));
        }
        Ok(())
    }

    fn get(&mut self, param: tj::TJPARAM) -> c_int {
        // SAFETY: the handle is live; an unknown parameter gives -1.
        unsafe { tj::tj3Get(self.handle, param as c_int) }
    }

    /// Reads the header: only the bytes before the first scan are parsed.
    pub fn header(&mut self, data: &[u8]) -> Result<JpegHeader, JpegError> {
        self.guarded(|t| t.header_once(data))
    }

    fn header_once(&mut self, data: &[u8]) -> Result<JpegHeader, JpegError> {
        // TurboJPEG accepts a stream of tables only and then reports the previous image's
        // dimensions: a frame header must be there.
        let (fw, fh) = crate::image::info(data)
            .filter(|i| i.kind == crate::image::ImageKind::Jpeg)
            .map(|i| (i.width, i.height))
            .ok_or_else(|| {
                JpegError::Fatal("no frame header before the scan: not a JPEG image".into())
            })?;
        // SAFETY: the pointer and length describe `data`, which outlives the call.
        let rc = unsafe { tj::tj3DecompressHeader(self.handle, data.as_ptr(), data.len() as _) };
        if rc != 0 {
            // A warning is not a failure here, as in the decode (third trial: stray bytes
            // before the scan's marker, which Pillow and libjpeg decode, were refused with
            // "Corrupt JPEG data: 3 extraneous bytes before marker 0xda"); data that ends
            // inside the header is truncated.
            let (warning, msg) = self.error();
            if !warning {
                return Err(JpegError::Fatal(msg));
            }
            if msg.contains("Premature end") {
                return Err(JpegError::Truncated);
            }
        }
        let width = self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width <= 0 || height <= 0 || (width as u32, height as u32) != (fw, fh) {
            return Err(JpegError::Fatal(format!("bad dimensions {width}x{height}")));
        }
        let colorspace = match self.get(tj::TJPARAM_TJPARAM_COLORSPACE) as u32 {
            tj::TJCS_TJCS_RGB => JpegColorspace::Rgb,
            tj::TJCS_TJCS_GRAY => JpegColorspace::Gray,
            tj::TJCS_TJCS_CMYK => JpegColorspace::Cmyk,
            tj::TJCS_TJCS_YCCK => JpegColorspace::Ycck,
            _ => JpegColorspace::Ycbcr,
        };
        let subsampling = match self.get(tj::TJPARAM_TJPARAM_SUBSAMP) {
            x if x == tj::TJSAMP_TJSAMP_444 => Some("4:4:4"),
            x if x == tj::TJSAMP_TJSAMP_422 => Some("4:2:2"),
            x if x == tj::TJSAMP_TJSAMP_420 => Some("4:2:0"),
            x if x == tj::TJSAMP_TJSAMP_GRAY => Some("gray"),
            x if x == tj::TJSAMP_TJSAMP_440 => Some("4:4:0"),
            x if x == tj::TJSAMP_TJSAMP_411 => Some("4:1:1"),
            x if x == tj::TJSAMP_TJSAMP_441 => Some("4:4:1"),
            _ => None,
        };
        Ok(JpegHeader {
            width: width as u32,
            height: height as u32,
            colorspace,
            subsampling,
            progressive: self.get(tj::TJPARAM_TJPARAM_PROGRESSIVE) == 1,
        })
    }

    /// The width and height in pixels of an iMCU at full scale, for the header last read.
    pub fn mcu_size(&mut self) -> (u32, u32) {
        match self.get(tj::TJPARAM_TJPARAM_SUBSAMP) {
            x if x == tj::TJSAMP_TJSAMP_420 => (16, 16),
            x if x == tj::TJSAMP_TJSAMP_422 => (16, 8),
            x if x == tj::TJSAMP_TJSAMP_440 => (8, 16),
            x if x == tj::TJSAMP_TJSAMP_411 => (32, 8),
            x if x == tj::TJSAMP_TJSAMP_441 => (8, 32),
            _ => (8, 8),
        }
    }

    /// The region to decode so that the pixels in `x0..x1` × `y0..y1` of an image of `size`
    /// (scaled by 1/`denom`) come out exactly as a whole-image decode gives them: the left edge
    /// on an iMCU boundary (TurboJPEG's rule) and one iMCU of margin on every side, because
    /// fancy upsampling at a region's edge sees the edge, not the neighbouring chroma rows.
    /// `None` when that is the whole image.
    pub fn region_for(
        &mut self,
        (x0, x1): (u32, u32),
        (y0, y1): (u32, u32),
        size: (u32, u32),
        denom: u32,
    ) -> Option<(u32, u32, u32, u32)> {
        let (mw, mh) = self.mcu_size();
        let (mw, mh) = ((mw / denom).max(1), (mh / denom).max(1));
        let left = x0.saturating_sub(mw) / mw * mw;
        let right = (x1 + mw).min(size.0);
        let top = y0.saturating_sub(mh);
        let bottom = (y1 + mh).min(size.1);
        let r = (left, top, right - left, bottom - top);
        (r != (0, 0, size.0, size.1)).then_some(r)
    }

    /// Decodes `data` at `denom` (1, 2, 4 or 8: the IDCT scales by 1/denom) into `out` as
    /// packed 8-bit pixels of `channels` (3: RGB, gray expanded; 4: CMYK as stored), the rows
    /// `crop` names: `(x, y, w, h)` in scaled pixels with `x` on an iMCU boundary, or the whole
    /// image. `(w, h)` must be what that gives (the crop's size, or the scaled image's) and
    /// `out` must hold `w * h * channels` bytes; both are checked against `data`'s own header.
    /// A file that does not reach its end-of-image marker is `Truncated`, whatever part of it
    /// the decode read; other warnings (e.g. extraneous bytes before a marker, common in real
    /// datasets) are ignored, as Pillow does.
    pub fn decode(
        &mut self,
        data: &[u8],
        denom: u32,
        crop: Option<(u32, u32, u32, u32)>,
        channels: u32,
        out: &mut [u8],
        size: (u32, u32),
    ) -> Result<(), JpegError> {
        self.guarded(|t| t.decode_once(data, denom, crop, channels, out, size))
    }

    fn decode_once(
        &mut self,
        data: &[u8],
        denom: u32,
        crop: Option<(u32, u32, u32, u32)>,
        channels: u32,
        out: &mut [u8],
        (w, h): (u32, u32),
    ) -> Result<(), JpegError> {
        // What TurboJPEG will write is decided by `data`'s header, the scaling factor and the
        // crop: read the header here (a few microseconds) so the size checked below is the
        // size written, whatever header the caller read before.
        let hd = self.header_once(data)?;
        if !matches!(denom, 1 | 2 | 4 | 8) || !matches!(channels, 3 | 4) {
            return Err(JpegError::Fatal(format!(
                "scale 1/{denom} or {channels} channels is not supported"
            )));
        }
        let scaled = (hd.width.div_ceil(denom), hd.height.div_ceil(denom));
        let expected = match crop {
            Some((x, y, cw, ch)) => {
                if x as u64 + cw as u64 > scaled.0 as u64 || y as u64 + ch as u64 > scaled.1 as u64
                {
                    return Err(JpegError::Fatal("the crop reaches past the image".into()));
                }
                (cw, ch)
            }
            None => scaled,
        };
        if (w, h) != expected {
            return Err(JpegError::Fatal(format!(
                "output size {w}x{h} is not the {}x{} this decode gives",
                expected.0, expected.1
            )));
        }
        let sf = tj::tjscalingfactor {
            num: 1,
            denom: denom as c_int,
        };
        // SAFETY: the handle is live; the factor is one TurboJPEG lists (1/1, 1/2, 1/4, 1/8).
        if unsafe { tj::tj3SetScalingFactor(self.handle, sf) } != 0 {
            return Err(JpegError::Fatal(self.error().1));
        }
        let region = match crop {
            Some((x, y, cw, ch)) => tj::tjregion {
                x: x as c_int,
                y: y as c_int,
                w: cw as c_int,
                h: ch as c_int,
            },
            None => tj::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            },
        };
        // SAFETY: the handle is live and a header was read; TurboJPEG validates the region.
        if unsafe { tj::tj3SetCroppingRegion(self.handle, region) } != 0 {
            return Err(JpegError::Fatal(self.error().1));
        }
        let format = if channels == 4 {
            tj::TJPF_TJPF_CMYK
        } else {
            tj::TJPF_TJPF_RGB
        };
        let pitch = w as usize * channels as usize;
        if out.len() < pitch * h as usize {
            return Err(JpegError::Fatal("output buffer too small".into()));
        }
        // SAFETY: `data` is read for its length. TurboJPEG writes `h` rows of `w` pixels of
        // `channels` bytes at `pitch`: `(w, h)` was checked above to be the scaled size of
        // `data`'s own header (TJSCALED rounds up, as `div_ceil`), or the cropping region's
        // size, which TurboJPEG outputs exactly (it refuses an x off the iMCU grid rather than
        // widening the region); `out` holds `pitch * h` bytes (checked).
        let rc = unsafe {
            tj::tj3Decompress8(
                self.handle,
                data.as_ptr(),
                data.len() as _,
                out.as_mut_ptr(),
                pitch as c_int,
                format,
            )
        };
        if rc != 0 {
            let (warning, msg) = self.error();
            if !warning {
                return Err(JpegError::Fatal(msg));
            }
            if msg.contains("Premature end") {
                return Err(JpegError::Truncated);
            }
        }
        // libjpeg-turbo says only its first warning (a benign one — extraneous bytes before a
        // marker — hides a later "Premature end"), and a cropped decode stops reading at the
        // crop's last row: a file cut after that, or at a progressive scan's boundary, decodes
        // with no word of it. Whether the data reaches its end decides, whatever was read.
        if !crate::image::jpeg_is_whole(data) {
            return Err(JpegError::Truncated);
        }
        Ok(())
    }

    /// Encodes packed 8-bit `pixels` of `size` as `o` says.
    pub fn encode(
        &mut self,
        pixels: &[u8],
        (w, h): (u32, u32),
        o: &EncodeOptions,
    ) -> Result<Vec<u8>, JpegError> {
        let EncodeOptions {
            channels,
            quality,
            subsampling,
            progressive,
            restart_rows,
        } = *o;
        let samp = match (channels, subsampling) {
            (1, _) => tj::TJSAMP_TJSAMP_GRAY,
            (_, "4:4:4") => tj::TJSAMP_TJSAMP_444,
            (_, "4:2:2") => tj::TJSAMP_TJSAMP_422,
            (_, "4:4:0") => tj::TJSAMP_TJSAMP_440,
            (_, "4:1:1") => tj::TJSAMP_TJSAMP_411,
            _ => tj::TJSAMP_TJSAMP_420,
        };
        let format = match channels {
            1 => tj::TJPF_TJPF_GRAY,
            4 => tj::TJPF_TJPF_CMYK,
            _ => tj::TJPF_TJPF_RGB,
        };
        let need = w as usize * h as usize * channels as usize;
        if pixels.len() < need {
            return Err(JpegError::Fatal("too few pixels for the size".into()));
        }
        self.set(tj::TJPARAM_TJPARAM_QUALITY, quality as c_int)?;
        self.set(tj::TJPARAM_TJPARAM_SUBSAMP, samp)?;
        self.set(tj::TJPARAM_TJPARAM_PROGRESSIVE, progressive as c_int)?;
        self.set(tj::TJPARAM_TJPARAM_RESTARTROWS, restart_rows as c_int)?;
        if channels == 4 {
            self.set(tj::TJPARAM_TJPARAM_COLORSPACE, tj::TJCS_TJCS_YCCK as c_int)?;
        }
        let mut buf: *mut u8 = std::ptr::null_mut();
        let mut size: tj::size_t = 0;
        // SAFETY: `pixels` holds `w * h * channels` bytes (checked); TurboJPEG allocates the
        // output (buf null, size 0) and we free it with tj3Free below, after copying it.
        let rc = unsafe {
            tj::tj3Compress8(
                self.handle,
                pixels.as_ptr(),
                w as c_int,
                0,
                h as c_int,
                format,
                &mut buf,
                &mut size,
            )
        };
        let out = if rc == 0 && !buf.is_null() {
            // SAFETY: on success `buf` holds `size` bytes TurboJPEG wrote.
            Ok(unsafe { std::slice::from_raw_parts(buf, size as usize) }.to_vec())
        } else {
            Err(JpegError::Fatal(self.error().1))
        };
        // SAFETY: `buf` is null or TurboJPEG's allocation, freed once.
        unsafe { tj::tj3Free(buf.cast()) };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding a region gives the same pixels as the whole image there.
    #[test]
    fn a_region_decodes_as_the_whole_image_does() {
        let (px, size) = crate::decode::synth::pixels(1, 1, 3);
        for (samp, denom) in [
            ("4:2:0", 1),
            ("4:2:2", 1),
            ("4:4:4", 1),
            ("4:2:0", 2),
            ("4:2:2", 4),
        ] {
            let mut c = Turbo::compressor().unwrap();
            let o = EncodeOptions {
                channels: 3,
                quality: 90,
                subsampling: samp,
                progressive: false,
                restart_rows: 0,
            };
            let j = c.encode(&px, size, &o).unwrap();
            let mut d = Turbo::decompressor(100, 1 << 30).unwrap();
            let h = d.header(&j).unwrap();
            let h = JpegHeader {
                width: h.width.div_ceil(denom),
                height: h.height.div_ceil(denom),
                ..h
            };
            let mut full = vec![0u8; (h.width * h.height * 3) as usize];
            d.decode(&j, denom, None, 3, &mut full, (h.width, h.height))
                .unwrap();
            let (nx, ny, nw, nh) = (37 / denom, 41 / denom, 101 / denom, 77 / denom);
            d.header(&j).unwrap();
            let (x, y, w, hh) = d
                .region_for((nx, nx + nw), (ny, ny + nh), (h.width, h.height), denom)
                .unwrap();
            let mut part = vec![0u8; (w * hh * 3) as usize];
            d.decode(&j, denom, Some((x, y, w, hh)), 3, &mut part, (w, hh))
                .unwrap();
            let mut worst = (0, 0, 0);
            for r in ny..ny + nh {
                for c in nx * 3..(nx + nw) * 3 {
                    let a = full[(r * h.width * 3 + c) as usize] as i32;
                    let b = part[((r - y) * w * 3 + c - x * 3) as usize] as i32;
                    if (a - b).abs() > worst.0 {
                        worst = ((a - b).abs(), r, c / 3);
                    }
                }
            }
            assert_eq!(
                worst.0, 0,
                "{samp} 1/{denom}: region differs by {} at row {} col {}",
                worst.0, worst.1, worst.2
            );
        }
    }

    /// A failed header read or decode leaves nothing behind: the next image on the same
    /// decompressor reads and decodes as on a fresh one (before the instance was renewed, a
    /// JPEG cut inside its headers made the next header read report the cut image's size).
    #[test]
    fn a_failed_call_leaves_no_state_for_the_next_image() {
        let enc = |seed, samp: &'static str| {
            let (px, size) = crate::decode::synth::pixels(seed, seed, 3);
            let o = EncodeOptions {
                channels: 3,
                quality: 90,
                subsampling: samp,
                progressive: false,
                restart_rows: 0,
            };
            Turbo::compressor().unwrap().encode(&px, size, &o).unwrap()
        };
        let (bad, good) = (enc(1, "4:2:0"), enc(2, "4:4:4"));
        let mut fresh = Turbo::decompressor(100, 1 << 30).unwrap();
        let h = fresh.header(&good).unwrap();
        let mut want = vec![0u8; (h.width * h.height * 3) as usize];
        fresh
            .decode(&good, 1, None, 3, &mut want, (h.width, h.height))
            .unwrap();
        let mut d = Turbo::decompressor(100, 1 << 30).unwrap();
        let mut got = vec![0u8; want.len()];
        let mut tmp = vec![0u8; 1 << 22];
        let mut failed = 0;
        for cut in (2..bad.len().min(2000)).step_by(25) {
            let cut_image = &bad[..cut];
            let r = d.header(cut_image).and_then(|bh| {
                let n = (bh.width * bh.height * 3) as usize;
                d.decode(cut_image, 1, None, 3, &mut tmp[..n], (bh.width, bh.height))
            });
            failed += usize::from(r.is_err());
            assert_eq!(d.header(&good).as_ref(), Ok(&h), "after a cut at {cut}");
            got.fill(0);
            d.decode(&good, 1, None, 3, &mut got, (h.width, h.height))
                .unwrap_or_else(|e| panic!("after a cut at {cut}: {e}"));
            assert!(
                got == want,
                "the image after a cut at {cut} decodes differently"
            );
        }
        assert!(failed > 0);
    }
}
