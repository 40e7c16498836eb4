//! ③ Reads into slots.
//!
//! [`Engine`] is the one way bytes get from files into arena [`Slot`]s. A caller opens files
//! ([`Engine::open`]), then submits *jobs*: a slot plus one or more [`ReadSpec`]s (file, offset,
//! length, where in the slot). The slot token moves into the engine and comes back in a
//! [`Completion`] once every read of the job has finished, with one outcome per read: the byte
//! range of the slot holding exactly the requested bytes, or an [`Error`] naming the file,
//! offset and length.
//!
//! The engine logic — widening each read to the file's O_DIRECT alignment and trimming it on
//! delivery, resubmitting short reads, retrying EINTR/EAGAIN, telling a correct EOF from a file
//! that shrank, cancelling and draining on drop — lives here, once. Beneath it a [`Backend`]
//! only moves raw, already-aligned reads: io_uring (`uring`), a pread thread pool
//! (`pool`), plain synchronous pread (`sync`), or the seeded simulator (`sim`, feature `sim`) that
//! tests drive the engine logic with.
//!
//! This module must never return a slot, or free the arena, while a raw read into it may still
//! be in a backend.

pub(crate) mod pool;
/// The simulated faulty disk: compiled for the crate's own tests and with the `sim` feature
/// (the integration tests turn it on), not in a default build.
#[cfg(any(test, feature = "sim"))]
pub(crate) mod sim;
pub(crate) mod sync;
pub(crate) mod uring;

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use crate::buf::{Arena, ArenaConfig, Slot};
use crate::config::{EngineConfig, EngineKind};
use crate::error::{invalid, shared_path, Error, ErrorKind, Result};
use crate::sys;

/// One raw read handed to a [`Backend`]: already aligned as the file requires.
#[derive(Debug, Clone, Copy)]
pub struct RawRead {
    /// Engine-chosen id, echoed in the [`RawDone`].
    pub id: u64,
    /// Index of the file in the engine's file table (the io_uring fixed-file slot).
    pub file: u32,
    /// The file descriptor.
    pub fd: RawFd,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes to read.
    pub len: u32,
    /// Destination; valid for `len` bytes until the completion is reaped.
    pub buf: *mut u8,
    /// The file was opened with O_DIRECT (offset, length and `buf` are aligned for it).
    pub direct: bool,
}

// SAFETY: `buf` points into an arena slot the engine has reserved for this read; the backend may
// carry the descriptor to a worker thread because nothing else touches that memory until the
// read's completion has been reaped.
unsafe impl Send for RawRead {}

/// The result of a [`RawRead`]: bytes read (≥ 0) or a negative errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDone {
    /// The id of the read it answers.
    pub id: u64,
    /// Bytes read (≥ 0) or a negative errno.
    pub res: i32,
}

/// What moves raw reads: io_uring, a thread pool, synchronous pread, or a simulator.
///
/// A backend owns whatever it needs to run reads (a ring, threads) but never memory: buffers
/// belong to the engine's arena.
pub trait Backend: Send {
    /// Short name for reports.
    fn name(&self) -> &'static str;
    /// Raw reads in flight at most.
    fn capacity(&self) -> usize;
    /// Called when the engine puts `fd`, opened from `path`, at `index` of its file table (or
    /// `-1` and no path to clear it).
    fn register_file(&mut self, _index: u32, _fd: RawFd, _path: Option<&Path>) -> io::Result<()> {
        Ok(())
    }
    /// Queues a raw read. Returns it back if the backend is full.
    ///
    /// # Safety
    /// `op.buf` must be valid for writes of `op.len` bytes, and must not be read, written or
    /// freed by anyone else until this op's [`RawDone`] has been returned by [`Backend::reap`].
    unsafe fn push(&mut self, op: RawRead) -> std::result::Result<(), RawRead>;
    /// Starts what was pushed; blocks until at least `wait` completions can be reaped (fewer
    /// only if fewer are in flight).
    fn submit(&mut self, wait: usize) -> io::Result<()>;
    /// Appends every available completion to `out`.
    fn reap(&mut self, out: &mut Vec<RawDone>);
    /// Asks for every queued or running read to be cancelled. Their completions (−ECANCELED or
    /// the real result) still arrive through [`Backend::reap`].
    fn cancel_all(&mut self);
    /// Syscalls issued so far on the hot path (submission, waiting, the reads themselves).
    fn syscalls(&self) -> u64;
    /// Whether reads use registered (fixed) buffers.
    fn buffers_registered(&self) -> bool {
        false
    }
    /// A line describing setup choices (ring flags, registration) for reports.
    fn describe(&self) -> String {
        self.name().to_string()
    }
    /// Why the read `id` failed, when the backend knows more than its errno (a remote fetch:
    /// the URL and the server's answer). Asked once, when its failure is reaped.
    fn error_detail(&mut self, _id: u64) -> Option<String> {
        None
    }
    /// Whether the read `id` fetched from an object store. Asked once, when it is reaped.
    fn served_remotely(&mut self, _id: u64) -> bool {
        false
    }
}

