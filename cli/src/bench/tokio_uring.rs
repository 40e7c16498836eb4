//! `gpufeed bench io --engine tokio-uring` (feature `tokio-uring`): the read loop a Rust
//! developer would write instead of gpufeed's engine — a task per read in flight, each
//! `read_at` into its own owned buffer, O_DIRECT — at the same queue depth and the same random
//! offsets and sizes as [`super::run_io_bench`], so the two can be compared row by row.
//!
//! O_DIRECT needs the buffer, offset and length aligned: each task's buffer is a zeroed `Vec`
//! with 4 KiB to spare, read through the aligned slice of it (no unsafe code); offsets are drawn
//! on the same grid as gpufeed's (the smallest read size or 4 KiB, whichever is larger) and
//! lengths are rounded up to 4 KiB, as gpufeed's engine widens them (`read_amplification`).

use std::os::unix::fs::OpenOptionsExt;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio_uring::buf::BoundedBuf;

use super::io::{check_spec, drop_cached, Draw, IoBenchResult, IoBenchSpec};
use crate::util::Histogram;
use gpufeed::error::{Error, Result};
use gpufeed::testing::sys;
use gpufeed::testing::Rng;

/// The O_DIRECT alignment assumed for buffers, offsets and lengths.
const ALIGN: usize = 4096;

/// What one task measured.
#[derive(Default)]
struct TaskFigures {
    hist: Histogram,
    reads: u64,
    bytes: u64,
    bytes_read: u64,
    error: Option<String>,
}

/// Runs `spec` (random or sequential reads, its sizes, its queue depth) through tokio-uring.
pub fn run_tokio_uring_bench(spec: &IoBenchSpec) -> Result<IoBenchResult> {
    let max = (spec.sizes.max() as usize).next_multiple_of(ALIGN);
    let file_bytes = check_spec(spec, max as u64)?;
    if spec.drop_cache {
        drop_cached(&spec.file);
    }
    let qd = spec.queue_depth as usize;
    let align = (spec.sizes.min() as u64).max(ALIGN as u64);
    let blocks = (file_bytes - max as u64) / align + 1;
    let seconds = spec.seconds;
    let path = spec.file.clone();
    let sizes = spec.sizes.clone();
    let pattern = spec.pattern;
    let seed0 = spec.seed;
    let cpu0 = sys::process_cpu_seconds();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(seconds);
    let figures: Vec<TaskFigures> = tokio_uring::builder()
        .entries((2 * spec.queue_depth).next_power_of_two().max(64))
        .start(async move {
            let file = tokio_uring::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
                .await;
            let file = match file {
                Ok(f) => Rc::new(f),
                Err(e) => {
                    return vec![TaskFigures {
                        error: Some(format!("cannot open {} with O_DIRECT: {e}", path.display())),
                        ..TaskFigures::default()
                    }]
                }
            };
            let tasks: Vec<_> = (0..qd)
                .map(|k| {
                    let file = file.clone();
                    let sizes = sizes.clone();
                    let seed = seed0.wrapping_mul(1_000_003).wrapping_add(k as u64);
                    tokio_uring::spawn(async move {
                        let mut f = TaskFigures::default();
                        let mut rng = Rng::new(seed);
                        let mut buf = vec![0u8; max + ALIGN];
                        let skip = buf.as_ptr().align_offset(ALIGN);
                        let mut draw = Draw {
                            pattern,
                            blocks,
                            align,
                            file_bytes,
                            step_align: ALIGN as u64,
                            // Spread the tasks over the file, on the O_DIRECT grid.
                            seq: (k * max) as u64 % (file_bytes - max as u64 + 1) / ALIGN as u64
                                * ALIGN as u64,
                        };
                        while Instant::now() < deadline {
                            let (off, len) = draw.next(&mut rng, &sizes);
                            let len = len as usize;
                            let read_len = len.next_multiple_of(ALIGN);
                            let started = Instant::now();
                            let (res, slice) =
                                file.read_at(buf.slice(skip..skip + read_len), off).await;
                            buf = slice.into_inner();
                            match res {
                                Ok(n) if n >= len.min(read_len) => {
                                    f.hist.record(started.elapsed().as_nanos() as u64);
                                    f.reads += 1;
                                    f.bytes += len as u64;
                                    f.bytes_read += n as u64;
                                }
                                Ok(n) => {
                                    f.error =
                                        Some(format!("short read: {n} of {len} bytes at {off}"));
                                    break;
                                }
                                Err(e) => {
                                    f.error = Some(format!("read of {len} bytes at {off}: {e}"));
                                    break;
                                }
                            }
                        }
                        f
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(qd);
            for t in tasks {
                out.push(t.await.unwrap_or_else(|e| TaskFigures {
                    error: Some(format!("a reading task failed: {e}")),
                    ..TaskFigures::default()
                }));
            }
            out
        });
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = sys::process_cpu_seconds() - cpu0;
    if let Some(e) = figures.iter().find_map(|f| f.error.clone()) {
        return Err(Error::new(gpufeed::error::ErrorKind::Io, e).with_path(spec.file.clone()));
    }
    let mut hist = Histogram::default();
    let (mut reads, mut bytes, mut bytes_read) = (0u64, 0u64, 0u64);
    for f in &figures {
        hist.merge(&f.hist);
        reads += f.reads;
        bytes += f.bytes;
        bytes_read += f.bytes_read;
    }
    let gib = bytes as f64 / (1u64 << 30) as f64;
    Ok(IoBenchResult {
        engine: "tokio-uring".into(),
        pattern: spec.pattern,
        bs: spec.sizes.label().to_string(),
        qd: spec.queue_depth,
        reads,
        bytes,
        seconds: elapsed,
        gib_per_s: gib / elapsed,
        iops: reads as f64 / elapsed,
        lat_us_p50: hist.quantile(0.50) as f64 / 1e3,
        lat_us_p99: hist.quantile(0.99) as f64 / 1e3,
        lat_us_p999: hist.quantile(0.999) as f64 / 1e3,
        cpu_s: cpu,
        cpu_s_per_gib: cpu / gib.max(1e-12),
        // Not counted for this peer (no hook into tokio-uring's submissions).
        syscalls_per_read: f64::NAN,
        submit: "each",
        read_amplification: bytes_read as f64 / bytes.max(1) as f64,
        direct: true,
        fixed_buffers: false,
        huge_page_bytes: None,
        arena_bytes: (qd * (max + ALIGN)) as u64,
        backend: format!(
            "tokio-uring {} tasks, read_at into owned Vec buffers, O_DIRECT",
            qd
        ),
        file: spec.file.display().to_string(),
        file_bytes,
    })
}
