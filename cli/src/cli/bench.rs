//! `gpufeed bench`: every mode's arguments and output (the measurements are in
//! [`crate::bench`]).

use super::*;

/// Runs the bench mode `b` names (none: the short comparison of every engine).
pub(super) fn bench_cmd(b: BenchCmd) -> Result<()> {
    match b.which {
        Some(BenchWhich::Io(a)) => bench_io(a),
        Some(BenchWhich::Load(a)) => bench_load(a),
        Some(BenchWhich::Scale(a)) => bench_scale(a),
        Some(BenchWhich::Gpu(a)) => bench_gpu(a),
        #[cfg(feature = "decode")]
        Some(BenchWhich::Decode(a)) => bench_decode(*a),
        #[cfg(feature = "remote")]
        Some(BenchWhich::Remote(a)) => bench_remote(a),
        None => bench_quick(b.quick),
    }
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(super) struct BenchCmd {
    #[command(subcommand)]
    pub(super) which: Option<BenchWhich>,
    #[command(flatten)]
    pub(super) quick: QuickArgs,
}

#[derive(Debug, Subcommand)]
pub(super) enum BenchWhich {
    /// Raw reads from one file through one or more engines, as fio measures them.
    Io(IoArgs),
    /// One epoch per mode over an ImageNet-like dataset it generates: small files vs packed
    /// shards in global, block and shard-buffer order (cold cache when root).
    Load(LoadArgs),
    /// What a dataset's size costs a rank: token corpora of 10⁶ to 10⁹ windows (sparse files),
    /// one rank and several, each its own process — open time, index bytes per sample, peak
    /// RSS and PSS, time to plan and read the first batch, samples/s of short global and block
    /// runs.
    Scale(ScaleArgs),
    /// Storage → GPU: ours (io_uring → pinned → H2D), cuFile, a naive path, and the two
    /// ceilings (pinned H2D alone, storage → host alone); needs a CUDA GPU.
    Gpu(GpuArgs),
    /// Decoded image batches: gpufeed's CPU decode stage (training and evaluation transforms,
    /// and decode alone) against the same work as torchvision's CPU transforms do it (Pillow +
    /// numpy, as many worker processes as decode threads); with --device sim|cuda, the device
    /// pipeline against torchvision's decode_jpeg(device=) + transforms.v2 on the device;
    /// alternated round by round.
    #[cfg(feature = "decode")]
    Decode(Box<DecodeArgs>),
    /// A remote dataset (s3://…) epoch after epoch through the node cache, by one or more
    /// ranks of this node: samples/s, first batch, bytes fetched (LRU's beside), GETs, CPU per
    /// GiB; against the raw range-GET rate and the same loader over a local copy (--local).
    #[cfg(feature = "remote")]
    Remote(RemoteArgs),
}

#[cfg(feature = "remote")]
#[derive(Debug, Args)]
pub(super) struct RemoteArgs {
    /// The remote dataset: s3://BUCKET/PREFIX (gs://, az://, http(s)://).
    #[arg(required = true, num_args = 1..)]
    pub(super) urls: Vec<String>,
    #[command(flatten)]
    pub(super) dataset: DatasetArgs,
    #[command(flatten)]
    pub(super) loader: LoaderArgs,
    /// The epoch order (global needs a warm cache).
    #[arg(long, default_value = "block")]
    pub(super) order: String,
    /// Epochs.
    #[arg(long, default_value_t = 3)]
    pub(super) epochs: u64,
    /// Ranks on this node (threads, each with a loader of its own, sharing the node cache).
    #[arg(long, default_value_t = 1)]
    pub(super) ranks: u32,
    /// GETs in flight for the raw range-GET ceiling.
    #[arg(long, default_value_t = 16)]
    pub(super) get_threads: usize,
    /// A local copy of the dataset: gpufeed's loader over it is the local-disk ceiling.
    #[arg(long, num_args = 1..)]
    pub(super) local: Option<Vec<PathBuf>>,
    /// Keep what the cache holds (default: empty it first, for a cold first epoch).
    #[arg(long)]
    pub(super) keep_cache: bool,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

#[cfg(feature = "remote")]
fn bench_remote(a: RemoteArgs) -> Result<()> {
    let mut settings = a.loader.settings()?;
    settings.set("order", &a.order)?;
    let spec = crate::bench::remote::RemoteSpec {
        urls: a.urls.clone(),
        opts: a.dataset.options()?,
        settings,
        epochs: a.epochs,
        ranks: a.ranks,
        get_threads: a.get_threads,
        local: a.local.clone(),
        fresh: !a.keep_cache,
    };
    let r = crate::bench::remote::run(&spec)?;
    if a.json {
        outln!("{}", serde_json::to_value(&r).unwrap_or_default());
        return Ok(());
    }
    let h = gpufeed::config::bytes_human;
    outln!(
        "{}: {} samples, {}; node cache {} in extents of {}; {} rank(s), order {}",
        r.urls.join(" "),
        r.samples,
        h(r.dataset_bytes),
        h(r.cache_limit),
        h(r.extent_bytes),
        r.ranks,
        r.order
    );
    outln!(
        "open: {:.3} s, {} GETs, {} fetched; first batch {:.3} s after the open began",
        r.open.seconds,
        r.open.gets,
        h(r.open.fetched_bytes),
        r.first_batch_from_open_s
    );
    outln!(
        "{:>5} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>7} {:>8}",
        "epoch",
        "samples/s",
        "GiB/s",
        "first_s",
        "fetched",
        "LRU",
        "hits",
        "GETs",
        "retries",
        "CPU/GiB"
    );
    for e in &r.epochs {
        outln!(
            "{:>5} {:>10.0} {:>8.3} {:>8.3} {:>7.2}x {:>7.2}x {:>6.0}% {:>6} {:>7} {:>8.3}",
            e.epoch,
            e.samples_per_s,
            e.gib_per_s,
            e.first_batch_s,
            e.fetched_ratio,
            e.lru_fetched_ratio,
            100.0 * e.hit_ratio,
            e.gets,
            e.retries,
            e.cpu_s_per_gib
        );
    }
    outln!(
        "raw range GETs ({} in flight): {:.3} GiB/s ({:.0} samples/s at that rate)",
        r.get_threads,
        r.raw_get.gib_per_s,
        r.raw_get.samples_per_s
    );
    if let Some(l) = &r.local {
        outln!(
            "local copy, same loader: {:.0} samples/s, {:.3} GiB/s",
            l.samples_per_s,
            l.gib_per_s
        );
    }
    Ok(())
}

#[cfg(feature = "decode")]
#[derive(Debug, Args)]
pub(super) struct DecodeArgs {
    /// An ImageFolder of JPEGs; an ImageNet-like set is generated there when it is absent or
    /// empty.
    #[arg(long, default_value = "gpufeed-decode")]
    pub(super) dir: PathBuf,
    /// Images in the generated set.
    #[arg(long, default_value_t = 2000)]
    pub(super) images: u64,
    /// Where the device rows decode: cpu (no device rows), sim (the simulated device: a build
    /// with `--features sim`; its figures are not a GPU's), sim-free (the simulated device
    /// whose own work costs nothing: what remains is the pipeline's host work; its tensors
    /// are not images) or cuda (device 0).
    #[arg(long, default_value = "cpu")]
    pub(super) device: String,
    /// The simulated device only: a modelled JPEG engine that takes PER_BATCH + n × PER_IMAGE
    /// microseconds of wall time per batch of n images, one batch after another; the device
    /// rows then say the images/s that engine allows (`engine_bound_images_per_s`).
    #[arg(long, value_name = "PER_BATCH,PER_IMAGE")]
    pub(super) sim_engine_us: Option<String>,
    /// Decode threads and Pillow worker processes (default: the decode stage's, this rank's
    /// share of the cores). This flag and the next three are image settings: their defaults
    /// and values are those of `Images(...)` and `gpufeed_images` (IMAGE_SETTINGS).
    #[arg(long)]
    pub(super) threads: Option<String>,
    /// Output side in pixels (default 224).
    #[arg(long)]
    pub(super) size: Option<String>,
    /// Output element type: uint8, float16, bfloat16, float32 (default float32, as a trainer
    /// gets it).
    #[arg(long)]
    pub(super) dtype: Option<String>,
    /// Output layout: nchw or nhwc (default nchw).
    #[arg(long)]
    pub(super) layout: Option<String>,
    /// Samples per batch.
    #[arg(long, default_value_t = 128)]
    pub(super) batch: u32,
    /// Rounds: every row once per round, in turn.
    #[arg(long, default_value_t = 3)]
    pub(super) rounds: u32,
    /// Rows (comma-separated): gpufeed-train, pil-train, gpufeed-eval, pil-eval,
    /// gpufeed-decode, pil-decode.
    #[arg(long, value_delimiter = ',')]
    pub(super) rows: Vec<String>,
    /// A simulated trainer holding each batch this many milliseconds (gpufeed's transform
    /// rows): they then say whether decoding keeps up and what limits it.
    #[arg(long, default_value_t = 0.0)]
    pub(super) step_ms: f64,
    /// Python with Pillow and numpy for the pil rows (scripts/bench-decode.sh makes a
    /// virtualenv and passes it).
    #[arg(long)]
    pub(super) python: Option<PathBuf>,
    /// Print one JSON object per row and round, then one with the ratios.
    #[arg(long)]
    pub(super) json: bool,
    /// Also draw the rows as bars, median images/s of each row, gpufeed's with its ratio to Pillow's, into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(super) plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(super) struct GpuArgs {
    /// File for the fixed-size reads (created if missing).
    #[arg(long, default_value = "gpufeed-bench.dat")]
    pub(super) file: PathBuf,
    /// Size of the file to create.
    #[arg(long, default_value = "4G", value_parser = size_arg)]
    pub(super) size: u64,
    /// Where the packed ImageNet-like dataset lives (generated if absent).
    #[arg(long, default_value = "gpufeed-load")]
    pub(super) dir: PathBuf,
    /// Samples in the generated dataset.
    #[arg(long, default_value_t = 50_000)]
    pub(super) samples: u64,
    /// Seconds per fixed-size row.
    #[arg(long, default_value_t = 5.0)]
    pub(super) seconds: f64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub(super) device: u32,
    /// Size of the fixed reads.
    #[arg(long, default_value = "1M", value_parser = size_arg)]
    pub(super) bs: u64,
    /// Reads in flight (ours and host).
    #[arg(long, default_value_t = 128)]
    pub(super) qd: u32,
    /// cuFile reader threads.
    #[arg(long, default_value_t = 16)]
    pub(super) cufile_threads: usize,
    /// Rows (comma-separated), run in the order given: host, h2d, ours, cufile, naive.
    #[arg(long, value_delimiter = ',')]
    pub(super) paths: Vec<String>,
    /// Workloads (comma-separated): fixed, imagenet.
    #[arg(long, value_delimiter = ',')]
    pub(super) workloads: Vec<String>,
    /// Loader rows skip crc32c verification (cuFile and naive rows never verify).
    #[arg(long)]
    pub(super) no_verify: bool,
    /// Print one JSON object per row.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Debug, Args)]
pub(super) struct LoadArgs {
    /// Where the dataset lives (generated if absent: DIR/small and DIR/packed).
    #[arg(long, default_value = "gpufeed-load")]
    pub(super) dir: PathBuf,
    /// Samples in the generated dataset.
    #[arg(long, default_value_t = 50_000)]
    pub(super) samples: u64,
    /// Modes to run (comma-separated): small-files, global, block, shard-buffer, io.
    #[arg(
        long,
        default_value = "small-files,global,block,shard-buffer,io",
        value_delimiter = ','
    )]
    pub(super) modes: Vec<String>,
    /// Threads of the small-files baseline.
    #[arg(long, default_value_t = 8)]
    pub(super) threads: usize,
    /// Shard size of the generated packed copy.
    #[arg(long, default_value = "256M", value_parser = size_arg)]
    pub(super) shard_size: u64,
    /// Run the loader modes (global, block, shard-buffer) over this dataset instead of
    /// DIR/packed: any format gpufeed reads (tars, TFRecords, shards, a Megatron prefix, token
    /// files…); repeat it for several files of one dataset. Nothing is generated unless the
    /// small-files or io modes need it.
    #[arg(long)]
    pub(super) dataset: Vec<PathBuf>,
    /// Consecutive epochs per loader mode, each next one asked for when the one before starts
    /// (the JSON gives each epoch's samples/s and the gaps between epochs).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) epochs: u32,
    /// A simulated trainer (loader modes): hold each batch this many milliseconds before
    /// asking for the next.
    #[arg(long, default_value_t = 0.0)]
    pub(super) step_ms: f64,
    /// Consumers sharing the machine (loader modes): each reads its rank's share (world N)
    /// with its own loader, holding each batch --step-ms; the verdict covers them all.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(super) gpus: u32,
    #[command(flatten)]
    pub(super) loader: LoaderArgs,
    #[command(flatten)]
    pub(super) open: DatasetArgs,
    /// Print one JSON object per mode.
    #[arg(long)]
    pub(super) json: bool,
    /// Also draw the rows as bars, each mode with its ratio to small-files (the baseline), into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(super) plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(super) struct ScaleArgs {
    /// Where the sparse token files are made (they take no disk space).
    #[arg(long, default_value = "gpufeed-scale")]
    pub(super) dir: PathBuf,
    /// Dataset sizes in samples (comma-separated; 1e6 and 1000000 alike).
    #[arg(long, default_value = "1e6,1e7,1e8,1e9", value_delimiter = ',', value_parser = count_arg)]
    pub(super) sizes: Vec<u64>,
    /// Rank counts on this node (comma-separated), each rank its own process.
    #[arg(long, default_value = "1,8", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(super) ranks: Vec<u32>,
    /// Seconds of each short run (global, then block).
    #[arg(long, default_value_t = 2.0)]
    pub(super) seconds: f64,
    /// Tokens per window (u16 tokens; a sample is seq_len + 1 of them).
    #[arg(long, default_value_t = 1023)]
    pub(super) seq_len: u32,
    /// What to measure: tokens (flat u16 files, sparse) or packed (shards of 64-byte samples
    /// with ImageNet-like keys, written into --dir: ~130 bytes of disk a sample).
    #[arg(long, default_value = "tokens")]
    pub(super) format: String,
    #[command(flatten)]
    pub(super) loader: LoaderArgs,
    /// Print one JSON object per row.
    #[arg(long)]
    pub(super) json: bool,
    /// Also draw each row's peak RSS per rank as bars into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(super) plot: Option<PathBuf>,
    /// A rank process: RANK/WORLD (set by the bench for the processes it starts).
    #[arg(long, hide = true)]
    pub(super) rank_of: Option<String>,
    /// A rank process: the token file.
    #[arg(long, hide = true)]
    pub(super) file: Option<PathBuf>,
}

/// A count: digits, or a number in e notation (1e9).
fn count_arg(s: &str) -> std::result::Result<u64, String> {
    s.parse::<u64>()
        .ok()
        .or_else(|| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0 && *v < 1.9e19)
                .map(|v| v as u64)
        })
        .ok_or_else(|| format!("{s:?} is not a count (1000000 or 1e6)"))
}

