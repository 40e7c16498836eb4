//! The C ABI: `include/gpufeed.h` agrees with `capi/src/lib.rs` (no drift), and a C program
//! compiled against the header reads an epoch through `libgpufeed_c.so` and sees every sample.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpufeed::dataset::shard::ShardWriter;
use gpufeed::testing::Rng;

use crate::common::*;

fn root() -> PathBuf {
    crate::common::repo_root()
}

/// Collapses whitespace and the spaces around `*`, so `const char* x` and `const char *x`
/// compare equal.
fn norm(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    s.replace(" *", "*").replace("* ", "*")
}

/// The C type a Rust FFI type is declared as in the header.
fn c_type(rust: &str) -> String {
    let t = rust.trim();
    if let Some(rest) = t.strip_prefix("*const ") {
        let inner = c_type(rest);
        // `*const *const u8` → `const uint8_t**`; `*const c_char` → `const char*`.
        return if inner.ends_with('*') {
            format!("{inner}*")
        } else {
            format!("const {inner}*")
        };
    }
    if let Some(rest) = t.strip_prefix("*mut ") {
        let inner = c_type(rest);
        return format!("{inner}*");
    }
    match t {
        "u8" => "uint8_t",
        "u16" => "uint16_t",
        "u32" => "uint32_t",
        "u64" => "uint64_t",
        "i32" => "int32_t",
        "i64" => "int64_t",
        "c_char" => "char",
        "c_void" => "void",
        "f32" => "float",
        "f64" => "double",
        "GpufeedStats" => "gpufeed_stats",
        "GpufeedImages" => "gpufeed_images",
        "GpufeedOptions" => "gpufeed_options",
        "GpufeedLoader" => "gpufeed_loader",
        "GpufeedBatch" => "gpufeed_batch",
        "DLManagedTensor" => "DLManagedTensor",
        other => panic!("no C spelling for Rust type {other:?}: extend c_type()"),
    }
    .to_string()
}

/// `name → "ret name(params)"` for every exported function of the Rust source.
fn rust_functions(src: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let flat = src.split_whitespace().collect::<Vec<_>>().join(" ");
    for part in flat.split("#[no_mangle] ").skip(1) {
        let sig = &part[..part.find('{').expect("a body")];
        let after = sig.split("extern \"C\" fn ").nth(1).expect("extern C fn");
        let name = after[..after.find('(').unwrap()].trim().to_string();
        let params = &after[after.find('(').unwrap() + 1..after.rfind(')').unwrap()];
        let ret = after[after.rfind(')').unwrap() + 1..]
            .trim()
            .strip_prefix("->")
            .map_or("void".to_string(), c_type);
        let ps: Vec<String> = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (n, t) = p.split_once(':').expect("name: type");
                format!("{} {}", c_type(t), n.trim())
            })
            .collect();
        let ps = if ps.is_empty() {
            "void".to_string()
        } else {
            ps.join(", ")
        };
        out.insert(name.clone(), norm(&format!("{ret} {name}({ps})")));
    }
    out
}

/// `name → "ret name(params)"` for every `gpufeed_*` prototype of the header.
fn header_functions(h: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in h.lines() {
        let l = line.trim();
        if l.starts_with('#') || l.starts_with("typedef") || !l.ends_with(");") {
            continue;
        }
        let Some(open) = l.find('(') else { continue };
        let name = l[..open]
            .split_whitespace()
            .last()
            .unwrap()
            .trim_start_matches('*');
        if !name.starts_with("gpufeed_") {
            continue;
        }
        out.insert(name.to_string(), norm(l.trim_end_matches(';')));
    }
    out
}

/// Field lines of a `#[repr(C)]` Rust struct and of the header's typedef, as `type name`.
fn rust_fields(src: &str, name: &str) -> Vec<String> {
    let start = src.find(&format!("pub struct {name} {{")).expect("struct");
    let body = &src[start..start + src[start..].find('}').unwrap()];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':'))
        .map(|(n, t)| {
            let t = t.trim().trim_end_matches(',');
            // `[f32; 3]` is `float name[3]`.
            match t.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
                Some(arr) => {
                    let (elem, n_elems) = arr.split_once(';').expect("[T; N]");
                    norm(&format!(
                        "{} {}[{}]",
                        c_type(elem),
                        n.trim(),
                        n_elems.trim()
                    ))
                }
                None => norm(&format!("{} {}", c_type(t), n.trim())),
            }
        })
        .collect()
}

