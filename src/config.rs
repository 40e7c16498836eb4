//! Every limit gpufeed runs under, validated in one place.
//!
//! Values are chosen at start-up and never grow: the arena, the operation table, the ring and
//! the worker pool are all allocated once from an [`EngineConfig`] that [`EngineConfig::validate`]
//! has accepted. Units are last in names (`queue_depth`, `slot_bytes`, `files_max`).

use crate::error::{invalid, Result};

/// Which backend serves reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// io_uring with O_DIRECT, registered files and fixed (registered) buffers.
    Uring,
    /// io_uring without O_DIRECT: reads go through the page cache, which is kept from
    /// filling up with `posix_fadvise(DONTNEED)`.
    UringBuffered,
    /// A pool of threads issuing `pread` (O_DIRECT): where io_uring is unavailable.
    PreadPool,
    /// Plain buffered `pread` on the calling thread, one read at a time: the simplest baseline.
    Std,
}

impl EngineKind {
    /// Name as used on the command line and in `GPUFEED_ENGINE`.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Uring => "uring",
            EngineKind::UringBuffered => "uring-buffered",
            EngineKind::PreadPool => "pread-pool",
            EngineKind::Std => "std",
        }
    }

    /// All kinds, in the order benchmarks show them.
    pub const ALL: [EngineKind; 4] = [
        EngineKind::Uring,
        EngineKind::UringBuffered,
        EngineKind::PreadPool,
        EngineKind::Std,
    ];

    /// Whether files are opened with O_DIRECT (where the file system allows it).
    pub fn direct(self) -> bool {
        matches!(self, EngineKind::Uring | EngineKind::PreadPool)
    }
}

impl std::str::FromStr for EngineKind {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<EngineKind> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                invalid(format!(
                    "unknown engine {s:?}; expected one of uring, uring-buffered, pread-pool, std"
                ))
            })
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Environment variable that forces an engine kind (`uring`, `uring-buffered`, `pread-pool`,
/// `std`) whatever the configuration says: the escape hatch when io_uring misbehaves.
pub const ENV_ENGINE: &str = "GPUFEED_ENGINE";
/// Environment variable: `0` disables io_uring buffer registration (plain `Read` instead of
/// `ReadFixed`), as if registration had failed.
pub const ENV_REGISTER: &str = "GPUFEED_REGISTER_BUFFERS";

/// Limits and switches for an [`Engine`](crate::io::Engine).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Backend. Overridden by `GPUFEED_ENGINE` when `honor_env` is set.
    pub kind: EngineKind,
    /// Reads in flight at most (the ring size, or the pool's queue). 1..=4096.
    pub queue_depth: u32,
    /// Size of each arena slot. A multiple of 4096, at most 1 GiB.
    pub slot_bytes: usize,
    /// Number of arena slots. At least 1; default: `queue_depth`.
    pub slots: u32,
    /// Files open at once at most. 1..=65536.
    pub files_max: u32,
    /// Reads one job may hold at most. 1..=65536.
    pub reads_per_job_max: u32,
    /// Reads of all jobs in flight at most (the engine's table of reads); 0: four times the
    /// queue depth or `reads_per_job_max`, whichever is more. A loader sets it to
    /// `reads_per_job_max` × its groups in flight, so every group it plans can be submitted.
    pub reads_in_flight_max: u32,
    /// Pool threads for `PreadPool`; 0 means `queue_depth` (capped at 256).
    pub threads: u32,
    /// io_uring SQPOLL (a kernel thread polls the queue; burns a core, off by default).
    pub sqpoll: bool,
    /// io_uring DEFER_TASKRUN: completions are posted only when the engine waits. Off by
    /// default: it cost IOPS with one submission per small read, and gained nothing otherwise.
    pub defer_taskrun: bool,
    /// For files read through the page cache (no O_DIRECT): drop what was read from the cache
    /// every 64 MiB (`POSIX_FADV_DONTNEED`) so a dataset larger than RAM does not flood it.
    /// Turn off when the dataset fits in memory and should stay cached.
    pub drop_cache_behind: bool,
    /// Register the arena with io_uring as fixed buffers (falls back if refused).
    pub register_buffers: bool,
    /// Back the arena with transparent huge pages.
    pub huge_pages: bool,
    /// Let `GPUFEED_ENGINE` / `GPUFEED_REGISTER_BUFFERS` override the fields above.
    pub honor_env: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            kind: EngineKind::Uring,
            queue_depth: 64,
            slot_bytes: 1 << 20,
            slots: 64,
            files_max: 256,
            reads_per_job_max: 4096,
            reads_in_flight_max: 0,
            threads: 0,
            sqpoll: false,
            defer_taskrun: false,
            drop_cache_behind: true,
            register_buffers: true,
            huge_pages: true,
            honor_env: true,
        }
    }
}

