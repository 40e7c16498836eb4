//! Token corpora for language models.
//!
//! - **Flat token files** (nanoGPT's `train.bin`: little-endian `uint16` or `uint32` tokens back
//!   to back) are read as fixed windows of `seq_len + 1` tokens — the inputs and, shifted by
//!   one, the targets — starting every `stride` tokens (default `seq_len`, so consecutive
//!   windows share one token). Windows never cross files.
//! - **Megatron-LM indexed datasets** (`PREFIX.idx` + `PREFIX.bin`): the `.idx` holds the magic
//!   `MMIDIDX\0\0`, version 1, a dtype code, the sequence and document counts, then the tokens
//!   per sequence (`int32`), each sequence's byte offset in the `.bin` (`int64`), the document
//!   boundaries (`int64`) and, for multimodal datasets, a mode per sequence (`int8`). Each
//!   sequence is one sample; with `seq_len` set, the `.bin` is read as windows instead, as
//!   Megatron's GPT dataset concatenates documents.
//!
//! Every count in an `.idx` is checked against the file's size before anything is allocated,
//! and every sequence against the `.bin`'s size.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{strip_ext, with_suffix, Builder, Dataset, Format, Sample};
use crate::error::{invalid, Error, Result};

/// Width of the tokens in a flat token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 16-bit tokens (vocabularies up to 65,536).
    U16,
    /// 32-bit tokens.
    U32,
}

impl TokenType {
    /// The element type as numpy names it.
    pub fn dtype(self) -> &'static str {
        match self {
            TokenType::U16 => "uint16",
            TokenType::U32 => "uint32",
        }
    }

    /// `u16` or `u32`.
    pub fn name(self) -> &'static str {
        match self {
            TokenType::U16 => "u16",
            TokenType::U32 => "u32",
        }
    }

    /// Bytes per token.
    pub fn bytes(self) -> u64 {
        match self {
            TokenType::U16 => 2,
            TokenType::U32 => 4,
        }
    }
}

/// How a token dataset's samples hold their tokens: what turns a batch into a model's inputs
/// and targets ([`TokenLayout::read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLayout {
    /// The element type as numpy names it: `"uint16"`, `"uint32"`, or a Megatron index's
    /// (`"int32"`, `"uint8"`, …; `"float32"`/`"float64"` are not token ids).
    pub dtype: &'static str,
    /// Bytes per token.
    pub width: u8,
    /// Tokens per sample (`seq_len + 1`: the inputs and, shifted by one, the targets), or
    /// `None` for a Megatron dataset's variable-length sequences (opened without `seq_len`).
    pub window: Option<u32>,
}

impl TokenLayout {
    /// Whether the elements are integers (token ids).
    pub fn is_integer(&self) -> bool {
        !self.dtype.starts_with("float")
    }

    /// The tokens of one sample's bytes (little-endian elements of [`dtype`](Self::dtype)),
    /// widened to `i64` into `out`, which must hold exactly one per token.
    pub fn read(&self, sample: &[u8], out: &mut [i64]) -> Result<()> {
        let w = self.width as usize;
        if !self.is_integer() {
            return Err(invalid(format!(
                "the tokens are {}, not integers",
                self.dtype
            )));
        }
        if sample.len() != out.len() * w {
            return Err(invalid(format!(
                "a sample of {} bytes is not {} tokens of {w} bytes",
                sample.len(),
                out.len()
            )));
        }
        let signed = self.dtype.starts_with("int");
        for (o, b) in out.iter_mut().zip(sample.chunks_exact(w)) {
            *o = match (w, signed) {
                (1, false) => b[0] as i64,
                (1, true) => b[0] as i8 as i64,
                (2, false) => u16::from_le_bytes([b[0], b[1]]) as i64,
                (2, true) => i16::from_le_bytes([b[0], b[1]]) as i64,
                (4, false) => u32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
                (4, true) => i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
                _ => i64::from_le_bytes(b.try_into().expect("8 bytes")),
            };
        }
        Ok(())
    }
}

