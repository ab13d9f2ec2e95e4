//! The node's bounded table of tenants under quota: one token queue each,
//! fed by the leasing thread, waited in by the requests.
//!
//! # Implementation notes
//!
//! The table is a map behind one lock, taken on a request's path only to
//! find (or make) its tenant's [`Record`] and mark it used; nothing else
//! happens under it on that path. A record holds the tenant's local
//! balance ([`LocalBalance`]): units at hand that a request takes with one
//! compare-and-swap, and a token queue of the tenant's own
//! where requests over quota wait in priority order (then create time)
//! with deadlines and waker hand-off as in any queue, so one tenant's wait
//! never touches another's. (The queue's own early rejection is off:
//! `QuotaAdmit` weighs a wait against the refill instead, and only when
//! there is one.) The other fields are atomics the leasing thread writes
//! and snapshots read.
//!
//! **Bounds.** At most `max_tenants` records: a request for a tenant not in
//! a full table is refused as over quota, and the leasing thread is woken
//! to sweep. The leasing thread alone removes records (its own state for a
//! tenant lives beside them): those idle for `idle_after` with nobody
//! waiting, and, while the table is full, those idle for one lease period.
//! A removed record's balance is closed before it is read and given back,
//! so no request spends units that were returned; a request that finds its
//! record closed that way looks it up again (once).

use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio::time::Instant;

use super::balance::LocalBalance;
use super::TenantQuota;
use crate::queue::{Usage, WorkQueueBuilder};
use crate::sync::{Mutex, Ordering, StdArc, StdAtomicBool, StdAtomicU64};
use crate::work::TenantId;
use crate::AdmitError;

/// One tenant under quota on this node.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) tenant: TenantId,
    pub(crate) quota: TenantQuota,
    /// The local balance and the requests waiting for it.
    pub(crate) local: LocalBalance,
    /// Units requests asked for since the leasing thread last looked.
    requested: StdAtomicU64,
    /// When a request last looked the record up, in milliseconds since the
    /// table's origin.
    used_ms: StdAtomicU64,
    /// Whether units have begun to reach the record: its first lease was
    /// answered (granted, or failed and the fallback trickle took over).
    /// Until then the refill rate is an assumption and the balance is
    /// empty only because nothing has arrived yet, so a waiting request is
    /// not weighed against it.
    supplied: StdAtomicBool,
    /// Written by the leasing thread every tick (f64 bits where a rate).
    refill_bits: StdAtomicU64,
    demand_bits: StdAtomicU64,
    pub(crate) leased: StdAtomicU64,
    pub(crate) fallback: StdAtomicU64,
    pub(crate) fleet_available: StdAtomicU64,
    /// Written on the request path.
    pub(crate) refused: StdAtomicU64,
    pub(crate) refunded: StdAtomicU64,
}

impl Record {
    fn new(tenant: TenantId, quota: TenantQuota, local: LocalBalance, now_ms: u64) -> Self {
        Record {
            tenant,
            quota,
            local,
            requested: StdAtomicU64::new(0),
            used_ms: StdAtomicU64::new(now_ms),
            supplied: StdAtomicBool::new(false),
            refill_bits: StdAtomicU64::new(0f64.to_bits()),
            demand_bits: StdAtomicU64::new(0f64.to_bits()),
            leased: StdAtomicU64::new(0),
            fallback: StdAtomicU64::new(0),
            fleet_available: StdAtomicU64::new(0),
            refused: StdAtomicU64::new(0),
            refunded: StdAtomicU64::new(0),
        }
    }

