//! Priority and tenant that travel with a request across services.
//!
//! A request's class is decided once, at the edge, and every service it
//! fans out to should honour the same class (the cross-service idea of
//! DAGOR): a low-priority batch call must not become normal priority one hop
//! later. The convention is two headers, [`TENANT_HEADER`] and
//! [`PRIORITY_HEADER`], plus the remaining deadline as `grpc-timeout`:
//!
//! * on the server side, [`HttpClassifier`](super::HttpClassifier) reads
//!   them into a [`WorkInfo`], believing them as far as it trusts the
//!   caller (see the [trust model](crate::tower#trust-model)), and
//!   [`AdmissionService`](super::AdmissionService) makes the admitted
//!   request's `WorkInfo` the task's current one
//!   ([`current_work`]) while its handler runs;
//! * on the client side, [`PropagateLayer`] stamps every outgoing request
//!   made from inside such a handler with the current tenant, priority and
//!   what is left of the deadline.
//!
//! Headers that do not parse are ignored (the classifier's defaults apply),
//! never an error: a malformed header is not a reason to fail a request.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::work::{Priority, WorkInfo};

/// The header carrying the tenant id (a decimal `u64`).
pub const TENANT_HEADER: &str = "x-admission-tenant";
/// The header carrying the priority: a ladder value (`-128..=127`) or a
/// rung's name (`user-high`, `bulk-normal`...).
pub const PRIORITY_HEADER: &str = "x-admission-priority";
/// gRPC's timeout header: digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
/// gRPC's name, not this crate's: crate-private, as its parsing and
/// formatting are.
pub(crate) const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

tokio::task_local! {
    static CURRENT: WorkInfo;
}

/// The `WorkInfo` of the admitted request this task is serving, if any.
pub fn current_work() -> Option<WorkInfo> {
    CURRENT.try_with(Clone::clone).ok()
}

/// Calls `call` and runs the future it returns with `work` as the task's
/// current work.
pub(super) fn with_work<F: std::future::Future>(
    work: WorkInfo,
    call: impl FnOnce() -> F,
) -> tokio::task::futures::TaskLocalFuture<WorkInfo, F> {
    let future = CURRENT.sync_scope(work.clone(), call);
    CURRENT.scope(work, future)
}

/// Parses a `grpc-timeout` value: up to eight digits and a unit. A part
/// of the gRPC protocol, not of admission: crate-private (the classifier
/// and the retry policy read the header; tonic and other gRPC stacks have
/// their own).
///
/// Anything else is `None`, never a panic: the value is read as bytes, so a
/// multi-byte character (which a header may carry) is simply not a digit or
/// a unit. Eight digits bound the largest value, `99999999H` (about 11,400
/// years), which a [`Duration`] and a deadline after now both represent.
pub(crate) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (&unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most eight ASCII digits: no overflow, here or in the unit below.
    let amount = digits
        .iter()
        .fold(0u64, |amount, digit| amount * 10 + u64::from(digit - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(amount.saturating_mul(3600)),
        b'M' => Duration::from_secs(amount.saturating_mul(60)),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Formats a duration as a `grpc-timeout` value, in the finest unit that
/// fits eight digits (rounding up, so the receiver never gets more time).
/// Crate-private, as [`parse_grpc_timeout`] is: [`stamp`] and the retry
/// policy write the header.
pub(crate) fn format_grpc_timeout(timeout: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = timeout.as_nanos();
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (per_unit, unit) in units {
        let amount = nanos.div_ceil(per_unit);
        if amount <= MAX {
            return format!("{amount}{unit}");
        }
    }
    format!("{MAX}H")
}

pub(super) fn parse_priority(value: &str) -> Option<Priority> {
    if let Ok(raw) = value.parse::<i8>() {
        return Some(Priority::new(raw));
    }
    (i8::MIN..=i8::MAX)
        .map(Priority::new)
        .find(|priority| priority.name() == Some(value))
}

pub(super) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok().map(str::trim)
}

/// Stamps outgoing HTTP requests with the current work's tenant, priority
/// and remaining deadline; see [propagation](crate::tower#propagation).
#[derive(Clone, Copy, Debug, Default)]
pub struct PropagateLayer;

impl<S> Layer<S> for PropagateLayer {
    type Service = PropagateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PropagateService { inner }
    }
}

/// The service built by [`PropagateLayer`].
#[derive(Clone)]
pub struct PropagateService<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for PropagateService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if let Some(work) = current_work() {
            stamp(request.headers_mut(), &work);
        }
        self.inner.call(request)
    }
}

