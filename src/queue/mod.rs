//! The WorkQueue: the requester that holds waiting work in order and the
//! [`Admit`] future through which a handler waits in it.
//!
//! One `WorkQueue` fronts one [`Granter`]. Work arrives through
//! [`WorkQueue::admit`]; the returned future, on its first poll, is admitted
//! at once if nobody is waiting and the granter has capacity (the fast path),
//! and otherwise waits in the queue, ordered by tenant fairness, then
//! priority, then create time. Capacity that comes back (a [`SlotPermit`]
//! dropped, a raised total) is handed directly to the first waiter in that
//! order, under the queue's lock, and the waiter is woken after the lock is
//! released. The state machine itself is in `state.rs`; the lane, through
//! which a slot queue admits and releases without its lock while nobody
//! waits, in `lane.rs`.

mod admit;
mod arrivals;
mod drain;
mod epoch;
mod hold;
mod lane;
mod level;
mod order;
mod pacing;
mod permit;
mod ready;
mod runnable;
mod state;
mod tenant;
mod tokens;
mod wake;
mod work;

#[cfg(loom)]
#[doc(hidden)]
pub mod loom_models;

#[cfg(test)]
mod arrivals_tests;

pub use admit::Admit;
#[cfg(feature = "tower")]
pub(crate) use hold::Hold;
pub use hold::Run;
pub use permit::{GiveWay, ReleaseDuring, SlotPermit};
pub use tokens::TokenQueues;

use std::fmt;
use std::time::Duration;

use rustc_hash::FxHashMap;

pub(crate) use self::level::QueueLoad;
use self::state::{Charge, Limits, QueueState};
use self::wake::WakeList;
#[cfg(test)]
pub(crate) use self::work::PriorityHolds;
pub(crate) use self::work::WorkWindow;
use crate::error::ConfigError;
use crate::grant::{Granter, Grants, Requester, SlotGranter, SlotSnapshot};
use crate::health::Boundary;
use crate::observe::QueueSnapshot;
use crate::policy::EpochLifo;
use crate::sync::{Arc, Mutex, StdArc};
use crate::work::{TenantId, TenantWeight, WorkInfo};

/// How a tenant's usage, which orders tenants, is counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Usage {
    /// Slots held now: charged at admission, returned at completion. Shares
    /// follow the weights only while the slot total is large next to the
    /// number of waiting tenants (with 2 slots and 4 tenants, whoever holds
    /// nothing goes next, whatever its weight).
    Held,
    /// Slots granted since the last reset: charged at admission and kept
    /// until the periodic reset, so that over each reset period tenants are
    /// admitted in proportion to their weights however few slots there are.
    /// The default: with two slots and weights 1:4, slots held gave the two
    /// tenants 1:1.
    #[default]
    Granted,
}

/// A name for a queue built without one: `default`, then `default-2`,
/// `default-3`... in the order the process builds them, so that two
/// unnamed queues never share a metric series.
fn unnamed_queue() -> StdArc<str> {
    static UNNAMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    match UNNAMED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
        0 => StdArc::from("default"),
        n => StdArc::from(format!("default-{}", n.saturating_add(1))),
    }
}

/// How many tenants get their new weight per lock acquisition when the whole
/// weight table is replaced.
const WEIGHT_BATCH: usize = 64;

/// What the queue and every future and permit of it share.
pub(crate) struct Shared<G: Granter> {
    locked: Mutex<Locked<G>>,
    granter: G,
    /// Every call into the granter goes through it (see `Grants`).
    granter_boundary: Boundary,
    /// The `queue` label of every metric the queue exports, and the keys
    /// of its per-request series.
    keys: crate::export::QueueKeys,
    /// The admission level, as the queue's state publishes it (see
    /// `level.rs`).
    level: crate::sync::StdArc<crate::sync::StdAtomicU64>,
    /// Held work woken and not yet polled, by priority (see `hold.rs`).
    runnable: crate::sync::StdArc<runnable::RunnableHolds>,
    /// Admission without the lock while nobody waits (see `lane.rs`):
    /// only ever open in front of a slot granter.
    lane: lane::Lane,
}

/// Everything behind the queue's one lock.
struct Locked<G: Granter> {
    queue: QueueState,
    granter: G::State,
    /// Units whose return to the granter panicked (see `Grants`).
    owed: u64,
}

