//! `gpufeed bench load`: one epoch per mode over an ImageNet-like dataset, cold cache.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::bench::io::{run_io_bench, IoBenchResult, IoBenchSpec, Pattern};
use crate::util::{SizeMix, IMAGENET_MIX};
use gpufeed::config::EngineKind;
use gpufeed::dataset::Dataset;
use gpufeed::dataset::{pack, PackOptions};
use gpufeed::error::{Error, Result};
use gpufeed::loader::Loader;
use gpufeed::plan::{epoch_order, quality, Order, PlanConfig};
use gpufeed::progress::Task;
use gpufeed::testing::sys;
use gpufeed::testing::Rng;

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
    /// The loader's read buffers: slots × slot bytes (loader modes).
    pub arena_bytes: Option<u64>,
    /// The alignment reads were planned at (loader modes), and the direct-I/O offset alignment
    /// the first data file's file system reports (`statx`), when it reports one.
    pub plan_align_bytes: Option<u32>,
    pub dio_align_bytes: Option<u32>,
    /// The read amplification that alignment forces: every sample read alone, widened to it
    /// at both ends (coalescing neighbours can only do better on bytes).
    pub dio_floor_amplification: Option<f64>,
    /// The loader settings of the loader modes (rank 0's; `LoaderSettings::to_json`).
    pub settings: Option<serde_json::Value>,
    /// The dataset's format ("image-folder" for small-files).
    pub format: &'static str,
    /// Consecutive epochs run (loader modes: each next epoch asked for when the one before
    /// starts, as a training loop that prefetches does); the figures above cover them all.
    pub epochs: u32,
    /// Samples per second of each epoch, from the previous epoch's last batch (the start, for
    /// the first) to its own last batch.
    pub epoch_samples_per_s: Vec<f64>,
    /// Milliseconds the consumer waited for each next epoch's first batch (after it was done
    /// with the epoch before).
    pub epoch_gaps_ms: Vec<f64>,
    /// The simulated step per batch (`--step-ms`), 0 if none.
    pub step_ms: f64,
    /// Consumers sharing the machine (`--gpus`), each a rank of the dataset with its loader.
    pub gpus: u32,
    /// Batches per second asked for (each consumer 1000 / step_ms), with a step.
    pub demand_batches_per_s: Option<f64>,
    /// Batches per second delivered (all consumers).
    pub achieved_batches_per_s: f64,
    /// Share of the consumers' time spent waiting in `next`.
    pub stall_fraction: f64,
    /// The consumers' waits split by cause (summed over consumers).
    pub stall: gpufeed::loader::StallStats,
    /// CPU seconds of the loaders' I/O threads.
    pub io_thread_cpu_s: f64,
    /// CPU seconds of the consumers' threads inside `next`.
    pub consumer_cpu_s: f64,
    /// CPU seconds of the loaders' I/O threads checking frames and checksums (ahead of the
    /// consumers; part of `io_thread_cpu_s`).
    pub check_cpu_s: f64,
    /// In one line: does it keep up with the demand, and if not, what limits it.
    pub verdict: Option<String>,
}

