//! The HTTP mode of the layer: refusals answered as responses, the inner
//! service's error type kept, as tower-http's own layers do.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::classify::Classify;
use super::error::AdmissionError;
use super::future::ResponseFuture;
use super::layer::AdmissionLayer;
use super::report::{Reporter, Reports};
use super::service::AdmissionService;
use crate::sync::{Arc, AtomicBool, Ordering};
use crate::AdmitError;

/// The header naming why a request was refused: the short
/// [`AdmitError::reason`] (`queue_full`, `would_miss_deadline`, `closed`...),
/// the same string as the `outcome` label of `admission_requests_total`.
pub const REASON_HEADER: &str = "x-admission-reason";

/// How refusals are answered in the HTTP mode.
///
/// Capacity pressure (the queue is full, or the request would not make its
/// deadline) gets the refusal status, `503 Service Unavailable` by default
/// or `429 Too Many Requests`, with a `Retry-After` hint: the queue's own
/// estimate of the wait where it made one (`WouldMissDeadline { expected,
/// .. }`), else [`HttpAdmissionLayer::retry_after`]; in whole seconds, at
/// least one, at most [`HttpAdmissionLayer::max_retry_after`]. A closed
/// queue is `503` without a hint, a deadline that passed `504`; see
/// [`rejection_response`](super::rejection_response) for the rest. Every refusal carries
/// [`REASON_HEADER`] and an empty body. A gRPC call (content type
/// `application/grpc`) is refused the gRPC way instead; see
/// [`grpc_response`](Self::grpc_response).
#[derive(Clone, Copy, Debug)]
pub struct RefusalPolicy {
    status: StatusCode,
    retry_after: Duration,
    max_retry_after: Duration,
    pace: Duration,
}

impl Default for RefusalPolicy {
    fn default() -> Self {
        RefusalPolicy {
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: Duration::from_secs(1),
            max_retry_after: Duration::from_secs(60),
            pace: HttpAdmissionLayer::<()>::DEFAULT_REFUSAL_PACE,
        }
    }
}

/// The header names a refusal sets, built once: inserting a name given as a
/// `&str` that is not one of `http`'s standard headers copies it into a
/// fresh buffer on every response.
const REASON: HeaderName = HeaderName::from_static(REASON_HEADER);
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_RETRY_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// `millis` as a header value with one allocation (its bytes):
/// `HeaderValue::from(u64)` takes two, a growable buffer and the shared
/// handle it is frozen into.
fn millis_value(millis: u64) -> HeaderValue {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = millis;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    HeaderValue::from_bytes(&digits[start..]).unwrap_or_else(|_| HeaderValue::from(millis))
}

/// gRPC status codes a refusal maps to (`google.rpc.Code`).
const GRPC_UNAVAILABLE: &str = "14";
const GRPC_DEADLINE_EXCEEDED: &str = "4";
const GRPC_INTERNAL: &str = "13";
const GRPC_RESOURCE_EXHAUSTED: &str = "8";

/// Whether `request` is a gRPC call (its content type is
/// `application/grpc`, possibly with a `+proto`-style suffix).
pub(super) fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

impl RefusalPolicy {
    /// The response to `error` for a gRPC call: a trailers-only response
    /// (HTTP 200, the status in `grpc-status`), as gRPC clients expect.
    /// Capacity pressure and a closed queue are `UNAVAILABLE` (which gRPC
    /// clients may retry), with the queue's wait estimate as
    /// `grpc-retry-pushback-ms` (gRPC's `Retry-After`); a tenant over its
    /// quota is `RESOURCE_EXHAUSTED`, with the quota's estimate; a deadline
    /// is `DEADLINE_EXCEEDED`; a runtime without timers `INTERNAL`. The
    /// reason is in `grpc-message` and [`REASON_HEADER`].
    pub fn grpc_response<B: Default>(&self, error: &AdmitError) -> Response<B> {
        let (status, retry) = super::status_for(error, self.retry_after);
        let code = match (error, status) {
            (AdmitError::OverQuota { .. }, _) => GRPC_RESOURCE_EXHAUSTED,
            (_, StatusCode::GATEWAY_TIMEOUT) => GRPC_DEADLINE_EXCEEDED,
            (_, StatusCode::INTERNAL_SERVER_ERROR) => GRPC_INTERNAL,
            _ => GRPC_UNAVAILABLE,
        };
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(GRPC_STATUS, HeaderValue::from_static(code));
        let reason = HeaderValue::from_static(error.reason());
        headers.insert(GRPC_MESSAGE, reason.clone());
        headers.insert(REASON, reason);
        if let Some(retry) = retry {
            let retry = match error {
                AdmitError::WouldMissDeadline { expected, .. } => *expected,
                _ => retry,
            };
            let millis = retry.min(self.max_retry_after).as_millis();
            let millis = u64::try_from(millis).unwrap_or(u64::MAX);
            headers.insert(GRPC_RETRY_PUSHBACK, millis_value(millis));
        }
        response
    }

