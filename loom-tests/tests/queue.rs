//! loom models of the WorkQueue's races.
//!
//! Each model explores every interleaving (within the preemption bound set
//! by `LOOM_MAX_PREEMPTIONS`, 3 in CI) of a few threads racing on one queue,
//! and then checks that the slot accounting is exact: no slot lost, none
//! granted twice, no waiter left asleep with capacity free. Futures are
//! polled by hand with a no-op waker, or driven by `loom::future::block_on`
//! where a lost wake-up must show up as a deadlock.

#![cfg(loom)]

use std::task::Poll;

use admission::queue_loom_models::{self as loom_models, admitted_now, poll_once, queued, work};
use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use loom::thread;
use loom_tests::model;

/// A slot released by one thread races the cancellation of the waiter it
/// would be granted to. Whatever the order, the slot ends up with the next
/// waiter exactly once, or back in the granter.
#[test]
fn grant_races_cancel_without_losing_or_doubling_the_slot() {
    model(|| {
        let queue = WorkQueue::new(1).unwrap();
        let held = admitted_now(&queue, 1);
        let racing = queued(&queue, 2);
        let mut behind = queued(&queue, 3);

        let releaser = thread::spawn(move || drop(held));
        let canceller = thread::spawn(move || drop(racing));
        releaser.join().unwrap();
        canceller.join().unwrap();

        // Exactly one slot is in use: the one `behind` was granted.
        assert_eq!(queue.snapshot().granter.used, 1);
        assert_eq!(queue.waiting(), 0);
        let permit = match poll_once(&mut behind) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("the slot did not reach the next waiter: {other:?}"),
        };
        drop(permit);
        let snapshot = queue.snapshot();
        assert_eq!(snapshot.granter.used, 0);
        let normal = snapshot.priority(Priority::NORMAL).unwrap();
        assert_eq!(
            (normal.requested, normal.admitted, normal.errored),
            (3, 2, 1)
        );
    });
}

/// A request that finds the slot taken races the release of that slot. The
/// request must be admitted in every interleaving: if the release happened
/// between its failed fast path and its enqueue and nobody granted it, the
/// blocked thread would never wake and loom would report a deadlock.
#[test]
fn release_races_admit_without_a_lost_wake_up() {
    model(|| {
        let queue = WorkQueue::new(1).unwrap();
        let held = admitted_now(&queue, 1);

        let admitter = {
            let queue = queue.clone();
            thread::spawn(move || {
                let permit = loom::future::block_on(queue.admit(work(2))).unwrap();
                drop(permit);
            })
        };
        let releaser = thread::spawn(move || drop(held));
        admitter.join().unwrap();
        releaser.join().unwrap();

        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
    });
}

