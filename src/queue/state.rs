//! The WorkQueue's state machine, free of futures and of tokio's runtime.
//!
//! # Implementation notes
//!
//! **Structure.** Everything lives in one [`QueueState`] behind one mutex
//! (see `queue/mod.rs`), together with the granter's own state, so the
//! granter is only ever consulted with that mutex held.
//! Waiters live in a slab; the slab key is the waiter's identity and is held
//! by its `Admit` future. Two levels give the order:
//!
//! * `tenant_order`: every tenant with at least one *waiting* request, in a
//!   [`FairOrder`] (a B-tree keyed by [`TenantOrder`], least `used / weight`
//!   first, with one tenant alone kept beside it).
//! * each tenant's ready set, in [`WaiterKey`] order (priority, then create
//!   time oldest-first, or newest-first for LIFO-marked work, then arrival):
//!   per-priority linked lists that take in-order arrivals and any cancel in
//!   O(1) (`ready.rs`); and its open-epoch B-tree for LIFO-marked work whose
//!   epoch has not closed (see `epoch.rs`; empty unless epoch-LIFO is on).
//!
//! A tenant's key embeds its `used`, so `used` or `weight` only ever changes
//! through [`QueueState::update_tenant`], which takes the key out of the tree
//! and puts it back.
//!
//! **Waiter states.** A waiter passes through:
//!
//! ```text
//!   (first poll) ──► Waiting ──grant──► Granted ──observe──► removed, Ok(permit)
//!                      │  └──deadline/expiry──► Expired ──observe──► removed, Err
//!                      └──close──► Closed ──observe──► removed, Err
//!   drop of the future in any state ──► removed (a Granted slot is passed on)
//! ```
//!
//! Only the grant loop, expiry and close move a waiter out of `Waiting`, all
//! under the lock; only the owning future removes its slab entry, so a slab
//! key is never reused while a future still holds it. A waiter in `Waiting`
//! is in exactly one tenant's ready or open set and its tenant is in
//! `tenant_order`; in every other state it is in neither.
//!
//! **Invariants** (checked by the property test and the loom models):
//! the granter's `used` equals the number of live permits plus the number of
//! `Granted` waiters; `waiting` equals the number of `Waiting` waiters; when
//! `waiting > 0`, the granter refused the last `try_get` (every path that
//! returns capacity runs the grant loop before releasing the lock), with one
//! exception: in a controller's queue, a release while tokio's global queue
//! holds a task a worker or more may keep its slot free for the next
//! request to ask
//! (`kept_for_arrivals`, one slot at a time; see `arrivals.rs`), and the
//! next `attempt`, whatever it answers, or the next grant loop, whatever
//! runs it, gives it out.
//!
//! **The uncontended path** is the first thing `attempt` tries: with nobody
//! waiting, the queue open, no epoch-LIFO state and no elastic share that
//! could hold the request back, it asks the granter and, granted, books the
//! admission in one pass (the priority's counters in one look-up, the
//! tenant's usage in one look-up of a record that has nothing waiting and so
//! no `tenant_order` key to move). It takes the lock like every other path,
//! and it keeps the invariants above as the long path does: the same
//! counters move by the same amounts (a test compares them), and anything it
//! does not handle, a refusal by the granter included, goes the long way.
//!
//! **The lane** (`lane.rs`) goes one step further, without the lock:
//! while nobody waits, an uncontended admission under the lock opens it for
//! its tenant and priority, and the next requests of that tenant and
//! priority take a slot from the slot granter's atomic count and count
//! themselves in one atomic word; their permits give the slot back the
//! same way. The books above are kept exact by folding the lane's counts
//! in at the start of every critical section (`Shared::lock`, then
//! [`QueueState::fold_lane`]), as if every one of those admissions and
//! releases had taken the lock: what decides the order once someone waits
//! (the tenant's usage) and what snapshots report are never behind. It
//! opens only where the lock path's plain booking is all an admission and
//! its release need (see [`QueueState::lane_for`]): no hold timed, so not
//! in a controller's queue; usage counting grants; nothing shed; one slot.
//! Counted under callgrind it takes an uncontended admit + release from
//! about 625 instructions to about 340, against 270 for tokio's semaphore.
//!
//! **Grant pacing** (`pacing.rs`) bounds grants made but not yet observed;
//! **epoch-LIFO** (`epoch.rs`) decides per tenant which priorities are served
//! newest-first; **early rejection** fails a request at once when the queue
//! ahead of it, at the recent completion rate, would outlast its deadline.
//!
//! **Fairness memory.** A tenant's `used` rises when it is admitted and (with
//! [`Usage::Held`]) falls when the work completes; with [`Usage::Granted`],
//! the default, it stays until the reset. Every `reset_period` all `used` are zeroed and
//! idle tenants are dropped (CockroachDB's one-second reset). To keep the
//! arithmetic exact across a reset, a permit remembers the `generation` in
//! which it was charged and only un-charges its tenant if no reset happened
//! since; work admitted before a reset is simply forgotten by the fairness
//! order, never subtracted twice. With `newcomers_start_behind`, a tenant
//! the queue has not seen starts just behind the least-served waiting
//! tenant, not at zero (`tenant::newcomer_used`), so a fresh tenant id buys
//! nothing.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::task::Waker;
use std::time::Duration;

use rustc_hash::FxHashMap;
use slab::Slab;
use tokio::time::Instant;

use super::drain::{Drain, RATE_WINDOW};
use super::epoch::{DeadlineScale, EpochLifo};
use super::level::{LevelWindows, QueueLoad};
use super::order::{FairOrder, OpenKey, Place, Recency, TenantOrder, WaiterKey};
use super::pacing::Pacing;
use super::ready::Entry;
use super::tenant::{newcomer_used, Seat, Tenant};
use super::wake::{FailedWait, WakeList};
use super::work::WorkWindow;
use super::Usage;
use crate::error::{AdmitError, ConfigError};
use crate::grant::{Granter, Grants, SlotSnapshot};
use crate::observe::{PrioritySnapshot, PriorityStats, TenantSnapshot};
use crate::sync::{StdArc, StdAtomicU64};
use crate::work::{Priority, TenantId, TenantWeight, WorkInfo};

/// Tenant records below this count are never garbage-collected early.
const MIN_GC_THRESHOLD: usize = 1024;

#[derive(Debug)]
enum WaiterState {
    Waiting {
        waker: Option<Waker>,
    },
    Granted {
        charge: Charge,
        pacing_epoch: u64,
    },
    Expired {
        waited: Duration,
    },
    /// Refused while waiting by early rejection.
    Refused(AdmitError),
    Closed,
}

#[derive(Debug)]
struct Waiter {
    tenant: TenantId,
    priority: Priority,
    /// Units asked for.
    count: u64,
    seat: Seat,
    deadline: Option<Instant>,
    enqueued_at: Instant,
    state: WaiterState,
}

impl Waiter {
    /// Work in progress asking for its slot again after a wait.
    fn is_resumed(&self) -> bool {
        matches!(
            self.seat,
            Seat::Ready(
                WaiterKey {
                    recency: Recency::Resumed(_),
                    ..
                },
                _
            )
        )
    }
}

/// What a permit carries back to the queue when its work completes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Charge {
    /// The reset generation its tenant was charged in.
    generation: u64,
    /// Units granted (slots).
    count: u64,
    /// The admitted work's priority.
    priority: Priority,
    /// When the slot was granted, if the queue times slot holds (for early
    /// rejection's expected service time).
    admitted_at: Option<Instant>,
    /// Whether the granter counted the units (not when it panicked and the
    /// queue failed open): only counted units are given back to it.
    accounted: bool,
    /// Units in flight when it was granted, its own included.
    concurrency: u64,
    /// The admitted work's deadline, to tell a late completion.
    deadline: Option<Instant>,
    /// Elastic work only: counted against the elastic share (`false` once
    /// the work has offered its slot to higher priorities, see
    /// `QueueState::give_way`).
    capped: bool,
    /// The lane's generation it was admitted on, without the lock (see
    /// `lane.rs`); zero when it was admitted under the lock.
    pub(crate) lane: u32,
}

impl Charge {
    /// The charge of a request admitted on the lane's opening of
    /// `generation`: what the lock path's plain admission would carry (one
    /// slot, counted, no hold timed, not elastic: the lane opens only
    /// where that is so; see `QueueState::lane_for`).
    pub(crate) fn on_lane(priority: Priority, deadline: Option<Instant>, generation: u32) -> Self {
        Charge {
            // The reset generation decides only whether a release un-charges
            // its tenant, which it never does where the lane opens (usage
            // counts grants): one no reset reaches.
            generation: u64::MAX,
            count: 1,
            priority,
            admitted_at: None,
            accounted: true,
            // Read only where completions are reported to a controller,
            // which times holds: never on the lane.
            concurrency: 0,
            deadline,
            capped: false,
            lane: generation,
        }
    }

