//! The token granter: a budget of units consumed at admission and never
//! returned, refilled from a capacity model.
//!
//! Tokens fit work whose true cost lands later (a write's bytes are paid for
//! when compactions rewrite them), so there is nothing to give back when the
//! work completes. The balance lives in the granter's [`TokenState`], under
//! the queue's lock. A request is granted while the balance is positive and
//! takes its whole (estimated) size, so the balance can go negative: a large
//! request is never starved by small ones, and the debt is paid by the next
//! refills before anyone else is admitted. Work taken without permission
//! (bypass) and estimates that turn out low push it further into debt the
//! same way. The balance is capped at a burst size, so an idle stretch does
//! not bank an unbounded allowance.
//!
//! Refills come from outside the queue (the IO load listener's
//! [`TokenDrip`](crate::io::TokenDrip), every tick) through
//! [`WorkQueue::add_tokens`](crate::WorkQueue::add_tokens), which grants the
//! waiters the new tokens cover.

use crate::sync::{AtomicBool, AtomicU64, Ordering};

use super::Granter;

/// A token budget: consumed at admission, never returned, refilled with
/// [`WorkQueue::add_tokens`](crate::WorkQueue::add_tokens). The balance may
/// go negative (a positive balance admits a whole request; bypass and low
/// estimates add debt) and refills pay the debt first.
#[derive(Debug)]
pub struct TokenGranter {
    burst: AtomicU64,
    unlimited: AtomicBool,
}

/// The balance, kept under the owning queue's lock. Negative is debt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenState {
    available: i64,
}

/// A [`TokenGranter`]'s state at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenSnapshot {
    /// Tokens available now; negative while the granter is in debt.
    pub available: i64,
    /// The most that can be banked.
    pub burst: u64,
    /// Whether admission is unlimited (the store is healthy).
    pub unlimited: bool,
}

fn to_balance(tokens: u64) -> i64 {
    i64::try_from(tokens).unwrap_or(i64::MAX)
}

impl TokenGranter {
    /// A granter that starts unlimited (a healthy store has no budget) and
    /// banks at most `burst` tokens once limited.
    pub fn new(burst: u64) -> Self {
        TokenGranter {
            burst: AtomicU64::new(burst),
            unlimited: AtomicBool::new(true),
        }
    }

    /// Whether every request is admitted at once (tokens are still counted).
    pub fn is_unlimited(&self) -> bool {
        self.unlimited.load(Ordering::Acquire)
    }

    /// Switches the limit on or off; see
    /// [`WorkQueue::set_token_limit`](crate::WorkQueue::set_token_limit),
    /// which also grants waiters when the limit goes away.
    pub fn set_unlimited(&self, unlimited: bool) {
        self.unlimited.store(unlimited, Ordering::Release);
    }

    /// Sets the most that can be banked (for example an interval's tokens
    /// over 60, as upstream does).
    pub fn set_burst(&self, burst: u64) {
        self.burst.store(burst, Ordering::Release);
    }

    pub(crate) fn burst(&self) -> u64 {
        self.burst.load(Ordering::Acquire)
    }

    /// Adds `tokens` to the balance, paying debt first, up to the burst.
    pub(crate) fn add(&self, state: &mut TokenState, tokens: u64) {
        let burst = to_balance(self.burst());
        let after = state.available.saturating_add(to_balance(tokens));
        // A balance already above the burst (the burst was lowered) is not
        // cut, only not raised further.
        state.available = after.min(burst.max(state.available));
    }

    /// Charges (`delta > 0`) or credits (`delta < 0`) a correction between
    /// an estimate and the actual cost, never blocking.
    pub(crate) fn correct(&self, state: &mut TokenState, delta: i64) {
        let burst = to_balance(self.burst());
        let after = state.available.saturating_sub(delta);
        state.available = after.min(burst.max(state.available));
    }
}

impl Granter for TokenGranter {
    type State = TokenState;
    type Snapshot = TokenSnapshot;

