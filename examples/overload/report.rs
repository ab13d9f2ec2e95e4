//! Output of the overload suite: a machine-readable summary, a text table
//! for the terminal, and p99-over-time charts.

// used by the scenarios in main.rs
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::{json, Map, Value};

use crate::stats::{Inversion, Percentiles};

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
    /// Classes served within the SLO less often than a class of lower
    /// priority, for an admission system (which orders by priority) with
    /// more than one class; `None` where nothing was checked.
    pub inversions: Option<Vec<Inversion>>,
    /// Scenario-specific figures (e.g. "foreground_p99_ratio"), merged into
    /// the row's JSON object.
    pub extra: BTreeMap<String, Value>,
}

impl SummaryRow {
    /// A scenario figure from `extra`, if it is there and a number.
    pub fn extra_f64(&self, key: &str) -> Option<f64> {
        self.extra.get(key).and_then(Value::as_f64)
    }

    /// A scenario count from `extra`, if it is there and an integer.
    pub fn extra_u64(&self, key: &str) -> Option<u64> {
        self.extra.get(key).and_then(Value::as_u64)
    }

    /// A scenario label from `extra`, if it is there and a string.
    pub fn extra_str(&self, key: &str) -> Option<&str> {
        self.extra.get(key).and_then(Value::as_str)
    }

    /// The share of `class` served within the SLO (`served_within_slo` in
    /// `extra`), if the row has one.
    pub fn within_slo(&self, class: &str) -> Option<f64> {
        self.extra
            .get("served_within_slo")
            .and_then(|served| served.get(class))
            .and_then(Value::as_f64)
    }
}

/// What every row of a run shares, and whether the run can be trusted.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    /// `stable` or `unstable`: how the CPU controller read the runtime.
    pub signal: String,
    /// `tokio` or `configured`: how the runtime under test was built.
    pub runtime: String,
    /// The handler style of `--handler`.
    pub handler: String,
    /// How service times were drawn.
    pub service: String,
    /// Worker threads of the runtime under test (`--workers`).
    pub workers: usize,
    /// Cores the machine offered the process.
    pub cores: usize,
    /// C calibrated before the systems ran, requests per second.
    pub capacity_before: f64,
    /// C calibrated after them; `None` if that calibration failed.
    pub capacity_after: Option<f64>,
    /// Why the run cannot be trusted; empty when it can.
    pub invalid_reasons: Vec<String>,
}

impl RunInfo {
    pub fn valid(&self) -> bool {
        self.invalid_reasons.is_empty()
    }
}

/// How far C may move between the calibrations before and after the
/// systems run: more means the machine's spare capacity changed under the
/// run (other builds, other tenants), and every figure relative to C with it.
pub const CAPACITY_DRIFT_LIMIT: f64 = 0.10;

/// What is wrong with a C calibrated as `before` and again, after
/// `after_what`, as `after` (`None`: that calibration failed), if anything.
fn capacity_drift(before: f64, after: Option<f64>, after_what: &str) -> Option<String> {
    let Some(after) = after else {
        return Some(format!("C could not be calibrated after {after_what}"));
    };
    let moved = after / before - 1.0;
    (!moved.is_finite() || moved.abs() > CAPACITY_DRIFT_LIMIT).then(|| {
        format!(
            "C moved from {before:.0} to {after:.0} req/s ({:+.1}%, limit {:.0}%)",
            moved * 100.0,
            CAPACITY_DRIFT_LIMIT * 100.0
        )
    })
}

