//! One tenant's record: its fair-share standing and its waiting work.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::epoch::{PriorityStates, ALL_FIFO};
use super::order::{OpenKey, Place, Recency, TenantOrder, WaiterKey};
use crate::work::{Priority, TenantId, TenantWeight};

#[derive(Debug)]
pub(super) struct Tenant {
    pub(super) weight: TenantWeight,
    /// Capacity charged since the last reset and not yet returned.
    pub(super) used: u64,
    /// Work below this priority is LIFO-marked when it enqueues.
    pub(super) lifo_threshold: i16,
    /// What the current epoch saw, for the next threshold.
    pub(super) states: PriorityStates,
    /// Waiting work that may be granted now, in service order.
    ready: BTreeMap<WaiterKey, usize>,
    /// LIFO-marked work whose epoch is still open.
    open: BTreeMap<OpenKey, usize>,
    /// Waiting requests per priority, in both sets; kept only when early
    /// rejection needs it (`None` otherwise: two tree updates per wait saved).
    waiting_at: Option<BTreeMap<Priority, u32>>,
}

impl Tenant {
    pub(super) fn new(weight: TenantWeight, count_priorities: bool) -> Self {
        Tenant {
            weight,
            used: 0,
            lifo_threshold: ALL_FIFO,
            states: PriorityStates::default(),
            ready: BTreeMap::new(),
            open: BTreeMap::new(),
            waiting_at: count_priorities.then(BTreeMap::new),
        }
    }

    pub(super) fn order(&self, id: TenantId) -> TenantOrder {
        TenantOrder {
            used: self.used,
            weight: self.weight.get(),
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

    /// The slab key of the request to grant next: ready work first; open
    /// epochs only when nothing else of the tenant waits.
    pub(super) fn first(&self) -> Option<usize> {
        let ready = self.ready.first_key_value().map(|(_, &slab_key)| slab_key);
        ready.or_else(|| self.open.first_key_value().map(|(_, &slab_key)| slab_key))
    }

    pub(super) fn insert(&mut self, place: Place, slab_key: usize) {
        let priority = match place {
            Place::Ready(key) => {
                self.ready.insert(key, slab_key);
                key.priority.0
            }
            Place::Open(key) => {
                self.open.insert(key, slab_key);
                key.priority.0
            }
        };
        if let Some(waiting_at) = &mut self.waiting_at {
            *waiting_at.entry(priority).or_default() += 1;
        }
    }

    pub(super) fn remove(&mut self, place: &Place) {
        let (removed, priority) = match place {
            Place::Ready(key) => (self.ready.remove(key).is_some(), key.priority.0),
            Place::Open(key) => (self.open.remove(key).is_some(), key.priority.0),
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
    pub(super) fn close_epochs(&mut self, closed: u64) -> Vec<(usize, Place)> {
        let mut moved = Vec::new();
        while let Some(entry) = self.open.first_entry() {
            if entry.key().epoch > closed {
                break;
            }
            let (key, slab_key) = entry.remove_entry();
            let ready = WaiterKey {
                priority: key.priority,
                recency: Recency::Newest(Reverse(key.create_time)),
                seq: key.seq,
            };
            self.ready.insert(ready, slab_key);
            moved.push((slab_key, Place::Ready(ready)));
        }
        moved
    }
}
