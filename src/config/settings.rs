//! Every loader setting, once: its name at each front door, its unit, default, range and
//! meaning, and how it is set from text — as [`DATASET_OPTIONS`](crate::dataset::DATASET_OPTIONS)
//! is for the dataset options.
//!
//! The doors: the Rust [`LoaderBuilder`](crate::loader::LoaderBuilder) (whose defaults are
//! [`LoaderSettings::default`]), Python's `Loader(...)` keyword arguments, the C
//! `gpufeed_options` struct (which `gpufeed_options_default` fills from this table), and the
//! CLI's `--NAME` flags (`_` written `-`) of `gpufeed bench load`. Each door turns what it is
//! given into text and calls [`LoaderSettings::set`]; [`LoaderSettings::values`] reads every
//! value back, which is how the tests hold each door to the table. The Python, C and CLI doors
//! start from [`LoaderSettings::from_env`] (torchrun's `RANK` and `WORLD_SIZE`).

use std::time::Duration;

use crate::error::{invalid, Result};
use crate::gpu::Device;
use crate::plan::{LastBatch, Order};

/// The most samples in a batch (a read group holds at most [`READS_PER_JOB_MAX`] reads).
pub const BATCH_SIZE_MAX: u32 = READS_PER_JOB_MAX;
/// The most reads one engine job (one read group) may hold: the planner's limit on a group.
pub const READS_PER_JOB_MAX: u32 = crate::plan::READS_PER_GROUP_MAX;
/// The fewest reads the engine's per-job table is sized for.
pub const READS_PER_JOB_MIN: u32 = 4096;
/// The most files the I/O thread keeps open at once (io_uring's fixed-file table, as the engine
/// sizes it). A dataset of more files (an ImageFolder of 1.28 M images) is read with the least
/// recently used closed as others are opened.
pub const OPEN_FILES_MAX: u32 = 65536;
/// The most reads in flight in the engine (the ring's size).
pub const QUEUE_DEPTH_MAX: u32 = 4096;
/// The most read groups waiting for the consumer, or being read, at once (each takes a slot).
pub const GROUPS_MAX: u32 = 65536;

/// A front door of the loader: messages name settings as that door spells them (Python's
/// `prefetch=`, not the builder's `prefetch_groups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrontDoor {
    /// The crate's [`LoaderBuilder`](crate::loader::LoaderBuilder).
    #[default]
    Rust,
    /// The Python package's `Loader(...)`.
    Python,
    /// The C ABI's `gpufeed_options`.
    C,
    /// The command line (`gpufeed bench load`).
    Cli,
}

impl FrontDoor {
    /// How this door spells setting `name` of [`LOADER_SETTINGS`].
    pub fn spell(self, name: &str) -> String {
        let Some(s) = LOADER_SETTINGS.iter().find(|s| s.name == name) else {
            return name.to_string();
        };
        match self {
            FrontDoor::Rust => format!("LoaderBuilder::{}", s.rust),
            FrontDoor::Python => format!("{}=", s.name),
            FrontDoor::C => format!("gpufeed_options.{}", s.c.unwrap_or(s.name)),
            FrontDoor::Cli => format!("--{}", s.flag),
        }
    }
    /// How this door spells the read-ahead setting.
    pub(crate) fn prefetch(self) -> String {
        self.spell("prefetch")
    }
    /// How this door spells the time limit on a wait for a batch.
    pub(crate) fn timeout(self) -> String {
        self.spell("timeout")
    }
}