impl<G: Granter> Shared<G> {
    /// The queue's lock, with the lane closed and its counts folded into
    /// the queue's books (see `lane.rs`): the only way to the state, so that
    /// whatever runs under the lock sees every admission made without it.
    #[inline]
    fn lock(&self) -> crate::sync::MutexGuard<'_, Locked<G>> {
        let mut locked = self.locked.lock();
        if let Some(counts) = self.lane.close() {
            locked.queue.fold_lane(counts);
        }
        locked
    }

    /// Runs `f` on the state under the lock, then wakes whatever it
    /// collected once the lock is released.
    #[inline]
    fn with_state<R>(
        &self,
        f: impl FnOnce(&mut QueueState, &mut Grants<'_, G>, &mut WakeList) -> R,
    ) -> R {
        let mut wakes = WakeList::default();
        let result = {
            let mut locked = self.lock();
            let Locked {
                queue,
                granter,
                owed,
            } = &mut *locked;
            let mut grants = Grants {
                granter: &self.granter,
                state: granter,
                boundary: &self.granter_boundary,
                owed,
            };
            f(queue, &mut grants, &mut wakes)
        };
        wakes.wake_all();
        result
    }

    /// Runs `f` on the queue state alone, under the lock.
    fn with_queue<R>(&self, f: impl FnOnce(&mut QueueState) -> R) -> R {
        f(&mut self.lock().queue)
    }

    #[inline]
    fn release(&self, tenant: TenantId, charge: Charge) {
        self.with_state(|state, granter, wakes| state.release(tenant, charge, granter, wakes));
    }

    /// Admission on the lane (see `lane.rs`), for a queue in front of the
    /// slot granter: one slot, not bypassing, its deadline (if any) not
    /// passed.
    #[inline]
    fn try_lane(&self, work: &WorkInfo) -> lane::LaneAdmit {
        let Some(slots) = crate::grant::as_slots(&self.granter) else {
            return lane::LaneAdmit::Declined;
        };
        if work.requested() != 1 || work.is_bypass() {
            return lane::LaneAdmit::Declined;
        }
        self.lane.try_admit(work.tenant(), work.priority(), || {
            // The clock only once the lane is open for this request; a
            // passed deadline is refused under the lock.
            let live = work
                .deadline()
                .is_none_or(|deadline| deadline > tokio::time::Instant::now());
            live && slots.take_within_total(1)
        })
    }

    /// After `work` was admitted under the lock: opens the lane for its
    /// tenant and priority, if the queue's state allows (see
    /// `QueueState::lane_for`) and the slot granter is in front of it with
    /// nothing owed. The lane's generation, which the admission's charge
    /// takes so that its release is counted there (its admission is in the
    /// books already); zero when the lane stays closed.
    fn open_lane_for(
        &self,
        work: &WorkInfo,
        queue: &mut QueueState,
        grants: &Grants<'_, G>,
    ) -> u32 {
        if crate::grant::as_slots(&self.granter).is_none()
            || *grants.owed != 0
            || !queue.lane_for(work)
        {
            return 0;
        }
        queue.lane_opened(work.tenant(), work.priority());
        self.lane.open(work.tenant(), work.priority())
    }

    /// The release of a permit admitted on the lane: the slot back to the
    /// granter, then the release counted on the lane, or booked under the
    /// lock if the lane closed since. `false` (nothing done) if the slot
    /// could not go back that way.
    #[inline]
    fn release_on_lane(&self, tenant: TenantId, charge: Charge) -> bool {
        let Some(slots) = crate::grant::as_slots(&self.granter) else {
            return false;
        };
        if !slots.give_back_held(charge.units()) {
            return false;
        }
        if !self.lane.try_release(charge.lane) {
            self.release(tenant, charge.slot_returned());
        }
        true
    }
}

impl Shared<SlotGranter> {
    /// Whether the holder of `charge` gives its slots to a waiter of higher
    /// priority (see `QueueState::give_way`).
    fn give_way(&self, tenant: TenantId, charge: &mut Charge) -> bool {
        self.with_state(|state, grants, wakes| {
            // Slots only: what the grant loop will find free once the
            // holder's are back (none of it while the total is not
            // enforced, when nobody waits).
            let slots = grants
                .granter
                .is_enforcing()
                .then(|| grants.granter.snapshot(grants.state));
            state.give_way(tenant, charge, slots, grants, wakes)
        })
    }
}

/// A queue of work waiting for one resource, ordered by (tenant fairness,
/// priority, create time).
///
/// A cheap handle: clones share the same queue. See the
/// [crate documentation](crate) for the design and a quick start.
pub struct WorkQueue<G: Granter = SlotGranter> {
    shared: Arc<Shared<G>>,
}

impl<G: Granter> Clone for WorkQueue<G> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: self.shared.clone(),
        }
    }
}

impl<G: Granter> fmt::Debug for WorkQueue<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let locked = self.shared.lock();
        f.debug_struct("WorkQueue")
            .field("waiting", &locked.queue.waiting())
            .field("closed", &locked.queue.is_closed())
            .field("granter", &self.shared.granter)
            .field("granter_state", &locked.granter)
            .finish()
    }
}

