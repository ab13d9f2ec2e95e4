//! From L0 debt to next interval's byte tokens (upstream's `ioLoadListener`).
//!
//! Every interval the listener reads the engine's [`LsmStats`] and computes:
//!
//! * the bytes compacted out of L0 during the interval: the growth of the
//!   engine's own counter where it reports one
//!   ([`LsmStats::compacted_bytes`]), else `previous L0 size + bytes added
//!   − current L0 size`; at least zero either way, and smoothed with an
//!   EWMA (α = 0.5) into `C`, what compactions can remove per interval;
//! * an overload score `s = 2 · max(files / file threshold,
//!   sub-levels / sub-level threshold)` (doubled, as upstream: `s = 1` is
//!   half the thresholds);
//! * **regular** tokens: unlimited while `s < 0.5`; then `C·(3 − 2s)` (2C
//!   down to C) up to `s = 1`, `C/2·(3 − s)` (C down to C/2) up to `s = 2`,
//!   and `C/2` beyond, so compactions out-pace admitted writes and the debt
//!   shrinks; smoothed with the previous interval's;
//! * **elastic** tokens: unlimited while `s < 0.2`; then
//!   `C·(1.25 − 1.25·(s − 0.2))`, at least 1 and never more than regular:
//!   1.25C at two sub-levels, nothing (1) from twelve. Elastic work is
//!   throttled earlier and harder than regular work.
//!
//! Counter deltas are clamped at zero and all arithmetic saturates, so
//! whatever the engine reports the tokens are never negative and never
//! overflow. The first interval has no history and is unlimited.

use std::time::Duration;

use super::stats::LsmStats;
use crate::error::ConfigError;

/// The score from which the elastic formula `C·(1.25 − 1.25·(s − 0.2))`
/// gives nothing: 1.2, twelve sub-levels at upstream's threshold of twenty.
pub(crate) const ELASTIC_EXHAUSTED_SCORE: f64 = 1.2;

/// A budget of byte tokens for one interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// No limit: L0 is healthy.
    Unlimited,
    /// At most this many bytes this interval.
    Limited(u64),
}

/// Listener settings, validated by [`IoLoadListener::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IoLoadConfig {
    /// How often tokens are recomputed (upstream: 15 s).
    pub(crate) interval: Duration,
    /// L0 files counted as fully overloaded (upstream: 1,000).
    pub(crate) l0_file_threshold: u64,
    /// L0 sub-levels counted as fully overloaded (upstream: 20).
    pub(crate) l0_sublevel_threshold: u64,
    /// Unflushed memtables at which the engine stops all writes (Pebble and
    /// fjall: 4), or `None` to ignore the flush backlog. From half of it,
    /// elastic work is held back: its tokens for the next interval are
    /// capped at the bytes compactions removed (upstream's rule), and the
    /// controller pauses its elastic drip on every tick
    /// that sees the backlog there.
    pub(crate) memtable_stop_threshold: Option<u64>,
    /// The regular budget, in bytes per second, of an
    /// controller whose stats source has failed
    /// for [`STATS_FAILURES_BEFORE_FALLBACK`](super::STATS_FAILURES_BEFORE_FALLBACK)
    /// intervals in a row, unless compactions were last seen removing more
    /// (then half of that, the listener's own most conservative budget).
    /// Default 16 MiB/s: what an LSM on any disk compacts, so a store whose
    /// state is unknown neither stops nor floods.
    pub(crate) stats_failure_bytes_per_second: u64,
}

impl IoLoadConfig {
    /// Accepted intervals: from one loaded tick to an hour (a longer one
    /// would leave a store's budget unrevised for hours).
    pub(crate) const INTERVAL_RANGE: std::ops::RangeInclusive<Duration> =
        Duration::from_millis(1)..=Duration::from_secs(3600);
    /// The largest L0 file threshold accepted (upstream: 1,000); a
    /// threshold no engine reaches would silently turn the limit off.
    pub(crate) const MAX_L0_FILE_THRESHOLD: u64 = 1_000_000;
    /// The largest L0 sub-level threshold accepted (upstream: 20).
    pub(crate) const MAX_L0_SUBLEVEL_THRESHOLD: u64 = 10_000;
    /// The largest memtable stop threshold accepted (Pebble and fjall: 4).
    pub(crate) const MAX_MEMTABLE_STOP_THRESHOLD: u64 = 10_000;
}

