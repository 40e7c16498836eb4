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

use gpufeed::config::LoaderSettings;
use gpufeed::dataset::OpenOptions;
use gpufeed::decode::{ImageBatch, ImageEpoch, ImageLoader, ImageSpec, PixelType, IMAGE_SETTINGS};
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
/// A wait for a batch passed `timeout_ms` (the epoch stays usable: call next again).
pub const GPUFEED_ERR_TIMEOUT: i32 = 7;

/// Loader options (`gpufeed_options`); fill with `gpufeed_options_default` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpufeedOptions {
    /// `sizeof(gpufeed_options)` of the caller's header (written by `gpufeed_options_default`):
    /// the fields a program knows, so a library with more keeps their defaults for the rest.
    pub struct_size: u32,
    pub batch_size: u32,
    /// 0 global, 1 shard-buffer, 2 block, 3 sequential (no shuffle: evaluation).
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
    /// A limit on each wait for a batch in `gpufeed_loader_next`, in milliseconds (0: none,
    /// the default: the loader waits as long as the consumer takes).
    pub timeout_ms: u64,
    /// From here on, 0 keeps the default (which `gpufeed_options_default` writes). Read groups
    /// being read at once, at most.
    pub in_flight: u32,
    /// Reads in flight in the engine.
    pub queue_depth: u32,
    /// Order shard-buffer: samples shuffled together (a window of the shard stream, read whole; rounded to whole batches, at least one).
    pub shuffle_buffer: u32,
    /// Order block: blocks drawn from at a time.
    pub open_blocks: u32,
    /// Order block: bytes of consecutive samples per block.
    pub block_bytes: u64,
    /// Files kept open at most (0: every file of the dataset, within the open-file limit).
    pub open_files_max: u32,
    /// Remote datasets (`s3://…`): the node cache's directory (null: the default).
    pub cache_dir: *const c_char,
    /// Remote datasets: the node cache's limit in bytes (0: the default).
    pub cache_limit: u64,
    /// Remote datasets: bytes fetched with one GET and cached (0: the default, 8 MiB).
    pub cache_extent: u64,
}

/// `last_batch` values (`GPUFEED_LAST_BATCH_*` in the header).
pub const GPUFEED_LAST_BATCH_SHORT: u8 = 0;
pub const GPUFEED_LAST_BATCH_DROP: u8 = 1;
pub const GPUFEED_LAST_BATCH_PAD: u8 = 2;

pub use gpufeed::dlpack::{DLDataType, DLDevice, DLManagedTensor, DLTensor};

/// An open loader and its current epoch (`gpufeed_loader`).
pub struct GpufeedLoader {
    loader: Loader,
    /// Set by `gpufeed_loader_decode_images`: epochs started afterwards are decoded.
    images: Option<ImageLoader>,
    epoch: Option<CEpoch>,
    /// The dataset options in effect, as JSON (returned by `gpufeed_loader_dataset_options`).
    options_json: CString,
    /// The loader settings in effect, as JSON (`gpufeed_loader_settings`).
    settings_json: CString,
    /// The image settings in effect once decoding was asked for, as JSON
    /// (`gpufeed_loader_image_settings`).
    images_json: CString,
    /// The problems indexing kept, as text (returned by `gpufeed_loader_problem`).
    problems: Vec<CString>,
}

/// One batch (`gpufeed_batch`): compressed samples, or decoded images.
pub enum GpufeedBatch {
    Bytes(Arc<Batch>),
    Images(ImageBatch),
}

impl GpufeedBatch {
    fn len(&self) -> usize {
        match self {
            GpufeedBatch::Bytes(b) => b.len(),
            GpufeedBatch::Images(b) => b.len(),
        }
    }
    fn labels(&self) -> &[i64] {
        match self {
            GpufeedBatch::Bytes(b) => b.labels(),
            GpufeedBatch::Images(b) => b.labels(),
        }
    }
    fn sample_ids(&self) -> &[u32] {
        match self {
            GpufeedBatch::Bytes(b) => b.sample_ids(),
            GpufeedBatch::Images(b) => b.sample_ids(),
        }
    }
    fn is_padding(&self, i: usize) -> bool {
        match self {
            GpufeedBatch::Bytes(b) => b.is_padding(i),
            GpufeedBatch::Images(b) => b.is_padding(i),
        }
    }
}

/// Decoded-images settings (`gpufeed_images`); fill with `gpufeed_images_default` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpufeedImages {
    /// `sizeof(gpufeed_images)` of the caller's header (written by `gpufeed_images_default`).
    pub struct_size: u32,
    /// 0 train (random resized crop + flip), 1 eval (resize + centre crop).
    pub transform: u32,
    /// Output side in pixels.
    pub size: u32,
    /// 0 uint8, 1 float16, 2 bfloat16, 3 float32.
    pub dtype: u32,
    /// 0 NCHW, 1 NHWC.
    pub layout: u32,
    /// Per-channel mean and std on the 0–1 scale (float dtypes).
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Decode threads (0: the cores divided by `LOCAL_WORLD_SIZE`, or `GPUFEED_DECODE_THREADS`).
    pub threads: u32,
    /// Eval: the shorter side before the crop (0: size * 8 / 7).
    pub resize: u32,
}

