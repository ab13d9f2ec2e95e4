//! `PoolTask`: one closure's passage through admission onto a thread, and
//! the pool's error type.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::FusedFuture;
use tokio::sync::oneshot;

use super::handoff::Handoff;
use super::worker::{Closure, PoolShared};
use crate::error::AdmitError;
use crate::sync::StdArc;
use crate::work::WorkInfo;

/// Why a closure sent to a [`CpuPool`](super::CpuPool) did not return a value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// Admission refused the work before it started: its deadline passed
    /// (before or while it waited), early rejection judged it would miss
    /// its deadline, the queue was full, or it asked for more slots than
    /// the pool has threads. Never [`AdmitError::Closed`]: a closed pool is
    /// [`PoolError::Closed`]. The closure did not run.
    Admit(AdmitError),
    /// The pool was closed (or dropped) before the closure started: while
    /// the work waited in the queue, or after it was admitted but before a
    /// thread took it. The closure did not run.
    Closed,
    /// The closure panicked. The thread caught the panic and went on to the
    /// next job; the slot was returned.
    Panicked {
        /// The panic's message, cut to 512 bytes (or a placeholder for a
        /// panic without a string message).
        message: String,
    },
}

impl PoolError {
    /// A short, stable name for the outcome, for metric labels and logs:
    /// an [`AdmitError::reason`], `closed` or `panicked`.
    pub fn reason(&self) -> &'static str {
        match self {
            PoolError::Admit(error) => error.reason(),
            PoolError::Closed => "closed",
            PoolError::Panicked { .. } => "panicked",
        }
    }

    fn from_admit(error: AdmitError) -> Self {
        match error {
            AdmitError::Closed => PoolError::Closed,
            other => PoolError::Admit(other),
        }
    }
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Admit(error) => write!(f, "CPU pool: {error}"),
            PoolError::Closed => f.write_str("CPU pool is closed; the closure did not run"),
            PoolError::Panicked { message } => {
                write!(f, "CPU pool: the closure panicked: {message}")
            }
        }
    }
}

impl Error for PoolError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            PoolError::Admit(error) => Some(error),
            _ => None,
        }
    }
}

/// The future returned by [`CpuPool::spawn`](super::CpuPool::spawn):
/// resolves to the closure's value or a [`PoolError`].
///
/// A named type, so it can be stored without boxing. Lazy: the work asks for
/// admission on the first poll. Cancel-safe: dropped while it waits for
/// admission, it leaves the queue (a grant it had not yet seen goes to the
/// next waiter); dropped once admitted but before a thread took the
/// closure, the closure never runs and its slot is returned; dropped while
/// the closure runs, the closure finishes and its result is dropped.
///
/// Like any future it must not be polled again once it has completed (doing
/// so panics); it implements [`FusedFuture`] so that `select!` loops can tell.
#[must_use = "futures do nothing unless polled"]
pub struct PoolTask<T> {
    /// The admission and the closure until a thread has the job.
    handoff: StdArc<Handoff<PoolShared>>,
    /// Whether this task has seen the job handed over (a thread collecting
    /// grants may hand it over without telling the task).
    dispatched: bool,
    result: oneshot::Receiver<Result<T, PoolError>>,
    done: bool,
}

impl<T: Send + 'static> PoolTask<T> {
    pub(super) fn new<F>(shared: StdArc<PoolShared>, work: WorkInfo, f: F) -> Self
    where
        F: FnOnce() -> T + Send + 'static,
    {
        let (sender, result) = oneshot::channel();
        let bypass = work.is_bypass();
        let collect = shared.collects_grants();
        let admit = shared.queue().admit(work);
        PoolTask {
            handoff: Handoff::new(
                admit,
                Box::new(Closure { f, result: sender }),
                shared,
                bypass,
                collect,
            ),
            dispatched: false,
            result,
            done: false,
        }
    }
}

impl<T> Future for PoolTask<T> {
    type Output = Result<T, PoolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        assert!(!this.done, "`PoolTask` polled after it completed");
        if !this.dispatched {
            match this.handoff.poll_admission(cx) {
                Poll::Ready(Ok(())) => this.dispatched = true,
                Poll::Ready(Err(error)) => {
                    this.done = true;
                    return Poll::Ready(Err(PoolError::from_admit(error)));
                }
                // Waiting, or handed over since without a word: the result
                // channel wakes this task either way once a thread is done
                // (the `Handoff` wakes it for anything else).
                Poll::Pending => {}
            }
        }
        let result = ready!(Pin::new(&mut this.result).poll(cx));
        this.done = true;
        match result {
            Ok(result) => Poll::Ready(result),
            // The sender went away unsent: the pool dropped the job (closed
            // before a thread took it), or a wake-up found the admission
            // refused (and dropped the closure) since this task looked.
            Err(_) => Poll::Ready(Err(match this.handoff.poll_admission(cx) {
                Poll::Ready(Err(error)) if !this.dispatched => PoolError::from_admit(error),
                _ => PoolError::Closed,
            })),
        }
    }
}

impl<T> Drop for PoolTask<T> {
    fn drop(&mut self) {
        self.handoff.abandon();
    }
}

impl<T> FusedFuture for PoolTask<T> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<T> fmt::Debug for PoolTask<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = if self.done {
            "done"
        } else if self.dispatched {
            "dispatched"
        } else {
            "admitting"
        };
        f.debug_struct("PoolTask").field("phase", &phase).finish()
    }
}
