//! The raw system calls gpufeed makes outside io_uring, each wrapped once.
//!
//! Everything here is a thin, checked wrapper: `statx` with `STATX_DIOALIGN`, opening a file as
//! an `OwnedFd` (with `O_DIRECT` if asked), anonymous `mmap` + `madvise`, `posix_fadvise`,
//! `getrusage`, `getrlimit`. Callers get `io::Result`s; file descriptors are borrowed
//! (`BorrowedFd`) wherever the call does not take ownership.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What `statx` says about an open file.
#[derive(Debug, Clone, Copy)]
pub struct FileStat {
    pub size: u64,
    /// Which file this is, and when its bytes last changed.
    pub identity: FileIdentity,
    pub is_regular: bool,
    /// Required alignment of user memory for O_DIRECT, if the file system reported one.
    pub dio_mem_align: Option<u32>,
    /// Required alignment of file offsets and lengths for O_DIRECT, if reported.
    pub dio_offset_align: Option<u32>,
}

/// A file's device and inode, and its modification time (nanoseconds since 1970): another file
/// at the same path, or the same file rewritten, has another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i128,
}

/// `statx(fd, "", AT_EMPTY_PATH, BASIC | DIOALIGN)`.
pub fn statx_fd(fd: BorrowedFd<'_>) -> io::Result<FileStat> {
    statx_at(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

/// `statx(AT_FDCWD, path, 0, BASIC | DIOALIGN)`: follows links, opens nothing (a FIFO among a
/// dataset's files is stat'ed, not waited on).
pub fn statx_path(path: &Path) -> io::Result<FileStat> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    statx_at(libc::AT_FDCWD, &c, 0)
}

fn statx_at(dirfd: i32, path: &std::ffi::CStr, flags: i32) -> io::Result<FileStat> {
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `st` is a writable `struct statx`; `path` is NUL-terminated and lives across the
    // call; `dirfd` is open for the call (a borrowed fd) or AT_FDCWD.
    let rc = unsafe {
        libc::statx(
            dirfd,
            path.as_ptr(),
            flags,
            libc::STATX_BASIC_STATS | libc::STATX_DIOALIGN,
            st.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised (every field is an integer, so all-zero is valid) and filled by
    // the successful call.
    let st = unsafe { st.assume_init() };
    let (mem, off) = if st.stx_mask & libc::STATX_DIOALIGN != 0 {
        // Zero means "direct I/O not supported on this file".
        (
            Some(st.stx_dio_mem_align).filter(|&v| v != 0),
            Some(st.stx_dio_offset_align).filter(|&v| v != 0),
        )
    } else {
        (None, None)
    };
    Ok(FileStat {
        size: st.stx_size,
        identity: FileIdentity {
            dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
            mtime_ns: st.stx_mtime.tv_sec as i128 * 1_000_000_000 + st.stx_mtime.tv_nsec as i128,
        },
        is_regular: st.stx_mode as u32 & libc::S_IFMT == libc::S_IFREG,
        dio_mem_align: mem,
        dio_offset_align: off,
    })
}

/// Opens `path` read-only (close-on-exec), with `O_DIRECT` if asked; closed when dropped.
/// Opened non-blocking, so that a FIFO put where a data file was does not hang the open
/// (waiting for a writer that never comes); the flag is cleared again on what is opened (a
/// regular file's reads, io_uring's included, then wait for the disk as they should). The
/// caller refuses what is not a regular file.
pub fn open_read(path: &Path, direct: bool) -> io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    let mut flags = libc::O_NONBLOCK;
    if direct {
        flags |= libc::O_DIRECT;
    }
    o.custom_flags(flags);
    let fd: OwnedFd = o.open(path)?.into();
    let now = OFlag::from_bits_truncate(fcntl(&fd, FcntlArg::F_GETFL).map_err(io::Error::from)?);
    fcntl(&fd, FcntlArg::F_SETFL(now - OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok(fd)
}

/// `posix_fadvise(fd, offset, len, advice)`.
pub fn fadvise(fd: BorrowedFd<'_>, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
    nix::fcntl::posix_fadvise(fd, offset as i64, len as i64, advice).map_err(io::Error::from)
}

/// What `fadvise` tells the kernel (`POSIX_FADV_*`).
pub use nix::fcntl::PosixFadviseAdvice as Advice;

/// `pread(fd, buf, len, offset)` into raw memory, retried on EINTR. Returns bytes read.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes and not accessed by anyone else during the call.
pub unsafe fn pread_raw(fd: RawFd, buf: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    loop {
        // SAFETY: the caller guarantees `buf..buf+len` is writable and exclusively ours.
        let n = unsafe { libc::pread(fd, buf.cast(), len, offset as libc::off_t) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// User + system CPU seconds of this process, all threads included (io_uring's io-wq workers
/// and SQPOLL thread belong to the process and are counted too).
pub fn process_cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeValLike;
    // getrusage(RUSAGE_SELF) cannot fail with a valid `who`.
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |ru| {
        (ru.user_time().num_microseconds() + ru.system_time().num_microseconds()) as f64 * 1e-6
    })
}

/// User + system CPU seconds of the calling thread (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_seconds() -> f64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0.0, |ts| ts.tv_sec() as f64 + ts.tv_nsec() as f64 * 1e-9)
}

/// The soft and hard RLIMIT_MEMLOCK in bytes (`u64::MAX` for unlimited).
pub fn memlock_limit() -> (u64, u64) {
    rlimit(Resource::RLIMIT_MEMLOCK)
}

/// The soft and hard RLIMIT_NOFILE (`u64::MAX` for unlimited).
pub fn nofile_limit() -> (u64, u64) {
    rlimit(Resource::RLIMIT_NOFILE)
}

use nix::sys::resource::{Resource, RLIM_INFINITY};

/// A resource's soft and hard limit (`u64::MAX` for unlimited; 0 if it cannot be read).
fn rlimit(resource: Resource) -> (u64, u64) {
    let conv = |v: libc::rlim_t| if v == RLIM_INFINITY { u64::MAX } else { v };
    nix::sys::resource::getrlimit(resource).map_or((0, 0), |(cur, max)| (conv(cur), conv(max)))
}

/// Raises the soft RLIMIT_NOFILE to `soft` (at most the hard limit); the limit in effect after.
pub fn raise_nofile(soft: u64) -> u64 {
    let (cur, hard) = nofile_limit();
    let want = soft.min(hard);
    if want > cur {
        let max = if hard == u64::MAX {
            RLIM_INFINITY
        } else {
            hard
        };
        // Raising the soft limit up to the hard one needs no privilege; a failure leaves the
        // limit as it was (what is returned below).
        let _ = nix::sys::resource::setrlimit(Resource::RLIMIT_NOFILE, want, max);
    }
    nofile_limit().0
}

/// File descriptors this process has open now (the entries of `/proc/self/fd`; 64 if that
/// cannot be read).
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(64, |d| d.count() as u64)
}

/// An anonymous private mapping, `align`-aligned, that is unmapped on drop.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// The whole region mapped (before trimming) is exactly `ptr..ptr+len`: the slack used to
    /// reach the alignment is unmapped right away.
    pub huge_pages_advised: bool,
}

// SAFETY: a Mapping is plain memory with no thread affinity; access to its bytes is governed by
// whoever owns it (the arena and its slots).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes (rounded up to `align`) aligned to `align` (a power of two ≥ page size).
    /// With `huge`, advises transparent huge pages before any page is touched, then touches every
    /// page so the memory is backed now rather than on the first DMA.
    pub fn new(len: usize, align: usize, huge: bool) -> io::Result<Mapping> {
        assert!(align.is_power_of_two() && align >= 4096);
        let len = len
            .checked_add(align - 1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "mapping too large"))?
            & !(align - 1);
        let total = len + align;
        // SAFETY: anonymous mapping; no file, no fixed address.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let raw = raw as usize;
        let start = (raw + align - 1) & !(align - 1);
        let head = start - raw;
        let tail = total - head - len;
        // SAFETY: both ranges lie inside the mapping we just created and are not used.
        unsafe {
            if head > 0 {
                libc::munmap(raw as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
        }
        let mut advised = false;
        if huge {
            // SAFETY: the range is our own mapping. Advice must come before first touch, or the
            // first fault will already have placed 4 KiB pages.
            advised =
                unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) == 0 };
        }
        // Touch every page (write one byte per 4 KiB) so that faults happen here and not on the
        // hot path; with THP each 2 MiB fault places a huge page.
        let mut off = 0;
        while off < len {
            // SAFETY: `start + off` is within the mapping, which nobody else references yet.
            unsafe { std::ptr::write_volatile((start + off) as *mut u8, 0) };
            off += 4096;
        }
        Ok(Mapping {
            ptr: start as *mut u8,
            len,
            huge_pages_advised: advised,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    #[allow(
        clippy::len_without_is_empty,
        reason = "a mapping has at least one page"
    )]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of this mapping backed by transparent huge pages, from /proc/self/smaps.
    pub fn huge_page_bytes(&self) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let start = self.ptr as usize;
        let end = start + self.len;
        let mut total = 0u64;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a < end && b > start;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                    let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                    total += kb * 1024;
                }
            }
        }
        Some(total)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is exactly the mapping we own; whoever owns the Mapping has
        // guaranteed (arena drop order) that no kernel or device operation still targets it.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// A file's first `len` bytes mapped shared and writable: every process that maps the same file
