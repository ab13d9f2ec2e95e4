//! The retry budget: retries at most a share of the requests (Google SRE
//! book: about 10%), plus a small floor, over a trailing window; so that
//! under overload retries cannot multiply what the downstream is offered
//! (three retries of every refused request at 3x would offer up to 12x).
//!
//! # Implementation notes
//!
//! One [`Window`] of (requests, retries) behind one leaf lock, shared by
//! every clone of the retry policy, that is by every request in flight:
//! tower's `Retry` clones the policy per request. Each request deposits
//! once, before its first attempt; each retry withdraws once, and only if
//! the retries counted in the window stay within
//! `floor + ratio × requests`, checked and counted under the same lock, so
//! that concurrent withdrawals cannot both take the last retry (checked by
//! the loom model `loom-tests/tests/budget.rs`). Counts saturate; the lock
//! is held for a few additions, never across user code or an await.

use std::time::Duration;

use tokio::time::Instant;

use super::window::Window;
use crate::error::ConfigError;
use crate::sync::{Mutex, Ordering::Relaxed, StdAtomicU64};

/// What a budget allows and how long it remembers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct BudgetRule {
    /// Retries allowed per request deposited.
    pub(super) ratio: f64,
    /// Retries allowed per second whatever the requests, so that a client
    /// sending little can still retry now and then.
    pub(super) floor_per_sec: u32,
    pub(super) window: Duration,
}

/// The shortest and longest windows a throttle or a budget counts over:
/// ten buckets of a millisecond at least, and nothing older than an hour.
pub(super) const WINDOW_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(3600);

impl BudgetRule {
    pub(super) fn checked(
        ratio: f64,
        floor_per_sec: u32,
        window: Duration,
    ) -> Result<Self, ConfigError> {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(ConfigError::new(
                "retry_ratio",
                format!("{ratio} is not a share of requests (0.0..=1.0)"),
            ));
        }
        if !WINDOW_RANGE.contains(&window) {
            return Err(ConfigError::new(
                "budget_window",
                format!("{window:?} is outside 10 ms..=1 h"),
            ));
        }
        Ok(BudgetRule {
            ratio,
            floor_per_sec,
            window,
        })
    }

    /// The retries allowed in a window that saw `requests`.
    fn allowed(&self, requests: u64) -> f64 {
        let floor = f64::from(self.floor_per_sec) * self.window.as_secs_f64();
        floor + self.ratio * requests as f64
    }
}

/// A retry budget: retries at most `ratio` of the requests plus
/// `min_per_sec` a second, over a trailing window.
///
/// [`Downstreams`](super::Downstreams) keeps one for its
/// [`RetryPolicy`](super::RetryPolicy); it also implements tower's
/// [`Budget`](tower::retry::budget::Budget) trait (reading tokio's clock,
/// so `tokio::time::pause` controls it in tests), for a policy of one's
/// own. Shared by reference (`Arc`) between every request that spends it.
///
/// ```
/// use std::time::Duration;
/// use admission::tower::client::RetryBudget;
/// use tower::retry::budget::Budget;
///
/// let budget = RetryBudget::new(0.1, 0, Duration::from_secs(10)).unwrap();
/// for _ in 0..20 {
///     budget.deposit();
/// }
/// assert!(budget.withdraw());
/// assert!(budget.withdraw());
/// assert!(!budget.withdraw(), "10% of 20 requests: two retries");
/// ```
#[derive(Debug)]
pub struct RetryBudget {
    rule: BudgetRule,
    /// `first`: requests deposited, `second`: retries withdrawn.
    window: Mutex<Window>,
    /// Totals since the budget was built, for snapshots (reports, which
    /// decide nothing: outside the lock).
    deposited: StdAtomicU64,
    withdrawn: StdAtomicU64,
    denied: StdAtomicU64,
}

/// A retry budget's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetSnapshot {
    /// Requests deposited since the budget was built.
    pub requests: u64,
    /// Retries it allowed.
    pub retries: u64,
    /// Retries it refused (the budget was spent).
    pub denied: u64,
}

