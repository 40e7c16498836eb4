//! The node-wide cache of remote objects on local disk (feature `remote`).
//!
//! Every object of a remote dataset has a *data file* of the object's size — sparse: only the
//! extents fetched so far take disk space — and a *state file* whose bytes say which extents
//! are present. The data files are what the dataset's index points at, so the I/O engine reads
//! a cached extent exactly as it reads a local file (O_DIRECT, io_uring); only an extent that is
//! not present goes to the object store, through a gate in front of the engine's backend.
//!
//! ```text
//! DIR/usage                          node-wide counters (bytes cached, GETs, bytes fetched…)
//! DIR/data/s3/BUCKET/KEY             the object's bytes, extent by extent (sparse)
//! DIR/state/s3/BUCKET/KEY            header (size, ETag, extent bytes), then one byte per extent
//! ```
//!
//! **Shared by every process on the node.** The state and usage files are mapped shared, so
//! their bytes are atomics across processes. An extent is fetched under an open-file-description
//! lock on its state byte (taken by each fetch on an open of its own, so threads exclude each
//! other as processes do): whoever waits on the lock finds the extent present when it gets it,
//! and reads it from disk instead of fetching it again — one GET per extent per node, however
//! many ranks. The kernel drops the lock of a process that dies, so no lock goes stale.
//!
//! **Atomic publication.** An extent's bytes are written and made durable (`fdatasync`) before
//! its state byte says present (a release store that readers load with acquire): a half-written
//! extent is never read. A present extent stays present until the object changes.
//!
//! **Invalidation.** The state file's header holds the object's size, ETag and the extent size;
//! opening an object whose listing differs empties the data file and marks every extent absent.
//! Every GET asks for the listed ETag (`If-Match`), so an object replaced mid-epoch is an error,
//! not a mix of two versions.
//!
//! **Keep what fits.** An extent is admitted only while the node's cached bytes stay within the
//! limit (a compare-and-swap on the shared counter); once full, fetched extents go to the reader
//! and are not written. With every extent read once per epoch no policy can hit more than
//! cache/dataset of the reads, and keeping what fits reaches that bound where recency-based
//! eviction (LRU, FIFO) falls far below it (docs/DECISIONS.md, the replay). A write that
//! fails (a full disk) gives its bytes back to the counter and the extent is served uncached,
//! with one notice.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{invalid, Error, Result};
use crate::remote::{ObjectInfo, Store};
use crate::sys::{ofd_lock, SharedMap};
use crate::util::Unpoison;

/// The default extent: the unit fetched, cached and counted (a multiple of 4 KiB).
pub const EXTENT_BYTES_DEFAULT: u64 = 8 << 20;
/// The smallest and largest extents a cache accepts.
pub const EXTENT_BYTES_MIN: u64 = 64 << 10;
/// See [`EXTENT_BYTES_MIN`].
pub const EXTENT_BYTES_MAX: u64 = 256 << 20;

const USAGE_MAGIC: &[u8; 8] = b"GPFCUSE1";
const STATE_MAGIC: &[u8; 8] = b"GPFSTAT1";
/// Bytes of a state file before its extent bytes (and of the usage file).
const HEADER_BYTES: usize = 4096;
/// The longest ETag kept (longer ones are stored as their crc32c, which still changes with them).
const ETAG_MAX: usize = 1024;

/// The counters in the usage file, at these offsets.
const U_USED: usize = 64;
const U_GETS: usize = 72;
const U_FETCHED: usize = 80;
const U_DIRECT: usize = 88;
const U_WRITTEN: usize = 96;
const U_WAITS: usize = 104;
/// The limit last given to the cache (0: none given yet); an opener that gives none uses it.
const U_LIMIT: usize = 112;

/// What the node's cache holds and has done, summed over every process that used it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheCounters {
    /// Bytes of extents present (what counts against the limit).
    pub cached_bytes: u64,
    /// The limit this process opened the cache with.
    pub limit_bytes: u64,
    /// GET requests made to fill extents (one per extent fetched).
    pub gets: u64,
    /// Bytes those GETs returned.
    pub fetched_bytes: u64,
    /// Fetched bytes handed to the reader without being cached (the cache was full).
    pub direct_bytes: u64,
    /// Fetched bytes written to the cache.
    pub written_bytes: u64,
    /// Times a reader waited for another's fetch of the same extent and then read it from disk.
    pub waits: u64,
}

/// A node cache directory, opened with a limit.
pub struct NodeCache {
    dir: PathBuf,
    limit: u64,
    extent_bytes: u64,
    usage: SharedMap,
    objects: Mutex<HashMap<String, Arc<CachedObject>>>,
    full_noticed: AtomicBool,
    /// Where fetched extents go to be written behind (started on the first).
    writer: Mutex<Option<std::sync::mpsc::Sender<WriteJob>>>,
    /// Bytes of extents to be cached that are being fetched, written or synced (reserved
    /// before the GET, given back when published or dropped): the write backlog.
    pending: (Mutex<u64>, std::sync::Condvar),
    /// Extent buffers to reuse.
    bufs: Mutex<Vec<crate::sys::Mapping>>,
    /// Published extents whose bytes are kept in memory for readers still to come (read-ahead
    /// fetches extents before their readers), oldest first, and their bytes.
    retained: Mutex<Retained>,
}

/// Published extents held in memory, oldest first (object, extent, bytes), and their bytes.
type Retained = (VecDeque<(std::sync::Weak<CachedObject>, u64, u64)>, u64);

