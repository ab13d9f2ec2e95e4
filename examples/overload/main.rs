//! The overload benchmark suite: what happens under overload, side by side
//! with what users would otherwise pick.
//!
//! ```text
//! cargo run --release --example overload                  # W2 at 3x, every system (~1 min)
//! cargo run --release --example overload -- --scenario all
//! cargo run --release --example overload -- --scenario w4 --quick
//! cargo run --release --example overload -- --scenario matrix   # styles x signals x runtimes (~6 min)
//! cargo run --release --features fjall --example overload -- --scenario w6
//! cargo run --release --example overload -- --scenario w7
//! cargo run --release --example overload -- --service bimodal     # or constant
//! cargo run --release --example overload -- --handler self-wake   # or mutex, io, io-released, never-yields
//! cargo run --release --example overload -- --signal unstable
//! cargo run --release --example overload -- --system admission --system tower
//! cargo run --release --example overload -- --scenario w2-pool --handler never-yields
//! cargo run --release --example overload -- --scenario w2-socket --handler self-wake
//! cargo run --release --example overload -- --scenario w2-pool-split --workers 8
//! ```
//!
//! The system under test is a two-worker tokio runtime (`--workers N` for
//! another size: the fixed totals, semaphores, tower limits, pools and the
//! ideal scheduler beside the controller are sized to N, and C is
//! calibrated on N workers; the published runs are of two, on two cores). Load is open-loop
//! Poisson from a dedicated OS thread, with a seeded schedule; latency counts
//! from each request's intended send time; requests still unfinished at the
//! end count as misses. Capacity C (closed loop) and the unloaded latency
//! L0 are calibrated at the start; loads are multiples of C and the SLO,
//! carried by every request as its admission deadline, is 10 x the mean
//! service time (500 µs, exponential). Goodput is completions within the
//! SLO.
//!
//! Two axes apply to every CPU scenario, so that the suite measures what
//! users get:
//!
//! * **Handler style** (`--handler`, default `yield`): how handlers give
//!   their worker back between 50 µs chunks and what they await (see
//!   `load.rs`). `yield` calls `tokio::task::yield_now`, as tokio's docs
//!   teach; `self-wake` wakes itself into the run queue, as an await whose
//!   value is ready does; `mutex` and `io` are `yield` handlers that also
//!   hold a shared async mutex for 30% of their time, or wait on a timer as
//!   long as their work; `io-released` is `io` with the admission slot
//!   given back during the wait (`SlotPermit::release_during`, for the
//!   admission systems; the others hold what they hold); `never-yields`
//!   computes in one poll. W8, W9 and W9-released are the mutex and IO
//!   scenarios whatever the flag says: their handlers await the mutex or
//!   the timer and take only the yielding of `--handler` (so `yield_now` by
//!   default). C is calibrated with the compute-only form of the style.
//! * **Signal** (`--signal`, default `stable`): how the CPU controller reads
//!   the runtime. `stable` is the global queue plus a scheduling-delay probe,
//!   what every crate that depends on this one gets, since a dependency is
//!   built without `--cfg tokio_unstable`; `unstable` is tokio's per-worker
//!   queue depths, which need that cfg. This repository's
//!   `.cargo/config.toml` sets it, so its builds have both; a build without
//!   it (`RUSTFLAGS=""`) refuses `--signal unstable` with an error. Systems
//!   without a controller read no signal.
//! * **Runtime** (`--runtime`, default `tokio`): `tokio` builds the runtime
//!   under test with tokio's defaults, as `#[tokio::main]` does;
//!   `configured` builds it through `admission::cpu::configure_runtime`,
//!   which has workers poll tokio's global queue first, so that arrivals
//!   reach admission before admitted work runs again; `configured-events`
//!   also sets tokio's `event_interval` to 8 (from 61), so that a busy
//!   worker polls the IO driver, where socket arrivals are found, about
//!   every 400 µs instead of every 3 ms (for W2-socket; the matrix crosses
//!   the first two only).
//!
//! The `matrix` scenario crosses them: W2 at 3x through `admission-defaults` per
//! handler style (yield, self-wake, mutex, io), runtime and signal, with the
//! high class alone for its p99 ratio and `admission-fixed` per style and
//! runtime for the goodput to match, in one table; it ignores `--handler`,
//! `--signal` and `--runtime`. The fixed total runs before and after each
//! style and runtime's cells, and the table gives their mean and each: C
//! drifts on a shared machine, and how far the fixed total moved between
//! its two runs says how much of a cell's difference from it is the
//! machine's.
//!
//! Every report checks priority: for each admission system, a class served
//! within the SLO less often than a lower-priority class (by more than half
//! a point) is an inversion, marked `INVERTED` in the table, named on a
//! `PRIORITY INVERSION:` line under it, and in the JSON.
//!
//! A run is trusted only if C, calibrated again after the systems ran,
//! moved by at most 10% (and so did the pool scenarios' own C, calibrated
//! before and after their rows), and no goodput exceeded C (on a busy machine C
//! calibrates low and every fraction of it is inflated); otherwise the last
//! lines say `RUN INVALID` with the reasons, and so does the JSON. Nothing
//! here panics on what can fail at run time: a scenario that cannot run
//! says why and the others go on.
//!
//! Every run writes `target/admission-report/summary.json` (`run`: signal,
//! handler, workers and cores, C before and after, `valid`, `invalid_reasons`; `rows`: one
//! object per system and scenario, with its handler, signal and priority
//! check) and SVG plots of per-class p99 over time.
//!
//! Arrivals enter the runtime three ways. W2 and every other scenario spawn
//! each request from the generator thread (`Handle::spawn`), so it waits in
//! tokio's global queue until a worker takes it. W2-local hands each request
//! over a channel to a task inside the runtime that spawns it. W2-socket
//! writes each request as a four-byte frame on one of 16 loopback TCP
//! connections, read by a task per connection that spawns a handler per
//! request, as an HTTP/2 or gRPC server spawns a task per stream: the
//! readers are woken by tokio's IO driver, which a worker with local work
//! polls only once every `event_interval` scheduler ticks (61 by default),
//! so that is how arrivals reach a network service.
//!
//! W2-pool is W2 at 3x with handlers that never yield, whose computation
//! runs on the crate's `CpuPool` (the admission queue is the pool's only
//! queue), against `spawn_blocking` behind a `tokio::sync::Semaphore` and a
//! rayon pool's `spawn` with a oneshot, each with as many threads as the
//! runtime has workers. Its C is that of handlers that never yield: with
//! another `--handler`, the scenario calibrates it again for itself.
//! W2-pool-split runs the same on a runtime of half the workers beside as
//! many pool threads (one and one by default: each with a core of its own
//! on two cores, as the pool's docs advise when the workers also compute),
//! C calibrated on those workers, and adds the pool with `spin_before_wait`
//! of 100 µs.
//!
//! W6 (IO admission on a fjall database) is compiled in with the `fjall`
//! feature only; without it, W6 says so and reports nothing. W7 (GPU query
//! admission on a pool of simulated devices under 3x demand, see `gpu.rs`)
//! needs no feature and no GPU.

