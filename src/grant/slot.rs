//! The slot granter: a concurrency limit with a total that can move.
//!
//! Two atomics, `used` and `total`. `try_get` succeeds while `used < total`;
//! completion returns the slot. The total is set from outside (by the CPU
//! slot adjuster, or by hand) and may drop below `used`: granted slots are
//! never revoked, so `used` may exceed `total` until enough work completes.
//! Bypassed work increments `used` without asking, with the same effect.

use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

use super::Granter;

/// A dynamic concurrency limit: slots are held while work runs and returned
/// when it completes.
#[derive(Debug)]
pub struct SlotGranter {
    used: AtomicU64,
    total: AtomicU64,
}

/// A [`SlotGranter`]'s state at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotSnapshot {
    /// Slots held by admitted work (may exceed `total`).
    pub used: u64,
    /// The current limit.
    pub total: u64,
}

impl SlotGranter {
    /// The largest total accepted.
    pub const MAX_TOTAL: u64 = 1 << 32;

    /// A granter with `total` slots, or a [`ConfigError`] naming
    /// `total_slots` if `total` exceeds [`MAX_TOTAL`](Self::MAX_TOTAL).
    /// A total of zero is valid: nothing is admitted until it is raised.
    pub fn new(total: u64) -> Result<Self, ConfigError> {
        Self::check_total(total)?;
        Ok(SlotGranter {
            used: AtomicU64::new(0),
            total: AtomicU64::new(total),
        })
    }

    fn check_total(total: u64) -> Result<(), ConfigError> {
        if total > Self::MAX_TOTAL {
            return Err(ConfigError::out_of_range(
                "total_slots",
                total,
                0,
                Self::MAX_TOTAL,
            ));
        }
        Ok(())
    }

    /// Slots currently held.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The current limit.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Moves the limit. Lowering it revokes nothing; raising it admits
    /// nobody by itself: call [`Requester::granted`](super::Requester::granted)
    /// on the queue afterwards, or use
    /// [`WorkQueue::set_total_slots`](crate::WorkQueue::set_total_slots),
    /// which does both.
    pub fn set_total(&self, total: u64) -> Result<(), ConfigError> {
        Self::check_total(total)?;
        self.total.store(total, Ordering::Release);
        Ok(())
    }
}

impl Granter for SlotGranter {
    type Snapshot = SlotSnapshot;

    fn try_get(&self, count: u64) -> bool {
        let total = self.total.load(Ordering::Acquire);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(count).filter(|&after| after <= total)
            })
            .is_ok()
    }

    fn return_grant(&self, count: u64) {
        let returned = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_sub(count)
            });
        if returned.is_err() {
            // A bug in the caller, not bad input: say so loudly, keep the
            // count at zero rather than wrapping to 2^64 and admitting nothing.
            tracing::error!(count, "slot granter: more slots returned than were held");
            self.used.store(0, Ordering::Release);
        }
    }

    fn took_without_permission(&self, count: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_add(count))
            });
    }

    fn snapshot(&self) -> SlotSnapshot {
        SlotSnapshot {
            used: self.used(),
            total: self.total(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn try_get_stops_at_the_total_and_return_reopens_it() {
        let slots = SlotGranter::new(2).unwrap();
        assert!(slots.try_get(1));
        assert!(slots.try_get(1));
        assert!(!slots.try_get(1));
        slots.return_grant(1);
        assert!(slots.try_get(1));
        assert_eq!(slots.snapshot(), SlotSnapshot { used: 2, total: 2 });
    }

    #[test]
    fn lowering_the_total_revokes_nothing() {
        let slots = SlotGranter::new(3).unwrap();
        for _ in 0..3 {
            assert!(slots.try_get(1));
        }
        slots.set_total(1).unwrap();
        assert_eq!(slots.used(), 3);
        slots.return_grant(1);
        assert!(!slots.try_get(1), "2 used of 1: still over the total");
        slots.return_grant(2);
        assert!(slots.try_get(1));
    }

    #[test]
    fn bypass_may_push_used_past_the_total() {
        let slots = SlotGranter::new(1).unwrap();
        slots.took_without_permission(2);
        assert_eq!(slots.snapshot(), SlotSnapshot { used: 2, total: 1 });
        assert!(!slots.try_get(1));
    }

    #[test]
    fn an_excess_return_clamps_at_zero() {
        let slots = SlotGranter::new(1).unwrap();
        slots.return_grant(1);
        assert_eq!(slots.used(), 0);
        assert!(slots.try_get(1));
    }

    #[test]
    fn totals_above_the_maximum_are_rejected_naming_the_field() {
        let err = SlotGranter::new(SlotGranter::MAX_TOTAL + 1).unwrap_err();
        assert_eq!(err.field(), "total_slots");
        let slots = SlotGranter::new(1).unwrap();
        assert!(slots.set_total(u64::MAX).is_err());
        assert_eq!(slots.total(), 1);
    }
}
