//! [`ControllerBuilder`]: a controller's settings, validated once, at
//! [`build`](ControllerBuilder::build).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use tokio_metrics::RuntimeMonitor;

use super::adjuster::SlotAdjuster;
use super::controller::{
    BusySpan, Controller, Core, RuntimeWatch, SignalChoice, Stats, Ticking, NO_UTILIZATION,
    POLL_ESTIMATE_RANGE, SAMPLER, SIGNAL_ON_FAILURE,
};
use super::idle::IdleDetector;
use super::inflation::HoldInflation;
use super::signal::{CpuSignal, RuntimeSignal, SignalSource};
use super::tuning::GlobalQueueWatch;
use crate::error::ConfigError;
use crate::grant::SlotGranter;
use crate::health::Boundary;
use crate::queue::{Usage, WorkQueueBuilder};
use crate::sync::{Arc, Mutex, StdAtomicU64};
use crate::ticker::Ticker;

/// Settings for a [`Controller`], validated by [`build`](Self::build).
#[must_use = "a builder does nothing until `build` is called"]
pub struct ControllerBuilder {
    signal: SignalChoice,
    threshold: u32,
    min_slots: Option<u64>,
    max_slots: u64,
    initial_slots: Option<u64>,
    period: Duration,
    idle_period: Duration,
    idle_below: f64,
    queue: WorkQueueBuilder,
    manual: bool,
    arrivals_first: bool,
}

impl ControllerBuilder {
    /// Default overload threshold, in runnable tasks per worker; see the
    /// [module documentation](super) for how it was chosen.
    pub(crate) const DEFAULT_THRESHOLD: u32 = 1;
    /// Default largest total.
    pub(crate) const DEFAULT_MAX_SLOTS: u64 = 10_000;
    /// Default sampling period while active.
    pub(crate) const DEFAULT_PERIOD: Duration = Duration::from_millis(1);
    /// Default sampling period while idle.
    pub(crate) const DEFAULT_IDLE_PERIOD: Duration = Duration::from_millis(250);
    /// Default idle line, in runnable tasks per worker.
    pub(crate) const DEFAULT_IDLE_BELOW: f64 = 0.1;

    pub(super) fn new(signal: SignalChoice) -> Self {
        ControllerBuilder {
            signal,
            threshold: Self::DEFAULT_THRESHOLD,
            min_slots: None,
            max_slots: Self::DEFAULT_MAX_SLOTS,
            initial_slots: None,
            period: Self::DEFAULT_PERIOD,
            idle_period: Self::DEFAULT_IDLE_PERIOD,
            idle_below: Self::DEFAULT_IDLE_BELOW,
            queue: Self::default_queue(),
            manual: false,
            arrivals_first: true,
        }
    }

    /// Runnable tasks per worker at or above which the total shrinks; it
    /// grows at or below half of it (1..=1024).
    pub fn threshold(mut self, threshold: u32) -> Self {
        self.threshold = threshold;
        self
    }

    /// The smallest total (at least 1). Default: one slot per worker
    /// (capped by `max_slots`): with fewer, a worker would sit idle while
    /// admitted work waits, and a run-queue signal full of requests that
    /// are only passing through to wait for admission would otherwise push
    /// the total there.
    pub fn min_slots(mut self, min: u64) -> Self {
        self.min_slots = Some(min);
        self
    }

    /// The largest total.
    pub fn max_slots(mut self, max: u64) -> Self {
        self.max_slots = max;
        self
    }

    /// The starting total (default: one per worker, within the bounds).
    pub fn initial_slots(mut self, initial: u64) -> Self {
        self.initial_slots = Some(initial);
        self
    }

    /// Sampling period while active (100 µs..=1 s, default 1 ms).
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Sampling period while idle (from `period` to 60 s, default 250 ms).
    /// Demand does not wait for it: the first admission past the total
    /// while idle wakes the sampler.
    pub fn idle_period(mut self, period: Duration) -> Self {
        self.idle_period = period;
        self
    }

    /// Runnable tasks per worker below which (over a second, and smoothed)
    /// the node counts as idle; must be above 0 and at most half the
    /// threshold (default 0.1).
    pub fn idle_below(mut self, per_worker: f64) -> Self {
        self.idle_below = per_worker;
        self
    }

