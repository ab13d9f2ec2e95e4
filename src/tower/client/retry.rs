//! The retry policy: retry an overload refusal when the endpoint allows it,
//! the budget has a retry left, the attempts are not spent and the
//! request's deadline leaves time for it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use pin_project::pin_project;
use tokio::time::{Instant, Sleep};
use tower::retry::Policy;

use super::answer::{answer, Answer, Hint};
use super::downstreams::Inner;
use crate::sync::StdArc;
use crate::tower::propagate::{
    current_work, format_grpc_timeout, header, parse_grpc_timeout, GRPC_TIMEOUT_HEADER,
};

/// A retry policy for tower's `Retry` middleware (tower 0.5), built by
/// [`Downstreams::retry_policy`](super::Downstreams::retry_policy).
///
/// A response is retried only when it is an overload refusal (a 503 or a
/// 429, or gRPC `UNAVAILABLE` or `RESOURCE_EXHAUSTED`) and
///
/// * the attempts are not spent: at most
///   [`max_attempts`](super::DownstreamsBuilder::max_attempts) per
///   request, the first included (3 by default);
/// * the endpoint did not say no: the wait is its `grpc-retry-pushback-ms`
///   or its `Retry-After` (delta-seconds) when it gave one; a pushback that
///   is not a non-negative integer means no retry (gRFC A6); without a
///   hint, the [backoff](super::DownstreamsBuilder::retry_backoff), doubled
///   on every retry, with jitter;
/// * the wait ends before the request's deadline: the earliest of the
///   calling task's [`current_work`] deadline and the request's own
///   `grpc-timeout` when its first attempt was made (a retry past it
///   would only be refused, or served for nobody); its `grpc-timeout` is
///   rewritten to what is left when it is sent again;
/// * the [retry budget](super::RetryBudget) has a retry left (each request
///   deposits once, before its first attempt).
///
/// Errors are never retried: a refusal made here
/// ([`DownstreamError::BelowLevel`](super::DownstreamError::BelowLevel),
/// [`Throttled`](super::DownstreamError::Throttled)) must not be, and a
/// transport error is not an overload signal this policy can read. A
/// request is retried only if its body is `Clone` (`Full<Bytes>`, `()`,
/// tonic's buffered bodies...).
///
/// Place `Retry` outside the [`DownstreamLayer`](super::DownstreamLayer),
/// so that every attempt passes the level and the throttle.
#[derive(Clone)]
pub struct RetryPolicy {
    shared: StdArc<Inner>,
}

/// What a request's later attempts carry: how many were sent, and the
/// deadline found at its first.
#[derive(Clone, Copy, Debug)]
struct Attempts {
    sent: u32,
    deadline: Option<Instant>,
}

impl RetryPolicy {
    pub(super) fn new(shared: StdArc<Inner>) -> Self {
        RetryPolicy { shared }
    }

    /// The wait before the next attempt, after `sent` attempts; `None`
    /// when the endpoint said not to retry.
    fn wait(&self, hint: Hint, sent: u32) -> Option<Duration> {
        match hint {
            Hint::After(wait) => Some(wait),
            Hint::Never => None,
            Hint::None => {
                let doubled = self
                    .shared
                    .backoff
                    .saturating_mul(1 << sent.saturating_sub(1).min(16));
                // Equal jitter: half the backoff, plus up to as much again.
                let jitter = 0.5 + 0.5 * self.shared.draw();
                Some(doubled.mul_f64(jitter))
            }
        }
    }
}

/// The deadline of a request about to make its first attempt: the
/// caller's, or its own `grpc-timeout`, whichever comes first.
fn deadline_of<B>(request: &Request<B>, now: Instant) -> Option<Instant> {
    let own = header(request.headers(), GRPC_TIMEOUT_HEADER)
        .and_then(parse_grpc_timeout)
        .and_then(|timeout| now.checked_add(timeout));
    let caller = current_work().and_then(|work| work.deadline());
    match (own, caller) {
        (Some(own), Some(caller)) => Some(own.min(caller)),
        (own, caller) => own.or(caller),
    }
}

impl<B: Clone, ResBody, E> Policy<Request<B>, Response<ResBody>, E> for RetryPolicy {
    type Future = RetryWait;

    fn retry(
        &mut self,
        request: &mut Request<B>,
        result: &mut Result<Response<ResBody>, E>,
    ) -> Option<RetryWait> {
        let Answer::Overloaded(hint) = answer(result.as_ref().ok()?) else {
            return None;
        };
        let attempts = *request.extensions().get::<Attempts>()?;
        if attempts.sent >= self.shared.max_attempts {
            return None;
        }
        let wait = self.wait(hint, attempts.sent)?;
        let now = Instant::now();
        let resend_at = now.checked_add(wait)?;
        if attempts
            .deadline
            .is_some_and(|deadline| resend_at >= deadline)
        {
            return None;
        }
        let pause = if wait.is_zero() {
            None
        } else {
            // No timer to wait with: not retried, rather than retried
            // sooner than the endpoint asked.
            Some(crate::timer::sleep_until(resend_at)?)
        };
        if !self.shared.budget.withdraw_at(now) {
            return None;
        }
        if let Some(deadline) = attempts.deadline {
            if request.headers().contains_key(GRPC_TIMEOUT_HEADER) {
                let left = deadline.saturating_duration_since(resend_at);
                if let Ok(value) = HeaderValue::try_from(format_grpc_timeout(left)) {
                    request.headers_mut().insert(GRPC_TIMEOUT_HEADER, value);
                }
            }
        }
        Some(RetryWait { pause })
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        let attempts = match request.extensions().get::<Attempts>() {
            Some(earlier) => Attempts {
                sent: earlier.sent.saturating_add(1),
                ..*earlier
            },
            None => {
                let now = Instant::now();
                self.shared.budget.deposit_at(now);
                Attempts {
                    sent: 1,
                    deadline: deadline_of(request, now),
                }
            }
        };
        let mut clone = Request::new(request.body().clone());
        *clone.method_mut() = request.method().clone();
        *clone.uri_mut() = request.uri().clone();
        *clone.version_mut() = request.version();
        *clone.headers_mut() = request.headers().clone();
        *clone.extensions_mut() = request.extensions().clone();
        clone.extensions_mut().insert(attempts);
        Some(clone)
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.shared.max_attempts)
            .field("backoff", &self.shared.backoff)
            .field("budget", &self.shared.budget)
            .finish()
    }
}

/// The wait before a retry: [`RetryPolicy`]'s `Policy::Future`.
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct RetryWait {
    #[pin]
    pause: Option<Sleep>,
}

impl Future for RetryWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.project().pause.as_pin_mut() {
            Some(pause) => pause.poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl fmt::Debug for RetryWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryWait")
            .field("waits", &self.pause.is_some())
            .finish()
    }
}
