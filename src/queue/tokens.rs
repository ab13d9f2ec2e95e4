//! Token queues: a queue per token class over one shared bucket.
//!
//! Whatever numbers callers pass, a token queue neither panics nor wedges:
//! a burst of zero is refused with a [`ConfigError`] (it would never admit
//! anything), refills saturate at the burst however often `u64::MAX` is
//! added, and a correction of any size leaves at most one burst of debt
//! (see [`TokenGranter`](crate::grant::TokenGranter#bounded-debt)).

use std::num::NonZeroU64;

use crate::error::ConfigError;
use crate::grant::{Granter, Requester, TokenClass, TokenGranter};
use crate::work::{TenantId, WorkInfo};

use super::{Admit, Usage, WorkQueue, WorkQueueBuilder};

fn token_builder(builder: WorkQueueBuilder) -> WorkQueueBuilder {
    // Tokens are consumed: a tenant's usage is what it was granted, since
    // nothing comes back when its work completes.
    builder.usage(Usage::Granted)
}

fn saturating_delta(estimated: u64, actual: u64) -> i64 {
    let delta = i128::from(actual) - i128::from(estimated);
    i64::try_from(delta).unwrap_or(if delta > 0 { i64::MAX } else { i64::MIN })
}

impl WorkQueue<TokenGranter> {
    /// A token queue of its own (regular class): unlimited until
    /// [`set_token_limit`](Self::set_token_limit) turns the budget on, then
    /// admitting while tokens last. For separate regular and elastic budgets
    /// use [`TokenQueues`].
    ///
    /// Tenants are ordered by the tokens they were granted since the last
    /// reset ([`Usage::Granted`]): tokens are consumed, nothing comes back
    /// when the work completes.
    ///
    /// A `burst` of zero is refused with a [`ConfigError`] naming `burst`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `burst` if it is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    ///
    /// let queue = WorkQueue::tokens(4_096)?;
    /// // Unlimited until the budget is turned on.
    /// queue.set_token_limit(Some(4_096))?;
    /// queue.add_tokens(1_024);
    /// let work = WorkInfo::builder()
    ///     .tenant(TenantId::new(1))
    ///     .priority(Priority::NORMAL)
    ///     .requested(512)
    ///     .build();
    /// drop(queue.admit(work).await?);
    ///
    /// assert_eq!(WorkQueue::tokens(0).unwrap_err().field(), "burst");
    /// # Ok(())
    /// # }
    /// ```
    pub fn tokens(burst: u64) -> Result<Self, ConfigError> {
        token_builder(WorkQueueBuilder::default()).build_with(TokenGranter::new(burst)?)
    }

    /// Adds `tokens` to this queue's class (one tick of the IO
    /// controller's drip): debt is paid first, the balance
    /// is capped at the burst, and waiters the new tokens cover are granted
    /// in order.
    pub fn add_tokens(&self, tokens: u64) {
        self.shared.with_state(|queue, grants, wakes| {
            grants.granter.add(tokens);
            queue.grant_waiting(grants, wakes);
        });
    }

    /// Runs `f` under the queue's lock with the bucket's balance and
    /// whether the queue is closed, then changes the bucket by the tokens
    /// `f` returns (nothing in a closed queue): a positive change is added
    /// as [`add_tokens`](Self::add_tokens) adds it, granting the waiters it
    /// covers; a negative one is charged, leaving at most one burst of
    /// debt. For a balance kept partly outside the queue: what it moves in
    /// or out, and what it reads of the bucket, is atomic with the queue's
    /// own changes, closing included.
    pub(crate) fn with_tokens<R>(&self, f: impl FnOnce(i64, bool) -> (i64, R)) -> R {
        self.shared.with_state(|queue, grants, wakes| {
            let available = grants.granter.snapshot(grants.state).available;
            let closed = queue.is_closed();
            let (change, result) = f(available, closed);
            if !closed {
                if change > 0 {
                    grants.granter.add(change.unsigned_abs());
                    queue.grant_waiting(grants, wakes);
                } else if change < 0 {
                    grants.granter.correct(change.saturating_neg());
                }
            }
            result
        })
    }

    /// Turns this class's budget on with `burst` as the most that can be
    /// banked, or (`None`) off: unlimited admission, every waiter granted at
    /// once. `Some(0)` is refused with a [`ConfigError`] naming `burst`, and
    /// changes nothing.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `burst` if it is `Some(0)`; the limit is then
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::WorkQueue;
    ///
    /// let queue = WorkQueue::tokens(4_096).unwrap();
    /// queue.set_token_limit(Some(1_024)).unwrap(); // budgeted from now on
    /// queue.set_token_limit(None).unwrap(); // unlimited again
    /// assert_eq!(queue.set_token_limit(Some(0)).unwrap_err().field(), "burst");
    /// ```
    pub fn set_token_limit(&self, burst: Option<u64>) -> Result<(), ConfigError> {
        let burst = burst
            .map(|burst| TokenGranter::nonzero_burst("burst", burst))
            .transpose()?;
        self.apply_token_limit(burst);
        Ok(())
    }

