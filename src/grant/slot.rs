//! The slot granter: a concurrency limit with a total that can move.
//!
//! The total is an atomic in the granter, because it is set from outside the
//! queue (by the CPU slot adjuster, or by hand); so is the count of slots in
//! use, because the queue's lane (`queue/lane.rs`) takes and returns slots
//! without the queue's lock while nobody waits (every change to it is one
//! compare-and-swap that checks the total, so no path takes a slot past it
//! while enforcing). `try_get` succeeds while `used < total`; completion returns the slot. The total may
//! drop below `used`: granted slots are never revoked, so `used` may exceed
//! `total` until enough work completes. Bypassed work increments `used`
//! without asking, with the same effect.
//!
//! Enforcement can be switched off (the CPU controller does so while the
//! node is idle and sampled slowly, as upstream does): `try_get` then always
//! succeeds and still counts the slot, so the totals stay exact for when
//! enforcement resumes. The first grant past the total while enforcement is
//! off raises the *overrun* mark and rings the alarm set by the owner (the
//! controller's sampler thread is then woken from its slow idle sleep): a
//! spike that starts while the node is idle is seen at once, not up to an
//! idle period later.

use std::fmt;
use std::sync::OnceLock;

use crate::error::ConfigError;
use crate::sync::{AtomicBool, AtomicU64, Ordering};

use super::Granter;

/// A dynamic concurrency limit: slots are held while work runs and returned
/// when it completes.
#[derive(Debug)]
pub struct SlotGranter {
    /// Slots in use. Here rather than in [`SlotState`], as an atomic, so
    /// that the queue's lane (`queue/lane.rs`) can take a free slot and
    /// give one back without the queue's lock.
    used: AtomicU64,
    total: AtomicU64,
    /// The highest total a controller may move to; 0 when none is set.
    ceiling: AtomicU64,
    enforcing: AtomicBool,
    /// Set by the first grant past the total while enforcement is off;
    /// cleared by whoever reads it (the controller's tick).
    overrun: AtomicBool,
    overrun_alarm: OnceLock<OverrunAlarm>,
}

/// What the first overrun of an idle spell calls: something that returns
/// at once (it runs under the queue's lock).
struct OverrunAlarm(Box<dyn Fn() + Send + Sync>);

impl fmt::Debug for OverrunAlarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("OverrunAlarm")
    }
}

