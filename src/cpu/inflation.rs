//! The second CPU signal: how much longer admitted work holds its slots
//! than it does with the CPU to itself.
//!
//! The runnable-per-worker rule (`adjuster.rs`) sees only what the runtime
//! exposes. On stable tokio that is a probe's scheduling delay, and neither
//! it nor tokio's own metrics see a task parked on the worker's defer list,
//! where `yield_now` and an exhausted cooperative budget put it. Handlers
//! written the way tokio's docs teach then hide the very queue admission
//! exists to move: the total climbs, admitted work waits in tokio's FIFO
//! queues, and priority is lost there.
//!
//! This signal is measured on the admitted work itself. By Little's law a
//! total above what the CPU can run at once cannot raise throughput, only
//! the time each admission holds its slot. So:
//!
//! * **Baseline**: per priority, the mean hold of work that was admitted
//!   with no more units in flight than the runtime has workers (work that
//!   had a worker to itself), smoothed over windows.
//! * **Inflation**: over a window of completions (at least
//!   [`MIN_COMPLETIONS`], or [`MAX_WINDOW`] with at least a few), the
//!   completion-weighted mean of each priority's mean hold over its
//!   baseline. 1 means work runs as if alone. While the workers are busy, a
//!   window whose holds already say "spike" beyond doubt closes early
//!   ([`EARLY_CLOSE`]: 8 completions at 3.5x, or 16 at 2.5x), so that a
//!   spike from a total far above the workers is cut after a few
//!   milliseconds of completions, not after 32 of them.
//! * **Inversion**: in the same window, work of some priority finished past
//!   its deadline, or waited for a grant more than half of what its
//!   deadline allowed, while work of a lower priority completed: slots went
//!   to lower priorities while higher ones suffered. Admission exists to
//!   prevent exactly that; it is an overload signal in its own right.
//!
//! The rule ([`verdict`]), with its reasons in [`InflationVerdict`]:
//!
//! ```text
//!  inflation ≥ 2      → cut: total = max(min, ⌈total / inflation⌉)   (a spike, absorbed in one window)
//!  inflation ≥ 1.4,
//!   or an inversion   → one slot fewer
//!  inflation ≤ 1.15   → good: the runnable rule may add a slot after two good windows in a row
//!                       (twice as many after each increase taken back within two windows,
//!                        up to 32; half as many after one that held)
//!  otherwise          → hold (the dead band)
//! ```
//!
//! Holds count as CPU queueing only while the runtime's workers are busy
//! ([`CPU_BUSY`] of their time, from tokio's busy-time metric over the last
//! 10 ms, with a controller built for a runtime). Otherwise longer holds are waits on IO,
//! timers or locks, which more slots do not make worse: the verdict is
//! ignored and increases need no good windows. The baseline still learns
//! only from work admitted at base concurrency when a window has any: at
//! 0.7x load a total of 6 on 2 workers makes holds twice their unloaded
//! value with the workers 75% busy, and a baseline learned from those
//! halved the inflation the next spike showed, so the cut came a slot per
//! window instead of at once (W4: 54 ms once). A window with no such work
//! teaches from every completion, so the baseline follows work that never
//! runs at low concurrency any more (a service that turns from computing
//! to waiting keeps no stale, short baseline).
//!
//! Work that waits on IO holds its slot without using the CPU, so raising
//! the total does not inflate its holds until the CPU is busy: the signal
//! lets an IO-bound service run more than a slot per worker, and stops it
//! where holds start to grow. A change of the work's own cost moves the
//! baseline only through work admitted at low concurrency; a cut brings the
//! total back there, so the baseline follows.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::queue::WorkWindow;
use crate::work::Priority;

/// The share of the workers' time they must be busy for longer holds to
/// count as CPU queueing (measured by the runtime's own busy time, with a
/// controller built for a runtime).
pub(crate) const CPU_BUSY: f64 = 0.8;

