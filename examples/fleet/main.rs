//! A fleet on loopback: overload control across hops, measured.
//!
//! ```text
//! cargo run --release --example fleet --features tower [-- --quick] [--seed N] [--out DIR]
//! ```
//!
//! A frontend and two backends, real HTTP servers (axum, hyper) on
//! 127.0.0.1, each on a runtime of its own with one worker: the frontend
//! computes a little, then calls backend A (a little more), then backend B
//! (the most: the bottleneck, whose work sets the fleet's nominal capacity
//! C). An open-loop client sends three priority classes (high 20%, normal
//! 30%, low 50%, one SLO for all) at 0.8 C, then a 3x spike (3 C), then
//! 0.8 C again. Four setups run one after the other, on the same schedule:
//!
//! * `no-admission`: nobody admits; naive clients retry a refused or
//!   timed-out attempt at once, up to three times;
//! * `backends-only`: A and B behind the HTTP-mode layer over a CPU
//!   controller of their own; the same naive clients;
//! * `backends-only, no retries`: the same servers, clients that never
//!   retry: the baseline of the targets;
//! * `whole-loop`: every server behind the layer; the frontend calls the
//!   backends through `admission::tower::client` (their levels learned and
//!   checked before any work of its own, adaptive throttling, the budgeted
//!   retry policy, its slot given back during calls) and reports their
//!   levels upstream; the client calls the frontend through the same.
//!
//! Reported per setup: goodput per class (successes within the SLO) over
//! the spike's second half, the high class's share within its SLO, p99
//! per class, retries sent, the share of the servers' CPU spent on
//! attempts that did not succeed and on work a backend refused after the
//! frontend (and A) had done theirs, and the time until goodput settles
//! within 10% of its value at 3x. Then each target beside its baseline from
//! the same run, and an SVG of goodput over time through the spike
//! (`target/fleet/goodput.svg`).
//!
//! The settling target is read off a second run of the whole loop: 32
//! spikes of 0.8 s, each after 1.25 s at 0.8 C, their goodput averaged bin
//! by bin on their onsets. At a few hundred requests a second, 50 ms of one
//! spike hold too few successes for a 10% band to mean anything; the
//! average of 32 does (the report prints how much it still wanders).
//!
//! `--quick` runs a short, slow version (a larger unit of work, shorter
//! phases) for CI: its test checks directions only (the whole loop sends
//! fewer retries and wastes less of the servers' CPU than the backends
//! alone with naive clients), never timings.
//!
//! C is measured first (a closed loop of 16 callers through the fleet,
//! the backends admitting), not taken from the work: on a small machine
//! the servers and the client share the cores, and B's work runs slower
//! when another core is busy, so C is well below what B alone could do.
//! Each class spans eight rungs of the priority ladder (a hash of the
//! request, DAGOR's compound priority), so that a level can cut through a
//! class rather than shed all of it or none.

mod client;
mod report;
mod servers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use admission::tower::client::Downstreams;

use client::{Caller, Delivered, Phases, ATTEMPTS};
use servers::{backend, frontend, FrontendSetup, Ledger, Spin, Tier};

/// The setups compared, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    NoAdmission,
    BackendsOnly,
    BackendsOnlyNoRetries,
    WholeLoop,
}

impl Setup {
    pub const ALL: [Setup; 4] = [
        Setup::NoAdmission,
        Setup::BackendsOnly,
        Setup::BackendsOnlyNoRetries,
        Setup::WholeLoop,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Setup::NoAdmission => "no-admission",
            Setup::BackendsOnly => "backends-only",
            Setup::BackendsOnlyNoRetries => "backends-only, no retries",
            Setup::WholeLoop => "whole-loop",
        }
    }
}

/// What a run is made of.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Work per request at the frontend, A and B, in µs of CPU.
    pub work: [u64; 3],
    pub slo: Duration,
    /// The run every setup makes: one spike.
    pub phases: Phases,
    /// The whole loop's second run, for the settling time alone: the same
    /// spike many times over, each after a rest longer than what the loop
    /// remembers of the one before (a level lives 1 s, the throttle looks
    /// back 1 s), so that the spikes can be averaged. One spike cannot
    /// show settling to 10% within 50 ms at this rate: 50 ms hold about
    /// 16 successes, whose count alone wanders by a quarter.
    pub train: Phases,
    /// The width of the goodput timeline's bins.
    pub bin: Duration,
    pub seed: u64,
    /// Requests a second the fleet serves on this machine: measured
    /// ([`calibrate`]) before the runs; the loads are multiples of it.
    pub capacity: f64,
}

