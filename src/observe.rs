//! Observability: counters kept under the queue's lock, and the snapshot
//! types that copy them out.
//!
//! Counting happens at exactly one point per request, when its outcome is
//! settled (admitted, or failed for any reason including cancellation), so
//! `requested == admitted + errored + waiting` holds in every snapshot taken
//! while nothing is in flight. Fast-path and bypass admissions record a wait
//! of zero, as upstream does, so the histogram shows how much work waited at
//! all.

use std::time::Duration;

use crate::error::AdmitError;
use crate::health::ComponentHealth;
use crate::policy::EpochLifo;
use crate::work::{Priority, TenantId, TenantWeight};

/// Upper bounds of the wait histogram's buckets, in microseconds: zero (no
/// wait), then powers of two up to about 33.5 s. A last bucket holds longer
/// waits.
const BOUNDS_MICROS: [u64; 27] = {
    let mut bounds = [0u64; 27];
    let mut i = 1;
    while i < bounds.len() {
        bounds[i] = 1 << (i - 1);
        i += 1;
    }
    bounds
};

/// A histogram of admission wait times with power-of-two bucket bounds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitHistogram {
    counts: [u64; BOUNDS_MICROS.len() + 1],
    sum_nanos: u64,
}

/// The bucket of a wait of `nanos`: the first whose bound (in whole
/// microseconds, rounded up) is not below it. The bounds after the first
/// are powers of two, so this is one plus the wait's base-two logarithm
/// rounded up, computed rather than searched for: it runs on every
/// admission that waited.
#[inline]
fn bucket_of(nanos: u64) -> usize {
    if nanos == 0 {
        return 0;
    }
    let micros = nanos.div_ceil(1_000);
    let log2_ceil = (u64::BITS - (micros - 1).leading_zeros()) as usize;
    (1 + log2_ceil).min(BOUNDS_MICROS.len())
}

impl WaitHistogram {
    #[inline]
    pub(crate) fn record(&mut self, wait: Duration) {
        let nanos = wait
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(wait.subsec_nanos()));
        let bucket = bucket_of(nanos);
        self.counts[bucket] = self.counts[bucket].saturating_add(1);
        self.sum_nanos = self.sum_nanos.saturating_add(nanos);
    }

    /// A wait of zero: what [`record`](Self::record) does with
    /// `Duration::ZERO`, without the bucket search.
    pub(crate) fn record_zero(&mut self) {
        self.record_zeros(1);
    }

    /// `count` waits of zero.
    pub(crate) fn record_zeros(&mut self, count: u64) {
        self.counts[0] = self.counts[0].saturating_add(count);
    }

    /// How many waits were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The total of all recorded waits.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_nanos)
    }

    /// `(upper bound, count)` for every bucket; the last bound is
    /// [`Duration::MAX`].
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, u64)> + '_ {
        BOUNDS_MICROS
            .iter()
            .map(|&micros| Duration::from_micros(micros))
            .chain(std::iter::once(Duration::MAX))
            .zip(self.counts.iter().copied())
    }

    /// The upper bound of the bucket holding quantile `q` (0.0..=1.0), or
    /// `None` when nothing was recorded. Coarse by design: the bound is at
    /// most twice the true value.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        self.buckets()
            .find(|&(_, count)| {
                seen += count;
                seen >= rank
            })
            .map(|(bound, _)| bound)
    }
}

/// Counters for one priority level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrioritySnapshot {
    /// The priority level.
    pub priority: Priority,
    /// Requests that asked for admission.
    pub requested: u64,
    /// Of `requested`, work in progress that gave its slots back for a wait
    /// and asked for them again ([`SlotPermit::run`](crate::SlotPermit::run),
    /// [`release_during`](crate::SlotPermit::release_during),
    /// [`give_way`](crate::SlotPermit::give_way)).
    pub resumed: u64,
    /// Requests admitted, including fast-path and bypassed ones.
    pub admitted: u64,
    /// Requests that failed: rejected, expired, closed out or cancelled.
    pub errored: u64,
    /// The same requests by why they failed: every one of `errored` is
    /// counted under exactly one reason.
    pub refusals: Refusals,
    /// Requests of this priority waiting in the queue now.
    pub waiting: usize,
    /// How long admitted requests waited.
    pub wait: WaitHistogram,
}

