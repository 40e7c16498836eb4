//! The Python package: `pip install ./python` into a fresh virtualenv (with numpy), then its
//! tests (`python/tests/test_loader.py`) over datasets made here. Needs python3 with venv and
//! PyPI (CI has both); `GPUFEED_SKIP_PYTHON=1` skips it, saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpufeed::dataset::shard::ShardWriter;
use gpufeed::Dataset;

use crate::common::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| ((i * 7 + j * 13) % 256) as u8).collect()
}

/// `dir/good` (two shards), `dir/corrupt` (the same, one sample damaged), `samples.txt`
/// (key and length per sample), `corrupt.txt` (shard name and sample index).
fn make_data(dir: &Path) {
    // 240 samples: 3 ranks × batches of 8 × 10, so every rank's epoch is exactly a third.
    let mut list = String::new();
    for name in ["good", "corrupt"] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        for s in 0..2 {
            let p = dir.join(name).join(format!("shard-{s:05}.gpf"));
            let mut w = ShardWriter::create(&p, 1).unwrap();
            for i in s * 120..(s + 1) * 120 {
                let len = 1 + (i * 7919) % 20_000;
                w.add(&i.to_string(), (i % 5) as i64, &[], &content(i, len))
                    .unwrap();
                if name == "good" {
                    list.push_str(&format!("{i} {len}\n"));
                }
            }
            w.finish().unwrap();
        }
    }
    std::fs::write(dir.join("samples.txt"), list).unwrap();
    let ds = Dataset::open(dir.join("corrupt")).unwrap();
    let victim = 157;
    let s = *ds.sample(victim);
    let shard = ds.files()[s.file as usize].path.to_path_buf();
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[s.offset as usize + s.len as usize / 2] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    let name = shard.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::write(dir.join("corrupt.txt"), format!("{name} {victim}")).unwrap();
    // 2,000 small samples in two shards (the last-batch acceptance: batches of 64).
    std::fs::create_dir_all(dir.join("d2000")).unwrap();
    for s in 0..2 {
        let p = dir.join("d2000").join(format!("shard-{s:05}.gpf"));
        let mut w = ShardWriter::create(&p, 1).unwrap();
        for i in s * 1000..(s + 1) * 1000 {
            w.add(
                &i.to_string(),
                (i % 10) as i64,
                &[],
                &content(i, 1 + i % 97),
            )
            .unwrap();
        }
        w.finish().unwrap();
    }
}

