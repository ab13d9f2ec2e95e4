//! The scenarios: which load, which systems, which figures.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use admission::observe::Refusals;
use admission::{Priority, TenantId, TenantWeight};
use serde_json::json;

use crate::load::{Awaits, Dispatch, Handler, Stream};
use crate::report::{self, plot_p99_over_time, Series, SummaryRow};
use crate::runner::{self, run, Background, Bench, Class, RunResult, RunSpec, RuntimeSetup};
use crate::stats::{self, Outcome, Record};
use crate::systems::System;

/// The scenarios by name, in the order `all` runs them.
pub const NAMES: [&str; 18] = [
    "w2",
    "w1",
    "w3a",
    "w3b",
    "w3c",
    "w4",
    "w5",
    "w6",
    "w7",
    "w8",
    "w9",
    "w9-released",
    "w2-local",
    "w2-socket",
    "matrix",
    "w2-pool",
    "w2-pool-split",
    "w2-ideal",
];

const HIGH: Class = Class {
    name: "high",
    priority: Priority::USER_HIGH,
};
const NORMAL: Class = Class {
    name: "normal",
    priority: Priority::NORMAL,
};
const LOW: Class = Class {
    name: "low",
    priority: Priority::USER_LOW,
};

fn steady(class: usize, tenant: usize, per_sec: f64) -> Stream {
    Stream {
        class,
        tenant,
        steps: vec![(Duration::ZERO, per_sec)],
    }
}

fn is_rejected(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Rejected { .. })
}

fn is_expired(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Expired { .. })
}

/// The common figures of one run.
fn row(
    bench: &Bench,
    scenario: &str,
    system: System,
    offered_x: f64,
    spec: &RunSpec,
    result: &RunResult,
) -> SummaryRow {
    let classes = &spec.classes;
    let measured = result.measured();
    let latency_ms: BTreeMap<String, stats::Percentiles> = classes
        .iter()
        .enumerate()
        .map(|(index, class)| {
            (
                class.name.to_string(),
                stats::latency_of_class(&measured, index, result.length),
            )
        })
        .collect();
    let served: Vec<stats::ClassServed> = classes
        .iter()
        .enumerate()
        .map(|(index, class)| stats::ClassServed {
            name: class.name.to_string(),
            priority: class.priority,
            within_slo: stats::served_within_slo(&measured, index, bench.slo),
        })
        .collect();
    let mut extra = BTreeMap::new();
    extra.insert(
        "handler".into(),
        json!(spec.handler.unwrap_or(bench.handler).name()),
    );
    if system.has_controller() {
        extra.insert("signal".into(), json!(runner::signal_name(bench.signal)));
    }
    extra.insert("runtime".into(), json!(bench.runtime.name()));
    extra.insert(
        "served_within_slo".into(),
        json!(served
            .iter()
            .map(|class| (class.name.clone(), json!(class.within_slo)))
            .collect::<serde_json::Map<_, _>>()),
    );
    extra.insert(
        "expired_frac".into(),
        json!(stats::fraction(&measured, is_expired)),
    );
    // Work that ran but finished past the SLO: the CPU it took is the
    // goodput an admission decision lost (expired work cost next to none).
    extra.insert(
        "late_frac".into(),
        json!(stats::fraction(&measured, |outcome| stats::finished_late(
            outcome, bench.slo
        ))),
    );
    if let Some(busy) = result.cpu_busy {
        extra.insert("cpu_busy_frac".into(), json!(busy));
    }
    if let Some(left) = result.left_beside_arrivals {
        extra.insert("left_beside_arrivals_frac".into(), json!(left));
    }
    if !result.refusals.is_empty() {
        extra.insert("refusals".into(), refusals_json(classes, &result.refusals));
    }
    extra.insert("capacity_per_sec".into(), json!(bench.capacity));
    extra.insert("slo_ms".into(), json!(bench.slo.as_secs_f64() * 1e3));
    if let Some(&(_, last)) = result.slot_totals.last() {
        let mean = result
            .slot_totals
            .iter()
            .map(|&(_, t)| t as f64)
            .sum::<f64>()
            / result.slot_totals.len() as f64;
        extra.insert("slot_total_mean".into(), json!(mean));
        extra.insert("slot_total_last".into(), json!(last));
    }
    let goodput_frac =
        stats::goodput_per_sec(&measured, bench.slo, result.measured_len()) / bench.capacity;
    let mut invalid_reasons = Vec::new();
    if !result.valid() {
        invalid_reasons.push(format!(
            "the generator sent {:.1}% of the schedule",
            result.delivery.delivered_frac * 100.0
        ));
    }
    // The ideal scheduler's servers are as fast as C on average; on one
    // schedule's draws it may serve a little more, which says nothing
    // about the calibration.
    let simulated = matches!(system, System::Ideal { .. });
    if simulated {
        extra.insert("simulated".into(), json!(true));
    }
    if goodput_frac > 1.0 && !simulated {
        invalid_reasons.push(format!(
            "goodput {:.1}% of C: C was calibrated low",
            goodput_frac * 100.0
        ));
    }
    let valid = invalid_reasons.is_empty();
    if !valid {
        extra.insert("invalid_reasons".into(), json!(invalid_reasons));
    }
    // Only admission orders by priority: the others are blind to it, so
    // their classes fare alike up to noise, and nothing is inverted.
    let inversions = (system.orders_by_priority() && classes.len() > 1)
        .then(|| stats::priority_inversions(&served, stats::INVERSION_MARGIN));
    SummaryRow {
        scenario: scenario.into(),
        system: system.name(),
        offered_x,
        goodput_frac,
        rejected_frac: stats::fraction(&measured, is_rejected),
        latency_ms,
        jain: None,
        converge_ms: None,
        generator_late_p99_us: result.generator_late_p99_us(),
        valid,
        inversions,
        extra,
    }
}

/// Per class, why the admission queue refused its requests over the whole
/// run (warm-up included), the reasons with a count only:
/// `{"high": {"would_miss_deadline": 24, "would_miss_on_hold": 17, ...}}`.
fn refusals_json(classes: &[Class], refusals: &[(Priority, Refusals)]) -> serde_json::Value {
    let mut by_class = serde_json::Map::new();
    for class in classes {
        let Some((_, r)) = refusals.iter().find(|(p, _)| *p == class.priority) else {
            continue;
        };
        let reasons: serde_json::Map<String, serde_json::Value> = r
            .by_reason()
            .into_iter()
            .chain([("would_miss_on_hold", r.would_miss_on_hold)])
            .filter(|&(_, count)| count > 0)
            .map(|(reason, count)| (reason.to_string(), json!(count)))
            .collect();
        by_class.insert(class.name.to_string(), serde_json::Value::Object(reasons));
    }
    serde_json::Value::Object(by_class)
}