impl WorkQueue<SlotGranter> {
    /// A slot queue with `total_slots` slots and default settings.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `total_slots` if it exceeds
    /// [`SlotGranter::MAX_TOTAL`](crate::grant::SlotGranter::MAX_TOTAL).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// let queue = WorkQueue::new(4)?;
    /// let permit = queue.admit(WorkInfo::new(TenantId::new(1), Priority::NORMAL)).await?;
    /// assert_eq!(queue.granter_snapshot().used, 1);
    /// drop(permit); // the slot goes back, or to the next waiter
    /// assert_eq!(queue.granter_snapshot().used, 0);
    ///
    /// // More slots than a ledger can count are refused.
    /// let too_many = admission::grant::SlotGranter::MAX_TOTAL + 1;
    /// assert_eq!(WorkQueue::new(too_many).unwrap_err().field(), "total_slots");
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(total_slots: u64) -> Result<Self, ConfigError> {
        Self::builder().total_slots(total_slots).build()
    }

    /// A builder with the default settings.
    pub fn builder() -> WorkQueueBuilder {
        WorkQueueBuilder::default()
    }

    /// Moves the slot total and grants waiters any capacity it opened.
    /// Lowering the total revokes no granted slot.
    ///
    /// Waiters asking for more slots than the new total (and the
    /// [ceiling](SlotGranter::set_ceiling), if one is set) fail with
    /// [`AdmitError::NeverFits`](crate::AdmitError::NeverFits).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `total_slots` if `total` exceeds
    /// [`SlotGranter::MAX_TOTAL`](crate::grant::SlotGranter::MAX_TOTAL); the
    /// total is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::WorkQueue;
    ///
    /// let queue = WorkQueue::new(4).unwrap();
    /// queue.set_total_slots(8).unwrap();
    /// assert_eq!(queue.granter_snapshot().total, 8);
    /// // Past the most a ledger can count is refused, and the total stays.
    /// assert!(queue.set_total_slots(u64::MAX).is_err());
    /// assert_eq!(queue.granter_snapshot().total, 8);
    /// ```
    pub fn set_total_slots(&self, total: u64) -> Result<(), ConfigError> {
        self.shared.granter.set_total(total)?;
        self.shared.with_state(|queue, grants, wakes| {
            queue.refuse_unfit(grants, wakes);
            queue.grant_waiting(grants, wakes);
        });
        Ok(())
    }

    /// Reads the slot levels and moves the total in one step under the
    /// queue's lock, so the decision and its effect see the same state:
    /// `decide` gets the current levels and whether requests wait that a
    /// larger total would admit, and returns the new total, if any.
    /// Capacity the change opens is granted at once.
    pub(crate) fn adjust_total(
        &self,
        decide: impl FnOnce(SlotSnapshot, bool) -> Option<u64>,
    ) -> Result<SlotSnapshot, ConfigError> {
        self.shared.with_state(|queue, grants, wakes| {
            let before = grants.granter.snapshot(grants.state);
            if let Some(total) = decide(before, queue.waits_for_total()) {
                grants.granter.set_total(total)?;
                if total > before.total {
                    queue.grant_waiting(grants, wakes);
                } else if total < before.total {
                    queue.refuse_unfit(grants, wakes);
                }
            }
            Ok(before)
        })
    }

    /// Sets the queue-level gauges of the [`export`](crate::export) module
    /// (queue length per priority, slots used and total). The CPU controller calls this
    /// every tick; call it on a timer for a queue without one. Does nothing
    /// without the `metrics` feature.
    pub fn record_metrics(&self) {
        #[cfg(feature = "metrics")]
        {
            let locked = self.shared.lock();
            let slots = self.shared.granter.snapshot(&locked.granter);
            let by_priority: Vec<_> = locked
                .queue
                .priority_snapshot()
                .into_iter()
                .map(|p| (p.priority, p.waiting))
                .collect();
            drop(locked);
            crate::export::queue_levels(
                self.shared.keys.name(),
                &by_priority,
                slots.used,
                slots.total,
            );
        }
    }

    /// The holds completed since the last call (a queue built to
    /// `report_work`), and sets the concurrency at or below which admitted
    /// work counts as having had the CPU to itself.
    pub(crate) fn take_work(&self, base_concurrency: u64) -> WorkWindow {
        self.shared.with_queue(|queue| {
            queue.set_base_concurrency(base_concurrency);
            queue.take_work()
        })
    }

    /// Switches slot enforcement (the CPU controller's idle mode); see
    /// `SlotGranter::set_enforcing`. Switching it off grants every waiter at
    /// once.
    pub(crate) fn set_enforcing(&self, enforcing: bool) {
        self.shared.granter.set_enforcing(enforcing);
        if !enforcing {
            self.granted();
        }
    }
}

