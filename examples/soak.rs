//! The soak run: every admission component live under 3x overload for ten
//! minutes, with rotating tenant ids and panicking callbacks injected now
//! and then. Not part of CI (it takes ten minutes); its result is in the
//! README.
//!
//! ```text
//! cargo run --release --example soak                  # 10 minutes, a row every 30 s
//! cargo run --release --example soak -- --minutes 2 --report-secs 10
//! ```
//!
//! What runs, on a 2-worker tokio runtime:
//!
//! * **CPU**: a [`Controller`] over the runtime's own signal, wrapped so that
//!   one sample in 2,000 panics (every 2 s at 1 ms sampling). Requests offered
//!   at three times capacity from a generator thread: 1 ms of compute in
//!   100 µs chunks with `yield_now` between them, a 20 ms deadline, a fresh
//!   tenant id every four requests (so the tenant table sees thousands of
//!   one-off tenants a second), usage counted as granted so that records
//!   outlive their permits. A quarter of the requests wait 1 ms on a timer
//!   half-way through, their slot given back meanwhile
//!   (`SlotPermit::release_during`), and are admitted again.
//! * **IO**: an [`io::Controller`](IoController) over a simulated LSM whose L0 grows with
//!   the bytes written and shrinks at a fixed compaction rate; one reading
//!   in 50 panics. Writers take byte tokens at an estimate and correct them
//!   to the actual size, now and then to an absurd one (`u64::MAX`).
//! * **GPU**: a [`QueryService`] on two simulated devices, queries of 1 to
//!   6 GiB held briefly; one observation in 500 panics in the observer.
//!
//! Every report prints the resident set size, the tenant records each queue
//! keeps, slots, token balances and GPU bytes. The run fails (exit status 1)
//! if the resident set grows by more than 10% after the first minute (the
//! first report at or after it is the baseline), or if at the end, with the
//! load stopped and everything drained, a slot, a waiter or a GPU byte is
//! not back, or a token queue does not admit a fresh write within ten
//! seconds (the debt the absurd corrections left must be bounded and repaid).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission::cpu::{Controller, CpuLoad, CpuSignal, RuntimeSignal};
use admission::gpu::backend::sim::{SimBackend, SimDevice};
use admission::gpu::backend::DeviceOrdinal;
use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
use admission::io::{Controller as IoController, LsmStats, LsmStatsSource};
use admission::{Priority, TenantId, Usage, WorkInfo, WorkQueue};

const GIB: u64 = 1 << 30;
const SERVICE: Duration = Duration::from_millis(1);
const CHUNK: Duration = Duration::from_micros(100);
const DEADLINE: Duration = Duration::from_millis(20);
const WORKERS: usize = 2;

struct Args {
    minutes: u64,
    report_secs: u64,
    overload: f64,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        minutes: 10,
        report_secs: 30,
        overload: 3.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--minutes" => {
                args.minutes = value("--minutes")?
                    .parse()
                    .map_err(|e| format!("--minutes: {e}"))?
            }
            "--report-secs" => {
                args.report_secs = value("--report-secs")?
                    .parse()
                    .map_err(|e| format!("--report-secs: {e}"))?
            }
            "--overload" => {
                args.overload = value("--overload")?
                    .parse()
                    .map_err(|e| format!("--overload: {e}"))?
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.minutes == 0 || args.report_secs == 0 || args.overload.is_nan() || args.overload <= 0.0
    {
        return Err("--minutes, --report-secs and --overload must be positive".into());
    }
    Ok(args)
}

/// The runtime's signal, with a panic now and then.
struct PanickySignal {
    inner: RuntimeSignal,
    samples: u64,
    every: u64,
}

impl CpuSignal for PanickySignal {
    fn sample(&mut self) -> CpuLoad {
        self.samples += 1;
        if self.samples % self.every == 0 {
            panic!("soak: injected CPU signal panic");
        }
        self.inner.sample()
    }
}

/// A simulated LSM: L0 grows with written bytes and is compacted at a fixed
/// rate; a reading panics now and then.
struct SimLsm {
    written: Arc<AtomicU64>,
    compacted: u64,
    started: Instant,
    readings: u64,
}

impl SimLsm {
    const FILE_BYTES: u64 = 4 << 20;
    const COMPACTION_PER_SEC: u64 = 64 << 20;

