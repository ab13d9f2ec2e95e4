//! The permit that holds admitted capacity until the work completes.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::FusedFuture;
use pin_project::pin_project;

use super::admit::Admit;
use super::hold::Run;
use super::state::Charge;
use super::Shared;
use crate::error::AdmitError;
use crate::grant::{Granter, SlotGranter};
use crate::sync::Arc;
use crate::work::WorkInfo;

/// Proof of admission: holds the slots it was granted (one, unless the
/// work asked for more with [`WorkInfoBuilder::requested`](crate::work::WorkInfoBuilder::requested))
/// until dropped.
///
/// Dropping the permit returns them; the
/// first waiter in order gets them at once. Because the return happens in
/// `Drop`, a handler that panics or is cancelled while holding the permit
/// still gives its slot back.
#[must_use = "dropping the permit at once returns the slot: hold it while the work runs"]
pub struct SlotPermit<G: Granter = SlotGranter> {
    shared: Arc<Shared<G>>,
    work: WorkInfo,
    charge: Charge,
}

impl<G: Granter> SlotPermit<G> {
    pub(super) fn new(shared: Arc<Shared<G>>, work: WorkInfo, charge: Charge) -> Self {
        SlotPermit {
            shared,
            work,
            charge,
        }
    }

    /// The metric keys of the queue this permit's slot belongs to.
    pub(super) fn keys(&self) -> &crate::export::QueueKeys {
        &self.shared.keys
    }

    /// The work this permit admitted, as it asked.
    pub fn work(&self) -> &WorkInfo {
        &self.work
    }
}

impl SlotPermit<SlotGranter> {
    /// The queue's count of runnable held work, which a hold of these
    /// slots joins while it is runnable.
    pub(super) fn runnable(&self) -> crate::sync::StdArc<super::runnable::RunnableHolds> {
        self.shared.runnable.clone()
    }

    /// What asking for these slots again takes: the queue and the work.
    pub(super) fn asking_again(&self) -> (Arc<Shared<SlotGranter>>, WorkInfo) {
        (self.shared.clone(), self.work.clone())
    }

