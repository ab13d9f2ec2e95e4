//! Queue policies for overload: epoch-LIFO and early rejection, under a
//! paused clock.

mod common;

use std::task::Poll;
use std::time::Duration;

use admission::{AdmitError, EpochLifo, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};
use common::*;
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn advance_to(t0: Instant, at: Duration, queue: &WorkQueue) {
    let now = Instant::now();
    tokio::time::advance((t0 + at).saturating_duration_since(now)).await;
    queue.maintain();
}

fn lifo_below(queue: &WorkQueue) -> i16 {
    queue
        .snapshot()
        .tenant(TenantId::new(1))
        .unwrap()
        .lifo_below
}

/// Grants `waiters` one at a time, each released before the next: the
/// order they were granted in, and the last one's permit.
fn one_at_a_time(
    held: SlotPermit,
    mut waiters: Vec<(&'static str, Pending)>,
) -> (Vec<&'static str>, Option<SlotPermit>) {
    let mut order = Vec::new();
    let mut held = Some(held);
    while !waiters.is_empty() {
        drop(held.take());
        let mut next = granted(&mut waiters);
        assert_eq!(next.len(), 1);
        let (name, permit) = next.pop().unwrap();
        order.push(name);
        held = Some(permit);
    }
    (order, held)
}

/// One slot, 10 ms epochs closing 1 ms late: a request that waited 9 ms
/// in epoch 0 makes priority 0 and every priority below it LIFO when the
/// epoch closes at 11 ms. Returns the queue at 11 ms and the held slot.
async fn lifo_below_one_from_11_ms(t0: Instant) -> (WorkQueue, SlotPermit) {
    let settings = EpochLifo {
        epoch: ms(10),
        closing_delta: ms(1),
        lifo_delay: ms(5),
    };
    let queue = WorkQueue::builder()
        .total_slots(1)
        .epoch_lifo(settings)
        .build()
        .unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let mut late = vec![("late", enqueue(&queue, work(1, 0, t0, 0)))];
    advance_to(t0, ms(9), &queue).await;
    drop(held);
    let held = granted(&mut late).pop().unwrap().1;
    advance_to(t0, ms(11), &queue).await;
    assert_eq!(lifo_below(&queue), 1);
    (queue, held)
}

/// Upstream's epoch-LIFO scenario (100 ms epochs closing 5 ms late, LIFO
/// past 105 ms of queueing), step by step.
#[tokio::test(start_paused = true)]
async fn a_priority_that_fell_behind_is_served_newest_first_by_epoch_and_recovers() {
    let t0 = Instant::now();
    let queue = WorkQueue::builder()
        .total_slots(1)
        .epoch_lifo(EpochLifo::UPSTREAM)
        .build()
        .unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));

    // A normal-priority request waits 205 ms before it is granted.
    let mut slow = vec![("slow", enqueue(&queue, work(1, 0, t0, 0)))];
    advance_to(t0, ms(205), &queue).await;
    drop(held);
    let held = granted(&mut slow).pop().unwrap().1;
    assert_eq!(
        lifo_below(&queue),
        -128,
        "the epoch that saw it has not closed"
    );

    // Epoch 2 (200..300 ms) closes at 305 ms: priority 0 goes LIFO.
    advance_to(t0, ms(305), &queue).await;
    assert_eq!(lifo_below(&queue), 1);

    // New work, all at 306 ms: two normal-priority requests created in
    // closed epochs, one in the open epoch 3, and one high-priority request.
    advance_to(t0, ms(306), &queue).await;
    let waiters = vec![
        ("p0 ct50", enqueue(&queue, work(1, 0, t0, 50))),
        (
            "p0 ct306 (open epoch)",
            enqueue(&queue, work(1, 0, t0, 306)),
        ),
        ("p0 ct250", enqueue(&queue, work(1, 0, t0, 250))),
        ("p127 ct306", enqueue(&queue, work(1, 127, t0, 306))),
    ];
    let (order, held) = one_at_a_time(held, waiters);
    // High priority is FIFO and first; then the closed epochs newest-first;
    // the open epoch after its priority's closed ones.
    assert_eq!(
        order,
        ["p127 ct306", "p0 ct250", "p0 ct50", "p0 ct306 (open epoch)"]
    );

    // The last grant (306 ms) waited under a millisecond: at the close of
    // epoch 3 (405 ms) priority 0 falls back to FIFO.
    advance_to(t0, ms(405), &queue).await;
    assert_eq!(lifo_below(&queue), -128);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn an_open_epoch_waits_until_it_closes_when_older_work_is_ready() {
    let t0 = Instant::now();
    let (queue, held) = lifo_below_one_from_11_ms(t0).await;

    // At 15 ms, work created in epoch 1 (open until 21 ms) and in epoch 0.
    advance_to(t0, ms(15), &queue).await;
    let mut waiters = vec![
        ("epoch 1", enqueue(&queue, work(1, 0, t0, 12))),
        ("epoch 0", enqueue(&queue, work(1, 0, t0, 8))),
    ];
    drop(held);
    let first = granted(&mut waiters);
    assert_eq!(names(&first), ["epoch 0"]);
    drop(first);
    assert_eq!(names(&granted(&mut waiters)), ["epoch 1"]);
}

