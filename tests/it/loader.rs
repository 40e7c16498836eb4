//! The host loader over real shards: every sample exactly once with the right bytes, in every
//! order mode and across ranks; resume; bad samples; dropping mid-epoch.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpufeed::dataset::shard::ShardWriter;
use gpufeed::testing::Rng;
use gpufeed::{Dataset, ErrorKind, LastBatch, Loader, Order};

use crate::common::*;

fn content(i: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(i as u64 * 7919 + 1);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

/// Writes `n` samples with random lengths into `shards` shards; returns the paths.
fn write_shards(dir: &Path, n: usize, shards: usize, max_len: u64, seed: u64) -> Vec<PathBuf> {
    let mut rng = Rng::new(seed);
    let per = n.div_ceil(shards);
    let mut paths = Vec::new();
    for s in 0..shards {
        let p = dir.join(format!("shard-{s:05}.gpf"));
        let mut w = ShardWriter::create(&p, 1).unwrap();
        for i in s * per..((s + 1) * per).min(n) {
            let len = 1 + rng.below(max_len) as usize;
            w.add(
                &format!("sample-{i}"),
                (i % 13) as i64,
                &[],
                &content(i, len),
            )
            .unwrap();
        }
        w.finish().unwrap();
        paths.push(p);
    }
    paths
}

fn modes() -> Vec<Order> {
    vec![
        Order::Global,
        Order::Sequential,
        Order::ShardBuffer { buffer: 50 },
        Order::Block {
            block_bytes: 256 << 10,
            open_blocks: 3,
        },
    ]
}

fn check_sample(ds: &Dataset, id: u32, bytes: &[u8]) {
    let want = content(
        ds.key(id as usize)
            .trim_start_matches("sample-")
            .parse()
            .unwrap(),
        bytes.len(),
    );
    assert_eq!(bytes.len(), ds.sample(id as usize).len as usize);
    assert!(bytes == want.as_slice(), "sample {id} bytes differ");
}

#[test]
fn every_sample_exactly_once_across_ranks_and_modes() {
    let dir = disk_dir();
    // 3 ranks × batch 7 × 29 = 609 samples: divisible, so exactly once.
    let n = 609;
    let paths = write_shards(dir.path(), n, 4, 20_000, 1);
    let ds = Dataset::open_shards(&paths).unwrap();
    for order in modes() {
        let mut seen = vec![0u32; n];
        for rank in 0..3 {
            let loader = Loader::builder(ds.clone())
                .batch_size(7)
                .order(order)
                .seed(42)
                .rank(rank, 3)
                .window(3, 1 << 20)
                .build()
                .unwrap();
            let mut epoch = loader.epoch(5).unwrap();
            let mut count = 0;
            for (k, b) in epoch.by_ref().enumerate() {
                let b = b.unwrap();
                assert_eq!(b.index() as usize, k);
                assert_eq!(b.len(), 7);
                for (j, &id) in b.sample_ids().iter().enumerate() {
                    check_sample(&ds, id, b.sample(j).unwrap());
                    assert_eq!(b.labels()[j], ds.sample(id as usize).label);
                    seen[id as usize] += 1;
                }
                count += 1;
            }
            assert_eq!(count, 29);
            let st = epoch.stats();
            assert_eq!(st.samples, 203);
            assert!(st.bytes_read >= st.bytes_delivered, "{st:?}");
            assert_eq!(st.sample_errors, 0);
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "{order:?}: not every sample exactly once"
        );
    }
}

/// The epoch contract through the loader, over random sizes, batch sizes, rank counts, orders
/// and last-batch policies, each rank resumed at a random batch: the batches from the resume
/// point equal the uninterrupted epoch's; `short` delivers every sample exactly once (with the
/// right bytes), `drop` never repeats, `pad` repeats exactly the flagged samples.
#[test]
fn epoch_contract_with_random_sizes_and_resume_points() {
    let dir = disk_dir();
    let mut rng = Rng::new(77);
    let n_max = 260;
    let paths = write_shards(dir.path(), n_max, 3, 3_000, 9);
    let all = Dataset::open_shards(&paths).unwrap();
    for case in 0..24u64 {
        // A random prefix of the samples: as a dataset of its own (keys and bytes stay).
        let n = 1 + rng.below(n_max as u64) as usize;
        let ds = Dataset::from_parts(
            all.files().collect(),
            all.samples().iter().take(n).collect(),
            (0..n).map(|i| all.key(i).into_owned()).collect(),
        )
        .unwrap();
        let world = 1 + rng.below(4) as u32;
        let batch = 1 + rng.below(20) as u32;
        let order = modes()[rng.below(3) as usize];
        let policy = [LastBatch::Short, LastBatch::Drop, LastBatch::Pad][rng.below(3) as usize];
        let what = format!("case {case}: n {n} world {world} batch {batch} {order:?} {policy:?}");
        let mut real = vec![0u32; n];
        let mut padded = vec![0u32; n];
        let mut per_rank = Vec::new();
        for rank in 0..world {
            let loader = match Loader::builder(ds.clone())
                .batch_size(batch)
                .order(order)
                .seed(case)
                .rank(rank, world)
                .last_batch(policy)
                .window(1 + rng.below(3) as u32, 1 << 20)
                .build()
                .and_then(|l| l.epoch(case).map(|e| (l, e)))
            {
                Ok(x) => x,
                Err(e) => {
                    assert!(
                        policy == LastBatch::Drop && n / (world as usize) < batch as usize,
                        "{what}: {e}"
                    );
                    continue;
                }
            };
            let (loader, epoch) = loader;
            // What the test compares, copied out: holding the batches would hold every slot.
            type Seen = (u32, Vec<u32>, Vec<bool>, Vec<Vec<u8>>);
            let take = |b: gpufeed::Result<gpufeed::Batch>| -> Seen {
                let b = b.unwrap();
                assert_eq!(
                    b.padding_mask().iter().filter(|&&p| p).count(),
                    b.padding_count()
                );
                let bytes = b.samples().map(|s| s.unwrap().to_vec()).collect();
                (b.index(), b.sample_ids().to_vec(), b.padding_mask(), bytes)
            };
            let full: Vec<Seen> = epoch.map(take).collect();
            assert_eq!(full.len() as u32, loader.batches_per_epoch(), "{what}");
            let samples: usize = full.iter().map(|b| b.1.len()).sum();
            assert_eq!(samples, loader.samples_per_epoch(), "{what}");
            per_rank.push(samples);
            for (k, (index, ids, mask, bytes)) in full.iter().enumerate() {
                assert_eq!(*index as usize, k);
                assert!(ids.len() <= batch as usize && !ids.is_empty(), "{what}");
                if k + 1 < full.len() {
                    assert_eq!(
                        ids.len(),
                        batch as usize,
                        "{what}: only the last batch is short"
                    );
                }
                for (j, &id) in ids.iter().enumerate() {
                    check_sample(&ds, id, &bytes[j]);
                    if mask[j] {
                        padded[id as usize] += 1;
                    } else {
                        real[id as usize] += 1;
                    }
                }
            }
            // Resumed at a random batch: the same batches from there, with the same flags.
            let start = rng.below(full.len() as u64 + 1) as u32;
            let resumed: Vec<Seen> = loader.epoch_from(case, start).unwrap().map(take).collect();
            assert_eq!(
                resumed,
                full[start as usize..].to_vec(),
                "{what}: resume at {start}"
            );
        }
        let total_padded: u32 = padded.iter().sum();
        match policy {
            LastBatch::Short => {
                assert!(real.iter().all(|&c| c == 1), "{what}: not exactly once");
                assert_eq!(total_padded, 0);
            }
            LastBatch::Drop => {
                assert!(real.iter().all(|&c| c <= 1), "{what}: a sample twice");
                assert_eq!(total_padded, 0);
            }
            LastBatch::Pad => {
                assert!(real.iter().all(|&c| c == 1), "{what}: not exactly once");
                assert!(
                    per_rank.iter().all(|&k| k == n.div_ceil(world as usize)),
                    "{what}"
                );
                assert_eq!(
                    total_padded as usize,
                    n.div_ceil(world as usize) * world as usize - n
                );
            }
        }
    }
}

/// Issue 11: global order over many small samples with large batches used to fail at the
/// first batch ("job needs 2420 read entries, 1659 are free"): the planner made groups the
/// engine could not take two of. Every batch size now reads its epoch exactly once.
#[test]
fn large_batches_of_small_samples_read_whole_epochs() {
    let dir = disk_dir();
    let n = 40_000;
    let paths = write_shards(dir.path(), n, 4, 3_000, 11);
    let ds = Dataset::open_shards(&paths).unwrap();
    for batch in [768u32, 1024, 4096] {
        // No reading through gaps: each group issues about one read per sample, as a global
        // shuffle of a set much larger than a group does (250K samples in the report).
        let loader = Loader::builder(ds.clone())
            .batch_size(batch)
            .seed(batch as u64)
            .coalescing(0, 16 << 20)
            .build()
            .unwrap();
        let mut seen = vec![false; n];
        for b in loader.epoch(0).unwrap() {
            let b = b.unwrap_or_else(|e| panic!("batch {batch}: {e}"));
            for (j, &id) in b.sample_ids().iter().enumerate() {
                if j % 97 == 0 {
                    check_sample(&ds, id, b.sample(j).unwrap());
                }
                assert!(!std::mem::replace(&mut seen[id as usize], true));
            }
        }
        assert!(seen.iter().all(|&s| s), "batch {batch}: a sample missing");
    }
}

/// Slots follow the batch and the dataset's largest batches; a budget too small for them is
/// an error that names the setting in every API's terms, before anything is allocated.
#[test]
fn slots_are_sized_from_the_dataset_within_the_memory_budget() {
    use gpufeed::dataset::DataFile;
    use gpufeed::plan::Sample;
    // An index only (nothing is read): 5,000 samples of the ImageNet size mix's range.
    let mut rng = Rng::new(3);
    let mut samples = Vec::new();
    let mut off = 0u64;
    for _ in 0..5_000 {
        let len = 2_048 + rng.below(260_000) as u32;
        samples.push(Sample {
            file: 0,
            len,
            offset: off,
            label: 0,
            crc32c: 0,
        });
        off += len as u64;
    }
    let files = vec![DataFile {
        path: dir_path("imagenet-like.gpf"),
        size: off,
    }];
    let keys = (0..samples.len()).map(|i| i.to_string()).collect();
    let ds = Dataset::from_parts(files, samples, keys).unwrap();
    // Batch 1024 needs more than the old fixed 128 MiB slot: sized to its worst case.
    let loader = Loader::builder(ds.clone())
        .batch_size(1024)
        .build()
        .unwrap();
    assert!(loader.slot_bytes() > 128 << 20, "{}", loader.slot_bytes());
    // What it holds, said: 4 slots, the index; an epoch's figures say the same.
    let m = loader.memory();
    assert_eq!(m.arena_bytes, 4 * loader.slot_bytes());
    assert_eq!(m.slot_bytes, loader.slot_bytes());
    assert!(m.index_bytes >= 5_000 * 16, "{m:?}");
    assert_eq!(m.device_bytes, 0);
    assert_eq!(loader.epoch(0).unwrap().stats().memory, m);
    let worst = gpufeed::plan::batch_bytes(ds.samples(), 1024, 4096).worst;
    assert!(loader.slot_bytes() >= worst);
    // Batch 64 needs a group of 4 typical batches and the largest sample: far below the old
    // 128 MiB floor, sized from the work.
    let bb = gpufeed::plan::batch_bytes(ds.samples(), 64, 4096);
    let group = (4 * bb.typical + bb.largest)
        .max(bb.worst)
        .next_multiple_of(2 << 20);
    assert!(group < 64 << 20, "{bb:?}");
    assert_eq!(
        Loader::builder(ds.clone())
            .batch_size(64)
            .build()
            .unwrap()
            .slot_bytes(),
        group
    );
    // Block order: a whole window (8 blocks of 8 MiB) fits a slot.
    let block = Loader::builder(ds.clone())
        .batch_size(64)
        .order(Order::Block {
            block_bytes: 8 << 20,
            open_blocks: 8,
        })
        .build()
        .unwrap();
    assert_eq!(
        block.slot_bytes(),
        (64u64 << 20) + bb.largest.next_multiple_of(2 << 20)
    );
    // A dataset smaller than a group: slots no larger than the dataset.
    let few = Dataset::from_parts(
        ds.files().collect(),
        ds.samples().iter().take(20).collect(),
        (0..20).map(|i| i.to_string()).collect(),
    )
    .unwrap();
    let bf = gpufeed::plan::batch_bytes(few.samples(), 64, 4096);
    let whole = (bf.total + bf.largest)
        .max(bf.worst)
        .next_multiple_of(2 << 20);
    assert_eq!(
        Loader::builder(few.clone())
            .batch_size(64)
            .build()
            .unwrap()
            .slot_bytes(),
        whole
    );
    // Below that, the error asks for that much, not for 1.5 "typical batches" (here 1.5
    // datasets): a slot never needs more than the dataset and its largest sample.
    assert!(bf.typical + bf.typical / 2 + bf.largest > whole);
    let e = Loader::builder(few)
        .batch_size(64)
        .memory_budget(4 * (whole - (2 << 20)))
        .build()
        .unwrap_err()
        .to_string();
    let says = format!("need slots of at least {} MiB", whole >> 20);
    assert!(e.contains(&says), "{e}");
    assert!(e.contains("prefetch + in_flight"), "{e}");
    // A budget that cannot hold 4 slots of the smallest workable size.
    let e = Loader::builder(ds.clone())
        .batch_size(1024)
        .memory_budget(256 << 20)
        .build()
        .unwrap_err()
        .to_string();
    for says in [
        "memory budget",
        "memory_budget",
        "--memory-budget",
        "batch_size",
        "MiB",
    ] {
        assert!(e.contains(says), "{says}: {e}");
    }
    // A batch no slot can hold: 1024 samples of 2 MB.
    let big: Vec<Sample> = (0..2_000u64)
        .map(|i| Sample {
            file: 0,
            len: 2 << 20,
            offset: i * (2 << 20),
            label: 0,
            crc32c: 0,
        })
        .collect();
    let files = vec![DataFile {
        path: dir_path("big.gpf"),
        size: 2_000 * (2 << 20),
    }];
    let keys = (0..big.len()).map(|i| i.to_string()).collect();
    let big = Dataset::from_parts(files, big, keys).unwrap();
    let e = Loader::builder(big)
        .batch_size(1024)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("slot may hold") && e.contains("batch_size"),
        "{e}"
    );
}

