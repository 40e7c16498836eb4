//! The packed shard reader (`.gpf`): header, index entries, key/metadata blob, image records.
//!
//! The first input byte picks fix-ups that let mutations get past the checksums: bit 0 writes
//! the magic and the header size, bit 1 makes the index span to the end of the file and fixes
//! its crc32c, bit 2 fixes every entry's sample crc32c (data inside the file only); the header
//! crc32c is always fixed when any bit is set. The rest of the input is the file.
#![no_main]
use gpufeed::dataset::{shard, Dataset, Format, OpenOptions};
use gpufeed_fuzz::{check_dataset, crc32c, file, Budget, Counting};

#[global_allocator]
static A: Counting = Counting;

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn fix(mode: u8, b: &mut [u8]) {
    if b.len() < 64 || mode & 7 == 0 {
        return;
    }
    if mode & 1 != 0 {
        b[0..8].copy_from_slice(b"GPFSHARD");
        b[10..12].copy_from_slice(&64u16.to_le_bytes());
    }
    if mode & 2 != 0 {
        let len = b.len() as u64;
        let at = u64_at(b, 32).clamp(64, len);
        b[32..40].copy_from_slice(&at.to_le_bytes());
        b[40..48].copy_from_slice(&(len - at).to_le_bytes());
        if mode & 4 != 0 {
            // Entries are 32 bytes from the index start: offset u64, len u32, crc32c u32.
            let count = u64_at(b, 16).min((len - at) / 32) as usize;
            for k in 0..count {
                let e = at as usize + 32 * k;
                let off = u64_at(b, e);
                let n = u32::from_le_bytes(b[e + 8..e + 12].try_into().unwrap()) as u64;
                if off.checked_add(n).is_some_and(|end| end <= at) {
                    let c = crc32c(&b[off as usize..(off + n) as usize]);
                    b[e + 12..e + 16].copy_from_slice(&c.to_le_bytes());
                }
            }
        }
        let c = crc32c(&b[at as usize..]);
        b[48..52].copy_from_slice(&c.to_le_bytes());
    }
    let c = crc32c(&b[..60]);
    b[60..64].copy_from_slice(&c.to_le_bytes());
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    fix(mode, &mut bytes);
    let path = file("s.gpf", &bytes);
    // The index is read whole (bounded by the file): entries expand 32 → 32 bytes of `Sample`
    // plus keys; vectors may double.
    let budget = Budget::start("shard", bytes.len(), 8, 64 << 10);
    match shard::read_index(&path) {
        Ok(ix) => {
            let h = ix.header;
            assert_eq!(h.index_offset + h.index_bytes, bytes.len() as u64);
            assert!(ix.entries.len() as u64 == h.sample_count);
            for (i, e) in ix.entries.iter().enumerate() {
                assert!(e.offset >= h.data_offset && e.offset + e.len as u64 <= h.index_offset);
                // Keys and metadata lie inside the blob (these slice it), and an image record is
                // there exactly when the header says so.
                let _ = (ix.key(i), ix.meta(i));
                assert_eq!(
                    ix.image_info(i).is_some(),
                    h.flags & shard::FLAG_IMAGE_INFO != 0
                );
            }
        }
        Err(e) => gpufeed_fuzz::names_a_file(&e, "shard::read_index"),
    }
    budget.check();
    let budget = Budget::start("shard dataset", bytes.len(), 8, 64 << 10);
    match Dataset::open_files(Format::Packed, &[path], &OpenOptions::default()) {
        Ok(ds) => {
            check_dataset(&ds, 64);
            let _ = ds.image_info();
        }
        Err(e) => gpufeed_fuzz::names_a_file(&e, "opening a shard"),
    }
    budget.check();
});
