//! ⑥ The `Batch` handed to the trainer: sample bytes (views into one slot of host memory, or
//! into one device region), ids and labels.

use std::ops::Range;
use std::sync::Arc;

use crate::buf::{Arena, Slot};
use crate::error::{Error, ErrorKind, Result};
use crate::gpu::DeviceRegion;

/// One slot holding a group of batches; back to the arena when the last batch is dropped.
pub(crate) struct Region {
    arena: Arc<Arena>,
    slot: Option<Slot>,
}

impl Region {
    pub(crate) fn new(arena: Arc<Arena>, slot: Slot) -> Region {
        Region {
            arena,
            slot: Some(slot),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.arena
            .bytes(self.slot.as_ref().expect("slot held until drop"))
    }

    /// The slot itself, no longer returned to the arena on drop (the caller is now its owner).
    pub(crate) fn into_slot(mut self) -> Slot {
        self.slot.take().expect("slot held until drop")
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.arena.put(s);
        }
    }
}

/// Where a batch's bytes are.
#[derive(Clone)]
pub(crate) enum Memory {
    Host(Arc<Region>),
    Device(Arc<DeviceRegion>),
}

/// The error `Batch::sample` gives for a batch in device memory.
static ON_DEVICE: std::sync::LazyLock<Error> = std::sync::LazyLock::new(|| {
    Error::new(
        ErrorKind::InvalidInput,
        "this batch is in device memory: use device_ptr() and sample_range(), or to_host()",
    )
});

/// Where one sample's bytes are in its read group's buffer, or why it has none.
pub(crate) type SampleSpan = std::result::Result<std::ops::Range<usize>, std::sync::Arc<Error>>;

/// A batch of samples, in host memory or in device memory.
///
/// The bytes live in a slot of the loader's arena (host) or a device region (device), shared
/// with the other batches of the same read group; it is reused only after every batch of the
/// group has been dropped, so a batch may be kept as long as needed (holding many keeps their
/// memory from the loader and eventually stalls it). A device batch carries the event its copy
/// recorded: [`wait_on`](Batch::wait_on) makes a stream wait for it without blocking the host.
pub struct Batch {
    pub(crate) meta: BatchMeta,
    pub(crate) spans: Vec<SampleSpan>,
    pub(crate) mem: Memory,
}

/// What every batch says about itself, bytes ([`Batch`]) or decoded images
/// ([`ImageBatch`](crate::decode::ImageBatch)): its epoch and place, its samples' dataset ids,
/// labels and padding, and how long it took. Both batches dereference to it, so
/// `batch.epoch()`, `batch.labels()`… are the same methods on either.
#[derive(Debug, Clone)]
pub struct BatchMeta {
    pub(crate) epoch: u64,
    pub(crate) index: u32,
    pub(crate) ids: Vec<u32>,
    pub(crate) labels: Vec<i64>,
    /// Samples from this position on are padding.
    pub(crate) padding_from: usize,
    pub(crate) timing: crate::stats::BatchTiming,
}

impl BatchMeta {
    /// How long the consumer waited for this batch and why (decode included, for images), and
    /// its read group's timeline.
    pub fn timing(&self) -> &crate::stats::BatchTiming {
        &self.timing
    }

    /// The epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Index of this batch in the rank's epoch (0-based).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the batch holds no samples.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Dataset index of each sample.
    pub fn sample_ids(&self) -> &[u32] {
        &self.ids
    }

    /// Whether sample `i` is padding: a repeat of a sample this epoch already delivers, added
    /// only to give every rank the same number of samples (`LastBatch::Pad`). Evaluation should
    /// drop it.
    pub fn is_padding(&self, i: usize) -> bool {
        i >= self.padding_from
    }

    /// One flag per sample: [`is_padding`](BatchMeta::is_padding).
    pub fn padding_mask(&self) -> Vec<bool> {
        (0..self.len()).map(|i| self.is_padding(i)).collect()
    }

    /// Padded samples in this batch (they are the last ones).
    pub fn padding_count(&self) -> usize {
        self.len().saturating_sub(self.padding_from)
    }

    /// Label of each sample (−1 when none).
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }
}

impl std::ops::Deref for Batch {
    type Target = BatchMeta;
    fn deref(&self) -> &BatchMeta {
        &self.meta
    }
}

