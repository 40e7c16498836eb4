//! Datasets of more files than the I/O thread keeps open (an ImageFolder of 1.28 M images, or
//! any folder past the open-file limit): files are opened as read groups need them and the least
//! recently used closed, every sample still arrives once with its bytes, and a file that cannot
//! be opened fails only its own sample, by name.

use std::path::Path;

use gpufeed::{Dataset, ErrorKind, Loader, Order};

use crate::common::{disk_dir, python};

fn bytes_of(i: usize) -> Vec<u8> {
    let len = 100 + (i * 7919) % 9000;
    (0..len).map(|j| (i * 13 + j * 7) as u8).collect()
}

/// `n` files in 7 class folders; file `i` holds `bytes_of(i)`.
fn folder(dir: &Path, n: usize) {
    for i in 0..n {
        let d = dir.join(format!("c{}", i % 7));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("{i:05}.jpg")), bytes_of(i)).unwrap();
    }
}

/// The file index `i` in the key (`cK/NNNNN.jpg`).
fn index_of(key: &str) -> usize {
    let name = key.rsplit('/').next().unwrap();
    name.trim_end_matches(".jpg").parse().unwrap()
}

#[test]
fn a_folder_of_more_files_than_kept_open_reads_every_sample_once() {
    let dir = disk_dir();
    let n = 600;
    folder(dir.path(), n);
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.files().len(), n);
    // Batches of 8: a group of one batch in flight and the one being submitted need 16 files
    // at once; groups shrink to what the limit holds (down to one batch), below that it is
    // refused.
    let too_few = Loader::builder(ds.clone())
        .batch_size(8)
        .open_files_max(15)
        .build()
        .unwrap_err();
    assert_eq!(too_few.kind(), ErrorKind::InvalidInput);
    assert!(
        too_few.to_string().contains("below the 16 files"),
        "{too_few}"
    );
    let orders = [
        Order::Global,
        Order::Sequential,
        Order::ShardBuffer { buffer: 50 },
        Order::Block {
            block_bytes: 64 << 10,
            open_blocks: 3,
        },
    ];
    for (order, files_max) in orders.into_iter().flat_map(|o| [(o, 16), (o, 96)]) {
        let loader = Loader::builder(ds.clone())
            .batch_size(8)
            .order(order)
            .open_files_max(files_max)
            .build()
            .unwrap();
        for epoch in 0..2 {
            let mut seen = vec![0u32; n];
            for b in loader.epoch(epoch).unwrap() {
                let b = b.unwrap();
                for (j, &id) in b.sample_ids().iter().enumerate() {
                    let i = index_of(&ds.key(id as usize));
                    assert_eq!(
                        b.sample(j).unwrap(),
                        &bytes_of(i)[..],
                        "{order:?} sample {i}"
                    );
                    seen[i] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{order:?} epoch {epoch}");
        }
    }
}

#[test]
fn a_file_that_cannot_be_opened_fails_only_its_own_sample() {
    let dir = disk_dir();
    let n = 300;
    folder(dir.path(), n);
    let ds = Dataset::open(dir.path()).unwrap();
    let loader = Loader::builder(ds.clone())
        .batch_size(8)
        .open_files_max(96)
        .build()
        .unwrap();
    // Removed after indexing (a cleanup job, a flaky mount): only its sample is lost.
    let gone = 123;
    let path = dir.path().join(format!("c{}/{gone:05}.jpg", gone % 7));
    std::fs::remove_file(&path).unwrap();
    let (mut good, mut bad) = (0, Vec::new());
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            let i = index_of(&ds.key(id as usize));
            match b.sample(j) {
                Ok(bytes) => {
                    assert_eq!(bytes, &bytes_of(i)[..]);
                    good += 1;
                }
                Err(e) => bad.push((i, e.report())),
            }
        }
    }
    assert_eq!(good, n - 1);
    assert_eq!(bad.len(), 1, "{bad:?}");
    let (i, msg) = &bad[0];
    assert_eq!(*i, gone);
    assert!(
        msg.contains(&format!("{gone:05}.jpg")) && msg.contains("cannot open"),
        "{msg}"
    );
}

