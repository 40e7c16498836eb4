//! The benchmarks' helpers: fio-style size mixes (`--bs`) and a latency histogram.

use gpufeed::config::{parse_size, size_label};
use gpufeed::error::{Error, ErrorKind, Result};

/// A usage error: what the user asked cannot be done as asked.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, msg)
}

/// Read sizes with weights, as fio's `bssplit` (`2K/1:4K/2:...`, weights in percent of reads).
#[derive(Debug, Clone, PartialEq)]
pub struct SizeMix {
    /// (size in bytes, cumulative weight out of `total`).
    entries: Vec<(u32, u32)>,
    total: u32,
    label: String,
}

/// The ImageNet sample-size mix (JPEG sizes of ILSVRC-2012 train), in fio's bssplit syntax.
pub const IMAGENET_MIX: &str = "2K/1:4K/2:8K/4:16K/8:32K/13:64K/38:128K/33:256K/1";

impl SizeMix {
    /// One size, or a bssplit list. A bssplit entry without a weight shares what is left of 100.
    pub fn parse(s: &str) -> Result<SizeMix> {
        let s = s.trim();
        if s == "imagenet" {
            return SizeMix::parse(IMAGENET_MIX).map(|mut m| {
                m.label = "imagenet".into();
                m
            });
        }
        let mut raw = Vec::new();
        for part in s.split(':').filter(|p| !p.is_empty()) {
            let (size, w) = match part.split_once('/') {
                Some((a, b)) if !b.is_empty() => (a, Some(b)),
                Some((a, _)) => (a, None),
                None => (part, None),
            };
            let size = parse_size(size)?;
            if size == 0 || size > (256 << 20) {
                return Err(invalid(format!(
                    "read size {size} in {s:?} must be in 1..=256M"
                )));
            }
            let w = match w {
                Some(w) => Some(w.parse::<u32>().map_err(|_| {
                    invalid(format!("weight {w:?} in {s:?} is not a whole percentage"))
                })?),
                None => None,
            };
            raw.push((size as u32, w));
        }
        if raw.is_empty() {
            return Err(invalid("empty size mix"));
        }
        // Summed wide: weights near u32::MAX must not wrap into a sum that looks small.
        let given: u64 = raw.iter().filter_map(|e| e.1).map(u64::from).sum();
        let blanks = raw.iter().filter(|e| e.1.is_none()).count() as u32;
        if given > 100 || (blanks == 0 && given == 0) {
            return Err(invalid(format!(
                "weights in {s:?} must add up to at most 100"
            )));
        }
        let share = (100 - given as u32).checked_div(blanks).unwrap_or(0);
        let mut cum = 0;
        let mut entries = Vec::new();
        for (size, w) in raw {
            cum += w.unwrap_or(share);
            entries.push((size, cum));
        }
        if cum == 0 {
            return Err(invalid(format!("weights in {s:?} add up to zero")));
        }
        let label = if entries.len() == 1 {
            size_label(entries[0].0 as u64)
        } else {
            s.to_string()
        };
        Ok(SizeMix {
            entries,
            total: cum,
            label,
        })
    }

    /// A size drawn by weight from a uniform `u` in `0..2^64`.
    pub fn pick(&self, u: u64) -> u32 {
        let x = ((u as u128 * self.total as u128) >> 64) as u32;
        self.entries
            .iter()
            .find(|e| x < e.1)
            .unwrap_or(self.entries.last().unwrap())
            .0
    }

    /// The smallest size in the mix.
    pub fn min(&self) -> u32 {
        self.entries.iter().map(|e| e.0).min().unwrap()
    }

    /// The largest size in the mix.
    pub fn max(&self) -> u32 {
        self.entries.iter().map(|e| e.0).max().unwrap()
    }

    /// Mean read size, by weight.
    pub fn mean(&self) -> f64 {
        let mut prev = 0;
        let mut sum = 0.0;
        for &(size, cum) in &self.entries {
            sum += size as f64 * (cum - prev) as f64;
            prev = cum;
        }
        sum / self.total as f64
    }

    /// The mix as it was written (or its name).
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// A log-linear histogram of nanoseconds: 32 sub-buckets per power of two (≈3% precision).
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; 64 * 32],
            n: 0,
        }
    }
}

impl Histogram {
    fn bucket(v: u64) -> usize {
        if v < 32 {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros() as usize;
        let shift = msb - 5;
        ((shift + 1) << 5) | ((v >> shift) & 31) as usize
    }

    fn value(b: usize) -> u64 {
        if b < 32 {
            return b as u64;
        }
        let shift = (b >> 5) - 1;
        let v = (32 | (b & 31) as u64) << shift;
        v + (1u64 << shift) / 2
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.n += 1;
    }

    /// Adds `other`'s counts to these.
    #[cfg_attr(
        not(feature = "tokio-uring"),
        allow(
            dead_code,
            reason = "used only with feature tokio-uring: the tokio-uring peer benchmark"
        )
    )]
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
    }

    /// The value at quantile `q` (0..=1), in nanoseconds; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(b);
            }
        }
        Self::value(self.counts.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imagenet_mix_matches_fio_weights() {
        let m = SizeMix::parse(IMAGENET_MIX).unwrap();
        assert_eq!(m.min(), 2048);
        assert_eq!(m.max(), 256 << 10);
        // Draw many sizes and compare frequencies with the weights.
        let mut rng = gpufeed::testing::Rng::new(1);
        let mut c = std::collections::HashMap::new();
        let n = 200_000;
        for _ in 0..n {
            *c.entry(m.pick(rng.next_u64())).or_insert(0u32) += 1;
        }
        let share = |k: u32| c[&k] as f64 / n as f64 * 100.0;
        assert!((share(64 << 10) - 38.0).abs() < 0.6);
        assert!((share(128 << 10) - 33.0).abs() < 0.6);
        assert!((share(2048) - 1.0).abs() < 0.2);
        let mean = m.mean();
        assert!((mean - 74.98 * 1024.0).abs() < 64.0, "{mean}");
        assert_eq!(SizeMix::parse("imagenet").unwrap().label(), "imagenet");
    }

    #[test]
    fn bssplit_blank_weights_share_the_rest() {
        let m = SizeMix::parse("4K/50:8K:16K").unwrap();
        assert_eq!(m.entries, vec![(4096, 50), (8192, 75), (16384, 100)]);
        assert!(SizeMix::parse("4K/70:8K/40").is_err());
        assert!(SizeMix::parse("0").is_err());
        assert_eq!(SizeMix::parse("128K").unwrap().label(), "128K");
    }

    #[test]
    fn histogram_quantiles_are_close() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 100);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.04, "{p50}");
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.04, "{p99}");
        assert_eq!(Histogram::default().quantile(0.5), 0);
    }
}
