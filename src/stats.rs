//! What the loader measures and hands to the caller: the consumer's waits split by cause
//! ([`StallStats`]), each batch's timeline ([`BatchTiming`]) and an epoch's figures
//! ([`LoaderStats`]). Plain data, shared by byte and image batches and by the benchmarks; it
//! imports nothing of the loader (re-exported there, where the API has always named it).

/// Where the consumer's waiting went. Each wait for a batch is split by what the batch's read
/// group was doing meanwhile: its reads (or the reads ahead of it) not done — `storage`; its
/// copy to the device not done — `copy`; the consumer checking frames and checksums — `verify`;
/// the decode threads not done with it — `decode`; anything else (thread hand-offs, a slot held
/// by the consumer, ordering) — `other`. Reads that had to fetch from an object store (a remote
/// dataset's extents not yet in the node cache) count as `remote`, not `storage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StallStats {
    /// Waiting for reads.
    pub storage_s: f64,
    /// Waiting for reads that fetched from an object store.
    pub remote_s: f64,
    /// Waiting for the host → device copy.
    pub copy_s: f64,
    /// Waiting for frames and checksums to be checked: on the consumer's thread, or by the
    /// I/O thread (which checks host groups ahead of the consumer when it has time).
    pub verify_s: f64,
    /// Waiting for decode.
    pub decode_s: f64,
    /// The rest.
    pub other_s: f64,
}

impl StallStats {
    /// All of it.
    pub fn total_s(&self) -> f64 {
        self.storage_s + self.remote_s + self.copy_s + self.verify_s + self.decode_s + self.other_s
    }

    /// Adds `o`.
    pub fn add(&mut self, o: &StallStats) {
        self.storage_s += o.storage_s;
        self.remote_s += o.remote_s;
        self.copy_s += o.copy_s;
        self.verify_s += o.verify_s;
        self.decode_s += o.decode_s;
        self.other_s += o.other_s;
    }

    /// `self − o`, each part at least 0 (for the part of a running total since a snapshot).
    pub fn since(&self, o: &StallStats) -> StallStats {
        StallStats {
            storage_s: (self.storage_s - o.storage_s).max(0.0),
            remote_s: (self.remote_s - o.remote_s).max(0.0),
            copy_s: (self.copy_s - o.copy_s).max(0.0),
            verify_s: (self.verify_s - o.verify_s).max(0.0),
            decode_s: (self.decode_s - o.decode_s).max(0.0),
            other_s: (self.other_s - o.other_s).max(0.0),
        }
    }

    /// The part that took the most: "storage", "remote", "copy", "verify", "decode" or
    /// "other".
    pub fn bound(&self) -> &'static str {
        [
            ("storage", self.storage_s),
            ("remote", self.remote_s),
            ("copy", self.copy_s),
            ("verify", self.verify_s),
            ("decode", self.decode_s),
            ("other", self.other_s),
        ]
        .into_iter()
        .fold(("other", -1.0), |a, b| if b.1 > a.1 { b } else { a })
        .0
    }

    /// Splits the wait `[t0, t1]` by the group's timeline: reads until `read_done` (`remote`
    /// when they fetched from an object store), then the copy until `copy_done` or the I/O
    /// thread's checks until `checked` (its group waited for them from `read_done`);
    /// `verify_s` (the consumer's own checks, after `t1`) is added as given.
    pub(crate) fn of_wait(
        t0: std::time::Instant,
        t1: std::time::Instant,
        read_done: std::time::Instant,
        copy_done: Option<std::time::Instant>,
        checked: Option<std::time::Instant>,
        verify_s: f64,
        remote: bool,
    ) -> StallStats {
        let span = |a: std::time::Instant, b: std::time::Instant| {
            let (a, b) = (a.max(t0), b.min(t1));
            if b > a {
                (b - a).as_secs_f64()
            } else {
                0.0
            }
        };
        let storage_s = span(t0, read_done);
        let copy_s = copy_done.map_or(0.0, |c| span(read_done, c));
        let checks_s = checked.map_or(0.0, |c| span(read_done, c));
        let total = (t1 - t0).as_secs_f64();
        let (storage_s, remote_s) = if remote {
            (0.0, storage_s)
        } else {
            (storage_s, 0.0)
        };
        StallStats {
            storage_s,
            remote_s,
            copy_s,
            verify_s: verify_s + checks_s,
            decode_s: 0.0,
            other_s: (total - storage_s - remote_s - copy_s - checks_s).max(0.0),
        }
    }
}

/// One batch's timings: how long the consumer waited for it (and why), and its read group's
/// own timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct BatchTiming {
    /// The consumer's wait for this batch, split by cause (its total).
    pub stall: StallStats,
    /// The group's reads: submitted → last completion.
    pub read_s: f64,
    /// The group's host → device copy (0 on the host).
    pub copy_s: f64,
    /// From the group's arrival to this batch being handed out.
    pub queue_s: f64,
}