/// Why requests of one priority were not admitted: one count per
/// [`AdmitError`] variant (named as [`AdmitError::reason`] names it), and
/// the requests whose future was dropped before it saw an outcome.
///
/// It answers the question an operator asks first when high-priority work
/// misses its deadlines under load: was it refused at the door, expired
/// while it waited, or refused by early rejection, and if so on the wait
/// ahead of it or on how long its priority's work typically holds a slot?
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusals {
    /// [`AdmitError::QueueFull`].
    pub queue_full: u64,
    /// [`AdmitError::Closed`].
    pub closed: u64,
    /// [`AdmitError::DeadlinePassed`]: the deadline had passed when the
    /// request first asked (spent before it reached admission).
    pub deadline_passed: u64,
    /// [`AdmitError::DeadlineExceeded`]: expired while it waited.
    pub deadline_exceeded: u64,
    /// [`AdmitError::WouldMissDeadline`]: refused by early rejection, at
    /// the door or when a slot came free.
    pub would_miss_deadline: u64,
    /// Early rejections that the typical hold of this priority decided:
    /// the wait ahead of the request alone would have left it time. Counted
    /// when the refusal is made, so besides `would_miss_deadline` it may
    /// hold a few requests whose caller left before seeing the refusal
    /// (counted as `cancelled`); never part of the total.
    pub would_miss_on_hold: u64,
    /// [`AdmitError::NeverFits`].
    pub never_fits: u64,
    /// [`AdmitError::TimerUnavailable`].
    pub timer_unavailable: u64,
    /// [`AdmitError::OverQuota`]. Always 0 in a queue's own snapshot: no
    /// queue refuses this way (a [`Quota`](crate::quota::Quota) turns its
    /// tenant queues' refusals into it, and counts them per tenant in its
    /// [`QuotaSnapshot`](crate::quota::QuotaSnapshot)).
    pub over_quota: u64,
    /// Dropped by the caller before they saw an outcome (waiting, or after a
    /// grant or a refusal they never polled for).
    pub cancelled: u64,
}

impl Refusals {
    fn count(&mut self, error: &AdmitError) {
        let counter = match error {
            AdmitError::QueueFull { .. } => &mut self.queue_full,
            AdmitError::Closed => &mut self.closed,
            AdmitError::DeadlinePassed => &mut self.deadline_passed,
            AdmitError::DeadlineExceeded { .. } => &mut self.deadline_exceeded,
            AdmitError::WouldMissDeadline { .. } => &mut self.would_miss_deadline,
            AdmitError::NeverFits { .. } => &mut self.never_fits,
            AdmitError::TimerUnavailable => &mut self.timer_unavailable,
            AdmitError::OverQuota { .. } => &mut self.over_quota,
        };
        *counter += 1;
    }

    /// Each count with its name: the refusals as [`AdmitError::reason`]
    /// names them, then `cancelled`. `would_miss_on_hold` is not among
    /// them: it is a part of `would_miss_deadline`, not a reason of its own.
    pub fn by_reason(&self) -> [(&'static str, u64); 9] {
        [
            ("queue_full", self.queue_full),
            ("closed", self.closed),
            ("deadline_passed", self.deadline_passed),
            ("deadline_exceeded", self.deadline_exceeded),
            ("would_miss_deadline", self.would_miss_deadline),
            ("never_fits", self.never_fits),
            ("timer_unavailable", self.timer_unavailable),
            ("over_quota", self.over_quota),
            ("cancelled", self.cancelled),
        ]
    }

    /// Every request counted, each once (`would_miss_on_hold` aside): the
    /// priority's `errored`, which is public; this is the tests' check of
    /// it.
    #[cfg(test)]
    fn total(&self) -> u64 {
        self.by_reason().iter().map(|&(_, count)| count).sum()
    }
}

/// One tenant's standing in the fair-share order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSnapshot {
    /// The tenant.
    pub tenant: TenantId,
    /// Capacity charged to the tenant since the last reset and not yet
    /// returned (for slots: slots admitted since the reset and still held),
    /// plus, with [`newcomers_start_behind`](crate::WorkQueueBuilder::newcomers_start_behind),
    /// the standing a tenant first seen while others waited starts at.
    pub used: u64,
    /// The tenant's weight.
    pub weight: TenantWeight,
    /// Requests of this tenant waiting now.
    pub waiting: usize,
    /// With epoch-LIFO: work of this tenant below this priority is served
    /// newest-first (−128, the lowest priority, means none is).
    pub lifo_below: i16,
}

