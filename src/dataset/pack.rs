//! Packing a dataset into our shards: deterministic (the same input gives the same shards,
//! whatever the thread count), parallel by shard, crash-safe (see [`ShardWriter`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::shard::{ShardWriter, EXTENSION};
use super::Dataset;
use crate::error::{invalid, Error, Result};
use crate::util::Progress;

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
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            shard_bytes: 1 << 30,
            align: 1,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            progress: true,
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
}

/// Packs every sample of `src` (in its order) into `out_dir/shard-NNNNN.gpf`.
pub fn pack(src: &Dataset, out_dir: &Path, opts: &PackOptions) -> Result<PackSummary> {
    if opts.shard_bytes == 0 {
        return Err(invalid("shard size must be positive"));
    }
    std::fs::create_dir_all(out_dir).map_err(|e| {
        Error::io("cannot create output directory", e).with_path(out_dir.to_path_buf())
    })?;
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
                            let c = src.read_sample(i, &mut buf, true)?;
                            let label = src.label_of(i, &c);
                            w.add(&src.key(i), label, src.meta(i), &buf[c.payload])?;
                            done.fetch_add(s.len as u64, Ordering::Relaxed);
                        }
                        w.finish()?;
                    }
                })
            })
            .collect();
        let mut prog = opts
            .progress
            .then(|| Progress::bytes(format!("packing into {}", out_dir.display()), total));
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
            w.join()
                .map_err(|_| Error::new(crate::ErrorKind::Io, "a packing thread panicked"))??;
        }
        Ok(())
    });
    result?;
    Ok(PackSummary {
        shards: paths,
        samples: src.len() as u64,
        bytes: total,
    })
}