/// One line per admission row: why its queue refused requests of `class`
/// over the whole run, for the terminal under W2-like tables.
pub fn refusal_lines(rows: &[SummaryRow], class: &str) -> String {
    let mut text = String::new();
    for row in rows {
        let Some(reasons) = row
            .extra
            .get("refusals")
            .and_then(|by_class| by_class.get(class))
            .and_then(serde_json::Value::as_object)
        else {
            continue;
        };
        let listed: Vec<String> = reasons
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        let listed = if listed.is_empty() {
            "none".to_string()
        } else {
            listed.join(", ")
        };
        text.push_str(&format!(
            "{class} refused by {} (whole run): {listed}\n",
            row.system
        ));
    }
    text
}

/// p99 over time of one class, in windows, for the plots.
fn p99_series(bench: &Bench, result: &RunResult, class: usize, width: Duration) -> Vec<(f64, f64)> {
    stats::windows(
        &result.records,
        width,
        result.length,
        bench.slo,
        bench.capacity,
        Some(class),
    )
    .into_iter()
    .filter(|w| w.samples > 0)
    .map(|w| (w.start.as_secs_f64(), w.p99_ms))
    .collect()
}

fn plot(dir: &Path, scenario: &str, class: &str, series: Vec<Series>) {
    let path = dir.join(format!("{scenario}-{class}-p99.svg"));
    if let Err(error) = plot_p99_over_time(
        &path,
        &format!("{scenario}: {class} p99 over time"),
        &series,
    ) {
        eprintln!("could not draw {}: {error}", path.display());
    }
}

/// Runs every system on one spec, returning rows and per-class plot series.
fn compare(
    bench: &Bench,
    scenario: &str,
    systems: &[System],
    spec: &RunSpec,
    offered_x: f64,
    mut extra: impl FnMut(&System, &RunResult, &mut SummaryRow),
) -> Result<(Vec<SummaryRow>, Vec<Vec<Series>>), String> {
    let mut rows = Vec::new();
    let mut series: Vec<Vec<Series>> = vec![Vec::new(); spec.classes.len()];
    for &system in systems {
        eprintln!("  {scenario}: {} ...", system.name());
        let result = run(bench, system, spec)?;
        let mut summary = row(bench, scenario, system, offered_x, spec, &result);
        extra(&system, &result, &mut summary);
        for (class, lines) in series.iter_mut().enumerate() {
            lines.push(Series {
                system: system.name(),
                points: p99_series(bench, &result, class, Duration::from_millis(100)),
            });
        }
        rows.push(summary);
    }
    Ok((rows, series))
}

fn plot_all(dir: &Path, scenario: &str, classes: &[Class], series: Vec<Vec<Series>>) {
    for (class, lines) in classes.iter().zip(series) {
        plot(dir, scenario, class.name, lines);
    }
}

/// W2's load: three priority classes at 0.3, 0.7 and 2.0 × C, 3x in total.
fn w2_spec(c: f64, dispatch: Dispatch) -> RunSpec {
    let mut spec = RunSpec::new(
        vec![HIGH, NORMAL, LOW],
        vec![
            steady(0, 0, 0.3 * c),
            steady(1, 0, 0.7 * c),
            steady(2, 0, 2.0 * c),
        ],
    );
    spec.dispatch = dispatch;
    spec
}

/// The high class with nothing else to serve.
#[derive(Clone, Copy, Debug)]
struct HighAlone {
    p99_ms: f64,
    /// Served within the SLO: what the machine and harness allow at all
    /// (on a small, busy machine, some requests miss the SLO even alone).
    within_slo: f64,
}

/// The high class at its W2 rate alone, through `system`.
fn high_alone(bench: &Bench, system: System, dispatch: Dispatch) -> Result<HighAlone, String> {
    let mut alone = RunSpec::new(vec![HIGH], vec![steady(0, 0, 0.3 * bench.capacity)]);
    alone.dispatch = dispatch;
    let result = run(bench, system, &alone)?;
    let measured = result.measured();
    Ok(HighAlone {
        p99_ms: stats::latency_of_class(&measured, 0, result.length).p99_ms,
        within_slo: stats::served_within_slo(&measured, 0, bench.slo).unwrap_or(f64::NAN),
    })
}

/// The high class's figures of a W2 row, against its figures alone.
fn high_figures(alone: HighAlone, result: &RunResult, summary: &mut SummaryRow) {
    let alone_p99 = alone.p99_ms;
    summary
        .extra
        .insert("high_alone_within_slo".into(), json!(alone.within_slo));
    let measured = result.measured();
    let high: Vec<Record> = measured.iter().copied().filter(|r| r.class == 0).collect();
    let high_p99 = summary
        .latency_ms
        .get("high")
        .map_or(f64::NAN, |l| l.p99_ms);
    summary
        .extra
        .insert("high_alone_p99_ms".into(), json!(alone_p99));
    summary.extra.insert(
        "high_p99_vs_alone".into(),
        json!(high_p99 / alone_p99.max(1e-9)),
    );
    summary.extra.insert(
        "high_not_served_frac".into(),
        json!(stats::fraction(&high, |o| is_rejected(o) || is_expired(o))),
    );
}

/// W2, the headline: three priority classes at 0.3, 0.7 and 2.0 × C
/// (3x in total), every system; plus the high class alone at its rate, for
/// the "high p99 under load vs alone" figure.
pub fn w2(
    bench: &Bench,
    dir: &Path,
    systems: &[System],
    dispatch: Dispatch,
    name: &str,
) -> Result<Vec<SummaryRow>, String> {
    let spec = w2_spec(bench.capacity, dispatch);
    eprintln!("  {name}: high class alone ...");
    let alone = high_alone(bench, System::admission(), dispatch)?;
    let (rows, series) = compare(bench, name, systems, &spec, 3.0, |_, result, summary| {
        high_figures(alone, result, summary)
    })?;
    plot_all(dir, name, &spec.classes, series);
    Ok(rows)
}

/// The systems of W2-pool, in table order: the CPU pool, with the
/// caller's task handing each job over and with the threads collecting
/// their grants (each also with its threads spinning 100 µs before they
/// sleep, where they have cores of their own: `spin`), then what users
/// would otherwise reach for, each with `threads` threads (as many as the runtime has workers: C is the
/// runtime's capacity); `no-admission` computing on the workers, and the
/// ideal non-preemptive scheduler of `threads` servers (`ideal.rs`), for
/// reference.
pub fn pool_systems(threads: usize, spin: bool) -> Vec<System> {
    let spins: &[u64] = if spin { &[0, 100] } else { &[0] };
    let mut pools = Vec::new();
    for collect in [false, true] {
        for &spin_us in spins {
            pools.push(System::Pool {
                threads,
                spin_us,
                collect,
            });
        }
    }
    pools.extend([
        System::BlockingSemaphore { limit: threads },
        System::Rayon { threads },
        System::NoAdmission,
        System::Ideal { servers: threads },
    ]);
    pools
}