/// sees the same bytes, so atomics in it are atomics across processes (the node cache's extent
/// states and counters). The file must be at least `len` bytes long and must not shrink while
/// mapped (its owner only ever grows it).
#[cfg(feature = "remote")]
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory with no thread affinity; its bytes are only reached through
// atomics (`u8s`, `u64_at`), which are safe to use from any thread.
#[cfg(feature = "remote")]
unsafe impl Send for SharedMap {}
// SAFETY: as above.
#[cfg(feature = "remote")]
unsafe impl Sync for SharedMap {}

#[cfg(feature = "remote")]
impl SharedMap {
    /// Maps `len` (> 0) bytes of `fd` from offset 0.
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<SharedMap> {
        // The file is at least `len` bytes long (the caller's contract), so no access within
        // `len` faults.
        Self::map(Some(fd), len)
    }

    /// `len` (> 0) bytes of anonymous memory shared by this process's threads only, in the
    /// shape of a file's mapping: where a file cannot back one (a full disk), state lives here.
    pub fn anonymous(len: usize) -> io::Result<SharedMap> {
        // Zero-filled and backed by memory rather than a file: no access within `len` faults.
        Self::map(None, len)
    }

    fn map(fd: Option<BorrowedFd<'_>>, len: usize) -> io::Result<SharedMap> {
        assert!(len > 0);
        let (flags, raw_fd) = match fd {
            Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
            None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a new shared mapping, of a file we hold open or of anonymous memory, at no
        // fixed address, so nothing existing is replaced.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw_fd,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: raw.cast(),
            len,
        })
    }

    /// The `n` u32s from `offset` (a multiple of 4) as atomics.
    pub fn u32s(&self, offset: usize, n: usize) -> &[std::sync::atomic::AtomicU32] {
        assert!(
            offset.is_multiple_of(4)
                && n.checked_mul(4)
                    .and_then(|b| b.checked_add(offset))
                    .is_some_and(|e| e <= self.len)
        );
        // SAFETY: the range lies inside the mapping, which lives as long as `self`, and is
        // 4-byte aligned (the mapping is page-aligned); AtomicU32 has the size and alignment of
        // u32, and every access to these bytes (in any process) is atomic.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset).cast(), n) }
    }

    /// The bytes `offset .. offset + n` as atomics.
    pub fn u8s(&self, offset: usize, n: usize) -> &[std::sync::atomic::AtomicU8] {
        assert!(offset.checked_add(n).is_some_and(|e| e <= self.len));
        // SAFETY: the range lies inside the mapping, which lives as long as `self`; AtomicU8 has
        // the size and alignment of u8, and every access to these bytes (in any process) is
        // atomic.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset).cast(), n) }
    }

    /// The 8 bytes at `offset` (a multiple of 8) as one atomic u64.
    pub fn u64_at(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: in bounds and 8-byte aligned (the mapping is page-aligned); every access to
        // these bytes is atomic; the reference lives no longer than the mapping.
        unsafe { &*self.ptr.add(offset).cast::<std::sync::atomic::AtomicU64>() }
    }
}

