//! The node cache's eviction policies replayed over shuffled epochs (issue 25): hit ratio of
//! each epoch after the first, for a dataset twice the cache.
//!
//! ```sh
//! cargo run --release --example cache_policies -- [EXTENTS] [EPOCHS] [SEED]
//! ```

use gpufeed::testing::cache_policy::{replay, Policy};
use gpufeed::testing::Rng;

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<u64>().expect("a number"));
    let n = args.next().unwrap_or(2000) as u32;
    let epochs = args.next().unwrap_or(4);
    let seed = args.next().unwrap_or(1);
    for (label, shuffled) in [
        ("a new shuffle each epoch", true),
        ("the same order", false),
    ] {
        let orders: Vec<Vec<u32>> = (0..epochs)
            .map(|e| {
                let mut v: Vec<u32> = (0..n).collect();
                if shuffled {
                    let mut r = Rng::new(seed * 1000 + e);
                    for i in (1..v.len()).rev() {
                        v.swap(i, r.below(i as u64 + 1) as usize);
                    }
                }
                v
            })
            .collect();
        println!(
            "{n} extents, {epochs} epochs, cache = {} extents, {label}:",
            n / 2
        );
        for (name, p) in [
            ("keep-what-fits", Policy::KeepWhatFits),
            ("LRU", Policy::Lru),
            ("FIFO", Policy::Fifo),
            ("random-2", Policy::Random2(seed)),
            ("furthest-next-use", Policy::FurthestNextUse),
        ] {
            let h = replay(p, n as usize / 2, &orders);
            let later: Vec<String> = h[1..]
                .iter()
                .map(|e| format!("{:.1}%", e.ratio() * 100.0))
                .collect();
            let written: u64 = h.iter().map(|e| e.admitted).sum();
            println!(
                "  {name:<18} hits after epoch 1: {}  (extents written: {written})",
                later.join(" ")
            );
        }
    }
}
