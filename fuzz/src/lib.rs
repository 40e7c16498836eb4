//! What every gpufeed fuzz target shares: an allocator that measures, files on tmpfs, and the
//! checks that whatever parsed is consistent with the file it came from.
//!
//! A target does more than wait for a panic. After a dataset opens, every sample must lie inside
//! its file, every error must name its file, reading a sample must either succeed with a
//! payload inside the bytes read or fail with an error naming the file and the sample, and no
//! step may allocate beyond a bound derived from the input's size ([`Budget`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use gpufeed::dataset::Dataset;

/// Counts live heap bytes and their peak, so a target can bound what a parse allocates.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// GlobalAlloc's contract; the counters are plain atomics and never affect the pointers.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed through to System as is.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator (so from System) with layout `l`.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` came from this allocator with layout `l`; `new` is the caller's.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                let now = LIVE.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

/// Heap growth allowed for one parse: `per_byte` × the bytes of input plus a fixed allowance
/// (buffers of a fixed size, error messages, the dataset's own small vectors).
pub struct Budget {
    start: usize,
    limit: usize,
    what: &'static str,
}

impl Budget {
    /// Starts measuring. Single-threaded targets only count their own work (gpufeed indexes one
    /// file without starting a thread).
    pub fn start(what: &'static str, input_bytes: usize, per_byte: usize, fixed: usize) -> Budget {
        let start = LIVE.load(Ordering::Relaxed);
        PEAK.store(start, Ordering::Relaxed);
        Budget {
            start,
            limit: input_bytes.saturating_mul(per_byte).saturating_add(fixed),
            what,
        }
    }

    /// How far the heap's peak rose since `start`.
    pub fn grew(&self) -> usize {
        PEAK.load(Ordering::Relaxed).saturating_sub(self.start)
    }

    /// Fails the run if the peak since `start` went past the bound.
    pub fn check(&self) {
        let grew = self.grew();
        assert!(
            grew <= self.limit,
            "{}: the heap grew by {grew} bytes, past the bound of {} for this input",
            self.what,
            self.limit
        );
    }
}

/// A directory of this process's own on tmpfs (or the temp dir), made once.
pub fn scratch() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("gpufeed-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch directory");
        d
    })
}

/// Writes `bytes` to `name` in the scratch directory (replacing it) and returns its path.
pub fn file(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, bytes).expect("write scratch file");
    p
}

/// Removes `name` from the scratch directory if it is there.
pub fn remove(name: &str) {
    let _ = std::fs::remove_file(scratch().join(name));
}

/// An error from opening or reading must say which file it is about.
pub fn names_a_file(e: &gpufeed::Error, what: &str) {
    assert!(e.path().is_some(), "{what}: error names no file: {e}");
}

/// Checks a dataset that opened: every sample inside its file, every problem naming a file,
/// and the first `read_max` samples read back — each either a payload inside the bytes read or
/// an error naming the file and the sample.
pub fn check_dataset(ds: &Dataset, read_max: usize) {
    for (i, s) in ds.samples().iter().enumerate() {
        assert!(
            (s.file as usize) < ds.file_count(),
            "sample {i} names file {} of {}",
            s.file,
            ds.file_count()
        );
        let f = ds.file(s.file);
        let end = s.offset.checked_add(s.len as u64);
        assert!(
            end.is_some_and(|e| e <= f.size),
            "sample {i} ({} bytes at {}) lies outside {} ({} bytes)",
            s.len,
            s.offset,
            f.path.display(),
            f.size
        );
    }
    for e in ds.problems() {
        names_a_file(e, "a problem found while indexing");
    }
    assert!(ds.problems_total() >= ds.problems().len() as u64);
    let mut buf = Vec::new();
    for i in 0..ds.len().min(read_max) {
        match ds.read_sample(i, &mut buf, true) {
            Ok(c) => {
                assert_eq!(
                    buf.len(),
                    ds.sample(i).len as usize,
                    "sample {i}: bytes read"
                );
                assert!(
                    c.payload.start <= c.payload.end && c.payload.end <= buf.len(),
                    "sample {i}: payload {:?} outside the {} bytes read",
                    c.payload,
                    buf.len()
                );
            }
            Err(e) => {
                names_a_file(&e, "reading a sample");
                assert_eq!(
                    e.sample(),
                    Some(i as u64),
                    "sample {i}: error names no sample: {e}"
                );
            }
        }
    }
}

/// The crc32c the formats use, from the independent `crc32c` crate.
pub fn crc32c(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

/// TFRecord's masked crc32c (`tensorflow/core/lib/hash/crc32c.h`).
pub fn masked_crc(b: &[u8]) -> u32 {
    let c = crc32c(b);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}
