//! gpufeed's C ABI (`include/gpufeed.h`): opaque handles, status codes with a per-thread last
//! error message, and batches exported as DLPack `DLManagedTensor`s.
//!
//! Every function checks its pointers (a null handle is `GPUFEED_ERR_INVALID`, not a crash) and
//! catches panics at the boundary. A batch handle keeps its memory alive; so does every
//! `DLManagedTensor` made from it, until its deleter runs — the batch may be freed first.
//! `tests/it/capi.rs` (root crate) checks the header against this file and runs a C program.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use gpufeed::dataset::OpenOptions;
use gpufeed::dlpack;
use gpufeed::{Batch, Dataset, Device, Epoch, ErrorKind, LastBatch, Loader, Order};

/// Status codes (`gpufeed_status` in the header).
pub const GPUFEED_OK: i32 = 0;
pub const GPUFEED_ERR_INVALID: i32 = 1;
pub const GPUFEED_ERR_NOT_FOUND: i32 = 2;
pub const GPUFEED_ERR_IO: i32 = 3;
pub const GPUFEED_ERR_UNSUPPORTED: i32 = 4;
pub const GPUFEED_ERR_SAMPLE: i32 = 5;
pub const GPUFEED_ERR_PANIC: i32 = 6;

/// Loader options (`gpufeed_options`); fill with `gpufeed_options_default` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpufeedOptions {
    pub batch_size: u32,
    /// 0 global, 1 shard-buffer, 2 block.
    pub order: u32,
    pub seed: u64,
    pub rank: u32,
    pub world_size: u32,
    /// −1: host memory; ≥ 0: that CUDA device.
    pub device: i32,
    pub prefetch: u32,
    /// Nonzero: `last_batch` drop (the familiar alias).
    pub drop_last: u8,
    pub verify: u8,
    /// 0 short (every sample exactly once; the default), 1 drop, 2 pad.
    pub last_batch: u8,
    /// The dataset options (the CLI's `--format` … `--stride`): null, or 0, keeps the default.
    pub format: *const c_char,
    pub payload: *const c_char,
    pub label_ext: *const c_char,
    pub label_offset: i64,
    pub tfrecord_index: *const c_char,
    pub tfrecord_payload: *const c_char,
    pub tfrecord_label: *const c_char,
    pub tfrecord_recover: u8,
    pub token_dtype: *const c_char,
    pub seq_len: u32,
    pub stride: u32,
    pub strict: u8,
    /// Bytes the loader's arena may take (0: the default, 4 GiB).
    pub memory_budget: u64,
}

/// `last_batch` values (`GPUFEED_LAST_BATCH_*` in the header).
pub const GPUFEED_LAST_BATCH_SHORT: u8 = 0;
pub const GPUFEED_LAST_BATCH_DROP: u8 = 1;
pub const GPUFEED_LAST_BATCH_PAD: u8 = 2;

pub use gpufeed::dlpack::{DLDataType, DLDevice, DLManagedTensor, DLTensor};

/// An open loader and its current epoch (`gpufeed_loader`).
pub struct GpufeedLoader {
    loader: Loader,
    epoch: Option<Epoch>,
    /// The dataset options in effect, as JSON (returned by `gpufeed_loader_dataset_options`).
    options_json: CString,
    /// The problems indexing kept, as text (returned by `gpufeed_loader_problem`).
    problems: Vec<CString>,
}

/// One batch (`gpufeed_batch`).
pub struct GpufeedBatch {
    batch: Arc<Batch>,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn status_of(e: &gpufeed::Error) -> i32 {
    set_error(&e.report());
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::PermissionDenied => GPUFEED_ERR_NOT_FOUND,
        ErrorKind::InvalidInput => GPUFEED_ERR_INVALID,
        ErrorKind::Unsupported => GPUFEED_ERR_UNSUPPORTED,
        _ => GPUFEED_ERR_IO,
    }
}

/// Runs `f`, turning a panic into `GPUFEED_ERR_PANIC`.
fn guard(f: impl FnOnce() -> i32) -> i32 {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_error("internal error (a panic was caught at the C boundary)");
        GPUFEED_ERR_PANIC
    })
}

fn invalid(msg: &str) -> i32 {
    set_error(msg);
    GPUFEED_ERR_INVALID
}

