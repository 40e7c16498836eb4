//! A dataset whose files are objects in a store (`s3://…`, feature `remote`): listed with
//! [`Store`], each object given a node-cache file ([`NodeCache::object`]) that the dataset's
//! index points at, then indexed as any local file (through `SourceFile`, which fetches what
//! it reads); and what the cache holds of such a dataset, and filling it ahead of training
//! (`gpufeed cache status` and `gpufeed cache warm`).
//!
//! [`NodeCache::object`]: crate::cache::NodeCache::object

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::tar::{TarWalk, INDEX_BYTES_MAX};
use super::{Dataset, Format, OpenOptions, Sources};
use crate::cache::node::{CacheCounters, CachedObject};
use crate::error::{invalid, Error, Result};
use crate::plan::PlanConfig;
use crate::remote::{ObjectInfo, Store};

/// Opens the dataset whose files are the objects under `urls` (each a prefix, or one object),
/// read through the node cache that `opts` names: only the listing, the objects' headers and
/// indexes are fetched now (a packed shard's index with ranged GETs; a tar or a TFRecord
/// without an index is walked extent by extent, and what fits stays in the cache).
pub(crate) fn open(urls: &[&str], opts: &OpenOptions) -> Result<Dataset> {
    let (format, paths, src) = objects_of(urls, opts)?;
    let ds = Dataset::open_files_from(format, &paths, opts, &src).map_err(|e| src.named(e));
    src.opened();
    let mut ds = ds?;
    ds.problems = std::mem::take(&mut ds.problems)
        .into_iter()
        .map(|e| src.named(e))
        .collect();
    ds.notes = std::mem::take(&mut ds.notes)
        .into_iter()
        .map(|n| src.named_note(n))
        .collect();
    ds.set_source(urls.iter().map(|u| u.to_string()).collect())?;
    ds.share_index();
    Ok(ds)
}

/// The dataset under `urls` as files, before any is indexed: its format, its data files (each
/// object's node-cache copy) and the sources that read them (fetching what is not cached).
/// Only the listing is read. `verify` takes packed shards from here one by one, so that a
/// damaged one is one error, as it is locally.
pub(crate) fn objects_of(
    urls: &[&str],
    opts: &OpenOptions,
) -> Result<(Format, Vec<std::path::PathBuf>, Sources)> {
    use crate::cache::node::{default_dir, NodeCache};
    let dir = opts.cache_dir.clone().unwrap_or_else(default_dir);
    let cache = NodeCache::open(&dir, opts.cache_limit, opts.cache_extent)?;
    let mut format = opts.format;
    let mut paths = Vec::new();
    // Each object's cache entry, and the index kept beside it in the store (NAME.gpfidx).
    let mut objects = Vec::new();
    for url in urls {
        let store = Store::open_with(url, &opts.store)?;
        let listed = listing(&store, &cache, format)?;
        if let Some(o) = listed
            .iter()
            .find(|o| o.key.contains(&format!("{}/", super::pack::STAGING)))
        {
            return Err(invalid(format!(
                "{url}: an unfinished `gpufeed pack` left {} in the store: the shards here may \
                 be only part of the dataset",
                o.url
            )));
        }
        if listed.is_empty() {
            return Err(Error::new(
                crate::ErrorKind::NotFound,
                format!("{url}: nothing is stored under this prefix (the listing is empty)"),
            ));
        }
        let keys: Vec<&str> = listed.iter().map(|o| o.key.as_str()).collect();
        let (f, picked) = super::detect::pick_remote(&keys, format)
            .map_err(|e| invalid(format!("{url}: {e}")))?;
        if picked.is_empty() {
            return Err(invalid(format!(
                "{url}: no {} objects here ({} listed)",
                f.name(),
                listed.len()
            )));
        }
        format = Some(f);
        let by_key: std::collections::HashMap<&str, &ObjectInfo> =
            listed.iter().map(|o| (o.key.as_str(), o)).collect();
        let mut task = crate::progress::Task::items_after(
            format!("setting up {} objects in the node cache", picked.len()),
            picked.len() as u64,
            "objects",
            std::time::Duration::from_secs(2),
        );
        for (n, i) in picked.into_iter().enumerate() {
            task.set(n as u64);
            let obj = cache.object(&store, &listed[i])?;
            let kept = by_key
                .get(format!("{}{}", listed[i].key, super::tar::INDEX_SUFFIX).as_str())
                .map(|o| (*o).clone());
            paths.push(obj.data_path().to_path_buf());
            objects.push((obj, kept));
        }
        task.finish();
        // TFRecord indexes beside their files (DALI's NAME.idx, the tfrecord package's
        // NAME.index and NAME.tfindex), read through the cache too.
        if f == Format::TfRecord {
            for o in listed.iter().filter(|o| {
                [".idx", ".index", ".tfindex"]
                    .iter()
                    .any(|x| o.key.ends_with(x))
            }) {
                objects.push((cache.object(&store, o)?, None));
            }
        }
    }
    let format = format.ok_or_else(|| invalid("no dataset URL given"))?;
    Ok((format, paths, Sources::remote(objects)))
}