/// Completions that close a window.
pub(crate) const MIN_COMPLETIONS: u64 = 32;
/// The longest window: after it, a window with at least
/// [`MIN_SPARSE_COMPLETIONS`] completions closes anyway.
pub(crate) const MAX_WINDOW: Duration = Duration::from_millis(50);
/// The fewest completions a long window may close with.
pub(crate) const MIN_SPARSE_COMPLETIONS: u64 = 8;
/// Inflation at or above which the total is cut in proportion.
pub(crate) const CUT_AT: f64 = 2.0;
/// Inflation at or above which the total loses a slot.
pub(crate) const DECREASE_AT: f64 = 1.4;
/// Inflation at or below which a window is good.
pub(crate) const GOOD_AT: f64 = 1.15;
/// Good windows in a row before the runnable rule may add a slot, at
/// first and after an increase that held.
pub(crate) const GOOD_WINDOWS_TO_INCREASE: u32 = 2;
/// The most good windows an increase may have to wait for: each increase
/// taken back within two windows doubles the wait, up to this.
pub(crate) const MAX_GOOD_WINDOWS_TO_INCREASE: u32 = 32;

/// What one closed window of completions said: the controller acts on
/// the verdict, and a snapshot's `Debug` shows the latest reading.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct InflationReading {
    /// Completion-weighted mean hold over the baseline; `None` until some
    /// priority that completed has a baseline.
    pub(crate) inflation: Option<f64>,
    /// Completions in the window.
    pub(crate) completions: u64,
    /// A priority finished late, or waited long for its grant, while a
    /// lower priority completed work in the same window.
    pub(crate) inversion: bool,
    /// The verdict of the rule.
    pub(crate) verdict: InflationVerdict,
    /// Good windows in a row the next increase waits for (2, doubled by
    /// each increase taken back, up to 32).
    pub(crate) increase_after: u32,
}

/// The rule's verdict on a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InflationVerdict {
    /// Holds grew at least twofold: cut the total to this.
    Cut {
        /// The new total.
        to: u64,
    },
    /// Holds grew by at least 40%, or priority was inverted:
    /// one slot fewer.
    Decrease,
    /// Holds are near their baseline: the total may grow.
    Good,
    /// Between the two, or nothing to compare yet.
    Hold,
}

/// Early closes of a window, as (completions at least, inflation at least):
/// holds this inflated over this few completions are a spike beyond doubt.
///
/// Each row's false-alarm odds match the full window's (32 completions at
/// [`CUT_AT`]): for exponential holds with no inflation at all, the mean of
/// `n` reaches `k` times the baseline with probability at most
/// `exp(-n (k - 1 - ln k))` (Chernoff), about 5·10⁻⁵ for each row, as for
/// 32 at 2. A window that closes early is judged like any other, so the
/// cut is in proportion to the inflation it measured.
pub(crate) const EARLY_CLOSE: [(u64, f64); 2] = [(8, 3.5), (16, 2.5)];

// `HoldInflation::observe` computes the inflation only from
// MIN_SPARSE_COMPLETIONS on.
const _: () = assert!(
    EARLY_CLOSE[0].0 >= MIN_SPARSE_COMPLETIONS && EARLY_CLOSE[1].0 >= MIN_SPARSE_COMPLETIONS
);

/// Whether a window of `completions` measuring `inflation` closes before
/// [`MIN_COMPLETIONS`]: pure, a table in its tests.
pub(crate) fn closes_early(completions: u64, inflation: Option<f64>) -> bool {
    let Some(inflation) = inflation else {
        return false;
    };
    EARLY_CLOSE
        .iter()
        .any(|&(at_least, inflated)| completions >= at_least && inflation >= inflated)
}

/// The rule on one reading: pure, a table in its tests.
pub(crate) fn verdict(
    inflation: Option<f64>,
    inversion: bool,
    total: u64,
    min_slots: u64,
) -> InflationVerdict {
    match inflation {
        Some(inflation) if inflation >= CUT_AT => {
            let to = (total as f64 / inflation).ceil() as u64;
            // Never above the total, and never below the minimum unless
            // the total already is.
            InflationVerdict::Cut {
                to: to.max(min_slots).min(total),
            }
        }
        Some(inflation) if inflation >= DECREASE_AT => InflationVerdict::Decrease,
        _ if inversion => InflationVerdict::Decrease,
        Some(inflation) if inflation <= GOOD_AT => InflationVerdict::Good,
        _ => InflationVerdict::Hold,
    }
}

