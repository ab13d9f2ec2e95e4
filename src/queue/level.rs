//! The queue's admission level: the lowest priority it still admits now
//! (DAGOR's level), read off the outcomes of its recent requests, for
//! callers to drop work below it before sending it.
//!
//! # The rule
//!
//! Outcomes are counted per priority in windows of at least
//! [`LEVEL_WINDOW`]:
//!
//! * **admitted**: on the fast path or granted from the queue (work that
//!   bypassed admission says nothing about room and is not counted);
//! * **refused for capacity**: [`QueueFull`](AdmitError::QueueFull),
//!   [`WouldMissDeadline`](AdmitError::WouldMissDeadline) (early
//!   rejection) and [`DeadlineExceeded`](AdmitError::DeadlineExceeded)
//!   (expired while it waited).
//!
//! Every other outcome (a closed queue, a deadline spent before the request
//! arrived, a request that can never fit, a runtime without timers, a
//! cancelled wait) says nothing about whether the queue has room for a
//! priority and counts for nothing.
//!
//! A priority is **shed** when, over the current window and the one before
//! together, its refusals outnumber its admissions. The **level** is one
//! above the highest priority of the run of shed priorities that starts at
//! the lowest priority with outcomes, or [`Priority::LOW`] (everything is
//! admitted) when that lowest priority is not shed or no priority has
//! outcomes. It never exceeds [`Priority::HIGH`], so the top of the ladder
//! is never reported as refused.
//!
//! Why a run from the bottom rather than the highest shed priority: the
//! queue orders by priority within a tenant, so where a priority is mostly
//! admitted, a higher one refused more often than not is refused for
//! reasons of its own (a deadline too short for the wait, a tenant over
//! its share), not for want of room at its priority, and must not take the
//! priorities in between down with it. Why a majority over two windows
//! rather than any refusal: a priority the queue mostly admits, refused
//! now and then as the load fluctuates, would otherwise flap above and
//! below the level with every outcome, and callers would drop work the
//! queue would have taken.
//!
//! # Implementation notes
//!
//! Two windows (current and previous) of per-priority counts, each with a
//! 256-bit set of the priorities it has outcomes of, so the level is found
//! by walking the set bits from the lowest priority: usually one to three
//! of them. The windows roll, and the level is worked out again, when an
//! outcome is counted that can change it: every refusal, and an admission
//! while the level is above [`Priority::LOW`] (an admission cannot lift a
//! level, so while nothing is shed the fast path counts with two array
//! writes and a bit set, and reads no clock). A roll happens at the first
//! such outcome [`LEVEL_WINDOW`] or more after the last one: the current
//! window becomes the previous one, whatever its age (admissions counted
//! without a clock may be recent), and the one before is forgotten. So an
//! outcome is remembered until the second roll after it: while requests
//! keep coming, between one and two windows.
//!
//! The level is published in an atomic the queue's handle reads without
//! its lock or a clock: a response carries the level as of the last
//! outcome counted, which for a response is its own request's or a later
//! one. Counts saturate.

// Read only by the tower layer's reports: without the `tower` feature the
// outcomes are counted and never read.
#![cfg_attr(not(feature = "tower"), allow(dead_code))]

use std::time::Duration;

use tokio::time::Instant;

use crate::error::AdmitError;
use crate::observe::WaitHistogram;
use crate::sync::{Ordering, StdArc, StdAtomicU64};
use crate::work::Priority;

/// How long one window of outcomes lasts (at least).
///
/// Short enough that the level follows a spike within a few milliseconds
/// of its first refusals (a window starts at most this long before them),
/// and that a priority callers stopped sending is forgotten, and so tried
/// again, within two windows; long enough to hold a few dozen outcomes at
/// the rates where shedding matters (thousands a second).
pub(crate) const LEVEL_WINDOW: Duration = Duration::from_millis(20);

/// The bit and counter index of a priority: ascending index order is
/// ascending priority order.
pub(super) fn index(priority: Priority) -> usize {
    usize::from(priority.get() as u8 ^ 0x80)
}

pub(super) fn priority_at(index: usize) -> Priority {
    // `index` < 256 by construction: the XOR undoes `index`.
    Priority::new(((index as u8) ^ 0x80) as i8)
}

/// One window's outcomes.
#[derive(Debug)]
struct Outcomes {
    /// The priorities with an outcome in this window.
    seen: [u64; 4],
    admitted: Box<[u32; 256]>,
    refused: Box<[u32; 256]>,
    /// How long the admitted work waited.
    waits: WaitHistogram,
}