/// The objects under `store`'s URL: its listing, kept in the node cache for the next open;
/// or, when the store cannot be answered (not when it refuses), the listing kept at an earlier
/// open, if the cache holds every object of it whole (said once) — a node whose cache holds
/// the dataset trains on while the store is down. Otherwise the store's error, saying what the
/// cache holds.
fn listing(
    store: &Store,
    cache: &crate::cache::NodeCache,
    format: Option<Format>,
) -> Result<Vec<ObjectInfo>> {
    let url = store.url();
    let kept_as = kept_as(store);
    let e = match store.list() {
        Ok(listed) => {
            if let Err(e) = cache.keep_listing(store, &kept_as, &listed) {
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    crate::util::notice(&format!(
                        "the node cache cannot keep the listing of {url} ({e}): an open while \
                         the store is down cannot use the cache"
                    ));
                }
            }
            return Ok(listed);
        }
        // Only a store that did not answer (a refusal — a key, a bucket — is the answer).
        Err(e) if e.kind() == crate::ErrorKind::Io => e,
        Err(e) => return Err(e),
    };
    let (kept, e) = kept_when_down(store, cache, e)?;
    // The objects the dataset reads (a tar's `NAME.gpfidx` beside it is read once, into the
    // cache's kept walk, and not cached itself; other files under the prefix are not the
    // dataset's): those must be whole.
    let keys: Vec<&str> = kept.iter().map(|o| o.key.as_str()).collect();
    let used: Vec<&ObjectInfo> = match super::detect::pick_remote(&keys, format) {
        Ok((f, picked)) => {
            let mut v: Vec<&ObjectInfo> = picked.iter().map(|&i| &kept[i]).collect();
            if f == Format::TfRecord {
                v.extend(kept.iter().filter(|o| {
                    [".idx", ".index", ".tfindex"]
                        .iter()
                        .any(|x| o.key.ends_with(x))
                }));
            }
            v
        }
        Err(_) => kept.iter().collect(),
    };
    let mut whole = 0usize;
    for o in &used {
        if cache.present_bytes_of(store, o).is_ok_and(|n| n == o.size) {
            whole += 1;
        }
    }
    if whole < used.len() || used.is_empty() {
        return Err(Error::new(
            crate::ErrorKind::Io,
            format!(
                "{e}; the store has answered this node before (the node cache kept its \
                 listing), but the cache holds {whole} of its {} objects whole, and only a \
                 cache holding every object whole stands in for the store (`gpufeed cache \
                 status` says what it holds)",
                used.len()
            ),
        ));
    }
    crate::util::notice(&format!(
        "{url}: the store cannot be reached ({e}); opened from the node cache, which holds \
         every one of the {} objects the dataset reads, of the listing kept at an earlier open \
         (objects added to the store since are not in this dataset)",
        used.len()
    ));
    Ok(kept)
}

/// For a store that did not answer (`e`): the listing the node cache kept of it at an earlier
/// open, and `e` in words without its "is the endpoint right?" (the store has answered this
/// node before). `e` itself where the cache kept none.
fn kept_when_down(
    store: &Store,
    cache: &crate::cache::NodeCache,
    e: Error,
) -> Result<(Vec<ObjectInfo>, String)> {
    match cache.kept_listing(store, &kept_as(store)).ok().flatten() {
        Some(kept) => Ok((
            kept,
            e.to_string().replace(crate::remote::UNANSWERED_HINT, ""),
        )),
        None => Err(e),
    }
}

