//! Grants: the two small interfaces that separate *who wants to run* from
//! *what is free*, and the granters that implement the second.
//!
//! A [`Requester`] (the [`WorkQueue`](crate::WorkQueue)) holds waiting work in
//! order; a [`Granter`] owns one resource's capacity. The queue asks the
//! granter for capacity on the uncontended fast path ([`Granter::try_get`]),
//! hands grants to its waiters in order when capacity frees, gives capacity
//! back ([`Granter::return_grant`]) and reports work it let in without asking
//! ([`Granter::took_without_permission`]). Adding a resource to admission
//! control means writing a granter, not a scheduler: the ordering, fairness,
//! cancellation and deadline machinery stay in the queue.
//!
//! # Who calls whom, under which lock
//!
//! A granter's mutable accounting (slots in use, a token balance) is its
//! [`Granter::State`], and the queue keeps that state **inside its own
//! lock**: every method that reads or changes it receives `&mut State` and so
//! can only run while the queue's lock is held. That lock is the single
//! serialization point between "a waiter enqueues because `try_get` failed"
//! and "capacity comes back and the first waiter is granted", so a wake-up
//! cannot be lost between the two, and the accounting needs no atomics of
//! its own. It also makes a granter a leaf by construction: it cannot block
//! on or call back into a queue. The one exception is the
//! [`TokenGranter`], whose regular and elastic queues share one
//! bucket: the bucket has a small lock of its own, taken only
//! inside a queue's lock and never held across a call, so it stays a leaf.
//!
//! Capacity that appears from outside the queue (a raised slot total, a token
//! refill) reaches waiters through [`Requester::granted`], which the code that
//! raised the capacity calls afterwards; it takes the queue's lock and grants
//! waiters in order for as long as the granter says yes. Upstream
//! (CockroachDB) the granter reserves a unit and pushes it into `granted`;
//! here the requester pulls, which keeps every grant decision under one lock.
//! Settings that change from outside (the slot total) live in the granter
//! itself, in atomics, where the queue's methods read them.
//!
//! # Writing a granter
//!
//! ```
//! use admission::grant::Granter;
//! use admission::{Priority, TenantId, WorkInfo, WorkQueue};
//!
//! /// Admits at most `budget` pieces of work, ever: a toy one-shot token pool.
//! #[derive(Debug)]
//! struct Budget(u64);
//!
//! impl Granter for Budget {
//!     type State = u64; // units left
//!     type Snapshot = u64;
//!     fn initial_state(&self) -> u64 {
//!         self.0
//!     }
//!     fn try_get(&self, left: &mut u64, count: u64) -> bool {
//!         match left.checked_sub(count) {
//!             Some(after) => {
//!                 *left = after;
//!                 true
//!             }
//!             None => false,
//!         }
//!     }
//!     fn return_grant(&self, _left: &mut u64, _count: u64) {} // consumed for good
//!     fn took_without_permission(&self, left: &mut u64, count: u64) {
//!         *left = left.saturating_sub(count);
//!     }
//!     fn snapshot(&self, left: &u64) -> u64 {
//!         *left
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let queue = WorkQueue::builder().build_with(Budget(1)).unwrap();
//! let first = queue.admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)).await;
//! assert!(first.is_ok());
//! assert_eq!(queue.snapshot().granter, 0);
//! # });
//! ```

mod slot;
mod token;

#[cfg(loom)]
#[doc(hidden)]
pub mod loom_models;

pub use slot::{SlotGranter, SlotSnapshot, SlotState};
pub use token::{TokenClass, TokenGranter, TokenSnapshot, TokenState};

use std::any::Any;
use std::fmt::Debug;

use crate::health::Boundary;

