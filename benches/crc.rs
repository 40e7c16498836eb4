//! crc32c candidates side by side, per GiB checked (issue 26): the sample checks of the host
//! loader run over bytes just DMA'd into memory, one call per sample.
//!
//! - `memory`: a 512 MiB buffer (far past the last-level cache) walked in 112 KiB samples, the
//!   ImageNet mix's mean, one call each — what the loader's checks see;
//! - `cache`: one 64 KiB sample over and over (in L2) — what a decode thread that checks a
//!   sample just before decoding it sees.
//!
//! Candidates: `gpufeed` (three interleaved `crc32` chains, `gpufeed::crc32c`), `crc-fast`
//! (PCLMULQDQ folding; the crate gpufeed used before), the `crc32c` crate, and the floor — a sum
//! of the same bytes as 64-bit words, one read of them and nothing else.
//!
//! `cargo bench --bench crc` (throughput in GiB/s).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const SAMPLE: usize = 112 << 10;

fn sum(d: &[u8]) -> u32 {
    let mut s = 0u64;
    let mut w = d.chunks_exact(8);
    for x in &mut w {
        s = s.wrapping_add(u64::from_le_bytes(x.try_into().unwrap()));
    }
    for &b in w.remainder() {
        s = s.wrapping_add(u64::from(b));
    }
    s as u32
}

type Candidate = (&'static str, fn(&[u8]) -> u32);

const CANDIDATES: [Candidate; 4] = [
    ("gpufeed-3way", gpufeed::crc32c::crc32c),
    ("crc-fast", gpufeed::crc32c::portable),
    ("crc32c-crate", crc32c::crc32c),
    ("floor-sum", sum),
];

fn bench(c: &mut Criterion) {
    let mut r = gpufeed::testing::Rng::new(1);
    let big: Vec<u8> = (0..512usize << 20).map(|_| r.next_u64() as u8).collect();
    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Bytes(big.len() as u64))
        .sample_size(10);
    for (name, f) in CANDIDATES {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut x = 0u32;
                for s in big.chunks(SAMPLE) {
                    x ^= f(black_box(s));
                }
                x
            })
        });
    }
    g.finish();
    let small = &big[..64 << 10];
    let mut g = c.benchmark_group("cache");
    g.throughput(Throughput::Bytes(small.len() as u64));
    for (name, f) in CANDIDATES {
        g.bench_function(name, |b| b.iter(|| f(black_box(small))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
