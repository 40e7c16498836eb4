//! The copy stage: one host → device copy per read group, from its arena slot into a device
//! region, and the slot states around it.
//!
//! A slot of the arena is `free → reading (engine) → filled → copying → free`: it returns to the
//! free list only after its copy's completion was observed (an event, not a host sync of the
//! stream). A device region is `free → being written → held by batches → free`: it returns when
//! the last batch that views it is dropped; if the consumer made a stream wait on the batch,
//! a *release* event is recorded on that stream at drop, and the next copy into the region waits
//! for it on the copy stream, so a kernel still reading the region is never overwritten — with no
//! host synchronisation.
//!
//! Two implementations: CUDA, and a simulator (host memory standing in for the device, copies
//! completing after random delays in any order) that lets CI check the state machine: the
//! simulator re-checks, when a copy completes, that its source slot was not changed meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::cuda::{self, Context, DeviceBuffer, Event, Stream};
use crate::buf::{Arena, Slot};
use crate::error::{Error, ErrorKind, Result};
use crate::rng::Rng;
use crate::util::lock;
use crate::util::Unpoison;

/// A simulated device, for tests: host memory, copies that complete late and out of order.
#[derive(Debug, Clone)]
pub struct SimDevice {
    /// Seeds the simulated copies' delays.
    pub seed: u64,
    /// A copy completes after 0..=delay_max polls of the copy stage.
    pub delay_max: u32,
    /// Figures the test reads afterwards.
    pub stats: Arc<SimDeviceStats>,
}

impl SimDevice {
    /// A simulated device with `seed` and the default delays.
    pub fn new(seed: u64) -> SimDevice {
        SimDevice {
            seed,
            delay_max: 6,
            stats: Arc::default(),
        }
    }
}

/// What the simulated device saw.
#[derive(Debug, Default)]
pub struct SimDeviceStats {
    /// Copies completed.
    pub copies: AtomicU64,
    /// Copies whose source slot changed while the copy was in flight (must stay 0).
    pub source_changed: AtomicU64,
    /// Copies into a region that batches still held (must stay 0).
    pub region_in_use: AtomicU64,
    /// Most copies in flight at once.
    pub in_flight_max: AtomicU64,
}

enum Mem {
    Cuda {
        buf: DeviceBuffer,
        ready: Event,
        released: Event,
        /// A release event was recorded on a consumer stream since the last copy.
        release_pending: AtomicBool,
    },
    Sim {
        bytes: Mutex<Vec<u8>>,
    },
}

/// The device regions of a loader, allocated once.
pub struct DevicePool {
    mem: Vec<Mem>,
    region_bytes: usize,
    free: Mutex<Vec<usize>>,
    cv: Condvar,
    /// Regions viewed by live batches (for the simulator's check).
    held: Mutex<Vec<bool>>,
    pub(crate) ctx: Option<Arc<Context>>,
    sim: Option<SimDevice>,
}

impl std::fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePool")
            .field("regions", &self.mem.len())
            .field("region_bytes", &self.region_bytes)
            .finish()
    }
}

impl DevicePool {
    /// `regions` device buffers of `region_bytes` on a CUDA device.
    pub fn cuda(ctx: &Arc<Context>, regions: usize, region_bytes: usize) -> Result<Arc<Self>> {
        let mut mem = Vec::with_capacity(regions);
        for _ in 0..regions {
            mem.push(Mem::Cuda {
                buf: DeviceBuffer::new(ctx, region_bytes)?,
                ready: Event::new(ctx)?,
                released: Event::new(ctx)?,
                release_pending: AtomicBool::new(false),
            });
        }
        Ok(Self::with(mem, region_bytes, Some(ctx.clone()), None))
    }

    /// The same in host memory, for the simulator.
    pub fn sim(dev: &SimDevice, regions: usize, region_bytes: usize) -> Arc<Self> {
        let mem = (0..regions)
            .map(|_| Mem::Sim {
                bytes: Mutex::new(vec![0; region_bytes]),
            })
            .collect();
        Self::with(mem, region_bytes, None, Some(dev.clone()))
    }

