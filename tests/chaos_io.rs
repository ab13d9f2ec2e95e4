//! Byte-token admission under hostile callers and a failing engine reader:
//! a stats source that panics (once, always, then recovers), corrections of
//! any size, absurd settings. Writers keep being admitted, debts stay
//! bounded, and health says what broke.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use admission::grant::TokenClass;
use admission::grant::TokenGranter;
use admission::io::{Controller, ControllerBuilder, LsmStats, LsmStatsSource, Tick, Tokens};
use admission::TokenQueues;
use admission::{Priority, TenantId, WorkInfo, WorkQueue};

const MIB: u64 = 1 << 20;
/// Failed interval readings in a row after which the controller takes its
/// safe budget, as the failure model documents.
const STATS_FAILURES_BEFORE_FALLBACK: u64 = 4;

fn write(priority: Priority, bytes: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(7))
        .priority(priority)
        .requested(bytes)
        .build()
}

fn available(queues: &TokenQueues) -> (i64, i64) {
    (
        queues.regular().snapshot().granter.available,
        queues.elastic().snapshot().granter.available,
    )
}

#[tokio::test(start_paused = true)]
async fn one_huge_correction_leaves_a_bounded_debt() {
    let queues = TokenQueues::new(1_000, 1_000).unwrap();
    queues.set_limits(Some(1_000), Some(1_000)).unwrap();
    queues.add_tokens(1_000, 1_000);
    let first = write(Priority::NORMAL, 100);
    drop(queues.admit(first.clone()).await.unwrap());
    queues.correct_tokens(&first, 100, u64::MAX);
    assert_eq!(available(&queues), (-1_000, -1_000), "one burst of debt");

    // A whole interval's refills (sixty bursts) later, writers get in again.
    let mut writer = tokio_test::task::spawn(queues.admit(write(Priority::NORMAL, 10)));
    let mut elastic = tokio_test::task::spawn(queues.admit(write(Priority::BULK_NORMAL, 10)));
    for _ in 0..61 {
        queues.add_tokens(1_000, 1_000);
    }
    assert!(
        matches!(writer.poll(), Poll::Ready(Ok(_))),
        "regular writer"
    );
    assert!(
        matches!(elastic.poll(), Poll::Ready(Ok(_))),
        "elastic writer"
    );
}

#[tokio::test(start_paused = true)]
async fn corrections_of_any_size_leave_at_most_one_burst_of_debt() {
    let queues = TokenQueues::new(500, 500).unwrap();
    queues.set_limits(Some(500), Some(500)).unwrap();
    queues.add_tokens(500, 500);
    let work = write(Priority::NORMAL, 1);
    for (estimated, actual) in [
        (0, u64::MAX),
        (u64::MAX, 0),
        (1, u64::MAX),
        (u64::MAX, u64::MAX),
        (0, 0),
        (0, i64::MAX as u64 + 1),
        (u64::MAX, 1),
    ] {
        queues.correct_tokens(&work, estimated, actual);
        let (regular, elastic) = available(&queues);
        for balance in [regular, elastic] {
            assert!(
                (-500..=500).contains(&balance),
                "{estimated} → {actual}: {balance}"
            );
        }
    }
    // And a bypass of any size, at most sixty bursts.
    let bypass = WorkInfo::builder()
        .priority(Priority::NORMAL)
        .requested(u64::MAX)
        .bypass(true)
        .build();
    drop(queues.admit(bypass).await.unwrap());
    assert_eq!(available(&queues), (-30_000, -30_000));
}

