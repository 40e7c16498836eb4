//! The decode stage against an independent decoder and resampler: Pillow (whose libjpeg-turbo
//! is the oracle the GPU stage is held to as well) writes the test JPEGs and decodes and
//! transforms them; gpufeed's output must agree within the stated tolerances. Then the loader
//! side: every sample exactly once, corrupt images as named errors, and the same tensor for a
//! sample whatever the thread count, the rank count or the resume point.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use gpufeed::decode::{ImageSpec, Layout, PixelType, RgbDecoder, SampleDecoder, Transform};
use gpufeed::{Dataset, Loader};

use crate::common::disk_dir;

/// Decode alone against Pillow, per u8 channel: the mean |difference| must stay within this
/// (the bound) and the largest within `DECODE_MAX` (both decoders are libjpeg-turbo with
/// the accurate IDCT and fancy upsampling: they agree exactly but for CMYK rounding).
const DECODE_MEAN: f64 = 1.0;
const DECODE_MAX: i32 = 1;
/// The fused crop + resize (+ flip) against Pillow's resize on the u8 scale. Pillow rounds to
/// u8 between its horizontal and vertical passes and uses 22-bit fixed-point weights; gpufeed
/// keeps f32 throughout. These bind the GPU stage too.
const TRANSFORM_MEAN: f64 = 0.5;
const TRANSFORM_MAX: i32 = 2;
/// The same with DCT-domain downscaling (decode at 1/2–1/8 when the crop is still at least four
/// times the output then): libjpeg-turbo's scaled IDCT is not the triangle filter, so the bound is
/// looser (measured worst: mean 0.55, max 8, on images with heavy pixel noise).
const DCT_MEAN: f64 = 0.75;
const DCT_MAX: i32 = 12;

/// A Python with Pillow and numpy: python3 itself if it has them, else a virtualenv made once
/// under the target directory (pip, from PyPI).
/// `None` (the test says why) without python3 or with GPUFEED_SKIP_PYTHON.
fn pillow() -> Option<&'static Path> {
    static PY: OnceLock<Option<PathBuf>> = OnceLock::new();
    PY.get_or_init(|| {
        if std::env::var_os("GPUFEED_SKIP_PYTHON").is_some() {
            eprintln!("skipped: GPUFEED_SKIP_PYTHON is set");
            return None;
        }
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!("skipped: python3 is not installed (CI installs it)");
            return None;
        }
        let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
        // A python3 that has them already (the GPU machine's, which has no package index).
        if ok(Command::new("python3").args(["-c", "import PIL, numpy"])) {
            return Some(PathBuf::from("python3"));
        }
        let venv = crate::common::test_tmp().join("pillow-venv");
        let py = venv.join("bin/python");
        if !ok(Command::new(&py).args(["-c", "import PIL, numpy"])) {
            assert!(
                ok(Command::new("python3").args(["-m", "venv"]).arg(&venv)),
                "python3 -m venv failed"
            );
            assert!(
                ok(Command::new(&py).args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "pillow",
                    "numpy"
                ])),
                "pip install pillow numpy failed"
            );
        }
        Some(py)
    })
    .as_deref()
}

/// The oracle script: in the source tree the test was built from, or under the current
/// directory (a test binary shipped to the GPU machine runs in a copy of the tree).
fn oracle_script() -> PathBuf {
    let rel = Path::new("tests/decode/pillow_oracle.py");
    let built = crate::common::repo_root().join(rel);
    if built.exists() {
        built
    } else {
        rel.to_path_buf()
    }
}

/// Pillow's test set (made once per test run).
fn pillow_set(py: &Path, dir: &Path) -> Vec<PathBuf> {
    let st = Command::new(py)
        .arg(oracle_script())
        .arg("make")
        .arg(dir)
        .status()
        .unwrap();
    assert!(st.success(), "pillow_oracle.py make failed");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    v.sort();
    v
}

/// Mean and largest |a − b| over u8 values.
fn diff(a: &[u8], b: &[u8]) -> (f64, i32) {
    assert_eq!(a.len(), b.len());
    let mut sum = 0u64;
    let mut max = 0;
    for (x, y) in a.iter().zip(b) {
        let d = (*x as i32 - *y as i32).abs();
        sum += d as u64;
        max = max.max(d);
    }
    (sum as f64 / a.len().max(1) as f64, max)
}

#[test]
fn decode_alone_matches_pillow() {
    let Some(py) = pillow() else { return };
    let dir = disk_dir();
    let files = pillow_set(py, dir.path());
    assert!(files.len() >= 12);
    let mut d = RgbDecoder::new().unwrap();
    let mut px = Vec::new();
    for f in &files {
        let (w, h) = d.decode(&std::fs::read(f).unwrap(), &mut px).unwrap();
        let size = std::fs::read_to_string(f.with_extension("size")).unwrap();
        assert_eq!(size.trim(), format!("{w} {h}"), "{}", f.display());
        let want = std::fs::read(f.with_extension("rgb")).unwrap();
        let (mean, max) = diff(&px, &want);
        eprintln!("{}: mean {mean:.4} max {max}", f.display());
        assert!(
            mean <= DECODE_MEAN && max <= DECODE_MAX,
            "{}: decode differs from Pillow's by mean {mean:.3}, max {max}",
            f.display()
        );
    }
}

