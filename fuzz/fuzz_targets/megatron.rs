//! Megatron-LM's indexed dataset reader (`PREFIX.idx` + `PREFIX.bin`): header, the sizes,
//! pointers and document arrays, sequences against the `.bin`, windows over it; and flat token
//! files' window arithmetic.
//!
//! Input: a mode byte (bit 0 writes the magic and version 1, so mutations reach the arrays;
//! bit 1 asks for windows, `seq_len` = byte 1 and `stride` = byte 2, zero included; bit 2 asks
//! for a dtype, u16 or u32 by bit 3), two bytes of `.bin` size (LE, a sparse file), then the
//! `.idx`.
#![no_main]
use gpufeed::dataset::TokenType;
use gpufeed::dataset::{Dataset, Format, OpenOptions};
use gpufeed_fuzz::{check_dataset, file, names_a_file, scratch, Budget, Counting};

#[global_allocator]
static A: Counting = Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let (mode, seq, stride) = (data[0], data[1], data[2]);
    let bin_size = u16::from_le_bytes([data[3], data[4]]) as u64;
    let mut idx = data[5..].to_vec();
    if mode & 1 != 0 && idx.len() >= 17 {
        idx[..9].copy_from_slice(b"MMIDIDX\0\0");
        idx[9..17].copy_from_slice(&1u64.to_le_bytes());
    }
    let prefix = scratch().join("m");
    file("m.idx", &idx);
    let bin = file("m.bin", &[]);
    std::fs::File::options()
        .write(true)
        .open(&bin)
        .and_then(|f| f.set_len(bin_size))
        .expect("size the .bin");
    let mut opts = OpenOptions::default();
    if mode & 2 != 0 {
        opts.tokens.seq_len = Some(seq as u32);
        opts.tokens.stride = Some(stride as u32);
    }
    if mode & 4 != 0 {
        opts.tokens.dtype = Some(if mode & 8 != 0 {
            TokenType::U32
        } else {
            TokenType::U16
        });
    }
    // Arrays are read whole (bounded by the .idx); one 32-byte `Sample` per 12-byte sequence
    // or per window (at most one per token of the .bin).
    let budget = Budget::start("megatron", idx.len() + bin_size as usize, 48, 256 << 10);
    // Windows of 0 tokens, or 0 apart, are the options' fault, not a file's: refused as such.
    let bad_options = mode & 2 != 0 && (seq == 0 || stride == 0);
    let option_error = |e: &gpufeed::Error| {
        assert!(e.message().contains("must be at least 1"), "{e}");
    };
    match Dataset::open_files(Format::Megatron, &[prefix], &opts) {
        Ok(ds) => {
            assert!(!bad_options, "seq_len {seq} stride {stride} accepted");
            check_dataset(&ds, 64)
        }
        Err(e) if bad_options => option_error(&e),
        Err(e) => names_a_file(&e, "opening a Megatron dataset"),
    }
    budget.check();
    // The same .bin as a flat token file: only the window arithmetic is parsed.
    let budget = Budget::start("tokens", bin_size as usize, 48, 64 << 10);
    match Dataset::open_files(Format::Tokens, &[bin], &opts) {
        Ok(ds) => {
            assert!(!bad_options, "seq_len {seq} stride {stride} accepted");
            check_dataset(&ds, 8)
        }
        Err(e) if bad_options => option_error(&e),
        Err(e) => names_a_file(&e, "opening a token file"),
    }
    budget.check();
});