    /// Marks the record used at `now_ms` (the table's coarse clock, so
    /// most lookups of a busy tenant find it already marked and write
    /// nothing the leasing thread reads).
    fn touch(&self, now_ms: u64) {
        if self.used_ms.load(Ordering::Relaxed) != now_ms {
            self.used_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// A request asks for `units`.
    pub(crate) fn asked(&self, units: u64) {
        self.requested.fetch_add(units, Ordering::Relaxed);
    }

    /// The units asked for since the last call (the leasing thread's).
    pub(crate) fn take_requested(&self) -> u64 {
        self.requested.swap(0, Ordering::Relaxed)
    }

    /// Units have begun to reach the record: an exchange answered its
    /// lease, or the fallback trickle feeds it. Called by the leasing
    /// thread after it added the units, so that a request that sees the
    /// mark also sees them.
    pub(crate) fn mark_supplied(&self) {
        if !self.supplied.load(Ordering::Relaxed) {
            self.supplied.store(true, Ordering::Release);
        }
    }

    pub(crate) fn set_rates(&self, refill: f64, demand: f64) {
        self.refill_bits.store(refill.to_bits(), Ordering::Relaxed);
        self.demand_bits.store(demand.to_bits(), Ordering::Relaxed);
    }

    pub(crate) fn refill_per_sec(&self) -> f64 {
        f64::from_bits(self.refill_bits.load(Ordering::Relaxed))
    }

    pub(crate) fn demand_per_sec(&self) -> f64 {
        f64::from_bits(self.demand_bits.load(Ordering::Relaxed))
    }

    /// The local balance: negative in debt.
    pub(crate) fn balance(&self) -> i64 {
        self.local.balance()
    }

    /// Gives `units` taken by a request that was then not admitted back to
    /// the local balance (and its waiters).
    pub(crate) fn refund(&self, units: u64) {
        self.local.credit(units);
        self.refunded.fetch_add(units, Ordering::Relaxed);
    }

    /// How long until this node's refill covers `units` and the requests
    /// waiting ahead of them: what `AdmitError::OverQuota` suggests. `None`
    /// until the first lease has been answered (the first lease brings up
    /// to a burst, which no refill rate foretells) and while there is no
    /// refill rate.
    pub(crate) fn expected_wait(&self, units: u64) -> Option<Duration> {
        if !self.supplied.load(Ordering::Acquire) {
            return None;
        }
        let refill = self.refill_per_sec();
        if refill <= 0.0 {
            return None;
        }
        let waiting = self.local.waiting() as u64;
        let needed = i128::from(waiting.saturating_add(1)) * i128::from(units)
            - i128::from(self.balance().max(0));
        let needed = needed.max(i128::from(units)) as f64;
        Some(
            Duration::try_from_secs_f64(needed / refill)
                .unwrap_or(MAX_RETRY_AFTER)
                .clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER),
        )
    }

    /// [`expected_wait`](Self::expected_wait), or a second where there is
    /// no estimate yet.
    pub(crate) fn retry_after(&self, units: u64) -> Duration {
        self.expected_wait(units).unwrap_or(Duration::from_secs(1))
    }
}

/// The shortest and longest `retry_after` the quota suggests.
const MIN_RETRY_AFTER: Duration = Duration::from_millis(1);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The node's tenants under quota.
#[derive(Debug)]
pub(crate) struct Table {
    records: Mutex<FxHashMap<TenantId, StdArc<Record>>>,
    origin: Instant,
    /// Milliseconds since `origin`, as the leasing thread last saw them:
    /// a request marks its record used without reading the clock.
    clock_ms: StdAtomicU64,
    max_tenants: usize,
    builder: WorkQueueBuilder,
    /// New tenants refused because the table was full.
    pub(crate) refused_tenants: StdAtomicU64,
}

/// What a lookup found.
#[derive(Debug)]
pub(crate) enum Found {
    Record(StdArc<Record>),
    /// A new record was made: the leasing thread should ask for it soon.
    New(StdArc<Record>),
    Full,
}

impl Table {
    /// A table of at most `max_tenants` records whose queues allow
    /// `max_waiters` each.
    pub(crate) fn new(max_tenants: usize, max_waiters: usize) -> Self {
        let builder = WorkQueueBuilder::default()
            .name("quota")
            .usage(Usage::Granted)
            .max_waiters(max_waiters);
        Table {
            records: Mutex::new(FxHashMap::default()),
            origin: Instant::now(),
            clock_ms: StdAtomicU64::new(0),
            max_tenants,
            builder,
            refused_tenants: StdAtomicU64::new(0),
        }
    }

