//! Our packed shard format (`.gpf`): see docs/FORMAT.md. Writer and validating reader.

use super::Sources;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{data_file, Dataset, Format, Sample, Strings};
use crate::error::{invalid, shared_path, Error, ErrorKind, Result};
use crate::image::ImageInfo;

/// The first 8 bytes of every shard.
pub const MAGIC: &[u8; 8] = b"GPFSHARD";
/// The format version this build writes (`docs/FORMAT.md`). Version 1 shards still read.
pub const VERSION: u16 = 2;
/// The oldest version this build reads.
pub const VERSION_MIN: u16 = 1;
/// Header flag (version 2): each sample's blob span ends with an image record
/// ([`ImageInfo::RECORD_BYTES`]) after its key and metadata.
pub const FLAG_IMAGE_INFO: u32 = 1;
/// Size of the header at the start of a shard.
pub const HEADER_BYTES: usize = 64;
/// Size of one index entry.
pub const ENTRY_BYTES: usize = 32;
/// Where sample data starts in shards gpufeed writes (aligned for O_DIRECT).
pub const DATA_OFFSET: u64 = 4096;
/// File name extension of shards.
pub const EXTENSION: &str = "gpf";

/// The fixed header of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Alignment of each sample's offset (1 for none).
    pub sample_align: u32,
    /// Samples in the shard.
    pub sample_count: u64,
    /// Where the data region starts.
    pub data_offset: u64,
    /// Where the index starts.
    pub index_offset: u64,
    /// Bytes of the index (entries and the key/metadata blob).
    pub index_bytes: u64,
    /// crc32c of the index bytes.
    pub index_crc32c: u32,
    /// The format version.
    pub version: u16,
    /// Flags ([`FLAG_IMAGE_INFO`]; 0 in version 1).
    pub flags: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10..12].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
        b[12..16].copy_from_slice(&self.sample_align.to_le_bytes());
        b[16..24].copy_from_slice(&self.sample_count.to_le_bytes());
        b[24..32].copy_from_slice(&self.data_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.index_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.index_bytes.to_le_bytes());
        b[48..52].copy_from_slice(&self.index_crc32c.to_le_bytes());
        b[52..56].copy_from_slice(&self.flags.to_le_bytes());
        let crc = crate::util::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a header against the file's size.
    fn decode(b: &[u8; HEADER_BYTES], file_size: u64) -> std::result::Result<Header, String> {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if &b[0..8] != MAGIC {
            return Err(
                "not a gpufeed shard (bad magic; an unfinished write leaves a zero header)".into(),
            );
        }
        if !(VERSION_MIN..=VERSION).contains(&u16_at(8)) {
            return Err(format!(
                "unsupported shard version {} (this gpufeed reads {VERSION_MIN} to {VERSION})",
                u16_at(8)
            ));
        }
        if crate::util::crc32c(&b[..60]) != u32_at(60) {
            return Err("header checksum mismatch".into());
        }
        if u16_at(10) as usize != HEADER_BYTES {
            return Err(format!("header size {} is not {HEADER_BYTES}", u16_at(10)));
        }
        let h = Header {
            sample_align: u32_at(12),
            sample_count: u64_at(16),
            data_offset: u64_at(24),
            index_offset: u64_at(32),
            index_bytes: u64_at(40),
            index_crc32c: u32_at(48),
            version: u16_at(8),
            flags: u32_at(52),
        };
        let known = if h.version >= 2 { FLAG_IMAGE_INFO } else { 0 };
        if h.flags & !known != 0 {
            return Err(format!(
                "unknown flags {:#x} for version {}",
                h.flags, h.version
            ));
        }
        if h.sample_align == 0 || !h.sample_align.is_power_of_two() || h.sample_align > 1 << 20 {
            return Err(format!(
                "sample alignment {} is not a power of two ≤ 1 MiB",
                h.sample_align
            ));
        }
        if h.data_offset < HEADER_BYTES as u64 || h.index_offset < h.data_offset {
            return Err(format!(
                "data offset {} / index offset {} out of order",
                h.data_offset, h.index_offset
            ));
        }
        if h.index_offset.checked_add(h.index_bytes) != Some(file_size) {
            return Err(format!(
                "index ({} bytes at {}) does not end at the end of the file ({file_size} bytes): \
                 truncated or appended to",
                h.index_bytes, h.index_offset
            ));
        }
        if h.sample_count
            .checked_mul(ENTRY_BYTES as u64)
            .is_none_or(|b| b > h.index_bytes)
        {
            return Err(format!(
                "{} samples do not fit an index of {} bytes",
                h.sample_count, h.index_bytes
            ));
        }
        Ok(h)
    }
}

