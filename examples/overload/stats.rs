//! Statistics over the records of one overload run.
//!
//! The load is open-loop: every request has an intended send time fixed by
//! the schedule, and every latency here counts from that time, so a stalled
//! generator or a slow admission path shows up as latency instead of quietly
//! sending fewer requests (coordinated omission).

// used by the scenarios in main.rs
#![allow(dead_code)]

use std::fmt;
use std::time::Duration;

use admission::Priority;
use hdrhistogram::Histogram;

/// How one scheduled request ended; latencies are from its intended send time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// Ran to completion, within the SLO or not.
    Completed {
        /// From the intended send time to completion.
        latency: Duration,
    },
    /// Refused by admission control: queue full, shed, or its deadline had
    /// already passed before it could queue.
    Rejected {
        /// From the intended send time to the refusal.
        latency: Duration,
    },
    /// Its admission deadline passed while it waited for a permit.
    Expired {
        /// From the intended send time to the expiry.
        latency: Duration,
    },
    /// Still queued or running when the run ended; its latency is censored.
    Unfinished,
}

/// One scheduled request of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record {
    /// Priority class index.
    pub class: usize,
    /// Tenant index.
    pub tenant: usize,
    /// When the schedule meant to send it, as an offset from the run start.
    pub intended: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// Latency percentiles of a set of samples, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest sample, exact even beyond the histogram's range.
    pub max_ms: f64,
}

// One nanosecond to one minute at three significant digits: a minute is far
// beyond any run's SLO, and 0.1% is finer than the scheduler's jitter.
const LOWEST_NS: u64 = 1;
const HIGHEST_NS: u64 = 60_000_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latency percentiles of class `class`: its completed requests plus its
/// unfinished ones, which are censored at their age when the run ended at
/// `run_end` rather than dropped, so that a system which never answers cannot
/// look fast.
pub fn latency_of_class(records: &[Record], class: usize, run_end: Duration) -> Percentiles {
    summarize(
        records
            .iter()
            .filter(|record| record.class == class)
            .filter_map(|record| served_latency(record, run_end)),
    )
}

/// Percentiles of arbitrary samples, e.g. how late the generator sent
/// requests relative to their intended time.
pub fn percentiles_of(values: &[Duration]) -> Percentiles {
    summarize(values.iter().copied())
}

/// Completions within `slo` per second of `measured`; 0 when nothing was
/// measured.
pub fn goodput_per_sec(records: &[Record], slo: Duration, measured: Duration) -> f64 {
    if measured.is_zero() {
        return 0.0;
    }
    let good = records
        .iter()
        .filter(|record| within_slo(&record.outcome, slo))
        .count();
    good as f64 / measured.as_secs_f64()
}

/// Fraction of `records` whose outcome `pick` selects; 0 when there are none.
pub fn fraction(records: &[Record], pick: impl Fn(&Outcome) -> bool) -> f64 {
    if records.is_empty() {
        return 0.0;
    }
    let picked = records
        .iter()
        .filter(|record| pick(&record.outcome))
        .count();
    picked as f64 / records.len() as f64
}

/// Fraction of class `class`'s requests completed within `slo`, out of all
/// it scheduled (refused, expired and unfinished ones count as not served);
/// `None` when the class scheduled nothing.
pub fn served_within_slo(records: &[Record], class: usize, slo: Duration) -> Option<f64> {
    let of_class: Vec<&Record> = records.iter().filter(|r| r.class == class).collect();
    if of_class.is_empty() {
        return None;
    }
    let served = of_class
        .iter()
        .filter(|record| within_slo(&record.outcome, slo))
        .count();
    Some(served as f64 / of_class.len() as f64)
}

/// One class's share of its requests served within the SLO.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassServed {
    pub name: String,
    pub priority: Priority,
    /// `None` when the class scheduled nothing: there is nothing to compare.
    pub within_slo: Option<f64>,
}

/// A class served within the SLO less often than a class of lower priority.
#[derive(Clone, Debug, PartialEq)]
pub struct Inversion {
    pub higher: String,
    pub higher_within_slo: f64,
    pub lower: String,
    pub lower_within_slo: f64,
}

impl fmt::Display for Inversion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:.1}% served within SLO < {} {:.1}%",
            self.higher,
            self.higher_within_slo * 100.0,
            self.lower,
            self.lower_within_slo * 100.0
        )
    }
}

/// How far below a lower-priority class a higher one may be served before
/// it counts as an inversion: when every class is served near 100%, a few
/// requests of scheduler jitter move the fractions by tenths of a point,
/// which is noise, not priority turned upside down.
pub const INVERSION_MARGIN: f64 = 0.005;