fn dir_path(name: &str) -> std::sync::Arc<std::path::Path> {
    std::path::Path::new("/nonexistent").join(name).into()
}

/// The acceptance's case: 2,000 samples in batches of 64 on one rank are 32 batches, the last of
/// 16, and 2,000 distinct samples (the default policy).
#[test]
fn two_thousand_samples_in_batches_of_64_are_2000_distinct() {
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 2000, 2, 600, 4);
    let ds = Dataset::open_shards(&paths).unwrap();
    let loader = Loader::builder(ds).batch_size(64).build().unwrap();
    assert_eq!(loader.batches_per_epoch(), 32);
    let mut ids = Vec::new();
    let mut lens = Vec::new();
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        lens.push(b.len());
        assert_eq!(b.padding_count(), 0);
        ids.extend_from_slice(b.sample_ids());
    }
    assert_eq!(lens.len(), 32);
    assert_eq!(lens[31], 2000 - 31 * 64);
    assert_eq!(ids.len(), 2000);
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2000, "a sample twice");
}

#[test]
fn resumed_epoch_equals_uninterrupted() {
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 500, 3, 30_000, 2);
    let ds = Dataset::open_shards(&paths).unwrap();
    for order in modes() {
        let loader = Loader::builder(ds.clone())
            .batch_size(9)
            .order(order)
            .seed(3)
            .window(2, 1 << 20)
            .build()
            .unwrap();
        let full: Vec<(Vec<u32>, Vec<Vec<u8>>)> = loader
            .epoch(1)
            .unwrap()
            .map(|b| {
                let b = b.unwrap();
                (
                    b.sample_ids().to_vec(),
                    b.samples().map(|s| s.unwrap().to_vec()).collect(),
                )
            })
            .collect();
        for start in [0u32, 1, 5, 17, full.len() as u32 - 1, full.len() as u32] {
            let resumed: Vec<(Vec<u32>, Vec<Vec<u8>>)> = loader
                .epoch_from(1, start)
                .unwrap()
                .map(|b| {
                    let b = b.unwrap();
                    (
                        b.sample_ids().to_vec(),
                        b.samples().map(|s| s.unwrap().to_vec()).collect(),
                    )
                })
                .collect();
            assert!(
                resumed[..] == full[start as usize..],
                "{order:?} resumed at {start} differs"
            );
        }
        assert!(loader.epoch_from(1, full.len() as u32 + 1).is_err());
    }
}

