//! The queue core under hostile conditions: stalls and idle periods under
//! paused time, runtimes without timers, requests that can never fit, floods
//! of one-off tenants, uptimes past 32-bit epoch counters. Each test here
//! reproduces a defect of issue 12 and failed before its fix.

mod common;

use std::time::Duration;

use admission::{EpochLifo, Priority, TenantId, Usage, WorkInfo, WorkQueue, WorkQueueBuilder};
use common::*;
use tokio::time::Instant;

fn deadline_work(tenant: u64, timeout: Duration) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .timeout(timeout)
        .build()
}

/// Completes `n` requests, one every `every`, so that early rejection has a
/// completion rate to go by.
async fn establish_a_completion_rate(queue: &WorkQueue, n: usize, every: Duration) {
    let t0 = Instant::now();
    for i in 0..n {
        let permit = admit_now(queue, work(1, 0, t0, 0));
        tokio::time::advance(every).await;
        drop(permit);
        // A waiter makes the queue read its clock and update the rate.
        if i % 4 == 0 {
            let blocker = admit_now(queue, work(1, 0, t0, 0));
            let mut waiter = enqueue(queue, work(2, 0, t0, 0));
            drop(blocker);
            drop(try_settle(&mut waiter).expect("granted").unwrap());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn early_rejection_survives_a_stall_with_every_slot_held() {
    let queue = WorkQueue::builder()
        .total_slots(1)
        .early_rejection(true)
        .build()
        .unwrap();
    establish_a_completion_rate(&queue, 40, Duration::from_millis(1)).await;
    // Every slot is held for a second while the queue is maintained, as the
    // CPU controller does every tick: no completion in a hundred windows.
    let t0 = Instant::now();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    for _ in 0..100 {
        tokio::time::advance(Duration::from_millis(10)).await;
        queue.maintain();
    }
    // A request with a deadline that has to queue: after a stall it is
    // refused at once, not a panic.
    let refused = refused_at_once(&queue, deadline_work(3, Duration::from_millis(50)));
    assert_eq!(refused.reason(), "would_miss_deadline");
    drop(held);
    // And the queue recovers as soon as work completes again.
    let permit = admit_now(&queue, work(1, 0, t0, 0));
    drop(permit);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn early_rejection_survives_an_idle_period_and_still_queues_work_that_fits() {
    let queue = WorkQueue::builder()
        .total_slots(1)
        .early_rejection(true)
        .build()
        .unwrap();
    establish_a_completion_rate(&queue, 40, Duration::from_millis(1)).await;
    // Five seconds of no traffic at all, maintained every millisecond.
    for _ in 0..5_000 {
        tokio::time::advance(Duration::from_millis(1)).await;
        queue.maintain();
    }
    let t0 = Instant::now();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    // Idle time says nothing about how fast the queue drains: a request
    // with 50 ms to go, behind one slot held for about a millisecond, waits.
    let mut waiter = enqueue(&queue, deadline_work(3, Duration::from_millis(50)));
    tokio::time::advance(Duration::from_millis(1)).await;
    drop(held);
    let permit = try_settle(&mut waiter)
        .expect("granted when the slot came back")
        .unwrap();
    drop(permit);
}

#[test]
fn a_deadline_that_has_to_wait_on_a_runtime_without_timers_is_a_typed_error() {
    // The runtime the `cpu::Controller` example used to build: no timers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let queue = WorkQueue::new(1).unwrap();
        let held = queue
            .admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL))
            .await
            .unwrap();
        // The fast path needs no timer...
        drop(held);
        let fast = queue.admit(deadline_work(1, Duration::from_secs(1))).await;
        let held = fast.unwrap();
        // ...a wait with a deadline does, and gets a typed error instead
        // of a panic; the queue is left as it was.
        let error = queue
            .admit(deadline_work(2, Duration::from_secs(1)))
            .await
            .unwrap_err();
        assert_eq!(error.reason(), "timer_unavailable");
        assert!(error.to_string().contains("enable_time"), "{error}");
        assert_eq!(queue.waiting(), 0);
        drop(held);
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}

#[test]
fn tenant_weights_are_bounded_by_max_tenants_and_refused_by_name() {
    // Weights are configuration and never swept: a weight per request,
    // keyed by ids callers choose, would grow the table for good.
    let queue = WorkQueueBuilder::default()
        .total_slots(1)
        .max_tenants(4)
        .build()
        .unwrap();
    let two = admission::TenantWeight::new(2).unwrap();
    for id in 0..4 {
        queue.set_tenant_weight(TenantId::new(id), two).unwrap();
    }
    // Changing one already there is fine; a fifth is refused.
    queue
        .set_tenant_weight(TenantId::new(3), admission::TenantWeight::new(5).unwrap())
        .unwrap();
    let error = queue.set_tenant_weight(TenantId::new(4), two).unwrap_err();
    assert_eq!(error.field(), "tenant_weight");
    assert!(error.to_string().contains("max_tenants"), "{error}");
    // Back to the default frees a place.
    queue
        .set_tenant_weight(TenantId::new(0), admission::TenantWeight::default())
        .unwrap();
    queue.set_tenant_weight(TenantId::new(4), two).unwrap();
    // A table too large is refused whole, and the old one stays.
    let table = (10..15).map(|id| (TenantId::new(id), two));
    assert_eq!(
        queue.set_tenant_weights(table).unwrap_err().field(),
        "tenant_weight"
    );
    assert!(
        queue.set_tenant_weight(TenantId::new(20), two).is_err(),
        "still full"
    );
    // Default weights take no place.
    let defaults = (100..10_000).map(|id| (TenantId::new(id), admission::TenantWeight::default()));
    queue.set_tenant_weights(defaults).unwrap();
    queue.set_tenant_weight(TenantId::new(20), two).unwrap();
}

/// The latest `Instant` the clock can represent from `from`, to the
/// nanosecond: a "never" sentinel, as a caller probing with `checked_add`
/// would build it.
fn latest_instant(from: Instant) -> Instant {
    let (mut fits, mut overflows) = (Duration::ZERO, Duration::MAX);
    while overflows - fits > Duration::from_nanos(1) {
        let mid = fits + (overflows - fits) / 2;
        if from.checked_add(mid).is_some() {
            fits = mid;
        } else {
            overflows = mid;
        }
    }
    from + fits
}

#[tokio::test(start_paused = true)]
async fn a_deadline_at_the_end_of_time_waits_instead_of_panicking() {
    // tokio rounds a timer's deadline up to its next millisecond on the
    // first poll, which overflowed within a millisecond of the largest
    // `Instant` and panicked inside the request's task.
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let never = WorkInfo::builder()
        .tenant(TenantId::new(2))
        .deadline(latest_instant(t0))
        .build();
    let mut waiting = enqueue(&queue, never);
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert!(
        try_settle(&mut waiting).is_none(),
        "still waiting an hour on"
    );
    drop(held);
    let permit = try_settle(&mut waiting).expect("granted").unwrap();
    drop(permit);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_larger_than_the_total_is_refused_at_once_and_blocks_nobody() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(2).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let error = refused_at_once(
        &queue,
        WorkInfo::builder()
            .tenant(TenantId::new(2))
            .requested(3)
            .build(),
    );
    assert_eq!(error.reason(), "never_fits");
    assert!(error.to_string().contains('3'), "{error}");
    // Nothing waits in front of the others: the free slot is used.
    let other = admit_now(&queue, work(3, 0, t0, 0));
    drop((held, other));
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn waiters_that_stop_fitting_when_the_total_drops_fail_and_unblock_the_queue() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(2).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let mut pair = enqueue(
        &queue,
        WorkInfo::builder()
            .tenant(TenantId::new(2))
            .requested(2)
            .create_time(t0)
            .build(),
    );
    let mut single = enqueue(&queue, work(3, 0, t0, 1));
    queue.set_total_slots(1).unwrap();
    let error = try_settle(&mut pair)
        .expect("refused when the total dropped")
        .unwrap_err();
    assert_eq!(error.reason(), "never_fits");
    drop(held);
    let permit = try_settle(&mut single)
        .expect("granted once the slot came back")
        .unwrap();
    drop(permit);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn one_off_tenants_are_forgotten_without_anyone_calling_maintain() {
    let queue = WorkQueue::builder()
        .total_slots(4)
        .usage(Usage::Granted)
        .build()
        .unwrap();
    let t0 = Instant::now();
    // 20,000 tenants seen once each, 2,000 per reset period, all on the
    // fast path: nobody ever queues and nobody calls `maintain`.
    for period in 0..10u64 {
        for i in 0..2_000u64 {
            // Awaited: thousands of immediate admissions in one task run
            // out of tokio's cooperative budget, which `.await` respects.
            let permit = queue.admit(work(period * 2_000 + i + 1, 0, t0, 0)).await;
            drop(permit.unwrap());
        }
        // The default reset period.
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let tracked = queue.snapshot().tenants.len();
    assert!(
        tracked <= 4_096,
        "{tracked} tenant records kept for 20,000 one-off tenants"
    );
}

#[tokio::test(start_paused = true)]
async fn epoch_lifo_still_switches_after_u32_max_epochs() {
    let deadline = Duration::from_millis(5);
    let queue = WorkQueue::builder()
        .total_slots(1)
        .epoch_lifo(EpochLifo::for_deadline(deadline))
        .build()
        .unwrap();
    // 1 ms epochs: 2^32 of them is 49.7 days.
    tokio::time::advance(Duration::from_secs(50 * 24 * 3600)).await;
    queue.maintain();
    let t0 = Instant::now();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let mut waiters: Vec<_> = (0..4).map(|i| enqueue(&queue, work(1, 0, t0, i))).collect();
    // The first waiter is granted after waiting past the LIFO delay (half
    // the deadline), maintained every epoch as the controller would; the
    // next maintenance closes the epoch that saw the grant (and only that
    // one: two at once count as an idle stretch).
    for _ in 0..3 {
        tokio::time::advance(Duration::from_millis(1)).await;
        queue.maintain();
    }
    drop(held);
    let first = try_settle(&mut waiters[0]).expect("granted").unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    queue.maintain();
    let lifo_below = queue
        .snapshot()
        .tenant(TenantId::new(1))
        .unwrap()
        .lifo_below;
    assert!(
        lifo_below > i16::from(Priority::NORMAL.get()),
        "normal priority still FIFO after a backlog: threshold {lifo_below}"
    );
    drop(first);
}

/// A slot-like granter whose every method panics while `broken` is set.
#[derive(Debug, Default)]
struct Flaky {
    total: u64,
    broken: std::sync::atomic::AtomicBool,
}

impl Flaky {
    fn check(&self) {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("flaky granter");
        }
    }
}

impl admission::grant::Granter for Flaky {
    type State = u64;
    type Snapshot = u64;
    fn initial_state(&self) -> u64 {
        0
    }
    fn try_get(&self, used: &mut u64, count: u64) -> bool {
        self.check();
        if *used + count <= self.total {
            *used += count;
            true
        } else {
            false
        }
    }
    fn return_grant(&self, used: &mut u64, count: u64) {
        self.check();
        *used -= count;
    }
    fn took_without_permission(&self, used: &mut u64, count: u64) {
        self.check();
        *used += count;
    }
    fn snapshot(&self, used: &u64) -> u64 {
        *used
    }
    fn capacity(&self, _: &u64) -> Option<u64> {
        self.check();
        Some(self.total)
    }
    fn max_request(&self, _: &u64) -> Option<u64> {
        self.check();
        Some(self.total)
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_custom_granter_never_wedges_the_queue_and_is_reported() {
    use std::sync::atomic::Ordering::SeqCst;
    let queue = WorkQueue::builder()
        .elastic_share(0.5)
        .build_with(Flaky {
            total: 1,
            ..Flaky::default()
        })
        .unwrap();
    let admit = |tenant| {
        queue.admit(
            WorkInfo::builder()
                .tenant(TenantId::new(tenant))
                .timeout(Duration::from_secs(1))
                .build(),
        )
    };
    let held = admit(1).await.unwrap();
    let mut waiter = tokio_test::task::spawn(admit(2));
    assert!(waiter.poll().is_pending());
    assert!(queue.snapshot().granter_health.is_healthy());

    // The granter breaks while a slot is held and a request waits: the
    // return panics (and is dropped), and so does the grant loop's
    // `try_get`, which admits: the waiter is not left waiting for good.
    queue.granter().broken.store(true, SeqCst);
    drop(held);
    let permit = match waiter.poll() {
        std::task::Poll::Ready(result) => result.unwrap(),
        std::task::Poll::Pending => panic!("the waiter was wedged by a panicking granter"),
    };
    // New requests are admitted too (fail open), with no panic reaching
    // the caller.
    let more = admit(3).await.unwrap();
    drop((permit, more));
    let health = queue.snapshot().granter_health;
    assert!(!health.is_healthy());
    assert!(health.panics >= 4, "{health}");
    assert_eq!(health.last_panic.as_deref(), Some("flaky granter"));

    // Repaired: the next call succeeds and the component is healthy again.
    queue.granter().broken.store(false, SeqCst);
    drop(admit(4).await.unwrap());
    let snapshot = queue.snapshot();
    assert!(snapshot.granter_health.is_healthy());
    // Nothing was lost: the panicked return was retried before the next
    // take, and units admitted unaccounted were never returned.
    assert_eq!(snapshot.granter, 0);
}

#[tokio::test(start_paused = true)]
async fn under_a_controller_a_request_may_wait_for_a_total_it_can_reach() {
    use admission::cpu::{Controller, CpuLoad};
    let controller = Controller::with_signal(|| CpuLoad::new(0, 1))
        .initial_slots(1)
        .min_slots(1)
        .max_slots(4)
        .manual()
        .build()
        .unwrap();
    let held = controller
        .admit(deadline_work(1, Duration::from_secs(1)))
        .await
        .unwrap();
    // Three slots: more than the total now, within what it may grow to.
    let mut three = tokio_test::task::spawn(
        controller.admit(
            WorkInfo::builder()
                .tenant(TenantId::new(2))
                .requested(3)
                .build(),
        ),
    );
    assert!(
        three.poll().is_pending(),
        "three slots fit under max_slots 4"
    );
    // Five never can.
    let five = controller
        .admit(
            WorkInfo::builder()
                .tenant(TenantId::new(3))
                .requested(5)
                .build(),
        )
        .await
        .unwrap_err();
    assert_eq!(five.reason(), "never_fits");
    drop(three);
    drop(held);
    assert_eq!(controller.snapshot().queue.granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn an_absurd_elastic_request_does_not_read_as_a_full_elastic_share() {
    use admission::TokenQueues;
    // Found by the property test: elastic work holding `u64::MAX` units
    // compared equal to the "no share" sentinel, and every later elastic
    // request waited for good on a queue that has no elastic share.
    let queues = TokenQueues::new(4096, 4096).unwrap();
    let elastic = |units| {
        WorkInfo::builder()
            .priority(Priority::BULK_NORMAL)
            .requested(units)
            .build()
    };
    queues.set_limits(None, Some(1)).unwrap();
    let mut huge = tokio_test::task::spawn(queues.admit(elastic(u64::MAX)));
    assert!(huge.poll().is_pending(), "no elastic tokens yet");
    let mut small = enqueue_tokens(&queues, elastic(1));
    queues.add_tokens(0, 100);
    let huge = try_settle_tokens(&mut huge).expect("granted").unwrap();
    // Budgets lifted: the small one must be granted, not held back by a
    // share this queue does not have.
    queues.set_limits(None, None).unwrap();
    let small = try_settle_tokens(&mut small).expect("granted when the budget was lifted");
    assert!(small.is_ok(), "{small:?}");
    drop((huge, small));
}

type TokenAdmit = tokio_test::task::Spawn<admission::Admit<admission::grant::TokenGranter>>;

fn enqueue_tokens(queues: &admission::TokenQueues, work: WorkInfo) -> TokenAdmit {
    let mut admit = tokio_test::task::spawn(queues.admit(work));
    assert!(admit.poll().is_pending(), "expected the request to wait");
    admit
}

fn try_settle_tokens(
    admit: &mut TokenAdmit,
) -> Option<Result<admission::SlotPermit<admission::grant::TokenGranter>, admission::AdmitError>> {
    match admit.poll() {
        std::task::Poll::Ready(result) => Some(result),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test(start_paused = true)]
async fn one_long_hold_does_not_refuse_its_priority_for_good() {
    // Found by the overload suite: early rejection refuses a waiter whose
    // time left is shorter than its priority's typical hold, and that
    // estimate learns only from completions. One 4 ms hold of the only
    // high-priority request so far, against 5 ms deadlines, refused every
    // later high-priority request that had waited a little, so none ever
    // completed to correct it, while lower priorities ran.
    let queue = WorkQueue::builder()
        .total_slots(1)
        .early_rejection(true)
        .build()
        .unwrap();
    let high = |deadline_ms| {
        WorkInfo::builder()
            .tenant(TenantId::new(1))
            .priority(Priority::USER_HIGH)
            .timeout(Duration::from_millis(deadline_ms))
            .build()
    };
    let t0 = Instant::now();
    let first = admit_now(&queue, high(5));
    tokio::time::advance(Duration::from_millis(4)).await;
    drop(first);
    // Each later high-priority request waits 2 ms behind low-priority work,
    // so 3 ms are left when the slot frees: less than the 4 ms estimate.
    let mut admitted = 0;
    for _ in 0..20 {
        let low = admit_now(&queue, work(2, -50, t0, 0));
        // Refused at once, or waiting: either way its fate is decided by
        // the estimate.
        let mut waiter = tokio_test::task::spawn(queue.admit(high(5)));
        let first = waiter.poll();
        tokio::time::advance(Duration::from_millis(2)).await;
        drop(low);
        if first.is_ready() {
            continue;
        }
        if let std::task::Poll::Ready(Ok(permit)) = waiter.poll() {
            admitted += 1;
            tokio::time::advance(Duration::from_micros(500)).await;
            drop(permit);
        }
    }
    assert!(
        admitted >= 10,
        "high-priority work admitted {admitted} times of 20 after one long hold"
    );
}

#[test]
fn absurd_queue_settings_are_refused_naming_the_field() {
    use admission::grant::SlotGranter;
    let field = |builder: WorkQueueBuilder| builder.build().unwrap_err().field();
    assert_eq!(field(WorkQueue::builder().max_tenants(0)), "max_tenants");
    assert_eq!(field(WorkQueue::builder().max_waiters(0)), "max_waiters");
    assert_eq!(
        field(WorkQueue::builder().reset_period(Duration::MAX)),
        "reset_period"
    );
    assert_eq!(
        field(WorkQueue::builder().grant_burst_timeout(Duration::ZERO)),
        "grant_burst_timeout"
    );
    assert_eq!(field(WorkQueue::builder().grant_burst(0)), "grant_burst");
    for share in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1.5] {
        assert_eq!(
            field(WorkQueue::builder().elastic_share(share)),
            "elastic_share"
        );
    }
    assert_eq!(
        field(WorkQueue::builder().epoch_lifo(EpochLifo::for_deadline(Duration::ZERO))),
        "epoch_lifo.epoch"
    );
    assert_eq!(
        field(WorkQueue::builder().epoch_lifo(EpochLifo::for_deadline(Duration::MAX))),
        "epoch_lifo.epoch"
    );
    assert_eq!(
        field(WorkQueue::builder().total_slots(u64::MAX)),
        "total_slots"
    );
    let slots = SlotGranter::new(1).unwrap();
    assert_eq!(slots.set_ceiling(u64::MAX).unwrap_err().field(), "ceiling");
    // The largest accepted values work.
    let queue = WorkQueue::builder()
        .max_tenants(usize::MAX)
        .max_waiters(usize::MAX)
        .total_slots(SlotGranter::MAX_TOTAL)
        .build()
        .unwrap();
    assert_eq!(queue.snapshot().granter.total, SlotGranter::MAX_TOTAL);
}
