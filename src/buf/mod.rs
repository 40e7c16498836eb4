//! ③ Memory that both the kernel and (later) the GPU touch: one aligned arena carved into slots.
//!
//! The arena is a single anonymous mapping, 2 MiB-aligned and advised for transparent huge pages
//! *before* its first touch, so that a read of up to 2 MiB is one physically contiguous segment
//! for the device (on the virtio disk this doubles 128 KiB throughput against 4 KiB pages). The
//! mapping never moves: io_uring registers it as fixed buffers (in pieces of at most 1 GiB) and a
//! later stage pins the very same range with CUDA.
//!
//! # Ownership
//! The arena is carved into `slots` equal slots. Each slot is represented by one [`Slot`] token,
//! created once when the arena is made; the token is neither `Clone` nor `Copy`, so at every
//! instant exactly one party owns the slot: the free list, an engine (while a read targets it), or
//! a consumer. The bytes of a slot can only be reached through its token
//! ([`Arena::bytes`], [`Arena::bytes_mut`]), so nobody can look at memory the kernel may still be
//! writing. Forgetting a token leaks the slot; it never makes memory reachable twice.
//!
//! This module must never hand out a pointer into a slot it does not hold the token for.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::{invalid, Error, Result};
use crate::sys::Mapping;
use crate::util::Unpoison;

/// Alignment and huge-page size of the arena.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Largest single iovec io_uring accepts when registering buffers (one over 1 GiB fails with
/// EFAULT), so the arena is registered in pieces of at most this size.
pub const REGISTER_PIECE_MAX_BYTES: usize = 1 << 30;

static NEXT_ARENA_ID: AtomicU32 = AtomicU32::new(1);

/// One slot of an [`Arena`]: the right to its bytes. Exactly one exists per slot.
#[derive(Debug, PartialEq, Eq)]
pub struct Slot {
    arena: u32,
    index: u32,
}

impl Slot {
    /// The slot's index in its arena (0-based).
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// An aligned, huge-page-backed region carved into equal slots.
pub struct Arena {
    id: u32,
    map: Mapping,
    slot_bytes: usize,
    slots: u32,
    piece_bytes: usize,
    free: Mutex<Vec<Slot>>,
    returned: Condvar,
}

/// Options for [`Arena::new`].
#[derive(Debug, Clone)]
pub struct ArenaConfig {
    /// Size of one slot; a multiple of 4096.
    pub slot_bytes: usize,
    /// Number of slots.
    pub slots: u32,
    /// Back the arena with transparent huge pages (advised before first touch).
    pub huge_pages: bool,
}

impl Arena {
    /// Maps and touches the arena. All slots start in the free list.
    pub fn new(cfg: &ArenaConfig) -> Result<Arc<Arena>> {
        if cfg.slot_bytes == 0 || !cfg.slot_bytes.is_multiple_of(4096) {
            return Err(invalid(format!(
                "slot_bytes must be a positive multiple of 4096, got {}",
                cfg.slot_bytes
            )));
        }
        if cfg.slots == 0 {
            return Err(invalid("an arena needs at least one slot"));
        }
        let total = cfg
            .slot_bytes
            .checked_mul(cfg.slots as usize)
            .filter(|&t| t <= 1 << 40)
            .ok_or_else(|| invalid("arena larger than 1 TiB"))?;
        let map = Mapping::new(total, HUGE_PAGE_BYTES, cfg.huge_pages)
            .map_err(|e| Error::io(format!("cannot map a {total}-byte arena"), e))?;
        // Registration pieces hold whole slots so that no read crosses two registered buffers.
        let piece_bytes = if cfg.slot_bytes >= REGISTER_PIECE_MAX_BYTES {
            cfg.slot_bytes
        } else {
            (REGISTER_PIECE_MAX_BYTES / cfg.slot_bytes) * cfg.slot_bytes
        };
        if piece_bytes > REGISTER_PIECE_MAX_BYTES {
            return Err(invalid(format!(
                "slot_bytes {} exceeds the 1 GiB io_uring registration limit",
                cfg.slot_bytes
            )));
        }
        let id = NEXT_ARENA_ID.fetch_add(1, Ordering::Relaxed);
        let free = (0..cfg.slots)
            .rev()
            .map(|index| Slot { arena: id, index })
            .collect();
        Ok(Arc::new(Arena {
            id,
            map,
            slot_bytes: cfg.slot_bytes,
            slots: cfg.slots,
            piece_bytes,
            free: Mutex::new(free),
            returned: Condvar::new(),
        }))
    }

