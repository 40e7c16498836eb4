//! The sample index as the planner reads it: 16 bytes per sample, or runs of fixed windows
//! whose samples are computed from their number and stored nowhere.
//!
//! A flat token file's window `k` starts at `base + k × stride × width`: keeping 32 bytes for it
//! would make a 10⁹-window corpus cost 32 GB per rank (nanoGPT computes its windows; so does
//! this). Other formats keep each sample in 16 bytes — offset (40 bits), label (24 bits),
//! length, crc32c — with its file found from where each file's samples start (every index
//! gpufeed builds keeps a file's samples together, files in order); an index that does not
//! fit that (an offset past 1 TiB in a labelled dataset, a label outside −1 ..= 16,777,214, files
//! out of order) keeps 32-byte
//! [`Sample`]s. Every reader goes through [`Samples::get`] and [`Samples::iter`], the same for
//! every form.

use super::Sample;

/// Consecutive samples of one file, evenly spaced and of one length: sample `first + k` is
/// `len` bytes at `base + k × step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The first sample's number.
    pub first: u64,
    /// Samples in the run.
    pub count: u64,
    /// The file.
    pub file: u32,
    /// The first sample's byte offset.
    pub base: u64,
    /// Bytes from one sample's start to the next.
    pub step: u64,
    /// Bytes of each sample.
    pub len: u32,
}

impl Run {
    fn sample(&self, k: u64) -> Sample {
        Sample {
            file: self.file,
            len: self.len,
            offset: self.base + k * self.step,
            label: -1,
            crc32c: 0,
        }
    }
}

/// One sample in 16 bytes: its offset (low 40 bits) and label + 1 (high 24 bits), its length
/// and crc32c. Its file is its files' business ([`Repr::Compact`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Compact {
    offset_label: u64,
    len: u32,
    crc32c: u32,
}

/// Bytes that stay put while shared (a file mapping the ranks of a node share).
pub(crate) type SharedBytes = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

/// The compact entries: this process's own, or a mapping of a file every rank of the node maps
/// (the same pages, one copy), checked equal to this process's own before use.
#[derive(Clone)]
enum Entries {
    Owned(Vec<Compact>),
    Shared {
        bytes: SharedBytes,
        offset: usize,
        len: usize,
    },
}

impl std::fmt::Debug for Entries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entries::Owned(v) => write!(f, "Owned({} entries)", v.len()),
            Entries::Shared { len, .. } => write!(f, "Shared({len} entries)"),
        }
    }
}

impl std::ops::Deref for Entries {
    type Target = [Compact];
    fn deref(&self) -> &[Compact] {
        match self {
            Entries::Owned(v) => v,
            Entries::Shared { bytes, offset, len } => bytemuck::cast_slice(
                &(**bytes).as_ref()[*offset..*offset + len * std::mem::size_of::<Compact>()],
            ),
        }
    }
}

const OFFSET_BITS: u32 = 40;
const OFFSET_MAX: u64 = (1 << OFFSET_BITS) - 1;
/// Labels −1 ..= LABEL_MAX are stored (as label + 1 in 24 bits).
const LABEL_MAX: i64 = (1 << (64 - OFFSET_BITS)) - 2;

#[derive(Debug, Clone)]
enum Repr {
    /// 32 bytes per sample: what does not fit `Compact`.
    Table(Vec<Sample>),
    /// 16 bytes per sample; `file_first[f]` is file f's first sample (files in order, each
    /// one's samples together; an empty file's first is the next one's) — or, where `file_first`
    /// is empty, sample `i` is file `i` (an ImageFolder: nothing kept per file).
    Compact {
        entries: Entries,
        file_first: Vec<u32>,
        /// Every label −1, the whole 64 bits the offset (a Megatron `.bin` may pass 1 TiB).
        unlabelled: bool,
    },
    Runs {
        runs: Vec<Run>,
        len: u64,
    },
}

/// Collects samples in the compact form while they fit it, in the table from the first that
/// does not (16 bytes a sample while indexing, not 32 then 16).
#[derive(Debug, Default)]
pub(crate) struct SamplesBuilder {
    entries: Vec<Compact>,
    file_first: Vec<u32>,
    table: Option<Vec<Sample>>,
    /// Some sample so far has a label.
    labelled: bool,
    /// Some offset so far is past [`OFFSET_MAX`] (every label then −1).
    unlabelled: bool,
}

