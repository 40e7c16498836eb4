//! The index the ranks of a node share. Every rank opening a dataset builds the same 16-byte
//! sample table; held by each, 8 ranks hold 8 copies (10⁷ samples: 1.2 GiB over the node). So
//! the first to open writes its table to a file in the index directory
//! (`$GPUFEED_INDEX_DIR`, else `~/.cache/gpufeed/index`) and every rank maps that file:
//! one copy in the page cache, shared. Nothing in the file is trusted: a rank maps it only if it
//! is byte for byte the table it built itself (so a stale, damaged or planted file is never used,
//! only replaced), owned by this user, in a directory only this user can write — every file
//! operation made relative to that directory once opened and checked, so swapping the
//! directory for a link midway leads nowhere. Where that fails
//! (a full disk, a directory another user owns, `GPUFEED_SHARED_INDEX=0`) the rank keeps its own
//! copy, as before, and says why once. Packed shards, WebDataset tars, TFRecord files,
//! ImageFolders and Megatron sequences go further: their whole index is kept for the node and
//! read instead of built ([`super::snapshot`]); what is here serves the rest (remote datasets,
//! an ImageFolder on a file system whose folder times are not trusted, an open whose index is
//! not kept).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;

use crate::plan::Samples;

/// Datasets of fewer samples keep their own table (1 MiB: not worth a file).
pub(crate) const SHARED_MIN_SAMPLES: usize = 1 << 16;
const MAGIC: &[u8; 8] = b"GPFIDX01";
/// The header before the bytes: magic, entry count, bytes after the header, zeros.
const HEADER: usize = 64;

/// The directory of shared index files: `$GPUFEED_INDEX_DIR`, else
/// `$XDG_CACHE_HOME/gpufeed/index`, else `~/.cache/gpufeed/index` (beside the node cache's
/// default `objects`; not inside `$GPUFEED_CACHE_DIR`, which is the node cache's alone).
pub(crate) fn index_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    // Absolute: a relative setting means one folder for every process of the node, not one
    // under each process's working directory.
    let dir = if let Some(d) = env("GPUFEED_INDEX_DIR") {
        d
    } else if let Some(d) = env("XDG_CACHE_HOME") {
        d.join("gpufeed").join("index")
    } else {
        env("HOME")?.join(".cache").join("gpufeed").join("index")
    };
    std::path::absolute(&dir).ok()
}

/// Whether sharing is on (`GPUFEED_SHARED_INDEX=0` turns it off).
pub(super) fn enabled() -> bool {
    std::env::var_os("GPUFEED_SHARED_INDEX").is_none_or(|v| v != "0")
}

/// Says once per process why an index part stays private.
pub(super) fn say_private(dir: &Path, e: &std::io::Error) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        crate::util::notice(&format!(
            "the index (or its check) is not kept for the node's other processes ({}: {e}); \
             this process keeps its own copy",
            dir.display()
        ))
    });
}

/// Replaces `samples`' own compact table by the node's shared copy of it (written now if no
/// one has), for a dataset of `format` whose files are `files` (path, size). Keeps its own copy
/// — saying why, once — where that cannot be done; does nothing for small or computed indexes.
pub(crate) fn share(samples: &mut Samples, format: &str, files: &[(&Path, u64)]) {
    if samples.len() < SHARED_MIN_SAMPLES || !enabled() {
        return;
    }
    let Some(own) = samples.owned_compact_bytes() else {
        return;
    };
    let Some(dir) = index_dir() else {
        return;
    };
    let name = file_name("samples", format, samples.len(), own.len(), files);
    let (count, at) = (samples.len(), HEADER..HEADER + own.len());
    match node_copy(&dir, &name, &[own], count) {
        Ok(m) => {
            if !samples.share(m, at) {
                say_private(&dir, &std::io::Error::other("the mapped table differs"));
            }
        }
        Err(e) => say_private(&dir, &e),
    }
}

