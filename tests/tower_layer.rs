//! Admission as tower middleware: requests wait for a slot, hold it while
//! the inner service runs, and give it back on every path.

#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use admission::tower::{AdmissionError, AdmissionLayer};
use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use tokio::sync::oneshot;
use tower::{service_fn, Layer, Service, ServiceExt};

/// Requests are (tenant, priority); the classifier reads them.
fn classify(request: &(u64, i8)) -> WorkInfo {
    WorkInfo::new(TenantId::new(request.0), Priority::new(request.1))
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(std::task::Waker::noop()))
}

#[tokio::test(start_paused = true)]
async fn a_request_holds_its_slot_while_the_inner_service_runs() {
    let queue = WorkQueue::new(1).unwrap();
    let seen = queue.clone();
    let inner = service_fn(move |request: (u64, i8)| {
        let slots = seen.snapshot().granter;
        async move { Ok::<_, Infallible>((request, slots.used)) }
    });
    let service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    let (request, used_inside) = service.oneshot((7, 50)).await.unwrap();
    assert_eq!((request, used_inside), ((7, 50), 1));
    let snapshot = queue.snapshot();
    assert_eq!(snapshot.granter.used, 0, "returned after the response");
    assert_eq!(snapshot.priority(Priority::USER_HIGH).unwrap().admitted, 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_request_never_reaches_the_inner_service() {
    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(1)
        .build()
        .unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let inner = service_fn(move |_: (u64, i8)| {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async { Ok::<_, Infallible>(()) }
    });
    let mut service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    // One request fills the queue's only waiting place; the next is refused.
    let mut waiting = Box::pin(service.ready().await.unwrap().call((1, 0)));
    assert!(poll_once(&mut waiting).is_pending());
    let refused = service.ready().await.unwrap().call((2, 0)).await;
    match refused {
        Err(AdmissionError::Rejected(AdmitError::QueueFull { max_waiters: 1 })) => {}
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 0);
    drop(waiting);
    assert_eq!(queue.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_future_mid_call_returns_the_slot() {
    let queue = WorkQueue::new(1).unwrap();
    let (_never, pending) = oneshot::channel::<()>();
    let pending = std::sync::Arc::new(tokio::sync::Mutex::new(Some(pending)));
    let inner = service_fn(move |_: (u64, i8)| {
        let pending = pending.clone();
        async move {
            let receiver = pending.lock().await.take().unwrap();
            let _ = receiver.await;
            Ok::<_, Infallible>(())
        }
    });
    let mut service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    let mut call = Box::pin(service.ready().await.unwrap().call((1, 0)));
    assert!(poll_once(&mut call).is_pending());
    assert_eq!(queue.snapshot().granter.used, 1, "admitted and running");
    drop(call);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn an_inner_error_is_passed_through_and_the_slot_returned() {
    let queue = WorkQueue::new(1).unwrap();
    let inner = service_fn(|_: (u64, i8)| async { Err::<(), _>(std::io::Error::other("boom")) });
    let service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    match service.oneshot((1, 0)).await {
        Err(AdmissionError::Inner(error)) => assert_eq!(error.to_string(), "boom"),
        other => panic!("expected the inner error, got {other:?}"),
    }
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn waiting_requests_are_served_by_priority() {
    let queue = WorkQueue::new(1).unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = order.clone();
    let inner = service_fn(move |request: (u64, i8)| {
        log.lock().unwrap().push(request.1);
        async { Ok::<_, Infallible>(()) }
    });
    let mut service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    let held = queue.admit(classify(&(9, 0))).await.unwrap();
    let mut calls: Vec<_> = [-30i8, 50, 0]
        .into_iter()
        .map(|priority| Some(Box::pin(service.call((1, priority)))))
        .collect();
    for call in calls.iter_mut().flatten() {
        assert!(poll_once(call).is_pending());
    }
    drop(held);
    for _ in 0..3 {
        for slot in &mut calls {
            if slot.as_mut().is_some_and(|call| poll_once(call).is_ready()) {
                *slot = None;
            }
        }
    }
    assert!(calls.iter().all(Option::is_none));
    assert_eq!(*order.lock().unwrap(), [50, 0, -30]);
}

/// Two services in a chain, in process: the front service admits an HTTP
/// request classified from its headers and, while handling it, calls the
/// back service through `PropagateLayer`; the back service classifies the
/// headers it receives. The class must survive the hop, and the deadline
/// must shrink, not grow.
#[tokio::test(start_paused = true)]
async fn priority_tenant_and_deadline_propagate_through_two_chained_services() {
    use admission::tower::{current_work, HttpClassifier, PropagateLayer};
    use http::Request;
    use std::time::Duration;

    let back_queue = WorkQueue::new(4).unwrap();
    let back = AdmissionLayer::new(back_queue.clone(), {
        let classifier = HttpClassifier::new().trust_all();
        move |request: &Request<()>| classifier.classify(request)
    })
    .layer(service_fn(|_request: Request<()>| async move {
        Ok::<_, Infallible>(current_work().expect("admitted work is current"))
    }));
    let back = PropagateLayer.layer(back);

    let front_queue = WorkQueue::new(4).unwrap();
    let front = AdmissionLayer::new(front_queue, {
        let classifier = HttpClassifier::new().trust_all();
        move |request: &Request<()>| classifier.classify(request)
    })
    .layer(service_fn(move |_request: Request<()>| {
        let back = back.clone();
        async move {
            let here = current_work().expect("admitted work is current");
            tokio::time::advance(Duration::from_millis(3)).await;
            let there = back
                .oneshot(Request::new(()))
                .await
                .map_err(|error| format!("{error}"))?;
            Ok::<_, String>((here, there))
        }
    }));

    let request = Request::builder()
        .header("x-admission-tenant", "42")
        .header("x-admission-priority", "user-low")
        .header("grpc-timeout", "20m")
        .body(())
        .unwrap();
    let (here, there) = front.oneshot(request).await.unwrap();
    assert_eq!(
        (here.tenant(), here.priority()),
        (TenantId::new(42), Priority::USER_LOW)
    );
    assert_eq!(
        (there.tenant(), there.priority()),
        (TenantId::new(42), Priority::USER_LOW)
    );
    let left = there.deadline().unwrap() - there.create_time();
    assert_eq!(
        left,
        Duration::from_millis(17),
        "20 ms less the 3 ms spent upstream"
    );
    assert_eq!(
        back_queue
            .snapshot()
            .priority(Priority::USER_LOW)
            .unwrap()
            .admitted,
        1
    );
}

#[tokio::test]
async fn outside_an_admitted_request_there_is_no_current_work() {
    assert!(admission::tower::current_work().is_none());
}

/// An inner service whose readiness is switched from outside.
#[derive(Clone)]
struct Gate(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Service<(u64, i8)> for Gate {
    type Response = ();
    type Error = Infallible;
    type Future = std::future::Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.0.load(std::sync::atomic::Ordering::Relaxed) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _: (u64, i8)) -> Self::Future {
        std::future::ready(Ok(()))
    }
}

/// The documented readiness: the inner service's, whatever the queue's
/// state, so back-pressure from admission shows per request, not in
/// `poll_ready`.
#[tokio::test(start_paused = true)]
async fn readiness_is_the_inner_services_not_the_queues() {
    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(1)
        .build()
        .unwrap();
    let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut service = AdmissionLayer::new(queue.clone(), classify).layer(Gate(open.clone()));
    let mut cx = Context::from_waker(std::task::Waker::noop());

    // No slot at all, and the one waiting place taken: still ready.
    let mut waiter = Box::pin(service.call((1, 0)));
    assert!(poll_once(&mut waiter).is_pending());
    assert_eq!(queue.waiting(), 1);
    assert!(matches!(service.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let mut refused = Box::pin(service.call((2, 0)));
    assert!(matches!(
        poll_once(&mut refused),
        Poll::Ready(Err(AdmissionError::Rejected(AdmitError::QueueFull { .. })))
    ));

    // The inner service not ready: neither is the layer, whatever the
    // queue holds.
    open.store(false, std::sync::atomic::Ordering::Relaxed);
    drop(waiter);
    assert_eq!(queue.waiting(), 0);
    assert!(service.poll_ready(&mut cx).is_pending());
}

/// A handler behind the layer gives its slot back while it waits (another
/// request is admitted on it meanwhile), holds one again after the wait,
/// and the layer returns that one when the response completes.
#[tokio::test(start_paused = true)]
async fn a_handler_gives_its_slot_back_during_a_wait_and_gets_it_again() {
    let queue = WorkQueue::new(1).unwrap();
    let seen = queue.clone();
    let (answer, answered) = oneshot::channel::<u32>();
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Some(answered)));
    let inner = service_fn(move |request: (u64, i8)| {
        let (seen, answered) = (seen.clone(), answered.clone());
        async move {
            if request.0 != 1 {
                // The other request: admitted while the first one waits.
                return Ok::<_, Infallible>((0, seen.snapshot().granter.used));
            }
            let wait = answered.lock().unwrap().take().unwrap();
            let (value, admitted) = admission::tower::release_during(wait).await;
            admitted.unwrap();
            Ok((value.unwrap(), seen.snapshot().granter.used))
        }
    });
    let mut service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    let mut first = Box::pin(service.ready().await.unwrap().call((1, 0)));
    assert!(poll_once(&mut first).is_pending());
    assert_eq!(queue.snapshot().granter.used, 0, "free during the wait");

    let (other, used_by_other) = service.ready().await.unwrap().call((2, 0)).await.unwrap();
    assert_eq!((other, used_by_other), (0, 1));

    answer.send(42).unwrap();
    let (value, used_after_the_wait) = first.await.unwrap();
    assert_eq!((value, used_after_the_wait), (42, 1));
    let snapshot = queue.snapshot();
    assert_eq!(snapshot.granter.used, 0, "returned after the response");
    // Three admissions: the first, the other request's, the first's again.
    assert_eq!(snapshot.priority(Priority::NORMAL).unwrap().admitted, 3);
}

/// Refused after its wait (its deadline passed), a handler gets the wait's
/// output and the refusal, and the request holds no slot any more; a
/// response future dropped during the wait loses nothing.
#[tokio::test(start_paused = true)]
async fn a_refusal_after_the_wait_and_drops_around_it_lose_nothing() {
    use std::time::Duration;
    let queue = WorkQueue::new(1).unwrap();
    let seen = queue.clone();
    let with_deadline = |request: &(u64, i8)| {
        WorkInfo::builder()
            .tenant(TenantId::new(request.0))
            .priority(Priority::new(request.1))
            .timeout(Duration::from_millis(10))
            .build()
    };
    let inner = service_fn(move |request: (u64, i8)| {
        let seen = seen.clone();
        async move {
            let wait_ms = if request.0 == 1 { 20 } else { 1_000_000 };
            let (slept, admitted) = admission::tower::release_during(tokio::time::sleep(
                Duration::from_millis(wait_ms),
            ))
            .await;
            Ok::<_, Infallible>((slept, admitted, seen.snapshot().granter.used))
        }
    });
    let mut service = AdmissionLayer::new(queue.clone(), with_deadline).layer(inner);
    let ((), admitted, used) = service.ready().await.unwrap().call((1, 0)).await.unwrap();
    assert!(
        matches!(admitted, Err(AdmitError::DeadlinePassed)),
        "{admitted:?}"
    );
    assert_eq!(used, 0);
    assert_eq!(queue.snapshot().granter.used, 0);

    let mut waiting = Box::pin(service.ready().await.unwrap().call((2, 0)));
    assert!(poll_once(&mut waiting).is_pending());
    assert_eq!(queue.snapshot().granter.used, 0);
    drop(waiting);
    assert_eq!(queue.snapshot().granter.used, 0);
    assert_eq!(queue.waiting(), 0);
}

/// A long handler behind the layer offers its slot between chunks: kept
/// while nobody of higher priority waits, taken by urgent work when some
/// does, and held again (then returned by the layer) after it. Each chunk
/// yields once, which keeps the slot, so the test decides when chunks end.
#[tokio::test(start_paused = true)]
async fn a_long_handler_gives_way_to_urgent_work_between_chunks() {
    let queue = WorkQueue::new(1).unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = order.clone();
    let inner = service_fn(move |request: (u64, i8)| {
        let order = seen.clone();
        async move {
            if request.1 > 0 {
                order.lock().unwrap().push("urgent".to_string());
                return Ok::<_, Infallible>(());
            }
            for chunk in 0..3 {
                tokio::task::yield_now().await;
                order.lock().unwrap().push(format!("export {chunk}"));
                admission::tower::give_way().await.unwrap();
            }
            Ok(())
        }
    });
    let service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    let mut export = Box::pin(service.clone().oneshot((1, -30)));
    assert!(poll_once(&mut export).is_pending(), "chunk 0 yields");
    tokio::task::yield_now().await;
    assert!(poll_once(&mut export).is_pending(), "chunk 1 yields");
    assert_eq!(queue.snapshot().granter.used, 1);
    let mut urgent = Box::pin(service.clone().oneshot((2, 50)));
    assert!(
        poll_once(&mut urgent).is_pending(),
        "the export holds the slot"
    );
    tokio::task::yield_now().await;
    assert!(poll_once(&mut urgent).is_pending(), "a yield keeps it");
    // Chunk 1 ends and gives way.
    assert!(poll_once(&mut export).is_pending());
    assert!(poll_once(&mut urgent).is_ready());
    while poll_once(&mut export).is_pending() {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["export 0", "export 1", "urgent", "export 2"]
    );
    assert_eq!(
        queue.snapshot().granter.used,
        0,
        "returned after the response"
    );
    // Outside a request the layer admitted there is nothing to offer.
    admission::tower::give_way().await.unwrap();
}

/// Outside a request the layer admitted there is nothing to give back: the
/// wait runs and comes back with `Ok`.
#[tokio::test]
async fn release_during_outside_the_layer_just_waits() {
    let (value, admitted) = admission::tower::release_during(async { 7 }).await;
    assert_eq!(value, 7);
    assert!(admitted.is_ok());
}

/// A handler whose computation is done gives its slot back for good: the
/// rest of its call (here, a wait) holds none, and the response completes
/// without asking again.
#[tokio::test(start_paused = true)]
async fn a_handler_left_only_with_waiting_gives_its_slot_back_for_good() {
    let queue = WorkQueue::new(1).unwrap();
    let seen = queue.clone();
    let (go_on, resumed) = oneshot::channel::<()>();
    let resumed = std::sync::Arc::new(std::sync::Mutex::new(Some(resumed)));
    let inner = service_fn(move |_: (u64, i8)| {
        let (seen, resumed) = (seen.clone(), resumed.clone());
        async move {
            let held_before = seen.snapshot().granter.used;
            let released = admission::tower::release_slot();
            let released_again = admission::tower::release_slot();
            let wait = resumed.lock().unwrap().take().unwrap();
            let _ = wait.await;
            Ok::<_, Infallible>((held_before, released, released_again))
        }
    });
    let mut service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    let mut call = Box::pin(service.ready().await.unwrap().call((1, 0)));
    assert!(poll_once(&mut call).is_pending());
    assert_eq!(
        queue.snapshot().granter.used,
        0,
        "nothing held while it waits"
    );
    go_on.send(()).unwrap();
    assert_eq!(call.await.unwrap(), (1, true, false));
    let snapshot = queue.snapshot();
    assert_eq!(snapshot.granter.used, 0);
    assert_eq!(snapshot.priority(Priority::NORMAL).unwrap().admitted, 1);
    assert!(!admission::tower::release_slot(), "outside the layer");
}
