//! The engine logic under the seeded simulator: faults, reordering, cancellation races.

use gpufeed::testing::sim::{Rng, SimBackend, SimConfig};
use gpufeed::{Engine, EngineConfig, EngineKind, ErrorKind, ReadSpec};

use crate::common::*;

fn sim_engine(sim: SimConfig, kind: EngineKind, slots: u32) -> Engine {
    let cfg = EngineConfig {
        slots,
        slot_bytes: 256 << 10,
        huge_pages: false,
        honor_env: false,
        ..EngineConfig::default()
    };
    Engine::with_backend(Box::new(SimBackend::new(sim)), kind, &cfg).unwrap()
}

/// Random one- and multi-read jobs over a pattern file, every fault on, many seeds: successful
/// reads equal the file, failed ones say which file and offset, and every slot comes back.
#[test]
fn faulty_simulator_many_seeds() {
    let dir = disk_dir();
    let size = (2 << 20) + 4321;
    let path = pattern_file(dir.path(), "sim.bin", size);
    let mut total_errors = 0;
    let mut total_short = 0;
    let mut total_retries = 0;
    for seed in 0..300u64 {
        let kind = if seed % 3 == 0 {
            EngineKind::UringBuffered
        } else {
            EngineKind::Uring
        };
        let mut engine = sim_engine(SimConfig::faulty(seed), kind, 12);
        let file = engine.open(&path).unwrap();
        let align = engine.file_info(file).unwrap().mem_align as usize;
        let mut rng = Rng::new(seed ^ 0xABCD);
        let mut expected = std::collections::HashMap::new();
        let mut jobs_left = 60;
        while jobs_left > 0 || engine.in_flight() > 0 {
            while jobs_left > 0 {
                let Some(slot) = engine.arena().take() else {
                    break;
                };
                let n = 1 + rng.below(4) as usize;
                let mut specs = Vec::new();
                let mut pos = 0;
                for _ in 0..n {
                    let offset = rng.below(size + 1000);
                    let len = rng.below(40_000) as u32;
                    let (_, span) = engine.placement(file, offset, len).unwrap();
                    specs.push(ReadSpec {
                        file,
                        offset,
                        len,
                        buf_offset: pos,
                    });
                    pos = (pos + span).next_multiple_of(align);
                }
                expected.insert(jobs_left as u64, specs.clone());
                engine.submit(slot, &specs, jobs_left as u64).unwrap();
                jobs_left -= 1;
            }
            engine.wait(1).unwrap();
            while let Some(c) = engine.pop() {
                let specs = &expected[&c.user_data];
                assert_eq!(c.outcomes().len(), specs.len());
                for (o, s) in c.outcomes().iter().zip(specs) {
                    match o {
                        Ok(r) => {
                            let want = (s.offset + s.len as u64).min(size).saturating_sub(s.offset);
                            assert_eq!(r.len() as u64, want, "seed {seed}: length of {s:?}");
                            assert_pattern(
                                &engine.arena().bytes(&c.slot)[r.clone()],
                                s.offset,
                                &format!("seed {seed}"),
                            );
                        }
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::Io, "seed {seed}: {e}");
                            assert_eq!(e.path(), Some(path.as_path()));
                            assert_eq!(e.offset(), Some(s.offset));
                            total_errors += 1;
                        }
                    }
                }
                engine.arena().put(c.slot);
            }
        }
        assert_eq!(
            engine.arena().free_slots(),
            12,
            "seed {seed}: a slot was not returned"
        );
        total_short += engine.stats().short_reads;
        total_retries += engine.stats().retries;
    }
    // The faults really happened.
    assert!(
        total_errors > 50 && total_short > 500 && total_retries > 500,
        "errors {total_errors}, short {total_short}, retries {total_retries}"
    );
}

