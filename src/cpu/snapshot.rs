//! What the controller reports: one tick's outcome, and its state at one
//! moment.

use std::time::Duration;

use super::adjuster::Adjustment;
use super::idle::Mode;
use super::inflation::InflationReading;
use super::signal::{CpuLoad, SignalSource};
use super::tuning::GlobalQueueBacklog;
use crate::grant::SlotSnapshot;
use crate::health::ComponentHealth;
use crate::observe::QueueSnapshot;
use crate::work::Priority;

/// One tick's outcome, as [`Controller::step`](super::Controller::step)
/// returns it. Public only with `test-util`, as the hook is; the snapshot
/// keeps what a running controller decided.
#[cfg_attr(
    not(any(test, loom, feature = "test-util")),
    allow(dead_code, unreachable_pub)
)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tick {
    /// The sample the tick acted on; `None` when the signal panicked (the
    /// tick then held the total, [`Hold::SignalFailed`](super::Hold::SignalFailed), and enforced).
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
    /// tick sampled: an increase needs one ([`Hold::WorkersBusy`](super::Hold::WorkersBusy)). `None`
    /// with an injected signal, which has no workers to ask.
    pub worker_idled: Option<bool>,
    /// The queue, including slots used and total.
    pub queue: QueueSnapshot<SlotSnapshot>,
    /// The latest window of the second signal: admitted work's hold
    /// inflation over its unloaded value, inversion, and the verdict (see
    /// the [module documentation](super)); `None` before the first window.
    /// Crate-private: the rule's working, which `Debug` shows; what it
    /// decided is [`last_adjustment`](Self::last_adjustment).
    // Only `Debug` reads it, which dead-code analysis does not count.
    #[allow(dead_code)]
    pub(crate) inflation: Option<InflationReading>,
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
