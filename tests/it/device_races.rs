//! The adversarial simulated device (issue 38, item 3): every device operation — copies both
//! ways, memsets, kernel launches, the JPEG engine's batched decode and its initialisation —
//! completes late on its stream, in any order the streams allow, and the simulator counts a
//! hazard whenever an operation runs while an earlier one on the same memory is still pending,
//! or the host writes, frees, re-initialises or reads memory a pending operation touches. Each
//! test here drives the image pipeline into one ordering the review of the CUDA side found
//! unsound (findings 1, 2, 3, 7 and the failed resize) and asserts no hazard and right pixels.

use std::sync::Arc;

use gpufeed::decode::{ImageSpec, PixelType};
use gpufeed::gpu::SimDevice;
use gpufeed::{Dataset, Device, Order};

use crate::common::disk_dir;
use crate::device_images::{collect, compare, kernels, loader, make_set, Collected};

/// A simulated device whose operations linger (up to `delay` ticks), seeded.
fn sim(seed: u64, delay: u32) -> SimDevice {
    let mut s = SimDevice::new(seed);
    s.delay_max = delay;
    s
}

/// No hazard, no copy problem: or the hazards, said.
fn assert_clean(sim: &SimDevice) {
    let st = &sim.stats;
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        st.hazards.load(relaxed),
        0,
        "the simulated device saw hazards:\n{}",
        sim.hazards().join("\n")
    );
    assert_eq!(st.source_changed.load(relaxed), 0);
    assert_eq!(st.region_in_use.load(relaxed), 0);
}

fn spec(threads: usize) -> ImageSpec {
    let mut s = ImageSpec::train(32).dtype(PixelType::F32).threads(threads);
    s.dct_scaling = false;
    s
}

/// The CPU stage's tensors for the set: what every device run must equal.
fn reference(ds: &Arc<Dataset>, threads: usize) -> Collected {
    let il = loader(ds, Order::Global, 0, 1, None)
        .decode_images(spec(threads))
        .unwrap();
    collect(&il, 0, 0, false)
}

fn assert_same(got: &Collected, want: &Collected, spec: &ImageSpec) {
    let names = |c: &Collected| c.1.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "the same samples fail");
    assert_eq!(got.0.len(), want.0.len());
    for (id, t) in &got.0 {
        let (worst, _) = compare(t, &want.0[id], spec);
        assert!(
            worst <= 0.25,
            "sample {id}: {worst} levels from the CPU stage"
        );
    }
}

/// A loader of `ds` on `sim` with checks off: no crc32c kernel (and none of its host waits).
fn unchecked(ds: &Arc<Dataset>, sim: &SimDevice) -> gpufeed::Loader {
    gpufeed::Loader::builder(ds.clone())
        .batch_size(5)
        .order(Order::Global)
        .seed(21)
        .verify_checksums(false)
        .device(Device::Simulated(sim.clone()))
        .build()
        .unwrap()
}

/// The image set packed, opened (its directory lives as long as the first value).
fn the_set() -> (tempfile::TempDir, crate::device_images::Set, Arc<Dataset>) {
    let dir = disk_dir();
    let set = make_set(dir.path());
    let ds = Arc::new(Dataset::open(&set.packed).unwrap());
    (dir, set, ds)
}

/// An epoch of the set on a simulated device per seed (operations lingering up to `delay`
/// ticks): no hazard, and the CPU stage's tensors and failures.
fn decodes_clean(ds: &Arc<Dataset>, order: Order, threads: usize, seeds: u64, delay: u32) {
    let want = reference(ds, threads);
    for seed in 1..=seeds {
        let s = sim(seed, delay);
        let l = loader(ds, order, 0, 1, Some(Device::Simulated(s.clone())));
        let il = l.decode_images(spec(threads)).unwrap();
        let got = collect(&il, 0, 0, true);
        let r = il.routes().unwrap();
        assert!(r.hardware > 0 && r.pipelined > 0, "{r:?}");
        drop(il);
        assert_clean(&s);
        assert_same(&got, &want, &spec(threads));
    }
}

/// Finding 1: each batch re-initialises the one decoder state on the host; the previous
/// batch's decode, still queued on the stage's stream, uses it.
#[test]
fn a_batch_never_reinitialises_the_decoder_state_under_a_pending_decode() {
    if !kernels() {
        return;
    }
    let (_dir, _, ds) = the_set();
    decodes_clean(&ds, Order::Global, 3, 3, 40);
}

