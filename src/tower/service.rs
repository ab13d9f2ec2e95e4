//! The service that makes every request wait for admission.

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use super::classify::Classify;
use super::error::AdmissionError;
use super::future::{Admission, ResponseFuture};
use crate::cpu::Controller;
use crate::grant::SlotGranter;
use crate::health::Boundary;
use crate::queue::WorkQueue;
use crate::quota::Quota;
use crate::sync::StdArc;
use crate::work::{Priority, TenantId, WorkInfo};

/// The priority a request is admitted at when its classifier panics: the
/// lowest rung for requests from users. The rungs below it ([`Priority::BULK_LOW`],
/// [`Priority::LOW`]) are for background work that may wait indefinitely,
/// which a request someone is waiting on is not; every rung above it is one
/// the broken classifier did not vouch for. A rule of the failure model,
/// stated in the module docs: crate-private.
pub(crate) const CLASSIFIER_FALLBACK_PRIORITY: Priority = Priority::USER_LOW;

/// What `CLASSIFIER_FALLBACK_PRIORITY` is called in health records.
const CLASSIFIER_ON_FAILURE: &str =
    "the request is admitted as the anonymous tenant at user-low priority, no deadline";

pub(super) fn classifier_boundary() -> StdArc<Boundary> {
    StdArc::new(Boundary::new("classifier", CLASSIFIER_ON_FAILURE))
}

/// The class of a request whose classifier panicked: the least trust a
/// request can be given without being refused. Never a bypass, never a
/// tenant the request did not name (the anonymous one, not the node's own
/// [`TenantId::SYSTEM`]), never above user-low priority.
fn lowest_trust() -> WorkInfo {
    WorkInfo::new(TenantId::ANONYMOUS, CLASSIFIER_FALLBACK_PRIORITY)
}

/// Admits each request through a [`WorkQueue`] before calling the inner
/// service; built by [`AdmissionLayer`](super::AdmissionLayer), which is
/// the one way to make it (as for the HTTP mode's service) and where its
/// queue and classifier health are read.
///
/// # Readiness
///
/// `poll_ready` is the inner service's readiness, nothing more: admission
/// happens in the response future, because what a request is admitted as
/// depends on the request, which `poll_ready` does not see. So the service
/// is ready whenever the inner one is, however long the queue, and tower's
/// `load_shed()` or `buffer()` placed outside this layer never see
/// back-pressure from admission. Overload is answered per request instead:
/// refused at once when the queue is full
/// ([`max_waiters`](crate::WorkQueueBuilder::max_waiters)) or, with early
/// rejection, when the request would not make its deadline.
///
/// The inner service must be `Clone` (as with most tower middleware that
/// calls it later than `call`): the ready instance is kept for this request
/// and a clone takes its place. That clone is made for every request, the
/// refused ones included (for axum's boxed route service it is one
/// allocation), and cannot be skipped for refusals: `Admit` decides on its
/// first poll, which needs the task's waker (a request that has to wait
/// registers it) and so happens in the response future, after `call` has
/// returned; by then the future must already own the instance it will
/// call. Deciding inside `call` would mean either polling admission there
/// with a stand-in waker (the wait's span and deadline timer then made
/// outside the task that waits, and `call` needing a runtime) or
/// splitting the queue's decision from its enqueueing (the request's
/// bookkeeping then done twice when it has to wait). One clone per request
/// is the cheaper price; the refusal's own cost is in
/// `tests/tower_refusal_cost.rs`.
#[derive(Clone)]
pub struct AdmissionService<S, C> {
    inner: S,
    queue: WorkQueue<SlotGranter>,
    classify: C,
    boundary: StdArc<Boundary>,
    /// Keeps the controller (and so the queue) open; see
    /// [`AdmissionLayer::for_controller`](super::AdmissionLayer::for_controller).
    _owner: Option<StdArc<Controller>>,
    quota: Option<Quota>,
}

impl<S, C> AdmissionService<S, C> {
    pub(super) fn with_parts(
        inner: S,
        queue: WorkQueue<SlotGranter>,
        classify: C,
        boundary: StdArc<Boundary>,
        owner: Option<StdArc<Controller>>,
        quota: Option<Quota>,
    ) -> Self {
        AdmissionService {
            inner,
            queue,
            classify,
            boundary,
            _owner: owner,
            quota,
        }
    }

    /// The inner service's readiness, which is all of this service's.
    pub(super) fn poll_inner_ready<Req>(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), S::Error>>
    where
        S: Service<Req>,
    {
        self.inner.poll_ready(cx)
    }
}

impl<S, C, Req> Service<Req> for AdmissionService<S, C>
where
    S: Service<Req> + Clone,
    C: Classify<Req>,
{
    type Response = S::Response;
    type Error = AdmissionError<S::Error>;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_inner_ready(cx).map_err(AdmissionError::Inner)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let work = self
            .boundary
            .call(|| self.classify.classify(&request))
            .unwrap_or_else(lowest_trust);
        // Keep the instance that was polled ready for this request.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let admission = match &self.quota {
            Some(quota) => Admission::Quota(quota.admit(&self.queue, work.clone())),
            None => Admission::Queue(self.queue.admit(work.clone())),
        };
        ResponseFuture::new(admission, ready, request, work)
    }
}

impl<S: fmt::Debug, C> fmt::Debug for AdmissionService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService")
            .field("inner", &self.inner)
            .field("queue", &self.queue)
            .field("classifier", &self.boundary)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_is_the_lowest_rung_for_user_requests() {
        assert_eq!(CLASSIFIER_FALLBACK_PRIORITY, Priority::USER_LOW);
        assert!(CLASSIFIER_FALLBACK_PRIORITY < Priority::NORMAL);
    }
}
