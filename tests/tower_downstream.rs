//! The outbound side (`admission::tower::client`) and the reports the
//! server side writes for it: a level learned from a response refuses
//! below it locally, levels expire, hostile headers are no information,
//! the throttle and the retry policy follow their rules, and the caller's
//! slot is given back during a call.

#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::tower::client::{DownstreamError, Downstreams, DownstreamsBuilder};
use admission::tower::{AdmissionLayer, HttpClassifier, LoadReport, LEVEL_HEADER, LOAD_HEADER};
use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::retry::RetryLayer;
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};

const ENDPOINT: &str = "127.0.0.1:8081";

fn outbound(priority: Priority) -> Request<String> {
    Request::get(format!("http://{ENDPOINT}/"))
        .header("x-admission-priority", priority.get().to_string())
        .body(String::new())
        .unwrap()
}

/// A stand-in transport answering every request with the response
/// `answer` builds, counting the requests it was sent.
#[derive(Clone)]
struct Transport {
    sent: Arc<AtomicUsize>,
    answer: Arc<dyn Fn() -> Response<String> + Send + Sync>,
}

impl Transport {
    fn new(answer: impl Fn() -> Response<String> + Send + Sync + 'static) -> Self {
        Transport {
            sent: Arc::default(),
            answer: Arc::new(answer),
        }
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }
}

impl Service<Request<String>> for Transport {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        self.sent.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok((self.answer)()))
    }
}

/// Response headers, by name and value.
type Headers = &'static [(&'static str, &'static str)];

fn answer(status: u16, headers: &[(&str, &str)]) -> Response<String> {
    let mut response = Response::builder().status(status);
    for &(name, value) in headers {
        response = response.header(name, value);
    }
    response.body(String::new()).unwrap()
}

/// The outbound service most tests call: `Transport` behind the layer.
type Outbound = admission::tower::client::DownstreamService<Transport>;

/// `transport` behind the layer of a `Downstreams` built from `builder`.
fn client_of(builder: DownstreamsBuilder, transport: &Transport) -> (Downstreams, Outbound) {
    let downstreams = builder.build().unwrap();
    let client = downstreams.layer().layer(transport.clone());
    (downstreams, client)
}

/// A builder with `ENDPOINT` configured.
fn to_endpoint() -> DownstreamsBuilder {
    Downstreams::builder().endpoint(ENDPOINT)
}

/// One request of `priority` through (a clone of) `client`.
async fn send<S>(client: &S, priority: Priority) -> Result<S::Response, S::Error>
where
    S: Service<Request<String>> + Clone,
{
    client.clone().oneshot(outbound(priority)).await
}

/// A queue with no free slot and no waiting place left: every request is
/// refused at once (queue full). Returns the parked waiter that holds the
/// place.
fn refusing_queue() -> (WorkQueue, std::pin::Pin<Box<admission::Admit>>) {
    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(1)
        .build()
        .unwrap();
    let mut waiter = Box::pin(queue.admit(WorkInfo::new(TenantId::SYSTEM, Priority::HIGH)));
    assert!(futures::FutureExt::now_or_never(waiter.as_mut()).is_none());
    (queue, waiter)
}

