//! ② What to read: the order of an epoch, its split across ranks, and the reads that serve it.
//!
//! Everything here is a pure function of (dataset index, seed, epoch, rank, world size, mode):
//! the same inputs give the same batches on any machine, so an epoch can be resumed from any
//! batch. No I/O, no `unsafe`.
//!
//! An epoch is cut into batches of `batch_size` samples; consecutive batches form *groups*
//! (at most `window_batches`, at most `group_bytes_max` bytes once laid out) whose samples are
//! read together into one slot. Within a group, samples are sorted by (file, offset) and merged
//! into reads while the gap between two is at most `gap_bytes_max` (the read-amplification
//! limit) and the merged read stays under `read_bytes_max`; the *scatter map* says where each
//! sample sits inside which read.
//!
//! Coalescing is a trade, and this module shows it rather than hiding it: after a `global`
//! shuffle almost nothing merges, while `block` order merges most samples into few reads at
//! some cost in shuffle quality. [`Quality`] puts numbers on both sides.

#![forbid(unsafe_code)]

use std::ops::Range;

use crate::error::{invalid, Result};
use crate::rng::Rng;

mod resume;
pub use resume::{Stop, STOPS_MAX, STOP_WORLD_MAX};

/// The most reads one read group may issue (the engine's `reads_per_job_max` at most:
/// [`crate::config::READS_PER_JOB_MAX`] is this).
pub const READS_PER_GROUP_MAX: u32 = 65536;

/// How an epoch's samples are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum Order {
    /// An exact uniform permutation of all samples every epoch; ranks take interleaved
    /// positions (as PyTorch's DistributedSampler).
    Global,
    /// Shards (files) in a shuffled order, each rank a contiguous part of that stream, cut into
    /// windows of about `buffer` samples (whole batches) whose samples are drawn in random order
    /// — each window read whole, in a few large sequential reads, and shuffled in memory, as
    /// WebDataset's and DALI's shuffle buffers read a shard once and shuffle what they hold.
    ShardBuffer {
        /// Samples shuffled together (a window of the rank's shard stream).
        buffer: u32,
    },
    /// Quasi-random: the dataset cut into blocks of about `block_bytes` consecutive bytes,
    /// blocks shuffled, each rank a contiguous part of that stream; `open_blocks` blocks are open
    /// at a time and their samples are drawn in random order (FFCV-like, deterministic).
    Block {
        /// Bytes of consecutive samples per block (about).
        block_bytes: u64,
        /// Blocks open (drawn from) at a time.
        open_blocks: u32,
    },
    /// No shuffle: the dataset's own order, the same every epoch, each rank a contiguous part
    /// (evaluation; as `DataLoader(shuffle=False)`). Consecutive samples merge into few reads.
    Sequential,
}

impl Order {
    /// The order's name, as the CLI spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Order::Global => "global",
            Order::ShardBuffer { .. } => "shard-buffer",
            Order::Block { .. } => "block",
            Order::Sequential => "sequential",
        }
    }

    /// `global`, `shard-buffer` (buffer 10000), `block` (8 MiB blocks, 8 open) or
    /// `sequential`.
    pub fn parse(s: &str) -> Result<Order> {
        match s {
            "global" => Ok(Order::Global),
            "sequential" => Ok(Order::Sequential),
            "shard-buffer" => Ok(Order::ShardBuffer { buffer: 10_000 }),
            "block" => Ok(Order::Block {
                block_bytes: 8 << 20,
                open_blocks: 8,
            }),
            _ => Err(invalid(format!(
                "unknown order {s:?}; expected global, shard-buffer, block or sequential"
            ))),
        }
    }
}

/// What happens to the samples that do not fill a rank's last batch.
///
/// The epoch contract (DESIGN): an epoch delivers every sample exactly once. `Short` keeps it
/// whatever the sizes; `Drop` gives up the tail; `Pad` repeats samples only to give every rank
/// the same number of samples (as PyTorch's `DistributedSampler`), and flags each repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LastBatch {
    /// Every sample exactly once: a rank's last batch may be short, and with several ranks
    /// their batch counts may differ by one (as `DataLoader` with `drop_last=False`).
    #[default]
    Short,
    /// Every batch full and every rank the same number of batches: the samples that do not
    /// fill them are not read this epoch (fewer than `world_size × batch_size`).
    Drop,
    /// Every rank gets ⌈N / world_size⌉ samples: samples from the start of the epoch's order
    /// are repeated to fill the ranks that fall short, each marked as padding
    /// ([`EpochPlan::is_padding`], `Batch::is_padding`) so evaluation can drop it. The last
    /// batch may still be short. With one rank nothing is ever padded.
    Pad,
}

impl LastBatch {
    /// `short`, `drop` or `pad`.
    pub fn name(self) -> &'static str {
        match self {
            LastBatch::Short => "short",
            LastBatch::Drop => "drop",
            LastBatch::Pad => "pad",
        }
    }

    /// Parses `short`, `drop` or `pad`.
    pub fn parse(s: &str) -> Result<LastBatch> {
        match s {
            "short" => Ok(LastBatch::Short),
            "drop" => Ok(LastBatch::Drop),
            "pad" => Ok(LastBatch::Pad),
            _ => Err(invalid(format!(
                "unknown last_batch {s:?}; expected short, drop or pad"
            ))),
        }
    }
}

/// The most samples a dataset holds (2³² − 1: the loader numbers them with `u32`).
pub const SAMPLES_MAX: u64 = u32::MAX as u64;

/// Every choice that shapes an epoch's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// The epoch order.
    pub order: Order,
    /// The seed every epoch order derives from.
    pub seed: u64,
    /// This rank (0-based).
    pub rank: u32,
    /// Ranks in all.
    pub world_size: u32,
    /// Samples per batch.
    pub batch_size: u32,
    /// What happens to the samples that do not fill a rank's last batch (default: a short
    /// last batch, every sample exactly once).
    pub last_batch: LastBatch,
    /// Batches read together into one slot at most; a block-order or shard-buffer window that
    /// holds more batches is still read whole (if it fits `group_bytes_max`).
    pub window_batches: u32,
    /// Bytes a group may take in its slot (the slot size).
    pub group_bytes_max: u64,
    /// Merge two samples of one file into one read when the gap between them is at most this
    /// (two whose aligned spans touch are merged whatever the gap: they share a block). A loader
    /// left at the default (64 KiB) uses [`gap_for`] its dataset: four mean samples, at most
    /// 64 KiB.
    pub gap_bytes_max: u64,
    /// A merged read is at most this long.
    pub read_bytes_max: u64,
    /// Offset alignment assumed when laying reads out in a slot (≥ every file's O_DIRECT
    /// offset alignment). A loader left at the default (4096) over samples under 16 KiB on
    /// average plans at what its files' direct I/O needs (`statx`, 512 bytes on most disks).
    pub align: u32,
    /// Reads a group may issue at most (the engine's `reads_per_job_max`): a group is never
    /// planned that the engine cannot take.
    pub reads_per_group_max: u32,
    /// Distinct files a group's reads may touch at most (at least `batch_size`): every file of
    /// the groups in flight is open at once, so a loader sets it from the files it may keep
    /// open (a block-order window of thousands of small files would otherwise be one group of
    /// thousands of files). No limit by default.
    pub files_per_group_max: u32,
    /// This part and the number of parts: a plan of `(p, P)` holds the rank's batches `k` with
    /// `k % P == p`, in order, so that `P` loaders (a `DataLoader`'s workers) together deliver
    /// the rank's epoch — each batch once, the batches as one loader makes them, and in its
    /// order when taken from the parts in turn. `(0, 1)`: the whole epoch.
    pub batch_part: (u32, u32),
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            order: Order::Global,
            seed: 0,
            rank: 0,
            world_size: 1,
            batch_size: 256,
            last_batch: LastBatch::Short,
            window_batches: 4,
            group_bytes_max: 128 << 20,
            gap_bytes_max: 64 << 10,
            read_bytes_max: 16 << 20,
            align: 4096,
            reads_per_group_max: READS_PER_GROUP_MAX,
            files_per_group_max: u32::MAX,
            batch_part: (0, 1),
        }
    }
}

