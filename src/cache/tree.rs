//! The node cache's directory tree, reached only through a descriptor of its root.
//!
//! The cache directory is shared by every rank and often by several users, so what lies in it
//! is not trusted to be what gpufeed put there. Every directory and file below the root is
//! opened relative to its parent's descriptor, one component at a time, without following a
//! link (`openat` with `O_NOFOLLOW`), and checked to be what it must be: a directory, or a
//! regular file with one link. A link, a FIFO, a device or a hard link planted in the tree is
//! refused with its path named, never written through; removal unlinks entries (a planted link
//! is removed, not followed). So nothing outside the cache is ever written, truncated or
//! deleted by it.
//!
//! Directories are made 0700 and files 0600 — unless the root has the set-group-ID bit (the
//! documented way for a node's users to share one cache: `mkdir -m 2770 DIR; chgrp GROUP DIR`),
//! where they are made 2770 and 0660 whatever the umask.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, Mode, SFlag};

use crate::error::{Error, ErrorKind, Result};

/// The cache's root directory, held open.
#[derive(Debug)]
pub(crate) struct Tree {
    root: OwnedFd,
    path: PathBuf,
    shared: bool,
}

/// What kind of entry a `stat` mode is, in words.
fn kind_of(mode: u32) -> &'static str {
    match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFREG => "a file",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR | SFlag::S_IFBLK => "a device",
        _ => "an unknown kind of entry",
    }
}

/// A refused entry: `path` is `found` where the cache needs `wanted`.
fn refused(path: &Path, found: &str, wanted: &str) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "{} is {found} where the node cache keeps {wanted}; a cache holds no links or \
             foreign entries (something other than gpufeed put it there): refused, nothing \
             was written",
            path.display()
        ),
    )
}

/// Says once per process that a cache file was not trusted, and why.
fn say_untrusted(path: &Path, why: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        crate::util::notice(&format!(
            "{}: {why}: not used (a file the cache makes is made anew in its place; said once)",
            path.display()
        ))
    });
}

/// Whether this process is in group `gid` (its effective group `my_gid`, or a supplementary
/// one).
fn in_group(gid: libc::gid_t, my_gid: libc::gid_t) -> bool {
    if gid == my_gid {
        return true;
    }
    // SAFETY: a size of 0 asks only for the count; nothing is written.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if count <= 0 {
        return false;
    }
    let mut groups = vec![0 as libc::gid_t; count as usize];
    // SAFETY: the buffer holds `groups.len()` entries, which is what the call is told.
    let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

