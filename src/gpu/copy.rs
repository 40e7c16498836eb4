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
//! Written once against the device seam ([`super::dev`]): on CUDA, and on the adversarial
//! simulator, where copies complete late and out of order and every operation is checked
//! against the memory other pending ones touch; the seam's copy hooks let the simulator also
//! check, when a copy completes, that the region holds what its source held when it started.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::cuda::Context;
use super::dev::{CopyCheck, DBuf, DEvent, DStream, Gpu};
use crate::buf::{Arena, Slot};
use crate::error::Result;
use crate::util::lock;
use crate::util::Unpoison;

/// A region's device memory and events.
struct RegionMem {
    buf: DBuf,
    ready: DEvent,
    released: Mutex<Releases>,
}

/// A region's release events: one per consumer stream of its last batches, recorded when they
/// were dropped; the next write waits for the first `pending` of them.
#[derive(Default)]
struct Releases {
    events: Vec<DEvent>,
    pending: usize,
}

/// The device regions of a loader, allocated once.
pub struct DevicePool {
    mem: Vec<RegionMem>,
    region_bytes: usize,
    free: Mutex<Vec<usize>>,
    cv: Condvar,
    /// Regions viewed by live batches (a copy into one is a fault the device may check).
    held: Mutex<Vec<bool>>,
    pub(crate) gpu: Gpu,
    /// Host reads of regions (the CPU route's bytes, checks), ordered after each region's
    /// ready event: a non-blocking stream, not the legacy one a trainer queues on.
    xfer: DStream,
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
        Self::on(
            Gpu::new(Arc::new(super::cuda::CudaGpu(ctx.clone()))),
            regions,
            region_bytes,
        )
    }

    /// `regions` device buffers of `region_bytes` on `gpu` (the simulated device's constructor
    /// is `gpu::sim`'s).
    pub(crate) fn on(gpu: Gpu, regions: usize, region_bytes: usize) -> Result<Arc<Self>> {
        let _g = gpu.enter()?;
        let mut mem = Vec::with_capacity(regions);
        for _ in 0..regions {
            mem.push(RegionMem {
                buf: gpu.alloc(region_bytes)?,
                ready: gpu.event()?,
                released: Mutex::default(),
            });
        }
        Ok(Arc::new(DevicePool {
            mem,
            region_bytes,
            free: Mutex::new((0..regions).rev().collect()),
            cv: Condvar::new(),
            held: Mutex::new(vec![false; regions]),
            xfer: gpu.stream()?,
            gpu,
        }))
    }

    /// Whether the regions are the simulated device's (host memory).
    pub fn is_simulated(&self) -> bool {
        self.gpu.is_simulated()
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
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
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

    /// Orders a write of region `r` by work on `stream` after what its last consumers enqueued
    /// before dropping its batches (the release events of every consumer stream), as the copy
    /// stage does.
    pub(crate) fn before_write(&self, r: usize, stream: &DStream) -> Result<()> {
        let mut rel = lock(&self.mem[r].released);
        for e in &rel.events[..rel.pending] {
            stream.wait(e)?;
        }
        rel.pending = 0;
        Ok(())
    }

    /// Marks the end of a write of region `r` enqueued on `stream`: its ready event, which a
    /// consumer's stream waits on and the next writer synchronises on.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn after_write(&self, r: usize, stream: &DStream) -> Result<()> {
        self.mem[r].ready.record(stream)
    }

    /// Waits (on the host) until the last write recorded into region `r` has completed, so
    /// what that write read may be changed.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn wait_written(&self, r: usize) -> Result<()> {
        self.mem[r].ready.synchronize()
    }

    /// Region `r`'s device memory.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn buf(&self, r: usize) -> &DBuf {
        &self.mem[r].buf
    }

    /// Region `r` back to the free list (its previous contents are no one's).
    pub fn put_back(&self, r: usize) {
        lock(&self.free).push(r);
        self.cv.notify_one();
    }

    /// The device address of region `r`.
    pub(crate) fn ptr(&self, r: usize) -> u64 {
        self.mem[r].buf.ptr()
    }

    /// Hands region `r`, holding `used` bytes, to batches.
    pub(crate) fn region(self: &Arc<Self>, r: usize, used: usize) -> DeviceRegion {
        lock(&self.held)[r] = true;
        DeviceRegion {
            pool: self.clone(),
            index: r,
            used,
            consumers: Mutex::new(Vec::new()),
        }
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        // Device memory must outlive what the consumers' streams may still read (their
        // release events) and the last copies: wait for both before the buffers go.
        let _g = self.gpu.enter();
        for m in &self.mem {
            let mut ok = m.ready.synchronize().is_ok();
            let rel = lock(&m.released);
            for e in &rel.events[..rel.pending] {
                ok &= e.synchronize().is_ok();
            }
            if !ok {
                let _ = self.gpu.synchronize();
            }
        }
        let _ = self.xfer.synchronize();
    }
}

