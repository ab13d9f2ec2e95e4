//! The CPU controller when its signal panics: once, always, or for a while.
//! It fails closed (enforcing, the total held) and says so in its snapshot.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::cpu::{Adjustment, Controller, ControllerBuilder, CpuLoad, Hold, Mode};
use admission::{Priority, TenantId, WorkInfo};
use tokio::time::Instant;

fn work() -> WorkInfo {
    WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)
}

/// What the scripted signal does on its next samples.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Behaviour {
    Runnable(u64),
    Panic,
}

#[derive(Clone)]
struct Script(Arc<Mutex<Behaviour>>);

impl Script {
    fn new() -> Self {
        Script(Arc::new(Mutex::new(Behaviour::Runnable(0))))
    }
    fn set(&self, behaviour: Behaviour) {
        *self.0.lock().unwrap() = behaviour;
    }
    fn signal(&self) -> impl FnMut() -> CpuLoad + Send + 'static {
        let script = self.0.clone();
        move || {
            // Copied out first: the panic must not poison the script.
            let behaviour = *script.lock().unwrap();
            match behaviour {
                Behaviour::Runnable(runnable) => CpuLoad::new(runnable, 2),
                Behaviour::Panic => panic!("the signal broke"),
            }
        }
    }
}

/// A quiet second under the paused clock: the controller goes idle.
async fn go_idle(controller: &Controller) {
    let start = Instant::now();
    while Instant::now() - start < Duration::from_secs(1) {
        tokio::time::advance(Duration::from_millis(1)).await;
        let _ = catch_unwind(AssertUnwindSafe(|| controller.step()));
    }
    assert_eq!(controller.snapshot().mode, Mode::Idle);
}

#[tokio::test(start_paused = true)]
async fn a_signal_that_panics_while_idle_turns_enforcement_back_on() {
    let script = Script::new();
    let controller = Controller::with_signal(script.signal())
        .threshold(2)
        .min_slots(1)
        .max_slots(6)
        .initial_slots(1)
        .manual()
        .build()
        .unwrap();
    go_idle(&controller).await;

    script.set(Behaviour::Panic);
    let _ = catch_unwind(AssertUnwindSafe(|| controller.step()));

    // Five ask against a total of one: the controller does not know the
    // load, so it enforces the total it has.
    let mut admitted = Vec::new();
    for _ in 0..5 {
        let mut admit = tokio_test::task::spawn(controller.admit(work()));
        if let std::task::Poll::Ready(Ok(permit)) = admit.poll() {
            admitted.push(permit);
        }
    }
    assert_eq!(admitted.len(), 1, "enforcing a total of 1");
}

fn manual(script: &Script, initial: u64) -> Controller {
    Controller::with_signal(script.signal())
        .threshold(2)
        .min_slots(1)
        .max_slots(6)
        .initial_slots(initial)
        .manual()
        .build()
        .unwrap()
}

fn total(controller: &Controller) -> u64 {
    controller.queue().granter_snapshot().total
}

