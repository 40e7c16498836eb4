//! The I/O engine's door to remote objects (feature `remote`): a [`Backend`] in front of the
//! engine's own.
//!
//! A raw read of a file that is no remote object's cache, or whose extents are all on disk,
//! goes to the inner backend unchanged (io_uring, O_DIRECT). A read that needs an absent extent
//! goes to a pool of fetch threads, which fetch the extents (under the node cache's one-fetch-
//! per-node locks), copy the bytes asked for straight into the read's slot and write the
//! extent behind to the cache if it fits (read-through: fetched bytes are not read back). The
//! pool's threads bound the GETs, and the bytes, in flight.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::node::CachedObject;
use crate::dataset::Sources;
use crate::io::{Backend, RawDone, RawRead};
use crate::util::Unpoison;

/// Fetch threads: GETs in flight at most (each holds one extent's bytes).
pub const FETCH_THREADS_DEFAULT: usize = 16;
/// Extents fetched ahead after each extent a read fetched: an epoch's reads go through a block
/// or a shard front to back, so the next extents of the object are what comes next.
const READ_AHEAD_EXTENTS: u64 = 2;
/// Extents waiting to be fetched ahead, at most (older ones are dropped first).
const AHEAD_QUEUED_MAX: usize = 32;

struct Queued {
    op: RawRead,
    obj: Arc<CachedObject>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// Extents to fetch ahead of their readers (the ones after an extent a read fetched),
    /// taken when no read waits.
    ahead: VecDeque<(Arc<CachedObject>, u64)>,
    done: Vec<RawDone>,
    /// Why a read failed, by read id, for the engine's error.
    why: HashMap<u64, String>,
    /// Reads that fetched from the store (the rest found their extents on disk).
    fetched: std::collections::HashSet<u64>,
    running: usize,
    shutdown: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

/// What an engine's file entry is to the gate.
#[derive(Clone)]
enum GateFile {
    /// A local file, or none: reads go to the inner backend.
    Local,
    /// A remote object's node-cache copy.
    Object(Arc<CachedObject>),
    /// A path that was an object's copy, now another file (the cache dropped or moved under
    /// the loader): its reads fail, saying so, rather than read what is there.
    Replaced(String),
}

/// See the module documentation.
pub(crate) struct RemoteGate {
    inner: Box<dyn Backend>,
    /// The dataset's objects, by their copies' paths.
    sources: Sources,
    files: Vec<GateFile>,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    inner_in_flight: usize,
    /// Inner completions reaped while waiting, not yet handed out.
    ready: Vec<RawDone>,
    queue_max: usize,
}

/// `inner` behind a gate for the objects of `sources` (a loader over a remote dataset composes
/// its engine's backend so).
pub(crate) fn gate(
    inner: Box<dyn Backend>,
    cfg: &crate::config::EngineConfig,
    sources: Sources,
) -> Box<dyn Backend> {
    Box::new(RemoteGate::new(
        inner,
        sources,
        cfg.files_max as usize,
        FETCH_THREADS_DEFAULT,
    ))
}

impl RemoteGate {
    /// A gate in front of `inner` for the objects of `sources`, with up to `threads` fetch
    /// threads, started on the first read that needs the store (an engine that reads only
    /// local files starts none).
    pub fn new(
        inner: Box<dyn Backend>,
        sources: Sources,
        files_max: usize,
        threads: usize,
    ) -> Self {
        RemoteGate {
            inner,
            sources,
            files: vec![GateFile::Local; files_max],
            shared: Arc::new(Shared::default()),
            workers: Vec::new(),
            threads: threads.max(1),
            inner_in_flight: 0,
            ready: Vec::new(),
            queue_max: threads.max(1) * 4,
        }
    }

    /// Starts the fetch threads if they are not running.
    fn start_workers(&mut self) -> io::Result<()> {
        while self.workers.len() < self.threads {
            let s = self.shared.clone();
            let w = std::thread::Builder::new()
                .name(format!("gpufeed-fetch-{}", self.workers.len()))
                .spawn(move || worker(&s))?;
            self.workers.push(w);
        }
        Ok(())
    }

