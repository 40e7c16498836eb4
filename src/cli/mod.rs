//! The `gpufeed` command line: argument parsing and output. The work itself lives in the
//! library ([`crate::bench`]), so everything here is presentation.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::bench::io::{table_header, table_row};
use crate::bench::{ensure_file, run_io_bench, IoBenchResult, IoBenchSpec, Pattern, SubmitPolicy};
use crate::config::EngineKind;
use crate::config::{FrontDoor, LoaderSettings, LOADER_SETTINGS};
use crate::dataset::{OpenOptions, DATASET_OPTIONS};
use crate::error::Result;
use crate::util::{parse_size, SizeMix, IMAGENET_MIX};

/// `println!` for the command's output, except that a closed pipe (`gpufeed inspect … | head`)
/// ends the command quietly with status 0, as Unix tools do, instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        write_out(format_args!($($arg)*))
    };
}

fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("gpufeed: error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// gpufeed keeps GPUs fed: io_uring O_DIRECT reads into pinned, registered buffers.
#[derive(Debug, Parser)]
#[command(name = "gpufeed", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure what the disk and each engine deliver (no subcommand: a short comparison of
    /// every engine on a generated file).
    Bench(BenchCmd),
    /// Pack a dataset (ImageFolder directory, WebDataset tars, TFRecords, tokens…) into
    /// gpufeed shards.
    Pack(PackArgs),
    /// Describe a dataset: format, samples, shards, sizes.
    Inspect(InspectArgs),
    /// Check every sample's checksum; exits non-zero if any is bad.
    Verify(InspectArgs),
}

#[derive(Debug, Args)]
struct PackArgs {
    /// The dataset to pack: an ImageFolder directory, WebDataset tars, TFRecords, shards, a
    /// Megatron prefix, token files (one path, or several files of one dataset).
    #[arg(required = true, num_args = 1..)]
    src: Vec<PathBuf>,
    /// Output directory for shard-NNNNN.gpf files.
    #[arg(required = true)]
    out: PathBuf,
    #[command(flatten)]
    dataset: DatasetArgs,
    /// Target size of each shard.
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    shard_size: u64,
    /// Align each sample inside shards (1: packed back to back).
    #[arg(long, default_value_t = 1)]
    align: u32,
    /// Threads writing shards (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// A dataset: shards, WebDataset tars, TFRecords, a Megatron prefix, token files, or an
    /// ImageFolder directory (a file, a directory of files, or several files of one dataset).
    #[arg(required = true, num_args = 1..)]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    dataset: DatasetArgs,
    /// Summarise the images (sizes, colour spaces, subsampling, progressive, non-JPEG): packed
    /// shards carry their headers; other formats have each sample's header bytes read.
    /// Shards with image records are summarised without asking.
    #[arg(long)]
    images: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// How to read a dataset: the flags are made from [`DATASET_OPTIONS`], the one table that the
/// Rust `OpenOptions`, Python's keyword arguments and the C options struct follow too.
#[derive(Debug, Clone, Default)]
struct DatasetArgs {
    /// (option name, value) for every flag given.
    given: Vec<(&'static str, String)>,
}

impl clap::FromArgMatches for DatasetArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut a = DatasetArgs::default();
        a.update_from_arg_matches(m)?;
        Ok(a)
    }

    fn update_from_arg_matches(
        &mut self,
        m: &clap::ArgMatches,
    ) -> std::result::Result<(), clap::Error> {
        for o in DATASET_OPTIONS {
            let v = if o.boolean {
                m.get_flag(o.name).then(|| "true".to_string())
            } else {
                m.get_one::<String>(o.name).cloned()
            };
            if let Some(v) = v {
                self.given.retain(|(k, _)| *k != o.name);
                self.given.push((o.name, v));
            }
        }
        Ok(())
    }
}

