//! loom models of arrivals first: a slot a release keeps back for arrivals
//! the runtime has not yet shown the queue (`arrivals.rs`). Compiled only
//! with `RUSTFLAGS="--cfg loom"` and run by `loom-tests/tests/queue.rs`; in
//! the crate because the check that decides whether arrivals wait is
//! crate-private, and here it always says they do, so every release that
//! can keep its slot does.
//!
//! A kept slot is the one exception to the queue's invariant that capacity
//! is never free while requests wait. Each model races a keeping release
//! against another path through the queue, then checks that no slot is
//! lost or granted twice, that at most one is kept, and that the next
//! request to ask gives a kept slot out whatever it is answered, without
//! the tick that is the last resort.
//!
//! Its helpers (`work`, `poll_once`, `admitted_now`, `queued`) serve
//! `loom-tests/tests/queue.rs`'s own models too.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::loom_model as model;
use crate::{Admit, AdmitError, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};

/// Polls `admit` once with a waker that does nothing.
pub fn poll_once(admit: &mut Pin<Box<Admit>>) -> Poll<Result<SlotPermit, AdmitError>> {
    admit.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Normal-priority work of `tenant`.
pub fn work(tenant: u64) -> WorkInfo {
    WorkInfo::new(TenantId::new(tenant), Priority::NORMAL)
}

/// A queue of `total` slots whose releases keep a slot for arrivals
/// whenever the queue's rules allow.
fn keeping_queue(total: u64) -> WorkQueue {
    WorkQueue::builder()
        .total_slots(total)
        .arrivals_waiting_by(|| true)
        .build()
        .expect("a valid queue")
}

/// A permit taken on the fast path; panics if the request would wait.
pub fn admitted_now(queue: &WorkQueue, tenant: u64) -> SlotPermit {
    match poll_once(&mut Box::pin(queue.admit(work(tenant)))) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected the fast path, got {other:?}"),
    }
}

/// A request polled once and left waiting in the queue.
pub fn queued(queue: &WorkQueue, tenant: u64) -> Pin<Box<Admit>> {
    let mut admit = Box::pin(queue.admit(work(tenant)));
    assert!(poll_once(&mut admit).is_pending());
    admit
}

/// Asks for more than the queue could ever grant: refused at the door,
/// whatever the queue holds.
fn refused_at_the_door(queue: &WorkQueue) {
    let never_fits = WorkInfo::builder().requested(u64::MAX).build();
    match poll_once(&mut Box::pin(queue.admit(never_fits))) {
        Poll::Ready(Err(AdmitError::NeverFits { .. })) => {}
        other => panic!("expected a refusal at the door, got {other:?}"),
    }
}

fn granted(admit: &mut Pin<Box<Admit>>) -> SlotPermit {
    match poll_once(admit) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("the slot did not reach the waiter: {other:?}"),
    }
}

/// (used, waiting, slots kept for arrivals so far).
fn state(queue: &WorkQueue) -> (u64, usize, u64) {
    let snapshot = queue.snapshot();
    (
        snapshot.granter.used,
        snapshot.waiting,
        snapshot.kept_for_arrivals,
    )
}

/// A release that keeps its slot races an arrival refused at the door.
/// The refusal gives the slot to the waiter if it came after the release;
/// if it came before, the slot is still kept, and the next request to ask,
/// refused too, gives it out.
pub fn a_refused_arrival_gives_out_a_slot_a_racing_release_kept() {
    model(|| {
        let queue = keeping_queue(1);
        let held = admitted_now(&queue, 1);
        let mut waiter = queued(&queue, 2);

        let releaser = loom::thread::spawn(move || drop(held));
        let arrival = {
            let queue = queue.clone();
            loom::thread::spawn(move || refused_at_the_door(&queue))
        };
        releaser.join().unwrap();
        arrival.join().unwrap();

        let after_race = state(&queue);
        assert!(
            after_race == (1, 0, 1) || after_race == (0, 1, 1),
            "granted to the waiter, or kept for the next to ask: {after_race:?}"
        );
        refused_at_the_door(&queue);
        assert_eq!(state(&queue), (1, 0, 1));
        drop(granted(&mut waiter));
        assert_eq!(state(&queue), (0, 0, 1));
    });
}

/// A release that keeps its slot races the cancellation of the first
/// waiter. Whatever the order, the slot is never lost: the next request to
/// ask gives it to the waiter behind.
pub fn a_cancel_racing_a_keeping_release_loses_no_slot() {
    model(|| {
        let queue = keeping_queue(1);
        let held = admitted_now(&queue, 1);
        let cancelled = queued(&queue, 2);
        let mut behind = queued(&queue, 3);

        let releaser = loom::thread::spawn(move || drop(held));
        let canceller = loom::thread::spawn(move || drop(cancelled));
        releaser.join().unwrap();
        canceller.join().unwrap();

        assert_eq!(state(&queue), (0, 1, 1));
        refused_at_the_door(&queue);
        assert_eq!(state(&queue), (1, 0, 1));
        drop(granted(&mut behind));
        assert_eq!(state(&queue), (0, 0, 1));
    });
}

/// The last waiter leaves while a racing release keeps its slot (or
/// before it, and then nothing is kept): the slot is free either way, and
/// the next request takes it on the fast path.
pub fn a_kept_slot_with_nobody_left_waiting_is_free() {
    model(|| {
        let queue = keeping_queue(1);
        let held = admitted_now(&queue, 1);
        let leaving = queued(&queue, 2);

        let releaser = loom::thread::spawn(move || drop(held));
        let canceller = loom::thread::spawn(move || drop(leaving));
        releaser.join().unwrap();
        canceller.join().unwrap();

        let (used, waiting, kept) = state(&queue);
        assert_eq!((used, waiting), (0, 0));
        assert!(kept <= 1, "{kept} kept");
        let permit = admitted_now(&queue, 3);
        assert_eq!(state(&queue).0, 1);
        drop(permit);
        assert_eq!(state(&queue).0, 0);
    });
}

/// Two releases race with two requests waiting: one slot at a time is
/// kept, so whichever release comes second runs the grant loop, which
/// gives out its own slot and the kept one.
pub fn two_racing_releases_keep_one_slot_at_most() {
    model(|| {
        let queue = keeping_queue(2);
        let first = admitted_now(&queue, 1);
        let second = admitted_now(&queue, 1);
        let mut waiters = [queued(&queue, 2), queued(&queue, 3)];

        let one = loom::thread::spawn(move || drop(first));
        let other = loom::thread::spawn(move || drop(second));
        one.join().unwrap();
        other.join().unwrap();

        assert_eq!(state(&queue), (2, 0, 1));
        for waiter in &mut waiters {
            drop(granted(waiter));
        }
        assert_eq!(state(&queue), (0, 0, 1));
    });
}
