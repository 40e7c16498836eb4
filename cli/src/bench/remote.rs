//! `gpufeed bench remote`: a remote dataset read epoch after epoch through the node cache, by
//! one or more ranks of this node, against two ceilings measured in the same run — the raw
//! range-GET rate at the same concurrency, and gpufeed's own loader over a local copy.
//!
//! Each epoch row: samples/s, time to the first batch, bytes fetched ÷ dataset bytes (beside
//! what LRU would have fetched, replayed over the same epochs' extent orders), GETs and retries
//! for the node, and CPU seconds per GiB delivered.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::util::invalid;
use gpufeed::cache::NodeCache;
use gpufeed::config::LoaderSettings;
use gpufeed::dataset::{Dataset, OpenOptions};
use gpufeed::error::Result;
use gpufeed::loader::Loader;
use gpufeed::remote::Store;

/// What to run.
#[derive(Debug, Clone)]
pub struct RemoteSpec {
    /// The dataset's URLs.
    pub urls: Vec<String>,
    /// Dataset options (the cache's directory, limit and extent among them).
    pub opts: OpenOptions,
    /// Loader settings (order, batch size…); rank and world size are set per rank.
    pub settings: LoaderSettings,
    /// Epochs to read.
    pub epochs: u64,
    /// Ranks on this node, each a thread with a loader of its own over the one node cache.
    pub ranks: u32,
    /// GETs in flight for the raw range-GET ceiling.
    pub get_threads: usize,
    /// A local copy of the dataset (the local-disk ceiling), if any.
    pub local: Option<Vec<std::path::PathBuf>>,
    /// Empty the cache first (a cold first epoch).
    pub fresh: bool,
}

/// One epoch, all ranks together.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EpochRow {
    /// The epoch.
    pub epoch: u64,
    /// Samples delivered (all ranks).
    pub samples: u64,
    /// Wall time of the epoch.
    pub seconds: f64,
    /// Samples per second (all ranks).
    pub samples_per_s: f64,
    /// Sample bytes per second.
    pub gib_per_s: f64,
    /// The slowest rank's wait for its first batch.
    pub first_batch_s: f64,
    /// Bytes fetched from the store this epoch ÷ dataset bytes.
    pub fetched_ratio: f64,
    /// What LRU at the same capacity would have fetched ÷ dataset bytes: its misses (whole
    /// extents) replayed over the same epochs' extent orders.
    pub lru_fetched_ratio: f64,
    /// The share of the epoch's bytes the node cache served.
    pub hit_ratio: f64,
    /// GETs the node made this epoch (all ranks).
    pub gets: u64,
    /// Requests retried this epoch (this process).
    pub retries: u64,
    /// Process CPU seconds per GiB of samples delivered.
    pub cpu_s_per_gib: f64,
    /// The consumers' waits on the store and on local reads, summed over ranks.
    pub remote_wait_s: f64,
    /// See `remote_wait_s`.
    pub storage_wait_s: f64,
}

/// What opening the dataset cost.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OpenRow {
    /// Wall time.
    pub seconds: f64,
    /// GETs of the node cache's counters made by it (headers, indexes, extents).
    pub gets: u64,
    /// Bytes they fetched.
    pub fetched_bytes: u64,
}

/// A ceiling: bytes per second and samples per second where it has samples.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Ceiling {
    /// Bytes per second.
    pub gib_per_s: f64,
    /// Samples per second (for the raw GETs: samples at that byte rate).
    pub samples_per_s: f64,
    /// Wall time.
    pub seconds: f64,
}

