//! Tenant quotas across a fleet: leased token buckets, local admission.
//!
//! Per-node admission keeps each node fair between tenants, but nothing
//! there bounds what one tenant takes of a fleet of stateless nodes behind
//! a balancer. A [`Quota`] gives each tenant a **rate** (units a second:
//! one per request by default, or whatever a request costs, bytes or CPU
//! time) and a **burst**, enforced fleet-wide, while every admission
//! decision stays local to the node. The design is CockroachDB's tenant
//! cost controller's: the fleet's state is one token bucket per tenant in a
//! store that already exists (Redis, through `RedisBackend` with feature
//! `redis`; or, for one node, [`InMemoryBackend`], the default), and each
//! node **leases** units from it in batches, spends them locally, and falls
//! back to a fixed trickle when the store cannot be reached.
//!
//! # How a request is admitted
//!
//! [`Quota::admit`] composes the quota with the node's capacity: a request
//! needs both, quota first ([`QuotaAdmit`]). Each tenant under quota has a
//! local balance on the node, what the node leased, and a token queue of
//! its own ([`WorkQueue<TokenGranter>`]). While the node holds a lease a
//! request takes its units with one compare-and-swap, no lock and no
//! clock, so a leased quota costs about what a local token bucket does;
//! a request that finds too few waits in the queue, in priority order
//! and then create time, until a lease (or the fallback) covers it or its
//! deadline comes, and is refused at once when the rate units reach this
//! node at could not cover it before its deadline (except while its
//! tenant's first lease on the node is in flight: the rate is then a
//! guess and the lease brings up to a burst, so it waits for the lease).
//! A refusal comes back as
//! [`AdmitError::OverQuota`] with a `retry_after` computed from the rate
//! at which units reach this node (the tower layer answers it with 429
//! and `Retry-After`; see `AdmissionLayer::with_quota` with feature `tower`).
//! Then the request waits for the node's capacity in its ordinary queue,
//! where tenant fairness and priority apply as before. A tenant over
//! quota waits only in its own queue, so it never holds a place, or a
//! slot, in front of other tenants' work. Units taken by a request that
//! capacity then refuses (or whose future is dropped while it waits for
//! capacity) are refunded to its tenant's balance: quota pays for work
//! that ran.
//!
//! [`WorkQueue<TokenGranter>`]: crate::WorkQueue
//! [`TokenGranter`]: crate::grant::TokenGranter
//!
//! # How units are leased
//!
//! A thread of the quota's own (`admission-quota`, with a tokio runtime of
//! its own) is the only code that talks to the backend: **no request ever
//! waits on a round trip while the node holds a lease**. Every 10 ms it
//! measures each tenant's demand on the node (units asked, admitted or
//! not), and asks, in one batch for every tenant due, for about one
//! [`lease_period`](QuotaBuilder::lease_period) of that demand once the
//! last lease is half spent (at most every
//! [`min_lease_interval`](QuotaBuilder::min_lease_interval)).
//!
//! The store's bucket refills by its own clock (Redis' `TIME`: clock skew
//! between nodes does not matter) and divides the refill among the nodes
//! in proportion to the demand each reported, each node's part capped at
//! its share of the burst, the rest in a pool anyone may take. So under
//! contention each node's share follows its demand (the node with 70% of
//! a tenant's requests gets 70% of its quota, and every request has the
//! same chance wherever the balancer sent it), and without contention
//! every node gets what it asks. The units granted, less those returned,
//! never exceed the burst plus the refill (`bucket.rs`, and the same
//! arithmetic as one Lua script in `lease.lua`).
//!
//! # Failure model
//!
//! * **The store unreachable, slow or restarted**: an exchange that fails
//!   or takes longer than [`lease_timeout`](QuotaBuilder::lease_timeout)
//!   puts the node in the degraded state ([`QuotaSnapshot::degraded`],
//!   the `admission_quota_degraded` gauge, a warning in the log): each
//!   tenant's balance is then refilled locally by a fixed trickle
//!   ([`TenantQuota::fallback_rate`], by default the rate over
//!   [`expected_nodes`](QuotaBuilder::expected_nodes)), on top of what the
//!   node still holds. An exchange is tried every
//!   [`retry_interval`](QuotaBuilder::retry_interval); the first that
//!   succeeds resynchronises: the units the trickle added are charged to
//!   the bucket (as far as it holds them), so the fleet does not admit the
//!   outage twice; those of them the node still holds are given up, since
//!   the bucket now counts them as spent; and leasing resumes. A restarted store without
//!   persistence makes every bucket anew, full.
//! * **A node that dies** loses its balance (at most its lease: its
//!   unspent units are simply not spent) and what the bucket had set aside
//!   for it (at most its share of the burst): its share lapses after three
//!   lease periods without a word from it, and the rest of the fleet gets
//!   the whole refill from then on. So a death never lets the fleet run
//!   over the quota; it under-admits by at most those units.
//! * **Shutdown** ([`Quota::shutdown`], or dropping the last handle)
//!   closes every tenant's queue and returns each unspent balance within
//!   `lease_timeout`.
//! * **Tenant ids from headers** never grow state without bound: at most
//!   [`max_tenants`](QuotaBuilder::max_tenants) on a node (a request for a
//!   new tenant in a full table is refused as over quota), idle tenants
//!   are forgotten (their balance returned), and every bucket in the store
//!   has a TTL (at least the time its burst takes to refill, so an expired
//!   bucket is one that would be full anyway). Tenants without a quota
//!   (no [`default_quota`](QuotaBuilder::default_quota) and none of their
//!   own) have no record at all.
//! * **A backend that panics** is a failed exchange (component
//!   `quota_backend`, in [`QuotaSnapshot::backend_health`]).
//!
//! # Example
//!
//! ```
//! use admission::quota::{Quota, TenantQuota};
//! use admission::{Priority, TenantId, WorkInfo, WorkQueue};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let capacity = WorkQueue::new(4)?;
//! // 100 requests a second for tenant 7, fleet-wide (one node here: the
//! // in-process backend).
//! let quota = Quota::builder()
//!     .tenant(TenantId::new(7), TenantQuota::new(100, 100)?)
//!     .build()?;
//! let work = WorkInfo::new(TenantId::new(7), Priority::NORMAL);
//! let permit = quota.admit(&capacity, work).await?;
//! drop(permit);
//! # Ok(())
//! # }
//! ```

