//! The image loader: a [`Loader`] whose batches go through the decode pool, and the feeder
//! thread that hands each host batch to the pool as the loader delivers it.

use super::pool::{Job, JobState, Pool, PoolHandle, Target, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex};

use super::device::{DeviceStage, RouteCounts};
use super::ImageSpec;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::loader::{Checker, Epoch, Loader, LoaderStats, StallStats, Taker};
use crate::util::Unpoison;

use super::device::DeviceOut;
use super::epoch::ImageEpoch;
use super::phases::Phase;

/// A [`Loader`] whose batches are decoded into image tensors ([`Loader::decode_images`]).
/// Clones share the loader and the decode threads.
#[derive(Clone)]
pub struct ImageLoader {
    pub(super) loader: Loader,
    pub(super) spec: Arc<ImageSpec>,
    pub(super) pool: Arc<PoolHandle>,
    /// The device side, for a loader whose batches are in device memory.
    pub(super) device: Option<Arc<DeviceStage>>,
}

impl std::fmt::Debug for ImageLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageLoader")
            .field("spec", &self.spec)
            .field("threads", &self.pool.threads.len())
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// This loader's batches decoded and transformed by `spec`, on the loader's device: on the
    /// host, by the CPU stage into host tensors; on a device (CUDA or simulated), by the device
    /// pipeline — checksums by the crc32c kernel over the group in device memory, each image
    /// decoded whole, then one resize launch per batch into an output tensor from a pool made
    /// here, with a ready event — whose tensors equal the CPU stage's with `dct_scaling` off
    /// within the kernel's tolerance. Starts the decode threads.
    ///
    /// Images go to the GPU's JPEG engines (nvJPEG's batched decode, bitstreams read in device
    /// memory) or, for what those refuse, to the CPU ([`ImageLoader::routes`] counts them); on
    /// the simulated device the engines' stand-in is libjpeg-turbo. The CUDA side has not run
    /// on a GPU yet.
    pub fn decode_images(&self, spec: ImageSpec) -> Result<ImageLoader> {
        spec.validate()?;
        if self.is_device() {
            // The device pipeline routes by the image records: read now, once, for a format
            // that does not carry them (a progress line on a large folder).
            self.dataset().image_info()?;
        }
        let device = match self.device_pool() {
            None => None,
            Some(p) => Some(Arc::new(DeviceStage::new(
                p,
                &spec,
                self.plan_config().batch_size as usize,
                // The batches decoded ahead, the one being handed out, and two held by the
                // consumer.
                spec.prefetch_batches + 3,
            )?)),
        };
        let spec = Arc::new(spec);
        Ok(ImageLoader {
            loader: self.clone(),
            pool: Arc::new(Pool::start(&spec)?),
            spec,
            device,
        })
    }
}

impl ImageLoader {
    /// The underlying loader.
    pub fn loader(&self) -> &Loader {
        &self.loader
    }

    /// The spec in effect.
    pub fn spec(&self) -> &ImageSpec {
        &self.spec
    }

    /// Decode threads.
    pub fn threads(&self) -> usize {
        self.pool.threads.len()
    }

    /// The memory this loader holds: the reading's ([`Loader::memory`]) and its decoded
    /// batches ([`MemoryStats::decode_bytes`](crate::MemoryStats::decode_bytes), as now).
    pub fn memory(&self) -> crate::MemoryStats {
        crate::MemoryStats {
            decode_bytes: decode_bytes(&self.pool.tensor_bytes, self.device.as_deref()),
            ..self.loader.memory()
        }
    }

    /// Whether image batches are in device memory.
    pub fn is_device(&self) -> bool {
        self.device.is_some()
    }

    /// Device path: images by decoder route since this loader was made (`None` on the host).
    pub fn routes(&self) -> Option<RouteCounts> {
        self.device.as_ref().map(|d| d.counters.snapshot())
    }

    /// Device path, for tests: the most bytes of decoded images one staging buffer holds
    /// (256 MiB by default); a batch whose images need more is decoded in chunks, sample by
    /// sample, instead of as a pipeline.
    #[doc(hidden)]
    pub fn set_staging_max(&self, bytes: usize) {
        if let Some(d) = &self.device {
            d.set_staging_max(bytes);
        }
    }

