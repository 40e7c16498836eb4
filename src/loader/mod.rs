//! ⑥ `Loader`: dataset ① → plan ② → engine ③ → batches, with bounded queues.
//!
//! One I/O thread serves the loader for its whole life: it owns the engine (io_uring binds to
//! the thread that drives it; one ring, the dataset's files opened once) and the copy pipeline,
//! and serves epochs in the order they are asked for, keeping up to `in_flight_groups` groups
//! being read and up to `prefetch_groups` finished groups waiting for the consumer; a group is
//! read into one slot. An epoch asked for before the current one ends is read as soon as the
//! current one has submitted its last group, so there is no bubble at the boundary. Memory is
//! the arena and nothing else, whatever the dataset's size; when the consumer is slow, slots
//! run out and reading pauses (back-pressure). Dropping an [`Epoch`] stops its reading and waits
//! until none of its reads or copies is in flight.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use crate::buf::Arena;
pub(crate) use crate::config::LoaderSettings;
use crate::config::{EngineConfig, EngineKind};
use crate::dataset::Dataset;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::gpu::{cuda, Device, DevicePool, GpuPath};
use crate::plan::{EpochPlan, LastBatch, Order, PlanConfig, Stop};
use crate::util::Unpoison;

mod checker;
mod epoch;
mod holders;
mod worker;

pub use crate::stats::{BatchTiming, LoaderStats, MemoryStats, PhaseTable, PhaseTime, StallStats};
pub(crate) use checker::{Checker, Taker};
pub use epoch::Epoch;
#[cfg(feature = "decode")]
pub(crate) use holders::Holders;

use holders::{Gauges, HoldersCtx};
use worker::{EpochJob, Retired, Service, WorkerCtx};

pub(crate) use crate::config::FrontDoor;

/// Makes the backend the loader's engine reads through (the simulated disk, in tests): called
/// once per I/O thread, with the number of the first epoch it serves.
pub type BackendFactory = Arc<dyn Fn(u64) -> Box<dyn crate::io::Backend> + Send + Sync>;

/// A backend factory and the engine kind it stands for (the kind decides O_DIRECT).
#[derive(Clone)]
struct CustomBackend {
    kind: EngineKind,
    make: BackendFactory,
}

impl std::fmt::Debug for CustomBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomBackend")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Loader`]; every setting has a default ([`LOADER_SETTINGS`](crate::config::LOADER_SETTINGS), the table every front
/// door shares).
#[derive(Debug, Clone)]
pub struct LoaderBuilder {
    dataset: Arc<Dataset>,
    /// The settings every door takes (order, batch size, ranks… are copied into `plan`).
    settings: LoaderSettings,
    /// The plan's other knobs (group size, coalescing), set through `window`, `coalescing`,
    /// `plan`.
    plan: PlanConfig,
    /// The engine's other knobs (the backend).
    engine: EngineConfig,
    gpu_path: GpuPath,
    /// `window` was set: its slot size is taken as given.
    slot_explicit: bool,
    backend: Option<CustomBackend>,
    door: FrontDoor,
    /// At most this many samples of a host group are checked by the I/O thread (tests).
    check_ahead_samples: usize,
}

/// Samples smaller than this on average are read at their files' direct-I/O alignment (512
/// bytes on most disks) rather than 4 KiB: below it, 4 KiB alignment costs over a fifth more
/// bytes than needed.
const SMALL_SAMPLE_BYTES: u64 = 16 << 10;

/// The direct-I/O alignment a local dataset's files need (offsets and memory, from `statx`),
/// between 512 bytes and 4 KiB, probed on at most 64 files spread over the dataset (a file not
/// probed that needs more is refused when opened, naming it). `None` — plan at 4 KiB — for a
/// remote dataset, a file that cannot be stat'ed, or files that report no alignment (no
/// direct I/O there) or more than 4 KiB.
fn files_dio_align(ds: &Dataset) -> Option<u32> {
    #[cfg(feature = "remote")]
    if !ds.remote_urls().is_empty() {
        return None;
    }
    let n = ds.file_count();
    let probes = n.min(64);
    let mut need = 512u32;
    for k in 0..probes {
        // Evenly spread, the first and the last included.
        let i = if probes == 1 {
            0
        } else {
            k * (n - 1) / (probes - 1)
        };
        let st = crate::sys::statx_path(&ds.file_path(i as u32)).ok()?;
        let a = st.dio_offset_align?.max(st.dio_mem_align?);
        if a > 4096 || !a.is_power_of_two() {
            return None;
        }
        need = need.max(a);
    }
    Some(need)
}

