//! The device side of the decode stage: what the GPU pipeline (and the simulated device, which
//! runs the same kernels on the host) is given — the resize kernel's parameters built from an
//! [`ImageSpec`] and each sample's [`Geometry`]. `gpu/` owns the kernels, their `#[repr(C)]`
//! structs and the CUDA layers; this module owns what the image stage puts in them.

use super::{Geometry, ImageSpec, Layout, PixelType};
use crate::gpu::kernels::{GfEmit, GfSample};

impl GfSample {
    /// The kernel's parameters for a sample of geometry `g` whose decoded image (`w` × `h`,
    /// packed RGB) starts at byte `src` of the source buffer.
    pub fn new(g: &Geometry, src: u64, (w, h): (u32, u32)) -> GfSample {
        GfSample {
            src,
            src_w: w,
            src_h: h,
            src_pitch: w * 3,
            full_w: g.full.0,
            full_h: g.full.1,
            win_x: g.window_origin.0,
            win_y: g.window_origin.1,
            flip: u32::from(g.flip),
            r#box: [
                g.src[0] as f32,
                g.src[1] as f32,
                g.src[2] as f32,
                g.src[3] as f32,
            ],
            valid: 1,
            reserved: 0,
        }
    }
}

impl GfEmit {
    /// The output description of `spec`.
    pub fn new(spec: &ImageSpec) -> GfEmit {
        let k = |c: usize| 1.0 / (255.0 * spec.std[c]);
        let b = |c: usize| -spec.mean[c] / spec.std[c];
        GfEmit {
            out_w: spec.size.0,
            out_h: spec.size.1,
            dtype: match spec.dtype {
                PixelType::U8 => 0,
                PixelType::F16 => 1,
                PixelType::Bf16 => 2,
                PixelType::F32 => 3,
            },
            layout: match spec.layout {
                Layout::Nchw => 0,
                Layout::Nhwc => 1,
            },
            scale: [k(0), k(1), k(2)],
            bias: [b(0), b(1), b(2)],
        }
    }
}

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::cpu::ImageDecoder;
use super::phases::{cpu_phase, Phase, PhaseClock};
use super::pool::Job;
use crate::batch::Batch;
use crate::dataset::Dataset;
use crate::error::{Error, ErrorKind, Result};
use crate::gpu::dev::{CpuJpeg, DBuf, DEvent, DStream, Gpu, JpegEngine, JpegImage, Kernels};
use crate::gpu::kernels::{as_bytes, check_spans, GfSpan};
use crate::gpu::{DevicePool, DeviceRegion};
use crate::image::ImageInfo;
use crate::util::lock;
use crate::util::Unpoison;

/// Which decoder a sample goes to on the device path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// nvJPEG's batched decode on the GPU's JPEG engines (the simulated device: libjpeg-turbo
    /// standing in): a baseline JPEG in YCbCr or gray, subsampled 4:4:4, 4:2:2, 4:2:0 or 4:4:0.
    Hardware,
    /// The CPU stage decodes it and the pixels are copied in: progressive JPEGs, CMYK/YCCK,
    /// 4:1:1 and other unusual layouts, PNG, WebP.
    Cpu,
}

/// Where the device pipeline sends an image with header `info` (`None`: not readable, so the
/// CPU stage gets to say what is wrong).
pub fn route(info: Option<&ImageInfo>) -> Route {
    match info {
        Some(i) if crate::image::engines_layout(i) => Route::Hardware,
        _ => Route::Cpu,
    }
}

/// Images by route (and those that failed), since the image loader was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteCounts {
    /// Decoded by the hardware JPEG decoder (its stand-in on the simulated device).
    pub hardware: u64,
    /// Decoded by the CPU stage and copied in.
    pub cpu: u64,
    /// Not decoded: read, checksum or decode errors (zero-filled).
    pub failed: u64,
    /// Samples whose crc32c the device checked.
    pub crc_checked: u64,
    /// Batches decoded as a pipeline: the engines given their images before any CPU-route
    /// image was decoded, the resize queued without a wait. The others (images too large for
    /// one staging buffer, a CPU-route file whose record has no size, a batch of an epoch
    /// being dropped) went sample by sample.
    pub pipelined: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    hardware: AtomicU64,
    cpu: AtomicU64,
    failed: AtomicU64,
    crc_checked: AtomicU64,
    pipelined: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RouteCounts {
        RouteCounts {
            hardware: self.hardware.load(Ordering::Relaxed),
            cpu: self.cpu.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            crc_checked: self.crc_checked.load(Ordering::Relaxed),
            pipelined: self.pipelined.load(Ordering::Relaxed),
        }
    }
}

/// The device side of an image stage, on CUDA or the simulated device alike: the kernels, per
/// output region the device scratch and stream of the job writing it, and the JPEG engine.
struct Side {
    gpu: Gpu,
    kernels: Kernels,
    scratch: Vec<Mutex<Scratch>>,
    /// The batched JPEG decoders on the engines (nvJPEG reading bitstreams in device memory,
    /// or the simulated device's stand-in), each with its own state, so that a batch is given
    /// to the engines while they still decode the previous one; empty: no engines, no nvJPEG,
    /// or turned off.
    jpeg: Vec<Mutex<Jpeg>>,
    /// The decoder the next batch tries first.
    next_jpeg: AtomicUsize,
}

/// Decoder states by default ([`JPEG_STATES_VAR`] sets another count, for A/B runs): the
/// engines decode batch k with one while the host initialises the next with another.
pub(crate) const JPEG_STATES: usize = 2;

/// The environment variable that sets the decoder states (1..=8).
pub(crate) const JPEG_STATES_VAR: &str = "GPUFEED_JPEG_STATES";

/// The JPEG engine and the event after the last batch it was given: the decoder state is
/// re-initialised by each batch on the host, which must wait for the previous batch's decode
/// first (nvJPEG requires it; nvImageCodec waits the same way).
struct Jpeg {
    engine: JpegEngine,
    done: DEvent,
}

/// The most bytes of decoded images one output tensor's staging holds: larger batches are
/// decoded and resized in chunks (12 MP photos at batch 256 would need 9 GB at once).
pub(crate) const STAGING_MAX: usize = 256 << 20;

/// Bytes of a hardware-route sample read to the host for its frame header.
pub(crate) const HEADER_BYTES: usize = 16 << 10;

/// Bytes read to the host from the end of a hardware-route sample longer than
/// [`HEADER_BYTES`], to see that its data ends with the image ([`ends_complete`]).
pub(crate) const TAIL_BYTES: usize = 64;

/// A device batch's bytes on the host ([`DeviceStage::host_bytes`]).
pub(crate) struct HostBytes {
    /// Per sample: all of a CPU-route sample, the first [`HEADER_BYTES`] of a hardware-route
    /// one (`None`: failed already).
    pub(crate) head: Vec<Option<Result<Vec<u8>>>>,
    /// Per sample: the last [`TAIL_BYTES`] of a hardware-route sample that `head` does not
    /// hold whole (empty otherwise).
    pub(crate) tail: Vec<Vec<u8>>,
}