/// The last error message on this thread (empty if none); valid until the next gpufeed call
/// on this thread.
#[no_mangle]
pub extern "C" fn gpufeed_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The options `gpufeed_options_default` writes.
fn defaults() -> GpufeedOptions {
    GpufeedOptions {
        batch_size: 256,
        order: 0,
        seed: 0,
        rank: 0,
        world_size: 1,
        device: -1,
        prefetch: 2,
        drop_last: 0,
        verify: 1,
        last_batch: GPUFEED_LAST_BATCH_SHORT,
        format: std::ptr::null(),
        payload: std::ptr::null(),
        label_ext: std::ptr::null(),
        label_offset: 0,
        tfrecord_index: std::ptr::null(),
        tfrecord_payload: std::ptr::null(),
        tfrecord_label: std::ptr::null(),
        tfrecord_recover: 0,
        token_dtype: std::ptr::null(),
        seq_len: 0,
        stride: 0,
        strict: 0,
        memory_budget: 0,
    }
}

/// Default options: batches of 256, global order, seed 0, rank 0 of 1, host memory, prefetch 2,
/// a short last batch, checksums verified, every dataset option at its default.
///
/// # Safety
/// `out` must be null or point to writable memory for one `gpufeed_options`.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_options_default(out: *mut GpufeedOptions) -> i32 {
    if out.is_null() {
        return invalid("options pointer is null");
    }
    // SAFETY: non-null and writable for one options struct per the contract.
    unsafe { out.write(defaults()) };
    GPUFEED_OK
}

/// The dataset options of `o` through the table every front door shares.
///
/// # Safety
/// Every non-null string field of `o` points to a NUL-terminated string that stays valid for
/// the call.
unsafe fn dataset_options(o: &GpufeedOptions) -> gpufeed::Result<OpenOptions> {
    let mut opts = OpenOptions::default();
    let strings = [
        ("format", o.format),
        ("payload", o.payload),
        ("label_ext", o.label_ext),
        ("tfrecord_index", o.tfrecord_index),
        ("tfrecord_payload", o.tfrecord_payload),
        ("tfrecord_label", o.tfrecord_label),
        ("token_dtype", o.token_dtype),
    ];
    for (name, p) in strings {
        if !p.is_null() {
            // SAFETY: non-null and NUL-terminated per the contract.
            let v = unsafe { CStr::from_ptr(p) }.to_string_lossy();
            opts.set(name, &v)?;
        }
    }
    if o.label_offset != 0 {
        opts.set("label_offset", &o.label_offset.to_string())?;
    }
    if o.seq_len != 0 {
        opts.set("seq_len", &o.seq_len.to_string())?;
    }
    if o.stride != 0 {
        opts.set("stride", &o.stride.to_string())?;
    }
    opts.set(
        "tfrecord_recover",
        if o.tfrecord_recover != 0 {
            "true"
        } else {
            "false"
        },
    )?;
    opts.set("strict", if o.strict != 0 { "true" } else { "false" })?;
    Ok(opts)
}

/// Opens the dataset at `path` (any path the CLI takes: shards, tars, TFRecords, a Megatron
/// prefix, token files with `format` "tokens", an ImageFolder) and builds a loader.
///
/// # Safety
/// `path` must be a NUL-terminated string; `opts` null (defaults) or a valid options struct
/// whose non-null strings are NUL-terminated; `out` writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_open(
    path: *const c_char,
    opts: *const GpufeedOptions,
    out: *mut *mut GpufeedLoader,
) -> i32 {
    // SAFETY: `&path` points to one pointer, a local that outlives the call, so `paths` holds
    // `n = 1` entries; that entry is the caller's `path`, NUL-terminated (or null, which the
    // callee reports) per this function's contract; `opts` and `out` are passed on unchanged
    // under the same contract as the callee's.
    unsafe { gpufeed_loader_open_paths(&path, 1, opts, out) }
}