impl SamplesBuilder {
    /// Appends sample `s` (the next one).
    pub fn push(&mut self, s: Sample) {
        if let Some(t) = &mut self.table {
            t.push(s);
            return;
        }
        let i = self.entries.len();
        let f = s.file as usize;
        // An offset past 1 TiB fits while no sample has a label: the label's bits are then
        // the offset's (label −1 is stored as 0 there, so the entries so far read the same).
        let wide = s.label == -1 && !self.labelled && (self.unlabelled || s.offset > OFFSET_MAX);
        let narrow =
            !self.unlabelled && s.offset <= OFFSET_MAX && (-1..=LABEL_MAX).contains(&s.label);
        let fits = (wide || narrow) && f + 1 >= self.file_first.len() && i < u32::MAX as usize;
        if !fits {
            let mut t: Vec<Sample> = self.take_compact().iter().collect();
            t.push(s);
            self.table = Some(t);
            return;
        }
        self.labelled |= s.label != -1;
        self.unlabelled |= wide;
        while self.file_first.len() <= f {
            self.file_first.push(i as u32);
        }
        self.entries.push(Compact {
            // (Wide: the label is −1, its bits 0, and the offset takes all 64.)
            offset_label: s.offset | ((s.label + 1) as u64) << OFFSET_BITS,
            len: s.len,
            crc32c: s.crc32c,
        });
    }

    fn take_compact(&mut self) -> Samples {
        let mut entries = std::mem::take(&mut self.entries);
        entries.shrink_to_fit();
        let mut file_first = std::mem::take(&mut self.file_first);
        // Each sample its own file (file i's first sample is i): kept as nothing at all.
        if file_first.len() == entries.len()
            && file_first.iter().enumerate().all(|(i, &f)| f as usize == i)
        {
            file_first = Vec::new();
        }
        Samples(Repr::Compact {
            entries: Entries::Owned(entries),
            file_first,
            unlabelled: self.unlabelled,
        })
    }

    /// Samples so far.
    pub fn len(&self) -> usize {
        self.table.as_ref().map_or(self.entries.len(), Vec::len)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for `n` more.
    pub fn reserve(&mut self, n: usize) {
        match &mut self.table {
            Some(t) => t.reserve(n),
            None => self.entries.reserve(n),
        }
    }

    /// The samples.
    pub fn finish(mut self) -> Samples {
        match self.table.take() {
            Some(t) => Samples(Repr::Table(t)),
            None => self.take_compact(),
        }
    }
}

/// Every sample of a dataset, in dataset order: where its bytes are, its label and checksum.
#[derive(Debug, Clone)]
pub struct Samples(Repr);

impl Default for Samples {
    fn default() -> Self {
        Samples(Repr::Table(Vec::new()))
    }
}

/// The compact form where every sample fits it, else the table.
impl From<Vec<Sample>> for Samples {
    fn from(v: Vec<Sample>) -> Self {
        v.into_iter().collect()
    }
}

impl FromIterator<Sample> for Samples {
    fn from_iter<I: IntoIterator<Item = Sample>>(it: I) -> Self {
        let mut b = SamplesBuilder::default();
        for s in it {
            b.push(s);
        }
        b.finish()
    }
}

impl<'a> IntoIterator for &'a Samples {
    type Item = Sample;
    type IntoIter = Box<dyn ExactSizeIterator<Item = Sample> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl Samples {
    /// Runs of windows (each of its own file, in sample order from 0): nothing stored per
    /// sample.
    pub(crate) fn from_runs(runs: Vec<Run>) -> Samples {
        let len = runs.last().map_or(0, |r| r.first + r.count);
        debug_assert!(runs
            .windows(2)
            .all(|w| w[0].first + w[0].count == w[1].first));
        Samples(Repr::Runs { runs, len })
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Table(v) => v.len(),
            Repr::Compact { entries, .. } => entries.len(),
            Repr::Runs { len, .. } => *len as usize,
        }
    }

