//! Trains an image classifier in Rust on images gpufeed decodes, with checkpoints that resume
//! exactly — the loop a trainer that links the crate writes (`examples/train_images.py` is the
//! same loop in Python).
//!
//! ```text
//! cargo run --release --example train_images -- DATA [--epochs 2] [--size 32] [--batch 64]
//!     [--checkpoint run.ckpt] [--save-every 10] [--stop-after N] [--log-ids FILE]
//! ```
//!
//! `DATA` is anything `Dataset::open` takes (an ImageFolder, packed shards of JPEGs, a
//! WebDataset…). The model is softmax regression over each image's 4×4 average-pooled pixels
//! (48 features): small enough to train on a laptop's CPU, a stand-in for the network a real
//! trainer runs on the batch tensor. What the example shows:
//!
//! - the loader and the image stage: torchvision's training transform, f32 NCHW, decoded by a
//!   pool of threads a few batches ahead of the step;
//! - a damaged image (truncated, corrupt) is named on stderr and left out of the step: its
//!   batch arrives with it zero-filled and reported in `batch.errors()`;
//! - a checkpoint holds the model and where the epoch stood (epoch, next batch): run again
//!   with the same `--checkpoint` after a crash (`--stop-after N` stops after N steps, as one
//!   would) and the run goes on with the batches it had not trained on, the same tensors an
//!   uninterrupted run gets (crops and flips are a function of seed, epoch and sample id);
//! - `--log-ids FILE` appends each step's sample ids (`EPOCH ID ID …` per line), so a test can
//!   check every sample was trained on exactly once across the interruption.

use std::io::Write;
use std::path::PathBuf;

use gpufeed::decode::{ImageBatch, ImageSpec};
use gpufeed::{Dataset, Loader};

const POOL: usize = 4;
const FEATURES: usize = 3 * POOL * POOL;

struct Args {
    data: PathBuf,
    epochs: u64,
    size: u32,
    batch: u32,
    checkpoint: Option<PathBuf>,
    save_every: u64,
    stop_after: Option<u64>,
    log_ids: Option<PathBuf>,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        data: PathBuf::new(),
        epochs: 2,
        size: 32,
        batch: 64,
        checkpoint: None,
        save_every: 10,
        stop_after: None,
        log_ids: None,
    };
    let mut data = None;
    while let Some(x) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{name} {v:?}: expected a whole number"))
        };
        match x.as_str() {
            "--epochs" => a.epochs = number("--epochs", value("--epochs")?)?,
            "--size" => a.size = number("--size", value("--size")?)? as u32,
            "--batch" => a.batch = number("--batch", value("--batch")?)? as u32,
            "--checkpoint" => a.checkpoint = Some(value("--checkpoint")?.into()),
            "--save-every" => a.save_every = number("--save-every", value("--save-every")?)?,
            "--stop-after" => a.stop_after = Some(number("--stop-after", value("--stop-after")?)?),
            "--log-ids" => a.log_ids = Some(value("--log-ids")?.into()),
            _ if x.starts_with("--") => return Err(format!("unknown option {x}")),
            _ => data = Some(PathBuf::from(x)),
        }
    }
    a.data = data.ok_or(
        "usage: train_images DATA [--epochs N] [--size S] [--batch B] \
                         [--checkpoint FILE] [--save-every N] [--stop-after N] [--log-ids FILE]",
    )?;
    Ok(a)
}