impl PlanConfig {
    /// Samples this rank reads per epoch of `n` samples, and how many of them are not padding
    /// (the first ones: padding always comes last in a rank's order).
    pub fn rank_samples(&self, n: usize) -> (usize, usize) {
        let (world, b) = (
            self.world_size.max(1) as usize,
            self.batch_size.max(1) as usize,
        );
        let rank = self.rank as usize;
        match self.last_batch {
            LastBatch::Drop => {
                let k = (n / world) / b * b;
                (k, k)
            }
            LastBatch::Short => {
                let k = self.positions(n).len();
                (k, k)
            }
            LastBatch::Pad => {
                let per = n.div_ceil(world);
                let real = match self.order {
                    // Positions rank, rank + world, … below n.
                    Order::Global => n.saturating_sub(rank).div_ceil(world).min(per),
                    _ => n.saturating_sub(rank * per).min(per),
                };
                (per, real)
            }
        }
    }

    /// This rank's positions in the epoch's whole stream (before padding wraps them): interleaved
    /// for a global shuffle (as DistributedSampler), a contiguous part otherwise (locality).
    fn positions(&self, n: usize) -> Box<dyn ExactSizeIterator<Item = usize>> {
        let world = self.world_size.max(1) as usize;
        let rank = self.rank as usize;
        let b = self.batch_size.max(1) as usize;
        let per = match self.last_batch {
            LastBatch::Drop => (n / world) / b * b,
            LastBatch::Pad => n.div_ceil(world),
            LastBatch::Short => 0, // unused below
        };
        match (self.order, self.last_batch) {
            (Order::Global, LastBatch::Short) => Box::new((rank..n).step_by(world)),
            (Order::Global, _) => Box::new((0..per).map(move |k| k * world + rank)),
            (_, LastBatch::Short) => {
                // Balanced contiguous parts: sizes differ by at most one.
                let cut = |r: usize| (r as u128 * n as u128 / world as u128) as usize;
                Box::new(cut(rank)..cut(rank + 1))
            }
            (_, _) => Box::new(rank * per..(rank + 1) * per),
        }
    }

    /// The same plan reading no gaps between samples: a batch's slot bytes are then at most
    /// the sum of its samples' spans.
    fn without_gaps(&self) -> PlanConfig {
        PlanConfig {
            gap_bytes_max: 0,
            ..self.clone()
        }
    }

    /// Batches this rank reads per epoch of `n` samples (the last may be short): this part's
    /// share of them ([`batch_part`](PlanConfig::batch_part)).
    pub fn rank_batches(&self, n: usize) -> usize {
        let all = self
            .rank_samples(n)
            .0
            .div_ceil(self.batch_size.max(1) as usize);
        let (part, parts) = (
            self.batch_part.0 as usize,
            self.batch_part.1.max(1) as usize,
        );
        all.saturating_sub(part).div_ceil(parts)
    }

    /// The rank's order and where its padding starts, cut to this part's batches.
    fn part_of(&self, order: Vec<u32>, padding_from: usize) -> (Vec<u32>, usize) {
        let (part, parts) = (self.batch_part.0 as usize, self.batch_part.1 as usize);
        if parts <= 1 {
            return (order, padding_from);
        }
        let b = self.batch_size.max(1) as usize;
        let mut kept = Vec::with_capacity(order.len() / parts + b);
        let mut real = 0;
        for (k, batch) in order.chunks(b).enumerate() {
            if k % parts == part {
                // Padding is a suffix of the rank's order, so it stays one of the part's.
                real += padding_from.saturating_sub(k * b).min(batch.len());
                kept.extend_from_slice(batch);
            }
        }
        (kept, real)
    }

    /// Refuses settings outside their limits, naming the setting.
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(invalid(format!(
                "rank {} is not in 0..{} (world size)",
                self.rank, self.world_size
            )));
        }
        if self.batch_size == 0 || self.window_batches == 0 {
            return Err(invalid("batch_size and window_batches must be at least 1"));
        }
        if self.batch_part.0 >= self.batch_part.1 {
            return Err(invalid(format!(
                "batch part {} is not in 0..{} (parts)",
                self.batch_part.0, self.batch_part.1
            )));
        }
        if self.batch_size > self.files_per_group_max {
            return Err(invalid(format!(
                "batch_size {} is above the {} files one group may touch",
                self.batch_size, self.files_per_group_max
            )));
        }
        if self.batch_size > self.reads_per_group_max {
            return Err(invalid(format!(
                "batch_size {} is above the {} reads one group may issue",
                self.batch_size, self.reads_per_group_max
            )));
        }
        if !self.align.is_power_of_two() {
            return Err(invalid(format!(
                "align {} is not a power of two",
                self.align
            )));
        }
        if self.read_bytes_max == 0 || self.read_bytes_max > u32::MAX as u64 {
            return Err(invalid("read_bytes_max must be in 1..4 GiB"));
        }
        match self.order {
            Order::ShardBuffer { buffer: 0 } => {
                Err(invalid("shard-buffer needs a buffer of at least 1 sample"))
            }
            Order::Block {
                block_bytes,
                open_blocks,
            } if block_bytes == 0 || open_blocks == 0 => {
                Err(invalid("block order needs block_bytes and open_blocks ≥ 1"))
            }
            _ => Ok(()),
        }
    }
}

/// One sample of a dataset's index: where its bytes are, its label, and the crc32c of its bytes
/// if the format has one. The planner reads nothing else of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Index into the dataset's files.
    pub file: u32,
    /// Bytes of the sample.
    pub len: u32,
    /// Byte offset of the sample in its file.
    pub offset: u64,
    /// Class label, −1 when none.
    pub label: i64,
    /// crc32c of the bytes (meaningful when the dataset's format has checksums).
    pub crc32c: u32,
}

/// Slot bytes sample `s` takes when read alone: its span widened to `align` at both ends. A
/// batch read without reading through gaps never needs more than the sum of its samples' spans.
pub fn span(s: &Sample, align: u64) -> u64 {
    (s.offset + s.len as u64).div_ceil(align) * align - s.offset / align * align
}

/// What the index says about the slot bytes batches of `batch` samples need: the worst case
/// (the `batch` largest spans together), a typical batch (`batch` × the mean span), and the
/// largest single span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchBytes {
    /// The `batch` largest aligned spans together.
    pub worst: u64,
    /// `batch` × the mean aligned span.
    pub typical: u64,
    /// The largest single aligned span.
    pub largest: u64,
    /// Every aligned span together (the whole dataset read once).
    pub total: u64,
}

