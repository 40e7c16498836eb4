//! ① Where the samples are: the sample index (sample → file, offset, length, label, key).
//!
//! A [`Dataset`] is a list of files and, for every sample, where its bytes are. It is built
//! from a format's own index — our packed shards ([`shard`]), or a directory of small files in
//! class folders ([`image_folder`]) — and never reads sample bytes itself: the planner and the
//! engine do. Offsets and lengths that come from files are checked against file sizes before
//! anything is allocated.
//!
//! This module must never allocate by a length it read from a file before checking that length
//! against the file's size.

#![forbid(unsafe_code)]

pub mod image_folder;
pub mod pack;
pub mod shard;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{invalid, shared_path, Error, Result};

/// One sample: where its bytes are, its label, and the crc32c of its bytes if the format has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Index into [`Dataset::files`].
    pub file: u32,
    pub len: u32,
    pub offset: u64,
    /// Class label, −1 when none.
    pub label: i64,
    /// crc32c of the bytes (meaningful when [`Dataset::has_checksums`]).
    pub crc32c: u32,
}

/// A file of the dataset.
#[derive(Debug, Clone)]
pub struct DataFile {
    pub path: Arc<Path>,
    pub size: u64,
}

/// The layout a dataset was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// gpufeed packed shards (`.gpf`), see docs/FORMAT.md.
    Packed,
    /// A directory of class folders holding one file per sample.
    ImageFolder,
}

/// Variable-length byte strings stored back to back (keys, metadata).
#[derive(Debug, Clone, Default)]
pub struct Strings {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Strings {
    pub fn push(&mut self, s: &[u8]) -> Result<()> {
        self.bytes.extend_from_slice(s);
        let end = u32::try_from(self.bytes.len())
            .map_err(|_| invalid("keys and metadata exceed 4 GiB in one dataset"))?;
        self.ends.push(end);
        Ok(())
    }
    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }
    pub fn len(&self) -> usize {
        self.ends.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * 4
    }
}

/// The sample index of a dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub(crate) format: Format,
    pub(crate) files: Vec<DataFile>,
    pub(crate) samples: Vec<Sample>,
    pub(crate) keys: Strings,
    pub(crate) metas: Strings,
    pub(crate) has_checksums: bool,
    pub(crate) classes: Vec<String>,
}

impl Dataset {
    /// Opens a dataset: a `.gpf` shard, a directory of `.gpf` shards, or an ImageFolder
    /// directory (class folders of files).
    pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::io("cannot open dataset", e).with_path(path.to_path_buf()))?;
        if meta.is_file() {
            return shard::open_shards(&[path.to_path_buf()]);
        }
        let shards = shard::find_shards(path)?;
        if !shards.is_empty() {
            return shard::open_shards(&shards);
        }
        image_folder::open(path)
    }

    /// Opens the given shards as one dataset, in the order given.
    pub fn open_shards(paths: &[PathBuf]) -> Result<Dataset> {
        shard::open_shards(paths)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn files(&self) -> &[DataFile] {
        &self.files
    }

    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    pub fn sample(&self, i: usize) -> &Sample {
        &self.samples[i]
    }

    /// The sample's key (e.g. its path inside the dataset), lossily as UTF-8.
    pub fn key(&self, i: usize) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.keys.get(i))
    }

    /// The sample's metadata bytes (empty when the format has none).
    pub fn meta(&self, i: usize) -> &[u8] {
        if self.metas.is_empty() {
            &[]
        } else {
            self.metas.get(i)
        }
    }

    /// Whether samples carry a crc32c that readers verify.
    pub fn has_checksums(&self) -> bool {
        self.has_checksums
    }

    /// Class names by label, where the format names them.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Sum of all sample lengths.
    pub fn total_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.len as u64).sum()
    }

    /// Heap bytes of the index (samples, keys, metadata).
    pub fn index_heap_bytes(&self) -> usize {
        self.samples.capacity() * std::mem::size_of::<Sample>()
            + self.keys.heap_bytes()
            + self.metas.heap_bytes()
    }

    /// An error about sample `i`, naming its file, offset and key.
    pub fn sample_error(&self, i: usize, e: Error) -> Error {
        let s = &self.samples[i];
        e.with_path(self.files[s.file as usize].path.clone())
            .with_sample(i as u64)
            .with_range(s.offset, s.len as u64)
    }

    /// A dataset over in-memory lists, for tests and generators. Every sample must lie in its
    /// file.
    pub fn from_parts(
        files: Vec<DataFile>,
        samples: Vec<Sample>,
        keys: Vec<String>,
    ) -> Result<Dataset> {
        let mut k = Strings::default();
        for key in &keys {
            k.push(key.as_bytes())?;
        }
        if k.len() != samples.len() {
            return Err(invalid("one key per sample"));
        }
        for (i, s) in samples.iter().enumerate() {
            let f = files.get(s.file as usize).ok_or_else(|| {
                invalid(format!(
                    "sample {i} names file {} of {}",
                    s.file,
                    files.len()
                ))
            })?;
            if s.offset + s.len as u64 > f.size {
                return Err(invalid("sample lies past the end of its file")
                    .with_path(f.path.clone())
                    .with_sample(i as u64));
            }
        }
        Ok(Dataset {
            format: Format::Packed,
            files,
            samples,
            keys: k,
            metas: Strings::default(),
            has_checksums: false,
            classes: Vec::new(),
        })
    }
}

pub(crate) fn data_file(path: &Path, size: u64) -> DataFile {
    DataFile {
        path: shared_path(path),
        size,
    }
}
