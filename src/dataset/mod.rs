//! ① Where the samples are: the sample index (sample → file, offset, length, label, key).
//!
//! A [`Dataset`] is a list of files and, for every sample, where its bytes are. It is built
//! from a format's own index — our packed shards ([`shard`]), or a directory of small files in
//! class folders (`image_folder`) — and never reads sample bytes itself: the planner and the
//! engine do. Offsets and lengths that come from files are checked against file sizes before
//! anything is allocated.
//!
//! This module must never allocate by a length it read from a file before checking that length
//! against the file's size.

#![forbid(unsafe_code)]

pub(crate) mod detect;
pub(crate) mod example;
pub(crate) mod image_folder;
mod options;
pub(crate) mod pack;
#[cfg(feature = "remote")]
mod remote;
#[cfg(feature = "remote")]
pub use remote::{
    cache_status, cache_status_of, upload_indexes, warm_cache, CacheStatus, IndexReport, WarmReport,
};
pub mod shard;
pub(crate) mod shared;
mod snapshot;
mod sources;
pub(crate) mod tar;
pub(crate) mod tfrecord;
pub(crate) mod tokens;
mod verify;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{invalid, shared_path, Error, Result};
use crate::image;
use crate::util::Unpoison;
pub use options::{OptionDoc, DATASET_OPTIONS};
pub use pack::{pack, PackOptions};
pub(crate) use sources::Sources;
pub use tokens::{TokenLayout, TokenOptions, TokenType};
pub use verify::{verify, VerifyReport};

pub(crate) use crate::batch::SampleSpan;

/// `p` with `suffix` appended to its file name.
pub(crate) fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// `p` without its extension.
pub(crate) fn strip_ext(p: &Path) -> PathBuf {
    p.with_extension("")
}

// One sample of the index (defined with the planner, which reads nothing else of a dataset;
// public there, `plan::Sample`).
pub(crate) use crate::plan::Sample;

/// A file of the dataset.
#[derive(Debug, Clone)]
pub struct DataFile {
    /// The file's path.
    pub path: Arc<Path>,
    /// Its size in bytes when the dataset was opened.
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
    /// WebDataset `.tar` shards: members grouped into samples by key.
    #[serde(rename = "webdataset")]
    WebDataset,
    /// TFRecord files (length, masked crc32c, data, masked crc32c per record).
    #[serde(rename = "tfrecord")]
    TfRecord,
    /// A flat file of little-endian tokens (nanoGPT's `train.bin`) read as fixed windows.
    Tokens,
    /// Megatron-LM's indexed dataset (`PREFIX.idx` + `PREFIX.bin`).
    Megatron,
}

impl Format {
    /// The format's name, as the `format` option spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Packed => "packed",
            Format::ImageFolder => "image-folder",
            Format::WebDataset => "webdataset",
            Format::TfRecord => "tfrecord",
            Format::Tokens => "tokens",
            Format::Megatron => "megatron",
        }
    }
}

/// How a sample's bytes are wrapped in its file. A framed sample's `offset` and `len` cover the
/// frame; the loader checks the frame and hands out only the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// The sample is exactly its bytes.
    None,
    /// A TFRecord record: u64 length, masked crc32c of the length, data, masked crc32c of the
    /// data (12 bytes before the payload, 4 after).
    TfRecord,
}

/// How to open a dataset: the format (detected when `None`) and per-format options.
///
/// The same options, with the same names and defaults, are the CLI's `--NAME` flags, Python's
/// keyword arguments and the C options struct's fields: [`DATASET_OPTIONS`] lists them (with
/// their documentation), [`OpenOptions::set`] sets one by name from text, and
/// [`OpenOptions::values`] gives back every effective value.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The format; `None` detects it from the path.
    pub format: Option<Format>,
    /// WebDataset tars: which member is the payload and which the label.
    pub webdataset: tar::TarOptions,
    /// A TFRecord index (`offset size` lines, as `tfrecord2idx` writes): a file when one record
    /// file is opened, or a directory holding `NAME.idx` for each record file `NAME`. Without
    /// it, `NAME.idx` next to the record file is used if present, else the file is scanned.
    pub tfrecord_index: Option<PathBuf>,
    /// TFRecord: each record is a `tf.train.Example` and the sample is the first value of this
    /// `bytes_list` feature (default `image/encoded`, TensorFlow's ImageNet converter's name);
    /// `None`: the sample is the whole record, read raw.
    pub tfrecord_payload: Option<String>,
    /// TFRecord: the `int64_list` feature holding the label (default `image/class/label`);
    /// `None`: no labels.
    pub tfrecord_label: Option<String>,
    /// Subtracted from every label read from the data (WebDataset label members, TFRecord label
    /// features): TensorFlow's ImageNet converter writes 1..=1000, so 1 gives 0..=999.
    pub label_offset: i64,
    /// TFRecord without an index: after a length whose checksum fails, resynchronise and
    /// deliver what follows, flagged as recovered ([`Dataset::is_recovered`]). Off by default:
    /// the rest of that file is then not indexed.
    pub tfrecord_recover: bool,
    /// Token corpora: the token width, sequence length and stride.
    pub tokens: tokens::TokenOptions,
    /// Refuse a dataset in which indexing found any problem.
    pub strict: bool,
    /// Remote datasets: the node cache's directory (`None`: [`cache::node::default_dir`]).
    ///
    /// [`cache::node::default_dir`]: crate::cache
    pub cache_dir: Option<PathBuf>,
    /// Remote datasets: the node cache's limit in bytes, kept for the node (`None`: the limit
    /// last given to this cache, else 90% of its free disk space).
    pub cache_limit: Option<u64>,
    /// Remote datasets: the unit fetched with one GET and cached, in bytes (default 8 MiB).
    pub cache_extent: u64,
    /// Remote datasets: settings for their stores over the environment's (an S3 bucket's
    /// endpoint and keys).
    #[cfg(feature = "remote")]
    pub store: crate::remote::StoreOptions,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            format: None,
            webdataset: tar::TarOptions::default(),
            tfrecord_index: None,
            tfrecord_payload: Some("image/encoded".into()),
            tfrecord_label: Some("image/class/label".into()),
            label_offset: 0,
            tfrecord_recover: false,
            tokens: tokens::TokenOptions::default(),
            strict: false,
            cache_dir: None,
            cache_limit: None,
            cache_extent: 8 << 20,
            #[cfg(feature = "remote")]
            store: Default::default(),
        }
    }
}

impl OpenOptions {
    /// What TFRecord samples are: `None` for raw records.
    pub(crate) fn example_spec(&self) -> Option<example::ExampleSpec> {
        self.tfrecord_payload
            .as_ref()
            .map(|payload| example::ExampleSpec {
                payload: payload.clone(),
                label: self.tfrecord_label.clone(),
                label_offset: self.label_offset,
            })
    }
}

/// A sample's raw bytes once checked: where its payload lies in them, and the label its data
/// carries (a TFRecord Example's label feature), which takes the index's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Where the payload lies in the sample's raw bytes.
    pub payload: Range<usize>,
    /// The label the data carries, which takes the index's place.
    pub label: Option<i64>,
}

/// Variable-length byte strings stored back to back (keys, metadata): this process's own, or
/// a mapping of the node's shared copy (`GPUFEED_SHARED_INDEX`, in the README).
#[derive(Debug, Clone, Default)]
pub struct Strings {
    bytes: Vec<u8>,
    ends: Vec<u32>,
    shared: Option<SharedStrings>,
}

/// Strings read from a mapping: `count` ends (u32, native order) at `ends_at`, then the bytes.
#[derive(Clone)]
struct SharedStrings {
    map: crate::plan::SharedBytes,
    ends_at: usize,
    count: usize,
    bytes_len: usize,
}

impl std::fmt::Debug for SharedStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedStrings({} strings)", self.count)
    }
}

