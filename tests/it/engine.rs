//! The real backends against real files: bytes, errors, fallbacks, drop mid-flight.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

use gpufeed::testing::Rng;
use gpufeed::{Engine, EngineKind, ErrorKind, ReadSpec};

use crate::common::*;

/// Offsets and lengths of every awkward kind: aligned, unaligned, tiny, zero, crossing EOF,
/// starting at and past EOF.
fn awkward_requests(size: u64, seed: u64, n: usize, max_len: u32) -> Vec<(u64, u32)> {
    let mut rng = Rng::new(seed);
    let mut v = vec![
        (0, 4096),
        (0, 1),
        (1, 4095),
        (4095, 2),
        (12345, 0),
        (size - 10, 10),
        (size - 10, 4096), // crosses EOF
        (size, 100),       // starts at EOF
        (size + 5000, 7),  // past EOF
        (size / 2 / 4096 * 4096, max_len),
    ];
    for _ in 0..n {
        let off = rng.below(size);
        let len = rng.below(max_len as u64 + 1) as u32;
        v.push((off, len));
    }
    v
}

fn check_every_byte(kind: EngineKind) {
    let dir = disk_dir();
    // Not a multiple of any alignment.
    let size = (3 << 20) + 1234;
    let path = pattern_file(dir.path(), "pattern.bin", size);
    let mut engine = Engine::new(config(kind, 16, 256 << 10)).unwrap();
    assert_eq!(engine.kind(), kind);
    let file = engine.open(&path).unwrap();
    let reqs = awkward_requests(size, kind as u64 + 7, 400, 256 << 10);
    let got = read_all(&mut engine, file, &reqs);
    for (&(off, len), r) in reqs.iter().zip(&got) {
        let bytes = r
            .as_ref()
            .unwrap_or_else(|e| panic!("{kind}: read {off}+{len} failed: {e}"));
        let want = (off + len as u64).min(size).saturating_sub(off) as usize;
        assert_eq!(
            bytes.len(),
            want,
            "{kind}: read {off}+{len} delivered the wrong length"
        );
        assert_pattern(bytes, off, &format!("{kind} read {off}+{len}"));
    }
    assert_eq!(engine.arena().free_slots(), engine.arena().slots() as usize);
    assert_eq!(engine.stats().errors, 0);
}

#[test]
fn uring_delivers_every_byte() {
    check_every_byte(EngineKind::Uring);
}

#[test]
fn uring_buffered_delivers_every_byte() {
    check_every_byte(EngineKind::UringBuffered);
}

#[test]
fn pread_pool_delivers_every_byte() {
    check_every_byte(EngineKind::PreadPool);
}

#[test]
fn std_delivers_every_byte() {
    check_every_byte(EngineKind::Std);
}

#[test]
fn unregistered_buffers_deliver_every_byte() {
    let dir = disk_dir();
    let size = (1 << 20) + 77;
    let path = pattern_file(dir.path(), "p.bin", size);
    let cfg = gpufeed::EngineConfig {
        register_buffers: false,
        ..config(EngineKind::Uring, 8, 64 << 10)
    };
    let mut engine = Engine::new(cfg).unwrap();
    assert!(!engine.buffers_registered());
    let file = engine.open(&path).unwrap();
    let reqs = awkward_requests(size, 3, 200, 64 << 10);
    for (&(off, len), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        let b = r.unwrap();
        assert_eq!(
            b.len() as u64,
            (off + len as u64).min(size).saturating_sub(off)
        );
        assert_pattern(&b, off, "unregistered");
    }
}

#[test]
fn uring_uses_direct_io_and_fixed_buffers_here() {
    let dir = disk_dir();
    let path = pattern_file(dir.path(), "p.bin", 1 << 20);
    let mut engine = Engine::new(config(EngineKind::Uring, 8, 64 << 10)).unwrap();
    let file = engine.open(&path).unwrap();
    let info = engine.file_info(file).unwrap();
    // The test directory is on a disk file system; root may lock any amount of memory.
    assert!(info.direct, "O_DIRECT refused on {}", path.display());
    assert!(info.offset_align >= 512 && info.offset_align.is_power_of_two());
    if is_root() {
        assert!(engine.buffers_registered(), "{}", engine.describe());
    }
}

