//! One seam for the device work of the copy and decode stages: device memory, streams, events,
//! copies both ways, memsets and kernel launches, each with two implementations — CUDA, and the
//! adversarial simulator ([`super::sim`]), where every operation is queued on its stream,
//! completes late and in any order the streams allow, and is checked against the memory other
//! pending operations touch. The pipelines are written once against this seam.

use std::sync::Arc;

use super::cuda::{self, Context, CtxGuard, DeviceBuffer, Event, Stream};
use super::kernels::{DeviceKernels, GfEmit, GfSample, GfSpan};
use super::sim::{Access, Res, SimGpu, SourceCrc};
use crate::error::Result;

/// A device: CUDA's primary context, or the simulated GPU.
#[derive(Debug, Clone)]
pub(crate) enum Gpu {
    Cuda(Arc<Context>),
    Sim(Arc<SimGpu>),
}

/// The context current on this thread while it lives (nothing on the simulator).
pub(crate) struct Entered(
    #[allow(
        dead_code,
        reason = "held for its drop: the context is current while it lives"
    )]
    Option<CtxGuard>,
);

impl Gpu {
    /// Makes the device current on this thread until the guard drops (then the thread's
    /// previous context is current again).
    pub(crate) fn enter(&self) -> Result<Entered> {
        match self {
            Gpu::Cuda(c) => Ok(Entered(Some(c.enter()?))),
            Gpu::Sim(_) => Ok(Entered(None)),
        }
    }

    pub(crate) fn ctx(&self) -> Option<&Arc<Context>> {
        match self {
            Gpu::Cuda(c) => Some(c),
            Gpu::Sim(_) => None,
        }
    }

    /// A new non-blocking stream.
    pub(crate) fn stream(&self) -> Result<DStream> {
        Ok(match self {
            Gpu::Cuda(c) => {
                let _g = c.enter()?;
                DStream::Cuda(Stream::new(c)?)
            }
            Gpu::Sim(s) => DStream::Sim(s.clone(), s.stream()),
        })
    }

    /// A new event.
    pub(crate) fn event(&self) -> Result<DEvent> {
        Ok(match self {
            Gpu::Cuda(c) => DEvent::Cuda(Event::new(c)?),
            Gpu::Sim(s) => DEvent::Sim(s.clone(), s.event()),
        })
    }

    /// `len` bytes of zeroed device memory.
    pub(crate) fn alloc(&self, len: usize) -> Result<DBuf> {
        Ok(match self {
            Gpu::Cuda(c) => DBuf::Cuda(DeviceBuffer::new(c, len)?),
            Gpu::Sim(s) => DBuf::Sim(s.clone(), s.alloc(len), len),
        })
    }

    /// Waits for everything queued on the device.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            Gpu::Cuda(c) => {
                let _g = c.enter()?;
                c.synchronize()
            }
            Gpu::Sim(s) => {
                s.sync_all();
                Ok(())
            }
        }
    }
}

/// What a device keeps of a copy's source when the copy starts, to check the copy when it
/// completes: nothing on CUDA; the source's crc32c on the simulator.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CopyCheck {
    None,
    Sim(SourceCrc),
}

impl Gpu {
    /// Whether this is the simulated device (its memory is host memory).
    pub(crate) fn is_simulated(&self) -> bool {
        matches!(self, Gpu::Sim(_))
    }

    /// A copy stage's copy of `len` bytes at `src` into a region starts (`held`: batches
    /// still view the region, which the copy stage must never let happen).
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    pub(crate) unsafe fn copy_started(&self, held: bool, src: *const u8, len: usize) -> CopyCheck {
        match self {
            Gpu::Cuda(_) => CopyCheck::None,
            // SAFETY: forwarded under the caller's guarantee.
            Gpu::Sim(g) => CopyCheck::Sim(unsafe { g.copy_started(held, src, len) }),
        }
    }

    /// `n` copies of a copy stage are in flight.
    pub(crate) fn copies_in_flight(&self, n: usize) {
        if let Gpu::Sim(g) = self {
            g.copies_in_flight(n);
        }
    }

