//! ⑥ The `Batch` handed to the trainer: sample bytes (views into one slot), ids and labels.

use std::ops::Range;
use std::sync::Arc;

use crate::buf::{Arena, Slot};
use crate::error::Error;

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
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.arena.put(s);
        }
    }
}

/// Where one sample's bytes are in its region, or why it has none.
pub(crate) type SampleSpan = Result<Range<usize>, Arc<Error>>;

/// A batch of samples in host memory.
///
/// The bytes live in a slot of the loader's arena shared with the other batches of the same
/// read group; the slot is reused only after every batch of the group has been dropped, so a
/// batch may be kept as long as needed (holding many keeps their slots from the loader and
/// eventually stalls it).
pub struct Batch {
    pub(crate) epoch: u64,
    pub(crate) index: u32,
    pub(crate) ids: Vec<u32>,
    pub(crate) labels: Vec<i64>,
    pub(crate) spans: Vec<SampleSpan>,
    pub(crate) region: Arc<Region>,
}

impl Batch {
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

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Dataset index of each sample.
    pub fn sample_ids(&self) -> &[u32] {
        &self.ids
    }

    /// Label of each sample (−1 when none).
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// The bytes of sample `i` of the batch, or the error that made them unavailable (it names
    /// the file, the sample and what was wrong). Other samples are unaffected.
    pub fn sample(&self, i: usize) -> Result<&[u8], &Error> {
        match &self.spans[i] {
            Ok(r) => Ok(&self.region.bytes()[r.clone()]),
            Err(e) => Err(e),
        }
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
            .field("epoch", &self.epoch)
            .field("index", &self.index)
            .field("samples", &self.ids.len())
            .field("errors", &self.errors().count())
            .finish()
    }
}