fn header_fields(h: &str, name: &str) -> Vec<String> {
    let start = h
        .find(&format!("typedef struct {name} {{"))
        .expect("typedef");
    let body = &h[start..start + h[start..].find('}').unwrap()];
    body.lines()
        .skip(1)
        .map(|l| l.split("/*").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .map(|l| norm(l.trim_end_matches(';')))
        .collect()
}

#[test]
fn header_matches_the_rust_definitions() {
    let src = std::fs::read_to_string(root().join("capi/src/lib.rs")).unwrap();
    let h = std::fs::read_to_string(root().join("include/gpufeed.h")).unwrap();
    let (r, c) = (rust_functions(&src), header_functions(&h));
    assert!(r.len() >= 15, "{r:?}");
    assert_eq!(
        r.keys().collect::<Vec<_>>(),
        c.keys().collect::<Vec<_>>(),
        "functions in one and not the other"
    );
    for (name, sig) in &r {
        assert_eq!(sig, &c[name], "{name}: Rust and header differ");
    }
    assert_eq!(
        rust_fields(&src, "GpufeedOptions"),
        header_fields(&h, "gpufeed_options")
    );
    assert_eq!(
        rust_fields(&src, "GpufeedImages"),
        header_fields(&h, "gpufeed_images")
    );
    assert_eq!(
        rust_fields(&src, "GpufeedStats"),
        header_fields(&h, "gpufeed_stats")
    );
    // Status codes: the same names and values.
    for line in src.lines().filter(|l| l.starts_with("pub const GPUFEED_")) {
        let (name, rest) = line["pub const ".len()..].split_once(": ").unwrap();
        let value = rest.split_once(" = ").unwrap().1;
        let value = value.trim_end_matches(';');
        assert!(
            h.contains(&format!("#define {name} {value}\n")),
            "{name} = {value} missing from the header"
        );
    }
}

fn content(i: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(i as u64 + 99);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

/// Builds the cdylib; returns the directory holding `libgpufeed_c.so`.
fn build_capi() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "gpufeed-capi",
            "--message-format=json",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == "gpufeed_c" {
            for f in v["filenames"].as_array().unwrap() {
                let p = PathBuf::from(f.as_str().unwrap());
                if p.extension().is_some_and(|x| x == "so") {
                    return p.parent().unwrap().to_path_buf();
                }
            }
        }
    }
    panic!("no libgpufeed_c.so in cargo's output");
}

fn compile(dir: &Path, lib: &Path) -> PathBuf {
    compile_named(dir, lib, "epoch")
}

fn compile_named(dir: &Path, lib: &Path, name: &str) -> PathBuf {
    compile_with(&dir.join(name), lib, name, &root().join("include"), &[])
}

/// Builds `tests/c/{name}.c` into `exe` against the header in `include`, with `defines`.
fn compile_with(exe: &Path, lib: &Path, name: &str, include: &Path, defines: &[&str]) -> PathBuf {
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"])
        .args(defines)
        .arg("-I")
        .arg(include)
        .arg(root().join(format!("tests/c/{name}.c")))
        .arg("-o")
        .arg(exe)
        .arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lgpufeed_c")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc ({}): {}",
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe.to_path_buf()
}

#[test]
fn a_c_program_reads_an_epoch() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on this machine");
        return;
    }
    let lib = build_capi();
    let dir = disk_dir();
    let exe = compile(dir.path(), &lib);
    // 80 samples (10 batches of 8) in two shards; sample 33 is corrupted on disk.
    let (n, bad) = (80usize, 33usize);
    let mut sum = 0u64;
    let mut labels = 0i64;
    let mut rng = Rng::new(4);
    let mut shards = Vec::new();
    for s in 0..2 {
        let p = dir.path().join(format!("shard-{s:05}.gpf"));
        let mut w = ShardWriter::create(&p, 1).unwrap();
        for i in s * 40..(s + 1) * 40 {
            let bytes = content(i, 1 + rng.below(5000) as usize);
            if i != bad {
                sum += bytes.iter().map(|&b| b as u64).sum::<u64>();
                labels += (i % 7) as i64;
            }
            w.add(&format!("{i}"), (i % 7) as i64, &[], &bytes).unwrap();
        }
        w.finish().unwrap();
        shards.push(p);
    }
    let ds = gpufeed::Dataset::open(dir.path()).unwrap();
    let s = ds.sample(bad);
    let shard = &shards[s.file as usize];
    let mut f = std::fs::read(shard).unwrap();
    f[s.offset as usize] ^= 0x55;
    std::fs::write(shard, f).unwrap();

    let out = Command::new(&exe).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap();
    assert_eq!(
        last,
        format!("samples {n} bad 1 bytes {sum} labels {labels}"),
        "{stdout}"
    );
    let bad_line = stdout.lines().find(|l| l.starts_with("bad ")).unwrap();
    assert!(bad_line.contains("shard-00000.gpf"), "{bad_line}");
    assert!(bad_line.contains(&format!("sample {bad}")), "{bad_line}");
}