/// The state a [`SlotGranter`] keeps under the owning queue's lock: none.
/// Its count of slots in use is an atomic in the granter, so that a queue
/// with nobody waiting can admit and release without its lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotState {
    _none: (),
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
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `total_slots` if `total` exceeds
    /// [`MAX_TOTAL`](Self::MAX_TOTAL).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::grant::SlotGranter;
    /// use admission::WorkQueue;
    ///
    /// let granter = SlotGranter::new(4)?;
    /// assert_eq!(granter.total(), 4);
    /// let queue = WorkQueue::builder().build_with(granter)?;
    /// assert_eq!(queue.snapshot().granter.total, 4);
    ///
    /// let err = SlotGranter::new(SlotGranter::MAX_TOTAL + 1).unwrap_err();
    /// assert_eq!(err.field(), "total_slots");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn new(total: u64) -> Result<Self, ConfigError> {
        Self::check_total(total)?;
        Ok(SlotGranter {
            used: AtomicU64::new(0),
            total: AtomicU64::new(total),
            ceiling: AtomicU64::new(0),
            enforcing: AtomicBool::new(true),
            overrun: AtomicBool::new(false),
            overrun_alarm: OnceLock::new(),
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

    /// The current limit.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Whether the total is enforced (the default).
    pub(crate) fn is_enforcing(&self) -> bool {
        self.enforcing.load(Ordering::Acquire)
    }

    /// Switches enforcement. While off, every `try_get` succeeds (and is
    /// counted); use [`WorkQueue::set_enforcing`](crate::WorkQueue::set_enforcing)
    /// so that waiters are granted when it goes off.
    pub(crate) fn set_enforcing(&self, enforcing: bool) {
        self.enforcing.store(enforcing, Ordering::Release);
    }

    /// Whether a grant went past the total while enforcement was off, since
    /// the last call; clears the mark, so that the next overrun rings the
    /// alarm again.
    pub(crate) fn take_overrun(&self) -> bool {
        self.overrun.swap(false, Ordering::AcqRel)
    }

    /// Sets what the first overrun after [`take_overrun`](Self::take_overrun)
    /// calls, under the queue's lock: it must return at once and must not
    /// touch the queue. Only the first alarm set is kept.
    pub(crate) fn set_overrun_alarm(&self, alarm: impl Fn() + Send + Sync + 'static) {
        let _ = self.overrun_alarm.set(OverrunAlarm(Box::new(alarm)));
    }

    /// Declares the highest total that the total will be moved to (by a
    /// controller, such as the CPU [`Controller`](crate::cpu::Controller)'s
    /// `max_slots`): a request for up to that many slots may wait for the
    /// total to grow; a larger one is refused with
    /// [`AdmitError::NeverFits`](crate::AdmitError::NeverFits). Without a
    /// ceiling the current total is the bound (none while it is zero: a
    /// total of zero pauses admission).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `ceiling` if it exceeds
    /// [`MAX_TOTAL`](Self::MAX_TOTAL).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::{WorkInfo, WorkQueue};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let queue = WorkQueue::new(2)?;
    /// queue.granter().set_ceiling(8)?;
    /// // Four slots fit under the ceiling: the request waits for the total
    /// // to grow rather than being refused as never fitting.
    /// let four = WorkInfo::builder().requested(4).build();
    /// let waiting = tokio::spawn(queue.admit(four));
    /// tokio::task::yield_now().await;
    /// assert_eq!(queue.waiting(), 1);
    ///
    /// queue.set_total_slots(4)?;
    /// let permit = waiting.await??;
    /// assert_eq!(queue.snapshot().granter.used, 4);
    ///
    /// let err = queue.granter().set_ceiling(u64::MAX).unwrap_err();
    /// assert_eq!(err.field(), "ceiling");
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_ceiling(&self, ceiling: u64) -> Result<(), ConfigError> {
        if ceiling > Self::MAX_TOTAL {
            return Err(ConfigError::out_of_range(
                "ceiling",
                ceiling,
                0,
                Self::MAX_TOTAL,
            ));
        }
        self.ceiling.store(ceiling, Ordering::Release);
        Ok(())
    }

    /// Moves the limit. Lowering it revokes nothing; raising it admits
    /// nobody by itself: call [`Requester::granted`](super::Requester::granted)
    /// on the queue afterwards, or use
    /// [`WorkQueue::set_total_slots`](crate::WorkQueue::set_total_slots),
    /// which does both.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `total_slots` if `total` exceeds
    /// [`MAX_TOTAL`](Self::MAX_TOTAL); the total is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::grant::SlotGranter;
    ///
    /// let granter = SlotGranter::new(4)?;
    /// granter.set_total(2)?;
    /// assert_eq!(granter.total(), 2);
    ///
    /// let err = granter.set_total(SlotGranter::MAX_TOTAL + 1).unwrap_err();
    /// assert_eq!(err.field(), "total_slots");
    /// assert_eq!(granter.total(), 2);
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn set_total(&self, total: u64) -> Result<(), ConfigError> {
        Self::check_total(total)?;
        self.total.store(total, Ordering::Release);
        Ok(())
    }
}

impl SlotGranter {
    /// `try_get` when the units fit under the total: `false` (and nothing
    /// taken) where `try_get` has more to decide.
    #[inline]
    pub(crate) fn take_within_total(&self, count: u64) -> bool {
        let total = self.total();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(count).filter(|&after| after <= total)
            })
            .is_ok()
    }

    /// Slots in use now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Counts `count` more slots in use, whatever the total.
    fn take_regardless(&self, count: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_add(count))
            });
    }

    /// `max_request`: the larger of the total and the ceiling, `None`
    /// while both are zero.
    #[inline]
    pub(crate) fn bound(&self) -> Option<u64> {
        let bound = self.total().max(self.ceiling.load(Ordering::Acquire));
        (bound > 0).then_some(bound)
    }

    /// `return_grant` of units that are held: `false` (and nothing
    /// returned) for a return of more than is held, which `return_grant`
    /// reports.
    #[inline]
    pub(crate) fn give_back_held(&self, count: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_sub(count)
            })
            .is_ok()
    }
}

impl Granter for SlotGranter {
    type State = SlotState;
    type Snapshot = SlotSnapshot;

    fn initial_state(&self) -> SlotState {
        SlotState::default()
    }

    fn try_get(&self, _state: &mut SlotState, count: u64) -> bool {
        if self.take_within_total(count) {
            return true;
        }
        // Past the total, or past what a count can hold.
        if self.is_enforcing() || self.used().checked_add(count).is_none() {
            return false;
        }
        self.take_regardless(count);
        if !self.overrun.swap(true, Ordering::AcqRel) {
            if let Some(OverrunAlarm(alarm)) = self.overrun_alarm.get() {
                alarm();
            }
        }
        true
    }

