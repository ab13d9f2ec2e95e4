//! The layer that puts admission in front of a service.

use std::fmt;

use tower_layer::Layer;

use super::service::{classifier_boundary, AdmissionService};
use crate::grant::SlotGranter;
use crate::health::{Boundary, ComponentHealth};
use crate::queue::WorkQueue;
use crate::sync::StdArc;

/// Applies admission control to a service; see the [module docs](super).
///
/// `classify` turns a request into the [`WorkInfo`](crate::WorkInfo) it is
/// admitted as. It runs on every request, before admission, so it should be
/// cheap (read a header or two). If it panics, the request is admitted at
/// the lowest trust instead ([`CLASSIFIER_FALLBACK_PRIORITY`](super::CLASSIFIER_FALLBACK_PRIORITY)
/// for the default tenant) and the panic is counted in
/// [`classifier_health`](Self::classifier_health).
#[derive(Clone)]
pub struct AdmissionLayer<C> {
    queue: WorkQueue<SlotGranter>,
    classify: C,
    /// Shared by every service this layer builds: one health record for
    /// the one classifier.
    boundary: StdArc<Boundary>,
}

impl<C> AdmissionLayer<C> {
    /// A layer admitting through `queue`, classifying with `classify`.
    pub fn new(queue: WorkQueue<SlotGranter>, classify: C) -> Self {
        AdmissionLayer {
            queue,
            classify,
            boundary: classifier_boundary(),
        }
    }

    /// The classifier's panics, over every service this layer built.
    pub fn classifier_health(&self) -> ComponentHealth {
        self.boundary.health()
    }
}

impl<S, C: Clone> Layer<S> for AdmissionLayer<C> {
    type Service = AdmissionService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService::with_boundary(
            inner,
            self.queue.clone(),
            self.classify.clone(),
            self.boundary.clone(),
        )
    }
}

impl<C> fmt::Debug for AdmissionLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("queue", &self.queue)
            .field("classifier", &self.boundary)
            .finish_non_exhaustive()
    }
}
