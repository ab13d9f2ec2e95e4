//! One tenant's record: its fair-share standing and its waiting work.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::epoch::{PriorityStates, ALL_FIFO};
use super::order::{OpenKey, Place, Recency, TenantOrder, WaiterKey};
use super::ready::{Entry, ReadyQueue};
use crate::work::{Priority, TenantId, TenantWeight};

/// The usage a tenant starts at when the queue first sees it (with
/// `newcomers_start_behind`): just behind
/// `least`, the least-served tenant that waits now, and zero when none
/// waits.
///
/// Starting at zero would put a newcomer ahead of every tenant that holds
/// anything, so a caller minting a fresh tenant id per request would win
/// most freed slots against a steady tenant. Starting just behind the front
/// of the order (the smallest usage whose ratio to `weight` is strictly
/// above the front's, so ties cannot be won by picking a low id) makes
/// being new worth nothing: the newcomer is served after the tenant that
/// was already owed the next slot, and alternates with it from then on.
/// With nobody waiting there is no one to be unfair to, and the newcomer
/// starts from nothing, as before.
pub(super) fn newcomer_used(least: Option<&TenantOrder>, weight: TenantWeight) -> u64 {
    let Some(least) = least else {
        return 0;
    };
    // `used / weight > least.used / least.weight`, in exact integers: the
    // smallest such `used` is `floor(least.used * weight / least.weight) + 1`.
    let scaled = u128::from(least.used) * u128::from(weight.get()) / u128::from(least.weight);
    u64::try_from(scaled).unwrap_or(u64::MAX).saturating_add(1)
}

/// Where a waiting request is filed in its tenant's record: its
/// [`Place`], and for ready work the entry that finds it in O(1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seat {
    Ready(WaiterKey, Entry),
    Open(OpenKey),
}

#[derive(Debug)]
pub(super) struct Tenant {
    pub(super) weight: TenantWeight,
    /// Capacity charged since the last reset and not yet returned.
    pub(super) used: u64,
    /// When the queue made this record, in records made: ties in the
    /// fair-share order go to the older one.
    since: u64,
    /// Work below this priority is LIFO-marked when it enqueues.
    pub(super) lifo_threshold: i16,
    /// What the current epoch saw, for the next threshold.
    pub(super) states: PriorityStates,
    /// Waiting work that may be granted now, in service order.
    ready: ReadyQueue,
    /// LIFO-marked work whose epoch is still open.
    open: OpenSet,
    /// Waiting requests per priority, in both sets; kept only when early
    /// rejection needs it (`None` otherwise: two tree updates per wait saved).
    waiting_at: Option<BTreeMap<Priority, u32>>,
}

impl Tenant {
    /// A record starting at `used` (see [`newcomer_used`]).
    pub(super) fn new(weight: TenantWeight, count_priorities: bool, used: u64, since: u64) -> Self {
        Tenant {
            weight,
            used,
            since,
            lifo_threshold: ALL_FIFO,
            states: PriorityStates::default(),
            ready: ReadyQueue::default(),
            open: OpenSet::default(),
            waiting_at: count_priorities.then(BTreeMap::new),
        }
    }

    pub(super) fn order(&self, id: TenantId) -> TenantOrder {
        TenantOrder {
            used: self.used,
            weight: self.weight.get(),
            since: self.since,
            id,
        }
    }

    pub(super) fn has_waiters(&self) -> bool {
        !self.ready.is_empty() || !self.open.is_empty()
    }

    pub(super) fn waiting(&self) -> usize {
        self.ready.len() + self.open.len()
    }

    pub(super) fn is_lifo(&self, priority: Priority) -> bool {
        i16::from(priority.get()) < self.lifo_threshold
    }

    /// The slab key of the request to grant next: the first ready work,
    /// unless work of a higher priority waits for its epoch to close.
    ///
    /// An open epoch holds back its work only behind work of its own
    /// priority or above: at its own priority the closed epochs go first,
    /// newest first, which is what epoch-LIFO is for; behind lower
    /// priorities it would be a priority inversion (at the edge of
    /// overload, a priority's work is often all fresh, and lower work that
    /// waited longer would be granted ahead of it).
    pub(super) fn first(&self) -> Option<usize> {
        let Some((open_priority, open)) = self.open.first() else {
            return self.ready.first();
        };
        match self.ready.first_with_priority() {
            Some((ready_priority, ready)) if ready_priority >= open_priority => Some(ready),
            _ => Some(open),
        }
    }

    /// Ready work from the last to be granted to the first, each with how
    /// many of the tenant's ready requests are ahead of it.
    pub(super) fn ready_last_first(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        let last = self.ready.len() as u64;
        self.ready
            .last_first()
            .zip((0..last).rev())
            .map(|(slab_key, ahead)| (ahead, slab_key))
    }