/// An epoch stopped on 4 ranks after 5 batches, resumed on 3 (`pad`): each new rank's loader
/// delivers its share with the right bytes, the three shares and the stopped ranks' first 5
/// batches are the epoch once over, every new rank has the same batch count, and a resume
/// inside the resumed epoch (`start` > 0) gives its batches from there.
#[test]
fn an_epoch_resumed_on_another_rank_count_reads_the_rest_once() {
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 500, 3, 30_000, 6);
    let ds = Dataset::open_shards(&paths).unwrap();
    let stops = [gpufeed::plan::Stop {
        world_size: 4,
        batch: 5,
    }];
    for order in modes() {
        let loader = |rank, world| {
            Loader::builder(ds.clone())
                .plan(gpufeed::PlanConfig {
                    order,
                    seed: 8,
                    rank,
                    world_size: world,
                    batch_size: 9,
                    last_batch: LastBatch::Pad,
                    ..gpufeed::PlanConfig::default()
                })
                .window(2, 1 << 20)
                .build()
                .unwrap()
        };
        let read = |e: gpufeed::Epoch, upto: usize| -> Vec<Vec<(u32, bool)>> {
            e.take(upto)
                .map(|b| {
                    let b = b.unwrap();
                    for (k, s) in b.samples().enumerate() {
                        check_sample(&ds, b.sample_ids()[k], s.unwrap());
                    }
                    (0..b.len())
                        .map(|k| (b.sample_ids()[k], b.is_padding(k)))
                        .collect()
                })
                .collect()
        };
        let mut seen = vec![0u32; ds.len()];
        for rank in 0..4 {
            for batch in read(loader(rank, 4).epoch(2).unwrap(), 5) {
                for (id, pad) in batch {
                    seen[id as usize] += u32::from(!pad);
                }
            }
        }
        let mut counts = Vec::new();
        for rank in 0..3 {
            let l = loader(rank, 3);
            let rest = read(l.epoch_resumed(2, &stops, 0).unwrap(), usize::MAX);
            assert_eq!(
                rest.len() as u32,
                l.plan_epoch_resumed(2, &stops).unwrap().batches()
            );
            counts.push(rest.len());
            for batch in &rest {
                for &(id, pad) in batch {
                    seen[id as usize] += u32::from(!pad);
                }
            }
            let from_2 = read(l.epoch_resumed(2, &stops, 2).unwrap(), usize::MAX);
            assert!(
                from_2[..] == rest[2..],
                "{order:?} rank {rank}: resumed at 2"
            );
        }
        assert!(seen.iter().all(|&c| c == 1), "{order:?}: {seen:?}");
        assert!(
            counts.windows(2).all(|c| c[0] == c[1]),
            "{order:?} {counts:?}"
        );
    }
}