    fn with(
        mem: Vec<Mem>,
        region_bytes: usize,
        ctx: Option<Arc<Context>>,
        sim: Option<SimDevice>,
    ) -> Arc<Self> {
        let n = mem.len();
        Arc::new(DevicePool {
            mem,
            region_bytes,
            free: Mutex::new((0..n).rev().collect()),
            cv: Condvar::new(),
            held: Mutex::new(vec![false; n]),
            ctx,
            sim,
        })
    }

    /// Whether the regions are the simulated device's (host memory).
    pub fn is_simulated(&self) -> bool {
        self.sim.is_some()
    }

    /// Bytes of each region.
    pub fn region_bytes(&self) -> usize {
        self.region_bytes
    }

    /// Regions in the pool.
    pub fn regions(&self) -> usize {
        self.mem.len()
    }

    /// Regions neither held by batches nor being written.
    pub fn free_regions(&self) -> usize {
        lock(&self.free).len()
    }

    pub(crate) fn take(&self) -> Option<usize> {
        lock(&self.free).pop()
    }

    pub(crate) fn take_timeout(&self, t: Duration) -> Option<usize> {
        let mut f = lock(&self.free);
        if f.is_empty() {
            f = self.cv.wait_timeout(f, t).unpoisoned().0;
        }
        f.pop()
    }

    /// A free region, waiting in 20 ms steps as long as the consumer holds them all (its
    /// pace), or `None` once `cancelled`.
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn take_waiting(&self, cancelled: &AtomicBool) -> Option<usize> {
        loop {
            if cancelled.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(r) = self.take_timeout(Duration::from_millis(20)) {
                return Some(r);
            }
        }
    }

    /// Orders a write of region `r` by work on `stream` after what its last consumer enqueued
    /// before dropping its batch (the release event), as the copy stage does.
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn before_write(&self, r: usize, stream: &Stream) -> Result<()> {
        if let Mem::Cuda {
            released,
            release_pending,
            ..
        } = &self.mem[r]
        {
            if release_pending.swap(false, Ordering::AcqRel) {
                stream.wait(released)?;
            }
        }
        Ok(())
    }

    /// Marks the end of a write of region `r` enqueued on `stream`: its ready event, which a
    /// consumer's stream waits on and the next writer synchronises on.
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn after_write(&self, r: usize, stream: &Stream) -> Result<()> {
        match &self.mem[r] {
            Mem::Cuda { ready, .. } => ready.record(stream),
            Mem::Sim { .. } => Ok(()),
        }
    }

    /// Waits (on the host) until the last write recorded into region `r` has completed, so
    /// what that write read may be changed.
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn wait_written(&self, r: usize) -> Result<()> {
        match &self.mem[r] {
            Mem::Cuda { ready, .. } => ready.synchronize(),
            Mem::Sim { .. } => Ok(()),
        }
    }

    /// The simulated device's bytes of region `r` (`None` on CUDA), for a simulated kernel to
    /// write; the caller holds the region (taken, being written).
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn sim_region(&self, r: usize) -> Option<MutexGuard<'_, Vec<u8>>> {
        match &self.mem[r] {
            Mem::Sim { bytes } => Some(lock(bytes)),
            Mem::Cuda { .. } => None,
        }
    }

    pub(crate) fn put_back(&self, r: usize) {
        lock(&self.free).push(r);
        self.cv.notify_one();
    }

    /// The device address of region `r` (0-based addresses in the simulator).
    pub(crate) fn ptr(&self, r: usize) -> u64 {
        match &self.mem[r] {
            Mem::Cuda { buf, .. } => buf.ptr(),
            Mem::Sim { .. } => (r * self.region_bytes) as u64,
        }
    }

    /// Hands region `r`, holding `used` bytes, to batches.
    pub(crate) fn region(self: &Arc<Self>, r: usize, used: usize) -> DeviceRegion {
        lock(&self.held)[r] = true;
        DeviceRegion {
            pool: self.clone(),
            index: r,
            used,
            consumer: Mutex::new(None),
        }
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        // Device memory is freed stream-ordered on the legacy default stream, which does not
        // wait for non-blocking streams: wait here for what the consumers' streams may still
        // read (their release events) and for the last copies, before the buffers go.
        for m in &self.mem {
            if let Mem::Cuda {
                ready,
                released,
                release_pending,
                ..
            } = m
            {
                if let Some(c) = &self.ctx {
                    let _ = c.bind();
                }
                let mut ok = ready.synchronize().is_ok();
                if release_pending.load(Ordering::Acquire) {
                    ok &= released.synchronize().is_ok();
                }
                if !ok {
                    if let Some(c) = &self.ctx {
                        let _ = c.synchronize();
                    }
                }
            }
        }
    }
}

