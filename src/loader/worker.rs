//! The loader's I/O thread: serves epochs in order — submits read groups, checks and copies
//! them, hands them to each epoch's consumer.
//!
//! Groups are checked (frames, checksums) here, ahead of the consumer, in the time the thread
//! would otherwise spend waiting for the disk: a piece of a group at a time ([`CHECK_PIECE`]),
//! between which it reaps finished reads and starts new ones, so the queue of reads stays full.
//! A host group the consumer is already waiting for is handed over at once, however much of it
//! is checked, and the consumer checks the rest itself — so a consumer faster than one
//! thread's checks is never held to that pace, and one slower than the disk never waits for a
//! check. A device group is copied once it is checked whole (its consumer cannot check it).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::batch::{Memory, Region};
use crate::buf::{Arena, Slot};
use crate::config::EngineConfig;
use crate::dataset::Dataset;
use crate::dataset::SampleSpan;
use crate::error::{Error, ErrorKind, Result};
use crate::gpu::copy::CopyPipeline;
use crate::io::{Completion, Engine, FileId, ReadSpec};
use crate::plan::{EpochPlan, Group};
use crate::util::Unpoison;

use super::holders::Gauges;
use super::{Checker, CustomBackend, GpuState};

/// What a read group delivers: its batches' samples, their spans in the group's memory, and
/// the figures for the stats.
pub(super) struct GroupMeta {
    pub(super) batches: std::ops::Range<u32>,
    pub(super) ids: Vec<u32>,
    pub(super) spans: Vec<SampleSpan>,
    /// One per sample once a check found labels in the data (TFRecord Examples); empty
    /// otherwise, and the consumer looks them up in the index (not the I/O thread).
    pub(super) labels: Vec<i64>,
    pub(super) reads: u64,
    pub(super) bytes_read: u64,
    /// When its reads were submitted and when the last completed.
    pub(super) submitted: Instant,
    pub(super) read_done: Instant,
    /// Some read fetched from an object store.
    pub(super) remote: bool,
    /// When its copy to the device finished (device path).
    pub(super) copy_done: Option<Instant>,
    /// The I/O thread's CPU seconds so far, when the group was handed over.
    pub(super) io_cpu_s: f64,
    /// How many of its samples (from the first) have been checked; the consumer checks the
    /// rest. All of them on the device path, and where there is nothing to check.
    pub(super) checked: usize,
    /// When the I/O thread handed the group over after checking it (or part of it), if it
    /// held it back for that: the group waited for checks from `read_done` until then.
    pub(super) checks_done: Option<Instant>,
    /// CPU seconds the I/O thread spent checking this group.
    pub(super) check_cpu_s: f64,
}

/// The bytes of a host group the I/O thread checks before it looks at its reads again (about
/// 80 µs of crc32c from memory here): small enough that the read queue does not run dry, large
/// enough that the clock reads and the reaping are noise.
pub(super) const CHECK_PIECE: usize = 1 << 20;

/// The batch an epoch's consumer is waiting for (`u32::MAX`: none), shared by the epoch and
/// the I/O thread so that a group the consumer waits for is not held back for checks.
#[derive(Debug)]
pub(super) struct Wants(AtomicU32);

impl Default for Wants {
    fn default() -> Wants {
        Wants(AtomicU32::new(u32::MAX))
    }
}

impl Wants {
    pub(super) fn set(&self, batch: u32) {
        self.0.store(batch, Ordering::Relaxed);
    }

    pub(super) fn clear(&self) {
        self.0.store(u32::MAX, Ordering::Relaxed);
    }

    fn any_of(&self, batches: &std::ops::Range<u32>) -> bool {
        batches.contains(&self.0.load(Ordering::Relaxed))
    }
}

/// A group whose reads completed, being checked before it is handed over (host) or copied
/// (device).
struct Unchecked {
    /// The epoch's id on this thread.
    id: u64,
    meta: GroupMeta,
    /// Its slot (back to the arena if the group is dropped).
    region: Region,
    /// Device path: the bytes to copy.
    copy: Option<usize>,
}

/// A finished group, sent from the I/O thread.
pub(super) struct GroupDone {
    pub(super) meta: GroupMeta,
    pub(super) mem: Memory,
}

/// A group whose reads completed, with its slot (the first `used` bytes hold data), before it
/// is handed over (host) or copied.
struct Filled {
    meta: GroupMeta,
    slot: Slot,
    used: usize,
}