/// The ImageNet-style TFRecord set the `tfrecord` package wrote (`make_imagenet_tfrecord.py`)
/// read through the crate: every sample is its Example's JPEG, byte for byte, with its label,
/// scanned or through the package's index; `label_offset` shifts the labels; `gpufeed pack`
/// keeps payload and label; raw records are the whole Examples.
fn check_tfrecord_set(root: &Path) {
    use gpufeed::dataset::{Format, OpenOptions};
    let labels: Vec<i64> = std::fs::read_to_string(root.join("labels.txt"))
        .unwrap()
        .lines()
        .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    let expected = |k: usize| std::fs::read(root.join(format!("expected/{k:06}.jpg"))).unwrap();
    let records = root.join("records");
    let mut opts = OpenOptions::default();
    opts.set("format", "tfrecord").unwrap();
    let epoch = |ds: Dataset| -> Vec<(u32, Vec<u8>, i64)> {
        let loader = gpufeed::Loader::builder(ds).batch_size(7).build().unwrap();
        let mut out = Vec::new();
        for b in loader.epoch(0).unwrap() {
            let b = b.unwrap();
            for (j, &id) in b.sample_ids().iter().enumerate() {
                out.push((id, b.sample(j).unwrap().to_vec(), b.labels()[j]));
            }
        }
        out.sort_by_key(|x| x.0);
        out
    };
    for with_index in [false, true] {
        let mut o = opts.clone();
        if with_index {
            o.set("tfrecord_index", &root.join("index").display().to_string())
                .unwrap();
        }
        let ds = Dataset::open_with(&records, &o).unwrap();
        assert_eq!(ds.format(), Format::TfRecord);
        assert_eq!(ds.len(), labels.len());
        let got = epoch(ds);
        assert_eq!(got.len(), labels.len());
        for (id, bytes, label) in &got {
            let k = *id as usize;
            assert!(
                bytes == &expected(k),
                "record {k}: not the JPEG the writer stored"
            );
            assert_eq!(&bytes[..2], b"\xff\xd8");
            assert_eq!(*label, labels[k], "record {k}");
        }
    }
    // label_offset 1: TensorFlow's 1-based labels become 0-based.
    let mut o = opts.clone();
    o.set("label_offset", "1").unwrap();
    for (id, _, label) in epoch(Dataset::open_with(&records, &o).unwrap()) {
        assert_eq!(label, labels[id as usize] - 1);
    }
    // Raw records: the whole serialized Example, which holds the JPEG.
    let mut o = opts.clone();
    o.set("tfrecord_payload", "none").unwrap();
    for (id, bytes, label) in epoch(Dataset::open_with(&records, &o).unwrap()) {
        let jpeg = expected(id as usize);
        assert!(bytes.len() > jpeg.len() && bytes.windows(jpeg.len()).any(|w| w == jpeg));
        assert_eq!(label, -1);
    }
    // pack keeps payload and label.
    let packed = root.join("packed");
    let out = Command::new(gpufeed_bin())
        .env("GPUFEED_QUIET", "1")
        .args(["pack", "--format", "tfrecord", "--label-offset", "1"])
        .arg(&records)
        .arg(&packed)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (id, bytes, label) in epoch(Dataset::open(&packed).unwrap()) {
        assert!(bytes == expected(id as usize));
        assert_eq!(label, labels[id as usize] - 1);
    }
}

fn run(c: &mut Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    eprintln!("{what}:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn python_package_installs_and_passes_its_tests() {
    if std::env::var_os("GPUFEED_SKIP_PYTHON").is_some() {
        eprintln!("skipped: GPUFEED_SKIP_PYTHON is set");
        return;
    }
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 is not installed (CI installs it)");
        return;
    }
    let dir = disk_dir();
    make_data(&dir.path().join("data"));
    let venv = dir.path().join("venv");
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    let py = venv.join("bin/python");
    // As a user would: `pip install ./python` (maturin builds the extension).
    run(
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(root().join("python"))
            // numpy for the tests; the `tfrecord` package (and Pillow for its JPEGs) writes the
            // ImageNet-style TFRecord set, as a user's TensorFlow-era pipeline would have.
            .args(["numpy", "tfrecord", "Pillow"])
            .env("CARGO_TERM_COLOR", "never"),
        "pip install ./python numpy tfrecord Pillow",
    );
    let tfr = dir.path().join("data/imagenet-tfrecord");
    run(
        Command::new(&py)
            .arg(root().join("python/tests/make_imagenet_tfrecord.py"))
            .arg(&tfr)
            .arg("60"),
        "make_imagenet_tfrecord.py (the tfrecord package's writer)",
    );
    check_tfrecord_set(&tfr);
    // The examples and the bench script at least compile (torch is not needed to check that).
    run(
        Command::new(&py)
            .args(["-m", "py_compile"])
            .arg(root().join("examples/train_torch.py"))
            .arg(root().join("examples/train_torch_dataloader.py"))
            .arg(root().join("scripts/bench-python.py")),
        "py_compile examples",
    );
    run(
        Command::new(&py)
            .args([
                "-m",
                "unittest",
                "-v",
                "test_loader",
                "test_formats",
                "test_images",
            ])
            .current_dir(root().join("python/tests"))
            .env("GPUFEED_TEST_DATA", dir.path().join("data"))
            .env("GPUFEED_BIN", gpufeed_bin())
            .env("GPUFEED_QUIET", "1"),
        "python tests",
    );
}