/// Why a run whose C was `before` and then `after` produced `rows` cannot
/// be trusted: C moved by more than [`CAPACITY_DRIFT_LIMIT`] (or the C of
/// its own that a scenario's rows carry, `capacity_per_sec` before them
/// and `capacity_after_per_sec` after, as the pool scenarios' do), or a
/// system's goodput exceeded C (C was then calibrated low, on a busy machine, and
/// every fraction of it is inflated). Only rows measured against C (those
/// carrying `capacity_per_sec`) are held to it: W6 and W7 have their own
/// denominators, and the ideal scheduler's row is simulated, not measured.
pub fn run_problems(before: f64, after: Option<f64>, rows: &[SummaryRow]) -> Vec<String> {
    let mut problems: Vec<String> = capacity_drift(before, after, "the run")
        .into_iter()
        .collect();
    // A scenario measured against a C of its own (calibrated for it before
    // its rows, and again after them) is judged by the same limit, once.
    let mut judged: Vec<&str> = Vec::new();
    for row in rows {
        let Some(after) = row.extra.get("capacity_after_per_sec") else {
            continue;
        };
        let Some(own) = row.extra_f64("capacity_per_sec") else {
            continue;
        };
        if judged.contains(&row.scenario.as_str()) {
            continue;
        }
        judged.push(&row.scenario);
        if let Some(problem) = capacity_drift(own, after.as_f64(), "its rows") {
            problems.push(format!("{}: {problem}", row.scenario));
        }
    }
    for row in rows {
        let simulated = row.extra.contains_key("simulated");
        if row.extra.contains_key("capacity_per_sec") && !simulated && row.goodput_frac > 1.0 {
            problems.push(format!(
                "{} {}: goodput {:.1}% of C (over 100%)",
                row.scenario,
                row_label(row),
                row.goodput_frac * 100.0
            ));
        }
    }
    problems
}

/// The system, with the handler style, the signal its controller read
/// and a runtime built other than with tokio's defaults, where the row
/// records them: a matrix has a row per cell.
pub fn row_label(row: &SummaryRow) -> String {
    let axis = |key: &str| row.extra_str(key).map(String::from);
    let runtime = axis("runtime")
        .filter(|runtime| runtime != "tokio")
        .map_or(String::new(), |runtime| format!(", {runtime}"));
    match (axis("handler"), axis("signal")) {
        (Some(handler), Some(signal)) => {
            format!("{} [{handler}, {signal}{runtime}]", row.system)
        }
        (Some(handler), None) => format!("{} [{handler}{runtime}]", row.system),
        _ => row.system.clone(),
    }
}

/// Marks every row of an invalid run invalid too, with the run's reasons,
/// so that a reader of one row cannot miss them.
pub fn mark_rows(run: &RunInfo, rows: &mut [SummaryRow]) {
    if run.valid() {
        return;
    }
    for row in rows {
        row.valid = false;
        let reasons = row
            .extra
            .entry("invalid_reasons".to_string())
            .or_insert_with(|| json!([]));
        if let Value::Array(list) = reasons {
            list.extend(
                run.invalid_reasons
                    .iter()
                    .map(|r| json!(format!("run: {r}"))),
            );
        }
    }
}

/// The run's header, for the end of the terminal output: C before and
/// after, and the verdict.
pub fn verdict(run: &RunInfo) -> String {
    let after = run.capacity_after.map_or("-".to_string(), |after| {
        format!(
            "{after:.0} req/s ({:+.1}%)",
            (after / run.capacity_before - 1.0) * 100.0
        )
    });
    let mut text = format!(
        "C before = {:.0} req/s, after = {after}; signal: {}; runtime: {}; handler: {}; \
         {} workers on {} cores\n",
        run.capacity_before, run.signal, run.runtime, run.handler, run.workers, run.cores
    );
    if run.valid() {
        text.push_str("run: valid\n");
    } else {
        text.push_str("RUN INVALID:\n");
        for reason in &run.invalid_reasons {
            text.push_str(&format!("  {reason}\n"));
        }
    }
    text
}