    /// A copy stage's copy of `len` bytes into `dst` was seen complete.
    pub(crate) fn copy_completed(&self, dst: &DBuf, len: usize, check: CopyCheck) -> Result<()> {
        match (self, check) {
            (Gpu::Sim(g), CopyCheck::Sim(crc)) => g.copy_completed(dst.sim_id(), len, crc),
            _ => Ok(()),
        }
    }

    /// A copy stage's pause between polls of its copies: 50 µs on CUDA (copies take
    /// milliseconds; no host sync of the stream), none on the simulator (its clock moves by
    /// calls).
    pub(crate) fn poll_pause(&self) {
        if let Gpu::Cuda(_) = self {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

/// Device memory.
#[derive(Debug)]
pub(crate) enum DBuf {
    Cuda(DeviceBuffer),
    Sim(Arc<SimGpu>, u64, usize),
}

impl DBuf {
    /// The device address of its first byte.
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            DBuf::Cuda(b) => b.ptr(),
            DBuf::Sim(_, id, _) => SimGpu::addr(*id, 0),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            DBuf::Cuda(b) => b.len(),
            DBuf::Sim(_, _, n) => *n,
        }
    }

    /// The simulator's access to bytes `range` of this buffer.
    fn access(&self, range: std::ops::Range<usize>, write: bool) -> Access {
        let id = match self {
            DBuf::Sim(_, id, _) => *id,
            DBuf::Cuda(_) => 0,
        };
        Access {
            res: Res::Dev(id),
            range: range.start as u64..range.end as u64,
            write,
        }
    }

    fn sim_id(&self) -> u64 {
        match self {
            DBuf::Sim(_, id, _) => *id,
            DBuf::Cuda(_) => 0,
        }
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        match off.checked_add(len) {
            Some(e) if e <= self.len() => Ok(()),
            _ => Err(crate::error::invalid(format!(
                "{len} bytes at {off} lie past the end of a {}-byte device buffer",
                self.len()
            ))),
        }
    }
}

impl Drop for DBuf {
    fn drop(&mut self) {
        if let DBuf::Sim(s, id, _) = self {
            s.free(*id);
        }
    }
}

/// A stream.
#[derive(Debug)]
pub(crate) enum DStream {
    Cuda(Stream),
    Sim(Arc<SimGpu>, u64),
}

impl DStream {
    /// The raw handle (a `CUstream`, or the simulator's id).
    pub(crate) fn raw(&self) -> u64 {
        match self {
            DStream::Cuda(s) => s.raw(),
            DStream::Sim(_, id) => *id,
        }
    }

