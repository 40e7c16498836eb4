//! Resuming an epoch on another rank count.
//!
//! `W` ranks that stopped together after batch `k` (each had delivered its first `k` batches)
//! leave a *remainder*: each rank's order from position `k × batch_size` to the end of its real
//! samples (padding is a repeat of a sample some rank owns), the ranks' parts one after another.
//! Resumed on `W′` ranks, the remainder is cut among them as the epoch's stream is cut — each
//! rank a contiguous part, by the same `last_batch` rule — so every sample the epoch still owed
//! is delivered exactly once. A run resumed so may stop and resume again: the stops form a
//! chain, and each level's remainder is read through the plans of the level before, one
//! position at a time (nothing of the dataset's size is held where the plans are computed).
//!
//! How the new ranks share the remainder of `m` samples, by `last_batch`:
//! - `short`: balanced contiguous parts (sizes differ by at most one sample);
//! - `pad`: ⌈m / W′⌉ each, the ranks that fall short filled from the remainder's start and
//!   flagged as padding;
//! - `drop`: whole batches, the same number on every rank — ⌈m / (W′ × batch_size)⌉ each, the
//!   positions past `m` filled from the remainder's start and flagged as padding. The samples
//!   the epoch owed are not dropped: the original epoch dropped its tail already.

use std::ops::Range;
use std::sync::Arc;

use super::{
    fit_batches, part_positions, EpochPlan, Ids, LastBatch, PlanConfig, Samples, WindowCache,
};
use crate::error::{invalid, Result};

/// One stop of an epoch that was resumed on another rank count: `world_size` ranks had each
/// delivered their first `batch` batches of it (lockstep training stops them together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stop {
    /// Ranks that read the epoch up to this stop.
    pub world_size: u32,
    /// Batches each of them had delivered.
    pub batch: u32,
}

/// Ranks one stop may name at most (a state's numbers are not trusted to size allocations).
pub const STOP_WORLD_MAX: u32 = 1 << 16;
/// Stops one chain may hold at most.
pub const STOPS_MAX: usize = 64;

/// What the ranks of one stop had not delivered: their remaining real positions, rank after
/// rank.
#[derive(Debug)]
pub(super) struct Remainder {
    /// The stopped ranks' plans (whole: batch part 0 of 1).
    ranks: Vec<EpochPlan>,
    /// Each rank's first remaining position.
    from: Vec<usize>,
    /// Where each rank's remaining positions end in the remainder (cumulated).
    ends: Vec<u64>,
}

impl Remainder {
    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Appends the samples at remainder positions `range` (within `0..len`) to `out`; `caches`
    /// (one per stopped rank) keep each rank's current window between runs.
    fn extend(&self, mut range: Range<u64>, out: &mut Vec<u32>, caches: &mut [WindowCache]) {
        while range.start < range.end {
            let r = self.ends.partition_point(|&e| e <= range.start);
            let begin = if r == 0 { 0 } else { self.ends[r - 1] };
            let upto = range.end.min(self.ends[r]);
            let p = self.from[r] + (range.start - begin) as usize;
            self.ranks[r].extend_ids(p..p + (upto - range.start) as usize, out, &mut caches[r]);
            range.start = upto;
        }
    }

    fn heap_bytes(&self) -> usize {
        self.ranks.iter().map(EpochPlan::heap_bytes).sum::<usize>()
            + self.ranks.capacity() * std::mem::size_of::<EpochPlan>()
            + self.from.capacity() * 8
            + self.ends.capacity() * 8
    }
}

/// A rank's part of a remainder, computed from the position.
#[derive(Debug, Clone)]
pub(super) struct Resumed {
    rest: Arc<Remainder>,
    /// Positions in this part's order.
    pub(super) len: usize,
    /// The rank's first position in the remainder (positions past its end wrap: padding).
    start: u64,
    /// Samples per batch, this part and the number of parts.
    batch: u64,
    part: u64,
    parts: u64,
}

impl Resumed {
    /// The samples at `positions` of this part's order.
    pub(super) fn fill(&self, positions: Range<usize>) -> Vec<u32> {
        let mut out = Vec::with_capacity(positions.len());
        self.fill_into(positions, &mut out);
        out
    }

