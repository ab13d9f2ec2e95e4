//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`), for whatever exporter the application installs (Prometheus,
//! StatsD...). Without the feature every function here compiles to nothing.
//!
//! | name | kind | unit | labels | meaning |
//! |---|---|---|---|---|
//! | `admission_requests_total` | counter | requests | `queue`, `priority`, `outcome` | requests settled: `admitted`, `cancelled`, or an [`AdmitError::reason`](crate::AdmitError::reason) |
//! | `admission_wait_seconds` | histogram | seconds | `queue`, `priority` | how long admitted requests waited (0 on the fast path) |
//! | `admission_queue_length_by_priority` | gauge | requests | `queue`, `priority` | requests waiting, per priority that has been seen (their sum is the queue length) |
//! | `admission_slots_used` | gauge | slots | `queue` | slots held |
//! | `admission_slots` | gauge | slots | `queue` | the slot total (a gauge: it moves with the CPU controller, so no `_total` suffix) |
//! | `admission_cpu_runnable_per_worker` | gauge | tasks | | the CPU signal's last sample |
//! | `admission_cpu_idle` | gauge | | | 1 while the CPU controller is idle (not enforcing) |
//! | `admission_cpu_global_queue_backlogged_windows_total` | counter | windows | | windows of the CPU controller's active ticks in which tasks kept waiting in tokio's global queue, before admission could order them (see [`cpu::configure_runtime`](crate::cpu::configure_runtime)) |
//! | `admission_io_tokens_available` | gauge | bytes | `queue`, `class` | an IO token class's balance (negative in debt, `+Inf` while unlimited; [`TokenQueues::record_metrics`](crate::TokenQueues::record_metrics)) |
//! | `admission_gpu_managed_bytes` | gauge | bytes | `device` | a GPU ledger's managed capacity ([`QueryService::record_metrics`](crate::gpu::QueryService::record_metrics)) |
//! | `admission_gpu_granted_bytes` | gauge | bytes | `device` | bytes committed to running attempts |
//! | `admission_gpu_cache_bytes` | gauge | bytes | `device` | resident cache bytes, evictable and pinned |
//! | `admission_gpu_active_attempts` | gauge | attempts | `device` | attempts running |
//! | `admission_callback_panics_total` | counter | panics | `component` | panics caught in user code the crate calls (see [`ComponentHealth`](crate::ComponentHealth)) |
//! | `admission_pool_tasks_total` | counter | tasks | | [`CpuPool`](crate::pool::CpuPool) jobs taken by a thread: `completed`, `panicked`, or `abandoned` (its future dropped before the start) |
//! | `admission_pool_threads` | gauge | threads | | the pool's own threads (its slot total) |
//! | `admission_pool_busy` | gauge | threads | | pool threads running a closure, borrowed ones included |
//! | `admission_pool_borrowed` | gauge | threads | | threads borrowed beyond the total for bypass work |
//! | `admission_quota_degraded` | gauge | | | 1 while the node cannot reach its [`Quota`](crate::quota::Quota)'s backend and admits on the fallback trickle |
//! | `admission_quota_tenants` | gauge | tenants | | tenants under quota on this node ([`Quota::record_metrics`](crate::quota::Quota::record_metrics)) |
//! | `admission_quota_leased_units_total` | counter | units | | quota units leased from the backend |
//! | `admission_quota_fallback_units_total` | counter | units | | quota units the fallback trickle added while degraded |
//! | `admission_quota_backend_failures_total` | counter | exchanges | | exchanges with the quota backend that failed (error, timeout, panic) |
//! | `admission_quota_over_quota_total` | counter | requests | | requests refused as over their tenant's quota |
//!
//! [`describe`] registers each metric's help text and unit with the
//! installed recorder (so the Prometheus exporter writes `# HELP` lines);
//! [`WorkQueueBuilder::build`](crate::WorkQueueBuilder::build) calls it, so
//! it only needs calling again when the recorder is installed after the
//! first queue is built. The `queue` label is the queue's
//! [`name`](crate::WorkQueueBuilder::name). With the Prometheus exporter,
//! give `admission_wait_seconds` buckets
//! (`PrometheusBuilder::set_buckets_for_metric`; `examples/axum_server.rs`
//! does) or it is written as a summary, which cannot be aggregated across
//! instances.
//!
//! The recorder is the application's code: every call into it runs behind a
//! panic catch of its own, so a recorder that panics loses that recording
//! (the panic is logged: the first, then at every power of two) and
//! nothing else.
//!
//! Counters and the histogram are recorded when a request settles, outside
//! the queue's lock, and without an allocation: each queue keeps the keys
//! of its series for the named priority rungs (a priority between rungs is
//! labelled with its number, formatted on every call). Gauges are set by [`WorkQueue::record_metrics`](crate::WorkQueue::record_metrics),
//! which the CPU controller calls on every tick (a queue without one: call
//! it from the scrape handler, as `examples/axum_server.rs` does, or on a
//! timer). Priority labels are the rung names (`user-high`, `normal`,
//! `bulk-normal`...) or the number for priorities between rungs.
//!
//! # Tracing
//!
//! Independent of the feature, admission reports to `tracing` under the
//! target `admission`:
//!
//! | what | level | fields |
//! |---|---|---|
//! | span `admission_wait`, one per request that has to wait, entered while its future is polled, closed when it settles | debug | `tenant`, `priority`, `outcome` (the metric's `outcome` label: `admitted`, `cancelled` or the [`AdmitError::reason`](crate::AdmitError::reason)), `wait_us` (on every outcome) |
//! | event "admission rejected without queueing" | debug | `tenant`, `priority`, `error` |
//! | event "admission deadline expired while waiting" / "admission refused while waiting" | debug | `tenant`, `priority`, `waited_us` |
//! | event "CPU controller changed mode" | debug | `mode` |
//!
//! Requests admitted at once (fast path, bypass) open no span: tracing them
//! would cost more than admitting them.

