//! The submission path: operations per second and CPU per operation.
//!
//! Reads of 4 KiB from a file held in the page cache take the device out of the picture, so
//! what is measured is the cost of getting a read into the kernel and its completion back:
//! gpufeed's engine over io_uring (buffered), the same engine over plain `pread` (`std`), a bare
//! `pread` loop (the floor for one syscall per read), and bare io_uring NOPs (the ring alone).
//! Each is measured twice: wall time (operations/s) and process CPU time (CPU per operation,
//! all threads, from CLOCK_PROCESS_CPUTIME_ID).

use std::hint::black_box;
use std::path::PathBuf;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpufeed::testing::Rng;
use gpufeed::{Engine, EngineConfig, EngineKind, FileId, ReadSpec};

const READS_PER_ITER: usize = 256;
const FILE_BYTES: u64 = 64 << 20;

/// Process CPU time (user + system, all threads) in nanoseconds.
struct CpuTime;

fn cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

impl Measurement for CpuTime {
    type Intermediate = f64;
    type Value = f64;
    fn start(&self) -> f64 {
        cpu_ns()
    }
    fn end(&self, i: f64) -> f64 {
        cpu_ns() - i
    }
    fn add(&self, a: &f64, b: &f64) -> f64 {
        a + b
    }
    fn zero(&self) -> f64 {
        0.0
    }
    fn to_f64(&self, v: &f64) -> f64 {
        *v
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = if typical < 1e3 {
            (1.0, "ns cpu")
        } else if typical < 1e6 {
            (1e3, "µs cpu")
        } else {
            (1e6, "ms cpu")
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let n = match *t {
            Throughput::Elements(n) => n as f64,
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n as f64,
            _ => 1.0,
        };
        values.iter_mut().for_each(|v| *v = n * 1e9 / *v / 1e6);
        "M ops/cpu-s"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn bench_file() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpufeed-bench-submit.dat");
    gpufeed_cli::bench::ensure_file(&p, FILE_BYTES).unwrap();
    // Warm the page cache: the device must not be in the measurement.
    let _ = std::fs::read(&p).unwrap();
    p
}

fn offsets(n: usize) -> Vec<u64> {
    let mut rng = Rng::new(7);
    (0..n)
        .map(|_| rng.below(FILE_BYTES / 4096) * 4096)
        .collect()
}

/// Reads every offset (4 KiB) through the engine, one submission per read, qd in flight.
fn engine_reads(engine: &mut Engine, file: FileId, offs: &[u64]) {
    let mut next = 0;
    while next < offs.len() || engine.in_flight() > 0 {
        while next < offs.len() {
            let Some(slot) = engine.arena().take() else {
                break;
            };
            let spec = ReadSpec {
                file,
                offset: offs[next],
                len: 4096,
                buf_offset: 0,
            };
            engine.submit_one(slot, spec, next as u64).unwrap();
            engine.flush().unwrap();
            next += 1;
        }
        engine.wait(1).unwrap();
        while let Some(c) = engine.pop() {
            black_box(c.outcome().as_ref().unwrap());
            engine.arena().put(c.slot);
        }
    }
}

fn engine_for(kind: EngineKind) -> Engine {
    // The file stays cached: the device must not be in this measurement.
    let cfg = EngineConfig {
        honor_env: false,
        drop_cache_behind: false,
        ..EngineConfig::new(kind, 32, 8192)
    };
    Engine::new(cfg).unwrap()
}

fn submission<M: Measurement>(c: &mut Criterion<M>, label: &str) {
    let path = bench_file();
    let offs = offsets(READS_PER_ITER);
    let mut g = c.benchmark_group(format!("submit_4k_cached/{label}"));
    g.throughput(Throughput::Elements(READS_PER_ITER as u64));
    for kind in [EngineKind::UringBuffered, EngineKind::Std] {
        let mut engine = engine_for(kind);
        let file = engine.open(&path).unwrap();
        g.bench_function(format!("engine-{kind}"), |b| {
            b.iter(|| engine_reads(&mut engine, file, &offs))
        });
    }
    let f = std::fs::File::open(&path).unwrap();
    let mut buf = vec![0u8; 4096];
    g.bench_function("bare-pread", |b| {
        b.iter(|| {
            for &o in &offs {
                black_box(std::os::unix::fs::FileExt::read_at(&f, &mut buf, o).unwrap());
            }
        })
    });
    let mut ring = io_uring::IoUring::new(64).unwrap();
    g.bench_function("bare-uring-nop-x32", |b| {
        b.iter(|| {
            for _ in 0..READS_PER_ITER / 32 {
                for i in 0..32 {
                    let e = io_uring::opcode::Nop::new().build().user_data(i);
                    // SAFETY: a NOP references no memory.
                    unsafe { ring.submission().push(&e).unwrap() };
                }
                ring.submit_and_wait(32).unwrap();
                ring.completion().for_each(|c| {
                    black_box(c.result());
                });
            }
        })
    });
    g.finish();
}

fn wall(c: &mut Criterion) {
    submission(c, "wall");
}

fn cpu(c: &mut Criterion<CpuTime>) {
    submission(c, "cpu");
}

criterion_group!(wall_group, wall);
criterion_group! {
    name = cpu_group;
    config = Criterion::default().with_measurement(CpuTime);
    targets = cpu
}
criterion_main!(wall_group, cpu_group);