mod admit;
mod backend;
mod balance;
mod bucket;
mod lease;
mod leaser;
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_models;
#[cfg(feature = "redis")]
mod redis;
mod table;
#[cfg(test)]
mod tests;

pub use admit::QuotaAdmit;
pub use backend::{
    BackendError, InMemoryBackend, Lease, LeaseBatch, LeaseFuture, Leased, QuotaBackend,
};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisBackend, RedisBackendBuilder};

use std::fmt;
use std::time::Duration;

use rustc_hash::FxHashMap;

use self::lease::Policy;
use self::leaser::{Leaser, LeaserConfig, Shared, Status};
use self::table::{Found, Record, Table};
use crate::error::ConfigError;
use crate::grant::Granter;
use crate::health::{Boundary, ComponentHealth};
use crate::queue::WorkQueue;
use crate::sync::{AtomicBool, Mutex, Ordering, StdArc};
use crate::work::{TenantId, WorkInfo};
use crate::AdmitError;

/// One tenant's quota: a rate and a burst, fleet-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantQuota {
    rate: u64,
    burst: u64,
    fallback: Option<u64>,
}

impl TenantQuota {
    /// The largest rate and burst accepted: large enough for bytes a
    /// second, small enough that the buckets' arithmetic (in doubles, as in
    /// Redis' Lua) stays exact to the unit. A validation rule: `new`'s
    /// error states it.
    pub(crate) const MAX_UNITS: u64 = 1 << 40;