/// W2-pool: W2 at 3x with handlers that never yield, their computation
/// moved off the workers: through the CPU pool (the admission queue is its
/// only queue), `spawn_blocking` behind a semaphore, and rayon with a
/// oneshot; plus the high class alone at its rate through the pool, for
/// every row's "high p99 under load vs alone" (the ideal scheduler's row
/// against the ideal scheduler's own run alone, so that its ratio is the
/// price of non-preemption itself). Whatever `--handler` says,
/// handlers never yield; `bench` should be calibrated for that (see
/// `main.rs`). W2-pool-split (`name`) runs the same on a runtime of half
/// the workers with as many pool threads (one and one by default), so that
/// each thread has a core of its own, and C is those workers'.
pub fn w2_pool(
    bench: &Bench,
    dir: &Path,
    systems: &[System],
    name: &str,
) -> Result<Vec<SummaryRow>, String> {
    let bench = Bench {
        handler: Handler::NEVER_YIELDS,
        ..bench.clone()
    };
    let spec = w2_spec(bench.capacity, Dispatch::Remote);
    eprintln!("  {name}: high class alone through the pool ...");
    let alone = high_alone(
        &bench,
        System::Pool {
            threads: bench.workers,
            spin_us: 0,
            collect: false,
        },
        Dispatch::Remote,
    )?;
    let ideal_alone = high_alone(
        &bench,
        System::Ideal {
            servers: bench.workers,
        },
        Dispatch::Remote,
    )?;
    let (rows, series) = compare(
        &bench,
        name,
        systems,
        &spec,
        3.0,
        |system, result, summary| {
            let alone = if matches!(system, System::Ideal { .. }) {
                ideal_alone
            } else {
                alone
            };
            high_figures(alone, result, summary)
        },
    )?;
    plot_all(dir, name, &spec.classes, series);
    Ok(rows)
}

/// The servers W2-ideal simulates, fewest first.
pub const IDEAL_SERVERS: [usize; 9] = [1, 2, 3, 4, 6, 8, 12, 16, 32];

/// W2-ideal: what non-preemptive scheduling allows at all on N cores, for
/// N in [`IDEAL_SERVERS`]. W2 at 3x through the ideal scheduler of N
/// servers (simulated, nothing run: see `ideal.rs`), whose C is N requests
/// per mean service time, beside the high class alone through the same
/// scheduler; one row per N, with the high class's figures against its
/// own alone. W2-pool's targets for work that never yields (p99 within
/// 1.1x alone) are about the pool, but where non-preemption alone costs
/// more than that, no pool can meet them: this says from how many cores
/// on non-preemption leaves room under them. It needs no calibration of
/// its own and no cores.
pub fn w2_ideal(bench: &Bench) -> Result<Vec<SummaryRow>, String> {
    let mut rows = Vec::new();
    for servers in IDEAL_SERVERS {
        let sized = Bench {
            workers: servers,
            capacity: servers as f64 / bench.mean_service.as_secs_f64(),
            handler: Handler::NEVER_YIELDS,
            ..bench.clone()
        };
        let system = System::Ideal { servers };
        let spec = w2_spec(sized.capacity, Dispatch::Remote);
        let alone = high_alone(&sized, system, Dispatch::Remote)?;
        let result = run(&sized, system, &spec)?;
        let mut summary = row(&sized, "w2-ideal", system, 3.0, &spec, &result);
        high_figures(alone, &result, &mut summary);
        rows.push(summary);
    }
    Ok(rows)
}

/// W2-ideal's own figures: per N, the high class within its SLO under
/// load and alone, and its p99 against its p99 alone.
pub fn w2_ideal_table(rows: &[SummaryRow]) -> String {
    let mut lines = vec![[
        "servers",
        "goodput",
        "high in SLO",
        "alone",
        "high p99 x alone",
    ]
    .map(String::from)
    .to_vec()];
    let percent =
        |fraction: Option<f64>| fraction.map_or("-".to_string(), |f| format!("{:.2}%", f * 100.0));
    for row in rows {
        lines.push(vec![
            row.system.clone(),
            percent(Some(row.goodput_frac)),
            percent(row.within_slo("high")),
            percent(row.extra_f64("high_alone_within_slo")),
            row.extra_f64("high_p99_vs_alone")
                .map_or("-".to_string(), |x| format!("{x:.3}x")),
        ]);
    }
    let mut text = report::aligned(&lines);
    text.push_str(
        "simulated: a non-preemptive priority scheduler of N servers with no hand-off cost, \
         C = N / mean service; the price of non-preemption, not of any implementation\n",
    );
    text
}

/// The handler styles of the matrix, in table order.
pub const MATRIX_STYLES: [Handler; 5] = [
    Handler::YIELD,
    Handler::SELF_WAKE,
    Handler::MUTEX,
    Handler::IO,
    Handler::IO_RELEASED,
];

/// The matrix: W2 at 3x through `admission-defaults` (a controller built
/// with nothing but `Controller::for_runtime(..).build()`, what the
/// targets are about) in every handler style of [`MATRIX_STYLES`], with
/// every signal this build has (stable always, unstable with
/// `tokio_unstable`) on both runtimes ([`RuntimeSetup::ALL`]: tokio's
/// defaults and `configure_runtime`), whatever `--handler`, `--signal`
/// and `--runtime` say. Per cell, the high class alone for its p99 ratio;
/// per style and runtime, `admission-fixed` (a fixed total of one slot a
/// worker, which reads no signal) for the goodput adaptivity has to match.
/// Every cell is measured against the run's one C and has W2's run length
/// (about 40 runs in all). No p99-over-time plots: the table is the
/// result.
pub fn matrix(bench: &Bench) -> Result<Vec<SummaryRow>, String> {
    let spec = w2_spec(bench.capacity, Dispatch::Remote);
    let fixed_total = System::admission_fixed("admission-fixed", bench.workers as u64);
    let mut rows = Vec::new();
    for handler in MATRIX_STYLES {
        for runtime in RuntimeSetup::ALL {
            let style = Bench {
                handler,
                runtime,
                ..bench.clone()
            };
            let name = format!("{}, {}", handler.name(), runtime.name());
            // The fixed total runs before and after the style's cells: on a
            // shared machine C drifts by several percent over minutes, and
            // the cells are judged against the mean of the two, with how far
            // the fixed total itself moved in between beside it.
            let run_fixed = |when: &str| -> Result<SummaryRow, String> {
                eprintln!("  matrix: {name}: {} ({when}) ...", fixed_total.name());
                let result = run(&style, fixed_total, &spec)?;
                let mut fixed = row(&style, "matrix", fixed_total, 3.0, &spec, &result);
                fixed.extra.insert("bracket".into(), json!(when));
                Ok(fixed)
            };
            let before = run_fixed("before")?;
            let mut cells = Vec::new();
            for signal in runner::signals_in_this_build() {
                let cell = Bench {
                    signal,
                    ..style.clone()
                };
                let signal = runner::signal_name(signal);
                eprintln!("  matrix: {name}, {signal}: high class alone ...");
                let alone = high_alone(&cell, System::admission(), Dispatch::Remote)?;
                let system = System::AdmissionDefaults;
                eprintln!("  matrix: {name}, {signal}: {} ...", system.name());
                let result = run(&cell, system, &spec)?;
                let mut summary = row(&cell, "matrix", system, 3.0, &spec, &result);
                high_figures(alone, &result, &mut summary);
                cells.push(summary);
            }
            let after = run_fixed("after")?;
            let mean = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => Some((a + b) / 2.0),
                (one, other) => one.or(other),
            };
            for mut summary in cells {
                let extra = &mut summary.extra;
                extra.insert(
                    "fixed_total_goodput_frac".into(),
                    json!((before.goodput_frac + after.goodput_frac) / 2.0),
                );
                extra.insert(
                    "fixed_total_goodput_before".into(),
                    json!(before.goodput_frac),
                );
                extra.insert(
                    "fixed_total_goodput_after".into(),
                    json!(after.goodput_frac),
                );
                extra.insert(
                    "fixed_total_high_within_slo".into(),
                    json!(mean(before.within_slo("high"), after.within_slo("high"))),
                );
                rows.push(summary);
            }
            rows.push(before);
            rows.push(after);
        }
    }
    Ok(rows)
}