/// Opens the `n` files `paths` as one dataset (as `gpufeed_loader_open` does for one).
///
/// # Safety
/// `paths` must point to `n` NUL-terminated strings; `opts` and `out` as for
/// `gpufeed_loader_open`.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_open_paths(
    paths: *const *const c_char,
    n: u32,
    opts: *const GpufeedOptions,
    out: *mut *mut GpufeedLoader,
) -> i32 {
    guard(|| {
        if paths.is_null() || out.is_null() || n == 0 {
            return invalid("paths and out must not be null, and n at least 1");
        }
        // SAFETY: `n` pointers per the contract.
        let raw = unsafe { std::slice::from_raw_parts(paths, n as usize) };
        let mut list = Vec::with_capacity(raw.len());
        for &p in raw {
            if p.is_null() {
                return invalid("a path is null");
            }
            // SAFETY: NUL-terminated per the contract.
            let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            list.push(std::path::PathBuf::from(s));
        }
        let o = if opts.is_null() {
            defaults()
        } else {
            // SAFETY: non-null, and a valid options struct per the contract (a plain copy).
            unsafe { *opts }
        };
        let order = match o.order {
            0 => Order::Global,
            1 => Order::parse("shard-buffer").expect("known"),
            2 => Order::parse("block").expect("known"),
            n => {
                return invalid(&format!(
                    "unknown order {n} (0 global, 1 shard-buffer, 2 block)"
                ))
            }
        };
        let last = match (o.drop_last, o.last_batch) {
            (d, _) if d != 0 => LastBatch::Drop,
            (_, GPUFEED_LAST_BATCH_SHORT) => LastBatch::Short,
            (_, GPUFEED_LAST_BATCH_DROP) => LastBatch::Drop,
            (_, GPUFEED_LAST_BATCH_PAD) => LastBatch::Pad,
            (_, n) => return invalid(&format!("unknown last_batch {n} (0 short, 1 drop, 2 pad)")),
        };
        let device = match o.device {
            d if d < 0 => Device::Host,
            d => Device::Cuda(d as u32),
        };
        // SAFETY: the strings of `o` are NUL-terminated per the contract.
        let built = unsafe { dataset_options(&o) }
            .and_then(|opts| Dataset::open_paths(&list, &opts))
            .and_then(|ds| {
                let budget = match o.memory_budget {
                    0 => gpufeed::loader::DEFAULT_MEMORY_BUDGET_BYTES,
                    b => b,
                };
                Loader::builder(ds)
                    .memory_budget(budget)
                    .batch_size(o.batch_size)
                    .order(order)
                    .seed(o.seed)
                    .rank(o.rank, o.world_size)
                    .last_batch(last)
                    .prefetch_groups(o.prefetch)
                    .verify_checksums(o.verify != 0)
                    .device(device)
                    .build()
            });
        match built {
            Ok(loader) => {
                let json = loader.dataset().options().to_json().to_string();
                let problems = loader
                    .dataset()
                    .problems()
                    .iter()
                    .map(|e| CString::new(e.report().replace('\0', " ")).unwrap_or_default())
                    .collect();
                let h = Box::new(GpufeedLoader {
                    loader,
                    epoch: None,
                    options_json: CString::new(json).unwrap_or_default(),
                    problems,
                });
                // SAFETY: writable per the contract.
                unsafe { out.write(Box::into_raw(h)) };
                GPUFEED_OK
            }
            Err(e) => status_of(&e),
        }
    })
}

/// The dataset options in effect, as a JSON object (the names and values `gpufeed inspect
/// --json` prints under "options"); valid until the loader is closed. Null for a null loader.
///
/// # Safety
/// `l` must be null or a loader from `gpufeed_loader_open` not yet closed.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_dataset_options(l: *const GpufeedLoader) -> *const c_char {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }.map_or(std::ptr::null(), |l| l.options_json.as_ptr())
}

/// How many problems indexing found (a damaged header, an index line past its file…): the
/// samples they cover are not in the dataset. 0 for a null loader.
///
/// # Safety
/// As `gpufeed_loader_dataset_options`.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_problems(l: *const GpufeedLoader) -> u64 {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }.map_or(0, |l| l.loader.dataset().problems_total())
}

/// Problem `i` (file, offset or sample, what was wrong) of the first 1000 kept; null past them.
/// Valid until the loader is closed.
///
/// # Safety
/// As `gpufeed_loader_dataset_options`.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_problem(l: *const GpufeedLoader, i: u64) -> *const c_char {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }
        .and_then(|l| l.problems.get(i as usize))
        .map_or(std::ptr::null(), |c| c.as_ptr())
}