    /// The queue settings a controller starts from: the
    /// [`WorkQueueBuilder`] defaults, with early rejection on (it acts only
    /// on requests that carry a deadline, and a controller's queue times
    /// every hold anyway), epoch-LIFO scaled to the requests' deadlines
    /// ([`WorkQueueBuilder::epoch_lifo_from_deadlines`]: it acts only once
    /// requests carry deadlines and queue past half of them), usage
    /// counted as [`Usage::Granted`] (with few slots, slots held cannot
    /// express tenant weights: two slots and weights 1:4 give 1:1 under
    /// [`Usage::Held`]), and elastic work (bulk and background priorities)
    /// capped at half the slots while regular work is about, unless it
    /// holds its slots about as long as regular work does
    /// ([`WorkQueueBuilder::elastic_share`]), and tenants seen for the
    /// first time starting behind the least-served waiting one
    /// ([`WorkQueueBuilder::newcomers_start_behind`]: tenant ids often come
    /// from requests, and a fresh id per request must not buy a place at
    /// the front); named `cpu` for metrics. Start from this when passing
    /// your own to [`queue`](Self::queue).
    ///
    /// Measured with the overload suite (`examples/overload`, 2 workers,
    /// stable tokio, `yield_now` handlers): in W2 (three priorities at 3x
    /// capacity, 5 ms deadlines) goodput was 84.6% of capacity without
    /// epoch-LIFO against 93.4% with it; in W5 (a foreground at half the
    /// capacity beside a bulk job in 5 ms chunks) the foreground's p99 was
    /// 2.9x its value alone without the elastic share against 1.17x with
    /// it (bulk work that gives way, [`SlotPermit::give_way`](crate::SlotPermit::give_way),
    /// is not held to the share).
    pub fn default_queue() -> WorkQueueBuilder {
        WorkQueueBuilder::default()
            .early_rejection(true)
            .epoch_lifo_from_deadlines()
            .usage(Usage::Granted)
            .elastic_share(0.5)
            .newcomers_start_behind(true)
            .name("cpu")
    }

    /// Queue settings (bound, reset period...), replacing
    /// [`default_queue`](Self::default_queue). Its slot total and grant
    /// pacing are set by the controller.
    pub fn queue(mut self, queue: WorkQueueBuilder) -> Self {
        self.queue = queue;
        self
    }

    /// For a controller built [`for_runtime`](Controller::for_runtime) on
    /// stable tokio: the expected length of one task poll, which converts
    /// the probe's scheduling delay into runnable tasks (1 µs..=1 s;
    /// default 50 µs): the probe's delay over it is roughly how many tasks
    /// were ahead of the probe on each worker (see [`RuntimeSignal`]).
    /// Checked for every runtime controller, used only on stable tokio;
    /// ignored with an injected signal.
    pub fn poll_estimate(mut self, poll: Duration) -> Self {
        if let SignalChoice::Runtime { poll_estimate, .. } = &mut self.signal {
            *poll_estimate = poll;
        }
        self
    }

    /// For a controller built [`for_runtime`](Controller::for_runtime): how
    /// its [`RuntimeSignal`] reads the runtime (default: the best this build
    /// has, queue depths with `tokio_unstable` and the probe without; the
    /// choice is in [`Snapshot::source`](super::Snapshot::source)). Choosing
    /// [`SignalSource::GlobalQueueAndProbe`] in a `tokio_unstable` build
    /// measures what a crate that depends on this one gets; queue depths on
    /// stable tokio fail the build with a [`ConfigError`] naming
    /// `signal_source`. Ignored with an injected signal.
    pub fn signal_source(mut self, chosen: SignalSource) -> Self {
        if let SignalChoice::Runtime { source, .. } = &mut self.signal {
            *source = chosen;
        }
        self
    }

    test_hook! {
        /// No sampler thread: the controller moves only when
        /// [`Controller::step`] is called. A test hook (feature
        /// `test-util`): a test drives the rule one sample at a time, with
        /// an injected signal.
        fn manual(mut self) -> Self {
            self.manual = true;
            self
        }
    }

