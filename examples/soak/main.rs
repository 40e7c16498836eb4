//! The soak (`scripts/soak.sh [MINUTES]`): epochs back to back for MINUTES over a generated
//! dataset on the real disk — every order, one to three ranks, every engine, resumes at random
//! batches, loaders dropped mid-epoch — and, between them, whole epochs over the seeded faulty
//! simulated disk with fresh seeds. Checked throughout:
//!
//! - every epoch delivers every sample exactly once across its ranks (padding aside), each with
//!   its exact bytes and label;
//! - on the real disk no error at all; on the simulated disk only the EIO it injects, naming
//!   the file and the sample;
//! - resources when no loader is alive but the two image loaders (made once, below): resident
//!   memory, open descriptors, threads, locked and
//!   pinned memory, sampled every few seconds (io_uring's kernel workers, `iou-wrk-*`, apart:
//!   the kernel starts and ends them). After the first minute (warm-up: allocator
//!   arenas, the page cache of the dataset's index) none may grow by more than 5% (plus 64 KiB
//!   of allocator rounding) over its largest first-minute value, and descriptors and threads
//!   not at all.
//!
//! - decoded images: epochs of an image loader (host, and the simulated device where its
//!   kernels are built) over a folder where good JPEGs of every kind the generator makes
//!   alternate with damaged files — truncated at random points, zero-filled from a random
//!   point, other formats under a `.jpg` name — damaged afresh every epoch: every good image's
//!   tensor equals its clean decode exactly (a damaged image never harms the next one), a
//!   damaged one is decoded or named, never anything else.
//!
//! - over a real S3 server (`remote.rs`, where SeaweedFS is found): one node cache shared by
//!   two processes, with the server killed and restarted, cached extents damaged, objects
//!   replaced and the cache's disk filled between rounds — every sample exactly once with the
//!   bytes of its object's current version.
//!
//! Prints a summary (or `--json`) and exits 1 on any violation.
//!
//! ```text
//! cargo run --release --example soak -- --minutes 30 --dir target/soak
//! ```

mod remote;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufeed::dataset::shard::ShardWriter;
use gpufeed::decode::{ImageLoader, ImageSpec, PixelType};
use gpufeed::loader::BackendFactory;
use gpufeed::testing::sim::{Rng, SimBackend, SimConfig};
use gpufeed::{Dataset, Device, EngineKind, LastBatch, Loader, Order};

/// Sample `i`'s bytes: a function of its id and position, so a misplaced byte shows.
fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| ((i * 131 + k * 7) ^ (k >> 8) ^ (i >> 3)) as u8)
        .collect()
}

fn label(i: usize) -> i64 {
    (i % 1000) as i64
}

/// Writes `n` samples (1 B .. `max_len`) into `shards` shards, half of them 4 KiB-aligned.
fn write_dataset(dir: &Path, n: usize, shards: usize, max_len: u64, seed: u64) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).expect("dataset directory");
    let mut rng = Rng::new(seed);
    let per = n.div_ceil(shards);
    let mut paths = Vec::new();
    for s in 0..shards {
        let p = dir.join(format!("shard-{s:05}.gpf"));
        let align = if s % 2 == 0 { 1 } else { 4096 };
        let mut w = ShardWriter::create(&p, align).expect("create shard");
        for i in s * per..((s + 1) * per).min(n) {
            let len = 1 + rng.below(max_len) as usize;
            w.add(&format!("s{i}"), label(i), &[], &content(i, len))
                .expect("write sample");
        }
        w.finish().expect("finish shard");
        paths.push(p);
    }
    paths
}

/// What /proc says about this process.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Resources {
    t_s: f64,
    rss_kib: u64,
    fds: u64,
    threads: u64,
    /// io_uring's kernel workers at the sample (not in `threads`).
    io_uring_workers: u64,
    locked_kib: u64,
    pinned_kib: u64,
}