/// Samples this rank reads per epoch (padding included).
///
/// # Safety
/// As `gpufeed_loader_dataset_options`.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_samples_per_epoch(l: *const GpufeedLoader) -> u64 {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }.map_or(0, |l| l.loader.samples_per_epoch() as u64)
}

/// Batches per epoch for this rank.
///
/// # Safety
/// `l` must be null or a loader from `gpufeed_loader_open` not yet closed.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_batches(l: *const GpufeedLoader) -> u32 {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }.map_or(0, |l| l.loader.batches_per_epoch())
}

/// Samples in the dataset.
///
/// # Safety
/// As `gpufeed_loader_batches`.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_samples(l: *const GpufeedLoader) -> u64 {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }.map_or(0, |l| l.loader.dataset().len() as u64)
}

/// Starts `epoch` at batch `start` (0: the beginning; resuming gives exactly the batches an
/// uninterrupted epoch gives from there). Ends the previous epoch, if any.
///
/// # Safety
/// As `gpufeed_loader_batches`, and not used from two threads at once.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_start_epoch(
    l: *mut GpufeedLoader,
    epoch: u64,
    start: u32,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(l) = (unsafe { l.as_mut() }) else {
            return invalid("loader is null");
        };
        l.epoch = None;
        match l.loader.epoch_from(epoch, start) {
            Ok(e) => {
                l.epoch = Some(e);
                GPUFEED_OK
            }
            Err(e) => status_of(&e),
        }
    })
}

/// The next batch of the current epoch into `*out`, or null at its end (status OK). A batch
/// with a bad sample is still returned: `gpufeed_batch_sample` reports that sample.
///
/// # Safety
/// As `gpufeed_loader_start_epoch`; `out` writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_next(
    l: *mut GpufeedLoader,
    out: *mut *mut GpufeedBatch,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(l) = (unsafe { l.as_mut() }) else {
            return invalid("loader is null");
        };
        if out.is_null() {
            return invalid("out is null");
        }
        let Some(epoch) = l.epoch.as_mut() else {
            return invalid("no epoch started (gpufeed_loader_start_epoch)");
        };
        let next = match epoch.next() {
            None => std::ptr::null_mut(),
            Some(Ok(b)) => Box::into_raw(Box::new(GpufeedBatch { batch: Arc::new(b) })),
            Some(Err(e)) => return status_of(&e),
        };
        // SAFETY: writable per the contract.
        unsafe { out.write(next) };
        GPUFEED_OK
    })
}

/// Closes a loader (stops its epoch; batches still held stay valid).
///
/// # Safety
/// `l` must be null or a loader from `gpufeed_loader_open`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_close(l: *mut GpufeedLoader) {
    if !l.is_null() {
        // SAFETY: created by Box::into_raw in gpufeed_loader_open; ownership returns here.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(l) })));
    }
}

/// Samples in a batch.
///
/// # Safety
/// `b` must be null or a live batch.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_len(b: *const GpufeedBatch) -> u32 {
    // SAFETY: valid or null per the contract.
    unsafe { b.as_ref() }.map_or(0, |b| b.batch.len() as u32)
}

/// Sample `i`'s bytes (host batches): `*data`, `*len`. A bad sample returns
/// `GPUFEED_ERR_SAMPLE` with the message (file, sample, what was wrong) in
/// `gpufeed_last_error`.
///
/// # Safety
/// `b` a live batch; `data` and `len` writable. The bytes live as long as the batch.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_sample(
    b: *const GpufeedBatch,
    i: u32,
    data: *mut *const u8,
    len: *mut u64,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(b) = (unsafe { b.as_ref() }) else {
            return invalid("batch is null");
        };
        if data.is_null() || len.is_null() {
            return invalid("data and len must not be null");
        }
        if i as usize >= b.batch.len() {
            return invalid(&format!("sample {i} of a batch of {}", b.batch.len()));
        }
        match b.batch.sample(i as usize) {
            Ok(s) => {
                // SAFETY: writable per the contract.
                unsafe {
                    data.write(s.as_ptr());
                    len.write(s.len() as u64);
                }
                GPUFEED_OK
            }
            Err(e) => {
                set_error(&e.report());
                if b.batch.is_device() {
                    GPUFEED_ERR_INVALID
                } else {
                    GPUFEED_ERR_SAMPLE
                }
            }
        }
    })
}

