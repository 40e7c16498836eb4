//! Every limit gpufeed runs under, validated in one place.
//!
//! Values are chosen at start-up and never grow: the arena, the operation table, the ring and
//! the worker pool are all allocated once from an [`EngineConfig`] that [`EngineConfig::validate`]
//! has accepted. Units are last in names (`queue_depth`, `slot_bytes`, `files_max`), and so
//! are bounds (`reads_per_job_max`, `OPEN_FILES_MAX`).
//!
//! A loader's settings, as every front door takes them, are in [`LOADER_SETTINGS`]; what they
//! and the dataset make of the plan's and the engine's limits is `loader_limits`.

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::plan::PlanConfig;

pub(crate) mod settings;

/// The size syntax every door reads (`4096`, `4K`, `1.5G`, `2KiB`: binary units) and writes
/// back, and sizes for people (`1.31 GiB`).
pub use crate::util::{bytes_human, parse_size, size_label};

pub use settings::{
    FrontDoor, LoaderSettings, OnError, Setting, BATCH_SIZE_MAX, GROUPS_MAX, LOADER_SETTINGS,
    OPEN_FILES_MAX, QUEUE_DEPTH_MAX, READS_PER_JOB_MAX, READS_PER_JOB_MIN,
};

/// The most arena slots.
pub const SLOTS_MAX: u32 = 1 << 20;
/// The largest arena slot.
pub const SLOT_BYTES_MAX: u64 = 1 << 30;
/// The largest arena (slots × slot bytes).
pub const ARENA_BYTES_MAX: u64 = 1 << 40;
/// The most reads of all jobs in flight (the engine's table of reads).
pub const READS_IN_FLIGHT_MAX: u32 = 1 << 22;
/// The most threads of the `pread` pool.
pub const POOL_THREADS_MAX: u32 = 1024;

/// Which backend serves reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// io_uring with O_DIRECT, registered files and fixed (registered) buffers.
    Uring,
    /// io_uring without O_DIRECT: reads go through the page cache, which is kept from
    /// filling up with `posix_fadvise(DONTNEED)`.
    UringBuffered,
    /// A pool of threads issuing `pread` (O_DIRECT): where io_uring is unavailable.
    PreadPool,
    /// Plain buffered `pread` on the calling thread, one read at a time: the simplest baseline.
    Std,
}

impl EngineKind {
    /// Name as used on the command line and in `GPUFEED_ENGINE`.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Uring => "uring",
            EngineKind::UringBuffered => "uring-buffered",
            EngineKind::PreadPool => "pread-pool",
            EngineKind::Std => "std",
        }
    }

    /// All kinds, in the order benchmarks show them.
    pub const ALL: [EngineKind; 4] = [
        EngineKind::Uring,
        EngineKind::UringBuffered,
        EngineKind::PreadPool,
        EngineKind::Std,
    ];

    /// Whether files are opened with O_DIRECT (where the file system allows it).
    pub fn direct(self) -> bool {
        matches!(self, EngineKind::Uring | EngineKind::PreadPool)
    }
}

impl std::str::FromStr for EngineKind {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> Result<EngineKind> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                invalid(format!(
                    "unknown engine {s:?}; expected one of uring, uring-buffered, pread-pool, std"
                ))
            })
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Environment variable that forces an engine kind (`uring`, `uring-buffered`, `pread-pool`,
/// `std`) whatever the configuration says: the escape hatch when io_uring misbehaves.
pub const ENV_ENGINE: &str = "GPUFEED_ENGINE";
/// Environment variable: `0` disables io_uring buffer registration (plain `Read` instead of
/// `ReadFixed`), as if registration had failed.
pub const ENV_REGISTER: &str = "GPUFEED_REGISTER_BUFFERS";

/// Limits and switches for an [`Engine`](crate::io::Engine).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Backend. Overridden by `GPUFEED_ENGINE` when `honor_env` is set.
    pub kind: EngineKind,
    /// Reads in flight at most (the ring size, or the pool's queue). 1..=[`QUEUE_DEPTH_MAX`].
    pub queue_depth: u32,
    /// Size of each arena slot. A multiple of 4096, at most 1 GiB.
    pub slot_bytes: usize,
    /// Number of arena slots. At least 1; default: `queue_depth`.
    pub slots: u32,
    /// Files open at once at most. 1..=[`OPEN_FILES_MAX`].
    pub files_max: u32,
    /// Reads one job may hold at most. 1..=[`READS_PER_JOB_MAX`].
    pub reads_per_job_max: u32,
    /// Reads of all jobs in flight at most (the engine's table of reads); 0: four times the
    /// queue depth or `reads_per_job_max`, whichever is more. A loader sets it to
    /// `reads_per_job_max` × its groups in flight, so every group it plans can be submitted.
    pub reads_in_flight_max: u32,
    /// Pool threads for `PreadPool`; 0 means `queue_depth` (capped at 256).
    pub threads: u32,
    /// io_uring SQPOLL (a kernel thread polls the queue; burns a core, off by default).
    pub sqpoll: bool,
    /// io_uring DEFER_TASKRUN: completions are posted only when the engine waits. Off by
    /// default: it cost IOPS with one submission per small read, and gained nothing otherwise.
    pub defer_taskrun: bool,
    /// For files read through the page cache (no O_DIRECT): drop what was read from the cache
    /// every 64 MiB (`POSIX_FADV_DONTNEED`) so a dataset larger than RAM does not flood it.
    /// Turn off when the dataset fits in memory and should stay cached.
    pub drop_cache_behind: bool,
    /// Register the arena with io_uring as fixed buffers (falls back if refused).
    pub register_buffers: bool,
    /// Back the arena with transparent huge pages.
    pub huge_pages: bool,
    /// Let `GPUFEED_ENGINE` / `GPUFEED_REGISTER_BUFFERS` override the fields above.
    pub honor_env: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            kind: EngineKind::Uring,
            queue_depth: 64,
            slot_bytes: 1 << 20,
            slots: 64,
            files_max: 256,
            reads_per_job_max: 4096,
            reads_in_flight_max: 0,
            threads: 0,
            sqpoll: false,
            defer_taskrun: false,
            drop_cache_behind: true,
            register_buffers: true,
            huge_pages: true,
            honor_env: true,
        }
    }
}

