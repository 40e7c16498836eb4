//! The node-wide cache of remote objects on local disk (feature `remote`).
//!
//! Every object of a remote dataset has a *data file* of the object's size — sparse: only the
//! extents fetched so far take disk space — and a *state file* whose bytes say which extents
//! are present, with each one's crc32c. The data files are what the dataset's index points at,
//! so the I/O engine reads a cached extent exactly as it reads a local file (O_DIRECT,
//! io_uring); only an extent that is not present goes to the object store, through a gate in
//! front of the engine's backend.
//!
//! ```text
//! DIR/usage                  the cache's marker (magic, layout version, extent size) and the
//!                            node-wide counters (bytes cached, GETs, bytes fetched…)
//! DIR/CACHEDIR.TAG           tells backup tools to skip the directory
//! DIR/data/SCHEME/ORIGIN/HOST/KEY   the object's bytes, extent by extent (sparse)
//! DIR/state/SCHEME/ORIGIN/HOST/KEY  header (URL and origin, size, ETag, extent bytes), one
//!                                   byte per extent, then one crc32c per extent
//! DIR/index/SCHEME/ORIGIN/HOST/KEY  a WebDataset tar's walk (its members), kept for every
//!                                   later open
//! DIR/listing/SCHEME/ORIGIN/HOST/PREFIX  a dataset URL's listing, for an open while the store
//!                                   is down
//!
//! ORIGIN is the server the bucket is on ([`Store::origin`]: an S3 endpoint, `aws`, an Azure
//! account): two endpoints with one bucket and key (a staging store and production, a mirror
//! and AWS) are two objects, and a kept listing serves only the server that wrote it.
//! ```
//!
//! Each key component is a file name through `tree::component_name`, which is injective
//! (`x:y` and `x_y` are two files; `%` and non-ASCII keys read; a component too long for a file
//! name is cut and hashed), the key's directories end in `%` (`p.tar` is a file, the directory
//! of `p.tar/q.tar` is `p.tar%`), and the state file holds the object's URL, which is checked
//! on every open: one object, one cache file.
//!
//! **Trust.** The directory is reached only through `tree` (no link followed, nothing but a
//! regular file of one link opened, private modes), and a directory is used only when it is
//! empty or holds a cache's marker: nothing outside a cache is written, truncated or deleted.
//! Every extent's crc32c is written when it is published and checked the first time a process
//! reads it (on a fetch thread, ahead of the consumer): a damaged extent is fetched again from
//! the store, counted, and said, naming the object's URL.
//!
//! **Shared by every process on the node.** The state and usage files are mapped shared, so
//! their bytes are atomics across processes; their blocks are allocated when they are made, so
//! no write through the mapping can fault on a full disk. An extent is fetched under an
//! open-file-description
//! lock on its state byte (taken by each fetch on an open of its own, so threads exclude each
//! other as processes do): whoever waits on the lock finds the extent present when it gets it,
//! and reads it from disk instead of fetching it again — one GET per extent per node, however
//! many ranks. The kernel drops the lock of a process that dies, so no lock goes stale; the
//! first process to open the cache after every other has gone recounts what it holds (a
//! process killed between a fetch and its publication leaves nothing counted that is not
//! there), and a process that exits normally publishes what it fetched first.
//!
//! **Atomic publication.** An extent's bytes are written and made durable (`fdatasync`) before
//! its state byte says present (a release store that readers load with acquire): a half-written
//! extent is never read. A present extent stays present until the object changes.
//!
//! **Invalidation.** The state file's header holds the object's size, ETag and the extent size;
//! opening an object whose listing differs empties the data file and marks every extent absent.
//! Every GET asks for the listed ETag (`If-Match`), so an object replaced mid-epoch is an error,
//! not a mix of two versions. The extent size is the cache's own, set when it was made.
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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use nix::fcntl::OFlag;

use super::tree::{component_name, dir_component_name, Tree};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::remote::{ObjectInfo, Store};
use crate::sys::{ofd_lock, ofd_try_lock, SharedMap};
use crate::util::Unpoison;

/// The default extent: the unit fetched, cached and counted (a multiple of 4 KiB).
pub const EXTENT_BYTES_DEFAULT: u64 = 8 << 20;
/// The smallest and largest extents a cache accepts.
pub const EXTENT_BYTES_MIN: u64 = 64 << 10;
/// See [`EXTENT_BYTES_MIN`].
pub const EXTENT_BYTES_MAX: u64 = 256 << 20;

/// The usage file's first bytes: what marks a directory as a gpufeed cache, and its layout.
const USAGE_MAGIC: &[u8; 8] = b"GPFCUSE4";
/// Caches of older layouts, emptied and made layout 4 when opened: 1 (keys mapped lossily, no
/// checksums), 2 (a key's directories named as its objects are, long components refused), 3
/// (objects named by their URL alone: two endpoints' `s3://b/k` shared one entry).
const USAGE_MAGIC_OLD: [&[u8; 8]; 3] = [b"GPFCUSE1", b"GPFCUSE2", b"GPFCUSE3"];
const STATE_MAGIC: &[u8; 8] = b"GPFSTAT2";
/// Bytes of a state file before its extent bytes (and of the usage file).
const HEADER_BYTES: usize = 4096;
/// The longest ETag kept (longer ones are stored as their crc32c, which still changes with them).
const ETAG_MAX: usize = 1024;
/// Where a state file keeps its object's URL (its length, then its bytes), and the longest kept.
const URL_AT: usize = 1056;
const URL_MAX: usize = HEADER_BYTES - URL_AT - 4;
/// The state file's byte locked while a process walks the object (`CachedObject::walk_lock`).
const WALK_LOCK_AT: u64 = 1 << 62;
/// A kept listing's first bytes (then the crc32c and length of the JSON that follows).
const LISTING_MAGIC: &str = "GPFLIST1";
/// The largest kept listing read back (some 10⁷ objects).
const LISTING_MAX: u64 = 2 << 30;
/// The byte of the usage file every process holds a shared lock on while it has the cache open
/// (the first to open it alone recounts what it holds).
const IN_USE_BYTE: u64 = HEADER_BYTES as u64 - 1;
/// What a new cache's usage file is made as before it is renamed into place.
const USAGE_NEW: &str = "usage.new.";

/// The extent size the cache was made with.
const U_EXTENT: usize = 8;

/// The counters in the usage file, at these offsets.
const U_USED: usize = 64;
const U_GETS: usize = 72;
const U_FETCHED: usize = 80;
const U_DIRECT: usize = 88;
const U_WRITTEN: usize = 96;
const U_WAITS: usize = 104;
/// The limit last given to the cache (0: none given yet); an opener that gives none uses it.
const U_LIMIT: usize = 112;
/// Extents found damaged on disk (their crc32c did not match) and fetched again.
const U_DAMAGED: usize = 120;

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
    /// Extents whose bytes on disk no longer matched their crc32c, fetched again from the store.
    pub damaged_extents: u64,
}

/// A node cache directory, opened with a limit.
pub struct NodeCache {
    dir: PathBuf,
    tree: Tree,
    limit: u64,
    extent_bytes: u64,
    usage: SharedMap,
    /// Held open for the shared lock on [`IN_USE_BYTE`].
    _usage_file: File,
    /// Weak: each object holds its cache (an `Arc` each way would keep both, with their state
    /// files' mappings, for the life of the process after the datasets are gone).
    objects: Mutex<HashMap<String, std::sync::Weak<CachedObject>>>,
    full_noticed: AtomicBool,
    /// The state files this process has mapped ([`MAPS_MAX`] at most).
    maps: Mutex<MapPool>,
    /// A write found the disk full: nothing is admitted (readers fetch just the bytes they
    /// read) until this time, then one extent is tried again.
    no_room_until: Mutex<Option<std::time::Instant>>,
    /// Where fetched extents go to be written behind (started on the first).
    writer: Mutex<Option<std::sync::mpsc::Sender<WriteJob>>>,
    /// Bytes and extents to be cached that are being fetched, written or synced (reserved
    /// before the GET, given back when published or dropped): the write backlog.
    pending: (Mutex<(u64, usize)>, std::sync::Condvar),
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
    /// The bytes' crc32c, published with them.
    crc: u32,
    /// Held, not read: dropping it releases the extent's lock.
    _lock: File,
}

/// Writer threads per cache, and extents queued for them at most (each holds its bytes): a disk
/// slower than the store holds the fetches back.
const WRITERS: usize = 8;
/// Bytes of fetched extents waiting to be written and made durable at most (at least two
/// extents): see `NodeCache::reserve_write`.
const WRITE_BACKLOG_BYTES: u64 = 256 << 20;
/// Extents in the write backlog at most: each holds its lock, an open state file, until it is
/// published (a backlog of 10⁵ small objects' extents, within the bytes, ran the process out
/// of file descriptors).
const WRITE_BACKLOG_EXTENTS: usize = 512;
/// Bytes of published extents kept in memory for the readers still to come, at most (oldest
/// let go first; at least two extents): fetched bytes are not read back from the disk.
const RETAINED_BYTES: u64 = 256 << 20;
/// Published extents kept in memory at most, whatever their bytes: each costs its slot and
/// buffer beside them (10⁵ small objects' extents were all kept, within the bytes).
const RETAINED_EXTENTS_MAX: usize = 1024;

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
        let synced = obj
            .open_data(OFlag::O_RDONLY)
            .and_then(|f| f.sync_data().map_err(|e| Error::io("cannot sync", e)));
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

/// The default cache directory: `$GPUFEED_CACHE_DIR`, else `$XDG_CACHE_HOME/gpufeed/objects`,
/// else `~/.cache/gpufeed/objects` (point it at local NVMe on a training node).
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUFEED_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("gpufeed/objects");
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".cache/gpufeed/objects")
}

/// Waits (10 s at most each) until every cache of this process has written and published what
/// it fetched: run at exit, so a short process (`inspect`, `verify`) leaves its fetches for the
/// next instead of counted and lost.
pub fn flush_all() {
    let caches: Vec<Arc<NodeCache>> = opened()
        .lock()
        .unpoisoned()
        .values()
        .filter_map(|w| w.upgrade())
        .collect();
    for c in caches {
        c.flush_within(std::time::Duration::from_secs(10));
    }
}