impl<G: Granter> WorkQueue<G> {
    /// Asks for admission for `work`.
    ///
    /// Nothing happens until the returned future is polled. It resolves to a
    /// [`SlotPermit`] that holds the admitted capacity until it is dropped, or
    /// to an [`AdmitError`](crate::AdmitError).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses no capacity: a queued request
    /// leaves the queue, and a grant it had not yet seen goes to the next
    /// waiter.
    ///
    /// # Errors
    ///
    /// The future resolves to an [`AdmitError`](crate::AdmitError): `QueueFull`
    /// when `max_waiters` requests wait already, `Closed` for a closed queue,
    /// `DeadlinePassed` or `DeadlineExceeded` for the request's deadline,
    /// `WouldMissDeadline` with early rejection, `NeverFits` for more than the
    /// queue can ever grant one request, `TimerUnavailable` for a deadline
    /// where no tokio timer runs.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// let queue = WorkQueue::new(1)?;
    /// let first = queue.admit(WorkInfo::new(TenantId::new(1), Priority::NORMAL)).await?;
    /// // The only slot is held: a request that cannot wait 10 ms is refused.
    /// let hurried = WorkInfo::builder()
    ///     .tenant(TenantId::new(2))
    ///     .timeout(Duration::from_millis(10))
    ///     .build();
    /// let refused = queue.admit(hurried).await;
    /// assert!(matches!(refused, Err(AdmitError::DeadlineExceeded { .. })));
    /// drop(first);
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit(&self, work: WorkInfo) -> Admit<G> {
        Admit::new(self.shared.clone(), work)
    }

    /// The queue's name, its `queue` metric label; see
    /// [`WorkQueueBuilder::name`].
    pub fn name(&self) -> &str {
        self.shared.keys.name()
    }

    /// Closes the queue: every waiting request fails with
    /// [`AdmitError::Closed`](crate::AdmitError::Closed), and so does every
    /// later one. Permits already granted stay valid and return their
    /// capacity as usual.
    pub fn close(&self) {
        self.shared.with_state(|state, _, wakes| state.close(wakes));
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.shared.with_queue(|queue| queue.is_closed())
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.shared.with_queue(|queue| queue.waiting())
    }

    /// The granter this queue admits against.
    pub fn granter(&self) -> &G {
        &self.shared.granter
    }

    /// Sets one tenant's weight, effective for the next grant.
    ///
    /// Weights are configuration: they stay until set back to the default
    /// ([`TenantWeight::default`]) or replaced by
    /// [`set_tenant_weights`](Self::set_tenant_weights), whether or not the
    /// tenant is seen again. So at most
    /// [`max_tenants`](WorkQueueBuilder::max_tenants) tenants may have a
    /// weight other than the default; past that, a new one is refused with
    /// a [`ConfigError`] naming `tenant_weight` (a weight per request, keyed
    /// by ids that callers choose, would otherwise grow the table for good).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `tenant_weight` when `tenant` has no weight of
    /// its own yet, `weight` is not the default, and `max_tenants` tenants
    /// have one already; nothing changes then.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::{TenantId, TenantWeight, WorkQueue};
    ///
    /// let queue = WorkQueue::builder().total_slots(4).max_tenants(2).build().unwrap();
    /// // Under contention, tenant 1 gets twice tenant 2's share of the slots,
    /// // and four times that of a tenant with the default weight (1).
    /// queue.set_tenant_weight(TenantId::new(1), TenantWeight::new(4).unwrap()).unwrap();
    /// queue.set_tenant_weight(TenantId::new(2), TenantWeight::new(2).unwrap()).unwrap();
    /// // The weight table is bounded: a third weighted tenant is refused.
    /// let error = queue
    ///     .set_tenant_weight(TenantId::new(3), TenantWeight::new(2).unwrap())
    ///     .unwrap_err();
    /// assert_eq!(error.field(), "tenant_weight");
    /// ```
    pub fn set_tenant_weight(
        &self,
        tenant: TenantId,
        weight: TenantWeight,
    ) -> Result<(), ConfigError> {
        self.shared
            .with_queue(|queue| queue.set_weight(tenant, Some(weight)))
    }

    /// Replaces every tenant's weight: tenants not listed go back to the
    /// default. The lock is held only to swap the table and then to update
    /// tracked tenants in small batches, so admissions proceed meanwhile.
    /// More than [`max_tenants`](WorkQueueBuilder::max_tenants) weights
    /// other than the default are refused with a [`ConfigError`] naming
    /// `tenant_weight`, and the table is left as it was.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `tenant_weight` when more than `max_tenants`
    /// of `weights` are not the default; the table is left as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::{TenantId, TenantWeight, WorkQueue};
    ///
    /// let queue = WorkQueue::new(4).unwrap();
    /// let weight = |w| TenantWeight::new(w).unwrap();
    /// queue
    ///     .set_tenant_weights([(TenantId::new(1), weight(4)), (TenantId::new(2), weight(2))])
    ///     .unwrap();
    /// // Tenants left out go back to the default weight.
    /// queue.set_tenant_weights([(TenantId::new(2), weight(2))]).unwrap();
    /// ```
    pub fn set_tenant_weights(
        &self,
        weights: impl IntoIterator<Item = (TenantId, TenantWeight)>,
    ) -> Result<(), ConfigError> {
        let max = self.shared.with_queue(|queue| queue.max_weighted_tenants());
        let table: FxHashMap<TenantId, TenantWeight> = weights
            .into_iter()
            .filter(|&(_, weight)| weight != TenantWeight::default())
            .take(max.saturating_add(1))
            .collect();
        if table.len() > max {
            return Err(QueueState::too_many_weights(max));
        }
        let tracked = self.shared.with_queue(|queue| queue.replace_weights(table));
        for batch in tracked.chunks(WEIGHT_BATCH) {
            self.shared.with_queue(|queue| {
                for &tenant in batch {
                    queue.refresh_weight(tenant);
                }
            });
        }
        Ok(())
    }