impl SharedStrings {
    fn ends(&self) -> &[u32] {
        bytemuck::cast_slice(&(*self.map).as_ref()[self.ends_at..self.ends_at + self.count * 4])
    }
    fn bytes(&self) -> &[u8] {
        let at = self.ends_at + self.count * 4;
        &(*self.map).as_ref()[at..at + self.bytes_len]
    }
}

impl Strings {
    /// Appends a string; fails once all strings together exceed 4 GiB.
    pub fn push(&mut self, s: &[u8]) -> Result<()> {
        debug_assert!(self.shared.is_none(), "a shared Strings is read-only");
        self.bytes.extend_from_slice(s);
        let end = u32::try_from(self.bytes.len())
            .map_err(|_| invalid("keys and metadata exceed 4 GiB in one dataset"))?;
        self.ends.push(end);
        Ok(())
    }
    fn parts(&self) -> (&[u32], &[u8]) {
        match &self.shared {
            Some(s) => (s.ends(), s.bytes()),
            None => (&self.ends, &self.bytes),
        }
    }
    /// String `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        let (ends, bytes) = self.parts();
        let start = if i == 0 { 0 } else { ends[i - 1] as usize };
        &bytes[start..ends[i] as usize]
    }
    /// How many strings there are.
    pub fn len(&self) -> usize {
        self.parts().0.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Heap bytes held (a shared mapping aside).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * 4
    }
    /// Bytes mapped from the node's shared copy.
    pub fn shared_bytes(&self) -> usize {
        self.shared
            .as_ref()
            .map_or(0, |s| s.count * 4 + s.bytes_len)
    }

    /// Frees what growing left spare; holds nothing when every string is empty (the strings
    /// then read as empty: [`Dataset::meta`]).
    pub fn settle(&mut self) {
        if self.shared.is_some() {
            return;
        }
        if self.bytes.is_empty() {
            *self = Strings::default();
        } else {
            self.bytes.shrink_to_fit();
            self.ends.shrink_to_fit();
        }
    }

    /// This process's ends and bytes (what the node's shared copy holds), unless shared.
    pub(crate) fn owned_parts(&self) -> Option<(&[u8], &[u8])> {
        self.shared
            .is_none()
            .then(|| (bytemuck::cast_slice(&self.ends[..]), &self.bytes[..]))
    }

    /// Reads the strings from `map[at]` instead of its own, if they are byte for byte the same
    /// (ends, then bytes). Returns whether it did.
    pub(crate) fn share(&mut self, map: crate::plan::SharedBytes, at: Range<usize>) -> bool {
        let Some((ends, bytes)) = self.owned_parts() else {
            return false;
        };
        let theirs = (*map).as_ref();
        let (n, e, b) = (self.ends.len(), ends.len(), bytes.len());
        let same = at.start.is_multiple_of(4)
            && (theirs.as_ptr() as usize).is_multiple_of(4)
            && at.len() == e + b
            && theirs.get(at.start..at.start + e) == Some(ends)
            && theirs.get(at.start + e..at.end) == Some(bytes);
        if same {
            *self = Strings {
                bytes: Vec::new(),
                ends: Vec::new(),
                shared: Some(SharedStrings {
                    map,
                    ends_at: at.start,
                    count: n,
                    bytes_len: b,
                }),
            };
        }
        same
    }

    /// `count` strings read from `map[at]` (their ends, u32 each, then their bytes), once
    /// checked: the ends in order and the last at the bytes' end. What is wrong is said.
    pub(crate) fn mapped(
        map: crate::plan::SharedBytes,
        at: Range<usize>,
        count: usize,
    ) -> std::result::Result<Strings, String> {
        if count == 0 {
            return if at.is_empty() {
                Ok(Strings::default())
            } else {
                Err("bytes without strings".into())
            };
        }
        let theirs = (*map).as_ref();
        let ends_len = count.checked_mul(4).ok_or("too many strings")?;
        let (Some(ends), Some(bytes_len)) = (
            theirs.get(at.start..at.start.saturating_add(ends_len)),
            at.len().checked_sub(ends_len),
        ) else {
            return Err("the strings lie outside the file".into());
        };
        if !at.start.is_multiple_of(4) || !(theirs.as_ptr() as usize).is_multiple_of(4) {
            return Err("the strings' ends are not aligned".into());
        }
        let ends: &[u32] = bytemuck::cast_slice(ends);
        if !ends.windows(2).all(|w| w[0] <= w[1]) || ends[count - 1] as usize != bytes_len {
            return Err("the strings' ends are out of order".into());
        }
        Ok(Strings {
            bytes: Vec::new(),
            ends: Vec::new(),
            shared: Some(SharedStrings {
                map,
                ends_at: at.start,
                count,
                bytes_len,
            }),
        })
    }
}

/// Heap bytes of each part of a dataset's index ([`Dataset::index_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IndexBytes {
    /// Where each sample is: 16 bytes a sample (0 for computed windows).
    pub samples: usize,
    /// Keys (paths, member names), when the format has them.
    pub keys: usize,
    /// Per-sample metadata.
    pub metadata: usize,
    /// Image headers (packed shards carry them).
    pub images: usize,
    /// The sample table mapped from the node's shared index file (one copy for every rank of
    /// the node, not in the heap figures above; `GPUFEED_SHARED_INDEX=0` keeps it private).
    pub samples_shared: usize,
    /// The keys mapped from the node's shared copy: an index read from the node's file
    /// ([`Dataset::node_index`]) maps its keys when they are first asked for (0 until then);
    /// ImageFolder paths and keys of an index built here, at the open. Packed shards read
    /// theirs from the shards when first asked for, and keep them.
    pub keys_shared: usize,
}

/// The sample index of a dataset.
#[derive(Clone)]
pub struct Dataset {
    pub(crate) format: Format,
    /// The dataset's files, in the order samples refer to them — except where each sample is
    /// its own file (`per_sample_root`): then empty, not a path per sample.
    pub(crate) files: Vec<DataFile>,
    /// ImageFolder: sample `i` is file `i`, at this root joined with key `i` (the key's raw
    /// bytes), its size the sample's length. Read through [`Dataset::file`] and its kin.
    pub(crate) per_sample_root: Option<Arc<Path>>,
    pub(crate) samples: crate::plan::Samples,
    /// One key per sample, or empty: keys are then `FILE#SAMPLE@OFFSET`.
    pub(crate) keys: Strings,
    pub(crate) metas: Strings,
    pub(crate) has_checksums: bool,
    pub(crate) frame: Frame,
    pub(crate) classes: Vec<String>,
    /// The class names' own bytes where one is not UTF-8 (an ImageFolder's folder names;
    /// `classes` then holds their lossy text), else empty.
    pub(crate) class_bytes: Vec<Vec<u8>>,
    pub(crate) problems: Vec<Error>,
    pub(crate) problems_total: u64,
    /// TFRecord records are `tf.train.Example`s: what to take from them.
    pub(crate) example: Option<example::ExampleSpec>,
    /// Samples found by resynchronisation after damage (sorted ids): recovered, not proven.
    pub(crate) recovered: Vec<u32>,
    /// What indexing noticed that is not damage (an empty file, …).
    pub(crate) notes: Vec<String>,
    /// The options it was opened with.
    pub(crate) options: OpenOptions,
    /// Each sample's image header: from version-2 shards when opened, else read on first
    /// use ([`Dataset::image_info`]).
    pub(crate) images: std::sync::OnceLock<Vec<image::ImageInfo>>,
    /// The URLs a remote dataset was opened from (its files are their node-cache copies).
    pub(crate) remote: Vec<String>,
    /// Packed shards: keys (and image records) not yet read, read on first use into
    /// `shard_keys` (and `images`).
    pub(crate) in_shards: Option<shard::InShards>,
    pub(crate) shard_keys: std::sync::OnceLock<Strings>,
    /// Token corpora: how a sample holds its tokens.
    pub(crate) tokens: Option<tokens::TokenLayout>,
    /// Keys in the node's index file, read (into `shard_keys`) when first asked for.
    pub(crate) lazy_keys: Option<snapshot::LazyKeys>,
    /// The node's index file this index is read from ([`Dataset::node_index`]).
    pub(crate) node_index: Option<PathBuf>,
    /// Which file each of `files` was when the dataset was opened (empty, or `None`, where
    /// not known): the loader reads a file only while the same one is at its path.
    pub(crate) identities: Vec<Option<crate::sys::FileIdentity>>,
    /// Where its files' bytes come from: local files, or a remote dataset's cached objects.
    pub(crate) sources: Sources,
}

