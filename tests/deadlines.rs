//! Deadlines, under tokio's paused clock.

mod common;

use std::time::Duration;

use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use common::*;
use tokio::time::Instant;

fn with_timeout(tenant: u64, timeout: Duration) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .timeout(timeout)
        .build()
}

#[tokio::test(start_paused = true)]
async fn an_expired_deadline_fails_at_once_without_queueing() {
    let queue = WorkQueue::new(1).unwrap();
    let expired = WorkInfo::builder().deadline(Instant::now()).build();
    // Capacity is free, yet the work is not admitted: it can no longer help.
    assert_eq!(
        queue.admit(expired).await.unwrap_err(),
        AdmitError::DeadlinePassed
    );
    let snapshot = queue.snapshot();
    assert_eq!((snapshot.waiting, snapshot.granter.used), (0, 0));
    assert_eq!(snapshot.priority(Priority::NORMAL).unwrap().errored, 1);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_expiring_while_waiting_removes_the_waiter_and_reports_the_wait() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let _held = admit_now(&queue, work(1, 0, t0, 0));
    let result = queue
        .admit(with_timeout(2, Duration::from_millis(10)))
        .await;
    assert_eq!(
        result.unwrap_err(),
        AdmitError::DeadlineExceeded {
            waited: Duration::from_millis(10)
        }
    );
    assert_eq!(Instant::now() - t0, Duration::from_millis(10));
    assert_eq!(queue.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_never_goes_to_work_whose_deadline_has_passed() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    // The doomed request is first in line (higher priority) but is not
    // polled after its deadline: only the grant loop can notice.
    let doomed_work = WorkInfo::builder()
        .tenant(TenantId::new(1))
        .priority(Priority::HIGH)
        .timeout(Duration::from_millis(5))
        .build();
    let mut doomed = enqueue(&queue, doomed_work);
    let mut patient = vec![("patient", enqueue(&queue, work(1, 0, t0, 1)))];
    tokio::time::advance(Duration::from_millis(6)).await;

    drop(held);
    assert_eq!(names(&granted(&mut patient)), ["patient"]);
    assert_eq!(
        try_settle(&mut doomed).unwrap().unwrap_err(),
        AdmitError::DeadlineExceeded {
            waited: Duration::from_millis(6)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_arrives_before_the_deadline_wins() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let mut waiter = enqueue(&queue, with_timeout(1, Duration::from_millis(5)));
    tokio::time::advance(Duration::from_millis(4)).await;
    drop(held);
    // Granted at 4 ms; observed only after the deadline: still admitted.
    tokio::time::advance(Duration::from_millis(2)).await;
    assert!(try_settle(&mut waiter).unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_timeout_too_large_to_represent_means_no_deadline() {
    let work = WorkInfo::builder().timeout(Duration::MAX).build();
    assert_eq!(work.deadline(), None);
}