    /// Device path: (free, total) output tensors of the pool made with this loader (`None` on
    /// the host). All are free when no batch is held and no epoch is running.
    pub fn output_tensors(&self) -> Option<(usize, usize)> {
        self.device
            .as_ref()
            .map(|d| (d.outputs.free_regions(), d.outputs.regions()))
    }

    /// The image batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: u64) -> Result<ImageEpoch> {
        self.epoch_from(epoch, 0)
    }

    /// The image batches of `epoch` from batch `start` (resuming): the same tensors an
    /// uninterrupted epoch gives from there.
    pub fn epoch_from(&self, epoch: u64, start: u32) -> Result<ImageEpoch> {
        Ok(self.decode_epoch(self.read_epoch(epoch, &[], start)?))
    }

    /// The image batches of what is left of `epoch` after it stopped at `stops` on other rank
    /// counts, from batch `start` of it ([`Loader::epoch_resumed`]).
    pub fn epoch_resumed(
        &self,
        epoch: u64,
        stops: &[crate::plan::Stop],
        start: u32,
    ) -> Result<ImageEpoch> {
        Ok(self.decode_epoch(self.read_epoch(epoch, stops, start)?))
    }

    /// The underlying loader's epoch for [`decode_epoch`](Self::decode_epoch), from batch
    /// `start`, with the checksums of unframed samples left to this stage: on the device path
    /// the crc32c kernel verifies them; on the host each decode thread, just before it decodes
    /// the sample (its bytes then come through the cache once, for both). An epoch asked of the
    /// loader directly is verified by it instead.
    pub fn read_epoch(&self, epoch: u64, stops: &[crate::plan::Stop], start: u32) -> Result<Epoch> {
        let taker = match self.device {
            Some(_) => Taker::Device,
            None => Taker::DecodeThreads,
        };
        self.loader.epoch_checked(epoch, stops, start, taker)
    }

    /// Decodes an epoch already asked of the underlying loader (one asked ahead, say).
    pub fn decode_epoch(&self, mut inner: Epoch) -> ImageEpoch {
        let batches = inner.batches();
        // The caller's time limit applies to its own waits for decoded batches; the feeder
        // waits for the reading as long as it takes (its pace is the consumer's).
        let timeout = inner.take_timeout();
        let holders = inner.holders().clone();
        let (epoch, next) = (inner.epoch(), inner.position());
        let shared = Arc::new(Feed {
            cancelled: Arc::new(AtomicBool::new(false)),
            stats: Mutex::new(LoaderStats::default()),
        });
        let (tx, rx) = sync_channel(self.spec.prefetch_batches);
        let feeder = {
            let (spec, pool, shared) = (self.spec.clone(), self.pool.clone(), shared.clone());
            let dataset = self.loader.dataset().clone();
            let seed = self.loader.plan_config().seed;
            let device = self.device.clone();
            let checker = inner.checker();
            std::thread::Builder::new()
                .name("gpufeed-decode-feed".into())
                .spawn(move || {
                    let ctx = FeedCtx {
                        spec: &spec,
                        pool: &pool,
                        shared: &shared,
                        dataset,
                        seed,
                        device,
                        checker,
                    };
                    feed(inner, tx, &ctx)
                })
        };
        let (rx, feeder) = match feeder {
            Ok(h) => (Some(rx), Some(h)),
            Err(e) => {
                // No thread: the epoch yields this error and ends.
                let (tx2, rx2) = sync_channel(1);
                let _ = tx2.send(Err(Error::io("cannot start the decode feeder thread", e)));
                (Some(rx2), None)
            }
        };
        ImageEpoch {
            rx,
            feeder,
            shared,
            spec: self.spec.clone(),
            batches,
            stats: LoaderStats {
                memory: self.memory(),
                ..LoaderStats::default()
            },
            tensor_bytes: self.pool.tensor_bytes.clone(),
            device_stage: self.device.clone(),
            phases_from: self
                .device
                .as_ref()
                .map(|d| Box::new((d.clock.snapshot(), d.counters.snapshot()))),
            read_seen: StallStats::default(),
            timeout,
            door: self.loader.front_door(),
            holders,
            threads: self.pool.threads.len(),
            epoch,
            next,
            waiting_since: None,
            current: None,
        }
    }
}