/// Whether a JPEG's data, whose last bytes are `end`, ends with its image: an EOI marker
/// (`FF D9`), after which only zero padding may follow. The JPEG engines decode a truncated
/// bitstream without an error (seen with nvJPEG's hardware backend on an H200: the image came
/// back whole-sized, its missing rows made up), where the CPU stage, like Pillow, refuses it;
/// so an image whose end is not plainly there takes the CPU route, which decides. Entropy-coded
/// data cannot hold `FF D9` (a data `FF` is stuffed `FF 00`), so a truncated baseline JPEG does
/// not end so, and an image with other trailing data (an appended video, a vendor trailer)
/// merely decodes on the CPU.
pub(crate) fn ends_complete(end: &[u8]) -> bool {
    let n = end.iter().rposition(|&b| b != 0).map_or(0, |k| k + 1);
    end[..n].ends_with(&[0xFF, 0xD9])
}

/// Staging offsets are aligned to this (the engines' and the kernels' loads).
pub(crate) const STAGING_ALIGN: usize = 256;

/// An image of a device batch that the hardware decoder writes: its sample, where it goes in
/// the staging buffer, its size (from its bitstream's frame header).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HardwareImage {
    pub(crate) sample: usize,
    pub(crate) staging: usize,
    pub(crate) size: (u32, u32),
}

impl Drop for Side {
    fn drop(&mut self) {
        // The scratch (staging, resize parameters) and the decoder's state are freed with this
        // side: the last batches' decodes and resize launches may still read or write them on
        // the stage's stream.
        let _g = self.gpu.enter();
        for sc in &self.scratch {
            if lock(sc).stream.synchronize().is_err() {
                let _ = self.gpu.synchronize();
            }
        }
        // nvJPEG's state and handle go while the context is current (they free device memory
        // through the runtime); the rest pushes its own context when it drops.
        self.jpeg.clear();
    }
}

/// A job's device scratch, kept with its output region (one job writes a region at a time):
/// its stream (non-blocking: not the legacy stream a trainer queues on, and not shared with
/// the jobs of other regions), the crc spans and results, the resize parameters, and the
/// decoded images (grown to the largest chunk seen, at most [`STAGING_MAX`], then reused).
struct Scratch {
    stream: DStream,
    spans: DBuf,
    /// The crc32c lanes of each sample between the kernel's two launches.
    lanes: DBuf,
    crcs: DBuf,
    samples: DBuf,
    staging: Option<DBuf>,
    /// Host memory that copies queued on `stream` read (the resize parameters, CPU-decoded
    /// pixels): kept until the host has waited for the stream ([`Scratch::settled`]).
    keep: Vec<Vec<u8>>,
}

impl Scratch {
    /// Everything queued on the stream has completed (the host waited for it): the memory
    /// its copies read may go.
    fn settled(&mut self) -> Result<()> {
        self.stream.synchronize()?;
        self.keep.clear();
        Ok(())
    }

    /// Queues a copy of `bytes` to byte `off` of `dst` on the stream, without waiting: the
    /// bytes are kept until the host has waited for the stream.
    fn upload(&mut self, dst: Dst, off: usize, bytes: Vec<u8>, what: &str) -> Result<()> {
        let buf = match dst {
            Dst::Staging => self
                .staging
                .as_ref()
                .ok_or_else(|| crate::error::invalid("an upload before its chunk was staged"))?,
            Dst::Samples => &self.samples,
        };
        // SAFETY: the source is a heap buffer moved into `keep` below (moving a Vec does not
        // move its bytes), which is cleared only in `settled`, after the host waited for the
        // stream. `dst` is the scratch's own, freed only after its stream is synchronised
        // (`Side`'s drop; a staging buffer is replaced only after `settled`). The handle
        // checks that the range lies in `dst`.
        unsafe {
            self.stream
                .copy_htod(buf, off, bytes.as_ptr(), bytes.len(), what)?
        };
        self.keep.push(bytes);
        Ok(())
    }
}

/// Which of a scratch's buffers an upload writes.
#[derive(Debug, Clone, Copy)]
enum Dst {
    Staging,
    Samples,
}

/// What a device image loader shares across its epochs: the output tensors (device regions
/// of a pool made with it, with their ready and release events), the counts by route, the
/// kernels, a stream and the scratch.
pub(crate) struct DeviceStage {
    pub(crate) outputs: Arc<DevicePool>,
    pub(crate) counters: Counters,
    /// Where the time goes, phase by phase.
    pub(crate) clock: PhaseClock,
    /// The most bytes of decoded images one staging buffer holds ([`STAGING_MAX`]; less in
    /// tests, to take the chunked way).
    staging_max: AtomicUsize,
    pub(crate) emit: GfEmit,
    side: Side,
}