impl LoaderBuilder {
    /// Every setting at once, as the front doors give them ([`LoaderSettings::set`]).
    pub fn settings(mut self, settings: &LoaderSettings) -> Self {
        self.settings = settings.clone();
        self
    }
    /// Samples per batch (default 256).
    pub fn batch_size(mut self, n: u32) -> Self {
        self.settings.batch_size = n;
        self
    }
    /// The epoch order (default global).
    pub fn order(mut self, order: Order) -> Self {
        self.settings.set_order(order);
        self
    }
    /// The seed every epoch order derives from (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.settings.seed = seed;
        self
    }
    /// This process's rank and the number of ranks.
    pub fn rank(mut self, rank: u32, world_size: u32) -> Self {
        self.settings.rank = rank;
        self.settings.world_size = world_size;
        self
    }
    /// What happens to the samples that do not fill a rank's last batch: a short last batch
    /// (default; every sample exactly once), dropped, or padded to even out ranks.
    pub fn last_batch(mut self, policy: LastBatch) -> Self {
        self.settings.last_batch = policy;
        self
    }
    /// The familiar alias: `true` is [`LastBatch::Drop`], `false` [`LastBatch::Short`].
    pub fn drop_last(self, yes: bool) -> Self {
        self.last_batch(if yes {
            LastBatch::Drop
        } else {
            LastBatch::Short
        })
    }
    /// Finished groups waiting for the consumer, at most (default 2).
    pub fn prefetch_groups(mut self, n: u32) -> Self {
        self.settings.prefetch = n;
        self
    }
    /// Groups being read at once, at most (default 2).
    pub fn in_flight_groups(mut self, n: u32) -> Self {
        self.settings.in_flight = n;
        self
    }
    /// Batches per read group, and the slot size a group must fit (taken as given; without
    /// it, slots are sized from the dataset within the memory budget).
    pub fn window(mut self, batches: u32, group_bytes_max: u64) -> Self {
        self.plan.window_batches = batches;
        self.plan.group_bytes_max = group_bytes_max;
        self.slot_explicit = true;
        self
    }
    /// Reads through backends `make` builds (one per epoch, given the epoch), standing for
    /// engine `kind` — the seeded simulated disk (`io::sim`) drives a whole loader this way,
    /// latency, reordering, short reads and errors included.
    pub fn backend(mut self, kind: EngineKind, make: BackendFactory) -> Self {
        self.backend = Some(CustomBackend { kind, make });
        self
    }
    /// Memory the loader's arena may take (default 4 GiB; Python `memory_budget=`, CLI
    /// `--memory-budget`). Slots are sized from the dataset: the batch-size largest samples
    /// together when that fits, else as large as the budget allows.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.settings.memory_budget = bytes;
        self
    }
    /// Coalescing limits: largest gap read through, largest merged read.
    pub fn coalescing(mut self, gap_bytes_max: u64, read_bytes_max: u64) -> Self {
        self.plan.gap_bytes_max = gap_bytes_max;
        self.plan.read_bytes_max = read_bytes_max;
        self
    }
    /// The engine to read with (default io_uring).
    pub fn engine_kind(mut self, kind: EngineKind) -> Self {
        self.engine.kind = kind;
        self
    }
    /// Reads in flight in the engine (default 128).
    pub fn queue_depth(mut self, qd: u32) -> Self {
        self.settings.queue_depth = qd;
        self
    }
    /// Check every sample's crc32c where the format has one (default on).
    pub fn verify_checksums(mut self, yes: bool) -> Self {
        self.settings.verify = yes;
        self
    }
    /// Where batches are delivered: host memory (default), a CUDA device, or the simulated
    /// device (tests).
    pub fn device(mut self, device: Device) -> Self {
        self.settings.device = device;
        self
    }
    /// How reads reach a CUDA device (default: decided by the platform).
    pub fn gpu_path(mut self, path: GpuPath) -> Self {
        self.gpu_path = path;
        self
    }
    /// The whole plan configuration at once.
    pub fn plan(mut self, plan: PlanConfig) -> Self {
        let s = &mut self.settings;
        s.set_order(plan.order);
        s.seed = plan.seed;
        s.rank = plan.rank;
        s.world_size = plan.world_size;
        s.batch_size = plan.batch_size;
        s.last_batch = plan.last_batch;
        self.plan = plan;
        self
    }
    /// Reads only part `part` of `parts` of each epoch: the rank's batches `k` with
    /// `k % parts == part` (default 0 of 1: all of them). `parts` loaders, one per part, then
    /// deliver the rank's epoch between them — each batch once, equal to the batch one loader
    /// gives, in its order when taken from the parts in turn — which is what
    /// `gpufeed.torch.IterableDataset` gives each `DataLoader` worker. Batch indices
    /// ([`Epoch`] positions, resume points) count this part's batches.
    pub fn batch_part(mut self, part: u32, parts: u32) -> Self {
        self.plan.batch_part = (part, parts);
        self
    }

    /// A time limit on each wait for a batch (default none: the loader waits as long as it
    /// takes, as a trainer may pause for minutes). When a wait passes it, `next` gives an
    /// [`ErrorKind::TimedOut`] error naming what the batch waits for and who holds the read
    /// buffers; the epoch stays usable (the next call waits again). As `DataLoader(timeout=)`.
    pub fn timeout(mut self, limit: std::time::Duration) -> Self {
        self.settings.timeout = Some(limit);
        self
    }
    /// Files kept open at most (default: every file of the dataset, up to [`OPEN_FILES_MAX`](crate::config::OPEN_FILES_MAX)
    /// and what the open-file limit allows — the soft `RLIMIT_NOFILE` is raised toward the hard
    /// one if that is needed). With fewer than the dataset's files, each is opened when a read
    /// group needs it and the least recently used one with no read in flight is closed: an
    /// ImageFolder of any size reads this way, one `open` per file per epoch.
    pub fn open_files_max(mut self, n: u32) -> Self {
        self.settings.open_files_max = Some(n);
        self
    }
    /// Names settings in messages as `door` spells them (the Python and C packages set it).
    #[doc(hidden)]
    pub fn front_door(mut self, door: FrontDoor) -> Self {
        self.door = door;
        self
    }
    /// Testing: the I/O thread hands each host group over once it has checked `n` of its
    /// samples, leaving the rest to the consumer (default: all of them, unless the consumer is
    /// already waiting for the group). Makes the part-checked hand-over happen on demand.
    #[doc(hidden)]
    pub fn check_ahead_samples(mut self, n: usize) -> Self {
        self.check_ahead_samples = n;
        self
    }

    /// Checks the settings, sizes the slots and allocates the arena (on a device, also registers
    /// it and allocates the device regions).
    pub fn build(self) -> Result<Loader> {
        let s = &self.settings;
        let mut plan = s.plan(&self.plan);
        plan.validate()?;
        if s.prefetch == 0 || s.in_flight == 0 {
            return Err(invalid(format!(
                "{} and {} must be at least 1",
                self.door.prefetch(),
                self.door.spell("in_flight")
            )));
        }
        if s.timeout == Some(std::time::Duration::ZERO) {
            return Err(invalid(format!(
                "{} must be above 0 (leave it unset to wait as long as it takes)",
                self.door.timeout()
            )));
        }
        if self.dataset.is_empty() {
            return Err(invalid("the dataset has no samples"));
        }
        // Small samples are read at the alignment the files' direct I/O needs (statx), not
        // 4 KiB: a 1 KB sample read alone costs 1.5 KB at 512 bytes, 5 KB at 4 KiB. Larger ones
        // stay at 4 KiB, most devices' physical block: reads at 512 bytes cost this VM's disk
        // (512-byte logical, 4 KiB physical blocks) 7% of its rate at ~110 KB samples for 4%
        // fewer bytes. Only where the plan keeps the defaults (a choice by hand stays).
        let defaults = PlanConfig::default();
        let mean = self.dataset.samples().total_len() / self.dataset.len().max(1) as u64;
        if plan.align == defaults.align && self.engine.kind.direct() && mean < SMALL_SAMPLE_BYTES {
            if let Some(a) = files_dio_align(&self.dataset) {
                plan.align = a;
            }
        }
        if plan.gap_bytes_max == defaults.gap_bytes_max {
            plan.gap_bytes_max =
                crate::plan::gap_for(self.dataset.samples(), defaults.gap_bytes_max);
        }
        #[cfg(feature = "remote")]
        if plan.order == crate::plan::Order::Global && !self.dataset.remote_urls().is_empty() {
            let absent = crate::cache::node::absent_bytes(
                self.dataset
                    .files
                    .iter()
                    .filter_map(|f| self.dataset.sources.object(&f.path)),
            );
            // A few extents missing (damaged ones being fetched again by another process, the
            // tail another rank has not published yet: the S3 soak met both) cost a few GETs;
            // a cache lacking more than a sixteenth of the dataset is the case refused.
            if absent > self.dataset.total_bytes() / 16 {
                return Err(invalid(format!(
                    "global order over a remote dataset whose node cache lacks {} would fetch an \
                     extent for every sample; use {} block or shard-buffer, or fill the cache \
                     first: gpufeed cache warm {}",
                    crate::util::bytes_human(absent),
                    self.door.spell("order"),
                    self.dataset.remote_urls().join(" ")
                )));
            }
        }
        let (limited, engine, in_flight) = crate::config::loader_limits(
            &plan,
            &EngineConfig {
                queue_depth: s.queue_depth,
                ..self.engine.clone()
            },
            &crate::config::LoaderShape {
                samples: self.dataset.samples(),
                files: self.dataset.file_count(),
                prefetch_groups: s.prefetch,
                in_flight_groups: s.in_flight,
                memory_budget_bytes: s.memory_budget,
                slot_explicit: self.slot_explicit,
                open_files_max: s.open_files_max,
            },
        )?;
        plan = limited;
        // Memory is allocated once: every epoch's engine reads into this arena.
        let arena = Arena::new(&crate::buf::ArenaConfig {
            slot_bytes: engine.slot_bytes,
            slots: engine.slots,
            huge_pages: engine.huge_pages,
        })?;
        let regions = (s.prefetch + in_flight) as usize;
        let gpu = match &s.device {
            Device::Host => None,
            Device::Simulated(sim) => Some(Arc::new(GpuState {
                _pin: None,
                pool: DevicePool::sim(sim, regions, engine.slot_bytes)?,
                _arena: arena.clone(),
            })),
            Device::Cuda(ordinal) => {
                if self.gpu_path == GpuPath::Cufile {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        "the loader reads through io_uring → pinned → H2D; cuFile runs in \
                         `gpufeed bench gpu` only so far",
                    ));
                }
                let ctx = crate::gpu::context(*ordinal)?;
                // SAFETY: the arena stays mapped while `GpuState` lives: it holds a reference
                // to it, and its fields drop the registration before that reference.
                let pin =
                    unsafe { cuda::HostRegistration::new(&ctx, arena.as_ptr(), arena.len())? };
                Some(Arc::new(GpuState {
                    _pin: Some(pin),
                    pool: DevicePool::cuda(&ctx, regions, engine.slot_bytes)?,
                    _arena: arena.clone(),
                }))
            }
        };
        Ok(Loader {
            service: Arc::default(),
            arena,
            gpu,
            plan,
            engine,
            prefetch_groups: s.prefetch,
            in_flight_groups: in_flight,
            verify_checksums: s.verify,
            timeout: s.timeout,
            settings: self.settings.clone(),
            dataset: self.dataset,
            backend: self.backend,
            pid: std::process::id(),
            door: self.door,
            check_ahead_samples: self.check_ahead_samples,
            gauges: Arc::default(),
        })
    }
}