    fn outstanding(&self) -> usize {
        let st = self.shared.state.lock().unpoisoned();
        st.queue.len() + st.running + st.done.len()
    }

    fn take_inner(&mut self) {
        let before = self.ready.len();
        self.inner.reap(&mut self.ready);
        self.inner_in_flight -= self.ready.len() - before;
    }
}

fn worker(s: &Shared) {
    loop {
        let q = {
            let mut st = s.state.lock().unpoisoned();
            loop {
                if let Some(q) = st.queue.pop_front() {
                    st.running += 1;
                    break q;
                }
                if st.shutdown {
                    return;
                }
                if let Some((obj, i)) = st.ahead.pop_front() {
                    drop(st);
                    // A failure here is the reader's to meet and report.
                    let _ = obj.prefetch(i);
                    st = s.state.lock().unpoisoned();
                    continue;
                }
                st = s.work.wait(st).unpoisoned();
            }
        };
        // SAFETY: the engine handed this read's buffer to the backend (the `push` contract):
        // it is valid for `len` bytes and nobody else touches it until the completion below is
        // reaped; this thread is the only one holding the read.
        let buf = unsafe { std::slice::from_raw_parts_mut(q.op.buf, q.op.len as usize) };
        let r = q.obj.read_through(buf, q.op.offset);
        let mut st = s.state.lock().unpoisoned();
        st.running -= 1;
        let res = match r {
            Ok((n, fetched)) => {
                if fetched {
                    st.fetched.insert(q.op.id);
                }
                n as i32
            }
            Err(e) => {
                st.why.insert(q.op.id, e.report());
                st.fetched.insert(q.op.id);
                -libc::EIO
            }
        };
        st.done.push(RawDone { id: q.op.id, res });
        s.done.notify_all();
    }
}

impl Backend for RemoteGate {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn register_file(&mut self, index: u32, fd: RawFd, path: Option<&Path>) -> io::Result<()> {
        // What the entry is, found before the inner backend takes the descriptor (a failure
        // leaves neither side holding it).
        let file = match path.and_then(|p| self.sources.object(p)) {
            Some(obj) if fd >= 0 => {
                // SAFETY: all-zero is a valid `stat` (plain integers); `fd` is the engine's
                // open descriptor for this entry, and fstat only writes `st`.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                if unsafe { libc::fstat(fd, &mut st) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                if obj.data_id() == (st.st_dev, st.st_ino) {
                    GateFile::Object(obj.clone())
                } else {
                    GateFile::Replaced(obj.info().url.clone())
                }
            }
            _ => GateFile::Local,
        };
        self.inner.register_file(index, fd, path)?;
        if let Some(slot) = self.files.get_mut(index as usize) {
            *slot = file;
        }
        Ok(())
    }

