//! `gpufeed bench decode`: images/s and CPU-seconds per 1000 images for gpufeed's decode stage
//! (the training and the evaluation transform, end to end from files through the loader), for
//! decode alone, and for the same work done as torchvision's CPU transforms do it (Pillow
//! decode, Pillow resize with antialias, normalise in numpy) in as many worker processes as
//! gpufeed has decode threads — every row alternated round by round in one run. With a device
//! (`--device sim|cuda`), gpufeed's device pipeline (`gpufeed-device-*`) and torchvision's own
//! GPU path (`tv-*`: `decode_jpeg(device=)` on lists plus `transforms.v2` on the device,
//! `scripts/bench-decode-tv.py`) join the rows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Serialize;

use crate::util::invalid;
use gpufeed::dataset::Dataset;
use gpufeed::decode::{ImageSpec, RgbDecoder};
use gpufeed::error::{Error, ErrorKind, Result};
use gpufeed::loader::Loader;
use gpufeed::testing::synth;
use gpufeed::testing::sys::process_cpu_seconds;

/// What to run.
#[derive(Debug, Clone)]
pub struct DecodeBenchSpec {
    /// An ImageFolder of JPEGs (generated when it holds none).
    pub dir: PathBuf,
    /// Images to generate when the set is made here.
    pub images: u64,
    /// Decode threads (and Pillow worker processes).
    pub threads: usize,
    /// gpufeed's rows' image settings (a square output; each row sets its transform), and
    /// the peers' size, element type and layout.
    pub image: ImageSpec,
    /// Samples per batch.
    pub batch: u32,
    /// Rounds; every row runs once per round, in turn.
    pub rounds: u32,
    /// Rows: any of [`ROWS`].
    pub rows: Vec<String>,
    /// The Python with Pillow and numpy for the pil rows (`scripts/bench-decode.sh` makes it),
    /// and torch + torchvision for the tv rows.
    pub python: Option<PathBuf>,
    /// The Pillow pipeline script.
    pub script: PathBuf,
    /// Where the device rows decode: `sim` (the simulated device) or `cuda` (device 0); `cpu`
    /// has no device rows.
    pub device: String,
    /// The simulated device's modelled JPEG engine: per batch, per image.
    pub sim_engine: Option<(std::time::Duration, std::time::Duration)>,
    /// A simulated trainer's step per batch (gpufeed's transform rows): with it, the rows say
    /// whether the decode stage keeps up and what limits it.
    pub step: std::time::Duration,
}

/// One row of one round.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeBenchRow {
    /// Row name.
    pub row: String,
    /// Round (0-based).
    pub round: u32,
    /// Images processed.
    pub images: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Images per second.
    pub images_per_s: f64,
    /// CPU seconds (user + system, all threads or processes) per 1000 images.
    pub cpu_s_per_1000: f64,
    /// Threads or worker processes.
    pub threads: usize,
    /// Samples that failed to decode.
    pub errors: u64,
    /// gpufeed's transform rows: the consumer's waits split by cause.
    pub stall: Option<gpufeed::loader::StallStats>,
    /// With a step: keeps up, or what bounds it (as `bench load --step-ms`).
    pub verdict: Option<String>,
    /// gpufeed's transform rows: the image settings they decoded with
    /// ([`ImageSpec::settings_json`]).
    #[serde(rename = "images_settings", skip_serializing_if = "Option::is_none")]
    pub images_settings: Option<serde_json::Value>,
    /// gpufeed's device rows: where the time went, phase by phase, and the CPU per image on
    /// each route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<gpufeed::PhaseTable>,
    /// `--device sim-free`: CPU seconds per 1000 images without what the simulated device's
    /// own work took here — the pipeline's host work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_cpu_s_per_1000: Option<f64>,
    /// `--device sim-free`: the same without the CPU route's decodes (its `cpu-*` phases) —
    /// the host work of the pipeline around the engines, per 1000 images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_host_cpu_s_per_1000: Option<f64>,
    /// `--sim-engine-us`: the images/s the modelled engine allows (its busy time over the
    /// row's images), and the row's share of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_bound_images_per_s: Option<f64>,
    /// The row's images/s over `engine_bound_images_per_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of_engine_bound: Option<f64>,
}