#[tokio::test]
async fn a_level_learned_from_a_response_refuses_below_it_locally_and_sends_nothing() {
    // A backend on loopback behind the HTTP-mode layer, over a queue that
    // refuses everything for now.
    let (queue, waiter) = refusing_queue();
    let app = Router::new()
        .route("/", get(|| async { "served" }))
        .route_layer(
            AdmissionLayer::new(queue.clone(), HttpClassifier::new().trust_all())
                .http()
                .pace_refusals(Duration::ZERO),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The throttle's coin never lands below its probability here: this
    // test is about levels.
    let downstreams = Downstreams::builder()
        .endpoint(&address.to_string())
        .random(|| 0.999)
        .build()
        .unwrap();
    let transport: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let client = downstreams.layer().layer(transport);
    let request = |priority: Priority| {
        Request::get(format!("http://{address}/"))
            .header("x-admission-priority", priority.get().to_string())
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let reached = |priority: Priority| {
        queue
            .snapshot()
            .priority(priority)
            .map_or(0, |counts| counts.requested)
    };

    // The first low request is sent and refused by the backend, whose
    // answer says that user-low is shed.
    let refused = client
        .clone()
        .oneshot(request(Priority::USER_LOW))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let shed = Priority::new(Priority::USER_LOW.get() + 1);
    assert_eq!(
        refused.headers()[LEVEL_HEADER],
        shed.get().to_string().as_str()
    );
    assert_eq!(downstreams.level(&address.to_string()), Some(shed));
    assert_eq!(reached(Priority::USER_LOW), 1);

    // The next one is refused here: nothing reaches the backend.
    let error = client
        .clone()
        .oneshot(request(Priority::USER_LOW))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            DownstreamError::BelowLevel { priority, level }
                if priority == Priority::USER_LOW && level == shed
        ),
        "{error}"
    );
    assert!(error.is_local_refusal());
    assert_eq!(reached(Priority::USER_LOW), 1, "nothing was sent");

    // Work at or above the level is sent, and served once there is room.
    queue.set_total_slots(2).unwrap();
    drop(waiter);
    let served = client
        .clone()
        .oneshot(request(Priority::NORMAL))
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(reached(Priority::NORMAL), 1);
    let counts = downstreams.snapshot().endpoints[0].counts;
    assert_eq!(
        (counts.sent, counts.accepted, counts.below_level),
        (2, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_level_expires_so_a_quiet_endpoint_is_tried_again() {
    let transport = Transport::new(|| answer(200, &[(LEVEL_HEADER, "0")]));
    let (downstreams, client) = client_of(
        to_endpoint().level_ttl(Duration::from_millis(100)),
        &transport,
    );
    send(&client, Priority::NORMAL).await.unwrap();
    assert_eq!(downstreams.level(ENDPOINT), Some(Priority::NORMAL));
    let refused = send(&client, Priority::USER_LOW).await;
    assert!(matches!(refused, Err(DownstreamError::BelowLevel { .. })));
    assert_eq!(transport.sent(), 1);

    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(downstreams.level(ENDPOINT), None, "expired");
    send(&client, Priority::USER_LOW).await.unwrap();
    assert_eq!(transport.sent(), 2, "tried again");
}

#[tokio::test]
async fn hostile_or_garbled_levels_are_no_information_and_levels_are_capped() {
    let capped = Priority::USER_HIGH;
    // (what the endpoint sends, the level believed after it)
    let rows: &[(&[&str], Option<Priority>)] = &[
        (&["-10"], Some(Priority::new(-10))),
        (&["127"], Some(capped)),
        (&["100"], Some(capped)),
        (&[""], None),
        (&["high"], None),
        (&["+5"], None),
        (&["128"], None),
        (&["-129"], None),
        (&["5, 6"], None),
        (&["0x7f"], None),
        (&["99999999999999999999999999"], None),
        (&["5", "6"], None),
    ];
    for &(values, believed) in rows {
        let transport = Transport::new(move || {
            let mut response = answer(200, &[]);
            for value in values {
                response
                    .headers_mut()
                    .append(LEVEL_HEADER, value.parse().unwrap());
            }
            response
        });
        let (downstreams, client) = client_of(to_endpoint(), &transport);
        send(&client, Priority::NORMAL).await.unwrap();
        assert_eq!(downstreams.level(ENDPOINT), believed, "{values:?}");
        let garbled = downstreams.snapshot().endpoints[0].counts.garbled;
        assert_eq!(garbled, u64::from(believed.is_none()), "{values:?}");
        // Work at the cap is always sent, whatever the endpoint said.
        send(&client, capped).await.unwrap();
        send(&client, Priority::HIGH).await.unwrap();
        assert_eq!(transport.sent(), 3, "{values:?}");
    }

    // An endpoint the client was not configured to call is not listened to.
    let transport = Transport::new(|| answer(503, &[(LEVEL_HEADER, "100")]));
    let (downstreams, client) = client_of(
        Downstreams::builder().endpoint("127.0.0.1:9999"),
        &transport,
    );
    for _ in 0..50 {
        send(&client, Priority::USER_LOW).await.unwrap();
    }
    assert_eq!(
        transport.sent(),
        50,
        "neither levels nor the throttle apply"
    );
    assert_eq!(downstreams.level(ENDPOINT), None);
    assert_eq!(downstreams.snapshot().endpoints[0].counts.sent, 0);
}

#[tokio::test]
async fn garbled_load_reports_are_no_report_and_good_ones_are_kept() {
    let good = "TEXT cpu_utilization=0.5,named_metrics.queue_length=3";
    for (value, kept) in [
        (good, true),
        ("TEXT cpu_utilization=NaN", false),
        ("JSON {}", false),
        ("TEXT cpu_utilization=1e999", false),
    ] {
        let transport = Transport::new(move || answer(200, &[(LOAD_HEADER, value)]));
        let (downstreams, client) = client_of(to_endpoint(), &transport);
        send(&client, Priority::NORMAL).await.unwrap();
        let load = downstreams.snapshot().endpoints[0].load;
        assert_eq!(load.is_some(), kept, "{value}");
        if let Some(load) = load {
            assert_eq!(
                (load.cpu_utilization, load.queue_length),
                (Some(0.5), Some(3.0))
            );
        }
    }
}

#[tokio::test]
async fn the_throttle_refuses_locally_as_the_endpoint_accepts_less() {
    // The coin always lands at 0.5: a request is refused once the
    // probability passes it.
    let transport = Transport::new(|| answer(503, &[]));
    let (downstreams, client) = client_of(to_endpoint().random(|| 0.5), &transport);
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        let sent = send(&client, Priority::NORMAL).await;
        outcomes.push(sent.is_ok());
    }
    // Nothing accepted: p = requests / (requests + 1) before each, so 0,
    // 1/2, 2/3 (refused), 3/4 (refused).
    assert_eq!(outcomes, [true, true, false, false]);
    assert_eq!(transport.sent(), 2);
    let snapshot = &downstreams.snapshot().endpoints[0];
    assert_eq!((snapshot.counts.sent, snapshot.counts.throttled), (2, 2));
    let [(Some(priority), probability)] = snapshot.throttle[..] else {
        panic!("one priority seen: {:?}", snapshot.throttle);
    };
    assert_eq!(priority, Priority::NORMAL);
    assert!((probability - 4.0 / 5.0).abs() < 1e-9);

    // An endpoint that accepts everything is never throttled.
    let accepting = Transport::new(|| answer(200, &[]));
    let (_, client) = client_of(to_endpoint().random(|| 0.0), &accepting);
    for _ in 0..100 {
        send(&client, Priority::NORMAL).await.unwrap();
    }
    assert_eq!(accepting.sent(), 100);
}

/// A client with retries over `transport`, and what it spends.
fn retrying(
    transport: Transport,
    builder: admission::tower::client::DownstreamsBuilder,
) -> (
    Downstreams,
    impl Service<Request<String>, Response = Response<String>, Error = DownstreamError<Infallible>>
        + Clone,
) {
    let downstreams = builder.endpoint(ENDPOINT).random(|| 0.999).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(downstreams.retry_policy()))
        .layer(downstreams.layer())
        .service(transport);
    (downstreams, client)
}

#[tokio::test(start_paused = true)]
async fn overload_refusals_are_retried_after_their_hint_within_attempts_and_deadline() {
    // (what the endpoint answers, the request's grpc-timeout, sends made)
    let rows: &[(u16, Headers, Option<&str>, usize)] = &[
        (200, &[], None, 1),
        (500, &[], None, 1),
        (503, &[], None, 3),
        (429, &[], None, 3),
        (200, &[("grpc-status", "14")], None, 3),
        (503, &[("grpc-retry-pushback-ms", "20")], Some("500m"), 3),
        // The endpoint asks for more time than the deadline leaves.
        (503, &[("retry-after", "1")], Some("500m"), 1),
        (503, &[("grpc-retry-pushback-ms", "300")], Some("500m"), 2),
        // gRFC A6: a pushback that is not a non-negative integer is a no.
        (503, &[("grpc-retry-pushback-ms", "-1")], None, 1),
        (503, &[("grpc-retry-pushback-ms", "later")], None, 1),
        // A date is no hint: the backoff.
        (
            503,
            &[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")],
            None,
            3,
        ),
    ];
    for &(status, headers, timeout, sends) in rows {
        let transport = Transport::new(move || answer(status, headers));
        let (_, client) = retrying(transport.clone(), Downstreams::builder());
        let mut request = outbound(Priority::NORMAL);
        if let Some(timeout) = timeout {
            request
                .headers_mut()
                .insert("grpc-timeout", timeout.parse().unwrap());
        }
        let answered = client.oneshot(request).await.unwrap();
        assert_eq!(answered.status(), status, "{status} {headers:?}");
        assert_eq!(transport.sent(), sends, "{status} {headers:?} {timeout:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_the_hint_and_carries_what_is_left_of_the_deadline() {
    // When each attempt was sent, with its grpc-timeout.
    type Sends = Vec<(tokio::time::Instant, Option<String>)>;
    let seen: Arc<Mutex<Sends>> = Arc::default();
    let log = seen.clone();
    let transport = service_fn(move |request: Request<String>| {
        let timeout = request
            .headers()
            .get("grpc-timeout")
            .map(|value| value.to_str().unwrap().to_owned());
        log.lock()
            .unwrap()
            .push((tokio::time::Instant::now(), timeout));
        async { Ok::<_, Infallible>(answer(503, &[("grpc-retry-pushback-ms", "100")])) }
    });
    let downstreams = to_endpoint().random(|| 0.999).build().unwrap();
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(downstreams.retry_policy()))
        .layer(downstreams.layer())
        .service(transport);
    let mut request = outbound(Priority::NORMAL);
    request
        .headers_mut()
        .insert("grpc-timeout", "1000m".parse().unwrap());
    let start = tokio::time::Instant::now();
    client.oneshot(request).await.unwrap();
    let seen = seen.lock().unwrap();
    let sends: Vec<(Duration, Option<&str>)> = seen
        .iter()
        .map(|(at, timeout)| (*at - start, timeout.as_deref()))
        .collect();
    let ms = Duration::from_millis;
    assert_eq!(
        sends,
        [
            (ms(0), Some("1000m")),
            (ms(100), Some("900000u")),
            (ms(200), Some("800000u")),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn local_refusals_are_not_retried_and_a_spent_budget_stops_retries() {
    // Refused here for the level: not retried, one request and no retry.
    let transport = Transport::new(|| answer(200, &[(LEVEL_HEADER, "10")]));
    let (downstreams, client) = retrying(transport.clone(), Downstreams::builder());
    send(&client, Priority::NORMAL).await.unwrap();
    send(&client, Priority::USER_HIGH).await.unwrap();
    let refused = send(&client, Priority::NORMAL).await;
    // The first NORMAL was sent (no level known yet) and the answer was
    // accepted, so only the last one is a local refusal.
    assert!(matches!(refused, Err(DownstreamError::BelowLevel { .. })));
    assert_eq!(downstreams.snapshot().budget.retries, 0);

    // A budget of 10% and no floor: ten refused requests buy one retry.
    let transport = Transport::new(|| answer(503, &[("grpc-retry-pushback-ms", "0")]));
    let (downstreams, client) = retrying(
        transport.clone(),
        Downstreams::builder().retry_budget(0.1, 0, Duration::from_secs(10)),
    );
    for _ in 0..10 {
        send(&client, Priority::NORMAL).await.unwrap();
    }
    let budget = downstreams.snapshot().budget;
    assert_eq!((budget.requests, budget.retries), (10, 1));
    assert_eq!(transport.sent(), 11);
}

#[tokio::test]
async fn the_callers_slot_is_given_back_during_the_call_and_taken_again() {
    let queue = WorkQueue::new(1).unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let gate = release.clone();
    let inside = queue.clone();
    let used_during_call = Arc::new(AtomicU32::new(u32::MAX));
    let observed = used_during_call.clone();
    let transport = service_fn(move |_: Request<String>| {
        let (gate, inside, observed) = (gate.clone(), inside.clone(), observed.clone());
        async move {
            observed.store(inside.granter_snapshot().used as u32, Ordering::SeqCst);
            gate.notified().await;
            Ok::<_, Infallible>(answer(200, &[]))
        }
    });
    let client = to_endpoint().build().unwrap().layer().layer(transport);
    let handler = service_fn(move |_: ()| {
        let client = client.clone();
        async move {
            let response = client.oneshot(outbound(Priority::NORMAL)).await?;
            Ok::<_, BoxError>(response.status())
        }
    });
    let service = AdmissionLayer::new(queue.clone(), |_: &()| {
        WorkInfo::new(TenantId::new(1), Priority::NORMAL)
    })
    .layer(handler);
    let call = tokio::spawn(service.clone().oneshot(()));
    while used_during_call.load(Ordering::SeqCst) == u32::MAX {
        tokio::task::yield_now().await;
    }
    assert_eq!(used_during_call.load(Ordering::SeqCst), 0, "given back");
    // Another request is admitted meanwhile.
    let other = queue
        .admit(WorkInfo::new(TenantId::new(2), Priority::NORMAL))
        .await
        .unwrap();
    assert_eq!(queue.granter_snapshot().used, 1);
    drop(other);
    release.notify_one();
    assert_eq!(call.await.unwrap().unwrap(), StatusCode::OK);
    assert_eq!(
        queue.granter_snapshot().used,
        0,
        "taken again, then returned"
    );
    let normal = queue
        .snapshot()
        .priority(Priority::NORMAL)
        .cloned()
        .unwrap();
    assert_eq!(
        (normal.requested, normal.admitted),
        (3, 3),
        "the request, its second admission and the other one"
    );
}

/// ORCA's per-request header: `endpoint-load-metrics-format`.
const LOAD_FORMAT_HEADER: &str = "endpoint-load-metrics-format";

#[tokio::test(start_paused = true)]
async fn the_client_asks_each_endpoint_for_a_load_report_once_a_period() {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let transport = {
        let asked = asked.clone();
        service_fn(move |request: Request<String>| {
            let asked = asked.clone();
            async move {
                let format = request.headers().get(LOAD_FORMAT_HEADER).cloned();
                asked.lock().unwrap().push(format);
                Ok::<_, Infallible>(answer(200, &[]))
            }
        })
    };
    let downstreams = to_endpoint().build().unwrap();
    let client = downstreams.layer().layer(transport);
    let mut expected = Vec::new();
    for round in 0..3 {
        for _ in 0..4 {
            send(&client, Priority::NORMAL).await.unwrap();
        }
        // The first request of each period asks, in the text form.
        expected.extend([true, false, false, false]);
        tokio::time::advance(Duration::from_millis(100)).await;
        let seen: Vec<bool> = asked.lock().unwrap().iter().map(Option::is_some).collect();
        assert_eq!(seen, expected, "round {round}");
    }
    assert!(asked
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .all(|format| format == "TEXT"));
}

#[tokio::test]
async fn every_response_carries_the_level_and_load_reports_answer_requests_that_ask() {
    let app = |layer: admission::tower::HttpAdmissionLayer<HttpClassifier>| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(layer)
    };
    let get = || Request::get("/").body(Body::empty()).unwrap();

    let open = WorkQueue::new(4).unwrap();
    let layer = AdmissionLayer::new(open.clone(), HttpClassifier::new()).http();
    let served = app(layer).oneshot(get()).await.unwrap();
    assert_eq!(
        served.headers()[LEVEL_HEADER],
        "-128",
        "everything admitted"
    );
    assert!(served.headers().get(LOAD_HEADER).is_none(), "opt-in");

    let layer = AdmissionLayer::new(open.clone(), HttpClassifier::new())
        .http()
        .load_reports(true);
    let served = app(layer.clone()).oneshot(get()).await.unwrap();
    assert!(
        served.headers().get(LOAD_HEADER).is_none(),
        "a request that does not ask gets no report"
    );
    let asking = Request::get("/")
        .header(LOAD_FORMAT_HEADER, "JSON")
        .body(Body::empty())
        .unwrap();
    let served = app(layer).oneshot(asking).await.unwrap();
    let value = served.headers()[LOAD_HEADER].to_str().unwrap();
    assert!(value.starts_with("TEXT "), "{value}");
    assert!(value.contains("named_metrics.queue_length=0"), "{value}");
    assert!(value.contains("named_metrics.in_flight=0"), "{value}");
    assert!(!value.contains("cpu_utilization"), "no controller: {value}");

    let layer = AdmissionLayer::new(open, HttpClassifier::new())
        .http()
        .admission_level_header(false);
    let served = app(layer).oneshot(get()).await.unwrap();
    assert!(served.headers().get(LEVEL_HEADER).is_none());

    // Refusals carry it too: the refused priority is shed.
    let (full, _waiter) = refusing_queue();
    let layer = AdmissionLayer::new(full, HttpClassifier::new())
        .http()
        .pace_refusals(Duration::ZERO);
    let refused = app(layer).oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[LEVEL_HEADER], "1", "normal (0) is shed");
    let _ = LoadReport::default();
}

#[tokio::test]
async fn a_service_reports_the_levels_of_the_endpoints_it_calls_upstream() {
    // What the service learned of its downstream: user-low is shed there.
    let transport = Transport::new(|| answer(503, &[(LEVEL_HEADER, "-49")]));
    let (downstreams, client) = client_of(to_endpoint().random(|| 0.999), &transport);
    send(&client, Priority::USER_LOW).await.unwrap();

    let queue = WorkQueue::new(4).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(
            AdmissionLayer::new(queue.clone(), HttpClassifier::new())
                .http()
                .report_downstream_levels(&downstreams),
        );
    let served = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(
        served.headers()[LEVEL_HEADER],
        "-49",
        "the downstream's, higher than its own"
    );
}

#[tokio::test(start_paused = true)]
async fn refusals_of_work_below_the_level_they_carry_do_not_throttle() {
    // The endpoint sheds user-low by design and says so on each refusal;
    // the coin lands at 0.0, so any probability above zero would throttle.
    let transport = Transport::new(|| answer(503, &[(LEVEL_HEADER, "-49")]));
    let (downstreams, client) = client_of(
        to_endpoint()
            .level_ttl(Duration::from_millis(1))
            .random(|| 0.0),
        &transport,
    );
    for _ in 0..5 {
        // Each level expires before the next request: every one is sent.
        tokio::time::advance(Duration::from_millis(1)).await;
        send(&client, Priority::USER_LOW).await.unwrap();
    }
    assert_eq!(transport.sent(), 5);
    let throttle = &downstreams.snapshot().endpoints[0].throttle;
    assert_eq!(throttle[..], [(Some(Priority::USER_LOW), 0.0)]);
    // The same refusals of work the endpoint claims to admit do throttle.
    let transport = Transport::new(|| answer(503, &[(LEVEL_HEADER, "-128")]));
    let (_, client) = client_of(to_endpoint().random(|| 0.0), &transport);
    send(&client, Priority::USER_LOW).await.unwrap();
    let throttled = send(&client, Priority::USER_LOW).await;
    assert!(matches!(throttled, Err(DownstreamError::Throttled { .. })));
}
