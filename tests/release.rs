//! `SlotPermit::release_during`: the slot is free while the work waits, the
//! second admission is ordered as the work's own, and nothing is lost when
//! it is refused or dropped.

mod common;

use std::task::Poll;
use std::time::Duration;

use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use common::{admit_now, enqueue, requested, try_settle, work};
use tokio::time::Instant;
use tokio_test::task;

#[tokio::test(start_paused = true)]
async fn the_slot_is_free_during_the_wait_and_taken_again_after_it() {
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let (answer, answered) = tokio::sync::oneshot::channel::<u32>();
    let mut released = task::spawn(permit.release_during(answered));
    assert!(released.poll().is_pending());
    assert_eq!(queue.granter_snapshot().used, 0);

    // Someone else computes meanwhile, on the slot the waiting work gave
    // back.
    let other = admit_now(&queue, WorkInfo::new(TenantId::new(2), Priority::NORMAL));
    drop(other);

    answer.send(42).unwrap();
    let Poll::Ready((Ok(42), Ok(permit))) = released.poll() else {
        panic!("expected the answer and a new permit");
    };
    assert_eq!(queue.granter_snapshot().used, 1);
    assert_eq!(permit.work().tenant(), TenantId::new(1));
    assert_eq!(permit.work().priority(), Priority::NORMAL);
    // Each admission is counted: the first, the other tenant's, the second.
    assert_eq!(requested(&queue), 3);
    drop(permit);
    assert_eq!(queue.granter_snapshot().used, 0);
}

#[tokio::test(start_paused = true)]
async fn the_second_admission_is_ordered_by_the_works_own_arrival_and_priority() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let first = admit_now(&queue, work(1, 0, t0, 0));
    let (resume, resumed) = tokio::sync::oneshot::channel::<()>();
    let mut released = task::spawn(first.release_during(resumed));
    assert!(released.poll().is_pending());

    // While it waits: later work of the same tenant takes the slot, more
    // later work queues, and so does work of a higher priority.
    let holder = admit_now(&queue, work(1, 0, t0, 5));
    let mut later = enqueue(&queue, work(1, 0, t0, 10));
    let mut urgent = enqueue(&queue, work(1, 50, t0, 20));

    // It asks again after all of them asked: what orders it is when the
    // work arrived, not when it asked.
    tokio::time::advance(Duration::from_millis(30)).await;
    resume.send(()).unwrap();
    assert!(released.poll().is_pending(), "the slot is held");

    // Higher priority first, then the work that arrived first, whatever
    // the order in which they asked.
    drop(holder);
    let urgent = try_settle(&mut urgent).expect("granted").unwrap();
    assert!(released.poll().is_pending());
    assert!(try_settle(&mut later).is_none());
    drop(urgent);
    let Poll::Ready((Ok(()), Ok(again))) = released.poll() else {
        panic!("expected the released work to be granted next");
    };
    assert!(try_settle(&mut later).is_none());
    drop(again);
    let later = try_settle(&mut later).expect("granted").unwrap();
    drop(later);
    assert_eq!(queue.granter_snapshot().used, 0);
}

#[tokio::test(start_paused = true)]
async fn a_refused_second_admission_still_returns_what_the_wait_produced() {
    let queue = WorkQueue::new(1).unwrap();
    let deadline = Instant::now() + Duration::from_millis(10);
    let permit = admit_now(
        &queue,
        WorkInfo::builder()
            .tenant(TenantId::new(1))
            .deadline(deadline)
            .build(),
    );
    let (output, again) = permit
        .release_during(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            "rows"
        })
        .await;
    assert_eq!(output, "rows");
    assert!(
        matches!(again, Err(AdmitError::DeadlinePassed)),
        "{again:?}"
    );
    assert_eq!(queue.granter_snapshot().used, 0);

    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let (resume, resumed) = tokio::sync::oneshot::channel::<()>();
    let mut released = task::spawn(permit.release_during(resumed));
    assert!(released.poll().is_pending());
    queue.close();
    resume.send(()).unwrap();
    let Poll::Ready((Ok(()), Err(AdmitError::Closed))) = released.poll() else {
        panic!("expected the wait's output and the closed queue's refusal");
    };
    assert_eq!(queue.granter_snapshot().used, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_it_during_the_wait_or_the_second_admission_loses_no_slot() {
    let queue = WorkQueue::new(1).unwrap();

    // Dropped during the wait: the slot was already back.
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let mut released = task::spawn(permit.release_during(std::future::pending::<()>()));
    assert!(released.poll().is_pending());
    drop(released);
    assert_eq!(queue.granter_snapshot().used, 0);

    // Dropped while waiting for the slot again: it leaves the queue, and
    // the slot goes to whoever is next.
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let mut released = task::spawn(permit.release_during(std::future::ready(())));
    // Free from the call on, before the future is first polled.
    let holder = admit_now(&queue, WorkInfo::new(TenantId::new(2), Priority::NORMAL));
    assert!(released.poll().is_pending());
    assert_eq!(queue.waiting(), 1);
    let mut next = enqueue(&queue, WorkInfo::new(TenantId::new(3), Priority::NORMAL));
    drop(released);
    assert_eq!(queue.waiting(), 1);
    drop(holder);
    let next = try_settle(&mut next).expect("granted").unwrap();
    drop(next);
    assert_eq!(queue.granter_snapshot().used, 0);
    assert_eq!(queue.waiting(), 0);
}

/// A named type, so that it can be stored without boxing, and fused, so
/// that a `select!` loop can tell it is done.
#[tokio::test(start_paused = true)]
async fn the_future_can_be_stored_and_tells_when_it_is_done() {
    use futures::future::FusedFuture;

    struct Stored {
        future: admission::ReleaseDuring<std::future::Ready<u8>>,
    }
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let stored = Stored {
        future: permit.release_during(std::future::ready(5)),
    };
    assert!(format!("{:?}", stored.future).contains("waiting"));
    let mut future = std::pin::pin!(stored.future);
    assert!(!future.is_terminated());
    let (five, again) = future.as_mut().await;
    assert_eq!(five, 5);
    assert!(future.is_terminated());
    assert!(format!("{:?}", future).contains("done"));
    drop(again.unwrap());
    assert_eq!(queue.granter_snapshot().used, 0);
}
