//! The CPU overload signal: how many tasks are ready to run but not running.

use std::fmt;
use std::time::Duration;

use tokio::runtime::{Handle, RuntimeMetrics};

use super::probe::Probe;
use crate::error::ConfigError;

/// One sample of the CPU signal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuLoad {
    /// Tasks ready to run but not running, across the whole runtime.
    pub runnable: u64,
    /// Worker threads that run them (at least 1).
    pub workers: u32,
    /// The scheduling delay the probe measured, for signals that use one.
    pub probe_delay: Option<Duration>,
}

impl CpuLoad {
    /// A sample with no probe.
    pub fn new(runnable: u64, workers: u32) -> Self {
        CpuLoad {
            runnable,
            workers: workers.max(1),
            probe_delay: None,
        }
    }

    /// Runnable tasks per worker.
    pub fn per_worker(&self) -> f64 {
        self.runnable as f64 / f64::from(self.workers.max(1))
    }
}

/// A source of CPU load samples.
///
/// [`RuntimeSignal`] reads a tokio runtime; tests inject their own (a
/// closure `FnMut() -> CpuLoad` is a signal), and so can a service that runs
/// on another executor. `sample` is called from the controller's sampler
/// thread, every period (1 ms by default), so it should cost microseconds.
///
/// A tick holds the controller's own lock while it samples, so `sample`
/// must not call [`snapshot`](super::Controller::snapshot) (nor, in a
/// test, `step`) on the controller it feeds:
/// that would wait on itself. [`close`](super::Controller::close) is
/// fine (the sampler ends after the tick), as is anything on the
/// controller's queue.
pub trait CpuSignal: Send + 'static {
    /// Takes one sample.
    fn sample(&mut self) -> CpuLoad;
}

impl<F: FnMut() -> CpuLoad + Send + 'static> CpuSignal for F {
    fn sample(&mut self) -> CpuLoad {
        self()
    }
}

/// Which measurement a [`RuntimeSignal`] was compiled with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalSource {
    /// `--cfg tokio_unstable`: the global queue plus every worker's local
    /// run queue, read live. Exact, and cheap (a few nanoseconds a worker).
    QueueDepths,
    /// Stable tokio: the global queue plus a scheduling-delay probe whose
    /// delay is converted to an equivalent number of runnable tasks.
    GlobalQueueAndProbe,
}

impl fmt::Display for SignalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            SignalSource::QueueDepths => "queue depths",
            SignalSource::GlobalQueueAndProbe => "global queue + probe",
        })
    }
}

/// Reads a tokio runtime's run-queue depth.
///
/// * With `--cfg tokio_unstable` (this repository's `.cargo/config.toml`
///   turns it on for its own builds), `runnable` is the global (inject)
///   queue plus the sum of every worker's local queue, read live from
///   [`RuntimeMetrics`]. This is the direct analogue of upstream's runnable
///   goroutines. It does not see a task in a worker's LIFO slot (one per
///   worker at most) nor the task a worker is polling right now.
/// * On stable tokio, local queue depths are not exposed. `runnable` is then
///   the global queue depth plus an estimate from a **scheduling-delay
///   probe**: every sample, unless one is still in flight, the sampler
///   spawns a tiny task and records how long it waited to be polled. That
///   delay, divided by the expected length of one task poll
///   ([`ControllerBuilder::poll_estimate`](super::ControllerBuilder::poll_estimate),
///   50 µs by default),
///   is roughly how many tasks were ahead of it on each worker. A probe
///   still unpolled counts with its age so far, so a runtime too saturated
///   to poll it still reads as overloaded.
///
///   What it misses: the probe enters through the global queue, which a
///   busy tokio worker checks every few dozen polls (tuned to about every
///   200 µs), so under heavy load its delay saturates near that interval
///   instead of growing with the local queues; it detects overload well
///   and measures its depth poorly. The global queue alone fills only with
///   tasks spawned or woken from outside the runtime, or when a local queue
///   (256 tasks) overflows.
///
/// The runtime's metrics object is fetched once and cached.
#[derive(Debug)]
pub struct RuntimeSignal {
    metrics: RuntimeMetrics,
    reading: Reading,
}

/// How a [`RuntimeSignal`] reads its runtime.
#[derive(Debug)]
enum Reading {
    #[cfg(tokio_unstable)]
    QueueDepths,
    Probe(Probe),
}

impl RuntimeSignal {
    /// The default expected length of one task poll, for the stable probe.
    pub(crate) const DEFAULT_POLL_ESTIMATE: Duration = Duration::from_micros(50);

