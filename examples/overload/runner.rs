//! One run: a fresh two-worker runtime, one system, one schedule.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission::cpu::SignalSource;
use admission::observe::Refusals;
use admission::{Priority, TenantId, TenantWeight};

use crate::ideal;
use crate::load::{
    generate, schedule, Delivery, Dispatch, Handler, HandlerEnv, Outcomes, Planned, Service,
    Stream, WorkUnits, SOCKET_CONNECTIONS,
};
use crate::stats::{self, Outcome, Percentiles, Record};
use crate::systems::{Request, Sut, System};

/// Worker threads of the runtime under test unless `--workers` says
/// otherwise: the two-core machine the suite's published runs were taken on.
pub const DEFAULT_WORKERS: usize = 2;

/// What every run of a suite shares: the machine's calibration.
#[derive(Clone, Debug)]
pub struct Bench {
    pub units: WorkUnits,
    pub mean_service: Duration,
    /// Requests per second the runtime completes in a closed loop.
    pub capacity: f64,
    /// Latency at a tenth of capacity, no admission control.
    pub unloaded: Percentiles,
    pub slo: Duration,
    pub warmup: Duration,
    pub measure: Duration,
    pub seed: u64,
    /// How service times are drawn in every run.
    pub service: Service,
    /// How handlers spend their time, unless a scenario says otherwise.
    pub handler: Handler,
    /// How the CPU controller reads the runtime.
    pub signal: SignalSource,
    /// The runtime's worker threads (`--workers`, [`DEFAULT_WORKERS`] unless
    /// given; half of them in W2-pool-split).
    pub workers: usize,
    /// How the runtime under test is built.
    pub runtime: RuntimeSetup,
}

/// How the runtime under test is built: as an application that never
/// heard of `admission` builds it, or through
/// `admission::cpu::configure_runtime` (the global queue polled first, so
/// arrivals reach admission before admitted work runs again), or that and
/// tokio's IO driver polled every [`EVENTS_INTERVAL`] ticks instead of 61,
/// so that arrivals on sockets are seen sooner (W2-socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeSetup {
    /// `Builder::new_multi_thread()` with tokio's defaults, what
    /// `#[tokio::main]` gives.
    Tokio,
    /// The same through `admission::cpu::configure_runtime`.
    Configured,
    /// `Configured`, and `Builder::event_interval(EVENTS_INTERVAL)`.
    ConfiguredEvents,
}

/// The event interval of [`RuntimeSetup::ConfiguredEvents`]: with 50 µs
/// polls, the IO driver is looked at every ~400 µs per busy worker instead
/// of every ~3 ms. (1 was tried and rejected: with `yield_now` handlers,
/// every tick then wakes the deferred tasks into the LIFO slot, and the
/// high class's in-SLO share fell to 40%.)
pub const EVENTS_INTERVAL: u32 = 8;

impl RuntimeSetup {
    /// The setups the matrix crosses, tokio's defaults first.
    pub const ALL: [RuntimeSetup; 2] = [RuntimeSetup::Tokio, RuntimeSetup::Configured];

    /// Every setup `--runtime` takes.
    pub const NAMED: [RuntimeSetup; 3] = [
        RuntimeSetup::Tokio,
        RuntimeSetup::Configured,
        RuntimeSetup::ConfiguredEvents,
    ];

    /// The name on the command line and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            RuntimeSetup::Tokio => "tokio",
            RuntimeSetup::Configured => "configured",
            RuntimeSetup::ConfiguredEvents => "configured-events",
        }
    }

    /// The setup `--runtime` names.
    pub fn named(name: &str) -> Option<RuntimeSetup> {
        Self::NAMED.into_iter().find(|setup| setup.name() == name)
    }
}

/// The signal's name on the command line: `stable` is what every crate
/// that depends on this one gets (a dependency is built without
/// `--cfg tokio_unstable`), `unstable` reads tokio's per-worker queue
/// depths, which only a `tokio_unstable` build has.
pub fn signal_name(source: SignalSource) -> &'static str {
    match source {
        SignalSource::GlobalQueueAndProbe => "stable",
        SignalSource::QueueDepths => "unstable",
    }
}

/// The signal `--signal` names, if this build has it.
pub fn signal_named(name: &str) -> Result<SignalSource, String> {
    match name {
        "stable" => Ok(SignalSource::GlobalQueueAndProbe),
        "unstable" if cfg!(tokio_unstable) => Ok(SignalSource::QueueDepths),
        "unstable" => Err(
            "--signal unstable reads tokio's per-worker queue depths, which \
             this build lacks: it needs --cfg tokio_unstable (this repository's \
             .cargo/config.toml sets it; a RUSTFLAGS variable replaces it)"
                .into(),
        ),
        _ => Err("--signal takes stable or unstable".into()),
    }
}

