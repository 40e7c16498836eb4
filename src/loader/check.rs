//! The checkers: threads between the I/O thread and the consumer that check each host group's
//! frames and checksums as it arrives, so the checks run while the consumer is busy with
//! earlier batches (its training step) instead of on its thread when it asks for the next
//! one. The I/O thread never checks host groups: a group's checks (10 ms for 75 MB) there would
//! hold up reaping and resubmitting, and the device queue would run dry.
//!
//! One checker serves one epoch at a time; a loader keeps its checkers and hands an idle one
//! the next epoch (a thread per epoch would make the allocator give each new thread an arena
//! of its own, and the soak sees resident memory grow). A checker forwards every message of
//! its epoch in order; device groups (checked before their copy) and the rest pass through.
//! Its epoch is done when the I/O thread is done with it (the sender dropped) or the epoch is
//! dropped (the next send fails); the groups it holds then drop and give their buffers back,
//! and only then does it signal the epoch's `done`, which the epoch's drop waits for. The
//! threads end when the loader and its epochs are all gone.

use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::batch::Memory;
use crate::dataset::Dataset;
use crate::error::{Error, ErrorKind, Result};
use crate::util::Unpoison;

use super::worker::{Msg, Retired};

/// A loader's checker threads (shared by its clones and epochs).
#[derive(Debug)]
pub(super) struct Checkers {
    /// Checkers waiting for an epoch: each one's job channel.
    idle: Mutex<Vec<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    me: Weak<Checkers>,
}

/// One epoch for a checker.
struct Job {
    dataset: Arc<Dataset>,
    verify: bool,
    from: Receiver<Msg>,
    to: SyncSender<Msg>,
    done: Arc<Retired>,
    /// The checker's own job channel, put back with the idle ones when the epoch is done.
    me: Sender<Job>,
}

impl Checkers {
    pub(super) fn new() -> Arc<Checkers> {
        Arc::new_cyclic(|me| Checkers {
            idle: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            me: me.clone(),
        })
    }

    /// Hands one epoch to a checker: it takes the I/O thread's messages from `from` and hands
    /// them on, host groups checked, through the receiver returned (of `capacity`); the
    /// `Retired` is signalled once it holds nothing of the epoch any more.
    pub(super) fn start(
        &self,
        dataset: Arc<Dataset>,
        verify: bool,
        from: Receiver<Msg>,
        capacity: usize,
    ) -> Result<(Receiver<Msg>, Arc<Retired>)> {
        let (to, rx) = sync_channel(capacity);
        let done = Arc::new(Retired::default());
        let (mut dataset, mut from, mut to) = (dataset, from, to);
        loop {
            let worker = self.idle.lock().unpoisoned().pop();
            let worker = match worker {
                Some(w) => w,
                None => self.spawn()?,
            };
            let job = Job {
                dataset,
                verify,
                from,
                to,
                done: done.clone(),
                me: worker.clone(),
            };
            match worker.send(job) {
                Ok(()) => return Ok((rx, done)),
                // That checker's thread is gone (it panicked): another.
                Err(back) => (dataset, from, to) = (back.0.dataset, back.0.from, back.0.to),
            }
        }
    }

    /// A new checker thread; its job channel.
    fn spawn(&self) -> Result<Sender<Job>> {
        let (tx, jobs) = channel::<Job>();
        let pool = self.me.clone();
        let thread = std::thread::Builder::new()
            .name("gpufeed-check".into())
            .spawn(move || {
                while let Ok(job) = jobs.recv() {
                    let Job {
                        dataset,
                        verify,
                        from,
                        to,
                        done,
                        me,
                    } = job;
                    check_epoch(&dataset, verify, from, to);
                    done.signal();
                    match pool.upgrade() {
                        Some(p) => p.idle.lock().unpoisoned().push(me),
                        None => return,
                    }
                }
            })
            .map_err(|e| {
                Error::new(
                    ErrorKind::Io,
                    format!("cannot start a loader's checker thread: {e}"),
                )
            })?;
        self.threads.lock().unpoisoned().push(thread);
        Ok(tx)
    }
}

impl Drop for Checkers {
    fn drop(&mut self) {
        // Idle checkers see their job channel close and end; one still finishing an epoch ends
        // after it. A checker can itself drop the last handle (after its epoch's owners went):
        // it is not joined by itself.
        self.idle.lock().unpoisoned().clear();
        let me = std::thread::current().id();
        for t in self.threads.lock().unpoisoned().drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

/// One epoch's messages, host groups checked, from `from` to `to`; returns when either side is
/// gone, having dropped every group it held.
fn check_epoch(dataset: &Dataset, verify: bool, from: Receiver<Msg>, to: SyncSender<Msg>) {
    let cpu0 = crate::sys::thread_cpu_seconds();
    for msg in from {
        let msg = match msg {
            Msg::Group(mut g) => {
                if let Memory::Host(region) = &g.mem {
                    let t = Instant::now();
                    let m = &mut g.meta;
                    dataset.check_spans(
                        region.bytes(),
                        &m.ids,
                        &mut m.spans,
                        &mut m.labels,
                        verify,
                    );
                    m.checked = Some((t, Instant::now()));
                    m.check_cpu_s = crate::sys::thread_cpu_seconds() - cpu0;
                }
                Msg::Group(g)
            }
            other => other,
        };
        if to.send(msg).is_err() {
            return; // the epoch is gone
        }
    }
}
