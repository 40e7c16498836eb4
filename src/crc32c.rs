//! crc32c (Castagnoli: iSCSI, TFRecord, the packed shards' per-sample checksums).
//!
//! On x86-64 with SSE4.2 the `crc32` instruction runs three independent chains over three
//! consecutive blocks of a sample and the three results are joined with a shift operator
//! (appending `n` zero bytes to a raw crc is linear over GF(2): four table lookups). One chain
//! is bound by the instruction's 3-cycle latency; three keep its one-per-cycle throughput busy,
//! about 8 bytes a cycle — faster than memory delivers bytes that are not in cache, so a check
//! of freshly DMA'd data costs about one read of it (DECISIONS: "crc32c at memory speed").
//! Elsewhere (another architecture, a CPU without SSE4.2) the `crc-fast` crate's folding path.
//! The tests hold it to the `crc32c` crate on every length and alignment.

/// crc32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = x86::tables() {
        // SAFETY: `tables()` returns `Some` only where the CPU has SSE4.2 (runtime-detected),
        // the one feature `crc32c_sse42` is compiled for.
        return unsafe { x86::crc32c_sse42(data, t) };
    }
    portable(data)
}

/// The portable path (also the x86-64 one without SSE4.2), exposed for the benchmark.
#[doc(hidden)]
pub fn portable(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    use std::sync::OnceLock;

    /// Block of each of the three chains for long inputs (24 KiB a round) and short ones
    /// (768 bytes a round); what is left after them goes through one chain.
    const LONG: usize = 8192;
    const SHORT: usize = 256;

    /// The linear operator "append `n` zero bytes" on a raw (unconditioned) crc, as four
    /// 256-entry tables, one per byte of the crc.
    pub(super) struct Shift([[u32; 256]; 4]);

    impl Shift {
        /// Builds the operator for `n` zero bytes from its action on the 32 basis vectors,
        /// computed bit by bit (no dependence on the instruction being built here).
        fn new(n: usize) -> Shift {
            let mut basis = [0u32; 32];
            for (bit, b) in basis.iter_mut().enumerate() {
                let mut c = 1u32 << bit;
                for _ in 0..n * 8 {
                    c = if c & 1 != 0 {
                        (c >> 1) ^ 0x82F6_3B78
                    } else {
                        c >> 1
                    };
                }
                *b = c;
            }
            let mut t = [[0u32; 256]; 4];
            for (k, row) in t.iter_mut().enumerate() {
                for (v, e) in row.iter_mut().enumerate() {
                    *e = (0..8)
                        .filter(|j| v >> j & 1 != 0)
                        .fold(0, |acc, j| acc ^ basis[8 * k + j]);
                }
            }
            Shift(t)
        }

        #[inline(always)]
        fn apply(&self, c: u32) -> u32 {
            self.0[0][(c & 0xff) as usize]
                ^ self.0[1][(c >> 8 & 0xff) as usize]
                ^ self.0[2][(c >> 16 & 0xff) as usize]
                ^ self.0[3][(c >> 24) as usize]
        }
    }

    /// The two shift operators (LONG and SHORT), built once; `None` without SSE4.2.
    pub(super) struct Tables {
        long: Shift,
        short: Shift,
    }

    pub(super) fn tables() -> Option<&'static Tables> {
        static T: OnceLock<Option<Tables>> = OnceLock::new();
        T.get_or_init(|| {
            std::arch::is_x86_feature_detected!("sse4.2").then(|| Tables {
                long: Shift::new(LONG),
                short: Shift::new(SHORT),
            })
        })
        .as_ref()
    }

    #[inline(always)]
    fn word(b: &[u8]) -> u64 {
        u64::from_le_bytes(b.try_into().expect("8-byte chunk"))
    }

    /// Three chains over `3 * block` bytes of `p` starting from raw crc `c`; the raw crc after.
    #[target_feature(enable = "sse4.2")]
    #[inline]
    fn three_way(c: u32, p: &[u8], block: usize, shift: &Shift) -> u32 {
        let (a, rest) = p.split_at(block);
        let (b, d) = rest.split_at(block);
        let (mut c0, mut c1, mut c2) = (u64::from(c), 0u64, 0u64);
        for ((x, y), z) in a
            .chunks_exact(8)
            .zip(b.chunks_exact(8))
            .zip(d[..block].chunks_exact(8))
        {
            c0 = _mm_crc32_u64(c0, word(x));
            c1 = _mm_crc32_u64(c1, word(y));
            c2 = _mm_crc32_u64(c2, word(z));
        }
        let c = shift.apply(c0 as u32) ^ c1 as u32;
        shift.apply(c) ^ c2 as u32
    }

    /// crc32c of `data`.
    ///
    /// # Safety
    /// The CPU must have SSE4.2.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn crc32c_sse42(data: &[u8], t: &Tables) -> u32 {
        let mut c = !0u32;
        let mut p = data;
        while p.len() >= 3 * LONG {
            c = three_way(c, p, LONG, &t.long);
            p = &p[3 * LONG..];
        }
        while p.len() >= 3 * SHORT {
            c = three_way(c, p, SHORT, &t.short);
            p = &p[3 * SHORT..];
        }
        let mut w = u64::from(c);
        let mut words = p.chunks_exact(8);
        for x in &mut words {
            w = _mm_crc32_u64(w, word(x));
        }
        let mut c = w as u32;
        for &b in words.remainder() {
            c = _mm_crc32_u8(c, b);
        }
        !c
    }
}

#[cfg(test)]
mod tests {
    /// Against an independent implementation (the `crc32c` crate), on every length up to
    /// 4 KiB, lengths around the three-chain blocks, and large buffers at every alignment.
    #[test]
    fn crc32c_matches_the_reference_crate() {
        let mut r = crate::rng::Rng::new(9);
        let data: Vec<u8> = (0..(1 << 20) + 77).map(|_| r.next_u64() as u8).collect();
        for len in 0..4096 {
            let d = &data[..len];
            assert_eq!(super::crc32c(d), crc32c::crc32c(d), "len {len}");
            assert_eq!(super::portable(d), crc32c::crc32c(d), "portable, len {len}");
        }
        for base in [3 * 256, 3 * 8192, 2 * 3 * 8192, 3 * 8192 + 3 * 256] {
            for len in base - 9..base + 9 {
                let d = &data[5..5 + len];
                assert_eq!(super::crc32c(d), crc32c::crc32c(d), "len {len}");
            }
        }
        for start in 0..64 {
            let d = &data[start..];
            assert_eq!(super::crc32c(d), crc32c::crc32c(d), "start {start}");
        }
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(super::crc32c(b""), 0);
    }

    /// A sample that differs from another in one bit has another crc (the check can fail).
    #[test]
    fn one_flipped_bit_changes_the_crc() {
        let mut d = vec![7u8; 100_000];
        let a = super::crc32c(&d);
        d[54_321] ^= 0x10;
        assert_ne!(super::crc32c(&d), a);
    }
}