    /// The same charge, booked under the lock from now on: the release of
    /// a lane admission whose slot is back with the granter already.
    pub(crate) fn slot_returned(self) -> Self {
        Charge {
            accounted: false,
            lane: 0,
            ..self
        }
    }

    /// Units granted.
    pub(crate) fn units(&self) -> u64 {
        self.count
    }

    /// Elastic units counted against the elastic share.
    fn capped_units(&self) -> u64 {
        if self.capped {
            self.count
        } else {
            0
        }
    }
}

/// What a first attempt at admission came to.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Admitted at once (fast path or bypass).
    Admitted { charge: Charge },
    /// Enqueued under this slab key at `since` (the clock read that
    /// queued it, which the future's span times the wait from).
    Queued { key: usize, since: Instant },
    /// Failed without queueing.
    Rejected(AdmitError),
}

/// Why the grant loop passes a waiter by and fails it.
#[derive(Debug)]
enum GrantRefusal {
    /// Its deadline passed.
    Expired,
    /// Early rejection: its priority's typical hold outlasts what is left.
    WouldMiss(AdmitError),
}

/// What polling a queued request came to.
#[derive(Debug)]
pub(crate) enum Observed {
    Pending,
    Admitted { charge: Charge, waited: Duration },
    Failed(AdmitError),
}

/// Static settings of a queue, validated by the builder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_waiters: usize,
    pub(crate) reset_period: Duration,
    pub(crate) grant_burst: Option<usize>,
    pub(crate) grant_burst_timeout: Duration,
    /// The initial epoch-LIFO settings; with `epoch_lifo_from_deadlines`,
    /// `None` until the deadlines requests carry choose them.
    pub(crate) epoch_lifo: Option<EpochLifo>,
    pub(crate) epoch_lifo_from_deadlines: bool,
    pub(crate) early_rejection: bool,
    pub(crate) usage: Usage,
    pub(crate) elastic_share: Option<f64>,
    pub(crate) max_tenants: usize,
    /// Start new tenants behind the waiting ones (`tenant::newcomer_used`).
    pub(crate) newcomers_behind: bool,
    /// Report every completion's hold to the controller (see `work.rs`).
    pub(crate) report_work: bool,
    /// With arrivals first (a controller's queue): whether requests wait
    /// where the runtime keeps them from the queue, so that a release keeps
    /// its slot back for them (see `arrivals.rs`).
    pub(crate) arrivals_waiting: Option<fn() -> bool>,
}

/// How many tenants' queues one `maintain` looks at the back of for
/// requests that can no longer make their deadlines, and how many requests
/// at the back of each.
const TAIL_TENANTS: usize = 64;
const TAIL_WAITERS: usize = 32;

/// How long `grants` grants take at `per_sec` a second. After a stall the
/// rate may be vanishingly small: the wait then saturates (and the request
/// is refused) rather than overflowing.
fn wait_for_grants(grants: u64, per_sec: f64) -> Duration {
    Duration::try_from_secs_f64(grants as f64 / per_sec).unwrap_or(Duration::MAX)
}

#[derive(Debug)]
pub(crate) struct QueueState {
    limits: Limits,
    closed: bool,
    waiters: Slab<Waiter>,
    waiting: usize,
    /// Waiting requests per priority byte, for early rejection.
    waiting_at: Box<[u32; 256]>,
    tenants: FxHashMap<TenantId, Tenant>,
    tenant_order: FairOrder,
    weights: FxHashMap<TenantId, TenantWeight>,
    next_seq: u64,
    /// Tenant records made so far: each record's `since`.
    records_made: u64,
    generation: u64,
    /// When the usage reset is next due (`None`: past the clock's range),
    /// checked on every enqueue by a comparison.
    next_reset: Option<Instant>,
    gc_threshold: usize,
    pacing: Pacing,
    /// Epoch-LIFO's settings now (the builder's, or chosen from the
    /// deadlines requests carry), time origin, and how many epochs have
    /// closed.
    lifo: Option<EpochLifo>,
    origin: Instant,
    closed_epochs: u64,
    /// With `epoch_lifo_from_deadlines`: the deadlines seen.
    deadline_scale: Option<DeadlineScale>,
    drain: Drain,
    /// Slots held by elastic (below-zero priority) work.
    elastic_held: u64,
    /// Regular (not elastic) requests since the last usage reset, and in
    /// the period before: the elastic share applies only while regular work
    /// is about (see `elastic_limit`).
    regular_requests: u64,
    regular_before: u64,
    /// Units granted and not yet given back (held by permits, or granted to
    /// waiters that have not observed it): tells a stall from an idle queue.
    in_flight: u64,
    /// With `report_work`: completions since the controller last looked,
    /// and the concurrency at or below which work has the CPU to itself.
    work: WorkWindow,
    base_concurrency: u64,
    /// A released slot left free for the next request to ask, while the
    /// runtime held arrivals (`arrivals_waiting`); the next grant loop gives
    /// it out. At most one at a time.
    kept_for_arrivals: bool,
    /// Releases that kept their slot back, for the snapshot.
    kept_for_arrivals_count: u64,
    stats: PriorityStats,
    /// Recent outcomes per priority, for the admission level (`level.rs`).
    level: LevelWindows,
    /// The tenant and priority the lane is open for (`lane.rs`), while it
    /// is: what its counts are folded in as.
    lane_open_for: Option<(TenantId, Priority)>,
}

impl QueueState {
    pub(crate) fn new(limits: Limits) -> Self {
        let now = Instant::now();
        QueueState {
            limits,
            closed: false,
            waiters: Slab::new(),
            waiting: 0,
            waiting_at: Box::new([0; 256]),
            tenants: FxHashMap::default(),
            tenant_order: FairOrder::default(),
            weights: FxHashMap::default(),
            next_seq: 0,
            records_made: 0,
            generation: 0,
            next_reset: now.checked_add(limits.reset_period),
            gc_threshold: MIN_GC_THRESHOLD.min(limits.max_tenants),
            pacing: Pacing::new(limits.grant_burst, limits.grant_burst_timeout),
            lifo: limits.epoch_lifo,
            origin: now,
            closed_epochs: 0,
            deadline_scale: limits
                .epoch_lifo_from_deadlines
                .then(DeadlineScale::default),
            drain: Drain {
                since: now,
                window_ends: now.checked_add(RATE_WINDOW),
                completions: 0,
                per_sec: 0.0,
                any_hold: None,
                last_event: None,
                hold: BTreeMap::new(),
            },
            elastic_held: 0,
            regular_requests: 0,
            regular_before: 0,
            in_flight: 0,
            work: WorkWindow::default(),
            base_concurrency: 0,
            kept_for_arrivals: false,
            kept_for_arrivals_count: 0,
            stats: PriorityStats::new(),
            level: LevelWindows::new(now),
            lane_open_for: None,
        }
    }

    /// Whether the lane (`lane.rs`) may open for `work`, just admitted at
    /// once: when every admission like it, until the lock is next taken,
    /// would be booked by the lock path's plain admission and release, so
    /// that booking them together later is the same. That is: nobody
    /// waits, the queue is open, no per-tenant order is kept that an
    /// admission moves (epoch-LIFO), no hold is timed (early rejection, a
    /// controller's second signal), usage counts grants (a release
    /// changes no tenant's standing), nothing is shed (an admission then
    /// rolls the level's windows), no slot is kept for arrivals; and the
    /// work is one regular, non-bypass slot.
    pub(crate) fn lane_for(&self, work: &WorkInfo) -> bool {
        self.waiting == 0
            && !self.closed
            && self.lane_open_for.is_none()
            && self.lifo.is_none()
            && self.deadline_scale.is_none()
            && !self.limits.early_rejection
            && !self.limits.report_work
            && self.limits.arrivals_waiting.is_none()
            && !self.kept_for_arrivals
            && self.limits.usage == Usage::Granted
            && self.level.is_admitting_all()
            && !work.is_bypass()
            && work.requested() == 1
            && !work.priority().is_elastic()
    }

    /// The lane is now open for `tenant` at `priority`.
    pub(crate) fn lane_opened(&mut self, tenant: TenantId, priority: Priority) {
        self.lane_open_for = Some((tenant, priority));
    }