/// What an epoch delivered so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoaderStats {
    /// Batches handed out.
    pub batches: u64,
    /// Samples handed out (padding included).
    pub samples: u64,
    /// Samples delivered as padding (repeats that even out ranks, `LastBatch::Pad`).
    pub padding: u64,
    /// Samples handed out as errors.
    pub sample_errors: u64,
    /// Bytes of samples delivered.
    pub bytes_delivered: u64,
    /// Bytes read from files (aligned, with the gaps coalescing read through).
    pub bytes_read: u64,
    /// Reads issued (after coalescing).
    pub reads: u64,
    /// Time the consumer spent waiting for the next batch.
    pub consumer_wait_s: f64,
    /// The consumer's time in `next` (waiting and checking), split by cause.
    pub stall: StallStats,
    /// CPU seconds of the loader's I/O thread while it read this epoch (its groups from the
    /// first handed over to the last; the thread also serves neighbouring epochs).
    pub io_thread_cpu_s: f64,
    /// CPU seconds of the consumer's thread inside `next` (the frame and checksum checks of
    /// batches it took before the I/O thread had checked them).
    pub consumer_cpu_s: f64,
    /// CPU seconds the I/O thread spent checking this epoch's groups (frames and checksums;
    /// part of `io_thread_cpu_s`).
    pub check_cpu_s: f64,
    /// CPU seconds of the decode threads on this epoch's samples (decoded epochs).
    pub decode_cpu_s: f64,
    /// Engine kind that served the reads (after fallbacks).
    pub engine: String,
    /// The device image path: where its time went, phase by phase (`None` elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_phases: Option<PhaseTable>,
    /// The memory the loader holds (the same for every epoch of a loader).
    pub memory: MemoryStats,
}

/// The memory a loader holds, allocated once when it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryStats {
    /// The read buffers: slots × slot bytes (pinned for CUDA on a CUDA loader).
    pub arena_bytes: u64,
    /// Bytes of each slot.
    pub slot_bytes: u64,
    /// The dataset's index in memory (samples, keys, metadata).
    pub index_bytes: u64,
    /// Device memory of the read groups' regions (0 on the host).
    pub device_bytes: u64,
    /// The image stage's decoded batches: on the host, the batch tensors made and not yet
    /// dropped (those queued ahead and those the consumer holds), when the figures were taken;
    /// on a device, its pool of output tensors. 0 for a loader of bytes.
    pub decode_bytes: u64,
}

impl LoaderStats {
    /// Reads issued per sample delivered.
    pub fn reads_per_sample(&self) -> f64 {
        self.reads as f64 / self.samples.max(1) as f64
    }
    /// Bytes read per byte delivered.
    pub fn read_amplification(&self) -> f64 {
        self.bytes_read as f64 / self.bytes_delivered.max(1) as f64
    }
}

/// Where the device image path's time went in an epoch, phase by phase
/// ([`LoaderStats::device_phases`]): wall and thread-CPU seconds on the thread that does each,
/// and the CPU it costs per image on each route.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PhaseTable {
    /// The phases in pipeline order.
    pub phases: Vec<PhaseTime>,
    /// Images decoded by the JPEG engines (their stand-in on the simulated device).
    pub hardware_images: u64,
    /// Images decoded on the CPU and uploaded.
    pub cpu_images: u64,
    /// Images lost (read, checksum or decode errors).
    pub failed_images: u64,
    /// CPU milliseconds per image (= CPU-s per 1,000 images) of the work every image shares
    /// (the per-batch phases: checks, gathers, staging, the engines' and kernels' calls, the
    /// hand-off) over all images.
    pub shared_cpu_ms_per_image: f64,
    /// CPU milliseconds per image on the engine route: its header probe, and the shared work.
    pub hardware_cpu_ms_per_image: f64,
    /// CPU milliseconds per image on the CPU route: its decode, and the shared work.
    pub cpu_route_cpu_ms_per_image: f64,
    /// CPU seconds of the decode threads in all (phases and the rest of their work).
    pub decode_threads_cpu_s: f64,
    /// CPU seconds of the loader's I/O thread (reads, checks, the copies to the device).
    pub io_thread_cpu_s: f64,
}

/// One phase of [`PhaseTable`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PhaseTime {
    /// Its name (`gather`, `probe`, `engine-call`, ...).
    pub phase: String,
    /// The thread that does it: `feeder`, `decode` (a decode thread), `consumer`.
    pub thread: String,
    /// Wall seconds spent in it (summed over the threads doing it).
    pub wall_s: f64,
    /// Thread-CPU seconds spent in it.
    pub cpu_s: f64,
    /// Times it ran (per batch, per image or per chunk: see the phase).
    pub count: u64,
}
