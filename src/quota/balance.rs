//! A tenant's local balance: the units at hand in one atomic word, and a
//! token queue for the requests that have to wait for more.
//!
//! # Implementation notes
//!
//! A request of a tenant whose node holds a lease nearly always finds
//! units at hand, and then there is nothing to order: nobody waits. It
//! takes its units from `ready` with one compare-and-swap, without the
//! token queue's lock. Only a request that finds too few goes to the
//! queue, where it waits in priority order within its deadline.
//!
//! Units sit in one of two places, `ready` or the queue's bucket, and the
//! balance is their sum (read under the queue's lock, so a move between
//! the two is never counted twice). Units that arrive (a lease, the
//! fallback trickle, a refund) go to `ready`, unless somebody may be
//! waiting in the queue. The handshake that loses no waiter:
//!
//! - a request bound for the queue first counts itself in `queued`, then
//!   moves what `ready` holds into the queue (under the queue's lock),
//!   then enters the queue, and stays counted until it leaves it;
//! - an arrival, under the queue's lock, goes to the queue with whatever
//!   `ready` holds if `queued` is not zero (or the bucket is in debt), and
//!   to `ready` otherwise.
//!
//! The request's count comes before its move takes the lock, so either
//! the move comes after the arrival and takes the arrival's units, or the
//! arrival comes after the move and sees the count. Units moved before
//! the request enters the queue are there for its first attempt; units
//! that arrive after it are granted to it as the queue grants any refill.
//! While anybody is counted `ready` stays empty, and the fast path stands
//! aside besides, so it takes no units ahead of waiters.
//!
//! **Debt** (a charge beyond the units at hand) is kept in the queue's
//! bucket. A charge, under the queue's lock, takes from `ready` first and
//! writes the rest as debt; an arrival that finds debt pays it in the
//! queue. So units at hand never sit beside debt they should pay. (The
//! queue admits a request while its bucket is positive, whatever the
//! request's size, leaving debt; the fast path takes only what `ready`
//! covers and leaves the rest to the queue.)
//!
//! **Closing.** The queue closes first, under its lock, and `ready` is then
//! marked closed in its top bit. A move, an arrival or a charge happened
//! before the close (and the balance counts it) or changes nothing, and a
//! take after the mark fails (its request finds the queue closed and
//! looks its tenant up again). So the balance read after closing is exact:
//! nothing it counts is spent, nothing spent is counted. Units that arrive
//! later are lost to the fleet, never doubled.

use crate::error::ConfigError;
use crate::grant::TokenGranter;
use crate::queue::{WorkQueue, WorkQueueBuilder};
use crate::sync::{AtomicU64, Ordering};

/// `ready`'s top bit: the balance is closed.
const CLOSED: u64 = 1 << 63;

/// A tenant's units on this node, and the requests waiting for them.
#[derive(Debug)]
pub(crate) struct LocalBalance {
    /// Units at hand outside the queue, with [`CLOSED`] as its top bit.
    ready: AtomicU64,
    /// Requests on their way into, or waiting in, the queue.
    queued: AtomicU64,
    queue: WorkQueue<TokenGranter>,
    /// The most the balance banks.
    burst: u64,
}

impl LocalBalance {
    /// An empty balance banking at most `burst`, whose waiters wait in a
    /// token queue built by `builder`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `burst` if it is zero, or the builder's.
    pub(crate) fn build(builder: WorkQueueBuilder, burst: u64) -> Result<Self, ConfigError> {
        let queue = builder.build_with(TokenGranter::new(burst)?)?;
        queue.set_token_limit(Some(burst))?;
        Ok(LocalBalance {
            ready: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            queue,
            // Below the closed bit, however large the quota's burst.
            burst: burst.min(CLOSED - 1),
        })
    }

    /// The queue a request waits in, once [`enter_queue`](Self::enter_queue)
    /// counted it.
    pub(crate) fn queue(&self) -> &WorkQueue<TokenGranter> {
        &self.queue
    }

    /// Takes `units` from the units at hand: `false` if there are too
    /// few, somebody waits, or the balance is closed (the request then
    /// goes to the queue).
    pub(crate) fn try_take(&self, units: u64) -> bool {
        if self.queued.load(Ordering::Relaxed) != 0 {
            return false;
        }
        let mut ready = self.ready.load(Ordering::Acquire);
        loop {
            if ready & CLOSED != 0 || ready < units {
                return false;
            }
            match self.ready.compare_exchange(
                ready,
                ready - units,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => ready = now,
            }
        }
    }