    /// A balance as every record's, to check the settings at build.
    pub(crate) fn check(&self) -> Result<(), crate::ConfigError> {
        LocalBalance::build(self.builder.clone(), 1).map(|_| ())
    }

    fn now_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// `tenant`'s record if there is one, marked used now: the request
    /// path's one look at the table.
    pub(crate) fn get(&self, tenant: TenantId) -> Option<StdArc<Record>> {
        let records = self.records.lock();
        let record = records.get(&tenant)?;
        record.touch(self.clock_ms.load(Ordering::Relaxed));
        Some(record.clone())
    }

    /// `tenant`'s record, marked used now; made if it is new and there is room.
    pub(crate) fn find(&self, tenant: TenantId, quota: TenantQuota) -> Result<Found, AdmitError> {
        let now_ms = self.clock_ms.load(Ordering::Relaxed);
        let mut records = self.records.lock();
        if let Some(record) = records.get(&tenant) {
            record.touch(now_ms);
            return Ok(Found::Record(record.clone()));
        }
        if records.len() >= self.max_tenants {
            self.refused_tenants.fetch_add(1, Ordering::Relaxed);
            return Ok(Found::Full);
        }
        // The settings were checked at build, and the burst is at least
        // one; a failure here would be a bug, answered as a closed quota
        // rather than a panic.
        let local = LocalBalance::build(self.builder.clone(), quota.burst()).map_err(|error| {
            tracing::error!(target: "admission", %error, "quota queue could not be made");
            AdmitError::Closed
        })?;
        let record = StdArc::new(Record::new(tenant, quota, local, now_ms));
        records.insert(tenant, record.clone());
        Ok(Found::New(record))
    }

    /// Moves the table's clock (the leasing thread, every tick).
    pub(crate) fn tick(&self, now: Instant) {
        self.clock_ms.fetch_max(self.now_ms(now), Ordering::Relaxed);
    }

    /// Every record, for the leasing thread and snapshots.
    pub(crate) fn records(&self) -> Vec<StdArc<Record>> {
        self.records.lock().values().cloned().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.records.lock().len()
    }

    /// Removes the records idle for `idle_after` (for `full_idle_after`
    /// while the table is full) with nobody waiting, closes their queues
    /// and returns them.
    pub(crate) fn sweep(
        &self,
        now: Instant,
        idle_after: Duration,
        full_idle_after: Duration,
    ) -> Vec<StdArc<Record>> {
        let now_ms = self.now_ms(now);
        let mut records = self.records.lock();
        let idle_after = if records.len() >= self.max_tenants {
            full_idle_after.min(idle_after)
        } else {
            idle_after
        };
        let idle_ms = u64::try_from(idle_after.as_millis()).unwrap_or(u64::MAX);
        let mut removed = Vec::new();
        records.retain(|_, record| {
            let idle = now_ms.saturating_sub(record.used_ms.load(Ordering::Relaxed)) >= idle_ms;
            let keep = !idle || record.local.waiting() > 0;
            if !keep {
                removed.push(record.clone());
            }
            keep
        });
        drop(records);
        for record in &removed {
            record.local.close();
        }
        removed
    }

    /// Removes and closes every record (shutdown).
    pub(crate) fn drain(&self) -> Vec<StdArc<Record>> {
        let removed: Vec<_> = self
            .records
            .lock()
            .drain()
            .map(|(_, record)| record)
            .collect();
        for record in &removed {
            record.local.close();
        }
        removed
    }
}