    /// Periodic upkeep: runs the usage reset if it is due, and, on a queue
    /// with [grant pacing](WorkQueueBuilder::grant_burst), lets grants
    /// resume if they have been held back by grants nobody observed for
    /// longer than the pacing timeout.
    ///
    /// The queue runs the reset itself whenever a request has to wait, which
    /// is the only time the fair-share order matters; a driver (such as the
    /// [CPU controller](crate::cpu::Controller), every tick) calls this so
    /// that idle tenants are dropped on schedule and pacing cannot stall.
    pub fn maintain(&self) {
        let now = tokio::time::Instant::now();
        self.shared
            .with_state(|queue, grants, wakes| queue.maintain(now, grants, wakes));
    }

    /// The admission level: the lowest priority the queue still admits now,
    /// from the outcomes of its recent requests (see `level.rs` for the
    /// rule), as of the last outcome counted. One atomic load: no lock,
    /// no clock.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn admission_level(&self) -> crate::work::Priority {
        level::read_published(&self.shared.level)
    }

    /// The queue's side of a load report (queue length, work in flight,
    /// completion rate, recent median wait), in one turn of the lock.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn load(&self) -> QueueLoad {
        self.shared.with_queue(|queue| queue.load())
    }

    /// The granter's state alone, cheaper than a full [`snapshot`](Self::snapshot).
    pub fn granter_snapshot(&self) -> G::Snapshot {
        let locked = self.shared.lock();
        self.shared.granter.snapshot(&locked.granter)
    }

    /// A consistent copy of the queue's counters and state.
    pub fn snapshot(&self) -> QueueSnapshot<G::Snapshot> {
        let locked = self.shared.lock();
        QueueSnapshot {
            waiting: locked.queue.waiting(),
            closed: locked.queue.is_closed(),
            priorities: locked.queue.priority_snapshot(),
            tenants: locked.queue.tenant_snapshot(),
            granter: self.shared.granter.snapshot(&locked.granter),
            granter_health: self.shared.granter_boundary.health(),
            epoch_lifo: locked.queue.epoch_lifo(),
            kept_for_arrivals: locked.queue.kept_for_arrivals(),
        }
    }
}

impl<G: Granter> Requester for WorkQueue<G> {
    fn has_waiting_requests(&self) -> bool {
        self.waiting() > 0
    }

    fn granted(&self) -> u64 {
        self.shared
            .with_state(|state, granter, wakes| state.grant_waiting(granter, wakes))
    }
}

/// Settings for a [`WorkQueue`], validated by `build`.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct WorkQueueBuilder {
    total_slots: u64,
    max_waiters: usize,
    reset_period: Duration,
    grant_burst: Option<usize>,
    grant_burst_timeout: Duration,
    epoch_lifo: Option<EpochLifo>,
    epoch_lifo_from_deadlines: bool,
    early_rejection: bool,
    usage: Usage,
    elastic_share: Option<f64>,
    max_tenants: usize,
    newcomers_behind: bool,
    /// `None`: a name of its own, chosen at build (`unnamed_queue`).
    name: Option<StdArc<str>>,
    report_work: bool,
    arrivals_waiting: Option<fn() -> bool>,
}

impl Default for WorkQueueBuilder {
    fn default() -> Self {
        WorkQueueBuilder {
            total_slots: 1,
            max_waiters: Self::DEFAULT_MAX_WAITERS,
            reset_period: Self::DEFAULT_RESET_PERIOD,
            grant_burst: None,
            grant_burst_timeout: Self::DEFAULT_GRANT_BURST_TIMEOUT,
            epoch_lifo: None,
            epoch_lifo_from_deadlines: false,
            early_rejection: false,
            usage: Usage::Granted,
            elastic_share: None,
            max_tenants: Self::DEFAULT_MAX_TENANTS,
            newcomers_behind: false,
            name: None,
            report_work: false,
            arrivals_waiting: None,
        }
    }
}