/// The C structs grow without breaking programs: a program built against an older header
/// (the last field of each struct missing) runs, the library writes nothing past its structs
/// and keeps its own default for what the program does not know; one built against a newer
/// header runs while the field the library does not know is left at zero, and is refused,
/// with a message, when it is set.
#[test]
fn c_programs_built_against_older_and_newer_headers_keep_working() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on this machine");
        return;
    }
    let lib = build_capi();
    let dir = disk_dir();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mut w = ShardWriter::create(&data.join("shard-00000.gpf"), 1).unwrap();
    for i in 0..30usize {
        w.add(&format!("{i}"), 0, &[], &content(i, 100 + i))
            .unwrap();
    }
    w.finish().unwrap();
    let header = std::fs::read_to_string(root().join("include/gpufeed.h")).unwrap();
    // Older: the struct loses its last field (the line before its closing brace).
    let mut old = header.clone();
    for name in ["gpufeed_options", "gpufeed_images", "gpufeed_stats"] {
        let end = old.find(&format!("}} {name};")).unwrap();
        let last = old[..end].trim_end().rfind('\n').unwrap();
        old.replace_range(last..end - 1, "");
    }
    assert!(!old.contains("cache_extent") && !old.contains("remote_s"));
    // Newer: a field appended to the options.
    let newer = header.replacen(
        "} gpufeed_options;",
        "    uint64_t future;\n} gpufeed_options;",
        1,
    );
    let build = |which: &str, h: &str, defines: &[&str]| -> PathBuf {
        let inc = dir.path().join(format!("include-{which}"));
        std::fs::create_dir_all(&inc).unwrap();
        std::fs::write(inc.join("gpufeed.h"), h).unwrap();
        let exe = dir.path().join(format!("compat-{which}"));
        compile_with(&exe, &lib, "compat", &inc, defines)
    };
    let run = |exe: &Path, extra: &[&str]| -> String {
        let out = Command::new(exe).arg(&data).args(extra).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{}: {text}{}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let epoch = "samples 30 stats 30 batches 8";
    for (which, h, defines) in [
        ("current", &header, &[][..]),
        ("old", &old, &[][..]),
        ("newer", &newer, &["-DFUTURE"][..]),
    ] {
        let exe = build(which, h, defines);
        let text = run(&exe, &[]);
        assert!(text.contains(epoch), "{which}: {text}");
        // The field an old program lacks keeps the library's default (8 MiB extents).
        let opts = text
            .lines()
            .find_map(|l| l.strip_prefix("dataset options "))
            .unwrap();
        let opts: serde_json::Value = serde_json::from_str(opts).unwrap();
        let want = gpufeed::dataset::OpenOptions::default().values();
        let want: BTreeMap<String, Option<String>> =
            want.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(
            opts["cache_extent"],
            serde_json::json!(want["cache_extent"]),
            "{which}: {text}"
        );
        if which == "current" {
            for bad in ["partial", "huge"] {
                let text = run(&exe, &[bad]);
                assert!(
                    text.contains("open status 1")
                        && text.contains("not a size the struct can have"),
                    "{bad}: {text}"
                );
            }
            // A dataset path that is not UTF-8 is opened by its bytes.
            use std::os::unix::ffi::OsStrExt;
            let odd = dir
                .path()
                .join(std::ffi::OsStr::from_bytes(b"data-\xff\xfe"));
            std::fs::create_dir(&odd).unwrap();
            std::fs::copy(data.join("shard-00000.gpf"), odd.join("shard-00000.gpf")).unwrap();
            let out = Command::new(&exe).arg(&odd).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains(epoch),
                "{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if which == "newer" {
            let text = run(&exe, &["set"]);
            assert!(
                text.contains(&format!("open status {}", gpufeed_capi_unsupported()))
                    && text.contains("gpufeed_options: byte")
                    && text.contains("newer than the library"),
                "{text}"
            );
        }
    }
}

/// `GPUFEED_ERR_UNSUPPORTED`, as the header defines it.
fn gpufeed_capi_unsupported() -> i32 {
    let h = std::fs::read_to_string(root().join("include/gpufeed.h")).unwrap();
    let l = h
        .lines()
        .find_map(|l| l.strip_prefix("#define GPUFEED_ERR_UNSUPPORTED "))
        .unwrap();
    l.trim().parse().unwrap()
}