    /// Books what the lane's last opening admitted and released, as the
    /// lock path would have booked each (`charge_at_once`, `forget`).
    pub(crate) fn fold_lane(&mut self, counts: super::lane::LaneCounts) {
        let Some((tenant, priority)) = self.lane_open_for.take() else {
            debug_assert!(false, "a lane closed that the queue did not open");
            return;
        };
        let super::lane::LaneCounts { admitted, released } = counts;
        if admitted > 0 {
            self.regular_requests = self.regular_requests.saturating_add(admitted);
            self.stats.admitted_at_once_many(priority, admitted);
            self.level.admitted_at_once_many(priority, admitted);
            self.tenant_record(tenant, false, |t| {
                t.used = t.used.saturating_add(admitted);
            });
            self.in_flight = self.in_flight.saturating_add(admitted);
        }
        self.in_flight = self.in_flight.saturating_sub(released);
        self.drain.completions = self.drain.completions.saturating_add(released);
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whether requests wait that a larger total would admit: the grant
    /// loop stops at pacing, at the total, or at the elastic share (a
    /// fraction of the total), so with requests waiting and pacing open,
    /// the total binds, whether or not every slot is in use. A slot kept
    /// back for arrivals is free by choice, not for want of one.
    pub(crate) fn waits_for_total(&self) -> bool {
        self.waiting > 0 && !self.pacing.is_full() && !self.kept_for_arrivals
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether work waits or holds capacity.
    fn is_busy(&self) -> bool {
        self.waiting > 0 || self.in_flight > 0
    }

    /// The first poll of an `Admit`: bypass, fail fast, take the fast path,
    /// or enqueue.
    /// `waker` is stored if the request has to wait, so the first poll of a
    /// queued request takes the lock once.
    pub(crate) fn attempt<G: Granter>(
        &mut self,
        work: &WorkInfo,
        resumed: bool,
        grants: &mut Grants<'_, G>,
        waker: &Waker,
        wakes: &mut WakeList,
    ) -> Attempt {
        let attempt = self.answer(work, resumed, grants, waker);
        if self.kept_for_arrivals {
            // The slot a release kept back for arrivals: one has asked, so
            // it goes to whoever is first now, this request included if it
            // queued. Whatever the answer: under overload most arrivals
            // taken in are refused at the door (a deadline spent in the
            // runtime's queue, early rejection), and a slot left for the
            // next one to queue sat idle with requests waiting.
            self.grant_waiting(grants, wakes);
        }
        attempt
    }

    /// What [`attempt`](Self::attempt) answers a request, before a slot
    /// kept for arrivals goes out.
    fn answer<G: Granter>(
        &mut self,
        work: &WorkInfo,
        resumed: bool,
        grants: &mut Grants<'_, G>,
        waker: &Waker,
    ) -> Attempt {
        let priority = work.priority();
        if !priority.is_elastic() {
            self.regular_requests = self.regular_requests.saturating_add(1);
        }
        // The clock is read only for work that has a deadline, and for
        // work that is about to queue: the fast path stays clock-free
        // (unless slot holds are timed, for early rejection or a
        // controller's second signal; see `charge_now`).
        let mut now = None;
        // The uncontended case first, in one pass: what the steps below
        // would decide when nobody waits, nothing is closed, no per-tenant
        // epoch state is kept and no elastic share can hold the request
        // back, without their separate look-ups. Anything else (and a
        // refusal by the granter) goes the long way, which then does not
        // ask the granter a second time.
        let mut refused = false;
        if !self.closed
            && self.waiting == 0
            && self.lifo.is_none()
            && !work.is_bypass()
            && !(priority.is_elastic() && self.limits.elastic_share.is_some())
        {
            let live = match work.deadline() {
                None => true,
                // A deadline seen by the epoch scale, or one already
                // passed, goes the long way.
                Some(deadline) => {
                    self.deadline_scale.is_none()
                        && deadline > *now.get_or_insert_with(Instant::now)
                }
            };
            if live {
                match grants.try_get(work.requested()) {
                    Some(accounted) => {
                        self.stats.admitted_at_once(priority, resumed);
                        return Attempt::Admitted {
                            charge: self.charge_at_once(work, accounted, now),
                        };
                    }
                    None => refused = true,
                }
            }
        }
        self.stats.requested(priority, resumed);
        if self.closed {
            return self.reject(work, AdmitError::Closed, None);
        }
        if self.lifo.is_some() {
            self.tenant_record(work.tenant(), !work.is_bypass(), |t| {
                t.states.requested(priority)
            });
        }
        if work.is_bypass() {
            let accounted = grants.took_without_permission(work.requested());
            return self.admit_at_once(work, accounted, None);
        }
        if let Some(deadline) = work.deadline() {
            let at = *now.get_or_insert_with(Instant::now);
            if deadline <= at {
                return self.reject(work, AdmitError::DeadlinePassed, now);
            }
            if let Some(scale) = &mut self.deadline_scale {
                scale.observe(deadline.saturating_duration_since(work.create_time()));
            }
        }
        // Only when no waiter could be granted: otherwise a newcomer would
        // overtake the queue's order whenever capacity happened to be free.
        // (Elastic work held back by its share does not count: the capacity
        // it may not take is free for others.)
        let elastic_full = self.elastic_full(self.elastic_limit(grants));
        let nobody_grantable =
            self.waiting == 0 || (elastic_full && self.next_grantee(elastic_full).is_none());
        let elastic_blocked = elastic_full && self.held_to_share(priority);
        if nobody_grantable && !elastic_blocked && !refused {
            if let Some(accounted) = grants.try_get(work.requested()) {
                return self.admit_at_once(work, accounted, now);
            }
        }
        if let Some(capacity) = grants.max_request() {
            let requested = work.requested();
            if requested > capacity {
                return self.reject(
                    work,
                    AdmitError::NeverFits {
                        requested,
                        capacity,
                    },
                    now,
                );
            }
        }
        // Resumed work was admitted once and is in progress: it is not new
        // load for a full queue to turn away, and early rejection's typical
        // hold is a whole request's, not the rest of one.
        if !resumed && self.waiting >= self.limits.max_waiters {
            let max_waiters = self.limits.max_waiters;
            return self.reject(work, AdmitError::QueueFull { max_waiters }, now);
        }
        let now = now.unwrap_or_else(Instant::now);
        self.maybe_reset(now);
        self.rescale_epochs(now);
        self.close_epochs(now);
        self.drain.update(now, self.is_busy());
        if !resumed {
            if let Some(error) = self.doomed(work, now, grants) {
                return self.reject(work, error, Some(now));
            }
        }
        let key = self.enqueue(work, resumed, now, waker);
        Attempt::Queued { key, since: now }
    }

    /// Admission without waiting (fast path or bypass): charged, counted
    /// with a zero wait. `now` if the clock was read for it.
    fn admit_at_once(&mut self, work: &WorkInfo, accounted: bool, now: Option<Instant>) -> Attempt {
        self.stats.admitted(work.priority(), Duration::ZERO);
        Attempt::Admitted {
            charge: self.charge_at_once(work, accounted, now),
        }
    }

    /// The books of an admission without waiting, but for the priority's
    /// counters: the tenant charged, the level, the charge the permit
    /// carries. `now` if the clock was read for it (the hold, if timed,
    /// starts then: the same critical section).
    #[inline]
    fn charge_at_once(&mut self, work: &WorkInfo, accounted: bool, now: Option<Instant>) -> Charge {
        let priority = work.priority();
        let count = work.requested();
        if priority.is_elastic() {
            self.elastic_held = self.elastic_held.saturating_add(count);
        }
        self.in_flight = self.in_flight.saturating_add(count);
        let epoch_lifo = self.lifo.is_some();
        let charge = move |t: &mut Tenant| {
            t.used = t.used.saturating_add(count);
            if epoch_lifo {
                t.states.admitted_at_once(priority);
            }
        };
        match self.tenants.get_mut(&work.tenant()) {
            // A tenant with nothing waiting has no `tenant_order` key to
            // move (see `update_tenant`): one look-up instead of three.
            Some(tenant) if !tenant.has_waiters() => charge(tenant),
            _ => {
                self.tenant_record(work.tenant(), false, charge);
            }
        }
        if !work.is_bypass() {
            self.level.admitted(priority, Duration::ZERO, now);
        }
        self.charge_now(priority, count, now, accounted, work.deadline())
    }

    /// How many slots elastic work may hold: its share of the granter's
    /// capacity, at least one; `None` (unlimited) without an elastic share
    /// or a capacity to take it of, or while no regular work has asked for
    /// admission in this usage-reset period or the one before: the share
    /// exists to keep slots for regular work, and capping elastic work with
    /// nobody else about would leave the rest of the capacity idle (and a
    /// controller would not add slots while some are free). Not a sentinel
    /// value: elastic work holding `u64::MAX` units (one absurd request)
    /// must not read as a full share on a queue that has none.
    fn elastic_limit<G: Granter>(&self, grants: &Grants<'_, G>) -> Option<u64> {
        let share = self.limits.elastic_share?;
        if self.regular_requests == 0 && self.regular_before == 0 {
            return None;
        }
        let capacity = grants.capacity()?;
        Some(((capacity as f64 * share).floor() as u64).max(1))
    }

    /// Whether a request of `priority` waits for the elastic share while
    /// elastic work holds all of it: elastic work whose holds are not like
    /// regular work's.
    ///
    /// The share keeps slots free for regular work that arrives while bulk
    /// work runs, so that it is not kept waiting for a long bulk hold to
    /// end. Elastic work that holds its slots about as long as regular work
    /// does (a low-priority class of the same requests) keeps an arrival
    /// waiting no longer than regular work in those slots would: capping it
    /// then only leaves a slot idle while it waits. Measured with the
    /// overload suite (2 workers, stable tokio, `yield_now` handlers): in
    /// W2, where the low class's requests are the others', a fixed total of
    /// two kept the workers busy 97.3-97.7% of the time with every elastic
    /// request held to the share against 98.9-99.1% without the share, the
    /// strict-priority yardstick's level; W5's bulk job, which holds its
    /// slot for 5 ms chunks beside a foreground of 0.5 ms requests, stays
    /// held to it. Holds are known only where they are timed (with early
    /// rejection, or under a controller): elsewhere every elastic request
    /// is held to the share.
    fn held_to_share(&self, priority: Priority) -> bool {
        priority.is_elastic() && !self.drain.holds_like_regular(priority)
    }

    /// Whether elastic work holds all it may.
    fn elastic_full(&self, limit: Option<u64>) -> bool {
        limit.is_some_and(|limit| self.elastic_held >= limit)
    }

    /// The first tenant in fair-share order whose next request may be
    /// granted now, and that request: a tenant whose next request is
    /// elastic is passed over while elastic work holds its share.
    fn next_grantee(&self, elastic_full: bool) -> Option<(TenantOrder, usize)> {
        self.tenant_order.find_map(|&order| {
            let record = self.tenants.get(&order.id)?;
            Some((order, self.grantable_first(record, elastic_full)?))
        })
    }

    /// A tenant's next request, unless it is elastic work held back by a
    /// full elastic share.
    fn grantable_first(&self, record: &Tenant, elastic_full: bool) -> Option<usize> {
        let slab_key = record.first()?;
        let blocked = elastic_full && self.held_to_share(self.waiters[slab_key].priority);
        (!blocked).then_some(slab_key)
    }

    /// The charge of a slot granted now; the clock is read only when slot
    /// holds are timed.
    #[inline]
    fn charge_now(
        &mut self,
        priority: Priority,
        count: u64,
        now: Option<Instant>,
        accounted: bool,
        deadline: Option<Instant>,
    ) -> Charge {
        let admitted_at = (self.limits.early_rejection || self.limits.report_work)
            .then(|| now.unwrap_or_else(Instant::now));
        if let Some(at) = admitted_at {
            self.drain.last_event = Some(at);
        }
        Charge {
            accounted,
            generation: self.generation,
            count,
            priority,
            admitted_at,
            concurrency: self.in_flight,
            deadline,
            capped: priority.is_elastic(),
            lane: 0,
        }
    }

    /// The holds completed since the last call (with `report_work`).
    pub(crate) fn take_work(&mut self) -> WorkWindow {
        std::mem::take(&mut self.work)
    }

    /// Work admitted with at most `base` units in flight counts as having
    /// had the CPU to itself (see `work.rs`).
    pub(crate) fn set_base_concurrency(&mut self, base: u64) {
        self.base_concurrency = base;
    }

    /// Refused at the first poll; `Admit` logs it once the lock is released.
    /// `now` if the clock was read for it.
    fn reject(&mut self, work: &WorkInfo, error: AdmitError, now: Option<Instant>) -> Attempt {
        self.stats.refused(work.priority(), &error);
        self.level.refused(work.priority(), &error, now);
        Attempt::Rejected(error)
    }

    /// With early rejection on: the error for a request that, at the rate
    /// the queue drains, would not complete before its deadline.
    ///
    /// The wait is estimated in grants: the waiting requests of its own
    /// tenant at its priority or higher (served before it), plus one grant
    /// for each other tenant ahead of its tenant in the fair-share order
    /// (each is served before it is), plus the grant of its own slot; at
    /// the drain rate ([`Drain::grants_per_sec`], with the granter's
    /// `capacity`), plus the time work typically holds a slot. The
    /// backlog of a heavier tenant does not count against a lighter one,
    /// which is served first.
    #[inline]
    fn doomed<G: Granter>(
        &mut self,
        work: &WorkInfo,
        now: Instant,
        grants: &Grants<'_, G>,
    ) -> Option<AdmitError> {
        let deadline = work.deadline()?;
        if !self.limits.early_rejection {
            return None;
        }
        self.doomed_by_drain(work, deadline, now, grants.capacity())
    }

    fn doomed_by_drain(
        &mut self,
        work: &WorkInfo,
        deadline: Instant,
        now: Instant,
        capacity: Option<u64>,
    ) -> Option<AdmitError> {
        // No completion yet (nor a window closed): nothing to estimate from.
        let per_sec = self.drain.grants_per_sec(capacity, now);
        if self.drain.per_sec <= 0.0 || per_sec <= 0.0 {
            return None;
        }
        let id = work.tenant();
        let (own, order) = match self.tenants.get(&id) {
            Some(tenant) => (
                tenant.waiting_at_or_above(work.priority()),
                tenant.order(id),
            ),
            None => {
                let weight = self.weights.get(&id).copied().unwrap_or_default();
                let front = self
                    .tenant_order
                    .first()
                    .filter(|_| self.limits.newcomers_behind);
                let used = newcomer_used(front, weight);
                (
                    0,
                    Tenant::new(weight, false, used, self.records_made).order(id),
                )
            }
        };
        let tenants_ahead = self
            .tenant_order
            .iter()
            .take_while(|&&other| other < order)
            .filter(|other| other.id != id)
            .count() as u64;
        let wait = wait_for_grants(own + tenants_ahead + 1, per_sec);
        let hold = self.drain.hold(work.priority()).unwrap_or_default();
        let expected = wait.saturating_add(hold);
        let remaining = deadline.saturating_duration_since(now);
        if expected <= remaining {
            return None;
        }
        // The wait alone would have made it: the hold estimate decided.
        if wait <= remaining {
            self.drain.refused_on_hold(work.priority());
            self.stats.refused_on_hold(work.priority());
        }
        Some(AdmitError::WouldMissDeadline {
            expected,
            remaining,
        })
    }

    /// Early rejection for work already waiting: refuses, from the back of
    /// each tenant's queue, the requests that the grants ahead of them, at
    /// the drain rate, would keep waiting past their deadlines.
    ///
    /// A request that would make its deadline when it arrives may not once
    /// it has waited: higher-priority work that arrived after it goes first,
    /// and under epoch-LIFO so does newer work of its own priority. Left to
    /// wait, it fails when its deadline passes, having told its caller
    /// nothing for the whole of it; refused as soon as its place says so,
    /// its caller learns it early, with a hint of when to come back. Only
    /// the wait counts here, not the hold after it: a request whose wait
    /// alone leaves it time but not enough for its work is refused by the
    /// grant loop when it reaches the front. Each tenant's queue is looked
    /// at from the back (where such requests gather: the newest arrivals in
    /// FIFO order, the oldest under LIFO), counting only the tenant's own
    /// requests ahead, so the estimate never exceeds the door's; resumed
    /// work and requests whose LIFO epoch is still open (which will move to
    /// the front of their priority) are left alone. The cost is bounded: at
    /// most [`TAIL_TENANTS`] tenants a call, the first in fair-share order,
    /// and [`TAIL_WAITERS`] requests of each; what lies beyond is looked at
    /// once the requests behind it have gone.
    fn refuse_doomed_tails(&mut self, now: Instant, capacity: Option<u64>, wakes: &mut WakeList) {
        if !self.limits.early_rejection || self.waiting == 0 {
            return;
        }
        let per_sec = self.drain.grants_per_sec(capacity, now);
        if self.drain.per_sec <= 0.0 || per_sec <= 0.0 {
            return;
        }
        let mut doomed = Vec::new();
        for order in self.tenant_order.iter().take(TAIL_TENANTS) {
            let Some(tenant) = self.tenants.get(&order.id) else {
                continue;
            };
            for (ahead, slab_key) in tenant.ready_last_first().take(TAIL_WAITERS) {
                let waiter = &self.waiters[slab_key];
                let Some(deadline) = waiter.deadline.filter(|_| !waiter.is_resumed()) else {
                    continue;
                };
                let wait = wait_for_grants(ahead.saturating_add(1), per_sec);
                let remaining = deadline.saturating_duration_since(now);
                if wait > remaining {
                    doomed.push((
                        slab_key,
                        AdmitError::WouldMissDeadline {
                            expected: wait,
                            remaining,
                        },
                    ));
                }
            }
        }
        for (slab_key, error) in doomed {
            self.fail_waiting(slab_key, now, WaiterState::Refused(error), wakes);
        }
    }

    fn enqueue(&mut self, work: &WorkInfo, resumed: bool, now: Instant, waker: &Waker) -> usize {
        let seq = self.next_seq;
        self.next_seq += 1;
        let tenant_id = work.tenant();
        let priority = work.priority();
        let create_time = work.create_time();
        let lifo = !resumed
            && self.lifo.is_some()
            && self
                .tenants
                .get(&tenant_id)
                .is_some_and(|tenant| tenant.is_lifo(priority));
        let place = match self.lifo {
            Some(settings) if lifo => {
                let epoch = settings.epoch_of(self.origin, create_time);
                if epoch < self.closed_epochs {
                    Place::Ready(WaiterKey {
                        priority: Reverse(priority),
                        recency: Recency::Newest(Reverse(create_time)),
                        seq,
                    })
                } else {
                    Place::Open(OpenKey {
                        epoch,
                        priority: Reverse(priority),
                        create_time,
                        seq,
                    })
                }
            }
            _ => Place::Ready(WaiterKey {
                priority: Reverse(priority),
                recency: if resumed {
                    Recency::Resumed(create_time)
                } else {
                    Recency::Oldest(create_time)
                },
                seq,
            }),
        };
        let slab_key = self.waiters.vacant_key();
        // The record always exists once `with_tenant` returns; the fallback
        // only keeps an impossible miss from panicking (the waiter is then
        // found by nothing but its own cancel or deadline).
        let seat = self
            .with_tenant(tenant_id, |tenant| tenant.insert(place, slab_key))
            .unwrap_or(Seat::Ready(
                WaiterKey {
                    priority: Reverse(priority),
                    recency: Recency::Oldest(create_time),
                    seq,
                },
                Entry::NOWHERE,
            ));
        let inserted = self.waiters.insert(Waiter {
            tenant: tenant_id,
            priority,
            count: work.requested(),
            seat,
            deadline: work.deadline(),
            enqueued_at: now,
            state: WaiterState::Waiting {
                waker: Some(waker.clone()),
            },
        });
        debug_assert_eq!(inserted, slab_key);
        self.waiting += 1;
        self.waiting_at[super::level::index(priority)] += 1;
        slab_key
    }

    /// Hands capacity to waiters in order for as long as the granter allows,
    /// expiring any whose deadline has passed on the way. Returns the number
    /// of slots granted.
    #[inline]
    pub(crate) fn grant_waiting<G: Granter>(
        &mut self,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) -> u64 {
        // Whatever was kept back for arrivals is given out now, or free
        // with nobody it could go to.
        self.kept_for_arrivals = false;
        if self.waiting == 0 {
            // Every release runs this: keep the uncontended case free (and
            // inlined: no call).
            return 0;
        }
        self.grant_in_order(grants, wakes)
    }

    /// The grant loop of [`grant_waiting`](Self::grant_waiting), with
    /// someone waiting.
    #[inline(never)]
    fn grant_in_order<G: Granter>(
        &mut self,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) -> u64 {
        let mut granted: u64 = 0;
        let mut now = None;
        let epoch_lifo = self.lifo.is_some();
        let elastic_limit = self.elastic_limit(grants);
        loop {
            if self.pacing.is_full() {
                break;
            }
            let elastic_full = self.elastic_full(elastic_limit);
            let Some((first, slab_key)) = self.next_grantee(elastic_full) else {
                break;
            };
            let deadline = self.waiters[slab_key].deadline;
            if deadline.is_some() || epoch_lifo || self.limits.early_rejection {
                let at = *now.get_or_insert_with(Instant::now);
                match self.refusal_at_grant(&self.waiters[slab_key], at) {
                    None => {}
                    Some(GrantRefusal::Expired) => {
                        self.expire(slab_key, at, wakes);
                        continue;
                    }
                    Some(GrantRefusal::WouldMiss(error)) => {
                        let priority = self.waiters[slab_key].priority;
                        self.drain.refused_on_hold(priority);
                        self.stats.refused_on_hold(priority);
                        self.fail_waiting(slab_key, at, WaiterState::Refused(error), wakes);
                        continue;
                    }
                }
            }
            // Strict order: if the first waiter's units are not all
            // available, nobody behind it is granted either.
            let count = self.waiters[slab_key].count;
            let Some(accounted) = grants.try_get(count) else {
                // A first waiter that can never fit would hold up everyone
                // behind it for good: it fails instead.
                if let Some(capacity) = grants.max_request().filter(|&cap| count > cap) {
                    let at = *now.get_or_insert_with(Instant::now);
                    self.refuse_as_unfit(slab_key, capacity, at, wakes);
                    continue;
                }
                break;
            };
            let waiter = &self.waiters[slab_key];
            let (priority, enqueued_at, deadline) =
                (waiter.priority, waiter.enqueued_at, waiter.deadline);
            debug_assert_eq!(waiter.tenant, first.id, "the grantee is its tenant's first");
            // Out of its tenant's set and charged in one visit to the
            // record: one look-up and one order update per grant.
            self.unlink_and(slab_key, |t| {
                t.used = t.used.saturating_add(count);
                if let Some(now) = now.filter(|_| epoch_lifo) {
                    t.states
                        .waited(priority, now.saturating_duration_since(enqueued_at), true);
                }
            });
            if priority.is_elastic() {
                self.elastic_held = self.elastic_held.saturating_add(count);
            }
            self.in_flight = self.in_flight.saturating_add(count);
            if self.limits.report_work {
                if let (Some(deadline), Some(at)) = (deadline, now) {
                    // Waited more than half of what its deadline allowed.
                    let allowed = deadline.saturating_duration_since(enqueued_at);
                    if at.saturating_duration_since(enqueued_at) > allowed / 2 {
                        self.work.waited_long(priority);
                    }
                }
            }
            let charge = self.charge_now(priority, count, now, accounted, deadline);
            let pacing_epoch = self.pacing.granted();
            let waiter = &mut self.waiters[slab_key];
            if let WaiterState::Waiting { waker } = std::mem::replace(
                &mut waiter.state,
                WaiterState::Granted {
                    charge,
                    pacing_epoch,
                },
            ) {
                wakes.push(waker);
            }
            granted = granted.saturating_add(count);
        }
        granted
    }

    /// Fails every waiter asking for more units than one request can now be
    /// granted: the granter's limit dropped below what they asked for.
    pub(crate) fn refuse_unfit<G: Granter>(
        &mut self,
        grants: &Grants<'_, G>,
        wakes: &mut WakeList,
    ) {
        let Some(capacity) = grants.max_request() else {
            return;
        };
        let unfit: Vec<usize> = self
            .waiters
            .iter()
            .filter(|(_, waiter)| {
                waiter.count > capacity && matches!(waiter.state, WaiterState::Waiting { .. })
            })
            .map(|(slab_key, _)| slab_key)
            .collect();
        if unfit.is_empty() {
            return;
        }
        let now = Instant::now();
        for slab_key in unfit {
            self.refuse_as_unfit(slab_key, capacity, now, wakes);
        }
    }

    fn refuse_as_unfit(
        &mut self,
        slab_key: usize,
        capacity: u64,
        now: Instant,
        wakes: &mut WakeList,
    ) {
        let requested = self.waiters[slab_key].count;
        let error = AdmitError::NeverFits {
            requested,
            capacity,
        };
        self.fail_waiting(slab_key, now, WaiterState::Refused(error), wakes);
    }

    /// Polls a queued request: its outcome if settled, else `Pending` with
    /// its waker stored (replaced only if it would wake another task).
    pub(crate) fn observe<G: Granter>(
        &mut self,
        slab_key: usize,
        waker: &Waker,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) -> Observed {
        match &mut self.waiters[slab_key].state {
            WaiterState::Waiting { waker: stored } => {
                if !stored.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    *stored = Some(waker.clone());
                }
                Observed::Pending
            }
            _ => self.settle(slab_key, grants, wakes),
        }
    }

    /// The request's own deadline timer fired. A grant that got there first
    /// wins; otherwise the request leaves the queue.
    pub(crate) fn deadline_fired<G: Granter>(
        &mut self,
        slab_key: usize,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) -> Observed {
        if matches!(self.waiters[slab_key].state, WaiterState::Waiting { .. }) {
            let mut own = WakeList::default();
            self.expire(slab_key, Instant::now(), &mut own);
            // Its waker is the caller's own, already awake: not woken. Its
            // log goes out with the rest once the lock is released.
            for failed in own.into_failed() {
                wakes.push_failed(failed);
            }
        }
        self.settle(slab_key, grants, wakes)
    }

    /// Removes a settled (non-waiting) request and counts its outcome. An
    /// observed grant frees a place in the pacing burst, so paced queues
    /// try to grant again.
    fn settle<G: Granter>(
        &mut self,
        slab_key: usize,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) -> Observed {
        let waiter = self.waiters.remove(slab_key);
        let observed = match waiter.state {
            WaiterState::Waiting { .. } => unreachable!("settle is only called on settled waiters"),
            WaiterState::Granted {
                charge,
                pacing_epoch,
            } => {
                self.pacing.settled(pacing_epoch);
                if self.pacing.is_enabled() {
                    self.grant_waiting(grants, wakes);
                }
                Observed::Admitted {
                    charge,
                    waited: Instant::now().saturating_duration_since(waiter.enqueued_at),
                }
            }
            WaiterState::Expired { waited } => {
                Observed::Failed(AdmitError::DeadlineExceeded { waited })
            }
            WaiterState::Refused(error) => Observed::Failed(error),
            WaiterState::Closed => Observed::Failed(AdmitError::Closed),
        };
        match &observed {
            Observed::Admitted { waited, .. } => {
                self.stats.admitted(waiter.priority, *waited);
                self.level.admitted(waiter.priority, *waited, None);
            }
            Observed::Failed(error) => {
                self.stats.refused(waiter.priority, error);
                self.level.refused(waiter.priority, error, None);
            }
            // A waiting waiter never reaches here (see above).
            Observed::Pending => {}
        }
        observed
    }

    /// The `Admit` future holding `slab_key` was dropped before it saw its
    /// outcome. A grant it never used is passed on to the next waiter.
    pub(crate) fn cancel<G: Granter>(
        &mut self,
        slab_key: usize,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) {
        if matches!(self.waiters[slab_key].state, WaiterState::Waiting { .. }) {
            self.unlink_unserved(slab_key, Instant::now);
        }
        let waiter = self.waiters.remove(slab_key);
        self.stats.cancelled(waiter.priority);
        if let WaiterState::Granted {
            charge,
            pacing_epoch,
        } = waiter.state
        {
            self.pacing.settled(pacing_epoch);
            // The grant was never used: the granter takes it back as if it
            // had not been made (tokens are credited, not only slots), the
            // tenant is un-charged whatever the usage mode, and there is no
            // hold time to learn from.
            let unused = Charge {
                admitted_at: None,
                ..charge
            };
            if unused.accounted {
                grants.cancel_grant(unused.count);
            }
            self.forget(waiter.tenant, unused, true, grants, wakes);
        }
    }

    /// What [`SlotPermit::give_way`](super::SlotPermit::give_way) asks:
    /// `true` when the waiter the queue would grant next, were the units of
    /// `charge` returned, has a higher priority than the work holding them
    /// and would be granted them at once (the slots free once they are
    /// back are enough for it, and grant pacing has room); the permit then
    /// returns them. Work of the same priority never
    /// outranks a holder (among equals fair share acts at admission). "Were
    /// they returned" in full: an elastic holder's units count as free
    /// against the elastic share, and under [`Usage::Held`] the holder's
    /// tenant is un-charged, which can move its own waiters ahead of other
    /// tenants'.
    ///
    /// Otherwise (`false`, the permit keeps its units) elastic work that
    /// offers its slot this way no longer counts against the elastic
    /// share: the share keeps slots free for regular work because elastic
    /// work cannot be made to give them back, and this work can. What the
    /// share it held allows is granted at once.
    ///
    /// `slots` is the slot granter's state, `None` while its total is not
    /// enforced (then anything fits).
    pub(crate) fn give_way<G: Granter>(
        &mut self,
        tenant: TenantId,
        charge: &mut Charge,
        slots: Option<SlotSnapshot>,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) -> bool {
        let returned = if charge.accounted { charge.count } else { 0 };
        let free_after = slots.map_or(u64::MAX, |slots| {
            slots
                .total
                .saturating_sub(slots.used.saturating_sub(returned))
        });
        if self.outranks_holder(tenant, charge, free_after, grants) {
            return true;
        }
        if charge.capped {
            charge.capped = false;
            self.elastic_held = self.elastic_held.saturating_sub(charge.count);
            self.grant_waiting(grants, wakes);
        }
        false
    }

    fn outranks_holder<G: Granter>(
        &self,
        tenant: TenantId,
        charge: &Charge,
        free_after: u64,
        grants: &Grants<'_, G>,
    ) -> bool {
        if self.waiting == 0 {
            return false;
        }
        let elastic_full = self
            .elastic_limit(grants)
            .is_some_and(|limit| self.elastic_held.saturating_sub(charge.capped_units()) >= limit);
        let eligible = |record: &Tenant| self.grantable_first(record, elastic_full);
        let others = self
            .tenant_order
            .iter()
            .filter(|order| order.id != tenant)
            .find_map(|order| Some((*order, eligible(self.tenants.get(&order.id)?)?)));
        let returned = self.limits.usage == Usage::Held && charge.generation == self.generation;
        let own = self.tenants.get(&tenant).and_then(|record| {
            let mut order = record.order(tenant);
            if returned {
                order.used = order.used.saturating_sub(charge.count);
            }
            Some((order, eligible(record)?))
        });
        let next = match (others, own) {
            (Some(other), Some(own)) => Some(if own.0 < other.0 { own } else { other }),
            (other, own) => other.or(own),
        };
        // Only when the slot goes to it at once: the grant removes it from
        // the queue, which makes room for the holder's second admission
        // (a full queue never refuses work that gave way), and no slot
        // sits idle while grants are paced or a bigger request waits. Nor
        // to a waiter the grant loop would refuse for its deadline: the
        // slot would go past it to whoever is next, perhaps work below the
        // holder's priority. The holder keeps its slot until the waiter's
        // own timer has taken it out of the queue.
        next.is_some_and(|(_, slab_key)| {
            let waiter = &self.waiters[slab_key];
            waiter.priority > charge.priority
                && waiter.count <= free_after
                && !self.pacing.is_full()
                && !self.would_refuse_at_grant(waiter)
        })
    }

    /// Whether the grant loop would refuse `waiter` now (see
    /// [`refusal_at_grant`](Self::refusal_at_grant)); the clock is read only
    /// for a waiter with a deadline.
    fn would_refuse_at_grant(&self, waiter: &Waiter) -> bool {
        waiter.deadline.is_some() && self.refusal_at_grant(waiter, Instant::now()).is_some()
    }

    /// Why the grant loop refuses `waiter` at `at`, if it does: never hand
    /// a slot to work that can no longer use it (its deadline passed), nor,
    /// with early rejection, to work that would not finish in time even if
    /// it started now (the typical hold of its priority outlasts what is
    /// left of its deadline).
    fn refusal_at_grant(&self, waiter: &Waiter, at: Instant) -> Option<GrantRefusal> {
        let deadline = waiter.deadline?;
        if deadline <= at {
            return Some(GrantRefusal::Expired);
        }
        let remaining = deadline.saturating_duration_since(at);
        // What is left of resumed work is not a typical hold.
        if waiter.is_resumed() {
            return None;
        }
        let hold = self
            .drain
            .hold(waiter.priority)
            .filter(|&hold| self.limits.early_rejection && hold > remaining)?;
        Some(GrantRefusal::WouldMiss(AdmitError::WouldMissDeadline {
            expected: hold,
            remaining,
        }))
    }

    /// Admitted work completed: its slot goes back to the granter and on to
    /// the next waiter, and its tenant is un-charged (if charged in this
    /// generation).
    #[inline]
    pub(crate) fn release<G: Granter>(
        &mut self,
        tenant: TenantId,
        charge: Charge,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) {
        if charge.accounted {
            grants.return_grant(charge.count);
        }
        self.forget(tenant, charge, false, grants, wakes);
    }

    /// Takes a finished (`unused`: never observed) grant off the books and
    /// passes its capacity on to waiters.
    #[inline]
    fn forget<G: Granter>(
        &mut self,
        tenant: TenantId,
        charge: Charge,
        unused: bool,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) {
        self.drain.completions += 1;
        self.in_flight = self.in_flight.saturating_sub(charge.count);
        self.elastic_held = self.elastic_held.saturating_sub(charge.capped_units());
        if let Some(admitted_at) = charge.admitted_at {
            let now = Instant::now();
            let held = now.saturating_duration_since(admitted_at);
            self.drain.held(charge.priority, held, now);
            if self.limits.report_work {
                let base = charge.concurrency <= self.base_concurrency;
                let late = charge.deadline.is_some_and(|deadline| now > deadline);
                self.work.completed(charge.priority, held, base, late);
            }
        }
        // A permit from before the last reset was already forgotten; its
        // tenant record may even be gone. Counting grants, nothing is
        // returned before the reset.
        if (unused || self.limits.usage == Usage::Held) && charge.generation == self.generation {
            let uncharge = |t: &mut Tenant| t.used = t.used.saturating_sub(charge.count);
            match self.tenants.get_mut(&tenant) {
                None => {}
                // Nothing waiting: no `tenant_order` key to move (see
                // `update_tenant`), so one look-up does.
                Some(record) if !record.has_waiters() => uncharge(record),
                Some(_) => {
                    self.update_tenant(tenant, uncharge);
                }
            }
        }
        if self.keep_for_arrivals() {
            return;
        }
        self.grant_waiting(grants, wakes);
    }

    /// Whether a returned slot stays free for the next request to ask
    /// instead of going to a waiter now: only with arrivals first, while
    /// requests wait where the runtime keeps them from the queue, and one
    /// slot at a time (see `arrivals.rs`).
    #[inline]
    fn keep_for_arrivals(&mut self) -> bool {
        let Some(arrivals_waiting) = self.limits.arrivals_waiting else {
            return false;
        };
        if self.waiting == 0 || self.kept_for_arrivals || !arrivals_waiting() {
            return false;
        }
        self.kept_for_arrivals = true;
        self.kept_for_arrivals_count = self.kept_for_arrivals_count.saturating_add(1);
        true
    }

    /// The admission level, published for readers without the lock (see
    /// `level.rs`).
    pub(crate) fn published_level(&self) -> StdArc<StdAtomicU64> {
        self.level.published()
    }

    /// What a load report says of the queue.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn load(&self) -> QueueLoad {
        QueueLoad {
            waiting: self.waiting,
            in_flight: self.in_flight,
            completions_per_sec: self.drain.per_sec,
            recent_wait_p50: self.level.recent_wait_p50(),
        }
    }

