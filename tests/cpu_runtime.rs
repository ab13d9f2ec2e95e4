//! The CPU controller on a real two-worker runtime, with its own sampler
//! thread and the runtime's own signal (run-queue depths under
//! `tokio_unstable`, the scheduling-delay probe without). Assertions are on
//! direction and bounds, never on how fast: each phase runs until the
//! controller has moved the way it must, with a generous liveness guard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use admission::cpu::{Adjustment, Controller, Hold, Mode};
use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use common::HeldRuntime;

const GUARD: Duration = Duration::from_secs(60);

fn spin(iterations: u64) {
    let mut x = 0u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
}

/// Iterations of `spin` that take about 50 µs here (debug or release): the
/// chunk of computation between two awaits, and what the stable signal's
/// probe assumes one poll costs.
fn chunk_iterations() -> u64 {
    let mut iterations = 1_000u64;
    loop {
        let start = Instant::now();
        spin(iterations);
        let took = start.elapsed();
        if took >= Duration::from_millis(20) {
            return (iterations as f64 * 50e-6 / took.as_secs_f64()).max(1.0) as u64;
        }
        iterations *= 2;
    }
}

/// `clients` closed-loop handlers that either compute in chunks with a yield
/// between them, or mostly wait (on a timer standing in for IO).
fn start_load(
    runtime: &tokio::runtime::Runtime,
    queue: &WorkQueue,
    clients: usize,
    io_bound: bool,
    chunk: u64,
    stop: &Arc<AtomicBool>,
) {
    for _ in 0..clients {
        let queue = queue.clone();
        let stop = stop.clone();
        runtime.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let work = WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL);
                let Ok(permit) = queue.admit(work).await else {
                    return;
                };
                for _ in 0..10 {
                    if io_bound {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    } else {
                        spin(chunk);
                        tokio::task::yield_now().await;
                    }
                }
                drop(permit);
            }
        });
    }
}

/// The runtime every test here reads: two workers, with timers.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits (checking every few milliseconds) until `condition` holds.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < GUARD, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_cpu_flood_shrinks_the_total_and_io_bound_work_grows_it_back() {
    let runtime = two_workers();
    let controller = Controller::for_runtime(runtime.handle())
        .min_slots(1)
        .max_slots(64)
        .initial_slots(32)
        .build()
        .unwrap();
    let total = || controller.queue().granter_snapshot().total;
    let chunk = chunk_iterations();

    // Compute-bound flood: 32 slots of yielding handlers keep both run
    // queues deep, so the controller must take slots away.
    let compute = Arc::new(AtomicBool::new(false));
    start_load(&runtime, controller.queue(), 64, false, chunk, &compute);
    eventually("the total shrinks under a compute flood", || total() <= 24);
    let shrunk = total();
    assert!(shrunk >= 1);
    compute.store(true, Ordering::Relaxed);

    // The same demand, but handlers mostly wait: the run queues drain, every
    // slot is in use, so the controller must give slots back.
    let io = Arc::new(AtomicBool::new(false));
    start_load(&runtime, controller.queue(), 64, true, chunk, &io);
    eventually("the total grows back under IO-bound work", || {
        total() >= shrunk + 8
    });
    assert!(total() <= 64, "never above max_slots");
    io.store(true, Ordering::Relaxed);

    // One cut in proportion to the holds' inflation may do all of the
    // shrinking; growing back is a slot at a time.
    let snapshot = controller.snapshot();
    assert!(
        snapshot.decreases >= 1 && snapshot.increases >= 8,
        "{snapshot:?}"
    );
    assert!(snapshot.runtime.is_some_and(|r| r.workers == 2));

    // With the load gone, the node goes idle and stops enforcing.
    eventually("the controller goes idle", || {
        controller.snapshot().mode == Mode::Idle
    });
    controller.close();
    runtime.shutdown_timeout(Duration::from_secs(5));
}

/// Yielding handlers keep both workers busy without showing in any run
/// queue (a yielded task waits in its worker's defer list), so the runnable
/// rule alone reads spare capacity and would add slots. The controller must
/// see that no worker ever runs out of work and hold the total instead.
#[test]
fn yielding_handlers_that_keep_every_worker_busy_are_not_given_more_slots() {
    let runtime = two_workers();
    let controller = Controller::for_runtime(runtime.handle())
        .min_slots(1)
        .initial_slots(2)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    start_load(
        &runtime,
        controller.queue(),
        8,
        false,
        chunk_iterations(),
        &stop,
    );
    eventually("an increase held back for busy workers", || {
        let snapshot = controller.snapshot();
        snapshot.last_adjustment == Some(Adjustment::Hold(Hold::WorkersBusy))
            && snapshot.worker_idled == Some(false)
    });
    stop.store(true, Ordering::Relaxed);
    eventually("the workers run out of work once the load stops", || {
        controller.snapshot().worker_idled == Some(true)
    });
    controller.close();
    runtime.shutdown_timeout(Duration::from_secs(5));
}