/// Owns the capacity of one resource and decides whether work may have some.
///
/// See the [module documentation](self) for the calling convention: the
/// methods that take the [`State`](Granter::State) run with the owning
/// queue's lock held, and must not block. Counts are in the granter's own
/// unit (one slot, a number of bytes...).
pub trait Granter: Debug + Send + Sync + 'static {
    /// The granter's mutable accounting, kept inside the queue's lock.
    type State: Debug + Send + 'static;

    /// What [`snapshot`](Granter::snapshot) reports, for observability.
    type Snapshot: Clone + Debug + Send + Sync + 'static;

    /// The state a new queue starts with.
    fn initial_state(&self) -> Self::State;

    /// Takes `count` units if they are available now. The fast path, and the
    /// question the queue asks before every grant to a waiter.
    fn try_get(&self, state: &mut Self::State, count: u64) -> bool;

    /// Gives back `count` units: a slot after its work completed, or a grant
    /// that was made to a waiter that went away before it could use it.
    fn return_grant(&self, state: &mut Self::State, count: u64);

    /// Takes back `count` units granted to a waiter that went away before
    /// it saw the grant: the work never ran. Defaults to
    /// [`return_grant`](Granter::return_grant); a granter whose units are
    /// consumed at admission (tokens) credits them back here.
    fn cancel_grant(&self, state: &mut Self::State, count: u64) {
        self.return_grant(state, count)
    }

    /// Records `count` units taken without asking, by work that bypasses
    /// admission. Capacity in use may exceed the limit as a result.
    fn took_without_permission(&self, state: &mut Self::State, count: u64);

    /// The granter's current state, for snapshots and metrics.
    ///
    /// The one method not behind the queue's panic boundary: it is called
    /// only from the caller's own [`WorkQueue::snapshot`](crate::WorkQueue::snapshot)
    /// or [`granter_snapshot`](crate::WorkQueue::granter_snapshot), which
    /// must return a value. A panic here reaches that caller; the queue's
    /// lock is released and nothing in it was half-changed.
    fn snapshot(&self, state: &Self::State) -> Self::Snapshot;

    /// The total capacity, for queue policies that reserve a share of it
    /// (the elastic share). `None`, the default, when there is no such
    /// total; those policies then do not apply.
    fn capacity(&self, state: &Self::State) -> Option<u64> {
        let _ = state;
        None
    }

    /// The most units one request could ever be granted, as the granter's
    /// limits stand now. A request for more that would have to wait is
    /// refused at once with [`AdmitError::NeverFits`](crate::AdmitError::NeverFits)
    /// instead of waiting forever in front of everyone else (grants are
    /// made in strict order), and a waiter left asking for more when the
    /// limit drops fails the same way. `None`, the default, when any request
    /// can be granted eventually (tokens, which may go into debt).
    fn max_request(&self, state: &Self::State) -> Option<u64> {
        let _ = state;
        None
    }
}

/// Holds waiting work and hands capacity to it in order.
///
/// Implemented by [`WorkQueue`](crate::WorkQueue). Code that adds capacity to
/// a granter from outside the queue (raising a slot total, refilling tokens)
/// calls [`granted`](Requester::granted) afterwards so that waiters see it.
pub trait Requester {
    /// Whether any request is waiting for a grant.
    fn has_waiting_requests(&self) -> bool;

    /// Capacity may have become available: grant waiting requests, in order,
    /// for as long as the granter allows. Returns the units consumed; 0 means
    /// the offer was refused (nobody was waiting, or the granter had nothing
    /// to give after all).
    fn granted(&self) -> u64;
}

/// A granter together with its state, borrowed under the queue's lock, and
/// the panic boundary every call into the granter goes through.
///
/// A custom granter is user code called under the queue's lock. A panic in
/// it is caught here (see [`health`](crate::health)) and answered so that
/// the queue can never wedge on it and no capacity is lost to it:
///
/// * a panicking `try_get` admits, unaccounted (the queue fails open: a
///   granter that always panics leaves the service running without
///   admission control, loudly, rather than stopping it); the units of an
///   unaccounted admission are never returned to a granter that never
///   counted them;
/// * a panicking `return_grant` or `cancel_grant` is owed: retried as a
///   `return_grant` before the next take, so a transient panic loses no
///   slot (a granter whose cancel credits more than its return, as tokens
///   do, keeps the smaller amount: a credit lost, never capacity made up);
/// * a panicking `took_without_permission` leaves the bypass unaccounted;
/// * a panicking `capacity` or `max_request` means no bound.
///
/// The queue's own state is never half-changed around these calls.
#[derive(Debug)]
pub(crate) struct Grants<'a, G: Granter> {
    pub(crate) granter: &'a G,
    pub(crate) state: &'a mut G::State,
    pub(crate) boundary: &'a Boundary,
    /// Units whose return panicked, to be returned before the next take.
    pub(crate) owed: &'a mut u64,
}

