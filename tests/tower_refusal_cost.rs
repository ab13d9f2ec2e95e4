//! A refusal must be cheap: an unpaced client that ignores `Retry-After`
//! sends again at once, so under overload the server's CPU goes to
//! refusals. The queue's refusal allocates nothing (beyond what the
//! `metrics` facade does to count it) and opens no span.
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
    let region = Region::new(GLOBAL);
    for _ in 0..1_000 {
        let refused = queue.admit(work.clone()).now_or_never();
        assert!(matches!(refused, Some(Err(AdmitError::QueueFull { .. }))));
    }
    // The queue's own refusal allocates nothing. With the `metrics` feature
    // the facade builds a key for the counter on every call, and a key with
    // labels that are not literals owns a vector of them: one allocation.
    let per_refusal = usize::from(cfg!(feature = "metrics"));
    assert_eq!(region.change().allocations, 1_000 * per_refusal);
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
}
