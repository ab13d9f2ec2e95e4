//! The CPU controller: one object that owns the slot queue, the signal, the
//! adjuster and the sampler thread.
//!
//! Its failure model is in the [module documentation](super#failure-model).

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use tokio::runtime::{Handle, RuntimeMetrics};
use tokio_metrics::{RuntimeIntervals, RuntimeMonitor};

use super::adjuster::{Adjustment, Hold, SlotAdjuster};
use super::idle::{IdleDetector, Mode};
use super::inflation::{self, HoldInflation, InflationReading, InflationVerdict};
use super::signal::{a_worker_is_parked, CpuLoad, CpuSignal, RuntimeSignal, SignalSource};
use super::tuning::{GlobalQueueBacklog, GlobalQueueWatch, WatchVerdict};
use crate::error::ConfigError;
use crate::grant::{SlotGranter, SlotSnapshot};
use crate::health::{Boundary, ComponentHealth};
use crate::observe::QueueSnapshot;
use crate::queue::{Admit, Usage, WorkQueue, WorkQueueBuilder};
use crate::sync::{Arc, Mutex, Ordering, StdAtomicU64};
use crate::ticker::Ticker;
use crate::work::{Priority, WorkInfo};

/// How many slot changes the snapshot remembers.
const RECENT_DECISIONS: usize = 32;
/// The span the runtime summary's busy ratio covers. The sampler reads
/// tokio-metrics every tick and slides this span along, so that a spike
/// shows as busy workers half a span after it starts, not up to a span and
/// a half (fixed intervals); much shorter spans read tokio's busy time in
/// the lumps in which workers publish it (every 61 polls, or at park).
const BUSY_SPAN: Duration = Duration::from_millis(10);
/// The most intervals the busy span keeps, whatever the tick period.
const BUSY_SPAN_INTERVALS: usize = 256;
/// The sampler thread's component name.
const SAMPLER: &str = "cpu_sampler";
/// The signal's fallback, for health records.
const SIGNAL_ON_FAILURE: &str =
    "fails closed: enforcing, the slot total held, retried every idle period";
/// The smallest and largest expected length of one task poll for the
/// stable probe: below a microsecond every delay reads as a huge backlog,
/// above a second none ever reads as one.
const POLL_ESTIMATE_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_micros(1)..=Duration::from_secs(1);

/// Admission control for CPU: a slot [`WorkQueue`] whose total follows the
/// runtime's run-queue depth.
///
/// Built once per runtime with [`Controller::for_runtime`]. A dedicated OS
/// thread (not a tokio task: a sampling task would itself wait in the queue
/// it measures) samples the [`CpuSignal`] every period and applies the
/// adjuster's rule (see the [module documentation](super)); when the node goes idle it samples slowly and
/// stops enforcing. Handlers call [`admit`](Self::admit). Dropping the
/// controller, or calling [`close`](Self::close), stops and joins the
/// sampler and fails every waiter with [`AdmitError::Closed`](crate::AdmitError::Closed).
///
/// ```
/// use admission::cpu::Controller;
/// use admission::{Priority, TenantId, WorkInfo};
///
/// // Requests that wait with a deadline need tokio's timer: a runtime
/// // without it refuses them (`AdmitError::TimerUnavailable`).
/// let runtime = tokio::runtime::Builder::new_multi_thread()
///     .worker_threads(2)
///     .enable_all()
///     .build()
///     .unwrap();
/// let controller = Controller::for_runtime(runtime.handle()).build().unwrap();
/// runtime.block_on(async {
///     let permit = controller
///         .admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL))
///         .await
///         .unwrap();
///     drop(permit);
/// });
/// controller.close();
/// ```
pub struct Controller {
    core: Arc<Core>,
    sampler: Ticker,
}

