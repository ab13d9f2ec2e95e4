//! The overload benchmark suite: what happens under overload, side by side
//! with what users would otherwise pick.
//!
//! ```text
//! cargo run --release --example overload                  # W2 at 3x, every system (~1 min)
//! cargo run --release --example overload -- --scenario all
//! cargo run --release --example overload -- --scenario w4 --quick
//! cargo run --release --features fjall --example overload -- --scenario w6
//! cargo run --release --example overload -- --scenario w7
//! cargo run --release --example overload -- --service bimodal     # or constant
//! cargo run --release --example overload -- --handler never-yields
//! cargo run --release --example overload -- --system admission --system tower
//! ```
//!
//! The system under test is a two-worker tokio runtime. Load is open-loop
//! Poisson from a dedicated OS thread, with a seeded schedule; latency counts
//! from each request's intended send time; requests still unfinished at the
//! end count as misses. Capacity C (closed loop) and the unloaded latency
//! L0 are calibrated at the start; loads are multiples of C and the SLO,
//! carried by every request as its admission deadline, is 10 x the mean
//! service time (500 µs, exponential). Goodput is completions within the
//! SLO. Every run writes `target/admission-report/summary.json` and SVG
//! plots of per-class p99 over time.
//!
//! W6 (IO admission on a fjall database) is compiled in with the `fjall`
//! feature only; without it, W6 says so and reports nothing. W7 (GPU query
//! admission on a pool of simulated devices under 3x demand, see `gpu.rs`)
//! needs no feature and no GPU.

mod gpu;
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

use load::{Dispatch, Handler, Service, WorkUnits};
use report::SummaryRow;
use runner::{Bench, WORKERS};
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
    /// Only the systems whose names start with one of these (all if empty).
    only: Vec<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        scenarios: vec!["w2".into()],
        quick: false,
        out: PathBuf::from("target/admission-report"),
        service: Service::Exponential,
        handler: Handler::Chunked,
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
                options.handler = match args.next().map(String::as_str) {
                    Some("chunked") => Handler::Chunked,
                    Some("never-yields") => Handler::NeverYields,
                    _ => return Err("--handler takes chunked or never-yields".into()),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

/// Calibrates the machine and sizes the runs.
fn bench(quick: bool, service: Service, handler: Handler) -> Bench {
    let units = WorkUnits::calibrate();
    let calibration = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(1)
    };
    let capacity = runner::calibrate_capacity(units, MEAN_SERVICE, calibration, 42);
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
        service,
        handler,
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
    let unloaded = runner::run(&bench, System::NoAdmission, &spec);
    bench.unloaded = stats::latency_of_class(&unloaded.measured(), 0, unloaded.length);
    bench
}

fn run_scenario(
    bench: &Bench,
    name: &str,
    dir: &Path,
    quick: bool,
    only: &[String],
) -> Vec<SummaryRow> {
    let systems: Vec<System> = System::all(WORKERS)
        .into_iter()
        .filter(|system| {
            only.is_empty() || only.iter().any(|o| system.name().starts_with(o.as_str()))
        })
        .collect();
    match name {
        "w2" => scenarios::w2(bench, dir, &systems, Dispatch::Remote, "w2"),
        "w2-local" => scenarios::w2(bench, dir, &systems, Dispatch::Local, "w2-local"),
        "w1" => scenarios::w1(bench, dir, quick),
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
            Vec::new()
        }
        "w7" => scenarios::w7(&scenarios::w7_settings(quick)),
        "w8" => scenarios::w2_variant(bench, dir, "w8", Handler::SharedMutex),
        "w9" => scenarios::w2_variant(bench, dir, "w9", Handler::AwaitsIo),
        _ => unreachable!("names are checked when parsing"),
    }
}

fn classes_of(name: &str) -> &'static [&'static str] {
    match name {
        "w2" | "w2-local" | "w8" | "w9" => &["high", "normal", "low"],
        "w4" => &["high", "normal"],
        "w6" => &["foreground"],
        "w7" => &gpu::CLASSES,
        _ => &["normal"],
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
    let bench = bench(options.quick, options.service, options.handler);
    println!(
        "machine: {} cores; runtime: {WORKERS} workers; signal: {}; service: {:?}; handler: {:?}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        admission::cpu::RuntimeSignal::best_source(),
        bench.service,
        bench.handler,
    );
    println!(
        "C = {:.0} req/s (closed loop); L0 p50/p99 = {:.2}/{:.2} ms at 0.1 C; SLO = {:?}",
        bench.capacity, bench.unloaded.p50_ms, bench.unloaded.p99_ms, bench.slo
    );
    let mut all = Vec::new();
    for name in &options.scenarios {
        eprintln!("{name}:");
        let rows = run_scenario(&bench, name, &options.out, options.quick, &options.only);
        println!("\n{name}");
        print!("{}", report::table(&rows, classes_of(name)));
        if name == "w6" && !rows.is_empty() {
            print!("{}", scenarios::w6_table(&rows));
        }
        if name == "w7" {
            print!("{}", scenarios::w7_table(&rows));
        }
        all.extend(rows);
    }
    match report::write_summary(&all, &options.out) {
        Ok(path) => println!("\nsummary: {}", path.display()),
        Err(error) => {
            eprintln!("could not write the summary: {error}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod smoke {
    use super::*;

    /// The harness end to end at toy size: every system of W2 runs, every
    /// row is filled in, the summary and plots are written. Asserts only
    /// that the suite works, never how fast anything is.
    #[test]
    fn a_tiny_w2_runs_every_system_and_writes_its_report() {
        let units = WorkUnits::calibrate();
        let bench = Bench {
            units,
            mean_service: MEAN_SERVICE,
            capacity: 2_000.0,
            unloaded: stats::Percentiles::default(),
            slo: MEAN_SERVICE * 10,
            warmup: Duration::from_millis(50),
            measure: Duration::from_millis(150),
            seed: 7,
            service: Service::Exponential,
            handler: Handler::Chunked,
        };
        let dir = std::env::temp_dir().join(format!("admission-smoke-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rows = scenarios::w2(&bench, &dir, &System::all(WORKERS), Dispatch::Remote, "w2");
        assert_eq!(rows.len(), System::all(WORKERS).len());
        for row in &rows {
            assert_eq!(row.latency_ms.len(), 3, "{}", row.system);
            assert!(row.goodput_frac.is_finite() && row.goodput_frac >= 0.0);
            assert!((0.0..=1.0).contains(&row.rejected_frac));
        }
        let summary = report::write_summary(&rows, &dir).unwrap();
        let text = std::fs::read_to_string(summary).unwrap();
        assert!(text.contains("\"goodput_frac\"") && text.contains("admission-fifo"));
        assert!(dir.join("w2-high-p99.svg").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// W6 end to end at toy size (under a second per mode): every mode
    /// runs on a real fjall database and its row is filled in. Asserts
    /// only that the scenario works, never how well admission does.
    #[cfg(feature = "fjall")]
    #[test]
    fn a_tiny_w6_runs_fjall_alone_with_admission_and_paced() {
        let rows = scenarios::w6(&ingest::Settings::smoke());
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
        let json = report::summary_json(&rows).to_string();
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
            let outcome = gpu::run(&settings, system);
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
        let json = report::summary_json(&rows).to_string();
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
}
