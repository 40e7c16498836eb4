//! `gpufeed bench gpu`: storage → GPU, side by side in one run.
//!
//! Two workloads: random 1 MiB reads of one file, and one epoch of the ImageNet mix from packed
//! shards (global order). For each, five rows:
//!
//! - `ours`: io_uring O_DIRECT reads into the pinned, registered arena, one `cuMemcpyHtoDAsync`
//!   per read group on a copy stream, the slot freed when the copy's event completes;
//! - `cufile`: cuFile reads into registered device memory from a thread pool (says whether GDS or
//!   its compatibility mode ran);
//! - `naive`: `pread` into pageable memory, then a synchronous `cuMemcpyHtoD`, one thread (the
//!   pattern of a plain training script);
//! - `h2d` (ceiling): pinned host → device copies of the same group size, no storage;
//! - `host` (ceiling): the same reads into host memory only (`ours` without the copy).
//!
//! Every row reports GiB/s and CPU-seconds per GiB (process CPU time, all threads); caches are
//! dropped before each storage row when root.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::bench::load::drop_caches;
use gpufeed::buf::{Arena, ArenaConfig};
use gpufeed::config::{EngineConfig, EngineKind};
use gpufeed::dataset::Dataset;
use gpufeed::error::{Error, ErrorKind, Result};
use gpufeed::gpu::{Device, DevicePool};
use gpufeed::io::{Engine, ReadSpec};
use gpufeed::loader::Loader;
use gpufeed::plan::Order;
use gpufeed::testing::cuda::{self, Context, DeviceBuffer, Event, HostRegistration, Stream};
use gpufeed::testing::cufile::{self, CufileBuffer, CufileFile};
use gpufeed::testing::sys;
use gpufeed::testing::CopyPipeline;
use gpufeed::testing::Rng;

/// What to run.
#[derive(Debug, Clone)]
pub struct GpuBenchSpec {
    /// File for the fixed-size reads (created if missing).
    pub file: PathBuf,
    pub file_bytes: u64,
    /// Packed dataset for the ImageNet mix (generated like `bench load` if missing).
    pub dir: PathBuf,
    pub samples: u64,
    pub seconds: f64,
    pub device: u32,
    pub read_bytes: u32,
    pub queue_depth: u32,
    pub cufile_threads: usize,
    /// Rows to run: ours, cufile, naive, h2d, host.
    pub rows: Vec<String>,
    /// Workloads: "fixed", "imagenet".
    pub workloads: Vec<String>,
    /// Loader rows check crc32c (the loader's default).
    pub verify: bool,
}

/// One row.
#[derive(Debug, Clone, Serialize)]
pub struct GpuBenchResult {
    pub workload: String,
    pub path: String,
    pub bytes: u64,
    pub seconds: f64,
    pub gib_per_s: f64,
    pub cpu_s_per_gib: f64,
    /// What actually ran (e.g. "cufile compat", "io_uring → pinned → H2D").
    pub detail: String,
    pub device: String,
    pub cold_cache: bool,
}

fn cpu_now() -> f64 {
    sys::process_cpu_seconds()
}

#[allow(
    clippy::too_many_arguments,
    reason = "one row's columns, each named at the call"
)]
fn result(
    workload: &str,
    path: &str,
    bytes: u64,
    t0: Instant,
    cpu0: f64,
    detail: String,
    device: &str,
    cold: bool,
) -> GpuBenchResult {
    let seconds = t0.elapsed().as_secs_f64();
    let gib = bytes as f64 / (1u64 << 30) as f64;
    GpuBenchResult {
        workload: workload.into(),
        path: path.into(),
        bytes,
        seconds,
        gib_per_s: gib / seconds,
        cpu_s_per_gib: (cpu_now() - cpu0) / gib.max(1e-12),
        detail,
        device: device.into(),
        cold_cache: cold,
    }
}