impl BatchBytes {
    /// The smallest slot the planner can always fit batches into by moving samples between
    /// neighbouring batches: room for a typical batch and a half, plus the largest sample —
    /// and never more than the whole dataset plus the largest sample, which holds any batch.
    pub fn floor(&self) -> u64 {
        (self.typical + self.typical / 2 + self.largest).min(self.total + self.largest)
    }
}

/// [`BatchBytes`] of `samples` for batches of `batch` (one pass and one selection; no sort).
/// Computed windows are summed per run from one period of their offsets (O(alignment) per
/// run); their worst batch is counted as `batch` × the run's largest span.
pub fn batch_bytes(samples: &Samples, batch: u32, align: u32) -> BatchBytes {
    let a = align.max(1) as u64;
    let n = samples.len();
    if n == 0 {
        return BatchBytes {
            worst: 0,
            typical: 0,
            largest: 0,
            total: 0,
        };
    }
    let b = (batch as usize).clamp(1, n);
    if let Some(runs) = samples.runs() {
        let mut spans: Vec<(u64, u64, u64)> = runs
            .iter()
            .map(|r| {
                let (largest, total) = samples::run_spans(r, a);
                (largest, r.count, total)
            })
            .collect();
        spans.sort_unstable_by(|x, y| y.cmp(x));
        let total: u64 = spans.iter().map(|&(_, _, t)| t).sum();
        let (mut left, mut worst) = (b as u64, 0u64);
        for &(s, c, _) in &spans {
            let k = c.min(left);
            worst += s * k;
            left -= k;
        }
        return BatchBytes {
            worst,
            typical: (total as u128 * b as u128 / n as u128) as u64,
            largest: spans[0].0,
            total,
        };
    }
    let mut spans: Vec<u64> = samples.iter().map(|s| span(&s, a)).collect();
    let total: u64 = spans.iter().sum();
    let largest = spans.iter().copied().max().unwrap_or(0);
    // The b largest: everything from position n − b of a partial order.
    spans.select_nth_unstable(n - b);
    let worst = spans[n - b..].iter().sum();
    BatchBytes {
        worst,
        typical: (total as u128 * b as u128 / n as u128) as u64,
        largest,
        total,
    }
}

/// The most a slot is sized for the sake of large reads alone: a group of `window_batches`
/// batches, or a block-order or shard-buffer window, up to this (a worst-case batch may need
/// more).
pub const SLOT_BYTES_TARGET: u64 = 128 << 20;
/// The largest slot (an io_uring fixed buffer is at most 1 GiB).
pub const SLOT_BYTES_MAX: u64 = 1 << 30;

/// The slot size for `cfg`'s batches, `slots` slots within `budget` bytes, sized from the
/// work: what a group wants — `window_batches` typical batches and the largest sample, or a
/// block-order or shard-buffer window, at most [`SLOT_BYTES_TARGET`] and at most the whole
/// dataset — and never less than the worst case (the batch-size largest samples together) when that fits; else the
/// largest slot the budget allows, as long as it is above [`BatchBytes::floor`] (the planner
/// then evens out the rare batch that would not fit). Rounded up to 2 MiB (huge pages). The
/// error says which setting to change.
pub fn slot_bytes_for(samples: &Samples, cfg: &PlanConfig, slots: u32, budget: u64) -> Result<u64> {
    const MIB: u64 = 1 << 20;
    let batch = cfg.batch_size;
    let bb = batch_bytes(samples, batch, cfg.align);
    let group = (cfg.window_batches as u64)
        .saturating_mul(bb.typical)
        .saturating_add(bb.largest);
    let window = match cfg.order {
        Order::Block {
            block_bytes,
            open_blocks,
        } => block_bytes
            .saturating_mul(open_blocks as u64)
            .saturating_add(bb.largest),
        Order::ShardBuffer { buffer } => {
            let mean = samples.total_len() / samples.len().max(1) as u64;
            (buffer as u64)
                .saturating_mul(mean)
                .saturating_add(bb.largest)
        }
        _ => 0,
    };
    // The slots together never hold more than the rank's share of the dataset and its largest
    // sample (a 30 MB folder of 200 images was given 4 slots of 24 MiB: 96 MiB for 30 MB):
    // each slot then takes its part of that, and never less than a worst-case batch.
    let share = (bb.total / cfg.world_size.max(1) as u64)
        .saturating_add(bb.largest)
        .div_ceil(slots.max(1) as u64);
    let target = group
        .max(window)
        .min(SLOT_BYTES_TARGET)
        .min(bb.total.saturating_add(bb.largest))
        .min(share);
    let cap = (budget / slots.max(1) as u64).min(SLOT_BYTES_MAX) / (2 * MIB) * (2 * MIB);
    let want = bb.worst.max(target).max(1).next_multiple_of(2 * MIB);
    if want <= cap {
        return Ok(want);
    }
    if bb.floor() <= cap {
        return Ok(cap);
    }
    let need = bb.floor().next_multiple_of(2 * MIB);
    let why = if need > SLOT_BYTES_MAX {
        format!("more than the {} MiB a slot may hold", SLOT_BYTES_MAX / MIB)
    } else {
        format!(
            "{} slots (prefetch + in_flight) of it need {} MiB, over the memory \
             budget of {} MiB: raise the memory budget (Rust LoaderBuilder::memory_budget, \
             Python memory_budget=, CLI --memory-budget)",
            slots,
            need * slots as u64 / MIB,
            budget / MIB
        )
    };
    Err(invalid(format!(
        "batches of {} samples need slots of at least {} MiB (a typical batch is {}, the \
         largest sample {}); {why}, or lower batch_size, prefetch or in_flight",
        batch,
        need / MIB,
        crate::util::bytes_human(bb.typical),
        crate::util::bytes_human(bb.largest)
    )))
}

/// Makes every batch of `order` (cut every `b`) fit `limit` slot bytes counted as the sum of
/// its samples' spans, by swapping a batch's largest sample with the smallest of a nearby batch
/// that has room. Only positions before `real` move (padding stays last). Deterministic, and
/// every sample keeps exactly its count, so the epoch contract holds; the shuffle changes only
/// where a batch would not fit, which [`BatchBytes::floor`]-sized slots make rare.
fn fit_batches(
    samples: &Samples,
    order: &mut [u32],
    real: usize,
    b: usize,
    limit: u64,
    align: u64,
) -> Result<()> {
    let sp = |id: u32| span(&samples.get(id as usize), align);
    let n = order.len();
    let batches = n.div_ceil(b);
    let range = |k: usize| k * b..((k + 1) * b).min(n);
    let mut sums: Vec<u64> = (0..batches)
        .map(|k| order[range(k)].iter().map(|&i| sp(i)).sum())
        .collect();
    for k in 0..batches {
        let mut guard = 0;
        while sums[k] > limit {
            guard += 1;
            // The largest movable sample of batch k…
            let r = range(k);
            let Some(x) = r
                .clone()
                .filter(|&p| p < real)
                .max_by_key(|&p| (sp(order[p]), p))
            else {
                break;
            };
            // …goes to the nearest batch whose smallest movable sample makes room for it.
            let mut done = false;
            for d in 1..batches.min(129) {
                for j in [k + d, k.wrapping_sub(d)] {
                    if j >= batches {
                        continue;
                    }
                    let Some(y) = range(j)
                        .filter(|&p| p < real)
                        .min_by_key(|&p| (sp(order[p]), p))
                    else {
                        continue;
                    };
                    let (sx, sy) = (sp(order[x]), sp(order[y]));
                    if sy < sx && sums[j] - sy + sx <= limit {
                        order.swap(x, y);
                        sums[k] = sums[k] - sx + sy;
                        sums[j] = sums[j] - sy + sx;
                        done = true;
                        break;
                    }
                }
                if done {
                    break;
                }
            }
            if !done || guard > b {
                break;
            }
        }
        if sums[k] > limit {
            return Err(invalid(format!(
                "batch {k} needs {} bytes of slot and no nearby batch has room to even it out \
                 (slots of {limit} bytes): raise the memory budget or lower batch_size",
                sums[k]
            )));
        }
    }
    Ok(())
}

