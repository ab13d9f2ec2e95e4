//! The WorkQueue's state machine, free of futures and of tokio's runtime.
//!
//! # Implementation notes
//!
//! **Structure.** Everything lives in one [`QueueState`] behind one mutex
//! (see `queue/mod.rs`), together with the granter's own state, so the
//! granter is only ever consulted with that mutex held.
//! Waiters live in a slab; the slab key is the waiter's identity and is held
//! by its `Admit` future. Two B-trees give the order:
//!
//! * `tenant_order`: every tenant with at least one *waiting* request, keyed
//!   by [`TenantOrder`] (least `used / weight` first).
//! * `Tenant::waiting`: that tenant's waiting requests, keyed by
//!   [`WaiterKey`] (priority, create time, arrival).
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
//! is in exactly one tenant's `waiting` tree and its tenant is in
//! `tenant_order`; in every other state it is in neither.
//!
//! **Invariants** (checked by the property test and the loom models):
//! the granter's `used` equals the number of live permits plus the number of
//! `Granted` waiters; `waiting` equals the number of `Waiting` waiters; when
//! `waiting > 0`, the granter refused the last `try_get` (every path that
//! returns capacity runs the grant loop before releasing the lock).
//!
//! **Grant pacing** (upstream's grant chain). With a burst limit set, the
//! grant loop stops once that many grants are *outstanding*: made, but not
//! yet observed by their futures. A future observing its grant is the sign
//! that its task actually got a worker; until then, handing out more slots
//! would only pile tasks into a run queue that is not draining. Each grant
//! remembers the pacing epoch it was made in; `maintain` starts a new epoch
//! (forgetting the outstanding count) if no grant has been observed for the
//! pacing timeout while the limit held, so a future that is never polled
//! again cannot stall the queue.
//!
//! **Fairness memory.** A tenant's `used` rises when it is admitted and falls
//! when the work completes. Every `reset_period` all `used` are zeroed and
//! idle tenants are dropped (CockroachDB's one-second reset). To keep the
//! arithmetic exact across a reset, a permit remembers the `generation` in
//! which it was charged and only un-charges its tenant if no reset happened
//! since; work admitted before a reset is simply forgotten by the fairness
//! order, never subtracted twice.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::task::Waker;
use std::time::Duration;

use rustc_hash::FxHashMap;
use slab::Slab;
use tokio::time::Instant;

use super::order::{TenantOrder, WaiterKey};
use crate::error::AdmitError;
use crate::grant::{Granter, Grants};
use crate::observe::{PrioritySnapshot, PriorityStats, Settled, TenantSnapshot};
use crate::work::{Priority, TenantId, TenantWeight, WorkInfo};

/// Slots are granted one at a time; tokens (a later granter) carry sizes.
const SLOT: u64 = 1;

/// Tenant records below this count are never garbage-collected early.
const MIN_GC_THRESHOLD: usize = 1024;

#[derive(Debug)]
struct Tenant {
    weight: TenantWeight,
    used: u64,
    waiting: BTreeMap<WaiterKey, usize>,
}

impl Tenant {
    fn order(&self, id: TenantId) -> TenantOrder {
        TenantOrder {
            used: self.used,
            weight: self.weight.get(),
            id,
        }
    }
}

#[derive(Debug)]
enum WaiterState {
    Waiting { waker: Option<Waker> },
    Granted { generation: u64, pacing_epoch: u64 },
    Expired { waited: Duration },
    Closed,
}

#[derive(Debug)]
struct Waiter {
    tenant: TenantId,
    key: WaiterKey,
    deadline: Option<Instant>,
    enqueued_at: Instant,
    state: WaiterState,
}

/// What a first attempt at admission came to.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Admitted at once (fast path or bypass), charged in `generation`.
    Admitted { generation: u64 },
    /// Enqueued under this slab key.
    Queued { key: usize },
    /// Failed without queueing.
    Rejected(AdmitError),
}