/// A device region viewed by the batches of one read group; back to the pool when dropped.
pub struct DeviceRegion {
    pool: Arc<DevicePool>,
    index: usize,
    used: usize,
    /// The last stream made to wait on this region's ready event.
    consumer: Mutex<Option<u64>>,
}

impl DeviceRegion {
    /// The region's device address.
    pub fn ptr(&self) -> u64 {
        self.pool.ptr(self.index)
    }

    /// Bytes of the region holding data.
    pub fn len(&self) -> usize {
        self.used
    }

    /// Whether the region holds no data.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// The CUDA device ordinal (`None` for the simulator).
    pub fn device(&self) -> Option<u32> {
        self.pool.ctx.as_ref().map(|c| c.ordinal())
    }

    /// The event recorded after this region's copy (`None` for the simulator).
    pub fn ready_event(&self) -> Option<u64> {
        match &self.pool.mem[self.index] {
            Mem::Cuda { ready, .. } => Some(ready.raw()),
            Mem::Sim { .. } => None,
        }
    }

    /// Makes `stream` wait for the copy, and orders the region's reuse after work enqueued on
    /// it before the batch is dropped.
    ///
    /// # Safety
    /// `stream` must be a live `CUstream` of the device's primary context (or 0, 1 or 2, the
    /// legacy and per-thread default streams) and stay live until this region is dropped (a
    /// release event is recorded on it then).
    pub unsafe fn wait_on(&self, stream: u64) -> Result<()> {
        if let Mem::Cuda { ready, .. } = &self.pool.mem[self.index] {
            if let Some(c) = &self.pool.ctx {
                c.bind()?;
            }
            // SAFETY: the caller vouches for the stream; the context was just made current.
            unsafe { Stream::wait_raw(stream, ready)? };
        }
        *lock(&self.consumer) = Some(stream);
        Ok(())
    }

    /// The region's index in its pool.
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Copies `dst.len()` bytes from `offset` of the region to the host, synchronously, once
    /// the region's copy (or write) has completed; for the samples the CPU decodes.
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn read_range(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(dst.len())
            .filter(|&e| e <= self.used)
            .ok_or_else(|| {
                crate::error::invalid(format!(
                    "{} bytes at {offset} lie past the {} bytes of a device region",
                    dst.len(),
                    self.used
                ))
            })?;
        match &self.pool.mem[self.index] {
            Mem::Cuda { buf, ready, .. } => {
                ready.synchronize()?;
                buf.read(offset, dst)
            }
            Mem::Sim { bytes } => {
                dst.copy_from_slice(&lock(bytes)[offset..end]);
                Ok(())
            }
        }
    }

    /// Whether the region is in the simulated device's host memory.
    pub fn is_simulated(&self) -> bool {
        matches!(self.pool.mem[self.index], Mem::Sim { .. })
    }

