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