#[derive(Debug, Args)]
pub(super) struct QuickArgs {
    /// File to read (created with a pattern if missing or too small).
    #[arg(long, default_value = "gpufeed-bench.dat")]
    pub(super) file: PathBuf,
    /// Size of the file to create.
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    pub(super) size: u64,
    /// Seconds per run.
    #[arg(long, default_value_t = 3.0)]
    pub(super) seconds: f64,
    /// Print one JSON object per run instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Also draw the rows as bars, each with its ratio to its baseline, into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(super) plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(super) struct IoArgs {
    /// File to read (created with a pattern if missing or smaller than --size).
    #[arg(long, default_value = "gpufeed-bench.dat")]
    pub(super) file: PathBuf,
    /// Size of the file to create if it is missing.
    #[arg(long, default_value = "4G", value_parser = size_arg)]
    pub(super) size: u64,
    /// Access pattern(s): seq, rand (comma-separated for several runs).
    #[arg(long, default_value = "rand", value_delimiter = ',')]
    pub(super) pattern: Vec<Pattern>,
    /// Read size, or a size mix in fio's bssplit syntax (SIZE/PERCENT:...), or `imagenet`.
    #[arg(long, default_value = IMAGENET_MIX)]
    pub(super) bs: String,
    /// Reads in flight.
    #[arg(long, default_value_t = 32)]
    pub(super) qd: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 10.0)]
    pub(super) seconds: f64,
    /// Engine(s): uring, uring-buffered, pread-pool, std, or the peer tokio-uring (a build with
    /// the `tokio-uring` feature) — comma-separated for several runs.
    #[arg(long, default_value = "uring", value_delimiter = ',')]
    pub(super) engine: Vec<String>,
    /// Threads of the pread pool (default: one per queue slot).
    #[arg(long, default_value_t = 0)]
    pub(super) threads: u32,
    /// Use an io_uring SQPOLL kernel thread (burns a core).
    #[arg(long)]
    pub(super) sqpoll: bool,
    /// When to submit: each (a read as soon as its slot frees), batch (all reaped reads at
    /// once), auto (each for reads averaging under 64 KiB, batch above).
    #[arg(long, default_value = "auto")]
    pub(super) submit: SubmitPolicy,
    /// Completions to wait for before resubmitting (default: 1 with each, 4 with batch).
    #[arg(long, default_value_t = 0)]
    pub(super) reap: u32,
    /// Set up the ring with IORING_SETUP_DEFER_TASKRUN.
    #[arg(long)]
    pub(super) defer_taskrun: bool,
    /// Do not register the arena with io_uring (plain Read instead of ReadFixed).
    #[arg(long)]
    pub(super) no_register: bool,
    /// Do not back the arena with huge pages.
    #[arg(long)]
    pub(super) no_huge_pages: bool,
    /// Do not drop the file's cached pages before each run.
    #[arg(long)]
    pub(super) keep_cache: bool,
    /// Seed for random offsets and sizes.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Print one JSON object per run instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Also draw the rows as bars (the last --engine is each workload's baseline), into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(super) plot: Option<PathBuf>,
}
pub(super) fn emit(r: &IoBenchResult, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(r).expect("results serialise"));
    } else {
        outln!("{}", table_row(r));
    }
}