    /// The simulated device's bytes of the region (`None` on CUDA): what a kernel launched by
    /// the simulator reads. The copy into it has completed (the region is handed out only
    /// then), and nothing writes it while a batch views it.
    #[cfg_attr(not(feature = "decode"), allow(dead_code))] // the device image stage
    pub(crate) fn sim_bytes(&self) -> Option<MutexGuard<'_, Vec<u8>>> {
        match &self.pool.mem[self.index] {
            Mem::Sim { bytes } => Some(lock(bytes)),
            Mem::Cuda { .. } => None,
        }
    }

    /// Copies the region's bytes to the host (synchronously; for checks and tests).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.used];
        match &self.pool.mem[self.index] {
            Mem::Cuda { buf, ready, .. } => {
                ready.synchronize()?;
                buf.read(0, &mut v)?;
            }
            Mem::Sim { bytes } => v.copy_from_slice(&lock(bytes)[..self.used]),
        }
        Ok(v)
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        if let Mem::Cuda {
            released,
            release_pending,
            ..
        } = &self.pool.mem[self.index]
        {
            if let Some(stream) = *lock(&self.consumer) {
                // Work the consumer enqueued on its stream before dropping the batch must finish
                // before the region is overwritten: the next copy waits for this event.
                let bound = self.pool.ctx.as_ref().map_or(Ok(()), |c| c.bind());
                let recorded = bound.and_then(|()| {
                    // SAFETY: `wait_on`'s caller promised the stream lives until this drop;
                    // the context was just made current.
                    unsafe { released.record_raw(stream) }
                });
                if recorded.is_ok() {
                    release_pending.store(true, Ordering::Release);
                } else if let Some(c) = &self.pool.ctx {
                    // Without the event, only a full wait is safe.
                    let _ = c.synchronize();
                }
            }
        }
        lock(&self.pool.held)[self.index] = false;
        self.pool.put_back(self.index);
    }
}

impl std::fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRegion")
            .field("index", &self.index)
            .field("used", &self.used)
            .finish()
    }
}

/// A copy in flight: its tag, region, and (simulator) what it reads.
struct InFlight {
    tag: u64,
    region: usize,
    src: *const u8,
    len: usize,
    /// Simulator: crc of the source at submission, polls left.
    crc: u32,
    delay: u32,
}

/// Copies groups from slots into device regions.
pub struct CopyStage {
    pool: Arc<DevicePool>,
    stream: Option<Stream>,
    in_flight: Vec<InFlight>,
    rng: Rng,
    /// A copy may still read a source this stage lost track of: never reuse its sources.
    broken: bool,
}

impl std::fmt::Debug for CopyStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyStage")
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

// SAFETY: the raw source pointers point into the loader's arena, whose slots are owned by the
// I/O thread that owns this stage until their copies complete; the stage never leaves that
// thread while copies are in flight.
unsafe impl Send for CopyStage {}

impl CopyStage {
    /// A stage over `pool` (a CUDA stream is created, the context bound to this thread).
    pub fn new(pool: &Arc<DevicePool>) -> Result<CopyStage> {
        let stream = match &pool.ctx {
            Some(c) => {
                c.bind()?;
                Some(Stream::new(c)?)
            }
            None => None,
        };
        let seed = pool.sim.as_ref().map_or(0, |s| s.seed);
        Ok(CopyStage {
            pool: pool.clone(),
            stream,
            in_flight: Vec::new(),
            rng: Rng::new(seed),
            broken: false,
        })
    }

    /// The regions this stage copies into.
    pub fn pool(&self) -> &Arc<DevicePool> {
        &self.pool
    }