    /// Runs `work` holding the slots while it computes and giving them back
    /// while it waits, asking for them again in order when it is ready to
    /// compute: the annotation [`release_during`](Self::release_during)
    /// asks for, made at every wait of `work` without one.
    ///
    /// A wait is told from a yield without a timer: the slots go back only
    /// when `work` returned `Pending` and nothing woke it by the time its
    /// worker ran out of ready tasks or turned its event loop (a database
    /// call, a downstream request, a lock held elsewhere, a timer), never at
    /// a `yield_now` or an exhausted cooperative budget, which tokio wakes
    /// in that same turn. Giving the slot back at every `Pending` instead
    /// would admit new work at every yield and share the CPU between every
    /// request admitted, so that none finished in time.
    ///
    /// Asking again is an admission with the same [`WorkInfo`] as work in
    /// progress: ahead of new work of its priority (oldest first, whatever
    /// epoch-LIFO does with new work), not refused by a full queue or by
    /// early rejection, but refused once its deadline passes, or when the
    /// queue closes. `work` is dropped then, where it waited, and the
    /// refusal comes back instead of its output. Outside a tokio runtime
    /// nothing is given back.
    ///
    /// Holding its slot, `work` still runs in tokio's first-woken,
    /// first-polled run queues; so when it is woken while held work of a
    /// higher priority on the same queue is woken too and not yet polled,
    /// it steps aside: its task goes to the back, to the worker's next
    /// turn, a few times at most, and the higher work computes first. Work
    /// that waits holds nothing back.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops `work` and returns the slots, or
    /// leaves the queue if it was asking for them again.
    ///
    /// # Errors
    ///
    /// The [`AdmitError`] that refused the slots when `work` asked for them
    /// again: [`DeadlineExceeded`](AdmitError::DeadlineExceeded) or
    /// [`DeadlinePassed`](AdmitError::DeadlinePassed) for its deadline,
    /// [`Closed`](AdmitError::Closed) for a closed queue.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), admission::AdmitError> {
    /// use std::time::Duration;
    /// use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// let queue = WorkQueue::new(1).unwrap();
    /// let permit = queue
    ///     .admit(WorkInfo::new(TenantId::new(1), Priority::NORMAL))
    ///     .await?;
    /// let rows = permit
    ///     .run(async {
    ///         // ... parse the request: the slot is held ...
    ///         tokio::time::sleep(Duration::from_millis(1)).await; // a database call
    ///         // ... render: the slot is held again ...
    ///         vec![1, 2, 3]
    ///     })
    ///     .await?;
    /// # assert_eq!(rows.len(), 3);
    /// assert_eq!(queue.granter_snapshot().used, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn run<F: IntoFuture>(self, work: F) -> Run<F::IntoFuture> {
        Run::new(self, work.into_future())
    }

    /// Gives the slots back while `wait` runs, then asks for them again:
    /// for a handler that computes, waits on IO (a database call, a
    /// downstream request, a timer), then computes again.
    ///
    /// A slot held across the wait is CPU the work is not using, so a
    /// controller must admit more work than the runtime has workers to
    /// keep the CPU busy, and the work it admits runs in tokio's FIFO run
    /// queues, where priority no longer exists: when waits end together,
    /// low-priority work computes beside high-priority work. Released
    /// during the wait, slots stay about one per worker and every phase of
    /// computation is admitted in order. (The overload suite's W9, handlers
    /// that wait on IO as long as they compute, served the high class
    /// within its SLO 96–97% of the time this way, as when it runs alone,
    /// against 85–86% holding the slot; see the README.)
    ///
    /// The second admission is work in progress asking again, with the
    /// same [`WorkInfo`]: the same tenant and priority, ordered ahead of
    /// new work of its priority (oldest first, whatever epoch-LIFO does
    /// with new work), not refused by a full queue or by early rejection
    /// (what is left of it is not a typical request), but refused once its
    /// deadline passes. Either way the wait's output comes back, beside the
    /// new permit or the refusal. [`run`](Self::run) does this at every
    /// wait of a future by itself.
    ///
    /// Cancel-safe: the slots are back in the queue from the moment this
    /// is called (not at the future's first poll), and dropping the future
    /// while it waits for them again leaves the queue as dropping an
    /// [`Admit`] does. In metrics and snapshots each call counts one more
    /// request, and one more [`resumed`](crate::observe::PrioritySnapshot::resumed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops `wait` and returns nothing twice: the
    /// slots were given back when it was made, and a request for them again
    /// leaves the queue (a grant it had not seen goes to the next waiter).
    ///
    /// # Errors
    ///
    /// The second value is the [`AdmitError`] that refused the slots when
    /// `wait` had finished: its deadline, or a closed queue. The wait's output
    /// comes back either way.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), admission::AdmitError> {
    /// use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// let queue = WorkQueue::new(1).unwrap();
    /// let permit = queue
    ///     .admit(WorkInfo::new(TenantId::new(1), Priority::NORMAL))
    ///     .await?;
    /// // ... parse the request ...
    /// let (rows, permit) = permit
    ///     .release_during(async {
    ///         // The slot is free for others while this waits.
    ///         assert_eq!(queue.granter_snapshot().used, 0);
    ///         vec![1, 2, 3] // a database's answer
    ///     })
    ///     .await;
    /// let permit = permit?;
    /// // ... render `rows` ...
    /// # assert_eq!(rows.len(), 3);
    /// drop(permit);
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_during<F: IntoFuture>(self, wait: F) -> ReleaseDuring<F::IntoFuture> {
        let again = (self.shared.clone(), self.work.clone());
        // Now, not at the first poll: the slots are free for others even
        // if the returned future is never polled.
        drop(self);
        ReleaseDuring {
            state: ReleaseState::Waiting {
                wait: wait.into_future(),
                again: Some(again),
            },
        }
    }
}