/// What the sampler thread and the controller's handle share.
struct Core {
    queue: WorkQueue<SlotGranter>,
    adjuster: SlotAdjuster,
    period: Duration,
    idle_period: Duration,
    started: Instant,
    source: Option<SignalSource>,
    /// The panic boundary around the signal, the only user code in a tick.
    signal_boundary: Boundary,
    ticking: Mutex<Ticking>,
    /// The workers' busy share over the trailing busy span, as `f64` bits
    /// (`NO_UTILIZATION` until the first runtime summary): read on every
    /// response that carries a load report, so without the tick's lock.
    /// A report, deciding nothing: `std`'s atomic, outside loom's models.
    utilization: StdAtomicU64,
}

/// [`Core::utilization`] before a runtime summary exists: a NaN's bits,
/// which no busy ratio has.
const NO_UTILIZATION: u64 = u64::MAX;

/// The sampler's own state; locked for one tick at a time.
struct Ticking {
    signal: Box<dyn CpuSignal>,
    idle: IdleDetector,
    inflation: HoldInflation,
    runtime: Option<RuntimeWatch>,
    stats: Stats,
}

struct RuntimeWatch {
    intervals: RuntimeIntervals,
    busy: BusySpan,
    global_queue: GlobalQueueWatch,
    /// Read every tick for a parked worker: with every slot in use, the
    /// evidence an increase needs (see [`Hold::WorkersBusy`]).
    metrics: RuntimeMetrics,
}

impl RuntimeWatch {
    /// Reads the runtime's metrics since the last tick; the summary over
    /// the trailing [`BUSY_SPAN`].
    fn refresh(&mut self) -> Option<RuntimeSummary> {
        let interval = self.intervals.next()?;
        let busy_ratio = self
            .busy
            .push(interval.total_busy_duration, interval.elapsed);
        Some(RuntimeSummary {
            workers: interval.workers_count,
            busy_ratio,
            global_queue_depth: interval.global_queue_depth,
            live_tasks: interval.live_tasks_count,
            elapsed: self.busy.elapsed,
        })
    }

    /// Tasks waiting in tokio's global queue have not asked for admission
    /// yet, so no decision of the controller orders them; a backlog there
    /// is the runtime's configuration to fix (see `tuning.rs`).
    fn observe_global_queue(&mut self, summary: &RuntimeSummary) {
        let verdict = self
            .global_queue
            .observe(summary.global_queue_depth, summary.workers);
        if verdict != WatchVerdict::Quiet {
            crate::export::cpu_global_queue_backlogged();
        }
        if verdict == WatchVerdict::Warn {
            let reading = self.global_queue.reading();
            tracing::warn!(
                target: "admission",
                share = reading.latest_share,
                max_depth = reading.latest_max_depth,
                backlogged_windows = reading.backlogged_windows,
                "tasks keep waiting in tokio's global queue, before admission can order \
                 them: unless the runtime was built with \
                 admission::cpu::configure_runtime (global_queue_interval = 1), \
                 arrivals reach admission late and priorities are lost there"
            );
        }
    }
}

/// The workers' busy time over the trailing [`BUSY_SPAN`], from intervals
/// of any length.
#[derive(Debug, Default)]
struct BusySpan {
    /// The latest intervals' busy time and length, oldest first, covering
    /// at least the span once that much time has been seen.
    recent: VecDeque<(Duration, Duration)>,
    /// The sums of `recent`.
    busy: Duration,
    elapsed: Duration,
}

impl BusySpan {
    /// Adds an interval; the busy ratio (summed over workers) over the span.
    fn push(&mut self, busy: Duration, elapsed: Duration) -> f64 {
        self.recent.push_back((busy, elapsed));
        self.busy = self.busy.saturating_add(busy);
        self.elapsed = self.elapsed.saturating_add(elapsed);
        // Drop the oldest interval while the rest still cover the span.
        while let Some(&(oldest_busy, oldest_elapsed)) = self.recent.front() {
            let rest = self.elapsed.saturating_sub(oldest_elapsed);
            if rest < BUSY_SPAN && self.recent.len() <= BUSY_SPAN_INTERVALS {
                break;
            }
            self.recent.pop_front();
            self.busy = self.busy.saturating_sub(oldest_busy);
            self.elapsed = rest;
        }
        if self.elapsed.is_zero() {
            0.0
        } else {
            self.busy.as_secs_f64() / self.elapsed.as_secs_f64()
        }
    }
}