/// An open epoch holds its work back behind its own priority's closed
/// epochs, never behind a lower priority: at the edge of overload a
/// priority's work is often all fresh, and a lower priority's older work
/// would otherwise be granted ahead of it.
#[tokio::test(start_paused = true)]
async fn an_open_epoch_goes_ahead_of_lower_priorities_ready_work() {
    let t0 = Instant::now();
    let (queue, held) = lifo_below_one_from_11_ms(t0).await;

    // At 15 ms: lower work created in the closed epoch 0, normal work in
    // the open epoch 1, and more of each.
    advance_to(t0, ms(15), &queue).await;
    let waiters = vec![
        ("low, epoch 0", enqueue(&queue, work(1, -10, t0, 8))),
        ("normal, epoch 1", enqueue(&queue, work(1, 0, t0, 12))),
        ("normal, epoch 0", enqueue(&queue, work(1, 0, t0, 7))),
        ("low, epoch 1", enqueue(&queue, work(1, -10, t0, 13))),
    ];
    let (order, _held) = one_at_a_time(held, waiters);
    assert_eq!(
        order,
        [
            "normal, epoch 0",
            "normal, epoch 1",
            "low, epoch 0",
            "low, epoch 1"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn epoch_lifo_is_off_by_default_and_validated_when_on() {
    let queue = WorkQueue::new(1).unwrap();
    let _held = admit_now(&queue, work(1, 0, Instant::now(), 0));
    let _waiting = enqueue(&queue, work(1, 0, Instant::now(), 0));
    tokio::time::advance(Duration::from_secs(2)).await;
    queue.maintain();
    assert_eq!(lifo_below(&queue), -128);

    let bad = EpochLifo {
        closing_delta: ms(200),
        ..EpochLifo::UPSTREAM
    };
    let error = WorkQueue::builder().epoch_lifo(bad).build().unwrap_err();
    assert_eq!(error.field(), "epoch_lifo.closing_delta");
}

/// A queue that has completed work at 1,000 per second, its only slot held
/// (the permit is returned) and `waiting` normal-priority requests queued.
async fn draining_at_a_thousand_per_second(
    early: bool,
    waiting: usize,
) -> (WorkQueue, SlotPermit, Vec<Pending>) {
    let t0 = Instant::now();
    let queue = WorkQueue::builder()
        .total_slots(1)
        .early_rejection(early)
        .build()
        .unwrap();
    for i in 0..10 {
        drop(admit_now(&queue, work(1, 0, t0, i)));
    }
    tokio::time::advance(ms(10)).await;
    queue.maintain();
    let held = admit_now(&queue, work(1, 0, t0, 10));
    let queued = (0..waiting)
        .map(|i| enqueue(&queue, work(2, 0, t0, 11 + i as u64)))
        .collect();
    (queue, held, queued)
}

fn with_timeout(priority: i8, timeout: Duration) -> WorkInfo {
    from_tenant(2, priority, timeout)
}

fn from_tenant(tenant: u64, priority: i8, timeout: Duration) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .priority(Priority::new(priority))
        .timeout(timeout)
        .build()
}

#[tokio::test(start_paused = true)]
async fn early_rejection_refuses_work_the_queue_ahead_would_outlast() {
    let (queue, _held, _queued) = draining_at_a_thousand_per_second(true, 4).await;
    // Four ahead plus its own slot: about 5 ms at 1,000 completions a second.
    let error = queue.admit(with_timeout(0, ms(3))).await.unwrap_err();
    match error {
        AdmitError::WouldMissDeadline {
            expected,
            remaining,
        } => {
            // The permits used to measure the rate were held for no time.
            assert_eq!(expected, ms(5));
            assert_eq!(remaining, ms(3));
        }
        other => panic!("expected an early rejection, got {other:?}"),
    }
    assert_eq!(queue.waiting(), 4);

    // Enough time left: it queues.
    let mut patient = tokio_test::task::spawn(queue.admit(with_timeout(0, ms(10))));
    assert!(patient.poll().is_pending());
    // Higher priority has nobody ahead of it: it queues too.
    let mut urgent = tokio_test::task::spawn(queue.admit(with_timeout(50, ms(3))));
    assert!(urgent.poll().is_pending());
    // So does a tenant that has used less than the backlogged one: it is
    // served first, so that backlog is not ahead of it.
    let mut lighter = tokio_test::task::spawn(queue.admit(from_tenant(3, 0, ms(3))));
    assert!(lighter.poll().is_pending());
    assert_eq!(queue.waiting(), 7);
}

/// A one-slot queue with early rejection, taught by `n` requests that each
/// held the slot for `hold`, with `gap` between one's release and the
/// next's admission (the queue maintained after each gap).
async fn taught_one_slot_queue(t0: Instant, n: u64, hold: Duration, gap: Duration) -> WorkQueue {
    let queue = WorkQueue::builder()
        .total_slots(1)
        .early_rejection(true)
        .build()
        .unwrap();
    for i in 0..n {
        let permit = admit_now(&queue, work(1, 0, t0, i));
        tokio::time::advance(hold).await;
        drop(permit);
        if !gap.is_zero() {
            tokio::time::advance(gap).await;
            queue.maintain();
        }
    }
    queue
}

#[tokio::test(start_paused = true)]
async fn a_waiter_left_with_less_time_than_a_slot_is_held_is_refused_not_granted() {
    let t0 = Instant::now();
    // Admitted work holds its slot for 4 ms.
    let queue = taught_one_slot_queue(t0, 3, ms(4), Duration::ZERO).await;
    let held = admit_now(&queue, work(1, 0, t0, 10));
    // Holds are learned per priority: the doomed request is of the same
    // priority as the work that taught the queue, and first in line.
    let mut doomed = tokio_test::task::spawn(queue.admit(from_tenant(2, 0, ms(20))));
    assert!(doomed.poll().is_pending());
    let mut next = vec![("next", enqueue(&queue, work(2, 0, t0, 30)))];
    // 17 ms later only 3 ms are left. The slot comes back after a 17 ms
    // hold, which moves the typical hold (an EWMA, weight 0.1) from 4 ms to
    // 5.3 ms: more than is left.
    tokio::time::advance(ms(17)).await;
    drop(held);
    match doomed.poll() {
        std::task::Poll::Ready(Err(AdmitError::WouldMissDeadline {
            expected,
            remaining,
        })) => {
            assert_eq!((expected, remaining), (Duration::from_micros(5300), ms(3)));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(names(&granted(&mut next)), ["next"]);
    // The snapshot tells this refusal apart: early rejection, decided by
    // the typical hold (the wait alone would have left it time).
    let normal = queue.snapshot().priorities;
    let refusals = normal[0].refusals;
    assert_eq!(
        (refusals.would_miss_deadline, refusals.would_miss_on_hold),
        (1, 1)
    );
    assert_eq!(
        refusals.by_reason().iter().map(|&(_, n)| n).sum::<u64>(),
        normal[0].errored
    );
}

#[tokio::test(start_paused = true)]
async fn the_snapshot_counts_each_refusal_under_its_reason() {
    let t0 = Instant::now();
    let queue = taught_one_slot_queue(t0, 3, ms(4), Duration::ZERO).await;
    let held = admit_now(&queue, work(1, 0, t0, 10));
    // A deadline already spent when it asks.
    let mut spent = tokio_test::task::spawn(queue.admit(from_tenant(2, 0, Duration::ZERO)));
    assert!(matches!(
        spent.poll(),
        std::task::Poll::Ready(Err(AdmitError::DeadlinePassed))
    ));
    // Two that wait; one expires while it waits, the other is dropped.
    let mut expiring = tokio_test::task::spawn(queue.admit(from_tenant(2, 0, ms(30))));
    assert!(expiring.poll().is_pending());
    let mut leaving = tokio_test::task::spawn(queue.admit(from_tenant(3, 0, ms(60))));
    assert!(leaving.poll().is_pending());
    tokio::time::advance(ms(31)).await;
    assert!(matches!(
        expiring.poll(),
        std::task::Poll::Ready(Err(AdmitError::DeadlineExceeded { .. }))
    ));
    drop(leaving);
    drop(held);
    let entry = &queue.snapshot().priorities[0];
    let refusals = entry.refusals;
    assert_eq!(
        (
            refusals.deadline_passed,
            refusals.deadline_exceeded,
            refusals.cancelled,
            refusals.would_miss_deadline
        ),
        (1, 1, 1, 0)
    );
    assert_eq!(
        (
            entry.errored,
            refusals.by_reason().iter().map(|&(_, n)| n).sum::<u64>()
        ),
        (3, 3)
    );
}

#[tokio::test(start_paused = true)]
async fn at_light_load_the_wait_is_counted_in_holds_not_in_recent_completions() {
    let t0 = Instant::now();
    // Light load: one request every 10 ms, each holding the slot for 1 ms.
    // Work completes at 100 a second, but a busy slot frees up at 1,000.
    let queue = taught_one_slot_queue(t0, 10, ms(1), ms(9)).await;
    let _held = admit_now(&queue, work(1, 0, t0, 100));
    let _queued: Vec<Pending> = (0..2)
        .map(|i| enqueue(&queue, work(2, 0, t0, 101 + i)))
        .collect();
    // Two ahead and its own grant at 1,000 a second, plus a 1 ms hold:
    // 4 ms. At the completion rate it would have read as 31 ms.
    let mut in_time = tokio_test::task::spawn(queue.admit(with_timeout(0, ms(8))));
    assert!(in_time.poll().is_pending(), "refused though it fits");
    // The estimate still refuses what it says will not fit.
    match queue.admit(with_timeout(0, ms(3))).await {
        Err(AdmitError::WouldMissDeadline {
            expected,
            remaining,
        }) => assert_eq!((expected, remaining), (ms(5), ms(3))),
        other => panic!("expected an early rejection, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn without_early_rejection_the_same_request_waits() {
    let (queue, _held, _queued) = draining_at_a_thousand_per_second(false, 4).await;
    let mut doomed = tokio_test::task::spawn(queue.admit(with_timeout(0, ms(3))));
    assert!(doomed.poll().is_pending());
}

fn elastic(tenant: u64, t0: Instant, created_ms: u64) -> WorkInfo {
    work(tenant, Priority::BULK_NORMAL.get(), t0, created_ms)
}

#[tokio::test(start_paused = true)]
async fn elastic_work_holds_at_most_its_share_and_regular_work_gets_the_rest() {
    let t0 = Instant::now();
    let queue = WorkQueue::builder()
        .total_slots(4)
        .elastic_share(0.5)
        .build()
        .unwrap();
    // Regular work is about (the share applies only then).
    drop(admit_now(&queue, work(1, 0, t0, 0)));
    // Two elastic slots of four, then elastic work waits with slots free.
    let bulk: Vec<_> = (0..2)
        .map(|i| admit_now(&queue, elastic(1, t0, i)))
        .collect();
    let mut bulk_waiting = vec![("bulk", enqueue(&queue, elastic(1, t0, 2)))];
    assert_eq!(queue.snapshot().granter.used, 2);

    // Regular work of the same or another tenant gets the free slots at
    // once, past the capped elastic waiter.
    let regular = admit_now(&queue, work(1, 0, t0, 3));
    let other = admit_now(&queue, work(2, 0, t0, 4));
    assert_eq!(queue.snapshot().granter.used, 4);
    drop((regular, other));
    assert!(granted(&mut bulk_waiting).is_empty(), "still at its share");

    // An elastic slot comes back: the waiting bulk work takes it.
    drop(bulk);
    assert_eq!(names(&granted(&mut bulk_waiting)), ["bulk"]);
}

/// The share keeps slots for regular work; with none about it would only
/// leave the CPU idle.
#[tokio::test(start_paused = true)]
async fn elastic_work_takes_every_slot_while_no_regular_work_is_about() {
    let t0 = Instant::now();
    let period = ms(100);
    let queue = WorkQueue::builder()
        .total_slots(4)
        .elastic_share(0.5)
        .reset_period(period)
        .build()
        .unwrap();
    let mut bulk: Vec<_> = (0..4)
        .map(|i| admit_now(&queue, elastic(1, t0, i)))
        .collect();
    assert_eq!(queue.snapshot().granter.used, 4, "no cap: nobody else");

    // Regular work arrives: it waits for one bulk hold, then the cap is
    // back, and a bulk request waits with a slot free.
    let mut regular = vec![("regular", enqueue(&queue, work(2, 0, t0, 5)))];
    bulk.pop();
    let regular = granted(&mut regular);
    assert_eq!(names(&regular), ["regular"]);
    bulk.pop();
    let mut bulk_waiting = vec![("bulk", enqueue(&queue, elastic(1, t0, 6)))];
    assert_eq!(queue.snapshot().granter.used, 3);
    drop(regular);

    // Two reset periods without regular work: the cap lifts and the
    // waiting bulk request takes a free slot.
    advance_to(t0, period, &queue).await;
    assert!(
        granted(&mut bulk_waiting).is_empty(),
        "regular work was about"
    );
    advance_to(t0, period * 2, &queue).await;
    assert_eq!(names(&granted(&mut bulk_waiting)), ["bulk"]);
}

/// Where holds are timed, elastic work that holds its slots about as long
/// as regular work (at most twice as long) is not held to the share: an
/// arrival waits for it no longer than for regular work in the same slots,
/// and the cap would only leave a slot idle. Longer holds are capped.
#[tokio::test(start_paused = true)]
async fn elastic_work_that_holds_like_regular_work_is_not_held_to_the_share() {
    for (bulk_hold, capped) in [
        (ms(1), false),
        (ms(2), false),
        (ms(3), true),
        (ms(10), true),
    ] {
        let t0 = Instant::now();
        let queue = WorkQueue::builder()
            .total_slots(2)
            .elastic_share(0.5)
            .early_rejection(true)
            .build()
            .unwrap();
        // One hold each teaches the queue the typical holds: regular 1 ms.
        let regular = admit_now(&queue, work(1, 0, t0, 0));
        tokio::time::advance(ms(1)).await;
        drop(regular);
        let bulk = admit_now(&queue, elastic(1, t0, 1));
        tokio::time::advance(bulk_hold).await;
        drop(bulk);

        // Bulk work holds its share (one slot of two); a second bulk
        // request takes the free slot or waits beside it.
        let _first = admit_now(&queue, elastic(1, t0, 2));
        let mut second = tokio_test::task::spawn(queue.admit(elastic(1, t0, 3)));
        let admitted = matches!(second.poll(), Poll::Ready(Ok(_)));
        assert_eq!(admitted, !capped, "bulk holds of {bulk_hold:?}");
        // Regular work still gets a slot that is free.
        if capped {
            drop(admit_now(&queue, work(2, 0, t0, 4)));
        }
    }
}

#[test]
fn the_elastic_share_is_validated() {
    let error = WorkQueue::builder().elastic_share(0.0).build().unwrap_err();
    assert_eq!(error.field(), "elastic_share");
    assert!(WorkQueue::builder().elastic_share(1.5).build().is_err());
}

/// Epoch-LIFO without settings: they are chosen from the deadlines requests
/// carry, and chosen again when those move by a factor of two or more.
#[tokio::test(start_paused = true)]
async fn epoch_lifo_takes_its_settings_from_the_deadlines_requests_carry() {
    let t0 = Instant::now();
    let queue = WorkQueue::builder()
        .total_slots(1)
        .epoch_lifo_from_deadlines()
        .build()
        .unwrap();
    let deadline_work = |timeout: u64| from_tenant(1, 0, ms(timeout));
    // One request short of a sample: no settings, everything FIFO.
    for _ in 1..32 {
        drop(admit_now(&queue, deadline_work(50)));
    }
    queue.maintain();
    assert_eq!(queue.snapshot().epoch_lifo, None);
    let held = admit_now(&queue, deadline_work(50));
    queue.maintain();
    let chosen = EpochLifo::for_deadline(ms(50));
    assert_eq!(queue.snapshot().epoch_lifo, Some(chosen));

    // The settings act: a request that queues past half its deadline
    // (25 ms) turns its priority LIFO when the epoch (10 ms, closing half
    // a millisecond late) closes: here, at 30.5 ms.
    let mut slow = vec![("slow", enqueue(&queue, deadline_work(50)))];
    advance_to(t0, ms(30), &queue).await;
    drop(held);
    let held = granted(&mut slow).pop().unwrap().1;
    assert_eq!(lifo_below(&queue), -128);
    advance_to(t0, ms(31), &queue).await;
    assert_eq!(lifo_below(&queue), 1);

    // The deadlines move to 400 ms: new settings. LIFO-marked work waiting
    // for its epoch to close is not stranded by the new epoch count: it
    // goes ahead of work marked under the new settings.
    let mut waiters = vec![("open epoch", enqueue(&queue, deadline_work(50)))];
    for _ in 0..1_000 {
        drop(enqueue(&queue, deadline_work(400)));
    }
    // The settings follow the median within a factor of two.
    let moved = queue.snapshot().epoch_lifo.unwrap();
    let scale = moved.lifo_delay * 2;
    assert!(scale > ms(200) && scale < ms(800), "{moved:?}");
    waiters.push(("after the change", enqueue(&queue, deadline_work(400))));
    drop(held);
    let first = granted(&mut waiters);
    assert_eq!(names(&first), ["open epoch"]);
    drop(first);
    assert_eq!(names(&granted(&mut waiters)), ["after the change"]);
}

/// A request that would make its deadline when it queued, but no longer
/// once higher-priority work queued ahead of it, is refused as soon as the
/// queue is maintained (a controller does so every tick), with the wait it
/// would have had, instead of failing when its deadline passes. Work still
/// able to make it stays, whatever its place.
#[tokio::test(start_paused = true)]
async fn waiting_work_pushed_past_its_deadline_is_refused_early() {
    let (queue, _held, _none) = draining_at_a_thousand_per_second(true, 0).await;
    // One grant ahead of each, at 1,000 a second: both make it now.
    let mut doomed = tokio_test::task::spawn(queue.admit(with_timeout(-10, ms(10))));
    assert!(doomed.poll().is_pending());
    let mut patient = tokio_test::task::spawn(queue.admit(with_timeout(-10, ms(50))));
    assert!(patient.poll().is_pending());
    queue.maintain();
    assert!(!doomed.is_woken());
    // Twelve more important requests go ahead of them: 13 ms for the
    // first, 14 for the second.
    let mut urgent: Vec<_> = (0..12)
        .map(|_| {
            let mut admit = tokio_test::task::spawn(queue.admit(with_timeout(50, ms(100))));
            assert!(admit.poll().is_pending());
            admit
        })
        .collect();
    tokio::time::advance(ms(1)).await;
    queue.maintain();
    assert!(doomed.is_woken());
    match doomed.poll() {
        Poll::Ready(Err(AdmitError::WouldMissDeadline {
            expected,
            remaining,
        })) => {
            assert_eq!(expected, ms(13));
            assert_eq!(remaining, ms(9), "refused before its deadline");
        }
        other => panic!("expected an early refusal, got {other:?}"),
    }
    assert!(patient.poll().is_pending(), "still able to make it");
    let low = queue.snapshot();
    let low = low.priority(Priority::new(-10)).unwrap();
    assert_eq!(low.refusals.would_miss_deadline, 1);
    assert_eq!(low.refusals.deadline_exceeded, 0);
    assert_eq!(queue.waiting(), 13);
    urgent.clear();
}

/// Without early rejection nothing is refused before its deadline.
#[tokio::test(start_paused = true)]
async fn without_early_rejection_waiting_work_waits_out_its_deadline() {
    let (queue, _held, _none) = draining_at_a_thousand_per_second(false, 0).await;
    let mut doomed = tokio_test::task::spawn(queue.admit(with_timeout(-10, ms(10))));
    assert!(doomed.poll().is_pending());
    let _urgent: Vec<_> = (0..12)
        .map(|_| {
            let mut admit = tokio_test::task::spawn(queue.admit(with_timeout(50, ms(100))));
            assert!(admit.poll().is_pending());
            admit
        })
        .collect();
    tokio::time::advance(ms(1)).await;
    queue.maintain();
    assert!(doomed.poll().is_pending());
    tokio::time::advance(ms(9)).await;
    assert!(matches!(
        doomed.poll(),
        Poll::Ready(Err(AdmitError::DeadlineExceeded { .. }))
    ));
}
