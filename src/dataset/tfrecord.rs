//! TFRecord files: records of `u64 length (LE) · u32 masked crc32c of the length · data ·
//! u32 masked crc32c of the data`, where `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`.
//!
//! A sample is one record; its [frame](super::Frame::TfRecord) is read with it, and the loader
//! checks both checksums and hands out only the data. The index comes from an index file
//! (`offset size` per line, as `tfrecord2idx` from DALI or the `tfrecord` package writes it) or,
//! without one, from walking the length fields (each checked against its checksum before it is
//! trusted). A length whose checksum fails is reported as a [problem](super::Dataset::problems)
//! and the walk resumes at the next offset that holds a valid length, so one damaged record
//! does not cost the rest of the file.

use super::Sources;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::with_suffix;
use super::{index_files, Builder, Dataset, Format, Frame, Sample, Window};
use crate::error::{invalid, Error, Result};

/// Bytes of framing around a record's data: 12 before, 4 after.
pub const HEAD: usize = 12;
/// Bytes of framing after a record's data (its data crc).
pub const TAIL: usize = 4;

/// TFRecord's masked crc32c.
pub fn masked_crc(data: &[u8]) -> u32 {
    crate::util::crc32c(data)
        .rotate_right(15)
        .wrapping_add(0xa282_ead8)
}

/// Indexes TFRecord files as one dataset, in the order given. `opts.tfrecord_index`: an index
/// file (one record file) or a directory of `NAME.idx` files; without it `NAME.idx` beside each
/// file is used when present. With `opts.tfrecord_payload` (the default), records are
/// `tf.train.Example`s and a sample is its payload feature with its label; the first record
/// that checks is parsed at open, so a dataset of other records is refused at once with the
/// features it has (rather than every sample failing).
pub fn open(paths: &[PathBuf], opts: &super::OpenOptions, src: &Sources) -> Result<Dataset> {
    let index = opts.tfrecord_index.as_deref();
    if let Some(i) = index.filter(|i| !i.is_dir() && paths.len() > 1) {
        return Err(invalid(
            "several record files need an index directory (NAME.idx for each file NAME)",
        )
        .with_path(i.to_path_buf()));
    }
    // One unreadable file among many is a problem, not the end of the dataset.
    let recover = opts.tfrecord_recover;
    let b = index_files(paths, src, |p, b| match index_of(p, opts) {
        Some(i) => from_index(p, &i, b, src),
        None => scan(p, b, recover, src),
    })?;
    let mut ds = b.finish(Format::TfRecord, "these TFRecord files")?;
    ds.frame = Frame::TfRecord;
    ds.has_checksums = true;
    ds.example = opts.example_spec();
    if ds.example.is_some() {
        check_first_example(&ds)?;
    }
    Ok(ds)
}

/// Records bigger than this are not parsed at open (the loader still checks each).
const FIRST_CHECK_MAX: u32 = 64 << 20;

/// Parses the first record (the first of the first 8 no larger than [`FIRST_CHECK_MAX`]): if
/// its checksums hold and it is not an Example with the payload feature, the options do not
/// fit the dataset, and saying so now beats an error per sample. A record that cannot be read
/// or fails its checksums proves nothing and is left to the loader.
pub(crate) fn check_first_example(ds: &Dataset) -> Result<()> {
    let Some(spec) = &ds.example else {
        return Ok(());
    };
    let Some(first) = (0..ds.len().min(8)).find(|&i| ds.sample(i).len <= FIRST_CHECK_MAX) else {
        return Ok(());
    };
    let mut buf = Vec::new(); // at most FIRST_CHECK_MAX, and inside the file
    if ds.read_raw(first, &mut buf, false).is_err() {
        return Ok(()); // the loader will report it, per sample
    }
    // Only a record whose checksums hold counts as evidence.
    let Ok(data) = unframe(&buf, true) else {
        return Ok(());
    };
    match super::example::find(&buf[data], spec) {
        Ok(_) => Ok(()),
        Err(m) => {
            let s = ds.sample(first);
            Err(invalid(format!(
                "the first record is not a usable tf.train.Example: {m}; set tfrecord_payload \
                 (--tfrecord-payload) to the bytes feature that holds the sample, or to none to \
                 read records raw"
            ))
            .with_path(ds.file(s.file).path)
            .with_sample(first as u64)
            .with_range(s.offset, s.len as u64))
        }
    }
}

/// The index of record file `p` in `dir`, by the names tools give it: `NAME.idx` (DALI's
/// `tfrecord2idx`), `NAME.tfindex` and `STEM.tfindex` (the `tfrecord` package's
/// `create_indices`), `STEM.idx`, where NAME is the file's name and STEM that name without its
/// extension. The first that exists.
/// The index file the open of record file `p` reads with `opts`: the one named (a file, or
/// `NAME.idx` in the directory named), else one beside it; `None`: the file is scanned.
pub(crate) fn index_of(p: &Path, opts: &super::OpenOptions) -> Option<PathBuf> {
    match opts.tfrecord_index.as_deref() {
        Some(i) if i.is_dir() => index_for(p, i),
        Some(i) => Some(i.to_path_buf()),
        None => p.parent().and_then(|dir| index_for(p, dir)),
    }
}

