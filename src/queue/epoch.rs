//! Epoch-LIFO: serving newest-first a priority that has fallen behind.
//!
//! Under sustained overload with deadlines, FIFO is the worst order: by the
//! time an old request reaches the front its deadline has nearly passed,
//! so the queue spends its capacity on work that completes too late while
//! fresh work ages behind it. Serving newest-first keeps some requests fresh
//! enough to finish in time. Plain LIFO starves, so upstream (CockroachDB)
//! switches per tenant and per priority, by *epoch*:
//!
//! * Time is cut into epochs of `epoch` length from the queue's creation.
//!   Epoch `e` closes at `(e + 1) · epoch + closing_delta`.
//! * Each tenant has a threshold: work below it is LIFO-marked when it
//!   enqueues. A LIFO-marked request whose epoch is still open waits in a
//!   separate set, served after the tenant's ready work of its own priority
//!   and above but ahead of lower priorities' (behind those it would be a
//!   priority inversion); once its epoch closes it joins the others, ordered
//!   newest-first within its priority (and ahead of FIFO-marked work of the
//!   same priority).
//! * At each epoch close the threshold is recomputed from what the epoch saw
//!   per priority (the longest queueing delay, including that of requests
//!   cancelled or expired while waiting, and how many were admitted):
//!   a priority whose delay exceeded `lifo_delay` switches to LIFO with every
//!   priority below it; a priority already LIFO stays LIFO while its delay
//!   exceeds a tenth of the epoch, or while it was requested and nothing at
//!   it was admitted (hysteresis); otherwise it returns to FIFO.

use std::collections::BTreeMap;
use std::time::Duration;

pub(crate) use crate::policy::EpochLifo;
use crate::work::Priority;

/// The threshold meaning "nothing is LIFO": no priority is below it.
pub(crate) const ALL_FIFO: i16 = i8::MIN as i16;

/// Epoch-LIFO scaled to the deadlines requests carry, for
/// [`WorkQueueBuilder::epoch_lifo_from_deadlines`](crate::WorkQueueBuilder::epoch_lifo_from_deadlines).
///
/// The scale is the median of the time requests allow themselves (deadline
/// minus create time), estimated by a frugal streaming median (Ma,
/// Muthukrishnan and Sandler, 2013): each sample moves the estimate a 64th
/// of itself towards the sample, never past it. The estimate settles where
/// as many samples lie above as below, in constant memory and without
/// floating point; clients that send absurdly short or long deadlines move it
/// only as far as their share of the requests. The settings change only
/// when the estimate reaches twice or half the scale they were derived from,
/// so that a jittery mix of deadlines does not restart the epochs every
/// time.
#[derive(Debug, Default)]
pub(crate) struct DeadlineScale {
    estimate_nanos: u64,
    samples: u64,
    chosen: Option<Duration>,
}

impl DeadlineScale {
    /// Samples before the first settings are chosen: one request's deadline
    /// is not yet a workload's.
    pub(crate) const MIN_SAMPLES: u64 = 32;
    /// Shortest scale: [`EpochLifo::for_deadline`] cuts epochs of a fifth of
    /// it, and epochs are at least 100 µs.
    pub(crate) const SHORTEST: Duration = Duration::from_micros(500);
    /// Longest scale: epochs of at most an hour.
    pub(crate) const LONGEST: Duration = Duration::from_secs(5 * 3600);

    /// A request allowed itself `allowed` from its creation to its deadline.
    pub(crate) fn observe(&mut self, allowed: Duration) {
        let sample = u64::try_from(allowed.as_nanos()).unwrap_or(u64::MAX);
        let estimate = self.estimate_nanos;
        let step = (estimate / 64).max(1);
        self.estimate_nanos = if self.samples == 0 {
            sample
        } else if sample > estimate {
            estimate.saturating_add(step).min(sample)
        } else {
            estimate.saturating_sub(step).max(sample)
        };
        self.samples = self.samples.saturating_add(1);
    }

    /// The current estimate of the median deadline, once there are enough
    /// samples, within [`SHORTEST`](Self::SHORTEST)..=[`LONGEST`](Self::LONGEST).
    pub(crate) fn estimate(&self) -> Option<Duration> {
        (self.samples >= Self::MIN_SAMPLES)
            .then(|| Duration::from_nanos(self.estimate_nanos).clamp(Self::SHORTEST, Self::LONGEST))
    }