/// The image stage's decoded batches' bytes now: host tensors alive, or the device's pool of
/// output tensors.
pub(super) fn decode_bytes(tensors: &AtomicU64, device: Option<&DeviceStage>) -> u64 {
    tensors.load(Ordering::Relaxed)
        + device.map_or(0, |d| {
            (d.outputs.regions() * d.outputs.region_bytes()) as u64
        })
}

/// What the feeder thread shares with its epoch.
pub(super) struct Feed {
    pub(super) cancelled: Arc<AtomicBool>,
    /// The reading's figures, after the latest host batch.
    pub(super) stats: Mutex<LoaderStats>,
}

/// The feeder: takes the epoch's host batches in order, queues each as a decode job and hands
/// it to the consumer through `tx` (bounded: `prefetch_batches` jobs ahead). Ends at the epoch's
/// end, on an error (sent), or when the consumer is gone; dropping `inner` then waits for its
/// reads.
struct FeedCtx<'a> {
    pub(super) spec: &'a Arc<ImageSpec>,
    pub(super) pool: &'a PoolHandle,
    pub(super) shared: &'a Feed,
    pub(super) dataset: Arc<Dataset>,
    pub(super) seed: u64,
    pub(super) device: Option<Arc<DeviceStage>>,
    /// Who checks the epoch's samples: the decode threads ([`Job::verify_here`]) or the
    /// device's crc32c kernel, where the loader left the checksums to this stage.
    checker: Checker,
}

fn feed(mut inner: Epoch, tx: SyncSender<Result<Arc<Job>>>, ctx: &FeedCtx<'_>) {
    let FeedCtx {
        spec,
        pool,
        shared,
        ref dataset,
        seed,
        ref device,
        checker,
    } = *ctx;
    let verify_here = checker.decode_threads_verify();
    loop {
        let next = inner.next_patiently();
        *shared.stats.lock().unpoisoned() = inner.stats().clone();
        let job = match next {
            None => return,
            Some(Err(e)) => {
                let _ = tx.send(Err(e));
                return;
            }
            Some(Ok(batch)) => {
                let bytes = batch.len() * spec.sample_elems() * spec.dtype.size();
                let target = match device {
                    None => {
                        Tensor::new(bytes, &pool.tensor_bytes).map(|t| Target::Host(Arc::new(t)))
                    }
                    Some(stage) => {
                        // Flat memory: a tensor of the pool, waiting while the consumer holds
                        // them all; the checksums by the device's crc32c over the group.
                        let taken = stage.clock.time(Phase::Region, || {
                            stage.outputs.take_waiting(&shared.cancelled)
                        });
                        let Some(r) = taken else {
                            return;
                        };
                        let tensor = stage.outputs.region(r, bytes);
                        let crc = stage.clock.time(Phase::Crc, || {
                            stage.check_crcs(&batch, dataset, r, checker.device_verifies())
                        });
                        let records = dataset.image_info().ok();
                        let host = stage
                            .clock
                            .time(Phase::Gather, || stage.host_bytes(&batch, records, &crc));
                        Ok(Target::Device(Arc::new(DeviceOut {
                            tensor,
                            stage: stage.clone(),
                            crc,
                            host: Mutex::new(host.head),
                            tails: host.tail,
                            decoded: Mutex::new((0..batch.len()).map(|_| None).collect()),
                            lead: std::sync::OnceLock::new(),
                        })))
                    }
                };
                target.map(|target| {
                    Arc::new(Job {
                        batch,
                        target,
                        spec: spec.clone(),
                        dataset: dataset.clone(),
                        seed,
                        next: AtomicUsize::new(0),
                        cancelled: shared.cancelled.clone(),
                        verify_here,
                        state: Mutex::new(JobState::default()),
                        finished: Condvar::new(),
                    })
                })
            }
        };
        if let Ok(j) = &job {
            pool.pool.submit(j.clone());
        }
        let failed = job.is_err();
        if tx.send(job).is_err() || failed {
            return;
        }
    }
}
