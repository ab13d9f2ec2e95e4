//! Output of the overload suite: a machine-readable summary, a text table
//! for the terminal, and p99-over-time charts.

// used by the scenarios in main.rs
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::{json, Map, Value};

use crate::stats::Percentiles;

/// One line of the summary: one system in one scenario at one load.
#[derive(Clone, Debug)]
pub struct SummaryRow {
    /// Scenario name.
    pub scenario: String,
    /// System under test.
    pub system: String,
    /// Offered load as a multiple of capacity.
    pub offered_x: f64,
    /// Completions within the SLO as a fraction of capacity.
    pub goodput_frac: f64,
    /// Fraction of scheduled requests refused by admission control.
    pub rejected_frac: f64,
    /// Latency from the intended send time, per class name.
    pub latency_ms: BTreeMap<String, Percentiles>,
    /// Jain's index against the weighted max-min fair shares, where tenants
    /// matter.
    pub jain: Option<f64>,
    /// Time to converge after a load spike, where there was one.
    pub converge_ms: Option<f64>,
    /// p99 of how late the generator sent requests; a large value means the
    /// generator, not the system, set the pace.
    pub generator_late_p99_us: f64,
    /// Whether the run's measurements can be trusted.
    pub valid: bool,
    /// Scenario-specific figures (e.g. "foreground_p99_ratio"), merged into
    /// the row's JSON object.
    pub extra: BTreeMap<String, Value>,
}

/// The summary as a JSON array with one object per row.
///
/// Non-finite numbers become null, since JSON has no NaN. An `extra` key that
/// clashes with a standard key is dropped, so consumers can rely on the
/// standard keys' meaning.
pub fn summary_json(rows: &[SummaryRow]) -> Value {
    Value::Array(rows.iter().map(row_json).collect())
}

fn row_json(row: &SummaryRow) -> Value {
    let latency: Map<String, Value> = row
        .latency_ms
        .iter()
        .map(|(class, percentiles)| {
            let figures = json!({
                "p50": number(percentiles.p50_ms),
                "p99": number(percentiles.p99_ms),
                "p999": number(percentiles.p999_ms),
                "max": number(percentiles.max_ms),
                "count": percentiles.count,
            });
            (class.clone(), figures)
        })
        .collect();
    // Extras go in first so that the standard keys overwrite any clash.
    let mut object: Map<String, Value> = row.extra.clone().into_iter().collect();
    let standard = [
        ("scenario", json!(row.scenario)),
        ("system", json!(row.system)),
        ("offered_x", number(row.offered_x)),
        ("goodput_frac", number(row.goodput_frac)),
        ("rejected_frac", number(row.rejected_frac)),
        ("latency_ms", Value::Object(latency)),
        ("jain", row.jain.map_or(Value::Null, number)),
        ("converge_ms", row.converge_ms.map_or(Value::Null, number)),
        ("generator_late_p99_us", number(row.generator_late_p99_us)),
        ("valid", json!(row.valid)),
    ];
    for (key, value) in standard {
        object.insert(key.to_owned(), value);
    }
    Value::Object(object)
}

fn number(value: f64) -> Value {
    serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number)
}

