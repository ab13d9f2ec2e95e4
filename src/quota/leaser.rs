//! The leasing thread: the only code that talks to the backend.
//!
//! # Implementation notes
//!
//! One OS thread per [`Quota`](super::Quota), running a current-thread
//! tokio runtime of its own, so that leasing keeps its pace when the
//! application's runtime is the one overloaded, and a backend's connection
//! (Redis' connection manager) lives on a runtime nothing else blocks.
//!
//! Every tick (10 ms while degraded, half the minimum lease interval while
//! healthy, and at once when a new tenant appears or an exchange completes) the thread runs [`Leaser::step`] and, if it returns a batch,
//! sends it as a task of its runtime, so that ticks go on while the
//! exchange is in flight (one at a time). [`Leaser::settle`] applies the
//! answer. Both are plain methods on plain state, so the tests drive them
//! with the clock they choose.
//!
//! **States.** `Healthy`: tenants ask as [`TenantLease::ask`] says.
//! `Degraded { since }` (any failed exchange: an error, a timeout of
//! `lease_timeout`, a panic, a wrong answer): every tenant's fallback
//! trickle drips each tick, and one exchange (the asks due, charges
//! included) is tried every `retry_interval`; the first that succeeds
//! makes the node healthy again (resynchronised: the charges reported,
//! the shares current). Requests only ever see the local balances.
//!
//! **Shutdown.** When the quota is closed the thread waits for an exchange
//! in flight (at most `lease_timeout`), closes every tenant's queue, and
//! sends one last batch returning each positive balance and leaving each
//! bucket, within `lease_timeout`; then it ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio::time::Instant;

use super::backend::{BackendError, Lease, LeaseBatch, LeaseFuture, Leased, QuotaBackend};
use super::lease::{Policy, TenantLease};
use super::table::{Record, Table};
use crate::health::Boundary;
use crate::sync::{AtomicBool, Mutex, Ordering, StdArc};
use crate::work::TenantId;

/// How often the thread ticks when nothing wakes it: while degraded, for
/// a smooth trickle; while healthy, half the shortest interval between two
/// asks is soon enough (a new tenant, or an exchange completing, wakes it
/// at once), and every tick touches every tenant's record, cache lines the
/// request path then has to fetch back.
const DEGRADED_TICK: Duration = Duration::from_millis(10);

/// How often idle tenants are swept.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// The node's settings the leasing thread follows.
#[derive(Clone, Debug)]
pub(crate) struct LeaserConfig {
    pub(crate) node: StdArc<str>,
    pub(crate) policy: Policy,
    pub(crate) share_ttl: Duration,
    pub(crate) lease_timeout: Duration,
    pub(crate) retry_interval: Duration,
    pub(crate) idle_after: Duration,
    /// Returns of forgotten tenants kept while the backend is out of reach.
    pub(crate) max_pending: usize,
}

/// What the request path and the leasing thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) table: Table,
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) closed: AtomicBool,
    pub(crate) status: Mutex<Status>,
    pub(crate) boundary: Boundary,
    /// A backstop around the thread's own steps.
    pub(crate) thread_boundary: Boundary,
}

/// The node's standing with the backend.
#[derive(Clone, Debug, Default)]
pub(crate) struct Status {
    pub(crate) degraded_since: Option<Instant>,
    pub(crate) exchanges: u64,
    pub(crate) failures: u64,
    pub(crate) last_error: Option<BackendError>,
    pub(crate) pending_returns: usize,
}

/// The leasing thread's state.
pub(crate) struct Leaser {
    shared: StdArc<Shared>,
    backend: StdArc<dyn QuotaBackend>,
    config: LeaserConfig,
    tenants: FxHashMap<TenantId, (StdArc<Record>, TenantLease)>,
    /// Leaving leases of forgotten tenants, not yet sent.
    pending: Vec<Lease>,
    in_flight: bool,
    degraded: bool,
    next_probe: Instant,
    last_sweep: Instant,
}

