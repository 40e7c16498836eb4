//! The `gpufeed` command: JSON output, forced engines, clear errors.

use std::process::Command;

use crate::common::*;

fn gpufeed() -> Command {
    let mut c = Command::new(gpufeed_bin());
    c.env("GPUFEED_QUIET", "1").env_remove("GPUFEED_ENGINE");
    c
}

#[test]
fn bench_io_json_has_every_field_and_real_numbers() {
    let dir = disk_dir();
    let file = dir.path().join("b.dat");
    let out = gpufeed()
        .args([
            "bench",
            "io",
            "--file",
            file.to_str().unwrap(),
            "--size",
            "64M",
            "--seconds",
            "0.3",
        ])
        .args([
            "--bs",
            "4K/50:64K/50",
            "--qd",
            "8",
            "--engine",
            "uring,pread-pool",
            "--pattern",
            "rand,seq",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let runs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 4, "{text}");
    for r in &runs {
        for k in [
            "engine",
            "pattern",
            "bs",
            "qd",
            "bytes",
            "seconds",
            "gib_per_s",
            "iops",
            "lat_us_p50",
            "lat_us_p99",
            "cpu_s_per_gib",
            "syscalls_per_read",
        ] {
            assert!(r.get(k).is_some(), "missing {k} in {r}");
        }
        assert!(r["bytes"].as_u64().unwrap() > 0);
        assert!(r["gib_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["lat_us_p99"].as_f64().unwrap() >= r["lat_us_p50"].as_f64().unwrap());
        assert_eq!(r["qd"], 8);
    }
    assert_eq!(runs[0]["engine"], "uring");
    assert_eq!(runs[1]["engine"], "pread-pool");
    assert_eq!(runs[2]["pattern"], "seq");
    // The file was created with the requested size.
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 64 << 20);
}

#[test]
fn environment_forces_the_engine_end_to_end() {
    let dir = disk_dir();
    let file = dir.path().join("b.dat");
    for forced in ["pread-pool", "uring-buffered", "std"] {
        let out = gpufeed()
            .env("GPUFEED_ENGINE", forced)
            .args([
                "bench",
                "io",
                "--file",
                file.to_str().unwrap(),
                "--size",
                "16M",
                "--seconds",
                "0.1",
            ])
            .args(["--bs", "4K", "--engine", "uring", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["engine"], forced);
        assert_eq!(r["direct"], forced == "pread-pool");
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let out = gpufeed()
        .args(["bench", "io", "--bs", "4K/70:8K/70"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("weights"), "{err}");
    let out = gpufeed()
        .args(["bench", "io", "--engine", "turbo"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown engine"));
    let out = gpufeed()
        .args([
            "bench",
            "io",
            "--file",
            "/nonexistent-dir/x.dat",
            "--size",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent-dir/x.dat"));
    // A misspelt bench gpu row is named before any GPU is looked for (so also without one).
    let out = gpufeed()
        .args(["bench", "gpu", "--paths", "host,cufiel"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown bench gpu row 'cufiel'") && err.contains("cufile"),
        "{err}"
    );
}

#[test]
fn pack_inspect_verify_round_trip_and_catch_corruption() {
    let dir = disk_dir();
    let src = dir.path().join("imagefolder");
    for (class, n) in [("cat", 30), ("dog", 25), ("emu", 7)] {
        std::fs::create_dir_all(src.join(class)).unwrap();
        for i in 0..n {
            let bytes: Vec<u8> = (0..(100 + i * 97)).map(|j| (j * 31 + i) as u8).collect();
            std::fs::write(src.join(class).join(format!("{i:03}.jpg")), bytes).unwrap();
        }
    }
    let out = dir.path().join("packed");
    let run = |args: &[&str]| gpufeed().args(args).output().unwrap();
    let o = run(&[
        "pack",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
        "--shard-size",
        "4K",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["samples"], 62);
    let shards = s["shards"].as_array().unwrap().len();
    assert!(shards > 3, "{s}");
    // Packing again with another thread count gives identical shards.
    let out2 = dir.path().join("packed2");
    let o = run(&[
        "pack",
        src.to_str().unwrap(),
        out2.to_str().unwrap(),
        "--shard-size",
        "4K",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success());
    for k in 0..shards {
        let name = format!("shard-{k:05}.gpf");
        assert_eq!(
            std::fs::read(out.join(&name)).unwrap(),
            std::fs::read(out2.join(&name)).unwrap(),
            "{name}"
        );
    }
    let o = run(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success());
    let i: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (
            i["samples"].as_u64(),
            i["labels"].as_u64(),
            i["format"].as_str()
        ),
        (Some(62), Some(3), Some("packed"))
    );
    let o = run(&["verify", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // Flip a byte inside the first sample of the second shard: verify names it and fails.
    let victim = out.join("shard-00001.gpf");
    let idx = gpufeed::dataset::shard::read_index(&victim).unwrap();
    let mut b = std::fs::read(&victim).unwrap();
    b[idx.entries[0].offset as usize + 5] ^= 1;
    std::fs::write(&victim, &b).unwrap();
    let o = run(&["verify", out.to_str().unwrap()]);
    assert!(!o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("shard-00001.gpf")
            && text.contains("sample 0")
            && text.contains("checksum mismatch"),
        "{text}"
    );
    assert!(text.contains("1 bad"), "{text}");
}

/// Every path form the docs show — a Megatron prefix, a token file with `--format tokens`, a
/// directory of tars, a list of files, a directory of TFRecords, a directory of shards — works
/// with every command: `inspect`, `verify`, `pack` (and the packed copy has the same samples)
/// and `bench load --dataset` (which reads it without generating its own set).
#[test]
fn every_command_accepts_every_dataset_path_form() {
    let dir = disk_dir();
    let d = dir.path();
    // A Megatron pair: 6 uint16 sequences.
    let lens = [5u32, 9, 1, 30, 12, 7];
    let mut bin = Vec::new();
    let mut idx = b"MMIDIDX\0\0".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(8);
    idx.extend_from_slice(&(lens.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(lens.len() as u64 + 1).to_le_bytes());
    for l in lens {
        idx.extend_from_slice(&(l as i32).to_le_bytes());
    }
    let mut at = 0i64;
    for l in lens {
        idx.extend_from_slice(&at.to_le_bytes());
        at += 2 * l as i64;
        bin.extend((0..l).flat_map(|t| (t as u16).to_le_bytes()));
    }
    for k in 0..=lens.len() as u64 {
        idx.extend_from_slice(&k.to_le_bytes());
    }
    std::fs::write(d.join("mega_text_document.idx"), idx).unwrap();
    std::fs::write(d.join("mega_text_document.bin"), bin).unwrap();
    // A flat token file: 3000 uint16 tokens, windows of 65 every 64.
    let toks: Vec<u8> = (0..3000u16).flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(d.join("train.bin"), toks).unwrap();
    // Two tars of 5 samples each, in a directory.
    std::fs::create_dir_all(d.join("tars")).unwrap();
    for t in 0..2 {
        let src = d.join(format!("src{t}"));
        std::fs::create_dir_all(&src).unwrap();
        for i in 0..5 {
            std::fs::write(src.join(format!("{t}{i:03}.jpg")), vec![i as u8; 100 + i]).unwrap();
            std::fs::write(src.join(format!("{t}{i:03}.cls")), format!("{i}")).unwrap();
        }
        let mut c = Command::new("tar");
        c.arg("--sort=name")
            .arg("-cf")
            .arg(d.join(format!("tars/part-{t}.tar")))
            .arg("-C")
            .arg(&src)
            .arg(".");
        assert!(c.status().unwrap().success());
    }
    // TFRecord Examples in a directory.
    std::fs::create_dir_all(d.join("tfr")).unwrap();
    let mut rec = Vec::new();
    for i in 0..7 {
        rec.extend(tf_record(&tf_example(&vec![i as u8; 50 + i], i as i64)));
    }
    std::fs::write(d.join("tfr/a.tfrecord"), rec).unwrap();

    let p = |s: &str| d.join(s).display().to_string();
    let forms: Vec<(&str, Vec<String>, Vec<&str>, u64)> = vec![
        ("megatron prefix", vec![p("mega_text_document")], vec![], 6),
        (
            "token file",
            vec![p("train.bin")],
            vec!["--format", "tokens", "--seq-len", "64"],
            (3000 - 65) / 64 + 1,
        ),
        ("directory of tars", vec![p("tars")], vec![], 10),
        (
            "list of tars",
            vec![p("tars/part-0.tar"), p("tars/part-1.tar")],
            vec![],
            10,
        ),
        ("directory of tfrecords", vec![p("tfr")], vec![], 7),
    ];
    for (k, (what, paths, flags, n)) in forms.iter().enumerate() {
        let run = |args: &[&str], extra: &[String]| -> String {
            let o = gpufeed()
                .args(args)
                .args(flags)
                .args(extra)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{what}: {args:?}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            String::from_utf8(o.stdout).unwrap()
        };
        let inspect: serde_json::Value =
            serde_json::from_str(&run(&["inspect", "--json"], paths)).unwrap();
        assert_eq!(inspect["samples"], *n, "{what}: inspect");
        // verify prints a line per bad sample (none here), then its summary.
        let verify_out = run(&["verify", "--json"], paths);
        let summary: serde_json::Value =
            serde_json::from_str(verify_out.lines().last().unwrap_or_default()).unwrap();
        assert_eq!(summary["summary"], true, "{what}: verify {verify_out}");
        assert_eq!(summary["ok"], true, "{what}: verify {verify_out}");
        assert_eq!(summary["samples"], *n, "{what}: verify {verify_out}");
        let out = d.join(format!("packed-{k}"));
        let mut pack_args = paths.clone();
        pack_args.push(out.display().to_string());
        run(&["pack", "--json"], &pack_args);
        let o = gpufeed()
            .args(["inspect", "--json"])
            .arg(&out)
            .output()
            .unwrap();
        let packed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(packed["samples"], *n, "{what}: packed copy");
        let mut load = vec![
            "bench".to_string(),
            "load".into(),
            "--modes".into(),
            "global,block".into(),
            "--batch".into(),
            "4".into(),
            "--json".into(),
            "--dir".into(),
            d.join("no-generated-set").display().to_string(),
        ];
        for path in paths {
            load.push("--dataset".into());
            load.push(path.clone());
        }
        let args: Vec<&str> = load.iter().map(String::as_str).collect();
        let rows: Vec<serde_json::Value> = run(&args, &[])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 2, "{what}");
        for r in &rows {
            assert_eq!(r["samples"], *n, "{what}: bench load {r}");
            assert_eq!(r["sample_errors"], 0, "{what}");
        }
        assert!(
            !d.join("no-generated-set").exists(),
            "{what}: bench load --dataset generated a data set"
        );
    }
}
