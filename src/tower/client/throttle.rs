//! Client-side adaptive throttling (Google SRE book, "Handling Overload"):
//! when a downstream accepts fewer and fewer of the requests sent to it,
//! refuse a share of them locally, so that the work of refusing them is
//! not the downstream's.
//!
//! Over a trailing window the client counts the requests it attempted
//! (`requests`, those it refused itself included) and the ones the
//! downstream accepted (`accepts`: answered with anything but an overload
//! refusal), and refuses a new request with probability
//!
//! ```text
//! max(0, (requests − K · accepts) / (requests + 1))
//! ```
//!
//! With `K = 2` the client sends about twice what the downstream accepts:
//! enough to notice at once when it accepts more again, at the price of a
//! refusal for every accept under sustained overload. While it accepts
//! more than half of what is sent, nothing is refused locally.
//!
//! The counts are kept per priority (the requests of no known priority
//! together): a downstream that sheds low-priority work by design (its
//! admission level) accepts little of it and all of its high-priority
//! work, and throttling every class on the accepts of all of them would
//! refuse here the high-priority work it would have taken. (The level
//! already refuses the shed priorities before the throttle counts them;
//! what the throttle sees of a priority is what the level let through.)
//! At most one window per priority: bounded by the ladder's 256 rungs.
//! Plain data: the endpoint's lock protects it.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::window::Window;
use crate::work::Priority;

#[derive(Debug)]
pub(super) struct Throttle {
    /// K: how many requests per accept are sent before any is refused.
    multiplier: f64,
    length: Duration,
    origin: Instant,
    /// Per priority, `first`: requests, `second`: accepts.
    classes: BTreeMap<Option<Priority>, Window>,
}

impl Throttle {
    pub(super) fn new(multiplier: f64, window: Duration, now: Instant) -> Self {
        Throttle {
            multiplier,
            length: window,
            origin: now,
            classes: BTreeMap::new(),
        }
    }

    /// The probability of refusing a request of `priority` at `now`, from
    /// its window's counts (0.0 while accepts keep up, below 1.0 always).
    pub(super) fn probability(&self, priority: Option<Priority>, now: Instant) -> f64 {
        let Some(window) = self.classes.get(&priority) else {
            return 0.0;
        };
        let counts = window.totals(now);
        let (requests, accepts) = (counts.first as f64, counts.second as f64);
        ((requests - self.multiplier * accepts) / (requests + 1.0)).max(0.0)
    }

    /// Each priority's refusal probability at `now`, lowest first.
    pub(super) fn probabilities(&self, now: Instant) -> Vec<(Option<Priority>, f64)> {
        self.classes
            .keys()
            .map(|&priority| (priority, self.probability(priority, now)))
            .collect()
    }

    fn window(&mut self, priority: Option<Priority>) -> &mut Window {
        let (length, origin) = (self.length, self.origin);
        self.classes
            .entry(priority)
            .or_insert_with(|| Window::new(length, origin))
    }

    /// A request of `priority` was attempted at `now` (sent, or refused
    /// here).
    pub(super) fn requested(&mut self, priority: Option<Priority>, now: Instant) {
        self.window(priority).add(now, 1, 0);
    }

    /// The downstream accepted a request of `priority`, answered at `now`.
    pub(super) fn accepted(&mut self, priority: Option<Priority>, now: Instant) {
        self.window(priority).add(now, 0, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_probability_follows_the_sre_formula() {
        let now = Instant::now();
        // (requests, accepts, K, probability)
        let rows: &[(u64, u64, f64, f64)] = &[
            (0, 0, 2.0, 0.0),
            (10, 10, 2.0, 0.0),
            (10, 5, 2.0, 0.0),
            (10, 4, 2.0, 2.0 / 11.0),
            (10, 0, 2.0, 10.0 / 11.0),
            (100, 10, 2.0, 80.0 / 101.0),
            (100, 10, 1.1, 89.0 / 101.0),
            (1000, 0, 2.0, 1000.0 / 1001.0),
        ];
        for &(requests, accepts, multiplier, expected) in rows {
            let mut throttle = Throttle::new(multiplier, Duration::from_secs(1), now);
            let normal = Some(Priority::NORMAL);
            for _ in 0..requests {
                throttle.requested(normal, now);
            }
            for _ in 0..accepts {
                throttle.accepted(normal, now);
            }
            let probability = throttle.probability(normal, now);
            assert!(
                (probability - expected).abs() < 1e-12,
                "{requests} requests, {accepts} accepts, K {multiplier}: {probability} != {expected}"
            );
            assert!(probability < 1.0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_throttle_forgets_an_overload_once_it_slides_out_of_the_window() {
        let start = Instant::now();
        let window = Duration::from_secs(1);
        let mut throttle = Throttle::new(2.0, window, start);
        for _ in 0..100 {
            throttle.requested(None, start);
        }
        assert!(throttle.probability(None, start) > 0.99);
        // Half a window later, accepts come back: the refusals fall as
        // they outweigh the overload's requests.
        let later = start + window / 2;
        for _ in 0..40 {
            throttle.requested(None, later);
            throttle.accepted(None, later);
        }
        let mixed = throttle.probability(None, later);
        assert!((mixed - 60.0 / 141.0).abs() < 1e-12, "{mixed}");
        // The overload slid out of the window: nothing refused.
        assert_eq!(throttle.probability(None, start + window), 0.0);
    }

    #[test]
    fn each_priority_is_throttled_on_its_own_accepts() {
        let now = Instant::now();
        let mut throttle = Throttle::new(2.0, Duration::from_secs(1), now);
        let (low, high) = (Some(Priority::USER_LOW), Some(Priority::USER_HIGH));
        for _ in 0..10 {
            // The endpoint sheds low-priority work and takes the rest.
            throttle.requested(low, now);
            throttle.requested(high, now);
            throttle.accepted(high, now);
        }
        assert!((throttle.probability(low, now) - 10.0 / 11.0).abs() < 1e-12);
        assert_eq!(throttle.probability(high, now), 0.0);
        assert_eq!(throttle.probability(None, now), 0.0, "nothing seen");
        assert_eq!(
            throttle.probabilities(now),
            [(low, 10.0 / 11.0), (high, 0.0)]
        );
    }
}
