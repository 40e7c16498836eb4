//! `gpufeed bench scale`: what a dataset's size costs a rank — open time, index bytes per
//! sample, memory, the time to plan and read the first batch, and a short run's samples/s —
//! for token corpora of 10⁶ to 10⁹ windows (sparse files: they cost no disk), or packed shards
//! of small samples with ImageNet-like keys (written: 32 bytes of shard index, ~30 of key and
//! 64 of data a sample), one rank and several on the node, each rank its own process (so PSS
//! says what the node holds).
//!
//! Samples/s here measure the loader's machinery, not a disk: a sparse file's holes read as
//! zeros without touching the device.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::util::invalid;
use gpufeed::config::LoaderSettings;
use gpufeed::dataset::{Dataset, Format, OpenOptions, TokenOptions};
use gpufeed::error::{Error, Result};
use gpufeed::loader::Loader;
use gpufeed::plan::Order;

/// What one rank measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RankFigures {
    /// This rank and the ranks in all.
    pub rank: u32,
    pub world: u32,
    /// Samples in the dataset.
    pub samples: u64,
    /// Seconds to open the dataset.
    pub open_s: f64,
    /// The process's peak resident memory once the dataset is open (what the open cost, the
    /// pages of a mapped index included), and its PSS then (a node's shared index counted
    /// once over its ranks).
    pub open_peak_rss_bytes: u64,
    pub open_pss_bytes: u64,
    /// Heap bytes of its index.
    pub index_bytes: u64,
    /// Milliseconds to plan epoch 0 of the global order (its first batch included).
    pub plan_ms: f64,
    /// Milliseconds from asking for epoch 0 (global) to holding its first batch.
    pub first_batch_ms: f64,
    /// Samples/s of a short global run, and of a short block run.
    pub global_samples_per_s: f64,
    pub block_samples_per_s: f64,
    /// The read buffers the loaders held (the larger of the two).
    pub buffers_bytes: u64,
    /// Resident memory and proportional share (PSS) with a loader alive (the larger of the
    /// two runs), and the process's peak resident memory.
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub pss_bytes: u64,
}

/// One size × rank count.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleRow {
    /// Samples in the dataset, and the ranks on the node.
    pub samples: u64,
    pub ranks: u32,
    /// The format measured.
    pub format: &'static str,
    /// The slowest rank's open, plan and first batch.
    pub open_s: f64,
    /// The largest rank's peak resident memory once open, and every rank's PSS then together.
    pub open_peak_rss_mib: f64,
    pub open_pss_total_mib: f64,
    pub plan_ms: f64,
    pub first_batch_ms: f64,
    /// Index heap bytes per sample (rank 0).
    pub index_bytes_per_sample: f64,
    /// The largest rank's peak resident memory, and that less its read buffers.
    pub peak_rss_mib: f64,
    pub rss_beside_buffers_mib: f64,
    /// PSS of every rank together.
    pub pss_total_mib: f64,
    /// Samples/s of all ranks together.
    pub global_samples_per_s: f64,
    pub block_samples_per_s: f64,
    /// Every rank's figures.
    pub per_rank: Vec<RankFigures>,
}

/// What `bench scale` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleFormat {
    /// A flat u16 token file (sparse), `seq_len` windows.
    Tokens,
    /// Packed shards of 64-byte samples with ImageNet-like keys and 1,000 labels.
    Packed,
}

impl ScaleFormat {
    /// `tokens` or `packed`.
    pub fn parse(s: &str) -> Result<ScaleFormat> {
        match s {
            "tokens" => Ok(ScaleFormat::Tokens),
            "packed" => Ok(ScaleFormat::Packed),
            _ => Err(invalid(format!("--format {s:?}: tokens or packed"))),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            ScaleFormat::Tokens => "tokens",
            ScaleFormat::Packed => "packed",
        }
    }
}

/// Samples per generated shard.
const PACKED_SHARD_SAMPLES: u64 = 1 << 20;

