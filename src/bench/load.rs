//! `gpufeed bench load`: one epoch per mode over an ImageNet-like dataset, cold cache.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::config::EngineKind;
use crate::dataset::pack::{pack, PackOptions};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::loader::Loader;
use crate::plan::{epoch_order, quality, Order, PlanConfig};
use crate::rng::Rng;
use crate::sys;
use crate::util::{Progress, SizeMix, IMAGENET_MIX};

/// One mode's epoch.
#[derive(Debug, Clone, Serialize)]
pub struct LoadBenchResult {
    pub mode: String,
    pub samples: u64,
    pub seconds: f64,
    pub samples_per_s: f64,
    pub gib_per_s: f64,
    pub cpu_s_per_gib: f64,
    pub reads_per_sample: f64,
    pub read_amplification: f64,
    pub cold_cache: bool,
    pub files_per_batch: Option<f64>,
    pub labels_per_batch: Option<f64>,
    pub labels_per_batch_global: Option<f64>,
    pub index_correlation: Option<f64>,
    pub sample_errors: u64,
    pub engine: String,
    /// Whether each sample's crc32c was checked (small files carry none).
    pub checksums_verified: bool,
    /// Fraction of the loader's arena backed by huge pages (packed modes).
    pub arena_huge_pages: Option<f64>,
    /// The dataset's format ("image-folder" for small-files).
    pub format: &'static str,
}