/// The total drops while a release is granting the freed slot. A granted
/// slot is never revoked, and no grant ever takes `used` above the total in
/// force when it was made: with the total lowered to 1 and one slot still
/// held, the waiter may only get in if the release saw the old total.
#[test]
fn total_decrease_races_granting() {
    model(|| {
        let queue = WorkQueue::new(2).unwrap();
        let first = admitted_now(&queue, 1);
        let second = admitted_now(&queue, 1);
        let mut waiter = queued(&queue, 2);

        let shrinker = {
            let queue = queue.clone();
            thread::spawn(move || queue.set_total_slots(1).unwrap())
        };
        let releaser = thread::spawn(move || drop(first));
        shrinker.join().unwrap();
        releaser.join().unwrap();

        let snapshot = queue.snapshot();
        assert_eq!(snapshot.granter.total, 1);
        // `second` plus possibly the waiter; never more.
        assert!(snapshot.granter.used <= 2);
        let early = poll_once(&mut waiter);
        assert_eq!(snapshot.granter.used == 2, early.is_ready());

        drop(second);
        let permit = match early {
            Poll::Ready(result) => result.unwrap(),
            Poll::Pending => match poll_once(&mut waiter) {
                Poll::Ready(result) => result.unwrap(),
                Poll::Pending => panic!("the waiter was not granted the freed slot"),
            },
        };
        assert_eq!(queue.snapshot().granter.used, 1);
        drop(permit);
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}

/// Closing the queue races a release that would grant the only waiter. The
/// waiter either gets the slot or fails with `Closed`; either way every slot
/// comes back.
#[test]
fn close_races_a_grant() {
    model(|| {
        let queue = WorkQueue::new(1).unwrap();
        let held = admitted_now(&queue, 1);
        let mut waiter = queued(&queue, 2);

        let closer = {
            let queue = queue.clone();
            thread::spawn(move || queue.close())
        };
        let releaser = thread::spawn(move || drop(held));
        closer.join().unwrap();
        releaser.join().unwrap();

        match poll_once(&mut waiter) {
            Poll::Ready(Ok(permit)) => drop(permit),
            Poll::Ready(Err(error)) => assert_eq!(error, AdmitError::Closed),
            Poll::Pending => panic!("a closed queue left a waiter pending"),
        }
        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
    });
}

/// Three threads at once: the holder releases, the waiter the slot would go
/// to is cancelled, and a newcomer blocks on admission. The newcomer must
/// get in (a lost slot or wake-up would deadlock it) and everything must be
/// back at the end.
#[test]
fn release_cancel_and_a_newcomer_all_race() {
    model(|| {
        let queue = WorkQueue::new(1).unwrap();
        let held = admitted_now(&queue, 1);
        let racing = queued(&queue, 2);

        let releaser = thread::spawn(move || drop(held));
        let canceller = thread::spawn(move || drop(racing));
        let newcomer = {
            let queue = queue.clone();
            thread::spawn(move || {
                let permit = loom::future::block_on(queue.admit(work(3))).unwrap();
                assert_eq!(permit.work().tenant(), TenantId::new(3));
            })
        };
        releaser.join().unwrap();
        canceller.join().unwrap();
        newcomer.join().unwrap();

        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
        let normal = snapshot.priority(Priority::NORMAL).unwrap();
        assert_eq!(
            (normal.requested, normal.admitted, normal.errored),
            (3, 2, 1)
        );
    });
}

/// Work that gave its slot back for a wait asks for it again while another
/// request asks for the same slot (`SlotPermit::release_during`: a release,
/// then an ordinary admission). Both are admitted, one after the other, in
/// every interleaving: a lost wake-up would leave a blocked thread and loom
/// would report a deadlock. At the end the slot is back and each admission
/// was counted once.
#[test]
fn a_released_permit_asking_again_races_a_newcomer() {
    model(|| {
        let queue = WorkQueue::new(1).unwrap();
        let held = admitted_now(&queue, 1);

        let returning = thread::spawn(move || {
            let ((), again) = loom::future::block_on(held.release_during(std::future::ready(())));
            drop(again.unwrap());
        });
        let newcomer = {
            let queue = queue.clone();
            thread::spawn(move || {
                let permit = loom::future::block_on(queue.admit(work(2))).unwrap();
                drop(permit);
            })
        };
        returning.join().unwrap();
        newcomer.join().unwrap();

        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
        let normal = snapshot.priority(Priority::NORMAL).unwrap();
        assert_eq!((normal.requested, normal.admitted), (3, 3));
    });
}

/// Bulk work offers its slot (`SlotPermit::give_way`) while regular work
/// arrives for it. Whichever comes first, the regular work is admitted and
/// the bulk work ends up holding the slot again (kept, or granted after the
/// regular work completes); a lost wake-up would be a deadlock. At the end
/// nothing is held, and the elastic share's count is back to zero: a new
/// bulk request, with regular work about, is admitted at once.
#[test]
fn a_permit_giving_way_races_higher_priority_work() {
    model(|| {
        let queue = WorkQueue::builder()
            .total_slots(1)
            .elastic_share(0.5)
            .build()
            .unwrap();
        let bulk = |tenant| WorkInfo::new(TenantId::new(tenant), Priority::BULK_NORMAL);
        let held = match poll_once(&mut Box::pin(queue.admit(bulk(1)))) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("expected the fast path, got {other:?}"),
        };

        let giving_way = thread::spawn(move || {
            let again = loom::future::block_on(held.give_way()).unwrap();
            drop(again);
        });
        let regular = {
            let queue = queue.clone();
            thread::spawn(move || {
                let permit = loom::future::block_on(queue.admit(work(2))).unwrap();
                drop(permit);
            })
        };
        giving_way.join().unwrap();
        regular.join().unwrap();

        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
        let again = poll_once(&mut Box::pin(queue.admit(bulk(3))));
        assert!(matches!(again, Poll::Ready(Ok(_))), "{again:?}");
    });
}

// Arrivals first: the models live in the crate (`src/queue/loom_models.rs`),
// where they can say that arrivals always wait in the runtime.

#[test]
fn a_refused_arrival_gives_out_a_slot_a_racing_release_kept() {
    loom_models::a_refused_arrival_gives_out_a_slot_a_racing_release_kept();
}

#[test]
fn a_cancel_racing_a_keeping_release_loses_no_slot() {
    loom_models::a_cancel_racing_a_keeping_release_loses_no_slot();
}

#[test]
fn a_kept_slot_with_nobody_left_waiting_is_free() {
    loom_models::a_kept_slot_with_nobody_left_waiting_is_free();
}

#[test]
fn two_racing_releases_keep_one_slot_at_most() {
    loom_models::two_racing_releases_keep_one_slot_at_most();
}

#[test]
fn a_probe_races_the_end_of_the_wait_and_a_newcomer() {
    loom_models::a_probe_races_the_end_of_the_wait_and_a_newcomer();
}

#[test]
fn a_stale_probe_does_not_judge_a_later_poll() {
    loom_models::a_stale_probe_does_not_judge_a_later_poll();
}

#[test]
fn dropping_a_run_races_its_probe() {
    loom_models::dropping_a_run_races_its_probe();
}

#[test]
fn a_wake_racing_the_drop_of_a_run_leaves_nothing_runnable() {
    loom_models::a_wake_racing_the_drop_of_a_run_leaves_nothing_runnable();
}

#[test]
fn a_wake_racing_a_poll_of_the_run_counts_it_once() {
    loom_models::a_wake_racing_a_poll_of_the_run_counts_it_once();
}

/// The books a queue keeps of `tenant`'s usage, and of its normal-priority
/// requests and admissions.
fn books(queue: &WorkQueue, tenant: u64) -> (u64, u64, u64) {
    let snapshot = queue.snapshot();
    let used = snapshot
        .tenant(TenantId::new(tenant))
        .map_or(0, |record| record.used);
    let normal = snapshot.priority(Priority::NORMAL).unwrap();
    (used, normal.requested, normal.admitted)
}

/// A one-slot queue whose lane is open for tenant 1: its last admission,
/// under the lock with nobody waiting, opened it, and its release went on
/// the lane.
fn one_slot_with_the_lane_open() -> WorkQueue {
    let queue = WorkQueue::new(1).unwrap();
    drop(admitted_now(&queue, 1));
    queue
}

/// `f` on a thread of its own, with a handle on `queue`.
fn on_a_thread(
    queue: &WorkQueue,
    f: impl FnOnce(WorkQueue) + Send + 'static,
) -> thread::JoinHandle<()> {
    let queue = queue.clone();
    thread::spawn(move || f(queue))
}

/// The lane is open for tenant 1 (its last admission opened it), and a
/// request of tenant 1, which takes the lane, races one of tenant 2, which
/// takes the lock and closes the lane, for the queue's one slot. Both are
/// admitted in every interleaving (a request left asleep with the slot
/// free would be a deadlock): the one that finds the slot taken waits, and
/// the release, on the lane or under the lock, reaches it. The books hold
/// every admission once, however the lane's counts were folded in.
#[test]
fn a_lane_admission_races_a_request_that_takes_the_lock() {
    model(|| {
        let queue = one_slot_with_the_lane_open();

        let on_lane = on_a_thread(&queue, |queue| {
            drop(loom::future::block_on(queue.admit(work(1))).unwrap())
        });
        let locking = on_a_thread(&queue, |queue| {
            drop(loom::future::block_on(queue.admit(work(2))).unwrap())
        });
        on_lane.join().unwrap();
        locking.join().unwrap();

        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
        assert_eq!(books(&queue, 1), (2, 3, 3));
        assert_eq!(books(&queue, 2).0, 1);
    });
}

/// A permit admitted on the lane is released while another thread takes a
/// snapshot, which closes the lane and folds its counts: the snapshot sees
/// both admissions and the slot either held or back, and the release,
/// counted on the lane or booked under the lock, is booked once.
#[test]
fn a_lane_release_races_a_snapshot() {
    model(|| {
        let queue = WorkQueue::new(2).unwrap();
        let opened = admitted_now(&queue, 1);
        let on_lane = admitted_now(&queue, 1);

        let releaser = thread::spawn(move || drop(on_lane));
        let reader = on_a_thread(&queue, |queue| {
            let snapshot = queue.snapshot();
            assert!(matches!(snapshot.granter.used, 1 | 2));
            let normal = snapshot.priority(Priority::NORMAL).unwrap();
            assert_eq!((normal.requested, normal.admitted), (2, 2));
        });
        releaser.join().unwrap();
        reader.join().unwrap();

        assert_eq!(queue.snapshot().granter.used, 1);
        drop(opened);
        assert_eq!(queue.snapshot().granter.used, 0);
        assert_eq!(books(&queue, 1), (2, 2, 2));
        // The books are whole: the next request still takes the fast way.
        drop(admitted_now(&queue, 1));
        assert_eq!(books(&queue, 1), (3, 3, 3));
    });
}

/// The queue closes while a request takes the lane: it is admitted (the
/// lane was open when it counted itself) or refused as closed, never
/// admitted after the close has settled; its slot comes back either way.
#[test]
fn a_lane_admission_races_close() {
    model(|| {
        let queue = one_slot_with_the_lane_open();

        let admitter = on_a_thread(&queue, |queue| {
            let mut admit = Box::pin(queue.admit(work(1)));
            match poll_once(&mut admit) {
                Poll::Ready(Ok(permit)) => drop(permit),
                Poll::Ready(Err(AdmitError::Closed)) => {}
                other => panic!("admitted or refused as closed, not {other:?}"),
            }
        });
        let closer = on_a_thread(&queue, |queue| queue.close());
        admitter.join().unwrap();
        closer.join().unwrap();

        assert_eq!(queue.snapshot().granter.used, 0);
        let mut late = Box::pin(queue.admit(work(1)));
        assert!(matches!(
            poll_once(&mut late),
            Poll::Ready(Err(AdmitError::Closed))
        ));
    });
}
