//! `gpufeed._gpufeed`: the Python binding (PyO3, abi3 for CPython ≥ 3.9).
//!
//! Batches are handed over without a copy: `Batch.data` and the offsets, lengths and labels are
//! `Buffer`s that implement the DLPack protocol, so `torch.from_dlpack`, `numpy.from_dlpack`,
//! `cupy.from_dlpack` and `jax.dlpack` view gpufeed's memory. A buffer keeps its batch's memory
//! alive until the last consumer releases it. The GIL is released while waiting for data; no
//! Python code runs per sample.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::Duration;

use gpufeed::config::{FrontDoor, LoaderSettings, OnError, LOADER_SETTINGS};
use gpufeed::dataset::{OpenOptions, DATASET_OPTIONS};
use gpufeed::decode::{ImageBatch, ImageEpoch, ImageLoader, ImageSpec, PixelType, IMAGE_SETTINGS};
use gpufeed::dlpack::{self, DLDevice, DLManagedTensor};
use gpufeed::plan::Stop;
use gpufeed::{Batch, Dataset, Epoch, Loader};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

create_exception!(
    gpufeed,
    GpufeedError,
    PyException,
    "An error from gpufeed; the message names the file, the sample and what was wrong."
);
create_exception!(
    gpufeed,
    DatasetWarning,
    pyo3::exceptions::PyUserWarning,
    "Indexing a dataset found damage: the samples it covers are not in the dataset."
);
create_exception!(
    gpufeed,
    SampleError,
    GpufeedError,
    "A batch held a sample that could not be read or failed its checksum."
);

fn err(e: gpufeed::Error) -> PyErr {
    GpufeedError::new_err(python_spelling(&e.report()))
}

/// A message in Python's words: the library names options as the command line spells them
/// (`--format tokens`, `--token-dtype`); here they are keyword arguments (`format="tokens"`,
/// `token_dtype=`).
fn python_spelling(msg: &str) -> String {
    let mut names: Vec<(&str, &str)> = DATASET_OPTIONS
        .iter()
        .map(|o| (o.flag, o.name))
        .chain(LOADER_SETTINGS.iter().map(|s| (s.flag, s.name)))
        .collect();
    names.sort_by_key(|(flag, _)| std::cmp::Reverse(flag.len()));
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    'scan: while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        // A flag starts a word: `x--format` in a path is not one.
        let starts_word = match out.chars().last() {
            None => true,
            Some(c) => c.is_whitespace() || matches!(c, '(' | '`' | '\'' | '"' | ','),
        };
        for (flag, name) in names.iter().filter(|_| starts_word) {
            let Some(tail) = after.strip_prefix(flag) else {
                continue;
            };
            if tail.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                continue; // a longer flag
            }
            // `--flag value` (a lower-case word) becomes name="value"; `--flag` alone name=.
            let word_len = tail
                .strip_prefix(' ')
                .map(|t| {
                    t.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                        .unwrap_or(t.len())
                })
                .unwrap_or(0);
            if word_len > 0 && !tail[1..].starts_with('-') {
                let word = &tail[1..1 + word_len];
                if word.bytes().all(|b| b.is_ascii_digit()) {
                    out.push_str(&format!("{name}={word}"));
                } else {
                    out.push_str(&format!("{name}=\"{word}\""));
                }
                rest = &tail[1 + word_len..];
            } else {
                out.push_str(&format!("{name}="));
                rest = tail;
            }
            continue 'scan;
        }
        out.push_str("--");
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The keyword arguments `Loader` takes besides the dataset options: the loader settings of
/// the table every door shares, and the Python door's own (kept in step with the
/// `#[pyo3(signature)]` below by a Python test that reads the signature).
fn loader_args() -> Vec<&'static str> {
    let mut v = vec!["paths"];
    v.extend(LOADER_SETTINGS.iter().map(|s| s.name));
    v.extend(["drop_last", "images"]);
    v
}

/// A setting's Python value as the text `LoaderSettings::set` takes: str, bool, int or float.
fn setting_text(name: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(yes) = v.cast::<pyo3::types::PyBool>() {
        return Ok(yes.is_true().to_string());
    }
    if let Ok(s) = v.extract::<String>() {
        return Ok(s);
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(i.to_string());
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(f.to_string());
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "{name}: expected a string, a number or a bool, not {}",
        v.get_type().name()?
    )))
}

/// How long one wait for a batch lasts before Python gets the GIL back (to see Ctrl-C).
const POLL: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the passes stand. A pass (`for batch in loader`) reads the epoch `set_epoch` or
/// `load_state_dict` chose; without either since the latest pass began, the pass after a finished
/// one reads the next epoch (a new order each pass, as `DataLoader(shuffle=True)`), and the pass
/// after an unfinished one reads that epoch again from its start.
#[derive(Debug, Default)]
struct State {
    /// The epoch chosen for the next pass, and a resume point in it (`load_state_dict`): the
    /// stops on other rank counts the epoch resumes after, and a batch of what they left.
    epoch: u64,
    stops: Vec<Stop>,
    resume: Option<u32>,
    /// `set_epoch` or `load_state_dict` was called since the latest pass began.
    chosen: bool,
    /// A pass has begun; the latest one's epoch, its stops and its batches, and the batches it
    /// has yielded.
    started: bool,
    iter_epoch: u64,
    iter_stops: Vec<Stop>,
    iter_batches: u32,
    yielded: u32,
}

/// Where a pass starts or a saved state resumes: an epoch, the stops on other rank counts it
/// resumes after, and a batch.
type Point = (u64, Vec<Stop>, u32);

impl State {
    /// Where a saved state resumes: a chosen point, the next epoch after a finished pass, the
    /// batch after the last one yielded otherwise.
    fn saved_point(&self) -> Point {
        if self.chosen || !self.started {
            (self.epoch, self.stops.clone(), self.resume.unwrap_or(0))
        } else if self.yielded >= self.iter_batches {
            (self.iter_epoch + 1, Vec::new(), 0)
        } else {
            (self.iter_epoch, self.iter_stops.clone(), self.yielded)
        }
    }

    /// Where the next pass starts, and its batches (`batches` counts them for an epoch and its
    /// stops); that pass has begun.
    fn begin_pass(
        &mut self,
        batches: impl FnOnce(u64, &[Stop]) -> gpufeed::Result<u32>,
    ) -> gpufeed::Result<Point> {
        let (epoch, stops, start) = if self.chosen || !self.started {
            (self.epoch, self.stops.clone(), self.resume.unwrap_or(0))
        } else if self.yielded >= self.iter_batches {
            (self.iter_epoch + 1, Vec::new(), 0)
        } else {
            (self.iter_epoch, self.iter_stops.clone(), 0)
        };
        let count = batches(epoch, &stops)?;
        self.chosen = false;
        self.resume = None;
        self.stops = Vec::new();
        self.started = true;
        self.epoch = epoch;
        self.iter_epoch = epoch;
        self.iter_stops = stops.clone();
        self.iter_batches = count;
        self.yielded = start;
        Ok((epoch, stops, start))
    }
}

/// One pass's place: its epoch (and the stops it resumes after), the next batch, and its
/// reading (none while parked).
struct Cursor {
    epoch: u64,
    stops: Vec<Stop>,
    next: u32,
    inner: Option<EpochKind>,
    done: bool,
    stats: gpufeed::LoaderStats,
}

/// What a loader's passes share.
struct Shared {
    loader: Loader,
    /// With `images=`: the decode stage over `loader`.
    images: Option<ImageLoader>,
    state: Mutex<State>,
    /// With `prefetch_next_epoch`: the epoch after the one being read, asked for when that one
    /// started, so its first batches are read while this one's last are used.
    ahead: Mutex<Option<(u64, Epoch)>>,
    prefetch_next_epoch: bool,
    /// The pass that reads now. A loader reads one pass at a time (its buffers would otherwise
    /// be held by a pass nobody iterates): making or using another parks this one — its reading
    /// stops, batches it handed out stay valid — and using a parked pass again resumes it where
    /// it stood (its next read group is read again).
    active: Mutex<Weak<Mutex<Cursor>>>,
    /// The latest pass's figures (`Loader.stats()`).
    last_stats: Mutex<gpufeed::LoaderStats>,
    raise_on_error: bool,
}

impl Shared {
    /// Epoch `epoch`'s reading from batch `start`: for images, with the checksums left to the
    /// decode stage (it verifies each sample where it decodes it).
    fn read_epoch(&self, epoch: u64, stops: &[Stop], start: u32) -> gpufeed::Result<Epoch> {
        match &self.images {
            Some(il) => il.read_epoch(epoch, stops, start),
            None => self.loader.epoch_resumed(epoch, stops, start),
        }
    }

    /// Makes `me` the pass that reads: parks the one that read before, and starts `me`'s
    /// reading where it stands if it is not reading.
    fn activate(&self, me: &Arc<Mutex<Cursor>>) -> gpufeed::Result<()> {
        let before = {
            let mut a = lock(&self.active);
            std::mem::replace(&mut *a, Arc::downgrade(me)).upgrade()
        };
        if let Some(other) = before.filter(|o| !Arc::ptr_eq(o, me)) {
            // Dropped outside the cursor's lock: stopping waits for its reads in flight.
            let parked = lock(&other).inner.take();
            drop(parked);
        }
        let mut c = lock(me);
        if c.inner.is_some() || c.done {
            return Ok(());
        }
        // An epoch asked ahead is read before any asked after it, so it goes unless it is the
        // one wanted; a new one is asked after this one.
        let ahead = lock(&self.ahead).take();
        let it = match ahead {
            Some((e, it)) if e == c.epoch && c.stops.is_empty() && c.next == 0 => it,
            other => {
                drop(other);
                self.read_epoch(c.epoch, &c.stops, c.next)?
            }
        };
        if self.prefetch_next_epoch {
            *lock(&self.ahead) = Some((c.epoch + 1, self.read_epoch(c.epoch + 1, &[], 0)?));
        }
        c.inner = Some(match &self.images {
            Some(il) => EpochKind::Images(il.decode_epoch(it)),
            None => EpochKind::Bytes(it),
        });
        Ok(())
    }

    fn is_active(&self, me: &Arc<Mutex<Cursor>>) -> bool {
        lock(&self.active)
            .upgrade()
            .is_some_and(|a| Arc::ptr_eq(&a, me))
    }
}

/// An epoch-by-epoch loader over a dataset.
#[pyclass(name = "Loader", module = "gpufeed")]
struct PyLoader {
    shared: Arc<Shared>,
    settings: Settings,
    /// The arguments it was made with (rank and world size resolved), to rebuild it elsewhere:
    /// a pickled loader is made anew in the process that unpickles it.
    init: Py<PyDict>,
    /// Made for one DataLoader worker's part of the data (`gpufeed.torch.IterableDataset`).
    worker_part: std::sync::atomic::AtomicBool,
}

/// What must match for a saved state to apply.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    batch_size: u32,
    order: String,
    seed: u64,
    rank: u32,
    world_size: u32,
    last_batch: String,
    /// The dataset options in effect, as JSON text.
    dataset_options: String,
    samples: usize,
    /// The order's parameters that shape its batches (`shuffle_buffer=…`, `block_bytes=…,
    /// open_blocks=…`; empty for global and sequential). A state without them (saved before
    /// they were kept) is not checked for them.
    order_params: String,
    /// The dataset's files, by name and size (a hash): another dataset of as many samples is
    /// not resumed as if it were this one. Unchecked for a state without it.
    dataset: String,
}