/// Every pair of classes where the higher priority was served within the
/// SLO by more than `margin` less often than the lower one, highest
/// priority first. Classes without requests are not compared; classes of
/// equal priority are not ordered, so never inverted.
pub fn priority_inversions(classes: &[ClassServed], margin: f64) -> Vec<Inversion> {
    let mut by_priority: Vec<(&ClassServed, f64)> = classes
        .iter()
        .filter_map(|class| class.within_slo.map(|frac| (class, frac)))
        .collect();
    by_priority.sort_by_key(|&(class, _)| std::cmp::Reverse(class.priority));
    let mut found = Vec::new();
    for (index, &(higher, higher_frac)) in by_priority.iter().enumerate() {
        for &(lower, lower_frac) in &by_priority[index + 1..] {
            if lower.priority < higher.priority && higher_frac < lower_frac - margin {
                found.push(Inversion {
                    higher: higher.name.clone(),
                    higher_within_slo: higher_frac,
                    lower: lower.name.clone(),
                    lower_within_slo: lower_frac,
                });
            }
        }
    }
    found
}

/// Weighted max-min fair shares of `capacity` (water-filling): no tenant gets
/// more than it demands, and what a satisfied tenant leaves is split by weight
/// among the others.
///
/// Non-finite or negative demands, weights and capacity count as 0, and so
/// does a weight missing from `weights`; a tenant with weight 0 gets nothing.
/// The shares sum to the smaller of the capacity and the total demand of the
/// tenants with a positive weight.
pub fn weighted_max_min(demands: &[f64], weights: &[f64], capacity: f64) -> Vec<f64> {
    let demands: Vec<f64> = demands.iter().copied().map(non_negative).collect();
    let weight_of = |tenant: usize| weights.get(tenant).copied().map_or(0.0, non_negative);
    let mut shares = vec![0.0; demands.len()];
    let mut unsatisfied: Vec<usize> = (0..demands.len())
        .filter(|&tenant| demands[tenant] > 0.0 && weight_of(tenant) > 0.0)
        .collect();
    let mut left = non_negative(capacity);
    while !unsatisfied.is_empty() && left > 0.0 {
        let total_weight: f64 = unsatisfied.iter().map(|&tenant| weight_of(tenant)).sum();
        let per_weight = left / total_weight;
        let (satisfied, still_wanting): (Vec<usize>, Vec<usize>) = unsatisfied
            .iter()
            .partition(|&&tenant| demands[tenant] <= per_weight * weight_of(tenant));
        if satisfied.is_empty() {
            for &tenant in &still_wanting {
                shares[tenant] = per_weight * weight_of(tenant);
            }
            break;
        }
        // Only the tenants that fit under this water level are settled; the
        // level rises for the rest with what they leave behind.
        for &tenant in &satisfied {
            shares[tenant] = demands[tenant];
            left -= demands[tenant];
        }
        left = left.max(0.0);
        unsatisfied = still_wanting;
    }
    shares
}

/// Jain's fairness index of each tenant's allocation relative to its fair
/// share: 1.0 when every tenant got the same fraction of its share, 1/n when
/// one tenant got everything.
///
/// Tenants whose fair share is 0 (or not a positive finite number) are
/// skipped since they had nothing to be fair about; non-finite or negative
/// allocations count as 0. Returns 1.0 when no tenant is left, or when every
/// tenant got nothing (they were treated equally).
pub fn jain(allocations: &[f64], fair_shares: &[f64]) -> f64 {
    let ratios: Vec<f64> = allocations
        .iter()
        .zip(fair_shares)
        .filter(|&(_, &fair)| fair.is_finite() && fair > 0.0)
        .map(|(&allocation, &fair)| non_negative(allocation) / fair)
        .collect();
    let largest = ratios.iter().copied().fold(0.0, f64::max);
    if largest == 0.0 {
        return 1.0;
    }
    // The index is scale-free, so scaling by the largest ratio keeps the
    // squares from overflowing; an infinite ratio (a tiny fair share)
    // dominates all finite ones, which is the limit the formula tends to.
    let scaled: Vec<f64> = ratios
        .iter()
        .map(|&ratio| match (largest.is_finite(), ratio.is_finite()) {
            (true, _) => ratio / largest,
            (false, false) => 1.0,
            (false, true) => 0.0,
        })
        .collect();
    let sum: f64 = scaled.iter().sum();
    let sum_of_squares: f64 = scaled.iter().map(|x| x * x).sum();
    sum * sum / (scaled.len() as f64 * sum_of_squares)
}

/// One time window of a run, keyed by intended send time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Offset of the window from the run start.
    pub start: Duration,
    /// Completions within the SLO (all classes) as a fraction of what the
    /// capacity could complete in the window.
    pub goodput_frac: f64,
    /// p99 latency of the watched class in the window; 0 without samples.
    pub p99_ms: f64,
    /// Latency samples of the watched class behind `p99_ms`.
    pub samples: u64,
}

