//! [`QuotaAdmit`]: the tenant's quota first, then the node's capacity.
//!
//! # Implementation notes
//!
//! A request passes through up to two queues, one at a time:
//!
//! ```text
//! Start ──(no quota for the tenant)────────────────────────────▶ Capacity ──▶ Done
//!   ├──(units at hand: one compare-and-swap, refund armed)──────▶  ▲
//!   └─▶ Quota: the tenant's token queue ──(units taken)────────────┘
//!         │            (refund armed: units go back if capacity refuses)
//!         └──(refused)──▶ Done: OverQuota { retry_after }
//! ```
//!
//! While its node holds a lease a request nearly always finds its units
//! at hand and goes straight to capacity, the refund armed, without the
//! tenant's queue (see `balance.rs` for the handshake with the requests
//! that do wait). One that finds too few is counted as queued for as long
//! as it is in the Quota phase, so units that arrive meanwhile go to the
//! queue, and it waits there.
//!
//! A request that has to wait for quota is weighed once, when it first
//! waits: if the rate units reach this node at cannot cover it (and those
//! waiting ahead of it) before its deadline, it is refused at once, with
//! that time as its `retry_after`. A request that waits for its tenant's
//! first lease on this node is not weighed (the rate is still a guess, and
//! the lease brings up to a burst): it waits for the lease, within its
//! deadline. The fast path (units at hand) reads no clock and weighs
//! nothing.
//!
//! Quota first: a request over quota must not hold a place (or a slot) in
//! the node's capacity queue, where it would sit in front of other tenants'
//! work; in its own tenant's token queue it waits behind only its own
//! tenant's work of higher priority. Each phase is an ordinary [`Admit`],
//! so each is cancel-safe on its own (a waiter leaves its queue; a grant it
//! never saw is given back: tokens credited, a slot passed on). Between the
//! two, the units taken are held by the future: if capacity then refuses
//! the request, or the future is dropped while it waits for capacity, the
//! units are **refunded** to the tenant's local balance (and its waiters),
//! since the work never ran. So neither quota nor capacity is lost however
//! the caller drops the future.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::FusedFuture;
use pin_project::{pin_project, pinned_drop};

use super::table::Record;
use super::Quota;
use crate::error::AdmitError;
use crate::grant::{Granter, SlotGranter, TokenGranter};
use crate::queue::{Admit, SlotPermit, WorkQueue};
use crate::sync::{Ordering, StdArc};
use crate::work::WorkInfo;

/// The future returned by [`Quota::admit`]: the tenant's quota, then the
/// node's capacity. Resolves to the capacity queue's [`SlotPermit`], or
/// to an [`AdmitError`]: [`AdmitError::OverQuota`] when the quota refused.
///
/// Cancel-safe: dropping it at any point loses neither quota nor capacity
/// (see [`Quota::admit`]).
#[pin_project(PinnedDrop)]
#[must_use = "futures do nothing unless polled"]
pub struct QuotaAdmit<G: Granter = SlotGranter> {
    quota: Quota,
    capacity: WorkQueue<G>,
    units: u64,
    #[pin]
    phase: Phase<G>,
}

#[pin_project(project = PhaseProjection)]
enum Phase<G: Granter> {
    Start(Option<WorkInfo>),
    Quota {
        // Declared before `queued`, so the wait leaves the queue before the
        // request stops being counted there.
        #[pin]
        admit: Admit<TokenGranter>,
        queued: Queued,
        work: Option<WorkInfo>,
        /// The record was closed under this request once already.
        looked_again: bool,
        /// Whether the wait was weighed against the deadline (once, when
        /// the request first had to wait).
        weighed: bool,
    },
    Capacity {
        #[pin]
        admit: Admit<G>,
        /// The units to give back if capacity refuses.
        refund: Option<StdArc<Record>>,
    },
    Done,
}

impl<G: Granter> QuotaAdmit<G> {
    pub(super) fn new(quota: Quota, capacity: WorkQueue<G>, work: WorkInfo, units: u64) -> Self {
        QuotaAdmit {
            quota,
            capacity,
            units: units.max(1),
            phase: Phase::Start(Some(work)),
        }
    }
}

/// A request counted as bound for its tenant's queue (see
/// `LocalBalance`), until this is dropped.
#[derive(Debug)]
struct Queued(StdArc<Record>);

impl Queued {
    fn enter(record: StdArc<Record>) -> Self {
        record.local.enter_queue();
        Queued(record)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.local.leave_queue();
    }
}

/// The phase of a request of `record`'s tenant: straight to capacity when
/// the units are at hand (the refund armed), else into the tenant's queue.
fn under_quota<G: Granter>(
    record: StdArc<Record>,
    capacity: &WorkQueue<G>,
    work: WorkInfo,
    units: u64,
    looked_again: bool,
) -> Phase<G> {
    if record.local.try_take(units) {
        return Phase::Capacity {
            admit: capacity.admit(work),
            refund: Some(record),
        };
    }
    let queued = Queued::enter(record);
    let admit = queued.0.local.queue().admit(quota_work(&work, units));
    Phase::Quota {
        admit,
        queued,
        work: Some(work),
        looked_again,
        weighed: false,
    }
}

/// The token queue's view of `work`: the same class, `units` asked.
fn quota_work(work: &WorkInfo, units: u64) -> WorkInfo {
    let builder = WorkInfo::builder()
        .tenant(work.tenant())
        .priority(work.priority())
        .create_time(work.create_time())
        .bypass(work.is_bypass())
        .requested(units);
    match work.deadline() {
        Some(deadline) => builder.deadline(deadline).build(),
        None => builder.build(),
    }
}

