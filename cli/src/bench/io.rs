//! `gpufeed bench io`: raw reads from one file through one engine, as fio measures them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::util::invalid;
use crate::util::{Histogram, SizeMix};
use gpufeed::config::{EngineConfig, EngineKind};
use gpufeed::error::{Error, Result};
use gpufeed::io::{Engine, ReadSpec};
use gpufeed::progress::Task;
use gpufeed::testing::sys;
use gpufeed::testing::Rng;

/// Offsets in order (wrapping at the end) or uniformly random (fio's `--norandommap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Seq,
    Rand,
}

impl std::str::FromStr for Pattern {
    type Err = Error;
    fn from_str(s: &str) -> Result<Pattern> {
        match s {
            "seq" | "read" => Ok(Pattern::Seq),
            "rand" | "randread" => Ok(Pattern::Rand),
            _ => Err(invalid(format!(
                "unknown pattern {s:?}; expected seq or rand"
            ))),
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Pattern::Seq => "seq",
            Pattern::Rand => "rand",
        })
    }
}

/// When reads are handed to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubmitPolicy {
    /// `Each` for reads averaging under 64 KiB, `Batch` above.
    Auto,
    /// One submission per read, as soon as its slot frees: the device queue never waits on
    /// our batch (at 4 KiB on the virtio disk: +13% IOPS over `Batch`, ≈ fio's IOPS).
    Each,
    /// Resubmit everything reaped in one go, then wait: fewer syscalls, best for large reads.
    Batch,
}

impl std::str::FromStr for SubmitPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<SubmitPolicy> {
        match s {
            "auto" => Ok(SubmitPolicy::Auto),
            "each" => Ok(SubmitPolicy::Each),
            "batch" => Ok(SubmitPolicy::Batch),
            _ => Err(invalid(format!(
                "unknown submit policy {s:?}; expected auto, each or batch"
            ))),
        }
    }
}

/// Mean read size under which [`SubmitPolicy::Auto`] submits each read on its own.
pub const SUBMIT_EACH_BELOW_BYTES: f64 = 64.0 * 1024.0;

/// One run of the I/O bench.
#[derive(Debug, Clone)]
pub struct IoBenchSpec {
    pub file: PathBuf,
    pub engine: EngineKind,
    pub pattern: Pattern,
    pub sizes: SizeMix,
    pub queue_depth: u32,
    pub seconds: f64,
    /// Pool threads (pread-pool); 0: one per queue slot.
    pub threads: u32,
    pub sqpoll: bool,
    pub defer_taskrun: bool,
    pub submit: SubmitPolicy,
    /// Completions to wait for before resubmitting; 0 chooses by policy (1 each, 4 batch).
    pub reap_batch: u32,
    pub register_buffers: bool,
    pub huge_pages: bool,
    pub seed: u64,
    /// Drop the file's cached pages before the run (buffered engines would otherwise read RAM).
    pub drop_cache: bool,
}

impl IoBenchSpec {
    /// Defaults for the given file, engine, pattern and sizes: QD 32, 10 s.
    pub fn new(
        file: impl Into<PathBuf>,
        engine: EngineKind,
        pattern: Pattern,
        sizes: SizeMix,
    ) -> Self {
        IoBenchSpec {
            file: file.into(),
            engine,
            pattern,
            sizes,
            queue_depth: 32,
            seconds: 10.0,
            threads: 0,
            sqpoll: false,
            defer_taskrun: false,
            submit: SubmitPolicy::Auto,
            reap_batch: 0,
            register_buffers: true,
            huge_pages: true,
            seed: 1,
            drop_cache: true,
        }
    }
}

/// What one run measured. Field names are the JSON keys.
#[derive(Debug, Clone, Serialize)]
pub struct IoBenchResult {
    pub engine: String,
    pub pattern: Pattern,
    pub bs: String,
    pub qd: u32,
    pub reads: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub gib_per_s: f64,
    pub iops: f64,
    pub lat_us_p50: f64,
    pub lat_us_p99: f64,
    pub lat_us_p999: f64,
    pub cpu_s: f64,
    pub cpu_s_per_gib: f64,
    pub syscalls_per_read: f64,
    /// "each" or "batch": how reads were submitted.
    pub submit: &'static str,
    /// Bytes read from the device per byte delivered (alignment widening).
    pub read_amplification: f64,
    pub direct: bool,
    pub fixed_buffers: bool,
    pub huge_page_bytes: Option<u64>,
    pub arena_bytes: u64,
    pub backend: String,
    pub file: String,
    pub file_bytes: u64,
}

