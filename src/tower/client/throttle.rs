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
//! more than half of what is sent, nothing is refused locally. Plain data:
//! the endpoint's lock protects it.

use std::time::Duration;

use tokio::time::Instant;

use super::window::Window;

#[derive(Debug)]
pub(super) struct Throttle {
    /// K: how many requests per accept are sent before any is refused.
    multiplier: f64,
    /// `first`: requests, `second`: accepts.
    window: Window,
}

impl Throttle {
    pub(super) fn new(multiplier: f64, window: Duration, now: Instant) -> Self {
        Throttle {
            multiplier,
            window: Window::new(window, now),
        }
    }

    /// The probability of refusing a request at `now`, from the window's
    /// counts (0.0 while accepts keep up, below 1.0 always).
    pub(super) fn probability(&self, now: Instant) -> f64 {
        let counts = self.window.totals(now);
        let (requests, accepts) = (counts.first as f64, counts.second as f64);
        ((requests - self.multiplier * accepts) / (requests + 1.0)).max(0.0)
    }

    /// A request was attempted at `now` (sent, or refused here).
    pub(super) fn requested(&mut self, now: Instant) {
        self.window.add(now, 1, 0);
    }

    /// The downstream accepted a request, answered at `now`.
    pub(super) fn accepted(&mut self, now: Instant) {
        self.window.add(now, 0, 1);
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
            for _ in 0..requests {
                throttle.requested(now);
            }
            for _ in 0..accepts {
                throttle.accepted(now);
            }
            let probability = throttle.probability(now);
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
            throttle.requested(start);
        }
        assert!(throttle.probability(start) > 0.99);
        // Half a window later, accepts come back: the refusals fall as
        // they outweigh the overload's requests.
        let later = start + window / 2;
        for _ in 0..40 {
            throttle.requested(later);
            throttle.accepted(later);
        }
        let mixed = throttle.probability(later);
        assert!((mixed - 60.0 / 141.0).abs() < 1e-12, "{mixed}");
        // The overload slid out of the window: nothing refused.
        assert_eq!(throttle.probability(start + window), 0.0);
    }
}