/// What polling a queued request came to.
#[derive(Debug)]
pub(crate) enum Observed {
    Pending,
    Admitted { generation: u64, waited: Duration },
    Failed(AdmitError),
}

/// Wakers collected under the lock, woken after it is released.
#[derive(Debug, Default)]
pub(crate) struct WakeList {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl WakeList {
    fn push(&mut self, waker: Option<Waker>) {
        let Some(waker) = waker else { return };
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.rest.push(waker);
        }
    }

    /// Wakes everything collected. Call only after the lock is released:
    /// a woken task may run at once on another thread and ask for the lock.
    pub(crate) fn wake_all(self) {
        if let Some(first) = self.first {
            first.wake();
        }
        for waker in self.rest {
            waker.wake();
        }
    }
}

/// Static settings of a queue, validated by the builder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_waiters: usize,
    pub(crate) reset_period: Duration,
    pub(crate) grant_burst: Option<usize>,
    pub(crate) grant_burst_timeout: Duration,
}

/// Outstanding grants, for pacing; see the implementation notes.
#[derive(Debug)]
struct Pacing {
    burst: Option<usize>,
    timeout: Duration,
    outstanding: usize,
    epoch: u64,
    observed: u64,
    /// When the limit was first seen holding, and `observed` at that moment.
    stalled: Option<(Instant, u64)>,
}

impl Pacing {
    fn is_full(&self) -> bool {
        self.burst.is_some_and(|burst| self.outstanding >= burst)
    }

    /// A grant was made; returns the epoch to remember it by.
    fn granted(&mut self) -> u64 {
        self.outstanding += 1;
        self.epoch
    }

    /// A grant made in `epoch` was observed, or abandoned by a cancel.
    fn settled(&mut self, epoch: u64) {
        self.observed += 1;
        if epoch == self.epoch {
            self.outstanding -= 1;
        }
    }