#[tokio::test(start_paused = true)]
async fn refills_of_u64_max_saturate_at_the_burst() {
    let queues = TokenQueues::new(u64::MAX, 7).unwrap();
    queues.set_limits(Some(u64::MAX), Some(7)).unwrap();
    for _ in 0..3 {
        queues.add_tokens(u64::MAX, u64::MAX);
    }
    assert_eq!(available(&queues), (i64::MAX, 7));
    let queue = WorkQueue::tokens(10).unwrap();
    queue.set_token_limit(Some(10)).unwrap();
    for _ in 0..3 {
        queue.add_tokens(u64::MAX);
    }
    assert_eq!(queue.snapshot().granter.available, 10);
    // The largest write there is still gets in, and pays what it can.
    drop(
        queue
            .admit(write(Priority::NORMAL, u64::MAX))
            .await
            .unwrap(),
    );
    assert_eq!(queue.snapshot().granter.available, -600);
}

#[test]
fn a_token_burst_of_zero_is_refused_naming_the_field() {
    let error = WorkQueue::tokens(0).expect_err("burst 0 admits nothing, ever");
    assert_eq!(error.field(), "burst");
    let error = TokenQueues::new(0, 1).expect_err("regular burst 0");
    assert_eq!(error.field(), "regular_burst");
    let error = TokenQueues::new(1, 0).expect_err("elastic burst 0");
    assert_eq!(error.field(), "elastic_burst");
    assert_eq!(TokenGranter::new(0).unwrap_err().field(), "burst");
    assert_eq!(
        TokenGranter::pair(1, 0).unwrap_err().field(),
        "elastic_burst"
    );

    let queue = WorkQueue::tokens(5).unwrap();
    assert_eq!(queue.set_token_limit(Some(0)).unwrap_err().field(), "burst");
    assert!(queue.snapshot().granter.unlimited, "left as it was");
    assert_eq!(queue.granter().set_burst(0).unwrap_err().field(), "burst");

    let queues = TokenQueues::new(5, 5).unwrap();
    let error = queues.set_limits(Some(10), Some(0)).unwrap_err();
    assert_eq!(error.field(), "elastic_burst");
    assert!(
        queues.regular().snapshot().granter.unlimited,
        "neither class changed"
    );
    let error = queues.set_limits(Some(0), None).unwrap_err();
    assert_eq!(error.field(), "regular_burst");
}

#[test]
fn absurd_controller_settings_are_refused_naming_the_field() {
    type Setting = fn(ControllerBuilder) -> ControllerBuilder;
    let rows: &[(&str, Setting)] = &[
        ("interval", |b| b.interval(Duration::ZERO)),
        ("interval", |b| b.interval(Duration::MAX)),
        ("interval", |b| {
            b.interval(Duration::from_secs(3600) + Duration::from_nanos(1))
        }),
        ("l0_file_threshold", |b| b.l0_file_threshold(0)),
        ("l0_file_threshold", |b| b.l0_file_threshold(u64::MAX)),
        ("l0_sublevel_threshold", |b| b.l0_sublevel_threshold(0)),
        ("l0_sublevel_threshold", |b| {
            b.l0_sublevel_threshold(u64::MAX)
        }),
        ("memtable_stop_threshold", |b| b.memtable_stop_threshold(0)),
        ("memtable_stop_threshold", |b| {
            b.memtable_stop_threshold(u64::MAX)
        }),
        ("stats_failure_bytes_per_second", |b| {
            b.stats_failure_bytes_per_second(0)
        }),
    ];
    for (field, setting) in rows {
        let builder = setting(Controller::builder(LsmStats::default).manual());
        let described = format!("{builder:?}");
        let error = builder.build().unwrap_err();
        assert_eq!(error.field(), *field, "{described}");
    }
    // The documented extremes are accepted.
    Controller::builder(LsmStats::default)
        .interval(Duration::from_secs(3600))
        .l0_file_threshold(1_000_000)
        .l0_sublevel_threshold(10_000)
        .memtable_stop_threshold(10_000)
        .stats_failure_bytes_per_second(u64::MAX)
        .manual()
        .build()
        .expect("the extremes are accepted");
}

/// What the test engine's reader does on its next calls.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reading {
    Returns,
    Panics,
}

