//! When to stop enforcing: idle detection for the sampler.
//!
//! Sampling every millisecond costs CPU on an idle node, and enforcing a
//! total learned under load only adds latency when there is none. Upstream
//! switches to a 250 ms period and stops enforcing slots once both the mean
//! of the last second and an EWMA (α = 0.5) of runnable per worker are
//! below 0.1. This detector does the same, deciding to go idle only at
//! one-second window boundaries, and leaves idle on the first sample that
//! shows load (sooner than upstream, which also waits for a boundary: with
//! enforcement off, a burst would otherwise run unchecked for up to a
//! second). A sample is up to an idle period away, so the controller does
//! not wait for it when demand shows first: the first grant past the slot
//! total while idle wakes the sampler, and that tick leaves idle
//! ([`SlotGranter`](crate::SlotGranter)'s overrun alarm). A spike that
//! starts on an idle node is then cut as fast as one on a busy node (W4's
//! 0.7x base load let the controller idle, and the cut came 250 ms late).
//!
//! Time is tokio's [`Instant`], so tests drive the detector (and the
//! controller) with a paused clock; the sampler thread, outside any
//! runtime, reads the real one.

use std::time::Duration;

use tokio::time::Instant;

/// Whether the controller is enforcing its slot total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Sampling every period, adjusting and enforcing the total.
    Active,
    /// Sampling slowly; every admission succeeds at once (still counted).
    Idle,
}

const WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct IdleDetector {
    below: f64,
    ewma: f64,
    window_sum: f64,
    window_samples: u64,
    window_start: Instant,
    mode: Mode,
}

impl IdleDetector {
    pub(crate) fn new(below: f64, now: Instant) -> Self {
        IdleDetector {
            below,
            ewma: 0.0,
            window_sum: 0.0,
            window_samples: 0,
            window_start: now,
            mode: Mode::Active,
        }
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// Feeds one sample (runnable per worker) taken at `now`.
    pub(crate) fn observe(&mut self, per_worker: f64, now: Instant) -> Mode {
        self.ewma = 0.5 * self.ewma + 0.5 * per_worker;
        self.window_sum += per_worker;
        self.window_samples = self.window_samples.saturating_add(1);
        match self.mode {
            Mode::Idle if per_worker >= self.below => {
                self.mode = Mode::Active;
                self.restart_window(now);
            }
            Mode::Idle => {}
            Mode::Active => {
                if now.saturating_duration_since(self.window_start) >= WINDOW {
                    let mean = self.window_sum / self.window_samples as f64;
                    if mean < self.below && self.ewma < self.below {
                        self.mode = Mode::Idle;
                    }
                    self.restart_window(now);
                }
            }
        }
        self.mode
    }

    /// Leaves idle mode without a sample (the signal failed): the caller
    /// enforces again, and going idle takes a fresh quiet window.
    pub(crate) fn force_active(&mut self, now: Instant) {
        self.mode = Mode::Active;
        self.restart_window(now);
    }

    fn restart_window(&mut self, now: Instant) {
        self.window_sum = 0.0;
        self.window_samples = 0;
        self.window_start = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn goes_idle_only_at_a_window_boundary_after_a_quiet_second() {
        let t0 = Instant::now();
        let mut idle = IdleDetector::new(0.1, t0);
        for i in 1..1000 {
            assert_eq!(idle.observe(0.0, t0 + ms(i)), Mode::Active, "tick {i}");
        }
        assert_eq!(idle.observe(0.0, t0 + ms(1000)), Mode::Idle);
    }

    #[test]
    fn a_busy_second_keeps_it_active() {
        let t0 = Instant::now();
        let mut idle = IdleDetector::new(0.1, t0);
        for i in 1..=1000 {
            // Mostly quiet, but the mean is 0.2 per worker.
            let load = if i % 10 == 0 { 2.0 } else { 0.0 };
            idle.observe(load, t0 + ms(i));
        }
        assert_eq!(idle.mode(), Mode::Active);
    }

    #[test]
    fn a_recent_spike_keeps_it_active_through_the_ewma() {
        let t0 = Instant::now();
        let mut idle = IdleDetector::new(0.1, t0);
        for i in 1..1000 {
            idle.observe(0.0, t0 + ms(i));
        }
        // The window's mean stays under 0.1, the EWMA does not.
        assert_eq!(idle.observe(50.0, t0 + ms(1000)), Mode::Active);
    }

    #[test]
    fn the_first_loaded_sample_ends_idleness() {
        let t0 = Instant::now();
        let mut idle = IdleDetector::new(0.1, t0);
        idle.observe(0.0, t0 + ms(1000));
        assert_eq!(idle.mode(), Mode::Idle);
        assert_eq!(idle.observe(0.05, t0 + ms(1250)), Mode::Idle);
        assert_eq!(idle.observe(0.5, t0 + ms(1500)), Mode::Active);
    }
}