/// Runs the benchmark; an `Unsupported` error (one line) when there is no GPU.
/// The rows `bench gpu` knows, in their default order.
pub const ROWS: [&str; 5] = ["host", "h2d", "ours", "cufile", "naive"];

/// The rows asked for, each once, in the order asked (so that runs can alternate it); an
/// unknown name is an error that lists the known ones.
pub fn rows_in_order(asked: &[String]) -> Result<Vec<&'static str>> {
    let mut rows = Vec::new();
    for r in asked {
        let Some(known) = ROWS.iter().find(|k| **k == r.as_str()) else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("unknown bench gpu row '{r}' (rows: {})", ROWS.join(", ")),
            ));
        };
        if !rows.contains(known) {
            rows.push(*known);
        }
    }
    Ok(rows)
}

pub fn run_gpu_bench(
    spec: &GpuBenchSpec,
    mut emit: impl FnMut(&GpuBenchResult),
) -> Result<Vec<GpuBenchResult>> {
    let info = gpufeed::gpu::gpu_available()?;
    let ctx = Context::new(spec.device)?;
    let device = format!("{} (CUDA driver {})", info.name, info.driver_version);
    let mut out = Vec::new();
    let mut push = |r: GpuBenchResult| {
        emit(&r);
        out.push(r);
    };
    let rows = rows_in_order(&spec.rows)?;
    if spec.workloads.iter().any(|w| w == "fixed") {
        crate::bench::io::ensure_file(&spec.file, spec.file_bytes)?;
        let w = format!(
            "{} random",
            gpufeed::config::size_label(spec.read_bytes as u64)
        );
        for &row in &rows {
            let r = match row {
                "host" => fixed_pipeline(spec, &ctx, false, &w, &device)?,
                "ours" => fixed_pipeline(spec, &ctx, true, &w, &device)?,
                "h2d" => h2d_ceiling(spec, &ctx, 64 << 20, &w, &device)?,
                "cufile" => match fixed_cufile(spec, &ctx, &w, &device) {
                    Ok(r) => r,
                    Err(e) => unavailable(&w, "cufile", &e, &device),
                },
                _ => fixed_naive(spec, &ctx, &w, &device)?,
            };
            push(r);
        }
    }
    if spec.workloads.iter().any(|w| w == "imagenet") {
        let (_, packed) = crate::bench::load::ensure_dataset(&spec.dir, spec.samples, 256 << 20)?;
        let ds = Dataset::open(&packed)?;
        let w = "imagenet mix, packed, global";
        for &row in &rows {
            let r = match row {
                "host" => epoch_row(spec, &ds, Device::Host, w, &device)?,
                "ours" => epoch_row(spec, &ds, Device::Cuda(spec.device), w, &device)?,
                "h2d" => h2d_ceiling(spec, &ctx, 128 << 20, w, &device)?,
                "cufile" => match samples_cufile(spec, &ctx, &ds, w, &device) {
                    Ok(r) => r,
                    Err(e) => unavailable(w, "cufile", &e, &device),
                },
                _ => samples_naive(spec, &ctx, &ds, w, &device)?,
            };
            push(r);
        }
    }
    Ok(out)
}

fn unavailable(w: &str, path: &str, e: &Error, device: &str) -> GpuBenchResult {
    GpuBenchResult {
        workload: w.into(),
        path: path.into(),
        bytes: 0,
        seconds: 0.0,
        gib_per_s: 0.0,
        cpu_s_per_gib: 0.0,
        detail: format!("unavailable: {}", e.report()),
        device: device.into(),
        cold_cache: false,
    }
}

/// Random offsets of whole `bs`-byte blocks in a file of `size` bytes.
fn offsets(size: u64, bs: u32, seed: u64) -> impl FnMut() -> u64 {
    let blocks = (size / bs as u64).max(1);
    let mut rng = Rng::new(seed);
    move || rng.below(blocks) * bs as u64
}