impl std::fmt::Debug for Leaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaser")
            .field("tenants", &self.tenants.len())
            .field("pending", &self.pending.len())
            .field("in_flight", &self.in_flight)
            .field("degraded", &self.degraded)
            .finish()
    }
}

impl Leaser {
    pub(crate) fn new(
        shared: StdArc<Shared>,
        backend: StdArc<dyn QuotaBackend>,
        config: LeaserConfig,
        now: Instant,
    ) -> Self {
        Leaser {
            shared,
            backend,
            config,
            tenants: FxHashMap::default(),
            pending: Vec::new(),
            in_flight: false,
            degraded: false,
            next_probe: now,
            last_sweep: now,
        }
    }

    /// One tick: takes in new tenants, forgets idle ones, measures demand,
    /// drips the fallback while degraded, and returns the batch to send
    /// now, if any.
    pub(crate) fn step(&mut self, now: Instant) -> Option<LeaseBatch> {
        let policy = self.config.policy;
        self.shared.table.tick(now);
        if now.saturating_duration_since(self.last_sweep) >= SWEEP_EVERY {
            self.last_sweep = now;
            self.sweep(now);
        }
        for record in self.shared.table.records() {
            self.tenants.entry(record.tenant).or_insert_with(|| {
                (
                    record.clone(),
                    TenantLease::new(record.tenant, record.quota, now),
                )
            });
        }
        for (record, lease) in self.tenants.values_mut() {
            lease.observe(now, record.take_requested(), &policy);
            if self.degraded {
                let units = lease.drip(now, record.balance(), &policy);
                if units > 0 {
                    record.fallback.fetch_add(units, Ordering::Relaxed);
                    record.local.credit(units);
                    crate::export::quota_fallback_units(units);
                }
                record.mark_supplied();
            }
            record.set_rates(lease.refill_per_sec(&policy), lease.demand_per_sec(&policy));
        }
        if self.in_flight || (self.degraded && now < self.next_probe) {
            return None;
        }
        let mut leases: Vec<Lease> = self
            .tenants
            .values_mut()
            .filter_map(|(record, lease)| {
                lease.ask(now, record.balance(), record.local.waiting(), &policy)
            })
            .collect();
        leases.append(&mut self.pending);
        if leases.is_empty() {
            return None;
        }
        self.in_flight = true;
        Some(LeaseBatch::new(
            self.config.node.clone(),
            self.config.share_ttl,
            leases,
        ))
    }

    /// Applies the answer to `batch`.
    pub(crate) fn settle(
        &mut self,
        now: Instant,
        batch: &LeaseBatch,
        answer: Result<Vec<Leased>, BackendError>,
    ) {
        self.in_flight = false;
        let answer = answer.and_then(|answers| {
            if answers.len() == batch.leases.len() {
                Ok(answers)
            } else {
                Err(BackendError::Invalid(format!(
                    "{} answers to {} leases",
                    answers.len(),
                    batch.leases.len()
                )))
            }
        });
        match answer {
            Ok(answers) => {
                let mut leased = 0u64;
                for (lease, answer) in batch.leases.iter().zip(answers) {
                    if lease.leaving {
                        continue;
                    }
                    let Some((record, tenant)) = self.tenants.get_mut(&lease.tenant) else {
                        continue;
                    };
                    let units = tenant.granted(lease, answer);
                    // The bucket now counts the trickle's units as spent:
                    // those still held here would be spent a second time.
                    let unspent = lease.charge.min(record.balance().max(0).unsigned_abs());
                    if unspent > 0 {
                        record.local.charge(unspent);
                    }
                    if units > 0 {
                        // Counted before the waiters it admits can look.
                        record.leased.fetch_add(units, Ordering::Relaxed);
                        record.local.credit(units);
                        leased = leased.saturating_add(units);
                    }
                    record.mark_supplied();
                    record
                        .fleet_available
                        .store(tenant.available, Ordering::Relaxed);
                }
                crate::export::quota_leased_units(leased);
                self.recovered(now);
            }
            Err(error) => {
                for lease in &batch.leases {
                    if lease.leaving {
                        self.keep_pending(lease.clone());
                    } else if let Some((record, tenant)) = self.tenants.get_mut(&lease.tenant) {
                        tenant.failed();
                        // From now on the fallback trickle feeds it, at the
                        // rate its waiters are weighed against.
                        record.mark_supplied();
                    }
                }
                self.failed(now, error);
            }
        }
        self.shared.status.lock().pending_returns = self.pending.len();
    }

