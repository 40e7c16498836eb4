//! Packing a dataset into our shards: deterministic (the same input gives the same shards,
//! whatever the thread count), parallel by shard, crash-safe.
//!
//! Crash-safe means a reader never takes part of a pack for the whole: shards are written into
//! a staging folder ([`STAGING`]) inside the output directory and moved into place only once
//! every one is finished, and the staging folder goes last. A pack that fails (a full disk, a
//! bad sample) removes it; one that is killed leaves it behind, and opening the directory (or
//! a shard in it) is then refused with an error that says so. Rerunning the pack starts over.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::shard::{ShardWriter, EXTENSION};
use super::{Dataset, PROBLEMS_KEPT};
use crate::error::{invalid, Error, Result};
use crate::progress::Task;

/// How to pack.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Target bytes of sample data per shard (a shard holds at least one sample).
    pub shard_bytes: u64,
    /// Per-sample alignment inside shards (1: packed back to back).
    pub align: u32,
    /// Threads writing shards.
    pub threads: usize,
    /// Show a progress line.
    pub progress: bool,
    /// Stop at the first sample that is left out (see [`pack`]) instead of going on.
    pub strict: bool,
    /// Also leave out samples that are not the image they claim to be (a truncated JPEG, an
    /// HTML page named `.jpg`), as `verify` checks them; off, such bytes are packed as they are.
    pub check_images: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            shard_bytes: 1 << 30,
            align: 1,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            progress: true,
            strict: false,
            check_images: false,
        }
    }
}

/// What was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackSummary {
    /// The shards written, in order.
    pub shards: Vec<PathBuf>,
    /// Samples written.
    pub samples: u64,
    /// Bytes written (all shards, headers and indexes included).
    pub bytes: u64,
    /// Samples left out (see [`pack`]).
    pub skipped: u64,
    /// Why the first [`PROBLEMS_KEPT`] skipped samples were left out, in sample order; each
    /// error names the file, the sample and what was wrong.
    #[serde(skip)]
    pub skipped_samples: Vec<Error>,
}

pub use super::shard::STAGING;

/// Packs every sample of `src` (in its order) into `out_dir/shard-NNNNN.gpf`, through the
/// staging folder ([`STAGING`]); shards named `shard-NNNNN.gpf` that an earlier, larger pack
/// left in `out_dir` are removed, so the directory holds this dataset and nothing else.
///
/// A sample that cannot be read (a file gone, unreadable or shrunk since indexing, a failed
/// checksum or frame) — and with [`PackOptions::check_images`] one that is not the image it
/// claims to be — is left out and reported in the summary's `skipped_samples`, as `verify`
/// reports it, and the pack goes on; with [`PackOptions::strict`] it fails instead. Shard
/// boundaries follow the index's sizes, so the shards stay the same whatever the thread count.
pub fn pack(src: &Dataset, out_dir: &Path, opts: &PackOptions) -> Result<PackSummary> {
    if opts.shard_bytes == 0 {
        return Err(invalid("shard size must be positive"));
    }
    let staging = out_dir.join(STAGING);
    let io_err = |what: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |e| Error::io(what, e).with_path(p)
    };
    // A killed pack's leftovers: started over.
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io_err(
            "cannot remove an earlier pack's staging folder",
            &staging,
        ))?;
    }
    std::fs::create_dir_all(&staging)
        .map_err(io_err("cannot create output directory", &staging))?;
    let r = pack_into(src, &staging, opts);
    let r = r.and_then(|summary| land(summary, &staging, out_dir));
    if r.is_err() {
        // Nothing of a failed pack stays that could read as (part of) a dataset.
        let _ = std::fs::remove_dir_all(&staging);
    }
    r
}

/// Moves the finished shards from `staging` into `out_dir`, removes stale shards of an earlier
/// pack, makes it durable, and only then removes the staging folder.
fn land(mut s: PackSummary, staging: &Path, out_dir: &Path) -> Result<PackSummary> {
    let mut landed = Vec::with_capacity(s.shards.len());
    for p in &s.shards {
        let name = p.file_name().expect("a shard has a file name");
        let to = out_dir.join(name);
        std::fs::rename(p, &to)
            .map_err(|e| Error::io("cannot move shard into place", e).with_path(to.clone()))?;
        landed.push(to);
    }
    let suffix = format!(".{EXTENSION}");
    let is_ours = |n: &str| {
        n.strip_prefix("shard-")
            .and_then(|r| r.strip_suffix(suffix.as_str()))
            .is_some_and(|k| k.len() >= 5 && k.bytes().all(|c| c.is_ascii_digit()))
    };
    let rd = std::fs::read_dir(out_dir)
        .map_err(|e| Error::io("cannot list directory", e).with_path(out_dir.to_path_buf()))?;
    for e in rd.flatten() {
        let p = e.path();
        let stale =
            p.file_name().and_then(|n| n.to_str()).is_some_and(is_ours) && !landed.contains(&p);
        if stale {
            std::fs::remove_file(&p)
                .map_err(|e| Error::io("cannot remove a stale shard", e).with_path(p.clone()))?;
        }
    }
    sync_dir(out_dir)?;
    std::fs::remove_dir(staging).map_err(|e| {
        Error::io("cannot remove the staging folder", e).with_path(staging.to_path_buf())
    })?;
    sync_dir(out_dir)?;
    s.shards = landed;
    Ok(s)
}