#[test]
fn header_records_agree_with_pillow() {
    use gpufeed::image::{info, ColorSpace, ImageKind, Subsampling};
    let Some(py) = pillow() else { return };
    let dir = disk_dir();
    for f in pillow_set(py, dir.path()) {
        let data = std::fs::read(&f).unwrap();
        let i = info(&data).unwrap();
        let size = std::fs::read_to_string(f.with_extension("size")).unwrap();
        assert_eq!(size.trim(), format!("{} {}", i.width, i.height));
        let pil = std::fs::read_to_string(f.with_extension("info")).unwrap();
        let v: Vec<&str> = pil.split_whitespace().collect();
        assert_eq!(i.kind, ImageKind::Jpeg);
        let cs = match v[0] {
            "L" => ColorSpace::Gray,
            "CMYK" => ColorSpace::Cmyk,
            _ => ColorSpace::Ycbcr,
        };
        // Pillow writes CMYK with libjpeg's default Adobe transform: stored as YCCK or CMYK.
        if cs == ColorSpace::Cmyk {
            assert!(
                matches!(i.colorspace, ColorSpace::Cmyk | ColorSpace::Ycck),
                "{}",
                f.display()
            );
        } else {
            assert_eq!(i.colorspace, cs, "{}", f.display());
        }
        assert_eq!(i.progressive, v[1] == "1", "{}", f.display());
        let ss = match (v[0], v[2]) {
            ("L", _) => Subsampling::Gray,
            (_, "0") => Subsampling::S444,
            (_, "1") => Subsampling::S422,
            (_, "2") => Subsampling::S420,
            _ => i.subsampling,
        };
        assert_eq!(i.subsampling, ss, "{}", f.display());
        // And libjpeg-turbo's own header reading agrees on what both read.
        let t = gpufeed::decode::jpeg_header(&data).unwrap();
        assert_eq!(
            (t.width, t.height, t.progressive),
            (i.width, i.height, i.progressive)
        );
    }
}

/// Pillow's PNGs and WebPs of the set in `dir` (made by [`pillow_set`]).
fn pillow_others(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "png" || e == "webp"))
        .collect();
    v.sort();
    v
}

/// Lossy WebP against Pillow's libwebp: image-webp's own VP8 decoder with fancy upsampling
/// (measured: identical on the test images; a margin for other libwebp versions).
const WEBP_LOSSY_MEAN: f64 = 0.5;
const WEBP_LOSSY_MAX: i32 = 2;

#[test]
fn png_and_webp_decode_as_pillow_does() {
    let Some(py) = pillow() else { return };
    let dir = disk_dir();
    pillow_set(py, dir.path());
    let files = pillow_others(dir.path());
    assert_eq!(files.len(), 9);
    let mut d = RgbDecoder::new().unwrap();
    let mut px = Vec::new();
    for f in &files {
        let (w, h) = d.decode(&std::fs::read(f).unwrap(), &mut px).unwrap();
        let size = std::fs::read_to_string(f.with_extension("size")).unwrap();
        assert_eq!(size.trim(), format!("{w} {h}"), "{}", f.display());
        let (mean, max) = diff(&px, &std::fs::read(f.with_extension("rgb")).unwrap());
        eprintln!("{}: mean {mean:.4} max {max}", f.display());
        let lossy = f.to_string_lossy().contains("webp_lossy");
        let (lm, lx) = if lossy {
            (WEBP_LOSSY_MEAN, WEBP_LOSSY_MAX)
        } else {
            (0.0, 0) // PNG and lossless WebP: exact
        };
        assert!(
            mean <= lm && max <= lx,
            "{}: differs from Pillow by mean {mean:.3}, max {max}",
            f.display()
        );
    }
    // Through the transform: the same pass as JPEGs, within the transform's tolerance (plus
    // the decoder's own distance for lossy WebP).
    let cases: Vec<(PathBuf, u64)> = files.iter().map(|f| (f.clone(), 3)).collect();
    for spec in [ImageSpec::train(64), ImageSpec::eval(64)] {
        let spec = spec.dtype(PixelType::U8).layout(Layout::Nhwc);
        for ((ours, theirs), (f, _)) in both(py, dir.path(), &spec, &cases).iter().zip(&cases) {
            let (mean, max) = diff(ours, theirs);
            let lossy = f.to_string_lossy().contains("webp_lossy");
            let (lm, lx) = if lossy {
                (
                    TRANSFORM_MEAN + WEBP_LOSSY_MEAN,
                    TRANSFORM_MAX + WEBP_LOSSY_MAX,
                )
            } else {
                (TRANSFORM_MEAN, TRANSFORM_MAX)
            };
            assert!(
                mean <= lm && max <= lx,
                "{}: mean {mean:.3}, max {max}",
                f.display()
            );
        }
    }
}

/// Decodes `file` as sample `id` through `spec` (u8, NHWC) and has Pillow do the same
/// geometry; returns (ours, Pillow's).
fn both(
    py: &Path,
    dir: &Path,
    spec: &ImageSpec,
    cases: &[(PathBuf, u64)],
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut dec = SampleDecoder::new(spec.clone()).unwrap();
    let mut ours = Vec::new();
    let mut json = Vec::new();
    for (n, (f, id)) in cases.iter().enumerate() {
        let data = std::fs::read(f).unwrap();
        let mut out = vec![0u8; dec.sample_bytes()];
        dec.decode(&data, 5, 1, *id, &mut out).unwrap();
        ours.push(out);
        let size = std::fs::read_to_string(f.with_extension("size")).unwrap();
        let mut it = size.split_whitespace().map(|v| v.parse::<u32>().unwrap());
        let wh = (it.next().unwrap(), it.next().unwrap());
        let g = spec.geometry(5, 1, *id, wh);
        let dst = dir.join(format!("case{n}.out"));
        json.push(serde_json::json!({
            "file": f, "box": g.src, "full": [g.full.0, g.full.1],
            "window": [g.window_origin.0, g.window_origin.1],
            "out": [spec.size.0, spec.size.1], "flip": g.flip, "dst": dst,
        }));
    }
    let cases_path = dir.join("cases.json");
    std::fs::write(&cases_path, serde_json::to_vec(&json).unwrap()).unwrap();
    let st = Command::new(py)
        .arg(oracle_script())
        .arg("transform")
        .arg(&cases_path)
        .status()
        .unwrap();
    assert!(st.success(), "pillow_oracle.py transform failed");
    ours.into_iter()
        .enumerate()
        .map(|(n, o)| (o, std::fs::read(dir.join(format!("case{n}.out"))).unwrap()))
        .collect()
}