/// The crate's own slot granter, when `G` is it: the admission and the
/// release that every request makes, and the bounds a queued request is
/// checked against, are then plain arithmetic that calls no foreign code,
/// taken without the panic boundary's indirect call. Whatever else it does
/// (an overrun alarm, a return of more than was held, which logs) still
/// goes through the boundary. `G` is known at compile time, so for every
/// other granter this folds away.
#[inline]
pub(crate) fn as_slots<G: Granter>(granter: &G) -> Option<&SlotGranter> {
    (granter as &dyn Any).downcast_ref()
}

impl<G: Granter> Grants<'_, G> {
    /// Takes `count` units: `None` if the granter refused, else whether the
    /// granter counted them (`false` when it panicked and the queue failed
    /// open).
    #[inline]
    pub(crate) fn try_get(&mut self, count: u64) -> Option<bool> {
        self.settle_owed();
        if let Some(slots) = as_slots(self.granter) {
            if slots.take_within_total(count) {
                return Some(true);
            }
        }
        self.try_get_guarded(count)
    }

    /// [`try_get`](Self::try_get) through the panic boundary: out of line,
    /// so that the slot granter's common case above pays no set-up for it.
    #[inline(never)]
    fn try_get_guarded(&mut self, count: u64) -> Option<bool> {
        let (granter, state) = (self.granter, &mut *self.state);
        match self.boundary.call(|| granter.try_get(state, count)) {
            Some(true) => Some(true),
            Some(false) => None,
            None => Some(false),
        }
    }

    #[inline]
    pub(crate) fn return_grant(&mut self, count: u64) {
        if let Some(slots) = as_slots(self.granter) {
            if slots.give_back_held(count) {
                return;
            }
        }
        self.return_grant_guarded(count);
    }

    /// [`return_grant`](Self::return_grant) through the panic boundary,
    /// out of line as `try_get_guarded` is.
    #[inline(never)]
    fn return_grant_guarded(&mut self, count: u64) {
        let (granter, state) = (self.granter, &mut *self.state);
        if self
            .boundary
            .call(|| granter.return_grant(state, count))
            .is_none()
        {
            *self.owed = self.owed.saturating_add(count);
        }
    }

    pub(crate) fn cancel_grant(&mut self, count: u64) {
        let (granter, state) = (self.granter, &mut *self.state);
        if self
            .boundary
            .call(|| granter.cancel_grant(state, count))
            .is_none()
        {
            *self.owed = self.owed.saturating_add(count);
        }
    }

    /// Records a bypass; whether the granter counted it.
    pub(crate) fn took_without_permission(&mut self, count: u64) -> bool {
        let (granter, state) = (self.granter, &mut *self.state);
        self.boundary
            .call(|| granter.took_without_permission(state, count))
            .is_some()
    }

    #[inline]
    pub(crate) fn capacity(&self) -> Option<u64> {
        let (granter, state) = (self.granter, &*self.state);
        if let Some(slots) = as_slots(granter) {
            return Some(slots.total());
        }
        self.boundary.call(|| granter.capacity(state)).flatten()
    }

    #[inline]
    pub(crate) fn max_request(&self) -> Option<u64> {
        let (granter, state) = (self.granter, &*self.state);
        if let Some(slots) = as_slots(granter) {
            return slots.bound();
        }
        self.boundary.call(|| granter.max_request(state)).flatten()
    }

    /// Retries returns that panicked; they stay owed while they panic.
    #[inline]
    fn settle_owed(&mut self) {
        if *self.owed == 0 {
            return;
        }
        let (granter, state, owed) = (self.granter, &mut *self.state, *self.owed);
        if self
            .boundary
            .call(|| granter.return_grant(state, owed))
            .is_some()
        {
            *self.owed = 0;
        }
    }
}