/// The order's parameters that shape its batches, as `name=value` pairs.
fn order_params(order: &gpufeed::Order) -> String {
    match order {
        gpufeed::Order::ShardBuffer { buffer } => format!("shuffle_buffer={buffer}"),
        gpufeed::Order::Block {
            block_bytes,
            open_blocks,
        } => format!("block_bytes={block_bytes}, open_blocks={open_blocks}"),
        _ => String::new(),
    }
}

/// A hash of the dataset's files' names and sizes, as hex.
fn dataset_fingerprint(ds: &Dataset) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in ds.files() {
        (f.path.file_name(), f.size).hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

impl Settings {
    /// What differs between a saved state's settings and these, in Python's words:
    /// `world_size=8 when saved, 6 here`.
    fn differences(&self, here: &Settings) -> Vec<String> {
        let mut d = Vec::new();
        let mut cmp = |name: &str, saved: String, now: String| {
            if saved != now {
                d.push(format!("{name}={saved} when saved, {now} here"));
            }
        };
        cmp(
            "batch_size",
            self.batch_size.to_string(),
            here.batch_size.to_string(),
        );
        cmp(
            "order",
            format!("{:?}", self.order),
            format!("{:?}", here.order),
        );
        cmp("seed", self.seed.to_string(), here.seed.to_string());
        cmp("rank", self.rank.to_string(), here.rank.to_string());
        cmp(
            "world_size",
            self.world_size.to_string(),
            here.world_size.to_string(),
        );
        cmp(
            "last_batch",
            format!("{:?}", self.last_batch),
            format!("{:?}", here.last_batch),
        );
        cmp(
            "num_samples",
            self.samples.to_string(),
            here.samples.to_string(),
        );
        // Order parameters one by one (`shuffle_buffer=300 when saved, 1000 here`).
        let pairs = |t: &str| -> Vec<(String, String)> {
            t.split(", ")
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        if self.order_params != here.order_params && self.order == here.order {
            for ((k, a), (_, b)) in pairs(&self.order_params)
                .into_iter()
                .zip(pairs(&here.order_params))
            {
                cmp(&k, a, b);
            }
        }

        // The dataset options (format, seq_len, …), one by one where both parse.
        let parse = |t: &str| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(t);
        match (parse(&self.dataset_options), parse(&here.dataset_options)) {
            (Ok(a), Ok(b)) => {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let show = |m: &serde_json::Map<String, serde_json::Value>| match m.get(k) {
                        None | Some(serde_json::Value::Null) => "None".to_string(),
                        Some(serde_json::Value::Bool(b)) => {
                            if *b { "True" } else { "False" }.to_string()
                        }
                        // Numbers given as text ("64") read as the numbers they are.
                        Some(serde_json::Value::String(t)) if t.parse::<f64>().is_ok() => t.clone(),
                        Some(serde_json::Value::String(t)) => format!("{t:?}"),
                        Some(v) => v.to_string(),
                    };
                    cmp(k, show(&a), show(&b));
                }
            }
            _ => cmp(
                "the dataset options",
                self.dataset_options.clone(),
                here.dataset_options.clone(),
            ),
        }
        if self.dataset != here.dataset {
            d.push(
                "the dataset's files (names and sizes) differ from the ones the state was saved \
                 over"
                    .to_string(),
            );
        }
        d
    }
}

/// Tells a Python user, without being asked, that indexing lost samples: one
/// `gpufeed.DatasetWarning` per dataset opened, with the count and the first few problems.
fn warn_problems(py: Python<'_>, ds: &Dataset, paths: &[PathBuf]) -> PyResult<()> {
    let total = ds.problems_total();
    if total == 0 {
        return Ok(());
    }
    let first: Vec<String> = ds
        .problems()
        .iter()
        .take(3)
        .map(|e| e.to_string())
        .collect();
    let what = match paths {
        [one] => one.display().to_string(),
        many => format!("{} files", many.len()),
    };
    let msg = format!(
        "gpufeed: indexing {what} found {total} problem(s): what each covers is not in the \
         dataset (a sample, or the rest of a file), except a bad label, whose sample is kept \
         with label -1 ({} samples are in the dataset). First: {}{}. All of them: \
         Loader.problems; refuse such a dataset with strict=True.",
        ds.len(),
        first.join("; "),
        if total > 3 { "; …" } else { "" }
    );
    let category = py.get_type::<DatasetWarning>();
    let msg = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    PyErr::warn(py, &category, &msg, 1)
}

/// A name as Python's `os.fsdecode` gives it: its text, or — not UTF-8 — each byte that is not
/// UTF-8 as a lone surrogate (`surrogateescape`), so two names never read the same and
/// `os.fsencode` gives the bytes back.
fn fs_str<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match std::str::from_utf8(b) {
        Ok(s) => Ok(PyString::new(py, s).into_any()),
        Err(_) => PyBytes::new(py, b).call_method1("decode", ("utf-8", "surrogateescape")),
    }
}

/// A dataset option's Python value as the text `OpenOptions::set` takes: str, int, path, or a
/// list of str (joined by commas).
fn option_text(name: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = v.extract::<String>() {
        return Ok(s);
    }
    if let Ok(yes) = v.cast::<pyo3::types::PyBool>() {
        let boolean = DATASET_OPTIONS.iter().any(|o| o.name == name && o.boolean);
        if !boolean {
            return Err(PyValueError::new_err(format!(
                "{name}: expected a string or a number, not a bool"
            )));
        }
        return Ok(yes.is_true().to_string());
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(i.to_string());
    }
    if let Ok(p) = v.extract::<PathBuf>() {
        return Ok(p.display().to_string());
    }
    if let Ok(list) = v.extract::<Vec<String>>() {
        return Ok(list.join(","));
    }
    Err(PyValueError::new_err(format!(
        "{name}: expected a string, a number, a path or a list of strings"
    )))
}

/// The dataset options from keyword arguments, through the table every front door shares.
fn dataset_options(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<OpenOptions> {
    let mut opts = OpenOptions::default();
    if let Some(kw) = kwargs {
        for (k, v) in kw.iter() {
            let name: String = k.extract()?;
            if !DATASET_OPTIONS.iter().any(|o| o.name == name) {
                let names: Vec<&str> = DATASET_OPTIONS.iter().map(|o| o.name).collect();
                let args = loader_args();
                let hint = args
                    .iter()
                    .chain(&names)
                    .map(|n| (edit_distance(&name, n), *n))
                    .filter(|(d, n)| {
                        *d <= (n.len() / 3).max(2) || name.starts_with(n) || n.starts_with(&name)
                    })
                    .min()
                    .map_or(String::new(), |(_, n)| format!(" (did you mean {n:?}?)"));
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "Loader() got an unexpected keyword argument {name:?}{hint}; its arguments \
                     are {}; the dataset options are {}",
                    args.join(", "),
                    names.join(", ")
                )));
            }
            if v.is_none() {
                continue; // the default
            }
            opts.set(&name, &option_text(&name, &v)?)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
    }
    Ok(opts)
}

