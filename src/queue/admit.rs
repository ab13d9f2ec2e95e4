//! The `Admit` future: one request's passage through the queue.
//!
//! # Implementation notes
//!
//! The future is lazy: nothing is decided until its first poll, which takes
//! the queue's lock once and either settles the request (bypass, fast path,
//! rejection) or enqueues it and remembers the slab key. Later polls look at
//! the waiter's state under the lock: a grant made by another thread has
//! already moved the slot to this waiter, so observing it is just taking the
//! slab entry out and wrapping the slot in a permit.
//!
//! Cancel safety lives in `Drop`: a future dropped while it holds a slab key
//! (queued, or granted but not yet observed) calls `QueueState::cancel`,
//! which unlinks a waiting request or passes an unobserved grant to the next
//! waiter. A future that completed holds no key, and its permit owns the slot.
//!
//! The deadline timer is a `tokio::time::Sleep` created only when a request
//! with a deadline has to wait, so the fast path and deadline-free requests
//! never touch tokio's timer (and the loom models, which have no runtime,
//! never create one). It is boxed, as is the wait's tracing span (and only
//! when a subscriber takes it): the future stays about a hundred bytes, which
//! every caller moves into its own state.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_core::FusedFuture;
use pin_project::{pin_project, pinned_drop};
use tokio::time::{Instant, Sleep};

use super::lane::LaneAdmit;
use super::permit::SlotPermit;
use super::state::{Attempt, Charge, Observed};
use super::Shared;
use crate::error::AdmitError;
use crate::export;
use crate::grant::{Granter, SlotGranter};
use crate::sync::Arc;
use crate::work::WorkInfo;

/// The future returned by [`WorkQueue::admit`](crate::WorkQueue::admit).
///
/// A named type, so it can be stored in a struct (a tower response future,
/// say) without boxing. Resolves to a [`SlotPermit`] or an [`AdmitError`].
/// Cancel-safe: dropping it at any point, before or after it was granted,
/// loses no capacity.
///
/// Like any future it must not be polled again once it has completed (doing
/// so panics); it implements [`FusedFuture`] so that `select!` loops can tell.
#[pin_project(PinnedDrop, project = AdmitProjection)]
#[must_use = "futures do nothing unless polled"]
pub struct Admit<G: Granter = SlotGranter> {
    /// Moves into the permit on success; `None` once complete.
    shared: Option<Arc<Shared<G>>>,
    /// Beside the phase rather than in it, so that moving between phases
    /// copies a key and a time, not the request.
    work: WorkInfo,
    phase: Phase,
    /// The wait's span, once queued and only if a subscriber takes it:
    /// beside the phase, which then has nothing to drop when it changes,
    /// and boxed, so that a future that never waits (or waits with nobody
    /// listening) carries one empty word.
    span: Option<Box<tracing::Span>>,
    /// Work in progress asking for its slots again after a wait (see
    /// `hold.rs`): ahead of new work of its priority, exempt from a full
    /// queue and early rejection.
    resumed: bool,
    /// Boxed: a timer is most of a future's size, and every admission's
    /// future is moved at least once (into the caller's), while only a
    /// request with a deadline that waits needs one.
    timer: Option<Pin<Box<Sleep>>>,
}

#[derive(Clone, Copy)]
enum Phase {
    Start,
    Queued {
        key: usize,
        /// When it was queued: the span's `wait_us` on every outcome.
        since: Instant,
    },
    Done,
}

impl<G: Granter> Admit<G> {
    pub(super) fn new(shared: Arc<Shared<G>>, work: WorkInfo) -> Self {
        Admit {
            shared: Some(shared),
            work,
            phase: Phase::Start,
            span: None,
            resumed: false,
            timer: None,
        }
    }

    /// The admission of work that held its slots, gave them back for a
    /// wait, and asks for them again.
    pub(super) fn resume(shared: Arc<Shared<G>>, work: WorkInfo) -> Self {
        Admit {
            shared: Some(shared),
            work,
            phase: Phase::Start,
            span: None,
            resumed: true,
            timer: None,
        }
    }
}