    /// `rate` units a second, at most `burst` banked; a [`ConfigError`]
    /// naming `rate` or `burst` if either is zero or above 2^40 (large
    /// enough for bytes a second, small enough that the buckets'
    /// arithmetic, in doubles as in Redis' Lua, stays exact to the unit).
    ///
    /// # Errors
    ///
    /// A zero rate would admit nothing, ever; a zero burst could never
    /// bank a unit. The error's message names the accepted range.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::quota::TenantQuota;
    ///
    /// // 100 requests a second, fleet-wide, and bursts of up to 200.
    /// let quota = TenantQuota::new(100, 200)?;
    /// assert_eq!((quota.rate(), quota.burst()), (100, 200));
    ///
    /// assert_eq!(TenantQuota::new(0, 200).unwrap_err().field(), "rate");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn new(rate: u64, burst: u64) -> Result<Self, ConfigError> {
        for (field, value) in [("rate", rate), ("burst", burst)] {
            if value == 0 || value > Self::MAX_UNITS {
                return Err(ConfigError::out_of_range(field, value, 1, Self::MAX_UNITS));
            }
        }
        Ok(TenantQuota {
            rate,
            burst,
            fallback: None,
        })
    }

    /// The units a second each node admits for this tenant while it cannot
    /// reach the backend (default: the rate over
    /// [`expected_nodes`](QuotaBuilder::expected_nodes)). Zero admits
    /// nothing then, beyond what the node still holds.
    pub fn fallback_rate(mut self, units_per_sec: u64) -> Self {
        self.fallback = Some(units_per_sec.min(Self::MAX_UNITS));
        self
    }

    /// Units a second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The most units banked.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The fallback trickle, if set.
    pub fn fallback(&self) -> Option<u64> {
        self.fallback
    }
}

/// Builds a [`Quota`]; see [`Quota::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct QuotaBuilder {
    backend: StdArc<dyn QuotaBackend>,
    node_id: Option<String>,
    expected_nodes: u32,
    default_quota: Option<TenantQuota>,
    tenants: FxHashMap<TenantId, TenantQuota>,
    lease_period: Duration,
    min_lease_interval: Duration,
    lease_timeout: Duration,
    retry_interval: Duration,
    max_tenants: usize,
    max_waiters: usize,
    idle_after: Duration,
}

impl Default for QuotaBuilder {
    fn default() -> Self {
        QuotaBuilder {
            backend: StdArc::new(InMemoryBackend::new()),
            node_id: None,
            expected_nodes: 1,
            default_quota: None,
            tenants: FxHashMap::default(),
            lease_period: Duration::from_secs(1),
            min_lease_interval: Duration::from_millis(50),
            lease_timeout: Duration::from_millis(100),
            retry_interval: Duration::from_millis(250),
            max_tenants: 4_096,
            max_waiters: 1_000,
            idle_after: Duration::from_secs(30),
        }
    }
}

impl QuotaBuilder {
    /// Where the fleet's buckets live (default: an [`InMemoryBackend`] of
    /// this quota's own, a single node).
    pub fn backend(mut self, backend: impl QuotaBackend) -> Self {
        self.backend = StdArc::new(backend);
        self
    }