#[cfg(feature = "remote")]
impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the references handed out borrow `self`, so none outlives it.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// An OFD lock request of kind `kind` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`) on `start .. start + len`.
fn ofd_range(kind: libc::c_int, start: u64, len: u64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start as libc::off_t,
        l_len: len as libc::off_t,
        l_pid: 0, // required for OFD locks
    }
}

/// Tries to take a shared (`shared`) or exclusive open-file-description lock on bytes `start ..
/// start + len` of `fd` without waiting (converting one this open holds): whether it was taken.
/// (The node cache's entries and the node's index being built: `dataset::snapshot`.)
pub fn ofd_try_lock(fd: BorrowedFd<'_>, start: u64, len: u64, shared: bool) -> io::Result<bool> {
    use nix::fcntl::{fcntl, FcntlArg};
    let fl = ofd_range(
        if shared { libc::F_RDLCK } else { libc::F_WRLCK },
        start,
        len,
    );
    loop {
        match fcntl(fd, FcntlArg::F_OFD_SETLK(&fl)) {
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Takes (waiting for it) or releases an open-file-description lock on bytes `start .. start +
/// len` of `fd`: exclusive between different opens of the file, in this process or any other,
/// and released by the kernel when the last descriptor of the open closes (a process that dies
/// holding it leaves no stale lock).
pub fn ofd_lock(fd: BorrowedFd<'_>, start: u64, len: u64, lock: bool) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let fl = ofd_range(if lock { libc::F_WRLCK } else { libc::F_UNLCK }, start, len);
    loop {
        match fcntl(fd, FcntlArg::F_OFD_SETLKW(&fl)) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

// SAFETY: `Compact` is `repr(C)`: a u64 then two u32 — 16 bytes, 8-aligned, no padding — and
// every bit pattern of those integers is a valid value, so it may be viewed as bytes and bytes
// (suitably aligned, checked by bytemuck) as it.
unsafe impl bytemuck::Zeroable for crate::plan::Compact {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl bytemuck::Pod for crate::plan::Compact {}

/// A read-only shared mapping of a whole file (`mmap(PROT_READ, MAP_SHARED)`), unmapped when
/// dropped. The ranks of a node mapping one file share its pages.
///
/// A mapped file that shrinks makes reading past its new end fault (SIGBUS): map only files no
/// one changes in place (gpufeed's shared index files are written whole under another name and
/// renamed or linked into place, in a directory only their owner can write).
pub struct FileMapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only memory owned by this value; reading it from any thread is
// sound, and it is unmapped once, when the value drops.
unsafe impl Send for FileMapping {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps the first `len` bytes of `fd` (`len` > 0, at most the file's size).
    pub fn of(fd: BorrowedFd<'_>, len: usize) -> io::Result<FileMapping> {
        if len == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: a new read-only mapping chosen by the kernel (no fixed address, so nothing
        // existing is replaced) of an open fd; the result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(FileMapping { ptr, len })
    }
}

impl AsRef<[u8]> for FileMapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable at `ptr` for as long as `self` lives; the file is
        // one no one changes in place (see the type's doc).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, unmapped once; no reference into it outlives
        // `self` (`as_ref` borrows it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