#[test]
fn transforms_match_pillow_within_the_stated_tolerance() {
    let Some(py) = pillow() else { return };
    let dir = disk_dir();
    let files = pillow_set(py, dir.path());
    let cases: Vec<(PathBuf, u64)> = files
        .iter()
        .flat_map(|f| (0..6u64).map(move |id| (f.clone(), id)))
        .collect();
    for dct in [false, true] {
        for (name, spec) in [
            ("train 224", ImageSpec::train(224)),
            ("eval 224", ImageSpec::eval(224)),
            ("train 96", ImageSpec::train(96)),
            ("eval 64", ImageSpec::eval(64)),
        ] {
            let mut spec = spec.dtype(PixelType::U8).layout(Layout::Nhwc);
            spec.dct_scaling = dct;
            let (lim_mean, lim_max) = if dct {
                (DCT_MEAN, DCT_MAX)
            } else {
                (TRANSFORM_MEAN, TRANSFORM_MAX)
            };
            let (mut worst_mean, mut worst_max) = (0.0f64, 0);
            for ((ours, theirs), (f, id)) in both(py, dir.path(), &spec, &cases).iter().zip(&cases)
            {
                let (mean, max) = diff(ours, theirs);
                worst_mean = worst_mean.max(mean);
                worst_max = worst_max.max(max);
                assert!(
                    mean <= lim_mean && max <= lim_max,
                    "{name} (dct {dct}) {} sample {id}: mean {mean:.3}, max {max}",
                    f.display()
                );
            }
            eprintln!("{name} dct {dct}: worst mean {worst_mean:.4}, worst max {worst_max}");
        }
    }
}