/// Writes `work`'s class into `headers`, replacing what was there.
pub fn stamp(headers: &mut HeaderMap, work: &WorkInfo) {
    headers.insert(TENANT_HEADER, HeaderValue::from(work.tenant().get()));
    headers.insert(
        PRIORITY_HEADER,
        HeaderValue::from(i16::from(work.priority().get())),
    );
    if let Some(deadline) = work.deadline() {
        let left = deadline.saturating_duration_since(Instant::now());
        // Digits and a unit letter: always a valid value, but a request is
        // better sent without its deadline than not at all.
        if let Ok(value) = HeaderValue::try_from(format_grpc_timeout(left)) {
            headers.insert(GRPC_TIMEOUT_HEADER, value);
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for PropagateService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PropagateService")
            .field("inner", &self.inner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_by_unit_and_reject_garbage() {
        let rows: &[(&str, Option<Duration>)] = &[
            ("1H", Some(Duration::from_secs(3600))),
            ("2M", Some(Duration::from_secs(120))),
            ("3S", Some(Duration::from_secs(3))),
            ("250m", Some(Duration::from_millis(250))),
            ("7u", Some(Duration::from_micros(7))),
            ("9n", Some(Duration::from_nanos(9))),
            ("", None),
            ("m", None),
            ("12", None),
            ("123456789m", None),
            ("-5m", None),
            ("5x", None),
            ("5ms", None),
        ];
        for &(value, expected) in rows {
            assert_eq!(parse_grpc_timeout(value), expected, "{value:?}");
        }
    }

    #[test]
    fn grpc_timeouts_format_in_the_finest_unit_that_fits_rounding_up() {
        assert_eq!(format_grpc_timeout(Duration::from_nanos(1500)), "1500n");
        assert_eq!(format_grpc_timeout(Duration::from_millis(250)), "250000u");
        assert_eq!(format_grpc_timeout(Duration::from_secs(200)), "200000m");
        assert_eq!(
            format_grpc_timeout(Duration::from_nanos(100_000_000_001)),
            "100001m"
        );
        let round_trip = parse_grpc_timeout(&format_grpc_timeout(Duration::from_millis(42)));
        assert_eq!(round_trip, Some(Duration::from_millis(42)));
    }

    #[test]
    fn a_grpc_timeout_that_is_not_ascii_is_ignored_not_a_panic() {
        // Each ends in a multi-byte character, so the last byte is not a
        // character boundary: slicing one byte off the end would panic.
        for value in [
            "5é",
            "1€",
            "99999999ñ",
            "é",
            "€€",
            "5m\u{301}",
            "２m",
            "5\u{1F600}",
        ] {
            assert_eq!(parse_grpc_timeout(value), None, "{value:?}");
        }
    }

    #[test]
    fn the_largest_grpc_timeout_saturates_into_a_representable_duration() {
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(parse_grpc_timeout("999999999H"), None, "nine digits");
    }

    #[test]
    fn every_timeout_formats_to_a_value_that_parses_back_no_shorter() {
        for timeout in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_secs(u64::MAX / 2),
            Duration::MAX,
        ] {
            let value = format_grpc_timeout(timeout);
            let parsed = parse_grpc_timeout(&value).expect(&value);
            assert!(
                parsed >= timeout.min(Duration::from_secs(99_999_999 * 3600)),
                "{value}"
            );
        }
    }
}