/// Fixed-size reads through the engine into 16-read slots; with `copy`, each filled slot goes
/// to the device in one copy and is freed when its event completes.
fn fixed_pipeline(
    spec: &GpuBenchSpec,
    ctx: &Arc<Context>,
    copy: bool,
    w: &str,
    device: &str,
) -> Result<GpuBenchResult> {
    const PER_SLOT: usize = 16;
    let bs = spec.read_bytes as usize;
    let slot_bytes = bs * PER_SLOT;
    let slots = (spec.queue_depth as usize).div_ceil(PER_SLOT).max(2) as u32 + 2;
    let cfg = EngineConfig {
        slot_bytes,
        slots,
        reads_per_job_max: PER_SLOT as u32,
        ..EngineConfig::new(EngineKind::Uring, spec.queue_depth, slot_bytes)
    };
    let arena = Arena::new(&ArenaConfig {
        slot_bytes,
        slots,
        huge_pages: true,
    })?;
    // CUDA registration first, then io_uring's (as the loader does). Locals drop in reverse:
    // the copy stage (which waits for its copies) before the registration, and that before the
    // arena.
    let mut pin = if copy {
        // SAFETY: `arena` outlives `pin` (declared after it, dropped before it).
        Some(unsafe { HostRegistration::new(ctx, arena.as_ptr(), arena.len())? })
    } else {
        None
    };
    // Device regions and the copy pipeline only for the row that copies. Declared before the
    // engine, so dropped after it (reads cancelled first), and after `pin` (before it unpins).
    let mut pipe = if copy {
        let pool = DevicePool::cuda(ctx, 4, slot_bytes)?;
        Some(CopyPipeline::<()>::new(&pool, arena.clone())?)
    } else {
        None
    };
    let mut engine = Engine::with_arena(cfg, arena.clone())?;
    let file = engine.open(&spec.file)?;
    let size = engine.file_info(file)?.size;
    let mut next = offsets(size, spec.read_bytes, 7);
    let cold = drop_caches();
    let mut bytes = 0u64;
    let mut tag = 0u64;
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    let deadline = t0 + std::time::Duration::from_secs_f64(spec.seconds);
    let mut specs = Vec::with_capacity(PER_SLOT);
    loop {
        let running = Instant::now() < deadline;
        while let Some(slot) = running.then(|| arena.take()).flatten() {
            specs.clear();
            for k in 0..PER_SLOT {
                specs.push(ReadSpec {
                    file,
                    offset: next(),
                    len: bs as u32,
                    buf_offset: k * bs,
                });
            }
            tag += 1;
            engine.submit(slot, &specs, tag).map_err(|r| r.error)?;
        }
        if engine.in_flight() == 0 && pipe.as_ref().is_none_or(|p| p.is_empty()) && !running {
            break;
        }
        if engine.in_flight() > 0 {
            engine.wait(1)?;
        }
        while let Some(c) = engine.pop() {
            for o in c.outcomes() {
                let r = o.as_ref().map_err(Error::clone)?;
                bytes += r.len() as u64;
            }
            match pipe.as_mut() {
                Some(p) => p.push(c.slot, slot_bytes, ()),
                None => arena.put(c.slot),
            }
        }
        if let Some(p) = pipe.as_mut() {
            let pool = p.pool().clone();
            // Regions go straight back: this row measures the copy, nothing consumes it.
            if let Err(e) = p.pump(engine.in_flight() == 0, |r, _, ()| pool.put_back(r)) {
                if p.broken() {
                    // A DMA may still read the arena: never unregister it.
                    std::mem::forget(pin.take());
                }
                return Err(e);
            }
        }
    }
    let detail = if copy {
        format!(
            "{} → pinned → H2D, QD {}",
            engine.kind().name(),
            spec.queue_depth
        )
    } else {
        format!(
            "{} → host only, QD {}",
            engine.kind().name(),
            spec.queue_depth
        )
    };
    Ok(result(
        w,
        if copy { "ours" } else { "host" },
        bytes,
        t0,
        cpu0,
        detail,
        device,
        cold,
    ))
}

