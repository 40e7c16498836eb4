//! A directory of class folders holding one file per sample (torchvision's ImageFolder layout):
//! `root/<class>/<file>`. Classes sorted by name give labels 0, 1, …; files are sorted by name
//! within their class. Every file is its own [`DataFile`](super::DataFile) (the small-files
//! baseline), made from the root and the sample's key (`class/file`, the names' own bytes) when
//! asked for: no path is kept per image.
//!
//! As in torchvision, only files with an image extension are samples: a file that is not an
//! image never becomes one because of its folder. Other files are skipped with a note; files of
//! another dataset format (tars, TFRecords, shards, token files) in the class folders make the
//! tree ambiguous, and opening it is refused with what was found and the `format` to name —
//! unless `image-folder` was named explicitly.

use std::path::Path;

use std::sync::Arc;

use super::{Dataset, Format, Sample, Strings};
use crate::error::{invalid, Error, Result};
use crate::util::Unpoison;

/// Extensions of image files (torchvision's `IMG_EXTENSIONS`), compared without case.
pub const IMAGE_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

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

/// Indexes an ImageFolder directory; `explicit`: the format was named, so files of other
/// formats are skipped like any non-image file instead of making the tree ambiguous.
pub fn open(root: &Path, explicit: bool) -> Result<Dataset> {
    let list = |dir: &Path| -> Result<Vec<std::fs::DirEntry>> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| Error::io("cannot list directory", e).with_path(dir.to_path_buf()))?
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io("cannot list directory", e).with_path(dir.to_path_buf()))?;
        v.sort_by_key(|e| e.file_name());
        Ok(v)
    };
    let mut samples = Vec::new();
    let mut keys = Strings::default();
    let mut classes = Vec::new();
    // The class folders' names as the file system has them (the keys are made of these).
    let mut class_names = Vec::new();
    // Extension → files skipped, for the note or the ambiguity error.
    let mut skipped: std::collections::BTreeMap<String, u64> = Default::default();
    let class_dirs = list(root)?;
    // ImageNet's 1.28 M files take a while to list and stat on a cold disk: a progress line if
    // it is still going after 2 s.
    let mut prog = crate::progress::Task::items_after(
        format!("listing {}", root.display()),
        class_dirs.len() as u64,
        "folders",
        std::time::Duration::from_secs(2),
    );
    // Listed here (names, and the entry's type where the file system gives it: no stat) while
    // stat workers take each class folder's images as soon as it is listed: on a cold disk each
    // stat waits for an inode read, and overlapping them with each other and with the listing
    // is what keeps a 100 K-file folder's open time near a plain listing's.
    let mut statter = Statter::default();
    for (k, class_dir) in class_dirs.into_iter().enumerate() {
        prog.set(k as u64);
        let ft = class_dir
            .file_type()
            .map_err(|e| Error::io("cannot stat", e).with_path(class_dir.path()))?;
        if !ft.is_dir() {
            continue;
        }
        let label = classes.len() as i64;
        let mut found = Vec::new();
        let dir: Arc<Path> = class_dir.path().into();
        for f in list(&dir)? {
            if f.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = f.path();
            let ext = path
                .extension()
                .map(|x| x.to_string_lossy().to_lowercase())
                .unwrap_or_default();
            if !IMAGE_EXTENSIONS.contains(&ext.as_str()) {
                // Counted only if it is a file (torchvision skips the rest silently).
                if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                    *skipped.entry(ext).or_default() += 1;
                }
                continue;
            }
            found.push(Found {
                dir: dir.clone(),
                label,
                name: f.file_name(),
            });
        }
        statter.push(found);
        classes.push(class_dir.file_name().to_string_lossy().into_owned());
        class_names.push(class_dir.file_name());
    }
    prog.finish();
    for (Found { dir, label, name }, meta) in statter.finish() {
        let meta = meta.map_err(|e| Error::io("cannot stat", e).with_path(dir.join(&name)))?;
        if !meta.is_file {
            continue;
        }
        let len = u32::try_from(meta.len)
            .map_err(|_| invalid("sample file larger than 4 GiB").with_path(dir.join(&name)))?;
        let file = u32::try_from(samples.len()).map_err(|_| invalid("more than 2^32 files"))?;
        samples.push(Sample {
            file,
            len,
            offset: 0,
            label,
            crc32c: 0,
        });
        use std::os::unix::ffi::OsStrExt;
        let mut key = class_names[label as usize].as_bytes().to_vec();
        key.push(b'/');
        key.extend_from_slice(name.as_bytes());
        keys.push(&key)?;
    }
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
    Ok(Dataset {
        keys,
        classes,
        notes,
        per_sample_root: Some(Arc::from(root)),
        ..Dataset::empty(Format::ImageFolder, Vec::new(), samples.into())
    })
}

/// An image file listed, before its size is known: its folder (shared by the folder's files)
/// and name — an ImageNet's 1.28 M of them are held at once while the open lasts.
struct Found {
    dir: Arc<Path>,
    label: i64,
    name: std::ffi::OsString,
}

/// What the open needs of a file's `stat` (not the whole `Metadata`, 1.28 M times over).
struct Stat {
    is_file: bool,
    len: u64,
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
            let m = std::fs::metadata(f.dir.join(&f.name)).map(|m| Stat {
                is_file: m.is_file(),
                len: m.len(),
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
