//! What admission tells `tracing`: a span per wait that records tenant,
//! priority, outcome and wait time, and an event for every rejection.

mod common;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use common::*;
use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

type FieldMap = BTreeMap<String, String>;

/// Collects closed spans and events with their fields.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<BTreeMap<u64, (String, Fields)>>>,
    closed: Arc<Mutex<Vec<(String, FieldMap)>>>,
    events: Arc<Mutex<Vec<FieldMap>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let name = attrs.metadata().name().to_owned();
        self.spans
            .lock()
            .unwrap()
            .insert(id.into_u64(), (name, fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some((_, fields)) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(fields);
        }
    }
    fn on_event(&self, event: &Event<'_>, context: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        // The span the event happened in: the one entered at the time.
        if let Some(span) = context.event_span(event) {
            fields
                .0
                .insert("in_span".to_owned(), span.name().to_owned());
        }
        fields
            .0
            .insert("target".to_owned(), event.metadata().target().to_owned());
        self.events.lock().unwrap().push(fields.0);
    }
    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some((name, fields)) = self.spans.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push((name, fields.0));
        }
    }
}

#[test]
fn each_wait_is_a_span_with_tenant_priority_outcome_and_wait_time() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let runtime = paused_runtime();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let t0 = Instant::now();
            let queue = WorkQueue::builder()
                .total_slots(1)
                .max_waiters(1)
                .build()
                .unwrap();
            let held = admit_now(&queue, work(1, 0, t0, 0));
            let mut waiter = enqueue(&queue, work(7, 50, t0, 1));
            // The fast path opens no span: only waiting is traced.
            assert!(capture.closed.lock().unwrap().is_empty());

            // A rejection (the queue holds its one waiter) is an event.
            let full = queue.admit(work(8, 0, t0, 2)).await;
            assert_eq!(full.unwrap_err(), AdmitError::QueueFull { max_waiters: 1 });

            tokio::time::advance(Duration::from_millis(3)).await;
            drop(held);
            let permit = try_settle(&mut waiter).unwrap().unwrap();
            drop(waiter);
            drop(permit);

            // A deadline expiry is recorded on the span as its outcome.
            let blocker = admit_now(&queue, work(1, 0, t0, 3));
            let late = WorkInfo::builder()
                .tenant(TenantId::new(9))
                .priority(Priority::BULK_NORMAL)
                .timeout(Duration::from_millis(5))
                .build();
            let expired = queue.admit(late).await;
            assert!(matches!(expired, Err(AdmitError::DeadlineExceeded { .. })));
            drop(blocker);
        });
    });

    let closed = capture.closed.lock().unwrap();
    let waits: Vec<&FieldMap> = closed
        .iter()
        .filter(|(name, _)| name == "admission_wait")
        .map(|(_, fields)| fields)
        .collect();
    assert_eq!(waits.len(), 2, "{closed:?}");
    assert_eq!(waits[0]["tenant"], "7");
    assert_eq!(waits[0]["priority"], "user-high");
    assert_eq!(waits[0]["outcome"], "admitted");
    assert_eq!(waits[0]["wait_us"], "3000");
    assert_eq!(waits[1]["tenant"], "9");
    assert_eq!(waits[1]["priority"], "bulk-normal");
    // The metric's short reason, not a sentence, and the wait on a refusal
    // too: it waited out its 5 ms deadline.
    assert_eq!(waits[1]["outcome"], "deadline_exceeded", "{:?}", waits[1]);
    assert_eq!(waits[1]["wait_us"], "5000");

    let events = capture.events.lock().unwrap();
    let rejection = events
        .iter()
        .find(|fields| fields.get("error").is_some_and(|e| e.contains("full")))
        .expect("a rejection event");
    assert_eq!(rejection["tenant"], "8");
    let expiry = events
        .iter()
        .find(|fields| {
            fields
                .get("message")
                .is_some_and(|m| m.contains("deadline expired while waiting"))
        })
        .expect("an expiry event");
    assert_eq!(
        expiry.get("in_span").map(String::as_str),
        Some("admission_wait"),
        "the wait's span is entered while its future is polled"
    );
}