/// Sample `i`'s label (−1 when none or out of range).
///
/// # Safety
/// `b` null or a live batch.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_label(b: *const GpufeedBatch, i: u32) -> i64 {
    // SAFETY: valid or null per the contract.
    unsafe { b.as_ref() }
        .and_then(|b| b.batch.labels().get(i as usize).copied())
        .unwrap_or(-1)
}

/// 1 if sample `i` is padding (a repeat that only evens out the ranks, last_batch pad), else 0
/// (also when out of range).
///
/// # Safety
/// `b` null or a live batch.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_is_padding(b: *const GpufeedBatch, i: u32) -> u8 {
    // SAFETY: valid or null per the contract.
    unsafe { b.as_ref() }
        .filter(|b| (i as usize) < b.batch.len())
        .map_or(0, |b| u8::from(b.batch.is_padding(i as usize)))
}

/// Sample `i`'s index in the dataset (`UINT32_MAX` when out of range).
///
/// # Safety
/// `b` null or a live batch.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_sample_id(b: *const GpufeedBatch, i: u32) -> u32 {
    // SAFETY: valid or null per the contract.
    unsafe { b.as_ref() }
        .and_then(|b| b.batch.sample_ids().get(i as usize).copied())
        .unwrap_or(u32::MAX)
}

/// Where sample `i` lies in the batch's memory (the tensor of `gpufeed_batch_to_dlpack`):
/// `*offset`, `*len`. `GPUFEED_ERR_SAMPLE` for a bad sample.
///
/// # Safety
/// `b` a live batch; `offset` and `len` writable.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_sample_range(
    b: *const GpufeedBatch,
    i: u32,
    offset: *mut u64,
    len: *mut u64,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(b) = (unsafe { b.as_ref() }) else {
            return invalid("batch is null");
        };
        if offset.is_null() || len.is_null() || i as usize >= b.batch.len() {
            return invalid("null output or sample out of range");
        }
        match b.batch.sample_range(i as usize) {
            Ok(r) => {
                // SAFETY: writable per the contract.
                unsafe {
                    offset.write(r.start as u64);
                    len.write(r.len() as u64);
                }
                GPUFEED_OK
            }
            Err(e) => {
                set_error(&e.report());
                GPUFEED_ERR_SAMPLE
            }
        }
    })
}

/// The batch's memory as a 1-D uint8 DLPack tensor (host: kDLCPU; CUDA: kDLCUDA, after the
/// batch's copy — make your stream wait first with the device API). Sample ranges index into
/// it. The tensor keeps the memory alive until its deleter is called, even after
/// `gpufeed_batch_free`.
///
/// # Safety
/// `b` a live batch; `out` writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_to_dlpack(
    b: *const GpufeedBatch,
    out: *mut *mut DLManagedTensor,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(b) = (unsafe { b.as_ref() }) else {
            return invalid("batch is null");
        };
        if out.is_null() {
            return invalid("out is null");
        }
        let batch = b.batch.clone();
        let len = batch.region_len();
        let (data, device) = match (batch.region_bytes(), batch.device_ptr()) {
            (Some(bytes), _) => (bytes.as_ptr() as *mut c_void, (dlpack::KDL_CPU, 0)),
            (None, Some(ptr)) => (
                ptr as *mut c_void,
                (dlpack::KDL_CUDA, batch.device().unwrap_or(0) as i32),
            ),
            (None, None) => return invalid("this batch's memory cannot be exported"),
        };
        let device = DLDevice {
            device_type: device.0,
            device_id: device.1,
        };
        // SAFETY: the region holds `len` bytes at `data` while the batch (the owner) lives.
        let t = unsafe { dlpack::export(Box::new(batch), data, device, dlpack::UINT8, len) };
        // SAFETY: writable per the contract.
        unsafe { out.write(t) };
        GPUFEED_OK
    })
}

/// Frees a batch handle (its memory returns to the loader once no DLPack tensor holds it).
///
/// # Safety
/// `b` null or a batch from `gpufeed_loader_next`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_free(b: *mut GpufeedBatch) {
    if !b.is_null() {
        // SAFETY: created by Box::into_raw in gpufeed_loader_next; ownership returns here.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(b) })));
    }
}
