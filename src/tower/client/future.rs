//! The outbound call's future: a refusal made here, or the call (with the
//! caller's slot given back meanwhile), then what its response says.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, Response};
use pin_project::pin_project;
use tokio::time::Instant;

use super::answer::{answer, Answer};
use super::downstreams::{EndpointState, Inner};
use super::error::DownstreamError;
use crate::queue::ReleaseDuring;
use crate::sync::StdArc;
use crate::tower::release::put_held;
use crate::tower::report::{parse_level, LoadReport, LEVEL_HEADER, LOAD_HEADER};
use crate::work::Priority;

/// A refusal made here, before anything was sent.
#[derive(Clone, Copy, Debug)]
pub(super) enum Local {
    BelowLevel { priority: Priority, level: Priority },
    Throttled { probability: f64 },
}

impl Local {
    fn into_error<E>(self) -> DownstreamError<E> {
        match self {
            Local::BelowLevel { priority, level } => {
                DownstreamError::BelowLevel { priority, level }
            }
            Local::Throttled { probability } => DownstreamError::Throttled { probability },
        }
    }
}

/// Where a response's news goes: one configured endpoint's state.
pub(super) struct Learn {
    shared: StdArc<Inner>,
    endpoint: usize,
    /// The request's priority, whose throttle window the answer counts in.
    priority: Option<Priority>,
}

impl Learn {
    pub(super) fn new(shared: StdArc<Inner>, endpoint: usize, priority: Option<Priority>) -> Self {
        Learn {
            shared,
            endpoint,
            priority,
        }
    }

    /// What `response` says: whether the endpoint accepted the request,
    /// its level, its load report.
    ///
    /// For the throttle, a refusal of work the same response says is below
    /// the endpoint's level counts as accepted: the endpoint is shedding
    /// that priority by design, which the level refuses here from now on;
    /// the throttle is for an endpoint that refuses work it claims to
    /// admit. (Counted as refused instead, every priority near the level
    /// would be throttled as well as cut by it.)
    fn response<B>(&self, response: &Response<B>, now: Instant) {
        let mut state = self.shared.endpoints[self.endpoint].state.lock();
        let level = learn_reports(&mut state, response.headers(), now);
        let accepted = answer(response) == Answer::Accepted;
        let shed_by_design = !accepted
            && matches!((self.priority, level), (Some(priority), Some(level)) if priority < level);
        if accepted {
            state.counts.accepted = state.counts.accepted.saturating_add(1);
        }
        if accepted || shed_by_design {
            state.throttle.accepted(self.priority, now);
        }
    }
}

/// The level and the load report of a response from a configured
/// endpoint. Exactly one well-formed value of each is believed; several,
/// or one that does not parse, is no information (counted as garbled) and
/// leaves what was known before to expire on its own. Returns the level
/// the response carried.
fn learn_reports(state: &mut EndpointState, headers: &HeaderMap, now: Instant) -> Option<Priority> {
    let mut garbled = false;
    let mut believed = None;
    let mut levels = headers.get_all(LEVEL_HEADER).iter();
    if let Some(value) = levels.next() {
        match parse_level(value).filter(|_| levels.next().is_none()) {
            Some(level) => {
                state.level = Some((level, now));
                believed = Some(level);
            }
            None => garbled = true,
        }
    }
    let mut loads = headers.get_all(LOAD_HEADER).iter();
    if let Some(value) = loads.next() {
        match LoadReport::parse(value).filter(|_| loads.next().is_none()) {
            Some(load) => state.load = Some(load),
            None => garbled = true,
        }
    }
    if garbled {
        state.counts.garbled = state.counts.garbled.saturating_add(1);
    }
    believed
}

/// The future of [`DownstreamService`](super::DownstreamService).
///
/// Cancel-safe: dropping it drops the call; while the caller's slot is
/// given back, dropping it leaves the queue as dropping a
/// [`ReleaseDuring`] does.
#[pin_project]
pub struct DownstreamFuture<F: Future> {
    #[pin]
    state: State<F>,
    learn: Option<Learn>,
}

// The call is pinned in place in either of its variants; boxing the larger
// one would cost every call an allocation to save a refusal some bytes.
#[allow(clippy::large_enum_variant)]
#[pin_project(project = StateProj)]
enum State<F: Future> {
    Refused(Option<Local>),
    Direct(#[pin] F),
    Released(#[pin] ReleaseDuring<F>),
}

impl<F: Future> DownstreamFuture<F> {
    pub(super) fn refused(refusal: Local) -> Self {
        DownstreamFuture {
            state: State::Refused(Some(refusal)),
            learn: None,
        }
    }

    pub(super) fn direct(call: F, learn: Option<Learn>) -> Self {
        DownstreamFuture {
            state: State::Direct(call),
            learn,
        }
    }

    pub(super) fn released(call: ReleaseDuring<F>, learn: Option<Learn>) -> Self {
        DownstreamFuture {
            state: State::Released(call),
            learn,
        }
    }
}

impl<F, ResBody, E> Future for DownstreamFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<ResBody>, DownstreamError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (output, readmitted) = match this.state.project() {
            StateProj::Refused(refusal) => {
                let refusal = refusal
                    .take()
                    .expect("`DownstreamFuture` polled after it completed");
                return Poll::Ready(Err(refusal.into_error()));
            }
            StateProj::Direct(call) => (ready!(call.poll(cx)), Ok(())),
            StateProj::Released(call) => {
                let (output, again) = ready!(call.poll(cx));
                (output, again.map(put_held))
            }
        };
        if let (Some(learn), Ok(response)) = (this.learn.as_ref(), &output) {
            learn.response(response, Instant::now());
        }
        Poll::Ready(match (output, readmitted) {
            (Err(error), _) => Err(DownstreamError::Inner(error)),
            (Ok(_), Err(error)) => Err(DownstreamError::NotReadmitted(error)),
            (Ok(response), Ok(())) => Ok(response),
        })
    }
}

impl<F: Future> fmt::Debug for DownstreamFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Refused(_) => "refused",
            State::Direct(_) => "calling",
            State::Released(_) => "calling, slot given back",
        };
        f.debug_struct("DownstreamFuture")
            .field("state", &state)
            .finish()
    }
}
