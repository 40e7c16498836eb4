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

/// A progress line on stderr: on a terminal a bar redrawn in place with the rate and the time
/// left; otherwise a plain line every [`PLAIN_EVERY`] (for logs), plus start and end lines.
/// Nothing with `GPUFEED_QUIET=1`. [`crate::progress::Task`] is the door to it.
#[derive(Debug)]
pub(crate) struct Progress {
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
    /// The last count set (the total of work whose total is not known ahead: `total` 0).
    done: u64,
}

/// Whether progress lines are silenced: `GPUFEED_QUIET=1` (the command's `--json` sets a
/// silent [`crate::progress::set_progress`] function instead).
fn quiet() -> bool {
    std::env::var("GPUFEED_QUIET").as_deref() == Ok("1")
}

/// How often a non-terminal progress line is written.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(10);

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
            done: 0,
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
            done: 0,
        }
    }

    /// `done` of `total`, the rate so far and the time left, in words.
    fn status(&self, done: u64) -> (f64, String) {
        if self.total == 0 {
            // Not known ahead (a listing's length): the count and the rate.
            let secs = self.start.elapsed().as_secs_f64().max(1e-9);
            let n = done as f64 * self.scale;
            return (
                0.0,
                format!(
                    "{n:.0} {} so far, {:.1} {}/s",
                    self.unit,
                    n / secs,
                    self.unit
                ),
            );
        }
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
        self.done = done;
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

    pub fn finish(mut self) {
        if self.quiet || !self.shown {
            return;
        }
        if self.total == 0 {
            self.total = self.done;
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
pub(crate) fn duration_words(s: f64) -> String {
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
pub(crate) use crate::crc32c::crc32c;

/// Prints a notice on stderr (once per distinct text), unless `GPUFEED_QUIET=1`.
pub fn notice(msg: &str) {
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
}
