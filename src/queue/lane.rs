//! The lane: admission and release without the queue's lock while nobody
//! waits.
//!
//! # The protocol
//!
//! Under the lock, an admission that nobody waited for and that the lock
//! path would have booked in the plain way (see `QueueState::lane_for`)
//! *opens* the lane for its tenant and priority; its own release is then
//! counted on the lane (its admission is in the books already), or it would
//! close the lane as it took the lock. While it is open, a
//! request of that tenant and priority for one slot is admitted by two
//! atomic steps and no lock: a slot from the slot granter's atomic count
//! (`SlotGranter::take_within_total`), then one more admission in the
//! lane's word. Its permit gives the slot back the same way: the slot to
//! the granter first, then one more release in the word. What the lock
//! path books per admission (the tenant's usage, the priority's counters
//! and level, work in flight, completions) is booked for all of them at
//! once when the lock is next taken: every critical section begins by
//! *closing* the lane (one swap of the word) and folding its counts into
//! the queue's state (`QueueState::fold_lane`), so whatever runs under the
//! lock, a snapshot included, sees the books as if every admission had
//! taken the lock.
//!
//! The word packs, from the top: a closed bit; the lane's generation (31
//! bits), which every opening moves on; admissions and releases since it
//! opened (16 bits each). A step on the lane is a compare-and-swap of the
//! whole word, so it lands only on the opening it read:
//!
//! * **Admission.** Read the word (open, room in the counter); read the
//!   tenant and priority the lane is open for; take a slot; add one
//!   admission to the word it read. The tenant and priority are written
//!   before the word that opens the lane (release) and read after it
//!   (acquire); an opening after the read changes the word, so the swap
//!   fails, and the request books, under the lock, the slot it took (or
//!   gives it back, if someone waits by then, and queues in order). A
//!   request that finds no slot free takes the lock path, which queues it.
//! * **Release.** Give the slot back; add one release to the word, if it is
//!   still the opening the permit was admitted on. Otherwise the lane was
//!   folded since, the admission is in the queue's books, and the release
//!   books itself under the lock as any release does, the grant to a
//!   waiter included. The slot goes back before the word is looked at: a
//!   release whose swap succeeds saw the lane open, so no request had
//!   queued yet (queueing takes the lock, which closes the lane first), and
//!   every later one finds the slot free.
//! * **Closing** sets the closed bit and returns the counts: the books
//!   then owe exactly the admissions and releases that landed on this
//!   opening; work in flight moves by their difference (the opening
//!   admission's release can be among them, its admission never).
//!
//! Nobody waits while the lane is open: a request that would wait takes the
//! lock, which closes it, and it opens again only from an admission under
//! the lock with nobody waiting. So no admission on the lane overtakes a
//! waiter, and no release on it owes a waiter a grant.
//!
//! A generation comes round again after 2^31 openings; a permit held
//! across all of them would book its release on an opening it was not
//! admitted on, which leaves the count of work in flight one out until the
//! queue next idles. The slot count, which decides admission, is exact
//! whatever happens here: it lives in the granter.

use crate::sync::{AtomicU64, Ordering};
use crate::work::{Priority, TenantId};

const CLOSED: u64 = 1 << 63;
const GENERATION_SHIFT: u32 = 32;
const GENERATION_MASK: u64 = (1 << 31) - 1;
const RELEASED_SHIFT: u32 = 16;
const COUNT_MASK: u64 = (1 << 16) - 1;

fn generation_of(word: u64) -> u32 {
    ((word >> GENERATION_SHIFT) & GENERATION_MASK) as u32
}

fn admitted_of(word: u64) -> u64 {
    word & COUNT_MASK
}

fn released_of(word: u64) -> u64 {
    (word >> RELEASED_SHIFT) & COUNT_MASK
}

/// The counts an opening collected, taken by [`Lane::close`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaneCounts {
    pub(crate) admitted: u64,
    pub(crate) released: u64,
}

/// What [`Lane::try_admit`] came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LaneAdmit {
    /// Admitted on the opening of this generation (never zero).
    Admitted(u32),
    /// Not for the lane (closed, another tenant or priority, no slot
    /// free): nothing was taken.
    Declined,
    /// A slot was taken but the lane closed before the admission was
    /// counted: the request holds the slot and books it under the lock.
    HoldsSlot,
}

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Lane {
    word: AtomicU64,
    tenant: AtomicU64,
    /// The priority's byte.
    priority: AtomicU64,
}

impl Lane {
    pub(crate) fn new() -> Self {
        Lane {
            word: AtomicU64::new(CLOSED),
            tenant: AtomicU64::new(0),
            priority: AtomicU64::new(0),
        }
    }

