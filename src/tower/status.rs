//! What a refused request becomes in HTTP.
//!
//! The mapping is policy-neutral and the application is free to use its
//! own; this one follows the usual conventions: capacity pressure (the queue
//! is full, or the request would not make its deadline) is `429 Too Many
//! Requests` with a `Retry-After` hint, a closed queue is `503 Service
//! Unavailable` (the node is going away), and a deadline that passed is
//! `504 Gateway Timeout`. A request that can never fit is `503` without a
//! hint, and a runtime without timers, a server fault, `500`. A tenant over
//! its [quota](crate::quota) is `429` with the quota's own `Retry-After`
//! (the time its refill takes to cover the request).

use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};

use crate::AdmitError;

/// The status for a refused request, and how long to suggest waiting before
/// a retry (none where a retry would not help): `retry_after`, or, over
/// quota, the quota's own estimate. Crate-private: a user reads the mapping
/// off [`rejection_response`] or the layer's refusals, which build on it.
pub(crate) fn status_for(
    error: &AdmitError,
    retry_after: Duration,
) -> (StatusCode, Option<Duration>) {
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
        // The tenant's quota refills at a known rate: its own hint.
        AdmitError::OverQuota { retry_after } => {
            (StatusCode::TOO_MANY_REQUESTS, Some(*retry_after))
        }
        // `AdmitError` is non-exhaustive: an outcome added later is capacity
        // pressure until it is given its own mapping.
        #[allow(unreachable_patterns)]
        _ => (StatusCode::SERVICE_UNAVAILABLE, Some(retry_after)),
    }
}

/// An empty-bodied response for a refused request, with `Retry-After` in
/// whole seconds (at least one) where a retry may help: capacity pressure
/// (a full queue, a deadline the request would miss) and a tenant over its
/// quota are `429` (over quota with the quota's own hint), a closed queue
/// and a request that can never fit `503` without a hint, a deadline that
/// passed `504`, a runtime without timers `500`.
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
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, retry_after_value(retry));
    }
    response
}

/// `Retry-After` values for whole seconds up to 60, the default
/// [`max_retry_after`](super::HttpAdmissionLayer::max_retry_after): a
/// refusal is answered at the rate an unpaced client sends, so its header
/// value is a static string rather than a number formatted into a fresh
/// buffer (which `HeaderValue::from(u64)` allocates).
const SECONDS: [&str; 61] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32",
    "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46", "47", "48",
    "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60",
];

/// `retry` as a `Retry-After` value: whole seconds, rounded up, at least
/// one. Allocation-free up to a minute.
pub(super) fn retry_after_value(retry: Duration) -> HeaderValue {
    // Saturating: `Duration::MAX` has a fraction on top of `u64::MAX` seconds.
    let seconds = retry
        .as_secs()
        .saturating_add(u64::from(retry.subsec_nanos() > 0))
        .max(1);
    match usize::try_from(seconds).ok().and_then(|s| SECONDS.get(s)) {
        Some(text) => HeaderValue::from_static(text),
        None => HeaderValue::from(seconds),
    }
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
            (
                AdmitError::OverQuota {
                    retry_after: Duration::from_millis(2100),
                },
                StatusCode::TOO_MANY_REQUESTS,
                true,
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

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        let rows = [
            (Duration::ZERO, "1"),
            (Duration::from_millis(1), "1"),
            (Duration::from_secs(1), "1"),
            (Duration::from_millis(1001), "2"),
            (Duration::from_secs(60), "60"),
            (Duration::from_millis(60_001), "61"),
            (Duration::from_secs(3600), "3600"),
            (Duration::MAX, "18446744073709551615"),
        ];
        for (retry, expected) in rows {
            assert_eq!(retry_after_value(retry), expected, "{retry:?}");
        }
    }
}