/// The signal's state across ticks: baselines, the open window, and the
/// run of good windows.
#[derive(Debug)]
pub(crate) struct HoldInflation {
    baselines: BTreeMap<Priority, Duration>,
    window: WorkWindow,
    opened: Option<Instant>,
    good_in_a_row: u32,
    /// Good windows the next increase waits for (backs off after failed
    /// probes; see [`MAX_GOOD_WINDOWS_TO_INCREASE`]).
    required_good: u32,
    /// Windows closed since the last increase, while it is on probation.
    since_increase: Option<u32>,
    last: Option<InflationReading>,
}

impl Default for HoldInflation {
    fn default() -> Self {
        HoldInflation {
            baselines: BTreeMap::new(),
            window: WorkWindow::default(),
            opened: None,
            good_in_a_row: 0,
            required_good: GOOD_WINDOWS_TO_INCREASE,
            since_increase: None,
            last: None,
        }
    }
}

impl HoldInflation {
    /// Adds the completions reported since the last tick; a reading when
    /// they close a window.
    pub(crate) fn observe(
        &mut self,
        reported: WorkWindow,
        now: Instant,
        total: u64,
        min_slots: u64,
        holds_are_cpu: bool,
    ) -> Option<InflationReading> {
        let opened = *self.opened.get_or_insert(now);
        self.window.absorb(reported);
        let completions = self.window.completions();
        let age = now.saturating_duration_since(opened);
        // Every way to close needs at least MIN_SPARSE_COMPLETIONS (the
        // smallest early close too): below that the inflation is not worth
        // computing, and above it the one computed here is the reading's.
        let inflation = if completions >= MIN_SPARSE_COMPLETIONS {
            self.inflation(&self.window)
        } else {
            None
        };
        let closes = completions >= MIN_COMPLETIONS
            || (age >= MAX_WINDOW && completions >= MIN_SPARSE_COMPLETIONS)
            || (holds_are_cpu && closes_early(completions, inflation));
        if !closes {
            if age >= 4 * MAX_WINDOW {
                // Too little work to say anything: start over.
                self.window = WorkWindow::default();
                self.opened = Some(now);
            }
            return None;
        }
        let window = std::mem::take(&mut self.window);
        self.opened = Some(now);
        self.learn_baselines(&window, !holds_are_cpu);
        let inversion = inverted(&window);
        let verdict = verdict(inflation, inversion, total, min_slots);
        self.good_in_a_row = match verdict {
            InflationVerdict::Good => self.good_in_a_row.saturating_add(1),
            _ => 0,
        };
        self.judge_last_increase(verdict);
        let reading = InflationReading {
            inflation,
            completions,
            inversion,
            verdict,
            increase_after: self.required_good,
        };
        self.last = Some(reading);
        Some(reading)
    }

    /// Whether the runnable rule may add a slot: no window has closed yet
    /// (no evidence either way: a controller whose work never completes
    /// must still be able to grow, and a first window that finds the
    /// total too high cuts it), or the latest windows were good. (The
    /// controller does not ask while the workers are not busy: holds then
    /// say nothing about the CPU.)
    pub(crate) fn allows_increase(&self) -> bool {
        self.last.is_none() || self.good_in_a_row >= self.required_good
    }

    /// An increase was made: the next one waits for fresh good windows,
    /// and this one is on probation for two windows.
    pub(crate) fn increased(&mut self) {
        self.good_in_a_row = 0;
        self.since_increase = Some(0);
    }

    /// Probing backs off like TCP's: an increase taken back within two
    /// windows (the CPU was full after all) doubles the good windows the
    /// next one waits for; one that held halves it. On CPU-bound work the
    /// total then spends little time a slot above what the workers can run,
    /// and work that can use more slots still finds them.
    fn judge_last_increase(&mut self, verdict: InflationVerdict) {
        let Some(windows) = self.since_increase else {
            return;
        };
        match verdict {
            InflationVerdict::Cut { .. } | InflationVerdict::Decrease => {
                self.required_good = self
                    .required_good
                    .saturating_mul(2)
                    .min(MAX_GOOD_WINDOWS_TO_INCREASE);
                self.since_increase = None;
            }
            _ if windows + 1 >= 2 => {
                self.required_good = (self.required_good / 2).max(GOOD_WINDOWS_TO_INCREASE);
                self.since_increase = None;
            }
            _ => self.since_increase = Some(windows + 1),
        }
    }