impl WorkQueueBuilder {
    /// Default bound on waiting requests.
    pub(crate) const DEFAULT_MAX_WAITERS: usize = 10_000;
    /// Default period of the fair-share usage reset (CockroachDB's).
    pub(crate) const DEFAULT_RESET_PERIOD: Duration = Duration::from_secs(1);
    /// Longest accepted reset period.
    pub(crate) const MAX_RESET_PERIOD: Duration = Duration::from_secs(24 * 60 * 60);
    /// Default time after which unobserved grants stop holding back pacing
    /// (CockroachDB's grant-chain termination delay).
    pub(crate) const DEFAULT_GRANT_BURST_TIMEOUT: Duration = Duration::from_millis(100);
    /// Default cap on tenant records; see [`max_tenants`](Self::max_tenants).
    pub(crate) const DEFAULT_MAX_TENANTS: usize = 65_536;

    /// Initial slot total of a slot queue (default 1); see
    /// [`WorkQueue::set_total_slots`]. Ignored by [`build_with`](Self::build_with).
    pub fn total_slots(mut self, total: u64) -> Self {
        self.total_slots = total;
        self
    }

    /// Most requests that may wait at once (default
    /// 10,000); one more is
    /// rejected with [`AdmitError::QueueFull`](crate::AdmitError::QueueFull).
    pub fn max_waiters(mut self, max_waiters: usize) -> Self {
        self.max_waiters = max_waiters;
        self
    }

    /// How often tenants' usage is forgotten and idle tenants dropped
    /// (default one second).
    pub fn reset_period(mut self, period: Duration) -> Self {
        self.reset_period = period;
        self
    }

    /// Grant pacing: at most `burst` grants may be outstanding, that is made
    /// to waiters whose futures have not yet run to observe them. When a
    /// burst of slots frees up at once, the queue hands out `burst` and waits
    /// for those tasks to start before handing out more, so a sampled
    /// overload signal gets to see their effect. Off by default; the CPU
    /// [`Controller`](crate::cpu::Controller) sets it to
    /// `workers × max(1, threshold / 4)`. Must be at least 1.
    pub fn grant_burst(mut self, burst: usize) -> Self {
        self.grant_burst = Some(burst);
        self
    }

    /// How long unobserved grants may hold pacing back before
    /// [`WorkQueue::maintain`] forgets them (default 100 ms).
    pub fn grant_burst_timeout(mut self, timeout: Duration) -> Self {
        self.grant_burst_timeout = timeout;
        self
    }

    /// Turns on epoch-LIFO: per tenant, priorities whose queueing delay has
    /// grown past `settings.lifo_delay` are served newest-first (by epoch)
    /// until it falls back, so that under sustained overload fresh requests
    /// still finish within their deadlines. Off by default. See [`EpochLifo`].
    /// Replaces [`epoch_lifo_from_deadlines`](Self::epoch_lifo_from_deadlines).
    pub fn epoch_lifo(mut self, settings: EpochLifo) -> Self {
        self.epoch_lifo = Some(settings);
        self.epoch_lifo_from_deadlines = false;
        self
    }

    /// Turns on epoch-LIFO with settings scaled to the deadlines requests
    /// carry: [`EpochLifo::for_deadline`] of the median time requests allow
    /// themselves (deadline minus create time), chosen once 32 requests with
    /// a deadline have been seen and again whenever that median reaches
    /// twice or half the scale in force, so that the settings always fit
    /// the deadlines within a factor of two. Requests without a deadline do not count; until enough carry
    /// one, everything is FIFO. On in
    /// [`ControllerBuilder::default_queue`](crate::cpu::ControllerBuilder::default_queue):
    /// fixed settings fit one deadline, and the upstream defaults
    /// ([`EpochLifo::UPSTREAM`], 105 ms) never act on requests whose
    /// deadlines are shorter than that. The settings in force are in
    /// [`QueueSnapshot::epoch_lifo`](crate::observe::QueueSnapshot::epoch_lifo).
    /// Replaces [`epoch_lifo`](Self::epoch_lifo).
    pub fn epoch_lifo_from_deadlines(mut self) -> Self {
        self.epoch_lifo = None;
        self.epoch_lifo_from_deadlines = true;
        self
    }

    /// Turns epoch-LIFO off (the default of a plain builder): requests of
    /// a priority are served oldest first.
    pub fn without_epoch_lifo(mut self) -> Self {
        self.epoch_lifo = None;
        self.epoch_lifo_from_deadlines = false;
        self
    }

    /// Turns on early rejection: a request with a deadline is refused with
    /// [`AdmitError::WouldMissDeadline`](crate::AdmitError::WouldMissDeadline)
    /// when it could not complete in time: at once, when the requests of its
    /// priority or higher already waiting (at the rate busy slots free up,
    /// the total over the typical hold, or the rate admitted work has
    /// recently been completing where that is faster) plus the time work
    /// typically holds a slot would outlast its deadline; and while it
    /// waits, when less time is left
    /// than work typically holds a slot. The queue then times how long each
    /// slot is held (two clock reads per admission). Off by default.
    pub fn early_rejection(mut self, on: bool) -> Self {
        self.early_rejection = on;
        self
    }