pub(super) fn bench_io(a: IoArgs) -> Result<()> {
    let sizes = SizeMix::parse(&a.bs)?;
    // Every name checked before anything runs (the file made below may be gigabytes).
    let engines: Vec<Option<EngineKind>> = a
        .engine
        .iter()
        .map(|e| match e.as_str() {
            "tokio-uring" if cfg!(feature = "tokio-uring") => Ok(None),
            "tokio-uring" => Err(crate::util::invalid(
                "this gpufeed was built without the tokio-uring peer: \
                 cargo build --release --features tokio-uring",
            )),
            other => other.parse().map(Some),
        })
        .collect::<Result<_>>()?;
    ensure_file(&a.file, a.size)?;
    if !a.json {
        outln!("{}", table_header());
    }
    let mut rows = Vec::new();
    for &pattern in &a.pattern {
        for &engine in &engines {
            let peer = engine.is_none();
            let engine = engine.unwrap_or(EngineKind::Uring);
            let spec = IoBenchSpec {
                queue_depth: a.qd,
                seconds: a.seconds,
                threads: a.threads,
                sqpoll: a.sqpoll,
                reap_batch: a.reap,
                submit: a.submit,
                defer_taskrun: a.defer_taskrun,
                register_buffers: !a.no_register,
                huge_pages: !a.no_huge_pages,
                seed: a.seed,
                drop_cache: !a.keep_cache,
                ..IoBenchSpec::new(&a.file, engine, pattern, sizes.clone())
            };
            let r = if peer {
                run_peer(&spec)?
            } else {
                run_io_bench(&spec)?
            };
            emit(&r, a.json);
            rows.push(r);
        }
    }
    if let Some(p) = &a.plot {
        let last = rows.last().map(|r| r.engine.clone()).unwrap_or_default();
        let bars: Vec<_> = rows
            .iter()
            .map(|r| crate::bench::plot::Bar {
                // std reads at QD 1 whatever --qd says: the group is the workload alone.
                group: format!(
                    "{} {}",
                    format!("{:?}", r.pattern).to_lowercase(),
                    short_bs(&r.bs)
                ),
                label: r.engine.clone(),
                value: r.gib_per_s,
                baseline: r.engine == last,
            })
            .collect();
        crate::bench::plot::bars(p, "gpufeed bench io", "GiB/s", &bars)?;
    }
    Ok(())
}