impl EngineConfig {
    /// A configuration with `queue_depth` reads in flight and as many slots of `slot_bytes`.
    pub fn new(kind: EngineKind, queue_depth: u32, slot_bytes: usize) -> EngineConfig {
        EngineConfig {
            kind,
            queue_depth,
            slot_bytes,
            slots: queue_depth,
            ..EngineConfig::default()
        }
    }

    /// Checks every limit; the error names the field and the allowed range.
    pub fn validate(&self) -> Result<()> {
        fn range(name: &str, v: u64, lo: u64, hi: u64) -> Result<()> {
            if v < lo || v > hi {
                Err(invalid(format!("{name} must be in {lo}..={hi}, got {v}")))
            } else {
                Ok(())
            }
        }
        range("queue_depth", self.queue_depth as u64, 1, 4096)?;
        range("slots", self.slots as u64, 1, 1 << 20)?;
        range("files_max", self.files_max as u64, 1, 65536)?;
        range("reads_per_job_max", self.reads_per_job_max as u64, 1, 65536)?;
        range(
            "reads_in_flight_max",
            self.reads_in_flight_max as u64,
            0,
            1 << 22,
        )?;
        range("threads", self.threads as u64, 0, 1024)?;
        range("slot_bytes", self.slot_bytes as u64, 4096, 1 << 30)?;
        if !self.slot_bytes.is_multiple_of(4096) {
            return Err(invalid(format!(
                "slot_bytes must be a multiple of 4096, got {}",
                self.slot_bytes
            )));
        }
        (self.slot_bytes as u64)
            .checked_mul(self.slots as u64)
            .filter(|&b| b <= 1 << 40)
            .ok_or_else(|| invalid("slot_bytes × slots exceeds 1 TiB"))?;
        Ok(())
    }

    /// Applies `GPUFEED_ENGINE` and `GPUFEED_REGISTER_BUFFERS` if `honor_env` is set.
    pub(crate) fn with_env(self) -> Result<EngineConfig> {
        self.with_overrides(
            std::env::var(ENV_ENGINE).ok().as_deref(),
            std::env::var(ENV_REGISTER).ok().as_deref(),
        )
    }

    /// Applies the values of `GPUFEED_ENGINE` and `GPUFEED_REGISTER_BUFFERS` (as given) if
    /// `honor_env` is set.
    pub fn with_overrides(
        mut self,
        engine: Option<&str>,
        register: Option<&str>,
    ) -> Result<EngineConfig> {
        if !self.honor_env {
            return Ok(self);
        }
        if let Some(v) = engine.filter(|v| !v.is_empty()) {
            self.kind = v
                .parse()
                .map_err(|e: crate::Error| invalid(format!("{ENV_ENGINE}: {}", e.message())))?;
        }
        if register == Some("0") {
            self.register_buffers = false;
        }
        Ok(self)
    }

    /// Pool threads actually used by `PreadPool`.
    pub fn pool_threads(&self) -> u32 {
        if self.threads == 0 {
            self.queue_depth.min(256)
        } else {
            self.threads
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_limits_name_the_field() {
        EngineConfig::default().validate().unwrap();
        let e = EngineConfig {
            queue_depth: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(
            e.to_string().contains("queue_depth must be in 1..=4096"),
            "{e}"
        );
        let e = EngineConfig {
            slot_bytes: 5000,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("slot_bytes"), "{e}");
    }

    #[test]
    fn environment_forces_the_engine() {
        let c = EngineConfig::default()
            .with_overrides(Some("pread-pool"), Some("0"))
            .unwrap();
        assert_eq!(c.kind, EngineKind::PreadPool);
        assert!(!c.register_buffers);
        let c = EngineConfig::default()
            .with_overrides(Some("uring-buffered"), None)
            .unwrap();
        assert_eq!(c.kind, EngineKind::UringBuffered);
        let e = EngineConfig::default()
            .with_overrides(Some("turbo"), None)
            .unwrap_err();
        assert!(e.to_string().contains("GPUFEED_ENGINE"), "{e}");
        let c = EngineConfig {
            honor_env: false,
            ..Default::default()
        }
        .with_overrides(Some("std"), None)
        .unwrap();
        assert_eq!(c.kind, EngineKind::Uring);
    }

    #[test]
    fn engine_names_round_trip() {
        for k in EngineKind::ALL {
            assert_eq!(k.name().parse::<EngineKind>().unwrap(), k);
        }
        assert!("fast".parse::<EngineKind>().is_err());
    }
}