    pub(crate) fn kept_for_arrivals(&self) -> u64 {
        self.kept_for_arrivals_count
    }

    /// Whether a slot is kept back for arrivals now.
    #[cfg(test)]
    pub(crate) fn holds_kept_slot(&self) -> bool {
        self.kept_for_arrivals
    }

    /// Charges (`delta > 0`) or credits a tenant's usage after the fact: an
    /// estimate corrected once the actual cost is known.
    pub(crate) fn adjust_used(&mut self, tenant: TenantId, delta: i64) {
        if self.tenants.contains_key(&tenant) {
            self.update_tenant(tenant, |t| {
                t.used = if delta >= 0 {
                    t.used.saturating_add(delta.unsigned_abs())
                } else {
                    t.used.saturating_sub(delta.unsigned_abs())
                };
            });
        }
    }

    /// Fails every waiting request; later attempts fail at once.
    pub(crate) fn close(&mut self, wakes: &mut WakeList) {
        self.closed = true;
        for (_, waiter) in self.waiters.iter_mut() {
            if let WaiterState::Waiting { waker } = &mut waiter.state {
                wakes.push(waker.take());
                waiter.state = WaiterState::Closed;
            }
        }
        for tenant in self.tenants.values_mut() {
            tenant.clear();
        }
        self.tenant_order.clear();
        self.waiting = 0;
        self.waiting_at.fill(0);
    }

