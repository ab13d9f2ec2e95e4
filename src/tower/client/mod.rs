//! The outbound side: overload control across hops, for the calls a
//! service makes to the services behind it.
//!
//! The node's queue is half the story under overload. Callers retry
//! refused work (a 3x overload with three retries offers up to 12x),
//! upstream services spend CPU on requests a downstream will refuse anyway,
//! and a handler that waits on a call holds a slot it does not use. The
//! published answers are local decisions with signals that travel on the
//! RPCs themselves, and this module is the client's half of them; the
//! server's half is the [`HttpAdmissionLayer`](super::HttpAdmissionLayer)'s
//! [`LEVEL_HEADER`](super::LEVEL_HEADER) on every response (and, opt-in,
//! its [`LOAD_HEADER`](super::LOAD_HEADER) load report, which the client
//! asks each endpoint for on one request every 100 ms, with ORCA's
//! per-request `endpoint-load-metrics-format` header).
//!
//! * **Admission levels** (DAGOR): each response says the lowest priority
//!   the endpoint's queue still admits; the client remembers it per
//!   endpoint and refuses work below it before sending it
//!   ([`DownstreamError::BelowLevel`]: fail fast, nothing sent). A level
//!   expires ([`level_ttl`](DownstreamsBuilder::level_ttl)), so an
//!   endpoint that went quiet is tried again.
//! * **Adaptive throttling** (Google SRE, "Handling Overload"): per
//!   endpoint and priority, a request is refused here with probability
//!   `max(0, (requests − K·accepts) / (requests + 1))` over a trailing
//!   window, K = 2 ([`DownstreamError::Throttled`]).
//! * **Retries** ([`RetryPolicy`], for tower's `Retry`): only overload
//!   refusals, after the endpoint's `Retry-After` or
//!   `grpc-retry-pushback-ms`, at most three attempts, never past the
//!   request's deadline, each retry paid from a [`RetryBudget`] (at most
//!   10% of requests, plus a small floor).
//! * **The caller's slot**: while the call is in flight, the admission slot
//!   of the request the handler serves is given back and taken again, in
//!   order, when the answer comes ([`release_during`](super::release_during)).
//!
//! # Trust
//!
//! A level is a claim about an endpoint's queue, and what the client does
//! with it (refuse work) is a privilege. So levels and load reports are
//! read only from the endpoints the client was configured to call
//! ([`DownstreamsBuilder::endpoint`]), matched on the request's URI
//! authority; a request to any other endpoint is sent as it is and its
//! response is not read. What a configured endpoint sends is read as bytes
//! and bounded: a header that does not parse, or appears twice, is no
//! information (the previous level expires on its own), never "refuse
//! everything" or "admit everything"; and a level above the
//! [`level_cap`](DownstreamsBuilder::level_cap) (user-high by default) is
//! taken as the cap, so work at or above it is always sent, whatever an
//! endpoint says.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use admission::tower::client::Downstreams;
//! use admission::tower::PropagateLayer;
//! use tower::retry::RetryLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let downstreams = Downstreams::builder()
//!     .endpoint("127.0.0.1:8081")
//!     .build()
//!     .unwrap();
//! // Stand-in for a hyper-util client or a tonic channel.
//! let transport = service_fn(|_: http::Request<String>| async {
//!     let response = http::Response::builder()
//!         .header("x-admission-level", "0")
//!         .body(String::new())
//!         .unwrap();
//!     Ok::<_, std::convert::Infallible>(response)
//! });
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(downstreams.retry_policy()))
//!     .layer(downstreams.layer())
//!     .layer(PropagateLayer)
//!     .service(transport);
//! let request = || {
//!     http::Request::get("http://127.0.0.1:8081/")
//!         .header("x-admission-priority", "user-low")
//!         .body(String::new())
//!         .unwrap()
//! };
//! client.clone().oneshot(request()).await.unwrap();
//! assert_eq!(downstreams.level("127.0.0.1:8081"), Some(admission::Priority::NORMAL));
//! // Below the level the endpoint sent: refused here, nothing sent.
//! let refused = client.oneshot(request()).await.unwrap_err();
//! assert!(refused.to_string().contains("below the endpoint's admission level"));
//! # });
//! ```
//!
//! # Implementation notes
//!
//! [`Downstreams`] is an `Arc` around the configuration and one record per
//! configured endpoint, fixed at construction, so the client's state is
//! bounded by its configuration, never by what endpoints send. Each record
//! (the level and when it was heard, the throttle's window, the last load
//! report, counters) is behind its own leaf lock, taken once when a request
//! is checked (twice while the throttle refuses some: the coin is drawn
//! outside it, being user code behind a panic boundary) and once when its
//! response is read; never across a call or an await. The retry budget is
//! one more leaf lock, shared by every request in flight (see
//! [`RetryBudget`]). The caller's slot moves through the layer's task-local
//! cell (`release.rs`): taken out when the call is made, put back when it
//! is granted again.

mod answer;
mod budget;
mod downstreams;
mod error;
mod future;
mod layer;
mod retry;
mod service;
mod throttle;
mod window;

#[cfg(loom)]
#[doc(hidden)]
pub mod loom_models;

pub use budget::{BudgetSnapshot, RetryBudget};
pub use downstreams::{
    Downstreams, DownstreamsBuilder, DownstreamsSnapshot, EndpointCounts, EndpointSnapshot,
};
pub use error::DownstreamError;
pub use future::DownstreamFuture;
pub use layer::DownstreamLayer;
pub use retry::{RetryPolicy, RetryWait};
pub use service::DownstreamService;