/// Puts an engine's backend behind another (a loader over a remote dataset: the node cache's
/// gate), given the backend and the engine's configuration.
pub(crate) type BackendWrap<'a> = &'a dyn Fn(Box<dyn Backend>, &EngineConfig) -> Box<dyn Backend>;

/// A file opened by an [`Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(pub u32);

/// What an engine knows of an open file.
#[derive(Debug, Clone)]
pub struct FileInfo {
    /// The path it was opened from.
    pub path: Arc<Path>,
    /// Size when opened.
    pub size: u64,
    /// Opened with O_DIRECT.
    pub direct: bool,
    /// Required alignment of buffer addresses (1 when buffered).
    pub mem_align: u32,
    /// Required alignment of offsets and lengths (1 when buffered).
    pub offset_align: u32,
    /// Which file was opened (device, inode, modification time).
    pub identity: crate::sys::FileIdentity,
}

struct FileEntry {
    info: FileInfo,
    fd: OwnedFd,
    in_flight: u32,
    /// Bytes read through the page cache since the last `POSIX_FADV_DONTNEED`.
    cached_bytes: u64,
}

/// One read of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSpec {
    /// The file to read (from [`Engine::open`]).
    pub file: FileId,
    /// Byte offset in the file; any value.
    pub offset: u64,
    /// Bytes wanted; any value.
    pub len: u32,
    /// Where in the slot the read's aligned span starts; a multiple of the file's `mem_align`.
    /// The requested bytes land at `buf_offset + (offset % offset_align)`.
    pub buf_offset: usize,
}

/// The outcome of one read: where its bytes are in the slot, or why there are none.
///
/// A read that crosses the end of the file delivers the bytes up to the end (as `pread` does);
/// a file that ends before the size it had when opened is an [`ErrorKind::UnexpectedEof`].
pub type ReadOutcome = Result<Range<usize>>;

enum Outcomes {
    None,
    One(ReadOutcome),
    Many(Vec<ReadOutcome>),
}

/// A finished job: the slot back, and one outcome per read in submission order.
pub struct Completion {
    /// What the job was submitted with.
    pub user_data: u64,
    /// The slot the reads landed in, back to the caller.
    pub slot: Slot,
    /// Some read of the job fetched from an object store (a remote dataset's extent that was
    /// not in the node cache).
    pub remote: bool,
    outcomes: Outcomes,
}

impl Completion {
    /// One outcome per [`ReadSpec`] of the job, in order.
    pub fn outcomes(&self) -> &[ReadOutcome] {
        match &self.outcomes {
            Outcomes::None => &[],
            Outcomes::One(o) => std::slice::from_ref(o),
            Outcomes::Many(v) => v,
        }
    }

    /// The single outcome of a one-read job (the first outcome otherwise).
    pub fn outcome(&self) -> &ReadOutcome {
        &self.outcomes()[0]
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("user_data", &self.user_data)
            .field("slot", &self.slot)
            .field("outcomes", &self.outcomes())
            .finish()
    }
}

/// A submission the engine could not take; the slot comes back with the reason.
#[derive(Debug)]
pub struct Rejected {
    /// The slot, back to the caller.
    pub slot: Slot,
    /// Why the submission was refused.
    pub error: Error,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// Counters since the engine was made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Jobs completed.
    pub jobs: u64,
    /// Reads (ReadSpecs) completed, successfully or not.
    pub reads: u64,
    /// Raw reads issued to the backend (≥ reads: short reads and retries add more).
    pub raw_reads: u64,
    /// Bytes delivered to callers (trimmed).
    pub bytes_delivered: u64,
    /// Bytes the backend read (aligned spans).
    pub bytes_read: u64,
    /// Short reads that were resubmitted.
    pub short_reads: u64,
    /// EINTR/EAGAIN retries.
    pub retries: u64,
    /// Reads that ended in an error.
    pub errors: u64,
}

const MAX_RETRIES: u32 = 1000;

struct Op {
    job: u32,
    read: u32,
    file: u32,
    req_offset: u64,
    req_len: u32,
    /// Aligned start of the span in the file.
    base: u64,
    /// Aligned span length (what we ask the backend for in total).
    span: u32,
    /// Bytes of the span read so far.
    done: u32,
    /// Where `base` lands in the arena.
    buf: *mut u8,
    /// `buf` as an offset into the slot (for the delivered range).
    buf_offset: usize,
    retries: u32,
}

struct Job {
    user_data: u64,
    slot: Option<Slot>,
    remaining: u32,
    reads: u32,
    remote: bool,
    outcomes: Outcomes,
}