/// The signals this build can read, stable first.
pub fn signals_in_this_build() -> Vec<SignalSource> {
    let mut signals = vec![SignalSource::GlobalQueueAndProbe];
    if cfg!(tokio_unstable) {
        signals.push(SignalSource::QueueDepths);
    }
    signals
}

/// A class of requests.
#[derive(Clone, Copy, Debug)]
pub struct Class {
    pub name: &'static str,
    pub priority: Priority,
}

/// A closed-loop background job (bulk work) running beside the open load.
#[derive(Clone, Copy, Debug)]
pub struct Background {
    pub workers: usize,
    pub chunk: Duration,
    pub priority: Priority,
    pub tenant: TenantId,
    /// Whether each chunk's handler gives its slot to waiting work of a
    /// higher priority between its 50 µs pieces (`SlotPermit::give_way`).
    pub gives_way: bool,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub classes: Vec<Class>,
    pub streams: Vec<Stream>,
    /// The scenario's own handler kind; `None` takes the bench's.
    pub handler: Option<Handler>,
    pub dispatch: Dispatch,
    pub weights: Vec<(TenantId, TenantWeight)>,
    pub background: Option<Background>,
    /// Length of the run, warm-up included (defaults to the bench's).
    pub length: Option<Duration>,
}

impl RunSpec {
    pub fn new(classes: Vec<Class>, streams: Vec<Stream>) -> Self {
        RunSpec {
            classes,
            streams,
            handler: None,
            dispatch: Dispatch::Remote,
            weights: Vec::new(),
            background: None,
            length: None,
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct RunResult {
    pub records: Vec<Record>,
    pub delivery: Delivery,
    pub length: Duration,
    pub warmup: Duration,
    /// The slot total every millisecond (the controller's own period, so
    /// that a spike's cut is timed to the tick), for systems that have one.
    pub slot_totals: Vec<(Duration, u64)>,
    /// Background chunks completed after the warm-up.
    pub background_done: u64,
    /// The CPU the whole process used after the warm-up, as a share of
    /// every core for that time (`None` where `/proc/self/stat` cannot be
    /// read).
    pub cpu_busy: Option<f64>,
    /// For `refuse-all`: the closed-loop work done beside the refused
    /// arrivals after the warm-up, as a fraction of C.
    pub left_beside_arrivals: Option<f64>,
    /// Why the system's admission queue refused requests, per priority,
    /// over the whole run (warm-up included); empty without one.
    pub refusals: Vec<(Priority, Refusals)>,
}

impl RunResult {
    /// Records sent after the warm-up.
    pub fn measured(&self) -> Vec<Record> {
        self.records
            .iter()
            .copied()
            .filter(|r| r.intended >= self.warmup)
            .collect()
    }

    pub fn measured_len(&self) -> Duration {
        self.length.saturating_sub(self.warmup)
    }

    pub fn generator_late_p99_us(&self) -> f64 {
        stats::percentiles_of(&self.delivery.lateness).p99_ms * 1000.0
    }

    /// The load actually sent matched the schedule within 2%.
    pub fn valid(&self) -> bool {
        (1.0 - self.delivery.delivered_frac).abs() <= 0.02
    }
}

/// The ideal scheduler's run of `spec`: the same schedule as a real run,
/// its servers as fast in total as the calibrated C.
fn simulate_ideal(bench: &Bench, servers: usize, spec: &RunSpec) -> RunResult {
    let length = spec.length.unwrap_or(bench.warmup + bench.measure);
    let plan = schedule(
        &spec.streams,
        length,
        bench.mean_service,
        bench.service,
        bench.seed,
    );
    let priorities: Vec<Priority> = spec.classes.iter().map(|class| class.priority).collect();
    // `servers` servers at one request per mean service time each would
    // serve `servers / mean` a second; the real runtime serves C.
    let speedup = bench.capacity * bench.mean_service.as_secs_f64() / servers.max(1) as f64;
    RunResult {
        records: ideal::simulate(
            &plan,
            &priorities,
            servers,
            bench.slo,
            bench.mean_service,
            speedup,
        ),
        delivery: Delivery {
            lateness: vec![Duration::ZERO],
            delivered_frac: 1.0,
        },
        length,
        warmup: bench.warmup,
        slot_totals: Vec::new(),
        background_done: 0,
        cpu_busy: None,
        left_beside_arrivals: None,
        refusals: Vec::new(),
    }
}

pub fn runtime(workers: usize, setup: RuntimeSetup) -> Result<tokio::runtime::Runtime, String> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if setup != RuntimeSetup::Tokio {
        admission::cpu::configure_runtime(&mut builder);
    }
    if setup == RuntimeSetup::ConfiguredEvents {
        builder.event_interval(EVENTS_INTERVAL);
    }
    builder
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start a tokio runtime: {error}"))
}

/// Closed-loop capacity: requests per second with `4 × workers` clients
/// and no admission control, for `length`. The clients compute only,
/// yielding as `handler` does: C is the machine's capacity for the work,
/// not for a mutex or a timer.
pub fn calibrate_capacity(
    units: WorkUnits,
    handler: Handler,
    mean_service: Duration,
    length: Duration,
    seed: u64,
    workers: usize,
    setup: RuntimeSetup,
) -> Result<f64, String> {
    let runtime = runtime(workers, setup)?;
    let env = HandlerEnv::new(units, Handler::computing(handler.yielding));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    closed_loop(&runtime, workers, &env, mean_service, seed, &done, &stop);
    std::thread::sleep(Duration::from_millis(200));
    let before = done.load(Ordering::Relaxed);
    let start = Instant::now();
    std::thread::sleep(length);
    let rate = (done.load(Ordering::Relaxed) - before) as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(rate)
}

/// Keeps `workers` busy the way C is measured: 4 clients a worker, each
/// serving the next of a fixed draw of service times as soon as it has
/// served the last, counting completions in `done` until `stop`.
fn closed_loop(
    runtime: &tokio::runtime::Runtime,
    workers: usize,
    env: &HandlerEnv,
    mean_service: Duration,
    seed: u64,
    done: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
) {
    let services: Arc<Vec<Planned>> = Arc::new(schedule(
        &[Stream {
            class: 0,
            tenant: 0,
            steps: vec![(Duration::ZERO, 100_000.0)],
        }],
        Duration::from_millis(200),
        mean_service,
        Service::Exponential,
        seed,
    ));
    let clients = 4 * workers;
    for client in 0..clients {
        let (env, done, stop, services) =
            (env.clone(), done.clone(), stop.clone(), services.clone());
        runtime.spawn(async move {
            let mut i = client;
            while !stop.load(Ordering::Relaxed) {
                env.serve(services[i % services.len()].service).await;
                done.fetch_add(1, Ordering::Relaxed);
                i += clients;
            }
        });
    }
}

/// The server side of [`Dispatch::Socket`]: [`SOCKET_CONNECTIONS`]
/// loopback TCP connections, each read by a task in `runtime` that turns
/// every four-byte frame (a request's index in `plan`) into a handler task
/// of its own. Returns the client ends, for the generator to write to; a
/// reader ends when its client end is dropped.
fn socket_arrivals<F, Fut>(
    runtime: &tokio::runtime::Runtime,
    plan: Arc<Vec<Planned>>,
    start: Instant,
    serve: F,
) -> Result<Vec<std::net::TcpStream>, String>
where
    F: Fn(usize, Instant) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let failed = |error: std::io::Error| format!("cannot set up loopback arrivals: {error}");
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(failed)?;
    let address = listener.local_addr().map_err(failed)?;
    let mut clients = Vec::with_capacity(SOCKET_CONNECTIONS);
    for _ in 0..SOCKET_CONNECTIONS {
        let client = std::net::TcpStream::connect(address).map_err(failed)?;
        client.set_nodelay(true).map_err(failed)?;
        let (server, _) = listener.accept().map_err(failed)?;
        server.set_nonblocking(true).map_err(failed)?;
        let server = {
            // Registering with the IO driver needs the runtime's context.
            let _context = runtime.enter();
            tokio::net::TcpStream::from_std(server).map_err(failed)?
        };
        let (serve, plan) = (serve.clone(), plan.clone());
        runtime.spawn(async move {
            let mut frames = tokio::io::BufReader::new(server);
            let mut frame = [0u8; 4];
            while frames.read_exact(&mut frame).await.is_ok() {
                let index = u32::from_le_bytes(frame) as usize;
                if let Some(planned) = plan.get(index) {
                    drop(tokio::spawn(serve(index, start + planned.at)));
                }
            }
        });
        clients.push(client);
    }
    Ok(clients)
}

/// Runs `spec` against `system` and collects every request's outcome; an
/// error when the run could not be set up.
pub fn run(bench: &Bench, system: System, spec: &RunSpec) -> Result<RunResult, String> {
    if let System::Ideal { servers } = system {
        return Ok(simulate_ideal(bench, servers, spec));
    }
    let runtime = runtime(bench.workers, bench.runtime)?;
    let env = HandlerEnv::new(bench.units, spec.handler.unwrap_or(bench.handler));
    let sut = Sut::build(
        system,
        runtime.handle(),
        env.clone(),
        bench.slo,
        bench.signal,
        &spec.weights,
    )?;
    let length = spec.length.unwrap_or(bench.warmup + bench.measure);
    let plan = Arc::new(schedule(
        &spec.streams,
        length,
        bench.mean_service,
        bench.service,
        bench.seed,
    ));
    let outcomes = Outcomes::new(plan.len());
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + length;
    let classes: Arc<Vec<Class>> = Arc::new(spec.classes.clone());

    let background_done = Arc::new(AtomicU64::new(0));
    let stop_background = Arc::new(AtomicBool::new(false));
    // Refusing every arrival, the runtime still does C's work beside them:
    // what that work loses is what taking the arrivals in costs a busy
    // runtime (see `System::RefuseAll`).
    let beside_refusals = (system == System::RefuseAll).then(|| Arc::new(AtomicU64::new(0)));
    if let Some(done) = &beside_refusals {
        closed_loop(
            &runtime,
            bench.workers,
            &env,
            bench.mean_service,
            bench.seed,
            done,
            &stop_background,
        );
    }
    if let Some(job) = spec.background {
        for _ in 0..job.workers {
            let (sut, done, stop) = (
                sut.clone(),
                background_done.clone(),
                stop_background.clone(),
            );
            let warm = start + bench.warmup;
            runtime.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    let request = Request {
                        priority: job.priority,
                        tenant: job.tenant,
                        service: job.chunk,
                        intended: now,
                        // Bulk work has no deadline worth the name.
                        deadline: now + Duration::from_secs(3600),
                        gives_way: job.gives_way,
                    };
                    let served = sut.serve(request).await;
                    if matches!(served, Outcome::Completed { .. }) && Instant::now() >= warm {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    if !matches!(served, Outcome::Completed { .. }) {
                        // Refused: back off a little rather than spin.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            });
        }
    }

    let serve = {
        let (sut, plan, outcomes, classes) =
            (sut.clone(), plan.clone(), outcomes.clone(), classes.clone());
        let slo = bench.slo;
        move |index: usize, intended: Instant| {
            let (sut, plan, outcomes, classes) =
                (sut.clone(), plan.clone(), outcomes.clone(), classes.clone());
            async move {
                let planned = plan[index];
                let request = Request {
                    priority: classes[planned.class].priority,
                    tenant: TenantId::new(planned.tenant as u64 + 1),
                    service: planned.service,
                    intended,
                    deadline: intended + slo,
                    gives_way: false,
                };
                let outcome = sut.serve(request).await;
                outcomes.record(index, outcome);
            }
        }
    };
    let generator = match spec.dispatch {
        Dispatch::Remote => {
            let handle = runtime.handle().clone();
            generate(plan.clone(), start, end, move |index, intended| {
                drop(handle.spawn(serve(index, intended)));
            })
        }
        Dispatch::Local => {
            let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
            runtime.spawn(async move {
                while let Some((index, intended)) = receiver.recv().await {
                    drop(tokio::spawn(serve(index, intended)));
                }
            });
            generate(plan.clone(), start, end, move |index, intended| {
                let _ = sender.send((index, intended));
            })
        }
        Dispatch::Socket => {
            let connections = socket_arrivals(&runtime, plan.clone(), start, serve)?;
            generate(plan.clone(), start, end, move |index, _| {
                // A frame that cannot be written is a request never sent:
                // it counts as a miss, as any request unfinished at the end.
                let mut connection = &connections[index % connections.len()];
                let _ = connection.write_all(&(index as u32).to_le_bytes());
            })
        }
    }
    .map_err(|error| format!("cannot start the generator thread: {error}"))?;

    let mut slot_totals = Vec::new();
    let warm = start + bench.warmup;
    let mut cpu_at_warm = None;
    let mut beside_at_warm = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
        let now = Instant::now();
        if cpu_at_warm.is_none() && now >= warm {
            cpu_at_warm = Some((now, process_cpu_time()));
            beside_at_warm = beside_refusals
                .as_ref()
                .map_or(0, |done| done.load(Ordering::Relaxed));
        }
        if let Some(total) = sut.slot_total() {
            slot_totals.push((now.saturating_duration_since(start), total));
        }
    }
    let cpu_busy = cpu_at_warm.and_then(|(since, used)| {
        let used = process_cpu_time()?.checked_sub(used?)?;
        let cores = std::thread::available_parallelism().ok()?.get() as f64;
        Some(used.as_secs_f64() / (since.elapsed().as_secs_f64() * cores))
    });
    let left_beside_arrivals = beside_refusals.zip(cpu_at_warm).map(|(done, (since, _))| {
        let served = done.load(Ordering::Relaxed) - beside_at_warm;
        served as f64 / since.elapsed().as_secs_f64() / bench.capacity
    });
    let records = outcomes.records(&plan);
    let refusals = sut.refusals();
    let background_done = background_done.load(Ordering::Relaxed);
    stop_background.store(true, Ordering::Relaxed);
    let delivery = generator.join();
    sut.close();
    runtime.shutdown_timeout(Duration::from_millis(200));
    Ok(RunResult {
        records,
        delivery: delivery.map_err(|_| "the generator thread panicked".to_string())?,
        length,
        warmup: bench.warmup,
        slot_totals,
        background_done,
        cpu_busy,
        left_beside_arrivals,
        refusals,
    })
}

/// User and system CPU time of the whole process, every thread (those that
/// have exited included), from `/proc/self/stat`; `None` off Linux.
fn process_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_ticks(&stat).map(|ticks| Duration::from_millis(ticks * 1000 / USER_HZ))
}

/// Clock ticks per second in `/proc`'s CPU times: `USER_HZ`, 100 on every
/// Linux architecture this suite runs on.
const USER_HZ: u64 = 100;

/// `utime + stime` from a `/proc/PID/stat` line. The command name, in
/// parentheses, may itself hold spaces and parentheses, so fields are
/// counted from the last `)`: utime and stime are fields 14 and 15.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way requests enter the runtime delivers each one to its own
    /// handler: at a tenth of the runtime's capacity, every request sent in
    /// the first half of the run has completed by its end (a frame read
    /// wrongly would leave some unfinished).
    #[test]
    fn every_dispatch_delivers_every_request_to_its_handler() {
        let mean_service = Duration::from_micros(500);
        let bench = Bench {
            units: WorkUnits::calibrate(),
            mean_service,
            capacity: 2_000.0,
            unloaded: Percentiles::default(),
            slo: mean_service * 10,
            warmup: Duration::from_millis(50),
            measure: Duration::from_millis(250),
            seed: 11,
            service: Service::Exponential,
            handler: Handler::YIELD,
            signal: SignalSource::GlobalQueueAndProbe,
            workers: DEFAULT_WORKERS,
            runtime: RuntimeSetup::Tokio,
        };
        let class = Class {
            name: "normal",
            priority: Priority::NORMAL,
        };
        for dispatch in [Dispatch::Remote, Dispatch::Local, Dispatch::Socket] {
            let mut spec = RunSpec::new(
                vec![class],
                vec![Stream {
                    class: 0,
                    tenant: 0,
                    steps: vec![(Duration::ZERO, 200.0)],
                }],
            );
            spec.dispatch = dispatch;
            let result = run(&bench, System::NoAdmission, &spec).unwrap();
            let half = result.length / 2;
            let early: Vec<_> = result
                .records
                .iter()
                .filter(|record| record.intended < half)
                .collect();
            assert!(!early.is_empty(), "{dispatch:?}");
            for record in early {
                assert!(
                    matches!(record.outcome, Outcome::Completed { .. }),
                    "{dispatch:?}: {record:?}"
                );
            }
        }
    }

    #[test]
    fn cpu_ticks_are_counted_from_the_last_parenthesis() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime ...
        let plain = "42 (overload) R 1 42 42 0 -1 4194304 10 0 0 0 250 75 0 0 20 0 9";
        assert_eq!(parse_cpu_ticks(plain), Some(325));
        let odd_name = "42 (a) b (c) S 1 42 42 0 -1 4194304 10 0 0 0 7 3 0 0 20 0 9";
        assert_eq!(parse_cpu_ticks(odd_name), Some(10));
        assert_eq!(parse_cpu_ticks("42 (cut short) R 1 42"), None);
        assert_eq!(parse_cpu_ticks("no name at all"), None);
    }

    #[test]
    fn this_process_reports_a_cpu_time_that_grows() {
        let before = process_cpu_time().expect("Linux has /proc/self/stat");
        // Spin until the counter moves (a tick is 10 ms), or give up.
        let give_up = Instant::now() + Duration::from_secs(10);
        let mut now = before;
        while now == before && Instant::now() < give_up {
            std::hint::black_box(0u64);
            now = process_cpu_time().unwrap();
        }
        assert!(now > before, "{now:?} after {before:?}");
    }
}