/// An ImageFolder keeps no path per image: each file's path is made from the root and the
/// sample's key, the names' own bytes — so names that are not UTF-8, or hold `:`, `%`, spaces
/// or 255 bytes, are read as they are on disk, through the loader and `read_sample` alike, and
/// the index's heap holds no path per image.
#[test]
fn an_image_folder_with_odd_names_is_read_from_the_names_on_disk() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let dir = disk_dir();
    let root = dir.path().join("odd root: 100%");
    let mut names: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"caf\xc3\xa9".to_vec(), b"\xff\xfe not utf-8.jpg".to_vec()),
        (b"caf\xc3\xa9".to_vec(), b"a:b%20c.jpg".to_vec()),
        (
            b"z \xe9t\xe9".to_vec(),
            [vec![b'n'; 251], b".jpg".to_vec()].concat(),
        ),
    ];
    for i in 0..40 {
        names.push((b"plain".to_vec(), format!("{i:03}.png").into_bytes()));
    }
    let mut want = std::collections::BTreeMap::new();
    for (i, (class, name)) in names.iter().enumerate() {
        let d = root.join(OsStr::from_bytes(class));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join(OsStr::from_bytes(name));
        std::fs::write(&p, bytes_of(i)).unwrap();
        want.insert([class.as_slice(), b"/", name].concat(), bytes_of(i));
    }
    assert_eq!(names[2].1.len(), 255);
    let ds = Dataset::open(&root).unwrap();
    assert_eq!(ds.len(), names.len());
    assert_eq!(ds.file_count(), names.len());
    // 16 bytes a sample and 4 for its file's first sample (with the vectors' spare room).
    let b = ds.index_bytes();
    assert!(b.samples <= ds.len() * 24, "{b:?}");
    // Sample i's file, as its path below the root (the names' bytes).
    let rel_of = |i: usize| -> (gpufeed::dataset::DataFile, Vec<u8>) {
        let f = ds.file(ds.sample(i).file);
        let rel = f
            .path
            .strip_prefix(&root)
            .unwrap()
            .as_os_str()
            .as_bytes()
            .to_vec();
        (f, rel)
    };
    let mut buf = Vec::new();
    for i in 0..ds.len() {
        let (f, rel) = rel_of(i);
        let bytes = &want[&rel];
        assert_eq!(f.size, bytes.len() as u64);
        let c = ds.read_sample(i, &mut buf, true).unwrap();
        assert_eq!(&buf[c.payload.clone()], &bytes[..], "read_sample {i}");
    }
    let loader = Loader::builder(ds.clone()).batch_size(7).build().unwrap();
    let mut seen = 0;
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            let rel = rel_of(id as usize).1;
            assert_eq!(b.sample(j).unwrap(), &want[&rel][..], "sample {id}");
            seen += 1;
        }
    }
    assert_eq!(seen, names.len());
    // A file gone since the open fails its own sample, named by its path on disk.
    let gone = root
        .join(OsStr::from_bytes(b"caf\xc3\xa9"))
        .join(OsStr::from_bytes(b"a:b%20c.jpg"));
    std::fs::remove_file(&gone).unwrap();
    let i = (0..ds.len())
        .find(|&i| ds.file(ds.sample(i).file).path.as_ref() == gone)
        .unwrap();
    let e = ds.read_sample(i, &mut buf, true).unwrap_err().report();
    assert!(
        e.contains("a:b%20c.jpg") && e.contains(&format!("sample {i}")),
        "{e}"
    );
}