/// One loader setting as the documentation and every front door name it.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The name: [`LoaderSettings::set`], Python keyword; the CLI flag is `--` + it with `-`
    /// for `_`.
    pub name: &'static str,
    /// The CLI flag without its dashes: `name` with `-` for `_`.
    pub flag: &'static str,
    /// The unit of a number (`samples`, `bytes`, `seconds`…), or the values a name takes.
    pub unit: &'static str,
    /// The default, as [`LoaderSettings::values`] prints it (`none`: absent).
    pub default: &'static str,
    /// The allowed numbers, inclusive (checked by [`LoaderSettings::set`]).
    pub range: Option<(u64, u64)>,
    /// What the setting does.
    pub help: &'static str,
    /// The environment variable the Python, C and CLI doors take it from when it is not given.
    pub env: Option<&'static str>,
    /// The [`LoaderBuilder`](crate::loader::LoaderBuilder) method that sets it.
    pub rust: &'static str,
    /// The C `gpufeed_options` field when it is not `name` (`None`: `name`).
    pub c: Option<&'static str>,
    /// The doors that do not take it, and why (empty: every door does).
    pub not_at: &'static [(FrontDoor, &'static str)],
}

const NOT_CLI_RANKS: (FrontDoor, &str) = (
    FrontDoor::Cli,
    "bench load runs its ranks itself (--gpus N reads ranks 0..N)",
);
const PER_SAMPLE: &str = "a batch's bad samples are reported per sample (Batch::errors, \
                          gpufeed_batch_sample's GPUFEED_ERR_SAMPLE): the caller decides";
const NEXT_EPOCH: &str = "the caller asks for the next epoch itself (Loader::epoch(e + 1), \
                          gpufeed_loader_start_epoch) while the current one is read";