/// The whole run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RemoteReport {
    /// The dataset's URLs.
    pub urls: Vec<String>,
    /// Its samples.
    pub samples: u64,
    /// Its objects' bytes.
    pub dataset_bytes: u64,
    /// The node cache's limit.
    pub cache_limit: u64,
    /// The cache's extent.
    pub extent_bytes: u64,
    /// Ranks (threads, each with a dataset and loader of its own).
    pub ranks: u32,
    /// The epoch order.
    pub order: String,
    /// The first rank's open (the others open after it, from what it fetched and kept): wall
    /// time, and the GETs and bytes it fetched (listing aside).
    pub open: OpenRow,
    /// Time from the start of the open to the first batch of epoch 0 (the slowest rank's).
    pub first_batch_from_open_s: f64,
    /// One row per epoch.
    pub epochs: Vec<EpochRow>,
    /// Range GETs of one extent each, `get_threads` at a time, over the whole dataset.
    pub raw_get: Ceiling,
    /// GETs in flight for `raw_get` (the gate's fetch threads are as many by default).
    pub get_threads: usize,
    /// gpufeed's loader over the local copy (second of two epochs).
    pub local: Option<Ceiling>,
}

/// The raw range-GET rate: every extent of every object once, `threads` GETs in flight.
fn raw_gets(ds: &Dataset, urls: &[String], extent: u64, threads: usize) -> Result<Ceiling> {
    let mut jobs = Vec::new();
    let mut stores = Vec::new();
    for url in urls {
        let store = Store::open_with(url, &ds.options().store)?;
        for o in store.list()? {
            let mut off = 0;
            while off < o.size {
                jobs.push((stores.len(), o.clone(), off..(off + extent).min(o.size)));
                off += extent;
            }
        }
        stores.push(store);
    }
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let failed = std::sync::Mutex::new(None);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                // One buffer per thread, reused, as the cache's pooled extent buffers are.
                let mut buf = vec![0u8; extent as usize];
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((si, o, r)) = jobs.get(k) else {
                        return;
                    };
                    let dst = &mut buf[..(r.end - r.start) as usize];
                    match stores[*si].get_into(o, r.start, dst) {
                        Ok(()) => {
                            bytes.fetch_add(dst.len() as u64, Ordering::Relaxed);
                        }
                        Err(e) => {
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let secs = t0.elapsed().as_secs_f64();
    let b = bytes.into_inner() as f64;
    Ok(Ceiling {
        gib_per_s: b / secs / (1u64 << 30) as f64,
        // Samples at that byte rate, for comparing with the loaders' samples/s.
        samples_per_s: ds.len() as f64 * (b / ds.total_bytes().max(1) as f64) / secs,
        seconds: secs,
    })
}

/// One rank's epoch: samples, sample bytes, its first batch's wait, its consumer's remote and
/// storage waits.
type RankEpoch = (u64, u64, f64, f64, f64);

/// One loader per rank (rank r of `datasets.len()`), built before any epoch is timed.
fn loaders(datasets: &[Arc<Dataset>], settings: &LoaderSettings) -> Result<Vec<Loader>> {
    let world = datasets.len() as u32;
    datasets
        .iter()
        .enumerate()
        .map(|(rank, ds)| {
            let mut set = settings.clone();
            set.rank = rank as u32;
            set.world_size = world;
            Loader::builder(ds.clone()).settings(&set).build()
        })
        .collect()
}

/// One epoch of the ranks' loaders, each on a thread of its own: samples, bytes, the slowest
/// first batch, the consumers' remote and storage waits.
fn epoch(datasets: &[Arc<Dataset>], loaders: &[Loader], epoch: u64) -> Result<RankEpoch> {
    let results: Vec<Result<RankEpoch>> = std::thread::scope(|s| {
        let hs: Vec<_> = datasets
            .iter()
            .zip(loaders)
            .map(|(ds, loader)| {
                s.spawn(move || -> Result<RankEpoch> {
                    let t0 = Instant::now();
                    let mut first = None;
                    let (mut n, mut bytes) = (0u64, 0u64);
                    let mut ep = loader.epoch(epoch)?;
                    for b in ep.by_ref() {
                        let b = b?;
                        first.get_or_insert(t0.elapsed().as_secs_f64());
                        n += b.len() as u64;
                        bytes += b
                            .sample_ids()
                            .iter()
                            .map(|&i| ds.sample(i as usize).len as u64)
                            .sum::<u64>();
                    }
                    let st = ep.stats();
                    Ok((
                        n,
                        bytes,
                        first.unwrap_or(0.0),
                        st.stall.remote_s,
                        st.stall.storage_s,
                    ))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(invalid("a rank's thread panicked")))
            })
            .collect()
    });
    let mut out = (0, 0, 0.0f64, 0.0, 0.0);
    for r in results {
        let (n, b, f, rw, sw) = r?;
        out.0 += n;
        out.1 += b;
        out.2 = out.2.max(f);
        out.3 += rw;
        out.4 += sw;
    }
    Ok(out)
}

/// The extents each epoch reads, in the order the ranks' plans read them (ranks one after
/// another), as ids for the cache replay.
fn extent_orders(
    ds: &Dataset,
    settings: &LoaderSettings,
    ranks: u32,
    epochs: u64,
    extent: u64,
) -> Result<Vec<Vec<u32>>> {
    let mut first_id = Vec::with_capacity(ds.file_count());
    let mut id = 0u32;
    for f in ds.files() {
        first_id.push(id);
        id += f.size.div_ceil(extent).max(1) as u32;
    }
    let mut out = Vec::new();
    for e in 0..epochs {
        let mut seq: Vec<u32> = Vec::new();
        for r in 0..ranks {
            let plan = gpufeed::plan::PlanConfig {
                rank: r,
                world_size: ranks,
                ..settings.plan(&gpufeed::plan::PlanConfig::default())
            };
            for &i in &gpufeed::plan::epoch_order(ds.samples(), &plan, e)? {
                let s = ds.sample(i as usize);
                let end = (s.offset + s.len as u64).max(s.offset + 1);
                for x in s.offset / extent..end.div_ceil(extent) {
                    let id = first_id[s.file as usize] + x as u32;
                    if seq.last() != Some(&id) {
                        seq.push(id);
                    }
                }
            }
        }
        out.push(seq);
    }
    Ok(out)
}

/// Runs the benchmark.
pub fn run(spec: &RemoteSpec) -> Result<RemoteReport> {
    let dir = spec
        .opts
        .cache_dir
        .clone()
        .unwrap_or_else(gpufeed::cache::default_dir);
    let extent = spec.opts.cache_extent;
    let node = NodeCache::open(&dir, spec.opts.cache_limit, extent)?;
    if spec.fresh {
        // Said: a cold first epoch costs whatever else the cache held.
        let freed = node.drop_all()?;
        if freed > 0 {
            gpufeed::testing::notice(&format!(
                "emptied the node cache at {} ({}) for a cold first epoch (--keep-cache keeps it)",
                dir.display(),
                gpufeed::config::bytes_human(freed)
            ));
        }
    }
    let urls: Vec<std::path::PathBuf> = spec.urls.iter().map(Into::into).collect();
    // One dataset per rank, as separate processes would each open it; the first's open is
    // measured (what it fetches: headers, indexes).
    let before = node.counters();
    let t_open = Instant::now();
    let first = Arc::new(Dataset::open_paths(&urls, &spec.opts)?);
    node.flush();
    let after = node.counters();
    let open = OpenRow {
        seconds: t_open.elapsed().as_secs_f64(),
        gets: after.gets - before.gets,
        fetched_bytes: after.fetched_bytes - before.fetched_bytes,
    };
    let mut datasets = vec![first];
    for _ in 1..spec.ranks.max(1) {
        datasets.push(Arc::new(Dataset::open_paths(&urls, &spec.opts)?));
    }
    let ds = &datasets[0];
    let cache = ds
        .files()
        .next()
        .and(ds.node_cache())
        .ok_or_else(|| invalid("not a remote dataset"))?;
    let dataset_bytes: u64 = ds.files().map(|f| f.size).sum();
    // The ceiling first, twice: the first pass warms the server's own caches, as the loader's
    // epochs after it will find them.
    raw_gets(ds, &spec.urls, extent, spec.get_threads)?;
    let raw_get = raw_gets(ds, &spec.urls, extent, spec.get_threads)?;
    // LRU at the same capacity, over the same epochs' extent orders.
    let capacity = (cache.limit() / extent).min(u32::MAX as u64) as usize;
    let orders = extent_orders(ds, &spec.settings, spec.ranks.max(1), spec.epochs, extent)?;
    let lru = gpufeed::testing::cache_policy::replay(
        gpufeed::testing::cache_policy::Policy::Lru,
        capacity,
        &orders,
    );
    let mut rows = Vec::new();
    let loaders = loaders(&datasets, &spec.settings)?;
    for e in 0..spec.epochs {
        let c0 = cache.counters();
        let r0 = gpufeed::remote::total_retries();
        let cpu0 = gpufeed::testing::sys::process_cpu_seconds();
        let t0 = Instant::now();
        let (samples, bytes, first, remote_w, storage_w) = epoch(&datasets, &loaders, e)?;
        let secs = t0.elapsed().as_secs_f64();
        // The epoch's writes behind finish before the next is measured (not timed: a trainer
        // does not wait for them).
        cache.flush();
        let cpu = gpufeed::testing::sys::process_cpu_seconds() - cpu0;
        let c1 = cache.counters();
        let fetched = c1.fetched_bytes - c0.fetched_bytes;
        let gib = bytes as f64 / (1u64 << 30) as f64;
        rows.push(EpochRow {
            epoch: e,
            samples,
            seconds: secs,
            samples_per_s: samples as f64 / secs,
            gib_per_s: gib / secs,
            first_batch_s: first,
            fetched_ratio: fetched as f64 / dataset_bytes.max(1) as f64,
            lru_fetched_ratio: lru.get(e as usize).map_or(0.0, |h| {
                (h.misses * extent) as f64 / dataset_bytes.max(1) as f64
            }),
            hit_ratio: 1.0 - (fetched.min(bytes) as f64 / bytes.max(1) as f64),
            gets: c1.gets - c0.gets,
            retries: gpufeed::remote::total_retries() - r0,
            cpu_s_per_gib: cpu / gib.max(1e-12),
            remote_wait_s: remote_w,
            storage_wait_s: storage_w,
        });
    }
    let local = match &spec.local {
        Some(paths) => {
            let lds = Arc::new(Dataset::open_paths(paths, &spec.opts)?);
            let mut set = spec.settings.clone();
            set.rank = 0;
            set.world_size = 1;
            let l = Loader::builder(lds.clone()).settings(&set).build()?;
            let mut last = Ceiling::default();
            for e in 0..2 {
                let t0 = Instant::now();
                let (mut n, mut b) = (0u64, 0u64);
                for x in l.epoch(e)? {
                    let x = x?;
                    n += x.len() as u64;
                    b += x
                        .sample_ids()
                        .iter()
                        .map(|&i| lds.sample(i as usize).len as u64)
                        .sum::<u64>();
                }
                let secs = t0.elapsed().as_secs_f64();
                last = Ceiling {
                    gib_per_s: b as f64 / secs / (1u64 << 30) as f64,
                    samples_per_s: n as f64 / secs,
                    seconds: secs,
                };
            }
            Some(last)
        }
        None => None,
    };
    let first_batch_from_open_s = open.seconds + rows.first().map_or(0.0, |r| r.first_batch_s);
    Ok(RemoteReport {
        open,
        first_batch_from_open_s,
        urls: spec.urls.clone(),
        samples: ds.len() as u64,
        dataset_bytes,
        cache_limit: cache.limit(),
        extent_bytes: extent,
        ranks: spec.ranks.max(1),
        order: spec.settings.order().name().to_string(),
        epochs: rows,
        raw_get,
        get_threads: spec.get_threads,
        local,
    })
}