/// The one-line answer to "does it keep up at this step time, and if not, what limits it":
/// it keeps up when the consumers waited less than 5% of their time; otherwise the part of the
/// waiting that took the most names the bound.
pub fn verdict(
    demand: f64,
    achieved: f64,
    stall_fraction: f64,
    stall: &gpufeed::loader::StallStats,
) -> String {
    let ratio = achieved / demand.max(1e-12);
    let t = stall.total_s().max(1e-12);
    let parts = format!(
        "storage {:.0}%, remote {:.0}%, copy {:.0}%, verify {:.0}%, decode {:.0}%, other {:.0}%",
        100.0 * stall.storage_s / t,
        100.0 * stall.remote_s / t,
        100.0 * stall.copy_s / t,
        100.0 * stall.verify_s / t,
        100.0 * stall.decode_s / t,
        100.0 * stall.other_s / t
    );
    // Keeping up is the consumer hardly waiting (a trainer's own overheads — the first batch,
    // sleep granularity — keep `ratio` a little under 1 even then).
    if stall_fraction < 0.05 {
        format!(
            "keeps up: {:.0}% of demand, stalled {:.1}% of the time",
            100.0 * ratio.min(1.0),
            100.0 * stall_fraction
        )
    } else {
        format!(
            "{}-bound at {:.0}% of demand: stalled {:.0}% of the time ({parts})",
            stall.bound(),
            100.0 * ratio,
            100.0 * stall_fraction
        )
    }
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
    // Only a set this command generated (it leaves a `.complete-N` mark) is replaced; folders
    // without one may be the user's own data and are never deleted.
    let ours = std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".complete-"))
    });
    for d in [&small, &packed] {
        if d.exists() && !ours {
            return Err(crate::util::invalid(format!(
                "{} exists but was not generated by gpufeed bench (no .complete-N mark in {}); \
                 give another --dir, or --dataset to read existing data",
                d.display(),
                dir.display()
            )));
        }
    }
    if ours {
        gpufeed::testing::notice(&format!(
            "{} holds a generated set of another size: replacing it with {samples} samples",
            dir.display()
        ));
        for entry in std::fs::read_dir(dir).map_err(ctx(dir))?.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(".complete-")
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    for d in [&small, &packed] {
        if d.exists() {
            std::fs::remove_dir_all(d).map_err(ctx(d))?;
        }
    }
    let mix = SizeMix::parse(IMAGENET_MIX)?;
    let classes = (samples / 50).clamp(1, 1000);
    let mut rng = Rng::new(2012);
    let mut prog = Task::items(
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
    nix::unistd::sync();
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
                match std::fs::read(ds.file_path(ds.sample(id as usize).file)) {
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
        arena_bytes: None,
        plan_align_bytes: None,
        dio_align_bytes: None,
        dio_floor_amplification: None,
        settings: None,
        format: "image-folder",
        epochs: 1,
        epoch_samples_per_s: Vec::new(),
        epoch_gaps_ms: Vec::new(),
        step_ms: 0.0,
        gpus: 1,
        demand_batches_per_s: None,
        achieved_batches_per_s: 0.0,
        stall_fraction: 0.0,
        stall: Default::default(),
        io_thread_cpu_s: 0.0,
        consumer_cpu_s: 0.0,
        check_cpu_s: 0.0,
        verdict: None,
    })
}

/// What `bench load` runs its modes over: the generated small files and packed shards (or the
/// caller's dataset for the loader modes) and the loader's settings.
#[derive(Debug)]
pub struct LoadModes {
    /// The generated small-files tree (the `small-files` baseline).
    pub small: PathBuf,
    /// The generated packed shards (the loader modes, unless `dataset` is given; `io`).
    pub packed: PathBuf,
    /// The dataset the loader modes read instead of `packed`, if any.
    pub dataset: Vec<PathBuf>,
    /// Its dataset options.
    pub options: gpufeed::dataset::OpenOptions,
    /// Threads of the small-files baseline.
    pub threads: usize,
    /// The loader modes' settings.
    pub spec: PackedSpec,
}

/// One mode's row: a loader epoch (or the small-files baseline), or the engine alone.
#[derive(Debug)]
pub enum LoadRow {
    /// `small-files`, `global`, `block`, `shard-buffer`, `sequential`.
    Loader(Box<LoadBenchResult>),
    /// `io`: random reads of the ImageNet size mix from the largest shard, at the loader's
    /// queue depth, for reference.
    Io(Box<IoBenchResult>),
}

impl LoadModes {
    /// Runs mode `mode` (`cold`: the page cache was dropped before it).
    pub fn run(&self, mode: &str, cold: bool) -> Result<LoadRow> {
        let settings = &self.spec.settings;
        match mode {
            "small-files" => run_small_files(&self.small, self.threads, settings.seed, cold)
                .map(|r| LoadRow::Loader(Box::new(r))),
            "io" => {
                let shards = gpufeed::dataset::shard::find_shards(&self.packed)?;
                let biggest = shards
                    .iter()
                    .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
                    .ok_or_else(|| crate::util::invalid("no shards"))?;
                let spec = IoBenchSpec {
                    queue_depth: settings.queue_depth,
                    seconds: 3.0,
                    ..IoBenchSpec::new(
                        biggest,
                        EngineKind::Uring,
                        Pattern::Rand,
                        SizeMix::parse(IMAGENET_MIX)?,
                    )
                };
                run_io_bench(&spec).map(|r| LoadRow::Io(Box::new(r)))
            }
            m => {
                // The mode names the order; its parameters are the settings'.
                let mut s = settings.clone();
                s.set("order", m)?;
                let ds = if self.dataset.is_empty() {
                    Dataset::open(&self.packed)?
                } else {
                    #[allow(unused_mut)] // set only for a store
                    let mut opts = self.options.clone();
                    #[cfg(feature = "remote")]
                    {
                        opts.store = opts.store.open_timeout(s.timeout);
                    }
                    Dataset::open_paths(&self.dataset, &opts)?
                };
                run_packed(ds, s.order(), &self.spec, cold).map(|r| LoadRow::Loader(Box::new(r)))
            }
        }
    }
}

