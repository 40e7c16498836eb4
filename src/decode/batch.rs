//! A batch of decoded images: one tensor, its labels, ids and per-sample errors, and the
//! element types it can be viewed as.

use super::pool::Target;
use std::sync::Arc;

use super::{Layout, PixelType};
use crate::batch::BatchMeta;
use crate::error::{Error, Result};

/// An element type a batch tensor can be viewed as.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The pixel type it stands for.
    const TYPE: PixelType;
}
impl Element for u8 {
    const TYPE: PixelType = PixelType::U8;
}
impl Element for f32 {
    const TYPE: PixelType = PixelType::F32;
}
impl Element for half::f16 {
    const TYPE: PixelType = PixelType::F16;
}
impl Element for half::bf16 {
    const TYPE: PixelType = PixelType::Bf16;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A batch of decoded images: one contiguous tensor ([N, 3, H, W] or [N, H, W, 3]) plus the
/// labels, ids and per-sample errors. Cheap to clone (the tensor is shared).
#[derive(Clone)]
pub struct ImageBatch {
    /// Epoch, place, ids, labels, padding, timing (decode included): what every batch says.
    pub(super) meta: BatchMeta,
    pub(super) errors: Vec<Option<Arc<Error>>>,
    pub(super) tensor: Target,
    pub(super) size: (u32, u32),
    pub(super) dtype: PixelType,
    pub(super) layout: Layout,
}

impl std::ops::Deref for ImageBatch {
    type Target = BatchMeta;
    fn deref(&self) -> &BatchMeta {
        &self.meta
    }
}

impl ImageBatch {
    /// The element type.
    pub fn dtype(&self) -> PixelType {
        self.dtype
    }
    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// The tensor's shape: [N, 3, H, W] (NCHW) or [N, H, W, 3] (NHWC).
    pub fn shape(&self) -> [usize; 4] {
        let (n, w, h) = (self.len(), self.size.0 as usize, self.size.1 as usize);
        match self.layout {
            Layout::Nchw => [n, 3, h, w],
            Layout::Nhwc => [n, h, w, 3],
        }
    }
    /// Strides in elements (compact, row-major).
    pub fn strides(&self) -> [usize; 4] {
        let s = self.shape();
        [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1]
    }
    /// The tensor's bytes (little-endian elements) for a host batch; empty for a device
    /// batch (see [`to_host`](Self::to_host)).
    pub fn bytes(&self) -> &[u8] {
        match &self.tensor {
            Target::Host(t) => t.bytes(),
            Target::Device(_) => &[],
        }
    }
    /// Whether the tensor is in device memory (a CUDA or simulated device).
    pub fn is_device(&self) -> bool {
        matches!(self.tensor, Target::Device(_))
    }
    /// The tensor's CUDA device address (`None` on the host or the simulated device).
    pub fn device_ptr(&self) -> Option<u64> {
        match &self.tensor {
            Target::Device(d) if d.tensor.device().is_some() => Some(d.tensor.ptr()),
            _ => None,
        }
    }
    /// The CUDA device holding the tensor (`None` on the host or the simulated device).
    pub fn device(&self) -> Option<u32> {
        match &self.tensor {
            Target::Device(d) => d.tensor.device(),
            Target::Host(_) => None,
        }
    }
    /// The event recorded after the kernel that wrote the tensor (`None` unless on CUDA): a
    /// consumer's stream waits on it ([`wait_on`](Self::wait_on)) rather than the host.
    pub fn ready_event(&self) -> Option<u64> {
        match &self.tensor {
            Target::Device(d) => d.tensor.ready_event(),
            Target::Host(_) => None,
        }
    }
    /// Makes `stream` wait for the tensor to be written, and orders the tensor's reuse after
    /// the work enqueued on `stream` before the last clone of this batch is dropped (nothing
    /// to do on the host; on the simulated device, a stream of
    /// [`SimDevice::consumer_stream`](crate::gpu::SimDevice::consumer_stream)). Every stream
    /// waited on is released, not only the last.
    ///
    /// # Safety
    /// As [`Batch::wait_on`](crate::Batch::wait_on): `stream` must be a live `CUstream` of the
    /// device's primary context (or 0, 1, 2) and stay live until the batch is dropped.
    pub unsafe fn wait_on(&self, stream: u64) -> Result<()> {
        match &self.tensor {
            // SAFETY: forwarded under the caller's guarantees.
            Target::Device(d) => unsafe { d.tensor.wait_on(stream) },
            Target::Host(_) => Ok(()),
        }
    }