/// The current epoch's figures (`gpufeed_stats`, from `gpufeed_loader_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GpufeedStats {
    /// `sizeof(gpufeed_stats)` of the caller's header (written by `gpufeed_loader_stats`).
    pub struct_size: u32,
    pub batches: u64,
    pub samples: u64,
    pub sample_errors: u64,
    pub bytes_delivered: u64,
    pub bytes_read: u64,
    pub reads: u64,
    /// The consumer's time in `gpufeed_loader_next`, and its split by cause.
    pub consumer_wait_s: f64,
    pub storage_s: f64,
    pub copy_s: f64,
    pub verify_s: f64,
    pub decode_s: f64,
    pub other_s: f64,
    /// CPU seconds by thread: the I/O thread, the consumer inside next, the decode threads.
    pub io_thread_cpu_s: f64,
    pub consumer_cpu_s: f64,
    pub decode_cpu_s: f64,
    /// Of the consumer's wait: reads that fetched from an object store.
    pub remote_s: f64,
}

/// A struct the caller and the library share, headed by its `struct_size`: the caller's
/// header may be older (fewer fields) or newer (more) than the library's.
///
/// # Safety
/// Implemented only for the `#[repr(C)]` structs above, whose first field is `struct_size:
/// u32` and whose every field is valid for any bytes (integers, floats, raw pointers).
unsafe trait Sized32: Copy {
    const NAME: &'static str;
}
// SAFETY: `#[repr(C)]`, `struct_size: u32` first, plain fields only.
unsafe impl Sized32 for GpufeedOptions {
    const NAME: &'static str = "gpufeed_options";
}
// SAFETY: as above.
unsafe impl Sized32 for GpufeedImages {
    const NAME: &'static str = "gpufeed_images";
}
// SAFETY: as above.
unsafe impl Sized32 for GpufeedStats {
    const NAME: &'static str = "gpufeed_stats";
}

/// The smallest `struct_size` taken: the size field and the first field after it.
const STRUCT_SIZE_MIN: u32 = 8;

/// The largest `struct_size` taken: more than any of these structs will grow to, and a bound
/// on what a garbage size (a struct not filled by its `_default` call) makes the library read.
const STRUCT_SIZE_MAX: u32 = 4096;

/// Why `size` cannot be a `T`'s size, if so: below the first field, above
/// [`STRUCT_SIZE_MAX`], or not a multiple of the struct's alignment — a size that ends inside
/// a field (half a pointer taken with the library's default for the rest, as a trial found, is
/// a wild pointer).
fn size_problem<T: Sized32>(size: u32) -> Option<String> {
    let align = std::mem::align_of::<T>() as u32;
    if !(STRUCT_SIZE_MIN..=STRUCT_SIZE_MAX).contains(&size) || !size.is_multiple_of(align) {
        return Some(format!(
            "{}.struct_size is {size}, not a size the struct can have (a multiple of {align} \
             from {STRUCT_SIZE_MIN} to {STRUCT_SIZE_MAX}): fill the struct with its _default \
             call (the header's macro passes sizeof)",
            T::NAME
        ));
    }
    None
}

/// A `struct_size` given to a writer, checked.
fn size_given<T: Sized32>(size: u32) -> Result<u32, i32> {
    match size_problem::<T>(size) {
        Some(why) => Err(invalid(&why)),
        None => Ok(size),
    }
}

/// Writes `value` into the caller's struct of `size` bytes (its header's `sizeof`): the fields
/// both know, zeros for fields only the caller's (newer) header has; `struct_size` = `size`.
///
/// # Safety
/// `out` is writable for `size` bytes; `size` passed [`size_given`] (≥ 8, so the size field
/// lies inside it).
unsafe fn write_sized<T: Sized32>(out: *mut T, value: T, size: u32) {
    let lib = std::mem::size_of::<T>();
    let n = (size as usize).min(lib);
    let dst = out as *mut u8;
    // SAFETY: `value` is `lib` ≥ `n` readable bytes; `dst` writable for `size` ≥ `n` bytes; the
    // two do not overlap (a local).
    unsafe { std::ptr::copy_nonoverlapping(&value as *const T as *const u8, dst, n) };
    if size as usize > lib {
        // SAFETY: within the caller's `size` bytes.
        unsafe { std::ptr::write_bytes(dst.add(lib), 0, size as usize - lib) };
    }
    // SAFETY: the first field, a u32 at offset 0 of a writable struct (size ≥ 8); unaligned
    // write in case the caller's struct is not aligned.
    unsafe { (dst as *mut u32).write_unaligned(size) };
}