/// Where a builder's signal will come from.
enum SignalChoice {
    Runtime {
        handle: Handle,
        poll_estimate: Duration,
        source: SignalSource,
    },
    Custom(Box<dyn CpuSignal>),
}

#[derive(Default)]
struct Stats {
    inflation: Option<InflationReading>,
    ticks: u64,
    last_tick: Option<Instant>,
    samples: u64,
    increases: u64,
    decreases: u64,
    idle_overruns: u64,
    last_load: Option<CpuLoad>,
    last_adjustment: Option<Adjustment>,
    recent: VecDeque<SlotChange>,
    runtime: Option<RuntimeSummary>,
    worker_idled: Option<bool>,
}

/// One tick's outcome.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tick {
    /// The sample the tick acted on; `None` when the signal panicked (the
    /// tick then held the total, [`Hold::SignalFailed`], and enforced).
    pub load: Option<CpuLoad>,
    /// The mode after the sample.
    pub mode: Mode,
    /// What the adjuster decided.
    pub adjustment: Adjustment,
    /// The slot levels before the decision.
    pub slots_before: SlotSnapshot,
}

/// A change of the slot total, as remembered by the snapshot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotChange {
    /// Time since the controller started.
    pub at: Duration,
    /// Runnable tasks per worker in the sample that caused it.
    pub runnable_per_worker: f64,
    /// The total before the change.
    pub total_before: u64,
    /// The change.
    pub adjustment: Adjustment,
}

/// Runtime-wide figures from `tokio-metrics`, read every tick: the busy
/// ratio over the trailing ~10 ms, the queue and task counts at the latest
/// tick. The busy ratio decides whether longer holds are CPU queueing, so it
/// slides with every tick: a spike shows as busy workers about 5 ms after
/// it starts, not after up to 15 ms as with fixed 10 ms intervals (the
/// overload suite's W4 asks for a spike to be absorbed within 20 ms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RuntimeSummary {
    /// Worker threads.
    pub workers: usize,
    /// Busy time over elapsed time, summed over workers (0..=workers).
    pub busy_ratio: f64,
    /// Tasks in the global (inject) queue at the end of the interval.
    pub global_queue_depth: usize,
    /// Tasks alive at the end of the interval.
    pub live_tasks: usize,
    /// The span the busy ratio covers: about 10 ms; longer after a long
    /// tick (one while idle), which stays in the span until shorter ones
    /// cover it.
    pub elapsed: Duration,
}