/// Every loader setting (the order of the documentation).
pub const LOADER_SETTINGS: &[Setting] = &[
    Setting {
        name: "batch_size",
        flag: "batch-size",
        unit: "samples",
        default: "256",
        range: Some((1, BATCH_SIZE_MAX as u64)),
        help: "samples per batch",
        env: None,
        rust: "batch_size",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "order",
        flag: "order",
        unit: "global, shard-buffer, block or sequential",
        default: "global",
        range: None,
        help: "the epoch order: an exact shuffle (global), shards shuffled then a shuffle \
               buffer (shard-buffer), blocks of consecutive bytes shuffled (block), or none \
               (sequential: evaluation)",
        env: None,
        rust: "order",
        c: None,
        not_at: &[(
            FrontDoor::Cli,
            "bench load's --modes name the orders it runs",
        )],
    },
    Setting {
        name: "seed",
        flag: "seed",
        unit: "",
        default: "0",
        range: None,
        help: "the seed every epoch's order derives from",
        env: None,
        rust: "seed",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "rank",
        flag: "rank",
        unit: "",
        default: "0",
        range: Some((0, u32::MAX as u64 - 1)),
        help: "this process's rank (below world_size)",
        env: Some("RANK"),
        rust: "rank",
        c: None,
        not_at: &[NOT_CLI_RANKS],
    },
    Setting {
        name: "world_size",
        flag: "world-size",
        unit: "ranks",
        default: "1",
        range: Some((1, u32::MAX as u64)),
        help: "the number of ranks; each reads its own part of every epoch",
        env: Some("WORLD_SIZE"),
        rust: "rank",
        c: None,
        not_at: &[NOT_CLI_RANKS],
    },
    Setting {
        name: "device",
        flag: "device",
        unit: "cpu, cuda or cuda:N",
        default: "cpu",
        range: None,
        help: "where batches are delivered: host memory, or a CUDA device (cuda: the one \
               LOCAL_RANK names, else 0)",
        env: None,
        rust: "device",
        c: None,
        not_at: &[(
            FrontDoor::Cli,
            "bench gpu and bench decode --device measure the device paths",
        )],
    },
    Setting {
        name: "prefetch",
        flag: "prefetch",
        unit: "groups",
        default: "2",
        range: Some((1, GROUPS_MAX as u64)),
        help: "finished read groups waiting for the consumer, at most",
        env: None,
        rust: "prefetch_groups",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "in_flight",
        flag: "in-flight",
        unit: "groups",
        default: "2",
        range: Some((1, GROUPS_MAX as u64)),
        help: "read groups being read at once, at most (fewer, said once, where the open-file limit is low)",
        env: None,
        rust: "in_flight_groups",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "last_batch",
        flag: "last-batch",
        unit: "short, drop or pad",
        default: "short",
        range: None,
        help: "a rank's last, incomplete batch: short (every sample exactly once), drop, or \
               pad (every rank the same number of samples, repeats flagged)",
        env: None,
        rust: "last_batch",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "verify",
        flag: "verify",
        unit: "true or false",
        default: "true",
        range: None,
        help: "check every sample's crc32c where the format has one",
        env: None,
        rust: "verify_checksums",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "on_error",
        flag: "on-error",
        unit: "raise or mark",
        default: "raise",
        range: None,
        help: "a batch with a bad sample: raise SampleError, or mark it (Batch.errors)",
        env: None,
        rust: "-",
        c: None,
        not_at: &[
            (FrontDoor::Rust, PER_SAMPLE),
            (FrontDoor::C, PER_SAMPLE),
            (
                FrontDoor::Cli,
                "bench load counts bad samples (sample_errors in its JSON)",
            ),
        ],
    },
    Setting {
        name: "shuffle_buffer",
        flag: "shuffle-buffer",
        unit: "samples",
        default: "10000",
        range: Some((1, u32::MAX as u64)),
        help: "order shard-buffer: samples shuffled together (a window of the shard stream, read whole; rounded to whole batches, at least one)",
        env: None,
        rust: "order",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "block_bytes",
        flag: "block-bytes",
        unit: "bytes",
        default: "8388608",
        range: Some((1, u64::MAX)),
        help: "order block: bytes of consecutive samples per block, about (8 MiB)",
        env: None,
        rust: "order",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "open_blocks",
        flag: "open-blocks",
        unit: "blocks",
        default: "8",
        range: Some((1, u32::MAX as u64)),
        help: "order block: blocks drawn from at a time",
        env: None,
        rust: "order",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "queue_depth",
        flag: "queue-depth",
        unit: "reads",
        default: "128",
        range: Some((1, QUEUE_DEPTH_MAX as u64)),
        help: "reads in flight in the engine",
        env: None,
        rust: "queue_depth",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "memory_budget",
        flag: "memory-budget",
        unit: "bytes",
        default: "4294967296",
        range: Some((4096, u64::MAX)),
        help: "memory the read buffers may take (4 GiB); slots are sized from the dataset \
               and the batch size within it",
        env: None,
        rust: "memory_budget",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "timeout",
        flag: "timeout",
        unit: "seconds",
        default: "none",
        range: None,
        help: "a limit on each wait for a batch (none: as long as it takes — a slow step or a \
               pause is never an error)",
        env: None,
        rust: "timeout",
        c: Some("timeout_ms"),
        not_at: &[],
    },
    Setting {
        name: "open_files_max",
        flag: "open-files-max",
        unit: "files",
        default: "none",
        range: Some((1, OPEN_FILES_MAX as u64)),
        help: "files kept open at most (none: the dataset's files, up to twice what the read \
               groups in flight need and at least 1024, within what the open-file limit \
               allows); fewer are opened as read groups need them, and read groups touch no \
               more files than it holds for those in flight and the one being submitted",
        env: None,
        rust: "open_files_max",
        c: None,
        not_at: &[],
    },
    Setting {
        name: "prefetch_next_epoch",
        flag: "prefetch-next-epoch",
        unit: "true or false",
        default: "false",
        range: None,
        help: "when a pass starts, also ask for the next epoch, so its first batches are read \
               while this one's last are used",
        env: None,
        rust: "-",
        c: None,
        not_at: &[
            (FrontDoor::Rust, NEXT_EPOCH),
            (FrontDoor::C, NEXT_EPOCH),
            (
                FrontDoor::Cli,
                "bench load --epochs N asks for each next epoch itself",
            ),
        ],
    },
];

impl Setting {
    /// Whether `door` takes this setting.
    pub fn at(&self, door: FrontDoor) -> bool {
        !self.not_at.iter().any(|(d, _)| *d == door)
    }
}

/// What happens to a batch with a bad sample at the Python door (`on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// The batch raises an error naming the first bad sample.
    #[default]
    Raise,
    /// The batch is delivered; each bad sample is marked.
    Mark,
}