/// What a device loader holds for its whole life: the arena's CUDA registration (page-locked
/// for DMA) and the device regions. Fields drop in order: the registration before the arena.
#[derive(Debug)]
struct GpuState {
    _pin: Option<cuda::HostRegistration>,
    pool: Arc<DevicePool>,
    _arena: Arc<Arena>,
}

/// Yields the batches of epochs over a dataset. Its arena (`(prefetch + in-flight groups) ×
/// group_bytes_max`) is allocated once by `build`; one I/O thread, started by the first
/// [`Loader::epoch`], serves every epoch in the order asked (clones share the arena and the
/// thread). Ask for the next epoch before the current one ends, as a training loop does, and
/// its first batches are read meanwhile; consume epochs in the order asked (a later epoch waits
/// for slots that an earlier, unread one holds). With a device, batches are copied into device
/// regions (as many as slots) allocated by `build` too.
///
/// ```no_run
/// # fn main() -> gpufeed::Result<()> {
/// let loader = gpufeed::Loader::builder(gpufeed::Dataset::open("shards/")?).build()?;
/// let epochs = 3;
/// let mut next = Some(loader.epoch(0)?);
/// for e in 0..epochs {
///     let current = next.take().expect("asked for");
///     if e + 1 < epochs {
///         next = Some(loader.epoch(e + 1)?); // read while this epoch's last batches are used
///     }
///     for batch in current {
///         let _batch = batch?; // train on it
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Loader {
    /// The I/O thread, started by the first epoch; shared by clones.
    service: Arc<std::sync::Mutex<Option<Arc<Service>>>>,
    arena: Arc<Arena>,
    gpu: Option<Arc<GpuState>>,
    dataset: Arc<Dataset>,
    plan: PlanConfig,
    engine: EngineConfig,
    prefetch_groups: u32,
    in_flight_groups: u32,
    verify_checksums: bool,
    backend: Option<CustomBackend>,
    /// The process that built it: after `fork`, the child has the arena's memory but neither
    /// the I/O thread nor a ring of its own, so it must build its own loader.
    pid: u32,
    /// The limit on each wait for a batch, if the caller set one.
    timeout: Option<std::time::Duration>,
    door: FrontDoor,
    /// The settings it was built with (the plan's and engine's limits derived from them are
    /// `plan` and `engine`).
    settings: LoaderSettings,
    /// What the I/O thread is doing (for the reports of a long wait).
    gauges: Arc<Gauges>,
    check_ahead_samples: usize,
}

