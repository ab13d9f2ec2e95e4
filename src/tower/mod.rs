//! Admission as tower middleware (feature `tower`).
//!
//! [`AdmissionLayer`] wraps a service so that every request is classified
//! into a [`WorkInfo`](crate::WorkInfo) (tenant, priority, deadline) by a
//! [`Classify`] implementation, waits for admission in a
//! [`WorkQueue`](crate::WorkQueue), and only then reaches the inner
//! service. The slot is held while the handler computes and returned on
//! every path: success, error, or the response future being dropped. While
//! the handler *waits* (a database call, a downstream request, a lock held
//! elsewhere, a timer) the layer gives the slot back by itself, and asks
//! for it again, ahead of newer work of the request's priority, when the
//! handler is ready to compute: no annotation in the handler, and a
//! `yield_now` or an exhausted cooperative budget keeps the slot (see
//! [`SlotPermit::run`](crate::SlotPermit::run) for how a wait is told from
//! a yield, and why that keeps priority true after admission). Asked for
//! again after its deadline passed, the slot is refused and the request
//! answered as a refusal. [`release_during`] does the same around one wait
//! explicitly, and one left only with waiting (a call to another service, a
//! response to stream) can give it back for good with [`release_slot`]. A
//! handler that computes for long can offer its slot to waiting work of a
//! higher priority between chunks with [`give_way`].
//!
//! **HTTP mode** ([`AdmissionLayer::http`]): a refused request is answered with
//! a response (503 by default, or 429, with `Retry-After` from the queue's
//! wait estimate and the reason in [`REASON_HEADER`]; see [`RefusalPolicy`]),
//! and the service keeps the inner service's error type, so axum's
//! `Router::layer` takes it as it is. A gRPC call (tonic behind the same
//! layer) is refused the gRPC way: `grpc-status` UNAVAILABLE or
//! DEADLINE_EXCEEDED, and `grpc-retry-pushback-ms` from the estimate. An axum app protected in four added
//! lines (plus the imports):
//!
//! ```
//! use std::time::Duration;
//! use admission::cpu::Controller;
//! use admission::tower::{AdmissionLayer, HttpClassifier};
//! use axum::{routing::get, Router};
//!
//! # async fn app() -> Result<Router, Box<dyn std::error::Error>> {
//! let controller = Controller::for_runtime(&tokio::runtime::Handle::current()).build()?;
//! let classifier = HttpClassifier::new().default_timeout(Duration::from_millis(100))?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route_layer(AdmissionLayer::for_controller(controller, classifier).http());
//! # Ok(app) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(async { app().await.unwrap(); });
//! ```
//!
//! Every HTTP-mode response, refusals included, carries the queue's
//! admission level in [`LEVEL_HEADER`] (the lowest priority it still
//! admits now; see [`HttpAdmissionLayer::admission_level_header`]), and
//! opt-in an ORCA load report in [`LOAD_HEADER`] when the request asks for
//! one ([`HttpAdmissionLayer::load_reports`]). The [`client`] module is the
//! other end: a layer for outbound calls that learns those levels per
//! downstream endpoint and refuses below them before sending, throttles
//! adaptively, retries within a budget, and gives the caller's slot back
//! while the call is in flight.
//!
//! `route_layer` leaves unknown paths (the 404 fallback) outside
//! admission; `layer` would queue them too. The layer owns the controller
//! ([`AdmissionLayer::for_controller`]): a controller dropped while its
//! queue is in use closes the queue and every request is refused.
//!
//! **Generic mode**: any `Service<Req>`; a refused request fails with
//! [`AdmissionError::Rejected`], which the application maps (for HTTP, with
//! [`rejection_response`] for example). `AdmissionError<E>` is an `Error`
//! for any displayable `E`, `BoxError` included, so the layer composes with
//! tower's `timeout` and friends.
//!
//! # Readiness
//!
//! `poll_ready` is the inner service's readiness: admission happens in the
//! response future, because the class depends on the request, which
//! `poll_ready` does not see. `load_shed()` or `buffer()` placed outside the
//! layer therefore see no back-pressure from admission; the queue answers
//! overload per request instead (a full queue, or, with early rejection, a
//! deadline the request would miss, is refused at once).
//!
//! # Propagation
//!
//! A request's class is decided once, at the edge, and every service it
//! fans out to should honour the same class (the cross-service idea of
//! DAGOR): a low-priority batch call must not become normal priority one hop
//! later. The convention is two headers, [`TENANT_HEADER`] and
//! [`PRIORITY_HEADER`], plus the remaining deadline as gRPC's
//! `grpc-timeout` (digits and a unit):
//!
//! * on the server side, [`HttpClassifier`] reads them into a
//!   [`WorkInfo`](crate::WorkInfo), believing them as far as it trusts the
//!   caller (see the [trust model](#trust-model)), and [`AdmissionService`]
//!   makes the admitted request's `WorkInfo` the task's current one
//!   ([`current_work`]) while its handler runs;
//! * on the client side, [`PropagateLayer`] stamps every outgoing request
//!   made from inside such a handler with the current tenant, priority and
//!   what is left of the deadline ([`stamp`] does it for one request).
//!
//! Headers that do not parse are ignored (the classifier's defaults apply),
//! never an error: a malformed header is not a reason to fail a request.
//!
//! # Trust model
//!
//! A request's class decides who waits for whom, so whatever a caller may
//! claim about itself is a privilege. [`HttpClassifier`] reads three
//! headers ([`TENANT_HEADER`],
//! [`PRIORITY_HEADER`] and a `grpc-timeout`
//! deadline) and believes them only as far as the caller is trusted:
//!
//! | | trusted caller | untrusted caller |
//! |---|---|---|
//! | priority header | honoured up to [`max_priority`](HttpClassifier::max_priority) | honoured only to go *lower* than the route's or the default priority |
//! | tenant header | honoured, except reserved ids ([`TenantId::SYSTEM`](crate::TenantId::SYSTEM) and those added with [`reserve_tenant`](HttpClassifier::reserve_tenant)) | ignored: the default tenant ([`TenantId::ANONYMOUS`](crate::TenantId::ANONYMOUS) unless set) |
//! | deadline header | honoured | honoured only to be *shorter* than the [`default_timeout`](HttpClassifier::default_timeout) |
//!
//! Whether a caller is trusted is the application's decision, made by the
//! predicate given to [`trust`](HttpClassifier::trust) from the request's
//! [`Caller`] view: its peer address (axum's `ConnectInfo` in the
//! extensions), an authentication extension a layer in front inserted, a
//! header a proxy signs, anything. Without a predicate nobody is trusted,
//! so a service exposed as it is cannot be told "I am high priority" by
//! whoever connects. Services behind it that receive propagated headers
//! (see [propagation](#propagation)) trust their upstream, for example
//! with [`trust_all`](HttpClassifier::trust_all) on an internal network.
//!
//! Even a trusted caller chooses its tenant id; where that id is not
//! authenticated, build the queue with
//! [`newcomers_start_behind`](crate::WorkQueueBuilder::newcomers_start_behind):
//! a tenant the queue has not seen then starts just behind the least-served
//! waiting tenant, so minting a fresh tenant id per request gains nothing.
//! A `default_priority` above `max_priority` is a construction error, not a
//! silent cap.
//!
//! # Failure model
//!
//! **Classifier** (component `classifier`): the closure or
//! [`HttpClassifier`] the layer calls on every request is user code. If it
//! panics, the panic is caught, logged and counted
//! ([`AdmissionLayer::classifier_health`],
//! `admission_callback_panics_total{component="classifier"}`), and the
//! request is served at the lowest trust: the default tenant at
//! [`Priority::USER_LOW`](crate::Priority::USER_LOW) (the lowest rung for
//! requests from users: the rungs below are for background work that may
//! wait indefinitely), no deadline, never a bypass.
//! Fail-open for the request (it is still admitted, through the queue, like
//! any other), fail-closed for its privileges: a broken classifier can slow
//! its requests down, never raise them above work that was classified. The
//! next request calls the classifier again.
//!
//! **Headers**: what a caller sends is never a reason to fail or panic.
//! Header values are parsed as bytes (a multi-byte character is simply not
//! a digit), numbers are bounded before any arithmetic (`grpc-timeout`
//! takes at most eight digits, so its largest value is representable as a
//! deadline), and a value that does not parse is ignored in favour of the
//! classifier's defaults. A `Retry-After` of any length saturates.
//!
//! Priority and tenant travel with the request between services:
//! [`HttpClassifier`] reads them (and a deadline) from headers, the admitted
//! request's class is the handler task's [`current_work`], and
//! [`PropagateLayer`] stamps outgoing requests with it; see [propagation](#propagation).
//!
//! ```
//! use admission::tower::AdmissionLayer;
//! use admission::{Priority, TenantId, WorkInfo, WorkQueue};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let queue = WorkQueue::new(4).unwrap();
//! let service = ServiceBuilder::new()
//!     .layer(AdmissionLayer::new(queue, |request: &u64| {
//!         WorkInfo::new(TenantId::new(*request), Priority::NORMAL)
//!     }))
//!     .service(service_fn(|request: u64| async move {
//!         Ok::<_, std::convert::Infallible>(request * 2)
//!     }));
//! assert_eq!(service.oneshot(21).await.unwrap(), 42);
//! # });
//! ```

mod classify;
pub mod client;
mod error;
mod future;
mod http;
mod layer;
mod propagate;
mod release;
mod report;
mod service;
mod status;

pub use classify::{Caller, Classify, HttpClassifier};
pub use error::AdmissionError;
pub use future::ResponseFuture;
pub use http::{
    HttpAdmissionLayer, HttpAdmissionService, HttpResponseFuture, RefusalPolicy, REASON_HEADER,
};
pub use layer::AdmissionLayer;
pub use propagate::{
    current_work, stamp, PropagateLayer, PropagateService, PRIORITY_HEADER, TENANT_HEADER,
};
pub use release::{give_way, release_during, release_slot};
pub use report::{LoadReport, LEVEL_HEADER, LOAD_HEADER};
pub use service::AdmissionService;
pub use status::rejection_response;
pub(crate) use status::status_for;
