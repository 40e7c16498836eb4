//! Integration tests: one binary, a module per concern.

mod common;
mod engine;
mod sim;