    /// Admits a request of `tenant` at `priority` for one slot, taking the
    /// slot with `take_slot` once the lane is open for them.
    #[inline]
    pub(crate) fn try_admit(
        &self,
        tenant: TenantId,
        priority: Priority,
        take_slot: impl FnOnce() -> bool,
    ) -> LaneAdmit {
        let mut word = self.word.load(Ordering::Acquire);
        if word & CLOSED != 0 || admitted_of(word) == COUNT_MASK {
            return LaneAdmit::Declined;
        }
        if self.tenant.load(Ordering::Acquire) != tenant.get()
            || self.priority.load(Ordering::Acquire) != u64::from(priority.get() as u8)
        {
            return LaneAdmit::Declined;
        }
        if !take_slot() {
            return LaneAdmit::Declined;
        }
        let generation = generation_of(word);
        loop {
            match self.word.compare_exchange_weak(
                word,
                word + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return LaneAdmit::Admitted(generation),
                Err(now) => {
                    // Another step on the same opening moved the counts:
                    // try again on it. A close or a new opening: the lock.
                    if now & CLOSED != 0
                        || generation_of(now) != generation
                        || admitted_of(now) == COUNT_MASK
                    {
                        return LaneAdmit::HoldsSlot;
                    }
                    word = now;
                }
            }
        }
    }