/// Splits [0, `run_len`) into consecutive windows of `width` (the last one
/// may be shorter) and places each request by its intended send time.
///
/// Goodput counts completions within `slo` of every class against
/// `capacity_per_sec` over the time the window covers; latency samples are
/// those of `class` (every class when `None`): completions plus unfinished
/// requests censored at `run_len`. A zero `width` or `run_len` yields no
/// windows.
pub fn windows(
    records: &[Record],
    width: Duration,
    run_len: Duration,
    slo: Duration,
    capacity_per_sec: f64,
    class: Option<usize>,
) -> Vec<Window> {
    if width.is_zero() || run_len.is_zero() {
        return Vec::new();
    }
    let width_ns = width.as_nanos();
    let count = usize::try_from(run_len.as_nanos().div_ceil(width_ns)).unwrap_or(usize::MAX);
    let mut good = vec![0_u64; count];
    let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); count];
    for record in records.iter().filter(|record| record.intended < run_len) {
        // intended < run_len, so the index is below `count`.
        let Ok(index) = usize::try_from(record.intended.as_nanos() / width_ns) else {
            continue;
        };
        if within_slo(&record.outcome, slo) {
            good[index] += 1;
        }
        if class.is_none_or(|watched| watched == record.class) {
            if let Some(latency) = served_latency(record, run_len) {
                latencies[index].push(latency);
            }
        }
    }
    let mut start = Duration::ZERO;
    good.into_iter()
        .zip(latencies)
        .map(|(good, latencies)| {
            let covered = width.min(run_len - start);
            let could_complete = capacity_per_sec * covered.as_secs_f64();
            let goodput_frac = if could_complete.is_finite() && could_complete > 0.0 {
                good as f64 / could_complete
            } else {
                0.0
            };
            let latency = summarize(latencies);
            let window = Window {
                start,
                goodput_frac,
                p99_ms: latency.p99_ms,
                samples: latency.count,
            };
            start += covered;
            window
        })
        .collect()
}

/// How a controller met a load spike, read from its slot total sampled
/// every few milliseconds. Its operating point in the spike is the median
/// total over the spike's second half.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TotalInSpike {
    /// From the spike start to the first sample at most one slot above the
    /// operating point: how fast the controller got there (0 when the total
    /// was there already). Unlike [`Convergence::converge_ms`], which also
    /// needs the windows' goodput and p99 to recover and so has a floor set
    /// by the machine's noise (a fixed total, which has nothing to
    /// converge, shows it), this reads the controller alone.
    pub reached_ms: f64,
    /// The operating point.
    pub operating_point: u64,
    /// The share of the spike's samples after `reached_ms` more than one
    /// slot above the operating point: probes for more, taken back.
    pub above_after: f64,
}

/// The controller's figures for a spike; `None` without samples in the
/// second half of the spike, or if the total never came down to the
/// operating point.
pub fn total_in_spike(
    totals: &[(Duration, u64)],
    spike_start: Duration,
    spike_end: Duration,
) -> Option<TotalInSpike> {
    let during: Vec<(Duration, u64)> = totals
        .iter()
        .copied()
        .filter(|&(at, _)| at >= spike_start && at < spike_end)
        .collect();
    let middle = spike_start + (spike_end - spike_start) / 2;
    let mut late: Vec<u64> = during
        .iter()
        .filter(|&&(at, _)| at >= middle)
        .map(|&(_, total)| total)
        .collect();
    if late.is_empty() {
        return None;
    }
    late.sort_unstable();
    let operating_point = late[late.len() / 2];
    let near = |total: u64| total <= operating_point + 1;
    let reached = during.iter().position(|&(_, total)| near(total))?;
    let reached_ms = if reached == 0 {
        0.0
    } else {
        millis(during[reached].0.saturating_sub(spike_start))
    };
    let after = &during[reached..];
    let above = after.iter().filter(|&&(_, total)| !near(total)).count();
    Some(TotalInSpike {
        reached_ms,
        operating_point,
        above_after: above as f64 / after.len() as f64,
    })
}

/// How a system rode out a load spike.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Convergence {
    /// From the spike start to the first settled stretch within the spike:
    /// goodput back near capacity and p99 back near baseline. `None` if the
    /// system never settled during the spike.
    pub converge_ms: Option<f64>,
    /// Worst windowed p99 during the spike.
    pub overshoot_p99_ms: f64,
    /// From the spike end to the first stretch with p99 back near baseline;
    /// `None` if it never came back.
    pub recovery_ms: Option<f64>,
}

// A stretch of windows counts as settled when this many in a row pass, so a
// single lucky window is not taken for convergence.
const SETTLED_WINDOWS: usize = 5;
const SETTLED_GOODPUT_FRAC: f64 = 0.9;
const SETTLED_P99_OVER_BASELINE: f64 = 1.5;