pub(super) enum Msg {
    Group(GroupDone),
    Engine(String),
    Failed(Error),
}

/// Signalled when the I/O thread is done with an epoch: nothing of it is being read or copied
/// any more (its slots and regions are back, or with batches already sent).
#[derive(Debug, Default)]
pub(super) struct Retired {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Retired {
    fn signal(&self) {
        *self.done.lock().unpoisoned() = true;
        self.cv.notify_all();
    }

    /// Waits for the signal.
    pub(super) fn wait(&self) {
        let g = self.done.lock().unpoisoned();
        let _g = self.cv.wait_while(g, |done| !*done).unpoisoned();
    }
}

/// One epoch asked of the I/O thread. Dropped — by the thread once nothing of it is in flight,
/// or unread in the command channel if the thread ended — it signals [`Retired`].
pub(super) struct EpochJob {
    pub(super) epoch: u64,
    pub(super) plan: EpochPlan,
    pub(super) start: u32,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) tx: SyncSender<Msg>,
    pub(super) retired: Arc<Retired>,
    /// Groups handed to `tx` (the consumer's ledger counts those it received).
    pub(super) sent: Arc<AtomicUsize>,
    /// Who checks the epoch's samples.
    pub(super) checker: Checker,
    /// The batch the epoch's consumer is waiting for.
    pub(super) wants: Arc<Wants>,
    /// A group is handed over once this many of its samples are checked (tests; else all).
    pub(super) check_ahead_samples: usize,
}

impl Drop for EpochJob {
    fn drop(&mut self) {
        self.retired.signal();
    }
}

/// What the I/O thread needs for its whole life.
pub(super) struct WorkerCtx {
    pub(super) backend: Option<CustomBackend>,
    pub(super) arena: Arc<Arena>,
    pub(super) dataset: Arc<Dataset>,
    pub(super) engine: EngineConfig,
    pub(super) gpu: Option<Arc<GpuState>>,
    pub(super) in_flight_groups: usize,
    pub(super) gauges: Arc<Gauges>,
}

/// The loader's I/O thread: one engine (one ring), one copy pipeline and the dataset's files
/// open for the loader's life, serving epochs in the order they are asked for. Epochs asked for
/// in advance are read as soon as the epoch before has submitted its last group, so the next
/// epoch's first batches are ready when the current one ends. Ends when every handle to it
/// (the loader and its epochs) is gone; a fatal error ends it too (the next epoch starts a new
/// one).
pub(super) struct Service {
    cmd: Mutex<Option<Sender<Box<EpochJob>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").finish_non_exhaustive()
    }
}