pub(crate) fn index_for(p: &Path, dir: &Path) -> Option<PathBuf> {
    let name = p.file_name()?;
    let stem = Path::new(name).file_stem().unwrap_or(name);
    let mut candidates = vec![
        dir.join(with_suffix(Path::new(name), ".idx")),
        dir.join(with_suffix(Path::new(name), ".tfindex")),
    ];
    if stem != name {
        candidates.push(dir.join(with_suffix(Path::new(stem), ".tfindex")));
        candidates.push(dir.join(with_suffix(Path::new(stem), ".idx")));
    }
    candidates.into_iter().find(|c| c.is_file() && c != p)
}

fn add(b: &mut Builder, fi: u32, offset: u64, len: u32) {
    b.samples.push(Sample {
        file: fi,
        len,
        offset,
        label: -1,
        crc32c: 0,
    });
}

/// Walks the records' length fields. After a length whose checksum fails, the rest of the file
/// is indexed only with `recover` (resynchronised, every sample found flagged as recovered).
fn scan(path: &Path, b: &mut Builder, recover: bool, src: &Sources) -> Result<()> {
    let mut w = Window::open(path, src)?;
    let size = w.size;
    let fi = b.file(path, size)?;
    if size == 0 {
        // A valid file with no records (TensorFlow reads it without error).
        b.notes
            .push(format!("{}: no records (an empty file)", path.display()));
        return Ok(());
    }
    let mut recovering = false;
    let file_path = w.path.clone();
    let problem = |b: &mut Builder, offset: u64, msg: String| b.problem_at(&file_path, offset, msg);
    let mut pos = 0u64;
    let mut record = 0u64;
    while pos < size {
        if size - pos < (HEAD + TAIL) as u64 {
            problem(
                b,
                pos,
                format!(
                    "{} bytes after record {record} are too few for a record: the file is \
                     truncated",
                    size - pos
                ),
            );
            break;
        }
        let h = w.get(pos, HEAD)?;
        let len = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        if masked_crc(&h[..8]) != crc {
            if !recover {
                problem(
                    b,
                    pos,
                    format!(
                        "record {record}: the length field's checksum does not match; the rest \
                         of the file ({} bytes) is not indexed (tfrecord_recover resynchronises \
                         and delivers what it finds, flagged as recovered)",
                        size - pos
                    ),
                );
                break;
            }
            problem(
                b,
                pos,
                format!(
                    "record {record}: the length field's checksum does not match; \
                     resynchronised at the next offset whose length checks: the samples after \
                     it are recovered, not proven"
                ),
            );
            recovering = true;
            match resync(&mut w, pos + 1)? {
                Some(p) => {
                    pos = p;
                    continue;
                }
                None => break,
            }
        }
        let total = len.checked_add((HEAD + TAIL) as u64);
        let Some(end) = total
            .and_then(|t| pos.checked_add(t))
            .filter(|&e| e <= size)
        else {
            problem(
                b,
                pos,
                format!(
                    "record {record}: length {len} runs past the end of the file ({size} bytes): \
                     the file is truncated"
                ),
            );
            break;
        };
        match u32::try_from(end - pos) {
            Ok(l) => {
                if recovering {
                    b.recovered.push(b.samples.len() as u32);
                }
                add(b, fi, pos, l)
            }
            Err(_) => problem(b, pos, format!("record {record} is over 4 GiB; skipped")),
        }
        record += 1;
        pos = end;
    }
    Ok(())
}

/// The next offset at or after `from` whose length field checks and fits in the file.
fn resync(w: &mut Window, from: u64) -> Result<Option<u64>> {
    const CHUNK: u64 = 64 << 10;
    let mut pos = from;
    while pos + (HEAD + TAIL) as u64 <= w.size {
        let n = (w.size - pos).min(CHUNK + HEAD as u64) as usize;
        let size = w.size;
        let chunk = w.get(pos, n)?;
        for k in 0..=(n - HEAD) {
            let h = &chunk[k..k + HEAD];
            let len = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
            let at = pos + k as u64;
            let fits = len
                .checked_add((HEAD + TAIL) as u64)
                .and_then(|t| at.checked_add(t))
                .is_some_and(|e| e <= size);
            if fits && masked_crc(&h[..8]) == u32::from_le_bytes(h[8..].try_into().expect("4")) {
                return Ok(Some(at));
            }
        }
        pos += (n - HEAD + 1) as u64;
    }
    Ok(None)
}

