//! Every failure the fuzz targets (`fuzz/`, `scripts/fuzz.sh`) found, kept as a regression
//! test: the input as found (minimised by libFuzzer), less the target's mode byte, and what
//! should have happened.

use gpufeed::dataset::OpenOptions;
use gpufeed::image::{check, info, ImageKind};

/// `image_header`: a JPEG frame header with zero components made `info` index an empty
/// component list (a panic reachable from `gpufeed pack` and `Dataset::image_info`).
#[test]
fn jpeg_frame_header_without_components_is_no_image() {
    let b: &[u8] = &[
        0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x05, 0x00, 0x00,
        0x00, 0x2f, 0x1f, 0x00, 0x00, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x00, 0x20, 0x00, 0x26, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x03, 0x01, 0x11, 0x03, 0x11, 0x00, 0x3f, 0x00,
        0x12, 0x34,
    ];
    assert_eq!(info(b), None);
    assert!(check(b, ImageKind::Jpeg).is_err());
}

/// `args`: `label_ext` of only dots became the empty extension, which `values()` then wrote
/// as "" — read back as the default, `cls`. An extension that is no extension is refused.
#[test]
fn label_ext_of_only_dots_is_refused() {
    let mut o = OpenOptions::default();
    let e = o.set("label_ext", ".....").unwrap_err();
    assert!(e.to_string().contains("names no extension"), "{e}");
    assert_eq!(o.webdataset.label.as_deref(), Some("cls"), "unchanged");
    o.set("label_ext", ".txt").unwrap();
    assert_eq!(o.webdataset.label.as_deref(), Some("txt"));
}

/// `args`: a vertical tab between the dots and the name survived the first reading
/// (`" \x0bdib"` kept its tab once the dots went) and changed on the second.
#[test]
fn extensions_read_the_same_when_written_back() {
    let mut o = OpenOptions::default();
    o.set("label_ext", "........\x0bDIB").unwrap();
    assert_eq!(o.webdataset.label.as_deref(), Some("dib"));
    o.set("payload", " .JPG, ..\x0b png ,").unwrap();
    assert_eq!(o.webdataset.payload, ["jpg", "png"]);
    for (name, v) in o.values() {
        let mut again = o.clone();
        again.set(name, v.as_deref().unwrap_or("none")).unwrap();
        assert_eq!(again.values(), o.values(), "{name}");
    }
}

/// `image_header`: a frame header claiming 34 components in a 17-byte segment passed `check`
/// (which `gpufeed verify` runs) while `info` found no header. Both now hold the segment to
/// T.81's length, 8 + 3 × components, as libjpeg does.
#[test]
fn jpeg_frame_header_length_must_match_its_components() {
    let mut b = vec![
        0xff, 0xd8, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x00, 0x01, 0x00, 0x03, 0x22,
    ];
    b.extend_from_slice(&[0x30, 0x00, 0x20, 0x02, 0x11, 0x01, 0x03, 0x11, 0x01]);
    b.extend_from_slice(&[
        0xff, 0xda, 0x00, 0x0c, 0x03, 0x01, 0x00, 0x02, 0x11, 0x03, 0x11,
    ]);
    b.extend_from_slice(&[0x00, 0x3f, 0x00, 0x12, 0x34, 0xff, 0xd9]);
    assert!(check(&b, ImageKind::Jpeg)
        .unwrap_err()
        .contains("component count"));
    assert_eq!(info(&b), None);
    b[11] = 3; // the count the length says
    assert_eq!(check(&b, ImageKind::Jpeg), Ok(()));
    let x = info(&b).unwrap();
    assert_eq!((x.width, x.height), (3, 1));
}

/// `args`: weights summed in u32 wrapped (`4294967295` and `2` add up to 1), so a mix whose
/// weights are far past 100 could pass the "at most 100" check (debug builds panicked).
#[test]
fn size_mix_weights_do_not_wrap() {
    let e = gpufeed_cli::bench::SizeMix::parse("4K/4294967295:8K/2").unwrap_err();
    assert!(e.to_string().contains("at most 100"), "{e}");
    let found = "42K/33:6K/12322413:6/37:8K/332:8K/33:6K/120224013:6/3312322413:6";
    assert!(gpufeed_cli::bench::SizeMix::parse(found).is_err());
    let m = gpufeed_cli::bench::SizeMix::parse("4K/50:128K").unwrap();
    assert_eq!((m.min(), m.max()), (4096, 128 << 10));
}

/// `megatron`: `stride=0` with `seq_len` was refused only after the index was read, with an
/// error naming no file; options that fit no file are now refused first, as for flat tokens.
#[test]
fn megatron_windows_of_stride_zero_are_refused_before_reading() {
    let mut o = OpenOptions::default();
    o.tokens.seq_len = Some(4);
    o.tokens.stride = Some(0);
    let missing = std::path::PathBuf::from("/nonexistent/corpus");
    let e = gpufeed::Dataset::open_files(gpufeed::dataset::Format::Megatron, &[missing], &o)
        .unwrap_err();
    assert!(e.to_string().contains("stride must be at least 1"), "{e}");
}

/// `args`: `label_ext="....none"` became the extension `none`, which `values()` writes as
/// `none` — read back as no label at all. Dots go first, then `none` means none.
#[test]
fn label_ext_none_behind_dots_means_none() {
    let mut o = OpenOptions::default();
    o.set("label_ext", "....none").unwrap();
    assert_eq!(o.webdataset.label, None);
    o.set("label_ext", ".NONE").unwrap();
    assert_eq!(o.webdataset.label, None);
}

/// `megatron`: an index of no sequences and no documents made the open allocate a whole
/// chunk's buffer (768 KiB) for arrays of nothing — past the fuzz harness's bound on memory
/// for a 34-byte input (the arrays are now read through a buffer sized by them). It is still
/// an index of no samples, said as such.
#[test]
fn an_empty_megatron_index_opens_without_a_chunk_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let mut idx = b"MMIDIDX\0\0".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(8);
    idx.extend_from_slice(&[0; 16]); // 0 sequences, 0 documents
    std::fs::write(dir.path().join("m.idx"), &idx).unwrap();
    std::fs::write(dir.path().join("m.bin"), b"").unwrap();
    let e = gpufeed::Dataset::open(dir.path().join("m")).unwrap_err();
    assert!(e.to_string().contains("no samples"), "{e}");
}
