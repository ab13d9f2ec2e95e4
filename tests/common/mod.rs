//! Helpers shared by the integration tests: manual polling of admission
//! futures so that tests decide exactly when each one runs.

#![allow(dead_code)]

use std::time::Duration;

use admission::{Admit, AdmitError, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};
use tokio::time::Instant;
use tokio_test::task::{self, Spawn};

/// An admission request that has been polled by hand.
pub type Pending = Spawn<Admit>;

/// A current-thread runtime with timers, its clock paused: the tests
/// advance time themselves.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Work for `tenant` at `priority` created at `t0 + created_ms`.
pub fn work(tenant: u64, priority: i8, t0: Instant, created_ms: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .priority(Priority::new(priority))
        .create_time(t0 + Duration::from_millis(created_ms))
        .build()
}

/// Requests the queue has counted, of every priority.
pub fn requested(queue: &WorkQueue) -> u64 {
    queue
        .snapshot()
        .priorities
        .iter()
        .map(|p| p.requested)
        .sum()
}

/// Polls an admission once and expects it to have to wait.
pub fn enqueue(queue: &WorkQueue, work: WorkInfo) -> Pending {
    let mut admit = task::spawn(queue.admit(work));
    assert!(admit.poll().is_pending(), "expected the request to wait");
    admit
}

/// Polls an admission once and expects a permit at once.
pub fn admit_now(queue: &WorkQueue, work: WorkInfo) -> SlotPermit {
    let mut admit = task::spawn(queue.admit(work));
    match admit.poll() {
        std::task::Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected immediate admission, got {other:?}"),
    }
}

/// Polls a waiting request; `Some` once it has settled.
pub fn try_settle(admit: &mut Pending) -> Option<Result<SlotPermit, AdmitError>> {
    match admit.poll() {
        std::task::Poll::Ready(result) => Some(result),
        std::task::Poll::Pending => None,
    }
}

/// Polls every named waiter once; removes and returns those that settled.
pub fn settle_ready(
    waiters: &mut Vec<(&'static str, Pending)>,
) -> Vec<(&'static str, Result<SlotPermit, AdmitError>)> {
    let mut settled = Vec::new();
    waiters.retain_mut(|(name, admit)| match try_settle(admit) {
        Some(result) => {
            settled.push((*name, result));
            false
        }
        None => true,
    });
    settled
}

/// Like [`settle_ready`], expecting every settled request to hold a permit.
pub fn granted(waiters: &mut Vec<(&'static str, Pending)>) -> Vec<(&'static str, SlotPermit)> {
    settle_ready(waiters)
        .into_iter()
        .map(|(name, result)| match result {
            Ok(permit) => (name, permit),
            Err(error) => panic!("{name} failed: {error}"),
        })
        .collect()
}

/// The names in a list of grants.
pub fn names<T>(grants: &[(&'static str, T)]) -> Vec<&'static str> {
    grants.iter().map(|(name, _)| *name).collect()
}

/// Polls an admission once and expects it to be refused at once.
pub fn refused_at_once(queue: &WorkQueue, work: WorkInfo) -> AdmitError {
    let mut admit = task::spawn(queue.admit(work));
    match admit.poll() {
        std::task::Poll::Ready(Err(error)) => error,
        other => panic!("expected an immediate refusal, got {other:?}"),
    }
}

/// A one-worker runtime whose worker is held by a task, with `waiting`
/// tasks spawned from outside it: they wait in tokio's global queue until
/// [`HeldRuntime::release`], since nothing else can run them.
pub struct HeldRuntime {
    pub runtime: tokio::runtime::Runtime,
    release: std::sync::mpsc::Sender<()>,
    finished: std::sync::mpsc::Receiver<()>,
    pub waiting: usize,
}

impl HeldRuntime {
    pub fn new(waiting: usize) -> Self {
        use std::sync::mpsc;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (holding, held) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        runtime.spawn(async move {
            holding.send(()).unwrap();
            // Blocks the only worker on purpose: nothing else can run.
            released.recv().unwrap();
        });
        held.recv_timeout(Duration::from_secs(60)).unwrap();
        let (done, finished) = mpsc::channel();
        for _ in 0..waiting {
            let done = done.clone();
            runtime.spawn(async move { done.send(()).unwrap() });
        }
        HeldRuntime {
            runtime,
            release,
            finished,
            waiting,
        }
    }

    /// Lets the worker go, and returns once every waiting task has run.
    pub fn release(&self) {
        self.release.send(()).unwrap();
        for _ in 0..self.waiting {
            self.finished.recv_timeout(Duration::from_secs(60)).unwrap();
        }
    }
}

impl Drop for HeldRuntime {
    /// Lets the worker go if the test did not (an assertion failed first):
    /// the runtime's drop waits for its worker, which would otherwise wait
    /// for this sender forever, and the test would hang instead of failing.
    fn drop(&mut self) {
        let _ = self.release.send(());
    }
}

/// Keeps panics whose message is `expected` (a test's injected failures,
/// by the hundred) off the output; every other panic is reported as usual.
/// The hook is the process's: set once per test binary.
pub fn quiet_panics_saying(expected: &'static str) {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&expected) {
                report(info);
            }
        }));
    });
}