#[test]
fn the_stable_probe_can_be_chosen_in_any_build() {
    use admission::cpu::{Controller, SignalSource};
    let runtime = two_workers();
    let probing = Controller::for_runtime(runtime.handle())
        .signal_source(SignalSource::GlobalQueueAndProbe)
        .manual()
        .build()
        .unwrap();
    assert_eq!(
        probing.snapshot().source,
        Some(SignalSource::GlobalQueueAndProbe)
    );
    let depths = Controller::for_runtime(runtime.handle())
        .signal_source(SignalSource::QueueDepths)
        .manual()
        .build();
    if cfg!(tokio_unstable) {
        assert_eq!(
            depths.unwrap().snapshot().source,
            Some(SignalSource::QueueDepths)
        );
    } else {
        assert_eq!(depths.unwrap_err().field(), "signal_source");
    }
    // Without a choice, the best this build has.
    let best = Controller::for_runtime(runtime.handle())
        .manual()
        .build()
        .unwrap();
    let expected = if cfg!(tokio_unstable) {
        SignalSource::QueueDepths
    } else {
        SignalSource::GlobalQueueAndProbe
    };
    assert_eq!(best.snapshot().source, Some(expected));
}

/// Tasks spawned from outside the runtime while its only worker is busy wait
/// in tokio's global queue, where admission cannot order them: the
/// controller reports the window as backlogged, and a window after they
/// have run as clear.
#[test]
fn tasks_waiting_in_the_global_queue_are_reported() {
    // The controller judges the global queue in windows of 1,000 ticks.
    const BACKLOG_WINDOW_TICKS: u32 = 1_000;

    let held = HeldRuntime::new(8);
    let controller = Controller::for_runtime(held.runtime.handle())
        .manual()
        .build()
        .unwrap();
    for _ in 0..BACKLOG_WINDOW_TICKS {
        controller.step();
    }
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.mode, Mode::Active);
    let seen = snapshot
        .global_queue
        .expect("a runtime's controller watches it");
    assert_eq!((seen.windows, seen.backlogged_windows), (1, 1));
    assert!(seen.latest_backlogged);
    assert!(seen.latest_max_depth >= held.waiting, "{seen:?}");

    held.release();
    for _ in 0..BACKLOG_WINDOW_TICKS {
        controller.step();
    }
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.mode, Mode::Active);
    let seen = snapshot.global_queue.unwrap();
    assert_eq!((seen.windows, seen.backlogged_windows), (2, 1));
    assert!(!seen.latest_backlogged, "{seen:?}");
}

/// A runtime built through `configure_runtime` is an ordinary runtime
/// that the controller reads as any other.
#[test]
fn a_configured_runtime_runs_admitted_work() {
    let runtime =
        admission::cpu::configure_runtime(&mut tokio::runtime::Builder::new_multi_thread())
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
    let controller = Controller::for_runtime(runtime.handle()).build().unwrap();
    let queue = controller.queue().clone();
    let served = runtime.block_on(async move {
        let mut served = 0;
        for _ in 0..16 {
            let permit = queue
                .admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL))
                .await
                .unwrap();
            tokio::task::yield_now().await;
            drop(permit);
            served += 1;
        }
        served
    });
    assert_eq!(served, 16);
    assert_eq!(controller.snapshot().queue.granter.used, 0);
}

/// The stable probe reads a stalled runtime (its only worker held, not
/// parked) as overloaded, from the age of the measurement it cannot finish,
/// and reads it as quiet again once the worker is free: the age counts only
/// while no worker is parked, which is what keeps an idle runtime, whose
/// parked workers take a while to wake on a VM, from reading as loaded.
#[test]
fn the_probe_reads_a_stalled_runtime_as_loaded_and_a_freed_one_as_quiet() {
    use admission::cpu::SignalSource;

    let held = HeldRuntime::new(0);
    let controller = Controller::for_runtime(held.runtime.handle())
        .signal_source(SignalSource::GlobalQueueAndProbe)
        .manual()
        .build()
        .unwrap();
    let per_worker = || {
        controller
            .step()
            .load
            .expect("the probe does not panic")
            .per_worker()
    };
    // The probe's poll estimate is 50 µs: 20 a worker is a measurement
    // waiting for a millisecond behind the held worker.
    eventually("the stalled runtime reads as loaded", || {
        per_worker() >= 20.0
    });
    held.release();
    eventually("the freed runtime reads as quiet", || per_worker() < 1.0);
}