/// Pinned host → device copies of `chunk` bytes, back to back on two streams.
fn h2d_ceiling(
    spec: &GpuBenchSpec,
    ctx: &Arc<Context>,
    chunk: usize,
    w: &str,
    device: &str,
) -> Result<GpuBenchResult> {
    let arena = Arena::new(&ArenaConfig {
        slot_bytes: chunk,
        slots: 2,
        huge_pages: true,
    })?;
    // SAFETY: `arena` outlives `_pin` (declared before it).
    let _pin = unsafe { HostRegistration::new(ctx, arena.as_ptr(), arena.len())? };
    let dst = [
        DeviceBuffer::new(ctx, chunk)?,
        DeviceBuffer::new(ctx, chunk)?,
    ];
    let streams = [Stream::new(ctx)?, Stream::new(ctx)?];
    let events = [Event::new(ctx)?, Event::new(ctx)?];
    let mut bytes = 0u64;
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    let mut k = 0usize;
    while t0.elapsed().as_secs_f64() < spec.seconds {
        let i = k % 2;
        if k >= 2 {
            events[i].synchronize()?;
        }
        // SAFETY: the source lies in the registered arena; the destination is our buffer; the
        // event is waited on before the same buffers are used again.
        unsafe {
            cuda::memcpy_htod_async(
                dst[i].ptr(),
                arena.as_ptr().add(i * chunk),
                chunk,
                &streams[i],
            )?
        };
        events[i].record(&streams[i])?;
        bytes += chunk as u64;
        k += 1;
    }
    for s in &streams {
        s.synchronize()?;
    }
    Ok(result(
        w,
        "h2d",
        bytes,
        t0,
        cpu0,
        format!(
            "pinned H2D, {} per copy",
            gpufeed::config::size_label(chunk as u64)
        ),
        device,
        false,
    ))
}

/// Device buffers registered with cuFile, one per reader thread.
struct CufileBuffers(Vec<CufileBuffer>);

impl CufileBuffers {
    fn new(ctx: &Arc<Context>, threads: usize, len: usize) -> Result<CufileBuffers> {
        let v = (0..threads.max(1))
            .map(|_| CufileBuffer::new(ctx, len))
            .collect::<Result<_>>()?;
        Ok(CufileBuffers(v))
    }

    /// Runs `f(thread, buffer)` on one thread per buffer (the context bound), until each
    /// returns; the first error wins.
    fn each(
        &mut self,
        ctx: &Arc<Context>,
        f: impl Fn(usize, &mut CufileBuffer) -> Result<()> + Sync,
    ) -> Result<()> {
        std::thread::scope(|s| {
            let hs: Vec<_> = self
                .0
                .iter_mut()
                .enumerate()
                .map(|(k, b)| {
                    let f = &f;
                    s.spawn(move || ctx.bind().and_then(|()| f(k, b)))
                })
                .collect();
            hs.into_iter()
                .try_for_each(|h| h.join().unwrap_or_else(|_| Err(panicked())))
        })
    }
}