/// The same for a dataset's keys (tar member names, paths): their ends and bytes.
pub(crate) fn share_keys(keys: &mut super::Strings, format: &str, files: &[(&Path, u64)]) {
    if keys.len() < SHARED_MIN_SAMPLES || !enabled() {
        return;
    }
    let Some((ends, bytes)) = keys.owned_parts() else {
        return;
    };
    let Some(dir) = index_dir() else {
        return;
    };
    let name = file_name("keys", format, keys.len(), bytes.len(), files);
    let (count, at) = (keys.len(), HEADER..HEADER + ends.len() + bytes.len());
    match node_copy(&dir, &name, &[ends, bytes], count) {
        Ok(m) => {
            if !keys.share(m, at) {
                say_private(&dir, &std::io::Error::other("the mapped keys differ"));
            }
        }
        Err(e) => say_private(&dir, &e),
    }
}

/// The file's name: a hash of what names the dataset (format, files, sizes, counts). Two
/// datasets that hash alike only replace each other's file (contents are compared, not trusted).
fn file_name(
    what: &str,
    format: &str,
    count: usize,
    bytes: usize,
    files: &[(&Path, u64)],
) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (MAGIC, format, count, bytes, files.len()).hash(&mut h);
    // Names and sizes, and where the first and last files are (however their paths are
    // spelled: `./a.tar`, an absolute path and a linked directory name one dataset).
    for (p, size) in files {
        (p.file_name(), size).hash(&mut h);
    }
    for (p, _) in [files.first(), files.last()].into_iter().flatten() {
        let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::canonicalize(parent.unwrap_or(Path::new(".")))
            .ok()
            .hash(&mut h);
    }
    format!("{what}-{:016x}.gpfidx", h.finish())
}

/// The node's copy of `parts` (one after another, after a header naming `count` entries),
/// mapped: the file in `dir` named `name` if it holds exactly these bytes, else written now —
/// whole under a private name, then hard-linked into place (the first process to link wins and
/// every one maps that file) or renamed over a different one (stale, damaged).
fn node_copy(
    dir: &Path,
    name: &str,
    parts: &[&[u8]],
    count: usize,
) -> std::io::Result<SharedMapping> {
    let d = private_dir(dir)?;
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let same = |m: &SharedMapping| {
        let mut at = HEADER;
        parts.iter().all(|p| {
            let ok = (**m).as_ref().get(at..at + p.len()) == Some(*p);
            at += p.len();
            ok
        })
    };
    let existing = || -> std::io::Result<Option<SharedMapping>> {
        Ok(map_existing(&d, dir, name, len, count)?.filter(&same))
    };
    if let Some(m) = existing()? {
        return Ok(m);
    }
    sweep(&d);
    let tmp = write_beside(&d, name, parts, count)?;
    let unlink_tmp = || {
        let _ = nix::unistd::unlinkat(&d, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    };
    let placed = match nix::unistd::linkat(&d, tmp.as_str(), &d, name, AtFlags::empty()) {
        Err(nix::errno::Errno::EEXIST) => {
            if let Some(m) = existing()? {
                unlink_tmp();
                return Ok(m);
            }
            nix::fcntl::renameat(&d, tmp.as_str(), &d, name)
        }
        other => other,
    };
    unlink_tmp();
    placed.map_err(|e| std::io::Error::other(format!("cannot place {name}: {e}")))?;
    existing()?.ok_or_else(|| std::io::Error::other("another process replaced the file meanwhile"))
}

/// Index files are kept a week from when they were written (a dataset opened again after that
/// writes its own anew; a process that maps a removed file keeps its pages): the directory
/// holds what the past week opened, not every dataset ever opened. Partial files a killed
/// process left go after a day.
const KEEP: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Removes the directory's index files older than [`KEEP`] and partial ones older than a day
/// (regular files only, by name; nothing else is touched).
pub(super) fn sweep(d: &OwnedFd) {
    let Ok(dup) = d.try_clone() else {
        return;
    };
    let Ok(mut entries) = nix::dir::Dir::from_fd(dup) else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_secs() as i64);
    let mut old = Vec::new();
    for e in entries.iter().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = ["samples-", "keys-", "dataset-", "checked-"]
            .iter()
            .any(|p| name.starts_with(p));
        let partial = [".samples-", ".keys-", ".dataset-", ".checked-"]
            .iter()
            .any(|p| name.starts_with(p));
        let keep = if ours && (name.ends_with(".gpfidx") || name.ends_with(".gpfidx.lock")) {
            KEEP.as_secs() as i64
        } else if partial && name.ends_with(".partial") {
            24 * 3600
        } else {
            continue; // not ours
        };
        let Ok(st) = nix::sys::stat::fstatat(d, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && now - st.st_mtime > keep {
            old.push(name);
        }
    }
    for name in old {
        let _ = nix::unistd::unlinkat(d, name.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// Makes `dir` (0700), opens it without following a link, and checks the directory opened is
/// this user's and writable by no one else: the files in it were written by this user, and
/// every later operation is made relative to the directory held here.
pub(super) fn private_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let d = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        std::io::Error::other(format!(
            "{}: {e}{}",
            dir.display(),
            if e == nix::errno::Errno::ELOOP || e == nix::errno::Errno::ENOTDIR {
                " (a link or not a directory)"
            } else {
                ""
            }
        ))
    })?;
    let st = nix::sys::stat::fstat(&d).map_err(std::io::Error::from)?;
    let me = std::fs::metadata("/proc/self")?.uid();
    // Private: no other user may reach the files in it at all (a file made writable in a
    // directory others can enter was rewritten under a rank that mapped it).
    if st.st_uid != me || st.st_mode & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory private to this user (owner {}, mode {:o}; `chmod 700` \
                 it, or name another in GPUFEED_INDEX_DIR)",
                dir.display(),
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(d)
}