impl Outcomes {
    fn new() -> Self {
        Outcomes {
            seen: [0; 4],
            admitted: Box::new([0; 256]),
            refused: Box::new([0; 256]),
            waits: WaitHistogram::default(),
        }
    }

    fn mark(&mut self, at: usize) {
        self.seen[at / 64] |= 1 << (at % 64);
    }

    /// Forgets everything, touching only the counters in use.
    fn clear(&mut self) {
        for at in SetBits::new(self.seen) {
            self.admitted[at] = 0;
            self.refused[at] = 0;
        }
        self.seen = [0; 4];
        self.waits = WaitHistogram::default();
    }
}

/// The indices of the set bits of a 256-bit set, lowest first.
struct SetBits {
    words: [u64; 4],
    word: usize,
}

impl SetBits {
    fn new(words: [u64; 4]) -> Self {
        SetBits { words, word: 0 }
    }
}

impl Iterator for SetBits {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.word < self.words.len() {
            let bits = self.words[self.word];
            if bits != 0 {
                // Clear the lowest set bit.
                self.words[self.word] = bits & (bits - 1);
                return Some(self.word * 64 + bits.trailing_zeros() as usize);
            }
            self.word += 1;
        }
        None
    }
}

/// A queue's state as a load report gives it, read under its lock in one
/// go: for the `endpoint-load-metrics` header of the tower layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct QueueLoad {
    /// Requests waiting in the queue.
    pub(crate) waiting: usize,
    /// Units granted and not yet given back: work in flight.
    pub(crate) in_flight: u64,
    /// The smoothed rate at which admitted work completes, per second
    /// (the rate early rejection drains the queue at).
    pub(crate) completions_per_sec: f64,
    /// The median wait of recently admitted work.
    pub(crate) recent_wait_p50: Option<Duration>,
}

/// The outcomes the level is read from; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct LevelWindows {
    started: Instant,
    current: Outcomes,
    previous: Outcomes,
    level: Priority,
    /// `level`, for readers without the queue's lock: its ladder value's
    /// byte. A report, deciding nothing: `std`'s atomic, outside loom's
    /// models.
    published: StdArc<StdAtomicU64>,
}

/// Whether `error` says the queue had no room for the request.
fn is_capacity(error: &AdmitError) -> bool {
    matches!(
        error,
        AdmitError::QueueFull { .. }
            | AdmitError::WouldMissDeadline { .. }
            | AdmitError::DeadlineExceeded { .. }
    )
}

impl LevelWindows {
    pub(crate) fn new(now: Instant) -> Self {
        LevelWindows {
            started: now,
            current: Outcomes::new(),
            previous: Outcomes::new(),
            level: Priority::LOW,
            published: StdArc::new(StdAtomicU64::new(u64::from(Priority::LOW.get() as u8))),
        }
    }

    /// The level as published, for the queue's handle.
    pub(crate) fn published(&self) -> StdArc<StdAtomicU64> {
        self.published.clone()
    }

    /// Work of `priority` was admitted after waiting `waited`; `now` if
    /// the caller read the clock.
    #[inline]
    pub(crate) fn admitted(&mut self, priority: Priority, waited: Duration, now: Option<Instant>) {
        let shedding = self.level > Priority::LOW;
        if shedding {
            self.roll(now.unwrap_or_else(Instant::now));
        }
        let at = index(priority);
        self.current.admitted[at] = self.current.admitted[at].saturating_add(1);
        self.current.mark(at);
        if waited.is_zero() {
            // Every admission without a wait: no bucket search.
            self.current.waits.record_zero();
        } else {
            self.current.waits.record(waited);
        }
        if shedding {
            self.update();
        }
    }

    /// `count` admissions of `priority` without a wait, while the level
    /// admits everything (so no window rolls): what that many calls of
    /// [`admitted`](Self::admitted) would count.
    pub(crate) fn admitted_at_once_many(&mut self, priority: Priority, count: u64) {
        debug_assert!(self.is_admitting_all());
        let at = index(priority);
        let count32 = u32::try_from(count).unwrap_or(u32::MAX);
        self.current.admitted[at] = self.current.admitted[at].saturating_add(count32);
        self.current.mark(at);
        self.current.waits.record_zeros(count);
    }

    /// Whether nothing is shed: the level is the lowest priority.
    pub(crate) fn is_admitting_all(&self) -> bool {
        self.level == Priority::LOW
    }

    /// Work of `priority` failed with `error`; counted only when it is a
    /// refusal for capacity. `now` if the caller read the clock.
    pub(crate) fn refused(&mut self, priority: Priority, error: &AdmitError, now: Option<Instant>) {
        if !is_capacity(error) {
            return;
        }
        self.roll(now.unwrap_or_else(Instant::now));
        let at = index(priority);
        self.current.refused[at] = self.current.refused[at].saturating_add(1);
        self.current.mark(at);
        self.update();
    }

