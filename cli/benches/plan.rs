//! Planning an ImageNet-sized epoch: 1.28 M samples with the ImageNet size mix in 640 shards,
//! batch 256, every order mode. Two figures per mode:
//!
//! - time: the order alone (the baseline: for `global`, one shuffle of 1.28 M ids),
//!   `EpochPlan::new` (the order and the group boundaries), and the whole epoch's plan —
//!   `new` plus coalescing every group, as the loader does over the epoch;
//! - memory: the peak heap bytes allocated while planning, per sample (a counting allocator
//!   wraps the system one), printed before the timings, beside the sample index's own bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{criterion_group, criterion_main, Criterion};
use gpufeed::dataset::{DataFile, Dataset};
use gpufeed::plan::Sample;
use gpufeed::plan::{epoch_order, EpochPlan, Order, PlanConfig};
use gpufeed::testing::Rng;
use gpufeed_cli::bench::{SizeMix, IMAGENET_MIX};

/// The system allocator, counting live and peak bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees hold; the counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (the caller upholds `alloc`'s contract).
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                let now = LIVE.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const SAMPLES: usize = 1_281_167;
const SHARDS: usize = 640;

/// ImageNet-like: sizes from the ImageNet mix, packed back to back in 640 shards.
fn imagenet() -> Dataset {
    let mix = SizeMix::parse(IMAGENET_MIX).unwrap();
    let mut rng = Rng::new(1);
    let per = SAMPLES.div_ceil(SHARDS);
    let mut samples = Vec::with_capacity(SAMPLES);
    let mut sizes = vec![4096u64; SHARDS];
    for i in 0..SAMPLES {
        let file = i / per;
        let len = mix.pick(rng.next_u64());
        samples.push(Sample {
            file: file as u32,
            len,
            offset: sizes[file],
            label: (i % 1000) as i64,
            crc32c: 0,
        });
        sizes[file] += len as u64;
    }
    let files = sizes
        .iter()
        .enumerate()
        .map(|(k, &size)| DataFile {
            path: Path::new(&format!("shard-{k:05}.gpf")).into(),
            size,
        })
        .collect();
    let keys = (0..SAMPLES).map(|i| format!("{i}")).collect();
    Dataset::from_parts(files, samples, keys).unwrap()
}

/// The modes with the defaults `gpufeed bench load` and the CLI use.
fn modes() -> Vec<(&'static str, Order)> {
    ["global", "shard-buffer", "block"]
        .into_iter()
        .map(|m| (m, Order::parse(m).unwrap()))
        .collect()
}

fn whole_epoch(samples: &gpufeed::plan::Samples, cfg: &PlanConfig) -> (usize, u64) {
    let plan = EpochPlan::new(samples, cfg, 7).unwrap();
    let (mut groups, mut reads) = (0, 0u64);
    for g in plan.groups(samples) {
        groups += 1;
        reads += g.reads.len() as u64;
    }
    (groups, reads)
}

fn bench(c: &mut Criterion) {
    let ds = imagenet();
    let samples = ds.samples();
    println!(
        "dataset: {} samples in {} shards; sample index {:.1} bytes/sample (Sample records {} B)",
        samples.len(),
        SHARDS,
        ds.index_heap_bytes() as f64 / samples.len() as f64,
        std::mem::size_of::<Sample>()
    );
    for (name, order) in modes() {
        let cfg = PlanConfig {
            order,
            ..PlanConfig::default()
        };
        // Peak heap while planning the whole epoch, above what was live before.
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let (groups, reads) = whole_epoch(samples, &cfg);
        let peak = PEAK.load(Ordering::Relaxed) - base;
        println!(
            "plan {name}: {groups} groups, {:.4} reads/sample; peak planning heap {:.2} bytes/sample \
             ({:.1} MiB)",
            reads as f64 / samples.len() as f64,
            peak as f64 / samples.len() as f64,
            peak as f64 / (1 << 20) as f64
        );
        let mut g = c.benchmark_group(format!("plan_1.28M/{name}"));
        g.sample_size(10);
        // Baseline: the order alone, listed (for global, 1.28 M positions of the permutation).
        g.bench_function("order_only", |b| {
            b.iter(|| black_box(epoch_order(samples, &cfg, 7).unwrap().len()))
        });
        // The plan (computed where it can be: then groups are found when reached).
        g.bench_function("plan", |b| {
            b.iter(|| black_box(EpochPlan::new(samples, &cfg, 7).unwrap().batches()))
        });
        g.bench_function("whole_epoch", |b| {
            b.iter(|| black_box(whole_epoch(samples, &cfg)))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
