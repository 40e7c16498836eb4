//! The device path without a GPU: the loader with the simulated device (host memory standing
//! in for device memory, copies completing late and out of order). Every sample arrives once
//! with its bytes; no slot is reused while its copy is in flight (the simulator re-checks each
//! copy's source when it completes); no region is written while batches view it; dropping a
//! loader mid-epoch with copies in flight returns every slot and region. And with no GPU, every
//! CUDA entry point is an error, never a panic.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use gpufeed::gpu::SimDevice;
use gpufeed::testing::Rng;
use gpufeed::{Dataset, Device, ErrorKind, Loader, Order};

use crate::common::*;

fn content(i: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(i as u64 * 31 + 5);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn shards(dir: &Path, n: usize, per: usize) -> Vec<PathBuf> {
    keyed_shards(dir, n, per, (9, 30_000, 5), content)
}

fn sim_loader(ds: &Dataset, order: Order, sim: &SimDevice) -> Loader {
    Loader::builder(ds.clone())
        .batch_size(8)
        .order(order)
        .seed(11)
        .window(3, 1 << 20)
        .device(Device::Simulated(sim.clone()))
        .build()
        .unwrap()
}

fn check(ds: &Dataset, b: &gpufeed::Batch, seen: &mut [u32]) {
    assert!(b.is_device());
    assert!(b.sample(0).is_err(), "device bytes are not host slices");
    for (j, s) in b.to_host().unwrap().into_iter().enumerate() {
        let id = b.sample_ids()[j] as usize;
        let bytes = s.unwrap();
        let i: usize = ds.key(id).parse().unwrap();
        assert!(
            bytes == content(i, bytes.len()),
            "sample {id}: bytes differ"
        );
        assert_eq!(bytes.len(), ds.sample(id).len as usize);
        seen[id] += 1;
    }
}

fn assert_all_returned(loader: &Loader) {
    // The I/O thread has joined when the epoch was dropped: everything is back.
    assert_eq!(loader.free_slots(), loader.slots(), "a slot did not return");
    let (free, all) = loader.free_device_regions().unwrap();
    assert_eq!(free, all, "a device region did not return");
}

#[test]
fn every_sample_once_through_out_of_order_copies() {
    let dir = disk_dir();
    let n = 8 * 60;
    let ds = Dataset::open_shards(&shards(dir.path(), n, 100)).unwrap();
    for (k, order) in [
        Order::Global,
        Order::ShardBuffer { buffer: 40 },
        Order::Block {
            block_bytes: 256 << 10,
            open_blocks: 3,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let mut sim = SimDevice::new(k as u64 + 1);
        // Copies linger for up to 200 ticks (one per call into the device): the I/O thread
        // reads the next groups meanwhile, so copies overlap whatever the seed.
        sim.delay_max = 200;
        let loader = sim_loader(&ds, order, &sim);
        let mut seen = vec![0u32; n];
        let mut epoch = loader.epoch(2).unwrap();
        for (i, b) in epoch.by_ref().enumerate() {
            let b = b.unwrap();
            assert_eq!(b.index() as usize, i);
            check(&ds, &b, &mut seen);
        }
        assert!(
            epoch.stats().engine.contains("H2D"),
            "{}",
            epoch.stats().engine
        );
        drop(epoch);
        assert!(seen.iter().all(|&c| c == 1), "{order:?}");
        let st = &sim.stats;
        assert!(st.copies.load(Ordering::Relaxed) > 0);
        assert!(
            st.in_flight_max.load(Ordering::Relaxed) >= 2,
            "copies overlapped"
        );
        assert_eq!(st.source_changed.load(Ordering::Relaxed), 0);
        assert_eq!(st.region_in_use.load(Ordering::Relaxed), 0);
        assert_all_returned(&loader);
    }
}

#[test]
fn dropping_mid_epoch_with_copies_in_flight_returns_everything() {
    let dir = disk_dir();
    let n = 8 * 40;
    let ds = Dataset::open_shards(&shards(dir.path(), n, 64)).unwrap();
    for seed in 0..40u64 {
        let mut sim = SimDevice::new(seed);
        sim.delay_max = 40; // copies linger: many are in flight at the drop
        let loader = sim_loader(&ds, Order::Global, &sim);
        let mut epoch = loader.epoch(seed).unwrap();
        let take = (seed % 7) as usize;
        let mut held = Vec::new();
        for b in epoch.by_ref().take(take) {
            held.push(b.unwrap());
        }
        drop(epoch);
        drop(held);
        assert_all_returned(&loader);
        assert_eq!(
            sim.stats.source_changed.load(Ordering::Relaxed),
            0,
            "seed {seed}"
        );
        assert_eq!(
            sim.stats.region_in_use.load(Ordering::Relaxed),
            0,
            "seed {seed}"
        );
    }
}

#[test]
fn a_batch_kept_alive_keeps_its_bytes_while_regions_recycle() {
    let dir = disk_dir();
    let n = 8 * 50;
    let ds = Dataset::open_shards(&shards(dir.path(), n, 80)).unwrap();
    let sim = SimDevice::new(77);
    let loader = Loader::builder(ds.clone())
        .batch_size(8)
        .window(1, 1 << 20)
        .prefetch_groups(1)
        .in_flight_groups(1)
        .device(Device::Simulated(sim.clone()))
        .build()
        .unwrap();
    let mut epoch = loader.epoch(0).unwrap();
    let first = epoch.next().unwrap().unwrap();
    let before = first.to_host().unwrap();
    let mut seen = vec![0u32; n];
    for b in epoch.by_ref() {
        check(&ds, &b.unwrap(), &mut seen);
    }
    let after = first.to_host().unwrap();
    assert_eq!(
        before
            .iter()
            .map(|r| r.as_ref().unwrap().clone())
            .collect::<Vec<_>>(),
        after
            .iter()
            .map(|r| r.as_ref().unwrap().clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(seen.iter().filter(|&&c| c == 1).count(), n - 8);
    assert_eq!(sim.stats.region_in_use.load(Ordering::Relaxed), 0);
    drop(first);
    drop(epoch);
    assert_all_returned(&loader);
}

#[test]
fn corrupt_sample_is_an_error_on_the_device_path_too() {
    let dir = disk_dir();
    let n = 64;
    let paths = shards(dir.path(), n, 64);
    let ds = Dataset::open_shards(&paths).unwrap();
    let victim = 17usize;
    let s = ds.sample(victim);
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    bytes[s.offset as usize] ^= 0xff;
    std::fs::write(&paths[0], bytes).unwrap();
    let sim = SimDevice::new(3);
    let loader = sim_loader(&ds, Order::Global, &sim);
    let mut bad = 0;
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, r) in b.to_host().unwrap().into_iter().enumerate() {
            if b.sample_ids()[j] as usize == victim {
                let e = r.unwrap_err();
                assert!(e.to_string().contains("checksum"), "{e}");
                assert_eq!(e.sample(), Some(victim as u64));
                bad += 1;
            } else {
                r.unwrap();
            }
        }
    }
    assert_eq!(bad, 1);
}

/// With no GPU (this machine, or `CUDA_VISIBLE_DEVICES=` on a GPU machine), every entry point
/// says so with an error; nothing panics.
#[test]
fn no_gpu_is_an_error_not_a_panic() {
    if std::env::var_os("GPUFEED_REQUIRE_GPU").is_some()
        && std::env::var_os("CUDA_VISIBLE_DEVICES").is_none()
    {
        eprintln!("skipped: a GPU is required here; the no-GPU path is checked with CUDA_VISIBLE_DEVICES=");
        return;
    }
    if gpufeed::gpu_available().is_ok() {
        eprintln!(
            "skipped: a GPU is visible (run with CUDA_VISIBLE_DEVICES= to check the no-GPU path)"
        );
        return;
    }
    let e = gpufeed::gpu_available().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let dir = disk_dir();
    let ds = Dataset::open_shards(&shards(dir.path(), 16, 16)).unwrap();
    let e = Loader::builder(ds)
        .batch_size(4)
        .device(Device::Cuda(0))
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(gpufeed::testing::context(0).is_err());
    let st = gpufeed::testing::cufile::status();
    assert!(st.is_err());
    // The CLI: one clear line, non-zero exit.
    let out = std::process::Command::new(gpufeed_bin())
        .args(["bench", "gpu"])
        .env("GPUFEED_QUIET", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("GPU") || err.contains("CUDA"), "{err}");
}

/// Framed samples (TFRecord Examples) on the device path: frame and Example are checked before
/// the copy, the ranges point at the payload inside the copied region, and the labels are the
/// Examples' own.
#[test]
fn tfrecord_examples_are_unwrapped_on_the_device_path() {
    let dir = disk_dir();
    let p = dir.path().join("r.tfrecord");
    let mut f = Vec::new();
    let data = |i: usize| content(i, 1 + i * 53 % 4000);
    for i in 0..64 {
        f.extend(tf_record(&tf_example(&data(i), 1000 + i as i64)));
    }
    std::fs::write(&p, &f).unwrap();
    let ds = Dataset::open(&p).unwrap();
    // Record 9's data is damaged afterwards: an error for it alone.
    let nine = ds.sample(9);
    f[nine.offset as usize + 40] ^= 1;
    std::fs::write(&p, &f).unwrap();
    let sim = SimDevice::new(5);
    let loader = Loader::builder(ds.clone())
        .batch_size(8)
        .window(2, 1 << 20)
        .device(Device::Simulated(sim.clone()))
        .build()
        .unwrap();
    let mut seen = 0;
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, s) in b.to_host().unwrap().into_iter().enumerate() {
            let id = b.sample_ids()[j] as usize;
            if id == 9 {
                assert!(s.unwrap_err().to_string().contains("data checksum"));
            } else {
                assert_eq!(s.unwrap(), data(id), "record {id}");
                assert_eq!(b.labels()[j], 1000 + id as i64);
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 64);
    assert_eq!(sim.stats.source_changed.load(Ordering::Relaxed), 0);
}