    fn return_grant(&self, _state: &mut SlotState, count: u64) {
        if self.give_back_held(count) {
            return;
        }
        // A bug in the caller, not bad input: say so loudly, and keep the
        // count at zero rather than wrapping and admitting nothing.
        let before = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(count))
            })
            .unwrap_or_else(|used| used);
        tracing::error!(
            count,
            used = before,
            "slot granter: more slots returned than were held"
        );
    }

    fn took_without_permission(&self, _state: &mut SlotState, count: u64) {
        self.take_regardless(count);
    }

    fn snapshot(&self, _state: &SlotState) -> SlotSnapshot {
        SlotSnapshot {
            used: self.used(),
            total: self.total(),
        }
    }

    fn capacity(&self, _state: &SlotState) -> Option<u64> {
        Some(self.total())
    }

    /// The larger of the total and the ceiling; none while both are zero:
    /// a total of zero pauses admission (everyone waits for it to be
    /// raised) rather than refusing everything.
    fn max_request(&self, _state: &SlotState) -> Option<u64> {
        self.bound()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{StdArc, StdAtomicU64};

    fn slots(total: u64) -> (SlotGranter, SlotState) {
        let granter = SlotGranter::new(total).unwrap();
        let state = granter.initial_state();
        (granter, state)
    }

    #[test]
    fn try_get_stops_at_the_total_and_return_reopens_it() {
        let (slots, mut state) = slots(2);
        assert!(slots.try_get(&mut state, 1));
        assert!(slots.try_get(&mut state, 1));
        assert!(!slots.try_get(&mut state, 1));
        slots.return_grant(&mut state, 1);
        assert!(slots.try_get(&mut state, 1));
        assert_eq!(slots.snapshot(&state), SlotSnapshot { used: 2, total: 2 });
    }

    #[test]
    fn lowering_the_total_revokes_nothing() {
        let (slots, mut state) = slots(3);
        for _ in 0..3 {
            assert!(slots.try_get(&mut state, 1));
        }
        slots.set_total(1).unwrap();
        assert_eq!(slots.snapshot(&state).used, 3);
        slots.return_grant(&mut state, 1);
        assert!(
            !slots.try_get(&mut state, 1),
            "2 used of 1: still over the total"
        );
        slots.return_grant(&mut state, 2);
        assert!(slots.try_get(&mut state, 1));
    }

    #[test]
    fn bypass_may_push_used_past_the_total() {
        let (slots, mut state) = slots(1);
        slots.took_without_permission(&mut state, 2);
        assert_eq!(slots.snapshot(&state), SlotSnapshot { used: 2, total: 1 });
        assert!(!slots.try_get(&mut state, 1));
    }

    #[test]
    fn without_enforcement_every_try_get_succeeds_and_is_counted() {
        let (slots, mut state) = slots(1);
        slots.set_enforcing(false);
        assert!(slots.try_get(&mut state, 1));
        assert!(slots.try_get(&mut state, 1));
        assert_eq!(slots.snapshot(&state), SlotSnapshot { used: 2, total: 1 });
        slots.set_enforcing(true);
        assert!(!slots.try_get(&mut state, 1));
    }

    #[test]
    fn the_first_grant_past_the_total_while_not_enforcing_rings_the_alarm_once() {
        let (slots, mut state) = slots(1);
        let rung = StdArc::new(StdAtomicU64::new(0));
        let counter = rung.clone();
        slots.set_overrun_alarm(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        // Within the total, or refused while enforcing: no overrun.
        assert!(slots.try_get(&mut state, 1));
        assert!(!slots.try_get(&mut state, 1));
        assert!(!slots.take_overrun());
        slots.set_enforcing(false);
        for _ in 0..3 {
            assert!(slots.try_get(&mut state, 1));
        }
        assert_eq!(rung.load(Ordering::Relaxed), 1, "rung once per mark");
        assert!(slots.take_overrun());
        assert!(!slots.take_overrun(), "reading clears the mark");
        assert!(slots.try_get(&mut state, 1));
        assert_eq!(rung.load(Ordering::Relaxed), 2, "cleared: armed again");
        assert_eq!(slots.snapshot(&state).used, 5, "every grant counted");
    }

    #[test]
    fn an_excess_return_clamps_at_zero() {
        let (slots, mut state) = slots(1);
        slots.return_grant(&mut state, 1);
        assert_eq!(slots.snapshot(&state).used, 0);
        assert!(slots.try_get(&mut state, 1));
    }

    #[test]
    fn totals_above_the_maximum_are_rejected_naming_the_field() {
        let err = SlotGranter::new(SlotGranter::MAX_TOTAL + 1).unwrap_err();
        assert_eq!(err.field(), "total_slots");
        let (slots, _) = slots(1);
        assert!(slots.set_total(u64::MAX).is_err());
        assert_eq!(slots.total(), 1);
    }
}