/// The matrix as one table: a line per handler style, runtime and signal, with
/// `admission-defaults`' goodput, the high class served within the SLO, its p99
/// under load against alone, and the fixed total's goodput in the same
/// style; then any priority inversion, and the signals this build lacks.
pub fn matrix_table(rows: &[SummaryRow], workers: usize) -> String {
    let figure = |row: &SummaryRow, key: &str| row.extra_f64(key).unwrap_or(f64::NAN);
    let text = |row: &SummaryRow, key: &str| row.extra_str(key).unwrap_or("-").to_string();
    let percent = |fraction: f64| {
        if fraction.is_finite() {
            format!("{:.1}%", fraction * 100.0)
        } else {
            "-".to_string()
        }
    };
    let fixed_total = format!("fixed total ({workers}) goodput (before / after)");
    let mut lines = vec![[
        "handler",
        "runtime",
        "signal",
        "goodput",
        "high in SLO",
        "alone",
        "fixed",
        "high p99 ms",
        "x alone",
        &fixed_total,
        "prio",
        "valid",
    ]
    .map(String::from)
    .to_vec()];
    for row in rows.iter().filter(|row| row.system == "admission-defaults") {
        let high_in_slo = row.within_slo("high").unwrap_or(f64::NAN);
        lines.push(vec![
            text(row, "handler"),
            text(row, "runtime"),
            text(row, "signal"),
            percent(row.goodput_frac),
            percent(high_in_slo),
            percent(figure(row, "high_alone_within_slo")),
            percent(figure(row, "fixed_total_high_within_slo")),
            row.latency_ms
                .get("high")
                .map_or("-".to_string(), |l| format!("{:.2}", l.p99_ms)),
            format!("{:.2}", figure(row, "high_p99_vs_alone")),
            format!(
                "{} ({} / {})",
                percent(figure(row, "fixed_total_goodput_frac")),
                percent(figure(row, "fixed_total_goodput_before")),
                percent(figure(row, "fixed_total_goodput_after")),
            ),
            report::priority_cell(row),
            if row.valid { "ok" } else { "INVALID" }.to_string(),
        ]);
    }
    let mut table = report::aligned(&lines);
    table.push_str(&report::inversion_lines(rows));
    table.push_str(&format!(
        "goodput: completions within the SLO / C; high in SLO: high-priority requests \
         completed within the SLO / scheduled\n(alone: with the high class alone, the machine's own limit; fixed: through the fixed total);\nx alone: high p99 / high p99 with the high \
         class alone; fixed total: admission with {workers} slots (no signal), same handler and runtime,\n\
         run before and after the style's cells: their mean, then each (how far C drifted meanwhile);\n\
         runtime: tokio's defaults, or built through admission::cpu::configure_runtime\n"
    ));
    if !cfg!(tokio_unstable) {
        table.push_str("unstable: not in this build (it needs --cfg tokio_unstable)\n");
    }
    table
}

