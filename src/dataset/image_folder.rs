//! A directory of class folders holding the samples (torchvision's ImageFolder layout):
//! `root/<class>/…/<file>`. Classes sorted by name give labels 0, 1, …; within a class, its
//! folders (the class folder and every folder under it, links followed) sorted by path, and each
//! folder's files sorted by name — torchvision's `find_classes` and `make_dataset` order, names
//! compared as Python compares them. Every file is its own [`DataFile`](super::DataFile), made
//! from the root and the sample's key (`class/…/file`, the names' own bytes) when asked for:
//! no path is kept per image.
//!
//! As in torchvision, only files with an image extension are samples: a file that is not an
//! image never becomes one because of its folder. Other files are skipped with a note; files of
//! another dataset format (tars, TFRecords, shards, token files) in the class folders make the
//! tree ambiguous, and opening it is refused with what was found and the `format` to name —
//! unless `image-folder` was named explicitly. Where torchvision would go wrong without a word
//! this says so: an image that cannot be opened (a dangling link, a FIFO named `x.jpg`) is a
//! [problem](super::Dataset::problems) named with its path, not the end of the open; a folder
//! linked inside itself is walked once, with a note; images in the root itself (in no class)
//! and class folders without an image are noted.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::snapshot::changed_at;
use super::{Dataset, Format, Sample, Strings};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::util::Unpoison;

/// Extensions of image files (torchvision's `IMG_EXTENSIONS`), compared without case.
pub const IMAGE_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

/// Whether a file name ends with an image extension (torchvision's `has_file_allowed_extension`:
/// `name.lower().endswith(".jpg")`, …; no extension letter has a non-ASCII capital that Python
/// lowers to it, so ASCII case folding is the same test). `.jpg` alone is one.
fn is_image_name(name: &[u8]) -> bool {
    IMAGE_EXTENSIONS.iter().any(|e| {
        let n = name.len();
        n > e.len()
            && name[n - e.len() - 1] == b'.'
            && name[n - e.len()..].eq_ignore_ascii_case(e.as_bytes())
    })
}

/// The order Python sorts these names (or `/`-joined paths) in — as `str`s, code point by code
/// point, a byte that is not UTF-8 being the lone surrogate U+DC80..U+DCFF `os.fsdecode` makes
/// of it — which is the order torchvision gives classes, folders and files. For UTF-8 names it is
/// the bytes' order.
pub(crate) fn py_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    if std::str::from_utf8(a).is_ok() && std::str::from_utf8(b).is_ok() {
        return a.cmp(b);
    }
    fn points(b: &[u8]) -> impl Iterator<Item = u32> + '_ {
        b.utf8_chunks().flat_map(|c| {
            c.valid()
                .chars()
                .map(|ch| ch as u32)
                .chain(c.invalid().iter().map(|&x| 0xDC00 + x as u32))
        })
    }
    points(a).cmp(points(b))
}

/// The dataset format a file's extension names, if any (for the ambiguity check).
fn other_format(ext: &str) -> Option<&'static str> {
    Some(match ext {
        "tar" => "webdataset",
        "tfrecord" | "tfrecords" | "tfr" => "tfrecord",
        "gpf" => "packed",
        "idx" | "bin" => "megatron or tokens",
        _ => return None,
    })
}

/// A folder walked: its path under the root (`class/sub`, the names' bytes) and which folder
/// it is and how it stood (device, inode, modification and change times): what a kept index
/// of the tree is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Walked {
    pub rel: Vec<u8>,
    pub state: [u64; 6],
}

impl Walked {
    pub(crate) fn state_of(md: &std::fs::Metadata) -> [u64; 6] {
        [
            md.dev(),
            md.ino(),
            md.mtime() as u64,
            md.mtime_nsec() as u64,
            md.ctime() as u64,
            md.ctime_nsec() as u64,
        ]
    }
}

/// What the walk of an ImageFolder found beside its samples: every folder walked, the root
/// first, and the latest modification or change time among them and the images (nanoseconds).
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub folders: Vec<Walked>,
    pub newest: i128,
}

fn list(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::io("cannot list directory", e).with_path(dir.to_path_buf()))?
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::io("cannot list directory", e).with_path(dir.to_path_buf()))?;
    v.sort_by(|a, b| py_cmp(a.file_name().as_bytes(), b.file_name().as_bytes()));
    Ok(v)
}

/// Whether a listed entry is a folder, links followed (Python's `DirEntry.is_dir()`).
fn is_dir(e: &std::fs::DirEntry) -> bool {
    match e.file_type() {
        Ok(t) if t.is_dir() => true,
        Ok(t) if t.is_symlink() => std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir()),
        Ok(_) => false,
        Err(_) => std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir()),
    }
}

