//! The priorities of a queue's held work that is runnable: woken, with its
//! slot, and not yet polled. Held work of a lower priority steps aside for
//! it (see `hold.rs`).
//!
//! A leaf lock guards the counts; readers look at one atomic, the highest
//! priority counted, without it. A reader may see a value one transition
//! old, which costs at most one poll in the wrong order, never a slot.

use std::sync::atomic::{AtomicI16, Ordering};

use super::level::{index, priority_at};
use crate::sync::StdMutex;
use crate::work::Priority;

/// `top` when nothing is counted: below every priority.
const NOTHING_RUNNABLE: i16 = i16::MIN;

/// One queue's runnable held work, counted per priority.
pub(crate) struct RunnableHolds {
    counts: StdMutex<Counts>,
    /// The highest priority with a count, or [`NOTHING_RUNNABLE`].
    top: AtomicI16,
}

/// Runnable holds per priority, and which priorities have any (so that
/// the next highest is found in four words, not 256 counts).
struct Counts {
    per_priority: [u32; 256],
    any: [u64; 4],
}

impl Counts {
    fn highest(&self) -> i16 {
        for (word, bits) in self.any.iter().enumerate().rev() {
            if *bits != 0 {
                let index = word * 64 + 63 - bits.leading_zeros() as usize;
                return i16::from(priority_at(index).get());
            }
        }
        NOTHING_RUNNABLE
    }
}

impl Default for RunnableHolds {
    fn default() -> Self {
        RunnableHolds {
            counts: StdMutex::new(Counts {
                per_priority: [0; 256],
                any: [0; 4],
            }),
            top: AtomicI16::new(NOTHING_RUNNABLE),
        }
    }
}

impl RunnableHolds {
    /// Counts one more runnable hold of `priority`.
    pub(crate) fn enter(&self, priority: Priority) {
        let mut counts = self.counts.lock().unwrap_or_else(crate::sync::recover);
        let index = index(priority);
        let count = &mut counts.per_priority[index];
        // One per hold, so it cannot reach u32::MAX before memory runs out.
        *count = count.saturating_add(1);
        counts.any[index / 64] |= 1 << (index % 64);
        self.top.store(counts.highest(), Ordering::Release);
    }

    /// Counts one runnable hold of `priority` fewer.
    pub(crate) fn leave(&self, priority: Priority) {
        let mut counts = self.counts.lock().unwrap_or_else(crate::sync::recover);
        let index = index(priority);
        let count = &mut counts.per_priority[index];
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.any[index / 64] &= !(1 << (index % 64));
        }
        self.top.store(counts.highest(), Ordering::Release);
    }

    /// Whether held work of a priority above `priority` is runnable.
    pub(crate) fn any_above(&self, priority: Priority) -> bool {
        self.top.load(Ordering::Acquire) > i16::from(priority.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_runnable_priority_follows_every_enter_and_leave() {
        let holds = RunnableHolds::default();
        let (low, normal, high) = (Priority::USER_LOW, Priority::NORMAL, Priority::USER_HIGH);
        assert!(!holds.any_above(Priority::new(i8::MIN)));
        holds.enter(normal);
        holds.enter(low);
        assert!(holds.any_above(low));
        assert!(!holds.any_above(normal));
        holds.enter(high);
        holds.enter(high);
        assert!(holds.any_above(normal));
        holds.leave(high);
        assert!(holds.any_above(normal), "one high hold is still runnable");
        holds.leave(high);
        assert!(!holds.any_above(normal));
        assert!(holds.any_above(low));
        holds.leave(normal);
        holds.leave(low);
        assert!(!holds.any_above(Priority::new(i8::MIN)));
    }

    #[test]
    fn the_extreme_priorities_are_counted() {
        let holds = RunnableHolds::default();
        holds.enter(Priority::new(i8::MAX));
        assert!(holds.any_above(Priority::new(i8::MAX - 1)));
        assert!(!holds.any_above(Priority::new(i8::MAX)));
        holds.leave(Priority::new(i8::MAX));
        holds.enter(Priority::new(i8::MIN));
        assert!(!holds.any_above(Priority::new(i8::MIN)));
        holds.leave(Priority::new(i8::MIN));
        assert_eq!(holds.top.load(Ordering::Relaxed), NOTHING_RUNNABLE);
    }
}
