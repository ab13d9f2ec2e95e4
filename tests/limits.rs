//! Bounds and lifecycle: the bounded queue, closing, bypass, moving totals.

mod common;

use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use common::*;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_full_queue_rejects_at_once_without_queueing() {
    let t0 = Instant::now();
    let queue = WorkQueue::builder()
        .total_slots(1)
        .max_waiters(2)
        .build()
        .unwrap();
    let _held = admit_now(&queue, work(1, 0, t0, 0));
    let _a = enqueue(&queue, work(1, 0, t0, 1));
    let _b = enqueue(&queue, work(1, 0, t0, 2));
    let rejected = queue.admit(work(1, 127, t0, 3)).await;
    assert_eq!(
        rejected.unwrap_err(),
        AdmitError::QueueFull { max_waiters: 2 }
    );
    assert_eq!(queue.waiting(), 2);
    assert_eq!(
        queue.snapshot().priority(Priority::HIGH).unwrap().errored,
        1
    );
}

#[tokio::test(start_paused = true)]
async fn closing_fails_every_waiter_and_every_later_request() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let held = admit_now(&queue, work(1, 0, t0, 0));
    let mut waiters = vec![
        ("a", enqueue(&queue, work(1, 0, t0, 1))),
        ("b", enqueue(&queue, work(2, 10, t0, 2))),
    ];
    queue.close();
    assert!(queue.is_closed());
    let settled = settle_ready(&mut waiters);
    assert_eq!(settled.len(), 2);
    assert!(settled
        .iter()
        .all(|(_, r)| r.as_ref().unwrap_err() == &AdmitError::Closed));
    assert_eq!(
        queue.admit(work(3, 0, t0, 3)).await.unwrap_err(),
        AdmitError::Closed
    );

    // The permit granted before the close stays valid and returns its slot.
    drop(held);
    let snapshot = queue.snapshot();
    assert!(snapshot.closed);
    assert_eq!((snapshot.waiting, snapshot.granter.used), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn bypass_work_is_admitted_at_once_and_counted() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let _held = admit_now(&queue, work(1, 0, t0, 0));
    let _waiting = enqueue(&queue, work(1, 0, t0, 1));
    let bypass = WorkInfo::builder()
        .tenant(TenantId::new(9))
        .priority(Priority::LOW)
        .bypass(true)
        .build();
    let permit = admit_now(&queue, bypass);
    let snapshot = queue.snapshot();
    // Slots in use may exceed the total; the tenant is charged; nothing queued.
    assert_eq!((snapshot.granter.used, snapshot.granter.total), (2, 1));
    assert_eq!(snapshot.tenant(TenantId::new(9)).unwrap().used, 1);
    assert_eq!(snapshot.waiting, 1);
    assert_eq!(snapshot.priority(Priority::LOW).unwrap().admitted, 1);
    drop(permit);
    assert_eq!(queue.snapshot().granter.used, 1);
}

#[tokio::test(start_paused = true)]
async fn lowering_the_total_revokes_nothing_and_holds_back_grants() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(3).unwrap();
    let held: Vec<_> = (0..3)
        .map(|i| admit_now(&queue, work(1, 0, t0, i)))
        .collect();
    let mut waiting = vec![("w", enqueue(&queue, work(1, 0, t0, 9)))];
    queue.set_total_slots(1).unwrap();
    let mut held = held.into_iter();
    drop(held.next());
    drop(held.next());
    assert!(
        granted(&mut waiting).is_empty(),
        "1 used of 1: no grant yet"
    );
    drop(held.next());
    assert_eq!(names(&granted(&mut waiting)), ["w"]);
}

#[tokio::test(start_paused = true)]
async fn raising_the_total_grants_waiters_in_order() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(0).unwrap();
    let mut waiting = vec![
        ("low", enqueue(&queue, work(1, -30, t0, 0))),
        ("normal", enqueue(&queue, work(1, 0, t0, 1))),
        ("high", enqueue(&queue, work(1, 50, t0, 2))),
    ];
    queue.set_total_slots(2).unwrap();
    let grants = granted(&mut waiting);
    let mut granted_names = names(&grants);
    granted_names.sort();
    assert_eq!(granted_names, ["high", "normal"]);
    assert_eq!(queue.waiting(), 1);
    drop(grants);
    assert_eq!(names(&granted(&mut waiting)), ["low"]);
}

#[test]
fn bad_configuration_fails_at_construction_naming_the_field() {
    let err = WorkQueue::builder().max_waiters(0).build().unwrap_err();
    assert_eq!(err.field(), "max_waiters");
    let err = WorkQueue::builder()
        .reset_period(std::time::Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "reset_period");
    assert!(err.to_string().contains("reset_period"), "{err}");
    let err = WorkQueue::new(u64::MAX).unwrap_err();
    assert_eq!(err.field(), "total_slots");
    let queue = WorkQueue::new(1).unwrap();
    assert_eq!(
        queue.set_total_slots(u64::MAX).unwrap_err().field(),
        "total_slots"
    );
}

#[test]
fn futures_and_permits_can_cross_threads_and_live_in_structs() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<admission::Admit>();
    send_sync::<admission::SlotPermit>();
    send_sync::<WorkQueue>();
    // Named types: a struct can hold a pending admission without boxing.
    struct Handler {
        _admit: admission::Admit,
    }
    let queue = WorkQueue::new(1).unwrap();
    let _handler = Handler {
        _admit: queue.admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)),
    };
}

fn asking(tenant: u64, units: u64, t0: Instant, created_ms: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .create_time(t0 + std::time::Duration::from_millis(created_ms))
        .requested(units)
        .build()
}

#[tokio::test(start_paused = true)]
async fn a_request_for_several_slots_gets_them_all_at_once_or_waits() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(3).unwrap();
    let two = admit_now(&queue, asking(1, 2, t0, 0));
    assert_eq!(queue.snapshot().granter.used, 2);
    assert_eq!(queue.snapshot().tenant(TenantId::new(1)).unwrap().used, 2);
    // Two more do not fit in the one slot left: it waits in line, and the
    // single-slot request behind it waits too (no overtaking).
    let mut waiting = vec![
        ("pair", enqueue(&queue, asking(2, 2, t0, 1))),
        ("single", enqueue(&queue, asking(2, 1, t0, 2))),
    ];
    assert!(granted(&mut waiting).is_empty());
    drop(two);
    let grants = granted(&mut waiting);
    assert_eq!(names(&grants), ["pair", "single"]);
    assert_eq!(queue.snapshot().granter.used, 3);
    drop(grants);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn zero_units_count_as_one_and_bypass_takes_what_it_asks() {
    let t0 = Instant::now();
    assert_eq!(asking(1, 0, t0, 0).requested(), 1);
    let queue = WorkQueue::new(1).unwrap();
    let bypass = WorkInfo::builder().requested(3).bypass(true).build();
    let permit = admit_now(&queue, bypass);
    assert_eq!(queue.snapshot().granter.used, 3);
    drop(permit);
    assert_eq!(queue.snapshot().granter.used, 0);
}
