//! The consumer sets the pace (DESIGN): a trainer that pauses for minutes (an evaluation, a
//! checkpoint, a debugger) or takes seconds per step is never an error, on byte and image
//! loaders, one rank or two; a time limit is the caller's choice, and its error names what the
//! wait is for and who holds the read buffers, in the caller's own setting names.
//!
//! The slow scenarios are sleeps, not work: they run at once, on threads, in one test (about
//! 110 s of wall time). Each is shaped so that the I/O thread finds every read buffer taken for
//! longer than the 30 s after which the loader used to fail the epoch (each failed on the build
//! before this test, image loaders included).

use std::sync::OnceLock;
use std::time::Duration;

use gpufeed::decode::{ImageSpec, PixelType, Transform};
use gpufeed::testing::synth;
use gpufeed::{Dataset, ErrorKind, Loader};

use crate::common::{disk_dir, keyed_shards};

/// Samples in both datasets: 11 batches a rank of 8 (one rank) or of 4 (two ranks).
const N: usize = 88;

fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// The byte and image datasets, made once.
fn data() -> &'static (tempfile::TempDir, Dataset, Dataset) {
    static D: OnceLock<(tempfile::TempDir, Dataset, Dataset)> = OnceLock::new();
    D.get_or_init(|| {
        let dir = disk_dir();
        let bytes = dir.path().join("bytes");
        std::fs::create_dir_all(&bytes).unwrap();
        keyed_shards(&bytes, N, 30, (5, 40_000, 7), content);
        let images = dir.path().join("images");
        synth::write_image_folder(&images, N as u64, 3).unwrap();
        let b = Dataset::open(&bytes).unwrap();
        let i = Dataset::open(&images).unwrap();
        (dir, b, i)
    })
}

#[derive(Clone, Copy, Debug)]
enum Pace {
    /// Two batches, then 90 s with the second still held, then the rest at once.
    Pause90,
    /// 10 s per batch, each held while "training" on it.
    Slow10,
}

impl Pace {
    fn after(self, k: usize) -> Duration {
        match (self, k) {
            (Pace::Pause90, 1) => Duration::from_secs(90),
            (Pace::Pause90, _) => Duration::ZERO,
            (Pace::Slow10, _) => Duration::from_secs(10),
        }
    }
}

/// Two read buffers (one read ahead, one in flight) of 5-batch groups: the third group waits
/// for the first to be given back, which a consumer at 10 s a batch takes 40 s (an image
/// loader: its decode stage lets a group go once its last batch is taken decoded) or 50 s (a
/// byte loader: the batch is held through its step) to do.
fn builder(ds: &Dataset, rank: u32, world: u32) -> gpufeed::loader::LoaderBuilder {
    Loader::builder(ds.clone())
        .batch_size(if world == 1 { 8 } else { 4 })
        .rank(rank, world)
        .seed(11)
        .window(5, 16 << 20)
        .prefetch_groups(1)
        .in_flight_groups(1)
}

fn consume_bytes(l: Loader, pace: Pace) -> Vec<u32> {
    let mut ids = Vec::new();
    for (k, b) in l.epoch(0).unwrap().enumerate() {
        let b = b.unwrap_or_else(|e| panic!("batch {k} at {pace:?}: {}", e.report()));
        for (j, &id) in b.sample_ids().iter().enumerate() {
            let want = content(id as usize, b.sample(j).unwrap().len());
            assert_eq!(b.sample(j).unwrap(), &want[..], "sample {id}");
        }
        ids.extend_from_slice(b.sample_ids());
        std::thread::sleep(pace.after(k)); // the batch is held meanwhile, as in a step
    }
    ids
}

fn consume_images(l: Loader, pace: Pace) -> Vec<u32> {
    let mut spec = ImageSpec::train(32);
    spec.dtype = PixelType::U8;
    spec.threads = 1;
    let il = l.decode_images(spec).unwrap();
    let mut ids = Vec::new();
    for (k, b) in il.epoch(0).unwrap().enumerate() {
        let b = b.unwrap_or_else(|e| panic!("batch {k} at {pace:?}: {}", e.report()));
        assert_eq!(b.errors().count(), 0, "{:?}", b.errors().next());
        ids.extend_from_slice(b.sample_ids());
        std::thread::sleep(pace.after(k));
    }
    ids
}