/// A summary: a dataset's index can hold millions of samples.
impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("format", &self.format)
            .field("files", &self.file_count())
            .field(
                "first_file",
                &(self.file_count() > 0).then(|| self.file_path(0).into_owned()),
            )
            .field("samples", &self.samples.len())
            .field("problems", &self.problems_total)
            .field("recovered", &self.recovered.len())
            .field("notes", &self.notes.len())
            .finish_non_exhaustive()
    }
}

impl Dataset {
    /// Opens a dataset, detecting its format: a `.gpf` shard or a directory of them, a
    /// WebDataset `.tar` or a directory of them, a `.tfrecord` file or a directory of them, a
    /// Megatron `PREFIX` (or `PREFIX.idx`), or an ImageFolder directory (class folders of
    /// files). Flat token files need [`Dataset::open_with`] and `Format::Tokens`.
    pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
        Dataset::open_with(path, &OpenOptions::default())
    }

    /// Opens a dataset with explicit options (format, payload extension, token window…).
    pub fn open_with(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Dataset> {
        let path = path.as_ref();
        if let Some(urls) = remote_urls(std::slice::from_ref(&path.to_path_buf()))? {
            return open_remote(&urls, opts);
        }
        let (format, files) = detect::detect(path, opts)?;
        Dataset::open_files(format, &files, opts)
    }

    /// Opens one path ([`open_with`](Dataset::open_with)) or several files as one dataset
    /// ([`open_many`](Dataset::open_many)): what every front door (CLI, Python, C) calls.
    pub fn open_paths(paths: &[PathBuf], opts: &OpenOptions) -> Result<Dataset> {
        let mut ds = match paths {
            [one] => Dataset::open_with(one, opts),
            many => Dataset::open_many(many, opts),
        }?;
        // An option given for another format (label_ext on an ImageFolder) is said, not
        // silently ignored.
        let unused = opts.unused(ds.format, !ds.remote.is_empty());
        ds.notes.extend(unused);
        Ok(ds)
    }

    /// Opens several files (or Megatron prefixes) as one dataset, in the order given; the
    /// format is the options' or the first file's.
    pub fn open_many(paths: &[PathBuf], opts: &OpenOptions) -> Result<Dataset> {
        if let Some(urls) = remote_urls(paths)? {
            return open_remote(&urls, opts);
        }
        let first = paths
            .first()
            .ok_or_else(|| invalid("no dataset files given"))?;
        let format = match opts.format {
            Some(f) => f,
            None => detect::detect(first, opts)?.0,
        };
        Dataset::open_files(format, paths, opts)
    }

    /// Opens the given files as one dataset of `format`, in the order given (for Megatron,
    /// each path is a `PREFIX` or `PREFIX.idx`).
    pub fn open_files(format: Format, paths: &[PathBuf], opts: &OpenOptions) -> Result<Dataset> {
        // A large index is built once for the node and kept whole where it can be: read if
        // it is there; else the process that builds it holds a lock the others wait on, then
        // read what it kept.
        // Which file each path is now, before it is indexed (an ImageFolder's files are its
        // samples, found by the walk: not recorded).
        let before: std::collections::HashMap<&Path, crate::sys::FileIdentity> =
            if format == Format::ImageFolder {
                Default::default()
            } else {
                paths
                    .iter()
                    .filter_map(|p| Some((p.as_path(), crate::sys::statx_path(p).ok()?.identity)))
                    .collect()
            };
        let node = snapshot::Inputs::of(format, paths, opts);
        let mut building = None;
        let kept = node.as_ref().and_then(|n| {
            n.load(paths, opts).or_else(|| {
                building = n.lock();
                n.load(paths, opts)
            })
        });
        if let Some(mut ds) = kept {
            if format == Format::Packed {
                shard::check_not_staged(paths)?;
            }
            if format == Format::TfRecord {
                tfrecord::check_first_example(&ds)?;
            }
            ds.options = OpenOptions {
                format: Some(format),
                ..opts.clone()
            };
            ds.identify(&before);
            return Ok(ds);
        }
        let (mut ds, tree) = Self::open_files_tree(format, paths, opts, &Sources::local())?;
        if format != Format::ImageFolder {
            ds.identify(&before);
        }
        if !node.is_some_and(|n| n.store(&mut ds, paths, opts, tree.as_ref())) {
            ds.share_index();
        }
        drop(building);
        Ok(ds)
    }

    /// [`open_files`](Self::open_files), a WebDataset's tars walked by `walker` (a remote
    /// dataset's come from kept indexes where there are some).
    #[cfg_attr(
        not(feature = "remote"),
        allow(
            dead_code,
            reason = "used only with feature remote: a remote dataset's tars walk from kept indexes"
        )
    )]
    pub(crate) fn open_files_from(
        format: Format,
        paths: &[PathBuf],
        opts: &OpenOptions,
        src: &Sources,
    ) -> Result<Dataset> {
        Self::open_files_tree(format, paths, opts, src).map(|(ds, _)| ds)
    }

    /// [`open_files_walked`](Self::open_files_walked), and an ImageFolder's walk (what an
    /// index of it kept for the node is checked against).
    fn open_files_tree(
        format: Format,
        paths: &[PathBuf],
        opts: &OpenOptions,
        src: &Sources,
    ) -> Result<(Dataset, Option<image_folder::Tree>)> {
        refuse_repeats(paths, src)?;
        let mut tree = None;
        let mut ds = match format {
            Format::Packed => shard::open_shards_from(paths, src),
            Format::ImageFolder => match paths {
                [root] => image_folder::open_tree(root, opts.format == Some(Format::ImageFolder))
                    .map(|(ds, t)| {
                        tree = Some(t);
                        ds
                    }),
                _ => Err(invalid("an ImageFolder dataset is one directory")),
            },
            Format::WebDataset => tar::open_walked(
                paths,
                &tar::TarOptions {
                    label_offset: opts.label_offset,
                    ..opts.webdataset.clone()
                },
                src,
            ),
            Format::TfRecord => tfrecord::open(paths, opts, src),
            Format::Tokens => tokens::open_flat(paths, &opts.tokens),
            Format::Megatron => tokens::open_megatron(paths, &opts.tokens),
        }?;
        if opts.strict && ds.problems_total > 0 {
            let first: Vec<String> = ds.problems.iter().take(3).map(|e| e.report()).collect();
            return Err(invalid(format!(
                "strict: indexing found {} problem(s): {}{}",
                ds.problems_total,
                first.join("; "),
                if ds.problems_total > 3 { "; …" } else { "" }
            )));
        }
        ds.options = OpenOptions {
            format: Some(format),
            ..opts.clone()
        };
        ds.sources = src.clone();
        Ok((ds, tree))
    }

    /// Records which file each of the dataset's files is: as `before` says (taken before it
    /// was indexed), else as it is now (a Megatron prefix's `.bin`).
    fn identify(&mut self, before: &std::collections::HashMap<&Path, crate::sys::FileIdentity>) {
        self.identities = self
            .files
            .iter()
            .map(|f| {
                before
                    .get(&*f.path)
                    .copied()
                    .or_else(|| Some(crate::sys::statx_path(&f.path).ok()?.identity))
            })
            .collect();
    }

    /// A file of an ImageFolder read from the node's kept index could not be opened (`errno`):
    /// if it is not there, the index is stale (a folder's times did not show the change), so it
    /// is removed — the next open lists the folder anew.
    pub(crate) fn gone(&self, errno: Option<i32>) {
        if errno == Some(libc::ENOENT) && self.per_sample_root.is_some() {
            if let Some(kept) = &self.node_index {
                snapshot::forget(kept);
            }
        }
    }

    /// Which file dataset file `f` was when the dataset was opened, where known.
    pub(crate) fn identity(&self, f: u32) -> Option<crate::sys::FileIdentity> {
        self.identities.get(f as usize).copied().flatten()
    }

    /// Why dataset file `f`, found now as `now`, must not be read with this index, if so: the
    /// file indexed, not another put at its path since (moved or linked there) — an index's
    /// offsets and labels read from another file's bytes are wrong data that nothing else
    /// would catch. The same file written since (a later modification time) is read on where
    /// each sample is `checked` against its checksum (a damaged or cut sample fails alone, as
    /// it would have before the open); unchecked, it is refused too.
    ///
    /// An ImageFolder's file (a sample a file, no identity recorded: 1.28 M `statx`es) must
    /// still have the size it was opened with: a larger file put there would be read cut short,
    /// as another image's first bytes, without a word.
    pub(crate) fn changed_since_open(
        &self,
        f: u32,
        now: crate::sys::FileIdentity,
        now_size: u64,
        checked: bool,
    ) -> Option<&'static str> {
        if self.per_sample_root.is_some() && now_size != self.file_size(f) {
            // Written in place since the node's index of the folder was kept (that changes no
            // folder's times): the index goes, so the next open lists the folder anew.
            if let Some(kept) = &self.node_index {
                snapshot::forget(kept);
                return Some(
                    "its size is not the size this node's index of the folder has (the file \
                     was written since the index was kept): the index is removed, and the \
                     next open lists the folder anew",
                );
            }
            return Some("its size is not the size it was opened with");
        }
        let was = self.identity(f)?;
        if (was.dev, was.ino) != (now.dev, now.ino) {
            Some("another file is at this path")
        } else if was.mtime_ns != now.mtime_ns && !checked {
            Some("it was written since, and its samples carry no checksum to catch it")
        } else {
            None
        }
    }

    /// The node's index file this dataset's index was read from or kept in
    /// (`$GPUFEED_INDEX_DIR/dataset-HASH.gpfidx`: packed shards, WebDataset tars and
    /// TFRecord files of 65,536 samples or more, built by the first process to open them and
    /// read by every later one while the files stay as they were) — or, for a Megatron index
    /// opened as windows, the node's record of its check (`checked-HASH.gpfidx`: the sequences
    /// tile the `.bin`); `None` where this process indexed the dataset and kept its index to
    /// itself.
    pub fn node_index(&self) -> Option<&Path> {
        self.node_index.as_deref()
    }

    /// The URLs of a remote dataset (`s3://…`), whose files are read through the node cache;
    /// empty for a local one.
    pub fn remote_urls(&self) -> &[String] {
        &self.remote
    }

    #[cfg_attr(
        not(feature = "remote"),
        allow(
            dead_code,
            reason = "used only with feature remote: remote datasets set their source URLs"
        )
    )]
    pub(crate) fn set_source(&mut self, urls: Vec<String>) -> Result<()> {
        self.remote = urls;
        // A remote dataset's shards are cache files: their keys and image records are read
        // now, while the open has them at hand, not later from a cache that may have moved on.
        if let Some(s) = self.in_shards.take() {
            let (keys, images) = shard::keys_and_images(self, s.images)?;
            self.keys = keys;
            if let Some(v) = images {
                self.images = std::sync::OnceLock::from(v);
            }
        }
        Ok(())
    }

    /// Whether sample `i` was found by resynchronising after damage
    /// ([`OpenOptions::tfrecord_recover`]): its bytes check, but nothing proves it is a
    /// record rather than bytes inside another record's data.
    pub fn is_recovered(&self, i: usize) -> bool {
        self.recovered.binary_search(&(i as u32)).is_ok()
    }

    /// How many samples were recovered by resynchronisation.
    pub fn recovered_count(&self) -> usize {
        self.recovered.len()
    }

    /// Whether each sample's label is read with its record (TFRecord `tf.train.Example`s with a
    /// label feature), not kept in the index.
    pub fn labels_in_records(&self) -> bool {
        self.example.as_ref().is_some_and(|e| e.label.is_some())
    }

    /// The node cache a remote dataset reads through (`None` for local files).
    #[cfg(feature = "remote")]
    pub fn node_cache(&self) -> Option<std::sync::Arc<crate::cache::NodeCache>> {
        self.files()
            .find_map(|f| self.sources.object(&f.path).map(|o| o.cache().clone()))
    }

    /// What indexing noticed that is not damage: an empty file, recovered samples, …
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The options the dataset was opened with (its format filled in).
    pub fn options(&self) -> &OpenOptions {
        &self.options
    }

    /// Opens the given shards as one dataset, in the order given.
    pub fn open_shards(paths: &[PathBuf]) -> Result<Dataset> {
        Dataset::open_files(Format::Packed, paths, &OpenOptions::default())
    }

    /// The format the dataset was opened as.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The dataset's files, in the order samples refer to them (an ImageFolder's are made as
    /// they are asked for: a path per image is not kept).
    pub fn files(&self) -> impl ExactSizeIterator<Item = DataFile> + '_ {
        (0..self.file_count()).map(|f| self.file(f as u32))
    }

    /// How many files the dataset has.
    pub fn file_count(&self) -> usize {
        match self.per_sample_root {
            Some(_) => self.samples.len(),
            None => self.files.len(),
        }
    }

    /// File `f` (`f` < [`file_count`](Self::file_count)).
    pub fn file(&self, f: u32) -> DataFile {
        match self.per_sample_root {
            Some(_) => DataFile {
                path: self.file_path(f).into(),
                size: self.file_size(f),
            },
            None => self.files[f as usize].clone(),
        }
    }

    /// File `f`'s path.
    pub fn file_path(&self, f: u32) -> std::borrow::Cow<'_, Path> {
        use std::os::unix::ffi::OsStrExt;
        match &self.per_sample_root {
            Some(root) => root
                .join(std::ffi::OsStr::from_bytes(self.keys.get(f as usize)))
                .into(),
            None => (&*self.files[f as usize].path).into(),
        }
    }

    /// File `f`'s size when the dataset was opened.
    pub fn file_size(&self, f: u32) -> u64 {
        match self.per_sample_root {
            Some(_) => self.samples.get(f as usize).len as u64,
            None => self.files[f as usize].size,
        }
    }

    /// Every sample, in dataset order (a table, or windows computed from their number).
    pub fn samples(&self) -> &crate::plan::Samples {
        &self.samples
    }

    /// Sample `i`.
    pub fn sample(&self, i: usize) -> Sample {
        self.samples.get(i)
    }

    /// The sample's key (e.g. its path inside the dataset), lossily as UTF-8; for formats
    /// without keys (TFRecord, tokens) `FILE#K@OFFSET`, where K is the sample's number in its
    /// file (the record or window number as indexed) and OFFSET its byte offset there.
    pub fn key(&self, i: usize) -> std::borrow::Cow<'_, str> {
        let keys = self.keys();
        if keys.is_empty() || keys.get(i).is_empty() {
            let s = self.samples.get(i);
            let f = self.file_path(s.file);
            let name = f.file_name().unwrap_or_else(|| f.as_os_str());
            let k = i - self.samples.first_of_file(i);
            let mark = if self.is_recovered(i) {
                " recovered"
            } else {
                ""
            };
            return format!("{}#{k}@{}{mark}", name.to_string_lossy(), s.offset).into();
        }
        String::from_utf8_lossy(keys.get(i))
    }

    /// Every key: packed shards' are read on first use (a shard that changed since the open
    /// leaves its keys unknown: they read as `FILE#K@OFFSET`, and a notice says why).
    fn keys(&self) -> &Strings {
        if let Some(lazy) = &self.lazy_keys {
            return self.shard_keys.get_or_init(|| {
                lazy.read().unwrap_or_else(|e| {
                    crate::util::notice(&format!("sample keys unknown: {e}"));
                    Strings::default()
                })
            });
        }
        if self.in_shards.is_none() {
            return &self.keys;
        }
        self.shard_keys
            .get_or_init(|| match shard::keys_and_images(self, false) {
                Ok((k, _)) => k,
                Err(e) => {
                    crate::util::notice(&format!("sample keys unknown: {}", e.report()));
                    Strings::default()
                }
            })
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

    /// How samples are wrapped in their files.
    pub fn frame(&self) -> Frame {
        self.frame
    }

    /// What was wrong in the files while indexing them (a corrupt tar header, a TFRecord length
    /// whose checksum failed, a sample with no payload member…): each error names the file and
    /// the offset or sample. The samples that could be located are in the dataset; these were
    /// not. At most [`PROBLEMS_KEPT`] are kept; [`problems_total`](Dataset::problems_total)
    /// counts all.
    pub fn problems(&self) -> &[Error] {
        &self.problems
    }

    /// How many problems indexing found (including those not kept).
    pub fn problems_total(&self) -> u64 {
        self.problems_total
    }

    /// Checks the raw bytes of sample `i` (as read from `offset .. offset + len`) — its frame,
    /// its checksums when `verify` and the format has them, and for TFRecord Examples the
    /// payload feature — and returns where its payload lies inside `raw` and the label its data
    /// carries. The error names the file, the sample and what was wrong.
    pub fn check_sample(&self, i: usize, raw: &[u8], verify: bool) -> Result<Checked> {
        let s = self.samples.get(i);
        let r = match self.frame {
            Frame::None => {
                if verify && self.has_checksums && crate::util::crc32c(raw) != s.crc32c {
                    Err(Error::new(
                        crate::error::ErrorKind::InvalidInput,
                        format!("checksum mismatch (key {:?})", self.key(i)),
                    ))
                } else {
                    Ok(Checked {
                        payload: 0..raw.len(),
                        label: None,
                    })
                }
            }
            Frame::TfRecord => tfrecord::unframe(raw, verify).and_then(|data| {
                let Some(spec) = &self.example else {
                    return Ok(Checked {
                        payload: data,
                        label: None,
                    });
                };
                let found = example::find(&raw[data.clone()], spec).map_err(|m| {
                    invalid(format!(
                        "record {} is not a usable tf.train.Example: {m} (tfrecord_payload=none \
                         reads records raw)",
                        self.key(i)
                    ))
                })?;
                Ok(Checked {
                    payload: data.start + found.payload.start..data.start + found.payload.end,
                    label: found.label,
                })
            }),
        };
        r.map_err(|e| self.sample_error(i, e))
    }

    /// Whether [`check_spans`](Dataset::check_spans) has anything to do: checksums to verify
    /// or frames to parse.
    pub(crate) fn checks_anything(&self, verify: bool) -> bool {
        (verify && self.has_checksums) || self.frame != Frame::None
    }

    /// Checks the delivered samples at positions `at` of a read group against the group's
    /// `bytes` (where `spans` says each lies): its frame and (with `verify`) its checksum, as
    /// [`check_sample`](Dataset::check_sample) does, narrowing its span to the payload or
    /// replacing it with the error. Where the data carries labels (TFRecord Examples), `labels`
    /// becomes one per sample of `ids` (the index's, overridden by the data's); it stays empty
    /// otherwise. Nothing to do for formats without frames when not verifying. Returns how
    /// many bytes it checked.
    pub(crate) fn check_spans(
        &self,
        bytes: &[u8],
        ids: &[u32],
        spans: &mut [SampleSpan],
        labels: &mut Vec<i64>,
        verify: bool,
        at: std::ops::Range<usize>,
    ) -> usize {
        if !self.checks_anything(verify) {
            return 0;
        }
        let mut checked = 0;
        for k in at {
            let (Some(span), Some(&id)) = (spans.get_mut(k), ids.get(k)) else {
                break;
            };
            if let Ok(r) = span {
                checked += r.len();
                *span = match self.check_sample(id as usize, &bytes[r.clone()], verify) {
                    Ok(c) => {
                        if let Some(label) = c.label {
                            if labels.is_empty() {
                                labels.extend(self.index_labels(ids));
                            }
                            labels[k] = label;
                        }
                        Ok(r.start + c.payload.start..r.start + c.payload.end)
                    }
                    Err(e) => Err(std::sync::Arc::new(e)),
                };
            }
        }
        checked
    }

    /// The index's label of each sample of `ids`.
    pub(crate) fn index_labels<'a>(&'a self, ids: &'a [u32]) -> impl Iterator<Item = i64> + 'a {
        ids.iter().map(|&i| self.samples.get(i as usize).label)
    }

    /// Reads sample `i` with ordinary buffered I/O into `buf` and checks it as
    /// [`check_sample`](Dataset::check_sample) does; the payload's range is in `buf`.
    pub fn read_sample(&self, i: usize, buf: &mut Vec<u8>, verify: bool) -> Result<Checked> {
        self.read_raw(i, buf, verify && self.has_checksums())?;
        self.check_sample(i, buf, verify)
    }

    /// Reads sample `i`'s raw bytes (`offset .. offset + len`, frame included) into `buf`, with
    /// ordinary buffered I/O, checking nothing but that its file is the one indexed
    /// ([`changed_since_open`](Self::changed_since_open); `checked`: the caller checks the
    /// sample against its checksum).
    pub(crate) fn read_raw(&self, i: usize, buf: &mut Vec<u8>, checked: bool) -> Result<()> {
        let s = self.samples.get(i);
        let path = self.file_path(s.file);
        let f = self.sources.open(&path).map_err(|e| {
            self.gone(e.raw_os_error());
            self.sample_error(i, Error::io("cannot open", e))
        })?;
        let now = f.stat();
        if let Some(why) = self.changed_since_open(s.file, now.identity, now.size, checked) {
            return Err(self.sample_error(i, changed_error(why)));
        }
        buf.clear();
        buf.resize(s.len as usize, 0); // len was checked against the file's size when indexed
        f.read_exact_at(buf, s.offset)
            .map_err(|e| self.sample_error(i, Error::io("cannot read sample", e)))
    }

    /// Checks that sample `i`'s payload is the image it claims to be ([`image::check`]): for
    /// an ImageFolder the file's extension makes the claim; elsewhere the payload's first bytes
    /// (a payload that does not look like an image is not checked). `Ok` when there is nothing
    /// to check.
    pub fn check_image(&self, i: usize, payload: &[u8]) -> Result<()> {
        let claim = match self.format {
            Format::ImageFolder => {
                let s = self.samples.get(i);
                self.file_path(s.file)
                    .extension()
                    .and_then(|x| image::kind_of_extension(&x.to_string_lossy().to_lowercase()))
            }
            _ => image::sniff(payload),
        };
        match claim {
            Some(kind) => image::check(payload, kind)
                .map_err(|m| self.sample_error(i, invalid(format!("{m} (key {:?})", self.key(i))))),
            None => Ok(()),
        }
    }

    /// The label of sample `i` once its bytes were checked: the data's own (TFRecord
    /// Examples) or the index's.
    pub fn label_of(&self, i: usize, checked: &Checked) -> i64 {
        checked.label.unwrap_or(self.samples.get(i).label)
    }

    /// Class names by label, where the format names them.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Class `k`'s name as its own bytes (an ImageFolder folder's name that is not UTF-8, which
    /// [`classes`](Dataset::classes) can only give lossily: two such names may read the same).
    pub fn class_name_bytes(&self, k: usize) -> &[u8] {
        match self.class_bytes.get(k) {
            Some(b) => b,
            None => self.classes[k].as_bytes(),
        }
    }

    /// Sample `i`'s key as its own bytes ([`key`](Dataset::key) gives it as text, lossily where
    /// it is not UTF-8: an ImageFolder file's name).
    pub fn key_bytes(&self, i: usize) -> std::borrow::Cow<'_, [u8]> {
        let keys = self.keys();
        match keys.is_empty() || keys.get(i).is_empty() {
            true => match self.key(i) {
                std::borrow::Cow::Borrowed(s) => s.as_bytes().into(),
                std::borrow::Cow::Owned(s) => s.into_bytes().into(),
            },
            false => keys.get(i).into(),
        }
    }

    /// How a sample holds its tokens: token files and Megatron datasets (whose prefixes all
    /// store one element type); `None` for other formats.
    pub fn token_layout(&self) -> Option<TokenLayout> {
        self.tokens
    }

    /// Sum of all sample lengths.
    pub fn total_bytes(&self) -> u64 {
        self.samples.total_len()
    }

    /// Heap bytes of the index (samples, keys, metadata, image headers).
    pub fn index_heap_bytes(&self) -> usize {
        let b = self.index_bytes();
        b.samples + b.keys + b.metadata + b.images
    }

    /// Heap bytes of each part of the index.
    pub fn index_bytes(&self) -> IndexBytes {
        IndexBytes {
            samples: self.samples.heap_bytes(),
            keys: self.keys.heap_bytes() + self.shard_keys.get().map_or(0, Strings::heap_bytes),
            metadata: self.metas.heap_bytes(),
            images: self.images.get().map_or(0, |v| {
                v.capacity() * std::mem::size_of::<image::ImageInfo>()
            }),
            samples_shared: self.samples.shared_bytes(),
            keys_shared: self.keys.shared_bytes()
                + self.shard_keys.get().map_or(0, Strings::shared_bytes),
        }
    }

    /// An error about sample `i`, naming its file, offset and key.
    pub fn sample_error(&self, i: usize, e: Error) -> Error {
        let s = self.samples.get(i);
        self.sources
            .named(e.with_path(self.file(s.file).path))
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
            keys: k,
            ..Dataset::empty(Format::Packed, files, samples.into())
        })
    }

    /// A dataset of `format` with no keys, metadata, checksums, classes or problems.
    pub(crate) fn empty(
        format: Format,
        files: Vec<DataFile>,
        samples: crate::plan::Samples,
    ) -> Dataset {
        Dataset {
            format,
            files,
            per_sample_root: None,
            samples,
            keys: Strings::default(),
            metas: Strings::default(),
            has_checksums: false,
            frame: Frame::None,
            classes: Vec::new(),
            class_bytes: Vec::new(),
            problems: Vec::new(),
            problems_total: 0,
            example: None,
            recovered: Vec::new(),
            notes: Vec::new(),
            options: OpenOptions {
                format: Some(format),
                ..OpenOptions::default()
            },
            images: std::sync::OnceLock::new(),
            remote: Vec::new(),
            in_shards: None,
            shard_keys: std::sync::OnceLock::new(),
            tokens: None,
            lazy_keys: None,
            node_index: None,
            identities: Vec::new(),
            sources: Default::default(),
        }
    }

    /// Reads a large sample table and keys from the node's shared copies of them (written now
    /// if no rank has: [`shared`]) where they are byte for byte this process's own — for the
    /// indexes that are not kept whole for the node ([`snapshot`]).
    pub(crate) fn share_index(&mut self) {
        if self.samples.len() < shared::SHARED_MIN_SAMPLES {
            return;
        }
        // Named by the files (an ImageFolder: its root and bytes; the copy is taken only where
        // it is byte for byte this process's own).
        let named: Vec<(&Path, u64)> = match &self.per_sample_root {
            Some(root) => vec![(&**root, self.samples.total_len())],
            None => self.files.iter().map(|f| (&*f.path, f.size)).collect(),
        };
        shared::share(&mut self.samples, self.format.name(), &named);
        if self.keys.len() >= shared::SHARED_MIN_SAMPLES {
            shared::share_keys(&mut self.keys, self.format.name(), &named);
        }
    }

    /// Whether each sample's image header is known without reading ([`image_info`]
    /// would not touch the files): packed shards of format version 2, or after a first call.
    ///
    /// [`image_info`]: Dataset::image_info
    pub fn has_image_info(&self) -> bool {
        self.images.get().is_some() || self.in_shards.is_some_and(|s| s.images)
    }

    /// Each sample's image header (dimensions, colour space, subsampling, progressive; kind
    /// `None` for a sample that is not an image). Packed shards (version 2) carry them; for
    /// other formats the first call reads each sample's header bytes (64 KiB, or the whole
    /// sample when its header lies further in or the format frames it) once, with a progress
    /// line, and keeps them. A sample that cannot be read is an error naming it.
    pub fn image_info(&self) -> Result<&[image::ImageInfo]> {
        if let Some(v) = self.images.get() {
            return Ok(v);
        }
        if self.in_shards.is_some_and(|s| s.images) {
            if let (keys, Some(v)) = shard::keys_and_images(self, true)? {
                // Read together and checked: the keys are kept too.
                let _ = self.shard_keys.set(keys);
                return Ok(self.images.get_or_init(|| v));
            }
        }
        let v = self.read_image_headers()?;
        Ok(self.images.get_or_init(|| v))
    }

    fn read_image_headers(&self) -> Result<Vec<image::ImageInfo>> {
        const PREFIX: u64 = 64 << 10;
        // A progress line only if it is still going after 2 s (a large set on a cold disk).
        let mut prog = crate::progress::Task::items_after(
            "reading image headers",
            self.samples.len() as u64,
            "samples",
            std::time::Duration::from_secs(2),
        );
        let mut open: Option<(u32, SourceFile)> = None;
        let mut buf = Vec::new();
        let mut out = Vec::with_capacity(self.samples.len());
        for (i, s) in self.samples.iter().enumerate() {
            let path = self.file_path(s.file);
            let err = |e| {
                Error::io("cannot read an image header", e)
                    .with_path(path.to_path_buf())
                    .with_sample(i as u64)
            };
            if open.as_ref().is_none_or(|(f, _)| *f != s.file) {
                open = Some((s.file, self.sources.open(&path).map_err(err)?));
            }
            let f = &open.as_ref().expect("opened above").1;
            let framed = self.frame != Frame::None || self.example.is_some();
            let mut want = if framed {
                s.len as u64
            } else {
                (s.len as u64).min(PREFIX)
            };
            let info = loop {
                // Bounded by the sample's length, itself checked against the file's size.
                buf.resize(want as usize, 0);
                f.read_exact_at(&mut buf, s.offset).map_err(err)?;
                let payload = if framed {
                    match self.check_sample(i, &buf, false) {
                        Ok(c) => &buf[c.payload],
                        Err(_) => break None,
                    }
                } else {
                    &buf[..]
                };
                let info = image::info(payload);
                if info.is_none() && want < s.len as u64 && image::sniff(payload).is_some() {
                    want = s.len as u64; // a JPEG whose frame header follows large segments
                    continue;
                }
                break info;
            };
            out.push(info.unwrap_or_default());
            if i % 1024 == 0 {
                prog.set(i as u64);
            }
        }
        prog.finish();
        Ok(out)
    }
}