    /// New settings when there are none yet or the estimate has moved to at
    /// least twice or at most half the scale of the current ones.
    pub(crate) fn rechoose(&mut self) -> Option<EpochLifo> {
        let estimate = self.estimate()?;
        if let Some(chosen) = self.chosen {
            let grown = estimate >= chosen.saturating_mul(2);
            let shrunk = estimate.saturating_mul(2) <= chosen;
            if !grown && !shrunk {
                return None;
            }
        }
        self.chosen = Some(estimate);
        Some(EpochLifo::for_deadline(estimate))
    }
}

/// What one tenant's queue saw at one priority during the current epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    max_delay: Duration,
    admitted: u64,
}

/// Per-priority observations of one tenant for the current epoch.
#[derive(Debug, Default)]
pub(crate) struct PriorityStates {
    seen: BTreeMap<Priority, Seen>,
    lowest_requested: Option<Priority>,
}

impl PriorityStates {
    /// A request asked for admission at `priority`.
    pub(crate) fn requested(&mut self, priority: Priority) {
        self.lowest_requested = Some(self.lowest_requested.map_or(priority, |p| p.min(priority)));
    }

    /// A request at `priority` left the queue after `delay`: admitted, or
    /// cancelled or expired (its delay still counts, as a lower bound).
    pub(crate) fn waited(&mut self, priority: Priority, delay: Duration, admitted: bool) {
        let seen = self.seen.entry(priority).or_default();
        seen.max_delay = seen.max_delay.max(delay);
        if admitted {
            seen.admitted += 1;
        }
    }

    /// A request at `priority` was admitted without waiting.
    pub(crate) fn admitted_at_once(&mut self, priority: Priority) {
        self.waited(priority, Duration::ZERO, true);
    }