impl<G: Granter> Future for QuotaAdmit<G> {
    type Output = Result<SlotPermit<G>, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.phase.as_mut().project() {
                PhaseProjection::Start(work) => {
                    let Some(work) = work.take() else {
                        unreachable!("the work is taken once, on leaving Start");
                    };
                    match this.quota.record(work.tenant()) {
                        Err(error) => {
                            this.phase.set(Phase::Done);
                            return Poll::Ready(Err(error));
                        }
                        Ok(None) => {
                            let admit = this.capacity.admit(work);
                            this.phase.set(Phase::Capacity {
                                admit,
                                refund: None,
                            });
                        }
                        Ok(Some(record)) => {
                            record.asked(*this.units);
                            let phase =
                                under_quota(record, this.capacity, work, *this.units, false);
                            this.phase.set(phase);
                        }
                    }
                }
                PhaseProjection::Quota {
                    admit,
                    queued,
                    work,
                    looked_again,
                    weighed,
                } => {
                    let record = &queued.0;
                    let polled = admit.poll(cx);
                    if polled.is_pending() && !*weighed {
                        *weighed = true;
                        // It has to wait: refused at once if the refill
                        // cannot cover it before its deadline.
                        let deadline = work.as_ref().and_then(WorkInfo::deadline);
                        let wait = deadline.and_then(|_| record.expected_wait(*this.units));
                        if let (Some(deadline), Some(retry_after)) = (deadline, wait) {
                            let now = tokio::time::Instant::now();
                            if now
                                .checked_add(retry_after)
                                .is_none_or(|ready| ready > deadline)
                            {
                                record.refused.fetch_add(1, Ordering::Relaxed);
                                crate::export::quota_over_quota();
                                // Done drops the wait: it leaves the queue.
                                this.phase.set(Phase::Done);
                                return Poll::Ready(Err(AdmitError::OverQuota { retry_after }));
                            }
                        }
                    }
                    let error = match ready!(polled) {
                        Ok(permit) => {
                            // Tokens are consumed at the grant; the permit
                            // holds nothing.
                            drop(permit);
                            let Some(work) = work.take() else {
                                unreachable!("the work is taken once, on leaving Quota");
                            };
                            let record = record.clone();
                            let admit = this.capacity.admit(work);
                            this.phase.set(Phase::Capacity {
                                admit,
                                refund: Some(record),
                            });
                            continue;
                        }
                        Err(error) => error,
                    };
                    // A record forgotten by the leasing thread between the
                    // lookup and the wait: look it up again, once.
                    if matches!(error, AdmitError::Closed)
                        && !*looked_again
                        && !this.quota.is_closed()
                    {
                        let Some(work) = work.take() else {
                            unreachable!("the work is taken once, on leaving Quota");
                        };
                        match this.quota.record(work.tenant()) {
                            Ok(Some(again)) => {
                                let phase =
                                    under_quota(again, this.capacity, work, *this.units, true);
                                this.phase.set(phase);
                                continue;
                            }
                            Ok(None) => {
                                let admit = this.capacity.admit(work);
                                this.phase.set(Phase::Capacity {
                                    admit,
                                    refund: None,
                                });
                                continue;
                            }
                            Err(error) => {
                                this.phase.set(Phase::Done);
                                return Poll::Ready(Err(error));
                            }
                        }
                    }
                    let error = match error {
                        // Not the quota's doing: the caller's deadline, the
                        // runtime, the node shutting down.
                        AdmitError::DeadlinePassed
                        | AdmitError::TimerUnavailable
                        | AdmitError::Closed => error,
                        _ => {
                            record.refused.fetch_add(1, Ordering::Relaxed);
                            crate::export::quota_over_quota();
                            AdmitError::OverQuota {
                                retry_after: record.retry_after(*this.units),
                            }
                        }
                    };
                    this.phase.set(Phase::Done);
                    return Poll::Ready(Err(error));
                }
                PhaseProjection::Capacity { admit, refund } => {
                    let result = ready!(admit.poll(cx));
                    let refund = refund.take();
                    if result.is_err() {
                        if let Some(record) = refund {
                            record.refund(*this.units);
                        }
                    }
                    this.phase.set(Phase::Done);
                    return Poll::Ready(result);
                }
                PhaseProjection::Done => panic!("`QuotaAdmit` polled after it completed"),
            }
        }
    }
}

impl<G: Granter> FusedFuture for QuotaAdmit<G> {
    fn is_terminated(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }
}

#[pinned_drop]
impl<G: Granter> PinnedDrop for QuotaAdmit<G> {
    fn drop(self: Pin<&mut Self>) {
        let this = self.project();
        let units = *this.units;
        if let PhaseProjection::Capacity { refund, .. } = this.phase.project() {
            // Dropped while waiting for capacity: the work never ran. The
            // capacity admit, dropped after this, leaves its queue.
            if let Some(record) = refund.take() {
                record.refund(units);
            }
        }
    }
}

impl<G: Granter> std::fmt::Debug for QuotaAdmit<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match &self.phase {
            Phase::Start(_) => "start",
            Phase::Quota { .. } => "quota",
            Phase::Capacity { .. } => "capacity",
            Phase::Done => "done",
        };
        f.debug_struct("QuotaAdmit")
            .field("phase", &phase)
            .field("units", &self.units)
            .finish()
    }
}
