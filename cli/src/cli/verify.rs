//! `gpufeed verify`: the library's `dataset::verify`, printed.

use super::*;

pub(super) fn verify_cmd(a: InspectArgs) -> Result<()> {
    let opts = a.dataset.options()?;
    let what_path = show_paths(&a.paths);
    let mut prog: Option<gpufeed::progress::Task> = None;
    let report = gpufeed::dataset::verify(&a.paths, &opts, &mut |done, total| {
        prog.get_or_insert_with(|| {
            gpufeed::progress::Task::bytes(format!("verifying {what_path}"), total)
        })
        .set(done)
    })?;
    if let Some(p) = prog {
        p.finish();
    }
    let (checked, files, bad) = (report.samples, report.files, &report.bad);
    let what = if report.checksums {
        "checked"
    } else {
        "read (this format carries no checksums)"
    };
    for e in bad {
        if a.json {
            outln!("{}", error_json(e));
        } else {
            outln!("bad: {}", e.report());
        }
    }
    if a.json {
        // Always a summary, last, so a script gets one object whatever happened.
        outln!(
            "{}",
            serde_json::json!({
                "summary": true, "path": what_path, "samples": checked, "files": files,
                "bad": report.bad_total, "ok": report.ok(),
                "checksums": report.checksums,
            })
        );
    } else {
        if report.bad_total > bad.len() as u64 {
            outln!("… {} more bad", report.bad_total - bad.len() as u64);
        }
        outln!(
            "{checked} samples in {files} files {what}, {} bad",
            report.bad_total
        );
    }
    if report.ok() {
        Ok(())
    } else {
        Err(gpufeed::error::Error::new(
            gpufeed::error::ErrorKind::InvalidInput,
            format!("{} bad sample(s) or file(s)", report.bad_total),
        ))
    }
}
