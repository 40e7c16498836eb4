//! What gpufeed knows of image formats, in one place for the dataset (records, `verify`,
//! `inspect`) and the decode stage (routing a sample to its decoder): the kind a sample's
//! first bytes show ([`sniff`]) or its name claims ([`kind_of_extension`]), its header
//! ([`info`], the 16-byte record of shard format version 2), and a structural check without
//! decoding ([`check`]: the magic bytes, a header that parses, the end marker — JPEG EOI, PNG
//! IEND, RIFF size), so a truncated JPEG, an HTML page saved as `.jpg` or an empty file is
//! found by `gpufeed verify` before training is. Nothing here allocates; every offset is
//! checked.

#![forbid(unsafe_code)]

/// The image kind a file extension claims (lower case, without the dot).
pub fn kind_of_extension(ext: &str) -> Option<ImageKind> {
    Some(match ext {
        "jpg" | "jpeg" => ImageKind::Jpeg,
        "png" => ImageKind::Png,
        "webp" => ImageKind::Webp,
        "bmp" => ImageKind::Bmp,
        "ppm" | "pgm" => ImageKind::Pnm,
        "tif" | "tiff" => ImageKind::Tiff,
        _ => return None,
    })
}

/// The image kind the first bytes show, if any (never `None` or `Other` inside the option).
pub fn sniff(b: &[u8]) -> Option<ImageKind> {
    if b.starts_with(&[0xff, 0xd8, 0xff]) {
        Some(ImageKind::Jpeg)
    } else if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(ImageKind::Png)
    } else if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        Some(ImageKind::Webp)
    } else if b.starts_with(b"BM") {
        Some(ImageKind::Bmp)
    } else if b.starts_with(b"P5") || b.starts_with(b"P6") {
        Some(ImageKind::Pnm)
    } else if b.starts_with(b"II*\0") || b.starts_with(b"MM\0*") {
        Some(ImageKind::Tiff)
    } else {
        None
    }
}

/// Checks `b` as an image of `kind` (from [`kind_of_extension`] or [`sniff`]); the error says
/// what is wrong in a few words.
pub fn check(b: &[u8], kind: ImageKind) -> Result<(), String> {
    if b.is_empty() {
        return Err("empty file, not an image".into());
    }
    let found = sniff(b);
    if found != Some(kind) {
        let head: String = b
            .iter()
            .take(16)
            .map(|&c| {
                if c.is_ascii_graphic() || c == b' ' {
                    c as char
                } else {
                    '.'
                }
            })
            .collect();
        return Err(match found {
            Some(other) => format!("named {kind} but holds {other}"),
            None => format!("not a {kind} file: it starts with {head:?}"),
        });
    }
    match kind {
        ImageKind::Jpeg => jpeg(b),
        ImageKind::Png => png(b),
        ImageKind::Webp => webp(b),
        ImageKind::Bmp => bmp(b),
        _ => Ok(()), // the magic is all we check for the rarer kinds
    }
}

/// The next marker between a JPEG's segments at or after `at`: where its `ff` is and its code.
/// As libjpeg reads them: stray bytes before it are passed over (libjpeg warns "extraneous
/// bytes before marker", and decodes; so does Pillow), as are fill bytes (`ff ff`) and a
/// stuffed `ff 00`. `None`: no marker before the end.
fn next_marker(b: &[u8], mut at: usize) -> Option<(usize, u8)> {
    loop {
        at += memchr::memchr(0xff, b.get(at..)?)?;
        while b.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        match *b.get(at + 1)? {
            0 => at += 2,
            m => return Some((at, m)),
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?) as usize)
}

fn jpeg(b: &[u8]) -> Result<(), String> {
    // Segments from after SOI up to the start of scan; a frame header (SOFn) must come first.
    let mut at = 2;
    let mut frame = false;
    loop {
        let Some((k, m)) = next_marker(b, at) else {
            return Err(format!("truncated or corrupt JPEG: no marker at byte {at}"));
        };
        at = k + 2;
        match m {
            0xd8 | 0x01 | 0xd0..=0xd7 => continue, // no length
            0xd9 => return Err("JPEG ends before its image data".into()),
            _ => {}
        }
        let Some(len) = be16(b, at).filter(|&l| l >= 2) else {
            return Err(format!("truncated JPEG: segment 0x{m:02x} at byte {at}"));
        };
        if at + len > b.len() {
            return Err(format!(
                "truncated JPEG: segment 0x{m:02x} of {len} bytes runs past the end"
            ));
        }
        let is_sof = matches!(m, 0xc0..=0xcf) && !matches!(m, 0xc4 | 0xc8 | 0xcc);
        if is_sof {
            // precision(1) height(2) width(2) components(1)
            let (h, w) = (be16(b, at + 3), be16(b, at + 5));
            match (h, w, b.get(at + 7)) {
                // T.81 B.2.2: the length is 8 + 3 × the components (libjpeg refuses others).
                (Some(h), Some(w), Some(&c)) if w > 0 && c > 0 && len == 8 + 3 * c as usize => {
                    let _ = h; // 0 is allowed (defined later by DNL)
                    frame = true;
                }
                _ => {
                    return Err(
                        "JPEG frame header with no width or components, or a length that \
                         disagrees with its component count"
                            .into(),
                    )
                }
            }
        }
        if m == 0xda {
            if !frame {
                return Err("JPEG scan before any frame header".into());
            }
            return if jpeg_reaches_eoi(b, at + len) {
                Ok(())
            } else {
                Err("truncated JPEG: its scans do not reach an end-of-image marker".into())
            };
        }
        at += len;
    }
}