    /// How tenant usage is counted for the fair-share order (default
    /// [`Usage::Granted`]); see [`Usage`].
    pub fn usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    /// Caps elastic work (priority below zero: bulk and background jobs) at
    /// `share` of the granter's capacity (at least one slot), so that it
    /// never holds every slot when regular work arrives: with slots held
    /// for the length of a bulk chunk, regular work would otherwise wait
    /// behind them however high its priority. Elastic waiters beyond the cap
    /// wait even while slots are free; other tenants' regular work is
    /// granted past them. The cap holds only while regular work is about
    /// (it asked for admission during the current or the previous
    /// [`reset_period`](Self::reset_period)): with nothing else to run,
    /// elastic work may use every slot, and regular work arriving after a
    /// quiet spell waits for the elastic holds that are running (one bulk
    /// chunk) before the cap is back. Elastic work that offers its slot
    /// to higher priorities between chunks ([`SlotPermit::give_way`]) is
    /// not capped once it has: it gives its slot back when asked, which is
    /// what the cap is for. Nor is elastic work whose holds are like
    /// regular work's, where holds are timed (with
    /// [`early_rejection`](Self::early_rejection), or under a controller):
    /// its priority's typical hold at most twice the longest typical hold
    /// of a regular priority. It keeps an arrival waiting no longer than
    /// regular work in the same slots would, and capping it would only
    /// leave a slot idle. Between 0 (exclusive) and 1. Off by default;
    /// 0.5 in
    /// [`ControllerBuilder::default_queue`](crate::cpu::ControllerBuilder::default_queue).
    pub fn elastic_share(mut self, share: f64) -> Self {
        self.elastic_share = Some(share);
        self
    }

    /// Most tenant records the queue keeps (default
    /// 65,536, about 300 bytes
    /// each). Tenant ids often come from requests, so the table must not grow
    /// with every id a client makes up. Without anyone calling
    /// [`WorkQueue::maintain`], the queue sweeps its table whenever a new
    /// tenant would grow it past twice its live size (at least 1,024): the
    /// usage reset runs if it is due, then records with nothing charged or
    /// waiting are dropped. At this cap a sweep also drops records whose only
    /// content is usage charged since the last reset, so their fairness
    /// memory is lost early; records of tenants with waiting work are always
    /// kept (there are at most [`max_waiters`](Self::max_waiters) of them).
    /// At least 1.
    pub fn max_tenants(mut self, max: usize) -> Self {
        self.max_tenants = max;
        self
    }