    /// Counts a request bound for the queue and moves the units at hand
    /// into it; [`leave_queue`](Self::leave_queue) once it has left.
    pub(crate) fn enter_queue(&self) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.absorb();
    }

    /// A request counted by [`enter_queue`](Self::enter_queue) left the
    /// queue (granted, refused, or dropped).
    pub(crate) fn leave_queue(&self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }

    /// Adds `units` (a lease, the trickle, a refund), up to the burst,
    /// paying debt first and granting the waiters they cover. A closed
    /// balance takes nothing.
    pub(crate) fn credit(&self, units: u64) {
        self.queue.with_tokens(|available, closed| {
            if closed || units == 0 {
                return (0, ());
            }
            if available < 0 || self.queued.load(Ordering::SeqCst) != 0 {
                // Debt to pay, or somebody may wait: the queue gets these
                // and the units at hand (debt is paid before the burst
                // caps).
                let units = units.saturating_add(self.take_ready());
                return (i64::try_from(units).unwrap_or(i64::MAX), ());
            }
            let at_hand = self.ready.load(Ordering::Acquire) & !CLOSED;
            let banked = at_hand.saturating_add(available.unsigned_abs());
            // Only this lock's holders add to `ready`, and takes only
            // lower it, so it stays within the burst (and below the bit).
            let added = units.min(self.burst.saturating_sub(banked));
            self.ready.fetch_add(added, Ordering::AcqRel);
            (0, ())
        });
    }

    /// Charges `units` beyond an estimate: from the units at hand first,
    /// the rest as debt in the queue (at most one burst of it). A closed
    /// balance is not charged.
    pub(crate) fn charge(&self, units: u64) {
        self.queue.with_tokens(|_, closed| {
            if closed {
                return (0, ());
            }
            // Under the lock nothing adds to `ready`; a take may still
            // lower it, hence the loop.
            let mut ready = self.ready.load(Ordering::Acquire);
            let taken = loop {
                let taken = (ready & !CLOSED).min(units);
                match self.ready.compare_exchange(
                    ready,
                    ready - taken,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break taken,
                    Err(now) => ready = now,
                }
            };
            let debt = i64::try_from(units - taken).unwrap_or(i64::MAX);
            (-debt, ())
        });
    }

    /// The balance: negative in debt.
    pub(crate) fn balance(&self) -> i64 {
        self.queue.with_tokens(|available, _| {
            let at_hand = self.ready.load(Ordering::Acquire) & !CLOSED;
            (
                0,
                available.saturating_add(i64::try_from(at_hand).unwrap_or(i64::MAX)),
            )
        })
    }

    /// How many requests wait in the queue.
    pub(crate) fn waiting(&self) -> usize {
        self.queue.waiting()
    }

    /// Closes the balance: its waiters are refused as closed, and nothing
    /// more is taken from it or added to it. [`balance`](Self::balance)
    /// then says what it held.
    pub(crate) fn close(&self) {
        self.queue.close();
        self.ready.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// The units at hand and the queue's bucket, read together.
    #[cfg(any(test, loom))]
    pub(crate) fn parts(&self) -> (u64, i64) {
        self.queue.with_tokens(|available, _| {
            (0, (self.ready.load(Ordering::Acquire) & !CLOSED, available))
        })
    }

    /// Moves the units at hand into the queue.
    fn absorb(&self) {
        self.queue.with_tokens(|_, closed| {
            let units = if closed { 0 } else { self.take_ready() };
            (i64::try_from(units).unwrap_or(i64::MAX), ())
        });
    }

    /// Empties `ready`, keeping its closed bit: the units it held.
    fn take_ready(&self) -> u64 {
        self.ready.fetch_and(CLOSED, Ordering::AcqRel) & !CLOSED
    }
}

/// What the unit tests and the loom models drive a balance with.
#[cfg(any(test, loom))]
pub(crate) mod probe {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use super::LocalBalance;
    use crate::grant::TokenGranter;
    use crate::queue::{Admit, Usage, WorkQueueBuilder};
    use crate::{Priority, TenantId, WorkInfo};

    /// An empty balance of `burst`, as a record's.
    pub(crate) fn balance(burst: u64) -> LocalBalance {
        let builder = WorkQueueBuilder::default().usage(Usage::Granted);
        LocalBalance::build(builder, burst).expect("a burst of at least one")
    }