/// How many indexing problems a dataset keeps (the rest are counted).
pub const PROBLEMS_KEPT: usize = 1000;

/// Collects the files, samples and problems of a dataset being indexed.
#[derive(Default)]
pub(crate) struct Builder {
    pub files: Vec<DataFile>,
    pub samples: crate::plan::SamplesBuilder,
    /// Windows computed from their number (token files), when `samples` is empty.
    pub runs: Vec<crate::plan::Run>,
    pub keys: Strings,
    pub problems: Vec<Error>,
    pub problems_total: u64,
    /// Samples (ids in this builder) found by resynchronisation.
    pub recovered: Vec<u32>,
    pub notes: Vec<String>,
}

impl Builder {
    pub fn problem(&mut self, e: Error) {
        self.problems_total += 1;
        if self.problems.len() < PROBLEMS_KEPT {
            self.problems.push(e);
        }
    }

    /// A problem of kind `InvalidInput` at `offset` of `path`.
    pub fn problem_at(&mut self, path: &Arc<Path>, offset: u64, msg: String) {
        self.problem(
            Error::new(crate::error::ErrorKind::InvalidInput, msg)
                .with_path(path.clone())
                .with_offset(offset),
        );
    }

    /// Appends another builder's files, samples, keys and problems (its file indices shifted).
    pub fn append(&mut self, other: Builder) -> Result<()> {
        let shift = u32::try_from(self.files.len()).map_err(|_| invalid("more than 2^32 files"))?;
        self.files.extend(other.files);
        let base = self.len() as u32;
        let runs = !self.runs.is_empty() || !other.runs.is_empty();
        if runs && (!self.samples.is_empty() || !other.samples.is_empty()) {
            return Err(invalid(
                "computed windows and indexed samples in one dataset (open them apart)",
            ));
        }
        self.runs
            .extend(other.runs.iter().map(|r| crate::plan::Run {
                first: r.first + base as u64,
                file: r.file + shift,
                ..*r
            }));
        self.samples.reserve(other.samples.len());
        for s in other.samples.finish().iter() {
            self.samples.push(Sample {
                file: s.file + shift,
                ..s
            });
        }
        self.recovered
            .extend(other.recovered.iter().map(|&r| r + base));
        self.notes.extend(other.notes);
        for i in 0..other.keys.len() {
            self.keys.push(other.keys.get(i))?;
        }
        self.problems_total += other.problems_total;
        for p in other.problems {
            if self.problems.len() < PROBLEMS_KEPT {
                self.problems.push(p);
            }
        }
        Ok(())
    }