/// Levenshtein distance (for "did you mean"; names are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (
        paths, batch_size=None, order=None, seed=None, rank=None, world_size=None, device=None,
        prefetch=None, last_batch=None, drop_last=None, verify=None, on_error=None,
        shuffle_buffer=None, block_bytes=None, open_blocks=None, queue_depth=None,
        memory_budget=None, prefetch_next_epoch=None, images=None, timeout=None, in_flight=None,
        open_files_max=None, _batch_part=None, **dataset
    ))]
    #[allow(
        clippy::too_many_arguments,
        reason = "Python's keyword arguments, as torch's DataLoader takes them"
    )]
    fn new(
        py: Python<'_>,
        paths: &Bound<'_, PyAny>,
        batch_size: Option<&Bound<'_, PyAny>>,
        order: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        rank: Option<&Bound<'_, PyAny>>,
        world_size: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
        prefetch: Option<&Bound<'_, PyAny>>,
        last_batch: Option<&Bound<'_, PyAny>>,
        drop_last: Option<bool>,
        verify: Option<&Bound<'_, PyAny>>,
        on_error: Option<&Bound<'_, PyAny>>,
        shuffle_buffer: Option<&Bound<'_, PyAny>>,
        block_bytes: Option<&Bound<'_, PyAny>>,
        open_blocks: Option<&Bound<'_, PyAny>>,
        queue_depth: Option<&Bound<'_, PyAny>>,
        memory_budget: Option<&Bound<'_, PyAny>>,
        prefetch_next_epoch: Option<&Bound<'_, PyAny>>,
        images: Option<&Bound<'_, PyImages>>,
        timeout: Option<&Bound<'_, PyAny>>,
        in_flight: Option<&Bound<'_, PyAny>>,
        open_files_max: Option<&Bound<'_, PyAny>>,
        _batch_part: Option<(u32, u32)>,
        dataset: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let image_spec = images.map(|i| i.get().spec.clone());
        // The settings through the table every door shares, over torchrun's RANK/WORLD_SIZE.
        let given = [
            ("batch_size", batch_size),
            ("order", order),
            ("seed", seed),
            ("rank", rank),
            ("world_size", world_size),
            ("device", device),
            ("prefetch", prefetch),
            ("in_flight", in_flight),
            ("last_batch", last_batch),
            ("verify", verify),
            ("on_error", on_error),
            ("shuffle_buffer", shuffle_buffer),
            ("block_bytes", block_bytes),
            ("open_blocks", open_blocks),
            ("queue_depth", queue_depth),
            ("memory_budget", memory_budget),
            ("timeout", timeout),
            ("open_files_max", open_files_max),
            ("prefetch_next_epoch", prefetch_next_epoch),
        ];
        let value_err = |e: gpufeed::Error| PyValueError::new_err(e.message().to_string());
        let mut settings = LoaderSettings::from_env().map_err(value_err)?;
        for (name, v) in given {
            if let Some(v) = v.filter(|v| !v.is_none()) {
                settings
                    .set(name, &setting_text(name, v)?)
                    .map_err(value_err)?;
            }
        }
        match (last_batch.filter(|v| !v.is_none()), drop_last) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "give last_batch or drop_last (its alias), not both",
                ))
            }
            (None, Some(d)) => settings
                .set("last_batch", if d { "drop" } else { "short" })
                .map_err(value_err)?,
            _ => {}
        }
        let mut opts = dataset_options(dataset)?;
        // The open waits for a store no longer than a batch is waited for.
        opts.store = opts.store.open_timeout(settings.timeout);
        let path_list = path_list(paths)?;
        let loader = py
            .detach(|| -> gpufeed::Result<Loader> {
                let ds = Dataset::open_paths(&path_list, &opts)?;
                let (part, parts) = _batch_part.unwrap_or((0, 1));
                Loader::builder(ds)
                    .front_door(FrontDoor::Python)
                    .settings(&settings)
                    .batch_part(part, parts)
                    .build()
            })
            .map_err(err)?;
        let samples = loader.dataset().len();
        let dataset_options = loader.dataset().options().to_json().to_string();
        let loader_order = loader.plan_config().order;
        let fingerprint = dataset_fingerprint(loader.dataset());
        warn_problems(py, loader.dataset(), &path_list)?;
        let images_loader = match image_spec {
            Some(spec) => Some(loader.decode_images(spec).map_err(err)?),
            None => None,
        };
        // Everything it was made with, rank and world size as resolved here (a copy made from a
        // pickle in another process reads the same part of the data).
        let init = PyDict::new(py);
        init.set_item("paths", paths)?;
        for (k, v) in given {
            init.set_item(k, v)?;
        }
        init.set_item("rank", settings.rank)?;
        init.set_item("world_size", settings.world_size)?;
        init.set_item("last_batch", settings.last_batch.name())?;
        init.set_item("images", images)?;
        if let Some(p) = _batch_part {
            init.set_item("_batch_part", p)?;
        }
        if let Some(kw) = dataset {
            for (k, v) in kw.iter() {
                init.set_item(k, v)?;
            }
        }
        Ok(PyLoader {
            shared: Arc::new(Shared {
                images: images_loader,
                state: Mutex::default(),
                ahead: Mutex::new(None),
                prefetch_next_epoch: settings.prefetch_next_epoch,
                active: Mutex::new(Weak::new()),
                last_stats: Mutex::default(),
                raise_on_error: settings.on_error == OnError::Raise,
                loader,
            }),
            settings: Settings {
                batch_size: settings.batch_size,
                order: settings.order.name().to_string(),
                seed: settings.seed,
                rank: settings.rank,
                world_size: settings.world_size,
                last_batch: settings.last_batch.name().to_string(),
                dataset_options,
                samples,
                order_params: order_params(&loader_order),
                dataset: fingerprint,
            },
            init: init.unbind(),
            worker_part: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The loader settings in effect (the defaults and ``RANK``/``WORLD_SIZE`` filled in): the
    /// names and values of ``gpufeed.LOADER_SETTINGS``, as text (None: unset), as the C ABI's
    /// ``gpufeed_loader_settings`` and ``gpufeed bench load --json`` print them.
    #[getter]
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.loader().settings().values() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// The dataset options in effect (format detected, defaults filled in): the same names
    /// and values `gpufeed inspect --json` prints under "options".
    #[getter]
    fn dataset_options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.loader().dataset().options().values() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// What indexing found wrong (a damaged header, an index line past its file…): one dict
    /// per problem (``message``, ``path``, ``offset``, ``sample``), the first 1000; the samples
    /// they cover are not in the dataset. ``problems_total`` counts them all.
    #[getter]
    fn problems<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.loader()
            .dataset()
            .problems()
            .iter()
            .map(|e| problem_dict(py, e))
            .collect()
    }

    #[getter]
    fn problems_total(&self) -> u64 {
        self.loader().dataset().problems_total()
    }

    /// What indexing noticed that is not damage (an empty file, files skipped…).
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.loader().dataset().notes().to_vec()
    }

    /// Samples recovered by resynchronisation (``tfrecord_recover=True``): their bytes check,
    /// but nothing proves they are records.
    #[getter]
    fn recovered(&self) -> usize {
        self.loader().dataset().recovered_count()
    }

    /// What happens to a rank's last, incomplete batch: "short", "drop" or "pad".
    #[getter]
    fn last_batch(&self) -> &str {
        &self.settings.last_batch
    }

    /// Samples this rank reads per epoch (padding included).
    #[getter]
    fn samples_per_epoch(&self) -> usize {
        self.loader().samples_per_epoch()
    }

    /// Bytes of each of the arena's slots (sized from the dataset and the batch size within
    /// ``memory_budget``), and how many there are.
    #[getter]
    fn slot_bytes(&self) -> (u64, usize) {
        (self.loader().slot_bytes(), self.loader().slots())
    }

    /// Decode threads (``images=`` loaders; 0 otherwise).
    #[getter]
    fn decode_threads(&self) -> usize {
        self.shared.images.as_ref().map_or(0, |il| il.threads())
    }

    /// The limit on each wait for a batch, in seconds (None: as long as it takes).
    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.loader().timeout().map(|t| t.as_secs_f64())
    }

    /// The epoch asked for ahead (``prefetch_next_epoch``), if one is.
    #[getter]
    fn prefetched_epoch(&self) -> Option<u64> {
        lock(&self.shared.ahead).as_ref().map(|(e, _)| *e)
    }

    /// The figures of the epoch being iterated (or the last one): samples, bytes, reads per
    /// sample, read amplification, the consumer's waiting split into storage / copy / verify /
    /// decode / other (``stall``, ``bound``), CPU seconds by thread, and the memory the loader
    /// holds (``memory``: arena, slot, index, device and decoded-batch bytes). A dict, for loggers.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = lock(&self.shared.last_stats).clone();
        stats_dict(py, &st)
    }

    /// Chooses the epoch the next pass reads (as ``DistributedSampler.set_epoch``). After
    /// ``load_state_dict``, setting the saved epoch keeps its resume point (the usual loop
    /// ``for epoch in range(start, E): loader.set_epoch(epoch)`` resumes where it stopped); any
    /// other epoch drops it, with a warning. Without ``set_epoch``, each finished pass is
    /// followed by the next epoch.
    fn set_epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<()> {
        let dropped = {
            let mut s = lock(&self.shared.state);
            let dropped = match s.resume {
                Some(b) if s.chosen && s.epoch != epoch && (b > 0 || !s.stops.is_empty()) => {
                    Some((s.epoch, b))
                }
                _ => None,
            };
            if s.epoch != epoch || !s.chosen {
                s.resume = s.resume.filter(|_| s.chosen && s.epoch == epoch);
                if s.resume.is_none() {
                    s.stops.clear();
                }
            }
            s.epoch = epoch;
            s.chosen = true;
            dropped
        };
        if let Some((e, b)) = dropped {
            let msg = format!(
                "gpufeed: set_epoch({epoch}) replaces the resume point load_state_dict set \
                 (epoch {e}, batch {b}): the next pass reads epoch {epoch} from its start. To \
                 resume, call set_epoch({e}) (or nothing) before iterating."
            );
            let msg = std::ffi::CString::new(msg).unwrap_or_default();
            PyErr::warn(
                py,
                &py.get_type::<pyo3::exceptions::PyUserWarning>(),
                &msg,
                1,
            )?;
        }
        Ok(())
    }

    /// Refused with what to do: a loader yields batches in an order of its own, so it is not
    /// a map-style dataset (a ``DataLoader`` given one indexes it).
    fn __getitem__(&self, _index: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(pyo3::exceptions::PyTypeError::new_err(
            "a gpufeed.Loader is iterated, not indexed (it yields whole batches in its own \
             order): iterate it directly (gpufeed.torch.batches(loader) gives torch tensors), or \
             give DataLoader gpufeed.torch.IterableDataset(loader) with batch_size=None",
        ))
    }

    /// Class names by label, where the dataset names them (an ImageFolder's subfolders, sorted
    /// as torchvision sorts them); empty where it does not (labels read from the data).
    /// A folder name that is not UTF-8 as ``os.fsdecode`` gives it (torchvision's name for it).
    #[getter]
    fn classes<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let ds = self.loader().dataset();
        (0..ds.classes().len())
            .map(|k| fs_str(py, ds.class_name_bytes(k)))
            .collect()
    }

    /// ``{class name: label}``, as torchvision's ``ImageFolder.class_to_idx``.
    #[getter]
    fn class_to_idx<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let ds = self.loader().dataset();
        for k in 0..ds.classes().len() {
            d.set_item(fs_str(py, ds.class_name_bytes(k))?, k)?;
        }
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let ds = self.loader().dataset();
        let s = &self.settings;
        let paths = self.init.bind(py).get_item("paths")?;
        let paths = match paths {
            Some(p) => gpufeed::error::redact(&p.repr()?.extract::<String>()?).into_owned(),
            None => "?".into(),
        };
        let classes = match ds.classes().len() {
            0 => String::new(),
            n => format!(", {n} classes"),
        };
        let images = match self.init.bind(py).get_item("images")? {
            Some(i) if !i.is_none() => format!(", images={}", i.repr()?.extract::<String>()?),
            _ => String::new(),
        };
        Ok(format!(
            "gpufeed.Loader({paths}: {} samples ({}{classes}), batch_size={}, order={:?}, \
             rank {} of {}, {} batch{} per epoch, last_batch={:?}, device={:?}{images})",
            s.samples,
            ds.format().name(),
            s.batch_size,
            s.order,
            s.rank,
            s.world_size,
            self.__len__(),
            if self.__len__() == 1 { "" } else { "es" },
            s.last_batch,
            match self.loader().settings().device {
                gpufeed::Device::Cuda(i) => format!("cuda:{i}"),
                gpufeed::Device::Host => "cpu".to_string(),
                _ => "simulated".to_string(),
            },
        ))
    }

    /// Batches per epoch for this rank.
    fn __len__(&self) -> usize {
        self.loader().batches_per_epoch() as usize
    }

    /// Samples in the dataset (all ranks).
    #[getter]
    fn num_samples(&self) -> usize {
        self.settings.samples
    }

    #[getter]
    fn rank(&self) -> u32 {
        self.settings.rank
    }

    #[getter]
    fn world_size(&self) -> u32 {
        self.settings.world_size
    }

    /// A pass over the chosen epoch (from the resume point after ``load_state_dict``). Reading
    /// starts at once. Another pass made or used while this one is unfinished parks it (its
    /// reading stops, its batches stay valid); using it again resumes it where it stood.
    fn __iter__(&self, py: Python<'_>) -> PyResult<PyEpoch> {
        if !self.worker_part.load(std::sync::atomic::Ordering::Relaxed) {
            refuse_in_torch_worker(py)?;
        }
        let plain = self.__len__() as u32;
        let loader = self.loader();
        let (epoch, stops, start) = lock(&self.shared.state)
            .begin_pass(|epoch, stops| {
                if stops.is_empty() {
                    Ok(plain)
                } else {
                    Ok(loader.plan_epoch_resumed(epoch, stops)?.batches())
                }
            })
            .map_err(err)?;
        let cursor = Arc::new(Mutex::new(Cursor {
            epoch,
            stops,
            next: start,
            inner: None,
            done: false,
            stats: gpufeed::LoaderStats::default(),
        }));
        let shared = self.shared.clone();
        let c = cursor.clone();
        // The GIL is released: asking for an epoch plans it, and parking another waits for its
        // reads in flight.
        py.detach(move || shared.activate(&c)).map_err(err)?;
        Ok(PyEpoch {
            cursor,
            shared: self.shared.clone(),
            dataset: self.loader().dataset().clone(),
            warned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Where iteration stands, for `load_state_dict` (the shape torchdata's
    /// `StatefulDataLoader` users expect: a plain dict). ``epoch`` and ``batch`` are where a
    /// run resumed from it starts: after the last batch yielded, the next epoch after a finished
    /// pass, or what ``set_epoch`` / ``load_state_dict`` chose. (In this process, a new pass
    /// after an unfinished one starts that epoch again, as a new `DataLoader` iterator does.)
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (epoch, stops, batch) = lock(&self.shared.state).saved_point();
        let d = PyDict::new(py);
        d.set_item("epoch", epoch)?;
        d.set_item("batch", batch)?;
        // Where the epoch stopped on other rank counts before this run resumed it (oldest
        // first): [world_size, batch] pairs.
        let stops: Vec<Vec<u32>> = stops.iter().map(|s| vec![s.world_size, s.batch]).collect();
        d.set_item("stops", stops)?;
        d.set_item("batch_size", self.settings.batch_size)?;
        d.set_item("order", &self.settings.order)?;
        d.set_item("seed", self.settings.seed)?;
        d.set_item("rank", self.settings.rank)?;
        d.set_item("world_size", self.settings.world_size)?;
        d.set_item("last_batch", &self.settings.last_batch)?;
        d.set_item("dataset_options", &self.settings.dataset_options)?;
        d.set_item("num_samples", self.settings.samples)?;
        d.set_item("order_params", &self.settings.order_params)?;
        d.set_item("dataset", &self.settings.dataset)?;
        d.set_item("order_version", gpufeed::plan::ORDER_VERSION)?;
        Ok(d)
    }

    /// Resumes from `state_dict()`: the next pass yields exactly the batches an uninterrupted
    /// run would from there (``set_epoch`` of the saved epoch keeps it). Settings that change
    /// the order must match — but the rank count may change: a state saved by one of W ranks
    /// that stopped together (as lockstep training does) resumes the epoch on this loader's
    /// ``world_size`` ranks, which then deliver every sample the epoch still owed exactly once
    /// between them (each loads the same state; with ``last_batch="pad"`` or ``"drop"`` every
    /// rank gets the same number of batches, repeats flagged as padding). The state they save
    /// names the stop (``stops``), so the run may stop and move again.
    fn load_state_dict(&self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            state
                .get_item(k)?
                .ok_or_else(|| PyValueError::new_err(format!("state has no {k:?}")))
        };
        // A field of the kind expected, or an error naming it.
        macro_rules! field {
            ($k:expr) => {{
                let v = get($k)?;
                v.extract().map_err(|_| {
                    PyValueError::new_err(format!(
                        "state's {:?} is {}, not what state_dict() saves there",
                        $k,
                        v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string())
                    ))
                })?
            }};
        }
        // Not a loader's state at all (an empty dict, another object's state).
        get("epoch")?;
        // Epoch orders change between versions: the same settings would give other batches.
        let version: u32 = match state.get_item("order_version")? {
            Some(v) => v.extract()?,
            None => 1,
        };
        // Version 3 changed only the shard-buffer order: a version 2 state of another order
        // resumes the same batches.
        let saved_order: Option<String> = match state.get_item("order")? {
            Some(o) => o.extract().ok(),
            None => None,
        };
        let same_batches = version == gpufeed::plan::ORDER_VERSION
            || (version == 2 && saved_order.as_deref() != Some("shard-buffer"));
        if !same_batches {
            return Err(PyValueError::new_err(format!(
                "this state was saved by a gpufeed whose epoch orders are version {version}; \
                 this one makes version {} (3: the shard-buffer order reads windows of its \
                 shards whole and shuffles them in memory; 2: the global order is computed \
                 position by position), so resuming would deliver other batches: finish the \
                 epoch with the gpufeed that saved it, or start epoch {} over with \
                 loader.set_epoch({})",
                gpufeed::plan::ORDER_VERSION,
                state.get_item("epoch")?.map_or(Ok(0u64), |e| e.extract())?,
                state.get_item("epoch")?.map_or(Ok(0u64), |e| e.extract())?,
            )));
        }
        let saved = Settings {
            batch_size: field!("batch_size"),
            order: field!("order"),
            seed: field!("seed"),
            rank: field!("rank"),
            world_size: field!("world_size"),
            last_batch: field!("last_batch"),
            dataset_options: field!("dataset_options"),
            samples: field!("num_samples"),
            order_params: match state.get_item("order_params")? {
                Some(v) => v.extract()?,
                None => self.settings.order_params.clone(),
            },
            dataset: match state.get_item("dataset")? {
                Some(v) => v.extract()?,
                None => self.settings.dataset.clone(),
            },
        };
        let epoch: u64 = field!("epoch");
        let batch: u32 = field!("batch");
        let mut stops: Vec<Stop> = match state.get_item("stops")? {
            None => Vec::new(),
            Some(v) => {
                let bad = || {
                    PyValueError::new_err("state's \"stops\" is not a list of [world_size, batch]")
                };
                let pairs: Vec<Vec<u32>> = v.extract().map_err(|_| bad())?;
                pairs
                    .into_iter()
                    .map(|p| match p[..] {
                        [world_size, batch] => Ok(Stop { world_size, batch }),
                        _ => Err(bad()),
                    })
                    .collect::<PyResult<_>>()?
            }
        };
        // A state saved on another rank count resumes the epoch here with its stop added (the
        // ranks stopped together, so any rank's state says where); on the same count, rank for
        // rank.
        let other_world = saved.world_size != self.settings.world_size;
        let same_but_ranks = Settings {
            rank: self.settings.rank,
            world_size: self.settings.world_size,
            ..saved.clone()
        };
        let mismatch = if other_world {
            same_but_ranks != self.settings
        } else {
            saved != self.settings
        };
        if mismatch
            && !other_world
            && (Settings {
                rank: self.settings.rank,
                ..saved.clone()
            }) == self.settings
        {
            return Err(PyValueError::new_err(format!(
                "this state was saved by rank {} of {}: on the same rank count each rank resumes \
                 from its own state — load rank {}'s here (a state moves to another rank only \
                 with another world_size)",
                saved.rank, saved.world_size, self.settings.rank
            )));
        }
        if mismatch {
            let compared = if other_world { &same_but_ranks } else { &saved };
            return Err(PyValueError::new_err(format!(
                "this state cannot resume this loader: {} — resuming would give other batches; \
                 make the loader with the settings the state was saved with{}",
                compared.differences(&self.settings).join("; "),
                if other_world {
                    " (the rank count may differ: the epoch's rest is shared among the new ranks)"
                } else {
                    ""
                }
            )));
        }
        let start = if !other_world {
            batch
        } else if batch == 0 && stops.is_empty() {
            0 // the epoch from its start, on this rank count
        } else {
            stops.push(Stop {
                world_size: saved.world_size,
                batch,
            });
            0
        };
        let batches = if stops.is_empty() {
            self.__len__() as u32
        } else {
            self.loader()
                .plan_epoch_resumed(epoch, &stops)
                .map_err(|e| PyValueError::new_err(format!("this state cannot resume: {e}")))?
                .batches()
        };
        if start > batches {
            return Err(PyValueError::new_err(format!(
                "batch {start} is past the epoch's {batches} batches"
            )));
        }
        let mut s = lock(&self.shared.state);
        s.epoch = epoch;
        s.stops = stops;
        s.resume = Some(start);
        s.chosen = true;
        Ok(())
    }

    /// The arguments this loader was made with (rank and world size resolved), as a new dict:
    /// ``gpufeed.Loader(**loader.init_kwargs())`` makes the same loader again.
    fn init_kwargs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.init.bind(py).copy()
    }

    /// Marks this loader as one DataLoader worker's own part of the data (what
    /// ``gpufeed.torch.IterableDataset`` makes in each worker), so iterating it there is allowed.
    fn _mark_worker_part(&self) {
        self.worker_part
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Pickling makes the loader anew on the other side (a spawn-started worker, say) from
    /// the same arguments, at the same point (``state_dict``); the arena, threads and reads in
    /// flight are not copied.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let rebuild = py.import("gpufeed")?.getattr("_rebuild_loader")?;
        let args = PyTuple::new(
            py,
            [
                self.init.bind(py).copy()?.into_any(),
                self.state_dict(py)?.into_any(),
            ],
        )?;
        PyTuple::new(py, [rebuild, args.into_any()])
    }
}