/// The controller's state at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Active (enforcing) or idle.
    pub mode: Mode,
    /// Which runtime measurement feeds the signal (`None` for an injected signal).
    pub source: Option<SignalSource>,
    /// The latest sample the signal returned.
    pub load: Option<CpuLoad>,
    /// The latest decision.
    pub last_adjustment: Option<Adjustment>,
    /// Ticks run, including those whose sample failed: while it grows, the
    /// sampler is alive.
    pub ticks: u64,
    /// When the latest tick ran, as time since the controller started.
    pub last_tick: Option<Duration>,
    /// Samples the signal returned (ticks whose sample panicked are not
    /// counted).
    pub samples: u64,
    /// Slot increases so far.
    pub increases: u64,
    /// Slot decreases so far.
    pub decreases: u64,
    /// Times an admission past the total while idle ended idleness (the
    /// slot granter's overrun alarm, which wakes the sampler at once).
    pub idle_overruns: u64,
    /// The most recent changes of the total, oldest first.
    pub recent: Vec<SlotChange>,
    /// Runtime-wide figures, when built for a runtime.
    pub runtime: Option<RuntimeSummary>,
    /// Whether a worker was parked (had run out of work) as the latest
    /// tick sampled: an increase needs one ([`Hold::WorkersBusy`]). `None`
    /// with an injected signal, which has no workers to ask.
    pub worker_idled: Option<bool>,
    /// The queue, including slots used and total.
    pub queue: QueueSnapshot<SlotSnapshot>,
    /// The latest window of the second signal: admitted work's hold
    /// inflation over its unloaded value, inversion, and the verdict (see
    /// the [module documentation](super)); `None` before the first window.
    pub inflation: Option<InflationReading>,
    /// Each priority's unloaded hold, the second signal's baseline: the
    /// mean hold of work admitted with no more slots in flight than the
    /// runtime has workers.
    pub hold_baselines: Vec<(Priority, Duration)>,
    /// The signal's health: panics caught, and whether it is failing now
    /// (the controller then enforces with the total held).
    pub signal: ComponentHealth,
    /// What the controller saw of tokio's global queue, where tasks wait
    /// before admission can order them (`None` with an injected signal).
    /// Backlogged windows mean the runtime, not admission, is the queue:
    /// see [`configure_runtime`](super::configure_runtime).
    pub global_queue: Option<GlobalQueueBacklog>,
    /// The sampler thread's health: ticks that panicked as a whole (none
    /// expected; always healthy for a manual controller).
    pub sampler: ComponentHealth,
}

impl Controller {
    /// A builder for a controller of the runtime behind `handle`, reading its
    /// run-queue depth through a [`RuntimeSignal`], with the runtime's
    /// `tokio-metrics` summary in its snapshots.
    pub fn for_runtime(handle: &Handle) -> ControllerBuilder {
        ControllerBuilder::new(SignalChoice::Runtime {
            handle: handle.clone(),
            poll_estimate: RuntimeSignal::DEFAULT_POLL_ESTIMATE,
            source: RuntimeSignal::best_source(),
        })
    }

    /// A builder for a controller fed by any [`CpuSignal`] (a test's, or
    /// another executor's).
    pub fn with_signal(signal: impl CpuSignal) -> ControllerBuilder {
        ControllerBuilder::new(SignalChoice::Custom(Box::new(signal)))
    }

    /// Asks for admission; see [`WorkQueue::admit`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses no capacity: a queued request
    /// leaves the queue, and a grant it had not yet seen goes to the next
    /// waiter.
    ///
    /// # Errors
    ///
    /// As [`WorkQueue::admit`]: an [`AdmitError`](crate::AdmitError) for a full
    /// or closed queue, the request's deadline, early rejection or a request
    /// larger than `max_slots`.
    pub fn admit(&self, work: WorkInfo) -> Admit<SlotGranter> {
        self.core.queue.admit(work)
    }

    /// The slot queue, for handlers that keep their own handle to it.
    pub fn queue(&self) -> &WorkQueue<SlotGranter> {
        &self.core.queue
    }