    /// Starts a new epoch if the limit has held with no progress for the
    /// timeout. Returns whether it did (and grants may resume).
    fn unstick(&mut self, now: Instant) -> bool {
        if !self.is_full() {
            self.stalled = None;
            return false;
        }
        match self.stalled {
            Some((since, observed)) if observed == self.observed => {
                if now.saturating_duration_since(since) < self.timeout {
                    return false;
                }
                self.epoch += 1;
                self.outstanding = 0;
                self.stalled = None;
                true
            }
            _ => {
                self.stalled = Some((now, self.observed));
                false
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct QueueState {
    limits: Limits,
    closed: bool,
    waiters: Slab<Waiter>,
    waiting: usize,
    tenants: FxHashMap<TenantId, Tenant>,
    tenant_order: BTreeSet<TenantOrder>,
    weights: FxHashMap<TenantId, TenantWeight>,
    next_seq: u64,
    generation: u64,
    last_reset: Instant,
    gc_threshold: usize,
    pacing: Pacing,
    stats: PriorityStats,
}

impl QueueState {
    pub(crate) fn new(limits: Limits) -> Self {
        QueueState {
            limits,
            closed: false,
            waiters: Slab::new(),
            waiting: 0,
            tenants: FxHashMap::default(),
            tenant_order: BTreeSet::new(),
            weights: FxHashMap::default(),
            next_seq: 0,
            generation: 0,
            last_reset: Instant::now(),
            gc_threshold: MIN_GC_THRESHOLD,
            pacing: Pacing {
                burst: limits.grant_burst,
                timeout: limits.grant_burst_timeout,
                outstanding: 0,
                epoch: 0,
                observed: 0,
                stalled: None,
            },
            stats: PriorityStats::new(),
        }
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// The first poll of an `Admit`: bypass, fail fast, take the fast path,
    /// or enqueue.
    pub(crate) fn attempt<G: Granter>(
        &mut self,
        work: &WorkInfo,
        grants: &mut Grants<'_, G>,
    ) -> Attempt {
        let priority = work.priority();
        self.stats.requested(priority);
        if self.closed {
            return self.reject(work, AdmitError::Closed);
        }
        if work.is_bypass() {
            grants.took_without_permission(SLOT);
            return self.admit_at_once(work);
        }
        // The clock is read only for work that has a deadline, and for
        // work that is about to queue: the fast path stays clock-free.
        let mut now = None;
        if let Some(deadline) = work.deadline() {
            let at = *now.get_or_insert_with(Instant::now);
            if deadline <= at {
                return self.reject(work, AdmitError::DeadlinePassed);
            }
        }
        // Only when nobody waits: otherwise a newcomer would overtake the
        // queue's order whenever capacity happened to be free.
        if self.waiting == 0 && grants.try_get(SLOT) {
            return self.admit_at_once(work);
        }
        if self.waiting >= self.limits.max_waiters {
            let max_waiters = self.limits.max_waiters;
            return self.reject(work, AdmitError::QueueFull { max_waiters });
        }
        let now = now.unwrap_or_else(Instant::now);
        self.maybe_reset(now);
        Attempt::Queued {
            key: self.enqueue(work, now),
        }
    }

    /// Admission without waiting (fast path or bypass): charged, counted
    /// with a zero wait.
    fn admit_at_once(&mut self, work: &WorkInfo) -> Attempt {
        self.charge(work.tenant(), SLOT);
        let waited = Duration::ZERO;
        self.stats
            .settled(work.priority(), Settled::Admitted { waited });
        Attempt::Admitted {
            generation: self.generation,
        }
    }

    fn reject(&mut self, work: &WorkInfo, error: AdmitError) -> Attempt {
        self.stats.settled(work.priority(), Settled::Errored);
        tracing::debug!(
            target: "admission",
            tenant = %work.tenant(),
            priority = %work.priority(),
            %error,
            "admission rejected without queueing"
        );
        Attempt::Rejected(error)
    }

    fn enqueue(&mut self, work: &WorkInfo, now: Instant) -> usize {
        let seq = self.next_seq;
        self.next_seq += 1;
        let key = WaiterKey {
            priority: Reverse(work.priority()),
            create_time: work.create_time(),
            seq,
        };
        let tenant_id = work.tenant();
        let slab_key = self.waiters.insert(Waiter {
            tenant: tenant_id,
            key,
            deadline: work.deadline(),
            enqueued_at: now,
            state: WaiterState::Waiting { waker: None },
        });
        self.with_tenant(tenant_id, |tenant| {
            tenant.waiting.insert(key, slab_key);
        });
        self.waiting += 1;
        slab_key
    }

    /// Hands capacity to waiters in order for as long as the granter allows,
    /// expiring any whose deadline has passed on the way. Returns the number
    /// of slots granted.
    pub(crate) fn grant_waiting<G: Granter>(
        &mut self,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) -> u64 {
        let mut granted = 0;
        let mut now = None;
        while let Some(&first) = self.tenant_order.first() {
            if self.pacing.is_full() {
                break;
            }
            let Some((_, &slab_key)) = self
                .tenants
                .get(&first.id)
                .and_then(|tenant| tenant.waiting.first_key_value())
            else {
                debug_assert!(false, "a tenant in tenant_order has no waiting work");
                self.tenant_order.remove(&first);
                continue;
            };
            if let Some(deadline) = self.waiters[slab_key].deadline {
                let at = *now.get_or_insert_with(Instant::now);
                if deadline <= at {
                    // Never hand a slot to work that can no longer use it.
                    self.expire(slab_key, at, wakes);
                    continue;
                }
            }
            if !grants.try_get(SLOT) {
                break;
            }
            self.unlink(slab_key);
            self.charge(first.id, SLOT);
            let generation = self.generation;
            let pacing_epoch = self.pacing.granted();
            let waiter = &mut self.waiters[slab_key];
            if let WaiterState::Waiting { waker } = std::mem::replace(
                &mut waiter.state,
                WaiterState::Granted {
                    generation,
                    pacing_epoch,
                },
            ) {
                wakes.push(waker);
            }
            granted += SLOT;
        }
        granted
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
            // Its own waker: the caller is that very future, already awake.
            let mut own = WakeList::default();
            self.expire(slab_key, Instant::now(), &mut own);
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
        let priority = waiter.key.priority.0;
        let observed = match waiter.state {
            WaiterState::Waiting { .. } => unreachable!("settle is only called on settled waiters"),
            WaiterState::Granted {
                generation,
                pacing_epoch,
            } => {
                self.pacing.settled(pacing_epoch);
                if self.pacing.burst.is_some() {
                    self.grant_waiting(grants, wakes);
                }
                Observed::Admitted {
                    generation,
                    waited: Instant::now().saturating_duration_since(waiter.enqueued_at),
                }
            }
            WaiterState::Expired { waited } => {
                Observed::Failed(AdmitError::DeadlineExceeded { waited })
            }
            WaiterState::Closed => Observed::Failed(AdmitError::Closed),
        };
        let outcome = match observed {
            Observed::Admitted { waited, .. } => Settled::Admitted { waited },
            _ => Settled::Errored,
        };
        self.stats.settled(priority, outcome);
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
            self.unlink(slab_key);
        }
        let waiter = self.waiters.remove(slab_key);
        self.stats.settled(waiter.key.priority.0, Settled::Errored);
        if let WaiterState::Granted {
            generation,
            pacing_epoch,
        } = waiter.state
        {
            self.pacing.settled(pacing_epoch);
            self.release(waiter.tenant, generation, grants, wakes);
        }
    }

    /// Admitted work completed: its slot goes back to the granter and on to
    /// the next waiter, and its tenant is un-charged (if charged in this
    /// generation).
    pub(crate) fn release<G: Granter>(
        &mut self,
        tenant: TenantId,
        generation: u64,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) {
        grants.return_grant(SLOT);
        // A permit from before the last reset was already forgotten; its
        // tenant record may even be gone.
        if generation == self.generation && self.tenants.contains_key(&tenant) {
            self.update_tenant(tenant, |t| t.used = t.used.saturating_sub(SLOT));
        }
        self.grant_waiting(grants, wakes);
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
            tenant.waiting.clear();
        }
        self.tenant_order.clear();
        self.waiting = 0;
    }

    /// Periodic upkeep: the usage reset if it is due, and a new pacing epoch
    /// if grants have been stuck behind unobserved ones for too long.
    pub(crate) fn maintain<G: Granter>(
        &mut self,
        now: Instant,
        grants: &mut Grants<'_, G>,
        wakes: &mut WakeList,
    ) {
        self.maybe_reset(now);
        if self.pacing.unstick(now) {
            self.grant_waiting(grants, wakes);
        }
    }

    /// Runs the periodic reset if it is due.
    fn maybe_reset(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_reset) >= self.limits.reset_period {
            self.reset(now);
        }
    }

    /// Forgets all usage and drops tenants with nothing waiting.
    fn reset(&mut self, now: Instant) {
        self.last_reset = now;
        self.generation += 1;
        self.tenants.retain(|_, tenant| !tenant.waiting.is_empty());
        for tenant in self.tenants.values_mut() {
            tenant.used = 0;
        }
        self.tenant_order = self
            .tenants
            .iter()
            .map(|(&id, tenant)| tenant.order(id))
            .collect();
        self.gc_threshold = MIN_GC_THRESHOLD.max(2 * self.tenants.len());
    }

    /// Sets (or with `None`, clears back to the default) one tenant's weight.
    pub(crate) fn set_weight(&mut self, tenant: TenantId, weight: Option<TenantWeight>) {
        match weight {
            Some(weight) if weight != TenantWeight::default() => {
                self.weights.insert(tenant, weight);
            }
            _ => {
                self.weights.remove(&tenant);
            }
        }
        self.refresh_weight(tenant);
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
        let mut waiting_at: FxHashMap<Priority, usize> = FxHashMap::default();
        for (_, waiter) in self.waiters.iter() {
            if matches!(waiter.state, WaiterState::Waiting { .. }) {
                *waiting_at.entry(waiter.key.priority.0).or_default() += 1;
            }
        }
        self.stats
            .snapshot(|priority| waiting_at.get(&priority).copied().unwrap_or(0))
    }

    pub(crate) fn tenant_snapshot(&self) -> Vec<TenantSnapshot> {
        let mut out: Vec<TenantSnapshot> = self
            .tenants
            .iter()
            .map(|(&id, tenant)| TenantSnapshot {
                tenant: id,
                used: tenant.used,
                weight: tenant.weight,
                waiting: tenant.waiting.len(),
            })
            .collect();
        out.sort_by_key(|t| t.tenant);
        out
    }

    /// Takes a waiting request out of its tenant's tree (and its tenant out
    /// of `tenant_order` if that was its last one).
    fn unlink(&mut self, slab_key: usize) {
        let (tenant, key) = {
            let waiter = &self.waiters[slab_key];
            (waiter.tenant, waiter.key)
        };
        self.update_tenant(tenant, |t| {
            t.waiting.remove(&key);
        });
        self.waiting -= 1;
    }

    fn expire(&mut self, slab_key: usize, now: Instant, wakes: &mut WakeList) {
        self.unlink(slab_key);
        let waiter = &mut self.waiters[slab_key];
        let waited = now.saturating_duration_since(waiter.enqueued_at);
        if let WaiterState::Waiting { waker } =
            std::mem::replace(&mut waiter.state, WaiterState::Expired { waited })
        {
            wakes.push(waker);
        }
        tracing::debug!(
            target: "admission",
            tenant = %waiter.tenant,
            priority = %waiter.key.priority.0,
            waited_us = waited.as_micros() as u64,
            "admission deadline expired while waiting"
        );
    }

    fn charge(&mut self, tenant: TenantId, amount: u64) {
        self.with_tenant(tenant, |t| t.used = t.used.saturating_add(amount));
    }

    /// Applies `change` to `tenant`'s record, creating the record if needed.
    /// A new record may first trigger a sweep of idle records once the table
    /// has grown past its threshold, so a stream of one-off tenants on the
    /// fast path cannot grow it without bound between resets.
    fn with_tenant(&mut self, tenant: TenantId, change: impl FnOnce(&mut Tenant)) {
        if !self.tenants.contains_key(&tenant) {
            if self.tenants.len() >= self.gc_threshold {
                self.tenants
                    .retain(|_, t| t.used > 0 || !t.waiting.is_empty());
                self.gc_threshold = MIN_GC_THRESHOLD.max(2 * self.tenants.len());
            }
            let weight = self.weights.get(&tenant).copied().unwrap_or_default();
            self.tenants.insert(
                tenant,
                Tenant {
                    weight,
                    used: 0,
                    waiting: BTreeMap::new(),
                },
            );
        }
        self.update_tenant(tenant, change);
    }

    /// The only way to change a tracked tenant's `used`, `weight` or
    /// `waiting`: keeps its `tenant_order` key in step.
    fn update_tenant(&mut self, id: TenantId, change: impl FnOnce(&mut Tenant)) {
        let Some(tenant) = self.tenants.get_mut(&id) else {
            debug_assert!(false, "update of an untracked tenant");
            return;
        };
        // Tenants with nothing waiting are not in the order (the fast path's
        // case), and a change that leaves the key alone (one more waiter of
        // an already waiting tenant) needs no tree update.
        let before = (!tenant.waiting.is_empty()).then(|| tenant.order(id));
        change(tenant);
        let after = (!tenant.waiting.is_empty()).then(|| tenant.order(id));
        if before != after {
            if let Some(before) = before {
                self.tenant_order.remove(&before);
            }
            if let Some(after) = after {
                self.tenant_order.insert(after);
            }
        }
    }
}