/// A consistent copy of a queue's state, taken under its lock.
#[derive(Clone, Debug)]
pub struct QueueSnapshot<S> {
    /// Requests waiting in the queue (the queue length).
    pub waiting: usize,
    /// Whether the queue has been closed.
    pub closed: bool,
    /// Counters per priority level that has seen a request, lowest first.
    pub priorities: Vec<PrioritySnapshot>,
    /// Tenants the queue currently tracks, by id.
    pub tenants: Vec<TenantSnapshot>,
    /// The granter's state (for a slot queue: slots used and total).
    pub granter: S,
    /// Panics caught in the granter's methods (only a custom granter can
    /// panic; see [`ComponentHealth`]).
    pub granter_health: ComponentHealth,
    /// The epoch-LIFO settings in force: those given to
    /// [`WorkQueueBuilder::epoch_lifo`](crate::WorkQueueBuilder::epoch_lifo),
    /// or those chosen from the requests' deadlines with
    /// [`epoch_lifo_from_deadlines`](crate::WorkQueueBuilder::epoch_lifo_from_deadlines);
    /// `None` while epoch-LIFO is off or not yet chosen.
    pub epoch_lifo: Option<EpochLifo>,
    /// Releases that kept their slot back for requests waiting in tokio's
    /// global queue instead of passing it to a waiter at once (only in a
    /// CPU controller's queue; see
    /// [`ControllerBuilder::arrivals_first`](crate::cpu::ControllerBuilder::arrivals_first)).
    pub kept_for_arrivals: u64,
}

impl<S> QueueSnapshot<S> {
    /// The counters of one priority, if it has seen a request.
    pub fn priority(&self, priority: Priority) -> Option<&PrioritySnapshot> {
        self.priorities.iter().find(|p| p.priority == priority)
    }

    /// One tenant's standing, if the queue tracks it.
    pub fn tenant(&self, tenant: TenantId) -> Option<&TenantSnapshot> {
        self.tenants.iter().find(|t| t.tenant == tenant)
    }
}

/// Per-priority counters, indexed by the priority's byte so that the hot
/// path finds its entry without hashing or searching.
#[derive(Debug)]
pub(crate) struct PriorityStats {
    index: Box<[u16; 256]>,
    entries: Vec<PrioritySnapshot>,
}

impl PriorityStats {
    pub(crate) fn new() -> Self {
        PriorityStats {
            index: Box::new([0; 256]),
            entries: Vec::new(),
        }
    }

    #[inline]
    fn entry(&mut self, priority: Priority) -> &mut PrioritySnapshot {
        let slot = usize::from(priority.get() as u8);
        if self.index[slot] == 0 {
            self.entries.push(PrioritySnapshot {
                priority,
                ..PrioritySnapshot::default()
            });
            // At most 256 entries, so the length fits in a u16.
            self.index[slot] = self.entries.len() as u16;
        }
        let at = usize::from(self.index[slot]) - 1;
        &mut self.entries[at]
    }

    #[inline]
    pub(crate) fn requested(&mut self, priority: Priority, resumed: bool) {
        let entry = self.entry(priority);
        entry.requested += 1;
        entry.resumed += u64::from(resumed);
    }

    /// A request admitted at its first poll without waiting: `requested`
    /// and `admitted` in one look-up, which the uncontended path does on
    /// every admission.
    #[inline]
    pub(crate) fn admitted_at_once(&mut self, priority: Priority, resumed: bool) {
        let entry = self.entry(priority);
        entry.requested += 1;
        entry.resumed += u64::from(resumed);
        entry.admitted += 1;
        entry.wait.record_zero();
    }

    /// `count` requests admitted at their first poll without waiting.
    pub(crate) fn admitted_at_once_many(&mut self, priority: Priority, count: u64) {
        let entry = self.entry(priority);
        entry.requested = entry.requested.saturating_add(count);
        entry.admitted = entry.admitted.saturating_add(count);
        entry.wait.record_zeros(count);
    }

    #[inline]
    pub(crate) fn admitted(&mut self, priority: Priority, waited: Duration) {
        let entry = self.entry(priority);
        entry.admitted += 1;
        entry.wait.record(waited);
    }

    pub(crate) fn refused(&mut self, priority: Priority, error: &AdmitError) {
        let entry = self.entry(priority);
        entry.errored += 1;
        entry.refusals.count(error);
    }

    /// Early rejection refused work of `priority` on its typical hold
    /// (also counted by `refused`, as `would_miss_deadline`).
    pub(crate) fn refused_on_hold(&mut self, priority: Priority) {
        self.entry(priority).refusals.would_miss_on_hold += 1;
    }

    #[inline]
    pub(crate) fn cancelled(&mut self, priority: Priority) {
        let entry = self.entry(priority);
        entry.errored += 1;
        entry.refusals.cancelled += 1;
    }