/// A C program stops an epoch on W ranks after K batches each and resumes it on W2 through
/// `gpufeed_loader_start_epoch_resumed` — 8 → 6, 2 → 3, 4 → 1, every order, `pad` and `drop` —
/// and the two runs together deliver exactly the samples the uninterrupted epoch owed, each
/// once, every new rank the same number of batches.
#[test]
fn a_c_program_resumes_an_epoch_on_another_rank_count() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on this machine");
        return;
    }
    let lib = build_capi();
    let dir = disk_dir();
    let exe = compile_named(dir.path(), &lib, "resume");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let n = 200usize;
    let mut rng = Rng::new(9);
    for s in 0..2 {
        let mut w = ShardWriter::create(&data.join(format!("shard-{s:05}.gpf")), 1).unwrap();
        for i in s * n / 2..(s + 1) * n / 2 {
            w.add(
                &i.to_string(),
                0,
                &[],
                &content(i, 1 + rng.below(3000) as usize),
            )
            .unwrap();
        }
        w.finish().unwrap();
    }
    let samples = gpufeed::Dataset::open(&data).unwrap();
    let orders = [
        gpufeed::Order::Global,
        gpufeed::Order::ShardBuffer { buffer: 16 },
        gpufeed::Order::Block {
            block_bytes: 64 << 10,
            open_blocks: 2,
        },
        gpufeed::Order::Sequential,
    ];
    for (o, order) in (0u32..).zip(orders) {
        for (lb, last_batch) in [
            (1u32, gpufeed::LastBatch::Drop),
            (2, gpufeed::LastBatch::Pad),
        ] {
            for (w, k, w2) in [(8u32, 3u32, 6u32), (2, 7, 3), (4, 5, 1)] {
                let what = format!("{order:?} {last_batch:?} {w} -> {w2} after {k}");
                // What the uninterrupted epoch owed: every rank's real samples.
                let mut owed = Vec::new();
                for rank in 0..w {
                    let cfg = gpufeed::PlanConfig {
                        order,
                        seed: 11,
                        rank,
                        world_size: w,
                        batch_size: 4,
                        last_batch,
                        ..gpufeed::PlanConfig::default()
                    };
                    let p = gpufeed::plan::EpochPlan::new(samples.samples(), &cfg, 1).unwrap();
                    owed.extend(p.ids(0..p.padding_from()).iter().copied());
                }
                owed.sort_unstable();
                let out = Command::new(&exe)
                    .arg(&data)
                    .args([o, lb, w, k, w2].map(|v| v.to_string()))
                    .output()
                    .unwrap();
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "{what}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let mut got: Vec<u32> = stdout
                    .lines()
                    .filter_map(|l| l.strip_prefix("id "))
                    .map(|v| v.parse().unwrap())
                    .collect();
                got.sort_unstable();
                assert_eq!(got, owed, "{what}");
                let counts: Vec<&str> = stdout
                    .lines()
                    .filter_map(|l| l.split_once(" batches ").map(|(_, c)| c))
                    .collect();
                assert_eq!(counts.len(), w2 as usize, "{what}");
                assert!(
                    counts.windows(2).all(|c| c[0] == c[1]),
                    "{what}: {counts:?}"
                );
            }
        }
    }
}