/// The summary: `run` (what the rows share, and whether the run can be
/// trusted) and `rows`, one object per row.
///
/// Non-finite numbers become null, since JSON has no NaN. An `extra` key that
/// clashes with a standard key is dropped, so consumers can rely on the
/// standard keys' meaning.
pub fn summary_json(run: &RunInfo, rows: &[SummaryRow]) -> Value {
    json!({
        "run": {
            "valid": run.valid(),
            "invalid_reasons": run.invalid_reasons,
            "signal": run.signal,
            "runtime": run.runtime,
            "handler": run.handler,
            "service": run.service,
            "workers": run.workers,
            "cores": run.cores,
            "capacity_before_per_sec": number(run.capacity_before),
            "capacity_after_per_sec": run.capacity_after.map_or(Value::Null, number),
        },
        "rows": Value::Array(rows.iter().map(row_json).collect()),
    })
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
        (
            "priority_inversion",
            row.inversions
                .as_ref()
                .map_or(Value::Null, |found| json!(!found.is_empty())),
        ),
        (
            "priority_inversions",
            json!(row
                .inversions
                .iter()
                .flatten()
                .map(ToString::to_string)
                .collect::<Vec<_>>()),
        ),
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
pub fn write_summary(run: &RunInfo, rows: &[SummaryRow], dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("summary.json");
    let mut text =
        serde_json::to_string_pretty(&summary_json(run, rows)).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The rows as a fixed-width text table with a header line: system, offered
/// load, goodput (% of capacity), rejected (%), p50/p99/p99.9 in ms for each
/// of `classes` ("-" without samples), the priority check ("ok",
/// "INVERTED", or "-" where not checked) and whether the run is valid;
/// then one line per priority inversion found.
pub fn table(rows: &[SummaryRow], classes: &[&str]) -> String {
    let mut header: Vec<String> = ["system", "offered", "goodput", "rejected"]
        .map(String::from)
        .to_vec();
    header.extend(
        classes
            .iter()
            .map(|class| format!("{class} p50/p99/p99.9 ms")),
    );
    header.push("prio".to_owned());
    header.push("valid".to_owned());
    let lines: Vec<Vec<String>> = std::iter::once(header)
        .chain(rows.iter().map(|row| table_cells(row, classes)))
        .collect();
    let mut text = aligned(&lines);
    text.push_str(&inversion_lines(rows));
    text
}

/// The check's cell: "-" where nothing was checked.
pub fn priority_cell(row: &SummaryRow) -> String {
    match &row.inversions {
        None => "-",
        Some(found) if found.is_empty() => "ok",
        Some(_) => "INVERTED",
    }
    .to_owned()
}

/// "PRIORITY INVERSION: system: ..." for every inversion of `rows`.
pub fn inversion_lines(rows: &[SummaryRow]) -> String {
    let mut text = String::new();
    for row in rows {
        for inversion in row.inversions.iter().flatten() {
            text.push_str(&format!(
                "PRIORITY INVERSION: {} {}: {inversion}\n",
                row.scenario,
                row_label(row)
            ));
        }
    }
    text
}

/// `lines` of cells as fixed-width text: the first column left-aligned,
/// the rest right-aligned, two spaces apart.
pub fn aligned(lines: &[Vec<String>]) -> String {
    let mut widths = vec![0; lines.first().map_or(0, Vec::len)];
    for cells in lines {
        for (width, cell) in widths.iter_mut().zip(cells) {
            *width = (*width).max(cell.chars().count());
        }
    }

    let mut text = String::new();
    for cells in lines {
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
    cells.push(priority_cell(row));
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
            inversions: None,
            extra: BTreeMap::new(),
        }
    }

    /// The rows of a summary, as JSON.
    fn rows_json(rows: &[SummaryRow]) -> Value {
        summary_json(&RunInfo::default(), rows)["rows"].clone()
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

        let summary = rows_json(&[with_extra]);

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
            "priority_inversion",
            "priority_inversions",
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

        let summary = rows_json(&[broken]);

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

        assert_eq!(rows_json(&[clashing])[0]["system"], json!("admission"));
    }

    #[test]
    fn no_rows_is_an_empty_array() {
        assert_eq!(rows_json(&[]), json!([]));
    }

    #[test]
    fn the_summary_file_is_written_into_a_created_directory() -> std::io::Result<()> {
        let dir = temp_path("summary").join("admission-report");

        let run = RunInfo {
            signal: "stable".to_owned(),
            capacity_before: 3_871.0,
            capacity_after: Some(3_800.0),
            ..RunInfo::default()
        };

        let path = write_summary(&run, &[row("admission", true)], &dir)?;

        assert_eq!(path, dir.join("summary.json"));
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        assert_eq!(written, summary_json(&run, &[row("admission", true)]));
        assert_eq!(written["run"]["signal"], json!("stable"));
        assert_eq!(written["run"]["valid"], json!(true));
        assert_eq!(written["run"]["capacity_after_per_sec"], json!(3_800.0));
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
            // bg has no samples, "missing" is not there at all, and no
            // priority check was made.
            assert_eq!(line.matches(" -").count(), 3);
        }
        // Fixed width: the status column lines up.
        assert_eq!(lines[0].find("valid"), Some(lines[2].len() - "valid".len()));
        // Three classes, the priority check and the status fit a wide
        // terminal.
        assert!(lines.iter().all(|line| line.len() <= 128));
    }

    #[test]
    fn a_label_names_the_cell_and_a_runtime_other_than_tokios_defaults() {
        let mut cell = row("admission-defaults", true);
        assert_eq!(row_label(&cell), "admission-defaults");
        cell.extra.insert("handler".to_owned(), json!("self-wake"));
        cell.extra.insert("runtime".to_owned(), json!("tokio"));
        assert_eq!(row_label(&cell), "admission-defaults [self-wake]");
        cell.extra.insert("signal".to_owned(), json!("stable"));
        assert_eq!(row_label(&cell), "admission-defaults [self-wake, stable]");
        cell.extra.insert("runtime".to_owned(), json!("configured"));
        assert_eq!(
            row_label(&cell),
            "admission-defaults [self-wake, stable, configured]"
        );
        cell.extra.remove("signal");
        assert_eq!(
            row_label(&cell),
            "admission-defaults [self-wake, configured]"
        );
    }

    #[test]
    fn the_table_and_the_json_flag_a_priority_inversion() {
        let mut inverted = row("admission", true);
        inverted.extra.insert("handler".to_owned(), json!("yield"));
        inverted.extra.insert("signal".to_owned(), json!("stable"));
        inverted.inversions = Some(vec![Inversion {
            higher: "high".to_owned(),
            higher_within_slo: 0.712,
            lower: "low".to_owned(),
            lower_within_slo: 0.803,
        }]);
        let mut kept = row("admission-fixed", true);
        kept.inversions = Some(Vec::new());
        let blind = row("tower-limit", true);
        let rows = [inverted, kept, blind];

        let table = table(&rows, &["fg"]);
        let summary = rows_json(&rows);

        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].contains("prio"));
        let last_two = |line: &str| -> Vec<String> {
            line.split_whitespace()
                .rev()
                .take(2)
                .map(String::from)
                .collect()
        };
        assert_eq!(last_two(lines[1]), ["ok", "INVERTED"]);
        assert_eq!(last_two(lines[2]), ["ok", "ok"]);
        assert_eq!(last_two(lines[3]), ["ok", "-"]);
        assert_eq!(
            lines[4],
            "PRIORITY INVERSION: spike admission [yield, stable]: \
             high 71.2% served within SLO < low 80.3%"
        );
        assert_eq!(summary[0]["priority_inversion"], json!(true));
        assert_eq!(
            summary[0]["priority_inversions"],
            json!(["high 71.2% served within SLO < low 80.3%"])
        );
        assert_eq!(summary[1]["priority_inversion"], json!(false));
        assert_eq!(summary[2]["priority_inversion"], Value::Null);
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