fn resources(t0: Instant) -> Resources {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    // io_uring's own workers (`iou-wrk-*`, for reads it cannot complete inline, such as
    // buffered reads of files the image loaders keep open) are the kernel's: it starts them
    // under load and ends them when idle. They are counted apart, not as the process's threads.
    let kernel_workers = std::fs::read_dir("/proc/self/task").map_or(0, |d| {
        d.flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("iou-wrk"))
            })
            .count() as u64
    });
    Resources {
        t_s: t0.elapsed().as_secs_f64(),
        rss_kib: field("VmRSS:"),
        fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
        threads: field("Threads:").saturating_sub(kernel_workers),
        io_uring_workers: kernel_workers,
        locked_kib: field("VmLck:"),
        pinned_kib: field("VmPin:"),
    }
}

#[derive(Default, serde::Serialize)]
struct Counts {
    disk_epochs: u64,
    disk_rank_epochs: u64,
    disk_samples: u64,
    disk_bytes: u64,
    resumes: u64,
    dropped_mid_epoch: u64,
    sim_seeds: u64,
    sim_samples: u64,
    sim_injected_errors: u64,
    image_epochs: u64,
    image_epochs_on_device: u64,
    good_images_checked: u64,
    damaged_images_named: u64,
    damaged_images_decoded: u64,
    by_order: BTreeMap<String, u64>,
    by_engine: BTreeMap<String, u64>,
}

/// The decoded-image part: a folder where good JPEGs (`NNNN-good-K.jpg`) alternate with
/// damaged files (`NNNN-bad.jpg`) whose bytes are made anew every epoch at the size they were
/// opened with (so the loaders, made once as a trainer makes them, stay valid); each good
/// image's clean tensor on the host and, where the simulated device's kernels are built, on it.
struct Images {
    dir: PathBuf,
    good: Vec<Vec<u8>>,
    /// The size of each damaged file.
    bad_len: Vec<usize>,
    dataset: Arc<Dataset>,
    host: ImageLoader,
    device: Option<ImageLoader>,
    /// The simulated device of `device` (its hazards are checked after each epoch).
    sim: gpufeed::gpu::SimDevice,
    clean_host: Vec<Vec<u8>>,
    clean_device: Vec<Vec<u8>>,
}

const GOOD_IMAGES: usize = 24;

/// Tensors of one epoch of `il` by sample id, and each sample's error.
type Decoded = BTreeMap<u32, (Vec<u8>, Option<String>)>;

fn decode_epoch(il: &ImageLoader, epoch: u64) -> gpufeed::Result<Decoded> {
    let mut out = BTreeMap::new();
    for batch in il.epoch(epoch)? {
        let batch = batch?;
        let all = batch.to_host()?;
        let per = all.len() / batch.len().max(1);
        for (i, &id) in batch.sample_ids().iter().enumerate() {
            let err = batch.error(i).map(|e| e.report());
            if out
                .insert(id, (all[i * per..(i + 1) * per].to_vec(), err))
                .is_some()
            {
                return Err(gpufeed::Error::new(
                    gpufeed::ErrorKind::InvalidInput,
                    format!("sample {id} twice in epoch {epoch}"),
                ));
            }
        }
    }
    Ok(out)
}

