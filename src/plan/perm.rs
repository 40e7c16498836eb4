//! A keyed permutation of `[0, n)` computed one position at a time: a balanced Feistel network
//! on the smallest even number of bits that holds `n`, with cycle-walking back into `[0, n)`.
//! `at(i)` and `index_of(v)` cost O(rounds × expected walks) (walks < 4 on average: the
//! network's domain is under 4n), and nothing of size `n` is ever built — the building block
//! for epoch orders over 10⁹ samples (issue 39, item 2: not yet what the planner uses).

/// A permutation of `[0, n)` chosen by a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half: u32,
    keys: [u64; ROUNDS],
}

/// Feistel rounds: four make a balanced network a pseudo-random permutation (Luby–Rackoff);
/// six leave a margin for the weak round function's structure.
const ROUNDS: usize = 6;

/// splitmix64's finaliser: a fast, well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Permutation {
    /// The permutation of `[0, n)` that `key` picks (the same key and `n`, the same order).
    pub fn new(n: u64, key: u64) -> Permutation {
        // The smallest even bit count whose domain holds n (at least 2 bits).
        let bits = (64 - n.saturating_sub(1).leading_zeros())
            .max(2)
            .next_multiple_of(2);
        let mut keys = [0u64; ROUNDS];
        let mut k = mix(key ^ 0x6a09_e667_f3bc_c908);
        for r in &mut keys {
            k = mix(k.wrapping_add(0x9e37_79b9_7f4a_7c15));
            *r = k;
        }
        Permutation {
            n,
            half: bits / 2,
            keys,
        }
    }

    /// Elements permuted.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether it permutes nothing.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn mask(&self) -> u64 {
        (1u64 << self.half) - 1
    }

    fn round(&self, r: u64, k: u64) -> u64 {
        mix(r ^ k) & self.mask()
    }

    /// The network on the full domain (a bijection of `[0, 2^(2·half))`).
    fn encrypt(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half, x & self.mask());
        for &k in &self.keys {
            (l, r) = (r, l ^ self.round(r, k));
        }
        (l << self.half) | r
    }

    /// Its inverse.
    fn decrypt(&self, y: u64) -> u64 {
        let (mut l, mut r) = (y >> self.half, y & self.mask());
        for &k in self.keys.iter().rev() {
            (l, r) = (r ^ self.round(l, k), l);
        }
        (l << self.half) | r
    }

    /// The element at position `i` (`i < len()`).
    pub fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut y = self.encrypt(i);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    /// The position of element `v` (`v < len()`): `at(index_of(v)) == v`.
    pub fn index_of(&self, v: u64) -> u64 {
        debug_assert!(v < self.n);
        let mut x = self.decrypt(v);
        while x >= self.n {
            x = self.decrypt(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_is_a_permutation_and_its_inverse_undoes_it() {
        for n in [
            1u64, 2, 3, 4, 5, 7, 8, 9, 100, 255, 256, 257, 1000, 4097, 65_537,
        ] {
            for key in [0u64, 1, 42, u64::MAX] {
                let p = Permutation::new(n, key);
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let v = p.at(i);
                    assert!(v < n, "n {n} key {key}: {v} out of range");
                    assert!(!seen[v as usize], "n {n} key {key}: {v} twice");
                    seen[v as usize] = true;
                    assert_eq!(p.index_of(v), i, "n {n} key {key}");
                }
            }
        }
    }

    #[test]
    fn the_key_picks_the_order_and_the_order_is_shuffled() {
        let n = 100_000u64;
        let a = Permutation::new(n, 7);
        assert_eq!(a, Permutation::new(n, 7), "a pure function of the key");
        let b = Permutation::new(n, 8);
        let same = (0..n).filter(|&i| a.at(i) == b.at(i)).count();
        assert!(same < 10, "{same} positions agree between two keys");
        // Far from the identity: few fixed points, mean displacement near n/3 (uniform: n/3),
        // and next to no correlation between position and element.
        let fixed = (0..n).filter(|&i| a.at(i) == i).count();
        assert!(fixed < 10, "{fixed} fixed points");
        let disp: f64 = (0..n)
            .map(|i| (a.at(i) as f64 - i as f64).abs())
            .sum::<f64>()
            / n as f64;
        assert!(
            (disp / n as f64 - 1.0 / 3.0).abs() < 0.01,
            "mean displacement {disp}"
        );
        let mean = (n - 1) as f64 / 2.0;
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for i in 0..n {
            let (x, y) = (i as f64 - mean, a.at(i) as f64 - mean);
            sxy += x * y;
            sxx += x * x;
        }
        assert!((sxy / sxx).abs() < 0.01, "correlation {}", sxy / sxx);
        // Each tenth of the positions draws evenly from each tenth of the elements.
        let mut cells = [[0u32; 10]; 10];
        for i in 0..n {
            cells[(i * 10 / n) as usize][(a.at(i) * 10 / n) as usize] += 1;
        }
        for row in cells {
            for c in row {
                assert!((900..1100).contains(&c), "{cells:?}");
            }
        }
    }

    #[test]
    fn a_billion_positions_cost_nothing_up_front() {
        let n = 1_000_000_000u64;
        let p = Permutation::new(n, 3);
        for i in [0, 1, n / 2, n - 1] {
            let v = p.at(i);
            assert!(v < n);
            assert_eq!(p.index_of(v), i);
        }
    }
}