    /// Waits (on the host) for everything queued on the stream.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            DStream::Cuda(s) => s.synchronize(),
            DStream::Sim(g, id) => {
                g.sync_stream(*id);
                Ok(())
            }
        }
    }

    /// Makes this stream's later work wait for `event`.
    pub(crate) fn wait(&self, event: &DEvent) -> Result<()> {
        match (self, event) {
            (DStream::Cuda(s), DEvent::Cuda(e)) => s.wait(e),
            (DStream::Sim(g, id), DEvent::Sim(_, e)) => g.wait(*id, *e),
            _ => Err(crate::error::invalid(
                "a stream and an event of two devices",
            )),
        }
    }

    /// Starts copying `len` host bytes at `src` to byte `off` of `dst`.
    ///
    /// # Safety
    /// `src .. src + len` must stay valid and unchanged until work recorded on this stream
    /// after this call has completed; `dst` must stay allocated until then.
    pub(crate) unsafe fn copy_htod(
        &self,
        dst: &DBuf,
        off: usize,
        src: *const u8,
        len: usize,
        what: &str,
    ) -> Result<()> {
        dst.check(off, len)?;
        match self {
            // SAFETY: the range lies in `dst` (checked); the caller vouches for the source.
            DStream::Cuda(s) => unsafe {
                cuda::memcpy_htod_async(dst.ptr() + off as u64, src, len, s)
            },
            DStream::Sim(g, stream) => {
                let (id, addr) = (dst.sim_id(), src as usize);
                let access = vec![
                    Access::read(Res::Host, addr as u64..(addr + len) as u64),
                    dst.access(off..off + len, true),
                ];
                g.enqueue(*stream, what, access, move |m| {
                    // SAFETY: the caller keeps the source valid until this operation has run
                    // (a stream wait or an event on it says so).
                    let src = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                    if let Some(d) = m.get_mut(id).get_mut(off..off + len) {
                        d.copy_from_slice(src);
                    }
                })
            }
        }
    }

    /// Copies `src` to byte `off` of `dst` on this stream and waits for it.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn write(&self, dst: &DBuf, off: usize, src: &[u8], what: &str) -> Result<()> {
        // SAFETY: `src` is borrowed until the stream is synchronised below.
        unsafe { self.copy_htod(dst, off, src.as_ptr(), src.len(), what)? };
        self.synchronize()
    }

    /// Copies `dst.len()` bytes at `off` of `src` to the host on this stream and waits for it.
    pub(crate) fn read(&self, src: &DBuf, off: usize, dst: &mut [u8], what: &str) -> Result<()> {
        // SAFETY: `dst` is borrowed until the stream is synchronised below.
        unsafe { self.copy_dtoh(src, off, dst.as_mut_ptr(), dst.len(), what)? };
        self.synchronize()
    }

    /// Starts copying `len` bytes at `off` of `src` to the host at `dst`.
    ///
    /// # Safety
    /// `dst .. dst + len` must stay valid and untouched by the host, and `src` allocated,
    /// until work recorded on this stream after this call has completed.
    pub(crate) unsafe fn copy_dtoh(
        &self,
        src: &DBuf,
        off: usize,
        dst: *mut u8,
        len: usize,
        what: &str,
    ) -> Result<()> {
        src.check(off, len)?;
        match self {
            // SAFETY: the range lies in `src` (checked); the caller vouches for `dst`.
            DStream::Cuda(s) => unsafe {
                cuda::memcpy_dtoh_async(dst, src.ptr() + off as u64, len, s)
            },
            DStream::Sim(g, stream) => {
                let (id, addr) = (src.sim_id(), dst as usize);
                let access = vec![
                    src.access(off..off + len, false),
                    Access::write(Res::Host, addr as u64..(addr + len) as u64),
                ];
                g.enqueue(*stream, what, access, move |m| {
                    // SAFETY: the caller keeps `dst` valid until this operation has run.
                    let d = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
                    if let Some(s) = m.get_mut(id).get(off..off + len) {
                        d.copy_from_slice(s);
                    }
                })
            }
        }
    }

    /// Zeroes `len` bytes at `off` of `dst`.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn memset(&self, dst: &DBuf, off: usize, len: usize, what: &str) -> Result<()> {
        dst.check(off, len)?;
        match self {
            // SAFETY: the range lies in `dst` (checked), which its owner keeps allocated until
            // this stream's later work has completed.
            DStream::Cuda(s) => unsafe { cuda::memset_async(dst.ptr() + off as u64, len, s) },
            DStream::Sim(g, stream) => {
                let id = dst.sim_id();
                g.enqueue(
                    *stream,
                    what,
                    vec![dst.access(off..off + len, true)],
                    move |m| {
                        if let Some(d) = m.get_mut(id).get_mut(off..off + len) {
                            d.fill(0);
                        }
                    },
                )
            }
        }
    }
}

/// An event.
#[derive(Debug)]
pub(crate) enum DEvent {
    Cuda(Event),
    Sim(Arc<SimGpu>, u64),
}

impl DEvent {
    /// Records the event at the current end of `stream`.
    pub(crate) fn record(&self, stream: &DStream) -> Result<()> {
        // SAFETY: our own stream, live while borrowed.
        unsafe { self.record_raw(stream.raw()) }
    }

    /// Records the event at the current end of the raw stream `raw`.
    ///
    /// # Safety
    /// On CUDA, `raw` must be a live stream of the event's context (or 0, 1, 2).
    pub(crate) unsafe fn record_raw(&self, raw: u64) -> Result<()> {
        match self {
            // SAFETY: forwarded under the caller's guarantee.
            DEvent::Cuda(e) => unsafe { e.record_raw(raw) },
            DEvent::Sim(g, id) => g.record(*id, raw),
        }
    }

