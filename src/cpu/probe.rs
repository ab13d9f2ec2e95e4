//! The scheduling-delay probe: the signal of stable tokio, where local queue
//! depths are not exposed (and of any build that asks for it).
//!
//! The probe's atomics are shared with a task on a tokio runtime, which loom
//! cannot model; nothing here runs inside a loom model, so std types are
//! used directly rather than through the `sync` shim.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

/// The stable fallback's scheduling-delay probe.
///
/// A long-lived task on the runtime. When the sampler asks for a measurement
/// it wakes the task (through the global queue); the task notes the time,
/// wakes itself and yields. tokio puts a task that wakes itself while it is
/// being polled at the *back* of its worker's local run queue, so the time
/// until its next poll is the time that worker took to run everything ahead
/// of it: the local backlog, measured in time.
#[derive(Debug)]
pub(super) struct Probe {
    shared: Arc<ProbeShared>,
    pub(super) poll_estimate: Duration,
    asked: Option<Instant>,
    last_delay: Duration,
}

#[derive(Debug, Default)]
struct ProbeShared {
    /// Set by the sampler to ask for a measurement, cleared by the probe.
    asked: AtomicBool,
    /// The latest measured delay in nanoseconds, or `NOT_MEASURED`.
    delay: AtomicU64,
    stop: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// No measurement finished since the last one was read.
const NOT_MEASURED: u64 = u64::MAX;

impl Probe {
    pub(super) fn start(handle: &Handle, poll_estimate: Duration) -> Self {
        let shared = Arc::new(ProbeShared {
            delay: AtomicU64::new(NOT_MEASURED),
            ..ProbeShared::default()
        });
        let task = shared.clone();
        let mut measuring_since: Option<Instant> = None;
        // If the runtime shuts down the task is dropped; the sampler then
        // sees a measurement that never ends, never a panic.
        drop(handle.spawn(std::future::poll_fn(move |cx| {
            if task.stop.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            if let Some(since) = measuring_since.take() {
                let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(NOT_MEASURED - 1);
                task.delay.store(nanos, Ordering::Release);
            } else if task.asked.swap(false, Ordering::AcqRel) {
                measuring_since = Some(Instant::now());
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            *task.waker.lock().unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
            // A request that arrived while the waker was being replaced
            // would otherwise wait for the next one.
            if task.asked.load(Ordering::Acquire) {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        })));
        Probe {
            shared,
            poll_estimate,
            asked: None,
            last_delay: Duration::ZERO,
        }
    }

    /// The latest delay (or, while a measurement takes longer than the last
    /// one did and no worker is parked, its age so far), asking for a new
    /// measurement if none is in flight.
    ///
    /// `a_worker_is_parked`: an unfinished measurement's age is work ahead
    /// of the probe only while every worker is busy (a stalled runtime must
    /// not read as a quiet one). With a worker parked, tokio has already
    /// asked it to take the probe, and the age is the time the OS takes to
    /// wake that thread: on a VM, over a millisecond at times, which read
    /// as 20 runnable tasks a worker on an idle runtime and kept the
    /// controller from ever going idle.
    pub(super) fn sample(&mut self, a_worker_is_parked: bool) -> Duration {
        if let Some(asked) = self.asked {
            match self.shared.delay.swap(NOT_MEASURED, Ordering::AcqRel) {
                NOT_MEASURED if a_worker_is_parked => return self.last_delay,
                NOT_MEASURED => return asked.elapsed().max(self.last_delay),
                nanos => {
                    self.last_delay = Duration::from_nanos(nanos);
                    self.asked = None;
                }
            }
        }
        self.asked = Some(Instant::now());
        self.shared.asked.store(true, Ordering::Release);
        let waker = self
            .shared
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(waker) = waker {
            waker.wake();
        }
        self.last_delay
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let waker = self
            .shared
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}