/// Extent buffers kept for reuse at most (fetch threads and queued writes hold the rest).
const BUFS_POOLED_MAX: usize = 32;

/// A fetched extent to write, make durable and publish; `lock` holds the extent's lock until
/// it is dropped, after publication.
struct WriteJob {
    obj: Arc<CachedObject>,
    extent: u64,
    offset: u64,
    bytes: Arc<ExtentBuf>,
    /// Held, not read: dropping it releases the extent's lock.
    _lock: File,
}

/// Writer threads per cache, and extents queued for them at most (each holds its bytes): a disk
/// slower than the store holds the fetches back.
const WRITERS: usize = 8;
/// Bytes of fetched extents waiting to be written and made durable at most (at least two
/// extents): see `NodeCache::reserve_write`.
const WRITE_BACKLOG_BYTES: u64 = 256 << 20;
/// Bytes of published extents kept in memory for the readers still to come, at most (oldest
/// let go first; at least two extents): fetched bytes are not read back from the disk.
const RETAINED_BYTES: u64 = 256 << 20;

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCache")
            .field("dir", &self.dir)
            .field("limit", &self.limit)
            .finish()
    }
}

fn io_err(what: &str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let what = what.to_string();
    let path = path.to_path_buf();
    move |e| Error::io(what, e).with_path(path)
}

/// Free bytes for an unprivileged writer on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| io_err("cannot statvfs the cache directory", dir)(e.into()))?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Starts the cache's writer threads and its syncer: the writers write extents as they come
/// (O_DIRECT, in parallel) and pass them on; the syncer takes every written extent waiting,
/// makes them durable with one `fdatasync` per data file, and publishes them (fio on this VM's
/// disk, 8 MiB writes by 8 writers: 441–574 MiB/s with a sync after each, 632–715 without).
/// `None` if no thread could be started.
fn start_writers() -> Option<std::sync::mpsc::Sender<WriteJob>> {
    // Unbounded: what is queued is bounded by the backlog reserved before each GET.
    let (tx, rx) = std::sync::mpsc::channel::<WriteJob>();
    let (synced_tx, synced_rx) = std::sync::mpsc::channel::<WriteJob>();
    let syncer = std::thread::Builder::new()
        .name("gpufeed-cache-sync".into())
        .spawn(move || {
            // Ends when every writer (every sender) is gone.
            while let Ok(first) = synced_rx.recv() {
                let mut batch = vec![first];
                batch.extend(synced_rx.try_iter());
                publish(batch);
            }
        });
    if syncer.is_err() {
        return None;
    }
    let rx = Arc::new(Mutex::new(rx));
    let mut started = 0;
    for k in 0..WRITERS {
        let rx = rx.clone();
        let synced_tx = synced_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("gpufeed-cache-write-{k}"))
            .spawn(move || loop {
                // The threads end when every sender (the cache) is gone.
                let Ok(job) = rx.lock().unpoisoned().recv() else {
                    return;
                };
                match job.obj.write_extent(&job) {
                    Ok(()) => {
                        if let Err(std::sync::mpsc::SendError(job)) = synced_tx.send(job) {
                            publish(vec![job]);
                        }
                    }
                    Err(e) => {
                        job.obj.write_failed(&job, &e);
                        finish(job);
                    }
                }
            });
        started += spawned.is_ok() as usize;
    }
    (started > 0).then_some(tx)
}

/// Writes, syncs and publishes one extent on this thread.
fn publish_now(job: WriteJob) {
    match job.obj.write_extent(&job) {
        Ok(()) => publish(vec![job]),
        Err(e) => {
            job.obj.write_failed(&job, &e);
            finish(job);
        }
    }
}

/// Makes written extents durable (one `fdatasync` per data file) and publishes them.
fn publish(batch: Vec<WriteJob>) {
    let mut by_object: Vec<Vec<WriteJob>> = Vec::new();
    for job in batch {
        match by_object
            .iter_mut()
            .find(|g| Arc::ptr_eq(&g[0].obj, &job.obj))
        {
            Some(g) => g.push(job),
            None => by_object.push(vec![job]),
        }
    }
    for jobs in by_object {
        let obj = jobs[0].obj.clone();
        let synced = File::open(&obj.data_path).and_then(|f| f.sync_data());
        for job in jobs {
            match &synced {
                Ok(()) => obj.mark_published(&job),
                Err(e) => obj.write_failed(&job, e),
            }
            finish(job);
        }
    }
}

/// An extent's write is over (published or not to be): later readers go by the state byte, the
/// extent's lock is released (dropping the job), and `flush` is told.
fn finish(job: WriteJob) {
    let cache = job.obj.cache.clone();
    let n = job.bytes.bytes().len() as u64;
    if job.obj.extent_present(job.extent) {
        cache.retain(&job.obj, job.extent, n);
    } else {
        job.obj.fetching.lock().unpoisoned().remove(&job.extent);
    }
    drop(job);
    cache.written(n);
}

/// The default cache directory: `$GPUFEED_CACHE_DIR`, else `$XDG_CACHE_HOME/gpufeed`, else
/// `~/.cache/gpufeed` (point it at local NVMe on a training node).
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUFEED_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("gpufeed");
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".cache/gpufeed")
}

/// Every cache opened in this process, by directory: ranks that are threads of one process
/// share one (processes share the files).
fn opened() -> &'static Mutex<HashMap<PathBuf, std::sync::Weak<NodeCache>>> {
    static OPENED: OnceLock<Mutex<HashMap<PathBuf, std::sync::Weak<NodeCache>>>> = OnceLock::new();
    OPENED.get_or_init(Mutex::default)
}

