//! The slot adjuster: additive increase, additive decrease, with a dead band.
//!
//! Each tick compares runnable tasks per worker with a threshold `T`:
//!
//! ```text
//!  runnable per worker
//!    ▲
//!    │ ≥ T           → total − 1, if 0 < used ≤ total and total > min
//!    │   (dead band)   hold
//!    │ ≤ T / 2       → total + 1, if the total binds and total < max
//!    └───────────────────────────────────────────▶ every tick (1 ms)
//! ```
//!
//! The decrease waits while `used > total`: the last decrease has not taken
//! effect yet (slots are never revoked), and taking more away would only
//! overshoot. The increase needs the total to bind: every slot in use, or
//! requests waiting that a larger total would admit (the queue's elastic
//! share is a fraction of the total, so elastic work held back by it waits
//! for the total while slots stand free). Capacity nobody asks for says
//! nothing about whether the CPU could take more. The dead band between
//! `T/2` and `T` keeps the total from flapping on every sample.
//!
//! Comparisons are done in integers (`runnable ≥ T·workers`,
//! `2·runnable ≤ T·workers`), exactly as upstream does with `procs`.

use std::fmt;

use super::signal::CpuLoad;

/// What one tick decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adjustment {
    /// Overloaded: one slot fewer.
    Decrease,
    /// Admitted work's holds grew at least twofold (see the
    /// [module documentation](super)): the total is cut to this at once.
    Cut(u64),
    /// Underloaded with every slot in use: one slot more.
    Increase,
    /// No change, and why.
    Hold(Hold),
}

/// Why a tick left the total alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The load is between `T/2` and `T` per worker.
    DeadBand,
    /// Overloaded, but the total is already at its minimum.
    AtMin,
    /// Underloaded, but the total is already at its maximum.
    AtMax,
    /// Overloaded, but no slot is in use: the load is not admitted work.
    NoneUsed,
    /// Overloaded, but more slots are in use than the total: the previous
    /// decrease has not taken effect yet.
    UsedAboveTotal,
    /// Underloaded, but slots are free and nobody waits for a larger
    /// total: nobody is asking for more.
    SlotsFree,
    /// Underloaded by the runnable rule, but admitted work's holds are not
    /// (yet) near their unloaded value: see the
    /// [module documentation](super).
    Inflated,
    /// Underloaded by the runnable rule with every slot in use, but no
    /// worker was parked as the tick sampled: the workers are already busy,
    /// and another slot would only share them between more handlers. A handler parked by `yield_now` or by an exhausted
    /// cooperative budget is in no run queue, so the runnable rule alone
    /// takes such work for spare capacity.
    WorkersBusy,
    /// The controller is idle and does not enforce or adjust.
    Idle,
    /// The signal panicked: no sample, so the total is held (and
    /// enforced) until it returns one.
    SignalFailed,
}

impl fmt::Display for Adjustment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Adjustment::Decrease => f.pad("decrease"),
            Adjustment::Increase => f.pad("increase"),
            Adjustment::Cut(to) => f.pad(&format!("cut to {to}")),
            Adjustment::Hold(why) => f.pad(&format!("hold ({why:?})")),
        }
    }
}

/// The AIAD rule with its bounds; pure, so that it can be tested as a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotAdjuster {
    threshold: u32,
    min_slots: u64,
    max_slots: u64,
}

impl SlotAdjuster {
    /// An adjuster with overload threshold `threshold` runnable tasks per
    /// worker and the total bounded to `min_slots..=max_slots`. The
    /// controller's builder validates these.
    pub(crate) fn new(threshold: u32, min_slots: u64, max_slots: u64) -> Self {
        SlotAdjuster {
            threshold,
            min_slots,
            max_slots,
        }
    }

    /// The lowest total the rule moves to.
    pub(crate) fn min_slots(&self) -> u64 {
        self.min_slots
    }

