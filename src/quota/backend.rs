//! Where the fleet's buckets live: the [`QuotaBackend`] trait, the batch a
//! node sends, and the in-process backend.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::bucket::FleetBucket;
use crate::sync::{Mutex, StdArc as Arc};
#[cfg(test)]
use crate::sync::{Ordering, StdAtomicU64 as AtomicU64};
use crate::work::TenantId;

/// One tenant's part of a [`LeaseBatch`]: what the node asks for and what
/// it reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The tenant whose bucket this is.
    pub tenant: TenantId,
    /// The tenant's quota, units a second.
    pub rate: u64,
    /// The most units the tenant's bucket banks.
    pub burst: u64,
    /// Units the node asks for (0: it only reports).
    pub asked: u64,
    /// Units a second the node's requests of this tenant ask for lately:
    /// the bucket divides its refill among nodes in proportion to it.
    pub demand: u64,
    /// Units the node admitted on its fallback trickle since its last
    /// exchange, to be taken from the bucket (as far as it holds them).
    pub charge: u64,
    /// Units the node gives back (on shutdown, or for a tenant it forgets).
    pub returned: u64,
    /// The node keeps no share of this bucket after this exchange.
    pub leaving: bool,
}

impl Lease {
    /// A lease for `tenant` asking for `asked` units and reporting
    /// `demand` units a second, with nothing to charge or return: for
    /// exercising a backend (the quota makes its own).
    pub fn new(tenant: TenantId, rate: u64, burst: u64, asked: u64, demand: u64) -> Self {
        Lease {
            tenant,
            rate,
            burst,
            asked,
            demand,
            charge: 0,
            returned: 0,
            leaving: false,
        }
    }
}

/// A backend's answer to one [`Lease`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leased {
    /// Units granted to the node (at most what it asked).
    pub granted: u64,
    /// What the node could be granted right after: its share set aside
    /// and the bucket's shared pool.
    pub available: u64,
}

/// Everything one node exchanges with the backend at once: a [`Lease`] per
/// tenant that needs one, answered in one round trip.
///
/// Plain data, read by a backend: the quota makes one per exchange.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LeaseBatch {
    /// The node's id: its share of each bucket is kept under it.
    pub node: Arc<str>,
    /// How long a node's reported demand counts after its last exchange: a
    /// node not heard from for longer is gone, and its share with it.
    pub share_ttl: Duration,
    /// One lease per tenant, each for a different tenant.
    pub leases: Vec<Lease>,
}

impl LeaseBatch {
    /// The batch `node` sends: for exercising a backend (the quota makes
    /// its own).
    pub fn new(node: impl Into<Arc<str>>, share_ttl: Duration, leases: Vec<Lease>) -> Self {
        LeaseBatch {
            node: node.into(),
            share_ttl,
            leases,
        }
    }
}

/// Why an exchange with the backend failed. Any failure puts the node on
/// its fallback trickle until an exchange succeeds again.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendError {
    /// The store could not be reached, or refused the exchange.
    Unavailable(String),
    /// No answer within the quota's
    /// [`lease_timeout`](super::QuotaBuilder::lease_timeout).
    Timeout(Duration),
    /// An answer that does not fit the batch (another number of leases).
    Invalid(String),
    /// The backend panicked (caught; the quota reports it in its
    /// [`ComponentHealth`](crate::ComponentHealth)).
    Panicked,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Unavailable(why) => write!(f, "quota backend unavailable: {why}"),
            BackendError::Timeout(after) => {
                write!(f, "quota backend did not answer within {after:?}")
            }
            BackendError::Invalid(why) => write!(f, "quota backend answered wrongly: {why}"),
            BackendError::Panicked => f.write_str("quota backend panicked"),
        }
    }
}

impl std::error::Error for BackendError {}

/// The future of one exchange.
pub type LeaseFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Leased>, BackendError>> + Send + 'a>>;