use std::time::Duration;

use crate::sync::{StdArc, StdAtomicU64};
use crate::work::Priority;

/// Panics caught in the installed `metrics` recorder: what decides which
/// of them are logged.
static RECORDER_PANICS: StdAtomicU64 = StdAtomicU64::new(0);

test_hook! {
    /// How many times the installed `metrics` recorder panicked while
    /// admission recorded through it. Each panic was caught and logged (the
    /// first, then at every power of two), and that one recording was lost;
    /// admission itself went on. Always 0 without the `metrics` feature.
    ///
    /// The recorder is the application's code, called on admission's hot
    /// path (where a request settles, between a grant and the permit that
    /// returns it): a panic there must not unwind into admission, where it
    /// would leave a slot granted with nothing to return it. The tests read
    /// this count to see that every recording went through the catch; a
    /// service sees the panics in its log, and there is no `admission_*`
    /// metric of them, since reporting one would go through the recorder
    /// that failed.
    fn recorder_panics() -> u64 {
        RECORDER_PANICS.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Runs `record`, which calls the installed recorder, behind a panic
/// boundary of its own (not a [`Boundary`](crate::health::Boundary): that
/// reports panics through the recorder).
#[cfg(feature = "metrics")]
fn to_recorder(record: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(record)).is_err() {
        let panics = RECORDER_PANICS
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .saturating_add(1);
        if panics.is_power_of_two() {
            tracing::error!(
                target: "admission",
                panics,
                "the metrics recorder panicked; the panic was caught and that recording lost"
            );
        }
    }
}

/// The outcome label of an admitted request.
pub(crate) const ADMITTED: &str = "admitted";
/// The outcome label of a request whose future was dropped while it waited.
pub(crate) const CANCELLED: &str = "cancelled";

#[cfg(feature = "metrics")]
fn priority_label(priority: Priority) -> metrics::SharedString {
    match priority.name() {
        Some(name) => metrics::SharedString::const_str(name),
        None => priority.get().to_string().into(),
    }
}

/// Registers every metric's help text and unit with the installed recorder;
/// see the [module docs](self). Idempotent; does nothing without the
/// `metrics` feature.
pub fn describe() {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        use metrics::Unit;
        metrics::describe_counter!(
            "admission_requests_total",
            Unit::Count,
            "Admission requests settled, by queue, priority and outcome (admitted, cancelled, or the refusal's reason)."
        );
        metrics::describe_histogram!(
            "admission_wait_seconds",
            Unit::Seconds,
            "How long admitted requests waited for admission (0 on the fast path)."
        );
        metrics::describe_gauge!(
            "admission_queue_length_by_priority",
            Unit::Count,
            "Requests waiting for admission, by queue and priority."
        );
        metrics::describe_gauge!(
            "admission_slots_used",
            Unit::Count,
            "Slots held by admitted work."
        );
        metrics::describe_gauge!(
            "admission_slots",
            Unit::Count,
            "The slot total admission grants up to."
        );
        metrics::describe_gauge!(
            "admission_cpu_runnable_per_worker",
            Unit::Count,
            "The CPU controller's last sample of runnable tasks per worker."
        );
        metrics::describe_gauge!(
            "admission_cpu_idle",
            "1 while the CPU controller is idle (not enforcing slots), else 0."
        );
        metrics::describe_counter!(
            "admission_cpu_global_queue_backlogged_windows_total",
            Unit::Count,
            "Windows of CPU controller ticks in which tasks kept waiting in tokio's global queue, before admission could order them."
        );
        metrics::describe_gauge!(
            "admission_io_tokens_available",
            Unit::Bytes,
            "An IO token class's balance in bytes: negative in debt, +Inf while unlimited."
        );
        metrics::describe_gauge!(
            "admission_gpu_managed_bytes",
            Unit::Bytes,
            "A GPU ledger's managed capacity."
        );
        metrics::describe_gauge!(
            "admission_gpu_granted_bytes",
            Unit::Bytes,
            "GPU memory committed to running attempts."
        );
        metrics::describe_gauge!(
            "admission_gpu_cache_bytes",
            Unit::Bytes,
            "Resident GPU cache bytes, evictable and pinned."
        );
        metrics::describe_gauge!(
            "admission_gpu_active_attempts",
            Unit::Count,
            "GPU attempts running."
        );
        metrics::describe_counter!(
            "admission_pool_tasks_total",
            Unit::Count,
            "CPU pool jobs taken by a thread, by outcome (completed, panicked, abandoned)."
        );
        metrics::describe_gauge!(
            "admission_pool_threads",
            Unit::Count,
            "The CPU pool's own threads (its slot total)."
        );
        metrics::describe_gauge!(
            "admission_pool_busy",
            Unit::Count,
            "CPU pool threads running a closure, borrowed ones included."
        );
        metrics::describe_gauge!(
            "admission_pool_borrowed",
            Unit::Count,
            "Threads borrowed beyond the CPU pool's total for bypass work."
        );
        metrics::describe_gauge!(
            "admission_quota_degraded",
            "1 while the node cannot reach its quota backend and admits on the fallback trickle, else 0."
        );
        metrics::describe_gauge!(
            "admission_quota_tenants",
            Unit::Count,
            "Tenants under quota on this node."
        );
        metrics::describe_counter!(
            "admission_quota_leased_units_total",
            Unit::Count,
            "Quota units leased from the backend."
        );
        metrics::describe_counter!(
            "admission_quota_fallback_units_total",
            Unit::Count,
            "Quota units the fallback trickle added while the backend was out of reach."
        );
        metrics::describe_counter!(
            "admission_quota_backend_failures_total",
            Unit::Count,
            "Exchanges with the quota backend that failed (error, timeout, panic)."
        );
        metrics::describe_counter!(
            "admission_quota_over_quota_total",
            Unit::Count,
            "Requests refused as over their tenant's quota."
        );
        metrics::describe_counter!(
            "admission_callback_panics_total",
            Unit::Count,
            "Panics caught in user code the admission crate calls, by component."
        );
    });
}