/// An engine reader whose `stats` and `tick_stats` return the engine's
/// state or panic, as the test says.
#[derive(Clone)]
struct Engine {
    stats: Arc<Mutex<LsmStats>>,
    interval: Arc<Mutex<Reading>>,
    tick: Arc<Mutex<Option<Reading>>>,
}

impl Engine {
    fn new() -> Self {
        Engine {
            stats: Arc::default(),
            interval: Arc::new(Mutex::new(Reading::Returns)),
            tick: Arc::new(Mutex::new(None)),
        }
    }
    fn set(&self, stats: LsmStats) {
        *self.stats.lock().unwrap() = stats;
    }
    fn interval_reading(&self, reading: Reading) {
        *self.interval.lock().unwrap() = reading;
    }
    fn tick_reading(&self, reading: Option<Reading>) {
        *self.tick.lock().unwrap() = reading;
    }
}

impl LsmStatsSource for Engine {
    fn stats(&mut self) -> LsmStats {
        let reading = *self.interval.lock().unwrap();
        assert_eq!(reading, Reading::Returns, "the engine reader broke");
        *self.stats.lock().unwrap()
    }

    fn tick_stats(&mut self) -> Option<LsmStats> {
        let reading = (*self.tick.lock().unwrap())?;
        assert_eq!(reading, Reading::Returns, "the tick reader broke");
        Some(*self.stats.lock().unwrap())
    }
}

const INTERVAL: Duration = Duration::from_millis(100);

/// A manual controller over `engine`, 100 ms intervals, a memtable stop
/// threshold of 4 and a safe budget of 10 MiB/s.
fn controller(engine: &Engine) -> Controller {
    Controller::builder(engine.clone())
        .interval(INTERVAL)
        .memtable_stop_threshold(4)
        .stats_failure_bytes_per_second(10 * MIB)
        .manual()
        .build()
        .unwrap()
}

/// At 40 sub-levels with 400 MiB compacted in the interval: regular work
/// is limited to 200 MiB an interval, elastic work to one byte.
fn overloaded(flushed: u64) -> LsmStats {
    LsmStats {
        l0_files: 40,
        l0_sublevels: Some(40),
        l0_bytes: 200 * MIB,
        flushed_bytes: flushed,
        ..LsmStats::default()
    }
}

/// Two intervals: the first without history, the second overloaded, which
/// limits regular work to 200 MiB.
async fn limited(engine: &Engine, controller: &Controller) {
    controller.step();
    engine.set(overloaded(600 * MIB));
    tokio::time::advance(INTERVAL).await;
    let tick = controller.step();
    assert_eq!(
        tick.new_interval.unwrap().regular,
        Tokens::Limited(200 * MIB)
    );
}

/// Ticks through the rest of the interval (every millisecond); returns the
/// regular tokens added, including the first tick's `first`.
async fn rest_of_interval(controller: &Controller, first: u64) -> u64 {
    let mut added = first;
    for _ in 1..100 {
        tokio::time::advance(Duration::from_millis(1)).await;
        let tick = catch_unwind(AssertUnwindSafe(|| controller.step()))
            .expect("a tick survives its source's panic");
        assert!(tick.new_interval.is_none());
        added += tick.added.unwrap_or(0);
    }
    added
}

/// The start of the next interval.
async fn next_interval(controller: &Controller) -> Tick {
    tokio::time::advance(Duration::from_millis(1)).await;
    let tick = controller.step();
    assert!(tick.new_interval.is_some());
    tick
}