/// Reads the caller's struct by its own `struct_size`: the fields it has over `defaults`, the
/// rest kept. A struct from a newer header than this library is taken only if the fields this
/// library does not know are zero (their defaults): anything set there would be ignored.
///
/// # Safety
/// `p` is non-null and points to a struct of at least `struct_size` readable bytes, filled by
/// the matching `_default` call (which wrote `struct_size`).
unsafe fn read_sized<T: Sized32>(p: *const T, defaults: T) -> Result<T, i32> {
    let src = p as *const u8;
    // SAFETY: the first 4 bytes of the caller's struct (its `struct_size`).
    let size = unsafe { (src as *const u32).read_unaligned() };
    if let Some(why) = size_problem::<T>(size) {
        return Err(invalid(&why));
    }
    let lib = std::mem::size_of::<T>();
    let n = (size as usize).min(lib);
    let mut out = defaults;
    // SAFETY: `n` ≤ `size` bytes readable at `src`, `n` ≤ `lib` writable at `out`; every field
    // is valid for any bytes (Sized32), and `size` is a multiple of the struct's alignment
    // (`size_problem`), so no field is taken in part (half a caller's pointer beside half of
    // the default's would be a wild pointer, dereferenced later as a string).
    unsafe { std::ptr::copy_nonoverlapping(src, &mut out as *mut T as *mut u8, n) };
    if size as usize > lib {
        // SAFETY: the caller's bytes past ours, within its `size`.
        let extra = unsafe { std::slice::from_raw_parts(src.add(lib), size as usize - lib) };
        if let Some(k) = extra.iter().position(|&b| b != 0) {
            return Err(unsupported(&format!(
                "{}: byte {} is set, in a field this library ({} bytes of it, gpufeed {}) does \
                 not know: the program's header is newer than the library",
                T::NAME,
                lib + k,
                lib,
                env!("CARGO_PKG_VERSION")
            )));
        }
    }
    // SAFETY: writes the library's own size into its own copy (offset 0, u32).
    unsafe { (&mut out as *mut T as *mut u32).write(lib as u32) };
    Ok(out)
}

/// An epoch of compressed batches, or of decoded ones.
enum CEpoch {
    Bytes(Epoch),
    Images(ImageEpoch),
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
        ErrorKind::TimedOut => GPUFEED_ERR_TIMEOUT,
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

/// A path from C: its bytes as they are (a file name need not be UTF-8).
fn c_path(s: &CStr) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes()))
}

fn unsupported(msg: &str) -> i32 {
    set_error(msg);
    GPUFEED_ERR_UNSUPPORTED
}

/// The last error message on this thread (empty if none); valid until the next gpufeed call
/// on this thread. As `errno`, a call that succeeds leaves it: read it after a failure.
#[no_mangle]
pub extern "C" fn gpufeed_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The options `gpufeed_options_default` writes: the loader settings' table (with `RANK` and
/// `WORLD_SIZE` from the environment, as torchrun sets them) and every dataset option at its
/// default.
fn defaults() -> gpufeed::Result<GpufeedOptions> {
    LoaderSettings::from_env().map(|s| options_from(&s))
}

/// The options struct holding the loader settings `s` and the dataset options' defaults.
fn options_from(s: &LoaderSettings) -> GpufeedOptions {
    let order = match s.order {
        Order::Global => 0,
        Order::ShardBuffer { .. } => 1,
        Order::Block { .. } => 2,
        Order::Sequential => 3,
    };
    GpufeedOptions {
        struct_size: std::mem::size_of::<GpufeedOptions>() as u32,
        batch_size: s.batch_size,
        order,
        seed: s.seed,
        rank: s.rank,
        world_size: s.world_size,
        device: match s.device {
            Device::Cuda(i) => i as i32,
            _ => -1,
        },
        prefetch: s.prefetch,
        drop_last: 0,
        verify: s.verify.into(),
        last_batch: match s.last_batch {
            LastBatch::Short => GPUFEED_LAST_BATCH_SHORT,
            LastBatch::Drop => GPUFEED_LAST_BATCH_DROP,
            LastBatch::Pad => GPUFEED_LAST_BATCH_PAD,
        },
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
        memory_budget: s.memory_budget,
        timeout_ms: s.timeout.map_or(0, |t| t.as_millis().max(1) as u64),
        in_flight: s.in_flight,
        queue_depth: s.queue_depth,
        shuffle_buffer: s.shuffle_buffer,
        open_blocks: s.open_blocks,
        block_bytes: s.block_bytes,
        open_files_max: s.open_files_max.unwrap_or(0),
        cache_dir: std::ptr::null(),
        cache_limit: 0,
        cache_extent: 0,
    }
}