    /// Makes the raw stream `raw` wait for this event.
    ///
    /// # Safety
    /// As for [`DEvent::record_raw`].
    pub(crate) unsafe fn wait_raw(&self, raw: u64) -> Result<()> {
        match self {
            // SAFETY: forwarded under the caller's guarantee.
            DEvent::Cuda(e) => unsafe { Stream::wait_raw(raw, e) },
            DEvent::Sim(g, id) => g.wait(raw, *id),
        }
    }

    /// Whether the work before the last record has completed.
    pub(crate) fn done(&self) -> Result<bool> {
        match self {
            DEvent::Cuda(e) => e.done(),
            DEvent::Sim(g, id) => Ok(g.done(*id)),
        }
    }

    /// Waits (on the host) for the work before the last record.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            DEvent::Cuda(e) => e.synchronize(),
            DEvent::Sim(g, id) => {
                g.sync_event(*id);
                Ok(())
            }
        }
    }

    /// The raw handle (`CUevent`; `None` on the simulator).
    pub(crate) fn raw(&self) -> Option<u64> {
        match self {
            DEvent::Cuda(e) => Some(e.raw()),
            DEvent::Sim(..) => None,
        }
    }
}

/// gpufeed's kernels on a device: loaded on CUDA, the host build on the simulator.
#[derive(Debug)]
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
pub(crate) enum Kernels {
    Cuda(DeviceKernels),
    Sim,
}

#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
impl Kernels {
    /// The kernels of `gpu`, or why they cannot run there.
    pub(crate) fn load(gpu: &Gpu) -> Result<Kernels> {
        match gpu {
            Gpu::Cuda(c) => Ok(Kernels::Cuda(DeviceKernels::load(c)?)),
            Gpu::Sim(_) if super::host_kernels::available() => Ok(Kernels::Sim),
            Gpu::Sim(_) => Err(crate::error::Error::new(
                crate::error::ErrorKind::Unsupported,
                "the simulated device's kernels are not in this build (feature `sim` with a C++ \
                 compiler at build time)",
            )),
        }
    }

