//! `gpufeed._gpufeed`: the Python binding (PyO3, abi3 for CPython ≥ 3.9).
//!
//! Batches are handed over without a copy: `Batch.data` and the offsets, lengths and labels are
//! `Buffer`s that implement the DLPack protocol, so `torch.from_dlpack`, `numpy.from_dlpack`,
//! `cupy.from_dlpack` and `jax.dlpack` view gpufeed's memory. A buffer keeps its batch's memory
//! alive until the last consumer releases it. The GIL is released while waiting for data; no
//! Python code runs per sample.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gpufeed::dataset::{OpenOptions, DATASET_OPTIONS};
use gpufeed::decode::{
    ImageBatch, ImageEpoch, ImageLoader, ImageSpec, Layout, PixelType, Transform,
};
use gpufeed::dlpack::{self, DLDevice, DLManagedTensor};
use gpufeed::{Batch, Dataset, Device, Epoch, LastBatch, Loader, Order};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

create_exception!(
    _gpufeed,
    GpufeedError,
    PyException,
    "An error from gpufeed; the message names the file, the sample and what was wrong."
);
create_exception!(
    _gpufeed,
    DatasetWarning,
    pyo3::exceptions::PyUserWarning,
    "Indexing a dataset found damage: the samples it covers are not in the dataset."
);
create_exception!(
    _gpufeed,
    SampleError,
    GpufeedError,
    "A batch held a sample that could not be read or failed its checksum."
);

fn err(e: gpufeed::Error) -> PyErr {
    GpufeedError::new_err(e.report())
}

/// Where an epoch stands: the epoch `set_epoch` chose, a resume point, batches yielded.
#[derive(Debug, Default)]
struct State {
    epoch: u64,
    resume: Option<u32>,
    /// Epoch and batches yielded of the iteration in progress (or last finished).
    iter_epoch: u64,
    yielded: u32,
}

/// An epoch-by-epoch loader over a dataset.
#[pyclass(name = "Loader", module = "gpufeed._gpufeed")]
struct PyLoader {
    loader: Loader,
    /// The latest epoch's figures, updated as it is iterated.
    last_stats: Arc<Mutex<gpufeed::LoaderStats>>,
    /// With `images=`: the decode stage over `loader`.
    images: Option<ImageLoader>,
    state: Arc<Mutex<State>>,
    /// With `prefetch_next_epoch`: the epoch after the one being iterated, asked for when that
    /// one started, so its first batches are read while this one's last are used.
    ahead: Mutex<Option<(u64, Epoch)>>,
    prefetch_next_epoch: bool,
    raise_on_error: bool,
    settings: Settings,
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
}

fn env_u32(name: &str) -> PyResult<Option<u32>> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| PyValueError::new_err(format!("{name}={v:?} is not an integer"))),
        Err(_) => Ok(None),
    }
}