/// Finding 2: a hardware batch holding an image the engine rejects (a truncated JPEG whose
/// header routes it there) fails; its images are decoded on the CPU and the staging buffer is
/// rewritten, which must wait for what the failed batch had already queued.
#[test]
fn a_failed_hardware_batch_is_waited_for_before_its_staging_is_rewritten() {
    if !kernels() {
        return;
    }
    let (_dir, set, ds) = the_set();
    assert!(set.failing.iter().any(|k| k == "bad-truncated.jpg"));
    decodes_clean(&ds, Order::Sequential, 1, 4, 40);
}

/// Finding 3: with checks off (no device crc32c, so no kernel waits on the group's copy), the
/// engine must still read each bitstream only after the copy that brings it has completed.
#[test]
fn with_checks_off_the_engine_reads_bitstreams_only_after_their_copy() {
    if !kernels() {
        return;
    }
    let (_dir, _, ds) = the_set();
    for seed in 1..=3 {
        let s = sim(seed, 5000); // copies linger: an engine reading early meets one pending
        let l = unchecked(&ds, &s);
        let il = l.decode_images(spec(2)).unwrap();
        let (got, _) = collect(&il, 0, 0, true);
        assert_eq!(got.len(), ds.len());
        assert!(il.routes().unwrap().crc_checked == 0);
        drop(il);
        assert_clean(&s);
    }
}

/// Finding 7: a batch several consumer streams waited on (torch's current stream and a side
/// stream), and one exported with DLPack's `stream=-1` (no wait; read on the legacy stream),
/// is rewritten only after the work each of them queued on it before the drop.
#[test]
fn a_tensor_is_rewritten_only_after_every_consumer_stream_released_it() {
    if !kernels() {
        return;
    }
    let (_dir, _, ds) = the_set();
    for seed in 1..=3 {
        let s = sim(seed, 30);
        let (a, b) = (s.consumer_stream(), s.consumer_stream());
        let l = loader(&ds, Order::Global, 0, 1, Some(Device::Simulated(s.clone())));
        let il = l.decode_images(spec(2)).unwrap();
        for epoch in 0..2 {
            for batch in il.epoch(epoch).unwrap() {
                let batch = batch.unwrap();
                let (ptr, len) = batch.sim_ptr().expect("a simulated device batch");
                // SAFETY: the streams are the simulated device's (1: its legacy stream) and
                // outlive the batch.
                unsafe {
                    batch.wait_on(a).unwrap();
                    batch.wait_on(b).unwrap();
                }
                // DLPack's stream=-1: no wait; the consumer orders itself (here: it waits for
                // the tensor on the host), then reads on the legacy stream.
                batch.to_host().unwrap();
                // SAFETY: as above.
                unsafe { batch.release_after(1) };
                s.read_on(a, ptr, len).unwrap();
                s.read_on(b, ptr, len).unwrap();
                s.read_on(1, ptr, len).unwrap();
                drop(batch);
            }
        }
        drop(il);
        s.synchronize();
        assert_clean(&s);
    }
}

/// The pipeline (issue 53): the engines write a batch's decoded images into the staging
/// buffer of its output tensor while its stream may still hold the resize that read the
/// tensor's previous batch from there — and the engines ignore stream order. A consumer that
/// never waits on the host (its stream waits on each batch, reads it, drops it), with the
/// device's work lingering, checks off: only the host's wait before the staging is reused
/// keeps them apart.
#[test]
fn the_engines_rewrite_a_staging_buffer_only_after_the_host_saw_its_last_reader_finish() {
    if !kernels() {
        return;
    }
    let (_dir, _, ds) = the_set();
    for seed in 1..=3 {
        let s = sim(seed, 1_000_000);
        let a = s.consumer_stream();
        // Checks off: no crc32c kernel on the tensor's stream, whose host wait would cover it.
        let l = unchecked(&ds, &s);
        let il = l.decode_images(spec(2)).unwrap();
        for epoch in 0..3 {
            for batch in il.epoch(epoch).unwrap() {
                let batch = batch.unwrap();
                let (ptr, len) = batch.sim_ptr().expect("a simulated device batch");
                // SAFETY: the stream is the simulated device's and outlives the batch.
                unsafe { batch.wait_on(a).unwrap() };
                s.read_on(a, ptr, len).unwrap();
            }
        }
        let r = il.routes().unwrap();
        assert!(r.pipelined > 0 && r.hardware > 0, "{r:?}");
        drop(il);
        s.synchronize();
        assert_clean(&s);
    }
}

