//! What a run comes to: per-class goodput, SLO share and p99 over the
//! spike's second half, retries, the servers' CPU spent on attempts that
//! failed, the time until goodput settles after the spike began; the table,
//! the targets beside their baselines, and the goodput chart.

use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use plotters::prelude::*;

use crate::client::CLASSES;
use crate::{Run, Settings, Setup};

/// One class's figures over the measured window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Class {
    /// Requests planned a second.
    pub offered: f64,
    /// Successes within the SLO a second.
    pub goodput: f64,
    /// The share of the class's requests that succeeded within the SLO.
    pub within_slo: f64,
    /// The p99 latency of its successes, from the planned send time.
    pub p99: Option<Duration>,
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub setup: Setup,
    pub classes: [Class; 3],
    pub requests: usize,
    pub retries: u64,
    pub retry_allowance: Option<f64>,
    pub refused_here: usize,
    /// The servers' work, in µs of nominal CPU, per tier.
    pub units: [u64; 3],
    /// Share of the servers' work spent on attempts that did not succeed
    /// within the SLO (refused somewhere, late, or given up on).
    pub wasted_share: f64,
    /// Share of the servers' work spent by the frontend and A on attempts
    /// a backend refused afterwards.
    pub refused_downstream_share: f64,
    /// Successes within the SLO a second, per bin of the run, by the time
    /// they were answered.
    pub timeline: Vec<f64>,
    /// How goodput settled through the spike (all classes).
    pub settling: Settling,
}

impl Summary {
    pub fn goodput_total(&self) -> f64 {
        self.classes.iter().map(|class| class.goodput).sum()
    }
}

/// The trailing mean the chart draws goodput through.
const SMOOTHING: Duration = Duration::from_millis(100);
/// The trailing means the stability rule may read goodput through,
/// shortest first: a trailing mean lags a step by up to its own length, so
/// a 100 ms mean cannot show settling in 50 ms however fast it is, and
/// the rule takes the shortest mean whose wander at 3x leaves the band
/// resolvable (see [`window_for`]).
const WINDOWS: [Duration; 4] = [
    Duration::from_millis(20),
    Duration::from_millis(30),
    Duration::from_millis(50),
    Duration::from_millis(100),
];
/// The band: within this share of the steady value.
const BAND: f64 = 0.1;

/// The shortest of [`WINDOWS`] through which the goodput of `bins` (a
/// steady stretch) wanders at most half the band, so that the band is
/// entered by settling and not by noise; the longest if none does.
fn window_for(bins: &[f64], bin: Duration) -> Duration {
    WINDOWS
        .into_iter()
        .filter(|window| *window >= bin)
        .find(|&window| wander(bins, bin, window) <= BAND / 2.0)
        .unwrap_or(WINDOWS[WINDOWS.len() - 1])
}

/// `bins` through a trailing mean of `window`.
fn smoothed(bins: &[f64], bin: Duration, window: Duration) -> Vec<f64> {
    let width = ((window.as_nanos() / bin.as_nanos().max(1)) as usize).max(1);
    (0..bins.len())
        .map(|at| {
            let from = (at + 1).saturating_sub(width);
            bins[from..=at].iter().sum::<f64>() / (at + 1 - from) as f64
        })
        .collect()
}

/// The time from the bin `onset` until goodput, through a trailing mean
/// of `window`, first comes within 10% of `steady` (measured to the end
/// of that bin); `None` if it never does.
pub fn time_to_stable(
    bins: &[f64],
    onset: usize,
    steady: f64,
    bin: Duration,
    window: Duration,
) -> Option<Duration> {
    let smoothed = smoothed(bins, bin, window);
    (onset..smoothed.len())
        .find(|&at| (smoothed[at] - steady).abs() <= BAND * steady)
        .map(|at| bin * (at + 1 - onset) as u32)
}

/// How much the smoothed goodput wanders around its mean over `bins`: the
/// standard deviation over the mean (what a 10% band is up against).
fn wander(bins: &[f64], bin: Duration, window: Duration) -> f64 {
    let smoothed = smoothed(bins, bin, window);
    let width = ((window.as_nanos() / bin.as_nanos().max(1)) as usize).max(1);
    let settled = smoothed.get(width..).unwrap_or_default();
    if settled.is_empty() {
        return 0.0;
    }
    let mean = settled.iter().sum::<f64>() / settled.len() as f64;
    let variance = settled.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / settled.len() as f64;
    if mean > 0.0 {
        variance.sqrt() / mean
    } else {
        0.0
    }
}

