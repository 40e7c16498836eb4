//! A seeded, simulated backend that drives the real engine logic without a real device queue.
//!
//! Reads are served by `pread` from the real file (so the bytes are real) but the simulator
//! decides *when* and *how*: random latency (completions out of order), short reads (the rest of
//! the buffer is scribbled over, so an engine that delivered unread bytes is caught), EIO,
//! EAGAIN and EINTR, cancellation races (a cancelled read may still complete), O_DIRECT alignment
//! checks (EINVAL, as the kernel), and a check that no two reads in flight share memory (a slot
//! lent twice). Everything follows from the seed, so a failing case replays exactly.

use std::io;

use super::{Backend, RawDone, RawRead};

/// What the simulator injects. Probabilities are per raw read.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Everything the simulator decides follows from this seed.
    pub seed: u64,
    /// Raw reads in flight at most.
    pub capacity: usize,
    /// A read completes after 0..=this many `submit` rounds.
    pub delay_rounds_max: u32,
    /// Probability that a read returns fewer bytes than asked (the rest is scribbled over).
    pub short_read: f64,
    /// Probability that a read fails with EIO.
    pub eio: f64,
    /// Probability that a read fails with EAGAIN (to be retried).
    pub eagain: f64,
    /// Probability that a read fails with EINTR (to be retried).
    pub eintr: f64,
    /// Probability that a read in flight when `cancel_all` is called completes with ECANCELED
    /// (otherwise it completes normally: the race).
    pub cancel_wins: f64,
    /// O_DIRECT alignment the simulator enforces on direct reads (offset, length, address).
    pub direct_align: u32,
}

impl SimConfig {
    /// A configuration with every fault enabled at a moderate rate.
    pub fn faulty(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            capacity: 16,
            delay_rounds_max: 4,
            short_read: 0.2,
            eio: 0.02,
            eagain: 0.1,
            eintr: 0.05,
            cancel_wins: 0.5,
            direct_align: 512,
        }
    }

    /// No faults, but latency and reordering.
    pub fn clean(seed: u64) -> SimConfig {
        SimConfig {
            short_read: 0.0,
            eio: 0.0,
            eagain: 0.0,
            eintr: 0.0,
            ..SimConfig::faulty(seed)
        }
    }
}

/// The generator moved to [`crate::rng`] (it defines every epoch order); kept here by name for
/// the simulator's users.
pub use crate::rng::Rng;

struct Flight {
    op: RawRead,
    due: u64,
    cancelled: bool,
}

/// The simulated backend: reads served by `pread` from the real file, faults and timing from
/// the [`SimConfig`].
pub struct SimBackend {
    cfg: SimConfig,
    rng: Rng,
    round: u64,
    in_flight: Vec<Flight>,
    done: Vec<RawDone>,
    syscalls: u64,
}

impl SimBackend {
    /// A simulator following `cfg`.
    pub fn new(cfg: SimConfig) -> SimBackend {
        SimBackend {
            rng: Rng::new(cfg.seed),
            cfg,
            round: 0,
            in_flight: Vec::new(),
            done: Vec::new(),
            syscalls: 0,
        }
    }

    fn serve(&mut self, f: Flight) {
        let op = f.op;
        let a = self.cfg.direct_align as u64;
        let res = if f.cancelled {
            -libc::ECANCELED
        } else if op.direct
            && (!op.offset.is_multiple_of(a)
                || !(op.len as u64).is_multiple_of(a)
                || !(op.buf as u64).is_multiple_of(a))
        {
            -libc::EINVAL
        } else if self.rng.chance(self.cfg.eio) {
            -libc::EIO
        } else if self.rng.chance(self.cfg.eagain) {
            -libc::EAGAIN
        } else if self.rng.chance(self.cfg.eintr) {
            -libc::EINTR
        } else {
            // A short read stops early but makes progress (the kernel returns 0 only at EOF),
            // and for O_DIRECT it stops on a block boundary.
            let mut len = op.len as usize;
            let unit = if op.direct { a as usize } else { 1 };
            if len > unit && self.rng.chance(self.cfg.short_read) {
                let units = len / unit;
                len = (1 + self.rng.below(units as u64 - 1) as usize) * unit;
            }
            // SAFETY: Backend::push's contract: op.buf is valid and ours for op.len bytes.
            match unsafe { crate::sys::pread_raw(op.fd, op.buf, len, op.offset) } {
                Ok(n) => {
                    // Scribble over what was not read, as a device might leave garbage.
                    // SAFETY: n ≤ len ≤ op.len, inside the buffer we own for this op.
                    unsafe { std::ptr::write_bytes(op.buf.add(n), 0xEE, op.len as usize - n) };
                    n as i32
                }
                Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
            }
        };
        self.done.push(RawDone { id: op.id, res });
    }

    fn advance(&mut self) {
        self.round += 1;
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].due <= self.round {
                // swap_remove reorders: completions come out of submission order.
                let f = self.in_flight.swap_remove(i);
                self.serve(f);
            } else {
                i += 1;
            }
        }
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn capacity(&self) -> usize {
        self.cfg.capacity
    }

    unsafe fn push(&mut self, op: RawRead) -> Result<(), RawRead> {
        if self.in_flight.len() >= self.cfg.capacity {
            return Err(op);
        }
        let (s, e) = (op.buf as usize, op.buf as usize + op.len as usize);
        for f in &self.in_flight {
            let (fs, fe) = (f.op.buf as usize, f.op.buf as usize + f.op.len as usize);
            assert!(
                e <= fs || fe <= s,
                "simulator: two reads in flight share memory ({s:#x}..{e:#x} and {fs:#x}..{fe:#x})"
            );
        }
        let due = self.round + 1 + self.rng.below(self.cfg.delay_rounds_max as u64 + 1);
        self.in_flight.push(Flight {
            op,
            due,
            cancelled: false,
        });
        Ok(())
    }

    fn submit(&mut self, wait: usize) -> io::Result<()> {
        self.syscalls += 1;
        let wait = wait.min(self.in_flight.len() + self.done.len());
        loop {
            self.advance();
            if self.done.len() >= wait {
                return Ok(());
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<RawDone>) {
        out.append(&mut self.done);
    }

    fn cancel_all(&mut self) {
        for i in 0..self.in_flight.len() {
            if self.rng.chance(self.cfg.cancel_wins) {
                self.in_flight[i].cancelled = true;
            }
        }
    }

    fn syscalls(&self) -> u64 {
        self.syscalls
    }
}

impl Drop for SimBackend {
    fn drop(&mut self) {
        // The engine drains before dropping its backend; a read left here would be a bug there.
        if !std::thread::panicking() {
            assert!(
                self.in_flight.is_empty(),
                "simulator dropped with {} reads in flight",
                self.in_flight.len()
            );
        }
    }
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&Backend::describe(self))
    }
}
