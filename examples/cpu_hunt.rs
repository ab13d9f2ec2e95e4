//! Watch the CPU controller hunt for the slot total a runtime can sustain.
//!
//! `cargo run --release --example cpu_hunt` floods a two-worker tokio
//! runtime with closed-loop clients and prints, every 100 ms, the signal
//! (runnable tasks per worker), the slot total, slots used, waiters, and the
//! work admitted and completed in that interval. Three phases:
//!
//! 1. **compute**: 64 clients whose handlers compute in 50 µs chunks with a
//!    yield between them. The total settles near a few slots per worker.
//! 2. **io**: handlers also await a 200 µs timer (a stand-in for a database
//!    call) after each chunk. They are not runnable while they wait, so the
//!    total climbs until the CPU is busy again.
//! 3. **quiet**: no load. After a quiet second the controller goes idle.
//!
//! `--sweep` instead runs the compute flood once per threshold and prints
//! throughput and latency for each: the measurement behind the default.
//! `--threshold N` sets the threshold for the phased run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission::cpu::Controller;
use admission::{Priority, TenantId, WorkInfo};

const WORKERS: usize = 2;
const CLIENTS: usize = 64;
const CHUNK: Duration = Duration::from_micros(50);
const CHUNKS: u32 = 10;

/// Iterations of a trivial loop that take about one chunk on this machine.
fn calibrate() -> u64 {
    let mut iterations = 10_000u64;
    loop {
        let start = Instant::now();
        spin(iterations);
        let took = start.elapsed();
        if took >= Duration::from_millis(20) {
            return (iterations as f64 * CHUNK.as_secs_f64() / took.as_secs_f64()) as u64;
        }
        iterations *= 2;
    }
}

fn spin(iterations: u64) {
    let mut x = 0u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    std::hint::black_box(x);
}

#[derive(Default)]
struct Counters {
    admitted: AtomicU64,
    completed: AtomicU64,
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Compute,
    Io,
}

/// Runs `CLIENTS` closed-loop clients until `stop`; records each request's
/// service time (admission to completion, the time it held its slot) in
/// `latencies`. In a closed loop the wait for admission is fixed by the
/// number of clients (Little's law); what the slot total changes is how
/// many admitted handlers interleave on the workers, and so how long each
/// one takes once admitted: the latency a high-priority request sees even
/// when it is first in line.
fn start_clients(
    runtime: &tokio::runtime::Runtime,
    controller: &Arc<Controller>,
    phase: Phase,
    spin_per_chunk: u64,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
    latencies: &Arc<Mutex<Vec<u32>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|client| {
            let queue = controller.queue().clone();
            let counters = counters.clone();
            let stop = stop.clone();
            let latencies = latencies.clone();
            runtime.spawn(async move {
                let tenant = TenantId::new(client as u64 % 4 + 1);
                while !stop.load(Ordering::Relaxed) {
                    let work = WorkInfo::new(tenant, Priority::NORMAL);
                    let Ok(permit) = queue.admit(work).await else {
                        return;
                    };
                    let admitted = Instant::now();
                    counters.admitted.fetch_add(1, Ordering::Relaxed);
                    for _ in 0..CHUNKS {
                        spin(spin_per_chunk);
                        if phase == Phase::Io {
                            tokio::time::sleep(Duration::from_micros(200)).await;
                        } else {
                            tokio::task::yield_now().await;
                        }
                    }
                    drop(permit);
                    counters.completed.fetch_add(1, Ordering::Relaxed);
                    let micros = admitted.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                    latencies.lock().unwrap().push(micros);
                }
            })
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn controller(runtime: &tokio::runtime::Runtime, threshold: u32) -> Arc<Controller> {
    Arc::new(
        Controller::for_runtime(runtime.handle())
            .threshold(threshold)
            .build()
            .expect("valid settings"),
    )
}

fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    f64::from(sorted[rank - 1]) / 1000.0
}

/// One compute flood at `threshold`: (completions/s, service p50 ms, service
/// p99 ms, mean total).
fn flood(threshold: u32, spin_per_chunk: u64, seconds: u64) -> (f64, f64, f64, f64) {
    let runtime = runtime();
    let controller = controller(&runtime, threshold);
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let clients = start_clients(
        &runtime,
        &controller,
        Phase::Compute,
        spin_per_chunk,
        &counters,
        &stop,
        &latencies,
    );
    // Warm up, then measure.
    std::thread::sleep(Duration::from_millis(500));
    latencies.lock().unwrap().clear();
    let completed_before = counters.completed.load(Ordering::Relaxed);
    let mut totals = 0u64;
    let mut samples = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(10));
        totals += controller.queue().granter_snapshot().total;
        samples += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let completed = counters.completed.load(Ordering::Relaxed) - completed_before;
    stop.store(true, Ordering::Relaxed);
    controller.close();
    runtime.block_on(async {
        for client in clients {
            let _ = client.await;
        }
    });
    let mut sorted = std::mem::take(&mut *latencies.lock().unwrap());
    sorted.sort_unstable();
    (
        completed as f64 / elapsed,
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        totals as f64 / samples.max(1) as f64,
    )
}

