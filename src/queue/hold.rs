//! Slots given back while admitted work waits, and asked for again in
//! order when it is ready to compute: [`SlotPermit::run`] and the tower
//! layer's response future.
//!
//! # Why a wait and a yield must be told apart
//!
//! A slot held across a database call is CPU the work is not using: the
//! controller must admit more work than the runtime has workers to keep them
//! busy, and what it admits runs in tokio's FIFO run queues, where priority
//! no longer exists. Giving the slot back at every `Pending` is no answer:
//! a handler that yields between chunks of computation (`yield_now`, or an
//! exhausted cooperative budget) would hand its slot to new work at every
//! chunk, and every request admitted would share the CPU with every other
//! one (processor sharing), so that none finishes before its deadline. So a
//! slot goes back only when the work is *waiting*: its future returned
//! `Pending` and nothing has woken it by the time its worker has run out of
//! ready work or turned its event loop.
//!
//! # How a turn of the worker is seen
//!
//! Without a timer and without tokio's internals, through the order in
//! which tokio wakes *deferred* wakers. `yield_now` (and the cooperative
//! budget) hands the task's waker to the worker, which wakes the deferred
//! wakers only after it has polled the IO and timer drivers (when it runs
//! out of tasks, or every `event_interval` polls), last-registered first.
//! Before each poll of the held future, a *probe* waker is deferred the same
//! way. The held future's own yield, if it yields, is deferred after the
//! probe, so it is woken first; IO and timers that completed were woken by
//! the driver before either. When the probe is woken, then:
//!
//! * the future woke itself during its poll, or was woken since (a yield, a
//!   self-wake, IO that was already ready): it is runnable and keeps its
//!   slot;
//! * nothing has woken it: it is waiting on something that outlasted a
//!   whole turn of its worker (a database call, a downstream request, a
//!   lock someone else holds, a timer), and the probe gives its slot back.
//!
//! When the future is woken after that, its next poll asks for the slot
//! again before it polls the future, with the same [`WorkInfo`] (tenant,
//! priority, create time, deadline) as a *resumed* request: ahead of new
//! work of its priority, not refused by early rejection or a full queue
//! (it is work in progress, not new load), but still by its deadline.
//! Outside a tokio runtime a deferred waker is woken at once, before the
//! future is polled; the probe then finds the future not yet polled and
//! nothing is ever given back.
//!
//! # Priority among held work
//!
//! Given back while it waits, low-priority work cannot take a slot ahead of
//! higher-priority work; but once work holds its slot, tokio's run queues
//! order it again, first woken first polled. Held work whose task is
//! polled while held work of a higher priority of the same queue is
//! runnable (woken, with its slot or about to ask for it, and not yet
//! polled) steps aside: it defers its task to the worker's next turn, as
//! `yield_now` does, without polling its future, so the higher work
//! computes first. Only runnable work counts: work that waits (on IO, on a
//! lock that the lower work may hold) holds nothing back, so no holder is
//! stopped from releasing what a higher one waits for. A poll steps aside
//! at most four times in a row, so work counted runnable whose task is not
//! being polled (its worker is blocked) delays lower work by four turns,
//! never for good. The count per priority lives in the queue
//! (`runnable.rs`); a hold counts itself when it is woken, and takes
//! itself off when its task polls it or it is done.
//!
//! On the unannotated IO service (`examples/io_service.rs`, two workers,
//! 200 bulk connections beside 4 high ones), three 15 s runs beside three
//! without it: high-priority answers per second +2.6%, CPU busy 1.5
//! points closer to no admission's, high p99 1.00-1.16x alone against
//! 1.10-1.39x.
//!
//! # Implementation notes
//!
//! One [`Hold`], shared by the future, the waker it polls the inner future
//! with, and each probe, holds the permit behind a leaf mutex (no other lock
//! is taken while it is held; the permit it gives back is dropped, and so
//! returned to the queue, after it is released). Its phase:
//!
//! ```text
//!            poll                 Pending, not woken           probe of this poll
//!   ──────▶ Polling ──────────────────────────────▶ Waiting ─────────────────▶ slot given back
//!             │  woken during the poll                │ woken                     │ woken
//!             ▼                                        ▼                           ▼
//!           Runnable ◀─────────────────────────────────┘                next poll: asked for again
//! ```
//!
//! Each poll bumps a counter, and a probe acts only for the poll that
//! deferred it: a probe left on one worker's list after the task moved to
//! another must not judge the new poll, whose own yield sits on the other
//! worker's list. Explicit releases behind the tower layer
//! (`tower::release_during`, `give_way`, `release_slot`) take the permit out
//! of the same hold and put the new one back, so the two never both hold a
//! slot for one request.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use pin_project::{pin_project, pinned_drop};

