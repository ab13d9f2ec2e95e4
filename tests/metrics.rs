//! What admission reports through the `metrics` facade.

#![cfg(feature = "metrics")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use admission::{AdmitError, WorkQueue};
use common::*;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use tokio::time::Instant;

type Entry = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

/// Whether `key` carries every `(label, value)` of `labels`.
fn has_labels(key: &CompositeKey, labels: &[(&str, &str)]) -> bool {
    labels.iter().all(|&(l, v)| {
        key.key()
            .labels()
            .any(|label| label.key() == l && label.value() == v)
    })
}

fn counter(entries: &[Entry], name: &str, labels: &[(&str, &str)]) -> u64 {
    entries
        .iter()
        .filter(|(key, ..)| key.kind() == MetricKind::Counter && key.key().name() == name)
        .filter(|(key, ..)| has_labels(key, labels))
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

/// The first gauge named `name` that carries `labels`.
fn gauge(entries: &[Entry], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    entries.iter().find_map(|(key, .., value)| match value {
        DebugValue::Gauge(g) if key.key().name() == name && has_labels(key, labels) => {
            Some(g.into_inner())
        }
        _ => None,
    })
}

/// What `f` returned and what it recorded through the `metrics` facade.
fn recorded<R>(f: impl FnOnce() -> R) -> (R, Vec<Entry>) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let value = metrics::with_local_recorder(&recorder, f);
    (value, snapshotter.snapshot().into_vec())
}