    /// The queue's name: the `queue` label of every metric it exports (see
    /// [`export`](crate::export)), so that two queues of one process (a CPU
    /// queue and an IO queue, say) keep apart series. Must not be empty.
    /// Unnamed queues get names of their own: `default` for the first one
    /// a process builds, then `default-2`, `default-3`... so that two never
    /// share a series; name them to keep their series across restarts.
    pub fn name(mut self, name: impl Into<StdArc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Starts a tenant the queue has not seen (since the last usage reset)
    /// just behind the least-served waiting tenant instead of at zero
    /// usage. Off by default, which is the classic fair share: a tenant
    /// holding nothing goes first.
    ///
    /// Turn it on where callers choose their tenant ids (from a header,
    /// even a trusted one): otherwise a client that uses a fresh id per
    /// request sorts ahead of every tenant that holds a slot and wins most
    /// freed slots against a steady tenant. With it, being new buys
    /// nothing; the price is that a genuinely new tenant waits behind the
    /// tenant at the front of the order for its first grant, and, with
    /// [`Usage::Held`], carries that standing until the next usage reset
    /// ([`reset_period`](Self::reset_period)). Work admitted at once
    /// (bypass, or the fast path when nobody waits) is unaffected.
    pub fn newcomers_start_behind(mut self, on: bool) -> Self {
        self.newcomers_behind = on;
        self
    }

    /// Times every admission's hold and reports completions to a driver
    /// (the CPU controller's second signal): two clock reads per admission.
    pub(crate) fn report_work(mut self) -> Self {
        self.report_work = true;
        self
    }

    /// Keeps a returned slot back while a task a worker or more waits in
    /// the releasing task's runtime's global queue, for the next request
    /// to ask (see
    /// [`ControllerBuilder::arrivals_first`](crate::cpu::ControllerBuilder::arrivals_first)
    /// and `arrivals.rs`). Only for a queue that something maintains every
    /// few milliseconds (the controller's tick), which grants a slot kept
    /// back for arrivals that did not come.
    pub(crate) fn arrivals_first(mut self, on: bool) -> Self {
        self.arrivals_waiting = on.then_some(arrivals::waiting_in_runtime as fn() -> bool);
        self
    }

    /// Arrivals first, with `check` saying whether arrivals wait where the
    /// runtime keeps them: for the loom models and the property test, which
    /// decide that themselves.
    #[cfg(any(test, loom))]
    pub(crate) fn arrivals_waiting_by(mut self, check: fn() -> bool) -> Self {
        self.arrivals_waiting = Some(check);
        self
    }

    /// A slot queue.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first setting out of its range
    /// (`total_slots`, `max_waiters`, `max_tenants`, `elastic_share`,
    /// `grant_burst`, `grant_burst_timeout`, `reset_period`, `name`), with
    /// the range it broke.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use admission::WorkQueue;
    ///
    /// let queue = WorkQueue::builder()
    ///     .name("search")
    ///     .total_slots(16)
    ///     .max_waiters(1_000)
    ///     .reset_period(Duration::from_secs(1))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(queue.name(), "search");
    ///
    /// let error = WorkQueue::builder().total_slots(u64::MAX).build().unwrap_err();
    /// assert_eq!(error.field(), "total_slots");
    /// ```
    pub fn build(self) -> Result<WorkQueue<SlotGranter>, ConfigError> {
        let granter = SlotGranter::new(self.total_slots)?;
        self.build_with(granter)
    }

    /// A queue in front of any granter.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first setting out of its range, as
    /// [`build`](Self::build).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use admission::grant::TokenGranter;
    /// use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// // A queue over a granter of its own: here a token bucket of 1,000 units.
    /// let queue = WorkQueue::builder().name("uploads").build_with(TokenGranter::new(1_000)?)?;
    /// let work = WorkInfo::builder()
    ///     .tenant(TenantId::new(1))
    ///     .priority(Priority::NORMAL)
    ///     .requested(200)
    ///     .build();
    /// let permit = queue.admit(work).await?;
    /// drop(permit); // tokens are consumed: nothing comes back
    /// # Ok(())
    /// # }
    /// ```
    pub fn build_with<G: Granter>(self, granter: G) -> Result<WorkQueue<G>, ConfigError> {
        if self.max_waiters == 0 {
            return Err(ConfigError::new(
                "max_waiters",
                "0 would reject every request that has to wait; use at least 1",
            ));
        }
        if self.reset_period.is_zero() || self.reset_period > Self::MAX_RESET_PERIOD {
            return Err(ConfigError::new(
                "reset_period",
                format!(
                    "{:?} is outside the accepted range (0s, {:?}]",
                    self.reset_period,
                    Self::MAX_RESET_PERIOD
                ),
            ));
        }
        if self.grant_burst == Some(0) {
            return Err(ConfigError::new(
                "grant_burst",
                "0 would never grant a waiter; use at least 1",
            ));
        }
        if self.grant_burst_timeout.is_zero() {
            return Err(ConfigError::new(
                "grant_burst_timeout",
                "must be longer than zero",
            ));
        }
        if let Some(settings) = &self.epoch_lifo {
            settings.validate()?;
        }
        if let Some(share) = self.elastic_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(ConfigError::new(
                    "elastic_share",
                    format!("{share} is outside the accepted range (0, 1]"),
                ));
            }
        }
        if self.name.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError::new(
                "name",
                "an empty name would be an empty `queue` label; leave it unset for one of its own",
            ));
        }
        if self.max_tenants == 0 {
            return Err(ConfigError::new(
                "max_tenants",
                "0 would forget every tenant's share at once; use at least 1",
            ));
        }
        let limits = Limits {
            max_waiters: self.max_waiters,
            reset_period: self.reset_period,
            grant_burst: self.grant_burst,
            grant_burst_timeout: self.grant_burst_timeout,
            epoch_lifo: self.epoch_lifo,
            epoch_lifo_from_deadlines: self.epoch_lifo_from_deadlines,
            early_rejection: self.early_rejection,
            usage: self.usage,
            elastic_share: self.elastic_share,
            max_tenants: self.max_tenants,
            newcomers_behind: self.newcomers_behind,
            report_work: self.report_work,
            arrivals_waiting: self.arrivals_waiting,
        };
        let queue = QueueState::new(limits);
        let level = queue.published_level();
        let locked = Locked {
            queue,
            granter: granter.initial_state(),
            owed: 0,
        };
        // Help text for the exporter; cheap and idempotent.
        crate::export::describe();
        Ok(WorkQueue {
            shared: Arc::new(Shared {
                locked: Mutex::new(locked),
                keys: crate::export::QueueKeys::new(self.name.unwrap_or_else(unnamed_queue)),
                level,
                runnable: crate::sync::StdArc::default(),
                lane: lane::Lane::new(),
                granter,
                granter_boundary: Boundary::new(
                    "granter",
                    "a panicking take admits unaccounted (fails open); a panicking return is retried",
                ),
            }),
        })
    }
}