/// How token files become samples.
#[derive(Debug, Clone, Default)]
pub struct TokenOptions {
    /// Token width of a flat file (default `u16`, as nanoGPT writes). Megatron files name
    /// their own; a different one given here is an error.
    pub dtype: Option<TokenType>,
    /// Tokens per window (a sample is `seq_len + 1` tokens). Flat files: default 1024.
    /// Megatron: windows over the `.bin` when set, one sample per sequence otherwise.
    pub seq_len: Option<u32>,
    /// Tokens from one window's start to the next (default `seq_len`).
    pub stride: Option<u32>,
}

/// The first bytes of a Megatron `.idx`.
pub const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\0\0";
const MEGATRON_HEADER: u64 = 9 + 8 + 1 + 8 + 8;

/// A Megatron path (`PREFIX`, `PREFIX.idx` or `PREFIX.bin`) as its index and data files.
pub(crate) fn megatron_files(p: &Path) -> (PathBuf, PathBuf) {
    let prefix = match p.extension().and_then(|x| x.to_str()) {
        Some("idx") | Some("bin") => strip_ext(p),
        _ => p.to_path_buf(),
    };
    (with_suffix(&prefix, ".idx"), with_suffix(&prefix, ".bin"))
}

/// The layout of a Megatron dataset of one sample per sequence whose element type has code
/// `code` (what a node's kept index records of it).
pub(crate) fn megatron_layout(code: u8) -> Option<TokenLayout> {
    let (dtype, width) = megatron_dtype(code)?;
    Some(TokenLayout {
        dtype,
        width: width as u8,
        window: None,
    })
}

/// The code of a Megatron element type named `dtype` (as [`megatron_dtype`] names it).
pub(crate) fn megatron_code(dtype: &str) -> Option<u8> {
    (1..=8).find(|&c| megatron_dtype(c).is_some_and(|(d, _)| d == dtype))
}

/// Megatron dtype codes: (name, bytes per element).
fn megatron_dtype(code: u8) -> Option<(&'static str, u64)> {
    Some(match code {
        1 => ("uint8", 1),
        2 => ("int8", 1),
        3 => ("int16", 2),
        4 => ("int32", 4),
        5 => ("int64", 8),
        6 => ("float64", 8),
        7 => ("float32", 4),
        8 => ("uint16", 2),
        _ => return None,
    })
}

/// Window geometry: (tokens per sample, tokens between starts).
fn windows(opts: &TokenOptions, default_seq: u32) -> Result<(u64, u64)> {
    let seq = opts.seq_len.unwrap_or(default_seq);
    if seq == 0 {
        return Err(invalid("seq_len must be at least 1"));
    }
    let stride = opts.stride.unwrap_or(seq);
    if stride == 0 {
        return Err(invalid("stride must be at least 1"));
    }
    Ok((seq as u64 + 1, stride as u64))
}

/// Adds the windows of `tokens` tokens of `width` bytes starting at byte `base` of file `fi`.
fn add_windows(
    b: &mut Builder,
    fi: u32,
    base: u64,
    tokens: u64,
    width: u64,
    (window, stride): (u64, u64),
) -> Result<u64> {
    let len = u32::try_from(window * width)
        .map_err(|_| invalid("a window of over 4 GiB: lower seq_len"))?;
    if tokens < window {
        return Ok(0);
    }
    let n = (tokens - window) / stride + 1;
    // The loader numbers samples with u32.
    let first = b.len() as u64;
    if first + n > crate::plan::SAMPLES_MAX {
        return Err(invalid(format!(
            "{n} windows of {window} tokens every {stride}{}: more than the {} samples a \
             dataset holds (2^32 − 1); raise stride or seq_len",
            if first > 0 {
                format!(" after {first} samples")
            } else {
                String::new()
            },
            crate::plan::SAMPLES_MAX
        )));
    }
    // Computed from their number: nothing is stored per window.
    b.runs.push(crate::plan::Run {
        first,
        count: n,
        file: fi,
        base,
        step: stride * width,
        len,
    });
    Ok(n)
}