#[cfg(feature = "tokio-uring")]
pub(super) fn run_peer(spec: &IoBenchSpec) -> Result<IoBenchResult> {
    crate::bench::tokio_uring::run_tokio_uring_bench(spec)
}

#[cfg(not(feature = "tokio-uring"))]
pub(super) fn run_peer(_: &IoBenchSpec) -> Result<IoBenchResult> {
    Err(crate::util::invalid(
        "this gpufeed was built without the tokio-uring peer \
         (cargo build --release -p gpufeed-cli --features tokio-uring)",
    ))
}

/// The main job: every engine on three workloads, a few seconds each, with a verdict per case.
pub(super) fn bench_quick(a: QuickArgs) -> Result<()> {
    ensure_file(&a.file, a.size)?;
    let cases = [("4K", 32u32), ("128K", 32), (IMAGENET_MIX, 128)];
    if !a.json {
        outln!(
            "gpufeed bench: random reads from {} ({} s per run; `gpufeed bench io --help` for more)",
            a.file.display(),
            a.seconds
        );
        outln!("{}", table_header());
    }
    let mut plot_rows = Vec::new();
    for (bs, qd) in cases {
        let sizes = SizeMix::parse(bs)?;
        let mut results = Vec::new();
        for engine in EngineKind::ALL {
            let spec = IoBenchSpec {
                queue_depth: qd,
                seconds: a.seconds,
                ..IoBenchSpec::new(&a.file, engine, Pattern::Rand, sizes.clone())
            };
            let r = run_io_bench(&spec)?;
            emit(&r, a.json);
            results.push(r);
        }
        if a.plot.is_some() {
            let base = results.last().map(|r| r.engine.clone()).unwrap_or_default();
            plot_rows.extend(results.iter().map(|r| crate::bench::plot::Bar {
                group: short_bs(&r.bs),
                label: r.engine.clone(),
                value: r.gib_per_s,
                baseline: r.engine == base,
            }));
        }
        if !a.json {
            let ours = &results[0];
            let others: Vec<String> = results[1..]
                .iter()
                .map(|r| format!("{:.2}× {}", ours.gib_per_s / r.gib_per_s, r.engine))
                .collect();
            outln!("  -> {} is {}", ours.engine, others.join(", "));
        }
    }
    // Storage → GPU rows when a GPU is present (1 MiB reads of the same file).
    match gpufeed::gpu::gpu_available() {
        Ok(_) => {
            let spec = crate::bench::gpu::GpuBenchSpec {
                file: a.file.clone(),
                file_bytes: a.size,
                workloads: vec!["fixed".into()],
                seconds: a.seconds,
                ..gpu_spec_defaults()
            };
            if !a.json {
                outln!("{}", crate::bench::gpu::table_header());
            }
            let rows = crate::bench::gpu::run_gpu_bench(&spec, |r| emit_gpu(r, a.json))?;
            if !a.json {
                for l in crate::bench::gpu::ratios(&rows) {
                    outln!("  -> {l}");
                }
            }
        }
        Err(e) if !a.json => outln!("(no GPU rows: {})", e.report()),
        Err(_) => {}
    }
    if let Some(p) = &a.plot {
        crate::bench::plot::bars(
            p,
            "gpufeed bench: random reads, every engine",
            "GiB/s",
            &plot_rows,
        )?;
        if !a.json {
            outln!("plot: {}", p.display());
        }
    }
    Ok(())
}

