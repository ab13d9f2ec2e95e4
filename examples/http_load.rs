//! An in-process HTTP load generator for `examples/axum_server.rs`: many
//! unpaced connections on `/bulk` (each sends its next request the moment
//! the last is answered, refused or not, ignoring `Retry-After`) beside a
//! few on `/high`, and the latency of `/high` with and without the bulk
//! load.
//!
//! ```text
//! cargo run --release --example axum_server --features tower,metrics &
//! cargo run --release --example http_load --features tower,metrics -- \
//!     [URL] [BULK_CONNECTIONS] [HIGH_CONNECTIONS] [SECONDS]
//! ```
//!
//! Defaults: `http://127.0.0.1:3000`, 200 bulk, 4 high, 20 seconds per
//! phase. Phase one runs the high connections alone, phase two adds the
//! bulk ones; each prints requests, statuses and `/high` p50/p99, and the
//! last line the p99 ratio (the target is at most 1.5). Needs a quiet
//! machine: other work on the cores moves the numbers more than admission.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

type Statuses = Arc<Mutex<BTreeMap<u16, u64>>>;

/// Sends requests to `url` back to back until `until`; records each
/// latency in `latencies` if given, and every status.
async fn connection(
    url: hyper::Uri,
    until: Instant,
    latencies: Option<Arc<Mutex<Histogram<u64>>>>,
    statuses: Statuses,
) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    while Instant::now() < until {
        let start = Instant::now();
        let status = match client.get(url.clone()).await {
            Ok(response) => {
                let status = response.status().as_u16();
                // Drain the body so the connection is reused.
                let _ = response.into_body().collect().await;
                status
            }
            Err(_) => 0,
        };
        if let Some(latencies) = &latencies {
            let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            latencies
                .lock()
                .expect("not poisoned")
                .saturating_record(micros);
        }
        *statuses
            .lock()
            .expect("not poisoned")
            .entry(status)
            .or_default() += 1;
    }
}

/// One phase: `high` connections on `/high`, `bulk` on `/bulk`; returns
/// the `/high` p99 in microseconds.
async fn phase(base: &str, bulk: usize, high: usize, seconds: u64) -> u64 {
    let until = Instant::now() + Duration::from_secs(seconds);
    let latencies = Arc::new(Mutex::new(
        // Microseconds, up to a minute: a slower answer saturates.
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
    ));
    let (high_statuses, bulk_statuses) = (Statuses::default(), Statuses::default());
    let mut tasks = Vec::new();
    for _ in 0..high {
        let url = format!("{base}/high").parse().expect("a valid URL");
        let (latencies, statuses) = (latencies.clone(), high_statuses.clone());
        tasks.push(tokio::spawn(connection(
            url,
            until,
            Some(latencies),
            statuses,
        )));
    }
    for _ in 0..bulk {
        let url = format!("{base}/bulk").parse().expect("a valid URL");
        tasks.push(tokio::spawn(connection(
            url,
            until,
            None,
            bulk_statuses.clone(),
        )));
    }
    for task in tasks {
        let _ = task.await;
    }
    let latencies = latencies.lock().expect("not poisoned");
    let p99 = latencies.value_at_quantile(0.99);
    println!(
        "bulk {bulk:>4} high {high:>3}: /high p50 {:>6} us p99 {p99:>6} us, /high statuses {:?}, /bulk statuses {:?}",
        latencies.value_at_quantile(0.5),
        high_statuses.lock().expect("not poisoned"),
        bulk_statuses.lock().expect("not poisoned"),
    );
    p99
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:3000".into());
    let mut number = |default: u64| {
        args.next()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    let bulk = number(200) as usize;
    let high = number(4) as usize;
    let seconds = number(20);
    let alone = phase(&base, 0, high, seconds).await;
    let loaded = phase(&base, bulk, high, seconds).await;
    println!(
        "/high p99 under bulk load / alone: {:.2}",
        loaded as f64 / alone.max(1) as f64
    );
}