extern "C" fn flush_at_exit() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(flush_all);
}

/// Registers [`flush_all`] to run when the process exits normally (once).
fn flush_at_exit_registered() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `flush_at_exit` is a plain `extern "C" fn()` that does not unwind (it catches
        // panics) and lives for the whole program.
        unsafe { libc::atexit(flush_at_exit) };
    });
}

/// How [`NodeCache::open_as`] treats a directory that is not a cache yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Make a cache there if it is missing or empty.
    Create,
    /// Only open a cache that exists (`None` otherwise): read-only commands.
    Existing,
    /// As `Existing`, and a cache whose usage header is damaged is emptied and made anew:
    /// `cache drop`.
    Drop,
}

/// Every cache opened in this process, by directory: ranks that are threads of one process
/// share one (processes share the files).
fn opened() -> &'static Mutex<HashMap<PathBuf, std::sync::Weak<NodeCache>>> {
    static OPENED: OnceLock<Mutex<HashMap<PathBuf, std::sync::Weak<NodeCache>>>> = OnceLock::new();
    OPENED.get_or_init(Mutex::default)
}

/// Says once that the cache keeps its own extent size over the one asked for.
fn extent_notice(dir: &Path, own: u64, asked: u64) {
    if asked != EXTENT_BYTES_DEFAULT {
        crate::util::notice(&format!(
            "the node cache at {} was made with {} extents and keeps them; cache_extent={} \
             applies to a new cache (`gpufeed cache drop` empties this one)",
            dir.display(),
            crate::util::bytes_human(own),
            crate::util::bytes_human(asked)
        ));
    }
}

/// The cache's usage file in `tree`, checked to be a cache's: made (with the marker) in an
/// empty directory when `mode` is `Create`; an older layout's cache emptied and remade. `None`:
/// no cache there and `mode` is `Existing`.
fn usage_file(tree: &Tree, extent_bytes: u64, mut mode: OpenMode) -> Result<Option<(File, bool)>> {
    let path = tree.path().join("usage");
    let rw = OFlag::O_RDWR;
    for _ in 0..100 {
        // A read-only command reads a cache it may not write (a read-only mount, another
        // user's group cache): the usage file read-only, its counters as they are.
        let opened = match tree.file(&[], "usage", rw, false) {
            Err(e) if mode == OpenMode::Existing && not_writable(&e) => {
                match tree.file(&[], "usage", OFlag::O_RDONLY, false) {
                    Ok(Some(f)) => Some((f, true)),
                    _ => return Err(e),
                }
            }
            Err(e) if mode == OpenMode::Drop && mend_usage(tree, &e)? => {
                mode = OpenMode::Create; // made anew below
                continue;
            }
            r => r?.map(|f| (f, false)),
        };
        if let Some((f, read_only)) = opened {
            let mut magic = [0u8; 8];
            let len = f.metadata().map_err(io_err("cannot stat", &path))?.len();
            if len >= HEADER_BYTES as u64 {
                f.read_exact_at(&mut magic, 0)
                    .map_err(io_err("cannot read", &path))?;
            }
            if &magic == USAGE_MAGIC {
                return Ok(Some((f, read_only)));
            }
            if read_only {
                return Err(invalid(format!(
                    "{} holds a node cache this process cannot write, of another layout ({:?}): \
                     a read-only command reads only the current one",
                    tree.path().display(),
                    String::from_utf8_lossy(&magic)
                )));
            }
            if let Some(layout) = USAGE_MAGIC_OLD.iter().position(|m| *m == &magic) {
                // Ours, of an older layout: emptied under the lock, then marked layout 3.
                ofd_lock(f.as_fd(), 0, 1, true).map_err(io_err("cannot lock", &path))?;
                let r = (|| -> Result<()> {
                    let mut m = [0u8; 8];
                    f.read_exact_at(&mut m, 0)
                        .map_err(io_err("cannot read", &path))?;
                    if m == magic {
                        remove_contents(tree)?;
                        let mut h = vec![0u8; HEADER_BYTES];
                        h[..8].copy_from_slice(USAGE_MAGIC);
                        h[U_EXTENT..U_EXTENT + 8].copy_from_slice(&extent_bytes.to_le_bytes());
                        f.write_all_at(&h, 0)
                            .map_err(io_err("cannot write", &path))?;
                        f.sync_all().map_err(io_err("cannot sync", &path))?;
                        crate::util::notice(&format!(
                            "the node cache at {} was made by an older gpufeed (layout {}): \
                             emptied, to be filled again",
                            tree.path().display(),
                            layout + 1
                        ));
                    }
                    Ok(())
                })();
                let _ = ofd_lock(f.as_fd(), 0, 1, false);
                r?;
                continue;
            }
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{} is not a gpufeed node cache: its `usage` file lacks the cache's marker \
                     (it starts {:?}); point cache_dir (or --cache-dir) at a new or empty \
                     directory",
                    tree.path().display(),
                    String::from_utf8_lossy(&magic)
                ),
            ));
        }
        let others: Vec<String> = tree
            .root_names()?
            .into_iter()
            .filter(|n| !n.starts_with(USAGE_NEW))
            .collect();
        // Another process made the cache since `usage` was looked for (two ranks opening a
        // new cache at once: the soak's): read it again.
        if others.iter().any(|n| n == "usage") {
            continue;
        }
        if !others.is_empty() {
            let mut shown: Vec<String> = others.iter().take(4).cloned().collect();
            if others.len() > shown.len() {
                shown.push(format!("and {} more", others.len() - shown.len()));
            }
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{} is not a gpufeed node cache: it holds {} and no cache marker (a `usage` \
                     file made by gpufeed); nothing there was changed. Point cache_dir (or \
                     --cache-dir) at a new or empty directory",
                    tree.path().display(),
                    shown.join(", ")
                ),
            ));
        }
        if mode != OpenMode::Create {
            return Ok(None);
        }
        // Made whole under another name, then renamed into place unless another opener's was
        // first (whose is then used).
        static NTH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = format!(
            "{USAGE_NEW}{}.{}",
            std::process::id(),
            NTH.fetch_add(1, Ordering::Relaxed)
        );
        let f = tree
            .file(&[], &tmp, rw, true)?
            .ok_or_else(|| invalid("the usage file was not made"))?;
        let made = (|| -> io::Result<()> {
            nix::fcntl::posix_fallocate(f.as_fd(), 0, HEADER_BYTES as libc::off_t)?;
            let mut h = vec![0u8; HEADER_BYTES];
            h[..8].copy_from_slice(USAGE_MAGIC);
            h[U_EXTENT..U_EXTENT + 8].copy_from_slice(&extent_bytes.to_le_bytes());
            f.write_all_at(&h, 0)?;
            f.sync_all()?;
            match nix::fcntl::renameat2(
                tree.root(),
                tmp.as_str(),
                tree.root(),
                "usage",
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })();
        let _ = nix::unistd::unlinkat(
            tree.root(),
            tmp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        made.map_err(|e| {
            // A disk already full when the cache is made: nothing can be cached, and nothing
            // was left behind (the new usage file is gone) — said with the way out.
            let full = matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
            let what = if full {
                "cannot make the node cache (its disk is full: free space there, or point \
                 cache_dir / --cache-dir at another disk)"
            } else {
                "cannot make the cache's usage file"
            };
            io_err(what, &path)(e)
        })?;
        if let Ok(Some(tag)) = tree.file(&[], "CACHEDIR.TAG", rw, true) {
            let _ = tag.write_all_at(
                format!(
                    "Signature: 8a477f597d28d172789f06886806bc55\n{CACHEDIR_TAG_OURS} \
                     (`gpufeed cache drop` empties it).\n"
                )
                .as_bytes(),
                0,
            );
        }
    }
    Err(invalid(format!(
        "{}: the cache's usage file kept changing while it was opened",
        tree.path().display()
    )))
}

/// How long a node cache whose disk was found full admits nothing before it tries again.
const NO_ROOM_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `e` (or its cause) is a full disk or quota.
fn no_space(e: &Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

/// Whether opening a file for writing failed because it may not be written here (a read-only
/// mount, a mode): read-only commands then read it as it is.
fn not_writable(e: &Error) -> bool {
    use std::error::Error as _;
    e.kind() == ErrorKind::PermissionDenied
        || e.source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .is_some_and(|io| matches!(io.raw_os_error(), Some(libc::EROFS | libc::EACCES)))
}

/// `cache drop` of a cache whose `usage` is not a regular file of its own (a link, a FIFO, a
/// hard link put there, `e`): removed (the entry itself, never what a link points at) when the
/// directory is recognisably a cache — its `CACHEDIR.TAG` is the one gpufeed writes — so that
/// the cache is emptied and made anew. Whether it was removed.
fn mend_usage(tree: &Tree, e: &Error) -> Result<bool> {
    if e.kind() != ErrorKind::PermissionDenied {
        return Ok(false);
    }
    let ours = tree
        .read(&[], "CACHEDIR.TAG", 4096)
        .ok()
        .flatten()
        .is_some_and(|t| String::from_utf8_lossy(&t).contains(CACHEDIR_TAG_OURS));
    if !ours {
        return Ok(false);
    }
    // Only what a cache holds: a file of someone else's there (a `usage.orig` kept aside) and
    // it is not emptied (before: its contents went, then the remade cache was refused for the
    // foreign file, "nothing there was changed").
    let foreign: Vec<String> = tree
        .root_names()?
        .into_iter()
        .filter(|n| !CACHE_ROOT_NAMES.contains(&n.as_str()) && !n.starts_with(USAGE_NEW))
        .collect();
    if !foreign.is_empty() {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "{}: {e}; and it holds {} besides a cache's files: nothing there was changed \
                 (move that away and drop the cache again)",
                tree.path().display(),
                foreign.join(", ")
            ),
        ));
    }
    for name in ["usage", "CACHEDIR.TAG"] {
        nix::unistd::unlinkat(tree.root(), name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| io_err("cannot remove", &tree.path().join(name))(e.into()))?;
    }
    remove_contents(tree)?;
    crate::util::notice(&format!(
        "{} was not the cache's own usage file ({e}): removed (what it pointed at is \
         untouched), and the cache emptied to be made anew",
        tree.path().join("usage").display()
    ));
    Ok(true)
}