    /// Samples so far.
    pub fn len(&self) -> usize {
        self.samples.len() + self.runs.last().map_or(0, |r| (r.first + r.count) as usize)
    }

    /// Adds a file; returns its index.
    pub fn file(&mut self, path: &Path, size: u64) -> Result<u32> {
        let i = u32::try_from(self.files.len()).map_err(|_| invalid("more than 2^32 files"))?;
        self.files.push(data_file(path, size));
        Ok(i)
    }

    /// The dataset, or an error if no sample was found (naming the first problem, if any) —
    /// unless nothing was wrong and the notes say why it is empty (a valid empty file).
    pub fn finish(self, format: Format, what: &str) -> Result<Dataset> {
        let validly_empty = self.problems_total == 0 && !self.notes.is_empty();
        if self.len() == 0 && !validly_empty {
            let mut msg = format!("no samples found in {what}");
            if let Some(p) = self.problems.first() {
                msg.push_str(&format!(" (first problem: {})", p.report()));
            }
            let mut e = invalid(msg);
            if let [f] = &self.files[..] {
                e = e.with_path(f.path.clone());
            }
            return Err(e);
        }
        if !self.runs.is_empty() && !self.samples.is_empty() {
            return Err(invalid(
                "computed windows and indexed samples in one dataset (open them apart)",
            ));
        }
        let samples = if self.runs.is_empty() {
            self.samples.finish()
        } else {
            crate::plan::Samples::from_runs(self.runs)
        };
        let mut ds = Dataset::empty(format, self.files, samples);
        ds.keys = self.keys;
        ds.keys.settle();
        ds.problems = self.problems;
        ds.problems_total = self.problems_total;
        ds.recovered = self.recovered;
        ds.notes = self.notes;
        Ok(ds)
    }
}