/// Whether a JPEG whose first scan's entropy-coded data starts at `at` goes on to its
/// end-of-image marker: through that data (where `ff` is stuffed `ff 00`, a restart marker or
/// fill), then every segment between scans skipped by its length (a Huffman or quantisation
/// table may hold the bytes `ff d9`), then any later scan, up to `ff d9`. A file cut anywhere
/// after its first scan began — a progressive one at a scan boundary, a baseline one mid-scan —
/// does not, whatever part of it a decoder read (a cropped decode may stop before the cut, and
/// libjpeg-turbo says only its first warning).
pub fn jpeg_reaches_eoi(b: &[u8], at: usize) -> bool {
    reaches_eoi(b, at, true)
}

/// [`jpeg_reaches_eoi`] from `at`, where `scanned` says whether a scan has begun (an end
/// before any scan is not an image's).
fn reaches_eoi(b: &[u8], mut at: usize, mut scanned: bool) -> bool {
    loop {
        // Entropy-coded data (or stray bytes, which libjpeg skips too) up to the next marker:
        // an `ff` that is not stuffing, a restart marker or fill.
        let Some(k) = b.get(at..).and_then(|d| memchr::memchr(0xff, d)) else {
            return false;
        };
        at += k + 1;
        match b.get(at) {
            None => return false,
            Some(0xd9) => return scanned,
            Some(0x00 | 0x01 | 0xd0..=0xd8 | 0xff) => {} // no length; 0xff: fill, read again
            // A scan's header is followed by its data, any other segment by a marker: both
            // are searched for from the segment's end.
            Some(&m) => {
                let Some(len) = be16(b, at + 1).filter(|&l| l >= 2) else {
                    return false;
                };
                scanned |= m == 0xda;
                at += 1 + len;
            }
        }
    }
}

/// Whether a JPEG holds its whole image: from its start-of-image marker, through its segments
/// (skipped by their lengths) and scans, it reaches its end-of-image marker after a scan
/// ([`jpeg_reaches_eoi`]); stray bytes between segments are passed over, as libjpeg-turbo
/// passes them (with a warning). Every decode of a JPEG asks, after the decoder is done with
/// it, so that a cut file is refused whatever the decoder read of it.
pub fn jpeg_is_whole(b: &[u8]) -> bool {
    b.starts_with(&[0xff, 0xd8]) && reaches_eoi(b, 2, false)
}

fn png(b: &[u8]) -> Result<(), String> {
    // IHDR first: length 13, width and height above zero.
    let ihdr = b.get(8..33).ok_or("truncated PNG: no IHDR")?;
    if &ihdr[4..8] != b"IHDR" || ihdr[..4] != [0, 0, 0, 13] {
        return Err("PNG without an IHDR chunk first".into());
    }
    let dim = |i: usize| u32::from_be_bytes(ihdr[i..i + 4].try_into().expect("4 bytes"));
    if dim(8) == 0 || dim(12) == 0 {
        return Err("PNG of zero width or height".into());
    }
    // The chunks must reach an IEND.
    let mut at = 8usize;
    loop {
        let Some(len) = b.get(at..at + 4) else {
            return Err("truncated PNG: no IEND chunk".into());
        };
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let Some(kind) = b.get(at + 4..at + 8) else {
            return Err("truncated PNG: no IEND chunk".into());
        };
        if kind == b"IEND" {
            return Ok(());
        }
        at = at
            .checked_add(12)
            .and_then(|x| x.checked_add(len))
            .filter(|&x| x <= b.len())
            .ok_or("truncated PNG: a chunk runs past the end")?;
    }
}

fn le32(b: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as u64)
}

fn le16(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as u64)
}