    pub(crate) fn last(&self) -> Option<InflationReading> {
        self.last
    }

    /// The baseline of `priority`, if it has one.
    #[cfg(test)]
    pub(crate) fn baseline(&self, priority: Priority) -> Option<Duration> {
        self.baselines.get(&priority).copied()
    }

    /// Every priority's baseline, lowest priority first.
    pub(crate) fn baselines(&self) -> Vec<(Priority, Duration)> {
        self.baselines.iter().map(|(&p, &d)| (p, d)).collect()
    }

    fn inflation(&self, window: &WorkWindow) -> Option<f64> {
        let (mut weighted, mut weight) = (0.0, 0.0);
        for (priority, holds) in &window.priorities {
            let Some(baseline) = self.baselines.get(priority) else {
                continue;
            };
            if holds.completions == 0 || baseline.is_zero() {
                continue;
            }
            let mean = holds.held.as_secs_f64() / holds.completions as f64;
            let n = holds.completions as f64;
            weighted += n * mean / baseline.as_secs_f64();
            weight += n;
        }
        (weight > 0.0).then(|| weighted / weight)
    }

    /// Each priority's baseline moves toward the mean hold of its work
    /// admitted at base concurrency, by a weight that grows with how many
    /// such completions the window had. With `or_every_completion` (the
    /// workers were not busy), a priority with no such work in the window
    /// learns from all of its completions instead.
    fn learn_baselines(&mut self, window: &WorkWindow, or_every_completion: bool) {
        for (priority, holds) in &window.priorities {
            let (completions, held) = if holds.base_completions > 0 {
                (holds.base_completions, holds.base_held)
            } else if or_every_completion && holds.completions > 0 {
                (holds.completions, holds.held)
            } else {
                continue;
            };
            let mean = held.as_secs_f64() / completions as f64;
            let n = completions as f64;
            let weight = n / (n + MIN_COMPLETIONS as f64);
            let learned = match self.baselines.get(priority) {
                Some(old) => old.as_secs_f64() * (1.0 - weight) + mean * weight,
                None => mean,
            };
            let learned = Duration::try_from_secs_f64(learned).unwrap_or(Duration::MAX);
            self.baselines.insert(*priority, learned);
        }
    }
}