/// Why a kept file is not to be trusted, if it is not: another user's, not a regular file, or
/// writable by its group or by others — whoever can write it can change what a rank serves
/// while the rank has it mapped (the trial's `nobody` swapped two entries of a `chmod 666`
/// index in place: sample 4,593,357's bytes and label served as 4,593,356's).
pub(super) fn untrusted(md: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::fs::metadata("/proc/self").ok()?.uid();
    let mode = md.permissions().mode();
    if !md.is_file() {
        Some("not a regular file".into())
    } else if md.uid() != me {
        Some(format!("owned by user {}, not this one ({me})", md.uid()))
    } else if mode & 0o022 != 0 {
        Some(format!(
            "writable by its group or by others (mode {:o})",
            mode & 0o7777
        ))
    } else {
        None
    }
}

/// Says once per process that a kept file was not trusted, and why: it is built anew (and
/// replaces that file).
pub(super) fn say_untrusted(path: &Path, why: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        crate::util::notice(&format!(
            "{}: {why}: not used; the index is built anew and kept in its place (said once)",
            path.display()
        ))
    });
}

/// The index file `name` in `d` (the directory `dir`) mapped, if it is a regular file of this
/// user's that only it can write (not a link; [`untrusted`]) with a header for `count` entries
/// and `len` bytes of them; `None` if there is none.
fn map_existing(
    d: &OwnedFd,
    dir: &Path,
    name: &str,
    len: usize,
    count: usize,
) -> std::io::Result<Option<SharedMapping>> {
    // Not waiting on a FIFO planted at the name (a regular file ignores O_NONBLOCK).
    let fd = match nix::fcntl::openat(
        d,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ELOOP) => return Ok(None),
        Err(e) => return Err(std::io::Error::other(format!("{name}: {e}"))),
    };
    let f = std::fs::File::from(fd);
    let md = f.metadata()?;
    if let Some(why) = untrusted(&md) {
        say_untrusted(&dir.join(name), &why);
        return Ok(None);
    }
    if md.len() != (HEADER + len) as u64 {
        return Ok(None);
    }
    let m = crate::sys::FileMapping::of(f.as_fd(), HEADER + len)?;
    let head = &m.as_ref()[..HEADER];
    if &head[..8] != MAGIC
        || head[8..16] != (count as u64).to_le_bytes()
        || head[16..24] != (len as u64).to_le_bytes()
    {
        return Ok(None);
    }
    Ok(Some(Arc::new(m)))
}

type SharedMapping = crate::plan::SharedBytes;

/// A new file in `d` for `name`'s bytes, under a private name (`.NAME.PID.NANOS.partial`) no
/// one else can have opened: its name and the file, for writing. The file is read-only (0400)
/// once this descriptor is closed: the indexes the node's loaders map are written once and
/// replaced whole, never changed in place, and the owner's own `>` or `truncate` of one being
/// mapped (which would fault its readers) is refused, as the superuser's is not.
pub(super) fn create_partial(d: &OwnedFd, name: &str) -> std::io::Result<(String, std::fs::File)> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = format!(".{name}.{}.{nanos}.partial", std::process::id());
    let fd = nix::fcntl::openat(
        d,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o400),
    )
    .map_err(|e| std::io::Error::other(format!("{tmp}: {e}")))?;
    Ok((tmp, std::fs::File::from(fd)))
}