/// The loader settings of `o` through the table every front door shares (the struct's values as
/// given: `gpufeed_options_default` read the environment).
fn loader_settings(o: &GpufeedOptions) -> gpufeed::Result<LoaderSettings> {
    let mut s = LoaderSettings::default();
    let order = match o.order {
        0 => "global",
        1 => "shard-buffer",
        2 => "block",
        3 => "sequential",
        n => {
            return Err(gpufeed::Error::new(
                ErrorKind::InvalidInput,
                format!("unknown order {n} (0 global, 1 shard-buffer, 2 block, 3 sequential)"),
            ))
        }
    };
    let last = match (o.drop_last, o.last_batch) {
        (d, _) if d != 0 => "drop",
        (_, GPUFEED_LAST_BATCH_SHORT) => "short",
        (_, GPUFEED_LAST_BATCH_DROP) => "drop",
        (_, GPUFEED_LAST_BATCH_PAD) => "pad",
        (_, n) => {
            return Err(gpufeed::Error::new(
                ErrorKind::InvalidInput,
                format!("unknown last_batch {n} (0 short, 1 drop, 2 pad)"),
            ))
        }
    };
    let device = match o.device {
        d if d < 0 => "cpu".to_string(),
        d => format!("cuda:{d}"),
    };
    let mut given: Vec<(&str, String)> = vec![
        ("batch_size", o.batch_size.to_string()),
        ("order", order.to_string()),
        ("seed", o.seed.to_string()),
        ("rank", o.rank.to_string()),
        ("world_size", o.world_size.to_string()),
        ("device", device),
        ("prefetch", o.prefetch.to_string()),
        ("last_batch", last.to_string()),
        ("verify", (o.verify != 0).to_string()),
    ];
    // 0: the default.
    let optional = [
        ("in_flight", o.in_flight as u64),
        ("queue_depth", o.queue_depth as u64),
        ("shuffle_buffer", o.shuffle_buffer as u64),
        ("open_blocks", o.open_blocks as u64),
        ("block_bytes", o.block_bytes),
        ("memory_budget", o.memory_budget),
        ("open_files_max", o.open_files_max as u64),
    ];
    given.extend(
        optional
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|(k, v)| (k, v.to_string())),
    );
    if o.timeout_ms != 0 {
        given.push(("timeout", format!("{}ms", o.timeout_ms)));
    }
    for (k, v) in given {
        s.set(k, &v).map_err(|e| {
            gpufeed::Error::new(
                ErrorKind::InvalidInput,
                format!("gpufeed_options.{}", e.message()),
            )
        })?;
    }
    Ok(s)
}