#[tokio::test(start_paused = true)]
async fn a_panicking_stats_source_keeps_the_tokens_flowing() {
    let engine = Engine::new();
    let controller = controller(&engine);
    limited(&engine, &controller).await;
    rest_of_interval(&controller, 0).await;

    engine.interval_reading(Reading::Panics);
    // The failed intervals keep the last budget, exactly, then the safe
    // budget takes over: 10 MiB/s over 100 ms, as compactions were last
    // seen removing 400 MiB (half of that is more).
    for failed in 1..=STATS_FAILURES_BEFORE_FALLBACK + 1 {
        let tick = next_interval(&controller).await;
        assert!(tick.source_failed);
        let decision = tick.new_interval.unwrap();
        let total = rest_of_interval(&controller, tick.added.unwrap()).await;
        let snapshot = controller.snapshot();
        assert_eq!(snapshot.failed_intervals, failed);
        if failed < STATS_FAILURES_BEFORE_FALLBACK {
            assert_eq!(decision.regular, Tokens::Limited(200 * MIB));
            assert_eq!(total, 200 * MIB, "the last budget, exactly");
            assert!(!snapshot.on_safe_budget);
        } else {
            assert_eq!(decision.regular, Tokens::Limited(200 * MIB));
            assert_eq!(decision.elastic, Tokens::Limited(1));
            assert!(snapshot.on_safe_budget);
        }
    }
    let health = controller.snapshot().source;
    assert_eq!(health.component, "lsm_stats_source");
    assert_eq!(health.panics, STATS_FAILURES_BEFORE_FALLBACK + 1);
    assert!(!health.is_healthy());
    assert_eq!(
        health.last_panic.as_deref(),
        Some("assertion `left == right` failed: the engine reader broke\n  left: Panics\n right: Returns")
    );
    assert!(controller.snapshot().ticker.is_healthy());

    // A writer is still admitted.
    let mut writer = tokio_test::task::spawn(controller.admit(write(Priority::NORMAL, MIB)));
    assert!(matches!(writer.poll(), Poll::Ready(Ok(_))));
}

#[tokio::test(start_paused = true)]
async fn without_a_history_the_safe_budget_is_the_configured_rate() {
    let engine = Engine::new();
    engine.interval_reading(Reading::Panics);
    let controller = controller(&engine);
    // The very first reading fails: there is no previous budget to keep,
    // so the safe budget comes at once, not an unlimited first interval.
    for failed in 1..=STATS_FAILURES_BEFORE_FALLBACK + 1 {
        let tick = controller.step();
        assert!(tick.source_failed);
        let decision = tick.new_interval.unwrap();
        assert_eq!(
            decision.regular,
            Tokens::Limited(MIB),
            "10 MiB/s over 100 ms"
        );
        assert_eq!(decision.elastic, Tokens::Limited(1));
        assert_eq!(controller.snapshot().failed_intervals, failed);
        tokio::time::advance(INTERVAL).await;
    }
    assert!(
        !controller
            .queues()
            .queue(TokenClass::Regular)
            .snapshot()
            .granter
            .unlimited,
        "never unlimited for good"
    );
}

