//! Packing under a full disk and under a kill; two loaders over one dataset in one process.
//! (fork() is in loader.rs; the fuzz targets' findings in fuzzed.rs; the soak is
//! `scripts/soak.sh`.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpufeed::dataset::shard::ShardWriter;
use gpufeed::testing::sim::Rng;
use gpufeed::testing::STAGING;
use gpufeed::{Dataset, Loader};

use crate::common::*;

fn gpufeed() -> Command {
    let mut c = Command::new(gpufeed_bin());
    c.env("GPUFEED_QUIET", "1").env_remove("GPUFEED_ENGINE");
    c
}

/// `gpufeed pack SRC OUT --shard-size SIZE`, which must succeed.
fn pack_ok(src: &Path, out: &Path, shard_size: &str) {
    let o = gpufeed()
        .arg("pack")
        .arg(src)
        .arg(out)
        .args(["--shard-size", shard_size])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn content(i: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(i as u64 * 7919 + 1);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

/// `n` samples of 8..64 KiB in `shards` shards under `dir`.
fn source(dir: &Path, n: usize, shards: usize) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let per = n.div_ceil(shards);
    (0..shards)
        .map(|s| {
            let p = dir.join(format!("src-{s}.gpf"));
            let mut w = ShardWriter::create(&p, 1).unwrap();
            for i in s * per..((s + 1) * per).min(n) {
                let len = (8 << 10) + (i * 977) % (56 << 10);
                w.add(&format!("k{i}"), i as i64, &[], &content(i, len))
                    .unwrap();
            }
            w.finish().unwrap();
            p
        })
        .collect()
}

/// Every file under `dir`, hidden folders included.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The packed output holds exactly the source's samples, in order, with their bytes.
fn assert_packed(out: &Path, src: &Dataset) {
    let ds = Dataset::open(out).unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(ds.len(), src.len());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..ds.len() {
        ds.read_sample(i, &mut a, true).unwrap();
        src.read_sample(i, &mut b, true).unwrap();
        assert_eq!(a, b, "sample {i}");
        assert_eq!(ds.key(i), src.key(i));
    }
    assert!(!out.join(STAGING).exists(), "the staging folder is gone");
}

/// Nothing under `out` reads as a shard, and opening the directory fails.
fn assert_nothing_reads(out: &Path, what: &str) {
    for f in all_files(out) {
        if let Ok(ds) = Dataset::open(&f) {
            panic!(
                "{what}: {} reads as a dataset of {} samples",
                f.display(),
                ds.len()
            );
        }
    }
    assert!(
        Dataset::open(out).is_err(),
        "{what}: the output directory opens"
    );
}

/// A small file system that fills up: a 3 MiB tmpfs mounted for the test, or where mounting
/// is not allowed, a file-size limit of 1–2 MiB (`ulimit -f`, SIGXFSZ ignored: writes fail
/// with EFBIG) on the packing process, which only a shard larger than that meets.
struct Small {
    dir: PathBuf,
    mounted: bool,
}

impl Small {
    fn new(base: &Path) -> Small {
        let dir = base.join("small-fs");
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
            .arg(&dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!(
                "note: cannot mount a tmpfs here; a file-size limit stands for the full disk"
            );
        }
        Small { dir, mounted }
    }

    /// `gpufeed pack SRC OUT ...` with the limit, when it is one.
    fn pack(&self, src: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
        let mut c = if self.mounted {
            gpufeed()
        } else {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("trap '' XFSZ; ulimit -f 2048; exec \"$0\" \"$@\"")
                .arg(gpufeed_bin())
                .env("GPUFEED_QUIET", "1");
            c
        };
        c.arg("pack")
            .arg(src)
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    }
}

impl Drop for Small {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
    }
}

/// A pack into a file system that fills up ends with an error naming the shard and saying
/// why, and leaves nothing that reads as a shard; with room again, the same command finishes.
#[test]
fn pack_into_a_full_disk_fails_cleanly_and_a_rerun_finishes() {
    let dir = disk_dir();
    let src_dir = dir.path().join("src");
    source(&src_dir, 160, 2); // about 5.5 MiB of samples
    let src = Dataset::open(&src_dir).unwrap();
    let small = Small::new(dir.path());
    let out = small.dir.join("out");
    let sizes: &[&str] = if small.mounted {
        &["1M", "64M"]
    } else {
        &["64M"]
    };
    for &shard_size in sizes {
        let o = small.pack(
            &src_dir,
            &out,
            &["--shard-size", shard_size, "--threads", "2"],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "pack into 3 MiB succeeded: {err}");
        let why = if small.mounted {
            "No space left on device"
        } else {
            "File too large"
        };
        assert!(err.contains(why), "the error says why: {err}");
        assert!(err.contains(".gpf"), "the error names the shard: {err}");
        assert_nothing_reads(&out, &format!("full disk, shards of {shard_size}"));
        assert!(
            !out.join(STAGING).exists(),
            "a failed pack removes its staging folder"
        );
    }
    // Room again: the same command finishes the job.
    let big = dir.path().join("out");
    pack_ok(&src_dir, &big, "1M");
    assert_packed(&big, &src);
}

