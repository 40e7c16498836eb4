//! The consumer's side of an epoch: groups arrive out of order, batches leave in order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use crate::batch::{Batch, Memory, SampleSpan};
use crate::dataset::Dataset;
use crate::error::{Error, ErrorKind, Result};

use super::worker::{check_spans, index_labels, GroupDone, Msg, Retired, Service};
use super::{BatchTiming, LoaderStats, StallStats};

/// A group's timeline, kept with each of its batches until handed out.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupTimes {
    read_done: Instant,
    copy_done: Option<Instant>,
    arrived: Instant,
    read_s: f64,
    copy_s: f64,
}

/// The batches of one epoch, in order. Dropping it stops the I/O thread (batches already
/// handed out stay valid).
pub struct Epoch {
    pub(super) epoch: u64,
    pub(super) dataset: Arc<Dataset>,
    pub(super) verify: bool,
    pub(super) rx: Option<Receiver<Msg>>,
    /// Keeps the loader's I/O thread alive while this epoch is read.
    pub(super) service: Option<Arc<Service>>,
    pub(super) retired: Arc<Retired>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) next: u32,
    pub(super) batches: u32,
    pub(super) batch_size: usize,
    /// Positions of the rank's order from here on are padding.
    pub(super) padding_from: usize,
    /// Batches received, by index: groups complete out of order, batches leave in order.
    /// With each: whether its samples' frames and checksums are still to be checked (host
    /// batches are checked one at a time as they are handed out, so a group's check is not
    /// one long wait before its first batch).
    pub(super) queue: std::collections::BTreeMap<u32, (Batch, bool, GroupTimes)>,
    /// The I/O thread's CPU seconds at the first and the latest group of this epoch.
    pub(super) io_cpu: Option<(f64, f64)>,
    pub(super) stats: LoaderStats,
    pub(super) failed: bool,
}

impl Epoch {
    /// Batches in this epoch (from batch 0).
    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// Figures so far.
    pub fn stats(&self) -> &LoaderStats {
        &self.stats
    }

    fn take_group(&mut self, g: GroupDone) {
        let GroupDone { meta: mut g, mem } = g;
        let arrived = Instant::now();
        let times = GroupTimes {
            read_done: g.read_done,
            copy_done: g.copy_done,
            arrived,
            read_s: (g.read_done - g.submitted).as_secs_f64(),
            copy_s: g.copy_done.map_or(0.0, |c| (c - g.read_done).as_secs_f64()),
        };
        let first = self.io_cpu.map_or(g.io_cpu_s, |(f, _)| f);
        self.io_cpu = Some((first, g.io_cpu_s));
        self.stats.io_thread_cpu_s = g.io_cpu_s - first;
        // Checksums and frames are checked on the consumer's thread, batch by batch in
        // `next`: on the I/O thread they would keep it from reaping and resubmitting, and the
        // device queue would run dry. (Device groups were checked before their copy.)
        let unchecked = matches!(mem, Memory::Host(_));
        // Labels are looked up here, on the consumer's thread, unless a check already found the
        // data's own.
        if g.labels.is_empty() {
            g.labels.extend(index_labels(&self.dataset, &g.ids));
        }
        // Batches are full but for the epoch's last, which ends its group.
        let b = self.batch_size;
        self.stats.reads += g.reads;
        self.stats.bytes_read += g.bytes_read;
        let mut ids = g.ids.into_iter();
        let mut spans = g.spans.into_iter();
        let mut labels = g.labels.into_iter();
        for index in g.batches {
            let bids: Vec<u32> = ids.by_ref().take(b).collect();
            let bspans: Vec<SampleSpan> = spans.by_ref().take(b).collect();
            let blabels: Vec<i64> = labels.by_ref().take(b).collect();
            if index < self.next {
                continue; // resuming: batches before the start point are not handed out
            }
            let padding_from = self
                .padding_from
                .saturating_sub(index as usize * b)
                .min(bids.len());
            self.queue.insert(
                index,
                (
                    Batch {
                        epoch: self.epoch,
                        index,
                        labels: blabels,
                        padding_from,
                        ids: bids,
                        spans: bspans,
                        mem: mem.clone(),
                        timing: BatchTiming::default(),
                    },
                    unchecked,
                    times,
                ),
            );
        }
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.failed || self.next >= self.batches {
            return None;
        }
        let t0 = Instant::now();
        let c0 = crate::sys::thread_cpu_seconds();
        while !self.queue.contains_key(&self.next) {
            let msg = self.rx.as_ref()?.recv();
            match msg {
                Ok(Msg::Group(g)) => self.take_group(g),
                Ok(Msg::Engine(name)) => self.stats.engine = name,
                Ok(Msg::Failed(e)) => {
                    self.failed = true;
                    return Some(Err(e));
                }
                Err(_) => {
                    self.failed = true;
                    return Some(Err(Error::new(
                        ErrorKind::Io,
                        "the I/O thread ended before the epoch was complete",
                    )));
                }
            }
        }
        let t1 = Instant::now();
        self.stats.consumer_wait_s += (t1 - t0).as_secs_f64();
        let (mut batch, unchecked, times) = self.queue.remove(&self.next).expect("batch is queued");
        if let (true, Memory::Host(region)) = (unchecked, &batch.mem) {
            check_spans(
                &self.dataset,
                region.bytes(),
                &batch.ids,
                &mut batch.spans,
                &mut batch.labels,
                self.verify,
            );
        }
        let verify_s = t1.elapsed().as_secs_f64();
        let stall = StallStats::of_wait(t0, t1, times.read_done, times.copy_done, verify_s);
        self.stats.stall.add(&stall);
        self.stats.consumer_cpu_s += crate::sys::thread_cpu_seconds() - c0;
        batch.timing = BatchTiming {
            stall,
            read_s: times.read_s,
            copy_s: times.copy_s,
            queue_s: (t1.max(times.arrived) - times.arrived).as_secs_f64(),
        };
        self.next = batch.index + 1;
        self.stats.batches += 1;
        self.stats.samples += batch.len() as u64;
        self.stats.padding += batch.padding_count() as u64;
        self.stats.sample_errors += batch.errors().count() as u64;
        self.stats.bytes_delivered += batch.bytes();
        Some(Ok(batch))
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver makes the worker's next send fail; queued groups return their
        // slots as they drop.
        self.queue.clear();
        self.rx = None;
        // Until none of this epoch's reads or copies is in flight (they finish and are
        // discarded), so its slots and regions are back when this returns.
        self.retired.wait();
        self.service = None;
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("epoch", &self.epoch)
            .field("next", &self.next)
            .field("batches", &self.batches)
            .finish()
    }
}