    /// This node's id in the buckets (default: made from the host name,
    /// the process id and the time; [`QuotaSnapshot::node`] says which).
    /// Each node of a fleet needs its own; at most 200 bytes.
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = Some(id.into());
        self
    }

    /// How many nodes share each quota, for the default fallback trickle
    /// (the rate over this count); default 1. At least 1.
    pub fn expected_nodes(mut self, nodes: u32) -> Self {
        self.expected_nodes = nodes;
        self
    }

    /// The quota of every tenant without one of its own (default: none,
    /// such tenants are not limited by the quota at all).
    pub fn default_quota(mut self, quota: TenantQuota) -> Self {
        self.default_quota = Some(quota);
        self
    }

    /// `tenant`'s own quota.
    pub fn tenant(mut self, tenant: TenantId, quota: TenantQuota) -> Self {
        self.tenants.insert(tenant, quota);
        self
    }

    /// A lease covers about this long of the node's recent demand (default
    /// one second); a node's share of a bucket lapses after three of them
    /// without an exchange. Between 10 ms and one hour.
    pub fn lease_period(mut self, period: Duration) -> Self {
        self.lease_period = period;
        self
    }

    /// The shortest time between two asks for one tenant (default 50 ms):
    /// under contention, when leases are small, a node asks this often.
    /// At least 1 ms and at most the lease period.
    pub fn min_lease_interval(mut self, interval: Duration) -> Self {
        self.min_lease_interval = interval;
        self
    }

    /// How long an exchange may take before it counts as failed and the
    /// node falls back (default 100 ms). Between 1 ms and 60 s.
    pub fn lease_timeout(mut self, timeout: Duration) -> Self {
        self.lease_timeout = timeout;
        self
    }

    /// How often a degraded node tries the backend again (default 250 ms).
    /// Between 1 ms and 60 s.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// The most tenants under quota this node keeps (default 4,096; a
    /// record is a token queue, a few kilobytes). At least 1.
    pub fn max_tenants(mut self, max: usize) -> Self {
        self.max_tenants = max;
        self
    }

    /// The most requests of one tenant waiting for its quota at once
    /// (default 1,000); one more is refused as over quota. At least 1.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = max;
        self
    }

    /// How long a tenant no request has asked for is kept before it is
    /// forgotten and its balance returned (default 30 s). At least the
    /// lease period.
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.idle_after = idle;
        self
    }

    /// The quota, its leasing thread started.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting out of range, or `thread` when
    /// the leasing thread cannot be started.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::quota::{Quota, TenantQuota};
    /// use admission::TenantId;
    ///
    /// let quota = Quota::builder()
    ///     .tenant(TenantId::new(7), TenantQuota::new(100, 100)?)
    ///     .build()?;
    /// assert_eq!(quota.quota_of(TenantId::new(7)).map(|q| q.rate()), Some(100));
    /// // Without a default quota, other tenants are not limited.
    /// assert_eq!(quota.quota_of(TenantId::new(8)), None);
    ///
    /// let err = Quota::builder()
    ///     .lease_period(Duration::from_millis(1))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "lease_period");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<Quota, ConfigError> {
        let (quota, leaser) = self.assemble()?;
        let thread = leaser::spawn(leaser)
            .map_err(|error| ConfigError::new("thread", format!("the leasing thread: {error}")))?;
        *quota.inner.thread.lock() = Some(thread);
        Ok(quota)
    }

    /// The quota and its leasing state, the thread not started: for tests
    /// that step the leasing themselves.
    pub(crate) fn assemble(self) -> Result<(Quota, Leaser), ConfigError> {
        let in_range = |field: &'static str, value: Duration, min: Duration, max: Duration| {
            if value < min || value > max {
                Err(ConfigError::new(
                    field,
                    format!("{value:?} is outside the accepted range {min:?}..={max:?}"),
                ))
            } else {
                Ok(())
            }
        };
        let ms = Duration::from_millis;
        in_range(
            "lease_period",
            self.lease_period,
            ms(10),
            Duration::from_secs(3_600),
        )?;
        in_range(
            "min_lease_interval",
            self.min_lease_interval,
            ms(1),
            self.lease_period,
        )?;
        in_range(
            "lease_timeout",
            self.lease_timeout,
            ms(1),
            Duration::from_secs(60),
        )?;
        in_range(
            "retry_interval",
            self.retry_interval,
            ms(1),
            Duration::from_secs(60),
        )?;
        in_range(
            "idle_after",
            self.idle_after,
            self.lease_period,
            Duration::MAX,
        )?;
        if self.expected_nodes == 0 {
            return Err(ConfigError::new(
                "expected_nodes",
                "0 nodes cannot share a quota; use at least 1",
            ));
        }
        if self.max_tenants == 0 {
            return Err(ConfigError::new(
                "max_tenants",
                "0 would refuse every tenant; use at least 1",
            ));
        }
        if self.max_waiters == 0 {
            return Err(ConfigError::new(
                "max_waiters",
                "0 would refuse every request that has to wait; use at least 1",
            ));
        }
        let node: StdArc<str> = match self.node_id {
            Some(id) if id.is_empty() || id.len() > 200 || id.contains(char::is_whitespace) => {
                return Err(ConfigError::new(
                    "node_id",
                    "must be 1 to 200 bytes without whitespace",
                ))
            }
            Some(id) => id.into(),
            None => default_node_id().into(),
        };
        let table = Table::new(self.max_tenants, self.max_waiters);
        table.check()?;
        let shared = StdArc::new(Shared {
            table,
            wake: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            status: Mutex::new(Status::default()),
            boundary: Boundary::new(
                "quota_backend",
                "the exchange failed: the node admits on its fallback trickle",
            ),
            thread_boundary: Boundary::new(
                "quota_leaser",
                "that tick is skipped; the thread ticks again",
            ),
        });
        let policy = Policy {
            lease_period: self.lease_period,
            min_interval: self.min_lease_interval,
            expected_nodes: self.expected_nodes,
            demand_window: Duration::from_millis(100),
        };
        let config = LeaserConfig {
            node: node.clone(),
            policy,
            share_ttl: self.lease_period.saturating_mul(3),
            lease_timeout: self.lease_timeout,
            retry_interval: self.retry_interval,
            idle_after: self.idle_after,
            max_pending: self.max_tenants,
        };
        let leaser = Leaser::new(
            shared.clone(),
            self.backend,
            config,
            tokio::time::Instant::now(),
        );
        let quota = Quota {
            inner: StdArc::new(Inner {
                shared,
                node,
                policy,
                default_quota: self.default_quota,
                tenants: self.tenants,
                thread: Mutex::new(None),
            }),
        };
        Ok((quota, leaser))
    }
}