impl NodeCache {
    /// Opens (creating) the cache in `dir`. `limit`: the most bytes it may hold, kept for the node
    /// (`None`: the limit last given to this cache, else 90% of what the file system has free
    /// now plus what the cache already holds). `extent_bytes`: the
    /// unit of fetching and caching, a multiple of 4 KiB.
    pub fn open(dir: &Path, limit: Option<u64>, extent_bytes: u64) -> Result<Arc<NodeCache>> {
        if !(EXTENT_BYTES_MIN..=EXTENT_BYTES_MAX).contains(&extent_bytes)
            || !extent_bytes.is_multiple_of(4096)
        {
            return Err(invalid(format!(
                "cache extent of {extent_bytes} bytes: expected a multiple of 4 KiB from {} to {}",
                EXTENT_BYTES_MIN, EXTENT_BYTES_MAX
            )));
        }
        std::fs::create_dir_all(dir).map_err(io_err("cannot create the cache directory", dir))?;
        let dir = dir
            .canonicalize()
            .map_err(io_err("cannot resolve the cache directory", dir))?;
        let mut open = opened().lock().unpoisoned();
        if let Some(c) = open.get(&dir).and_then(|w| w.upgrade()) {
            if c.extent_bytes == extent_bytes && limit.is_none_or(|l| l == c.limit) {
                return Ok(c);
            }
        }
        let path = dir.join("usage");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err("cannot open the cache's usage file", &path))?;
        ofd_lock(f.as_fd(), 0, 1, true).map_err(io_err("cannot lock", &path))?;
        let init = (|| -> io::Result<()> {
            let mut magic = [0u8; 8];
            let len = f.metadata()?.len();
            if len >= HEADER_BYTES as u64 {
                f.read_exact_at(&mut magic, 0)?;
            }
            if &magic != USAGE_MAGIC {
                f.set_len(0)?;
                f.set_len(HEADER_BYTES as u64)?;
                f.write_all_at(USAGE_MAGIC, 0)?;
            }
            Ok(())
        })();
        let _ = ofd_lock(f.as_fd(), 0, 1, false);
        init.map_err(io_err("cannot set up the cache's usage file", &path))?;
        let usage = SharedMap::new(f.as_fd(), HEADER_BYTES).map_err(io_err("cannot map", &path))?;
        // The node has one limit: the last one given, which every opener that names none uses
        // (so `gpufeed cache status` and a rank without the setting keep to the trainer's).
        let stored = usage.u64_at(U_LIMIT);
        let limit = match limit {
            Some(l) => {
                stored.store(l, Ordering::Release);
                l
            }
            None => match stored.load(Ordering::Acquire) {
                0 => free_bytes(&dir)? / 10 * 9 + usage.u64_at(U_USED).load(Ordering::Relaxed),
                l => l,
            },
        };
        let cache = Arc::new(NodeCache {
            dir: dir.clone(),
            limit,
            extent_bytes,
            usage,
            objects: Mutex::default(),
            full_noticed: AtomicBool::new(false),
            writer: Mutex::new(None),
            pending: Default::default(),
            bufs: Mutex::default(),
            retained: Mutex::default(),
        });
        open.insert(dir, Arc::downgrade(&cache));
        Ok(cache)
    }

    /// Queues a fetched extent for the writer threads (starting them, and the syncer, on the
    /// first); where no thread can be started, writes and publishes it here.
    fn write_behind(&self, job: WriteJob) {
        let mut w = self.writer.lock().unpoisoned();
        if w.is_none() {
            *w = start_writers();
        }
        match w.as_ref() {
            Some(tx) => {
                let tx = tx.clone();
                drop(w);
                if let Err(std::sync::mpsc::SendError(job)) = tx.send(job) {
                    publish_now(job);
                }
            }
            None => {
                drop(w);
                publish_now(job);
            }
        }
    }

    /// A page-aligned buffer for an extent of `n` bytes (≤ the extent size), from the pool.
    fn extent_buf(self: &Arc<Self>, n: usize) -> Result<ExtentBuf> {
        debug_assert!(n as u64 <= self.extent_bytes);
        let pooled = self.bufs.lock().unpoisoned().pop();
        let map = match pooled {
            Some(m) => m,
            None => crate::sys::Mapping::new(self.extent_bytes as usize, 4096, false)
                .map_err(|e| Error::io("cannot allocate an extent buffer", e))?,
        };
        Ok(ExtentBuf {
            map: Some(map),
            len: n,
            cache: self.clone(),
        })
    }

    /// Reserves `n` bytes of write backlog for an extent about to be fetched and cached,
    /// waiting while the backlog is full (a disk behind the store holds the fetches back;
    /// letting fetched extents go unwritten instead gained nothing in the first epoch here and
    /// cost a refetch in the next — measured in issue 25).
    fn reserve_write(&self, n: u64) {
        let max = WRITE_BACKLOG_BYTES.max(2 * self.extent_bytes);
        let mut p = self.pending.0.lock().unpoisoned();
        while *p + n > max && *p > 0 {
            p = self.pending.1.wait(p).unpoisoned();
        }
        *p += n;
    }

    /// Keeps a published extent's bytes (its `fetching` slot) for readers still to come, letting
    /// the oldest go past the budget.
    fn retain(&self, obj: &Arc<CachedObject>, extent: u64, n: u64) {
        let max = RETAINED_BYTES.max(2 * self.extent_bytes);
        let mut gone = Vec::new();
        {
            let mut r = self.retained.lock().unpoisoned();
            r.0.push_back((Arc::downgrade(obj), extent, n));
            r.1 += n;
            while r.1 > max {
                let Some(old) = r.0.pop_front() else { break };
                r.1 -= old.2;
                gone.push(old);
            }
        }
        for (o, i, _) in gone {
            if let Some(o) = o.upgrade() {
                o.fetching.lock().unpoisoned().remove(&i);
            }
        }
    }

    /// Gives back `n` bytes of write backlog (the extent is published, or will not be written).
    fn written(&self, n: u64) {
        let mut p = self.pending.0.lock().unpoisoned();
        *p = p.saturating_sub(n);
        self.pending.1.notify_all();
    }

    /// Waits until every extent fetched so far is written and published (`gpufeed cache warm`
    /// does before it exits: queued writes die with the process).
    pub fn flush(&self) {
        let mut p = self.pending.0.lock().unpoisoned();
        while *p > 0 {
            p = self.pending.1.wait(p).unpoisoned();
        }
    }

    /// [`flush`](Self::flush), waiting `limit` at most (a loader fetching meanwhile keeps the
    /// backlog from emptying): whether it emptied.
    pub fn flush_within(&self, limit: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + limit;
        let mut p = self.pending.0.lock().unpoisoned();
        while *p > 0 {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            p = self.pending.1.wait_timeout(p, left).unpoisoned().0;
        }
        true
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The extent size in bytes.
    pub fn extent_bytes(&self) -> u64 {
        self.extent_bytes
    }

    /// The node's counters (every process's).
    pub fn counters(&self) -> CacheCounters {
        let g = |o| self.usage.u64_at(o).load(Ordering::Acquire);
        CacheCounters {
            cached_bytes: g(U_USED),
            limit_bytes: self.limit,
            gets: g(U_GETS),
            fetched_bytes: g(U_FETCHED),
            direct_bytes: g(U_DIRECT),
            written_bytes: g(U_WRITTEN),
            waits: g(U_WAITS),
        }
    }

    fn add(&self, counter: usize, n: u64) {
        self.usage.u64_at(counter).fetch_add(n, Ordering::AcqRel);
    }

    /// Reserves `n` bytes under the limit; false when they do not fit.
    fn admit(&self, n: u64) -> bool {
        self.usage
            .u64_at(U_USED)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&u| u <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
        let _ = self
            .usage
            .u64_at(U_USED)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }

    /// Where an object's files live: `DIR/{data,state}/SCHEME/HOST/KEY`.
    fn object_paths(&self, url: &str) -> Result<(PathBuf, PathBuf)> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid(format!("{url}: not a URL")))?;
        let mut rel = PathBuf::from(scheme);
        for part in rest.split('/').filter(|p| !p.is_empty()) {
            if part == "." || part == ".." || part.contains('\0') {
                return Err(invalid(format!(
                    "{url}: an object key with a `{part}` component cannot be cached"
                )));
            }
            rel.push(part.replace(':', "_"));
        }
        Ok((
            self.dir.join("data").join(&rel),
            self.dir.join("state").join(rel),
        ))
    }

    /// The cached object for `info` of `store`: its data file exists with the object's size and
    /// its state matches the listing (otherwise it is emptied first).
    pub fn object(self: &Arc<Self>, store: &Store, info: &ObjectInfo) -> Result<Arc<CachedObject>> {
        if let Some(o) = self.objects.lock().unpoisoned().get(&info.url) {
            if o.info == *info {
                return Ok(o.clone());
            }
        }
        let (data_path, state_path) = self.object_paths(&info.url)?;
        for p in [&data_path, &state_path] {
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io_err("cannot create a cache directory", parent))?;
            }
        }
        let extents = info.size.div_ceil(self.extent_bytes).max(1);
        let map_len = HEADER_BYTES + extents as usize;
        let state = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&state_path)
            .map_err(io_err("cannot open a cache state file", &state_path))?;
        let data = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&data_path)
            .map_err(io_err("cannot open a cache data file", &data_path))?;
        // The header is checked and (re)written under a lock on it, by one opener at a time.
        ofd_lock(state.as_fd(), 0, HEADER_BYTES as u64, true)
            .map_err(io_err("cannot lock", &state_path))?;
        let r = self.check_state(info, &state, &data, map_len);
        let _ = ofd_lock(state.as_fd(), 0, HEADER_BYTES as u64, false);
        r.map_err(io_err("cannot set up a cache state file", &state_path))?;
        let map =
            SharedMap::new(state.as_fd(), map_len).map_err(io_err("cannot map", &state_path))?;
        let md = data.metadata().map_err(io_err("cannot stat", &data_path))?;
        let obj = Arc::new(CachedObject {
            cache: self.clone(),
            store: store.clone(),
            info: info.clone(),
            data_path,
            state_path,
            extents,
            map,
            fetching: Mutex::default(),
        });
        registry()
            .lock()
            .unpoisoned()
            .insert((md.dev(), md.ino()), obj.clone());
        self.objects
            .lock()
            .unpoisoned()
            .insert(info.url.clone(), obj.clone());
        Ok(obj)
    }

    /// Makes the state file describe `info`: as it is when its header matches, else emptied.
    fn check_state(
        &self,
        info: &ObjectInfo,
        state: &File,
        data: &File,
        map_len: usize,
    ) -> io::Result<()> {
        let header = state_header(info, self.extent_bytes);
        let mut old = vec![0u8; HEADER_BYTES];
        let len = state.metadata()?.len();
        if len >= HEADER_BYTES as u64 {
            state.read_exact_at(&mut old, 0)?;
        }
        if old == header && len >= map_len as u64 && data.metadata()?.len() == info.size {
            return Ok(());
        }
        // A different object (or none yet): give back what its present extents held, drop their
        // blocks, and mark every extent absent. The state file never shrinks (another process may
        // have it mapped); only its extent bytes are zeroed.
        if len > HEADER_BYTES as u64 && old[..8] == STATE_MAGIC[..] {
            let old_size = u64::from_le_bytes(old[16..24].try_into().unwrap_or_default());
            let old_ext = u64::from_le_bytes(old[24..32].try_into().unwrap_or_default()).max(1);
            let mut marks = vec![0u8; (len - HEADER_BYTES as u64) as usize];
            state.read_exact_at(&mut marks, HEADER_BYTES as u64)?;
            let held: u64 = marks
                .iter()
                .enumerate()
                .filter(|(_, &m)| m == PRESENT)
                .map(|(i, _)| {
                    let start = i as u64 * old_ext;
                    old_size.saturating_sub(start).min(old_ext)
                })
                .sum();
            self.release(held);
            state.write_all_at(&vec![0u8; marks.len()], HEADER_BYTES as u64)?;
        }
        data.set_len(0)?;
        data.set_len(info.size)?;
        if len < map_len as u64 {
            state.set_len(map_len as u64)?;
        }
        state.write_all_at(&header, 0)?;
        state.sync_all()?;
        Ok(())
    }

    /// Empties the cache: every object's files and the counters. Run it with no loader using the
    /// cache (`gpufeed cache drop`).
    pub fn drop_all(&self) -> Result<u64> {
        let held = self.counters().cached_bytes;
        for sub in ["data", "state"] {
            let p = self.dir.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(io_err("cannot remove", &p))?;
            }
        }
        for o in [
            U_USED, U_GETS, U_FETCHED, U_DIRECT, U_WRITTEN, U_WAITS, U_LIMIT,
        ] {
            self.usage.u64_at(o).store(0, Ordering::Release);
        }
        self.objects.lock().unpoisoned().clear();
        *self.retained.lock().unpoisoned() = Default::default();
        Ok(held)
    }
}

