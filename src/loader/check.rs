//! The epoch's checker: a thread between the I/O thread and the consumer that checks each host
//! group's frames and checksums as it arrives, so the checks run while the consumer is busy
//! with earlier batches (its training step) instead of on its thread when it asks for the
//! next one. The I/O thread never checks host groups: a group's checks (10 ms for 75 MB) there
//! would hold up reaping and resubmitting, and the device queue would run dry.
//!
//! It forwards every message in order; device groups (checked before their copy) and the rest
//! pass through. It ends when the I/O thread is done with the epoch (its sender dropped) or the
//! epoch is dropped (the next send fails); the groups it holds then drop and give their
//! buffers back, and the epoch's drop joins it, so every buffer is back when that returns.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::batch::Memory;
use crate::dataset::Dataset;
use crate::error::{Error, ErrorKind, Result};

use super::worker::Msg;

/// Starts the checker for one epoch: it takes the I/O thread's messages from `from` and hands
/// them on, host groups checked, through the receiver it returns (of `capacity`).
pub(super) fn start(
    dataset: Arc<Dataset>,
    verify: bool,
    from: Receiver<Msg>,
    capacity: usize,
) -> Result<(Receiver<Msg>, JoinHandle<()>)> {
    let (tx, rx) = sync_channel(capacity);
    let thread = std::thread::Builder::new()
        .name("gpufeed-check".into())
        .spawn(move || {
            let cpu0 = crate::sys::thread_cpu_seconds();
            for msg in from {
                let msg = match msg {
                    Msg::Group(mut g) => {
                        if let Memory::Host(region) = &g.mem {
                            let t = Instant::now();
                            let m = &mut g.meta;
                            dataset.check_spans(
                                region.bytes(),
                                &m.ids,
                                &mut m.spans,
                                &mut m.labels,
                                verify,
                            );
                            m.checked = Some((t, Instant::now()));
                            m.check_cpu_s = crate::sys::thread_cpu_seconds() - cpu0;
                        }
                        Msg::Group(g)
                    }
                    other => other,
                };
                if tx.send(msg).is_err() {
                    return; // the epoch is gone
                }
            }
        })
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("cannot start the loader's checker thread: {e}"),
            )
        })?;
    Ok((rx, thread))
}