#[test]
fn all_engines_agree_byte_for_byte() {
    let dir = disk_dir();
    let size = (2 << 20) + 999;
    let path = pattern_file(dir.path(), "p.bin", size);
    let reqs = awkward_requests(size, 99, 300, 128 << 10);
    let mut results = Vec::new();
    for kind in EngineKind::ALL {
        let mut engine = Engine::new(config(kind, 8, 128 << 10)).unwrap();
        let file = engine.open(&path).unwrap();
        let r: Vec<Vec<u8>> = read_all(&mut engine, file, &reqs)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        results.push((kind, r));
    }
    let (k0, base) = &results[0];
    for (k, r) in &results[1..] {
        assert!(r == base, "{k} and {k0} delivered different bytes");
    }
}

#[test]
fn multi_read_job_lands_each_read_at_its_place() {
    let dir = disk_dir();
    let size = 4 << 20;
    let path = pattern_file(dir.path(), "p.bin", size);
    for kind in EngineKind::ALL {
        let mut engine = Engine::new(config(kind, 8, 1 << 20)).unwrap();
        let file = engine.open(&path).unwrap();
        let align = engine.file_info(file).unwrap().mem_align.max(512) as usize;
        let wanted = [
            (100u64, 5000u32),
            (3 << 20, 4096),
            (777_777, 1),
            (9, 0),
            (2 << 20, 65536),
        ];
        let mut specs = Vec::new();
        let mut pos = 0usize;
        for &(offset, len) in &wanted {
            let (_, span) = engine.placement(file, offset, len).unwrap();
            specs.push(ReadSpec {
                file,
                offset,
                len,
                buf_offset: pos,
            });
            pos = (pos + span).next_multiple_of(align);
        }
        let slot = engine.arena().take().unwrap();
        engine.submit(slot, &specs, 42).unwrap();
        engine.wait(1).unwrap();
        let c = engine.pop().unwrap();
        assert_eq!(c.user_data, 42);
        assert_eq!(c.outcomes().len(), wanted.len());
        for (o, &(offset, len)) in c.outcomes().iter().zip(&wanted) {
            let r = o.as_ref().unwrap().clone();
            assert_eq!(r.len(), len as usize);
            assert_pattern(
                &engine.arena().bytes(&c.slot)[r],
                offset,
                &format!("{kind} job read {offset}"),
            );
        }
        engine.arena().put(c.slot);
    }
}

#[test]
fn invalid_jobs_are_rejected_with_the_slot_back() {
    let dir = disk_dir();
    let path = pattern_file(dir.path(), "p.bin", 1 << 20);
    let mut engine = Engine::new(config(EngineKind::Uring, 4, 16 << 10)).unwrap();
    let file = engine.open(&path).unwrap();
    let slot = engine.arena().take().unwrap();
    // Larger than the slot.
    let too_big = ReadSpec {
        file,
        offset: 0,
        len: 1 << 20,
        buf_offset: 0,
    };
    let r = engine.submit_one(slot, too_big, 0).unwrap_err();
    assert_eq!(r.error.kind(), ErrorKind::InvalidInput);
    assert!(r.error.to_string().contains("slots hold"), "{}", r.error);
    assert!(r.error.path().is_some());
    // Misaligned destination for an O_DIRECT file.
    let bad = ReadSpec {
        file,
        offset: 0,
        len: 512,
        buf_offset: 3,
    };
    let r = engine.submit_one(r.slot, bad, 0).unwrap_err();
    assert!(
        r.error.to_string().contains("memory alignment"),
        "{}",
        r.error
    );
    // A file id that is not open.
    let bad = ReadSpec {
        file: gpufeed::FileId(200),
        offset: 0,
        len: 1,
        buf_offset: 0,
    };
    let r = engine.submit_one(r.slot, bad, 0).unwrap_err();
    assert!(r.error.to_string().contains("not open"), "{}", r.error);
    engine.arena().put(r.slot);
    assert_eq!(engine.arena().free_slots(), 4);
}

