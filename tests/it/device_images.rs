//! The device image pipeline without a GPU (issue 23): a loader on the simulated device decodes
//! through the same pipeline a GPU runs — checksums by the `crc32c.cu` kernel over the group in
//! (simulated) device memory, each image decoded whole (libjpeg-turbo standing in for nvJPEG,
//! the CPU stage for what the hardware decoder refuses), one `resize.cu` launch per batch into
//! an output tensor from a pool made with the loader — the kernels being the exact `.cu`
//! sources built for the host. Its tensors must equal the CPU stage's (with DCT scaling off, as
//! the GPU decodes at full size) within the kernel tests' tolerance, for every order, 1–3
//! ranks, a resume and a drop mid-epoch, on a set holding every kind of image the routing
//! tells apart, broken ones and a sample whose checksum fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpufeed::decode::{ImageLoader, ImageSpec, Layout, PixelType, RouteCounts};
use gpufeed::gpu::SimDevice;
use gpufeed::testing::synth::{self, EncodeOptions};
use gpufeed::{Dataset, Device, Loader, Order};

use crate::common::disk_dir;

/// Whether this build has the simulated device's kernels (a C++ compiler at build time).
pub(crate) fn kernels() -> bool {
    if gpufeed::testing::host_kernels::available() {
        return true;
    }
    eprintln!("skipped: the host kernels are not built (no C++ compiler when building)");
    false
}

/// The image set: generated JPEGs of the synthetic mix (baseline 4:2:0, gray, CMYK,
/// progressive, 4:4:4, 4:2:2, restart markers), a 4:4:0 and a 4:1:1 JPEG, PNGs and a WebP
/// written by the image-rs encoders, and four broken files; packed into format-v2 shards
/// (crc32c per sample), then one good sample's bytes changed in its shard. Returns the packed
/// directory, the expected routes and the keys that must fail.
pub(crate) struct Set {
    pub(crate) packed: PathBuf,
    pub(crate) routes: RouteCounts,
    pub(crate) failing: Vec<String>,
}

fn write(p: &Path, b: &[u8]) {
    std::fs::write(p, b).unwrap();
}

fn png(px: &[u8], (w, h): (u32, u32), color: png::ColorType) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(color);
        e.set_depth(png::BitDepth::Eight);
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(px).unwrap();
    }
    out
}

