//! Small shared helpers: human sizes, fio-style size mixes, a latency histogram, progress.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::error::{invalid, Result};

/// `true`/`false` as the dataset options and loader settings read them from text (`yes`/`no`,
/// `1`/`0`, `on`/`off`, any case); `None` for anything else.
pub(crate) fn yes_no_word(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" | "on" => Some(true),
        "false" | "no" | "0" | "off" => Some(false),
        _ => None,
    }
}

/// Named text values (`None`: absent) as a JSON object of strings and nulls: how the dataset
/// options and the loader settings are shown at every door.
pub(crate) fn values_json(values: Vec<(&'static str, Option<String>)>) -> serde_json::Value {
    serde_json::Value::Object(
        values
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.map_or(serde_json::Value::Null, Into::into)))
            .collect(),
    )
}

/// Parses a size like `4096`, `4K`, `128k`, `1M`, `4G`, `2KiB`, `1.5G` (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .unwrap_or(t);
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let bad = || {
        invalid(format!(
            "cannot read {s:?} as a size (examples: 4096, 4K, 128K, 4G)"
        ))
    };
    if let Ok(v) = num.parse::<u64>() {
        return v.checked_mul(mult).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    if !(f.is_finite() && f >= 0.0) {
        return Err(bad());
    }
    let v = f * mult as f64;
    if v > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(v as u64)
}