/// A size mix's name for a chart: the ImageNet mix is "ImageNet mix".
pub(super) fn short_bs(bs: &str) -> String {
    if bs == IMAGENET_MIX || bs.contains(':') {
        "ImageNet mix".into()
    } else {
        bs.to_string()
    }
}

pub(super) fn gpu_spec_defaults() -> crate::bench::gpu::GpuBenchSpec {
    crate::bench::gpu::GpuBenchSpec {
        file: "gpufeed-bench.dat".into(),
        file_bytes: 4 << 30,
        dir: "gpufeed-load".into(),
        samples: 50_000,
        seconds: 5.0,
        device: 0,
        read_bytes: 1 << 20,
        queue_depth: 128,
        cufile_threads: 16,
        rows: crate::bench::gpu::ROWS.map(String::from).to_vec(),
        workloads: vec!["fixed".into(), "imagenet".into()],
        verify: true,
    }
}

pub(super) fn emit_gpu(r: &crate::bench::gpu::GpuBenchResult, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(r).expect("serialises"));
    } else {
        outln!("{}", crate::bench::gpu::table_row(r));
    }
}

pub(super) fn bench_gpu(a: GpuArgs) -> Result<()> {
    let d = gpu_spec_defaults();
    let spec = crate::bench::gpu::GpuBenchSpec {
        file: a.file,
        file_bytes: a.size,
        dir: a.dir,
        samples: a.samples,
        seconds: a.seconds,
        device: a.device,
        read_bytes: a.bs as u32,
        queue_depth: a.qd,
        cufile_threads: a.cufile_threads,
        rows: if a.paths.is_empty() { d.rows } else { a.paths },
        workloads: if a.workloads.is_empty() {
            d.workloads
        } else {
            a.workloads
        },
        verify: !a.no_verify,
    };
    crate::bench::gpu::rows_in_order(&spec.rows)?;
    // No GPU: one line, non-zero exit (before any file is made).
    let info = gpufeed::gpu::gpu_available()?;
    if !a.json {
        outln!(
            "gpufeed bench gpu: {} ({} MiB, driver {}), cuFile: {}",
            info.name,
            info.total_mem >> 20,
            info.driver_version,
            info.cufile
        );
        outln!("{}", crate::bench::gpu::table_header());
    }
    let rows = crate::bench::gpu::run_gpu_bench(&spec, |r| emit_gpu(r, a.json))?;
    if !a.json {
        for l in crate::bench::gpu::ratios(&rows) {
            outln!("  -> {l}");
        }
    }
    Ok(())
}

