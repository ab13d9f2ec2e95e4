//! `SlotPermit::give_way`: long work hands its slot to waiting work of
//! higher priority between chunks, asks for it again in its own order, and
//! nothing is lost whichever way the future ends.

mod common;

use std::task::Poll;
use std::time::Duration;

use admission::{AdmitError, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};
use common::{admit_now, enqueue, requested, try_settle, work};
use tokio::time::Instant;
use tokio_test::task;

/// Two slots, elastic work capped at one of them while regular work is
/// about, and regular work has asked; then `bulk` admitted on the share.
fn sharing_with_bulk(bulk: Priority) -> (WorkQueue, SlotPermit) {
    let queue = WorkQueue::builder()
        .total_slots(2)
        .elastic_share(0.5)
        .build()
        .unwrap();
    let regular = admit_now(&queue, at(1, Priority::NORMAL));
    let holder = admit_now(&queue, at(1, bulk));
    drop(regular);
    (queue, holder)
}

fn at(tenant: u64, priority: Priority) -> WorkInfo {
    WorkInfo::new(TenantId::new(tenant), priority)
}

/// Gives way and expects the permit back at once, kept.
fn kept(permit: SlotPermit) -> SlotPermit {
    let give_way = permit.give_way();
    assert!(!give_way.gave_way(), "nobody outranked the holder");
    let mut give_way = task::spawn(give_way);
    match give_way.poll() {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected the permit kept, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn with_nobody_of_higher_priority_waiting_the_slot_is_kept() {
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, at(1, Priority::NORMAL));

    // Nobody waiting.
    let permit = kept(permit);
    // Work of the same priority, or lower, from this tenant or another.
    let mut same = enqueue(&queue, at(2, Priority::NORMAL));
    let mut lower = enqueue(&queue, at(1, Priority::USER_LOW));
    let permit = kept(permit);

    assert_eq!(queue.granter_snapshot().used, 1);
    assert!(try_settle(&mut same).is_none());
    assert!(try_settle(&mut lower).is_none());
    // Keeping the slot is not an admission.
    assert_eq!(requested(&queue), 3);
    drop(permit);
    let mut waiting = vec![same, lower];
    while !waiting.is_empty() {
        let granted = waiting
            .iter_mut()
            .position(|admit| try_settle(admit).is_some_and(|permit| permit.is_ok()))
            .expect("one of them granted");
        // Its permit was dropped as it was seen: the next one is granted.
        drop(waiting.remove(granted));
    }
    assert_eq!(queue.granter_snapshot().used, 0);
    assert_eq!(queue.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn higher_priority_work_takes_the_slot_and_the_holder_resumes_in_its_own_order() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let bulk = admit_now(&queue, work(1, Priority::BULK_NORMAL.get(), t0, 0));
    // Bulk work that arrived after the holder, and then urgent work.
    let mut later_bulk = enqueue(&queue, work(1, Priority::BULK_NORMAL.get(), t0, 5));
    let mut urgent = enqueue(&queue, work(1, Priority::USER_HIGH.get(), t0, 10));

    let give_way = bulk.give_way();
    assert!(give_way.gave_way());
    // The slot is the urgent work's from the call on, before the future is
    // first polled.
    let urgent = try_settle(&mut urgent).expect("granted").unwrap();
    let mut resumed = task::spawn(give_way);
    assert!(resumed.poll().is_pending(), "the slot is the urgent work's");

    // When it completes the holder gets the slot again, ahead of the bulk
    // work that arrived after it: it is ordered by its own create time.
    drop(urgent);
    assert!(try_settle(&mut later_bulk).is_none());
    let Poll::Ready(Ok(again)) = resumed.poll() else {
        panic!("expected the holder to be granted again first");
    };
    assert_eq!(again.work().priority(), Priority::BULK_NORMAL);
    assert_eq!(again.work().create_time(), t0);
    // The holder's two admissions, the later bulk, the urgent work.
    assert_eq!(requested(&queue), 4);
    drop(again);
    drop(try_settle(&mut later_bulk).expect("granted").unwrap());
    assert_eq!(queue.granter_snapshot().used, 0);
}

/// The question is who the queue would grant next, tenant fairness
/// included: a higher priority behind a less-served tenant does not take
/// the slot.
#[tokio::test(start_paused = true)]
async fn the_waiter_the_queue_would_grant_next_decides() {
    let queue = WorkQueue::new(2).unwrap();
    // Tenant 3 has been served before; tenant 2 has not.
    let served = admit_now(&queue, at(3, Priority::NORMAL));
    let holder = admit_now(&queue, at(1, Priority::NORMAL));
    let mut less_served_low = enqueue(&queue, at(2, Priority::USER_LOW));
    let mut served_high = enqueue(&queue, at(3, Priority::USER_HIGH));

    let holder = kept(holder);
    assert!(try_settle(&mut less_served_low).is_none());
    assert!(try_settle(&mut served_high).is_none());

    // Once tenant 2's waiter is served, tenant 3's urgent work is next.
    drop(served);
    let low = try_settle(&mut less_served_low).expect("granted").unwrap();
    let give_way = holder.give_way();
    assert!(give_way.gave_way());
    let high = try_settle(&mut served_high).expect("granted").unwrap();
    drop((low, high, give_way));
    assert_eq!(queue.granter_snapshot().used, 0);
    assert_eq!(queue.waiting(), 0);
}

/// Counting slots held, were the slot returned its tenant would be
/// un-charged: a tenant's own later work can then come before another
/// tenant's higher priority, and the holder keeps the slot, as the release
/// would have given it to its own tenant anyway.
#[tokio::test(start_paused = true)]
async fn the_holders_own_tenant_is_counted_as_it_will_be_once_the_slot_is_back() {
    let queue = WorkQueue::builder()
        .total_slots(1)
        .usage(admission::Usage::Held)
        .build()
        .unwrap();
    let holder = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    // Both tenants at zero once the slot is back: the tie goes to tenant 1.
    let mut own_later = enqueue(&queue, at(1, Priority::BULK_NORMAL));
    let mut other_high = enqueue(&queue, at(2, Priority::HIGH));
    let holder = kept(holder);
    drop(holder);
    drop(try_settle(&mut own_later).expect("granted").unwrap());
    drop(try_settle(&mut other_high).expect("granted").unwrap());

    // Counting grants (the default), the tenant keeps its charge, and the
    // other tenant's urgent work is next.
    let queue = WorkQueue::builder()
        .total_slots(1)
        .usage(admission::Usage::Granted)
        .build()
        .unwrap();
    let holder = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let mut own_later = enqueue(&queue, at(1, Priority::BULK_NORMAL));
    let mut other_high = enqueue(&queue, at(2, Priority::HIGH));
    let give_way = holder.give_way();
    assert!(give_way.gave_way());
    drop(try_settle(&mut other_high).expect("granted").unwrap());
    drop(give_way);
    drop(try_settle(&mut own_later).expect("granted").unwrap());
    assert_eq!(queue.granter_snapshot().used, 0);
}

/// An elastic holder's own slot counts as free against the elastic share:
/// elastic work of a higher priority, held back only by the share this
/// holder uses, takes it.
#[tokio::test(start_paused = true)]
async fn an_elastic_holder_gives_way_to_higher_elastic_work_its_share_held_back() {
    let (queue, backfill) = sharing_with_bulk(Priority::BULK_LOW);
    let mut export = enqueue(&queue, at(1, Priority::BULK_NORMAL));
    assert!(
        try_settle(&mut export).is_none(),
        "held back by the share, with a slot free"
    );

    let give_way = backfill.give_way();
    assert!(give_way.gave_way());
    let export = try_settle(&mut export).expect("granted").unwrap();
    let mut resumed = task::spawn(give_way);
    assert!(resumed.poll().is_pending(), "the share is the export's now");
    drop(export);
    let Poll::Ready(Ok(backfill)) = resumed.poll() else {
        panic!("expected the backfill to be granted again");
    };
    drop(backfill);
    assert_eq!(queue.granter_snapshot().used, 0);
}

/// Elastic work that offers its slot is no longer kept to the elastic
/// share: it takes what regular work leaves and steps aside when regular
/// work comes.
#[tokio::test(start_paused = true)]
async fn elastic_work_that_gives_way_is_not_kept_to_the_elastic_share() {
    let (queue, first) = sharing_with_bulk(Priority::BULK_NORMAL);
    let mut second = enqueue(&queue, at(1, Priority::BULK_NORMAL));
    assert!(try_settle(&mut second).is_none(), "held back by the share");

    // The first bulk job offers its slot; nobody outranks it, it keeps it,
    // and the share it held goes to the second at once.
    let first = kept(first);
    let second = try_settle(&mut second).expect("granted").unwrap();
    assert_eq!(queue.granter_snapshot().used, 2);

    // Regular work arriving now waits for one chunk, not for the job.
    let mut user = enqueue(&queue, at(1, Priority::NORMAL));
    let give_way = first.give_way();
    assert!(give_way.gave_way());
    let user = try_settle(&mut user).expect("granted").unwrap();
    drop((user, second, give_way));
    assert_eq!(queue.granter_snapshot().used, 0);
    assert_eq!(queue.waiting(), 0);
}

/// Only the units still counted come off the share's count when work
/// completes: elastic work that has given way returning its slot leaves
/// the share to the elastic work that has not.
#[tokio::test(start_paused = true)]
async fn the_share_still_holds_back_elastic_work_that_never_gave_way() {
    let (queue, offering) = sharing_with_bulk(Priority::BULK_NORMAL);
    let mut holding = enqueue(&queue, at(1, Priority::BULK_NORMAL));
    let offering = kept(offering);
    let holding = try_settle(&mut holding).expect("granted").unwrap();

    drop(offering);
    let mut third = enqueue(&queue, at(1, Priority::BULK_NORMAL));
    assert!(
        try_settle(&mut third).is_none(),
        "the share is the holding work's, with a slot free"
    );
    drop(holding);
    drop(try_settle(&mut third).expect("granted").unwrap());
    assert_eq!(queue.granter_snapshot().used, 0);
}

/// The slot is handed over only if the waiter gets it at once: not to
/// a request for more slots than the holder has, nor while grant pacing
/// is full. Otherwise it would sit idle between the two, and the holder's
/// second admission could find the queue full.
#[tokio::test(start_paused = true)]
async fn the_slot_is_handed_over_only_if_the_waiter_gets_it_at_once() {
    let queue = WorkQueue::builder()
        .total_slots(2)
        .max_waiters(1)
        .build()
        .unwrap();
    let holder = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let other = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let two = WorkInfo::builder()
        .tenant(TenantId::new(2))
        .priority(Priority::HIGH)
        .requested(2)
        .build();
    let mut two = enqueue(&queue, two);
    let holder = kept(holder);
    assert!(try_settle(&mut two).is_none());
    drop((holder, other));
    drop(try_settle(&mut two).expect("granted").unwrap());

    // Bypass work beyond the total: the holder's slot back still leaves
    // none free (found by the conservation property test).
    let queue = WorkQueue::builder()
        .total_slots(1)
        .max_waiters(1)
        .build()
        .unwrap();
    let holder = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let probe = WorkInfo::builder()
        .tenant(TenantId::new(2))
        .priority(Priority::LOW)
        .bypass(true)
        .build();
    let probe = admit_now(&queue, probe);
    let mut urgent = enqueue(&queue, at(3, Priority::HIGH));
    let holder = kept(holder);
    drop(probe);
    assert!(try_settle(&mut urgent).is_none());
    drop(holder);
    drop(try_settle(&mut urgent).expect("granted").unwrap());

    // Pacing: one grant outstanding (made, not yet seen by its waiter)
    // holds the next back, so the holder keeps its slot meanwhile.
    let queue = WorkQueue::builder()
        .total_slots(2)
        .grant_burst(1)
        .build()
        .unwrap();
    let holder = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let finishing = admit_now(&queue, at(1, Priority::NORMAL));
    let mut first = enqueue(&queue, at(2, Priority::HIGH));
    let mut second = enqueue(&queue, at(3, Priority::HIGH));
    drop(finishing);
    let holder = kept(holder);
    let first = try_settle(&mut first).expect("granted").unwrap();
    let give_way = holder.give_way();
    assert!(give_way.gave_way(), "pacing has room again");
    let second = try_settle(&mut second).expect("granted").unwrap();
    drop((first, second, give_way));
    assert_eq!(queue.granter_snapshot().used, 0);
    assert_eq!(queue.waiting(), 0);
}

/// A waiter whose deadline has passed, not yet taken out of the queue by
/// its own timer, is not given the slot: the grant loop would pass it by
/// and hand the slot to whoever is next, here work below the holder's
/// priority.
#[tokio::test(start_paused = true)]
async fn the_slot_is_not_handed_to_a_waiter_whose_deadline_has_passed() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let holder = admit_now(&queue, at(1, Priority::NORMAL));
    let urgent = WorkInfo::builder()
        .tenant(TenantId::new(2))
        .priority(Priority::HIGH)
        .deadline(t0 + Duration::from_millis(10))
        .build();
    let mut urgent = enqueue(&queue, urgent);
    let mut low = enqueue(&queue, at(3, Priority::USER_LOW));
    // Past the deadline; the urgent request's future has not run since.
    tokio::time::advance(Duration::from_millis(11)).await;
    let holder = kept(holder);
    assert!(try_settle(&mut low).is_none());
    assert!(matches!(
        try_settle(&mut urgent),
        Some(Err(AdmitError::DeadlineExceeded { .. }))
    ));
    drop(holder);
    drop(try_settle(&mut low).expect("granted").unwrap());
    assert_eq!(queue.granter_snapshot().used, 0);
}

#[tokio::test(start_paused = true)]
async fn bypass_work_keeps_what_it_took() {
    let queue = WorkQueue::new(1).unwrap();
    let holder = admit_now(&queue, at(1, Priority::NORMAL));
    let probe = admit_now(
        &queue,
        WorkInfo::builder()
            .tenant(TenantId::new(1))
            .priority(Priority::LOW)
            .bypass(true)
            .build(),
    );
    let mut urgent = enqueue(&queue, at(2, Priority::HIGH));
    let probe = kept(probe);
    assert!(try_settle(&mut urgent).is_none());
    drop((probe, holder));
    drop(try_settle(&mut urgent).expect("granted").unwrap());
    assert_eq!(queue.granter_snapshot().used, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_at_any_point_loses_no_slot() {
    let queue = WorkQueue::new(1).unwrap();

    // Kept, never polled: the permit inside returns the slot.
    let permit = admit_now(&queue, at(1, Priority::NORMAL));
    drop(permit.give_way());
    assert_eq!(queue.granter_snapshot().used, 0);

    // Gave way, dropped while waiting to be granted again: it leaves the
    // queue, and the slot goes on to whoever is next.
    let permit = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let mut urgent = enqueue(&queue, at(2, Priority::USER_HIGH));
    let mut resumed = task::spawn(permit.give_way());
    assert!(resumed.poll().is_pending());
    let mut next = enqueue(&queue, at(3, Priority::NORMAL));
    assert_eq!(queue.waiting(), 2);
    drop(resumed);
    assert_eq!(queue.waiting(), 1);
    drop(try_settle(&mut urgent).expect("granted").unwrap());
    drop(try_settle(&mut next).expect("granted").unwrap());

    // Gave way, dropped without a poll while a grant was already made to
    // it: the grant is passed on.
    let permit = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let mut urgent = enqueue(&queue, at(2, Priority::USER_HIGH));
    let mut resumed = task::spawn(permit.give_way());
    assert!(resumed.poll().is_pending());
    let mut next = enqueue(&queue, at(3, Priority::BULK_NORMAL));
    drop(try_settle(&mut urgent).expect("granted").unwrap());
    drop(resumed);
    drop(try_settle(&mut next).expect("granted").unwrap());
    assert_eq!(queue.granter_snapshot().used, 0);
    assert_eq!(queue.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn asking_again_is_refused_for_the_works_deadline_like_any_request() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let report = WorkInfo::builder()
        .tenant(TenantId::new(1))
        .priority(Priority::NORMAL)
        .deadline(t0 + Duration::from_millis(10))
        .build();
    let permit = admit_now(&queue, report);
    let mut urgent = enqueue(&queue, at(2, Priority::HIGH));
    let mut resumed = task::spawn(permit.give_way());
    assert!(resumed.poll().is_pending());
    let urgent = try_settle(&mut urgent).expect("granted").unwrap();

    tokio::time::advance(Duration::from_millis(11)).await;
    let Poll::Ready(Err(AdmitError::DeadlineExceeded { .. })) = resumed.poll() else {
        panic!("expected the deadline's refusal");
    };
    drop(urgent);
    assert_eq!(queue.granter_snapshot().used, 0);
    assert_eq!(queue.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn on_a_closed_queue_the_permit_is_kept_and_stays_valid() {
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, at(1, Priority::BULK_NORMAL));
    let mut urgent = enqueue(&queue, at(2, Priority::HIGH));
    queue.close();
    assert!(matches!(
        try_settle(&mut urgent),
        Some(Err(AdmitError::Closed))
    ));
    let permit = kept(permit);
    assert_eq!(queue.granter_snapshot().used, 1);
    drop(permit);
    assert_eq!(queue.granter_snapshot().used, 0);
}

/// A loop of chunks, as the docs show it, on a real runtime: the urgent
/// request is served within one chunk of arriving, however long the bulk
/// job runs.
#[tokio::test(start_paused = true)]
async fn a_chunked_job_lets_urgent_work_in_between_its_chunks() {
    let queue = WorkQueue::new(1).unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let job = {
        let (queue, order) = (queue.clone(), order.clone());
        tokio::spawn(async move {
            let mut permit = queue.admit(at(1, Priority::BULK_NORMAL)).await?;
            for chunk in 0..4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                order.lock().unwrap().push(format!("bulk {chunk}"));
                permit = permit.give_way().await?;
            }
            drop(permit);
            Ok::<_, AdmitError>(())
        })
    };
    tokio::time::sleep(Duration::from_millis(7)).await;
    let urgent = {
        let (queue, order) = (queue.clone(), order.clone());
        tokio::spawn(async move {
            let _permit = queue.admit(at(2, Priority::USER_HIGH)).await?;
            order.lock().unwrap().push("urgent".to_string());
            Ok::<_, AdmitError>(())
        })
    };
    urgent.await.unwrap().unwrap();
    job.await.unwrap().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        ["bulk 0", "bulk 1", "urgent", "bulk 2", "bulk 3"]
    );
    assert_eq!(queue.granter_snapshot().used, 0);
}

/// A named type, so that it can be stored without boxing, and fused, so
/// that a `select!` loop can tell it is done.
#[tokio::test(start_paused = true)]
async fn the_future_can_be_stored_and_tells_when_it_is_done() {
    use futures::future::FusedFuture;

    struct Stored {
        future: admission::GiveWay,
    }
    let queue = WorkQueue::new(1).unwrap();
    for outranked in [false, true] {
        let permit = admit_now(&queue, at(1, Priority::BULK_NORMAL));
        let urgent = outranked.then(|| enqueue(&queue, at(2, Priority::HIGH)));
        let stored = Stored {
            future: permit.give_way(),
        };
        assert!(format!("{:?}", stored.future).contains(&format!("gave_way: {outranked}")));
        // The urgent work runs and completes, then the holder is back.
        if let Some(mut urgent) = urgent {
            drop(try_settle(&mut urgent).expect("granted").unwrap());
        }
        let mut future = std::pin::pin!(stored.future);
        assert!(!future.is_terminated());
        let again = future.as_mut().await.unwrap();
        assert!(future.is_terminated());
        drop(again);
        assert_eq!(queue.granter_snapshot().used, 0);
    }
}
