//! `Handoff`: one job's admission, shared between the caller's task and
//! whichever thread makes its grant.
//!
//! # Implementation notes
//!
//! **Why it exists.** A slot returned on a pool thread is granted to the
//! next waiter at once, under the queue's lock, but a grant is only a
//! state change and a wake-up: the waiter's closure lives in the caller's
//! `PoolTask`, and by default it reaches a thread only after that task has
//! been woken and polled on a tokio worker. With
//! [`collect_grants`](super::CpuPoolBuilder::collect_grants) the thread
//! whose returned slot made the grant collects it instead, on the spot,
//! and the closure is in the jobs channel before that thread looks for its
//! next job. For that, the admission and the closure live here, behind a
//! lock, rather than in the `PoolTask`, and the waker the queue stores for
//! the waiter is this `Handoff` itself.
//!
//! **Who polls what.** The caller's task polls the `Admit` in full, on its
//! runtime (the deadline timer needs that). A wake-up of the `Handoff`
//! (a grant, or the deadline timer firing) either passes straight on to
//! the caller's task (the default), or, when collecting, looks only at the
//! waiter's state ([`Admit::poll_granted`], which never touches the timer,
//! so it is safe on any thread, even after the runtime has shut down) and
//! dispatches the job if it was granted; anything else (the timer, a
//! refusal) wakes the caller's task, whose full poll settles it.
//!
//! **The lock and the flag.** A wake-up can arrive while the lock is held:
//! by the caller's poll on another thread, or synchronously from inside a
//! poll that holds it. So a wake-up never blocks on the lock: it sets
//! `notified` and only *tries* the lock. Whoever holds the lock looks at
//! `notified` again after releasing it and handles it then. Either the
//! waker got the lock (and handled its own wake-up), or its `try_lock`
//! failed while the holder held it; the holder reads the flag only after
//! releasing, which is after the waker set it, so no wake-up is lost. The
//! loom models in `loom_models.rs` check this against a caller polling
//! and dropping.
//!
//! **Lock order.** This lock, then the queue's (inside `Admit`), then
//! nothing: the job is dispatched (the pool's `Dispatch` lock) and the
//! caller's waker woken only after this lock is released, and a dropped
//! stage (whose `Admit` takes the queue's lock to leave the queue) is
//! dropped outside it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use super::worker::{Job, Task};
use crate::error::AdmitError;
use crate::queue::{Admit, SlotPermit};
use crate::sync::{AtomicBool, Mutex, Ordering, StdArc};

/// Where an admitted job goes: the pool's threads (`PoolShared::dispatch`),
/// or a loom model's record.
pub(crate) trait Dispatcher: Send + Sync + 'static {
    /// Hands over an admitted job; `bypass` says it may borrow a thread.
    fn dispatch(self: &StdArc<Self>, job: Job, bypass: bool);
}

/// One job's passage from the queue to the dispatcher. In a `std` `Arc`,
/// which is what a [`Waker`] is made from.
pub(crate) struct Handoff<D: Dispatcher> {
    stage: Mutex<Stage>,
    /// A wake-up that found the lock taken, for the holder to handle.
    notified: AtomicBool,
    dispatcher: StdArc<D>,
    bypass: bool,
    /// Whether a wake-up collects a grant itself, or only wakes the caller.
    collect: bool,
}

enum Stage {
    /// Waiting for admission; the caller's waker from its last poll.
    Admitting {
        admit: Pin<Box<Admit>>,
        task: Box<dyn Task>,
        caller: Option<Waker>,
    },
    /// Admitted and handed to the dispatcher.
    Dispatched,
    /// Refused, found by a wake-up: the caller's next poll reports it.
    Refused(AdmitError),
    /// Reported to the caller, or the caller is gone.
    Finished,
}

/// What a poll of the admission came to, acted on after the lock is
/// released.
enum Next {
    Wait,
    Dispatch(Job),
    Refuse(AdmitError),
}

impl<D: Dispatcher> Handoff<D> {
    pub(crate) fn new(
        admit: Admit,
        task: Box<dyn Task>,
        dispatcher: StdArc<D>,
        bypass: bool,
        collect: bool,
    ) -> StdArc<Self> {
        StdArc::new(Handoff {
            stage: Mutex::new(Stage::Admitting {
                admit: Box::pin(admit),
                task,
                caller: None,
            }),
            notified: AtomicBool::new(false),
            dispatcher,
            bypass,
            collect,
        })
    }

