//! A dataset's index kept whole for the node: the first process to open a large dataset of
//! packed shards, WebDataset tars, TFRecord files (scanned, or from their `.idx`), an
//! ImageFolder or a Megatron index of one sample per sequence writes what
//! it built — the 16-byte sample table, each file's first sample and size, metadata, classes,
//! keys — to one file in the index directory ([`shared::index_dir`]); every later process
//! (the node's other ranks, the next run) maps that file instead of indexing the dataset again:
//! no walk of every tar header, no table built in its heap, the same pages for every rank.
//!
//! The file is used only if it was built from these very files: its name and first section
//! are the files' identity and state (device, inode, size, modification and change times, to
//! the nanosecond) and the options that shape the index; a file changed since (rewritten,
//! appended to, touched, renamed over) has another state and is indexed anew, and the new
//! index replaces the stale one. Files changed less than [`SETTLE`] before the build are not
//! kept (a change within a filesystem's timestamp tick would not show). The index is checked
//! before use — crc32c over every section, every sample inside its file, ends in order — so a
//! damaged or truncated file is rebuilt, never read past; keys are checked when first asked for
//! (an index whose keys are damaged reads them as `FILE#K@OFFSET`, with a notice). The file is
//! this user's, a regular file (`O_NOFOLLOW`) in a directory only this user can write, every
//! operation made relative to that directory once checked ([`shared::private_dir`]).
//!
//! While one process builds the index, the others opening the same files wait for it (an
//! open-file-description lock beside the index: released when the builder exits, however it
//! exits) and then map what it wrote — the index is built once per node. A wait is bounded
//! ([`WAIT`]); after it, or where the builder kept nothing (a dataset with problems is
//! indexed by every open: they are reported each time), each process builds its own and shares
//! the table byte for byte ([`shared`]).
//!
//! The same file format keeps what a check of a dataset's files found, where the index itself
//! is computed: a Megatron index opened as windows ([`Inputs::of_check`], `checked-HASH.gpfidx`).

use std::io::Write;
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::image_folder::{Tree, Walked};
use super::{
    data_file, shard, shared, tfrecord, tokens, Dataset, Format, Frame, OpenOptions, Strings,
};
use crate::plan::{Samples, SharedBytes};

const MAGIC: &[u8; 8] = b"GPFNODE1";
/// Magic, the sections' table, the checksum of every section but the keys'; zeros.
const HEADER: usize = 256;
/// Inputs, flags, sizes, files' first samples, entries, metadata, classes, keys.
const SECTIONS: usize = 8;
/// Each section's place in the file.
type Sections = [Range<usize>; SECTIONS];
const INPUTS: usize = 0;
const FLAGS: usize = 1;
const SIZES: usize = 2;
const FILE_FIRST: usize = 3;
const ENTRIES: usize = 4;
const METAS: usize = 5;
const CLASSES: usize = 6;
const KEYS: usize = 7;
/// Bytes of the flags section: checksums, frame, shard image records, unlabelled 64-bit
/// offsets, a Megatron dataset's element type code (5 bytes, padded to 8), then counts (samples, files, metadata, classes, keys) and the keys' crc32c.
const FLAGS_LEN: usize = 8 + 5 * 8 + 8;

/// Files whose modification or change time is more recent than this when an index is built
/// are indexed but not kept: a second change within a coarse filesystem's timestamp tick
/// (one or two seconds on some) would leave the same times.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);
/// How long a process waits for another building the same index before building its own.
const WAIT: Duration = Duration::from_secs(600);

/// What a dataset's index is built from: its files' identity and state, and the options that
/// shape the index.
pub(crate) struct Inputs {
    format: Format,
    blob: Vec<u8>,
    name: String,
    dir: PathBuf,
    /// The latest modification or change time among the files (nanoseconds since 1970).
    newest: i128,
    /// An ImageFolder's root: the blob names the root, and the index kept holds after it every
    /// folder walked and its state, checked again (a `stat` each) before the index is used.
    root: Option<PathBuf>,
}

/// A held lock on the index being built: released when dropped — its file removed first, so
/// the index directory keeps no lock files (processes waiting on it go on; a later one finds
/// the index, or takes a new lock) — or when the process exits, however it exits.
pub(crate) struct Building {
    fd: OwnedFd,
    dir: OwnedFd,
    name: String,
}

impl Drop for Building {
    fn drop(&mut self) {
        // Only the file this lock is on: another process's lock file at the name is kept.
        let ours = nix::sys::stat::fstat(&self.fd).ok();
        let there = nix::sys::stat::fstatat(
            &self.dir,
            self.name.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok();
        if let (Some(a), Some(b)) = (ours, there) {
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) {
                let _ = nix::unistd::unlinkat(
                    &self.dir,
                    self.name.as_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                );
            }
        }
    }
}

/// Keys checked when first asked for: their crc32c and their ends.
#[derive(Clone)]
pub(crate) struct LazyKeys {
    map: SharedBytes,
    at: Range<usize>,
    count: usize,
    crc: u32,
    file: PathBuf,
    /// The file's device and inode.
    identity: (u64, u64),
}

impl std::fmt::Debug for LazyKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LazyKeys({} keys)", self.count)
    }
}

