//! Telling a dataset's format from its path: the format named in the options, else file
//! extensions, else the first bytes of the file.

use std::path::{Path, PathBuf};

use super::{strip_ext, with_suffix, Format, OpenOptions};
use crate::error::{invalid, Error, Result};

/// Extensions that name each format's files.
fn extensions(f: Format) -> &'static [&'static str] {
    match f {
        Format::Packed => &[super::shard::EXTENSION],
        Format::WebDataset => &["tar"],
        Format::TfRecord => &["tfrecord", "tfrecords", "tfr"],
        Format::Tokens => &["bin"],
        Format::Megatron => &["idx"],
        Format::ImageFolder => &[],
    }
}

/// The objects of a remote listing that make the dataset, and its format: the format given, or
/// the one the first key with a known extension names; then every key with one of that format's
/// extensions (with none, when the format was given: every key but `.idx` sidecars). Formats
/// that are not a sequence of files (ImageFolder, Megatron's pairs) are refused.
#[cfg(feature = "remote")]
pub(crate) fn pick_remote(keys: &[&str], format: Option<Format>) -> Result<(Format, Vec<usize>)> {
    let ext_of = |k: &str| {
        Path::new(k)
            .extension()
            .and_then(|x| x.to_str())
            .map(str::to_ascii_lowercase)
    };
    let known = [Format::Packed, Format::WebDataset, Format::TfRecord];
    let format = match format {
        Some(f @ (Format::ImageFolder | Format::Megatron)) => {
            return Err(invalid(format!(
                "a {} dataset cannot be read from object storage: it is not a sequence of \
                 files (pack it first: gpufeed pack DIR OUT, then upload OUT)",
                f.name()
            )))
        }
        Some(f) => f,
        None => keys
            .iter()
            .find_map(|k| {
                let x = ext_of(k)?;
                known
                    .into_iter()
                    .find(|&f| extensions(f).contains(&x.as_str()))
            })
            .ok_or_else(|| {
                invalid(format!(
                    "no object with a known extension (.gpf, .tar, .tfrecord) among the {} \
                     listed{}; name the format (format=…)",
                    keys.len(),
                    keys.first()
                        .map(|k| format!(" (the first is {k})"))
                        .unwrap_or_default()
                ))
            })?,
    };
    let mut picked: Vec<usize> = (0..keys.len())
        .filter(|&i| ext_of(keys[i]).is_some_and(|x| extensions(format).contains(&x.as_str())))
        .collect();
    if picked.is_empty() {
        picked = (0..keys.len())
            .filter(|&i| ext_of(keys[i]).as_deref() != Some("idx"))
            .collect();
    }
    Ok((format, picked))
}

fn has_ext(p: &Path, f: Format) -> bool {
    p.extension()
        .and_then(|x| x.to_str())
        .is_some_and(|x| extensions(f).iter().any(|e| x.eq_ignore_ascii_case(e)))
}

/// The format and the files (or, for ImageFolder, the root) to open.
pub(crate) fn detect(path: &Path, opts: &OpenOptions) -> Result<(Format, Vec<PathBuf>)> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        // Megatron datasets are named by their prefix: PREFIX.idx + PREFIX.bin.
        Err(_) if with_suffix(path, ".idx").is_file() => {
            return Ok((Format::Megatron, vec![path.to_path_buf()]));
        }
        Err(e) => {
            return Err(Error::io("cannot open dataset", e).with_path(path.to_path_buf()));
        }
    };
    if meta.is_file() {
        let f = match opts.format {
            Some(Format::ImageFolder) => {
                return Err(
                    invalid("an ImageFolder dataset is a directory").with_path(path.to_path_buf())
                )
            }
            Some(f) => f,
            None => sniff(path)?,
        };
        return Ok((f, vec![path.to_path_buf()]));
    }
    // A pack that did not finish here: its shards (if any landed) are not the dataset.
    super::shard::check_no_staging(path)?;
    // A named format searches the whole tree; detection looks at the top level only (class
    // folders are ImageFolder's, which refuses trees holding other formats).
    let mut files = Vec::new();
    let recursive = opts.format.is_some_and(|f| f != Format::ImageFolder);
    list_files(path, recursive, &mut files)?;
    files.sort();
    let pick = |f: Format| -> Vec<PathBuf> {
        files
            .iter()
            .filter(|p| has_ext(p, f))
            .filter(|p| f != Format::Megatron || with_suffix(&strip_ext(p), ".bin").is_file())
            .cloned()
            .collect()
    };
    match opts.format {
        Some(Format::ImageFolder) => Ok((Format::ImageFolder, vec![path.to_path_buf()])),
        Some(f) => {
            let mut v = pick(f);
            if v.is_empty() && f == Format::TfRecord {
                // TensorFlow often names record files without an extension.
                v = files
                    .iter()
                    .filter(|p| p.extension().is_none_or(|x| x != "idx" && x != "tfindex"))
                    .cloned()
                    .collect();
            }
            if v.is_empty() {
                return Err(invalid(format!(
                    "no {} files (*.{}) in this directory",
                    f.name(),
                    extensions(f).join(", *.")
                ))
                .with_path(path.to_path_buf()));
            }
            Ok((f, v))
        }
        None => {
            for f in [
                Format::Packed,
                Format::WebDataset,
                Format::TfRecord,
                Format::Megatron,
            ] {
                let v = pick(f);
                if !v.is_empty() {
                    return Ok((f, v));
                }
            }
            Ok((Format::ImageFolder, vec![path.to_path_buf()]))
        }
    }
}

/// The regular files in `dir` (and below it with `recursive`; hidden folders are skipped).
fn list_files(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io("cannot list directory", e).with_path(dir.to_path_buf()))?;
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_file() {
            out.push(p);
        } else if recursive && p.is_dir() && !e.file_name().to_string_lossy().starts_with('.') {
            list_files(&p, true, out)?;
        }
    }
    Ok(())
}

/// A file's format from its extension, else from its first bytes.
fn sniff(path: &Path) -> Result<Format> {
    for f in [
        Format::Packed,
        Format::WebDataset,
        Format::TfRecord,
        Format::Megatron,
    ] {
        if has_ext(path, f) {
            return Ok(f);
        }
    }
    if has_ext(path, Format::Tokens) && with_suffix(&strip_ext(path), ".idx").is_file() {
        return Ok(Format::Megatron);
    }
    let mut head = [0u8; 512];
    let n = {
        use std::io::Read;
        let mut f = std::fs::File::open(path)
            .map_err(|e| Error::io("cannot open dataset", e).with_path(path.to_path_buf()))?;
        let mut n = 0;
        while n < head.len() {
            match f.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("cannot read", e).with_path(path.to_path_buf())),
            }
        }
        n
    };
    let head = &head[..n];
    if head.starts_with(super::shard::MAGIC) {
        return Ok(Format::Packed);
    }
    if head.starts_with(super::tokens::MEGATRON_MAGIC) {
        return Ok(Format::Megatron);
    }
    if head.len() == 512 && &head[257..262] == b"ustar" {
        return Ok(Format::WebDataset);
    }
    Err(invalid(
        "cannot tell this file's format: name it with --format (packed, webdataset, tfrecord, \
         tokens, megatron); flat token files always need --format tokens",
    )
    .with_path(path.to_path_buf()))
}