/// Reads an index: `offset size` per line, each record checked against the file's size.
fn from_index(path: &Path, index: &Path, b: &mut Builder, src: &Sources) -> Result<()> {
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io("cannot open", e).with_path(path.to_path_buf()))?
        .len();
    // The index's own size bounds this read: it is a real file, not a length from one.
    let text = src
        .open(index)
        .and_then(|f| {
            let mut text = vec![0u8; f.size()? as usize];
            f.read_exact_at(&mut text, 0)?;
            Ok(text)
        })
        .map_err(|e| Error::io("cannot read TFRecord index", e).with_path(index.to_path_buf()))?;
    let fi = b.file(path, size)?;
    if size == 0 {
        b.notes
            .push(format!("{}: no records (an empty file)", path.display()));
    }
    // Records follow each other: each line should start where the one before ended, and the
    // last end at the file's end. Checked here, reading nothing of the record file, so an
    // index that does not fit its file is a problem at open (`inspect` fails on it too).
    let mut expect_at = 0u64;
    let bad = |line: usize, msg: String| {
        invalid(format!("index line {line}: {msg}")).with_path(index.to_path_buf())
    };
    for (n, line) in text.split(|&c| c == b'\n').enumerate() {
        let line_no = n + 1;
        let fields: Vec<&[u8]> = line
            .split(|c| c.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .collect();
        if fields.is_empty() {
            continue;
        }
        let num = |f: &[u8]| {
            std::str::from_utf8(f)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
        };
        let (Some(offset), Some(len)) = (
            fields.first().and_then(|f| num(f)),
            fields.get(1).and_then(|f| num(f)),
        ) else {
            b.problem(bad(line_no, "expected `offset size`".into()));
            continue;
        };
        if len < (HEAD + TAIL) as u64 {
            b.problem(bad(
                line_no,
                format!("record size {len} is smaller than a record's framing"),
            ));
            continue;
        }
        if offset.checked_add(len).is_none_or(|e| e > size) {
            b.problem(bad(
                line_no,
                format!(
                    "record at {offset} of {len} bytes lies past the end of {} ({size} bytes)",
                    path.display()
                ),
            ));
            continue;
        }
        if offset != expect_at {
            b.problem(bad(
                line_no,
                format!(
                    "record at {offset} does not start where the one before ends ({expect_at}): \
                     the index does not fit {}",
                    path.display()
                ),
            ));
        }
        expect_at = offset + len;
        match u32::try_from(len) {
            Ok(l) => add(b, fi, offset, l),
            Err(_) => b.problem(bad(line_no, "record over 4 GiB".into())),
        }
    }
    if expect_at != size && size > 0 {
        b.problem(
            invalid(format!(
                "the index ends at byte {expect_at} of {} ({size} bytes): it does not fit the \
                 file",
                path.display()
            ))
            .with_path(index.to_path_buf()),
        );
    }
    Ok(())
}

/// Checks a whole record (as the index located it) and returns where its data lies.
pub(crate) fn unframe(raw: &[u8], verify: bool) -> Result<Range<usize>> {
    if raw.len() < HEAD + TAIL {
        return Err(invalid("record shorter than its framing"));
    }
    let len = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
    let data = HEAD..raw.len() - TAIL;
    let stored = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
    if verify && masked_crc(&raw[..8]) != stored(8) {
        return Err(invalid("record length checksum mismatch"));
    }
    if len != data.len() as u64 {
        return Err(invalid(format!(
            "record says its data is {len} bytes but the index gives it {}",
            data.len()
        )));
    }
    if verify && masked_crc(&raw[data.clone()]) != stored(data.end) {
        return Err(invalid("record data checksum mismatch"));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from an independent (pure-Python, table-driven) implementation of the mask.
    #[test]
    fn masked_crc_known_values() {
        assert_eq!(crate::util::crc32c(b"123456789"), 0xE306_9283); // the Castagnoli check value
        assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
        assert_eq!(masked_crc(b""), 0xA282_EAD8);
    }

    fn record(data: &[u8]) -> Vec<u8> {
        let mut r = (data.len() as u64).to_le_bytes().to_vec();
        r.extend_from_slice(&masked_crc(&r[..8]).to_le_bytes());
        r.extend_from_slice(data);
        r.extend_from_slice(&masked_crc(data).to_le_bytes());
        r
    }

    #[test]
    fn unframe_checks_both_checksums_and_the_length() {
        let r = record(b"hello");
        assert_eq!(unframe(&r, true).unwrap(), 12..17);
        let mut bad = r.clone();
        bad[13] ^= 1;
        assert!(unframe(&bad, true)
            .unwrap_err()
            .to_string()
            .contains("data checksum"));
        assert_eq!(unframe(&bad, false).unwrap(), 12..17); // not verifying: framing only
        let mut bad = r.clone();
        bad[9] ^= 1;
        assert!(unframe(&bad, true)
            .unwrap_err()
            .to_string()
            .contains("length checksum"));
        assert!(unframe(&r[..16], true)
            .unwrap_err()
            .to_string()
            .contains("index gives"));
        assert!(unframe(&r[..10], true).is_err());
    }
}