/// An extent's state byte: absent (0) or present.
const PRESENT: u8 = 1;

fn state_header(info: &ObjectInfo, extent_bytes: u64) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES];
    h[..8].copy_from_slice(STATE_MAGIC);
    let etag = info.etag.as_deref().unwrap_or("").as_bytes();
    let etag: Vec<u8> = if etag.len() > ETAG_MAX {
        crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, etag)
            .to_le_bytes()
            .to_vec()
    } else {
        etag.to_vec()
    };
    h[12..16].copy_from_slice(&(etag.len() as u32).to_le_bytes());
    h[16..24].copy_from_slice(&info.size.to_le_bytes());
    h[24..32].copy_from_slice(&extent_bytes.to_le_bytes());
    h[32..32 + etag.len()].copy_from_slice(&etag);
    h
}

/// One remote object in the node cache.
pub struct CachedObject {
    cache: Arc<NodeCache>,
    store: Store,
    info: ObjectInfo,
    data_path: PathBuf,
    state_path: PathBuf,
    extents: u64,
    /// The state file: header, then one byte per extent.
    map: SharedMap,
    /// Extents this process is fetching, until they are published: its other readers of them
    /// take the fetched bytes instead of waiting for the write behind.
    fetching: Mutex<HashMap<u64, Arc<Fetching>>>,
}