mod gate;
mod gpu;
mod ideal;
#[cfg(feature = "fjall")]
mod ingest;
mod load;
mod report;
mod runner;
mod scenarios;
mod stats;
mod systems;

use std::path::{Path, PathBuf};
use std::time::Duration;

use admission::cpu::SignalSource;
use load::{Awaits, Dispatch, Handler, Service, WorkUnits};
use report::{RunInfo, SummaryRow};
use runner::{Bench, RuntimeSetup, DEFAULT_WORKERS};
use systems::System;

const MEAN_SERVICE: Duration = Duration::from_micros(500);

/// Command-line options.
#[derive(Debug)]
struct Options {
    scenarios: Vec<String>,
    quick: bool,
    out: PathBuf,
    service: Service,
    handler: Handler,
    signal: SignalSource,
    runtime: RuntimeSetup,
    /// Worker threads of the runtime under test (`--workers`): the fixed
    /// totals, semaphores and pools beside the controller are sized to them.
    workers: usize,
    /// Only the systems whose names start with one of these (all if empty).
    only: Vec<String>,
}

/// The most `--workers` takes: far beyond any machine the suite is run on,
/// low enough that a typo does not spawn a runtime of a million threads.
const MAX_WORKERS: usize = 1024;

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        scenarios: vec!["w2".into()],
        quick: false,
        out: PathBuf::from("target/admission-report"),
        service: Service::Exponential,
        handler: Handler::YIELD,
        signal: SignalSource::GlobalQueueAndProbe,
        runtime: RuntimeSetup::Tokio,
        workers: DEFAULT_WORKERS,
        only: Vec::new(),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--scenario" => {
                let name = args.next().ok_or("--scenario needs a name")?;
                options.scenarios = if name == "all" {
                    scenarios::NAMES.iter().map(|s| s.to_string()).collect()
                } else if scenarios::NAMES.contains(&name.as_str()) {
                    vec![name.clone()]
                } else {
                    return Err(format!(
                        "unknown scenario {name}; one of {} or all",
                        scenarios::NAMES.join(", ")
                    ));
                };
            }
            "--out" => options.out = PathBuf::from(args.next().ok_or("--out needs a directory")?),
            "--system" => options
                .only
                .push(args.next().ok_or("--system needs a name")?.clone()),
            "--service" => {
                options.service = match args.next().map(String::as_str) {
                    Some("exp") => Service::Exponential,
                    Some("constant") => Service::Constant,
                    Some("bimodal") => Service::Bimodal,
                    _ => return Err("--service takes exp, constant or bimodal".into()),
                }
            }
            "--handler" => {
                let styles: Vec<&str> = Handler::STYLES.iter().map(|(name, _)| *name).collect();
                options.handler = args
                    .next()
                    .and_then(|name| Handler::named(name))
                    .ok_or_else(|| format!("--handler takes {}", styles.join(", ")))?;
            }
            "--signal" => {
                options.signal =
                    runner::signal_named(args.next().ok_or("--signal takes stable or unstable")?)?;
            }
            "--runtime" => {
                options.runtime = args
                    .next()
                    .and_then(|name| RuntimeSetup::named(name))
                    .ok_or("--runtime takes tokio, configured or configured-events")?;
            }
            "--workers" => {
                options.workers = args
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=MAX_WORKERS).contains(n))
                    .ok_or_else(|| {
                        format!("--workers takes a thread count from 1 to {MAX_WORKERS}")
                    })?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

/// How long C is calibrated for, before the systems run and after.
fn calibration_length(quick: bool) -> Duration {
    if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(1)
    }
}

/// Calibrates the machine and sizes the runs.
fn bench(options: &Options) -> Result<Bench, String> {
    let units = WorkUnits::calibrate();
    let quick = options.quick;
    let capacity = runner::calibrate_capacity(
        units,
        options.handler,
        MEAN_SERVICE,
        calibration_length(quick),
        42,
        options.workers,
        options.runtime,
    )?;
    if !(capacity.is_finite() && capacity > 0.0) {
        return Err(format!(
            "C = {capacity} req/s: the runtime completed nothing"
        ));
    }
    let mut bench = Bench {
        units,
        mean_service: MEAN_SERVICE,
        capacity,
        unloaded: stats::Percentiles::default(),
        slo: MEAN_SERVICE * 10,
        warmup: if quick {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        },
        measure: if quick {
            Duration::from_millis(800)
        } else {
            Duration::from_secs(5)
        },
        seed: 42,
        service: options.service,
        handler: options.handler,
        signal: options.signal,
        workers: options.workers,
        runtime: options.runtime,
    };
    let spec = runner::RunSpec::new(
        vec![runner::Class {
            name: "normal",
            priority: admission::Priority::NORMAL,
        }],
        vec![load::Stream {
            class: 0,
            tenant: 0,
            steps: vec![(Duration::ZERO, 0.1 * capacity)],
        }],
    );
    let unloaded = runner::run(&bench, System::NoAdmission, &spec)?;
    bench.unloaded = stats::latency_of_class(&unloaded.measured(), 0, unloaded.length);
    Ok(bench)
}