impl PyLoader {
    fn loader(&self) -> &Loader {
        &self.shared.loader
    }
}

/// Refuses a pass inside a PyTorch `DataLoader` worker that would read what every other
/// worker reads (each worker iterates its own copy of the dataset object): say what to do.
fn refuse_in_torch_worker(py: Python<'_>) -> PyResult<()> {
    let modules = py.import("sys")?.getattr("modules")?;
    let Ok(Some(data)) = modules.get_item("torch.utils.data").map(Some).or_else(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyKeyError>(py) {
            Ok(None)
        } else {
            Err(e)
        }
    }) else {
        return Ok(());
    };
    let info = data.getattr("get_worker_info")?.call0()?;
    if info.is_none() {
        return Ok(());
    }
    Err(GpufeedError::new_err(format!(
        "a gpufeed.Loader is iterated inside a torch DataLoader worker ({}): every worker \
         would read the whole epoch. gpufeed reads and decodes on its own threads, so iterate \
         it in the training process (DataLoader(..., num_workers=0) or no DataLoader at all: \
         gpufeed.torch.batches(loader)); to use workers anyway, wrap it in \
         gpufeed.torch.IterableDataset(loader), which gives each worker its own part",
        info.str()?
    )))
}

/// One pass over an epoch (``iter(loader)``).
#[pyclass(name = "_Epoch", module = "gpufeed")]
struct PyEpoch {
    cursor: Arc<Mutex<Cursor>>,
    shared: Arc<Shared>,
    dataset: Arc<Dataset>,
    /// A long wait was warned about in this pass.
    warned: std::sync::atomic::AtomicBool,
}

/// What one poll gave.
enum Polled {
    Batch(Next),
    Failed(gpufeed::Error),
    End,
    /// Nothing yet; a notice of a long wait blocked on memory, the first time.
    Waiting(Option<String>),
    /// Another pass parked this one.
    Parked,
}

#[pymethods]
impl PyEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let (shared, cursor) = (&self.shared, &self.cursor);
        loop {
            if !shared.is_active(cursor) || lock(cursor).inner.is_none() {
                if lock(cursor).done {
                    return Ok(None);
                }
                py.detach(|| shared.activate(cursor)).map_err(err)?;
            }
            // The GIL is released while the I/O thread fills the next batch (and the decode
            // threads decode it), in short waits so that Ctrl-C is seen.
            let polled = py.detach(|| {
                let mut c = lock(cursor);
                let c = &mut *c;
                if c.done {
                    return Polled::End;
                }
                let r = match c.inner.as_mut() {
                    None => return Polled::Parked,
                    Some(EpochKind::Bytes(e)) => {
                        let r = e.poll_next(POLL).map(|o| o.map(|r| r.map(Next::Bytes)));
                        c.stats = e.stats().clone();
                        match r {
                            Poll::Pending => return Polled::Waiting(e.stall_notice()),
                            Poll::Ready(r) => r,
                        }
                    }
                    Some(EpochKind::Images(e)) => {
                        let r = e.poll_next(POLL).map(|o| o.map(|r| r.map(Next::Images)));
                        c.stats = e.stats().clone();
                        match r {
                            Poll::Pending => return Polled::Waiting(None),
                            Poll::Ready(r) => r,
                        }
                    }
                };
                *lock(&shared.last_stats) = c.stats.clone();
                match r {
                    None => {
                        c.done = true;
                        c.inner = None;
                        Polled::End
                    }
                    Some(Err(e)) => Polled::Failed(e),
                    Some(Ok(b)) => {
                        c.next = b.index() + 1;
                        let mut s = lock(&shared.state);
                        s.iter_epoch = c.epoch;
                        s.yielded = c.next;
                        Polled::Batch(b)
                    }
                }
            });
            match polled {
                Polled::Batch(b) => return self.deliver(py, b).map(Some),
                Polled::Failed(e) => return Err(err(e)),
                Polled::End => return Ok(None),
                Polled::Parked => continue,
                Polled::Waiting(notice) => {
                    py.check_signals()?;
                    if let Some(n) = notice {
                        if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            let msg =
                                std::ffi::CString::new(format!("gpufeed: {n}")).unwrap_or_default();
                            let cat = py.get_type::<pyo3::exceptions::PyUserWarning>();
                            PyErr::warn(py, &cat, &msg, 1)?;
                        }
                    }
                }
            }
        }
    }

    /// What the pass delivered so far (samples, bytes, reads), where the consumer's waiting
    /// went (``stall``: storage, copy, verify, decode, other; ``bound``: the largest) and CPU
    /// seconds by thread.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = lock(&self.cursor).stats.clone();
        stats_dict(py, &st)
    }

    /// The epoch this pass reads.
    #[getter]
    fn epoch(&self) -> u64 {
        lock(&self.cursor).epoch
    }

    /// The index of the batch this pass yields next.
    #[getter]
    fn position(&self) -> u32 {
        lock(&self.cursor).next
    }
}