/// The line of the `CACHEDIR.TAG` gpufeed writes that tells its caches from other directories.
const CACHEDIR_TAG_OURS: &str = "# This is gpufeed's node cache of remote datasets";

/// Where the listing of the URL whose components are `comps` is kept: its directory below the
/// root (`listing/…`) and its file's name.
fn listing_at(comps: &[String]) -> (Vec<&str>, &str) {
    let (name, dirs) = comps.split_last().expect("scheme and host at least");
    let at = std::iter::once("listing")
        .chain(dirs.iter().map(String::as_str))
        .collect();
    (at, name)
}

/// The names a cache's root holds (besides the `usage` being made, [`USAGE_NEW`]…).
const CACHE_ROOT_NAMES: [&str; 6] = ["usage", "CACHEDIR.TAG", "data", "state", "index", "listing"];

/// Removes what a cache holds below its root (not its marker), without following a link.
fn remove_contents(tree: &Tree) -> Result<()> {
    for top in ["data", "state", "index", "listing"] {
        tree.remove_all(top)?;
    }
    Ok(())
}

/// Bytes of extents present in every state file under `tree` (of this layout and extent size):
/// what the cache holds. Entries that are not a cache's are skipped here (and refused where
/// they are used).
fn recount(tree: &Tree, extent_bytes: u64) -> u64 {
    fn walk(tree: &Tree, comps: &mut Vec<String>, extent_bytes: u64, total: &mut u64) {
        let refs: Vec<&str> = comps.iter().map(String::as_str).collect();
        let Ok(Some(dir)) = tree.dir(&refs, false) else {
            return;
        };
        let Ok(names) = super::tree::names(dir) else {
            return;
        };
        let mut subdirs = Vec::new();
        for n in names {
            match tree.file(&refs, &n, OFlag::O_RDONLY, false) {
                Ok(Some(f)) => *total += held_bytes(&f, extent_bytes).unwrap_or(0),
                _ => subdirs.push(n),
            }
        }
        drop(refs);
        for n in subdirs {
            comps.push(n);
            walk(tree, comps, extent_bytes, total);
            comps.pop();
        }
    }
    let mut total = 0;
    walk(
        tree,
        &mut vec!["state".to_string()],
        extent_bytes,
        &mut total,
    );
    total
}

/// Bytes of extents a state file says are present (0 unless it is of this layout and extent).
fn held_bytes(state: &File, extent_bytes: u64) -> io::Result<u64> {
    let mut h = vec![0u8; 32];
    state.read_exact_at(&mut h, 0)?;
    if h[..8] != STATE_MAGIC[..] || u64_le(&h[24..32]) != extent_bytes {
        return Ok(0);
    }
    let size = u64_le(&h[16..24]);
    // The header's size is not trusted to size anything: the marks are read a chunk at a
    // time, and no further than the file goes.
    let n = size
        .div_ceil(extent_bytes)
        .max(1)
        .min(state.metadata()?.len().saturating_sub(HEADER_BYTES as u64));
    let mut chunk = vec![0u8; (64 << 10).min(n as usize)];
    let mut held = 0u64;
    let mut i = 0u64;
    while i < n {
        let k = (n - i).min(chunk.len() as u64) as usize;
        state.read_exact_at(&mut chunk[..k], HEADER_BYTES as u64 + i)?;
        for (j, &m) in chunk[..k].iter().enumerate() {
            if m == PRESENT {
                let at = (i + j as u64).saturating_mul(extent_bytes);
                held += size.saturating_sub(at).min(extent_bytes);
            }
        }
        i += k as u64;
    }
    Ok(held)
}

fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap_or_default())
}

impl NodeCache {
    /// Opens (creating) the cache in `dir`. `limit`: the most bytes it may hold, kept for the node
    /// (`None`: the limit last given to this cache, else 90% of what the file system has free
    /// now plus what the cache already holds). `extent_bytes`: the unit of fetching and caching
    /// for a new cache, a multiple of 4 KiB (a cache keeps the one it was made with).
    ///
    /// A directory that exists is used only if it is empty or holds a gpufeed cache (its
    /// `usage` file's marker): anything else is refused, naming what it holds.
    pub fn open(dir: &Path, limit: Option<u64>, extent_bytes: u64) -> Result<Arc<NodeCache>> {
        Self::open_as(dir, limit, extent_bytes, OpenMode::Create)?
            .ok_or_else(|| invalid("the node cache was not made"))
    }