/// A resize launch that fails leaves its tensor zero-filled with every sample's error, not the
/// pixels the tensor's previous batch left there.
#[test]
fn a_failed_resize_launch_hands_out_zeros_not_the_previous_batch() {
    if !kernels() {
        return;
    }
    let (_dir, _, ds) = the_set();
    let mut s = sim(5, 10);
    s.fail_launch_every = 3;
    let l = loader(&ds, Order::Global, 0, 1, Some(Device::Simulated(s.clone())));
    let il = l.decode_images(spec(2)).unwrap();
    let mut launch_failures = 0;
    for epoch in 0..3 {
        // `collect` asserts every failed sample's tensor is zeros.
        let (_, errors) = collect(&il, epoch, 0, true);
        launch_failures += errors
            .iter()
            .filter(|(_, e)| e.contains("cuLaunchKernel"))
            .count();
    }
    assert!(
        launch_failures >= 5,
        "{launch_failures} samples lost to failed launches"
    );
    drop(il);
    assert_clean(&s);
}

/// Finding 4: a record that understates its image (a shard whose index says 64x48 for a larger
/// JPEG) must not size the engine's output slot: the slot comes from the bitstream's own
/// frame header, and the sample fails with the mismatch said, the others unharmed.
#[test]
fn an_image_record_that_understates_its_image_never_sizes_the_engines_slot() {
    if !kernels() {
        return;
    }
    use gpufeed::dataset::shard::ShardWriter;
    let dir = disk_dir();
    let shards = dir.path().join("lying");
    std::fs::create_dir_all(&shards).unwrap();
    let path = shards.join("s0.gpf");
    let mut w = ShardWriter::create(&path, 1).unwrap();
    let mut good = Vec::new();
    for i in 0..12u64 {
        // Baseline YCbCr JPEGs only (the engines' route).
        let k = gpufeed::testing::synth::kind_of(i);
        if k.channels == 4 || k.progressive {
            continue;
        }
        let b = gpufeed::testing::synth::jpeg(3, i).unwrap();
        w.add(&format!("{i:03}.jpg"), 0, b"", &b).unwrap();
        good.push(b);
    }
    w.finish().unwrap();
    // The second image's record, halved in the index; the index and header crcs redone.
    let info = gpufeed::image::info(&good[1]).unwrap();
    let mut f = std::fs::read(&path).unwrap();
    let at = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap()) as usize;
    let (io, il) = (at(32), at(40));
    let mut pat = info.width.to_le_bytes().to_vec();
    pat.extend_from_slice(&info.height.to_le_bytes());
    let idx = &f[io..io + il];
    let hits: Vec<usize> = (0..idx.len() - 8)
        .filter(|&k| idx[k..k + 8] == pat[..])
        .collect();
    assert_eq!(hits.len(), 1, "the record is found once in the index");
    let k = io + hits[0];
    f[k..k + 4].copy_from_slice(&(info.width / 2).to_le_bytes());
    f[k + 4..k + 8].copy_from_slice(&(info.height / 2).to_le_bytes());
    let crc = gpufeed::crc32c::crc32c(&f[io..io + il]);
    f[48..52].copy_from_slice(&crc.to_le_bytes());
    let crc = gpufeed::crc32c::crc32c(&f[..60]);
    f[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &f).unwrap();

    let ds = Arc::new(Dataset::open(&shards).unwrap());
    let rec = ds.image_info().unwrap()[1];
    assert_eq!((rec.width, rec.height), (info.width / 2, info.height / 2));
    // The host stage decodes from the bytes alone (records route and size the device path).
    let want = reference(&ds, 2);
    assert!(want.1.is_empty());
    for seed in 1..=3 {
        let s = sim(seed, 20);
        let l = loader(&ds, Order::Global, 0, 1, Some(Device::Simulated(s.clone())));
        let il = l.decode_images(spec(2)).unwrap();
        let got = collect(&il, 0, 0, true);
        drop(il);
        assert_clean(&s);
        assert_eq!(got.1.len(), 1, "{:?}", got.1);
        assert_eq!(got.1[0].0, "001.jpg");
        assert!(got.1[0].1.contains("image record says"), "{:?}", got.1);
        for (id, t) in &got.0 {
            if *id != 1 {
                let (worst, _) = compare(t, &want.0[id], &spec(2));
                assert!(
                    worst <= 0.25,
                    "sample {id}: {worst} levels from the CPU stage"
                );
            }
        }
    }
}