/// One extent being fetched by a thread of this process, and what came of it.
#[derive(Default)]
struct Fetching {
    state: Mutex<FetchState>,
    done: std::sync::Condvar,
}

#[derive(Default)]
enum FetchState {
    #[default]
    Running,
    /// Its bytes, until published.
    Bytes(Arc<ExtentBuf>),
    /// On disk after all (fetched by another process), or not to be cached (the cache is full,
    /// or the fetch failed): the waiter reads or fetches for itself.
    Elsewhere,
}

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedObject")
            .field("url", &self.info.url)
            .field("data", &self.data_path)
            .finish()
    }
}

/// How [`CachedObject::extent`] found an extent.
enum Extent {
    /// On disk in the data file.
    Present,
    /// Fetched by this call: its bytes (shared with the write behind).
    Fetched(Arc<ExtentBuf>),
    /// The cache is full: only the bytes asked for were fetched, into the caller's buffer.
    Part,
    /// Held in memory by this process (fetched, then published or being written): its bytes.
    Held(Arc<ExtentBuf>),
}

/// One extent's bytes in page-aligned memory from the cache's pool (so it can be written with
/// O_DIRECT, and its pages are not faulted in afresh for every fetch); back to the pool on drop.
pub(crate) struct ExtentBuf {
    map: Option<crate::sys::Mapping>,
    len: usize,
    cache: Arc<NodeCache>,
}

impl ExtentBuf {
    fn bytes(&self) -> &[u8] {
        match &self.map {
            // SAFETY: the mapping holds at least `len` bytes (taken for this extent's size),
            // written by the fetch before the buffer was shared; nobody writes them since.
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr(), self.len) },
            None => &[],
        }
    }
}

impl Drop for ExtentBuf {
    fn drop(&mut self) {
        if let Some(m) = self.map.take() {
            let mut pool = self.cache.bufs.lock().unpoisoned();
            if pool.len() < BUFS_POOLED_MAX && m.len() as u64 == self.cache.extent_bytes {
                pool.push(m);
            }
        }
    }
}

