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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::batch::Batch;
use crate::dataset::{Dataset, Frame};
use crate::error::{Error, ErrorKind, Result};
use crate::gpu::cuda::{Context, DeviceBuffer, Stream};
use crate::gpu::kernels::{as_bytes, check_spans, DeviceKernels, GfSpan};
use crate::gpu::nvjpeg::BatchDecoder;
use crate::gpu::{DevicePool, DeviceRegion};
use crate::image::{ColorSpace, ImageInfo, ImageKind, Subsampling};
use crate::util::lock;

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
        Some(i)
            if i.kind == ImageKind::Jpeg
                && !i.progressive
                && matches!(i.colorspace, ColorSpace::Ycbcr | ColorSpace::Gray)
                && matches!(
                    i.subsampling,
                    Subsampling::S444
                        | Subsampling::S422
                        | Subsampling::S420
                        | Subsampling::S440
                        | Subsampling::Gray
                ) =>
        {
            Route::Hardware
        }
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
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    hardware: AtomicU64,
    cpu: AtomicU64,
    failed: AtomicU64,
    crc_checked: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RouteCounts {
        RouteCounts {
            hardware: self.hardware.load(Ordering::Relaxed),
            cpu: self.cpu.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            crc_checked: self.crc_checked.load(Ordering::Relaxed),
        }
    }
}

/// The CUDA side of a device image stage: the kernels loaded on the device, the stream the
/// stage enqueues on, and per output region the device scratch of the job writing it.
struct CudaSide {
    ctx: Arc<Context>,
    kernels: DeviceKernels,
    stream: Stream,
    scratch: Vec<Mutex<Scratch>>,
    /// nvJPEG's batched decode on the JPEG engines, reading bitstreams in device memory
    /// (`None`: no engines, no nvJPEG, or turned off by the spec).
    nvjpeg: Option<Mutex<BatchDecoder>>,
}

/// An image of a device batch that the hardware decoder writes: its sample, where it goes in
/// the staging buffer, its size (from its record).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HardwareImage {
    pub(crate) sample: usize,
    pub(crate) staging: usize,
    pub(crate) size: (u32, u32),
}

/// nvJPEG's batched decoder on the JPEG engines with bitstreams in device memory, its buffers
/// allocated for `batch` images as large as the largest hardware-route record; or why not.
fn hardware_decoder(batch: usize, records: &[ImageInfo]) -> Result<BatchDecoder> {
    let lib = crate::gpu::nvjpeg::load()?;
    let mut d = BatchDecoder::new(&lib, crate::gpu::nvjpeg::backend::HARDWARE_DEVICE)?;
    let (engines, _) = d.handle().hardware_decoder_info()?;
    if engines == 0 {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "this GPU has no JPEG engines",
        ));
    }
    let (w, h) = records
        .iter()
        .filter(|r| route(Some(r)) == Route::Hardware)
        .fold((0, 0), |(w, h), r| (w.max(r.width), h.max(r.height)));
    if w > 0 && h > 0 {
        d.pre_allocate(batch, w, h)?;
    }
    Ok(d)
}

impl Drop for CudaSide {
    fn drop(&mut self) {
        // The scratch (staging, resize parameters) and nvJPEG's state are freed with this side:
        // the last batches' nvJPEG decodes and resize launches may still read or write them
        // on the stage's stream, which device memory's stream-ordered free does not wait for.
        let _ = self.ctx.bind();
        if self.stream.synchronize().is_err() {
            let _ = self.ctx.synchronize();
        }
    }
}

/// A job's device scratch, kept with its output region (one job writes a region at a time):
/// the crc spans and results, the resize parameters, and the decoded images (grown to the
/// largest batch seen, then reused: flat after the first epoch).
struct Scratch {
    spans: DeviceBuffer,
    crcs: DeviceBuffer,
    samples: DeviceBuffer,
    staging: Option<DeviceBuffer>,
}