impl Loader {
    /// A builder over `dataset` with the defaults of [`LOADER_SETTINGS`](crate::config::LOADER_SETTINGS) (global order, seed 0,
    /// one rank, batches of 256, 2 groups read ahead and 2 in flight, io_uring with QD 128,
    /// checksums verified, a 4 GiB memory budget) and groups of up to 4 batches in slots sized
    /// from the dataset.
    pub fn builder(dataset: impl Into<Arc<Dataset>>) -> LoaderBuilder {
        LoaderBuilder {
            dataset: dataset.into(),
            settings: LoaderSettings::default(),
            plan: PlanConfig::default(),
            engine: EngineConfig::default(),
            gpu_path: GpuPath::Auto,
            slot_explicit: false,
            backend: None,
            door: FrontDoor::Rust,
            check_ahead_samples: usize::MAX,
        }
    }

    /// The settings it was built with ([`LoaderSettings::values`] reads them as text).
    pub fn settings(&self) -> &LoaderSettings {
        &self.settings
    }

    /// The device regions batches are delivered in (`None` for a host loader).
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn device_pool(&self) -> Option<&Arc<DevicePool>> {
        self.gpu.as_ref().map(|g| &g.pool)
    }

    /// Whether samples' checksums are verified (where the format carries them).
    pub fn verifies_checksums(&self) -> bool {
        self.verify_checksums
    }

