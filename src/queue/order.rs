//! The two orderings of the WorkQueue, as `Ord` keys.

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeSet;

use tokio::time::Instant;

use crate::work::{Priority, TenantId};

/// Orders tenants that have waiting work: the least `used / weight` first;
/// on a tie the heavier tenant, then the tenant the queue has known longer
/// (whose record is older: a caller that mints fresh ids, low ones
/// included, never wins a tie against a tenant already there), then the
/// lower id.
///
/// The ratio is compared by cross-multiplication in `u128`, which is exact
/// for every `u64` usage and `u32` weight, so this is a total order that
/// agrees with the derived equality (equal ratios and equal weights imply
/// equal usage, weights being non-zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TenantOrder {
    pub(super) used: u64,
    pub(super) weight: u32,
    /// When the queue made the tenant's record, in records made.
    pub(super) since: u64,
    pub(super) id: TenantId,
}

impl Ord for TenantOrder {
    fn cmp(&self, other: &Self) -> Ordering {
        let mine = u128::from(self.used) * u128::from(other.weight);
        let theirs = u128::from(other.used) * u128::from(self.weight);
        mine.cmp(&theirs)
            .then_with(|| other.weight.cmp(&self.weight))
            .then_with(|| self.since.cmp(&other.since))
            .then_with(|| self.id.cmp(&other.id))
    }
}

impl PartialOrd for TenantOrder {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The tenants with waiting work, in [`TenantOrder`]: a B-tree, but for
/// one tenant alone, which is kept beside it. A queue whose requests come
/// from one tenant (or mostly do) enters it into the order when its first
/// request waits and takes it out when its last is granted, turn after
/// turn: for one tenant that is a field set and cleared, not a B-tree
/// insert and removal.
#[derive(Debug, Default)]
pub(super) struct FairOrder {
    /// The one tenant, while `many` is empty.
    only: Option<TenantOrder>,
    /// Every tenant, while there are two or more.
    many: BTreeSet<TenantOrder>,
}

impl FairOrder {
    /// Adds `order`; `false` if it was there.
    pub(super) fn insert(&mut self, order: TenantOrder) -> bool {
        if !self.many.is_empty() {
            return self.many.insert(order);
        }
        match self.only {
            None => {
                self.only = Some(order);
                true
            }
            Some(only) if only == order => false,
            Some(only) => {
                self.only = None;
                self.many.insert(only);
                self.many.insert(order)
            }
        }
    }

    /// Takes `order` out; `false` if it was not there.
    pub(super) fn remove(&mut self, order: &TenantOrder) -> bool {
        if self.many.is_empty() {
            if self.only.as_ref() == Some(order) {
                self.only = None;
                return true;
            }
            return false;
        }
        let removed = self.many.remove(order);
        if self.many.len() == 1 {
            self.only = self.many.pop_first();
        }
        removed
    }

    /// The least-served tenant.
    pub(super) fn first(&self) -> Option<&TenantOrder> {
        self.only.as_ref().or_else(|| self.many.first())
    }

    /// Every tenant, least-served first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &TenantOrder> {
        self.only.iter().chain(&self.many)
    }

    /// The first `f` of the tenants in order that is `Some`: `iter().find_map`,
    /// without making a B-tree iterator for one tenant alone.
    #[inline]
    pub(super) fn find_map<R>(&self, mut f: impl FnMut(&TenantOrder) -> Option<R>) -> Option<R> {
        match &self.only {
            Some(only) => f(only),
            None => self.many.iter().find_map(f),
        }
    }

    pub(super) fn clear(&mut self) {
        self.only = None;
        self.many.clear();
    }
}

impl FromIterator<TenantOrder> for FairOrder {
    fn from_iter<I: IntoIterator<Item = TenantOrder>>(orders: I) -> Self {
        let mut order = FairOrder::default();
        for tenant in orders {
            order.insert(tenant);
        }
        order
    }
}

/// Orders one tenant's waiting work: higher priority first; within a
/// priority, work marked LIFO (newest first) ahead of work marked FIFO
/// (oldest first), as upstream biases mixed marks towards LIFO; then arrival
/// (the sequence number makes keys unique).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct WaiterKey {
    pub(super) priority: Reverse<Priority>,
    pub(super) recency: Recency,
    pub(super) seq: u64,
}

/// How create times order within a priority. The variant order is the
/// service order: `Resumed` keys sort before `Newest` keys, and those
/// before `Oldest` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Recency {
    /// Work in progress asking for its slot again after a wait: ahead of
    /// new work of its priority, oldest first, whatever the LIFO marks.
    Resumed(Instant),
    /// LIFO-marked: the most recently created first.
    Newest(Reverse<Instant>),
    /// FIFO-marked: the oldest first.
    Oldest(Instant),
}