pub fn summarize(run: &Run, settings: &Settings) -> Summary {
    let phases = settings.phases;
    // The spike's second half: its steady state at 3x.
    let from = phases.spike_start() + phases.spike / 2;
    let to = phases.spike_end();
    let seconds = (to - from).as_secs_f64();
    let mut classes = [Class::default(); 3];
    for (index, class) in classes.iter_mut().enumerate() {
        let mut latencies = Histogram::<u64>::new(3).expect("a histogram");
        let mut planned = 0usize;
        let mut good = 0usize;
        for outcome in &run.outcomes {
            let at = outcome.planned.at;
            if outcome.planned.class != index || at < from || at >= to {
                continue;
            }
            planned += 1;
            if let Some((answered, true)) = outcome.answered {
                good += 1;
                let latency = answered.saturating_sub(at);
                let _ = latencies.record(latency.as_micros() as u64);
            }
        }
        *class = Class {
            offered: planned as f64 / seconds,
            goodput: good as f64 / seconds,
            within_slo: if planned == 0 {
                0.0
            } else {
                good as f64 / planned as f64
            },
            p99: (!latencies.is_empty())
                .then(|| Duration::from_micros(latencies.value_at_quantile(0.99))),
        };
    }

    let mut units = [0u64; 3];
    let (mut wasted, mut refused_downstream) = (0u64, 0u64);
    for attempt in 0..run.ledger.len() {
        let spent = run.ledger.units(attempt);
        for (total, spent) in units.iter_mut().zip(spent) {
            *total += spent;
        }
        if !run.delivered.get(attempt) {
            wasted += spent.iter().sum::<u64>();
        }
        if run.ledger.was_refused_downstream(attempt) {
            refused_downstream += spent[0] + spent[1];
        }
    }
    let all: u64 = units.iter().sum();
    let share = |part: u64| {
        if all == 0 {
            0.0
        } else {
            part as f64 / all as f64
        }
    };

    let timeline = timeline(run, settings.bin, phases.length());
    let bin_of = |at: Duration| (at.as_nanos() / settings.bin.as_nanos()) as usize;
    let end = bin_of(to).min(timeline.len());
    let onset = bin_of(phases.spike_start()).min(end);
    // From the second half of the phase before the spike, as for a train.
    let start = bin_of(phases.spike_start() / 2).min(onset);
    let settling = settling(&timeline[start..end], onset - start, settings);
    Summary {
        setup: run.setup,
        classes,
        requests: run.outcomes.len(),
        retries: run.retries,
        retry_allowance: run.retry_allowance,
        refused_here: run.outcomes.iter().filter(|o| o.refused_here).count(),
        units,
        wasted_share: share(wasted),
        refused_downstream_share: share(refused_downstream),
        timeline,
        settling,
    }
}

/// Successes within the SLO a second, per bin of `bin` over `length`, by
/// the time they were answered.
fn timeline(run: &Run, bin: Duration, length: Duration) -> Vec<f64> {
    let bins = (length.as_nanos() / bin.as_nanos()) as usize + 1;
    let mut timeline = vec![0.0; bins];
    let per_second = 1.0 / bin.as_secs_f64();
    for outcome in &run.outcomes {
        if let Some((answered, true)) = outcome.answered {
            let at = (answered.as_nanos() / bin.as_nanos()) as usize;
            if let Some(bin) = timeline.get_mut(at) {
                *bin += per_second;
            }
        }
    }
    timeline
}

/// How goodput settles through one spike.
#[derive(Clone, Copy, Debug)]
pub struct Settling {
    /// Goodput over the spike's second half.
    pub steady: f64,
    pub time_to_stable: Option<Duration>,
    /// The trailing mean it is read through (see [`window_for`]).
    pub window: Duration,
    /// The smoothed goodput's standard deviation over its mean, over the
    /// spike's second half.
    pub wander: f64,
    /// What the same mean reads for an instant step between the goodput
    /// before the spike and at 3x: the rule's own floor.
    pub step_floor: Option<Duration>,
}

/// The settling of the goodput `bins`: a stretch at the steady load, the
/// spike from bin `onset` to the end; its steady value is the mean of the
/// spike's second half, the value before it the mean of the bins before
/// `onset`.
fn settling(bins: &[f64], onset: usize, settings: &Settings) -> Settling {
    let bin = settings.bin;
    let mean = |bins: &[f64]| bins.iter().sum::<f64>() / bins.len().max(1) as f64;
    let steady_bins = &bins[(onset + bins.len()) / 2..];
    let steady = mean(steady_bins);
    let window = window_for(steady_bins, bin);
    // Goodput that collapsed to almost nothing has no value to settle at.
    let settles = steady > 0.1 * settings.capacity();
    let before = mean(&bins[..onset]);
    let step: Vec<f64> = (0..bins.len())
        .map(|at| if at < onset { before } else { steady })
        .collect();
    Settling {
        steady,
        time_to_stable: settles
            .then(|| time_to_stable(bins, onset, steady, bin, window))
            .flatten(),
        window,
        wander: wander(steady_bins, bin, window),
        step_floor: settles
            .then(|| time_to_stable(&step, onset, steady, bin, window))
            .flatten(),
    }
}