/// Default options: the loader settings' defaults (gpufeed.LOADER_SETTINGS, `gpufeed bench
/// load --help`: batches of 256, global order, seed 0, host memory, prefetch 2, in flight 2, a
/// short last batch, checksums verified, QD 128, a 4 GiB budget), `rank` and `world_size` from
/// `RANK` and `WORLD_SIZE` when set (else 0 of 1), every dataset option at its default. An
/// unreadable `RANK` or `WORLD_SIZE` is an error (the defaults without them are written).
///
/// `struct_size`: the caller's `sizeof(gpufeed_options)` (the header's
/// `gpufeed_options_default(o)` macro passes it): the fields it has are written, and the size.
///
/// # Safety
/// `out` must be null or point to `struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_options_default_sized(
    out: *mut GpufeedOptions,
    struct_size: u32,
) -> i32 {
    if out.is_null() {
        return invalid("options pointer is null");
    }
    let size = match size_given::<GpufeedOptions>(struct_size) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let (o, status) = match defaults() {
        Ok(o) => (o, GPUFEED_OK),
        Err(e) => (options_from(&LoaderSettings::default()), status_of(&e)),
    };
    // SAFETY: non-null and writable for `size` bytes per the contract.
    unsafe { write_sized(out, o, size) };
    status
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
        ("cache_dir", o.cache_dir),
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
    if o.cache_limit != 0 {
        opts.set("cache_limit", &o.cache_limit.to_string())?;
    }
    if o.cache_extent != 0 {
        opts.set("cache_extent", &o.cache_extent.to_string())?;
    }
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
            list.push(c_path(unsafe { CStr::from_ptr(p) }));
        }
        let o = if opts.is_null() {
            match defaults() {
                Ok(o) => o,
                Err(e) => return status_of(&e),
            }
        } else {
            let d = match defaults() {
                Ok(o) => o,
                Err(e) => return status_of(&e),
            };
            // SAFETY: non-null, a filled options struct of its `struct_size` per the contract.
            match unsafe { read_sized(opts, d) } {
                Ok(o) => o,
                Err(e) => return e,
            }
        };
        let built = loader_settings(&o).and_then(|settings| {
            // SAFETY: the strings of `o` are NUL-terminated per the contract.
            unsafe { dataset_options(&o) }
                .and_then(|mut opts| {
                    // The open waits for a store no longer than a batch is waited for.
                    opts.store = opts.store.open_timeout(settings.timeout);
                    Dataset::open_paths(&list, &opts)
                })
                .and_then(|ds| {
                    Loader::builder(ds)
                        .front_door(gpufeed::config::FrontDoor::C)
                        .settings(&settings)
                        .build()
                })
        });
        match built {
            Ok(loader) => {
                let json = loader.dataset().options().to_json().to_string();
                let settings_json = loader.settings().to_json().to_string();
                let problems = loader
                    .dataset()
                    .problems()
                    .iter()
                    .map(|e| CString::new(e.report().replace('\0', " ")).unwrap_or_default())
                    .collect();
                let h = Box::new(GpufeedLoader {
                    loader,
                    images: None,
                    epoch: None,
                    options_json: CString::new(json).unwrap_or_default(),
                    settings_json: CString::new(settings_json).unwrap_or_default(),
                    images_json: CString::default(),
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

/// The loader settings in effect, as a JSON object of text values (null: unset): the names of
/// gpufeed.LOADER_SETTINGS, as Python's `Loader.settings` and `gpufeed bench load --json` give
/// them; valid until the loader is closed. Null for a null loader.
///
/// # Safety
/// `l` must be null or a loader from `gpufeed_loader_open` not yet closed.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_settings(l: *const GpufeedLoader) -> *const c_char {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }.map_or(std::ptr::null(), |l| l.settings_json.as_ptr())
}

/// The image settings in effect since `gpufeed_loader_decode_images`, as a JSON object of text
/// values (null: not used by the transform): the names of gpufeed.IMAGE_SETTINGS, as Python's
/// `Images.settings` and `gpufeed bench decode --json` give them; valid until the next
/// `gpufeed_loader_decode_images` or the loader is closed. Empty before decoding was asked
/// for; null for a null loader.
///
/// # Safety
/// `l` must be null or a loader from `gpufeed_loader_open` not yet closed.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_image_settings(l: *const GpufeedLoader) -> *const c_char {
    // SAFETY: valid or null per the contract.
    unsafe { l.as_ref() }.map_or(std::ptr::null(), |l| l.images_json.as_ptr())
}

/// Reads and checks every sample of the dataset at `path` (any path `gpufeed_loader_open`
/// takes), as `gpufeed verify` does: checksums and frames where the format has them, whether
/// each image is what its name claims, and what indexing found wrong. `*samples` gets the
/// samples checked and `*bad` the bad samples and files. `GPUFEED_OK` when none is bad;
/// `GPUFEED_ERR_SAMPLE` when some are, with the first one's message (file, sample, what was
/// wrong) and the count in `gpufeed_last_error`; another status when the dataset cannot be
/// opened at all. Only the dataset options of `opts` are used (null: their defaults).
///
/// # Safety
/// `path` a NUL-terminated string; `opts` null or a valid options struct whose non-null strings
/// are NUL-terminated; `samples` and `bad` writable (or null, not written).
#[no_mangle]
pub unsafe extern "C" fn gpufeed_verify(
    path: *const c_char,
    opts: *const GpufeedOptions,
    samples: *mut u64,
    bad: *mut u64,
) -> i32 {
    guard(|| {
        if path.is_null() {
            return invalid("path is null");
        }
        // SAFETY: NUL-terminated per the contract.
        let p = c_path(unsafe { CStr::from_ptr(path) });
        let o = if opts.is_null() {
            options_from(&LoaderSettings::default())
        } else {
            // SAFETY: non-null, a filled options struct of its `struct_size` per the contract.
            match unsafe { read_sized(opts, options_from(&LoaderSettings::default())) } {
                Ok(o) => o,
                Err(e) => return e,
            }
        };
        // SAFETY: the strings of `o` are NUL-terminated per the contract.
        let report = unsafe { dataset_options(&o) }
            .and_then(|opts| gpufeed::dataset::verify(&[p], &opts, &mut |_, _| {}));
        let report = match report {
            Ok(r) => r,
            Err(e) => return status_of(&e),
        };
        // SAFETY: writable (or null) per the contract.
        unsafe {
            if !samples.is_null() {
                samples.write(report.samples);
            }
            if !bad.is_null() {
                bad.write(report.bad_total);
            }
        }
        if report.ok() {
            return GPUFEED_OK;
        }
        let first = report.bad.first().map_or(String::new(), |e| e.report());
        set_error(&format!(
            "{} bad sample(s) or file(s); the first: {first}",
            report.bad_total
        ));
        GPUFEED_ERR_SAMPLE
    })
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
    // SAFETY: the loader per this function's contract; no stops.
    unsafe {
        gpufeed_loader_start_epoch_resumed(l, epoch, std::ptr::null(), std::ptr::null(), 0, start)
    }
}

/// The stops of a resumed epoch from two caller arrays of `n` entries (null with `n` 0).
///
/// # Safety
/// `world_sizes` and `batches` readable for `n` values each, or null with `n` 0.
unsafe fn stops_of(
    world_sizes: *const u32,
    batches: *const u32,
    n: u32,
) -> Result<Vec<gpufeed::plan::Stop>, i32> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if world_sizes.is_null() || batches.is_null() {
        return Err(invalid("world_sizes or batches is null with n > 0"));
    }
    if n as usize > gpufeed::plan::STOPS_MAX {
        return Err(invalid(&format!(
            "{n} stops: at most {} are kept",
            gpufeed::plan::STOPS_MAX
        )));
    }
    // SAFETY: both readable for `n` values per the contract; `n` is bounded above.
    let (w, b) = unsafe {
        (
            std::slice::from_raw_parts(world_sizes, n as usize),
            std::slice::from_raw_parts(batches, n as usize),
        )
    };
    Ok(w.iter()
        .zip(b)
        .map(|(&world_size, &batch)| gpufeed::plan::Stop { world_size, batch })
        .collect())
}

/// Resumes `epoch` on this loader's rank count after it stopped on others: stop `i` (oldest
/// first, `n` of them) had `world_sizes[i]` ranks, each of which had delivered `batches[i]`
/// batches (lockstep training stops them together). The loaders of the new ranks deliver every
/// sample the epoch still owed exactly once between them; this one from its batch `start` of
/// that rest. `n` 0: as `gpufeed_loader_start_epoch`. Ends the previous epoch, if any.
///
/// # Safety
/// As `gpufeed_loader_start_epoch`; `world_sizes` and `batches` readable for `n` values each,
/// or null with `n` 0.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_start_epoch_resumed(
    l: *mut GpufeedLoader,
    epoch: u64,
    world_sizes: *const u32,
    batches: *const u32,
    n: u32,
    start: u32,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(l) = (unsafe { l.as_mut() }) else {
            return invalid("loader is null");
        };
        // SAFETY: the arrays per the contract.
        let stops = match unsafe { stops_of(world_sizes, batches, n) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        l.epoch = None;
        let e = match &l.images {
            Some(il) => il.epoch_resumed(epoch, &stops, start).map(CEpoch::Images),
            None => l
                .loader
                .epoch_resumed(epoch, &stops, start)
                .map(CEpoch::Bytes),
        };
        match e {
            Ok(e) => {
                l.epoch = Some(e);
                GPUFEED_OK
            }
            Err(e) => status_of(&e),
        }
    })
}