    /// Whether a failed [`start`](Self::start) may have left a DMA reading its source.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Starts copying `len` bytes at `src` into region `r`.
    ///
    /// # Safety
    /// `src .. src + len` must stay valid and unchanged until [`poll`](Self::poll) reports
    /// `tag`, and region `r` must be taken from the pool and not viewed by any batch.
    pub unsafe fn start(&mut self, r: usize, src: *const u8, len: usize, tag: u64) -> Result<()> {
        if len > self.pool.region_bytes {
            return Err(crate::error::invalid(format!(
                "copy of {len} bytes into a {}-byte device region",
                self.pool.region_bytes
            )));
        }
        let mut crc = 0;
        let mut delay = 0;
        match (&self.pool.mem[r], &self.stream) {
            (
                Mem::Cuda {
                    buf,
                    ready,
                    released,
                    release_pending,
                },
                Some(s),
            ) => {
                if release_pending.swap(false, Ordering::AcqRel) {
                    s.wait(released)?;
                }
                // SAFETY: the caller keeps the source unchanged until the ready event is seen
                // complete; the region is ours (taken, not viewed) and `len` fits it.
                unsafe { cuda::memcpy_htod_async(buf.ptr(), src, len, s)? };
                if let Err(e) = ready.record(s) {
                    // The copy is enqueued but no event marks its end: wait for the stream so
                    // the caller may reuse the source; if even that fails, say the stage is
                    // broken so the caller leaks the source instead.
                    if s.synchronize().is_err() {
                        self.broken = true;
                    }
                    return Err(e);
                }
            }
            (Mem::Sim { .. }, _) => {
                let sim = self.pool.sim.as_ref().expect("a simulated pool");
                if lock(&self.pool.held)[r] {
                    sim.stats.region_in_use.fetch_add(1, Ordering::Relaxed);
                }
                // SAFETY: valid for `len` bytes per the caller's contract.
                crc = crate::util::crc32c(unsafe { std::slice::from_raw_parts(src, len) });
                delay = self.rng.below(sim.delay_max as u64 + 1) as u32;
            }
            _ => unreachable!("a CUDA pool always has a stream"),
        }
        self.in_flight.push(InFlight {
            tag,
            region: r,
            src,
            len,
            crc,
            delay,
        });
        if let Some(sim) = &self.pool.sim {
            sim.stats
                .in_flight_max
                .fetch_max(self.in_flight.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Appends the tags of copies that completed, in any order. With `wait`, blocks until at
    /// least one completes (if any is in flight).
    pub fn poll(&mut self, done: &mut Vec<u64>, wait: bool) -> Result<()> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        if self.pool.sim.is_some() {
            return self.poll_sim(done, wait);
        }
        loop {
            let before = done.len();
            let mut i = 0;
            while i < self.in_flight.len() {
                let Mem::Cuda { ready, .. } = &self.pool.mem[self.in_flight[i].region] else {
                    unreachable!("CUDA pool")
                };
                if ready.done()? {
                    done.push(self.in_flight.swap_remove(i).tag);
                } else {
                    i += 1;
                }
            }
            if !wait || done.len() > before {
                return Ok(());
            }
            // Copies take a few ms; yield rather than block the stream (no host sync).
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn poll_sim(&mut self, done: &mut Vec<u64>, wait: bool) -> Result<()> {
        let before = done.len();
        let mut order: Vec<usize> = (0..self.in_flight.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        let mut finished = Vec::new();
        for &i in &order {
            let f = &mut self.in_flight[i];
            if f.delay == 0 {
                finished.push(i);
            } else {
                f.delay -= 1;
            }
        }
        if wait && finished.is_empty() {
            finished.push(order[0]);
        }
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for i in finished {
            let f = self.in_flight.swap_remove(i);
            self.complete_sim(&f)?;
            done.push(f.tag);
        }
        debug_assert!(!wait || done.len() > before);
        Ok(())
    }

    fn complete_sim(&self, f: &InFlight) -> Result<()> {
        let sim = self.pool.sim.as_ref().expect("a simulated pool");
        // SAFETY: per `start`'s contract the source is still valid (the check below is how the
        // simulator catches a slot released early).
        let src = unsafe { std::slice::from_raw_parts(f.src, f.len) };
        sim.stats.copies.fetch_add(1, Ordering::Relaxed);
        if crate::util::crc32c(src) != f.crc {
            sim.stats.source_changed.fetch_add(1, Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::Io,
                "simulated device: a slot changed while its copy was in flight",
            ));
        }
        let Mem::Sim { bytes } = &self.pool.mem[f.region] else {
            unreachable!("simulated pool")
        };
        lock(bytes)[..f.len].copy_from_slice(src);
        Ok(())
    }

    /// Waits for every copy in flight (shutdown: their slots may be freed only afterwards).
    pub fn drain(&mut self, done: &mut Vec<u64>) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.poll(done, true)?;
        }
        Ok(())
    }
}

impl Drop for CopyStage {
    fn drop(&mut self) {
        // Never leave a DMA reading a slot the caller is about to free.
        let mut done = Vec::new();
        if self.drain(&mut done).is_err() {
            if let Some(s) = &self.stream {
                let _ = s.synchronize();
            }
        }
    }
}

/// Filled arena slots on their way into device regions — waiting for a free region, then being
/// copied — with the DMA-safety rule in one place: a slot goes back to the arena only after its
/// copy was seen complete. The loader (items: read groups) and `bench gpu` (no items) both
/// copy through it.
///
/// Dropping it waits for every copy before the slots go back. If waiting fails, or a copy could
/// not be tracked (the stage is broken), the slots concerned and the arena's mapping are
/// leaked — never reused or unmapped under a DMA that may still read them.
pub struct CopyPipeline<T> {
    stage: CopyStage,
    arena: Arc<Arena>,
    waiting: VecDeque<(Slot, usize, T)>,
    /// By tag: the slot being read, its region, the bytes copied, the item.
    copying: HashMap<u64, (Slot, usize, usize, T)>,
    next_tag: u64,
    done: Vec<u64>,
}

impl<T> std::fmt::Debug for CopyPipeline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyPipeline")
            .field("waiting", &self.waiting.len())
            .field("copying", &self.copying.len())
            .finish()
    }
}

