//! Which extents a node cache keeps when the dataset does not fit: the policies compared for
//! the node cache (issue 25), replayed over the access order an epoch plan gives.
//!
//! Every extent is read once per epoch. Then no policy serves more than `capacity / extents` of
//! an epoch's reads from the cache, and "keep what fits" (fill to the limit, then serve the rest
//! straight through without writing it) reaches that bound every epoch, whatever the order.
//! Recency policies do worse: in a shuffled order the extent evicted is as likely as any to be
//! needed soon, and in the same order every epoch LRU evicts exactly the next one needed
//! (0 hits). gpufeed knows every epoch's order in advance, so furthest-next-use (Belady's MIN)
//! is possible too: it is optimal for any access pattern, uneven ones included.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::rng::Rng;

/// An eviction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Admit while there is room, never evict: later misses are served without caching.
    KeepWhatFits,
    /// Evict the least recently used extent.
    Lru,
    /// Evict the extent cached first.
    Fifo,
    /// Of two extents drawn at random, evict the less recently used (seeded).
    Random2(u64),
    /// Evict the extent whose next use is furthest away (or never): Belady's MIN, which needs
    /// the future — the epochs' orders.
    FurthestNextUse,
}

/// What one epoch of a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochHits {
    /// Reads served by the cache.
    pub hits: u64,
    /// Reads fetched from the source.
    pub misses: u64,
    /// Fetched extents written to the cache.
    pub admitted: u64,
}

