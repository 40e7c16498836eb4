//! The adversarial simulated GPU: device memory in host memory, and every asynchronous
//! operation — copies both ways, memsets, kernel launches, the JPEG engine's batched decode —
//! queued on its stream and completed after a seeded delay, in any order the streams and events
//! allow. Each operation declares the memory it reads and writes (device buffers, host ranges,
//! a decoder's state); the simulator reports a *hazard* when
//!
//! - an operation runs while an operation enqueued before it, touching the same memory with
//!   a write on either side, is still pending (nothing ordered the two: on a GPU they race), or
//! - the host writes, frees, re-initialises or reads memory that a pending operation touches.
//!
//! Hazards are counted in [`SimDeviceStats`](super::SimDeviceStats) with a description of
//! each of the first few, which tests assert empty. Work makes progress only when the host
//! calls into the simulator (each call advances the clock by one tick; a wait advances it until
//! the work waited for has run), so a pipeline that forgot a wait sees its operations still
//! pending where a fast GPU might have hidden the bug.
//!
//! Addresses: buffer `id`'s byte `o` is at `id << 40 | o`, so kernel parameters and DLPack
//! pointers resolve to a buffer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{SimDevice, SimDeviceStats};
use crate::error::{Error, ErrorKind, Result};
use crate::rng::Rng;
use crate::util::lock;

const ADDR_SHIFT: u32 = 40;

/// The legacy default stream's handle (`CU_STREAM_LEGACY`); 0 and 2 name it too here.
pub(crate) const LEGACY: u64 = 1;

/// Memory an operation touches.
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the JPEG engine's state"
    )
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Res {
    /// A device buffer, by id.
    Dev(u64),
    /// Host memory (absolute addresses).
    Host,
    /// A library's state (the JPEG decoder's), by id.
    State(u64),
}

/// One access: what, which bytes, whether written.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub(crate) res: Res,
    pub(crate) range: Range<u64>,
    pub(crate) write: bool,
}

impl Access {
    pub(crate) fn read(res: Res, range: Range<u64>) -> Access {
        Access {
            res,
            range,
            write: false,
        }
    }
    pub(crate) fn write(res: Res, range: Range<u64>) -> Access {
        Access {
            res,
            range,
            write: true,
        }
    }
    /// The whole of buffer `id`.
    pub(crate) fn buf(id: u64, write: bool) -> Access {
        Access {
            res: Res::Dev(id),
            range: 0..u64::MAX,
            write,
        }
    }
    fn conflicts(&self, o: &Access) -> bool {
        self.res == o.res
            && (self.write || o.write)
            && self.range.start < o.range.end
            && o.range.start < self.range.end
    }
}

/// Device memory: buffers by id.
#[derive(Default)]
pub(crate) struct Memory {
    bufs: HashMap<u64, Vec<u8>>,
}

impl Memory {
    /// Takes buffer `id` out (to be put back with [`Memory::put`]), so several can be used at
    /// once; an empty vector if it was freed.
    pub(crate) fn take(&mut self, id: u64) -> Vec<u8> {
        self.bufs.remove(&id).unwrap_or_default()
    }
    pub(crate) fn put(&mut self, id: u64, v: Vec<u8>) {
        self.bufs.insert(id, v);
    }
    /// Buffer `id`'s bytes (empty if freed).
    pub(crate) fn get_mut(&mut self, id: u64) -> &mut [u8] {
        self.bufs.get_mut(&id).map_or(&mut [], |v| v.as_mut_slice())
    }
}

type Run = Box<dyn FnOnce(&mut Memory) + Send>;

struct Op {
    stream: u64,
    what: String,
    /// An operation that must complete first (a stream's wait on an event).
    after: Option<u64>,
    delay: u32,
    access: Vec<Access>,
    run: Option<Run>,
}

#[derive(Default)]
struct State {
    next: u64,
    mem: Memory,
    /// Pending operations by id (ids grow in enqueue order).
    pending: BTreeMap<u64, Op>,
    /// Each stream's pending operations, in order.
    streams: HashMap<u64, VecDeque<u64>>,
    /// Each event's marker: the last operation of the stream it was recorded on (`None`: that
    /// stream was idle, or never recorded).
    events: HashMap<u64, Option<u64>>,
}

/// The simulated GPU of one [`SimDevice`].
pub(crate) struct SimGpu {
    st: Mutex<(State, Rng)>,
    seed: u64,
    delay_max: u32,
    fail_every: u32,
    launches: std::sync::atomic::AtomicU64,
    pub(crate) stats: Arc<SimDeviceStats>,
}

impl std::fmt::Debug for SimGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGpu").field("seed", &self.seed).finish()
    }
}

/// Which handle a raw stream names (0 and 2, the default streams, are the legacy one here).
fn stream_of(raw: u64) -> u64 {
    if raw <= 2 {
        LEGACY
    } else {
        raw
    }
}