/// Opens flat token files as fixed windows.
pub fn open_flat(paths: &[PathBuf], opts: &TokenOptions) -> Result<Dataset> {
    let width = opts.dtype.unwrap_or(TokenType::U16).bytes();
    let geom = windows(opts, 1024)?;
    let mut b = Builder::default();
    for p in paths {
        let size = std::fs::metadata(p)
            .map_err(|e| Error::io("cannot open token file", e).with_path(p.clone()))?
            .len();
        let r = (|| {
            if size == 0 {
                return Err(invalid("empty token file"));
            }
            if size % width != 0 {
                return Err(invalid(format!(
                    "{size} bytes is not a whole number of {width}-byte tokens: wrong --token-dtype?"
                )));
            }
            Ok(())
        })();
        let r = r.and_then(|()| {
            let fi = b.file(p, size)?;
            if add_windows(&mut b, fi, 0, size / width, width, geom)? == 0 {
                return Err(invalid(format!(
                    "{} tokens are fewer than one window of {}",
                    size / width,
                    geom.0
                )));
            }
            Ok(())
        });
        if let Err(e) = r {
            let e = e.with_path(p.clone());
            if paths.len() == 1 {
                return Err(e);
            }
            b.problem(e);
        }
    }
    let mut ds = b.finish(Format::Tokens, "these token files")?;
    ds.tokens = Some(TokenLayout {
        dtype: opts.dtype.unwrap_or(TokenType::U16).dtype(),
        width: width as u8,
        window: Some(geom.0 as u32),
    });
    Ok(ds)
}