fn webp(b: &[u8]) -> Result<(), String> {
    let riff = le32(b, 4).expect("sniffed: 12 bytes at least") as usize;
    // The RIFF size counts from byte 8; a writer may pad to an even length.
    let end = riff
        .checked_add(8)
        .filter(|&e| e <= b.len())
        .ok_or_else(|| {
            format!(
                "truncated WebP: RIFF says {} bytes, the file has {}",
                riff as u64 + 8,
                b.len()
            )
        })?;
    // Its chunks, each inside the RIFF: at least one holds an image (a VP8 frame header, a
    // VP8L signature, or an animation frame).
    let mut at = 12;
    while at + 8 <= end {
        let (id, len) = (&b[at..at + 4], le32(b, at + 4).expect("inside") as usize);
        let data = at + 8;
        let Some(stop) = data.checked_add(len).filter(|&s| s <= end) else {
            return Err(format!(
                "truncated WebP: chunk {:?} of {len} bytes runs past the RIFF",
                String::from_utf8_lossy(id)
            ));
        };
        let image = match id {
            b"VP8 " => len >= 10 && b[data + 3..data + 6] == [0x9d, 0x01, 0x2a],
            b"VP8L" => len >= 5 && b[data] == 0x2f,
            b"ANMF" => len > 16,
            _ => false,
        };
        if image {
            return Ok(());
        }
        at = stop + (len & 1);
    }
    Err("WebP without image data (no VP8, VP8L or animation frame)".into())
}