#[test]
fn a_cancelled_wait_records_its_outcome_and_wait_time() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let runtime = paused_runtime();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let t0 = Instant::now();
            let queue = WorkQueue::new(1).unwrap();
            let _held = admit_now(&queue, work(1, 0, t0, 0));
            let waiter = enqueue(&queue, work(2, 0, t0, 1));
            tokio::time::advance(Duration::from_millis(7)).await;
            drop(waiter);
        });
    });
    let closed = capture.closed.lock().unwrap();
    let (_, wait) = closed
        .iter()
        .find(|(name, _)| name == "admission_wait")
        .expect("the wait's span");
    assert_eq!(wait["outcome"], "cancelled");
    assert_eq!(wait["wait_us"], "7000");
}

/// Every IO interval is one event that carries the listener's inputs (L0
/// shape, bytes added and compacted) and its decision, so an operator can
/// replay why writers were throttled.
#[test]
fn each_io_interval_is_an_event_with_its_inputs_and_decision() {
    use admission::io::{Controller, LsmStats};

    let reading = |sublevels, l0_bytes, flushed| LsmStats {
        l0_files: sublevels,
        l0_sublevels: Some(sublevels),
        l0_bytes,
        flushed_bytes: flushed,
        unflushed_memtables: Some(1),
        ..LsmStats::default()
    };
    let engine = Arc::new(Mutex::new(reading(0, 0, 0)));
    let source = engine.clone();
    let interval = Duration::from_millis(100);
    let controller = Controller::builder(move || *source.lock().unwrap())
        .interval(interval)
        .manual()
        .build()
        .unwrap();
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, || {
        paused_runtime().block_on(async {
            controller.step();
            // 3,000 bytes flushed, 1,000 still in L0: 2,000 compacted; ten
            // sub-levels of twenty is a score of 1.
            *engine.lock().unwrap() = reading(10, 1_000, 3_000);
            tokio::time::advance(interval).await;
            controller.step();
        });
    });

    let events = capture.events.lock().unwrap();
    let intervals: Vec<&FieldMap> = events
        .iter()
        .filter(|fields| {
            fields.get("message").map(String::as_str) == Some("IO tokens for the next interval")
        })
        .collect();
    // The first interval has no history, so it is logged too, unlimited.
    assert_eq!(intervals.len(), 2, "{events:?}");
    assert_eq!(intervals[0]["regular"], "Unlimited");
    assert_eq!(intervals[0]["elastic"], "Unlimited");
    let decided = intervals[1];
    for (field, value) in [
        ("target", "admission::io"),
        ("l0_files", "10"),
        ("l0_sublevels", "10"),
        ("l0_bytes", "1000"),
        ("unflushed_memtables", "1"),
        ("added", "3000"),
        ("compacted", "2000"),
        ("smoothed_compacted", "2000"),
        ("score", "1.0"),
        ("regular", "Limited(2000)"),
        ("elastic", "Limited(500)"),
    ] {
        assert_eq!(
            decided.get(field).map(String::as_str),
            Some(value),
            "{field}: {decided:?}"
        );
    }
}

/// A subscriber layer that panics whenever a span records a field: the
/// application's code at its worst, called where a wait settles.
struct PanicsOnRecord;

impl<S: Subscriber> Layer<S> for PanicsOnRecord {
    fn on_record(&self, _: &Id, _: &Record<'_>, _: Context<'_, S>) {
        panic!("subscriber down")
    }
}