impl RetryBudget {
    /// A budget allowing `ratio` retries per request (0.0..=1.0; the SRE
    /// book's 10% is `0.1`) plus `min_per_sec` retries a second, counted
    /// over the trailing `window` (10 ms..=1 h).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `retry_ratio` for a ratio outside
    /// 0.0..=1.0 (or not a number), or `budget_window` for a window out of
    /// its range.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::tower::client::RetryBudget;
    ///
    /// // The SRE book's budget: retries at most 10% of the requests, plus
    /// // one a second for a client that sends few.
    /// let budget = RetryBudget::new(0.1, 1, Duration::from_secs(10))?;
    /// assert_eq!(budget.snapshot().retries, 0);
    ///
    /// let err = RetryBudget::new(1.5, 1, Duration::from_secs(10)).unwrap_err();
    /// assert_eq!(err.field(), "retry_ratio");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn new(ratio: f64, min_per_sec: u32, window: Duration) -> Result<Self, ConfigError> {
        let rule = BudgetRule::checked(ratio, min_per_sec, window)?;
        Ok(Self::with_rule(rule, Instant::now()))
    }

    pub(super) fn with_rule(rule: BudgetRule, now: Instant) -> Self {
        RetryBudget {
            rule,
            window: Mutex::new(Window::new(rule.window, now)),
            deposited: StdAtomicU64::new(0),
            withdrawn: StdAtomicU64::new(0),
            denied: StdAtomicU64::new(0),
        }
    }

    /// A request is about to make its first attempt.
    pub(crate) fn deposit_at(&self, now: Instant) {
        self.window.lock().add(now, 1, 0);
        self.deposited.fetch_add(1, Relaxed);
    }

    /// Takes one retry from the budget if it has one left at `now`;
    /// `false` (and nothing taken) when the window's retries already
    /// reach what its requests allow.
    pub(crate) fn withdraw_at(&self, now: Instant) -> bool {
        let allowed = {
            let mut window = self.window.lock();
            let counts = window.totals(now);
            let allowed = ((counts.second as f64) + 1.0) <= self.rule.allowed(counts.first);
            if allowed {
                window.add(now, 0, 1);
            }
            allowed
        };
        let counter = if allowed {
            &self.withdrawn
        } else {
            &self.denied
        };
        counter.fetch_add(1, Relaxed);
        allowed
    }

    /// The counts since the budget was built: requests deposited, retries
    /// allowed and refused.
    pub fn snapshot(&self) -> BudgetSnapshot {
        BudgetSnapshot {
            requests: self.deposited.load(Relaxed),
            retries: self.withdrawn.load(Relaxed),
            denied: self.denied.load(Relaxed),
        }
    }
}

impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(ratio: f64, floor_per_sec: u32, now: Instant) -> RetryBudget {
        RetryBudget::with_rule(
            BudgetRule {
                ratio,
                floor_per_sec,
                window: Duration::from_secs(10),
            },
            now,
        )
    }

    #[test]
    fn retries_stay_within_the_ratio_of_requests_plus_the_floor() {
        let now = Instant::now();
        // (ratio, floor per second, requests, retries asked, retries allowed)
        let rows: &[(f64, u32, u64, u64, u64)] = &[
            (0.1, 0, 0, 5, 0),
            (0.1, 0, 9, 5, 0),
            (0.1, 0, 10, 5, 1),
            (0.1, 0, 100, 50, 10),
            (0.1, 0, 105, 50, 10),
            (0.2, 0, 100, 50, 20),
            // The floor: one a second over a ten-second window.
            (0.1, 1, 0, 50, 10),
            (0.1, 1, 100, 50, 20),
            (0.0, 0, 1_000, 5, 0),
            (1.0, 0, 3, 5, 3),
        ];
        for &(ratio, floor, requests, asked, expected) in rows {
            let budget = budget(ratio, floor, now);
            for _ in 0..requests {
                budget.deposit_at(now);
            }
            let allowed = (0..asked).filter(|_| budget.withdraw_at(now)).count() as u64;
            assert_eq!(
                allowed, expected,
                "ratio {ratio}, floor {floor}/s, {requests} requests, {asked} asked"
            );
            assert_eq!(
                budget.snapshot(),
                BudgetSnapshot {
                    requests,
                    retries: expected,
                    denied: asked - expected,
                }
            );
        }
    }

    #[test]
    fn a_budget_out_of_range_is_refused_naming_the_field() {
        let second = Duration::from_secs(1);
        for (ratio, window, field) in [
            (-0.1, second, "retry_ratio"),
            (1.5, second, "retry_ratio"),
            (f64::NAN, second, "retry_ratio"),
            (0.1, Duration::from_millis(1), "budget_window"),
            (0.1, Duration::from_secs(7200), "budget_window"),
        ] {
            let error = RetryBudget::new(ratio, 0, window).unwrap_err();
            assert_eq!(error.field(), field, "{ratio} {window:?}");
        }
        assert!(RetryBudget::new(0.1, 10, second).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_refills_as_its_retries_slide_out_of_the_window() {
        let start = Instant::now();
        let budget = budget(0.1, 0, start);
        for _ in 0..100 {
            budget.deposit_at(start);
        }
        assert_eq!((0..20).filter(|_| budget.withdraw_at(start)).count(), 10);
        // More requests raise what is allowed.
        let later = start + Duration::from_secs(5);
        for _ in 0..10 {
            budget.deposit_at(later);
        }
        assert!(budget.withdraw_at(later));
        assert!(!budget.withdraw_at(later));
        // The first burst (its requests and its retries) slid out: what is
        // left is the later requests' allowance, already spent.
        let after = start + Duration::from_secs(10);
        assert!(!budget.withdraw_at(after));
        for _ in 0..10 {
            budget.deposit_at(after);
        }
        assert!(budget.withdraw_at(after));
    }
}