    /// The response to `error`, with a body of `B::default()`. A tenant
    /// over its quota is always `429 Too Many Requests`, with the quota's
    /// `Retry-After`: it is the tenant's rate, not the node, at fault.
    pub fn response<B: Default>(&self, error: &AdmitError) -> Response<B> {
        let (status, retry) = super::status_for(error, self.retry_after);
        let capacity = matches!(
            error,
            AdmitError::QueueFull { .. } | AdmitError::WouldMissDeadline { .. }
        );
        let status = if capacity { self.status } else { status };
        let mut response = Response::new(B::default());
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(REASON, HeaderValue::from_static(error.reason()));
        if let Some(retry) = retry {
            let retry = match error {
                AdmitError::WouldMissDeadline { expected, .. } => *expected,
                _ => retry,
            };
            let retry = retry.min(self.max_retry_after);
            headers.insert(header::RETRY_AFTER, super::status::retry_after_value(retry));
        }
        response
    }

    /// How long to hold the answer to a capacity refusal (see
    /// [`HttpAdmissionLayer::pace_refusals`]): the layer's pace, but never
    /// longer than half the request's own time left (the client must hear
    /// the refusal, with its retry hint, before its deadline fires), nor
    /// than the wait the queue expected; over quota, the pace but never
    /// longer than the quota's `retry_after`; zero for every other refusal.
    pub fn pace_for(&self, error: &AdmitError) -> Duration {
        match error {
            AdmitError::WouldMissDeadline {
                expected,
                remaining,
            } => self.pace.min(*expected).min(*remaining / 2),
            AdmitError::QueueFull { .. } => self.pace,
            AdmitError::OverQuota { retry_after } => self.pace.min(*retry_after),
            _ => Duration::ZERO,
        }
    }
}

/// The layer of [`AdmissionLayer::http`]: refused requests are answered
/// with a response (see [`RefusalPolicy`]) instead of an error, so the service's
/// error type is the inner service's, and axum's `Router::layer` (which
/// wants `Infallible`) takes the layer as it is.
///
/// A closed queue refuses everything; the first such refusal a layer makes
/// is also logged as a warning, since the usual cause is a dropped
/// [`Controller`](crate::cpu::Controller) (use
/// [`AdmissionLayer::for_controller`] to have the layer own it).
#[derive(Clone)]
pub struct HttpAdmissionLayer<C> {
    layer: AdmissionLayer<C>,
    refusals: RefusalPolicy,
    reports: Reports,
    seen: Arc<Seen>,
}

/// What a layer has learned about its surroundings, shared by every
/// service and future it makes; and where its responses' reports come
/// from.
#[derive(Debug)]
struct Seen {
    reporter: Reporter,
    /// The closed-queue warning was logged.
    warned_closed: AtomicBool,
    /// A refusal could not be paced because the runtime has no timers:
    /// later ones are answered at once instead of trying again (tokio
    /// cannot be asked, and each try is a caught panic).
    no_timers: AtomicBool,
}

impl<C> HttpAdmissionLayer<C> {
    /// Default of [`pace_refusals`](Self::pace_refusals): 50 ms.
    pub(crate) const DEFAULT_REFUSAL_PACE: Duration = Duration::from_millis(50);

    pub(super) fn new(layer: AdmissionLayer<C>) -> Self {
        let reporter = Reporter::new(layer.queue().clone(), layer.owner());
        HttpAdmissionLayer {
            layer,
            refusals: RefusalPolicy::default(),
            reports: Reports::default(),
            seen: Arc::new(Seen {
                reporter,
                warned_closed: AtomicBool::new(false),
                no_timers: AtomicBool::new(false),
            }),
        }
    }

    /// The status of capacity refusals: `503 Service Unavailable` by
    /// default; `429 Too Many Requests` for clients that treat 503 as the
    /// server being down. Any status is taken as given.
    pub fn refusal_status(mut self, status: StatusCode) -> Self {
        self.refusals.status = status;
        self
    }