pub(crate) fn make_set(root: &Path) -> Set {
    let src = root.join("src");
    let c = src.join("c0");
    std::fs::create_dir_all(&c).unwrap();
    let mut routes = RouteCounts::default();
    for i in 0..40u64 {
        let k = synth::kind_of(i);
        if k.channels == 4 || k.progressive {
            routes.cpu += 1;
        } else {
            routes.hardware += 1;
        }
        write(
            &c.join(format!("{i:04}-synth.jpg")),
            &synth::jpeg(7, i).unwrap(),
        );
    }
    for (name, sub, hw) in [("4-4-0", "4:4:0", true), ("4-1-1", "4:1:1", false)] {
        let (px, size) = synth::pixels(9, 3, 3);
        let o = EncodeOptions {
            quality: 85,
            channels: 3,
            subsampling: sub,
            progressive: false,
            restart_rows: 0,
        };
        write(
            &c.join(format!("{name}.jpg")),
            &synth::encode(&px, size, &o).unwrap(),
        );
        if hw {
            routes.hardware += 1;
        } else {
            routes.cpu += 1;
        }
    }
    let (px, size) = synth::pixels(9, 4, 3);
    write(&c.join("rgb.png"), &png(&px, size, png::ColorType::Rgb));
    let (px, size) = synth::pixels(9, 5, 2);
    write(
        &c.join("gray-alpha.png"),
        &png(&px, size, png::ColorType::GrayscaleAlpha),
    );
    let (px, size) = synth::pixels(9, 6, 3);
    let mut webp = Vec::new();
    image_webp::WebPEncoder::new(&mut webp)
        .encode(&px, size.0, size.1, image_webp::ColorType::Rgb8)
        .unwrap();
    write(&c.join("lossless.webp"), &webp);
    routes.cpu += 3;
    // Broken: truncated, garbage after a JPEG signature, HTML, a header above the pixel limit.
    let good = synth::jpeg(7, 0).unwrap();
    // Longer than the header the device path reads to the host, so that its end is read
    // apart (the JPEG engines decode a truncated image without an error: only that check
    // keeps it off them).
    assert!(good.len() * 6 / 10 > 16 << 10, "{} bytes", good.len());
    write(&c.join("bad-truncated.jpg"), &good[..good.len() * 6 / 10]);
    let mut garbage = vec![0xff, 0xd8, 0xff, 0xe0];
    garbage.extend((0..4000u32).map(|i| (i * 7919 % 251) as u8));
    write(&c.join("bad-garbage.jpg"), &garbage);
    write(&c.join("bad-html.jpg"), b"<html><body>404</body></html>");
    let mut huge = good.clone();
    let sof = huge.windows(2).position(|w| w == [0xff, 0xc0]).unwrap();
    huge[sof + 5..sof + 9].copy_from_slice(&[0xea, 0x60, 0xea, 0x60]);
    write(&c.join("bad-huge.jpg"), &huge);
    routes.failed += 4;

    let packed = root.join("packed");
    let ds = Dataset::open(&src).unwrap();
    gpufeed::dataset::pack(
        &ds,
        &packed,
        &gpufeed::dataset::PackOptions {
            shard_bytes: 400_000,
            progress: false,
            ..Default::default()
        },
    )
    .unwrap();
    // One good sample's bytes changed in its shard after packing: its crc32c fails.
    let p = Dataset::open(&packed).unwrap();
    assert!(p.has_checksums(), "packed shards carry crc32c");
    let id = (0..p.len())
        .find(|&i| p.key(i).ends_with("0010-synth.jpg"))
        .unwrap();
    let s = p.sample(id);
    let path = p.file(s.file).path;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(s.offset + s.len as u64 / 2) as usize] ^= 0x5a;
    write(&path, &bytes);
    routes.failed += 1;
    routes.hardware -= 1; // 0010 is baseline 4:2:0
    let mut failing: Vec<String> = [
        "bad-truncated.jpg",
        "bad-garbage.jpg",
        "bad-html.jpg",
        "bad-huge.jpg",
        "0010-synth.jpg",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    failing.sort();
    Set {
        packed,
        routes,
        failing,
    }
}

/// Tensors by sample id (bytes), and the failed samples' file names with their messages.
pub(crate) type Collected = (BTreeMap<u32, Vec<u8>>, Vec<(String, String)>);

pub(crate) fn collect(il: &ImageLoader, epoch: u64, start: u32, device: bool) -> Collected {
    let ds = il.loader().dataset().clone();
    let (mut tensors, mut errors) = (BTreeMap::new(), Vec::new());
    for b in il.epoch_from(epoch, start).unwrap() {
        let b = b.unwrap();
        assert_eq!(b.is_device(), device);
        let all = b.to_host().unwrap();
        if device {
            assert!(b.bytes().is_empty() && b.view::<u8>().is_none());
        }
        let per = all.len() / b.len();
        for (i, id) in b.sample_ids().iter().enumerate() {
            let t = all[i * per..(i + 1) * per].to_vec();
            if let Some(e) = b.error(i) {
                assert!(t.iter().all(|&v| v == 0), "a failed sample is zero-filled");
                let key = ds.key(*id as usize).to_string();
                errors.push((key.rsplit('/').next().unwrap().to_string(), e.to_string()));
            }
            assert!(tensors.insert(*id, t).is_none(), "sample {id} twice");
        }
    }
    errors.sort();
    (tensors, errors)
}

