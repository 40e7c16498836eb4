//! The Python package: `pip install ./python` into a fresh virtualenv (with numpy), then its
//! tests (`python/tests/test_loader.py`) over datasets made here. Needs python3 with venv and
//! PyPI (CI has both); `GPUFEED_SKIP_PYTHON=1` skips it, saying so.
//!
//! (Named so that it sorts first: the suite's tests start in name order, and this one — a wheel
//! built, packages installed from PyPI — is its longest; started last it was the suite's tail.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpufeed::dataset::shard::ShardWriter;
use gpufeed::Dataset;

use crate::common::*;

fn root() -> PathBuf {
    crate::common::repo_root()
}

fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| ((i * 7 + j * 13) % 256) as u8).collect()
}

/// Two shards of `per` samples each in `dir`: sample `i` has key `i`, `content(i, len)` and
/// `(label, len) = shape(i)`.
fn two_shards(dir: &Path, per: usize, shape: impl Fn(usize) -> (usize, usize)) {
    std::fs::create_dir_all(dir).unwrap();
    for s in 0..2 {
        let p = dir.join(format!("shard-{s:05}.gpf"));
        let mut w = ShardWriter::create(&p, 1).unwrap();
        for i in s * per..(s + 1) * per {
            let (label, len) = shape(i);
            w.add(&i.to_string(), label as i64, &[], &content(i, len))
                .unwrap();
        }
        w.finish().unwrap();
    }
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
    let s = ds.sample(victim);
    let shard = ds.file(s.file).path.to_path_buf();
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[s.offset as usize + s.len as usize / 2] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    let name = shard.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::write(dir.join("corrupt.txt"), format!("{name} {victim}")).unwrap();
    // 104 samples (13 batches of 8, or of 4 a rank over 2), as bytes and as JPEGs: the slow and
    // pausing consumers of test_training.py.
    two_shards(&dir.join("slow-bytes"), 52, |i| {
        (i % 5, 1 + (i * 7919) % 30_000)
    });
    gpufeed::testing::synth::write_image_folder(&dir.join("slow-images"), 104, 7).unwrap();
    // 2,000 small samples in two shards (the last-batch acceptance: batches of 64).
    two_shards(&dir.join("d2000"), 1000, |i| (i % 10, 1 + i % 97));
    // A token corpus of 1,985 uint16 tokens below 256 (62 windows of 32 + 1), as a flat file
    // (nanoGPT's train.bin) and as a Megatron prefix of 9 documents (megatron-core's layout).
    let toks: Vec<u16> = (0..1985u32)
        .map(|i| ((i * 7 + i / 31) % 256) as u16)
        .collect();
    let bytes: Vec<u8> = toks.iter().flat_map(|t| t.to_le_bytes()).collect();
    let tdir = dir.join("tokens");
    std::fs::create_dir_all(&tdir).unwrap();
    std::fs::write(tdir.join("train.bin"), &bytes).unwrap();
    let prefix = tdir.join("corpus_text_document");
    std::fs::write(prefix.with_extension("bin"), &bytes).unwrap();
    let cuts = [0usize, 100, 350, 351, 800, 1200, 1500, 1900, 1950, 1985];
    let mut idx = b"MMIDIDX\0\0".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(8); // uint16
    let seqs = cuts.len() - 1;
    idx.extend((seqs as u64).to_le_bytes());
    idx.extend((seqs as u64 + 1).to_le_bytes());
    for w in cuts.windows(2) {
        idx.extend(((w[1] - w[0]) as i32).to_le_bytes());
    }
    for w in cuts.windows(2) {
        idx.extend(((w[0] * 2) as i64).to_le_bytes());
    }
    for d in 0..=seqs {
        idx.extend((d as i64).to_le_bytes());
    }
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
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

/// `examples/train_images.py` (the numpy backend: no torch in CI) trains two epochs on the
/// generated JPEGs, is stopped after 6 steps (just after a checkpoint) and run again: it resumes
/// there, and each epoch sees every image exactly once across the interruption. The same for
/// `examples/train_tokens.py` over a flat token file and a Megatron prefix.
fn train_example_resumes(py: &Path, dir: &Path) {
    let images = ["--batch-size", "8", "--size", "32"];
    example_resumes(
        py,
        dir,
        "train_images.py",
        "data/slow-images",
        &images,
        104,
        "images",
    );
    let tokens = ["--batch-size", "6", "--seq-len", "32", "--vocab", "256"];
    example_resumes(
        py,
        dir,
        "train_tokens.py",
        "data/tokens/train.bin",
        &tokens,
        62,
        "windows",
    );
    example_resumes(
        py,
        dir,
        "train_tokens.py",
        "data/tokens/corpus_text_document",
        &tokens,
        62,
        "windows",
    );
}

/// Runs `examples/SCRIPT` over `data` (under `dir`) with the numpy backend for two epochs,
/// stopped after 6 steps and resumed: each epoch's `samples` ids each exactly once.
fn example_resumes(
    py: &Path,
    dir: &Path,
    script: &str,
    data: &str,
    extra_args: &[&str],
    samples: u64,
    what: &str,
) {
    let data = dir.join(data);
    let tag =
        script.trim_end_matches(".py").to_string() + &data.file_name().unwrap().to_string_lossy();
    let ckpt = dir.join(format!("{tag}.ckpt"));
    let ids = dir.join(format!("{tag}-ids.jsonl"));
    let example = |extra: &[&str]| {
        let mut c = Command::new(py);
        c.arg(root().join("examples").join(script))
            .arg(&data)
            .args(["--backend", "numpy", "--epochs", "2"])
            .args(extra_args)
            .args(["--save-every", "3", "--checkpoint"])
            .arg(&ckpt)
            .arg("--log-ids")
            .arg(&ids)
            .args(extra)
            .env("GPUFEED_QUIET", "1");
        c.output().unwrap()
    };
    let first = example(&["--stop-after", "6"]);
    let out = String::from_utf8_lossy(&first.stdout);
    assert_eq!(
        first.status.code(),
        Some(3),
        "{script}: {out}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(out.contains("stopping after 6 steps"), "{script}: {out}");
    let second = example(&[]);
    let out = String::from_utf8_lossy(&second.stdout);
    assert!(
        second.status.success(),
        "{script}: {out}{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        out.contains("resuming at epoch 0, batch 6"),
        "{script}: {out}"
    );
    assert!(
        out.contains(&format!("epoch 1: {samples} {what}")),
        "{script}: {out}"
    );
    let mut per_epoch: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in std::fs::read_to_string(&ids).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let e = per_epoch.entry(v["epoch"].as_u64().unwrap()).or_default();
        e.extend(
            v["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap()),
        );
    }
    assert_eq!(per_epoch.len(), 2, "{script}: two epochs");
    for (e, mut seen) in per_epoch {
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..samples).collect::<Vec<_>>(),
            "{script} {}: epoch {e}: every sample once",
            data.display()
        );
    }
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
    // The unittest modules to run (all by default; GPUFEED_PY_TESTS narrows them), and the
    // Python to run them with: a fresh virtualenv with the package pip-installed, unless
    // GPUFEED_PYTHON names one that has gpufeed already (a developer's, with torch).
    let modules: Vec<String> = match std::env::var("GPUFEED_PY_TESTS") {
        Ok(v) => v.split_whitespace().map(String::from).collect(),
        Err(_) => [
            "test_loader",
            "test_formats",
            "test_images",
            "test_training",
        ]
        .map(String::from)
        .to_vec(),
    };
    let unittests = |py: &Path| {
        run(
            Command::new(py)
                .args(["-m", "unittest", "-v"])
                .args(&modules)
                .current_dir(root().join("python/tests"))
                .env("GPUFEED_TEST_DATA", dir.path().join("data"))
                .env("GPUFEED_BIN", gpufeed_bin())
                .env("GPUFEED_QUIET", "1"),
            "python tests",
        )
    };
    if let Some(py) = std::env::var_os("GPUFEED_PYTHON") {
        unittests(Path::new(&py));
        train_example_resumes(Path::new(&py), dir.path());
        return;
    }
    let venv = dir.path().join("venv");
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    let py = venv.join("bin/python");
    // As a user would: the wheel `scripts/build-wheel.sh` makes, installed by a pip that sees
    // no Rust toolchain, cmake or NASM (an empty PATH), and may not build gpufeed from source.
    let wheels = dir.path().join("dist");
    let built = Command::new(root().join("scripts/build-wheel.sh"))
        .arg(&wheels)
        .env("CARGO_TERM_COLOR", "never")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "scripts/build-wheel.sh:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wheel = String::from_utf8_lossy(&built.stdout).trim().to_string();
    assert!(
        wheel.contains("manylinux") && wheel.ends_with(".whl"),
        "a manylinux wheel: {wheel}"
    );
    let bare = dir.path().join("bare-path");
    std::fs::create_dir_all(&bare).unwrap();
    run(
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--only-binary",
                "gpufeed",
            ])
            .arg(&wheel)
            // numpy for the tests; the `tfrecord` package (and Pillow for its JPEGs) writes the
            // ImageNet-style TFRecord set, as a user's TensorFlow-era pipeline would have.
            // mypy checks the type stubs (image batches' `.images` seen without a cast).
            .args(["numpy", "tfrecord", "Pillow", "mypy"])
            .env("PATH", &bare),
        "pip install gpufeed-*.whl numpy tfrecord Pillow mypy (no cargo, cmake or nasm on PATH)",
    );
    run(
        Command::new(&py)
            .args([
                "-m",
                "mypy",
                "--strict",
                "--warn-unused-ignores",
                "--no-incremental",
            ])
            // Its cache in the scratch directory, not the checkout (the cwd Cargo gives a test).
            .arg("--cache-dir")
            .arg(dir.path().join("mypy-cache"))
            .arg(root().join("python/tests/typing_check.py")),
        "mypy over python/tests/typing_check.py (the stubs)",
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
            // The .pyc files under the scratch directory, not beside the sources.
            .env("PYTHONPYCACHEPREFIX", dir.path().join("pycache"))
            .arg(root().join("examples/train_torch.py"))
            .arg(root().join("examples/train_torch_dataloader.py"))
            .arg(root().join("examples/train_images.py"))
            .arg(root().join("examples/train_tokens.py"))
            .arg(root().join("scripts/bench-python.py")),
        "py_compile examples",
    );
    train_example_resumes(&py, dir.path());
    unittests(&py);
}