#[test]
fn float_outputs_are_the_normalised_pixels_in_either_layout() {
    let Some(py) = pillow() else { return };
    let dir = disk_dir();
    let files = pillow_set(py, dir.path());
    let data = std::fs::read(&files[0]).unwrap();
    let base = ImageSpec::train(64);
    let mut u8d =
        SampleDecoder::new(base.clone().dtype(PixelType::U8).layout(Layout::Nhwc)).unwrap();
    let mut px = vec![0u8; u8d.sample_bytes()];
    u8d.decode(&data, 9, 0, 3, &mut px).unwrap();
    let (mean, std) = (base.mean, base.std);
    for (dtype, tol) in [
        (PixelType::F32, 0.51),
        (PixelType::F16, 0.9),
        (PixelType::Bf16, 2.6),
    ] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let mut d = SampleDecoder::new(base.clone().dtype(dtype).layout(layout)).unwrap();
            let mut out = vec![0u8; d.sample_bytes()];
            d.decode(&data, 9, 0, 3, &mut out).unwrap();
            let value = |i: usize| -> f32 {
                match dtype {
                    PixelType::F32 => f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap()),
                    PixelType::F16 => {
                        half::f16::from_le_bytes([out[i * 2], out[i * 2 + 1]]).to_f32()
                    }
                    _ => half::bf16::from_le_bytes([out[i * 2], out[i * 2 + 1]]).to_f32(),
                }
            };
            for y in 0..64 {
                for x in 0..64 {
                    for c in 0..3 {
                        let i = match layout {
                            Layout::Nchw => (c * 64 + y) * 64 + x,
                            Layout::Nhwc => (y * 64 + x) * 3 + c,
                        };
                        let back = (value(i) * std[c] + mean[c]) * 255.0;
                        let want = px[(y * 64 + x) * 3 + c] as f32;
                        assert!(
                            (back - want).abs() <= tol,
                            "{dtype:?} {layout:?} at ({x},{y},{c}): {back} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// An ImageFolder of generated JPEGs plus broken ones; returns the dir and the broken names.
fn folder_with_bad_images(root: &Path) -> (PathBuf, Vec<&'static str>) {
    let dir = root.join("images");
    gpufeed::testing::synth::write_image_folder(&dir, 60, 3).unwrap();
    let good = std::fs::read(dir.join("c0000/00000000.jpg")).unwrap();
    let bad = dir.join("c0000");
    // Truncated at 60%.
    std::fs::write(bad.join("bad-truncated.jpg"), &good[..good.len() * 6 / 10]).unwrap();
    // A JPEG signature, then garbage.
    let mut garbage = vec![0xff, 0xd8, 0xff, 0xe0];
    garbage.extend((0..4000u32).map(|i| (i * 7919 % 251) as u8));
    std::fs::write(bad.join("bad-garbage.jpg"), garbage).unwrap();
    // An HTML page saved as .jpg.
    std::fs::write(bad.join("bad-html.jpg"), b"<html><body>404</body></html>").unwrap();
    // A header declaring 60000x60000 (above the pixel limit): SOF0's height and width.
    let mut huge = good.clone();
    let sof = huge
        .windows(2)
        .position(|w| w == [0xff, 0xc0])
        .expect("baseline SOF0");
    huge[sof + 5..sof + 9].copy_from_slice(&[0xea, 0x60, 0xea, 0x60]);
    std::fs::write(bad.join("bad-huge.jpg"), huge).unwrap();
    (
        dir,
        vec![
            "bad-truncated.jpg",
            "bad-garbage.jpg",
            "bad-html.jpg",
            "bad-huge.jpg",
        ],
    )
}

/// Tensors by sample id, and (sample key, error message) pairs.
type Collected = (
    std::collections::BTreeMap<u32, Vec<u8>>,
    Vec<(String, String)>,
);

/// Every tensor of an epoch, by sample id, and the errors by file name.
fn collect(il: &gpufeed::decode::ImageLoader, epoch: u64, start: u32) -> Collected {
    let ds = il.loader().dataset().clone();
    let mut tensors = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    for b in il.epoch_from(epoch, start).unwrap() {
        let b = b.unwrap();
        let per = b.bytes().len() / b.len();
        for (i, id) in b.sample_ids().iter().enumerate() {
            let t = b.bytes()[i * per..(i + 1) * per].to_vec();
            if let Some(e) = b.error(i) {
                assert!(t.iter().all(|&v| v == 0), "a failed sample is zero-filled");
                let key = ds.key(*id as usize).to_string();
                errors.push((key, format!("{e}")));
            }
            assert!(tensors.insert(*id, t).is_none(), "sample {id} twice");
        }
    }
    (tensors, errors)
}

#[test]
fn the_loader_decodes_every_sample_once_names_bad_ones_and_is_deterministic() {
    let dir = disk_dir();
    let (images, bad) = folder_with_bad_images(dir.path());
    let ds = std::sync::Arc::new(Dataset::open(&images).unwrap());
    let n = ds.len();
    assert_eq!(n, 64);
    let spec = ImageSpec::train(48).dtype(PixelType::F16);
    let loader = |rank: u32, world: u32| {
        Loader::builder(ds.clone())
            .batch_size(7)
            .seed(11)
            .rank(rank, world)
            .build()
            .unwrap()
    };
    let one = loader(0, 1).decode_images(spec.clone().threads(1)).unwrap();
    let (t1, errors) = collect(&one, 2, 0);
    assert_eq!(t1.len(), n, "every sample exactly once");
    let mut names: Vec<&str> = errors
        .iter()
        .map(|(k, _)| k.rsplit('/').next().unwrap())
        .collect();
    names.sort();
    let mut want = bad.clone();
    want.sort();
    assert_eq!(names, want, "exactly the broken images fail: {errors:?}");
    for (k, e) in &errors {
        assert!(
            e.contains(k.as_str()) || e.contains(k.rsplit('/').next().unwrap()),
            "{e} names {k}"
        );
        assert!(e.contains("cannot decode"), "{e}");
    }
    let reason = |name: &str| &errors.iter().find(|(k, _)| k.ends_with(name)).unwrap().1;
    assert!(
        reason("bad-truncated.jpg").contains("truncated"),
        "{}",
        reason("bad-truncated.jpg")
    );
    assert!(
        reason("bad-html.jpg").contains("not an image"),
        "{}",
        reason("bad-html.jpg")
    );
    assert!(
        reason("bad-huge.jpg").contains("above the limit"),
        "{}",
        reason("bad-huge.jpg")
    );

    // Three threads: the same tensors.
    let three = loader(0, 1).decode_images(spec.clone().threads(3)).unwrap();
    assert_eq!(collect(&three, 2, 0).0, t1, "thread count changes nothing");
    // Two ranks: together the same samples, each with the same tensor.
    let mut union = std::collections::BTreeMap::new();
    for r in 0..2 {
        let il = loader(r, 2).decode_images(spec.clone().threads(2)).unwrap();
        for (id, t) in collect(&il, 2, 0).0 {
            assert!(union.insert(id, t).is_none(), "sample {id} on two ranks");
        }
    }
    assert_eq!(union, t1, "rank count changes nothing");
    // Resumed at batch 4: the rest of the epoch, the same tensors.
    let (rest, _) = collect(&one, 2, 4);
    assert_eq!(rest.len(), n - 4 * 7);
    for (id, t) in &rest {
        assert_eq!(&t1[id], t, "sample {id} differs after a resume");
    }
    // Another epoch: other crops.
    let (t3, _) = collect(&one, 3, 0);
    let differing = t1.iter().filter(|(id, t)| t3[id] != **t).count();
    assert!(
        differing > n / 2,
        "epoch 3 re-draws the crops ({differing} of {n} differ)"
    );
    // Evaluation: no randomness at all, the same for any epoch.
    let ev = loader(0, 1)
        .decode_images(ImageSpec::eval(48).dtype(PixelType::U8))
        .unwrap();
    assert_eq!(collect(&ev, 0, 0).0, collect(&ev, 1, 0).0);
}

#[test]
fn a_batch_tensor_has_the_shape_and_labels_it_claims() {
    let dir = disk_dir();
    let images = dir.path().join("images");
    gpufeed::testing::synth::write_image_folder(&images, 100, 1).unwrap();
    let loader = Loader::builder(Dataset::open(&images).unwrap())
        .batch_size(32)
        .build()
        .unwrap();
    let il = loader
        .decode_images(
            ImageSpec::eval(40)
                .dtype(PixelType::F32)
                .layout(Layout::Nchw),
        )
        .unwrap();
    let mut seen = 0;
    // The decoded batches' memory counts the tensors alive: at least the held ones', none
    // once every batch is gone.
    let tensor = 32 * 3 * 40 * 40 * 4;
    assert_eq!(il.memory().decode_bytes, 0);
    let mut epoch = il.epoch(0).unwrap();
    let (first, second) = (
        epoch.next().unwrap().unwrap(),
        epoch.next().unwrap().unwrap(),
    );
    assert!(il.memory().decode_bytes >= 2 * tensor as u64);
    assert!(epoch.stats().memory.decode_bytes >= 2 * tensor as u64);
    assert!(epoch.stats().memory.arena_bytes > 0);
    drop((first, second, epoch));
    // Jobs queued ahead go when the decode threads next take them (cancelled, not decoded).
    let t0 = std::time::Instant::now();
    while il.memory().decode_bytes != 0 && t0.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(il.memory().decode_bytes, 0);
    for b in il.epoch(0).unwrap() {
        let b = b.unwrap();
        assert_eq!(b.shape(), [b.len(), 3, 40, 40]);
        assert_eq!(b.strides(), [3 * 40 * 40, 40 * 40, 40, 1]);
        let v: &[f32] = b.view().unwrap();
        assert_eq!(v.len(), b.len() * 3 * 40 * 40);
        assert!(b.view::<u8>().is_none());
        assert_eq!(b.as_ptr() as usize % 64, 0);
        // Labels are the class folders (c0000, c0001: 50 images each).
        for (i, id) in b.sample_ids().iter().enumerate() {
            assert_eq!(b.labels()[i], (*id as i64) / 50, "sample {id}");
        }
        assert!(v.iter().all(|x| x.is_finite()));
        assert_eq!(b.errors().count(), 0);
        seen += b.len();
    }
    assert_eq!(seen, 100);
    // Bad settings are refused with a reason, not a panic.
    let e = ImageSpec::train(0).validate().unwrap_err();
    assert!(e.to_string().contains("image size"), "{e}");
    let mut bad = ImageSpec::train(8);
    bad.transform = Transform::Train {
        scale: (0.5, 0.1),
        ratio: (0.75, 1.33),
        flip_p: 0.5,
    };
    assert!(bad.validate().unwrap_err().to_string().contains("scale"));
    let dev = Loader::builder(Dataset::open(&images).unwrap())
        .device(gpufeed::Device::Simulated(gpufeed::gpu::SimDevice::new(1)))
        .build()
        .unwrap();
    // A device loader decodes on its device (tests/it/device_images.rs holds it to this
    // stage); without the host kernels in the build it says why.
    match dev.decode_images(ImageSpec::train(8)) {
        Ok(il) => assert!(il.is_device()),
        Err(e) => {
            assert!(!gpufeed::testing::host_kernels::available());
            assert!(
                e.to_string().contains("kernels are not in this build"),
                "{e}"
            );
        }
    }
}

/// Damaged images never panic the decoder: random bit flips, truncations, marker bytes and
/// length fields set huge, over JPEGs of every kind the generator makes (and Pillow's PNGs and
/// WebPs where Python is available). Each gives a decoded tensor or a reason.
#[test]
fn mutated_images_give_errors_not_panics() {
    use gpufeed::testing::Rng;
    let mut inputs: Vec<Vec<u8>> = (0..10)
        .map(|i| gpufeed::testing::synth::jpeg(9, i).unwrap())
        .collect();
    let dir = disk_dir();
    if let Some(py) = pillow() {
        pillow_set(py, dir.path());
        inputs.extend(
            pillow_others(dir.path())
                .iter()
                .map(|f| std::fs::read(f).unwrap()),
        );
    }
    let mut dec = SampleDecoder::new(ImageSpec::train(24).dtype(PixelType::U8)).unwrap();
    let mut out = vec![0u8; dec.sample_bytes()];
    let mut r = Rng::new(77);
    let (mut ok, mut failed) = (0, 0);
    for (k, base) in inputs.iter().enumerate() {
        for m in 0..120u64 {
            let mut b = base.clone();
            match m % 4 {
                0 => {
                    for _ in 0..1 + r.below(8) {
                        let at = r.below(b.len() as u64) as usize;
                        b[at] ^= 1 << r.below(8);
                    }
                }
                1 => b.truncate(r.below(b.len() as u64) as usize),
                2 => {
                    let at = r.below(b.len() as u64) as usize;
                    b[at] = 0xff;
                    if at + 1 < b.len() {
                        b[at + 1] = r.below(256) as u8;
                    }
                }
                _ => {
                    // A length or dimension field near the start set huge.
                    let at = r.below(b.len().min(600) as u64) as usize;
                    for v in b.iter_mut().skip(at).take(2) {
                        *v = 0xff;
                    }
                }
            }
            match dec.decode(&b, 1, 0, k as u64 * 1000 + m, &mut out) {
                Ok(()) => ok += 1,
                Err(e) => {
                    assert!(!e.is_empty());
                    failed += 1;
                }
            }
        }
    }
    eprintln!("{ok} decoded, {failed} refused");
    assert!(failed > 0 && ok > 0);
}

/// The damaged variants of `jpeg` the decode-state test feeds: cut at `at`, the bytes from `at`
/// zero-filled (the length kept), and the byte at `at` with one bit flipped; for every `at`
/// that `cuts` yields.
fn damaged_variants(jpeg: &[u8], cuts: impl Iterator<Item = usize>) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    for at in cuts.filter(|&a| a < jpeg.len()) {
        v.push((format!("cut at {at}"), jpeg[..at].to_vec()));
        let mut z = jpeg.to_vec();
        z[at..].fill(0);
        v.push((format!("zeroed from {at}"), z));
        let mut f = jpeg.to_vec();
        f[at] ^= 1 << (at % 8);
        v.push((format!("bit {} of byte {at} flipped", at % 8), f));
    }
    v
}

/// Every 25th byte through the headers and the first scan segment, then every `scan_step`th.
fn cut_points(len: usize, sos: usize, scan_step: usize) -> impl Iterator<Item = usize> {
    let head = (1..(sos + 200).min(len)).step_by(25);
    let scan = ((sos + 200)..len).step_by(scan_step);
    head.chain(scan)
}

/// Pillow's JPEGs by name (the set of [`pillow_set`]), or `None` without Python.
fn pillow_jpegs(dir: &Path) -> Option<BTreeMap<String, Vec<u8>>> {
    let py = pillow()?;
    Some(
        pillow_set(py, dir)
            .into_iter()
            .map(|p| {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&p).unwrap())
            })
            .collect(),
    )
}

/// The good images that follow each damaged one, round-robin: each of another size and
/// subsampling than the damaged 4:2:0 images (progressive 4:2:0 500×333, baseline 4:4:4,
/// gray, 4:2:2, CMYK, restart markers).
const GOOD_AFTER_DAMAGE: [&str; 6] = [
    "progressive",
    "s444",
    "gray",
    "s422",
    "cmyk",
    "restart_blocks",
];

/// A damaged image never damages the next one decoded on the same thread (issue 36): a
/// Pillow-written JPEG cut every 25 bytes through its headers and into its scan, zero-filled
/// and bit-flipped there, each followed by a good image of another size and subsampling, which
/// must equal its clean decode byte for byte. Before the decoder was renewed after an error,
/// TurboJPEG's header reader kept the damaged stream's state and the good image failed with
/// the damaged one's dimensions ("bad dimensions 375x500"), zero-filled.
#[test]
fn a_damaged_jpeg_never_changes_the_next_decode_on_the_thread() {
    let dir = disk_dir();
    let Some(jpegs) = pillow_jpegs(dir.path()) else {
        return;
    };
    // The whole-image decoder (bench decode's) and the training transform's.
    let spec = ImageSpec::train(48).dtype(PixelType::U8);
    let mut clean = BTreeMap::new();
    for name in GOOD_AFTER_DAMAGE {
        let mut rgb = Vec::new();
        let size = RgbDecoder::new()
            .unwrap()
            .decode(&jpegs[name], &mut rgb)
            .unwrap();
        let mut dec = SampleDecoder::new(spec.clone()).unwrap();
        let mut t = vec![0u8; dec.sample_bytes()];
        dec.decode(&jpegs[name], 5, 0, 7, &mut t).unwrap();
        clean.insert(name, (size, rgb, t));
    }
    let mut damaged = Vec::new();
    for (base, step) in [("s420_odd", 25), ("s420", 997)] {
        let j = &jpegs[base];
        let sos = j.windows(2).position(|w| w == [0xff, 0xda]).unwrap();
        for (what, bytes) in damaged_variants(j, cut_points(j.len(), sos, step)) {
            damaged.push((format!("{base}.jpg {what}"), bytes));
        }
    }
    assert!(damaged.len() > 1500, "{} damaged images", damaged.len());
    let mut rgb_dec = RgbDecoder::new().unwrap();
    let mut sample_dec = SampleDecoder::new(spec).unwrap();
    let mut out = vec![0u8; sample_dec.sample_bytes()];
    let mut rgb = Vec::new();
    let mut refused = 0;
    for (k, (what, bytes)) in damaged.iter().enumerate() {
        let name = GOOD_AFTER_DAMAGE[k % GOOD_AFTER_DAMAGE.len()];
        let (size, want_rgb, want) = &clean[name];
        let r1 = rgb_dec.decode(bytes, &mut rgb);
        let got = rgb_dec.decode(&jpegs[name], &mut rgb);
        assert_eq!(
            got.as_ref().ok(),
            Some(size),
            "{name}.jpg after {what} ({r1:?}): {got:?}"
        );
        assert!(
            rgb == *want_rgb,
            "{name}.jpg decoded differently after {what}"
        );
        let r2 = sample_dec.decode(bytes, 5, 0, 7, &mut out);
        refused += usize::from(r1.is_err()) + usize::from(r2.is_err());
        sample_dec
            .decode(&jpegs[name], 5, 0, 7, &mut out)
            .unwrap_or_else(|e| panic!("{name}.jpg after {what} ({r2:?}): {e}"));
        assert!(out == *want, "{name}.jpg's tensor differs after {what}");
    }
    eprintln!("{} damaged images, {refused} refusals", damaged.len());
    assert!(refused > damaged.len() / 2, "damaged images are refused");
}

/// Every truncated JPEG is refused as truncated, by every decode (the training transform's
/// cropped one too, whatever its crop), as `gpufeed verify` refuses it (issue 52 item 4).
/// Pillow's progressive, CMYK and baseline files, cut at each scan's boundary and inside
/// scans; and each again with two stray bytes before its second segment after the first scan
/// (libjpeg-turbo warns of "extraneous bytes", and says only its first warning). Before, a
/// cropped decode that stopped above the cut, and every decode of a file whose first warning
/// was another, gave an image with no error (the trial's blurred and grey-banded images).
#[test]
fn a_truncated_jpeg_is_refused_by_every_decode_whatever_it_warned_first() {
    let dir = disk_dir();
    let Some(jpegs) = pillow_jpegs(dir.path()) else {
        return;
    };
    let mut cut = Vec::new();
    for name in ["progressive", "progressive444", "cmyk", "s420", "gray"] {
        let j = &jpegs[name];
        let markers: Vec<usize> = (0..j.len() - 1)
            .filter(|&k| j[k] == 0xff && matches!(j[k + 1], 0xda | 0xc4))
            .collect();
        let first_scan = markers.iter().copied().find(|&k| j[k + 1] == 0xda).unwrap();
        // The first segment after the first scan's data (a later scan or its table), if any.
        let next = markers.iter().copied().find(|&k| k > first_scan + 2);
        let mut variants = vec![(String::new(), j.clone())];
        if let Some(at) = next {
            let mut stray = j[..at].to_vec();
            stray.extend([0x00, 0x00]);
            stray.extend(&j[at..]);
            variants.push((" with stray bytes".into(), stray));
        }
        for (what, v) in variants {
            let len = v.len();
            let mut ats: Vec<usize> = (0..len - 1)
                .filter(|&k| v[k] == 0xff && matches!(v[k + 1], 0xda | 0xc4) && k > first_scan)
                .collect();
            ats.extend([first_scan + 40, len / 2, len * 3 / 4, len - 1]);
            for at in ats {
                cut.push((
                    format!("{name}.jpg{what} cut at {at} of {len}"),
                    v[..at].to_vec(),
                ));
            }
            // The whole file decodes (the stray bytes are only a warning).
            let mut rgb = Vec::new();
            RgbDecoder::new()
                .unwrap()
                .decode(&v, &mut rgb)
                .unwrap_or_else(|e| panic!("{name}.jpg{what}: {e}"));
        }
    }
    assert!(cut.len() > 40, "{} cut files", cut.len());
    let mut rgb_dec = RgbDecoder::new().unwrap();
    let mut rgb = Vec::new();
    let mut train = SampleDecoder::new(ImageSpec::train(48).dtype(PixelType::U8)).unwrap();
    let mut eval = SampleDecoder::new(ImageSpec::eval(48).dtype(PixelType::U8)).unwrap();
    let mut out = vec![0u8; train.sample_bytes()];
    for (what, bytes) in &cut {
        assert!(
            gpufeed::image::check(bytes, gpufeed::image::ImageKind::Jpeg).is_err(),
            "verify passed {what}"
        );
        let e = rgb_dec.decode(bytes, &mut rgb).expect_err(what);
        assert!(e.to_string().contains("truncated"), "{what}: {e}");
        let e = eval.decode(bytes, 5, 0, 7, &mut out).expect_err(what);
        assert!(e.to_string().contains("truncated"), "{what}: {e}");
        // Many crops: one above the cut decodes nothing the cut took.
        for id in 0..24 {
            let e = train
                .decode(bytes, 5, 0, id, &mut out)
                .expect_err(&format!("{what}, crop of sample {id}"));
            assert!(e.to_string().contains("truncated"), "{what}: {e}");
        }
    }
}

/// Stray bytes before the first scan's marker (some cameras' and editors' files) are a warning,
/// as libjpeg and Pillow take them: the image decodes as it does without them, by every decode,
/// and `verify` passes it (third trial: refused with "Corrupt JPEG data: 3 extraneous bytes
/// before marker 0xda").
#[test]
fn stray_bytes_before_the_first_scan_decode_as_without_them() {
    let dir = disk_dir();
    let Some(jpegs) = pillow_jpegs(dir.path()) else {
        return;
    };
    let spec = ImageSpec::train(48).dtype(PixelType::U8);
    for name in ["s420", "progressive", "cmyk", "gray", "restart_blocks"] {
        let j = &jpegs[name];
        let sos = j.windows(2).position(|w| w == [0xff, 0xda]).unwrap();
        let mut stray = j[..sos].to_vec();
        stray.extend([0x00, 0x13, 0x37]);
        stray.extend(&j[sos..]);
        gpufeed::image::check(&stray, gpufeed::image::ImageKind::Jpeg)
            .unwrap_or_else(|e| panic!("verify refused {name}.jpg with stray bytes: {e}"));
        let (mut want, mut got) = (Vec::new(), Vec::new());
        let mut d = RgbDecoder::new().unwrap();
        let size = d.decode(j, &mut want).unwrap();
        let got_size = d
            .decode(&stray, &mut got)
            .unwrap_or_else(|e| panic!("{name}.jpg with stray bytes: {e}"));
        assert_eq!((got_size, &got), (size, &want), "{name}.jpg");
        let mut dec = SampleDecoder::new(spec.clone()).unwrap();
        let (mut a, mut b) = (vec![0u8; dec.sample_bytes()], vec![0u8; dec.sample_bytes()]);
        dec.decode(j, 5, 0, 7, &mut a).unwrap();
        dec.decode(&stray, 5, 0, 7, &mut b)
            .unwrap_or_else(|e| panic!("{name}.jpg with stray bytes, cropped: {e}"));
        assert!(a == b, "{name}.jpg's tensor differs with stray bytes");
    }
}

/// The same through image loaders on one decode thread, in sequential order, on the host and
/// on the simulated device (whose hardware route decodes with libjpeg-turbo standing in for
/// nvJPEG, on the decode thread): a folder alternating damaged and good images. Every good
/// image's tensor equals its tensor from a folder of good images alone; every damaged one that
/// fails is named, and no good one.
#[test]
fn a_damaged_jpeg_never_changes_the_next_image_in_a_loader() {
    let dir = disk_dir();
    let Some(jpegs) = pillow_jpegs(&dir.path().join("pillow")) else {
        return;
    };
    let j = &jpegs["s420_odd"];
    let sos = j.windows(2).position(|w| w == [0xff, 0xda]).unwrap();
    let damaged = damaged_variants(j, cut_points(j.len(), sos, 400));
    let (mixed, alone) = (dir.path().join("mixed"), dir.path().join("alone"));
    std::fs::create_dir_all(mixed.join("c")).unwrap();
    std::fs::create_dir_all(alone.join("c")).unwrap();
    for name in GOOD_AFTER_DAMAGE {
        std::fs::write(alone.join(format!("c/{name}.jpg")), &jpegs[name]).unwrap();
    }
    for (k, (_, bytes)) in damaged.iter().enumerate() {
        let name = GOOD_AFTER_DAMAGE[k % GOOD_AFTER_DAMAGE.len()];
        std::fs::write(mixed.join(format!("c/{k:05}-a-bad.jpg")), bytes).unwrap();
        std::fs::write(mixed.join(format!("c/{k:05}-b-{name}.jpg")), &jpegs[name]).unwrap();
    }
    // Eval: the tensor depends on the image alone, not on its sample id.
    let mut spec = ImageSpec::eval(40).dtype(PixelType::U8).threads(1);
    spec.dct_scaling = false;
    let sim = gpufeed::testing::host_kernels::available();
    if !sim {
        eprintln!("the simulated device's part skipped: its kernels are not built (no C++)");
    }
    for device in [false, true].into_iter().filter(|&d| !d || sim) {
        let run = |root: &Path| {
            let mut b = Loader::builder(Arc::new(Dataset::open(root).unwrap()))
                .batch_size(7)
                .order(gpufeed::Order::Sequential);
            if device {
                b = b.device(gpufeed::Device::Simulated(gpufeed::gpu::SimDevice::new(3)));
            }
            let il = b.build().unwrap().decode_images(spec.clone()).unwrap();
            assert_eq!(il.is_device(), device);
            let ds = il.loader().dataset().clone();
            let mut out = BTreeMap::new();
            for b in il.epoch(0).unwrap() {
                let b = b.unwrap();
                let all = b.to_host().unwrap();
                let per = all.len() / b.len();
                for (i, &id) in b.sample_ids().iter().enumerate() {
                    let key = ds.key(id as usize).rsplit('/').next().unwrap().to_string();
                    let err = b.error(i).map(|e| e.to_string());
                    out.insert(key, (all[i * per..(i + 1) * per].to_vec(), err));
                }
            }
            out
        };
        let want = run(&alone);
        let got = run(&mixed);
        assert_eq!(got.len(), 2 * damaged.len());
        let mut refused = 0;
        for (key, (t, err)) in &got {
            if key.contains("-a-bad") {
                refused += usize::from(err.is_some());
                continue;
            }
            let name = key.split("-b-").nth(1).unwrap();
            let k: usize = key[..5].parse().unwrap();
            assert!(
                err.is_none(),
                "device {device}: {key} after {}: {}",
                damaged[k].0,
                err.as_deref().unwrap_or("")
            );
            assert!(
                *t == want[name].0,
                "device {device}: {key} differs from its clean decode after {}",
                damaged[k].0
            );
        }
        eprintln!(
            "device {device}: {} damaged images, {refused} refused",
            damaged.len()
        );
        assert!(refused > damaged.len() / 2);
    }
}

/// `examples/train_images.rs`, the Rust training loop, trains two epochs on generated JPEGs
/// and a truncated one, is stopped after 4 steps and run again: it resumes at batch 4 of epoch
/// 0, and each epoch trains on every good image exactly once across the interruption (the
/// damaged one never, named on stderr).
#[test]
fn the_rust_training_example_resumes_and_skips_a_damaged_image() {
    // Examples are built beside the test binaries (`target/release/examples`).
    let exe = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .map(|p| p.join("examples/train_images"))
        .unwrap();
    if !exe.exists() {
        // `cargo test --test it` builds no examples: build this one.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--release", "--example", "train_images"])
            .current_dir(crate::common::repo_root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = disk_dir();
    let data = dir.path().join("jpegs");
    gpufeed::testing::synth::write_image_folder(&data, 60, 3).unwrap();
    let good = std::fs::read(data.join("c0000/00000000.jpg")).unwrap();
    std::fs::write(data.join("c0000/zz-cut.jpg"), &good[..good.len() / 3]).unwrap();
    let ckpt = dir.path().join("run.ckpt");
    let ids = dir.path().join("ids.txt");
    let run = |extra: &[&str]| {
        Command::new(&exe)
            .arg(&data)
            .args([
                "--epochs",
                "2",
                "--batch",
                "8",
                "--size",
                "16",
                "--save-every",
                "3",
            ])
            .arg("--checkpoint")
            .arg(&ckpt)
            .arg("--log-ids")
            .arg(&ids)
            .args(extra)
            .env("GPUFEED_QUIET", "1")
            .output()
            .unwrap()
    };
    let first = run(&["--stop-after", "4"]);
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{err}");
    assert!(
        err.contains("stopped after 4 steps (epoch 0, next batch 4)"),
        "{err}"
    );
    let second = run(&[]);
    let (out, err) = (
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr),
    );
    assert!(second.status.success(), "{out}{err}");
    assert!(err.contains("resuming epoch 0 at batch 4"), "{err}");
    assert!(out.contains("epoch 1: mean loss"), "{out}");
    assert!(
        err.contains("zz-cut.jpg"),
        "the damaged image is named: {err}"
    );
    let mut per_epoch: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for line in std::fs::read_to_string(&ids).unwrap().lines() {
        let mut it = line.split(' ');
        let e: u64 = it.next().unwrap().parse().unwrap();
        per_epoch.entry(e).or_default().extend(
            it.filter(|s| !s.is_empty())
                .map(|s| s.parse::<u32>().unwrap()),
        );
    }
    assert_eq!(per_epoch.len(), 2, "{per_epoch:?}");
    for (e, mut v) in per_epoch {
        v.sort();
        let n = v.len();
        v.dedup();
        assert_eq!((n, v.len()), (60, 60), "epoch {e}: every good image once");
    }
}
