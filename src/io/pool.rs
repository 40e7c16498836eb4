//! A pool of threads issuing `pread`: the backend where io_uring is unavailable.
//!
//! Raw reads go into one shared queue; workers take them, `pread` into the slot memory, and
//! post the result. Cancelling removes what is still queued ("the kernel never saw it": it
//! completes with −ECANCELED at once) and lets running reads finish. Dropping the pool stops the
//! workers after the engine has drained every read.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::{Backend, RawDone, RawRead};
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::util::Unpoison;

struct State {
    queue: VecDeque<RawRead>,
    done: Vec<RawDone>,
    shutdown: bool,
    idle_workers: usize,
    submitter_waiting: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    syscalls: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unpoisoned()
    }
}

/// Reads with `pread` on a pool of threads (no io_uring).
pub struct PoolBackend {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    capacity: usize,
    staged: Vec<RawRead>,
    threads: u32,
}

impl PoolBackend {
    /// A pool with the threads `cfg` asks for (one per queue slot by default).
    pub fn new(cfg: &EngineConfig) -> Result<PoolBackend> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(cfg.queue_depth as usize),
                done: Vec::with_capacity(cfg.queue_depth as usize),
                shutdown: false,
                idle_workers: 0,
                submitter_waiting: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            syscalls: AtomicU64::new(0),
        });
        let threads = cfg.pool_threads();
        let mut workers = Vec::with_capacity(threads as usize);
        for i in 0..threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("gpufeed-pread-{i}"))
                .stack_size(64 << 10)
                .spawn(move || worker(&s))
                .map_err(|e| Error::io("cannot start pread pool thread", e))?;
            workers.push(h);
        }
        Ok(PoolBackend {
            shared,
            workers,
            capacity: cfg.queue_depth as usize,
            staged: Vec::with_capacity(cfg.queue_depth as usize),
            threads,
        })
    }
}

fn worker(s: &Shared) {
    let mut st = s.lock();
    loop {
        if let Some(op) = st.queue.pop_front() {
            drop(st);
            // SAFETY: Backend::push's contract: `op.buf` is valid for `op.len` bytes and reserved
            // for this read until its RawDone is reaped, which happens only after we post it.
            let res =
                match unsafe { crate::sys::pread_raw(op.fd, op.buf, op.len as usize, op.offset) } {
                    Ok(n) => n as i32,
                    Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                };
            s.syscalls.fetch_add(1, Ordering::Relaxed);
            st = s.lock();
            st.done.push(RawDone { id: op.id, res });
            if st.submitter_waiting {
                s.syscalls.fetch_add(1, Ordering::Relaxed);
                s.done.notify_one();
            }
            continue;
        }
        if st.shutdown {
            return;
        }
        st.idle_workers += 1;
        s.syscalls.fetch_add(1, Ordering::Relaxed);
        st = s.work.wait(st).unpoisoned();
        st.idle_workers -= 1;
    }
}

impl Backend for PoolBackend {
    fn name(&self) -> &'static str {
        "pread-pool"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    unsafe fn push(&mut self, op: RawRead) -> std::result::Result<(), RawRead> {
        self.staged.push(op);
        Ok(())
    }

    fn submit(&mut self, wait: usize) -> io::Result<()> {
        let mut st = self.shared.lock();
        if !self.staged.is_empty() {
            let n = self.staged.len();
            st.queue.extend(self.staged.drain(..));
            let wake = n.min(st.idle_workers);
            for _ in 0..wake {
                self.shared.work.notify_one();
            }
            self.shared
                .syscalls
                .fetch_add(wake as u64, Ordering::Relaxed);
        }
        while st.done.len() < wait {
            st.submitter_waiting = true;
            self.shared.syscalls.fetch_add(1, Ordering::Relaxed);
            st = self.shared.done.wait(st).unpoisoned();
        }
        st.submitter_waiting = false;
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<RawDone>) {
        out.append(&mut self.shared.lock().done);
    }

    fn cancel_all(&mut self) {
        let mut st = self.shared.lock();
        let State { queue, done, .. } = &mut *st;
        for op in queue.drain(..).chain(self.staged.drain(..)) {
            done.push(RawDone {
                id: op.id,
                res: -libc::ECANCELED,
            });
        }
    }

    fn syscalls(&self) -> u64 {
        self.shared.syscalls.load(Ordering::Relaxed)
    }

    fn describe(&self) -> String {
        format!("pread pool ({} threads)", self.threads)
    }
}

impl Drop for PoolBackend {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for PoolBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&Backend::describe(self))
    }
}