/// One parsed index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Byte offset of the sample in the shard.
    pub offset: u64,
    /// Bytes of the sample.
    pub len: u32,
    /// crc32c of the sample's bytes.
    pub crc32c: u32,
    /// Class label, −1 when none.
    pub label: i64,
    /// Where the sample's key and metadata start in the blob.
    pub blob_offset: u32,
    /// Bytes of the key.
    pub key_len: u16,
    /// Bytes of the metadata (after the key).
    pub meta_len: u16,
}

/// A shard's header and index, validated.
#[derive(Debug, Clone)]
pub struct ShardIndex {
    /// The validated header.
    pub header: Header,
    /// One entry per sample, in shard order.
    pub entries: Vec<Entry>,
    /// Keys and metadata (and image records, with [`FLAG_IMAGE_INFO`]), back to back.
    pub blob: Vec<u8>,
}

impl ShardIndex {
    /// Sample `i`'s key.
    pub fn key(&self, i: usize) -> &[u8] {
        let e = &self.entries[i];
        &self.blob[e.blob_offset as usize..e.blob_offset as usize + e.key_len as usize]
    }
    /// Sample `i`'s metadata.
    pub fn meta(&self, i: usize) -> &[u8] {
        let e = &self.entries[i];
        let s = e.blob_offset as usize + e.key_len as usize;
        &self.blob[s..s + e.meta_len as usize]
    }
    /// Sample `i`'s image record, if the shard has them (checked when the index was read).
    pub fn image_info(&self, i: usize) -> Option<ImageInfo> {
        if self.header.flags & FLAG_IMAGE_INFO == 0 {
            return None;
        }
        let e = &self.entries[i];
        let s = e.blob_offset as usize + e.key_len as usize + e.meta_len as usize;
        ImageInfo::decode(&self.blob[s..s + ImageInfo::RECORD_BYTES])
    }
}

fn corrupt(path: &Path, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, msg).with_path(path.to_path_buf())
}

/// Reads and validates a shard's header and index (not the sample bytes).
pub fn read_index(path: &Path) -> Result<ShardIndex> {
    read_index_from(path, &Sources::local())
}