/// Convergence, overshoot and recovery around a spike over
/// [`spike_start`, `spike_end`), from `windows` in time order (as
/// [`windows`] returns them).
///
/// A window is settled when it has latency samples, its p99 is at most 1.5×
/// `baseline_p99_ms` and, during the spike, its goodput is at least 90% of
/// capacity; a settled stretch is 5 consecutive settled windows. During the
/// spike the whole stretch must start before `spike_end`. A window without
/// samples never counts as settled: a system that refuses all work would
/// otherwise look recovered at once.
pub fn convergence(
    windows: &[Window],
    spike_start: Duration,
    spike_end: Duration,
    baseline_p99_ms: f64,
) -> Convergence {
    let p99_ceiling = SETTLED_P99_OVER_BASELINE * baseline_p99_ms;
    let during: Vec<&Window> = windows
        .iter()
        .filter(|window| window.start >= spike_start && window.start < spike_end)
        .collect();
    let after: Vec<&Window> = windows
        .iter()
        .filter(|window| window.start >= spike_end)
        .collect();
    let converge_ms = first_settled_stretch(&during, |window| {
        window.samples > 0
            && window.goodput_frac >= SETTLED_GOODPUT_FRAC
            && window.p99_ms <= p99_ceiling
    })
    .map(|window| millis(window.start - spike_start));
    let overshoot_p99_ms = during
        .iter()
        .map(|window| window.p99_ms)
        .fold(0.0, f64::max);
    let recovery_ms = first_settled_stretch(&after, |window| {
        window.samples > 0 && window.p99_ms <= p99_ceiling
    })
    .map(|window| millis(window.start - spike_end));
    Convergence {
        converge_ms,
        overshoot_p99_ms,
        recovery_ms,
    }
}

/// The first window of the first run of `SETTLED_WINDOWS` consecutive
/// windows that are all `settled`.
fn first_settled_stretch<'a>(
    windows: &[&'a Window],
    settled: impl Fn(&Window) -> bool,
) -> Option<&'a Window> {
    let mut streak = 0;
    for (index, window) in windows.iter().enumerate() {
        if !settled(window) {
            streak = 0;
            continue;
        }
        streak += 1;
        if streak == SETTLED_WINDOWS {
            return Some(windows[index + 1 - SETTLED_WINDOWS]);
        }
    }
    None
}

/// The latency a request contributes to latency percentiles: completions as
/// measured, unfinished requests censored at their age at `run_end`. Refused
/// and expired requests got no service, so they have no service latency.
fn served_latency(record: &Record, run_end: Duration) -> Option<Duration> {
    match record.outcome {
        Outcome::Completed { latency } => Some(latency),
        Outcome::Unfinished => Some(run_end.saturating_sub(record.intended)),
        Outcome::Rejected { .. } | Outcome::Expired { .. } => None,
    }
}

fn within_slo(outcome: &Outcome, slo: Duration) -> bool {
    matches!(outcome, Outcome::Completed { latency } if *latency <= slo)
}

/// Ran to completion, but past the SLO.
pub fn finished_late(outcome: &Outcome, slo: Duration) -> bool {
    matches!(outcome, Outcome::Completed { .. }) && !within_slo(outcome, slo)
}