    unsafe fn push(&mut self, op: RawRead) -> std::result::Result<(), RawRead> {
        let obj = match self.files.get(op.file as usize) {
            Some(GateFile::Object(o)) => Some(o.clone()),
            Some(GateFile::Replaced(url)) => {
                let mut st = self.shared.state.lock().unpoisoned();
                st.why.insert(
                    op.id,
                    format!(
                        "the node cache's copy of {url} was replaced while this loader read it \
                         (the cache dropped or moved?): open the dataset again"
                    ),
                );
                st.done.push(RawDone {
                    id: op.id,
                    res: -libc::EIO,
                });
                return Ok(());
            }
            _ => None,
        };
        if let Some(o) = &obj {
            // The extents after this read's come next (a block or a shard is read front to
            // back): fetch the absent ones ahead, whether this read finds its own on disk or not.
            let last = o.extent_of(op.offset + op.len.max(1) as u64 - 1);
            let ahead: Vec<u64> = (last + 1..=last + READ_AHEAD_EXTENTS)
                .filter(|&i| i < o.extent_count() && !o.extent_ready(i))
                .collect();
            if !ahead.is_empty() && self.start_workers().is_ok() {
                let o = o.clone();
                let mut st = self.shared.state.lock().unpoisoned();
                for i in ahead {
                    if st.ahead.len() >= AHEAD_QUEUED_MAX {
                        st.ahead.pop_front();
                    }
                    st.ahead.push_back((o.clone(), i));
                }
                drop(st);
                self.shared.work.notify_all();
            }
        }
        let remote = obj.filter(|o| !o.read_from_disk(op.offset..op.offset + op.len as u64));
        if let Some(obj) = remote {
            if let Err(e) = self.start_workers() {
                if self.workers.is_empty() {
                    // No thread to fetch with: the read fails, saying why.
                    let mut st = self.shared.state.lock().unpoisoned();
                    st.why
                        .insert(op.id, format!("cannot start the remote fetch threads: {e}"));
                    st.done.push(RawDone {
                        id: op.id,
                        res: -libc::EIO,
                    });
                    return Ok(());
                }
            }
            let mut st = self.shared.state.lock().unpoisoned();
            if st.queue.len() >= self.queue_max {
                return Err(op);
            }
            st.queue.push_back(Queued { op, obj });
            self.shared.work.notify_one();
            return Ok(());
        }
        // SAFETY: the caller's contract is passed on unchanged.
        let r = unsafe { self.inner.push(op) };
        if r.is_ok() {
            self.inner_in_flight += 1;
        }
        r
    }

    fn submit(&mut self, wait: usize) -> io::Result<()> {
        self.inner.submit(0)?;
        if wait == 0 {
            return Ok(());
        }
        loop {
            self.take_inner();
            let (fetched, busy) = {
                let st = self.shared.state.lock().unpoisoned();
                (st.done.len(), st.queue.len() + st.running)
            };
            let have = self.ready.len() + fetched;
            if have >= wait || (self.inner_in_flight == 0 && busy == 0) {
                return Ok(());
            }
            if busy == 0 {
                self.inner.submit((wait - have).min(self.inner_in_flight))?;
            } else {
                let st = self.shared.state.lock().unpoisoned();
                let need = wait - self.ready.len();
                // With inner reads in flight too, look at them again every millisecond.
                let timeout = if self.inner_in_flight > 0 {
                    Duration::from_millis(1)
                } else {
                    Duration::from_secs(1)
                };
                let _ = self
                    .shared
                    .done
                    .wait_timeout_while(st, timeout, |st| {
                        st.done.len() < need && st.queue.len() + st.running > 0
                    })
                    .unpoisoned();
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<RawDone>) {
        out.append(&mut self.ready);
        let before = out.len();
        self.inner.reap(out);
        self.inner_in_flight -= out.len() - before;
        out.append(&mut self.shared.state.lock().unpoisoned().done);
    }

    fn cancel_all(&mut self) {
        self.inner.cancel_all();
        let mut st = self.shared.state.lock().unpoisoned();
        st.ahead.clear();
        let cancelled: Vec<RawDone> = st
            .queue
            .drain(..)
            .map(|q| RawDone {
                id: q.op.id,
                res: -libc::ECANCELED,
            })
            .collect();
        st.done.extend(cancelled);
        self.shared.done.notify_all();
    }

    fn syscalls(&self) -> u64 {
        self.inner.syscalls()
    }

    fn buffers_registered(&self) -> bool {
        self.inner.buffers_registered()
    }

    fn describe(&self) -> String {
        format!(
            "{} behind the node cache ({} fetch threads)",
            self.inner.describe(),
            self.threads
        )
    }

    fn error_detail(&mut self, id: u64) -> Option<String> {
        self.shared.state.lock().unpoisoned().why.remove(&id)
    }

    fn served_remotely(&mut self, id: u64) -> bool {
        self.shared.state.lock().unpoisoned().fetched.remove(&id)
    }
}

impl Drop for RemoteGate {
    fn drop(&mut self) {
        // The engine drains every read before it drops its backend; the fetch threads are idle.
        debug_assert_eq!(self.outstanding(), 0);
        self.shared.state.lock().unpoisoned().shutdown = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