/// `bench` with C calibrated for handlers that never yield (W2-pool's) on
/// a runtime of `workers`, unless it already is.
fn never_yields_bench(bench: &Bench, quick: bool, workers: usize) -> Result<Bench, String> {
    if bench.handler == Handler::NEVER_YIELDS && bench.workers == workers {
        return Ok(bench.clone());
    }
    eprintln!("  w2-pool: calibrating C for handlers that never yield on {workers} worker(s) ...");
    let capacity = never_yields_capacity(bench, quick, workers)?;
    Ok(Bench {
        capacity,
        handler: Handler::NEVER_YIELDS,
        workers,
        ..bench.clone()
    })
}

/// C of handlers that never yield on a runtime of `workers`, as `bench`
/// builds it.
fn never_yields_capacity(bench: &Bench, quick: bool, workers: usize) -> Result<f64, String> {
    runner::calibrate_capacity(
        bench.units,
        Handler::NEVER_YIELDS,
        MEAN_SERVICE,
        calibration_length(quick),
        42,
        workers,
        bench.runtime,
    )
}

fn run_scenario(
    bench: &Bench,
    name: &str,
    dir: &Path,
    quick: bool,
    only: &[String],
) -> Result<Vec<SummaryRow>, String> {
    let systems: Vec<System> = System::all(bench.workers)
        .into_iter()
        .filter(|system| selected(only, system))
        .collect();
    match name {
        "w2" => scenarios::w2(bench, dir, &systems, Dispatch::Remote, "w2"),
        "w2-local" => scenarios::w2(bench, dir, &systems, Dispatch::Local, "w2-local"),
        "w2-socket" => scenarios::w2(bench, dir, &systems, Dispatch::Socket, "w2-socket"),
        "w1" => scenarios::w1(bench, dir, quick, &|system| selected(only, system)),
        "w3a" => scenarios::w3a(bench, dir),
        "w3b" => scenarios::w3b(bench, dir),
        "w3c" => scenarios::w3c(bench, dir),
        "w4" => scenarios::w4(bench, dir, quick),
        "w5" => scenarios::w5(bench, dir),
        #[cfg(feature = "fjall")]
        "w6" => scenarios::w6(&scenarios::w6_settings(quick)),
        #[cfg(not(feature = "fjall"))]
        "w6" => {
            eprintln!("  w6 needs the fjall feature (--features fjall); skipped");
            Ok(Vec::new())
        }
        "w7" => scenarios::w7(&scenarios::w7_settings(quick)),
        "w8" => scenarios::w2_variant(bench, dir, "w8", Awaits::SharedMutex),
        "w9" => scenarios::w2_variant(bench, dir, "w9", Awaits::Io),
        "w9-released" => scenarios::w2_variant(bench, dir, "w9-released", Awaits::IoReleased),
        "matrix" => scenarios::matrix(bench),
        "w2-ideal" => scenarios::w2_ideal(bench),
        "w2-pool" | "w2-pool-split" => {
            // Split: half the workers become pool threads, so that each
            // thread has a core of its own, as the pool's docs advise when
            // both compute (one and one on the default two).
            let threads = pool_threads(name, bench.workers);
            let systems: Vec<System> = scenarios::pool_systems(threads, name != "w2-pool")
                .into_iter()
                .filter(|system| selected(only, system))
                .collect();
            let own = never_yields_bench(bench, quick, threads)?;
            let mut rows = scenarios::w2_pool(&own, dir, &systems, name)?;
            if own.capacity != bench.capacity {
                // The run's own C is checked after the run by `main`; this
                // one only here.
                eprintln!("  {name}: calibrating its C again ...");
                let after = never_yields_capacity(&own, quick, own.workers).ok();
                record_capacity_after(&mut rows, after);
            }
            Ok(rows)
        }
        _ => Err(format!("no scenario named {name}")),
    }
}

/// The pool threads, and the runtime's workers beside them, of a pool
/// scenario on `workers` workers: all of them in W2-pool, half in
/// W2-pool-split (at least one).
fn pool_threads(scenario: &str, workers: usize) -> usize {
    if scenario == "w2-pool-split" {
        (workers / 2).max(1)
    } else {
        workers
    }
}

/// Records on `rows` the C they were measured against, calibrated again
/// after them (nothing if that failed: `report::run_problems` then finds
/// no C after for rows that carry their own C before, and says so).
fn record_capacity_after(rows: &mut [SummaryRow], after: Option<f64>) {
    for row in rows {
        let after = after.map_or(serde_json::Value::Null, |after| serde_json::json!(after));
        row.extra.insert("capacity_after_per_sec".into(), after);
    }
}

/// Whether `--system` (given as `only`, name prefixes) lets `system` run.
fn selected(only: &[String], system: &System) -> bool {
    only.is_empty() || only.iter().any(|o| system.name().starts_with(o.as_str()))
}

fn classes_of(name: &str) -> &'static [&'static str] {
    match name {
        "w2" | "w2-local" | "w2-socket" | "w2-pool" | "w2-pool-split" | "w2-ideal" | "w8"
        | "w9" | "w9-released" | "matrix" => &["high", "normal", "low"],
        "w4" => &["high", "normal"],
        "w6" => &["foreground"],
        "w7" => &gpu::CLASSES,
        _ => &["normal"],
    }
}

