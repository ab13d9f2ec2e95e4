//! Admission as tower middleware (feature `tower`).
//!
//! [`AdmissionLayer`] wraps a service so that every request is classified
//! into a [`WorkInfo`](crate::WorkInfo) (tenant, priority, deadline), waits
//! for admission in a [`WorkQueue`](crate::WorkQueue), and only then reaches
//! the inner service. The slot is held until the response future completes
//! and returned on every path: success, error, or the response future being
//! dropped. A refused request fails with [`AdmissionError::Rejected`], which
//! the application maps, for example with [`rejection_response`] (429 with
//! `Retry-After` for capacity pressure, 503 when closed, 504 for a deadline).
//!
//! # Failure model
//!
//! **Classifier** (component `classifier`): the closure or
//! [`HttpClassifier`] the layer calls on every request is user code. If it
//! panics, the panic is caught, logged and counted
//! ([`AdmissionLayer::classifier_health`],
//! `admission_callback_panics_total{component="classifier"}`), and the
//! request is served at the lowest trust: the default tenant at
//! [`CLASSIFIER_FALLBACK_PRIORITY`] (user-low), no deadline, never a bypass.
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
//! [`PropagateLayer`] stamps outgoing requests with it; see [`propagate`].
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

mod error;
mod future;
mod layer;
pub mod propagate;
mod service;
mod status;

pub use error::AdmissionError;
pub use future::ResponseFuture;
pub use layer::AdmissionLayer;
pub use propagate::{
    current_work, format_grpc_timeout, parse_grpc_timeout, HttpClassifier, PropagateLayer,
    PropagateService,
};
pub use service::{AdmissionService, CLASSIFIER_FALLBACK_PRIORITY};
pub use status::{rejection_response, status_for};