/// [`read_index`] of a file read through `src`.
fn read_index_from(path: &Path, src: &Sources) -> Result<ShardIndex> {
    let f = src
        .open(path)
        .map_err(|e| Error::io("cannot open shard", e).with_path(path.to_path_buf()))?;
    let size = f
        .size()
        .map_err(|e| Error::io("cannot stat shard", e).with_path(path.to_path_buf()))?;
    if size < HEADER_BYTES as u64 {
        return Err(corrupt(
            path,
            format!("shard is {size} bytes, shorter than its header"),
        ));
    }
    let mut hb = [0u8; HEADER_BYTES];
    f.read_exact_at(&mut hb, 0)
        .map_err(|e| Error::io("cannot read shard header", e).with_path(path.to_path_buf()))?;
    let header = Header::decode(&hb, size).map_err(|m| corrupt(path, m))?;
    // index_bytes ≤ file size was checked by decode: this allocation is bounded by the file.
    let mut index = vec![0u8; header.index_bytes as usize];
    f.read_exact_at(&mut index, header.index_offset)
        .map_err(|e| Error::io("cannot read shard index", e).with_path(path.to_path_buf()))?;
    if crate::util::crc32c(&index) != header.index_crc32c {
        return Err(corrupt(path, "index checksum mismatch"));
    }
    let n = header.sample_count as usize;
    let blob = index.split_off(n * ENTRY_BYTES);
    let mut entries = Vec::with_capacity(n);
    for (i, e) in index.chunks_exact(ENTRY_BYTES).enumerate() {
        let u32_at = |o: usize| u32::from_le_bytes(e[o..o + 4].try_into().unwrap());
        let entry = Entry {
            offset: u64::from_le_bytes(e[0..8].try_into().unwrap()),
            len: u32_at(8),
            crc32c: u32_at(12),
            label: i64::from_le_bytes(e[16..24].try_into().unwrap()),
            blob_offset: u32_at(24),
            key_len: u16::from_le_bytes([e[28], e[29]]),
            meta_len: u16::from_le_bytes([e[30], e[31]]),
        };
        let bad = |m: String| corrupt(path, m).with_sample(i as u64);
        if entry.offset < header.data_offset
            || entry
                .offset
                .checked_add(entry.len as u64)
                .is_none_or(|end| end > header.index_offset)
        {
            return Err(bad(format!(
                "sample at offset {} with length {} lies outside the data region {}..{}",
                entry.offset, entry.len, header.data_offset, header.index_offset
            )));
        }
        if !entry.offset.is_multiple_of(header.sample_align as u64) {
            return Err(bad(format!(
                "sample offset {} is not aligned to {}",
                entry.offset, header.sample_align
            )));
        }
        let record = if header.flags & FLAG_IMAGE_INFO != 0 {
            ImageInfo::RECORD_BYTES as u64
        } else {
            0
        };
        let blob_end =
            entry.blob_offset as u64 + entry.key_len as u64 + entry.meta_len as u64 + record;
        if blob_end > blob.len() as u64 {
            return Err(bad(format!(
                "key/metadata end at {blob_end}, past the {}-byte blob",
                blob.len()
            )));
        }
        if record > 0 {
            let at = (blob_end - record) as usize;
            if ImageInfo::decode(&blob[at..blob_end as usize]).is_none() {
                return Err(bad(
                    "image record holds values no format version defines".into()
                ));
            }
        }
        entries.push(entry);
    }
    Ok(ShardIndex {
        header,
        entries,
        blob,
    })
}

/// The `.gpf` files of a directory, sorted by name.
pub fn find_shards(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| Error::io("cannot list directory", e).with_path(dir.to_path_buf()))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == EXTENSION) && p.is_file())
        .collect();
    v.sort();
    Ok(v)
}

/// Opens shards as one dataset.
pub fn open_shards(paths: &[PathBuf]) -> Result<Dataset> {
    open_shards_from(paths, &Sources::local())
}