/// A node id no other node has: the host, the process and the time.
fn default_node_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|host| !host.is_empty() && host.len() <= 64 && !host.contains(char::is_whitespace))
        .unwrap_or_else(|| "node".to_owned());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or_default();
    format!(
        "{host}-{}-{:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// Fleet-wide tenant quotas on this node; see the [module docs](self).
///
/// A cheap handle: clones share the quota. The leasing thread stops, and
/// the node's unspent units are returned, at [`shutdown`](Self::shutdown)
/// or when the last handle (or [`QuotaAdmit`]) is dropped.
#[derive(Clone)]
pub struct Quota {
    inner: StdArc<Inner>,
}

struct Inner {
    shared: StdArc<Shared>,
    node: StdArc<str>,
    policy: Policy,
    default_quota: Option<TenantQuota>,
    tenants: FxHashMap<TenantId, TenantQuota>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Quota {
    /// A builder with the defaults: the in-process backend, one node, no
    /// tenant under quota.
    pub fn builder() -> QuotaBuilder {
        QuotaBuilder::default()
    }

    /// Asks for `work` to be admitted by its tenant's quota (one unit),
    /// then by `capacity` (the node's CPU queue, say); see [`QuotaAdmit`].
    ///
    /// Nothing happens until the future is polled. A tenant without a
    /// quota goes straight to `capacity`.
    ///
    /// # Errors
    ///
    /// The future fails with [`AdmitError::OverQuota`] when the tenant's
    /// quota refused the request (its queue full, its deadline out of
    /// reach at the rate units reach this node, or past while it waited; or
    /// the node's table of tenants full), with any error of `capacity`'s
    /// queue after that, and with [`AdmitError::Closed`] once the quota is
    /// shut down.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses neither quota nor capacity: a
    /// request waiting for quota leaves its tenant's queue (a grant it had
    /// not seen is credited back); units taken by a request that then
    /// waits for capacity are refunded if it is dropped, or refused, there.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::quota::{Quota, TenantQuota};
    /// use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let capacity = WorkQueue::new(8)?;
    /// let quota = Quota::builder()
    ///     .default_quota(TenantQuota::new(2, 2)?)
    ///     .build()?;
    /// let work = || WorkInfo::new(TenantId::new(3), Priority::NORMAL);
    /// // The burst of two admits two (the first waits for the node's first
    /// // lease)...
    /// let first = quota.admit(&capacity, work()).await?;
    /// let second = quota.admit(&capacity, work()).await?;
    /// // ...and a third that cannot wait for the refill is over quota.
    /// let hurried = WorkInfo::builder()
    ///     .tenant(TenantId::new(3))
    ///     .timeout(Duration::from_millis(10))
    ///     .build();
    /// match quota.admit(&capacity, hurried).await {
    ///     Err(AdmitError::OverQuota { retry_after }) => assert!(retry_after > Duration::ZERO),
    ///     other => panic!("{other:?}"),
    /// }
    /// # drop((first, second));
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit<G: Granter>(&self, capacity: &WorkQueue<G>, work: WorkInfo) -> QuotaAdmit<G> {
        self.admit_units(capacity, work, 1)
    }

    /// Like [`admit`](Self::admit), for a request that costs `units` of its
    /// tenant's quota (bytes, an estimate of CPU time...; zero counts as
    /// one). `capacity` is asked for what `work` asks, as ever.
    ///
    /// # Errors
    ///
    /// As [`admit`](Self::admit): [`AdmitError::OverQuota`] when the
    /// tenant's quota refuses the request, any error of `capacity`'s queue
    /// after that, and [`AdmitError::Closed`] once the quota is shut down.
    ///
    /// # Cancel safety
    ///
    /// As [`admit`](Self::admit): dropping the future at any point loses
    /// neither quota nor capacity; units already taken are refunded.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::quota::{Quota, TenantQuota};
    /// use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let capacity = WorkQueue::new(8)?;
    /// // Each tenant may upload 1 MiB a second; an upload pays its bytes.
    /// let quota = Quota::builder()
    ///     .default_quota(TenantQuota::new(1 << 20, 1 << 20)?)
    ///     .build()?;
    /// let upload = || WorkInfo::new(TenantId::new(3), Priority::NORMAL);
    /// let permit = quota.admit_units(&capacity, upload(), 64 << 10).await?;
    /// drop(permit);
    ///
    /// // Capacity refuses the next one: its units go back to the tenant.
    /// capacity.close();
    /// let refused = quota.admit_units(&capacity, upload(), 64 << 10).await;
    /// assert!(matches!(refused, Err(AdmitError::Closed)));
    /// assert_eq!(quota.snapshot().tenants[0].refunded, 64 << 10);
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit_units<G: Granter>(
        &self,
        capacity: &WorkQueue<G>,
        work: WorkInfo,
        units: u64,
    ) -> QuotaAdmit<G> {
        QuotaAdmit::new(self.clone(), capacity.clone(), work, units)
    }

    /// Settles an admitted request's estimate against its actual cost: the
    /// difference is charged to (or credited back to) its tenant's local
    /// balance at once, never blocking; a charge may leave the balance in
    /// debt (at most one burst), paid from the next leases.
    ///
    /// A tenant this node no longer holds (forgotten as idle, or never
    /// under quota) is not corrected: its balance went back to the fleet.
    pub fn correct(&self, tenant: TenantId, estimated: u64, actual: u64) {
        if let Some(record) = self.inner.shared.table.get(tenant) {
            if actual > estimated {
                record.local.charge(actual - estimated);
            } else {
                record.local.credit(estimated - actual);
            }
        }
    }

    /// `tenant`'s quota: its own, or the default.
    pub fn quota_of(&self, tenant: TenantId) -> Option<TenantQuota> {
        self.inner
            .tenants
            .get(&tenant)
            .copied()
            .or(self.inner.default_quota)
    }

    /// The record of `tenant`, if it is under quota.
    fn record(&self, tenant: TenantId) -> Result<Option<StdArc<Record>>, AdmitError> {
        // The table first: a tenant in it is under quota, and a busy
        // tenant is nearly always in it.
        if let Some(record) = self.inner.shared.table.get(tenant) {
            return Ok(Some(record));
        }
        let Some(quota) = self.quota_of(tenant) else {
            return Ok(None);
        };
        if self.is_closed() {
            return Err(AdmitError::Closed);
        }
        match self.inner.shared.table.find(tenant, quota)? {
            Found::Record(record) => Ok(Some(record)),
            Found::New(record) => {
                self.inner.shared.wake.notify_one();
                Ok(Some(record))
            }
            Found::Full => {
                // Wake the leasing thread to forget idle tenants.
                self.inner.shared.wake.notify_one();
                crate::export::quota_over_quota();
                Err(AdmitError::OverQuota {
                    retry_after: self.inner.policy.lease_period,
                })
            }
        }
    }

    fn is_closed(&self) -> bool {
        self.inner.shared.closed.load(Ordering::Acquire)
    }

    /// Stops leasing, closes every tenant's queue (its waiters and later
    /// requests under quota fail with [`AdmitError::Closed`]), returns the
    /// unspent units to the backend (within the lease timeout), and waits
    /// for the leasing thread to end: it blocks the caller for at most
    /// twice the lease timeout (an exchange in flight, then the returns).
    /// Dropping the last handle does the same.
    pub fn shutdown(&self) {
        self.inner.stop();
    }

    /// A consistent enough copy of the node's quota state (each tenant's
    /// figures are read one at a time).
    pub fn snapshot(&self) -> QuotaSnapshot {
        let shared = &self.inner.shared;
        let status = shared.status.lock().clone();
        let tenants = shared
            .table
            .records()
            .into_iter()
            .map(|record| TenantQuotaSnapshot {
                tenant: record.tenant,
                quota: record.quota,
                balance: record.balance(),
                waiting: record.local.waiting(),
                demand_per_sec: record.demand_per_sec(),
                refill_per_sec: record.refill_per_sec(),
                leased: record.leased.load(Ordering::Relaxed),
                fallback: record.fallback.load(Ordering::Relaxed),
                refunded: record.refunded.load(Ordering::Relaxed),
                refused: record.refused.load(Ordering::Relaxed),
                fleet_available: record.fleet_available.load(Ordering::Relaxed),
            })
            .collect();
        QuotaSnapshot {
            node: self.inner.node.to_string(),
            degraded: status.degraded_since.is_some(),
            degraded_for: status.degraded_since.map(|since| since.elapsed()),
            exchanges: status.exchanges,
            failures: status.failures,
            last_error: status.last_error,
            pending_returns: status.pending_returns,
            refused_tenants: shared.table.refused_tenants.load(Ordering::Relaxed),
            closed: self.is_closed(),
            tenants,
            backend_health: shared.boundary.health(),
        }
    }

    /// Sets the quota's gauges (`admission_quota_degraded`,
    /// `admission_quota_tenants`); see [`export`](crate::export). Does
    /// nothing without the `metrics` feature.
    pub fn record_metrics(&self) {
        #[cfg(feature = "metrics")]
        {
            let degraded = self.inner.shared.status.lock().degraded_since.is_some();
            crate::export::quota_levels(degraded, self.inner.shared.table.len());
        }
    }
}

impl Inner {
    fn stop(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                tracing::error!(target: "admission", "the quota's leasing thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("node", &self.inner.node)
            .field("tenants", &self.inner.shared.table.len())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// A [`Quota`]'s state on this node.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct QuotaSnapshot {
    /// This node's id.
    pub node: String,
    /// Whether the node is on its fallback trickle (the last exchange failed).
    pub degraded: bool,
    /// For how long, if it is.
    pub degraded_for: Option<Duration>,
    /// Exchanges with the backend that succeeded.
    pub exchanges: u64,
    /// Exchanges that failed.
    pub failures: u64,
    /// Why the last failed exchange failed.
    pub last_error: Option<BackendError>,
    /// Returns of forgotten tenants waiting for the backend.
    pub pending_returns: usize,
    /// Requests refused because the table of tenants was full.
    pub refused_tenants: u64,
    /// Whether the quota was shut down.
    pub closed: bool,
    /// Every tenant under quota on this node now.
    pub tenants: Vec<TenantQuotaSnapshot>,
    /// The backend's panics.
    pub backend_health: ComponentHealth,
}

/// One tenant's quota on this node.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TenantQuotaSnapshot {
    /// The tenant.
    pub tenant: TenantId,
    /// Its quota.
    pub quota: TenantQuota,
    /// Units held now (negative in debt).
    pub balance: i64,
    /// Requests waiting for its quota.
    pub waiting: usize,
    /// Units a second its requests ask for on this node.
    pub demand_per_sec: f64,
    /// Units a second reaching this node's balance (leases and fallback).
    pub refill_per_sec: f64,
    /// Units leased from the backend, in all.
    pub leased: u64,
    /// Units added by the fallback trickle, in all.
    pub fallback: u64,
    /// Units given back by requests that capacity refused.
    pub refunded: u64,
    /// Requests refused as over quota.
    pub refused: u64,
    /// What the backend said this node could have, at the last exchange.
    pub fleet_available: u64,
}