/// cuFile reads from `threads` threads into registered device buffers.
fn fixed_cufile(
    spec: &GpuBenchSpec,
    ctx: &Arc<Context>,
    w: &str,
    device: &str,
) -> Result<GpuBenchResult> {
    let mode = cufile::status()?;
    let f = CufileFile::open(&spec.file)?;
    let size = std::fs::metadata(&spec.file)
        .map_err(|e| Error::io("cannot stat", e))?
        .len();
    let bs = spec.read_bytes as usize;
    let threads = spec.cufile_threads.max(1);
    let mut bufs = CufileBuffers::new(ctx, threads, bs)?;
    let cold = drop_caches();
    let bytes = AtomicU64::new(0);
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    let r = bufs.each(ctx, |k, b| {
        let mut next = offsets(size, bs as u32, 100 + k as u64);
        while t0.elapsed().as_secs_f64() < spec.seconds {
            let n = f.read(b, bs, next())?;
            bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(())
    });
    let res = result(
        w,
        "cufile",
        bytes.load(Ordering::Relaxed),
        t0,
        cpu0,
        format!("cufile {}, {threads} threads", mode.name()),
        device,
        cold,
    );
    r?;
    Ok(res)
}

fn panicked() -> Error {
    Error::new(ErrorKind::Io, "a benchmark thread panicked")
}

/// `pread` into pageable memory, then a synchronous copy, one read at a time.
fn fixed_naive(
    spec: &GpuBenchSpec,
    ctx: &Arc<Context>,
    w: &str,
    device: &str,
) -> Result<GpuBenchResult> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(&spec.file).map_err(|e| Error::io("cannot open", e))?;
    let size = f.metadata().map_err(|e| Error::io("cannot stat", e))?.len();
    let bs = spec.read_bytes as usize;
    let mut dst = DeviceBuffer::new(ctx, bs)?;
    let mut buf = vec![0u8; bs];
    let mut next = offsets(size, spec.read_bytes, 9);
    let cold = drop_caches();
    let mut bytes = 0u64;
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < spec.seconds {
        f.read_exact_at(&mut buf, next())
            .map_err(|e| Error::io("read failed", e))?;
        dst.write(0, &buf)?;
        bytes += bs as u64;
    }
    Ok(result(
        w,
        "naive",
        bytes,
        t0,
        cpu0,
        "pread → pageable → cuMemcpyHtoD, 1 thread".into(),
        device,
        cold,
    ))
}

/// One epoch through the loader, on the host or a device.
fn epoch_row(
    spec: &GpuBenchSpec,
    ds: &Dataset,
    dev: Device,
    w: &str,
    device: &str,
) -> Result<GpuBenchResult> {
    let on_gpu = !matches!(dev, Device::Host);
    let loader = Loader::builder(ds.clone())
        .order(Order::Global)
        .queue_depth(spec.queue_depth)
        .verify_checksums(spec.verify)
        .device(dev)
        .build()?;
    let cold = drop_caches();
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    let mut epoch = loader.epoch(0)?;
    for b in epoch.by_ref() {
        b?;
    }
    let st = epoch.stats().clone();
    let detail = format!(
        "loader: {}{}",
        st.engine,
        if spec.verify { ", crc32c checked" } else { "" }
    );
    Ok(result(
        w,
        if on_gpu { "ours" } else { "host" },
        st.bytes_delivered,
        t0,
        cpu0,
        detail,
        device,
        cold,
    ))
}

/// Every sample of a global order, cuFile-read into device memory by a thread pool.
fn samples_cufile(
    spec: &GpuBenchSpec,
    ctx: &Arc<Context>,
    ds: &Dataset,
    w: &str,
    device: &str,
) -> Result<GpuBenchResult> {
    let mode = cufile::status()?;
    let files: Vec<CufileFile> = ds
        .files()
        .map(|f| CufileFile::open(&f.path))
        .collect::<Result<_>>()?;
    let order = sample_order(ds)?;
    let max = ds.samples().iter().map(|s| s.len).max().unwrap_or(1) as usize;
    let threads = spec.cufile_threads.max(1);
    let mut bufs = CufileBuffers::new(ctx, threads, max)?;
    let cold = drop_caches();
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    let r = bufs.each(ctx, |_, b| loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        let Some(&id) = order.get(k) else {
            return Ok(());
        };
        let smp = ds.sample(id as usize);
        let f = &files[smp.file as usize];
        let n = f.read(b, smp.len as usize, smp.offset)?;
        bytes.fetch_add(n as u64, Ordering::Relaxed);
    });
    let res = result(
        w,
        "cufile",
        bytes.load(Ordering::Relaxed),
        t0,
        cpu0,
        format!(
            "cufile {}, {threads} threads, one read per sample",
            mode.name()
        ),
        device,
        cold,
    );
    r?;
    Ok(res)
}