impl SimGpu {
    pub(crate) fn new(cfg: &SimDevice) -> Arc<SimGpu> {
        let mut s = State {
            next: 16, // ids below are special handles
            ..State::default()
        };
        s.streams.insert(LEGACY, VecDeque::new());
        Arc::new(SimGpu {
            st: Mutex::new((s, Rng::new(cfg.seed ^ 0x05ee_d9b0))),
            seed: cfg.seed,
            delay_max: cfg.delay_max,
            fail_every: cfg.fail_launch_every,
            launches: Default::default(),
            stats: cfg.stats.clone(),
        })
    }

    fn state(&self) -> MutexGuard<'_, (State, Rng)> {
        lock(&self.st)
    }

    fn id(s: &mut State) -> u64 {
        s.next += 1;
        s.next
    }

    /// The address of byte `off` of buffer `id`.
    pub(crate) fn addr(id: u64, off: u64) -> u64 {
        id << ADDR_SHIFT | off
    }

    /// The buffer and offset an address names.
    pub(crate) fn resolve(addr: u64) -> (u64, u64) {
        (addr >> ADDR_SHIFT, addr & ((1 << ADDR_SHIFT) - 1))
    }

    /// Whether this launch fails (every `fail_launch_every`-th).
    pub(crate) fn fail_launch(&self) -> bool {
        let n = self.launches.fetch_add(1, Ordering::Relaxed) + 1;
        self.fail_every > 0 && n.is_multiple_of(self.fail_every as u64)
    }

    /// `len` zeroed bytes of device memory; its id.
    pub(crate) fn alloc(&self, len: usize) -> u64 {
        let mut g = self.state();
        let id = Self::id(&mut g.0);
        g.0.mem.put(id, vec![0; len]);
        id
    }

    /// Frees buffer `id`: a hazard if a pending operation touches it.
    pub(crate) fn free(&self, id: u64) {
        self.host_access(&[Access::buf(id, true)], "free a device buffer");
        self.state().0.mem.bufs.remove(&id);
    }

    pub(crate) fn stream(&self) -> u64 {
        let mut g = self.state();
        let id = Self::id(&mut g.0);
        g.0.streams.insert(id, VecDeque::new());
        id
    }

    pub(crate) fn event(&self) -> u64 {
        let mut g = self.state();
        let id = Self::id(&mut g.0);
        g.0.events.insert(id, None);
        id
    }

    /// Enqueues `run` on `stream` (raw handle), touching `access`; it completes after a seeded
    /// delay, once everything before it on the stream has.
    pub(crate) fn enqueue(
        &self,
        stream: u64,
        what: impl Into<String>,
        access: Vec<Access>,
        run: impl FnOnce(&mut Memory) + Send + 'static,
    ) -> Result<()> {
        self.push(stream, what.into(), None, access, Some(Box::new(run)))
    }

    fn push(
        &self,
        stream: u64,
        what: String,
        after: Option<u64>,
        access: Vec<Access>,
        run: Option<Run>,
    ) -> Result<()> {
        let stream = stream_of(stream);
        let mut g = self.state();
        let (s, rng) = &mut *g;
        if !s.streams.contains_key(&stream) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("simulated device: no stream {stream}"),
            ));
        }
        let id = Self::id(s);
        let delay = rng.below(self.delay_max as u64 + 1) as u32;
        s.pending.insert(
            id,
            Op {
                stream,
                what,
                after,
                delay,
                access,
                run,
            },
        );
        s.streams.get_mut(&stream).expect("checked").push_back(id);
        self.tick(&mut g);
        Ok(())
    }

    /// Records `event` at the current end of `stream`.
    pub(crate) fn record(&self, event: u64, stream: u64) -> Result<()> {
        let stream = stream_of(stream);
        let mut g = self.state();
        let marker = match g.0.streams.get(&stream) {
            Some(q) => q.back().copied(),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("simulated device: no stream {stream}"),
                ))
            }
        };
        g.0.events.insert(event, marker);
        self.tick(&mut g);
        Ok(())
    }

    /// Makes `stream`'s later work wait for `event`.
    pub(crate) fn wait(&self, stream: u64, event: u64) -> Result<()> {
        let marker = self.state().0.events.get(&event).copied().flatten();
        self.push(
            stream,
            "a wait on an event".into(),
            marker,
            Vec::new(),
            None,
        )
    }

    /// Whether the work before `event`'s record has completed (advances the clock).
    pub(crate) fn done(&self, event: u64) -> bool {
        let mut g = self.state();
        self.tick(&mut g);
        Self::event_done(&g.0, event)
    }

    fn event_done(s: &State, event: u64) -> bool {
        match s.events.get(&event).copied().flatten() {
            Some(op) => !s.pending.contains_key(&op),
            None => true,
        }
    }

    /// Runs the simulated device until `event`'s work has completed — that work and what it
    /// depends on only: a wait does not let unrelated work finish by the way.
    pub(crate) fn sync_event(&self, event: u64) {
        let mut g = self.state();
        if let Some(op) = g.0.events.get(&event).copied().flatten() {
            self.drive(&mut g.0, op);
        }
    }

    /// Runs the simulated device until `stream` is idle (and only what that needs).
    pub(crate) fn sync_stream(&self, stream: u64) {
        let stream = stream_of(stream);
        let mut g = self.state();
        if let Some(&last) = g.0.streams.get(&stream).and_then(|q| q.back()) {
            self.drive(&mut g.0, last);
        }
    }

    /// Runs the simulated device until nothing is pending.
    pub(crate) fn sync_all(&self) {
        let mut g = self.state();
        while let Some(&first) = g.0.pending.keys().next() {
            self.drive(&mut g.0, first);
        }
    }

    /// Completes operation `target`, with what must complete before it (earlier work on its
    /// stream, the operations its waits name), regardless of their delays.
    fn drive(&self, s: &mut State, target: u64) {
        let mut want = vec![target];
        while let Some(&t) = want.last() {
            if !s.pending.contains_key(&t) {
                want.pop();
                continue;
            }
            let stream = s.pending[&t].stream;
            let head = *s.streams[&stream]
                .front()
                .expect("a pending op is on its stream");
            match s.pending[&head].after.filter(|a| s.pending.contains_key(a)) {
                Some(a) => want.push(a),
                None => self.complete(s, head),
            }
        }
    }

    /// The host touches `access` now: a hazard for each pending operation it conflicts with.
    pub(crate) fn host_access(&self, access: &[Access], what: &str) {
        let g = self.state();
        for op in g.0.pending.values() {
            if op
                .access
                .iter()
                .any(|b| access.iter().any(|a| a.conflicts(b)))
            {
                self.hazard(format!(
                    "the host did \"{what}\" while \"{}\" (stream {}) touching the same memory \
                     was pending",
                    op.what, op.stream
                ));
            }
        }
    }

    /// A copy of `len` bytes at `off` of buffer `id`, read by the host now (a hazard if a
    /// pending operation writes them).
    pub(crate) fn peek(&self, id: u64, off: u64, len: usize, what: &str) -> Vec<u8> {
        self.host_access(&[Access::read(Res::Dev(id), off..off + len as u64)], what);
        let mut g = self.state();
        let b = g.0.mem.get_mut(id);
        let end = (off as usize + len).min(b.len());
        b.get(off as usize..end)
            .map_or_else(Vec::new, |s| s.to_vec())
    }

    /// A fault of the simulated hardware (what a GPU would answer with an illegal address or
    /// corrupt memory), counted as a hazard.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the JPEG engine's stand-in"
        )
    )]
    pub(crate) fn fault(&self, what: String) {
        self.hazard(what);
    }

    fn hazard(&self, what: String) {
        let st = &self.stats;
        st.hazards.fetch_add(1, Ordering::Relaxed);
        let mut log = lock(&st.hazard_log);
        if log.len() < 16 {
            log.push(what);
        }
    }

    /// One tick: every pending operation's delay counts down, then stream heads whose delay
    /// ran out and whose waits are met complete, in a seeded random order (some are left
    /// for a later tick).
    fn tick(&self, g: &mut (State, Rng)) {
        let (s, rng) = g;
        for op in s.pending.values_mut() {
            op.delay = op.delay.saturating_sub(1);
        }
        loop {
            let mut ready: Vec<u64> = s
                .streams
                .values()
                .filter_map(|q| q.front().copied())
                .filter(|id| {
                    let op = &s.pending[id];
                    op.delay == 0 && op.after.is_none_or(|a| !s.pending.contains_key(&a))
                })
                .collect();
            if ready.is_empty() {
                return;
            }
            ready.sort_unstable();
            let id = ready[rng.below(ready.len() as u64) as usize];
            self.complete(s, id);
            if rng.chance(0.3) {
                return;
            }
        }
    }

    fn complete(&self, s: &mut State, id: u64) {
        let mut op = s.pending.remove(&id).expect("pending");
        s.streams
            .get_mut(&op.stream)
            .expect("its stream")
            .pop_front();
        for (other_id, other) in s.pending.range(..id) {
            if op
                .access
                .iter()
                .any(|a| other.access.iter().any(|b| a.conflicts(b)))
            {
                self.hazard(format!(
                    "\"{}\" (stream {}) ran while \"{}\" (stream {}, op {other_id}, enqueued \
                     before it) touching the same memory was pending: nothing ordered them",
                    op.what, op.stream, other.what, other.stream
                ));
            }
        }
        if let Some(run) = op.run.take() {
            run(&mut s.mem);
        }
    }
}