    pub(crate) fn apply_token_limit(&self, burst: Option<NonZeroU64>) {
        match burst {
            Some(burst) => {
                self.shared.granter.set_nonzero_burst(burst);
                self.shared.granter.set_unlimited(false);
            }
            None => {
                self.shared.granter.set_unlimited(true);
                self.granted();
            }
        }
    }

    /// Settles an admitted request's estimate against its actual cost: the
    /// difference is charged to (or credited back to) the balances and the
    /// tenant's usage at once, never blocking. A credit may admit waiters.
    ///
    /// A charge leaves the balances at most one burst in debt, however
    /// large `actual` is, so a wrong size cannot block the class for good;
    /// the tenant's usage is charged in full (saturating), which orders it
    /// behind others until the next fairness reset.
    pub fn correct_tokens(&self, tenant: TenantId, estimated: u64, actual: u64) {
        let delta = saturating_delta(estimated, actual);
        self.shared.with_state(|queue, grants, wakes| {
            grants.granter.correct(delta);
            queue.adjust_used(tenant, delta);
            if delta < 0 {
                queue.grant_waiting(grants, wakes);
            }
        });
    }
}

/// Byte-token admission with separate **regular** and **elastic** budgets:
/// two [`WorkQueue`]s, one per [`TokenClass`], spending one shared bucket
/// ([`TokenGranter::pair`]).
///
/// [`admit`](Self::admit) routes work by its priority: zero and above to the
/// regular queue, below zero to the elastic one. Every admission deducts
/// from both budgets, and elastic work also needs the regular budget to be
/// positive, so elastic work gets only what regular work leaves and is
/// throttled first; because each class waits in its own queue, a blocked
/// elastic writer never delays a regular one.
///
/// ```
/// use admission::TokenQueues;
/// use admission::{Priority, TenantId, WorkInfo};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let queues = TokenQueues::new(1_000, 100).unwrap();
/// queues.set_limits(Some(1_000), Some(100)).unwrap();
/// queues.add_tokens(500, 50);
///
/// let bulk = WorkInfo::builder()
///     .tenant(TenantId::new(1))
///     .priority(Priority::BULK_NORMAL)
///     .requested(80)
///     .build();
/// queues.admit(bulk).await.unwrap();
/// // Elastic work spent 80 of both budgets; the elastic one is now in debt.
/// assert_eq!(queues.elastic().snapshot().granter.available, -30);
/// assert_eq!(queues.regular().snapshot().granter.available, 420);
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct TokenQueues {
    regular: WorkQueue<TokenGranter>,
    elastic: WorkQueue<TokenGranter>,
}

impl TokenQueues {
    /// Two default token queues over one bucket, both unlimited until
    /// [`set_limits`](Self::set_limits), banking at most the given bursts;
    /// a burst of zero is refused with a [`ConfigError`] naming
    /// `regular_burst` or `elastic_burst`. Both are named `io` for metrics
    /// (their priorities, and the `class` label of the token gauges, keep
    /// them apart).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `regular_burst` or `elastic_burst`, whichever is
    /// zero.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use admission::{Priority, TenantId, TokenQueues, WorkInfo};
    ///
    /// let io = TokenQueues::new(1 << 20, 256 << 10)?;
    /// io.set_limits(Some(1 << 20), Some(256 << 10))?;
    /// io.add_tokens(64 << 10, 16 << 10);
    /// let write = WorkInfo::builder()
    ///     .tenant(TenantId::new(1))
    ///     .priority(Priority::NORMAL)
    ///     .requested(4 << 10)
    ///     .build();
    /// drop(io.admit(write).await?);
    ///
    /// assert_eq!(TokenQueues::new(1, 0).unwrap_err().field(), "elastic_burst");
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(regular_burst: u64, elastic_burst: u64) -> Result<Self, ConfigError> {
        Self::with_builder(
            WorkQueueBuilder::default().name("io"),
            regular_burst,
            elastic_burst,
        )
    }

    /// Like [`new`](Self::new), with both queues built from `builder`
    /// (waiter bound, fairness reset period, pacing...). Usage is always
    /// [`Usage::Granted`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `regular_burst` or `elastic_burst`, whichever is
    /// zero; otherwise one naming the first setting of `builder` out of its
    /// range, as [`WorkQueueBuilder::build_with`].
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::{TokenQueues, WorkQueue};
    ///
    /// let io = TokenQueues::with_builder(WorkQueue::builder().max_waiters(10_000), 1 << 20, 1 << 18)
    ///     .unwrap();
    /// assert_eq!(io.regular().name(), "default");
    /// ```
    pub fn with_builder(
        builder: WorkQueueBuilder,
        regular_burst: u64,
        elastic_burst: u64,
    ) -> Result<Self, ConfigError> {
        let (regular, elastic) = TokenGranter::pair(regular_burst, elastic_burst)?;
        Ok(TokenQueues {
            regular: token_builder(builder.clone()).build_with(regular)?,
            elastic: token_builder(builder).build_with(elastic)?,
        })
    }