/// Creates `path` with `size` bytes of a position-dependent pattern if it does not exist
/// (or is smaller). Returns the file's size. Shows progress; syncs and drops it from the cache.
pub fn ensure_file(path: &Path, size: u64) -> Result<u64> {
    use std::io::Write;
    let ctx = |e| Error::io("cannot create bench file", e).with_path(path.to_path_buf());
    if let Ok(m) = std::fs::metadata(path) {
        if m.len() >= size || size == 0 {
            return Ok(m.len());
        }
    }
    if size == 0 {
        return Err(
            invalid("the bench file does not exist and --size is 0").with_path(path.to_path_buf())
        );
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(ctx)?;
    }
    let tmp = path.with_extension("partial");
    let mut f = std::fs::File::create(&tmp).map_err(ctx)?;
    let mut prog = Task::bytes(format!("creating {}", path.display()), size);
    let chunk = 4usize << 20;
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    while off < size {
        let n = chunk.min((size - off) as usize);
        fill_pattern(&mut buf[..n], off);
        f.write_all(&buf[..n]).map_err(ctx)?;
        off += n as u64;
        prog.set(off);
    }
    f.sync_all().map_err(ctx)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(ctx)?;
    prog.finish();
    Ok(size)
}

/// The bench file's content: 8-byte words holding their own offset, mixed so no block repeats
/// and nothing compresses or deduplicates.
pub fn fill_pattern(buf: &mut [u8], offset: u64) {
    debug_assert_eq!(offset % 8, 0);
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let v = (offset + 8 * i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555_AAAA_0F0F_F0F0;
        let b = v.to_le_bytes();
        w.copy_from_slice(&b[..w.len()]);
    }
}

/// Draws each read of a run: a size from the mix, and a random offset on the grid (`blocks`
/// positions `align` apart) or the next sequential one (steps rounded up to `step_align`).
#[derive(Debug, Clone)]
pub(crate) struct Draw {
    pub(crate) pattern: Pattern,
    pub(crate) blocks: u64,
    pub(crate) align: u64,
    pub(crate) file_bytes: u64,
    pub(crate) step_align: u64,
    pub(crate) seq: u64,
}

impl Draw {
    /// The next read's offset and length.
    pub(crate) fn next(&mut self, rng: &mut Rng, sizes: &SizeMix) -> (u64, u32) {
        let len = sizes.pick(rng.next_u64());
        let step = (len as u64).next_multiple_of(self.step_align);
        let off = match self.pattern {
            Pattern::Rand => rng.below(self.blocks) * self.align,
            Pattern::Seq => {
                if self.seq + step > self.file_bytes {
                    self.seq = 0;
                }
                let o = self.seq;
                self.seq += step;
                o
            }
        };
        (off, len)
    }
}

/// Refuses a spec outside its limits, or a file smaller than the largest read (`max`); returns
/// the file's size.
pub(crate) fn check_spec(spec: &IoBenchSpec, max: u64) -> Result<u64> {
    if spec.queue_depth == 0 {
        return Err(invalid("queue depth must be at least 1"));
    }
    if !(spec.seconds > 0.0 && spec.seconds.is_finite()) {
        return Err(invalid("seconds must be positive"));
    }
    let file_bytes = std::fs::metadata(&spec.file)
        .map_err(|e| Error::io("cannot stat bench file", e).with_path(spec.file.clone()))?
        .len();
    if file_bytes < max {
        return Err(invalid(format!(
            "the bench file has {file_bytes} bytes, fewer than the largest read ({max})"
        ))
        .with_path(spec.file.clone()));
    }
    Ok(file_bytes)
}

pub(crate) fn drop_cached(path: &Path) {
    if let Ok(fd) = sys::open_read(path, false) {
        let _ = sys::fadvise(
            std::os::fd::AsFd::as_fd(&fd),
            0,
            0,
            gpufeed::testing::sys::Advice::POSIX_FADV_DONTNEED,
        );
    }
}