/// Every row name, in the default order: the CPU rows (gpufeed's CPU stage and Pillow), then
/// the device rows (gpufeed's device pipeline and torchvision on the device).
pub const ROWS: [&str; 12] = [
    "gpufeed-train",
    "pil-train",
    "gpufeed-eval",
    "pil-eval",
    "gpufeed-decode",
    "pil-decode",
    "gpufeed-device-train",
    "tv-train",
    "gpufeed-device-eval",
    "tv-eval",
    "gpufeed-nohw-train",
    "gpufeed-nohw-eval",
];

/// The rows `gpufeed bench decode --device DEVICE` runs by default: for `cpu` the CPU rows;
/// with a device, the device rows and gpufeed's CPU stage beside them.
pub fn default_rows(device: &str) -> Vec<String> {
    let r: &[&str] = match device {
        "cpu" => &ROWS[..6],
        _ => &[
            "gpufeed-device-train",
            "tv-train",
            "gpufeed-nohw-train",
            "gpufeed-train",
            "gpufeed-device-eval",
            "tv-eval",
            "gpufeed-eval",
        ],
    };
    r.iter().map(|s| s.to_string()).collect()
}

/// Runs the bench; `each` sees every row as it finishes.
pub fn run_decode_bench(
    spec: &DecodeBenchSpec,
    mut each: impl FnMut(&DecodeBenchRow),
) -> Result<Vec<DecodeBenchRow>> {
    for r in &spec.rows {
        if !ROWS.contains(&r.as_str()) {
            return Err(invalid(format!(
                "unknown row {r:?}: rows are {}",
                ROWS.join(", ")
            )));
        }
    }
    // An absent or empty folder gets the generated set; anything else is used as it is.
    let has_entries = std::fs::read_dir(&spec.dir).is_ok_and(|mut d| d.next().is_some());
    if !has_entries {
        synth::write_image_folder(&spec.dir, spec.images, 2012)?;
    }
    let ds = Dataset::open(&spec.dir)?;
    if ds.is_empty() {
        return Err(invalid(format!("{} holds no samples", spec.dir.display())));
    }
    let wants_py = spec
        .rows
        .iter()
        .any(|r| r.starts_with("pil-") || r.starts_with("tv-"));
    if wants_py && spec.python.is_none() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "the pil rows need a Python with Pillow and numpy, the tv rows one with torch and \
             torchvision: run scripts/bench-decode.sh (it makes one), give --python, or leave \
             those rows out with --rows",
        ));
    }
    let loader = Loader::builder(ds.clone())
        .batch_size(spec.batch)
        .seed(1)
        .build()?;
    let device = match spec.device.as_str() {
        _ if !spec
            .rows
            .iter()
            .any(|r| r.starts_with("gpufeed-device-") || r.starts_with("gpufeed-nohw-")) =>
        {
            None
        }
        "sim" | "sim-free" => {
            let mut s = if spec.device == "sim" {
                gpufeed::gpu::SimDevice::new(1)
            } else {
                gpufeed::gpu::SimDevice::free(1)
            };
            s.engine_time = spec.sim_engine;
            Some(gpufeed::gpu::Device::Simulated(s))
        }
        "cuda" => Some(gpufeed::gpu::Device::Cuda(0)),
        d => {
            return Err(invalid(format!(
                "the gpufeed-device rows need --device sim or cuda, not {d}"
            )))
        }
    };
    let sim = match &device {
        Some(gpufeed::gpu::Device::Simulated(s)) => Some(s.clone()),
        _ => None,
    };
    let device_loader = match device {
        Some(d) => Some(
            Loader::builder(ds.clone())
                .batch_size(spec.batch)
                .seed(1)
                .device(d)
                .build()?,
        ),
        None => None,
    };
    let on_device = || device_loader.as_ref().expect("made for the device rows");
    // A row's spec: the one given, with the row's transform.
    let image = |transform: &str| -> Result<ImageSpec> {
        let mut s = spec.image.clone();
        s.set("transform", transform)?;
        Ok(s)
    };
    let mut out = Vec::new();
    for round in 0..spec.rounds {
        for row in &spec.rows {
            let r = match row.as_str() {
                "gpufeed-train" => ours(&loader, spec, image("train")?, row, round)?,
                "gpufeed-eval" => ours(&loader, spec, image("eval")?, row, round)?,
                "gpufeed-decode" => decode_alone(&ds, spec, row, round)?,
                "gpufeed-device-train" => on_sim(sim.as_ref(), spec, || {
                    ours(on_device(), spec, image("train")?, row, round)
                })?,
                "gpufeed-device-eval" => on_sim(sim.as_ref(), spec, || {
                    ours(on_device(), spec, image("eval")?, row, round)
                })?,
                "gpufeed-nohw-train" | "gpufeed-nohw-eval" => on_sim(sim.as_ref(), spec, || {
                    let mut image = image(&row["gpufeed-nohw-".len()..])?;
                    image.hardware_decoder = false;
                    ours(on_device(), spec, image, row, round)
                })?,
                "tv-train" | "tv-eval" => tv(spec, &row["tv-".len()..], row, round)?,
                _ => pil(spec, &row["pil-".len()..], row, round)?,
            };
            each(&r);
            out.push(r);
        }
    }
    Ok(out)
}