impl DeviceStage {
    /// The stage of an image loader on the device of `regions` (the loader's device regions:
    /// simulated or CUDA) whose batches hold up to `batch_size` samples of `spec`, with
    /// `tensors` output tensors.
    pub(crate) fn new(
        regions: &DevicePool,
        spec: &ImageSpec,
        batch_size: usize,
        tensors: usize,
    ) -> Result<DeviceStage> {
        let per = spec.sample_elems() * spec.dtype.size();
        let bytes = per.saturating_mul(batch_size);
        let gpu = regions.gpu.clone();
        let kernels = Kernels::load(&gpu)?;
        let _g = gpu.enter()?;
        let outputs = DevicePool::on(gpu.clone(), tensors, bytes)?;
        let scratch = (0..tensors)
            .map(|_| {
                Ok(Mutex::new(Scratch {
                    stream: gpu.stream()?,
                    spans: gpu.alloc(batch_size * std::mem::size_of::<GfSpan>())?,
                    lanes: gpu.alloc(batch_size * 4 * crate::gpu::kernels::CRC_LANES as usize)?,
                    crcs: gpu.alloc(batch_size * 4)?,
                    samples: gpu.alloc(batch_size * std::mem::size_of::<GfSample>())?,
                    staging: None,
                    keep: Vec::new(),
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let states = match std::env::var(JPEG_STATES_VAR) {
            Err(_) => JPEG_STATES,
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=8).contains(&n) => n,
                _ => {
                    crate::io::notice(&format!(
                        "{JPEG_STATES_VAR}={v:?} is not a number of JPEG decoder states from 1 \
                         to 8: {JPEG_STATES} are used"
                    ));
                    JPEG_STATES
                }
            },
        };
        let mut jpeg = Vec::new();
        while spec.hardware_decoder && jpeg.len() < states {
            // The CPU stage's whole-image decode: the simulated engine's stand-in for the
            // hardware (what nvJPEG writes, `NVJPEG_OUTPUT_RGBI`).
            let mut dec =
                ImageDecoder::new(spec).map_err(|e| Error::new(ErrorKind::Io, e.to_string()))?;
            let s = spec.clone();
            let cpu: CpuJpeg = Box::new(move |data: &[u8]| {
                let mut px = Vec::new();
                dec.decode_rgb(&s, data, &mut px).map(|size| (size, px))
            });
            match gpu.jpeg(cpu) {
                Ok(engine) => jpeg.push(Mutex::new(Jpeg {
                    engine,
                    done: gpu.event()?,
                })),
                Err(e) if jpeg.is_empty() => {
                    crate::io::notice(&format!(
                        "the hardware JPEG decoder is not used ({}): every image is decoded \
                         on the CPU and copied in",
                        e.report()
                    ));
                    break;
                }
                Err(_) => break, // fewer states: batches wait for each other more
            }
        }
        Ok(DeviceStage {
            outputs,
            counters: Counters::default(),
            clock: PhaseClock::default(),
            staging_max: AtomicUsize::new(STAGING_MAX),
            emit: GfEmit::new(spec),
            side: Side {
                gpu,
                kernels,
                scratch,
                jpeg,
                next_jpeg: AtomicUsize::new(0),
            },
        })
    }

    /// Whether the hardware route decodes on the device (nvJPEG, or the simulated device's
    /// stand-in for it).
    pub(crate) fn decodes_on_device(&self) -> bool {
        !self.side.jpeg.is_empty()
    }

    /// See [`DeviceStage::staging_max`](Self::staging_max).
    pub(crate) fn staging_max(&self) -> usize {
        self.staging_max.load(Ordering::Relaxed)
    }

    /// Sets the most bytes of decoded images one staging buffer holds (at least one image's
    /// always goes: a batch larger than this is decoded in chunks).
    pub(crate) fn set_staging_max(&self, bytes: usize) {
        self.staging_max.store(bytes, Ordering::Relaxed);
    }

    /// A decoder for the next batch: the first free one from the one after the last taken,
    /// or, when all are busy, that one as soon as it is free.
    fn take_jpeg(&self) -> Result<std::sync::MutexGuard<'_, Jpeg>> {
        let all = &self.side.jpeg;
        if all.is_empty() {
            return Err(crate::error::invalid(
                "hardware images without a hardware decoder",
            ));
        }
        let first = self.side.next_jpeg.fetch_add(1, Ordering::Relaxed) % all.len();
        for k in 0..all.len() {
            if let Ok(g) = all[(first + k) % all.len()].try_lock() {
                return Ok(g);
            }
        }
        Ok(lock(&all[first]))
    }

    /// The route sample `info` takes here: the hardware route only where the engines decode.
    pub(crate) fn route_of(&self, info: Option<&ImageInfo>) -> Route {
        match route(info) {
            Route::Hardware if self.decodes_on_device() => Route::Hardware,
            _ => Route::Cpu,
        }
    }

    /// Runs the crc32c kernel over the samples of `batch` (its group already in device
    /// memory; with the scratch of output region `out`) and returns, for each sample, the
    /// error of a checksum that does not match.
    /// Nothing where the epoch's checksums are not the device's (`verify`: [`Checker`]).
    ///
    /// [`Checker`]: crate::loader::Checker
    pub(crate) fn check_crcs(
        &self,
        batch: &Batch,
        ds: &Dataset,
        out: usize,
        verify: bool,
    ) -> Vec<Option<Error>> {
        let n = batch.len();
        let mut errs: Vec<Option<Error>> = (0..n).map(|_| None).collect();
        if !verify {
            return errs;
        }
        let Some(region) = batch.device_region() else {
            return errs;
        };
        let mut spans = Vec::new();
        let mut which = Vec::new();
        for i in 0..n {
            if let Ok(r) = batch.sample_range(i) {
                spans.push(GfSpan {
                    offset: r.start as u64,
                    len: r.len() as u32,
                    reserved: 0,
                });
                which.push(i);
            }
        }
        let crcs = self.crcs(region, &spans, out);
        let ids = batch.sample_ids();
        match crcs {
            Ok(c) => {
                self.counters
                    .crc_checked
                    .fetch_add(which.len() as u64, Ordering::Relaxed);
                for (k, i) in which.into_iter().enumerate() {
                    let id = ids[i] as usize;
                    if c[k] != ds.sample(id).crc32c {
                        errs[i] = Some(ds.sample_error(
                            id,
                            Error::new(
                                ErrorKind::InvalidInput,
                                format!(
                                    "checksum mismatch, found by the device's crc32c (key {:?})",
                                    ds.key(id)
                                ),
                            ),
                        ));
                    }
                }
            }
            Err(e) => {
                for i in which {
                    errs[i] = Some(e.clone());
                }
            }
        }
        errs
    }

    /// The crc32c kernel: the spans up, one launch on the scratch's stream (after the group's
    /// copy), the results down. That stream is waited for here, on the feeder thread: the
    /// batch's samples cannot be judged before.
    fn crcs(&self, region: &DeviceRegion, spans: &[GfSpan], out: usize) -> Result<Vec<u32>> {
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let c = &self.side;
        let n = spans.len();
        check_spans(region.len(), spans)?;
        let _g = c.gpu.enter()?;
        let sc = lock(&c.scratch[out]);
        // Nothing of a previous job still reads this scratch: its launches were waited for
        // (crc) or the region's ready event was (resize), before the region came back.
        sc.stream
            .write(&sc.spans, 0, as_bytes(spans), "the crc spans' upload")?;
        // SAFETY: the stage's stream lives as long as the stage, which the job holding the
        // batch (and so the region) keeps alive: the release event recorded on it at the
        // region's drop is valid.
        unsafe { region.wait_on(sc.stream.raw())? };
        // SAFETY: every span lies inside the group's region (checked above); the scratch's
        // `spans` and `crcs` hold `batch_size >= n` entries; the stream is synchronised below
        // before any of them changes, and the region lives (its batch is held) until then.
        unsafe {
            c.kernels.crc32c(
                &sc.stream,
                region.buf(),
                region.len(),
                &sc.spans,
                n as u32,
                &sc.lanes,
                &sc.crcs,
            )?
        };
        let mut raw = vec![0u8; n * 4];
        sc.stream
            .read(&sc.crcs, 0, &mut raw, "the crc results' download")?;
        Ok(raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }

    /// The compressed bytes of sample `i` of `batch` (copied down from the device), or its
    /// error.
    pub(crate) fn sample_bytes(batch: &Batch, i: usize, into: &mut Vec<u8>) -> Result<()> {
        let r = batch.sample_range(i).map_err(|e| e.clone())?;
        let region = batch
            .device_region()
            .ok_or_else(|| crate::error::invalid("a host batch in the device image stage"))?;
        into.clear();
        into.resize(r.len(), 0);
        region.read_range(r.start, into)
    }

    /// What the decode threads need of each sample on the host, read in one gathered copy:
    /// the whole bytes of a sample the CPU decodes; of one the engines decode, its first
    /// [`HEADER_BYTES`] (its frame header, which sizes its output: the record only routes it)
    /// and, where it is longer, its last [`TAIL_BYTES`] (whether its data ends with the image:
    /// see [`ends_complete`]). `None` for a sample that failed already (`skip`).
    pub(crate) fn host_bytes(
        &self,
        batch: &Batch,
        records: Option<&[ImageInfo]>,
        skip: &[Option<Error>],
    ) -> HostBytes {
        let ids = batch.sample_ids();
        let mut out = HostBytes {
            head: (0..batch.len()).map(|_| None).collect(),
            tail: vec![Vec::new(); batch.len()],
        };
        // (sample, whether the range is its tail)
        let (mut ranges, mut which) = (Vec::new(), Vec::new());
        for i in 0..batch.len() {
            let Ok(r) = batch.sample_range(i) else {
                continue;
            };
            if skip[i].is_some() {
                continue;
            }
            let info = records.and_then(|v| v.get(ids[i] as usize));
            let len = match self.route_of(info) {
                Route::Hardware => r.len().min(HEADER_BYTES),
                Route::Cpu => r.len(),
            };
            ranges.push(r.start..r.start + len);
            which.push((i, false));
            if len < r.len() {
                ranges.push(r.end - TAIL_BYTES.min(r.len() - len)..r.end);
                which.push((i, true));
            }
        }
        if ranges.is_empty() {
            return out;
        }
        let Some(region) = batch.device_region() else {
            return out;
        };
        match region.read_ranges(&ranges) {
            Ok(v) => {
                for ((i, tail), b) in which.into_iter().zip(v) {
                    if tail {
                        out.tail[i] = b;
                    } else {
                        out.head[i] = Some(Ok(b));
                    }
                }
            }
            Err(e) => {
                for (i, _) in which {
                    out.head[i] = Some(Err(e.clone()));
                }
            }
        }
        out
    }

    /// Makes room for a chunk of `staging_len` bytes of decoded images in output region
    /// `out`'s scratch and uploads `cpu`, the CPU-decoded images packed at its start (the
    /// engines write the rest: it is not uploaded). Waits first for the region's previous
    /// write, whose launch read this scratch.
    pub(crate) fn stage_chunk(&self, out: usize, staging_len: usize, cpu: &[u8]) -> Result<()> {
        let c = &self.side;
        let _g = c.gpu.enter()?;
        self.outputs.wait_written(out)?;
        let mut sc = lock(&c.scratch[out]);
        // This stream's earlier work (the previous chunk's launch) read the staging, and its
        // copies the kept host memory.
        sc.settled()?;
        let need = staging_len.max(cpu.len()).max(1);
        if sc.staging.as_ref().is_none_or(|b| b.len() < need) {
            sc.staging = None; // its last reader completed (waited for above)
            sc.staging = Some(c.gpu.alloc(need.next_multiple_of(1 << 20))?);
        }
        let Scratch {
            stream, staging, ..
        } = &*sc;
        let staging = staging.as_ref().expect("allocated above");
        if !cpu.is_empty() {
            stream.write(staging, 0, cpu, "the CPU-decoded images' upload")?;
        }
        Ok(())
    }

    /// Uploads one image's pixels to `offset` of region `out`'s staging (an image the engine
    /// rejected, decoded on the CPU instead).
    /// Queued on the region's stream, not waited for: the pixels are kept until the host waits
    /// for that stream.
    pub(crate) fn stage_image(&self, out: usize, offset: usize, px: Vec<u8>) -> Result<()> {
        let c = &self.side;
        let _g = c.gpu.enter()?;
        lock(&c.scratch[out]).upload(Dst::Staging, offset, px, "a CPU-decoded image's upload")
    }

    /// The engines' batched decode of `hw` into region `out`'s staging, from `batch`'s group
    /// in device memory. A batch the engine fails is waited for, then each of its images is
    /// tried alone: returns those the engine rejects alone (index into `hw`, reason), for the
    /// CPU to decode.
    pub(crate) fn decode_on_engine(
        &self,
        out: usize,
        batch: &Batch,
        hw: &[HardwareImage],
    ) -> Result<Vec<(usize, String)>> {
        if hw.is_empty() {
            return Ok(Vec::new());
        }
        let c = &self.side;
        let region = batch
            .device_region()
            .ok_or_else(|| crate::error::invalid("a host batch in the device image stage"))?;
        let _g = c.gpu.enter()?;
        let sc = lock(&c.scratch[out]);
        let staging = sc
            .staging
            .as_ref()
            .ok_or_else(|| crate::error::invalid("a decode before its chunk was staged"))?;
        let mut bits = Vec::with_capacity(hw.len());
        for h in hw {
            let r = batch.sample_range(h.sample).map_err(|e| e.clone())?;
            let bytes = h.size.0 as usize * h.size.1 as usize * 3;
            if r.end > region.len() || h.staging + bytes > staging.len() {
                return Err(crate::error::invalid(
                    "hardware decode: a bitstream or an image outside its buffer",
                ));
            }
            bits.push(r);
        }
        // SAFETY: the scratch's stream lives as long as the stage, which the job holding the
        // batch (and so the region) keeps alive: the release event recorded on it at the
        // region's drop is valid.
        unsafe { region.wait_on(sc.stream.raw())? };
        let mut jpeg = self.take_jpeg()?;
        if jpeg
            .decode(region, &bits, hw, staging, &sc.stream, &self.clock)
            .is_ok()
        {
            return Ok(Vec::new());
        }
        // What the failed batch queued is finished before anything rewrites its outputs or
        // the state is initialised again; then each image alone, whatever the status (an image
        // the engines cannot take may say so with another status than a bad bitstream's).
        jpeg.done.synchronize()?;
        let mut rejected = Vec::new();
        for (k, (r, h)) in bits.iter().zip(hw).enumerate() {
            if let Err(e) = jpeg.decode(
                region,
                std::slice::from_ref(r),
                std::slice::from_ref(h),
                staging,
                &sc.stream,
                &self.clock,
            ) {
                jpeg.done.synchronize()?;
                rejected.push((k, e.report()));
            }
        }
        Ok(rejected)
    }

    /// The resize kernel over a chunk: `samples` (their images in region `out`'s staging, whose
    /// first `staging_len` bytes the chunk uses) writing `len` bytes at byte `out_off` of the
    /// output region. The first chunk's launch is ordered after the region's last consumer
    /// (its release events); the region's ready event is recorded after each.
    pub(crate) fn launch(
        &self,
        out: usize,
        out_off: usize,
        len: usize,
        staging_len: usize,
        samples: &[GfSample],
    ) -> Result<()> {
        let c = &self.side;
        // The same bounds the host launch checks, before the device trusts them.
        crate::gpu::kernels::check_resize(staging_len, samples, &self.emit, len)?;
        if out_off
            .checked_add(len)
            .is_none_or(|e| e > self.outputs.region_bytes())
        {
            return Err(crate::error::invalid(
                "resize launch: output larger than its region",
            ));
        }
        let _g = c.gpu.enter()?;
        let mut sc = lock(&c.scratch[out]);
        if sc.staging.as_ref().is_none_or(|s| s.len() < staging_len) {
            return Err(crate::error::invalid(
                "resize launch: staging smaller than its chunk",
            ));
        }
        // Queued, not waited for: the host goes on while the engines and kernels work.
        sc.upload(
            Dst::Samples,
            0,
            as_bytes(samples).to_vec(),
            "the resize parameters' upload",
        )?;
        let sc = &*sc;
        let staging = sc.staging.as_ref().expect("checked above");
        self.outputs.before_write(out, &sc.stream)?;
        // SAFETY: every valid sample's image lies inside the staging's first `staging_len`
        // bytes (checked above), the output range holds `len` bytes = the chunk's samples of
        // the emitted type (checked), the scratch stays with region `out` and is not changed
        // before this launch completes (the next chunk synchronises this stream first; the
        // next writer of `out` waits for its ready event, recorded next).
        unsafe {
            c.kernels.resize(
                &sc.stream,
                staging,
                staging_len,
                &sc.samples,
                samples.len() as u32,
                &self.emit,
                self.outputs.buf(out),
                out_off,
                len,
            )?
        };
        self.outputs.after_write(out, &sc.stream)
    }

    /// Zeroes the first `len` bytes of output region `out` (a batch whose launch failed hands
    /// out zeros, not what the region's previous batch left there), ordered like a launch.
    pub(crate) fn zero(&self, out: usize, len: usize) -> Result<()> {
        let c = &self.side;
        let _g = c.gpu.enter()?;
        let sc = lock(&c.scratch[out]);
        self.outputs.before_write(out, &sc.stream)?;
        let len = len.min(self.outputs.region_bytes());
        sc.stream.memset(
            self.outputs.buf(out),
            0,
            len,
            "a failed batch's tensor zeroed",
        )?;
        self.outputs.after_write(out, &sc.stream)
    }

    pub(crate) fn counted(&self, route: Option<Route>) {
        let c = match route {
            Some(Route::Hardware) => &self.counters.hardware,
            Some(Route::Cpu) => &self.counters.cpu,
            None => &self.counters.failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

impl Jpeg {
    /// One batched decode on `stream`, after the previous batch's (the state is re-initialised
    /// on the host); the done event marks what it queued, failed or not.
    fn decode(
        &mut self,
        region: &DeviceRegion,
        bits: &[std::ops::Range<usize>],
        hw: &[HardwareImage],
        staging: &DBuf,
        stream: &DStream,
        clock: &PhaseClock,
    ) -> Result<()> {
        clock.time(Phase::EngineWait, || self.done.synchronize())?;
        let images: Vec<JpegImage> = bits
            .iter()
            .zip(hw)
            .map(|(r, h)| JpegImage {
                bits: r.clone(),
                out: h.staging,
                size: h.size,
            })
            .collect();
        // SAFETY: the previous batch given this decoder state has completed (its done event,
        // above). Each bitstream lies inside the group's device region (checked by the caller
        // and the engine), which stays allocated and unchanged until the stream passes the
        // release event recorded when the batch goes (after this work); each output lies
        // inside the staging buffer (checked) at the pitch of its width, sized from the
        // bitstream's own frame header, in a slot no other image has (the batch's layout: the
        // CPU route's uploads go to their own slots); the staging's earlier readers were
        // waited for on the host before this call (`stage_chunk`), and the buffer is not
        // rewritten or freed before the host has waited for this stream again (the next
        // chunk or batch on it, or the stage's drop).
        let r = clock.time(Phase::EngineCall, || unsafe {
            self.engine.decode(region.buf(), &images, staging, stream)
        });
        self.done.record(stream)?;
        r
    }
}

/// A device sample's image: decoded whole on the CPU (width, height, packed 8-bit RGB), or
/// left to the hardware decoder (its size from the image record).
pub(super) enum Decoded {
    Pixels(u32, u32, Vec<u8>),
    Hardware(u32, u32),
    /// Decoded on the CPU and uploaded to its staging slot (a pipelined batch): the resize
    /// kernel's parameters for what was uploaded.
    Staged(GfSample),
}

/// A device batch's tensor and what its samples went through.
pub(super) struct DeviceOut {
    /// The output tensor: a region of the stage's pool, with its ready event.
    pub(super) tensor: DeviceRegion,
    pub(super) stage: Arc<DeviceStage>,
    /// Each sample's checksum error, from the device's crc32c over the group.
    pub(super) crc: Vec<Option<Error>>,
    /// Each sample's bytes on the host, read in one gathered copy when the job was made: all
    /// of a CPU-route sample, the header of a hardware-route one (`None`: failed already).
    pub(super) host: Mutex<Vec<Option<Result<Vec<u8>>>>>,
    /// The last bytes of a hardware-route sample that `host` does not hold whole.
    pub(super) tails: Vec<Vec<u8>>,
    /// Each sample decoded whole: width, height, packed RGB (the decoder's output buffer).
    pub(super) decoded: Mutex<Vec<Option<Decoded>>>,
    /// What the first decode thread to take the job made of it ([`Job::lead`]).
    pub(super) lead: std::sync::OnceLock<Lead>,
}

/// How a device batch is decoded, decided by the first decode thread to take it.
pub(super) enum Lead {
    /// As a pipeline: the engines were given their images before any CPU-route image was
    /// decoded; each CPU-route image is uploaded as it is decoded, and the last sample's
    /// thread launches the resize without waiting for the engines.
    Pipelined(Plan),
    /// Sample by sample, then in chunks ([`Job::resize`]): a batch whose images do not fit
    /// one staging buffer, or holding a CPU-route file whose record has no size.
    Chunked,
    /// The batch could not be staged or given to the engines: every sample is lost.
    Failed(Error),
}

/// Where each image of a pipelined batch goes in the staging buffer.
pub(super) struct Plan {
    pub(super) slots: Vec<Slot>,
    /// Bytes of the staging buffer the batch uses.
    pub(super) staging_len: usize,
}

/// A sample of a pipelined batch.
pub(super) enum Slot {
    /// Lost already (read, checksum, header): its error.
    Failed(Error),
    /// The engines decode it into byte `at` of the staging (its size from its frame header).
    Engine { at: usize, size: (u32, u32) },
    /// A decode thread decodes it on the CPU (of a JPEG only the region under the crop,
    /// DCT-scaled where the spec allows) and uploads that to byte `at`, where `size` (the
    /// image's, from its record or its frame header: another size is an error) leaves room
    /// for the whole image. `whole`: its host bytes are its whole data (otherwise they are
    /// read from the device).
    Cpu {
        at: usize,
        size: (u32, u32),
        whole: bool,
    },
}

/// The reason of an image that decodes to another size than its record says (the device
/// path sizes its buffers from the records).
fn record_mismatch((w, h): (u32, u32), (rw, rh): (u32, u32)) -> String {
    format!("it decodes as {w}x{h} but its image record says {rw}x{rh}")
}

impl Job {
    /// Device path: sample `i` decoded whole into the job's decoded images, routed as the
    /// GPU routes it (the simulated device: the CPU stage stands in for nvJPEG). Its checksum
    /// was checked on the device when the job was made.
    pub(super) fn decode_whole(
        &self,
        i: usize,
        dec: &mut Result<ImageDecoder, String>,
        d: &DeviceOut,
    ) -> Option<Error> {
        let id = self.batch.sample_ids()[i];
        if let Some(e) = &d.crc[i] {
            d.stage.counted(None);
            return Some(e.clone());
        }
        let whole_len = match self.batch.sample_range(i) {
            Ok(r) => r.len(),
            Err(e) => {
                // Already an error (read, frame): zero-filled, the error stays.
                d.stage.counted(None);
                return Some(e.clone());
            }
        };
        // Routed by the image's record (format v2 shards carry them; other formats had their
        // headers read once when the image loader was made), as the GPU routes without
        // reading the bytes on the host.
        let info = self
            .dataset
            .image_info()
            .ok()
            .and_then(|v| v.get(id as usize).copied());
        let way = d.stage.route_of(info.as_ref());
        // Taken, not copied: sample `i` is this thread's alone.
        let mut data = match d.host.lock().unpoisoned()[i].take() {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                d.stage.counted(None);
                return Some(e);
            }
            None => Vec::new(),
        };
        if way == Route::Hardware {
            // The engines decode it with the batch, straight from device memory, into a slot
            // sized from its own frame header (read from the bytes gathered to the host): a
            // record that understates the image cannot make the engine write past its slot.
            // Its end, to see that the image is all there (the engines would make up what a
            // truncated one lacks, without an error).
            let end = if data.len() == whole_len {
                &data[..]
            } else {
                &d.tails[i][..]
            };
            let probed = d.stage.clock.time(Phase::Probe, || {
                crate::image::info(&data).filter(|_| {
                    crate::image::engines_decode(&data) && super::device::ends_complete(end)
                })
            });
            match probed {
                Some(h) => {
                    let r = info.expect("the hardware route needs a record");
                    if (h.width, h.height) != (r.width, r.height) {
                        d.stage.counted(None);
                        return Some(self.decode_error(
                            id,
                            record_mismatch((h.width, h.height), (r.width, r.height)),
                        ));
                    }
                    if let Err(reason) =
                        super::spec::check_pixels(h.width, h.height, self.spec.pixels_max)
                    {
                        d.stage.counted(None);
                        return Some(self.decode_error(id, reason));
                    }
                    d.decoded.lock().unpoisoned()[i] = Some(Decoded::Hardware(h.width, h.height));
                    return None;
                }
                // Its header is not where the engines could take it (beyond the bytes read,
                // or another kind than its record says), or its data does not end with the
                // image: the CPU route, on its whole bytes.
                _ => data.clear(),
            }
        }
        if data.is_empty() {
            if let Err(e) = DeviceStage::sample_bytes(&self.batch, i, &mut data) {
                d.stage.counted(None);
                return Some(e);
            }
        }
        let way = Route::Cpu;
        let dec = match dec {
            Ok(d) => d,
            Err(e) => {
                d.stage.counted(None);
                return Some(self.decode_error(id, e.clone()));
            }
        };
        let mut px = Vec::new();
        let got = d.stage.clock.time(cpu_phase(info.as_ref()), || {
            dec.decode_rgb(&self.spec, &data, &mut px)
        });
        match got {
            Ok((w, h))
                if info.is_some_and(|r| {
                    r.width > 0 && r.height > 0 && (r.width, r.height) != (w, h)
                }) =>
            {
                // The output buffers are sized from the records: one that lies is an error.
                let r = info.expect("checked");
                d.stage.counted(None);
                Some(self.decode_error(id, record_mismatch((w, h), (r.width, r.height))))
            }
            Ok((w, h)) => {
                d.stage.counted(Some(way));
                d.decoded.lock().unpoisoned()[i] = Some(Decoded::Pixels(w, h, px));
                None
            }
            Err(reason) => {
                d.stage.counted(None);
                Some(self.decode_error(id, reason))
            }
        }
    }

    /// Device path, once every sample is decoded: the batch in chunks whose decoded images
    /// fit the staging budget — per chunk, the CPU-decoded images packed and uploaded, the
    /// engines' batched decode of the rest into their slots (an image the engine rejects is
    /// decoded on the CPU instead), then one resize launch writing the chunk's part of the
    /// output tensor (a failed sample's `valid` is 0: zeros). Returns the samples lost on the
    /// way with their errors; on an error the whole tensor is zeroed.
    pub(super) fn resize(
        &self,
        d: &DeviceOut,
        dec: &mut Result<ImageDecoder, String>,
    ) -> Result<Vec<(usize, Error)>> {
        let decoded = std::mem::take(&mut *d.decoded.lock().unpoisoned());
        if self.cancelled.load(Ordering::Relaxed) {
            return Ok(Vec::new()); // nobody will see this batch
        }
        let (r, len) = (d.tensor.index(), d.tensor.len());
        let got = match d.lead.get() {
            Some(Lead::Pipelined(plan)) => self.finish_planned(d, plan, &decoded, r, len),
            Some(Lead::Failed(e)) => Err(e.clone()),
            Some(Lead::Chunked) | None => self.resize_chunks(d, dec, decoded, r, len),
        };
        if got.is_err() {
            // Every sample is lost: the tensor says so with zeros, not an older batch's pixels.
            let _ = d.stage.zero(r, len);
        }
        got
    }

    /// Device path, once per batch by the first decode thread to take it: each image's route
    /// and the room its decoded pixels need (an engine image's from its frame header, in the
    /// bytes gathered to the host; a CPU-route image's from its record, an upper bound of the
    /// region it decodes), the staging laid out for the batch, and the engines given their
    /// images — before any CPU-route image is decoded, so those never hold the engines back.
    /// A batch whose images do not fit one staging buffer, or holding a CPU-route file whose
    /// record has no size, goes sample by sample instead ([`Lead::Chunked`]).
    pub(super) fn lead(&self, d: &DeviceOut) -> Lead {
        use super::device::STAGING_ALIGN;
        if self.cancelled.load(Ordering::Relaxed) {
            return Lead::Chunked; // nobody will see this batch: nothing is given the engines
        }
        let ids = self.batch.sample_ids();
        let records = self.dataset.image_info().ok();
        let mut slots = Vec::with_capacity(ids.len());
        {
            let host = d.host.lock().unpoisoned();
            for (i, &id) in ids.iter().enumerate() {
                match self.slot_of(d, i, id, records, &host) {
                    Some(s) => slots.push(s),
                    None => return Lead::Chunked,
                }
            }
        }
        // The CPU route's images first, then the engines': each at an aligned offset.
        let bytes = |(w, h): (u32, u32)| w as usize * h as usize * 3;
        let mut at = 0usize;
        for engine in [false, true] {
            for s in &mut slots {
                match s {
                    Slot::Cpu { at: a, size, .. } if !engine => {
                        *a = at;
                        at = (at + bytes(*size)).next_multiple_of(STAGING_ALIGN);
                    }
                    Slot::Engine { at: a, size } if engine => {
                        *a = at;
                        at = (at + bytes(*size)).next_multiple_of(STAGING_ALIGN);
                    }
                    _ => {}
                }
                if at > d.stage.staging_max() {
                    return Lead::Chunked;
                }
            }
        }
        let r = d.tensor.index();
        if let Err(e) = d
            .stage
            .clock
            .time(Phase::Staging, || d.stage.stage_chunk(r, at, &[]))
        {
            return Lead::Failed(e);
        }
        let hw: Vec<HardwareImage> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match *s {
                Slot::Engine { at, size } => Some(HardwareImage {
                    sample: i,
                    staging: at,
                    size,
                }),
                _ => None,
            })
            .collect();
        match d.stage.decode_on_engine(r, &self.batch, &hw) {
            // An image the engines reject alone is decoded on the CPU into its slot.
            Ok(rejected) => {
                for (k, _) in rejected {
                    let h = hw[k];
                    slots[h.sample] = Slot::Cpu {
                        at: h.staging,
                        size: h.size,
                        whole: false,
                    };
                }
            }
            Err(e) => return Lead::Failed(e),
        }
        d.stage.counters.pipelined.fetch_add(1, Ordering::Relaxed);
        Lead::Pipelined(Plan {
            slots,
            staging_len: at,
        })
    }

    /// Sample `i`'s (id `id`) route and the size of the image it decodes (its offset comes
    /// later); `None` where the batch cannot be pipelined (a CPU-route image whose record has
    /// no size, or one past the pixel limit: the chunked way says why).
    fn slot_of(
        &self,
        d: &DeviceOut,
        i: usize,
        id: u32,
        records: Option<&[ImageInfo]>,
        host: &[Option<Result<Vec<u8>>>],
    ) -> Option<Slot> {
        if let Some(e) = &d.crc[i] {
            return Some(Slot::Failed(e.clone()));
        }
        let whole_len = match self.batch.sample_range(i) {
            Ok(r) => r.len(),
            Err(e) => return Some(Slot::Failed(e.clone())),
        };
        let head = match &host[i] {
            Some(Ok(b)) => &b[..],
            Some(Err(e)) => return Some(Slot::Failed(e.clone())),
            None => &[][..],
        };
        let info = records.and_then(|v| v.get(id as usize)).copied();
        let record = info
            .map(|r| (r.width, r.height))
            .filter(|&(w, h)| w > 0 && h > 0)
            .filter(|&(w, h)| super::spec::check_pixels(w, h, self.spec.pixels_max).is_ok());
        if d.stage.route_of(info.as_ref()) != Route::Hardware {
            return record.map(|size| Slot::Cpu {
                at: 0,
                size,
                whole: true,
            });
        }
        let end = if head.len() == whole_len {
            head
        } else {
            &d.tails[i][..]
        };
        let probed = d.stage.clock.time(Phase::Probe, || {
            crate::image::info(head)
                .filter(|_| crate::image::engines_decode(head) && ends_complete(end))
        });
        let Some(h) = probed else {
            // Its header is not where the engines could take it, or its data does not end
            // with the image: the CPU route, on its whole bytes.
            return record.map(|size| Slot::Cpu {
                at: 0,
                size,
                whole: head.len() == whole_len,
            });
        };
        // Sized from its own frame header: a record that understates the image cannot make
        // the engines write past its slot.
        let (size, r) = ((h.width, h.height), info.expect("routed by its record"));
        if size != (r.width, r.height) {
            let why = record_mismatch(size, (r.width, r.height));
            return Some(Slot::Failed(self.decode_error(id, why)));
        }
        if let Err(why) = super::spec::check_pixels(size.0, size.1, self.spec.pixels_max) {
            return Some(Slot::Failed(self.decode_error(id, why)));
        }
        Some(Slot::Engine { at: 0, size })
    }

    /// Device path, a pipelined batch: sample `i` as its slot says — a CPU-route image decoded
    /// (of a JPEG only the region under the crop, DCT-scaled where the spec allows, as the CPU
    /// stage decodes it) and uploaded to its slot (queued, not waited for), an engine image
    /// left to the engines.
    pub(super) fn decode_planned(
        &self,
        i: usize,
        dec: &mut Result<ImageDecoder, String>,
        d: &DeviceOut,
        plan: &Plan,
    ) -> Option<Error> {
        let id = self.batch.sample_ids()[i];
        let (at, size, whole) = match &plan.slots[i] {
            Slot::Engine { .. } => return None, // counted once its launch is queued
            Slot::Failed(e) => {
                d.stage.counted(None);
                return Some(e.clone());
            }
            Slot::Cpu { at, size, whole } => (*at, *size, *whole),
        };
        let fail = |e: Error| {
            d.stage.counted(None);
            Some(e)
        };
        let mut data = match d.host.lock().unpoisoned()[i].take() {
            Some(Ok(b)) if whole => b,
            _ => Vec::new(),
        };
        if data.is_empty() {
            if let Err(e) = DeviceStage::sample_bytes(&self.batch, i, &mut data) {
                return fail(e);
            }
        }
        let dec = match dec {
            Ok(dec) => dec,
            Err(e) => return fail(self.decode_error(id, e.clone())),
        };
        let info = self
            .dataset
            .image_info()
            .ok()
            .and_then(|v| v.get(id as usize).copied());
        let mut px = Vec::new();
        let which = (self.seed, self.batch.epoch(), id as u64);
        let got = d.stage.clock.time(cpu_phase(info.as_ref()), || {
            dec.decode_region(&self.spec, which, &data, &mut px)
        });
        let region = match got {
            // Its slot was sized from its record: one that lies is an error, as on the
            // chunked way.
            Ok(g) if g.image != size => {
                return fail(self.decode_error(id, record_mismatch(g.image, size)))
            }
            Ok(_) if px.len() > size.0 as usize * size.1 as usize * 3 => {
                return fail(self.decode_error(id, "its decoded region outgrew its slot".into()))
            }
            Ok(g) => g,
            Err(reason) => return fail(self.decode_error(id, reason)),
        };
        let r = d.tensor.index();
        let up = d
            .stage
            .clock
            .time(Phase::Staging, || d.stage.stage_image(r, at, px));
        if let Err(e) = up {
            return fail(e);
        }
        d.stage.counted(Some(Route::Cpu));
        d.decoded.lock().unpoisoned()[i] = Some(Decoded::Staged(GfSample::new(
            &region.geometry,
            at as u64,
            region.size,
        )));
        None
    }

    /// Device path, a pipelined batch once every sample is done: one resize launch over the
    /// staged images (a lost sample's `valid` is 0: zeros), queued after the engines' and the
    /// uploads' work on the region's stream, not waited for.
    fn finish_planned(
        &self,
        d: &DeviceOut,
        plan: &Plan,
        decoded: &[Option<Decoded>],
        r: usize,
        len: usize,
    ) -> Result<Vec<(usize, Error)>> {
        let ids = self.batch.sample_ids();
        let mut samples = vec![GfSample::default(); plan.slots.len()]; // valid = 0
        let mut engine = 0;
        for (i, s) in plan.slots.iter().enumerate() {
            match (s, &decoded[i]) {
                (Slot::Engine { at, size }, _) => {
                    engine += 1;
                    let g = self
                        .spec
                        .geometry(self.seed, self.batch.epoch(), ids[i] as u64, *size);
                    samples[i] = GfSample::new(&g, *at as u64, *size);
                }
                (Slot::Cpu { .. }, Some(Decoded::Staged(p))) => samples[i] = *p,
                _ => {}
            }
        }
        d.stage.clock.time(Phase::Kernels, || {
            d.stage.launch(r, 0, len, plan.staging_len, &samples)
        })?;
        for _ in 0..engine {
            d.stage.counted(Some(Route::Hardware));
        }
        Ok(Vec::new())
    }

    fn resize_chunks(
        &self,
        d: &DeviceOut,
        dec: &mut Result<ImageDecoder, String>,
        mut decoded: Vec<Option<Decoded>>,
        r: usize,
        len: usize,
    ) -> Result<Vec<(usize, Error)>> {
        use super::device::STAGING_ALIGN;
        let staging_max = d.stage.staging_max();
        let n = decoded.len();
        let per = len.checked_div(n).unwrap_or(0);
        let ids = self.batch.sample_ids();
        let bytes_of = |img: &Option<Decoded>| match img {
            Some(Decoded::Pixels(w, h, _) | Decoded::Hardware(w, h)) => {
                (*w as usize * *h as usize * 3).next_multiple_of(STAGING_ALIGN)
            }
            Some(Decoded::Staged(_)) | None => 0,
        };
        let mut lost = Vec::new();
        let mut start = 0;
        while start < n {
            // The chunk: samples from `start` while their images fit the budget (one at least).
            let mut end = start;
            let mut total = 0;
            while end < n && (end == start || total + bytes_of(&decoded[end]) <= staging_max) {
                total += bytes_of(&decoded[end]);
                end += 1;
            }
            // CPU-decoded images first (uploaded), then the engines' slots (not uploaded).
            let mut cpu = Vec::new();
            let mut samples = vec![GfSample::default(); end - start]; // valid = 0
            let mut slots = Vec::new();
            for (k, img) in decoded[start..end].iter_mut().enumerate() {
                let i = start + k;
                let (w, h) = match img {
                    Some(Decoded::Pixels(w, h, _) | Decoded::Hardware(w, h)) => (*w, *h),
                    Some(Decoded::Staged(_)) | None => continue,
                };
                let g = self
                    .spec
                    .geometry(self.seed, self.batch.epoch(), ids[i] as u64, (w, h));
                match img.take() {
                    Some(Decoded::Pixels(_, _, px)) => {
                        cpu.resize(cpu.len().next_multiple_of(STAGING_ALIGN), 0);
                        samples[k] = GfSample::new(&g, cpu.len() as u64, (w, h));
                        cpu.extend_from_slice(&px);
                    }
                    _ => slots.push((k, g, (w, h))),
                }
            }
            let mut at = cpu.len().next_multiple_of(STAGING_ALIGN);
            let mut hw = Vec::with_capacity(slots.len());
            for (k, g, (w, h)) in slots {
                samples[k] = GfSample::new(&g, at as u64, (w, h));
                hw.push(HardwareImage {
                    sample: start + k,
                    staging: at,
                    size: (w, h),
                });
                at = (at + w as usize * h as usize * 3).next_multiple_of(STAGING_ALIGN);
            }
            let staging_len = at.max(cpu.len());
            d.stage
                .clock
                .time(Phase::Staging, || d.stage.stage_chunk(r, staging_len, &cpu))?;
            drop(cpu);
            let rejected = d.stage.decode_on_engine(r, &self.batch, &hw)?;
            let mut engine_ok = vec![true; hw.len()];
            // The engine's reason is dropped: the CPU decoder's, if it fails too, is kept.
            for (k, _) in rejected {
                engine_ok[k] = false;
                let h = hw[k];
                let id = ids[h.sample];
                let mut data = Vec::new();
                let mut px = Vec::new();
                let info = self
                    .dataset
                    .image_info()
                    .ok()
                    .and_then(|v| v.get(id as usize).copied());
                let got = d.stage.clock.time(cpu_phase(info.as_ref()), || {
                    DeviceStage::sample_bytes(&self.batch, h.sample, &mut data)
                        .map_err(|e| e.to_string())
                        .and_then(|()| match dec {
                            Ok(dec) => dec.decode_rgb(&self.spec, &data, &mut px),
                            Err(e) => Err(e.clone()),
                        })
                });
                match got {
                    Ok(size) if size == h.size => {
                        d.stage
                            .clock
                            .time(Phase::Staging, || d.stage.stage_image(r, h.staging, px))?;
                        d.stage.counted(Some(Route::Cpu));
                    }
                    Ok((w, hh)) => {
                        samples[h.sample - start].valid = 0;
                        d.stage.counted(None);
                        lost.push((
                            h.sample,
                            self.decode_error(id, record_mismatch((w, hh), h.size)),
                        ));
                    }
                    Err(reason) => {
                        samples[h.sample - start].valid = 0;
                        d.stage.counted(None);
                        lost.push((h.sample, self.decode_error(id, reason)));
                    }
                }
            }
            d.stage.clock.time(Phase::Kernels, || {
                d.stage
                    .launch(r, start * per, (end - start) * per, staging_len, &samples)
            })?;
            for ok in engine_ok {
                if ok {
                    d.stage.counted(Some(Route::Hardware));
                }
            }
            start = end;
        }
        Ok(lost)
    }
}

#[cfg(test)]
mod tests {
    use super::ends_complete;

    #[test]
    fn an_image_is_complete_where_its_data_ends_with_eoi() {
        assert!(ends_complete(&[0x12, 0xFF, 0xD9]));
        assert!(
            ends_complete(&[0xFF, 0xD9, 0, 0, 0]),
            "zero padding after EOI"
        );
        assert!(ends_complete(&[0xFF, 0xD9]));
        // Truncated entropy data, a stuffed FF, a restart marker, a trailer, nothing.
        assert!(!ends_complete(&[0x12, 0x34, 0x56]));
        assert!(!ends_complete(&[0xD9, 0xFF, 0x00]));
        assert!(!ends_complete(&[0xFF, 0xD7]));
        assert!(!ends_complete(b"\xFF\xD9trailer"));
        assert!(!ends_complete(&[0, 0, 0]));
        assert!(!ends_complete(&[]));
    }
}