fn bmp(b: &[u8]) -> Result<(), String> {
    // File header (14 bytes: the pixels' offset at 10), then the info header (its size first).
    let (Some(offset), Some(info)) = (le32(b, 10), le32(b, 14)) else {
        return Err("truncated BMP: no header".into());
    };
    let (w, h, bpp, compression) = match info {
        12 => (
            le16(b, 18),
            le16(b, 20).map(|h| h as i64),
            le16(b, 24),
            Some(0),
        ),
        40 | 52 | 56 | 64 | 108 | 124 => (
            le32(b, 18).map(|w| (w as u32 as i32).unsigned_abs() as u64),
            le32(b, 22).map(|h| h as u32 as i32 as i64),
            le16(b, 28),
            le32(b, 30),
        ),
        _ => {
            return Err(format!(
                "not a BMP info header of a known size ({info} bytes)"
            ))
        }
    };
    let (Some(w), Some(h), Some(bpp), Some(compression)) = (w, h, bpp, compression) else {
        return Err("truncated BMP: its info header is cut".into());
    };
    if w == 0 || h == 0 || !matches!(bpp, 1 | 2 | 4 | 8 | 16 | 24 | 32) {
        return Err(format!("BMP of {w}x{h} at {bpp} bits a pixel"));
    }
    if offset < 14 + info || offset >= b.len() as u64 {
        return Err(format!(
            "truncated BMP: its pixels start at byte {offset}, the file has {} bytes",
            b.len()
        ));
    }
    // Uncompressed rows (4-byte aligned) must all be there; compressed ones at least start.
    if matches!(compression, 0 | 3 | 6) {
        let row = (w * bpp).div_ceil(32) * 4;
        let need = row.saturating_mul(h.unsigned_abs()).saturating_add(offset);
        if need > b.len() as u64 {
            return Err(format!(
                "truncated BMP: {w}x{} at {bpp} bits needs {need} bytes, the file has {}",
                h.unsigned_abs(),
                b.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal baseline JPEG's structure: SOI, SOF0 (8×8, 1 component), SOS, data, EOI.
    fn jpeg_bytes() -> Vec<u8> {
        let mut j = vec![0xff, 0xd8];
        j.extend([0xff, 0xc0, 0, 11, 8, 0, 8, 0, 8, 1, 1, 0x11, 0]);
        j.extend([0xff, 0xda, 0, 8, 1, 1, 0, 0, 0x3f, 0]);
        j.extend([0x12, 0xff, 0x00, 0x34, 0xff, 0xd0, 0x56]);
        j.extend([0xff, 0xd9]);
        j
    }

    /// The engines take a baseline frame (SOF0, 8-bit) only: the same image marked extended
    /// (SOF1), lossless (SOF3), arithmetic (SOF9), progressive (SOF2) or 12-bit goes elsewhere.
    #[test]
    fn the_engines_decode_baseline_8_bit_frames_only() {
        let j = jpeg_bytes();
        assert!(engines_decode(&j), "baseline gray");
        for sof in [0xc1u8, 0xc2, 0xc3, 0xc9, 0xca, 0xcb] {
            let mut k = j.clone();
            k[3] = sof;
            assert!(info(&k).is_some(), "0x{sof:02x} still has a header");
            assert!(!engines_decode(&k), "0x{sof:02x}");
        }
        let mut twelve = j.clone();
        twelve[6] = 12;
        assert!(!engines_decode(&twelve), "12-bit");
        assert!(!engines_decode(b"\x89PNG\r\n\x1a\n"), "not a JPEG");
    }

    /// A progressive JPEG's structure, two scans with a table between them whose bytes hold
    /// `ff d9`: every cut after its first scan began is found, whatever the cut, and only the
    /// whole file (with or without a trailer) reaches its end.
    #[test]
    fn a_jpeg_cut_after_its_first_scan_does_not_reach_its_end() {
        let mut j = vec![0xff, 0xd8];
        j.extend([0xff, 0xc2, 0, 11, 8, 0, 8, 0, 8, 1, 1, 0x11, 0]);
        j.extend([0xff, 0xda, 0, 8, 1, 1, 0, 0, 0, 0]);
        j.extend([0x12, 0xff, 0x00, 0xff, 0xd3, 0x34]);
        // A Huffman table whose payload holds ff d9 (skipped by its length).
        j.extend([0xff, 0xc4, 0, 6, 0x10, 0xff, 0xd9, 0x01]);
        j.extend([0xff, 0xff, 0xda, 0, 8, 1, 1, 1, 0x3f, 0]);
        j.extend([0x56, 0xff, 0x00, 0x78]);
        j.extend([0xff, 0xd9]);
        assert!(jpeg_is_whole(&j) && check(&j, ImageKind::Jpeg).is_ok());
        let mut trailer = j.clone();
        trailer.extend(b"vendor trailer");
        assert!(jpeg_is_whole(&trailer));
        for cut in 2..j.len() - 1 {
            assert!(!jpeg_is_whole(&j[..cut]), "cut at {cut}");
            assert!(check(&j[..cut], ImageKind::Jpeg).is_err(), "cut at {cut}");
            // However it ends: a cut at a scan boundary followed by an appended trailer.
            let mut t = j[..cut].to_vec();
            t.extend(b"trailer");
            assert!(!jpeg_is_whole(&t), "cut at {cut}, then a trailer");
        }
    }

    fn png_bytes() -> Vec<u8> {
        let mut p = b"\x89PNG\r\n\x1a\n".to_vec();
        p.extend([0, 0, 0, 13]);
        p.extend(b"IHDR");
        p.extend([0, 0, 0, 4, 0, 0, 0, 4, 8, 2, 0, 0, 0]);
        p.extend([0; 4]); // crc (not checked)
        p.extend([0, 0, 0, 0]);
        p.extend(b"IEND");
        p.extend([0xae, 0x42, 0x60, 0x82]);
        p
    }

    #[test]
    fn whole_images_pass_and_damaged_ones_say_why() {
        let j = jpeg_bytes();
        assert_eq!(check(&j, ImageKind::Jpeg), Ok(()));
        let mut trailing = j.clone();
        trailing.extend(b"camera trailer");
        assert_eq!(check(&trailing, ImageKind::Jpeg), Ok(()));
        for cut in 0..j.len() - 1 {
            assert!(check(&j[..cut], ImageKind::Jpeg).is_err(), "cut at {cut}");
        }
        assert!(check(b"<!DOCTYPE html><html>", ImageKind::Jpeg)
            .unwrap_err()
            .contains("starts with \"<!DOCTYPE html><\""));
        assert!(check(b"", ImageKind::Jpeg).unwrap_err().contains("empty"));
        let p = png_bytes();
        assert_eq!(check(&p, ImageKind::Png), Ok(()));
        assert!(check(&p, ImageKind::Jpeg)
            .unwrap_err()
            .contains("holds png"));
        for cut in 8..p.len() - 8 {
            assert!(check(&p[..cut], ImageKind::Png).is_err(), "cut at {cut}");
        }
        // A VP8 chunk: frame tag, start code, 1x1.
        let mut w = b"RIFF".to_vec();
        w.extend(22u32.to_le_bytes());
        w.extend(b"WEBPVP8 ");
        w.extend(10u32.to_le_bytes());
        w.extend([0x30, 0x01, 0x00, 0x9d, 0x01, 0x2a, 1, 0, 1, 0]);
        assert_eq!(check(&w, ImageKind::Webp), Ok(()));
        for cut in 12..w.len() {
            assert!(check(&w[..cut], ImageKind::Webp).is_err(), "cut at {cut}");
        }
        // A RIFF that is whole but holds no image data (a trial's "empty WebP").
        let mut empty = b"RIFF".to_vec();
        empty.extend(4u32.to_le_bytes());
        empty.extend(b"WEBP");
        assert!(check(&empty, ImageKind::Webp)
            .unwrap_err()
            .contains("without image data"));
        let mut bad_frame = w.clone();
        bad_frame[23] = 0; // the start code
        assert!(check(&bad_frame, ImageKind::Webp).is_err());
        // BMP: 2x2 at 24 bits (rows of 8 bytes) after a 54-byte header.
        let mut bm = b"BM".to_vec();
        bm.extend(70u32.to_le_bytes());
        bm.extend([0; 4]);
        bm.extend(54u32.to_le_bytes());
        bm.extend(40u32.to_le_bytes());
        bm.extend(2i32.to_le_bytes());
        bm.extend((-2i32).to_le_bytes()); // top-down
        bm.extend(1u16.to_le_bytes());
        bm.extend(24u16.to_le_bytes());
        bm.extend([0; 24]); // compression 0, sizes, resolution, palette counts
        bm.extend([7; 16]);
        assert_eq!(bm.len(), 70);
        assert_eq!(check(&bm, ImageKind::Bmp), Ok(()));
        for cut in 2..bm.len() {
            assert!(check(&bm[..cut], ImageKind::Bmp).is_err(), "cut at {cut}");
        }
        // A trial's 62-byte BMP: a header and a palette, no pixels.
        assert!(check(&bm[..62], ImageKind::Bmp)
            .unwrap_err()
            .contains("truncated BMP"));
        for i in 0..bm.len() {
            let mut m = bm.clone();
            m[i] ^= 0xff;
            let _ = check(&m, ImageKind::Bmp);
        }
        // Every single-byte change: a verdict, never a panic.
        for i in 0..j.len() {
            let mut m = j.clone();
            m[i] ^= 0xff;
            let _ = check(&m, ImageKind::Jpeg);
        }
    }
}

/// What an image sample's header says: recorded per sample in packed shards (format version
/// 2) and read from headers for formats read in place ([`crate::Dataset::image_info`]), so
/// that nothing parses headers on the hot path. All zero (kind `None`) for a sample that is not
/// an image gpufeed recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ImageInfo {
    /// The container.
    pub kind: ImageKind,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The colour space of the stored pixels.
    pub colorspace: ColorSpace,
    /// Chroma subsampling (JPEG), `None` otherwise or when unusual.
    pub subsampling: Subsampling,
    /// Progressive JPEG, or interlaced PNG.
    pub progressive: bool,
}

/// An image container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    /// Not an image gpufeed recognises.
    #[default]
    None,
    /// JPEG.
    Jpeg,
    /// PNG.
    Png,
    /// WebP.
    Webp,
    /// An image of another kind (in a record: BMP, PNM and TIFF are all `Other`).
    Other,
    /// BMP (recognised by its signature only).
    Bmp,
    /// PNM: PGM or PPM (recognised by its signature only).
    Pnm,
    /// TIFF (recognised by its signature only).
    Tiff,
}

impl ImageKind {
    /// The kind's name in messages: `jpeg`, `png`, `webp`, `bmp`, `pnm`, `tiff`, `other`,
    /// `none`.
    pub fn name(self) -> &'static str {
        match self {
            ImageKind::None => "none",
            ImageKind::Jpeg => "jpeg",
            ImageKind::Png => "png",
            ImageKind::Webp => "webp",
            ImageKind::Other => "other",
            ImageKind::Bmp => "bmp",
            ImageKind::Pnm => "pnm",
            ImageKind::Tiff => "tiff",
        }
    }

    /// Whether gpufeed's decode stage decodes this kind (JPEG, PNG, WebP).
    pub fn decodable(self) -> bool {
        matches!(self, ImageKind::Jpeg | ImageKind::Png | ImageKind::Webp)
    }
}

impl std::fmt::Display for ImageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The colour space of stored pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ColorSpace {
    /// Not known.
    #[default]
    Unknown,
    /// YCbCr (JPEG photos; lossy WebP).
    Ycbcr,
    /// RGB.
    Rgb,
    /// One channel.
    Gray,
    /// CMYK.
    Cmyk,
    /// YCCK (CMYK through a YCbCr transform).
    Ycck,
    /// Gray with alpha.
    GrayAlpha,
    /// RGB with alpha.
    Rgba,
    /// A palette (PNG).
    Palette,
}

/// JPEG chroma subsampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, PartialOrd, Ord)]
pub enum Subsampling {
    /// Not a JPEG, or factors other than these.
    #[default]
    #[serde(rename = "none")]
    None,
    /// 4:4:4.
    #[serde(rename = "4:4:4")]
    S444,
    /// 4:2:2.
    #[serde(rename = "4:2:2")]
    S422,
    /// 4:2:0.
    #[serde(rename = "4:2:0")]
    S420,
    /// 4:4:0.
    #[serde(rename = "4:4:0")]
    S440,
    /// 4:1:1.
    #[serde(rename = "4:1:1")]
    S411,
    /// One component.
    #[serde(rename = "gray")]
    Gray,
}

impl ImageInfo {
    /// Bytes of the record in a shard's index (docs/FORMAT.md, version 2).
    pub const RECORD_BYTES: usize = 16;

    /// The shard record: width, height (u32 LE), kind, colour space, subsampling, flags (bit 0:
    /// progressive), 4 bytes reserved (zero).
    pub fn encode(&self) -> [u8; Self::RECORD_BYTES] {
        let mut b = [0u8; Self::RECORD_BYTES];
        b[0..4].copy_from_slice(&self.width.to_le_bytes());
        b[4..8].copy_from_slice(&self.height.to_le_bytes());
        // The record knows the kinds gpufeed decodes; the rest are `Other` (4).
        b[8] = match self.kind {
            ImageKind::Bmp | ImageKind::Pnm | ImageKind::Tiff => ImageKind::Other as u8,
            k => k as u8,
        };
        b[9] = self.colorspace as u8;
        b[10] = self.subsampling as u8;
        b[11] = u8::from(self.progressive);
        b
    }

    /// Parses a shard record; `None` names a value no version of the format defines.
    pub fn decode(b: &[u8]) -> Option<ImageInfo> {
        let b: &[u8; Self::RECORD_BYTES] = b.try_into().ok()?;
        use ColorSpace as C;
        use ImageKind as K;
        use Subsampling as S;
        let kind = [K::None, K::Jpeg, K::Png, K::Webp, K::Other].get(b[8] as usize)?;
        let colorspace = [
            C::Unknown,
            C::Ycbcr,
            C::Rgb,
            C::Gray,
            C::Cmyk,
            C::Ycck,
            C::GrayAlpha,
            C::Rgba,
            C::Palette,
        ]
        .get(b[9] as usize)?;
        let subsampling = [
            S::None,
            S::S444,
            S::S422,
            S::S420,
            S::S440,
            S::S411,
            S::Gray,
        ]
        .get(b[10] as usize)?;
        if b[11] > 1 || b[12..] != [0; 4] {
            return None;
        }
        Some(ImageInfo {
            kind: *kind,
            width: u32::from_le_bytes(b[0..4].try_into().ok()?),
            height: u32::from_le_bytes(b[4..8].try_into().ok()?),
            colorspace: *colorspace,
            subsampling: *subsampling,
            progressive: b[11] == 1,
        })
    }
}

/// Reads an image's header from its first bytes (a prefix is enough: JPEG's frame header
/// usually sits within the first few KiB, after any EXIF/ICC segments). `None` when `b` is not
/// an image gpufeed recognises or its header is not within `b`.
pub fn info(b: &[u8]) -> Option<ImageInfo> {
    match sniff(b)? {
        ImageKind::Jpeg => jpeg_frame(b).map(|(i, _)| i),
        ImageKind::Png => png_info(b),
        ImageKind::Webp => webp_info(b),
        _ => Some(ImageInfo {
            kind: ImageKind::Other,
            ..ImageInfo::default()
        }),
    }
}

/// Whether the JPEG whose first bytes are `b` is one the JPEG engines decode by their
/// documented limits (nvJPEG's hardware backend: baseline JPEG): a baseline frame (SOF0, 8-bit
/// samples) in YCbCr or gray, subsampled 4:4:4, 4:2:2, 4:2:0 or 4:4:0. Extended (SOF1, or
/// 12-bit), lossless (SOF3), arithmetic-coded (SOF9–11) and progressive frames are not.
pub fn engines_decode(b: &[u8]) -> bool {
    jpeg_frame(b).is_some_and(|(i, sof)| sof == (0xc0, 8) && engines_layout(&i))
}

/// Whether a JPEG with header `i` is laid out as the JPEG engines take it: YCbCr or gray,
/// subsampled 4:4:4, 4:2:2, 4:2:0 or 4:4:0, not progressive (its frame's kind and precision
/// are [`engines_decode`]'s to see).
pub fn engines_layout(i: &ImageInfo) -> bool {
    i.kind == ImageKind::Jpeg
        && !i.progressive
        && matches!(i.colorspace, ColorSpace::Ycbcr | ColorSpace::Gray)
        && matches!(
            i.subsampling,
            Subsampling::S444
                | Subsampling::S422
                | Subsampling::S420
                | Subsampling::S440
                | Subsampling::Gray
        )
}

/// A JPEG's header, and its frame's marker and sample precision.
fn jpeg_frame(b: &[u8]) -> Option<(ImageInfo, (u8, u8))> {
    let mut at = 2;
    let mut adobe_transform = None;
    loop {
        let (k, m) = next_marker(b, at)?;
        at = k + 2;
        match m {
            0x01 | 0xd0..=0xd8 => continue,
            0xd9 | 0xda => return None,
            _ => {}
        }
        let len = be16(b, at)?;
        if m == 0xee && b.get(at + 2..at + 7) == Some(b"Adobe") {
            adobe_transform = b.get(at + 13).copied();
        }
        let is_sof = matches!(m, 0xc0..=0xcf) && !matches!(m, 0xc4 | 0xc8 | 0xcc);
        if is_sof {
            let height = be16(b, at + 3)? as u32;
            let width = be16(b, at + 5)? as u32;
            let n = *b.get(at + 7)? as usize;
            if n == 0 || len != 8 + 3 * n {
                return None; // `check` refuses these frame headers too, as libjpeg does
            }
            let comps = b.get(at + 8..at + 8 + 3 * n)?;
            let factor = |c: usize| (comps[c * 3 + 1] >> 4, comps[c * 3 + 1] & 15);
            let ids: Vec<u8> = (0..n).map(|c| comps[c * 3]).collect();
            let colorspace = match n {
                1 => ColorSpace::Gray,
                3 if adobe_transform == Some(0) || ids == b"RGB" => ColorSpace::Rgb,
                3 => ColorSpace::Ycbcr,
                4 if adobe_transform == Some(2) => ColorSpace::Ycck,
                4 => ColorSpace::Cmyk,
                _ => ColorSpace::Unknown,
            };
            let chroma_ones = (1..n.min(3)).all(|c| factor(c) == (1, 1));
            let subsampling = match (n, factor(0)) {
                (1, _) => Subsampling::Gray,
                (_, f) if chroma_ones => match f {
                    (1, 1) => Subsampling::S444,
                    (2, 1) => Subsampling::S422,
                    (2, 2) => Subsampling::S420,
                    (1, 2) => Subsampling::S440,
                    (4, 1) => Subsampling::S411,
                    _ => Subsampling::None,
                },
                // Equal factors everywhere (e.g. all 2x2) is 4:4:4 too.
                (_, f) if (1..n).all(|c| factor(c) == f) => Subsampling::S444,
                _ => Subsampling::None,
            };
            let info = ImageInfo {
                kind: ImageKind::Jpeg,
                width,
                height,
                colorspace,
                subsampling,
                progressive: matches!(m, 0xc2 | 0xc6 | 0xca | 0xce),
            };
            return Some((info, (m, *b.get(at + 2)?)));
        }
        at += len.max(2);
    }
}

fn png_info(b: &[u8]) -> Option<ImageInfo> {
    let ihdr = b.get(8..33)?;
    if &ihdr[4..8] != b"IHDR" {
        return None;
    }
    let dim = |i: usize| u32::from_be_bytes(ihdr[i..i + 4].try_into().expect("4 bytes"));
    Some(ImageInfo {
        kind: ImageKind::Png,
        width: dim(8),
        height: dim(12),
        colorspace: match ihdr[17] {
            0 => ColorSpace::Gray,
            2 => ColorSpace::Rgb,
            3 => ColorSpace::Palette,
            4 => ColorSpace::GrayAlpha,
            6 => ColorSpace::Rgba,
            _ => ColorSpace::Unknown,
        },
        subsampling: Subsampling::None,
        progressive: ihdr[20] == 1,
    })
}

fn webp_info(b: &[u8]) -> Option<ImageInfo> {
    let chunk = b.get(12..16)?;
    let le24 = |at: usize| -> Option<u32> {
        let v = b.get(at..at + 3)?;
        Some(v[0] as u32 | (v[1] as u32) << 8 | (v[2] as u32) << 16)
    };
    let (width, height, colorspace) = match chunk {
        // Lossy: the frame header after the 3-byte frame tag and the start code 9d 01 2a.
        b"VP8 " => {
            if b.get(23..26)? != [0x9d, 0x01, 0x2a] {
                return None;
            }
            let w = u16::from_le_bytes(b.get(26..28)?.try_into().ok()?) & 0x3fff;
            let h = u16::from_le_bytes(b.get(28..30)?.try_into().ok()?) & 0x3fff;
            (w as u32, h as u32, ColorSpace::Ycbcr)
        }
        // Lossless: signature 0x2f, then 14-bit width − 1 and height − 1.
        b"VP8L" => {
            if *b.get(20)? != 0x2f {
                return None;
            }
            let v = u32::from_le_bytes(b.get(21..25)?.try_into().ok()?);
            ((v & 0x3fff) + 1, ((v >> 14) & 0x3fff) + 1, ColorSpace::Rgba)
        }
        // Extended: the canvas, 24-bit width − 1 and height − 1.
        b"VP8X" => (le24(24)? + 1, le24(27)? + 1, ColorSpace::Unknown),
        _ => return None,
    };
    Some(ImageInfo {
        kind: ImageKind::Webp,
        width,
        height,
        colorspace,
        subsampling: Subsampling::None,
        progressive: false,
    })
}

/// What `gpufeed inspect --images` prints: counts by kind, colour space, subsampling, longer
/// side, progressive.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Summary {
    /// Samples.
    pub samples: u64,
    /// JPEGs.
    pub jpeg: u64,
    /// Images that are not JPEG (PNG, WebP, others).
    pub non_jpeg: u64,
    /// Samples that are not recognised images.
    pub not_images: u64,
    /// Progressive JPEGs (and interlaced PNGs).
    pub progressive: u64,
    /// By kind.
    pub kinds: std::collections::BTreeMap<ImageKind, u64>,
    /// By colour space.
    pub colorspaces: std::collections::BTreeMap<ColorSpace, u64>,
    /// By JPEG subsampling.
    pub subsampling: std::collections::BTreeMap<Subsampling, u64>,
    /// By the longer side: (at most this many pixels, images).
    pub longer_side: Vec<(u32, u64)>,
    /// Largest width × height.
    pub pixels_max: u64,
    /// Mean width and height.
    pub mean_size: (f64, f64),
}