/// The walk's tallies: folders walked, files that are not images, links back up the tree.
struct Walker<'a> {
    root: &'a Path,
    tree: Tree,
    skipped: std::collections::BTreeMap<String, u64>,
    loops: Vec<PathBuf>,
}

impl Walker<'_> {
    /// Walks folder `rel` (under the root) and every folder under it, links followed, each
    /// folder once along any one path (`above`: the folders it is inside); appends each folder
    /// walked with its files' names to `out`.
    fn visit(
        &mut self,
        rel: Vec<u8>,
        above: &mut Vec<(u64, u64)>,
        out: &mut Vec<(Arc<Folder>, Vec<OsString>)>,
    ) -> Result<()> {
        let path = self.root.join(OsStr::from_bytes(&rel));
        let md = std::fs::metadata(&path)
            .map_err(|e| Error::io("cannot stat", e).with_path(path.clone()))?;
        let id = (md.dev(), md.ino());
        if above.contains(&id) {
            self.loops.push(path);
            return Ok(());
        }
        self.tree.folders.push(Walked {
            rel: rel.clone(),
            state: Walked::state_of(&md),
        });
        self.tree.newest = self.tree.newest.max(changed_at(&md));
        let mut files = Vec::new();
        let mut subs = Vec::new();
        for e in list(&path)? {
            if is_dir(&e) {
                subs.push(e.file_name());
            } else {
                files.push(e.file_name());
            }
        }
        out.push((
            Arc::new(Folder {
                path,
                rel: rel.clone(),
            }),
            files,
        ));
        above.push(id);
        for s in subs {
            let mut r = rel.clone();
            r.push(b'/');
            r.extend_from_slice(s.as_bytes());
            self.visit(r, above, out)?;
        }
        above.pop();
        Ok(())
    }
}

/// A folder of the tree: its path, and its path under the root (what keys are made of).
pub(crate) struct Folder {
    path: PathBuf,
    rel: Vec<u8>,
}