    /// A signal reading the runtime behind `handle` with the best source
    /// this build has: queue depths with `tokio_unstable`, the probe
    /// without (a controller's builder chooses otherwise with
    /// [`signal_source`](super::ControllerBuilder::signal_source) and
    /// [`poll_estimate`](super::ControllerBuilder::poll_estimate)). For a
    /// signal of one's own that wraps the runtime's.
    pub fn new(handle: &Handle) -> Self {
        match Self::with_source(handle, Self::best_source()) {
            Ok(signal) => signal,
            // The best source is always available.
            Err(_) => Self::probing(handle),
        }
    }

    /// A signal reading the runtime behind `handle` with `source`; a
    /// [`ConfigError`] naming `signal_source` for queue depths in a build
    /// without `tokio_unstable`. Crate-private: a controller's builder
    /// chooses the source
    /// ([`ControllerBuilder::signal_source`](super::ControllerBuilder::signal_source)).
    pub(crate) fn with_source(handle: &Handle, source: SignalSource) -> Result<Self, ConfigError> {
        match source {
            SignalSource::GlobalQueueAndProbe => Ok(Self::probing(handle)),
            #[cfg(tokio_unstable)]
            SignalSource::QueueDepths => Ok(RuntimeSignal {
                metrics: handle.metrics(),
                reading: Reading::QueueDepths,
            }),
            #[cfg(not(tokio_unstable))]
            SignalSource::QueueDepths => Err(ConfigError::new(
                "signal_source",
                "queue depths need a build with `--cfg tokio_unstable`",
            )),
        }
    }

    fn probing(handle: &Handle) -> Self {
        RuntimeSignal {
            metrics: handle.metrics(),
            reading: Reading::Probe(Probe::start(handle, Self::DEFAULT_POLL_ESTIMATE)),
        }
    }

    /// Sets the expected length of one task poll that converts the stable
    /// probe's delay into runnable tasks (no effect on queue depths).
    /// Kept within 1 µs..=1 s (the range
    /// [`ControllerBuilder::poll_estimate`](super::ControllerBuilder::poll_estimate)
    /// accepts): zero would divide by zero, and an estimate of hours would
    /// read every delay as no backlog at all. Crate-private: the builder's
    /// setting is the one way to choose it.
    // Without `tokio_unstable` the probe is the only reading.
    #[allow(irrefutable_let_patterns)]
    pub(crate) fn with_poll_estimate(mut self, poll: Duration) -> Self {
        if let Reading::Probe(probe) = &mut self.reading {
            probe.poll_estimate = poll.clamp(Duration::from_micros(1), Duration::from_secs(1));
        }
        self
    }

    /// The best measurement this build has: queue depths with
    /// `tokio_unstable`, the probe without.
    pub(crate) const fn best_source() -> SignalSource {
        if cfg!(tokio_unstable) {
            SignalSource::QueueDepths
        } else {
            SignalSource::GlobalQueueAndProbe
        }
    }

    /// Worker threads of the runtime.
    fn workers(&self) -> u32 {
        u32::try_from(self.metrics.num_workers()).unwrap_or(u32::MAX)
    }
}

impl CpuSignal for RuntimeSignal {
    // Without `tokio_unstable` the probe is the only reading, and the match
    // below has one arm.
    #[cfg_attr(not(tokio_unstable), allow(clippy::infallible_destructuring_match))]
    fn sample(&mut self) -> CpuLoad {
        let workers = self.workers();
        let probe = match &mut self.reading {
            #[cfg(tokio_unstable)]
            Reading::QueueDepths => {
                let local: usize = (0..self.metrics.num_workers())
                    .map(|worker| self.metrics.worker_local_queue_depth(worker))
                    .sum();
                let runnable = self.metrics.global_queue_depth().saturating_add(local);
                return CpuLoad::new(runnable as u64, workers);
            }
            Reading::Probe(probe) => probe,
        };
        // Read before the probe sends its next task into the global queue.
        let global = self.metrics.global_queue_depth() as u64;
        let delay = probe.sample(a_worker_is_parked(&self.metrics));
        let per_worker = delay.as_nanos() / probe.poll_estimate.as_nanos();
        let estimated = u64::try_from(per_worker)
            .unwrap_or(u64::MAX)
            .saturating_mul(u64::from(workers));
        CpuLoad {
            runnable: global.saturating_add(estimated),
            workers,
            probe_delay: Some(delay),
        }
    }
}

/// Whether any of the runtime's workers is parked at this moment.
///
/// A worker publishes its park/unpark count just before it parks and again
/// as it wakes (tokio's stable metrics), so an odd count means it is parked
/// now. A worker whose only work is a task in its defer list (`yield_now`,
/// an exhausted cooperative budget) does not park: it polls the driver and
/// goes on.
pub(super) fn a_worker_is_parked(metrics: &RuntimeMetrics) -> bool {
    (0..metrics.num_workers()).any(|worker| metrics.worker_park_unpark_count(worker) % 2 == 1)
}