/// fsync on a directory: its entries (the renames) reach the disk.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io("cannot sync directory", e).with_path(dir.to_path_buf()))
}

fn pack_into(src: &Dataset, out_dir: &Path, opts: &PackOptions) -> Result<PackSummary> {
    // Shard boundaries depend only on sample sizes: deterministic output.
    let mut ranges = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, s) in src.samples().iter().enumerate() {
        bytes += s.len as u64;
        if bytes >= opts.shard_bytes || i + 1 == src.len() {
            ranges.push(start..i + 1);
            start = i + 1;
            bytes = 0;
        }
    }
    let paths: Vec<PathBuf> = (0..ranges.len())
        .map(|k| out_dir.join(format!("shard-{k:05}.{EXTENSION}")))
        .collect();
    let total = src.total_bytes();
    let done = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    // Samples left out (count, bytes) and the errors of the lowest-numbered ones (at most
    // 2 × PROBLEMS_KEPT held at a time).
    let skipped = std::sync::Mutex::new((0u64, 0u64, Vec::<(usize, Error)>::new()));
    let threads = opts.threads.clamp(1, ranges.len().max(1));
    let result: Result<()> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    let mut buf = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(range) = ranges.get(k) else {
                            return Ok(());
                        };
                        let mut w = ShardWriter::create(&paths[k], opts.align)?;
                        for i in range.clone() {
                            let s = src.sample(i);
                            // The payload (a TFRecord Example's image, say) and the label its
                            // data carries, or the index's.
                            let c = src.read_sample(i, &mut buf, true).and_then(|c| {
                                if opts.check_images {
                                    src.check_image(i, &buf[c.payload.clone()])?;
                                }
                                Ok(c)
                            });
                            done.fetch_add(s.len as u64, Ordering::Relaxed);
                            let c = match c {
                                Ok(c) => c,
                                Err(e) if opts.strict => return Err(e),
                                Err(e) => {
                                    let mut k = crate::util::lock(&skipped);
                                    k.0 += 1;
                                    k.1 += s.len as u64;
                                    k.2.push((i, e));
                                    if k.2.len() >= 2 * PROBLEMS_KEPT {
                                        k.2.sort_by_key(|(i, _)| *i);
                                        k.2.truncate(PROBLEMS_KEPT);
                                    }
                                    continue;
                                }
                            };
                            let label = src.label_of(i, &c);
                            w.add(&src.key(i), label, src.meta(i), &buf[c.payload])?;
                        }
                        w.finish()?;
                    }
                })
            })
            .collect();
        // `out_dir` is the staging folder inside the destination: the report names the latter.
        let mut prog = opts.progress.then(|| {
            Task::bytes(
                format!(
                    "packing into {}",
                    out_dir.parent().unwrap_or(out_dir).display()
                ),
                total,
            )
        });
        while workers.iter().any(|w| !w.is_finished()) {
            if let Some(p) = prog.as_mut() {
                p.set(done.load(Ordering::Relaxed));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if let Some(p) = prog {
            p.finish();
        }
        for w in workers {
            w.join().map_err(|_| {
                Error::new(crate::error::ErrorKind::Io, "a packing thread panicked")
            })??;
        }
        Ok(())
    });
    result?;
    let (skipped, skipped_bytes, mut bad) = skipped.into_inner().unwrap_or_else(|e| e.into_inner());
    bad.sort_by_key(|(i, _)| *i);
    bad.truncate(PROBLEMS_KEPT);
    Ok(PackSummary {
        shards: paths,
        samples: src.len() as u64 - skipped,
        bytes: total - skipped_bytes,
        skipped,
        skipped_samples: bad.into_iter().map(|(_, e)| e).collect(),
    })
}
