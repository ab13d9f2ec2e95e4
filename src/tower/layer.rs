//! The layer that puts admission in front of a service.

use std::fmt;

use tower_layer::Layer;

use super::service::AdmissionService;
use crate::grant::SlotGranter;
use crate::queue::WorkQueue;

/// Applies admission control to a service; see the [module docs](super).
///
/// `classify` turns a request into the [`WorkInfo`](crate::WorkInfo) it is
/// admitted as. It runs on every request, before admission, so it should be
/// cheap (read a header or two).
#[derive(Clone)]
pub struct AdmissionLayer<C> {
    queue: WorkQueue<SlotGranter>,
    classify: C,
}

impl<C> AdmissionLayer<C> {
    /// A layer admitting through `queue`, classifying with `classify`.
    pub fn new(queue: WorkQueue<SlotGranter>, classify: C) -> Self {
        AdmissionLayer { queue, classify }
    }
}

impl<S, C: Clone> Layer<S> for AdmissionLayer<C> {
    type Service = AdmissionService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService::new(inner, self.queue.clone(), self.classify.clone())
    }
}

impl<C> fmt::Debug for AdmissionLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}
