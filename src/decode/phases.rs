//! Where the device image path's time goes: per phase, the wall and thread-CPU time of the
//! thread doing it, counted as it runs (a clock read and a thread-CPU read around each phase:
//! about a microsecond), reported per epoch as a [`PhaseTable`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::device::RouteCounts;
use crate::image::{ColorSpace, ImageInfo, ImageKind};
use crate::stats::{PhaseTable, PhaseTime};

/// A phase of the device image path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The feeder waits for a free output tensor (the consumer holds them all).
    Region,
    /// The feeder runs the crc32c kernel over a group and reads the results back.
    Crc,
    /// The feeder gathers the bytes the decode threads need on the host.
    Gather,
    /// A decode thread reads an engine-route image's frame header and end.
    Probe,
    /// A decode thread decodes an image on the CPU route: a baseline JPEG (one the engines
    /// refused, or one whose header or end sent it here).
    CpuBaseline,
    /// ... a progressive JPEG.
    CpuProgressive,
    /// ... a CMYK or YCCK JPEG.
    CpuCmyk,
    /// ... another image (PNG, WebP, an unusual JPEG layout).
    CpuOther,
    /// Staging: room for a chunk's decoded images, the CPU route's pixels uploaded.
    Staging,
    /// Waiting for the engines to finish the previous batch before the decoder state is
    /// initialised again.
    EngineWait,
    /// The engines' batched-decode call (initialise, submit).
    EngineCall,
    /// The resize kernel's launch, its parameters uploaded.
    Kernels,
    /// The consumer makes the decoded batch (after its wait).
    Handoff,
}

/// Every phase, in pipeline order, with its name and its thread.
const PHASES: [(Phase, &str, &str); 13] = [
    (Phase::Region, "region", "feeder"),
    (Phase::Crc, "crc", "feeder"),
    (Phase::Gather, "gather", "feeder"),
    (Phase::Probe, "probe", "decode"),
    (Phase::CpuBaseline, "cpu-baseline", "decode"),
    (Phase::CpuProgressive, "cpu-progressive", "decode"),
    (Phase::CpuCmyk, "cpu-cmyk", "decode"),
    (Phase::CpuOther, "cpu-other", "decode"),
    (Phase::Staging, "staging", "decode"),
    (Phase::EngineWait, "engine-wait", "decode"),
    (Phase::EngineCall, "engine-call", "decode"),
    (Phase::Kernels, "kernels", "decode"),
    (Phase::Handoff, "handoff", "consumer"),
];

const N: usize = PHASES.len();

/// The CPU route's phase for an image with record `info`.
pub(crate) fn cpu_phase(info: Option<&ImageInfo>) -> Phase {
    match info {
        Some(i) if i.kind == ImageKind::Jpeg => {
            if matches!(i.colorspace, ColorSpace::Cmyk | ColorSpace::Ycck) {
                Phase::CpuCmyk
            } else if i.progressive {
                Phase::CpuProgressive
            } else {
                Phase::CpuBaseline
            }
        }
        _ => Phase::CpuOther,
    }
}

/// The phases' running totals (nanoseconds), since the stage was made.
#[derive(Debug, Default)]
pub(crate) struct PhaseClock {
    wall: [AtomicU64; N],
    cpu: [AtomicU64; N],
    count: [AtomicU64; N],
}

/// The totals at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PhaseSnap {
    wall: [u64; N],
    cpu: [u64; N],
    count: [u64; N],
}

impl PhaseClock {
    /// Runs `f` as phase `p`, on this thread.
    pub(crate) fn time<R>(&self, p: Phase, f: impl FnOnce() -> R) -> R {
        let (t0, c0) = (Instant::now(), crate::sys::thread_cpu_seconds());
        let r = f();
        let cpu = crate::sys::thread_cpu_seconds() - c0;
        self.add(
            p,
            t0.elapsed().as_nanos() as u64,
            (cpu * 1e9).max(0.0) as u64,
        );
        r
    }

    fn add(&self, p: Phase, wall_ns: u64, cpu_ns: u64) {
        let k = p as usize;
        self.wall[k].fetch_add(wall_ns, Ordering::Relaxed);
        self.cpu[k].fetch_add(cpu_ns, Ordering::Relaxed);
        self.count[k].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> PhaseSnap {
        let get = |a: &[AtomicU64; N]| std::array::from_fn(|k| a[k].load(Ordering::Relaxed));
        PhaseSnap {
            wall: get(&self.wall),
            cpu: get(&self.cpu),
            count: get(&self.count),
        }
    }
}

/// The table of what happened between `then` and `now` (phases and routes), with the decode
/// threads' and the I/O thread's CPU seconds over the same span.
pub(crate) fn table(
    (then, now): (&PhaseSnap, &PhaseSnap),
    (r0, r1): (&RouteCounts, &RouteCounts),
    decode_threads_cpu_s: f64,
    io_thread_cpu_s: f64,
) -> PhaseTable {
    let mut t = PhaseTable {
        hardware_images: r1.hardware - r0.hardware,
        cpu_images: r1.cpu - r0.cpu,
        failed_images: r1.failed - r0.failed,
        decode_threads_cpu_s,
        io_thread_cpu_s,
        ..PhaseTable::default()
    };
    let (mut shared, mut probe, mut cpu_decode) = (0.0, 0.0, 0.0);
    for (k, &(p, name, thread)) in PHASES.iter().enumerate() {
        let cpu_s = (now.cpu[k] - then.cpu[k]) as f64 * 1e-9;
        match p {
            Phase::Probe => probe += cpu_s,
            Phase::CpuBaseline | Phase::CpuProgressive | Phase::CpuCmyk | Phase::CpuOther => {
                cpu_decode += cpu_s
            }
            // Every other phase is the batch's, shared by its images (the feeder's wait for a
            // tensor among them: the consumer's pace, a condvar wait that costs no CPU).
            _ => shared += cpu_s,
        }
        t.phases.push(PhaseTime {
            phase: name.to_string(),
            thread: thread.to_string(),
            wall_s: (now.wall[k] - then.wall[k]) as f64 * 1e-9,
            cpu_s,
            count: now.count[k] - then.count[k],
        });
    }
    let all = t.hardware_images + t.cpu_images + t.failed_images;
    let per = |s: f64, n: u64| if n == 0 { 0.0 } else { s * 1e3 / n as f64 };
    t.shared_cpu_ms_per_image = per(shared, all);
    t.hardware_cpu_ms_per_image = per(probe, t.hardware_images) + t.shared_cpu_ms_per_image;
    t.cpu_route_cpu_ms_per_image = per(cpu_decode, t.cpu_images) + t.shared_cpu_ms_per_image;
    t
}