/// The named priority rungs, in the order of [`QueueKeys`]' tables.
#[cfg(feature = "metrics")]
const RUNGS: [Priority; 8] = Priority::RUNGS;

/// Every `outcome` label a request can settle with, in the order of
/// [`QueueKeys`]' tables (a test checks every refusal's reason is here).
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 10] = [
    ADMITTED,
    CANCELLED,
    "queue_full",
    "closed",
    "deadline_passed",
    "deadline_exceeded",
    "would_miss_deadline",
    "never_fits",
    "timer_unavailable",
    "over_quota",
];

/// What the metric macros would register the per-request metrics with.
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The `metrics` keys of one queue's per-request series, each built the
/// first time it is used and kept.
///
/// Why: a key whose labels are not literals owns a vector of them, so the
/// `counter!` macro allocates one on every call, and a request settles (is
/// admitted, refused or cancelled) at the rate requests arrive; an unpaced
/// client's refusals must not cost an allocation each. Priorities between
/// the named rungs, which are labelled with their number, are not kept.
pub(crate) struct QueueKeys {
    /// The `queue` label.
    name: StdArc<str>,
    #[cfg(feature = "metrics")]
    table: Box<KeyTable>,
}

#[cfg(feature = "metrics")]
struct KeyTable {
    /// `admission_requests_total` by rung and outcome.
    requests: [[std::sync::OnceLock<metrics::Key>; OUTCOMES.len()]; RUNGS.len()],
    /// `admission_wait_seconds` by rung.
    wait: [std::sync::OnceLock<metrics::Key>; RUNGS.len()],
}