impl Default for IoLoadConfig {
    fn default() -> Self {
        IoLoadConfig {
            interval: Duration::from_secs(15),
            l0_file_threshold: 1_000,
            l0_sublevel_threshold: 20,
            memtable_stop_threshold: None,
            stats_failure_bytes_per_second: 16 << 20,
        }
    }
}

/// One interval's decision and the inputs that led to it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IntervalTokens {
    /// Tokens for regular work (priority zero and above).
    pub regular: Tokens,
    /// Tokens for elastic work (below zero).
    pub elastic: Tokens,
    /// The doubled overload score.
    pub score: f64,
    /// Bytes compacted out of L0 during the interval.
    pub compacted: u64,
    /// The smoothed compaction throughput, bytes per interval.
    pub smoothed_compacted: u64,
    /// Bytes added to L0 during the interval.
    pub added: u64,
}

/// Computes each interval's tokens from the engine's stats; see the
/// [`io` module documentation](crate::io).
#[derive(Clone, Debug)]
pub(crate) struct IoLoadListener {
    config: IoLoadConfig,
    previous: Option<LsmStats>,
    smoothed_compacted: f64,
    previous_regular: Option<f64>,
}

impl IoLoadListener {
    /// A listener with `config`, or a [`ConfigError`] naming the field that
    /// is out of its range (see the constants on [`IoLoadConfig`]).
    pub(crate) fn new(config: IoLoadConfig) -> Result<Self, ConfigError> {
        let range = IoLoadConfig::INTERVAL_RANGE;
        if !range.contains(&config.interval) {
            return Err(ConfigError::new(
                "interval",
                format!(
                    "{:?} is outside the accepted range {range:?}",
                    config.interval
                ),
            ));
        }
        if !(1..=IoLoadConfig::MAX_L0_FILE_THRESHOLD).contains(&config.l0_file_threshold) {
            return Err(ConfigError::out_of_range(
                "l0_file_threshold",
                config.l0_file_threshold,
                1,
                IoLoadConfig::MAX_L0_FILE_THRESHOLD,
            ));
        }
        if !(1..=IoLoadConfig::MAX_L0_SUBLEVEL_THRESHOLD).contains(&config.l0_sublevel_threshold) {
            return Err(ConfigError::out_of_range(
                "l0_sublevel_threshold",
                config.l0_sublevel_threshold,
                1,
                IoLoadConfig::MAX_L0_SUBLEVEL_THRESHOLD,
            ));
        }
        if let Some(stop) = config.memtable_stop_threshold {
            if !(1..=IoLoadConfig::MAX_MEMTABLE_STOP_THRESHOLD).contains(&stop) {
                return Err(ConfigError::new(
                    "memtable_stop_threshold",
                    format!(
                        "{stop} is outside the accepted range 1..={} (or None to ignore the flush backlog)",
                        IoLoadConfig::MAX_MEMTABLE_STOP_THRESHOLD
                    ),
                ));
            }
        }
        if config.stats_failure_bytes_per_second == 0 {
            return Err(ConfigError::new(
                "stats_failure_bytes_per_second",
                "0 would stop every writer while the stats source fails; use at least 1",
            ));
        }
        Ok(IoLoadListener {
            config,
            previous: None,
            smoothed_compacted: 0.0,
            previous_regular: None,
        })
    }

    /// The next interval's tokens, from the stats read at its start. Each
    /// call, the first (unlimited, without history) included, is one
    /// `tracing` event (target `admission::io`, level INFO) with the
    /// readings it used and the decision.
    #[cfg(test)]
    pub(crate) fn next_interval(&mut self, stats: &LsmStats) -> IntervalTokens {
        self.next_interval_spanning(stats, 1)
    }