/// Largest and mean |device − CPU| in levels (0–255) over every element.
pub(crate) fn compare(a: &[u8], b: &[u8], spec: &ImageSpec) -> (f32, f64) {
    let level = |out: &[u8], i: usize, c: usize| -> f32 {
        let v = match spec.dtype {
            PixelType::U8 => return out[i] as f32,
            PixelType::F32 => f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap()),
            PixelType::F16 => half::f16::from_le_bytes([out[i * 2], out[i * 2 + 1]]).to_f32(),
            PixelType::Bf16 => half::bf16::from_le_bytes([out[i * 2], out[i * 2 + 1]]).to_f32(),
        };
        (v * spec.std[c] + spec.mean[c]) * 255.0
    };
    let (w, h) = spec.size;
    let n = (3 * w * h) as usize;
    assert_eq!(a.len(), n * spec.dtype.size());
    let (mut worst, mut sum) = (0f32, 0f64);
    for e in 0..n {
        let c = match spec.layout {
            Layout::Nchw => e / (w * h) as usize,
            Layout::Nhwc => e % 3,
        };
        let d = (level(a, e, c) - level(b, e, c)).abs();
        worst = worst.max(d);
        sum += d as f64;
    }
    (worst, sum / n as f64)
}

/// Whether every output tensor is back in the pool within a second (a decode thread lets go
/// of its job just after finishing it).
pub(crate) fn all_back(il: &ImageLoader) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        let (free, all) = il.output_tensors().unwrap();
        if free == all {
            return true;
        }
        if t0.elapsed().as_secs() >= 1 {
            eprintln!("{free} of {all} output tensors free");
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub(crate) fn loader(
    ds: &Arc<Dataset>,
    order: Order,
    rank: u32,
    world: u32,
    dev: Option<Device>,
) -> Loader {
    let mut b = Loader::builder(ds.clone())
        .batch_size(5)
        .order(order)
        .seed(21)
        .rank(rank, world);
    if let Some(d) = dev {
        b = b.device(d);
    }
    b.build().unwrap()
}

/// The device the tests run on: the simulated device (seeded, its copies checked afterwards),
/// or CUDA device 0 (tests/it/gpu.rs).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum On {
    Sim,
    Cuda,
}

impl On {
    fn device(self, seed: u64) -> (Device, Option<SimDevice>) {
        match self {
            On::Sim => {
                let s = SimDevice::new(seed);
                (Device::Simulated(s.clone()), Some(s))
            }
            On::Cuda => (Device::Cuda(0), None),
        }
    }
}

#[test]
fn device_image_batches_equal_the_cpu_stage_on_the_simulated_device() {
    if !kernels() {
        return;
    }
    device_batches_equal_the_cpu_stage(On::Sim);
}

