//! The outbound layer's error: refused here, before anything was sent, or
//! failed in the inner service.

use std::error::Error;
use std::fmt;

use crate::work::Priority;
use crate::AdmitError;

/// Why a call through [`DownstreamService`](super::DownstreamService)
/// failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum DownstreamError<E> {
    /// The request's priority is below the admission level the endpoint
    /// last sent: refused here, nothing was sent (the endpoint would have
    /// refused it).
    BelowLevel {
        /// The request's priority.
        priority: Priority,
        /// The level believed for the endpoint.
        level: Priority,
    },
    /// The adaptive throttle refused it: the endpoint has been accepting
    /// less than the throttle's share of what it was sent. Nothing was
    /// sent.
    Throttled {
        /// The refusal probability the request was drawn against.
        probability: f64,
    },
    /// The call completed, but the caller's own admission slot, given
    /// back while it was in flight, could not be taken again (its deadline,
    /// usually): the caller holds no slot now and should answer as a
    /// refused request would. The response is dropped; what it said of the
    /// endpoint was learned first.
    NotReadmitted(AdmitError),
    /// The inner service failed.
    Inner(E),
}

impl<E> DownstreamError<E> {
    /// Whether the request was refused here without being sent.
    pub fn is_local_refusal(&self) -> bool {
        matches!(
            self,
            DownstreamError::BelowLevel { .. } | DownstreamError::Throttled { .. }
        )
    }
}

impl<E: fmt::Display> fmt::Display for DownstreamError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DownstreamError::BelowLevel { priority, level } => write!(
                f,
                "not sent: priority {priority} is below the endpoint's admission level {level}"
            ),
            DownstreamError::Throttled { probability } => write!(
                f,
                "not sent: throttled (the endpoint accepts too few requests; p = {probability:.2})"
            ),
            DownstreamError::NotReadmitted(error) => {
                write!(f, "the caller's slot could not be taken again: {error}")
            }
            DownstreamError::Inner(error) => write!(f, "{error}"),
        }
    }
}

/// For any displayable inner error, tower's `BoxError` included, as with
/// [`AdmissionError`](crate::tower::AdmissionError): the inner error is
/// transparent.
impl<E: fmt::Debug + fmt::Display> Error for DownstreamError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            DownstreamError::NotReadmitted(error) => Some(error),
            _ => None,
        }
    }
}
