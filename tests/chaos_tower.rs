//! Tower middleware under hostile input: headers that are not what the
//! convention says, classifiers that panic, settings at their extremes.
//! Nothing a caller sends or a callback does may panic the service, raise a
//! request's priority or wedge the queue.

#![cfg(feature = "tower")]

use std::time::Duration;

use admission::tower::rejection_response;
use admission::AdmitError;

#[test]
fn a_retry_after_of_any_length_is_a_header_not_a_panic() {
    let full = AdmitError::QueueFull { max_waiters: 1 };
    let response: http::Response<()> = rejection_response(&full, Duration::MAX);
    assert_eq!(response.headers()["retry-after"], u64::MAX.to_string());
}

#[tokio::test(start_paused = true)]
async fn a_panicking_classifier_serves_the_request_at_the_lowest_trust() {
    use std::convert::Infallible;

    use admission::tower::{current_work, AdmissionLayer};
    use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    use tower::{service_fn, Layer, ServiceExt};

    let queue = WorkQueue::new(1).unwrap();
    let inner = service_fn(|_: u64| async { Ok::<_, Infallible>(current_work().unwrap()) });
    let classify = |tenant: &u64| {
        assert_ne!(*tenant, 0, "the classifier broke");
        WorkInfo::new(TenantId::new(*tenant), Priority::HIGH)
    };
    let service = AdmissionLayer::new(queue.clone(), classify).layer(inner);
    let work = service.clone().oneshot(0).await.unwrap();
    assert_eq!(
        (work.tenant(), work.priority()),
        (TenantId::ANONYMOUS, Priority::USER_LOW)
    );
    assert_eq!(queue.snapshot().granter.used, 0, "the slot came back");
}

#[tokio::test(start_paused = true)]
async fn a_classifier_that_panics_then_recovers_is_counted_and_used_again() {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use admission::tower::{current_work, AdmissionLayer};
    use admission::{Priority, TenantId, WorkInfo, WorkQueue};
    use tower::{service_fn, Layer, ServiceExt};

    let broken = Arc::new(AtomicBool::new(true));
    let breaks = broken.clone();
    let classify = move |tenant: &u64| {
        assert!(!breaks.load(Ordering::Relaxed), "the classifier broke");
        WorkInfo::new(TenantId::new(*tenant), Priority::USER_HIGH)
    };
    let queue = WorkQueue::new(1).unwrap();
    let layer = AdmissionLayer::new(queue.clone(), classify);
    let inner = service_fn(|_: u64| async { Ok::<_, Infallible>(current_work().unwrap()) });
    let service = layer.layer(inner);

    for _ in 0..3 {
        let work = service.clone().oneshot(42).await.unwrap();
        assert_eq!(work.priority(), Priority::USER_LOW, "the fallback");
        assert!(!work.is_bypass() && work.deadline().is_none());
    }
    let failing = layer.classifier_health();
    assert_eq!((failing.panics, failing.consecutive_panics), (3, 3));
    assert_eq!(failing.component, "classifier");
    assert!(!failing.is_healthy());

    broken.store(false, Ordering::Relaxed);
    let work = service.clone().oneshot(42).await.unwrap();
    assert_eq!(
        (work.tenant(), work.priority()),
        (TenantId::new(42), Priority::USER_HIGH)
    );
    let recovered = layer.classifier_health();
    assert_eq!((recovered.panics, recovered.consecutive_panics), (3, 0));
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn hostile_headers_fall_back_to_the_defaults() {
    use admission::tower::HttpClassifier;
    use admission::tower::{PRIORITY_HEADER, TENANT_HEADER};
    use admission::{Priority, TenantId};
    use http::HeaderValue;

    // Trusted, so that every header is parsed rather than ignored.
    let classifier = HttpClassifier::new().trust_all();
    let hostile: &[&[u8]] = &[
        b"\xc3\xa9",
        b"\xff\xfe",
        b"99999999999999999999999",
        b"-",
        b"",
        b"  ",
        b"1e9",
        b"\x80m",
        b"99999999\xe2\x82\xac",
    ];
    for &bytes in hostile {
        let value = HeaderValue::from_bytes(bytes).unwrap();
        let request = http::Request::builder()
            .header(TENANT_HEADER, value.clone())
            .header(PRIORITY_HEADER, value.clone())
            .header("grpc-timeout", value)
            .body(())
            .unwrap();
        let work = classifier.classify(&request);
        assert_eq!(
            (work.tenant(), work.priority(), work.deadline()),
            (
                TenantId::ANONYMOUS,
                Priority::NORMAL,
                // The classifier's default timeout.
                Some(work.create_time() + Duration::from_secs(1))
            ),
            "{bytes:?}"
        );
    }

    let longest = http::Request::builder()
        .header("grpc-timeout", "99999999H")
        .body(())
        .unwrap();
    let work = classifier.classify(&longest);
    assert_eq!(
        work.deadline(),
        Some(work.create_time() + Duration::from_secs(99_999_999 * 3600))
    );
}

#[test]
fn classifier_priorities_out_of_order_are_refused_naming_the_field() {
    use admission::tower::HttpClassifier;
    use admission::Priority;

    let error = HttpClassifier::new()
        .default_priority(Priority::HIGH)
        .expect_err("a default above the cap");
    assert_eq!(error.field(), "default_priority");
    let error = HttpClassifier::new()
        .max_priority(Priority::BULK_NORMAL)
        .expect_err("a cap below the default");
    assert_eq!(error.field(), "max_priority");

    // Lowering both works default first; raising both, cap first.
    HttpClassifier::new()
        .default_priority(Priority::LOW)
        .and_then(|c| c.max_priority(Priority::BULK_LOW))
        .unwrap();
    HttpClassifier::new()
        .max_priority(Priority::HIGH)
        .and_then(|c| c.default_priority(Priority::HIGH))
        .unwrap();
}