/// [`open_shards`] of files read through `src`.
pub(crate) fn open_shards_from(paths: &[PathBuf], src: &Sources) -> Result<Dataset> {
    check_not_staged(paths)?;
    let mut files = Vec::with_capacity(paths.len());
    let mut samples = crate::plan::SamplesBuilder::default();
    let mut metas = Strings::default();
    // Image records when every shard has them (a mix of versions has none).
    let mut images = true;
    // One shard whose index cannot be read among many is a problem (its samples are lost, no
    // other), as a damaged tar or TFRecord file is; one shard alone is the error.
    let (mut problems, mut problems_total) = (Vec::new(), 0u64);
    for (p, idx) in paths.iter().zip(indexes_in_turn(paths, src)) {
        let idx = match idx.map_err(|e| src.changed_or(p, e)) {
            Ok(idx) => idx,
            Err(e) if paths.len() > 1 && !super::sources::changed_under_open(&e) => {
                problems_total += 1;
                if problems.len() < super::PROBLEMS_KEPT {
                    problems.push(e);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let fi = files.len();
        if idx.header.flags & FLAG_IMAGE_INFO == 0 {
            images = false;
        }
        let size = idx.header.index_offset + idx.header.index_bytes;
        files.push(data_file(p, size));
        samples.reserve(idx.entries.len());
        for (i, e) in idx.entries.iter().enumerate() {
            samples.push(Sample {
                file: fi as u32,
                len: e.len,
                offset: e.offset,
                label: e.label,
                crc32c: e.crc32c,
            });
            metas.push(idx.meta(i))?;
        }
    }
    if files.is_empty() {
        let first = problems
            .first()
            .map(|p: &Error| p.report())
            .unwrap_or_default();
        return Err(invalid(format!(
            "no shard of these {} could be read (first problem: {first})",
            paths.len()
        )));
    }
    metas.settle();
    // Keys and image records stay in the shards until asked for (`Dataset::key`,
    // `Dataset::image_info`): read again then, checked against what was opened.
    let ds = Dataset {
        metas,
        has_checksums: true,
        in_shards: Some(InShards { images }),
        problems,
        problems_total,
        ..Dataset::empty(Format::Packed, files, samples.finish())
    };
    Ok(ds)
}

/// Refuses shards beside an unfinished pack's staging folder: they may be part of a dataset
/// only.
pub(crate) fn check_not_staged(paths: &[PathBuf]) -> Result<()> {
    let mut dirs: Vec<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
    dirs.dedup();
    for d in dirs {
        if d.file_name().is_some_and(|n| n == STAGING) {
            return Err(crate::error::invalid(
                "this shard is in an unfinished pack's staging folder: rerun the pack",
            )
            .with_path(d.to_path_buf()));
        }
        check_no_staging(if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        })?;
    }
    Ok(())
}

/// Every shard's index, read by up to 16 threads at once: a remote dataset's shards are opened
/// with ranged GETs, one round trip or more each, which one thread would wait for in turn.
fn read_indexes(paths: &[PathBuf], src: &Sources) -> Vec<Result<ShardIndex>> {
    const THREADS_MAX: usize = 16;
    let threads = paths.len().min(THREADS_MAX);
    if threads <= 1 {
        return paths.iter().map(|p| read_index_from(p, src)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Result<ShardIndex>>> = (0..paths.len()).map(|_| None).collect();
    let done = std::sync::Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads {
            // A thread that cannot be started leaves its share to the others (or to the loop
            // below).
            let _ = std::thread::Builder::new().spawn_scoped(s, || loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(p) = paths.get(k) else { return };
                let r = read_index_from(p, src);
                crate::util::lock(&done)[k] = Some(r);
            });
        }
    });
    out.into_iter()
        .zip(paths)
        .map(|(r, p)| r.unwrap_or_else(|| read_index_from(p, src)))
        .collect()
}

/// Every shard's index in turn, read a few at a time (in parallel) and each dropped once taken
/// in: a shard of 10⁶ samples has ~80 MB of index.
fn indexes_in_turn<'a>(
    paths: &'a [PathBuf],
    src: &'a Sources,
) -> impl Iterator<Item = Result<ShardIndex>> + 'a {
    let at_once = std::thread::available_parallelism().map_or(4, |n| n.get().clamp(2, 16));
    paths
        .chunks(at_once)
        .flat_map(|chunk| read_indexes(chunk, src).into_iter())
}

/// What of a packed dataset's index stays in its shards until asked for: keys always, image
/// records when every shard has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InShards {
    /// Every shard carries image records.
    pub images: bool,
}