    /// Whether a slot returned on a worker while a task a worker or more
    /// waits in the runtime's global queue is kept back for the next
    /// request to ask, so that the worker that returned it takes those
    /// arrivals in and the queue orders them before the slot is given out
    /// (default: on).
    ///
    /// Tasks spawned or woken from outside the runtime wait in tokio's
    /// global queue, which a worker with local work reads once every
    /// ~200 µs of polling; a grant puts the next waiter on the releasing
    /// worker's own queue, so with handlers that wake themselves between
    /// chunks no worker runs out of local work, and under overload
    /// arrivals wait there, unordered, past their deadlines. With this on,
    /// W2 at 3x with self-waking handlers on tokio's default runtime served
    /// the high class within its SLO 99.5–99.8% of the time against
    /// 96.1–98.9% without it (four runs of each, side by side), at a p99 of
    /// 3.5–4.2 ms against 4.5–5.4 ms, for goodput within the runs' spread
    /// (`docs/OVERLOAD.md`, "Arrivals first"). At most one slot is kept back at a
    /// time, and the next request to ask gives it out, whatever it is
    /// answered, or else the next grant loop: another release, or the
    /// controller's tick. Turn it off for a controller without a sampler
    /// thread (the `test-util` feature's `manual`) that is not stepped
    /// every period, whose step is what gives out a slot kept for arrivals
    /// that were not requests. A runtime built with
    /// [`configure_runtime`](super::configure_runtime) reads the global
    /// queue first and seldom leaves a backlog to keep a slot for.
    pub fn arrivals_first(mut self, on: bool) -> Self {
        self.arrivals_first = on;
        self
    }