    /// The `Retry-After` hint where the queue made no estimate (a full
    /// queue): default one second.
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.refusals.retry_after = retry_after;
        self
    }

    /// The longest `Retry-After` hint given, however long the estimate
    /// (default 60 seconds). Hints up to a minute are static strings; a
    /// longer one costs the refusal an allocation for its digits.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.refusals.max_retry_after = max;
        self
    }

    /// Holds the answer to a capacity refusal (a full queue, or a request
    /// that would miss its deadline) for up to `pace` before sending it
    /// (default 50 ms;
    /// `Duration::ZERO` answers at once).
    ///
    /// Why: a client that ignores `Retry-After` sends its next request the
    /// moment it is refused, so under overload a few hundred such
    /// connections make the server answer tens of thousands of refusals a
    /// second, and that work (parsing, answering) takes the CPU from the
    /// requests admission keeps. Holding each refusal a little bounds every
    /// connection to one refusal per pace: measured with
    /// `examples/http_load.rs` (200 unpaced bulk connections beside 4 on
    /// `/high`, 2-core VM), answering at once left `/high` p99 at 2.25x its
    /// value alone with 36,000 refusals a second; see the README for the
    /// run with pacing. The hold is never longer than half the time the
    /// request has left before its deadline (so the refusal and its retry
    /// hint arrive before the client's own deadline fires) nor than the wait
    /// the queue expected; a client that fails over to another replica at
    /// once loses at most the pace.
    /// The hold is a tokio timer per refused request, and the connection
    /// stays open meanwhile. On a runtime without timers the answer goes at
    /// once, and after the first such refusal the layer no longer tries
    /// (tokio cannot be asked whether it has timers; each try is a caught
    /// panic and a logged error).
    pub fn pace_refusals(mut self, pace: Duration) -> Self {
        self.refusals.pace = pace;
        self
    }

    /// Whether every response, refusals included, carries the queue's
    /// admission level in [`LEVEL_HEADER`](super::LEVEL_HEADER) (default:
    /// on): the lowest priority the queue still admits now, which callers
    /// behind a [`DownstreamLayer`](super::client::DownstreamLayer) learn,
    /// so that they drop work below it before sending it (DAGOR's level).
    ///
    /// The level comes from the outcomes of the queue's recent requests,
    /// counted per priority in windows of at least 20 ms: admitted, or
    /// refused for capacity (a full queue, early rejection, a deadline that
    /// expired while waiting; no other refusal says anything about room).
    /// A priority is *shed* when, over the current window and the one
    /// before, its refusals outnumber its admissions. The level is one
    /// above the highest priority of the run of shed priorities that starts
    /// at the lowest priority with outcomes, else `-128` (everything is
    /// admitted); it never exceeds `127`, the top of the ladder. So a
    /// higher priority refused for reasons of its own (a deadline too
    /// short for the wait) while lower ones are admitted does not lift the
    /// level, and a priority nobody sends any more is forgotten, and so
    /// tried again, within two windows.
    ///
    /// The queue works the level out when it counts an outcome that can
    /// change it and publishes it in an atomic, so writing it costs a
    /// response one atomic load and one header, no lock, no clock read and
    /// no allocation (the value is a static string); see
    /// `examples/refusal_cost.rs` for its share of a refusal's cost.
    pub fn admission_level_header(mut self, on: bool) -> Self {
        self.reports.level = on;
        self
    }

    /// Whether responses, refusals included, to requests that ask for one
    /// carry a load report in [`LOAD_HEADER`](super::LOAD_HEADER)
    /// (`endpoint-load-metrics`, ORCA's text form; default: off). A request
    /// asks with ORCA's per-request header, `endpoint-load-metrics-format`
    /// (any value: the answer is in the text form, which names itself), as
    /// Envoy sends it and as this crate's
    /// [`DownstreamLayer`](super::client::DownstreamLayer) does once per
    /// endpoint every 100 ms; other responses carry no report and pay
    /// nothing for it but one header look-up. The report: the CPU utilization of the controller
    /// this layer owns (when built with
    /// [`AdmissionLayer::for_controller`]), the completion rate, slots in
    /// flight, the queue length and the recent median wait; see
    /// [`LoadReport`](super::LoadReport). For balancers that steer by load
    /// (Envoy's and gRPC's weighted round robin read this header). The
    /// report is made at most once a millisecond (the controller's tick)
    /// and shared by the responses in between: a clock read, a leaf lock
    /// and a reference count per response.
    pub fn load_reports(mut self, on: bool) -> Self {
        self.reports.load = on;
        self
    }

    /// Reports, as this service's admission level, the highest of its
    /// queue's own and the levels `downstreams` believes now for the
    /// endpoints it calls (DAGOR's levels carried upstream): for a service
    /// whose requests call each of those endpoints, which therefore cannot
    /// serve work below their levels, and whose own callers should then
    /// not send it. A handler refuses such work before doing any of its own
    /// by checking [`Downstreams::level`](super::client::Downstreams::level).
    /// Costs each response one lock and one clock read per endpoint.
    pub fn report_downstream_levels(mut self, downstreams: &super::client::Downstreams) -> Self {
        self.seen = Arc::new(Seen {
            reporter: self.seen.reporter.with_downstreams(downstreams.clone()),
            warned_closed: AtomicBool::new(self.seen.warned_closed.load(Ordering::Relaxed)),
            no_timers: AtomicBool::new(self.seen.no_timers.load(Ordering::Relaxed)),
        });
        self
    }

    /// How refusals are answered.
    pub fn refusals(&self) -> RefusalPolicy {
        self.refusals
    }

    /// The admission layer underneath (its queue, classifier health and
    /// controller).
    pub fn admission(&self) -> &AdmissionLayer<C> {
        &self.layer
    }
}