/// The CLI's `inspect --json` over `paths` with `--FLAG VALUE` for each option.
fn cli_inspect(paths: &[&Path], opts: &[(&str, &str)]) -> serde_json::Value {
    let mut c = Command::new(gpufeed_bin());
    c.env("GPUFEED_QUIET", "1").args(["inspect", "--json"]);
    for (k, v) in opts {
        let flag = format!("--{}", k.replace('_', "-"));
        match *v {
            "true" => c.arg(flag), // a yes/no option is a flag on the command line
            v => c.arg(flag).arg(v),
        };
    }
    c.args(paths);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Every dataset option the CLI takes reaches the C door under the same name: set all of them
/// (to values other than their defaults) through the options struct and through the CLI, and
/// the dataset options in effect are the same; so is the number of samples (token windows that
/// depend on token_dtype, seq_len and stride). And last_batch pad flags exactly the repeats.
#[test]
fn every_dataset_option_reaches_the_c_options_struct() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on this machine");
        return;
    }
    let lib = build_capi();
    let dir = disk_dir();
    let exe = compile_named(dir.path(), &lib, "options");
    let tokens = dir.path().join("train.bin");
    let words: Vec<u8> = (0..5000u32)
        .flat_map(|t| (t * 7919).to_le_bytes())
        .collect();
    std::fs::write(&tokens, &words).unwrap();
    let all: Vec<(&str, &str)> = vec![
        ("format", "tokens"),
        ("payload", "png,jpg"),
        ("label_ext", "txt"),
        ("label_offset", "1"),
        ("tfrecord_index", "/no/such/index"),
        ("tfrecord_payload", "img"),
        ("tfrecord_label", "y"),
        ("tfrecord_recover", "true"),
        ("token_dtype", "u32"),
        ("seq_len", "64"),
        ("stride", "32"),
        ("strict", "true"),
        ("cache_dir", "/no/such/cache"),
        ("cache_limit", "1048576"),
        ("cache_extent", "65536"),
    ];
    let names: Vec<&str> = gpufeed::dataset::DATASET_OPTIONS
        .iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(
        all.iter().map(|x| x.0).collect::<Vec<_>>(),
        names,
        "the test sets every option"
    );
    let cli = cli_inspect(&[&tokens], &all);
    let run = |extra: &[(&str, &str)], paths: &[&Path]| -> (serde_json::Value, Vec<u64>) {
        let mut c = Command::new(&exe);
        for (k, v) in extra {
            c.arg(format!("{k}={v}"));
        }
        c.arg("--").args(paths);
        let o = c.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let json = out
            .lines()
            .find_map(|l| l.strip_prefix("options "))
            .unwrap();
        let nums = out
            .lines()
            .last()
            .unwrap()
            .split(' ')
            .filter_map(|w| w.parse().ok())
            .collect();
        (serde_json::from_str(json).unwrap(), nums)
    };
    let (c_opts, nums) = run(&all, &[&tokens]);
    assert_eq!(c_opts, cli["options"], "C and CLI options differ");
    // Rust: the same names through OpenOptions::set.
    let mut rust = gpufeed::dataset::OpenOptions::default();
    for (k, v) in &all {
        rust.set(k, v).unwrap();
    }
    assert_eq!(rust.to_json(), cli["options"]);
    let windows = (5000 - 65) / 32 + 1;
    assert_eq!(cli["samples"], windows);
    assert_eq!(nums[0], windows, "samples read through C");
    assert_eq!(nums[1], 0, "no padding by default");

    // last_batch pad over 3 ranks: rank 2 of ⌈N/3⌉ samples holds the repeats, flagged.
    let mut pad = all.clone();
    pad.extend([
        ("last_batch", "2"),
        ("world_size", "3"),
        ("rank", "2"),
        ("batch_size", "5"),
    ]);
    let (_, nums) = run(&pad, &[&tokens]);
    let per = windows.div_ceil(3);
    assert_eq!(nums[0], per);
    assert_eq!(nums[1], per * 3 - windows, "{nums:?}");
    // Sequential order (3) reads the same samples; a timeout (opt-in) while every batch is kept
    // says why in C's own names, and the epoch goes on once they are freed.
    let mut seq = all.clone();
    seq.extend([("order", "3"), ("batch_size", "16")]);
    let (_, nums) = run(&seq, &[&tokens]);
    assert_eq!(nums[0], windows, "sequential: every sample once");
    let mut held = seq.clone();
    held.extend([
        ("batch_size", "4"),
        ("prefetch", "1"),
        ("timeout_ms", "300"),
        ("keep", "1"),
    ]);
    let mut c = Command::new(&exe);
    for (k, v) in &held {
        c.arg(format!("{k}={v}"));
    }
    let o = c.arg("--").arg(&tokens).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let t = out
        .lines()
        .find(|l| l.starts_with("timeout "))
        .expect("a timeout");
    assert!(
        t.contains("gpufeed_options.timeout_ms is 0.3 s")
            && t.contains("gpufeed_options.prefetch 1")
            && t.contains("handed out and are still alive"),
        "{t}"
    );
    let last = out.lines().last().unwrap();
    assert!(last.starts_with(&format!("samples {windows} ")), "{out}");
    // Two files as one dataset (gpufeed_loader_open_paths).
    let second = dir.path().join("val.bin");
    std::fs::write(&second, &words[..4 * 1000]).unwrap();
    let (_, nums) = run(&all, &[&tokens, &second]);
    assert_eq!(nums[0], windows + (1000 - 65) / 32 + 1);

    // Problems reach C: a tar set with one truncated tar opens with its problem counted and
    // readable; with strict it is refused, saying why.
    let src = d_src(dir.path());
    let good = dir.path().join("good.tar");
    let cut = dir.path().join("cut.tar");
    let mut c = Command::new("tar");
    c.args(["--sort=name", "-cf"])
        .arg(&good)
        .arg("-C")
        .arg(&src)
        .arg(".");
    assert!(c.status().unwrap().success());
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2 + 100]).unwrap();
    let o = Command::new(&exe)
        .args(["--", good.to_str().unwrap(), cut.to_str().unwrap()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    let problem = out.lines().find(|l| l.starts_with("problem ")).unwrap();
    assert!(
        problem.contains("cut.tar") && problem.contains("truncated"),
        "{problem}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("problems ") && l != "problems 0"),
        "{out}"
    );
    let o = Command::new(&exe)
        .args([
            "strict=true",
            "--",
            good.to_str().unwrap(),
            cut.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("refused") && out.contains("strict") && out.contains("cut.tar"),
        "{out}"
    );
    // gpufeed_verify: the sound tar is OK, the cut one names itself and counts its damage.
    let verify = |p: &Path| -> String {
        let o = Command::new(&exe)
            .args(["verify_only=1", "--"])
            .arg(p)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("verify ").map(String::from))
            .unwrap()
    };
    assert_eq!(verify(&good).trim_end(), "0 10 0");
    let cut_report = verify(&cut);
    assert!(
        cut_report.starts_with("5 ") && cut_report.contains("cut.tar"),
        "{cut_report}"
    );
    let bad: u64 = cut_report.split(' ').nth(2).unwrap().parse().unwrap();
    assert!(bad >= 1, "{cut_report}");
}

/// Ten samples as files for tar: `NNN.jpg` and `NNN.cls`.
fn d_src(dir: &Path) -> PathBuf {
    let src = dir.join("members");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..10 {
        std::fs::write(src.join(format!("{i:03}.jpg")), vec![i as u8; 3000]).unwrap();
        std::fs::write(src.join(format!("{i:03}.cls")), format!("{i}")).unwrap();
    }
    src
}

#[test]
fn a_c_program_reads_decoded_images() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (cc) on this machine");
        return;
    }
    let lib = build_capi();
    let dir = disk_dir();
    let exe = compile_named(dir.path(), &lib, "images");
    let images = dir.path().join("jpegs");
    gpufeed::testing::synth::write_image_folder(&images, 30, 4).unwrap();
    let good = std::fs::read(images.join("c0000/00000000.jpg")).unwrap();
    std::fs::write(images.join("c0000/zz-cut.jpg"), &good[..good.len() / 3]).unwrap();
    let out = Command::new(&exe).arg(&images).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().last().unwrap(),
        "samples 31 bad 1 zero 1 finite 1"
    );
    let bad = stdout.lines().find(|l| l.starts_with("bad ")).unwrap();
    assert!(
        bad.contains("zz-cut.jpg") && bad.contains("truncated"),
        "{bad}"
    );
    assert!(stdout.contains("refused: dtype 7"), "{stdout}");
    // The raw epoch in progress when decoding was asked for delivered every sample.
    assert!(stdout.lines().any(|l| l == "raw 31"), "{stdout}");
}