    /// The threshold for the next epoch, given the current one; forgets the
    /// epoch's observations.
    pub(crate) fn next_threshold(&mut self, current: i16, settings: &EpochLifo) -> i16 {
        // A priority that was requested but never left the queue still
        // counts: as requested, with nothing admitted.
        if let Some(lowest) = self.lowest_requested {
            self.seen.entry(lowest).or_default();
        }
        let mut threshold = ALL_FIFO;
        for (&priority, seen) in &self.seen {
            let p = i16::from(priority.get());
            if seen.max_delay > settings.lifo_delay {
                threshold = p + 1;
            } else if p < current {
                let still_slow = seen.max_delay > settings.epoch / 10;
                let starved = seen.admitted == 0
                    && self
                        .lowest_requested
                        .is_some_and(|lowest| priority >= lowest);
                if still_slow || starved {
                    threshold = p + 1;
                }
            }
        }
        self.seen.clear();
        self.lowest_requested = None;
        threshold
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn p(value: i8) -> Priority {
        Priority::new(value)
    }

    /// One epoch of a table: its name, what it saw as (priority, delay in
    /// ms, admitted), and the threshold expected after it closes.
    type EpochRow = (&'static str, &'static [(i8, u64, bool)], i16);

    /// Upstream's priority_states scenario, epoch by epoch.
    #[test]
    fn the_threshold_switches_on_delay_and_back_with_hysteresis() {
        let settings = EpochLifo::UPSTREAM;
        let mut states = PriorityStates::default();
        let rows: &[EpochRow] = &[
            // name, (priority, delay ms, admitted) seen in the epoch, threshold after
            (
                "the lowest priority waited 106 ms: it goes LIFO",
                &[(127, 10, true), (-128, 106, true), (0, 20, true)],
                -127,
            ),
            (
                "still 11 ms at the LIFO priority: stays LIFO",
                &[(-128, 11, true)],
                -127,
            ),
            (
                "10 ms is not above a tenth of the epoch: back to FIFO",
                &[(-128, 10, true)],
                ALL_FIFO,
            ),
            (
                "a cancelled request that waited 120 ms counts",
                &[(0, 120, false)],
                1,
            ),
            (
                "requested, nothing admitted: stays LIFO",
                &[(0, 0, false)],
                1,
            ),
            (
                "requested and admitted fast: back to FIFO",
                &[(0, 1, true)],
                ALL_FIFO,
            ),
            (
                "a slow priority takes every lower one with it",
                &[(-50, 1, true), (50, 200, true), (100, 1, true)],
                51,
            ),
        ];
        let mut current = ALL_FIFO;
        for &(name, seen, expected) in rows {
            for &(priority, delay, admitted) in seen {
                states.requested(p(priority));
                states.waited(p(priority), ms(delay), admitted);
            }
            current = states.next_threshold(current, &settings);
            assert_eq!(current, expected, "{name}");
        }
    }

    #[test]
    fn a_requested_priority_with_no_sample_counts_as_starved() {
        let settings = EpochLifo::UPSTREAM;
        let mut states = PriorityStates::default();
        states.requested(p(0));
        assert_eq!(states.next_threshold(1, &settings), 1, "still LIFO");
        // A lower priority admitted quickly, nothing asked at 0: FIFO again.
        states.requested(p(-10));
        states.waited(p(-10), ms(1), true);
        assert_eq!(states.next_threshold(1, &settings), ALL_FIFO);
    }

    #[test]
    fn an_epoch_with_nothing_seen_is_fifo() {
        let mut states = PriorityStates::default();
        assert_eq!(states.next_threshold(10, &EpochLifo::UPSTREAM), ALL_FIFO);
    }

    #[test]
    fn epochs_are_cut_from_the_origin_and_close_a_delta_late() {
        let settings = EpochLifo::UPSTREAM;
        let origin = Instant::now();
        assert_eq!(settings.epoch_of(origin, origin), 0);
        assert_eq!(settings.epoch_of(origin, origin + ms(99)), 0);
        assert_eq!(settings.epoch_of(origin, origin + ms(250)), 2);
        assert_eq!(settings.closes_at(origin, 0), Some(origin + ms(105)));
        assert_eq!(settings.closes_at(origin, 3), Some(origin + ms(405)));
        assert_eq!(settings.closes_at(origin, u64::MAX), None);
        // Past 2^32 epochs (a 32-bit multiplier would give up here).
        let later = u64::from(u32::MAX) + 2;
        assert_eq!(
            settings.closes_at(origin, later),
            Some(origin + ms(100) * 3 + ms(100) * u32::MAX + ms(5))
        );
    }

    #[test]
    fn the_deadline_scale_settles_on_the_median_and_moves_only_by_factors_of_two() {
        let mut scale = DeadlineScale::default();
        // Too few samples: nothing chosen yet.
        for _ in 0..DeadlineScale::MIN_SAMPLES - 1 {
            scale.observe(ms(5));
        }
        assert_eq!(scale.rechoose(), None);
        scale.observe(ms(5));
        assert_eq!(scale.rechoose(), Some(EpochLifo::for_deadline(ms(5))));
        // A minority of absurd deadlines (a third: one in three requests)
        // leaves the median where the majority is.
        for i in 0..3_000u32 {
            scale.observe(match i % 3 {
                0 => Duration::from_nanos(1),
                1 => ms(5),
                _ => ms(6),
            });
        }
        // Within a step (a 64th) of the median, 5 ms.
        let settled = scale.estimate().unwrap();
        assert!(
            settled >= ms(5) - ms(5) / 32 && settled <= ms(5) + ms(5) / 32,
            "{settled:?}"
        );
        assert_eq!(scale.rechoose(), None, "within a factor of two: kept");
        // The workload moves to 40 ms deadlines: new settings, once.
        for _ in 0..1_000 {
            scale.observe(ms(40));
        }
        assert_eq!(scale.rechoose(), Some(EpochLifo::for_deadline(ms(40))));
        assert_eq!(scale.rechoose(), None);
    }

    #[test]
    fn the_deadline_scale_is_clamped_to_valid_settings() {
        for allowed in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            let mut scale = DeadlineScale::default();
            for _ in 0..DeadlineScale::MIN_SAMPLES {
                scale.observe(allowed);
            }
            let settings = scale.rechoose().expect("enough samples");
            assert!(settings.validate().is_ok(), "{allowed:?}: {settings:?}");
        }
    }

    #[test]
    fn settings_are_validated_naming_the_field() {
        let mut bad = EpochLifo::UPSTREAM;
        bad.closing_delta = ms(100);
        assert_eq!(
            bad.validate().unwrap_err().field(),
            "epoch_lifo.closing_delta"
        );
        bad = EpochLifo::UPSTREAM;
        bad.epoch = Duration::ZERO;
        assert_eq!(bad.validate().unwrap_err().field(), "epoch_lifo.epoch");
        let scaled = EpochLifo::for_deadline(ms(5));
        assert!(scaled.validate().is_ok());
        assert_eq!(
            (scaled.epoch, scaled.lifo_delay),
            (ms(1), Duration::from_micros(2500))
        );
    }
}
