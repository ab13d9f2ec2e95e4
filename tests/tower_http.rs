//! The HTTP mode of the layer: refusals become responses, the inner error
//! type is kept, the layer owns its controller, and it composes with axum
//! and with tower's own middleware.

#![cfg(feature = "tower")]

use std::time::Duration;

use admission::cpu::Controller;
use admission::tower::{
    current_work, AdmissionError, AdmissionLayer, HttpClassifier, RefusalPolicy, REASON_HEADER,
};
use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tower::{service_fn, BoxError, Layer, ServiceBuilder, ServiceExt};
use tracing_subscriber::layer::SubscriberExt;

fn get_request(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// A queue with no slots whose one waiting place is taken: every request
/// is refused as `queue_full`, at once, while the returned waiter lives.
fn refusing_queue() -> (WorkQueue, tokio_test::task::Spawn<admission::Admit>) {
    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(1)
        .build()
        .unwrap();
    let mut waiter =
        tokio_test::task::spawn(queue.admit(WorkInfo::new(Default::default(), Priority::NORMAL)));
    assert!(waiter.poll().is_pending());
    (queue, waiter)
}

#[tokio::test(start_paused = true)]
async fn axum_router_layer_takes_the_http_mode_as_it_is_and_refusals_are_503() {
    let (queue, _waiter) = refusing_queue();
    let layer = AdmissionLayer::new(queue, HttpClassifier::new()).http();
    let app = Router::new()
        .route("/", get(|| async { "served" }))
        .layer(layer);
    let response = app.oneshot(get_request("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[REASON_HEADER], "queue_full");
    assert_eq!(response.headers()["retry-after"], "1");
}

/// As the module docs say: `route_layer` leaves the 404 fallback outside
/// admission, `layer` queues it too.
#[tokio::test(start_paused = true)]
async fn route_layer_leaves_unknown_paths_outside_admission_and_layer_does_not() {
    let (queue, _waiter) = refusing_queue();
    let layer = AdmissionLayer::new(queue, HttpClassifier::new()).http();
    let routes = || Router::new().route("/", get(|| async { "served" }));
    let status = |app: Router, path: &'static str| async move {
        app.oneshot(get_request(path)).await.unwrap().status()
    };
    let route_layered = routes().route_layer(layer.clone());
    assert_eq!(
        status(route_layered.clone(), "/").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        status(route_layered, "/nowhere").await,
        StatusCode::NOT_FOUND
    );
    let layered = routes().layer(layer);
    assert_eq!(
        status(layered, "/nowhere").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test(start_paused = true)]
async fn the_refusal_status_may_be_429() {
    let (queue, _waiter) = refusing_queue();
    let layer = AdmissionLayer::new(queue, HttpClassifier::new())
        .http()
        .refusal_status(StatusCode::TOO_MANY_REQUESTS)
        .retry_after(Duration::from_millis(2500));
    let app = Router::new()
        .route("/", get(|| async { "served" }))
        .route_layer(layer);
    let response = app.oneshot(get_request("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "3");
}

#[test]
fn retry_after_comes_from_the_queues_wait_estimate_within_bounds() {
    let refusals = RefusalPolicy::default();
    let retry_after = |error: AdmitError| {
        let response: Response<()> = refusals.response(&error);
        let value = response.headers().get("retry-after").cloned();
        (
            response.status(),
            value.map(|v| v.to_str().unwrap().to_owned()),
        )
    };
    let missing = |expected| AdmitError::WouldMissDeadline {
        expected,
        remaining: Duration::from_millis(100),
    };
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    let rows: &[(AdmitError, StatusCode, Option<&str>)] = &[
        (missing(Duration::from_millis(200)), unavailable, Some("1")),
        (missing(Duration::from_millis(4200)), unavailable, Some("5")),
        (missing(Duration::from_secs(3600)), unavailable, Some("60")),
        (missing(Duration::MAX), unavailable, Some("60")),
        (
            AdmitError::QueueFull { max_waiters: 1 },
            unavailable,
            Some("1"),
        ),
        (AdmitError::Closed, unavailable, None),
        (
            AdmitError::DeadlinePassed,
            StatusCode::GATEWAY_TIMEOUT,
            None,
        ),
    ];
    for (error, status, retry) in rows {
        assert_eq!(
            retry_after(error.clone()),
            (*status, retry.map(str::to_owned)),
            "{error}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_inner_error_type_is_kept() {
    let layer = AdmissionLayer::new(WorkQueue::new(1).unwrap(), HttpClassifier::new()).http();
    let service = layer.layer(service_fn(|_: Request<()>| async {
        Err::<Response<()>, _>(std::io::Error::other("boom"))
    }));
    // The error is the inner `io::Error` itself, not a wrapper.
    let error: std::io::Error = service.oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(error.to_string(), "boom");
}

#[tokio::test(start_paused = true)]
async fn a_layer_that_owns_its_controller_keeps_the_queue_open() {
    let controller = Controller::for_runtime(&tokio::runtime::Handle::current())
        .manual()
        .build()
        .unwrap();
    let queue = controller.queue().clone();
    let app = Router::new()
        .route("/", get(|| async { "served" }))
        .route_layer(AdmissionLayer::for_controller(controller, HttpClassifier::new()).http());
    let response = app.clone().oneshot(get_request("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!queue.snapshot().closed);
    // The last service gone, the controller goes with it and closes.
    drop(app);
    assert!(queue.snapshot().closed);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_controller_is_a_503_that_says_closed() {
    let controller = Controller::for_runtime(&tokio::runtime::Handle::current())
        .manual()
        .build()
        .unwrap();
    // The trap: the queue cloned out of a controller that is then dropped.
    let queue = controller.queue().clone();
    drop(controller);
    let app = Router::new()
        .route("/", get(|| async { "served" }))
        .route_layer(AdmissionLayer::new(queue, HttpClassifier::new()).http());
    let warnings = EventCount::at(tracing::Level::WARN);
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    for _ in 0..3 {
        let response = app.clone().oneshot(get_request("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[REASON_HEADER], "closed");
        assert!(response.headers().get("retry-after").is_none());
    }
    assert_eq!(
        warnings.count(),
        1,
        "the closed queue is logged once, not per request"
    );
}

/// Counts events of one level from the `admission` target.
#[derive(Clone)]
struct EventCount(
    tracing::Level,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
);

impl EventCount {
    fn at(level: tracing::Level) -> Self {
        EventCount(level, Default::default())
    }

    fn count(&self) -> usize {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for EventCount {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let metadata = event.metadata();
        if *metadata.level() == self.0 && metadata.target() == "admission" {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// On a runtime without timers a refusal cannot be paced: it is answered
/// at once, and the layer stops trying after the first failure (each try
/// is a panic caught in `timer.rs`, and a logged error).
#[test]
fn without_timers_refusals_are_answered_at_once_and_timers_tried_once() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let errors = EventCount::at(tracing::Level::ERROR);
    let subscriber = tracing_subscriber::registry().with(errors.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    runtime.block_on(async {
        let (queue, _waiter) = refusing_queue();
        let layer = AdmissionLayer::new(queue, HttpClassifier::new()).http();
        let app = Router::new()
            .route("/", get(|| async { "served" }))
            .layer(layer);
        for _ in 0..3 {
            let mut refused = tokio_test::task::spawn(app.clone().oneshot(get_request("/")));
            match refused.poll() {
                std::task::Poll::Ready(response) => {
                    assert_eq!(response.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE)
                }
                std::task::Poll::Pending => panic!("a refusal waited without a timer"),
            }
        }
    });
    assert_eq!(errors.count(), 1, "the timer is tried once per layer");
}

#[tokio::test(start_paused = true)]
async fn the_generic_mode_composes_with_towers_timeout_through_box_error() {
    let (queue, _waiter) = refusing_queue();
    let service = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .layer(AdmissionLayer::new(queue, |_: &u32| {
            WorkInfo::new(Default::default(), Priority::NORMAL)
        }))
        .service(service_fn(|request: u32| async move {
            Ok::<_, BoxError>(request)
        }));
    let error: BoxError = service.oneshot(7).await.unwrap_err();
    match error.downcast_ref::<AdmissionError<BoxError>>() {
        Some(AdmissionError::Rejected(AdmitError::QueueFull { .. })) => {}
        other => panic!("expected the refusal, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_admitted_request_runs_with_its_class_and_returns_its_slot() {
    let queue = WorkQueue::new(1).unwrap();
    let classifier = HttpClassifier::new().route("/bulk", Priority::BULK_NORMAL);
    let app = Router::new()
        .route(
            "/bulk",
            get(|| async { current_work().unwrap().priority().to_string() }),
        )
        .route_layer(AdmissionLayer::new(queue.clone(), classifier).http());
    let response = app.oneshot(get_request("/bulk")).await.unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(&body[..], b"bulk-normal");
    assert_eq!(queue.snapshot().granter.used, 0);
}

/// With the `axum` feature, routes are matched by pattern, so every user
/// id shares the priority of `/users/{id}`.
#[cfg(feature = "axum")]
#[tokio::test(start_paused = true)]
async fn route_priorities_match_axums_route_pattern() {
    let classifier = HttpClassifier::new().route("/users/{id}", Priority::USER_HIGH);
    let app = Router::new()
        .route(
            "/users/{id}",
            get(|| async { current_work().unwrap().priority().to_string() }),
        )
        .layer(AdmissionLayer::new(WorkQueue::new(1).unwrap(), classifier).http());
    let response = app.oneshot(get_request("/users/42")).await.unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(&body[..], b"user-high");
}

/// The case: with a backlog the queue expects to take about 200 ms,
/// a caller asking for 500 ms used to be queued (and, when the estimate was
/// off, answered 504 after waiting it out) while one asking for 100 ms was
/// refused at once. An untrusted caller's deadline is capped at the default
/// timeout, so its long `grpc-timeout` is refused at once too, with a
/// `Retry-After` from the estimate; a trusted caller's is honoured.
#[tokio::test(start_paused = true)]
async fn an_untrusted_long_grpc_timeout_is_refused_early_like_a_short_one() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let queue = WorkQueue::builder()
        .total_slots(1)
        .early_rejection(true)
        .build()
        .unwrap();
    // The backlog belongs to the tenant the callers below are classified
    // as (no tenant header: anonymous), so it is ahead of them in the
    // fair-share order and its wait is theirs.
    let work = || WorkInfo::new(TenantId::ANONYMOUS, Priority::NORMAL);
    let poll = |admit: &mut std::pin::Pin<Box<admission::Admit>>| {
        admit.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    };
    // A steady 100 completions a second, each holding its slot 10 ms, so
    // the queue learns its drain rate.
    let mut held = queue.admit(work()).await.unwrap();
    for _ in 0..50 {
        let mut next = Box::pin(queue.admit(work()));
        assert!(poll(&mut next).is_pending());
        tokio::time::advance(Duration::from_millis(10)).await;
        drop(held);
        held = match poll(&mut next) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("the waiter is granted, got {other:?}"),
        };
    }
    // A backlog of 20: about 200 ms at that rate.
    let backlog: Vec<_> = (0..20)
        .map(|_| {
            let mut waiter = Box::pin(queue.admit(work()));
            assert!(poll(&mut waiter).is_pending());
            waiter
        })
        .collect();

    let layer = AdmissionLayer::new(
        queue.clone(),
        HttpClassifier::new()
            .default_timeout(Duration::from_millis(100))
            .unwrap()
            .trust(|caller| caller.headers.contains_key("x-internal")),
    )
    .http();
    let service = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(()))
    }));
    let asking = |trusted: bool| {
        let mut request = Request::builder().header("grpc-timeout", "500m");
        if trusted {
            request = request.header("x-internal", "1");
        }
        service.clone().oneshot(request.body(()).unwrap())
    };

    let untrusted = asking(false).await.unwrap();
    assert_eq!(untrusted.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(untrusted.headers()[REASON_HEADER], "would_miss_deadline");
    assert_eq!(untrusted.headers()["retry-after"], "1");

    let mut trusted = Box::pin(asking(true));
    assert!(
        trusted
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending(),
        "500 ms is enough for a 200 ms backlog: it waits"
    );
    drop(trusted);
    drop(backlog);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_grpc_call_is_refused_with_a_grpc_status_and_retry_pushback() {
    let (queue, _waiter) = refusing_queue();
    let layer = AdmissionLayer::new(queue, HttpClassifier::new()).http();
    let service = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(()))
    }));
    let call = Request::post("/echo.Echo/Say")
        .header("content-type", "application/grpc+proto")
        .body(())
        .unwrap();
    let response = service.oneshot(call).await.unwrap();
    // Trailers-only: HTTP 200, the status in the headers.
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers();
    assert_eq!(headers["grpc-status"], "14", "UNAVAILABLE");
    assert_eq!(headers["grpc-message"], "queue_full");
    assert_eq!(headers["grpc-retry-pushback-ms"], "1000");
}

#[test]
fn grpc_refusals_map_deadlines_and_push_back_by_the_estimate() {
    let refusals = RefusalPolicy::default();
    let grpc = |error: AdmitError| {
        let response: Response<()> = refusals.grpc_response(&error);
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        (header("grpc-status"), header("grpc-retry-pushback-ms"))
    };
    let owned = |s: &str| Some(s.to_owned());
    assert_eq!(
        grpc(AdmitError::WouldMissDeadline {
            expected: Duration::from_millis(1250),
            remaining: Duration::from_millis(100),
        }),
        (owned("14"), owned("1250"))
    );
    assert_eq!(
        grpc(AdmitError::DeadlineExceeded {
            waited: Duration::from_millis(5)
        }),
        (owned("4"), None)
    );
    assert_eq!(grpc(AdmitError::Closed), (owned("14"), None));
    assert_eq!(grpc(AdmitError::TimerUnavailable), (owned("13"), None));
}

/// Refusals are held for the pace, so that a client ignoring `Retry-After`
/// cannot make the server answer refusals as fast as it can send; never
/// longer than half the request's own time left, and not at all for a
/// closed queue or with a pace of zero.
#[tokio::test(start_paused = true)]
async fn capacity_refusals_are_paced_and_nothing_else_is() {
    // The default pace.
    let pace = Duration::from_millis(50);
    let (queue, _waiter) = refusing_queue();
    let app = |layer| {
        Router::new()
            .route("/", get(|| async { "served" }))
            .layer(layer)
    };
    let layer = AdmissionLayer::new(queue.clone(), HttpClassifier::new()).http();
    let mut refused = tokio_test::task::spawn(app(layer).oneshot(get_request("/")));
    assert!(refused.poll().is_pending(), "held for the pace");
    tokio::time::advance(pace - Duration::from_millis(1)).await;
    assert!(refused.poll().is_pending());
    tokio::time::advance(Duration::from_millis(1)).await;
    let response = match refused.poll() {
        std::task::Poll::Ready(response) => response.unwrap(),
        std::task::Poll::Pending => panic!("still held after the pace"),
    };
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

    // A pace of zero answers at once.
    let layer = AdmissionLayer::new(queue.clone(), HttpClassifier::new())
        .http()
        .pace_refusals(Duration::ZERO);
    let mut at_once = tokio_test::task::spawn(app(layer).oneshot(get_request("/")));
    assert!(at_once.poll().is_ready());

    // A closed queue is not a capacity refusal: answered at once.
    queue.close();
    let layer = AdmissionLayer::new(queue, HttpClassifier::new()).http();
    let mut closed = tokio_test::task::spawn(app(layer).oneshot(get_request("/")));
    assert!(closed.poll().is_ready());

    // Never longer than half the request's time left (the refusal must
    // arrive before the client's own deadline fires), nor the expected
    // wait.
    let refusals = RefusalPolicy::default();
    let missed = |expected: u64, remaining: u64| AdmitError::WouldMissDeadline {
        expected: Duration::from_millis(expected),
        remaining: Duration::from_millis(remaining),
    };
    assert_eq!(
        refusals.pace_for(&missed(500, 10)),
        Duration::from_millis(5)
    );
    assert_eq!(
        refusals.pace_for(&missed(20, 100)),
        Duration::from_millis(20)
    );
    assert_eq!(refusals.pace_for(&missed(500, 500)), pace);
    assert_eq!(
        refusals.pace_for(&AdmitError::DeadlinePassed),
        Duration::ZERO
    );
}