/// A seed for one purpose of one epoch.
fn seed_for(seed: u64, epoch: u64, purpose: u64) -> Rng {
    let mut r =
        Rng::new(seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407) ^ purpose.rotate_left(32));
    r.next_u64();
    r
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// Which epoch orders this gpufeed makes: a saved resume point names it, and one saved under
/// another is refused (the same settings would give other batches). 3: the shard-buffer order
/// shuffles windows of `buffer` samples of the shard stream, each drawn by its own seed, the
/// shards ordered by a keyed permutation (2: a shuffle buffer slid through the rank's
/// stream); 2: the global order and the block order's blocks are keyed Feistel permutations
/// computed one position at a time, and each block-order window is shuffled by its own seed
/// (1: Fisher–Yates shuffles run through the whole epoch).
pub const ORDER_VERSION: u32 = 3;

/// The whole-epoch global order of `n` samples: stream position `k` holds sample `at(k)`.
fn global_permutation(seed: u64, epoch: u64, n: usize) -> perm::Permutation {
    perm::Permutation::new(n as u64, seed_for(seed, epoch, 1).next_u64())
}

/// This rank's samples for `epoch`, in order (the last batch may be short). With
/// [`LastBatch::Pad`], the samples from position `cfg.rank_samples(n).1` on are padding.
pub fn epoch_order(samples: &Samples, cfg: &PlanConfig, epoch: u64) -> Result<Vec<u32>> {
    cfg.validate()?;
    let n = samples.len();
    if n == 0 {
        return Err(invalid("the dataset has no samples"));
    }
    if n as u64 > SAMPLES_MAX {
        return Err(invalid(format!(
            "{n} samples: a dataset holds at most {SAMPLES_MAX} (2^32 − 1)"
        )));
    }
    let (per_rank, real) = cfg.rank_samples(n);
    if per_rank == 0 && cfg.last_batch == LastBatch::Drop {
        return Err(invalid(format!(
            "{n} samples over {} ranks do not fill one batch of {} with last_batch=drop",
            cfg.world_size, cfg.batch_size
        )));
    }
    // The whole-epoch stream, then this rank's part of it.
    let stream: Vec<u32> = match cfg.order {
        Order::Global => {
            let p = global_permutation(cfg.seed, epoch, n);
            (0..n as u64).map(|k| p.at(k) as u32).collect()
        }
        Order::ShardBuffer { .. } | Order::Block { .. } => {
            let bs = BlockStream::new(samples, cfg, epoch);
            let mut p = Vec::with_capacity(n);
            for j in 0..bs.ends.len() {
                p.extend(bs.block(j));
            }
            p
        }
        Order::Sequential => (0..n as u32).collect(),
    };
    // This rank's part of the stream; positions past its end wrap around to its start (padding,
    // which only `pad` asks for, and which comes last).
    let mut mine: Vec<u32> = cfg.positions(n).map(|k| stream[k % n]).collect();
    debug_assert_eq!(mine.len(), per_rank);
    // The shuffles within a rank move only its real samples: padding stays last, so that "the
    // samples from position `real` on" are exactly the padded ones.
    let (mine_real, _padding) = mine.split_at_mut(real);
    match cfg.order {
        Order::Global | Order::Sequential => {}
        Order::ShardBuffer { .. } | Order::Block { .. } => {
            // Windows of whole batches (about `open_blocks` blocks, or `buffer` samples of the
            // shard stream): their samples are drawn in random order. A block cut at a window's
            // edge leaves one contiguous run on each side, so every run in a window is one
            // read.
            let w = block_window_samples(samples, cfg);
            let key = window_key(cfg, epoch);
            let mut scratch = Vec::with_capacity(w);
            for (c, chunk) in mine_real.chunks_mut(w).enumerate() {
                let order = window_order(key, c as u64, chunk.len());
                scratch.clear();
                scratch.extend(order.iter().map(|&i| chunk[i as usize]));
                chunk.copy_from_slice(&scratch);
            }
        }
    }
    // Every batch fits a slot, counted without reading through gaps (the planner falls back
    // to that when a batch does not fit with them). Summing every batch reads the index at
    // random (~55 ms for 1.28 M samples), so it is skipped when no batch can exceed the slot:
    // batch_size × the largest span, from one sequential pass.
    let largest = samples.largest_span(cfg.align as u64);
    if largest.saturating_mul(cfg.batch_size as u64) <= cfg.group_bytes_max {
        return Ok(mine);
    }
    fit_batches(
        samples,
        &mut mine,
        real,
        cfg.batch_size as usize,
        cfg.group_bytes_max,
        cfg.align as u64,
    )?;
    Ok(mine)
}

/// Samples per window a rank's samples are drawn from in random order: for the block order,
/// `open_blocks` blocks' worth at the dataset's mean sample size; for shard-buffer, `buffer`
/// samples; rounded to whole batches (at least one). One batch for other orders.
fn block_window_samples(samples: &Samples, cfg: &PlanConfig) -> usize {
    let per_window = match cfg.order {
        Order::Block {
            block_bytes,
            open_blocks,
        } => {
            let mean = samples.total_len() as f64 / samples.len().max(1) as f64;
            open_blocks as f64 * block_bytes as f64 / mean.max(1.0)
        }
        Order::ShardBuffer { buffer } => buffer as f64,
        _ => return cfg.batch_size as usize,
    };
    let batches = (per_window / cfg.batch_size as f64).round().max(1.0) as usize;
    batches * cfg.batch_size as usize
}

/// The block and shard-buffer orders' stream: the dataset's blocks (a shard-buffer order's are
/// its shards) in a keyed order, and where each ends in it.
#[derive(Debug, Clone)]
struct BlockStream {
    /// The dataset's blocks in index order.
    blocks: Vec<Range<u32>>,
    /// The permutation of the blocks: stream block `j` is `blocks[perm.at(j)]`.
    perm: perm::Permutation,
    /// Samples in the stream up to and including stream block `j`.
    ends: Vec<u64>,
}

impl BlockStream {
    /// The stream of `cfg`'s order (block or shard-buffer) for `epoch`.
    fn new(samples: &Samples, cfg: &PlanConfig, epoch: u64) -> BlockStream {
        let (block_bytes, purpose) = match cfg.order {
            Order::Block { block_bytes, .. } => (block_bytes, 3),
            // Whole shards: a block ends only where its file does.
            _ => (u64::MAX, 2),
        };
        let blocks = blocks(samples, block_bytes);
        let perm = perm::Permutation::new(
            blocks.len() as u64,
            seed_for(cfg.seed, epoch, purpose).next_u64(),
        );
        let mut end = 0u64;
        let ends = (0..blocks.len() as u64)
            .map(|j| {
                end += blocks[perm.at(j) as usize].len() as u64;
                end
            })
            .collect();
        BlockStream { blocks, perm, ends }
    }