/// What a store's listing is kept in the node cache as: its URL, with the `/` it ended in
/// (`s3://b/p`, an object `p` or what is under `p/`, and `s3://b/p/` are two listings).
fn kept_as(store: &Store) -> String {
    format!(
        "{}{}",
        store.url(),
        if store.is_prefix() { "/" } else { "" }
    )
}

/// A remote tar's walk: the index kept in the node cache if it describes this version; else
/// the one kept beside it in the store (`NAME.gpfidx`, one GET; kept in the cache then); else
/// walked here, header by header with ranged GETs, and kept in the cache for every later open
/// on the node.
pub(super) fn walk_remote(
    p: &std::path::Path,
    obj: &CachedObject,
    beside: Option<&ObjectInfo>,
    src: &Sources,
) -> Result<TarWalk> {
    let info = obj.info();
    let etag = info.etag.clone().unwrap_or_default();
    if let Ok(Some(bytes)) = obj.kept_index(INDEX_BYTES_MAX) {
        match TarWalk::from_text(&bytes, info.size, &etag) {
            Ok(w) => return Ok(w),
            // Damage in the node cache is said; another version of the tar is routine.
            Err(why) if why.contains("checksum") => crate::util::notice(&format!(
                "the node cache's index of {} was damaged ({why}); it is read again",
                info.url
            )),
            Err(_) => {}
        }
    }
    if let Some(idx) = beside.filter(|i| i.size <= INDEX_BYTES_MAX) {
        match obj.store().get(idx, 0..idx.size) {
            Ok(bytes) => {
                obj.cache().count_uncached_get(idx.size);
                match TarWalk::from_text(&bytes, info.size, &etag) {
                    Ok(w) => {
                        let _ = obj.keep_index(&bytes);
                        return Ok(w);
                    }
                    Err(why) => crate::util::notice(&format!(
                        "{}: not used ({why}); {} is walked instead (`gpufeed index` writes a \
                         new one)",
                        idx.url, info.url
                    )),
                }
            }
            Err(e) => crate::util::notice(&format!(
                "{}: cannot be read ({e}); the tar is walked instead",
                idx.url
            )),
        }
    }
    // One walk per node: whoever holds the lock walks; whoever waited on it finds the index
    // kept (a lock that cannot be taken only costs a walk of our own).
    let _walking = obj.walk_lock().ok();
    if let Ok(Some(bytes)) = obj.kept_index(INDEX_BYTES_MAX) {
        if let Ok(w) = TarWalk::from_text(&bytes, info.size, &etag) {
            return Ok(w);
        }
    }
    let w = super::tar::walk_tar(p, src)?;
    if let Err(e) = obj.keep_index(w.to_text(&etag).as_bytes()) {
        // Said once in a process (a full disk would say it for every tar).
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            crate::util::notice(&format!(
                "the node cache cannot keep the index of {} ({e}); the next open walks it \
                 again (said once: other tars may be in the same case)",
                info.url
            ));
        }
    }
    Ok(w)
}

/// What `gpufeed index` did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct IndexReport {
    /// Tars indexed.
    pub tars: u64,
    /// Indexes written beside them in the store (`NAME.gpfidx`).
    pub uploaded: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Writes the index of every tar of the WebDataset under `urls` beside it in the store, as
/// `NAME.gpfidx`, so that every later open — on any node — reads one small object per tar
/// instead of walking it. The walks are the node cache's (made now where missing).
pub fn upload_indexes(urls: &[&str], opts: &OpenOptions) -> Result<IndexReport> {
    let opts = OpenOptions {
        format: Some(Format::WebDataset),
        ..opts.clone()
    };
    let ds = open(urls, &opts)?;
    let mut r = IndexReport::default();
    for obj in objects(&ds)? {
        let bytes = obj
            .kept_index(INDEX_BYTES_MAX)?
            .ok_or_else(|| invalid(format!("{}: no index was kept", obj.info().url)))?;
        let key = format!("{}{}", obj.info().key, super::tar::INDEX_SUFFIX);
        r.bytes += bytes.len() as u64;
        obj.store().put_key(&key, bytes)?;
        r.tars += 1;
        r.uploaded += 1;
    }
    Ok(r)
}