/// Into `*out`, the batches this loader reads of what `n` stops left of `epoch` (as
/// `gpufeed_loader_start_epoch_resumed` takes them; `n` 0: `gpufeed_loader_batches`).
///
/// # Safety
/// As `gpufeed_loader_start_epoch_resumed`; `out` writable for one value.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_resumed_batches(
    l: *const GpufeedLoader,
    epoch: u64,
    world_sizes: *const u32,
    batches: *const u32,
    n: u32,
    out: *mut u32,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(l) = (unsafe { l.as_ref() }) else {
            return invalid("loader is null");
        };
        if out.is_null() {
            return invalid("out is null");
        }
        // SAFETY: the arrays per the contract.
        let stops = match unsafe { stops_of(world_sizes, batches, n) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        match l.loader.plan_epoch_resumed(epoch, &stops) {
            Ok(p) => {
                // SAFETY: writable per the contract.
                unsafe { out.write(p.batches()) };
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
        let next = match epoch {
            CEpoch::Bytes(e) => e
                .next()
                .map(|r| r.map(|b| GpufeedBatch::Bytes(Arc::new(b)))),
            CEpoch::Images(e) => e.next().map(|r| r.map(GpufeedBatch::Images)),
        };
        let next = match next {
            None => std::ptr::null_mut(),
            Some(Ok(b)) => Box::into_raw(Box::new(b)),
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
    unsafe { b.as_ref() }.map_or(0, |b| b.len() as u32)
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
        if i as usize >= b.len() {
            return invalid(&format!("sample {i} of a batch of {}", b.len()));
        }
        let i = i as usize;
        let (sample, device) = match b {
            GpufeedBatch::Bytes(b) => (b.sample(i), b.is_device()),
            GpufeedBatch::Images(b) if b.is_device() => {
                return invalid(
                    "this image batch is in device memory: use gpufeed_batch_to_dlpack and \
                     gpufeed_batch_sample_range",
                )
            }
            GpufeedBatch::Images(b) => {
                let per = image_bytes(b);
                let r = match b.error(i) {
                    Some(e) => Err(e),
                    None => Ok(&b.bytes()[i * per..(i + 1) * per]),
                };
                (r, false)
            }
        };
        match sample {
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
                if device {
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
        .and_then(|b| b.labels().get(i as usize).copied())
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
        .filter(|b| (i as usize) < b.len())
        .map_or(0, |b| u8::from(b.is_padding(i as usize)))
}

/// Bytes of one image of a decoded batch (its tensor's row).
fn image_bytes(b: &ImageBatch) -> usize {
    let s = b.shape();
    s[1] * s[2] * s[3] * b.dtype().size()
}

/// Sample `i`'s index in the dataset (`UINT32_MAX` when out of range).
///
/// # Safety
/// `b` null or a live batch.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_batch_sample_id(b: *const GpufeedBatch, i: u32) -> u32 {
    // SAFETY: valid or null per the contract.
    unsafe { b.as_ref() }
        .and_then(|b| b.sample_ids().get(i as usize).copied())
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
        if offset.is_null() || len.is_null() || i as usize >= b.len() {
            return invalid("null output or sample out of range");
        }
        let range = match b {
            GpufeedBatch::Bytes(b) => b.sample_range(i as usize),
            GpufeedBatch::Images(b) => {
                let per = image_bytes(b);
                match b.error(i as usize) {
                    Some(e) => Err(e),
                    None => Ok(i as usize * per..(i as usize + 1) * per),
                }
            }
        };
        match range {
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

/// The batch's memory as a DLPack tensor: for compressed samples a 1-D uint8 tensor (host:
/// kDLCPU; CUDA: kDLCUDA, after the batch's copy — make your stream wait first with the device
/// API) that sample ranges index into; for decoded images the image tensor, [N, 3, H, W] or
/// [N, H, W, 3] of the dtype asked for (host, or kDLCUDA on a CUDA loader: written by the
/// device pipeline's resize launch, which a stream must wait for as for a byte batch). The tensor keeps the memory alive until its
/// deleter is called, even after `gpufeed_batch_free`.
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
        let batch = match b {
            GpufeedBatch::Bytes(b) => b.clone(),
            GpufeedBatch::Images(im) => {
                let shape: Vec<i64> = im.shape().iter().map(|&d| d as i64).collect();
                let dtype = match im.dtype() {
                    PixelType::U8 => dlpack::UINT8,
                    PixelType::F16 => dlpack::FLOAT16,
                    PixelType::Bf16 => dlpack::BFLOAT16,
                    PixelType::F32 => dlpack::FLOAT32,
                };
                let (device, data) = match im.device_ptr() {
                    Some(p) => (
                        DLDevice {
                            device_type: dlpack::KDL_CUDA,
                            device_id: im.device().unwrap_or(0) as i32,
                        },
                        p as *mut c_void,
                    ),
                    None => (
                        DLDevice {
                            device_type: dlpack::KDL_CPU,
                            device_id: 0,
                        },
                        im.as_ptr() as *mut c_void,
                    ),
                };
                // SAFETY: the owner keeps the tensor's memory (the shape's product of elements
                // at `data`) alive until the deleter runs.
                let t = unsafe { dlpack::export_nd(im.keep_alive(), data, device, dtype, &shape) };
                // SAFETY: writable per the contract.
                unsafe { out.write(t) };
                return GPUFEED_OK;
            }
        };
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

/// The current (or last) epoch's figures: counts, the consumer's waiting split into storage,
/// copy, verify, decode and other, and CPU seconds by thread. All zero before an epoch starts.
///
/// `struct_size`: the caller's `sizeof(gpufeed_stats)` (the header's `gpufeed_loader_stats(l,
/// out)` macro passes it): the fields it has are written, and the size.
///
/// # Safety
/// `l` a live loader; `out` writable for `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_stats_sized(
    l: *const GpufeedLoader,
    out: *mut GpufeedStats,
    struct_size: u32,
) -> i32 {
    guard(|| {
        let size = match size_given::<GpufeedStats>(struct_size) {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: valid or null per the contract.
        let Some(l) = (unsafe { l.as_ref() }) else {
            return invalid("loader is null");
        };
        if out.is_null() {
            return invalid("out is null");
        }
        let st = match &l.epoch {
            Some(CEpoch::Bytes(e)) => e.stats().clone(),
            Some(CEpoch::Images(e)) => e.stats().clone(),
            None => gpufeed::LoaderStats::default(),
        };
        let s = GpufeedStats {
            struct_size: std::mem::size_of::<GpufeedStats>() as u32,
            batches: st.batches,
            samples: st.samples,
            sample_errors: st.sample_errors,
            bytes_delivered: st.bytes_delivered,
            bytes_read: st.bytes_read,
            reads: st.reads,
            consumer_wait_s: st.stall.total_s(),
            storage_s: st.stall.storage_s,
            copy_s: st.stall.copy_s,
            verify_s: st.stall.verify_s,
            decode_s: st.stall.decode_s,
            other_s: st.stall.other_s,
            io_thread_cpu_s: st.io_thread_cpu_s,
            consumer_cpu_s: st.consumer_cpu_s,
            decode_cpu_s: st.decode_cpu_s,
            remote_s: st.stall.remote_s,
        };
        // SAFETY: writable for `size` bytes per the contract (`size` checked ≥ 8).
        unsafe { write_sized(out, s, size) };
        GPUFEED_OK
    })
}

/// Fills `out` with the decoded-images defaults: train, 224, float32, NCHW, ImageNet's
/// mean and std, the decode threads by default (the cores divided by LOCAL_WORLD_SIZE), eval resize 256.
///
/// `struct_size`: the caller's `sizeof(gpufeed_images)` (the header's
/// `gpufeed_images_default(o)` macro passes it).
///
/// # Safety
/// `out` writable for `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_images_default_sized(
    out: *mut GpufeedImages,
    struct_size: u32,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return invalid("out is null");
        }
        let size = match size_given::<GpufeedImages>(struct_size) {
            Ok(s) => s,
            Err(e) => return e,
        };
        // SAFETY: writable for `size` bytes per the contract (checked ≥ 8).
        unsafe { write_sized(out, images_default(), size) };
        GPUFEED_OK
    })
}

/// The C door's number for image setting `name`'s value in `values` (the table's `c_codes`).
fn image_code(values: &[(&str, Option<String>)], name: &str) -> u32 {
    let v = values
        .iter()
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.as_deref())
        .unwrap_or_default();
    IMAGE_SETTINGS
        .iter()
        .find(|s| s.name == name)
        .and_then(|s| s.code_of(v))
        .expect("the table names every value its C door takes")
}

/// The decoded-images defaults (`gpufeed_images_default`): the table's.
fn images_default() -> GpufeedImages {
    let d = ImageSpec::default();
    let values = d.values();
    GpufeedImages {
        struct_size: std::mem::size_of::<GpufeedImages>() as u32,
        transform: image_code(&values, "transform"),
        size: d.size.0,
        dtype: image_code(&values, "dtype"),
        layout: image_code(&values, "layout"),
        mean: d.mean,
        std: d.std,
        threads: d.threads as u32,
        resize: 0,
    }
}

/// The image settings a filled `gpufeed_images` gives, as text: numbers for names through the
/// table's `c_codes`, 0 for "none" where 0 is not a value.
fn images_given(c: &GpufeedImages) -> Result<Vec<(&'static str, String)>, gpufeed::Error> {
    let name = |setting: &str, code: u32| -> Result<String, gpufeed::Error> {
        let s = IMAGE_SETTINGS
            .iter()
            .find(|s| s.name == setting)
            .expect("in the table");
        s.name_of_code(code).map(str::to_string)
    };
    let three = |x: [f32; 3]| format!("{},{},{}", x[0], x[1], x[2]);
    Ok(vec![
        ("transform", name("transform", c.transform)?),
        ("size", c.size.to_string()),
        ("dtype", name("dtype", c.dtype)?),
        ("layout", name("layout", c.layout)?),
        ("mean", three(c.mean)),
        ("std", three(c.std)),
        ("threads", c.threads.to_string()),
        (
            "resize",
            match c.resize {
                0 => "none".to_string(),
                r => r.to_string(),
            },
        ),
    ])
}

/// From the next `gpufeed_loader_start_epoch` on (an epoch in progress goes on undecoded to its
/// end), batches are decoded images (the CPU decode
/// stage on a host loader; the device pipeline on a CUDA one, into device memory):
/// `gpufeed_batch_to_dlpack` gives the image tensor,
/// `gpufeed_batch_sample` one image's bytes, and a sample that could not be decoded is
/// zero-filled and reported as `GPUFEED_ERR_SAMPLE` with its file and reason.
///
/// # Safety
/// `l` a live loader, `spec` a filled `gpufeed_images`; not used from two threads at once.
#[no_mangle]
pub unsafe extern "C" fn gpufeed_loader_decode_images(
    l: *mut GpufeedLoader,
    spec: *const GpufeedImages,
) -> i32 {
    guard(|| {
        // SAFETY: valid or null per the contract.
        let Some(l) = (unsafe { l.as_mut() }) else {
            return invalid("loader is null");
        };
        if spec.is_null() {
            return invalid("spec is null");
        }
        // SAFETY: non-null, a filled struct of its `struct_size` per the contract.
        let c = match unsafe { read_sized(spec, images_default()) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        let s = match images_given(&c).and_then(|g| ImageSpec::from_settings(&g)) {
            Ok(s) => s,
            Err(e) => return invalid(e.message()),
        };
        let json = s.settings_json().to_string();
        // An epoch in progress goes on as it started (it used to end here, its remaining batches
        // lost without a word): decoding applies from the next start.
        match l.loader.decode_images(s) {
            Ok(il) => {
                l.images = Some(il);
                l.images_json = CString::new(json).unwrap_or_default();
                GPUFEED_OK
            }
            Err(e) => status_of(&e),
        }
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
