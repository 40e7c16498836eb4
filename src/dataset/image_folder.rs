//! A directory of class folders holding one file per sample (torchvision's ImageFolder layout):
//! `root/<class>/<file>`. Classes sorted by name give labels 0, 1, …; files are sorted by name
//! within their class. Every file is its own [`DataFile`](super::DataFile): the small-files
//! baseline.

use std::path::Path;

use super::{data_file, Dataset, Format, Sample, Strings};
use crate::error::{invalid, Error, Result};

/// Indexes an ImageFolder directory.
pub fn open(root: &Path) -> Result<Dataset> {
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
    for class_dir in list(root)? {
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
    if samples.is_empty() {
        return Err(
            invalid("no samples: expected .gpf shards or class folders of files")
                .with_path(root.to_path_buf()),
        );
    }
    Ok(Dataset {
        keys,
        classes,
        ..Dataset::empty(Format::ImageFolder, files, samples)
    })
}