#[tokio::test(start_paused = true)]
async fn a_failing_signal_holds_the_total_and_says_so() {
    let script = Script::new();
    let controller = manual(&script, 3);
    let held: Vec<_> = (0..3)
        .map(|_| common::admit_now(controller.queue(), work()))
        .collect();

    // Overloaded, then the signal breaks: no decrease, no increase.
    script.set(Behaviour::Panic);
    for _ in 0..5 {
        let tick = controller.step();
        assert_eq!(tick.load, None);
        assert_eq!(tick.mode, Mode::Active);
        assert_eq!(tick.adjustment, Adjustment::Hold(Hold::SignalFailed));
    }
    assert_eq!(total(&controller), 3, "held where it was");
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.ticks, 5, "the sampler is alive");
    assert_eq!(snapshot.samples, 0, "but nothing was sampled");
    assert_eq!(snapshot.signal.component, "cpu_signal");
    assert_eq!(
        (snapshot.signal.panics, snapshot.signal.consecutive_panics),
        (5, 5)
    );
    assert_eq!(
        snapshot.signal.last_panic.as_deref(),
        Some("the signal broke")
    );
    assert!(!snapshot.signal.is_healthy());
    assert!(snapshot.sampler.is_healthy());
    assert_eq!(
        snapshot.last_adjustment,
        Some(Adjustment::Hold(Hold::SignalFailed))
    );

    // Still enforcing a total of 3 with 3 held: the next one waits.
    let mut waiter = common::enqueue(controller.queue(), work());
    drop(held);
    assert!(common::try_settle(&mut waiter).unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_signal_that_panics_once_costs_one_tick() {
    let script = Script::new();
    let controller = manual(&script, 2);
    let _held: Vec<_> = (0..2)
        .map(|_| common::admit_now(controller.queue(), work()))
        .collect();
    script.set(Behaviour::Panic);
    assert_eq!(
        controller.step().adjustment,
        Adjustment::Hold(Hold::SignalFailed)
    );
    script.set(Behaviour::Runnable(0));
    let tick = controller.step();
    assert_eq!(tick.adjustment, Adjustment::Increase, "the rule resumes");
    assert_eq!(tick.load, Some(CpuLoad::new(0, 2)));
    let health = controller.snapshot().signal;
    assert_eq!((health.panics, health.consecutive_panics), (1, 0));
    assert!(health.is_healthy());
}

#[tokio::test(start_paused = true)]
async fn after_a_failure_going_idle_takes_a_fresh_quiet_second() {
    let script = Script::new();
    let controller = manual(&script, 1);
    go_idle(&controller).await;
    script.set(Behaviour::Panic);
    controller.step();
    assert_eq!(controller.snapshot().mode, Mode::Active);

    // The signal returns, quiet: enforcement stays on until a whole quiet
    // window has passed again.
    script.set(Behaviour::Runnable(0));
    for _ in 0..999 {
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(controller.step().mode, Mode::Active);
    }
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(controller.step().mode, Mode::Idle);
}

#[tokio::test(start_paused = true)]
async fn a_signal_that_panics_at_build_starts_the_smallest_controller() {
    let script = Script::new();
    script.set(Behaviour::Panic);
    let controller = Controller::with_signal(script.signal())
        .manual()
        .build()
        .expect("a panicking signal is not a configuration error");
    assert_eq!(total(&controller), 1, "one worker assumed");
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.signal.panics, 1);
    assert_eq!(snapshot.mode, Mode::Active);
    assert_eq!(snapshot.ticks, 0);

    let _first = common::admit_now(controller.queue(), work());
    let _waiter = common::enqueue(controller.queue(), work());
}

#[tokio::test(start_paused = true)]
async fn absurd_samples_are_read_not_panicked_on() {
    let script = Arc::new(Mutex::new(CpuLoad::new(0, 1)));
    let reading = script.clone();
    let controller = Controller::with_signal(move || *reading.lock().unwrap())
        .manual()
        .build()
        .unwrap();
    let absurd = [
        CpuLoad::new(u64::MAX, 0),
        CpuLoad {
            runnable: u64::MAX,
            workers: 0,
            probe_delay: Some(Duration::MAX),
        },
        CpuLoad::new(0, u32::MAX),
        CpuLoad::new(u64::MAX, u32::MAX),
    ];
    for load in absurd {
        *script.lock().unwrap() = load;
        for _ in 0..3 {
            tokio::time::advance(Duration::from_millis(1)).await;
            controller.step();
        }
    }
    assert!(controller.snapshot().signal.is_healthy());
}

#[test]
fn the_sampler_thread_survives_a_signal_that_always_panics() {
    let (sampled, samples) = std::sync::mpsc::channel();
    let controller = Controller::with_signal(move || -> CpuLoad {
        let _ = sampled.send(());
        panic!("the signal broke");
    })
    .period(Duration::from_millis(1))
    .idle_period(Duration::from_millis(1))
    .build()
    .unwrap();
    // One call at build, then the thread's: the fourth call means the
    // thread came back from three panics.
    for _ in 0..5 {
        samples
            .recv_timeout(Duration::from_secs(60))
            .expect("the sampler keeps calling");
    }
    let snapshot = controller.snapshot();
    assert!(snapshot.ticks >= 3, "{snapshot:?}");
    assert!(snapshot.signal.panics >= 4, "{snapshot:?}");
    assert!(
        snapshot.sampler.is_healthy(),
        "each panic caught at the signal"
    );
    assert_eq!(snapshot.mode, Mode::Active);
    controller.close();
}