impl clap::Args for DatasetArgs {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for o in DATASET_OPTIONS {
            let arg = clap::Arg::new(o.name)
                .long(o.flag)
                .help_heading("Dataset options");
            cmd = cmd.arg(if o.boolean {
                arg.action(clap::ArgAction::SetTrue).help(o.help)
            } else {
                arg.value_name("VALUE")
                    .help(format!("{} [default: {}]", o.help, o.default))
            });
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl DatasetArgs {
    fn options(&self) -> Result<OpenOptions> {
        let mut opts = OpenOptions::default();
        for (k, v) in &self.given {
            opts.set(k, v)?;
        }
        Ok(opts)
    }

    fn open(&self, paths: &[PathBuf]) -> Result<crate::dataset::Dataset> {
        crate::dataset::Dataset::open_paths(paths, &self.options()?)
    }
}

/// The loader settings a command takes: the flags are made from [`LOADER_SETTINGS`] (those the
/// CLI door takes), the table Python's keyword arguments and the C options struct follow too.
#[derive(Debug, Clone, Default)]
struct LoaderArgs {
    /// (setting name, value) for every flag given.
    given: Vec<(&'static str, String)>,
}

/// Flags that were spelt otherwise before the table: (setting, old flag).
const LOADER_FLAG_ALIASES: &[(&str, &str)] = &[("batch_size", "batch"), ("queue_depth", "qd")];

impl clap::FromArgMatches for LoaderArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut a = LoaderArgs::default();
        a.update_from_arg_matches(m)?;
        Ok(a)
    }