/// Images replaced after the open, by a FIFO (whose open would wait for a writer for ever) and
/// by a larger file (which would be read cut short, another image's first bytes): each fails
/// its own sample, naming it, through the loader and `read_sample`; the rest arrive. An empty
/// image is a sample of no bytes that `bench load` reads too.
#[test]
fn images_replaced_by_a_fifo_or_a_larger_file_fail_alone() {
    let dir = disk_dir();
    let n = 30;
    folder(dir.path(), n);
    let empty = dir.path().join("c0").join("zz-empty.jpg");
    std::fs::write(&empty, b"").unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.len(), n + 1);
    let path_of = |i: usize| ds.file(ds.sample(i).file).path;
    let fifo = (0..ds.len())
        .find(|&i| path_of(i).ends_with("c2/00002.jpg"))
        .unwrap();
    let larger = (0..ds.len())
        .find(|&i| path_of(i).ends_with("c3/00003.jpg"))
        .unwrap();
    std::fs::remove_file(path_of(fifo)).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&*path_of(fifo))
        .status()
        .unwrap();
    assert!(made.success());
    // Another image whose first bytes are the old one's, and longer.
    std::fs::write(path_of(larger), [bytes_of(3), bytes_of(4)].concat()).unwrap();
    let loader = Loader::builder(ds.clone()).batch_size(4).build().unwrap();
    let (mut good, mut failed) = (0, Vec::new());
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            match b.sample(j) {
                Ok(bytes) => {
                    let key = ds.key(id as usize);
                    if !key.ends_with("zz-empty.jpg") {
                        assert_eq!(bytes, &bytes_of(index_of(&key))[..], "{key}");
                    }
                    good += 1;
                }
                Err(e) => failed.push((id as usize, e.report())),
            }
        }
    }
    failed.sort();
    assert_eq!(good, n - 1);
    assert_eq!(
        failed.iter().map(|f| f.0).collect::<Vec<_>>(),
        {
            let mut v = vec![fifo, larger];
            v.sort();
            v
        },
        "{failed:?}"
    );
    for (i, e) in &failed {
        let name = if *i == fifo { "00002.jpg" } else { "00003.jpg" };
        assert!(
            e.contains(name) && e.contains(&format!("sample {i}")),
            "{e}"
        );
    }
    let mut buf = Vec::new();
    for i in [fifo, larger] {
        let e = ds.read_sample(i, &mut buf, true).unwrap_err().report();
        assert!(e.contains(&format!("sample {i}")), "{e}");
    }
    // `bench load` over a folder with an empty image (it panicked touching its middle byte).
    let small = disk_dir();
    folder(small.path(), 5);
    std::fs::write(small.path().join("c0").join("empty.jpg"), b"").unwrap();
    let out = std::process::Command::new(crate::common::gpufeed_bin())
        .args(["bench", "load", "--modes", "global", "--json", "--dataset"])
        .arg(small.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// torchvision's `find_classes` and `make_dataset` (torchvision/datasets/folder.py, 0.15 and
/// later), as Python runs them over the tree — `os.scandir`'s `is_dir()`, `sorted(os.walk(...,
/// followlinks=True))`, `name.lower().endswith(IMG_EXTENSIONS)` — printing each class, then
/// each sample's path under the root (hex of its bytes) and label.
const TORCHVISION_FOLDER: &str = "\
import os, sys
IMG = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
root = sys.argv[1]
classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
for c in classes:
    print('class', os.fsencode(c).hex())
for label, c in enumerate(classes):
    for r, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
        for n in sorted(names):
            p = os.path.join(r, n)
            if p.lower().endswith(IMG):
                print('sample', os.fsencode(os.path.relpath(p, root)).hex(), label)
";

/// An ImageFolder's samples, labels and order are torchvision's, as its own code finds them
/// (run by Python over the same tree): images in subfolders of a class folder are the class's
/// (each folder's files in turn, the folders sorted by path: `sub 2` before `sub-2` before
/// `sub/…`), a class folder or a subfolder that is a link is followed, names are sorted as
/// Python sorts them (a byte that is not UTF-8 after `é`), `.jpg` alone and `X.JPG` are images;
/// images in the root (in no class) and a class folder with no image are noted.
#[test]
fn an_image_folder_holds_torchvisions_samples_in_torchvisions_order() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let Some(mut py) = python() else { return };
    let dir = disk_dir();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    let mut k = 0;
    let mut put = |rel: &[u8]| {
        let p = Path::new(OsStr::from_bytes(rel));
        let p = dir.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes_of(k)).unwrap();
        k += 1;
    };
    for rel in [
        &b"root/b/x.jpg"[..],
        b"root/b/sub/y.JPG",
        b"root/b/sub/deeper/z.png",
        b"root/b/sub-2/w.jpeg",
        b"root/b/sub 2/v.webp",
        b"root/b/.jpg",
        b"root/b/readme.txt",
        b"root/b/a.jpg.txt",
        b"root/a/\x80.jpg",
        b"root/a/\xc3\xa9.jpg",
        b"root/a/\xee\x80\x80.jpg",
        b"root/a/z.jpg",
        b"root/top.jpg",
        b"outside/cls/1.jpg",
        b"outside/cls/2.tif",
        b"outside/more/m.bmp",
        b"root/c/0.pgm",
    ] {
        put(rel);
    }
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::os::unix::fs::symlink(outside.join("cls"), root.join("linked")).unwrap();
    std::os::unix::fs::symlink(outside.join("more"), root.join("c").join("inner")).unwrap();

    let out = py
        .arg("-c")
        .arg(TORCHVISION_FOLDER)
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex = |h: &str| -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    };
    let (mut classes, mut samples) = (Vec::new(), Vec::new());
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let w: Vec<&str> = line.split(' ').collect();
        match w[..] {
            ["class", c] => classes.push(hex(c)),
            ["sample", p, l] => samples.push((hex(p), l.parse::<i64>().unwrap())),
            _ => panic!("{line}"),
        }
    }
    assert_eq!(
        samples.len(),
        14,
        "the tree holds 14 samples for torchvision"
    );

    let ds = Dataset::open(&root).unwrap();
    let got: Vec<(Vec<u8>, i64)> = (0..ds.len())
        .map(|i| {
            let s = ds.sample(i);
            let p = ds.file(s.file).path;
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            (rel, s.label)
        })
        .collect();
    assert_eq!(got, samples);
    let names: Vec<Vec<u8>> = classes.iter().map(|c| c.to_vec()).collect();
    let ours: Vec<Vec<u8>> = ds.classes().iter().map(|c| c.as_bytes().to_vec()).collect();
    assert_eq!(ours, names);
    let notes = ds.notes().join("\n");
    assert!(
        notes.contains("1 image file(s) in the folder itself"),
        "{notes}"
    );
    assert!(notes.contains("hold no image (empty)"), "{notes}");
    assert!(notes.contains("2 file(s) that are not images"), "{notes}");
    // Every sample reads its own file's bytes.
    let mut buf = Vec::new();
    for i in 0..ds.len() {
        let c = ds.read_sample(i, &mut buf, true).unwrap();
        let want = std::fs::read(ds.file(ds.sample(i).file).path).unwrap();
        assert_eq!(&buf[c.payload.clone()], &want[..], "sample {i}");
    }
}