impl EngineConfig {
    /// A configuration with `queue_depth` reads in flight and as many slots of `slot_bytes`.
    pub fn new(kind: EngineKind, queue_depth: u32, slot_bytes: usize) -> EngineConfig {
        EngineConfig {
            kind,
            queue_depth,
            slot_bytes,
            slots: queue_depth,
            ..EngineConfig::default()
        }
    }

    /// Checks every limit; the error names the field and the allowed range.
    pub fn validate(&self) -> Result<()> {
        fn range(name: &str, v: u64, lo: u64, hi: u64) -> Result<()> {
            if v < lo || v > hi {
                Err(invalid(format!("{name} must be in {lo}..={hi}, got {v}")))
            } else {
                Ok(())
            }
        }
        range(
            "queue_depth",
            self.queue_depth as u64,
            1,
            QUEUE_DEPTH_MAX as u64,
        )?;
        range("slots", self.slots as u64, 1, SLOTS_MAX as u64)?;
        range("files_max", self.files_max as u64, 1, OPEN_FILES_MAX as u64)?;
        range(
            "reads_per_job_max",
            self.reads_per_job_max as u64,
            1,
            READS_PER_JOB_MAX as u64,
        )?;
        range(
            "reads_in_flight_max",
            self.reads_in_flight_max as u64,
            0,
            READS_IN_FLIGHT_MAX as u64,
        )?;
        range("threads", self.threads as u64, 0, POOL_THREADS_MAX as u64)?;
        range("slot_bytes", self.slot_bytes as u64, 4096, SLOT_BYTES_MAX)?;
        if !self.slot_bytes.is_multiple_of(4096) {
            return Err(invalid(format!(
                "slot_bytes must be a multiple of 4096, got {}",
                self.slot_bytes
            )));
        }
        (self.slot_bytes as u64)
            .checked_mul(self.slots as u64)
            .filter(|&b| b <= ARENA_BYTES_MAX)
            .ok_or_else(|| invalid("slot_bytes × slots exceeds 1 TiB"))?;
        Ok(())
    }

    /// Applies `GPUFEED_ENGINE` and `GPUFEED_REGISTER_BUFFERS` if `honor_env` is set.
    pub(crate) fn with_env(self) -> Result<EngineConfig> {
        self.with_overrides(
            std::env::var(ENV_ENGINE).ok().as_deref(),
            std::env::var(ENV_REGISTER).ok().as_deref(),
        )
    }

    /// Applies the values of `GPUFEED_ENGINE` and `GPUFEED_REGISTER_BUFFERS` (as given) if
    /// `honor_env` is set.
    pub fn with_overrides(
        mut self,
        engine: Option<&str>,
        register: Option<&str>,
    ) -> Result<EngineConfig> {
        if !self.honor_env {
            return Ok(self);
        }
        if let Some(v) = engine.filter(|v| !v.is_empty()) {
            self.kind = v.parse().map_err(|e: crate::error::Error| {
                invalid(format!("{ENV_ENGINE}: {}", e.message()))
            })?;
        }
        if register == Some("0") {
            self.register_buffers = false;
        }
        Ok(self)
    }