impl<T> CopyPipeline<T> {
    /// A pipeline copying slots of `arena` into regions of `pool` (a CUDA stream is created,
    /// the context bound to this thread).
    pub fn new(pool: &Arc<DevicePool>, arena: Arc<Arena>) -> Result<CopyPipeline<T>> {
        Ok(CopyPipeline {
            stage: CopyStage::new(pool)?,
            arena,
            waiting: VecDeque::new(),
            copying: HashMap::new(),
            next_tag: 0,
            done: Vec::new(),
        })
    }

    /// The regions this pipeline copies into.
    pub fn pool(&self) -> &Arc<DevicePool> {
        self.stage.pool()
    }

    /// Queues the first `used` bytes of `slot` (filled, no read in flight) for copying.
    pub fn push(&mut self, slot: Slot, used: usize, item: T) {
        self.waiting.push_back((slot, used, item));
    }

    /// Copies in flight.
    pub fn copying(&self) -> usize {
        self.copying.len()
    }

    /// Nothing waiting and nothing being copied.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.copying.is_empty()
    }

    /// Removes the waiting (not yet copying) entries whose item `drop_it` picks, their slots
    /// back to the arena; returns how many. (A consumer that stopped needs no copy, and its
    /// groups must not wait for regions its own batches may hold.)
    pub fn discard_waiting(&mut self, mut drop_it: impl FnMut(&T) -> bool) -> usize {
        let mut dropped = 0;
        for (slot, used, item) in std::mem::take(&mut self.waiting) {
            if drop_it(&item) {
                self.arena.put(slot);
                dropped += 1;
            } else {
                self.waiting.push_back((slot, used, item));
            }
        }
        dropped
    }

    /// Whether a copy could not be tracked: its slot, and the arena's mapping, are leaked, and
    /// whatever else lets a DMA read the arena (its CUDA registration) must be kept too.
    #[cfg_attr(not(feature = "cli"), allow(dead_code))] // `bench gpu`'s pipeline
    pub fn broken(&self) -> bool {
        self.stage.broken()
    }

    /// Starts copies into free regions, then hands each completed copy to
    /// `deliver(region, bytes, item)` after its slot went back to the arena (the region is then
    /// the caller's: turn it into a [`DeviceRegion`] with `DevicePool::region` or put it
    /// back). With `idle` (the caller has nothing else to wait for), waits up to 20 ms for a
    /// free region when none is being copied, or for a copy to complete.
    pub fn pump(&mut self, idle: bool, mut deliver: impl FnMut(usize, usize, T)) -> Result<()> {
        let pool = self.stage.pool().clone();
        while !self.waiting.is_empty() {
            let r = if idle && self.copying.is_empty() {
                pool.take_timeout(Duration::from_millis(20))
            } else {
                pool.take()
            };
            let Some(r) = r else { break };
            let (slot, used, item) = self.waiting.pop_front().expect("not empty");
            self.next_tag += 1;
            let tag = self.next_tag;
            // Slicing bounds the copy by the slot (a `used` past it panics here instead).
            let src = self.arena.bytes(&slot)[..used].as_ptr();
            // SAFETY: `src..src + used` lies in the slot, which stays in `self.copying` (owned
            // here, so unchanged and mapped) until `poll` reports this tag, or forever if the
            // stage breaks; region `r` was just taken from the pool, so no batch views it.
            if let Err(e) = unsafe { self.stage.start(r, src, used, tag) } {
                if self.stage.broken() {
                    // A DMA may still read the slot: it is not put back (so never handed out
                    // again), nor is its region, and the mapping is kept.
                    self.leak_arena();
                    let _leaked = slot;
                } else {
                    pool.put_back(r);
                    self.arena.put(slot);
                }
                return Err(e);
            }
            self.copying.insert(tag, (slot, r, used, item));
        }
        self.done.clear();
        self.stage
            .poll(&mut self.done, idle && !self.copying.is_empty())?;
        for tag in self.done.drain(..) {
            let (slot, r, used, item) = self.copying.remove(&tag).expect("a copy per tag");
            self.arena.put(slot); // the copy has completed: the slot may be reused
            deliver(r, used, item);
        }
        Ok(())
    }

    /// Keeps the arena mapped for the rest of the process (a DMA may still read it).
    fn leak_arena(&self) {
        std::mem::forget(self.arena.clone());
    }
}

