//! The layer that puts admission in front of a service.

use std::fmt;

use tower_layer::Layer;

use super::http::HttpAdmissionLayer;
use super::service::{classifier_boundary, AdmissionService};
use crate::cpu::Controller;
use crate::grant::SlotGranter;
use crate::health::{Boundary, ComponentHealth};
use crate::queue::WorkQueue;
use crate::quota::Quota;
use crate::sync::StdArc;

/// Applies admission control to a service; see the [module docs](super).
///
/// `classify` turns a request into the [`WorkInfo`](crate::WorkInfo) it is
/// admitted as: an [`HttpClassifier`](super::HttpClassifier), or any
/// `Fn(&Req) -> WorkInfo` (see [`Classify`](super::Classify)). It runs on
/// every request, before admission, so it should be cheap (read a header or
/// two). If it panics, the request is admitted at the lowest trust instead
/// ([`Priority::USER_LOW`](crate::Priority::USER_LOW) for the default
/// tenant; see the [failure model](super#failure-model)) and the panic is
/// counted in
/// [`classifier_health`](Self::classifier_health).
///
/// Refusals come out as [`AdmissionError::Rejected`](super::AdmissionError)
/// errors; for HTTP services, [`http`](Self::http) turns them into
/// responses instead and keeps the inner service's error type.
#[derive(Clone)]
pub struct AdmissionLayer<C> {
    queue: WorkQueue<SlotGranter>,
    classify: C,
    /// Shared by every service this layer builds: one health record for
    /// the one classifier.
    boundary: StdArc<Boundary>,
    /// The controller whose queue this is, when the layer owns it: the
    /// controller closes its queue when dropped, so the layer (and every
    /// service it builds) keeps it alive.
    owner: Option<StdArc<Controller>>,
    /// Tenant quotas checked before the queue, if attached.
    quota: Option<Quota>,
}

impl<C> AdmissionLayer<C> {
    /// A layer admitting through `queue`, classifying with `classify`.
    ///
    /// If `queue` belongs to a CPU [`Controller`], the controller must
    /// outlive the layer: dropping it closes the queue and every request is
    /// refused. [`for_controller`](Self::for_controller) rules that out.
    pub fn new(queue: WorkQueue<SlotGranter>, classify: C) -> Self {
        AdmissionLayer {
            queue,
            classify,
            boundary: classifier_boundary(),
            owner: None,
            quota: None,
        }
    }

    /// A layer admitting through `controller`'s queue that owns the
    /// controller: it lives as long as the layer or any service built from
    /// it, and closes when the last of them is dropped.
    pub fn for_controller(controller: Controller, classify: C) -> Self {
        let mut layer = Self::new(controller.queue().clone(), classify);
        layer.owner = Some(StdArc::new(controller));
        layer
    }

    /// The controller this layer owns, if it was built by
    /// [`for_controller`](Self::for_controller).
    pub fn controller(&self) -> Option<&Controller> {
        self.owner.as_deref()
    }

    /// The controller this layer owns, shared, for the load reports of the
    /// HTTP mode.
    pub(super) fn owner(&self) -> Option<StdArc<Controller>> {
        self.owner.clone()
    }

    /// The queue requests wait in.
    pub fn queue(&self) -> &WorkQueue<SlotGranter> {
        &self.queue
    }

    /// Admits every request through its tenant's [`Quota`] (one unit a
    /// request) before the queue: see [`Quota::admit`]. A request over
    /// quota is refused with
    /// [`AdmitError::OverQuota`](crate::AdmitError::OverQuota), which the
    /// HTTP mode answers with `429 Too Many Requests` and a `Retry-After`
    /// from the rate the tenant's quota refills at on this node (gRPC:
    /// `RESOURCE_EXHAUSTED`).
    ///
    /// ```
    /// use admission::quota::{Quota, TenantQuota};
    /// use admission::tower::{AdmissionLayer, HttpClassifier};
    /// use admission::WorkQueue;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let quota = Quota::builder()
    ///     .default_quota(TenantQuota::new(100, 200)?)
    ///     .build()?;
    /// let layer = AdmissionLayer::new(WorkQueue::new(8)?, HttpClassifier::new())
    ///     .with_quota(quota)
    ///     .http();
    /// # drop(layer);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_quota(mut self, quota: Quota) -> Self {
        self.quota = Some(quota);
        self
    }

    /// The classifier's panics, over every service this layer built.
    pub fn classifier_health(&self) -> ComponentHealth {
        self.boundary.health()
    }

    /// The HTTP mode: refusals become responses (see [`HttpAdmissionLayer`])
    /// and the inner service's error type is kept, so that axum's
    /// `Router::layer` takes the layer as it is.
    pub fn http(self) -> HttpAdmissionLayer<C> {
        HttpAdmissionLayer::new(self)
    }
}

impl<S, C: Clone> Layer<S> for AdmissionLayer<C> {
    type Service = AdmissionService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService::with_parts(
            inner,
            self.queue.clone(),
            self.classify.clone(),
            self.boundary.clone(),
            self.owner.clone(),
            self.quota.clone(),
        )
    }
}

impl<C> fmt::Debug for AdmissionLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("queue", &self.queue)
            .field("classifier", &self.boundary)
            .field("owns_controller", &self.owner.is_some())
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}