/// An image that cannot be opened — a dangling link, a FIFO named like an image — is a problem
/// named with its path, not the end of the open (torchvision would list it and fail when it
/// is loaded, or wait on the FIFO for ever); a folder linked inside itself or to the root is
/// walked once, with a note (os.walk would go round until the path is too long). The other
/// images are read.
#[test]
fn unopenable_images_are_problems_and_a_folder_linked_inside_itself_is_walked_once() {
    let dir = disk_dir();
    let root = dir.path();
    for rel in ["a/1.jpg", "a/sub/2.jpg", "b/3.jpg"] {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes_of(rel.len())).unwrap();
    }
    std::os::unix::fs::symlink(root.join("nowhere.jpg"), root.join("a/dangling.jpg")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("b/fifo.jpg"))
        .status()
        .unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink("..", root.join("a/sub/up")).unwrap();
    std::os::unix::fs::symlink(root, root.join("b/to-root")).unwrap();
    let ds = Dataset::open(root).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.problems_total(), 2);
    let problems: Vec<String> = ds.problems().iter().map(|e| e.report()).collect();
    let all = problems.join("\n");
    assert!(
        all.contains("dangling.jpg") && all.contains("cannot open the image"),
        "{all}"
    );
    assert!(
        all.contains("fifo.jpg") && all.contains("not a regular file"),
        "{all}"
    );
    let notes = ds.notes().join("\n");
    assert!(notes.contains("a/sub/up: a link back"), "{notes}");
    assert!(notes.contains("b/to-root: a link back"), "{notes}");
    let loader = Loader::builder(ds.clone()).batch_size(2).build().unwrap();
    let mut seen = 0;
    for b in loader.epoch(0).unwrap() {
        seen += b.unwrap().len();
    }
    assert_eq!(seen, 3);
    // With only such images there is nothing to open: the first is the error.
    let lone = disk_dir();
    std::fs::create_dir(lone.path().join("a")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/x", lone.path().join("a/x.jpg")).unwrap();
    let e = Dataset::open(lone.path()).unwrap_err().report();
    assert!(
        e.contains("x.jpg") && e.contains("cannot open the image"),
        "{e}"
    );
}