    /// Orders the tensor's reuse after the work enqueued on `stream` before the last clone of
    /// this batch is dropped, without a wait (DLPack's `stream=-1`: the consumer orders its
    /// reads itself, on the legacy default stream as far as gpufeed can know).
    ///
    /// # Safety
    /// As for [`ImageBatch::wait_on`].
    pub unsafe fn release_after(&self, stream: u64) {
        if let Target::Device(d) = &self.tensor {
            // SAFETY: forwarded under the caller's guarantees.
            unsafe { d.tensor.release_after(stream) }
        }
    }
    /// Waits on the host until the tensor is written (a blocking-sync event, no spin; nothing
    /// to wait for on the host path): what a trainer that reads a loss every step waits for,
    /// or a benchmark whose clock must see the device's work. A consumer that queues its work
    /// on a stream waits with [`wait_on`](Self::wait_on) instead.
    pub fn synchronize(&self) -> Result<()> {
        match &self.tensor {
            Target::Device(d) => d.tensor.synchronize(),
            Target::Host(_) => Ok(()),
        }
    }

    /// The simulated device's address and length of the tensor (`None` elsewhere): what a
    /// test's simulated consumer kernel reads ([`crate::gpu::SimDevice::read_on`]).
    pub fn sim_ptr(&self) -> Option<(u64, usize)> {
        match &self.tensor {
            Target::Device(d) if d.tensor.is_simulated() => Some((d.tensor.ptr(), d.tensor.len())),
            _ => None,
        }
    }

    /// A copy of the tensor's bytes in host memory, wherever it is (for checks and tests: a
    /// device batch's copy waits for it).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        Ok(match &self.tensor {
            Target::Host(t) => t.bytes().to_vec(),
            Target::Device(d) => d.tensor.to_host()?,
        })
    }
    /// The tensor as elements of `T`, or `None` if `T` is not its type or the tensor is in
    /// device memory.
    pub fn view<T: Element>(&self) -> Option<&[T]> {
        if T::TYPE != self.dtype {
            return None;
        }
        let Target::Host(t) = &self.tensor else {
            return None;
        };
        let b = t.bytes();
        let n = b.len() / std::mem::size_of::<T>();
        // The tensor is 64-byte aligned and every bit pattern is a valid element (`Pod`), so
        // the cast cannot fail; it borrows the bytes, immutable while the batch lives.
        bytemuck::try_cast_slice(&b[..n * std::mem::size_of::<T>()]).ok()
    }
    /// The address of the tensor's first byte in host memory (stable while any clone lives);
    /// null for a device batch.
    pub fn as_ptr(&self) -> *const u8 {
        match &self.tensor {
            Target::Host(t) => t.ptr.as_ptr(),
            Target::Device(_) => std::ptr::null(),
        }
    }
    /// Sample `i`'s error, if it could not be delivered (its image is zero-filled).
    pub fn error(&self, i: usize) -> Option<&Error> {
        self.errors[i].as_deref()
    }
    /// The samples that failed, with their position in the batch.
    pub fn errors(&self) -> impl Iterator<Item = (usize, &Error)> {
        self.errors
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_deref().map(|e| (i, e)))
    }
    /// A value keeping the tensor's memory alive (for DLPack exports).
    pub fn keep_alive(&self) -> Box<dyn std::any::Any + Send> {
        match &self.tensor {
            Target::Host(t) => Box::new(t.clone()),
            Target::Device(d) => Box::new(d.clone()),
        }
    }
}

impl std::fmt::Debug for ImageBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageBatch")
            .field("epoch", &self.meta.epoch)
            .field("index", &self.meta.index)
            .field("shape", &self.shape())
            .field("dtype", &self.dtype)
            .field("errors", &self.errors().count())
            .finish()
    }
}