    /// [`open`](Self::open), or with [`OpenMode::Existing`] only a cache that exists (`None`
    /// if `dir` is missing or empty; nothing is created).
    pub fn open_as(
        dir: &Path,
        limit: Option<u64>,
        extent_bytes: u64,
        mode: OpenMode,
    ) -> Result<Option<Arc<NodeCache>>> {
        if !(EXTENT_BYTES_MIN..=EXTENT_BYTES_MAX).contains(&extent_bytes)
            || !extent_bytes.is_multiple_of(4096)
        {
            return Err(invalid(format!(
                "cache extent of {extent_bytes} bytes: expected a multiple of 4 KiB from {} to {}",
                EXTENT_BYTES_MIN, EXTENT_BYTES_MAX
            )));
        }
        if !dir.exists() {
            if mode != OpenMode::Create {
                return Ok(None);
            }
            use std::os::unix::fs::DirBuilderExt;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                // Private, whatever the umask (under `umask 000` they were 0777: anyone could
                // have swapped the cache below them).
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(io_err("cannot create the cache directory's parent", parent))?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("cannot create the cache directory", dir)(e)),
            }
        }
        let dir = dir
            .canonicalize()
            .map_err(io_err("cannot resolve the cache directory", dir))?;
        let mut open = opened().lock().unpoisoned();
        if let Some(c) = open.get(&dir).and_then(|w| w.upgrade()) {
            if limit.is_none_or(|l| l == c.limit) {
                if c.extent_bytes != extent_bytes {
                    extent_notice(&dir, c.extent_bytes, extent_bytes);
                }
                return Ok(Some(c));
            }
        }
        let tree = Tree::open(&dir)?;
        let Some((f, read_only)) = usage_file(&tree, extent_bytes, mode)? else {
            return Ok(None);
        };
        let path = dir.join("usage");
        if read_only {
            return NodeCache::read_only(dir, tree, f, extent_bytes).map(Some);
        }
        let usage = SharedMap::new(f.as_fd(), HEADER_BYTES).map_err(io_err("cannot map", &path))?;
        let valid =
            |e: u64| (EXTENT_BYTES_MIN..=EXTENT_BYTES_MAX).contains(&e) && e.is_multiple_of(4096);
        let own = usage.u64_at(U_EXTENT).load(Ordering::Acquire);
        if !valid(own) && mode == OpenMode::Existing {
            // A read-only command changes nothing: it says so, and what mends it.
            return Err(invalid(format!(
                "the node cache's usage file says its extents are {own} bytes, which no \
                 gpufeed makes: the file is damaged (`gpufeed cache drop --cache-dir {}` empties \
                 the cache, as opening a dataset through it does)",
                dir.display()
            ))
            .with_path(path));
        }
        if !valid(own) {
            // The marker is ours but the header is damaged: what the cache holds cannot be
            // read by extent, so it is emptied (under the header's lock, as a layout-1 cache
            // is) and made anew with the extent asked for. (Before, the error sent the user to
            // `cache drop`, which failed on the same header.)
            ofd_lock(f.as_fd(), 0, 1, true).map_err(io_err("cannot lock", &path))?;
            let r = (|| -> Result<()> {
                let own = usage.u64_at(U_EXTENT).load(Ordering::Acquire);
                if !valid(own) {
                    remove_contents(&tree)?;
                    for o in [
                        U_USED, U_GETS, U_FETCHED, U_DIRECT, U_WRITTEN, U_WAITS, U_LIMIT, U_DAMAGED,
                    ] {
                        usage.u64_at(o).store(0, Ordering::Release);
                    }
                    usage
                        .u64_at(U_EXTENT)
                        .store(extent_bytes, Ordering::Release);
                    f.sync_all().map_err(io_err("cannot sync", &path))?;
                    crate::util::notice(&format!(
                        "the node cache at {} had a damaged usage file (extents of {own} bytes, \
                         which no gpufeed makes): emptied, to be filled again",
                        dir.display()
                    ));
                }
                Ok(())
            })();
            let _ = ofd_lock(f.as_fd(), 0, 1, false);
            r?;
        }
        let extent = usage.u64_at(U_EXTENT).load(Ordering::Acquire);
        if extent != extent_bytes {
            extent_notice(&dir, extent, extent_bytes);
        }
        // The first process in recounts what is there (a process that died between a fetch's
        // admission and its publication left bytes counted that are not); then every process
        // holds a shared lock while it has the cache open.
        let alone =
            ofd_try_lock(f.as_fd(), IN_USE_BYTE, 1, false).map_err(io_err("cannot lock", &path))?;
        if alone {
            let held = recount(&tree, extent);
            usage.u64_at(U_USED).store(held, Ordering::Release);
            ofd_try_lock(f.as_fd(), IN_USE_BYTE, 1, true).map_err(io_err("cannot lock", &path))?;
        } else {
            // Another opener is recounting: its exclusive lock ends soon.
            while !ofd_try_lock(f.as_fd(), IN_USE_BYTE, 1, true)
                .map_err(io_err("cannot lock", &path))?
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
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
        let cache = Arc::new(NodeCache::made(dir.clone(), tree, limit, extent, usage, f));
        open.insert(dir, Arc::downgrade(&cache));
        flush_at_exit_registered();
        Ok(Some(cache))
    }

    /// Queues a fetched extent for the writer threads (starting them, and the syncer, on the
    /// first); where no thread can be started, writes and publishes it here.
    /// A cache this process may read but not write (a read-only mount, another user's group
    /// cache), for read-only commands: its counters as its usage file holds them (a copy in
    /// this process's memory), nothing recounted, locked or written.
    fn read_only(dir: PathBuf, tree: Tree, f: File, extent_bytes: u64) -> Result<Arc<NodeCache>> {
        let path = dir.join("usage");
        let mut header = vec![0u8; HEADER_BYTES];
        f.read_exact_at(&mut header, 0)
            .map_err(io_err("cannot read", &path))?;
        let usage = SharedMap::anonymous(HEADER_BYTES).map_err(io_err("cannot map", &path))?;
        for (k, w) in header.chunks_exact(8).enumerate() {
            usage.u64_at(8 * k).store(u64_le(w), Ordering::Relaxed);
        }
        let extent = usage.u64_at(U_EXTENT).load(Ordering::Relaxed);
        if !(EXTENT_BYTES_MIN..=EXTENT_BYTES_MAX).contains(&extent) || !extent.is_multiple_of(4096)
        {
            return Err(invalid(format!(
                "the node cache's usage file says its extents are {extent} bytes, which no \
                 gpufeed makes: the file is damaged (`gpufeed cache drop --cache-dir {}`, by a \
                 user who may write it, empties the cache)",
                dir.display()
            ))
            .with_path(path));
        }
        if extent != extent_bytes {
            extent_notice(&dir, extent, extent_bytes);
        }
        // None given yet: what a writable open would take (it said 0).
        let limit = match usage.u64_at(U_LIMIT).load(Ordering::Relaxed) {
            0 => free_bytes(&dir)? / 10 * 9 + usage.u64_at(U_USED).load(Ordering::Relaxed),
            l => l,
        };
        Ok(Arc::new(NodeCache::made(
            dir, tree, limit, extent, usage, f,
        )))
    }

    /// A cache of `dir` (its `tree`, its `usage` header mapped and its file held) with nothing
    /// fetched, written or mapped yet in this process.
    fn made(
        dir: PathBuf,
        tree: Tree,
        limit: u64,
        extent_bytes: u64,
        usage: SharedMap,
        usage_file: File,
    ) -> NodeCache {
        NodeCache {
            dir,
            tree,
            limit,
            extent_bytes,
            usage,
            _usage_file: usage_file,
            objects: Mutex::default(),
            full_noticed: AtomicBool::new(false),
            no_room_until: Mutex::new(None),
            maps: Mutex::default(),
            writer: Mutex::new(None),
            pending: Default::default(),
            bufs: Mutex::default(),
            retained: Mutex::default(),
        }
    }

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
        // A whole extent's buffer comes from the pool (and goes back to it); a shorter one (an
        // object's last extent, a small object's only one) is sized to its bytes: a mapping's
        // pages are all touched when it is made, and the budget of retained extents counts
        // `n`, so 8 MiB buffers for 10 KiB objects held 8 MiB each (4 GB for 500 small tars).
        let full = n as u64 == self.extent_bytes;
        if !full {
            return Ok(ExtentBuf {
                map: None,
                heap: vec![0u8; n].into_boxed_slice(),
                len: n,
                cache: self.clone(),
            });
        }
        let map = match self.bufs.lock().unpoisoned().pop() {
            Some(m) => m,
            None => crate::sys::Mapping::new(n.max(1), 4096, false)
                .map_err(|e| Error::io("cannot allocate an extent buffer", e))?,
        };
        Ok(ExtentBuf {
            map: Some(map),
            heap: Box::default(),
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
        while (p.0 + n > max || p.1 >= WRITE_BACKLOG_EXTENTS) && p.1 > 0 {
            p = self.pending.1.wait(p).unpoisoned();
        }
        p.0 += n;
        p.1 += 1;
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
            while r.1 > max || r.0.len() > RETAINED_EXTENTS_MAX {
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
        p.0 = p.0.saturating_sub(n);
        p.1 = p.1.saturating_sub(1);
        self.pending.1.notify_all();
    }

    /// Waits until every extent fetched so far is written and published (`gpufeed cache warm`
    /// does before it exits: queued writes die with the process).
    pub fn flush(&self) {
        let mut p = self.pending.0.lock().unpoisoned();
        while p.1 > 0 {
            p = self.pending.1.wait(p).unpoisoned();
        }
    }

    /// [`flush`](Self::flush), waiting `limit` at most (a loader fetching meanwhile keeps the
    /// backlog from emptying): whether it emptied.
    pub fn flush_within(&self, limit: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + limit;
        let mut p = self.pending.0.lock().unpoisoned();
        while p.1 > 0 {
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
            damaged_extents: g(U_DAMAGED),
        }
    }

    /// Counts a GET of `n` bytes made for the cache's users but not cached (an index).
    pub(crate) fn count_uncached_get(&self, n: u64) {
        self.add(U_GETS, 1);
        self.add(U_FETCHED, n);
        self.add(U_DIRECT, n);
    }

    fn add(&self, counter: usize, n: u64) {
        self.usage.u64_at(counter).fetch_add(n, Ordering::AcqRel);
    }

    /// Whether `n` more bytes fit under the limit now, and on the disk (it was not found full,
    /// and its free space holds them beside the writes queued).
    pub(crate) fn has_room(&self, n: u64) -> bool {
        if self
            .no_room_until
            .lock()
            .unpoisoned()
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            return false;
        }
        self.usage
            .u64_at(U_USED)
            .load(Ordering::Acquire)
            .saturating_add(n)
            <= self.limit
            && self.disk_holds(n)
    }

    /// Whether the disk's free space holds `n` bytes more than the writes queued: where it
    /// does not, nothing is admitted for a while (as after a write that found it full), so a
    /// whole extent is not fetched for a write that would fail.
    fn disk_holds(&self, n: u64) -> bool {
        let queued = self.pending.0.lock().unpoisoned().0;
        let ok = free_bytes(&self.dir).is_ok_and(|f| f >= n.saturating_add(queued));
        if !ok {
            *self.no_room_until.lock().unpoisoned() =
                Some(std::time::Instant::now() + NO_ROOM_RETRY);
            if !self.full_noticed.swap(true, Ordering::Relaxed) {
                crate::util::notice(&format!(
                    "the node cache's disk is full ({}, below the cache's limit): only the bytes \
                     read are fetched, and caching is tried again every {} s",
                    self.dir.display(),
                    NO_ROOM_RETRY.as_secs()
                ));
            }
        }
        ok
    }

    /// Reserves `n` bytes under the limit; false when they do not fit, or while the disk is
    /// full ([`NO_ROOM_RETRY`]).
    fn admit(&self, n: u64) -> bool {
        {
            let mut until = self.no_room_until.lock().unpoisoned();
            match *until {
                Some(t) if std::time::Instant::now() < t => return false,
                Some(_) => *until = None, // tried again
                None => {}
            }
        }
        self.disk_holds(n)
            && self
                .usage
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

    /// Where an object of the server `origin` ([`Store::origin`]) lives below the root: the
    /// components of `SCHEME/ORIGIN/HOST/KEY`, each a file name injectively (`tree::component_name`; the key's directories marked apart from
    /// its objects, `tree::dir_component_name`), and what the state file records: the URL
    /// (without any userinfo) and the origin.
    fn object_comps(&self, origin: &str, url: &str) -> Result<(Vec<String>, String)> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid(format!("{url}: not a URL")))?;
        let (host, key) = rest.split_once('/').unwrap_or((rest, ""));
        // Credentials never reach a file name.
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        // The server is part of the object (two endpoints' `s3://b/k` are two objects): its
        // own directory, after the scheme.
        let mut comps = vec![
            component_name(scheme),
            component_name(origin),
            component_name(host),
        ];
        let parts: Vec<&str> = key.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            if *part == "." || *part == ".." || part.contains('\0') {
                return Err(invalid(format!(
                    "{url}: an object key with a `{part}` component cannot be cached"
                )));
            }
            comps.push(if i + 1 == parts.len() {
                component_name(part)
            } else {
                dir_component_name(part)
            });
        }
        let plain = format!("{scheme}://{host}/{key} at {origin}");
        if plain.len() > URL_MAX {
            return Err(invalid(format!(
                "{url}: an object URL over {URL_MAX} bytes cannot be cached"
            )));
        }
        Ok((comps, plain))
    }

    /// The cached object for `info` of `store`: its data file exists with the object's size and
    /// its state matches the listing (otherwise it is emptied first). On a disk too full for
    /// its state, the object is read without being cached (said once).
    pub fn object(self: &Arc<Self>, store: &Store, info: &ObjectInfo) -> Result<Arc<CachedObject>> {
        let (comps, plain_url) = self.object_comps(store.origin(), &info.url)?;
        let known = self
            .objects
            .lock()
            .unpoisoned()
            .get(&plain_url)
            .and_then(|w| w.upgrade());
        if let Some(o) = known.filter(|o| o.info == *info) {
            return Ok(o);
        }
        let (name, dirs) = comps.split_last().expect("scheme and host at least");
        let name = name.clone();
        let dirs: Vec<String> = dirs.to_vec();
        fn at<'a>(top: &'a str, dirs: &'a [String]) -> Vec<&'a str> {
            std::iter::once(top)
                .chain(dirs.iter().map(String::as_str))
                .collect()
        }
        let what = |e: Error| {
            if e.kind() == ErrorKind::PermissionDenied || e.kind() == ErrorKind::InvalidInput {
                invalid(format!("{}: cannot be cached: {e}", info.url))
            } else {
                e
            }
        };
        let rw = OFlag::O_RDWR;
        let data = self
            .tree
            .file(&at("data", &dirs), &name, rw, true)
            .map_err(what)?
            .ok_or_else(|| invalid("the data file was not made"))?;
        let state = self
            .tree
            .file(&at("state", &dirs), &name, rw, true)
            .map_err(what)?
            .ok_or_else(|| invalid("the state file was not made"))?;
        let mut data_path = self.tree.join(&at("data", &dirs));
        data_path.push(&name);
        let mut state_path = self.tree.join(&at("state", &dirs));
        state_path.push(&name);
        let extents = info.size.div_ceil(self.extent_bytes).max(1);
        let map_len = state_len(extents);
        // The header is checked and (re)written under a lock on it, by one opener at a time.
        ofd_lock(state.as_fd(), 0, HEADER_BYTES as u64, true)
            .map_err(io_err("cannot lock", &state_path))?;
        let r = self.check_state(info, &plain_url, &state, &data, map_len, &state_path);
        let _ = ofd_lock(state.as_fd(), 0, HEADER_BYTES as u64, false);
        let uncached = match r {
            Ok(()) => false,
            Err(StateErr::Full) => {
                if !self.full_noticed.swap(true, Ordering::Relaxed) {
                    crate::util::notice(&format!(
                        "the node cache's disk is full ({}): {} and what else cannot be set up \
                         is read from the store without being cached",
                        self.dir.display(),
                        info.url
                    ));
                }
                true
            }
            Err(StateErr::Other(e)) => return Err(e),
        };
        // Mapped when first read, not now: a process holding 10⁵ objects mapped one each ran
        // past the kernel's limit on mappings (65,530) and failed the open.
        let state_home = if uncached {
            StateHome::Private(Arc::new(PrivateState {
                marks: (0..extents).map(|_| AtomicU8::new(0)).collect(),
                crcs: (0..extents).map(|_| AtomicU32::new(0)).collect(),
            }))
        } else {
            StateHome::File { len: map_len }
        };
        let md = data.metadata().map_err(io_err("cannot stat", &data_path))?;
        let smd = state
            .metadata()
            .map_err(io_err("cannot stat", &state_path))?;
        let obj = Arc::new(CachedObject {
            cache: self.clone(),
            store: store.clone(),
            info: info.clone(),
            data_path,
            dirs,
            name,
            data_id: (md.dev(), md.ino()),
            state_id: (smd.dev(), smd.ino()),
            extents,
            state: state_home,
            uncached,
            verified: (0..extents).map(|_| AtomicBool::new(false)).collect(),
            fetching: Mutex::new(HashMap::with_capacity(1)),
        });
        // One object per URL in a process (threads opening it at once keep the first made), so
        // that its threads share one record of what they fetched and checked.
        let obj = {
            let mut objects = self.objects.lock().unpoisoned();
            match objects.get(&plain_url).and_then(|w| w.upgrade()) {
                Some(o) if o.info == *info => o,
                _ => {
                    // The entries of objects gone are dropped as the map doubles.
                    if objects.len() >= 64 && objects.len().is_power_of_two() {
                        objects.retain(|_, w| w.strong_count() > 0);
                    }
                    objects.insert(plain_url, Arc::downgrade(&obj));
                    obj
                }
            }
        };
        Ok(obj)
    }

    /// Keeps the listing of `url` (a dataset's URL, as given to the store), for an open while
    /// the store cannot be answered: `DIR/listing/SCHEME/HOST/PREFIX`, a line with its crc32c
    /// and length, then the objects as JSON. Rewritten only when it changed.
    pub(crate) fn keep_listing(
        &self,
        store: &Store,
        url: &str,
        listed: &[ObjectInfo],
    ) -> Result<()> {
        let (comps, plain) = self.object_comps(store.origin(), url)?;
        let (at, name) = listing_at(&comps);
        let objects: Vec<serde_json::Value> = listed
            .iter()
            .map(|o| serde_json::json!([o.key, o.url, o.size, o.etag]))
            .collect();
        let body = serde_json::json!({"url": plain, "objects": objects}).to_string();
        let line = format!(
            "{LISTING_MAGIC} {:08x} {}\n",
            crate::util::crc32c(body.as_bytes()),
            body.len()
        );
        if let Some(f) = self.tree.file(&at, name, OFlag::O_RDONLY, false)? {
            let mut head = vec![0u8; line.len()];
            if f.read_exact_at(&mut head, 0).is_ok() && head == line.as_bytes() {
                return Ok(());
            }
        }
        self.tree.write_whole(&at, name, (line + &body).as_bytes())
    }

    /// The listing of `url` kept by [`keep_listing`](Self::keep_listing), if there is one and
    /// it is whole (its checksum and URL check out).
    pub(crate) fn kept_listing(&self, store: &Store, url: &str) -> Result<Option<Vec<ObjectInfo>>> {
        let (comps, plain) = self.object_comps(store.origin(), url)?;
        let (at, name) = listing_at(&comps);
        let Some(bytes) = self.tree.read(&at, name, LISTING_MAX)? else {
            return Ok(None);
        };
        let parse = || -> Option<Vec<ObjectInfo>> {
            let nl = bytes.iter().position(|&b| b == b'\n')?;
            let head = std::str::from_utf8(&bytes[..nl]).ok()?;
            let mut f = head.split(' ');
            let body = &bytes[nl + 1..];
            (f.next()? == LISTING_MAGIC
                && u32::from_str_radix(f.next()?, 16).ok()? == crate::util::crc32c(body)
                && f.next()?.parse::<usize>().ok()? == body.len())
            .then_some(())?;
            let v: serde_json::Value = serde_json::from_slice(body).ok()?;
            (v["url"].as_str()? == plain).then_some(())?;
            v["objects"]
                .as_array()?
                .iter()
                .map(|o| {
                    Some(ObjectInfo {
                        key: o[0].as_str()?.to_string(),
                        url: o[1].as_str()?.to_string(),
                        size: o[2].as_u64()?,
                        etag: o[3].as_str().map(str::to_string),
                    })
                })
                .collect()
        };
        Ok(parse())
    }

    /// Bytes of `info` the cache holds, read without changing anything (0 if it has no files
    /// or they describe another version): `gpufeed cache status`.
    pub fn present_bytes_of(&self, store: &Store, info: &ObjectInfo) -> Result<u64> {
        let (comps, plain_url) = self.object_comps(store.origin(), &info.url)?;
        let (name, dirs) = comps.split_last().expect("scheme and host at least");
        let at: Vec<&str> = std::iter::once("state")
            .chain(dirs.iter().map(String::as_str))
            .collect();
        let Some(state) = self.tree.file(&at, name, OFlag::O_RDONLY, false)? else {
            return Ok(0);
        };
        let mut old = vec![0u8; HEADER_BYTES];
        if state.read_exact_at(&mut old, 0).is_err()
            || old != state_header(info, &plain_url, self.extent_bytes)
        {
            return Ok(0);
        }
        // The data file as a loader would open it: a link, FIFO or hard link there is refused
        // here too, naming it (before, status said "100%" of a cache every read then refused).
        let data_at: Vec<&str> = std::iter::once("data")
            .chain(dirs.iter().map(String::as_str))
            .collect();
        if self
            .tree
            .file(&data_at, name, OFlag::O_RDONLY, false)?
            .is_none()
        {
            return Ok(0);
        }
        Ok(held_bytes(&state, self.extent_bytes).unwrap_or(0))
    }

    /// Makes the state file describe `info`: as it is when its header matches, else emptied. A
    /// state file of another object (a URL other than `url`) is refused; a disk too full to
    /// allocate the state is a `StorageFull` error.
    fn check_state(
        &self,
        info: &ObjectInfo,
        url: &str,
        state: &File,
        data: &File,
        map_len: usize,
        state_path: &Path,
    ) -> std::result::Result<(), StateErr> {
        let header = state_header(info, url, self.extent_bytes);
        let mut old = vec![0u8; HEADER_BYTES];
        let ioe = |e: io::Error| StateErr::of(e, state_path);
        let len = state.metadata().map_err(ioe)?.len();
        if len >= HEADER_BYTES as u64 {
            state.read_exact_at(&mut old, 0).map_err(ioe)?;
        }
        if old[..8] == STATE_MAGIC[..] {
            let n = (u32::from_le_bytes(old[URL_AT..URL_AT + 4].try_into().unwrap_or_default())
                as usize)
                .min(URL_MAX);
            let theirs = &old[URL_AT + 4..URL_AT + 4 + n];
            if theirs != url.as_bytes() {
                return Err(StateErr::Other(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "{}: its node-cache file {} holds another object ({}); refused rather \
                         than serve one object's bytes for another",
                        info.url,
                        state_path.display(),
                        String::from_utf8_lossy(theirs)
                    ),
                )));
            }
        }
        if old == header
            && len >= map_len as u64
            && data.metadata().map_err(ioe)?.len() == info.size
        {
            // Blocks allocated (a no-op when they are), so the mapping never faults.
            return fallocate(state, map_len).map_err(ioe);
        }
        // A different version (or none yet): give back what its present extents held, drop
        // their blocks, and mark every extent absent. The state file never shrinks (another
        // process may have it mapped); only its extent bytes are zeroed.
        if len > HEADER_BYTES as u64 && old[..8] == STATE_MAGIC[..] {
            let held = held_bytes(state, u64_le(&old[24..32])).unwrap_or(0);
            self.release(held);
            // Zeroed a chunk at a time (the file's length is not trusted to size a buffer).
            let zeros = vec![0u8; 64 << 10];
            let mut at = HEADER_BYTES as u64;
            while at < len {
                let k = (len - at).min(zeros.len() as u64) as usize;
                state.write_all_at(&zeros[..k], at).map_err(ioe)?;
                at += k as u64;
            }
        }
        let setup = || -> io::Result<()> {
            data.set_len(0)?;
            data.set_len(info.size)?;
            if len < map_len as u64 {
                state.set_len(map_len as u64)?;
            }
            fallocate(state, map_len)?;
            state.write_all_at(&header, 0)?;
            // A new state file has no marks a lost write could leave under a new header: no
            // sync (one per object was most of a cold open's setup, ~0.8 ms an object here).
            // A state file of another version is made durable, its marks zeroed with it.
            if len >= HEADER_BYTES as u64 {
                state.sync_all()?;
            }
            Ok(())
        };
        setup().map_err(ioe)
    }

    /// Empties the cache: every object's files and the counters (`gpufeed cache drop`, and
    /// `gpufeed bench remote` before a cold epoch). Refused while another process has the cache
    /// open (its in-use lock): emptying it under a loader made that loader fail on vanished
    /// files and took every other dataset's cached bytes. Threads of this process that use it
    /// are the caller's to stop.
    pub fn drop_all(&self) -> Result<u64> {
        let path = self.dir.join("usage");
        let fd = self._usage_file.as_fd();
        // This open's shared lock, made exclusive if no other open holds one (then made shared
        // again, below): nobody can start using the cache meanwhile either.
        if !ofd_try_lock(fd, IN_USE_BYTE, 1, false).map_err(io_err("cannot lock", &path))? {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "the node cache at {} is in use by another process (a loader, `gpufeed \
                     verify`, a benchmark…): it is emptied only when no other process has it \
                     open (for a benchmark, --keep-cache, or another --cache-dir)",
                    self.dir.display()
                ),
            ));
        }
        let r = self.drop_all_locked();
        ofd_try_lock(fd, IN_USE_BYTE, 1, true).map_err(io_err("cannot lock", &path))?;
        r
    }

    fn drop_all_locked(&self) -> Result<u64> {
        let held = self.counters().cached_bytes;
        // Only the cache's own entries, without following a link (one is removed itself).
        remove_contents(&self.tree)?;
        for o in [
            U_USED, U_GETS, U_FETCHED, U_DIRECT, U_WRITTEN, U_WAITS, U_LIMIT, U_DAMAGED,
        ] {
            self.usage.u64_at(o).store(0, Ordering::Release);
        }
        self.objects.lock().unpoisoned().clear();
        *self.maps.lock().unpoisoned() = MapPool::default();
        *self.retained.lock().unpoisoned() = Default::default();
        Ok(held)
    }
}

