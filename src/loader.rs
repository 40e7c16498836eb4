//! ⑥ `Loader`: dataset ① → plan ② → engine ③ → batches, with bounded queues.
//!
//! Each epoch runs an I/O thread that owns the engine (io_uring binds to the thread that drives
//! it), plans the epoch, and keeps up to `in_flight_groups` groups being read and up to
//! `prefetch_groups` finished groups waiting for the consumer; a group is read into one slot.
//! Memory is the arena and nothing else, whatever the dataset's size; when the consumer is slow,
//! slots run out and reading pauses (back-pressure). Dropping an [`Epoch`] stops the thread,
//! which cancels and drains its reads before anything is freed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::batch::{Batch, Memory, Region, SampleSpan};
use crate::buf::{Arena, Slot};
use crate::config::{EngineConfig, EngineKind};
use crate::dataset::{Dataset, Frame};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::gpu::copy::CopyStage;
use crate::gpu::{cuda, Device, DevicePool, GpuPath};
use crate::io::{Completion, Engine, FileId, ReadSpec};
use crate::plan::{EpochPlan, Group, LastBatch, Order, PlanConfig};

/// Makes the backend each epoch's engine reads through (the simulated disk, in tests): called
/// with the epoch number.
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

/// Builds a [`Loader`]; every setting has a default.
#[derive(Debug, Clone)]
pub struct LoaderBuilder {
    dataset: Arc<Dataset>,
    plan: PlanConfig,
    engine: EngineConfig,
    prefetch_groups: u32,
    in_flight_groups: u32,
    verify_checksums: bool,
    device: Device,
    gpu_path: GpuPath,
    /// `window` was set: its slot size is taken as given.
    slot_explicit: bool,
    memory_budget_bytes: u64,
    backend: Option<CustomBackend>,
}

/// The arena's default memory budget: slots are sized from the dataset within it.
pub const DEFAULT_MEMORY_BUDGET_BYTES: u64 = 4 << 30;

impl LoaderBuilder {
    pub fn batch_size(mut self, n: u32) -> Self {
        self.plan.batch_size = n;
        self
    }
    pub fn order(mut self, order: Order) -> Self {
        self.plan.order = order;
        self
    }
    pub fn seed(mut self, seed: u64) -> Self {
        self.plan.seed = seed;
        self
    }
    /// This process's rank and the number of ranks.
    pub fn rank(mut self, rank: u32, world_size: u32) -> Self {
        self.plan.rank = rank;
        self.plan.world_size = world_size;
        self
    }
    /// What happens to the samples that do not fill a rank's last batch: a short last batch
    /// (default; every sample exactly once), dropped, or padded to even out ranks.
    pub fn last_batch(mut self, policy: LastBatch) -> Self {
        self.plan.last_batch = policy;
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
    /// Finished groups waiting for the consumer, at most.
    pub fn prefetch_groups(mut self, n: u32) -> Self {
        self.prefetch_groups = n;
        self
    }
    /// Groups being read at once, at most.
    pub fn in_flight_groups(mut self, n: u32) -> Self {
        self.in_flight_groups = n;
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
        self.memory_budget_bytes = bytes;
        self
    }
    /// Coalescing limits: largest gap read through, largest merged read.
    pub fn coalescing(mut self, max_gap_bytes: u64, max_read_bytes: u64) -> Self {
        self.plan.max_gap_bytes = max_gap_bytes;
        self.plan.max_read_bytes = max_read_bytes;
        self
    }
    pub fn engine_kind(mut self, kind: EngineKind) -> Self {
        self.engine.kind = kind;
        self
    }
    /// Reads in flight in the engine.
    pub fn queue_depth(mut self, qd: u32) -> Self {
        self.engine.queue_depth = qd;
        self
    }
    /// Check every sample's crc32c where the format has one (default on).
    pub fn verify_checksums(mut self, yes: bool) -> Self {
        self.verify_checksums = yes;
        self
    }
    /// Where batches are delivered: host memory (default), a CUDA device, or the simulated
    /// device (tests).
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }
    /// How reads reach a CUDA device (default: decided by the platform).
    pub fn gpu_path(mut self, path: GpuPath) -> Self {
        self.gpu_path = path;
        self
    }
    /// The whole plan configuration at once.
    pub fn plan(mut self, plan: PlanConfig) -> Self {
        self.plan = plan;
        self
    }