/// An ImageFolder of 66,000 images is listed once for the node: the first open keeps its index
/// (16 bytes a sample, and the names) in `$GPUFEED_INDEX_DIR`; a later one maps it after a
/// `stat` of each folder instead of listing and stat-ing every file. An image added in a
/// subfolder changes that folder: listed anew, the image there. An image rewritten in place
/// with another size (which changes no folder) fails its own sample, naming it, and removes the
/// kept index; the next open lists the folder anew and every sample verifies.
#[test]
fn an_image_folder_is_listed_once_for_the_node() {
    let dir = disk_dir();
    let root = dir.path().join("imgs");
    let n = 66_000;
    // Tiny gray JPEGs (verify reads each one's header).
    let tiny = |w: u32| {
        let px = vec![128u8; w as usize * 8];
        gpufeed::testing::synth::encode(&px, (w, 8), &gpufeed::testing::synth::kind_of(1)).unwrap()
    };
    let (small, large) = (tiny(8), tiny(64));
    assert_ne!(small.len(), large.len());
    for i in 0..n {
        let d = root.join(format!("c{:03}", i % 100));
        if i < 100 {
            std::fs::create_dir_all(d.join("nested")).unwrap();
        }
        let name = format!("{i:05}.jpg");
        let p = if i % 10 == 0 {
            d.join("nested").join(name)
        } else {
            d.join(name)
        };
        std::fs::write(p, &small).unwrap();
    }
    // A file that is not an image: a note, kept with the index and said by every open.
    std::fs::write(root.join("c000/readme.txt"), b"not an image").unwrap();
    let cache = dir.path().join("index");
    // Whether it succeeded, its JSON report (or null), and all it said.
    let cli = |cmd: &str| -> (bool, serde_json::Value, String) {
        let o = std::process::Command::new(crate::common::gpufeed_bin())
            .env_remove("GPUFEED_SHARED_INDEX")
            .env("GPUFEED_INDEX_DIR", &cache)
            .args([cmd, "--json"])
            .arg(&root)
            .output()
            .unwrap();
        let v = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let said = [o.stdout, o.stderr].concat();
        (
            o.status.success(),
            v,
            String::from_utf8_lossy(&said).into_owned(),
        )
    };
    let settle = || std::thread::sleep(std::time::Duration::from_millis(2100));
    settle();
    let (ok, first, err) = cli("inspect");
    assert!(ok, "{err}");
    let kept = first["node_index"].as_str().expect("kept").to_string();
    assert!(kept.starts_with(cache.to_str().unwrap()), "{kept}");
    let ib = &first["index_bytes"];
    assert_eq!(ib["samples_shared"].as_u64(), Some(16 * n), "{ib}");
    assert_eq!(
        (ib["samples"].as_u64(), ib["keys"].as_u64()),
        (Some(0), Some(0))
    );
    use std::os::unix::fs::MetadataExt;
    let inode = || std::fs::metadata(&kept).unwrap().ino();
    let built = inode();
    let (ok, second, err) = cli("inspect");
    assert!(ok, "{err}");
    assert_eq!(second["node_index"].as_str(), Some(kept.as_str()));
    assert_eq!(inode(), built, "the kept index is read, not built again");
    // The same folder through a link (or `..`): the same index.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    let via = std::process::Command::new(crate::common::gpufeed_bin())
        .env_remove("GPUFEED_SHARED_INDEX")
        .env("GPUFEED_INDEX_DIR", &cache)
        .args(["inspect", "--json"])
        .arg(link.join("c001").join(".."))
        .output()
        .unwrap();
    let via: serde_json::Value = serde_json::from_slice(&via.stdout).unwrap();
    assert_eq!(via["node_index"].as_str(), Some(kept.as_str()));
    assert_eq!(inode(), built);
    assert_eq!(second["samples"].as_u64(), Some(n));
    assert_eq!(second["labels"], first["labels"]);
    assert_eq!(second["size_histogram"], first["size_histogram"]);
    let notes = first["notes"].to_string();
    assert!(notes.contains("1 file(s) that are not images"), "{notes}");
    assert_eq!(second["notes"], first["notes"]);
    let (ok, _, err) = cli("verify");
    assert!(ok, "{err}");

    // An image added in a nested folder: that folder changed, so the tree is listed anew.
    std::fs::write(root.join("c042/nested/new.jpg"), &small).unwrap();
    let (ok, third, err) = cli("inspect");
    assert!(ok, "{err}");
    assert_eq!(third["samples"].as_u64(), Some(n + 1));
    settle();
    let (_, fourth, _) = cli("inspect");
    assert_eq!(fourth["node_index"].as_str(), Some(kept.as_str()));
    assert_eq!(fourth["samples"].as_u64(), Some(n + 1));
    assert_ne!(inode(), built, "built again for the folder as it is now");

    // Rewritten in place, larger: no folder changed, the kept index is used and the image is
    // refused by name (not read cut short); the index is removed.
    let rewritten = root.join("c007/00007.jpg");
    std::fs::write(&rewritten, &large).unwrap();
    let (ok, _, said) = cli("verify");
    assert!(!ok);
    assert!(
        said.contains("00007.jpg") && said.contains("the index is removed"),
        "{said}"
    );
    assert!(!Path::new(&kept).exists());
    let (ok, _, err) = cli("verify");
    assert!(ok, "{err}");
}

