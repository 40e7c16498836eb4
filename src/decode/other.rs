//! PNG and WebP: decoded whole to packed RGB by the image-rs project's pure-Rust decoders
//! (`png`, `image-webp`), then through the same fused pass as JPEGs. Converted to RGB as
//! Pillow's `convert("RGB")` does: gray replicated, alpha dropped (not composited), a palette
//! looked up, 16-bit samples cut to their high byte. The dimensions are checked against the
//! pixel limit from the header before the decoders allocate anything.

use std::io::Cursor;

use crate::image::{info, ImageKind};

/// Decodes a PNG or WebP into `out` (resized to width × height × 3) and returns its size; the
/// error is a short reason.
pub fn decode_rgb(
    data: &[u8],
    pixels_max: u64,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(u32, u32), String> {
    let i = info(data).ok_or("truncated or corrupt image header")?;
    if i.width == 0 || i.height == 0 {
        return Err(format!("bad dimensions {}x{}", i.width, i.height));
    }
    super::spec::check_pixels(i.width, i.height, pixels_max)?;
    let pixels = i.width as u64 * i.height as u64;
    // Room for the largest decoded form (RGBA at 16 bits) and the decoders' own buffers.
    let limit = (pixels as usize).saturating_mul(8).saturating_add(1 << 20);
    match i.kind {
        ImageKind::Png => png_rgb(data, limit, scratch, out),
        ImageKind::Webp => webp_rgb(data, limit, scratch, out),
        k => Err(format!("{k:?} images are not decoded")),
    }
}

fn png_rgb(
    data: &[u8],
    limit: usize,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(u32, u32), String> {
    let mut d = png::Decoder::new_with_limits(Cursor::new(data), png::Limits { bytes: limit });
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut r = d.read_info().map_err(|e| format!("PNG: {e}"))?;
    let size = r.output_buffer_size().ok_or("PNG: image too large")?;
    scratch.resize(size, 0);
    let f = r.next_frame(scratch).map_err(|e| {
        if matches!(e, png::DecodingError::IoError(_)) {
            "truncated PNG: the data ends before the image".to_string()
        } else {
            format!("PNG: {e}")
        }
    })?;
    let (w, h) = (f.width, f.height);
    let n = w as usize * h as usize;
    out.resize(n * 3, 0);
    let ch = match f.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err("PNG: palette not expanded".into()),
    };
    let line = f.line_size;
    for y in 0..h as usize {
        let row = &scratch[y * line..y * line + w as usize * ch];
        let dst = &mut out[y * w as usize * 3..(y + 1) * w as usize * 3];
        for (o, p) in dst.chunks_exact_mut(3).zip(row.chunks_exact(ch)) {
            if ch < 3 {
                o.fill(p[0]);
            } else {
                o.copy_from_slice(&p[..3]);
            }
        }
    }
    Ok((w, h))
}

fn webp_rgb(
    data: &[u8],
    limit: usize,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(u32, u32), String> {
    let mut d = image_webp::WebPDecoder::new(Cursor::new(data)).map_err(webp_error)?;
    d.set_memory_limit(limit);
    let (w, h) = d.dimensions();
    let size = d.output_buffer_size().ok_or("WebP: image too large")?;
    if size > limit {
        return Err(format!("WebP: {w}x{h} is above the memory limit"));
    }
    let n = w as usize * h as usize;
    if d.has_alpha() {
        scratch.resize(size, 0);
        d.read_image(scratch).map_err(webp_error)?;
        out.resize(n * 3, 0);
        for (o, p) in out.chunks_exact_mut(3).zip(scratch.chunks_exact(4)) {
            o.copy_from_slice(&p[..3]);
        }
    } else {
        out.resize(size, 0);
        d.read_image(out).map_err(webp_error)?;
    }
    Ok((w, h))
}

fn webp_error(e: image_webp::DecodingError) -> String {
    match e {
        image_webp::DecodingError::IoError(_) => {
            "truncated WebP: the data ends before the image".into()
        }
        e => format!("WebP: {e}"),
    }
}