    /// Moves the windows on at `now`, if the current one is old enough.
    fn roll(&mut self, now: Instant) {
        if now.saturating_duration_since(self.started) < LEVEL_WINDOW {
            return;
        }
        std::mem::swap(&mut self.current, &mut self.previous);
        self.current.clear();
        self.started = now;
    }

    /// Works the level out again and publishes it.
    fn update(&mut self) {
        let mut seen = self.current.seen;
        for (word, previous) in seen.iter_mut().zip(self.previous.seen) {
            *word |= previous;
        }
        let mut level = Priority::LOW;
        for at in SetBits::new(seen) {
            let refused =
                u64::from(self.current.refused[at]) + u64::from(self.previous.refused[at]);
            let admitted =
                u64::from(self.current.admitted[at]) + u64::from(self.previous.admitted[at]);
            if refused <= admitted {
                break;
            }
            level = match priority_at(at).get().checked_add(1) {
                Some(above) => Priority::new(above),
                None => Priority::HIGH,
            };
        }
        if level != self.level {
            self.level = level;
            self.published
                .store(u64::from(level.get() as u8), Ordering::Relaxed);
        }
    }

    /// The level as of the last outcome counted.
    #[cfg(test)]
    pub(crate) fn level(&self) -> Priority {
        self.level
    }

    /// The median wait of recently admitted work: over the current window,
    /// or the previous one while the current has none; `None` when neither
    /// admitted anything. The upper bound of the histogram bucket (at most
    /// twice the true value).
    pub(crate) fn recent_wait_p50(&self) -> Option<Duration> {
        if self.current.waits.count() > 0 {
            self.current.waits.quantile(0.5)
        } else {
            self.previous.waits.quantile(0.5)
        }
    }
}

