//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};

use gpufeed::{Completion, Engine, EngineConfig, EngineKind, FileId, ReadSpec};

/// The byte at `offset` of every pattern file: varies with position so a misplaced byte shows.
pub fn pattern_byte(offset: u64) -> u8 {
    (offset ^ (offset >> 9) ^ (offset >> 17)).wrapping_mul(31) as u8
}

/// A directory on the project's disk (not tmpfs, so O_DIRECT works), removed on drop.
/// `GPUFEED_TEST_TMPDIR` overrides the build's target directory (for test binaries shipped to
/// another machine by `scripts/gpu-check.sh`).
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gpufeed-it-")
        .tempdir_in(test_tmp())
        .unwrap()
}

/// The tests' scratch directory, made if missing: `GPUFEED_TEST_TMPDIR`, else the build's
/// target directory (which a test binary shipped to another machine does not find there).
pub fn test_tmp() -> PathBuf {
    let base = std::env::var_os("GPUFEED_TEST_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    base
}

/// The workspace's root (the suite belongs to the command's crate, `cli/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ is in the workspace")
        .to_path_buf()
}

/// The `gpufeed` binary under test (`GPUFEED_BIN` overrides the one cargo built).
pub fn gpufeed_bin() -> PathBuf {
    std::env::var_os("GPUFEED_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpufeed")))
}

/// Writes a pattern file of `size` bytes.
pub fn pattern_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let bytes: Vec<u8> = (0..size).map(pattern_byte).collect();
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Asserts that `got` equals the pattern bytes from `offset`.
pub fn assert_pattern(got: &[u8], offset: u64, what: &str) {
    for (i, &b) in got.iter().enumerate() {
        let want = pattern_byte(offset + i as u64);
        assert_eq!(
            b,
            want,
            "{what}: byte {i} (file offset {}) differs",
            offset + i as u64
        );
    }
}

/// A config whose slots fit `max_len`-byte reads at any offset.
pub fn config(kind: EngineKind, qd: u32, max_len: usize) -> EngineConfig {
    let slot = (max_len + 8192).next_multiple_of(4096);
    EngineConfig {
        honor_env: false,
        ..EngineConfig::new(kind, qd, slot)
    }
}

/// Reads every (offset, len) once through `engine`, keeping `qd` in flight; returns the
/// outcome per request as Ok(bytes) or Err(error).
pub fn read_all(
    engine: &mut Engine,
    file: FileId,
    reqs: &[(u64, u32)],
) -> Vec<Result<Vec<u8>, gpufeed::Error>> {
    let mut out: Vec<Option<Result<Vec<u8>, gpufeed::Error>>> =
        (0..reqs.len()).map(|_| None).collect();
    let mut next = 0;
    let handle = |engine: &mut Engine, c: Completion, out: &mut Vec<Option<_>>| {
        let r = match c.outcome() {
            Ok(range) => Ok(engine.arena().bytes(&c.slot)[range.clone()].to_vec()),
            Err(e) => Err(clone_err(e)),
        };
        out[c.user_data as usize] = Some(r);
        engine.arena().put(c.slot);
    };
    while next < reqs.len() || engine.in_flight() > 0 {
        while next < reqs.len() {
            let Some(slot) = engine.arena().take() else {
                break;
            };
            let (offset, len) = reqs[next];
            let spec = ReadSpec {
                file,
                offset,
                len,
                buf_offset: 0,
            };
            if let Err(r) = engine.submit_one(slot, spec, next as u64) {
                panic!("submit refused: {}", r.error);
            }
            next += 1;
        }
        engine.wait(1).unwrap();
        while let Some(c) = engine.pop() {
            handle(engine, c, &mut out);
        }
    }
    out.into_iter()
        .map(|o| o.expect("every request completes"))
        .collect()
}

/// A copy of an error (kind, message, context).
pub fn clone_err(e: &gpufeed::Error) -> gpufeed::Error {
    e.clone()
}

/// Writes samples `0..n`, `per` to a shard, as `dir/shard-NNNNN.gpf`: sample `i` has key `i`,
/// label `i % labels`, a length of 1 + `rng.below(max_len)` (one generator seeded `seed`) and
/// the bytes `content(i, length)`.
pub fn keyed_shards(
    dir: &Path,
    n: usize,
    per: usize,
    (seed, max_len, labels): (u64, u64, usize),
    content: impl Fn(usize, usize) -> Vec<u8>,
) -> Vec<PathBuf> {
    let mut rng = gpufeed::testing::Rng::new(seed);
    (0..n.div_ceil(per))
        .map(|s| {
            let p = dir.join(format!("shard-{s:05}.gpf"));
            let mut w = gpufeed::dataset::shard::ShardWriter::create(&p, 1).unwrap();
            for i in s * per..((s + 1) * per).min(n) {
                let len = 1 + rng.below(max_len) as usize;
                w.add(&i.to_string(), (i % labels) as i64, &[], &content(i, len))
                    .unwrap();
            }
            w.finish().unwrap();
            p
        })
        .collect()
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn len_field(field: u64, body: &[u8], out: &mut Vec<u8>) {
    varint(field << 3 | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// A serialized `tf.train.Example` with `image/encoded` (bytes) and `image/class/label`
/// (packed int64), encoded by hand from the proto definitions (the tests against the `tfrecord`
/// package and TensorFlow's own layout check the parser independently).
pub fn tf_example(payload: &[u8], label: i64) -> Vec<u8> {
    let mut bl = Vec::new();
    len_field(1, payload, &mut bl);
    let mut fb = Vec::new();
    len_field(1, &bl, &mut fb);
    let mut packed = Vec::new();
    varint(label as u64, &mut packed);
    let mut il = Vec::new();
    len_field(1, &packed, &mut il);
    let mut fi = Vec::new();
    len_field(3, &il, &mut fi);
    let mut features = Vec::new();
    for (k, v) in [("image/encoded", &fb), ("image/class/label", &fi)] {
        let mut entry = Vec::new();
        len_field(1, k.as_bytes(), &mut entry);
        len_field(2, v, &mut entry);
        len_field(1, &entry, &mut features);
    }
    let mut ex = Vec::new();
    len_field(1, &features, &mut ex);
    ex
}

/// One TFRecord record framing `data`.
pub fn tf_record(data: &[u8]) -> Vec<u8> {
    use gpufeed::testing::masked_crc;
    let len = (data.len() as u64).to_le_bytes();
    let mut r = len.to_vec();
    r.extend_from_slice(&masked_crc(&len).to_le_bytes());
    r.extend_from_slice(data);
    r.extend_from_slice(&masked_crc(data).to_le_bytes());
    r
}

/// Options that read TFRecord records raw (not as `tf.train.Example`s).
pub fn raw_records() -> gpufeed::dataset::OpenOptions {
    gpufeed::dataset::OpenOptions {
        tfrecord_payload: None,
        ..Default::default()
    }
}

/// Whether the tests run as root (some checks need, or cannot work, as root).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `cmd`, which must fail; returns its stderr.
pub fn stderr_of_failure(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    err
}

/// `python3`, or `None` (the test says it was skipped) where there is none. CI installs it.
pub fn python() -> Option<std::process::Command> {
    match std::process::Command::new("python3")
        .arg("--version")
        .output()
    {
        Ok(o) if o.status.success() => Some(std::process::Command::new("python3")),
        _ => {
            eprintln!("skipped: python3 is not installed (CI installs it)");
            None
        }
    }
}

/// Writes `bytes` over `path` in place, as a user who first makes a read-only file writable
/// would (the node's kept indexes are read-only: 0400).
pub fn overwrite(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(path, bytes).unwrap();
}