impl PyEpoch {
    /// The Python batch for `b`, or the SampleError its bad samples raise (``on_error="raise"``).
    fn deliver(&self, py: Python<'_>, b: Next) -> PyResult<Py<PyAny>> {
        let errors: Vec<String> = match &b {
            Next::Bytes(b) => b.errors().map(|(_, e)| e.report()).collect(),
            Next::Images(b) => b.errors().map(|(_, e)| e.report()).collect(),
        };
        let batch = match b {
            Next::Bytes(b) => Py::new(py, PyBatch::new(b, self.dataset.clone()))?.into_any(),
            Next::Images(b) => Py::new(py, PyImageBatch::new(b, self.dataset.clone()))?.into_any(),
        };
        if self.shared.raise_on_error {
            if let Some(first) = errors.first() {
                let more = if errors.len() > 1 {
                    format!(" (and {} more in this batch)", errors.len() - 1)
                } else {
                    String::new()
                };
                // The batch comes with the error: its good samples are intact, the bad ones
                // flagged (images zeroed, lengths -1), and the pass goes on at the next batch.
                let e = SampleError::new_err(python_spelling(&format!("{first}{more}")));
                let v = e.value(py);
                v.setattr("batch", batch.bind(py))?;
                v.setattr("errors", batch.bind(py).getattr("errors")?)?;
                return Err(e);
            }
        }
        Ok(batch)
    }
}

fn stats_dict<'py>(py: Python<'py>, st: &gpufeed::LoaderStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("batches", st.batches)?;
    d.set_item("samples", st.samples)?;
    d.set_item("padding", st.padding)?;
    d.set_item("sample_errors", st.sample_errors)?;
    d.set_item("bytes_delivered", st.bytes_delivered)?;
    d.set_item("bytes_read", st.bytes_read)?;
    d.set_item("reads", st.reads)?;
    d.set_item("reads_per_sample", st.reads_per_sample())?;
    d.set_item("read_amplification", st.read_amplification())?;
    d.set_item("consumer_wait_s", st.consumer_wait_s)?;
    d.set_item("stall", stall_dict(py, &st.stall)?)?;
    d.set_item("bound", st.stall.bound())?;
    d.set_item("io_thread_cpu_s", st.io_thread_cpu_s)?;
    d.set_item("consumer_cpu_s", st.consumer_cpu_s)?;
    d.set_item("check_cpu_s", st.check_cpu_s)?;
    d.set_item("decode_cpu_s", st.decode_cpu_s)?;
    d.set_item("engine", &st.engine)?;
    let m = PyDict::new(py);
    m.set_item("arena_bytes", st.memory.arena_bytes)?;
    m.set_item("slot_bytes", st.memory.slot_bytes)?;
    m.set_item("index_bytes", st.memory.index_bytes)?;
    m.set_item("device_bytes", st.memory.device_bytes)?;
    m.set_item("decode_bytes", st.memory.decode_bytes)?;
    d.set_item("memory", m)?;
    // The device image path: where its time went, phase by phase (None elsewhere).
    let phases = match &st.device_phases {
        None => None,
        Some(t) => {
            let p = PyDict::new(py);
            p.set_item("hardware_images", t.hardware_images)?;
            p.set_item("cpu_images", t.cpu_images)?;
            p.set_item("failed_images", t.failed_images)?;
            p.set_item("shared_cpu_ms_per_image", t.shared_cpu_ms_per_image)?;
            p.set_item("hardware_cpu_ms_per_image", t.hardware_cpu_ms_per_image)?;
            p.set_item("cpu_route_cpu_ms_per_image", t.cpu_route_cpu_ms_per_image)?;
            p.set_item("decode_threads_cpu_s", t.decode_threads_cpu_s)?;
            p.set_item("io_thread_cpu_s", t.io_thread_cpu_s)?;
            let rows = PyList::empty(py);
            for ph in &t.phases {
                let r = PyDict::new(py);
                r.set_item("phase", &ph.phase)?;
                r.set_item("thread", &ph.thread)?;
                r.set_item("wall_s", ph.wall_s)?;
                r.set_item("cpu_s", ph.cpu_s)?;
                r.set_item("count", ph.count)?;
                rows.append(r)?;
            }
            p.set_item("phases", rows)?;
            Some(p)
        }
    };
    d.set_item("device_phases", phases)?;
    Ok(d)
}

fn stall_dict<'py>(py: Python<'py>, s: &gpufeed::StallStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("storage_s", s.storage_s)?;
    d.set_item("remote_s", s.remote_s)?;
    d.set_item("copy_s", s.copy_s)?;
    d.set_item("verify_s", s.verify_s)?;
    d.set_item("decode_s", s.decode_s)?;
    d.set_item("other_s", s.other_s)?;
    d.set_item("total_s", s.total_s())?;
    Ok(d)
}

fn timing_dict<'py>(py: Python<'py>, t: &gpufeed::BatchTiming) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("stall", stall_dict(py, &t.stall)?)?;
    d.set_item("read_s", t.read_s)?;
    d.set_item("copy_s", t.copy_s)?;
    d.set_item("queue_s", t.queue_s)?;
    Ok(d)
}

/// An epoch of compressed batches, or of decoded image batches.
enum EpochKind {
    Bytes(Epoch),
    Images(ImageEpoch),
}

enum Next {
    Bytes(Batch),
    Images(ImageBatch),
}

impl Next {
    fn index(&self) -> u32 {
        match self {
            Next::Bytes(b) => b.index(),
            Next::Images(b) => b.index(),
        }
    }
}

/// A dtype's name as given and without a `torch.` prefix: a string ("float16"), a torch dtype
/// (`torch.float16`, whose str is "torch.float16"), a numpy dtype (`np.dtype("float16")`) or a
/// numpy scalar type (`np.float16`).
fn dtype_name(dtype: &Bound<'_, PyAny>) -> PyResult<(String, String)> {
    let name = if let Ok(s) = dtype.extract::<String>() {
        s
    } else if let Ok(n) = dtype
        .getattr("__name__")
        .and_then(|n| n.extract::<String>())
    {
        n // a numpy scalar type
    } else {
        dtype.str()?.extract::<String>()?
    };
    let bare = name.strip_prefix("torch.").unwrap_or(&name).to_string();
    Ok((name, bare))
}

/// The element type of token tensors: int64 (as nanoGPT's `get_batch` gives, the default)
/// or int32, each as a string, a torch dtype or a numpy dtype.
fn token_dtype(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let Some(dtype) = dtype.filter(|d| !d.is_none()) else {
        return Ok(true);
    };
    let (name, bare) = dtype_name(dtype)?;
    match bare.as_str() {
        "int64" | "long" => Ok(true),
        "int32" | "int" => Ok(false),
        _ => Err(PyValueError::new_err(format!(
            "dtype {name:?}: token tensors are \"int64\" (the default) or \"int32\" (a \
             string, a torch dtype such as torch.int64, or a numpy dtype)"
        ))),
    }
}

/// An output size as the image settings write it: one side (a square) or torchvision's
/// `(height, width)` as `HEIGHTxWIDTH`.
fn image_size(size: &Bound<'_, PyAny>) -> PyResult<String> {
    if size.cast::<pyo3::types::PyBool>().is_err() {
        if let Ok(side) = size.extract::<u32>() {
            return Ok(side.to_string());
        }
        if let Ok([h, w]) = size.extract::<[u32; 2]>() {
            return Ok(format!("{h}x{w}"));
        }
    }
    Err(PyValueError::new_err(format!(
        "size={}: an int (a square) or (height, width), as torchvision takes it",
        size.repr()?
    )))
}

/// A keyword argument of `Images` as the image settings' text: numbers and booleans as Rust
/// writes them, sequences joined by commas, a dtype by its name.
fn image_value(name: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if name == "size" {
        return image_size(v);
    }
    if name == "dtype" {
        return Ok(dtype_name(v)?.1);
    }
    if let Ok(b) = v.cast::<pyo3::types::PyBool>() {
        return Ok(b.is_true().to_string());
    }
    if let Ok(n) = v.extract::<u64>() {
        return Ok(n.to_string());
    }
    if let Ok(x) = v.extract::<f64>() {
        return Ok(x.to_string());
    }
    if let Ok(t) = v.extract::<String>() {
        return Ok(t);
    }
    if let Ok(xs) = v.extract::<Vec<f64>>() {
        return Ok(xs
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(","));
    }
    Err(PyValueError::new_err(format!(
        "{name}={}: expected {}",
        v.repr()?,
        IMAGE_SETTINGS
            .iter()
            .find(|s| s.name == name)
            .map_or("a value", |s| s.unit)
    )))
}

/// What decoded image batches look like (`Loader(images=Images(...))`).
#[pyclass(name = "Images", module = "gpufeed", frozen)]
struct PyImages {
    spec: ImageSpec,
    /// The arguments it was given (for pickling, and its repr).
    init: Py<PyDict>,
}