    /// Stream block `j`'s samples.
    fn block(&self, j: usize) -> Range<u32> {
        self.blocks[self.perm.at(j as u64) as usize].clone()
    }

    /// The stream block holding stream position `k`.
    fn block_at(&self, k: u64) -> usize {
        self.ends.partition_point(|&e| e <= k)
    }

    /// The sample at stream position `k`, which stream block `j` holds.
    fn in_block(&self, j: usize, k: u64) -> u32 {
        let before = if j == 0 { 0 } else { self.ends[j - 1] };
        self.block(j).start + (k - before) as u32
    }

    /// The sample at stream position `k`.
    fn at(&self, k: u64) -> u32 {
        self.in_block(self.block_at(k), k)
    }
}

/// The key of a rank's block-order windows for `epoch`.
fn window_key(cfg: &PlanConfig, epoch: u64) -> u64 {
    seed_for(cfg.seed, epoch, 10 + cfg.rank as u64).next_u64()
}

/// The order within window `c` of `len` samples: position `i` of the window takes its sample
/// `order[i]` — a Fisher–Yates shuffle seeded by (key, c), so any window is drawn without the
/// ones before it (a window is bounded: `open_blocks` blocks' samples).
fn window_order(key: u64, c: u64, len: usize) -> Vec<u32> {
    let mut v: Vec<u32> = (0..len as u32).collect();
    let mut rng = Rng::new(key ^ c.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    rng.next_u64();
    shuffle(&mut v, &mut rng);
    v
}

/// The dataset (in index order) cut into runs of consecutive samples of one file, each about
/// `block_bytes` long (at least one sample). Computed windows are cut per run in O(blocks).
fn blocks(samples: &Samples, block_bytes: u64) -> Vec<Range<u32>> {
    if let Some(runs) = samples.runs() {
        let mut v = Vec::new();
        for r in runs {
            // A block ends at the sample whose bytes reach block_bytes, or at the run's end.
            let k = block_bytes.div_ceil(r.len.max(1) as u64).max(1);
            let mut start = r.first;
            while start < r.first + r.count {
                let end = (start + k).min(r.first + r.count);
                v.push(start as u32..end as u32);
                start = end;
            }
        }
        return v;
    }
    let mut v = Vec::new();
    let mut start = 0usize;
    let mut bytes = 0u64;
    let mut it = samples.iter().enumerate().peekable();
    while let Some((i, s)) = it.next() {
        bytes += s.len as u64;
        let end_here = match it.peek() {
            None => true,
            Some((_, next)) => {
                next.file != s.file || next.offset < s.offset || bytes >= block_bytes
            }
        };
        if end_here {
            v.push(start as u32..i as u32 + 1);
            start = i + 1;
            bytes = 0;
        }
    }
    v
}

/// One read of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedRead {
    /// Index into the dataset's files.
    pub file: u32,
    /// Byte offset of the read in the file.
    pub offset: u64,
    /// Bytes to read.
    pub len: u32,
    /// Where the read's aligned span starts in the group's slot.
    pub buf_offset: u64,
}

/// Where one sample of a group sits: inside which read, at which offset from the read's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Index into the group's reads.
    pub read: u32,
    /// The sample's offset from that read's start.
    pub offset_in_read: u32,
}

/// Consecutive batches read together into one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Batches of the epoch (this rank's numbering) this group serves.
    pub batches: Range<u32>,
    /// The reads, sorted by file and offset.
    pub reads: Vec<PlannedRead>,
    /// One per sample of the group, in epoch order.
    pub scatter: Vec<Placement>,
    /// The group's samples, in epoch order.
    pub ids: Vec<u32>,
    /// Slot bytes the group needs (aligned spans of all reads).
    pub slot_bytes: u64,
    /// Bytes read (aligned spans), and bytes of the samples themselves.
    pub bytes_read: u64,
    /// Bytes of the samples themselves.
    pub bytes_wanted: u64,
}

/// A group's reads, where each sample sits, and the slot bytes they take.
type Coalesced = (Vec<PlannedRead>, Vec<Placement>, u64);

/// Coalesces the samples `ids` (in epoch order) into reads and lays them out in a slot.
pub fn coalesce(samples: &Samples, ids: &[u32], cfg: &PlanConfig) -> Coalesced {
    let a = cfg.align as u64;
    // Each sample's position is looked up once: sorting by a key that reads `samples` would
    // touch the (large, randomly accessed) index on every comparison.
    let mut keyed: Vec<(u32, u64, u32, u32)> = ids
        .iter()
        .enumerate()
        .map(|(k, &id)| {
            let s = samples.get(id as usize);
            (s.file, s.offset, s.len, k as u32)
        })
        .collect();
    keyed.sort_unstable();
    let mut reads: Vec<PlannedRead> = Vec::new();
    let mut scatter = vec![
        Placement {
            read: 0,
            offset_in_read: 0
        };
        ids.len()
    ];
    let mut cur: Option<(u32, u64, u64)> = None; // file, start, end
    let mut first = 0; // first member of the current read in `keyed`
    let mut slot = 0u64;
    let mut close = |cur: (u32, u64, u64),
                     members: &[(u32, u64, u32, u32)],
                     reads: &mut Vec<PlannedRead>,
                     slot: &mut u64| {
        let (file, start, end) = cur;
        let base = start / a * a;
        let span = end.div_ceil(a) * a - base;
        let r = reads.len() as u32;
        reads.push(PlannedRead {
            file,
            offset: start,
            len: (end - start) as u32,
            buf_offset: *slot,
        });
        for &(_, offset, _, k) in members {
            scatter[k as usize] = Placement {
                read: r,
                offset_in_read: (offset - start) as u32,
            };
        }
        *slot += span;
    };
    for (i, &(file, so, len, _)) in keyed.iter().enumerate() {
        let se = so + len as u64;
        cur = match cur {
            Some((f, start, end))
                if f == file
                    // Through a small gap, or where the two share an aligned block (a
                    // direct-I/O block read once, not twice).
                    && (so <= end.saturating_add(cfg.gap_bytes_max) || so / a * a <= end.div_ceil(a) * a)
                    && se.max(end) - start <= cfg.read_bytes_max =>
            {
                Some((f, start, end.max(se)))
            }
            Some(c) => {
                close(c, &keyed[first..i], &mut reads, &mut slot);
                first = i;
                Some((file, so, se))
            }
            None => Some((file, so, se)),
        };
    }
    if let Some(c) = cur {
        close(c, &keyed[first..], &mut reads, &mut slot);
    }
    (reads, scatter, slot)
}

/// The gap a read is merged through by default for `samples`: four mean samples, at most `most`
/// (the 64 KiB default). Merging through a gap saves a read at the cost of the gap's bytes; at
/// four samples' worth a group of scattered 1 KB samples reads near what each sample read alone
/// costs, while large samples keep `most`.
pub fn gap_for(samples: &Samples, most: u64) -> u64 {
    let mean = samples.total_len() / samples.len().max(1) as u64;
    mean.saturating_mul(4).min(most)
}

