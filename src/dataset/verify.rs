//! Verifying a dataset: every sample read and checked — its checksum and frame where the format
//! has them, and whether an image is what its name claims (magic, header, end marker; no
//! decode) — with what indexing found wrong counted too. `gpufeed verify` prints the report;
//! the library call is the same for any caller.

use std::path::{Path, PathBuf};

use super::{shard, Dataset, Format, OpenOptions, Sources, PROBLEMS_KEPT};
use crate::error::{Error, Result};

/// What [`verify`] found.
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Samples checked (or read, for formats without checksums).
    pub samples: u64,
    /// Files they are in.
    pub files: usize,
    /// Whether the format carries checksums (else samples were read and their frames and
    /// images checked).
    pub checksums: bool,
    /// The bad samples and files, each error naming the file, the sample and what was wrong:
    /// the first [`PROBLEMS_KEPT`].
    pub bad: Vec<Error>,
    /// How many were bad in all (including those not kept).
    pub bad_total: u64,
}

impl VerifyReport {
    fn push(&mut self, e: Error) {
        self.bad_total += 1;
        if self.bad.len() < PROBLEMS_KEPT {
            self.bad.push(e);
        }
    }

    /// Whether nothing was bad.
    pub fn ok(&self) -> bool {
        self.bad_total == 0
    }
}

/// The packed shards `paths` names when they are one shard directory or one shard (verified
/// shard by shard, so that a shard whose index is damaged is one error and the others are still
/// checked); empty for anything else.
fn shards_of(paths: &[PathBuf], opts: &OpenOptions) -> Vec<PathBuf> {
    let [one] = paths else { return Vec::new() };
    if opts.format.is_some_and(|f| f != Format::Packed) {
        return Vec::new();
    }
    match std::fs::metadata(one) {
        Ok(m) if m.is_dir() => shard::find_shards(one).unwrap_or_default(),
        Ok(_) if one.extension().is_some_and(|x| x == shard::EXTENSION) => vec![one.clone()],
        _ => Vec::new(),
    }
}

/// Reads and checks every sample of the dataset at `paths` (any path form `Dataset::open_paths`
/// takes). `progress(done, total)` is called with the bytes checked so far. An error is returned
/// only when the dataset cannot be opened at all; bad samples are in the report.
pub fn verify(
    paths: &[PathBuf],
    opts: &OpenOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let (shards, src) = match remote_shards(paths, opts)? {
        Some(remote) => remote,
        None => (shards_of(paths, opts), Sources::local()),
    };
    if !shards.is_empty() {
        let total: u64 = shards.iter().map(|p| file_len(p)).sum();
        let mut done = 0u64;
        for p in &shards {
            match shard::verify_from(p, &src, |n| {
                done += n;
                progress(done, total);
            }) {
                Ok((n, errs)) => {
                    report.samples += n;
                    errs.into_iter().for_each(|e| report.push(src.named(e)));
                }
                Err(e) => report.push(src.named(e)),
            }
        }
        report.files = shards.len();
        report.checksums = true;
        return Ok(report);
    }
    let ds = Dataset::open_paths(paths, opts)?;
    for e in ds.problems() {
        report.push(e.clone());
    }
    // Problems not kept by the index are counted still.
    report.bad_total += ds.problems_total() - ds.problems().len() as u64;
    let total = ds.total_bytes();
    let mut buf = Vec::new();
    let mut done = 0u64;
    for i in 0..ds.len() {
        match ds.read_sample(i, &mut buf, true) {
            Ok(c) => {
                if let Err(e) = ds.check_image(i, &buf[c.payload]) {
                    report.push(ds.sources.named(e));
                }
            }
            Err(e) => report.push(ds.sources.named(e)),
        }
        done += ds.sample(i).len as u64;
        progress(done, total);
    }
    report.samples = ds.len() as u64;
    report.files = ds.file_count();
    report.checksums = ds.has_checksums();
    Ok(report)
}

/// A remote dataset of packed shards, as its shards' node-cache copies and the sources that
/// read them (verified one by one, as local shards are: a damaged one is one error, its sample
/// numbers within it); `None` for anything else.
fn remote_shards(paths: &[PathBuf], opts: &OpenOptions) -> Result<Option<(Vec<PathBuf>, Sources)>> {
    let urls: Vec<&str> = paths
        .iter()
        .filter_map(|p| p.to_str().filter(|s| super::is_url(s)))
        .collect();
    if urls.is_empty() || urls.len() != paths.len() {
        return Ok(None);
    }
    #[cfg(feature = "remote")]
    {
        let (format, files, src) = super::remote::objects_of(&urls, opts)?;
        super::refuse_repeats(&files, &src)?;
        Ok((format == Format::Packed).then_some((files, src)))
    }
    #[cfg(not(feature = "remote"))]
    {
        let _ = opts;
        Ok(None)
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}