    /// The queue of work at priority zero and above.
    pub fn regular(&self) -> &WorkQueue<TokenGranter> {
        &self.regular
    }

    /// The queue of work below priority zero.
    pub fn elastic(&self) -> &WorkQueue<TokenGranter> {
        &self.elastic
    }

    /// The queue that admits work of `class`.
    pub fn queue(&self, class: TokenClass) -> &WorkQueue<TokenGranter> {
        match class {
            TokenClass::Regular => &self.regular,
            TokenClass::Elastic => &self.elastic,
        }
    }

    /// Asks for admission for `work` (its [`requested`](WorkInfo::requested)
    /// bytes) in the queue of its class.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses no capacity: a queued request
    /// leaves the queue, and a grant it had not yet seen goes to the next
    /// waiter.
    ///
    /// # Errors
    ///
    /// As [`WorkQueue::admit`]: an [`AdmitError`](crate::AdmitError) for a full
    /// or closed queue, the request's deadline, or more bytes than one burst
    /// can ever hold.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use admission::{Priority, TenantId, TokenQueues, WorkInfo};
    ///
    /// let io = TokenQueues::new(1 << 20, 1 << 20)?;
    /// // Compactions are elastic work: they draw on the elastic class's tokens.
    /// let compaction = WorkInfo::builder()
    ///     .tenant(TenantId::SYSTEM)
    ///     .priority(Priority::BULK_LOW)
    ///     .requested(64 << 10)
    ///     .build();
    /// let permit = io.admit(compaction).await?;
    /// drop(permit);
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit(&self, work: WorkInfo) -> Admit<TokenGranter> {
        self.queue(TokenClass::of(work.priority())).admit(work)
    }

    /// Adds one tick's tokens to each class and grants waiters, regular
    /// first, so that regular work sees new tokens before elastic work does.
    pub fn add_tokens(&self, regular: u64, elastic: u64) {
        self.elastic.shared.granter.add(elastic);
        self.regular.add_tokens(regular);
        self.elastic.granted();
    }

    /// Sets each class's limit: `Some(burst)` turns its budget on, `None`
    /// makes it unlimited (and grants its waiters).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `regular_burst` or `elastic_burst` for a burst
    /// of zero; neither class is changed then.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::TokenQueues;
    ///
    /// let io = TokenQueues::new(1 << 20, 1 << 18).unwrap();
    /// // Regular work budgeted, elastic work unlimited for now.
    /// io.set_limits(Some(1 << 20), None).unwrap();
    /// let error = io.set_limits(Some(0), Some(1)).unwrap_err();
    /// assert_eq!(error.field(), "regular_burst");
    /// ```
    pub fn set_limits(
        &self,
        regular: Option<u64>,
        elastic: Option<u64>,
    ) -> Result<(), ConfigError> {
        let regular = regular
            .map(|burst| TokenGranter::nonzero_burst("regular_burst", burst))
            .transpose()?;
        let elastic = elastic
            .map(|burst| TokenGranter::nonzero_burst("elastic_burst", burst))
            .transpose()?;
        self.apply_limits(regular, elastic);
        Ok(())
    }

    pub(crate) fn apply_limits(&self, regular: Option<NonZeroU64>, elastic: Option<NonZeroU64>) {
        self.regular.apply_token_limit(regular);
        self.elastic.apply_token_limit(elastic);
        // A regular budget lifted lets blocked elastic work through too.
        self.elastic.granted();
    }

    /// Settles admitted work's estimate against its actual bytes, in the
    /// queue of its class; both budgets are charged or credited, and a
    /// credit may admit waiters of either class.
    pub fn correct_tokens(&self, work: &WorkInfo, estimated: u64, actual: u64) {
        let class = TokenClass::of(work.priority());
        self.queue(class)
            .correct_tokens(work.tenant(), estimated, actual);
        if actual < estimated {
            let other = match class {
                TokenClass::Regular => &self.elastic,
                TokenClass::Elastic => &self.regular,
            };
            other.granted();
        }
    }

    /// Closes both queues.
    pub fn close(&self) {
        self.regular.close();
        self.elastic.close();
    }

    /// Sets `admission_io_tokens_available` of the [`export`](crate::export)
    /// module for both classes, from their granters' snapshots. The
    /// [`io::Controller`](crate::io::Controller) calls it on every tick; with
    /// token queues of your own, call it where the budgets change (after
    /// `add_tokens`) or from the scrape handler. Does nothing without the
    /// `metrics` feature.
    pub fn record_metrics(&self) {
        #[cfg(feature = "metrics")]
        for (class, queue) in [("regular", &self.regular), ("elastic", &self.elastic)] {
            let snapshot = queue.granter_snapshot();
            crate::export::io_tokens(queue.name(), class, snapshot.available, snapshot.unlimited);
        }
    }
}
