//! The WebDataset tar walker: ustar, GNU long names, pax records, grouping members by key,
//! label members, resynchronising after a corrupt header.
//!
//! The first input byte picks the options and the fix-ups: bit 0 rewrites the checksum of
//! every 512-byte block that is not all zeros (so mutated headers are walked, not refused),
//! bit 1 names `bin` as a payload extension too (so any member can be a payload), bit 2 drops
//! the label member. The rest of the input is the tar.
#![no_main]
use gpufeed::dataset::{Dataset, Format, OpenOptions};
use gpufeed_fuzz::{check_dataset, file, names_a_file, Budget, Counting};

#[global_allocator]
static A: Counting = Counting;

/// ustar's checksum: the unsigned sum of the header with its checksum field read as spaces,
/// written as six octal digits, NUL, space.
fn fix_checksums(b: &mut [u8]) {
    for h in b.chunks_exact_mut(512) {
        if h.iter().all(|&c| c == 0) {
            continue;
        }
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&c| c as u32).sum();
        let s = format!("{:06o}\0 ", sum & 0o777777);
        h[148..156].copy_from_slice(s.as_bytes());
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if mode & 1 != 0 {
        fix_checksums(&mut bytes);
    }
    let path = file("t.tar", &bytes);
    let mut opts = OpenOptions::default();
    if mode & 2 != 0 {
        opts.webdataset.payload.push("bin".into());
    }
    if mode & 4 != 0 {
        opts.webdataset.label = None;
    }
    // Samples, keys and problems grow with the headers walked (one per 512 bytes at most);
    // names are bounded by the file; the window is 4 KiB.
    let budget = Budget::start("tar", bytes.len(), 16, 256 << 10);
    match Dataset::open_files(Format::WebDataset, &[path], &opts) {
        Ok(ds) => {
            for i in 0..ds.len() {
                let _ = ds.key(i); // every key is stored whole
            }
            check_dataset(&ds, 64)
        }
        Err(e) => {
            // The one error without a file: no member had the payload extension.
            if !e
                .message()
                .contains("no sample has a member with extension")
            {
                names_a_file(&e, "opening a tar");
            }
        }
    }
    budget.check();
});
