//! Writes the `decode` target's seeds: JPEGs of every kind the generated ImageNet-like set has
//! (baseline 4:2:0, 4:4:4, 4:2:2, gray, CMYK, progressive, restart markers), each behind the
//! target's two mode bytes (`fuzz/fuzz_targets/decode.rs`). `scripts/fuzz.sh` runs it:
//! `cargo run --release --example fuzz_decode_seeds -- OUT_DIR`.
fn main() {
    let out = std::env::args()
        .nth(1)
        .expect("usage: fuzz_decode_seeds OUT_DIR");
    std::fs::create_dir_all(&out).expect("seed directory");
    for i in 0..20u64 {
        let jpeg = gpufeed::testing::synth::jpeg(7, i).expect("encode");
        for mode in [0u8, 1, 6, 9] {
            let mut b = vec![mode, i as u8];
            b.extend_from_slice(&jpeg);
            std::fs::write(format!("{out}/synth-{i}-{mode}"), b).expect("write seed");
        }
    }
}