/// Every loader setting's value ([`LOADER_SETTINGS`]): what a door was given, over the table's
/// defaults.
#[derive(Debug, Clone)]
pub struct LoaderSettings {
    /// Samples per batch.
    pub batch_size: u32,
    /// The epoch order (its parameters are `shuffle_buffer`, `block_bytes`, `open_blocks`).
    pub order: Order,
    /// The seed every epoch order derives from.
    pub seed: u64,
    /// This process's rank.
    pub rank: u32,
    /// Ranks in all.
    pub world_size: u32,
    /// Where batches are delivered.
    pub device: Device,
    /// Finished groups waiting for the consumer, at most.
    pub prefetch: u32,
    /// Groups being read at once, at most.
    pub in_flight: u32,
    /// A rank's last, incomplete batch.
    pub last_batch: LastBatch,
    /// Check every sample's crc32c where the format has one.
    pub verify: bool,
    /// A batch with a bad sample (the Python door's policy).
    pub on_error: OnError,
    /// Order shard-buffer: samples shuffled together (a window of the shard stream, read whole; rounded to whole batches, at least one).
    pub shuffle_buffer: u32,
    /// Order block: bytes per block.
    pub block_bytes: u64,
    /// Order block: blocks open at a time.
    pub open_blocks: u32,
    /// Reads in flight in the engine.
    pub queue_depth: u32,
    /// Memory the arena may take.
    pub memory_budget: u64,
    /// A limit on each wait for a batch.
    pub timeout: Option<Duration>,
    /// Files kept open at most (`None`: every file, within the limits).
    pub open_files_max: Option<u32>,
    /// The Python door: ask for the next epoch when a pass starts.
    pub prefetch_next_epoch: bool,
}

impl Default for LoaderSettings {
    /// The table's defaults.
    fn default() -> Self {
        let mut s = LoaderSettings {
            batch_size: 0,
            order: Order::Global,
            seed: 0,
            rank: 0,
            world_size: 1,
            device: Device::Host,
            prefetch: 0,
            in_flight: 0,
            last_batch: LastBatch::Short,
            verify: true,
            on_error: OnError::Raise,
            shuffle_buffer: 0,
            block_bytes: 0,
            open_blocks: 0,
            queue_depth: 0,
            memory_budget: 0,
            timeout: None,
            open_files_max: None,
            prefetch_next_epoch: false,
        };
        for o in LOADER_SETTINGS {
            s.set(o.name, o.default)
                .unwrap_or_else(|e| panic!("the table's default of {} is unreadable: {e}", o.name));
        }
        s
    }
}

fn number(s: &Setting, v: &str) -> Result<u64> {
    let n: u64 = if s.unit == "bytes" {
        crate::util::parse_size(v).map_err(|e| invalid(format!("{}: {}", s.name, e.message())))?
    } else {
        v.parse().map_err(|_| {
            invalid(format!(
                "{} {v:?} is not a whole number{}",
                s.name,
                if s.unit.is_empty() {
                    String::new()
                } else {
                    format!(" of {}", s.unit)
                }
            ))
        })?
    };
    if let Some((lo, hi)) = s.range {
        if n < lo || n > hi {
            return Err(invalid(format!(
                "{} must be in {lo}..={hi}{}, got {n}",
                s.name,
                if s.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", s.unit)
                }
            )));
        }
    }
    Ok(n)
}

pub(crate) fn yes_no(name: &str, v: &str) -> Result<bool> {
    crate::util::yes_no_word(v)
        .ok_or_else(|| invalid(format!("{name} {v:?}: expected true or false")))
}