    /// A request for `units` counted and bound for the queue, as
    /// `QuotaAdmit`'s; the caller calls `leave_queue` when done with it.
    pub(crate) fn wait_for(local: &LocalBalance, units: u64) -> Pin<Box<Admit<TokenGranter>>> {
        local.enter_queue();
        let work = WorkInfo::builder()
            .tenant(TenantId::new(7))
            .priority(Priority::NORMAL)
            .requested(units)
            .build();
        Box::pin(local.queue().admit(work))
    }

    /// Polls once: whether it was granted, once ready.
    pub(crate) fn poll(admit: &mut Pin<Box<Admit<TokenGranter>>>) -> Poll<bool> {
        admit
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .map(|granted| granted.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use super::probe::{balance, poll, wait_for};

    #[test]
    fn units_at_hand_are_taken_without_the_queue_and_add_up() {
        let local = balance(100);
        local.credit(10);
        assert!(local.try_take(4));
        assert!(local.try_take(6));
        assert!(!local.try_take(1), "nothing left");
        assert_eq!(local.parts(), (0, 0), "the queue's bucket was never used");
        local.credit(3);
        assert_eq!(local.balance(), 3);
    }

    #[test]
    fn the_burst_caps_the_units_at_hand_and_the_queue_together() {
        let local = balance(10);
        local.credit(6);
        // A request counted and gone: the units at hand moved to the queue.
        local.enter_queue();
        local.leave_queue();
        assert_eq!(local.parts(), (0, 6));
        local.credit(3);
        assert_eq!(local.parts(), (3, 6), "nobody waits: at hand again");
        local.credit(u64::MAX);
        assert_eq!(local.balance(), 10, "no more than a burst in all");
    }

    #[test]
    fn waiters_get_what_arrives_after_them_and_the_fast_path_stands_aside() {
        let local = balance(100);
        let mut first = wait_for(&local, 5);
        assert_eq!(poll(&mut first), Poll::Pending, "nothing yet");
        local.credit(1);
        assert_eq!(
            poll(&mut first),
            Poll::Ready(true),
            "the unit reached the queue"
        );
        assert_eq!(
            local.parts(),
            (0, -4),
            "a positive bucket admits, into debt"
        );
        let mut second = wait_for(&local, 1);
        assert_eq!(poll(&mut second), Poll::Pending);
        local.credit(3);
        assert_eq!(local.parts(), (0, -1), "the debt is paid in the queue");
        assert!(
            !local.try_take(1),
            "nothing at hand while a waiter is counted"
        );
        local.credit(2);
        assert_eq!(poll(&mut second), Poll::Ready(true));
        drop((first, second));
        local.leave_queue();
        local.leave_queue();
        local.credit(4);
        assert!(local.try_take(4), "nobody waits: the units are at hand");
        assert_eq!(local.balance(), 0);
    }

    #[test]
    fn a_request_entering_the_queue_takes_the_units_at_hand_with_it() {
        let local = balance(100);
        local.credit(2);
        assert!(!local.try_take(5), "2 do not cover 5 on the fast path");
        let mut admit = wait_for(&local, 5);
        assert_eq!(local.parts(), (0, 2));
        assert_eq!(
            poll(&mut admit),
            Poll::Ready(true),
            "the queue admits into debt"
        );
        assert_eq!(local.balance(), -3);
    }

    #[test]
    fn a_charge_beyond_the_units_at_hand_is_debt_that_arrivals_pay_first() {
        let local = balance(100);
        local.credit(5);
        local.charge(8);
        assert_eq!(local.parts(), (0, -3), "5 from hand, 3 as debt");
        assert!(!local.try_take(1));
        local.credit(2);
        assert_eq!(local.parts(), (0, -1), "no unit at hand beside debt");
        local.credit(4);
        assert_eq!(local.parts(), (0, 3), "paid, the rest kept in the queue");
        local.charge(1);
        assert_eq!(local.balance(), 2);
    }

    #[test]
    fn a_closed_balance_is_exact_and_changes_no_more() {
        let local = balance(100);
        local.charge(4);
        let mut admit = wait_for(&local, 1);
        assert_eq!(poll(&mut admit), Poll::Pending);
        drop(admit);
        local.leave_queue();
        local.credit(11);
        assert_eq!(local.parts(), (0, 7), "the debt was paid in the queue");
        local.credit(5);
        assert_eq!(local.parts(), (5, 7));
        local.close();
        assert!(!local.try_take(1));
        let mut late = wait_for(&local, 1);
        assert_eq!(poll(&mut late), Poll::Ready(false), "refused as closed");
        drop(late);
        local.leave_queue();
        local.credit(10);
        local.charge(3);
        assert_eq!(local.balance(), 12, "what it held when it closed");
    }
}