    /// Periodic upkeep: the usage reset if it is due, closing due epochs,
    /// the completion rate, and a new pacing epoch if grants have been stuck
    /// behind unobserved ones for too long.
    pub(crate) fn maintain<G: Granter>(
        &mut self,
        now: Instant,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) {
        self.maybe_reset(now);
        self.rescale_epochs(now);
        self.close_epochs(now);
        self.drain.update(now, self.is_busy());
        self.refuse_doomed_tails(now, grants.capacity(), wakes);
        // Not only when pacing was stuck: the reset may have lifted the
        // elastic share (no regular work about any more), and elastic
        // waiters it held back may now take the free slots.
        self.pacing.unstick(now);
        self.grant_waiting(grants, wakes);
    }

    /// Runs the periodic reset if it is due.
    #[inline]
    fn maybe_reset(&mut self, now: Instant) {
        if self.next_reset.is_some_and(|due| now >= due) {
            self.reset(now);
        }
    }

    /// Forgets all usage and drops tenants with nothing waiting.
    fn reset(&mut self, now: Instant) {
        self.next_reset = now.checked_add(self.limits.reset_period);
        self.generation += 1;
        self.regular_before = std::mem::take(&mut self.regular_requests);
        self.tenants.retain(|_, tenant| tenant.has_waiters());
        for tenant in self.tenants.values_mut() {
            tenant.used = 0;
        }
        self.tenant_order = self
            .tenants
            .iter()
            .map(|(&id, tenant)| tenant.order(id))
            .collect();
        self.gc_threshold = MIN_GC_THRESHOLD
            .max(self.tenants.len().saturating_mul(2))
            .min(self.limits.max_tenants.max(self.tenants.len() + 1));
    }

