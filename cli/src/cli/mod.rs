//! The `gpufeed` command line: argument parsing and output, one file per command (`pack`,
//! `inspect`, `verify`, `bench`) and the flags made from the shared tables (`args`). The work
//! itself lives in the library ([`crate::bench`], [`gpufeed::dataset::verify`]), so everything
//! here is presentation.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::bench::io::{table_header, table_row};
use crate::bench::{ensure_file, run_io_bench, IoBenchResult, IoBenchSpec, Pattern, SubmitPolicy};
use crate::util::{SizeMix, IMAGENET_MIX};
use gpufeed::config::parse_size;
use gpufeed::config::EngineKind;
use gpufeed::config::{FrontDoor, LoaderSettings, LOADER_SETTINGS};
use gpufeed::dataset::{OpenOptions, DATASET_OPTIONS};
use gpufeed::error::Result;

/// `println!` for the command's output, except that a closed pipe (`gpufeed inspect … | head`)
/// ends the command quietly with status 0, as Unix tools do, instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        write_out(format_args!($($arg)*))
    };
}

mod args;
mod bench;
mod cache;
mod inspect;
mod pack;
mod verify;

use args::{DatasetArgs, LoaderArgs};
use bench::{bench_cmd, BenchCmd};
use cache::{cache_cmd, CacheCmd};
use inspect::{inspect_cmd, InspectArgs};
use pack::{pack_cmd, PackArgs};
use verify::verify_cmd;

/// Whether anything was written to stdout (a failing `--json` command that wrote nothing prints
/// its error there as JSON; one that wrote its result already ends as it was).
static WROTE_OUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    WROTE_OUT.store(true, std::sync::atomic::Ordering::Relaxed);
    // Every line of output, text or JSON, without the secrets a URL given on the command line
    // may carry (a signed URL's signature, `user:password@`): errors were redacted, and the
    // URLs that inspect, verify, cache status and bench print were not.
    let line = args.to_string();
    let line = gpufeed::error::redact(&line);
    let mut out = std::io::stdout().lock();
    if let Err(e) = out
        .write_all(line.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
    {
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
    /// Write the index of every tar of a remote WebDataset beside it in its store
    /// (`NAME.tar.gpfidx`): every later open, on any node, reads one small object per tar
    /// instead of walking it.
    Index(cache::CacheArgs),
    /// The node cache of remote datasets (s3://, gs://, az://, http(s)://): fill it before
    /// training (warm), see what it holds (status), or empty it (drop).
    #[command(subcommand)]
    Cache(CacheCmd),
}

/// Paths as one line of text.
fn show_paths(paths: &[PathBuf]) -> String {
    let v: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    v.join(" ")
}

/// Prints what indexing found wrong (on stderr, or as JSON lines on stdout).
fn report_problems(ds: &gpufeed::dataset::Dataset, json: bool) {
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

fn error_json(e: &gpufeed::error::Error) -> serde_json::Value {
    serde_json::json!({
        "error": e.report(),
        "path": e.shown_path(),
        "sample": e.sample(),
        "offset": e.offset(),
    })
}

fn size_arg(s: &str) -> std::result::Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Entry point of the `gpufeed` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Output a script parses: no progress lines on stderr either.
    if std::env::args_os().any(|a| a == "--json") {
        gpufeed::set_progress(Some(std::sync::Arc::new(
            |_: &gpufeed::ProgressEvent<'_>| {},
        )));
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpufeed: error: {}", e.report());
            if std::env::args_os().any(|a| a == "--json")
                && !WROTE_OUT.load(std::sync::atomic::Ordering::Relaxed)
            {
                // A script reads JSON on stdout, failure or not.
                let mut v = error_json(&e);
                v["kind"] = serde_json::Value::String(format!("{:?}", e.kind()));
                outln!("{v}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bench(b) => bench_cmd(b),
        Command::Pack(a) => pack_cmd(a),
        Command::Inspect(a) => inspect_cmd(a),
        Command::Verify(a) => verify_cmd(a),
        Command::Cache(c) => cache_cmd(c),
        Command::Index(a) => cache::index_cmd(a),
    }
}