/// Indexes `paths` on up to 8 threads (files are independent: cold tar headers are small random
/// reads, which a single thread issues one at a time) and merges them in the order given, so
/// the result does not depend on the thread count. `index` indexes one file into an empty
/// builder; what it found before an error is kept, and the error becomes a problem — or the
/// result, when there is only one file.
pub(crate) fn index_files<F>(paths: &[PathBuf], src: &Sources, index: F) -> Result<Builder>
where
    F: Fn(&Path, &mut Builder) -> Result<()> + Sync,
{
    let remote = src.is_remote();
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    // One file: no thread to start and no progress to poll (the poll sleeps a millisecond).
    if let [p] = paths {
        let mut b = Builder::default();
        index(p, &mut b).map_err(|e| src.changed_or(p, e))?;
        return Ok(b);
    }
    // Remote files are walked by ranged GETs: waiting on the store, not the CPU.
    let threads = if remote {
        crate::cache::FETCH_THREADS
    } else {
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 8)
    }
    .min(paths.len().max(1));
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    /// One file's index and how its walk ended, once a thread has done it.
    type Indexed = Mutex<Option<(Builder, Result<()>)>>;
    let done: Vec<Indexed> = paths.iter().map(|_| Mutex::new(None)).collect();
    // A progress line only if indexing is still going after 2 s (a large set, a cold disk).
    let mut prog = crate::progress::Task::items_after(
        format!("indexing {} files", paths.len()),
        paths.len() as u64,
        "files",
        std::time::Duration::from_secs(2),
    );
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = paths.get(k) else { return };
                    let mut b = Builder::default();
                    let r = index(p, &mut b);
                    *done[k].lock().unpoisoned() = Some((b, r));
                    finished.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        let t0 = std::time::Instant::now();
        while workers.iter().any(|w| !w.is_finished()) {
            prog.set(finished.load(Ordering::Relaxed) as u64);
            // Quick sets are not slowed by the polling; long ones are polled less.
            let ms = if t0.elapsed().as_secs() < 2 { 1 } else { 100 };
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    });
    prog.finish();
    let mut all = Builder::default();
    for (slot, p) in done.into_iter().zip(paths) {
        let (b, r) = slot
            .into_inner()
            .unpoisoned()
            .ok_or_else(|| invalid("an indexing thread stopped early"))?;
        all.append(b)?;
        if let Err(e) = r {
            // An object replaced under the open fails it: its samples are not damaged.
            let e = src.changed_or(p, e);
            if paths.len() == 1 || sources::changed_under_open(&e) {
                return Err(e);
            }
            all.problem(e);
        }
    }
    Ok(all)
}