/// Indexes an ImageFolder directory; `explicit`: the format was named, so files of other
/// formats are skipped like any non-image file instead of making the tree ambiguous. Returns
/// the folders the walk went through too (what an index kept for the node is checked against).
pub(crate) fn open_tree(root: &Path, explicit: bool) -> Result<(Dataset, Tree)> {
    let root_md = std::fs::metadata(root)
        .map_err(|e| Error::io("cannot stat", e).with_path(root.to_path_buf()))?;
    let mut w = Walker {
        root,
        tree: Tree::default(),
        skipped: Default::default(),
        loops: Vec::new(),
    };
    w.tree.folders.push(Walked {
        rel: Vec::new(),
        state: Walked::state_of(&root_md),
    });
    w.tree.newest = changed_at(&root_md);
    let class_dirs = list(root)?;
    // ImageNet's 1.28 M files take a while to list and stat on a cold disk: a progress line if
    // it is still going after 2 s.
    let mut prog = crate::progress::Task::items_after(
        format!("listing {}", root.display()),
        class_dirs.len() as u64,
        "folders",
        std::time::Duration::from_secs(2),
    );
    // Listed here (names, and the entry's type where the file system gives it: a stat only for
    // links) while stat workers take each class's images as soon as it is listed: on a cold
    // disk each stat waits for an inode read, and overlapping them with each other and with the
    // listing is what keeps a 100 K-file folder's open time near a plain listing's.
    let mut statter = Statter::default();
    let (mut classes, mut class_bytes) = (Vec::new(), Vec::new());
    let (mut in_root, mut empty) = (0u64, Vec::new());
    for (k, class_dir) in class_dirs.into_iter().enumerate() {
        prog.set(k as u64);
        let name = class_dir.file_name();
        if !is_dir(&class_dir) {
            in_root += is_image_name(name.as_bytes()) as u64;
            continue;
        }
        let label = classes.len() as i64;
        let mut folders = Vec::new();
        // The root counts as above every class: a link back to it is a loop too.
        let mut above = vec![(root_md.dev(), root_md.ino())];
        w.visit(name.as_bytes().to_vec(), &mut above, &mut folders)?;
        // torchvision: `sorted(os.walk(class_dir, followlinks=True))`, by the folders' paths.
        folders.sort_by(|a, b| py_cmp(&a.0.rel, &b.0.rel));
        let mut found = Vec::new();
        for (folder, names) in folders {
            for name in names {
                if is_image_name(name.as_bytes()) {
                    found.push(Found {
                        dir: folder.clone(),
                        label,
                        name,
                    });
                } else {
                    let ext = Path::new(&name)
                        .extension()
                        .map(|x| x.to_string_lossy().to_lowercase())
                        .unwrap_or_default();
                    *w.skipped.entry(ext).or_default() += 1;
                }
            }
        }
        let class = name.to_string_lossy().into_owned();
        if found.is_empty() {
            empty.push(class.clone());
        }
        statter.push(found);
        classes.push(class);
        class_bytes.push(name.as_bytes().to_vec());
    }
    prog.finish();
    let mut samples = Vec::new();
    let mut keys = Strings::default();
    let mut key = Vec::new();
    let (mut problems, mut problems_total) = (Vec::new(), 0u64);
    let mut problem = |e: Error| {
        problems_total += 1;
        if problems.len() < super::PROBLEMS_KEPT {
            problems.push(e);
        }
    };
    for (Found { dir, label, name }, meta) in statter.finish() {
        let path = || dir.path.join(&name);
        let meta = match meta {
            Err(e) => {
                problem(Error::io("cannot open the image", e).with_path(path()));
                continue;
            }
            Ok(m) if !m.is_file => {
                problem(
                    Error::new(
                        ErrorKind::InvalidInput,
                        "not a regular file (named like an image: a FIFO, socket or device)",
                    )
                    .with_path(path()),
                );
                continue;
            }
            Ok(m) => m,
        };
        let Ok(len) = u32::try_from(meta.len) else {
            problem(invalid("sample file larger than 4 GiB").with_path(path()));
            continue;
        };
        w.tree.newest = w.tree.newest.max(meta.newest);
        let file = u32::try_from(samples.len()).map_err(|_| invalid("more than 2^32 files"))?;
        samples.push(Sample {
            file,
            len,
            offset: 0,
            label,
            crc32c: 0,
        });
        key.clear();
        key.extend_from_slice(&dir.rel);
        key.push(b'/');
        key.extend_from_slice(name.as_bytes());
        keys.push(&key)?;
    }
    let Walker {
        tree,
        skipped,
        loops,
        ..
    } = w;
    let listed = |m: &std::collections::BTreeMap<String, u64>| -> String {
        let v: Vec<String> = m
            .iter()
            .map(|(e, n)| {
                let e = if e.is_empty() { "(none)" } else { e.as_str() };
                format!("{n} × .{e}")
            })
            .collect();
        v.join(", ")
    };
    let others: std::collections::BTreeMap<&str, u64> = skipped
        .iter()
        .filter_map(|(e, n)| other_format(e).map(|f| (f, *n)))
        .fold(Default::default(), |mut m, (f, n)| {
            *m.entry(f).or_default() += n;
            m
        });
    if !explicit && !others.is_empty() {
        let formats: Vec<String> = others
            .iter()
            .map(|(f, n)| format!("{n} {f} file(s)"))
            .collect();
        return Err(invalid(format!(
            "ambiguous directory: its subfolders hold {} image file(s) and {} ({}); name the \
             format: --format tfrecord / webdataset / packed / tokens search the directory \
             recursively, --format image-folder reads only the images (Python and C: the \
             format option)",
            samples.len(),
            formats.join(", "),
            listed(&skipped)
        ))
        .with_path(root.to_path_buf()));
    }
    if samples.is_empty() {
        if let Some(first) = problems.into_iter().next() {
            return Err(first);
        }
        let found = if skipped.is_empty() {
            String::new()
        } else {
            format!(" (found {}, none of them images)", listed(&skipped))
        };
        return Err(invalid(format!(
            "no samples: expected .gpf shards, tars, TFRecords, or class folders of images \
             ({}){found}",
            IMAGE_EXTENSIONS.join(", ")
        ))
        .with_path(root.to_path_buf()));
    }
    let mut notes = Vec::new();
    if !skipped.is_empty() {
        notes.push(format!(
            "{}: {} file(s) that are not images were skipped ({})",
            root.display(),
            skipped.values().sum::<u64>(),
            listed(&skipped)
        ));
    }
    if in_root > 0 {
        notes.push(format!(
            "{}: {in_root} image file(s) in the folder itself are in no class folder: not \
             samples (as in torchvision)",
            root.display()
        ));
    }
    if !empty.is_empty() {
        let some: Vec<&str> = empty.iter().take(5).map(String::as_str).collect();
        notes.push(format!(
            "{}: {} class folder(s) hold no image ({}{}): their labels are kept, so later \
             classes' do not shift (torchvision's ImageFolder refuses them unless allow_empty)",
            root.display(),
            empty.len(),
            some.join(", "),
            if empty.len() > 5 { ", …" } else { "" }
        ));
    }
    for l in loops.iter().take(5) {
        notes.push(format!(
            "{}: a link back to a folder it is inside: walked once, not again under it",
            l.display()
        ));
    }
    // The names' bytes only where one is not UTF-8 (the text is theirs otherwise).
    if class_bytes.iter().all(|b| std::str::from_utf8(b).is_ok()) {
        class_bytes.clear();
    }
    let ds = Dataset {
        keys,
        classes,
        class_bytes,
        notes,
        problems,
        problems_total,
        per_sample_root: Some(Arc::from(root)),
        ..Dataset::empty(Format::ImageFolder, Vec::new(), samples.into())
    };
    Ok((ds, tree))
}