    /// Whether batches are delivered in device memory (a CUDA or simulated device).
    pub fn is_device(&self) -> bool {
        self.gpu.is_some()
    }

    /// The dataset the loader reads.
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// Slots of the loader's arena not held by batches or reads right now.
    pub fn free_slots(&self) -> usize {
        self.arena.free_slots()
    }

    /// The memory this loader holds: its arena, the dataset's index, its device regions (also
    /// in every epoch's [`LoaderStats::memory`]).
    pub fn memory(&self) -> MemoryStats {
        MemoryStats {
            arena_bytes: self.arena.len() as u64,
            slot_bytes: self.plan.group_bytes_max,
            index_bytes: self.dataset.index_heap_bytes() as u64,
            device_bytes: self
                .gpu
                .as_ref()
                .map_or(0, |g| (g.pool.regions() * g.pool.region_bytes()) as u64),
            decode_bytes: 0,
        }
    }

    /// Device regions not held by batches or copies right now (`None` for a host loader), and
    /// how many there are.
    pub fn free_device_regions(&self) -> Option<(usize, usize)> {
        self.gpu
            .as_ref()
            .map(|g| (g.pool.free_regions(), g.pool.regions()))
    }

    /// Batches in each epoch for this rank (the same for every epoch; the same for every rank
    /// unless the last batch is short, when ranks may differ by one).
    pub fn batches_per_epoch(&self) -> u32 {
        self.plan.rank_batches(self.dataset.len()) as u32
    }