    /// Takes a free slot, if any.
    pub fn take(&self) -> Option<Slot> {
        self.free.lock().unpoisoned().pop()
    }

    /// Takes a free slot, waiting up to `timeout` for one to be returned.
    pub fn take_timeout(&self, timeout: Duration) -> Option<Slot> {
        self.wait_for_free(timeout).pop()
    }

    /// Waits up to `timeout` for a free slot, without taking it; whether one is free.
    pub fn wait_free(&self, timeout: Duration) -> bool {
        !self.wait_for_free(timeout).is_empty()
    }

    fn wait_for_free(&self, timeout: Duration) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        let g = self.free.lock().unpoisoned();
        self.returned
            .wait_timeout_while(g, timeout, |free| free.is_empty())
            .unpoisoned()
            .0
    }

    /// Returns a slot to the free list.
    ///
    /// # Panics
    /// If the slot belongs to another arena (a programming error).
    pub fn put(&self, slot: Slot) {
        assert_eq!(slot.arena, self.id, "slot returned to the wrong arena");
        self.free.lock().unpoisoned().push(slot);
        // Wake whoever waits in `take_timeout` or `wait_free` (without this it slept its whole
        // timeout).
        self.returned.notify_all();
    }

    /// Number of slots in the free list now.
    pub fn free_slots(&self) -> usize {
        self.free.lock().unpoisoned().len()
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Total bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: an arena has at least one slot.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Start of the mapping (stable for the arena's life; for registration with io_uring/CUDA).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Whether `slot` is one of this arena's.
    pub fn owns(&self, slot: &Slot) -> bool {
        slot.arena == self.id
    }

    /// Whether huge pages were advised for the mapping.
    pub fn huge_pages_advised(&self) -> bool {
        self.map.huge_pages_advised
    }

    /// Bytes of the arena actually backed by huge pages (from /proc/self/smaps).
    pub fn huge_page_bytes(&self) -> Option<u64> {
        self.map.huge_page_bytes()
    }

    /// The slot's bytes. Holding `&Slot` proves no read is in flight into it.
    ///
    /// # Panics
    /// If the slot belongs to another arena.
    pub fn bytes<'a>(&'a self, slot: &'a Slot) -> &'a [u8] {
        let p = self.slot_ptr(slot);
        // SAFETY: `p..p+slot_bytes` lies in our mapping (slot_ptr checks the index); the token is
        // unique and borrowed shared here, so nobody holds `&mut` access to it and no engine can
        // have it in flight (engines take the token by value).
        unsafe { std::slice::from_raw_parts(p, self.slot_bytes) }
    }

    /// The slot's bytes, writable.
    ///
    /// # Panics
    /// If the slot belongs to another arena.
    pub fn bytes_mut<'a>(&'a self, slot: &'a mut Slot) -> &'a mut [u8] {
        let p = self.slot_ptr(slot);
        // SAFETY: as in `bytes`, and the token is borrowed exclusively, so this is the only
        // reference to the slot's memory.
        unsafe { std::slice::from_raw_parts_mut(p, self.slot_bytes) }
    }

    /// Raw pointer to the start of `slot`.
    ///
    /// # Panics
    /// If the slot belongs to another arena.
    pub(crate) fn slot_ptr(&self, slot: &Slot) -> *mut u8 {
        assert_eq!(slot.arena, self.id, "slot used with the wrong arena");
        debug_assert!(slot.index < self.slots);
        // index < slots, so the offset stays inside the mapping of slots × slot_bytes (plain
        // arithmetic; dereferencing is argued where it happens).
        self.map
            .as_ptr()
            .wrapping_add(slot.index as usize * self.slot_bytes)
    }

    /// The arena cut into registration pieces of at most 1 GiB, each made of whole slots.
    pub fn register_pieces(&self) -> Vec<(*mut u8, usize)> {
        let total = self.slot_bytes * self.slots as usize;
        let mut out = Vec::new();
        let mut off = 0;
        while off < total {
            let len = self.piece_bytes.min(total - off);
            // off < total ≤ the mapping's length.
            out.push((self.map.as_ptr().wrapping_add(off), len));
            off += len;
        }
        out
    }

    /// Which registration piece holds byte `offset` of the arena.
    pub(crate) fn piece_index(&self, offset: usize) -> u16 {
        (offset / self.piece_bytes) as u16
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("slot_bytes", &self.slot_bytes)
            .field("slots", &self.slots)
            .field("free", &self.free_slots())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter in `take_timeout` gets a slot when one is put back, not when its timeout
    /// ends: with a 30 s timeout and a put after 50 ms, it returns long before the timeout
    /// (a liveness check with a 10× margin, not a timing figure).
    #[test]
    fn a_returned_slot_wakes_the_waiter() {
        let a = Arena::new(&ArenaConfig {
            slot_bytes: 64 << 10,
            slots: 1,
            huge_pages: false,
        })
        .unwrap();
        let held = a.take().unwrap();
        let waiter = {
            let a = a.clone();
            std::thread::spawn(move || {
                let t0 = std::time::Instant::now();
                let got = a.take_timeout(Duration::from_secs(30));
                (got.is_some(), t0.elapsed(), got.map(|s| a.put(s)))
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        a.put(held);
        let (got, waited, _) = waiter.join().unwrap();
        assert!(got, "the waiter got no slot");
        assert!(
            waited < Duration::from_secs(3),
            "woke after {waited:?}, not on the put"
        );
    }

    #[test]
    fn slots_are_aligned_disjoint_and_return() {
        let a = Arena::new(&ArenaConfig {
            slot_bytes: 64 << 10,
            slots: 40,
            huge_pages: true,
        })
        .unwrap();
        assert_eq!(a.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        let mut taken: Vec<Slot> = std::iter::from_fn(|| a.take()).collect();
        assert_eq!(taken.len(), 40);
        assert_eq!(a.free_slots(), 0);
        for (i, s) in taken.iter_mut().enumerate() {
            a.bytes_mut(s).fill(i as u8);
        }
        for (i, s) in taken.iter().enumerate() {
            assert!(a.bytes(s).iter().all(|&b| b == i as u8));
        }
        for s in taken {
            a.put(s);
        }
        assert_eq!(a.free_slots(), 40);
    }

    #[test]
    fn pieces_cover_whole_slots_under_1gib() {
        let a = Arena::new(&ArenaConfig {
            slot_bytes: 3 << 20,
            slots: 4,
            huge_pages: false,
        })
        .unwrap();
        let p = a.register_pieces();
        assert_eq!(p.iter().map(|x| x.1).sum::<usize>(), 12 << 20);
        assert!(p
            .iter()
            .all(|x| x.1 <= REGISTER_PIECE_MAX_BYTES && x.1 % (3 << 20) == 0));
    }

    #[test]
    fn bad_sizes_are_errors() {
        let e = Arena::new(&ArenaConfig {
            slot_bytes: 1000,
            slots: 1,
            huge_pages: false,
        })
        .unwrap_err();
        assert!(e.to_string().contains("slot_bytes"), "{e}");
        assert!(Arena::new(&ArenaConfig {
            slot_bytes: 4096,
            slots: 0,
            huge_pages: false
        })
        .is_err());
    }

    #[test]
    #[should_panic(expected = "wrong arena")]
    fn foreign_slot_is_refused() {
        let cfg = ArenaConfig {
            slot_bytes: 4096,
            slots: 1,
            huge_pages: false,
        };
        let a = Arena::new(&cfg).unwrap();
        let b = Arena::new(&cfg).unwrap();
        let s = a.take().unwrap();
        b.put(s);
    }
}