impl Images {
    fn new(dir: &Path, rng: &mut Rng) -> Images {
        let good: Vec<Vec<u8>> = (0..GOOD_IMAGES as u64)
            .map(|i| gpufeed::testing::synth::jpeg(3, i).expect("a generated JPEG"))
            .collect();
        let mut spec = ImageSpec::eval(32).dtype(PixelType::U8).threads(2);
        spec.dct_scaling = false; // the device decodes at full size: the same on both
        let sim = gpufeed::testing::host_kernels::available();
        let sim_dev = gpufeed::gpu::SimDevice::new(1);
        let loaders = |root: &Path| {
            let ds = Arc::new(Dataset::open(root).expect("open the images"));
            let make = |order: Order, batch: u32, device: Option<Device>, threads: usize| {
                // A small arena: the images are small (the default budget sizes 4 x 128 MiB).
                let mut b = Loader::builder(ds.clone())
                    .batch_size(batch)
                    .order(order)
                    .memory_budget(16 << 20);
                if let Some(d) = device {
                    b = b.device(d);
                }
                b.build()
                    .and_then(|l| l.decode_images(spec.clone().threads(threads)))
                    .expect("an image loader")
            };
            let host = make(Order::Global, 5, None, 2);
            let device = sim.then(|| {
                let d = Device::Simulated(sim_dev.clone());
                make(Order::Sequential, 3, Some(d), 1)
            });
            (ds, host, device)
        };
        // Clean tensors: the good images alone, on each device.
        let clean = dir.join("clean");
        std::fs::create_dir_all(clean.join("c")).expect("image directory");
        for (k, g) in good.iter().enumerate() {
            std::fs::write(clean.join(format!("c/{k:04}-good-{k}.jpg")), g).expect("write");
        }
        let tensors = |il: &ImageLoader| -> Vec<Vec<u8>> {
            let d = decode_epoch(il, 0).expect("the clean images decode");
            d.into_values()
                .map(|(t, e)| {
                    assert!(e.is_none(), "a clean image failed: {e:?}");
                    t
                })
                .collect()
        };
        let (_, host, device) = loaders(&clean);
        let clean_host = tensors(&host);
        let clean_device = device.as_ref().map(tensors).unwrap_or_default();
        drop((host, device));
        // The mixed folder: a damaged file of a random size before each good image.
        let mixed = dir.join("mixed");
        std::fs::create_dir_all(mixed.join("c")).expect("image directory");
        let mut bad_len = Vec::new();
        for (k, g) in good.iter().enumerate() {
            std::fs::write(mixed.join(format!("c/{:04}-good-{k}.jpg", 2 * k + 1)), g)
                .expect("write");
            let len = 1 + rng.below(g.len() as u64) as usize;
            std::fs::write(
                mixed.join(format!("c/{:04}-bad.jpg", 2 * k)),
                vec![0u8; len],
            )
            .expect("write");
            bad_len.push(len);
        }
        let (dataset, host, device) = loaders(&mixed);
        Images {
            dir: mixed,
            good,
            bad_len,
            dataset,
            host,
            device,
            sim: sim_dev,
            clean_host,
            clean_device,
        }
    }

    /// Writes every damaged file anew, at its size: a good image truncated there, one
    /// zero-filled from a random point, an HTML page, a PNG signature before JPEG bytes, noise.
    fn damage(&self, rng: &mut Rng) {
        for (k, &len) in self.bad_len.iter().enumerate() {
            let bases: Vec<&Vec<u8>> = self.good.iter().filter(|g| g.len() >= len).collect();
            let base = bases[rng.below(bases.len() as u64) as usize];
            let at = rng.below(len as u64) as usize;
            let mut bad: Vec<u8> = match rng.below(5) {
                0 => base[..len].to_vec(),
                1 => {
                    let mut b = base[..len].to_vec();
                    b[at..].fill(0);
                    b
                }
                2 => b"<html><body>404 Not Found</body></html>".repeat(len / 39 + 1),
                3 => {
                    let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
                    b.extend_from_slice(base);
                    b
                }
                _ => (0..len).map(|i| ((i * 7919 + at) % 251) as u8).collect(),
            };
            bad.resize(len, 0);
            std::fs::write(self.dir.join(format!("c/{:04}-bad.jpg", 2 * k)), bad).expect("write");
        }
    }
}

struct Soak {
    ds: Arc<Dataset>,
    small: Arc<Dataset>,
    images: Images,
    rng: Rng,
    counts: Counts,
    violations: Vec<String>,
}

impl Soak {
    fn fail(&mut self, msg: String) {
        eprintln!("VIOLATION: {msg}");
        if self.violations.len() < 50 {
            self.violations.push(msg);
        }
    }

    fn pick_order(&mut self) -> Order {
        match self.rng.below(4) {
            0 => Order::Global,
            3 => Order::Sequential,
            1 => Order::ShardBuffer {
                buffer: 1 + self.rng.below(400) as u32,
            },
            _ => Order::Block {
                block_bytes: (16 << 10) << self.rng.below(8),
                open_blocks: 1 + self.rng.below(6) as u32,
            },
        }
    }

