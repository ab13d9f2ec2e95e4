//! Admission in a real HTTP server on 127.0.0.1, with a real client: the
//! tower layer behind axum, refusals as HTTP, and the class travelling
//! between two servers.

#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission::tower::{
    current_work, rejection_response, AdmissionError, AdmissionLayer, HttpClassifier,
    PropagateLayer,
};
use admission::WorkQueue;
use axum::body::{Body, Bytes};
use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Serves `routes` behind admission through `queue`, classified from the
/// propagation headers of trusted callers; returns the address.
async fn serve(queue: WorkQueue, routes: Router) -> SocketAddr {
    // Every caller here is a test on loopback: trusted.
    let classifier = HttpClassifier::new().trust_all();
    let app = routes.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(
                |error: AdmissionError<Infallible>| async move {
                    match error {
                        AdmissionError::Rejected(error) => {
                            rejection_response::<Body>(&error, Duration::from_millis(1500))
                        }
                        AdmissionError::Inner(never) => match never {},
                    }
                },
            ))
            .layer(AdmissionLayer::new(queue, move |request: &Request| {
                classifier.classify(request)
            })),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

fn get_request(
    address: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> http::Request<Empty<Bytes>> {
    let mut request = http::Request::get(format!("http://{address}{path}"));
    for &(name, value) in headers {
        request = request.header(name, value);
    }
    request.body(Empty::new()).unwrap()
}

async fn text(response: http::Response<hyper::body::Incoming>) -> String {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// Waits until `condition` holds; the guard only keeps a broken build from
/// hanging, it is not a timing assertion.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The admitted request's class, as the handler sees it.
async fn describe() -> String {
    let work = current_work().expect("admitted work is current");
    let left = work.deadline().map(|d| d - work.create_time());
    format!("{} {} {:?}", work.tenant(), work.priority(), left)
}

#[tokio::test]
async fn headers_map_to_the_work_class() {
    let address = serve(
        WorkQueue::new(4).unwrap(),
        Router::new().route("/", get(describe)),
    )
    .await;
    let response = client()
        .request(get_request(
            address,
            "/",
            &[
                ("x-admission-tenant", "7"),
                ("x-admission-priority", "user-low"),
                ("grpc-timeout", "30m"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(text(response).await, "7 user-low Some(30ms)");

    let plain = client()
        .request(get_request(address, "/", &[]))
        .await
        .unwrap();
    // No headers: the anonymous tenant (0), the classifier's default timeout.
    assert_eq!(text(plain).await, "0 normal Some(1s)");
}

#[tokio::test]
async fn under_overload_low_priority_gets_429_while_high_priority_succeeds() {
    // One slot and one waiting place: a blocked request holds the slot, a
    // high-priority request takes the waiting place, and a low-priority one
    // finds the queue full.
    let queue = WorkQueue::builder()
        .total_slots(1)
        .max_waiters(1)
        .build()
        .unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let gate = release.clone();
    let routes = Router::new()
        .route(
            "/block",
            get(move || {
                let gate = gate.clone();
                async move {
                    // Computes (yielding, never waiting) until released: a
                    // handler that waits gives its slot back.
                    while !gate.load(Ordering::SeqCst) {
                        tokio::task::yield_now().await;
                    }
                    "unblocked"
                }
            }),
        )
        .route("/", get(describe));
    let address = serve(queue.clone(), routes).await;

    // As high a priority as the request that will wait: a handler gives its
    // slot to waiting work of a higher priority when it yields.
    let blocked = tokio::spawn(client().request(get_request(
        address,
        "/block",
        &[("x-admission-priority", "user-high")],
    )));
    eventually("the blocker holds the slot", || {
        queue.snapshot().granter.used == 1
    })
    .await;
    let high = tokio::spawn(client().request(get_request(
        address,
        "/",
        &[("x-admission-priority", "user-high")],
    )));
    eventually("the high-priority request waits", || queue.waiting() == 1).await;

    let low = client()
        .request(get_request(
            address,
            "/",
            &[("x-admission-priority", "user-low")],
        ))
        .await
        .unwrap();
    assert_eq!(low.status(), 429);
    assert_eq!(low.headers()["retry-after"], "2");

    release.store(true, Ordering::SeqCst);
    let high = high.await.unwrap().unwrap();
    assert_eq!(high.status(), 200);
    assert_eq!(text(high).await, "0 user-high Some(1s)");
    assert_eq!(blocked.await.unwrap().unwrap().status(), 200);
}

#[tokio::test]
async fn a_dropped_client_request_releases_its_permit() {
    let queue = WorkQueue::new(1).unwrap();
    let routes = Router::new().route(
        "/block",
        // Computes for ever, yielding: it holds its slot.
        get(|| async {
            loop {
                tokio::task::yield_now().await;
            }
            #[allow(unreachable_code)]
            "never"
        }),
    );
    let address = serve(queue.clone(), routes).await;
    let request = tokio::spawn(client().request(get_request(address, "/block", &[])));
    eventually("the request holds the slot", || {
        queue.snapshot().granter.used == 1
    })
    .await;
    request.abort();
    // The connection closes; the server drops the handler's future, and with
    // it the permit.
    eventually("the slot comes back", || queue.snapshot().granter.used == 0).await;
}

#[tokio::test]
async fn the_class_travels_through_two_chained_servers() {
    let back = serve(
        WorkQueue::new(4).unwrap(),
        Router::new().route("/", get(describe)),
    )
    .await;
    // The front handler calls the back server through `PropagateLayer`.
    let outgoing = PropagateLayer.layer(client());
    let front_routes = Router::new().route(
        "/",
        get(move || {
            let mut outgoing = outgoing.clone();
            async move {
                let here = describe().await;
                let response = outgoing
                    .ready()
                    .await
                    .unwrap()
                    .call(get_request(back, "/", &[]))
                    .await
                    .unwrap();
                format!("{here} | {}", text(response).await)
            }
        }),
    );
    let front = serve(WorkQueue::new(4).unwrap(), front_routes).await;
    let response = client()
        .request(get_request(
            front,
            "/",
            &[
                ("x-admission-tenant", "42"),
                ("x-admission-priority", "bulk-normal"),
            ],
        ))
        .await
        .unwrap();
    // The front gets the classifier's default timeout; the back gets what
    // was left of it when the front called (however long that took).
    let text = text(response).await;
    let (front, back) = text.split_once(" | ").expect("two servers answered");
    assert_eq!(front, "42 bulk-normal Some(1s)");
    assert!(
        back.starts_with("42 bulk-normal Some("),
        "the back's class and the deadline passed on: {back}"
    );
}

/// A handler behind the layer in a real server gives its slot back while it
/// waits (`admission::tower::release_during`): with one slot, another
/// request is served meanwhile, and the first one holds a slot again when it
/// goes on.
#[tokio::test]
async fn a_handler_waiting_on_io_lets_another_request_through_its_slot() {
    let queue = WorkQueue::new(1).unwrap();
    let go_on = Arc::new(Notify::new());
    let waiting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = queue.clone();
    let (flag, resume) = (waiting.clone(), go_on.clone());
    let routes = Router::new()
        .route(
            "/wait",
            get(move || {
                let (seen, flag, resume) = (seen.clone(), flag.clone(), resume.clone());
                async move {
                    let (_, admitted) = admission::tower::release_during(async {
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                        resume.notified().await;
                    })
                    .await;
                    admitted.unwrap();
                    format!("held {}", seen.snapshot().granter.used)
                }
            }),
        )
        .route("/quick", get(|| async { "quick" }));
    let address = serve(queue.clone(), routes).await;
    let first = tokio::spawn(client().request(get_request(address, "/wait", &[])));
    eventually("the handler waits with its slot given back", || {
        waiting.load(std::sync::atomic::Ordering::SeqCst) && queue.snapshot().granter.used == 0
    })
    .await;

    let quick = client()
        .request(get_request(address, "/quick", &[]))
        .await
        .unwrap();
    assert_eq!(quick.status(), 200);
    assert_eq!(text(quick).await, "quick");

    go_on.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(text(first).await, "held 1");
    eventually("the slot comes back", || queue.snapshot().granter.used == 0).await;
}

/// The same without an annotation: the layer gives the slot of a handler
/// that waits back by itself, and takes it again when the handler is ready
/// to compute.
#[tokio::test]
async fn a_handler_waiting_without_annotation_lets_another_request_through_its_slot() {
    let queue = WorkQueue::new(1).unwrap();
    let go_on = Arc::new(Notify::new());
    let waiting = Arc::new(AtomicBool::new(false));
    let seen = queue.clone();
    let (flag, resume) = (waiting.clone(), go_on.clone());
    let routes = Router::new()
        .route(
            "/wait",
            get(move || {
                let (seen, flag, resume) = (seen.clone(), flag.clone(), resume.clone());
                async move {
                    flag.store(true, Ordering::SeqCst);
                    resume.notified().await;
                    format!("held {}", seen.snapshot().granter.used)
                }
            }),
        )
        .route("/quick", get(|| async { "quick" }));
    let address = serve(queue.clone(), routes).await;
    let first = tokio::spawn(client().request(get_request(address, "/wait", &[])));
    eventually("the handler waits with its slot given back", || {
        waiting.load(Ordering::SeqCst) && queue.snapshot().granter.used == 0
    })
    .await;

    let quick = client()
        .request(get_request(address, "/quick", &[]))
        .await
        .unwrap();
    assert_eq!(text(quick).await, "quick");

    go_on.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(text(first).await, "held 1");
    eventually("the slot comes back", || queue.snapshot().granter.used == 0).await;
    let resumed: u64 = queue.snapshot().priorities.iter().map(|p| p.resumed).sum();
    assert_eq!(resumed, 1, "asked for again once, after the wait");
}