    /// crc32c over `n` spans (at `spans`) of the `data_len` bytes of `data`, one u32 each into
    /// `out`, through `lanes` ([`CRC_LANES`](super::kernels::CRC_LANES) u32s per span).
    ///
    /// # Safety
    /// The spans must lie inside `data_len <= data.len()` bytes (checked by the caller with
    /// `check_spans`), `spans` and `out` hold `n` entries and `lanes` `n × CRC_LANES`, and all
    /// stay allocated (and `data`, `spans` unchanged) until work recorded on `stream` later has
    /// completed.
    #[allow(
        clippy::too_many_arguments,
        reason = "the kernel's own parameters, one for one, as the launch passes them"
    )]
    pub(crate) unsafe fn crc32c(
        &self,
        stream: &DStream,
        data: &DBuf,
        data_len: usize,
        spans: &DBuf,
        n: u32,
        lanes: &DBuf,
        out: &DBuf,
    ) -> Result<()> {
        let lane_bytes = n as usize * 4 * super::kernels::CRC_LANES as usize;
        lanes.check(0, lane_bytes)?;
        match (self, stream) {
            // SAFETY: forwarded under the caller's guarantees.
            (Kernels::Cuda(k), DStream::Cuda(s)) => unsafe {
                k.crc32c(s, data.ptr(), spans.ptr(), n, lanes.ptr(), out.ptr())
            },
            (_, DStream::Sim(g, st)) => {
                let (d, sp, o) = (data.sim_id(), spans.sim_id(), out.sim_id());
                let nb = n as usize;
                let access = vec![
                    data.access(0..data_len, false),
                    spans.access(0..nb * 16, false),
                    lanes.access(0..lane_bytes, true),
                    out.access(0..nb * 4, true),
                ];
                let stats = g.stats.clone();
                g.enqueue(*st, "the crc32c kernel", access, move |m| {
                    let mut spans = vec![GfSpan::default(); nb];
                    bytemuck::cast_slice_mut::<GfSpan, u8>(&mut spans)
                        .copy_from_slice(&m.get_mut(sp)[..nb * 16]);
                    let data = m.take(d);
                    let got =
                        super::host_kernels::crc32c(&data[..data_len.min(data.len())], &spans);
                    m.put(d, data);
                    match got {
                        Ok(c) => m.get_mut(o)[..nb * 4].copy_from_slice(bytemuck::cast_slice(&c)),
                        Err(_) => note_fault(&stats, "the crc32c kernel read out of bounds"),
                    }
                })
            }
            _ => Err(crate::error::invalid("kernels of another device")),
        }
    }

    /// The resize kernel over `n` samples (at `samples`) whose images lie in the first
    /// `src_len` bytes of `src`, writing `out_len` bytes at byte `out_off` of `out`.
    ///
    /// # Safety
    /// The launch's bounds must have been checked (`check_resize`), and the buffers stay
    /// allocated (and `src`, `samples` unchanged) until work recorded on `stream` later has
    /// completed.
    #[allow(
        clippy::too_many_arguments,
        reason = "the kernel's own parameters, one for one, as the launch passes them"
    )]
    pub(crate) unsafe fn resize(
        &self,
        stream: &DStream,
        src: &DBuf,
        src_len: usize,
        samples: &DBuf,
        n: u32,
        emit: &GfEmit,
        out: &DBuf,
        out_off: usize,
        out_len: usize,
    ) -> Result<()> {
        out.check(out_off, out_len)?;
        match (self, stream) {
            // SAFETY: forwarded under the caller's guarantees.
            (Kernels::Cuda(k), DStream::Cuda(s)) => unsafe {
                k.resize(
                    s,
                    src.ptr(),
                    samples.ptr(),
                    n,
                    emit,
                    out.ptr() + out_off as u64,
                )
            },
            (_, DStream::Sim(g, st)) => {
                if g.fail_launch() {
                    return Err(crate::error::Error::new(
                        crate::error::ErrorKind::Io,
                        "cuLaunchKernel failed (the simulated device's injected fault)",
                    ));
                }
                let (s, sa, o) = (src.sim_id(), samples.sim_id(), out.sim_id());
                let nb = n as usize * std::mem::size_of::<GfSample>();
                let access = vec![
                    src.access(0..src_len, false),
                    samples.access(0..nb, false),
                    out.access(out_off..out_off + out_len, true),
                ];
                let emit = *emit;
                let stats = g.stats.clone();
                g.enqueue(*st, "the resize kernel", access, move |m| {
                    let mut samples = vec![GfSample::default(); n as usize];
                    bytemuck::cast_slice_mut::<GfSample, u8>(&mut samples)
                        .copy_from_slice(&m.get_mut(sa)[..nb]);
                    let src = m.take(s);
                    let mut dst = m.take(o);
                    let r = match (src.get(..src_len), dst.get_mut(out_off..out_off + out_len)) {
                        (Some(a), Some(b)) => super::host_kernels::resize(a, &samples, &emit, b),
                        _ => Err(crate::error::invalid("out of bounds")),
                    };
                    m.put(o, dst);
                    if s != o {
                        m.put(s, src);
                    }
                    if r.is_err() {
                        note_fault(&stats, "the resize kernel touched memory out of bounds");
                    }
                })
            }
            _ => Err(crate::error::invalid("kernels of another device")),
        }
    }
}

/// A simulated kernel's fault (what would be an illegal address on a GPU), counted as a hazard.
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "used only with feature decode: the device image stage"
    )
)]
fn note_fault(stats: &super::SimDeviceStats, what: &str) {
    use std::sync::atomic::Ordering;
    stats.hazards.fetch_add(1, Ordering::Relaxed);
    let mut log = crate::util::lock(&stats.hazard_log);
    if log.len() < 16 {
        log.push(what.to_string());
    }
}