    /// Checks a delivered sample against what was written; returns its length.
    fn check_bytes(
        &mut self,
        ds: &Dataset,
        what: &str,
        id: u32,
        bytes: &[u8],
        label_got: i64,
    ) -> usize {
        let want = content(id as usize, ds.sample(id as usize).len as usize);
        if bytes != want.as_slice() {
            self.fail(format!("{what}: sample {id} has wrong bytes"));
        }
        if label_got != label(id as usize) {
            self.fail(format!("{what}: sample {id} has label {label_got}"));
        }
        bytes.len()
    }

    /// One epoch on the real disk: ranks read one after another, some resumed at a random
    /// batch (the first part from a loader dropped mid-epoch), plus sometimes a loader that is
    /// dropped after a few batches and never resumed.
    fn disk_epoch(&mut self, epoch: u64) {
        let order = self.pick_order();
        let world = 1 + self.rng.below(3) as u32;
        let batch = 1 + self.rng.below(96) as u32;
        let last = if self.rng.below(4) == 0 {
            LastBatch::Pad
        } else {
            LastBatch::Short
        };
        let engine = [
            EngineKind::Uring,
            EngineKind::UringBuffered,
            EngineKind::PreadPool,
        ][self.rng.below(3) as usize];
        let seed = self.rng.next_u64();
        let what = format!(
            "disk epoch {epoch} ({}, {world} ranks, batch {batch}, {last:?}, {})",
            order.name(),
            engine.name()
        );
        *self.counts.by_order.entry(order.name().into()).or_default() += 1;
        *self
            .counts
            .by_engine
            .entry(engine.name().into())
            .or_default() += 1;
        let ds = self.ds.clone();
        let for_build = ds.clone();
        let build = move |rank: u32| {
            Loader::builder(for_build.clone())
                .batch_size(batch)
                .order(order)
                .seed(seed)
                .rank(rank, world)
                .last_batch(last)
                .engine_kind(engine)
                .memory_budget(64 << 20)
                .build()
        };
        let mut seen = vec![0u32; self.ds.len()];
        for rank in 0..world {
            self.counts.disk_rank_epochs += 1;
            let loader = match build(rank) {
                Ok(l) => l,
                Err(e) => {
                    return self.fail(format!("{what}: building rank {rank}: {}", e.report()))
                }
            };
            let batches = loader.batches_per_epoch();
            let resume_at = if batches > 1 && self.rng.below(3) == 0 {
                1 + self.rng.below(batches as u64 - 1) as u32
            } else {
                0
            };
            let mut parts = Vec::new();
            if resume_at > 0 {
                // The first part from this loader, then it is dropped mid-epoch (the epoch
                // first, or the loader with the epoch still alive); the rest from a new one.
                self.counts.resumes += 1;
                parts.push((Some(loader), 0, Some(resume_at)));
                parts.push((None, resume_at, None));
            } else {
                parts.push((Some(loader), 0, None));
            }
            for (loader, start, stop) in parts {
                let loader = match loader {
                    Some(l) => l,
                    None => match build(rank) {
                        Ok(l) => l,
                        Err(e) => {
                            return self
                                .fail(format!("{what}: rebuilding rank {rank}: {}", e.report()))
                        }
                    },
                };
                let mut ep = match loader.epoch_from(epoch, start) {
                    Ok(ep) => ep,
                    Err(e) => return self.fail(format!("{what}: epoch: {}", e.report())),
                };
                let mut k = start;
                while stop.is_none_or(|s| k < s) {
                    let Some(b) = ep.next() else { break };
                    let b = match b {
                        Ok(b) => b,
                        Err(e) => return self.fail(format!("{what}: batch {k}: {}", e.report())),
                    };
                    for (j, &id) in b.sample_ids().iter().enumerate() {
                        if b.is_padding(j) {
                            continue;
                        }
                        seen[id as usize] += 1;
                        match b.sample(j) {
                            Ok(bytes) => {
                                let n = self.check_bytes(&ds, &what, id, bytes, b.labels()[j]);
                                self.counts.disk_samples += 1;
                                self.counts.disk_bytes += n as u64;
                            }
                            Err(e) => {
                                let r = e.report();
                                self.fail(format!("{what}: sample {id}: {r}"))
                            }
                        }
                    }
                    k += 1;
                }
                if stop.is_some() {
                    if self.rng.below(2) == 0 {
                        drop(ep);
                        drop(loader);
                    } else {
                        drop(loader);
                        drop(ep);
                    }
                }
            }
        }
        let wrong = seen.iter().filter(|&&c| c != 1).count();
        if wrong > 0 {
            let lost = seen.iter().filter(|&&c| c == 0).count();
            self.fail(format!(
                "{what}: {lost} samples lost, {} delivered more than once",
                wrong - lost
            ));
        }
        self.counts.disk_epochs += 1;
        // Sometimes a loader read for a few batches and dropped for good (no resume).
        if self.rng.below(3) == 0 {
            self.counts.dropped_mid_epoch += 1;
            if let Ok(l) = build(0) {
                if let Ok(mut ep) = l.epoch(epoch + 1) {
                    for _ in 0..self.rng.below(4) {
                        let _ = ep.next();
                    }
                }
            }
        }
    }