    fn read(&mut self) -> LsmStats {
        self.readings += 1;
        if self.readings % 50 == 0 {
            panic!("soak: injected LSM stats panic");
        }
        let written = self.written.load(Ordering::Relaxed);
        let can_compact =
            (self.started.elapsed().as_secs_f64() * Self::COMPACTION_PER_SEC as f64) as u64;
        self.compacted = can_compact.min(written);
        let l0_bytes = written - self.compacted;
        LsmStats {
            l0_files: l0_bytes / Self::FILE_BYTES,
            l0_sublevels: Some((l0_bytes / Self::FILE_BYTES / 4).min(50)),
            l0_bytes,
            flushed_bytes: written,
            ingested_bytes: written,
            compacted_bytes: Some(self.compacted),
            ..LsmStats::default()
        }
    }
}

impl LsmStatsSource for SimLsm {
    fn stats(&mut self) -> LsmStats {
        self.read()
    }
    fn tick_stats(&mut self) -> Option<LsmStats> {
        Some(self.read())
    }
}

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / (1024.0 * 1024.0)
}

fn spin(for_: Duration) {
    let start = Instant::now();
    while start.elapsed() < for_ {
        std::hint::spin_loop();
    }
}

/// Counts of what the load saw.
#[derive(Default)]
struct Tally {
    cpu_ok: AtomicU64,
    cpu_refused: AtomicU64,
    io_ok: AtomicU64,
    io_refused: AtomicU64,
    gpu_ok: AtomicU64,
    gpu_refused: AtomicU64,
    in_flight: AtomicU64,
}