/// A duration: seconds (`2.5`), or with a unit (`300ms`, `2s`).
fn seconds(name: &str, v: &str) -> Result<Duration> {
    let bad = || {
        invalid(format!(
            "{name} {v:?}: expected seconds above 0 (e.g. 30, 2.5, 300ms), or none"
        ))
    };
    let d = if let Some(ms) = v.strip_suffix("ms") {
        Duration::from_millis(ms.trim().parse().map_err(|_| bad())?)
    } else {
        let s: f64 = v
            .strip_suffix('s')
            .unwrap_or(v)
            .trim()
            .parse()
            .map_err(|_| bad())?;
        Duration::try_from_secs_f64(s).map_err(|_| bad())?
    };
    if d.is_zero() {
        return Err(bad());
    }
    Ok(d)
}

/// `cpu`, `cuda` (the device `LOCAL_RANK` names, else 0) or `cuda:N`.
fn device(v: &str) -> Result<Device> {
    match v {
        "cpu" => Ok(Device::Host),
        "cuda" => match std::env::var("LOCAL_RANK") {
            Ok(r) => r.trim().parse().map(Device::Cuda).map_err(|_| {
                invalid(format!(
                    "device \"cuda\" is the device LOCAL_RANK names, and LOCAL_RANK={r:?} is \
                     not a number"
                ))
            }),
            Err(_) => Ok(Device::Cuda(0)),
        },
        d => match d.strip_prefix("cuda:").map(str::parse::<u32>) {
            Some(Ok(i)) => Ok(Device::Cuda(i)),
            _ => Err(invalid(format!(
                "device {v:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
            ))),
        },
    }
}

impl LoaderSettings {
    /// The defaults, with the environment's values where a setting names a variable
    /// (`RANK`, `WORLD_SIZE`: what torchrun sets) — what the Python, C and CLI doors start from.
    pub fn from_env() -> Result<LoaderSettings> {
        let mut s = LoaderSettings::default();
        for o in LOADER_SETTINGS {
            if let Some(var) = o.env {
                if let Ok(v) = std::env::var(var) {
                    s.set(o.name, &v)
                        .map_err(|e| invalid(format!("{var}={v:?}: {}", e.message())))?;
                }
            }
        }
        Ok(s)
    }