#[tokio::test(start_paused = true)]
async fn a_source_that_recovers_is_measured_over_the_whole_gap() {
    let engine = Engine::new();
    let controller = controller(&engine);
    limited(&engine, &controller).await;
    engine.interval_reading(Reading::Panics);
    for _ in 0..2 {
        tokio::time::advance(INTERVAL).await;
        assert!(controller.step().source_failed);
    }
    // Three intervals after the last good reading, 3 x 400 MiB were
    // compacted (1,200 MiB flushed, L0 unchanged): 400 MiB an interval.
    engine.set(overloaded(1_800 * MIB));
    engine.interval_reading(Reading::Returns);
    tokio::time::advance(INTERVAL).await;
    let tick = controller.step();
    assert!(!tick.source_failed);
    let decision = tick.new_interval.unwrap();
    assert_eq!(decision.compacted, 400 * MIB, "averaged over the gap");
    assert_eq!(decision.added, 400 * MIB);
    let snapshot = controller.snapshot();
    assert_eq!(snapshot.failed_intervals, 0);
    assert!(!snapshot.on_safe_budget);
    let health = controller.snapshot().source;
    assert_eq!((health.panics, health.consecutive_panics), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn a_failed_tick_reading_keeps_the_last_hold_until_the_interval_ends() {
    let engine = Engine::new();
    let controller = controller(&engine);
    controller.step();
    // A flush backlog: the tick reading holds elastic work.
    engine.tick_reading(Some(Reading::Returns));
    engine.set(LsmStats {
        unflushed_memtables: Some(2),
        ..LsmStats::default()
    });
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(controller.step().elastic_held);

    engine.tick_reading(Some(Reading::Panics));
    for tick in 0..3 {
        tokio::time::advance(Duration::from_millis(1)).await;
        let tick_result = controller.step();
        assert_eq!(tick_result.source_failed, tick == 0, "retried later");
        assert!(
            tick_result.elastic_held,
            "no reading: the last decision stands"
        );
    }
    let tick_source = controller.snapshot().tick_source;
    assert_eq!(tick_source.component, "lsm_stats_source_tick");
    assert_eq!(tick_source.panics, 1, "not called again within 250 ms");
    assert!(
        controller.snapshot().source.is_healthy(),
        "the interval reading works"
    );
    // A new interval starts unheld, even while tick readings fail.
    tokio::time::advance(INTERVAL).await;
    let tick = controller.step();
    assert!(tick.new_interval.is_some());
    assert!(!tick.elastic_held);
    // 250 ms after the failure, the tick reading is tried again.
    tokio::time::advance(Duration::from_millis(250) - INTERVAL).await;
    assert!(controller.step().source_failed);
    assert_eq!(controller.snapshot().tick_source.panics, 2);
    assert_eq!(
        tick.added_elastic,
        Some(1),
        "the interval's own budget flows"
    );

    // Unheld before the failure: stays unheld.
    engine.tick_reading(Some(Reading::Returns));
    engine.set(LsmStats::default());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!controller.step().elastic_held);
    engine.tick_reading(Some(Reading::Panics));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!controller.step().elastic_held);
}

#[tokio::test(start_paused = true)]
async fn a_huge_correction_through_the_controller_costs_one_burst() {
    let engine = Engine::new();
    let controller = controller(&engine);
    limited(&engine, &controller).await;
    let first = write(Priority::NORMAL, MIB);
    drop(controller.admit(first.clone()).await.unwrap());
    controller.correct_tokens(&first, MIB, u64::MAX);

    // 200 MiB over 100 ticks: 2 MiB a tick pays one burst (200 MiB / 60)
    // within two ticks.
    let mut writer = tokio_test::task::spawn(controller.admit(write(Priority::NORMAL, MIB)));
    assert!(writer.poll().is_pending());
    let mut ticks = 0;
    while writer.poll().is_pending() {
        tokio::time::advance(Duration::from_millis(1)).await;
        controller.step();
        ticks += 1;
        assert!(ticks <= 3, "still blocked after {ticks} ticks");
    }
}

#[test]
fn the_ticker_thread_survives_a_source_that_always_panics() {
    struct Broken(std::sync::mpsc::Sender<()>);
    impl LsmStatsSource for Broken {
        fn stats(&mut self) -> LsmStats {
            let _ = self.0.send(());
            panic!("the engine reader broke");
        }
    }
    let (called, calls) = std::sync::mpsc::channel();
    let controller = Controller::builder(Broken(called))
        .interval(Duration::from_millis(1))
        .build()
        .unwrap();
    for _ in 0..STATS_FAILURES_BEFORE_FALLBACK + 2 {
        calls
            .recv_timeout(Duration::from_secs(60))
            .expect("the ticker keeps reading");
    }
    let snapshot = controller.snapshot();
    assert!(
        snapshot.ticks > STATS_FAILURES_BEFORE_FALLBACK,
        "{snapshot:?}"
    );
    assert!(snapshot.on_safe_budget, "{snapshot:?}");
    assert!(snapshot.ticker.is_healthy(), "caught at the source");
    controller.close();
}