impl EpochHits {
    /// Hits over reads.
    pub fn ratio(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

/// Replays `epochs` (each the extent ids in the order read) through a cache of `capacity`
/// extents under `policy`, starting empty.
pub fn replay(policy: Policy, capacity: usize, epochs: &[Vec<u32>]) -> Vec<EpochHits> {
    // Each access's position in the whole sequence and the next position of the same extent
    // (for furthest-next-use).
    let total: usize = epochs.iter().map(Vec::len).sum();
    let mut next_use = vec![u64::MAX; total];
    if policy == Policy::FurthestNextUse {
        let mut seen: HashMap<u32, u64> = HashMap::new();
        let all: Vec<u32> = epochs.iter().flatten().copied().collect();
        for (i, &x) in all.iter().enumerate().rev() {
            next_use[i] = seen.get(&x).copied().unwrap_or(u64::MAX);
            seen.insert(x, i as u64);
        }
    }
    let mut resident: HashMap<u32, u64> = HashMap::new(); // extent → last use (or next use)
    let mut order: VecDeque<u32> = VecDeque::new(); // FIFO: insertion order
    let mut by_next: BTreeSet<(u64, u32)> = BTreeSet::new(); // furthest-next-use: (next, extent)
    let mut by_last: BTreeSet<(u64, u32)> = BTreeSet::new(); // LRU: (last use, extent)
                                                             // Random-2 reads the last use from `resident` and draws from `keys`.
    let mut rng = match policy {
        Policy::Random2(seed) => Rng::new(seed),
        _ => Rng::new(0),
    };
    let mut keys: Vec<u32> = Vec::new(); // Random2: residents, for drawing
    let mut slot_of: HashMap<u32, usize> = HashMap::new();
    let mut out = Vec::with_capacity(epochs.len());
    let mut t = 0u64;
    for epoch in epochs {
        let mut e = EpochHits::default();
        for &x in epoch {
            let now = t;
            t += 1;
            let next = next_use[now as usize];
            if let Some(stamp) = resident.get_mut(&x) {
                e.hits += 1;
                match policy {
                    Policy::Lru => {
                        by_last.remove(&(*stamp, x));
                        *stamp = now;
                        by_last.insert((now, x));
                    }
                    Policy::Random2(_) => *stamp = now,
                    Policy::FurthestNextUse => {
                        by_next.remove(&(*stamp, x));
                        *stamp = next;
                        by_next.insert((next, x));
                    }
                    Policy::KeepWhatFits | Policy::Fifo => {}
                }
                continue;
            }
            e.misses += 1;
            if capacity == 0 {
                continue;
            }
            if resident.len() == capacity {
                let victim = match policy {
                    Policy::KeepWhatFits => None,
                    Policy::Lru => by_last.pop_first().map(|(_, v)| v),
                    Policy::Fifo => order.pop_front(),
                    Policy::Random2(_) => {
                        let a = keys[rng.below(keys.len() as u64) as usize];
                        let b = keys[rng.below(keys.len() as u64) as usize];
                        Some(if resident[&a] <= resident[&b] { a } else { b })
                    }
                    Policy::FurthestNextUse => {
                        // Not worth caching if it is needed later than every resident.
                        let (far, v) = *by_next.last().expect("full cache");
                        if next >= far {
                            None
                        } else {
                            by_next.pop_last();
                            Some(v)
                        }
                    }
                };
                let Some(v) = victim else { continue };
                resident.remove(&v);
                if let Some(i) = slot_of.remove(&v) {
                    let last = keys.pop().expect("resident");
                    if last != v {
                        keys[i] = last;
                        slot_of.insert(last, i);
                    }
                }
            }
            e.admitted += 1;
            match policy {
                Policy::Lru => {
                    resident.insert(x, now);
                    by_last.insert((now, x));
                }
                Policy::Random2(_) => {
                    resident.insert(x, now);
                    slot_of.insert(x, keys.len());
                    keys.push(x);
                }
                Policy::FurthestNextUse => {
                    resident.insert(x, next);
                    by_next.insert((next, x));
                }
                Policy::Fifo => {
                    resident.insert(x, now);
                    order.push_back(x);
                }
                Policy::KeepWhatFits => {
                    resident.insert(x, now);
                }
            }
        }
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `epochs` shuffled orders of `n` extents (or the same order each time).
    fn orders(n: u32, epochs: u64, shuffled: bool) -> Vec<Vec<u32>> {
        (0..epochs)
            .map(|e| {
                let mut v: Vec<u32> = (0..n).collect();
                if shuffled {
                    let mut r = Rng::new(1000 + e);
                    for i in (1..v.len()).rev() {
                        v.swap(i, r.below(i as u64 + 1) as usize);
                    }
                }
                v
            })
            .collect()
    }

    /// Mean hit ratio of the epochs after the first.
    fn later(h: &[EpochHits]) -> f64 {
        h[1..].iter().map(EpochHits::ratio).sum::<f64>() / (h.len() - 1) as f64
    }

    #[test]
    fn keep_what_fits_reaches_the_bound_and_recency_does_not() {
        // 2,000 extents, 4 epochs, a cache of half the dataset: the simulation.
        let shuffled = orders(2000, 4, true);
        let kwf = replay(Policy::KeepWhatFits, 1000, &shuffled);
        let lru = replay(Policy::Lru, 1000, &shuffled);
        let fifo = replay(Policy::Fifo, 1000, &shuffled);
        let r2 = replay(Policy::Random2(7), 1000, &shuffled);
        let min = replay(Policy::FurthestNextUse, 1000, &shuffled);
        for h in [&kwf, &lru, &fifo, &r2, &min] {
            assert_eq!(h[0].hits, 0, "the first epoch starts cold");
            assert!(h.iter().all(|e| e.hits + e.misses == 2000));
        }
        // Keep-what-fits: exactly cache/dataset after the first epoch, every epoch; it writes
        // only the first 1,000 extents.
        for e in &kwf[1..] {
            assert_eq!(e.hits, 1000);
            assert_eq!(e.admitted, 0);
        }
        let (k, l, f, r, m) = (
            later(&kwf),
            later(&lru),
            later(&fifo),
            later(&r2),
            later(&min),
        );
        assert!(
            l < 0.2 && f < 0.3 && r < 0.35,
            "lru {l}, fifo {f}, random-2 {r}"
        );
        assert!(
            m >= k,
            "furthest-next-use {m} is optimal, keep-what-fits {k}"
        );
        // In the same order every epoch LRU and FIFO evict exactly the next extent needed.
        let same = orders(2000, 4, false);
        assert_eq!(later(&replay(Policy::Lru, 1000, &same)), 0.0);
        assert_eq!(later(&replay(Policy::Fifo, 1000, &same)), 0.0);
        assert_eq!(later(&replay(Policy::KeepWhatFits, 1000, &same)), 0.5);
    }

    #[test]
    fn a_dataset_that_fits_is_all_hits_after_the_first_epoch() {
        let o = orders(500, 3, true);
        for p in [
            Policy::KeepWhatFits,
            Policy::Lru,
            Policy::Fifo,
            Policy::Random2(1),
            Policy::FurthestNextUse,
        ] {
            let h = replay(p, 500, &o);
            assert_eq!((h[0].hits, h[0].admitted), (0, 500), "{p:?}");
            assert!(h[1..].iter().all(|e| e.hits == 500), "{p:?}");
        }
        assert!(replay(Policy::Lru, 0, &o).iter().all(|e| e.hits == 0));
    }
}