impl QueueKeys {
    pub(crate) fn new(name: StdArc<str>) -> Self {
        QueueKeys {
            name,
            #[cfg(feature = "metrics")]
            table: Box::new(KeyTable {
                requests: std::array::from_fn(|_| std::array::from_fn(|_| Default::default())),
                wait: std::array::from_fn(|_| Default::default()),
            }),
        }
    }

    /// The queue's name, its `queue` label.
    pub(crate) fn name(&self) -> &StdArc<str> {
        &self.name
    }
}

#[cfg(feature = "metrics")]
fn requests_key(
    queue: &StdArc<str>,
    priority: metrics::SharedString,
    outcome: &'static str,
) -> metrics::Key {
    let labels = vec![
        metrics::Label::new("queue", queue.clone()),
        metrics::Label::new("priority", priority),
        metrics::Label::from_static_parts("outcome", outcome),
    ];
    metrics::Key::from_parts("admission_requests_total", labels)
}

#[cfg(feature = "metrics")]
fn wait_key(queue: &StdArc<str>, priority: metrics::SharedString) -> metrics::Key {
    let labels = vec![
        metrics::Label::new("queue", queue.clone()),
        metrics::Label::new("priority", priority),
    ];
    metrics::Key::from_parts("admission_wait_seconds", labels)
}

/// A request settled with `outcome`, after `waited` if it was admitted.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn settled(
    keys: &QueueKeys,
    priority: Priority,
    outcome: &'static str,
    waited: Option<Duration>,
) {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        let queue = &keys.name;
        let rung = RUNGS.iter().position(|&rung| rung == priority);
        let requests = rung.zip(OUTCOMES.iter().position(|&known| known == outcome));
        let counter = |key: &metrics::Key| {
            metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
                .increment(1);
        };
        match requests {
            Some((rung, index)) => counter(
                keys.table.requests[rung][index]
                    .get_or_init(|| requests_key(queue, priority_label(priority), outcome)),
            ),
            None => counter(&requests_key(queue, priority_label(priority), outcome)),
        }
        if let Some(waited) = waited {
            let histogram = |key: &metrics::Key| {
                metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
                    .record(waited.as_secs_f64());
            };
            match rung {
                Some(rung) => histogram(
                    keys.table.wait[rung].get_or_init(|| wait_key(queue, priority_label(priority))),
                ),
                None => histogram(&wait_key(queue, priority_label(priority))),
            }
        }
    });
}

/// The queue's levels (only called with the feature on: reading them takes
/// the queue's lock, which is not worth taking for nothing).
#[cfg(feature = "metrics")]
pub(crate) fn queue_levels(
    queue: &StdArc<str>,
    by_priority: &[(Priority, usize)],
    used: u64,
    total: u64,
) {
    to_recorder(|| {
        for &(priority, waiting) in by_priority {
            metrics::gauge!("admission_queue_length_by_priority", "queue" => queue.clone(), "priority" => priority_label(priority))
                .set(waiting as f64);
        }
        metrics::gauge!("admission_slots_used", "queue" => queue.clone()).set(used as f64);
        metrics::gauge!("admission_slots", "queue" => queue.clone()).set(total as f64);
    });
}

/// One IO token class's balance (`+Inf` while unlimited).
#[cfg(feature = "metrics")]
pub(crate) fn io_tokens(queue: &str, class: &'static str, available: i64, unlimited: bool) {
    let available = if unlimited {
        f64::INFINITY
    } else {
        available as f64
    };
    to_recorder(|| {
        metrics::gauge!("admission_io_tokens_available", "queue" => queue.to_owned(), "class" => class)
            .set(available);
    });
}

