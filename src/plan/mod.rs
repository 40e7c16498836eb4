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
    /// Shards (files) in a shuffled order, each rank a contiguous part of that stream, then a
    /// shuffle buffer of `buffer` samples (as WebDataset and DALI do).
    ShardBuffer {
        /// Samples in the shuffle buffer.
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
    /// Batches read together into one slot at most; a block-order window that holds more
    /// batches is still read whole (if it fits `group_bytes_max`).
    pub window_batches: u32,
    /// Bytes a group may take in its slot (the slot size).
    pub group_bytes_max: u64,
    /// Merge two samples of one file into one read when the gap between them is at most this.
    pub gap_bytes_max: u64,
    /// A merged read is at most this long.
    pub read_bytes_max: u64,
    /// Offset alignment assumed when laying reads out in a slot (≥ every file's O_DIRECT
    /// offset alignment).
    pub align: u32,
    /// Reads a group may issue at most (the engine's `reads_per_job_max`): a group is never
    /// planned that the engine cannot take.
    pub reads_per_group_max: u32,
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
pub fn batch_bytes(samples: &[Sample], batch: u32, align: u32) -> BatchBytes {
    let a = align.max(1) as u64;
    let mut spans: Vec<u64> = samples.iter().map(|s| span(s, a)).collect();
    let n = spans.len();
    if n == 0 {
        return BatchBytes {
            worst: 0,
            typical: 0,
            largest: 0,
            total: 0,
        };
    }
    let b = (batch as usize).clamp(1, n);
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
/// batches, or a block-order window, up to this (a worst-case batch may need more).
pub const SLOT_BYTES_TARGET: u64 = 128 << 20;
/// The largest slot (an io_uring fixed buffer is at most 1 GiB).
pub const SLOT_BYTES_MAX: u64 = 1 << 30;

/// The slot size for `cfg`'s batches, `slots` slots within `budget` bytes, sized from the
/// work: what a group wants — `window_batches` typical batches and the largest sample, or a
/// block-order window, at most [`SLOT_BYTES_TARGET`] and at most the whole dataset — and never
/// less than the worst case (the batch-size largest samples together) when that fits; else the
/// largest slot the budget allows, as long as it is above [`BatchBytes::floor`] (the planner
/// then evens out the rare batch that would not fit). Rounded up to 2 MiB (huge pages). The
/// error says which setting to change.
pub fn slot_bytes_for(
    samples: &[Sample],
    cfg: &PlanConfig,
    slots: u32,
    budget: u64,
) -> Result<u64> {
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
        _ => 0,
    };
    let target = group
        .max(window)
        .min(SLOT_BYTES_TARGET)
        .min(bb.total.saturating_add(bb.largest));
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
    samples: &[Sample],
    order: &mut [u32],
    real: usize,
    b: usize,
    limit: u64,
    align: u64,
) -> Result<()> {
    let sp = |id: u32| span(&samples[id as usize], align);
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

/// This rank's samples for `epoch`, in order (the last batch may be short). With
/// [`LastBatch::Pad`], the samples from position `cfg.rank_samples(n).1` on are padding.
pub fn epoch_order(samples: &[Sample], cfg: &PlanConfig, epoch: u64) -> Result<Vec<u32>> {
    cfg.validate()?;
    let n = samples.len();
    if n == 0 {
        return Err(invalid("the dataset has no samples"));
    }
    if n > u32::MAX as usize {
        return Err(invalid("more than 2^32 samples"));
    }
    let (per_rank, real) = cfg.rank_samples(n);
    if per_rank == 0 && cfg.last_batch == LastBatch::Drop {
        return Err(invalid(format!(
            "{n} samples over {} ranks do not fill one batch of {} with last_batch=drop",
            cfg.world_size, cfg.batch_size
        )));
    }
    let rank = cfg.rank as usize;
    // The whole-epoch stream, then this rank's part of it.
    let stream: Vec<u32> = match cfg.order {
        Order::Global => {
            let mut p: Vec<u32> = (0..n as u32).collect();
            shuffle(&mut p, &mut seed_for(cfg.seed, epoch, 1));
            p
        }
        Order::ShardBuffer { .. } => {
            let mut files: Vec<u32> = samples.iter().map(|s| s.file).collect();
            files.sort_unstable();
            files.dedup();
            shuffle(&mut files, &mut seed_for(cfg.seed, epoch, 2));
            let mut place_of_file = vec![0u32; files.iter().max().map_or(0, |&m| m as usize + 1)];
            for (pos, &f) in files.iter().enumerate() {
                place_of_file[f as usize] = pos as u32;
            }
            let mut p: Vec<u32> = (0..n as u32).collect();
            // Stable: samples keep their order within a shard.
            p.sort_by_key(|&i| place_of_file[samples[i as usize].file as usize]);
            p
        }
        Order::Block { block_bytes, .. } => {
            let blocks = blocks(samples, block_bytes);
            let mut order: Vec<u32> = (0..blocks.len() as u32).collect();
            shuffle(&mut order, &mut seed_for(cfg.seed, epoch, 3));
            let mut p = Vec::with_capacity(n);
            for bi in order {
                p.extend(blocks[bi as usize].clone());
            }
            p
        }
        Order::Sequential => (0..n as u32).collect(),
    };
    // This rank's part of the stream; positions past its end wrap around to its start (padding,
    // which only `pad` asks for, and which comes last).
    let mut mine: Vec<u32> = cfg.positions(n).map(|k| stream[k % n]).collect();
    debug_assert_eq!(mine.len(), per_rank);
    let mut rng = seed_for(cfg.seed, epoch, 10 + rank as u64);
    // The shuffles within a rank move only its real samples: padding stays last, so that "the
    // samples from position `real` on" are exactly the padded ones.
    let (mine_real, _padding) = mine.split_at_mut(real);
    match cfg.order {
        Order::Global | Order::Sequential => {}
        Order::ShardBuffer { buffer } => shuffle_buffer(mine_real, buffer as usize, &mut rng),
        Order::Block { .. } => {
            // Windows of whole batches, each about `open_blocks` blocks: their samples are
            // drawn in random order. A block cut at a window's edge leaves one contiguous run
            // on each side, so every run in a window is one read.
            let w = block_window_samples(samples, cfg);
            for chunk in mine_real.chunks_mut(w) {
                shuffle(chunk, &mut rng);
            }
        }
    }
    // Every batch fits a slot, counted without reading through gaps (the planner falls back
    // to that when a batch does not fit with them). Summing every batch reads the index at
    // random (~55 ms for 1.28 M samples), so it is skipped when no batch can exceed the slot:
    // batch_size × the largest span, from one sequential pass.
    let a = cfg.align as u64;
    let largest = samples.iter().map(|s| span(s, a)).max().unwrap_or(0);
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

/// Samples per block-order window: `open_blocks` blocks' worth at the dataset's mean sample
/// size, rounded to whole batches (at least one).
fn block_window_samples(samples: &[Sample], cfg: &PlanConfig) -> usize {
    let Order::Block {
        block_bytes,
        open_blocks,
    } = cfg.order
    else {
        return cfg.batch_size as usize;
    };
    let mean =
        samples.iter().map(|s| s.len as u64).sum::<u64>() as f64 / samples.len().max(1) as f64;
    let per_window = open_blocks as f64 * block_bytes as f64 / mean.max(1.0);
    let batches = (per_window / cfg.batch_size as f64).round().max(1.0) as usize;
    batches * cfg.batch_size as usize
}

/// The dataset (in index order) cut into runs of consecutive samples of one file, each about
/// `block_bytes` long (at least one sample).
fn blocks(samples: &[Sample], block_bytes: u64) -> Vec<Range<u32>> {
    let mut v = Vec::new();
    let mut start = 0usize;
    let mut bytes = 0u64;
    for i in 0..samples.len() {
        bytes += samples[i].len as u64;
        let end_here = i + 1 == samples.len()
            || samples[i + 1].file != samples[i].file
            || samples[i + 1].offset < samples[i].offset
            || bytes >= block_bytes;
        if end_here {
            v.push(start as u32..i as u32 + 1);
            start = i + 1;
            bytes = 0;
        }
    }
    v
}

/// A shuffle buffer of `q` samples over `v`, in place.
fn shuffle_buffer(v: &mut [u32], q: usize, rng: &mut Rng) {
    let q = q.min(v.len());
    let mut buf: Vec<u32> = v[..q].to_vec();
    let mut out = 0;
    for k in q..v.len() {
        let j = rng.below(q as u64) as usize;
        let next = v[k];
        v[out] = buf[j];
        buf[j] = next;
        out += 1;
    }
    shuffle(&mut buf, rng);
    v[out..].copy_from_slice(&buf);
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
    /// Slot bytes the group needs (aligned spans of all reads).
    pub slot_bytes: u64,
    /// Bytes read (aligned spans), and bytes of the samples themselves.
    pub bytes_read: u64,
    /// Bytes of the samples themselves.
    pub bytes_wanted: u64,
}

/// Coalesces the samples `ids` (in epoch order) into reads and lays them out in a slot.
pub fn coalesce(
    samples: &[Sample],
    ids: &[u32],
    cfg: &PlanConfig,
) -> (Vec<PlannedRead>, Vec<Placement>, u64) {
    let a = cfg.align as u64;
    // Each sample's position is looked up once: sorting by a key that reads `samples` would
    // touch the (large, randomly accessed) index on every comparison.
    let mut keyed: Vec<(u32, u64, u32, u32)> = ids
        .iter()
        .enumerate()
        .map(|(k, &id)| {
            let s = &samples[id as usize];
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
                    && so <= end.saturating_add(cfg.gap_bytes_max)
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

/// A rank's plan for one epoch: its order, and the groups it is read in.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    /// The epoch planned.
    pub epoch: u64,
    /// This rank's samples (dataset indices) in epoch order, padding last.
    pub order: Vec<u32>,
    /// Samples per batch.
    pub batch_size: u32,
    /// Positions of `order` from here on are padding ([`LastBatch::Pad`]).
    padding_from: usize,
    /// First batch of every group, and the number of batches.
    group_starts: Vec<u32>,
    /// First batches of the groups coalesced without reading through gaps (sorted).
    tight: Vec<u32>,
    batches: u32,
    cfg: PlanConfig,
}

impl EpochPlan {
    /// The configuration it was planned under.
    pub fn config(&self) -> &PlanConfig {
        &self.cfg
    }

    /// Plans `epoch` for `cfg.rank`. Fails if one batch alone does not fit `group_bytes_max`.
    pub fn new(samples: &[Sample], cfg: &PlanConfig, epoch: u64) -> Result<EpochPlan> {
        let (order, padding_from) = cfg.part_of(
            epoch_order(samples, cfg, epoch)?,
            cfg.rank_samples(samples.len()).1,
        );
        let b = cfg.batch_size as usize;
        // The last batch may be short.
        let batches = order.len().div_ceil(b) as u32;
        let ids =
            |from: u32, to: u32| &order[from as usize * b..(to as usize * b).min(order.len())];
        // Groups are made of whole block-order windows where they fit, so that no window's
        // blocks are split between two slots (single batches otherwise).
        let unit = (block_window_samples(samples, cfg) / b) as u32;
        let max_batches = cfg.window_batches.max(unit);
        // A run of batches fits a slot when its coalesced reads fit both the slot's bytes and
        // the engine's reads per job.
        let tight_cfg = cfg.without_gaps();
        let fits = |from: u32, to: u32, c: &PlanConfig| {
            let (reads, _, slot) = coalesce(samples, ids(from, to), c);
            (
                slot,
                slot <= cfg.group_bytes_max && reads.len() <= cfg.reads_per_group_max as usize,
            )
        };
        let mut group_starts = Vec::new();
        let mut tight = Vec::new();
        let mut g = 0u32;
        while g < batches {
            group_starts.push(g);
            // Whole windows where one fits, else single batches; the group is the longest run
            // of such steps, up to `max_batches`, that fits — tried longest first, so a group
            // that fits whole (the usual case) is coalesced once.
            let unit_end = (g + unit).min(batches);
            let step = if unit_end - g > 1 && fits(g, unit_end, cfg).1 {
                unit
            } else {
                1
            };
            let steps = (max_batches / step).max(1);
            let mut end = None;
            for k in (1..=steps).rev() {
                let e = (g + k * step).min(batches);
                if k > 1 && e == (g + (k - 1) * step).min(batches) {
                    continue; // capped at the last batch: same group as k − 1
                }
                if fits(g, e, cfg).1 {
                    end = Some(e);
                    break;
                }
                if k == 1 {
                    // Reading through gaps made this batch too big: read it without them (its
                    // bytes are then at most its samples' spans, which fit_batches bounded).
                    let (need, ok) = fits(g, e, &tight_cfg);
                    if !ok {
                        return Err(invalid(format!(
                            "batch {g} needs {need} bytes of slot, more than group_bytes_max \
                             {}: raise the memory budget or lower batch_size",
                            cfg.group_bytes_max
                        )));
                    }
                    tight.push(g);
                    end = Some(e);
                }
            }
            g = end.expect("k = 1 fits or returned");
        }
        Ok(EpochPlan {
            epoch,
            order,
            batch_size: cfg.batch_size,
            padding_from,
            group_starts,
            tight,
            batches,
            cfg: cfg.clone(),
        })
    }

    /// Batches in this rank's epoch.
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// Number of groups.
    pub fn groups(&self) -> usize {
        self.group_starts.len()
    }

    /// Sample ids of batch `i` (only the last batch may be shorter than `batch_size`).
    pub fn batch(&self, i: u32) -> &[u32] {
        &self.order[self.batch_range(i)]
    }

    /// Positions in [`order`](EpochPlan::order) of batch `i`.
    pub fn batch_range(&self, i: u32) -> Range<usize> {
        let b = self.batch_size as usize;
        (i as usize * b).min(self.order.len())..((i as usize + 1) * b).min(self.order.len())
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

    /// The group holding batch `i`.
    pub fn group_of_batch(&self, i: u32) -> usize {
        self.group_starts.partition_point(|&s| s <= i) - 1
    }

    /// Group `g`, coalesced and laid out.
    pub fn group(&self, samples: &[Sample], g: usize) -> Group {
        let start = self.group_starts[g];
        let end = self
            .group_starts
            .get(g + 1)
            .copied()
            .unwrap_or(self.batches);
        let ids = &self.order[self.batch_range(start).start..self.batch_range(end - 1).end];
        let (reads, scatter, slot_bytes) = if self.tight.binary_search(&start).is_ok() {
            coalesce(samples, ids, &self.cfg.without_gaps())
        } else {
            coalesce(samples, ids, &self.cfg)
        };
        let a = self.cfg.align as u64;
        let bytes_read = reads
            .iter()
            .map(|r| (r.offset + r.len as u64).div_ceil(a) * a - r.offset / a * a)
            .sum();
        Group {
            batches: start..end,
            reads,
            scatter,
            slot_bytes,
            bytes_read,
            bytes_wanted: ids.iter().map(|&i| samples[i as usize].len as u64).sum(),
        }
    }

    /// Heap bytes this plan holds.
    pub fn heap_bytes(&self) -> usize {
        self.order.capacity() * 4 + self.group_starts.capacity() * 4
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
pub fn quality(samples: &[Sample], plan: &EpochPlan) -> Quality {
    let mut reads = 0u64;
    let mut read_bytes = 0u64;
    let mut wanted = 0u64;
    for g in 0..plan.groups() {
        let gr = plan.group(samples, g);
        reads += gr.reads.len() as u64;
        read_bytes += gr.bytes_read;
        wanted += gr.bytes_wanted;
    }
    let mut files = 0usize;
    let mut labels = 0usize;
    let mut scratch: Vec<i64> = Vec::new();
    for b in 0..plan.batches() {
        let ids = plan.batch(b);
        scratch.clear();
        scratch.extend(ids.iter().map(|&i| samples[i as usize].file as i64));
        scratch.sort_unstable();
        scratch.dedup();
        files += scratch.len();
        scratch.clear();
        scratch.extend(ids.iter().map(|&i| samples[i as usize].label));
        scratch.sort_unstable();
        scratch.dedup();
        labels += scratch.len();
    }
    // Expected distinct labels in a uniformly random batch: Σ_c 1 − (1 − p_c)^B.
    let mut counts = std::collections::HashMap::new();
    for s in samples {
        *counts.entry(s.label).or_insert(0u64) += 1;
    }
    let n = samples.len() as f64;
    let bsz = plan.batch_size as f64;
    let expected: f64 = counts
        .values()
        .map(|&c| 1.0 - (1.0 - c as f64 / n).powf(bsz))
        .sum();
    // Correlation between dataset index and epoch position.
    let m = plan.order.len() as f64;
    let (mut sx, mut sy, mut sxx, mut syy, mut sxy) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (pos, &id) in plan.order.iter().enumerate() {
        let (x, y) = (id as f64, pos as f64);
        sx += x;
        sy += y;
        sxx += x * x;
        syy += y * y;
        sxy += x * y;
    }
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
        samples: plan.order.len() as u64,
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

#[cfg(test)]
mod tests;