impl Summary {
    /// The summary of `infos`.
    pub fn of(infos: &[ImageInfo]) -> Summary {
        const EDGES: [u32; 7] = [128, 256, 512, 1024, 2048, 4096, u32::MAX];
        let mut s = Summary {
            samples: infos.len() as u64,
            longer_side: EDGES.iter().map(|&e| (e, 0)).collect(),
            ..Summary::default()
        };
        let (mut sw, mut sh, mut n) = (0f64, 0f64, 0u64);
        for i in infos {
            if i.kind == ImageKind::None {
                s.not_images += 1;
                continue;
            }
            *s.kinds.entry(i.kind).or_default() += 1;
            if i.kind == ImageKind::Jpeg {
                s.jpeg += 1;
                *s.subsampling.entry(i.subsampling).or_default() += 1;
            } else {
                s.non_jpeg += 1;
            }
            *s.colorspaces.entry(i.colorspace).or_default() += 1;
            s.progressive += u64::from(i.progressive);
            if i.width > 0 && i.height > 0 {
                let long = i.width.max(i.height);
                let k = EDGES
                    .iter()
                    .position(|&e| long <= e)
                    .expect("last edge is max");
                s.longer_side[k].1 += 1;
                s.pixels_max = s.pixels_max.max(i.width as u64 * i.height as u64);
                sw += i.width as f64;
                sh += i.height as f64;
                n += 1;
            }
        }
        if n > 0 {
            s.mean_size = (sw / n as f64, sh / n as f64);
        }
        s
    }

