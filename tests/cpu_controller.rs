//! The CPU controller driven by an injected signal, step by step, under a
//! paused clock: every decision is deterministic.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::cpu::{Adjustment, Controller, CpuLoad, Hold, Mode};
use admission::{AdmitError, Priority, SlotPermit, TenantId, WorkInfo};
use tokio::time::Instant;

/// A signal whose next samples the test sets: runnable tasks on 2 workers.
#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<u64>>);

impl Scripted {
    fn set(&self, runnable: u64) {
        *self.0.lock().unwrap() = runnable;
    }
    fn signal(&self) -> impl FnMut() -> CpuLoad + Send + 'static {
        let runnable = self.0.clone();
        move || CpuLoad::new(*runnable.lock().unwrap(), 2)
    }
}

fn work() -> WorkInfo {
    WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)
}

/// A manual controller on 2 workers with threshold 2: overloaded at 4
/// runnable, underloaded at 2 or fewer.
fn controller(script: &Scripted, initial: u64) -> Controller {
    Controller::with_signal(script.signal())
        .threshold(2)
        .min_slots(1)
        .max_slots(6)
        .initial_slots(initial)
        .manual()
        .build()
        .unwrap()
}

fn hold(controller: &Controller, n: usize) -> Vec<SlotPermit> {
    (0..n)
        .map(|_| common::admit_now(controller.queue(), work()))
        .collect()
}

fn total(controller: &Controller) -> u64 {
    controller.queue().granter_snapshot().total
}

#[tokio::test(start_paused = true)]
async fn overload_takes_one_slot_a_tick_down_to_the_minimum() {
    let script = Scripted::default();
    let controller = controller(&script, 3);
    let held = hold(&controller, 3);
    script.set(4);
    assert_eq!(controller.step().adjustment, Adjustment::Decrease);
    assert_eq!(total(&controller), 2);
    // Three slots held, two allowed: the decrease has not taken effect.
    assert_eq!(
        controller.step().adjustment,
        Adjustment::Hold(Hold::UsedAboveTotal)
    );
    drop(held);
    let _one = hold(&controller, 1);
    assert_eq!(controller.step().adjustment, Adjustment::Decrease);
    assert_eq!(controller.step().adjustment, Adjustment::Hold(Hold::AtMin));
    assert_eq!(total(&controller), 1);
}

#[tokio::test(start_paused = true)]
async fn underload_with_every_slot_used_grows_the_total_to_the_maximum() {
    let script = Scripted::default();
    let controller = controller(&script, 4);
    let mut held = hold(&controller, 4);
    script.set(2);
    for expected_total in 5..=6 {
        assert_eq!(controller.step().adjustment, Adjustment::Increase);
        assert_eq!(total(&controller), expected_total);
        held.extend(hold(&controller, 1));
    }
    assert_eq!(controller.step().adjustment, Adjustment::Hold(Hold::AtMax));
    drop(held.pop());
    assert_eq!(
        controller.step().adjustment,
        Adjustment::Hold(Hold::SlotsFree)
    );
}