/// An error if a file is among `paths` twice — the same path, another spelling of it (a link,
/// `./`), or a remote object named by its prefix and by itself: an epoch would deliver its
/// samples twice. Files are told apart by (device, inode); a path that cannot be stat'ed (a
/// Megatron prefix) by its text.
pub(crate) fn refuse_repeats(paths: &[PathBuf], src: &Sources) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut seen: std::collections::HashMap<(u64, u64), &Path> = Default::default();
    let mut texts: std::collections::HashSet<&Path> = Default::default();
    for p in paths {
        let again = match std::fs::metadata(p) {
            Ok(m) if m.is_file() => seen.insert((m.dev(), m.ino()), p),
            Ok(_) => None,
            Err(_) => (!texts.insert(p)).then_some(p.as_path()),
        };
        if let Some(first) = again {
            let (a, b) = (src.shown(first), src.shown(p));
            let how = if a == b {
                format!("{a} is named twice (once more, or by a prefix holding it)")
            } else {
                format!("{a} and {b} are one file")
            };
            return Err(invalid(format!(
                "{how}: an epoch would deliver its samples twice; name each file (or each \
                 prefix, without one of its own objects) once"
            )));
        }
    }
    Ok(())
}

/// The paths as URLs when they name remote objects (all of them, or an error), else `None`.
fn remote_urls(paths: &[PathBuf]) -> Result<Option<Vec<&str>>> {
    let urls: Vec<&str> = paths
        .iter()
        .filter_map(|p| p.to_str().filter(|s| is_url(s)))
        .collect();
    match urls.len() {
        0 => Ok(None),
        n if n == paths.len() => Ok(Some(urls)),
        _ => Err(invalid(
            "a dataset is either remote (URLs) or local (paths), not both",
        )),
    }
}

