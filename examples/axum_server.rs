//! An axum server with admission control in front of its handlers.
//!
//! ```text
//! cargo run --release --example axum_server --features tower,metrics [ADDR]
//! ```
//!
//! Three endpoints compute for about 2 ms each around a 1 ms wait: `/high`
//! (priority user-high), `/normal` and `/bulk` (bulk-normal). All three go through one
//! `AdmissionLayer` over a CPU controller; a caller's own
//! `x-admission-tenant` header and `grpc-timeout` deadline are honoured, and
//! the route decides the priority. Refusals become 429 with `Retry-After`
//! (capacity), 503 (closed) or 504 (deadline). `/metrics` serves the
//! Prometheus text of the `metrics` facade and is not admission-controlled.
//!
//! Drive it with an HTTP load tool from another terminal, for example
//! `oha -z 20s -c 200 http://127.0.0.1:3000/bulk` beside
//! `oha -z 20s -c 4 http://127.0.0.1:3000/high`: bulk requests queue and are
//! refused once they cannot make their deadline, while high-priority ones
//! keep their latency. Watch `admission_requests_total` and
//! `admission_wait_seconds` at `/metrics`.

use std::convert::Infallible;
use std::time::Duration;

use admission::cpu::Controller;
use admission::tower::{rejection_response, AdmissionError, AdmissionLayer, HttpClassifier};
use admission::{EpochLifo, Priority, WorkQueue};
use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::ServiceBuilder;

/// The deadline given to requests that bring none.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// About 2 ms of computation around a 1 ms wait (a stand-in for a database
/// call): the shape of a typical handler.
async fn work() -> &'static str {
    compute(Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    compute(Duration::from_millis(1));
    "done\n"
}

fn compute(how_long: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < how_long {
        std::hint::spin_loop();
    }
}

fn priority_of(path: &str) -> Priority {
    match path {
        "/high" => Priority::USER_HIGH,
        "/bulk" => Priority::BULK_NORMAL,
        _ => Priority::NORMAL,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let controller = Controller::for_runtime(&tokio::runtime::Handle::current())
        .queue(
            WorkQueue::builder()
                .early_rejection(true)
                .elastic_share(0.5)
                .epoch_lifo(EpochLifo::for_deadline(DEFAULT_TIMEOUT)),
        )
        .build()?;
    let classifier = HttpClassifier::new();
    let classify = move |request: &Request| {
        let mut work = classifier.classify(request);
        if work.deadline().is_none() {
            let deadline = work.create_time() + DEFAULT_TIMEOUT;
            work = work.with_deadline(deadline);
        }
        work.with_priority(priority_of(request.uri().path()))
    };

    let admitted = Router::new()
        .route("/high", get(work))
        .route("/normal", get(work))
        .route("/bulk", get(work))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(
                    |error: AdmissionError<Infallible>| async move {
                        match error {
                            AdmissionError::Rejected(error) => {
                                rejection_response::<axum::body::Body>(
                                    &error,
                                    Duration::from_secs(1),
                                )
                            }
                            AdmissionError::Inner(never) => match never {},
                        }
                    },
                ))
                .layer(AdmissionLayer::new(controller.queue().clone(), classify)),
        );
    let queue = controller.queue().clone();
    let app = admitted.route(
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
    axum::serve(listener, app).await?;
    controller.close();
    Ok(())
}
