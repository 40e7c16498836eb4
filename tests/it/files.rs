//! Datasets of more files than the I/O thread keeps open (an ImageFolder of 1.28 M images, or
//! any folder past the open-file limit): files are opened as read groups need them and the least
//! recently used closed, every sample still arrives once with its bytes, and a file that cannot
//! be opened fails only its own sample, by name.

use std::path::Path;

use gpufeed::{Dataset, ErrorKind, Loader, Order};

use crate::common::disk_dir;

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
    // Batches of 8 in groups of 4 batches, 2 groups in flight: 96 files may be needed at once.
    let too_few = Loader::builder(ds.clone())
        .batch_size(8)
        .open_files_max(95)
        .build()
        .unwrap_err();
    assert_eq!(too_few.kind(), ErrorKind::InvalidInput);
    assert!(
        too_few.to_string().contains("below the 96 files"),
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
    for order in orders {
        let loader = Loader::builder(ds.clone())
            .batch_size(8)
            .order(order)
            .open_files_max(96)
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