/// A directory of packed shards holding exactly `samples` 64-byte samples (written once; kept
/// when complete).
pub fn ensure_packed(dir: &Path, samples: u64) -> Result<PathBuf> {
    use gpufeed::dataset::shard::ShardWriter;
    let root = dir.join(format!("packed-{samples}"));
    if root.join("COMPLETE").exists() {
        return Ok(root);
    }
    // Nothing there is deleted or written into: the set is written beside it and renamed into
    // place, and a `packed-N` this bench did not finish (no COMPLETE mark) is refused.
    if std::fs::symlink_metadata(&root).is_ok() {
        return Err(invalid(format!(
            "{} exists and is not a set this bench finished (no COMPLETE mark in it): remove it \
             or give another --dir",
            root.display()
        )));
    }
    let io_err = |what: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |e| Error::io(what, e).with_path(p)
    };
    std::fs::create_dir_all(dir).map_err(io_err("cannot create the bench directory", dir))?;
    let partial = dir.join(format!(".packed-{samples}.partial-{}", std::process::id()));
    std::fs::create_dir(&partial).map_err(io_err("cannot create", &partial))?;
    let mut prog = gpufeed::progress::Task::items_after(
        "writing packed shards",
        samples,
        "samples",
        std::time::Duration::from_secs(2),
    );
    let data = [0x5au8; 64];
    let mut i = 0u64;
    for shard in 0..samples.div_ceil(PACKED_SHARD_SAMPLES) {
        let mut w = ShardWriter::create(&partial.join(format!("shard-{shard:05}.gpf")), 1)?;
        while i < samples && w.samples() < PACKED_SHARD_SAMPLES as usize {
            let class = i % 1000;
            w.add(
                &format!("n{class:08}/n{class:08}_{i}.JPEG"),
                class as i64,
                &[],
                &data,
            )?;
            i += 1;
            if i.is_multiple_of(65536) {
                prog.set(i);
            }
        }
        w.finish()?;
    }
    prog.finish();
    let done = partial.join("COMPLETE");
    std::fs::write(&done, b"").map_err(io_err("cannot write", &done))?;
    if let Err(e) = std::fs::rename(&partial, &root) {
        // Another bench finished the same set meanwhile: its copy is used, this one dropped.
        let _ = std::fs::remove_dir_all(&partial);
        if !root.join("COMPLETE").exists() {
            return Err(io_err("cannot rename into place", &root)(e));
        }
    }
    Ok(root)
}

/// The runs to make.
#[derive(Debug, Clone)]
pub struct ScaleSpec {
    /// What is measured.
    pub format: ScaleFormat,
    /// Where the sparse token files are made.
    pub dir: PathBuf,
    /// Dataset sizes in samples.
    pub sizes: Vec<u64>,
    /// Rank counts.
    pub ranks: Vec<u32>,
    /// Seconds of each short run.
    pub seconds: f64,
    /// Tokens per window (a sample is seq_len + 1 u16 tokens).
    pub seq_len: u32,
}

