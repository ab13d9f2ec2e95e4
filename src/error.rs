//! The crate's error types: one per boundary.
//!
//! [`AdmitError`] is what awaiting admission can fail with; every variant is a
//! distinct outcome an application may map differently (retry, shed with 429,
//! give up with 504). [`ConfigError`] is returned at construction when a
//! setting is out of range, and names the field at fault.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// Why an admission request did not get in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdmitError {
    /// The queue already held its maximum number of waiters; the request was
    /// rejected at once without queueing. Shedding load: retry later.
    QueueFull {
        /// The configured bound on waiters that was reached.
        max_waiters: usize,
    },
    /// The queue was closed, before or while the request waited. Nothing
    /// more will be admitted through it.
    Closed,
    /// The request's deadline had already passed when it asked; it was never
    /// queued.
    DeadlinePassed,
    /// The request's deadline passed while it waited in the queue; it has
    /// been removed from the queue.
    DeadlineExceeded {
        /// How long the request waited before it was removed.
        waited: Duration,
    },
    /// Early rejection: at the rate the queue has been draining and the time
    /// work typically holds a slot, the request would not complete before
    /// its deadline, so it was refused (at once, or while waiting) instead of
    /// failing later or finishing late. Only with
    /// [`WorkQueueBuilder::early_rejection`](crate::WorkQueueBuilder::early_rejection).
    WouldMissDeadline {
        /// The expected time until the work would complete: the wait for a
        /// slot (zero once the request is next in line) plus the typical hold.
        expected: Duration,
        /// Time left before the request's deadline.
        remaining: Duration,
    },
    /// The request asked for more units than the granter could ever grant
    /// one request (more slots than the queue's total can reach), so it
    /// was refused instead of waiting forever in front of everyone else.
    /// A request already waiting fails this way when the total drops below
    /// what it asked for.
    NeverFits {
        /// Units the request asked for.
        requested: u64,
        /// The most units one request can be granted now.
        capacity: u64,
    },
    /// The request carries a deadline and had to wait, but no tokio timer
    /// is available where it was polled (a runtime built without
    /// `enable_time`, or no runtime at all), so its deadline could not be
    /// kept. It was taken out of the queue; nothing was admitted.
    TimerUnavailable,
    /// The request's tenant is over its fleet-wide quota: its quota
    /// refused it, at once or after it waited (see
    /// [`Quota`](crate::quota::Quota)). No queue of its own refuses this
    /// way; the quota turns its tenant queue's refusal into this one.
    OverQuota {
        /// When a retry could find quota again: the time this node's share
        /// of the tenant's refill takes to cover the request and those
        /// waiting ahead of it.
        retry_after: Duration,
    },
}

impl AdmitError {
    /// A short, stable name for the outcome, for metric labels and logs:
    /// `queue_full`, `closed`, `deadline_passed`, `deadline_exceeded`,
    /// `would_miss_deadline`, `never_fits`, `timer_unavailable` or
    /// `over_quota`.
    pub fn reason(&self) -> &'static str {
        match self {
            AdmitError::QueueFull { .. } => "queue_full",
            AdmitError::Closed => "closed",
            AdmitError::DeadlinePassed => "deadline_passed",
            AdmitError::DeadlineExceeded { .. } => "deadline_exceeded",
            AdmitError::WouldMissDeadline { .. } => "would_miss_deadline",
            AdmitError::NeverFits { .. } => "never_fits",
            AdmitError::TimerUnavailable => "timer_unavailable",
            AdmitError::OverQuota { .. } => "over_quota",
        }
    }

    /// One error of each variant, in declaration order, for tests that must
    /// cover them all.
    #[cfg(test)]
    pub(crate) fn one_of_each() -> [AdmitError; 8] {
        let all = [
            AdmitError::QueueFull { max_waiters: 1 },
            AdmitError::Closed,
            AdmitError::DeadlinePassed,
            AdmitError::DeadlineExceeded {
                waited: std::time::Duration::ZERO,
            },
            AdmitError::WouldMissDeadline {
                expected: std::time::Duration::ZERO,
                remaining: std::time::Duration::ZERO,
            },
            AdmitError::NeverFits {
                requested: 2,
                capacity: 1,
            },
            AdmitError::TimerUnavailable,
            AdmitError::OverQuota {
                retry_after: std::time::Duration::ZERO,
            },
        ];
        // Exhaustive inside the crate: a new variant fails to compile here
        // until it is added above.
        for error in &all {
            match error {
                AdmitError::QueueFull { .. }
                | AdmitError::Closed
                | AdmitError::DeadlinePassed
                | AdmitError::DeadlineExceeded { .. }
                | AdmitError::WouldMissDeadline { .. }
                | AdmitError::NeverFits { .. }
                | AdmitError::TimerUnavailable
                | AdmitError::OverQuota { .. } => {}
            }
        }
        all
    }
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmitError::QueueFull { max_waiters } => write!(
                f,
                "admission queue is full ({max_waiters} waiters); request rejected without queueing"
            ),
            AdmitError::Closed => f.write_str("admission queue is closed"),
            AdmitError::DeadlinePassed => {
                f.write_str("deadline had already passed before queueing for admission")
            }
            AdmitError::DeadlineExceeded { waited } => write!(
                f,
                "deadline expired after waiting {waited:?} in the admission queue"
            ),
            AdmitError::WouldMissDeadline {
                expected,
                remaining,
            } => write!(
                f,
                "rejected early: expected to complete in {expected:?}, but only {remaining:?} is left before the deadline"
            ),
            AdmitError::NeverFits {
                requested,
                capacity,
            } => write!(
                f,
                "request for {requested} units can never be admitted: at most {capacity} can be granted to one request"
            ),
            AdmitError::TimerUnavailable => f.write_str(
                "the request has a deadline and had to wait, but no tokio timer is available: \
                 build the runtime with `enable_time()` (or `enable_all()`)",
            ),
            AdmitError::OverQuota { retry_after } => write!(
                f,
                "the tenant is over its quota; retry after {retry_after:?}"
            ),
        }
    }
}

impl Error for AdmitError {}

/// A configuration value was rejected at construction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    message: String,
}

impl ConfigError {
    /// The name of the configuration field at fault, as spelled in the builder.
    pub fn field(&self) -> &'static str {
        self.field
    }

    pub(crate) fn new(field: &'static str, message: impl Into<String>) -> Self {
        ConfigError {
            field,
            message: message.into(),
        }
    }

    pub(crate) fn out_of_range<T: fmt::Display>(
        field: &'static str,
        value: T,
        min: T,
        max: T,
    ) -> Self {
        Self::new(
            field,
            format!("{value} is outside the accepted range {min}..={max}"),
        )
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

impl Error for ConfigError {}
