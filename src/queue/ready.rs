//! One tenant's ready work in service order, at the cost of a list.
//!
//! The order is [`WaiterKey`]'s: priority, then how create times order
//! within it (resumed work, LIFO-marked work, FIFO-marked work), then create
//! time, then arrival. A B-tree over every waiter keeps that order at the
//! price of a search on every enqueue and every cancel, which with thousands
//! waiting is most of what queueing costs.
//!
//! Keys that share a priority and a recency class form a *lane*. Almost
//! every arrival sorts at one end of its lane: FIFO work is created after
//! everything already waiting (the back), LIFO work is the newest (the
//! front). Each lane is therefore a doubly linked list, in order, that takes
//! such arrivals in O(1) and gives any entry up in O(1) by its handle; the
//! rare key that sorts strictly inside the list (a create time set by the
//! caller, a resumed request's first create time) goes to the lane's B-tree
//! instead. A lane's first entry is the smaller of the two heads, and the
//! lanes themselves are a short vector in service order (a tenant waits at
//! a handful of priorities), so the order is exactly the B-tree's, with no
//! worst case above it. An arrival finds its lane by a search of that
//! vector; a removal, by the lane's place that the arrival's handle kept.

use std::collections::BTreeMap;

use slab::Slab;

use super::order::{Recency, WaiterKey};
use crate::work::Priority;

/// No node: the end of a list.
const NIL: usize = usize::MAX;

/// Above this many node slots, an emptied set gives its memory back rather
/// than keeping a burst's worth for good.
const KEEP_NODES: usize = 1024;

/// Up to this many lanes, an emptied lane stays (empty) rather than leave
/// the vector: a tenant whose one request comes and goes, turn after turn,
/// would otherwise shift the vector twice a turn.
const KEEP_LANES: usize = 4;

/// Where [`ReadyQueue::insert`] put an entry, for [`ReadyQueue::remove`]:
/// its lane, so that taking it out searches for nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    lane: u32,
    place: Filed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Filed {
    /// In its lane's list, at this node.
    Listed(usize),
    /// In its lane's B-tree.
    Sorted,
}

impl Entry {
    /// An entry that finds nothing: what a request filed nowhere holds.
    pub(super) const NOWHERE: Entry = Entry {
        lane: u32::MAX,
        place: Filed::Sorted,
    };
}

/// A lane: keys of one priority and one recency class, packed into one
/// integer that sorts as `(Reverse(priority), class)` does, so finding a
/// lane is a search over integers.
type LaneKey = u16;

fn lane_of(key: &WaiterKey) -> LaneKey {
    let class = match key.recency {
        Recency::Resumed(_) => 0,
        Recency::Newest(_) => 1,
        Recency::Oldest(_) => 2,
    };
    // Highest priority first: 127 maps to 0, -128 to 255.
    let rank = (127 - i16::from(key.priority.0.get())) as u16;
    (rank << 2) | class
}

#[derive(Debug)]
struct Node {
    key: WaiterKey,
    slab_key: usize,
    prev: usize,
    next: usize,
}

#[derive(Debug)]
struct Lane {
    key: LaneKey,
    /// The list's ends (`NIL` when empty); its keys strictly increase.
    head: usize,
    tail: usize,
    /// Keys that sorted strictly inside the list when they arrived.
    sorted: BTreeMap<WaiterKey, usize>,
}

impl Lane {
    fn is_empty(&self) -> bool {
        self.head == NIL && self.sorted.is_empty()
    }
}

/// A tenant's ready work: see the module's notes.
#[derive(Debug, Default)]
pub(super) struct ReadyQueue {
    /// The lanes where entries find them again: a lane keeps its place
    /// here for as long as it exists.
    lanes: Slab<Lane>,
    /// Every lane's key and place in `lanes`, in service order; empty lanes
    /// only while there are at most [`KEEP_LANES`].
    order: Vec<(LaneKey, u32)>,
    nodes: Slab<Node>,
    len: usize,
}