fn parse_device(device: &str) -> PyResult<Device> {
    match device {
        "cpu" => Ok(Device::Host),
        "cuda" => Ok(Device::Cuda(env_u32("LOCAL_RANK")?.unwrap_or(0))),
        d => match d.strip_prefix("cuda:").map(str::parse::<u32>) {
            Some(Ok(i)) => Ok(Device::Cuda(i)),
            _ => Err(PyValueError::new_err(format!(
                "device {device:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
            ))),
        },
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
        "gpufeed: indexing {what} found {total} problem(s); the samples they cover are not in \
         the dataset ({} samples are). First: {}{}. All of them: Loader.problems; refuse such \
         a dataset with strict=True.",
        ds.len(),
        first.join("; "),
        if total > 3 { "; …" } else { "" }
    );
    let category = py.get_type::<DatasetWarning>();
    let msg = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    PyErr::warn(py, &category, &msg, 1)
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
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "Loader() got an unexpected keyword argument {name:?}; the dataset options \
                     are {}",
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

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (
        paths, batch_size, order="global", seed=0, rank=None, world_size=None, device="cpu",
        prefetch=2, last_batch=None, drop_last=None, verify=true, on_error="raise",
        shuffle_buffer=None, block_bytes=None, open_blocks=None, queue_depth=None,
        memory_budget=None, prefetch_next_epoch=false, images=None, **dataset
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        paths: &Bound<'_, PyAny>,
        batch_size: u32,
        order: &str,
        seed: u64,
        rank: Option<u32>,
        world_size: Option<u32>,
        device: &str,
        prefetch: u32,
        last_batch: Option<&str>,
        drop_last: Option<bool>,
        verify: bool,
        on_error: &str,
        shuffle_buffer: Option<u32>,
        block_bytes: Option<u64>,
        open_blocks: Option<u32>,
        queue_depth: Option<u32>,
        memory_budget: Option<u64>,
        prefetch_next_epoch: bool,
        images: Option<PyRef<'_, PyImages>>,
        dataset: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let image_spec = images.map(|i| i.spec.clone());
        let last = match (last_batch, drop_last) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "give last_batch or drop_last (its alias), not both",
                ))
            }
            (Some(l), None) => {
                LastBatch::parse(l).map_err(|e| PyValueError::new_err(e.to_string()))?
            }
            (None, Some(true)) => LastBatch::Drop,
            (None, _) => LastBatch::Short,
        };
        let opts = dataset_options(dataset)?;
        let mut ord = Order::parse(order).map_err(|e| PyValueError::new_err(e.to_string()))?;
        match &mut ord {
            Order::ShardBuffer { buffer } => *buffer = shuffle_buffer.unwrap_or(*buffer),
            Order::Block {
                block_bytes: b,
                open_blocks: o,
            } => {
                *b = block_bytes.unwrap_or(*b);
                *o = open_blocks.unwrap_or(*o);
            }
            Order::Global => {}
        }
        let raise_on_error = match on_error {
            "raise" => true,
            "mark" => false,
            _ => {
                return Err(PyValueError::new_err(
                    "on_error must be \"raise\" or \"mark\"",
                ))
            }
        };
        // torch.distributed's environment when not given.
        let world_size = match world_size {
            Some(w) => w,
            None => env_u32("WORLD_SIZE")?.unwrap_or(1),
        };
        let rank = match rank {
            Some(r) => r,
            None => env_u32("RANK")?.unwrap_or(0),
        };
        let dev = parse_device(device)?;
        // One path (str or os.PathLike), or a sequence of them.
        let paths: Vec<PathBuf> = match paths.extract::<PathBuf>() {
            Ok(p) => vec![p],
            Err(_) => paths
                .extract()
                .map_err(|_| PyValueError::new_err("paths: a path, or a list of paths"))?,
        };
        if paths.is_empty() {
            return Err(PyValueError::new_err("paths is empty"));
        }
        let loader = py
            .detach(|| -> gpufeed::Result<Loader> {
                let ds = Dataset::open_paths(&paths, &opts)?;
                let mut b = Loader::builder(ds)
                    .batch_size(batch_size)
                    .order(ord)
                    .seed(seed)
                    .rank(rank, world_size)
                    .last_batch(last)
                    .prefetch_groups(prefetch)
                    .verify_checksums(verify)
                    .device(dev);
                if let Some(q) = queue_depth {
                    b = b.queue_depth(q);
                }
                if let Some(m) = memory_budget {
                    b = b.memory_budget(m);
                }
                b.build()
            })
            .map_err(err)?;
        let samples = loader.dataset().len();
        warn_problems(py, loader.dataset(), &paths)?;
        let images = match image_spec {
            Some(spec) => Some(loader.decode_images(spec).map_err(err)?),
            None => None,
        };
        Ok(PyLoader {
            last_stats: Arc::default(),
            images,
            state: Arc::default(),
            ahead: Mutex::new(None),
            prefetch_next_epoch,
            raise_on_error,
            settings: Settings {
                batch_size,
                order: order.to_string(),
                seed,
                rank,
                world_size,
                last_batch: last.name().to_string(),
                dataset_options: loader.dataset().options().to_json().to_string(),
                samples,
            },
            loader,
        })
    }

    /// The dataset options in effect (format detected, defaults filled in): the same names
    /// and values `gpufeed inspect --json` prints under "options".
    #[getter]
    fn dataset_options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.loader.dataset().options().values() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// What indexing found wrong (a damaged header, an index line past its file…): one dict
    /// per problem (``message``, ``path``, ``offset``, ``sample``), the first 1000; the samples
    /// they cover are not in the dataset. ``problems_total`` counts them all.
    #[getter]
    fn problems<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.loader
            .dataset()
            .problems()
            .iter()
            .map(|e| {
                let d = PyDict::new(py);
                d.set_item("message", e.report())?;
                d.set_item("path", e.path().map(|p| p.display().to_string()))?;
                d.set_item("offset", e.offset())?;
                d.set_item("sample", e.sample())?;
                Ok(d)
            })
            .collect()
    }

    #[getter]
    fn problems_total(&self) -> u64 {
        self.loader.dataset().problems_total()
    }

    /// What indexing noticed that is not damage (an empty file, files skipped…).
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.loader.dataset().notes().to_vec()
    }

    /// Samples recovered by resynchronisation (``tfrecord_recover=True``): their bytes check,
    /// but nothing proves they are records.
    #[getter]
    fn recovered(&self) -> usize {
        self.loader.dataset().recovered_count()
    }

    /// What happens to a rank's last, incomplete batch: "short", "drop" or "pad".
    #[getter]
    fn last_batch(&self) -> &str {
        &self.settings.last_batch
    }

    /// Samples this rank reads per epoch (padding included).
    #[getter]
    fn samples_per_epoch(&self) -> usize {
        self.loader.samples_per_epoch()
    }

    /// Bytes of each of the arena's slots (sized from the dataset and the batch size within
    /// ``memory_budget``), and how many there are.
    #[getter]
    fn slot_bytes(&self) -> (u64, usize) {
        (self.loader.slot_bytes(), self.loader.slots())
    }

    /// The epoch asked for ahead (``prefetch_next_epoch``), if one is.
    #[getter]
    fn prefetched_epoch(&self) -> Option<u64> {
        self.ahead
            .lock()
            .expect("ahead lock")
            .as_ref()
            .map(|(e, _)| *e)
    }

    /// The figures of the epoch being iterated (or the last one): samples, bytes, reads per
    /// sample, read amplification, the consumer's waiting split into storage / copy / verify /
    /// decode / other (``stall``, ``bound``), CPU seconds by thread. A dict, for loggers.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.last_stats.lock().expect("stats lock").clone();
        stats_dict(py, &st)
    }

    /// Chooses the epoch the next iteration reads (as with `DistributedSampler.set_epoch`).
    fn set_epoch(&self, epoch: u64) {
        let mut s = self.state.lock().expect("state lock");
        s.epoch = epoch;
        s.resume = None;
    }

    /// Batches per epoch for this rank.
    fn __len__(&self) -> usize {
        self.loader.batches_per_epoch() as usize
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

    /// The batches of the current epoch (from the resume point after `load_state_dict`).
    fn __iter__(&self, py: Python<'_>) -> PyResult<PyEpoch> {
        let (epoch, start) = {
            let mut s = self.state.lock().expect("state lock");
            let start = s.resume.take().unwrap_or(0);
            s.iter_epoch = s.epoch;
            s.yielded = start;
            (s.epoch, start)
        };
        let ahead = self.ahead.lock().expect("ahead lock").take();
        let prefetch = self.prefetch_next_epoch;
        let loader = self.loader.clone();
        // The GIL is released: asking for an epoch plans it, and dropping one asked for ahead
        // that is not wanted now waits for its reads in flight.
        let (it, next) = py
            .detach(move || -> gpufeed::Result<(Epoch, Option<(u64, Epoch)>)> {
                let it = match ahead {
                    Some((e, it)) if e == epoch && start == 0 => it,
                    other => {
                        drop(other);
                        loader.epoch_from(epoch, start)?
                    }
                };
                let next = if prefetch {
                    Some((epoch + 1, loader.epoch(epoch + 1)?))
                } else {
                    None
                };
                Ok((it, next))
            })
            .map_err(err)?;
        *self.ahead.lock().expect("ahead lock") = next;
        let it = match &self.images {
            Some(il) => EpochKind::Images(il.decode_epoch(it)),
            None => EpochKind::Bytes(it),
        };
        Ok(PyEpoch {
            last_stats: self.last_stats.clone(),
            epoch: Mutex::new(it),
            state: self.state.clone(),
            dataset: self.loader.dataset().clone(),
            raise_on_error: self.raise_on_error,
        })
    }

    /// Where iteration stands, for `load_state_dict` (the shape torchdata's
    /// `StatefulDataLoader` users expect: a plain dict).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.state.lock().expect("state lock");
        let d = PyDict::new(py);
        // A finished epoch resumes at the start of the next one.
        let (epoch, batch) = if s.yielded as usize >= self.__len__() {
            (s.iter_epoch + 1, 0)
        } else {
            (s.iter_epoch, s.yielded)
        };
        d.set_item("epoch", epoch)?;
        d.set_item("batch", batch)?;
        d.set_item("batch_size", self.settings.batch_size)?;
        d.set_item("order", &self.settings.order)?;
        d.set_item("seed", self.settings.seed)?;
        d.set_item("rank", self.settings.rank)?;
        d.set_item("world_size", self.settings.world_size)?;
        d.set_item("last_batch", &self.settings.last_batch)?;
        d.set_item("dataset_options", &self.settings.dataset_options)?;
        d.set_item("num_samples", self.settings.samples)?;
        Ok(d)
    }

    /// Resumes from `state_dict()`: the next iteration yields exactly the batches an
    /// uninterrupted run would from there. Settings that change the order must match.
    fn load_state_dict(&self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            state
                .get_item(k)?
                .ok_or_else(|| PyValueError::new_err(format!("state has no {k:?}")))
        };
        let saved = Settings {
            batch_size: get("batch_size")?.extract()?,
            order: get("order")?.extract()?,
            seed: get("seed")?.extract()?,
            rank: get("rank")?.extract()?,
            world_size: get("world_size")?.extract()?,
            last_batch: get("last_batch")?.extract()?,
            dataset_options: get("dataset_options")?.extract()?,
            samples: get("num_samples")?.extract()?,
        };
        if saved != self.settings {
            return Err(PyValueError::new_err(format!(
                "the state was saved with {saved:?}, this loader has {:?}: resuming would give \
                 other batches",
                self.settings
            )));
        }
        let batch: u32 = get("batch")?.extract()?;
        if batch as usize > self.__len__() {
            return Err(PyValueError::new_err(format!(
                "batch {batch} is past the epoch's {} batches",
                self.__len__()
            )));
        }
        let mut s = self.state.lock().expect("state lock");
        s.epoch = get("epoch")?.extract()?;
        s.resume = Some(batch);
        Ok(())
    }
}

