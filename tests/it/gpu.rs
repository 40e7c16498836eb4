//! GPU tests: they run where a CUDA GPU is visible and say they were skipped elsewhere; with
//! `GPUFEED_REQUIRE_GPU=1` (`scripts/gpu-check.sh`) a missing GPU is a failure instead.

use std::path::{Path, PathBuf};

use gpufeed::buf::{Arena, ArenaConfig};
use gpufeed::testing::cuda::{self, DeviceBuffer, HostRegistration, Stream};
use gpufeed::testing::cufile::{self, CufileBuffer, CufileFile};
use gpufeed::testing::Rng;
use gpufeed::{Dataset, Device, Engine, EngineKind, Loader, Order, ReadSpec};

use crate::common::*;

/// `Some(())` when a GPU is usable; otherwise skipped (or, when required, a failure).
fn gpu() -> Option<()> {
    match gpufeed::gpu_available() {
        Ok(_) => Some(()),
        Err(e) if std::env::var_os("GPUFEED_REQUIRE_GPU").is_some() => {
            panic!("GPUFEED_REQUIRE_GPU is set but no GPU is usable: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no GPU ({e})");
            None
        }
    }
}

fn content(i: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(i as u64 * 131 + 7);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn shards(dir: &Path, n: usize, per: usize) -> Vec<PathBuf> {
    keyed_shards(dir, n, per, (3, 200_000, 3), content)
}

/// mmap → io_uring registration → CUDA registration, and the other order: reads land through
/// io_uring in CUDA-registered memory and reach the device intact either way.
#[test]
fn arena_registered_with_io_uring_and_cuda_in_both_orders() {
    let Some(()) = gpu() else { return };
    let ctx = gpufeed::testing::context(0).unwrap();
    let dir = disk_dir();
    let file = pattern_file(dir.path(), "p.dat", 8 << 20);
    for cuda_first in [false, true] {
        let arena = Arena::new(&ArenaConfig {
            slot_bytes: 4 << 20,
            slots: 2,
            huge_pages: true,
        })
        .unwrap();
        let cfg = config(EngineKind::Uring, 8, 4 << 20);
        let (mut engine, _pin) = if cuda_first {
            // SAFETY: `arena` outlives the registration (dropped at the end of the iteration,
            // after `_pin`, which is declared later).
            let pin = unsafe { HostRegistration::new(&ctx, arena.as_ptr(), arena.len()) }.unwrap();
            (Engine::with_arena(cfg, arena.clone()).unwrap(), pin)
        } else {
            let e = Engine::with_arena(cfg, arena.clone()).unwrap();
            // SAFETY: as above: `arena` outlives `_pin`.
            let pin = unsafe { HostRegistration::new(&ctx, arena.as_ptr(), arena.len()) }.unwrap();
            (e, pin)
        };
        assert!(
            engine.buffers_registered(),
            "io_uring registration (cuda_first {cuda_first})"
        );
        let f = engine.open(&file).unwrap();
        let slot = arena.take().unwrap();
        let spec = ReadSpec {
            file: f,
            offset: 1 << 20,
            len: 3 << 20,
            buf_offset: 0,
        };
        engine
            .submit_one(slot, spec, 1)
            .map_err(|r| r.error)
            .unwrap();
        engine.wait(1).unwrap();
        let c = engine.pop().unwrap();
        let range = c.outcome().as_ref().unwrap().clone();
        let stream = Stream::new(&ctx).unwrap();
        let dev = DeviceBuffer::new(&ctx, range.len()).unwrap();
        let src = arena.bytes(&c.slot)[range.clone()].as_ptr();
        // SAFETY: the slot is held until the stream is synchronised below.
        unsafe { cuda::memcpy_htod_async(dev.ptr(), src, range.len(), &stream).unwrap() };
        stream.synchronize().unwrap();
        let mut back = vec![0u8; range.len()];
        dev.read(0, &mut back).unwrap();
        assert_pattern(&back, 1 << 20, &format!("cuda_first {cuda_first}"));
        arena.put(c.slot);
    }
}

fn modes() -> [Order; 3] {
    [
        Order::Global,
        Order::ShardBuffer { buffer: 64 },
        Order::Block {
            block_bytes: 4 << 20,
            open_blocks: 3,
        },
    ]
}

/// Every sample of an epoch, in every order mode, reaches device memory with its file bytes; a
/// consumer stream waits on each batch's event.
#[test]
fn device_epochs_equal_the_files_in_every_mode() {
    let Some(()) = gpu() else { return };
    let ctx = gpufeed::testing::context(0).unwrap();
    let dir = disk_dir();
    let n = 16 * 40;
    let ds = Dataset::open_shards(&shards(dir.path(), n, 200)).unwrap();
    let consumer = Stream::new(&ctx).unwrap();
    for order in modes() {
        let loader = Loader::builder(ds.clone())
            .batch_size(16)
            .order(order)
            .window(2, 8 << 20)
            .device(Device::Cuda(0))
            .build()
            .unwrap();
        let mut seen = vec![0u32; n];
        let mut epoch = loader.epoch(1).unwrap();
        for b in epoch.by_ref() {
            let b = b.unwrap();
            assert_eq!(b.device(), Some(0));
            assert!(b.device_ptr().is_some() && b.ready_event().is_some());
            // SAFETY: `consumer` is a live stream of the primary context and outlives `b`.
            unsafe { b.wait_on(consumer.raw()) }.unwrap();
            consumer.synchronize().unwrap();
            for (j, s) in b.to_host().unwrap().into_iter().enumerate() {
                let id = b.sample_ids()[j] as usize;
                let bytes = s.unwrap();
                let i: usize = ds.key(id).parse().unwrap();
                assert!(bytes == content(i, bytes.len()), "{order:?}: sample {id}");
                seen[id] += 1;
            }
        }
        drop(epoch);
        assert!(seen.iter().all(|&c| c == 1), "{order:?}");
        assert_eq!(loader.free_slots(), loader.slots());
        let (free, all) = loader.free_device_regions().unwrap();
        assert_eq!(free, all);
    }
}

/// A device loader dropped mid-epoch, copies in flight: everything returns, nothing crashes,
/// and the next epoch is intact.
#[test]
fn device_loader_dropped_mid_epoch() {
    let Some(()) = gpu() else { return };
    let dir = disk_dir();
    let n = 16 * 30;
    let ds = Dataset::open_shards(&shards(dir.path(), n, 100)).unwrap();
    let loader = Loader::builder(ds.clone())
        .batch_size(16)
        .window(1, 4 << 20)
        .device(Device::Cuda(0))
        .build()
        .unwrap();
    for k in 0..20u64 {
        let mut epoch = loader.epoch(k).unwrap();
        let held: Vec<_> = epoch
            .by_ref()
            .take((k % 5) as usize)
            .map(|b| b.unwrap())
            .collect();
        drop(epoch);
        drop(held);
        assert_eq!(loader.free_slots(), loader.slots(), "round {k}");
        let (free, all) = loader.free_device_regions().unwrap();
        assert_eq!(free, all, "round {k}");
    }
    let count: usize = loader.epoch(99).unwrap().map(|b| b.unwrap().len()).sum();
    assert_eq!(count, n);
}

/// cuFile and io_uring → pinned → H2D put the same bytes on the device.
#[test]
fn cufile_and_io_uring_paths_give_identical_bytes() {
    let Some(()) = gpu() else { return };
    let mode = match cufile::status() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("skipped: cuFile unavailable ({e}); the io_uring path is checked above");
            return;
        }
    };
    let ctx = gpufeed::testing::context(0).unwrap();
    let dir = disk_dir();
    let n = 64;
    let paths = shards(dir.path(), n, 64);
    let ds = Dataset::open_shards(&paths).unwrap();
    let f = CufileFile::open(&paths[0]).unwrap();
    let loader = Loader::builder(ds.clone())
        .batch_size(16)
        .window(1, 8 << 20)
        .device(Device::Cuda(0))
        .build()
        .unwrap();
    let mut checked = 0;
    for b in loader.epoch(0).unwrap() {
        let b = b.unwrap();
        for (j, s) in b.to_host().unwrap().into_iter().enumerate() {
            let id = b.sample_ids()[j] as usize;
            let smp = ds.sample(id);
            let mut dev = CufileBuffer::new(&ctx, smp.len as usize).unwrap();
            ctx.bind().unwrap();
            let got = f.read(&mut dev, smp.len as usize, smp.offset).unwrap();
            assert_eq!(got, smp.len as usize);
            let mut back = vec![0u8; got];
            dev.memory().read(0, &mut back).unwrap();
            assert!(
                back == s.unwrap(),
                "sample {id} differs between cuFile ({}) and io_uring",
                mode.name()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, n);
}

/// The kernels NVRTC compiled for this GPU, loaded and launched, give what the same sources
/// built for the host give (the simulated device's kernels): crc32c bit for bit, the resize
/// within 0.01 levels in f32 (the same arithmetic, `--fmad=false` on both sides).
#[test]
fn the_kernels_on_the_gpu_equal_the_host_kernels() {
    use gpufeed::decode::{ImageSpec, PixelType, RgbDecoder};
    use gpufeed::testing::host_kernels;
    use gpufeed::testing::kernels::{as_bytes, DeviceKernels, GfEmit, GfSample, GfSpan, CRC_LANES};
    let Some(()) = gpu() else { return };
    if !host_kernels::available() {
        eprintln!("skipped: this build has no host kernels to compare with");
        return;
    }
    let ctx = gpufeed::testing::context(0).unwrap();
    let k = DeviceKernels::load(&ctx).unwrap_or_else(|e| panic!("{}", e.report()));
    let stream = Stream::new(&ctx).unwrap();
    let upload = |b: &[u8]| {
        let mut d = DeviceBuffer::new(&ctx, b.len().max(1)).unwrap();
        d.write(0, b).unwrap();
        d
    };

    // crc32c of 200 spans of a 300 KB group.
    let mut r = Rng::new(40);
    let data: Vec<u8> = (0..300_000).map(|_| r.next_u64() as u8).collect();
    let spans: Vec<GfSpan> = (0..200)
        .map(|_| {
            let len = r.below(5000) as u32;
            GfSpan {
                offset: r.below((data.len() - len as usize) as u64),
                len,
                reserved: 0,
            }
        })
        .collect();
    let (dd, ds, dlanes, dout) = (
        upload(&data),
        upload(as_bytes(&spans)),
        DeviceBuffer::new(&ctx, spans.len() * 4 * CRC_LANES as usize).unwrap(),
        DeviceBuffer::new(&ctx, spans.len() * 4).unwrap(),
    );
    // SAFETY: the spans lie inside `dd` (drawn so), `dlanes` holds CRC_LANES u32s and `dout`
    // one per span, and all live until the stream is synchronised below.
    unsafe { k.crc32c(&stream, dd.ptr(), ds.ptr(), 200, dlanes.ptr(), dout.ptr()) }.unwrap();
    stream.synchronize().unwrap();
    let mut got = vec![0u8; spans.len() * 4];
    dout.read(0, &mut got).unwrap();
    let want = host_kernels::crc32c(&data, &spans).unwrap();
    for (i, w) in want.iter().enumerate() {
        let g = u32::from_le_bytes(got[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(g, *w, "span {i}");
    }

    // The fused resize over 12 decoded JPEGs of every kind, one failed.
    let mut dec = RgbDecoder::new().unwrap();
    let (mut src, mut samples) = (Vec::new(), Vec::new());
    let spec = ImageSpec::train(56).dtype(PixelType::F32);
    for i in 0..12 {
        let j = gpufeed::testing::synth::jpeg(3, i).unwrap();
        let mut px = Vec::new();
        let size = dec.decode(&j, &mut px).unwrap();
        let g = spec.geometry(1, 2, i, size);
        samples.push(GfSample::new(&g, src.len() as u64, size));
        src.extend_from_slice(&px);
    }
    samples[5].valid = 0;
    let emit = GfEmit::new(&spec);
    let out_len = samples.len() * spec.sample_elems() * 4;
    let (dsrc, dsam, dout) = (
        upload(&src),
        upload(as_bytes(&samples)),
        DeviceBuffer::new(&ctx, out_len).unwrap(),
    );
    // SAFETY: every image lies inside `dsrc` (packed above), `dout` holds the whole tensor,
    // and the buffers live until the stream is synchronised below.
    unsafe { k.resize(&stream, dsrc.ptr(), dsam.ptr(), 12, &emit, dout.ptr()) }.unwrap();
    stream.synchronize().unwrap();
    let mut got = vec![0u8; out_len];
    dout.read(0, &mut got).unwrap();
    let mut want = vec![0u8; out_len];
    host_kernels::resize(&src, &samples, &emit, &mut want).unwrap();
    let (mut worst, mut exact) = (0f32, 0usize);
    for (g, w) in got.chunks_exact(4).zip(want.chunks_exact(4)) {
        let (g, w) = (
            f32::from_le_bytes(g.try_into().unwrap()),
            f32::from_le_bytes(w.try_into().unwrap()),
        );
        worst = worst.max((g - w).abs() * 255.0 * 0.229);
        exact += usize::from(g.to_bits() == w.to_bits());
    }
    eprintln!(
        "resize on the GPU vs the host kernels: worst {worst:.5} levels, {exact} of {} elements \
         bit-exact",
        out_len / 4
    );
    assert!(worst <= 0.01, "{worst} levels");
}

/// The device image pipeline on CUDA: the simulated device's test bodies, on the GPU.
#[test]
fn device_image_batches_equal_the_cpu_stage_on_cuda() {
    let Some(()) = gpu() else { return };
    crate::device_images::device_batches_equal_the_cpu_stage(crate::device_images::On::Cuda);
}

/// Routing, resume, a drop mid-epoch and flat memory on CUDA.
#[test]
fn the_device_pipeline_on_cuda_routes_resumes_drops_and_stays_flat() {
    let Some(()) = gpu() else { return };
    crate::device_images::device_pipeline_routes_resumes_drops_and_stays_flat(
        crate::device_images::On::Cuda,
    );
}
