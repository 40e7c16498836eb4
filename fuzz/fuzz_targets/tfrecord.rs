//! The TFRecord walker (scan and resynchronisation), the `offset size` index reader, record
//! framing checks, and the `tf.train.Example` parse of each record read.
//!
//! The first input byte picks: bit 0 rewrites both masked crc32c of every record the walk
//! reaches (so mutations get past the framing), bit 1 `tfrecord_recover`, bit 2 raw records
//! (no Example parse), bit 3 an index file: the next two bytes (LE) are its length and its
//! text follows; the rest of the input is the record file.
#![no_main]
use gpufeed::dataset::{Dataset, Format, OpenOptions};
use gpufeed_fuzz::{check_dataset, file, masked_crc, names_a_file, remove, Budget, Counting};

#[global_allocator]
static A: Counting = Counting;

fn fix_records(b: &mut [u8]) {
    let mut pos = 0usize;
    while pos + 16 <= b.len() {
        let len = u64::from_le_bytes(b[pos..pos + 8].try_into().unwrap());
        let c = masked_crc(&b[pos..pos + 8]);
        b[pos + 8..pos + 12].copy_from_slice(&c.to_le_bytes());
        let Some(end) = (len as usize)
            .checked_add(pos + 16)
            .filter(|&e| e <= b.len() && len <= b.len() as u64)
        else {
            return;
        };
        let c = masked_crc(&b[pos + 12..end - 4]);
        b[end - 4..end].copy_from_slice(&c.to_le_bytes());
        pos = end;
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let mut opts = OpenOptions {
        tfrecord_recover: mode & 2 != 0,
        ..OpenOptions::default()
    };
    if mode & 4 != 0 {
        opts.tfrecord_payload = None;
    }
    let mut index_bytes = 0;
    if mode & 8 != 0 {
        if rest.len() < 2 {
            return;
        }
        let n = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        opts.tfrecord_index = Some(file("r.idx", &rest[2..2 + n]));
        index_bytes = n;
        rest = &rest[2 + n..];
    } else {
        // No `NAME.idx` beside the file either: the scan is what is fuzzed.
        remove("r.idx");
    }
    let mut bytes = rest.to_vec();
    if mode & 1 != 0 {
        fix_records(&mut bytes);
    }
    let path = file("r", &bytes);
    // One 32-byte `Sample` per 16-byte record at most (or per index line), and problems.
    let budget = Budget::start("tfrecord", bytes.len() + index_bytes, 16, 256 << 10);
    match Dataset::open_files(Format::TfRecord, &[path], &opts) {
        Ok(ds) => check_dataset(&ds, 64),
        Err(e) => names_a_file(&e, "opening a TFRecord file"),
    }
    budget.check();
});