#[test]
fn missing_file_is_a_clear_error() {
    let dir = disk_dir();
    let missing = dir.path().join("no-such-shard.bin");
    for kind in EngineKind::ALL {
        let mut engine = Engine::new(config(kind, 4, 4096)).unwrap();
        let e = engine.open(&missing).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.path(), Some(missing.as_path()));
        assert!(e.to_string().contains("no-such-shard.bin"), "{e}");
    }
}

/// Runs in a child process as `nobody` (root ignores file permissions).
#[test]
#[ignore = "run by permission_denied_is_a_clear_error in a child process"]
fn permission_denied_child() {
    let path = std::env::var("GPUFEED_IT_DENIED").expect("run by the parent test");
    let mut engine = Engine::new(config(EngineKind::Uring, 4, 4096)).unwrap();
    let e = engine.open(&path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains(&path), "{e}");
}

#[test]
fn permission_denied_is_a_clear_error() {
    let dir = disk_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = pattern_file(dir.path(), "secret.bin", 4096);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    if !is_root() {
        let mut engine = Engine::new(config(EngineKind::Uring, 4, 4096)).unwrap();
        let e = engine.open(&path).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        return;
    }
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "engine::permission_denied_child",
            "--nocapture",
        ])
        .env("GPUFEED_IT_DENIED", &path)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && text.contains("Permission denied") && !text.contains("test result")
    {
        // The test binary itself is not executable by `nobody` (a private build directory).
        eprintln!("skipped: nobody cannot run the test binary here: {text}");
        return;
    }
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "child ran no test:\n{text}");
}

#[test]
fn file_shrunk_after_open_is_an_error_and_the_rest_is_delivered() {
    for kind in EngineKind::ALL {
        let dir = disk_dir();
        let size = 4u64 << 20;
        let path = pattern_file(dir.path(), "shrinks.bin", size);
        let mut engine = Engine::new(config(kind, 16, 64 << 10)).unwrap();
        let file = engine.open(&path).unwrap();
        let cut = (1 << 20) + 100;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let reqs: Vec<(u64, u32)> = (0..64).map(|i| (i * 65536 + 13, 60000)).collect();
        let got = read_all(&mut engine, file, &reqs);
        for (&(off, len), r) in reqs.iter().zip(&got) {
            if off + len as u64 <= cut {
                assert_pattern(r.as_ref().unwrap(), off, "before the cut");
            } else {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{kind} {off}: {e}");
                assert_eq!(e.path(), Some(path.as_path()));
                assert_eq!(e.offset(), Some(off));
                assert!(e.to_string().contains("shrink"), "{e}");
            }
        }
    }
}

fn check_file_system(dir: &std::path::Path, what: &str) {
    let size = (1 << 20) + 3;
    let path = pattern_file(dir, "fs.bin", size);
    let mut engine = Engine::new(config(EngineKind::Uring, 8, 64 << 10)).unwrap();
    let file = engine.open(&path).unwrap();
    let direct = engine.file_info(file).unwrap().direct;
    if !direct {
        assert!(
            engine
                .notices()
                .iter()
                .any(|n| n.contains("refuses O_DIRECT")),
            "{what}: {:?}",
            engine.notices()
        );
    }
    let reqs = awkward_requests(size, 5, 100, 64 << 10);
    for (&(off, len), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        let b = r.unwrap();
        assert_eq!(
            b.len() as u64,
            (off + len as u64).min(size).saturating_sub(off)
        );
        assert_pattern(&b, off, what);
    }
}

/// tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since; both must read correctly.
#[test]
fn tmpfs_reads_correctly_direct_or_not() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm tmpfs on this machine");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gpufeed-it-")
        .tempdir_in(shm)
        .unwrap();
    check_file_system(dir.path(), "tmpfs");
}

/// ramfs has no direct I/O at all: the engine must fall back to buffered reads and say so.
#[test]
fn ramfs_refuses_direct_io_and_buffered_reads_serve() {
    let dir = disk_dir();
    let c = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: plain mount(2) of a new ramfs on our own empty temp directory.
    let rc = unsafe {
        libc::mount(
            c"none".as_ptr(),
            c.as_ptr(),
            c"ramfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        eprintln!(
            "skipped: cannot mount a ramfs here ({}); the O_DIRECT fallback is untested",
            std::io::Error::last_os_error()
        );
        return;
    }
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: unmounting the ramfs we mounted above.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _guard = Unmount(c);
    let probe = std::fs::File::create(dir.path().join("probe")).unwrap();
    drop(probe);
    let refused = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dir.path().join("probe"))
        .is_err();
    assert!(refused, "ramfs accepted O_DIRECT");
    check_file_system(dir.path(), "ramfs");
}

#[test]
fn dropping_engines_mid_flight_thousands_of_times() {
    let dir = disk_dir();
    let size = 8u64 << 20;
    let path = pattern_file(dir.path(), "p.bin", size);
    let mut rng = Rng::new(11);
    let rounds = [
        (EngineKind::Uring, 2000),
        (EngineKind::UringBuffered, 300),
        (EngineKind::PreadPool, 300),
    ];
    for (kind, n) in rounds {
        for i in 0..n {
            let mut cfg = config(kind, 16, 64 << 10);
            cfg.threads = 4;
            cfg.huge_pages = false;
            let mut engine = Engine::new(cfg).unwrap();
            let file = engine.open(&path).unwrap();
            let k = 1 + rng.below(16) as usize;
            for j in 0..k {
                let slot = engine.arena().take().unwrap();
                let off = rng.below(size - 65536);
                engine
                    .submit_one(
                        slot,
                        ReadSpec {
                            file,
                            offset: off,
                            len: 65536,
                            buf_offset: 0,
                        },
                        j as u64,
                    )
                    .unwrap();
            }
            if i % 2 == 0 {
                engine.flush().unwrap();
            }
            if i % 5 == 0 {
                // Take some completions, keep their slots past the engine's drop.
                engine.wait(1).unwrap();
                let kept: Vec<_> = std::iter::from_fn(|| engine.pop()).collect();
                let arena = engine.arena().clone();
                drop(engine);
                for c in kept {
                    arena.put(c.slot);
                }
                assert_eq!(arena.free_slots(), 16);
            } else {
                let arena = engine.arena().clone();
                drop(engine);
                assert_eq!(arena.free_slots(), 16, "{kind}: a slot was lost on drop");
            }
        }
    }
    // Later reads are uncorrupted.
    let mut engine = Engine::new(config(EngineKind::Uring, 16, 64 << 10)).unwrap();
    let file = engine.open(&path).unwrap();
    let reqs: Vec<(u64, u32)> = (0..200).map(|_| (rng.below(size - 65536), 65536)).collect();
    for (&(off, _), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        assert_pattern(&r.unwrap(), off, "after drops");
    }
}

#[test]
fn engine_can_move_to_another_thread_before_first_submit() {
    let dir = disk_dir();
    let path = pattern_file(dir.path(), "p.bin", 1 << 20);
    let mut engine = Engine::new(config(EngineKind::Uring, 4, 8192)).unwrap();
    let file = engine.open(&path).unwrap();
    let got = std::thread::spawn(move || {
        let r = read_all(&mut engine, file, &[(4096, 100)]);
        r.into_iter().next().unwrap().unwrap()
    })
    .join()
    .unwrap();
    assert_pattern(&got, 4096, "moved engine");
}