/// The level a [`LevelWindows::published`] atomic holds.
pub(crate) fn read_published(published: &StdAtomicU64) -> Priority {
    Priority::new(published.load(Ordering::Relaxed) as u8 as i8)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: AdmitError = AdmitError::QueueFull { max_waiters: 1 };
    const MISS: AdmitError = AdmitError::WouldMissDeadline {
        expected: Duration::from_millis(2),
        remaining: Duration::from_millis(1),
    };

    /// One outcome: admitted (`true`) or refused with `MISS`.
    type Outcome = (Priority, bool);

    fn count(windows: &mut LevelWindows, outcomes: &[Outcome], now: Instant) {
        for &(priority, admitted) in outcomes {
            if admitted {
                windows.admitted(priority, Duration::ZERO, Some(now));
            } else {
                windows.refused(priority, &MISS, Some(now));
            }
        }
    }

    fn level_of(outcomes: &[Outcome]) -> Priority {
        let now = Instant::now();
        let mut windows = LevelWindows::new(now);
        count(&mut windows, outcomes, now);
        assert_eq!(read_published(&windows.published()), windows.level());
        windows.level()
    }

    fn times(n: usize, outcome: Outcome) -> Vec<Outcome> {
        vec![outcome; n]
    }

    #[test]
    fn the_level_is_one_above_the_shed_run_from_the_lowest_priority() {
        let (low, normal, high) = (Priority::USER_LOW, Priority::NORMAL, Priority::USER_HIGH);
        let above = |p: Priority| Priority::new(p.get() + 1);
        let rows: Vec<(&str, Vec<Outcome>, Priority)> = vec![
            (
                "nothing seen: everything is admitted",
                vec![],
                Priority::LOW,
            ),
            (
                "only admissions",
                [times(3, (low, true)), times(3, (high, true))].concat(),
                Priority::LOW,
            ),
            ("the lowest shed", times(2, (low, false)), above(low)),
            (
                "refusals must outnumber admissions: a tie is not shed",
                vec![(low, false), (low, true)],
                Priority::LOW,
            ),
            (
                "mostly refused is shed",
                [times(3, (low, false)), vec![(low, true)]].concat(),
                above(low),
            ),
            (
                "admissions after the refusals bring it back",
                [times(2, (low, false)), times(2, (low, true))].concat(),
                Priority::LOW,
            ),
            (
                "two shed, the next admitted",
                [
                    times(3, (low, false)),
                    times(3, (normal, false)),
                    times(3, (high, true)),
                ]
                .concat(),
                above(normal),
            ),
            (
                "a higher priority refused for its own reasons does not lift the level",
                [
                    times(3, (low, false)),
                    times(3, (normal, true)),
                    times(3, (high, false)),
                ]
                .concat(),
                above(low),
            ),
            (
                "the lowest priority admitted: nothing below it is known refused",
                [times(3, (low, true)), times(3, (high, false))].concat(),
                Priority::LOW,
            ),
            (
                "everything shed, the top included: capped at the top",
                [times(2, (normal, false)), times(2, (Priority::HIGH, false))].concat(),
                Priority::HIGH,
            ),
        ];
        for (name, outcomes, expected) in rows {
            assert_eq!(level_of(&outcomes), expected, "{name}");
        }
    }

    #[test]
    fn only_refusals_for_capacity_count() {
        let now = Instant::now();
        for error in AdmitError::one_of_each() {
            let mut windows = LevelWindows::new(now);
            windows.refused(Priority::NORMAL, &error, Some(now));
            let expected = if is_capacity(&error) {
                Priority::new(1)
            } else {
                Priority::LOW
            };
            assert_eq!(windows.level(), expected, "{error}");
        }
        let mut windows = LevelWindows::new(now);
        windows.refused(Priority::NORMAL, &FULL, None);
        assert_eq!(windows.level(), Priority::new(1));
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_are_remembered_until_the_second_roll_after_them() {
        let start = Instant::now();
        let (normal, high) = (Priority::NORMAL, Priority::USER_HIGH);
        let shed = Priority::new(1);
        let mut windows = LevelWindows::new(start);
        count(&mut windows, &[(normal, false)], start);
        assert_eq!(windows.level(), shed);
        // A window later, other work rolls the windows: the refusal is in
        // the previous one and still stands.
        let first_roll = start + LEVEL_WINDOW;
        count(&mut windows, &[(high, true)], first_roll);
        assert_eq!(windows.level(), shed);
        // An admission of its priority now weighs against it, across the
        // two windows: a tie is not shed.
        count(&mut windows, &[(normal, true)], first_roll);
        assert_eq!(windows.level(), Priority::LOW);
        count(
            &mut windows,
            &[(normal, false), (normal, false)],
            first_roll,
        );
        assert_eq!(windows.level(), shed);
        // Callers stop sending it: two rolls later it is forgotten, and so
        // tried again.
        count(&mut windows, &[(high, true)], first_roll + LEVEL_WINDOW);
        assert_eq!(windows.level(), shed);
        count(&mut windows, &[(high, true)], first_roll + LEVEL_WINDOW * 2);
        assert_eq!(windows.level(), Priority::LOW);
        assert_eq!(read_published(&windows.published()), Priority::LOW);
    }

    #[test]
    fn admissions_while_nothing_is_shed_read_no_clock_and_still_count() {
        let start = Instant::now();
        let mut windows = LevelWindows::new(start);
        // Counted without a time: nothing is shed, nothing to roll.
        for _ in 0..3 {
            windows.admitted(Priority::NORMAL, Duration::ZERO, None);
        }
        assert_eq!(windows.started, start);
        // Much later, a refusal rolls: the admissions, of unknown age, stay
        // as the previous window and outweigh it.
        let later = start + LEVEL_WINDOW * 50;
        windows.refused(Priority::NORMAL, &MISS, Some(later));
        assert_eq!(windows.level(), Priority::LOW);
    }

    #[test]
    fn the_recent_median_wait_comes_from_the_newest_window_with_admissions() {
        let start = Instant::now();
        let mut windows = LevelWindows::new(start);
        assert_eq!(windows.recent_wait_p50(), None);
        for micros in [1, 3, 3, 1000] {
            windows.admitted(Priority::NORMAL, Duration::from_micros(micros), Some(start));
        }
        assert_eq!(windows.recent_wait_p50(), Some(Duration::from_micros(4)));
        windows.refused(Priority::LOW, &MISS, Some(start + LEVEL_WINDOW));
        assert_eq!(
            windows.recent_wait_p50(),
            Some(Duration::from_micros(4)),
            "the previous window's, while the current has none"
        );
    }

    #[test]
    fn set_bits_come_out_lowest_first_across_words() {
        let mut words = [0u64; 4];
        for at in [0, 63, 64, 130, 255] {
            words[at / 64] |= 1 << (at % 64);
        }
        assert_eq!(
            SetBits::new(words).collect::<Vec<_>>(),
            [0, 63, 64, 130, 255]
        );
        for at in 0..256 {
            assert_eq!(index(priority_at(at)), at);
            assert_eq!(
                read_published(&StdAtomicU64::new(at as u64)).get() as u8,
                at as u8
            );
        }
        assert!(index(Priority::LOW) < index(Priority::NORMAL));
        assert!(index(Priority::NORMAL) < index(Priority::HIGH));
    }
}
