//! The I/O thread of an epoch: submits read groups, checks and copies them, hands them over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::{Memory, Region, SampleSpan};
use crate::buf::{Arena, Slot};
use crate::config::EngineConfig;
use crate::dataset::{Dataset, Frame};
use crate::error::{Error, ErrorKind, Result};
use crate::gpu::copy::CopyPipeline;
use crate::io::{Completion, Engine, FileId, ReadSpec};
use crate::plan::{EpochPlan, Group};

use super::{CustomBackend, GpuState};

/// How long the I/O thread waits for the consumer to return a slot before it reports a stall.
const STALL_LIMIT: Duration = Duration::from_secs(30);

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

pub(super) struct Worker {
    pub(super) backend: Option<CustomBackend>,
    pub(super) epoch: u64,
    pub(super) arena: Arc<Arena>,
    pub(super) dataset: Arc<Dataset>,
    pub(super) plan: EpochPlan,
    pub(super) engine: EngineConfig,
    pub(super) gpu: Option<Arc<GpuState>>,
    pub(super) verify: bool,
    pub(super) in_flight_groups: usize,
    pub(super) start: u32,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) tx: SyncSender<Msg>,
}

impl Worker {
    pub(super) fn run(self) {
        if let Err(e) = self.read_epoch() {
            let _ = self.tx.send(Msg::Failed(e));
        }
    }

    fn read_epoch(&self) -> Result<()> {
        // The copy queue is declared before the engine, so it is dropped after it: reads are
        // cancelled and drained first, then copies, then the slots return.
        let mut copies = match &self.gpu {
            Some(g) => Some(CopyPipeline::<GroupMeta>::new(&g.pool, self.arena.clone())?),
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
                if self.pump_copies(q, in_flight.is_empty())? {
                    return Ok(()); // the consumer went away
                }
            }
            let copying = copies.as_ref().is_some_and(|q| !q.is_empty());
            if in_flight.is_empty() {
                if next >= self.plan.groups() && !copying {
                    return Ok(());
                }
                if copying {
                    // Waiting on a copy or a device region: pump_copies waited a little.
                    if copies.as_ref().is_some_and(|q| q.copying() == 0) {
                        self.stall_check(&mut stalled_since, "device regions")?;
                    } else {
                        stalled_since = None;
                    }
                    continue;
                }
                // Every slot is with the consumer: wait for one to come back, but never forever
                // (a consumer that keeps a batch of every group would wait on us meanwhile).
                if arena.wait_free(Duration::from_millis(20)) {
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
                    Some(q) => {
                        let f = self.checked(f);
                        q.push(f.slot, f.used, f.meta);
                    }
                    None => {
                        let done = GroupDone {
                            meta: f.meta,
                            mem: Memory::Host(Arc::new(Region::new(arena.clone(), f.slot))),
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
    fn pump_copies(&self, q: &mut CopyPipeline<GroupMeta>, idle: bool) -> Result<bool> {
        let pool = q.pool().clone();
        let open = q.pump(idle, |r, used, meta| {
            let g = GroupDone {
                meta,
                mem: Memory::Device(Arc::new(pool.region(r, used))),
            };
            self.tx.send(Msg::Group(g)).is_ok()
        })?;
        Ok(!open)
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
            meta: GroupMeta {
                batches: g.batches,
                ids,
                spans,
                labels: Vec::new(),
                reads: g.reads.len() as u64,
                bytes_read: g.bytes_read,
            },
            slot: c.slot,
            used,
        }
    }

    /// Checks frames and checksums on this thread (device path: the consumer never sees the
    /// host bytes).
    fn checked(&self, mut f: Filled) -> Filled {
        let bytes = self.arena.bytes(&f.slot);
        check_spans(
            &self.dataset,
            bytes,
            &f.meta.ids,
            &mut f.meta.spans,
            &mut f.meta.labels,
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
pub(super) fn check_spans(
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
pub(super) fn index_labels<'a>(ds: &'a Dataset, ids: &'a [u32]) -> impl Iterator<Item = i64> + 'a {
    ids.iter().map(|&i| ds.sample(i as usize).label)
}