#[test]
fn a_subscriber_panicking_as_a_wait_settles_loses_no_slot_and_no_place() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let subscriber = tracing_subscriber::registry().with(PanicsOnRecord);
    let queue = WorkQueue::new(1).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        paused_runtime().block_on(async {
            let t0 = Instant::now();
            let held = admit_now(&queue, work(1, 0, t0, 0));
            let mut granted_later = enqueue(&queue, work(1, 0, t0, 1));
            let cancelled = enqueue(&queue, work(1, 0, t0, 2));
            // The waiter's outcome is recorded in its span as it leaves.
            assert!(catch_unwind(AssertUnwindSafe(|| drop(cancelled))).is_err());
            assert_eq!(queue.waiting(), 1, "the cancelled waiter left the queue");
            drop(held);
            // The grant is recorded in its span as it is observed.
            assert!(catch_unwind(AssertUnwindSafe(|| granted_later.poll())).is_err());
        });
    });
    let snapshot = queue.snapshot();
    assert_eq!(
        (snapshot.granter.used, snapshot.waiting),
        (0, 0),
        "the permit made before the panic returned the slot as it unwound"
    );
}

/// A subscriber layer that panics whenever a span is created: here, the
/// span a wait opens as it begins.
struct PanicsOnNewSpan;

impl<S: Subscriber> Layer<S> for PanicsOnNewSpan {
    fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        panic!("subscriber down")
    }
}

#[test]
fn a_subscriber_panicking_as_a_wait_begins_leaves_no_waiter_behind() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let subscriber = tracing_subscriber::registry().with(PanicsOnNewSpan);
    let queue = WorkQueue::new(1).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        paused_runtime().block_on(async {
            let t0 = Instant::now();
            let held = admit_now(&queue, work(1, 0, t0, 0));
            let mut waiting = tokio_test::task::spawn(queue.admit(work(1, 0, t0, 1)));
            // The request is in the queue when the span is made, and the
            // span's panic unwinds through the poll.
            assert!(catch_unwind(AssertUnwindSafe(|| waiting.poll())).is_err());
            drop(waiting);
            assert_eq!(queue.waiting(), 0, "the dropped request left the queue");
            drop(held);
        });
    });
    let snapshot = queue.snapshot();
    assert_eq!(
        (snapshot.granter.used, snapshot.waiting),
        (0, 0),
        "no slot went to a request nobody polls"
    );
}

/// A subscriber layer that panics on the event of a waiter expiring in
/// the grant loop, where other waiters may already have been granted.
struct PanicsOnExpiry;

impl<S: Subscriber> Layer<S> for PanicsOnExpiry {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields
            .0
            .get("message")
            .is_some_and(|m| m.contains("expired"))
        {
            panic!("subscriber down")
        }
    }
}

#[test]
fn a_subscriber_panicking_on_an_expiry_in_the_grant_loop_stops_no_grant() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let subscriber = tracing_subscriber::registry().with(PanicsOnExpiry);
    let queue = WorkQueue::new(1).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        paused_runtime().block_on(async {
            let t0 = Instant::now();
            let held = admit_now(&queue, work(1, 0, t0, 0));
            // In line, highest priority first: one granted before the
            // expiry, one after it.
            let mut before = enqueue(&queue, work(1, 10, t0, 1));
            // A deadline that passes while it waits unpolled: the grant
            // loop expires it, and the subscriber panics on that event.
            let expiring = WorkInfo::builder()
                .tenant(TenantId::new(1))
                .priority(Priority::new(5))
                .create_time(t0)
                .deadline(t0 + Duration::from_millis(5))
                .build();
            let expiring = enqueue(&queue, expiring);
            let mut after = enqueue(&queue, work(1, 0, t0, 2));
            tokio::time::advance(Duration::from_millis(10)).await;
            // Two slots more: both live waiters get one. The event is
            // logged once the lock is released and the waiters woken, and
            // its panic is dropped there: it stops no grant, and does not
            // unwind through the caller, who may still have to act on what
            // the queue decided.
            let raised = catch_unwind(AssertUnwindSafe(|| queue.set_total_slots(3)));
            assert!(matches!(raised, Ok(Ok(()))), "{raised:?}");
            assert!(before.is_woken() && after.is_woken());
            let first = try_settle(&mut before).expect("granted").unwrap();
            let second = try_settle(&mut after).expect("granted").unwrap();
            drop((first, second, held, expiring));
        });
    });
    let snapshot = queue.snapshot();
    assert_eq!((snapshot.granter.used, snapshot.waiting), (0, 0));
}