impl CachedObject {
    /// The object as listed.
    pub fn info(&self) -> &ObjectInfo {
        &self.info
    }

    /// The data file the dataset's index points at.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    fn marks(&self) -> &[AtomicU8] {
        self.map.u8s(HEADER_BYTES, self.extents as usize)
    }

    fn extent_range(&self, i: u64) -> Range<u64> {
        let e = self.cache.extent_bytes;
        let start = i * e;
        start..(start + e).min(self.info.size)
    }

    /// The extents holding bytes `range` (empty past the end).
    fn extents_of(&self, range: Range<u64>) -> Range<u64> {
        let end = range.end.min(self.info.size);
        if range.start >= end {
            return 0..0;
        }
        let e = self.cache.extent_bytes;
        range.start / e..(end - 1) / e + 1
    }

    /// Whether every extent holding bytes `range` is on disk.
    pub fn is_present(&self, range: Range<u64>) -> bool {
        let marks = self.marks();
        self.extents_of(range)
            .all(|i| marks[i as usize].load(Ordering::Acquire) == PRESENT)
    }

    /// Bytes of this object on disk.
    pub fn present_bytes(&self) -> u64 {
        let marks = self.marks();
        (0..self.extents)
            .filter(|&i| marks[i as usize].load(Ordering::Acquire) == PRESENT)
            .map(|i| {
                let r = self.extent_range(i);
                r.end - r.start
            })
            .sum()
    }

    /// Extent `i`, which holds the bytes `part`: on disk; or fetched now and cached, when it
    /// fits; or, when the cache is full, only `part` fetched (nothing else of the extent would
    /// be kept). One fetch per node for what is cached: a fetch holds the extent's lock, and
    /// whoever waited on it finds the extent present.
    fn extent(self: &Arc<Self>, i: u64, part: Range<u64>, dst: &mut [u8]) -> Result<Extent> {
        if let Some(b) = self.held(i) {
            return Ok(Extent::Held(b));
        }
        let mark = &self.marks()[i as usize];
        if mark.load(Ordering::Acquire) == PRESENT {
            return Ok(Extent::Present);
        }
        // Another thread of this process fetching it: its bytes, once they are here.
        let slot = match self.claim(i) {
            Ok(mine) => mine,
            Err(theirs) => {
                let mut st = theirs.state.lock().unpoisoned();
                while matches!(*st, FetchState::Running) {
                    st = theirs.done.wait(st).unpoisoned();
                }
                if let FetchState::Bytes(b) = &*st {
                    self.cache.add(U_WAITS, 1);
                    return Ok(Extent::Fetched(b.clone()));
                }
                drop(st);
                if mark.load(Ordering::Acquire) == PRESENT {
                    return Ok(Extent::Present);
                }
                return self.fetch_part(part, dst);
            }
        };
        match self.fetch_claimed(i, &slot) {
            Ok(Extent::Part) => self.fetch_part(part, dst),
            r => r,
        }
    }

    /// Extent `i`'s bytes, if this process fetched it and holds them still (being written, or
    /// published and retained).
    fn held(&self, i: u64) -> Option<Arc<ExtentBuf>> {
        let slot = self.fetching.lock().unpoisoned().get(&i)?.clone();
        let st = slot.state.lock().unpoisoned();
        match &*st {
            FetchState::Bytes(b) => Some(b.clone()),
            _ => None,
        }
    }

    /// Whether reads of `range` go to the data file: every extent is on disk and none is held
    /// in memory (those are copied from there instead of read back).
    pub(crate) fn read_from_disk(&self, range: Range<u64>) -> bool {
        if !self.is_present(range.clone()) {
            return false;
        }
        let f = self.fetching.lock().unpoisoned();
        f.is_empty() || !self.extents_of(range).any(|i| f.contains_key(&i))
    }

    /// Claims extent `i` for a fetch by this thread: its slot if no other thread of this
    /// process is fetching it (`Err` with theirs otherwise).
    fn claim(&self, i: u64) -> std::result::Result<Arc<Fetching>, Arc<Fetching>> {
        let mut f = self.fetching.lock().unpoisoned();
        if let Some(s) = f.get(&i) {
            return Err(s.clone());
        }
        let s = Arc::new(Fetching::default());
        f.insert(i, s.clone());
        Ok(s)
    }

    /// Fetches the claimed extent `i` into the cache if it fits (`Part` when it does not), and
    /// tells the waiters on `slot` what came of it; the slot stays claimed until publication
    /// while there are bytes to share.
    fn fetch_claimed(self: &Arc<Self>, i: u64, slot: &Fetching) -> Result<Extent> {
        let range = self.extent_range(i);
        let n = range.end - range.start;
        let r = if self.cache.admit(n) {
            // A disk behind the store holds the fetches back here (before the GET, so no
            // fetched bytes wait in memory for it).
            self.cache.reserve_write(n);
            self.fetch_reserved(i)
        } else {
            Ok(Extent::Part)
        };
        let shared = match &r {
            Ok(Extent::Fetched(b)) => FetchState::Bytes(b.clone()),
            _ => FetchState::Elsewhere,
        };
        let keep = matches!(shared, FetchState::Bytes(_));
        *slot.state.lock().unpoisoned() = shared;
        slot.done.notify_all();
        if !keep {
            self.fetching.lock().unpoisoned().remove(&i);
        }
        r
    }

    /// Fetches extent `i` ahead of its readers, if it is absent, not being fetched by this
    /// process, and fits in the cache: its readers then take its bytes (or find it on disk).
    /// True if it was fetched.
    pub(crate) fn prefetch(self: &Arc<Self>, i: u64) -> Result<bool> {
        if i >= self.extents || self.extent_present(i) {
            return Ok(false);
        }
        let Ok(slot) = self.claim(i) else {
            return Ok(false);
        };
        Ok(matches!(self.fetch_claimed(i, &slot)?, Extent::Fetched(_)))
    }

    /// The extent holding byte `offset`.
    pub(crate) fn extent_of(&self, offset: u64) -> u64 {
        offset / self.cache.extent_bytes
    }

    /// The cache is full: only the bytes `part` are fetched, into `dst` (nothing else of the
    /// extent would be kept).
    fn fetch_part(&self, part: Range<u64>, dst: &mut [u8]) -> Result<Extent> {
        let cache = &self.cache;
        self.store.get_into(&self.info, part.start, dst)?;
        cache.add(U_GETS, 1);
        cache.add(U_FETCHED, dst.len() as u64);
        cache.add(U_DIRECT, dst.len() as u64);
        Ok(Extent::Part)
    }

    /// Fetches extent `i` into the cache, its bytes already reserved under the limit and in the
    /// write backlog (both given back if another fetched it meanwhile, or if it cannot be
    /// fetched). The bytes go to the
    /// caller at once; the write to disk, its `fdatasync` and the publication happen behind, on
    /// the cache's writer threads, which hold the extent's lock until it is published (so a
    /// reader that waits on the lock finds the extent on disk).
    fn fetch_reserved(self: &Arc<Self>, i: u64) -> Result<Extent> {
        let mark = &self.marks()[i as usize];
        let range = self.extent_range(i);
        let n = range.end - range.start;
        let at = HEADER_BYTES as u64 + i;
        // A lock of this open's own, so that threads exclude each other as processes do.
        let state = File::options()
            .read(true)
            .write(true)
            .open(&self.state_path)
            .map_err(io_err("cannot open a cache state file", &self.state_path));
        let state = match state.and_then(|f| {
            ofd_lock(f.as_fd(), at, 1, true).map_err(io_err("cannot lock", &self.state_path))?;
            Ok(f)
        }) {
            Ok(f) => f,
            Err(e) => {
                self.cache.release(n);
                self.cache.written(n);
                return Err(e);
            }
        };
        if mark.load(Ordering::Acquire) == PRESENT {
            // Fetched (and published) by another while this one waited for the lock.
            self.cache.add(U_WAITS, 1);
            self.cache.release(n);
            self.cache.written(n);
            return Ok(Extent::Present); // dropping `state` releases the lock
        }
        let mut buf = match self.cache.extent_buf(n as usize) {
            Ok(b) => b,
            Err(e) => {
                self.cache.release(n);
                self.cache.written(n);
                return Err(e);
            }
        };
        let map = buf.map.as_ref().expect("a fresh buffer has its mapping");
        // SAFETY: the mapping holds at least `n` bytes and this buffer is not shared yet.
        let dst = unsafe { std::slice::from_raw_parts_mut(map.as_ptr(), n as usize) };
        if let Err(e) = self.store.get_into(&self.info, range.start, dst) {
            self.cache.release(n);
            self.cache.written(n);
            return Err(e);
        }
        buf.len = n as usize;
        let bytes = Arc::new(buf);
        self.cache.add(U_GETS, 1);
        self.cache.add(U_FETCHED, n);
        self.cache.write_behind(WriteJob {
            obj: self.clone(),
            extent: i,
            offset: range.start,
            bytes: bytes.clone(),
            _lock: state,
        });
        Ok(Extent::Fetched(bytes))
    }

    /// Writes a fetched extent to the data file (on a writer thread): O_DIRECT for whole 4 KiB
    /// blocks from page-aligned memory; the object's last, partial extent (or a file system
    /// that refuses O_DIRECT) through the page cache. Not yet durable: the syncer makes it so (`publish`).
    fn write_extent(&self, job: &WriteJob) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let bytes = job.bytes.bytes();
        if (bytes.len() as u64).is_multiple_of(4096) {
            let direct = File::options()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&self.data_path);
            if let Ok(f) = direct {
                if f.write_all_at(bytes, job.offset).is_ok() {
                    return Ok(());
                }
            }
        }
        File::options()
            .write(true)
            .open(&self.data_path)?
            .write_all_at(bytes, job.offset)
    }

    /// A failed write or sync: the reservation goes back, the bytes count as served uncached,
    /// and the first failure of the cache is said.
    fn write_failed(&self, job: &WriteJob, e: &io::Error) {
        let cache = &self.cache;
        let n = job.bytes.bytes().len() as u64;
        cache.release(n);
        cache.add(U_DIRECT, n);
        if !cache.full_noticed.swap(true, Ordering::Relaxed) {
            crate::util::notice(&format!(
                "the node cache cannot write {} ({e}); fetched extents are served \
                 without being cached",
                self.data_path.display()
            ));
        }
    }

    /// Marks written, durable extents present; the extent's readers go by the state byte from
    /// here on (its in-memory bytes are let go).
    fn mark_published(&self, job: &WriteJob) {
        let n = job.bytes.bytes().len() as u64;
        if !(n.is_multiple_of(4096)) {
            // Written through the page cache (now on disk): drop it from there.
            if let Ok(f) = File::open(&self.data_path) {
                let _ = crate::sys::fadvise(
                    f.as_fd(),
                    job.offset,
                    n,
                    crate::sys::Advice::POSIX_FADV_DONTNEED,
                );
            }
        }
        self.marks()[job.extent as usize].store(PRESENT, Ordering::Release);
        self.cache.add(U_WRITTEN, n);
    }

    /// Reads bytes from `offset` into `buf` through the cache, as `pread` would: the count
    /// read (short only at the end of the object). Present extents are read from disk; absent
    /// ones are fetched (and cached if they fit).
    pub fn read_at(self: &Arc<Self>, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_through(buf, offset).map(|(n, _)| n)
    }

    /// [`read_at`](Self::read_at), and whether any of it was fetched from the store.
    pub fn read_through(self: &Arc<Self>, buf: &mut [u8], offset: u64) -> Result<(usize, bool)> {
        let end = (offset + buf.len() as u64).min(self.info.size);
        if offset >= end {
            return Ok((0, false));
        }
        let mut fetched = false;
        let mut file: Option<File> = None;
        for i in self.extents_of(offset..end) {
            let ext = self.extent_range(i);
            let part = offset.max(ext.start)..end.min(ext.end);
            let dst = &mut buf[(part.start - offset) as usize..(part.end - offset) as usize];
            let got = self.extent(i, part.clone(), dst)?;
            match &got {
                Extent::Part => fetched = true,
                Extent::Fetched(bytes) | Extent::Held(bytes) => {
                    // Bytes held in memory were fetched before this read came: it did not wait.
                    fetched |= matches!(got, Extent::Fetched(_));
                    dst.copy_from_slice(
                        &bytes.bytes()
                            [(part.start - ext.start) as usize..(part.end - ext.start) as usize],
                    )
                }
                Extent::Present => {
                    if file.is_none() {
                        file = Some(
                            File::open(&self.data_path)
                                .map_err(io_err("cannot open", &self.data_path))?,
                        );
                    }
                    if let Some(f) = &file {
                        f.read_exact_at(dst, part.start).map_err(|e| {
                            Error::io("cannot read the cache", e)
                                .with_path(self.data_path.clone())
                                .with_range(part.start, part.end - part.start)
                        })?;
                    }
                }
            }
        }
        Ok(((end - offset) as usize, fetched))
    }

    /// Fetches extent `i` into the cache unless it is on disk: the bytes fetched (`None`: it
    /// was present, or another reader fetched it meanwhile); a `Busy` error when the cache is
    /// full.
    pub fn warm_extent(self: &Arc<Self>, i: u64) -> Result<Option<u64>> {
        if i >= self.extents {
            return Err(invalid(format!("{}: no extent {i}", self.info.url)));
        }
        if self.extent_present(i) {
            return Ok(None);
        }
        let ext = self.extent_range(i);
        if !self.cache.admit(ext.end - ext.start) {
            return Err(Error::new(
                crate::ErrorKind::Busy,
                format!(
                    "the node cache is full ({} of {})",
                    crate::util::bytes_human(self.cache.counters().cached_bytes),
                    crate::util::bytes_human(self.cache.limit)
                ),
            ));
        }
        // Warming caches everything it fetches: it waits for the disk instead.
        self.cache.reserve_write(ext.end - ext.start);
        Ok(match self.fetch_reserved(i)? {
            Extent::Fetched(b) => Some(b.len as u64),
            _ => None,
        })
    }

    /// Whether extent `i` is on disk.
    pub fn extent_present(&self, i: u64) -> bool {
        self.marks()
            .get(i as usize)
            .is_some_and(|m| m.load(Ordering::Acquire) == PRESENT)
    }

    /// The cache this object is in.
    pub fn cache(&self) -> &Arc<NodeCache> {
        &self.cache
    }

    /// The number of extents.
    pub fn extent_count(&self) -> u64 {
        self.extents
    }

    /// The extent size.
    pub fn extent_bytes(&self) -> u64 {
        self.cache.extent_bytes
    }
}

