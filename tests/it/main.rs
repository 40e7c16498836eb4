//! Integration tests: one binary, a module per concern.

mod bindings_python;
mod cache_hostile;
mod capi;
mod cli;
mod common;
mod consumer;
mod decode;
mod device;
mod device_images;
mod device_races;
mod engine;
mod fake_store;
mod fallback;
mod files;
mod formats;
mod fuzzed;
mod gpu;
mod kernels;
mod loader;
mod problems;
mod reliability;
mod remote;
mod sim;
