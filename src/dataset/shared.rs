//! The index the ranks of a node share. Every rank opening a dataset builds the same 16-byte
//! sample table; held by each, 8 ranks hold 8 copies (10⁷ samples: 1.2 GiB over the node). So
//! the first to open writes its table to a file in the index directory
//! (`$GPUFEED_CACHE_DIR/index`, else `~/.cache/gpufeed/index`) and every rank maps that file:
//! one copy in the page cache, shared. Nothing in the file is trusted: a rank maps it only if it
//! is byte for byte the table it built itself (so a stale, damaged or planted file is never used,
//! only replaced), owned by this user, in a directory only this user can write. Where that fails
//! (a full disk, a directory another user owns, `GPUFEED_SHARED_INDEX=0`) the rank keeps its own
//! copy, as before, and says why once.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::plan::Samples;

/// Datasets of fewer samples keep their own table (1 MiB: not worth a file).
pub(crate) const SHARED_MIN_SAMPLES: usize = 1 << 16;
const MAGIC: &[u8; 8] = b"GPFIDX01";
/// The header before the entries: magic, entry count, entry size, zeros.
const HEADER: usize = 64;

/// The directory of shared index files: `$GPUFEED_CACHE_DIR/index`, else
/// `$XDG_CACHE_HOME/gpufeed/index`, else `~/.cache/gpufeed/index`.
pub(crate) fn index_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("GPUFEED_CACHE_DIR") {
        return Some(d.join("index"));
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return Some(d.join("gpufeed").join("index"));
    }
    env("HOME").map(|h| h.join(".cache").join("gpufeed").join("index"))
}

/// Replaces `samples`' own compact table by the node's shared copy of it (written now if no
/// one has), for a dataset of `format` whose files are `files` (path, size). Keeps its own copy
/// — saying why, once — where that cannot be done; does nothing for small or computed indexes.
pub(crate) fn share(samples: &mut Samples, format: &str, files: &[(&Path, u64)]) {
    if samples.len() < SHARED_MIN_SAMPLES
        || std::env::var_os("GPUFEED_SHARED_INDEX").is_some_and(|v| v == "0")
    {
        return;
    }
    let Some(own) = samples.owned_compact_bytes() else {
        return;
    };
    let Some(dir) = index_dir() else {
        return;
    };
    let name = file_name(format, samples.len(), own.len(), files);
    if let Err(e) = try_share(samples, &dir, &name) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            crate::util::notice(&format!(
                "the sample index is not shared with the node's other ranks ({}: {e}); this \
                 process keeps its own copy",
                dir.display()
            ))
        });
    }
}

/// The file's name: a hash of what names the dataset (format, files, sizes, counts). Two
/// datasets that hash alike only replace each other's file (contents are compared, not trusted).
fn file_name(format: &str, samples: usize, bytes: usize, files: &[(&Path, u64)]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (MAGIC, format, samples, bytes, files.len()).hash(&mut h);
    for (p, size) in files {
        (p, size).hash(&mut h);
    }
    format!("samples-{:016x}.gpfidx", h.finish())
}

fn try_share(samples: &mut Samples, dir: &Path, name: &str) -> std::io::Result<()> {
    private_dir(dir)?;
    let path = dir.join(name);
    let len = samples.owned_compact_bytes().map_or(0, <[u8]>::len);
    let count = samples.len();
    // The file at `path`, if it is this table, in use: whether it was.
    let use_it = |samples: &mut Samples| -> std::io::Result<bool> {
        Ok(match map_existing(&path, len, count)? {
            Some(m) => samples.share(m, HEADER),
            None => false,
        })
    };
    // Another rank's file.
    if use_it(samples)? {
        return Ok(());
    }
    // Ours, written whole beside it, then linked into place: the first rank to link wins and
    // every rank maps that one file. Over a different file (stale, damaged), renamed.
    sweep(dir);
    let own = samples.owned_compact_bytes().expect("checked by share");
    let tmp = write_beside(dir, name, own, count)?;
    let placed = match std::fs::hard_link(&tmp, &path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if use_it(samples)? {
                let _ = std::fs::remove_file(&tmp);
                return Ok(());
            }
            std::fs::rename(&tmp, &path)
        }
        other => other,
    };
    let _ = std::fs::remove_file(&tmp);
    placed?;
    if use_it(samples)? {
        Ok(())
    } else {
        Err(std::io::Error::other(
            "another process replaced the index file meanwhile",
        ))
    }
}

/// Index files are kept a week from when they were written (a dataset opened again after that
/// writes its own anew; a process that maps a removed file keeps its pages): the directory
/// holds what the past week opened, not every dataset ever opened. Partial files a killed
/// process left go after a day.
const KEEP: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Removes this directory's index files older than [`KEEP`] and partial ones older than a day.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let keep = if name.starts_with("samples-") && name.ends_with(".gpfidx") {
            KEEP
        } else if name.starts_with(".samples-") && name.ends_with(".partial") {
            std::time::Duration::from_secs(24 * 3600)
        } else {
            continue; // not ours
        };
        let old = e
            .metadata()
            .ok()
            .filter(std::fs::Metadata::is_file)
            .and_then(|m| m.modified().ok())
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > keep);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Makes `dir` (0700) and checks that it is a directory, not a link, owned by this user and
/// writable by no one else: a file in it was written by this user.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let md = std::fs::symlink_metadata(dir)?;
    let me = std::fs::metadata("/proc/self")?.uid();
    if !md.is_dir() || md.uid() != me || md.mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "not a directory of this user's that only it can write (owner {}, mode {:o})",
                md.uid(),
                md.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// The index file at `path` mapped, if it is a regular file of this user's (not a link) with a
/// header for `count` entries and `len` bytes of them; `None` if there is none.
fn map_existing(path: &Path, len: usize, count: usize) -> std::io::Result<Option<SharedMapping>> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None), // a link: replaced
        Err(e) => return Err(e),
    };
    let md = f.metadata()?;
    let me = std::fs::metadata("/proc/self")?.uid();
    if !md.is_file() || md.uid() != me || md.len() != (HEADER + len) as u64 {
        return Ok(None);
    }
    let m = crate::sys::FileMapping::of(std::os::fd::AsFd::as_fd(&f), HEADER + len)?;
    let head = &m.as_ref()[..HEADER];
    if &head[..8] != MAGIC
        || head[8..16] != (count as u64).to_le_bytes()
        || head[16..24] != 16u64.to_le_bytes()
    {
        return Ok(None);
    }
    Ok(Some(Arc::new(m)))
}

type SharedMapping = crate::plan::SharedBytes;

/// Writes the header and `own` to a new file in `dir` no one else can have opened; returns its
/// path.
fn write_beside(dir: &Path, name: &str, own: &[u8], count: usize) -> std::io::Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.{}.{nanos}.partial", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let mut head = [0u8; HEADER];
    head[..8].copy_from_slice(MAGIC);
    head[8..16].copy_from_slice(&(count as u64).to_le_bytes());
    head[16..24].copy_from_slice(&16u64.to_le_bytes());
    let written = f.write_all(&head).and_then(|()| f.write_all(own));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}
