//! loom models of the CPU pool's hand-off, compiled only with
//! `RUSTFLAGS="--cfg loom"` and run by `loom-tests/tests/pool.rs` (in the
//! crate, like the GPU models, because the `Handoff` is crate-private).
//!
//! The `Handoff` is the one piece of state the pool adds to admission: the
//! caller's poll and the wake-up a grant makes both reach for the job, and
//! a wake-up never blocks on the lock (it leaves a flag for the holder).
//! Each model races a returned slot, whose grant wakes the `Handoff`,
//! against the caller polling or dropping its task, and checks that the
//! job is handed over exactly once or not at all, that no wake-up is lost,
//! and that every slot comes back.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use super::handoff::{Dispatcher, Handoff};
use super::worker::{Job, Ran, Task};
use crate::sync::{loom_model as model, AtomicU64, Mutex, Ordering, StdArc};
use crate::{Admit, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};

/// A closure that does nothing and whose caller is always there.
struct Noop;

impl Task for Noop {
    fn abandoned(&self) -> bool {
        false
    }

    fn run(self: Box<Self>, settle: &mut dyn FnMut(Ran)) {
        settle(Ran::Completed);
    }
}

/// A dispatcher that keeps what it is handed.
#[derive(Default)]
struct Record {
    jobs: Mutex<Vec<Job>>,
}

impl Dispatcher for Record {
    fn dispatch(self: &StdArc<Self>, job: Job, _bypass: bool) {
        self.jobs.lock().push(job);
    }
}

/// The caller's waker: counts its wake-ups.
#[derive(Default)]
struct Caller {
    woken: AtomicU64,
}

impl Wake for Caller {
    fn wake(self: StdArc<Self>) {
        self.woken.fetch_add(1, Ordering::SeqCst);
    }
}

fn work() -> WorkInfo {
    WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)
}

/// A queue of one slot, held, and a `Handoff` queued behind it (polled once
/// by its caller), dispatching to a [`Record`].
#[allow(clippy::type_complexity)]
fn queued_behind_a_held_slot(
    collect: bool,
) -> (
    WorkQueue,
    SlotPermit,
    StdArc<Handoff<Record>>,
    StdArc<Record>,
    StdArc<Caller>,
) {
    let queue = WorkQueue::new(1).expect("a valid total");
    let mut first: Pin<Box<Admit>> = Box::pin(queue.admit(work()));
    let held = match first.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(permit)) => permit,
        _ => panic!("a free slot admits at once"),
    };
    let record = StdArc::new(Record::default());
    let handoff = Handoff::new(
        queue.admit(work()),
        Box::new(Noop),
        record.clone(),
        false,
        collect,
    );
    let caller = StdArc::new(Caller::default());
    assert!(poll(&handoff, &caller).is_pending(), "the slot is held");
    (queue, held, handoff, record, caller)
}

fn poll(handoff: &StdArc<Handoff<Record>>, caller: &StdArc<Caller>) -> Poll<()> {
    let waker = Waker::from(caller.clone());
    handoff
        .poll_admission(&mut Context::from_waker(&waker))
        .map(|admitted| admitted.expect("admitted"))
}

/// Collecting: the slot comes back on one thread (its grant wakes the
/// `Handoff`, which collects and dispatches the job) while the caller
/// polls on another. The job is dispatched exactly once, whoever got to it,
/// and the caller's next poll says so.
pub fn a_grant_collected_by_the_returning_thread_is_dispatched_once() {
    model(|| {
        let (queue, held, handoff, record, caller) = queued_behind_a_held_slot(true);
        let returning = loom::thread::spawn(move || drop(held));
        let polled = poll(&handoff, &caller);
        returning.join().expect("the returning thread");
        if polled.is_pending() {
            // Not seen by that poll: the returning thread collected it, or
            // at least woke the caller to look (a wake-up that found the
            // lock held by the poll is handled when the poll lets go).
            assert!(
                record.jobs.lock().len() == 1 || caller.woken.load(Ordering::SeqCst) >= 1,
                "granted, yet neither dispatched nor the caller woken"
            );
            assert!(poll(&handoff, &caller).is_ready(), "the job was lost");
        }
        let jobs = std::mem::take(&mut *record.jobs.lock());
        assert_eq!(jobs.len(), 1, "dispatched once");
        assert_eq!(queue.snapshot().granter.used, 1, "the job holds the slot");
        drop(jobs);
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}

/// Not collecting: a grant racing the caller's poll either is seen by
/// that poll or wakes the caller (even when the grant's wake-up found the
/// lock held by the poll): never neither, which would strand the slot.
pub fn a_grant_racing_the_callers_poll_is_seen_or_wakes_the_caller() {
    model(|| {
        let (queue, held, handoff, record, caller) = queued_behind_a_held_slot(false);
        let returning = loom::thread::spawn(move || drop(held));
        let polled = poll(&handoff, &caller);
        returning.join().expect("the returning thread");
        if polled.is_pending() {
            assert!(
                caller.woken.load(Ordering::SeqCst) >= 1,
                "granted, yet the caller was never woken"
            );
            assert!(poll(&handoff, &caller).is_ready());
        }
        assert_eq!(record.jobs.lock().len(), 1);
        record.jobs.lock().clear();
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}

/// Collecting: the caller drops its task while the returning slot's grant
/// wakes the `Handoff`. The job is dispatched (and then skipped by the
/// thread, its caller gone) or never is; either way the slot comes back
/// and nothing is left waiting.
pub fn a_caller_dropping_its_task_racing_the_grant_loses_no_slot() {
    model(|| {
        let (queue, held, handoff, record, _caller) = queued_behind_a_held_slot(true);
        let returning = loom::thread::spawn(move || drop(held));
        handoff.abandon();
        returning.join().expect("the returning thread");
        assert!(record.jobs.lock().len() <= 1);
        record.jobs.lock().clear();
        let snapshot = queue.snapshot();
        assert_eq!(snapshot.granter.used, 0, "a slot was lost");
        assert_eq!(snapshot.waiting, 0);
    });
}