#[pymethods]
impl PyImages {
    /// Every argument is one of ``gpufeed.IMAGE_SETTINGS``; ``None`` is the table's default.
    #[new]
    #[pyo3(signature = (
        transform=None, size=None, dtype=None, layout=None, mean=None, std=None, threads=None,
        scale=None, ratio=None, flip_p=None, resize=None, dct_scaling=None, max_pixels=None,
        prefetch_batches=None, hardware_decoder=None
    ))]
    #[allow(
        clippy::too_many_arguments,
        reason = "Python's keyword arguments, as torchvision's transforms take them"
    )]
    fn new(
        py: Python<'_>,
        transform: Option<&Bound<'_, PyAny>>,
        size: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        layout: Option<&Bound<'_, PyAny>>,
        mean: Option<&Bound<'_, PyAny>>,
        std: Option<&Bound<'_, PyAny>>,
        threads: Option<&Bound<'_, PyAny>>,
        scale: Option<&Bound<'_, PyAny>>,
        ratio: Option<&Bound<'_, PyAny>>,
        flip_p: Option<&Bound<'_, PyAny>>,
        resize: Option<&Bound<'_, PyAny>>,
        dct_scaling: Option<&Bound<'_, PyAny>>,
        max_pixels: Option<&Bound<'_, PyAny>>,
        prefetch_batches: Option<&Bound<'_, PyAny>>,
        hardware_decoder: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let args = [
            ("transform", transform),
            ("size", size),
            ("dtype", dtype),
            ("layout", layout),
            ("mean", mean),
            ("std", std),
            ("threads", threads),
            ("scale", scale),
            ("ratio", ratio),
            ("flip_p", flip_p),
            ("resize", resize),
            ("dct_scaling", dct_scaling),
            ("max_pixels", max_pixels),
            ("prefetch_batches", prefetch_batches),
            ("hardware_decoder", hardware_decoder),
        ];
        let init = PyDict::new(py);
        let mut given: Vec<(&str, String)> = Vec::new();
        for (k, v) in args {
            let Some(v) = v.filter(|v| !v.is_none()) else {
                continue;
            };
            let text = image_value(k, v)?;
            // A dtype is kept by its name (a torch dtype does not pickle without torch).
            if k == "dtype" {
                init.set_item(k, &text)?;
            } else {
                init.set_item(k, v)?;
            }
            given.push((k, text));
        }
        let spec = ImageSpec::from_settings(&given).map_err(|e| {
            let mut m = python_spelling(&e.to_string());
            if m.starts_with("dtype") {
                m.push_str(" (a string, a torch dtype such as torch.float16, or a numpy dtype)");
            }
            PyValueError::new_err(m)
        })?;
        Ok(PyImages {
            spec,
            init: init.unbind(),
        })
    }

    /// The image settings in effect: the names and values of ``gpufeed.IMAGE_SETTINGS`` as
    /// text (None: not used by this transform), as the C ABI's
    /// ``gpufeed_loader_image_settings`` and ``gpufeed bench decode --json`` print them.
    #[getter]
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.spec.values() {
            if IMAGE_SETTINGS
                .iter()
                .any(|s| s.name == k && s.at(FrontDoor::Python))
            {
                d.set_item(k, v)?;
            }
        }
        Ok(d)
    }

    /// What it makes, as Python writes it: the transform, size (torchvision's
    /// `(height, width)`), dtype and layout, then the arguments given that differ from the
    /// table's defaults.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let init = self.init.bind(py);
        let values = self.spec.values();
        let text = |k: &str| {
            values
                .iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, v)| v.clone())
        };
        let (w, h) = self.spec.size;
        let size = if w == h {
            w.to_string()
        } else {
            format!("({h}, {w})")
        };
        let mut parts = vec![
            format!("'{}'", text("transform").unwrap_or_default()),
            format!("size={size}"),
            format!("dtype='{}'", self.spec.dtype.as_str()),
            format!("layout='{}'", self.spec.layout.as_str()),
        ];
        let defaults = ImageSpec::default().values();
        for (k, v) in &values {
            if ["transform", "size", "dtype", "layout"].contains(k) {
                continue;
            }
            let default = defaults
                .iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.clone());
            if let (Some(given), true) = (init.get_item(*k)?, *v != default) {
                parts.push(format!("{k}={}", given.repr()?.extract::<String>()?));
            }
        }
        Ok(format!("gpufeed.Images({})", parts.join(", ")))
    }

    /// Equal when they make the same images (every setting resolved: `Images("train")` equals
    /// `Images("train", size=224)`); an object of another type is not equal.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyImages>()
            .is_ok_and(|o| o.get().spec == self.spec)
    }

    /// A hash agreeing with `==` (the settings, as text).
    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.spec.values().hash(&mut h);
        h.finish()
    }

    /// Pickled by its arguments.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let rebuild = py.import("gpufeed")?.getattr("_rebuild")?;
        let cls = py.get_type::<PyImages>();
        let args = PyTuple::new(py, [cls.into_any(), self.init.bind(py).copy()?.into_any()])?;
        PyTuple::new(py, [rebuild, args.into_any()])
    }
}

/// A batch of decoded images: one tensor (``images``) plus labels, ids and errors.
#[pyclass(name = "ImageBatch", module = "gpufeed")]
struct PyImageBatch {
    batch: ImageBatch,
    dataset: Arc<Dataset>,
    labels: Arc<Vec<i64>>,
    ids: Arc<Vec<i64>>,
    padding: Arc<Vec<u8>>,
    failed: Arc<Vec<u8>>,
}

impl PyImageBatch {
    fn new(b: ImageBatch, dataset: Arc<Dataset>) -> PyImageBatch {
        PyImageBatch {
            labels: Arc::new(b.labels().to_vec()),
            ids: Arc::new(b.sample_ids().iter().map(|&i| i as i64).collect()),
            padding: Arc::new(b.padding_mask().iter().map(|&p| u8::from(p)).collect()),
            failed: Arc::new(
                (0..b.len())
                    .map(|i| u8::from(b.error(i).is_some()))
                    .collect(),
            ),
            batch: b,
            dataset,
        }
    }
}

#[pymethods]
impl PyImageBatch {
    fn __len__(&self) -> usize {
        self.batch.len()
    }

    /// The images: one tensor, [N, 3, H, W] (nchw) or [N, H, W, 3] (nhwc), of the dtype asked
    /// for, in host memory or — with ``device="cuda"`` — decoded on the GPU into device
    /// memory; ``torch.from_dlpack(batch.images)`` views it without a copy (on the GPU, torch's
    /// current stream waits for it). A sample that failed is zeros (``failed``, ``errors``).
    #[getter]
    fn images(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::Images(self.batch.clone()),
        }
    }

    /// Each sample's label (int64; −1 when none).
    #[getter]
    fn labels(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::I64(self.labels.clone()),
        }
    }

    fn __repr__(&self) -> String {
        let shape: Vec<String> = self.batch.shape().iter().map(|d| d.to_string()).collect();
        format!(
            "gpufeed.ImageBatch(epoch {}, batch {}: [{}] {} on {}, {} failed, {} padding)",
            self.batch.epoch(),
            self.batch.index(),
            shape.join(", "),
            self.batch.dtype().as_str(),
            self.device(),
            self.failed.iter().filter(|&&f| f != 0).count(),
            self.padding.iter().filter(|&&p| p != 0).count(),
        )
    }

    /// Each sample's index in the dataset (int64).
    #[getter]
    fn sample_ids(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::I64(self.ids.clone()),
        }
    }

    /// One flag per sample (uint8, 1 = padding, ``last_batch="pad"``).
    #[getter]
    fn padding(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::U8(self.padding.clone()),
        }
    }

    /// One flag per sample (uint8, 1 = it could not be read or decoded and is zeros).
    #[getter]
    fn failed(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::U8(self.failed.clone()),
        }
    }

    /// `(index, message)` of every sample that failed (with ``on_error="mark"``).
    #[getter]
    fn errors(&self) -> Vec<(usize, String)> {
        self.batch.errors().map(|(i, e)| (i, e.report())).collect()
    }

    /// Each sample's key (a name that is not UTF-8 as ``os.fsdecode`` gives it).
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.batch
            .sample_ids()
            .iter()
            .map(|&i| fs_str(py, &self.dataset.key_bytes(i as usize)))
            .collect()
    }

    /// The tensor's shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.batch.shape().to_vec()
    }

    /// Where the tensor is: ``"cpu"`` or ``"cuda:N"``.
    #[getter]
    fn device(&self) -> String {
        match self.batch.device() {
            Some(n) => format!("cuda:{n}"),
            None => "cpu".to_string(),
        }
    }

    /// How long the consumer waited for this batch and why (``stall``), and its read group's
    /// read, copy and queue times.
    #[getter]
    fn timing<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        timing_dict(py, self.batch.timing())
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.batch.epoch()
    }

    #[getter]
    fn index(&self) -> u32 {
        self.batch.index()
    }
}

/// A batch: its samples' bytes as one buffer with offsets and lengths, labels, keys.
#[pyclass(name = "Batch", module = "gpufeed")]
struct PyBatch {
    batch: Arc<Batch>,
    dataset: Arc<Dataset>,
    /// The span of the region the batch's samples occupy.
    lo: usize,
    hi: usize,
    offsets: Arc<Vec<i64>>,
    lengths: Arc<Vec<i64>>,
    labels: Arc<Vec<i64>>,
    ids: Arc<Vec<i64>>,
    padding: Arc<Vec<u8>>,
}

impl PyBatch {
    fn new(b: Batch, dataset: Arc<Dataset>) -> PyBatch {
        let ranges: Vec<Option<std::ops::Range<usize>>> =
            (0..b.len()).map(|i| b.sample_range(i).ok()).collect();
        let lo = ranges.iter().flatten().map(|r| r.start).min().unwrap_or(0);
        let hi = ranges.iter().flatten().map(|r| r.end).max().unwrap_or(lo);
        let offsets = ranges
            .iter()
            .map(|r| r.as_ref().map_or(0, |r| (r.start - lo) as i64))
            .collect();
        let lengths = ranges
            .iter()
            .map(|r| r.as_ref().map_or(-1, |r| r.len() as i64))
            .collect();
        PyBatch {
            labels: Arc::new(b.labels().to_vec()),
            ids: Arc::new(b.sample_ids().iter().map(|&i| i as i64).collect()),
            padding: Arc::new((0..b.len()).map(|i| u8::from(b.is_padding(i))).collect()),
            batch: Arc::new(b),
            dataset,
            lo,
            hi,
            offsets: Arc::new(offsets),
            lengths: Arc::new(lengths),
        }
    }
}