    fn update_from_arg_matches(
        &mut self,
        m: &clap::ArgMatches,
    ) -> std::result::Result<(), clap::Error> {
        for o in LOADER_SETTINGS.iter().filter(|o| o.at(FrontDoor::Cli)) {
            if let Some(v) = m.get_one::<String>(o.name) {
                self.given.retain(|(k, _)| *k != o.name);
                self.given.push((o.name, v.clone()));
            }
        }
        if m.get_flag("no_verify") {
            self.given.retain(|(k, _)| *k != "verify");
            self.given.push(("verify", "false".into()));
        }
        Ok(())
    }
}

impl clap::Args for LoaderArgs {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for o in LOADER_SETTINGS.iter().filter(|o| o.at(FrontDoor::Cli)) {
            let mut arg = clap::Arg::new(o.name)
                .long(o.flag)
                .value_name("VALUE")
                .help_heading("Loader settings")
                .help(format!(
                    "{}{} [default: {}]",
                    o.help,
                    if o.unit.is_empty() || o.unit.contains(' ') {
                        String::new()
                    } else {
                        format!(" ({})", o.unit)
                    },
                    o.default
                ));
            for (_, old) in LOADER_FLAG_ALIASES.iter().filter(|(n, _)| *n == o.name) {
                arg = arg.visible_alias(*old);
            }
            cmd = cmd.arg(arg);
        }
        cmd.arg(
            clap::Arg::new("no_verify")
                .long("no-verify")
                .action(clap::ArgAction::SetTrue)
                .help_heading("Loader settings")
                .help("--verify false"),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl LoaderArgs {
    /// The settings the flags give, over the table's defaults and the environment's.
    fn settings(&self) -> Result<LoaderSettings> {
        let mut s = LoaderSettings::from_env()?;
        for (k, v) in &self.given {
            s.set(k, v).map_err(|e| {
                crate::error::invalid(format!("--{}: {}", k.replace('_', "-"), e.message()))
            })?;
        }
        Ok(s)
    }
}

/// Paths as one line of text.
fn show_paths(paths: &[PathBuf]) -> String {
    let v: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    v.join(" ")
}

/// Prints what indexing found wrong (on stderr, or as JSON lines on stdout).
fn report_problems(ds: &crate::dataset::Dataset, json: bool) {
    const SHOWN: usize = 20;
    for e in ds
        .problems()
        .iter()
        .take(if json { usize::MAX } else { SHOWN })
    {
        if json {
            outln!("{}", error_json(e));
        } else {
            eprintln!("gpufeed: warning: {}", e.report());
        }
    }
    let total = ds.problems_total();
    if !json && total > SHOWN as u64 {
        eprintln!(
            "gpufeed: warning: … {} more problems ({total} in all)",
            total - SHOWN as u64
        );
    }
}

fn error_json(e: &crate::error::Error) -> serde_json::Value {
    serde_json::json!({
        "error": e.report(),
        "path": e.path().map(|p| p.display().to_string()),
        "sample": e.sample(),
        "offset": e.offset(),
    })
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchCmd {
    #[command(subcommand)]
    which: Option<BenchWhich>,
    #[command(flatten)]
    quick: QuickArgs,
}

#[derive(Debug, Subcommand)]
enum BenchWhich {
    /// Raw reads from one file through one or more engines, as fio measures them.
    Io(IoArgs),
    /// One epoch per mode over an ImageNet-like dataset it generates: small files vs packed
    /// shards in global, block and shard-buffer order (cold cache when root).
    Load(LoadArgs),
    /// Storage → GPU: ours (io_uring → pinned → H2D), cuFile, a naive path, and the two
    /// ceilings (pinned H2D alone, storage → host alone); needs a CUDA GPU.
    Gpu(GpuArgs),
    /// Decoded image batches: gpufeed's CPU decode stage (training and evaluation transforms,
    /// and decode alone) against the same work as torchvision's CPU transforms do it (Pillow +
    /// numpy, as many worker processes as decode threads); with --device sim|cuda, the device
    /// pipeline against torchvision's decode_jpeg(device=) + transforms.v2 on the device;
    /// alternated round by round.
    #[cfg(feature = "decode")]
    Decode(DecodeArgs),
}

#[cfg(feature = "decode")]
#[derive(Debug, Args)]
struct DecodeArgs {
    /// An ImageFolder of JPEGs; an ImageNet-like set is generated there when it is absent or
    /// empty.
    #[arg(long, default_value = "gpufeed-decode")]
    dir: PathBuf,
    /// Images in the generated set.
    #[arg(long, default_value_t = 2000)]
    images: u64,
    /// Where the device rows decode: cpu (no device rows), sim (the simulated device: a build
    /// with `--features sim`; its figures are not a GPU's) or cuda (device 0).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Decode threads and Pillow worker processes (default: the decode stage's, this rank's share of the cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Output side in pixels.
    #[arg(long, default_value_t = 224)]
    size: u32,
    /// Output element type: uint8, float16, bfloat16, float32.
    #[arg(long, default_value = "float16")]
    dtype: String,
    /// Output layout: nchw or nhwc.
    #[arg(long, default_value = "nchw")]
    layout: String,
    /// Samples per batch.
    #[arg(long, default_value_t = 128)]
    batch: u32,
    /// Rounds: every row once per round, in turn.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Rows (comma-separated): gpufeed-train, pil-train, gpufeed-eval, pil-eval,
    /// gpufeed-decode, pil-decode.
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,
    /// A simulated trainer holding each batch this many milliseconds (gpufeed's transform
    /// rows): they then say whether decoding keeps up and what limits it.
    #[arg(long, default_value_t = 0.0)]
    step_ms: f64,
    /// Python with Pillow and numpy for the pil rows (scripts/bench-decode.sh makes a
    /// virtualenv and passes it).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Print one JSON object per row and round, then one with the ratios.
    #[arg(long)]
    json: bool,
    /// Also draw the rows as bars, median images/s of each row, gpufeed's with its ratio to Pillow's, into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct GpuArgs {
    /// File for the fixed-size reads (created if missing).
    #[arg(long, default_value = "gpufeed-bench.dat")]
    file: PathBuf,
    /// Size of the file to create.
    #[arg(long, default_value = "4G", value_parser = size_arg)]
    size: u64,
    /// Where the packed ImageNet-like dataset lives (generated if absent).
    #[arg(long, default_value = "gpufeed-load")]
    dir: PathBuf,
    /// Samples in the generated dataset.
    #[arg(long, default_value_t = 50_000)]
    samples: u64,
    /// Seconds per fixed-size row.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Size of the fixed reads.
    #[arg(long, default_value = "1M", value_parser = size_arg)]
    bs: u64,
    /// Reads in flight (ours and host).
    #[arg(long, default_value_t = 128)]
    qd: u32,
    /// cuFile reader threads.
    #[arg(long, default_value_t = 16)]
    cufile_threads: usize,
    /// Rows (comma-separated), run in the order given: host, h2d, ours, cufile, naive.
    #[arg(long, value_delimiter = ',')]
    paths: Vec<String>,
    /// Workloads (comma-separated): fixed, imagenet.
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Loader rows skip crc32c verification (cuFile and naive rows never verify).
    #[arg(long)]
    no_verify: bool,
    /// Print one JSON object per row.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct LoadArgs {
    /// Where the dataset lives (generated if absent: DIR/small and DIR/packed).
    #[arg(long, default_value = "gpufeed-load")]
    dir: PathBuf,
    /// Samples in the generated dataset.
    #[arg(long, default_value_t = 50_000)]
    samples: u64,
    /// Modes to run (comma-separated): small-files, global, block, shard-buffer, io.
    #[arg(
        long,
        default_value = "small-files,global,block,shard-buffer,io",
        value_delimiter = ','
    )]
    modes: Vec<String>,
    /// Threads of the small-files baseline.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Shard size of the generated packed copy.
    #[arg(long, default_value = "256M", value_parser = size_arg)]
    shard_size: u64,
    /// Run the loader modes (global, block, shard-buffer) over this dataset instead of
    /// DIR/packed: any format gpufeed reads (tars, TFRecords, shards, a Megatron prefix, token
    /// files…); repeat it for several files of one dataset. Nothing is generated unless the
    /// small-files or io modes need it.
    #[arg(long)]
    dataset: Vec<PathBuf>,
    /// Consecutive epochs per loader mode, each next one asked for when the one before starts
    /// (the JSON gives each epoch's samples/s and the gaps between epochs).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    epochs: u32,
    /// A simulated trainer (loader modes): hold each batch this many milliseconds before
    /// asking for the next.
    #[arg(long, default_value_t = 0.0)]
    step_ms: f64,
    /// Consumers sharing the machine (loader modes): each reads its rank's share (world N)
    /// with its own loader, holding each batch --step-ms; the verdict covers them all.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus: u32,
    #[command(flatten)]
    loader: LoaderArgs,
    #[command(flatten)]
    open: DatasetArgs,
    /// Print one JSON object per mode.
    #[arg(long)]
    json: bool,
    /// Also draw the rows as bars, each mode with its ratio to small-files (the baseline), into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct QuickArgs {
    /// File to read (created with a pattern if missing or too small).
    #[arg(long, default_value = "gpufeed-bench.dat")]
    file: PathBuf,
    /// Size of the file to create.
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    size: u64,
    /// Seconds per run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Print one JSON object per run instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw the rows as bars, each with its ratio to its baseline, into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct IoArgs {
    /// File to read (created with a pattern if missing or smaller than --size).
    #[arg(long, default_value = "gpufeed-bench.dat")]
    file: PathBuf,
    /// Size of the file to create if it is missing.
    #[arg(long, default_value = "4G", value_parser = size_arg)]
    size: u64,
    /// Access pattern(s): seq, rand (comma-separated for several runs).
    #[arg(long, default_value = "rand", value_delimiter = ',')]
    pattern: Vec<Pattern>,
    /// Read size, or a size mix in fio's bssplit syntax (SIZE/PERCENT:...), or `imagenet`.
    #[arg(long, default_value = IMAGENET_MIX)]
    bs: String,
    /// Reads in flight.
    #[arg(long, default_value_t = 32)]
    qd: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Engine(s): uring, uring-buffered, pread-pool, std, or the peer tokio-uring (a build with
    /// the `tokio-uring` feature) — comma-separated for several runs.
    #[arg(long, default_value = "uring", value_delimiter = ',')]
    engine: Vec<String>,
    /// Threads of the pread pool (default: one per queue slot).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// Use an io_uring SQPOLL kernel thread (burns a core).
    #[arg(long)]
    sqpoll: bool,
    /// When to submit: each (a read as soon as its slot frees), batch (all reaped reads at
    /// once), auto (each for reads averaging under 64 KiB, batch above).
    #[arg(long, default_value = "auto")]
    submit: SubmitPolicy,
    /// Completions to wait for before resubmitting (default: 1 with each, 4 with batch).
    #[arg(long, default_value_t = 0)]
    reap: u32,
    /// Set up the ring with IORING_SETUP_DEFER_TASKRUN.
    #[arg(long)]
    defer_taskrun: bool,
    /// Do not register the arena with io_uring (plain Read instead of ReadFixed).
    #[arg(long)]
    no_register: bool,
    /// Do not back the arena with huge pages.
    #[arg(long)]
    no_huge_pages: bool,
    /// Do not drop the file's cached pages before each run.
    #[arg(long)]
    keep_cache: bool,
    /// Seed for random offsets and sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object per run instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw the rows as bars (the last --engine is each workload's baseline), into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

fn size_arg(s: &str) -> std::result::Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Entry point of the `gpufeed` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Output a script parses: no progress lines on stderr either.
    if std::env::args_os().any(|a| a == "--json") {
        crate::util::set_quiet();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpufeed: error: {}", e.report());
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench(b) => match b.which {
            Some(BenchWhich::Io(a)) => bench_io(a),
            Some(BenchWhich::Load(a)) => bench_load(a),
            Some(BenchWhich::Gpu(a)) => bench_gpu(a),
            #[cfg(feature = "decode")]
            Some(BenchWhich::Decode(a)) => bench_decode(a),
            None => bench_quick(b.quick),
        },
        Command::Pack(a) => pack_cmd(a),
        Command::Inspect(a) => inspect_cmd(a),
        Command::Verify(a) => verify_cmd(a),
    }
}

fn emit(r: &IoBenchResult, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(r).expect("results serialise"));
    } else {
        outln!("{}", table_row(r));
    }
}

fn bench_io(a: IoArgs) -> Result<()> {
    let sizes = SizeMix::parse(&a.bs)?;
    ensure_file(&a.file, a.size)?;
    if !a.json {
        outln!("{}", table_header());
    }
    // Every name checked before anything runs.
    let engines: Vec<Option<EngineKind>> = a
        .engine
        .iter()
        .map(|e| match e.as_str() {
            "tokio-uring" if cfg!(feature = "tokio-uring") => Ok(None),
            "tokio-uring" => Err(crate::error::invalid(
                "this gpufeed was built without the tokio-uring peer: \
                 cargo build --release --features tokio-uring",
            )),
            other => other.parse().map(Some),
        })
        .collect::<Result<_>>()?;
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
fn run_peer(spec: &IoBenchSpec) -> Result<IoBenchResult> {
    crate::bench::tokio_uring::run_tokio_uring_bench(spec)
}

#[cfg(not(feature = "tokio-uring"))]
fn run_peer(_: &IoBenchSpec) -> Result<IoBenchResult> {
    Err(crate::error::invalid(
        "this gpufeed was built without the tokio-uring peer",
    ))
}

/// The main job: every engine on three workloads, a few seconds each, with a verdict per case.
fn bench_quick(a: QuickArgs) -> Result<()> {
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
    match crate::gpu::gpu_available() {
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
fn short_bs(bs: &str) -> String {
    if bs == IMAGENET_MIX || bs.contains(':') {
        "ImageNet mix".into()
    } else {
        bs.to_string()
    }
}

fn gpu_spec_defaults() -> crate::bench::gpu::GpuBenchSpec {
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

fn emit_gpu(r: &crate::bench::gpu::GpuBenchResult, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(r).expect("serialises"));
    } else {
        outln!("{}", crate::bench::gpu::table_row(r));
    }
}

fn bench_gpu(a: GpuArgs) -> Result<()> {
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
    let info = crate::gpu::gpu_available()?;
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

fn bench_load(a: LoadArgs) -> Result<()> {
    use crate::bench::load::{
        drop_caches, ensure_dataset, run_packed, run_small_files, table_header, PackedSpec,
    };
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
        settings: settings.clone(),
        engine: EngineKind::Uring,
        epochs: a.epochs,
        gpus: a.gpus,
        step: std::time::Duration::try_from_secs_f64(a.step_ms / 1e3).map_err(|_| {
            crate::error::invalid(format!(
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
    let mut plotted: Vec<(String, f64)> = Vec::new();
    for mode in &a.modes {
        let cold = drop_caches();
        if !cold && !a.json && mode == &a.modes[0] {
            eprintln!(
                "gpufeed: not root: the page cache could not be dropped, figures are warm-cache"
            );
        }
        match mode.as_str() {
            "small-files" => {
                let r = run_small_files(&small, a.threads, settings.seed, cold)?;
                emit_load(&r, a.json);
                plotted.push((r.mode.clone(), r.samples_per_s));
            }
            "io" => {
                // The engine alone on the same size mix and queue depth, for reference.
                let shards = crate::dataset::shard::find_shards(&packed)?;
                let biggest = shards
                    .iter()
                    .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
                    .ok_or_else(|| crate::error::invalid("no shards"))?;
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
                let r = run_io_bench(&spec)?;
                if a.json {
                    outln!(
                        "{}",
                        serde_json::json!({"mode": "io", "gib_per_s": r.gib_per_s, "iops": r.iops, "cpu_s_per_gib": r.cpu_s_per_gib, "qd": r.qd, "cold_cache": cold})
                    );
                } else {
                    outln!("{:<13} {:>8} {:>10.0} {:>7.3} {:>10.3}   (bench io: random reads of the ImageNet mix, QD {})", "io", r.reads, r.iops, r.gib_per_s, r.cpu_s_per_gib, r.qd);
                }
            }
            m => {
                // The mode names the order; its parameters are the settings'.
                let mut s = settings.clone();
                s.set("order", m)?;
                let order = s.order();
                let ds = if a.dataset.is_empty() {
                    crate::dataset::Dataset::open(&packed)?
                } else {
                    crate::dataset::Dataset::open_paths(&a.dataset, &opts)?
                };
                let r = run_packed(ds, order, &spec, cold)?;
                emit_load(&r, a.json);
                plotted.push((r.mode.clone(), r.samples_per_s));
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
fn bench_decode(a: DecodeArgs) -> Result<()> {
    use crate::bench::decode::{ratios, run_decode_bench, table_row, DecodeBenchSpec, ROWS};
    use crate::decode::{Layout, PixelType};
    if !["cpu", "sim", "cuda"].contains(&a.device.as_str()) {
        return Err(crate::error::invalid(format!(
            "--device {}: cpu, sim (the simulated device; a build with --features sim) or cuda",
            a.device
        )));
    }
    let dtype = match a.dtype.as_str() {
        "uint8" | "u8" => PixelType::U8,
        "float16" | "f16" => PixelType::F16,
        "bfloat16" | "bf16" => PixelType::Bf16,
        "float32" | "f32" => PixelType::F32,
        d => {
            return Err(crate::error::invalid(format!(
                "--dtype {d}: uint8, float16, bfloat16 or float32"
            )))
        }
    };
    let layout = match a.layout.as_str() {
        "nchw" => Layout::Nchw,
        "nhwc" => Layout::Nhwc,
        l => return Err(crate::error::invalid(format!("--layout {l}: nchw or nhwc"))),
    };
    let mut a = a;
    if a.python.is_none() {
        a.python = std::env::var_os("GPUFEED_BENCH_PYTHON").map(PathBuf::from);
    }
    let threads = a
        .threads
        .unwrap_or_else(|| crate::decode::ImageSpec::train(a.size).thread_count());
    let rows = if a.rows.is_empty() {
        let mut r = crate::bench::decode::default_rows(&a.device);
        if a.python.is_none()
            && r.iter()
                .any(|r| r.starts_with("pil-") || r.starts_with("tv-"))
        {
            crate::io::notice(
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
        size: a.size,
        dtype,
        layout,
        batch: a.batch,
        rounds: a.rounds,
        rows,
        python: a.python.clone(),
        script: crate::bench::decode::default_script(),
        device: a.device.clone(),
        step: std::time::Duration::try_from_secs_f64(a.step_ms / 1e3).map_err(|_| {
            crate::error::invalid(format!("--step-ms {} is not a number ≥ 0", a.step_ms))
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

fn emit_load(r: &crate::bench::load::LoadBenchResult, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(r).expect("serialises"));
    } else {
        outln!("{}", crate::bench::load::table_row(r));
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

fn pack_cmd(a: PackArgs) -> Result<()> {
    use crate::dataset::pack::{pack, PackOptions};
    let ds = a.dataset.open(&a.src)?;
    report_problems(&ds, false);
    let mut opts = PackOptions {
        shard_bytes: a.shard_size,
        align: a.align,
        progress: !a.json,
        ..PackOptions::default()
    };
    if let Some(t) = a.threads {
        opts.threads = t;
    }
    let s = pack(&ds, &a.out, &opts)?;
    if a.json {
        outln!("{}", serde_json::to_string(&s).expect("serialises"));
    } else {
        outln!(
            "packed {} samples ({:.2} GiB) into {} shards in {}",
            s.samples,
            s.bytes as f64 / (1u64 << 30) as f64,
            s.shards.len(),
            a.out.display()
        );
    }
    Ok(())
}

fn inspect_cmd(a: InspectArgs) -> Result<()> {
    let ds = a.dataset.open(&a.paths)?;
    if !a.json {
        report_problems(&ds, false);
        for n in ds.notes() {
            eprintln!("gpufeed: note: {n}");
        }
    }
    // Labels of TFRecord Examples are in the records, read with them, not in the index.
    let labels_in_records = ds.example.as_ref().is_some_and(|e| e.label.is_some());
    let mut hist = std::collections::BTreeMap::new();
    for s in ds.samples() {
        let b = (s.len.max(1) as u64).next_power_of_two();
        *hist.entry(b).or_insert(0u64) += 1;
    }
    let mut labels: Vec<i64> = ds.samples().iter().map(|s| s.label).collect();
    labels.sort_unstable();
    labels.dedup();
    let images = if a.images || ds.has_image_info() {
        Some(crate::image::Summary::of(ds.image_info()?))
    } else {
        None
    };
    if a.json {
        let h: Vec<_> = hist
            .iter()
            .map(|(k, v)| serde_json::json!({"le_bytes": k, "samples": v}))
            .collect();
        outln!(
            "{}",
            serde_json::json!({
                "path": show_paths(&a.paths), "format": ds.format(), "samples": ds.len(),
                "options": ds.options().to_json(),
                "files": ds.files().len(), "bytes": ds.total_bytes(),
                "labels": (!labels_in_records).then_some(labels.len()),
                "checksums": ds.has_checksums(), "size_histogram": h,
                "problems": ds.problems_total(),
                "first_problems": ds.problems().iter().take(20).map(error_json).collect::<Vec<_>>(),
                "notes": ds.notes(), "recovered": ds.recovered_count(),
                "images": images,
            })
        );
        return problems_fail(&ds);
    }
    outln!(
        "{}: {}, {} samples in {} files, {:.3} GiB, {} labels, checksums: {}, problems: {}{}",
        show_paths(&a.paths),
        ds.format().name(),
        ds.len(),
        ds.files().len(),
        ds.total_bytes() as f64 / (1u64 << 30) as f64,
        if labels_in_records {
            "per-record".to_string()
        } else {
            labels.len().to_string()
        },
        ds.has_checksums(),
        ds.problems_total(),
        if ds.recovered_count() > 0 {
            format!(", recovered: {}", ds.recovered_count())
        } else {
            String::new()
        }
    );
    let max = hist.values().copied().max().unwrap_or(1);
    for (k, v) in &hist {
        outln!(
            "  ≤ {:>6}  {:>9}  {}",
            crate::util::size_label(*k),
            v,
            "#".repeat((v * 40 / max) as usize)
        );
    }
    if let Some(im) = images {
        outln!("{}", im.text());
    }
    problems_fail(&ds)
}

/// `inspect` fails, as `verify` does, when indexing found problems: its summary has been
/// printed, and the exit status tells a script the dataset is damaged.
fn problems_fail(ds: &crate::dataset::Dataset) -> Result<()> {
    match ds.problems_total() {
        0 => Ok(()),
        n => Err(crate::error::Error::new(
            crate::error::ErrorKind::InvalidInput,
            format!(
                "indexing found {n} problem(s); the samples they cover are not in the dataset \
                 (listed above; --strict refuses such a dataset)"
            ),
        )),
    }
}

fn verify_cmd(a: InspectArgs) -> Result<()> {
    // Any path `inspect` takes: packed shards are verified shard by shard (so that a shard
    // whose index is damaged is one error and the others are still checked), everything else
    // through its dataset.
    let opts = a.dataset.options()?;
    let shards = match &a.paths[..] {
        [one]
            if opts
                .format
                .is_none_or(|f| f == crate::dataset::Format::Packed) =>
        {
            match std::fs::metadata(one) {
                Ok(m) if m.is_dir() => crate::dataset::shard::find_shards(one).unwrap_or_default(),
                Ok(_)
                    if one
                        .extension()
                        .is_some_and(|x| x == crate::dataset::shard::EXTENSION) =>
                {
                    vec![one.clone()]
                }
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    };
    let what_path = show_paths(&a.paths);
    let mut bad: Vec<crate::error::Error> = Vec::new();
    let (checked, files, what) = if !shards.is_empty() {
        // Shards are verified shard by shard, so that a shard whose index is damaged is one
        // error and the others are still checked.
        let total: u64 = shards
            .iter()
            .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        let mut prog = crate::util::Progress::bytes(format!("verifying {what_path}"), total);
        let mut done = 0u64;
        let mut checked = 0u64;
        for p in &shards {
            match crate::dataset::shard::verify(p, |n| {
                done += n;
                prog.set(done);
            }) {
                Ok((n, errs)) => {
                    checked += n;
                    bad.extend(errs);
                }
                Err(e) => bad.push(e),
            }
        }
        prog.finish();
        (checked, shards.len(), "checked")
    } else {
        // Other formats: every sample is read and checked (checksums and frames where the
        // format has them), and what indexing found wrong counts too.
        let ds = crate::dataset::Dataset::open_paths(&a.paths, &opts)?;
        bad.extend(ds.problems().iter().cloned());
        let mut prog =
            crate::util::Progress::bytes(format!("verifying {what_path}"), ds.total_bytes());
        let mut buf = Vec::new();
        let mut done = 0u64;
        for i in 0..ds.len() {
            // Checksums and frames, then: is an image what its name claims (magic, header,
            // end marker; no decode)?
            match ds.read_sample(i, &mut buf, true) {
                Ok(c) => {
                    if let Err(e) = ds.check_image(i, &buf[c.payload]) {
                        bad.push(e);
                    }
                }
                Err(e) => bad.push(e),
            }
            done += ds.sample(i).len as u64;
            prog.set(done);
        }
        prog.finish();
        let what = if ds.has_checksums() {
            "checked"
        } else {
            "read (this format carries no checksums)"
        };
        (ds.len() as u64, ds.files().len(), what)
    };
    for e in &bad {
        if a.json {
            outln!("{}", error_json(e));
        } else {
            outln!("bad: {}", e.report());
        }
    }
    if a.json {
        // Always a summary, last, so a script gets one object whatever happened.
        outln!(
            "{}",
            serde_json::json!({
                "summary": true, "path": what_path, "samples": checked, "files": files,
                "bad": bad.len(), "ok": bad.is_empty(),
                "checksums": what == "checked",
            })
        );
    } else {
        outln!(
            "{checked} samples in {files} files {what}, {} bad",
            bad.len()
        );
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(crate::error::Error::new(
            crate::error::ErrorKind::InvalidInput,
            format!("{} bad sample(s) or file(s)", bad.len()),
        ))
    }
}