/// The read engine: one backend, one arena, a file table, and the job/op bookkeeping.
///
/// Not `Sync`: one thread drives it. It may be moved to another thread before its first
/// submission (the io_uring backend binds to the thread that first submits).
pub struct Engine {
    // Field order matters only as a second line of defence: `Drop` drains the backend first.
    backend: Box<dyn Backend>,
    arena: Arc<Arena>,
    kind: EngineKind,
    files: Vec<Option<FileEntry>>,
    ops: Vec<Option<Op>>,
    free_ops: Vec<u32>,
    jobs: Vec<Option<Job>>,
    free_jobs: Vec<u32>,
    /// Ops not yet accepted by the backend.
    pending: VecDeque<u32>,
    /// Ops inside the backend.
    raw_in_flight: usize,
    /// Ops pushed to the backend since its last `submit`.
    unsubmitted: usize,
    ready: VecDeque<Completion>,
    raw_done: Vec<RawDone>,
    stats: EngineStats,
    notices: Vec<String>,
    reads_per_job_max: u32,
    drop_cache_behind: bool,
}

// SAFETY: the only non-Send fields are the raw `buf` pointers of ops, which point into the
// engine's own arena (kept alive by its `Arc`, and `Arena` is Send + Sync). Moving the engine
// moves the sole right to touch those bytes with it; the backend is `Send` by its trait bound.
unsafe impl Send for Engine {}

impl Engine {
    /// Makes an engine of `cfg.kind` (or what `GPUFEED_ENGINE` forces), falling back to the
    /// pread pool where io_uring is unavailable, and saying so in [`Engine::notices`].
    pub fn new(cfg: EngineConfig) -> Result<Engine> {
        let cfg = cfg.with_env()?;
        cfg.validate()?;
        let arena = Arena::new(&ArenaConfig {
            slot_bytes: cfg.slot_bytes,
            slots: cfg.slots,
            huge_pages: cfg.huge_pages,
        })?;
        Engine::build(cfg, arena, None)
    }

    /// Makes an engine over an existing arena (its `slot_bytes` and `slots` replace the
    /// configuration's), so that memory is mapped and faulted in once for many engines — a
    /// loader reuses one arena for every epoch. Slots other holders still own stay theirs.
    pub fn with_arena(cfg: EngineConfig, arena: Arc<Arena>) -> Result<Engine> {
        Engine::over_arena(cfg, arena, None)
    }

