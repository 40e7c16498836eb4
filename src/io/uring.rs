//! The io_uring backend: the sole owner of its ring.
//!
//! Setup probes what the kernel has and uses the best of it: `COOP_TASKRUN` (completions are
//! processed at our next syscall, not by interrupting us), `SINGLE_ISSUER`, `SUBMIT_ALL`;
//! `DEFER_TASKRUN` and SQPOLL only on request (`EngineConfig::defer_taskrun`, `sqpoll`): see
//! DESIGN.md for the measurements behind those defaults. The arena is registered as fixed
//! buffers in pieces of at most 1 GiB and reads use `ReadFixed`; files are registered in a sparse
//! fixed-file table. Either registration may be refused (a low `RLIMIT_MEMLOCK`, an old
//! kernel); then plain `Read` on plain fds serves, and a notice says so with the numbers.
//!
//! The ring is created disabled and enabled by the first `submit`, so `SINGLE_ISSUER` binds it
//! to the thread that drives the engine rather than the one that built it.

use std::io;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::Arc;

use io_uring::{opcode, register::Probe, squeue, types, IoUring};

use super::{Backend, RawDone, RawRead};
use crate::buf::Arena;
use crate::config::EngineConfig;

const CANCEL_ID: u64 = u64::MAX;

/// Whether a ring-setup error means "io_uring is not available here" (so a fallback applies).
pub fn unavailable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS) | Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EOPNOTSUPP)
    )
}

/// Reads through io_uring (fixed files, fixed buffers where registered, O_DIRECT).
pub struct UringBackend {
    ring: IoUring<squeue::Entry, io_uring::cqueue::Entry>,
    /// Keeps the arena (the registered memory) alive at least as long as the ring.
    arena: Arc<Arena>,
    capacity: usize,
    registered: bool,
    fixed_files: bool,
    enabled: bool,
    sqpoll: bool,
    syscalls: u64,
    flags: &'static str,
    buffer_note: String,
}

impl UringBackend {
    /// Builds the ring and registers the arena. Returns notices for the user.
    pub fn new(cfg: &EngineConfig, arena: &Arc<Arena>) -> io::Result<(UringBackend, Vec<String>)> {
        let mut notices = Vec::new();
        // Room for every read plus a cancel op; the CQ is twice the SQ by default.
        let entries = (cfg.queue_depth + 1).next_power_of_two().max(8);
        type Setup = (&'static str, fn(&mut io_uring::Builder));
        let attempts: &[Setup] = if cfg.sqpoll {
            &[
                ("SQPOLL|SINGLE_ISSUER|R_DISABLED", |b| {
                    b.setup_sqpoll(1000)
                        .setup_single_issuer()
                        .setup_r_disabled();
                }),
                ("SQPOLL", |b| {
                    b.setup_sqpoll(1000);
                }),
            ]
        } else {
            &[
                (
                    "COOP_TASKRUN|SINGLE_ISSUER|DEFER_TASKRUN|SUBMIT_ALL|R_DISABLED",
                    |b| {
                        b.setup_coop_taskrun()
                            .setup_single_issuer()
                            .setup_defer_taskrun()
                            .setup_submit_all()
                            .setup_r_disabled();
                    },
                ),
                ("COOP_TASKRUN|SINGLE_ISSUER|SUBMIT_ALL|R_DISABLED", |b| {
                    b.setup_coop_taskrun()
                        .setup_single_issuer()
                        .setup_submit_all()
                        .setup_r_disabled();
                }),
                ("COOP_TASKRUN|SUBMIT_ALL", |b| {
                    b.setup_coop_taskrun().setup_submit_all();
                }),
                ("none", |_| {}),
            ]
        };
        let mut last_err = None;
        let mut built = None;
        // DEFER_TASKRUN only on request: with one submission per read (small reads) it cost 12%
        // IOPS on the virtio disk here, and it made no difference for batched large reads.
        let skip = usize::from(!cfg.sqpoll && !cfg.defer_taskrun);
        for (name, apply) in attempts.iter().skip(skip) {
            let mut b = IoUring::builder();
            apply(&mut b);
            match b.build(entries) {
                Ok(r) => {
                    built = Some((r, *name));
                    break;
                }
                Err(e) if unavailable(&e) => return Err(e),
                Err(e) => last_err = Some(e),
            }
        }
        let Some((ring, flags)) = built else {
            return Err(last_err.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)));
        };
        let enabled = !flags.contains("R_DISABLED");