/// The body shared by the simulated device and CUDA.
pub(crate) fn device_batches_equal_the_cpu_stage(on: On) {
    let dir = disk_dir();
    let set = make_set(dir.path());
    let ds = Arc::new(Dataset::open(&set.packed).unwrap());
    let n = ds.len();
    assert_eq!(n, 40 + 2 + 3 + 4);
    // The kernel tests' limits in levels: u8 may round the other way at .5; f16 adds ±½ ulp.
    let specs = [
        (ImageSpec::train(40).dtype(PixelType::F16), 0.25f32),
        (
            ImageSpec::eval(32)
                .dtype(PixelType::U8)
                .layout(Layout::Nhwc),
            1.0,
        ),
    ];
    let orders = [
        Order::Global,
        Order::ShardBuffer { buffer: 16 },
        Order::Block {
            block_bytes: 256 << 10,
            open_blocks: 2,
        },
        Order::Sequential,
    ];
    for (spec, limit) in &specs {
        let mut spec = spec.clone().threads(2);
        spec.dct_scaling = false; // the device decodes at full size
        let cpu = loader(&ds, Order::Global, 0, 1, None)
            .decode_images(spec.clone())
            .unwrap();
        assert!(!cpu.is_device() && cpu.routes().is_none());
        let (want, want_errors) = collect(&cpu, 3, 0, false);
        assert_eq!(want.len(), n);
        let names: Vec<&String> = want_errors.iter().map(|(k, _)| k).collect();
        assert_eq!(names, set.failing.iter().collect::<Vec<_>>());
        // On the host the decode thread found the checksum failure, just before decoding.
        let crc = &want_errors
            .iter()
            .find(|(k, _)| k == "0010-synth.jpg")
            .unwrap()
            .1;
        assert!(
            crc.contains("checksum mismatch") && !crc.contains("device"),
            "{crc}"
        );

        let (mut worst, mut mean_max) = (0f32, 0f64);
        for (oi, order) in orders.iter().enumerate() {
            for world in 1..=3u32 {
                let mut union = BTreeMap::new();
                let mut errors = Vec::new();
                for rank in 0..world {
                    let (dev, sim) = on.device(oi as u64 * 10 + world as u64 + rank as u64);
                    let l = loader(&ds, *order, rank, world, Some(dev));
                    let il = l.decode_images(spec.clone()).unwrap();
                    assert!(il.is_device());
                    if world == 2 {
                        // A staging buffer too small for a batch: the chunked way, each chunk
                        // one image, and the same tensors.
                        il.set_staging_max(16 << 10);
                    }
                    let (t, e) = collect(&il, 3, 0, true);
                    // (The chunked way for a batch whose images exceed the staging; a batch
                    // with none, or few, still goes as a pipeline.)
                    let r = il.routes().unwrap();
                    let batches = u64::from(l.batches_per_epoch());
                    if world == 2 {
                        assert!(r.pipelined < batches, "{r:?} of {batches}");
                    } else {
                        assert!(r.pipelined > 0, "{r:?} of {batches}");
                    }
                    for (id, v) in t {
                        assert!(union.insert(id, v).is_none(), "sample {id} on two ranks");
                    }
                    errors.extend(e);
                    // Everything back: tensors, slots, regions; the copies were sound.
                    assert!(all_back(&il), "an output tensor did not return");
                    assert_eq!(l.free_slots(), l.slots());
                    let (free, all) = l.free_device_regions().unwrap();
                    assert_eq!(free, all);
                    if let Some(sim) = sim {
                        let st = &sim.stats;
                        let relaxed = std::sync::atomic::Ordering::Relaxed;
                        assert_eq!(st.source_changed.load(relaxed), 0);
                        assert_eq!(st.region_in_use.load(relaxed), 0);
                    }
                }
                assert_eq!(union.len(), n, "{order:?} {world} ranks: every sample once");
                errors.sort();
                let names: Vec<&String> = errors.iter().map(|(k, _)| k).collect();
                assert_eq!(names, set.failing.iter().collect::<Vec<_>>(), "{order:?}");
                for (id, got) in &union {
                    let (w, m) = compare(got, &want[id], &spec);
                    // On CUDA the JPEG engines decode baseline JPEGs with their own IDCT and
                    // upsampling: a decoder's difference, not the kernel's, bounded loosely
                    // here (a first guess until a GPU run measures it) and reported.
                    let (limit, mean_limit) = match on {
                        On::Sim => (*limit, f64::from(*limit)),
                        On::Cuda => (limit.max(32.0), 1.5),
                    };
                    assert!(
                        m <= mean_limit,
                        "{order:?} {world} ranks, sample {id}: mean {m} levels from the CPU stage"
                    );
                    assert!(
                        w <= limit,
                        "{order:?} {world} ranks, sample {} ({:?}): {w} levels from the CPU stage",
                        id,
                        ds.key(*id as usize)
                    );
                    worst = worst.max(w);
                    mean_max = mean_max.max(m);
                }
                // The checksum failure was found by the device's kernel, and says so.
                let crc = &errors
                    .iter()
                    .find(|(k, _)| k == "0010-synth.jpg")
                    .unwrap()
                    .1;
                assert!(
                    crc.contains("device's crc32c") && crc.contains("0010-synth.jpg"),
                    "{crc}"
                );
            }
        }
        eprintln!(
            "{:?} {:?}: device vs CPU stage, worst {worst:.4} levels, largest per-sample mean {mean_max:.5}",
            spec.dtype, spec.layout
        );
    }
}