impl LazyKeys {
    /// Removes the index file this was read from, if that file is still at its name.
    fn remove(&self) -> bool {
        let (Some(dir), Some(name)) = (self.file.parent(), self.file.file_name()) else {
            return false;
        };
        let Ok(d) = shared::private_dir(dir) else {
            return false;
        };
        let there = nix::sys::stat::fstatat(&d, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
        there.is_ok_and(|st| (st.st_dev, st.st_ino) == self.identity)
            && nix::unistd::unlinkat(&d, name, nix::unistd::UnlinkatFlags::NoRemoveDir).is_ok()
    }

    /// The keys, or why they cannot be read.
    pub(crate) fn read(&self) -> Result<Strings, String> {
        let bytes = (*self.map).as_ref().get(self.at.clone());
        if bytes.and_then(|b| strings_digest(b, self.count)) != Some(self.crc) {
            // Removed (if it is still the file mapped here), so the next open builds it anew.
            let removed = self.remove();
            return Err(format!(
                "{}: the keys are damaged{}",
                self.file.display(),
                if removed {
                    "; the file is removed, and the next open indexes the dataset anew"
                } else {
                    ""
                }
            ));
        }
        Strings::mapped(self.map.clone(), self.at.clone(), self.count)
            .map_err(|e| format!("{}: {e}", self.file.display()))
    }
}

fn nanos(s: i64, ns: i64) -> i128 {
    s as i128 * 1_000_000_000 + ns as i128
}

/// The later of a file's modification and change times (nanoseconds since 1970): what
/// [`SETTLE`] is measured from.
pub(super) fn changed_at(md: &std::fs::Metadata) -> i128 {
    nanos(md.mtime(), md.mtime_nsec()).max(nanos(md.ctime(), md.ctime_nsec()))
}

impl Inputs {
    /// The inputs of `paths` opened as `format` with `opts`, where such an index can be kept:
    /// packed shards, WebDataset tars, TFRecord files (each with the index file its open
    /// reads, if any: an input too); sharing on and an index directory named. `None`
    /// otherwise, or where a file cannot be examined (the open then says why).
    pub(crate) fn of(format: Format, paths: &[PathBuf], opts: &OpenOptions) -> Option<Inputs> {
        if !cfg!(target_endian = "little") || !shared::enabled() || paths.is_empty() {
            return None;
        }
        // The fewest bytes a sample takes in each format: files that together hold fewer than
        // a kept index's samples are not examined further (no directory made, no lock taken).
        let least = match format {
            Format::WebDataset => 1024, // a member's header and one block of data
            Format::TfRecord => 16,     // a record's framing
            Format::Packed => 16,       // an index entry
            Format::Megatron if opts.tokens.seq_len.is_none() => 12, // a sequence's entries
            Format::ImageFolder => return Inputs::of_tree(paths),
            Format::Tokens | Format::Megatron => return None, // windows: computed
        };
        let mut inputs = Vec::new();
        let mut bytes = 0;
        for p in paths {
            let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
            match format {
                // A Megatron dataset's `.idx` is read, its `.bin` is the samples' file.
                Format::Megatron => {
                    let (idx, bin) = tokens::megatron_files(p);
                    bytes += size(&idx);
                    inputs.extend([Some(idx), Some(bin)]);
                }
                // A TFRecord file's index file (the one its open reads) is an input too.
                Format::TfRecord => {
                    bytes += size(p);
                    inputs.extend([Some(p.clone()), tfrecord::index_of(p, opts)]);
                }
                _ => {
                    bytes += size(p);
                    inputs.push(Some(p.clone()));
                }
            }
        }
        if bytes < least * shared::SHARED_MIN_SAMPLES as u64 {
            return None;
        }
        let mut shape = format!(
            "\n{:?} {:?} {:?} {} {}\n",
            opts.webdataset,
            opts.tfrecord_payload,
            opts.tfrecord_label,
            opts.label_offset,
            opts.tfrecord_recover
        );
        if format == Format::Megatron {
            // The element type asked for is checked against each index's.
            shape.push_str(&format!("{:?}\n", opts.tokens.dtype));
        }
        Inputs::from_files(format, &shape, &inputs, "dataset")
    }

    /// An ImageFolder's inputs: its root (as named, and which folder it is); the folders under
    /// it are known once walked ([`store`](Self::store) keeps them, [`kept`](Self::kept) checks
    /// them). Its files are not examined: a file's size is checked when it is opened, and a
    /// file added, removed or renamed changes its folder's modification time.
    fn of_tree(paths: &[PathBuf]) -> Option<Inputs> {
        let [root] = paths else { return None };
        let md = std::fs::metadata(root).ok().filter(|m| m.is_dir())?;
        let dir = shared::index_dir()?;
        // The folder itself (links and `..` resolved): the same folder reached another way
        // finds the same index.
        let root = std::fs::canonicalize(root).ok()?;
        let mut blob = b"gpufeed node index 1\n".to_vec();
        blob.extend_from_slice(Format::ImageFolder.name().as_bytes());
        blob.extend_from_slice(b"\ntree\n");
        {
            use std::os::unix::ffi::OsStrExt;
            blob.extend_from_slice(root.as_os_str().as_bytes());
        }
        blob.push(0);
        for v in [md.dev(), md.ino()] {
            blob.extend_from_slice(&v.to_le_bytes());
        }
        Some(Inputs {
            format: Format::ImageFolder,
            name: Inputs::name_of(&blob, "dataset"),
            blob,
            dir,
            newest: changed_at(&md),
            root: Some(root),
        })
    }

    fn name_of(blob: &[u8], prefix: &str) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        blob.hash(&mut h);
        format!("{prefix}-{:016x}.gpfidx", h.finish())
    }