    /// Pool threads actually used by `PreadPool`.
    pub fn pool_threads(&self) -> u32 {
        if self.threads == 0 {
            self.queue_depth.min(256)
        } else {
            self.threads
        }
    }
}

/// File descriptors left to the rest of the process when gpufeed sizes its open files from the
/// `RLIMIT_NOFILE` soft limit.
const FDS_RESERVED: u64 = 256;

/// What a loader's groups need of the plan and the engine, from its settings and its dataset.
#[derive(Debug)]
pub(crate) struct LoaderShape<'a> {
    /// The dataset's samples (slot sizes come from the largest).
    pub samples: &'a crate::plan::Samples,
    /// The dataset's files.
    pub files: usize,
    /// Groups waiting for the consumer, at most.
    pub prefetch_groups: u32,
    /// Groups being read, at most.
    pub in_flight_groups: u32,
    /// The arena's memory budget.
    pub memory_budget_bytes: u64,
    /// The slot size was given (`LoaderBuilder::window`): keep `group_bytes_max` as it is.
    pub slot_explicit: bool,
    /// Files kept open at most, if the caller said.
    pub open_files_max: Option<u32>,
}

/// The plan and engine limits a loader runs under, and the read groups it keeps in flight:
/// slots sized from the dataset within the memory budget (unless given), every group the
/// planner may make within what one engine job holds, the engine's table large enough for
/// every group in flight, and as many files open as the groups in flight may touch (within
/// `RLIMIT_NOFILE`: where that leaves too few descriptors for the groups asked for, fewer are
/// kept in flight, saying so). The engine configuration is validated.
pub(crate) fn loader_limits(
    plan: &PlanConfig,
    engine: &EngineConfig,
    shape: &LoaderShape<'_>,
) -> Result<(PlanConfig, EngineConfig, u32)> {
    let mut plan = plan.clone();
    // The engine takes every group the planner may make: reads per group are capped at what
    // one job may hold, and its table holds every group in flight.
    let reads_per_job = (plan.batch_size as u64 * plan.window_batches as u64)
        .clamp(READS_PER_JOB_MIN as u64, READS_PER_JOB_MAX as u64) as u32;
    if plan.batch_size > reads_per_job {
        return Err(invalid(format!(
            "batch_size {} is above {BATCH_SIZE_MAX} samples, the most one read group may hold",
            plan.batch_size
        )));
    }
    // Every file of the groups in flight, and of the one being submitted, must be open: a
    // group touches at most batch size × batches per group files (fewer where the open-file
    // limit or open_files_max cannot hold that many; the planner cuts groups there). Counted
    // before, but not held to: a block-order window of small files was read as one group of
    // up to 4,096 files, and the epoch failed with every open file in use.
    let (open_files, in_flight, files_per_group) = open_files(
        shape.files as u64,
        plan.batch_size as u64 * plan.window_batches as u64,
        plan.batch_size as u64,
        shape.in_flight_groups,
        shape.open_files_max,
    )?;
    plan.reads_per_group_max = reads_per_job;
    plan.files_per_group_max =
        files_per_group.clamp(plan.batch_size as u64, u32::MAX as u64) as u32;
    let slots = shape.prefetch_groups + in_flight;
    if !shape.slot_explicit {
        plan.group_bytes_max =
            crate::plan::slot_bytes_for(shape.samples, &plan, slots, shape.memory_budget_bytes)?;
    }
    let slot_bytes = (plan.group_bytes_max as usize).next_multiple_of(4096);
    let engine = EngineConfig {
        slot_bytes,
        slots,
        files_max: open_files,
        reads_per_job_max: reads_per_job,
        reads_in_flight_max: reads_per_job.saturating_mul(in_flight),
        ..engine.clone()
    };
    engine.validate()?;
    Ok((plan, engine, in_flight))
}

/// Descriptors left to the rest of the process below the `RLIMIT_NOFILE` soft limit `soft`:
/// [`FDS_RESERVED`], or an eighth of a low limit (128 of `ulimit -n 1024`), at least 64.
fn fds_reserved(soft: u64) -> u64 {
    (soft / 8).clamp(64, FDS_RESERVED)
}