/// The direct-I/O alignment `path` reports (offsets and memory), by `statx` called here.
fn dio_align(path: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a writable statx and a NUL-terminated path, both alive across the call.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            0,
            libc::STATX_DIOALIGN,
            st.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "statx {}", path.display());
    // SAFETY: zeroed integers, filled by the successful call.
    let st = unsafe { st.assume_init() };
    let (mem, off) = (st.stx_dio_mem_align, st.stx_dio_offset_align);
    (st.stx_mask & libc::STATX_DIOALIGN != 0 && mem != 0 && off != 0).then_some(mem.max(off))
}

/// Small samples are read at the alignment their files' direct I/O needs (what `statx` says,
/// 512 bytes on most disks), with every sample's bytes right and the read amplification near
/// what that alignment forces; large samples stay at 4 KiB; an alignment chosen by hand stays.
#[test]
fn small_samples_are_planned_at_the_files_direct_io_alignment() {
    let dir = disk_dir();
    let (small_dir, big_dir) = (dir.path().join("small"), dir.path().join("big"));
    std::fs::create_dir_all(&small_dir).unwrap();
    std::fs::create_dir_all(&big_dir).unwrap();
    let small = write_shards(&small_dir, 3000, 2, 1500, 4);
    write_shards(&big_dir, 100, 2, 200_000, 5);
    let want = match dio_align(&small[0]) {
        Some(a) if a <= 4096 => a.max(512),
        _ => 4096,
    };
    let ds = std::sync::Arc::new(Dataset::open(&small_dir).unwrap());
    // Groups of 64 of 3,000 samples: scattered as a global order over a large set is.
    let loader = Loader::builder(ds.clone()).batch_size(16).build().unwrap();
    assert_eq!(loader.plan_config().align, want);
    let mut epoch = loader.epoch(0).unwrap();
    let mut n = 0;
    for b in epoch.by_ref() {
        let b = b.unwrap();
        for (k, s) in b.samples().enumerate() {
            check_sample(&ds, b.sample_ids()[k], s.unwrap());
            n += 1;
        }
    }
    assert_eq!(n, 3000);
    // Every sample alone, widened to the alignment: the floor the plan stays near.
    let floor: u64 = ds
        .samples()
        .iter()
        .map(|s| gpufeed::plan::span(&s, want as u64))
        .sum();
    let amp = epoch.stats().read_amplification();
    let floor = floor as f64 / ds.total_bytes() as f64;
    eprintln!("align {want}: read amplification {amp:.3}, floor {floor:.3}");
    assert!(
        amp <= 1.2 * floor,
        "amplification {amp:.3}, floor {floor:.3}"
    );
    let big = Loader::builder(Dataset::open(&big_dir).unwrap())
        .batch_size(8)
        .build()
        .unwrap();
    assert_eq!(big.plan_config().align, 4096);
    let chosen = Loader::builder(ds.clone())
        .plan(gpufeed::PlanConfig {
            align: 8192,
            batch_size: 64,
            ..gpufeed::PlanConfig::default()
        })
        .build()
        .unwrap();
    assert_eq!(chosen.plan_config().align, 8192);
}

#[test]
fn a_corrupt_sample_is_named_and_every_other_sample_delivered() {
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 200, 2, 10_000, 3);
    let idx = gpufeed::dataset::shard::read_index(&paths[1]).unwrap();
    let victim = idx.entries[17];
    let mut bytes = std::fs::read(&paths[1]).unwrap();
    bytes[victim.offset as usize + victim.len as usize / 2] ^= 0x55;
    std::fs::write(&paths[1], &bytes).unwrap();
    let ds = Dataset::open_shards(&paths).unwrap();
    let victim_id = (0..ds.len())
        .find(|&i| ds.sample(i).file == 1 && ds.sample(i).offset == victim.offset)
        .unwrap();
    let loader = Loader::builder(ds.clone()).batch_size(8).build().unwrap();
    let mut ok = 0;
    let mut bad = Vec::new();
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            match b.sample(j) {
                Ok(s) => {
                    check_sample(&ds, id, s);
                    ok += 1;
                }
                Err(e) => bad.push((
                    id,
                    e.to_string(),
                    e.path().map(|p| p.to_path_buf()),
                    e.sample(),
                )),
            }
        }
    }
    assert_eq!(ok, 199);
    assert_eq!(bad.len(), 1);
    let (id, msg, path, sample) = &bad[0];
    assert_eq!(*id as usize, victim_id);
    assert_eq!(path.as_deref(), Some(paths[1].as_path()));
    assert_eq!(*sample, Some(victim_id as u64));
    assert!(
        msg.contains("checksum mismatch") && msg.contains("sample-"),
        "{msg}"
    );
}