/// Dropping an engine mid-flight under the simulator: cancellation races resolve, every slot
/// the engine held returns to the arena, and the simulator never sees a read after the drop
/// (its Drop asserts that nothing is left in flight).
#[test]
fn cancellation_races_return_every_slot() {
    let dir = disk_dir();
    let size = 1 << 20;
    let path = pattern_file(dir.path(), "sim.bin", size);
    let mut cancelled = 0;
    for seed in 0..500u64 {
        let mut sim = SimConfig::faulty(seed);
        sim.capacity = 1 + (seed % 8) as usize;
        let mut engine = sim_engine(sim, EngineKind::Uring, 10);
        let file = engine.open(&path).unwrap();
        let mut rng = Rng::new(seed);
        let mut offsets = Vec::new();
        for j in 0..10 {
            let slot = engine.arena().take().unwrap();
            let offset = rng.below(size);
            offsets.push(offset);
            engine
                .submit_one(
                    slot,
                    ReadSpec {
                        file,
                        offset,
                        len: 30_000,
                        buf_offset: 0,
                    },
                    j,
                )
                .unwrap();
        }
        if seed % 2 == 0 {
            engine.flush().unwrap();
        }
        let arena = engine.arena().clone();
        if seed % 3 == 0 {
            // Cancel explicitly and look at the outcomes.
            engine.cancel_all().unwrap();
            let mut n = 0;
            while let Some(c) = engine.pop() {
                if let Err(e) = c.outcome() {
                    assert!(
                        matches!(e.kind(), ErrorKind::Cancelled | ErrorKind::Io),
                        "{e}"
                    );
                    if e.kind() == ErrorKind::Cancelled {
                        cancelled += 1;
                        assert_eq!(e.path(), Some(path.as_path()));
                    }
                } else {
                    // A read that won the race against its cancellation is whole and correct.
                    let r = c.outcome().as_ref().unwrap().clone();
                    let off = offsets[c.user_data as usize];
                    assert_eq!(r.len() as u64, 30_000.min(size - off));
                    assert_pattern(&arena.bytes(&c.slot)[r], off, "race winner");
                }
                arena.put(c.slot);
                n += 1;
            }
            assert_eq!(n, 10);
        }
        drop(engine);
        assert_eq!(arena.free_slots(), 10, "seed {seed}");
    }
    assert!(
        cancelled > 100,
        "cancellation never won a race ({cancelled})"
    );
}

/// A file that shrinks while reads are in flight: the simulator serves reads late, after the
/// truncation, so reads past the new end fail with UnexpectedEof and the others are delivered.
#[test]
fn file_shrinks_while_reads_are_in_flight() {
    let dir = disk_dir();
    let size = 2u64 << 20;
    let path = pattern_file(dir.path(), "sim.bin", size);
    let mut sim = SimConfig::clean(1);
    sim.capacity = 64;
    sim.delay_rounds_max = 8;
    let mut engine = sim_engine(sim, EngineKind::Uring, 64);
    let file = engine.open(&path).unwrap();
    for j in 0..64u64 {
        let slot = engine.arena().take().unwrap();
        engine
            .submit_one(
                slot,
                ReadSpec {
                    file,
                    offset: j * 32768 + 5,
                    len: 30000,
                    buf_offset: 0,
                },
                j,
            )
            .unwrap();
    }
    engine.flush().unwrap(); // in the simulator now, mostly not yet served
    let cut = 1u64 << 20;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let mut ok = 0;
    let mut eof = 0;
    while engine.in_flight() > 0 {
        engine.wait(1).unwrap();
        while let Some(c) = engine.pop() {
            let off = c.user_data * 32768 + 5;
            match c.outcome() {
                Ok(r) => {
                    assert_pattern(&engine.arena().bytes(&c.slot)[r.clone()], off, "shrink");
                    assert_eq!(r.len(), 30000);
                    ok += 1;
                }
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{e}");
                    assert!(off + 30000 > cut);
                    assert_eq!(e.offset(), Some(off));
                    eof += 1;
                }
            }
            engine.arena().put(c.slot);
        }
    }
    assert_eq!(ok + eof, 64);
    // 32 reads lie before the cut and must all succeed; of the 32 past it, those the simulator
    // served before the truncation succeed too, the rest fail.
    assert!(ok >= 32 && eof >= 16, "ok {ok}, eof {eof}");
}

/// The simulator enforces O_DIRECT alignment like the kernel: the engine's widening must make
/// every raw read aligned, including odd offsets and lengths.
#[test]
fn widening_satisfies_direct_alignment() {
    let dir = disk_dir();
    let size = 1_000_003;
    let path = pattern_file(dir.path(), "sim.bin", size);
    // Enforce exactly what statx reports for this file system.
    let align = {
        let mut probe = Engine::new(config(EngineKind::Uring, 1, 4096)).unwrap();
        let f = probe.open(&path).unwrap();
        probe.file_info(f).unwrap().offset_align
    };
    let mut sim = SimConfig::clean(9);
    sim.direct_align = align;
    let mut engine = sim_engine(sim, EngineKind::Uring, 8);
    let file = engine.open(&path).unwrap();
    assert!(engine.file_info(file).unwrap().direct);
    let mut rng = Rng::new(4);
    let reqs: Vec<(u64, u32)> = (0..500)
        .map(|_| (rng.below(size), rng.below(100_000) as u32 + 1))
        .collect();
    for (&(off, len), r) in reqs.iter().zip(read_all(&mut engine, file, &reqs)) {
        let b = r.unwrap_or_else(|e| panic!("{off}+{len}: {e}"));
        assert_pattern(&b, off, "aligned");
    }
}
