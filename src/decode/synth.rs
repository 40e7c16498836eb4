//! A generated ImageNet-like set of JPEGs (for `gpufeed bench decode` and the tests): photos
//! are smooth fields with texture, so sizes and decode cost resemble real ones (about 500×375,
//! quality 90, 4:2:0 mostly), with the rarer kinds a real crawl holds — grayscale, CMYK
//! (YCCK), progressive, 4:4:4 and 4:2:2, restart markers.

use std::path::Path;

pub use super::jpeg::EncodeOptions;
use super::jpeg::Turbo;
use crate::error::{Error, Result};
use crate::progress::Task;
use crate::rng::Rng;

/// The mix: 1 in 10 gray, 1 in 10 progressive, 1 in 20 CMYK, 1 in 10 4:4:4, 1 in 20 4:2:2,
/// 1 in 10 with restart markers; the rest baseline 4:2:0.
pub fn kind_of(i: u64) -> EncodeOptions {
    EncodeOptions {
        quality: 90,
        channels: match i % 20 {
            1 | 11 => 1,
            3 => 4,
            _ => 3,
        },
        subsampling: match i % 20 {
            5 | 15 => "4:4:4",
            7 => "4:2:2",
            _ => "4:2:0",
        },
        progressive: i % 10 == 2,
        restart_rows: if i % 10 == 4 { 2 } else { 0 },
    }
}

/// Image `i`'s pixels (`channels` per pixel) and size: a bicubic-smooth random field with
/// mild noise, about 500×375 (a third portrait), from the seed alone.
pub fn pixels(seed: u64, i: u64, channels: u32) -> (Vec<u8>, (u32, u32)) {
    let mut r = Rng::new(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let (long, short) = (400 + r.below(201) as u32, 300 + r.below(151) as u32);
    let (w, h) = if i.is_multiple_of(3) {
        (short, long)
    } else {
        (long, short)
    };
    let cell = 16usize;
    let (gw, gh) = (w as usize / cell + 2, h as usize / cell + 2);
    let ch = channels as usize;
    let grid: Vec<u8> = (0..gw * gh * ch).map(|_| r.below(256) as u8).collect();
    let mut px = vec![0u8; w as usize * h as usize * ch];
    for y in 0..h as usize {
        let fy = y as f32 / cell as f32;
        let (gy, ty) = (fy as usize, fy.fract());
        for x in 0..w as usize {
            let fx = x as f32 / cell as f32;
            let (gx, tx) = (fx as usize, fx.fract());
            let noise = (r.next_u64() & 0x1f) as f32 - 16.0;
            for c in 0..ch {
                let g = |xx: usize, yy: usize| grid[(yy * gw + xx) * ch + c] as f32;
                let top = g(gx, gy) * (1.0 - tx) + g(gx + 1, gy) * tx;
                let bot = g(gx, gy + 1) * (1.0 - tx) + g(gx + 1, gy + 1) * tx;
                let v = top * (1.0 - ty) + bot * ty + noise * 0.6;
                px[(y * w as usize + x) * ch + c] = v.clamp(0.0, 255.0) as u8;
            }
        }
    }
    (px, (w, h))
}

/// Encodes `px` (`size`, `o.channels` per pixel) with libjpeg-turbo as `o` says (for tests
/// that need a kind the set's mix does not hold, e.g. 4:1:1).
pub fn encode(px: &[u8], size: (u32, u32), o: &EncodeOptions) -> Result<Vec<u8>> {
    let need = size.0 as usize * size.1 as usize * o.channels as usize;
    if px.len() != need {
        return Err(crate::error::invalid(format!(
            "{} bytes of pixels for {}x{}x{}",
            px.len(),
            size.0,
            size.1,
            o.channels
        )));
    }
    let mut t = Turbo::compressor().map_err(|e| crate::error::invalid(e.to_string()))?;
    t.encode(px, size, o)
        .map_err(|e| crate::error::invalid(format!("encoding: {e}")))
}

/// Image `i` of the set, encoded.
pub fn jpeg(seed: u64, i: u64) -> Result<Vec<u8>> {
    let k = kind_of(i);
    let (px, size) = pixels(seed, i, k.channels);
    let mut t = Turbo::compressor().map_err(|e| crate::error::invalid(e.to_string()))?;
    t.encode(&px, size, &k)
        .map_err(|e| crate::error::invalid(format!("encoding image {i}: {e}")))
}

/// Writes `n` images into `dir` as an ImageFolder (class folders `cNNNN` of 50 images each,
/// at most 1000 classes) unless `dir/.complete-N` says it is there. Returns the bytes written.
pub fn write_image_folder(dir: &Path, n: u64, seed: u64) -> Result<u64> {
    let mark = dir.join(format!(".complete-{n}"));
    if mark.exists() {
        return Ok(0);
    }
    let classes = (n / 50).clamp(1, 1000);
    let ctx = |p: &Path, e| Error::io("cannot write the generated images", e).with_path(p);
    let mut prog = Task::items(
        format!("generating {n} JPEGs in {}", dir.display()),
        n,
        "images",
    );
    let mut bytes = 0;
    for i in 0..n {
        let cdir = dir.join(format!("c{:04}", i % classes));
        if i < classes {
            std::fs::create_dir_all(&cdir).map_err(|e| ctx(&cdir, e))?;
        }
        let j = jpeg(seed, i)?;
        bytes += j.len() as u64;
        let p = cdir.join(format!("{i:08}.jpg"));
        std::fs::write(&p, &j).map_err(|e| ctx(&p, e))?;
        prog.set(i + 1);
    }
    prog.finish();
    std::fs::write(&mark, b"").map_err(|e| ctx(&mark, e))?;
    Ok(bytes)
}