/// A rank's order for one epoch: listed, or computed one position at a time.
#[derive(Debug, Clone)]
enum Ids {
    /// Every position's sample.
    Listed(Vec<u32>),
    /// Orders whose batches need no evening out: position `p` of
    /// this part's order is computed from `p` (nothing of the epoch's size is held).
    Computed(Computed),
    /// A rank's part of what an epoch stopped on another rank count had left
    /// ([`EpochPlan::resumed`]).
    Resumed(resume::Resumed),
}

/// How the whole-epoch stream maps a stream position to a sample.
#[derive(Debug, Clone)]
enum Stream {
    /// The dataset's own order.
    Identity,
    /// The global order's permutation.
    Global(perm::Permutation),
    /// The block order's shuffled blocks.
    Blocks(std::sync::Arc<BlockStream>),
}

/// An order computed from the position.
#[derive(Debug, Clone)]
struct Computed {
    stream: Stream,
    /// Samples in the dataset.
    n: u64,
    /// Positions in this part's order.
    len: usize,
    /// Where the rank's positions start in the stream, and the step between them.
    start: u64,
    step: u64,
    /// Samples per batch, this part and the number of parts.
    batch: u64,
    part: u64,
    parts: u64,
    /// Block order: the rank's real positions are drawn in random order within windows of
    /// this many (0: none), keyed by `window_key`; `real` of them are real.
    window: u64,
    window_key: u64,
    real: u64,
}

/// What consecutive positions of one window share: its permutation, and the stream blocks
/// its samples lie in (`ends[lo..=hi]`).
#[derive(Default)]
struct WindowCache {
    window: Option<(u64, Vec<u32>)>,
    blocks: Option<(u64, usize, usize)>,
}

impl Computed {
    fn at(&self, p: usize) -> u32 {
        self.at_with(p, &mut WindowCache::default())
    }

    /// Position `p`'s sample; `cache` carries what the positions of one window share.
    fn at_with(&self, p: usize, cache: &mut WindowCache) -> u32 {
        let (b, p) = (self.batch, p as u64);
        // This part's batch p / b is the rank's batch (p / b) × parts + part.
        let mut q = (p / b * self.parts + self.part) * b + p % b;
        let mut window = None;
        if self.window > 0 && q < self.real {
            let c = q / self.window;
            let base = c * self.window;
            let len = self.window.min(self.real - base);
            if cache.window.as_ref().is_none_or(|(wc, _)| *wc != c) {
                cache.window = Some((c, window_order(self.window_key, c, len as usize)));
            }
            let order = &cache.window.as_ref().expect("set above").1;
            q = base + order[(q - base) as usize] as u64;
            window = Some((c, base, len));
        }
        let k = (self.start + q * self.step) % self.n;
        match &self.stream {
            Stream::Identity => k as u32,
            Stream::Global(perm) => perm.at(k) as u32,
            Stream::Blocks(bs) => {
                // A window's samples lie in a few consecutive stream blocks: found once per
                // window, then searched among those alone.
                let span = window.and_then(|(c, base, len)| {
                    let lo = (self.start + base * self.step) % self.n;
                    let hi = lo + (len - 1) * self.step;
                    (hi < self.n).then_some((c, lo, hi))
                });
                if let Some((c, lo, hi)) = span {
                    let (jl, jh) = match cache.blocks {
                        Some((bc, jl, jh)) if bc == c => (jl, jh),
                        _ => {
                            let (jl, jh) = (bs.block_at(lo), bs.block_at(hi));
                            cache.blocks = Some((c, jl, jh));
                            (jl, jh)
                        }
                    };
                    let j = jl + bs.ends[jl..=jh].partition_point(|&e| e <= k);
                    bs.in_block(j, k)
                } else {
                    bs.at(k)
                }
            }
        }
    }
}

impl Ids {
    fn len(&self) -> usize {
        match self {
            Ids::Listed(v) => v.len(),
            Ids::Computed(c) => c.len,
            Ids::Resumed(r) => r.len,
        }
    }
}

/// Positions of part `part` of `parts`'s batches (batch `k` is the part's when
/// `k % parts == part`) among a rank's first `upto` positions, batches of `b`.
fn part_positions(upto: u64, b: u64, part: u64, parts: u64) -> u64 {
    let full = upto / b;
    let whole = full.saturating_sub(part).div_ceil(parts);
    let rest = if full % parts == part { upto % b } else { 0 };
    whole * b + rest
}

/// A rank's plan for one epoch: its order, and the groups it is read in.
///
/// Groups are named by their first batch. The epoch's batches are cut into chunks of `per`
/// batches (the whole block-order or shard-buffer windows `window_batches` holds, at least one; other orders
/// `window_batches`); a group never crosses a chunk's end, and is the longest run of batches
/// (whole windows where one fits) from its first that fits a slot (the whole chunk, usually) —
/// found when asked, from the chunk alone, so a group deep in the epoch costs what the first
/// does.
///
/// An order whose batches all fit a slot as they fall is computed: batch `k`'s samples from
/// `k` in O(batch), nothing of the epoch's size held, so planning the first batch of 10⁹
/// samples costs what planning one batch does. Sets whose batches need evening out list the
/// rank's samples (4 bytes each).
#[derive(Debug, Clone)]
pub struct EpochPlan {
    /// The epoch planned.
    pub epoch: u64,
    ids: Ids,
    /// Samples per batch.
    pub batch_size: u32,
    /// Positions of the order from here on are padding ([`LastBatch::Pad`]).
    padding_from: usize,
    /// Batches per chunk: no group crosses a multiple of it.
    per: u32,
    /// Batches per block-order or shard-buffer window (1 for other orders): groups are whole windows where
    /// they fit.
    unit: u32,
    batches: u32,
    cfg: PlanConfig,
}

impl EpochPlan {
    /// The configuration it was planned under.
    pub fn config(&self) -> &PlanConfig {
        &self.cfg
    }

    /// Plans `epoch` for `cfg.rank`. Fails if one batch alone does not fit `group_bytes_max`.
    pub fn new(samples: &Samples, cfg: &PlanConfig, epoch: u64) -> Result<EpochPlan> {
        match Self::computed(samples, cfg, epoch)? {
            Some(plan) => Ok(plan),
            None => Self::listed(samples, cfg, epoch),
        }
    }

    /// Batches per block-order or shard-buffer window (1 for other orders), and per chunk: the whole windows
    /// within `window_batches`, at least one (a chunk that ended inside a window would split it
    /// between two groups, which read its blocks' regions twice).
    fn per(samples: &Samples, cfg: &PlanConfig) -> (u32, u32) {
        let unit =
            ((block_window_samples(samples, cfg) / cfg.batch_size.max(1) as usize) as u32).max(1);
        (unit, (cfg.window_batches / unit).max(1) * unit)
    }

    /// The plan with the rank's order listed.
    fn listed(samples: &Samples, cfg: &PlanConfig, epoch: u64) -> Result<EpochPlan> {
        let (order, padding_from) = cfg.part_of(
            epoch_order(samples, cfg, epoch)?,
            cfg.rank_samples(samples.len()).1,
        );
        // Every batch fits a slot read without gaps: its slot bytes are at most the sum of its
        // samples' spans, which epoch_order bounded (evening batches out where the largest
        // span × batch size would not fit), and it issues at most batch_size ≤
        // reads_per_group_max reads (validated).
        let (unit, per) = Self::per(samples, cfg);
        Ok(EpochPlan {
            epoch,
            batches: order.len().div_ceil(cfg.batch_size as usize) as u32,
            ids: Ids::Listed(order),
            batch_size: cfg.batch_size,
            padding_from,
            unit,
            per,
            cfg: cfg.clone(),
        })
    }