/// The settings JSON of `gpufeed bench load --json` (its first loader mode's row) over `paths`.
fn cli_settings(dir: &Path, paths: &[&Path], mode: &str, flags: &[&str]) -> serde_json::Value {
    let mut c = Command::new(gpufeed_bin());
    c.env("GPUFEED_QUIET", "1")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .args([
            "bench", "load", "--json", "--format", "tokens", "--modes", mode,
        ])
        .arg("--dir")
        .arg(dir.join("bench-load"))
        .args(flags);
    for p in paths {
        c.arg("--dataset").arg(p);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let row: serde_json::Value = out
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON row in {out}"));
    row["settings"].clone()
}

/// `json` with only the names `keep` keeps.
fn only(json: &serde_json::Value, keep: impl Fn(&str) -> bool) -> serde_json::Value {
    let mut m = json.as_object().unwrap().clone();
    m.retain(|k, _| keep(k));
    serde_json::Value::Object(m)
}

/// `json` with only the loader settings `door` takes.
fn at_door(json: &serde_json::Value, door: gpufeed::config::FrontDoor) -> serde_json::Value {
    only(json, |k| {
        gpufeed::config::LOADER_SETTINGS
            .iter()
            .any(|o| o.name == k && o.at(door))
    })
}

/// Every loader setting reaches every door with the table's default, and a value given at a
/// door reaches the loader: the Rust builder, the C options struct (`gpufeed_options_default`,
/// then every field set), the CLI's flags (`bench load`, old spellings too). Python's door is
/// held to the same table by `python/tests/test_loader.py` (`Settings`).
#[test]
fn every_loader_setting_reaches_every_door_with_the_tables_default() {
    use gpufeed::config::{FrontDoor, LoaderSettings, LOADER_SETTINGS};
    let dir = disk_dir();
    let tokens = dir.path().join("train.bin");
    let words: Vec<u8> = (0..20000u32)
        .flat_map(|t| (t * 7919).to_le_bytes())
        .collect();
    std::fs::write(&tokens, &words).unwrap();
    let mut o = gpufeed::dataset::OpenOptions::default();
    o.set("format", "tokens").unwrap();
    let ds = gpufeed::Dataset::open_paths(std::slice::from_ref(&tokens), &o).unwrap();

    // Rust: the builder's defaults are the table's.
    let loader = gpufeed::Loader::builder(ds).build().unwrap();
    let defaults = LoaderSettings::defaults_json(FrontDoor::Rust);
    assert_eq!(
        at_door(&loader.settings().to_json(), FrontDoor::Rust),
        defaults
    );

    // The values every door is given below, as `LoaderSettings::set` reads them.
    let given: Vec<(&str, &str)> = vec![
        ("batch_size", "16"),
        ("order", "block"),
        ("seed", "9"),
        ("rank", "1"),
        ("world_size", "2"),
        ("prefetch", "3"),
        ("in_flight", "4"),
        ("last_batch", "pad"),
        ("verify", "false"),
        ("shuffle_buffer", "77"),
        ("block_bytes", "65536"),
        ("open_blocks", "3"),
        ("queue_depth", "16"),
        ("memory_budget", "67108864"),
        ("timeout", "250"),
        ("open_files_max", "4"),
    ];
    let mut want = LoaderSettings::default();
    for (k, v) in &given {
        want.set(k, v).unwrap();
    }
    let want = want.to_json();
    // Every setting is given a value other than its default, except those no door but Python
    // takes, and the device (a CUDA device needs a GPU).
    for s in LOADER_SETTINGS {
        let tested = given.iter().any(|(k, _)| *k == s.name);
        let exempt = s.name == "device" || !(s.at(FrontDoor::C) || s.at(FrontDoor::Cli));
        assert!(tested || exempt, "{} is not given at any door here", s.name);
    }

    // CLI: defaults, then every flag it takes.
    let cli = cli_settings(dir.path(), &[&tokens], "global", &[]);
    assert_eq!(
        at_door(&cli, FrontDoor::Cli),
        LoaderSettings::defaults_json(FrontDoor::Cli),
        "bench load's defaults"
    );
    let mut flags: Vec<String> = Vec::new();
    for (k, v) in &given {
        let s = LOADER_SETTINGS.iter().find(|s| s.name == *k).unwrap();
        if s.at(FrontDoor::Cli) {
            flags.push(format!("--{}", s.flag));
            flags.push(v.to_string());
        }
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cli = cli_settings(dir.path(), &[&tokens], "block", &flags);
    assert_eq!(
        at_door(&cli, FrontDoor::Cli),
        at_door(&want, FrontDoor::Cli),
        "bench load's flags"
    );
    // The flags' old spellings.
    let cli = cli_settings(
        dir.path(),
        &[&tokens],
        "global",
        &["--batch", "16", "--qd", "16", "--no-verify"],
    );
    assert_eq!(
        (&cli["batch_size"], &cli["queue_depth"], &cli["verify"]),
        (&"16".into(), &"16".into(), &"false".into())
    );

    // C: the struct gpufeed_options_default fills, then every field set.
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped the C door: no C compiler (cc) on this machine");
        return;
    }
    let lib = build_capi();
    let exe = compile_named(dir.path(), &lib, "options");
    let settings = |args: &[String]| -> serde_json::Value {
        let o = Command::new(&exe)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .args(args)
            .arg("format=tokens")
            .arg("--")
            .arg(&tokens)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("settings "))
            .unwrap();
        serde_json::from_str(line).unwrap()
    };
    assert_eq!(
        at_door(&settings(&[]), FrontDoor::C),
        LoaderSettings::defaults_json(FrontDoor::C),
        "gpufeed_options_default"
    );
    // C spells names with numbers and milliseconds.
    let c_value = |k: &str, v: &str| -> (String, String) {
        match (k, v) {
            ("order", "block") => ("order".into(), "2".into()),
            ("last_batch", "pad") => ("last_batch".into(), "2".into()),
            ("verify", "false") => ("verify".into(), "0".into()),
            ("timeout", secs) => (
                "timeout_ms".into(),
                (secs.parse::<u64>().unwrap() * 1000).to_string(),
            ),
            (k, v) => (k.into(), v.into()),
        }
    };
    let args: Vec<String> = given
        .iter()
        .map(|(k, v)| {
            let (k, v) = c_value(k, v);
            format!("{k}={v}")
        })
        .collect();
    assert_eq!(
        at_door(&settings(&args), FrontDoor::C),
        at_door(&want, FrontDoor::C),
        "every C field"
    );
    // torchrun's environment reaches the C defaults as it does Python's.
    let o = Command::new(&exe)
        .env("RANK", "1")
        .env("WORLD_SIZE", "3")
        .args(["format=tokens", "--"])
        .arg(&tokens)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("settings "))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!((&v["rank"], &v["world_size"]), (&"1".into(), &"3".into()));
}