/// W1: one class, offered at 0.5x to 4x C, with a fixed total of one slot
/// per worker beside the controller (the best fixed total on W2), and
/// `refuse-all` for the most any system could serve at each load.
pub fn w1(
    bench: &Bench,
    dir: &Path,
    quick: bool,
    selected: &dyn Fn(&System) -> bool,
) -> Result<Vec<SummaryRow>, String> {
    let loads: &[f64] = if quick {
        &[0.5, 2.0, 4.0]
    } else {
        &[0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    };
    let systems = [
        System::RefuseAll,
        System::NoAdmission,
        System::SemaphoreWait {
            limit: bench.workers,
        },
        System::TowerShed {
            limit: bench.workers,
        },
        System::admission(),
        System::AdmissionDefaults,
        System::admission_fixed("admission-fixed", bench.workers as u64),
        System::Ideal {
            servers: bench.workers,
        },
    ]
    .into_iter()
    .filter(|system| selected(system))
    .collect::<Vec<_>>();
    let mut rows = Vec::new();
    let mut heaviest = Vec::new();
    for &x in loads {
        let spec = RunSpec::new(vec![NORMAL], vec![steady(0, 0, x * bench.capacity)]);
        let (mut found, series) =
            compare(bench, &format!("w1@{x}x"), &systems, &spec, x, |_, _, _| {})?;
        for row in &mut found {
            row.scenario = "w1".into();
        }
        rows.extend(found);
        heaviest = series;
    }
    // The plot shows the heaviest load of the sweep.
    let top = loads.last().copied().unwrap_or_default();
    plot_all(dir, &format!("w1-{top}x"), &[NORMAL], heaviest);
    Ok(rows)
}

/// Per-tenant figures: completions within the SLO per second, by tenant.
fn tenant_goodput(result: &RunResult, slo: Duration, tenants: usize) -> Vec<f64> {
    let measured = result.measured();
    let seconds = result.measured_len().as_secs_f64().max(1e-9);
    (0..tenants)
        .map(|tenant| {
            measured
                .iter()
                .filter(|r| r.tenant == tenant)
                .filter(|r| matches!(r.outcome, Outcome::Completed { latency } if latency <= slo))
                .count() as f64
                / seconds
        })
        .collect()
}

fn tenant_systems(workers: usize) -> Vec<System> {
    vec![
        System::NoAdmission,
        System::SemaphoreWait { limit: workers },
        System::admission(),
    ]
}

/// W3a: four equal-weight tenants demanding 1:2:4:8, 2x C in total.
pub fn w3a(bench: &Bench, dir: &Path) -> Result<Vec<SummaryRow>, String> {
    let c = bench.capacity;
    let demand: Vec<f64> = [1.0, 2.0, 4.0, 8.0]
        .iter()
        .map(|d| 2.0 * c * d / 15.0)
        .collect();
    let streams = (0..4).map(|t| steady(0, t, demand[t])).collect();
    let spec = RunSpec::new(vec![NORMAL], streams);
    let fair = stats::weighted_max_min(&demand, &[1.0; 4], c);
    let (rows, series) = compare(
        bench,
        "w3a",
        &tenant_systems(bench.workers),
        &spec,
        2.0,
        |_, result, summary| {
            let got = tenant_goodput(result, bench.slo, 4);
            summary.jain = Some(stats::jain(&got, &fair));
            summary
                .extra
                .insert("tenant_goodput_per_sec".into(), json!(got));
            summary
                .extra
                .insert("tenant_fair_share_per_sec".into(), json!(fair));
        },
    )?;
    plot_all(dir, "w3a", &[NORMAL], series);
    Ok(rows)
}

/// W3b: weights 1:1:2:4, every tenant backlogged (each offers 2x C / 4).
pub fn w3b(bench: &Bench, dir: &Path) -> Result<Vec<SummaryRow>, String> {
    let c = bench.capacity;
    let weights = [1u32, 1, 2, 4];
    let streams = (0..4).map(|t| steady(0, t, 0.5 * c)).collect();
    let mut spec = RunSpec::new(vec![NORMAL], streams);
    spec.weights = weights
        .iter()
        .enumerate()
        .map(|(t, &w)| {
            (
                TenantId::new(t as u64 + 1),
                TenantWeight::new(w).expect("valid weight"),
            )
        })
        .collect();
    let weights_f: Vec<f64> = weights.iter().map(|&w| f64::from(w)).collect();
    let fair = stats::weighted_max_min(&[0.5 * c; 4], &weights_f, c);
    let (rows, series) = compare(
        bench,
        "w3b",
        &tenant_systems(bench.workers),
        &spec,
        2.0,
        |_, result, summary| {
            let got = tenant_goodput(result, bench.slo, 4);
            let total: f64 = got.iter().sum();
            let shares: Vec<f64> = got.iter().map(|g| g / total.max(1e-9)).collect();
            let worst = shares
                .iter()
                .zip(&weights_f)
                .map(|(share, w)| (share - w / 8.0).abs() / (w / 8.0))
                .fold(0.0, f64::max);
            summary.jain = Some(stats::jain(&got, &fair));
            summary.extra.insert("tenant_share".into(), json!(shares));
            summary
                .extra
                .insert("worst_share_error".into(), json!(worst));
        },
    )?;
    plot_all(dir, "w3b", &[NORMAL], series);
    Ok(rows)
}

/// W3c: a noisy neighbour at 5x its fair share, three others at 0.5x.
pub fn w3c(bench: &Bench, dir: &Path) -> Result<Vec<SummaryRow>, String> {
    let c = bench.capacity;
    let fair = c / 4.0;
    let demand = [5.0 * fair, 0.5 * fair, 0.5 * fair, 0.5 * fair];
    let streams = (0..4).map(|t| steady(0, t, demand[t])).collect();
    let spec = RunSpec::new(vec![NORMAL], streams);
    let offered = demand.iter().sum::<f64>() / c;
    let (rows, series) = compare(
        bench,
        "w3c",
        &tenant_systems(bench.workers),
        &spec,
        offered,
        |_, result, summary| {
            let got = tenant_goodput(result, bench.slo, 4);
            let victims = (1..4).map(|t| got[t] / demand[t]).fold(f64::MAX, f64::min);
            summary
                .extra
                .insert("victim_min_demand_frac".into(), json!(victims));
            summary
                .extra
                .insert("tenant_goodput_per_sec".into(), json!(got));
        },
    )?;
    plot_all(dir, "w3c", &[NORMAL], series);
    Ok(rows)
}

/// W4: 0.7x C, then a 3x spike, then 0.7x again; statistics in 10 ms
/// windows for convergence, overshoot and recovery.
pub fn w4(bench: &Bench, dir: &Path, quick: bool) -> Result<Vec<SummaryRow>, String> {
    let c = bench.capacity;
    let phase = if quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let (spike_start, spike_end) = (phase, 2 * phase);
    let steps = |share: f64| {
        vec![
            (Duration::ZERO, 0.7 * c * share),
            (spike_start, 3.0 * c * share),
            (spike_end, 0.7 * c * share),
        ]
    };
    let classes = vec![HIGH, NORMAL];
    let mut spec = RunSpec::new(
        classes.clone(),
        vec![
            Stream {
                class: 0,
                tenant: 0,
                steps: steps(0.3),
            },
            Stream {
                class: 1,
                tenant: 0,
                steps: steps(0.7),
            },
        ],
    );
    spec.length = Some(3 * phase);
    let systems = [
        System::NoAdmission,
        System::SemaphoreWait {
            limit: bench.workers,
        },
        System::admission(),
        System::AdmissionDefaults,
        System::admission_fixed("admission-fixed", bench.workers as u64),
    ];
    let window = Duration::from_millis(10);
    let (rows, series) = compare(bench, "w4", &systems, &spec, 3.0, |_, result, summary| {
        let windows = stats::windows(
            &result.records,
            window,
            result.length,
            bench.slo,
            c,
            Some(0),
        );
        let before: Vec<Record> = result
            .records
            .iter()
            .copied()
            .filter(|r| r.class == 0 && r.intended >= phase / 2 && r.intended < spike_start)
            .collect();
        let baseline = stats::latency_of_class(&before, 0, result.length).p99_ms;
        let found = stats::convergence(&windows, spike_start, spike_end, baseline);
        summary.converge_ms = found.converge_ms;
        if let Some(spike) = stats::total_in_spike(&result.slot_totals, spike_start, spike_end) {
            summary
                .extra
                .insert("total_reached_ms".into(), json!(spike.reached_ms));
            summary
                .extra
                .insert("total_operating_point".into(), json!(spike.operating_point));
            summary
                .extra
                .insert("total_above_after".into(), json!(spike.above_after));
        }
        let series: Vec<(f64, u64)> = result
            .slot_totals
            .iter()
            .map(|&(at, total)| (at.as_secs_f64() * 1e3, total))
            .collect();
        summary.extra.insert("slot_totals".into(), json!(series));
        if let Some(&(_, before)) = result
            .slot_totals
            .iter()
            .rev()
            .find(|&&(at, _)| at < spike_start)
        {
            summary
                .extra
                .insert("total_before_spike".into(), json!(before));
        }
        summary
            .extra
            .insert("baseline_high_p99_ms".into(), json!(baseline));
        summary.extra.insert(
            "overshoot_high_p99_ms".into(),
            json!(found.overshoot_p99_ms),
        );
        summary
            .extra
            .insert("recovery_ms".into(), json!(found.recovery_ms));
    })?;
    plot_all(dir, "w4", &classes, series);
    Ok(rows)
}

/// W5: a latency-sensitive foreground at 0.5x C beside a bulk job of eight
/// closed-loop workers with 5 ms chunks (elastic priority) that alone
/// would saturate the CPU. Both are the same tenant's work (a service and
/// its own background job): priority orders work within a tenant, while
/// across tenants fair share comes first.
///
/// Run twice: with a bulk job that holds its slot through each 5 ms chunk,
/// beside fixed totals of one and two slots per worker (the trade the
/// elastic share makes: bulk work at half of 2 slots cannot use the CPU
/// the foreground leaves, at half of 4 it shares workers with the
/// foreground); and with a bulk job that gives its slot to the foreground
/// between its 50 µs pieces (`SlotPermit::give_way`), rows marked
/// `+give-way`, under the default share and with the whole total open to
/// it.
pub fn w5(bench: &Bench, dir: &Path) -> Result<Vec<SummaryRow>, String> {
    let c = bench.capacity;
    let classes = vec![NORMAL];
    let foreground = vec![steady(0, 0, 0.5 * c)];
    let alone = run(
        bench,
        System::admission(),
        &RunSpec::new(classes.clone(), foreground.clone()),
    )?;
    let alone_p99 = stats::latency_of_class(&alone.measured(), 0, alone.length).p99_ms;
    let mut holding = RunSpec::new(classes.clone(), foreground);
    let chunk = Duration::from_millis(5);
    let bulk = Background {
        workers: 8,
        chunk,
        priority: Priority::BULK_NORMAL,
        tenant: TenantId::new(1),
        gives_way: false,
    };
    holding.background = Some(bulk);
    let mut giving_way = holding.clone();
    giving_way.background = Some(Background {
        gives_way: true,
        ..bulk
    });
    let mut extra = |_: &System, result: &RunResult, summary: &mut SummaryRow| {
        let p99 = summary.latency_ms["normal"].p99_ms;
        let bulk_per_sec = result.background_done as f64 / result.measured_len().as_secs_f64();
        // Leftover CPU: half the capacity, in seconds of work per second.
        let leftover = 0.5 * c * bench.mean_service.as_secs_f64();
        summary
            .extra
            .insert("foreground_alone_p99_ms".into(), json!(alone_p99));
        summary.extra.insert(
            "foreground_p99_vs_alone".into(),
            json!(p99 / alone_p99.max(1e-9)),
        );
        summary.extra.insert(
            "bulk_share_of_leftover".into(),
            json!(bulk_per_sec * chunk.as_secs_f64() / leftover),
        );
    };
    let holders = [
        System::NoAdmission,
        System::SemaphoreWait {
            limit: bench.workers,
        },
        System::admission(),
        System::AdmissionDefaults,
        System::admission_fixed("admission-fixed", bench.workers as u64),
        System::admission_fixed("admission-fixed-2x", 2 * bench.workers as u64),
    ];
    let (mut rows, mut series) = compare(bench, "w5", &holders, &holding, 0.5, &mut extra)?;
    let givers = [
        System::AdmissionDefaults,
        System::admission().with_elastic_share("admission-share-1", 1.0),
        System::admission_fixed("admission-fixed", bench.workers as u64)
            .with_elastic_share("admission-fixed-share-1", 1.0),
    ];
    let (given, given_series) = compare(bench, "w5", &givers, &giving_way, 0.5, &mut extra)?;
    rows.extend(given.into_iter().map(|mut row| {
        row.system.push_str("+give-way");
        row
    }));
    for (lines, given) in series.iter_mut().zip(given_series) {
        lines.extend(given.into_iter().map(|mut line| {
            line.system.push_str("+give-way");
            line
        }));
    }
    plot_all(dir, "w5", &classes, series);
    Ok(rows)
}

/// W6's run lengths: the LSM ingest experiment of `examples/lsm_ingest.rs`
/// (same fjall and admission settings), shorter.
#[cfg(feature = "fjall")]
pub fn w6_settings(quick: bool) -> crate::ingest::Settings {
    let mut settings = crate::ingest::Settings::full(if quick {
        Duration::from_secs(4)
    } else {
        Duration::from_secs(10)
    });
    settings.baseline = Duration::from_secs(if quick { 1 } else { 3 });
    settings
}

/// W6: IO tokens on a real LSM. A fjall database under a bulk ingest
/// (three writers, `BULK_NORMAL`) beside a foreground writer (`NORMAL`,
/// 200 small writes/s), fjall alone vs IO admission, after the foreground
/// alone for its unloaded latency; then the bulk paced, without admission,
/// at the rate admission gave it: the engine's own cost of that ingest
/// rate, which the admission row is to be read against. Figures:
/// foreground p99 vs unloaded (whole run and after the warmup), bulk MB/s,
/// max L0 runs, time in fjall's stall range. Not a CPU scenario, so the
/// calibrated capacity and SLO do not apply: goodput and rejections are
/// left empty, and there is no p99-over-time plot (`lsm_ingest` prints the
/// time series).
#[cfg(feature = "fjall")]
pub fn w6(settings: &crate::ingest::Settings) -> Result<Vec<SummaryRow>, String> {
    use crate::ingest::{self, Mode, Outcome};

    let run = |mode: Mode| {
        eprintln!("  w6: {} ...", mode.name());
        ingest::run(settings, mode, |_| {}).map_err(|error| format!("w6 {}: {error}", mode.name()))
    };
    let percentiles = |outcome: &Outcome| stats::Percentiles {
        count: outcome.foreground.len(),
        p50_ms: outcome.foreground_ms(0.5),
        p99_ms: outcome.foreground_ms(0.99),
        p999_ms: outcome.foreground_ms(0.999),
        max_ms: outcome.foreground_max_ms(),
    };
    let alone = run(Mode::Alone)?;
    let (alone_p99, alone_steady_p99) = (alone.foreground_ms(0.99), alone.steady_ms(0.99));
    let fjall_alone = run(Mode::FjallAlone)?;
    let admitted = run(Mode::Admission)?;
    let paced = run(Mode::paced_mb(admitted.bulk_mb_per_sec()))?;
    let mut rows = Vec::new();
    for (system, outcome) in [
        ("fjall-alone", fjall_alone),
        ("io-admission", admitted),
        ("paced-same-rate", paced),
    ] {
        let p99 = outcome.foreground_ms(0.99);
        let steady_p99 = outcome.steady_ms(0.99);
        let extra: BTreeMap<String, serde_json::Value> = [
            ("foreground_alone_p99_ms", json!(alone_p99)),
            ("foreground_p99_vs_alone", json!(p99 / alone_p99.max(1e-3))),
            ("foreground_steady_p99_ms", json!(steady_p99)),
            (
                "foreground_steady_p99_vs_alone",
                json!(steady_p99 / alone_steady_p99.max(1e-3)),
            ),
            ("bulk_mb_per_sec", json!(outcome.bulk_mb_per_sec())),
            ("max_l0_runs", json!(outcome.max_l0_runs)),
            ("max_l0_tables", json!(outcome.max_l0_tables)),
            ("stall_s", json!(outcome.stall_time.as_secs_f64())),
            ("halt_s", json!(outcome.halt_time.as_secs_f64())),
            ("warmup_s", json!(settings.warmup.as_secs_f64())),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect();
        rows.push(SummaryRow {
            scenario: "w6".into(),
            system: system.into(),
            offered_x: f64::NAN,
            goodput_frac: f64::NAN,
            rejected_frac: f64::NAN,
            latency_ms: BTreeMap::from([("foreground".to_string(), percentiles(&outcome))]),
            jain: None,
            converge_ms: None,
            generator_late_p99_us: 0.0,
            valid: outcome.foreground_errors == 0,
            inversions: None,
            extra,
        });
    }
    Ok(rows)
}

/// W6's own figures, one line per system, for the terminal.
/// W5's own columns: what the bulk job got and what the foreground paid.
pub fn w5_table(rows: &[SummaryRow]) -> String {
    let figure = |row: &SummaryRow, key: &str| row.extra_f64(key).unwrap_or(f64::NAN);
    let mut text = format!(
        "\n{:<34} {:>22} {:>21} {:>9}\n",
        "system", "bulk share of leftover", "foreground p99/alone", "CPU busy"
    );
    for row in rows {
        text.push_str(&format!(
            "{:<34} {:>21.1}% {:>20.2}x {:>8.1}%\n",
            row.system,
            100.0 * figure(row, "bulk_share_of_leftover"),
            figure(row, "foreground_p99_vs_alone"),
            100.0 * figure(row, "cpu_busy_frac"),
        ));
    }
    text
}

pub fn w6_table(rows: &[SummaryRow]) -> String {
    let figure = |row: &SummaryRow, key: &str| row.extra_f64(key).unwrap_or(f64::NAN);
    let mut text = format!(
        "{:<15} {:>11} {:>14} {:>10} {:>11} {:>8}\n",
        "system", "p99 x alone", "steady x alone", "bulk MB/s", "max L0 runs", "stall s"
    );
    for row in rows {
        text.push_str(&format!(
            "{:<15} {:>11.1} {:>14.1} {:>10.1} {:>11.0} {:>8.1}\n",
            row.system,
            figure(row, "foreground_p99_vs_alone"),
            figure(row, "foreground_steady_p99_vs_alone"),
            figure(row, "bulk_mb_per_sec"),
            figure(row, "max_l0_runs"),
            figure(row, "stall_s"),
        ));
    }
    text
}

/// W8 and W9: the W2 mix with handlers whose bottleneck is not the CPU
/// (a shared async mutex) or that wait on IO between chunks; between
/// awaits they compute and yield as `--handler` says (`yield_now` by
/// default). W9-released is W9 with handlers that give their slot back
/// during the wait (`SlotPermit::release_during`). Both the controller's
/// defaults (what a user gets) and the policies set by hand run, beside
/// the fixed totals they are judged against.
pub fn w2_variant(
    bench: &Bench,
    dir: &Path,
    name: &str,
    awaits: Awaits,
) -> Result<Vec<SummaryRow>, String> {
    let classes = vec![HIGH, NORMAL, LOW];
    let mut spec = w2_spec(bench.capacity, Dispatch::Remote);
    spec.handler = Some(bench.handler.awaiting(awaits));
    let systems = [
        System::NoAdmission,
        System::SemaphoreWait {
            limit: bench.workers,
        },
        System::admission(),
        System::AdmissionDefaults,
        System::admission_fixed("admission-fixed", bench.workers as u64),
        System::admission_fixed("admission-fixed-32", 32),
    ];
    let (rows, series) = compare(bench, name, &systems, &spec, 3.0, |_, _, _| {})?;
    plot_all(dir, name, &classes, series);
    Ok(rows)
}

/// W7's run length: the arrival window (the drain comes after it).
pub fn w7_settings(quick: bool) -> crate::gpu::Settings {
    crate::gpu::Settings::full(if quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    })
}

/// W7: GPU query admission on a simulated pool of devices under 3x demand
/// (see `gpu.rs`): the query service with an overtake budget, the same
/// with overtaking unbounded, and per-device slot semaphores. Not a CPU
/// scenario: goodput is completions over the pool's estimated sustainable
/// throughput, latencies are admission waits from the intended arrival,
/// and there is no p99-over-time plot.
pub fn w7(settings: &crate::gpu::Settings) -> Result<Vec<SummaryRow>, String> {
    crate::gpu::System::ALL
        .into_iter()
        .map(|system| {
            eprintln!("  w7: {} ...", system.name());
            Ok(w7_row(
                settings,
                system,
                &crate::gpu::run(settings, system)?,
            ))
        })
        .collect()
}

/// One W7 system's row: the standard figures and W7's own as extras.
pub fn w7_row(
    settings: &crate::gpu::Settings,
    system: crate::gpu::System,
    outcome: &crate::gpu::Outcome,
) -> SummaryRow {
    use crate::gpu::{CLASSES, LARGE, SMALL};

    let option = |value: Option<f64>| value.map_or(serde_json::Value::Null, |v| json!(v));
    let extra: BTreeMap<String, serde_json::Value> = [
        ("sustainable_per_sec", json!(outcome.sustainable_per_sec)),
        ("arrivals_small", json!(outcome.arrivals[SMALL])),
        ("arrivals_large", json!(outcome.arrivals[LARGE])),
        ("completed_small", json!(outcome.completed[SMALL])),
        ("completed_large", json!(outcome.completed[LARGE])),
        ("large_success_frac", json!(outcome.large_success())),
        (
            "over_commit_admissions",
            json!(outcome.over_commit_admissions),
        ),
        ("over_slot_admissions", json!(outcome.over_slot_admissions)),
        ("max_held_ratio", json!(outcome.max_held_ratio)),
        ("ledger_max_ratio", option(outcome.ledger_max_ratio)),
        ("ledger_violations", json!(outcome.ledger_violations)),
        ("byte_util", json!(outcome.byte_util)),
        ("slot_util", json!(outcome.slot_util)),
        ("samples", json!(outcome.samples)),
        (
            "max_overtakes_sampled",
            json!(outcome.max_overtakes.map(u64::from)),
        ),
        (
            "max_overtakes_large_sampled",
            json!(outcome.max_overtakes_large.map(u64::from)),
        ),
        ("protections", json!(outcome.protections)),
        (
            "max_overtakes_at_protection",
            json!(outcome.max_overtakes_at_protection),
        ),
        (
            "refusals",
            json!({
                "small": outcome.refusals[SMALL],
                "large": outcome.refusals[LARGE],
            }),
        ),
        ("settle_mismatches", json!(outcome.settle_mismatches)),
        ("ledgers_clear", json!(outcome.ledgers_clear)),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect();
    let arrivals = outcome.arrivals[SMALL] + outcome.arrivals[LARGE];
    SummaryRow {
        scenario: "w7".into(),
        system: system.name().into(),
        offered_x: settings.offered_x,
        goodput_frac: outcome.goodput_frac(),
        rejected_frac: outcome.refused_frac(),
        latency_ms: CLASSES
            .iter()
            .enumerate()
            .map(|(class, name)| (name.to_string(), outcome.wait(class)))
            .collect(),
        jain: None,
        converge_ms: None,
        generator_late_p99_us: outcome.generator_late_p99_us,
        // Trustworthy when every scheduled query settled.
        valid: outcome.settled == arrivals,
        // Not a priority queue: small and large are sizes, not priorities.
        inversions: None,
        extra,
    }
}

/// W4's spike figures under its table, a line per system: the windows'
/// convergence (goodput and p99 back, which has a floor set by the
/// machine: the fixed total shows it), and for a controller, its slot total
/// before the spike, how long it took to come down to its operating point
/// in the spike, and how often it probed above it afterwards.
pub fn w4_table(rows: &[SummaryRow]) -> String {
    let millis = |value: Option<f64>| value.map_or("never".to_string(), |ms| format!("{ms:.0} ms"));
    let mut text = String::from(
        "spike: windows converged (goodput >= 90% and p99 <= 1.5x before); controller's total\n",
    );
    for row in rows {
        let controller = match (
            row.extra_u64("total_before_spike"),
            row.extra_f64("total_operating_point"),
        ) {
            (Some(before), Some(point)) if row.system != "admission-fixed" => format!(
                "; total {before} before the spike, at {point:.0} (+1) in {}, above it {:.0}% of the time after",
                millis(row.extra_f64("total_reached_ms")),
                row.extra_f64("total_above_after").unwrap_or(f64::NAN) * 100.0
            ),
            _ => String::new(),
        };
        text.push_str(&format!(
            "  {:<19} converged in {}{controller}\n",
            row.system,
            millis(row.converge_ms)
        ));
    }
    text
}

/// W1's own figures: at each load, how much of C a busy runtime still did
/// while it took in and refused every arrival (the `refuse-all` row), the
/// most any admission system could serve there, beside what admission
/// served.
pub fn w1_table(rows: &[SummaryRow]) -> String {
    let mut text = String::new();
    for refusing in rows.iter().filter(|row| row.system == "refuse-all") {
        let Some(left) = refusing.extra_f64("left_beside_arrivals_frac") else {
            continue;
        };
        let served = rows
            .iter()
            .filter(|row| row.offered_x == refusing.offered_x)
            .filter(|row| row.system.starts_with("admission"))
            .map(|row| {
                format!(
                    "{} {:.1}% ({:.0}% of that)",
                    row.system,
                    row.goodput_frac * 100.0,
                    row.goodput_frac / left * 100.0
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        text.push_str(&format!(
            "at {}x, refusing every arrival, the runtime still did {:.1}% of C: {served}\n",
            refusing.offered_x,
            left * 100.0,
        ));
    }
    text
}

/// W7's own figures, one line per system, for the terminal: over-commit
/// (max held or accounted bytes over capacity, and admissions that passed
/// it), utilisation, the large class's fate and the starvation figures.
pub fn w7_table(rows: &[SummaryRow]) -> String {
    let figure = |row: &SummaryRow, key: &str| row.extra_f64(key).unwrap_or(f64::NAN);
    let count = |row: &SummaryRow, key: &str| {
        row.extra_u64(key)
            .map_or("-".to_string(), |n| n.to_string())
    };
    let mut text = format!(
        "{:<19} {:>8} {:>8} {:>6} {:>6} {:>6} {:>8} {:>8} {:>9} {:>9} {:>6}\n",
        "system",
        "max held",
        "max ldgr",
        "over",
        "bytes",
        "slots",
        "large ok",
        "large mx",
        "overtakes",
        "protected",
        "at"
    );
    for row in rows {
        let large_max = row.latency_ms.get("large").map_or(f64::NAN, |l| l.max_ms);
        text.push_str(&format!(
            "{:<19} {:>8.3} {:>8} {:>6} {:>5.0}% {:>5.0}% {:>7.1}% {:>6.0}ms {:>9} {:>9} {:>6}\n",
            row.system,
            figure(row, "max_held_ratio"),
            row.extra_f64("ledger_max_ratio")
                .map_or("-".to_string(), |r| format!("{r:.3}")),
            count(row, "over_commit_admissions"),
            figure(row, "byte_util") * 100.0,
            figure(row, "slot_util") * 100.0,
            figure(row, "large_success_frac") * 100.0,
            large_max,
            count(row, "max_overtakes_large_sampled"),
            count(row, "protections"),
            count(row, "max_overtakes_at_protection"),
        ));
    }
    text.push_str(
        "max held/ldgr: largest sampled bytes held / accounted by a ledger over capacity; \
         over: admissions past capacity;\nbytes, slots: time-averaged utilisation; \
         large ok: large completed / scheduled; large mx: largest large wait;\n\
         overtakes: largest sampled overtake count of a large waiter; protected: \
         protections taken; at: largest overtake count when taken\n",
    );
    text.push_str("refusals by class and outcome:\n");
    for row in rows {
        let of = |class: &str| {
            let named: Vec<String> = row
                .extra
                .get("refusals")
                .and_then(|r| r.get(class))
                .and_then(serde_json::Value::as_object)
                .map(|map| map.iter().map(|(name, n)| format!("{name} {n}")).collect())
                .unwrap_or_default();
            if named.is_empty() {
                "none".to_string()
            } else {
                named.join(", ")
            }
        };
        text.push_str(&format!(
            "  {:<19} small: {}; large: {}\n",
            row.system,
            of("small"),
            of("large")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, offered_x: f64, goodput_frac: f64) -> SummaryRow {
        SummaryRow {
            scenario: "w1".to_owned(),
            system: system.to_owned(),
            offered_x,
            goodput_frac,
            rejected_frac: 0.0,
            latency_ms: BTreeMap::new(),
            jain: None,
            converge_ms: None,
            generator_late_p99_us: 0.0,
            valid: true,
            inversions: None,
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn w1_sets_each_admission_row_against_what_refusing_every_arrival_left_at_its_load() {
        let mut refusing = row("refuse-all", 3.0, 0.0);
        refusing
            .extra
            .insert("left_beside_arrivals_frac".into(), json!(0.9));
        let mut unmeasured = row("refuse-all", 2.0, 0.0);
        unmeasured.extra.insert("cpu_busy_frac".into(), json!(0.1));
        let rows = [
            unmeasured,
            row("admission-defaults", 2.0, 0.5),
            refusing,
            row("tower-shed(2)", 3.0, 0.7),
            row("admission-defaults", 3.0, 0.855),
        ];
        assert_eq!(
            w1_table(&rows),
            "at 3x, refusing every arrival, the runtime still did 90.0% of C: \
             admission-defaults 85.5% (95% of that)\n"
        );
    }
}
