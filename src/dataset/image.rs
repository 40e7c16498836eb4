//! Is an image sample what its name claims? A structural check without decoding: the magic
//! bytes, a header that parses (dimensions above zero), and the end marker (JPEG EOI, PNG IEND,
//! RIFF size), so a truncated JPEG, an HTML page saved as `.jpg` or an empty file is found by
//! `gpufeed verify` before training is. Nothing here allocates; every offset is checked.

#![forbid(unsafe_code)]

/// The image kind a file extension claims (lower case, without the dot).
pub fn kind_of_extension(ext: &str) -> Option<&'static str> {
    Some(match ext {
        "jpg" | "jpeg" => "jpeg",
        "png" => "png",
        "webp" => "webp",
        "bmp" => "bmp",
        "ppm" | "pgm" => "pnm",
        "tif" | "tiff" => "tiff",
        _ => return None,
    })
}

/// The image kind the first bytes show, if any.
pub fn sniff(b: &[u8]) -> Option<&'static str> {
    if b.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("jpeg")
    } else if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("png")
    } else if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        Some("webp")
    } else if b.starts_with(b"BM") {
        Some("bmp")
    } else if b.starts_with(b"P5") || b.starts_with(b"P6") {
        Some("pnm")
    } else if b.starts_with(b"II*\0") || b.starts_with(b"MM\0*") {
        Some("tiff")
    } else {
        None
    }
}

/// Checks `b` as an image of `kind` (from [`kind_of_extension`] or [`sniff`]); the error says
/// what is wrong in a few words.
pub fn check(b: &[u8], kind: &str) -> Result<(), String> {
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
        "jpeg" => jpeg(b),
        "png" => png(b),
        "webp" => webp(b),
        _ => Ok(()), // the magic is all we check for the rarer kinds
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
        // Markers may be preceded by fill bytes (0xff).
        while b.get(at) == Some(&0xff) && b.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        let (Some(&0xff), Some(&m)) = (b.get(at), b.get(at + 1)) else {
            return Err(format!("truncated or corrupt JPEG: no marker at byte {at}"));
        };
        at += 2;
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
                (Some(h), Some(w), Some(&c)) if w > 0 && c > 0 => {
                    let _ = h; // 0 is allowed (defined later by DNL)
                    frame = true;
                }
                _ => return Err("JPEG frame header with no width or components".into()),
            }
        }
        if m == 0xda {
            if !frame {
                return Err("JPEG scan before any frame header".into());
            }
            // Entropy-coded data follows; 0xff in it is stuffed (ff 00) or a restart marker, so
            // ff d9 after the scan starts can only be the end-of-image marker.
            let data = &b[at + len..];
            return if data.windows(2).any(|w| w == [0xff, 0xd9]) {
                Ok(())
            } else {
                Err("truncated JPEG: no end-of-image marker".into())
            };
        }
        at += len;
    }
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

fn webp(b: &[u8]) -> Result<(), String> {
    let riff = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    // The RIFF size counts from byte 8; a writer may pad to an even length.
    if riff + 8 > b.len() {
        return Err(format!(
            "truncated WebP: RIFF says {} bytes, the file has {}",
            riff + 8,
            b.len()
        ));
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
        assert_eq!(check(&j, "jpeg"), Ok(()));
        let mut trailing = j.clone();
        trailing.extend(b"camera trailer");
        assert_eq!(check(&trailing, "jpeg"), Ok(()));
        for cut in 0..j.len() - 1 {
            assert!(check(&j[..cut], "jpeg").is_err(), "cut at {cut}");
        }
        assert!(check(b"<!DOCTYPE html><html>", "jpeg")
            .unwrap_err()
            .contains("starts with \"<!DOCTYPE html><\""));
        assert!(check(b"", "jpeg").unwrap_err().contains("empty"));
        let p = png_bytes();
        assert_eq!(check(&p, "png"), Ok(()));
        assert!(check(&p, "jpeg").unwrap_err().contains("holds png"));
        for cut in 8..p.len() - 8 {
            assert!(check(&p[..cut], "png").is_err(), "cut at {cut}");
        }
        let mut w = b"RIFF".to_vec();
        w.extend(20u32.to_le_bytes());
        w.extend(b"WEBPVP8 ");
        w.extend([0u8; 12]);
        assert_eq!(check(&w, "webp"), Ok(()));
        assert!(check(&w[..20], "webp").unwrap_err().contains("truncated"));
        // Every single-byte change: a verdict, never a panic.
        for i in 0..j.len() {
            let mut m = j.clone();
            m[i] ^= 0xff;
            let _ = check(&m, "jpeg");
        }
    }
}