/// The batches of one epoch.
#[pyclass(name = "_Epoch", module = "gpufeed._gpufeed")]
struct PyEpoch {
    epoch: Mutex<EpochKind>,
    /// The loader's view of the latest epoch's figures (`Loader.stats()`).
    last_stats: Arc<Mutex<gpufeed::LoaderStats>>,
    state: Arc<Mutex<State>>,
    dataset: Arc<Dataset>,
    raise_on_error: bool,
}

#[pymethods]
impl PyEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let epoch = &self.epoch;
        // The GIL is released while the I/O thread fills the next batch (and the decode
        // threads decode it).
        let last = &self.last_stats;
        let next = py.detach(|| {
            let mut guard = epoch.lock().expect("epoch lock");
            let (n, st) = match &mut *guard {
                EpochKind::Bytes(e) => (e.next().map(|r| r.map(Next::Bytes)), e.stats().clone()),
                EpochKind::Images(e) => (e.next().map(|r| r.map(Next::Images)), e.stats().clone()),
            };
            *last.lock().expect("stats lock") = st;
            n
        });
        let b = match next {
            None => return Ok(None),
            Some(Err(e)) => return Err(err(e)),
            Some(Ok(b)) => b,
        };
        let (index, errors): (u32, Vec<String>) = match &b {
            Next::Bytes(b) => (b.index(), b.errors().map(|(_, e)| e.report()).collect()),
            Next::Images(b) => (b.index(), b.errors().map(|(_, e)| e.report()).collect()),
        };
        self.state.lock().expect("state lock").yielded = index + 1;
        if self.raise_on_error {
            if let Some(first) = errors.first() {
                let more = if errors.len() > 1 {
                    format!(" (and {} more in this batch)", errors.len() - 1)
                } else {
                    String::new()
                };
                return Err(SampleError::new_err(format!("{first}{more}")));
            }
        }
        Ok(Some(match b {
            Next::Bytes(b) => Py::new(py, PyBatch::new(b, self.dataset.clone()))?.into_any(),
            Next::Images(b) => Py::new(py, PyImageBatch::new(b, self.dataset.clone()))?.into_any(),
        }))
    }

    /// What the epoch delivered so far (samples, bytes, reads), where the consumer's waiting
    /// went (``stall``: storage, copy, verify, decode, other; ``bound``: the largest) and CPU
    /// seconds by thread.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = match &*self.epoch.lock().expect("epoch lock") {
            EpochKind::Bytes(e) => e.stats().clone(),
            EpochKind::Images(e) => e.stats().clone(),
        };
        stats_dict(py, &st)
    }
}