fn ours(
    loader: &Loader,
    spec: &DecodeBenchSpec,
    image: ImageSpec,
    row: &str,
    round: u32,
) -> Result<DecodeBenchRow> {
    let settings = image.settings_json();
    let il = loader.decode_images(image)?;
    let (t0, c0) = (Instant::now(), process_cpu_seconds());
    let (mut images, mut errors, mut batches) = (0u64, 0u64, 0u64);
    let mut epoch = il.epoch(round as u64)?;
    for b in epoch.by_ref() {
        let b = b?;
        // The clock sees the device's work, as a trainer reading its loss each step does (the
        // tv rows synchronise each batch too); a pipeline goes on decoding the next batches.
        b.synchronize()?;
        images += b.len() as u64;
        errors += b.errors().count() as u64;
        batches += 1;
        if !spec.step.is_zero() {
            std::thread::sleep(spec.step);
        }
    }
    let (s, c) = (t0.elapsed().as_secs_f64(), process_cpu_seconds() - c0);
    let stall = epoch.stats().stall;
    let mut r = row_of(row, round, images, s, c, il.threads(), errors);
    r.stall = Some(stall);
    r.phases = epoch.stats().device_phases.clone();
    r.images_settings = Some(settings);
    if !spec.step.is_zero() {
        let demand = 1.0 / spec.step.as_secs_f64();
        let achieved = batches as f64 / s.max(1e-9);
        r.verdict = Some(crate::bench::load::verdict(
            demand,
            achieved,
            stall.total_s() / s.max(1e-9),
            &stall,
        ));
    }
    Ok(r)
}

/// A device row run by `f`, with what the simulated device `sim` saw meanwhile: the host's own
/// CPU where its work costs nothing, the images/s its modelled engine allows.
fn on_sim(
    sim: Option<&gpufeed::gpu::SimDevice>,
    spec: &DecodeBenchSpec,
    f: impl FnOnce() -> Result<DecodeBenchRow>,
) -> Result<DecodeBenchRow> {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(sim) = sim else { return f() };
    let st = &sim.stats;
    let at = || {
        (
            st.device_cpu_ns.load(Relaxed),
            st.engine_batches.load(Relaxed),
            st.engine_images.load(Relaxed),
        )
    };
    let (d0, b0, i0) = at();
    let mut r = f()?;
    let (d1, b1, i1) = at();
    if sim.free_work {
        let device_s = (d1 - d0) as f64 * 1e-9;
        let cpu_s = r.cpu_s_per_1000 * r.images.max(1) as f64 / 1000.0;
        let n = r.images.max(1) as f64;
        r.host_cpu_s_per_1000 = Some((cpu_s - device_s) * 1000.0 / n);
        if let Some(t) = &r.phases {
            let decodes: f64 = t
                .phases
                .iter()
                .filter(|p| p.phase.starts_with("cpu-"))
                .map(|p| p.cpu_s)
                .sum();
            r.pipeline_host_cpu_s_per_1000 = Some((cpu_s - device_s - decodes) * 1000.0 / n);
        }
    }
    if let Some((per_batch, per_image)) = spec.sim_engine {
        let busy =
            per_batch.as_secs_f64() * (b1 - b0) as f64 + per_image.as_secs_f64() * (i1 - i0) as f64;
        if busy > 0.0 {
            let bound = r.images as f64 / busy;
            r.engine_bound_images_per_s = Some(bound);
            r.of_engine_bound = Some(r.images_per_s / bound);
        }
    }
    Ok(r)
}

