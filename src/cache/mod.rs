//! The node-wide cache of a remote dataset's extents: the cache itself (`node`, feature
//! `remote`), the engine's gate to it (`gate`), and the eviction policies with their replay over
//! epochs' orders (`policy`), which decided that the cache keeps what fits; and the cache's
//! directory tree, reached without following links (`tree`).

#[cfg(feature = "remote")]
pub(crate) mod gate;
#[cfg(feature = "remote")]
pub(crate) mod node;
pub(crate) mod policy;
#[cfg(feature = "remote")]
pub(crate) mod tree;

#[cfg(feature = "remote")]
pub use node::{
    absent_bytes, default_dir, flush_all, CacheCounters, CachedObject, NodeCache, OpenMode,
    EXTENT_BYTES_DEFAULT, EXTENT_BYTES_MAX, EXTENT_BYTES_MIN,
};

/// Threads that wait on the store at once (fetches, a remote open's walks and index GETs).
pub(crate) const FETCH_THREADS: usize = 16;
