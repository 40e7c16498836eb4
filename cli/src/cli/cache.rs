//! `gpufeed cache warm|status|drop`: the library's node cache (`gpufeed::cache`), printed.

use super::*;

#[derive(Debug, Subcommand)]
pub(super) enum CacheCmd {
    /// Fetch what the next epoch reads into the node cache, in the order it reads it, on
    /// several threads; resumable (what is cached is skipped). Takes the loader's order flags.
    Warm(CacheWarmArgs),
    /// What the node cache holds of a dataset, and the share of the next epoch it will serve
    /// (changes nothing: fetches no object, makes or empties no file).
    Status(CacheArgs),
    /// Empty the node cache (no loader may be using it). Only a directory gpufeed made a cache
    /// in is emptied; anything else is refused.
    Drop(CacheDropArgs),
}

#[derive(Debug, Args)]
pub(super) struct CacheArgs {
    /// A remote dataset: s3://BUCKET/PREFIX (or gs://, az://, http(s)://), or its objects.
    #[arg(required = true, num_args = 1..)]
    pub(super) paths: Vec<PathBuf>,
    #[command(flatten)]
    pub(super) dataset: DatasetArgs,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Debug, Args)]
pub(super) struct CacheWarmArgs {
    #[command(flatten)]
    pub(super) cache: CacheArgs,
    #[command(flatten)]
    pub(super) loader: LoaderArgs,
    /// The order the training will read in: global, shard-buffer, block or sequential (the
    /// loader's `order`; its parameters are the flags above).
    #[arg(long, default_value = "global")]
    pub(super) order: String,
    /// The epoch whose order to follow.
    #[arg(long, default_value_t = 0)]
    pub(super) epoch: u64,
    /// GETs in flight.
    #[arg(long, default_value_t = 16)]
    pub(super) threads: usize,
}