    /// With settings chosen from the deadlines requests carry: adopts new
    /// ones when the deadlines have moved (see `DeadlineScale`). Epochs are
    /// numbered from the origin in units of the epoch length, so the count
    /// restarts with the new length; work waiting for an epoch of the old
    /// count to close becomes eligible now, as if it had (its thresholds are
    /// kept, and the next close recomputes them in the new units).
    #[inline]
    fn rescale_epochs(&mut self, now: Instant) {
        // Checked here, inlined, so that a queue without the scale (most)
        // pays a compare on every enqueue, not a call.
        if self.deadline_scale.is_some() {
            self.rescale_epochs_now(now);
        }
    }

    fn rescale_epochs_now(&mut self, now: Instant) {
        let Some(settings) = self
            .deadline_scale
            .as_mut()
            .and_then(DeadlineScale::rechoose)
        else {
            return;
        };
        let mut moved = Vec::new();
        for tenant in self.tenants.values_mut() {
            moved.extend(tenant.close_epochs(u64::MAX));
        }
        for (slab_key, seat) in moved {
            self.waiters[slab_key].seat = seat;
        }
        self.lifo = Some(settings);
        self.origin = now;
        self.closed_epochs = 0;
    }

    /// The epoch-LIFO settings in force.
    pub(crate) fn epoch_lifo(&self) -> Option<EpochLifo> {
        self.lifo
    }