/// Opens Megatron indexed datasets (each path a `PREFIX`, `PREFIX.idx` or `PREFIX.bin`).
pub fn open_megatron(paths: &[PathBuf], opts: &TokenOptions) -> Result<Dataset> {
    let mut b = Builder::default();
    if opts.seq_len.is_some() {
        windows(opts, 0)?; // options that fit no file are refused before any is read
    }
    let window = match opts.seq_len {
        Some(_) => Some(windows(opts, 0)?.0 as u32),
        None => None,
    };
    // The element type of every prefix read; the layout only if they agree.
    let mut dtypes: Vec<(&'static str, u64)> = Vec::new();
    let mut kept = None;
    for p in paths {
        match megatron_one(megatron_files(p), opts, &mut b, &mut kept) {
            Ok(t) => {
                if !dtypes.contains(&t) {
                    dtypes.push(t);
                }
            }
            Err(e) => {
                if paths.len() == 1 {
                    return Err(e);
                }
                b.problem(e);
            }
        }
    }
    // Prefixes of different token types make no one corpus: its batches would mix widths.
    if dtypes.len() > 1 {
        let names: Vec<&str> = dtypes.iter().map(|d| d.0).collect();
        return Err(invalid(format!(
            "these Megatron prefixes hold tokens of different types ({}): open each type as a \
             dataset of its own",
            names.join(", ")
        )));
    }
    let mut ds = b.finish(Format::Megatron, "these Megatron datasets")?;
    if paths.len() == 1 {
        ds.node_index = kept;
    }
    if let [(dtype, width)] = dtypes[..] {
        ds.tokens = Some(TokenLayout {
            dtype,
            width: width as u8,
            window,
        });
    }
    Ok(ds)
}

fn read_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// Indexes one Megatron prefix into `b`; returns its element type and width. `kept`: the
/// node's record of the check of its windows, where one was read or written.
fn megatron_one(
    (idx, bin): (PathBuf, PathBuf),
    opts: &TokenOptions,
    b: &mut Builder,
    kept: &mut Option<PathBuf>,
) -> Result<(&'static str, u64)> {
    let bad = |msg: String| invalid(msg).with_path(idx.clone());
    let f = std::fs::File::open(&idx)
        .map_err(|e| Error::io("cannot open Megatron index", e).with_path(idx.clone()))?;
    let idx_size = f
        .metadata()
        .map_err(|e| Error::io("cannot stat", e).with_path(idx.clone()))?
        .len();
    let bin_size = std::fs::metadata(&bin)
        .map_err(|e| Error::io("cannot open Megatron data", e).with_path(bin.clone()))?
        .len();
    let mut r = std::io::BufReader::with_capacity((1 << 20).min(idx_size as usize), f);
    let mut head = [0u8; MEGATRON_HEADER as usize];
    if idx_size < MEGATRON_HEADER {
        return Err(bad(format!(
            "{idx_size} bytes is too short for a Megatron index header"
        )));
    }
    r.read_exact(&mut head)
        .map_err(|e| Error::io("cannot read", e).with_path(idx.clone()))?;
    if &head[..9] != MEGATRON_MAGIC {
        return Err(bad("not a Megatron index (magic MMIDIDX missing)".into()));
    }
    let version = read_u64(&head[9..17]);
    if version != 1 {
        return Err(bad(format!(
            "Megatron index version {version}; only 1 is known"
        )));
    }
    let (dtype, width) =
        megatron_dtype(head[17]).ok_or_else(|| bad(format!("unknown dtype code {}", head[17])))?;
    if let Some(t) = opts.dtype {
        if t.bytes() != width || !dtype.starts_with("uint") {
            return Err(bad(format!(
                "the index says its tokens are {dtype}, not the {t:?} asked for"
            )));
        }
    }
    let seqs = read_u64(&head[18..26]);
    let docs = read_u64(&head[26..34]);
    // Every array's size is checked against the file before anything is allocated.
    let arrays = seqs
        .checked_mul(4 + 8)
        .and_then(|x| docs.checked_mul(8).and_then(|d| x.checked_add(d)))
        .and_then(|x| x.checked_add(MEGATRON_HEADER));
    let rest = match arrays {
        Some(need) if need <= idx_size => idx_size - need,
        _ => {
            return Err(bad(format!(
                "claims {seqs} sequences and {docs} documents, more than its {idx_size} bytes hold"
            )))
        }
    };
    if rest != 0 && rest != seqs {
        return Err(bad(format!(
            "{rest} bytes after the arrays (expected none, or one mode byte per sequence)"
        )));
    }
    // The arrays are read a chunk at a time (sizes and pointers side by side, then the document
    // index), so opening 10^8 sequences holds a few MiB, not the 2 GB the arrays take.
    const CHUNK: u64 = 1 << 16;
    let file = r.into_inner();
    let read_at = |buf: &mut [u8], at: u64| -> Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&file, buf, at)
            .map_err(|e| Error::io("cannot read (did the index shrink?)", e).with_path(idx.clone()))
    };
    // Windows are computed, but only after every sequence is checked to tile the .bin — 12
    // bytes a sequence read (1.2 GB at 10^8). The check's result is kept for the node, for
    // these very files (device, inode, size, modification and change times of the .idx and
    // the .bin): a later open on the node reads the record, not the arrays.
    let node = (opts.seq_len.is_some() && seqs >= super::shared::SHARED_MIN_SAMPLES as u64)
        .then(|| super::snapshot::Inputs::of_check(Format::Megatron, &[&idx, &bin]))
        .flatten();
    let facts = |end: u64| -> Vec<u8> {
        [seqs, docs, end]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    };
    if let Some(end) = node.as_ref().and_then(|n| {
        let f = n.facts()?;
        let end = read_u64(f.get(16..24)?);
        (f == facts(end) && end <= bin_size).then_some(end)
    }) {
        *kept = node.as_ref().map(|n| n.file());
        let fi = b.file(&bin, bin_size)?;
        add_windows(b, fi, 0, end / width, width, windows(opts, 0)?)
            .map_err(|e| e.with_path(bin.clone()))?;
        return Ok((dtype, width));
    }
    let (sizes_at, pointers_at) = (MEGATRON_HEADER, MEGATRON_HEADER + seqs * 4);
    let docs_at = pointers_at + seqs * 8;
    // The document index must be what Megatron asserts it is: starting at 0, non-decreasing,
    // ending at the sequence count. An index that disagrees with itself is refused (Megatron
    // refuses it too) rather than opened with a warning.
    let mut prev = 0u64;
    // Sized by the arrays (checked against the file's size above), at most a chunk of them.
    let mut buf = vec![0u8; (CHUNK.min(seqs.max(docs)) * 12) as usize];
    for first in (0..docs).step_by(CHUNK as usize) {
        let n = CHUNK.min(docs - first);
        let chunk = &mut buf[..(n * 8) as usize];
        read_at(chunk, docs_at + first * 8)?;
        for (k, x) in chunk.chunks_exact(8).enumerate() {
            let (d, v) = (first + k as u64, read_u64(x));
            if v > seqs || v < prev || (d == 0 && v != 0) {
                return Err(bad(format!(
                    "document {d} starts at sequence {v}: the document index must rise from 0 \
                     to the {seqs} sequences (Megatron refuses this index too)"
                )));
            }
            prev = v;
        }
    }
    if docs > 0 && prev != seqs {
        return Err(bad(format!(
            "the document index ends at sequence {prev}, not at the {seqs} sequences the index \
             holds (Megatron refuses this index too)"
        )));
    }
    // Every sequence's (size in tokens, byte offset), in order, to `f`.
    let mut each_seq = |f: &mut dyn FnMut(u64, i64, i64) -> Result<()>| -> Result<()> {
        for first in (0..seqs).step_by(CHUNK as usize) {
            let n = CHUNK.min(seqs - first);
            let (sz, pt) = buf[..(n * 12) as usize].split_at_mut((n * 4) as usize);
            read_at(sz, sizes_at + first * 4)?;
            read_at(pt, pointers_at + first * 8)?;
            for k in 0..n as usize {
                let s = i32::from_le_bytes(sz[k * 4..k * 4 + 4].try_into().expect("4"));
                let p = i64::from_le_bytes(pt[k * 8..k * 8 + 8].try_into().expect("8"));
                f(first + k as u64, s as i64, p)?;
            }
        }
        Ok(())
    };
    let fi = b.file(&bin, bin_size)?;
    if opts.seq_len.is_some() {
        // Windows over the concatenated sequences, which must tile the .bin from 0.
        let mut end = 0u64;
        each_seq(&mut |i, s, p| {
            if s < 0 {
                return Err(bad(format!(
                    "sequence {i} has a negative size ({s} tokens): windows need every \
                     sequence's size; open without seq_len to skip it"
                )));
            }
            if p != end as i64 {
                return Err(bad(format!(
                    "sequence {i} is not contiguous with the one before (offset {p}, expected \
                     {end}): windows need a contiguous .bin; open without seq_len"
                )));
            }
            end += s as u64 * width;
            Ok(())
        })?;
        if end > bin_size {
            return Err(invalid(format!(
                "the index covers {end} bytes but the .bin holds {bin_size}"
            ))
            .with_path(bin.clone()));
        }
        if let Some(n) = &node {
            *kept = n.keep_facts(&[&idx, &bin], &facts(end));
        }
        add_windows(b, fi, 0, end / width, width, windows(opts, 0)?)
            .map_err(|e| e.with_path(bin.clone()))?;
        return Ok((dtype, width));
    }
    if b.len() as u64 + seqs > crate::plan::SAMPLES_MAX {
        return Err(bad(format!(
            "{seqs} sequences{}: more than the {} samples a dataset holds (2^32 − 1); open it \
             with seq_len (token windows) or split it",
            if b.len() > 0 {
                format!(" after {} samples", b.len())
            } else {
                String::new()
            },
            crate::plan::SAMPLES_MAX
        )));
    }
    b.samples.reserve(seqs as usize);
    each_seq(&mut |i, s, p| {
        let fits = u64::try_from(s)
            .ok()
            .zip(u64::try_from(p).ok())
            .and_then(|(s, p)| {
                let len = s.checked_mul(width)?;
                // A token starts on a multiple of its width: another offset reads halves.
                (p.is_multiple_of(width) && p.checked_add(len)? <= bin_size)
                    .then_some((p, u32::try_from(len).ok()?))
            });
        match fits {
            Some((offset, len)) => b.samples.push(Sample {
                file: fi,
                len,
                offset,
                label: -1,
                crc32c: 0,
            }),
            None => b.problem(
                invalid(format!(
                    "sequence {i} ({s} tokens at byte {p}) lies outside the .bin ({bin_size} \
                     bytes), is over 4 GiB, or does not start on a token ({width}-byte \
                     tokens); skipped"
                ))
                .with_path(bin.clone())
                .with_sample(i),
            ),
        }
        Ok(())
    })?;
    Ok((dtype, width))
}