/// Creates `dir/small` (ImageFolder: class folders of files with ImageNet-like sizes) and
/// `dir/packed` (the same samples as shards) unless they exist. Returns (small, packed).
pub fn ensure_dataset(dir: &Path, samples: u64, shard_bytes: u64) -> Result<(PathBuf, PathBuf)> {
    let small = dir.join("small");
    let packed = dir.join("packed");
    let done_mark = dir.join(format!(".complete-{samples}"));
    if done_mark.exists() {
        return Ok((small, packed));
    }
    let ctx = |p: &Path| {
        let p = p.to_path_buf();
        move |e| Error::io("cannot write the generated dataset", e).with_path(p.clone())
    };
    if small.exists() {
        std::fs::remove_dir_all(&small).map_err(ctx(&small))?;
    }
    if packed.exists() {
        std::fs::remove_dir_all(&packed).map_err(ctx(&packed))?;
    }
    let mix = SizeMix::parse(IMAGENET_MIX)?;
    let classes = (samples / 50).clamp(1, 1000);
    let mut rng = Rng::new(2012);
    let mut prog = Progress::items(
        format!("generating {samples} samples in {}", small.display()),
        samples,
        "samples",
    );
    let mut buf = Vec::new();
    for i in 0..samples {
        let class = i % classes;
        let cdir = small.join(format!("c{class:04}"));
        if i < classes {
            std::fs::create_dir_all(&cdir).map_err(ctx(&cdir))?;
        }
        // The mix's sizes, jittered ±25% so that sizes are not all powers of two.
        let base = mix.pick(rng.next_u64()) as f64;
        let len =
            (base * (0.75 + 0.5 * (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64)) as usize;
        buf.resize(len.max(1), 0);
        let mut r = Rng::new(i);
        for w in buf.chunks_mut(8) {
            let v = r.next_u64().to_le_bytes();
            w.copy_from_slice(&v[..w.len()]);
        }
        let p = cdir.join(format!("{i:08}.jpg"));
        std::fs::write(&p, &buf).map_err(ctx(&p))?;
        prog.set(i + 1);
    }
    prog.finish();
    let ds = Dataset::open(&small)?;
    pack(
        &ds,
        &packed,
        &PackOptions {
            shard_bytes,
            ..PackOptions::default()
        },
    )?;
    std::fs::write(&done_mark, b"").map_err(ctx(&done_mark))?;
    Ok((small, packed))
}

/// Drops the page cache when root; returns whether the cache is cold.
pub fn drop_caches() -> bool {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3").is_ok()
}

/// The small-files baseline: `threads` threads open, read and close one file per sample, in a
/// global shuffle (PyTorch DataLoader workers over an ImageFolder).
pub fn run_small_files(
    small: &Path,
    threads: usize,
    seed: u64,
    cold: bool,
) -> Result<LoadBenchResult> {
    let ds = Dataset::open(small)?;
    let cfg = PlanConfig {
        seed,
        batch_size: 1,
        ..PlanConfig::default()
    };
    let order = epoch_order(ds.samples(), &cfg, 0)?;
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&id) = order.get(k) else { return };
                let f = &ds.files()[ds.sample(id as usize).file as usize];
                match std::fs::read(&f.path) {
                    Ok(b) => {
                        bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = sys::process_cpu_seconds() - cpu0;
    let n = order.len() as u64;
    let gib = bytes.load(Ordering::Relaxed) as f64 / (1u64 << 30) as f64;
    Ok(LoadBenchResult {
        mode: "small-files".into(),
        samples: n,
        seconds,
        samples_per_s: n as f64 / seconds,
        gib_per_s: gib / seconds,
        cpu_s_per_gib: cpu / gib,
        reads_per_sample: 1.0,
        read_amplification: 1.0,
        cold_cache: cold,
        files_per_batch: None,
        labels_per_batch: None,
        labels_per_batch_global: None,
        index_correlation: None,
        sample_errors: errors.load(Ordering::Relaxed),
        engine: format!("{} threads, open/read/close", threads),
        checksums_verified: false,
        arena_huge_pages: None,
        format: "image-folder",
    })
}

/// Settings of the packed modes.
#[derive(Debug, Clone)]
pub struct PackedSpec {
    pub batch_size: u32,
    pub queue_depth: u32,
    pub seed: u64,
    pub engine: EngineKind,
    /// Check every sample's crc32c on the consumer thread (the loader's default).
    pub verify: bool,
    /// What happens to the last, incomplete batch.
    pub last_batch: crate::plan::LastBatch,
    /// The loader's memory budget.
    pub memory_budget: u64,
}

/// One epoch of the packed dataset through the loader in `order`.
///
/// The loader (its index, its arena) is built before the clock starts: a trainer builds it once.
pub fn run_packed(
    ds: Dataset,
    order: Order,
    spec: &PackedSpec,
    cold: bool,
) -> Result<LoadBenchResult> {
    let format = ds.format().name();
    let loader = Loader::builder(ds)
        .batch_size(spec.batch_size)
        .order(order)
        .seed(spec.seed)
        .queue_depth(spec.queue_depth)
        .engine_kind(spec.engine)
        .verify_checksums(spec.verify)
        .last_batch(spec.last_batch)
        .memory_budget(spec.memory_budget)
        .build()?;
    // Shuffle quality is computed from the plan, outside the timed epoch.
    let q = quality(loader.dataset().samples(), &loader.plan_epoch(0)?);
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    let mut epoch = loader.epoch(0)?;
    let mut touched = 0u64;
    for b in epoch.by_ref() {
        let b = b?;
        // Touch every sample once, as a consumer would.
        for s in b.samples().flatten() {
            touched = touched.wrapping_add(s[s.len() / 2] as u64);
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = sys::process_cpu_seconds() - cpu0;
    std::hint::black_box(touched);
    let st = epoch.stats().clone();
    let gib = st.bytes_delivered as f64 / (1u64 << 30) as f64;
    Ok(LoadBenchResult {
        mode: order.name().into(),
        samples: st.samples,
        seconds,
        samples_per_s: st.samples as f64 / seconds,
        gib_per_s: gib / seconds,
        cpu_s_per_gib: cpu / gib,
        reads_per_sample: st.reads as f64 / st.samples.max(1) as f64,
        read_amplification: st.bytes_read as f64 / st.bytes_delivered.max(1) as f64,
        cold_cache: cold,
        files_per_batch: Some(q.files_per_batch),
        labels_per_batch: Some(q.labels_per_batch),
        labels_per_batch_global: Some(q.labels_per_batch_global),
        index_correlation: Some(q.index_correlation),
        sample_errors: st.sample_errors,
        engine: st.engine,
        checksums_verified: spec.verify && loader.dataset().has_checksums(),
        arena_huge_pages: match loader.huge_page_bytes() {
            (Some(h), len) => Some(h as f64 / len.max(1) as f64),
            (None, _) => None,
        },
        format,
    })
}

/// The table header matching [`table_row`].
pub fn table_header() -> String {
    format!(
        "{:<13} {:>8} {:>10} {:>7} {:>10} {:>10} {:>8} {:>9} {:>9} {:>6} {:>4}",
        "mode",
        "samples",
        "samples/s",
        "GiB/s",
        "CPU-s/GiB",
        "reads/smp",
        "amplif",
        "files/b",
        "labels/b",
        "cold",
        "crc"
    )
}

pub fn table_row(r: &LoadBenchResult) -> String {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    format!(
        "{:<13} {:>8} {:>10.0} {:>7.3} {:>10.3} {:>10.4} {:>8.3} {:>9} {:>9} {:>6} {:>4}",
        r.mode,
        r.samples,
        r.samples_per_s,
        r.gib_per_s,
        r.cpu_s_per_gib,
        r.reads_per_sample,
        r.read_amplification,
        opt(r.files_per_batch),
        opt(r.labels_per_batch),
        r.cold_cache,
        if r.checksums_verified { "yes" } else { "no" }
    )
}