    /// Books the release of a permit admitted on the opening of
    /// `generation`, whose slot has gone back to the granter: `false` when
    /// that opening is closed (the release then books under the lock).
    #[inline]
    pub(crate) fn try_release(&self, generation: u32) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if word & CLOSED != 0
                || generation_of(word) != generation
                || released_of(word) == COUNT_MASK
            {
                return false;
            }
            match self.word.compare_exchange_weak(
                word,
                word + (1 << RELEASED_SHIFT),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// Closes the lane, with what its opening collected; `None` if it was
    /// closed already. Under the queue's lock.
    #[inline]
    pub(crate) fn close(&self) -> Option<LaneCounts> {
        if self.word.load(Ordering::Acquire) & CLOSED != 0 {
            return None;
        }
        self.close_open()
    }

    #[cold]
    fn close_open(&self) -> Option<LaneCounts> {
        let generation_bits = u64::from(GENERATION_MASK as u32) << GENERATION_SHIFT;
        // Only the lock holder opens or closes, so the generation stays;
        // the swap takes whatever counts landed up to it.
        let before = self.word.fetch_or(CLOSED, Ordering::AcqRel);
        if before & CLOSED != 0 {
            return None;
        }
        self.word
            .store(CLOSED | (before & generation_bits), Ordering::Release);
        Some(LaneCounts {
            admitted: admitted_of(before),
            released: released_of(before),
        })
    }

    /// Opens the lane for `tenant` at `priority`, on a new generation,
    /// which it returns. Under the queue's lock, with the lane closed.
    pub(crate) fn open(&self, tenant: TenantId, priority: Priority) -> u32 {
        let word = self.word.load(Ordering::Acquire);
        debug_assert!(word & CLOSED != 0, "opened while open");
        let generation = match generation_of(word) {
            g if g >= GENERATION_MASK as u32 => 1,
            g => g + 1,
        };
        self.tenant.store(tenant.get(), Ordering::Release);
        self.priority
            .store(u64::from(priority.get() as u8), Ordering::Release);
        self.word
            .store(u64::from(generation) << GENERATION_SHIFT, Ordering::Release);
        generation
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn open_lane() -> (Lane, u32) {
        let lane = Lane::new();
        let generation = lane.open(TenantId::new(7), Priority::NORMAL);
        (lane, generation)
    }

    #[test]
    fn a_closed_lane_declines_and_takes_nothing() {
        let lane = Lane::new();
        let outcome = lane.try_admit(TenantId::new(7), Priority::NORMAL, || {
            panic!("no slot is taken for a closed lane")
        });
        assert_eq!(outcome, LaneAdmit::Declined);
        assert_eq!(lane.close(), None);
    }

    #[test]
    fn only_the_tenant_and_priority_it_opened_for_take_the_lane() {
        let (lane, _) = open_lane();
        let never = || -> bool { panic!("no slot is taken for another request") };
        assert_eq!(
            lane.try_admit(TenantId::new(8), Priority::NORMAL, never),
            LaneAdmit::Declined
        );
        assert_eq!(
            lane.try_admit(TenantId::new(7), Priority::HIGH, never),
            LaneAdmit::Declined
        );
        assert_eq!(
            lane.close(),
            Some(LaneCounts {
                admitted: 0,
                released: 0
            })
        );
    }

    #[test]
    fn no_free_slot_declines() {
        let (lane, _) = open_lane();
        assert_eq!(
            lane.try_admit(TenantId::new(7), Priority::NORMAL, || false),
            LaneAdmit::Declined
        );
    }

    #[test]
    fn closing_returns_the_counts_of_its_opening_and_releases_of_older_ones_go_the_lock_way() {
        let (lane, first) = open_lane();
        for _ in 0..3 {
            assert_eq!(
                lane.try_admit(TenantId::new(7), Priority::NORMAL, || true),
                LaneAdmit::Admitted(first)
            );
        }
        assert!(lane.try_release(first));
        assert_eq!(
            lane.close(),
            Some(LaneCounts {
                admitted: 3,
                released: 1
            })
        );
        assert!(!lane.try_release(first), "closed");
        let second = lane.open(TenantId::new(7), Priority::NORMAL);
        assert_ne!(first, second);
        assert!(!lane.try_release(first), "an older opening");
    }

    #[test]
    fn a_full_counter_sends_the_request_to_the_lock() {
        let (lane, generation) = open_lane();
        for _ in 0..COUNT_MASK {
            assert_eq!(
                lane.try_admit(TenantId::new(7), Priority::NORMAL, || true),
                LaneAdmit::Admitted(generation)
            );
        }
        assert_eq!(
            lane.try_admit(TenantId::new(7), Priority::NORMAL, || panic!("full")),
            LaneAdmit::Declined
        );
        for _ in 0..COUNT_MASK {
            assert!(lane.try_release(generation));
        }
        assert!(!lane.try_release(generation), "the release counter is full");
        assert_eq!(
            lane.close(),
            Some(LaneCounts {
                admitted: COUNT_MASK,
                released: COUNT_MASK
            })
        );
    }

    #[test]
    fn generations_skip_zero_when_they_come_round() {
        let lane = Lane::new();
        lane.word.store(
            CLOSED | (u64::from(GENERATION_MASK as u32) << GENERATION_SHIFT),
            Ordering::Relaxed,
        );
        assert_eq!(lane.open(TenantId::new(1), Priority::NORMAL), 1);
    }
}

#[cfg(all(test, not(loom)))]
mod queue_tests {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::{SlotPermit, WorkInfo, WorkQueue};

    fn admit(queue: &WorkQueue, tenant: u64) -> SlotPermit {
        let mut admit =
            Box::pin(queue.admit(WorkInfo::new(TenantId::new(tenant), Priority::NORMAL)));
        match admit.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("expected a permit at once, got {other:?}"),
        }
    }

    fn admitted_on_lane(queue: &WorkQueue) -> u64 {
        admitted_of(queue.shared.lane.word.load(Ordering::Relaxed))
    }

    #[test]
    fn work_in_flight_counts_what_the_lane_admitted_and_released() {
        let queue = WorkQueue::new(8).unwrap();
        let opener = admit(&queue, 7);
        let mut on_lane: Vec<_> = (0..3).map(|_| admit(&queue, 7)).collect();
        assert_eq!(admitted_on_lane(&queue), 3, "taken without the lock");
        drop(on_lane.pop());
        assert_eq!(queue.load().in_flight, 3);
        assert_eq!(queue.snapshot().granter.used, 3);
        // The lane reopens at the next admission under the lock.
        on_lane.push(admit(&queue, 7));
        on_lane.push(admit(&queue, 7));
        assert_eq!(admitted_on_lane(&queue), 1);
        drop(opener);
        drop(on_lane);
        assert_eq!(queue.load().in_flight, 0);
        let snapshot = queue.snapshot();
        assert_eq!(snapshot.granter.used, 0);
        assert_eq!(snapshot.tenant(TenantId::new(7)).unwrap().used, 6);
        let normal = snapshot.priority(Priority::NORMAL).unwrap();
        assert_eq!((normal.requested, normal.admitted), (6, 6));
    }

    #[test]
    fn another_tenant_or_priority_takes_the_lock_and_a_waiter_closes_the_lane() {
        let queue = WorkQueue::new(1).unwrap();
        drop(admit(&queue, 7));
        let held = admit(&queue, 7);
        assert_eq!(admitted_on_lane(&queue), 1);
        // Another tenant finds no slot: it queues, under the lock, which
        // closes the lane; the release then goes the lock's way and grants it.
        let mut waiting = Box::pin(queue.admit(WorkInfo::new(TenantId::new(8), Priority::NORMAL)));
        let mut context = Context::from_waker(Waker::noop());
        assert!(waiting.as_mut().poll(&mut context).is_pending());
        assert_ne!(queue.shared.lane.word.load(Ordering::Relaxed) & CLOSED, 0);
        drop(held);
        assert!(matches!(
            waiting.as_mut().poll(&mut context),
            Poll::Ready(Ok(_))
        ));
        assert_eq!(queue.snapshot().granter.used, 0);
    }

    #[test]
    fn a_controller_like_queue_never_opens_the_lane() {
        // Timed holds (early rejection here) are booked one by one.
        let queue = WorkQueue::builder()
            .total_slots(4)
            .early_rejection(true)
            .build()
            .unwrap();
        drop(admit(&queue, 7));
        let _held = admit(&queue, 7);
        assert_ne!(queue.shared.lane.word.load(Ordering::Relaxed) & CLOSED, 0);
    }
}
