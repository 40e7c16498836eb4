//! The decode stage on untrusted bytes (feature `decode`): libjpeg-turbo through gpufeed's
//! TurboJPEG wrapper (header re-read and output size checked before decoding, region decode
//! with its iMCU margin, DCT scaling), the PNG and WebP decoders, the crop/resize/flip/
//! normalise pass — as one `ImageLoader` thread decodes a sample.
//!
//! Input: byte 0 picks the transform (bit 0 eval, else train), the element type (bits 1–2)
//! and the layout (bit 3); byte 1 the sample id (so the random crop varies); the rest is the
//! file. Images above 1 Mpx are refused from their header, so no buffer grows past that.
//!
//! After the input, the same decoder decodes a small good JPEG, which must give exactly what a
//! fresh decoder gives: whatever the input did, it leaves nothing behind for the next image
//! (a header cut short once made the next image fail with its dimensions, issue 36).
#![no_main]
use std::sync::OnceLock;

use gpufeed::decode::{ImageSpec, Layout, PixelType, SampleDecoder};
use gpufeed::testing::synth::{self, EncodeOptions};
use gpufeed_fuzz::{Budget, Counting};

#[global_allocator]
static A: Counting = Counting;

const MAX_PIXELS: u64 = 1 << 20;

/// A 40x24 baseline 4:2:0 JPEG: the good image decoded after each input.
fn good_jpeg() -> &'static [u8] {
    static GOOD: OnceLock<Vec<u8>> = OnceLock::new();
    GOOD.get_or_init(|| {
        let (px, (w, _)) = synth::pixels(5, 1, 3);
        let tile: Vec<u8> = px
            .chunks_exact(w as usize * 3)
            .take(24)
            .flat_map(|row| row[..40 * 3].to_vec())
            .collect();
        let o = EncodeOptions {
            channels: 3,
            quality: 90,
            subsampling: "4:2:0",
            progressive: false,
            restart_rows: 0,
        };
        synth::encode(&tile, (40, 24), &o).expect("the good JPEG")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let [mode, sample, img @ ..] = data else {
        return;
    };
    let spec = if mode & 1 != 0 {
        ImageSpec::eval(24)
    } else {
        ImageSpec::train(24)
    };
    let dtype = [
        PixelType::U8,
        PixelType::F16,
        PixelType::Bf16,
        PixelType::F32,
    ][(mode >> 1 & 3) as usize];
    let layout = if mode & 8 != 0 {
        Layout::Nhwc
    } else {
        Layout::Nchw
    };
    let mut spec = spec.dtype(dtype).layout(layout);
    spec.pixels_max = MAX_PIXELS;
    // The good JPEG's tensor from a fresh decoder, once per spec (the low four bits of byte 0).
    static CLEAN: [OnceLock<Vec<u8>>; 16] = [const { OnceLock::new() }; 16];
    let want = CLEAN[(mode & 15) as usize].get_or_init(|| {
        let mut fresh = SampleDecoder::new(spec.clone()).expect("a valid spec");
        let mut t = vec![0u8; fresh.sample_bytes()];
        fresh
            .decode(good_jpeg(), 1, 0, 7, &mut t)
            .expect("the good JPEG decodes");
        t
    });
    // One decoder per input: each run starts from the same state (libFuzzer replays alone).
    let mut dec = SampleDecoder::new(spec).expect("a valid spec");
    let mut out = vec![0xa5u8; dec.sample_bytes()];
    // Pixels of the largest image allowed, as RGB or CMYK, a row or two of filter weights,
    // and the PNG/WebP decoders' own buffers (up to a few times the image).
    let budget = Budget::start("decode", 0, 0, 16 * MAX_PIXELS as usize + (1 << 20));
    match dec.decode(img, 1, 0, *sample as u64, &mut out) {
        Ok(()) => {
            if dtype == PixelType::F32 {
                for v in out.chunks_exact(4) {
                    let x = f32::from_le_bytes(v.try_into().unwrap());
                    // (0..=255 / 255 − mean) / std for ImageNet's mean and std.
                    assert!(x.is_finite() && x.abs() < 3.0, "element {x} out of range");
                }
            }
        }
        Err(msg) => assert!(!msg.is_empty()),
    }
    budget.check();
    let mut got = vec![0x5au8; want.len()];
    dec.decode(good_jpeg(), 1, 0, 7, &mut got)
        .unwrap_or_else(|e| panic!("the good JPEG after this input: {e}"));
    assert!(
        got == *want,
        "the good JPEG decodes differently after this input"
    );
});