/// A `LoaderStats` as a dict (the stall split under "stall").
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
    d.set_item("decode_cpu_s", st.decode_cpu_s)?;
    d.set_item("engine", &st.engine)?;
    Ok(d)
}

fn stall_dict<'py>(py: Python<'py>, s: &gpufeed::StallStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("storage_s", s.storage_s)?;
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

/// What decoded image batches look like (`Loader(images=Images(...))`).
#[pyclass(name = "Images", module = "gpufeed._gpufeed", frozen)]
struct PyImages {
    spec: ImageSpec,
}

#[pymethods]
impl PyImages {
    #[new]
    #[pyo3(signature = (
        transform="train", size=224, dtype="float32", layout="nchw", mean=None, std=None,
        threads=0, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), flip_p=0.5, resize=None,
        dct_scaling=true, max_pixels=None, prefetch_batches=2
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        transform: &str,
        size: u32,
        dtype: &str,
        layout: &str,
        mean: Option<[f32; 3]>,
        std: Option<[f32; 3]>,
        threads: usize,
        scale: (f64, f64),
        ratio: (f64, f64),
        flip_p: f64,
        resize: Option<u32>,
        dct_scaling: bool,
        max_pixels: Option<u64>,
        prefetch_batches: usize,
    ) -> PyResult<Self> {
        let mut spec = match transform {
            "train" => {
                let mut s = ImageSpec::train(size);
                s.transform = Transform::Train {
                    scale,
                    ratio,
                    flip_p,
                };
                s
            }
            "eval" => {
                let mut s = ImageSpec::eval(size);
                if let Some(r) = resize {
                    s.transform = Transform::Eval { resize: r };
                }
                s
            }
            t => {
                return Err(PyValueError::new_err(format!(
                    "transform {t:?}: \"train\" or \"eval\""
                )))
            }
        };
        spec.dtype = match dtype {
            "uint8" => PixelType::U8,
            "float16" => PixelType::F16,
            "bfloat16" => PixelType::Bf16,
            "float32" => PixelType::F32,
            d => {
                return Err(PyValueError::new_err(format!(
                    "dtype {d:?}: \"uint8\", \"float16\", \"bfloat16\" or \"float32\""
                )))
            }
        };
        spec.layout = match layout {
            "nchw" => Layout::Nchw,
            "nhwc" => Layout::Nhwc,
            l => {
                return Err(PyValueError::new_err(format!(
                    "layout {l:?}: \"nchw\" or \"nhwc\""
                )))
            }
        };
        if let Some(m) = mean {
            spec.mean = m;
        }
        if let Some(s) = std {
            spec.std = s;
        }
        spec.threads = threads;
        spec.dct_scaling = dct_scaling;
        spec.prefetch_batches = prefetch_batches;
        if let Some(m) = max_pixels {
            spec.max_pixels = m;
        }
        spec.validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyImages { spec })
    }

    fn __repr__(&self) -> String {
        format!("gpufeed.Images({:?})", self.spec)
    }
}