/// Where the fleet's buckets live: [`InMemoryBackend`] (one process) or
/// `RedisBackend` (feature `redis`).
///
/// The quota calls it only from its own leasing thread, never on a
/// request's path, and behind a panic boundary (component
/// `quota_backend`): a panic is a failed exchange.
pub trait QuotaBackend: fmt::Debug + Send + Sync + 'static {
    /// Applies every lease of `batch` atomically per tenant (refill by the
    /// store's own clock, divide by demand, charge, return, grant; see the
    /// module docs of [`quota`](super)) and answers one [`Leased`] per
    /// lease, in order.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] when the store cannot be reached or answers
    /// wrongly. The quota puts the node on its fallback trickle; units the
    /// store granted in an exchange whose answer was lost are lost to the
    /// fleet (it under-admits; it never over-admits).
    ///
    /// # Cancel safety
    ///
    /// The quota drops the future when it has not resolved within
    /// [`lease_timeout`](super::QuotaBuilder::lease_timeout) (a
    /// [`BackendError::Timeout`]) or when a poll of it panics, so an
    /// implementation must leave the store consistent if dropped at any
    /// await point. The exchange then counts as failed: whatever the store
    /// applied of it is lost to the fleet, as with a lost answer.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::quota::{InMemoryBackend, Lease, LeaseBatch, QuotaBackend};
    /// use admission::TenantId;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = InMemoryBackend::new();
    /// // Node "a" asks for 40 units of tenant 7's bucket (100 a second,
    /// // bursts of 100), reporting a demand of 20 a second.
    /// let lease = Lease::new(TenantId::new(7), 100, 100, 40, 20);
    /// let batch = LeaseBatch::new("a", Duration::from_secs(3), vec![lease]);
    /// let answers = backend.exchange(&batch).await?;
    /// // One answer per lease, in order; a new bucket starts full.
    /// assert_eq!(answers.len(), 1);
    /// assert_eq!(answers[0].granted, 40);
    /// # Ok(())
    /// # }
    /// ```
    fn exchange<'a>(&'a self, batch: &'a LeaseBatch) -> LeaseFuture<'a>;
}

/// The in-process backend: every node that shares it (clones share) is in
/// this process. The default of [`QuotaBuilder`](super::QuotaBuilder):
/// with one node, the quota is a token bucket per tenant, no server.
///
/// Buckets not exchanged with for their TTL (ten minutes, and at least the
/// time their burst takes to refill) are dropped, as Redis expires its keys, so tenant ids
/// that come and go leave nothing behind.
#[derive(Clone)]
pub struct InMemoryBackend {
    inner: Arc<InMemory>,
}

struct InMemory {
    buckets: Mutex<Buckets>,
    clock: Clock,
    key_ttl: Duration,
}

#[derive(Default)]
struct Buckets {
    by_tenant: FxHashMap<TenantId, FleetBucket>,
    /// Sweep expired buckets when the table grows past this.
    sweep_at: usize,
}

/// The backend's clock, in microseconds: the process's, or one a test sets.
enum Clock {
    Real(Instant),
    #[cfg(test)]
    Manual(Arc<AtomicU64>),
}

impl Clock {
    fn now_us(&self) -> u64 {
        match self {
            Clock::Real(origin) => u64::try_from(origin.elapsed().as_micros()).unwrap_or(u64::MAX),
            #[cfg(test)]
            Clock::Manual(now) => now.load(Ordering::Relaxed),
        }
    }
}

/// The fewest buckets at which the in-process backend sweeps.
const SWEEP_FLOOR: usize = 1_024;

impl InMemoryBackend {
    /// Time a bucket nobody exchanges with is kept (before its refill
    /// time is considered).
    pub(crate) const DEFAULT_KEY_TTL: Duration = Duration::from_secs(600);

    /// An empty backend on the process's clock.
    pub fn new() -> Self {
        Self::with_clock(Clock::Real(Instant::now()), Self::DEFAULT_KEY_TTL)
    }

    /// A backend whose clock is `now`, in microseconds, set by the test.
    #[cfg(test)]
    pub(crate) fn manual(now: Arc<AtomicU64>, key_ttl: Duration) -> Self {
        Self::with_clock(Clock::Manual(now), key_ttl)
    }

    fn with_clock(clock: Clock, key_ttl: Duration) -> Self {
        InMemoryBackend {
            inner: Arc::new(InMemory {
                buckets: Mutex::new(Buckets {
                    by_tenant: FxHashMap::default(),
                    sweep_at: SWEEP_FLOOR,
                }),
                clock,
                key_ttl,
            }),
        }
    }

    /// Buckets held now (expired ones included until the next sweep): for
    /// the crate's tests of the sweep, and `Debug`.
    pub(crate) fn buckets(&self) -> usize {
        self.inner.buckets.lock().by_tenant.len()
    }