    /// The share of the runtime's workers' time spent busy over the last
    /// few milliseconds (the runtime summary's busy ratio per worker), as
    /// of the last tick; `None` for a controller without a runtime (an
    /// injected signal) or before its first summary. Lock-free: for the
    /// load report of every response.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn cpu_utilization(&self) -> Option<f64> {
        let bits = self.core.utilization.load(Ordering::Relaxed);
        (bits != NO_UTILIZATION).then(|| f64::from_bits(bits))
    }

    /// Takes one sample and applies the rule now. The sampler thread calls
    /// this every period; a controller built with
    /// [`manual`](ControllerBuilder::manual) has no thread and is driven by
    /// calling it (tests do, with an injected signal).
    pub fn step(&self) -> Tick {
        self.core.tick()
    }

    /// The controller's current state.
    pub fn snapshot(&self) -> Snapshot {
        let ticking = self.core.ticking.lock();
        let stats = &ticking.stats;
        Snapshot {
            mode: ticking.idle.mode(),
            source: self.core.source,
            load: stats.last_load,
            last_adjustment: stats.last_adjustment,
            ticks: stats.ticks,
            last_tick: stats
                .last_tick
                .map(|at| at.saturating_duration_since(self.core.started)),
            samples: stats.samples,
            increases: stats.increases,
            decreases: stats.decreases,
            idle_overruns: stats.idle_overruns,
            recent: stats.recent.iter().copied().collect(),
            runtime: stats.runtime,
            worker_idled: stats.worker_idled,
            queue: self.core.queue.snapshot(),
            inflation: stats.inflation,
            hold_baselines: ticking.inflation.baselines(),
            signal: self.core.signal_boundary.health(),
            global_queue: ticking.runtime.as_ref().map(|r| r.global_queue.reading()),
            sampler: self.sampler.health(),
        }
    }

    /// Stops and joins the sampler thread and closes the queue: waiters fail
    /// with [`AdmitError::Closed`](crate::AdmitError::Closed), permits already
    /// granted stay valid. Idempotent; also done on drop. Called from the
    /// sampler thread itself (by a signal), it stops the thread without
    /// joining it: the thread ends when its tick returns.
    pub fn close(&self) {
        self.sampler.stop();
        self.core.queue.close();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.close();
    }
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("queue", &self.core.queue)
            .field("adjuster", &self.core.adjuster)
            .field("period", &self.core.period)
            .finish_non_exhaustive()
    }
}

impl Core {
    fn tick(&self) -> Tick {
        let mut ticking = self.ticking.lock();
        let Ticking {
            signal,
            idle,
            inflation,
            runtime,
            stats,
        } = &mut *ticking;
        // Only the moment of the sample counts, the same moment as the slots
        // in use: a park earlier in the tick may well have come before a
        // burst filled them. And before the sample: the stable signal's probe
        // wakes a task, which unparks a parked worker.
        let worker_idled = runtime
            .as_ref()
            .map(|watch| a_worker_is_parked(&watch.metrics));
        let sampled = self.signal_boundary.call(|| signal.sample());
        let now = Instant::now();
        stats.ticks = stats.ticks.saturating_add(1);
        stats.last_tick = Some(now);
        let Some(load) = sampled else {
            return self.fail_closed(idle, stats, now);
        };
        let mode_before = idle.mode();
        // Work beyond the total while idle is demand the total was not
        // sized for: enforce and adjust now (see `SlotGranter`'s overrun
        // alarm, which woke this tick early).
        if mode_before == Mode::Idle && self.queue.granter().take_overrun() {
            idle.force_active(now);
            stats.idle_overruns = stats.idle_overruns.saturating_add(1);
        }
        let mode = idle.observe(load.per_worker(), now);
        if mode != mode_before {
            if mode == Mode::Idle {
                // Armed afresh for this idle spell.
                self.queue.granter().take_overrun();
            }
            self.queue.set_enforcing(mode == Mode::Active);
            tracing::debug!(target: "admission", ?mode, "CPU controller changed mode");
        }
        let mut adjustment = Adjustment::Hold(Hold::Idle);
        let adjuster = self.adjuster;
        // Held slots can only be CPU queueing while the workers are busy;
        // otherwise longer holds are waits on IO or locks (see
        // `inflation.rs`). Without a runtime to ask (an injected signal) the
        // holds are trusted.
        let cpu_busy = stats
            .runtime
            .is_none_or(|r| r.busy_ratio / (r.workers.max(1) as f64) >= inflation::CPU_BUSY);
        let reported = self.queue.take_work(u64::from(load.workers));
        let total_now = self.queue.granter().total();
        let reading = inflation.observe(reported, now, total_now, adjuster.min_slots(), cpu_busy);
        let verdict = reading.map(|r| r.verdict).filter(|_| cpu_busy);
        let holds_allow = !cpu_busy || inflation.allows_increase();
        stats.worker_idled = worker_idled;
        let increase = if !holds_allow {
            Err(Hold::Inflated)
        } else if worker_idled == Some(false) {
            Err(Hold::WorkersBusy)
        } else {
            Ok(())
        };
        // The adjuster keeps the total within bounds the builder checked
        // against the granter's, so moving it cannot fail.
        let slots_before = match self.queue.adjust_total(|slots, waiting| {
            if mode == Mode::Active {
                adjustment = combine(
                    adjuster.decide(&load, slots.used, slots.total, waiting),
                    verdict,
                    increase,
                    slots,
                    adjuster.min_slots(),
                );
            }
            adjuster.apply(adjustment, slots.total)
        }) {
            Ok(before) => before,
            Err(error) => {
                tracing::error!(target: "admission", %error, "CPU controller could not move the total");
                adjustment = Adjustment::Hold(Hold::AtMax);
                self.queue.granter_snapshot()
            }
        };
        self.queue.maintain();
        self.queue.record_metrics();
        crate::export::cpu(load.per_worker(), mode == Mode::Idle);

        stats.samples = stats.samples.saturating_add(1);
        stats.last_load = Some(load);
        stats.last_adjustment = Some(adjustment);
        match adjustment {
            Adjustment::Increase => {
                stats.increases = stats.increases.saturating_add(1);
                inflation.increased();
            }
            Adjustment::Decrease | Adjustment::Cut(_) => {
                stats.decreases = stats.decreases.saturating_add(1)
            }
            Adjustment::Hold(_) => {}
        }
        if reading.is_some() {
            stats.inflation = inflation.last();
        }
        if !matches!(adjustment, Adjustment::Hold(_)) {
            if stats.recent.len() == RECENT_DECISIONS {
                stats.recent.pop_front();
            }
            stats.recent.push_back(SlotChange {
                at: now.saturating_duration_since(self.started),
                runnable_per_worker: load.per_worker(),
                total_before: slots_before.total,
                adjustment,
            });
        }
        if let Some(watch) = runtime.as_mut() {
            if let Some(summary) = watch.refresh() {
                stats.runtime = Some(summary);
                let share = summary.busy_ratio / summary.workers.max(1) as f64;
                self.utilization.store(share.to_bits(), Ordering::Relaxed);
                if mode == Mode::Active {
                    watch.observe_global_queue(&summary);
                }
            }
        }
        Tick {
            load: Some(load),
            mode,
            adjustment,
            slots_before,
        }
    }

