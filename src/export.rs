//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`), for whatever exporter the application installs (Prometheus,
//! StatsD...). Without the feature every function here compiles to nothing.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `admission_requests_total` | counter | `priority`, `outcome` | requests settled: `admitted`, `cancelled`, or an [`AdmitError::reason`](crate::AdmitError::reason) |
//! | `admission_wait_seconds` | histogram | `priority` | how long admitted requests waited (0 on the fast path) |
//! | `admission_queue_length` | gauge | | requests waiting |
//! | `admission_queue_length_by_priority` | gauge | `priority` | requests waiting, per priority that has been seen |
//! | `admission_slots_used` | gauge | | slots held |
//! | `admission_slots_total` | gauge | | the slot total |
//! | `admission_cpu_runnable_per_worker` | gauge | | the CPU signal's last sample |
//! | `admission_cpu_idle` | gauge | | 1 while the CPU controller is idle (not enforcing) |
//! | `admission_callback_panics_total` | counter | `component` | panics caught in user code the crate calls (see [`health`](crate::health)) |
//! | `admission_pool_tasks_total` | counter | `outcome` | [`CpuPool`](crate::pool::CpuPool) jobs taken by a thread: `completed`, `panicked`, or `abandoned` (its future dropped before the start) |
//! | `admission_pool_threads` | gauge | | the pool's own threads (its slot total) |
//! | `admission_pool_busy` | gauge | | pool threads running a closure, borrowed ones included |
//! | `admission_pool_borrowed` | gauge | | threads borrowed beyond the total for bypass work |
//! | `admission_pool_queue_length` | gauge | | work waiting for admission to the pool |
//!
//! Counters and the histogram are recorded when a request settles, outside
//! the queue's lock. Gauges are set by [`WorkQueue::record_metrics`](crate::WorkQueue::record_metrics),
//! which the CPU controller calls on every tick. Priority labels are the
//! rung names (`user-high`, `normal`, `bulk-normal`...) or the number for
//! priorities between rungs.
//!
//! # Tracing
//!
//! Independent of the feature, admission reports to `tracing` under the
//! target `admission`:
//!
//! | what | level | fields |
//! |---|---|---|
//! | span `admission_wait`, one per request that has to wait, closed when it settles | debug | `tenant`, `priority`, `outcome` (`admitted`, `cancelled` or the error's message), `wait_us` |
//! | event "admission rejected without queueing" | debug | `tenant`, `priority`, `error` |
//! | event "admission deadline expired while waiting" / "admission refused while waiting" | debug | `tenant`, `priority`, `waited_us` |
//! | event "CPU controller changed mode" | debug | `mode` |
//!
//! Requests admitted at once (fast path, bypass) open no span: tracing them
//! would cost more than admitting them.

use std::time::Duration;

use crate::work::Priority;

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

/// A request settled with `outcome`, after `waited` if it was admitted.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn settled(priority: Priority, outcome: &'static str, waited: Option<Duration>) {
    #[cfg(feature = "metrics")]
    {
        let label = priority_label(priority);
        metrics::counter!("admission_requests_total", "priority" => label.clone(), "outcome" => outcome)
            .increment(1);
        if let Some(waited) = waited {
            metrics::histogram!("admission_wait_seconds", "priority" => label)
                .record(waited.as_secs_f64());
        }
    }
}

/// The queue's levels (only called with the feature on: reading them takes
/// the queue's lock, which is not worth taking for nothing).
#[cfg(feature = "metrics")]
pub(crate) fn queue_levels(
    waiting: usize,
    by_priority: &[(Priority, usize)],
    used: u64,
    total: u64,
) {
    metrics::gauge!("admission_queue_length").set(waiting as f64);
    for &(priority, waiting) in by_priority {
        metrics::gauge!("admission_queue_length_by_priority", "priority" => priority_label(priority))
            .set(waiting as f64);
    }
    metrics::gauge!("admission_slots_used").set(used as f64);
    metrics::gauge!("admission_slots_total").set(total as f64);
}

/// The CPU controller's signal and mode.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn cpu(runnable_per_worker: f64, idle: bool) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("admission_cpu_runnable_per_worker").set(runnable_per_worker);
        metrics::gauge!("admission_cpu_idle").set(if idle { 1.0 } else { 0.0 });
    }
}

/// A panic was caught in `component`'s user code.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn callback_panicked(component: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("admission_callback_panics_total", "component" => component).increment(1);
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
    metrics::counter!("admission_pool_tasks_total", "outcome" => outcome).increment(1);
}

/// A CPU pool's levels (only called with the feature on, like
/// [`queue_levels`]).
#[cfg(feature = "metrics")]
pub(crate) fn pool_levels(threads: usize, busy: usize, borrowed: usize, queued: usize) {
    metrics::gauge!("admission_pool_threads").set(threads as f64);
    metrics::gauge!("admission_pool_busy").set(busy as f64);
    metrics::gauge!("admission_pool_borrowed").set(borrowed as f64);
    metrics::gauge!("admission_pool_queue_length").set(queued as f64);
}