use super::admit::Admit;
use super::permit::SlotPermit;
use super::runnable::RunnableHolds;
use super::Shared;
use crate::error::AdmitError;
use crate::grant::SlotGranter;
use crate::sync::{Arc, Mutex, StdArc};
use crate::work::{Priority, WorkInfo};

/// The permit of one piece of running work, shared with its wakers.
pub(crate) struct Hold {
    state: Mutex<HoldState>,
    /// The queue's record of held work that is runnable, by priority.
    runnable: StdArc<RunnableHolds>,
    priority: Priority,
    /// Under loom there is no runtime to defer a probe on: each is kept
    /// here for the model to wake from whichever thread it likes.
    #[cfg(loom)]
    probes: std::sync::Mutex<Vec<Waker>>,
}

struct HoldState {
    /// The slot, while the work holds it.
    permit: Option<SlotPermit>,
    /// Set when a probe gave the slot back: what the next poll asks with.
    given_back: Option<(Arc<Shared<SlotGranter>>, WorkInfo)>,
    /// Polls of the held future so far; a probe carries the one it was
    /// deferred for.
    polls: u64,
    phase: Phase,
    /// The task's waker, which the held future's wakes are passed on to.
    task: Option<Waker>,
    /// Whether `runnable` counts this hold now.
    counted: bool,
    /// Polls in a row that stepped aside for runnable work of a higher
    /// priority.
    stepped_aside: u32,
}

/// How many polls in a row held work steps aside.
const STEP_ASIDE_LIMIT: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The held future is being polled; `woken` if it was woken meanwhile.
    Polling { woken: bool },
    /// It returned `Pending` and nothing has woken it since.
    Waiting,
    /// It was woken and waits for its task to poll it.
    Runnable,
    /// It completed, or the future holding it was dropped.
    Done,
}

impl Hold {
    pub(crate) fn new(permit: SlotPermit) -> StdArc<Self> {
        StdArc::new(Hold {
            runnable: permit.runnable(),
            priority: permit.work().priority(),
            state: Mutex::new(HoldState {
                permit: Some(permit),
                given_back: None,
                polls: 0,
                phase: Phase::Runnable,
                task: None,
                counted: false,
                stepped_aside: 0,
            }),
            #[cfg(loom)]
            probes: std::sync::Mutex::default(),
        })
    }

    /// Takes the permit out, for an explicit release; `None` while it is
    /// given back or out already.
    #[cfg(feature = "tower")]
    pub(crate) fn take_permit(&self) -> Option<SlotPermit> {
        self.state.lock().permit.take()
    }

    /// Puts a permit back after an explicit release, or after asking for
    /// it again; a permit that cannot go back (the work is done, or one is
    /// held already) is dropped.
    pub(crate) fn put_permit(&self, permit: SlotPermit) {
        let mut state = self.state.lock();
        if state.phase == Phase::Done || state.permit.is_some() {
            drop(state);
            drop(permit);
            return;
        }
        state.permit = Some(permit);
    }