/// A flat u16 token file holding exactly `samples` windows of `seq_len` (sparse).
pub fn ensure_tokens(dir: &Path, samples: u64, seq_len: u32) -> Result<PathBuf> {
    // The window the loader will be asked for, checked before anything is made.
    if seq_len == 0 || (seq_len as u64 + 1) * 2 > u32::MAX as u64 {
        return Err(invalid(format!(
            "--seq-len {seq_len}: 1 to {} tokens (a window of u16 tokens under 4 GiB)",
            u32::MAX / 2 - 1
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io("cannot create the bench directory", e).with_path(dir))?;
    let path = dir.join(format!("tokens-{samples}x{seq_len}.bin"));
    let bytes = samples
        .checked_mul(seq_len as u64)
        .and_then(|t| t.checked_add(1)?.checked_mul(2))
        .ok_or_else(|| {
            invalid(format!(
                "{samples} windows of {seq_len} tokens: too many bytes"
            ))
        })?;
    // A file of that name is only read, never replaced or written through: a link or a
    // file of another size there is refused.
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() && m.len() == bytes => Ok(path),
        Ok(_) => Err(invalid(format!(
            "{} exists and is not the {bytes}-byte token file this bench makes: remove it or \
             give another --dir",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Made whole under a name of its own, then linked into place: another bench making
            // the same file at once never sees it half made, and nothing there is replaced.
            let fail =
                |e| Error::io("cannot make a sparse token file", e).with_path(path.as_path());
            let partial = dir.join(format!(
                ".tokens-{samples}x{seq_len}.partial-{}",
                std::process::id()
            ));
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&partial)
                .and_then(|f| f.set_len(bytes))
                .and_then(|()| std::fs::hard_link(&partial, &path));
            let _ = std::fs::remove_file(&partial);
            match made {
                Ok(()) => Ok(path),
                // Another bench linked it first: taken if it is what this one would make.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    match std::fs::symlink_metadata(&path) {
                        Ok(m) if m.file_type().is_file() && m.len() == bytes => Ok(path),
                        _ => Err(fail(e)),
                    }
                }
                Err(e) => Err(fail(e)),
            }
        }
        Err(e) => Err(Error::io("cannot stat", e).with_path(path.as_path())),
    }
}

/// The open options of the token files this bench makes.
pub fn token_options(seq_len: u32) -> OpenOptions {
    OpenOptions {
        format: Some(Format::Tokens),
        tokens: TokenOptions {
            seq_len: Some(seq_len),
            ..TokenOptions::default()
        },
        ..OpenOptions::default()
    }
}

/// Resident memory now and its peak (`/proc/self/status`), and the PSS
/// (`/proc/self/smaps_rollup`), in bytes.
pub fn memory_now() -> (u64, u64, u64) {
    let kib = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    (
        kib(&status, "VmRSS:"),
        kib(&status, "VmHWM:"),
        kib(&rollup, "Pss:"),
    )
}

/// Reads batches of `loader`'s epoch 0 for `seconds`; samples/s from asking for the epoch (a
/// block window of small samples is one group of up to millions of them, whose first batch
/// waits for the whole group: a short run shows that wait).
fn short_run(loader: &Loader, seconds: f64) -> Result<f64> {
    let t0 = Instant::now();
    let mut epoch = loader.epoch(0)?;
    let mut n = 0u64;
    let mut touched = 0u64;
    while t0.elapsed().as_secs_f64() < seconds {
        let Some(b) = epoch.next() else { break };
        let b = b?;
        for s in b.samples().flatten() {
            touched = touched.wrapping_add(s.first().copied().unwrap_or(0) as u64);
        }
        n += b.len() as u64;
    }
    std::hint::black_box(touched);
    Ok(n as f64 / t0.elapsed().as_secs_f64().max(1e-9))
}

/// One rank's measurements (run in its own process by [`run_scale`]).
pub fn measure_rank(
    format: ScaleFormat,
    file: &Path,
    seq_len: u32,
    settings: &LoaderSettings,
    rank: u32,
    world: u32,
    seconds: f64,
) -> Result<RankFigures> {
    let t = Instant::now();
    let ds = std::sync::Arc::new(match format {
        ScaleFormat::Tokens => Dataset::open_with(file, &token_options(seq_len))?,
        ScaleFormat::Packed => Dataset::open(file)?,
    });
    let open_s = t.elapsed().as_secs_f64();
    let (_, open_peak_rss_bytes, open_pss_bytes) = memory_now();
    let build = |order: Order| {
        Loader::builder(ds.clone())
            .settings(settings)
            .front_door(gpufeed::config::FrontDoor::Cli)
            .order(order)
            .rank(rank, world)
            .build()
    };
    let global = build(Order::Global)?;
    let t = Instant::now();
    drop(std::hint::black_box(global.plan_epoch(0)?));
    let plan_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    {
        let mut e = global.epoch(0)?;
        e.next().ok_or_else(|| invalid("epoch 0 has no batch"))??;
    }
    let first_batch_ms = t.elapsed().as_secs_f64() * 1e3;
    let global_samples_per_s = short_run(&global, seconds)?;
    // Memory is taken with each loader alive (its buffers and plan held).
    let (mut rss_bytes, _, mut pss_bytes) = memory_now();
    let mut buffers_bytes = global.memory().arena_bytes;
    drop(global);
    let block = build(Order::parse("block")?)?;
    let block_samples_per_s = short_run(&block, seconds)?;
    let (rss, _, pss) = memory_now();
    (rss_bytes, pss_bytes) = (rss_bytes.max(rss), pss_bytes.max(pss));
    buffers_bytes = buffers_bytes.max(block.memory().arena_bytes);
    drop(block);
    let peak_rss_bytes = memory_now().1;
    Ok(RankFigures {
        rank,
        world,
        samples: ds.len() as u64,
        open_s,
        open_peak_rss_bytes,
        open_pss_bytes,
        index_bytes: (ds.index_heap_bytes() + ds.index_bytes().samples_shared) as u64,
        plan_ms,
        first_batch_ms,
        global_samples_per_s,
        block_samples_per_s,
        buffers_bytes,
        rss_bytes,
        peak_rss_bytes,
        pss_bytes,
    })
}

/// Runs every size × rank count, each rank a child process started as `child(rank, world,
/// file)` that prints its [`RankFigures`] as one JSON line and then waits for its stdin to
/// close (so every rank's PSS is taken while all are alive). `each` gets each row as it ends.
pub fn run_scale(
    spec: &ScaleSpec,
    child: &dyn Fn(u32, u32, &Path) -> Command,
    each: &mut dyn FnMut(&ScaleRow),
) -> Result<Vec<ScaleRow>> {
    let mut rows = Vec::new();
    for &n in &spec.sizes {
        if n == 0 || n > u32::MAX as u64 {
            return Err(invalid(format!(
                "--sizes {n}: a dataset holds 1 to 2^32 − 1 samples"
            )));
        }
        let file = match spec.format {
            ScaleFormat::Tokens => ensure_tokens(&spec.dir, n, spec.seq_len)?,
            ScaleFormat::Packed => ensure_packed(&spec.dir, n)?,
        };
        for &world in &spec.ranks {
            let mut kids = Vec::new();
            for rank in 0..world {
                let mut cmd = child(rank, world, &file);
                cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
                kids.push(
                    cmd.spawn()
                        .map_err(|e| Error::io("cannot start a rank's process", e))?,
                );
            }
            let mut per_rank = Vec::new();
            let mut failed = None;
            for k in &mut kids {
                let mut line = String::new();
                let out = k.stdout.take().expect("piped");
                let _ = BufReader::new(out).read_line(&mut line);
                match serde_json::from_str::<RankFigures>(line.trim()) {
                    Ok(f) => per_rank.push(f),
                    Err(_) => failed = Some(line),
                }
            }
            for k in &mut kids {
                if let Some(mut i) = k.stdin.take() {
                    let _ = i.write_all(b"\n");
                }
            }
            for mut k in kids {
                let _ = k.wait();
            }
            if let Some(line) = failed {
                let said = match line.trim() {
                    "" => String::new(),
                    l => format!(" ({l})"),
                };
                return Err(invalid(format!(
                    "a rank of {world} over {n} samples did not report{said}: see its error above"
                )));
            }
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            let max =
                |f: &dyn Fn(&RankFigures) -> f64| per_rank.iter().map(f).fold(0.0f64, f64::max);
            let row = ScaleRow {
                samples: n,
                ranks: world,
                format: spec.format.name(),
                open_s: max(&|r| r.open_s),
                open_peak_rss_mib: max(&|r| mib(r.open_peak_rss_bytes)),
                open_pss_total_mib: per_rank.iter().map(|r| mib(r.open_pss_bytes)).sum(),
                plan_ms: max(&|r| r.plan_ms),
                first_batch_ms: max(&|r| r.first_batch_ms),
                index_bytes_per_sample: per_rank[0].index_bytes as f64 / n as f64,
                peak_rss_mib: max(&|r| mib(r.peak_rss_bytes)),
                rss_beside_buffers_mib: max(&|r| {
                    mib(r.peak_rss_bytes.saturating_sub(r.buffers_bytes))
                }),
                pss_total_mib: per_rank.iter().map(|r| mib(r.pss_bytes)).sum(),
                global_samples_per_s: per_rank.iter().map(|r| r.global_samples_per_s).sum(),
                block_samples_per_s: per_rank.iter().map(|r| r.block_samples_per_s).sum(),
                per_rank,
            };
            each(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Waits until stdin closes (a rank process, after reporting).
pub fn wait_for_parent() {
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

/// The table's header.
pub fn table_header() -> String {
    format!(
        "{:>13} {:>5} {:>8} {:>11} {:>12} {:>8} {:>9} {:>8} {:>9} {:>10} {:>9} {:>12} {:>12}",
        "samples",
        "ranks",
        "open s",
        "open pk MiB",
        "open PSS MiB",
        "plan ms",
        "1st bat ms",
        "idx B/s",
        "peak MiB",
        "-buf MiB",
        "PSS MiB",
        "global s/s",
        "block s/s"
    )
}

/// A row of the table.
pub fn table_row(r: &ScaleRow) -> String {
    format!(
        "{:>13} {:>5} {:>8.3} {:>11.1} {:>12.1} {:>8.2} {:>10.1} {:>8.2} {:>9.1} {:>10.1} {:>9.1} {:>12.0} {:>12.0}",
        r.samples,
        r.ranks,
        r.open_s,
        r.open_peak_rss_mib,
        r.open_pss_total_mib,
        r.plan_ms,
        r.first_batch_ms,
        r.index_bytes_per_sample,
        r.peak_rss_mib,
        r.rss_beside_buffers_mib,
        r.pss_total_mib,
        r.global_samples_per_s,
        r.block_samples_per_s
    )
}
