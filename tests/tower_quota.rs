//! A quota attached to the tower layer: a tenant over its quota is answered
//! 429 with `Retry-After` (gRPC: `RESOURCE_EXHAUSTED`), other tenants are
//! served, and the node's capacity still applies after the quota.

#![cfg(feature = "tower")]

use std::time::Duration;

use admission::quota::{Quota, TenantQuota};
use admission::tower::{AdmissionLayer, REASON_HEADER};
use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;

/// The tenant is the `x-tenant` header's number (the test trusts it). The
/// deadline leaves the first request of a tenant time for the node's first
/// lease on a loaded machine, and is shorter than one unit's refill at
/// one a second, so that a request finding no units is refused at once.
fn classify(request: &Request<Body>) -> WorkInfo {
    let tenant = request
        .headers()
        .get("x-tenant")
        .and_then(|value| value.to_str().ok()?.parse().ok())
        .unwrap_or(1);
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .priority(Priority::NORMAL)
        .timeout(Duration::from_millis(500))
        .build()
}

fn request(tenant: u64) -> Request<Body> {
    Request::get("/")
        .header("x-tenant", tenant.to_string())
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn a_tenant_over_quota_is_answered_429_with_retry_after_and_others_are_served() {
    // Tenant 5: one request a second, two banked. Tenant 6: no quota.
    let quota = Quota::builder()
        .tenant(TenantId::new(5), TenantQuota::new(1, 2).unwrap())
        .build()
        .unwrap();
    let layer = AdmissionLayer::new(WorkQueue::new(4).unwrap(), classify)
        .with_quota(quota.clone())
        .http()
        .pace_refusals(Duration::ZERO);
    let app = Router::new()
        .route("/", get(|| async { "served" }))
        .layer(layer);
    let status = |tenant| {
        let app = app.clone();
        async move { app.oneshot(request(tenant)).await.unwrap() }
    };
    // The burst admits; then, at one a second, a request with 500 ms to
    // live is refused (a loaded machine may let a refill unit through
    // first: the count of admitted ones is not the point).
    assert_eq!(status(5).await.status(), StatusCode::OK);
    let mut refused = status(5).await;
    for _ in 0..5 {
        if refused.status() != StatusCode::OK {
            break;
        }
        refused = status(5).await;
    }
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()[REASON_HEADER], "over_quota");
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    for _ in 0..10 {
        assert_eq!(status(6).await.status(), StatusCode::OK, "no quota");
    }
    let tenant = &quota.snapshot().tenants[0];
    assert_eq!((tenant.tenant, tenant.refused), (TenantId::new(5), 1));
    assert_eq!(quota.snapshot().tenants.len(), 1, "no record for tenant 6");
}

#[tokio::test]
async fn a_grpc_call_over_quota_is_resource_exhausted() {
    let quota = Quota::builder()
        .tenant(TenantId::new(5), TenantQuota::new(1, 1).unwrap())
        .build()
        .unwrap();
    let layer = AdmissionLayer::new(WorkQueue::new(4).unwrap(), classify)
        .with_quota(quota)
        .http()
        .pace_refusals(Duration::ZERO);
    let app = Router::new()
        .route("/", get(|| async { "served" }))
        .layer(layer);
    let grpc = || {
        Request::get("/")
            .header("x-tenant", "5")
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        app.clone().oneshot(grpc()).await.unwrap().status(),
        StatusCode::OK
    );
    let refused = app.oneshot(grpc()).await.unwrap();
    assert_eq!(refused.headers()["grpc-status"], "8");
    assert!(refused.headers().contains_key("grpc-retry-pushback-ms"));
}