    /// Sample `i` of the compact form, whose file is `file` (`unlabelled`: the offset is the
    /// whole 64 bits).
    #[inline]
    fn unpack(e: &Compact, file: u32, unlabelled: bool) -> Sample {
        let (offset, label) = match unlabelled {
            true => (e.offset_label, -1),
            false => (
                e.offset_label & OFFSET_MAX,
                (e.offset_label >> OFFSET_BITS) as i64 - 1,
            ),
        };
        Sample {
            file,
            len: e.len,
            offset,
            label,
            crc32c: e.crc32c,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i`. Panics when `i` is not below [`len`](Samples::len), as a slice does.
    #[inline]
    pub fn get(&self, i: usize) -> Sample {
        match &self.0 {
            Repr::Table(v) => v[i],
            Repr::Compact {
                entries,
                file_first,
                unlabelled,
            } => {
                let file = match file_first.is_empty() {
                    true => i,
                    false => file_first.partition_point(|&f| f as usize <= i) - 1,
                };
                Self::unpack(&entries[i], file as u32, *unlabelled)
            }
            Repr::Runs { runs, len } => {
                assert!((i as u64) < *len, "sample {i} of {len}");
                let r = &runs[runs.partition_point(|r| r.first <= i as u64) - 1];
                r.sample(i as u64 - r.first)
            }
        }
    }

    /// Every sample, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Sample> + '_ {
        let (table, compact, files, runs): (&[Sample], &[Compact], &[u32], &[Run]) = match &self.0 {
            Repr::Table(v) => (v, &[], &[], &[]),
            Repr::Compact {
                entries,
                file_first,
                ..
            } => (&[], entries, file_first, &[]),
            Repr::Runs { runs, .. } => (&[], &[], &[], runs),
        };
        Iter {
            table: table.iter(),
            compact: compact.iter(),
            unlabelled: self.unlabelled(),
            files,
            file: 0,
            at: 0,
            runs: runs.iter(),
            run: None,
            left: self.len(),
        }
    }

    /// The first sample of the run of consecutive samples of `i`'s file that holds `i` (a
    /// file's samples are contiguous in every index gpufeed builds).
    pub fn first_of_file(&self, i: usize) -> usize {
        match &self.0 {
            Repr::Table(v) => {
                // Rare (what the compact form cannot hold): a walk back.
                let f = v[i].file;
                let mut k = i;
                while k > 0 && v[k - 1].file == f {
                    k -= 1;
                }
                k
            }
            Repr::Compact { file_first, .. } if file_first.is_empty() => i,
            Repr::Compact { file_first, .. } => {
                let f = file_first.partition_point(|&f| f as usize <= i) - 1;
                file_first[f] as usize
            }
            Repr::Runs { runs, .. } => {
                let mut r = runs.partition_point(|r| r.first <= i as u64) - 1;
                while r > 0 && runs[r - 1].file == runs[r].file {
                    r -= 1;
                }
                runs[r].first as usize
            }
        }
    }

    /// The largest span of one sample widened to `align` at both ends (see [`super::span`]).
    pub fn largest_span(&self, align: u64) -> u64 {
        match &self.0 {
            Repr::Table(_) | Repr::Compact { .. } => self
                .iter()
                .map(|s| super::span(&s, align))
                .max()
                .unwrap_or(0),
            Repr::Runs { runs, .. } => runs
                .iter()
                .map(|r| run_spans(r, align).0)
                .max()
                .unwrap_or(0),
        }
    }

    /// Bytes of all samples together.
    pub fn total_len(&self) -> u64 {
        match &self.0 {
            Repr::Table(v) => v.iter().map(|s| s.len as u64).sum(),
            Repr::Compact { entries, .. } => entries.iter().map(|s| s.len as u64).sum(),
            Repr::Runs { runs, .. } => runs.iter().map(|r| r.count * r.len as u64).sum(),
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Table(v) => v.capacity() * std::mem::size_of::<Sample>(),
            Repr::Compact {
                entries,
                file_first,
                ..
            } => {
                let own = match entries {
                    Entries::Owned(v) => v.capacity() * std::mem::size_of::<Compact>(),
                    Entries::Shared { .. } => 0,
                };
                own + file_first.capacity() * 4
            }
            Repr::Runs { runs, .. } => runs.capacity() * std::mem::size_of::<Run>(),
        }
    }

    /// Bytes of the index mapped from a file the ranks of a node share (counted once per node,
    /// not in [`heap_bytes`](Samples::heap_bytes)).
    pub fn shared_bytes(&self) -> usize {
        match &self.0 {
            Repr::Compact {
                entries: Entries::Shared { len, .. },
                ..
            } => len * std::mem::size_of::<Compact>(),
            _ => 0,
        }
    }

    /// The compact entries this process holds, as bytes (what a shared index file holds).
    pub(crate) fn owned_compact_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Compact {
                entries: Entries::Owned(v),
                ..
            } => Some(bytemuck::cast_slice(v)),
            _ => None,
        }
    }

    /// Uses `bytes[at]` for the compact entries instead of this process's own, if they are byte
    /// for byte the same (nothing in them is trusted otherwise). Returns whether it did.
    pub(crate) fn share(&mut self, bytes: SharedBytes, at: std::ops::Range<usize>) -> bool {
        let Repr::Compact { entries, .. } = &mut self.0 else {
            return false;
        };
        let Entries::Owned(v) = entries else {
            return false;
        };
        let (len, own): (usize, &[u8]) = (v.len(), bytemuck::cast_slice(v));
        let theirs = (*bytes).as_ref();
        let align = std::mem::align_of::<Compact>();
        let same = at.start.is_multiple_of(align)
            && (theirs.as_ptr() as usize).is_multiple_of(align)
            && theirs.get(at.clone()) == Some(own);
        if same {
            *entries = Entries::Shared {
                bytes,
                offset: at.start,
                len,
            };
        }
        same
    }

    /// The compact entries in `bytes[at]` (16 bytes a sample), file `f`'s first at
    /// `file_first[f]`, read from there — once they are checked: every sample inside its file
    /// (`sizes`, one per file), the files in order. What is wrong is said (the caller then
    /// builds the index itself).
    pub(crate) fn mapped(
        bytes: SharedBytes,
        at: std::ops::Range<usize>,
        file_first: Vec<u32>,
        unlabelled: bool,
        sizes: &[u64],
        check: bool,
    ) -> Result<Samples, String> {
        let theirs = (*bytes).as_ref();
        let size = std::mem::size_of::<Compact>();
        let whole = theirs
            .get(at.clone())
            .ok_or("the table lies outside the file")?;
        if !at.start.is_multiple_of(std::mem::align_of::<Compact>())
            || !(theirs.as_ptr() as usize).is_multiple_of(std::mem::align_of::<Compact>())
            || !whole.len().is_multiple_of(size)
        {
            return Err("the table is not whole 16-byte entries".into());
        }
        let len = whole.len() / size;
        // No first samples: each sample its own file — of the size `sizes` gives, or (none
        // given: an ImageFolder) of the sample's length.
        let each = file_first.is_empty();
        let in_order = file_first.first().is_none_or(|&f| f == 0)
            && file_first.windows(2).all(|w| w[0] <= w[1])
            && file_first.last().is_none_or(|&f| f as usize <= len)
            && file_first.len() <= sizes.len()
            && (!each || sizes.is_empty() || sizes.len() == len);
        if !in_order || len > u32::MAX as usize {
            return Err("the files' first samples are out of order".into());
        }
        let s = Samples(Repr::Compact {
            entries: Entries::Shared {
                bytes,
                offset: at.start,
                len,
            },
            file_first,
            unlabelled,
        });
        if !check {
            // Checked before, and recorded so (the caller's word).
        } else if each && sizes.is_empty() {
            if let Some(i) = s.iter().position(|e| e.offset != 0) {
                return Err(format!(
                    "sample {i} of a file of its own is not at its start"
                ));
            }
        } else if let Some((i, e)) = s.iter().enumerate().find(|(_, e)| {
            e.offset
                .checked_add(e.len as u64)
                .is_none_or(|end| end > sizes[e.file as usize])
        }) {
            return Err(format!(
                "sample {i} ({} bytes at {}) lies past its file's {} bytes",
                e.len, e.offset, sizes[e.file as usize]
            ));
        }
        Ok(s)
    }

    /// The compact form's entries as bytes and where each file's samples start (what a node's
    /// index file holds); `None` for the other forms.
    pub(crate) fn compact_parts(&self) -> Option<(&[u8], &[u32])> {
        match &self.0 {
            Repr::Compact {
                entries,
                file_first,
                ..
            } => Some((bytemuck::cast_slice(entries), file_first)),
            _ => None,
        }
    }

    /// Whether the compact form holds no labels and 64-bit offsets ([`Repr::Compact`]).
    pub(crate) fn unlabelled(&self) -> bool {
        matches!(
            self.0,
            Repr::Compact {
                unlabelled: true,
                ..
            }
        )
    }

    /// The runs, when the samples are computed (fixed-length windows over a token file, or a
    /// Megatron corpus of one sample per sequence): a dataset of 10⁹ samples is a few runs.
    pub fn runs(&self) -> Option<&[Run]> {
        match &self.0 {
            Repr::Table(_) | Repr::Compact { .. } => None,
            Repr::Runs { runs, .. } => Some(runs),
        }
    }
}

/// The largest aligned span in a run and all its spans together, exactly: a span depends only
/// on the offset modulo `a`, which repeats every `a / gcd(step, a)` samples, so one period (at
/// most `a` samples) is summed. Where the period is over 2^16 samples (an alignment above
/// 64 KiB) the bound no span exceeds is used instead (the length rounded up to `a`, plus `a`).
pub(super) fn run_spans(r: &Run, a: u64) -> (u64, u64) {
    if r.count == 0 {
        return (0, 0);
    }
    let gcd = |mut x: u64, mut y: u64| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    let period = a / gcd(r.step % a, a);
    if period > 1 << 16 {
        let bound = (r.len as u64).div_ceil(a) * a + a;
        return (bound, bound.saturating_mul(r.count));
    }
    let spans = |k: u64| (0..k).map(|k| super::span(&r.sample(k), a));
    let first = period.min(r.count);
    let largest = spans(first).max().unwrap_or(0);
    let whole: u64 = spans(first).sum();
    let (q, rem) = (r.count / first, r.count % first);
    (largest, q * whole + spans(rem).sum::<u64>())
}

struct Iter<'a> {
    table: std::slice::Iter<'a, Sample>,
    compact: std::slice::Iter<'a, Compact>,
    unlabelled: bool,
    /// The compact form's files' first samples, the current file and sample.
    files: &'a [u32],
    file: usize,
    at: usize,
    runs: std::slice::Iter<'a, Run>,
    run: Option<(Run, u64)>,
    left: usize,
}

impl Iterator for Iter<'_> {
    type Item = Sample;
    #[inline]
    fn next(&mut self) -> Option<Sample> {
        if let Some(s) = self.table.next() {
            self.left -= 1;
            return Some(*s);
        }
        if let Some(e) = self.compact.next() {
            if self.files.is_empty() {
                self.file = self.at; // each sample its own file
            }
            while self.file + 1 < self.files.len() && self.files[self.file + 1] as usize <= self.at
            {
                self.file += 1;
            }
            self.at += 1;
            self.left -= 1;
            return Some(Samples::unpack(e, self.file as u32, self.unlabelled));
        }
        loop {
            match &mut self.run {
                Some((r, k)) if *k < r.count => {
                    let s = r.sample(*k);
                    *k += 1;
                    self.left -= 1;
                    return Some(s);
                }
                _ => self.run = Some((*self.runs.next()?, 0)),
            }
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs() -> Samples {
        Samples::from_runs(vec![
            Run {
                first: 0,
                count: 5,
                file: 0,
                base: 0,
                step: 512,
                len: 514,
            },
            Run {
                first: 5,
                count: 3,
                file: 1,
                base: 100,
                step: 6,
                len: 8,
            },
            Run {
                first: 8,
                count: 5000,
                file: 2,
                base: 0,
                step: 2,
                len: 4,
            },
        ])
    }

    #[test]
    fn runs_agree_with_their_table() {
        let r = runs();
        let table: Vec<Sample> = r.iter().collect();
        assert_eq!(table.len(), r.len());
        assert_eq!(r.len(), 5008);
        let t = Samples::from(table.clone());
        for (i, &s) in table.iter().enumerate() {
            assert_eq!(r.get(i), s, "{i}");
            assert_eq!(t.get(i), s);
            assert_eq!(r.first_of_file(i), t.first_of_file(i), "{i}");
        }
        assert_eq!(table[6].offset, 106);
        assert_eq!(table[4].offset, 2048);
        assert_eq!(r.first_of_file(7), 5);
        assert_eq!(r.first_of_file(5007), 8);
        assert_eq!(r.total_len(), t.total_len());
        let total = |s: &Samples, a| -> u64 { s.iter().map(|x| super::super::span(&x, a)).sum() };
        let runs_total = |a| -> u64 { r.runs().unwrap().iter().map(|x| run_spans(x, a).1).sum() };
        for a in [1, 512, 4096, 65536] {
            // Computed per run from one period of offsets: the table's figures exactly.
            assert_eq!(r.largest_span(a), t.largest_span(a), "align {a}");
            assert_eq!(runs_total(a), total(&t, a), "align {a}");
        }
        // A period over 2^16 samples (step 2, 1 MiB alignment): the bound, never below.
        let a = 1 << 20;
        assert!(r.largest_span(a) >= t.largest_span(a) && r.largest_span(a) <= 2 * a);
        assert!(runs_total(a) >= total(&t, a));
        assert!(r.heap_bytes() < 200);
    }

    /// The 16-byte form gives back every sample as stored — files (empty ones between, and at
    /// either end), offsets up to 2^40 − 1, labels −1 to 2^24 − 2 — and a sample it cannot hold
    /// keeps the whole table.
    #[test]
    fn sixteen_bytes_a_sample_hold_every_field() {
        let mut rng = crate::rng::Rng::new(3);
        let mut v = Vec::new();
        for file in [1u32, 2, 2, 2, 5, 5, 6] {
            for _ in 0..rng.below(50) {
                v.push(Sample {
                    file,
                    len: rng.next_u64() as u32,
                    offset: rng.next_u64() & OFFSET_MAX,
                    label: rng.below(LABEL_MAX as u64 + 2) as i64 - 1,
                    crc32c: rng.next_u64() as u32,
                });
            }
        }
        v.push(Sample {
            file: 9,
            len: u32::MAX,
            offset: OFFSET_MAX,
            label: LABEL_MAX,
            crc32c: u32::MAX,
        });
        v.push(Sample {
            file: 9,
            len: 0,
            offset: 0,
            label: -1,
            crc32c: 0,
        });
        let s = Samples::from(v.clone());
        assert!(matches!(s.0, Repr::Compact { .. }));
        assert_eq!(s.iter().collect::<Vec<_>>(), v);
        for (i, x) in v.iter().enumerate() {
            assert_eq!(s.get(i), *x, "{i}");
            let first = v.iter().position(|y| y.file == x.file).unwrap();
            assert_eq!(s.first_of_file(i), first, "{i}");
        }
        assert!(s.heap_bytes() <= v.len() * 16 + 64);
        let table = |f: &dyn Fn(&mut Sample)| {
            let mut w = v.clone();
            f(&mut w[3]);
            let t = Samples::from(w.clone());
            assert!(matches!(t.0, Repr::Table(_)));
            assert_eq!(t.iter().collect::<Vec<_>>(), w);
        };
        table(&|s| s.offset = OFFSET_MAX + 1);
        table(&|s| s.label = LABEL_MAX + 1);
        table(&|s| s.label = -2);
        table(&|s| s.file = 0); // file 0 after file 1: out of order
    }

    /// A dataset without labels keeps 16 bytes a sample at any offset (a Megatron `.bin` past
    /// 1 TiB), samples before and after the first such offset alike; a label in such a
    /// dataset, before or after it, keeps the whole table.
    #[test]
    fn unlabelled_samples_past_one_tib_stay_sixteen_bytes() {
        let v: Vec<Sample> = (0..100u64)
            .map(|i| Sample {
                file: (i / 30) as u32,
                len: 7 + i as u32,
                offset: match i {
                    0..40 => i << 30,
                    _ => (i << 40) + 3 * i,
                },
                label: -1,
                crc32c: i as u32,
            })
            .collect();
        let s = Samples::from(v.clone());
        assert!(s.unlabelled() && s.heap_bytes() <= v.len() * 16 + 64);
        assert_eq!(s.iter().collect::<Vec<_>>(), v);
        for (i, x) in v.iter().enumerate() {
            assert_eq!(s.get(i), *x, "{i}");
        }
        for at in [10, 70] {
            let mut w = v.clone();
            w[at].label = 0;
            let t = Samples::from(w.clone());
            assert!(matches!(t.0, Repr::Table(_)), "a label at {at}");
            assert_eq!(t.iter().collect::<Vec<_>>(), w);
        }
        // Below 1 TiB a dataset without labels is the usual form.
        assert!(!Samples::from(v[..40].to_vec()).unlabelled());
    }

    #[test]
    #[should_panic(expected = "sample 5008 of 5008")]
    fn past_the_end_panics_as_a_slice_does() {
        runs().get(5008);
    }

    #[test]
    fn a_table_with_interleaved_files_walks_back() {
        let s = |file| Sample {
            file,
            len: 1,
            offset: 0,
            label: -1,
            crc32c: 0,
        };
        let t = Samples::from(vec![s(0), s(1), s(1), s(0), s(0), s(2)]);
        assert_eq!(t.first_of_file(2), 1);
        assert_eq!(t.first_of_file(4), 3);
        assert_eq!(t.first_of_file(5), 5);
        assert_eq!(t.first_of_file(0), 0);
    }

    /// Each sample its own file (an ImageFolder, or shards of one sample each): nothing is
    /// kept per file, and every reader finds sample i in file i; read back from bytes, with
    /// no files' sizes (an ImageFolder: each file is its sample) or one size per sample.
    #[test]
    fn samples_each_in_a_file_of_its_own_keep_nothing_per_file() {
        let v: Vec<Sample> = (0..1000u32)
            .map(|i| Sample {
                file: i,
                len: 10 + i % 7,
                offset: 0,
                label: (i % 5) as i64,
                crc32c: i,
            })
            .collect();
        let s = Samples::from(v.clone());
        let Repr::Compact { file_first, .. } = &s.0 else {
            panic!("compact")
        };
        assert!(file_first.is_empty());
        assert_eq!(s.heap_bytes(), 16 * v.len());
        assert_eq!(s.iter().collect::<Vec<_>>(), v);
        for (i, x) in v.iter().enumerate() {
            assert_eq!(s.get(i), *x);
            assert_eq!(s.first_of_file(i), i);
        }
        let bytes: SharedBytes = std::sync::Arc::new(s.owned_compact_bytes().unwrap().to_vec());
        let at = 0..16 * v.len();
        let mapped =
            Samples::mapped(bytes.clone(), at.clone(), Vec::new(), false, &[], true).unwrap();
        assert_eq!(mapped.iter().collect::<Vec<_>>(), v);
        let sizes: Vec<u64> = v.iter().map(|x| x.len as u64).collect();
        let mapped =
            Samples::mapped(bytes.clone(), at.clone(), Vec::new(), false, &sizes, true).unwrap();
        assert_eq!(mapped.get(999), v[999]);
        // A sample past its file's size, or sizes for other files: refused.
        let mut short = sizes.clone();
        short[3] -= 1;
        assert!(
            Samples::mapped(bytes.clone(), at.clone(), Vec::new(), false, &short, true).is_err()
        );
        assert!(Samples::mapped(
            bytes.clone(),
            at.clone(),
            Vec::new(),
            false,
            &sizes[1..],
            true
        )
        .is_err());
        // A second sample in file 1: the files' first samples are kept.
        let mut w = v.clone();
        w[2].file = 1;
        for x in &mut w[3..] {
            x.file -= 1;
        }
        let t = Samples::from(w.clone());
        assert_eq!(t.iter().collect::<Vec<_>>(), w);
        assert_eq!(t.first_of_file(2), 1);
    }
}