    /// One epoch of decoded images over the good JPEGs with damaged files between them, made
    /// afresh: on the host, or on the simulated device every other epoch where it is built.
    fn image_epoch(&mut self, epoch: u64) {
        self.images.damage(&mut self.rng);
        let on_device = epoch % 2 == 1 && self.images.device.is_some();
        let what = format!(
            "image epoch {epoch} ({})",
            if on_device {
                "simulated device"
            } else {
                "host"
            }
        );
        let il = match (on_device, &self.images.device) {
            (true, Some(d)) => d,
            _ => &self.images.host,
        };
        let decoded = match decode_epoch(il, epoch) {
            Ok(d) => d,
            Err(e) => return self.fail(format!("{what}: {}", e.report())),
        };
        if decoded.len() != self.images.dataset.len() {
            self.fail(format!(
                "{what}: {} of {} images",
                decoded.len(),
                self.images.dataset.len()
            ));
        }
        for (id, (tensor, err)) in decoded {
            let key = self.images.dataset.key(id as usize).to_string();
            let good = key
                .split("-good-")
                .nth(1)
                .and_then(|k| k.trim_end_matches(".jpg").parse::<usize>().ok());
            match (good, err) {
                (Some(k), None) => {
                    let clean = if on_device {
                        &self.images.clean_device[k]
                    } else {
                        &self.images.clean_host[k]
                    };
                    if tensor != *clean {
                        self.fail(format!(
                            "{what}: good image {key} differs from its clean decode"
                        ));
                    }
                    self.counts.good_images_checked += 1;
                }
                (Some(_), Some(e)) => self.fail(format!("{what}: good image {key} failed: {e}")),
                (None, Some(e)) if e.contains(&key) => self.counts.damaged_images_named += 1,
                (None, Some(e)) => {
                    self.fail(format!("{what}: {key}'s error does not name it: {e}"))
                }
                (None, None) => self.counts.damaged_images_decoded += 1,
            }
        }
        let hazards = self.images.sim.hazards();
        if !hazards.is_empty() {
            self.fail(format!(
                "{what}: the simulated device saw unordered accesses: {}",
                hazards.join("; ")
            ));
        }
        self.counts.image_epochs += 1;
        self.counts.image_epochs_on_device += u64::from(on_device);
    }