/// The terminal's table of one scenario's rows.
fn scenario_table(name: &str, rows: &[SummaryRow], workers: usize) -> String {
    match name {
        "matrix" => scenarios::matrix_table(rows, workers),
        "w6" if !rows.is_empty() => {
            report::table(rows, classes_of(name)) + &scenarios::w6_table(rows)
        }
        "w7" => report::table(rows, classes_of(name)) + &scenarios::w7_table(rows),
        "w4" => report::table(rows, classes_of(name)) + &scenarios::w4_table(rows),
        "w5" => report::table(rows, classes_of(name)) + &scenarios::w5_table(rows),
        "w1" => report::table(rows, classes_of(name)) + &scenarios::w1_table(rows),
        "w2-ideal" => scenarios::w2_ideal_table(rows),
        "w2" | "w2-local" | "w2-socket" | "w2-pool" | "w2-pool-split" | "w8" | "w9"
        | "w9-released" => {
            report::table(rows, classes_of(name)) + &scenarios::refusal_lines(rows, "high")
        }
        _ => report::table(rows, classes_of(name)),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    if let Err(error) = std::fs::create_dir_all(&options.out) {
        eprintln!("cannot create {}: {error}", options.out.display());
        std::process::exit(1);
    }
    eprintln!("calibrating ...");
    let bench = match bench(&options) {
        Ok(bench) => bench,
        Err(error) => {
            eprintln!("calibration failed: {error}");
            std::process::exit(1);
        }
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if bench.workers > cores {
        eprintln!(
            "note: {} workers on {cores} cores: the runtime's threads share cores, \
             and the generator thread shares them too",
            bench.workers
        );
    }
    println!(
        "machine: {cores} cores; runtime: {} workers, {}; signal: {} ({}); service: {:?}; handler: {}",
        bench.workers,
        bench.runtime.name(),
        runner::signal_name(bench.signal),
        bench.signal,
        bench.service,
        bench.handler.name(),
    );
    println!(
        "C = {:.0} req/s (closed loop); L0 p50/p99 = {:.2}/{:.2} ms at 0.1 C; SLO = {:?}",
        bench.capacity, bench.unloaded.p50_ms, bench.unloaded.p99_ms, bench.slo
    );
    let mut all = Vec::new();
    let mut failed = Vec::new();
    for name in &options.scenarios {
        eprintln!("{name}:");
        match run_scenario(&bench, name, &options.out, options.quick, &options.only) {
            Ok(rows) => {
                println!("\n{name}");
                print!("{}", scenario_table(name, &rows, bench.workers));
                all.extend(rows);
            }
            Err(error) => {
                println!("\n{name}: could not run: {error}");
                failed.push(name.clone());
            }
        }
    }
    eprintln!("calibrating again ...");
    let capacity_after = runner::calibrate_capacity(
        bench.units,
        bench.handler,
        MEAN_SERVICE,
        calibration_length(options.quick),
        42,
        bench.workers,
        bench.runtime,
    )
    .inspect_err(|error| eprintln!("calibration after the run failed: {error}"))
    .ok();
    let run = RunInfo {
        signal: runner::signal_name(bench.signal).to_string(),
        runtime: bench.runtime.name().to_string(),
        handler: bench.handler.name(),
        service: format!("{:?}", bench.service),
        workers: bench.workers,
        cores,
        capacity_before: bench.capacity,
        capacity_after,
        invalid_reasons: report::run_problems(bench.capacity, capacity_after, &all),
    };
    report::mark_rows(&run, &mut all);
    println!("\n{}", report::verdict(&run).trim_end());
    match report::write_summary(&run, &all, &options.out) {
        Ok(path) => println!("summary: {}", path.display()),
        Err(error) => {
            eprintln!("could not write the summary: {error}");
            std::process::exit(1);
        }
    }
    if !failed.is_empty() {
        eprintln!("could not run: {}", failed.join(", "));
        std::process::exit(1);
    }
}

#[cfg(test)]
mod smoke {
    use super::*;

    /// A bench at toy size: runs of 200 ms, C assumed, not calibrated.
    fn tiny_bench(handler: Handler, signal: SignalSource) -> Bench {
        Bench {
            units: WorkUnits::calibrate(),
            mean_service: MEAN_SERVICE,
            capacity: 2_000.0,
            unloaded: stats::Percentiles::default(),
            slo: MEAN_SERVICE * 10,
            warmup: Duration::from_millis(50),
            measure: Duration::from_millis(150),
            seed: 7,
            service: Service::Exponential,
            handler,
            signal,
            workers: DEFAULT_WORKERS,
            runtime: RuntimeSetup::Tokio,
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("admission-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn assert_filled_in(rows: &[SummaryRow]) {
        for row in rows {
            let label = report::row_label(row);
            assert_eq!(row.latency_ms.len(), 3, "{label}");
            assert!(
                row.goodput_frac.is_finite() && row.goodput_frac >= 0.0,
                "{label}"
            );
            assert!((0.0..=1.0).contains(&row.rejected_frac), "{label}");
            assert!(
                row.extra["served_within_slo"]["high"].is_number(),
                "{label}"
            );
        }
    }

    fn run_info(rows: &[SummaryRow]) -> RunInfo {
        RunInfo {
            signal: "stable".into(),
            runtime: "tokio".into(),
            handler: "yield".into(),
            service: "Exponential".into(),
            workers: DEFAULT_WORKERS,
            cores: 2,
            capacity_before: 2_000.0,
            capacity_after: Some(2_000.0),
            invalid_reasons: report::run_problems(2_000.0, Some(2_000.0), rows),
        }
    }

    /// The harness end to end at toy size: every system of W2 runs, every
    /// row is filled in, the summary and plots are written. Asserts only
    /// that the suite works, never how fast anything is.
    #[test]
    fn a_tiny_w2_runs_every_system_and_writes_its_report() {
        let bench = tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe);
        let dir = temp_dir("smoke");
        let rows = scenarios::w2(
            &bench,
            &dir,
            &System::all(DEFAULT_WORKERS),
            Dispatch::Remote,
            "w2",
        )
        .unwrap();
        assert_eq!(rows.len(), System::all(DEFAULT_WORKERS).len());
        assert_filled_in(&rows);
        for row in &rows {
            let admission = row.system.starts_with("admission");
            // Inversions are checked for every system that orders by
            // priority: admission and the hand-written gate beside it.
            let by_priority = admission || row.system.starts_with("strict-gate");
            assert_eq!(row.inversions.is_some(), by_priority, "{}", row.system);
            // The queue's refusals by reason, per class, for admission only.
            let refusals = row.extra.get("refusals");
            assert_eq!(refusals.is_some(), admission, "{}", row.system);
            if let Some(refusals) = refusals {
                for class in ["high", "normal", "low"] {
                    assert!(refusals[class].is_object(), "{}: {class}", row.system);
                }
            }
        }
        let text = scenario_table("w2", &rows, DEFAULT_WORKERS);
        assert!(text.contains("prio") && text.contains("semaphore-wait(2)"));
        assert!(text.contains("high refused by admission-defaults (whole run)"));
        let run = run_info(&rows);
        let summary = report::write_summary(&run, &rows, &dir).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(summary).unwrap()).unwrap();
        assert_eq!(json["run"]["signal"], "stable");
        assert_eq!(json["run"]["runtime"], "tokio");
        assert!(json["rows"][0]["goodput_frac"].is_number());
        assert!(json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|row| row["system"] == "admission-fifo"
                && row["signal"] == "stable"
                && row["priority_inversion"].is_boolean()));
        assert!(dir.join("w2-high-p99.svg").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// W5 at toy size: the bulk job runs holding its slots and giving way
    /// (`+give-way` rows), and each row has its bulk and foreground
    /// figures. Asserts only that the scenario works.
    #[test]
    fn a_tiny_w5_runs_the_bulk_job_holding_and_giving_way() {
        let bench = tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe);
        let dir = temp_dir("smoke-w5");
        let rows = scenarios::w5(&bench, &dir).unwrap();
        let systems: Vec<&str> = rows.iter().map(|row| row.system.as_str()).collect();
        assert_eq!(
            systems,
            [
                "no-admission",
                "semaphore-wait(2)",
                "admission",
                "admission-defaults",
                "admission-fixed",
                "admission-fixed-2x",
                "admission-defaults+give-way",
                "admission-share-1+give-way",
                "admission-fixed-share-1+give-way",
            ]
        );
        for row in &rows {
            for key in ["bulk_share_of_leftover", "foreground_p99_vs_alone"] {
                let value = row.extra_f64(key).unwrap_or(f64::NAN);
                assert!(value.is_finite() && value >= 0.0, "{}: {key}", row.system);
            }
        }
        let text = scenario_table("w5", &rows, DEFAULT_WORKERS);
        assert!(text.contains("bulk share of leftover") && text.contains("+give-way"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every handler style with every signal this build has, through
    /// the systems that read the signal or wait on a semaphore the run
    /// closes: each runs to its report without a panic.
    #[test]
    fn every_handler_style_runs_with_every_signal_of_the_build() {
        let dir = temp_dir("styles");
        let systems = [
            System::SemaphoreWait {
                limit: DEFAULT_WORKERS,
            },
            System::admission(),
        ];
        for (style, handler) in Handler::STYLES {
            for signal in runner::signals_in_this_build() {
                let bench = tiny_bench(handler, signal);
                let rows = scenarios::w2(&bench, &dir, &systems, Dispatch::Remote, "w2").unwrap();
                assert_eq!(rows.len(), 2, "{style}");
                assert_filled_in(&rows);
                assert_eq!(rows[1].extra["handler"], style);
                assert_eq!(rows[1].extra["signal"], runner::signal_name(signal));
            }
        }
        // W8 and W9 keep their awaits and take the chunks' yielding.
        let bench = tiny_bench(Handler::SELF_WAKE, SignalSource::GlobalQueueAndProbe);
        let rows = scenarios::w2_variant(&bench, &dir, "w8", Awaits::SharedMutex).unwrap();
        assert!(rows
            .iter()
            .all(|row| row.extra["handler"] == "mutex+self-wake"));
        // What a user gets is judged against the fixed total in the same run.
        let has = |rows: &[SummaryRow], name: &str| rows.iter().any(|row| row.system == name);
        assert!(has(&rows, "admission-defaults") && has(&rows, "admission-fixed"));
        let bench = tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe);
        let rows = scenarios::w2_variant(&bench, &dir, "w9", Awaits::Io).unwrap();
        assert!(rows.iter().all(|row| row.extra["handler"] == "io"));
        assert!(has(&rows, "admission-defaults") && has(&rows, "admission-fixed"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The matrix at toy size: one `admission-defaults` line per handler
    /// style, runtime and signal this build has, each with its fixed-total
    /// comparison on the same runtime.
    #[test]
    fn a_tiny_matrix_has_a_line_per_style_runtime_and_signal() {
        let bench = tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe);
        let rows = scenarios::matrix(&bench).unwrap();
        let signals = runner::signals_in_this_build();
        let styles = scenarios::MATRIX_STYLES.len();
        let runtimes = RuntimeSetup::ALL.len();
        // A line per signal, and the fixed total run before and after them.
        assert_eq!(rows.len(), styles * runtimes * (signals.len() + 2));
        assert_filled_in(&rows);
        let table = scenario_table("matrix", &rows, DEFAULT_WORKERS);
        for handler in scenarios::MATRIX_STYLES {
            for runtime in RuntimeSetup::ALL {
                for &signal in &signals {
                    let cell = [
                        handler.name(),
                        runtime.name().to_string(),
                        runner::signal_name(signal).to_string(),
                    ];
                    assert!(
                        table.lines().any(|l| l
                            .split_whitespace()
                            .take(3)
                            .eq(cell.iter().map(String::as_str))),
                        "{cell:?} missing from\n{table}"
                    );
                    let fixed: Vec<_> = rows
                        .iter()
                        .filter(|row| row.system == "admission-fixed")
                        .filter(|row| row.extra["handler"] == handler.name().as_str())
                        .filter(|row| row.extra["runtime"] == runtime.name())
                        .map(|row| row.extra["bracket"].clone())
                        .collect();
                    assert_eq!(fixed, ["before", "after"], "{cell:?}");
                }
            }
        }
        assert_eq!(
            table.contains("unstable: not in this build"),
            !cfg!(tokio_unstable)
        );
        for row in rows.iter().filter(|row| row.system == "admission-defaults") {
            assert!(row.extra["high_p99_vs_alone"].is_number());
            let fixed = |key: &str| row.extra[key].as_f64().unwrap();
            let (before, after) = (
                fixed("fixed_total_goodput_before"),
                fixed("fixed_total_goodput_after"),
            );
            assert_eq!(fixed("fixed_total_goodput_frac"), (before + after) / 2.0);
        }
    }

    /// The runner closes a waiting semaphore when a run ends: a request
    /// still waiting then is not served, and nothing panics.
    #[test]
    fn a_closed_semaphore_ends_its_waiters_unserved() {
        let runtime = runner::runtime(DEFAULT_WORKERS, RuntimeSetup::Tokio).unwrap();
        let sut = systems::Sut::build(
            System::SemaphoreWait { limit: 0 },
            runtime.handle(),
            load::HandlerEnv::new(WorkUnits::calibrate(), Handler::YIELD),
            MEAN_SERVICE * 10,
            SignalSource::GlobalQueueAndProbe,
            &[],
        )
        .unwrap();
        let now = std::time::Instant::now();
        let request = systems::Request {
            priority: admission::Priority::NORMAL,
            tenant: admission::TenantId::new(1),
            service: MEAN_SERVICE,
            intended: now,
            deadline: now + MEAN_SERVICE * 10,
            gives_way: false,
        };
        let waiting = runtime.spawn({
            let sut = sut.clone();
            async move { sut.serve(request).await }
        });
        std::thread::sleep(Duration::from_millis(20));
        sut.close();
        let outcome = runtime.block_on(waiting);
        assert_eq!(outcome.ok(), Some(stats::Outcome::Unfinished));
    }

    /// W2-pool at toy size: the pool and its alternatives each run to a
    /// filled-in row with the high class's figures against its p99 alone,
    /// handlers that never yield whatever the bench says; the pool (and
    /// the ideal scheduler, simulated beside them) is checked for priority
    /// inversion like every admission system.
    #[test]
    fn a_tiny_w2_pool_runs_the_pool_and_its_alternatives() {
        let bench = tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe);
        let dir = temp_dir("pool");
        let systems = scenarios::pool_systems(DEFAULT_WORKERS, true);
        let rows = scenarios::w2_pool(&bench, &dir, &systems, "w2-pool").unwrap();
        assert_eq!(rows.len(), systems.len());
        assert_filled_in(&rows);
        for row in &rows {
            assert_eq!(row.extra["handler"], "never-yields", "{}", row.system);
            assert!(row.extra["high_p99_vs_alone"].is_number(), "{}", row.system);
            let ideal = row.system == format!("ideal({DEFAULT_WORKERS})");
            let pool = row.system.starts_with("cpu-pool");
            assert_eq!(row.inversions.is_some(), pool || ideal, "{}", row.system);
            assert_eq!(row.extra.contains_key("simulated"), ideal, "{}", row.system);
        }
        let table = scenario_table("w2-pool", &rows, DEFAULT_WORKERS);
        for name in [
            "cpu-pool(2)",
            "cpu-pool(2,collect)",
            "cpu-pool(2,spin100us,collect)",
            "blocking-semaphore(2)",
            "rayon-spawn(2)",
        ] {
            assert!(table.contains(name), "{name} missing from\n{table}");
        }
        assert!(dir.join("w2-pool-high-p99.svg").exists());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            parse(&args("--scenario w2-pool")).unwrap().scenarios,
            ["w2-pool"]
        );
    }

    /// C that moved by more than 10%, or a goodput over C, makes the run
    /// invalid, with a reason each; JSON and the rows carry the verdict.
    #[test]
    fn a_run_whose_capacity_moved_or_was_exceeded_is_invalid() {
        let bench = tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe);
        let dir = temp_dir("verdict");
        let mut rows =
            scenarios::w2(&bench, &dir, &[System::admission()], Dispatch::Remote, "w2").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        rows[0].goodput_frac = 0.9;
        assert!(report::run_problems(2_000.0, Some(2_150.0), &rows).is_empty());
        assert!(report::run_problems(2_000.0, Some(1_850.0), &rows).is_empty());
        let moved = report::run_problems(2_000.0, Some(1_000.0), &rows);
        assert_eq!(moved.len(), 1);
        assert!(moved[0].contains("-50.0%"), "{moved:?}");
        assert_eq!(report::run_problems(2_000.0, None, &rows).len(), 1);
        rows[0].goodput_frac = 1.18;
        let exceeded = report::run_problems(2_000.0, Some(2_000.0), &rows);
        assert_eq!(exceeded.len(), 1);
        assert!(exceeded[0].contains("118.0% of C"), "{exceeded:?}");
        // The ideal scheduler's row is simulated: over C says nothing of C.
        let mut simulated = rows.clone();
        simulated[0]
            .extra
            .insert("simulated".into(), serde_json::json!(true));
        assert!(report::run_problems(2_000.0, Some(2_000.0), &simulated).is_empty());

        let run = run_info(&rows);
        assert!(!run.valid());
        report::mark_rows(&run, &mut rows);
        assert!(!rows[0].valid);
        assert!(report::verdict(&run).contains("RUN INVALID"));
        let json = report::summary_json(&run, &rows);
        assert_eq!(json["run"]["valid"], false);
        assert!(json["run"]["invalid_reasons"][0]
            .as_str()
            .unwrap()
            .contains("goodput"));
        assert_eq!(json["rows"][0]["valid"], false);
    }

    /// W6 end to end at toy size (under a second per mode): every mode
    /// runs on a real fjall database and its row is filled in. Asserts
    /// only that the scenario works, never how well admission does.
    #[cfg(feature = "fjall")]
    #[test]
    fn a_tiny_w6_runs_fjall_alone_with_admission_and_paced() {
        let rows = scenarios::w6(&ingest::Settings::smoke()).unwrap();
        let systems: Vec<&str> = rows.iter().map(|row| row.system.as_str()).collect();
        assert_eq!(systems, ["fjall-alone", "io-admission", "paced-same-rate"]);
        for row in &rows {
            assert!(row.valid, "{}: a foreground write failed", row.system);
            assert!(row.latency_ms["foreground"].count > 0, "{}", row.system);
            for key in ["foreground_p99_vs_alone", "bulk_mb_per_sec", "max_l0_runs"] {
                let value = row.extra[key].as_f64().unwrap_or(f64::NAN);
                assert!(value.is_finite() && value >= 0.0, "{}: {key}", row.system);
            }
        }
        assert!(scenarios::w6_table(&rows).contains("io-admission"));
        let json = report::summary_json(&RunInfo::default(), &rows).to_string();
        assert!(json.contains("\"max_l0_runs\""));
    }

    /// W7 at CI size (arrivals for 250 ms on two simulated devices, about
    /// half a second per system with the drain). Asserts only what cannot flake:
    /// the service never over-commits a ledger or a workload counter, every
    /// query settles exactly once, and every grant, slot and protection is
    /// back at the end. No timing, utilisation or starvation thresholds.
    #[test]
    fn a_tiny_w7_never_over_commits_and_settles_every_query() {
        let settings = gpu::Settings::smoke();
        let mut rows = Vec::new();
        for system in gpu::System::ALL {
            let outcome = gpu::run(&settings, system).unwrap();
            rows.push(scenarios::w7_row(&settings, system, &outcome));
            let name = system.name();
            let arrivals = outcome.arrivals[gpu::SMALL] + outcome.arrivals[gpu::LARGE];
            assert!(arrivals > 0, "{name}: nothing scheduled");
            assert_eq!(outcome.settled, arrivals, "{name}: a query did not settle");
            let completed = outcome.completed[gpu::SMALL] + outcome.completed[gpu::LARGE];
            assert_eq!(completed + outcome.refused(), arrivals, "{name}");
            if system == gpu::System::DeviceSemaphore {
                continue;
            }
            assert_eq!(outcome.over_commit_admissions, 0, "{name}: over-commit");
            assert_eq!(outcome.over_slot_admissions, 0, "{name}: over the limit");
            assert_eq!(outcome.ledger_violations, 0, "{name}: ledger over capacity");
            assert!(outcome.max_held_ratio <= 1.0, "{name}");
            assert!(outcome.ledger_max_ratio.is_some_and(|r| r <= 1.0), "{name}");
            assert_eq!(
                outcome.settle_mismatches, 0,
                "{name}: settled twice or never"
            );
            assert_eq!(outcome.ledgers_clear, Some(true), "{name}: grants left");
        }
        assert!(rows.iter().all(|row| row.valid));
        assert!(scenarios::w7_table(&rows).contains("admission-unbounded"));
        let json = report::summary_json(&RunInfo::default(), &rows).to_string();
        assert!(json.contains("\"over_commit_admissions\""));
    }

    #[test]
    fn the_command_line_names_scenarios_and_rejects_unknown_ones() {
        let parsed = parse(&["--scenario".into(), "w4".into(), "--quick".into()]).unwrap();
        assert_eq!(parsed.scenarios, ["w4"]);
        assert!(parsed.quick);
        assert_eq!(
            parse(&["--scenario".into(), "all".into()])
                .unwrap()
                .scenarios
                .len(),
            scenarios::NAMES.len()
        );
        assert_eq!(
            parse(&["--scenario".into(), "w7".into()])
                .unwrap()
                .scenarios,
            ["w7"]
        );
        assert!(parse(&["--scenario".into(), "w10".into()]).is_err());
        assert!(parse(&["--fast".into()]).is_err());
    }

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_default_is_yield_now_handlers_and_the_stable_signal() {
        let parsed = parse(&[]).unwrap();
        assert_eq!(parsed.handler, Handler::YIELD);
        assert_eq!(parsed.signal, SignalSource::GlobalQueueAndProbe);
        assert_eq!(parsed.scenarios, ["w2"]);
    }

    #[test]
    fn the_command_line_names_handler_styles_and_signals() {
        for (style, handler) in Handler::STYLES {
            let parsed = parse(&args(&format!("--handler {style}"))).unwrap();
            assert_eq!(parsed.handler, handler);
            assert_eq!(handler.name(), style);
        }
        assert!(parse(&args("--handler chunked")).is_err());
        assert!(parse(&args("--handler")).is_err());
        assert_eq!(
            parse(&args("--signal stable")).unwrap().signal,
            SignalSource::GlobalQueueAndProbe
        );
        // Unstable is there exactly when the build has tokio_unstable, and
        // its absence is an error that says what to do, not a panic.
        let unstable = parse(&args("--signal unstable"));
        if cfg!(tokio_unstable) {
            assert_eq!(unstable.unwrap().signal, SignalSource::QueueDepths);
        } else {
            let message = unstable.unwrap_err();
            assert!(message.contains("tokio_unstable"), "{message}");
        }
        assert!(parse(&args("--signal fast")).is_err());
        assert_eq!(parse(&args("")).unwrap().runtime, RuntimeSetup::Tokio);
        for runtime in RuntimeSetup::NAMED {
            let parsed = parse(&args(&format!("--runtime {}", runtime.name()))).unwrap();
            assert_eq!(parsed.runtime, runtime);
        }
        assert!(parse(&args("--runtime")).is_err());
        assert!(parse(&args("--runtime current-thread")).is_err());
        assert_eq!(
            parse(&args("--scenario matrix")).unwrap().scenarios,
            ["matrix"]
        );
    }

    #[test]
    fn the_command_line_sizes_the_runtime() {
        assert_eq!(parse(&[]).unwrap().workers, DEFAULT_WORKERS);
        assert_eq!(parse(&args("--workers 8")).unwrap().workers, 8);
        for bad in [
            "--workers",
            "--workers 0",
            "--workers eight",
            "--workers -2",
        ] {
            let message = parse(&args(bad)).unwrap_err();
            assert!(message.contains("--workers takes"), "{bad}: {message}");
        }
        let too_many = format!("--workers {}", MAX_WORKERS + 1);
        assert!(parse(&args(&too_many)).is_err());
        assert_eq!(pool_threads("w2-pool", 8), 8);
        assert_eq!(pool_threads("w2-pool-split", 8), 4);
        assert_eq!(pool_threads("w2-pool-split", 2), 1);
        assert_eq!(pool_threads("w2-pool-split", 1), 1);
    }

    /// W2-ideal runs every server count without calibrating anything, each
    /// row the ideal scheduler's with the high class against itself alone,
    /// and the price of non-preemption falls as servers are added: with
    /// 32 the high class's p99 under load is nearer its p99 alone than with
    /// one.
    #[test]
    fn w2_ideal_simulates_every_server_count() {
        let bench = tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe);
        let dir = temp_dir("ideal");
        let rows = run_scenario(&bench, "w2-ideal", &dir, true, &[]).unwrap();
        let names: Vec<String> = rows.iter().map(|row| row.system.clone()).collect();
        let expected: Vec<String> = scenarios::IDEAL_SERVERS
            .iter()
            .map(|n| format!("ideal({n})"))
            .collect();
        assert_eq!(names, expected);
        assert_filled_in(&rows);
        for row in &rows {
            assert_eq!(row.extra["simulated"], true, "{}", row.system);
            assert_eq!(row.inversions.as_deref(), Some(&[][..]), "{}", row.system);
        }
        let ratio = |row: &SummaryRow| row.extra_f64("high_p99_vs_alone").unwrap();
        assert!(ratio(&rows[rows.len() - 1]) < ratio(&rows[0]));
        let table = scenario_table("w2-ideal", &rows, DEFAULT_WORKERS);
        assert!(table.contains("ideal(32)") && table.contains("x alone"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A scenario measured against a C of its own (the pool scenarios)
    /// has that C checked after its rows too: a drift past the limit, or
    /// no C after, makes the run invalid with the scenario named, once.
    #[test]
    fn a_scenario_with_a_c_of_its_own_invalidates_the_run_when_that_c_moves() {
        let rows = |after: Option<f64>| {
            let mut rows = vec![report_row("cpu-pool(1)", 0.9), report_row("ideal(1)", 1.0)];
            for row in &mut rows {
                row.extra
                    .insert("capacity_per_sec".into(), serde_json::json!(2_000.0));
            }
            record_capacity_after(&mut rows, after);
            rows
        };
        assert!(report::run_problems(3_000.0, Some(3_000.0), &rows(Some(2_100.0))).is_empty());
        for after in [Some(2_300.0), Some(1_700.0), None] {
            let problems = report::run_problems(3_000.0, Some(3_000.0), &rows(after));
            assert_eq!(problems.len(), 1, "{after:?}: {problems:?}");
            assert!(problems[0].starts_with("w2-pool-split: C"), "{problems:?}");
        }
    }

    fn report_row(system: &str, goodput: f64) -> SummaryRow {
        SummaryRow {
            scenario: "w2-pool-split".into(),
            system: system.into(),
            offered_x: 3.0,
            goodput_frac: goodput,
            rejected_frac: 0.0,
            latency_ms: Default::default(),
            jain: None,
            converge_ms: None,
            generator_late_p99_us: 0.0,
            valid: true,
            inversions: None,
            extra: Default::default(),
        }
    }

    /// With another number of workers, every system sized by it follows:
    /// the semaphore, the fixed total's slots and the ideal scheduler's
    /// servers in W1, and the pool and its alternatives in W2-pool-split,
    /// which takes half of them.
    #[test]
    fn every_system_is_sized_to_the_workers_asked_for() {
        let bench = Bench {
            workers: 4,
            ..tiny_bench(Handler::YIELD, SignalSource::GlobalQueueAndProbe)
        };
        let dir = temp_dir("sized");
        let only: Vec<String> = ["semaphore-wait", "admission-fixed", "ideal"]
            .map(String::from)
            .to_vec();
        let rows = run_scenario(&bench, "w1", &dir, true, &only).unwrap();
        let mut systems: Vec<&str> = rows.iter().map(|row| row.system.as_str()).collect();
        systems.sort_unstable();
        systems.dedup();
        assert_eq!(
            systems,
            ["admission-fixed", "ideal(4)", "semaphore-wait(4)"]
        );
        let only: Vec<String> = ["blocking", "ideal"].map(String::from).to_vec();
        let rows = run_scenario(&bench, "w2-pool-split", &dir, true, &only).unwrap();
        let systems: Vec<&str> = rows.iter().map(|row| row.system.as_str()).collect();
        assert_eq!(systems, ["blocking-semaphore(2)", "ideal(2)"]);
        // Its C is its own (two workers' of never-yielding handlers), and
        // checked again after its rows.
        assert!(rows
            .iter()
            .all(|row| row.extra["capacity_after_per_sec"].is_number()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
