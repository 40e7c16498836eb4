//! `gpufeed inspect`.

use super::*;

#[derive(Debug, Args)]
pub(super) struct InspectArgs {
    /// A dataset: shards, WebDataset tars, TFRecords, a Megatron prefix, token files, or an
    /// ImageFolder directory (a file, a directory of files, or several files of one dataset).
    #[arg(required = true, num_args = 1..)]
    pub(super) paths: Vec<PathBuf>,
    #[command(flatten)]
    pub(super) dataset: DatasetArgs,
    /// Summarise the images (sizes, colour spaces, subsampling, progressive, non-JPEG): packed
    /// shards carry their headers; other formats have each sample's header bytes read.
    /// Shards with image records are summarised without asking.
    #[arg(long)]
    pub(super) images: bool,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

pub(super) fn inspect_cmd(a: InspectArgs) -> Result<()> {
    let ds = a.dataset.open(&a.paths)?;
    if !a.json {
        report_problems(&ds, false);
        for n in ds.notes() {
            eprintln!("gpufeed: note: {n}");
        }
    }
    // Labels of TFRecord Examples are in the records, read with them, not in the index.
    let labels_in_records = ds.labels_in_records();
    // One pass, and memory by distinct sizes and labels, not by samples.
    let mut hist = std::collections::BTreeMap::new();
    let mut labels = std::collections::HashSet::new();
    if let Some(runs) = ds.samples().runs() {
        // Computed windows: one length per run, no labels.
        for r in runs {
            *hist
                .entry((r.len.max(1) as u64).next_power_of_two())
                .or_insert(0u64) += r.count;
        }
        labels.insert(-1);
    } else {
        for s in ds.samples().iter() {
            let b = (s.len.max(1) as u64).next_power_of_two();
            *hist.entry(b).or_insert(0u64) += 1;
            labels.insert(s.label);
        }
    }
    // -1 is "no label" (token windows, a WebDataset without label files): not a label.
    labels.remove(&-1);
    let images = if a.images || ds.has_image_info() {
        Some(gpufeed::image::Summary::of(ds.image_info()?))
    } else {
        None
    };
    if a.json {
        let h: Vec<_> = hist
            .iter()
            .map(|(k, v)| serde_json::json!({"le_bytes": k, "samples": v}))
            .collect();
        outln!(
            "{}",
            serde_json::json!({
                "path": show_paths(&a.paths), "format": ds.format(), "samples": ds.len(),
                "options": ds.options().to_json(),
                "files": ds.file_count(), "bytes": ds.total_bytes(),
                "labels": (!labels_in_records).then_some(labels.len()),
                "checksums": ds.has_checksums(), "size_histogram": h,
                "index_bytes": ds.index_bytes(),
                "node_index": ds.node_index(),
                "problems": ds.problems_total(),
                "first_problems": ds.problems().iter().take(20).map(error_json).collect::<Vec<_>>(),
                "notes": ds.notes(), "recovered": ds.recovered_count(),
                "images": images,
                "tokens": ds.token_layout().map(|t| serde_json::json!({
                    "dtype": t.dtype, "width": t.width, "window": t.window,
                })),
            })
        );
        return problems_fail(&ds);
    }
    outln!(
        "{}: {}, {} samples in {} files, {:.3} GiB, {}, checksums: {}, problems: {}{}",
        show_paths(&a.paths),
        ds.format().name(),
        ds.len(),
        ds.file_count(),
        ds.total_bytes() as f64 / (1u64 << 30) as f64,
        match labels.len() {
            _ if labels_in_records => "per-record labels".to_string(),
            0 => "no labels".to_string(),
            1 => "1 label".to_string(),
            n => format!("{n} labels"),
        },
        ds.has_checksums(),
        ds.problems_total(),
        if ds.recovered_count() > 0 {
            format!(", recovered: {}", ds.recovered_count())
        } else {
            String::new()
        }
    );
    let max = hist.values().copied().max().unwrap_or(1);
    for (k, v) in &hist {
        outln!(
            "  ≤ {:>6}  {:>9}  {}",
            gpufeed::config::size_label(*k),
            v,
            "#".repeat((v * 40 / max) as usize)
        );
    }
    if let Some(im) = images {
        outln!("{}", im.text());
    }
    problems_fail(&ds)
}

/// `inspect` fails, as `verify` does, when indexing found problems: its summary has been
/// printed, and the exit status tells a script the dataset is damaged.
pub(super) fn problems_fail(ds: &gpufeed::dataset::Dataset) -> Result<()> {
    match ds.problems_total() {
        0 => Ok(()),
        n => Err(gpufeed::error::Error::new(
            gpufeed::error::ErrorKind::InvalidInput,
            format!(
                "indexing found {n} problem(s), listed above: what each covers is not in the \
                 dataset (a sample, or the rest of a file), except a bad label, whose sample is \
                 kept with label -1; --strict refuses such a dataset"
            ),
        )),
    }
}