impl<S, C: Clone> Layer<S> for HttpAdmissionLayer<C> {
    type Service = HttpAdmissionService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpAdmissionService {
            inner: self.layer.layer(inner),
            refusals: self.refusals,
            reports: self.reports,
            seen: self.seen.clone(),
        }
    }
}

impl<C> fmt::Debug for HttpAdmissionLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpAdmissionLayer")
            .field("layer", &self.layer)
            .field("refusals", &self.refusals)
            .finish()
    }
}

/// The service built by [`HttpAdmissionLayer`]. Readiness is the inner
/// service's, as for [`AdmissionService`].
#[derive(Clone)]
pub struct HttpAdmissionService<S, C> {
    inner: AdmissionService<S, C>,
    refusals: RefusalPolicy,
    reports: Reports,
    seen: Arc<Seen>,
}

impl<S, C, B, ResBody> Service<Request<B>> for HttpAdmissionService<S, C>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    C: Classify<Request<B>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = HttpResponseFuture<S, Request<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_inner_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let grpc = is_grpc(&request);
        let mut reports = self.reports;
        // A load report answers a request that asks for one: a balancer
        // or client asks as often as it wants fresh figures, and every
        // other response is spared the report's cost.
        reports.load &= request.headers().contains_key(super::report::LOAD_FORMAT);
        HttpResponseFuture {
            grpc,
            inner: self.inner.call(request),
            refusals: self.refusals,
            reports,
            seen: self.seen.clone(),
            paced: None,
            pause: None,
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for HttpAdmissionService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpAdmissionService")
            .field("inner", &self.inner)
            .field("refusals", &self.refusals)
            .finish()
    }
}

/// The future of [`HttpAdmissionService`]: the inner response, or the
/// refusal's.
#[pin_project]
pub struct HttpResponseFuture<S: Service<Req>, Req> {
    #[pin]
    inner: ResponseFuture<S, Req>,
    refusals: RefusalPolicy,
    reports: Reports,
    seen: Arc<Seen>,
    /// Answer a refusal the gRPC way.
    grpc: bool,
    /// A refusal's answer, held until `pause` fires (see
    /// [`HttpAdmissionLayer::pace_refusals`]).
    paced: Option<<S as Service<Req>>::Response>,
    #[pin]
    pause: Option<tokio::time::Sleep>,
}

impl<S, Req, ResBody> Future for HttpResponseFuture<S, Req>
where
    S: Service<Req, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // A paced refusal: its answer goes when the pause ends.
            if let Some(pause) = this.pause.as_mut().as_pin_mut() {
                ready!(pause.poll(cx));
                this.pause.set(None);
                if let Some(response) = this.paced.take() {
                    return Poll::Ready(Ok(response));
                }
            }
            let error = match ready!(this.inner.as_mut().poll(cx)) {
                Ok(mut response) => {
                    this.seen
                        .reporter
                        .stamp(*this.reports, response.headers_mut());
                    return Poll::Ready(Ok(response));
                }
                Err(AdmissionError::Inner(error)) => return Poll::Ready(Err(error)),
                Err(AdmissionError::Rejected(error)) => error,
            };
            if matches!(error, AdmitError::Closed)
                && !this.seen.warned_closed.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    target: "admission",
                    "admission queue is closed: every request is refused with 503; \
                     was its Controller dropped? (AdmissionLayer::for_controller keeps it)"
                );
            }
            let mut response = if *this.grpc {
                this.refusals.grpc_response(&error)
            } else {
                this.refusals.response(&error)
            };
            this.seen
                .reporter
                .stamp(*this.reports, response.headers_mut());
            let pace = this.refusals.pace_for(&error);
            if pace.is_zero() || this.seen.no_timers.load(Ordering::Relaxed) {
                return Poll::Ready(Ok(response));
            }
            let Some(pause) = tokio::time::Instant::now().checked_add(pace) else {
                return Poll::Ready(Ok(response));
            };
            let Some(pause) = crate::timer::sleep_until(pause) else {
                this.seen.no_timers.store(true, Ordering::Relaxed);
                return Poll::Ready(Ok(response));
            };
            this.pause.set(Some(pause));
            *this.paced = Some(response);
        }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for HttpResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpResponseFuture")
            .field("inner", &self.inner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_are_written_in_decimal() {
        for millis in [0, 7, 10, 1000, 123_456_789, u64::MAX] {
            assert_eq!(millis_value(millis), millis.to_string().as_str());
        }
    }
}
