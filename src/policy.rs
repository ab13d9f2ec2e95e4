//! The settings of the queue's overload policies, as plain values: what the
//! queue applies and what its snapshots report, in a module of their own
//! so that the snapshot types (`observe`) do not depend on the queue.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;

/// Epoch-LIFO settings; see [`WorkQueueBuilder::epoch_lifo`](crate::WorkQueueBuilder::epoch_lifo).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochLifo {
    /// Length of an epoch (upstream: 100 ms).
    pub epoch: Duration,
    /// How long after its end an epoch closes (upstream: 5 ms).
    pub closing_delta: Duration,
    /// Queueing delay in an epoch above which a priority switches to LIFO
    /// (upstream: 105 ms, an epoch plus the delta).
    pub lifo_delay: Duration,
}

impl EpochLifo {
    /// Upstream's defaults: 100 ms epochs closing 5 ms late, LIFO above
    /// 105 ms of queueing.
    pub const UPSTREAM: EpochLifo = EpochLifo {
        epoch: Duration::from_millis(100),
        closing_delta: Duration::from_millis(5),
        lifo_delay: Duration::from_millis(105),
    };

    /// Settings scaled to a deadline: epochs of a fifth of it, closing a
    /// twentieth of an epoch late, switching to LIFO when a priority queued
    /// longer than half the deadline.
    pub fn for_deadline(deadline: Duration) -> Self {
        let epoch = deadline / 5;
        EpochLifo {
            epoch,
            closing_delta: epoch / 20,
            lifo_delay: deadline / 2,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let shortest = Duration::from_micros(100);
        if self.epoch < shortest || self.epoch > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "epoch_lifo.epoch",
                format!("{:?} is outside the accepted range 100µs..=1h", self.epoch),
            ));
        }
        if self.closing_delta >= self.epoch {
            return Err(ConfigError::new(
                "epoch_lifo.closing_delta",
                format!(
                    "{:?} must be shorter than the epoch {:?}",
                    self.closing_delta, self.epoch
                ),
            ));
        }
        if self.lifo_delay.is_zero() {
            return Err(ConfigError::new(
                "epoch_lifo.lifo_delay",
                "must be longer than zero",
            ));
        }
        Ok(())
    }

    /// The epoch a request created at `create_time` belongs to.
    pub(crate) fn epoch_of(&self, origin: Instant, create_time: Instant) -> u64 {
        let since = create_time.saturating_duration_since(origin);
        u64::try_from(since.as_nanos() / self.epoch.as_nanos()).unwrap_or(u64::MAX)
    }

    /// When epoch `epoch` closes.
    /// `None` only where the instant is past what the clock can represent.
    /// In 128-bit nanoseconds: epochs are counted in 64 bits, and a 32-bit
    /// multiplier would stop closing epochs after 2^32 of them (49.7 days of
    /// 1 ms epochs).
    pub(crate) fn closes_at(&self, origin: Instant, epoch: u64) -> Option<Instant> {
        let end_nanos = self
            .epoch
            .as_nanos()
            .checked_mul(u128::from(epoch.checked_add(1)?))?;
        let end = Duration::new(
            u64::try_from(end_nanos / 1_000_000_000).ok()?,
            (end_nanos % 1_000_000_000) as u32,
        );
        origin.checked_add(end)?.checked_add(self.closing_delta)
    }
}