/// Why a state file could not be set up: the disk is full (the object is then read uncached),
/// or anything else (an error).
enum StateErr {
    Full,
    Other(Error),
}

impl StateErr {
    fn of(e: io::Error, path: &Path) -> StateErr {
        if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
            StateErr::Full
        } else {
            StateErr::Other(
                Error::io("cannot set up a cache state file", e).with_path(path.to_path_buf()),
            )
        }
    }
}

/// Allocates the first `len` bytes of `f` (a no-op where they are): writes through a mapping of
/// them then never fault on a full disk.
fn fallocate(f: &File, len: usize) -> io::Result<()> {
    nix::fcntl::posix_fallocate(f.as_fd(), 0, len as libc::off_t).map_err(io::Error::from)
}

/// Bytes of the state file of an object of `extents` extents: the header, one byte per extent
/// (padded to 4), one crc32c per extent.
fn state_len(extents: u64) -> usize {
    crcs_at(extents) + 4 * extents as usize
}

/// Where the crc32cs of an object of `extents` extents start in its state file.
fn crcs_at(extents: u64) -> usize {
    HEADER_BYTES + (extents as usize).next_multiple_of(4)
}

/// An extent's state byte: absent (0) or present.
const PRESENT: u8 = 1;

fn state_header(info: &ObjectInfo, url: &str, extent_bytes: u64) -> Vec<u8> {
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
    let url = &url.as_bytes()[..url.len().min(URL_MAX)];
    h[URL_AT..URL_AT + 4].copy_from_slice(&(url.len() as u32).to_le_bytes());
    h[URL_AT + 4..URL_AT + 4 + url.len()].copy_from_slice(url);
    h
}