    fn initial_state(&self) -> TokenState {
        TokenState::default()
    }

    fn try_get(&self, state: &mut TokenState, count: u64) -> bool {
        // Unlimited means no budget at all: nothing is deducted, so the
        // first limited interval does not start in a debt run up while the
        // store was healthy.
        if self.is_unlimited() {
            return true;
        }
        if state.available > 0 {
            state.available = state.available.saturating_sub(to_balance(count));
            return true;
        }
        false
    }

    fn return_grant(&self, _state: &mut TokenState, _count: u64) {
        // Consumed for good: completion returns nothing. Differences from
        // the estimate are settled with `WorkQueue::correct_tokens`.
    }

    fn took_without_permission(&self, state: &mut TokenState, count: u64) {
        if !self.is_unlimited() {
            state.available = state.available.saturating_sub(to_balance(count));
        }
    }

    fn snapshot(&self, state: &TokenState) -> TokenSnapshot {
        TokenSnapshot {
            available: state.available,
            burst: self.burst(),
            unlimited: self.is_unlimited(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(burst: u64) -> (TokenGranter, TokenState) {
        let granter = TokenGranter::new(burst);
        granter.set_unlimited(false);
        let state = granter.initial_state();
        (granter, state)
    }

    #[test]
    fn a_positive_balance_admits_a_whole_request_and_goes_into_debt() {
        let (tokens, mut state) = limited(1_000);
        assert!(!tokens.try_get(&mut state, 1), "nothing banked yet");
        tokens.add(&mut state, 100);
        assert!(tokens.try_get(&mut state, 300));
        assert_eq!(state.available, -200);
        assert!(!tokens.try_get(&mut state, 1), "in debt");
        tokens.add(&mut state, 150);
        assert!(!tokens.try_get(&mut state, 1), "refills pay the debt first");
        tokens.add(&mut state, 51);
        assert!(tokens.try_get(&mut state, 1));
    }

    #[test]
    fn the_balance_never_banks_past_the_burst() {
        let (tokens, mut state) = limited(100);
        tokens.add(&mut state, 1_000);
        assert_eq!(state.available, 100);
        tokens.correct(&mut state, -500);
        assert_eq!(state.available, 100, "credits are capped too");
        tokens.set_burst(10);
        tokens.add(&mut state, 1);
        assert_eq!(state.available, 100, "a lowered burst cuts nothing");
    }

    #[test]
    fn corrections_charge_or_credit_without_blocking() {
        let (tokens, mut state) = limited(1_000);
        tokens.add(&mut state, 500);
        assert!(tokens.try_get(&mut state, 100));
        tokens.correct(&mut state, 400); // the write was 500, not 100
        assert_eq!(state.available, 0);
        tokens.correct(&mut state, -50); // and then 50 were refunded
        assert_eq!(state.available, 50);
    }

    #[test]
    fn unlimited_admits_everything_without_running_up_a_debt() {
        let tokens = TokenGranter::new(10);
        let mut state = tokens.initial_state();
        assert!(tokens.try_get(&mut state, 1_000));
        tokens.took_without_permission(&mut state, 5);
        assert_eq!(tokens.snapshot(&state).available, 0);
        tokens.set_unlimited(false);
        tokens.add(&mut state, 3);
        assert!(tokens.try_get(&mut state, 7));
        tokens.return_grant(&mut state, 7);
        assert_eq!(state.available, -4, "tokens are never returned");
    }

    #[test]
    fn extreme_values_saturate() {
        let (tokens, mut state) = limited(u64::MAX);
        tokens.add(&mut state, u64::MAX);
        tokens.add(&mut state, u64::MAX);
        assert_eq!(state.available, i64::MAX);
        assert!(tokens.try_get(&mut state, u64::MAX));
        tokens.took_without_permission(&mut state, u64::MAX);
        tokens.took_without_permission(&mut state, u64::MAX);
        assert_eq!(state.available, i64::MIN);
    }
}