/// The I/O thread checks host groups ahead of the consumer when it has time, and hands a group
/// the consumer waits for over part-checked (the consumer checks the rest): whoever checks, a
/// corrupt sample is named and every other sample arrives exact. A slow consumer's checks are
/// the I/O thread's (`check_cpu_s`); with checks off on a format without frames nobody checks.
#[test]
fn checks_ahead_of_the_consumer_name_corrupt_samples_at_any_pace() {
    let dir = disk_dir();
    // Samples up to 400 KB: groups of several check pieces (1 MiB), so fast consumers meet
    // groups the I/O thread has checked in part.
    let paths = write_shards(dir.path(), 300, 3, 400_000, 11);
    let mut victims = Vec::new();
    for (f, p) in paths.iter().enumerate() {
        let idx = gpufeed::dataset::shard::read_index(p).unwrap();
        let mut bytes = std::fs::read(p).unwrap();
        // A third of the samples: a check skipped anywhere shows.
        for k in (0..idx.entries.len()).step_by(3) {
            let v = idx.entries[k];
            bytes[v.offset as usize + v.len as usize / 2] ^= 0x5a;
            victims.push((f as u32, v.offset));
        }
        std::fs::write(p, &bytes).unwrap();
    }
    let ds = Dataset::open_shards(&paths).unwrap();
    let mut victim_ids: Vec<u32> = (0..ds.len() as u32)
        .filter(|&i| {
            let s = ds.sample(i as usize);
            victims.contains(&(s.file, s.offset))
        })
        .collect();
    victim_ids.sort();
    assert_eq!(victim_ids.len(), 102);
    let run = |verify: bool, step: Duration, ahead: usize| {
        let loader = Loader::builder(ds.clone())
            .batch_size(8)
            .verify_checksums(verify)
            .check_ahead_samples(ahead)
            .build()
            .unwrap();
        let mut e = loader.epoch(0).unwrap();
        let mut bad = Vec::new();
        let mut ok = 0;
        for b in e.by_ref() {
            let b = b.unwrap();
            for (j, &id) in b.sample_ids().iter().enumerate() {
                match b.sample(j) {
                    Ok(s) if verify || !victim_ids.contains(&id) => {
                        check_sample(&ds, id, s);
                        ok += 1;
                    }
                    Ok(_) => ok += 1, // checks off: a corrupt sample arrives as it is on disk
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains("checksum mismatch"), "{msg}");
                        assert_eq!(e.sample(), Some(id as u64), "{msg}");
                        assert_eq!(
                            e.path(),
                            Some(paths[ds.sample(id as usize).file as usize].as_path())
                        );
                        bad.push(id);
                    }
                }
            }
            std::thread::sleep(step);
        }
        bad.sort();
        (ok, bad, e.stats().clone())
    };
    for step_ms in [0, 1, 4] {
        let (ok, bad, st) = run(true, Duration::from_millis(step_ms), usize::MAX);
        assert_eq!(ok, 198, "step {step_ms} ms");
        assert_eq!(bad, victim_ids, "step {step_ms} ms");
        if step_ms == 4 {
            // 38 batches 4 ms apart: the disk is far ahead, and the I/O thread checks.
            assert!(st.check_cpu_s > 0.0, "{st:?}");
        }
    }
    // Groups handed over part-checked, the split falling inside a batch, on a batch's edge, and
    // after the first batches (groups hold 4 batches of 8): the consumer checks the rest.
    for ahead in [0, 3, 8, 13, 24] {
        let (ok, bad, st) = run(true, Duration::from_millis(2), ahead);
        assert_eq!((ok, &bad), (198, &victim_ids), "{ahead} checked ahead");
        assert_eq!(st.check_cpu_s > 0.0, ahead > 0, "{ahead}: {st:?}");
        assert!(st.consumer_cpu_s > 0.0, "{ahead}: {st:?}");
    }
    let (ok, bad, st) = run(false, Duration::ZERO, usize::MAX);
    assert_eq!((ok, bad.len()), (300, 0));
    assert_eq!(st.check_cpu_s, 0.0, "{st:?}");
    assert_eq!(st.stall.verify_s, 0.0, "{st:?}");
}

