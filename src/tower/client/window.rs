//! A trailing window of two counts, in buckets: what the adaptive
//! throttle (requests, accepts) and the retry budget (requests, retries)
//! count over.
//!
//! Ten buckets of a tenth of the window each, in a ring; a count lands in
//! the bucket of its time, and a bucket is reused (cleared) once its time
//! has slid out of the window. The totals cover between nine tenths of the
//! window and all of it. Plain data: its owner's lock protects it.

use std::time::Duration;

use tokio::time::Instant;

const BUCKETS: usize = 10;

/// Two counts per bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) first: u64,
    pub(super) second: u64,
}

#[derive(Debug)]
pub(super) struct Window {
    origin: Instant,
    bucket: Duration,
    /// Each bucket's counts and the index (buckets since `origin`) of the
    /// time they were counted in.
    ring: [(u64, Counts); BUCKETS],
}

impl Window {
    /// A window of `length` (at least ten nanoseconds: one per bucket),
    /// starting at `origin`.
    pub(super) fn new(length: Duration, origin: Instant) -> Self {
        let bucket = (length / BUCKETS as u32).max(Duration::from_nanos(1));
        Window {
            origin,
            bucket,
            ring: [(0, Counts::default()); BUCKETS],
        }
    }

    /// The bucket index of `now`: buckets since the origin (a time before
    /// the origin counts as the origin).
    fn index(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin);
        u64::try_from(since.as_nanos() / self.bucket.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Adds to the counts of `now`'s bucket.
    pub(super) fn add(&mut self, now: Instant, first: u64, second: u64) {
        let index = self.index(now);
        let (at, counts) = &mut self.ring[(index % BUCKETS as u64) as usize];
        if *at != index {
            *at = index;
            *counts = Counts::default();
        }
        counts.first = counts.first.saturating_add(first);
        counts.second = counts.second.saturating_add(second);
    }

    /// The counts of the buckets still in the window at `now`.
    pub(super) fn totals(&self, now: Instant) -> Counts {
        let index = self.index(now);
        let oldest = index.saturating_sub(BUCKETS as u64 - 1);
        self.ring
            .iter()
            .filter(|(at, _)| (oldest..=index).contains(at))
            .fold(Counts::default(), |sum, (_, counts)| Counts {
                first: sum.first.saturating_add(counts.first),
                second: sum.second.saturating_add(counts.second),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_slide_out_of_the_window_bucket_by_bucket() {
        let origin = Instant::now();
        let tenth = Duration::from_millis(100);
        let mut window = Window::new(Duration::from_secs(1), origin);
        let at = |tenths: u32| origin + tenth * tenths;
        window.add(at(0), 1, 0);
        window.add(at(3), 2, 1);
        window.add(at(9), 4, 2);
        let rows = [
            (0, (1, 0)),
            (5, (3, 1)),
            (9, (7, 3)),
            // The first bucket slid out; the others stay.
            (10, (6, 3)),
            (13, (4, 2)),
            (18, (4, 2)),
            (19, (0, 0)),
            (1_000, (0, 0)),
        ];
        for (tenths, (first, second)) in rows {
            assert_eq!(
                window.totals(at(tenths)),
                Counts { first, second },
                "at {tenths} tenths"
            );
        }
        // A bucket reused after its time slid out starts from zero.
        window.add(at(20), 1, 1);
        assert_eq!(
            window.totals(at(20)),
            Counts {
                first: 1,
                second: 1
            }
        );
        // A time before the origin counts in the first bucket.
        let mut early = Window::new(Duration::from_secs(1), at(5));
        early.add(origin, 1, 0);
        assert_eq!(early.totals(at(5)).first, 1);
    }
}
