//! An axum server with admission control in front of its handlers.
//!
//! ```text
//! cargo run --release --example axum_server --features tower,metrics [ADDR]
//! ```
//!
//! Three endpoints compute for about 2 ms each around a 1 ms wait, giving
//! their slot back for the wait (`admission::tower::release_during`): `/high`
//! (priority user-high), `/normal` and `/bulk` (bulk-normal). All three go
//! through one HTTP-mode `AdmissionLayer` that owns a CPU controller.
//! Callers on loopback are trusted: their `x-admission-priority`,
//! `x-admission-tenant` and `grpc-timeout` headers are honoured; anyone else
//! gets the route's priority (or lower, if asked), the system tenant, and at
//! most the default 100 ms deadline. Refusals are 503 with `Retry-After`
//! from the queue's wait estimate and the reason in `x-admission-reason`.
//! `/metrics` serves the Prometheus text of the `metrics` facade and is not
//! admission-controlled (nor are unknown paths: the layer is a
//! `route_layer`).
//!
//! Drive it with an HTTP load tool from another terminal, for example
//! `oha -z 20s -c 200 http://127.0.0.1:3000/bulk` beside
//! `oha -z 20s -c 4 http://127.0.0.1:3000/high`, or with the in-process
//! generator `cargo run --release --example http_load --features
//! tower,metrics` (see there): bulk requests queue and are refused once
//! they cannot make their deadline, while high-priority ones keep their
//! latency. Watch `admission_requests_total` and `admission_wait_seconds`
//! at `/metrics`.

use std::net::SocketAddr;
use std::time::Duration;

use admission::cpu::Controller;
use admission::tower::{AdmissionLayer, HttpClassifier};
use admission::{EpochLifo, Priority, WorkQueue};
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// The deadline given to requests that bring none, and the longest an
/// untrusted caller may ask for.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// Bucket bounds of `admission_wait_seconds`: from the fast path's zero to
/// past the default deadline, so that the histogram can be aggregated
/// across instances (without buckets the exporter writes a summary).
const WAIT_BUCKETS: &[f64] = &[
    0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
];

/// About 2 ms of computation around a 1 ms wait (a stand-in for a database
/// call): the shape of a typical handler. The slot is given back for the
/// wait, so that other requests compute meanwhile and the second half is
/// admitted in order again; refused then (its deadline passed meanwhile),
/// the request is answered as any refusal is.
async fn work() -> Result<&'static str, (StatusCode, &'static str)> {
    compute(Duration::from_millis(1));
    let ((), admitted) =
        admission::tower::release_during(tokio::time::sleep(Duration::from_millis(1))).await;
    if admitted.is_err() {
        return Err((StatusCode::SERVICE_UNAVAILABLE, "overloaded\n"));
    }
    compute(Duration::from_millis(1));
    Ok("done\n")
}

fn compute(how_long: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < how_long {
        std::hint::spin_loop();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("admission_wait_seconds".into()), WAIT_BUCKETS)?
        .install_recorder()?;

    let controller = Controller::for_runtime(&tokio::runtime::Handle::current())
        .queue(
            WorkQueue::builder()
                .name("http")
                .early_rejection(true)
                .elastic_share(0.5)
                .newcomers_start_behind(true)
                .epoch_lifo(EpochLifo::for_deadline(DEFAULT_TIMEOUT)),
        )
        .build()?;
    let classifier = HttpClassifier::new()
        .default_timeout(DEFAULT_TIMEOUT)?
        .route("/high", Priority::USER_HIGH)
        .route("/bulk", Priority::BULK_NORMAL)
        .trust(|caller| {
            caller
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback())
        });
    let admission = AdmissionLayer::for_controller(controller, classifier).http();
    let queue = admission.admission().queue().clone();

    let app = Router::new()
        .route("/high", get(work))
        .route("/normal", get(work))
        .route("/bulk", get(work))
        .route_layer(admission)
        .route(
            "/metrics",
            get(move || {
                let (queue, prometheus) = (queue.clone(), prometheus.clone());
                async move {
                    queue.record_metrics();
                    prometheus.render()
                }
            }),
        );

    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
