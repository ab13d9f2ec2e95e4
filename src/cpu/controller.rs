//! The CPU controller: one object that owns the slot queue, the signal, the
//! adjuster and the sampler thread.
//!
//! Its failure model is in the [module documentation](super#failure-model).

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use tokio::runtime::{Handle, RuntimeMetrics};
use tokio_metrics::RuntimeIntervals;

use super::adjuster::{Adjustment, Hold, SlotAdjuster};
use super::builder::ControllerBuilder;
use super::idle::{IdleDetector, Mode};
use super::inflation::{self, HoldInflation, InflationReading, InflationVerdict};
use super::signal::{a_worker_is_parked, CpuLoad, CpuSignal, RuntimeSignal, SignalSource};
use super::snapshot::{RuntimeSummary, SlotChange, Snapshot, Tick};
use super::tuning::{GlobalQueueWatch, WatchVerdict};
use crate::grant::{SlotGranter, SlotSnapshot};
use crate::health::Boundary;
use crate::queue::{Admit, WorkQueue};
use crate::sync::{Arc, Mutex, Ordering, StdAtomicU64};
use crate::ticker::Ticker;
use crate::work::WorkInfo;

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
pub(super) const SAMPLER: &str = "cpu_sampler";
/// The signal's fallback, for health records.
pub(super) const SIGNAL_ON_FAILURE: &str =
    "fails closed: enforcing, the slot total held, retried every idle period";
/// The smallest and largest expected length of one task poll for the
/// stable probe: below a microsecond every delay reads as a huge backlog,
/// above a second none ever reads as one.
pub(super) const POLL_ESTIMATE_RANGE: std::ops::RangeInclusive<Duration> =
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
    pub(super) core: Arc<Core>,
    pub(super) sampler: Ticker,
}

/// What the sampler thread and the controller's handle share.
pub(super) struct Core {
    pub(super) queue: WorkQueue<SlotGranter>,
    pub(super) adjuster: SlotAdjuster,
    pub(super) period: Duration,
    pub(super) idle_period: Duration,
    pub(super) started: Instant,
    pub(super) source: Option<SignalSource>,
    /// The panic boundary around the signal, the only user code in a tick.
    pub(super) signal_boundary: Boundary,
    pub(super) ticking: Mutex<Ticking>,
    /// The workers' busy share over the trailing busy span, as `f64` bits
    /// (`NO_UTILIZATION` until the first runtime summary): read on every
    /// response that carries a load report, so without the tick's lock.
    /// A report, deciding nothing: `std`'s atomic, outside loom's models.
    pub(super) utilization: StdAtomicU64,
}

/// [`Core::utilization`] before a runtime summary exists: a NaN's bits,
/// which no busy ratio has.
pub(super) const NO_UTILIZATION: u64 = u64::MAX;

/// The sampler's own state; locked for one tick at a time.
pub(super) struct Ticking {
    pub(super) signal: Box<dyn CpuSignal>,
    pub(super) idle: IdleDetector,
    pub(super) inflation: HoldInflation,
    pub(super) runtime: Option<RuntimeWatch>,
    pub(super) stats: Stats,
}

pub(super) struct RuntimeWatch {
    pub(super) intervals: RuntimeIntervals,
    pub(super) busy: BusySpan,
    pub(super) global_queue: GlobalQueueWatch,
    /// Read every tick for a parked worker: with every slot in use, the
    /// evidence an increase needs (see [`Hold::WorkersBusy`]).
    pub(super) metrics: RuntimeMetrics,
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
pub(super) struct BusySpan {
    /// The latest intervals' busy time and length, oldest first, covering
    /// at least the span once that much time has been seen.
    pub(super) recent: VecDeque<(Duration, Duration)>,
    /// The sums of `recent`.
    pub(super) busy: Duration,
    pub(super) elapsed: Duration,
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
pub(super) enum SignalChoice {
    Runtime {
        handle: Handle,
        poll_estimate: Duration,
        source: SignalSource,
    },
    Custom(Box<dyn CpuSignal>),
}

#[derive(Default)]
pub(super) struct Stats {
    pub(super) inflation: Option<InflationReading>,
    pub(super) ticks: u64,
    pub(super) last_tick: Option<Instant>,
    pub(super) samples: u64,
    pub(super) increases: u64,
    pub(super) decreases: u64,
    pub(super) idle_overruns: u64,
    pub(super) last_load: Option<CpuLoad>,
    pub(super) last_adjustment: Option<Adjustment>,
    pub(super) recent: VecDeque<SlotChange>,
    pub(super) runtime: Option<RuntimeSummary>,
    pub(super) worker_idled: Option<bool>,
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
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission::cpu::Controller;
    /// use admission::{Priority, TenantId, WorkInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let controller = Controller::for_runtime(&tokio::runtime::Handle::current()).build()?;
    /// let work = WorkInfo::builder()
    ///     .tenant(TenantId::new(7))
    ///     .priority(Priority::USER_HIGH)
    ///     .timeout(Duration::from_millis(100))
    ///     .build();
    /// let permit = controller.admit(work).await?;
    /// assert_eq!(controller.queue().snapshot().granter.used, 1);
    /// // ... the handler's work, holding the slot ...
    /// drop(permit);
    /// # Ok(())
    /// # }
    /// ```
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

    test_hook! {
        /// Takes one sample and applies the rule now, and says what it
        /// decided. The sampler thread does this every period; a controller
        /// built with [`manual`](ControllerBuilder::manual) has no thread
        /// and is driven by calling it. A test hook (feature `test-util`).
        fn step(&self) -> Tick {
            self.core.tick()
        }
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
    pub(super) fn sample(&self) -> Duration {
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