#[test]
fn a_shard_truncated_after_open_fails_only_its_samples() {
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 120, 2, 10_000, 4);
    let ds = Dataset::open_shards(&paths).unwrap();
    // Keys are read from the shards when first asked for: this test names samples by key, so
    // it asks before the cut (a fresh open's keys of the cut shard are unknown, below).
    assert_eq!(ds.key(0), "sample-0");
    let fresh = Dataset::open_shards(&paths).unwrap();
    // Cut the second shard in the middle of its data after the index was read.
    let idx = gpufeed::dataset::shard::read_index(&paths[1]).unwrap();
    let cut = idx.entries[30].offset + 10;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[1])
        .unwrap()
        .set_len(cut)
        .unwrap();
    let loader = Loader::builder(ds.clone()).batch_size(10).build().unwrap();
    let mut ok = 0;
    let mut eof = 0;
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            let s = ds.sample(id as usize);
            match b.sample(j) {
                Ok(bytes) => {
                    check_sample(&ds, id, bytes);
                    ok += 1;
                }
                Err(e) => {
                    assert_eq!(s.file, 1, "{e}");
                    assert!(
                        s.offset + s.len as u64 > cut,
                        "sample before the cut failed: {e}"
                    );
                    assert!(matches!(e.kind(), ErrorKind::UnexpectedEof), "{e}");
                    assert_eq!(e.path(), Some(paths[1].as_path()));
                    eof += 1;
                }
            }
        }
    }
    assert_eq!(ok + eof, 120);
    assert!(eof >= 29, "{eof}");
    // With checks off nothing would catch other bytes at the cut shard's offsets: the shard,
    // written since the open, is refused whole, named; the other shard is read.
    let loader = Loader::builder(ds.clone())
        .batch_size(10)
        .verify_checksums(false)
        .build()
        .unwrap();
    let (mut ok, mut refused) = (0, 0);
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            match b.sample(j) {
                Ok(bytes) => {
                    check_sample(&ds, id, bytes);
                    ok += 1;
                }
                Err(e) => {
                    assert_eq!(ds.sample(id as usize).file, 1, "{e}");
                    assert!(e.report().contains("written since"), "{}", e.report());
                    assert_eq!(e.path(), Some(paths[1].as_path()));
                    refused += 1;
                }
            }
        }
    }
    let second = (0..120).filter(|&i| ds.sample(i).file == 1).count();
    assert_eq!((ok, refused), (120 - second, second));
    // Keys first asked for after the cut: the cut shard's (its index is gone) read as
    // FILE#K@OFFSET, the other shard's are kept.
    let last = fresh.len() - 1;
    assert_eq!(fresh.sample(last).file, 1);
    assert!(
        fresh.key(last).starts_with("shard-00001.gpf#"),
        "{}",
        fresh.key(last)
    );
    assert_eq!(fresh.key(0), "sample-0");
}

#[test]
fn batches_outlive_their_epoch_and_stay_intact() {
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 400, 2, 20_000, 5);
    let ds = Dataset::open_shards(&paths).unwrap();
    let loader = Loader::builder(ds.clone())
        .batch_size(10)
        .window(1, 1 << 20)
        .prefetch_groups(2)
        .in_flight_groups(1)
        .build()
        .unwrap();
    let mut kept = Vec::new();
    for round in 0..30u64 {
        let mut e = loader.epoch(round).unwrap();
        // Take a few batches, keep one, drop the epoch mid-way (reads in flight).
        let take = (round % 4) as usize + 1;
        for (k, b) in e.by_ref().take(take).enumerate() {
            let b = b.unwrap();
            if k == 0 && kept.len() < 2 {
                kept.push(b);
            }
        }
        drop(e);
        // Every slot is back except the kept batches' (each batch is its own group here).
        assert_eq!(loader.free_slots(), 3 - kept.len(), "round {round}");
        // The kept batches' bytes are untouched by later epochs.
        for b in &kept {
            for (j, &id) in b.sample_ids().iter().enumerate() {
                check_sample(&ds, id, b.sample(j).unwrap());
            }
        }
    }
    // With two batches held (and their slots), a full epoch still completes.
    let n: usize = loader.epoch(99).unwrap().map(|b| b.unwrap().len()).sum();
    assert_eq!(n, 400);
    drop(kept);
}

#[test]
fn stats_show_block_order_reads_fewer_times() {
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 3000, 3, 30_000, 6);
    let ds = Dataset::open_shards(&paths).unwrap();
    let run = |order| {
        let l = Loader::builder(ds.clone())
            .batch_size(64)
            .order(order)
            .window(4, 16 << 20)
            .build()
            .unwrap();
        let mut e = l.epoch(0).unwrap();
        for b in e.by_ref() {
            b.unwrap();
        }
        e.stats().clone()
    };
    let g = run(Order::Global);
    let b = run(Order::Block {
        block_bytes: 1 << 20,
        open_blocks: 4,
    });
    assert_eq!(g.samples, b.samples);
    let rps = |s: &gpufeed::LoaderStats| s.reads as f64 / s.samples as f64;
    assert!(
        rps(&b) < 0.1 && rps(&g) > 0.5,
        "block {} global {}",
        rps(&b),
        rps(&g)
    );
}