/// How many files the I/O thread may keep open, how many read groups it keeps in flight, and
/// how many files (reads) a group may touch: a group of at most `per_group` reads (files)
/// asked for, at least `batch` (one batch is one group's least), `in_flight` groups asked for;
/// the files of every group in flight and of the one being submitted (`per_group ×
/// (in_flight + 1)`, at most the dataset's `files`) must be open at once. Files kept open: the
/// dataset's, at most `asked` — by default twice what the read groups in flight need, at
/// least 1,024 (an ImageFolder's files are each read once an epoch: keeping tens of thousands
/// open gains nothing and left the trainer's own `open` and a second loader without
/// descriptors) — and what `RLIMIT_NOFILE` leaves (its soft limit raised toward the hard one
/// if the dataset needs more). Where that leaves too few for the groups asked for, groups
/// touch fewer files (down to a batch's), then fewer are kept in flight (said once); an error
/// if it leaves too few for one group of one batch, or `asked` is below that.
fn open_files(
    files: u64,
    per_group: u64,
    batch: u64,
    in_flight: u32,
    asked: Option<u32>,
) -> Result<(u32, u32, u64)> {
    let group_files = |per: u64, k: u32| per.saturating_mul(k as u64 + 1).min(files);
    let need = group_files(per_group, in_flight);
    let default = need.saturating_mul(2).max(1024);
    let want = files
        .min(asked.map_or(default, |n| n as u64))
        .min(OPEN_FILES_MAX as u64);
    if let Some(n) = asked {
        let least = group_files(batch, 1);
        if (n as u64) < least {
            return Err(invalid(format!(
                "open_files_max {n} is below the {least} files one read group in flight and \
                 the one being submitted may need at once (2 × the batch size)"
            )));
        }
    }
    let in_use = crate::sys::open_fds();
    let mut soft = crate::sys::nofile_limit().0;
    if soft < in_use + want + fds_reserved(soft) {
        soft = crate::sys::raise_nofile(in_use + want + FDS_RESERVED);
    }
    let reserved = fds_reserved(soft);
    let allowed = soft.saturating_sub(in_use + reserved).min(want);
    // Files per group: as asked if the groups in flight fit, else the most that lets them
    // (at least a batch's); then the most groups in flight (as many as asked at most) whose
    // files fit.
    let per = if group_files(per_group, in_flight) <= allowed {
        per_group
    } else {
        (allowed / (in_flight as u64 + 1)).clamp(batch.min(per_group), per_group)
    };
    let fits = (1..=in_flight)
        .rev()
        .find(|&k| group_files(per, k) <= allowed);
    let Some(k) = fits else {
        let hard = crate::sys::nofile_limit().1;
        let one = group_files(per, 1);
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "one read group in flight and the one being submitted may need {one} files \
                 open at once, and the open-file limit leaves {allowed} (soft limit {soft}, hard \
                 {hard}, {in_use} open now, {reserved} kept for the rest of the process): \
                 raise `ulimit -n`, use smaller batches (a read group is batch size × batches \
                 per group), give loaders already open a lower open_files_max, or pack the \
                 dataset into shards (`gpufeed pack`)"
            ),
        ));
    };
    // Said where the open-file limit (not the caller's open_files_max) cut them.
    if (k < in_flight || per < per_group) && asked.is_none() {
        let hard = crate::sys::nofile_limit().1;
        crate::util::notice(&format!(
            "{k} read group(s) in flight of at most {per} files each, instead of {in_flight} of \
             {per_group}: their files ({} open at once) fit the open-file limit ({allowed} left \
             of soft limit {soft}, hard {hard}); raise `ulimit -n` to read more at once",
            group_files(per, k)
        ));
    }
    Ok((allowed.max(1) as u32, k, per))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_limits_name_the_field() {
        EngineConfig::default().validate().unwrap();
        let e = EngineConfig {
            queue_depth: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(
            e.to_string().contains("queue_depth must be in 1..=4096"),
            "{e}"
        );
        let e = EngineConfig {
            slot_bytes: 5000,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("slot_bytes"), "{e}");
    }

    #[test]
    fn environment_forces_the_engine() {
        let c = EngineConfig::default()
            .with_overrides(Some("pread-pool"), Some("0"))
            .unwrap();
        assert_eq!(c.kind, EngineKind::PreadPool);
        assert!(!c.register_buffers);
        let c = EngineConfig::default()
            .with_overrides(Some("uring-buffered"), None)
            .unwrap();
        assert_eq!(c.kind, EngineKind::UringBuffered);
        let e = EngineConfig::default()
            .with_overrides(Some("turbo"), None)
            .unwrap_err();
        assert!(e.to_string().contains("GPUFEED_ENGINE"), "{e}");
        let c = EngineConfig {
            honor_env: false,
            ..Default::default()
        }
        .with_overrides(Some("std"), None)
        .unwrap();
        assert_eq!(c.kind, EngineKind::Uring);
    }

    #[test]
    fn engine_names_round_trip() {
        for k in EngineKind::ALL {
            assert_eq!(k.name().parse::<EngineKind>().unwrap(), k);
        }
        assert!("fast".parse::<EngineKind>().is_err());
    }
}