/// One GPU device's ledger, in plain values (the GPU service reads them
/// from its ledgers' snapshots, so this sink knows nothing of GPUs).
#[cfg(feature = "metrics")]
pub(crate) fn gpu_ledger(
    device: u32,
    managed_bytes: u64,
    granted_bytes: u64,
    cache_bytes: u64,
    active_attempts: u32,
) {
    to_recorder(|| {
        let device = device.to_string();
        metrics::gauge!("admission_gpu_managed_bytes", "device" => device.clone())
            .set(managed_bytes as f64);
        metrics::gauge!("admission_gpu_granted_bytes", "device" => device.clone())
            .set(granted_bytes as f64);
        metrics::gauge!("admission_gpu_cache_bytes", "device" => device.clone())
            .set(cache_bytes as f64);
        metrics::gauge!("admission_gpu_active_attempts", "device" => device)
            .set(f64::from(active_attempts));
    });
}

/// The CPU controller's signal and mode.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn cpu(runnable_per_worker: f64, idle: bool) {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::gauge!("admission_cpu_runnable_per_worker").set(runnable_per_worker);
        metrics::gauge!("admission_cpu_idle").set(if idle { 1.0 } else { 0.0 });
    });
}

/// A window of the CPU controller's ticks found tokio's global queue
/// backlogged.
pub(crate) fn cpu_global_queue_backlogged() {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::counter!("admission_cpu_global_queue_backlogged_windows_total").increment(1);
    });
}

/// A panic was caught in `component`'s user code.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn callback_panicked(component: &'static str) {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::counter!("admission_callback_panics_total", "component" => component).increment(1);
    });
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;
    use crate::AdmitError;

    #[test]
    fn every_refusal_reason_has_a_kept_key() {
        let refusals = AdmitError::one_of_each();
        for error in refusals {
            assert!(OUTCOMES.contains(&error.reason()), "{error}");
        }
        for rung in RUNGS {
            assert!(rung.name().is_some(), "{rung:?}");
        }
    }
}

/// The outcome label of a pool job whose closure returned.
pub(crate) const POOL_COMPLETED: &str = "completed";
/// The outcome label of a pool job whose closure panicked.
pub(crate) const POOL_PANICKED: &str = "panicked";
/// The outcome label of a pool job skipped because its future was dropped.
pub(crate) const POOL_ABANDONED: &str = "abandoned";

/// A CPU pool's thread took a job, which ended with `outcome`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn pool_task(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::counter!("admission_pool_tasks_total", "outcome" => outcome).increment(1);
    });
}

/// A CPU pool's levels (only called with the feature on, like
/// [`queue_levels`]).
#[cfg(feature = "metrics")]
pub(crate) fn pool_levels(threads: usize, busy: usize, borrowed: usize) {
    to_recorder(|| {
        metrics::gauge!("admission_pool_threads").set(threads as f64);
        metrics::gauge!("admission_pool_busy").set(busy as f64);
        metrics::gauge!("admission_pool_borrowed").set(borrowed as f64);
    });
}

/// Whether the quota's node is degraded (on its fallback trickle).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn quota_degraded(degraded: bool) {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::gauge!("admission_quota_degraded").set(if degraded { 1.0 } else { 0.0 });
    });
}

/// The quota's levels (only called with the feature on, like
/// [`queue_levels`]).
#[cfg(feature = "metrics")]
pub(crate) fn quota_levels(degraded: bool, tenants: usize) {
    quota_degraded(degraded);
    to_recorder(|| {
        metrics::gauge!("admission_quota_tenants").set(tenants as f64);
    });
}

/// Units leased from the quota backend.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn quota_leased_units(units: u64) {
    #[cfg(feature = "metrics")]
    if units > 0 {
        to_recorder(|| {
            metrics::counter!("admission_quota_leased_units_total").increment(units);
        });
    }
}

/// Units the fallback trickle added.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn quota_fallback_units(units: u64) {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::counter!("admission_quota_fallback_units_total").increment(units);
    });
}

/// An exchange with the quota backend failed.
pub(crate) fn quota_backend_failure() {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::counter!("admission_quota_backend_failures_total").increment(1);
    });
}

/// A request was refused as over its tenant's quota.
pub(crate) fn quota_over_quota() {
    #[cfg(feature = "metrics")]
    to_recorder(|| {
        metrics::counter!("admission_quota_over_quota_total").increment(1);
    });
}