        let mut probe = Probe::new();
        let probed = ring.submitter().register_probe(&mut probe).is_ok();
        if probed && !probe.is_supported(opcode::Read::CODE) {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let fixed_read = !probed || probe.is_supported(opcode::ReadFixed::CODE);

        let mut registered = false;
        let mut buffer_note = String::from("unregistered buffers");
        if cfg.register_buffers && fixed_read {
            let iovecs: Vec<libc::iovec> = arena
                .register_pieces()
                .into_iter()
                .map(|(p, len)| libc::iovec {
                    iov_base: p.cast(),
                    iov_len: len,
                })
                .collect();
            // SAFETY: every iovec covers memory of `arena`, a live mapping; the ring holds an
            // `Arc<Arena>` so the mapping outlives the registration, and buffers are unregistered
            // (Drop) only after the engine has drained every read.
            match unsafe { ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => {
                    registered = true;
                    buffer_note = format!(
                        "fixed buffers ({} piece(s), {} MiB)",
                        iovecs.len(),
                        arena.len() >> 20
                    );
                }
                Err(e) => {
                    let (soft, hard) = crate::sys::memlock_limit();
                    let lim = |v: u64| {
                        if v == u64::MAX {
                            "unlimited".to_string()
                        } else {
                            format!("{} KiB", v >> 10)
                        }
                    };
                    notices.push(format!(
                        "io_uring could not register the {} MiB arena as fixed buffers ({e}; \
                         RLIMIT_MEMLOCK soft {}, hard {}); reads use unregistered buffers, which \
                         costs CPU per read. Fix: raise the locked-memory limit to at least {} \
                         MiB (`ulimit -l unlimited`, LimitMEMLOCK=infinity for a systemd unit, or \
                         memlock in /etc/security/limits.conf)",
                        arena.len() >> 20,
                        lim(soft),
                        lim(hard),
                        arena.len().div_ceil(1 << 20)
                    ));
                }
            }
        }
        let fixed_files = ring
            .submitter()
            .register_files_sparse(cfg.files_max)
            .is_ok();
        Ok((
            UringBackend {
                ring,
                arena: arena.clone(),
                capacity: cfg.queue_depth as usize,
                registered,
                fixed_files,
                enabled,
                sqpoll: cfg.sqpoll,
                syscalls: 0,
                flags,
                buffer_note,
            },
            notices,
        ))
    }

    fn enable(&mut self) -> io::Result<()> {
        if !self.enabled {
            self.ring.submitter().register_enable_rings()?;
            self.enabled = true;
        }
        Ok(())
    }

    fn push_entry(&mut self, e: &squeue::Entry) -> bool {
        // SAFETY: the entry's buffer validity is the caller's contract (Backend::push); cancel
        // entries carry no buffer.
        unsafe { self.ring.submission().push(e).is_ok() }
    }
}

impl Backend for UringBackend {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn register_file(&mut self, index: u32, fd: RawFd, _path: Option<&Path>) -> io::Result<()> {
        if self.fixed_files {
            if let Err(e) = self.ring.submitter().register_files_update(index, &[fd]) {
                if fd >= 0 {
                    // Registration is an optimisation: fall back to plain fds for everything.
                    self.fixed_files = false;
                    let _ = e;
                }
            }
        }
        Ok(())
    }

    unsafe fn push(&mut self, op: RawRead) -> Result<(), RawRead> {
        let entry = if self.registered {
            let off = op.buf as usize - self.arena.as_ptr() as usize;
            let idx = self.arena.piece_index(off);
            if self.fixed_files {
                opcode::ReadFixed::new(types::Fixed(op.file), op.buf, op.len, idx)
                    .offset(op.offset)
                    .build()
            } else {
                opcode::ReadFixed::new(types::Fd(op.fd), op.buf, op.len, idx)
                    .offset(op.offset)
                    .build()
            }
        } else if self.fixed_files {
            opcode::Read::new(types::Fixed(op.file), op.buf, op.len)
                .offset(op.offset)
                .build()
        } else {
            opcode::Read::new(types::Fd(op.fd), op.buf, op.len)
                .offset(op.offset)
                .build()
        };
        if self.push_entry(&entry.user_data(op.id)) {
            Ok(())
        } else {
            Err(op)
        }
    }

    fn submit(&mut self, wait: usize) -> io::Result<()> {
        self.enable()?;
        if !(self.sqpoll && wait == 0 && !self.ring.submission().need_wakeup()) {
            self.syscalls += 1;
        }
        loop {
            match self.ring.submit_and_wait(wait) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    self.syscalls += 1;
                }
                // The CQ is full or the kernel is short of resources: reaping frees room.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<RawDone>) {
        for cqe in self.ring.completion() {
            let id = cqe.user_data();
            if id != CANCEL_ID {
                out.push(RawDone {
                    id,
                    res: cqe.result(),
                });
            }
        }
    }

    fn cancel_all(&mut self) {
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_ID);
        if !self.push_entry(&e) {
            let _ = self.submit(0);
            let _ = self.push_entry(&e);
        }
        let _ = self.submit(0);
    }

    fn syscalls(&self) -> u64 {
        self.syscalls
    }

    fn buffers_registered(&self) -> bool {
        self.registered
    }

    fn describe(&self) -> String {
        format!(
            "io_uring [{}], {}, {}",
            self.flags,
            self.buffer_note,
            if self.fixed_files {
                "fixed files"
            } else {
                "plain fds"
            }
        )
    }
}

impl Drop for UringBackend {
    fn drop(&mut self) {
        // The engine has drained every read before dropping us; unregister before the ring (and
        // then the arena Arc) goes.
        if self.registered && self.enabled {
            let _ = self.ring.submitter().unregister_buffers();
        }
    }
}

impl std::fmt::Debug for UringBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&Backend::describe(self))
    }
}