    /// The answer to `batch`, at once.
    pub(crate) fn exchange_now(&self, batch: &LeaseBatch) -> Vec<Leased> {
        let now = self.inner.clock.now_us();
        let share_ttl = micros(batch.share_ttl);
        let mut buckets = self.inner.buckets.lock();
        if buckets.by_tenant.len() >= buckets.sweep_at {
            let key_ttl = self.inner.key_ttl;
            buckets
                .by_tenant
                .retain(|_, bucket| now.saturating_sub(bucket.last_us()) <= micros(key_ttl));
            buckets.sweep_at = buckets.by_tenant.len().saturating_mul(2).max(SWEEP_FLOOR);
        }
        batch
            .leases
            .iter()
            .map(|lease| {
                let ttl = micros(key_ttl_for(self.inner.key_ttl, lease));
                let bucket = buckets
                    .by_tenant
                    .entry(lease.tenant)
                    .and_modify(|bucket| {
                        if now.saturating_sub(bucket.last_us()) > ttl {
                            *bucket = FleetBucket::new(lease.burst, now);
                        }
                    })
                    .or_insert_with(|| FleetBucket::new(lease.burst, now));
                let exchanged = bucket.exchange(now, &batch.node, share_ttl, lease);
                Leased {
                    granted: exchanged.granted,
                    available: exchanged.available,
                }
            })
            .collect()
    }
}

/// A bucket's TTL: `key_ttl`, but never shorter than its burst takes to
/// refill (an expired bucket starts full, as it would have refilled).
pub(crate) fn key_ttl_for(key_ttl: Duration, lease: &Lease) -> Duration {
    let refill_secs = lease.burst as f64 / lease.rate.max(1) as f64;
    let refill = Duration::try_from_secs_f64(refill_secs.ceil()).unwrap_or(Duration::MAX);
    key_ttl.max(refill)
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl Default for InMemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InMemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryBackend")
            .field("buckets", &self.buckets())
            .field("key_ttl", &self.inner.key_ttl)
            .finish()
    }
}

impl QuotaBackend for InMemoryBackend {
    fn exchange<'a>(&'a self, batch: &'a LeaseBatch) -> LeaseFuture<'a> {
        let answer = self.exchange_now(batch);
        Box::pin(std::future::ready(Ok(answer)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(node: &str, leases: Vec<Lease>) -> LeaseBatch {
        LeaseBatch::new(node, Duration::from_secs(3), leases)
    }

    #[test]
    fn buckets_expire_after_their_ttl_and_come_back_full() {
        let now = Arc::new(AtomicU64::new(0));
        let backend = InMemoryBackend::manual(now.clone(), Duration::from_secs(10));
        let lease = Lease::new(TenantId::new(1), 100, 500, 500, 100);
        let first = backend.exchange_now(&batch("a", vec![lease.clone()]));
        assert_eq!(
            first,
            [Leased {
                granted: 500,
                available: 0
            }]
        );
        now.store(9_000_000, Ordering::Relaxed);
        let refilled = backend.exchange_now(&batch("a", vec![lease.clone()]));
        assert_eq!(refilled[0].granted, 500, "refilled to the burst in 5 s");
        now.store(30_000_000, Ordering::Relaxed);
        let expired = backend.exchange_now(&batch("a", vec![lease]));
        assert_eq!(expired[0].granted, 500, "expired and made again, full");
    }

    #[test]
    fn the_ttl_is_at_least_the_time_to_refill_the_burst() {
        let slow = Lease::new(TenantId::new(1), 1, 3_600, 0, 0);
        assert_eq!(
            key_ttl_for(Duration::from_secs(60), &slow),
            Duration::from_secs(3_600)
        );
        let fast = Lease::new(TenantId::new(1), 1_000, 1_000, 0, 0);
        assert_eq!(
            key_ttl_for(Duration::from_secs(60), &fast),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_flood_of_tenants_is_swept_once_their_buckets_expire() {
        let now = Arc::new(AtomicU64::new(0));
        let backend = InMemoryBackend::manual(now.clone(), Duration::from_secs(1));
        for tenant in 0..5_000 {
            let lease = Lease::new(TenantId::new(tenant), 1_000, 1_000, 1, 1);
            backend.exchange_now(&batch("a", vec![lease]));
        }
        assert_eq!(backend.buckets(), 5_000, "none has expired yet");
        now.store(10_000_000, Ordering::Relaxed);
        for tenant in 10_000..14_000 {
            let lease = Lease::new(TenantId::new(tenant), 1_000, 1_000, 1, 1);
            backend.exchange_now(&batch("a", vec![lease]));
        }
        // The table reached twice its live size, was swept of the 5,000
        // expired buckets, and holds the 4,000 new ones.
        assert_eq!(backend.buckets(), 4_000);
    }
}