/// Orders one priority's LIFO-marked work whose epoch has not closed yet:
/// oldest epoch first, then create time, then arrival (the tenant's open
/// set keeps each priority apart, highest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct OpenKey {
    pub(super) epoch: u64,
    pub(super) priority: Reverse<Priority>,
    pub(super) create_time: Instant,
    pub(super) seq: u64,
}

/// Where a waiting request sits in its tenant's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Eligible now, in priority and recency order.
    Ready(WaiterKey),
    /// LIFO-marked, waiting for its epoch to close.
    Open(OpenKey),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(used: u64, weight: u32, id: u64) -> TenantOrder {
        TenantOrder {
            used,
            weight,
            since: 0,
            id: TenantId::new(id),
        }
    }

    proptest::proptest! {
        /// Whatever is inserted and removed, the order agrees with a
        /// B-tree of the same tenants: what insert and remove answer, the
        /// first, and every tenant in order.
        #[test]
        fn the_fair_order_agrees_with_a_btree_of_the_same_tenants(
            ops in proptest::collection::vec((proptest::bool::ANY, 0u64..4, 0u64..3), 1..60),
        ) {
            let mut ours = FairOrder::default();
            let mut model = BTreeSet::new();
            for (insert, id, used) in ops {
                let order = tenant(used, 1, id);
                if insert {
                    proptest::prop_assert_eq!(ours.insert(order), model.insert(order));
                } else {
                    proptest::prop_assert_eq!(ours.remove(&order), model.remove(&order));
                }
                proptest::prop_assert_eq!(ours.first(), model.first());
                let odd = |order: &TenantOrder| (order.id.get() % 2 == 1).then_some(order.id);
                proptest::prop_assert_eq!(ours.find_map(odd), model.iter().find_map(odd));
                let listed: Vec<_> = ours.iter().copied().collect();
                let expected: Vec<_> = model.iter().copied().collect();
                proptest::prop_assert_eq!(listed, expected);
            }
            let rebuilt: FairOrder = model.iter().copied().collect();
            proptest::prop_assert!(rebuilt.iter().eq(model.iter()));
            ours.clear();
            proptest::prop_assert_eq!(ours.first(), None);
        }
    }

    #[test]
    fn tenants_order_by_usage_over_weight_then_weight_then_age_then_id() {
        let known_since = |since, order: TenantOrder| TenantOrder { since, ..order };
        // (used, weight, id), listed in the order they must come out.
        let mut tenants = vec![
            tenant(0, 1, 9),                 // unused beats any usage
            tenant(1, 4, 3),                 // 0.25
            tenant(2, 4, 2),                 // 0.5, heavier wins the tie
            tenant(1, 2, 1),                 // 0.5, lighter, lower id
            tenant(1, 2, 5),                 // 0.5, lighter, higher id
            known_since(1, tenant(1, 2, 0)), // the same, but known later: behind whatever its id
            tenant(3, 1, 4),                 // 3
            tenant(u64::MAX, 1, 6),          // no overflow at the extremes
        ];
        let expected = tenants.clone();
        tenants.reverse();
        tenants.sort();
        assert_eq!(tenants, expected);
    }

    #[test]
    fn waiters_order_by_priority_then_create_time_then_arrival() {
        let t0 = Instant::now();
        let later = t0 + std::time::Duration::from_millis(1);
        let key = |priority: i8, create_time, seq| WaiterKey {
            priority: Reverse(Priority::new(priority)),
            recency: Recency::Oldest(create_time),
            seq,
        };
        let mut keys = vec![
            key(0, later, 0),
            key(-5, t0, 1),
            key(10, later, 2),
            key(0, t0, 4),
            key(0, t0, 3),
        ];
        keys.sort();
        assert_eq!(
            keys,
            vec![
                key(10, later, 2),
                key(0, t0, 3),
                key(0, t0, 4),
                key(0, later, 0),
                key(-5, t0, 1)
            ]
        );
    }

    #[test]
    fn lifo_marked_work_goes_newest_first_and_ahead_of_fifo_work_of_its_priority() {
        let t0 = Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let key = |priority: i8, recency, seq| WaiterKey {
            priority: Reverse(Priority::new(priority)),
            recency,
            seq,
        };
        let mut keys = [
            key(0, Recency::Oldest(at(1)), 0),
            key(0, Recency::Newest(Reverse(at(2))), 1),
            key(0, Recency::Newest(Reverse(at(5))), 2),
            key(9, Recency::Oldest(at(9)), 3),
            key(0, Recency::Oldest(at(0)), 4),
        ];
        keys.sort();
        let seqs: Vec<u64> = keys.iter().map(|k| k.seq).collect();
        assert_eq!(seqs, [3, 2, 1, 4, 0]);
    }
}