    /// The caller's poll: `Ready(Ok(()))` once the job has been handed
    /// over (by this poll or by a wake-up before it), `Ready(Err(..))` when
    /// admission refused it, `Pending` while it waits (`cx` is woken when
    /// that changes, or when the caller has to look at the deadline).
    pub(crate) fn poll_admission(
        self: &StdArc<Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), AdmitError>> {
        let mut stage = self.stage.lock();
        let next = match &mut *stage {
            Stage::Admitting { admit, caller, .. } => {
                if !caller.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *caller = Some(cx.waker().clone());
                }
                let waker = Waker::from(self.clone());
                let polled = admit.as_mut().poll(&mut Context::from_waker(&waker));
                settle(&mut stage, polled)
            }
            Stage::Dispatched => return Poll::Ready(Ok(())),
            Stage::Refused(_) => match std::mem::replace(&mut *stage, Stage::Finished) {
                Stage::Refused(error) => return Poll::Ready(Err(error)),
                _ => unreachable!("matched as refused under the same lock"),
            },
            // Polled again after it reported its outcome, which the
            // `PoolTask` never does (it is fused).
            Stage::Finished => return Poll::Ready(Err(AdmitError::Closed)),
        };
        let outcome = match next {
            Next::Wait => {
                drop(stage);
                Poll::Pending
            }
            Next::Refuse(error) => {
                *stage = Stage::Finished;
                drop(stage);
                Poll::Ready(Err(error))
            }
            Next::Dispatch(job) => {
                drop(stage);
                self.dispatcher.dispatch(job, self.bypass);
                Poll::Ready(Ok(()))
            }
        };
        // A wake-up that arrived while this poll held the lock (released on
        // every path above: a check made while holding it would find the
        // lock taken, by this very poll, and the wake-up would be lost).
        if self.notified.load(Ordering::SeqCst) {
            self.on_wake();
        }
        outcome
    }

    /// The caller is gone: a job still admitting leaves the queue (a grant
    /// it had not collected goes to the next waiter) and its closure is
    /// dropped unrun; a dispatched one is skipped by the thread that takes
    /// it (its result receiver is gone).
    pub(crate) fn abandon(&self) {
        let old = std::mem::replace(&mut *self.stage.lock(), Stage::Finished);
        // Outside the lock: the admission's drop takes the queue's lock,
        // and a grant it passes on may wake this `Handoff`.
        drop(old);
    }

    /// A wake-up: from the queue (a grant, a refusal while waiting, the
    /// queue closing) or from the deadline timer.
    fn on_wake(self: &StdArc<Self>) {
        self.notified.store(true, Ordering::SeqCst);
        loop {
            let Some(mut stage) = self.stage.try_lock() else {
                // The holder looks at `notified` once it has let go.
                return;
            };
            if !self.notified.swap(false, Ordering::SeqCst) {
                // Handled by whoever held the lock before.
                return;
            }
            let Stage::Admitting { admit, caller, .. } = &mut *stage else {
                // Dispatched, refused or finished: nothing to wake for.
                return;
            };
            let caller = caller.clone();
            let next = if self.collect {
                let waker = Waker::from(self.clone());
                let polled = admit.as_mut().poll_granted(&waker);
                settle(&mut stage, polled)
            } else {
                Next::Wait
            };
            if let Next::Refuse(error) = next {
                *stage = Stage::Refused(error);
                drop(stage);
                wake(caller);
            } else if let Next::Dispatch(job) = next {
                drop(stage);
                self.dispatcher.dispatch(job, self.bypass);
            } else {
                // Not granted (or not collecting): the caller's full poll
                // looks, deadline timer included.
                drop(stage);
                wake(caller);
            }
            if !self.notified.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

fn wake(caller: Option<Waker>) {
    if let Some(caller) = caller {
        caller.wake();
    }
}

/// Moves an admitting stage on from what a poll of its admission returned:
/// to `Dispatched`, with the job to dispatch; a refusal is for the caller
/// of this to record.
fn settle(stage: &mut Stage, polled: Poll<Result<SlotPermit, AdmitError>>) -> Next {
    match polled {
        Poll::Pending => Next::Wait,
        Poll::Ready(Err(error)) => Next::Refuse(error),
        Poll::Ready(Ok(permit)) => match std::mem::replace(stage, Stage::Dispatched) {
            Stage::Admitting { task, .. } => Next::Dispatch(Job { permit, task }),
            other => {
                // Only an admitting stage is polled; the permit goes back.
                *stage = other;
                Next::Wait
            }
        },
    }
}

impl<D: Dispatcher> Wake for Handoff<D> {
    fn wake(self: StdArc<Self>) {
        self.on_wake();
    }

    fn wake_by_ref(self: &StdArc<Self>) {
        self.on_wake();
    }
}