/// Whether `s` names a remote source: `s3://`, `gs://`, `az://`, `http(s)://`…
pub fn is_url(s: &str) -> bool {
    #[cfg(feature = "remote")]
    return crate::remote::is_url(s);
    #[cfg(not(feature = "remote"))]
    s.split_once("://").is_some_and(|(scheme, rest)| {
        !rest.is_empty() && scheme.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

fn open_remote(urls: &[&str], opts: &OpenOptions) -> Result<Dataset> {
    #[cfg(feature = "remote")]
    return remote::open(urls, opts);
    #[cfg(not(feature = "remote"))]
    {
        let _ = opts;
        Err(Error::new(
            crate::error::ErrorKind::Unsupported,
            format!(
                "{}: this gpufeed was built without object-storage support (cargo feature \
                 `remote`)",
                urls[0]
            ),
        ))
    }
}

/// A dataset file opened for the indexers' and checkers' small reads: a local file, or a remote
/// object's data file in the node cache, whose absent extents are fetched (and cached) as they
/// are read.
pub(crate) struct SourceFile {
    file: std::fs::File,
    /// What `statx` said of it when opened.
    stat: crate::sys::FileStat,
    #[cfg(feature = "remote")]
    remote: Option<Arc<crate::cache::CachedObject>>,
}

/// The error for a dataset file that [`Dataset::changed_since_open`] refuses (`why`).
pub(crate) fn changed_error(why: &str) -> Error {
    invalid(format!(
        "changed since the dataset was opened ({why}): its samples are not read; open the \
         dataset again"
    ))
}

/// A remote read of `want` bytes as an exact one: an error for too few.
#[cfg(feature = "remote")]
fn whole(got: crate::error::Result<usize>, want: usize) -> std::io::Result<()> {
    let n = got.map_err(|e| std::io::Error::other(e.report()))?;
    if n < want {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

impl SourceFile {
    /// Opens `path`: a local file, or (`remote`) a remote object's node-cache copy
    /// ([`Sources::open`] says which).
    pub(crate) fn open_as(
        path: &Path,
        #[cfg(feature = "remote")] remote: Option<Arc<crate::cache::CachedObject>>,
    ) -> std::io::Result<SourceFile> {
        // Not waiting on a FIFO (or a device) put where a data file was: opened non-blocking
        // and refused unless a regular file.
        let file = std::fs::File::from(crate::sys::open_read(path, false)?);
        let stat = crate::sys::statx_fd(std::os::fd::AsFd::as_fd(&file))?;
        if !stat.is_regular {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file (a FIFO, a device or a directory is where a data file was)",
            ));
        }
        Ok(SourceFile {
            stat,
            #[cfg(feature = "remote")]
            remote,
            file,
        })
    }

    /// The file's size (a remote object's size).
    pub fn size(&self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// A remote object's extent size (its reads are best made an extent at a time, on extent
    /// boundaries); `None` for a local file.
    pub fn remote_extent(&self) -> Option<u64> {
        #[cfg(feature = "remote")]
        return self.remote.as_ref().map(|o| o.extent_bytes());
        #[cfg(not(feature = "remote"))]
        None
    }

    /// Whether this is a remote object whose node cache has room for another extent of it.
    pub fn remote_room(&self) -> bool {
        #[cfg(feature = "remote")]
        return self
            .remote
            .as_ref()
            .is_some_and(|o| o.cache().has_room(o.extent_bytes()));
        #[cfg(not(feature = "remote"))]
        false
    }

    /// [`read_exact_at`](Self::read_exact_at), but a remote object's absent bytes are fetched
    /// alone and not cached (walks that hop over most of a file).
    pub fn peek_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        #[cfg(feature = "remote")]
        if let Some(obj) = &self.remote {
            return whole(obj.peek_at(buf, offset), buf.len());
        }
        self.read_exact_at(buf, offset)
    }

    /// Reads exactly `buf.len()` bytes at `offset` (an `UnexpectedEof` error past the end).
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        #[cfg(feature = "remote")]
        if let Some(obj) = &self.remote {
            return whole(obj.read_at(buf, offset), buf.len());
        }
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }

    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// The file as `statx` found it when it was opened (its identity and size then).
    pub fn stat(&self) -> &crate::sys::FileStat {
        &self.stat
    }
}

/// Reads a file through a window of its bytes, for indexers that walk a file front to back
/// (tar headers, TFRecord lengths): one `pread` serves many small reads.
pub(crate) struct Window {
    file: SourceFile,
    pub path: Arc<Path>,
    pub size: u64,
    start: u64,
    buf: Vec<u8>,
    /// A remote file's extent last peeked into, and the bytes peeked there so far.
    peeked: (u64, u64),
}

/// Bytes a [`Window`] reads at a time (enough for a header and the small members that follow
/// it, little enough that hopping over large members does not read them), and the most one
/// `get` may ask for.
const WINDOW_BYTES: usize = 4 << 10;
/// A remote file's window: one ranged GET (a tar header and the small members after it).
const REMOTE_WINDOW_BYTES: usize = 8 << 10;
pub(crate) const WINDOW_MAX: usize = 1 << 20;

impl Window {
    pub fn open(path: &Path, src: &Sources) -> Result<Window> {
        let file = src
            .open(path)
            .map_err(|e| Error::io("cannot open", e).with_path(path.to_path_buf()))?;
        let size = file
            .size()
            .map_err(|e| Error::io("cannot stat", e).with_path(path.to_path_buf()))?;
        // The walk hops over the members' data: without this the kernel's readahead (8 MiB on
        // the development VM's disk) reads most of the file to index it.
        let _ = crate::sys::fadvise(
            std::os::fd::AsFd::as_fd(file.file()),
            0,
            0,
            crate::sys::Advice::POSIX_FADV_RANDOM,
        );
        Ok(Window {
            file,
            path: shared_path(path),
            size,
            start: 0,
            buf: Vec::new(),
            peeked: (u64::MAX, 0),
        })
    }

    /// The bytes `offset .. offset + len` (`len` ≤ [`WINDOW_MAX`]); an error if they are not
    /// all in the file (including when it shrank since it was opened).
    pub fn get(&mut self, offset: u64, len: usize) -> Result<&[u8]> {
        assert!(len <= WINDOW_MAX, "window reads are small");
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.size);
        let Some(end) = end else {
            return Err(Error::new(
                crate::error::ErrorKind::UnexpectedEof,
                format!("{len} bytes at offset {offset} lie past the end of the file"),
            )
            .with_path(self.path.clone()));
        };
        if offset < self.start || end > self.start + self.buf.len() as u64 {
            // A remote file's window is its whole extent, fetched and cached, while the node
            // cache has room for it: the walk then costs one download of the tar, once per
            // node, and the epoch reads those extents from disk (a GET of 8 KiB per header made
            // the open of 245 MB take 4.9–5.9 s where the download takes 0.5 s, issue 52 item
            // 11). Without room, it is fetched alone (one ranged GET, not cached) — unless the
            // walk's reads are dense in this extent (small members: their headers are a large
            // share of it), where the extent is fetched whole (cached if it may be: the epoch
            // reads it anyway, and it is fewer GETs).
            let (start, window, peek) = match self.file.remote_extent() {
                Some(e) => {
                    let ext = offset / e;
                    if self.peeked.0 != ext {
                        self.peeked = (ext, 0);
                    }
                    let w = REMOTE_WINDOW_BYTES.max(len) as u64;
                    if self.file.remote_room() || (self.peeked.1 + w) * 4 > e {
                        (ext * e, e as usize + len, false)
                    } else {
                        self.peeked.1 += w;
                        (offset, REMOTE_WINDOW_BYTES, true)
                    }
                }
                None => (offset, WINDOW_BYTES, false),
            };
            let want = (self.size - start).min(window.max(len) as u64) as usize;
            self.buf.resize(want, 0);
            self.start = start;
            let got = if peek {
                self.file.peek_exact_at(&mut self.buf, start)
            } else {
                self.file.read_exact_at(&mut self.buf, start)
            };
            if let Err(e) = got {
                self.buf.clear();
                return Err(Error::io("cannot read (did the file shrink?)", e)
                    .with_path(self.path.clone())
                    .with_range(start, want as u64));
            }
        }
        let at = (offset - self.start) as usize;
        Ok(&self.buf[at..at + len])
    }
}

pub(crate) fn data_file(path: &Path, size: u64) -> DataFile {
    DataFile {
        path: shared_path(path),
        size,
    }
}