fn summarize(latencies: impl IntoIterator<Item = Duration>) -> Percentiles {
    let mut histogram =
        Histogram::<u64>::new_with_bounds(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)
            .expect("1 ns to 60 s at 3 significant digits are valid histogram bounds");
    // The histogram clamps what lies beyond its range, so the true maximum is
    // kept beside it.
    let mut max_ns: u128 = 0;
    for latency in latencies {
        let ns = latency.as_nanos();
        max_ns = max_ns.max(ns);
        histogram.saturating_record(u64::try_from(ns).unwrap_or(u64::MAX));
    }
    if histogram.is_empty() {
        return Percentiles::default();
    }
    // The histogram answers with the top of a percentile's bucket, up to 0.1%
    // above any sample in it; capping at the true maximum keeps percentiles
    // at or below the max, and exact when every sample is the same.
    let at = |quantile: f64| {
        let ns = u128::from(histogram.value_at_quantile(quantile)).min(max_ns);
        ns as f64 / 1e6
    };
    Percentiles {
        count: histogram.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        p999_ms: at(0.999),
        max_ms: max_ns as f64 / 1e6,
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_nanos() as f64 / 1e6
}

fn non_negative(value: f64) -> f64 {
    if value.is_finite() && value > 0.0 {
        value
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The histogram stores values below 2048 ns exactly, so synthetic
    // latencies that must come back exact are given in nanoseconds.
    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn completed(class: usize, intended: Duration, latency: Duration) -> Record {
        Record {
            class,
            tenant: 0,
            intended,
            outcome: Outcome::Completed { latency },
        }
    }

    fn ended(class: usize, intended: Duration, outcome: Outcome) -> Record {
        Record {
            class,
            tenant: 0,
            intended,
            outcome,
        }
    }

    #[test]
    fn censored_requests_count_with_their_age_at_the_end() {
        let mut records: Vec<Record> = (1..=9).map(|i| completed(0, ns(0), ns(100 * i))).collect();
        // Sent at 500 ns, still waiting when the run ended at 1500 ns.
        records.push(ended(0, ns(500), Outcome::Unfinished));

        let latency = latency_of_class(&records, 0, ns(1500));

        assert_eq!(
            latency,
            Percentiles {
                count: 10,
                p50_ms: 0.0005,
                p99_ms: 0.001,
                p999_ms: 0.001,
                max_ms: 0.001,
            }
        );
    }

    #[test]
    fn a_request_scheduled_after_the_end_is_censored_at_zero_not_dropped() {
        let records = [ended(0, ms(20), Outcome::Unfinished)];

        let latency = latency_of_class(&records, 0, ms(10));

        assert_eq!(latency.count, 1);
        assert_eq!(latency.max_ms, 0.0);
    }

    #[test]
    fn refused_expired_and_other_class_requests_are_not_latency_samples() {
        let records = [
            completed(0, ns(0), ns(300)),
            ended(0, ns(0), Outcome::Rejected { latency: ns(5) }),
            ended(0, ns(0), Outcome::Expired { latency: ns(2000) }),
            completed(1, ns(0), ns(1900)),
        ];

        let latency = latency_of_class(&records, 0, ns(10_000));

        assert_eq!(latency.count, 1);
        assert_eq!(latency.max_ms, 0.0003);
    }

    #[test]
    fn a_class_without_samples_reports_zeros() {
        let records = [completed(1, ms(0), ms(3))];

        assert_eq!(
            latency_of_class(&records, 0, ms(10)),
            Percentiles::default()
        );
        assert_eq!(latency_of_class(&[], 0, ms(10)), Percentiles::default());
        assert_eq!(percentiles_of(&[]), Percentiles::default());
    }

    #[test]
    fn percentiles_never_exceed_the_true_max() {
        let samples = vec![ms(1); 1000];

        let latency = percentiles_of(&samples);

        assert_eq!(
            latency,
            Percentiles {
                count: 1000,
                p50_ms: 1.0,
                p99_ms: 1.0,
                p999_ms: 1.0,
                max_ms: 1.0,
            }
        );
    }

    #[test]
    fn latencies_beyond_the_histogram_range_keep_their_true_max() {
        let latency = percentiles_of(&[Duration::from_secs(90), Duration::MAX]);

        assert_eq!(latency.count, 2);
        assert_eq!(latency.max_ms, Duration::MAX.as_nanos() as f64 / 1e6);
        // Clamped to the top of the histogram's range, about 60 s.
        assert!((60_000.0..60_100.0).contains(&latency.p50_ms));
    }

    #[test]
    fn generator_lateness_of_zero_is_a_sample() {
        let latency = percentiles_of(&[ns(0), ns(1000)]);

        assert_eq!(latency.count, 2);
        assert_eq!(latency.p50_ms, 0.0);
        assert_eq!(latency.p99_ms, 0.001);
    }

    #[test]
    fn goodput_counts_only_completions_within_the_slo() {
        let records = [
            completed(0, ms(0), ms(5)),
            completed(1, ms(0), ms(10)),
            completed(0, ms(0), ms(11)),
            ended(0, ms(0), Outcome::Rejected { latency: ms(1) }),
            ended(0, ms(0), Outcome::Expired { latency: ms(2) }),
            ended(0, ms(0), Outcome::Unfinished),
        ];

        assert_eq!(goodput_per_sec(&records, ms(10), ms(2000)), 1.0);
        assert_eq!(goodput_per_sec(&records, ms(10), Duration::ZERO), 0.0);
    }

    #[test]
    fn fraction_is_over_all_scheduled_requests() {
        let records = [
            completed(0, ms(0), ms(5)),
            ended(0, ms(0), Outcome::Rejected { latency: ms(1) }),
            ended(0, ms(0), Outcome::Expired { latency: ms(2) }),
            ended(0, ms(0), Outcome::Unfinished),
        ];
        let rejected = |outcome: &Outcome| matches!(outcome, Outcome::Rejected { .. });

        assert_eq!(fraction(&records, rejected), 0.25);
        assert_eq!(fraction(&[], rejected), 0.0);
    }

    #[test]
    fn served_within_slo_is_over_every_request_the_class_scheduled() {
        let records = [
            completed(0, ms(0), ms(5)),
            completed(0, ms(0), ms(11)),
            ended(0, ms(0), Outcome::Rejected { latency: ms(1) }),
            ended(0, ms(0), Outcome::Unfinished),
            completed(1, ms(0), ms(1)),
        ];

        assert_eq!(served_within_slo(&records, 0, ms(10)), Some(0.25));
        assert_eq!(served_within_slo(&records, 1, ms(10)), Some(1.0));
        assert_eq!(served_within_slo(&records, 2, ms(10)), None);
    }

    fn class(name: &str, priority: Priority, within_slo: Option<f64>) -> ClassServed {
        ClassServed {
            name: name.into(),
            priority,
            within_slo,
        }
    }

    /// High, normal and low served within the SLO.
    type Served = (Option<f64>, Option<f64>, Option<f64>);

    /// (high, normal, low) served within the SLO, and the inversions found,
    /// as "higher<lower" pairs.
    #[test]
    fn high_served_less_than_a_lower_class_is_an_inversion() {
        let rows: [(Served, &[&str]); 9] = [
            // Priority respected: nothing to report.
            ((Some(0.999), Some(0.80), Some(0.20)), &[]),
            // Everything served: equal is not inverted.
            ((Some(1.0), Some(1.0), Some(1.0)), &[]),
            // Within the margin of noise.
            ((Some(0.996), Some(1.0), Some(0.999)), &[]),
            // High below low.
            (
                (Some(0.70), Some(0.90), Some(0.80)),
                &["high<normal", "high<low"],
            ),
            // High below normal only.
            ((Some(0.90), Some(0.95), Some(0.10)), &["high<normal"]),
            // Normal below low is an inversion too.
            ((Some(0.99), Some(0.30), Some(0.50)), &["normal<low"]),
            // Just past the margin.
            ((Some(0.90), Some(0.9051), Some(0.0)), &["high<normal"]),
            // A class that scheduled nothing is not compared.
            ((None, Some(0.9), Some(0.2)), &[]),
            ((Some(0.5), None, Some(0.9)), &["high<low"]),
        ];
        for ((high, normal, low), expected) in rows {
            let classes = [
                class("high", Priority::USER_HIGH, high),
                class("normal", Priority::NORMAL, normal),
                class("low", Priority::USER_LOW, low),
            ];
            let found: Vec<String> = priority_inversions(&classes, INVERSION_MARGIN)
                .iter()
                .map(|i| format!("{}<{}", i.higher, i.lower))
                .collect();
            assert_eq!(found, expected, "{high:?} {normal:?} {low:?}");
        }
    }

    #[test]
    fn the_check_orders_classes_by_priority_not_by_position() {
        let classes = [
            class("low", Priority::USER_LOW, Some(0.9)),
            class("high", Priority::USER_HIGH, Some(0.5)),
        ];

        let found = priority_inversions(&classes, INVERSION_MARGIN);

        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].to_string(),
            "high 50.0% served within SLO < low 90.0%"
        );
        let same = [
            class("a", Priority::NORMAL, Some(0.1)),
            class("b", Priority::NORMAL, Some(0.9)),
        ];
        assert!(priority_inversions(&same, INVERSION_MARGIN).is_empty());
    }

    #[test]
    fn satisfied_tenants_leave_their_surplus_to_the_rest() {
        let shares = weighted_max_min(&[1.0, 2.0, 4.0, 8.0], &[1.0; 4], 8.0);

        assert_eq!(shares, vec![1.0, 2.0, 2.5, 2.5]);
    }

    #[test]
    fn backlogged_tenants_share_in_proportion_to_weight() {
        let shares = weighted_max_min(&[100.0; 4], &[1.0, 1.0, 2.0, 4.0], 8.0);

        assert_eq!(shares, vec![1.0, 1.0, 2.0, 4.0]);
    }

    #[test]
    fn spare_capacity_leaves_every_demand_met() {
        let shares = weighted_max_min(&[1.0, 2.0, 3.0], &[1.0, 5.0, 2.0], 100.0);

        assert_eq!(shares, vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn bad_or_missing_inputs_count_as_zero() {
        let demands = [f64::NAN, -1.0, 4.0, f64::INFINITY, 4.0, 4.0];
        let weights = [1.0, 1.0, 0.0, 1.0, f64::NAN];

        // Every tenant lacks a usable demand or a usable weight.
        assert_eq!(weighted_max_min(&demands, &weights, 8.0), vec![0.0; 6]);
        assert_eq!(
            weighted_max_min(&[4.0, 4.0], &[1.0, 1.0], f64::NAN),
            vec![0.0; 2]
        );
        assert_eq!(
            weighted_max_min(&[4.0, 4.0], &[1.0, 1.0], -3.0),
            vec![0.0; 2]
        );
        assert!(weighted_max_min(&[], &[], 8.0).is_empty());
    }

    #[test]
    fn a_zero_weight_tenant_gets_nothing_and_the_rest_share_its_part() {
        let shares = weighted_max_min(&[4.0, 4.0, 4.0], &[1.0, 0.0, 1.0], 6.0);

        assert_eq!(shares, vec![3.0, 0.0, 3.0]);
    }

    #[test]
    fn equal_treatment_is_perfectly_fair() {
        assert_eq!(jain(&[2.0, 4.0, 6.0], &[1.0, 2.0, 3.0]), 1.0);
    }

    #[test]
    fn one_starved_tenant_among_four_scores_three_quarters() {
        assert_eq!(jain(&[2.0, 2.0, 2.0, 0.0], &[2.0; 4]), 0.75);
    }

    #[test]
    fn tenants_without_a_fair_share_are_skipped() {
        assert_eq!(jain(&[5.0, 2.0, 2.0], &[0.0, 2.0, 2.0]), 1.0);
        assert_eq!(jain(&[5.0, 2.0], &[f64::NAN, 2.0]), 1.0);
    }

    #[test]
    fn nothing_to_compare_is_fair() {
        assert_eq!(jain(&[], &[]), 1.0);
        assert_eq!(jain(&[1.0], &[0.0]), 1.0);
        assert_eq!(jain(&[0.0, 0.0], &[1.0, 1.0]), 1.0);
    }

    #[test]
    fn bad_allocations_count_as_starvation() {
        assert_eq!(jain(&[1.0, 1.0, 1.0, f64::NAN], &[1.0; 4]), 0.75);
    }

    #[test]
    fn one_infinite_ratio_dominates_the_rest() {
        assert_eq!(jain(&[f64::MAX, 1.0], &[f64::MIN_POSITIVE, 1.0]), 0.5);
    }

    #[test]
    fn windows_bucket_requests_by_intended_time() {
        let records = [
            completed(0, ms(100), ms(50)),
            // Another class: counts towards goodput, not towards latency.
            completed(1, ms(600), ms(80)),
            completed(0, ms(1500), ms(300)),
            ended(0, ms(1000), Outcome::Rejected { latency: ms(1) }),
            // Censored at the end of the run: 3000 - 2250 ms.
            ended(0, ms(2250), Outcome::Unfinished),
            // At the end of the run: outside every window.
            completed(0, ms(3000), ms(1)),
        ];

        let windows = windows(&records, ms(1000), ms(3000), ms(100), 2.0, Some(0));

        assert_eq!(
            windows,
            vec![
                Window {
                    start: ms(0),
                    goodput_frac: 1.0,
                    p99_ms: 50.0,
                    samples: 1,
                },
                Window {
                    start: ms(1000),
                    goodput_frac: 0.0,
                    p99_ms: 300.0,
                    samples: 1,
                },
                Window {
                    start: ms(2000),
                    goodput_frac: 0.0,
                    p99_ms: 750.0,
                    samples: 1,
                },
            ]
        );
    }

    #[test]
    fn windows_without_a_class_watch_every_class() {
        let records = [completed(0, ms(100), ms(50)), completed(1, ms(200), ms(80))];

        let windows = windows(&records, ms(1000), ms(1000), ms(100), 2.0, None);

        assert_eq!(windows.len(), 1);
        assert_eq!(windows[0].samples, 2);
        assert_eq!(windows[0].p99_ms, 80.0);
    }

    #[test]
    fn a_short_last_window_is_held_to_the_capacity_of_its_length() {
        let records = [completed(0, ms(2100), ms(10))];

        let windows = windows(&records, ms(1000), ms(2500), ms(100), 2.0, Some(0));

        assert_eq!(windows.len(), 3);
        assert_eq!(windows[2].start, ms(2000));
        assert_eq!(windows[2].goodput_frac, 1.0);
    }

    #[test]
    fn degenerate_windows_are_empty_or_zero() {
        let records = [completed(0, ms(100), ms(10))];

        assert!(windows(&records, Duration::ZERO, ms(1000), ms(100), 2.0, None).is_empty());
        assert!(windows(&records, ms(100), Duration::ZERO, ms(100), 2.0, None).is_empty());
        let no_capacity = windows(&records, ms(1000), ms(1000), ms(100), f64::NAN, None);
        assert_eq!(no_capacity[0].goodput_frac, 0.0);
        let empty = windows(&[], ms(1000), ms(2000), ms(100), 2.0, None);
        assert_eq!(empty[1].p99_ms, 0.0);
        assert_eq!(empty[1].samples, 0);
    }

    /// One-second windows from (goodput fraction, p99 ms) pairs.
    fn seconds(figures: &[(f64, f64)]) -> Vec<Window> {
        figures
            .iter()
            .enumerate()
            .map(|(second, &(goodput_frac, p99_ms))| Window {
                start: Duration::from_secs(second as u64),
                goodput_frac,
                p99_ms,
                samples: 1,
            })
            .collect()
    }

    const CALM: (f64, f64) = (0.95, 10.0);
    // On the settling thresholds exactly: 90% goodput, 1.5 × the 10 ms baseline.
    const BARELY_SETTLED: (f64, f64) = (0.9, 15.0);

    #[test]
    fn a_spike_converges_at_the_first_of_five_settled_windows() {
        let mut figures = vec![CALM; 10];
        // Spike over 10..20 s: three bad seconds, then settled.
        figures.extend([(0.5, 80.0), (0.7, 40.0), (0.95, 20.0)]);
        figures.extend([BARELY_SETTLED; 7]);
        // After the spike: two slow seconds, then back to baseline.
        figures.extend([(1.0, 30.0), (1.0, 16.0)]);
        figures.extend([CALM; 8]);

        let spike = convergence(&seconds(&figures), ms(10_000), ms(20_000), 10.0);

        assert_eq!(
            spike,
            Convergence {
                converge_ms: Some(3000.0),
                overshoot_p99_ms: 80.0,
                recovery_ms: Some(2000.0),
            }
        );
    }

    #[test]
    fn four_settled_windows_in_a_row_are_not_convergence() {
        let mut figures = vec![CALM; 10];
        for _ in 0..2 {
            figures.extend([CALM; 4]);
            figures.push((0.89, 10.0));
        }
        figures.extend([CALM; 10]);

        let spike = convergence(&seconds(&figures), ms(10_000), ms(20_000), 10.0);

        assert_eq!(spike.converge_ms, None);
        assert_eq!(spike.overshoot_p99_ms, 10.0);
        assert_eq!(spike.recovery_ms, Some(0.0));
    }

    #[test]
    fn a_settled_stretch_must_start_and_end_inside_the_spike() {
        let mut figures = vec![CALM; 10];
        figures.extend([(0.5, 80.0); 6]);
        // Four settled seconds at the end of the spike, more after it.
        figures.extend([CALM; 14]);

        let spike = convergence(&seconds(&figures), ms(10_000), ms(20_000), 10.0);

        assert_eq!(spike.converge_ms, None);
        assert_eq!(spike.recovery_ms, Some(0.0));
    }

    #[test]
    fn a_system_that_stays_slow_never_recovers() {
        let mut figures = vec![CALM; 10];
        figures.extend([(1.0, 15.1); 20]);

        let spike = convergence(&seconds(&figures), ms(10_000), ms(20_000), 10.0);

        assert_eq!(
            spike,
            Convergence {
                converge_ms: None,
                overshoot_p99_ms: 15.1,
                recovery_ms: None,
            }
        );
    }

    #[test]
    fn windows_without_samples_do_not_count_as_settled() {
        let mut windows = seconds(&vec![(1.0, 0.0); 30]);
        for window in &mut windows {
            window.samples = 0;
        }

        let spike = convergence(&windows, ms(10_000), ms(20_000), 10.0);

        assert_eq!(spike.converge_ms, None);
        assert_eq!(spike.recovery_ms, None);
    }

    #[test]
    fn no_windows_or_no_baseline_never_settle() {
        assert_eq!(
            convergence(&[], ms(0), ms(1000), 10.0),
            Convergence::default()
        );
        let spike = convergence(&seconds(&[CALM; 30]), ms(10_000), ms(20_000), f64::NAN);
        assert_eq!(spike.converge_ms, None);
        assert_eq!(spike.recovery_ms, None);
    }

    #[test]
    fn a_controller_reaches_its_operating_point_and_probes_above_it() {
        let ms = Duration::from_millis;
        // 6 slots before the spike at 100 ms, 4 at 110 and 120 ms, 2 or 3
        // from 130 ms with one probe to 5 at 150 ms, until the end at 300 ms.
        let totals: Vec<(Duration, u64)> = (0..40u64)
            .map(|i| {
                let total = match i {
                    0..=10 => 6,
                    11..=12 => 4,
                    15 => 5,
                    _ => 2 + i % 2,
                };
                (ms(i * 10), total)
            })
            .collect();
        let spike = total_in_spike(&totals, ms(100), ms(300)).unwrap();
        assert_eq!(spike.operating_point, 3);
        assert_eq!(spike.reached_ms, 10.0, "4 is one above the point");
        assert!((spike.above_after - 1.0 / 19.0).abs() < 1e-9);
        // Already there at the spike: 0.
        let flat: Vec<(Duration, u64)> = (0..40u64).map(|i| (ms(i * 10), 2)).collect();
        let spike = total_in_spike(&flat, ms(100), ms(300)).unwrap();
        assert_eq!((spike.reached_ms, spike.above_after), (0.0, 0.0));
        assert_eq!(total_in_spike(&[], ms(100), ms(300)), None);
    }
}