/// The loader's global order for epoch 0 (seed 0), as sample ids.
fn sample_order(ds: &Dataset) -> Result<Vec<u32>> {
    let cfg = gpufeed::plan::PlanConfig {
        batch_size: 1,
        ..Default::default()
    };
    gpufeed::plan::epoch_order(ds.samples(), &cfg, 0)
}

/// Every sample: `pread` into pageable memory, synchronous copy, one thread, until the epoch
/// ends or `seconds` pass.
fn samples_naive(
    spec: &GpuBenchSpec,
    ctx: &Arc<Context>,
    ds: &Dataset,
    w: &str,
    device: &str,
) -> Result<GpuBenchResult> {
    use std::os::unix::fs::FileExt;
    let files: Vec<std::fs::File> = ds
        .files()
        .map(|f| std::fs::File::open(&f.path).map_err(|e| Error::io("cannot open", e)))
        .collect::<Result<_>>()?;
    let order = sample_order(ds)?;
    let max = ds.samples().iter().map(|s| s.len).max().unwrap_or(1) as usize;
    let mut dst = DeviceBuffer::new(ctx, max)?;
    let mut buf = vec![0u8; max];
    let cold = drop_caches();
    let mut bytes = 0u64;
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    for &id in &order {
        if t0.elapsed().as_secs_f64() > spec.seconds * 4.0 {
            break;
        }
        let s = ds.sample(id as usize);
        let b = &mut buf[..s.len as usize];
        files[s.file as usize]
            .read_exact_at(b, s.offset)
            .map_err(|e| ds.sample_error(id as usize, Error::io("read failed", e)))?;
        dst.write(0, b)?;
        bytes += s.len as u64;
    }
    Ok(result(
        w,
        "naive",
        bytes,
        t0,
        cpu0,
        "pread → pageable → cuMemcpyHtoD per sample, 1 thread".into(),
        device,
        cold,
    ))
}

/// The table header matching [`table_row`].
pub fn table_header() -> String {
    format!(
        "{:<28} {:<7} {:>8} {:>10}  {}",
        "workload", "path", "GiB/s", "CPU-s/GiB", "what ran"
    )
}

pub fn table_row(r: &GpuBenchResult) -> String {
    format!(
        "{:<28} {:<7} {:>8.3} {:>10.3}  {}",
        r.workload, r.path, r.gib_per_s, r.cpu_s_per_gib, r.detail
    )
}

/// Ratios the acceptance of the GPU path is judged by, per workload: ours against
/// min(host, h2d), against naive, and against cuFile.
pub fn ratios(rows: &[GpuBenchResult]) -> Vec<String> {
    let mut out = Vec::new();
    let mut workloads: Vec<&str> = rows.iter().map(|r| r.workload.as_str()).collect();
    workloads.dedup();
    for w in workloads {
        let get = |p: &str| {
            rows.iter()
                .find(|r| r.workload == w && r.path == p && r.bytes > 0)
        };
        let Some(ours) = get("ours") else { continue };
        let mut line = format!("{w}: ours");
        if let (Some(h), Some(d)) = (get("host"), get("h2d")) {
            line += &format!(
                " = {:.2}× min(host, h2d)",
                ours.gib_per_s / h.gib_per_s.min(d.gib_per_s)
            );
        }
        for p in ["naive", "cufile"] {
            if let Some(o) = get(p) {
                line += &format!(
                    ", {:.2}× {p} at {:.2}× its CPU/GiB",
                    ours.gib_per_s / o.gib_per_s,
                    ours.cpu_s_per_gib / o.cpu_s_per_gib.max(1e-12)
                );
            }
        }
        out.push(line);
    }
    out
}
