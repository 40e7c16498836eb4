//! Integration tests: one binary, a module per concern.

mod cli;
mod common;
mod engine;
mod fallback;
mod loader;
mod sim;
