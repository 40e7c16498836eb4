//! The `gpufeed` command, the library's first user: `bench` (storage → host → GPU, `load`,
//! `decode`, `remote`, `scale`), `pack`, `inspect`, `verify` and `cache`. It reaches the library
//! only through its public API (and `gpufeed::testing` for the pieces its benchmarks drive one
//! by one); what it adds is its own: the arguments, the tables, the plots, the benchmarks.

#![warn(missing_debug_implementations)]

pub mod bench;
pub mod cli;
mod util;