/// Formats a byte count the way fio writes sizes: `4K`, `128K`, `1M`, or bytes.
pub fn size_label(b: u64) -> String {
    for (unit, s) in [(1u64 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")] {
        if b >= unit && b.is_multiple_of(unit) {
            return format!("{}{s}", b / unit);
        }
    }
    b.to_string()
}

/// Bytes for people: `1.31 GiB`, `69.8 MiB`, `512 KiB`, `42 B` (three significant digits).
#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "used only with feature remote: the node cache's commands"
    )
)]
pub fn bytes_human(b: u64) -> String {
    for (unit, s) in [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ] {
        if b >= unit {
            let v = b as f64 / unit as f64;
            let digits = if v >= 100.0 {
                0
            } else if v >= 10.0 {
                1
            } else {
                2
            };
            return format!("{v:.digits$} {s}");
        }
    }
    format!("{b} B")
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

/// A progress line on stderr: on a terminal a bar redrawn in place with the rate and the time
/// left; otherwise a plain line every [`PLAIN_EVERY`] (for logs), plus start and end lines.
/// Nothing with `GPUFEED_QUIET=1` or after [`set_quiet`] (the CLI's `--json`).
#[derive(Debug)]
pub struct Progress {
    what: String,
    total: u64,
    unit: &'static str,
    scale: f64,
    tty: bool,
    last: Instant,
    start: Instant,
    quiet: bool,
    /// Nothing is shown before this much time has passed (short work stays silent).
    delay: Duration,
    shown: bool,
}

/// Set by the command line when `--json` was given: progress lines are then not written (the
/// JSON goes to stdout, but a script capturing both streams wants nothing else).
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Silences every progress line from now on (the CLI's `--json`).
pub fn set_quiet() {
    QUIET.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether progress lines are silenced: `GPUFEED_QUIET=1`, or [`set_quiet`].
fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
        || std::env::var("GPUFEED_QUIET").as_deref() == Ok("1")
}

/// How often a non-terminal progress line is written.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    /// Progress over `total` bytes (shown in MiB).
    pub fn bytes(what: impl Into<String>, total: u64) -> Progress {
        Progress::new(what, total, "MiB", 1.0 / (1u64 << 20) as f64)
    }

    /// Progress over `total` items.
    pub fn items(what: impl Into<String>, total: u64, unit: &'static str) -> Progress {
        Progress::new(what, total, unit, 1.0)
    }

    fn new(what: impl Into<String>, total: u64, unit: &'static str, scale: f64) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let p = Progress {
            // What the line names may be a URL given on the command line: never its secrets.
            what: crate::error::redact(&what.into()).into_owned(),
            total,
            unit,
            scale,
            tty,
            // A terminal's first redraw may come at once; a log's first line after a period.
            last: if tty {
                Instant::now() - Duration::from_secs(1)
            } else {
                Instant::now()
            },
            start: Instant::now(),
            quiet: quiet(),
            delay: Duration::ZERO,
            shown: false,
        };
        if !p.tty && !p.quiet {
            eprintln!("{} ...", p.what);
        }
        Progress { shown: true, ..p }
    }

    /// Progress over `total` items that shows nothing unless the work is still going after
    /// `delay` (for work that is usually quick, such as indexing a few files).
    pub fn items_after(
        what: impl Into<String>,
        total: u64,
        unit: &'static str,
        delay: Duration,
    ) -> Progress {
        let tty = std::io::stderr().is_terminal();
        Progress {
            what: crate::error::redact(&what.into()).into_owned(),
            total,
            unit,
            scale: 1.0,
            tty,
            last: Instant::now() - Duration::from_secs(3600),
            start: Instant::now(),
            quiet: quiet(),
            delay,
            shown: false,
        }
    }

    /// `done` of `total`, the rate so far and the time left, in words.
    fn status(&self, done: u64) -> (f64, String) {
        let pct = if self.total > 0 {
            done as f64 * 100.0 / self.total as f64
        } else {
            100.0
        };
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let rate = done as f64 * self.scale / secs;
        let left = if done > 0 && done < self.total {
            let s = (self.total - done) as f64 * secs / done as f64;
            format!(", {} left", duration_words(s))
        } else {
            String::new()
        };
        (
            pct,
            format!(
                "{:.0}/{:.0} {} ({pct:.0}%), {rate:.1} {}/s{left}",
                done as f64 * self.scale,
                self.total as f64 * self.scale,
                self.unit,
                self.unit
            ),
        )
    }

    /// Reports `done` units of the total (redraws at most every 100 ms on a terminal, writes a
    /// line every [`PLAIN_EVERY`] otherwise).
    pub fn set(&mut self, done: u64) {
        if self.quiet || self.start.elapsed() < self.delay {
            return;
        }
        if !self.shown {
            self.shown = true;
            if !self.tty {
                eprintln!("{} ...", self.what);
                self.last = Instant::now();
                return;
            }
        }
        let every = if self.tty {
            Duration::from_millis(100)
        } else {
            PLAIN_EVERY
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let (pct, status) = self.status(done);
        let mut e = std::io::stderr().lock();
        if self.tty {
            let width = 30;
            let filled = (((pct / 100.0) * width as f64) as usize).min(width);
            let _ = write!(
                e,
                "\r{} [{}{}] {status}   ",
                self.what,
                "#".repeat(filled),
                " ".repeat(width - filled),
            );
        } else {
            let _ = writeln!(e, "{}: {status}", self.what);
        }
        let _ = e.flush();
    }

    pub fn finish(self) {
        if self.quiet || !self.shown {
            return;
        }
        let secs = self.start.elapsed().as_secs_f64();
        let rate = self.total as f64 * self.scale / secs.max(1e-9);
        if self.tty {
            eprintln!(
                "\r{} done: {:.0} {} in {secs:.1} s ({rate:.1} {}/s){}",
                self.what,
                self.total as f64 * self.scale,
                self.unit,
                self.unit,
                " ".repeat(40)
            );
        } else {
            eprintln!(
                "{} done: {:.0} {} in {secs:.1} s ({rate:.1} {}/s)",
                self.what,
                self.total as f64 * self.scale,
                self.unit,
                self.unit
            );
        }
    }
}

/// `s` seconds as "42 s", "3 min 5 s" or "2 h 10 min".
pub fn duration_words(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// Locks `m`, recovering from poisoning: for locks that guard plain bookkeeping (or buffers
/// rewritten whole before they are read) which a panic elsewhere cannot leave half-valid, and
/// that `Drop` takes, where a panic must not happen.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unpoisoned()
}

/// The one way gpufeed recovers from a poisoned lock or wait (a thread panicked holding it): it
/// takes the guard anyway. What such a thread leaves is bookkeeping that is checked where it is
/// read (counts, queues, flags), and one panic must not become a cascade of them — least of all
/// in a `Drop` that waits for reads in flight. `lock(&m)` is the common case; waits on a
/// condition variable call `.unpoisoned()` on their result.
pub(crate) trait Unpoison<G> {
    /// The guard (and what came with it), poisoned or not.
    fn unpoisoned(self) -> G;
}

impl<G> Unpoison<G> for std::sync::LockResult<G> {
    fn unpoisoned(self) -> G {
        self.unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// crc32c (Castagnoli, as iSCSI and TFRecord use it) of `data`: [`crate::crc32c::crc32c`].
pub use crate::crc32c::crc32c;

/// Prints a notice on stderr (once per distinct text), unless `GPUFEED_QUIET=1`.
pub(crate) fn notice(msg: &str) {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    if std::env::var("GPUFEED_QUIET").as_deref() == Ok("1") {
        return;
    }
    let msg = crate::error::redact(msg);
    let mut g = SEEN.lock().unpoisoned();
    if g.get_or_insert_with(HashSet::new).insert(msg.to_string()) {
        eprintln!("gpufeed: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration_words(42.4), "42 s");
        assert_eq!(duration_words(185.0), "3 min 5 s");
        assert_eq!(duration_words(7800.0), "2 h 10 min");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("128k").unwrap(), 128 << 10);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("2KiB").unwrap(), 2048);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1K").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(1 << 20), "1M");
        assert_eq!(size_label(1000), "1000");
    }

    #[test]
    fn imagenet_mix_matches_fio_weights() {
        let m = SizeMix::parse(IMAGENET_MIX).unwrap();
        assert_eq!(m.min(), 2048);
        assert_eq!(m.max(), 256 << 10);
        // Draw many sizes and compare frequencies with the weights.
        let mut rng = crate::rng::Rng::new(1);
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
