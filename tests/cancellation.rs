//! Cancel safety: dropping an admission future at any point, or a permit on
//! any path, loses no capacity.

mod common;

use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use common::*;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_future_dropped_before_its_first_poll_never_asks() {
    let queue = WorkQueue::new(1).unwrap();
    drop(queue.admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)));
    let snapshot = queue.snapshot();
    assert!(snapshot.priorities.is_empty(), "nothing was requested");
    assert_eq!(snapshot.granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_request_removes_it_from_the_queue() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let waiting = enqueue(&queue, work(1, 0, t0, 1));
    let mut behind = vec![("behind", enqueue(&queue, work(2, 0, t0, 2)))];
    assert_eq!(queue.waiting(), 2);

    drop(waiting);
    assert_eq!(queue.waiting(), 1);
    let normal = queue
        .snapshot()
        .priority(Priority::NORMAL)
        .cloned()
        .unwrap();
    assert_eq!(
        (normal.requested, normal.admitted, normal.errored),
        (3, 1, 1)
    );

    drop(held);
    let grants = granted(&mut behind);
    assert_eq!(names(&grants), ["behind"]);
    drop(grants);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_granted_admit_passes_the_slot_on() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let first = enqueue(&queue, work(1, 0, t0, 1));
    let mut second = vec![("second", enqueue(&queue, work(1, 0, t0, 2)))];

    // The slot is handed to `first` and `first` is woken ...
    drop(held);
    assert!(first.is_woken());
    assert_eq!(queue.waiting(), 1);
    assert_eq!(queue.snapshot().granter.used, 1);

    // ... but `first` is dropped before it sees the grant: the slot goes on
    // to `second`, with no moment where it is lost or held twice.
    drop(first);
    assert_eq!(queue.snapshot().granter.used, 1);
    let grants = granted(&mut second);
    assert_eq!(names(&grants), ["second"]);
    drop(grants);

    let snapshot = queue.snapshot();
    assert_eq!(snapshot.granter.used, 0);
    let normal = snapshot.priority(Priority::NORMAL).unwrap();
    assert_eq!(
        (normal.requested, normal.admitted, normal.errored),
        (3, 2, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_granted_admit_dropped_with_nobody_behind_returns_the_slot() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let waiting = enqueue(&queue, work(1, 0, t0, 1));
    drop(held);
    drop(waiting);
    assert_eq!(queue.snapshot().granter.used, 0);
    drop(admit_now(&queue, work(1, 0, t0, 2)));
}

#[tokio::test(start_paused = true)]
async fn a_permit_is_returned_when_its_work_panics() {
    let queue = WorkQueue::new(1).unwrap();
    let inside = queue.clone();
    let outcome = tokio::spawn(async move {
        let _permit = inside
            .admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL))
            .await
            .unwrap();
        panic!("handler failed while holding its slot");
    })
    .await;
    assert!(outcome.unwrap_err().is_panic());
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn done_returns_the_slot_to_the_next_waiter() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(4, 0, t0, 0));
    assert_eq!(held.work().tenant(), TenantId::new(4));
    let mut next = vec![("next", enqueue(&queue, work(5, 0, t0, 1)))];
    drop(held);
    assert_eq!(names(&granted(&mut next)), ["next"]);
}

#[tokio::test(start_paused = true)]
async fn the_woken_task_is_the_one_that_was_granted() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let mut low = enqueue(&queue, work(1, -50, t0, 1));
    let mut high = enqueue(&queue, work(1, 50, t0, 2));
    drop(held);
    assert!(high.is_woken());
    assert!(!low.is_woken(), "no herd: only the grantee is woken");
    assert!(low.poll().is_pending());
    assert!(high.poll().is_ready());
}