impl<T> Drop for CopyPipeline<T> {
    fn drop(&mut self) {
        let mut done = Vec::new();
        if self.stage.drain(&mut done).is_err() || self.stage.broken() {
            // Slots not put back are never handed out again: leaked, not reused under a DMA
            // that may still be reading them (their regions with them).
            self.leak_arena();
            self.copying.clear();
        }
        let pool = self.stage.pool().clone();
        for (_, (slot, r, _, _)) in self.copying.drain() {
            self.arena.put(slot);
            pool.put_back(r);
        }
        for (slot, _, _) in self.waiting.drain(..) {
            self.arena.put(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The simulator's check can fail: a source changed while its copy is in flight is caught,
    /// and a copy into a region batches still view is counted.
    #[test]
    fn simulator_catches_a_source_reused_early_and_a_region_in_use() {
        let mut dev = SimDevice::new(1);
        dev.delay_max = 0;
        let pool = DevicePool::sim(&dev, 2, 64);
        let mut stage = CopyStage::new(&pool).unwrap();
        let mut src = vec![7u8; 64];
        let r = pool.take().unwrap();
        // SAFETY: `src` outlives the copy (polled below before it is dropped).
        unsafe { stage.start(r, src.as_ptr(), 64, 1).unwrap() };
        src[3] = 8; // the slot "reused" while the copy is in flight
        let mut done = Vec::new();
        assert!(stage.poll(&mut done, true).is_err());
        assert_eq!(dev.stats.source_changed.load(Ordering::Relaxed), 1);

        let mut stage = CopyStage::new(&pool).unwrap();
        let region = pool.region(r, 64); // batches view region r
                                         // SAFETY: as above.
        unsafe { stage.start(r, src.as_ptr(), 64, 2).unwrap() };
        assert_eq!(dev.stats.region_in_use.load(Ordering::Relaxed), 1);
        stage.drain(&mut done).unwrap();
        assert_eq!(done, vec![2]);
        assert_eq!(region.to_host().unwrap(), src);
        drop(region);
        assert_eq!(pool.free_regions(), 2);
    }
}
