//! The node-wide cache of a remote dataset's extents (issue 25, being built): so far, the
//! eviction policies and their replay over an epoch's order (`policy`).

pub(crate) mod policy;
