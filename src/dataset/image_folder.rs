//! A directory of class folders holding one file per sample (torchvision's ImageFolder layout):
//! `root/<class>/<file>`. Classes sorted by name give labels 0, 1, …; files are sorted by name
//! within their class. Every file is its own [`DataFile`](super::DataFile): the small-files
//! baseline.
//!
//! As in torchvision, only files with an image extension are samples: a file that is not an
//! image never becomes one because of its folder. Other files are skipped with a note; files of
//! another dataset format (tars, TFRecords, shards, token files) in the class folders make the
//! tree ambiguous, and opening it is refused with what was found and the `format` to name —
//! unless `image-folder` was named explicitly.

use std::path::Path;

use super::{data_file, Dataset, Format, Sample, Strings};
use crate::error::{invalid, Error, Result};

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
    let mut files = Vec::new();
    let mut samples = Vec::new();
    let mut keys = Strings::default();
    let mut classes = Vec::new();
    // Extension → files skipped, for the note or the ambiguity error.
    let mut skipped: std::collections::BTreeMap<String, u64> = Default::default();
    let class_dirs = list(root)?;
    // ImageNet's 1.28 M files take a while to list and stat on a cold disk: a progress line if
    // it is still going after 2 s.
    let mut prog = crate::util::Progress::items_after(
        format!("listing {}", root.display()),
        class_dirs.len() as u64,
        "folders",
        std::time::Duration::from_secs(2),
    );
    for (k, class_dir) in class_dirs.into_iter().enumerate() {
        prog.set(k as u64);
        let ft = class_dir
            .file_type()
            .map_err(|e| Error::io("cannot stat", e).with_path(class_dir.path()))?;
        if !ft.is_dir() {
            continue;
        }
        let label = classes.len() as i64;
        let class = class_dir.file_name().to_string_lossy().into_owned();
        for f in list(&class_dir.path())? {
            let path = f.path();
            let meta = std::fs::metadata(&path)
                .map_err(|e| Error::io("cannot stat", e).with_path(path.clone()))?;
            if !meta.is_file() {
                continue;
            }
            let ext = path
                .extension()
                .map(|x| x.to_string_lossy().to_lowercase())
                .unwrap_or_default();
            if !IMAGE_EXTENSIONS.contains(&ext.as_str()) {
                *skipped.entry(ext).or_default() += 1;
                continue;
            }
            let len = u32::try_from(meta.len())
                .map_err(|_| invalid("sample file larger than 4 GiB").with_path(path.clone()))?;
            let file = u32::try_from(files.len()).map_err(|_| invalid("more than 2^32 files"))?;
            files.push(data_file(&path, meta.len()));
            samples.push(Sample {
                file,
                len,
                offset: 0,
                label,
                crc32c: 0,
            });
            keys.push(format!("{class}/{}", f.file_name().to_string_lossy()).as_bytes())?;
        }
        classes.push(class);
    }
    prog.finish();
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
        ..Dataset::empty(Format::ImageFolder, files, samples)
    })
}