#[test]
fn a_slow_or_pausing_consumer_is_never_an_error() {
    let (_, bytes, images) = data();
    let mut runs = Vec::new();
    for pace in [Pace::Pause90, Pace::Slow10] {
        for world in [1u32, 2] {
            for is_images in [false, true] {
                let ranks: Vec<_> = (0..world)
                    .map(|rank| {
                        let ds = if is_images { images } else { bytes };
                        let mut b = builder(ds, rank, world);
                        if !is_images && world == 1 && matches!(pace, Pace::Slow10) {
                            // A timeout bounds each wait for a batch, not the consumer's pace:
                            // 10 s steps with a 5 s limit still finish.
                            b = b.timeout(Duration::from_secs(5));
                        }
                        let l = b.build().unwrap();
                        std::thread::spawn(move || {
                            if is_images {
                                consume_images(l, pace)
                            } else {
                                consume_bytes(l, pace)
                            }
                        })
                    })
                    .collect();
                runs.push((pace, world, is_images, ranks));
            }
        }
    }
    for (pace, world, is_images, ranks) in runs {
        let what = format!(
            "{} loader, {pace:?}, {world} rank(s)",
            if is_images { "image" } else { "byte" }
        );
        let mut seen = vec![0u32; N];
        for r in ranks {
            let ids = r
                .join()
                .unwrap_or_else(|_| panic!("{what}: a consumer failed"));
            for id in ids {
                seen[id as usize] += 1;
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "{what}: every sample once, got {seen:?}"
        );
    }
}

#[test]
fn a_timeout_is_opt_in_and_names_who_holds_the_buffers() {
    let (_, bytes, _) = data();
    let l = Loader::builder(bytes.clone())
        .batch_size(8)
        .prefetch_groups(1)
        .in_flight_groups(1)
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    assert_eq!(l.timeout(), Some(Duration::from_millis(400)));
    let mut epoch = l.epoch(0).unwrap();
    // Keep every batch: after two groups (8 batches) nothing is left to read into.
    let mut kept = Vec::new();
    for _ in 0..8 {
        kept.push(epoch.next().unwrap().unwrap());
    }
    let t = std::time::Instant::now();
    let e = match epoch.next() {
        Some(Err(e)) => e,
        other => panic!("expected a timeout, got {other:?}"),
    };
    eprintln!("{}", e.report());
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    let msg = e.report();
    for part in [
        "LoaderBuilder::timeout is 0.4 s",
        "epoch 0 waits for batch 8",
        "the loader's 2 read buffers (LoaderBuilder::prefetch_groups 1 + 1 in flight): 0 free",
        "2 held by batches of epoch 0 that were handed out and are still alive (batches 0-3, 4-7)",
        "Nothing can be read until one is given back",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg:?}");
    }
    // The epoch stays usable: give the memory back and it goes on, every sample once.
    let mut seen: Vec<u32> = kept.iter().flat_map(|b| b.sample_ids().to_vec()).collect();
    drop(kept);
    for b in epoch {
        seen.extend_from_slice(b.unwrap().sample_ids());
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..N as u32).collect::<Vec<_>>());
    // Zero is refused (no limit is "leave it unset").
    let e = Loader::builder(bytes.clone())
        .timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("leave it unset"), "{e}");
}

#[test]
fn an_image_loader_times_out_only_when_asked_and_says_what_it_waits_for() {
    use gpufeed::testing::sim::{SimBackend, SimConfig};
    use gpufeed::EngineKind;
    let (_, _, images) = data();
    // Storage that takes 0.5 s for each wait on completions; a limit of 0.2 s on each wait.
    let factory: gpufeed::loader::BackendFactory = std::sync::Arc::new(|epoch| {
        Box::new(crate::loader::SlowDisk {
            inner: SimBackend::new(SimConfig::clean(epoch)),
            delay: Duration::from_millis(500),
        }) as Box<dyn gpufeed::io::Backend>
    });
    let l = Loader::builder(images.clone())
        .batch_size(24)
        .backend(EngineKind::Uring, factory)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut spec = ImageSpec::train(32);
    spec.transform = Transform::Eval { resize: 36 };
    spec.threads = 1;
    let il = l.decode_images(spec).unwrap();
    let mut epoch = il.epoch(0).unwrap();
    let (mut seen, mut timeouts) = (Vec::new(), 0);
    for b in epoch.by_ref() {
        match b {
            Ok(b) => seen.extend_from_slice(b.sample_ids()),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::TimedOut, "{}", e.report());
                let msg = e.report();
                assert!(
                    msg.contains("LoaderBuilder::timeout is 0.2 s")
                        && msg.contains("epoch 0 waits for batch")
                        && (msg.contains("it is not read yet")
                            || msg.contains("its decode has finished")),
                    "{msg}"
                );
                if timeouts == 0 {
                    eprintln!("{msg}");
                }
                timeouts += 1;
            }
        }
    }
    assert!(timeouts > 0, "0.5 s reads against a 0.2 s limit");
    // Timeouts lose nothing: the epoch went on after each.
    seen.sort_unstable();
    assert_eq!(seen, (0..N as u32).collect::<Vec<_>>());
}
