//! Fallbacks that need a changed process: a low locked-memory limit (buffer registration
//! refused) and io_uring blocked by seccomp (pread pool instead). Each runs the ignored child
//! test of the same name in a child process set up accordingly.

use std::os::unix::process::CommandExt;
use std::process::Command;

use gpufeed::{Engine, EngineKind};

use crate::common::*;

fn run_child(
    test: &str,
    setup: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
    env: (&str, &str),
    as_nobody: bool,
) -> Option<String> {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
    ])
    .env(env.0, env.1);
    if as_nobody {
        cmd.uid(65534).gid(65534);
    }
    // SAFETY: the closure only makes async-signal-safe syscalls (setrlimit, prctl).
    unsafe { cmd.pre_exec(setup) };
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !text.contains("test result") {
        eprintln!("skipped: the child could not run here: {text}");
        return None;
    }
    assert!(out.status.success(), "child {test} failed:\n{text}");
    assert!(text.contains("1 passed"), "child ran no test:\n{text}");
    Some(text)
}

fn shared_pattern_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = disk_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
#[ignore = "run by registration_refused_falls_back_and_says_why"]
fn registration_refused_child() {
    let path = std::env::var("GPUFEED_IT_FILE").unwrap();
    // 64 MiB of arena against an 8 MiB locked-memory limit.
    let mut engine = Engine::new(config(EngineKind::Uring, 64, 1 << 20)).unwrap();
    assert!(!engine.buffers_registered(), "{}", engine.describe());
    let note = engine.notices().join("\n");
    assert!(note.contains("RLIMIT_MEMLOCK soft 8192 KiB"), "{note}");
    assert!(note.contains("ulimit -l"), "{note}");
    let file = engine.open(&path).unwrap();
    let reqs: Vec<(u64, u32)> = (0..100).map(|i| (i * 10_007, 70_000)).collect();
    for (&(off, _), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        assert_pattern(&r.unwrap(), off, "unregistered fallback");
    }
}

#[test]
fn registration_refused_falls_back_and_says_why() {
    let dir = shared_pattern_dir();
    let path = pattern_file(dir.path(), "p.bin", 4 << 20);
    // Root may lock any amount; run the child as `nobody` with the common default of 8 MiB.
    let as_nobody = is_root();
    run_child(
        "fallback::registration_refused_child",
        || {
            let lim = libc::rlimit {
                rlim_cur: 8 << 20,
                rlim_max: 8 << 20,
            };
            // SAFETY: plain setrlimit on this (child) process.
            if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        },
        ("GPUFEED_IT_FILE", path.to_str().unwrap()),
        as_nobody,
    );
}

#[test]
#[ignore = "run by io_uring_blocked_falls_back_to_the_pool"]
fn io_uring_blocked_child() {
    let path = std::env::var("GPUFEED_IT_FILE").unwrap();
    let mut engine = Engine::new(config(EngineKind::Uring, 8, 64 << 10)).unwrap();
    assert_eq!(engine.kind(), EngineKind::PreadPool);
    let note = engine.notices().join("\n");
    assert!(note.contains("io_uring is unavailable"), "{note}");
    let file = engine.open(&path).unwrap();
    let reqs: Vec<(u64, u32)> = (0..100).map(|i| (i * 10_007 + 3, 5_000)).collect();
    for (&(off, _), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        assert_pattern(&r.unwrap(), off, "pool fallback");
    }
}

/// A seccomp filter that makes io_uring_setup fail with ENOSYS, as a container profile does.
#[cfg(target_arch = "x86_64")]
fn block_io_uring() -> std::io::Result<()> {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    let prog = [
        SockFilter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 4,
        }, // ld arch
        SockFilter {
            code: 0x15,
            jt: 0,
            jf: 3,
            k: AUDIT_ARCH_X86_64,
        }, // not x86-64: allow
        SockFilter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        }, // ld nr
        SockFilter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: libc::SYS_io_uring_setup as u32,
        },
        SockFilter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x0005_0000 | libc::ENOSYS as u32,
        },
        SockFilter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        }, // allow
    ];
    let fprog = SockFprog {
        len: prog.len() as u16,
        filter: prog.as_ptr(),
    };
    // SAFETY: prctl with a valid filter program that outlives the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                2, /* SECCOMP_MODE_FILTER */
                &fprog as *const SockFprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[test]
fn io_uring_blocked_falls_back_to_the_pool() {
    let dir = shared_pattern_dir();
    let path = pattern_file(dir.path(), "p.bin", 2 << 20);
    run_child(
        "fallback::io_uring_blocked_child",
        block_io_uring,
        ("GPUFEED_IT_FILE", path.to_str().unwrap()),
        false,
    );
}

/// An arena over 1 GiB is registered in pieces (one iovec over 1 GiB fails with EFAULT) and
/// reads into the second piece use it correctly.
#[test]
fn arena_over_1gib_registers_in_pieces() {
    let dir = disk_dir();
    let size = 8u64 << 20;
    let path = pattern_file(dir.path(), "p.bin", size);
    let mut cfg = config(EngineKind::Uring, 6, 0);
    cfg.slot_bytes = 256 << 20;
    cfg.slots = 6; // 1.5 GiB: pieces of 1 GiB (4 slots) and 512 MiB (2 slots)
    let mut engine = Engine::new(cfg).unwrap();
    if is_root() {
        assert!(engine.buffers_registered(), "{}", engine.describe());
        assert!(
            engine.describe().contains("2 piece(s)"),
            "{}",
            engine.describe()
        );
    }
    let file = engine.open(&path).unwrap();
    // All six slots in flight at once, so slots of both pieces are used.
    let reqs: Vec<(u64, u32)> = (0..6).map(|i| (i * 1_000_000 + 1, 1_000_000)).collect();
    for (&(off, _), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        assert_pattern(&r.unwrap(), off, "piece");
    }
}

#[test]
fn sqpoll_delivers_every_byte() {
    let dir = disk_dir();
    let size = (2 << 20) + 11;
    let path = pattern_file(dir.path(), "p.bin", size);
    let mut cfg = config(EngineKind::Uring, 8, 64 << 10);
    cfg.sqpoll = true;
    let mut engine = Engine::new(cfg).unwrap();
    assert!(
        engine.describe().contains("SQPOLL"),
        "{}",
        engine.describe()
    );
    let file = engine.open(&path).unwrap();
    let reqs: Vec<(u64, u32)> = (0..300).map(|i| (i * 6_991 % size, 60_000)).collect();
    for (&(off, len), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        let b = r.unwrap();
        assert_eq!(b.len() as u64, (off + len as u64).min(size) - off);
        assert_pattern(&b, off, "sqpoll");
    }
}