/// Runs one I/O bench. The file must exist (see [`ensure_file`]).
pub fn run_io_bench(spec: &IoBenchSpec) -> Result<IoBenchResult> {
    let max = spec.sizes.max() as u64;
    let file_bytes = check_spec(spec, max)?;
    // The std engine is synchronous: one read at a time whatever the queue depth.
    let qd = if spec.engine == EngineKind::Std {
        1
    } else {
        spec.queue_depth
    };
    // Room for the largest read plus alignment widening at both ends.
    let slot_bytes = (max as usize + 8192).next_power_of_two().max(4096);
    let cfg = EngineConfig {
        kind: spec.engine,
        queue_depth: qd,
        slot_bytes,
        slots: qd,
        threads: spec.threads,
        sqpoll: spec.sqpoll,
        defer_taskrun: spec.defer_taskrun,
        register_buffers: spec.register_buffers,
        huge_pages: spec.huge_pages,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(cfg)?;
    if spec.drop_cache {
        drop_cached(&spec.file);
    }
    let file = engine.open(&spec.file)?;
    let info = engine.file_info(file)?.clone();
    let align = spec.sizes.min().max(info.offset_align) as u64;
    let blocks = (file_bytes - max) / align + 1;
    let submit_each = match spec.submit {
        SubmitPolicy::Each => true,
        SubmitPolicy::Batch => false,
        SubmitPolicy::Auto => spec.sizes.mean() < SUBMIT_EACH_BELOW_BYTES,
    };
    let reap = match spec.reap_batch {
        0 if submit_each => 1,
        0 => 4.min(qd),
        n => n.min(qd),
    } as usize;

    let mut rng = Rng::new(spec.seed);
    let mut draw = Draw {
        pattern: spec.pattern,
        blocks,
        align,
        file_bytes,
        step_align: 1,
        seq: 0,
    };
    let mut next = |rng: &mut Rng| draw.next(rng, &spec.sizes);

    let mut hist = Histogram::default();
    let mut started = vec![Instant::now(); qd as usize];
    let mut lens = vec![0u32; qd as usize];
    let mut reads = 0u64;
    let mut bytes = 0u64;
    let cpu0 = sys::process_cpu_seconds();
    let sys0 = engine.syscalls();
    let raw0 = engine.stats().bytes_read;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(spec.seconds);
    let read_at = |offset, len| ReadSpec {
        file,
        offset,
        len,
        buf_offset: 0,
    };
    for (i, l) in lens.iter_mut().enumerate() {
        let slot = engine.arena().take().expect("one slot per queue entry");
        let (offset, len) = next(&mut rng);
        *l = len;
        engine
            .submit_one(slot, read_at(offset, len), i as u64)
            .map_err(|r| r.error)?;
    }
    let mut first_error = None;
    while engine.in_flight() > 0 {
        engine.wait(reap)?;
        // With one submission per read, `flush` below reaps more completions while we drain:
        // the clock and the deadline are read per completion, not per wait.
        while let Some(c) = engine.pop() {
            let now = Instant::now();
            let more = now < deadline && first_error.is_none();
            let i = c.user_data as usize;
            match c.outcome() {
                Ok(r) => {
                    hist.record((now - started[i]).as_nanos() as u64);
                    reads += 1;
                    bytes += r.len() as u64;
                    if r.len() != lens[i] as usize && first_error.is_none() {
                        first_error = Some(invalid(format!(
                            "short delivery: {} of {} bytes",
                            r.len(),
                            lens[i]
                        )));
                    }
                }
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(super_clone(e));
                    }
                }
            }
            if more {
                let (offset, len) = next(&mut rng);
                lens[i] = len;
                started[i] = now;
                engine
                    .submit_one(c.slot, read_at(offset, len), i as u64)
                    .map_err(|r| r.error)?;
                if submit_each {
                    engine.flush()?;
                }
            } else {
                engine.arena().put(c.slot);
            }
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_s = sys::process_cpu_seconds() - cpu0;
    if let Some(e) = first_error {
        return Err(e);
    }
    let syscalls = engine.syscalls() - sys0;
    let raw = engine.stats().bytes_read - raw0;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let us = |q| hist.quantile(q) as f64 / 1000.0;
    Ok(IoBenchResult {
        engine: engine.kind().name().to_string(),
        pattern: spec.pattern,
        bs: spec.sizes.label().to_string(),
        qd,
        reads,
        bytes,
        seconds,
        gib_per_s: gib / seconds,
        iops: reads as f64 / seconds,
        lat_us_p50: us(0.5),
        lat_us_p99: us(0.99),
        lat_us_p999: us(0.999),
        cpu_s,
        cpu_s_per_gib: if gib > 0.0 { cpu_s / gib } else { 0.0 },
        syscalls_per_read: if reads > 0 {
            syscalls as f64 / reads as f64
        } else {
            0.0
        },
        submit: if submit_each { "each" } else { "batch" },
        read_amplification: if bytes > 0 {
            raw as f64 / bytes as f64
        } else {
            0.0
        },
        direct: info.direct,
        fixed_buffers: engine.buffers_registered(),
        huge_page_bytes: engine.arena().huge_page_bytes(),
        arena_bytes: engine.arena().len() as u64,
        backend: engine.describe(),
        file: spec.file.display().to_string(),
        file_bytes,
    })
}

fn super_clone(e: &Error) -> Error {
    let mut c = Error::new(e.kind(), e.to_string());
    if let Some(p) = e.path() {
        c = c.with_path(p.to_path_buf());
    }
    c
}

/// The table header matching [`table_row`].
pub fn table_header() -> String {
    format!(
        "{:<15} {:<5} {:<9} {:>4} {:>8} {:>9} {:>8} {:>8} {:>10} {:>9}",
        "engine", "pat", "bs", "qd", "GiB/s", "IOPS", "p50 µs", "p99 µs", "CPU-s/GiB", "sys/read"
    )
}

/// One result as a table row.
pub fn table_row(r: &IoBenchResult) -> String {
    let bs = if r.bs.len() > 9 { "mix" } else { &r.bs };
    format!(
        "{:<15} {:<5} {:<9} {:>4} {:>8.3} {:>9.0} {:>8.0} {:>8.0} {:>10.3} {:>9.2}",
        r.engine,
        r.pattern.to_string(),
        bs,
        r.qd,
        r.gib_per_s,
        r.iops,
        r.lat_us_p50,
        r.lat_us_p99,
        r.cpu_s_per_gib,
        r.syscalls_per_read
    )
}