    /// The probe's verdict for poll `poll`: gives the slot back if the held
    /// future is still waiting from that poll.
    fn probe(&self, poll: u64) {
        let mut state = self.state.lock();
        if state.polls != poll || state.phase != Phase::Waiting {
            return;
        }
        let Some(permit) = state.permit.take() else {
            return;
        };
        state.given_back = Some(permit.asking_again());
        drop(state);
        // Out of the hold's lock: the queue's is taken to return the slot.
        drop(permit);
    }

    /// Defers a probe for poll `poll` on the current worker.
    fn defer_probe(self: &StdArc<Self>, poll: u64) {
        let probe = Waker::from(StdArc::new(Probe {
            hold: self.clone(),
            poll,
        }));
        // `yield_now` is tokio's public door to its deferred wakers: polled
        // once with the probe's waker, it defers that waker and returns
        // `Pending`. Off a runtime it wakes the probe at once, which then
        // finds this poll not yet waiting.
        #[cfg(not(loom))]
        {
            let mut yielded = std::pin::pin!(tokio::task::yield_now());
            let _ = yielded.as_mut().poll(&mut Context::from_waker(&probe));
        }
        #[cfg(loom)]
        self.probes
            .lock()
            .unwrap_or_else(crate::sync::recover)
            .push(probe);
    }

    fn count(&self, state: &mut HoldState, runnable: bool) {
        if state.counted == runnable {
            return;
        }
        state.counted = runnable;
        if runnable {
            self.runnable.enter(self.priority);
        } else {
            self.runnable.leave(self.priority);
        }
    }

    fn finish(&self) -> Option<SlotPermit> {
        let mut state = self.state.lock();
        self.count(&mut state, false);
        state.phase = Phase::Done;
        state.given_back = None;
        state.permit.take()
    }
}