/// An option given for another format is said, not silently ignored: `label_ext` and
/// `seq_len` on an ImageFolder are notes; the same at their defaults, or where they apply, are
/// not.
#[test]
fn options_for_another_format_are_noted() {
    let dir = disk_dir();
    folder(dir.path(), 14);
    let paths = [dir.path().to_path_buf()];
    let mut o = gpufeed::dataset::OpenOptions::default();
    o.set("label_ext", "txt").unwrap();
    o.set("seq_len", "5").unwrap();
    let ds = Dataset::open_paths(&paths, &o).unwrap();
    let notes = ds.notes().join("\n");
    assert!(
        notes.contains("label_ext=txt does not apply to a local image-folder dataset"),
        "{notes}"
    );
    assert!(notes.contains("seq_len=5"), "{notes}");
    assert_eq!(ds.len(), 14);
    let mut o = gpufeed::dataset::OpenOptions::default();
    o.set("label_ext", "cls").unwrap();
    let ds = Dataset::open_paths(&paths, &o).unwrap();
    assert!(ds.notes().is_empty(), "{:?}", ds.notes());
}

/// By default a loader keeps open about what its read groups need (at least 1,024), not every
/// file of a large folder: a 4,000-file folder read whole leaves the process's descriptors to
/// the trainer (it held all 4,000 — and a 200,000-file folder held nearly the whole limit).
#[test]
fn a_large_folder_keeps_only_what_its_reads_need_open() {
    let dir = disk_dir();
    let n = 4000;
    folder(dir.path(), n);
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let ds = Dataset::open(dir.path()).unwrap();
    let loader = Loader::builder(ds).batch_size(8).build().unwrap();
    let before = fds();
    let mut most = 0;
    let mut seen = 0;
    for b in loader.epoch(0).unwrap() {
        seen += b.unwrap().len();
        most = most.max(fds());
    }
    assert_eq!(seen, n);
    // Other tests of this process open files too: a margin, far below the folder's 4,000.
    assert!(
        most < before + 1024 + 300,
        "{before} before, {most} at most"
    );
}