    /// [`with_arena`](Self::with_arena), its backend put behind `wrap` (the I/O layer knows
    /// nothing of what wraps it).
    #[cfg_attr(
        not(feature = "remote"),
        allow(
            dead_code,
            reason = "used only with feature remote: the node cache's gate"
        )
    )]
    pub(crate) fn with_arena_wrapped(
        cfg: EngineConfig,
        arena: Arc<Arena>,
        wrap: BackendWrap<'_>,
    ) -> Result<Engine> {
        Engine::over_arena(cfg, arena, Some(wrap))
    }

    fn over_arena(
        cfg: EngineConfig,
        arena: Arc<Arena>,
        wrap: Option<BackendWrap<'_>>,
    ) -> Result<Engine> {
        let cfg = EngineConfig {
            slot_bytes: arena.slot_bytes(),
            slots: arena.slots(),
            ..cfg.with_env()?
        };
        cfg.validate()?;
        Engine::build(cfg, arena, wrap)
    }

    fn build(
        cfg: EngineConfig,
        arena: Arc<Arena>,
        wrap: Option<BackendWrap<'_>>,
    ) -> Result<Engine> {
        let mut notices = Vec::new();
        let (backend, kind): (Box<dyn Backend>, EngineKind) = match cfg.kind {
            EngineKind::Uring | EngineKind::UringBuffered => {
                match uring::UringBackend::new(&cfg, &arena) {
                    Ok((b, mut n)) => {
                        notices.append(&mut n);
                        (Box::new(b), cfg.kind)
                    }
                    Err(e) if uring::unavailable(&e) => {
                        notices.push(format!(
                            "io_uring is unavailable ({}); reads use a pool of {} pread threads \
                             instead (a seccomp profile or kernel.io_uring_disabled can cause this)",
                            e,
                            cfg.pool_threads()
                        ));
                        (
                            Box::new(pool::PoolBackend::new(&cfg)?),
                            EngineKind::PreadPool,
                        )
                    }
                    Err(e) => return Err(Error::io("cannot set up io_uring", e)),
                }
            }
            EngineKind::PreadPool => (Box::new(pool::PoolBackend::new(&cfg)?), cfg.kind),
            EngineKind::Std => (Box::new(sync::SyncBackend::new()), cfg.kind),
        };
        for n in &notices {
            notice(n);
        }
        let backend = match wrap {
            Some(w) => w(backend, &cfg),
            None => backend,
        };
        Ok(Engine::assemble(backend, arena, kind, &cfg, notices))
    }

    /// Makes an engine over any backend (the simulator, in tests). `kind` decides O_DIRECT.
    pub fn with_backend(
        backend: Box<dyn Backend>,
        kind: EngineKind,
        cfg: &EngineConfig,
    ) -> Result<Engine> {
        cfg.validate()?;
        let arena = Arena::new(&ArenaConfig {
            slot_bytes: cfg.slot_bytes,
            slots: cfg.slots,
            huge_pages: cfg.huge_pages,
        })?;
        Ok(Engine::assemble(backend, arena, kind, cfg, Vec::new()))
    }

    /// Makes an engine over any backend and an existing arena (a loader's, so that the
    /// simulated disk can drive a whole loader).
    pub fn with_backend_and_arena(
        backend: Box<dyn Backend>,
        kind: EngineKind,
        cfg: &EngineConfig,
        arena: Arc<Arena>,
    ) -> Result<Engine> {
        let cfg = EngineConfig {
            slot_bytes: arena.slot_bytes(),
            slots: arena.slots(),
            ..cfg.clone()
        };
        cfg.validate()?;
        Ok(Engine::assemble(backend, arena, kind, &cfg, Vec::new()))
    }

    fn assemble(
        backend: Box<dyn Backend>,
        arena: Arc<Arena>,
        kind: EngineKind,
        cfg: &EngineConfig,
        notices: Vec<String>,
    ) -> Engine {
        // Ops beyond the backend's capacity wait in `pending`; allow a few jobs' worth, or what
        // the configuration asks for (a loader: every group it may have in flight, whole).
        let ops_max = match cfg.reads_in_flight_max {
            0 => (backend.capacity() * 4).max(cfg.reads_per_job_max as usize),
            n => (n as usize).max(cfg.reads_per_job_max as usize),
        };
        let jobs_max = cfg.slots as usize;
        Engine {
            backend,
            arena,
            kind,
            files: (0..cfg.files_max).map(|_| None).collect(),
            ops: (0..ops_max).map(|_| None).collect(),
            free_ops: (0..ops_max as u32).rev().collect(),
            jobs: (0..jobs_max).map(|_| None).collect(),
            free_jobs: (0..jobs_max as u32).rev().collect(),
            pending: VecDeque::with_capacity(ops_max),
            raw_in_flight: 0,
            unsubmitted: 0,
            ready: VecDeque::with_capacity(jobs_max),
            raw_done: Vec::with_capacity(ops_max),
            stats: EngineStats::default(),
            notices,
            reads_per_job_max: cfg.reads_per_job_max,
            drop_cache_behind: cfg.drop_cache_behind,
        }
    }

    /// The arena whose slots this engine reads into.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// The backend kind actually in use (after fallbacks).
    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    /// The backend's description (ring flags, registration).
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// Whether io_uring fixed buffers are in use.
    pub fn buffers_registered(&self) -> bool {
        self.backend.buffers_registered()
    }

    /// Things the engine decided that the user should know (fallbacks, with numbers and fixes).
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    /// Counters since creation.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Syscalls the backend issued so far.
    pub fn syscalls(&self) -> u64 {
        self.backend.syscalls()
    }

    /// Jobs submitted and not yet returned by [`Engine::pop`].
    pub fn in_flight(&self) -> usize {
        self.jobs.len() - self.free_jobs.len()
    }

    /// Opens `path` for reading: O_DIRECT when the engine kind uses it and the file system
    /// accepts it (alignment from `statx(STATX_DIOALIGN)`, 4096 if not reported), buffered
    /// otherwise (said once in [`Engine::notices`]).
    pub fn open(&mut self, path: impl AsRef<Path>) -> Result<FileId> {
        let path = path.as_ref();
        let shared = shared_path(path);
        let index = self.files.iter().position(|f| f.is_none()).ok_or_else(|| {
            Error::new(
                ErrorKind::Busy,
                format!("all {} file entries are in use", self.files.len()),
            )
            .with_path(shared.clone())
        })?;
        let mut direct = self.kind.direct();
        let fd = if direct {
            match sys::open_read(path, true) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    direct = false;
                    let msg = format!(
                        "{}: the file system refuses O_DIRECT; reading it through the page cache \
                         (with posix_fadvise to keep the cache from filling)",
                        path.display()
                    );
                    notice(&msg);
                    self.notices.push(msg);
                    sys::open_read(path, false)
                        .map_err(|e| Error::io("cannot open", e).with_path(shared.clone()))?
                }
                Err(e) => return Err(Error::io("cannot open", e).with_path(shared)),
            }
        } else {
            sys::open_read(path, false)
                .map_err(|e| Error::io("cannot open", e).with_path(shared.clone()))?
        };
        let st = match sys::statx_fd(fd.as_fd()) {
            Ok(st) => st,
            Err(e) => return Err(Error::io("cannot stat", e).with_path(shared)),
        };
        if !st.is_regular {
            return Err(invalid("not a regular file").with_path(shared));
        }
        let (mem_align, offset_align) = if direct {
            (
                st.dio_mem_align.unwrap_or(4096).max(1),
                st.dio_offset_align.unwrap_or(4096).max(1),
            )
        } else {
            (1, 1)
        };
        if !direct {
            // Random access: no readahead of bytes nobody asked for.
            let _ = sys::fadvise(fd.as_fd(), 0, 0, crate::sys::Advice::POSIX_FADV_RANDOM);
        }
        if let Err(e) = self
            .backend
            .register_file(index as u32, fd.as_raw_fd(), Some(path))
        {
            return Err(Error::io("cannot register file with the backend", e).with_path(shared));
        }
        self.files[index] = Some(FileEntry {
            info: FileInfo {
                path: shared,
                size: st.size,
                direct,
                mem_align,
                offset_align,
                identity: st.identity,
            },
            fd,
            in_flight: 0,
            cached_bytes: 0,
        });
        Ok(FileId(index as u32))
    }

    /// Closes a file. Fails (Busy) while reads of it are in flight.
    pub fn close(&mut self, file: FileId) -> Result<()> {
        let entry = self.file_entry(file)?;
        if entry.in_flight > 0 {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{} reads of this file are in flight", entry.in_flight),
            )
            .with_path(entry.info.path.clone()));
        }
        let _ = self.backend.register_file(file.0, -1, None);
        self.files[file.0 as usize] = None; // closes the fd
        Ok(())
    }

    /// What the engine knows of an open file.
    pub fn file_info(&self, file: FileId) -> Result<&FileInfo> {
        Ok(&self.file_entry(file)?.info)
    }

    /// Which file `file`'s descriptor is now, and its size (one `statx`): a file copied over
    /// or cut since it was opened shows it here.
    pub fn stat_now(&self, file: FileId) -> Result<(crate::sys::FileIdentity, u64)> {
        let e = self.file_entry(file)?;
        let st = crate::sys::statx_fd(e.fd.as_fd())
            .map_err(|err| Error::io("cannot stat", err).with_path(e.info.path.clone()))?;
        Ok((st.identity, st.size))
    }

    fn file_entry(&self, file: FileId) -> Result<&FileEntry> {
        self.files
            .get(file.0 as usize)
            .and_then(|f| f.as_ref())
            .ok_or_else(|| invalid(format!("file id {} is not open", file.0)))
    }

    /// For a read of `len` bytes at `offset`: (where the bytes start inside the aligned span,
    /// the span's length). A slot needs `buf_offset + span` bytes for it.
    pub fn placement(&self, file: FileId, offset: u64, len: u32) -> Result<(usize, usize)> {
        let info = &self.file_entry(file)?.info;
        let (base, span) = widen(offset, len, info.offset_align);
        Ok(((offset - base) as usize, span as usize))
    }

    /// Submits a job of one read. See [`Engine::submit`].
    pub fn submit_one(
        &mut self,
        slot: Slot,
        read: ReadSpec,
        user_data: u64,
    ) -> std::result::Result<(), Rejected> {
        self.submit(slot, std::slice::from_ref(&read), user_data)
    }

    /// Submits a job: every read lands in `slot`. The slot comes back in a [`Completion`] from
    /// [`Engine::pop`] once all reads finished, or at once in a [`Rejected`] if the job is
    /// invalid (bad file id, a span outside the slot, a misaligned `buf_offset`) or the engine is
    /// full (`ErrorKind::Busy`: pop completions, then resubmit).
    ///
    /// Reads are queued; [`Engine::flush`] or [`Engine::wait`] starts them.
    pub fn submit(
        &mut self,
        slot: Slot,
        reads: &[ReadSpec],
        user_data: u64,
    ) -> std::result::Result<(), Rejected> {
        if let Err(error) = self.check_job(&slot, reads) {
            return Err(Rejected { slot, error });
        }
        let Some(job_id) = self.free_jobs.pop() else {
            return Err(Rejected {
                slot,
                error: Error::new(ErrorKind::Busy, "every job entry is in flight"),
            });
        };
        // Zero-length reads finish at once; the others each need an op entry.
        let live = reads.iter().filter(|r| r.len > 0).count();
        if live > self.free_ops.len() {
            self.free_jobs.push(job_id);
            return Err(Rejected {
                slot,
                error: Error::new(
                    ErrorKind::Busy,
                    format!(
                        "job needs {live} read entries, {} are free",
                        self.free_ops.len()
                    ),
                ),
            });
        }
        let slot_ptr = self.arena.slot_ptr(&slot);
        let outcomes = match reads.len() {
            0 => Outcomes::None,
            1 => Outcomes::One(Ok(0..0)),
            n => Outcomes::Many((0..n).map(|_| Ok(0..0)).collect()),
        };
        self.jobs[job_id as usize] = Some(Job {
            user_data,
            slot: Some(slot),
            remaining: live as u32,
            reads: reads.len() as u32,
            remote: false,
            outcomes,
        });
        for (i, r) in reads.iter().enumerate() {
            let entry = self.files[r.file.0 as usize].as_mut().expect("checked");
            let (base, span) = widen(r.offset, r.len, entry.info.offset_align);
            if r.len == 0 {
                let at = r.buf_offset + (r.offset - base) as usize;
                self.set_outcome(job_id, i as u32, Ok(at..at));
                continue;
            }
            entry.in_flight += 1;
            let op_id = self.free_ops.pop().expect("counted above");
            self.ops[op_id as usize] = Some(Op {
                job: job_id,
                read: i as u32,
                file: r.file.0,
                req_offset: r.offset,
                req_len: r.len,
                base,
                span,
                done: 0,
                // Inside the slot: check_job verified buf_offset + span ≤ slot_bytes. (Plain
                // arithmetic; what may write there is argued where the read is pushed.)
                buf: slot_ptr.wrapping_add(r.buf_offset),
                buf_offset: r.buf_offset,
                retries: 0,
            });
            self.pending.push_back(op_id);
        }
        if live == 0 {
            self.finish_job(job_id);
        }
        self.pump();
        Ok(())
    }

    fn check_job(&self, slot: &Slot, reads: &[ReadSpec]) -> Result<()> {
        if !self.arena.owns(slot) {
            return Err(invalid("slot belongs to another arena"));
        }
        if reads.len() > self.reads_per_job_max as usize {
            return Err(invalid(format!(
                "job has {} reads; reads_per_job_max is {}",
                reads.len(),
                self.reads_per_job_max
            )));
        }
        let slot_bytes = self.arena.slot_bytes();
        for r in reads {
            let entry = self.file_entry(r.file)?;
            let info = &entry.info;
            if r.buf_offset % info.mem_align as usize != 0 {
                return Err(invalid(format!(
                    "buf_offset {} is not a multiple of the file's memory alignment {}",
                    r.buf_offset, info.mem_align
                ))
                .with_path(info.path.clone())
                .with_range(r.offset, r.len as u64));
            }
            let (_, span) = widen(r.offset, r.len, info.offset_align);
            if r.buf_offset as u64 + span as u64 > slot_bytes as u64 {
                return Err(invalid(format!(
                    "read needs {} bytes at slot offset {} but slots hold {slot_bytes}",
                    span, r.buf_offset
                ))
                .with_path(info.path.clone())
                .with_range(r.offset, r.len as u64));
            }
        }
        Ok(())
    }

    /// Moves pending ops into the backend while it has room.
    fn pump(&mut self) {
        let cap = self.backend.capacity();
        while self.raw_in_flight < cap {
            let Some(op_id) = self.pending.pop_front() else {
                break;
            };
            let op = self.ops[op_id as usize]
                .as_ref()
                .expect("pending op exists");
            let entry = self.files[op.file as usize].as_ref().expect("file open");
            let raw = RawRead {
                id: op_id as u64,
                file: op.file,
                fd: entry.fd.as_raw_fd(),
                offset: op.base + op.done as u64,
                len: op.span - op.done,
                // Inside the slot: done ≤ span, and the span fits it.
                buf: op.buf.wrapping_add(op.done as usize),
                direct: entry.info.direct,
            };
            // SAFETY: `raw.buf..+len` lies in the slot of this op's job; the engine holds that
            // slot's token (in `jobs`) and gives it back only after every op of the job has been
            // reaped, so nobody else reads, writes or frees that memory meanwhile. The arena
            // outlives the backend (Drop drains first).
            match unsafe { self.backend.push(raw) } {
                Ok(()) => {
                    self.raw_in_flight += 1;
                    self.unsubmitted += 1;
                    self.stats.raw_reads += 1;
                }
                Err(_) => {
                    self.pending.push_front(op_id);
                    break;
                }
            }
        }
    }

    /// Starts queued reads without waiting.
    pub fn flush(&mut self) -> Result<()> {
        self.pump();
        self.submit_backend(0)?;
        self.reap();
        Ok(())
    }

    fn submit_backend(&mut self, want: usize) -> Result<()> {
        self.unsubmitted = 0;
        self.backend
            .submit(want)
            .map_err(|e| Error::io("cannot submit reads", e))
    }

    /// Starts queued reads and waits until at least `min_jobs` completions are ready for
    /// [`Engine::pop`] (fewer if fewer jobs are in flight). Returns the number ready.
    ///
    /// One call is one `io_uring_enter` in the common case: it submits what was queued and waits.
    pub fn wait(&mut self, min_jobs: usize) -> Result<usize> {
        let min_jobs = min_jobs.min(self.in_flight());
        loop {
            self.pump();
            if self.ready.len() >= min_jobs {
                // Enough is ready, but reads just queued must still reach the device.
                if self.unsubmitted > 0 {
                    self.submit_backend(0)?;
                    self.reap();
                }
                return Ok(self.ready.len());
            }
            if self.raw_in_flight == 0 && self.pending.is_empty() {
                // Every unfinished job has an op pending or in flight, so this cannot happen.
                debug_assert!(false, "engine accounting out of step");
                return Ok(self.ready.len());
            }
            let want = usize::from(self.raw_in_flight > 0);
            self.submit_backend(want)?;
            self.reap();
        }
    }

    /// The next finished job, if any.
    pub fn pop(&mut self) -> Option<Completion> {
        self.ready.pop_front()
    }

    fn reap(&mut self) {
        let mut done = std::mem::take(&mut self.raw_done);
        done.clear();
        self.backend.reap(&mut done);
        for d in done.drain(..) {
            self.raw_in_flight -= 1;
            self.complete_raw(d);
        }
        self.raw_done = done;
    }

    fn complete_raw(&mut self, d: RawDone) {
        let op_id = d.id as u32;
        let op = self.ops[op_id as usize]
            .as_mut()
            .expect("completion for a live op");
        let entry = self.files[op.file as usize].as_mut().expect("file open");
        if self.backend.served_remotely(d.id) {
            if let Some(job) = self.jobs[op.job as usize].as_mut() {
                job.remote = true;
            }
        }
        if d.res < 0 {
            let errno = -d.res;
            if (errno == libc::EINTR || errno == libc::EAGAIN) && op.retries < MAX_RETRIES {
                op.retries += 1;
                self.stats.retries += 1;
                self.pending.push_back(op_id);
                return;
            }
            let msg = if errno == libc::EINVAL && entry.info.direct {
                "O_DIRECT read rejected (alignment)"
            } else {
                "read failed"
            };
            let err = match self.backend.error_detail(d.id) {
                Some(why) => Error::new(ErrorKind::Io, why),
                None => Error::errno(msg, errno),
            }
            .with_path(entry.info.path.clone())
            .with_range(op.req_offset, op.req_len as u64);
            self.finish_op(op_id, Err(err));
            return;
        }
        let n = d.res as u32;
        self.stats.bytes_read += n as u64;
        if !entry.info.direct && self.drop_cache_behind {
            entry.cached_bytes += n as u64;
            if entry.cached_bytes >= DONTNEED_EVERY_BYTES {
                // Keep buffered reads from filling the page cache: drop what this file left.
                let _ = sys::fadvise(
                    entry.fd.as_fd(),
                    0,
                    0,
                    crate::sys::Advice::POSIX_FADV_DONTNEED,
                );
                entry.cached_bytes = 0;
            }
        }
        op.done = (op.done + n).min(op.span);
        let req_end = op.req_offset + op.req_len as u64;
        let reached = op.base + op.done as u64;
        // The bytes we must have: up to the request's end, or to the end of the file as it was
        // when opened if the request crosses it (pread semantics).
        let needed_end = req_end.min(entry.info.size);
        if reached >= needed_end || op.done == op.span {
            let delivered = reached.min(req_end).saturating_sub(op.req_offset) as usize;
            let start = op.buf_offset + (op.req_offset - op.base) as usize;
            self.stats.bytes_delivered += delivered as u64;
            self.finish_op(op_id, Ok(start..start + delivered));
            return;
        }
        // Short of what we need. O_DIRECT returns a partial block only at the end of the file,
        // and any read returns 0 there: either way the file now ends before `needed_end`.
        let align = entry.info.offset_align;
        if n == 0 || (entry.info.direct && !op.done.is_multiple_of(align)) {
            let err = Error::new(
                ErrorKind::UnexpectedEof,
                format!(
                    "file ended at byte {reached}, before the end of the read (it was {} bytes \
                     when opened; did it shrink?)",
                    entry.info.size
                ),
            )
            .with_path(entry.info.path.clone())
            .with_range(op.req_offset, op.req_len as u64);
            self.finish_op(op_id, Err(err));
            return;
        }
        // A short read that made progress: issue the rest.
        self.stats.short_reads += 1;
        self.pending.push_back(op_id);
    }

    fn finish_op(&mut self, op_id: u32, outcome: ReadOutcome) {
        let op = self.ops[op_id as usize].take().expect("live op");
        self.free_ops.push(op_id);
        if let Some(f) = self.files[op.file as usize].as_mut() {
            f.in_flight -= 1;
        }
        self.stats.reads += 1;
        if outcome.is_err() {
            self.stats.errors += 1;
        }
        self.set_outcome(op.job, op.read, outcome);
        let job = self.jobs[op.job as usize].as_mut().expect("live job");
        job.remaining -= 1;
        if job.remaining == 0 {
            self.finish_job(op.job);
        }
    }

    fn set_outcome(&mut self, job_id: u32, read: u32, outcome: ReadOutcome) {
        let job = self.jobs[job_id as usize].as_mut().expect("live job");
        match &mut job.outcomes {
            Outcomes::One(o) => *o = outcome,
            Outcomes::Many(v) => v[read as usize] = outcome,
            Outcomes::None => {}
        }
    }

    fn finish_job(&mut self, job_id: u32) {
        let mut job = self.jobs[job_id as usize].take().expect("live job");
        self.free_jobs.push(job_id);
        self.stats.jobs += 1;
        if job.reads == 0 {
            job.outcomes = Outcomes::None;
        }
        self.ready.push_back(Completion {
            user_data: job.user_data,
            slot: job.slot.take().expect("job holds its slot"),
            remote: job.remote,
            outcomes: job.outcomes,
        });
    }

    /// Finishes every op waiting to be issued with an [`ErrorKind::Cancelled`] error saying
    /// `why`, naming its file and range.
    fn cancel_pending(&mut self, why: &'static str) {
        while let Some(op_id) = self.pending.pop_front() {
            let op = self.ops[op_id as usize].as_ref().expect("pending op");
            let entry = self.files[op.file as usize].as_ref().expect("file open");
            let err = Error::new(ErrorKind::Cancelled, why)
                .with_path(entry.info.path.clone())
                .with_range(op.req_offset, op.req_len as u64);
            self.finish_op(op_id, Err(err));
        }
    }

    /// Cancels everything in flight and waits until the backend holds no read. Cancelled reads
    /// complete with [`ErrorKind::Cancelled`] (or their real result, if they finished first).
    pub fn cancel_all(&mut self) -> Result<()> {
        // Ops the backend never saw are cancelled right here.
        self.cancel_pending("read cancelled before it was issued");
        if self.raw_in_flight > 0 {
            self.backend.cancel_all();
        }
        while self.raw_in_flight > 0 {
            self.submit_backend(1)
                .map_err(|e| Error::io("cannot drain reads", std::io::Error::from(e)))?;
            let mut done = std::mem::take(&mut self.raw_done);
            done.clear();
            self.backend.reap(&mut done);
            for d in done.drain(..) {
                self.raw_in_flight -= 1;
                // A retry or continuation would re-issue; cancel it instead.
                let d = if d.res == -libc::EINTR || d.res == -libc::EAGAIN {
                    RawDone {
                        id: d.id,
                        res: -libc::ECANCELED,
                    }
                } else {
                    d
                };
                self.complete_raw(d);
            }
            self.raw_done = done;
            // Short-read continuations re-entered `pending`: cancel them too.
            self.cancel_pending("read cancelled mid-way");
        }
        Ok(())
    }
}