    fn recovered(&mut self, now: Instant) {
        let mut status = self.shared.status.lock();
        status.exchanges = status.exchanges.saturating_add(1);
        if self.degraded {
            self.degraded = false;
            let since = status.degraded_since.take();
            drop(status);
            for (_, lease) in self.tenants.values_mut() {
                lease.stop_dripping();
            }
            tracing::info!(
                target: "admission",
                node = %self.config.node,
                degraded_for_ms = since.map(|since| now.saturating_duration_since(since).as_millis() as u64),
                "quota backend reachable again: leasing resumed"
            );
            crate::export::quota_degraded(false);
        }
    }

    fn failed(&mut self, now: Instant, error: BackendError) {
        self.next_probe = now + self.config.retry_interval;
        crate::export::quota_backend_failure();
        let mut status = self.shared.status.lock();
        status.failures = status.failures.saturating_add(1);
        if !self.degraded {
            self.degraded = true;
            status.degraded_since = Some(now);
            for (_, lease) in self.tenants.values_mut() {
                lease.start_dripping(now);
            }
            tracing::warn!(
                target: "admission",
                node = %self.config.node,
                %error,
                "quota backend failed: admitting on the local fallback trickle"
            );
            crate::export::quota_degraded(true);
        }
        status.last_error = Some(error);
    }

    /// Forgets tenants idle long enough: their queues are closed, their
    /// balances returned with the next batch.
    fn sweep(&mut self, now: Instant) {
        let full_idle_after = self.config.policy.lease_period;
        for record in self
            .shared
            .table
            .sweep(now, self.config.idle_after, full_idle_after)
        {
            let balance = record.balance();
            let lease = match self.tenants.remove(&record.tenant) {
                Some((_, lease)) => lease.leaving(balance),
                None => TenantLease::new(record.tenant, record.quota, now).leaving(balance),
            };
            self.keep_pending(lease);
        }
    }

    /// Keeps a leaving lease to send, within the bound: beyond it the
    /// oldest is dropped (its units are lost to the fleet, never doubled).
    fn keep_pending(&mut self, lease: Lease) {
        if self.pending.len() >= self.config.max_pending {
            self.pending.remove(0);
        }
        self.pending.push(lease);
    }

    /// The last batch: every tenant's queue closed, each positive balance
    /// returned and each bucket left.
    pub(crate) fn final_batch(&mut self) -> Option<LeaseBatch> {
        let now = Instant::now();
        for record in self.shared.table.drain() {
            self.tenants.entry(record.tenant).or_insert_with(|| {
                (
                    record.clone(),
                    TenantLease::new(record.tenant, record.quota, now),
                )
            });
        }
        let mut leases: Vec<Lease> = self
            .tenants
            .drain()
            .map(|(_, (record, lease))| lease.leaving(record.balance()))
            .collect();
        leases.append(&mut self.pending);
        (!leases.is_empty())
            .then(|| LeaseBatch::new(self.config.node.clone(), self.config.share_ttl, leases))
    }