#[test]
fn every_outcome_is_counted_by_priority_and_gauges_show_the_levels() {
    let ((), entries) = recorded(|| {
        paused_runtime().block_on(async {
            let t0 = Instant::now();
            let queue = WorkQueue::builder()
                .total_slots(1)
                .max_waiters(2)
                .name("orders")
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
    // The total is the sum of the per-priority gauges: not a series of
    // its own.
    assert_eq!(gauge(&entries, "admission_queue_length", &[]), None);
    let waiting_at = |priority: &str| {
        gauge(
            &entries,
            "admission_queue_length_by_priority",
            &[("priority", priority)],
        )
    };
    assert_eq!(waiting_at("normal"), Some(1.0));
    assert_eq!(waiting_at("user-high"), Some(1.0));
    assert_eq!(gauge(&entries, "admission_slots_used", &[]), Some(1.0));
    assert_eq!(gauge(&entries, "admission_slots", &[]), Some(1.0));
    assert_eq!(
        gauge(&entries, "admission_slots_total", &[]),
        None,
        "a gauge"
    );
    assert!(
        entries.iter().all(|(key, ..)| {
            !key.key().name().starts_with("admission_slots")
                && !key.key().name().starts_with("admission_queue")
                && key.key().name() != "admission_requests_total"
                || key
                    .key()
                    .labels()
                    .any(|l| l.key() == "queue" && l.value() == "orders")
        }),
        "every queue series carries the queue label"
    );
}

#[test]
fn two_named_queues_keep_their_series_apart() {
    let ((), entries) = recorded(|| {
        paused_runtime().block_on(async {
            let t0 = Instant::now();
            let cpu = WorkQueue::builder().name("cpu").build().unwrap();
            let io = WorkQueue::builder()
                .name("io")
                .total_slots(3)
                .build()
                .unwrap();
            let _a = admit_now(&cpu, work(1, 0, t0, 0));
            let _b = admit_now(&io, work(1, 0, t0, 0));
            let _c = admit_now(&io, work(1, 0, t0, 0));
            cpu.record_metrics();
            io.record_metrics();
        });
    });
    let slots = |queue: &str| gauge(&entries, "admission_slots", &[("queue", queue)]);
    assert_eq!((slots("cpu"), slots("io")), (Some(1.0), Some(3.0)));
    assert_eq!(
        counter(
            &entries,
            "admission_requests_total",
            &[("queue", "io"), ("outcome", "admitted")]
        ),
        2
    );
    assert_eq!(
        counter(
            &entries,
            "admission_requests_total",
            &[("queue", "cpu"), ("outcome", "admitted")]
        ),
        1
    );
}

#[test]
fn an_empty_queue_name_is_refused_naming_the_field() {
    let error = WorkQueue::builder().name("").build().unwrap_err();
    assert_eq!(error.field(), "name");
}

/// Two queues built without a name never share a series: each gets a name
/// of its own.
#[test]
fn unnamed_queues_get_names_of_their_own() {
    let names: Vec<String> = (0..3)
        .map(|_| WorkQueue::new(1).unwrap().name().to_owned())
        .collect();
    assert!(
        names.iter().all(|name| name.starts_with("default")),
        "{names:?}"
    );
    let distinct: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(distinct.len(), 3, "{names:?}");
    let named = WorkQueue::builder()
        .name(String::from("shard-7"))
        .build()
        .unwrap();
    assert_eq!(named.name(), "shard-7");
}

// The Prometheus text of admission's metrics passes `promtool check
// metrics` and the Python client's parser: run with each when it is on the
// machine (Debian's `prometheus` package, `pip install prometheus-client`),
// and in any case checked here against the same rules (every family has HELP and TYPE,
// counters and only counters end in `_total`, histograms have buckets up
// to `+Inf`, sums and counts, names are valid), plus ours: every queue
// series carries the `queue` label.

/// Admission's metrics after one admitted, one waiting and one refused
/// request, in Prometheus text, with the histogram bucketed as the
/// examples do.
fn exposition() -> String {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("admission_wait_seconds".into()),
            &[0.0, 0.001, 0.01, 0.1, 1.0],
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        paused_runtime().block_on(async {
            let t0 = Instant::now();
            let queue = WorkQueue::builder()
                .name("http")
                .total_slots(1)
                .max_waiters(1)
                .build()
                .unwrap();
            let _held = admit_now(&queue, work(1, 0, t0, 0));
            let _waiting = enqueue(&queue, work(2, 50, t0, 1));
            let refused = queue.admit(work(3, 0, t0, 2)).await;
            assert_eq!(
                refused.unwrap_err(),
                AdmitError::QueueFull { max_waiters: 1 }
            );
            queue.record_metrics();

            // The gauges of the other resources: IO token budgets (one
            // class limited, the other unlimited, written as infinity) and
            // a GPU ledger.
            let io =
                admission::TokenQueues::with_builder(WorkQueue::builder().name("io"), 1_000, 500)
                    .unwrap();
            io.set_limits(Some(1_000), None).unwrap();
            io.add_tokens(300, 0);
            io.record_metrics();
            gpu_service().record_metrics();
        });
    });
    handle.render()
}

/// A service over one simulated device (ordinal 3: 80 GB managed, a 16 GB
/// cache cap) with nothing running: a ledger is only reachable through a
/// service (its constructor is crate-private).
fn gpu_service() -> admission::gpu::QueryService {
    use admission::gpu::backend::sim::{SimBackend, SimDevice};
    use admission::gpu::backend::DeviceOrdinal;
    use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};

    let profile = DeviceProfile::builder(DeviceOrdinal(3))
        .managed_capacity(80_000_000_000)
        .max_active_attempts(4)
        .cache_cap(16_000_000_000)
        .build()
        .unwrap();
    let sim = std::sync::Arc::new(SimBackend::new([SimDevice::new(3, 96_000_000_000)]));
    let devices = DeviceSet::new(
        vec![profile],
        vec![MemoryOwnership::exclusive(DeviceOrdinal(3))],
    )
    .unwrap();
    let bounds = QueueBounds::new(4, std::time::Duration::from_secs(1), 0).unwrap();
    QueryService::builder(sim, devices, bounds).build().unwrap()
}

/// The ledger snapshot of device 3 of `service`.
fn gpu_ledger_report_of(service: &admission::gpu::QueryService) -> admission::gpu::LedgerSnapshot {
    service
        .ledger_snapshots()
        .into_iter()
        .find(|r| r.device == admission::gpu::backend::DeviceOrdinal(3))
        .expect("the one device's ledger")
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The rules of `promtool check metrics` that apply to this text, and the
/// `queue` label; returns every violation.
fn violations(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut help = BTreeSet::new();
    let mut kinds = BTreeMap::new();
    let mut samples: Vec<(String, String)> = Vec::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            match rest.split_once(' ') {
                Some((name, text)) if !text.trim().is_empty() => {
                    help.insert(name.to_owned());
                }
                _ => problems.push(format!("empty HELP: {line}")),
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            kinds.insert(name.to_owned(), kind.to_owned());
        } else if line.starts_with('#') {
            continue;
        } else {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let (name, rest) = line.split_at(name_end);
            let labels = rest
                .strip_prefix('{')
                .and_then(|rest| rest.split_once('}'))
                .map_or("", |(labels, _)| labels);
            samples.push((name.to_owned(), labels.to_owned()));
        }
    }
    for (name, kind) in &kinds {
        if !valid_name(name) {
            problems.push(format!("invalid name {name}"));
        }
        if !help.contains(name) {
            problems.push(format!("{name} has no HELP"));
        }
        match kind.as_str() {
            "counter" if !name.ends_with("_total") => {
                problems.push(format!("counter {name} does not end in _total"))
            }
            "counter" => {}
            "gauge" | "histogram" | "summary" if name.ends_with("_total") => {
                problems.push(format!("{kind} {name} ends in _total"))
            }
            "gauge" => {}
            "histogram" => {
                for suffix in ["_sum", "_count"] {
                    if !samples
                        .iter()
                        .any(|(sample, _)| *sample == format!("{name}{suffix}"))
                    {
                        problems.push(format!("histogram {name} has no {suffix}"));
                    }
                }
                let bucket = format!("{name}_bucket");
                if !samples
                    .iter()
                    .any(|(sample, labels)| *sample == bucket && labels.contains("le=\"+Inf\""))
                {
                    problems.push(format!("histogram {name} has no +Inf bucket"));
                }
            }
            other => problems.push(format!("{name} is a {other:?}, expected a histogram")),
        }
    }
    for (sample, labels) in &samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                sample
                    .strip_suffix(suffix)
                    .filter(|family| kinds.get(*family).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(sample);
        if !kinds.contains_key(family) {
            problems.push(format!("{sample} has no TYPE"));
        }
        let per_queue = family.starts_with("admission_requests")
            || family.starts_with("admission_wait")
            || family.starts_with("admission_queue")
            || family.starts_with("admission_slots");
        if per_queue && !labels.contains("queue=\"http\"") {
            problems.push(format!("{sample}{{{labels}}} has no queue label"));
        }
    }
    problems
}

#[test]
fn the_exposition_passes_promtools_rules() {
    let text = exposition();
    for family in [
        "admission_requests_total",
        "admission_wait_seconds",
        "admission_queue_length_by_priority",
        "admission_slots_used",
        "admission_slots",
        "admission_io_tokens_available",
        "admission_gpu_managed_bytes",
        "admission_gpu_granted_bytes",
        "admission_gpu_cache_bytes",
        "admission_gpu_active_attempts",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    assert_eq!(violations(&text), Vec::<String>::new(), "\n{text}");

    // The real thing, where it is installed.
    if let Some(output) = run_with_stdin(Command::new("promtool").args(["check", "metrics"]), &text)
    {
        assert!(
            output.status.success(),
            "promtool: {}{}\n{text}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // And the Python client's parser (what a Python scraper or test reads
    // it with), where it is installed: exit 77 means it is not.
    if let Some(output) = run_with_stdin(Command::new("python3").args(["-c", PYTHON_PARSE]), &text)
    {
        let stdout = String::from_utf8_lossy(&output.stdout);
        if output.status.code() != Some(77) {
            assert!(
                output.status.success(),
                "prometheus_client: {stdout}{}\n{text}",
                String::from_utf8_lossy(&output.stderr)
            );
            // The families come through with their types (the parser
            // names a counter without its `_total`).
            for family in [
                "admission_requests counter",
                "admission_wait_seconds histogram",
                "admission_io_tokens_available gauge",
                "admission_gpu_managed_bytes gauge",
            ] {
                assert!(stdout.contains(family), "{family} missing:\n{stdout}");
            }
        }
    }
}

/// Parses stdin with `prometheus_client` and prints each family's name and
/// type; exits 77 when the package is not installed.
const PYTHON_PARSE: &str = "
import sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    sys.exit(77)
for family in text_string_to_metric_families(sys.stdin.read()):
    print(family.name, family.type, len(family.samples))
";

#[test]
fn the_checker_catches_what_promtool_would() {
    let bad = "# TYPE admission_slots_total gauge\nadmission_slots_total{queue=\"http\"} 1\n\
               # TYPE requests counter\n# HELP requests \nrequests 1\n\
               # TYPE admission_wait_seconds summary\n";
    let problems = violations(bad);
    for expected in [
        "admission_slots_total has no HELP",
        "gauge admission_slots_total ends in _total",
        "counter requests does not end in _total",
        "empty HELP: # HELP requests ",
        "admission_wait_seconds is a \"summary\", expected a histogram",
    ] {
        assert!(
            problems.iter().any(|p| p == expected),
            "{expected:?} not in {problems:?}"
        );
    }
}

/// Each window of a CPU controller's ticks that finds tokio's global queue
/// backlogged is counted once.
#[test]
fn a_backlogged_global_queue_is_counted_per_window() {
    // The controller judges the global queue in windows of 1,000 ticks.
    const BACKLOG_WINDOW_TICKS: u32 = 1_000;
    use admission::cpu::Controller;

    let held = HeldRuntime::new(8);
    let controller = Controller::for_runtime(held.runtime.handle())
        .manual()
        .build()
        .unwrap();
    let ((), entries) = recorded(|| {
        for _ in 0..2 * BACKLOG_WINDOW_TICKS {
            controller.step();
        }
    });
    let name = "admission_cpu_global_queue_backlogged_windows_total";
    assert_eq!(counter(&entries, name, &[]), 2);
    held.release();
    let ((), entries) = recorded(|| {
        for _ in 0..BACKLOG_WINDOW_TICKS {
            controller.step();
        }
    });
    assert_eq!(counter(&entries, name, &[]), 0);
}

#[test]
fn io_token_balances_are_gauges_per_class_infinite_while_unlimited() {
    use admission::TokenQueues;

    let balances = |entries: &[Entry]| {
        let of = |class: &str| {
            gauge(
                entries,
                "admission_io_tokens_available",
                &[("class", class), ("queue", "io")],
            )
        };
        (of("regular"), of("elastic"))
    };
    let ((), unlimited) = recorded(|| {
        let queues =
            TokenQueues::with_builder(WorkQueue::builder().name("io"), 1_000, 500).unwrap();
        queues.record_metrics();
    });
    let infinite = Some(f64::INFINITY);
    assert_eq!(balances(&unlimited), (infinite, infinite));

    let (expected, limited) = recorded(|| {
        let queues =
            TokenQueues::with_builder(WorkQueue::builder().name("io"), 1_000, 500).unwrap();
        queues.set_limits(Some(1_000), Some(500)).unwrap();
        queues.add_tokens(300, 200);
        queues.record_metrics();
        // The gauges mirror the granters' own snapshots.
        let available = |queue: &WorkQueue<admission::grant::TokenGranter>| {
            Some(queue.granter_snapshot().available as f64)
        };
        (available(queues.regular()), available(queues.elastic()))
    });
    assert_eq!(expected.0, Some(300.0));
    assert_eq!(balances(&limited), expected);
}

#[tokio::test]
async fn a_gpu_ledger_report_becomes_gauges_per_device() {
    let service = gpu_service();
    let report = gpu_ledger_report_of(&service);
    let ((), entries) = recorded(|| service.record_metrics());
    let on_device = |name: &str| gauge(&entries, name, &[("device", "3")]);
    let cache = report.cache_evictable_bytes + report.cache_pinned_bytes;
    assert_eq!(on_device("admission_gpu_managed_bytes"), Some(80e9));
    assert_eq!(
        on_device("admission_gpu_granted_bytes"),
        Some(report.live_grants_bytes as f64)
    );
    assert_eq!(on_device("admission_gpu_cache_bytes"), Some(cache as f64));
    assert_eq!(
        on_device("admission_gpu_active_attempts"),
        Some(f64::from(report.active_attempts))
    );
}

/// Runs `command` with `input` on its standard input; `None` if it cannot
/// be started (not installed).
fn run_with_stdin(command: &mut Command, input: &str) -> Option<std::process::Output> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    Some(child.wait_with_output().unwrap())
}

/// A recorder that panics on every call: the application's code at its
/// worst.
struct PanickingRecorder;

impl metrics::Recorder for PanickingRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
        panic!("recorder down")
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
        panic!("recorder down")
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
        panic!("recorder down")
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        panic!("recorder down")
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        panic!("recorder down")
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        panic!("recorder down")
    }
}

#[test]
fn a_panicking_recorder_loses_its_recordings_and_nothing_else() {
    let before = admission::export::recorder_panics();
    let queue = WorkQueue::builder()
        .total_slots(1)
        .max_waiters(2)
        .build()
        .unwrap();
    metrics::with_local_recorder(&PanickingRecorder, || {
        paused_runtime().block_on(async {
            let t0 = Instant::now();
            admission::export::describe();
            // Admitted at once, granted after a wait, cancelled, refused:
            // every way a request settles records through the recorder.
            let held = admit_now(&queue, work(1, 0, t0, 0));
            let mut later = vec![("later", enqueue(&queue, work(1, 0, t0, 1)))];
            let cancelled = enqueue(&queue, work(1, 0, t0, 2));
            let full = queue.admit(work(1, 0, t0, 3)).await;
            assert_eq!(full.unwrap_err(), AdmitError::QueueFull { max_waiters: 2 });
            queue.record_metrics();
            drop(cancelled);
            drop(held);
            let permits = granted(&mut later);
            assert_eq!(queue.snapshot().granter.used, 1);
            drop(permits);
        });
    });
    let snapshot = queue.snapshot();
    assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
    // describe (its first call), two admissions, a cancellation, a
    // refusal, the levels: each caught.
    assert!(admission::export::recorder_panics() - before >= 6);
}