    /// One fresh seed of the faulty simulated disk: a whole epoch of the small dataset.
    fn sim_seed(&mut self, seed: u64) {
        let clean = seed.is_multiple_of(7);
        let factory: BackendFactory = Arc::new(move |_epoch| {
            let cfg = if clean {
                SimConfig::clean(seed)
            } else {
                SimConfig::faulty(seed)
            };
            Box::new(SimBackend::new(cfg)) as Box<dyn gpufeed::io::Backend>
        });
        let order = self.pick_order();
        let small = self.small.clone();
        let loader = Loader::builder(small.clone())
            .batch_size(1 + (seed % 17) as u32)
            .order(order)
            .seed(seed)
            .window(2, 1 << 20)
            .memory_budget(8 << 20)
            .backend(EngineKind::Uring, factory)
            .build();
        let what = format!("sim seed {seed}");
        let loader = match loader {
            Ok(l) => l,
            Err(e) => return self.fail(format!("{what}: build: {}", e.report())),
        };
        let mut seen = vec![0u32; self.small.len()];
        let ep = match loader.epoch(seed) {
            Ok(ep) => ep,
            Err(e) => return self.fail(format!("{what}: epoch: {}", e.report())),
        };
        for b in ep {
            let b = match b {
                Ok(b) => b,
                Err(e) => return self.fail(format!("{what}: batch: {}", e.report())),
            };
            for (j, &id) in b.sample_ids().iter().enumerate() {
                seen[id as usize] += 1;
                self.counts.sim_samples += 1;
                match b.sample(j) {
                    Ok(bytes) => {
                        let _ = self.check_bytes(&small, &what, id, bytes, b.labels()[j]);
                    }
                    Err(e) => {
                        let injected = !clean
                            && e.raw_os_error() == Some(libc::EIO)
                            && e.sample() == Some(id as u64)
                            && e.path().is_some();
                        if injected {
                            self.counts.sim_injected_errors += 1;
                        } else {
                            self.fail(format!("{what}: not an injected error: {}", e.report()));
                        }
                    }
                }
            }
        }
        if seen.iter().any(|&c| c != 1) {
            self.fail(format!("{what}: not every sample exactly once"));
        }
        if loader.free_slots() != loader.slots() {
            self.fail(format!("{what}: a slot was lost"));
        }
        self.counts.sim_seeds += 1;
    }
}