#[test]
fn the_device_pipeline_routes_resumes_drops_and_keeps_memory_flat() {
    if !kernels() {
        return;
    }
    device_pipeline_routes_resumes_drops_and_stays_flat(On::Sim);
}

/// The body shared by the simulated device and CUDA.
pub(crate) fn device_pipeline_routes_resumes_drops_and_stays_flat(on: On) {
    let dir = disk_dir();
    let set = make_set(dir.path());
    let ds = Arc::new(Dataset::open(&set.packed).unwrap());
    let n = ds.len();
    let mut spec = ImageSpec::train(32).dtype(PixelType::F32).threads(2);
    spec.dct_scaling = false;
    let l = loader(&ds, Order::Global, 0, 1, Some(on.device(5).0));
    let il = l.decode_images(spec.clone()).unwrap();
    let tensors = il.output_tensors().unwrap().1;
    assert_eq!(tensors, spec.prefetch_batches + 3);

    // Three epochs: every sample once each, the pool never grows, all back after each.
    let first = collect(&il, 0, 0, true);
    assert_eq!(first.0.len(), n);
    for epoch in 1..3 {
        assert_eq!(collect(&il, epoch, 0, true).0.len(), n);
        assert!(all_back(&il), "flat: the same pool, all back");
    }
    // Routing: by kind, counted once per decoded image; every readable sample's crc checked.
    // On CUDA too: the GPUs gpufeed is checked on (H100, H200) have JPEG engines.
    let r = il.routes().unwrap();
    let e = set.routes;
    assert_eq!(
        (r.hardware, r.cpu, r.failed),
        (3 * e.hardware, 3 * e.cpu, 3 * e.failed),
        "routes over 3 epochs: {r:?}, one epoch should be {e:?}"
    );
    // The four broken files are read fine (their bytes are what the shard holds): all checked.
    assert_eq!(r.crc_checked, 3 * n as u64);
    // Most batches go as a pipeline; one holding a file whose record has no size (not an
    // image) goes sample by sample: both ways are taken here.
    let batches = 3 * u64::from(il.loader().batches_per_epoch());
    assert!(
        r.pipelined > 0 && r.pipelined < batches,
        "{r:?} in {batches} batches"
    );

    // The hardware decoder off: every image takes the CPU route, where it is transformed as
    // the CPU stage transforms it; with it on, the engines' images go through the resize
    // kernel instead. On the simulated device (the engines' stand-in is libjpeg-turbo) the two
    // differ by the kernel's rounding only; on CUDA by the engines' own IDCT and upsampling
    // too (an H200 run: not bit-equal), held to the bound the batches-equal test holds them
    // to. Either way reported.
    let mut cpu_only = spec.clone();
    cpu_only.hardware_decoder = false;
    let il2 = l.decode_images(cpu_only).unwrap();
    let cpu_first = collect(&il2, 0, 0, true).0;
    assert_eq!(
        cpu_first.keys().collect::<Vec<_>>(),
        first.0.keys().collect::<Vec<_>>()
    );
    let (limit, mean_limit) = match on {
        On::Sim => (0.25f32, 0.25f64),
        On::Cuda => (32.0, 1.5),
    };
    let (mut worst, mut mean_max) = (0f32, 0f64);
    for (id, t) in &cpu_first {
        let (w, m) = compare(t, &first.0[id], &spec);
        assert!(
            w <= limit && m <= mean_limit,
            "sample {id}: the CPU route is {w} levels (mean {m}) from the engines'"
        );
        (worst, mean_max) = (worst.max(w), mean_max.max(m));
    }
    eprintln!(
        "hardware decoder off vs on: worst {worst:.4} levels, largest per-sample mean \
         {mean_max:.5}"
    );
    let r2 = il2.routes().unwrap();
    assert_eq!(
        (r2.hardware, r2.cpu, r2.failed),
        (0, e.hardware + e.cpu, e.failed)
    );
    drop(il2);

    // Resumed at batch 4: the rest of the epoch, the same tensors.
    let (rest, _) = collect(&il, 0, 4, true);
    assert_eq!(rest.len(), n - 4 * 5);
    for (id, t) in &rest {
        assert_eq!(&first.0[id], t, "sample {id} differs after a resume");
    }
    // Dropped mid-epoch with batches held and decodes in flight: everything comes back.
    {
        let mut ep = il.epoch(1).unwrap();
        let a = ep.next().unwrap().unwrap();
        let b = ep.next().unwrap().unwrap();
        assert!(a.is_device() && b.len() == 5);
        drop(ep);
        assert!(
            il.output_tensors().unwrap().0 <= tensors - 2,
            "held batches keep theirs"
        );
    }
    assert!(all_back(&il));
    assert_eq!(l.free_slots(), l.slots());
    let (free, all) = l.free_device_regions().unwrap();
    assert_eq!(free, all);
    // A consumer holding every tensor is waited for, not failed: drop one and the epoch goes on.
    let mut ep = il.epoch(2).unwrap();
    let mut held = Vec::new();
    for _ in 0..tensors {
        held.push(ep.next().unwrap().unwrap());
    }
    assert!(matches!(
        ep.poll_next(std::time::Duration::from_millis(300)),
        std::task::Poll::Pending
    ));
    held.clear();
    let rest: usize = ep.map(|b| b.unwrap().len()).sum();
    assert_eq!(rest + tensors * 5, n);
}

