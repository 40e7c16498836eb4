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
    /// Print a JSON summary.
    #[arg(long)]
    pub(super) json: bool,
}

pub(super) fn pack_cmd(a: PackArgs) -> Result<()> {
    use crate::dataset::pack::{pack, PackOptions};
    let ds = a.dataset.open(&a.src)?;
    report_problems(&ds, false);
    let mut opts = PackOptions {
        shard_bytes: a.shard_size,
        align: a.align,
        progress: !a.json,
        ..PackOptions::default()
    };
    if let Some(t) = a.threads {
        opts.threads = t;
    }
    let s = pack(&ds, &a.out, &opts)?;
    if a.json {
        outln!("{}", serde_json::to_string(&s).expect("serialises"));
    } else {
        outln!(
            "packed {} samples ({:.2} GiB) into {} shards in {}",
            s.samples,
            s.bytes as f64 / (1u64 << 30) as f64,
            s.shards.len(),
            a.out.display()
        );
    }
    Ok(())
}