/// What a device image loader shares across its epochs: the output tensors (device regions
/// of a pool made with it, with their ready and release events), the counts by route, whether
/// the device verifies checksums, and on CUDA the kernels, a stream and the scratch.
pub(crate) struct DeviceStage {
    pub(crate) outputs: Arc<DevicePool>,
    pub(crate) counters: Counters,
    /// crc32c of unframed samples on the device (the loader verifies, the format has them).
    pub(crate) verify: bool,
    pub(crate) emit: GfEmit,
    /// Whether JPEGs the hardware decoder takes go to it (the simulated device's stand-in);
    /// on CUDA not yet: nvJPEG's batched decode is not joined, so every image takes the CPU
    /// route and is counted there.
    hardware_decoder: bool,
    cuda: Option<CudaSide>,
}

impl DeviceStage {
    /// The stage of an image loader on the device of `regions` (the loader's device regions:
    /// simulated or CUDA) whose batches hold up to `batch_size` samples of `spec`, with
    /// `tensors` output tensors.
    pub(crate) fn new(
        regions: &DevicePool,
        spec: &ImageSpec,
        records: &[ImageInfo],
        batch_size: usize,
        tensors: usize,
        verify: bool,
    ) -> Result<DeviceStage> {
        let per = spec.sample_elems() * spec.dtype.size();
        let bytes = per.saturating_mul(batch_size);
        let Some(ctx) = regions.ctx.clone() else {
            if !crate::gpu::host_kernels::available() {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "the simulated device's kernels are not in this build (feature `sim` with \
                     a C++ compiler at build time)",
                ));
            }
            let sim = crate::gpu::SimDevice::new(0);
            return Ok(DeviceStage {
                outputs: DevicePool::sim(&sim, tensors, bytes),
                counters: Counters::default(),
                verify,
                emit: GfEmit::new(spec),
                hardware_decoder: spec.hardware_decoder,
                cuda: None,
            });
        };
        ctx.bind()?;
        let kernels = DeviceKernels::load(&ctx)?;
        let stream = Stream::new(&ctx)?;
        let outputs = DevicePool::cuda(&ctx, tensors, bytes)?;
        let scratch = (0..tensors)
            .map(|_| {
                Ok(Mutex::new(Scratch {
                    spans: DeviceBuffer::new(&ctx, batch_size * std::mem::size_of::<GfSpan>())?,
                    crcs: DeviceBuffer::new(&ctx, batch_size * 4)?,
                    samples: DeviceBuffer::new(&ctx, batch_size * std::mem::size_of::<GfSample>())?,
                    staging: None,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let nvjpeg = if spec.hardware_decoder {
            match hardware_decoder(batch_size, records) {
                Ok(d) => Some(Mutex::new(d)),
                Err(e) => {
                    crate::io::notice(&format!(
                        "the hardware JPEG decoder is not used ({}): every image is decoded \
                         on the CPU and copied in",
                        e.report()
                    ));
                    None
                }
            }
        } else {
            None
        };
        Ok(DeviceStage {
            outputs,
            counters: Counters::default(),
            verify,
            emit: GfEmit::new(spec),
            hardware_decoder: nvjpeg.is_some(),
            cuda: Some(CudaSide {
                ctx,
                kernels,
                stream,
                scratch,
                nvjpeg,
            }),
        })
    }

    /// Whether the hardware route decodes on the device (CUDA with nvJPEG), rather than by the
    /// simulated device's stand-in on the decode threads.
    pub(crate) fn decodes_on_device(&self) -> bool {
        self.cuda.as_ref().is_some_and(|c| c.nvjpeg.is_some())
    }

    /// The route sample `info` takes here (see [`DeviceStage::hardware_decoder`]).
    pub(crate) fn route_of(&self, info: Option<&ImageInfo>) -> Route {
        match route(info) {
            Route::Hardware if self.hardware_decoder => Route::Hardware,
            _ => Route::Cpu,
        }
    }

    /// Runs the crc32c kernel over the samples of `batch` (its group already in device
    /// memory; on CUDA with the scratch of output region `out`) and returns, for each sample,
    /// the error of a checksum that does not match.
    pub(crate) fn check_crcs(&self, batch: &Batch, ds: &Dataset, out: usize) -> Vec<Option<Error>> {
        let n = batch.len();
        let mut errs: Vec<Option<Error>> = (0..n).map(|_| None).collect();
        if !(self.verify && ds.has_checksums() && ds.frame() == Frame::None) {
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
        let crcs = match &self.cuda {
            None => match region.sim_bytes() {
                Some(bytes) => crate::gpu::host_kernels::crc32c(&bytes, &spans),
                None => Err(crate::error::invalid(
                    "a CUDA region on the simulated device",
                )),
            },
            Some(c) => self.crcs_on_cuda(c, region, &spans, out),
        };
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

    /// The crc32c kernel on CUDA: the spans up, one launch on the stage's stream (after the
    /// group's copy), the results down. The stage's stream is waited for here, on the feeder
    /// thread: the batch's samples cannot be judged before.
    fn crcs_on_cuda(
        &self,
        c: &CudaSide,
        region: &DeviceRegion,
        spans: &[GfSpan],
        out: usize,
    ) -> Result<Vec<u32>> {
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let n = spans.len();
        check_spans(region.len(), spans)?;
        c.ctx.bind()?;
        let mut sc = lock(&c.scratch[out]);
        // Nothing of a previous job still reads this scratch: its launches were waited for
        // (crc) or the region's ready event was (resize), before the region came back.
        sc.spans.write(0, as_bytes(spans))?;
        // SAFETY: the stage's stream lives as long as the stage, which the job holding the
        // batch (and so the region) keeps alive: the release event recorded on it at the
        // region's drop is valid.
        unsafe { region.wait_on(c.stream.raw())? };
        // SAFETY: every span lies inside the group's region (checked above); the scratch's
        // `spans` and `crcs` hold `batch_size >= n` entries; the stream is synchronised below
        // before any of them changes, and the region lives (its batch is held) until then.
        unsafe {
            c.kernels.crc32c(
                &c.stream,
                region.ptr(),
                sc.spans.ptr(),
                n as u32,
                sc.crcs.ptr(),
            )?
        };
        c.stream.synchronize()?;
        let mut raw = vec![0u8; n * 4];
        sc.crcs.read(0, &mut raw)?;
        Ok(raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }

    /// The compressed bytes of sample `i` of `batch` (copied down from the device for the CPU
    /// route), or its error.
    pub(crate) fn sample_bytes(batch: &Batch, i: usize, into: &mut Vec<u8>) -> Result<()> {
        let r = batch.sample_range(i).map_err(|e| e.clone())?;
        let region = batch
            .device_region()
            .ok_or_else(|| crate::error::invalid("a host batch in the device image stage"))?;
        into.clear();
        into.resize(r.len(), 0);
        region.read_range(r.start, into)
    }

    /// One launch of the resize kernel over a batch: `staging` (the decoded images, packed as
    /// `samples` say; on CUDA the `hw` images are first decoded into their places by the JPEG
    /// engines, from `batch`'s group in device memory) into output region `out`, whose bytes
    /// are `len`.
    pub(crate) fn resize(
        &self,
        out: usize,
        len: usize,
        staging: &[u8],
        samples: &[GfSample],
        hw: &[HardwareImage],
        batch: &Batch,
    ) -> Result<()> {
        let Some(c) = &self.cuda else {
            let mut bytes = self
                .outputs
                .sim_region(out)
                .ok_or_else(|| crate::error::invalid("a CUDA region on the simulated device"))?;
            return crate::gpu::host_kernels::resize(
                staging,
                samples,
                &self.emit,
                &mut bytes[..len],
            );
        };
        // The same bounds the host launch checks, before the device trusts them.
        crate::gpu::kernels::check_resize(staging.len(), samples, &self.emit, len)?;
        if len > self.outputs.region_bytes() {
            return Err(crate::error::invalid(
                "resize launch: output larger than its region",
            ));
        }
        c.ctx.bind()?;
        // What the previous write of this region read (its scratch) may change only after it.
        self.outputs.wait_written(out)?;
        let mut sc = lock(&c.scratch[out]);
        let need = staging.len().max(1);
        if sc.staging.as_ref().is_none_or(|b| b.len() < need) {
            sc.staging = None; // its last reader completed (waited for above)
            sc.staging = Some(DeviceBuffer::new(&c.ctx, need.next_multiple_of(1 << 20))?);
        }
        let Scratch {
            samples: dsam,
            staging: dst,
            ..
        } = &mut *sc;
        let dst = dst.as_mut().expect("allocated above");
        dst.write(0, staging)?;
        dsam.write(0, as_bytes(samples))?;
        if !hw.is_empty() {
            self.decode_hardware(c, batch, hw, dst)?;
        }
        self.outputs.before_write(out, &c.stream)?;
        // SAFETY: every valid sample's image lies inside the staging buffer (checked above),
        // the output region holds `len` bytes = n samples of the emitted type (checked), the
        // scratch stays with region `out` and is not changed before this launch completes
        // (the next writer of `out` waits for its ready event first, recorded next).
        unsafe {
            c.kernels.resize(
                &c.stream,
                dst.ptr(),
                dsam.ptr(),
                samples.len() as u32,
                &self.emit,
                self.outputs.ptr(out),
            )?
        };
        self.outputs.after_write(out, &c.stream)
    }

    /// nvJPEG's batched decode of `hw` on the stage's stream, after the group's copy: each
    /// bitstream read where it lies in the group's device region, each image written at its
    /// place in `staging`.
    fn decode_hardware(
        &self,
        c: &CudaSide,
        batch: &Batch,
        hw: &[HardwareImage],
        staging: &DeviceBuffer,
    ) -> Result<()> {
        let nv = c
            .nvjpeg
            .as_ref()
            .ok_or_else(|| crate::error::invalid("hardware images without a hardware decoder"))?;
        let region = batch
            .device_region()
            .ok_or_else(|| crate::error::invalid("a host batch in the device image stage"))?;
        let mut data = Vec::with_capacity(hw.len());
        let mut lengths = Vec::with_capacity(hw.len());
        let mut dst = Vec::with_capacity(hw.len());
        for h in hw {
            let r = batch.sample_range(h.sample).map_err(|e| e.clone())?;
            let bytes = h.size.0 as usize * h.size.1 as usize * 3;
            if r.end > region.len() || h.staging + bytes > staging.len() {
                return Err(crate::error::invalid(
                    "hardware decode: a bitstream or an image outside its buffer",
                ));
            }
            data.push((region.ptr() + r.start as u64) as *const u8);
            lengths.push(r.len());
            dst.push(crate::gpu::nvjpeg::NvjpegImage {
                channel: [
                    (staging.ptr() + h.staging as u64) as *mut u8,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                ],
                pitch: [h.size.0 as usize * 3, 0, 0, 0],
            });
        }
        // SAFETY: the stage's stream outlives the region's batch (see `crcs_on_cuda`).
        unsafe { region.wait_on(c.stream.raw())? };
        // SAFETY: each bitstream lies inside the group's device region (checked), which stays
        // allocated and unchanged until the stream passes the release event recorded when the
        // batch goes (after this work); each output lies inside the staging buffer (checked)
        // at the pitch of its record's width, and the staging buffer is not changed or freed
        // before the region's ready event (recorded after the resize that follows) is waited
        // for.
        unsafe { lock(nv).decode(&data, &lengths, &mut dst, c.stream.raw()) }
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
