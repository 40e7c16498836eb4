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

/// Malformed store settings in the environment are clear errors naming the variable, never a
/// panic (issue 52 item 5: object_store panicked on them at the first request, exit 101 with a
/// backtrace); an empty one is as if unset (an env file's `AWS_ENDPOINT_URL=`), so the
/// profile's endpoint is used. A malformed `GPUFEED_ENGINE` reaches the loader's consumer.
#[test]
fn malformed_store_settings_are_errors_and_empty_ones_are_unset() {
    let dir = disk_dir();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!("[default]\nendpoint_url = http://127.0.0.1:{port}\nregion = us-east-1\n"),
    )
    .unwrap();
    let run = |vars: &[(&str, &str)]| {
        let mut c = gpufeed();
        c.args(["inspect", "s3://bucket/prefix"])
            .env("GPUFEED_CACHE_DIR", dir.path().join("cache"))
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"))
            .env("AWS_ACCESS_KEY_ID", "k")
            .env("AWS_SECRET_ACCESS_KEY", "s");
        for k in [
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT",
            "AWS_ENDPOINT_URL_S3",
            "AWS_REGION",
        ] {
            c.env_remove(k);
        }
        for (k, v) in vars {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{vars:?}: {err}");
        assert!(!err.contains("panicked"), "{vars:?}: {err}");
        err
    };
    for (name, value) in [
        ("AWS_ENDPOINT_URL", "http://h:99999"),
        ("AWS_ENDPOINT_URL", "not a url"),
        ("AWS_ENDPOINT_URL", "http://"),
        ("AWS_ENDPOINT_URL", "ftp://host"),
        // url::Url trims these and spells the host in punycode; object_store panicked on them
        // (third trial, caught, but the panic's text printed).
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000 "),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000\n"),
        ("AWS_ENDPOINT_URL", "http://b\u{fc}cher.example"),
        ("AWS_ENDPOINT", "http://[::1"),
        ("AWS_ENDPOINT_URL_S3", "://x"),
        ("AWS_REGION", "a b"),
        ("AWS_DEFAULT_REGION", "\u{1}"),
        ("AWS_SESSION_TOKEN", "a\nb"),
    ] {
        let err = run(&[(name, value)]);
        assert!(err.contains(name), "{name}={value:?}: {err}");
        assert!(!err.contains("panic"), "{name}={value:?}: {err}");
    }
    // An engine the loader cannot make is said as such (before: "the I/O thread ended before
    // the epoch was complete", the reason lost with the thread).
    let out = gpufeed()
        .args([
            "bench",
            "load",
            "--samples",
            "200",
            "--modes",
            "global",
            "--dir",
        ])
        .arg(dir.path().join("load"))
        .env("GPUFEED_ENGINE", "turbo")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("GPUFEED_ENGINE: unknown engine \"turbo\""),
        "{err}"
    );
    // Empty: the profile's endpoint (a closed port) is tried, not AWS's nor an empty one.
    for name in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"] {
        let err = run(&[(name, "")]);
        assert!(err.contains("connection refused"), "{name}=\"\": {err}");
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
    // A bad name is refused before the default 4 GiB file is made in the working directory.
    let cwd = disk_dir();
    let out = gpufeed()
        .args(["bench", "io", "--engine", "turbo"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown engine"));
    let made: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(made.is_empty(), "a refused bench made files: {made:?}");
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
    // `bench load --dir` never deletes folders it did not generate.
    let dir = disk_dir();
    let mine = dir.path().join("small").join("mine.jpg");
    std::fs::create_dir_all(mine.parent().unwrap()).unwrap();
    std::fs::write(&mine, b"user data").unwrap();
    let err = stderr_of_failure(
        gpufeed()
            .args([
                "bench",
                "load",
                "--samples",
                "10",
                "--modes",
                "global",
                "--dir",
            ])
            .arg(dir.path()),
    );
    assert!(err.contains("not generated by gpufeed bench"), "{err}");
    assert_eq!(std::fs::read(&mine).unwrap(), b"user data");
    // The tokio-uring peer needs its feature; without it the error says how to build it.
    if !cfg!(feature = "tokio-uring") {
        let err = stderr_of_failure(
            gpufeed()
                .args(["bench", "io", "--engine", "uring,tokio-uring", "--file"])
                .arg(dir.path().join("io.dat"))
                .args(["--size", "1M", "--seconds", "0.1"]),
        );
        assert!(err.contains("--features tokio-uring"), "{err}");
    }
    // A misspelt bench gpu row is named before any GPU is looked for (so also without one).
    let err = stderr_of_failure(gpufeed().args(["bench", "gpu", "--paths", "host,cufiel"]));
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

    // Packing the damaged copy leaves that sample out, names it, packs the other 61 and exits
    // non-zero; --strict stops at it and leaves nothing that reads as a dataset.
    let out3 = dir.path().join("repacked");
    let o = run(&[
        "pack",
        out.to_str().unwrap(),
        out3.to_str().unwrap(),
        "--json",
    ]);
    assert!(!o.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let bad = lines[0].to_string();
    assert!(
        bad.contains("shard-00001.gpf") && bad.contains("checksum mismatch"),
        "{bad}"
    );
    assert_eq!(
        (lines[1]["samples"].as_u64(), lines[1]["skipped"].as_u64()),
        (Some(61), Some(1))
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1 sample(s) could not be packed"), "{err}");
    let o = run(&["inspect", out3.to_str().unwrap(), "--json"]);
    let i: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(i["samples"].as_u64(), Some(61));
    let out4 = dir.path().join("strict");
    let o = run(&[
        "pack",
        out.to_str().unwrap(),
        out4.to_str().unwrap(),
        "--strict",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("checksum mismatch") && err.contains("shard-00001.gpf"),
        "{err}"
    );
    assert!(
        gpufeed::Dataset::open(&out4).is_err(),
        "a strict pack that failed left shards"
    );

    // --check-images also leaves out what is not the image it claims (an HTML page, a
    // truncated JPEG); without it their bytes are packed as they are.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir_all(mixed.join("a")).unwrap();
    let good = gpufeed::testing::synth::jpeg(3, 0).unwrap();
    std::fs::write(mixed.join("a/0-good.jpg"), &good).unwrap();
    std::fs::write(
        mixed.join("a/1-good.jpg"),
        gpufeed::testing::synth::jpeg(3, 1).unwrap(),
    )
    .unwrap();
    std::fs::write(mixed.join("a/2-html.jpg"), b"<html>404</html>").unwrap();
    std::fs::write(mixed.join("a/3-cut.jpg"), &good[..good.len() / 2]).unwrap();
    let o = run(&[
        "pack",
        mixed.to_str().unwrap(),
        dir.path().join("checked").to_str().unwrap(),
        "--check-images",
    ]);
    assert!(!o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("2-html.jpg")
            && text.contains("3-cut.jpg")
            && !text.contains("good.jpg")
            && text.contains("packed 2 samples")
            && text.contains("2 skipped"),
        "{text}"
    );
    let o = run(&[
        "pack",
        mixed.to_str().unwrap(),
        dir.path().join("as-is").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // verify of those shards checks the images as it does an ImageFolder's (third trial: it
    // said 0 bad): the cut JPEG named by its key (the HTML page claims no image kind here).
    let o = run(&["verify", dir.path().join("as-is").to_str().unwrap()]);
    assert!(!o.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("3-cut.jpg") && text.contains("truncated") && text.contains("1 bad"),
        "{text}"
    );
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
        // Labels counted as labels: token windows have none (the trial: "1 labels", the -1
        // that means none counted as one).
        let text = run(&["inspect"], paths);
        let (want, count) = match *what {
            "megatron prefix" | "token file" => (", no labels,", 0),
            "directory of tars" | "list of tars" => (", 5 labels,", 5),
            _ => ("", 0),
        };
        if !want.is_empty() {
            assert!(text.contains(want), "{what}: {text}");
            assert_eq!(inspect["labels"], count, "{what}: {inspect}");
        }
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

/// `bench load --step-ms`: the verdict line says whether the loader keeps up with the trainer's
/// step and, if not, names the part of the waiting that took the most.
#[test]
fn bench_load_step_gives_a_verdict() {
    let dir = disk_dir();
    let run = |step: &str| -> serde_json::Value {
        let out = Command::new(gpufeed_bin())
            .env("GPUFEED_QUIET", "1")
            .args([
                "bench",
                "load",
                "--samples",
                "1200",
                "--modes",
                "global",
                "--json",
            ])
            .args(["--batch", "16", "--step-ms", step, "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(line.lines().last().unwrap()).unwrap()
    };
    // A step far shorter than any disk needs: bound, and the bound is a named part.
    let v = run("0.001");
    let verdict = v["verdict"].as_str().unwrap();
    assert!(verdict.contains("-bound at"), "{verdict}");
    let stall = &v["stall"];
    let total: f64 = [
        "storage_s",
        "remote_s",
        "copy_s",
        "verify_s",
        "decode_s",
        "other_s",
    ]
    .iter()
    .map(|k| stall[k].as_f64().unwrap())
    .sum();
    assert!(total > 0.0);
    assert!(v["stall_fraction"].as_f64().unwrap() > 0.3, "{v}");
    // A generous step: it keeps up.
    let v = run("40");
    let verdict = v["verdict"].as_str().unwrap();
    assert!(verdict.starts_with("keeps up"), "{verdict}");
    assert_eq!(v["gpus"], 1);
    // The alignment reads are planned at, beside what the file system's own forces.
    assert_eq!(v["plan_align_bytes"], 4096, "{v}");
    if let Some(dio) = v["dio_align_bytes"].as_u64() {
        assert!(dio.is_power_of_two() && dio <= 4096, "{v}");
        let floor = v["dio_floor_amplification"].as_f64().unwrap();
        assert!(
            floor >= 1.0 && floor <= v["read_amplification"].as_f64().unwrap() + 1e-9,
            "{v}"
        );
    }
}

/// `--plot FILE.svg` draws the rows as bars with their ratio to the baseline (the last engine).
#[test]
fn bench_io_draws_a_plot() {
    let dir = disk_dir();
    let svg = dir.path().join("io.svg");
    let out = Command::new(gpufeed_bin())
        .env("GPUFEED_QUIET", "1")
        .args([
            "bench",
            "io",
            "--size",
            "16M",
            "--seconds",
            "0.3",
            "--bs",
            "64K",
        ])
        .args(["--engine", "uring,std", "--file"])
        .arg(dir.path().join("f.dat"))
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg"), "{s}");
    assert!(
        s.contains("uring") && s.contains("baseline") && s.contains('×'),
        "{s}"
    );
}

/// A URL's password never appears in what the command line prints (issue 37, item 5): the
/// error names the URL with its userinfo replaced, as text and with `--json`.
#[test]
fn a_urls_password_is_never_printed() {
    for json in [false, true] {
        let mut c = gpufeed();
        c.arg("inspect");
        if json {
            c.arg("--json");
        }
        let out = c
            .arg("http://user:PASSWORD@127.0.0.1:notaport/bucket/x.tar")
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{all}");
        assert!(!all.contains("PASSWORD"), "{all}");
        assert!(all.contains("http://***@127.0.0.1"), "{all}");
    }
}

/// `bench scale` over a billion computed windows (a sparse 2 TiB file) and a small set, one
/// rank and two (each its own process): every row parses, the index holds nothing per window
/// (a run per file), the global and block runs delivered batches, and a rank holds under
/// 64 MiB beside its read buffers (memory, not time: no speed is asserted).
#[test]
fn bench_scale_reports_a_billion_windows_at_no_index_cost() {
    let dir = disk_dir();
    let out = gpufeed()
        .args(["bench", "scale", "--dir"])
        .arg(dir.path())
        .args(["--sizes", "5000,1e9", "--ranks", "1,2", "--seconds", "0.2"])
        .args(["--json", "--batch-size", "64"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        let n = r["samples"].as_u64().unwrap();
        assert!(n == 5000 || n == 1_000_000_000, "{r}");
        // A run per file, nothing per window.
        assert!(
            r["per_rank"][0]["index_bytes"].as_u64().unwrap() <= 4096,
            "{r}"
        );
        assert!(r["global_samples_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["block_samples_per_s"].as_f64().unwrap() > 0.0, "{r}");
        let ranks = r["per_rank"].as_array().unwrap();
        assert_eq!(ranks.len() as u64, r["ranks"].as_u64().unwrap(), "{r}");
        for k in ranks {
            let beside =
                k["peak_rss_bytes"].as_u64().unwrap() - k["buffers_bytes"].as_u64().unwrap();
            assert!(k["pss_bytes"].as_u64().unwrap() > 0, "{k}");
            if n > 1 << 28 {
                assert!(
                    beside < 64 << 20,
                    "{k}: {} MiB beside the buffers",
                    beside >> 20
                );
            }
        }
    }
    // The sparse file is what was asked for: 10^9 windows of 1024 u16 tokens (and one more).
    let f = dir.path().join("tokens-1000000000x1023.bin");
    assert_eq!(
        std::fs::metadata(&f).unwrap().len(),
        (1_000_000_000 * 1023 + 1) * 2
    );
}

/// The node's ranks share one copy of a large sample index: the first process to open the
/// dataset writes its index into `$GPUFEED_INDEX_DIR` and every later one maps that file
/// (`index_bytes.samples_shared`, `node_index`) instead of indexing — after checking it, so a
/// damaged file is replaced, never used; a link planted where the directory goes is not
/// followed (the process keeps its own copy and says so); `GPUFEED_SHARED_INDEX=0` keeps it
/// private. `verify` reads every sample against its checksum through whichever copy is used.
#[test]
fn a_large_index_is_shared_through_one_file_checked_before_use() {
    let dir = disk_dir();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let n = 70_000usize;
    for s in 0..2 {
        let path = data.join(format!("shard-{s:05}.gpf"));
        let mut w = gpufeed::dataset::shard::ShardWriter::create(&path, 1).unwrap();
        for i in s * n / 2..(s + 1) * n / 2 {
            let bytes: Vec<u8> = (0..16 + i % 9).map(|k| (i * 7 + k) as u8).collect();
            w.add(&i.to_string(), (i % 10) as i64, &[], &bytes).unwrap();
        }
        w.finish().unwrap();
    }
    // Files changed in the last two seconds are indexed but their index is not kept.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let cache = dir.path().join("cache").join("index");
    let run = |cmd: &str, env: &[(&str, &std::path::Path)]| {
        let mut c = Command::new(gpufeed_bin());
        c.env("GPUFEED_QUIET", "1")
            .env_remove("GPUFEED_SHARED_INDEX");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.args([cmd, "--json"]).arg(&data).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        (out, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let shared = |out: &str| -> u64 {
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        v["index_bytes"]["samples_shared"].as_u64().unwrap()
    };
    let node_index = |out: &str| -> Option<String> {
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        v["node_index"].as_str().map(String::from)
    };
    let index_files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&cache)
            .map(|d| {
                d.map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|x| x == "gpfidx"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let env = [("GPUFEED_INDEX_DIR", cache.as_path())];
    // The first open writes the file, the second maps it: one file, 16 bytes a sample.
    let (out, _) = run("inspect", &env);
    assert_eq!(shared(&out), 16 * n as u64);
    let files = index_files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(node_index(&out).as_deref(), files[0].to_str());
    // The builder's lock went with it: the directory holds the index alone.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&files[0]).unwrap());
    assert_eq!(shared(&run("inspect", &env).0), 16 * n as u64);
    let again = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&files[0]).unwrap());
    assert_eq!(inode, again, "the second open rewrote the file");
    // A damaged file is replaced, and every sample still reads right (the file is mostly its
    // 16-byte entries: its middle is one).
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(&files[0], &bytes).unwrap();
    assert_eq!(shared(&run("inspect", &env).0), 16 * n as u64);
    let (out, _) = run("verify", &env);
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["bad"].as_u64(), Some(0), "{out}");
    assert_eq!(v["samples"].as_u64(), Some(n as u64), "{out}");
    assert!(
        std::fs::read(&files[0]).unwrap() != bytes,
        "the damaged file was kept"
    );
    // A FIFO planted at the file's name is not waited on: it is replaced.
    std::fs::remove_file(&files[0]).unwrap();
    let st = Command::new("mkfifo").arg(&files[0]).status().unwrap();
    assert!(st.success());
    assert_eq!(shared(&run("inspect", &env).0), 16 * n as u64);
    assert!(std::fs::metadata(&files[0]).unwrap().is_file());
    // A link planted where the index directory goes: not followed, nothing written there.
    let planted = dir.path().join("planted");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&planted).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, planted.join("index")).unwrap();
    let o = Command::new(gpufeed_bin())
        .env_remove("GPUFEED_QUIET")
        .env_remove("GPUFEED_SHARED_INDEX")
        .env("GPUFEED_INDEX_DIR", planted.join("index"))
        .args(["inspect", "--json"])
        .arg(&data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(shared(&String::from_utf8_lossy(&o.stdout)), 0);
    assert!(err.contains("keeps its own copy"), "{err}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // Opted out.
    let mut c = Command::new(gpufeed_bin());
    let o = c
        .env("GPUFEED_QUIET", "1")
        .env("GPUFEED_INDEX_DIR", &cache)
        .env("GPUFEED_SHARED_INDEX", "0")
        .args(["inspect", "--json"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(shared(&String::from_utf8_lossy(&o.stdout)), 0);
}

/// A dataset holds at most 2³² − 1 samples: exactly that many token windows open, one more
/// is refused saying the limit and naming the file, in text and in `--json` — flat token files
/// and a Megatron prefix alike (issue 52 item 14: "more than 2^32", off by one, and the
/// Megatron form had no path). The files are sparse.
#[test]
fn the_sample_limit_is_said_exactly_and_names_the_file() {
    let dir = disk_dir();
    let flat = |name: &str, tokens: u64| {
        let p = dir.path().join(name);
        std::fs::File::create(&p)
            .unwrap()
            .set_len(tokens * 2)
            .unwrap();
        p
    };
    let inspect = |p: &std::path::Path, extra: &[&str]| {
        gpufeed()
            .args(["inspect", "--json", "--seq-len", "1", "--stride", "1"])
            .args(extra)
            .arg(p)
            .output()
            .unwrap()
    };
    let tokens = ["--format", "tokens", "--token-dtype", "uint16"];
    // 2^32 tokens: windows of 2 every 1 — 2^32 − 1 of them.
    let at = flat("at.bin", 1 << 32);
    let out = inspect(&at, &tokens);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["samples"], 4_294_967_295u64, "{v}");
    let over = flat("over.bin", (1 << 32) + 1);
    let out = inspect(&over, &tokens);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("4294967295") && e.contains("2^32 − 1"), "{e}");
    assert!(v["path"].as_str().unwrap().ends_with("over.bin"), "{v}");
    // A Megatron prefix of three sequences of 2^31 − 1 tokens, as windows.
    let m = dir.path().join("m");
    let n: u64 = 3;
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(8); // uint16
    idx.extend(n.to_le_bytes());
    idx.extend((n + 1).to_le_bytes());
    for _ in 0..n {
        idx.extend(i32::MAX.to_le_bytes());
    }
    for i in 0..n {
        idx.extend((i * 2 * i32::MAX as u64).to_le_bytes());
    }
    for i in 0..=n {
        idx.extend(i.to_le_bytes());
    }
    std::fs::write(m.with_extension("idx"), idx).unwrap();
    std::fs::File::create(m.with_extension("bin"))
        .unwrap()
        .set_len(n * 2 * i32::MAX as u64)
        .unwrap();
    let out = inspect(&m, &["--format", "megatron"]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("4294967295"), "{e}");
    assert!(
        v["path"].as_str().is_some_and(|p| p.contains("m.bin")),
        "{v}"
    );
}
