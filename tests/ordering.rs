//! The queue's order: tenant fairness, then priority, then create time; and
//! the fair-share memory (weights, the periodic reset).

mod common;

use std::time::Duration;

use admission::{TenantId, TenantWeight, WorkQueue};
use common::*;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn two_tenants_order_by_usage_then_priority_then_create_time() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    // Tenant 53 takes the only slot on the fast path: used(53) = 1.
    let first = admit_now(&queue, work(53, 0, t0, 1));
    let mut waiters = vec![
        ("t53/ct3", enqueue(&queue, work(53, 0, t0, 3))),
        ("t53/ct2", enqueue(&queue, work(53, 0, t0, 2))),
        ("t71/p-128/ct4", enqueue(&queue, work(71, -128, t0, 4))),
        ("t71/p0/ct5", enqueue(&queue, work(71, 0, t0, 5))),
    ];
    assert_eq!(queue.waiting(), 4);

    // Tenant 71 has used nothing, so it goes first, and its normal-priority
    // work goes before its older low-priority work.
    queue.set_total_slots(2).unwrap();
    let a = granted(&mut waiters);
    assert_eq!(names(&a), ["t71/p0/ct5"]);

    // Both tenants now used one slot: the tie goes to the tenant the queue
    // knew first (53), and within tenant 53 the older request goes first.
    queue.set_total_slots(3).unwrap();
    let b = granted(&mut waiters);
    assert_eq!(names(&b), ["t53/ct2"]);

    // A cancelled request leaves the queue without taking anything.
    let cancelled = waiters.remove(0);
    assert_eq!(cancelled.0, "t53/ct3");
    drop(cancelled);
    assert_eq!(queue.waiting(), 1);
    assert!(granted(&mut waiters).is_empty());

    // Work done by tenant 53 frees a slot; the last waiter gets it.
    drop(first);
    let c = granted(&mut waiters);
    assert_eq!(names(&c), ["t71/p-128/ct4"]);
    assert!(waiters.is_empty());

    // Usage counts grants since the last reset (the default): two each,
    // tenant 53's first one included, although its slot is back.
    let snapshot = queue.snapshot();
    assert_eq!(snapshot.granter.used, 3);
    assert_eq!(snapshot.tenant(TenantId::new(71)).unwrap().used, 2);
    assert_eq!(snapshot.tenant(TenantId::new(53)).unwrap().used, 2);
}

#[tokio::test(start_paused = true)]
async fn an_empty_queue_refuses_a_grant() {
    use admission::grant::Requester;
    let queue = WorkQueue::new(1).unwrap();
    assert!(!queue.has_waiting_requests());
    assert_eq!(queue.granted(), 0);
}

/// Runs `grants` admissions with every tenant permanently backlogged,
/// completing the oldest permit after each poll round, and returns the
/// admissions per tenant.
fn shares_under_backlog(queue: &WorkQueue, tenants: &[u64], grants: usize) -> Vec<usize> {
    let t0 = Instant::now();
    let mut waiting: Vec<(usize, Pending)> = Vec::new();
    let mut held = std::collections::VecDeque::new();
    let mut counts = vec![0; tenants.len()];
    let mut created = 0;
    while counts.iter().sum::<usize>() < grants {
        for (index, &tenant) in tenants.iter().enumerate() {
            while waiting.iter().filter(|(i, _)| *i == index).count() < 8 {
                created += 1;
                let admit = tokio_test::task::spawn(queue.admit(work(tenant, 0, t0, created)));
                waiting.push((index, admit));
            }
        }
        waiting.retain_mut(|(index, admit)| match try_settle(admit) {
            Some(result) => {
                counts[*index] += 1;
                held.push_back(result.expect("admitted"));
                false
            }
            None => true,
        });
        held.pop_front();
    }
    counts
}