    /// Files the request at `slab_key` at `place`; what it returns finds
    /// it again.
    pub(super) fn insert(&mut self, place: Place, slab_key: usize) -> Seat {
        let (seat, priority) = match place {
            Place::Ready(key) => (
                Seat::Ready(key, self.ready.insert(key, slab_key)),
                key.priority.0,
            ),
            Place::Open(key) => {
                self.open.insert(key, slab_key);
                (Seat::Open(key), key.priority.0)
            }
        };
        if let Some(waiting_at) = &mut self.waiting_at {
            *waiting_at.entry(priority).or_default() += 1;
        }
        seat
    }

    pub(super) fn remove(&mut self, seat: &Seat) {
        let (removed, priority) = match seat {
            Seat::Ready(key, entry) => (self.ready.remove(key, *entry), key.priority.0),
            Seat::Open(key) => (self.open.remove(key), key.priority.0),
        };
        let Some(waiting_at) = self.waiting_at.as_mut().filter(|_| removed) else {
            return;
        };
        if let Some(count) = waiting_at.get_mut(&priority) {
            *count -= 1;
            if *count == 0 {
                waiting_at.remove(&priority);
            }
        }
    }

    /// Requests of this tenant waiting at `priority` or higher: ahead of a
    /// new request at `priority`, whatever their create times. Zero unless
    /// the tenant counts priorities.
    pub(super) fn waiting_at_or_above(&self, priority: Priority) -> u64 {
        self.waiting_at.as_ref().map_or(0, |waiting_at| {
            waiting_at
                .range(priority..)
                .map(|(_, &count)| u64::from(count))
                .sum()
        })
    }

    pub(super) fn clear(&mut self) {
        self.ready.clear();
        self.open.clear();
        if let Some(waiting_at) = &mut self.waiting_at {
            waiting_at.clear();
        }
    }

    /// Moves LIFO-marked work of epochs up to `closed` into the ready set.
    /// Returns each moved request's slab key and new place.
    pub(super) fn close_epochs(&mut self, closed: u64) -> Vec<(usize, Seat)> {
        let mut moved = Vec::new();
        let ready = &mut self.ready;
        self.open.take_closed(closed, |key, slab_key| {
            let key = WaiterKey {
                priority: key.priority,
                recency: Recency::Newest(Reverse(key.create_time)),
                seq: key.seq,
            };
            let entry = ready.insert(key, slab_key);
            moved.push((slab_key, Seat::Ready(key, entry)));
        });
        moved
    }
}

/// LIFO-marked work whose epoch is still open, by priority (highest
/// first) and within a priority in [`OpenKey`] order (oldest epoch first):
/// [`Tenant::first`] compares the highest open priority with the first
/// ready one, and an epoch's close takes a prefix of each priority.
#[derive(Debug, Default)]
struct OpenSet {
    /// No empty inner map: a priority leaves with its last request.
    by_priority: BTreeMap<Reverse<Priority>, BTreeMap<OpenKey, usize>>,
    len: usize,
}

impl OpenSet {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn insert(&mut self, key: OpenKey, slab_key: usize) {
        if self
            .by_priority
            .entry(key.priority)
            .or_default()
            .insert(key, slab_key)
            .is_none()
        {
            self.len += 1;
        }
    }

    /// `false` if `key` was not there.
    fn remove(&mut self, key: &OpenKey) -> bool {
        let Some(at_priority) = self.by_priority.get_mut(&key.priority) else {
            return false;
        };
        if at_priority.remove(key).is_none() {
            return false;
        }
        if at_priority.is_empty() {
            self.by_priority.remove(&key.priority);
        }
        self.len -= 1;
        true
    }

    /// The highest priority waiting and its first request.
    fn first(&self) -> Option<(Priority, usize)> {
        let (priority, at_priority) = self.by_priority.first_key_value()?;
        let (_, &slab_key) = at_priority.first_key_value()?;
        Some((priority.0, slab_key))
    }

    /// Takes out every request of an epoch up to `closed`, highest
    /// priority first, handing each to `each`.
    fn take_closed(&mut self, closed: u64, mut each: impl FnMut(OpenKey, usize)) {
        let mut taken = 0;
        self.by_priority.retain(|_, at_priority| {
            while let Some(entry) = at_priority.first_entry() {
                if entry.key().epoch > closed {
                    break;
                }
                let (key, slab_key) = entry.remove_entry();
                each(key, slab_key);
                taken += 1;
            }
            !at_priority.is_empty()
        });
        self.len -= taken;
    }