/// `json` with only the image settings `door` takes.
fn at_image_door(json: &serde_json::Value, door: gpufeed::config::FrontDoor) -> serde_json::Value {
    only(json, |k| {
        gpufeed::decode::IMAGE_SETTINGS
            .iter()
            .any(|o| o.name == k && o.at(door))
    })
}

#[test]
fn every_image_setting_reaches_every_door_with_the_tables_default() {
    use gpufeed::config::FrontDoor;
    use gpufeed::decode::{ImageSpec, IMAGE_SETTINGS};
    // Rust: the spec's defaults are the table's (Python's door is held to it by
    // python/tests/test_images.py).
    assert_eq!(
        ImageSpec::default().settings_json(),
        ImageSpec::defaults_json(FrontDoor::Rust)
    );
    assert_eq!(ImageSpec::default(), ImageSpec::train(224));

    // Two specs given every setting a value other than its default: a training one, and an
    // evaluation one for what only it uses.
    let train: Vec<(&str, String)> = [
        ("transform", "train"),
        ("size", "48"),
        ("dtype", "bfloat16"),
        ("layout", "nhwc"),
        ("mean", "0.5,0.25,0.125"),
        ("std", "0.5,0.5,0.25"),
        ("threads", "3"),
        ("scale", "0.25,0.75"),
        ("ratio", "0.5,2"),
        ("flip_p", "0.25"),
        ("dct_scaling", "false"),
        ("max_pixels", "1000000"),
        ("prefetch_batches", "4"),
        ("hardware_decoder", "false"),
    ]
    .map(|(k, v)| (k, v.to_string()))
    .to_vec();
    let eval: Vec<(&str, String)> = [("transform", "eval"), ("size", "40"), ("resize", "60")]
        .map(|(k, v)| (k, v.to_string()))
        .to_vec();
    for s in IMAGE_SETTINGS {
        let d = ImageSpec::defaults_json(FrontDoor::Rust)[s.name].clone();
        let differs = |given: &[(&str, String)]| {
            given.iter().any(|(k, _)| *k == s.name)
                && ImageSpec::from_settings(given).unwrap().settings_json()[s.name] != d
        };
        assert!(
            differs(&train) || differs(&eval),
            "{} is given no value other than its default here",
            s.name
        );
    }
    // What a door makes of the values it takes.
    let want = |given: &[(&str, String)], door: FrontDoor| {
        let taken: Vec<(&str, String)> = given
            .iter()
            .filter(|(k, _)| IMAGE_SETTINGS.iter().any(|s| s.name == *k && s.at(door)))
            .cloned()
            .collect();
        at_image_door(
            &ImageSpec::from_settings(&taken).unwrap().settings_json(),
            door,
        )
    };

    // CLI: bench decode's flags, defaults and given.
    let dir = disk_dir();
    let cli = |flags: &[String]| -> serde_json::Value {
        let o = Command::new(gpufeed_bin())
            .env("GPUFEED_QUIET", "1")
            .args(["bench", "decode", "--json", "--rows", "gpufeed-train"])
            .args(["--images", "8", "--batch", "4", "--rounds", "1", "--dir"])
            .arg(dir.path().join("decode"))
            .args(flags)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout);
        out.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|r| r.get("images_settings").cloned())
            .unwrap_or_else(|| panic!("no row with images_settings in {out}"))
    };
    assert_eq!(
        at_image_door(&cli(&[]), FrontDoor::Cli),
        ImageSpec::defaults_json(FrontDoor::Cli),
        "bench decode's defaults"
    );
    let flags: Vec<String> = train
        .iter()
        .filter(|(k, _)| {
            IMAGE_SETTINGS
                .iter()
                .any(|s| s.name == *k && s.at(FrontDoor::Cli))
        })
        .flat_map(|(k, v)| [format!("--{k}"), v.clone()])
        .collect();
    assert_eq!(flags.len(), 8, "{flags:?}");
    assert_eq!(
        at_image_door(&cli(&flags), FrontDoor::Cli),
        want(&train, FrontDoor::Cli),
        "bench decode's flags"
    );
    let o = Command::new(gpufeed_bin())
        .args(["bench", "decode", "--dtype", "int8", "--dir"])
        .arg(dir.path().join("decode"))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("--dtype \"int8\": expected uint8, float16"),
        "{e}"
    );

    // C: the struct gpufeed_images_default fills, then every field set (names as numbers).
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped the C door: no C compiler (cc) on this machine");
        return;
    }
    let lib = build_capi();
    let exe = compile_named(dir.path(), &lib, "image_settings");
    let images = dir.path().join("jpegs");
    gpufeed::testing::synth::write_image_folder(&images, 4, 2).unwrap();
    let c = |given: &[(&str, String)]| -> String {
        let args: Vec<String> = given
            .iter()
            .filter(|(k, _)| {
                IMAGE_SETTINGS
                    .iter()
                    .any(|s| s.name == *k && s.at(FrontDoor::C))
            })
            .map(|(k, v)| {
                let s = IMAGE_SETTINGS.iter().find(|s| s.name == *k).unwrap();
                let v = s.code_of(v).map_or(v.clone(), |n| n.to_string());
                format!("{k}={v}")
            })
            .collect();
        let o = Command::new(&exe)
            .args(&args)
            .arg("--")
            .arg(&images)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let json = |out: String| -> serde_json::Value {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("images "))
            .unwrap_or_else(|| panic!("no settings in {out}"));
        serde_json::from_str(line).unwrap()
    };
    assert_eq!(
        at_image_door(&json(c(&[])), FrontDoor::C),
        ImageSpec::defaults_json(FrontDoor::C),
        "gpufeed_images_default"
    );
    for given in [&train, &eval] {
        assert_eq!(
            at_image_door(&json(c(given)), FrontDoor::C),
            want(given, FrontDoor::C),
            "every gpufeed_images field"
        );
    }
    let refused = c(&[("layout", "7".to_string())]);
    assert!(
        refused.contains("refused layout 7: 0 nchw, 1 nhwc"),
        "{refused}"
    );
}