#[tokio::test(start_paused = true)]
async fn weighted_tenants_share_slots_two_to_five_under_backlog() {
    // Hold every slot first so that the backlog forms before any grant.
    let queue = WorkQueue::new(7).unwrap();
    queue
        .set_tenant_weight(TenantId::new(1), TenantWeight::new(2).unwrap())
        .unwrap();
    queue
        .set_tenant_weight(TenantId::new(2), TenantWeight::new(5).unwrap())
        .unwrap();
    let counts = shares_under_backlog(&queue, &[1, 2], 7_000);
    let share = counts[0] as f64 / (counts[0] + counts[1]) as f64;
    // Shares converge to the weights with a granularity of one slot out of
    // the total; with 7 slots and weights 2:5 the split is exact, so allow
    // only rounding at the edges of the run.
    assert!(
        (share - 2.0 / 7.0).abs() < 0.005,
        "tenant 1 got {share:.4} of grants, counts {counts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn equal_weights_share_equally_and_weights_can_change_at_run_time() {
    let queue = WorkQueue::new(8).unwrap();
    let equal = shares_under_backlog(&queue, &[1, 2], 4_000);
    assert!(equal[0].abs_diff(equal[1]) <= 8, "equal weights: {equal:?}");

    queue
        .set_tenant_weights([(TenantId::new(2), TenantWeight::new(3).unwrap())])
        .unwrap();
    // Usage counts grants until the periodic reset: start the weighted run
    // from a fresh period, as a later second of a service would.
    tokio::time::advance(Duration::from_secs(1)).await;
    queue.maintain();
    let weighted = shares_under_backlog(&queue, &[1, 2], 8_000);
    let share = weighted[1] as f64 / (weighted[0] + weighted[1]) as f64;
    assert!((share - 0.75).abs() < 0.01, "1:3 weights: {weighted:?}");

    // Replacing the table drops tenants not listed back to the default.
    queue.set_tenant_weights([]).unwrap();
    assert_eq!(
        queue.snapshot().tenant(TenantId::new(2)).map(|t| t.weight),
        Some(TenantWeight::default())
    );
}

#[tokio::test(start_paused = true)]
async fn usage_resets_each_period_and_idle_tenants_are_dropped() {
    let t0 = Instant::now();
    let queue = WorkQueue::builder()
        .total_slots(3)
        .reset_period(Duration::from_secs(1))
        .build()
        .unwrap();
    // Tenant 1 takes every slot; tenant 2 passes through and leaves.
    let held: Vec<_> = (0..3)
        .map(|i| admit_now(&queue, work(1, 0, t0, i)))
        .collect();
    let snapshot = queue.snapshot();
    assert_eq!(snapshot.tenant(TenantId::new(1)).unwrap().used, 3);

    // Within the period, usage is remembered.
    tokio::time::advance(Duration::from_millis(999)).await;
    let early = enqueue(&queue, work(2, 0, t0, 10));
    assert_eq!(queue.snapshot().tenant(TenantId::new(1)).unwrap().used, 3);

    // After it, the next request that has to wait triggers the reset:
    // tenant 1 is forgotten (nothing waiting), tenant 2 stays at zero.
    tokio::time::advance(Duration::from_millis(1)).await;
    let mut late = vec![("t3", enqueue(&queue, work(3, 0, t0, 11)))];
    let snapshot = queue.snapshot();
    assert!(snapshot.tenant(TenantId::new(1)).is_none(), "{snapshot:?}");
    assert_eq!(snapshot.tenant(TenantId::new(2)).unwrap().used, 0);

    // Permits charged before the reset are not subtracted again.
    let mut held = held.into_iter();
    drop(held.next());
    drop(early);
    let grants = granted(&mut late);
    assert_eq!(names(&grants), ["t3"]);
    let snapshot = queue.snapshot();
    assert_eq!(snapshot.tenant(TenantId::new(3)).unwrap().used, 1);
    assert!(snapshot.tenant(TenantId::new(1)).is_none());

    // `maintain` runs a due reset without anyone having to wait.
    tokio::time::advance(Duration::from_secs(1)).await;
    queue.maintain();
    assert!(queue.snapshot().tenants.is_empty());
    drop(grants);
    drop(held);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn counting_grants_shares_even_one_slot_by_weight() {
    // One slot, two tenants 1:3: counting slots held, the heavier tenant
    // would win every tie and take everything; counting grants since the
    // reset, it gets three of every four.
    let queue = WorkQueue::builder()
        .total_slots(1)
        .usage(admission::Usage::Granted)
        .reset_period(Duration::from_secs(3600))
        .build()
        .unwrap();
    queue
        .set_tenant_weight(TenantId::new(2), TenantWeight::new(3).unwrap())
        .unwrap();
    let counts = shares_under_backlog(&queue, &[1, 2], 4_000);
    let share = counts[1] as f64 / (counts[0] + counts[1]) as f64;
    assert!((share - 0.75).abs() < 0.01, "{counts:?}");
}

/// The uncontended path decides in one pass what the long one would: every
/// counter its admissions touch (the priority's requests, admissions,
/// resumed requests and zero waits, the tenant's usage) comes out as the
/// long path leaves it, and a deadline already passed is still refused.
#[tokio::test(start_paused = true)]
async fn uncontended_admissions_keep_every_count_the_long_path_keeps() {
    use admission::{AdmitError, Priority, Usage, WorkInfo};

    let queue = WorkQueue::builder()
        .total_slots(8)
        .usage(Usage::Held)
        .build()
        .unwrap();
    let soon = Instant::now() + Duration::from_secs(1);
    let plain = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let with_deadline = admit_now(
        &queue,
        WorkInfo::builder()
            .tenant(TenantId::new(1))
            .priority(Priority::NORMAL)
            .deadline(soon)
            .build(),
    );
    let two_slots = admit_now(
        &queue,
        WorkInfo::builder()
            .tenant(TenantId::new(2))
            .priority(Priority::HIGH)
            .requested(2)
            .build(),
    );
    // Work in progress asking again: counted as resumed.
    let (_, resumed) = two_slots.release_during(async {}).await;
    let resumed = resumed.unwrap();
    let passed = WorkInfo::builder()
        .tenant(TenantId::new(3))
        .priority(Priority::NORMAL)
        .deadline(Instant::now())
        .build();
    assert!(matches!(
        refused_at_once(&queue, passed),
        AdmitError::DeadlinePassed
    ));

    let snapshot = queue.snapshot();
    let normal = snapshot.priority(Priority::NORMAL).unwrap();
    assert_eq!(
        (
            normal.requested,
            normal.admitted,
            normal.errored,
            normal.resumed
        ),
        (3, 2, 1, 0)
    );
    assert_eq!(normal.wait.count(), 2);
    let high = snapshot.priority(Priority::HIGH).unwrap();
    assert_eq!(
        (high.requested, high.admitted, high.errored, high.resumed),
        (2, 2, 0, 1)
    );
    assert_eq!(high.wait.count(), 2);
    let used: Vec<_> = snapshot
        .tenants
        .iter()
        .map(|t| (t.tenant, t.used))
        .collect();
    assert!(used.contains(&(TenantId::new(1), 2)));
    assert!(used.contains(&(TenantId::new(2), 2)));
    assert_eq!(queue.granter_snapshot().used, 4);

    // Held usage is given back on release, so tenant 1 (still holding one
    // slot) now sorts behind tenant 2 (holding none) at the next grant,
    // though the queue knew it first.
    drop(with_deadline);
    drop(resumed);
    queue.set_total_slots(1).unwrap();
    let mut waiters = vec![
        ("t1", enqueue(&queue, work(1, 0, Instant::now(), 0))),
        ("t2", enqueue(&queue, work(2, 0, Instant::now(), 0))),
    ];
    queue.set_total_slots(2).unwrap();
    assert_eq!(names(&granted(&mut waiters)), ["t2"]);
    drop(plain);
}