impl Settings {
    pub fn full(seed: u64) -> Self {
        Settings {
            work: [100, 300, 2500],
            slo: Duration::from_millis(150),
            phases: Phases {
                warmup: Duration::from_secs(1),
                before: Duration::from_millis(1500),
                spike: Duration::from_secs(3),
                after: Duration::from_millis(1500),
                steady_load: 0.8,
                spike_load: 3.0,
                spikes: 1,
            },
            train: Phases {
                warmup: Duration::from_millis(500),
                before: Duration::from_millis(1250),
                spike: Duration::from_millis(800),
                after: Duration::from_millis(200),
                steady_load: 0.8,
                spike_load: 3.0,
                spikes: 32,
            },
            bin: Duration::from_millis(10),
            seed,
            capacity: 0.0,
        }
    }

    /// Short and slow: a debug build on a busy 2-core machine keeps up.
    pub fn quick(seed: u64) -> Self {
        Settings {
            work: [200, 400, 4000],
            slo: Duration::from_millis(200),
            phases: Phases {
                warmup: Duration::from_millis(200),
                before: Duration::from_millis(400),
                spike: Duration::from_millis(800),
                after: Duration::from_millis(300),
                steady_load: 0.8,
                spike_load: 3.0,
                spikes: 1,
            },
            train: Phases {
                warmup: Duration::from_millis(200),
                before: Duration::from_millis(1100),
                spike: Duration::from_millis(400),
                after: Duration::from_millis(100),
                steady_load: 0.8,
                spike_load: 3.0,
                spikes: 3,
            },
            bin: Duration::from_millis(20),
            seed,
            capacity: 0.0,
        }
    }

    /// Requests a second B could serve with a core to itself: its work
    /// alone, the bound a calibration finds below.
    pub fn nominal_capacity(&self) -> f64 {
        1e6 / self.work[Tier::B as usize] as f64
    }

    /// The loads' unit.
    pub fn capacity(&self) -> f64 {
        if self.capacity > 0.0 {
            self.capacity
        } else {
            self.nominal_capacity()
        }
    }
}

/// Measures the fleet's capacity C: the backends admitting, a closed loop
/// of a few callers through the frontend (see [`client::closed_loop`]).
pub fn calibrate(settings: &Settings, spin: Spin) -> f64 {
    let ledger = Arc::new(Ledger::new(0));
    let [work_f, work_a, work_b] = settings.work;
    let slo = Duration::from_secs(1);
    let a = backend(Tier::A, work_a, true, slo, spin, ledger.clone());
    let b = backend(Tier::B, work_b, true, slo, spin, ledger.clone());
    let f = frontend(
        FrontendSetup {
            admits: false,
            downstreams: None,
        },
        work_f,
        [a.address, b.address],
        slo,
        spin,
        ledger,
    );
    let client_runtime = runtime();
    let length = settings.phases.before.max(Duration::from_millis(500));
    let capacity = client_runtime.block_on(client::closed_loop(
        f.address,
        16,
        settings.phases.warmup,
        length,
    ));
    client_runtime.shutdown_background();
    f.stop();
    a.stop();
    b.stop();
    capacity
}