fn decode_alone(
    ds: &Dataset,
    spec: &DecodeBenchSpec,
    row: &str,
    round: u32,
) -> Result<DecodeBenchRow> {
    // The files are read into memory first (not timed): decode alone is the decoder's work.
    let files: Vec<Vec<u8>> = (0..ds.len())
        .map(|i| {
            let s = ds.sample(i);
            let p = ds.file_path(s.file);
            std::fs::read(&p).map_err(|e| Error::io("cannot read", e).with_path(p.to_path_buf()))
        })
        .collect::<Result<_>>()?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::atomic::AtomicU64::new(0);
    let (t0, c0) = (Instant::now(), process_cpu_seconds());
    std::thread::scope(|s| {
        for _ in 0..spec.threads {
            s.spawn(|| {
                let mut d = match RgbDecoder::new() {
                    Ok(d) => d,
                    Err(_) => {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return;
                    }
                };
                let mut px = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    if d.decode(f, &mut px).is_err() {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (sec, c) = (t0.elapsed().as_secs_f64(), process_cpu_seconds() - c0);
    Ok(row_of(
        row,
        round,
        files.len() as u64,
        sec,
        c,
        spec.threads,
        errors.into_inner(),
    ))
}

/// torchvision's GPU path on `--device` (the CPU when the device is simulated): the tv script.
fn tv(spec: &DecodeBenchSpec, mode: &str, row: &str, round: u32) -> Result<DecodeBenchRow> {
    let script = spec.script.with_file_name("bench-decode-tv.py");
    let device = if spec.device == "cuda" { "cuda" } else { "cpu" };
    let args = ["--mode", mode, "--device", device];
    let p = run_peer(spec, &script, "torchvision", &args, round)?;
    Ok(row_of(
        row, round, p.images, p.seconds, p.cpu_s, 1, p.errors,
    ))
}

/// What a peer script prints: one JSON object.
#[derive(serde::Deserialize)]
struct PeerOut {
    images: u64,
    seconds: f64,
    cpu_s: f64,
    errors: u64,
}

/// Runs the peer pipeline `script` (called `what` in errors) with the spec's set, size, dtype,
/// batch and the round's seed, plus `args`, and reads its result.
fn run_peer(
    spec: &DecodeBenchSpec,
    script: &std::path::Path,
    what: &str,
    args: &[&str],
    round: u32,
) -> Result<PeerOut> {
    let py = spec.python.as_deref().expect("checked above");
    let out = Command::new(py)
        .arg(script)
        .args(["--dir".as_ref(), spec.dir.as_os_str()])
        .args(args)
        .args(["--size", &spec.image.size.0.to_string()])
        .args(["--dtype", spec.image.dtype.as_str()])
        .args(["--batch", &spec.batch.to_string()])
        .args(["--seed", &round.to_string()])
        .output()
        .map_err(|e| Error::io(format!("cannot run the {what} pipeline"), e).with_path(py))?;
    if !out.status.success() {
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "the {what} pipeline failed ({}): {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        invalid(format!(
            "the {what} pipeline printed no result ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        ))
    })
}

fn pil(spec: &DecodeBenchSpec, mode: &str, row: &str, round: u32) -> Result<DecodeBenchRow> {
    let workers = spec.threads.to_string();
    let layout = spec.image.layout.as_str();
    let args = ["--mode", mode, "--workers", &workers, "--layout", layout];
    let p = run_peer(spec, &spec.script, "Pillow", &args, round)?;
    Ok(row_of(
        row,
        round,
        p.images,
        p.seconds,
        p.cpu_s,
        spec.threads,
        p.errors,
    ))
}

fn row_of(
    row: &str,
    round: u32,
    images: u64,
    s: f64,
    cpu: f64,
    threads: usize,
    errors: u64,
) -> DecodeBenchRow {
    DecodeBenchRow {
        row: row.to_string(),
        round,
        images,
        seconds: s,
        images_per_s: images as f64 / s.max(1e-9),
        cpu_s_per_1000: cpu * 1000.0 / images.max(1) as f64,
        threads,
        errors,
        stall: None,
        verdict: None,
        images_settings: None,
        phases: None,
        host_cpu_s_per_1000: None,
        pipeline_host_cpu_s_per_1000: None,
        engine_bound_images_per_s: None,
        of_engine_bound: None,
    }
}

/// The table row for a result.
pub fn table_row(r: &DecodeBenchRow) -> String {
    format!(
        "{:<20} round {:>2}  {:>7} images  {:>8.1} images/s  {:>6.2} CPU-s/1000  {} threads{}",
        r.row,
        r.round,
        r.images,
        r.images_per_s,
        r.cpu_s_per_1000,
        r.threads,
        if r.errors > 0 {
            format!("  {} errors", r.errors)
        } else {
            String::new()
        }
    ) + &r
        .verdict
        .as_ref()
        .map(|v| format!("\n  {v}"))
        .unwrap_or_default()
        + &r.host_cpu_s_per_1000
            .map(|h| {
                format!(
                    "\n  host work alone (the device's own work taken out): {h:.3} CPU-s/1000, \
                     {:.3} without the CPU route's decodes",
                    r.pipeline_host_cpu_s_per_1000.unwrap_or(f64::NAN)
                )
            })
            .unwrap_or_default()
        + &r.engine_bound_images_per_s
            .map(|b| {
                format!(
                    "\n  the modelled engine allows {b:.1} images/s: this row reached {:.2} of it",
                    r.images_per_s / b
                )
            })
            .unwrap_or_default()
        + &r.phases.as_ref().map(phase_lines).unwrap_or_default()
}

/// The phase table under a device row.
fn phase_lines(t: &gpufeed::PhaseTable) -> String {
    let mut s = format!(
        "\n  CPU-s/1000 by route: engine {:.3} ({} images), cpu {:.3} ({} images), shared {:.3}; \
         decode threads {:.2} CPU-s, I/O thread {:.2} CPU-s",
        t.hardware_cpu_ms_per_image,
        t.hardware_images,
        t.cpu_route_cpu_ms_per_image,
        t.cpu_images,
        t.shared_cpu_ms_per_image,
        t.decode_threads_cpu_s,
        t.io_thread_cpu_s,
    );
    for p in t.phases.iter().filter(|p| p.count > 0) {
        s += &format!(
            "\n    {:<16} {:<8} {:>8.3} s wall {:>8.3} s CPU {:>8} times",
            p.phase, p.thread, p.wall_s, p.cpu_s, p.count
        );
    }
    s
}

/// Ratios of gpufeed's rows to their peers', per round (gpufeed-X to pil-X, gpufeed-device-X
/// to tv-X): (row pair, images/s ratio, CPU ratio).
pub fn ratios(rows: &[DecodeBenchRow]) -> Vec<(String, u32, f64, f64)> {
    let mut v = Vec::new();
    for r in rows.iter().filter(|r| r.row.starts_with("gpufeed-")) {
        let mode = &r.row["gpufeed-".len()..];
        let peer = match mode
            .strip_prefix("device-")
            .or_else(|| mode.strip_prefix("nohw-"))
        {
            Some(m) => format!("tv-{m}"),
            None => format!("pil-{mode}"),
        };
        if let Some(p) = rows.iter().find(|p| p.round == r.round && p.row == peer) {
            v.push((
                mode.to_string(),
                r.round,
                r.images_per_s / p.images_per_s.max(1e-9),
                r.cpu_s_per_1000 / p.cpu_s_per_1000.max(1e-9),
            ));
        }
    }
    v
}

/// Where the Pillow pipeline script is: next to the binary's source tree, or `GPUFEED_ROOT`.
pub fn default_script() -> PathBuf {
    let rel = Path::new("scripts/bench-decode-pil.py");
    std::env::var_os("GPUFEED_ROOT")
        .map(|r| PathBuf::from(r).join(rel))
        .unwrap_or_else(|| Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(rel))
}