#[pymethods]
impl PyBatch {
    fn __len__(&self) -> usize {
        self.batch.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "gpufeed.Batch(epoch {}, batch {}: {} samples, {} bytes on {}, {} failed, {} \
             padding)",
            self.batch.epoch(),
            self.batch.index(),
            self.batch.len(),
            self.hi - self.lo,
            self.device(),
            self.lengths.iter().filter(|&&l| l < 0).count(),
            self.padding.iter().filter(|&&p| p != 0).count(),
        )
    }

    /// All samples' bytes, one uint8 buffer (host or device): sample `i` is
    /// `data[offsets[i] : offsets[i] + lengths[i]]`.
    #[getter]
    fn data(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::Region {
                batch: self.batch.clone(),
                offset: self.lo,
                len: self.hi - self.lo,
            },
        }
    }

    /// Where each sample starts in `data` (int64).
    #[getter]
    fn offsets(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::I64(self.offsets.clone()),
        }
    }

    /// Each sample's length (int64; −1 for a sample that failed, with `on_error="mark"`).
    #[getter]
    fn lengths(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::I64(self.lengths.clone()),
        }
    }

    /// Each sample's label (int64; −1 when none).
    #[getter]
    fn labels(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::I64(self.labels.clone()),
        }
    }

    /// One flag per sample (uint8, 1 = padding): a repeat that only evens out the ranks with
    /// ``last_batch="pad"``; drop these when evaluating.
    #[getter]
    fn padding(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::U8(self.padding.clone()),
        }
    }

    /// Each sample's index in the dataset (int64).
    #[getter]
    fn sample_ids(&self) -> PyBuffer {
        PyBuffer {
            mem: Mem::I64(self.ids.clone()),
        }
    }

    /// Each sample's key (a name that is not UTF-8 as ``os.fsdecode`` gives it).
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.batch
            .sample_ids()
            .iter()
            .map(|&i| fs_str(py, &self.dataset.key_bytes(i as usize)))
            .collect()
    }

    /// `(index, message)` of every sample that failed.
    #[getter]
    fn errors(&self) -> Vec<(usize, String)> {
        self.batch.errors().map(|(i, e)| (i, e.report())).collect()
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.batch.epoch()
    }

    #[getter]
    fn index(&self) -> u32 {
        self.batch.index()
    }

    /// How long the consumer waited for this batch and why (``stall``), and its read group's
    /// read, copy and queue times.
    #[getter]
    fn timing<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        timing_dict(py, self.batch.timing())
    }

    /// "cpu" or "cuda:N".
    #[getter]
    fn device(&self) -> String {
        match self.batch.device() {
            Some(d) => format!("cuda:{d}"),
            None => "cpu".into(),
        }
    }

    /// Tokens per window less one (the model's sequence length) for a token corpus read as
    /// windows (``format="tokens"``, or a Megatron prefix with ``seq_len``); else None.
    #[getter]
    fn seq_len(&self) -> Option<u32> {
        self.dataset
            .token_layout()
            .and_then(|l| l.window)
            .map(|w| w - 1)
    }

    /// The element type of a token corpus as numpy names it (``"uint16"``…); else None.
    #[getter]
    fn token_dtype(&self) -> Option<&'static str> {
        self.dataset.token_layout().map(|l| l.dtype)
    }

    /// A token corpus's batch as one ``[N, seq_len + 1]`` tensor of token ids (``int64``, or
    /// ``dtype="int32"``), widened from the file's own element type in one pass: row ``i`` is
    /// sample ``i``'s window. A sample that failed (``on_error="mark"``) is a row of zeros.
    /// Host batches; a batch on the GPU goes through ``gpufeed.torch``.
    #[pyo3(signature = (dtype=None))]
    fn tokens(&self, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<PyBuffer> {
        let wide = token_dtype(dtype)?;
        let (rows, t) = self.token_rows()?;
        let shape = vec![self.batch.len(), t];
        Ok(PyBuffer {
            mem: token_mem(rows, shape, wide)?,
        })
    }

    /// ``(x, y)``: the inputs and targets of a token corpus's batch, each ``[N, seq_len]``
    /// (``int64``, or ``dtype="int32"``), ``y`` shifted by one — what nanoGPT's ``get_batch``
    /// gives — from the batch in one pass (see :meth:`tokens`).
    #[pyo3(signature = (dtype=None))]
    fn pairs(&self, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<(PyBuffer, PyBuffer)> {
        let wide = token_dtype(dtype)?;
        let (rows, t) = self.token_rows()?;
        let n = self.batch.len();
        let s = t - 1;
        let (mut x, mut y) = (Vec::with_capacity(n * s), Vec::with_capacity(n * s));
        for r in rows.chunks_exact(t) {
            x.extend_from_slice(&r[..s]);
            y.extend_from_slice(&r[1..]);
        }
        Ok((
            PyBuffer {
                mem: token_mem(x, vec![n, s], wide)?,
            },
            PyBuffer {
                mem: token_mem(y, vec![n, s], wide)?,
            },
        ))
    }

    /// Sample `i`'s bytes, copied (host batches).
    fn sample<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyBytes>> {
        if i >= self.batch.len() {
            return Err(PyIndexError::new_err(format!(
                "sample {i} of a batch of {}",
                self.batch.len()
            )));
        }
        match self.batch.sample(i) {
            Ok(s) => Ok(PyBytes::new(py, s)),
            Err(e) => Err(SampleError::new_err(e.report())),
        }
    }
}

impl PyBatch {
    /// The batch's token windows, widened to i64, and the tokens per window.
    fn token_rows(&self) -> PyResult<(Vec<i64>, usize)> {
        let layout = self.dataset.token_layout().ok_or_else(|| {
            PyValueError::new_err(
                "tokens()/pairs() need a token corpus (format=\"tokens\" or a Megatron \
                 prefix); this batch's dataset holds other samples",
            )
        })?;
        let t = layout.window.ok_or_else(|| {
            PyValueError::new_err(
                "tokens()/pairs(): a Megatron dataset opened without seq_len holds sequences of \
                 different lengths; open it with seq_len=N for windows of N + 1 tokens, or read \
                 data, offsets and lengths",
            )
        })? as usize;
        if !layout.is_integer() {
            return Err(PyValueError::new_err(format!(
                "tokens()/pairs(): the dataset stores {}, not token ids",
                layout.dtype
            )));
        }
        if t < 2 {
            return Err(PyValueError::new_err(
                "tokens()/pairs(): windows of one token have no target",
            ));
        }
        if self.batch.region_bytes().is_none() {
            return Err(PyValueError::new_err(
                "tokens()/pairs() read host batches; this one is on the GPU: \
                 gpufeed.torch.token_pairs(batch) makes the pairs there",
            ));
        }
        let n = self.batch.len();
        let mut rows = vec![0i64; n * t];
        for (i, row) in rows.chunks_exact_mut(t).enumerate() {
            // A failed sample (on_error="mark") stays a row of zeros; `lengths` says -1.
            if let Ok(bytes) = self.batch.sample(i) {
                layout.read(bytes, row).map_err(err)?;
            }
        }
        Ok((rows, t))
    }
}

/// Token ids as a tensor of `shape`: int64 as they are, or int32 (each checked to fit).
fn token_mem(v: Vec<i64>, shape: Vec<usize>, wide: bool) -> PyResult<Mem> {
    if wide {
        return Ok(Mem::I64Nd(Arc::new(v), shape));
    }
    let narrow = v
        .iter()
        .map(|&x| i32::try_from(x))
        .collect::<Result<Vec<i32>, _>>()
        .map_err(|_| PyValueError::new_err("a token id does not fit int32: use dtype=\"int64\""))?;
    Ok(Mem::I32Nd(Arc::new(narrow), shape))
}

enum Mem {
    /// Token ids, N-D (int64 / int32).
    I64Nd(Arc<Vec<i64>>, Vec<usize>),
    I32Nd(Arc<Vec<i32>>, Vec<usize>),
    Region {
        batch: Arc<Batch>,
        offset: usize,
        len: usize,
    },
    I64(Arc<Vec<i64>>),
    U8(Arc<Vec<u8>>),
    /// A decoded batch's tensor (N-D).
    Images(ImageBatch),
}

/// The DLPack element type of a pixel type.
fn dl_dtype(t: PixelType) -> dlpack::DLDataType {
    match t {
        PixelType::U8 => dlpack::UINT8,
        PixelType::F16 => dlpack::FLOAT16,
        PixelType::Bf16 => dlpack::BFLOAT16,
        PixelType::F32 => dlpack::FLOAT32,
    }
}

/// A buffer implementing the DLPack protocol (`__dlpack__`, `__dlpack_device__`).
#[pyclass(name = "Buffer", module = "gpufeed")]
struct PyBuffer {
    mem: Mem,
}

impl PyBuffer {
    /// (data pointer, element count, DLPack device).
    fn raw(&self) -> (u64, usize, DLDevice) {
        match &self.mem {
            Mem::Region { batch, offset, len } => {
                match (batch.region_bytes(), batch.device_ptr()) {
                    (Some(b), _) => (b.as_ptr() as u64 + *offset as u64, *len, HOST),
                    (None, Some(p)) => (
                        p + *offset as u64,
                        *len,
                        DLDevice {
                            device_type: dlpack::KDL_CUDA,
                            device_id: batch.device().unwrap_or(0) as i32,
                        },
                    ),
                    (None, None) => (0, *len, HOST),
                }
            }
            Mem::I64(v) | Mem::I64Nd(v, _) => (v.as_ptr() as u64, v.len(), HOST),
            Mem::I32Nd(v, _) => (v.as_ptr() as u64, v.len(), HOST),
            Mem::U8(v) => (v.as_ptr() as u64, v.len(), HOST),
            Mem::Images(b) => match b.device_ptr() {
                Some(p) => (
                    p,
                    b.shape().iter().product(),
                    DLDevice {
                        device_type: dlpack::KDL_CUDA,
                        device_id: b.device().unwrap_or(0) as i32,
                    },
                ),
                None => (b.as_ptr() as u64, b.shape().iter().product(), HOST),
            },
        }
    }
}

/// Host memory, as DLPack names it.
const HOST: DLDevice = DLDevice {
    device_type: dlpack::KDL_CPU,
    device_id: 0,
};

const CAPSULE: &CStr = c"dltensor";

/// Frees an unconsumed tensor (a consumer renames the capsule to `used_dltensor` and owns it).
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with a live capsule; IsValid sets no exception.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let t =
                pyo3::ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = t.as_ref().and_then(|t| t.deleter) {
                d(t);
            }
        }
    }
}