/// A device region viewed by the batches of one read group; back to the pool when dropped.
pub struct DeviceRegion {
    pool: Arc<DevicePool>,
    index: usize,
    used: usize,
    /// The consumer streams whose work on the region must finish before it is rewritten (with
    /// the thread that named `CU_STREAM_PER_THREAD`, 2: another thread's is another stream).
    consumers: Mutex<Vec<(u64, Option<std::thread::ThreadId>)>>,
}

impl DeviceRegion {
    /// The region's device address (the simulator's addresses on the simulated device).
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
        self.pool.gpu.ctx().map(|c| c.ordinal())
    }

    /// The event recorded after this region's copy (`None` for the simulator).
    pub fn ready_event(&self) -> Option<u64> {
        self.pool.mem[self.index].ready.raw()
    }

    /// Waits on the host (a blocking-sync event, no spin) until the region's last write (its
    /// copy, or the kernel that wrote a tensor) has completed.
    pub fn synchronize(&self) -> Result<()> {
        let _g = self.pool.gpu.enter()?;
        self.pool.wait_written(self.index)
    }

    /// Makes `stream` wait for the copy, and orders the region's reuse after work enqueued on
    /// it before the batch is dropped.
    ///
    /// # Safety
    /// `stream` must be a live `CUstream` of the device's primary context (or 0, 1 or 2, the
    /// legacy and per-thread default streams) and stay live until this region is dropped (a
    /// release event is recorded on it then). On the simulated device: a stream of
    /// [`SimDevice::consumer_stream`](super::SimDevice::consumer_stream) (or 0, 1, 2).
    pub unsafe fn wait_on(&self, stream: u64) -> Result<()> {
        let _g = self.pool.gpu.enter()?;
        // SAFETY: the caller vouches for the stream; the context is current.
        unsafe { self.pool.mem[self.index].ready.wait_raw(stream)? };
        // SAFETY: as promised by our caller.
        unsafe { self.release_after(stream) };
        Ok(())
    }

    /// Orders the region's reuse after the work enqueued on `stream` before the batch is
    /// dropped, without making the stream wait for the copy: for a consumer that orders
    /// itself (DLPack's `stream=-1`), whose work is assumed on the legacy default stream.
    ///
    /// # Safety
    /// As for [`DeviceRegion::wait_on`].
    pub unsafe fn release_after(&self, stream: u64) {
        let thread = (stream == 2).then(|| std::thread::current().id());
        let mut c = lock(&self.consumers);
        if !c.contains(&(stream, thread)) {
            c.push((stream, thread));
        }
    }

    /// The region's index in its pool.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The region's device memory.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn buf(&self) -> &DBuf {
        self.pool.buf(self.index)
    }

    /// Copies `dst.len()` bytes from `offset` of the region to the host, once the region's
    /// copy (or write) has completed; on the pool's own stream, waited for.
    pub(crate) fn read_range(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.used) {
            return Err(crate::error::invalid(format!(
                "{} bytes at {offset} lie past the {} bytes of a device region",
                dst.len(),
                self.used
            )));
        }
        let _g = self.pool.gpu.enter()?;
        let m = &self.pool.mem[self.index];
        self.pool.xfer.wait(&m.ready)?;
        self.pool
            .xfer
            .read(&m.buf, offset, dst, "a device → host read of a region")
    }

    /// Copies each of `ranges` of the region to the host in one go (the copies queued on the
    /// pool's stream after the region's ready event, then one wait).
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn read_ranges(&self, ranges: &[std::ops::Range<usize>]) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<u8>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            if r.start > r.end || r.end > self.used {
                return Err(crate::error::invalid(format!(
                    "bytes {}..{} lie past the {} bytes of a device region",
                    r.start, r.end, self.used
                )));
            }
            out.push(vec![0; r.len()]);
        }
        let _g = self.pool.gpu.enter()?;
        let m = &self.pool.mem[self.index];
        let s = &self.pool.xfer;
        s.wait(&m.ready)?;
        for (r, v) in ranges.iter().zip(&mut out) {
            // SAFETY: each vector is sized to its range, which lies in the region (checked),
            // and stays untouched until the stream is synchronised below.
            let queued = unsafe {
                s.copy_dtoh(
                    &m.buf,
                    r.start,
                    v.as_mut_ptr(),
                    r.len(),
                    "a gathered read of samples",
                )
            };
            if let Err(e) = queued {
                return Err(Self::settled(s, out).err().unwrap_or(e));
            }
        }
        Self::settled(s, out)
    }

    /// `out` once the copies queued into it on `s` have completed; if that cannot be known (the
    /// wait failed), the vectors are leaked rather than freed under a copy that may still
    /// write them.
    fn settled(s: &DStream, out: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        match s.synchronize() {
            Ok(()) => Ok(out),
            Err(e) => {
                std::mem::forget(out);
                Err(e)
            }
        }
    }

    /// Whether the region is in the simulated device's memory.
    pub fn is_simulated(&self) -> bool {
        self.pool.is_simulated()
    }

    /// Copies the region's bytes to the host (synchronously; for checks and tests).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.used];
        self.read_range(0, &mut v)?;
        Ok(v)
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        let m = &self.pool.mem[self.index];
        let consumers = std::mem::take(&mut *lock(&self.consumers));
        if !consumers.is_empty() {
            // Work each consumer enqueued on its stream before dropping the batch must finish
            // before the region is overwritten: the next write waits for these events.
            let here = std::thread::current().id();
            let recorded = self.pool.gpu.enter().and_then(|_g| {
                let mut rel = lock(&m.released);
                // Appended after releases no write has waited for yet (a batch dropped unread).
                for &(stream, thread) in &consumers {
                    if thread.is_some_and(|t| t != here) {
                        // Another thread's per-thread stream cannot be named from here.
                        return Err(crate::error::invalid(
                            "a per-thread stream of another thread",
                        ));
                    }
                    let k = rel.pending;
                    if rel.events.len() <= k {
                        let e = self.pool.gpu.event()?;
                        rel.events.push(e);
                    }
                    // SAFETY: `wait_on`'s caller promised the stream lives until this drop;
                    // the context is current.
                    unsafe { rel.events[k].record_raw(stream)? };
                    rel.pending = k + 1;
                }
                Ok(())
            });
            if recorded.is_err() {
                // Without the events, only a full wait is safe.
                let _ = self.pool.gpu.synchronize();
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

/// A copy in flight: its tag, region, length, and what the device keeps to check it when it
/// completes ([`Gpu::copy_started`]).
struct InFlight {
    tag: u64,
    region: usize,
    len: usize,
    check: CopyCheck,
}

/// Copies groups from slots into device regions.
pub struct CopyStage {
    pool: Arc<DevicePool>,
    stream: DStream,
    in_flight: Vec<InFlight>,
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

impl CopyStage {
    /// A stage over `pool` (a stream is created; on CUDA the context is bound to this thread,
    /// which is gpufeed's I/O thread).
    pub fn new(pool: &Arc<DevicePool>) -> Result<CopyStage> {
        if let Some(c) = pool.gpu.ctx() {
            c.bind()?;
        }
        Ok(CopyStage {
            pool: pool.clone(),
            stream: pool.gpu.stream()?,
            in_flight: Vec::new(),
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
        let held = lock(&self.pool.held)[r];
        // SAFETY: `src` is valid for `len` bytes per the caller's contract.
        let check = unsafe { self.pool.gpu.copy_started(held, src, len) };
        let m = &self.pool.mem[r];
        self.pool.before_write(r, &self.stream)?;
        // SAFETY: the caller keeps the source unchanged until the ready event is seen complete;
        // the region is ours (taken, not viewed) and `len` fits it.
        unsafe {
            self.stream
                .copy_htod(&m.buf, 0, src, len, "a group's host → device copy")?
        };
        if let Err(e) = m.ready.record(&self.stream) {
            // The copy is enqueued but no event marks its end: wait for the stream so the
            // caller may reuse the source; if even that fails, say the stage is broken so the
            // caller leaks the source instead.
            if self.stream.synchronize().is_err() {
                self.broken = true;
            }
            return Err(e);
        }
        self.in_flight.push(InFlight {
            tag,
            region: r,
            len,
            check,
        });
        self.pool.gpu.copies_in_flight(self.in_flight.len());
        Ok(())
    }

    /// Appends the tags of copies that completed, in any order. With `wait`, blocks until at
    /// least one completes (if any is in flight).
    pub fn poll(&mut self, done: &mut Vec<u64>, wait: bool) -> Result<()> {
        loop {
            let before = done.len();
            let mut i = 0;
            while i < self.in_flight.len() {
                if self.pool.mem[self.in_flight[i].region].ready.done()? {
                    let f = self.in_flight.swap_remove(i);
                    let m = &self.pool.mem[f.region];
                    self.pool.gpu.copy_completed(&m.buf, f.len, f.check)?;
                    done.push(f.tag);
                } else {
                    i += 1;
                }
            }
            if !wait || done.len() > before || self.in_flight.is_empty() {
                return Ok(());
            }
            // Copies take a few ms: the device says how to wait (no host sync of the stream).
            self.pool.gpu.poll_pause();
        }
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
            let _ = self.stream.synchronize();
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