    /// Closes every epoch whose closing time has passed: each tenant gets its
    /// next LIFO threshold, and LIFO-marked work of closed epochs becomes
    /// eligible. After an idle stretch of several epochs, the epochs after
    /// the first saw nothing, so thresholds return to all-FIFO in one step
    /// rather than one epoch at a time.
    #[inline]
    fn close_epochs(&mut self, now: Instant) {
        if let Some(settings) = self.lifo {
            self.close_epochs_now(settings, now);
        }
    }

    fn close_epochs_now(&mut self, settings: EpochLifo, now: Instant) {
        let mut due = 0u64;
        while let Some(at) = settings.closes_at(self.origin, self.closed_epochs + due) {
            if at > now || due == 2 {
                break;
            }
            due += 1;
        }
        if due == 0 {
            return;
        }
        let elapsed = now.saturating_duration_since(self.origin);
        let closed_by = u64::try_from(
            elapsed.saturating_sub(settings.closing_delta).as_nanos() / settings.epoch.as_nanos(),
        )
        .unwrap_or(u64::MAX);
        self.closed_epochs = closed_by.max(self.closed_epochs + due);
        let last_closed = self.closed_epochs - 1;
        let mut moved = Vec::new();
        for tenant in self.tenants.values_mut() {
            let mut threshold = tenant
                .states
                .next_threshold(tenant.lifo_threshold, &settings);
            if due > 1 {
                threshold = tenant.states.next_threshold(threshold, &settings);
            }
            tenant.lifo_threshold = threshold;
            moved.extend(tenant.close_epochs(last_closed));
        }
        for (slab_key, seat) in moved {
            self.waiters[slab_key].seat = seat;
        }
    }

    /// Sets (or with `None`, clears back to the default) one tenant's
    /// weight. The table is configuration, not a cache, so it is never
    /// swept; it is bounded by `max_tenants` instead, and a weight that
    /// would take it past that is refused.
    pub(crate) fn set_weight(
        &mut self,
        tenant: TenantId,
        weight: Option<TenantWeight>,
    ) -> Result<(), ConfigError> {
        match weight {
            Some(weight) if weight != TenantWeight::default() => {
                if !self.weights.contains_key(&tenant)
                    && self.weights.len() >= self.limits.max_tenants
                {
                    return Err(Self::too_many_weights(self.limits.max_tenants));
                }
                self.weights.insert(tenant, weight);
            }
            _ => {
                self.weights.remove(&tenant);
            }
        }
        self.refresh_weight(tenant);
        Ok(())
    }

    /// The most tenants that may have a weight of their own.
    pub(crate) fn max_weighted_tenants(&self) -> usize {
        self.limits.max_tenants
    }