    /// Appends the samples at `positions` of this part's order to `out`.
    pub(super) fn fill_into(&self, positions: Range<usize>, out: &mut Vec<u32>) {
        let m = self.rest.len();
        let (b, parts, part) = (self.batch, self.parts, self.part);
        let mut caches: Vec<WindowCache> = self
            .rest
            .ranks
            .iter()
            .map(|_| WindowCache::default())
            .collect();
        let (mut p, end) = (positions.start as u64, positions.end as u64);
        while p < end {
            // A run of positions consecutive in the rank's order: one batch of this part (the
            // whole range when the rank reads all its batches).
            let run_end = if parts == 1 {
                end
            } else {
                end.min((p / b + 1) * b)
            };
            let q = (p / b * parts + part) * b + p % b;
            let (mut s, mut left) = (self.start + q, run_end - p);
            while left > 0 {
                let s0 = s % m;
                let take = left.min(m - s0);
                self.rest.extend(s0..s0 + take, out, &mut caches);
                s += take;
                left -= take;
            }
            p = run_end;
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.rest.heap_bytes()
    }
}

impl EpochPlan {
    /// Plans the rest of `epoch` for `cfg.rank` of `cfg.world_size` ranks, after the epoch was
    /// read up to `stops` (oldest first; each on the rank count the one before resumed on, the
    /// first on the epoch's own). Every sample the epoch owed and the stops had not delivered is
    /// delivered exactly once by the `cfg.world_size` ranks together (see the module's doc for
    /// how they share it); with no stops this is [`EpochPlan::new`].
    ///
    /// Fails if a stop names a batch past a rank's epoch, or a rank count outside
    /// 1..=[`STOP_WORLD_MAX`], or more than [`STOPS_MAX`] stops.
    pub fn resumed(
        samples: &Samples,
        cfg: &PlanConfig,
        epoch: u64,
        stops: &[Stop],
    ) -> Result<EpochPlan> {
        if stops.is_empty() {
            return Self::new(samples, cfg, epoch);
        }
        cfg.validate()?;
        if stops.len() > STOPS_MAX {
            return Err(invalid(format!(
                "{} stops in one epoch: at most {STOPS_MAX} are kept",
                stops.len()
            )));
        }
        let b = cfg.batch_size as usize;
        let mut rest: Option<Arc<Remainder>> = None;
        for (i, stop) in stops.iter().enumerate() {
            if stop.world_size == 0 || stop.world_size > STOP_WORLD_MAX {
                return Err(invalid(format!(
                    "stop {i} of epoch {epoch} names {} ranks: expected 1..={STOP_WORLD_MAX}",
                    stop.world_size
                )));
            }
            let mut ranks = Vec::with_capacity(stop.world_size as usize);
            let (mut from, mut ends) = (Vec::new(), Vec::new());
            let mut end = 0u64;
            for r in 0..stop.world_size {
                let c = PlanConfig {
                    rank: r,
                    world_size: stop.world_size,
                    batch_part: (0, 1),
                    ..cfg.clone()
                };
                let plan = match &rest {
                    None => Self::new(samples, &c, epoch)?,
                    Some(rest) => Self::over(samples, &c, epoch, rest.clone())?,
                };
                if stop.batch > plan.batches() {
                    return Err(invalid(format!(
                        "epoch {epoch} stopped at batch {} on {} ranks, but rank {r} had only {} \
                         batches there: the stop does not belong to this dataset and these \
                         settings",
                        stop.batch,
                        stop.world_size,
                        plan.batches()
                    )));
                }
                let real = plan.padding_from();
                let first = (stop.batch as usize * b).min(real);
                end += (real - first) as u64;
                from.push(first);
                ends.push(end);
                ranks.push(plan);
            }
            rest = Some(Arc::new(Remainder { ranks, from, ends }));
        }
        Self::over(samples, cfg, epoch, rest.expect("stops is not empty"))
    }

    /// `cfg.rank`'s part of the remainder `rest`, of `cfg.world_size` ranks.
    fn over(
        samples: &Samples,
        cfg: &PlanConfig,
        epoch: u64,
        rest: Arc<Remainder>,
    ) -> Result<EpochPlan> {
        let m = rest.len();
        let (w, r, b) = (
            cfg.world_size as u64,
            cfg.rank as u64,
            cfg.batch_size as u64,
        );
        let (start, per, real) = match cfg.last_batch {
            LastBatch::Short => {
                let cut = |r: u64| (r as u128 * m as u128 / w as u128) as u64;
                (cut(r), cut(r + 1) - cut(r), cut(r + 1) - cut(r))
            }
            LastBatch::Pad | LastBatch::Drop => {
                let per = if cfg.last_batch == LastBatch::Pad {
                    m.div_ceil(w)
                } else {
                    m.div_ceil(w * b) * b
                };
                let start = r * per;
                (start, per, per.min(m.saturating_sub(start)))
            }
        };
        let (part, parts) = (cfg.batch_part.0 as u64, cfg.batch_part.1.max(1) as u64);
        let len = part_positions(per, b, part, parts) as usize;
        let mut padding_from = part_positions(real, b, part, parts) as usize;
        let mut ids = Ids::Resumed(Resumed {
            rest: rest.clone(),
            len,
            start,
            batch: b,
            part,
            parts,
        });
        // Batches that need evening out (the largest span × the batch size does not fit a
        // slot): the rank's order listed and evened out, as a listed plan is.
        if samples.largest_span(cfg.align as u64).saturating_mul(b) > cfg.group_bytes_max {
            let whole = Resumed {
                rest,
                len: per as usize,
                start,
                batch: b,
                part: 0,
                parts: 1,
            };
            let mut order = whole.fill(0..per as usize);
            fit_batches(
                samples,
                &mut order,
                real as usize,
                b as usize,
                cfg.group_bytes_max,
                cfg.align as u64,
            )?;
            let (order, pf) = cfg.part_of(order, real as usize);
            padding_from = pf;
            ids = Ids::Listed(order);
        }
        Ok(EpochPlan {
            epoch,
            batches: len.div_ceil(b as usize) as u32,
            ids,
            batch_size: cfg.batch_size,
            padding_from,
            // The remainder's windows no longer fall on whole batches of this rank: groups are
            // runs of batches as for the other orders.
            unit: 1,
            per: cfg.window_batches.max(1),
            cfg: cfg.clone(),
        })
    }
}