    /// Validates the settings, starts the sampler thread (unless manual)
    /// and returns the controller.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first setting out of its range (`min_slots`,
    /// `max_slots`, `initial_slots`, `period`, `threshold`, `poll_estimate`,
    /// `idle_below`, `idle_period`, or the queue's), or `sampler` if the
    /// sampler's OS thread cannot be started.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::cpu::Controller;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let handle = tokio::runtime::Handle::current();
    /// let controller = Controller::for_runtime(&handle).max_slots(64).build()?;
    /// // One slot per worker to start with.
    /// assert_eq!(controller.queue().snapshot().granter.total, 1);
    ///
    /// let err = Controller::for_runtime(&handle)
    ///     .period(Duration::ZERO)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "period");
    /// # Ok(())
    /// # }
    /// ```
    pub fn build(self) -> Result<Controller, ConfigError> {
        self.validate()?;
        let (mut signal, runtime, source): (Box<dyn CpuSignal>, _, _) = match self.signal {
            SignalChoice::Runtime {
                handle,
                poll_estimate,
                source,
            } => (
                Box::new(
                    RuntimeSignal::with_source(&handle, source)?.with_poll_estimate(poll_estimate),
                ),
                Some(handle),
                Some(source),
            ),
            SignalChoice::Custom(signal) => (signal, None, None),
        };
        let signal_boundary = Boundary::new("cpu_signal", SIGNAL_ON_FAILURE);
        // A signal that panics here is counted, and the controller starts
        // with the smallest defaults (one worker), failing closed.
        let workers = signal_boundary
            .call(|| signal.sample())
            .map_or(1, |load| load.workers.max(1));
        let min_slots = self
            .min_slots
            .unwrap_or_else(|| u64::from(workers).min(self.max_slots));
        let initial = self
            .initial_slots
            .unwrap_or(u64::from(workers))
            .clamp(min_slots, self.max_slots);
        if let Some(asked) = self.initial_slots {
            if asked != initial {
                return Err(ConfigError::out_of_range(
                    "initial_slots",
                    asked,
                    min_slots,
                    self.max_slots,
                ));
            }
        }
        // Upstream's grant chain: a burst of workers x max(1, T/4).
        let burst = u64::from(workers) * u64::from((self.threshold / 4).max(1));
        let queue = self
            .queue
            .total_slots(initial)
            .grant_burst(usize::try_from(burst).unwrap_or(usize::MAX))
            .report_work()
            .arrivals_first(self.arrivals_first)
            .build()?;
        // A request for more slots than the total now, but no more than it
        // may grow to, waits; only a larger one can never fit.
        queue.granter().set_ceiling(self.max_slots)?;
        let now = Instant::now();
        let runtime = runtime.as_ref().map(|handle| RuntimeWatch {
            intervals: RuntimeMonitor::new(handle).intervals(),
            busy: BusySpan::default(),
            global_queue: GlobalQueueWatch::default(),
            metrics: handle.metrics(),
        });
        let core = Arc::new(Core {
            queue,
            adjuster: SlotAdjuster::new(self.threshold, min_slots, self.max_slots),
            period: self.period,
            idle_period: self.idle_period,
            started: now,
            source,
            signal_boundary,
            utilization: StdAtomicU64::new(NO_UTILIZATION),
            ticking: Mutex::new(Ticking {
                signal,
                idle: IdleDetector::new(self.idle_below, now),
                inflation: HoldInflation::default(),
                runtime,
                stats: Stats::default(),
            }),
        });
        let sampler = if self.manual {
            Ticker::manual(SAMPLER)
        } else {
            let core = core.clone();
            Ticker::spawn(
                "admission-cpu-sampler",
                SAMPLER,
                self.idle_period,
                move || core.sample(),
            )
            .map_err(|error| {
                ConfigError::new(
                    "sampler",
                    format!("cannot start the sampler thread: {error}"),
                )
            })?
        };
        if let Some(thread) = sampler.thread() {
            core.queue
                .granter()
                .set_overrun_alarm(move || thread.unpark());
        }
        Ok(Controller { core, sampler })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let SignalChoice::Runtime { poll_estimate, .. } = &self.signal {
            if !POLL_ESTIMATE_RANGE.contains(poll_estimate) {
                return Err(ConfigError::new(
                    "poll_estimate",
                    format!(
                        "{poll_estimate:?} is outside the accepted range {POLL_ESTIMATE_RANGE:?}"
                    ),
                ));
            }
        }
        if !(1..=1024).contains(&self.threshold) {
            return Err(ConfigError::out_of_range(
                "threshold",
                self.threshold,
                1,
                1024,
            ));
        }
        if self.min_slots == Some(0) {
            return Err(ConfigError::new(
                "min_slots",
                "0 would let the controller shut the node off; use at least 1",
            ));
        }
        let min_slots = self.min_slots.unwrap_or(1);
        if self.max_slots < min_slots || self.max_slots > SlotGranter::MAX_TOTAL {
            return Err(ConfigError::out_of_range(
                "max_slots",
                self.max_slots,
                min_slots,
                SlotGranter::MAX_TOTAL,
            ));
        }
        let period_range = Duration::from_micros(100)..=Duration::from_secs(1);
        if !period_range.contains(&self.period) {
            return Err(ConfigError::new(
                "period",
                format!(
                    "{:?} is outside the accepted range {period_range:?}",
                    self.period
                ),
            ));
        }
        let idle_range = self.period..=Duration::from_secs(60);
        if !idle_range.contains(&self.idle_period) {
            return Err(ConfigError::new(
                "idle_period",
                format!(
                    "{:?} is outside the accepted range {idle_range:?}",
                    self.idle_period
                ),
            ));
        }
        let idle_max = f64::from(self.threshold) / 2.0;
        if !(self.idle_below > 0.0 && self.idle_below <= idle_max) {
            return Err(ConfigError::new(
                "idle_below",
                format!(
                    "{} is outside the accepted range (0, {idle_max}] (half the threshold)",
                    self.idle_below
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for ControllerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerBuilder")
            .field("threshold", &self.threshold)
            .field("min_slots", &self.min_slots)
            .field("max_slots", &self.max_slots)
            .field("initial_slots", &self.initial_slots)
            .field("period", &self.period)
            .field("idle_period", &self.idle_period)
            .field("idle_below", &self.idle_below)
            .field("queue", &self.queue)
            .field("manual", &self.manual)
            .field("arrivals_first", &self.arrivals_first)
            .finish_non_exhaustive()
    }
}