/// Writes the header and `parts` to a new file in `d` that no one else can have opened;
/// returns its name.
fn write_beside(d: &OwnedFd, name: &str, parts: &[&[u8]], count: usize) -> std::io::Result<String> {
    let (tmp, mut f) = create_partial(d, name)?;
    let mut head = [0u8; HEADER];
    head[..8].copy_from_slice(MAGIC);
    head[8..16].copy_from_slice(&(count as u64).to_le_bytes());
    let len: usize = parts.iter().map(|p| p.len()).sum();
    head[16..24].copy_from_slice(&(len as u64).to_le_bytes());
    let written = f
        .write_all(&head)
        .and_then(|()| parts.iter().try_for_each(|p| f.write_all(p)));
    if let Err(e) = written {
        let _ = nix::unistd::unlinkat(d, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        return Err(std::io::Error::new(e.kind(), format!("{tmp}: {e}")));
    }
    Ok(tmp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Strings;
    use crate::plan::Sample;

    /// Bytes 8-aligned, as a file mapping's are.
    struct Aligned(Vec<u64>);
    impl AsRef<[u8]> for Aligned {
        fn as_ref(&self) -> &[u8] {
            bytemuck::cast_slice(&self.0)
        }
    }
    fn shared(parts: &[&[u8]]) -> SharedMapping {
        let mut b = vec![0u8; HEADER];
        for p in parts {
            b.extend_from_slice(p);
        }
        b.resize(b.len().next_multiple_of(8), 0xAA);
        let n = b.len();
        let mut v = vec![0u64; n / 8];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v).copy_from_slice(&b);
        // Trailing filler past the parts makes the lengths differ unless they fit exactly.
        Arc::new(Aligned(v))
    }

    /// Strings and samples read from a shared copy only when it holds exactly their bytes,
    /// and then read the same as before.
    #[test]
    fn a_shared_copy_is_used_only_when_it_is_the_same() {
        // 4 ends (16 bytes) and 24 bytes of strings: 64 + 40, a whole number of u64s.
        let words = ["a", "", "n01440764_10026", "ü/x.jpg"];
        let mut keys = Strings::default();
        for k in words {
            keys.push(k.as_bytes()).unwrap();
        }
        let (e, b) = keys
            .owned_parts()
            .map(|(e, b)| (e.to_vec(), b.to_vec()))
            .unwrap();
        assert_eq!((e.len() + b.len()) % 8, 0);
        let mut copy = keys.clone();
        assert!(copy.share(shared(&[&e, &b]), HEADER..HEADER + 40));
        for (i, w) in words.iter().enumerate() {
            assert_eq!(copy.get(i), w.as_bytes());
        }
        assert_eq!(copy.len(), 4);
        assert_eq!((copy.heap_bytes(), copy.shared_bytes()), (0, 40));
        // One byte different, or 8 bytes more: refused, its own copy kept.
        let mut wrong = b.clone();
        wrong[3] ^= 1;
        let mut kept = keys.clone();
        assert!(!kept.share(shared(&[&e, &wrong]), HEADER..HEADER + 40));
        assert!(!kept.share(shared(&[&e, &b, &[0; 8]]), HEADER..HEADER + 48));
        assert_eq!((kept.get(2), kept.shared_bytes()), (words[2].as_bytes(), 0));

        // 16-byte samples: 64 + 16·n is a multiple of 8.
        let v: Vec<Sample> = (0..100)
            .map(|i| Sample {
                file: 0,
                len: 10 + i,
                offset: 4096 * i as u64,
                label: (i % 7) as i64,
                crc32c: i * 31,
            })
            .collect();
        let own: Samples = v.clone().into();
        let bytes = own.owned_compact_bytes().unwrap().to_vec();
        let mut s = own.clone();
        assert!(s.share(shared(&[&bytes]), HEADER..HEADER + 1600));
        assert_eq!(s.iter().collect::<Vec<_>>(), v);
        assert_eq!((s.shared_bytes(), s.heap_bytes() < 64), (1600, true));
        let mut bad = bytes.clone();
        bad[17] ^= 4;
        assert!(!own.clone().share(shared(&[&bad]), HEADER..HEADER + 1600));
    }
}