    /// The computed plan of an order whose batches all fit a slot
    /// as they fall (the largest aligned span × the batch size, read without gaps); `None`
    /// otherwise.
    fn computed(samples: &Samples, cfg: &PlanConfig, epoch: u64) -> Result<Option<EpochPlan>> {
        if !matches!(
            cfg.order,
            Order::Global | Order::Sequential | Order::Block { .. } | Order::ShardBuffer { .. }
        ) {
            return Ok(None);
        }
        cfg.validate()?;
        let n = samples.len();
        let b = cfg.batch_size as u64;
        let largest = samples.largest_span(cfg.align as u64);
        if n == 0 || n > u32::MAX as usize || largest.saturating_mul(b) > cfg.group_bytes_max {
            return Ok(None); // epoch_order says what is wrong, or evens batches out
        }
        let (per_rank, real) = cfg.rank_samples(n);
        if per_rank == 0 && cfg.last_batch == LastBatch::Drop {
            return Ok(None); // epoch_order's error
        }
        let (world, rank) = (cfg.world_size as u64, cfg.rank as u64);
        let (start, step) = match (cfg.order, cfg.last_batch) {
            (Order::Global, _) => (rank, world),
            (_, LastBatch::Short) => ((rank as u128 * n as u128 / world as u128) as u64, 1),
            (_, LastBatch::Drop) => (rank * ((n as u64 / world) / b * b), 1),
            (_, LastBatch::Pad) => (rank * (n as u64).div_ceil(world), 1),
        };
        let (part, parts) = (cfg.batch_part.0 as u64, cfg.batch_part.1.max(1) as u64);
        let positions = |upto: u64| part_positions(upto, b, part, parts);
        let len = positions(per_rank as u64) as usize;
        let padding_from = positions(real as u64) as usize;
        let (unit, per) = Self::per(samples, cfg);
        let (stream, window) = match cfg.order {
            Order::Global => (Stream::Global(global_permutation(cfg.seed, epoch, n)), 0),
            Order::Block { .. } | Order::ShardBuffer { .. } => (
                Stream::Blocks(std::sync::Arc::new(BlockStream::new(samples, cfg, epoch))),
                unit as u64 * b,
            ),
            _ => (Stream::Identity, 0),
        };
        Ok(Some(EpochPlan {
            epoch,
            ids: Ids::Computed(Computed {
                stream,
                n: n as u64,
                len,
                start,
                step,
                batch: b,
                part,
                parts,
                window,
                window_key: window_key(cfg, epoch),
                real: real as u64,
            }),
            batch_size: cfg.batch_size,
            padding_from,
            unit,
            per,
            batches: len.div_ceil(b as usize) as u32,
            cfg: cfg.clone(),
        }))
    }

    /// Whether the order is computed position by position rather than listed.
    pub fn is_computed(&self) -> bool {
        matches!(self.ids, Ids::Computed(_))
    }

    /// Batches in this rank's epoch.
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// Samples in this rank's epoch (this part's), padding included.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the rank's epoch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.ids.len() == 0
    }

    /// The sample at `position` of the rank's order (a computed block order draws the
    /// position's window: [`ids`](EpochPlan::ids) over a range shares it).
    pub fn id(&self, position: usize) -> u32 {
        match &self.ids {
            Ids::Listed(v) => v[position],
            Ids::Computed(c) => {
                assert!(position < c.len, "position {position} of {}", c.len);
                c.at(position)
            }
            Ids::Resumed(r) => {
                assert!(position < r.len, "position {position} of {}", r.len);
                r.fill(position..position + 1)[0]
            }
        }
    }

    /// The samples at `positions` of the rank's order.
    pub fn ids(&self, positions: Range<usize>) -> std::borrow::Cow<'_, [u32]> {
        if let Ids::Listed(v) = &self.ids {
            return std::borrow::Cow::Borrowed(&v[positions]);
        }
        let mut out = Vec::with_capacity(positions.len());
        self.extend_ids(positions, &mut out, &mut WindowCache::default());
        std::borrow::Cow::Owned(out)
    }

    /// Appends the samples at `positions` to `out`; `cache` carries a computed order's window
    /// from one call to the next (a resumed plan reads its remainder a run at a time).
    fn extend_ids(&self, positions: Range<usize>, out: &mut Vec<u32>, cache: &mut WindowCache) {
        assert!(
            positions.end <= self.len(),
            "positions to {} of {}",
            positions.end,
            self.len()
        );
        match &self.ids {
            Ids::Listed(v) => out.extend_from_slice(&v[positions]),
            Ids::Computed(c) => out.extend(positions.map(|p| c.at_with(p, cache))),
            Ids::Resumed(r) => r.fill_into(positions, out),
        }
    }

    /// The rank's whole order (4 bytes per sample; for tests and figures).
    pub fn order(&self) -> Vec<u32> {
        self.ids(0..self.len()).into_owned()
    }

    /// Sample ids of batch `i` (only the last batch may be shorter than `batch_size`).
    pub fn batch(&self, i: u32) -> std::borrow::Cow<'_, [u32]> {
        self.ids(self.batch_range(i))
    }

    /// Positions in the rank's order of batch `i`.
    pub fn batch_range(&self, i: u32) -> Range<usize> {
        let (b, n) = (self.batch_size as usize, self.len());
        (i as usize * b).min(n)..((i as usize + 1) * b).min(n)
    }

    /// Positions of batches `from..to`.
    fn batches_range(&self, from: u32, to: u32) -> Range<usize> {
        self.batch_range(from).start..self.batch_range(to - 1).end
    }

    /// Whether the sample at `position` of the rank's order is padding (a repeat that only
    /// evens out the ranks, [`LastBatch::Pad`]).
    pub fn is_padding(&self, position: usize) -> bool {
        position >= self.padding_from
    }

    /// Positions from here on are padding (the order's length when there is none).
    pub fn padding_from(&self) -> usize {
        self.padding_from
    }

    /// The group starting at batch `first`: the longest run of batches to its chunk's end that
    /// fits a slot (the whole chunk tried first, then the longest by bisection, each candidate
    /// checked), else the batch alone read without gaps. Returns its end, its samples and its
    /// coalesced reads.
    fn group_parts(&self, samples: &Samples, first: u32) -> (u32, Vec<u32>, Coalesced) {
        let chunk_end = (first / self.per + 1)
            .saturating_mul(self.per)
            .min(self.batches);
        // The chunk's samples from `first`, computed once: every candidate is a prefix.
        let mut ids = self.ids(self.batches_range(first, chunk_end)).into_owned();
        let upto = |to: u32| self.batches_range(first, to).len();
        let try_to = |to: u32, cfg: &PlanConfig| {
            let c = coalesce(samples, &ids[..upto(to)], cfg);
            // Reads come sorted by file: its files are where the file changes.
            let files = || 1 + c.0.windows(2).filter(|w| w[0].file != w[1].file).count();
            let fits = c.2 <= self.cfg.group_bytes_max
                && c.0.len() <= self.cfg.reads_per_group_max as usize
                && (c.0.len() <= self.cfg.files_per_group_max as usize
                    || files() <= self.cfg.files_per_group_max as usize);
            (fits, c)
        };
        // The largest run that fits among ends first + k × step, k in 1..most (k = 1 known to
        // fit; `most` does not, or lies past the chunk), by bisection on k.
        let longest = |step: u32, most: u32, fit: Coalesced| {
            let (mut lo, mut hi, mut best) = (1, most, fit);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                match try_to(first + mid * step, &self.cfg) {
                    (true, c) => (lo, best) = (mid, c),
                    (false, _) => hi = mid,
                }
            }
            (first + lo * step, best)
        };
        let (end, c) = 'found: {
            let whole = try_to(chunk_end, &self.cfg);
            if whole.0 {
                break 'found (chunk_end, whole.1);
            }
            // Whole block-order windows where one fits: a window split between groups would
            // read its blocks' regions twice.
            let windows = (chunk_end - first) / self.unit;
            if self.unit > 1 && windows >= 1 && first + self.unit < chunk_end {
                if let (true, one) = try_to(first + self.unit, &self.cfg) {
                    break 'found longest(self.unit, windows + 1, one);
                }
            }
            match try_to(first + 1, &self.cfg) {
                (true, one) => longest(1, chunk_end - first, one),
                (false, _) => {
                    // Reading through gaps made this batch too big: without them it fits
                    // (planned so: see `listed`).
                    let (fits, tight) = try_to(first + 1, &self.cfg.without_gaps());
                    debug_assert!(fits, "batch {first} does not fit its slot read tight");
                    (first + 1, tight)
                }
            }
        };
        ids.truncate(upto(end));
        (end, ids, c)
    }

    /// The first batch of the group holding batch `i` (walks `i`'s chunk from its start).
    pub fn group_of_batch(&self, samples: &Samples, i: u32) -> u32 {
        let mut g = i / self.per * self.per;
        loop {
            let (end, _, _) = self.group_parts(samples, g);
            if i < end {
                return g;
            }
            g = end;
        }
    }

    /// The group whose first batch is `first` (a group's start: 0, or where one ends),
    /// coalesced and laid out.
    pub fn group(&self, samples: &Samples, first: u32) -> Group {
        let (end, ids, (reads, scatter, slot_bytes)) = self.group_parts(samples, first);
        let a = self.cfg.align as u64;
        let bytes_read = reads
            .iter()
            .map(|r| (r.offset + r.len as u64).div_ceil(a) * a - r.offset / a * a)
            .sum();
        Group {
            batches: first..end,
            reads,
            scatter,
            slot_bytes,
            bytes_read,
            bytes_wanted: ids
                .iter()
                .map(|&i| samples.get(i as usize).len as u64)
                .sum(),
            ids,
        }
    }

    /// Every group of the epoch, in order (each coalesced when reached).
    pub fn groups<'a>(&'a self, samples: &'a Samples) -> impl Iterator<Item = Group> + 'a {
        let mut next = 0u32;
        std::iter::from_fn(move || {
            (next < self.batches).then(|| {
                let g = self.group(samples, next);
                next = g.batches.end;
                g
            })
        })
    }

    /// Heap bytes this plan holds (a block order's blocks, 16 bytes each, aside).
    pub fn heap_bytes(&self) -> usize {
        match &self.ids {
            Ids::Listed(v) => v.capacity() * 4,
            Ids::Computed(_) => 0,
            Ids::Resumed(r) => r.heap_bytes(),
        }
    }
}

