//! The token granter: a budget of units consumed at admission and never
//! returned, refilled from a capacity model, in two classes.
//!
//! Tokens fit work whose true cost lands later (a write's bytes are paid for
//! when compactions rewrite them), so there is nothing to give back when the
//! work completes. A request is granted while the balance is positive and
//! takes its whole (estimated) size, so the balance can go negative: a large
//! request is never starved by small ones, and the debt is paid by the next
//! refills before anyone else is admitted. Work taken without permission
//! (bypass) and estimates that turn out low push it further into debt the
//! same way. The balance is capped at a burst size, so an idle stretch does
//! not bank an unbounded allowance.
//!
//! Debt is bounded, and a burst of zero refused: see
//! [`TokenGranter`](TokenGranter#bounded-debt).
//!
//! # Regular and elastic tokens
//!
//! A token bucket holds two balances. **Regular** tokens admit work at
//! priority zero and above; **elastic** tokens are a smaller budget inside
//! them for work below zero (bulk ingest, backfills), which the IO listener
//! limits earlier and harder. Every admission deducts from *both* balances
//! (upstream's rule): regular writes use up what elastic work could have had,
//! so elastic work gets only what is left, while elastic work needs both
//! balances positive and so can never spend regular work's tokens. A class
//! that is unlimited is not charged: a healthy store runs up no debt.
//!
//! Each class has its own queue (two [`WorkQueue`](crate::WorkQueue)s over
//! [`TokenGranter::pair`]), so a blocked elastic writer at the head of one
//! queue never holds back a regular writer in the other. The bucket sits
//! behind its own small lock, a leaf taken inside either queue's lock and
//! never the other way round, so the two queues share one balance without a
//! lock order between them.
//!
//! Refills come from outside the queues (the [IO controller](crate::io::Controller)'s
//! drip, every tick) through
//! [`WorkQueue::add_tokens`](crate::WorkQueue::add_tokens) or
//! [`TokenQueues::add_tokens`](crate::queue::TokenQueues::add_tokens), which
//! grant the waiters the new tokens cover.

use std::fmt;
use std::num::NonZeroU64;

use crate::error::ConfigError;
use crate::sync::{Arc, Mutex};
use crate::work::Priority;

use super::Granter;

/// Which budget a request spends: regular work (priority zero and above) or
/// elastic work (below zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenClass {
    /// Priority zero and above.
    Regular,
    /// Priority below zero: throttled earlier and harder.
    Elastic,
}

impl TokenClass {
    /// The class of work at `priority`.
    pub fn of(priority: Priority) -> Self {
        if priority.is_elastic() {
            TokenClass::Elastic
        } else {
            TokenClass::Regular
        }
    }

    /// `regular` or `elastic`: the metrics' class label, and what
    /// `Display` writes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TokenClass::Regular => "regular",
            TokenClass::Elastic => "elastic",
        }
    }
}

