//! Who holds the loader's read buffers, for a consumer that has waited long to say why.
//!
//! A loader reads into a fixed set of buffers (host slots, or device regions on a device) and
//! waits, as long as it takes, for the consumer to give them back: a slow step or a pause is
//! never an error. But a consumer that keeps every buffer alive while asking for more waits for
//! ever, and a trainer waiting on storage wants to know it. So each epoch keeps a small ledger
//! of the groups it received and the batches it handed out (weak references: the ledger never
//! keeps memory alive), and [`Holders::report`] turns it, with the I/O thread's gauges and the
//! free counts, into one sentence. Counts are read without stopping anything, so a report is a
//! snapshot that may be a moment out of date; nothing depends on it but the message.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::batch::{Memory, Region};
use crate::buf::Arena;
use crate::gpu::{DevicePool, DeviceRegion};
use crate::util::Unpoison;

use super::FrontDoor;

/// What the I/O thread is doing now, published for the reports.
#[derive(Debug, Default)]
pub(super) struct Gauges {
    /// Read groups whose reads are in flight (each holds a host slot).
    pub(super) reading: AtomicUsize,
    /// Groups being copied to the device (each holds a device region being written).
    pub(super) copying: AtomicUsize,
}

/// A group's memory, not kept alive.
enum WeakMemory {
    Host(Weak<Region>),
    Device(Weak<DeviceRegion>),
}

impl WeakMemory {
    fn of(m: &Memory) -> WeakMemory {
        match m {
            Memory::Host(r) => WeakMemory::Host(Arc::downgrade(r)),
            Memory::Device(r) => WeakMemory::Device(Arc::downgrade(r)),
        }
    }

    fn alive(&self) -> bool {
        match self {
            WeakMemory::Host(w) => w.strong_count() > 0,
            WeakMemory::Device(w) => w.strong_count() > 0,
        }
    }

    fn is(&self, m: &Memory) -> bool {
        match (self, m) {
            (WeakMemory::Host(w), Memory::Host(r)) => std::ptr::eq(w.as_ptr(), Arc::as_ptr(r)),
            (WeakMemory::Device(w), Memory::Device(r)) => std::ptr::eq(w.as_ptr(), Arc::as_ptr(r)),
            _ => false,
        }
    }
}

/// A group this epoch received.
struct Entry {
    mem: WeakMemory,
    /// The group's batches that are delivered (those before a resume point are not).
    batches: Range<u32>,
    /// Batches of it handed out so far.
    handed: u32,
}

#[derive(Default)]
struct Ledger {
    groups: Vec<Entry>,
    /// Groups received from the I/O thread.
    received: usize,
}

/// An epoch's ledger plus what it needs to count the rest; shared (an image epoch reports for
/// the loader epoch its feeder thread consumes).
pub(crate) struct Holders {
    arena: Arc<Arena>,
    pool: Option<Arc<DevicePool>>,
    gauges: Arc<Gauges>,
    /// Groups the I/O thread sent to this epoch (some may wait in the channel).
    sent: Arc<AtomicUsize>,
    epoch: u64,
    in_flight_groups: u32,
    prefetch_groups: u32,
    door: FrontDoor,
    ledger: Mutex<Ledger>,
}

impl std::fmt::Debug for Holders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holders")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// The loader-wide parts of a [`Holders`].
pub(super) struct HoldersCtx {
    pub(super) arena: Arc<Arena>,
    pub(super) pool: Option<Arc<DevicePool>>,
    pub(super) gauges: Arc<Gauges>,
    pub(super) in_flight_groups: u32,
    pub(super) prefetch_groups: u32,
    pub(super) door: FrontDoor,
}

/// Who holds the read buffers at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Buffers in all (host slots, or device regions on a device).
    pub(crate) buffers: usize,
    pub(crate) free: usize,
    /// Groups being read (host slots) or copied (device regions).
    pub(crate) reading: usize,
    pub(crate) copying: usize,
    /// Groups of this epoch waiting for the consumer, no batch of them handed out yet.
    pub(crate) queued: usize,
    /// Groups of this epoch with a batch handed out that is still alive (or a batch still
    /// queued behind one handed out), and the batches handed out of them.
    pub(crate) held: usize,
    pub(crate) held_batches: Vec<Range<u32>>,
    /// The rest: another epoch's (one asked ahead, an earlier one not dropped, or batches kept
    /// from one).
    pub(crate) elsewhere: usize,
}