/// The settling through a train of spikes (a run through the settings'
/// `train`): the goodput of every spike, from the second half of the rest
/// before it to its end, averaged bin by bin over the spikes, aligned on
/// their onsets. Averaging `n` spikes divides the counting noise of a bin
/// by the square root of `n`, so a short trailing mean can resolve the
/// band.
pub struct Settle {
    pub spikes: u32,
    pub settling: Settling,
}

pub fn settle(run: &Run, settings: &Settings) -> Settle {
    let train = settings.train;
    let timeline = timeline(run, settings.bin, train.length());
    let bin_of = |at: Duration| (at.as_nanos() / settings.bin.as_nanos()) as usize;
    let (rest, spike) = (bin_of(train.before / 2), bin_of(train.spike));
    let mut mean = vec![0.0; rest + spike];
    let spikes: Vec<usize> = (0..train.spikes)
        .map(|k| bin_of(train.spike_start_of(k)))
        .filter(|&onset| onset >= rest && onset + spike <= timeline.len())
        .collect();
    for &onset in &spikes {
        for (at, sum) in mean.iter_mut().enumerate() {
            *sum += timeline[onset - rest + at] / spikes.len() as f64;
        }
    }
    Settle {
        spikes: spikes.len() as u32,
        settling: settling(&mean, rest, settings),
    }
}