    /// Sets `name` ([`LOADER_SETTINGS`]) from text, as every door does: numbers (sizes as
    /// `4G` where the unit is bytes), names, `true`/`false`, `none` for the optional ones. The
    /// error names the setting and what it expects.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let Some(s) = LOADER_SETTINGS.iter().find(|s| s.name == name) else {
            let names: Vec<&str> = LOADER_SETTINGS.iter().map(|o| o.name).collect();
            return Err(invalid(format!(
                "unknown loader setting {name:?}; the settings are {}",
                names.join(", ")
            )));
        };
        let v = value.trim();
        let none = v.is_empty() || v.eq_ignore_ascii_case("none");
        match name {
            "batch_size" => self.batch_size = number(s, v)? as u32,
            "order" => {
                self.order = match Order::parse(v)? {
                    Order::ShardBuffer { .. } => Order::ShardBuffer { buffer: 0 },
                    Order::Block { .. } => Order::Block {
                        block_bytes: 0,
                        open_blocks: 0,
                    },
                    o => o,
                }
            }
            "seed" => self.seed = number(s, v)?,
            "rank" => self.rank = number(s, v)? as u32,
            "world_size" => self.world_size = number(s, v)? as u32,
            "device" => self.device = device(v)?,
            "prefetch" => self.prefetch = number(s, v)? as u32,
            "in_flight" => self.in_flight = number(s, v)? as u32,
            "last_batch" => self.last_batch = LastBatch::parse(v)?,
            "verify" => self.verify = yes_no(name, v)?,
            "on_error" => {
                self.on_error = match v {
                    "raise" => OnError::Raise,
                    "mark" => OnError::Mark,
                    _ => {
                        return Err(invalid(format!(
                            "on_error {v:?}: expected \"raise\" or \"mark\""
                        )))
                    }
                }
            }
            "shuffle_buffer" => self.shuffle_buffer = number(s, v)? as u32,
            "block_bytes" => self.block_bytes = number(s, v)?,
            "open_blocks" => self.open_blocks = number(s, v)? as u32,
            "queue_depth" => self.queue_depth = number(s, v)? as u32,
            "memory_budget" => self.memory_budget = number(s, v)?,
            "timeout" => self.timeout = if none { None } else { Some(seconds(name, v)?) },
            "open_files_max" => {
                self.open_files_max = if none {
                    None
                } else {
                    Some(number(s, v)? as u32)
                }
            }
            "prefetch_next_epoch" => self.prefetch_next_epoch = yes_no(name, v)?,
            other => unreachable!("setting {other} has no reader"),
        }
        Ok(())
    }

    /// The epoch order with its parameters filled in from `shuffle_buffer`, `block_bytes` and
    /// `open_blocks`.
    pub fn order(&self) -> Order {
        match self.order {
            Order::ShardBuffer { .. } => Order::ShardBuffer {
                buffer: self.shuffle_buffer,
            },
            Order::Block { .. } => Order::Block {
                block_bytes: self.block_bytes,
                open_blocks: self.open_blocks,
            },
            o => o,
        }
    }

    /// `base` (the planner's other limits) with these settings' order, seed, ranks, batch size
    /// and last-batch policy: the epoch plan a loader with these settings follows.
    pub fn plan(&self, base: &crate::plan::PlanConfig) -> crate::plan::PlanConfig {
        crate::plan::PlanConfig {
            order: self.order(),
            seed: self.seed,
            rank: self.rank,
            world_size: self.world_size,
            batch_size: self.batch_size,
            last_batch: self.last_batch,
            ..base.clone()
        }
    }

    /// Takes the order `o` and its parameters.
    pub fn set_order(&mut self, o: Order) {
        self.order = o;
        match o {
            Order::ShardBuffer { buffer } => self.shuffle_buffer = buffer,
            Order::Block {
                block_bytes,
                open_blocks,
            } => {
                self.block_bytes = block_bytes;
                self.open_blocks = open_blocks;
            }
            Order::Global | Order::Sequential => {}
        }
    }

    /// Every setting's value as text, in [`LOADER_SETTINGS`] order (`None`: absent).
    pub fn values(&self) -> Vec<(&'static str, Option<String>)> {
        LOADER_SETTINGS
            .iter()
            .map(|o| {
                let v = match o.name {
                    "batch_size" => Some(self.batch_size.to_string()),
                    "order" => Some(self.order.name().to_string()),
                    "seed" => Some(self.seed.to_string()),
                    "rank" => Some(self.rank.to_string()),
                    "world_size" => Some(self.world_size.to_string()),
                    "device" => Some(match self.device {
                        Device::Host => "cpu".to_string(),
                        Device::Cuda(i) => format!("cuda:{i}"),
                        Device::Simulated(_) => "sim".to_string(),
                    }),
                    "prefetch" => Some(self.prefetch.to_string()),
                    "in_flight" => Some(self.in_flight.to_string()),
                    "last_batch" => Some(self.last_batch.name().to_string()),
                    "verify" => Some(self.verify.to_string()),
                    "on_error" => Some(
                        match self.on_error {
                            OnError::Raise => "raise",
                            OnError::Mark => "mark",
                        }
                        .to_string(),
                    ),
                    "shuffle_buffer" => Some(self.shuffle_buffer.to_string()),
                    "block_bytes" => Some(self.block_bytes.to_string()),
                    "open_blocks" => Some(self.open_blocks.to_string()),
                    "queue_depth" => Some(self.queue_depth.to_string()),
                    "memory_budget" => Some(self.memory_budget.to_string()),
                    "timeout" => self.timeout.map(|t| t.as_secs_f64().to_string()),
                    "open_files_max" => self.open_files_max.map(|n| n.to_string()),
                    "prefetch_next_epoch" => Some(self.prefetch_next_epoch.to_string()),
                    other => unreachable!("setting {other} has no value reader"),
                };
                (o.name, v)
            })
            .collect()
    }

    /// [`values`](LoaderSettings::values) as a JSON object (`null` for absent).
    pub fn to_json(&self) -> serde_json::Value {
        crate::util::values_json(self.values())
    }

    /// The table's defaults as [`to_json`](LoaderSettings::to_json) prints them, for the
    /// settings `door` takes.
    pub fn defaults_json(door: FrontDoor) -> serde_json::Value {
        serde_json::Value::Object(
            LOADER_SETTINGS
                .iter()
                .filter(|o| o.at(door))
                .map(|o| {
                    let v = if o.default == "none" {
                        serde_json::Value::Null
                    } else {
                        o.default.into()
                    };
                    (o.name.to_string(), v)
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_tables_and_every_setting_reads_back() {
        let d = LoaderSettings::default();
        let want: Vec<(&str, Option<String>)> = LOADER_SETTINGS
            .iter()
            .map(|o| (o.name, (o.default != "none").then(|| o.default.to_string())))
            .collect();
        assert_eq!(d.values(), want);
        assert_eq!(
            d.to_json(),
            LoaderSettings::defaults_json(FrontDoor::Python)
        );
        let given = [
            ("batch_size", "32", "32"),
            ("order", "block", "block"),
            ("seed", "7", "7"),
            ("rank", "1", "1"),
            ("world_size", "4", "4"),
            ("device", "cuda:3", "cuda:3"),
            ("prefetch", "3", "3"),
            ("in_flight", "5", "5"),
            ("last_batch", "pad", "pad"),
            ("verify", "false", "false"),
            ("on_error", "mark", "mark"),
            ("shuffle_buffer", "99", "99"),
            ("block_bytes", "1M", "1048576"),
            ("open_blocks", "3", "3"),
            ("queue_depth", "16", "16"),
            ("memory_budget", "1G", "1073741824"),
            ("timeout", "300ms", "0.3"),
            ("open_files_max", "40", "40"),
            ("prefetch_next_epoch", "true", "true"),
        ];
        assert_eq!(
            given.len(),
            LOADER_SETTINGS.len(),
            "the test sets every setting"
        );
        let mut s = LoaderSettings::default();
        for (k, v, _) in given {
            s.set(k, v).unwrap();
        }
        let back: Vec<(&str, Option<String>)> = given
            .iter()
            .map(|(k, _, v)| (*k, Some(v.to_string())))
            .collect();
        assert_eq!(s.values(), back);
        assert_eq!(
            s.order(),
            Order::Block {
                block_bytes: 1 << 20,
                open_blocks: 3
            }
        );
        s.set("timeout", "none").unwrap();
        assert_eq!(s.timeout, None);
        s.set("timeout", "2.5").unwrap();
        assert_eq!(s.timeout, Some(Duration::from_millis(2500)));
        // Errors name the setting and what it expects.
        for (k, v, says) in [
            ("batch_size", "0", "batch_size must be in 1..=65536 samples"),
            ("queue_depth", "5000", "queue_depth must be in 1..=4096"),
            ("timeout", "0", "timeout \"0\""),
            ("device", "tpu", "cuda:N"),
            ("order", "random", "expected global"),
            ("memory_budget", "lots", "memory_budget"),
            ("colour", "red", "the settings are batch_size"),
        ] {
            let e = s.set(k, v).unwrap_err().to_string();
            assert!(e.contains(says), "{k}={v}: {e}");
        }
    }

    #[test]
    fn doors_spell_settings_their_own_way() {
        assert_eq!(FrontDoor::Rust.prefetch(), "LoaderBuilder::prefetch_groups");
        assert_eq!(FrontDoor::Python.timeout(), "timeout=");
        assert_eq!(FrontDoor::C.timeout(), "gpufeed_options.timeout_ms");
        assert_eq!(FrontDoor::Cli.spell("open_files_max"), "--open-files-max");
        for o in LOADER_SETTINGS {
            assert_eq!(o.flag, o.name.replace('_', "-"));
            assert!(
                o.at(FrontDoor::Python),
                "{}: Python takes every setting",
                o.name
            );
            for (_, why) in o.not_at {
                assert!(!why.is_empty());
            }
        }
    }
}
