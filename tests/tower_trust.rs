//! Who may claim a priority, a tenant or a long deadline: headers are
//! believed only as far as the application's trust predicate trusts the
//! caller.

#![cfg(feature = "tower")]

use std::net::SocketAddr;
use std::time::Duration;

use admission::tower::{Caller, HttpClassifier};
use admission::tower::{PRIORITY_HEADER, TENANT_HEADER};
use admission::{Priority, TenantId, WorkInfo};
use axum::extract::ConnectInfo;
use http::Request;

fn request(headers: &[(&str, &str)]) -> Request<()> {
    let mut builder = Request::builder();
    for &(name, value) in headers {
        builder = builder.header(name, value);
    }
    builder.body(()).unwrap()
}

fn class(work: &WorkInfo) -> (TenantId, Priority, Option<Duration>) {
    let timeout = work.deadline().map(|d| d - work.create_time());
    (work.tenant(), work.priority(), timeout)
}

const GREEDY: &[(&str, &str)] = &[
    (TENANT_HEADER, "42"),
    (PRIORITY_HEADER, "user-high"),
    ("grpc-timeout", "10S"),
];

#[tokio::test(start_paused = true)]
async fn without_a_predicate_nobody_raises_itself_or_picks_a_tenant() {
    let classifier = HttpClassifier::new()
        .default_tenant(TenantId::new(3))
        .default_timeout(Duration::from_millis(100))
        .unwrap();
    assert_eq!(
        class(&classifier.classify(&request(GREEDY))),
        (
            TenantId::new(3),
            Priority::NORMAL,
            Some(Duration::from_millis(100))
        ),
        "the priority, tenant and long deadline are all the defaults"
    );
}

#[tokio::test(start_paused = true)]
async fn an_untrusted_caller_may_still_ask_for_less() {
    let classifier = HttpClassifier::new()
        .default_timeout(Duration::from_millis(100))
        .unwrap();
    let modest = request(&[(PRIORITY_HEADER, "bulk-normal"), ("grpc-timeout", "20m")]);
    assert_eq!(
        class(&classifier.classify(&modest)),
        (
            TenantId::ANONYMOUS,
            Priority::BULK_NORMAL,
            Some(Duration::from_millis(20))
        )
    );
}

#[tokio::test(start_paused = true)]
async fn on_a_route_an_untrusted_callers_ceiling_is_the_routes_priority() {
    let classifier = HttpClassifier::new().route("/bulk", Priority::BULK_NORMAL);
    let mut asking = request(&[(PRIORITY_HEADER, "normal")]);
    *asking.uri_mut() = "/bulk".parse().unwrap();
    assert_eq!(
        classifier.classify(&asking).priority(),
        Priority::BULK_NORMAL
    );
    let mut lower = request(&[(PRIORITY_HEADER, "bulk-low")]);
    *lower.uri_mut() = "/bulk".parse().unwrap();
    assert_eq!(classifier.classify(&lower).priority(), Priority::BULK_LOW);
}

/// The peer address as axum reports it with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
fn from_peer(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut request = request(headers);
    let peer: SocketAddr = peer.parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn on_loopback(caller: &Caller<'_>) -> bool {
    caller
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback())
}

#[tokio::test(start_paused = true)]
async fn the_predicate_decides_by_peer_address() {
    let classifier = HttpClassifier::new()
        .trust(on_loopback)
        .default_timeout(Duration::from_millis(100))
        .unwrap();
    let inside = classifier.classify(&from_peer("127.0.0.1:5000", GREEDY));
    assert_eq!(
        class(&inside),
        (
            TenantId::new(42),
            Priority::USER_HIGH,
            Some(Duration::from_secs(10))
        )
    );
    let outside = classifier.classify(&from_peer("203.0.113.9:5000", GREEDY));
    assert_eq!(
        class(&outside),
        (
            TenantId::ANONYMOUS,
            Priority::NORMAL,
            Some(Duration::from_millis(100))
        )
    );
    // No peer address at all (a test harness, a unix socket): not trusted.
    let unknown = classifier.classify(&request(GREEDY));
    assert_eq!(unknown.priority(), Priority::NORMAL);
}

/// What an authentication layer in front of admission leaves behind.
#[derive(Clone)]
struct Authenticated {
    internal: bool,
}

#[tokio::test(start_paused = true)]
async fn the_predicate_decides_by_an_authentication_extension() {
    let classifier = HttpClassifier::new().trust(|caller| {
        caller
            .extensions
            .get::<Authenticated>()
            .is_some_and(|who| who.internal)
    });
    let with = |who: Option<Authenticated>| {
        let mut request = request(GREEDY);
        if let Some(who) = who {
            request.extensions_mut().insert(who);
        }
        classifier.classify(&request).priority()
    };
    assert_eq!(
        with(Some(Authenticated { internal: true })),
        Priority::USER_HIGH
    );
    assert_eq!(
        with(Some(Authenticated { internal: false })),
        Priority::NORMAL
    );
    assert_eq!(with(None), Priority::NORMAL);
}

#[tokio::test(start_paused = true)]
async fn reserved_tenants_are_refused_even_from_trusted_callers() {
    let classifier = HttpClassifier::new()
        .trust_all()
        .default_tenant(TenantId::new(7))
        .reserve_tenant(TenantId::new(5));
    let tenant_of = |id: &str| {
        classifier
            .classify(&request(&[(TENANT_HEADER, id)]))
            .tenant()
    };
    assert_eq!(tenant_of("1"), TenantId::new(7), "the system tenant");
    assert_eq!(tenant_of("5"), TenantId::new(7), "reserved by the service");
    assert_eq!(tenant_of("6"), TenantId::new(6));
}

#[test]
fn a_default_priority_above_the_cap_is_a_construction_error_not_a_silent_cap() {
    let error = HttpClassifier::new()
        .default_priority(Priority::HIGH)
        .unwrap_err();
    assert_eq!(error.field(), "default_priority");
    // Raising the cap first makes the same default valid, and it is used.
    let classifier = HttpClassifier::new()
        .max_priority(Priority::HIGH)
        .unwrap()
        .default_priority(Priority::HIGH)
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let work = runtime.block_on(async { classifier.classify(&request(&[])) });
    assert_eq!(work.priority(), Priority::HIGH);
    assert_eq!(
        HttpClassifier::new()
            .default_timeout(Duration::ZERO)
            .unwrap_err()
            .field(),
        "default_timeout"
    );
}

/// Anonymous callers share one tenant of their own: never the node's own
/// work, so that fairness weighs them against named tenants, and a header
/// that names the system tenant lands there too.
#[tokio::test(start_paused = true)]
async fn anonymous_callers_are_a_tenant_of_their_own_not_the_system() {
    let classifier = HttpClassifier::new().trust_all();
    let anonymous = classifier.classify(&request(&[])).tenant();
    assert_eq!(anonymous, TenantId::ANONYMOUS);
    assert_ne!(anonymous, TenantId::SYSTEM);
    let claims_system = classifier
        .classify(&request(&[(TENANT_HEADER, "1")]))
        .tenant();
    assert_eq!(claims_system, TenantId::ANONYMOUS);
}