/// What a warm-up did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WarmReport {
    /// Extents the epoch reads.
    pub extents: u64,
    /// Bytes fetched and cached by this warm-up.
    pub fetched_bytes: u64,
    /// Bytes of the epoch's extents that were already on disk, or that another reader put
    /// there while this one warmed.
    pub present_bytes: u64,
    /// Bytes of the epoch's extents (what a full cache holds of it).
    pub needed_bytes: u64,
    /// The cache reached its limit before every extent was in.
    pub full: bool,
    /// The node's counters afterwards.
    pub counters: CacheCounters,
}

/// What the node cache holds of a remote dataset.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CacheStatus {
    /// Objects of the dataset.
    pub objects: u64,
    /// Their bytes.
    pub dataset_bytes: u64,
    /// Bytes of them on disk.
    pub present_bytes: u64,
    /// The share of the next epoch's reads the cache will serve: with every byte read once per
    /// epoch and nothing evicted, what is present over what the epoch reads.
    pub predicted_hit_ratio: f64,
    /// The node's counters (every process's).
    pub counters: CacheCounters,
}

fn objects(ds: &Dataset) -> Result<Vec<Arc<CachedObject>>> {
    if ds.remote_urls().is_empty() {
        return Err(invalid(
            "not a remote dataset: the node cache holds datasets opened from s3://, gs://, \
             az:// or http(s):// URLs",
        ));
    }
    ds.files()
        .map(|f| {
            ds.sources.object(&f.path).cloned().ok_or_else(|| {
                invalid("a remote dataset's file is not in the node cache")
                    .with_path(f.path.clone())
            })
        })
        .collect()
}

/// What the node cache holds of the dataset under `urls`, found from the store's listing and
/// the cache's files without changing anything: no object is fetched, no file is made or
/// emptied (an object whose cached copy is of another version counts as absent), and a cache
/// that does not exist holds nothing. `gpufeed cache status`.
pub fn cache_status_of(urls: &[&str], opts: &OpenOptions) -> Result<CacheStatus> {
    use crate::cache::node::{default_dir, NodeCache, OpenMode};
    let dir = opts.cache_dir.clone().unwrap_or_else(default_dir);
    let cache = NodeCache::open_as(&dir, None, opts.cache_extent, OpenMode::Existing)?;
    let mut st = CacheStatus::default();
    for url in urls {
        let store = Store::open_with(url, &opts.store)?;
        let listed = match store.list() {
            Ok(listed) => listed,
            // A store that does not answer: what the cache holds of the listing it kept (an
            // open falls back to it when the cache holds every object whole).
            Err(e) if e.kind() == crate::ErrorKind::Io => {
                let Some(c) = &cache else { return Err(e) };
                let (kept, e) = kept_when_down(&store, c, e)?;
                crate::util::notice(&format!(
                    "{}: the store cannot be reached ({e}); this is what the node cache holds \
                     of the listing it kept at the last open",
                    store.url()
                ));
                kept
            }
            Err(e) => return Err(e),
        };
        let keys: Vec<&str> = listed.iter().map(|o| o.key.as_str()).collect();
        let (_, picked) = super::detect::pick_remote(&keys, opts.format)?;
        for i in picked {
            let o = &listed[i];
            st.objects += 1;
            st.dataset_bytes += o.size;
            if let Some(c) = &cache {
                st.present_bytes += c.present_bytes_of(&store, o)?;
            }
        }
    }
    st.predicted_hit_ratio = st.present_bytes as f64 / st.dataset_bytes.max(1) as f64;
    if let Some(c) = &cache {
        st.counters = c.counters();
    }
    Ok(st)
}

