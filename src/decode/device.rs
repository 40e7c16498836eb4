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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::batch::Batch;
use crate::dataset::{Dataset, Frame};
use crate::error::{Error, ErrorKind, Result};
use crate::gpu::kernels::GfSpan;
use crate::image::{ColorSpace, ImageInfo, ImageKind, Subsampling};

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

/// Locks `m`, recovering from poisoning (plain bookkeeping and buffers a panic cannot leave
/// half-valid: a tensor is rewritten whole before it is handed out again).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The output tensors of a device image loader, allocated once when it is made: a batch
/// takes one and gives it back when its last clone is dropped. On the simulated device they
/// are host memory standing in for device memory.
pub(crate) struct OutputPool {
    bufs: Vec<Mutex<Vec<u8>>>,
    free: Mutex<Vec<usize>>,
    cv: Condvar,
}

impl OutputPool {
    pub(crate) fn sim(tensors: usize, bytes: usize) -> Result<Arc<OutputPool>> {
        let mut bufs = Vec::new();
        for _ in 0..tensors {
            let mut v = Vec::new();
            v.try_reserve_exact(bytes).map_err(|_| {
                Error::new(
                    ErrorKind::Busy,
                    format!("out of memory allocating a {bytes}-byte output tensor"),
                )
            })?;
            v.resize(bytes, 0);
            bufs.push(Mutex::new(v));
        }
        Ok(Arc::new(OutputPool {
            bufs,
            free: Mutex::new((0..tensors).rev().collect()),
            cv: Condvar::new(),
        }))
    }

    /// Tensors in the pool.
    pub(crate) fn tensors(&self) -> usize {
        self.bufs.len()
    }

    /// Tensors not held by a batch or a decode in progress.
    pub(crate) fn free_tensors(&self) -> usize {
        lock(&self.free).len()
    }

    /// A free tensor, waiting as long as the consumer holds them all (its pace), or `None`
    /// once `cancelled`.
    pub(crate) fn take(
        self: &Arc<Self>,
        len: usize,
        cancelled: &AtomicBool,
    ) -> Option<DeviceTensor> {
        let mut f = lock(&self.free);
        loop {
            if cancelled.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(index) = f.pop() {
                return Some(DeviceTensor {
                    pool: self.clone(),
                    index,
                    len,
                });
            }
            f = self
                .cv
                .wait_timeout(f, Duration::from_millis(20))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// One output tensor of the pool, back to it when dropped.
pub(crate) struct DeviceTensor {
    pool: Arc<OutputPool>,
    index: usize,
    len: usize,
}

impl DeviceTensor {
    /// The tensor's bytes (the simulated device's memory).
    pub(crate) fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        lock(&self.pool.bufs[self.index])
    }

    /// Bytes the batch uses.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        lock(&self.pool.free).push(self.index);
        self.pool.cv.notify_one();
    }
}

/// What a device image loader shares across its epochs: the output tensors, the counts by
/// route, and whether the device verifies checksums.
pub(crate) struct DeviceStage {
    pub(crate) outputs: Arc<OutputPool>,
    pub(crate) counters: Counters,
    /// crc32c of unframed samples on the device (the loader verifies, the format has them).
    pub(crate) verify: bool,
    pub(crate) emit: GfEmit,
}

impl DeviceStage {
    /// The stage of a loader on the simulated device whose batches hold up to `batch_size`
    /// samples of `spec`; `tensors` output tensors.
    pub(crate) fn sim(
        spec: &ImageSpec,
        batch_size: usize,
        tensors: usize,
        verify: bool,
    ) -> Result<DeviceStage> {
        if !crate::gpu::host_kernels::available() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "the simulated device's kernels are not in this build (feature `sim` with a \
                 C++ compiler at build time)",
            ));
        }
        let per = spec.sample_elems() * spec.dtype.size();
        Ok(DeviceStage {
            outputs: OutputPool::sim(tensors, per.saturating_mul(batch_size))?,
            counters: Counters::default(),
            verify,
            emit: GfEmit::new(spec),
        })
    }

    /// Runs the crc32c kernel over the samples of `batch` (its group already in device
    /// memory) and returns, for each sample, the error of a checksum that does not match.
    pub(crate) fn check_crcs(&self, batch: &Batch, ds: &Dataset) -> Vec<Option<Error>> {
        let n = batch.len();
        let mut out: Vec<Option<Error>> = (0..n).map(|_| None).collect();
        if !(self.verify && ds.has_checksums() && ds.frame() == Frame::None) {
            return out;
        }
        let Some(region) = batch.device_region() else {
            return out;
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
        let crcs = match region.sim_bytes() {
            Some(bytes) => crate::gpu::host_kernels::crc32c(&bytes, &spans),
            None => Err(Error::new(
                ErrorKind::Unsupported,
                "crc32c on a CUDA device is not joined yet",
            )),
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
                        out[i] = Some(ds.sample_error(
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
                    out[i] = Some(e.clone());
                }
            }
        }
        out
    }

    /// The compressed bytes of sample `i` of `batch` (from the simulated device's memory), or
    /// its error.
    pub(crate) fn sample_bytes(batch: &Batch, i: usize, into: &mut Vec<u8>) -> Result<()> {
        let r = batch.sample_range(i).map_err(|e| e.clone())?;
        let region = batch
            .device_region()
            .ok_or_else(|| crate::error::invalid("a host batch in the device image stage"))?;
        let bytes = region.sim_bytes().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "the CUDA device image pipeline is not joined yet",
            )
        })?;
        into.clear();
        into.extend_from_slice(&bytes[r]);
        Ok(())
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
