//! gpufeed keeps GPUs fed (crate docs: see the guided tour below, filled in as stages land).

#![warn(missing_debug_implementations)]

pub mod bench;
pub mod buf;
#[doc(hidden)]
pub mod cli;
pub mod config;
pub mod error;
pub mod io;
pub mod sys;
pub mod util;

pub use config::{EngineConfig, EngineKind};
pub use error::{Error, ErrorKind, Result};
pub use io::{Completion, Engine, FileId, ReadSpec};