/// What the node cache holds of `ds` (a remote dataset).
pub fn cache_status(ds: &Dataset) -> Result<CacheStatus> {
    let objs = objects(ds)?;
    if let Some(o) = objs.first() {
        // What this process fetched (opening the dataset fetches its indexes) is counted once
        // it is written; a loader fetching meanwhile is not waited for long.
        o.cache().flush_within(std::time::Duration::from_secs(10));
    }
    let dataset_bytes: u64 = objs.iter().map(|o| o.info().size).sum();
    let present_bytes: u64 = objs.iter().map(|o| o.present_bytes()).sum();
    let counters = objs
        .first()
        .map(|o| o.cache().counters())
        .unwrap_or_default();
    Ok(CacheStatus {
        objects: objs.len() as u64,
        dataset_bytes,
        present_bytes,
        predicted_hit_ratio: present_bytes as f64 / dataset_bytes.max(1) as f64,
        counters,
    })
}

/// Fetches the extents epoch `epoch` of `plan` will read into the node cache, in the order it
/// will read them (so that a cache too small for the dataset holds what comes first), on
/// `threads` threads. Resumable: extents already on disk are skipped. `progress(done, total)`
/// is called with bytes as extents arrive.
pub fn warm_cache(
    ds: &Dataset,
    plan: &PlanConfig,
    epoch: u64,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<WarmReport> {
    let objs = objects(ds)?;
    let order = crate::plan::epoch_order(ds.samples(), plan, epoch)?;
    // The extents in order of first use.
    let mut seen: Vec<Vec<bool>> = objs
        .iter()
        .map(|o| vec![false; o.extent_count() as usize])
        .collect();
    let mut todo: Vec<(u32, u64)> = Vec::new();
    for &id in &order {
        let s = ds.sample(id as usize);
        let o = &objs[s.file as usize];
        let e = o.extent_bytes();
        if s.len == 0 {
            continue;
        }
        let end = (s.offset + s.len as u64).min(o.info().size);
        for i in s.offset / e..end.div_ceil(e) {
            if !std::mem::replace(&mut seen[s.file as usize][i as usize], true) {
                todo.push((s.file, i));
            }
        }
    }
    let extent_len = |f: u32, i: u64| {
        let o = &objs[f as usize];
        let start = i * o.extent_bytes();
        o.info().size.saturating_sub(start).min(o.extent_bytes())
    };
    let needed: u64 = todo.iter().map(|&(f, i)| extent_len(f, i)).sum();
    // What the open fetched (a format's index, headers) is written before it is counted.
    if let Some(o) = objs.first() {
        o.cache().flush();
    }
    let (on_disk, todo): (Vec<_>, Vec<_>) = todo
        .into_iter()
        .partition(|&(f, i)| objs[f as usize].extent_present(i));
    let extents = (on_disk.len() + todo.len()) as u64;
    let present: u64 = on_disk.iter().map(|&(f, i)| extent_len(f, i)).sum();
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(present);
    let fetched = AtomicU64::new(0);
    // Extents another process or thread put on disk while this one was warming.
    let found = AtomicU64::new(0);
    let full = AtomicBool::new(false);
    let failed: std::sync::Mutex<Option<crate::error::Error>> = Default::default();
    progress(present, needed);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                if full.load(Ordering::Relaxed) {
                    return;
                }
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(f, i)) = todo.get(k) else { return };
                let o = &objs[f as usize];
                match o.warm_extent(i) {
                    Ok(Some(n)) => {
                        fetched.fetch_add(n, Ordering::Relaxed);
                        progress(done.fetch_add(n, Ordering::Relaxed) + n, needed);
                    }
                    Ok(None) => {
                        let n = extent_len(f, i);
                        found.fetch_add(n, Ordering::Relaxed);
                        progress(done.fetch_add(n, Ordering::Relaxed) + n, needed);
                    }
                    Err(e) if e.kind() == crate::ErrorKind::Busy => {
                        full.store(true, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                        full.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // What was fetched is on disk before this returns (a process that exits loses queued writes).
    if let Some(o) = objs.first() {
        o.cache().flush();
    }
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(WarmReport {
        extents,
        fetched_bytes: fetched.into_inner(),
        present_bytes: present + found.into_inner(),
        needed_bytes: needed,
        full: full.into_inner(),
        counters: objs
            .first()
            .map(|o| o.cache().counters())
            .unwrap_or_default(),
    })
}