/// The keys and (with `images`) image records of `ds`'s shards, read again and checked against
/// the open (each shard's size, and every entry's offset, length and crc32c). With `images`, a
/// shard that changed is an error naming it; without, its samples' keys are left empty (they
/// read as `FILE#K@OFFSET`), a notice names it, and the other shards' keys are kept.
pub(crate) fn keys_and_images(
    ds: &Dataset,
    images: bool,
) -> Result<(Strings, Option<Vec<crate::image::ImageInfo>>)> {
    let paths: Vec<PathBuf> = ds.files.iter().map(|f| f.path.to_path_buf()).collect();
    let mut keys = Strings::default();
    let mut infos = images.then(|| Vec::with_capacity(ds.len()));
    let mut next = 0usize;
    for (fi, (p, idx)) in paths
        .iter()
        .zip(indexes_in_turn(&paths, &ds.sources))
        .enumerate()
    {
        // The open's samples of this shard (a file's samples are together, in order).
        let first = next;
        while next < ds.len() && ds.sample(next).file as usize == fi {
            next += 1;
        }
        let changed = |why: String| {
            crate::error::invalid(format!(
                "the shard changed since the dataset was opened ({why})"
            ))
            .with_path(p.clone())
        };
        let checked = idx.and_then(|idx| {
            if idx.header.index_offset + idx.header.index_bytes != ds.files[fi].size {
                return Err(changed("its size".into()));
            }
            if idx.entries.len() != next - first {
                return Err(changed(format!(
                    "{} samples, not {}",
                    idx.entries.len(),
                    next - first
                )));
            }
            for (k, e) in idx.entries.iter().enumerate() {
                let s = ds.sample(first + k);
                if (s.offset, s.len, s.crc32c) != (e.offset, e.len, e.crc32c) {
                    return Err(changed(format!("sample {} moved", first + k))
                        .with_sample((first + k) as u64));
                }
            }
            Ok(idx)
        });
        match checked {
            Ok(idx) => {
                for k in 0..idx.entries.len() {
                    keys.push(idx.key(k))?;
                    if let Some(v) = infos.as_mut() {
                        v.push(idx.image_info(k).unwrap_or_default());
                    }
                }
            }
            Err(e) if !images => {
                crate::util::notice(&format!(
                    "keys of {} sample(s) unknown (named FILE#K@OFFSET): {}",
                    next - first,
                    e.report()
                ));
                for _ in first..next {
                    keys.push(b"")?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    keys.settle();
    Ok((keys, infos))
}

/// Writes one shard: samples are appended, the index and header are written by [`finish`].
/// Dropping an unfinished writer removes its `.partial` file.
///
/// [`finish`]: ShardWriter::finish
#[derive(Debug)]
pub struct ShardWriter {
    out: Option<BufWriter<File>>,
    partial: PathBuf,
    path: PathBuf,
    pos: u64,
    align: u32,
    entries: Vec<Entry>,
    blob: Vec<u8>,
}

/// What a finished shard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSummary {
    /// Samples written.
    pub samples: u64,
    /// Bytes of the data region.
    pub data_bytes: u64,
    /// Bytes of the whole file.
    pub file_bytes: u64,
}

impl ShardWriter {
    /// Starts `path` (written as `path.partial` until finished). `align`: 1 to pack samples
    /// back to back, or a power of two to start each sample on a multiple of it.
    pub fn create(path: &Path, align: u32) -> Result<ShardWriter> {
        if align == 0 || !align.is_power_of_two() || align > 1 << 20 {
            return Err(crate::error::invalid(format!(
                "sample alignment {align} is not a power of two ≤ 1 MiB"
            )));
        }
        let partial = path.with_extension(format!("{EXTENSION}.partial"));
        let f = File::create(&partial)
            .map_err(|e| Error::io("cannot create shard", e).with_path(partial.clone()))?;
        let mut out = BufWriter::with_capacity(1 << 20, f);
        // A zero header until `finish`: an interrupted write never looks like a shard.
        out.write_all(&[0u8; DATA_OFFSET as usize])
            .map_err(|e| Error::io("cannot write shard", e).with_path(partial.clone()))?;
        Ok(ShardWriter {
            out: Some(out),
            partial,
            path: path.to_path_buf(),
            pos: DATA_OFFSET,
            align,
            entries: Vec::new(),
            blob: Vec::new(),
        })
    }

    /// Bytes written so far (data region included).
    pub fn bytes(&self) -> u64 {
        self.pos
    }

    /// Samples added so far.
    pub fn samples(&self) -> usize {
        self.entries.len()
    }

    /// Appends one sample.
    pub fn add(&mut self, key: &str, label: i64, meta: &[u8], bytes: &[u8]) -> Result<()> {
        let ctx = |e| Error::io("cannot write shard", e).with_path(self.partial.clone());
        let key_len = u16::try_from(key.len()).map_err(|_| {
            crate::error::invalid(format!("key {key:?} is longer than 65535 bytes"))
        })?;
        let meta_len = u16::try_from(meta.len())
            .map_err(|_| crate::error::invalid("metadata longer than 65535 bytes"))?;
        let len = u32::try_from(bytes.len())
            .map_err(|_| crate::error::invalid(format!("sample {key:?} is larger than 4 GiB")))?;
        let out = self.out.as_mut().expect("writer not finished");
        let pad = (self.align as u64 - self.pos % self.align as u64) % self.align as u64;
        if pad > 0 {
            out.write_all(&vec![0u8; pad as usize]).map_err(ctx)?;
            self.pos += pad;
        }
        out.write_all(bytes).map_err(ctx)?;
        let blob_offset = u32::try_from(self.blob.len())
            .map_err(|_| crate::error::invalid("shard keys exceed 4 GiB"))?;
        self.blob.extend_from_slice(key.as_bytes());
        self.blob.extend_from_slice(meta);
        // The image record: read from the header bytes (all zero for a non-image).
        self.blob
            .extend_from_slice(&crate::image::info(bytes).unwrap_or_default().encode());
        self.entries.push(Entry {
            offset: self.pos,
            len,
            crc32c: crate::util::crc32c(bytes),
            label,
            blob_offset,
            key_len,
            meta_len,
        });
        self.pos += len as u64;
        Ok(())
    }

    /// Writes the index and header, syncs, and renames the shard into place.
    pub fn finish(mut self) -> Result<ShardSummary> {
        let partial = self.partial.clone();
        let ctx = |e| Error::io("cannot finish shard", e).with_path(partial.clone());
        let mut out = self.out.take().expect("writer not finished");
        let index_offset = self.pos;
        let mut index = Vec::with_capacity(self.entries.len() * ENTRY_BYTES + self.blob.len());
        for e in &self.entries {
            index.extend_from_slice(&e.offset.to_le_bytes());
            index.extend_from_slice(&e.len.to_le_bytes());
            index.extend_from_slice(&e.crc32c.to_le_bytes());
            index.extend_from_slice(&e.label.to_le_bytes());
            index.extend_from_slice(&e.blob_offset.to_le_bytes());
            index.extend_from_slice(&e.key_len.to_le_bytes());
            index.extend_from_slice(&e.meta_len.to_le_bytes());
        }
        index.extend_from_slice(&self.blob);
        out.write_all(&index).map_err(ctx)?;
        let header = Header {
            sample_align: self.align,
            sample_count: self.entries.len() as u64,
            data_offset: DATA_OFFSET,
            index_offset,
            index_bytes: index.len() as u64,
            index_crc32c: crate::util::crc32c(&index),
            version: VERSION,
            flags: FLAG_IMAGE_INFO,
        };
        let mut f = out.into_inner().map_err(|e| ctx(e.into_error()))?;
        f.seek(SeekFrom::Start(0)).map_err(ctx)?;
        f.write_all(&header.encode()).map_err(ctx)?;
        f.sync_all().map_err(ctx)?;
        drop(f);
        std::fs::rename(&self.partial, &self.path).map_err(ctx)?;
        Ok(ShardSummary {
            samples: self.entries.len() as u64,
            data_bytes: index_offset - DATA_OFFSET,
            file_bytes: index_offset + index.len() as u64,
        })
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Checks every sample's bytes against its crc32c. Returns one error per bad sample (naming the
/// shard, sample, key and offset) and the number of samples checked.
pub fn verify(path: &Path, progress: impl FnMut(u64)) -> Result<(u64, Vec<Error>)> {
    verify_from(path, &Sources::local(), progress)
}

/// [`verify`] of a file read through `src`.
pub(crate) fn verify_from(
    path: &Path,
    src: &Sources,
    mut progress: impl FnMut(u64),
) -> Result<(u64, Vec<Error>)> {
    let idx = read_index_from(path, src)?;
    let f = src
        .open(path)
        .map_err(|e| Error::io("cannot open shard", e).with_path(path.to_path_buf()))?;
    let shared = shared_path(path);
    let mut bad = Vec::new();
    let mut buf = Vec::new();
    for (i, e) in idx.entries.iter().enumerate() {
        buf.resize(e.len as usize, 0); // len ≤ file size: checked by read_index
        let r = f.read_exact_at(&mut buf, e.offset);
        let err = match r {
            Err(err) => Some(Error::io("cannot read sample", err)),
            Ok(()) if crate::util::crc32c(&buf) != e.crc32c => Some(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "checksum mismatch (key {:?})",
                    String::from_utf8_lossy(idx.key(i))
                ),
            )),
            // An image checked as `verify` checks other formats' (third trial: a pack without
            // --check-images kept truncated JPEGs, and verify of its shards said 0 bad).
            Ok(()) => crate::image::sniff(&buf).and_then(|kind| {
                crate::image::check(&buf, kind).err().map(|m| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        format!("{m} (key {:?})", String::from_utf8_lossy(idx.key(i))),
                    )
                })
            }),
        };
        if let Some(err) = err {
            bad.push(
                err.with_path(shared.clone())
                    .with_sample(i as u64)
                    .with_range(e.offset, e.len as u64),
            );
        }
        progress(e.len as u64);
    }
    Ok((idx.entries.len() as u64, bad))
}

/// The folder inside the output directory where `pack` writes its shards until every one is
/// finished. While it exists, the directory's shards are not to be trusted as a whole.
pub const STAGING: &str = ".gpufeed-pack.partial";

/// An error if `dir` holds a pack's staging folder (a pack still running, killed, or
/// failed without cleaning up): its shards may be a part of the dataset.
pub fn check_no_staging(dir: &Path) -> Result<()> {
    let staging = dir.join(STAGING);
    if staging.exists() {
        return Err(invalid(format!(
            "an unfinished `gpufeed pack` left {}: the shards in this directory may be only \
             part of the dataset; rerun the pack (it starts over), or delete that folder to \
             read what is there",
            staging.display()
        ))
        .with_path(dir.to_path_buf()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_bytes(i: usize) -> Vec<u8> {
        (0..(i * 37 % 5000 + 1))
            .map(|j| (i * 7 + j) as u8)
            .collect()
    }

    fn write(dir: &Path, n: usize, align: u32) -> PathBuf {
        let p = dir.join("s.gpf");
        let mut w = ShardWriter::create(&p, align).unwrap();
        for i in 0..n {
            w.add(
                &format!("k{i}"),
                i as i64 % 10,
                &[i as u8, 1, 2],
                &sample_bytes(i),
            )
            .unwrap();
        }
        let s = w.finish().unwrap();
        assert_eq!(s.samples, n as u64);
        p
    }

    #[test]
    fn round_trip_packed_and_aligned() {
        for align in [1, 512, 4096] {
            let d = tempfile::tempdir().unwrap();
            let p = write(d.path(), 100, align);
            let idx = read_index(&p).unwrap();
            let data = std::fs::read(&p).unwrap();
            for (i, e) in idx.entries.iter().enumerate() {
                assert_eq!(e.offset % align as u64, 0);
                assert_eq!(
                    &data[e.offset as usize..][..e.len as usize],
                    &sample_bytes(i)[..]
                );
                assert_eq!(idx.key(i), format!("k{i}").as_bytes());
                assert_eq!(idx.meta(i), &[i as u8, 1, 2]);
                assert_eq!(e.label, i as i64 % 10);
            }
            let (n, bad) = verify(&p, |_| {}).unwrap();
            assert_eq!((n, bad.len()), (100, 0));
        }
    }

    /// Keys and image records stay in the shards until asked for (the open holds 16 bytes a
    /// sample and the metadata), then read and checked: a shard rewritten after the open with
    /// other samples leaves keys unknown (FILE#K@OFFSET) and image records refused, naming it.
    #[test]
    fn keys_are_read_when_asked_for_and_checked_against_the_open() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), 300, 1);
        let ds = open_shards(std::slice::from_ref(&p)).unwrap();
        let b = ds.index_bytes();
        assert_eq!((b.keys, b.images), (0, 0), "nothing read at the open");
        assert!(b.samples <= 300 * 16 + 64, "{b:?}");
        assert!(ds.has_image_info());
        assert_eq!(ds.key(7), "k7");
        assert_eq!(ds.meta(7), &[7, 1, 2]);
        assert!(ds.index_bytes().keys > 0);
        assert_eq!(ds.image_info().unwrap().len(), 300);
        // Rewritten with other sizes after a second open: the open's samples no longer match.
        let again = open_shards(std::slice::from_ref(&p)).unwrap();
        let mut w = ShardWriter::create(&p, 1).unwrap();
        for i in 0..300 {
            w.add(&format!("x{i}"), 0, &[], &sample_bytes(i + 1))
                .unwrap();
        }
        w.finish().unwrap();
        assert!(again.key(7).starts_with("s.gpf#7@"), "{}", again.key(7));
        assert_eq!(ds.key(7), "k7", "keys read before stay");
        let e = again.image_info().unwrap_err();
        assert!(
            e.to_string()
                .contains("changed since the dataset was opened"),
            "{e}"
        );
        assert_eq!(e.path(), Some(p.as_path()));
    }

    #[test]
    fn unfinished_writer_leaves_nothing_that_looks_valid() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.gpf");
        let mut w = ShardWriter::create(&p, 1).unwrap();
        w.add("a", 0, &[], b"hello").unwrap();
        drop(w);
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn every_corruption_is_a_clear_error() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), 50, 1);
        let good = std::fs::read(&p).unwrap();
        let idx = read_index(&p).unwrap();
        let check = |bytes: &[u8], want: &str| {
            std::fs::write(&p, bytes).unwrap();
            let e = read_index(&p).unwrap_err();
            assert!(e.to_string().contains(want), "want {want:?}, got {e}");
            assert_eq!(e.path(), Some(p.as_path()));
        };
        check(
            &good[..good.len() - 10],
            "does not end at the end of the file",
        );
        check(&good[..30], "shorter than its header");
        check(&[], "shorter than its header");
        let mut b = good.clone();
        b[0] = b'X';
        check(&b, "bad magic");
        let mut b = good.clone();
        b[20] ^= 1; // sample_count, header crc now wrong
        check(&b, "header checksum");
        let mut b = good.clone();
        let io = idx.header.index_offset as usize;
        b[io + 3] ^= 0x40; // first entry's offset
        check(&b, "index checksum");
        // An index that lies but is checksummed consistently: a length past the data region.
        let mut b = good.clone();
        b[io + 8..io + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crate::util::crc32c(&b[io..]);
        let mut h = idx.header;
        h.index_crc32c = crc;
        b[..HEADER_BYTES].copy_from_slice(&h.encode());
        std::fs::write(&p, &b).unwrap();
        let e = read_index(&p).unwrap_err();
        assert!(e.to_string().contains("outside the data region"), "{e}");
        assert_eq!(e.sample(), Some(0));
        // A flipped data byte: the index is fine, verify names the sample.
        let mut b = good.clone();
        let e3 = idx.entries[3];
        b[e3.offset as usize] ^= 0xFF;
        std::fs::write(&p, &b).unwrap();
        let (n, bad) = verify(&p, |_| {}).unwrap();
        assert_eq!(n, 50);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].sample(), Some(3));
        assert!(
            bad[0]
                .to_string()
                .contains("checksum mismatch (key \"k3\")"),
            "{}",
            bad[0]
        );
    }
}
