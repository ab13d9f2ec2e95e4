//! The service that makes every request wait for admission.

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use super::error::AdmissionError;
use super::future::ResponseFuture;
use crate::grant::SlotGranter;
use crate::queue::WorkQueue;
use crate::work::WorkInfo;

/// Admits each request through a [`WorkQueue`] before calling the inner
/// service; built by [`AdmissionLayer`](super::AdmissionLayer).
///
/// Readiness is the inner service's: admission happens in the response
/// future, because what a request is admitted as depends on the request.
/// The inner service must be `Clone` (as with most tower middleware that
/// calls it later than `call`): the ready instance is kept for this request
/// and a clone takes its place.
#[derive(Clone)]
pub struct AdmissionService<S, C> {
    inner: S,
    queue: WorkQueue<SlotGranter>,
    classify: C,
}

impl<S, C> AdmissionService<S, C> {
    /// Wraps `inner`.
    pub fn new(inner: S, queue: WorkQueue<SlotGranter>, classify: C) -> Self {
        AdmissionService {
            inner,
            queue,
            classify,
        }
    }

    /// The queue requests wait in.
    pub fn queue(&self) -> &WorkQueue<SlotGranter> {
        &self.queue
    }
}

impl<S, C, Req> Service<Req> for AdmissionService<S, C>
where
    S: Service<Req> + Clone,
    C: Fn(&Req) -> WorkInfo,
{
    type Response = S::Response;
    type Error = AdmissionError<S::Error>;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(AdmissionError::Inner)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let work = (self.classify)(&request);
        // Keep the instance that was polled ready for this request.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(self.queue.admit(work.clone()), ready, request, work)
    }
}

impl<S: fmt::Debug, C> fmt::Debug for AdmissionService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService")
            .field("inner", &self.inner)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}