/// Writes the summary, pretty-printed, to `summary.json` in `dir` (created if
/// missing) and returns its path.
pub fn write_summary(rows: &[SummaryRow], dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("summary.json");
    let mut text =
        serde_json::to_string_pretty(&summary_json(rows)).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The rows as a fixed-width text table with a header line: system, offered
/// load, goodput (% of capacity), rejected (%), p50/p99/p99.9 in ms for each
/// of `classes` ("-" without samples), and whether the run is valid.
pub fn table(rows: &[SummaryRow], classes: &[&str]) -> String {
    let mut header: Vec<String> = ["system", "offered", "goodput", "rejected"]
        .map(String::from)
        .to_vec();
    header.extend(
        classes
            .iter()
            .map(|class| format!("{class} p50/p99/p99.9 ms")),
    );
    header.push("valid".to_owned());

    let lines: Vec<Vec<String>> = std::iter::once(header)
        .chain(rows.iter().map(|row| table_cells(row, classes)))
        .collect();
    let mut widths = vec![0; lines[0].len()];
    for cells in &lines {
        for (width, cell) in widths.iter_mut().zip(cells) {
            *width = (*width).max(cell.chars().count());
        }
    }

    let mut text = String::new();
    for cells in &lines {
        let mut line = String::new();
        for (column, (cell, &width)) in cells.iter().zip(&widths).enumerate() {
            if column == 0 {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("  {cell:>width$}"));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

fn table_cells(row: &SummaryRow, classes: &[&str]) -> Vec<String> {
    let mut cells = vec![
        row.system.clone(),
        figure(row.offered_x, |x| format!("{x:.1}x")),
        figure(row.goodput_frac, percent),
        figure(row.rejected_frac, percent),
    ];
    cells.extend(
        classes
            .iter()
            .map(|&class| match row.latency_ms.get(class) {
                Some(latency) if latency.count > 0 => format!(
                    "{}/{}/{}",
                    figure(latency.p50_ms, two_decimals),
                    figure(latency.p99_ms, two_decimals),
                    figure(latency.p999_ms, two_decimals),
                ),
                _ => "-".to_owned(),
            }),
    );
    cells.push(if row.valid { "ok" } else { "INVALID" }.to_owned());
    cells
}

fn figure(value: f64, format: impl Fn(f64) -> String) -> String {
    if value.is_finite() {
        format(value)
    } else {
        "-".to_owned()
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

fn two_decimals(value: f64) -> String {
    format!("{value:.2}")
}

/// One system's p99 latency over a run: (seconds into the run, p99 ms).
#[derive(Clone, Debug)]
pub struct Series {
    /// System the line belongs to, shown in the legend.
    pub system: String,
    /// (seconds, p99 ms) points in time order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
}

/// Draws one line per system of p99 latency over time into an SVG file at
/// `path`. Without series or points it still writes an (empty) chart.
pub fn plot_p99_over_time(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let svg = p99_chart_svg(title, series)?;
    std::fs::write(path, svg).map_err(|error| format!("writing {}: {error}", path.display()))
}

fn p99_chart_svg(title: &str, series: &[Series]) -> Result<String, String> {
    let lines: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|line| {
            let points = line
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            (line.system.as_str(), points)
        })
        .collect();
    let all_points = || lines.iter().flat_map(|(_, points)| points.iter().copied());
    let (mut x_from, mut x_to) = all_points()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (x, _)| {
            (lo.min(x), hi.max(x))
        });
    if x_from > x_to {
        (x_from, x_to) = (0.0, 1.0);
    } else if x_from == x_to {
        x_to = x_from + 1.0;
    }
    let y_to = (all_points().map(|(_, y)| y).fold(0.0, f64::max) * 1.1).max(1.0);

    let drawing = |error: &dyn std::fmt::Display| format!("drawing the p99 chart: {error}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1024, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| drawing(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 28))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x_from..x_to, 0.0..y_to)
            .map_err(|e| drawing(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("p99 latency (ms)")
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| drawing(&e))?;
        for (index, (system, points)) in lines.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| drawing(&e))?
                .label(*system)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        if !lines.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 16))
                .draw()
                .map_err(|e| drawing(&e))?;
        }
        root.present().map_err(|e| drawing(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, valid: bool) -> SummaryRow {
        let mut latency_ms = BTreeMap::new();
        latency_ms.insert(
            "fg".to_owned(),
            Percentiles {
                count: 10,
                p50_ms: 1.5,
                p99_ms: 4.25,
                p999_ms: 9.0,
                max_ms: 12.0,
            },
        );
        latency_ms.insert("bg".to_owned(), Percentiles::default());
        SummaryRow {
            scenario: "spike".to_owned(),
            system: system.to_owned(),
            offered_x: 3.0,
            goodput_frac: 0.925,
            rejected_frac: 0.5,
            latency_ms,
            jain: Some(0.75),
            converge_ms: None,
            generator_late_p99_us: 12.5,
            valid,
            extra: BTreeMap::new(),
        }
    }

    /// A path under the temp dir unique to this process and `name`.
    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("admission-overload-{}-{name}", std::process::id()))
    }

    #[test]
    fn summary_rows_have_exactly_the_standard_keys_plus_extras() {
        let mut with_extra = row("admission", true);
        with_extra
            .extra
            .insert("foreground_p99_ratio".to_owned(), json!(1.25));

        let summary = summary_json(&[with_extra]);

        let object = summary[0].as_object().expect("a row is an object");
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        let mut expected = vec![
            "converge_ms",
            "foreground_p99_ratio",
            "generator_late_p99_us",
            "goodput_frac",
            "jain",
            "latency_ms",
            "offered_x",
            "rejected_frac",
            "scenario",
            "system",
            "valid",
        ];
        let mut keys_sorted = keys.clone();
        keys_sorted.sort_unstable();
        expected.sort_unstable();
        assert_eq!(keys_sorted, expected);
        assert_eq!(summary[0]["foreground_p99_ratio"], json!(1.25));
        assert_eq!(summary[0]["offered_x"], json!(3.0));
        assert_eq!(summary[0]["jain"], json!(0.75));
        assert_eq!(summary[0]["converge_ms"], Value::Null);
        assert_eq!(summary[0]["valid"], json!(true));
        assert_eq!(
            summary[0]["latency_ms"]["fg"],
            json!({"p50": 1.5, "p99": 4.25, "p999": 9.0, "max": 12.0, "count": 10})
        );
        assert_eq!(summary[0]["latency_ms"]["bg"]["count"], json!(0));
    }

    #[test]
    fn non_finite_figures_become_null() {
        let mut broken = row("admission", false);
        broken.goodput_frac = f64::NAN;
        broken.generator_late_p99_us = f64::INFINITY;
        broken.jain = Some(f64::NAN);
        broken.latency_ms.get_mut("fg").expect("fg is there").p99_ms = f64::NAN;

        let summary = summary_json(&[broken]);

        assert_eq!(summary[0]["goodput_frac"], Value::Null);
        assert_eq!(summary[0]["generator_late_p99_us"], Value::Null);
        assert_eq!(summary[0]["jain"], Value::Null);
        assert_eq!(summary[0]["latency_ms"]["fg"]["p99"], Value::Null);
    }

    #[test]
    fn an_extra_cannot_overwrite_a_standard_key() {
        let mut clashing = row("admission", true);
        clashing
            .extra
            .insert("system".to_owned(), json!("impostor"));

        assert_eq!(summary_json(&[clashing])[0]["system"], json!("admission"));
    }

    #[test]
    fn no_rows_is_an_empty_array() {
        assert_eq!(summary_json(&[]), json!([]));
    }

    #[test]
    fn the_summary_file_is_written_into_a_created_directory() -> std::io::Result<()> {
        let dir = temp_path("summary").join("admission-report");

        let path = write_summary(&[row("admission", true)], &dir)?;

        assert_eq!(path, dir.join("summary.json"));
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        assert_eq!(written, summary_json(&[row("admission", true)]));
        std::fs::remove_dir_all(temp_path("summary"))
    }

    #[test]
    fn the_table_shows_each_system_and_flags_invalid_runs() {
        let rows = [row("admission", true), row("tower-limit", false)];

        let table = table(&rows, &["fg", "bg", "missing"]);

        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("system"));
        assert!(lines[0].contains("fg p50/p99/p99.9 ms"));
        assert!(lines[1].starts_with("admission"));
        assert!(lines[1].ends_with("ok"));
        assert!(lines[2].starts_with("tower-limit"));
        assert!(lines[2].ends_with("INVALID"));
        for line in &lines[1..] {
            assert!(line.contains("3.0x"));
            assert!(line.contains("92.5%"));
            assert!(line.contains("50.0%"));
            assert!(line.contains("1.50/4.25/9.00"));
            // bg has no samples and "missing" is not there at all.
            assert_eq!(line.matches(" -").count(), 2);
        }
        // Fixed width: the status column lines up.
        assert_eq!(lines[0].find("valid"), Some(lines[2].len() - "valid".len()));
        assert!(lines.iter().all(|line| line.len() <= 120));
    }

    #[test]
    fn the_chart_is_an_svg_naming_every_system() -> Result<(), String> {
        let path = temp_path("p99.svg");
        let series = [
            Series {
                system: "admission".to_owned(),
                points: vec![(0.0, 2.0), (1.0, 40.0), (2.0, f64::NAN), (3.0, 3.0)],
            },
            Series {
                system: "tower-limit".to_owned(),
                points: vec![(0.0, 2.5), (1.0, 90.0), (2.0, 85.0)],
            },
        ];

        plot_p99_over_time(&path, "p99 under a 3x spike", &series)?;

        let svg = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        std::fs::remove_file(&path).map_err(|e| e.to_string())?;
        assert!(svg.contains("<svg"));
        assert!(svg.contains("admission"));
        assert!(svg.contains("tower-limit"));
        assert!(svg.contains("p99 under a 3x spike"));
        assert!(svg.contains("seconds"));
        assert!(svg.contains("p99 latency (ms)"));
        Ok(())
    }

    #[test]
    fn a_chart_without_points_is_still_written() -> Result<(), String> {
        let path = temp_path("empty.svg");
        let pointless = [Series {
            system: "admission".to_owned(),
            points: vec![(f64::NAN, 1.0)],
        }];

        plot_p99_over_time(&path, "empty", &[])?;
        let without_series = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        plot_p99_over_time(&path, "empty", &pointless)?;
        let without_points = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        std::fs::remove_file(&path).map_err(|e| e.to_string())?;

        assert!(without_series.contains("<svg"));
        assert!(without_points.contains("<svg"));
        assert!(without_points.contains("admission"));
        Ok(())
    }

    #[test]
    fn an_unwritable_chart_path_is_an_error() {
        let path = temp_path("no-such-dir").join("p99.svg");

        assert!(plot_p99_over_time(&path, "nowhere", &[]).is_err());
    }
}