    /// The folders of a walk as the index keeps them after the blob: each one's path under the
    /// root (its length, then its bytes) and its state.
    fn tree_bytes(tree: &Tree) -> Vec<u8> {
        let mut b = Vec::new();
        for f in &tree.folders {
            b.extend_from_slice(&(f.rel.len() as u32).to_le_bytes());
            b.extend_from_slice(&f.rel);
            for v in f.state {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    /// Whether every folder `kept` lists (as [`tree_bytes`](Self::tree_bytes) wrote them) is
    /// still the folder it was, as it was (a `stat` each, links followed as the walk did).
    fn tree_unchanged(root: &Path, mut kept: &[u8]) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let mut first = true;
        while !kept.is_empty() {
            let Some(n) = read_u32(kept, 0).map(|n| n as usize) else {
                return false;
            };
            let Some(rel) = kept.get(4..4 + n) else {
                return false;
            };
            let Some(state) = kept.get(4 + n..4 + n + 48) else {
                return false;
            };
            // The root first, then folders under it (no `..`, no absolute path).
            let under = rel
                .split(|&c| c == b'/')
                .all(|c| !c.is_empty() && c != b"..");
            if first != rel.is_empty() || (!first && (!under || rel.starts_with(b"/"))) {
                return false;
            }
            first = false;
            let now = match std::fs::metadata(root.join(std::ffi::OsStr::from_bytes(rel))) {
                Ok(md) if md.is_dir() => Walked::state_of(&md),
                _ => return false,
            };
            let was = state
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
            if !was.eq(now) {
                return false;
            }
            kept = &kept[4 + n + 48..];
        }
        !first
    }

    /// The inputs `files` (`None`: an input that is not a file, recorded as such) of something
    /// of `format` kept under `prefix`, shaped by the options `shape` says.
    fn from_files(
        format: Format,
        shape: &str,
        files: &[Option<PathBuf>],
        prefix: &str,
    ) -> Option<Inputs> {
        let dir = shared::index_dir()?;
        let mut blob = b"gpufeed node index 1\n".to_vec();
        blob.extend_from_slice(format.name().as_bytes());
        blob.extend_from_slice(shape.as_bytes());
        blob.extend_from_slice(&(files.len() as u64).to_le_bytes());
        let mut newest = i128::MIN;
        for input in files {
            let Some(p) = input else {
                blob.extend_from_slice(b"scanned");
                continue;
            };
            let md = std::fs::metadata(p).ok().filter(|m| m.is_file())?;
            for v in [
                md.dev(),
                md.ino(),
                md.size(),
                md.mtime() as u64,
                md.mtime_nsec() as u64,
                md.ctime() as u64,
                md.ctime_nsec() as u64,
            ] {
                blob.extend_from_slice(&v.to_le_bytes());
            }
            newest = newest.max(changed_at(&md));
        }
        Some(Inputs {
            format,
            name: Inputs::name_of(&blob, prefix),
            blob,
            dir,
            newest,
            root: None,
        })
    }

    /// The inputs of what a check of `files` (read as `format`) found, kept for the node
    /// ([`facts`](Self::facts)): `None` where sharing is off or a file cannot be examined.
    pub(crate) fn of_check(format: Format, files: &[&Path]) -> Option<Inputs> {
        if !cfg!(target_endian = "little") || !shared::enabled() {
            return None;
        }
        let files: Vec<Option<PathBuf>> = files.iter().map(|p| Some(p.to_path_buf())).collect();
        Inputs::from_files(format, "\nchecked\n", &files, "checked")
    }

    /// What a check of these very inputs found, as [`keep_facts`](Self::keep_facts) kept it,
    /// if it is there and whole; `None` otherwise (the check is then made).
    pub(crate) fn facts(&self) -> Option<Vec<u8>> {
        let (map, _, at) = self.kept()?;
        let b = (*map).as_ref();
        let facts = b.get(at[FLAGS].clone())?;
        let mut digests = vec![crc_of(&[&self.blob]), crc_of(&[facts])];
        for k in FLAGS + 1..KEYS {
            digests.push(crc_of(&[&b[at[k].clone()]]));
        }
        (checksum(&b[..8 + 16 * SECTIONS], &digests) == read_u32(b, 8 + 16 * SECTIONS)?)
            .then(|| facts.to_vec())
    }

    /// Keeps `facts`, what a check of these inputs found, for the node's later opens — if the
    /// files are as they were before the check and settled ([`SETTLE`]). Returns the file kept.
    pub(crate) fn keep_facts(&self, files: &[&Path], facts: &[u8]) -> Option<PathBuf> {
        let now = Inputs::of_check(self.format, files)?;
        if now.blob != self.blob || !self.settled() {
            return None;
        }
        let d = shared::private_dir(&self.dir)
            .map_err(|e| shared::say_private(&self.dir, &e))
            .ok()?;
        // Each unused section one empty part, as `facts` reads it back.
        let empty: &[&[u8]] = &[&[]];
        let mut parts: [&[&[u8]]; SECTIONS] = [empty; SECTIONS];
        let (blob, facts) = ([self.blob.as_slice()], [facts]);
        parts[INPUTS] = &blob;
        parts[FLAGS] = &facts;
        write(&d, &self.name, &parts)
            .map_err(|e| shared::say_private(&self.dir, &e))
            .ok()?;
        Some(self.file())
    }

    /// The node's file these inputs' index or record is kept in.
    pub(crate) fn file(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// Whether the files are settled enough to keep an index of them ([`SETTLE`]).
    fn settled(&self) -> bool {
        settled(self.newest)
    }

    /// Takes the lock on this index if no other process holds it (then this process builds
    /// it); else waits until the other lets go (at most [`WAIT`], saying so) and returns
    /// `None` — the other's index is then read, or each builds its own. `None` too where the
    /// files are too recent to keep an index of, or the lock cannot be had.
    pub(crate) fn lock(&self) -> Option<Building> {
        if !self.settled() {
            return None;
        }
        let d = shared::private_dir(&self.dir).ok()?;
        let lock = format!("{}.lock", self.name);
        let fd = nix::fcntl::openat(
            &d,
            lock.as_str(),
            OFlag::O_RDWR
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .ok()?;
        let st = nix::sys::stat::fstat(&fd).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        if crate::sys::ofd_try_lock(fd.as_fd(), 0, 1, false).ok()? {
            return Some(Building {
                fd,
                dir: d,
                name: lock,
            });
        }
        // Said once the wait is noticeable (a small folder's builder is done in milliseconds,
        // and then keeps nothing).
        let mut said = false;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < WAIT {
            std::thread::sleep(Duration::from_millis(if said { 50 } else { 5 }));
            if crate::sys::ofd_try_lock(fd.as_fd(), 0, 1, false).unwrap_or(true) {
                return None; // closing `fd` lets go of it
            }
            if !said && t0.elapsed() >= Duration::from_millis(500) {
                said = true;
                crate::util::notice(&format!(
                    "waiting for another process to finish indexing this dataset ({}; at most \
                     10 minutes, then indexing here too; GPUFEED_SHARED_INDEX=0 indexes in every \
                     process)",
                    self.file().display()
                ));
            }
        }
        crate::util::notice("still waiting after 10 minutes: indexing the dataset here too");
        None
    }

    /// The node's file kept under these inputs' name, mapped, with its device and inode and
    /// its sections' places — if there is one, its sections lie inside it and it was built
    /// from these very inputs (its checksums are the caller's to check).
    fn kept(&self) -> Option<(SharedBytes, (u64, u64), Sections)> {
        self.kept_in().map(|(m, i, at, _)| (m, i, at))
    }

    /// [`kept`](Self::kept), with the record of its check ([`CheckRecord`]).
    fn kept_in(&self) -> Option<(SharedBytes, (u64, u64), Sections, CheckRecord)> {
        if !self.dir.is_dir() {
            return None; // nothing kept (and nothing made here)
        }
        let d = shared::private_dir(&self.dir)
            .map_err(|e| shared::say_private(&self.dir, &e))
            .ok()?;
        let (map, identity, stamp) = map_file(&d, &self.dir, &self.name)?;
        let at = sections((*map).as_ref())?;
        let inputs = (*map).as_ref().get(at[INPUTS].clone())?;
        let same = match &self.root {
            Some(root) => inputs
                .strip_prefix(self.blob.as_slice())
                .is_some_and(|folders| Inputs::tree_unchanged(root, folders)),
            None => inputs == self.blob.as_slice(),
        };
        if !same {
            return None; // another dataset's, or these files' before they changed
        }
        let record = CheckRecord {
            name: format!("{}.ok.gpfidx", self.name.trim_end_matches(".gpfidx")),
            dir: d,
            stamp,
        };
        Some((map, identity, at, record))
    }

    /// The dataset as the node's index file holds it, if there is one built from these very
    /// inputs and it checks; `None` otherwise (the dataset is then indexed).
    pub(crate) fn load(&self, paths: &[PathBuf], opts: &OpenOptions) -> Option<Dataset> {
        let format = self.format;
        let (map, identity, at, record) = self.kept_in()?;
        // Checked whole once per node (its checksums, every sample inside its file), the check
        // recorded beside it: the node's other ranks, opening at once, wait for the first and
        // read its record (8 ranks each checked a 10⁷-sample table: 1.6–3.0 s each, where one
        // alone takes 0.35 s).
        let (checked, _checking) = record.checked_or_lock();
        let b = (*map).as_ref();
        let flags = b.get(at[FLAGS].clone()).filter(|f| f.len() == FLAGS_LEN)?;
        let count = |k: usize| read_u64(flags, 8 + 8 * k).and_then(|v| usize::try_from(v).ok());
        let (n, files, metas, classes, keys) =
            (count(0)?, count(1)?, count(2)?, count(3)?, count(4)?);
        let keys_crc = read_u32(flags, 48)?;
        let digests = if checked {
            Vec::new()
        } else {
            vec![
                crc_of(&[&b[at[INPUTS].clone()]]),
                crc_of(&[flags]),
                crc_of(&[&b[at[SIZES].clone()]]),
                crc_of(&[&b[at[FILE_FIRST].clone()]]),
                crc_of(&[&b[at[ENTRIES].clone()]]),
                strings_digest(&b[at[METAS].clone()], metas)?,
                strings_digest(&b[at[CLASSES].clone()], classes)?,
            ]
        };
        if !checked
            && checksum(&b[..8 + 16 * SECTIONS], &digests) != read_u32(b, 8 + 16 * SECTIONS)?
        {
            // Damaged: built anew, which takes as long as the first open did.
            crate::util::notice(&format!(
                "{}: the node's index is damaged (its checksum fails): the dataset is indexed \
                 anew and the index kept again",
                self.file().display()
            ));
            return None;
        }
        // An ImageFolder keeps no file: each sample is its own, named by its key.
        let want_files = if self.root.is_some() { 0 } else { paths.len() };
        if files != want_files || flags[0] > 1 || flags[1] > 1 || flags[2] > 2 || flags[3] > 1 {
            return None;
        }
        let sizes: Vec<u64> = b
            .get(at[SIZES].clone())
            .filter(|s| s.len() == 8 * files)?
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let first = b.get(at[FILE_FIRST].clone()).filter(|s| s.len() % 4 == 0)?;
        let file_first: Vec<u32> = first
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let unlabelled = flags[3] == 1;
        let samples = Samples::mapped(
            map.clone(),
            at[ENTRIES].clone(),
            file_first,
            unlabelled,
            &sizes,
            !checked,
        )
        .ok()?;
        // An ImageFolder's metadata section holds its notes (it has no metadata).
        let notes_kept = self.root.is_some();
        if samples.len() != n
            || (metas != n && metas != 0 && !notes_kept)
            || (keys != n && keys != 0)
        {
            return None;
        }
        let metas = Strings::mapped(map.clone(), at[METAS].clone(), metas).ok()?;
        let (metas, notes) = match notes_kept {
            true => {
                let notes = (0..metas.len())
                    .map(|i| String::from_utf8(metas.get(i).to_vec()).ok())
                    .collect::<Option<Vec<String>>>()?;
                (Strings::default(), notes)
            }
            false => (metas, Vec::new()),
        };
        let class_names = Strings::mapped(map.clone(), at[CLASSES].clone(), classes).ok()?;
        // The names' own bytes (an ImageFolder's folder names need not be UTF-8).
        let classes: Vec<String> = (0..class_names.len())
            .map(|i| String::from_utf8_lossy(class_names.get(i)).into_owned())
            .collect();
        let class_bytes: Vec<Vec<u8>> = match classes.iter().any(|c| c.contains('\u{FFFD}')) {
            true => (0..class_names.len())
                .map(|i| class_names.get(i).to_vec())
                .collect(),
            false => Vec::new(),
        };
        let file = self.file();
        let files = paths
            .iter()
            .zip(&sizes)
            .map(|(p, &s)| match format {
                Format::Megatron => data_file(&tokens::megatron_files(p).1, s),
                _ => data_file(p, s),
            })
            .collect();
        let mut ds = Dataset {
            metas,
            classes,
            class_bytes,
            notes,
            has_checksums: flags[0] == 1,
            frame: if flags[1] == 1 {
                Frame::TfRecord
            } else {
                Frame::None
            },
            in_shards: (flags[2] > 0).then_some(shard::InShards {
                images: flags[2] == 2,
            }),
            example: (format == Format::TfRecord)
                .then(|| opts.example_spec())
                .flatten(),
            ..Dataset::empty(format, files, samples)
        };
        if let Some(root) = &self.root {
            // Its keys are its files' names: checked now, and used from the mapping.
            let at = at[KEYS].clone();
            if keys != n || strings_digest(&b[at.clone()], keys) != Some(keys_crc) {
                return None;
            }
            ds.keys = Strings::mapped(map.clone(), at, keys).ok()?;
            // The root as this caller named it (the blob names it absolute, for every caller).
            let named = paths.first().map_or(root.as_path(), |p| p.as_path());
            ds.per_sample_root = Some(Arc::from(named));
        } else if keys > 0 {
            ds.lazy_keys = Some(LazyKeys {
                map: map.clone(),
                at: at[KEYS].clone(),
                count: keys,
                crc: keys_crc,
                file: file.clone(),
                identity,
            });
        }
        // A Megatron dataset's element type (its samples' tokens).
        if format == Format::Megatron {
            ds.tokens = tokens::megatron_layout(flags[4]);
        }
        ds.node_index = Some(file);
        if !checked {
            record.write();
        }
        Some(ds)
    }

    /// Keeps `ds` — just indexed from these inputs, with nothing wrong found — as the node's
    /// index, and reads it from there (its own copy freed). Returns whether it did; it does not
    /// for a small or computed index, one with problems or recovered samples, files that
    /// changed meanwhile or too recently, or where the file cannot be written (said once).
    /// An ImageFolder's `tree` is what its walk went through.
    pub(crate) fn store(
        &self,
        ds: &mut Dataset,
        paths: &[PathBuf],
        opts: &OpenOptions,
        tree: Option<&Tree>,
    ) -> bool {
        // An ImageFolder's notes (files that are not images, …) are kept with it: its tree says
        // them again at every open that uses the index.
        let clean = ds.problems_total == 0
            && ds.recovered.is_empty()
            && (ds.notes.is_empty() || (tree.is_some() && ds.metas.is_empty()));
        let newest = tree.map_or(self.newest, |t| t.newest.max(self.newest));
        if ds.samples.len() < shared::SHARED_MIN_SAMPLES || !clean || !settled(newest) {
            return false;
        }
        // The files as they are now: the same as before they were indexed.
        if Inputs::of(self.format, paths, opts).is_none_or(|now| now.blob != self.blob) {
            return false;
        }
        let blob = match (&self.root, tree) {
            (Some(root), Some(t)) => {
                let folders = Inputs::tree_bytes(t);
                if !Inputs::tree_unchanged(root, &folders) || !folder_times_trusted(root, t) {
                    return false;
                }
                [self.blob.as_slice(), &folders].concat()
            }
            (None, None) => self.blob.clone(),
            _ => return false,
        };
        let Some((entries, file_first)) = ds.samples.compact_parts() else {
            return false;
        };
        let mut notes = Strings::default();
        if tree.is_some() {
            for n in &ds.notes {
                if notes.push(n.as_bytes()).is_err() {
                    return false;
                }
            }
        }
        let metas = if tree.is_some() { &notes } else { &ds.metas };
        let (Some((me, mb)), Some((ke, kb))) = (owned(metas), owned(&ds.keys)) else {
            return false;
        };
        let mut class_names = Strings::default();
        for k in 0..ds.classes.len() {
            if class_names.push(ds.class_name_bytes(k)).is_err() {
                return false;
            }
        }
        let (ce, cb) = owned(&class_names).expect("built here");
        let mut flags = vec![
            ds.has_checksums as u8,
            (ds.frame == Frame::TfRecord) as u8,
            ds.in_shards.map_or(0, |s| 1 + s.images as u8),
            ds.samples.unlabelled() as u8,
            ds.tokens
                .and_then(|t| tokens::megatron_code(t.dtype))
                .unwrap_or(0),
        ];
        flags.resize(8, 0);
        for c in [
            ds.samples.len(),
            ds.files.len(),
            metas.len(),
            ds.classes.len(),
            ds.keys.len(),
        ] {
            flags.extend_from_slice(&(c as u64).to_le_bytes());
        }
        let keys_crc = crc_of(&[ke, kb]);
        flags.extend_from_slice(&(keys_crc as u64).to_le_bytes());
        let sizes: Vec<u8> = ds.files.iter().flat_map(|f| f.size.to_le_bytes()).collect();
        let first: Vec<u8> = file_first.iter().flat_map(|f| f.to_le_bytes()).collect();
        let parts: [&[&[u8]]; SECTIONS] = [
            &[&blob],
            &[&flags],
            &[&sizes],
            &[&first],
            &[entries],
            &[me, mb],
            &[ce, cb],
            &[ke, kb],
        ];
        let placed = shared::private_dir(&self.dir).and_then(|d| {
            write(&d, &self.name, &parts)?;
            map_file(&d, &self.dir, &self.name)
                .map(|(m, _, _)| m)
                .ok_or_else(|| std::io::Error::other("the file written is gone"))
        });
        let map = match placed {
            Ok(m) => m,
            Err(e) => {
                shared::say_private(&self.dir, &e);
                return false;
            }
        };
        let Some(at) = sections((*map).as_ref()) else {
            return false;
        };
        // Byte for byte what was built (another process may have replaced the file meanwhile).
        if !ds.samples.share(map.clone(), at[ENTRIES].clone()) {
            return false;
        }
        if tree.is_none() {
            ds.metas.share(map.clone(), at[METAS].clone());
        }
        ds.keys.share(map.clone(), at[KEYS].clone());
        ds.node_index = Some(self.file());
        true
    }
}

/// Strings' ends and bytes (an empty set has none), unless already mapped.
fn owned(s: &Strings) -> Option<(&[u8], &[u8])> {
    if s.is_empty() {
        return Some((&[], &[]));
    }
    s.owned_parts()
}

/// File systems whose folders' modification times change whenever an entry is added, removed
/// or renamed, as every process on the node sees them at once: local ones (ext2/3/4, XFS,
/// Btrfs, tmpfs, F2FS, ZFS, bcachefs) and cluster ones that keep POSIX times coherent (Lustre,
/// GPFS). Not FUSE mounts (object-store mounts report a folder's time fixed), NFS (attributes
/// cached for seconds to minutes), overlayfs (a lower layer's change is not its folders'), or
/// anything else.
const TRUSTED_FOLDER_TIMES: &[u64] = &[
    0xEF53,      // ext2/3/4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0x0102_1994, // tmpfs
    0xF2F5_2010, // F2FS
    0x2FC1_2FC1, // ZFS
    0xCA45_1A4E, // bcachefs
    0x0BD0_0BD0, // Lustre
    0x4750_4653, // GPFS
];

/// Whether every folder of an ImageFolder's walk is on a file system whose folder times can be
/// trusted to show a change ([`TRUSTED_FOLDER_TIMES`]): only then is its index kept, since a
/// later open trusts those times instead of listing the folders.
pub(crate) fn folder_times_trusted(root: &Path, tree: &Tree) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let mut seen: Vec<u64> = Vec::new();
    tree.folders.iter().all(|f| {
        let dev = f.state[0];
        if seen.contains(&dev) {
            return true;
        }
        seen.push(dev);
        trusted_fs(&root.join(std::ffi::OsStr::from_bytes(&f.rel)))
    })
}

/// Whether `path` is on a file system of [`TRUSTED_FOLDER_TIMES`].
fn trusted_fs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| TRUSTED_FOLDER_TIMES.contains(&(s.filesystem_type().0 as u64 & 0xFFFF_FFFF)))
}

/// Removes the node's index file `kept` (found stale by a reader), if it is still there.
pub(crate) fn forget(kept: &Path) {
    let (Some(dir), Some(name)) = (kept.parent(), kept.file_name()) else {
        return;
    };
    if let Ok(d) = shared::private_dir(dir) {
        let _ = nix::unistd::unlinkat(&d, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// Whether files whose latest change was at `newest` are settled enough to keep an index of
/// them ([`SETTLE`]).
fn settled(newest: i128) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    newest < now - SETTLE.as_nanos() as i128
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// crc32c of the parts one after another (each part's crc32c, then theirs).
fn crc_of(parts: &[&[u8]]) -> u32 {
    let crcs: Vec<u8> = parts
        .iter()
        .flat_map(|p| crate::util::crc32c(p).to_le_bytes())
        .collect();
    crate::util::crc32c(&crcs)
}

/// The checksum the header keeps: of the magic and the sections' table, and of every section
/// but the keys (checked when first asked for) by its digest ([`crc_of`] its parts).
fn checksum(table: &[u8], digests: &[u32]) -> u32 {
    let mut all = crate::util::crc32c(table).to_le_bytes().to_vec();
    for d in digests {
        all.extend_from_slice(&d.to_le_bytes());
    }
    crate::util::crc32c(&all)
}

/// The digest of a section of `count` strings: [`crc_of`] their ends and their bytes.
fn strings_digest(b: &[u8], count: usize) -> Option<u32> {
    let ends = count.checked_mul(4).filter(|&e| e <= b.len())?;
    Some(crc_of(&[&b[..ends], &b[ends..]]))
}

/// The sections' places, if the header is this format's and each lies inside the file,
/// 16-byte aligned, after the header.
fn sections(b: &[u8]) -> Option<[Range<usize>; SECTIONS]> {
    if b.get(..8)? != MAGIC || b.len() < HEADER {
        return None;
    }
    let mut at: [Range<usize>; SECTIONS] = Default::default();
    for (k, r) in at.iter_mut().enumerate() {
        let off = usize::try_from(read_u64(b, 8 + 16 * k)?).ok()?;
        let len = usize::try_from(read_u64(b, 16 + 16 * k)?).ok()?;
        let end = off.checked_add(len).filter(|&e| e <= b.len())?;
        if off < HEADER || !off.is_multiple_of(16) {
            return None;
        }
        *r = off..end;
    }
    // Nothing after the last section (the writer ends the file there).
    (at.iter().map(|r| r.end).max() == Some(b.len())).then_some(at)
}

/// The index file `name` in `d` (the directory `dir`), mapped, if it is a regular file of this
/// user's that only it can write (not a link, not waited on; `shared::untrusted`) at least a
/// header long.
fn map_file(d: &OwnedFd, dir: &Path, name: &str) -> Option<(SharedBytes, (u64, u64), Vec<u8>)> {
    let fd = nix::fcntl::openat(
        d,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .ok()?;
    let f = std::fs::File::from(fd);
    let md = f.metadata().ok()?;
    if let Some(why) = shared::untrusted(&md) {
        shared::say_untrusted(&dir.join(name), &why);
        return None;
    }
    if md.len() < HEADER as u64 {
        return None;
    }
    let len = usize::try_from(md.len()).ok()?;
    let m = crate::sys::FileMapping::of(f.as_fd(), len).ok()?;
    Some((Arc::new(m), (md.dev(), md.ino()), stamp_of(&md)))
}

/// What a kept file is, as its check record names it: a write or a chmod changes its times, a
/// replacement its inode.
fn stamp_of(md: &std::fs::Metadata) -> Vec<u8> {
    let mut stamp = CHECK_MAGIC.to_vec();
    for v in [
        md.dev(),
        md.ino(),
        md.size(),
        md.mtime() as u64,
        md.mtime_nsec() as u64,
        md.ctime() as u64,
        md.ctime_nsec() as u64,
    ] {
        stamp.extend_from_slice(&v.to_le_bytes());
    }
    stamp
}

/// A check record's first bytes.
const CHECK_MAGIC: &[u8; 8] = b"GPFCHK01";

/// The record that a node index file was checked whole (`NAME.ok.gpfidx` beside it): the
/// file's device, inode, size and modification and change times when it was. A later open of
/// the very same file (a rewrite changes its times, a replacement its inode) need not check it
/// again; the record is trusted as the index is (this user's, written by no one else, in the
/// private directory).
struct CheckRecord {
    dir: OwnedFd,
    name: String,
    stamp: Vec<u8>,
}

impl CheckRecord {
    /// Whether the record says this file was checked.
    fn holds(&self) -> bool {
        let Ok(fd) = nix::fcntl::openat(
            &self.dir,
            self.name.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) else {
            return false;
        };
        let f = std::fs::File::from(fd);
        if f.metadata()
            .ok()
            .is_none_or(|md| shared::untrusted(&md).is_some())
        {
            return false;
        }
        let mut got = vec![0u8; self.stamp.len() + 1];
        use std::os::unix::fs::FileExt;
        matches!(f.read_at(&mut got, 0), Ok(n) if n == self.stamp.len())
            && got[..self.stamp.len()] == self.stamp[..]
    }

    /// Whether the file was checked; if not, the record's lock, held while this process
    /// checks (a rank that waited on it finds the record written, and checks nothing). No
    /// lock where the record cannot be opened: each process checks.
    fn checked_or_lock(&self) -> (bool, Option<std::fs::File>) {
        if self.holds() {
            return (true, None);
        }
        let Ok(fd) = nix::fcntl::openat(
            &self.dir,
            self.name.as_str(),
            OFlag::O_RDWR
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NONBLOCK,
            Mode::from_bits_truncate(0o600),
        ) else {
            return (false, None);
        };
        let f = std::fs::File::from(fd);
        if f.metadata()
            .ok()
            .is_none_or(|md| shared::untrusted(&md).is_some())
        {
            return (false, None);
        }
        if crate::sys::ofd_lock(f.as_fd(), 0, 1, true).is_err() {
            return (false, None);
        }
        (self.holds(), Some(f))
    }

    /// Records that the file was checked (under the lock [`checked_or_lock`] took).
    fn write(&self) {
        let Ok(fd) = nix::fcntl::openat(
            &self.dir,
            self.name.as_str(),
            OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) else {
            return;
        };
        let f = std::fs::File::from(fd);
        if f.metadata()
            .ok()
            .is_none_or(|md| shared::untrusted(&md).is_some())
        {
            return;
        }
        use std::os::unix::fs::FileExt;
        let _ = f.set_len(0).and_then(|()| f.write_all_at(&self.stamp, 0));
    }
}

/// Writes the header and the sections (each of its parts one after another, 16-byte aligned)
/// to a new file, then renames it to `name` in `d` (whole or not at all, for every reader).
fn write(d: &OwnedFd, name: &str, parts: &[&[&[u8]]; SECTIONS]) -> std::io::Result<()> {
    shared::sweep(d);
    let (tmp, file) = shared::create_partial(d, name)?;
    let unlink = || {
        let _ = nix::unistd::unlinkat(d, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    };
    let mut head = vec![0u8; HEADER];
    head[..8].copy_from_slice(MAGIC);
    let mut at: [Range<usize>; SECTIONS] = Default::default();
    let mut off = HEADER;
    for (k, p) in parts.iter().enumerate() {
        let len: usize = p.iter().map(|x| x.len()).sum();
        at[k] = off..off + len;
        head[8 + 16 * k..16 + 16 * k].copy_from_slice(&(off as u64).to_le_bytes());
        head[16 + 16 * k..24 + 16 * k].copy_from_slice(&(len as u64).to_le_bytes());
        off = (off + len).next_multiple_of(16);
    }
    let digests: Vec<u32> = parts[..KEYS].iter().map(|p| crc_of(p)).collect();
    let crc = checksum(&head[..8 + 16 * SECTIONS], &digests);
    head[8 + 16 * SECTIONS..12 + 16 * SECTIONS].copy_from_slice(&crc.to_le_bytes());
    let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = (|| {
        f.write_all(&head)?;
        let mut pos = HEADER;
        for (k, p) in parts.iter().enumerate() {
            let pad = at[k].start - pos;
            f.write_all(&[0u8; 16][..pad])?;
            for x in p.iter() {
                f.write_all(x)?;
            }
            pos = at[k].end;
        }
        f.flush()
    })();
    if let Err(e) = written {
        unlink();
        return Err(std::io::Error::new(e.kind(), format!("{tmp}: {e}")));
    }
    drop(f);
    nix::fcntl::renameat(d, tmp.as_str(), d, name).map_err(|e| {
        unlink();
        std::io::Error::other(format!("cannot place {name}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Sample;

    /// An ImageFolder's index is kept only where folder times show every change: tmpfs yes,
    /// procfs (standing in for FUSE and NFS, which a test cannot mount) no.
    #[test]
    fn folder_times_are_trusted_on_local_file_systems_only() {
        if Path::new("/dev/shm").is_dir() {
            assert!(trusted_fs(Path::new("/dev/shm")));
        }
        assert!(!trusted_fs(Path::new("/proc/self")));
        assert!(!trusted_fs(Path::new("/nonexistent")));
    }

    /// A Megatron dataset of one sample per sequence, its `.bin` (sparse) 1.4 TB: kept and
    /// loaded back, every sample's 64-bit offset and the element type are the ones indexed.
    #[test]
    fn a_megatron_index_past_one_tib_loads_as_it_was_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (n, tokens) = (70_000u64, 10_000_000u64);
        let mut idx = b"MMIDIDX\0\0".to_vec();
        idx.extend_from_slice(&1u64.to_le_bytes());
        idx.push(4); // int32
        idx.extend_from_slice(&n.to_le_bytes());
        idx.extend_from_slice(&2u64.to_le_bytes());
        for _ in 0..n {
            idx.extend_from_slice(&(tokens as i32).to_le_bytes());
        }
        for i in 0..n {
            idx.extend_from_slice(&(i * 4 * tokens).to_le_bytes());
        }
        idx.extend_from_slice(&0u64.to_le_bytes());
        idx.extend_from_slice(&n.to_le_bytes());
        std::fs::write(dir.path().join("m.idx"), idx).unwrap();
        std::fs::File::create(dir.path().join("m.bin"))
            .unwrap()
            .set_len(n * 4 * tokens)
            .unwrap();
        let paths = vec![dir.path().join("m")];
        let opts = OpenOptions::default();
        let mut ds = tokens::open_megatron(&paths, &opts.tokens).unwrap();
        assert!(ds.samples().unlabelled());
        let want: Vec<Sample> = ds.samples().iter().collect();
        assert!(want[n as usize - 1].offset > 1 << 40);
        let mut inputs = Inputs::of(Format::Megatron, &paths, &opts).expect("inputs");
        inputs.dir = dir.path().join("index");
        inputs.newest = 0; // settled
        assert!(inputs.store(&mut ds, &paths, &opts, None));
        drop(ds);
        let loaded = inputs.load(&paths, &opts).expect("loads");
        assert!(loaded.samples().iter().eq(want.iter().copied()));
        assert_eq!(loaded.token_layout().map(|t| t.dtype), Some("int32"));
        assert!(loaded.file_path(0).ends_with("m.bin"));
        assert!(loaded.samples().heap_bytes() < 64);
        // Windows are computed: nothing of the kind is kept.
        let windows = OpenOptions {
            tokens: tokens::TokenOptions {
                seq_len: Some(100),
                ..Default::default()
            },
            ..OpenOptions::default()
        };
        assert!(Inputs::of(Format::Megatron, &paths, &windows).is_none());
    }

    /// A kept index that its group or others could write, or in a directory others can enter,
    /// is not used (issue 52 item 2: another user rewrote a `chmod 666` index under a rank that
    /// had mapped it); the next keep replaces it with one only its owner can read.
    /// A WebDataset of 70,000 samples over one sparse tar in `dir`, and the inputs of its
    /// index kept in `dir/index` (settled): what the kept-index tests store and load.
    fn kept_tar_dataset(dir: &Path) -> (Dataset, Inputs, Vec<PathBuf>) {
        let data = dir.join("a.tar");
        let n = 70_000usize;
        std::fs::File::create(&data)
            .unwrap()
            .set_len((n * 1100) as u64)
            .unwrap();
        let samples: Vec<Sample> = (0..n)
            .map(|i| Sample {
                file: 0,
                len: 10,
                offset: 1100 * i as u64,
                label: (i % 7) as i64,
                crc32c: 0,
            })
            .collect();
        let keys: Vec<String> = (0..n).map(|i| format!("s{i:06}")).collect();
        let files = vec![data_file(&data, (n * 1100) as u64)];
        let mut ds = Dataset::from_parts(files, samples, keys).unwrap();
        ds.format = Format::WebDataset;
        let paths = vec![data];
        let mut inputs =
            Inputs::of(Format::WebDataset, &paths, &OpenOptions::default()).expect("inputs");
        inputs.dir = dir.join("index");
        inputs.newest = 0; // settled
        (ds, inputs, paths)
    }

    #[test]
    fn a_kept_index_others_could_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (ds, inputs, paths) = kept_tar_dataset(dir.path());
        let make = || ds.clone();
        let opts = OpenOptions::default();
        assert!(inputs.store(&mut make(), &paths, &opts, None));
        let kept = inputs.dir.join(&inputs.name);
        let chmod = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        assert!(inputs.load(&paths, &opts).is_some());
        for mode in [0o666, 0o620, 0o602] {
            chmod(&kept, mode);
            assert!(inputs.load(&paths, &opts).is_none(), "mode {mode:o}");
        }
        chmod(&kept, 0o600);
        assert!(inputs.load(&paths, &opts).is_some());
        // A directory others can enter.
        chmod(&inputs.dir, 0o755);
        assert!(inputs.load(&paths, &opts).is_none());
        chmod(&inputs.dir, 0o700);
        // Kept again over the untrusted file: a new one, read-only to its owner.
        chmod(&kept, 0o666);
        assert!(inputs.store(&mut make(), &paths, &opts, None));
        let mode = std::fs::metadata(&kept).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
        assert!(inputs.load(&paths, &opts).is_some());
    }

    /// A kept index is checked whole once per node: the first load writes the record of its
    /// check, and a load of the very same file (device, inode, size, times) trusts it — so a
    /// record written for a file changed since is what hides a change, and none is: a file
    /// changed in place has other times, and is checked (and refused, said). A record others
    /// could write is not trusted (issue 52 item 12).
    #[test]
    fn a_kept_index_is_checked_once_and_its_record_names_the_very_file() {
        use std::os::unix::fs::{FileExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let (mut ds, inputs, paths) = kept_tar_dataset(dir.path());
        let opts = OpenOptions::default();
        assert!(inputs.store(&mut ds, &paths, &opts, None));
        let kept = inputs.dir.join(&inputs.name);
        let record = inputs
            .dir
            .join(inputs.name.replace(".gpfidx", ".ok.gpfidx"));
        assert!(inputs.load(&paths, &opts).is_some());
        assert!(record.exists(), "no record of the check");
        // Damaged in place (a sample's length in the entries): its times changed, so the
        // record does not cover it, and the check refuses it.
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o600)).unwrap();
        let at = sections(&std::fs::read(&kept).unwrap()).unwrap()[ENTRIES].start + 8;
        let f = std::fs::OpenOptions::new().write(true).open(&kept).unwrap();
        f.write_all_at(&[0xff], at as u64).unwrap();
        drop(f);
        assert!(
            inputs.load(&paths, &opts).is_none(),
            "a changed file was trusted"
        );
        // A record forged for the damaged file as it is now is trusted (the mechanism: the
        // record is all that stands for the check) — unless others could write it.
        let stamp = stamp_of(&std::fs::metadata(&kept).unwrap());
        std::fs::write(&record, &stamp).unwrap();
        std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            inputs.load(&paths, &opts).is_some(),
            "the record was not used"
        );
        std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert!(
            inputs.load(&paths, &opts).is_none(),
            "a record others could write was used"
        );
    }

    /// A dataset of 70,000 samples with keys over one file, kept as the node's index in a
    /// directory of its own, then that file damaged at 400 places and cut at 100 lengths: each
    /// load is refused or reads exactly the dataset kept (a flip in the header's unused bytes
    /// changes nothing; one in the keys leaves the samples usable and the keys unknown) —
    /// never a panic, never other samples.
    #[test]
    fn a_damaged_or_cut_index_is_refused_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("a.tar");
        let n = 70_000usize;
        // Sparse: as large as 70,000 tar members at least are.
        std::fs::File::create(&data)
            .unwrap()
            .set_len((n * 1100) as u64)
            .unwrap();
        let samples: Vec<Sample> = (0..n)
            .map(|i| Sample {
                file: 0,
                len: 10 + (i % 90) as u32,
                offset: 1100 * i as u64,
                label: (i % 1000) as i64,
                crc32c: 0,
            })
            .collect();
        let keys: Vec<String> = (0..n).map(|i| format!("d/s{i:06}")).collect();
        let files = vec![data_file(&data, (n * 1100) as u64)];
        let mut ds = Dataset::from_parts(files, samples.clone(), keys).unwrap();
        ds.format = Format::WebDataset;
        let paths = vec![data.clone()];
        let opts = OpenOptions::default();
        let mut inputs = Inputs::of(Format::WebDataset, &paths, &opts).expect("inputs");
        inputs.dir = dir.path().join("index");
        inputs.newest = 0; // settled
        assert!(inputs.store(&mut ds, &paths, &opts, None));
        let kept = inputs.dir.join(&inputs.name);
        assert_eq!(ds.node_index(), Some(kept.as_path()));
        let good = std::fs::read(&kept).unwrap();
        // Read-only as written; made writable here to damage it in place.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&kept).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o600)).unwrap();
        drop(ds);
        let same = |ds: &Dataset| ds.samples().iter().eq(samples.iter().copied());
        let loaded = inputs.load(&paths, &opts).expect("loads");
        assert!(same(&loaded));
        assert_eq!(loaded.key(n - 1), format!("d/s{:06}", n - 1));
        drop(loaded);

        // Where each byte is: in a section (which), or in the header's unused tail or padding.
        let at = sections(&good).unwrap();
        let keys = at[KEYS].clone();
        let checked =
            |i: usize| i < 8 + 16 * SECTIONS + 4 || at[..KEYS].iter().any(|r| r.contains(&i));
        let mut rng = crate::rng::Rng::new(7);
        let mut seen = [0; 3];
        for k in 0..400 {
            // Half in the header and the small sections before the table, half anywhere.
            let i = if k % 2 == 0 {
                rng.below(1024) as usize
            } else {
                rng.below(good.len() as u64) as usize
            };
            let mut bad = good.clone();
            bad[i] ^= 1 << rng.below(8);
            std::fs::write(&kept, &bad).unwrap();
            let got = inputs.load(&paths, &opts);
            if checked(i) {
                assert!(got.is_none(), "byte {i} flipped: used");
                seen[0] += 1;
                continue;
            }
            let ds =
                got.unwrap_or_else(|| panic!("byte {i} flipped outside every section: refused"));
            assert!(same(&ds), "byte {i} flipped: other samples read");
            if keys.contains(&i) {
                assert!(
                    ds.key(n / 2).starts_with("a.tar#"),
                    "byte {i}: damaged keys read"
                );
                seen[1] += 1;
            } else {
                assert_eq!(ds.key(n / 2), format!("d/s{:06}", n / 2));
                seen[2] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c > 0), "{seen:?}");
        for k in 0..100 {
            let len = (good.len() as u64 * k / 100) as usize;
            std::fs::write(&kept, &good[..len]).unwrap();
            assert!(inputs.load(&paths, &opts).is_none(), "cut at {len}");
        }
        // Bytes appended: refused.
        std::fs::write(&kept, [&good[..], b"x"].concat()).unwrap();
        assert!(inputs.load(&paths, &opts).is_none());
        // Another dataset's inputs, or these files changed: not used.
        std::fs::write(&kept, &good).unwrap();
        let mut other = Inputs::of(Format::WebDataset, &paths, &opts).unwrap();
        other.dir = inputs.dir.clone();
        other.name = inputs.name.clone();
        other.blob.push(0);
        assert!(other.load(&paths, &opts).is_none());
        assert!(inputs.load(&paths, &opts).is_some_and(|d| same(&d)));
    }
}
