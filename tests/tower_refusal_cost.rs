//! A refusal must be cheap: an unpaced client that ignores `Retry-After`
//! sends again at once, so under overload the server's CPU goes to
//! refusals. The queue's refusal allocates nothing (counting it in the
//! `metrics` facade included) and opens no span.
//! (`examples/refusal_cost.rs` measures the whole HTTP path.)
//!
//! One test in this binary: the allocation count is global to the process.

use futures::FutureExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::Layer;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Counts the spans opened.
#[derive(Clone, Default)]
struct Spans(Arc<AtomicUsize>);

impl<S: Subscriber> Layer<S> for Spans {
    fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: LayerContext<'_, S>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The fewest allocations `f` made in three tries. The count is global to
/// the process, so a stray allocation elsewhere (the test harness's own
/// threads) can land in one try; an allocation per call lands in all.
fn fewest_allocations(mut f: impl FnMut()) -> usize {
    (0..3)
        .map(|_| {
            let region = Region::new(GLOBAL);
            f();
            region.change().allocations
        })
        .min()
        .unwrap_or_default()
}

#[test]
fn a_refusal_allocates_nothing_and_opens_no_span() {
    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(1)
        .build()
        .unwrap();
    let work = WorkInfo::new(TenantId::new(7), Priority::NORMAL);
    // One waiter takes the only waiting place; it is the one span.
    let mut waiter = Box::pin(queue.admit(work.clone()));
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    tracing::subscriber::with_default(subscriber, || {
        assert!(waiter.as_mut().now_or_never().is_none());
        for _ in 0..100 {
            let refused = queue.admit(work.clone()).now_or_never();
            assert!(matches!(refused, Some(Err(AdmitError::QueueFull { .. }))));
        }
    });
    assert_eq!(spans.0.load(Ordering::Relaxed), 1, "the waiter's span only");

    // Warmed up (the per-priority counters exist): measure.
    let allocations = fewest_allocations(|| {
        for _ in 0..1_000 {
            let refused = queue.admit(work.clone()).now_or_never();
            assert!(matches!(refused, Some(Err(AdmitError::QueueFull { .. }))));
        }
    });
    // The queue's refusal allocates nothing, counted or not: with the
    // `metrics` feature the queue keeps the counter's key (whose labels are
    // not literals, so the facade's macro would build a vector of them on
    // every call).
    assert_eq!(allocations, 0);
    drop(waiter);

    // axum clones the layered service, classifier included, for every
    // request: a clone must not copy the route table.
    #[cfg(feature = "tower")]
    {
        let classifier = admission::tower::HttpClassifier::new()
            .route("/high", Priority::USER_HIGH)
            .route("/bulk", Priority::BULK_NORMAL)
            .reserve_tenant(TenantId::new(5));
        let region = Region::new(GLOBAL);
        for _ in 0..100 {
            std::hint::black_box(classifier.clone());
        }
        assert_eq!(region.change().allocations, 0);
    }

    #[cfg(feature = "tower")]
    http_refusal_allocates_only_its_header_map();
}

/// The HTTP mode's refusal, from `call` to the response: the classifier,
/// the queue's decision and the answer with its `Retry-After` and reason
/// headers. Its only allocations are the response's header map (a table of
/// indices and one of entries, allocated by the first insert into any
/// `http::HeaderMap`): the header names are constants and `Retry-After`
/// values up to a minute are static strings.
#[cfg(feature = "tower")]
fn http_refusal_allocates_only_its_header_map() {
    use admission::tower::{AdmissionLayer, HttpClassifier};
    use http::{Request, Response};
    use std::time::Duration;
    use tower::{service_fn, Layer, Service};

    /// What one `http::HeaderMap` allocates when its first header goes in.
    const HEADER_MAP: usize = 2;

    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(1)
        .build()
        .unwrap();
    let mut waiter = Box::pin(queue.admit(WorkInfo::new(TenantId::new(7), Priority::NORMAL)));
    assert!(waiter.as_mut().now_or_never().is_none());
    let inner =
        service_fn(|_: Request<()>| async { Ok::<_, std::convert::Infallible>(Response::new(())) });
    let classifier = HttpClassifier::new()
        .default_timeout(Duration::from_secs(30))
        .unwrap();
    let mut service = AdmissionLayer::new(queue, classifier)
        .http()
        .pace_refusals(Duration::ZERO)
        .layer(inner);
    let grpc = || {
        Request::post("/")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    };
    let mut refuse = |request: Request<()>| {
        let response = service.call(request).now_or_never();
        response.expect("refused at once").expect("infallible")
    };
    // Warm up, and check what is measured is a refusal with its headers.
    let refused = refuse(Request::new(()));
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["x-admission-reason"], "queue_full");

    let allocations = fewest_allocations(|| {
        for _ in 0..1_000 {
            std::hint::black_box(refuse(Request::new(())));
        }
    });
    let per_refusal = HEADER_MAP;
    assert_eq!(allocations, 1_000 * per_refusal);

    // A gRPC refusal adds `grpc-retry-pushback-ms`, any number of
    // milliseconds, whose bytes are copied into the header value: one
    // allocation more.
    let refused = refuse(grpc());
    assert_eq!(refused.headers()["grpc-status"], "14");
    let mut tries: Vec<Vec<_>> = (0..3)
        .map(|_| (0..1_000).map(|_| grpc()).collect())
        .collect();
    let allocations = fewest_allocations(|| {
        for request in tries.pop().unwrap_or_default() {
            std::hint::black_box(refuse(request));
        }
    });
    assert_eq!(allocations, 1_000 * (per_refusal + 1));
    drop(waiter);
}