/// Softmax regression: `classes` × `FEATURES` weights and a bias per class.
struct Model {
    classes: usize,
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Model {
    fn new(classes: usize) -> Model {
        Model {
            classes,
            w: vec![0.0; classes * FEATURES],
            b: vec![0.0; classes],
        }
    }

    /// One SGD step on `(features, label)` pairs; the mean cross-entropy before it.
    fn step(&mut self, xs: &[([f32; FEATURES], usize)], lr: f32) -> f32 {
        let mut gw = vec![0.0f32; self.w.len()];
        let mut gb = vec![0.0f32; self.classes];
        let mut loss = 0.0;
        for (x, y) in xs {
            let logits: Vec<f32> = (0..self.classes)
                .map(|c| {
                    let row = &self.w[c * FEATURES..(c + 1) * FEATURES];
                    self.b[c] + row.iter().zip(x).map(|(w, v)| w * v).sum::<f32>()
                })
                .collect();
            let max = logits.iter().cloned().fold(f32::MIN, f32::max);
            let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            loss -= (exp[*y] / sum).ln();
            for c in 0..self.classes {
                let g = exp[c] / sum - if c == *y { 1.0 } else { 0.0 };
                gb[c] += g;
                for (k, v) in x.iter().enumerate() {
                    gw[c * FEATURES + k] += g * v;
                }
            }
        }
        let n = xs.len().max(1) as f32;
        for (w, g) in self.w.iter_mut().zip(&gw) {
            *w -= lr * g / n;
        }
        for (b, g) in self.b.iter_mut().zip(&gb) {
            *b -= lr * g / n;
        }
        loss / n
    }
}

/// Sample `i`'s features: its NCHW image averaged over a 4×4 grid of cells.
fn features(batch: &ImageBatch, i: usize) -> [f32; FEATURES] {
    let [_, c, h, w] = batch.shape();
    let x: &[f32] = batch.view().expect("f32 images");
    let img = &x[i * c * h * w..(i + 1) * c * h * w];
    let mut f = [0.0f32; FEATURES];
    for ch in 0..c {
        for y in 0..h {
            for xx in 0..w {
                let cell = ch * POOL * POOL + (y * POOL / h) * POOL + xx * POOL / w;
                f[cell] += img[(ch * h + y) * w + xx];
            }
        }
    }
    let per_cell = (h / POOL).max(1) * (w / POOL).max(1);
    f.iter_mut().for_each(|v| *v /= per_cell as f32);
    f
}

/// The checkpoint: where the run stood (the epoch and its next batch), then the model.
fn save(path: &PathBuf, epoch: u64, next: u32, m: &Model) -> std::io::Result<()> {
    let mut text = format!("{epoch} {next} {}\n", m.classes);
    for v in m.w.iter().chain(&m.b) {
        text.push_str(&format!("{v:e}\n"));
    }
    // Written whole, then renamed over the last one: a crash mid-write keeps the previous.
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn load(path: &PathBuf) -> Result<Option<(u64, u32, Model)>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let bad = || format!("{}: not a checkpoint of this example", path.display());
    let mut lines = text.lines();
    let head: Vec<u64> = lines
        .next()
        .ok_or_else(bad)?
        .split(' ')
        .map(|v| v.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [epoch, next, classes] = head[..] else {
        return Err(bad());
    };
    let mut m = Model::new(classes as usize);
    let values: Vec<f32> = lines
        .map(|l| l.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if values.len() != m.w.len() + m.b.len() {
        return Err(bad());
    }
    let (w, b) = values.split_at(m.w.len());
    m.w.copy_from_slice(w);
    m.b.copy_from_slice(b);
    Ok(Some((epoch, next as u32, m)))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    let dataset = Dataset::open(&a.data)?;
    let classes = dataset.classes().len().max(2);
    let loader = Loader::builder(dataset)
        .batch_size(a.batch)
        .seed(7)
        .build()?;
    let images = loader.decode_images(ImageSpec::train(a.size))?;
    let (mut start, mut from, mut model) = match &a.checkpoint {
        Some(p) => load(p)?.unwrap_or((0, 0, Model::new(classes))),
        None => (0, 0, Model::new(classes)),
    };
    if model.classes != classes {
        return Err(format!(
            "the checkpoint is of a model of {} classes, the dataset has {classes}",
            model.classes
        )
        .into());
    }
    if from > 0 {
        eprintln!("resuming epoch {start} at batch {from}");
    }
    let mut log = match &a.log_ids {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        ),
        None => None,
    };
    let mut steps = 0u64;
    while start < a.epochs {
        let epoch = start;
        let (mut loss_sum, mut n) = (0.0f64, 0u64);
        for batch in images.epoch_from(epoch, from)? {
            let batch = batch?;
            // A damaged image is named and left out of the step; padding is never trained on.
            for (_, e) in batch.errors() {
                eprintln!("skipped: {e}");
            }
            let xs: Vec<([f32; FEATURES], usize)> = (0..batch.len())
                .filter(|&i| batch.error(i).is_none() && !batch.is_padding(i))
                .map(|i| {
                    (
                        features(&batch, i),
                        batch.labels()[i].max(0) as usize % classes,
                    )
                })
                .collect();
            loss_sum += model.step(&xs, 0.05) as f64 * xs.len() as f64;
            n += xs.len() as u64;
            if let Some(f) = &mut log {
                let ids: Vec<String> = (0..batch.len())
                    .filter(|&i| batch.error(i).is_none() && !batch.is_padding(i))
                    .map(|i| batch.sample_ids()[i].to_string())
                    .collect();
                writeln!(f, "{epoch} {}", ids.join(" "))?;
            }
            steps += 1;
            let next = batch.index() + 1;
            if let Some(p) = &a.checkpoint {
                if steps.is_multiple_of(a.save_every) {
                    save(p, epoch, next, &model)?;
                }
            }
            if a.stop_after == Some(steps) {
                if let Some(p) = &a.checkpoint {
                    save(p, epoch, next, &model)?;
                }
                eprintln!("stopped after {steps} steps (epoch {epoch}, next batch {next})");
                return Ok(());
            }
        }
        println!(
            "epoch {epoch}: mean loss {:.4} over {n} images",
            loss_sum / n.max(1) as f64
        );
        start += 1;
        from = 0;
        if let Some(p) = &a.checkpoint {
            save(p, start, 0, &model)?;
        }
    }
    Ok(())
}