impl<G: Granter> Future for Admit<G> {
    type Output = Result<SlotPermit<G>, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(shared) = this.shared.as_ref() else {
            panic!("`Admit` polled after it completed");
        };
        if matches!(*this.phase, Phase::Start) {
            // Admission that is always ready on the fast path must still
            // give the scheduler a turn now and then, as tokio's own
            // semaphore does.
            let coop = ready!(tokio::task::coop::poll_proceed(cx));
            *this.phase = Phase::Done;
            let work = &*this.work;
            let resumed = *this.resumed;
            let lane = if resumed {
                LaneAdmit::Declined
            } else {
                shared.try_lane(work)
            };
            let attempt = match lane {
                LaneAdmit::Admitted(generation) => Attempt::Admitted {
                    charge: Charge::on_lane(work.priority(), work.deadline(), generation),
                },
                lane => shared.with_state(|queue, grants, wakes| {
                    if lane == LaneAdmit::HoldsSlot {
                        // Taken as the lane closed, and not booked: back, to
                        // whoever waits first now, and ask in order.
                        grants.return_grant(1);
                        queue.grant_waiting(grants, wakes);
                    }
                    let mut attempt = queue.attempt(work, resumed, grants, cx.waker(), wakes);
                    if let Attempt::Admitted { charge } = &mut attempt {
                        // Its release goes on the lane it opens, or it would
                        // close it at once.
                        charge.lane = shared.open_lane_for(work, queue, grants);
                    }
                    attempt
                }),
            };
            let tenant = work.tenant();
            let priority = work.priority();
            match attempt {
                Attempt::Admitted { charge } => {
                    coop.made_progress();
                    let shared = this.shared.take().expect("checked above");
                    // The permit before anything that calls the
                    // application's code (recorder, subscriber): if that
                    // panics, the permit's drop still returns the slot.
                    // Kept for the permit, which can ask for its slots
                    // again with it (`SlotPermit::release_during`).
                    let permit = SlotPermit::new(shared, work.clone(), charge);
                    export::settled(
                        permit.keys(),
                        priority,
                        export::ADMITTED,
                        Some(Duration::ZERO),
                    );
                    return Poll::Ready(Ok(permit));
                }
                Attempt::Rejected(error) => {
                    tracing::debug!(
                        target: "admission",
                        tenant = %tenant,
                        priority = %priority,
                        %error,
                        "admission rejected without queueing"
                    );
                    export::settled(&shared.keys, priority, error.reason(), None);
                    coop.made_progress();
                    *this.shared = None;
                    return Poll::Ready(Err(error));
                }
                Attempt::Queued { key, since } => {
                    let deadline = work.deadline();
                    // Queued before anything that calls the application's
                    // code (the subscriber, below): if that panics, the
                    // drop still takes the request out of the queue.
                    *this.phase = Phase::Queued { key, since };
                    let span = tracing::debug_span!(
                        target: "admission",
                        "admission_wait",
                        tenant = %tenant,
                        priority = %priority,
                        outcome = tracing::field::Empty,
                        wait_us = tracing::field::Empty,
                    );
                    // Entered on every poll of the wait, as `Instrument`
                    // would: events of the wait (a deadline refusal) nest
                    // under it.
                    *this.span = (!span.is_disabled()).then(|| Box::new(span));
                    let span = this.span.as_deref();
                    let _entered = span.map(tracing::Span::enter);
                    if let Some(deadline) = deadline {
                        let Some(timer) = crate::timer::sleep_until(deadline) else {
                            // Leaves the queue as a cancelled request would
                            // (a grant made meanwhile is passed on).
                            *this.phase = Phase::Done;
                            shared.with_state(|state, granter, wakes| {
                                state.cancel(key, granter, wakes)
                            });
                            let error = AdmitError::TimerUnavailable;
                            export::settled(&shared.keys, priority, error.reason(), None);
                            record_outcome(span, error.reason(), since);
                            *this.shared = None;
                            return Poll::Ready(Err(error));
                        };
                        *this.timer = Some(Box::pin(timer));
                    }
                    // The waker is already stored with the waiter; only the
                    // deadline timer (if any) needs this poll to register.
                    // A grant made since the lock was released has woken us.
                    let fired = match this.timer.as_mut() {
                        Some(timer) => timer.as_mut().poll(cx).is_ready(),
                        None => false,
                    };
                    if !fired {
                        return Poll::Pending;
                    }
                }
            }
        }
        let fired = match this.timer.as_mut() {
            Some(timer) => timer.as_mut().poll(cx).is_ready(),
            None => false,
        };
        settle_queued(this, cx.waker(), fired)
    }
}