/// The seeded faulty disk (`io::sim`: latency, reordering, short reads, EAGAIN/EINTR, EIO,
/// cancellation races) drives a whole loader, over many seeds: every sample of an epoch arrives
/// exactly once, with its exact bytes or an error naming its file and sample that an injected
/// EIO caused; a clean simulated disk delivers every sample; a loader dropped mid-epoch returns
/// every slot.
#[test]
fn the_faulty_simulated_disk_drives_the_whole_loader() {
    use gpufeed::testing::sim::{SimBackend, SimConfig};
    use gpufeed::EngineKind;
    use std::sync::Arc;
    let dir = disk_dir();
    let n = 300;
    let paths = write_shards(dir.path(), n, 3, 20_000, 21);
    let ds = Dataset::open_shards(&paths).unwrap();
    let mut failed_total = 0;
    for seed in 0..30u64 {
        let clean = seed % 5 == 0;
        let factory: gpufeed::loader::BackendFactory = Arc::new(move |epoch| {
            let cfg = if clean {
                SimConfig::clean(seed * 1000 + epoch)
            } else {
                SimConfig::faulty(seed * 1000 + epoch)
            };
            Box::new(SimBackend::new(cfg)) as Box<dyn gpufeed::io::Backend>
        });
        let loader = Loader::builder(ds.clone())
            .batch_size(1 + (seed % 13) as u32)
            .order(modes()[(seed % 3) as usize])
            .seed(seed)
            .window(2, 1 << 20)
            .backend(EngineKind::Uring, factory)
            .build()
            .unwrap();
        let mut seen = vec![0u32; n];
        for b in loader.epoch(seed).unwrap() {
            let b = b.unwrap_or_else(|e| panic!("seed {seed}: {}", e.report()));
            for (j, &id) in b.sample_ids().iter().enumerate() {
                seen[id as usize] += 1;
                match b.sample(j) {
                    Ok(bytes) => check_sample(&ds, id, bytes),
                    Err(e) => {
                        assert!(
                            !clean,
                            "seed {seed}: an error on a clean disk: {}",
                            e.report()
                        );
                        assert_eq!(e.sample(), Some(id as u64));
                        assert!(e.path().is_some());
                        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{}", e.report());
                        failed_total += 1;
                    }
                }
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "seed {seed}: not exactly once"
        );
        // Dropped mid-epoch: every slot comes back.
        let mut e = loader.epoch(seed + 1).unwrap();
        let _ = e.next();
        drop(e);
        assert_eq!(
            loader.free_slots(),
            loader.slots(),
            "seed {seed}: a slot was lost"
        );
    }
    assert!(
        failed_total > 0,
        "the faulty disk injected no error the loader reported"
    );
}

/// One I/O thread (one engine, made once) serves every epoch of a loader; epochs asked for in
/// advance deliver exactly what epochs asked for one at a time deliver; dropping a queued or
/// half-read epoch gives every slot back and leaves the next epoch whole.
#[test]
fn one_io_thread_serves_epochs_asked_in_advance() {
    use gpufeed::testing::sim::{SimBackend, SimConfig};
    use gpufeed::EngineKind;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = disk_dir();
    let n = 400;
    let paths = write_shards(dir.path(), n, 3, 20_000, 23);
    let ds = Dataset::open_shards(&paths).unwrap();
    let engines = Arc::new(AtomicUsize::new(0));
    let made = engines.clone();
    let factory: gpufeed::loader::BackendFactory = Arc::new(move |epoch| {
        made.fetch_add(1, Ordering::Relaxed);
        Box::new(SimBackend::new(SimConfig::clean(epoch))) as Box<dyn gpufeed::io::Backend>
    });
    let build = |f: Option<gpufeed::loader::BackendFactory>| {
        let b = Loader::builder(ds.clone())
            .batch_size(7)
            .seed(3)
            .window(2, 1 << 20);
        match f {
            Some(f) => b.backend(EngineKind::Uring, f),
            None => b,
        }
        .build()
        .unwrap()
    };
    let ids = |e: gpufeed::Epoch| -> Vec<Vec<u32>> {
        e.map(|b| {
            let b = b.unwrap();
            for (j, &id) in b.sample_ids().iter().enumerate() {
                check_sample(&ds, id, b.sample(j).unwrap());
            }
            b.sample_ids().to_vec()
        })
        .collect()
    };
    // What each epoch is when asked for alone, from a loader of its own.
    let alone: Vec<Vec<Vec<u32>>> = (0..4).map(|e| ids(build(None).epoch(e).unwrap())).collect();
    let loader = build(Some(factory));
    // Epochs 0 and 1 asked for up front, 2 while 1 is read.
    let e0 = loader.epoch(0).unwrap();
    let e1 = loader.epoch(1).unwrap();
    assert_eq!(ids(e0), alone[0]);
    let mut e1 = e1;
    let first = e1.next().unwrap().unwrap().sample_ids().to_vec();
    let e2 = loader.epoch(2).unwrap();
    let mut rest = vec![first];
    rest.extend(ids(e1));
    assert_eq!(rest, alone[1]);
    // Epoch 3 asked for while 2 is dropped half-read, and a queued epoch dropped unread.
    let mut e2 = e2;
    let _ = e2.next();
    let queued = loader.epoch(9).unwrap();
    let e3 = loader.epoch(3).unwrap();
    drop(e2);
    drop(queued);
    assert_eq!(ids(e3), alone[3]);
    assert_eq!(loader.free_slots(), loader.slots(), "a slot was lost");
    assert_eq!(
        engines.load(Ordering::Relaxed),
        1,
        "every epoch should be served by the loader's one engine"
    );
}

/// A simulated disk that takes `delay` for every wait on completions: storage slower than the
/// consumer.
pub(crate) struct SlowDisk {
    pub(crate) inner: gpufeed::testing::sim::SimBackend,
    pub(crate) delay: std::time::Duration,
}

impl gpufeed::io::Backend for SlowDisk {
    fn name(&self) -> &'static str {
        "slow-sim"
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    unsafe fn push(
        &mut self,
        op: gpufeed::io::RawRead,
    ) -> std::result::Result<(), gpufeed::io::RawRead> {
        // SAFETY: forwarded under the caller's promise about `op.buf`.
        unsafe { self.inner.push(op) }
    }
    fn submit(&mut self, wait: usize) -> std::io::Result<()> {
        if wait > 0 {
            std::thread::sleep(self.delay);
        }
        self.inner.submit(wait)
    }
    fn reap(&mut self, out: &mut Vec<gpufeed::io::RawDone>) {
        self.inner.reap(out)
    }
    fn cancel_all(&mut self) {
        self.inner.cancel_all()
    }
    fn syscalls(&self) -> u64 {
        self.inner.syscalls()
    }
}

/// The consumer's waits are split by cause: with a slow disk and a fast consumer, storage is
/// the bound and takes most of the wait; with a fast disk and a slow consumer (a trainer's
/// step), the consumer hardly waits at all.
#[test]
fn stalls_are_attributed_to_storage_when_reads_are_slow() {
    use gpufeed::testing::sim::{SimBackend, SimConfig};
    use gpufeed::EngineKind;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let dir = disk_dir();
    let paths = write_shards(dir.path(), 400, 2, 8_000, 5);
    let ds = Dataset::open_shards(&paths).unwrap();
    let factory: gpufeed::loader::BackendFactory = Arc::new(|epoch| {
        Box::new(SlowDisk {
            inner: SimBackend::new(SimConfig::clean(epoch)),
            delay: Duration::from_millis(4),
        }) as Box<dyn gpufeed::io::Backend>
    });
    let slow = Loader::builder(ds.clone())
        .batch_size(8)
        .window(2, 1 << 20)
        .backend(EngineKind::Uring, factory)
        .build()
        .unwrap();
    let mut epoch = slow.epoch(0).unwrap();
    let (mut reads, mut per_batch) = (0.0, 0.0);
    for b in epoch.by_ref() {
        let b = b.unwrap();
        reads += b.timing().read_s;
        per_batch += b.timing().stall.total_s();
    }
    let st = epoch.stats().clone();
    let s = st.stall;
    // The epoch's split is the sum of its batches' splits.
    assert!(
        (per_batch - s.total_s()).abs() < 1e-9,
        "{per_batch} vs {s:?}"
    );
    eprintln!("slow disk: {s:?}, io cpu {:.4}", st.io_thread_cpu_s);
    assert!(reads > 0.0, "groups took time to read");
    assert_eq!(s.bound(), "storage", "{s:?}");
    assert!(s.storage_s > 0.6 * s.total_s(), "{s:?}");
    assert!(
        s.total_s() >= st.consumer_wait_s * 0.99,
        "{s:?} vs wait {}",
        st.consumer_wait_s
    );
    assert!(st.reads_per_sample() > 0.0 && st.read_amplification() >= 1.0);

    // A fast disk (the real engine) and a consumer that takes 10 ms per batch: little waiting.
    let fast = Loader::builder(ds).batch_size(8).build().unwrap();
    let t0 = Instant::now();
    let mut epoch = fast.epoch(0).unwrap();
    for b in epoch.by_ref() {
        b.unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let s = epoch.stats().stall;
    eprintln!("slow consumer: {s:?} of {elapsed:.3} s");
    assert!(s.total_s() < 0.1 * elapsed, "{s:?} of {elapsed} s");
}

/// A loader built before `fork()` and used in the child (PyTorch DataLoader workers, the fork
/// start method) fails at once with an error that says what to do, instead of waiting for an
/// I/O thread that exists only in the parent; the parent goes on reading. Runs in a child
/// process of the test binary, where few threads are running when it forks.
#[test]
fn a_loader_used_after_fork_fails_at_once_saying_what_to_do() {
    let dir = disk_dir();
    write_shards(dir.path(), 64, 2, 4000, 8);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "loader::fork_child", "--nocapture"])
        .env("GPUFEED_IT_FORK_DIR", dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "child ran no test:\n{text}");
    assert!(text.contains("after fork()"), "{text}");
}