    pub fn build(self) -> Result<Loader> {
        self.plan.validate()?;
        if self.prefetch_groups == 0 || self.in_flight_groups == 0 {
            return Err(invalid(
                "prefetch_groups and in_flight_groups must be at least 1",
            ));
        }
        if self.dataset.is_empty() {
            return Err(invalid("the dataset has no samples"));
        }
        let files = self.dataset.files().len();
        if files > 65536 {
            return Err(invalid(format!(
                "the dataset has {files} files; the engine opens at most 65536 at once: pack it \
                 into shards (`gpufeed pack`)"
            )));
        }
        let slots = self.prefetch_groups + self.in_flight_groups;
        let mut plan = self.plan.clone();
        if !self.slot_explicit {
            plan.group_bytes_max = crate::plan::slot_bytes_for(
                self.dataset.samples(),
                plan.batch_size,
                plan.align,
                slots,
                self.memory_budget_bytes,
            )?;
        }
        // The engine takes every group the planner may make: reads per group are capped at
        // what one job may hold, and its table holds every group in flight.
        let reads_per_job =
            (plan.batch_size as u64 * plan.window_batches as u64).clamp(4096, 65536) as u32;
        if plan.batch_size > reads_per_job {
            return Err(invalid(format!(
                "batch_size {} is above 65536 samples, the most one read group may hold",
                plan.batch_size
            )));
        }
        plan.reads_per_group_max = reads_per_job;
        let slot_bytes = (plan.group_bytes_max as usize).next_multiple_of(4096);
        let engine = EngineConfig {
            slot_bytes,
            slots,
            files_max: files as u32,
            reads_per_job_max: reads_per_job,
            reads_in_flight_max: reads_per_job.saturating_mul(self.in_flight_groups),
            ..self.engine.clone()
        };
        engine.validate()?;
        // Memory is allocated once: every epoch's engine reads into this arena.
        let arena = Arena::new(&crate::buf::ArenaConfig {
            slot_bytes: engine.slot_bytes,
            slots: engine.slots,
            huge_pages: engine.huge_pages,
        })?;
        let regions = (self.prefetch_groups + self.in_flight_groups) as usize;
        let gpu = match &self.device {
            Device::Host => None,
            Device::Simulated(sim) => Some(Arc::new(GpuState {
                _pin: None,
                pool: DevicePool::sim(sim, regions, engine.slot_bytes),
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
            arena,
            gpu,
            dataset: self.dataset,
            plan,
            engine,
            prefetch_groups: self.prefetch_groups,
            in_flight_groups: self.in_flight_groups,
            verify_checksums: self.verify_checksums,
            backend: self.backend,
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
/// group_bytes_max`) is allocated once by `build`; each [`Loader::epoch`] runs its own I/O
/// thread over it. Clones share the arena. With a device, batches are copied into device
/// regions (as many as slots) allocated by `build` too.
#[derive(Debug, Clone)]
pub struct Loader {
    arena: Arc<Arena>,
    gpu: Option<Arc<GpuState>>,
    dataset: Arc<Dataset>,
    plan: PlanConfig,
    engine: EngineConfig,
    prefetch_groups: u32,
    in_flight_groups: u32,
    verify_checksums: bool,
    backend: Option<CustomBackend>,
}

/// What an epoch delivered so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoaderStats {
    pub batches: u64,
    pub samples: u64,
    /// Samples delivered as padding (repeats that even out ranks, `LastBatch::Pad`).
    pub padding: u64,
    pub sample_errors: u64,
    /// Bytes of samples delivered.
    pub bytes_delivered: u64,
    /// Bytes read from files (aligned, with the gaps coalescing read through).
    pub bytes_read: u64,
    /// Reads issued (after coalescing).
    pub reads: u64,
    /// Time the consumer spent waiting for the next batch.
    pub consumer_wait_s: f64,
    /// Engine kind that served the reads (after fallbacks).
    pub engine: String,
}

impl Loader {
    /// A builder over `dataset` with defaults: global order, seed 0, one rank, batches of 256,
    /// groups of up to 4 batches in 128 MiB slots, io_uring with QD 128, checksums verified.
    pub fn builder(dataset: impl Into<Arc<Dataset>>) -> LoaderBuilder {
        LoaderBuilder {
            dataset: dataset.into(),
            plan: PlanConfig::default(),
            engine: EngineConfig {
                queue_depth: 128,
                ..EngineConfig::default()
            },
            prefetch_groups: 2,
            in_flight_groups: 2,
            verify_checksums: true,
            device: Device::Host,
            gpu_path: GpuPath::Auto,
            slot_explicit: false,
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET_BYTES,
            backend: None,
        }
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// Slots of the loader's arena not held by batches or reads right now.
    pub fn free_slots(&self) -> usize {
        self.arena.free_slots()
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

    pub fn plan_config(&self) -> &PlanConfig {
        &self.plan
    }

    /// Plans `epoch` without reading (for its figures, or to look at its order).
    pub fn plan_epoch(&self, epoch: u64) -> Result<EpochPlan> {
        EpochPlan::new(self.dataset.samples(), &self.plan, epoch)
    }

    /// The batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: u64) -> Result<Epoch> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from batch `start`: exactly the batches an uninterrupted epoch
    /// yields from there (resuming after a restart).
    pub fn epoch_from(&self, epoch: u64, start: u32) -> Result<Epoch> {
        let plan = self.plan_epoch(epoch)?;
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
        let worker = Worker {
            backend: self.backend.clone(),
            epoch,
            arena: self.arena.clone(),
            dataset: self.dataset.clone(),
            plan,
            engine: self.engine.clone(),
            gpu: self.gpu.clone(),
            verify: self.verify_checksums,
            in_flight_groups: self.in_flight_groups as usize,
            start,
            stop: stop.clone(),
            tx,
        };
        let thread = std::thread::Builder::new()
            .name(format!("gpufeed-io-e{epoch}"))
            .spawn(move || worker.run())
            .map_err(|e| Error::io("cannot start the I/O thread", e))?;
        Ok(Epoch {
            epoch,
            dataset: self.dataset.clone(),
            verify: self.verify_checksums,
            rx: Some(rx),
            thread: Some(thread),
            stop,
            next: start,
            batches,
            batch_size: self.plan.batch_size as usize,
            padding_from,
            queue: std::collections::BTreeMap::new(),
            stats: LoaderStats::default(),
            failed: false,
        })
    }
}

/// How long the I/O thread waits for the consumer to return a slot before it reports a stall.
const STALL_LIMIT: Duration = Duration::from_secs(30);

/// A finished group, sent from the I/O thread.
struct GroupDone {
    batches: std::ops::Range<u32>,
    ids: Vec<u32>,
    spans: Vec<SampleSpan>,
    /// One per sample once a check found labels in the data (TFRecord Examples); empty
    /// otherwise, and the consumer looks them up in the index (not the I/O thread).
    labels: Vec<i64>,
    mem: Memory,
    reads: u64,
    bytes_read: u64,
}

/// A group whose reads completed, with its slot, before it is handed over (host) or copied.
struct Filled {
    batches: std::ops::Range<u32>,
    ids: Vec<u32>,
    spans: Vec<SampleSpan>,
    labels: Vec<i64>,
    slot: Slot,
    used: usize,
    reads: u64,
    bytes_read: u64,
}

enum Msg {
    Group(GroupDone),
    Engine(String),
    Failed(Error),
}

struct Worker {
    backend: Option<CustomBackend>,
    epoch: u64,
    arena: Arc<Arena>,
    dataset: Arc<Dataset>,
    plan: EpochPlan,
    engine: EngineConfig,
    gpu: Option<Arc<GpuState>>,
    verify: bool,
    in_flight_groups: usize,
    start: u32,
    stop: Arc<AtomicBool>,
    tx: SyncSender<Msg>,
}

/// Groups between their reads and the consumer on the device path: waiting for a device region,
/// or being copied. Dropping it waits for every copy before the slots go back to the arena (a
/// DMA may still read them until then); if waiting fails, the slots are leaked, never reused.
struct CopyQueue {
    stage: CopyStage,
    waiting: std::collections::VecDeque<Filled>,
    copying: HashMap<u64, (Filled, usize)>,
    arena: Arc<Arena>,
}

impl Drop for CopyQueue {
    fn drop(&mut self) {
        let mut done = Vec::new();
        if self.stage.drain(&mut done).is_err() {
            // A slot that is not put back is never handed out again: leaked, not reused
            // under a DMA that may still be reading it (and its region with it).
            self.copying.clear();
        }
        for (_, (f, r)) in self.copying.drain() {
            self.arena.put(f.slot);
            self.stage.pool().put_back(r);
        }
        for f in self.waiting.drain(..) {
            self.arena.put(f.slot);
        }
    }
}

impl Worker {
    fn run(self) {
        if let Err(e) = self.read_epoch() {
            let _ = self.tx.send(Msg::Failed(e));
        }
    }

    fn read_epoch(&self) -> Result<()> {
        // The copy queue is declared before the engine, so it is dropped after it: reads are
        // cancelled and drained first, then copies, then the slots return.
        let mut copies = match &self.gpu {
            Some(g) => Some(CopyQueue {
                stage: CopyStage::new(&g.pool)?,
                waiting: Default::default(),
                copying: HashMap::new(),
                arena: self.arena.clone(),
            }),
            None => None,
        };
        let mut engine = match &self.backend {
            Some(b) => Engine::with_backend_and_arena(
                (b.make)(self.epoch),
                b.kind,
                &self.engine,
                self.arena.clone(),
            )?,
            None => Engine::with_arena(self.engine.clone(), self.arena.clone())?,
        };
        let path = match &copies {
            Some(_) => format!("{} → pinned → H2D", engine.kind().name()),
            None => engine.kind().name().to_string(),
        };
        let _ = self.tx.send(Msg::Engine(path));
        let ds = &*self.dataset;
        let files: Vec<FileId> = ds
            .files()
            .iter()
            .map(|f| engine.open(&f.path))
            .collect::<Result<_>>()?;
        let arena = engine.arena().clone();
        // Resuming at the end (or an empty epoch) reads nothing.
        let mut next = if self.start < self.plan.batches() {
            self.plan.group_of_batch(self.start)
        } else {
            self.plan.groups()
        };
        let mut in_flight: HashMap<u64, Group> = HashMap::new();
        let mut specs = Vec::new();
        let mut stalled_since: Option<Instant> = None;
        let mut copied = Vec::new();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(()); // dropping the engine and the copy queue cancels and drains
            }
            // Start groups while there are slots and room.
            while next < self.plan.groups() && in_flight.len() < self.in_flight_groups {
                let Some(slot) = arena.take() else { break };
                let g = self.plan.group(ds.samples(), next);
                specs.clear();
                specs.extend(g.reads.iter().map(|r| ReadSpec {
                    file: files[r.file as usize],
                    offset: r.offset,
                    len: r.len,
                    buf_offset: r.buf_offset as usize,
                }));
                engine.submit(slot, &specs, next as u64).map_err(|r| {
                    arena.put(r.slot);
                    r.error
                })?;
                in_flight.insert(next as u64, g);
                next += 1;
            }
            // Device path: copy filled groups into free regions; hand over finished copies.
            if let Some(q) = copies.as_mut() {
                if self.pump_copies(q, &mut copied, in_flight.is_empty())? {
                    return Ok(()); // the consumer went away
                }
            }
            let copying = copies
                .as_ref()
                .is_some_and(|q| !q.waiting.is_empty() || !q.copying.is_empty());
            if in_flight.is_empty() {
                if next >= self.plan.groups() && !copying {
                    return Ok(());
                }
                if copying {
                    // Waiting on a copy or a device region: pump_copies waited a little.
                    if copies.as_ref().is_some_and(|q| q.copying.is_empty()) {
                        self.stall_check(&mut stalled_since, "device regions")?;
                    } else {
                        stalled_since = None;
                    }
                    continue;
                }
                // Every slot is with the consumer: wait for one to come back, but never forever
                // (a consumer that keeps a batch of every group would wait on us meanwhile).
                if let Some(slot) = arena.take_timeout(Duration::from_millis(20)) {
                    arena.put(slot);
                    stalled_since = None;
                } else {
                    self.stall_check(&mut stalled_since, "slots")?;
                }
                continue;
            }
            engine.wait(1)?;
            while let Some(c) = engine.pop() {
                let g = in_flight.remove(&c.user_data).expect("a group per job");
                let f = self.filled(g, c);
                match copies.as_mut() {
                    Some(q) => q.waiting.push_back(self.checked(f)),
                    None => {
                        let done = GroupDone {
                            batches: f.batches,
                            ids: f.ids,
                            spans: f.spans,
                            labels: f.labels,
                            mem: Memory::Host(Arc::new(Region::new(arena.clone(), f.slot))),
                            reads: f.reads,
                            bytes_read: f.bytes_read,
                        };
                        if self.tx.send(Msg::Group(done)).is_err() {
                            return Ok(()); // the consumer went away
                        }
                    }
                }
            }
        }
    }

    /// Errors out after [`STALL_LIMIT`] without progress.
    fn stall_check(&self, since: &mut Option<Instant>, what: &str) -> Result<()> {
        if since.get_or_insert_with(Instant::now).elapsed() > STALL_LIMIT {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "all {what} are held by batches that were not dropped for {} s; drop batches \
                     sooner or raise prefetch_groups",
                    STALL_LIMIT.as_secs()
                ),
            ));
        }
        Ok(())
    }

    /// Starts copies for filled groups while device regions are free, and hands finished copies
    /// to the consumer. With `idle` (no reads in flight), waits a little for progress. Returns
    /// whether the consumer went away.
    fn pump_copies(&self, q: &mut CopyQueue, done: &mut Vec<u64>, idle: bool) -> Result<bool> {
        let pool = q.stage.pool().clone();
        while !q.waiting.is_empty() {
            let r = if idle && q.copying.is_empty() {
                pool.take_timeout(Duration::from_millis(20))
            } else {
                pool.take()
            };
            let Some(r) = r else { break };
            let f = q.waiting.pop_front().expect("not empty");
            let tag = f.batches.start as u64;
            let src = q.arena.bytes(&f.slot).as_ptr();
            // SAFETY: the slot stays in `q.copying` (and so unchanged and mapped) until `poll`
            // reports this tag; region `r` was just taken from the pool, so no batch views it.
            if let Err(e) = unsafe { q.stage.start(r, src, f.used, tag) } {
                // A failed start has waited for anything it enqueued; if it could not, the slot
                // and region are leaked rather than reused under a DMA.
                if !q.stage.broken() {
                    pool.put_back(r);
                    q.arena.put(f.slot);
                }
                return Err(e);
            }
            q.copying.insert(tag, (f, r));
        }
        done.clear();
        // Still waiting groups here means no region is free: wait for a copy if one runs.
        q.stage.poll(done, idle && !q.copying.is_empty())?;
        for tag in done.drain(..) {
            let (f, r) = q.copying.remove(&tag).expect("a copy per tag");
            q.arena.put(f.slot); // the copy has completed: the slot may be reused
            let g = GroupDone {
                batches: f.batches,
                ids: f.ids,
                spans: f.spans,
                labels: f.labels,
                mem: Memory::Device(Arc::new(pool.region(r, f.used))),
                reads: f.reads,
                bytes_read: f.bytes_read,
            };
            if self.tx.send(Msg::Group(g)).is_err() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Turns a completed group into sample spans within its slot.
    fn filled(&self, g: Group, c: Completion) -> Filled {
        let ds = &*self.dataset;
        let first = self.plan.batch_range(g.batches.start).start;
        let end = self.plan.batch_range(g.batches.end - 1).end;
        let ids: Vec<u32> = self.plan.order[first..end].to_vec();
        let outcomes = c.outcomes();
        let mut spans = Vec::with_capacity(ids.len());
        let mut read_errors: HashMap<u32, Arc<Error>> = HashMap::new();
        for (&id, p) in ids.iter().zip(&g.scatter) {
            let s = ds.sample(id as usize);
            let span = match &outcomes[p.read as usize] {
                Ok(r) => {
                    let start = r.start + p.offset_in_read as usize;
                    let end = start + s.len as usize;
                    if end > r.end {
                        Err(Arc::new(ds.sample_error(
                            id as usize,
                            Error::new(
                                ErrorKind::UnexpectedEof,
                                "the file ended inside this sample",
                            ),
                        )))
                    } else {
                        Ok(start..end)
                    }
                }
                Err(e) => {
                    // One failed read, shared as the cause of each sample it held.
                    let shared = read_errors
                        .entry(p.read)
                        .or_insert_with(|| Arc::new(e.clone()));
                    Err(Arc::new(
                        ds.sample_error(
                            id as usize,
                            Error::new(shared.kind(), "the read holding this sample failed")
                                .with_shared_source(shared.clone()),
                        ),
                    ))
                }
            };
            spans.push(span);
        }
        // The bytes to copy: up to the end of the last sample the reads placed.
        let used = spans
            .iter()
            .filter_map(|s| s.as_ref().ok().map(|r| r.end))
            .max()
            .unwrap_or(0);
        Filled {
            batches: g.batches,
            ids,
            spans,
            labels: Vec::new(),
            slot: c.slot,
            used,
            reads: g.reads.len() as u64,
            bytes_read: g.bytes_read,
        }
    }

    /// Checks frames and checksums on this thread (device path: the consumer never sees the
    /// host bytes).
    fn checked(&self, mut f: Filled) -> Filled {
        let bytes = self.arena.bytes(&f.slot);
        check_spans(
            &self.dataset,
            bytes,
            &f.ids,
            &mut f.spans,
            &mut f.labels,
            self.verify,
        );
        f
    }
}

/// Checks each delivered sample's frame and (with `verify`) checksum against the group's bytes,
/// narrowing its span to the payload or replacing it with the error. Where the data carries
/// labels (TFRecord Examples), `labels` becomes one per sample (the index's, overridden by the
/// data's); it stays empty otherwise. Nothing to do for formats without frames when not
/// verifying.
fn check_spans(
    ds: &Dataset,
    bytes: &[u8],
    ids: &[u32],
    spans: &mut [SampleSpan],
    labels: &mut Vec<i64>,
    verify: bool,
) {
    if !(verify && ds.has_checksums()) && ds.frame() == Frame::None {
        return;
    }
    for (k, (span, &id)) in spans.iter_mut().zip(ids).enumerate() {
        if let Ok(r) = span {
            *span = match ds.check_sample(id as usize, &bytes[r.clone()], verify) {
                Ok(c) => {
                    if let Some(label) = c.label {
                        if labels.is_empty() {
                            labels.extend(index_labels(ds, ids));
                        }
                        labels[k] = label;
                    }
                    Ok(r.start + c.payload.start..r.start + c.payload.end)
                }
                Err(e) => Err(Arc::new(e)),
            };
        }
    }
}

/// The index's label of each sample.
fn index_labels<'a>(ds: &'a Dataset, ids: &'a [u32]) -> impl Iterator<Item = i64> + 'a {
    ids.iter().map(|&i| ds.sample(i as usize).label)
}

/// The batches of one epoch, in order. Dropping it stops the I/O thread (batches already
/// handed out stay valid).
pub struct Epoch {
    epoch: u64,
    dataset: Arc<Dataset>,
    verify: bool,
    rx: Option<Receiver<Msg>>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    next: u32,
    batches: u32,
    batch_size: usize,
    /// Positions of the rank's order from here on are padding.
    padding_from: usize,
    /// Batches received, by index: groups complete out of order, batches leave in order.
    queue: std::collections::BTreeMap<u32, Batch>,
    stats: LoaderStats,
    failed: bool,
}

impl Epoch {
    /// Batches in this epoch (from batch 0).
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// Figures so far.
    pub fn stats(&self) -> &LoaderStats {
        &self.stats
    }

    fn take_group(&mut self, mut g: GroupDone) {
        // Checksums and frames are checked here, on the consumer's thread: on the I/O thread
        // they would keep it from reaping and resubmitting, and the device queue would run dry.
        // (Device groups were checked before their copy.)
        if let Memory::Host(region) = &g.mem {
            let bytes = region.bytes();
            check_spans(
                &self.dataset,
                bytes,
                &g.ids,
                &mut g.spans,
                &mut g.labels,
                self.verify,
            );
        }
        // Labels are looked up here, on the consumer's thread, unless a check already found the
        // data's own.
        if g.labels.is_empty() {
            g.labels.extend(index_labels(&self.dataset, &g.ids));
        }
        // Batches are full but for the epoch's last, which ends its group.
        let b = self.batch_size;
        self.stats.reads += g.reads;
        self.stats.bytes_read += g.bytes_read;
        let mut ids = g.ids.into_iter();
        let mut spans = g.spans.into_iter();
        let mut labels = g.labels.into_iter();
        for index in g.batches {
            let bids: Vec<u32> = ids.by_ref().take(b).collect();
            let bspans: Vec<SampleSpan> = spans.by_ref().take(b).collect();
            let blabels: Vec<i64> = labels.by_ref().take(b).collect();
            if index < self.next {
                continue; // resuming: batches before the start point are not handed out
            }
            let padding_from = self
                .padding_from
                .saturating_sub(index as usize * b)
                .min(bids.len());
            self.queue.insert(
                index,
                Batch {
                    epoch: self.epoch,
                    index,
                    labels: blabels,
                    padding_from,
                    ids: bids,
                    spans: bspans,
                    mem: g.mem.clone(),
                },
            );
        }
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.failed || self.next >= self.batches {
            return None;
        }
        let t0 = Instant::now();
        while !self.queue.contains_key(&self.next) {
            let msg = self.rx.as_ref()?.recv();
            match msg {
                Ok(Msg::Group(g)) => self.take_group(g),
                Ok(Msg::Engine(name)) => self.stats.engine = name,
                Ok(Msg::Failed(e)) => {
                    self.failed = true;
                    return Some(Err(e));
                }
                Err(_) => {
                    self.failed = true;
                    return Some(Err(Error::new(
                        ErrorKind::Io,
                        "the I/O thread ended before the epoch was complete",
                    )));
                }
            }
        }
        self.stats.consumer_wait_s += t0.elapsed().as_secs_f64();
        let batch = self.queue.remove(&self.next).expect("batch is queued");
        self.next = batch.index + 1;
        self.stats.batches += 1;
        self.stats.samples += batch.len() as u64;
        self.stats.padding += batch.padding_count() as u64;
        self.stats.sample_errors += batch.errors().count() as u64;
        self.stats.bytes_delivered += batch.bytes();
        Some(Ok(batch))
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver makes the worker's next send fail; queued groups return their
        // slots as they drop.
        self.queue.clear();
        self.rx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("epoch", &self.epoch)
            .field("next", &self.next)
            .field("batches", &self.batches)
            .finish()
    }
}