    /// The tick of a sample that panicked: enforce, hold the total; see the
    /// module's failure model.
    fn fail_closed(&self, idle: &mut IdleDetector, stats: &mut Stats, now: Instant) -> Tick {
        if idle.mode() == Mode::Idle {
            idle.force_active(now);
            self.queue.set_enforcing(true);
            tracing::warn!(
                target: "admission",
                "CPU signal failed while idle: enforcing the slot total again"
            );
        }
        let adjustment = Adjustment::Hold(Hold::SignalFailed);
        stats.last_adjustment = Some(adjustment);
        // Waiters' deadlines and the fairness reset do not depend on the
        // signal: they go on.
        self.queue.maintain();
        self.queue.record_metrics();
        Tick {
            load: None,
            mode: Mode::Active,
            adjustment,
            slots_before: self.queue.granter_snapshot(),
        }
    }

    /// One tick of the sampler thread; returns how long to sleep: the
    /// period while active, the idle period while idle or while the signal
    /// fails.
    fn sample(&self) -> Duration {
        let mode = self.tick().mode;
        if mode == Mode::Idle || self.signal_boundary.consecutive_panics() > 0 {
            self.idle_period
        } else {
            self.period
        }
    }
}

/// One tick's decision from the two signals: the runnable rule's, unless
/// admitted work's holds say otherwise. A cut (holds grew twofold) or a
/// decrease (grew by 40%, or priority was inverted) wins over a hold or an
/// increase, as long as a slot is in use (the load is admitted work) and
/// the total is above its minimum; an increase waits for good windows and
/// for a worker that ran out of work (`increase` says why not).
fn combine(
    runnable: Adjustment,
    verdict: Option<InflationVerdict>,
    increase: Result<(), Hold>,
    slots: SlotSnapshot,
    min_slots: u64,
) -> Adjustment {
    let may_lower = slots.used > 0 && slots.total > min_slots;
    match verdict {
        Some(InflationVerdict::Cut { to }) if may_lower && to < slots.total => {
            return Adjustment::Cut(to);
        }
        Some(InflationVerdict::Cut { .. } | InflationVerdict::Decrease) if may_lower => {
            return Adjustment::Decrease;
        }
        _ => {}
    }
    match runnable {
        Adjustment::Increase => match increase {
            Ok(()) => Adjustment::Increase,
            Err(why) => Adjustment::Hold(why),
        },
        other => other,
    }
}

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

    fn new(signal: SignalChoice) -> Self {
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
    /// capped at half the slots while regular work is about
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
    /// the probe's scheduling delay into runnable tasks (1 µs..=1 s); see
    /// [`RuntimeSignal::with_poll_estimate`]. Checked for every
    /// runtime controller, used only on stable tokio; ignored with an
    /// injected signal.
    pub fn poll_estimate(mut self, poll: Duration) -> Self {
        if let SignalChoice::Runtime { poll_estimate, .. } = &mut self.signal {
            *poll_estimate = poll;
        }
        self
    }

    /// For a controller built [`for_runtime`](Controller::for_runtime): how
    /// its [`RuntimeSignal`] reads the runtime (default: the best this build
    /// has, [`RuntimeSignal::best_source`]). Choosing
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

    /// No sampler thread: the controller moves only when
    /// [`Controller::step`] is called.
    pub fn manual(mut self) -> Self {
        self.manual = true;
        self
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
    /// controller's tick. Turn it off for a
    /// [`manual`](Self::manual) controller that is not stepped every
    /// period, whose step is what gives out a slot kept for arrivals that
    /// were not requests. A runtime built with
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn slots(used: u64, total: u64) -> SlotSnapshot {
        SlotSnapshot { used, total }
    }

    /// `combine` as a table: (runnable rule, holds' verdict, why an
    /// increase is not allowed, slots used/total) → decision, with a
    /// minimum of one slot.
    #[test]
    fn the_two_signals_and_the_idle_worker_gate_combine_as_a_table() {
        use Adjustment::{Cut, Decrease, Hold as H, Increase};
        use InflationVerdict as V;
        /// (runnable rule, verdict, increase gate, slots) → decision.
        type Row = (
            Adjustment,
            Option<V>,
            Result<(), Hold>,
            SlotSnapshot,
            Adjustment,
        );
        let cut = Some(V::Cut { to: 2 });
        let rows: [Row; 12] = [
            // The runnable rule alone.
            (Increase, None, Ok(()), slots(4, 4), Increase),
            (Decrease, None, Ok(()), slots(4, 4), Decrease),
            (
                H(Hold::DeadBand),
                None,
                Ok(()),
                slots(4, 4),
                H(Hold::DeadBand),
            ),
            // An increase waits for good windows, then for an idle worker.
            (
                Increase,
                None,
                Err(Hold::Inflated),
                slots(4, 4),
                H(Hold::Inflated),
            ),
            (
                Increase,
                Some(V::Good),
                Err(Hold::WorkersBusy),
                slots(4, 4),
                H(Hold::WorkersBusy),
            ),
            // A hold from the rule is not turned into anything by the gate.
            (
                H(Hold::SlotsFree),
                None,
                Err(Hold::WorkersBusy),
                slots(3, 4),
                H(Hold::SlotsFree),
            ),
            // Inflated holds lower the total whatever the rule says...
            (Increase, cut, Err(Hold::WorkersBusy), slots(4, 4), Cut(2)),
            (
                H(Hold::DeadBand),
                Some(V::Decrease),
                Ok(()),
                slots(4, 4),
                Decrease,
            ),
            // ...a cut to no less than the total is one slot...
            (
                Increase,
                Some(V::Cut { to: 4 }),
                Ok(()),
                slots(4, 4),
                Decrease,
            ),
            // ...but only with a slot in use and the total above its minimum.
            (Increase, cut, Ok(()), slots(0, 4), Increase),
            (
                H(Hold::DeadBand),
                Some(V::Decrease),
                Ok(()),
                slots(1, 1),
                H(Hold::DeadBand),
            ),
            // A good verdict changes nothing by itself.
            (Decrease, Some(V::Good), Ok(()), slots(4, 4), Decrease),
        ];
        for (rule, verdict, increase, slots, expected) in rows {
            assert_eq!(
                combine(rule, verdict, increase, slots, 1),
                expected,
                "{rule:?} {verdict:?} {increase:?} {slots:?}"
            );
        }
    }

    /// Waits until `condition` holds, a millisecond at a time, for at most
    /// a minute (a liveness guard, not a timing assertion).
    fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !condition() {
            assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
            std::thread::sleep(MS);
        }
    }

    #[test]
    fn workers_kept_busy_by_yielding_tasks_read_as_never_parked() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let metrics = runtime.handle().metrics();
        eventually("an idle runtime's workers park", || {
            a_worker_is_parked(&metrics)
        });
        // Two tasks that only yield keep both workers polling: a yielded
        // task waits in its worker's defer list, and a worker with deferred
        // tasks does not park. No run queue shows them.
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        for _ in 0..2 {
            let stop = stop.clone();
            runtime.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    tokio::task::yield_now().await;
                }
            });
        }
        eventually("both workers stay busy", || {
            // Read many times in a row, so that no single lucky moment
            // passes.
            (0..100).all(|_| !a_worker_is_parked(&metrics))
        });
        stop.store(true, Ordering::Relaxed);
        eventually("the workers park again", || a_worker_is_parked(&metrics));
        runtime.shutdown_timeout(Duration::from_secs(5));
    }

    #[test]
    fn the_busy_span_slides_with_every_interval() {
        let mut span = BusySpan::default();
        // Two workers half busy, a tick at a time.
        let mut ratio = 0.0;
        for _ in 0..20 {
            ratio = span.push(MS, MS);
        }
        assert_eq!(ratio, 1.0);
        assert_eq!(span.elapsed, 10 * MS, "the span, no more");
        // Both busy from now on: the ratio reaches 1.6 (80%) on the sixth
        // tick, when 6 of the 10 ms in the span are busy ones (fixed 10 ms
        // intervals would wait for the end of the interval, up to 10 more).
        let ticks = (1..=10)
            .find(|_| span.push(2 * MS, MS) >= 1.6)
            .expect("busy within a span");
        assert_eq!(ticks, 6);
    }

    #[test]
    fn a_long_interval_leaves_the_span_once_short_ones_cover_it() {
        let mut span = BusySpan::default();
        // An idle period's tick: 250 ms, barely busy.
        assert_eq!(span.push(25 * MS, 250 * MS), 0.1);
        // Short busy ticks: the long interval counts until the short ones
        // alone cover the span.
        for _ in 0..9 {
            assert!(span.push(2 * MS, MS) < 0.2);
        }
        assert_eq!(span.push(2 * MS, MS), 2.0);
        assert_eq!(span.elapsed, 10 * MS);
    }

    #[test]
    fn the_busy_span_is_bounded_and_starts_at_zero() {
        let mut span = BusySpan::default();
        assert_eq!(span.push(Duration::ZERO, Duration::ZERO), 0.0);
        for _ in 0..10_000 {
            span.push(Duration::from_nanos(1), Duration::from_nanos(1));
        }
        assert!(span.recent.len() <= BUSY_SPAN_INTERVALS + 1);
        assert_eq!(span.push(Duration::MAX, Duration::MAX), 1.0);
    }
}