    /// [`next_interval`](Self::next_interval) for a reading that comes
    /// `intervals` intervals after the previous one (the readings between
    /// failed): the bytes added and compacted are averaged over them, so a
    /// gap does not read as one interval of several intervals' throughput.
    pub(crate) fn next_interval_spanning(
        &mut self,
        stats: &LsmStats,
        intervals: u64,
    ) -> IntervalTokens {
        let intervals = intervals.max(1);
        let decision = self.decide(stats, intervals);
        tracing::info!(
            target: "admission::io",
            intervals,
            l0_files = stats.l0_files,
            l0_sublevels = stats.l0_sublevels,
            l0_bytes = stats.l0_bytes,
            unflushed_memtables = stats.unflushed_memtables,
            added = decision.added,
            compacted = decision.compacted,
            smoothed_compacted = decision.smoothed_compacted,
            score = decision.score,
            regular = ?decision.regular,
            elastic = ?decision.elastic,
            "IO tokens for the next interval"
        );
        decision
    }

    fn decide(&mut self, stats: &LsmStats, intervals: u64) -> IntervalTokens {
        let Some(previous) = self.previous.replace(*stats) else {
            return IntervalTokens {
                regular: Tokens::Unlimited,
                elastic: Tokens::Unlimited,
                score: self.score(stats),
                compacted: 0,
                smoothed_compacted: 0,
                added: 0,
            };
        };
        let added_since = stats
            .flushed_bytes
            .saturating_sub(previous.flushed_bytes)
            .saturating_add(stats.ingested_bytes.saturating_sub(previous.ingested_bytes));
        let compacted_since = match (stats.compacted_bytes, previous.compacted_bytes) {
            (Some(now), Some(before)) => now.saturating_sub(before),
            // An engine that starts or stops counting between two readings
            // is judged by its L0 bytes for that interval.
            _ => previous
                .l0_bytes
                .saturating_add(added_since)
                .saturating_sub(stats.l0_bytes),
        };
        let added = added_since / intervals;
        let compacted = compacted_since / intervals;
        self.smoothed_compacted = if self.smoothed_compacted == 0.0 {
            compacted as f64
        } else {
            0.5 * compacted as f64 + 0.5 * self.smoothed_compacted
        };
        let c = self.smoothed_compacted;
        let score = self.score(stats);

        let regular = if score < 0.5 {
            self.previous_regular = None;
            None
        } else {
            let target = if score < 1.0 {
                c * (3.0 - 2.0 * score)
            } else if score < 2.0 {
                c / 2.0 * (3.0 - score)
            } else {
                c / 2.0
            };
            let smoothed = match self.previous_regular {
                Some(previous) => 0.5 * target + 0.5 * previous,
                None => target,
            };
            self.previous_regular = Some(smoothed);
            Some(smoothed)
        };
        let elastic = (score >= 0.2).then(|| {
            let target = (c * (1.25 - 1.25 * (score - 0.2))).max(1.0);
            regular.map_or(target, |regular| target.min(regular))
        });
        // A flush backlog: elastic work gets no more than compactions
        // removed, whatever L0 looks like, so it stops feeding memtables
        // the flushes cannot keep up with.
        let elastic = if self.flush_backlogged(stats.unflushed_memtables) {
            Some(elastic.map_or(compacted as f64, |e| e.min(compacted as f64)))
        } else {
            elastic
        };
        let to_tokens = |value: Option<f64>| match value {
            None => Tokens::Unlimited,
            // Saturating float-to-int cast; at least one token, so a
            // throttled class still makes progress.
            Some(bytes) => Tokens::Limited((bytes as u64).max(1)),
        };
        IntervalTokens {
            regular: to_tokens(regular),
            elastic: to_tokens(elastic),
            score,
            compacted,
            smoothed_compacted: c as u64,
            added,
        }
    }

    /// Whether `unflushed` memtables are at least half the engine's stop
    /// threshold.
    pub(crate) fn flush_backlogged(&self, unflushed: Option<u64>) -> bool {
        match (unflushed, self.config.memtable_stop_threshold) {
            (Some(unflushed), Some(stop)) => unflushed.saturating_mul(2) >= stop,
            _ => false,
        }
    }

    /// Whether a tick's reading says elastic work must wait now: a flush
    /// backlog, or an L0 score at which the elastic formula gives nothing
    /// ([`ELASTIC_EXHAUSTED_SCORE`], twelve sub-levels of twenty). Between
    /// two intervals L0 can go from healthy to that within a fraction of a
    /// second; holding elastic tokens on the tick that sees it keeps the
    /// pile-up from reaching the engine's own stall.
    pub(crate) fn holds_elastic(&self, reading: &LsmStats) -> bool {
        self.flush_backlogged(reading.unflushed_memtables)
            || self.score(reading) >= ELASTIC_EXHAUSTED_SCORE
    }