/// Buffered reads call `POSIX_FADV_DONTNEED` on their file after this many bytes.
const DONTNEED_EVERY_BYTES: u64 = 64 << 20;

/// (aligned start, aligned span) covering `offset..offset+len`.
fn widen(offset: u64, len: u32, align: u32) -> (u64, u32) {
    let a = align as u64;
    let base = offset / a * a;
    if len == 0 {
        return (base, 0);
    }
    let end = (offset + len as u64).div_ceil(a) * a;
    (base, (end - base) as u32)
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Cancel, then drain every completion before anything is unregistered or freed.
        if let Err(e) = self.cancel_all() {
            // The backend may still write into the arena: never free it. Leaking is the only
            // sound choice left.
            notice(&format!(
                "engine could not drain its reads on drop ({}); leaking its arena so no read \
                 lands in freed memory",
                e.report()
            ));
            std::mem::forget(self.arena.clone());
            let backend = std::mem::replace(&mut self.backend, Box::new(sync::SyncBackend::new()));
            std::mem::forget(backend);
        }
        // Return slots of finished-but-unpopped jobs.
        for c in self.ready.drain(..) {
            self.arena.put(c.slot);
        }
        // Files close as their entries drop, after every read was drained above.
        self.files.clear();
    }
}

pub(crate) use crate::util::notice;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("kind", &self.kind)
            .field("backend", &self.backend.describe())
            .field("in_flight", &self.in_flight())
            .field("stats", &self.stats)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::widen;

    #[test]
    fn widen_covers_and_aligns() {
        assert_eq!(widen(0, 4096, 4096), (0, 4096));
        assert_eq!(widen(1, 1, 4096), (0, 4096));
        assert_eq!(widen(4095, 2, 4096), (0, 8192));
        assert_eq!(widen(10, 0, 512), (0, 0));
        assert_eq!(widen(1000, 100, 1), (1000, 100));
    }
}
