//! The text arguments parsed from users: sizes (`4K`, `1.5G`), fio-style size mixes
//! (`4K/50:128K/50`, the `--bs` of `gpufeed bench io`), and dataset options by name (the CLI's
//! `--NAME`, Python's keywords, the C struct's strings).
//!
//! Input: byte 0 picks the parser (and, for options, which option); the rest is the text.
#![no_main]
use gpufeed::config::{parse_size, size_label};
use gpufeed::dataset::{OpenOptions, DATASET_OPTIONS};
use gpufeed_cli::bench::SizeMix;
use gpufeed_fuzz::Counting;

#[global_allocator]
static A: Counting = Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match pick % 3 {
        0 => {
            if let Ok(v) = parse_size(text) {
                let label = size_label(v);
                assert_eq!(
                    parse_size(&label).ok(),
                    Some(v),
                    "{text:?} → {v} → {label:?}"
                );
            }
        }
        1 => {
            if let Ok(m) = SizeMix::parse(text) {
                assert!(m.min() >= 1 && m.max() <= 256 << 20 && m.min() <= m.max());
                let mean = m.mean();
                assert!(
                    mean >= m.min() as f64 && mean <= m.max() as f64,
                    "{text:?}: mean {mean}"
                );
                let seed = rest.iter().fold(0u64, |h, &c| h.rotate_left(5) ^ c as u64);
                for u in [0, u64::MAX, seed, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)] {
                    let s = m.pick(u);
                    assert!(s >= m.min() && s <= m.max(), "{text:?}: picked {s}");
                }
                // What the mix prints parses back to the same mix.
                let again = SizeMix::parse(m.label()).expect("a mix's label parses");
                assert_eq!((again.min(), again.max()), (m.min(), m.max()));
            }
        }
        _ => {
            let name = DATASET_OPTIONS[(pick as usize / 3) % DATASET_OPTIONS.len()].name;
            let mut o = OpenOptions::default();
            if o.set(name, text).is_ok() {
                // Every option's value, as `values` writes it, sets the same options again.
                let before = o.values();
                let mut again = o.clone();
                for (n, v) in &before {
                    again
                        .set(n, v.as_deref().unwrap_or("none"))
                        .unwrap_or_else(|e| panic!("{n}={v:?} from values() is refused: {e}"));
                }
                assert_eq!(again.values(), before, "after setting {name}={text:?}");
            }
        }
    }
});