#[pymethods]
impl PyBuffer {
    /// Exports the buffer as a DLPack capsule (the consumer keeps gpufeed's memory alive).
    /// On a CUDA device the consumer's `stream` waits for the batch's copy (None or 1: the
    /// legacy default stream, 2: per-thread, −1: no wait); the host never blocks.
    #[pyo3(signature = (stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = max_version; // we produce the unversioned (v0.8) capsule, which the spec allows
        let (ptr, len, dev) = self.raw();
        if let Some((t, id)) = dl_device {
            if (t, id) != (dev.device_type, dev.device_id) {
                return Err(pyo3::exceptions::PyBufferError::new_err(
                    "gpufeed buffers are exported on their own device only",
                ));
            }
        }
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "gpufeed exports without copying (copy=True is not supported)",
            ));
        }
        let (owner, dtype): (Box<dyn std::any::Any + Send>, _) = match &self.mem {
            Mem::Region { batch, .. } => {
                if dev.device_type == dlpack::KDL_CUDA {
                    match stream {
                        // No wait asked; the region's reuse still waits for the legacy
                        // stream's work (where a consumer that names no stream runs).
                        // SAFETY: the legacy stream is valid in every context and never dies.
                        Some(-1) => unsafe { batch.release_after(1) },
                        // SAFETY: DLPack's contract: the consumer passes a stream of its own on
                        // this device (or 1/2, the legacy and per-thread defaults; none means
                        // the legacy one) that outlives its use of the tensor, which holds
                        // this batch alive until the consumer releases it.
                        s => unsafe { batch.wait_on(s.unwrap_or(1) as u64) }.map_err(err)?,
                    }
                }
                (Box::new(batch.clone()), dlpack::UINT8)
            }
            Mem::I64(v) | Mem::I64Nd(v, _) => (Box::new(v.clone()), dlpack::INT64),
            Mem::I32Nd(v, _) => (Box::new(v.clone()), dlpack::INT32),
            Mem::U8(v) => (Box::new(v.clone()), dlpack::UINT8),
            Mem::Images(b) => {
                if dev.device_type == dlpack::KDL_CUDA {
                    match stream {
                        // SAFETY: as for a byte batch above (the legacy stream).
                        Some(-1) => unsafe { b.release_after(1) },
                        // SAFETY: as for a byte batch above: the consumer's stream outlives
                        // its use of the tensor, which keeps the batch's tensor alive.
                        s => unsafe { b.wait_on(s.unwrap_or(1) as u64) }.map_err(err)?,
                    }
                }
                (b.keep_alive(), dl_dtype(b.dtype()))
            }
        };
        let t = match &self.mem {
            Mem::Images(b) => {
                let shape: Vec<i64> = b.shape().iter().map(|&d| d as i64).collect();
                // SAFETY: `owner` keeps the tensor (shape's product of elements at `ptr`)
                // alive until the deleter runs.
                unsafe { dlpack::export_nd(owner, ptr as *mut c_void, dev, dtype, &shape) }
            }
            Mem::I64Nd(_, shape) | Mem::I32Nd(_, shape) => {
                let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                // SAFETY: `owner` keeps the vector (shape's product of elements at `ptr`)
                // alive until the deleter runs.
                unsafe { dlpack::export_nd(owner, ptr as *mut c_void, dev, dtype, &shape) }
            }
            // SAFETY: `owner` keeps the `len` elements at `ptr` alive (the batch's region, or
            // the vector) until the tensor's deleter runs.
            _ => unsafe { dlpack::export(owner, ptr as *mut c_void, dev, dtype, len) },
        };
        // SAFETY: a new capsule owning `t`; the destructor frees it unless a consumer took it.
        unsafe {
            let cap = pyo3::ffi::PyCapsule_New(
                t as *mut c_void,
                CAPSULE.as_ptr(),
                Some(capsule_destructor),
            );
            if cap.is_null() {
                if let Some(d) = (*t).deleter {
                    d(t);
                }
            }
            Bound::from_owned_ptr_or_err(py, cap)
        }
    }

    /// `(device_type, device_id)`: (1, 0) for host memory, (2, N) for CUDA device N.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let (_, _, d) = self.raw();
        (d.device_type, d.device_id)
    }

    fn __len__(&self) -> usize {
        self.raw().1
    }

    /// Address of the first element (host or device).
    #[getter]
    fn ptr(&self) -> u64 {
        self.raw().0
    }

    /// "uint8", "int64", or an image tensor's "float16", "bfloat16", "float32".
    #[getter]
    fn dtype(&self) -> &'static str {
        match &self.mem {
            Mem::Region { .. } | Mem::U8(_) => "uint8",
            Mem::I64(_) | Mem::I64Nd(..) => "int64",
            Mem::I32Nd(..) => "int32",
            Mem::Images(b) => b.dtype().as_str(),
        }
    }

    /// The shape (one extent, but for an image tensor).
    #[getter]
    fn shape(&self) -> Vec<usize> {
        match &self.mem {
            Mem::Images(b) => b.shape().to_vec(),
            Mem::I64Nd(_, shape) | Mem::I32Nd(_, shape) => shape.clone(),
            _ => vec![self.raw().1],
        }
    }

    /// Bytes in the buffer.
    #[getter]
    fn nbytes(&self) -> usize {
        match &self.mem {
            Mem::Region { len, .. } => *len,
            Mem::I64(v) | Mem::I64Nd(v, _) => v.len() * 8,
            Mem::I32Nd(v, _) => v.len() * 4,
            Mem::U8(v) => v.len(),
            Mem::Images(b) => b.bytes().len(),
        }
    }

    /// The elements as a list (int64 buffers, or host uint8).
    fn tolist(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.mem {
            Mem::I64(v) => Ok(v.as_ref().clone().into_pyobject(py)?.into_any().unbind()),
            Mem::I64Nd(v, shape) => Ok(nested(py, v, shape[1])?),
            Mem::I32Nd(v, shape) => Ok(nested(py, v, shape[1])?),
            Mem::U8(v) => {
                let ints = v.iter().map(|&x| u32::from(x));
                Ok(pyo3::types::PyList::new(py, ints)?.into_any().unbind())
            }
            Mem::Region { .. } => {
                let ints = self.host_bytes()?.into_iter().map(u32::from);
                Ok(pyo3::types::PyList::new(py, ints)?.into_any().unbind())
            }
            Mem::Images(_) => Err(PyValueError::new_err(
                "an image tensor: use numpy.from_dlpack or torch.from_dlpack",
            )),
        }
    }

    /// The bytes, copied (host buffers).
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        match &self.mem {
            Mem::I64(v) | Mem::I64Nd(v, _) => Ok(PyBytes::new(
                py,
                &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
            )),
            Mem::I32Nd(v, _) => Ok(PyBytes::new(
                py,
                &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
            )),
            Mem::Region { .. } => Ok(PyBytes::new(py, &self.host_bytes()?)),
            Mem::U8(v) => Ok(PyBytes::new(py, v)),
            Mem::Images(b) => Ok(PyBytes::new(py, b.bytes())),
        }
    }

    fn __repr__(&self) -> String {
        let (_, len, d) = self.raw();
        format!(
            "gpufeed.Buffer({} × {}, device=({}, {}))",
            len,
            self.dtype(),
            d.device_type,
            d.device_id
        )
    }
}

impl PyBuffer {
    fn host_bytes(&self) -> PyResult<Vec<u8>> {
        match &self.mem {
            Mem::Region { batch, offset, len } => match batch.region_bytes() {
                Some(b) => Ok(b[*offset..*offset + *len].to_vec()),
                None => Err(PyValueError::new_err(
                    "a device buffer: use from_dlpack with a device framework",
                )),
            },
            _ => Err(PyValueError::new_err("not a batch's byte buffer")),
        }
    }
}

/// Rows of `cols` elements as a list of lists.
fn nested<T>(py: Python<'_>, v: &[T], cols: usize) -> PyResult<Py<PyAny>>
where
    T: Copy + for<'a> IntoPyObject<'a>,
{
    let rows = v
        .chunks(cols.max(1))
        .map(|r| pyo3::types::PyList::new(py, r.iter().copied()))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(pyo3::types::PyList::new(py, rows)?.into_any().unbind())
}

/// Whether a CUDA GPU is usable, and why not (never raises for lack of a GPU).
#[pyfunction]
fn gpu_available() -> (bool, String) {
    match gpufeed::gpu_available() {
        Ok(i) => (true, format!("{} (driver {})", i.name, i.driver_version)),
        Err(e) => (false, e.report()),
    }
}

/// Sends the reports of long work (indexing a dataset of many files) to ``callback(what, done,
/// total, unit, finished)`` instead of a line on stderr; ``None`` restores the line. Reports come
/// at most every 100 ms per piece of work, plus a last one with ``finished=True``, from the
/// thread doing the work; an exception in the callback is printed and ignored.
#[pyfunction]
#[pyo3(signature = (callback))]
fn set_progress(callback: Option<Py<PyAny>>) {
    let f: Option<gpufeed::ProgressFn> = callback.map(|cb| {
        let f: gpufeed::ProgressFn = Arc::new(move |e: &gpufeed::ProgressEvent<'_>| {
            Python::attach(|py| {
                if let Err(err) = cb.call1(py, (e.what, e.done, e.total, e.unit, e.finished)) {
                    err.print(py);
                }
            })
        });
        f
    });
    gpufeed::set_progress(f);
}

/// One path (str or os.PathLike), or a sequence of them; not none.
fn path_list(paths: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    let list: Vec<PathBuf> = match paths.extract::<PathBuf>() {
        Ok(p) => vec![p],
        Err(_) => paths
            .extract()
            .map_err(|_| PyValueError::new_err("paths: a path, or a list of paths"))?,
    };
    if list.is_empty() {
        return Err(PyValueError::new_err("paths is empty"));
    }
    Ok(list)
}

/// One problem or bad sample as a dict: message, path, offset, sample.
fn problem_dict<'py>(py: Python<'py>, e: &gpufeed::Error) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("message", e.report())?;
    // As the CLI's JSON says it: a remote object by its URL, not its node-cache copy.
    d.set_item("path", e.shown_path())?;
    d.set_item("offset", e.offset())?;
    d.set_item("sample", e.sample())?;
    Ok(d)
}

/// Reads and checks every sample of a dataset, as ``gpufeed verify`` does: checksums and frames
/// where the format has them, and whether each image is what its name claims (no decode);
/// what indexing found wrong counts too. Returns a dict: ``samples``, ``files``, ``checksums``,
/// ``ok``, ``bad_total`` and ``bad`` (the first 1000 bad samples or files, each a dict with
/// ``message``, ``path``, ``offset``, ``sample``). The dataset options are keyword arguments.
#[pyfunction]
#[pyo3(signature = (paths, **dataset))]
fn verify<'py>(
    py: Python<'py>,
    paths: &Bound<'py, PyAny>,
    dataset: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = dataset_options(dataset)?;
    let path_list = path_list(paths)?;
    let report = py
        .detach(|| gpufeed::dataset::verify(&path_list, &opts, &mut |_, _| {}))
        .map_err(err)?;
    let d = PyDict::new(py);
    d.set_item("samples", report.samples)?;
    d.set_item("files", report.files)?;
    d.set_item("checksums", report.checksums)?;
    d.set_item("ok", report.ok())?;
    d.set_item("bad_total", report.bad_total)?;
    let bad = pyo3::types::PyList::empty(py);
    for e in &report.bad {
        bad.append(problem_dict(py, e)?)?;
    }
    d.set_item("bad", bad)?;
    Ok(d)
}

#[pymodule]
fn _gpufeed(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoader>()?;
    m.add_class::<PyEpoch>()?;
    m.add_class::<PyBatch>()?;
    m.add_class::<PyBuffer>()?;
    m.add_class::<PyImages>()?;
    m.add_class::<PyImageBatch>()?;
    m.add_function(wrap_pyfunction!(gpu_available, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(set_progress, m)?)?;
    m.add("GpufeedError", m.py().get_type::<GpufeedError>())?;
    m.add("SampleError", m.py().get_type::<SampleError>())?;
    m.add("DatasetWarning", m.py().get_type::<DatasetWarning>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The dataset options Loader takes as keyword arguments: name → (default, help), the same
    // table as the CLI's flags and the C options struct.
    let table = PyDict::new(m.py());
    for o in DATASET_OPTIONS {
        table.set_item(o.name, (o.default, o.help))?;
    }
    m.add("DATASET_OPTIONS", table)?;
    // The loader settings: name → (default, unit, help), the table the C options struct and
    // the CLI's flags follow too.
    let table = PyDict::new(m.py());
    for o in LOADER_SETTINGS {
        table.set_item(o.name, (o.default, o.unit, o.help))?;
    }
    m.add("LOADER_SETTINGS", table)?;
    // The image settings `Images` takes: name → (default, unit, help), the table the C
    // `gpufeed_images` struct and `gpufeed bench decode`'s flags follow too.
    let table = PyDict::new(m.py());
    for o in IMAGE_SETTINGS.iter().filter(|o| o.at(FrontDoor::Python)) {
        table.set_item(o.name, (o.default, o.unit, o.help))?;
    }
    m.add("IMAGE_SETTINGS", table)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::python_spelling;

    #[test]
    fn command_line_flags_read_as_keyword_arguments() {
        assert_eq!(
            python_spelling(
                "name it with --format (packed, tokens); flat token files always need --format \
                 tokens: x.bin"
            ),
            "name it with format= (packed, tokens); flat token files always need \
             format=\"tokens\": x.bin"
        );
        assert_eq!(
            python_spelling("wrong --token-dtype? or --seq-len 64, --batch-size"),
            "wrong token_dtype=? or seq_len=64, batch_size="
        );
        assert_eq!(python_spelling("a -- b --unknown"), "a -- b --unknown");
        assert_eq!(
            python_spelling("/data/x--format/y --format"),
            "/data/x--format/y format="
        );
    }
}