    fn clear(&mut self) {
        self.by_priority.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use tokio_test::task;

    use super::*;
    use crate::{SlotPermit, WorkInfo, WorkQueue};

    fn order(used: u64, weight: u32) -> TenantOrder {
        TenantOrder {
            used,
            weight,
            since: 0,
            id: TenantId::new(7),
        }
    }

    #[test]
    fn a_newcomer_starts_just_behind_the_front_scaled_to_its_weight() {
        let weight = |w| TenantWeight::new(w).unwrap();
        let rows: &[(Option<TenantOrder>, u32, u64)] = &[
            // Nobody waits: nobody to be unfair to.
            (None, 1, 0),
            (Some(order(0, 1)), 1, 1),
            (Some(order(4, 1)), 1, 5),
            // Ratio 4/2 = 2; weight 3 needs more than 6.
            (Some(order(4, 2)), 3, 7),
            // Ratio 5/2 = 2.5; weight 1 needs more than 2.5.
            (Some(order(5, 2)), 1, 3),
            (Some(order(u64::MAX, 1)), 1000, u64::MAX),
        ];
        for &(front, w, expected) in rows {
            let used = newcomer_used(front.as_ref(), weight(w));
            assert_eq!(used, expected, "front {front:?}, weight {w}");
            if let Some(front) = front {
                let newcomer = TenantOrder {
                    used,
                    weight: w,
                    since: 0,
                    id: TenantId::new(0),
                };
                assert!(
                    used == u64::MAX || newcomer > front,
                    "behind the front even with a lower id"
                );
            }
        }
    }

    /// A client that uses a fresh tenant id for every request, against a
    /// steady tenant, on four slots. Each round a new id asks, the oldest
    /// admitted request completes, and the freed slot goes to whoever the
    /// queue picks. Were a new id to start at zero it would win every slot.
    /// Returns the slots won by fresh ids and by the steady tenant.
    async fn fresh_ids_against_a_steady_tenant(usage: crate::Usage) -> (u32, u32) {
        let queue = WorkQueue::builder()
            .total_slots(4)
            .newcomers_start_behind(true)
            .usage(usage)
            .build()
            .unwrap();
        let steady = TenantId::new(1_000);
        let ask =
            |tenant: TenantId| task::spawn(queue.admit(WorkInfo::new(tenant, Priority::NORMAL)));
        let admit_now = |tenant: u64| {
            let mut admit = ask(TenantId::new(tenant));
            match admit.poll() {
                std::task::Poll::Ready(Ok(permit)) => (tenant, permit),
                other => panic!("expected immediate admission, got {other:?}"),
            }
        };
        // The rotating client holds three slots, the steady tenant one.
        let mut held: VecDeque<(u64, SlotPermit)> =
            [2, 3, 1_000, 4].into_iter().map(admit_now).collect();
        let mut waiting: Vec<(u64, _)> = (0..16)
            .map(|_| {
                let mut admit = ask(steady);
                assert!(admit.poll().is_pending());
                (steady.get(), admit)
            })
            .collect();
        let (mut to_steady, mut to_fresh) = (0, 0);
        for round in 0..12u64 {
            let fresh = 10 + round;
            let mut admit = ask(TenantId::new(fresh));
            assert!(admit.poll().is_pending());
            waiting.push((fresh, admit));
            drop(held.pop_front());
            let mut granted = Vec::new();
            waiting.retain_mut(|(tenant, admit)| match admit.poll() {
                std::task::Poll::Ready(result) => {
                    granted.push((*tenant, result.unwrap()));
                    false
                }
                std::task::Poll::Pending => true,
            });
            assert_eq!(granted.len(), 1, "one slot freed, one granted");
            if granted[0].0 == steady.get() {
                to_steady += 1;
            } else {
                to_fresh += 1;
            }
            held.extend(granted);
        }
        (to_fresh, to_steady)
    }

    /// Counting slots held, a fresh id wins no more than the steady tenant.
    #[tokio::test(start_paused = true)]
    async fn a_fresh_tenant_id_per_request_does_not_beat_a_steady_tenant_on_held_usage() {
        let (to_fresh, to_steady) = fresh_ids_against_a_steady_tenant(crate::Usage::Held).await;
        assert!(
            to_fresh <= to_steady,
            "fresh ids won {to_fresh} slots, the steady tenant {to_steady}"
        );
    }

    /// Counting grants (the default), every fresh id is a tenant owed its
    /// own share while it waits, so together they win more than the steady
    /// tenant: as many shares as fresh ids wait at once, here about two.
    /// Ties go to the tenant the queue knew first, so a low id buys nothing;
    /// tenant ids from headers come only from trusted callers (the tower
    /// layer's trust model).
    #[tokio::test(start_paused = true)]
    async fn fresh_tenant_ids_win_a_bounded_share_on_granted_usage() {
        let (to_fresh, to_steady) = fresh_ids_against_a_steady_tenant(crate::Usage::Granted).await;
        assert!(
            to_steady >= 4 && to_fresh <= 2 * to_steady,
            "fresh ids won {to_fresh} slots, the steady tenant {to_steady}"
        );
    }
}