    pub(crate) fn too_many_weights(max: usize) -> ConfigError {
        ConfigError::new(
            "tenant_weight",
            format!(
                "at most {max} tenants (the queue's max_tenants) may have a weight other \
                 than the default; set others back to the default, or raise max_tenants"
            ),
        )
    }

    /// Replaces the whole weight table; tenants already tracked pick up their
    /// new weight through [`refresh_weight`](Self::refresh_weight), which the
    /// caller runs in batches to keep lock hold times short.
    pub(crate) fn replace_weights(
        &mut self,
        weights: FxHashMap<TenantId, TenantWeight>,
    ) -> Vec<TenantId> {
        self.weights = weights;
        self.tenants.keys().copied().collect()
    }

    pub(crate) fn refresh_weight(&mut self, tenant: TenantId) {
        let weight = self.weights.get(&tenant).copied().unwrap_or_default();
        if self
            .tenants
            .get(&tenant)
            .is_some_and(|t| t.weight != weight)
        {
            self.update_tenant(tenant, |t| t.weight = weight);
        }
    }

    pub(crate) fn priority_snapshot(&self) -> Vec<PrioritySnapshot> {
        self.stats
            .snapshot(|priority| self.waiting_at[super::level::index(priority)] as usize)
    }

    pub(crate) fn tenant_snapshot(&self) -> Vec<TenantSnapshot> {
        let mut out: Vec<TenantSnapshot> = self
            .tenants
            .iter()
            .map(|(&id, tenant)| TenantSnapshot {
                tenant: id,
                used: tenant.used,
                weight: tenant.weight,
                waiting: tenant.waiting(),
                lifo_below: tenant.lifo_threshold,
            })
            .collect();
        out.sort_by_key(|t| t.tenant);
        out
    }

    /// [`unlink_and`](Self::unlink_and) for a wait that ends without a
    /// grant (a cancel, a deadline, a refusal): under epoch-LIFO the
    /// tenant's epoch state counts the wait, up to `now` (read only then),
    /// in the same visit to the record.
    fn unlink_unserved(&mut self, slab_key: usize, now: impl FnOnce() -> Instant) {
        if self.lifo.is_none() {
            return self.unlink_and(slab_key, |_| {});
        }
        let waiter = &self.waiters[slab_key];
        let priority = waiter.priority;
        let waited = now().saturating_duration_since(waiter.enqueued_at);
        self.unlink_and(slab_key, |t| t.states.waited(priority, waited, false));
    }

    /// Takes a waiting request out of its tenant's set (and its tenant out
    /// of `tenant_order` if that was its last one), then applies `change`
    /// to the same record: the record is found once and its order key
    /// updated once.
    #[inline]
    fn unlink_and(&mut self, slab_key: usize, change: impl FnOnce(&mut Tenant)) {
        let (tenant, seat, priority) = {
            let waiter = &self.waiters[slab_key];
            (waiter.tenant, waiter.seat, waiter.priority)
        };
        self.update_tenant(tenant, |t| {
            t.remove(&seat);
            change(t);
        });
        self.waiting -= 1;
        self.waiting_at[super::level::index(priority)] -= 1;
    }

    fn expire(&mut self, slab_key: usize, now: Instant, wakes: &mut WakeList) {
        let waited = now.saturating_duration_since(self.waiters[slab_key].enqueued_at);
        self.fail_waiting(slab_key, now, WaiterState::Expired { waited }, wakes);
    }

    /// Takes a waiting request out of the queue into a failed state, and
    /// wakes it to see the error.
    fn fail_waiting(
        &mut self,
        slab_key: usize,
        now: Instant,
        failed: WaiterState,
        wakes: &mut WakeList,
    ) {
        self.unlink_unserved(slab_key, || now);
        let waiter = &mut self.waiters[slab_key];
        let waited = now.saturating_duration_since(waiter.enqueued_at);
        let reason = match &failed {
            WaiterState::Refused(AdmitError::NeverFits { .. }) => {
                "admission refused while waiting: it can no longer fit"
            }
            WaiterState::Refused(_) => {
                "admission refused while waiting: it would miss its deadline"
            }
            _ => "admission deadline expired while waiting",
        };
        if let WaiterState::Waiting { waker } = std::mem::replace(&mut waiter.state, failed) {
            wakes.push(waker);
        }
        let (tenant, priority) = (waiter.tenant, waiter.priority);
        wakes.push_failed(FailedWait {
            tenant,
            priority,
            waited,
            reason,
        });
    }

    /// Applies `change` to `tenant`'s record, creating the record if needed.
    /// A new record may first trigger a sweep of idle records once the table
    /// has grown past its threshold, so a stream of one-off tenants on the
    /// fast path cannot grow it without bound between resets.
    ///
    /// A new record starts behind the waiting tenants (`newcomer_used`),
    /// except for work admitted at once, which competed with nobody:
    /// bypass work is the node's own, and the fast path runs only when
    /// nobody waits.
    fn with_tenant<R>(
        &mut self,
        tenant: TenantId,
        change: impl FnOnce(&mut Tenant) -> R,
    ) -> Option<R> {
        self.tenant_record(tenant, true, change)
    }

    fn tenant_record<R>(
        &mut self,
        tenant: TenantId,
        behind_waiters: bool,
        change: impl FnOnce(&mut Tenant) -> R,
    ) -> Option<R> {
        // The common case (a tenant the queue knows) in one look-up.
        if let Some(record) = self.tenants.get_mut(&tenant) {
            return Some(keep_in_order(
                &mut self.tenant_order,
                tenant,
                record,
                change,
            ));
        }
        {
            if self.tenants.len() >= self.gc_threshold {
                self.sweep_tenants();
            }
            let weight = self.weights.get(&tenant).copied().unwrap_or_default();
            let count_priorities = self.limits.early_rejection;
            let front = self
                .tenant_order
                .first()
                .filter(|_| behind_waiters && self.limits.newcomers_behind);
            let used = newcomer_used(front, weight);
            let since = self.records_made;
            self.records_made = self.records_made.saturating_add(1);
            self.tenants
                .insert(tenant, Tenant::new(weight, count_priorities, used, since));
        }
        self.update_tenant(tenant, change)
    }

    /// Bounds the tenant table without anyone calling `maintain`: the usage
    /// reset if it is due (the clock is read here, once per sweep, not on
    /// the fast path), then records with nothing charged or waiting go; at
    /// the `max_tenants` cap, records with only usage charged go too.
    /// Records with waiting work always stay. The next sweep is due at twice
    /// the live size, at least `MIN_GC_THRESHOLD` and at most the cap, so
    /// sweeps cost O(1) per new tenant, amortized.
    fn sweep_tenants(&mut self) {
        self.maybe_reset(Instant::now());
        self.tenants.retain(|_, t| t.used > 0 || t.has_waiters());
        let cap = self.limits.max_tenants;
        if self.tenants.len() >= cap {
            // Tenants without waiters are not in `tenant_order`: nothing
            // there changes.
            self.tenants.retain(|_, t| t.has_waiters());
        }
        let live = self.tenants.len();
        self.gc_threshold = if live < cap {
            MIN_GC_THRESHOLD.max(live.saturating_mul(2)).min(cap)
        } else {
            // Only tenants with waiting work are left (at most
            // `max_waiters` of them): sweep again when that doubles.
            live.saturating_mul(2)
        };
    }

    /// The only way to change a tracked tenant's `used`, `weight` or waiting
    /// work: keeps its `tenant_order` key in step.
    fn update_tenant<R>(
        &mut self,
        id: TenantId,
        change: impl FnOnce(&mut Tenant) -> R,
    ) -> Option<R> {
        let Some(tenant) = self.tenants.get_mut(&id) else {
            debug_assert!(false, "update of an untracked tenant");
            return None;
        };
        Some(keep_in_order(&mut self.tenant_order, id, tenant, change))
    }
}

/// Applies `change` to the record of tenant `id` and keeps its
/// `tenant_order` key in step (see [`QueueState::update_tenant`]).
#[inline]
fn keep_in_order<R>(
    tenant_order: &mut FairOrder,
    id: TenantId,
    tenant: &mut Tenant,
    change: impl FnOnce(&mut Tenant) -> R,
) -> R {
    // Tenants with nothing waiting are not in the order (the fast path's
    // case), and a change that leaves the key alone (one more waiter of an
    // already waiting tenant) needs no tree update.
    let before = tenant.has_waiters().then(|| tenant.order(id));
    let changed = change(tenant);
    let after = tenant.has_waiters().then(|| tenant.order(id));
    if before != after {
        if let Some(before) = before {
            tenant_order.remove(&before);
        }
        if let Some(after) = after {
            tenant_order.insert(after);
        }
    }
    changed
}