impl SlotPermit<SlotGranter> {
    /// Gives the slots to waiting work of higher priority, if there is
    /// any, and waits for them again; otherwise keeps them, at the cost of
    /// one turn of the queue's lock: a preemption point for long work, to
    /// call between its chunks (a batch of a backfill, a block of an
    /// export, every few milliseconds of a report).
    ///
    /// A slot is held until the work completes, so a request that arrives
    /// while long low-priority work holds every slot waits for one of those
    /// to finish, however high its priority: the queue orders waiters, it
    /// cannot interrupt holders. Work that gives way between chunks bounds
    /// that wait by one chunk. The overload suite's W5 measures it: a
    /// foreground at half the capacity beside a bulk job in 5 ms chunks
    /// (see the README).
    ///
    /// The permit gives way when the waiter the queue would grant next,
    /// were these slots free, has a higher priority than this work
    /// ([`WorkInfo::priority`]) and would be granted them at once: it asks
    /// for no more slots than will be free once this permit's are back
    /// (work that [bypassed](crate::work::WorkInfoBuilder::bypass)
    /// admission may hold slots beyond the total), and the queue's
    /// [grant pacing](crate::WorkQueueBuilder::grant_burst) has room, and
    /// its deadline would not refuse it (one that passed, its own timer
    /// not yet run, would see the slot go past it to whoever is next). So
    /// the slots never sit idle between the two, and the grant makes room
    /// in the queue for this work's second admission: a full queue never
    /// refuses work that gave way. Work of the same priority does not take
    /// the slot: among equals, fair share and arrival order act at
    /// admission, and rotating holders every chunk would only add
    /// hand-offs. Nor does work that [bypasses](crate::work::WorkInfoBuilder::bypass)
    /// admission give way: it would be admitted again at once.
    ///
    /// Call it where the work holds nothing that higher-priority work may
    /// wait for (a lock, a connection from a small pool): work that gave way
    /// waits for a slot while holding it, and if the work on its slot waits
    /// for it in turn, neither moves until a deadline refuses one. The same
    /// holds for [`release_during`](Self::release_during).
    ///
    /// Elastic work (bulk and background priorities) that has offered its
    /// slot this way once no longer counts against the queue's
    /// [elastic share](crate::WorkQueueBuilder::elastic_share): the share
    /// keeps slots from elastic work because a slot cannot be taken back
    /// from it, and this work gives its slot back when asked. So bulk work
    /// that gives way can use the CPU that regular work leaves, all of it,
    /// and still steps aside within a chunk. (It counts again when it asks
    /// for the slot again after giving way, until its next offer.)
    ///
    /// Giving way is a [`release_during`](Self::release_during) of no wait:
    /// the slots go to the waiter at once, and this work asks for them
    /// again with its own [`WorkInfo`] (same tenant, priority, create time
    /// and deadline) as work in progress: ahead of new work of its
    /// priority, and refused only for its deadline. Each time it gives way
    /// counts as one more (resumed) request and one more grant, in metrics
    /// and in the tenant's usage under
    /// [`Usage::Granted`](crate::Usage::Granted).
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future, before or after it gave way, leaves the
    /// queue as dropping the permit or an [`Admit`] does.
    ///
    /// # Errors
    ///
    /// The [`AdmitError`] that refused the slot when the work asked for it
    /// again after giving way: its deadline, or a closed queue.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), admission::AdmitError> {
    /// use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// let queue = WorkQueue::new(1).unwrap();
    /// let backfill = WorkInfo::new(TenantId::new(1), Priority::BULK_NORMAL);
    /// let mut permit = queue.admit(backfill).await?;
    /// for _batch in 0..3 {
    ///     // ... copy one batch of rows ...
    ///     // Nobody of higher priority waits: the slot is kept.
    ///     permit = permit.give_way().await?;
    /// }
    /// # assert_eq!(queue.granter_snapshot().used, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn give_way(mut self) -> GiveWay {
        let tenant = self.work.tenant();
        if self.work.is_bypass() || !self.shared.give_way(tenant, &mut self.charge) {
            return GiveWay {
                state: GiveWayState::Kept(Some(self)),
            };
        }
        let (shared, work) = (self.shared.clone(), self.work.clone());
        // Now, not at the first poll: the waiter has the slots even if the
        // returned future is never polled.
        drop(self);
        GiveWay {
            state: GiveWayState::Admitting(Admit::resume(shared, work)),
        }
    }
}