/// Settings of the packed modes.
#[derive(Debug, Clone)]
pub struct PackedSpec {
    /// The loader settings (the CLI's flags; the mode's order and the ranks are the bench's).
    /// The memory budget is shared by the consumers.
    pub settings: gpufeed::config::LoaderSettings,
    pub engine: EngineKind,
    /// Consecutive epochs to run (at least 1).
    pub epochs: u32,
    /// A simulated trainer's step: each batch is held this long before the next is asked for.
    pub step: std::time::Duration,
    /// Consumers sharing the machine, each reading its rank's share with its own loader.
    pub gpus: u32,
}

/// What one consumer's run of consecutive epochs gave.
#[derive(Default)]
struct Consumed {
    st: gpufeed::loader::LoaderStats,
    batches: u64,
    touched: u64,
    epoch_rates: Vec<f64>,
    gaps: Vec<f64>,
    busy_s: f64,
}

/// Runs `epochs` consecutive epochs through `loader`, holding each batch `step`.
fn consume(loader: &Loader, epochs: u32, step: std::time::Duration) -> Result<Consumed> {
    let mut c = Consumed::default();
    let t0 = Instant::now();
    let mut current = Some(loader.epoch(0)?);
    let mut epoch_start = t0;
    let mut last_batch: Option<Instant> = None;
    for e in 0..epochs as u64 {
        let mut epoch = current.take().expect("an epoch per round");
        // The next epoch is asked for now, so it is read while this one's tail is consumed.
        if e + 1 < epochs as u64 {
            current = Some(loader.epoch(e + 1)?);
        }
        let mut first = true;
        loop {
            let asked = Instant::now();
            let Some(b) = epoch.next() else { break };
            let b = b?;
            if std::mem::take(&mut first) && e > 0 {
                c.gaps.push(asked.elapsed().as_secs_f64() * 1e3);
            }
            // Touch every sample once, as a consumer would; then the simulated step.
            for s in b.samples().flatten() {
                // (An empty sample has no byte to touch.)
                c.touched = c
                    .touched
                    .wrapping_add(s.get(s.len() / 2).copied().unwrap_or(0) as u64);
            }
            if !step.is_zero() {
                std::thread::sleep(step);
            }
            c.batches += 1;
            last_batch = Some(Instant::now());
        }
        let end = last_batch.unwrap_or_else(Instant::now);
        let es = epoch.stats();
        c.epoch_rates
            .push(es.samples as f64 / (end - epoch_start).as_secs_f64().max(1e-9));
        epoch_start = end;
        add_stats(&mut c.st, es);
    }
    c.busy_s = t0.elapsed().as_secs_f64();
    Ok(c)
}

