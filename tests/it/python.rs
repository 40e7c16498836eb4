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
            .arg("numpy")
            .env("CARGO_TERM_COLOR", "never"),
        "pip install ./python numpy",
    );
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
            .args(["-m", "unittest", "-v", "test_loader"])
            .current_dir(root().join("python/tests"))
            .env("GPUFEED_TEST_DATA", dir.path().join("data"))
            .env("GPUFEED_QUIET", "1"),
        "python tests",
    );
}
