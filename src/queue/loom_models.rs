//! loom models of arrivals first: a slot a release keeps back for arrivals
//! the runtime has not yet shown the queue (`arrivals.rs`); and of a slot
//! given back while admitted work waits (`hold.rs`), whose probe can fire on
//! any thread, racing the end of the wait, a newcomer, a later poll and the
//! work's drop. Compiled only
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

/// Work that waits until [`Signal::fire`], whose waker it stores: the
/// end of a wait another thread decides (a database's answer).
#[derive(Clone, Debug, Default)]
pub struct Signal(crate::sync::Arc<crate::sync::Mutex<(bool, Option<Waker>)>>);

impl Signal {
    /// Ends the wait and wakes the waiting work.
    pub fn fire(&self) {
        let waker = {
            let mut state = self.0.lock();
            state.0 = true;
            state.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Future for Signal {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.0.lock();
        if state.0 {
            return Poll::Ready(());
        }
        state.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}

type Running = Pin<Box<crate::queue::Run<Signal>>>;

/// Work admitted on one slot and run, polled once: waiting on its signal,
/// with the probe of that poll.
fn waiting_run(queue: &WorkQueue) -> (Running, Signal, Waker) {
    let signal = Signal::default();
    let mut run = Box::pin(admitted_now(queue, 1).run(signal.clone()));
    let polled = run.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert!(polled.is_pending());
    let mut probes = run.deferred_probes();
    assert_eq!(probes.len(), 1, "one probe a poll that holds the slot");
    (run, signal, probes.remove(0))
}

/// Polls the run to completion; `false` if it must wait for a slot.
fn finish(run: &mut Running) -> bool {
    match run.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(())) => true,
        Poll::Ready(Err(error)) => panic!("refused: {error}"),
        Poll::Pending => false,
    }
}

/// The probe of a waiting run races the end of its wait, and another
/// request. The probe gives the slot back or finds the work runnable;
/// either way exactly one of the two holds the slot at a time, the run
/// completes once it is free, and every slot comes back.
pub fn a_probe_races_the_end_of_the_wait_and_a_newcomer() {
    model(|| {
        let queue = WorkQueue::new(1).expect("a valid queue");
        let (mut run, signal, probe) = waiting_run(&queue);
        let prober = loom::thread::spawn(move || probe.wake());
        let ender = loom::thread::spawn(move || signal.fire());
        let newcomer = {
            let queue = queue.clone();
            loom::thread::spawn(move || {
                let mut admit = Box::pin(queue.admit(work(2)));
                match poll_once(&mut admit) {
                    // The probe gave the slot back first: the newcomer
                    // computes on it and returns it.
                    Poll::Ready(Ok(permit)) => drop(permit),
                    Poll::Ready(Err(error)) => panic!("refused: {error}"),
                    // Still held: the newcomer leaves the queue.
                    Poll::Pending => drop(admit),
                }
            })
        };
        prober.join().unwrap();
        ender.join().unwrap();
        newcomer.join().unwrap();
        assert!(queue.snapshot().granter.used <= 1);
        assert!(finish(&mut run), "the slot is free: the run completes");
        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
        let normal = snapshot.priority(Priority::NORMAL).unwrap();
        assert_eq!(normal.requested, normal.admitted + normal.errored);
    });
}

/// A probe left from an earlier poll fires while the work is polled again
/// on another thread: it must not judge the new poll (whose own yield would
/// sit on another worker's list), so the slot stays with the work until
/// that poll's probe says it waits.
pub fn a_stale_probe_does_not_judge_a_later_poll() {
    model(|| {
        let queue = WorkQueue::new(1).expect("a valid queue");
        let (mut run, signal, stale) = waiting_run(&queue);
        // Woken (the wait's first part ended), and polled again by
        // another thread while the stale probe fires.
        let poller = loom::thread::spawn(move || {
            let polled = run.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending(), "the signal has not fired");
            run
        });
        let prober = loom::thread::spawn(move || stale.wake());
        let mut run = poller.join().unwrap();
        prober.join().unwrap();
        // The stale probe found the work either waiting from its own poll
        // and gave the slot back (the second poll then asked for it again,
        // and was granted it at once or when the probe's release came
        // after), or polled again since and did nothing: either way the
        // work's slot is its own again, once it has seen the grant.
        assert_eq!(queue.snapshot().granter.used, 1);
        let polled = run.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending(), "the signal has not fired");
        let current = run
            .deferred_probes()
            .pop()
            .expect("a poll that holds the slot defers a probe");
        assert_eq!(queue.snapshot().granter.used, 1);
        current.wake();
        assert_eq!(
            queue.snapshot().granter.used,
            0,
            "this poll's probe judges it"
        );
        signal.fire();
        assert!(finish(&mut run));
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}

/// The run is dropped on one thread while its probe fires on another: the
/// slot comes back exactly once, whichever goes first.
pub fn dropping_a_run_races_its_probe() {
    model(|| {
        let queue = WorkQueue::new(1).expect("a valid queue");
        let (run, _signal, probe) = waiting_run(&queue);
        let prober = loom::thread::spawn(move || probe.wake());
        let dropper = loom::thread::spawn(move || drop(run));
        prober.join().unwrap();
        dropper.join().unwrap();
        let snapshot = queue.snapshot();
        assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
        let permit = admitted_now(&queue, 2);
        assert_eq!(queue.snapshot().granter.used, 1);
        drop(permit);
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}

/// Whether any held work of `queue` is counted runnable.
fn anything_runnable(queue: &WorkQueue) -> bool {
    queue.shared.runnable.any_above(Priority::new(i8::MIN))
}

/// High-priority work admitted on one slot and run, polled once: waiting
/// on its signal.
fn waiting_high_run(queue: &WorkQueue) -> (Running, Signal) {
    let signal = Signal::default();
    let high = WorkInfo::new(TenantId::new(1), Priority::HIGH);
    let permit = match poll_once(&mut Box::pin(queue.admit(high))) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected the fast path, got {other:?}"),
    };
    let mut run = Box::pin(permit.run(signal.clone()));
    assert!(run
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    (run, signal)
}

/// Low-priority work on the fast path completes at its first poll: no
/// higher work is counted runnable, so it does not step aside.
fn low_work_runs_at_once(queue: &WorkQueue) {
    let low = WorkInfo::new(TenantId::new(2), Priority::BULK_LOW);
    let permit = match poll_once(&mut Box::pin(queue.admit(low))) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected the fast path, got {other:?}"),
    };
    let mut run = Box::pin(permit.run(std::future::ready(())));
    let polled = run.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert!(
        matches!(polled, Poll::Ready(Ok(()))),
        "nothing held it back"
    );
}

/// The end of a high-priority run's wait (which counts it runnable) races
/// the run's drop (which takes it off the count): whichever goes first,
/// nothing stays counted, and lower work is not held back by work that is
/// gone.
pub fn a_wake_racing_the_drop_of_a_run_leaves_nothing_runnable() {
    model(|| {
        let queue = WorkQueue::new(2).expect("a valid queue");
        let (run, signal) = waiting_high_run(&queue);
        let ender = loom::thread::spawn(move || signal.fire());
        let dropper = loom::thread::spawn(move || drop(run));
        ender.join().unwrap();
        dropper.join().unwrap();
        assert!(!anything_runnable(&queue));
        low_work_runs_at_once(&queue);
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}

/// The end of the wait races the next poll of the run on another thread:
/// the poll either completes the work or leaves it waiting; once it has
/// completed, nothing is counted runnable.
pub fn a_wake_racing_a_poll_of_the_run_counts_it_once() {
    model(|| {
        let queue = WorkQueue::new(2).expect("a valid queue");
        let (mut run, signal) = waiting_high_run(&queue);
        let ender = loom::thread::spawn(move || signal.fire());
        let poller = loom::thread::spawn(move || {
            let done = finish(&mut run);
            (run, done)
        });
        ender.join().unwrap();
        let (mut run, done) = poller.join().unwrap();
        if !done {
            assert!(anything_runnable(&queue), "woken after the poll: runnable");
            assert!(finish(&mut run), "the signal has fired");
        }
        assert!(!anything_runnable(&queue));
        low_work_runs_at_once(&queue);
        assert_eq!(queue.snapshot().granter.used, 0);
    });
}