/// Shuffle-quality and I/O figures of one rank's epoch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Quality {
    /// The order's name.
    pub mode: &'static str,
    /// Samples in the rank's epoch.
    pub samples: u64,
    /// Batches in the rank's epoch.
    pub batches: u32,
    /// Reads issued per sample delivered.
    pub reads_per_sample: f64,
    /// Bytes read (aligned) per byte delivered.
    pub read_amplification: f64,
    /// Mean number of distinct files (shards) contributing to a batch.
    pub files_per_batch: f64,
    /// Mean number of distinct labels in a batch, and what a global shuffle would give.
    pub labels_per_batch: f64,
    /// The same for a global shuffle of the same dataset.
    pub labels_per_batch_global: f64,
    /// |Pearson correlation| between a sample's place in the dataset and in the epoch: 0 for a
    /// global shuffle, 1 for sequential reading.
    pub index_correlation: f64,
}

/// Computes [`Quality`] for a plan (walks every group once).
pub fn quality(samples: &Samples, plan: &EpochPlan) -> Quality {
    let mut reads = 0u64;
    let mut read_bytes = 0u64;
    let mut wanted = 0u64;
    let mut files = 0usize;
    let mut labels = 0usize;
    let mut scratch: Vec<i64> = Vec::new();
    // Correlation between dataset index and epoch position, from the groups' samples (a group
    // starts at a batch, so its samples cut every batch_size are its batches).
    let (mut sx, mut sy, mut sxx, mut syy, mut sxy) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let mut pos = 0usize;
    for gr in plan.groups(samples) {
        reads += gr.reads.len() as u64;
        read_bytes += gr.bytes_read;
        wanted += gr.bytes_wanted;
        for ids in gr.ids.chunks(plan.batch_size.max(1) as usize) {
            scratch.clear();
            scratch.extend(ids.iter().map(|&i| samples.get(i as usize).file as i64));
            scratch.sort_unstable();
            scratch.dedup();
            files += scratch.len();
            scratch.clear();
            scratch.extend(ids.iter().map(|&i| samples.get(i as usize).label));
            scratch.sort_unstable();
            scratch.dedup();
            labels += scratch.len();
        }
        for &id in &gr.ids {
            let (x, y) = (id as f64, pos as f64);
            sx += x;
            sy += y;
            sxx += x * x;
            syy += y * y;
            sxy += x * y;
            pos += 1;
        }
    }
    // Expected distinct labels in a uniformly random batch: Σ_c 1 − (1 − p_c)^B.
    let mut counts = std::collections::HashMap::new();
    for s in samples.iter() {
        *counts.entry(s.label).or_insert(0u64) += 1;
    }
    let n = samples.len() as f64;
    let bsz = plan.batch_size as f64;
    let expected: f64 = counts
        .values()
        .map(|&c| 1.0 - (1.0 - c as f64 / n).powf(bsz))
        .sum();
    let m = plan.len() as f64;
    let cov = sxy / m - (sx / m) * (sy / m);
    let vx = sxx / m - (sx / m).powi(2);
    let vy = syy / m - (sy / m).powi(2);
    let corr = if vx > 0.0 && vy > 0.0 {
        (cov / (vx.sqrt() * vy.sqrt())).abs()
    } else {
        0.0
    };
    let nb = plan.batches().max(1) as f64;
    Quality {
        mode: plan.cfg.order.name(),
        samples: plan.len() as u64,
        batches: plan.batches(),
        reads_per_sample: reads as f64 / m,
        read_amplification: if wanted > 0 {
            read_bytes as f64 / wanted as f64
        } else {
            0.0
        },
        files_per_batch: files as f64 / nb,
        labels_per_batch: labels as f64 / nb,
        labels_per_batch_global: expected,
        index_correlation: corr,
    }
}

pub mod perm;
mod samples;
pub(crate) use samples::{Compact, SamplesBuilder, SharedBytes};
pub use samples::{Run, Samples};

#[cfg(test)]
mod tests;
