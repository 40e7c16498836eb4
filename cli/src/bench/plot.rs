//! `--plot FILE.svg`: a bench's rows as horizontal bars (plotters' SVG backend), each with its
//! figure and its ratio to its baseline printed on it, grouped by workload.

use std::path::Path;

use plotters::prelude::*;

use gpufeed::error::{Error, ErrorKind, Result};

/// One bar.
#[derive(Debug, Clone)]
pub struct Bar {
    /// The workload or case it belongs to (bars of a group share a baseline).
    pub group: String,
    /// What it measures (an engine, a mode, a pipeline).
    pub label: String,
    /// Its value (the unit is the chart's).
    pub value: f64,
    /// Whether it is its group's baseline.
    pub baseline: bool,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Draws `bars` to `path` (SVG) under `title`, values in `unit`; each bar is annotated with
/// its value and its ratio to the baseline of its group.
pub fn bars(path: &Path, title: &str, unit: &str, bars: &[Bar]) -> Result<()> {
    let fail = |e: String| {
        Error::new(
            ErrorKind::Io,
            format!("cannot draw {}: {e}", path.display()),
        )
    };
    if bars.is_empty() {
        return Err(fail("nothing to plot".into()));
    }
    let n = bars.len() as u32;
    let max = bars
        .iter()
        .map(|b| b.value)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let height = 80 + 26 * n;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let labels: Vec<String> = bars
        .iter()
        .map(|b| format!("{} · {}", b.group, b.label))
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(34)
        .y_label_area_size(260)
        .build_cartesian_2d(0.0..max * 1.3, (0..n).into_segmented())
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(unit)
        .y_labels(n as usize)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    let mut kinds: Vec<&str> = Vec::new();
    for (i, b) in bars.iter().enumerate() {
        if !kinds.contains(&b.label.as_str()) {
            kinds.push(&b.label);
        }
        let color = COLORS[kinds.iter().position(|k| *k == b.label).unwrap_or(0) % COLORS.len()];
        let i = i as u32;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(i)),
                    (b.value, SegmentValue::Exact(i + 1)),
                ],
                color.mix(0.8).filled(),
            )))
            .map_err(|e| fail(e.to_string()))?;
        let base = bars
            .iter()
            .find(|x| x.group == b.group && x.baseline)
            .map(|x| x.value);
        let ratio = match base {
            Some(v) if v > 0.0 && !b.baseline => format!("  {:.2}×", b.value / v),
            Some(_) => "  baseline".to_string(),
            None => String::new(),
        };
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{}{ratio}", figure(b.value)),
                (b.value + max * 0.01, SegmentValue::CenterOf(i)),
                ("sans-serif", 13).into_font().color(&BLACK),
            )))
            .map_err(|e| fail(e.to_string()))?;
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// A value with about three significant digits.
fn figure(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_names_every_bar_and_its_ratio() {
        let dir = std::env::temp_dir().join(format!("gpufeed-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.svg");
        let b = |g: &str, l: &str, v: f64, base: bool| Bar {
            group: g.into(),
            label: l.into(),
            value: v,
            baseline: base,
        };
        bars(
            &p,
            "test",
            "GiB/s",
            &[
                b("4K", "uring", 2.0, false),
                b("4K", "sync", 1.0, true),
                b("mix", "uring", 3.0, false),
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("4K · uring") && svg.contains("2.00×") && svg.contains("baseline"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(bars(&p, "x", "y", &[]).is_err());
    }
}