impl<G: Granter> Admit<G> {
    /// Takes a grant made while the request waited, without looking at its
    /// deadline timer: for a waker that runs where the timer cannot be
    /// polled (off the runtime, or after it shut down), as the CPU pool's
    /// threads collect the grants their returned slots made. `Pending` when
    /// nothing was granted yet (the waker is stored for the next grant), and
    /// in every phase but waiting. A deadline is still honoured: the grant
    /// loop never grants a waiter past it, and the timer's own wake-up
    /// reaches whoever polls the future in full.
    pub(crate) fn poll_granted(
        self: Pin<&mut Self>,
        waker: &std::task::Waker,
    ) -> Poll<Result<SlotPermit<G>, AdmitError>> {
        let this = self.project();
        if !matches!(this.phase, Phase::Queued { .. }) || this.shared.is_none() {
            return Poll::Pending;
        }
        settle_queued(this, waker, false)
    }
}

/// The waiting phase of [`Admit::poll`]: the deadline timer has been
/// polled (`fired`), the waiter's state is looked at under the lock.
fn settle_queued<G: Granter>(
    this: AdmitProjection<'_, G>,
    waker: &std::task::Waker,
    fired: bool,
) -> Poll<Result<SlotPermit<G>, AdmitError>> {
    let Some(shared) = this.shared.as_ref() else {
        panic!("`Admit` polled after it completed");
    };
    let Phase::Queued { key, since } = *this.phase else {
        unreachable!("Start was handled above and Done has no shared state");
    };
    let priority = this.work.priority();
    let span = this.span.as_deref();
    let _entered = span.map(tracing::Span::enter);
    let observed = shared.with_state(|queue, grants, wakes| {
        if fired {
            queue.deadline_fired(key, grants, wakes)
        } else {
            queue.observe(key, waker, grants, wakes)
        }
    });
    // Settled: the future is done, and holds no queue, before anything
    // that calls the application's code (recorder, subscriber). If that
    // panics, the drop finds nothing to cancel.
    let mut finish = || {
        *this.phase = Phase::Done;
        *this.timer = None;
        this.shared.take().expect("checked above")
    };
    let result = match observed {
        Observed::Pending => return Poll::Pending,
        Observed::Admitted { charge, waited } => {
            let shared = finish();
            // The permit first, as on the fast path.
            let permit = SlotPermit::new(shared, this.work.clone(), charge);
            export::settled(permit.keys(), priority, export::ADMITTED, Some(waited));
            if let Some(span) = span {
                span.record("outcome", export::ADMITTED);
                span.record("wait_us", waited.as_micros() as u64);
            }
            Ok(permit)
        }
        Observed::Failed(error) => {
            let shared = finish();
            export::settled(&shared.keys, priority, error.reason(), None);
            record_outcome(span, error.reason(), since);
            Err(error)
        }
    };
    Poll::Ready(result)
}

impl<G: Granter> FusedFuture for Admit<G> {
    fn is_terminated(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }
}

/// Closes a wait's span: the outcome as the metric's `outcome` label
/// spells it, and how long it waited.
fn record_outcome(span: Option<&tracing::Span>, outcome: &'static str, since: Instant) {
    // No subscriber takes the span: no clock read for a wait nobody sees.
    let Some(span) = span else {
        return;
    };
    span.record("outcome", outcome);
    span.record("wait_us", since.elapsed().as_micros() as u64);
}

#[pinned_drop]
impl<G: Granter> PinnedDrop for Admit<G> {
    fn drop(self: Pin<&mut Self>) {
        let this = self.project();
        if let (Phase::Queued { key, since }, Some(shared)) = (&*this.phase, this.shared.as_ref()) {
            // Out of the queue before anything that calls the application's
            // code (recorder, subscriber), which could panic here.
            let (key, since) = (*key, *since);
            shared.with_state(|state, granter, wakes| state.cancel(key, granter, wakes));
            // Dropped as its task unwinds, a second panic (the recorder's or
            // the subscriber's) would abort the process: the count and the
            // span's outcome are left out then.
            if !std::thread::panicking() {
                export::settled(&shared.keys, this.work.priority(), export::CANCELLED, None);
                record_outcome(this.span.as_deref(), export::CANCELLED, since);
            }
        }
    }
}

impl<G: Granter> std::fmt::Debug for Admit<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match &self.phase {
            Phase::Start => "start",
            Phase::Queued { .. } => "queued",
            Phase::Done => "done",
        };
        f.debug_struct("Admit").field("phase", &phase).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every caller moves the future into its own state (an `async fn`'s,
    /// a tower response future's): the timer and the span stay boxed, out
    /// of its size.
    #[test]
    fn the_future_stays_small() {
        let size = std::mem::size_of::<Admit>();
        assert!(size <= 128, "Admit is {size} bytes");
    }
}