/// A batch of decoded images: one tensor (``images``) plus labels, ids and errors.
#[pyclass(name = "ImageBatch", module = "gpufeed._gpufeed")]
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

    /// The images: one host tensor, [N, 3, H, W] (nchw) or [N, H, W, 3] (nhwc), of the
    /// dtype asked for; ``torch.from_dlpack(batch.images)`` views it without a copy. A sample
    /// that failed is zeros (``failed``, ``errors``).
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

    /// Each sample's key.
    #[getter]
    fn keys(&self) -> Vec<String> {
        self.batch
            .sample_ids()
            .iter()
            .map(|&i| self.dataset.key(i as usize).into_owned())
            .collect()
    }

    /// The tensor's shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.batch.shape().to_vec()
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
#[pyclass(name = "Batch", module = "gpufeed._gpufeed")]
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

    /// Each sample's key.
    #[getter]
    fn keys(&self) -> Vec<String> {
        self.batch
            .sample_ids()
            .iter()
            .map(|&i| self.dataset.key(i as usize).into_owned())
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

enum Mem {
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
#[pyclass(name = "Buffer", module = "gpufeed._gpufeed")]
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
            Mem::I64(v) => (v.as_ptr() as u64, v.len(), HOST),
            Mem::U8(v) => (v.as_ptr() as u64, v.len(), HOST),
            Mem::Images(b) => (b.as_ptr() as u64, b.shape().iter().product(), HOST),
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
                        Some(-1) => {}
                        // SAFETY: DLPack's contract: the consumer passes a stream of its own on
                        // this device (or 1/2, the legacy and per-thread defaults; none means
                        // the legacy one) that outlives its use of the tensor, which holds
                        // this batch alive until the consumer releases it.
                        s => unsafe { batch.wait_on(s.unwrap_or(1) as u64) }.map_err(err)?,
                    }
                }
                (Box::new(batch.clone()), dlpack::UINT8)
            }
            Mem::I64(v) => (Box::new(v.clone()), dlpack::INT64),
            Mem::U8(v) => (Box::new(v.clone()), dlpack::UINT8),
            Mem::Images(b) => (b.keep_alive(), dl_dtype(b.dtype())),
        };
        let t = match &self.mem {
            Mem::Images(b) => {
                let shape: Vec<i64> = b.shape().iter().map(|&d| d as i64).collect();
                // SAFETY: `owner` keeps the tensor (shape's product of elements at `ptr`)
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
            Mem::I64(_) => "int64",
            Mem::Images(b) => b.dtype().as_str(),
        }
    }

    /// The shape (one extent, but for an image tensor).
    #[getter]
    fn shape(&self) -> Vec<usize> {
        match &self.mem {
            Mem::Images(b) => b.shape().to_vec(),
            _ => vec![self.raw().1],
        }
    }

    /// Bytes in the buffer.
    #[getter]
    fn nbytes(&self) -> usize {
        match &self.mem {
            Mem::Region { len, .. } => *len,
            Mem::I64(v) => v.len() * 8,
            Mem::U8(v) => v.len(),
            Mem::Images(b) => b.bytes().len(),
        }
    }

    /// The elements as a list (int64 buffers, or host uint8).
    fn tolist(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.mem {
            Mem::I64(v) => Ok(v.as_ref().clone().into_pyobject(py)?.into_any().unbind()),
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
            Mem::I64(v) => Ok(PyBytes::new(
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
            Mem::I64(_) | Mem::U8(_) | Mem::Images(_) => {
                Err(PyValueError::new_err("not a batch's byte buffer"))
            }
        }
    }
}

/// Whether a CUDA GPU is usable, and why not (never raises for lack of a GPU).
#[pyfunction]
fn gpu_available() -> (bool, String) {
    match gpufeed::gpu_available() {
        Ok(i) => (true, format!("{} (driver {})", i.name, i.driver_version)),
        Err(e) => (false, e.report()),
    }
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
    Ok(())
}