/// Every cached object opened in this process, by its data file's (device, inode): how a reader
/// holding only a path or a descriptor learns that a file is a remote object's cache.
type Registry = Mutex<HashMap<(u64, u64), Arc<CachedObject>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// The cached object whose data file `file` is, if any.
pub fn lookup(file: &File) -> Option<Arc<CachedObject>> {
    let md = file.metadata().ok()?;
    lookup_id(md.dev(), md.ino())
}

/// The cached object whose data file has this device and inode, if any.
pub fn lookup_id(dev: u64, ino: u64) -> Option<Arc<CachedObject>> {
    let mut reg = registry().lock().unpoisoned();
    if reg.is_empty() {
        return None;
    }
    let obj = reg.get(&(dev, ino)).cloned()?;
    // Once a data file is deleted (the cache dropped, its folder removed), its inode can be
    // given to any new file, which must not be read as this object: only a data file still at
    // its path with this device and inode is it.
    match std::fs::metadata(&obj.data_path) {
        Ok(md) if md.dev() == dev && md.ino() == ino => Some(obj),
        _ => {
            reg.remove(&(dev, ino));
            None
        }
    }
}

/// Bytes of these files that are remote objects' extents not on disk (0 for local files).
pub fn absent_bytes<'a>(paths: impl IntoIterator<Item = &'a Path>) -> u64 {
    paths
        .into_iter()
        .filter_map(|p| File::open(p).ok().and_then(|file| lookup(&file)))
        .map(|o| {
            o.cache.flush(); // extents fetched and still being written count as present
            o.info.size - o.present_bytes()
        })
        .sum()
}
