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