/// Wakes the task holding the slot, and records that its future is
/// runnable.
impl Wake for Hold {
    fn wake(self: StdArc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &StdArc<Self>) {
        let mut state = self.state.lock();
        state.phase = match state.phase {
            Phase::Polling { .. } => Phase::Polling { woken: true },
            Phase::Waiting | Phase::Runnable => Phase::Runnable,
            Phase::Done => Phase::Done,
        };
        if state.phase == Phase::Runnable {
            self.count(&mut state, true);
        }
        let task = state.task.clone();
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// Puts the task back behind the runnable work of a higher priority.
fn step_aside(cx: &mut Context<'_>) {
    #[cfg(not(loom))]
    {
        let mut yielded = std::pin::pin!(tokio::task::yield_now());
        let _ = yielded.as_mut().poll(cx);
    }
    #[cfg(loom)]
    cx.waker().wake_by_ref();
}

/// A deferred waker that judges one poll of the held future.
struct Probe {
    hold: StdArc<Hold>,
    poll: u64,
}

impl Wake for Probe {
    fn wake(self: StdArc<Self>) {
        self.hold.probe(self.poll);
    }

    fn wake_by_ref(self: &StdArc<Self>) {
        self.hold.probe(self.poll);
    }
}

/// The future returned by [`SlotPermit::run`]: the work, holding its slot
/// while it computes and giving it back while it waits.
///
/// Resolves to the work's output, or to the [`AdmitError`] that refused the
/// slot when the work asked for it again after a wait (its deadline passed
/// meanwhile, or the queue closed); the work is dropped then, at the point
/// where it waited. Cancel-safe: dropping it returns the slot, or leaves the
/// queue if it was asking for it again.
#[pin_project(PinnedDrop)]
#[must_use = "futures do nothing unless polled"]
pub struct Run<F> {
    /// `None` once complete, or refused its slot (dropped where it waited).
    #[pin]
    work: Option<F>,
    #[pin]
    asking: Option<Admit>,
    hold: StdArc<Hold>,
    /// The waker the work is polled with: `hold`'s own.
    waker: Waker,
}

impl<F: Future> Run<F> {
    pub(super) fn new(permit: SlotPermit, work: F) -> Self {
        Self::with_hold(Hold::new(permit), work)
    }

    /// The same over a hold made by the caller, who keeps a handle to it
    /// (the tower layer, whose handlers reach it through a task-local).
    pub(crate) fn with_hold(hold: StdArc<Hold>, work: F) -> Self {
        Run {
            work: Some(work),
            asking: None,
            waker: Waker::from(hold.clone()),
            hold,
        }
    }
}

impl<F: Future> Future for Run<F> {
    type Output = Result<F::Output, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let Some(asking) = this.asking.as_mut().as_pin_mut() {
                // Polled, so out of the run queue: while it asks, it is
                // waiting in the admission queue, not runnable.
                this.hold.count(&mut this.hold.state.lock(), false);
                let permit = match asking.poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(permit)) => permit,
                    Poll::Ready(Err(error)) => {
                        this.asking.set(None);
                        this.work.set(None);
                        this.hold.finish();
                        return Poll::Ready(Err(error));
                    }
                };
                this.asking.set(None);
                this.hold.put_permit(permit);
            }
            let mut state = this.hold.state.lock();
            if let Some((shared, work)) = state.given_back.take() {
                this.hold.count(&mut state, false);
                drop(state);
                this.asking.set(Some(Admit::resume(shared, work)));
                continue;
            }
            if !state.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                state.task = Some(cx.waker().clone());
            }
            let holds_slot = state.permit.is_some();
            if holds_slot
                && state.phase == Phase::Runnable
                && state.stepped_aside < STEP_ASIDE_LIMIT
                && this.hold.runnable.any_above(this.hold.priority)
            {
                state.stepped_aside += 1;
                // Still runnable, behind the higher work.
                this.hold.count(&mut state, true);
                drop(state);
                step_aside(cx);
                return Poll::Pending;
            }
            state.stepped_aside = 0;
            this.hold.count(&mut state, false);
            state.polls = state.polls.wrapping_add(1);
            let poll = state.polls;
            state.phase = Phase::Polling { woken: false };
            drop(state);
            if holds_slot {
                this.hold.defer_probe(poll);
            }
            let Some(work) = this.work.as_mut().as_pin_mut() else {
                panic!("`Run` polled after it completed");
            };
            let polled = work.poll(&mut Context::from_waker(this.waker));
            let mut state = this.hold.state.lock();
            return match polled {
                Poll::Ready(output) => {
                    drop(state);
                    this.work.set(None);
                    // The work is done: the slot goes to the next waiter
                    // now, not when the caller drops this future.
                    drop(this.hold.finish());
                    Poll::Ready(Ok(output))
                }
                Poll::Pending => {
                    state.phase = match state.phase {
                        Phase::Polling { woken: true } => Phase::Runnable,
                        _ => Phase::Waiting,
                    };
                    if state.phase == Phase::Runnable {
                        this.hold.count(&mut state, true);
                    }
                    Poll::Pending
                }
            };
        }
    }
}

#[pinned_drop]
impl<F> PinnedDrop for Run<F> {
    fn drop(self: Pin<&mut Self>) {
        // Now, not when the last probe still deferred on some worker goes.
        drop(self.hold.finish());
    }
}

#[cfg(loom)]
impl<F> Run<F> {
    /// The probes deferred so far, oldest first, for a model to wake.
    pub(crate) fn deferred_probes(&self) -> Vec<Waker> {
        std::mem::take(&mut *self.hold.probes.lock().unwrap_or_else(crate::sync::recover))
    }
}

impl<F> fmt::Debug for Run<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.hold.state.lock();
        let phase = match (state.phase, state.permit.is_some(), self.asking.is_some()) {
            (_, _, true) => "asking for its slot again",
            (Phase::Done, _, _) => "done",
            (_, true, _) => "holding its slot",
            (_, false, _) => "waiting without its slot",
        };
        f.debug_struct("Run").field("state", &phase).finish()
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("Hold")
            .field("phase", &state.phase)
            .field("holds_slot", &state.permit.is_some())
            .finish()
    }
}