fn millis(duration: Option<Duration>) -> String {
    duration.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// Columns padded to their widest cell.
fn aligned(lines: &[Vec<String>]) -> String {
    let columns = lines.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            lines
                .iter()
                .filter_map(|line| line.get(column))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    lines
        .iter()
        .map(|line| {
            line.iter()
                .zip(&widths)
                .map(|(cell, &width)| format!("{cell:>width$}"))
                .collect::<Vec<_>>()
                .join("  ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn table(summaries: &[Summary]) -> String {
    let classes = CLASSES.map(|(name, _, _)| name).join("/");
    let mut lines = vec![vec![
        "setup".to_owned(),
        format!("goodput/s {classes}"),
        "offered/s".to_owned(),
        "high in SLO".to_owned(),
        format!("p99 ms {classes}"),
        "retries".to_owned(),
        "refused here".to_owned(),
        "CPU wasted".to_owned(),
        "CPU refused downstream".to_owned(),
        "stable after ms (mean, wander; a step)".to_owned(),
        "server CPU ms F/A/B".to_owned(),
    ]];
    for summary in summaries {
        let goodput: Vec<String> = summary
            .classes
            .iter()
            .map(|class| format!("{:.0}", class.goodput))
            .collect();
        let p99: Vec<String> = summary
            .classes
            .iter()
            .map(|class| millis(class.p99))
            .collect();
        let offered: f64 = summary.classes.iter().map(|class| class.offered).sum();
        lines.push(vec![
            summary.setup.name().to_owned(),
            goodput.join("/"),
            format!("{offered:.0}"),
            percent(summary.classes[0].within_slo),
            p99.join("/"),
            summary.retries.to_string(),
            summary.refused_here.to_string(),
            percent(summary.wasted_share),
            percent(summary.refused_downstream_share),
            format!(
                "{} ({} ms, {}; {})",
                millis(summary.settling.time_to_stable),
                summary.settling.window.as_millis(),
                percent(summary.settling.wander),
                millis(summary.settling.step_floor)
            ),
            summary
                .units
                .map(|micros| format!("{:.0}", micros as f64 / 1e3))
                .join("/"),
        ]);
    }
    let requests = summaries.first().map_or(0, |summary| summary.requests);
    format!(
        "{requests} requests a setup; per class over the spike's second half (3x), \
         retries and CPU over the whole run\n{}",
        aligned(&lines)
    )
}

fn find(summaries: &[Summary], setup: Setup) -> Option<&Summary> {
    summaries.iter().find(|summary| summary.setup == setup)
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

pub fn targets(summaries: &[Summary], settle: &Settle) -> String {
    let (Some(whole), Some(backends), Some(no_retries)) = (
        find(summaries, Setup::WholeLoop),
        find(summaries, Setup::BackendsOnly),
        find(summaries, Setup::BackendsOnlyNoRetries),
    ) else {
        return String::new();
    };
    let mut out = String::from("targets (whole loop, beside its baseline from this run):\n");
    let ratio = whole.goodput_total() / no_retries.goodput_total().max(f64::MIN_POSITIVE);
    let naive = backends.goodput_total() / no_retries.goodput_total().max(f64::MIN_POSITIVE);
    out += &format!(
        "  goodput at 3x, retrying clients, >= 90% of no retries: {:.0}/s = {} of {:.0}/s \
         (backends-only with naive retries: {}; timeline mean {:.0}/s): {}\n",
        whole.goodput_total(),
        percent(ratio),
        no_retries.goodput_total(),
        percent(naive),
        whole.settling.steady,
        verdict(ratio >= 0.9)
    );
    out += &format!(
        "  CPU spent on work refused downstream < 5%: {} (backends-only: {}): {}\n",
        percent(whole.refused_downstream_share),
        percent(backends.refused_downstream_share),
        verdict(whole.refused_downstream_share < 0.05)
    );
    let (high, baseline) = (
        whole.classes[0].within_slo,
        no_retries.classes[0].within_slo,
    );
    out += &format!(
        "  high class within its SLO at least as often as backends-only without retries: \
         {} against {}: {}\n",
        percent(high),
        percent(baseline),
        verdict(high >= baseline)
    );
    let allowance = whole.retry_allowance.unwrap_or(0.0);
    out += &format!(
        "  retries sent at most the budget: {} sent, the budgets allowed {:.0} \
         (naive clients, backends-only: {}): {}\n",
        whole.retries,
        allowance,
        backends.retries,
        verdict(whole.retries as f64 <= allowance)
    );
    let Settle { spikes, settling } = settle;
    let stable = settling.time_to_stable;
    // A band narrower than the smoothed goodput's own wander is entered
    // and left by noise: the first entry is no settling time.
    let resolved = settling.wander <= BAND;
    out += &format!(
        "  goodput within 10% of its 3x value under 50 ms after the spike: first within \
         10% after {} ms, through a {} ms trailing mean of {} spikes averaged that wanders \
         {} around its mean at 3x (an instant step between the same goodputs reads {} ms \
         through it; the single spike above: {} ms through {} ms, wander {}): {}\n",
        millis(stable),
        settling.window.as_millis(),
        spikes,
        percent(settling.wander),
        millis(settling.step_floor),
        millis(whole.settling.time_to_stable),
        whole.settling.window.as_millis(),
        percent(whole.settling.wander),
        if resolved {
            verdict(stable.is_some_and(|stable| stable < Duration::from_millis(50)))
        } else {
            "not resolved at this rate (the band is inside the wander)"
        }
    );
    out += "  headers under 5% of the refusal path: measured by examples/refusal_cost.rs\n";
    out
}

pub fn plot(path: &Path, summaries: &[Summary], settings: &Settings) -> Result<(), String> {
    let drawing = |error: &dyn std::fmt::Display| format!("drawing the goodput chart: {error}");
    let bin = settings.bin.as_secs_f64();
    let width = ((SMOOTHING.as_secs_f64() / bin).round() as usize).max(1);
    let lines: Vec<(&str, Vec<(f64, f64)>)> = summaries
        .iter()
        .map(|summary| {
            let points = (0..summary.timeline.len())
                .map(|at| {
                    let from = (at + 1).saturating_sub(width);
                    let mean =
                        summary.timeline[from..=at].iter().sum::<f64>() / (at + 1 - from) as f64;
                    ((at + 1) as f64 * bin, mean)
                })
                .collect();
            (summary.setup.name(), points)
        })
        .collect();
    let x_to = settings.phases.length().as_secs_f64();
    let y_to = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|&(_, y)| y))
        .fold(settings.capacity(), f64::max)
        * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1024, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| drawing(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "fleet: goodput through a 3x spike (100 ms trailing mean)",
                ("sans-serif", 24),
            )
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_to, 0.0..y_to)
            .map_err(|e| drawing(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("successes within the SLO per second")
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| drawing(&e))?;
        for at in [settings.phases.spike_start(), settings.phases.spike_end()] {
            let x = at.as_secs_f64();
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(x, 0.0), (x, y_to)],
                    BLACK.mix(0.3).stroke_width(1),
                )))
                .map_err(|e| drawing(&e))?;
        }
        for (index, (name, points)) in lines.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| drawing(&e))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(|e| drawing(&e))?;
        root.present().map_err(|e| drawing(&e))?;
    }
    std::fs::write(path, svg).map_err(|error| format!("writing {}: {error}", path.display()))
}