fn main() {
    let args = match args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("soak: {error}");
            std::process::exit(2);
        }
    };
    // Injected panics are expected by the hundred: keep them off stderr.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| m.starts_with("soak: injected"));
        if !injected {
            default_hook(info);
        }
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("runtime");
    let handle = runtime.handle().clone();

    let controller = Arc::new(
        Controller::with_signal(PanickySignal {
            inner: RuntimeSignal::new(&handle),
            samples: 0,
            every: 2_000,
        })
        .queue(
            WorkQueue::builder()
                .early_rejection(true)
                .usage(Usage::Granted),
        )
        .build()
        .expect("controller"),
    );
    let written = Arc::new(AtomicU64::new(0));
    let io = Arc::new(
        IoController::builder(SimLsm {
            written: written.clone(),
            compacted: 0,
            started: Instant::now(),
            readings: 0,
        })
        .interval(Duration::from_secs(1))
        .l0_file_threshold(20)
        .l0_sublevel_threshold(10)
        .build()
        .expect("io controller"),
    );
    let observations = Arc::new(AtomicU64::new(0));
    let gpu = {
        let backend = Arc::new(SimBackend::new([
            SimDevice::new(0, 32 * GIB),
            SimDevice::new(1, 32 * GIB),
        ]));
        let profiles = (0..2)
            .map(|o| {
                DeviceProfile::builder(DeviceOrdinal(o))
                    .managed_capacity(16 * GIB)
                    .max_active_attempts(4)
                    .build()
                    .expect("profile")
            })
            .collect();
        let ownerships = (0..2)
            .map(|o| MemoryOwnership::exclusive(DeviceOrdinal(o)))
            .collect();
        let devices = DeviceSet::new(profiles, ownerships).expect("devices");
        let bounds = QueueBounds::new(256, Duration::from_millis(200), 2).expect("bounds");
        let observations = observations.clone();
        QueryService::builder(backend, devices, bounds)
            .observer(move |_| {
                if observations.fetch_add(1, Ordering::Relaxed) % 500 == 499 {
                    panic!("soak: injected GPU observer panic");
                }
            })
            .build()
            .expect("gpu service")
    };

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let capacity = WORKERS as f64 / SERVICE.as_secs_f64();
    let rate = capacity * args.overload;
    println!(
        "soak: {} min, CPU requests at {:.0}/s ({}x a capacity of {capacity:.0}/s), IO writers, GPU queries",
        args.minutes, rate, args.overload
    );

    // The generator: a thread, so that it is not itself queued behind the
    // overload it creates. Every millisecond it spawns what is due.
    let generator = {
        let (handle, controller, io, gpu, tally, stop, written) = (
            handle.clone(),
            controller.clone(),
            io.clone(),
            gpu.clone(),
            tally.clone(),
            stop.clone(),
            written.clone(),
        );
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let due = (start.elapsed().as_secs_f64() * rate) as u64;
                while sent < due {
                    sent += 1;
                    let seq = sent;
                    tally.in_flight.fetch_add(1, Ordering::Relaxed);
                    let (c, t) = (controller.clone(), tally.clone());
                    handle.spawn(async move {
                        cpu_request(&c, &t, seq).await;
                        t.in_flight.fetch_sub(1, Ordering::Relaxed);
                    });
                    if seq % 8 == 0 {
                        tally.in_flight.fetch_add(1, Ordering::Relaxed);
                        let (i, t, w) = (io.clone(), tally.clone(), written.clone());
                        handle.spawn(async move {
                            io_write(&i, &t, &w, seq).await;
                            t.in_flight.fetch_sub(1, Ordering::Relaxed);
                        });
                    }
                    if seq % 64 == 0 {
                        tally.in_flight.fetch_add(1, Ordering::Relaxed);
                        let (g, t) = (gpu.clone(), tally.clone());
                        handle.spawn(async move {
                            gpu_query(&g, &t, seq).await;
                            t.in_flight.fetch_sub(1, Ordering::Relaxed);
                        });
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };

    let start = Instant::now();
    let run_for = Duration::from_secs(args.minutes * 60);
    let every = Duration::from_secs(args.report_secs);
    let mut baseline: Option<f64> = None;
    let mut failures = Vec::new();
    println!(
        "{:>6} {:>8} {:>9} {:>9} {:>8} {:>11} {:>11} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "t s",
        "RSS MiB",
        "cpu tnts",
        "io tnts",
        "slots",
        "cpu ok/ref",
        "io ok/ref",
        "gpu ok",
        "gpu GiB",
        "sig pan",
        "lsm pan",
        "obs pan"
    );
    let mut next = every;
    while start.elapsed() < run_for {
        std::thread::sleep(
            next.saturating_sub(start.elapsed())
                .min(Duration::from_millis(200)),
        );
        if start.elapsed() < next {
            continue;
        }
        next += every;
        let rss = rss_mib();
        let cpu = controller.snapshot();
        let io_snapshot = io.snapshot();
        let io_tenants = io.queues().regular().snapshot().tenants.len()
            + io.queues().elastic().snapshot().tenants.len();
        let gpu_bytes: u64 = gpu
            .ledger_snapshots()
            .iter()
            .map(|r| r.live_grants_bytes)
            .sum();
        let observer_panics = gpu
            .admission_snapshot()
            .health
            .iter()
            .find(|h| h.component == "gpu_observer")
            .map_or(0, |h| h.panics);
        println!(
            "{:>6} {:>8.1} {:>9} {:>9} {:>8} {:>11} {:>11} {:>9} {:>8.1} {:>8} {:>8} {:>8}",
            start.elapsed().as_secs(),
            rss,
            cpu.queue.tenants.len(),
            io_tenants,
            format!("{}/{}", cpu.queue.granter.used, cpu.queue.granter.total),
            format!(
                "{}/{}",
                tally.cpu_ok.load(Ordering::Relaxed),
                tally.cpu_refused.load(Ordering::Relaxed)
            ),
            format!(
                "{}/{}",
                tally.io_ok.load(Ordering::Relaxed),
                tally.io_refused.load(Ordering::Relaxed)
            ),
            tally.gpu_ok.load(Ordering::Relaxed),
            gpu_bytes as f64 / GIB as f64,
            cpu.signal.panics,
            io_snapshot.source.panics + io_snapshot.tick_source.panics,
            observer_panics,
        );
        match baseline {
            None if start.elapsed() >= Duration::from_secs(60) => baseline = Some(rss),
            Some(base) if rss > base * 1.10 => failures.push(format!(
                "RSS grew from {base:.1} MiB to {rss:.1} MiB (more than 10%) at {} s",
                start.elapsed().as_secs()
            )),
            _ => {}
        }
    }

    // Drain: stop the load, let everything in flight settle.
    stop.store(true, Ordering::Relaxed);
    generator.join().expect("generator");
    let drain_start = Instant::now();
    while tally.in_flight.load(Ordering::Relaxed) > 0
        && drain_start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = tally.in_flight.load(Ordering::Relaxed);
    if left > 0 {
        failures.push(format!(
            "{left} requests still in flight 30 s after the load stopped"
        ));
    }
    let cpu = controller.snapshot();
    if cpu.queue.granter.used != 0 || cpu.queue.waiting != 0 {
        failures.push(format!(
            "CPU queue not quiescent: {} slots used, {} waiting",
            cpu.queue.granter.used, cpu.queue.waiting
        ));
    }
    for queue in [io.queues().regular(), io.queues().elastic()] {
        let waiting = queue.snapshot().waiting;
        if waiting != 0 {
            failures.push(format!("a token queue still has {waiting} waiters"));
        }
    }
    // Debt left by the absurd corrections is bounded and repaid by refills:
    // a fresh write of each class gets in within a few intervals.
    for priority in [Priority::NORMAL, Priority::BULK_NORMAL] {
        let work = WorkInfo::builder()
            .priority(priority)
            .requested(1)
            .timeout(Duration::from_secs(10))
            .build();
        if let Err(error) = runtime.block_on(io.admit(work)) {
            failures.push(format!(
                "a token queue is wedged: a 1-byte {priority} write got {error}"
            ));
        }
    }
    for report in gpu.ledger_snapshots() {
        if report.live_grants_bytes != 0 || report.active_attempts != 0 {
            failures.push(format!(
                "{}: {} bytes and {} attempts still granted",
                report.device, report.live_grants_bytes, report.active_attempts
            ));
        }
    }
    let gpu_queued = gpu.admission_snapshot().queued;
    if gpu_queued != 0 {
        failures.push(format!("{gpu_queued} GPU queries still queued"));
    }
    println!(
        "\nend: CPU {} admitted / {} refused, IO {} / {}, GPU {} / {}; signal panics {}, LSM panics {}, health: {} | {}",
        tally.cpu_ok.load(Ordering::Relaxed),
        tally.cpu_refused.load(Ordering::Relaxed),
        tally.io_ok.load(Ordering::Relaxed),
        tally.io_refused.load(Ordering::Relaxed),
        tally.gpu_ok.load(Ordering::Relaxed),
        tally.gpu_refused.load(Ordering::Relaxed),
        cpu.signal.panics,
        io.snapshot().source.panics,
        cpu.signal,
        io.snapshot().source,
    );
    controller.close();
    io.close();
    drop(runtime);
    if failures.is_empty() {
        println!("soak: passed (slots, waiters, GPU bytes conserved; RSS within 10% after the first minute)");
    } else {
        for failure in &failures {
            println!("soak: FAILED: {failure}");
        }
        std::process::exit(1);
    }
}

async fn cpu_request(controller: &Controller, tally: &Tally, seq: u64) {
    let priority = match seq % 10 {
        0 => Priority::USER_HIGH,
        1..=3 => Priority::NORMAL,
        _ => Priority::USER_LOW,
    };
    let work = WorkInfo::builder()
        .tenant(TenantId::new(seq / 4))
        .priority(priority)
        .timeout(DEADLINE)
        .build();
    let Ok(mut permit) = controller.admit(work).await else {
        tally.cpu_refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut left = SERVICE;
    while !left.is_zero() {
        let chunk = left.min(CHUNK);
        spin(chunk);
        left -= chunk;
        if seq % 4 == 0 && left == SERVICE / 2 {
            // A quarter of the requests wait on IO half-way through, with
            // their slot given back meanwhile: the second admission runs
            // under the same chaos as the first.
            let ((), again) = permit
                .release_during(tokio::time::sleep(Duration::from_millis(1)))
                .await;
            match again {
                Ok(again) => permit = again,
                Err(_) => {
                    tally.cpu_refused.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        tokio::task::yield_now().await;
    }
    drop(permit);
    tally.cpu_ok.fetch_add(1, Ordering::Relaxed);
}

async fn io_write(io: &IoController, tally: &Tally, written: &AtomicU64, seq: u64) {
    const ESTIMATE: u64 = 256 << 10;
    let work = WorkInfo::builder()
        .tenant(TenantId::new(seq / 16))
        .priority(if seq % 3 == 0 {
            Priority::BULK_NORMAL
        } else {
            Priority::NORMAL
        })
        .requested(ESTIMATE)
        .timeout(Duration::from_millis(200))
        .build();
    match io.admit(work.clone()).await {
        Ok(permit) => {
            let actual = if seq % 4096 == 0 {
                u64::MAX
            } else {
                (seq * 7919) % (1 << 20)
            };
            written.fetch_add(actual.min(1 << 20), Ordering::Relaxed);
            io.correct_tokens(&work, ESTIMATE, actual);
            drop(permit);
            tally.io_ok.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            tally.io_refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn gpu_query(gpu: &QueryService, tally: &Tally, seq: u64) {
    let bytes = (1 + seq % 6) * GIB;
    match gpu
        .resource_ticket(0)
        .with_working_set_hint(bytes)
        .admit()
        .await
    {
        Ok(handle) => {
            tokio::time::sleep(Duration::from_millis(2 + seq % 20)).await;
            handle.release().await;
            tally.gpu_ok.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            tally.gpu_refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}