    fn score(&self, stats: &LsmStats) -> f64 {
        let files = stats.l0_files as f64 / self.config.l0_file_threshold as f64;
        let sublevels = stats
            .l0_sublevels
            .map_or(0.0, |n| n as f64 / self.config.l0_sublevel_threshold as f64);
        2.0 * files.max(sublevels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u64 = 100 << 20;

    fn stats(sublevels: u64, l0_bytes: u64, flushed: u64) -> LsmStats {
        LsmStats {
            l0_files: sublevels,
            l0_sublevels: Some(sublevels),
            l0_bytes,
            flushed_bytes: flushed,
            ..LsmStats::default()
        }
    }

    /// A listener that has seen one interval compacting exactly `C` bytes
    /// out of L0, then reads `sublevels` sub-levels with another `C`
    /// compacted.
    fn after_steady_compaction(sublevels: u64) -> (IoLoadListener, IntervalTokens) {
        let mut listener = IoLoadListener::new(IoLoadConfig::default()).unwrap();
        assert_eq!(
            listener.next_interval(&stats(0, 0, 0)).regular,
            Tokens::Unlimited
        );
        // Each interval adds C and compacts C: L0 stays empty.
        listener.next_interval(&stats(0, 0, C));
        let tokens = listener.next_interval(&stats(sublevels, 0, 2 * C));
        (listener, tokens)
    }

    #[test]
    fn tokens_follow_the_debt_as_a_table() {
        let c = C as f64;
        // sub-levels, regular (None = unlimited), elastic (None = unlimited)
        let rows: &[(u64, Option<f64>, Option<f64>)] = &[
            (0, None, None),
            (2, None, Some(1.25 * c)),
            (4, None, Some(1.0 * c)),
            (6, Some(c * (3.0 - 2.0 * 0.6)), Some(0.75 * c)),
            (10, Some(c), Some(0.25 * c)),
            (12, Some(c / 2.0 * (3.0 - 1.2)), Some(1.0)),
            (40, Some(c / 2.0), Some(1.0)),
        ];
        for &(sublevels, regular, elastic) in rows {
            let (_, tokens) = after_steady_compaction(sublevels);
            let expect =
                |value: Option<f64>| value.map_or(Tokens::Unlimited, |v| Tokens::Limited(v as u64));
            assert_eq!(
                tokens.regular,
                expect(regular),
                "regular at {sublevels} sub-levels"
            );
            assert_eq!(
                tokens.elastic,
                expect(elastic),
                "elastic at {sublevels} sub-levels"
            );
            assert_eq!(tokens.smoothed_compacted, C);
        }
    }

    #[test]
    fn regular_tokens_are_smoothed_across_intervals() {
        let (mut listener, first) = after_steady_compaction(40);
        assert_eq!(first.regular, Tokens::Limited(C / 2));
        // Still 40 sub-levels, but nothing compacted this time: the smoothed
        // throughput halves, and the tokens move halfway towards its half.
        let next = listener.next_interval(&stats(40, 0, 2 * C));
        assert_eq!(next.smoothed_compacted, C / 2);
        assert_eq!(next.regular, Tokens::Limited((C / 2 + C / 4) / 2));
    }

    #[test]
    fn elastic_never_exceeds_regular() {
        let (_, tokens) = after_steady_compaction(7);
        let (Tokens::Limited(regular), Tokens::Limited(elastic)) = (tokens.regular, tokens.elastic)
        else {
            panic!("both limited at 7 sub-levels: {tokens:?}");
        };
        assert!(elastic <= regular);
    }

    mod any_readings {
        use super::*;
        use proptest::prelude::*;

        /// Mostly engine-sized numbers, sometimes anything at all.
        fn count() -> impl Strategy<Value = u64> {
            prop_oneof![4 => 0u64..64, 2 => 0u64..(1 << 40), 1 => any::<u64>()]
        }

        fn reading() -> impl Strategy<Value = LsmStats> {
            (
                count(),
                proptest::option::of(count()),
                count(),
                count(),
                count(),
                proptest::option::of(count()),
                proptest::option::of(0u64..8),
            )
                .prop_map(
                    |(files, sublevels, l0_bytes, flushed, ingested, compacted, unflushed)| {
                        LsmStats {
                            l0_files: files,
                            l0_sublevels: sublevels,
                            l0_bytes,
                            flushed_bytes: flushed,
                            ingested_bytes: ingested,
                            compacted_bytes: compacted,
                            write_stalls: 0,
                            unflushed_memtables: unflushed,
                        }
                    },
                )
        }

        proptest! {
            /// Whatever an engine reports, in whatever order: budgets are at
            /// least one byte, elastic work is limited whenever regular work
            /// is and never gets more, and a healthy L0 with no flush backlog
            /// is unlimited.
            #[test]
            fn tokens_keep_their_invariants(
                readings in proptest::collection::vec(reading(), 1..24),
                sublevel_threshold in 1u64..64,
                file_threshold in 1u64..2_000,
            ) {
                let config = IoLoadConfig {
                    l0_sublevel_threshold: sublevel_threshold,
                    l0_file_threshold: file_threshold,
                    memtable_stop_threshold: Some(4),
                    ..IoLoadConfig::default()
                };
                let mut listener = IoLoadListener::new(config).unwrap();
                for reading in &readings {
                    let tokens = listener.next_interval(reading);
                    prop_assert!(tokens.score.is_finite() && tokens.score >= 0.0);
                    for budget in [tokens.regular, tokens.elastic] {
                        if let Tokens::Limited(bytes) = budget {
                            prop_assert!(bytes >= 1, "{:?}", tokens);
                        }
                    }
                    match (tokens.regular, tokens.elastic) {
                        (Tokens::Limited(regular), Tokens::Limited(elastic)) => {
                            prop_assert!(elastic <= regular, "{:?}", tokens)
                        }
                        (Tokens::Limited(_), Tokens::Unlimited) => {
                            prop_assert!(false, "regular limited, elastic not: {:?}", tokens)
                        }
                        _ => {}
                    }
                    if tokens.score < 0.5 {
                        prop_assert_eq!(tokens.regular, Tokens::Unlimited);
                    }
                    if tokens.score < 0.2 && !listener.flush_backlogged(reading.unflushed_memtables) {
                        prop_assert_eq!(tokens.elastic, Tokens::Unlimited);
                    }
                }
            }
        }
    }

    #[test]
    fn garbage_and_regressing_counters_never_give_negative_or_overflowing_tokens() {
        let mut listener = IoLoadListener::new(IoLoadConfig::default()).unwrap();
        let readings = [
            stats(30, u64::MAX, u64::MAX),
            stats(30, 0, 0),        // counters went backwards
            stats(30, u64::MAX, 5), // L0 grew more than anything added
            stats(u64::MAX, 3, u64::MAX),
            LsmStats::default(),
            LsmStats {
                compacted_bytes: Some(u64::MAX),
                ..stats(30, 0, 0)
            },
            LsmStats {
                compacted_bytes: Some(0), // the engine's counter went backwards
                ..stats(30, u64::MAX, u64::MAX)
            },
        ];
        for reading in readings {
            let tokens = listener.next_interval(&reading);
            for budget in [tokens.regular, tokens.elastic] {
                if let Tokens::Limited(bytes) = budget {
                    assert!(bytes >= 1, "{tokens:?}");
                }
            }
            assert!(tokens.score.is_finite() && tokens.score >= 0.0);
        }
    }

    #[test]
    fn a_reported_compaction_counter_is_used_over_the_l0_arithmetic() {
        let reading = |l0_bytes, flushed, compacted| LsmStats {
            compacted_bytes: compacted,
            ..stats(10, l0_bytes, flushed)
        };
        let mut listener = IoLoadListener::new(IoLoadConfig::default()).unwrap();
        listener.next_interval(&reading(0, 0, Some(0)));
        // L0 arithmetic would say 3C - C = 2C left L0; the engine counted C
        // (say the rest was dropped by a range deletion, or mis-sized).
        let tokens = listener.next_interval(&reading(C, 3 * C, Some(C)));
        assert_eq!((tokens.added, tokens.compacted), (3 * C, C));
        // At a score of 1 regular tokens are exactly C.
        assert_eq!(tokens.regular, Tokens::Limited(C));

        // A counter that went backwards counts as nothing compacted.
        let tokens = listener.next_interval(&reading(C, 3 * C, Some(C / 2)));
        assert_eq!(tokens.compacted, 0);

        // An engine that stops counting is judged by its L0 bytes for the
        // interval that lacks the counter on either side.
        let tokens = listener.next_interval(&reading(0, 4 * C, None));
        assert_eq!(tokens.compacted, 2 * C, "C in L0 + C flushed - 0 left");
        let tokens = listener.next_interval(&reading(0, 5 * C, Some(9 * C)));
        assert_eq!(tokens.compacted, C, "C flushed, L0 still empty");
        let tokens = listener.next_interval(&reading(0, 5 * C, Some(10 * C)));
        assert_eq!(tokens.compacted, C, "the counter again");
    }

    #[test]
    fn engines_without_sublevels_are_judged_by_files() {
        let mut listener = IoLoadListener::new(IoLoadConfig::default()).unwrap();
        let files = |n| LsmStats {
            l0_files: n,
            ..LsmStats::default()
        };
        listener.next_interval(&files(0));
        assert_eq!(listener.next_interval(&files(1_000)).score, 2.0);
    }

    #[test]
    fn zero_settings_are_rejected_naming_the_field() {
        let bad = |config: IoLoadConfig| IoLoadListener::new(config).unwrap_err().field();
        let base = IoLoadConfig::default();
        assert_eq!(
            bad(IoLoadConfig {
                interval: Duration::ZERO,
                ..base
            }),
            "interval"
        );
        assert_eq!(
            bad(IoLoadConfig {
                l0_file_threshold: 0,
                ..base
            }),
            "l0_file_threshold"
        );
        assert_eq!(
            bad(IoLoadConfig {
                l0_sublevel_threshold: 0,
                ..base
            }),
            "l0_sublevel_threshold"
        );
        assert_eq!(
            bad(IoLoadConfig {
                memtable_stop_threshold: Some(0),
                ..base
            }),
            "memtable_stop_threshold"
        );
    }

    #[test]
    fn a_tick_holds_elastic_work_where_its_formula_runs_out() {
        let listener = IoLoadListener::new(IoLoadConfig {
            memtable_stop_threshold: Some(4),
            ..IoLoadConfig::default()
        })
        .unwrap();
        // Twelve sub-levels of twenty: s = 1.2, elastic tokens are gone.
        assert!(!listener.holds_elastic(&stats(11, 0, 0)));
        assert!(listener.holds_elastic(&stats(12, 0, 0)));
        let backlog = LsmStats {
            unflushed_memtables: Some(2),
            ..stats(0, 0, 0)
        };
        assert!(listener.holds_elastic(&backlog));
        let files = LsmStats {
            l0_files: 600,
            ..LsmStats::default()
        };
        assert!(listener.holds_elastic(&files), "files count too");
    }

    #[test]
    fn a_flush_backlog_caps_elastic_tokens_at_the_compacted_bytes() {
        let config = IoLoadConfig {
            memtable_stop_threshold: Some(4),
            ..IoLoadConfig::default()
        };
        let mut listener = IoLoadListener::new(config).unwrap();
        assert!(!listener.flush_backlogged(Some(1)));
        assert!(
            listener.flush_backlogged(Some(2)),
            "half the stop threshold"
        );
        assert!(
            !listener.flush_backlogged(None),
            "an engine that does not say"
        );

        listener.next_interval(&stats(0, 0, 0));
        let backlog = |unflushed| LsmStats {
            unflushed_memtables: Some(unflushed),
            ..stats(0, 0, C)
        };
        // L0 is empty (both classes would be unlimited), but two memtables
        // wait: elastic work gets what compactions removed, regular work
        // is untouched.
        let held = listener.next_interval(&backlog(2));
        assert_eq!(held.regular, Tokens::Unlimited);
        assert_eq!(held.elastic, Tokens::Limited(C));
        let mut next = backlog(1);
        next.flushed_bytes = 2 * C;
        assert_eq!(listener.next_interval(&next).elastic, Tokens::Unlimited);

        // Without a threshold the backlog is ignored.
        let mut ignoring = IoLoadListener::new(IoLoadConfig::default()).unwrap();
        ignoring.next_interval(&stats(0, 0, 0));
        assert_eq!(
            ignoring.next_interval(&backlog(4)).elastic,
            Tokens::Unlimited
        );
    }
}