impl Service {
    pub(super) fn start(ctx: WorkerCtx) -> Result<Arc<Service>> {
        let (cmd, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("gpufeed-io".into())
            .spawn(move || ctx.run(rx))
            .map_err(|e| Error::io("cannot start the I/O thread", e))?;
        Ok(Arc::new(Service {
            cmd: Mutex::new(Some(cmd)),
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Hands `job` to the thread; gives it back if the thread has ended.
    pub(super) fn submit(&self, job: Box<EpochJob>) -> std::result::Result<(), Box<EpochJob>> {
        let cmd = self.cmd.lock().unpoisoned();
        match cmd.as_ref() {
            Some(c) => c.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // No more epochs: the thread finishes what it has and ends.
        self.cmd.lock().unpoisoned().take();
        if let Some(t) = self.thread.lock().unpoisoned().take() {
            let _ = t.join();
        }
    }
}

/// An epoch the thread is serving.
struct Active {
    id: u64,
    job: Box<EpochJob>,
    /// The first batch of the next group to submit.
    next_group: u32,
    /// Groups submitted and not yet handed over or discarded.
    outstanding: usize,
    /// Failed or stopped: submits nothing more.
    ended: bool,
}

impl Active {
    fn stopped(&self) -> bool {
        self.ended || self.job.stop.load(Ordering::Relaxed)
    }

    fn submitting(&self) -> bool {
        !self.stopped() && self.next_group < self.job.plan.batches()
    }

    /// Hands a finished group over, or drops it (its slot or region returns) when the epoch was
    /// stopped or its consumer went away.
    fn deliver(&mut self, mut g: GroupDone) {
        g.meta.io_cpu_s = crate::sys::thread_cpu_seconds();
        self.outstanding -= 1;
        if self.stopped() || self.job.tx.send(Msg::Group(g)).is_err() {
            self.ended = true;
        } else {
            self.job.sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn fail(&mut self, e: Error) {
        let _ = self.job.tx.send(Msg::Failed(e));
        self.ended = true;
    }
}

/// A group being read: its epoch (by id), the group, when it was submitted, and its reads
/// whose file did not open.
struct InFlight {
    epoch: u64,
    group: Group,
    submitted: Instant,
    unopened: Unopened,
}

/// The I/O thread at work: its engine, copy pipeline and open files, and the groups being read
/// or checked. Its fields drop in order: groups being checked (their slots return), then the
/// engine (its reads cancelled and drained), then the copies — all before the epochs they
/// served are signalled retired ([`WorkerCtx::run`] holds those).
struct IoThread<'a> {
    ctx: &'a WorkerCtx,
    /// Host groups read and not yet handed over: being checked.
    unchecked: Vec<Unchecked>,
    /// By engine tag.
    in_flight: HashMap<u64, InFlight>,
    specs: Vec<ReadSpec>,
    files: OpenFiles,
    engine: Engine,
    copies: Option<CopyPipeline<(u64, GroupMeta)>>,
    arena: Arc<Arena>,
    /// The read path, as each epoch's consumer is told it.
    path: String,
    next_id: u64,
    next_tag: u64,
}

impl<'a> IoThread<'a> {
    /// The engine and the copy pipeline for the thread's life, the first epoch's backend.
    fn start(ctx: &'a WorkerCtx, first: &EpochJob) -> Result<IoThread<'a>> {
        let copies = match &ctx.gpu {
            Some(g) => Some(CopyPipeline::<(u64, GroupMeta)>::new(
                &g.pool,
                ctx.arena.clone(),
            )?),
            None => None,
        };
        let engine = match &ctx.backend {
            Some(b) => Engine::with_backend_and_arena(
                (b.make)(first.epoch),
                b.kind,
                &ctx.engine,
                ctx.arena.clone(),
            )?,
            // A remote dataset's node-cache copies are read through the cache's gate, composed
            // around this engine's own backend (the I/O layer knows nothing of the cache).
            #[cfg(feature = "remote")]
            None if ctx.dataset.sources.is_remote() => {
                Engine::with_arena_wrapped(ctx.engine.clone(), ctx.arena.clone(), &|inner, cfg| {
                    crate::cache::gate::gate(inner, cfg, ctx.dataset.sources.clone())
                })?
            }
            None => Engine::with_arena(ctx.engine.clone(), ctx.arena.clone())?,
        };
        let path = match &copies {
            Some(_) => format!("{} → pinned → H2D", engine.kind().name()),
            None => engine.kind().name().to_string(),
        };
        let align = first.plan.config().align;
        let files = OpenFiles::new(
            ctx.dataset.file_count(),
            ctx.engine.files_max as usize,
            align,
        );
        Ok(IoThread {
            ctx,
            unchecked: Vec::new(),
            in_flight: HashMap::new(),
            specs: Vec::new(),
            files,
            arena: engine.arena().clone(),
            engine,
            copies,
            path,
            next_id: 0,
            next_tag: 0,
        })
    }

    /// Takes `job` on, after the epochs already served.
    fn activate(&mut self, jobs: &mut VecDeque<Active>, job: Box<EpochJob>) {
        let _ = job.tx.send(Msg::Engine(self.path.clone()));
        // Resuming at the end (or an empty epoch) reads nothing.
        let next_group = if job.start < job.plan.batches() {
            job.plan
                .group_of_batch(self.ctx.dataset.samples(), job.start)
        } else {
            job.plan.batches()
        };
        self.next_id += 1;
        jobs.push_back(Active {
            id: self.next_id,
            job,
            next_group,
            outstanding: 0,
            ended: false,
        });
    }

    /// Takes the epochs asked for (waiting for one only when there is nothing else to do),
    /// drops a stopped epoch's groups still waiting for a device region, and retires the
    /// epochs that are done. `false` once every handle to the thread is gone.
    fn take_epochs(&mut self, rx: &Receiver<Box<EpochJob>>, jobs: &mut VecDeque<Active>) -> bool {
        if jobs.is_empty()
            && self.in_flight.is_empty()
            && self.copies.as_ref().is_none_or(|q| q.is_empty())
        {
            match rx.recv() {
                Ok(job) => self.activate(jobs, job),
                Err(_) => return false,
            }
        }
        while let Ok(job) = rx.try_recv() {
            self.activate(jobs, job);
        }
        // A stopped epoch's groups still waiting for a device region need no copy, and the
        // regions may be held by that epoch's own batches.
        if let Some(q) = self.copies.as_mut() {
            for a in jobs.iter_mut().filter(|a| a.stopped() && a.outstanding > 0) {
                a.outstanding -= q.discard_waiting(|(id, _)| *id == a.id);
            }
        }
        // Nothing left to submit and nothing outstanding: done (dropping the job signals its
        // consumer, which may be waiting in `Epoch::drop`).
        jobs.retain(|a| a.submitting() || a.outstanding > 0);
        true
    }

    /// Starts groups while there are slots and room: the earliest epoch first, the next one
    /// as soon as the earlier has submitted its last group. Then says what the thread waits
    /// on, for a consumer's report of a long wait (a group being checked counts as being read:
    /// it is on its way).
    fn start_groups(&mut self, jobs: &mut VecDeque<Active>) -> Result<()> {
        let ds = &*self.ctx.dataset;
        while self.in_flight.len() < self.ctx.in_flight_groups {
            let Some(a) = jobs.iter_mut().find(|a| a.submitting()) else {
                break;
            };
            let Some(slot) = self.arena.take() else { break };
            let g = a.job.plan.group(ds.samples(), a.next_group);
            self.specs.clear();
            let mut unopened = Unopened::default();
            let pinned = self.files.pin();
            let checked = a.job.checker.loader_verifies();
            for (k, r) in g.reads.iter().enumerate() {
                match self
                    .files
                    .get(&mut self.engine, ds, r.file, pinned, checked)
                {
                    Ok(file) => self.specs.push(ReadSpec {
                        file,
                        offset: r.offset,
                        len: r.len,
                        buf_offset: r.buf_offset as usize,
                    }),
                    // Its samples fail, named; the group's other reads go on.
                    Err(e) => unopened.0.push((k as u32, Err(e))),
                }
            }
            self.next_tag += 1;
            let arena = &self.arena;
            self.engine
                .submit(slot, &self.specs, self.next_tag)
                .map_err(|r| {
                    arena.put(r.slot);
                    r.error
                })?;
            a.next_group = g.batches.end;
            let group = InFlight {
                epoch: a.id,
                group: g,
                submitted: Instant::now(),
                unopened,
            };
            self.in_flight.insert(self.next_tag, group);
            a.outstanding += 1;
        }
        let gauges = &self.ctx.gauges;
        let reading = self.in_flight.len() + self.unchecked.len();
        gauges.reading.store(reading, Ordering::Relaxed);
        let copying = self.copies.as_ref().map_or(0, |q| q.copying());
        gauges.copying.store(copying, Ordering::Relaxed);
        Ok(())
    }

    /// Device path: copies filled groups into free regions; hands over finished copies.
    fn pump_copies(&mut self, jobs: &mut VecDeque<Active>) -> Result<()> {
        let Some(q) = self.copies.as_mut() else {
            return Ok(());
        };
        let pool = q.pool().clone();
        q.pump(self.in_flight.is_empty(), |r, used, (id, mut meta)| {
            meta.copy_done = Some(Instant::now());
            let g = GroupDone {
                meta,
                mem: Memory::Device(Arc::new(pool.region(r, used))),
            };
            if let Some(a) = jobs.iter_mut().find(|a| a.id == id) {
                a.deliver(g);
            }
        })
    }

    /// Checks a piece of a group read (then looks at the reads again, without waiting), or
    /// waits: for a slot to come back from the consumers, or for a read. `true` where reads
    /// may have completed (then [`reap`](Self::reap)).
    fn check_or_wait(&mut self, jobs: &mut VecDeque<Active>) -> Result<bool> {
        if !self.unchecked.is_empty() {
            self.ctx
                .check_piece(&mut self.unchecked, jobs, self.copies.as_mut());
            self.engine.flush()?;
            return Ok(true);
        }
        if !self.in_flight.is_empty() {
            self.engine.wait(1)?;
            return Ok(true);
        }
        // Waiting on a copy or a device region (the pump waited a little), or nothing left to
        // submit (retire what is done, then wait for an epoch): round again.
        if self.copies.as_ref().is_some_and(|q| !q.is_empty())
            || !jobs.iter().any(|a| a.submitting())
        {
            return Ok(false);
        }
        // Every slot is with the consumers: wait for one to come back, as long as the
        // consumer takes (a slow step or a pause is not an error; a consumer waiting for a
        // batch says who holds the slots, and fails only past its own timeout). The wait is
        // in short steps so that a stopped epoch or a new one is seen.
        self.arena.wait_free(Duration::from_millis(20));
        Ok(false)
    }

    /// Takes the groups whose reads completed: to be checked, or handed over (host) or to the
    /// copies (device) where nothing is to be checked; a retired epoch's slot returns.
    fn reap(&mut self, jobs: &mut VecDeque<Active>) {
        while let Some(c) = self.engine.pop() {
            let f = self
                .in_flight
                .remove(&c.user_data)
                .expect("a group per job");
            let Some(a) = jobs.iter_mut().find(|a| a.id == f.epoch) else {
                self.arena.put(c.slot);
                continue;
            };
            // A file changed while its reads were in flight (copied over, cut): what they
            // read may be either version, so its samples of the group fail, named. Not for a
            // file per sample (an ImageFolder's): each is opened, looked at, just before its
            // one read, and a second statx a file cost 15% of small files' loading CPU.
            let ds = &*self.ctx.dataset;
            let checked = a.job.checker.loader_verifies();
            let mut changed: HashMap<u32, crate::io::ReadOutcome> = HashMap::new();
            let reads = if ds.per_sample_root.is_some() {
                &[][..]
            } else {
                &f.group.reads[..]
            };
            for r in reads {
                if let std::collections::hash_map::Entry::Vacant(v) = changed.entry(r.file) {
                    if let Some(e) = self.files.changed(&self.engine, ds, r.file, checked) {
                        v.insert(Err(e));
                    }
                }
            }
            let Filled {
                mut meta,
                slot,
                used,
            } = self
                .ctx
                .filled(f.group, c, f.submitted, &f.unopened, &changed);
            if a.job.checker.loader_checks() {
                self.unchecked.push(Unchecked {
                    id: f.epoch,
                    meta,
                    region: Region::new(self.arena.clone(), slot),
                    copy: self.copies.is_some().then_some(used),
                });
                continue;
            }
            meta.checked = meta.ids.len();
            match self.copies.as_mut() {
                Some(q) => q.push(slot, used, (f.epoch, meta)),
                None => a.deliver(GroupDone {
                    meta,
                    mem: Memory::Host(Arc::new(Region::new(self.arena.clone(), slot))),
                }),
            }
        }
    }
}

impl WorkerCtx {
    fn run(self, rx: Receiver<Box<EpochJob>>) {
        // Declared first, dropped last: the engine and the copy pipeline (locals of `serve`)
        // have cancelled and drained everything before an epoch is signalled retired.
        let mut jobs: VecDeque<Active> = VecDeque::new();
        if let Err(e) = self.serve(&rx, &mut jobs) {
            for a in jobs.iter_mut() {
                a.fail(e.clone());
            }
        }
    }

    /// Serves epochs until every handle is gone (or an error ends the thread): each turn takes
    /// the epochs asked for, starts groups, moves copies on, then checks a piece, waits for a
    /// slot or for reads, and takes the groups whose reads completed.
    fn serve(&self, rx: &Receiver<Box<EpochJob>>, jobs: &mut VecDeque<Active>) -> Result<()> {
        let Ok(first) = rx.recv() else {
            return Ok(());
        };
        let mut io = match IoThread::start(self, &first) {
            Ok(io) => io,
            Err(e) => {
                // The engine could not be made (a bad GPUFEED_ENGINE, no memory to pin): the
                // first epoch's consumer is told why, not that the thread ended.
                let _ = first.tx.send(Msg::Failed(e));
                return Ok(());
            }
        };
        io.activate(jobs, first);
        loop {
            if !io.take_epochs(rx, jobs) {
                return Ok(()); // every handle is gone
            }
            io.start_groups(jobs)?;
            io.pump_copies(jobs)?;
            if io.check_or_wait(jobs)? {
                io.reap(jobs);
            }
        }
    }

    /// Turns a completed group into sample spans within its slot.
    fn filled(
        &self,
        mut g: Group,
        c: Completion,
        submitted: Instant,
        unopened: &Unopened,
        changed: &HashMap<u32, crate::io::ReadOutcome>,
    ) -> Filled {
        let read_done = Instant::now();
        let ds = &*self.dataset;
        let ids = std::mem::take(&mut g.ids);
        let outcomes = c.outcomes();
        let mut spans = Vec::with_capacity(ids.len());
        let mut read_errors: HashMap<u32, Arc<Error>> = HashMap::new();
        for (&id, p) in ids.iter().zip(&g.scatter) {
            let s = ds.sample(id as usize);
            let outcome = match (
                changed.get(&g.reads[p.read as usize].file),
                unopened.submitted_index(p.read),
            ) {
                (Some(e), _) => e,
                (None, Ok(k)) => &outcomes[k],
                (None, Err(e)) => e,
            };
            let span = match outcome {
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
                    // One failed read, shared as the cause of each sample it held (a remote
                    // object's copy named by its URL, as the sample's own error is).
                    let shared = read_errors
                        .entry(p.read)
                        .or_insert_with(|| Arc::new(ds.sources.named(e.clone())));
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
            meta: GroupMeta {
                batches: g.batches,
                ids,
                spans,
                labels: Vec::new(),
                reads: g.reads.len() as u64,
                bytes_read: g.bytes_read,
                submitted,
                read_done,
                remote: c.remote,
                copy_done: None,
                io_cpu_s: 0.0,
                checked: 0,
                checks_done: None,
                check_cpu_s: 0.0,
            },
            slot: c.slot,
            used,
        }
    }

    /// One step of the checks: hands over the groups nobody should wait for (a stopped
    /// epoch's are dropped; a host group its consumer is waiting for goes as it is, and the
    /// consumer checks the rest), then checks up to [`CHECK_PIECE`] bytes of the group that
    /// comes first (the earliest epoch's earliest batches), handing it over (host) or to the
    /// copies (device) once it is done.
    fn check_piece(
        &self,
        unchecked: &mut Vec<Unchecked>,
        jobs: &mut VecDeque<Active>,
        mut copies: Option<&mut CopyPipeline<(u64, GroupMeta)>>,
    ) {
        let now = Instant::now();
        let mut i = 0;
        while i < unchecked.len() {
            let u = &unchecked[i];
            match jobs.iter_mut().find(|a| a.id == u.id) {
                // (Cannot happen: an epoch stays while it has groups outstanding.)
                None => drop(unchecked.swap_remove(i)),
                Some(a)
                    if a.stopped() || (u.copy.is_none() && a.job.wants.any_of(&u.meta.batches)) =>
                {
                    unchecked
                        .swap_remove(i)
                        .hand_over(a, copies.as_deref_mut(), now);
                }
                Some(_) => i += 1,
            }
        }
        let Some(k) = (0..unchecked.len()).min_by_key(|&k| {
            let u = &unchecked[k];
            (u.id, u.meta.batches.start)
        }) else {
            return;
        };
        let Some(a) = jobs.iter_mut().find(|a| a.id == unchecked[k].id) else {
            return;
        };
        let u = &mut unchecked[k];
        // (Tests may have the thread check only the first samples of each group.)
        let n = u.meta.ids.len().min(a.job.check_ahead_samples);
        if u.meta.checked == n {
            unchecked
                .swap_remove(k)
                .hand_over(a, copies, Instant::now());
            return;
        }
        let c0 = crate::sys::thread_cpu_seconds();
        let mut bytes = 0;
        while u.meta.checked < n && bytes < CHECK_PIECE {
            let at = u.meta.checked;
            bytes += self.dataset.check_spans(
                u.region.bytes(),
                &u.meta.ids,
                &mut u.meta.spans,
                &mut u.meta.labels,
                a.job.checker.loader_verifies(),
                at..at + 1,
            );
            u.meta.checked += 1;
        }
        u.meta.check_cpu_s += crate::sys::thread_cpu_seconds() - c0;
        if u.meta.checked == n {
            unchecked
                .swap_remove(k)
                .hand_over(a, copies, Instant::now());
        }
    }
}

impl Unchecked {
    /// Hands a host group to its consumer (held back for checks until `at`), or a device group
    /// to the copies; a stopped epoch's group is dropped (its slot returns).
    fn hand_over(
        mut self,
        a: &mut Active,
        copies: Option<&mut CopyPipeline<(u64, GroupMeta)>>,
        at: Instant,
    ) {
        match (self.copy, copies) {
            (Some(used), Some(q)) if !a.stopped() => {
                // (The copy's wait counts from the read's end: `copy_done`.)
                q.push(self.region.into_slot(), used, (self.id, self.meta));
            }
            (Some(_), _) => a.outstanding -= 1,
            (None, _) => {
                self.meta.checks_done = Some(at);
                a.deliver(GroupDone {
                    meta: self.meta,
                    mem: Memory::Host(Arc::new(self.region)),
                });
            }
        }
    }
}

/// A group's reads whose file could not be opened (sorted by read index): they were not
/// submitted, so the engine's outcomes skip them.
#[derive(Default)]
struct Unopened(Vec<(u32, crate::io::ReadOutcome)>);

impl Unopened {
    /// Where read `read` of the group is among the submitted ones, or why it was not submitted
    /// (as a failed read's outcome).
    fn submitted_index(&self, read: u32) -> std::result::Result<usize, &crate::io::ReadOutcome> {
        if self.0.is_empty() {
            return Ok(read as usize);
        }
        match self.0.binary_search_by_key(&read, |(k, _)| *k) {
            Ok(i) => Err(&self.0[i].1),
            Err(before) => Ok(read as usize - before),
        }
    }
}

/// The dataset's files the engine has open, at most `cap`: all of them when they fit (opened as
/// first needed, then open for the loader's life), else the most recently used — a file is
/// opened when a group needs it and the least recently used one with no read in flight is
/// closed (an ImageFolder of 1.28 M files: one `open` per file per epoch, as any small-file
/// loader makes).
struct OpenFiles {
    /// The files open: their engine id, when each was last used, and the last group it was
    /// looked at again in ([`group`](Self::group)) — only the open ones (an ImageFolder's
    /// 1.28 M files cost nothing per file here, as its index keeps none either).
    open: std::collections::HashMap<u32, (FileId, u64, u64)>,
    /// The dataset's files.
    files: usize,
    /// (stamp, file) in order of use, oldest first; an entry whose stamp is not the file's last
    /// (or whose file is closed) is stale and skipped. Kept only when files may have to be
    /// closed.
    order: std::collections::VecDeque<(u64, u32)>,
    cap: usize,
    clock: u64,
    /// The alignment the plan laid reads out at: a file whose direct I/O needs more would have
    /// its reads widened over their neighbours in the slot, so it is refused.
    align: u32,
    /// The group being submitted ([`pin`](Self::pin) counts them): an open file is looked at
    /// again once a group, so that one copied over or cut while it is open (its size or
    /// modification time moved) is refused from the next group on, as it is at its open —
    /// read on at the index's offsets, a WebDataset's samples came back as other bytes.
    group: u64,
}

impl OpenFiles {
    fn new(files: usize, cap: usize, align: u32) -> OpenFiles {
        OpenFiles {
            open: Default::default(),
            files,
            order: std::collections::VecDeque::new(),
            cap: cap.max(1),
            clock: 0,
            align,
            group: 0,
        }
    }

    fn evicts(&self) -> bool {
        self.cap < self.files
    }

    /// A mark: files used from here on (the group being submitted) are not closed.
    fn pin(&mut self) -> u64 {
        self.group += 1;
        self.clock + 1
    }

    /// Dataset file `f`, opened if it is not; files used since `pinned` stay open. `checked`:
    /// every sample read from it is checked against its checksum.
    fn get(
        &mut self,
        engine: &mut Engine,
        ds: &Dataset,
        f: u32,
        pinned: u64,
        checked: bool,
    ) -> Result<FileId> {
        self.clock += 1;
        let stamp = self.clock;
        if self.evicts() {
            self.order.push_back((stamp, f));
            if self.order.len() > 4 * self.cap + 1024 {
                self.compact();
            }
        }
        if let Some((id, used, looked)) = self.open.get_mut(&f) {
            *used = stamp;
            let id = *id;
            // Once a group: is it still the file it was opened as (one statx)?
            if std::mem::replace(looked, self.group) != self.group {
                if let Some(e) = self.changed(engine, ds, f, checked) {
                    return Err(e);
                }
            }
            return Ok(id);
        }
        if self.open.len() >= self.cap {
            self.close_one(engine, pinned)?;
        }
        let id = loop {
            match engine.open(ds.file_path(f)) {
                Ok(id) => break id,
                // The process is out of descriptors (another loader's files, the trainer's
                // own): this loader keeps fewer open from now on — its least recently used
                // closed — and tries again; a failure only where none can be closed.
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
                        && !self.open.is_empty() =>
                {
                    self.shrink_to_open();
                    self.close_one(engine, pinned).map_err(|_| e)?;
                }
                Err(e) => {
                    ds.gone(e.raw_os_error());
                    return Err(e);
                }
            }
        };
        // (Its use, if a shrink above dropped it from the order.)
        if self.evicts() && self.order.back() != Some(&(stamp, f)) {
            self.order.push_back((stamp, f));
        }
        let info = engine.file_info(id)?;
        if let Some(why) = ds.changed_since_open(f, info.identity, info.size, checked) {
            let e = crate::dataset::changed_error(why).with_path(info.path.clone());
            let _ = engine.close(id);
            return Err(e);
        }
        let need = info.offset_align.max(info.mem_align);
        if info.direct && need > self.align {
            let e = crate::error::invalid(format!(
                "its direct I/O needs {need}-byte alignment, more than the {} bytes the loader \
                 lays reads out at: set PlanConfig::align to {need} or more",
                self.align
            ))
            .with_path(info.path.clone());
            let _ = engine.close(id);
            return Err(e);
        }
        self.open.insert(f, (id, stamp, self.group));
        Ok(id)
    }

    /// Why open dataset file `f` must not be read on, if so: it is no longer the file it was
    /// opened as (one `statx`); `None` for a file not open.
    fn changed(&self, engine: &Engine, ds: &Dataset, f: u32, checked: bool) -> Option<Error> {
        let &(id, _, _) = self.open.get(&f)?;
        let (now, size) = engine.stat_now(id).ok()?;
        let why = ds.changed_since_open(f, now, size, checked)?;
        let path = engine.file_info(id).ok()?.path.clone();
        Some(crate::dataset::changed_error(why).with_path(path))
    }

    /// Keeps at most the files open now from here on (the process ran out of descriptors),
    /// ordered by last use so that the least recently used are closed first.
    fn shrink_to_open(&mut self) {
        if self.cap > self.open.len() {
            crate::util::notice(&format!(
                "the process ran out of file descriptors: this loader keeps at most {} files \
                 open from now on (was {})",
                self.open.len(),
                self.cap
            ));
        }
        self.cap = self.open.len().max(1);
        let mut order: Vec<(u64, u32)> = self
            .open
            .iter()
            .map(|(&f, &(_, used, _))| (used, f))
            .collect();
        order.sort_unstable();
        self.order = order.into();
    }

    /// When open file `f` was last used (`None`: it is not open).
    fn used(&self, f: u32) -> Option<u64> {
        self.open.get(&f).map(|&(_, used, _)| used)
    }

    /// Closes the least recently used open file with no read in flight, not used since
    /// `pinned`.
    fn close_one(&mut self, engine: &mut Engine, pinned: u64) -> Result<()> {
        let mut busy = Vec::new();
        let closed = loop {
            let Some((stamp, f)) = self.order.pop_front() else {
                break false;
            };
            if self.used(f) != Some(stamp) {
                continue; // stale: used since, or closed
            }
            if stamp >= pinned {
                busy.push((stamp, f));
                continue;
            }
            let id = self.open[&f].0;
            match engine.close(id) {
                Ok(()) => {
                    self.open.remove(&f);
                    break true;
                }
                // Reads of it are in flight: it stays, as recently used as it was.
                Err(_) => busy.push((stamp, f)),
            }
        };
        for e in busy.into_iter().rev() {
            self.order.push_front(e);
        }
        if closed {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "all {} open files are in use by reads in flight (open_files_max is too low \
                     for the read groups in flight)",
                    self.cap
                ),
            ))
        }
    }

    /// Drops the stale entries of `order`.
    fn compact(&mut self) {
        let open = &self.open;
        self.order
            .retain(|&(stamp, f)| open.get(&f).is_some_and(|&(_, used, _)| used == stamp));
    }
}