#[test]
#[ignore = "run by a_loader_used_after_fork_fails_at_once_saying_what_to_do in a child process"]
fn fork_child() {
    let Some(dir) = std::env::var_os("GPUFEED_IT_FORK_DIR") else {
        return;
    };
    let loader = Loader::builder(Dataset::open(&dir).unwrap())
        .batch_size(8)
        .build()
        .unwrap();
    // The I/O thread is running: one epoch read before the fork.
    assert_eq!(
        loader
            .epoch(0)
            .unwrap()
            .map(|b| b.unwrap().len())
            .sum::<usize>(),
        64
    );
    // SAFETY: fork in a test process; the child only asks the loader for an epoch (which must
    // fail before touching the parent's thread or ring), writes one line and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = match loader.epoch(1) {
            Err(e) if e.to_string().contains("after fork()") => {
                eprintln!("child: {e}");
                0
            }
            Err(e) => {
                eprintln!("child: another error: {e}");
                2
            }
            Ok(_) => 3,
        };
        // SAFETY: ends the child without running the parent's destructors or atexit handlers.
        unsafe { libc::_exit(code) };
    }
    // The child must end promptly (a hang is the failure this guards against).
    let t0 = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child without blocking; `status` is writable.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            // SAFETY: kills our own child, which is hanging.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the child hung using a loader built before fork()");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(libc::WIFEXITED(status), "child did not exit: {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child saw the wrong outcome");
    // The parent's loader is unharmed.
    assert_eq!(
        loader
            .epoch(1)
            .unwrap()
            .map(|b| b.unwrap().len())
            .sum::<usize>(),
        64
    );
}

/// Reads are laid out in a slot at the plan's alignment; a file whose direct I/O needs more
/// would have its reads widened over their neighbours' bytes (or, where the memory alignment
/// is the larger, the whole group refused by the engine with a message about buffer offsets).
/// The I/O thread refuses such a file's samples with an error naming it and the setting.
/// Planned here at 256 bytes, below what a block device's direct I/O takes (512 at least);
/// where the engine reads without O_DIRECT (a file system that refuses it) the plan holds and
/// every sample is exact.
#[test]
fn a_file_needing_more_alignment_than_planned_is_refused_not_overlapped() {
    let dir = disk_dir();
    let shards = keyed_shards(dir.path(), 300, 300, (4, 3000, 3), |i, len| {
        (0..len).map(|k| (i * 31 + k) as u8).collect()
    });
    let ds = Dataset::open(dir.path()).unwrap();
    let loader = Loader::builder(std::sync::Arc::new(ds))
        .plan(gpufeed::PlanConfig {
            batch_size: 16,
            align: 256,
            order: Order::Global,
            gap_bytes_max: 0,
            ..gpufeed::PlanConfig::default()
        })
        .build()
        .unwrap();
    let (mut exact, mut refused) = (0, 0);
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for i in 0..b.len() {
            let id = b.sample_ids()[i] as usize;
            match b.sample(i) {
                Ok(got) => {
                    let want: Vec<u8> = (0..got.len()).map(|k| (id * 31 + k) as u8).collect();
                    assert_eq!(got, &want[..], "sample {id}");
                    exact += 1;
                }
                Err(e) => {
                    let msg = e.report();
                    assert!(
                        msg.contains("alignment") && msg.contains("PlanConfig::align"),
                        "{msg}"
                    );
                    assert!(msg.contains(&*shards[0].to_string_lossy()), "{msg}");
                    refused += 1;
                }
            }
        }
    }
    assert_eq!(exact + refused, 300);
    assert!(
        exact == 0 || refused == 0,
        "{exact} exact and {refused} refused"
    );
    eprintln!("{exact} samples exact (no O_DIRECT), {refused} refused for their file's alignment");
}
