//! The response future: admission first, then the inner call, holding the
//! slot until the inner future completes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project::pin_project;
use tower_service::Service;

use super::error::AdmissionError;
use super::propagate::with_work;
use super::release::holding;
use crate::queue::{Admit, Hold, Run, SlotPermit};
use crate::quota::QuotaAdmit;
use crate::sync::StdArc;
use crate::work::WorkInfo;
use crate::AdmitError;
use tokio::task::futures::TaskLocalFuture;

/// The future returned by [`AdmissionService`](super::AdmissionService).
///
/// Dropping it at any point loses nothing: while it waits, the admission
/// request leaves the queue; while the inner call runs, the slot is returned.
#[pin_project]
pub struct ResponseFuture<S: Service<Req>, Req> {
    #[pin]
    state: State<S, Req>,
}

/// How a request is admitted: through the queue, or its tenant's quota
/// and then the queue.
#[pin_project(project = AdmissionProj)]
pub(super) enum Admission {
    Queue(#[pin] Admit),
    Quota(#[pin] QuotaAdmit),
}

impl Future for Admission {
    type Output = Result<SlotPermit, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AdmissionProj::Queue(admit) => admit.poll(cx),
            AdmissionProj::Quota(admit) => admit.poll(cx),
        }
    }
}

#[pin_project(project = StateProj)]
enum State<S: Service<Req>, Req> {
    Admitting {
        #[pin]
        admit: Admission,
        call: Option<(S, Req, WorkInfo)>,
    },
    Running {
        /// The inner call, run holding the permit (given back while the
        /// handler waits, see `SlotPermit::run`), its hold reachable from
        /// the handler through a task-local (see `release.rs`).
        #[pin]
        response: TaskLocalFuture<StdArc<Hold>, Run<TaskLocalFuture<WorkInfo, S::Future>>>,
    },
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(super) fn new(admit: Admission, inner: S, request: Req, work: WorkInfo) -> Self {
        ResponseFuture {
            state: State::Admitting {
                admit,
                call: Some((inner, request, work)),
            },
        }
    }
}

impl<S: Service<Req>, Req> Future for ResponseFuture<S, Req> {
    type Output = Result<S::Response, AdmissionError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Admitting { admit, call } => {
                    let permit = match ready!(admit.poll(cx)) {
                        Ok(permit) => permit,
                        Err(error) => return Poll::Ready(Err(AdmissionError::Rejected(error))),
                    };
                    let Some((mut inner, request, work)) = call.take() else {
                        unreachable!("the call is taken once, when admission completes");
                    };
                    // The handler sees its own class as the current work, so
                    // calls it makes can carry it on (see `propagate`).
                    let response = holding(permit, with_work(work, || inner.call(request)));
                    this.state.set(State::Running { response });
                }
                StateProj::Running { response } => {
                    // The hold returns the slot as the call completes, not
                    // when the caller gets around to dropping us.
                    return Poll::Ready(match ready!(response.poll(cx)) {
                        Ok(output) => output.map_err(AdmissionError::Inner),
                        // Asked for again after a wait, the slot was refused
                        // (the deadline passed meanwhile): the call was
                        // dropped where it waited.
                        Err(error) => Err(AdmissionError::Rejected(error)),
                    });
                }
            }
        }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitting { .. } => "admitting",
            State::Running { .. } => "running",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
