//! What admitted work reports back: how long it held its slots, at what
//! concurrency it was admitted, and whether it finished past its deadline.
//!
//! The CPU controller's second signal (see `cpu/inflation.rs`) is built on
//! this. It is measured on admitted work itself, so it sees queueing that
//! no runtime metric shows: a task parked on tokio's defer list by
//! `yield_now` or by an exhausted cooperative budget, a task waiting for a
//! contended async mutex, a runtime other than tokio's. By Little's law, a
//! slot total above what the CPU can run at once shows up as longer holds
//! (`used / completion rate`), whatever the handlers do between awaits.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::work::Priority;

/// Holds completed since the controller last looked, per priority.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct WorkWindow {
    pub(crate) priorities: BTreeMap<Priority, PriorityHolds>,
}

/// One priority's completions in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PriorityHolds {
    /// Completions (slots given back after the work ran).
    pub(crate) completions: u64,
    /// Their holds, summed.
    pub(crate) held: Duration,
    /// Completions of work admitted while no more than the base concurrency
    /// (the runtime's workers) was in flight, itself included: work that had
    /// the CPU to itself, whose holds are the unloaded value.
    pub(crate) base_completions: u64,
    /// Their holds, summed.
    pub(crate) base_held: Duration,
    /// Completions after the work's deadline had passed.
    pub(crate) late: u64,
    /// Grants to waiters of this priority that had waited more than half
    /// of the time their deadline gave them.
    pub(crate) waited_long: u64,
}

impl WorkWindow {
    pub(crate) fn completed(&mut self, priority: Priority, held: Duration, base: bool, late: bool) {
        let holds = self.priorities.entry(priority).or_default();
        holds.completions = holds.completions.saturating_add(1);
        holds.held = holds.held.saturating_add(held);
        if base {
            holds.base_completions = holds.base_completions.saturating_add(1);
            holds.base_held = holds.base_held.saturating_add(held);
        }
        if late {
            holds.late = holds.late.saturating_add(1);
        }
    }

    /// Adds `other`'s counts to this window's (a reader keeping a window
    /// open across several reports).
    pub(crate) fn absorb(&mut self, other: WorkWindow) {
        for (priority, holds) in other.priorities {
            let mine = self.priorities.entry(priority).or_default();
            mine.completions = mine.completions.saturating_add(holds.completions);
            mine.held = mine.held.saturating_add(holds.held);
            mine.base_completions = mine.base_completions.saturating_add(holds.base_completions);
            mine.base_held = mine.base_held.saturating_add(holds.base_held);
            mine.late = mine.late.saturating_add(holds.late);
            mine.waited_long = mine.waited_long.saturating_add(holds.waited_long);
        }
    }

    /// Completions of every priority.
    pub(crate) fn completions(&self) -> u64 {
        self.priorities
            .values()
            .fold(0, |sum, holds| sum.saturating_add(holds.completions))
    }

    pub(crate) fn waited_long(&mut self, priority: Priority) {
        let holds = self.priorities.entry(priority).or_default();
        holds.waited_long = holds.waited_long.saturating_add(1);
    }
}