impl fmt::Display for TokenClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad` so that width and alignment flags work in tables.
        f.pad(self.name())
    }
}

/// The most debt an admission or a bypass can leave, in bursts; see
/// [`TokenGranter`](TokenGranter#bounded-debt).
const DEBT_LIMIT_BURSTS: u64 = 60;

/// The most debt a correction can leave, in bursts.
const CORRECTION_DEBT_BURSTS: u64 = 1;

/// One class's balance. Negative is debt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Balance {
    available: i64,
    burst: NonZeroU64,
    unlimited: bool,
}

impl Balance {
    fn new(burst: NonZeroU64) -> Self {
        Balance {
            available: 0,
            burst,
            unlimited: true,
        }
    }

    fn has_tokens(&self) -> bool {
        self.unlimited || self.available > 0
    }

    /// Charges `tokens`, never refused, leaving at most `debt_bursts`
    /// bursts of debt. A balance already below that is not raised, only not
    /// lowered further. An unlimited balance is not charged, so it has no
    /// debt when the limit comes on.
    fn charge(&mut self, tokens: u64, debt_bursts: u64) {
        if self.unlimited {
            return;
        }
        let floor = to_balance(self.burst.get().saturating_mul(debt_bursts)).saturating_neg();
        let after = self.available.saturating_sub(to_balance(tokens));
        self.available = after.max(floor.min(self.available));
    }

    /// Credits `tokens`, capped at the burst. A balance already above the
    /// burst (the burst was lowered) is not cut, only not raised further.
    fn credit(&mut self, tokens: u64) {
        if self.unlimited {
            return;
        }
        let burst = to_balance(self.burst.get());
        let after = self.available.saturating_add(to_balance(tokens));
        self.available = after.min(burst.max(self.available));
    }
}

/// The two balances of a [`TokenGranter`] pair, shared between the regular
/// and the elastic queue; see [`TokenGranter`] for the rules.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    balances: Mutex<[Balance; 2]>,
}

impl TokenBucket {
    fn new(regular_burst: NonZeroU64, elastic_burst: NonZeroU64) -> Self {
        TokenBucket {
            balances: Mutex::new([Balance::new(regular_burst), Balance::new(elastic_burst)]),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Balance, &mut Balance) -> R) -> R {
        let mut balances = self.balances.lock();
        let [regular, elastic] = &mut *balances;
        f(regular, elastic)
    }

    fn take(&self, class: TokenClass, count: u64) -> bool {
        self.with(|regular, elastic| {
            let allowed = match class {
                TokenClass::Regular => regular.has_tokens(),
                TokenClass::Elastic => regular.has_tokens() && elastic.has_tokens(),
            };
            if allowed {
                regular.charge(count, DEBT_LIMIT_BURSTS);
                elastic.charge(count, DEBT_LIMIT_BURSTS);
            }
            allowed
        })
    }

    fn charge_both(&self, tokens: u64, debt_bursts: u64) {
        self.with(|regular, elastic| {
            regular.charge(tokens, debt_bursts);
            elastic.charge(tokens, debt_bursts);
        })
    }

    fn credit_both(&self, tokens: u64) {
        self.with(|regular, elastic| {
            regular.credit(tokens);
            elastic.credit(tokens);
        })
    }

    fn with_class<R>(&self, class: TokenClass, f: impl FnOnce(&mut Balance) -> R) -> R {
        self.with(|regular, elastic| match class {
            TokenClass::Regular => f(regular),
            TokenClass::Elastic => f(elastic),
        })
    }
}

/// A token budget: consumed at admission, never returned, refilled with
/// [`WorkQueue::add_tokens`](crate::WorkQueue::add_tokens). The balance may
/// go negative (a positive balance admits a whole request; bypass and low
/// estimates add debt, within [bounds](#bounded-debt)) and refills pay the
/// debt first.
///
/// A granter spends one [`TokenClass`] of a bucket of two balances, its own
/// ([`new`](Self::new)) or shared with the granter of the other class
/// ([`pair`](Self::pair)).
///
/// # Regular and elastic balances
///
/// **Regular** tokens admit work at priority zero and above; **elastic**
/// tokens are a smaller budget inside them for work below zero (bulk ingest,
/// backfills), which the IO listener limits earlier and harder. Every
/// admission deducts from *both* balances: regular writes use up what
/// elastic work could have had, so elastic work gets only what is left,
/// while elastic work needs both balances positive and so never spends
/// regular work's tokens. A class that is unlimited is not charged, so a
/// healthy store runs up no debt. Corrections, bypass and the credit for a
/// grant dropped unseen reach both balances the same way.
///
/// # Bounded debt
///
/// Debt is bounded too, so that no single number a caller passes can block
/// a class for good (a `u64::MAX` correction once put both balances 9.2e18
/// bytes into debt, which no refill would ever pay):
///
/// * an admission or a bypass leaves a balance at most
///   60 bursts below zero: one interval's budget for the
///   [`io::Controller`](crate::io::Controller), whose burst is an interval's
///   tokens over 60, so any admitted size is paid off within an interval;
/// * a correction ([`WorkQueue::correct_tokens`](crate::WorkQueue::correct_tokens))
///   leaves it at most **one burst** below zero: an estimate that was off is
///   settled, but a correction cannot cost a class more than one burst of
///   refills (a quarter of a second at the IO controller's defaults);
/// * a balance already below a bound (the burst was lowered) is not raised
///   by a charge, only not lowered further; all arithmetic saturates.
///
/// A burst of zero is refused ([`ConfigError`]): a class that can bank
/// nothing never admits anything.
pub struct TokenGranter {
    bucket: Arc<TokenBucket>,
    class: TokenClass,
}

impl fmt::Debug for TokenGranter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenGranter")
            .field("class", &self.class)
            .field("bucket", &self.bucket)
            .finish()
    }
}

/// The token granter keeps its balances in its bucket, which both
/// classes' queues share, so there is nothing under the queue's own lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenState;

/// A [`TokenGranter`]'s state at one moment: its own class's balance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenSnapshot {
    /// The class this granter spends.
    pub class: TokenClass,
    /// Tokens available now; negative while the class is in debt.
    pub available: i64,
    /// The most that can be banked.
    pub burst: u64,
    /// Whether admission is unlimited for this class.
    pub unlimited: bool,
}

fn to_balance(tokens: u64) -> i64 {
    i64::try_from(tokens).unwrap_or(i64::MAX)
}

impl TokenGranter {
    /// A regular-class granter with a bucket of its own that starts
    /// unlimited (a healthy store has no budget) and banks at most `burst`
    /// tokens once limited; a [`ConfigError`] naming `burst` if it is zero.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `burst` if it is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::grant::{TokenClass, TokenGranter};
    /// use admission::WorkQueue;
    ///
    /// let granter = TokenGranter::new(64 << 20)?;
    /// assert_eq!(granter.class(), TokenClass::Regular);
    /// let queue = WorkQueue::builder().build_with(granter)?;
    /// assert!(queue.snapshot().granter.unlimited);
    ///
    /// assert_eq!(TokenGranter::new(0).unwrap_err().field(), "burst");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn new(burst: u64) -> Result<Self, ConfigError> {
        let burst = Self::nonzero_burst("burst", burst)?;
        Ok(Self::nonzero_pair(burst, burst).0)
    }

    /// A regular and an elastic granter sharing one bucket, both
    /// starting unlimited, banking at most `regular_burst` and
    /// `elastic_burst` once limited; a [`ConfigError`] naming the burst
    /// that is zero.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `regular_burst` if it is zero, otherwise
    /// `elastic_burst` if that is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::grant::{TokenClass, TokenGranter};
    /// use admission::WorkQueue;
    ///
    /// let (regular, elastic) = TokenGranter::pair(64 << 20, 8 << 20)?;
    /// assert_eq!(elastic.class(), TokenClass::Elastic);
    /// // One queue per class, spending one shared bucket.
    /// let writes = WorkQueue::builder().build_with(regular)?;
    /// let backfills = WorkQueue::builder().build_with(elastic)?;
    ///
    /// let err = TokenGranter::pair(64 << 20, 0).unwrap_err();
    /// assert_eq!(err.field(), "elastic_burst");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn pair(
        regular_burst: u64,
        elastic_burst: u64,
    ) -> Result<(TokenGranter, TokenGranter), ConfigError> {
        Ok(Self::nonzero_pair(
            Self::nonzero_burst("regular_burst", regular_burst)?,
            Self::nonzero_burst("elastic_burst", elastic_burst)?,
        ))
    }

    fn nonzero_pair(
        regular_burst: NonZeroU64,
        elastic_burst: NonZeroU64,
    ) -> (TokenGranter, TokenGranter) {
        let bucket = Arc::new(TokenBucket::new(regular_burst, elastic_burst));
        (
            TokenGranter {
                bucket: bucket.clone(),
                class: TokenClass::Regular,
            },
            TokenGranter {
                bucket,
                class: TokenClass::Elastic,
            },
        )
    }

    /// The class this granter spends.
    pub fn class(&self) -> TokenClass {
        self.class
    }

    /// Switches this class's limit on or off. Crate-private: a user calls
    /// [`WorkQueue::set_token_limit`](crate::WorkQueue::set_token_limit),
    /// which also grants waiters when the limit goes away (switching it
    /// here alone would leave them waiting). A class turning limited starts
    /// from an empty balance, not from what it banked when it was last
    /// limited.
    pub(crate) fn set_unlimited(&self, unlimited: bool) {
        self.bucket.with_class(self.class, |balance| {
            if balance.unlimited && !unlimited {
                balance.available = 0;
            }
            balance.unlimited = unlimited;
        });
    }

    /// Sets the most this class can bank (for example an interval's tokens
    /// over 60, as upstream does); a [`ConfigError`] naming `burst` if it is
    /// zero.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `burst` if it is zero; the burst is then
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::grant::TokenGranter;
    /// use admission::WorkQueue;
    ///
    /// let queue = WorkQueue::builder().build_with(TokenGranter::new(1_000)?)?;
    /// queue.set_token_limit(Some(1_000))?;
    /// queue.granter().set_burst(100)?;
    /// queue.add_tokens(500);
    /// // The balance banks no more than the new burst.
    /// assert_eq!(queue.snapshot().granter.available, 100);
    ///
    /// assert_eq!(queue.granter().set_burst(0).unwrap_err().field(), "burst");
    /// assert_eq!(queue.snapshot().granter.burst, 100);
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn set_burst(&self, burst: u64) -> Result<(), ConfigError> {
        self.set_nonzero_burst(Self::nonzero_burst("burst", burst)?);
        Ok(())
    }

    /// `burst` if it is at least one, else a [`ConfigError`] naming `field`.
    pub(crate) fn nonzero_burst(
        field: &'static str,
        burst: u64,
    ) -> Result<NonZeroU64, ConfigError> {
        NonZeroU64::new(burst).ok_or_else(|| {
            ConfigError::new(
                field,
                "0 banks nothing, so the class would never admit anything; use at least 1",
            )
        })
    }

    pub(crate) fn set_nonzero_burst(&self, burst: NonZeroU64) {
        self.bucket
            .with_class(self.class, |balance| balance.burst = burst);
    }

    /// This class's burst.
    pub(crate) fn burst(&self) -> NonZeroU64 {
        self.bucket.with_class(self.class, |balance| balance.burst)
    }

    /// Adds `tokens` to this class's balance, paying debt first, up to the
    /// burst.
    pub(crate) fn add(&self, tokens: u64) {
        self.bucket
            .with_class(self.class, |balance| balance.credit(tokens));
    }

    /// Charges (`delta > 0`) or credits (`delta < 0`) a correction between
    /// an estimate and the actual cost to both classes, never blocking; a
    /// charge leaves at most one burst of debt (see
    /// [`TokenGranter`](TokenGranter#bounded-debt)).
    pub(crate) fn correct(&self, delta: i64) {
        if delta > 0 {
            self.bucket
                .charge_both(delta.unsigned_abs(), CORRECTION_DEBT_BURSTS);
        } else {
            self.bucket.credit_both(delta.unsigned_abs());
        }
    }
}

impl Granter for TokenGranter {
    type State = TokenState;
    type Snapshot = TokenSnapshot;

    fn initial_state(&self) -> TokenState {
        TokenState
    }

    fn try_get(&self, _state: &mut TokenState, count: u64) -> bool {
        self.bucket.take(self.class, count)
    }

    fn return_grant(&self, _state: &mut TokenState, _count: u64) {
        // Consumed for good: completion returns nothing. Differences from
        // the estimate are settled with `WorkQueue::correct_tokens`.
    }

    fn cancel_grant(&self, _state: &mut TokenState, count: u64) {
        // The write never happened: its tokens go back to both budgets, as
        // they were taken from both.
        self.bucket.credit_both(count);
    }

    fn took_without_permission(&self, _state: &mut TokenState, count: u64) {
        self.bucket.charge_both(count, DEBT_LIMIT_BURSTS);
    }

    fn snapshot(&self, _state: &TokenState) -> TokenSnapshot {
        self.bucket.with_class(self.class, |balance| TokenSnapshot {
            class: self.class,
            available: balance.available,
            burst: balance.burst.get(),
            unlimited: balance.unlimited,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(burst: u64) -> TokenGranter {
        let granter = TokenGranter::new(burst).unwrap();
        granter.set_unlimited(false);
        granter
    }

    fn take(granter: &TokenGranter, count: u64) -> bool {
        granter.try_get(&mut TokenState, count)
    }

    fn available(granter: &TokenGranter) -> i64 {
        granter.snapshot(&TokenState).available
    }

    #[test]
    fn a_positive_balance_admits_a_whole_request_and_goes_into_debt() {
        let tokens = limited(1_000);
        assert!(!take(&tokens, 1), "nothing banked yet");
        tokens.add(100);
        assert!(take(&tokens, 300));
        assert_eq!(available(&tokens), -200);
        assert!(!take(&tokens, 1), "in debt");
        tokens.add(150);
        assert!(!take(&tokens, 1), "refills pay the debt first");
        tokens.add(51);
        assert!(take(&tokens, 1));
    }

    #[test]
    fn the_balance_never_banks_past_the_burst() {
        let tokens = limited(100);
        tokens.add(1_000);
        assert_eq!(available(&tokens), 100);
        tokens.correct(-500);
        assert_eq!(available(&tokens), 100, "credits are capped too");
        tokens.set_burst(10).unwrap();
        tokens.add(1);
        assert_eq!(available(&tokens), 100, "a lowered burst cuts nothing");
    }

    #[test]
    fn corrections_charge_or_credit_without_blocking() {
        let tokens = limited(1_000);
        tokens.add(500);
        assert!(take(&tokens, 100));
        tokens.correct(400); // the write was 500, not 100
        assert_eq!(available(&tokens), 0);
        tokens.correct(-50); // and then 50 were refunded
        assert_eq!(available(&tokens), 50);
    }

    #[test]
    fn unlimited_admits_everything_without_running_up_a_debt() {
        let tokens = TokenGranter::new(10).unwrap();
        assert!(take(&tokens, 1_000));
        tokens.took_without_permission(&mut TokenState, 5);
        assert_eq!(available(&tokens), 0);
        tokens.set_unlimited(false);
        tokens.add(3);
        assert!(take(&tokens, 7));
        tokens.return_grant(&mut TokenState, 7);
        assert_eq!(available(&tokens), -4, "tokens are never returned");
    }

    #[test]
    fn extreme_values_saturate() {
        let tokens = limited(u64::MAX);
        tokens.add(u64::MAX);
        tokens.add(u64::MAX);
        assert_eq!(available(&tokens), i64::MAX);
        assert!(take(&tokens, u64::MAX));
        tokens.took_without_permission(&mut TokenState, u64::MAX);
        tokens.took_without_permission(&mut TokenState, u64::MAX);
        assert_eq!(available(&tokens), -i64::MAX, "the floor saturates");
        tokens.correct(i64::MIN);
        tokens.correct(i64::MAX);
        assert_eq!(
            available(&tokens),
            -i64::MAX,
            "a full credit then a full charge"
        );
    }

    #[test]
    fn a_burst_of_zero_is_refused_naming_the_field() {
        assert_eq!(TokenGranter::new(0).unwrap_err().field(), "burst");
        assert_eq!(
            TokenGranter::pair(0, 1).unwrap_err().field(),
            "regular_burst"
        );
        assert_eq!(
            TokenGranter::pair(1, 0).unwrap_err().field(),
            "elastic_burst"
        );
        let tokens = limited(10);
        assert_eq!(tokens.set_burst(0).unwrap_err().field(), "burst");
        assert_eq!(tokens.snapshot(&TokenState).burst, 10, "left as it was");
    }

    /// One row: a name, the tokens added first, the charges, the balance.
    type DebtRow = (&'static str, i64, fn(&TokenGranter), i64);

    /// Burst 100: admissions and bypass stop at 60 bursts of debt,
    /// corrections at one.
    #[test]
    fn debt_is_bounded_per_kind_of_charge() {
        let rows: &[DebtRow] = &[
            ("huge admission", 1, |t| assert!(take(t, u64::MAX)), -6_000),
            (
                "huge bypass",
                0,
                |t| t.took_without_permission(&mut TokenState, u64::MAX),
                -6_000,
            ),
            ("huge correction", 0, |t| t.correct(i64::MAX), -100),
            (
                "correction on top of admission debt",
                1,
                |t| {
                    assert!(take(t, 301));
                    t.correct(i64::MAX);
                },
                -300,
            ),
            (
                "bypass on top of correction debt",
                0,
                |t| {
                    t.correct(i64::MAX);
                    t.took_without_permission(&mut TokenState, 50);
                },
                -150,
            ),
            ("small charges are exact", 0, |t| t.correct(42), -42),
        ];
        for &(name, start, charge, expected) in rows {
            let tokens = limited(100);
            tokens.add(u64::try_from(start).unwrap());
            charge(&tokens);
            assert_eq!(available(&tokens), expected, "{name}");
        }
    }

    #[test]
    fn a_debt_below_a_lowered_floor_is_kept_not_raised() {
        let tokens = limited(100);
        tokens.took_without_permission(&mut TokenState, 5_000);
        tokens.set_burst(10).unwrap();
        tokens.correct(1);
        assert_eq!(available(&tokens), -5_000);
        tokens.took_without_permission(&mut TokenState, 1);
        assert_eq!(available(&tokens), -5_000);
    }

    fn limited_pair(regular: u64, elastic: u64) -> (TokenGranter, TokenGranter) {
        let (r, e) = TokenGranter::pair(u64::MAX, u64::MAX).unwrap();
        r.set_unlimited(false);
        e.set_unlimited(false);
        r.add(regular);
        e.add(elastic);
        (r, e)
    }

    #[test]
    fn every_admission_deducts_from_both_classes() {
        let (regular, elastic) = limited_pair(1_000, 100);
        assert!(take(&regular, 60));
        assert_eq!((available(&regular), available(&elastic)), (940, 40));
        assert!(take(&elastic, 50));
        assert_eq!((available(&regular), available(&elastic)), (890, -10));
        assert!(!take(&elastic, 1), "elastic is in debt");
        assert!(take(&regular, 1), "regular work is not held back by it");
    }

    #[test]
    fn elastic_work_needs_both_balances_positive() {
        let (regular, elastic) = limited_pair(0, 500);
        assert!(!take(&elastic, 1), "no regular tokens: elastic waits too");
        regular.add(1);
        assert!(take(&elastic, 10));
        assert_eq!((available(&regular), available(&elastic)), (-9, 490));
    }

    #[test]
    fn regular_writes_use_up_the_elastic_budget() {
        // Regular unlimited, elastic limited (score between 0.2 and 0.5):
        // regular work is admitted freely but still uses elastic tokens up.
        let (regular, elastic) = TokenGranter::pair(u64::MAX, 1_000).unwrap();
        elastic.set_unlimited(false);
        elastic.add(100);
        assert!(take(&regular, 80));
        assert!(take(&regular, 80));
        assert_eq!(available(&regular), 0, "unlimited is not charged");
        assert_eq!(available(&elastic), -60);
        assert!(!take(&elastic, 1));
    }

    #[test]
    fn corrections_and_bypass_reach_both_classes() {
        let (regular, elastic) = limited_pair(100, 100);
        elastic.correct(30);
        assert_eq!((available(&regular), available(&elastic)), (70, 70));
        regular.took_without_permission(&mut TokenState, 20);
        assert_eq!((available(&regular), available(&elastic)), (50, 50));
    }

    #[test]
    fn a_class_turning_limited_starts_empty() {
        let (regular, _elastic) = TokenGranter::pair(100, 100).unwrap();
        regular.set_unlimited(false);
        regular.add(80);
        regular.set_unlimited(true);
        regular.set_unlimited(false);
        assert_eq!(available(&regular), 0);
    }
}
