//! How long work says how far it has come: indexing a dataset of many files, packing one,
//! verifying one. The dataset layer reports through `Task`; where the reports go is the
//! caller's: a function set with [`set_progress`] (a trainer's logger, a notebook's bar), or, by
//! default, a line on stderr once the work has taken a while (`GPUFEED_QUIET=1` silences it).

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::util::{Progress, Unpoison};

/// One report of a piece of long work.
#[derive(Debug, Clone, Copy)]
pub struct ProgressEvent<'a> {
    /// What is being done ("indexing 1,281,167 files in /data/train", "packing into …").
    pub what: &'a str,
    /// Units done so far.
    pub done: u64,
    /// Units in all.
    pub total: u64,
    /// The unit: "bytes", "files", "samples".
    pub unit: &'a str,
    /// The work is over (the last report of this piece).
    pub finished: bool,
}

/// A function that takes the reports (from any thread: it must be quick).
pub type ProgressFn = Arc<dyn Fn(&ProgressEvent<'_>) + Send + Sync>;

static SINK: RwLock<Option<ProgressFn>> = RwLock::new(None);

/// Sends every report of long work to `f` from now on (`None`: back to the default line on
/// stderr), returning the function set before. Reports come at most every 100 ms per piece of
/// work, plus its last.
pub fn set_progress(f: Option<ProgressFn>) -> Option<ProgressFn> {
    std::mem::replace(&mut *SINK.write().unpoisoned(), f)
}

fn sink() -> Option<ProgressFn> {
    SINK.read().unpoisoned().clone()
}

/// How often a piece of work reports to a [`set_progress`] function.
const EVERY: Duration = Duration::from_millis(100);

/// One piece of long work reporting its progress: to the [`set_progress`] function if one is
/// set when it starts, else as a line on stderr (a bar redrawn in place on a terminal, a plain
/// line every 10 s in a log; nothing with `GPUFEED_QUIET=1`).
///
/// ```
/// use gpufeed::progress::Task;
///
/// let mut task = Task::items("copying 3 files", 3, "files");
/// for i in 0..3 {
///     task.set(i + 1);
/// }
/// task.finish();
/// ```
pub struct Task {
    what: String,
    total: u64,
    unit: &'static str,
    to: To,
}

enum To {
    Sink {
        f: ProgressFn,
        last: Option<Instant>,
    },
    Terminal(Progress),
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("what", &self.what)
            .field("total", &self.total)
            .field("unit", &self.unit)
            .finish_non_exhaustive()
    }
}

impl Task {
    fn new(
        what: String,
        total: u64,
        unit: &'static str,
        terminal: impl FnOnce() -> Progress,
    ) -> Task {
        let to = match sink() {
            Some(f) => To::Sink { f, last: None },
            None => To::Terminal(terminal()),
        };
        Task {
            what,
            total,
            unit,
            to,
        }
    }

    /// Work over `total` bytes.
    pub fn bytes(what: impl Into<String>, total: u64) -> Task {
        let what = what.into();
        let w = what.clone();
        Task::new(what, total, "bytes", || Progress::bytes(w, total))
    }

    /// Work over `total` items (`unit`: "files", "images").
    pub fn items(what: impl Into<String>, total: u64, unit: &'static str) -> Task {
        let what = what.into();
        let w = what.clone();
        Task::new(what, total, unit, || Progress::items(w, total, unit))
    }

    /// Work over `total` items that says nothing on stderr unless it is still going after
    /// `delay` (a [`set_progress`] function hears all of it).
    pub fn items_after(
        what: impl Into<String>,
        total: u64,
        unit: &'static str,
        delay: Duration,
    ) -> Task {
        let what = what.into();
        let w = what.clone();
        Task::new(what, total, unit, || {
            Progress::items_after(w, total, unit, delay)
        })
    }

    fn event(&self, done: u64, finished: bool) -> ProgressEvent<'_> {
        ProgressEvent {
            what: &self.what,
            done,
            total: self.total,
            unit: self.unit,
            finished,
        }
    }

    /// `done` units of the total.
    pub fn set(&mut self, done: u64) {
        match &mut self.to {
            To::Terminal(p) => p.set(done),
            To::Sink { last, .. } => {
                if last.is_some_and(|t| t.elapsed() < EVERY) {
                    return;
                }
                *last = Some(Instant::now());
                if let To::Sink { f, .. } = &self.to {
                    f(&self.event(done, false));
                }
            }
        }
    }

    /// The work is over.
    pub fn finish(self) {
        if let To::Sink { f, .. } = &self.to {
            f(&self.event(self.total, true));
        } else if let To::Terminal(p) = self.to {
            p.finish();
        }
    }
}
