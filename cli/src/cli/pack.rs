//! `gpufeed pack`.

use super::*;

#[derive(Debug, Args)]
pub(super) struct PackArgs {
    /// The dataset to pack: an ImageFolder directory, WebDataset tars, TFRecords, shards, a
    /// Megatron prefix, token files (one path, or several files of one dataset).
    #[arg(required = true, num_args = 1..)]
    pub(super) src: Vec<PathBuf>,
    /// Output directory for shard-NNNNN.gpf files.
    #[arg(required = true)]
    pub(super) out: PathBuf,
    /// The dataset's options. A sample that cannot be read (or with --check-images is not the
    /// image it claims to be) is left out and reported, the rest is packed, and the command
    /// exits non-zero at the end; `--strict` stops at the first instead (as it refuses a
    /// dataset whose indexing found a problem).
    #[command(flatten)]
    pub(super) dataset: DatasetArgs,
    /// Target size of each shard.
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    pub(super) shard_size: u64,
    /// Align each sample inside shards (1: packed back to back).
    #[arg(long, default_value_t = 1)]
    pub(super) align: u32,
    /// Threads writing shards (default: all cores).
    #[arg(long)]
    pub(super) threads: Option<usize>,
    /// Also leave out samples that are not the image they claim to be (a truncated JPEG, an
    /// HTML page named .jpg), as `verify` reports them.
    #[arg(long)]
    pub(super) check_images: bool,
    /// Print a JSON summary (after one JSON line per skipped sample).
    #[arg(long)]
    pub(super) json: bool,
}

pub(super) fn pack_cmd(a: PackArgs) -> Result<()> {
    use gpufeed::dataset::{pack, PackOptions};
    let ds = a.dataset.open(&a.src)?;
    report_problems(&ds, false);
    let mut opts = PackOptions {
        shard_bytes: a.shard_size,
        align: a.align,
        progress: !a.json,
        strict: ds.options().strict,
        check_images: a.check_images,
        ..PackOptions::default()
    };
    if let Some(t) = a.threads {
        opts.threads = t;
    }
    let s = pack(&ds, &a.out, &opts)?;
    for e in &s.skipped_samples {
        if a.json {
            outln!("{}", error_json(e));
        } else {
            outln!("skipped: {}", e.report());
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string(&s).expect("serialises"));
    } else {
        if s.skipped > s.skipped_samples.len() as u64 {
            outln!(
                "… {} more skipped",
                s.skipped - s.skipped_samples.len() as u64
            );
        }
        outln!(
            "packed {} samples ({:.2} GiB) into {} shards in {}{}",
            s.samples,
            s.bytes as f64 / (1u64 << 30) as f64,
            s.shards.len(),
            a.out.display(),
            if s.skipped > 0 {
                format!("; {} skipped", s.skipped)
            } else {
                String::new()
            }
        );
    }
    if s.skipped > 0 {
        return Err(gpufeed::error::Error::new(
            gpufeed::error::ErrorKind::InvalidInput,
            format!(
                "{} sample(s) could not be packed and were left out (listed above; the shards \
                 hold the rest; --strict stops at the first)",
                s.skipped
            ),
        ));
    }
    Ok(())
}