/// How the controller's signal reads the runtime (the best this build has).
fn signal_source(controller: &Controller) -> String {
    controller
        .snapshot()
        .source
        .map_or_else(|| "injected".to_owned(), |source| source.to_string())
}

fn sweep(spin_per_chunk: u64) {
    println!("compute flood, {WORKERS} workers, {CLIENTS} clients, {CHUNKS} x {CHUNK:?} chunks per request");
    println!("signal: {}", signal_source(&controller(&runtime(), 1)));
    println!(
        "{:>9} {:>12} {:>17} {:>17} {:>11}",
        "threshold", "completed/s", "service p50 ms", "service p99 ms", "mean total"
    );
    for threshold in [1, 2, 3, 4, 8, 32] {
        let (rate, p50, p99, total) = flood(threshold, spin_per_chunk, 3);
        println!("{threshold:>9} {rate:>12.0} {p50:>17.2} {p99:>17.2} {total:>11.1}");
    }
}

fn phased(threshold: u32, spin_per_chunk: u64) {
    let runtime = runtime();
    let controller = controller(&runtime, threshold);
    println!(
        "threshold {threshold}, signal: {}; every 100 ms:",
        signal_source(&controller)
    );
    println!(
        "{:>6} {:>7} {:>7} {:>9} {:>6} {:>5} {:>8} {:>9} {:>10}",
        "t ms", "phase", "mode", "runnable", "total", "used", "waiting", "admitted", "completed"
    );
    let counters = Arc::new(Counters::default());
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut last = (0, 0);
    let mut report = |phase: &str| {
        let snapshot = controller.snapshot();
        let admitted = counters.admitted.load(Ordering::Relaxed);
        let completed = counters.completed.load(Ordering::Relaxed);
        println!(
            "{:>6} {:>7} {:>7} {:>9.2} {:>6} {:>5} {:>8} {:>9} {:>10}",
            start.elapsed().as_millis(),
            phase,
            format!("{:?}", snapshot.mode).to_lowercase(),
            snapshot.load.map_or(0.0, |load| load.per_worker()),
            snapshot.queue.granter.total,
            snapshot.queue.granter.used,
            snapshot.queue.waiting,
            admitted - last.0,
            completed - last.1,
        );
        last = (admitted, completed);
    };
    for (phase, name, seconds) in [
        (Some(Phase::Compute), "compute", 2),
        (Some(Phase::Io), "io", 2),
        (None, "quiet", 2),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = phase.map(|phase| {
            start_clients(
                &runtime,
                &controller,
                phase,
                spin_per_chunk,
                &counters,
                &stop,
                &latencies,
            )
        });
        for _ in 0..seconds * 10 {
            std::thread::sleep(Duration::from_millis(100));
            report(name);
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(clients) = clients {
            runtime.block_on(async {
                for client in clients {
                    let _ = client.await;
                }
            });
        }
    }
    let snapshot = controller.snapshot();
    println!(
        "\n{} samples, {} increases, {} decreases; last changes:",
        snapshot.samples, snapshot.increases, snapshot.decreases
    );
    for decision in snapshot.recent.iter().rev().take(5) {
        println!(
            "  at {:>5} ms: {} from {} (runnable/worker {:.2})",
            decision.at.as_millis(),
            decision.adjustment,
            decision.total_before,
            decision.runnable_per_worker
        );
    }
    if let Some(runtime) = snapshot.runtime {
        println!(
            "runtime (tokio-metrics): busy ratio {:.2} of {} workers",
            runtime.busy_ratio, runtime.workers
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threshold = args
        .iter()
        .position(|a| a == "--threshold")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("--threshold takes a number"))
        // The controller's default threshold.
        .unwrap_or(1);
    let spin_per_chunk = calibrate();
    if args.iter().any(|a| a == "--sweep") {
        sweep(spin_per_chunk);
    } else {
        phased(threshold, spin_per_chunk);
    }
}