impl ReadyQueue {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds the request at `slab_key` under `key`, which no entry has.
    pub(super) fn insert(&mut self, key: WaiterKey, slab_key: usize) -> Entry {
        let lane_key = lane_of(&key);
        let id = match self.order.binary_search_by_key(&lane_key, |&(key, _)| key) {
            Ok(at) => self.order[at].1,
            Err(at) => {
                let id = self.lanes.insert(Lane {
                    key: lane_key,
                    head: NIL,
                    tail: NIL,
                    sorted: BTreeMap::new(),
                });
                // At most one lane per (priority, class): 768.
                let id = id as u32;
                self.order.insert(at, (lane_key, id));
                id
            }
        };
        self.len += 1;
        let lane = &mut self.lanes[id as usize];
        let entry = |place| Entry { lane: id, place };
        let node = |prev, next| Node {
            key,
            slab_key,
            prev,
            next,
        };
        if lane.tail == NIL {
            let only = self.nodes.insert(node(NIL, NIL));
            (lane.head, lane.tail) = (only, only);
            return entry(Filed::Listed(only));
        }
        if self.nodes[lane.tail].key < key {
            let last = self.nodes.insert(node(lane.tail, NIL));
            self.nodes[lane.tail].next = last;
            lane.tail = last;
            return entry(Filed::Listed(last));
        }
        if key < self.nodes[lane.head].key {
            let first = self.nodes.insert(node(NIL, lane.head));
            self.nodes[lane.head].prev = first;
            lane.head = first;
            return entry(Filed::Listed(first));
        }
        lane.sorted.insert(key, slab_key);
        entry(Filed::Sorted)
    }

    /// Takes out the entry `insert` put at `entry` under `key`; `false` if
    /// it is not there.
    pub(super) fn remove(&mut self, key: &WaiterKey, entry: Entry) -> bool {
        let lane_key = lane_of(key);
        // The key check guards against an entry whose lane has gone and
        // whose place was taken by another.
        let Some(lane) = self
            .lanes
            .get_mut(entry.lane as usize)
            .filter(|lane| lane.key == lane_key)
        else {
            return false;
        };
        let removed = match entry.place {
            // The key check guards against a handle whose node has been
            // freed and reused: keys are unique (they end in an arrival
            // number).
            Filed::Listed(node) if self.nodes.get(node).is_some_and(|n| n.key == *key) => {
                let Node { prev, next, .. } = self.nodes.remove(node);
                match prev {
                    NIL => lane.head = next,
                    prev => self.nodes[prev].next = next,
                }
                match next {
                    NIL => lane.tail = prev,
                    next => self.nodes[next].prev = prev,
                }
                true
            }
            Filed::Listed(_) => false,
            Filed::Sorted => lane.sorted.remove(key).is_some(),
        };
        if !removed {
            return false;
        }
        self.len -= 1;
        if lane.is_empty() && self.order.len() > KEEP_LANES {
            self.lanes.remove(entry.lane as usize);
            self.order.retain(|&(_, id)| id != entry.lane);
        }
        if self.len == 0 && self.nodes.capacity() > KEEP_NODES {
            self.nodes = Slab::new();
        }
        true
    }

    /// The slab key of the first entry in service order.
    pub(super) fn first(&self) -> Option<usize> {
        self.first_with_priority().map(|(_, slab_key)| slab_key)
    }

    /// The first entry in service order: its priority and slab key.
    pub(super) fn first_with_priority(&self) -> Option<(Priority, usize)> {
        let lane = self
            .order
            .iter()
            .map(|&(_, id)| &self.lanes[id as usize])
            .find(|lane| !lane.is_empty())?;
        let listed = (lane.head != NIL).then(|| &self.nodes[lane.head]);
        let sorted = lane.sorted.first_key_value();
        let (key, slab_key) = match (listed, sorted) {
            (Some(node), Some((key, &slab_key))) if *key < node.key => (key, slab_key),
            (Some(node), _) => (&node.key, node.slab_key),
            (None, Some((key, &slab_key))) => (key, slab_key),
            (None, None) => return None,
        };
        Some((key.priority.0, slab_key))
    }