/// The future returned by [`SlotPermit::give_way`]: the permit kept, or the
/// admission that asks for its slots again. Cancel-safe at every point.
#[pin_project]
#[must_use = "a permit that gave way holds nothing until this future is awaited"]
pub struct GiveWay {
    #[pin]
    state: GiveWayState,
}

#[pin_project(project = GiveWayProjection)]
enum GiveWayState {
    /// Nobody outranked the work: the permit, until the first poll.
    Kept(Option<SlotPermit<SlotGranter>>),
    Admitting(#[pin] Admit),
}

impl GiveWay {
    /// Whether the permit gave its slots away (and this future asks for
    /// them again), rather than keeping them.
    pub fn gave_way(&self) -> bool {
        matches!(self.state, GiveWayState::Admitting(_))
    }
}

impl Future for GiveWay {
    type Output = Result<SlotPermit<SlotGranter>, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            GiveWayProjection::Kept(permit) => Poll::Ready(Ok(permit
                .take()
                .expect("`GiveWay` polled after it completed"))),
            GiveWayProjection::Admitting(admit) => admit.poll(cx),
        }
    }
}

impl FusedFuture for GiveWay {
    fn is_terminated(&self) -> bool {
        match &self.state {
            GiveWayState::Kept(permit) => permit.is_none(),
            GiveWayState::Admitting(admit) => admit.is_terminated(),
        }
    }
}

impl fmt::Debug for GiveWay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GiveWay")
            .field("gave_way", &self.gave_way())
            .finish()
    }
}

/// The future returned by [`SlotPermit::release_during`]: the wait, then
/// the second admission. A named type, like [`Admit`], so that it can be
/// stored without boxing; cancel-safe at every point.
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct ReleaseDuring<F: Future> {
    #[pin]
    state: ReleaseState<F>,
}

#[pin_project(project = ReleaseProjection)]
enum ReleaseState<F: Future> {
    Waiting {
        #[pin]
        wait: F,
        /// What the second admission needs; taken when the wait ends.
        again: Option<(Arc<Shared<SlotGranter>>, WorkInfo)>,
    },
    Admitting {
        #[pin]
        admit: Admit,
        /// The wait's output, held until the admission settles.
        output: Option<F::Output>,
    },
    Done,
}

impl<F: Future> Future for ReleaseDuring<F> {
    type Output = (F::Output, Result<SlotPermit<SlotGranter>, AdmitError>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                ReleaseProjection::Waiting { wait, again } => {
                    let output = ready!(wait.poll(cx));
                    let (shared, work) = again.take().expect("taken once, when the wait ends");
                    this.state.set(ReleaseState::Admitting {
                        admit: Admit::resume(shared, work),
                        output: Some(output),
                    });
                }
                ReleaseProjection::Admitting { admit, output } => {
                    let admitted = ready!(admit.poll(cx));
                    let output = output.take().expect("taken once, when admission settles");
                    this.state.set(ReleaseState::Done);
                    return Poll::Ready((output, admitted));
                }
                ReleaseProjection::Done => panic!("`ReleaseDuring` polled after it completed"),
            }
        }
    }
}

impl<F: Future> FusedFuture for ReleaseDuring<F> {
    fn is_terminated(&self) -> bool {
        matches!(self.state, ReleaseState::Done)
    }
}

impl<F: Future> fmt::Debug for ReleaseDuring<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            ReleaseState::Waiting { .. } => "waiting",
            ReleaseState::Admitting { .. } => "admitting",
            ReleaseState::Done => "done",
        };
        f.debug_struct("ReleaseDuring")
            .field("state", &state)
            .finish()
    }
}

impl<G: Granter> Drop for SlotPermit<G> {
    fn drop(&mut self) {
        if self.charge.lane != 0 && self.shared.release_on_lane(self.work.tenant(), self.charge) {
            return;
        }
        self.shared.release(self.work.tenant(), self.charge);
    }
}

impl<G: Granter> fmt::Debug for SlotPermit<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPermit")
            .field("tenant", &self.work.tenant())
            .field("priority", &self.work.priority())
            .finish_non_exhaustive()
    }
}