/// One setup's run, as measured.
pub struct Run {
    pub setup: Setup,
    pub outcomes: Vec<client::Outcome>,
    /// The servers' work per attempt, and which a backend refused.
    pub ledger: Arc<Ledger>,
    pub delivered: Arc<Delivered>,
    /// Retries sent: by naive clients, or by the whole loop's policies
    /// (the client's and the frontend's).
    pub retries: u64,
    /// What the whole loop's budgets allowed (None for naive clients).
    pub retry_allowance: Option<f64>,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fleet-client")
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The budget of a whole-loop `Downstreams`: what its rule allows for the
/// requests it saw over `length` (10% plus ten a second).
fn allowance(downstreams: &Downstreams, length: Duration) -> f64 {
    0.1 * downstreams.snapshot().budget.requests as f64 + 10.0 * length.as_secs_f64()
}

/// One setup's run through `phases` (the settings' `phases` or `train`).
pub fn run(setup: Setup, settings: &Settings, phases: &Phases, spin: Spin) -> Run {
    let plan = Arc::new(client::schedule(phases, settings.capacity(), settings.seed));
    let ledger = Arc::new(Ledger::new(plan.len() * ATTEMPTS));
    let delivered = Arc::new(Delivered::new(plan.len() * ATTEMPTS));
    let backends_admit = setup != Setup::NoAdmission;
    let [work_f, work_a, work_b] = settings.work;
    let a = backend(
        Tier::A,
        work_a,
        backends_admit,
        settings.slo,
        spin,
        ledger.clone(),
    );
    let b = backend(
        Tier::B,
        work_b,
        backends_admit,
        settings.slo,
        spin,
        ledger.clone(),
    );
    let whole = setup == Setup::WholeLoop;
    let frontend_downstreams = whole.then(|| {
        Downstreams::builder()
            .endpoint(&a.address.to_string())
            .endpoint(&b.address.to_string())
            .build()
            .expect("valid settings")
    });
    let f = frontend(
        FrontendSetup {
            admits: whole,
            downstreams: frontend_downstreams.clone(),
        },
        work_f,
        [a.address, b.address],
        settings.slo,
        spin,
        ledger.clone(),
    );
    let client_downstreams = whole.then(|| {
        Downstreams::builder()
            .endpoint(&f.address.to_string())
            .build()
            .expect("valid settings")
    });
    let caller = match (&client_downstreams, setup) {
        (Some(downstreams), _) => Caller::Whole(downstreams.clone()),
        (None, Setup::BackendsOnlyNoRetries) => Caller::Naive { retries: 0 },
        (None, _) => Caller::Naive { retries: 3 },
    };
    let client_runtime = runtime();
    let outcomes = client_runtime.block_on(async {
        let start = tokio::time::Instant::now();
        let outcomes = client::drive(
            plan.clone(),
            caller,
            f.address,
            settings.slo,
            start,
            delivered.clone(),
        )
        .await;
        // Attempts the naive clients stopped waiting for finish on the
        // servers meanwhile, and their work is counted.
        tokio::time::sleep(settings.slo * 2).await;
        outcomes
    });
    let length = phases.length();
    let (retries, retry_allowance) = match (&client_downstreams, &frontend_downstreams) {
        (Some(client), Some(frontend)) => (
            client.snapshot().budget.retries + frontend.snapshot().budget.retries,
            Some(allowance(client, length) + allowance(frontend, length)),
        ),
        _ => (
            outcomes
                .iter()
                .map(|outcome| u64::from(outcome.attempts.saturating_sub(1)))
                .sum(),
            None,
        ),
    };
    client_runtime.shutdown_background();
    f.stop();
    a.stop();
    b.stop();
    Run {
        setup,
        outcomes,
        ledger,
        delivered,
        retries,
        retry_allowance,
    }
}

struct Options {
    quick: bool,
    seed: u64,
    out: PathBuf,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        quick: false,
        seed: 7,
        out: PathBuf::from("target/fleet"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--seed" => {
                options.seed = args
                    .next()
                    .and_then(|seed| seed.parse().ok())
                    .ok_or("--seed takes a number")?;
            }
            "--out" => options.out = args.next().ok_or("--out takes a directory")?.into(),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(options)
}

fn main() -> Result<(), String> {
    let options = options()?;
    let settings = if options.quick {
        Settings::quick(options.seed)
    } else {
        Settings::full(options.seed)
    };
    let mut settings = settings;
    let spin = Spin::calibrate();
    settings.capacity = calibrate(&settings, spin);
    println!(
        "fleet: work {:?} µs (frontend, A, B); capacity C = {:.0}/s measured (closed loop, \
         {:.0}/s were B alone on a core); SLO {:?}; {:.1}x C, then {:.1}x for {:?}",
        settings.work,
        settings.capacity(),
        settings.nominal_capacity(),
        settings.slo,
        settings.phases.steady_load,
        settings.phases.spike_load,
        settings.phases.spike
    );
    let runs: Vec<Run> = Setup::ALL
        .iter()
        .map(|&setup| {
            println!("running {}...", setup.name());
            run(setup, &settings, &settings.phases, spin)
        })
        .collect();
    let train = &settings.train;
    println!(
        "running {} through {} spikes, {:?} each after {:?}, for the settling time...",
        Setup::WholeLoop.name(),
        train.spikes,
        train.spike,
        train.before
    );
    let settle = report::settle(&run(Setup::WholeLoop, &settings, train, spin), &settings);
    let summaries: Vec<report::Summary> = runs
        .iter()
        .map(|run| report::summarize(run, &settings))
        .collect();
    println!("\n{}", report::table(&summaries));
    println!("{}", report::targets(&summaries, &settle));
    std::fs::create_dir_all(&options.out)
        .map_err(|error| format!("creating {}: {error}", options.out.display()))?;
    let chart = options.out.join("goodput.svg");
    report::plot(&chart, &summaries, &settings)?;
    println!("goodput over time: {}", chart.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_fleet_sends_fewer_retries_and_wastes_less_with_the_whole_loop() {
        let mut settings = Settings::quick(11);
        let spin = Spin::calibrate();
        settings.capacity = calibrate(&settings, spin);
        assert!(settings.capacity > 0.0, "the fleet serves");
        let phases = settings.phases;
        let backends = report::summarize(
            &run(Setup::BackendsOnly, &settings, &phases, spin),
            &settings,
        );
        let whole = report::summarize(&run(Setup::WholeLoop, &settings, &phases, spin), &settings);
        eprintln!("{}", report::table(&[backends.clone(), whole.clone()]));
        // Directions only: a debug build on a shared machine times nothing.
        assert!(
            backends.retries > 0,
            "the spike refuses, naive clients retry"
        );
        assert!(
            whole.retries < backends.retries,
            "retries: whole loop {} against backends only {}",
            whole.retries,
            backends.retries
        );
        assert!(
            whole.wasted_share < backends.wasted_share,
            "CPU on attempts that failed: whole loop {:.3} against backends only {:.3}",
            whole.wasted_share,
            backends.wasted_share
        );
        assert!(whole.goodput_total() > 0.0, "the whole loop serves");
        let dir = std::env::temp_dir().join(format!("fleet-quick-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = dir.join("goodput.svg");
        report::plot(&chart, &[backends, whole], &settings).unwrap();
        let svg = std::fs::read_to_string(&chart).unwrap();
        assert!(svg.contains("<svg") && svg.contains("whole-loop"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_schedule_follows_the_phases_and_the_class_shares() {
        let settings = Settings::full(3);
        assert_eq!(
            settings.capacity(),
            settings.nominal_capacity(),
            "not calibrated"
        );
        let plan = client::schedule(&settings.phases, settings.capacity(), 3);
        let phases = settings.phases;
        let rate = |from: Duration, to: Duration| {
            let n = plan.iter().filter(|p| p.at >= from && p.at < to).count();
            n as f64 / (to - from).as_secs_f64() / settings.capacity()
        };
        let steady = rate(Duration::ZERO, phases.spike_start());
        let spike = rate(phases.spike_start(), phases.spike_end());
        assert!((steady - 0.8).abs() < 0.1, "{steady}");
        assert!((spike - 3.0).abs() < 0.2, "{spike}");
        // The train: every spike at 3x, every rest between them at 0.8x.
        let train = settings.train;
        let plan_of_train = client::schedule(&train, settings.capacity(), 3);
        let rate_of_train = |from: Duration, to: Duration| {
            let n = plan_of_train
                .iter()
                .filter(|p| p.at >= from && p.at < to)
                .count();
            n as f64 / (to - from).as_secs_f64() / settings.capacity()
        };
        let spikes = (0..train.spikes)
            .map(|k| train.spike_start_of(k))
            .map(|start| (start, start + train.spike));
        let (spiking, resting): (Vec<f64>, Vec<f64>) = spikes
            .map(|(start, end)| {
                (
                    rate_of_train(start, end),
                    rate_of_train(start - train.before, start),
                )
            })
            .unzip();
        let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
        assert!((mean(&spiking) - 3.0).abs() < 0.1, "{spiking:?}");
        assert!((mean(&resting) - 0.8).abs() < 0.05, "{resting:?}");
        assert!(plan_of_train.last().unwrap().at < train.length());
        let high = plan.iter().filter(|p| p.class == 0).count() as f64 / plan.len() as f64;
        assert!((high - 0.2).abs() < 0.03, "{high}");
        assert!(plan.windows(2).all(|pair| pair[0].at <= pair[1].at));
    }

    #[test]
    fn a_train_of_spikes_is_averaged_on_their_onsets() {
        let mut settings = Settings::full(1);
        settings.capacity = 1000.0;
        settings.train = Phases {
            warmup: Duration::from_millis(100),
            before: Duration::from_millis(200),
            spike: Duration::from_millis(200),
            after: Duration::ZERO,
            steady_load: 0.8,
            spike_load: 3.0,
            spikes: 4,
        };
        let train = settings.train;
        let bin = settings.bin;
        // 5 successes a bin (500/s) at rest, 10 (1000/s) in a spike; the
        // first spike has none in its first 60 ms.
        let mut outcomes = Vec::new();
        for at in 0..(train.length().as_millis() / 10) as u32 {
            let start = bin * at;
            let spike = (0..train.spikes).find(|&k| {
                start >= train.spike_start_of(k) && start < train.spike_start_of(k) + train.spike
            });
            let answers = match spike {
                Some(0) if start < train.spike_start_of(0) + Duration::from_millis(60) => 0,
                Some(_) => 10,
                None => 5,
            };
            for _ in 0..answers {
                outcomes.push(client::Outcome {
                    planned: client::Planned {
                        at: start,
                        class: 0,
                    },
                    answered: Some((start + bin / 2, true)),
                    attempts: 1,
                    refused_here: false,
                });
            }
        }
        let run = Run {
            setup: Setup::WholeLoop,
            outcomes,
            ledger: Arc::new(Ledger::new(0)),
            delivered: Arc::new(Delivered::new(0)),
            retries: 0,
            retry_allowance: None,
        };
        let settle = report::settle(&run, &settings);
        assert_eq!(settle.spikes, 4);
        let settling = settle.settling;
        assert!(
            (settling.steady - 1000.0).abs() < 1e-6,
            "{}",
            settling.steady
        );
        // Nothing wanders at 3x, so the shortest mean (20 ms) reads it:
        // 750/s for 60 ms (one spike of four at zero), then 1000/s; the
        // 20 ms mean reaches 900 at the end of the eighth bin.
        assert_eq!(settling.window, Duration::from_millis(20));
        assert_eq!(settling.time_to_stable, Some(Duration::from_millis(80)));
        // An instant step from 500/s to 1000/s reads through the same
        // mean in its second bin.
        assert_eq!(settling.step_floor, Some(Duration::from_millis(20)));
    }

    #[test]
    fn stability_is_the_first_time_the_smoothed_goodput_is_in_its_band() {
        // Bins of 10 ms; the spike starts at bin 10; goodput settles at
        // 100 per bin from bin 14 (a ramp before).
        let mut bins = vec![80.0; 10];
        bins.extend([20.0, 40.0, 60.0, 90.0]);
        bins.extend(vec![100.0; 60]);
        let bin = Duration::from_millis(10);
        // The 100 ms trailing mean (bins 12 to 21: 60, 90 and eight of
        // 100) reaches 95 at the end of bin 21, 120 ms after the spike
        // began; at bin 20 it is 89.
        assert_eq!(
            report::time_to_stable(&bins, 10, 100.0, bin, Duration::from_millis(100)),
            Some(Duration::from_millis(120))
        );
        let never = vec![10.0; 80];
        assert_eq!(
            report::time_to_stable(&never, 10, 100.0, bin, Duration::from_millis(100)),
            None
        );
        // Through a 20 ms mean the same ramp is in its band at the end of
        // bin 14 (90 and 100: 95), 50 ms after the spike began.
        assert_eq!(
            report::time_to_stable(&bins, 10, 100.0, bin, Duration::from_millis(20)),
            Some(Duration::from_millis(50))
        );
    }
}