/// `gpufeed bench decode --device sim` runs the device rows beside the CPU stage and reports
/// each with parseable JSON; the device rows' figures are the simulator's (not a GPU's).
#[test]
fn bench_decode_runs_the_device_rows_on_the_simulated_device() {
    if !kernels() {
        return;
    }
    let dir = disk_dir();
    let out = std::process::Command::new(crate::common::gpufeed_bin())
        .args([
            "bench", "decode", "--device", "sim", "--images", "24", "--size", "32",
        ])
        .args(["--rounds", "1", "--batch", "8", "--threads", "2", "--json"])
        .args([
            "--rows",
            "gpufeed-device-train,gpufeed-train,gpufeed-device-eval",
        ])
        .arg("--dir")
        .arg(dir.path().join("set"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("row").is_some())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r["row"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "gpufeed-device-train",
            "gpufeed-train",
            "gpufeed-device-eval"
        ]
    );
    for r in &rows {
        assert_eq!(r["images"], 24, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["images_per_s"].as_f64().unwrap() > 0.0);
        // A device row's phase table: every image counted on one route, each phase's count
        // what the pipeline did (a probe per engine-route image, a launch per batch of 8).
        let Some(t) = r.get("phases") else {
            assert_eq!(
                r["row"], "gpufeed-train",
                "only the CPU row has no phases: {r}"
            );
            continue;
        };
        let n = |k: &str| t[k].as_u64().unwrap();
        assert_eq!(
            n("hardware_images") + n("cpu_images") + n("failed_images"),
            24
        );
        assert!(n("hardware_images") > 0 && n("cpu_images") > 0, "{t}");
        let phase = |name: &str| {
            t["phases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["phase"] == name)
                .unwrap_or_else(|| panic!("no phase {name}: {t}"))
                .clone()
        };
        assert_eq!(
            phase("probe")["count"].as_u64().unwrap(),
            n("hardware_images")
        );
        assert_eq!(phase("kernels")["count"], 3, "{t}");
        assert_eq!(phase("engine-call")["count"], 3, "{t}");
        assert!(
            t["hardware_cpu_ms_per_image"].as_f64().unwrap() > 0.0,
            "{t}"
        );
    }
}