#[test]
fn a_signal_that_closes_its_own_controller_closes_it() {
    // The sampler thread cannot join itself: closing from inside a sample
    // used to panic there (caught by the signal's boundary) before the
    // queue was closed, leaving an open queue with no sampler.
    let own: Arc<std::sync::OnceLock<std::sync::Weak<Controller>>> = Arc::default();
    let (closed, closes) = std::sync::mpsc::channel();
    let signal = {
        let own = own.clone();
        let mut samples = 0u32;
        move || -> CpuLoad {
            samples += 1;
            if samples == 3 {
                if let Some(controller) = own.get().and_then(std::sync::Weak::upgrade) {
                    controller.close();
                    let _ = closed.send(());
                }
            }
            CpuLoad::new(0, 1)
        }
    };
    let controller = Arc::new(
        Controller::with_signal(signal)
            .period(Duration::from_millis(1))
            .idle_period(Duration::from_millis(1))
            .build()
            .unwrap(),
    );
    own.set(Arc::downgrade(&controller)).unwrap();
    closes
        .recv_timeout(Duration::from_secs(60))
        .expect("the sampler's close returned");
    assert!(controller.queue().is_closed());
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.signal.panics, 0, "{snapshot:?}");
    drop(controller);
}

/// Every setting of the builder at its absurd values: each is a
/// `ConfigError` naming the setting, never a panic and never a controller
/// that cannot admit or cannot enforce.
#[test]
fn absurd_builder_settings_are_refused_naming_the_field() {
    type Setting = fn(ControllerBuilder) -> ControllerBuilder;
    let rows: &[(&str, Setting)] = &[
        ("threshold", |b| b.threshold(0)),
        ("threshold", |b| b.threshold(1025)),
        ("threshold", |b| b.threshold(u32::MAX)),
        ("min_slots", |b| b.min_slots(0)),
        ("max_slots", |b| b.max_slots(0)),
        ("max_slots", |b| b.max_slots(u64::MAX)),
        ("max_slots", |b| b.min_slots(5).max_slots(4)),
        ("initial_slots", |b| b.initial_slots(0)),
        ("initial_slots", |b| b.max_slots(4).initial_slots(5)),
        ("initial_slots", |b| b.initial_slots(u64::MAX)),
        ("period", |b| b.period(Duration::ZERO)),
        ("period", |b| b.period(Duration::MAX)),
        ("idle_period", |b| b.idle_period(Duration::ZERO)),
        ("idle_period", |b| b.idle_period(Duration::MAX)),
        ("idle_period", |b| {
            b.period(Duration::from_millis(10))
                .idle_period(Duration::from_millis(5))
        }),
        ("idle_below", |b| b.idle_below(f64::NAN)),
        ("idle_below", |b| b.idle_below(f64::INFINITY)),
        ("idle_below", |b| b.idle_below(f64::NEG_INFINITY)),
        ("idle_below", |b| b.idle_below(0.0)),
        ("idle_below", |b| b.idle_below(-1.0)),
        ("idle_below", |b| b.threshold(1).idle_below(0.6)),
    ];
    for (field, setting) in rows {
        let builder = setting(Controller::with_signal(|| CpuLoad::new(0, 2)).manual());
        match builder.build() {
            Err(error) => assert_eq!(error.field(), *field, "{error}"),
            Ok(controller) => panic!("{field}: accepted {controller:?}"),
        }
    }
}

#[test]
fn a_poll_estimate_outside_its_range_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for poll in [Duration::ZERO, Duration::from_nanos(999), Duration::MAX] {
        let error = Controller::for_runtime(runtime.handle())
            .poll_estimate(poll)
            .manual()
            .build()
            .expect_err("out of range");
        assert_eq!(error.field(), "poll_estimate", "{poll:?}");
    }
    Controller::for_runtime(runtime.handle())
        .poll_estimate(Duration::from_micros(1))
        .manual()
        .build()
        .unwrap();
}