    /// Samples in each epoch for this rank, padding included.
    pub fn samples_per_epoch(&self) -> usize {
        self.plan.rank_samples(self.dataset.len()).0
    }

    /// Bytes of the arena backed by transparent huge pages (`None` if unknown), and its size.
    /// Reads into 4 KiB pages become many segments for the device (DESIGN: huge pages doubled
    /// throughput at 128 KiB on a virtio disk).
    pub fn huge_page_bytes(&self) -> (Option<u64>, usize) {
        (self.arena.huge_page_bytes(), self.arena.len())
    }

    /// Slots in the arena.
    pub fn slots(&self) -> usize {
        self.arena.slots() as usize
    }

    /// Bytes of each slot: a read group's room (sized from the dataset and the batch size
    /// within the memory budget, or `window`'s as given).
    pub fn slot_bytes(&self) -> u64 {
        self.plan.group_bytes_max
    }

    /// The plan settings in effect.
    pub fn plan_config(&self) -> &PlanConfig {
        &self.plan
    }

    /// The limit on each wait for a batch (`None`: as long as it takes).
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.timeout
    }

    /// The door the loader was built through.
    #[cfg(feature = "decode")]
    pub(crate) fn front_door(&self) -> FrontDoor {
        self.door
    }

    /// Plans `epoch` without reading (for its figures, or to look at its order).
    pub fn plan_epoch(&self, epoch: u64) -> Result<EpochPlan> {
        EpochPlan::new(self.dataset.samples(), &self.plan, epoch)
    }

    /// Plans what is left of `epoch` after it stopped at `stops` on other rank counts
    /// ([`EpochPlan::resumed`]), without reading: its [`batches`](EpochPlan::batches) are what
    /// [`epoch_resumed`](Self::epoch_resumed) yields from batch 0.
    pub fn plan_epoch_resumed(&self, epoch: u64, stops: &[Stop]) -> Result<EpochPlan> {
        EpochPlan::resumed(self.dataset.samples(), &self.plan, epoch, stops)
    }

    /// The batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: u64) -> Result<Epoch> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from batch `start`: exactly the batches an uninterrupted epoch
    /// yields from there (resuming after a restart).
    pub fn epoch_from(&self, epoch: u64, start: u32) -> Result<Epoch> {
        self.epoch_checked(epoch, &[], start, Taker::Consumer)
    }

    /// Resumes `epoch` on this loader's rank count after it stopped on others: `stops` says
    /// where (oldest first: the ranks each stop had and the batches each of them had delivered,
    /// together — lockstep training stops them so). The `world_size` loaders, one per rank,
    /// then deliver every sample the epoch still owed exactly once between them
    /// ([`EpochPlan::resumed`] says how they share it), this one from its batch `start` of that
    /// rest (a run resumed so that stops again on the same rank count resumes with the same
    /// `stops` and its new batch; on yet another count, with its stop added). No stops: as
    /// [`epoch_from`](Self::epoch_from).
    ///
    /// ```no_run
    /// # fn main() -> gpufeed::Result<()> {
    /// use gpufeed::{plan::Stop, Dataset, Loader, PlanConfig};
    /// // 8 ranks had each read 120 batches of epoch 3; this is rank 2 of the 6 left.
    /// let loader = Loader::builder(Dataset::open("/data/train")?)
    ///     .plan(PlanConfig { rank: 2, world_size: 6, batch_size: 256, ..PlanConfig::default() })
    ///     .build()?;
    /// let stops = [Stop { world_size: 8, batch: 120 }];
    /// for batch in loader.epoch_resumed(3, &stops, 0)? {
    ///     let batch = batch?;
    ///     // train on batch …
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn epoch_resumed(&self, epoch: u64, stops: &[Stop], start: u32) -> Result<Epoch> {
        self.epoch_checked(epoch, stops, start, Taker::Consumer)
    }

    /// [`epoch_resumed`](Self::epoch_resumed), its batches taken by `taker`: an image stage
    /// verifies the checksums of an unframed format's samples itself ([`Checker`]), so neither
    /// the I/O thread nor the consumer reads them for that.
    pub(crate) fn epoch_checked(
        &self,
        epoch: u64,
        stops: &[Stop],
        start: u32,
        taker: Taker,
    ) -> Result<Epoch> {
        if std::process::id() != self.pid {
            // Threads do not survive fork: the I/O thread (and its ring) exist only in the
            // parent, so an epoch asked for here would wait for ever. Say so at once.
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "this loader was built in process {} and used in process {} after fork(): \
                     its I/O thread and io_uring ring stay in the parent; build the loader in \
                     the child (e.g. in a DataLoader worker_init_fn), or use the 'spawn' or \
                     'forkserver' multiprocessing start method",
                    self.pid,
                    std::process::id()
                ),
            ));
        }
        let checker = Checker::of(&self.dataset, self.verify_checksums, taker);
        let plan = self.plan_epoch_resumed(epoch, stops)?;
        if start > plan.batches() {
            return Err(invalid(format!(
                "cannot resume at batch {start}: the epoch has {} batches",
                plan.batches()
            )));
        }
        let batches = plan.batches();
        let padding_from = plan.padding_from();
        // One message per slot at most, plus the engine's name.
        let (tx, rx) =
            sync_channel(self.prefetch_groups as usize + self.in_flight_groups as usize + 1);
        let stop = Arc::new(AtomicBool::new(false));
        let retired = Arc::new(Retired::default());
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let holders = Arc::new(holders::Holders::new(
            &HoldersCtx {
                arena: self.arena.clone(),
                pool: self.gpu.as_ref().map(|g| g.pool.clone()),
                gauges: self.gauges.clone(),
                in_flight_groups: self.in_flight_groups,
                prefetch_groups: self.prefetch_groups,
                door: self.door,
            },
            epoch,
            sent.clone(),
        ));
        let wants = Arc::new(worker::Wants::default());
        let mut job = Box::new(EpochJob {
            epoch,
            plan,
            start,
            stop: stop.clone(),
            tx,
            retired: retired.clone(),
            sent,
            checker,
            wants: wants.clone(),
            check_ahead_samples: self.check_ahead_samples,
        });
        // The loader's I/O thread, started now if it is not running (or ended on an error).
        let mut service = self.service.lock().unpoisoned();
        let svc = loop {
            let svc = match service.as_ref() {
                Some(s) => s.clone(),
                None => {
                    let s = Service::start(WorkerCtx {
                        backend: self.backend.clone(),
                        arena: self.arena.clone(),
                        dataset: self.dataset.clone(),
                        engine: self.engine.clone(),
                        gpu: self.gpu.clone(),
                        in_flight_groups: self.in_flight_groups as usize,
                        gauges: self.gauges.clone(),
                    })?;
                    *service = Some(s.clone());
                    s
                }
            };
            match svc.submit(job) {
                Ok(()) => break svc,
                Err(back) => {
                    // The thread ended (a fatal error): start another.
                    job = back;
                    *service = None;
                }
            }
        };
        drop(service);
        Ok(Epoch {
            epoch,
            dataset: self.dataset.clone(),
            checker,
            rx: Some(rx),
            service: Some(svc),
            retired,
            stop,
            next: start,
            batches,
            batch_size: self.plan.batch_size as usize,
            padding_from,
            queue: std::collections::BTreeMap::new(),
            wants,
            io_cpu: None,
            stats: LoaderStats {
                memory: self.memory(),
                ..LoaderStats::default()
            },
            failed: false,
            holders,
            timeout: self.timeout,
            door: self.door,
            waiting_since: None,
            noticed: false,
        })
    }
}
