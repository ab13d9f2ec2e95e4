//! What a response says to a client that reads it for overload: whether
//! the endpoint refused the request for want of capacity, and when it
//! asks to be tried again. Read as bytes and bounded before any
//! arithmetic: a hostile or garbled value is no hint, never a panic.

use std::time::Duration;

use http::{header, HeaderMap, Response, StatusCode};

/// gRPC's status header (trailers-only responses carry it with the headers).
const GRPC_STATUS: &str = "grpc-status";
/// gRPC's `Retry-After`, in milliseconds (gRFC A6).
const GRPC_RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// How a response answered a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Served, or failed for a reason of the request's own: the endpoint
    /// accepted it.
    Accepted,
    /// Refused for capacity: a 503 or a 429, or gRPC `UNAVAILABLE` (14) or
    /// `RESOURCE_EXHAUSTED` (8).
    Overloaded(Hint),
}

/// When the endpoint asks to be tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hint {
    /// It did not say (or said something that does not parse, which is
    /// the same).
    None,
    /// After this long.
    After(Duration),
    /// Not at all: gRPC's pushback was present but not a non-negative
    /// integer, which gRFC A6 reads as "do not retry".
    Never,
}

pub(super) fn answer<B>(response: &Response<B>) -> Answer {
    let headers = response.headers();
    let grpc_overloaded = headers
        .get(GRPC_STATUS)
        .is_some_and(|status| matches!(status.as_bytes(), b"14" | b"8"));
    let overloaded = grpc_overloaded
        || matches!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        );
    if overloaded {
        Answer::Overloaded(hint(headers))
    } else {
        Answer::Accepted
    }
}

/// The digits of a non-negative integer of at most ten digits; `None` for
/// anything else.
fn small_integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 10 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most ten digits: no overflow.
    Some(
        bytes
            .iter()
            .fold(0u64, |n, digit| n * 10 + u64::from(digit - b'0')),
    )
}

fn hint(headers: &HeaderMap) -> Hint {
    if let Some(pushback) = headers.get(GRPC_RETRY_PUSHBACK) {
        return match small_integer(pushback.as_bytes()) {
            Some(millis) => Hint::After(Duration::from_millis(millis)),
            None => Hint::Never,
        };
    }
    // Delta-seconds only: an HTTP date says nothing a client's clock can
    // be trusted to read the same way.
    match headers
        .get(header::RETRY_AFTER)
        .and_then(|value| small_integer(value.as_bytes()))
    {
        Some(seconds) => Hint::After(Duration::from_secs(seconds)),
        None => Hint::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response's headers, as bytes (some are not text).
    type Headers<'a> = &'a [(&'a str, &'a [u8])];

    fn response(status: u16, headers: Headers<'_>) -> Response<()> {
        let mut builder = Response::builder().status(status);
        for &(name, value) in headers {
            builder = builder.header(name, value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn overload_refusals_and_their_hints_are_read_and_garbage_is_no_hint() {
        let second = Duration::from_secs(1);
        let rows: &[(u16, Headers<'_>, Answer)] = &[
            (200, &[], Answer::Accepted),
            (404, &[], Answer::Accepted),
            (500, &[], Answer::Accepted),
            (
                504,
                &[(header::RETRY_AFTER.as_str(), b"1")],
                Answer::Accepted,
            ),
            (200, &[("grpc-status", b"0")], Answer::Accepted),
            (200, &[("grpc-status", b"4")], Answer::Accepted),
            (503, &[], Answer::Overloaded(Hint::None)),
            (
                429,
                &[("retry-after", b"1")],
                Answer::Overloaded(Hint::After(second)),
            ),
            (
                503,
                &[("retry-after", b"120")],
                Answer::Overloaded(Hint::After(second * 120)),
            ),
            (
                503,
                &[("retry-after", b"Wed, 21 Oct 2015 07:28:00 GMT")],
                Answer::Overloaded(Hint::None),
            ),
            (
                503,
                &[("retry-after", b"-1")],
                Answer::Overloaded(Hint::None),
            ),
            (
                503,
                &[("retry-after", b"1.5")],
                Answer::Overloaded(Hint::None),
            ),
            (
                503,
                &[("retry-after", b"99999999999999999999")],
                Answer::Overloaded(Hint::None),
            ),
            (
                503,
                &[("retry-after", b"\xff")],
                Answer::Overloaded(Hint::None),
            ),
            (
                200,
                &[("grpc-status", b"14"), ("grpc-retry-pushback-ms", b"250")],
                Answer::Overloaded(Hint::After(Duration::from_millis(250))),
            ),
            (
                200,
                &[("grpc-status", b"8")],
                Answer::Overloaded(Hint::None),
            ),
            (
                200,
                &[("grpc-status", b"14"), ("grpc-retry-pushback-ms", b"-1")],
                Answer::Overloaded(Hint::Never),
            ),
            (
                200,
                &[("grpc-status", b"14"), ("grpc-retry-pushback-ms", b"soon")],
                Answer::Overloaded(Hint::Never),
            ),
            (
                503,
                &[("retry-after", b"5"), ("grpc-retry-pushback-ms", b"7")],
                Answer::Overloaded(Hint::After(Duration::from_millis(7))),
            ),
        ];
        for (status, headers, expected) in rows {
            assert_eq!(
                answer(&response(*status, headers)),
                *expected,
                "{status} {headers:?}"
            );
        }
    }
}