/// Under `ulimit -n 1024` (soft and hard) a loader over a folder of 3,000 files reads its epoch
/// at batch 64 (768 files open at once: 128 descriptors are kept for the rest of the process,
/// not 256); at batch 96 and 256 its read groups touch fewer files (down to one batch's) and
/// it says so; at batch 512 (one batch in flight and one being submitted: 1,024 files) it is
/// refused, naming `ulimit -n`. Two loaders in one
/// process (`--gpus 2`, batch 32), each sized as if alone, run the process out of descriptors:
/// each then keeps fewer files open (saying so) and every sample arrives (1,983 failed before).
#[test]
fn a_low_open_file_limit_keeps_fewer_groups_in_flight_before_it_refuses() {
    let dir = disk_dir();
    folder(dir.path(), 3000);
    let run = |batch: u32, gpus: u32| {
        std::process::Command::new("sh")
            .args(["-c", r#"ulimit -n 1024 || exit 77; exec "$0" "$@""#])
            .arg(crate::common::gpufeed_bin())
            .args([
                "bench",
                "load",
                "--modes",
                "global",
                "--json",
                "--batch-size",
            ])
            .arg(batch.to_string())
            .args(["--gpus", &gpus.to_string()])
            .arg("--dataset")
            .arg(dir.path())
            .env_remove("GPUFEED_QUIET")
            .output()
            .unwrap()
    };
    let ok = |batch: u32, gpus: u32, notice: &str| {
        let o = run(batch, gpus);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "batch {batch}: {err}");
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["samples"].as_u64(), Some(3000), "batch {batch}");
        assert_eq!(j["sample_errors"].as_u64(), Some(0), "batch {batch}");
        match notice {
            "" => assert!(!err.contains("gpufeed:"), "batch {batch}: {err}"),
            n => assert!(err.contains(n), "batch {batch}: {err}"),
        }
    };
    if run(1, 1).status.code() == Some(77) {
        eprintln!("skipped: the hard open-file limit is below 1024 here");
        return;
    }
    ok(64, 1, "");
    // Groups of fewer files than 4 batches' (2 of 296 where 384 were asked for); at batch 256,
    // groups of one batch (refused before: a group was 4 batches whatever the limit).
    ok(96, 1, "files each, instead of 2 of 384");
    ok(256, 1, "files each, instead of 2 of 1024");
    ok(32, 2, "the process ran out of file descriptors");
    let o = run(512, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("raise `ulimit -n`"),
        "{err}"
    );
}