fn main() {
    // glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB),
    // so later large blocks come from the heap and stay in the RSS as fragments: steps of 2-4
    // MiB that plateau, not leaks, yet over the 5% allowed in the one-minute run (measured:
    // 49 -> 53 MiB and flat for the next two minutes; 41.0 -> 41.4 MiB with the threshold
    // fixed). A fixed threshold keeps what is measured to what the process holds on to.
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called first thing in main, before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
    let mut minutes = 30.0f64;
    let mut dir = PathBuf::from("target/soak");
    let mut json = false;
    let mut with_remote = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--remote-child" => remote::child(&args.next().expect("--remote-child TASK")),
            "--no-remote" => with_remote = false,
            "--minutes" => {
                minutes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--minutes N")
            }
            "--dir" => dir = args.next().map(PathBuf::from).expect("--dir DIR"),
            "--json" => json = true,
            _ => {
                eprintln!("usage: soak [--minutes N] [--dir DIR] [--no-remote] [--json]");
                std::process::exit(2);
            }
        }
    }
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(minutes * 60.0);
    // The warm-up: a thirtieth of the run (5 s to a minute), and at least the first 12 rounds
    // of the loop (every engine and order met, whatever time the S3 rounds took).
    let mut warm_up = Duration::from_secs_f64((minutes * 60.0 / 30.0).clamp(5.0, 60.0));
    remote::unmount_leftover(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let paths = write_dataset(&dir, 3000, 6, 48 << 10, 7);
    let ds = Arc::new(Dataset::open_shards(&paths).expect("open the soak dataset"));
    // The simulated disk reads a small set: a fresh seed per epoch is what is soaked there.
    let small_paths = write_dataset(&dir.join("small"), 80, 2, 8 << 10, 11);
    let small = Arc::new(Dataset::open_shards(&small_paths).expect("open the small dataset"));
    eprintln!(
        "soak: {} samples in {} shards ({:.0} MiB) in {}, {minutes} min",
        ds.len(),
        paths.len(),
        ds.total_bytes() as f64 / (1 << 20) as f64,
        dir.display()
    );
    let images = Images::new(&dir.join("images"), &mut Rng::new(0x1a6e));
    let mut s = Soak {
        ds,
        small,
        images,
        rng: Rng::new(0x50a4),
        counts: Counts::default(),
        violations: Vec::new(),
    };
    // The S3 part, where a server can be started (required where GPUFEED_REQUIRE_S3=1, as CI
    // sets it).
    let mut remote = None;
    let mut remote_skipped = None;
    if with_remote {
        // The 10⁴ small tars (a minute's upload here) where the soak is long enough for them.
        match remote::Remote::start(&dir, minutes >= 10.0) {
            Ok(r) => {
                if let Some(why) = &r.counts.fill_skipped {
                    eprintln!("soak: the cache's disk is not filled: {why}");
                }
                remote = Some(r)
            }
            Err(why) => {
                if std::env::var("GPUFEED_REQUIRE_S3").as_deref() == Ok("1") {
                    eprintln!("soak: GPUFEED_REQUIRE_S3=1 but the S3 part cannot run: {why}");
                    std::process::exit(1);
                }
                eprintln!("soak: the S3 part is skipped: {why}");
                remote_skipped = Some(why);
            }
        }
    }
    let mut remote_time = Duration::ZERO;
    // The resources are watched from here (the S3 server's start and uploads are setup).
    let t_res = Instant::now();
    let mut samples: Vec<Resources> = vec![resources(t_res)];
    let mut next_sample = Instant::now() + Duration::from_secs(2);
    let mut next_line = Instant::now() + Duration::from_secs(30);
    let mut epoch = 0u64;
    let mut sim_seed = 1u64 << 32;
    while Instant::now() < deadline {
        if epoch == 12 {
            warm_up = warm_up.max(t_res.elapsed());
        }
        let t = Instant::now();
        s.disk_epoch(epoch);
        s.image_epoch(epoch);
        epoch += 1;
        // Twice as long on fresh simulator seeds (at least 20).
        let disk_took = t.elapsed();
        let t = Instant::now();
        let mut n = 0;
        while n < 20 || t.elapsed() < 2 * disk_took {
            s.sim_seed(sim_seed);
            sim_seed += 1;
            n += 1;
        }
        // A third of the time over S3.
        if let Some(r) = remote.as_mut() {
            while remote_time < (t0.elapsed() - remote_time) / 2 {
                let t = Instant::now();
                r.round(&mut |m| s.fail(m));
                remote_time += t.elapsed();
            }
        }
        // No loader is alive here: what the process holds is what it keeps.
        if Instant::now() >= next_sample {
            samples.push(resources(t_res));
            next_sample = Instant::now() + Duration::from_secs(2);
        }
        if Instant::now() >= next_line && !json {
            let r = samples.last().copied().unwrap_or_default();
            eprintln!(
                "  {:>5.0} s: {} disk epochs, {} sim seeds, RSS {} MiB, {} fds, {} threads, {} violations",
                r.t_s,
                s.counts.disk_epochs,
                s.counts.sim_seeds,
                r.rss_kib / 1024,
                r.fds,
                r.threads,
                s.violations.len()
            );
            next_line = Instant::now() + Duration::from_secs(30);
        }
    }
    samples.push(resources(t_res));
    // Growth after the warm-up against the largest warm-up value.
    let (early, late): (Vec<Resources>, Vec<Resources>) =
        samples.iter().partition(|r| r.t_s <= warm_up.as_secs_f64());
    let max = |v: &[Resources], f: fn(&Resources) -> u64| v.iter().map(f).max().unwrap_or(0);
    type Field = (&'static str, fn(&Resources) -> u64, f64);
    let fields: [Field; 5] = [
        ("rss_kib", |r| r.rss_kib, 0.05),
        ("fds", |r| r.fds, 0.0),
        ("threads", |r| r.threads, 0.0),
        ("locked_kib", |r| r.locked_kib, 0.05),
        ("pinned_kib", |r| r.pinned_kib, 0.05),
    ];
    let mut growth = BTreeMap::new();
    for (name, f, allowed) in fields {
        let (base, last_max) = (max(&early, f), max(&late, f));
        growth.insert(name, (base, last_max));
        if late.is_empty() {
            continue;
        }
        if last_max as f64 > base as f64 * (1.0 + allowed) + if allowed > 0.0 { 64.0 } else { 0.0 }
        {
            s.fail(format!(
                "{name} grew from {base} (largest in the first {:.0} s) to {last_max}",
                warm_up.as_secs_f64()
            ));
        }
    }
    let took = t0.elapsed().as_secs_f64();
    let ok = s.violations.is_empty();
    if json {
        let v = serde_json::json!({
            "minutes": took / 60.0,
            "ok": ok,
            "counts": s.counts,
            "resources_first_and_after_warm_up": growth,
            "samples": samples,
            "violations": s.violations,
            "remote": remote.as_ref().map(|r| &r.counts),
            "remote_skipped": remote_skipped,
        });
        println!("{v}");
    } else {
        let c = &s.counts;
        println!(
            "soak: {:.1} min, {}",
            took / 60.0,
            if ok { "clean" } else { "FAILED" }
        );
        println!(
            "  real disk: {} epochs ({} rank-epochs), {} samples, {:.1} GiB, {} resumes, {} loaders dropped mid-epoch",
            c.disk_epochs,
            c.disk_rank_epochs,
            c.disk_samples,
            c.disk_bytes as f64 / (1u64 << 30) as f64,
            c.resumes,
            c.dropped_mid_epoch
        );
        println!("  orders {:?}, engines {:?}", c.by_order, c.by_engine);
        println!(
            "  simulated disk: {} seeds, {} samples, {} injected errors reported as such",
            c.sim_seeds, c.sim_samples, c.sim_injected_errors
        );
        println!(
            "  decoded images: {} epochs ({} on the simulated device), {} good images exact, {} damaged named, {} damaged decoded",
            c.image_epochs,
            c.image_epochs_on_device,
            c.good_images_checked,
            c.damaged_images_named,
            c.damaged_images_decoded
        );
        match (&remote, &remote_skipped) {
            (Some(r), _) => {
                let c = &r.counts;
                println!(
                    "  over S3 (two processes, one cache): {} rounds {:?}, {} child epochs, {} samples; server restarted {} times between rounds and killed {} times mid-epoch; {} extents damaged ({} counted as found), {} kept tar indexes damaged; {} objects replaced ({} tar indexes left stale); cache disk filled {} times{}",
                    c.rounds,
                    c.by_format,
                    c.child_epochs,
                    c.samples,
                    c.server_restarts_between_rounds,
                    c.server_kills_mid_epoch,
                    c.extents_damaged,
                    c.damaged_extents_counted,
                    c.kept_indexes_damaged,
                    c.objects_replaced,
                    c.stale_tar_indexes,
                    c.disk_fills,
                    c.fill_skipped
                        .as_ref()
                        .map(|w| format!(" (skipped: {w})"))
                        .unwrap_or_default()
                );
                println!(
                    "  over S3, issue 52's rounds: {} opens through another endpoint refused, {} opens while the store was down served by the cache, {} full-disk rounds' traffic checked, {} block epochs over 10^4 tars",
                    c.twin_endpoint_refused,
                    c.opened_while_down,
                    c.disk_fill_traffic_checked,
                    c.many_tar_epochs
                );
            }
            (None, Some(why)) => println!("  over S3: skipped ({why})"),
            (None, None) => println!("  over S3: not run (--no-remote)"),
        }
        println!(
            "  lost or duplicated samples: {}",
            s.violations
                .iter()
                .filter(|v| v.contains("exactly once") || v.contains("lost"))
                .count()
        );
        for (name, (base, late)) in &growth {
            println!(
                "  {name:<11} first {:.0} s max {base:>8}, after max {late:>8}",
                warm_up.as_secs_f64()
            );
        }
        for v in &s.violations {
            println!("  violation: {v}");
        }
    }
    // The server stopped and the cache's tmpfs unmounted (exit runs no destructors).
    drop(remote);
    std::process::exit(if ok { 0 } else { 1 });
}