    /// Lines for a terminal.
    pub fn text(&self) -> String {
        let list = |m: Vec<(String, u64)>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let name = |v: serde_json::Value| v.as_str().unwrap_or("?").to_string();
        let mut out = format!(
            "images: {} JPEG ({} progressive), {} other images, {} not images; mean {:.0}x{:.0},              largest {:.1} Mpx",
            self.jpeg,
            self.progressive,
            self.non_jpeg,
            self.not_images,
            self.mean_size.0,
            self.mean_size.1,
            self.pixels_max as f64 / 1e6
        );
        let cs = self
            .colorspaces
            .iter()
            .map(|(k, v)| (name(serde_json::json!(k)), *v))
            .collect();
        let ss = self
            .subsampling
            .iter()
            .map(|(k, v)| (name(serde_json::json!(k)), *v))
            .collect();
        out += &format!(
            "\n  colour spaces: {}\n  subsampling: {}",
            list(cs),
            list(ss)
        );
        out += "\n  longer side:";
        for (edge, count) in &self.longer_side {
            if *count > 0 {
                let e = if *edge == u32::MAX {
                    "larger".to_string()
                } else {
                    format!("≤ {edge}")
                };
                out += &format!(" {e}: {count};");
            }
        }
        out
    }
}

#[cfg(test)]
mod info_tests {
    use super::*;

    #[test]
    fn records_round_trip_and_unknown_values_are_refused() {
        let i = ImageInfo {
            kind: ImageKind::Jpeg,
            width: 500,
            height: 375,
            colorspace: ColorSpace::Ycck,
            subsampling: Subsampling::S420,
            progressive: true,
        };
        assert_eq!(ImageInfo::decode(&i.encode()), Some(i));
        let mut b = i.encode();
        b[8] = 9;
        assert_eq!(ImageInfo::decode(&b), None);
        let mut b = i.encode();
        b[15] = 1;
        assert_eq!(ImageInfo::decode(&b), None);
        assert_eq!(ImageInfo::decode(&[0; 3]), None);
    }

    #[test]
    fn truncated_headers_give_none_not_a_panic() {
        let mut j = vec![0xff, 0xd8, 0xff, 0xc0, 0x00, 0x11, 8, 1, 0x77, 2, 0x0b];
        for n in 0..j.len() {
            let _ = info(&j[..n]);
        }
        j.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        let i = info(&j).unwrap();
        assert_eq!((i.width, i.height), (523, 375));
        assert_eq!(i.subsampling, Subsampling::S420);
        assert_eq!(i.colorspace, ColorSpace::Ycbcr);
    }
}
