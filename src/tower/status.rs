//! What a refused request becomes in HTTP.
//!
//! The mapping is policy-neutral and the application is free to use its
//! own; this one follows the usual conventions: capacity pressure (the queue
//! is full, or the request would not make its deadline) is `429 Too Many
//! Requests` with a `Retry-After` hint, a closed queue is `503 Service
//! Unavailable` (the node is going away), and a deadline that passed is
//! `504 Gateway Timeout`. A request that can never fit is `503` without a
//! hint, and a runtime without timers, a server fault, `500`.

use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};

use crate::AdmitError;

/// The status for a refused request, and how long to suggest waiting before
/// a retry (none where a retry would not help).
pub fn status_for(error: &AdmitError, retry_after: Duration) -> (StatusCode, Option<Duration>) {
    match error {
        AdmitError::QueueFull { .. } | AdmitError::WouldMissDeadline { .. } => {
            (StatusCode::TOO_MANY_REQUESTS, Some(retry_after))
        }
        AdmitError::Closed => (StatusCode::SERVICE_UNAVAILABLE, None),
        AdmitError::DeadlinePassed | AdmitError::DeadlineExceeded { .. } => {
            (StatusCode::GATEWAY_TIMEOUT, None)
        }
        // Asking again for the same units would be refused again.
        AdmitError::NeverFits { .. } => (StatusCode::SERVICE_UNAVAILABLE, None),
        // The server is misconfigured; the client did nothing wrong.
        AdmitError::TimerUnavailable => (StatusCode::INTERNAL_SERVER_ERROR, None),
        // `AdmitError` is non-exhaustive: an outcome added later is capacity
        // pressure until it is given its own mapping.
        #[allow(unreachable_patterns)]
        _ => (StatusCode::SERVICE_UNAVAILABLE, Some(retry_after)),
    }
}

/// An empty-bodied response for a refused request, with `Retry-After` in
/// whole seconds (at least one) where a retry may help.
///
/// ```
/// use std::time::Duration;
/// use admission::tower::rejection_response;
/// use admission::AdmitError;
///
/// let response: http::Response<()> =
///     rejection_response(&AdmitError::QueueFull { max_waiters: 10 }, Duration::from_millis(200));
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "1");
/// ```
pub fn rejection_response<B: Default>(error: &AdmitError, retry_after: Duration) -> Response<B> {
    let (status, retry) = status_for(error, retry_after);
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    if let Some(retry) = retry {
        // Saturating: `Duration::MAX` has a fraction on top of `u64::MAX` seconds.
        let seconds = retry
            .as_secs()
            .saturating_add(u64::from(retry.subsec_nanos() > 0));
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_maps_to_its_status() {
        let second = Duration::from_secs(1);
        let rows: &[(AdmitError, StatusCode, bool)] = &[
            (
                AdmitError::QueueFull { max_waiters: 1 },
                StatusCode::TOO_MANY_REQUESTS,
                true,
            ),
            (
                AdmitError::WouldMissDeadline {
                    expected: second,
                    remaining: Duration::ZERO,
                },
                StatusCode::TOO_MANY_REQUESTS,
                true,
            ),
            (AdmitError::Closed, StatusCode::SERVICE_UNAVAILABLE, false),
            (
                AdmitError::DeadlinePassed,
                StatusCode::GATEWAY_TIMEOUT,
                false,
            ),
            (
                AdmitError::DeadlineExceeded { waited: second },
                StatusCode::GATEWAY_TIMEOUT,
                false,
            ),
        ];
        for (error, status, retry) in rows {
            let response: Response<()> = rejection_response(error, Duration::from_millis(2500));
            assert_eq!(response.status(), *status, "{error}");
            let header = response.headers().get(header::RETRY_AFTER);
            assert_eq!(header.is_some(), *retry, "{error}");
            if *retry {
                assert_eq!(header.unwrap(), "3", "rounded up to whole seconds");
            }
        }
    }
}