/// One remote object in the node cache.
pub struct CachedObject {
    cache: Arc<NodeCache>,
    store: Store,
    info: ObjectInfo,
    data_path: PathBuf,
    /// The directories below `data/` and `state/` holding its files, and their name.
    dirs: Vec<String>,
    name: String,
    /// The (device, inode) of its data and state files: a file opened later must be these.
    data_id: (u64, u64),
    state_id: (u64, u64),
    extents: u64,
    /// Where its state is: the state file (header, one byte per extent, one crc32c per
    /// extent), mapped when needed through the cache's pool of mappings; or this process's
    /// memory where the disk was too full for the file (then nothing of it is cached).
    state: StateHome,
    uncached: bool,
    /// Extents this process has read from disk and found matching their crc32c.
    verified: Vec<AtomicBool>,
    /// Extents this process is fetching, until they are published: its other readers of them
    /// take the fetched bytes instead of waiting for the write behind.
    fetching: Mutex<HashMap<u64, Arc<Fetching>>>,
}

/// Where an object's state lives ([`CachedObject::state`]).
enum StateHome {
    /// Its state file, of `len` bytes, mapped when needed.
    File { len: usize },
    /// This process's memory: the disk was too full for a state file.
    Private(Arc<PrivateState>),
}

/// An uncached object's marks and checksums, in this process's memory.
struct PrivateState {
    marks: Box<[AtomicU8]>,
    crcs: Box<[AtomicU32]>,
}

/// An object's marks and checksums, held while they are read or written: the mapping stays
/// whatever the pool lets go meanwhile.
#[derive(Clone)]
enum StateView {
    Mapped(Arc<SharedMap>),
    Private(Arc<PrivateState>),
}

impl StateView {
    fn marks(&self, extents: u64) -> &[AtomicU8] {
        match self {
            StateView::Mapped(m) => m.u8s(HEADER_BYTES, extents as usize),
            StateView::Private(p) => &p.marks,
        }
    }

    fn crcs(&self, extents: u64) -> &[AtomicU32] {
        match self {
            StateView::Mapped(m) => m.u32s(crcs_at(extents), extents as usize),
            StateView::Private(p) => &p.crcs,
        }
    }
}

/// State files a process keeps mapped at most: a dataset of fewer objects keeps each mapped
/// from its first read on; one of more maps them as its reads reach them (an `open` and an
/// `mmap` each), far below the kernel's limit on a process's mappings (`vm.max_map_count`,
/// 65,530 by default), and their pages resident with them.
const MAPS_MAX: usize = 1024;

/// The state files this process has mapped, by (device, inode), the oldest let go first.
#[derive(Default)]
struct MapPool {
    live: HashMap<(u64, u64), Arc<SharedMap>>,
    order: VecDeque<(u64, u64)>,
}

impl MapPool {
    fn get(&self, id: (u64, u64)) -> Option<Arc<SharedMap>> {
        self.live.get(&id).cloned()
    }

    fn insert(&mut self, id: (u64, u64), m: Arc<SharedMap>) {
        if self.live.insert(id, m).is_none() {
            self.order.push_back(id);
        }
        while self.live.len() > MAPS_MAX {
            match self.order.pop_front() {
                Some(old) => {
                    self.live.remove(&old);
                }
                None => break,
            }
        }
    }
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
    /// A buffer shorter than an extent (a small object's only one, an object's last), on the
    /// heap: written through the page cache, it needs no page alignment, and a mapping each
    /// ran a process of 10⁵ small objects past the kernel's limit on mappings.
    heap: Box<[u8]>,
    len: usize,
    cache: Arc<NodeCache>,
}