impl Batch {
    /// The device region holding the bytes (`None` for a host batch).
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the device image stage"
        )
    )]
    pub(crate) fn device_region(&self) -> Option<&Arc<DeviceRegion>> {
        match &self.mem {
            Memory::Device(d) => Some(d),
            Memory::Host(_) => None,
        }
    }

    /// The bytes of sample `i` of the batch, or the error that made them unavailable (it names
    /// the file, the sample and what was wrong). Other samples are unaffected.
    /// For a device batch every sample is an error saying so (see
    /// [`sample_range`](Batch::sample_range)).
    pub fn sample(&self, i: usize) -> Result<&[u8], &Error> {
        match (&self.spans[i], &self.mem) {
            (Ok(r), Memory::Host(region)) => Ok(&region.bytes()[r.clone()]),
            (Ok(_), Memory::Device(_)) => Err(&ON_DEVICE),
            (Err(e), _) => Err(e),
        }
    }

    /// Where sample `i` lies in the batch's memory (from [`device_ptr`](Batch::device_ptr) for
    /// a device batch), or the error that made it unavailable.
    pub fn sample_range(&self, i: usize) -> Result<Range<usize>, &Error> {
        match &self.spans[i] {
            Ok(r) => Ok(r.clone()),
            Err(e) => Err(e),
        }
    }

    /// The whole host region the sample ranges index into (`None` for a device batch). Its
    /// address is stable while the batch lives.
    pub fn region_bytes(&self) -> Option<&[u8]> {
        match &self.mem {
            Memory::Host(r) => Some(r.bytes()),
            Memory::Device(_) => None,
        }
    }

    /// Bytes of the region the sample ranges index into (host or device).
    pub fn region_len(&self) -> usize {
        match &self.mem {
            Memory::Host(r) => r.bytes().len(),
            Memory::Device(d) => d.len(),
        }
    }

    /// Whether the bytes are in device memory.
    pub fn is_device(&self) -> bool {
        matches!(self.mem, Memory::Device(_))
    }

    /// The CUDA device holding the bytes (`None` on the host or the simulated device).
    pub fn device(&self) -> Option<u32> {
        match &self.mem {
            Memory::Device(d) => d.device(),
            Memory::Host(_) => None,
        }
    }

    /// The device address the sample ranges are relative to (`None` for a host batch).
    pub fn device_ptr(&self) -> Option<u64> {
        match &self.mem {
            Memory::Device(d) => Some(d.ptr()),
            Memory::Host(_) => None,
        }
    }

    /// The raw `CUevent` recorded after the batch's copy (`None` on the host).
    pub fn ready_event(&self) -> Option<u64> {
        match &self.mem {
            Memory::Device(d) => d.ready_event(),
            Memory::Host(_) => None,
        }
    }

    /// Makes `stream` wait until the batch's bytes are on the device, without blocking the
    /// host; the memory is then reused only after work enqueued on `stream` before the batch
    /// is dropped. Does nothing for a host batch.
    ///
    /// # Safety
    /// `stream` must be a live `CUstream` of the device's primary context (or 0, 1 or 2: the
    /// legacy and per-thread default streams) and stay live until every clone of this batch
    /// is dropped (a release event is recorded on it then). Passing a stream of another
    /// library is what DLPack's `__dlpack__(stream=...)` does; its consumer makes this promise.
    pub unsafe fn wait_on(&self, stream: u64) -> Result<()> {
        match &self.mem {
            // SAFETY: forwarded under the caller's promise.
            Memory::Device(d) => unsafe { d.wait_on(stream) },
            Memory::Host(_) => Ok(()),
        }
    }

    /// Orders the reuse of a device batch's memory after work enqueued on `stream` before the
    /// batch is dropped, without making `stream` wait for the copy: for a consumer that
    /// synchronises itself (DLPack's `stream=-1`). Does nothing for a host batch.
    ///
    /// # Safety
    /// As for [`wait_on`](Self::wait_on).
    pub unsafe fn release_after(&self, stream: u64) {
        if let Memory::Device(d) = &self.mem {
            // SAFETY: forwarded under the caller's promise.
            unsafe { d.release_after(stream) }
        }
    }

    /// [`wait_on`](Self::wait_on) the legacy default stream (`CU_STREAM_LEGACY`), where work
    /// that names no stream runs. Does nothing for a host batch.
    pub fn wait_on_default_stream(&self) -> Result<()> {
        // SAFETY: `CU_STREAM_LEGACY` is a handle every context accepts and that never dies.
        unsafe { self.wait_on(1) }
    }

    /// Every sample's bytes copied to the host (synchronously; for checks and tests). Works for
    /// host batches too.
    pub fn to_host(&self) -> Result<Vec<Result<Vec<u8>, Error>>> {
        let all = match &self.mem {
            Memory::Host(r) => r.bytes().to_vec(),
            Memory::Device(d) => d.to_host()?,
        };
        Ok(self
            .spans
            .iter()
            .map(|s| match s {
                Ok(r) => all
                    .get(r.clone())
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| Error::new(ErrorKind::Io, "sample outside its region")),
                Err(e) => Err((**e).clone()),
            })
            .collect())
    }

    /// Iterates over every sample's bytes or error.
    pub fn samples(&self) -> impl Iterator<Item = Result<&[u8], &Error>> {
        (0..self.len()).map(move |i| self.sample(i))
    }

    /// The samples that failed, with their position in the batch.
    pub fn errors(&self) -> impl Iterator<Item = (usize, &Error)> {
        self.spans
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().err().map(|e| (i, &**e)))
    }

    /// Bytes of all samples delivered in this batch.
    pub fn bytes(&self) -> u64 {
        self.spans
            .iter()
            .filter_map(|s| s.as_ref().ok())
            .map(|r| r.len() as u64)
            .sum()
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("epoch", &self.meta.epoch)
            .field("index", &self.meta.index)
            .field("samples", &self.meta.ids.len())
            .field("errors", &self.errors().count())
            .finish()
    }
}
