//! Never silent, never an internal error (issue 11): problems reach every API, directory
//! detection refuses to guess, index files by their common names, CLI habits of a Unix tool,
//! keys and locations that point at the right record, empty is not broken.

use std::path::Path;
use std::process::{Command, Stdio};

use gpufeed::dataset::{Format, OpenOptions};
use gpufeed::Dataset;

use crate::common::*;

fn gpufeed() -> Command {
    let mut c = Command::new(gpufeed_bin());
    c.env("GPUFEED_QUIET", "1");
    c
}

/// `n` TFRecord Examples in `path`, with `tfrecord2idx`'s index written to `index` if given.
fn tfrecord(path: &Path, n: usize, index: Option<&Path>) {
    let mut f = Vec::new();
    let mut idx = String::new();
    for i in 0..n {
        let start = f.len();
        f.extend(tf_record(&tf_example(&vec![i as u8; 100 + i], i as i64)));
        idx.push_str(&format!("{start} {}\n", f.len() - start));
    }
    std::fs::write(path, f).unwrap();
    if let Some(i) = index {
        std::fs::write(i, idx).unwrap();
    }
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let dir = disk_dir();
    let p = dir.path().join("a.tfrecord");
    tfrecord(&p, 50, None);
    for args in [&["inspect"][..], &["inspect", "--json"], &["verify"]] {
        let mut child = gpufeed()
            .args(args)
            .arg(&p)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before the first line
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn directories_are_never_guessed_wrong() {
    let dir = disk_dir();
    let root = dir.path().join("tree");
    // Subfolders of TFRecord files (and an index folder): not an ImageFolder of records.
    for split in ["train", "val"] {
        std::fs::create_dir_all(root.join(split)).unwrap();
        tfrecord(&root.join(format!("{split}/part-0.tfrecord")), 5, None);
    }
    let e = Dataset::open(&root).unwrap_err().to_string();
    assert!(e.contains("ambiguous") || e.contains("no samples"), "{e}");
    assert!(e.contains("tfrecord"), "{e}");
    assert!(e.contains("--format"), "{e}");
    // Named, the format searches the tree.
    let mut o = OpenOptions::default();
    o.set("format", "tfrecord").unwrap();
    let ds = Dataset::open_with(&root, &o).unwrap();
    assert_eq!(
        (ds.format(), ds.len(), ds.files().len()),
        (Format::TfRecord, 10, 2)
    );

    // Images mixed with TFRecords: refused, listing both, unless image-folder is named.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir_all(mixed.join("cat")).unwrap();
    std::fs::write(mixed.join("cat/1.jpg"), b"\xff\xd8\xff\xd9").unwrap();
    tfrecord(&mixed.join("cat/x.tfrecord"), 3, None);
    let e = Dataset::open(&mixed).unwrap_err().to_string();
    assert!(
        e.contains("ambiguous") && e.contains("1 image") && e.contains("tfrecord"),
        "{e}"
    );
    let mut o = OpenOptions::default();
    o.set("format", "image-folder").unwrap();
    let ds = Dataset::open_with(&mixed, &o).unwrap();
    assert_eq!(ds.len(), 1);
    assert!(ds.notes()[0].contains(".tfrecord"), "{:?}", ds.notes());

    // A file that is not an image never becomes an image sample by its folder.
    let imgs = dir.path().join("imgs");
    std::fs::create_dir_all(imgs.join("dog")).unwrap();
    std::fs::write(imgs.join("dog/1.JPEG"), b"\xff\xd8\xff\xd9").unwrap();
    std::fs::write(imgs.join("dog/2.png"), b"\x89PNG").unwrap();
    std::fs::write(imgs.join("dog/notes.txt"), b"hello").unwrap();
    std::fs::write(imgs.join("dog/Thumbs.db"), b"x").unwrap();
    let ds = Dataset::open(&imgs).unwrap();
    assert_eq!(ds.format(), Format::ImageFolder);
    assert_eq!(ds.len(), 2);
    assert!(
        ds.notes()[0].contains("2 file(s) that are not images"),
        "{:?}",
        ds.notes()
    );
}

#[test]
fn tfrecord_indexes_by_their_common_names_and_lying_ones_fail_inspect() {
    let dir = disk_dir();
    for (name, idx) in [
        ("a.tfrecord", "a.tfrecord.idx"),
        ("b.tfrecord", "b.tfindex"), // the `tfrecord` package's create_indices
        ("c.tfrecord", "c.tfrecord.tfindex"),
        ("d.tfrecord", "d.idx"),
    ] {
        let sub = dir.path().join(name.replace('.', "_"));
        std::fs::create_dir_all(&sub).unwrap();
        tfrecord(&sub.join(name), 6, Some(&sub.join(idx)));
        // The index is used: a lie in it shows (the third record said to be one byte shorter).
        let text = std::fs::read_to_string(sub.join(idx)).unwrap();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        let f: Vec<u64> = lines[2].split(' ').map(|x| x.parse().unwrap()).collect();
        lines[2] = format!("{} {}", f[0], f[1] - 1);
        std::fs::write(sub.join(idx), lines.join("\n")).unwrap();
        let ds = Dataset::open(sub.join(name)).unwrap();
        assert!(ds.problems_total() > 0, "{name}: index {idx} was not used");
        let e = &ds.problems()[0];
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert_eq!(e.path(), Some(sub.join(idx).as_path()));
        // inspect says so with its exit status, as verify does.
        let o = gpufeed()
            .arg("inspect")
            .arg(sub.join(name))
            .output()
            .unwrap();
        assert!(
            !o.status.success(),
            "{name}: inspect exited 0 on a lying index"
        );
        assert!(String::from_utf8_lossy(&o.stderr).contains("does not fit"));
        let o = gpufeed()
            .args(["inspect", "--json"])
            .arg(sub.join(name))
            .output()
            .unwrap();
        assert!(!o.status.success());
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(j["problems"].as_u64().unwrap() > 0);
    }
}

#[test]
fn tfrecord_keys_number_records_within_their_file() {
    let dir = disk_dir();
    let (a, b) = (dir.path().join("a.tfrecord"), dir.path().join("b.tfrecord"));
    tfrecord(&a, 4, None);
    tfrecord(&b, 3, None);
    let ds = Dataset::open_many(&[a, b], &OpenOptions::default()).unwrap();
    assert_eq!(ds.len(), 7);
    assert_eq!(ds.key(0), "a.tfrecord#0@0");
    assert!(ds.key(3).starts_with("a.tfrecord#3@"), "{}", ds.key(3));
    assert_eq!(ds.key(4), "b.tfrecord#0@0"); // not #4: the record's number in its file
    assert!(ds.key(6).starts_with("b.tfrecord#2@"), "{}", ds.key(6));
}

#[test]
fn a_megatron_document_index_that_disagrees_is_refused() {
    let dir = disk_dir();
    let write = |docs: &[u64]| {
        let lens = [3i32, 4, 5];
        let mut idx = b"MMIDIDX\0\0".to_vec();
        idx.extend_from_slice(&1u64.to_le_bytes());
        idx.push(8);
        idx.extend_from_slice(&3u64.to_le_bytes());
        idx.extend_from_slice(&(docs.len() as u64).to_le_bytes());
        for l in lens {
            idx.extend_from_slice(&l.to_le_bytes());
        }
        let mut at = 0i64;
        for l in lens {
            idx.extend_from_slice(&at.to_le_bytes());
            at += 2 * l as i64;
        }
        for d in docs {
            idx.extend_from_slice(&d.to_le_bytes());
        }
        std::fs::write(dir.path().join("m.idx"), idx).unwrap();
        std::fs::write(dir.path().join("m.bin"), vec![0u8; at as usize]).unwrap();
        Dataset::open(dir.path().join("m"))
    };
    assert_eq!(write(&[0, 1, 3]).unwrap().len(), 3);
    for bad in [&[0u64, 1, 2][..], &[0, 2, 1, 3], &[1, 3], &[0, 4]] {
        let e = write(bad).unwrap_err().to_string();
        assert!(e.contains("document"), "{bad:?}: {e}");
        assert!(e.contains("m.idx"), "{e}");
    }
}

#[test]
fn strict_refuses_what_indexing_found_wrong() {
    let dir = disk_dir();
    let p = dir.path().join("t.tfrecord");
    tfrecord(&p, 10, None);
    let mut bytes = std::fs::read(&p).unwrap();
    let cut = bytes.len() - 30;
    bytes.truncate(cut);
    std::fs::write(&p, &bytes).unwrap();
    let ds = Dataset::open(&p).unwrap();
    assert_eq!((ds.len(), ds.problems_total()), (9, 1));
    let mut o = OpenOptions::default();
    o.set("strict", "true").unwrap();
    let e = Dataset::open_with(&p, &o).unwrap_err().to_string();
    assert!(e.contains("strict") && e.contains("truncated"), "{e}");
    let o = gpufeed()
        .args(["inspect", "--strict"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("strict"));
}

/// A packed shard whose index cannot be read (cut short, or not a shard) among good ones costs
/// its own samples, named as a problem, and no other: every other sample comes once. One such
/// shard alone, or every shard such, is the error; `strict` refuses the dataset.
#[test]
fn a_damaged_shard_among_good_ones_costs_only_its_samples() {
    use gpufeed::{Loader, Order};
    let dir = disk_dir();
    let shards = keyed_shards(dir.path(), 90, 30, (7, 4000, 5), |i, len| {
        vec![(i % 251) as u8; len]
    });
    let bytes = std::fs::read(&shards[1]).unwrap();
    std::fs::write(&shards[1], &bytes[..bytes.len() / 2]).unwrap();
    let ds = std::sync::Arc::new(Dataset::open(dir.path()).unwrap());
    assert_eq!((ds.len(), ds.problems_total()), (60, 1));
    let e = ds.problems()[0].to_string();
    assert!(
        e.contains("shard-00001.gpf") && e.contains("truncated"),
        "{e}"
    );
    let loader = Loader::builder(ds.clone())
        .batch_size(7)
        .order(Order::Global)
        .build()
        .unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for j in 0..b.sample_ids().len() {
            if b.is_padding(j) {
                continue;
            }
            let key = ds.key(b.sample_ids()[j] as usize).into_owned();
            let i: usize = key.parse().unwrap();
            assert!(
                b.sample(j).unwrap().iter().all(|&x| x == (i % 251) as u8),
                "sample {i}"
            );
            *seen.entry(i).or_insert(0) += 1;
        }
    }
    let want: Vec<usize> = (0..30).chain(60..90).collect();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), want);
    assert!(seen.values().all(|&n| n == 1));
    let mut o = OpenOptions::default();
    o.set("strict", "true").unwrap();
    let e = Dataset::open_with(dir.path(), &o).unwrap_err().to_string();
    assert!(e.contains("strict"), "{e}");
    // The damaged shard alone, and a directory of nothing but damaged shards: errors.
    assert!(Dataset::open(&shards[1]).is_err());
    std::fs::write(&shards[0], b"not a shard").unwrap();
    std::fs::write(&shards[2], b"").unwrap();
    let e = Dataset::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("no shard of these 3 could be read"), "{e}");
}

#[test]
fn a_memory_budget_too_small_names_the_cli_flag() {
    let dir = disk_dir();
    let p = dir.path().join("t.tfrecord");
    tfrecord(&p, 300, None);
    let err = stderr_of_failure(
        gpufeed()
            .args(["bench", "load", "--modes", "global", "--batch", "256"])
            .args(["--memory-budget", "1M", "--dir"])
            .arg(dir.path().join("none"))
            .arg("--dataset")
            .arg(&p),
    );
    assert!(
        err.contains("--memory-budget") && err.contains("batch_size"),
        "{err}"
    );
}