/// Adds the counts and times of `es` to `st`.
fn add_stats(st: &mut gpufeed::loader::LoaderStats, es: &gpufeed::loader::LoaderStats) {
    st.samples += es.samples;
    st.bytes_delivered += es.bytes_delivered;
    st.bytes_read += es.bytes_read;
    st.reads += es.reads;
    st.sample_errors += es.sample_errors;
    st.stall.add(&es.stall);
    st.consumer_wait_s += es.consumer_wait_s;
    st.io_thread_cpu_s += es.io_thread_cpu_s;
    st.consumer_cpu_s += es.consumer_cpu_s;
    st.check_cpu_s += es.check_cpu_s;
    st.engine = es.engine.clone();
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
    let gpus = spec.gpus.max(1);
    let ds = std::sync::Arc::new(ds);
    // One loader per consumer (rank r of `gpus`), built before the clock starts, sharing the
    // memory budget.
    let loaders: Vec<Loader> = (0..gpus)
        .map(|r| {
            Loader::builder(ds.clone())
                .settings(&spec.settings)
                .front_door(gpufeed::config::FrontDoor::Cli)
                .order(order)
                .rank(r, gpus)
                .engine_kind(spec.engine)
                .memory_budget(spec.settings.memory_budget / gpus as u64)
                .build()
        })
        .collect::<Result<_>>()?;
    let loader = &loaders[0];
    // Shuffle quality is computed from the plan, outside the timed epoch.
    let plan = loader.plan_epoch(0)?;
    let q = quality(loader.dataset().samples(), &plan);
    let plan_align = plan.config().align;
    drop(plan);
    let dio_align = loader
        .dataset()
        .files()
        .next()
        .and_then(|f| std::fs::File::open(&*f.path).ok())
        .and_then(|f| sys::statx_fd(std::os::fd::AsFd::as_fd(&f)).ok())
        .and_then(|st| st.dio_offset_align);
    let dio_floor = dio_align.map(|a| {
        let ds = loader.dataset();
        let spans: u64 = ds
            .samples()
            .iter()
            .map(|s| gpufeed::plan::span(&s, a as u64))
            .sum();
        spans as f64 / ds.total_bytes().max(1) as f64
    });
    let epochs = spec.epochs.max(1);
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    let runs: Vec<Result<Consumed>> = std::thread::scope(|sc| {
        let handles: Vec<_> = loaders
            .iter()
            .map(|l| sc.spawn(move || consume(l, epochs, spec.step)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(crate::util::invalid("a consumer panicked")))
            })
            .collect()
    });
    let mut st = gpufeed::loader::LoaderStats::default();
    let (mut batches, mut touched, mut busy) = (0u64, 0u64, 0f64);
    let (mut epoch_rates, mut gaps) = (Vec::new(), Vec::new());
    for (k, r) in runs.into_iter().enumerate() {
        let c = r?;
        add_stats(&mut st, &c.st);
        batches += c.batches;
        touched = touched.wrapping_add(c.touched);
        busy += c.busy_s;
        if k == 0 {
            (epoch_rates, gaps) = (c.epoch_rates, c.gaps);
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = sys::process_cpu_seconds() - cpu0;
    std::hint::black_box(touched);
    let gib = st.bytes_delivered as f64 / (1u64 << 30) as f64;
    let achieved = batches as f64 / seconds.max(1e-9);
    let demand = (!spec.step.is_zero()).then(|| gpus as f64 / spec.step.as_secs_f64());
    let stall_fraction = st.stall.total_s() / busy.max(1e-9);
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
        checksums_verified: spec.settings.verify && loader.dataset().has_checksums(),
        settings: Some(loader.settings().to_json()),
        arena_huge_pages: match loader.huge_page_bytes() {
            (Some(h), len) => Some(h as f64 / len.max(1) as f64),
            (None, _) => None,
        },
        arena_bytes: Some(loader.memory().arena_bytes),
        plan_align_bytes: Some(plan_align),
        dio_align_bytes: dio_align,
        dio_floor_amplification: dio_floor,
        format,
        epochs,
        epoch_samples_per_s: epoch_rates,
        epoch_gaps_ms: gaps,
        step_ms: spec.step.as_secs_f64() * 1e3,
        gpus,
        demand_batches_per_s: demand,
        achieved_batches_per_s: achieved,
        stall_fraction,
        stall: st.stall,
        io_thread_cpu_s: st.io_thread_cpu_s,
        consumer_cpu_s: st.consumer_cpu_s,
        check_cpu_s: st.check_cpu_s,
        verdict: demand.map(|d| verdict(d, achieved, stall_fraction, &st.stall)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpufeed::loader::StallStats;

    #[test]
    fn the_verdict_names_the_largest_part_or_says_it_keeps_up() {
        let stall = StallStats {
            storage_s: 6.0,
            verify_s: 1.0,
            other_s: 0.5,
            ..StallStats::default()
        };
        let v = verdict(25.0, 10.0, 0.6, &stall);
        assert!(v.starts_with("storage-bound at 40% of demand"), "{v}");
        let v = verdict(25.0, 24.0, 0.02, &stall);
        assert!(v.starts_with("keeps up: 96% of demand"), "{v}");
        let decode = StallStats {
            decode_s: 3.0,
            storage_s: 1.0,
            ..StallStats::default()
        };
        assert!(verdict(10.0, 5.0, 0.5, &decode).starts_with("decode-bound"));
    }
}