/// Runs `gpufeed pack SRC OUT` and sends it `signal` once two shards are finished in the
/// staging folder; its exit status.
fn pack_killed_midway(src_dir: &Path, out: &Path, signal: i32) -> std::process::ExitStatus {
    use std::os::unix::process::CommandExt;
    let mut cmd = gpufeed();
    cmd.arg("pack")
        .arg(src_dir)
        .arg(out)
        .args(["--shard-size", "256K", "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // A test run started in the background by a shell inherits SIGINT ignored (POSIX shells
    // ignore it for asynchronous commands), and so would the pack: give it the default action,
    // as a pack run from a terminal has.
    // SAFETY: between fork and exec only `signal(2)` runs, which is async-signal-safe and
    // touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    let staged = out.join(STAGING);
    loop {
        let done = std::fs::read_dir(&staged)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "gpf"))
                    .count()
            })
            .unwrap_or(0);
        if done >= 2 {
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break; // it ended first: the caller sees a success and tries again
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no shard finished in 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    if child.try_wait().unwrap().is_none() {
        // SAFETY: kill(2) on our own child's pid, not yet reaped (try_wait just said it runs).
        let rc = unsafe { libc::kill(child.id() as i32, signal) };
        assert_eq!(rc, 0);
    }
    child.wait().unwrap()
}

/// A pack killed (SIGINT, SIGKILL) after some shards are done leaves nothing that reads as
/// the dataset or a shard of it — opening the directory says a pack did not finish — and
/// rerunning it finishes the job; a rerun into a directory of an earlier, larger pack leaves
/// none of the earlier shards.
#[test]
fn a_killed_pack_reads_as_nothing_and_a_rerun_finishes() {
    let dir = disk_dir();
    let src_dir = dir.path().join("src");
    source(&src_dir, 600, 3); // about 21 MiB
    let src = Dataset::open(&src_dir).unwrap();
    let out = dir.path().join("out");
    for signal in [libc::SIGINT, libc::SIGKILL] {
        // A pack that finished before the signal landed (a loaded machine can deschedule this
        // thread for the whole pack) was not killed mid-way: it tests nothing, so go again.
        let mut attempts = 0;
        let st = loop {
            attempts += 1;
            let st = pack_killed_midway(&src_dir, &out, signal);
            if !st.success() {
                break st;
            }
            assert!(attempts < 5, "the pack finished before the signal, 5 times");
            eprintln!("the pack finished before signal {signal} landed: again");
            std::fs::remove_dir_all(&out).unwrap();
        };
        assert!(!st.success());
        assert_nothing_reads(&out, &format!("killed with signal {signal}"));
        let e = Dataset::open(&out).unwrap_err();
        assert!(e.to_string().contains("unfinished `gpufeed pack`"), "{e}");
    }
    pack_ok(&src_dir, &out, "256K");
    assert_packed(&out, &src);
    // The same directory packed again with larger shards: the earlier shards all go.
    pack_ok(&src_dir, &out, "8M");
    assert_packed(&out, &src);
    assert_eq!(gpufeed::dataset::shard::find_shards(&out).unwrap().len(), 3);
}

/// Two loaders over one dataset (one `Arc<Dataset>`) in one process, read at the same time
/// from two threads, with different orders: each delivers every sample exactly once, with its
/// bytes, and both give every slot back.
#[test]
fn two_loaders_over_one_dataset_at_once() {
    let dir = disk_dir();
    let paths = source(&dir.path().join("src"), 300, 3);
    let ds = std::sync::Arc::new(Dataset::open_shards(&paths).unwrap());
    let run = |seed: u64, order: gpufeed::Order| {
        let ds = ds.clone();
        std::thread::spawn(move || {
            let loader = Loader::builder(ds.clone())
                .batch_size(16)
                .seed(seed)
                .order(order)
                .build()
                .unwrap();
            for epoch in 0..3 {
                let mut seen = vec![0u32; ds.len()];
                for b in loader.epoch(epoch).unwrap() {
                    let b = b.unwrap();
                    for (j, &id) in b.sample_ids().iter().enumerate() {
                        seen[id as usize] += 1;
                        let want = content(id as usize, ds.sample(id as usize).len as usize);
                        assert_eq!(b.sample(j).unwrap(), &want[..], "sample {id}");
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "seed {seed} epoch {epoch}");
            }
            assert_eq!(loader.free_slots(), loader.slots());
        })
    };
    let a = run(1, gpufeed::Order::Global);
    let b = run(
        2,
        gpufeed::Order::Block {
            block_bytes: 256 << 10,
            open_blocks: 2,
        },
    );
    a.join().unwrap();
    b.join().unwrap();
}