    /// Slab keys from the last entry in service order to the first.
    pub(super) fn last_first(&self) -> impl Iterator<Item = usize> + '_ {
        self.order.iter().rev().flat_map(move |&(_, id)| {
            let lane = &self.lanes[id as usize];
            let mut node = lane.tail;
            let mut sorted = lane.sorted.iter().rev().peekable();
            std::iter::from_fn(move || {
                let listed = (node != NIL).then(|| &self.nodes[node]);
                match (listed, sorted.peek()) {
                    (Some(listed), Some((key, _))) if listed.key < **key => {
                        sorted.next().map(|(_, &slab_key)| slab_key)
                    }
                    (Some(listed), _) => {
                        node = listed.prev;
                        Some(listed.slab_key)
                    }
                    (None, _) => sorted.next().map(|(_, &slab_key)| slab_key),
                }
            })
        })
    }

    pub(super) fn clear(&mut self) {
        self.lanes.clear();
        self.order.clear();
        self.nodes.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::time::Duration;

    use proptest::prelude::*;
    use tokio::time::Instant;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// A key from (priority, class, create time offset).
        Insert(i8, u8, u16),
        /// Removes the live entry at this index (modulo how many there are).
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (-2i8..3, 0u8..3, 0u16..50).prop_map(|(p, c, t)| Op::Insert(p, c, t)),
            2 => any::<usize>().prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Whatever is inserted and removed, in whatever order and with
        /// whatever create times, the queue agrees with a B-tree of the same
        /// keys: its first entry, its entries from last to first, its
        /// length.
        #[test]
        fn agrees_with_a_btree_of_the_same_keys(
            ops in proptest::collection::vec(op(), 1..200),
            monotone in any::<bool>(),
        ) {
            let origin = Instant::now();
            let mut queue = ReadyQueue::default();
            let mut model: BTreeMap<WaiterKey, usize> = BTreeMap::new();
            let mut live: Vec<(WaiterKey, Entry)> = Vec::new();
            for (seq, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(priority, class, offset) => {
                        // Monotone create times are the common case (the
                        // lists' ends); arbitrary ones exercise the trees.
                        let offset = if monotone { seq as u64 } else { u64::from(offset) };
                        let at = origin + Duration::from_millis(offset);
                        let recency = match class {
                            0 => Recency::Resumed(at),
                            1 => Recency::Newest(Reverse(at)),
                            _ => Recency::Oldest(at),
                        };
                        let key = WaiterKey {
                            priority: Reverse(Priority::new(priority)),
                            recency,
                            seq: seq as u64,
                        };
                        let entry = queue.insert(key, seq);
                        model.insert(key, seq);
                        live.push((key, entry));
                    }
                    Op::Remove(index) if !live.is_empty() => {
                        let (key, entry) = live.swap_remove(index % live.len());
                        prop_assert!(queue.remove(&key, entry));
                        prop_assert!(!queue.remove(&key, entry), "removed twice");
                        model.remove(&key);
                    }
                    Op::Remove(_) => {}
                }
                prop_assert_eq!(queue.len(), model.len());
                prop_assert_eq!(queue.first(), model.values().next().copied());
                let ours: Vec<usize> = queue.last_first().collect();
                let theirs: Vec<usize> = model.values().rev().copied().collect();
                prop_assert_eq!(ours, theirs);
            }
        }
    }

    /// The packed lane key sorts as `(Reverse(priority), class)` at every
    /// priority, extremes included.
    #[test]
    fn lane_keys_sort_as_priority_then_class() {
        let at = Instant::now();
        let mut keys: Vec<((Reverse<Priority>, u8), LaneKey)> = Vec::new();
        for priority in i8::MIN..=i8::MAX {
            for (class, recency) in [
                Recency::Resumed(at),
                Recency::Newest(Reverse(at)),
                Recency::Oldest(at),
            ]
            .into_iter()
            .enumerate()
            {
                let priority = Reverse(Priority::new(priority));
                let key = WaiterKey {
                    priority,
                    recency,
                    seq: 0,
                };
                keys.push(((priority, class as u8), lane_of(&key)));
            }
        }
        keys.sort_by_key(|&(tuple, _)| tuple);
        assert!(keys.windows(2).all(|pair| pair[0].1 < pair[1].1));
    }

    #[test]
    fn in_order_arrivals_take_the_lists_and_an_emptied_burst_gives_its_memory_back() {
        let origin = Instant::now();
        let mut queue = ReadyQueue::default();
        let mut entries = Vec::new();
        for seq in 0..2_000u64 {
            let key = WaiterKey {
                priority: Reverse(Priority::NORMAL),
                recency: Recency::Oldest(origin + Duration::from_micros(seq)),
                seq,
            };
            let entry = queue.insert(key, seq as usize);
            assert!(
                matches!(entry.place, Filed::Listed(_)),
                "{seq} went to the tree"
            );
            entries.push((key, entry));
        }
        // Newest-first work arriving newest goes to the front of its list.
        let newest = WaiterKey {
            priority: Reverse(Priority::NORMAL),
            recency: Recency::Newest(Reverse(origin + Duration::from_secs(1))),
            seq: 2_000,
        };
        let newer = WaiterKey {
            recency: Recency::Newest(Reverse(origin + Duration::from_secs(2))),
            seq: 2_001,
            ..newest
        };
        let newest_entry = queue.insert(newest, 2_000);
        let newer_entry = queue.insert(newer, 2_001);
        assert!(
            matches!(newer_entry.place, Filed::Listed(_)),
            "not at the front"
        );
        assert_eq!(
            queue.first(),
            Some(2_001),
            "the LIFO lane comes first, newest first"
        );
        assert!(queue.remove(&newer, newer_entry));
        assert!(queue.remove(&newest, newest_entry));
        assert_eq!(queue.first(), Some(0));
        for (key, entry) in entries {
            assert!(queue.remove(&key, entry));
        }
        assert!(queue.is_empty());
        assert_eq!(queue.first(), None);
        assert!(queue.nodes.capacity() <= KEEP_NODES);
    }
}
