//! The outbound service: refuse here what the endpoint would refuse, give
//! the caller's slot back while the call is in flight.

use std::fmt;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use super::downstreams::Downstreams;
use super::future::{DownstreamFuture, Learn, Local};
use crate::tower::propagate::{current_work, header, parse_priority, PRIORITY_HEADER};
use crate::tower::release::take_held;
use crate::tower::report::LOAD_FORMAT;
use crate::work::Priority;

/// The service built by [`DownstreamLayer`](super::DownstreamLayer).
///
/// Each call to a configured endpoint (see
/// [`DownstreamsBuilder::endpoint`](super::DownstreamsBuilder::endpoint)):
///
/// 1. takes the request's priority from its
///    [`PRIORITY_HEADER`](crate::tower::PRIORITY_HEADER) if it
///    has one, else from the work the calling task serves
///    ([`current_work`]); a request of no known priority is never refused
///    for a level;
/// 2. refuses it here, with [`DownstreamError::BelowLevel`](super::DownstreamError::BelowLevel),
///    when that priority is below the level believed for the endpoint
///    (see [`Downstreams::level`]);
/// 3. refuses it here with the adaptive throttle's probability for its
///    priority ([`DownstreamError::Throttled`](super::DownstreamError::Throttled));
/// 4. gives the caller's admission slot back while the call is in flight,
///    if it holds one (see
///    [`release_slot_during_calls`](super::DownstreamsBuilder::release_slot_during_calls));
/// 5. learns from the response: whether the endpoint accepted the request
///    (anything but a 503, a 429 or a gRPC `UNAVAILABLE` or
///    `RESOURCE_EXHAUSTED`), its admission level and its load report.
///
/// A request to any other endpoint only goes through step 4.
///
/// Readiness is the inner service's.
#[derive(Clone)]
pub struct DownstreamService<S> {
    inner: S,
    downstreams: Downstreams,
}

impl<S> DownstreamService<S> {
    pub(super) fn new(inner: S, downstreams: Downstreams) -> Self {
        DownstreamService { inner, downstreams }
    }
}

/// The class a request carries: its own header, else the caller's.
fn priority_of<B>(request: &Request<B>) -> Option<Priority> {
    header(request.headers(), PRIORITY_HEADER)
        .and_then(parse_priority)
        .or_else(|| current_work().map(|work| work.priority()))
}

impl<S, B, ResBody> Service<Request<B>> for DownstreamService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = super::DownstreamError<S::Error>;
    type Future = DownstreamFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(super::DownstreamError::Inner)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let shared = &self.downstreams.inner;
        let learn = match shared.endpoint_for(request.uri().authority()) {
            Some(endpoint) => {
                let priority = priority_of(&request);
                match shared.check(endpoint, priority, Instant::now()) {
                    Err(refusal) => return DownstreamFuture::refused(refusal),
                    Ok(SendAs { ask_for_load }) => {
                        if ask_for_load {
                            request
                                .headers_mut()
                                .insert(LOAD_FORMAT, HeaderValue::from_static("TEXT"));
                        }
                    }
                }
                Some(Learn::new(shared.clone(), endpoint, priority))
            }
            None => None,
        };
        let released = if shared.release_slot {
            take_held()
        } else {
            None
        };
        let call = self.inner.call(request);
        match released {
            Some(permit) => DownstreamFuture::released(permit.release_during(call), learn),
            None => DownstreamFuture::direct(call, learn),
        }
    }
}

impl super::downstreams::Inner {
    /// Whether a request of `priority` may go to `endpoint` at `now`: the
    /// level, then the throttle (which counts the request either way); and
    /// how a request that may go is sent.
    fn check(
        &self,
        endpoint: usize,
        priority: Option<Priority>,
        now: Instant,
    ) -> Result<SendAs, Local> {
        let state = &self.endpoints[endpoint].state;
        let probability = {
            let mut state = state.lock();
            if let (Some(priority), Some(level)) = (priority, self.believed_level(&state, now)) {
                if priority < level {
                    state.counts.below_level = state.counts.below_level.saturating_add(1);
                    return Err(Local::BelowLevel { priority, level });
                }
            }
            let probability = state.throttle.probability(priority, now);
            state.throttle.requested(priority, now);
            if probability == 0.0 {
                state.counts.sent = state.counts.sent.saturating_add(1);
                return Ok(SendAs {
                    ask_for_load: state.asks_for_load(now),
                });
            }
            probability
        };
        // The draw is user code: outside the lock.
        let throttled = self.draw() < probability;
        let mut state = state.lock();
        if throttled {
            state.counts.throttled = state.counts.throttled.saturating_add(1);
            Err(Local::Throttled { probability })
        } else {
            state.counts.sent = state.counts.sent.saturating_add(1);
            Ok(SendAs {
                ask_for_load: state.asks_for_load(now),
            })
        }
    }
}

/// How a request that may go to its endpoint is sent.
struct SendAs {
    /// With ORCA's per-request header: the endpoint's load report is due
    /// (see `LOAD_REPORT_PERIOD`).
    ask_for_load: bool,
}

impl<S: fmt::Debug> fmt::Debug for DownstreamService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DownstreamService")
            .field("inner", &self.inner)
            .field("downstreams", &self.downstreams)
            .finish()
    }
}
