//! Where a dataset's files' bytes come from: the local file system, or — a remote dataset's
//! files being its objects' copies in the node cache — the cached object each copy stands for,
//! which fetches what is not on disk yet. The dataset holds its [`Sources`] and hands them to
//! whatever reads its files (indexing, checks, the loader's gate); nothing asks a process-wide
//! registry which object a file is.

use std::path::Path;

use super::tar::TarWalk;
use super::SourceFile;
use crate::error::{Error, Result};

/// See the module documentation. Cheap to clone (shared maps).
#[derive(Clone, Default)]
pub(crate) struct Sources {
    /// Each node-cache data file's object, by the data file's path.
    #[cfg(feature = "remote")]
    objects: std::sync::Arc<std::collections::HashMap<std::path::PathBuf, Entry>>,
}

/// A data file's object, and for a tar the index kept beside it in the store (`NAME.gpfidx`).
#[cfg(feature = "remote")]
#[derive(Clone)]
struct Entry {
    obj: std::sync::Arc<crate::cache::CachedObject>,
    beside: Option<crate::remote::ObjectInfo>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[cfg(feature = "remote")]
        return write!(f, "Sources({} cached objects)", self.objects.len());
        #[cfg(not(feature = "remote"))]
        f.write_str("Sources(local)")
    }
}

impl Sources {
    /// Local files, read as they are.
    pub fn local() -> Sources {
        Sources::default()
    }

    /// A remote dataset's: each data file's cached object, with the index kept beside it in
    /// the store where there is one.
    #[cfg(feature = "remote")]
    pub fn remote(
        objects: impl IntoIterator<
            Item = (
                std::sync::Arc<crate::cache::CachedObject>,
                Option<crate::remote::ObjectInfo>,
            ),
        >,
    ) -> Sources {
        Sources {
            objects: std::sync::Arc::new(
                objects
                    .into_iter()
                    .map(|(obj, beside)| (obj.data_path().to_path_buf(), Entry { obj, beside }))
                    .collect(),
            ),
        }
    }

    /// The dataset these sources serve is open: the stores' waits are no longer bounded by
    /// the open's timeout.
    #[cfg(feature = "remote")]
    pub(crate) fn opened(&self) {
        for e in self.objects.values() {
            e.obj.store().opened();
        }
    }

    /// `e`, the error of reading `path` while the dataset was being opened — or, where `path`
    /// is a remote object that is no longer the version listed (replaced or deleted meanwhile:
    /// one HEAD), an error saying so that fails the open ([`changed_under_open`]): its reads
    /// failed because it changed, not because it is damaged, and a dataset opened without its
    /// samples would lose them without cause (the trial's 200 samples, "did the file
    /// shrink?").
    pub(crate) fn changed_or(&self, path: &Path, e: Error) -> Error {
        #[cfg(feature = "remote")]
        if let Some(o) = self.objects.get(path) {
            let listed = o.obj.info();
            let now = match o.obj.store().now(listed) {
                Ok(now) => now,
                Err(_) => return e,
            };
            if now.as_ref() == Some(listed) {
                return e;
            }
            let what = match now {
                None => "it was deleted".to_string(),
                Some(n) => format!(
                    "now {} bytes{}, listed as {} bytes{}",
                    n.size,
                    n.etag.map(|t| format!(" ETag {t}")).unwrap_or_default(),
                    listed.size,
                    listed
                        .etag
                        .as_ref()
                        .map(|t| format!(" ETag {t}"))
                        .unwrap_or_default()
                ),
            };
            return Error::new(
                crate::ErrorKind::Io,
                format!(
                    "{}: the object changed while the dataset was being opened ({what}):                      open the dataset again to read it as it is now",
                    listed.url
                ),
            )
            .with_source(ChangedUnderOpen);
        }
        let _ = path;
        e
    }

    /// The cached object whose node-cache copy `path` is, if it is one.
    #[cfg(feature = "remote")]
    pub fn object(&self, path: &Path) -> Option<&std::sync::Arc<crate::cache::CachedObject>> {
        self.objects.get(path).map(|o| &o.obj)
    }

    /// Whether any file is a remote object's copy.
    pub fn is_remote(&self) -> bool {
        #[cfg(feature = "remote")]
        return !self.objects.is_empty();
        #[cfg(not(feature = "remote"))]
        false
    }

    /// Opens `path` for small reads: a remote object's copy fetches what it lacks.
    pub fn open(&self, path: &Path) -> std::io::Result<SourceFile> {
        #[cfg(feature = "remote")]
        return SourceFile::open_as(path, self.object(path).cloned());
        #[cfg(not(feature = "remote"))]
        SourceFile::open_as(path)
    }

    /// A tar's walk: a remote tar's from the index kept for it where one describes this
    /// version (in the node cache, else beside it in the store), else walked here.
    pub fn walk_tar(&self, path: &Path) -> Result<TarWalk> {
        #[cfg(feature = "remote")]
        if let Some(o) = self.objects.get(path) {
            return super::remote::walk_remote(path, &o.obj, o.beside.as_ref(), self);
        }
        super::tar::walk_tar(path, self)
    }

    /// A note (`PATH: what`), naming a remote object by its URL where `PATH` is the object's
    /// node-cache copy (each `: ` tried, as the cache's own directory may hold one).
    #[cfg(feature = "remote")]
    pub fn named_note(&self, note: String) -> String {
        for (at, _) in note.match_indices(": ") {
            if let Some(o) = self.objects.get(Path::new(&note[..at])) {
                return format!("{}{}", o.obj.info().url, &note[at..]);
            }
        }
        note
    }

    /// `path` as messages show it: a remote object's URL for its node-cache copy.
    pub fn shown(&self, path: &Path) -> String {
        #[cfg(feature = "remote")]
        if let Some(o) = self.objects.get(path) {
            return o.obj.info().url.clone();
        }
        crate::error::shown(path)
    }

    /// `e`, naming a remote object by its URL where it names the object's node-cache copy.
    pub fn named(&self, e: Error) -> Error {
        #[cfg(feature = "remote")]
        if let Some(o) = e.path().and_then(|p| self.objects.get(p)) {
            let url = o.obj.info().url.clone();
            return e.shown_as(url);
        }
        e
    }
}

/// Marks an error of [`Sources::changed_or`]: an object replaced while the dataset was being
/// opened. Such an error fails the open, where a damaged file would be a problem costing its
/// own samples.
#[derive(Debug)]
pub(crate) struct ChangedUnderOpen;

impl std::fmt::Display for ChangedUnderOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("changed under the open")
    }
}

impl std::error::Error for ChangedUnderOpen {}

/// Whether `e` is (or was caused by) an object replaced while the dataset was being opened.
pub(crate) fn changed_under_open(e: &Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if c.is::<ChangedUnderOpen>() {
            return true;
        }
        cur = c.source();
    }
    false
}