    /// Whether the node is on its fallback trickle.
    #[cfg(test)]
    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded
    }

    /// One tick as the thread runs it, the exchange awaited in place:
    /// whether there was one.
    #[cfg(test)]
    pub(crate) async fn tick(&mut self, now: Instant) -> bool {
        let Some(batch) = self.step(now) else {
            return false;
        };
        let answer = exchange(
            &*self.backend,
            &batch,
            self.config.lease_timeout,
            &self.shared.boundary,
        )
        .await;
        self.settle(now, &batch, answer);
        true
    }

    /// The last batch, sent as the thread sends it at shutdown.
    #[cfg(test)]
    pub(crate) async fn shut_down(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        if let Some(batch) = self.final_batch() {
            let _ = exchange(
                &*self.backend,
                &batch,
                self.config.lease_timeout,
                &self.shared.boundary,
            )
            .await;
        }
    }
}

/// One exchange, behind the backend's panic boundary and `timeout`.
pub(crate) async fn exchange(
    backend: &dyn QuotaBackend,
    batch: &LeaseBatch,
    timeout: Duration,
    boundary: &Boundary,
) -> Result<Vec<Leased>, BackendError> {
    let Some(future) = boundary.call(|| backend.exchange(batch)) else {
        return Err(BackendError::Panicked);
    };
    let guarded = Guarded { future, boundary };
    match tokio::time::timeout(timeout, guarded).await {
        Ok(answer) => answer,
        Err(_) => Err(BackendError::Timeout(timeout)),
    }
}

/// A backend's future, each poll behind its panic boundary.
struct Guarded<'a> {
    future: LeaseFuture<'a>,
    boundary: &'a Boundary,
}

impl Future for Guarded<'_> {
    type Output = Result<Vec<Leased>, BackendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let future = &mut this.future;
        this.boundary
            .call(|| future.as_mut().poll(cx))
            .unwrap_or(Poll::Ready(Err(BackendError::Panicked)))
    }
}

/// Starts the leasing thread.
pub(crate) fn spawn(mut leaser: Leaser) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("admission-quota".into())
        .spawn(move || {
            runtime.block_on(run(&mut leaser));
        })
}

async fn run(leaser: &mut Leaser) {
    let shared = leaser.shared.clone();
    let (sender, mut answers) = tokio::sync::mpsc::unbounded_channel();
    loop {
        if shared.closed.load(Ordering::Acquire) {
            break;
        }
        let batch = shared
            .thread_boundary
            .backstop(|| leaser.step(Instant::now()))
            .flatten();
        if let Some(batch) = batch {
            let (backend, shared, sender) =
                (leaser.backend.clone(), shared.clone(), sender.clone());
            let timeout = leaser.config.lease_timeout;
            tokio::spawn(async move {
                let answer = exchange(&*backend, &batch, timeout, &shared.boundary).await;
                let _ = sender.send((batch, answer));
                shared.wake.notify_one();
            });
        }
        let tick = if leaser.degraded {
            DEGRADED_TICK
        } else {
            (leaser.config.policy.min_interval / 2).max(DEGRADED_TICK)
        };
        let _ = tokio::time::timeout(tick, shared.wake.notified()).await;
        while let Ok((batch, answer)) = answers.try_recv() {
            let now = Instant::now();
            shared
                .thread_boundary
                .backstop(|| leaser.settle(now, &batch, answer));
        }
    }
    if leaser.in_flight {
        if let Ok(Some((batch, answer))) =
            tokio::time::timeout(leaser.config.lease_timeout, answers.recv()).await
        {
            let now = Instant::now();
            shared
                .thread_boundary
                .backstop(|| leaser.settle(now, &batch, answer));
        }
    }
    if let Some(batch) = shared
        .thread_boundary
        .backstop(|| leaser.final_batch())
        .flatten()
    {
        let timeout = leaser.config.lease_timeout;
        if let Err(error) = exchange(&*leaser.backend, &batch, timeout, &shared.boundary).await {
            tracing::warn!(
                target: "admission",
                node = %leaser.config.node,
                %error,
                "quota leases could not be returned at shutdown; the fleet loses them until its buckets refill"
            );
        }
    }
}
