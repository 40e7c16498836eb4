//! The `gpufeed` command line: argument parsing and output. The work itself lives in the
//! library ([`crate::bench`]), so everything here is presentation.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::bench::io::{table_header, table_row};
use crate::bench::{ensure_file, run_io_bench, IoBenchResult, IoBenchSpec, Pattern, SubmitPolicy};
use crate::config::EngineKind;
use crate::error::Result;
use crate::util::{parse_size, SizeMix, IMAGENET_MIX};

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
    /// Engine(s): uring, uring-buffered, pread-pool, std (comma-separated for several runs).
    #[arg(long, default_value = "uring", value_delimiter = ',')]
    engine: Vec<EngineKind>,
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
}

fn size_arg(s: &str) -> std::result::Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Entry point of the `gpufeed` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpufeed: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench(b) => match b.which {
            Some(BenchWhich::Io(a)) => bench_io(a),
            None => bench_quick(b.quick),
        },
    }
}

fn emit(r: &IoBenchResult, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).expect("results serialise"));
    } else {
        println!("{}", table_row(r));
    }
}

fn bench_io(a: IoArgs) -> Result<()> {
    let sizes = SizeMix::parse(&a.bs)?;
    ensure_file(&a.file, a.size)?;
    if !a.json {
        println!("{}", table_header());
    }
    for &pattern in &a.pattern {
        for &engine in &a.engine {
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
            emit(&run_io_bench(&spec)?, a.json);
        }
    }
    Ok(())
}

/// The main job: every engine on three workloads, a few seconds each, with a verdict per case.
fn bench_quick(a: QuickArgs) -> Result<()> {
    ensure_file(&a.file, a.size)?;
    let cases = [("4K", 32u32), ("128K", 32), (IMAGENET_MIX, 128)];
    if !a.json {
        println!(
            "gpufeed bench: random reads from {} ({} s per run; `gpufeed bench io --help` for more)",
            a.file.display(),
            a.seconds
        );
        println!("{}", table_header());
    }
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
        if !a.json {
            let ours = &results[0];
            let others: Vec<String> = results[1..]
                .iter()
                .map(|r| format!("{:.2}× {}", ours.gib_per_s / r.gib_per_s, r.engine))
                .collect();
            println!("  -> {} is {}", ours.engine, others.join(", "));
        }
    }
    Ok(())
}
