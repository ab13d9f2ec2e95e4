//! Grant pacing (upstream's grant chain): outstanding grants, counted.
//!
//! With a burst limit set, the grant loop stops once that many grants are
//! *outstanding*: made, but not yet observed by their futures. A future
//! observing its grant is the sign that its task actually got a worker;
//! until then, handing out more slots would only pile tasks into a run
//! queue that is not draining. Each grant remembers the pacing epoch it was
//! made in; `unstick` starts a new epoch (forgetting the outstanding count)
//! if no grant has been observed for the timeout while the limit held, so a
//! future that is never polled again cannot stall the queue.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub(super) struct Pacing {
    burst: Option<usize>,
    timeout: Duration,
    outstanding: usize,
    epoch: u64,
    observed: u64,
    /// When the limit was first seen holding, and `observed` at that moment.
    stalled: Option<(Instant, u64)>,
}

impl Pacing {
    pub(super) fn new(burst: Option<usize>, timeout: Duration) -> Self {
        Pacing {
            burst,
            timeout,
            outstanding: 0,
            epoch: 0,
            observed: 0,
            stalled: None,
        }
    }

    pub(super) fn is_enabled(&self) -> bool {
        self.burst.is_some()
    }

    pub(super) fn is_full(&self) -> bool {
        self.burst.is_some_and(|burst| self.outstanding >= burst)
    }

    /// A grant was made; returns the epoch to remember it by.
    pub(super) fn granted(&mut self) -> u64 {
        self.outstanding += 1;
        self.epoch
    }

    /// A grant made in `epoch` was observed, or abandoned by a cancel.
    pub(super) fn settled(&mut self, epoch: u64) {
        self.observed += 1;
        if epoch == self.epoch {
            self.outstanding -= 1;
        }
    }

    /// Starts a new epoch if the limit has held with no progress for the
    /// timeout. Returns whether it did (and grants may resume).
    pub(super) fn unstick(&mut self, now: Instant) -> bool {
        if !self.is_full() {
            self.stalled = None;
            return false;
        }
        match self.stalled {
            Some((since, observed)) if observed == self.observed => {
                if now.saturating_duration_since(since) < self.timeout {
                    return false;
                }
                self.epoch += 1;
                self.outstanding = 0;
                self.stalled = None;
                true
            }
            _ => {
                self.stalled = Some((now, self.observed));
                false
            }
        }
    }
}
