//! What admission reports through the `metrics` facade.

#![cfg(feature = "metrics")]

mod common;

use std::time::Duration;

use admission::{AdmitError, WorkQueue};
use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use tokio::time::Instant;

type Entry = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

fn counter(entries: &[Entry], name: &str, labels: &[(&str, &str)]) -> u64 {
    entries
        .iter()
        .filter(|(key, ..)| key.kind() == MetricKind::Counter && key.key().name() == name)
        .filter(|(key, ..)| {
            labels.iter().all(|&(l, v)| {
                key.key()
                    .labels()
                    .any(|label| label.key() == l && label.value() == v)
            })
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn gauge(entries: &[Entry], name: &str) -> Option<f64> {
    entries.iter().find_map(|(key, .., value)| match value {
        DebugValue::Gauge(g) if key.key().name() == name => Some(g.into_inner()),
        _ => None,
    })
}

#[test]
fn every_outcome_is_counted_by_priority_and_gauges_show_the_levels() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let t0 = Instant::now();
            let queue = WorkQueue::builder()
                .total_slots(1)
                .max_waiters(2)
                .build()
                .unwrap();
            let held = admit_now(&queue, work(1, 0, t0, 0));
            let mut granted_later = vec![("later", enqueue(&queue, work(1, 50, t0, 1)))];
            let cancelled = enqueue(&queue, work(1, 0, t0, 2));
            let full = queue.admit(work(1, -30, t0, 3)).await;
            assert_eq!(full.unwrap_err(), AdmitError::QueueFull { max_waiters: 2 });
            queue.record_metrics();
            tokio::time::advance(Duration::from_millis(2)).await;
            drop(cancelled);
            drop(held);
            let _permit = granted(&mut granted_later);
        });
    });
    let entries = snapshotter.snapshot().into_vec();
    let requests = |labels: &[(&str, &str)]| counter(&entries, "admission_requests_total", labels);
    assert_eq!(
        requests(&[("priority", "normal"), ("outcome", "admitted")]),
        1
    );
    assert_eq!(
        requests(&[("priority", "user-high"), ("outcome", "admitted")]),
        1
    );
    assert_eq!(
        requests(&[("priority", "normal"), ("outcome", "cancelled")]),
        1
    );
    assert_eq!(
        requests(&[("priority", "bulk-normal"), ("outcome", "queue_full")]),
        1
    );
    assert_eq!(requests(&[]), 4);
    assert!(entries.iter().any(|(key, .., value)| key.key().name() == "admission_wait_seconds"
        && matches!(value, DebugValue::Histogram(samples) if samples.iter().any(|s| s.into_inner() == 0.002))));
    assert_eq!(gauge(&entries, "admission_queue_length"), Some(2.0));
    let waiting_at = |priority: &str| {
        entries.iter().find_map(|(key, .., value)| match value {
            DebugValue::Gauge(g)
                if key.key().name() == "admission_queue_length_by_priority"
                    && key.key().labels().any(|l| l.value() == priority) =>
            {
                Some(g.into_inner())
            }
            _ => None,
        })
    };
    assert_eq!(waiting_at("normal"), Some(1.0));
    assert_eq!(waiting_at("user-high"), Some(1.0));
    assert_eq!(gauge(&entries, "admission_slots_used"), Some(1.0));
    assert_eq!(gauge(&entries, "admission_slots_total"), Some(1.0));
}