/// 10⁴ and 10⁵ small files, read with the defaults in every order: every sample once with its
/// bytes (issue 52 item 7: block order failed epoch 0 of 10,000 files, "all 6144 open files
/// are in use by reads in flight" — a group may make 4,096 reads, one file each, where the
/// open files were counted from batch size × batches per group, 1,024). Also with a slot
/// large enough that a block window of thousands of files is one group.
#[test]
fn tens_of_thousands_of_small_files_read_exactly_in_every_order_with_the_defaults() {
    let orders = [
        Order::Global,
        Order::Sequential,
        Order::ShardBuffer { buffer: 10_000 },
        Order::Block {
            block_bytes: 8 << 20,
            open_blocks: 8,
        },
    ];
    for n in [10_000usize, 100_000] {
        let dir = disk_dir();
        for c in 0..10 {
            std::fs::create_dir(dir.path().join(format!("c{c}"))).unwrap();
        }
        // Each file its own number, padded to a few dozen bytes (an odd mix of sizes).
        let body = |i: usize| {
            let mut v = (i as u32).to_le_bytes().to_vec();
            v.resize(4 + (i * 31) % 60, (i % 251) as u8);
            v
        };
        for i in 0..n {
            std::fs::write(dir.path().join(format!("c{}/{i:06}.jpg", i % 10)), body(i)).unwrap();
        }
        let ds = std::sync::Arc::new(Dataset::open(dir.path()).unwrap());
        assert_eq!(ds.len(), n);
        let windows: &[Option<u64>] = if n == 10_000 {
            &[None, Some(64 << 20)]
        } else {
            &[None]
        };
        for order in orders {
            for &window in windows {
                let mut b = Loader::builder(ds.clone()).batch_size(256).order(order);
                if let Some(bytes) = window {
                    b = b.window(64, bytes);
                }
                let loader = b.build().unwrap();
                let mut seen = vec![0u8; n];
                for batch in loader.epoch(0).unwrap() {
                    let batch = batch.unwrap_or_else(|e| panic!("{n} files, {order:?}: {e}"));
                    for j in 0..batch.sample_ids().len() {
                        let s = batch.sample(j).unwrap();
                        let i = u32::from_le_bytes(s[..4].try_into().unwrap()) as usize;
                        assert_eq!(s, &body(i)[..], "{order:?}: sample {i}");
                        seen[i] += 1;
                    }
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "{n} files, {order:?}, window {window:?}: not every sample once"
                );
            }
        }
    }
}

/// A 30 MB folder of 200 images (199 of 150 KB, one of 4.3 MB) at batch 32 gets read buffers
/// the size of the data, not three times it: at most the dataset plus its largest sample over
/// the slots, never less than a worst-case batch a slot (issue 52 item 13: 4 slots of 24 MiB,
/// 96 MiB, and 38 MiB slots in block order); every sample still once.
#[test]
fn read_buffers_are_no_larger_than_the_data() {
    let dir = disk_dir();
    let mut want = Vec::new();
    for i in 0..200usize {
        let len = if i == 7 { 4_300_000 } else { 150_000 };
        let body: Vec<u8> = (0..len).map(|j| (i * 31 + j * 7 + j / 977) as u8).collect();
        let d = dir.path().join(format!("c{}", i % 3));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("{i:03}.jpg")), &body).unwrap();
        want.push(body);
    }
    let ds = std::sync::Arc::new(Dataset::open(dir.path()).unwrap());
    let total: u64 = want.iter().map(|b| b.len() as u64).sum();
    for order in [
        Order::Global,
        Order::Block {
            block_bytes: 8 << 20,
            open_blocks: 8,
        },
        Order::ShardBuffer { buffer: 10_000 },
    ] {
        let loader = Loader::builder(ds.clone())
            .batch_size(32)
            .order(order)
            .build()
            .unwrap();
        let m = loader.memory();
        assert!(
            m.arena_bytes <= 64 << 20 && m.arena_bytes <= total + 4_300_000 + (8 << 20),
            "{order:?}: {} MiB of read buffers for {} MB of data",
            m.arena_bytes >> 20,
            total / 1_000_000
        );
        let mut seen = vec![0u32; 200];
        for b in loader.epoch(0).unwrap() {
            let b = b.unwrap();
            for j in 0..b.sample_ids().len() {
                let key = ds.key(b.sample_ids()[j] as usize);
                let i: usize = key.rsplit('/').next().unwrap()[..3].parse().unwrap();
                assert!(
                    b.sample(j).unwrap() == &want[i][..],
                    "{order:?}: sample {i}"
                );
                seen[i] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "{order:?}");
    }
}