impl Tree {
    /// Opens the directory `path` (which exists; the root itself may be reached through a
    /// link, as the user named it).
    pub fn open(path: &Path) -> Result<Tree> {
        let root = nix::fcntl::open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            Error::io("cannot open the cache directory", e.into()).with_path(path.to_path_buf())
        })?;
        let st = fstat(&root).map_err(|e| {
            Error::io("cannot stat the cache directory", e.into()).with_path(path.to_path_buf())
        })?;
        // Writable by every user (a 1777 scratch directory): anyone on the node could make the
        // directories below it and put there what the cache then serves (the trial did, with
        // a kept index). A cache is private, or shared with a group through a set-group-ID root.
        if st.st_mode & libc::S_IWOTH != 0 {
            return Err(Error::new(
                crate::error::ErrorKind::PermissionDenied,
                format!(
                    "{} is writable by every user (mode {:o}): another user could change what a \
                     node cache there serves; use a directory of your own (the default, \
                     ~/.cache/gpufeed/objects, is 0700), or one shared with a group: mkdir -m \
                     2770 DIR && chgrp GROUP DIR",
                    path.display(),
                    st.st_mode & 0o7777
                ),
            ));
        }
        let shared = st.st_mode & libc::S_ISGID != 0;
        // Owned by another user (not root): its owner could replace what is below it at any
        // time. A group-shared root (set-group-ID) may be anyone's in the group.
        // SAFETY: geteuid and getegid cannot fail and touch no memory of ours.
        let (me, my_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if st.st_uid != me && st.st_uid != 0 && !(shared && in_group(st.st_gid, my_gid)) {
            return Err(Error::new(
                crate::error::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to user {}, not to this one ({me}): its owner could change what \
                     a node cache there serves; use a directory of your own, or one shared with \
                     a group this user is in: mkdir -m 2770 DIR && chgrp GROUP DIR",
                    path.display(),
                    st.st_uid
                ),
            ));
        }
        Ok(Tree {
            root,
            path: path.to_path_buf(),
            shared,
        })
    }

    /// The root's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root's descriptor.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    fn dir_mode(&self) -> Mode {
        if self.shared {
            Mode::from_bits_truncate(0o2770)
        } else {
            Mode::from_bits_truncate(0o700)
        }
    }

    fn file_mode(&self) -> Mode {
        if self.shared {
            Mode::from_bits_truncate(0o660)
        } else {
            Mode::from_bits_truncate(0o600)
        }
    }

    /// The path of `comps` below the root, for messages and for readers that open by path.
    pub fn join(&self, comps: &[&str]) -> PathBuf {
        let mut p = self.path.clone();
        p.extend(comps);
        p
    }

    /// What `name` in `dir` is, without following it (`None`: nothing there).
    fn lstat_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<Option<libc::stat>> {
        match fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The directory `comps` below the root (made, each level, if `create`): `None` when a level
    /// is missing and `create` is false.
    pub fn dir(&self, comps: &[&str], create: bool) -> Result<Option<OwnedFd>> {
        let mut cur: Option<OwnedFd> = None;
        for (k, name) in comps.iter().enumerate() {
            let parent = cur.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
            let here = || self.join(&comps[..=k]);
            let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
            let fd = match openat(parent, *name, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if create => {
                    match mkdirat(parent, *name, self.dir_mode()) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => {
                            return Err(Error::io("cannot create a cache directory", e.into())
                                .with_path(here()))
                        }
                    }
                    let fd = openat(parent, *name, flags, Mode::empty())
                        .map_err(|e| self.explain(parent, name, e, "a directory", &here()))?;
                    if self.shared {
                        // The umask took the group's bits off; a shared cache needs them.
                        let _ = fchmod(&fd, self.dir_mode());
                    }
                    fd
                }
                Err(Errno::ENOENT) => return Ok(None),
                Err(e) => return Err(self.explain(parent, name, e, "a directory", &here())),
            };
            cur = Some(fd);
        }
        Ok(Some(match cur {
            Some(fd) => fd,
            None => self.root.try_clone().map_err(|e| {
                Error::io("cannot duplicate a descriptor", e).with_path(self.path.clone())
            })?,
        }))
    }

    /// Why opening `name` in `parent` as `wanted` failed with `e`, in words.
    fn explain(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        e: Errno,
        wanted: &str,
        path: &Path,
    ) -> Error {
        if matches!(
            e,
            Errno::ELOOP | Errno::ENOTDIR | Errno::EISDIR | Errno::ENXIO
        ) {
            if let Ok(Some(st)) = Self::lstat_at(parent, name) {
                return refused(path, kind_of(st.st_mode), wanted);
            }
        }
        Error::io("cannot open a cache entry", e.into()).with_path(path.to_path_buf())
    }

    /// The regular file `name` in the directory `comps` (created empty, with the directories
    /// above it, if `create`), opened with `flags` (`O_RDONLY`/`O_RDWR`, `O_DIRECT`…): `None`
    /// when it (or a directory above it) is missing and `create` is false. Anything but a
    /// regular file with one link is refused.
    pub fn file(
        &self,
        comps: &[&str],
        name: &str,
        flags: OFlag,
        create: bool,
    ) -> Result<Option<File>> {
        self.file_replacing(comps, name, flags, create, true)
    }

    /// [`file`](Self::file); `replace`: an untrusted file may be made anew (once: one made
    /// untrusted again meanwhile is refused).
    fn file_replacing(
        &self,
        comps: &[&str],
        name: &str,
        flags: OFlag,
        create: bool,
        replace: bool,
    ) -> Result<Option<File>> {
        let Some(dir) = self.dir(comps, create)? else {
            return Ok(None);
        };
        let path = || {
            let mut p = self.join(comps);
            p.push(name);
            p
        };
        // O_NONBLOCK: opening a FIFO planted here must not wait for a writer.
        let base = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let fd = match openat(&dir, name, base, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if create => {
                match openat(
                    &dir,
                    name,
                    base | OFlag::O_CREAT | OFlag::O_EXCL,
                    self.file_mode(),
                ) {
                    Ok(fd) => {
                        if self.shared {
                            let _ = fchmod(&fd, self.file_mode());
                        }
                        fd
                    }
                    // Made by another opener meanwhile.
                    Err(Errno::EEXIST) => openat(&dir, name, base, Mode::empty())
                        .map_err(|e| self.explain(dir.as_fd(), name, e, "a file", &path()))?,
                    Err(e) => return Err(self.explain(dir.as_fd(), name, e, "a file", &path())),
                }
            }
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(self.explain(dir.as_fd(), name, e, "a file", &path())),
        };
        let st = fstat(&fd)
            .map_err(|e| Error::io("cannot stat a cache file", e.into()).with_path(path()))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(refused(&path(), kind_of(st.st_mode), "a file"));
        }
        if st.st_nlink != 1 {
            return Err(refused(
                &path(),
                &format!("a file with {} hard links", st.st_nlink),
                "a file of its own",
            ));
        }
        if let Some(why) = self.untrusted(&st) {
            // Whoever could write it could change what the cache serves (a mapped state file,
            // a kept listing or tar index): not used. One the caller makes is made anew in its
            // place; one it only reads is absent.
            drop(fd);
            say_untrusted(&path(), &why);
            if !create {
                return Ok(None);
            }
            if !replace {
                return Err(refused(
                    &path(),
                    &format!("a file {why}"),
                    "a file of its own",
                ));
            }
            nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
                .map_err(|e| Error::io("cannot remove", e.into()).with_path(path()))?;
            return self.file_replacing(comps, name, flags, create, false);
        }
        // O_NONBLOCK stays: it has no effect on a regular file's reads and writes.
        Ok(Some(File::from(fd)))
    }

    /// Why a file of the cache (`st`) is not to be trusted, if it is not: writable by every
    /// user; or, in a cache that is not group-shared, another user's or writable by its group.
    fn untrusted(&self, st: &libc::stat) -> Option<String> {
        // SAFETY: geteuid cannot fail and touches no memory of ours.
        let me = unsafe { libc::geteuid() };
        let mode = st.st_mode & 0o7777;
        if st.st_mode & libc::S_IWOTH != 0 {
            Some(format!("writable by every user (mode {mode:o})"))
        } else if !self.shared && st.st_mode & libc::S_IWGRP != 0 {
            Some(format!(
                "writable by its group (mode {mode:o}) in a cache that is not group-shared"
            ))
        } else if !self.shared && st.st_uid != me {
            Some(format!(
                "owned by user {}, not this one ({me}), in a cache that is not group-shared",
                st.st_uid
            ))
        } else {
            None
        }
    }

    /// The bytes of the regular file `name` in the directory `comps` (at most `max`; `None` if
    /// it is missing).
    pub fn read(&self, comps: &[&str], name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        use std::io::Read;
        let Some(f) = self.file(comps, name, OFlag::O_RDONLY, false)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        f.take(max.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| Error::io("cannot read", e).with_path(self.join(comps).join(name)))?;
        if out.len() as u64 > max {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{} is over {max} bytes",
                    self.join(comps).join(name).display()
                ),
            ));
        }
        Ok(Some(out))
    }

    /// Makes the file `name` in the directory `comps` (made if missing) hold `bytes`, replacing
    /// it whole (written under another name, then renamed over it).
    pub fn write_whole(&self, comps: &[&str], name: &str, bytes: &[u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        static NTH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = format!(
            ".{name}.new.{}.{}",
            std::process::id(),
            NTH.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let dir = self.dir(comps, true)?.expect("made");
        let path = self.join(comps).join(name);
        let f = self.file(comps, &tmp, OFlag::O_RDWR, true)?.expect("made");
        let r = f
            .write_all_at(bytes, 0)
            .and_then(|()| f.sync_data())
            .and_then(|()| {
                nix::fcntl::renameat(&dir, tmp.as_str(), &dir, name).map_err(io::Error::from)
            });
        if r.is_err() {
            let _ =
                nix::unistd::unlinkat(&dir, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
        r.map_err(|e| Error::io("cannot write", e).with_path(path))
    }

    /// The names in the root, without `.` and `..`.
    pub fn root_names(&self) -> Result<Vec<String>> {
        let fd = self.dir(&[], false)?.expect("the root exists");
        names(fd).map_err(|e| {
            Error::io("cannot list the cache directory", e).with_path(self.path.clone())
        })
    }

    /// Removes `name` in the root and everything below it, without following a link (a link is
    /// removed itself). Nothing there is fine.
    pub fn remove_all(&self, name: &str) -> Result<()> {
        remove_at(self.root.as_fd(), name, &self.path.join(name))
    }
}

/// The names in the directory `fd` (consumed), without `.` and `..`.
pub(crate) fn names(fd: OwnedFd) -> io::Result<Vec<String>> {
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        let n = e.file_name().to_string_lossy().into_owned();
        if n != "." && n != ".." {
            out.push(n);
        }
    }
    Ok(out)
}

/// Removes `name` in `dir`, recursively if it is a directory, without following links.
fn remove_at(dir: BorrowedFd<'_>, name: &str, path: &Path) -> Result<()> {
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let err = |e: Errno| Error::io("cannot remove", e.into()).with_path(path.to_path_buf());
    let Some(st) = Tree::lstat_at(dir, name).map_err(|e| Error::io("cannot stat", e))? else {
        return Ok(());
    };
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let sub = openat(
            dir,
            name,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        let list = sub
            .try_clone()
            .and_then(names)
            .map_err(|e| Error::io("cannot list", e).with_path(path.to_path_buf()))?;
        for n in list {
            remove_at(sub.as_fd(), &n, &path.join(&n))?;
        }
        match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(err(e)),
        }
    } else {
        match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }
}

/// An object key component as a file name, injectively: ASCII letters, digits, `-`, `_`, `.`
/// (not first) and every non-ASCII byte stay; every other byte becomes `%XX`; an empty
/// component becomes `%` (which escaping never makes). Distinct keys get distinct paths.
pub(crate) fn escape_component(part: &str) -> String {
    if part.is_empty() {
        return "%".into();
    }
    let mut out = String::with_capacity(part.len());
    for (i, ch) in part.char_indices() {
        let keep = !ch.is_ascii()
            || ch.is_ascii_alphanumeric()
            || matches!(ch, '-' | '_' | '+' | '=' | ',' | '@')
            || (ch == '.' && i > 0);
        if keep {
            out.push(ch);
        } else {
            out.push_str(&format!("%{:02X}", ch as u32));
        }
    }
    out
}

/// The longest escaped component kept whole as a file name: what is longer is cut and given a
/// hash, so a name (and the `.NAME.new.PID.N` it is written as first) stays under the 255
/// bytes a file system allows.
const NAME_WHOLE_MAX: usize = 200;
/// The bytes of a cut name kept before its hash.
const NAME_CUT_KEEP: usize = 150;

/// A key component as a file name, injectively: [`escape_component`], or, past
/// [`NAME_WHOLE_MAX`] bytes, the first bytes of that, `%~` and the MD5 of the whole component
/// in hex. Escaping never makes `%~` (its `%` is always followed by two hex digits, or alone),
/// so a cut name is never a whole one; two components with one MD5 would share a name, and the
/// state file's URL, checked at every open, refuses the second rather than serve it.
pub(crate) fn component_name(part: &str) -> String {
    use md5::Digest;
    let e = escape_component(part);
    if e.len() <= NAME_WHOLE_MAX {
        return e;
    }
    // Cut at a character boundary and before a `%XX` it would split.
    let mut cut = NAME_CUT_KEEP;
    while !e.is_char_boundary(cut) {
        cut -= 1;
    }
    if let Some(p) = e.as_bytes()[cut - 2..cut].iter().rposition(|&b| b == b'%') {
        cut = cut - 2 + p;
    }
    let mut out = e[..cut].to_string();
    out.push_str("%~");
    for b in md5::Md5::digest(part.as_bytes()) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The file name of an object key's *directory* component: [`component_name`] and `%`. No
/// object's file name ends in `%` but the empty key's `%` itself, so an object `p.tar` and the
/// objects under `p.tar/` (both legal keys) get a file and a directory of different names.
pub(crate) fn dir_component_name(part: &str) -> String {
    component_name(part) + "%"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long components are cut under the file-name limit with a hash; an object's name and a
    /// directory's never meet; every name is distinct from every other.
    #[test]
    fn names_stay_under_the_limit_and_files_never_meet_directories() {
        use md5::Digest;
        let long_a = "a".repeat(300);
        let long_b = "a".repeat(299) + "b";
        let long_pct = ":".repeat(100); // 300 bytes escaped
        let long_uni = "ü".repeat(120); // 240 bytes, cut inside no character
        let edge = "x".repeat(149) + ":" + &"y".repeat(100);
        let euro = "€".repeat(100); // 3-byte characters: the cut looks back inside one
        let parts = [
            "p.tar", "", "%", "x%7E", "q", &long_a, &long_b, &long_pct, &long_uni, &edge, &euro,
        ];
        let mut seen = std::collections::HashMap::new();
        for part in parts {
            for (kind, name) in [
                ("file", component_name(part)),
                ("dir", dir_component_name(part)),
            ] {
                assert!(
                    ".".len() + name.len() + ".new.4294967295.18446744073709551615".len() <= 255,
                    "{kind} {part:?} → {} bytes",
                    name.len()
                );
                assert!(!name.starts_with('.') && !name.contains('/'), "{name:?}");
                if let Some(other) = seen.insert(name.clone(), (kind, part)) {
                    panic!("{kind} {part:?} and {other:?} both became {name:?}");
                }
            }
        }
        assert_eq!(component_name("p.tar"), "p.tar");
        assert_eq!(dir_component_name("p.tar"), "p.tar%");
        // The cut kept whole characters and whole escapes.
        assert!(component_name(&long_uni).starts_with(&"ü".repeat(75)));
        let cut = component_name(&edge);
        assert!(cut.starts_with(&("x".repeat(149) + "%~")), "{cut}");
        assert!(component_name(&long_pct).starts_with(&"%3A".repeat(50)));
        // The MD5 of the component (RFC 1321's test vector for "a").
        assert!(component_name(&("a".repeat(201))).len() == 150 + 2 + 32);
        assert_eq!(
            md5::Md5::digest(b"a")
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            "0cc175b9c0f1b6a831c399e269772661"
        );
    }

    #[test]
    fn escaping_is_injective_on_the_keys_that_collided() {
        let keys = [
            "x:y.tar",
            "x_y.tar",
            "x%3Ay.tar",
            "pct%41.tar",
            "pctA.tar",
            "uni-ü.tar",
            "",
            "%",
            ".",
            "..",
            ".hidden",
            "%2E",
            "a b",
            "a+b",
        ];
        let mut seen = std::collections::HashMap::new();
        for k in keys {
            let e = escape_component(k);
            assert!(
                !e.is_empty() && e != "." && e != ".." && !e.contains('/'),
                "{k:?} → {e:?}"
            );
            assert!(!e.starts_with('.'), "{k:?} → {e:?}");
            if let Some(other) = seen.insert(e.clone(), k) {
                panic!("{k:?} and {other:?} both became {e:?}");
            }
        }
        assert_eq!(escape_component("uni-ü.tar"), "uni-ü.tar");
        assert_eq!(escape_component("x:y.tar"), "x%3Ay.tar");
        assert_eq!(escape_component("pct%41.tar"), "pct%2541.tar");
    }

    /// A root another user owns is refused (its owner could swap what it serves), unless it is
    /// a group-shared (set-group-ID) root of a group this user is in. Needs root to chown.
    #[test]
    fn a_root_owned_by_another_user_is_refused_unless_shared_with_our_group() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: chown to another user needs root");
            return;
        }
        let base = std::env::temp_dir().join(format!("gpufeed-owner-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("cache");
        std::fs::create_dir_all(&root).unwrap();
        Tree::open(&root).unwrap();
        std::os::unix::fs::chown(&root, Some(12345), None).unwrap();
        let e = Tree::open(&root).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("belongs to user 12345"), "{e}");
        // Shared with our group: another member's root is used.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o2770)).unwrap();
        // SAFETY: getegid cannot fail.
        let gid = unsafe { libc::getegid() };
        std::os::unix::fs::chown(&root, None, Some(gid)).unwrap();
        assert!(Tree::open(&root).unwrap().shared);
        // Shared with a group we are not in: refused.
        std::os::unix::fs::chown(&root, None, Some(54321)).unwrap();
        assert!(Tree::open(&root).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A cache file others could write (or, in a cache not shared with a group, its group) is
    /// not trusted (issue 52's rule for kept files): read, it is absent; made, it is made anew,
    /// private. In a group-shared cache a group-writable file is the rule.
    #[test]
    fn files_others_could_write_are_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let chmod = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        let root = base.path().join("cache");
        std::fs::create_dir(&root).unwrap();
        let tree = Tree::open(&root).unwrap();
        tree.write_whole(&["listing"], "x", b"kept").unwrap();
        let at = root.join("listing/x");
        for mode in [0o666, 0o620, 0o602] {
            chmod(&at, mode);
            assert_eq!(tree.read(&["listing"], "x", 100).unwrap(), None, "{mode:o}");
            chmod(&at, 0o600);
            assert_eq!(
                tree.read(&["listing"], "x", 100).unwrap().as_deref(),
                Some(&b"kept"[..])
            );
        }
        chmod(&at, 0o666);
        let f = tree
            .file(&["listing"], "x", OFlag::O_RDWR, true)
            .unwrap()
            .unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0, "made anew");
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        // Shared with a group: group-writable is how its files are; writable by all is not.
        let shared = base.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        chmod(&shared, 0o2770);
        let tree = Tree::open(&shared).unwrap();
        tree.write_whole(&["listing"], "x", b"kept").unwrap();
        let at = shared.join("listing/x");
        chmod(&at, 0o660);
        assert!(tree.read(&["listing"], "x", 100).unwrap().is_some());
        chmod(&at, 0o662);
        assert!(tree.read(&["listing"], "x", 100).unwrap().is_none());
    }

    #[test]
    fn links_fifos_and_hard_links_are_refused_and_nothing_outside_is_touched() {
        let base = std::env::temp_dir().join(format!("gpufeed-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("cache");
        std::fs::create_dir_all(&root).unwrap();
        let outside = base.join("victim");
        std::fs::write(&outside, b"precious").unwrap();
        let tree = Tree::open(&root).unwrap();
        // A link where a file goes.
        std::fs::create_dir_all(root.join("data/s3")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("data/s3/x.tar")).unwrap();
        let e = tree
            .file(&["data", "s3"], "x.tar", OFlag::O_RDWR, true)
            .unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        // A link where a directory goes.
        std::os::unix::fs::symlink(&base, root.join("data/s3/b")).unwrap();
        let e = tree
            .file(&["data", "s3", "b"], "victim", OFlag::O_RDWR, true)
            .unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        // A FIFO, and a hard link to a file outside.
        nix::unistd::mkfifo(&root.join("data/s3/f.tar"), Mode::from_bits_truncate(0o600)).unwrap();
        let e = tree
            .file(&["data", "s3"], "f.tar", OFlag::O_RDWR, true)
            .unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        std::fs::hard_link(&outside, root.join("data/s3/h.tar")).unwrap();
        let e = tree
            .file(&["data", "s3"], "h.tar", OFlag::O_RDWR, true)
            .unwrap_err();
        assert!(e.to_string().contains("hard links"), "{e}");
        // Removal unlinks the links themselves.
        tree.remove_all("data").unwrap();
        assert!(!root.join("data").exists());
        assert_eq!(std::fs::read(&outside).unwrap(), b"precious");
        assert!(base.join("cache").is_dir());
        // A new file is private.
        let f = tree
            .file(&["state"], "y", OFlag::O_RDWR, true)
            .unwrap()
            .unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        let d = std::fs::metadata(root.join("state")).unwrap();
        assert_eq!(d.permissions().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