impl ExtentBuf {
    fn bytes(&self) -> &[u8] {
        match &self.map {
            // SAFETY: the mapping holds at least `len` bytes (taken for this extent's size),
            // written by the fetch before the buffer was shared; nobody writes them since.
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr(), self.len) },
            None => &self.heap[..self.len.min(self.heap.len())],
        }
    }

    /// Its bytes to fill, before it is shared: `n` of them.
    fn fill(&mut self, n: usize) -> &mut [u8] {
        match &self.map {
            Some(m) => {
                assert!(n <= m.len());
                // SAFETY: the mapping holds at least `n` bytes (checked) and this buffer is
                // not shared yet (`&mut self`): nothing else reads or writes them.
                unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), n) }
            }
            None => &mut self.heap[..n],
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

    /// The (device, inode) of the data file when this object was opened: a file at
    /// [`data_path`](Self::data_path) that is not it is another copy.
    pub(crate) fn data_id(&self) -> (u64, u64) {
        self.data_id
    }

    /// Its extents' marks and checksums: the state file's mapping from the cache's pool
    /// (mapped now if the pool does not hold it), or this process's copy.
    fn state(&self) -> Result<StateView> {
        match &self.state {
            StateHome::Private(p) => Ok(StateView::Private(p.clone())),
            StateHome::File { len } => {
                if let Some(m) = self.cache.maps.lock().unpoisoned().get(self.state_id) {
                    return Ok(StateView::Mapped(m));
                }
                let f = self.open_state()?;
                let m = Arc::new(SharedMap::new(f.as_fd(), *len).map_err(|e| {
                    Error::io("cannot map the node cache's state file", e)
                        .with_path(self.data_path.clone())
                })?);
                self.cache
                    .maps
                    .lock()
                    .unpoisoned()
                    .insert(self.state_id, m.clone());
                Ok(StateView::Mapped(m))
            }
        }
    }

    /// Opens its data file again, through the cache's tree (no link followed), checked to be
    /// the file it was opened as.
    fn open_data(&self, flags: OFlag) -> Result<File> {
        self.open_own("data", flags, self.data_id)
    }

    /// Opens its state file again (an open of its own, for the extent locks), checked likewise.
    fn open_state(&self) -> Result<File> {
        self.open_own("state", OFlag::O_RDWR, self.state_id)
    }

    /// The directory holding this object's file under `top` (`data`, `state`, `index`).
    fn dir_under<'a>(&'a self, top: &'a str) -> Vec<&'a str> {
        std::iter::once(top)
            .chain(self.dirs.iter().map(String::as_str))
            .collect()
    }

    fn open_own(&self, top: &str, flags: OFlag, id: (u64, u64)) -> Result<File> {
        let comps = self.dir_under(top);
        let path = || {
            let mut p = self.cache.tree.join(&comps);
            p.push(&self.name);
            p
        };
        let f = self
            .cache
            .tree
            .file(&comps, &self.name, flags, false)?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "{}: its node-cache file is gone (was the cache dropped while in use?)",
                        self.info.url
                    ),
                )
                .with_path(path())
            })?;
        let md = f.metadata().map_err(io_err("cannot stat", &path()))?;
        if (md.dev(), md.ino()) != id {
            return Err(invalid(format!(
                "{}: its node-cache file was replaced by another while in use: refused",
                self.info.url
            ))
            .with_path(path()));
        }
        Ok(f)
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
        let Ok(st) = self.state() else {
            return false;
        };
        let marks = st.marks(self.extents);
        self.extents_of(range)
            .all(|i| marks[i as usize].load(Ordering::Acquire) == PRESENT)
    }

    /// Bytes of this object on disk.
    pub fn present_bytes(&self) -> u64 {
        let Ok(st) = self.state() else {
            return 0;
        };
        let marks = st.marks(self.extents);
        (0..self.extents)
            .filter(|&i| marks[i as usize].load(Ordering::Acquire) == PRESENT)
            .map(|i| {
                let r = self.extent_range(i);
                r.end - r.start
            })
            .sum()
    }

    /// Extent `i`, which holds the bytes `part`: on disk (checked against its crc32c the first
    /// time this process reads it, and fetched again if it is damaged); or fetched now and
    /// cached, when it fits; or, when the cache is full, only `part` fetched (nothing else of
    /// the extent would be kept). One fetch per node for what is cached: a fetch holds the
    /// extent's lock, and whoever waited on it finds the extent present.
    fn extent(self: &Arc<Self>, i: u64, part: Range<u64>, dst: &mut [u8]) -> Result<Extent> {
        let st = self.state()?;
        let mark = &st.marks(self.extents)[i as usize];
        let ready = |i: u64| self.verified[i as usize].load(Ordering::Acquire);
        // A loop, not a recursion: an extent published by another process meanwhile is
        // claimed again to be checked, as often as that happens.
        let slot = loop {
            if let Some(b) = self.held(i) {
                return Ok(Extent::Held(b));
            }
            if mark.load(Ordering::Acquire) == PRESENT && ready(i) {
                return Ok(Extent::Present);
            }
            // Another thread of this process fetching or checking it: its bytes, once they
            // are here.
            let theirs = match self.claim(i) {
                Ok(mine) => break mine,
                Err(theirs) => theirs,
            };
            let mut st = theirs.state.lock().unpoisoned();
            while matches!(*st, FetchState::Running) {
                st = theirs.done.wait(st).unpoisoned();
            }
            if let FetchState::Bytes(b) = &*st {
                self.cache.add(U_WAITS, 1);
                return Ok(Extent::Held(b.clone()));
            }
            drop(st);
            if mark.load(Ordering::Acquire) != PRESENT {
                return self.fetch_part(part, dst);
            }
            // Published by another process meanwhile: checked before it is read (the other
            // thread's slot was released before it said so: `settle`).
        };
        let r = if mark.load(Ordering::Acquire) == PRESENT {
            self.check_claimed(i, &slot)
        } else {
            self.fetch_claimed(i, &slot)
        };
        match r {
            Ok(Extent::Part) => self.fetch_part(part, dst),
            // `Present`: published by another process while this one waited for the lock — the
            // bytes it just wrote from the store, read from disk (checked on a later read).
            r => r,
        }
    }

    /// Reads the claimed, present extent `i` from disk and checks it against its crc32c: its
    /// bytes when they match (kept in memory for the readers to come, and the extent counted as
    /// checked); when they do not, or cannot be read, the extent is counted damaged, said,
    /// marked absent and fetched again (`Part`: the cache was full, fetch the part).
    fn check_claimed(self: &Arc<Self>, i: u64, slot: &Fetching) -> Result<Extent> {
        let range = self.extent_range(i);
        let n = range.end - range.start;
        let read = (|| -> Result<Arc<ExtentBuf>> {
            let mut buf = self.cache.extent_buf(n as usize)?;
            // O_DIRECT into a page-aligned (mapped) buffer of whole blocks only.
            let direct = n.is_multiple_of(4096) && buf.map.is_some();
            let dst = buf.fill(n as usize);
            let f = if direct {
                self.open_data(OFlag::O_RDONLY | OFlag::O_DIRECT)
                    .or_else(|_| self.open_data(OFlag::O_RDONLY))?
            } else {
                self.open_data(OFlag::O_RDONLY)?
            };
            f.read_exact_at(dst, range.start).map_err(|e| {
                Error::io("cannot read the cache", e)
                    .with_path(self.data_path.clone())
                    .with_range(range.start, n)
            })?;
            buf.len = n as usize;
            Ok(Arc::new(buf))
        })();
        let want = self.state()?.crcs(self.extents)[i as usize].load(Ordering::Acquire);
        let why = match read {
            Ok(bytes) => {
                let got = crate::crc32c::crc32c(bytes.bytes());
                if got == want {
                    self.verified[i as usize].store(true, Ordering::Release);
                    self.settle(i, slot, FetchState::Bytes(bytes.clone()));
                    self.cache.retain(self, i, n);
                    return Ok(Extent::Held(bytes));
                }
                format!("its crc32c is {got:08x}, published as {want:08x}")
            }
            Err(e) if e.kind() == ErrorKind::NotFound || e.kind() == ErrorKind::InvalidInput => {
                // The file is gone or replaced: nothing to repair here.
                self.settle(i, slot, FetchState::Elsewhere);
                return Err(e);
            }
            Err(e) => e.report(),
        };
        self.cache.add(U_DAMAGED, 1);
        crate::util::notice(&format!(
            "{}: the cached copy was damaged (extent {i}, bytes {}..{} of the object in {}: \
             {why}); fetched again from the store",
            self.info.url,
            range.start,
            range.end,
            self.data_path.display()
        ));
        if let Err(e) = self.unpublish(i) {
            self.settle(i, slot, FetchState::Elsewhere);
            return Err(e);
        }
        self.fetch_claimed(i, slot)
    }

    /// Tells the waiters on `slot`, extent `i`'s claim, what came of it. Unless it holds bytes
    /// to share (the slot then stays claimed until publication), the claim is released first,
    /// so a waiter that wakes finds the extent unclaimed rather than this finished slot.
    fn settle(&self, i: u64, slot: &Fetching, state: FetchState) {
        if !matches!(state, FetchState::Bytes(_)) {
            let mut f = self.fetching.lock().unpoisoned();
            if f.get(&i)
                .is_some_and(|s| std::ptr::eq(Arc::as_ptr(s), slot))
            {
                f.remove(&i);
            }
        }
        *slot.state.lock().unpoisoned() = state;
        slot.done.notify_all();
    }

    /// Marks present extent `i` absent (it was found damaged), under its lock, giving its bytes
    /// back to the limit.
    fn unpublish(&self, i: u64) -> Result<()> {
        let at = HEADER_BYTES as u64 + i;
        let state = self.open_state()?;
        ofd_lock(state.as_fd(), at, 1, true)
            .map_err(|e| Error::io("cannot lock", e).with_path(self.data_path.clone()))?;
        let st = self.state()?;
        let mark = &st.marks(self.extents)[i as usize];
        if mark.swap(0, Ordering::AcqRel) == PRESENT {
            let r = self.extent_range(i);
            self.cache.release(r.end - r.start);
        }
        self.verified[i as usize].store(false, Ordering::Release);
        Ok(()) // dropping `state` releases the lock
    }

    /// Extent `i`'s bytes, if this process fetched or checked it and holds them still (being
    /// written, or published and retained).
    fn held(&self, i: u64) -> Option<Arc<ExtentBuf>> {
        let slot = self.fetching.lock().unpoisoned().get(&i)?.clone();
        let st = slot.state.lock().unpoisoned();
        match &*st {
            FetchState::Bytes(b) => Some(b.clone()),
            _ => None,
        }
    }

    /// Whether reads of `range` go to the data file: every extent is on disk, checked by this
    /// process, and none is held in memory (those are copied from there instead of read back).
    pub(crate) fn read_from_disk(&self, range: Range<u64>) -> bool {
        if !self.is_present(range.clone())
            || !self
                .extents_of(range.clone())
                .all(|i| self.verified[i as usize].load(Ordering::Acquire))
        {
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
        let r = if !self.uncached && self.cache.admit(n) {
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
        self.settle(i, slot, shared);
        r
    }

    /// Fetches extent `i` ahead of its readers — or, if it is on disk but not yet checked by
    /// this process, checks it — unless another thread of this process has it: its readers
    /// then take its bytes. True if it was fetched or checked.
    pub(crate) fn prefetch(self: &Arc<Self>, i: u64) -> Result<bool> {
        if i >= self.extents || self.extent_ready(i) || self.uncached {
            return Ok(false);
        }
        let Ok(slot) = self.claim(i) else {
            return Ok(false);
        };
        let r = if self.extent_present(i) {
            self.check_claimed(i, &slot)?
        } else {
            self.fetch_claimed(i, &slot)?
        };
        Ok(matches!(r, Extent::Fetched(_) | Extent::Held(_)))
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
    /// fetched). The bytes go to the caller at once; the write to disk, its `fdatasync` and the
    /// publication happen behind, on the cache's writer threads, which hold the extent's lock
    /// until it is published (so a reader that waits on the lock finds the extent on disk).
    fn fetch_reserved(self: &Arc<Self>, i: u64) -> Result<Extent> {
        let range = self.extent_range(i);
        let n = range.end - range.start;
        let at = HEADER_BYTES as u64 + i;
        let give_back = || {
            self.cache.release(n);
            self.cache.written(n);
        };
        let st = self.state().inspect_err(|_| give_back())?;
        let mark = &st.marks(self.extents)[i as usize];
        // A lock of this open's own, so that threads exclude each other as processes do.
        let state = match self.open_state().and_then(|f| {
            ofd_lock(f.as_fd(), at, 1, true)
                .map_err(|e| Error::io("cannot lock", e).with_path(self.data_path.clone()))?;
            Ok(f)
        }) {
            Ok(f) => f,
            Err(e) => {
                give_back();
                return Err(e);
            }
        };
        if mark.load(Ordering::Acquire) == PRESENT {
            // Fetched (and published) by another while this one waited for the lock.
            self.cache.add(U_WAITS, 1);
            give_back();
            return Ok(Extent::Present); // dropping `state` releases the lock
        }
        let mut buf = match self.cache.extent_buf(n as usize) {
            Ok(b) => b,
            Err(e) => {
                give_back();
                return Err(e);
            }
        };
        let dst = buf.fill(n as usize);
        if let Err(e) = self.store.get_into(&self.info, range.start, dst) {
            give_back();
            return Err(e);
        }
        let crc = crate::crc32c::crc32c(dst);
        buf.len = n as usize;
        let bytes = Arc::new(buf);
        self.cache.add(U_GETS, 1);
        self.cache.add(U_FETCHED, n);
        self.cache.write_behind(WriteJob {
            obj: self.clone(),
            extent: i,
            offset: range.start,
            bytes: bytes.clone(),
            crc,
            _lock: state,
        });
        Ok(Extent::Fetched(bytes))
    }

    /// Writes a fetched extent to the data file (on a writer thread): O_DIRECT for whole 4 KiB
    /// blocks from page-aligned memory; the object's last, partial extent (or a file system
    /// that refuses O_DIRECT) through the page cache. Not yet durable: the syncer makes it so
    /// (`publish`).
    fn write_extent(&self, job: &WriteJob) -> Result<()> {
        let bytes = job.bytes.bytes();
        if (bytes.len() as u64).is_multiple_of(4096) && job.bytes.map.is_some() {
            if let Ok(f) = self.open_data(OFlag::O_WRONLY | OFlag::O_DIRECT) {
                if f.write_all_at(bytes, job.offset).is_ok() {
                    return Ok(());
                }
            }
        }
        self.open_data(OFlag::O_WRONLY)?
            .write_all_at(bytes, job.offset)
            .map_err(|e| Error::io("cannot write", e).with_path(self.data_path.clone()))
    }

    /// A failed write or sync: the reservation goes back, the bytes count as served uncached,
    /// and the first failure of the cache is said.
    fn write_failed(&self, job: &WriteJob, e: &Error) {
        let cache = &self.cache;
        let n = job.bytes.bytes().len() as u64;
        cache.release(n);
        cache.add(U_DIRECT, n);
        // A full disk (below the limit, which says there is room): nothing more is admitted
        // for a while, so readers fetch the bytes they read and not each its whole extent
        // again (30x the dataset's bytes in the trial, for a sample per GET of 8 MiB).
        let full = no_space(e);
        if full {
            *cache.no_room_until.lock().unpoisoned() =
                Some(std::time::Instant::now() + NO_ROOM_RETRY);
        }
        if !cache.full_noticed.swap(true, Ordering::Relaxed) {
            let then = if full {
                format!(
                    "the disk is full: from now on only the bytes read are fetched, and caching \
                     is tried again every {} s",
                    NO_ROOM_RETRY.as_secs()
                )
            } else {
                "fetched extents are served without being cached".to_string()
            };
            crate::util::notice(&format!(
                "the node cache cannot write {} ({}); {then}",
                self.data_path.display(),
                e.report()
            ));
        }
    }

    /// Marks written, durable extents present, with their crc32c; the extent's readers go by
    /// the state byte from here on (its in-memory bytes are let go).
    fn mark_published(&self, job: &WriteJob) {
        let n = job.bytes.bytes().len() as u64;
        if !(n.is_multiple_of(4096) && job.bytes.map.is_some()) {
            // Written through the page cache (now on disk): drop it from there.
            if let Ok(f) = self.open_data(OFlag::O_RDONLY) {
                let _ = crate::sys::fadvise(
                    f.as_fd(),
                    job.offset,
                    n,
                    crate::sys::Advice::POSIX_FADV_DONTNEED,
                );
            }
        }
        let st = match self.state() {
            Ok(st) => st,
            // Its state cannot be reached (mapped): the extent stays absent, its bytes served.
            Err(e) => return self.write_failed(job, &e),
        };
        st.crcs(self.extents)[job.extent as usize].store(job.crc, Ordering::Release);
        // This process wrote what it fetched: its own reads need no check.
        self.verified[job.extent as usize].store(true, Ordering::Release);
        st.marks(self.extents)[job.extent as usize].store(PRESENT, Ordering::Release);
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
                        file = Some(self.open_data(OFlag::O_RDONLY)?);
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

    /// Reads bytes from `offset` into `buf` without caching what is absent: from disk where
    /// every extent is present, else with one ranged GET of exactly these bytes (counted as
    /// served uncached). For walks that read a few bytes here and there (tar headers): fetching
    /// and caching whole extents for them would download the dataset to open it.
    pub fn peek_at(self: &Arc<Self>, buf: &mut [u8], offset: u64) -> Result<usize> {
        let end = (offset + buf.len() as u64).min(self.info.size);
        if offset >= end {
            return Ok(0);
        }
        if self.is_present(offset..end) {
            return self.read_at(buf, offset);
        }
        let n = (end - offset) as usize;
        self.fetch_part(offset..end, &mut buf[..n])?;
        Ok(n)
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
        if self.uncached || !self.cache.admit(ext.end - ext.start) {
            return Err(Error::new(
                crate::ErrorKind::Busy,
                format!(
                    "the node cache is full ({} of {}{})",
                    crate::util::bytes_human(self.cache.counters().cached_bytes),
                    crate::util::bytes_human(self.cache.limit),
                    if self.uncached { ", and its disk" } else { "" }
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
        self.state().is_ok_and(|st| {
            st.marks(self.extents)
                .get(i as usize)
                .is_some_and(|m| m.load(Ordering::Acquire) == PRESENT)
        })
    }

    /// Whether extent `i` is on disk and checked by this process (its reads go to the disk).
    pub(crate) fn extent_ready(&self, i: u64) -> bool {
        self.extent_present(i)
            && self
                .verified
                .get(i as usize)
                .is_some_and(|v| v.load(Ordering::Acquire))
    }

    /// The bytes of the index kept for this object in the cache (`DIR/index/…`, written by
    /// [`keep_index`](Self::keep_index)), if there is one (of at most `max` bytes). Whether it
    /// describes this version is the reader's to check.
    pub(crate) fn kept_index(&self, max: u64) -> Result<Option<Vec<u8>>> {
        self.cache
            .tree
            .read(&self.dir_under("index"), &self.name, max)
    }

    /// Keeps `bytes` as this object's index in the cache (replacing any), for every later
    /// opener on the node. Not counted against the limit (an index is a small fraction of its
    /// object).
    pub(crate) fn keep_index(&self, bytes: &[u8]) -> Result<()> {
        self.cache
            .tree
            .write_whole(&self.dir_under("index"), &self.name, bytes)
    }

    /// Waits for, then holds, the node-wide lock on walking this object (a tar's headers): one
    /// process walks a cold tar and keeps its index, and the others, waiting here, read what it
    /// kept instead of walking it too (three ranks opening one cold dataset made three times
    /// the GETs). Released when the returned file is dropped, and by the kernel if the process
    /// dies. A byte of the state file far past its extents, which nothing else locks.
    pub(crate) fn walk_lock(&self) -> Result<File> {
        let f = self.open_state()?;
        ofd_lock(f.as_fd(), WALK_LOCK_AT, 1, true).map_err(|e| {
            Error::io("cannot lock", e).with_path(self.cache.tree.join(&self.dir_under("state")))
        })?;
        Ok(f)
    }

    /// The object's store.
    pub(crate) fn store(&self) -> &Store {
        &self.store
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

/// Bytes of these objects' extents not on disk.
pub fn absent_bytes<'a>(objects: impl IntoIterator<Item = &'a Arc<CachedObject>>) -> u64 {
    objects
        .into_iter()
        .map(|o| {
            o.cache.flush(); // extents fetched and still being written count as present
            o.info.size - o.present_bytes()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More objects than the pool maps at once (10,000 against [`MAPS_MAX`]): each object's
    /// state is mapped when read and let go as others come, never more than the pool at once
    /// (10⁵ objects mapped one each ran past the kernel's 65,530 mappings and failed the
    /// open, issue 52 item 10), and what was written through one mapping reads the same
    /// through the next.
    #[test]
    fn object_states_are_mapped_as_needed_within_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let cache = NodeCache::open(&dir.path().join("c"), Some(1 << 30), 64 << 10).unwrap();
        // No request is made: the store is named, never asked.
        let store = Store::open_with(
            "s3://b/p/",
            &crate::remote::StoreOptions::default().s3_bucket(
                "b",
                &[
                    ("aws_endpoint", "http://127.0.0.1:1"),
                    ("aws_region", "us-east-1"),
                ],
            ),
        )
        .unwrap();
        let n = 10_000u64;
        let objs: Vec<Arc<CachedObject>> = (0..n)
            .map(|i| {
                let info = ObjectInfo {
                    key: format!("p/{i:05}"),
                    url: format!("s3://b/p/{i:05}"),
                    size: 100 + i,
                    etag: Some(format!("\"{i}\"")),
                };
                cache.object(&store, &info).unwrap()
            })
            .collect();
        assert_eq!(
            cache.maps.lock().unpoisoned().live.len(),
            0,
            "mapped at the open"
        );
        for (i, o) in objs.iter().enumerate() {
            assert!(!o.extent_present(0));
            if i % 3 == 0 {
                o.state().unwrap().marks(o.extents)[0].store(PRESENT, Ordering::Release);
            }
            assert!(cache.maps.lock().unpoisoned().live.len() <= MAPS_MAX);
        }
        let maps = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count();
        assert!(maps < MAPS_MAX + 2048, "{maps} mappings in the process");
        for (i, o) in objs.iter().enumerate() {
            assert_eq!(o.extent_present(0), i % 3 == 0, "object {i}");
        }
    }
}