/// An image file listed, before its size is known: its folder (shared by the folder's files)
/// and name — an ImageNet's 1.28 M of them are held at once while the open lasts.
struct Found {
    dir: Arc<Folder>,
    label: i64,
    name: std::ffi::OsString,
}

/// What the open needs of a file's `stat` (not the whole `Metadata`, 1.28 M times over).
struct Stat {
    is_file: bool,
    len: u64,
    /// The later of its modification and change times (nanoseconds since 1970).
    newest: i128,
}

type Stated = Vec<(Found, std::io::Result<Stat>)>;
type Job = (usize, Vec<Found>);
type Done = (usize, Stated);

/// Stats listed files on up to [`STAT_THREADS`] worker threads while the caller lists more:
/// [`push`](Statter::push) hands over one folder's files, [`finish`](Statter::finish) gives every
/// file with its metadata in the order pushed.
#[derive(Default)]
struct Statter {
    work: Option<std::sync::mpsc::Sender<Job>>,
    queue: Option<std::sync::Arc<std::sync::Mutex<std::sync::mpsc::Receiver<Job>>>>,
    done: Option<(
        std::sync::mpsc::Sender<Done>,
        std::sync::mpsc::Receiver<Done>,
    )>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Folders pushed (their order), and those stat'ed here (no thread could start).
    pushed: usize,
    inline: Vec<Done>,
}

/// Stat threads at most: more did not help on a virtio disk (about 0.55 s for 100 K cold inodes
/// with 16 threads, as with 64; 1.0–1.3 s with one).
const STAT_THREADS: usize = 16;

fn stat_each(files: Vec<Found>) -> Stated {
    files
        .into_iter()
        .map(|f| {
            let m = std::fs::metadata(f.dir.path.join(&f.name)).map(|m| Stat {
                is_file: m.is_file(),
                len: m.len(),
                newest: changed_at(&m),
            });
            (f, m)
        })
        .collect()
}

impl Statter {
    fn push(&mut self, files: Vec<Found>) {
        let k = self.pushed;
        self.pushed += 1;
        if files.is_empty() {
            return;
        }
        // One more worker per folder pushed, up to the limit (a small folder starts one).
        if self.threads.len() < STAT_THREADS {
            self.spawn();
        }
        match &self.work {
            Some(tx) if !self.threads.is_empty() => {
                if let Err(e) = tx.send((k, files)) {
                    let (k, files) = e.0;
                    self.inline.push((k, stat_each(files)));
                }
            }
            _ => self.inline.push((k, stat_each(files))),
        }
    }

    /// Starts one more worker (none if the system refuses a thread: the caller stats then).
    fn spawn(&mut self) {
        if self.work.is_none() {
            let (tx, rx) = std::sync::mpsc::channel();
            self.work = Some(tx);
            self.queue = Some(std::sync::Arc::new(std::sync::Mutex::new(rx)));
            self.done = Some(std::sync::mpsc::channel());
        }
        let (Some(queue), Some((out, _))) = (self.queue.clone(), self.done.as_ref()) else {
            return;
        };
        let out = out.clone();
        let t = std::thread::Builder::new()
            .name("gpufeed-stat".into())
            .spawn(move || loop {
                let job = queue.lock().unpoisoned().recv();
                let Ok((k, files)) = job else { return };
                if out.send((k, stat_each(files))).is_err() {
                    return;
                }
            });
        if let Ok(t) = t {
            self.threads.push(t);
        }
    }

    /// Every file pushed, with its metadata, in the order pushed.
    fn finish(mut self) -> impl Iterator<Item = (Found, std::io::Result<Stat>)> {
        self.work = None; // the workers end once the queue is empty
        let mut parts = std::mem::take(&mut self.inline);
        if let Some((out, results)) = self.done.take() {
            drop(out);
            parts.extend(results.iter());
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        parts.sort_by_key(|(k, _)| *k);
        parts.into_iter().flat_map(|(_, v)| v)
    }
}