/// A priority suffered (late, or waited long) while a lower one completed
/// work in the same window.
fn inverted(window: &WorkWindow) -> bool {
    let lowest_completed = window
        .priorities
        .iter()
        .find(|(_, holds)| holds.completions > 0)
        .map(|(&priority, _)| priority);
    let Some(lowest) = lowest_completed else {
        return false;
    };
    window
        .priorities
        .iter()
        .any(|(&priority, holds)| priority > lowest && (holds.late > 0 || holds.waited_long > 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::PriorityHolds;

    #[test]
    fn the_rule_as_a_table() {
        use InflationVerdict::*;
        // (inflation, inversion, total, min) → verdict
        let rows: &[(Option<f64>, bool, u64, u64, InflationVerdict)] = &[
            (None, false, 4, 1, Hold),
            (None, true, 4, 1, Decrease),
            (Some(1.0), false, 4, 1, Good),
            (Some(1.15), false, 4, 1, Good),
            (Some(1.2), false, 4, 1, Hold),
            (Some(1.2), true, 4, 1, Decrease),
            (Some(1.4), false, 4, 1, Decrease),
            (Some(2.0), false, 4, 1, Cut { to: 2 }),
            (Some(3.0), false, 8, 1, Cut { to: 3 }),
            (Some(10.0), false, 8, 2, Cut { to: 2 }),
            (Some(1e300), false, 8, 1, Cut { to: 1 }),
            (Some(f64::INFINITY), false, 8, 1, Cut { to: 1 }),
            (Some(4.0), false, 1, 2, Cut { to: 1 }),
            (Some(f64::NAN), false, 8, 1, Hold),
        ];
        for &(inflation, inversion, total, min, expected) in rows {
            assert_eq!(
                verdict(inflation, inversion, total, min),
                expected,
                "{inflation:?} {inversion} {total} {min}"
            );
        }
    }

    #[test]
    fn early_closes_as_a_table() {
        // (completions, inflation) → closes before 32
        let rows: &[(u64, Option<f64>, bool)] = &[
            (7, Some(10.0), false),
            (8, Some(3.5), true),
            (8, Some(3.4), false),
            (15, Some(3.4), false),
            (16, Some(2.5), true),
            (16, Some(2.4), false),
            (31, Some(2.4), false),
            (8, None, false),
            (16, Some(f64::NAN), false),
            (16, Some(f64::INFINITY), true),
        ];
        for &(completions, inflation, closes) in rows {
            assert_eq!(
                closes_early(completions, inflation),
                closes,
                "{completions} {inflation:?}"
            );
        }
    }

    #[test]
    fn idle_workers_teach_from_base_work_when_there_is_some_and_else_from_all() {
        let t0 = Instant::now();
        // Workers not busy: 8 completions at base concurrency (500 µs) and
        // 24 that shared the workers (1500 µs). Only the 8 teach.
        let mut mixed = window(&[(0, 32, 1500, 0, 0)]);
        mixed.priorities.values_mut().for_each(|holds| {
            holds.base_completions = 8;
            holds.base_held = Duration::from_micros(8 * 500);
        });
        let mut signal = HoldInflation::default();
        signal.observe(mixed, t0, 6, 2, false);
        assert_eq!(
            signal.baseline(Priority::NORMAL),
            Some(Duration::from_micros(500))
        );
        // A window with no base work at all, workers still not busy: it
        // teaches from every completion (the work's cost changed).
        signal.observe(window(&[(0, 32, 2500, 0, 0)]), t0, 6, 2, false);
        assert_eq!(
            signal.baseline(Priority::NORMAL),
            Some(Duration::from_micros(1500)),
            "halfway: 32 completions weigh 32 / (32 + 32)"
        );
        // The same window while the workers are busy teaches nothing.
        signal.observe(window(&[(0, 32, 9000, 0, 0)]), t0, 6, 2, true);
        assert_eq!(
            signal.baseline(Priority::NORMAL),
            Some(Duration::from_micros(1500))
        );
    }

    #[test]
    fn a_window_closes_early_only_while_holds_are_cpu_queueing() {
        let t0 = Instant::now();
        let mut signal = HoldInflation::default();
        signal.observe(window(&[(0, 32, 500, 32, 0)]), t0, 8, 2, true);
        // Eight completions held four times as long, while the workers are
        // not busy (IO, locks): no early close, the window stays open.
        assert_eq!(
            signal.observe(window(&[(0, 8, 2000, 0, 0)]), t0, 8, 2, false),
            None
        );
        // The workers are busy now: the same eight close it, and the cut
        // is in proportion.
        let reading = signal
            .observe(WorkWindow::default(), t0, 8, 2, true)
            .expect("closed early");
        assert_eq!((reading.completions, reading.inflation), (8, Some(4.0)));
        assert_eq!(reading.verdict, InflationVerdict::Cut { to: 2 });
    }

    fn window(rows: &[(i8, u64, u64, u64, u64)]) -> WorkWindow {
        // (priority, completions, mean hold µs, of which at base, late)
        let mut window = WorkWindow::default();
        for &(priority, completions, mean_us, base, late) in rows {
            window.priorities.insert(
                Priority::new(priority),
                PriorityHolds {
                    completions,
                    held: Duration::from_micros(mean_us * completions),
                    base_completions: base,
                    base_held: Duration::from_micros(mean_us * base),
                    late,
                    waited_long: 0,
                },
            );
        }
        window
    }

    #[test]
    fn holds_at_base_concurrency_set_the_baseline_and_inflated_holds_cut() {
        let t0 = Instant::now();
        let mut signal = HoldInflation::default();
        // 32 completions of 500 µs, all with a worker to themselves.
        let first = signal
            .observe(window(&[(0, 32, 500, 32, 0)]), t0, 2, 1, true)
            .expect("a full window");
        assert_eq!(first.inflation, None, "no baseline before this window");
        assert_eq!(
            signal.baseline(Priority::NORMAL),
            Some(Duration::from_micros(500))
        );
        // The same work held three times as long at a higher total.
        let inflated = signal
            .observe(window(&[(0, 32, 1500, 0, 0)]), t0, 6, 1, true)
            .expect("a full window");
        assert_eq!(inflated.inflation, Some(3.0));
        assert_eq!(inflated.verdict, InflationVerdict::Cut { to: 2 });
        assert!(!signal.allows_increase());
    }

    #[test]
    fn windows_close_on_completions_or_on_age_and_small_ones_start_over() {
        let t0 = Instant::now();
        let mut signal = HoldInflation::default();
        assert_eq!(
            signal.observe(window(&[(0, 10, 500, 10, 0)]), t0, 2, 1, true),
            None
        );
        assert!(signal
            .observe(window(&[(0, 22, 500, 22, 0)]), t0, 2, 1, true)
            .is_some());
        // Sparse: 8 completions close a window only once it is 50 ms old.
        assert_eq!(
            signal.observe(window(&[(0, 8, 500, 8, 0)]), t0, 2, 1, true),
            None
        );
        assert!(signal
            .observe(WorkWindow::default(), t0 + MAX_WINDOW, 2, 1, true)
            .is_some());
        // Fewer than 8 for 200 ms: dropped.
        assert_eq!(
            signal.observe(window(&[(0, 3, 500, 3, 0)]), t0 + MAX_WINDOW, 2, 1, true),
            None
        );
        assert_eq!(
            signal.observe(WorkWindow::default(), t0 + 5 * MAX_WINDOW, 2, 1, true),
            None
        );
        assert_eq!(
            signal.observe(
                window(&[(0, 5, 500, 5, 0)]),
                t0 + 11 * MAX_WINDOW,
                2,
                1,
                true
            ),
            None,
            "the three old completions were dropped: 5 < 8"
        );
    }

    #[test]
    fn an_increase_needs_two_good_windows_in_a_row() {
        let t0 = Instant::now();
        let mut signal = HoldInflation::default();
        assert!(signal.allows_increase(), "nothing to go by yet");
        signal.observe(window(&[(0, 32, 500, 32, 0)]), t0, 2, 1, true);
        assert!(
            !signal.allows_increase(),
            "one window, and it had no baseline"
        );
        signal.observe(window(&[(0, 32, 520, 32, 0)]), t0, 2, 1, true);
        assert!(!signal.allows_increase());
        signal.observe(window(&[(0, 32, 510, 32, 0)]), t0, 2, 1, true);
        assert!(signal.allows_increase());
        signal.increased();
        assert!(!signal.allows_increase());
    }

    #[test]
    fn an_increase_taken_back_doubles_the_wait_for_the_next() {
        let t0 = Instant::now();
        let mut signal = HoldInflation::default();
        signal.observe(window(&[(0, 32, 500, 32, 0)]), t0, 2, 1, true);
        assert_eq!(signal.last().unwrap().increase_after, 2);
        for expected in [4, 8, 16, 32, 32] {
            signal.increased();
            // The next window says the CPU was full after all.
            signal.observe(window(&[(0, 32, 750, 0, 0)]), t0, 3, 1, true);
            assert_eq!(signal.last().unwrap().increase_after, expected);
        }
        // An increase that holds for two windows halves it.
        signal.increased();
        signal.observe(window(&[(0, 32, 500, 32, 0)]), t0, 3, 1, true);
        signal.observe(window(&[(0, 32, 500, 32, 0)]), t0, 3, 1, true);
        assert_eq!(signal.last().unwrap().increase_after, 16);
    }

    #[test]
    fn late_high_priority_work_beside_completing_low_priority_work_is_an_inversion() {
        let t0 = Instant::now();
        let mut signal = HoldInflation::default();
        signal.observe(
            window(&[(-50, 16, 500, 16, 0), (50, 16, 500, 16, 0)]),
            t0,
            2,
            1,
            true,
        );
        let inverted = signal
            .observe(
                window(&[(-50, 16, 500, 16, 0), (50, 16, 500, 16, 3)]),
                t0,
                2,
                1,
                true,
            )
            .unwrap();
        assert!(inverted.inversion);
        assert_eq!(inverted.verdict, InflationVerdict::Decrease);
        // Late low-priority work is not an inversion.
        let fine = signal
            .observe(
                window(&[(-50, 16, 500, 16, 5), (50, 16, 500, 16, 0)]),
                t0,
                2,
                1,
                true,
            )
            .unwrap();
        assert!(!fine.inversion);
        assert_eq!(fine.verdict, InflationVerdict::Good);
    }
}