impl Holders {
    pub(super) fn new(ctx: &HoldersCtx, epoch: u64, sent: Arc<AtomicUsize>) -> Holders {
        Holders {
            arena: ctx.arena.clone(),
            pool: ctx.pool.clone(),
            gauges: ctx.gauges.clone(),
            sent,
            epoch,
            in_flight_groups: ctx.in_flight_groups,
            prefetch_groups: ctx.prefetch_groups,
            door: ctx.door,
            ledger: Mutex::default(),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unpoisoned()
    }

    /// A group arrived with `batches` to hand out (none, when a resume point skips it all).
    pub(super) fn received(&self, mem: &Memory, batches: Range<u32>) {
        let mut l = self.ledger();
        l.received += 1;
        // Groups whose memory is gone are forgotten: the ledger stays as small as the number of
        // buffers.
        l.groups.retain(|e| e.mem.alive());
        if !batches.is_empty() {
            l.groups.push(Entry {
                mem: WeakMemory::of(mem),
                batches,
                handed: 0,
            });
        }
    }

    /// A batch of the group in `mem` was handed out.
    pub(super) fn handed_out(&self, mem: &Memory) {
        let mut l = self.ledger();
        if let Some(e) = l.groups.iter_mut().rev().find(|e| e.mem.is(mem)) {
            e.handed += 1;
        }
    }

    /// Who holds the buffers now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let l = self.ledger();
        let in_channel = self.sent.load(Ordering::Relaxed).saturating_sub(l.received);
        let (mut queued, mut held) = (in_channel, 0);
        let mut held_batches = Vec::new();
        for e in l.groups.iter().filter(|e| e.mem.alive()) {
            if e.handed == 0 {
                queued += 1;
            } else {
                held += 1;
                held_batches.push(e.batches.start..e.batches.start + e.handed);
            }
        }
        drop(l);
        let reading = self.gauges.reading.load(Ordering::Relaxed);
        let copying = self.gauges.copying.load(Ordering::Relaxed);
        let (buffers, free, busy) = match &self.pool {
            // On a device, groups hold regions (host slots only while read and copied).
            Some(p) => (p.regions(), p.free_regions(), copying),
            None => (
                self.arena.slots() as usize,
                self.arena.free_slots(),
                reading,
            ),
        };
        let elsewhere = buffers.saturating_sub(free + busy + queued + held);
        Snapshot {
            buffers,
            free,
            reading,
            copying,
            queued,
            held,
            held_batches,
            elsewhere,
        }
    }

    /// Whether the loader is blocked on memory rather than on storage: nothing is read or
    /// copied, and no buffer is free.
    pub(crate) fn blocked_on_memory(s: &Snapshot) -> bool {
        s.free == 0 && s.reading == 0 && s.copying == 0
    }

    /// One sentence on who holds the buffers, with what to do, naming settings as the door the
    /// loader was built through spells them.
    pub(crate) fn report(&self, s: &Snapshot) -> String {
        let what = if self.pool.is_some() {
            "device buffers"
        } else {
            "read buffers"
        };
        let mut out = format!(
            "the loader's {} {what} ({} {} + {} in flight): {} free",
            s.buffers,
            self.door.prefetch(),
            self.prefetch_groups,
            self.in_flight_groups,
            s.free
        );
        if s.reading > 0 {
            out.push_str(&format!(", {} being read", s.reading));
        }
        if s.copying > 0 {
            out.push_str(&format!(", {} being copied to the device", s.copying));
        }
        if s.queued > 0 {
            out.push_str(&format!(
                ", {} read and waiting for epoch {} to take them",
                s.queued, self.epoch
            ));
        }
        if s.held > 0 {
            let ranges: Vec<String> = s
                .held_batches
                .iter()
                .map(|r| match r.len() {
                    1 => format!("{}", r.start),
                    _ => format!("{}-{}", r.start, r.end - 1),
                })
                .collect();
            out.push_str(&format!(
                ", {} held by batches of epoch {} that were handed out and are still alive \
                 (batches {})",
                s.held,
                self.epoch,
                ranges.join(", ")
            ));
        }
        if s.elsewhere > 0 {
            out.push_str(&format!(
                ", {} held by another epoch of this loader (one asked for ahead, or an earlier \
                 one not yet dropped or whose batches are still alive)",
                s.elsewhere
            ));
        }
        if Self::blocked_on_memory(s) {
            out.push_str(&format!(
                ". Nothing can be read until one is given back: a batch's memory returns when \
                 the batch (every batch of its group, and every tensor viewing it) is dropped; \
                 copy what you keep, drop an epoch you stopped using, or raise {}",
                self.door.prefetch()
            ));
        } else if s.reading > 0 {
            out.push_str(". Storage is what the wait is for");
        }
        out
    }
}