    /// The counters, lowest priority first, with `waiting` filled in by
    /// `waiting_at`.
    pub(crate) fn snapshot(&self, waiting_at: impl Fn(Priority) -> usize) -> Vec<PrioritySnapshot> {
        let mut out = self.entries.clone();
        for entry in &mut out {
            entry.waiting = waiting_at(entry.priority);
        }
        out.sort_by_key(|entry| entry.priority);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_computed_bucket_is_the_first_bound_not_below_the_wait() {
        let searched = |nanos: u64| {
            if nanos == 0 {
                0
            } else {
                let micros = nanos.div_ceil(1_000);
                BOUNDS_MICROS.partition_point(|&bound| bound < micros)
            }
        };
        // Every bound, one either side of it, in nanoseconds either side of
        // its microsecond, and the extremes.
        let mut waits = vec![0, 1, 999, 1_000, 1_001, u64::MAX - 1, u64::MAX];
        for &bound in &BOUNDS_MICROS {
            for micros in [bound.saturating_sub(1), bound, bound + 1] {
                let nanos = micros * 1_000;
                waits.extend([nanos.saturating_sub(1), nanos, nanos + 1]);
            }
        }
        for nanos in waits {
            assert_eq!(bucket_of(nanos), searched(nanos), "{nanos} ns");
        }
    }

    #[test]
    fn waits_land_in_power_of_two_buckets() {
        let mut histogram = WaitHistogram::default();
        histogram.record(Duration::ZERO);
        histogram.record(Duration::from_nanos(1));
        histogram.record(Duration::from_micros(3));
        histogram.record(Duration::from_micros(4));
        histogram.record(Duration::from_secs(3600));
        let nonzero: Vec<(Duration, u64)> = histogram.buckets().filter(|&(_, n)| n > 0).collect();
        assert_eq!(
            nonzero,
            vec![
                (Duration::ZERO, 1),
                (Duration::from_micros(1), 1),
                (Duration::from_micros(4), 2),
                (Duration::MAX, 1),
            ]
        );
        assert_eq!(histogram.count(), 5);
        assert_eq!(histogram.quantile(0.5), Some(Duration::from_micros(4)));
        assert_eq!(histogram.quantile(0.0), Some(Duration::ZERO));
        assert_eq!(WaitHistogram::default().quantile(0.99), None);
    }

    #[test]
    fn priority_counters_are_kept_apart_and_listed_lowest_first() {
        let mut stats = PriorityStats::new();
        stats.requested(Priority::HIGH, false);
        stats.requested(Priority::LOW, false);
        stats.requested(Priority::LOW, false);
        stats.admitted(Priority::HIGH, Duration::ZERO);
        stats.refused(Priority::LOW, &AdmitError::DeadlinePassed);
        let snapshot = stats.snapshot(|p| usize::from(p == Priority::LOW));
        assert_eq!(snapshot.len(), 2);
        assert_eq!(
            (
                snapshot[0].priority,
                snapshot[0].requested,
                snapshot[0].errored,
                snapshot[0].waiting
            ),
            (Priority::LOW, 2, 1, 1)
        );
        assert_eq!(
            (
                snapshot[1].priority,
                snapshot[1].admitted,
                snapshot[1].wait.count()
            ),
            (Priority::HIGH, 1, 1)
        );
        assert_eq!(snapshot[0].refusals.deadline_passed, 1);
        assert_eq!(snapshot[0].refusals.total(), snapshot[0].errored);
        assert_eq!(snapshot[1].refusals, Refusals::default());
    }

    #[test]
    fn every_refusal_is_counted_once_under_its_own_reason() {
        let refusals = AdmitError::one_of_each();
        let mut stats = PriorityStats::new();
        for error in &refusals {
            stats.refused(Priority::NORMAL, error);
        }
        stats.refused_on_hold(Priority::NORMAL);
        stats.cancelled(Priority::NORMAL);
        let counted = stats.snapshot(|_| 0)[0].clone();
        let expected = Refusals {
            queue_full: 1,
            closed: 1,
            deadline_passed: 1,
            deadline_exceeded: 1,
            would_miss_deadline: 1,
            would_miss_on_hold: 1,
            never_fits: 1,
            timer_unavailable: 1,
            over_quota: 1,
            cancelled: 1,
        };
        assert_eq!(counted.refusals, expected);
        // Each count is named as its error names itself.
        let names: Vec<&str> = counted.refusals.by_reason().map(|(name, _)| name).to_vec();
        let reasons: Vec<&str> = refusals.iter().map(AdmitError::reason).collect();
        assert_eq!(names[..reasons.len()], reasons[..]);
        assert_eq!(names[reasons.len()..], ["cancelled"]);
        assert_eq!(counted.errored, 9);
        assert_eq!(counted.refusals.total(), counted.errored);
    }
}