pub(super) fn bench_scale(a: ScaleArgs) -> Result<()> {
    use crate::bench::scale::{measure_rank, run_scale, table_header, table_row, ScaleSpec};
    let settings = a.loader.settings()?;
    let format = crate::bench::scale::ScaleFormat::parse(&a.format)?;
    if let Some(rw) = &a.rank_of {
        // A rank process: measure, report one JSON line, wait for the bench to close stdin.
        let (rank, world) = rw
            .split_once('/')
            .and_then(|(r, w)| Some((r.parse().ok()?, w.parse().ok()?)))
            .ok_or_else(|| crate::util::invalid(format!("--rank-of {rw:?}: RANK/WORLD")))?;
        let file = a
            .file
            .as_ref()
            .ok_or_else(|| crate::util::invalid("--rank-of needs --file"))?;
        let f = measure_rank(format, file, a.seq_len, &settings, rank, world, a.seconds)?;
        outln!("{}", serde_json::to_string(&f).expect("serialises"));
        crate::bench::scale::wait_for_parent();
        return Ok(());
    }
    if !(a.seconds > 0.0 && a.seconds <= 86_400.0) {
        return Err(crate::util::invalid(format!(
            "--seconds {} is not a number of seconds above 0 and at most a day",
            a.seconds
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|e| gpufeed::error::Error::io("cannot find this program to start ranks", e))?;
    let flags: Vec<(String, String)> = a
        .loader
        .given
        .iter()
        .filter_map(|(name, v)| {
            let o = gpufeed::config::LOADER_SETTINGS
                .iter()
                .find(|o| o.name == *name)?;
            Some((format!("--{}", o.flag), v.clone()))
        })
        .collect();
    let (seconds, seq_len) = (a.seconds, a.seq_len);
    let child = |rank: u32, world: u32, file: &std::path::Path| {
        let mut c = std::process::Command::new(&exe);
        c.args(["bench", "scale", "--rank-of", &format!("{rank}/{world}")])
            .arg("--file")
            .arg(file)
            .args([
                "--seconds",
                &seconds.to_string(),
                "--seq-len",
                &seq_len.to_string(),
                "--format",
                format.name(),
            ]);
        for (f, v) in &flags {
            c.arg(f).arg(v);
        }
        c
    };
    let spec = ScaleSpec {
        format,
        dir: a.dir.clone(),
        sizes: a.sizes.clone(),
        ranks: a.ranks.clone(),
        seconds,
        seq_len,
    };
    if !a.json {
        match format {
            crate::bench::scale::ScaleFormat::Tokens => outln!(
                "gpufeed bench scale: flat u16 token files of seq_len {} in {} (sparse), {} s \
                 per run",
                seq_len,
                a.dir.display(),
                seconds
            ),
            crate::bench::scale::ScaleFormat::Packed => outln!(
                "gpufeed bench scale: packed shards of 64-byte samples in {}, {} s per run",
                a.dir.display(),
                seconds
            ),
        }
        outln!("{}", table_header());
    }
    let rows = run_scale(&spec, &child, &mut |r| {
        if a.json {
            outln!("{}", serde_json::to_string(r).expect("serialises"));
        } else {
            outln!("{}", table_row(r));
        }
    })?;
    if !a.json {
        outln!(
            "  (peak MiB: the largest rank's peak RSS; -buf: less its read buffers; PSS: every \
             rank's together, each with its loader alive; samples/s: all ranks together)"
        );
    }
    if let Some(p) = &a.plot {
        let bars: Vec<_> = rows
            .iter()
            .map(|r| crate::bench::plot::Bar {
                group: format!("{} samples", r.samples),
                label: format!("{} rank(s)", r.ranks),
                value: r.peak_rss_mib,
                baseline: r.ranks == a.ranks[0],
            })
            .collect();
        crate::bench::plot::bars(
            p,
            "gpufeed bench scale: peak RSS per rank by dataset size",
            "MiB",
            &bars,
        )?;
    }
    Ok(())
}

pub(super) fn bench_load(a: LoadArgs) -> Result<()> {
    use crate::bench::load::{drop_caches, ensure_dataset, table_header, LoadRow, PackedSpec};
    // The generated set is made only when a mode reads it: with --dataset, the loader modes
    // read that instead.
    let generated = a.dataset.is_empty() || a.modes.iter().any(|m| m == "small-files" || m == "io");
    let (small, packed) = if generated {
        ensure_dataset(&a.dir, a.samples, a.shard_size)?
    } else {
        (a.dir.join("small"), a.dir.join("packed"))
    };
    let settings = a.loader.settings()?;
    let spec = PackedSpec {
        settings,
        engine: EngineKind::Uring,
        epochs: a.epochs,
        gpus: a.gpus,
        step: std::time::Duration::try_from_secs_f64(a.step_ms / 1e3).map_err(|_| {
            crate::util::invalid(format!(
                "--step-ms {} is not a number of milliseconds ≥ 0",
                a.step_ms
            ))
        })?,
    };
    let opts = a.open.options()?;
    if !a.json {
        if a.dataset.is_empty() {
            outln!(
                "gpufeed bench load: {} samples in {}",
                a.samples,
                a.dir.display()
            );
        } else {
            outln!("gpufeed bench load: {}", show_paths(&a.dataset));
        }
    }
    if !a.json {
        outln!("{}", table_header());
    }
    let modes = crate::bench::load::LoadModes {
        small,
        packed,
        dataset: a.dataset.clone(),
        options: opts,
        threads: a.threads,
        spec,
    };
    let mut plotted: Vec<(String, f64)> = Vec::new();
    for mode in &a.modes {
        let cold = drop_caches();
        if !cold && !a.json && mode == &a.modes[0] {
            eprintln!(
                "gpufeed: not root: the page cache could not be dropped, figures are warm-cache"
            );
        }
        match modes.run(mode, cold)? {
            LoadRow::Loader(r) => {
                emit_load(&r, a.json);
                plotted.push((r.mode.clone(), r.samples_per_s));
            }
            LoadRow::Io(r) => {
                if a.json {
                    outln!(
                        "{}",
                        serde_json::json!({"mode": "io", "gib_per_s": r.gib_per_s, "iops": r.iops, "cpu_s_per_gib": r.cpu_s_per_gib, "qd": r.qd, "cold_cache": cold})
                    );
                } else {
                    outln!("{:<13} {:>8} {:>10.0} {:>7.3} {:>10.3}   (bench io: random reads of the ImageNet mix, QD {})", "io", r.reads, r.iops, r.gib_per_s, r.cpu_s_per_gib, r.qd);
                }
            }
        }
    }
    if let Some(p) = &a.plot {
        let bars: Vec<_> = plotted
            .iter()
            .map(|(m, v)| crate::bench::plot::Bar {
                group: "epoch".into(),
                label: m.clone(),
                value: *v,
                baseline: m == "small-files",
            })
            .collect();
        crate::bench::plot::bars(
            p,
            "gpufeed bench load: one epoch per mode",
            "samples/s",
            &bars,
        )?;
    }
    Ok(())
}

#[cfg(feature = "decode")]
pub(super) fn bench_decode(a: DecodeArgs) -> Result<()> {
    use crate::bench::decode::{ratios, run_decode_bench, table_row, DecodeBenchSpec, ROWS};
    if !["cpu", "sim", "sim-free", "cuda"].contains(&a.device.as_str()) {
        return Err(crate::util::invalid(format!(
            "--device {}: cpu, sim or sim-free (the simulated device; a build with --features \
             sim) or cuda",
            a.device
        )));
    }
    let sim_engine = match &a.sim_engine_us {
        None => None,
        Some(_) if !a.device.starts_with("sim") => {
            return Err(crate::util::invalid(
                "--sim-engine-us models the simulated device's engine: give --device sim or \
                 sim-free",
            ))
        }
        Some(v) => {
            let us = |t: &str| {
                t.trim()
                    .parse::<u64>()
                    .ok()
                    .map(std::time::Duration::from_micros)
            };
            match v.split_once(',').map(|(b, i)| (us(b), us(i))) {
                Some((Some(b), Some(i))) => Some((b, i)),
                _ => {
                    return Err(crate::util::invalid(format!(
                        "--sim-engine-us {v}: two whole numbers of microseconds, \
                         PER_BATCH,PER_IMAGE (say 2000,250)"
                    )))
                }
            }
        }
    };
    // The image settings this command takes, read as every door reads them.
    let given: Vec<(&str, String)> = [
        ("threads", &a.threads),
        ("size", &a.size),
        ("dtype", &a.dtype),
        ("layout", &a.layout),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
    .collect();
    let image = gpufeed::decode::ImageSpec::from_settings(&given).map_err(|e| {
        match given.iter().find(|(k, _)| e.message().starts_with(k)) {
            Some(_) => crate::util::invalid(format!("--{}", e.message())),
            None => e,
        }
    })?;
    if image.size.0 != image.size.1 {
        return Err(crate::util::invalid(format!(
            "--size {}: bench decode's rows are square, as the Pillow rows it compares are",
            a.size.as_deref().unwrap_or_default()
        )));
    }
    let mut a = a;
    if a.python.is_none() {
        a.python = std::env::var_os("GPUFEED_BENCH_PYTHON").map(PathBuf::from);
    }
    let threads = image.thread_count();
    let rows = if a.rows.is_empty() {
        let mut r = crate::bench::decode::default_rows(&a.device);
        if a.python.is_none()
            && r.iter()
                .any(|r| r.starts_with("pil-") || r.starts_with("tv-"))
        {
            gpufeed::testing::notice(
                "no --python (Pillow and numpy; torch and torchvision for the tv rows): the \
                 pil and tv rows are left out (scripts/bench-decode.sh runs them all)",
            );
            r.retain(|r| !r.starts_with("pil-") && !r.starts_with("tv-"));
        }
        r
    } else {
        a.rows.clone()
    };
    let spec = DecodeBenchSpec {
        dir: a.dir.clone(),
        images: a.images,
        threads,
        image,
        batch: a.batch,
        rounds: a.rounds,
        rows,
        python: a.python.clone(),
        script: crate::bench::decode::default_script(),
        device: a.device.clone(),
        sim_engine,
        step: std::time::Duration::try_from_secs_f64(a.step_ms / 1e3).map_err(|_| {
            crate::util::invalid(format!("--step-ms {} is not a number ≥ 0", a.step_ms))
        })?,
    };
    let rows = run_decode_bench(&spec, |r| {
        if a.json {
            outln!("{}", serde_json::to_string(r).expect("serialises"));
        } else {
            outln!("{}", table_row(r));
        }
    })?;
    if let Some(p) = &a.plot {
        let median = |row: &str| {
            let mut v: Vec<f64> = rows
                .iter()
                .filter(|r| r.row == row)
                .map(|r| r.images_per_s)
                .collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let mut bars = Vec::new();
        for row in ROWS {
            if let Some(v) = median(row) {
                let (who, mode) = row.rsplit_once('-').expect("who-mode");
                bars.push(crate::bench::plot::Bar {
                    group: mode.into(),
                    label: match who {
                        "pil" => "Pillow + numpy".into(),
                        "tv" => "torchvision".into(),
                        "gpufeed-device" => "gpufeed (device)".into(),
                        _ => "gpufeed".into(),
                    },
                    value: v,
                    baseline: who == "pil" || who == "tv",
                });
            }
        }
        crate::bench::plot::bars(
            p,
            &format!("gpufeed bench decode: {threads} thread(s), median of rounds"),
            "images/s",
            &bars,
        )?;
    }
    let rs = ratios(&rows);
    if a.json {
        let v: Vec<_> = rs
            .iter()
            .map(|(m, round, ips, cpu)| {
                serde_json::json!({"ratio": m, "round": round, "images_per_s": ips, "cpu_per_image": cpu})
            })
            .collect();
        outln!("{}", serde_json::json!({ "ratios": v }));
    } else {
        for (m, round, ips, cpu) in rs {
            outln!(
                "gpufeed/{} {m:<6} round {round:>2}: {ips:.2}x images/s at {cpu:.2}x CPU per image",
                if m.starts_with("device-") || m.starts_with("nohw-") {
                    "tv"
                } else {
                    "pil"
                }
            );
        }
    }
    Ok(())
}

pub(super) fn emit_load(r: &crate::bench::load::LoadBenchResult, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(r).expect("serialises"));
    } else {
        outln!("{}", crate::bench::load::table_row(r));
        if let (Some(plan), Some(dio), Some(floor)) = (
            r.plan_align_bytes,
            r.dio_align_bytes,
            r.dio_floor_amplification,
        ) {
            outln!(
                "  reads planned at {plan}-byte alignment; this file system's direct-I/O \
                 alignment is {dio} bytes: every sample read alone at it would read {floor:.3}x \
                 (neighbours read together can read less)"
            );
        }
        if let Some(v) = &r.verdict {
            outln!(
                "  at {:.1} ms per step, {} consumer(s): {:.1} of {:.1} batches/s; {v}",
                r.step_ms,
                r.gpus,
                r.achieved_batches_per_s,
                r.demand_batches_per_s.unwrap_or(0.0)
            );
        }
        if r.epochs > 1 {
            let list = |v: &[f64], digits: usize| {
                v.iter()
                    .map(|x| format!("{x:.digits$}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            outln!(
                "  {} epochs: samples/s {}; gaps between epochs {} ms",
                r.epochs,
                list(&r.epoch_samples_per_s, 0),
                list(&r.epoch_gaps_ms, 2)
            );
        }
    }
}