    /// The decision for one sample, given the slots in use, the total, and
    /// whether requests wait that a larger total would admit.
    pub(crate) fn decide(
        &self,
        load: &CpuLoad,
        used: u64,
        total: u64,
        waiting: bool,
    ) -> Adjustment {
        let limit = u128::from(self.threshold) * u128::from(load.workers.max(1));
        let runnable = u128::from(load.runnable);
        if runnable >= limit {
            if used == 0 {
                Adjustment::Hold(Hold::NoneUsed)
            } else if used > total {
                Adjustment::Hold(Hold::UsedAboveTotal)
            } else if total <= self.min_slots {
                Adjustment::Hold(Hold::AtMin)
            } else {
                Adjustment::Decrease
            }
        } else if 2 * runnable <= limit {
            if used < total && !waiting {
                Adjustment::Hold(Hold::SlotsFree)
            } else if total >= self.max_slots {
                Adjustment::Hold(Hold::AtMax)
            } else {
                Adjustment::Increase
            }
        } else {
            Adjustment::Hold(Hold::DeadBand)
        }
    }

    /// The total after `adjustment`.
    pub(crate) fn apply(&self, adjustment: Adjustment, total: u64) -> Option<u64> {
        match adjustment {
            Adjustment::Decrease => Some(total - 1),
            Adjustment::Increase => Some(total + 1),
            Adjustment::Cut(to) => Some(to),
            Adjustment::Hold(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threshold 4 per worker, 2 workers (overload at 8 runnable, underload
    /// at 4 or fewer), total bounded to 1..=10.
    #[test]
    fn the_aiad_rule_as_a_table() {
        let adjuster = SlotAdjuster::new(4, 1, 10);
        use Adjustment::{Decrease, Hold as H, Increase};
        #[rustfmt::skip]
        let rows: &[(&str, u64, u64, u64, bool, Adjustment)] = &[
            // name, runnable, used, total, requests waiting for the total, expected
            ("over threshold", 8, 5, 5, false, Decrease),
            ("far over threshold", 500, 3, 5, false, Decrease),
            ("over, used above total", 9, 6, 5, false, H(Hold::UsedAboveTotal)),
            ("over, nothing admitted", 9, 0, 5, true, H(Hold::NoneUsed)),
            ("over, at min", 9, 1, 1, false, H(Hold::AtMin)),
            ("just under threshold", 7, 5, 5, true, H(Hold::DeadBand)),
            ("just over half", 5, 5, 5, false, H(Hold::DeadBand)),
            ("at half", 4, 5, 5, false, Increase),
            ("idle runtime, all slots used", 0, 5, 5, false, Increase),
            ("under half, used above total", 0, 7, 5, false, Increase),
            ("under half, slots free", 0, 4, 5, false, H(Hold::SlotsFree)),
            ("under half, slots free, requests held back by the total", 0, 4, 5, true, Increase),
            ("under half, at max", 0, 10, 10, false, H(Hold::AtMax)),
            ("under half, at max, requests waiting", 0, 8, 10, true, H(Hold::AtMax)),
        ];
        for &(name, runnable, used, total, waiting, expected) in rows {
            let load = CpuLoad::new(runnable, 2);
            assert_eq!(
                adjuster.decide(&load, used, total, waiting),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn steps_are_one_slot() {
        let adjuster = SlotAdjuster::new(1, 1, 3);
        assert_eq!(adjuster.apply(Adjustment::Decrease, 3), Some(2));
        assert_eq!(adjuster.apply(Adjustment::Increase, 2), Some(3));
        assert_eq!(adjuster.apply(Adjustment::Hold(Hold::DeadBand), 2), None);
    }

    #[test]
    fn an_odd_limit_rounds_the_dead_band_like_upstream() {
        // Threshold 1 on 3 workers: overload at 3, underload at 2*r <= 3, so
        // at 1 runnable; 2 runnable is the dead band.
        let adjuster = SlotAdjuster::new(1, 1, 10);
        let at = |runnable| adjuster.decide(&CpuLoad::new(runnable, 3), 4, 4, false);
        assert_eq!(at(1), Adjustment::Increase);
        assert_eq!(at(2), Adjustment::Hold(Hold::DeadBand));
        assert_eq!(at(3), Adjustment::Decrease);
    }
}
