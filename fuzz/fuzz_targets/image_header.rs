//! The decode stage's image header parser (`image::info`: JPEG SOF and Adobe
//! markers, PNG IHDR, WebP VP8/VP8L/VP8X), the structural check `gpufeed verify` runs
//! (`image::check`), and the 16-byte image record of shard format version 2.
//!
//! Input: byte 0 picks where to cut a prefix (`info` must read the same header from any
//! prefix that holds it), the rest is the image's first bytes; its first 16 bytes are also
//! parsed as an image record.
#![no_main]
use gpufeed::image::{check, info, sniff, ImageInfo, ImageKind};
use gpufeed_fuzz::{Budget, Counting};

#[global_allocator]
static A: Counting = Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&cut, b)) = data.split_first() else {
        return;
    };
    // `check` promises to allocate nothing on success.
    let budget = Budget::start("image::check", b.len(), 0, 0);
    let kind = sniff(b);
    let checked = kind.map(|k| check(b, k));
    if matches!(checked, Some(Ok(()))) {
        budget.check();
    }
    // The header parse allocates at most the component ids of one frame header.
    let budget = Budget::start("image::info", 0, 0, 1024);
    let found = info(b);
    budget.check();
    if let Some(x) = found {
        assert_eq!(
            ImageInfo::decode(&x.encode()),
            Some(x),
            "the record round-trips"
        );
        assert_eq!(
            x.kind == ImageKind::Other,
            !kind.is_some_and(|k| k.decodable())
        );
    }
    // A JPEG or PNG that `check` accepts has a header `info` reads, with a width (JPEG's
    // height may be 0: a DNL marker defines it later). `check` reads only WebP's RIFF size.
    if let (Some(k @ (ImageKind::Jpeg | ImageKind::Png)), Some(Ok(()))) = (kind, &checked) {
        let x = found.unwrap_or_else(|| panic!("check accepts this {k} but info finds no header"));
        assert!(x.width > 0, "check accepts a {k} that info sizes {x:?}");
        assert!(
            k == ImageKind::Jpeg || x.height > 0,
            "check accepts a PNG that info sizes {x:?}"
        );
    }
    // Reading a prefix: nothing, or the same header.
    let k = (cut as usize * b.len()) / 255;
    if let Some(p) = info(&b[..k]) {
        assert_eq!(Some(p), found, "a {k}-byte prefix reads another header");
    }
    if let Some(r) = b.get(..ImageInfo::RECORD_BYTES) {
        if let Some(y) = ImageInfo::decode(r) {
            assert_eq!(
                &y.encode()[..],
                r,
                "a record that parses is written back the same"
            );
        }
    }
});