/// Bulk work held back by the elastic share waits for the total while
/// slots stand free (the share is a fraction of the total): the total
/// binds, and an underloaded tick raises it, as it does when every slot
/// is in use. Free slots with nobody waiting are no reason to.
#[tokio::test(start_paused = true)]
async fn underload_with_work_held_back_by_the_elastic_share_grows_the_total() {
    let script = Scripted::default();
    let controller = controller(&script, 4);
    let bulk = || WorkInfo::new(TenantId::SYSTEM, Priority::BULK_NORMAL);
    let _regular = hold(&controller, 1);
    let _bulk: Vec<_> = (0..2)
        .map(|_| common::admit_now(controller.queue(), bulk()))
        .collect();
    script.set(2);
    assert_eq!(
        controller.step().adjustment,
        Adjustment::Hold(Hold::SlotsFree),
        "three of four used, nobody waiting"
    );
    let mut waiting = common::enqueue(controller.queue(), bulk());
    assert_eq!(controller.queue().granter_snapshot().used, 3);
    assert_eq!(controller.step().adjustment, Adjustment::Increase);
    assert_eq!(total(&controller), 5);
    // Half of five is still two slots for bulk work: it goes on waiting,
    // and the next tick raises the total again.
    assert!(common::try_settle(&mut waiting).is_none());
    assert_eq!(controller.step().adjustment, Adjustment::Increase);
    assert_eq!(total(&controller), 6);
    assert!(common::try_settle(&mut waiting).expect("granted").is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_dead_band_holds_and_an_unadmitted_load_is_not_ours_to_shed() {
    let script = Scripted::default();
    let controller = controller(&script, 2);
    let _held = hold(&controller, 2);
    script.set(3);
    assert_eq!(
        controller.step().adjustment,
        Adjustment::Hold(Hold::DeadBand)
    );
    drop(_held);
    script.set(100);
    assert_eq!(
        controller.step().adjustment,
        Adjustment::Hold(Hold::NoneUsed)
    );
    assert_eq!(total(&controller), 2);
}

#[tokio::test(start_paused = true)]
async fn a_raised_total_grants_waiters_and_the_snapshot_tells_the_story() {
    let script = Scripted::default();
    let controller = controller(&script, 1);
    let _held = hold(&controller, 1);
    let mut waiter = common::enqueue(controller.queue(), work());
    script.set(0);
    let tick = controller.step();
    assert_eq!(tick.adjustment, Adjustment::Increase);
    assert_eq!((tick.slots_before.used, tick.slots_before.total), (1, 1));
    assert!(common::try_settle(&mut waiter).unwrap().is_ok());

    let snapshot = controller.snapshot();
    assert_eq!(snapshot.samples, 1);
    assert_eq!((snapshot.increases, snapshot.decreases), (1, 0));
    assert_eq!(snapshot.load, Some(CpuLoad::new(0, 2)));
    assert_eq!(snapshot.recent.len(), 1);
    assert_eq!(snapshot.recent[0].total_before, 1);
    assert_eq!(snapshot.queue.granter.total, 2);
    assert_eq!(snapshot.mode, Mode::Active);
    assert_eq!(snapshot.source, None);
}

/// A controller (see [`controller`]) after a quiet second: idle at the
/// window boundary.
async fn idle_controller(script: &Scripted, initial: u64) -> Controller {
    let controller = controller(script, initial);
    let start = Instant::now();
    while Instant::now() - start < Duration::from_secs(1) {
        tokio::time::advance(Duration::from_millis(1)).await;
        controller.step();
    }
    assert_eq!(controller.snapshot().mode, Mode::Idle);
    controller
}

#[tokio::test(start_paused = true)]
async fn an_idle_node_stops_enforcing_and_the_first_load_resumes_it() {
    let script = Scripted::default();
    let controller = idle_controller(&script, 1).await;
    assert_eq!(controller.step().adjustment, Adjustment::Hold(Hold::Idle));
    let held = hold(&controller, 1);
    assert_eq!(controller.step().mode, Mode::Idle, "within the total");

    // Load shows up: enforcing again, and the total is back in charge.
    script.set(5);
    let tick = controller.step();
    assert_eq!(tick.mode, Mode::Active);
    assert_eq!(controller.snapshot().idle_overruns, 0, "the load did it");
    let mut waiter = common::enqueue(controller.queue(), work());
    drop(held);
    assert!(common::try_settle(&mut waiter).unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn demand_past_the_total_while_idle_resumes_enforcing_before_any_load_shows() {
    let script = Scripted::default();
    let controller = idle_controller(&script, 2).await;
    // Within the total: still idle.
    let mut held = hold(&controller, 2);
    assert_eq!(controller.step().mode, Mode::Idle);
    // One past it, admitted at once (not enforcing): the signal still
    // reads nothing (a sample is an idle period away on the sampler
    // thread), but the overrun ends idleness.
    held.extend(hold(&controller, 1));
    assert_eq!(controller.snapshot().idle_overruns, 0);
    let tick = controller.step();
    assert_eq!(tick.mode, Mode::Active);
    assert_eq!(controller.snapshot().idle_overruns, 1);
    assert_eq!(controller.queue().granter_snapshot().used, 3);
    // The total is enforced: a request waits.
    let mut waiter = common::enqueue(controller.queue(), work());
    drop(held.pop());
    drop(held.pop());
    assert!(common::try_settle(&mut waiter).unwrap().is_ok());
}

#[test]
fn demand_past_the_total_wakes_an_idle_sampler_thread() {
    // An idle period far longer than the test may take: only the alarm can
    // wake the sampler in time.
    let controller = Controller::with_signal(|| CpuLoad::new(0, 2))
        .initial_slots(2)
        .min_slots(1)
        .idle_period(Duration::from_secs(60))
        .build()
        .unwrap();
    let wait_for = |mode: Mode, what: &str| {
        let since = std::time::Instant::now();
        while controller.snapshot().mode != mode {
            assert!(since.elapsed() < Duration::from_secs(30), "never {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // A quiet second of real time on the sampler thread.
    wait_for(Mode::Idle, "went idle");
    let ticks = controller.snapshot().ticks;
    let held = hold(&controller, 3);
    wait_for(Mode::Active, "woke");
    assert!(controller.snapshot().ticks > ticks);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn closing_fails_waiters_and_keeps_granted_permits() {
    let script = Scripted::default();
    let controller = controller(&script, 1);
    let held = hold(&controller, 1);
    let mut waiter = common::enqueue(controller.queue(), work());
    controller.close();
    assert_eq!(
        common::try_settle(&mut waiter).unwrap().unwrap_err(),
        AdmitError::Closed
    );
    assert_eq!(
        controller.admit(work()).await.unwrap_err(),
        AdmitError::Closed
    );
    drop(held);
    assert_eq!(controller.queue().granter_snapshot().used, 0);
}

#[test]
fn dropping_the_controller_stops_and_joins_its_sampler_thread() {
    let samples = Arc::new(AtomicU64::new(0));
    let counter = samples.clone();
    let controller = Controller::with_signal(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        CpuLoad::new(0, 1)
    })
    .build()
    .unwrap();
    let queue = controller.queue().clone();
    drop(controller);
    // The signal (and its clone of the counter) lived on the sampler's
    // side; it is gone only if the thread has ended.
    assert_eq!(Arc::strong_count(&samples), 1);
    assert!(samples.load(Ordering::Relaxed) >= 1, "sampled at build");
    assert!(queue.is_closed());
}

#[test]
fn bad_settings_fail_at_build_naming_the_field() {
    let cases: Vec<(&str, admission::cpu::ControllerBuilder)> = vec![
        (
            "threshold",
            Controller::with_signal(|| CpuLoad::new(0, 1)).threshold(0),
        ),
        (
            "min_slots",
            Controller::with_signal(|| CpuLoad::new(0, 1)).min_slots(0),
        ),
        (
            "max_slots",
            Controller::with_signal(|| CpuLoad::new(0, 1))
                .min_slots(5)
                .max_slots(4),
        ),
        (
            "initial_slots",
            Controller::with_signal(|| CpuLoad::new(0, 1))
                .max_slots(4)
                .initial_slots(9),
        ),
        (
            "period",
            Controller::with_signal(|| CpuLoad::new(0, 1)).period(Duration::ZERO),
        ),
        (
            "idle_period",
            Controller::with_signal(|| CpuLoad::new(0, 1))
                .period(Duration::from_millis(10))
                .idle_period(Duration::from_millis(1)),
        ),
        (
            "idle_below",
            Controller::with_signal(|| CpuLoad::new(0, 1)).idle_below(f64::NAN),
        ),
    ];
    for (field, builder) in cases {
        let error = builder.manual().build().unwrap_err();
        assert_eq!(error.field(), field, "{error}");
    }
}

/// The controller's default queue scales epoch-LIFO to the deadlines
/// requests carry (nothing until they carry one).
#[tokio::test(start_paused = true)]
async fn the_default_queue_scales_epoch_lifo_to_the_requests_deadlines() {
    let script = Scripted::default();
    let controller = controller(&script, 1);
    let queue = controller.queue();
    // (Fewer than tokio's cooperative budget of polls in all: the test's
    // task never yields.)
    for _ in 0..40 {
        drop(common::admit_now(queue, work()));
    }
    queue.maintain();
    assert_eq!(queue.snapshot().epoch_lifo, None, "no deadlines, no LIFO");
    let with_deadline = || {
        WorkInfo::builder()
            .priority(Priority::NORMAL)
            .timeout(Duration::from_millis(20))
            .build()
    };
    for _ in 0..32 {
        drop(common::admit_now(queue, with_deadline()));
    }
    queue.maintain();
    assert_eq!(
        queue.snapshot().epoch_lifo,
        Some(admission::EpochLifo::for_deadline(Duration::from_millis(
            20
        )))
    );
}