#[derive(Debug, Args)]
pub(super) struct CacheDropArgs {
    /// The cache directory [default: $GPUFEED_CACHE_DIR, else ~/.cache/gpufeed/objects].
    #[arg(long, value_name = "DIR")]
    pub(super) cache_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

#[cfg(feature = "remote")]
pub(super) fn index_cmd(a: CacheArgs) -> Result<()> {
    let urls: Vec<String> = a
        .paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(u) = urls.iter().find(|u| !gpufeed::remote::is_url(u)) {
        return Err(crate::util::invalid(format!(
            "{u}: gpufeed index writes indexes beside the tars of a remote WebDataset (s3://…); \
             a local tar is walked when it is opened, which costs no more than reading an index"
        )));
    }
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let r = gpufeed::dataset::upload_indexes(&urls, &a.dataset.options()?)?;
    if a.json {
        outln!("{}", serde_json::to_value(&r).unwrap_or_default());
    } else {
        outln!(
            "{}: {} tar indexes written beside their tars ({})",
            show_paths(&a.paths),
            r.uploaded,
            gpufeed::config::bytes_human(r.bytes)
        );
    }
    Ok(())
}

#[cfg(not(feature = "remote"))]
pub(super) fn index_cmd(_: CacheArgs) -> Result<()> {
    Err(no_remote())
}

#[cfg(feature = "remote")]
pub(super) fn cache_cmd(c: CacheCmd) -> Result<()> {
    match c {
        CacheCmd::Warm(a) => {
            let ds = a.cache.dataset.open(&a.cache.paths)?;
            let mut s = a.loader.settings()?;
            s.set("order", &a.order)?;
            let plan = s.plan(&gpufeed::plan::PlanConfig::default());
            let what = show_paths(&a.cache.paths);
            let prog: std::sync::Mutex<Option<gpufeed::progress::Task>> = Default::default();
            let r =
                gpufeed::dataset::warm_cache(&ds, &plan, a.epoch, a.threads, &|done, total| {
                    let mut p = prog.lock().unwrap_or_else(|p| p.into_inner());
                    p.get_or_insert_with(|| {
                        gpufeed::progress::Task::bytes(format!("warming {what}"), total)
                    })
                    .set(done);
                })?;
            if let Some(p) = prog.into_inner().unwrap_or_else(|p| p.into_inner()) {
                p.finish();
            }
            if a.cache.json {
                outln!("{}", serde_json::to_value(&r).unwrap_or_default());
            } else {
                outln!(
                    "{}: {} of the epoch's {} now cached ({} fetched now, {} already there){}",
                    what,
                    gpufeed::config::bytes_human(r.present_bytes + r.fetched_bytes),
                    gpufeed::config::bytes_human(r.needed_bytes),
                    gpufeed::config::bytes_human(r.fetched_bytes),
                    gpufeed::config::bytes_human(r.present_bytes),
                    if r.full {
                        "; the cache is full: the rest will be read from the store each epoch"
                    } else {
                        ""
                    }
                );
            }
            Ok(())
        }
        CacheCmd::Status(a) => {
            let urls: Vec<String> = a
                .paths
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            let st = gpufeed::dataset::cache_status_of(&urls, &a.dataset.options()?)?;
            if a.json {
                outln!("{}", serde_json::to_value(&st).unwrap_or_default());
            } else {
                let c = &st.counters;
                outln!(
                    "{}: {} of {} in the node cache ({} objects); the next epoch reads {:.0}% \
                     from it",
                    show_paths(&a.paths),
                    gpufeed::config::bytes_human(st.present_bytes),
                    gpufeed::config::bytes_human(st.dataset_bytes),
                    st.objects,
                    100.0 * st.predicted_hit_ratio
                );
                outln!(
                    "node cache: {} of {} used; {} GETs, {} fetched, {} served uncached{}",
                    gpufeed::config::bytes_human(c.cached_bytes),
                    gpufeed::config::bytes_human(c.limit_bytes),
                    c.gets,
                    gpufeed::config::bytes_human(c.fetched_bytes),
                    gpufeed::config::bytes_human(c.direct_bytes),
                    if c.damaged_extents > 0 {
                        format!("; {} damaged extents fetched again", c.damaged_extents)
                    } else {
                        String::new()
                    }
                );
            }
            Ok(())
        }
        CacheCmd::Drop(a) => {
            let dir = a.cache_dir.unwrap_or_else(gpufeed::cache::default_dir);
            // Only a cache is emptied: a directory that is not one is refused, naming what it
            // holds; one that is missing or empty is left as it is.
            let freed = match gpufeed::cache::NodeCache::open_as(
                &dir,
                None,
                gpufeed::cache::EXTENT_BYTES_DEFAULT,
                gpufeed::cache::OpenMode::Drop,
            )? {
                Some(cache) => Some(cache.drop_all()?),
                None => None,
            };
            // A missing directory is no error (dropping twice is fine), but said: a mistyped
            // --cache-dir must not read as a cache emptied.
            let missing = freed.is_none() && std::fs::metadata(&dir).is_err();
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({
                        "dir": dir.display().to_string(),
                        "freed_bytes": freed.unwrap_or(0),
                        "found": freed.is_some(),
                    })
                );
            } else if let Some(freed) = freed {
                outln!(
                    "{}: emptied ({} freed)",
                    dir.display(),
                    gpufeed::config::bytes_human(freed)
                );
            } else if missing {
                outln!(
                    "{}: no such directory (or a dangling link), no cache to drop",
                    dir.display()
                );
            } else {
                outln!("{}: an empty directory, no cache to drop", dir.display());
            }
            Ok(())
        }
    }
}

#[cfg(not(feature = "remote"))]
pub(super) fn cache_cmd(_: CacheCmd) -> Result<()> {
    Err(no_remote())
}

#[cfg(not(feature = "remote"))]
fn no_remote() -> gpufeed::error::Error {
    gpufeed::error::Error::new(
        gpufeed::error::ErrorKind::Unsupported,
        "this gpufeed was built without object-storage support (cargo feature `remote`)",
    )
}
