//! The most common web service there is, under overload, as a user would
//! first write it: an axum service whose handlers compute, wait on a
//! database, and compute again, behind the admission layer's defaults, with
//! no annotation in the handlers.
//!
//! ```text
//! cargo run --release --example io_service --features tower,axum [-- --seconds 15]
//! ```
//!
//! Each handler parses (150 µs of CPU in 50 µs chunks with `yield_now`
//! between them), waits on a database (a 1 ms timer), and renders (150 µs
//! the same way). The service runs on a two-worker tokio runtime; the load
//! comes from closed-loop HTTP/1.1 connections over loopback on a runtime
//! of its own, in the same process: 200 on `/bulk` (priority user-low)
//! beside 4 on `/high` (user-high), each sending its next request the
//! moment the last is answered. Requests carry no headers, so the
//! classifier gives every one the default deadline of 100 ms.
//!
//! One run serves four configurations on fresh runtimes, side by side:
//!
//! * `no admission`: the router alone;
//! * `admission defaults`:
//!   `AdmissionLayer::for_controller(Controller::for_runtime(..).build()?, classifier).http()`,
//!   the handlers unannotated;
//! * `admission + release_during`: the same, with the database wait inside
//!   `admission::tower::release_during`;
//! * `/high alone`: the 4 high connections and nothing else, through the
//!   defaults: what the machine gives the high class without the bulk load.
//!
//! For each it prints the machine's CPU use (from `/proc/stat`, client
//! included, as `wrk` on the same cores would be), the service's workers'
//! busy share, each route's answers per second and latency, how bulk
//! requests were refused (503 at once, or 504 after the whole deadline),
//! and the controller's mean slot total; then how the defaults compare with
//! the other rows. `--quick` (used by the example's test) runs each row for
//! a second with fewer connections and checks only directions.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admission::cpu::Controller;
use admission::tower::{AdmissionLayer, HttpClassifier};
use admission::Priority;
use axum::routing::get;
use axum::Router;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The deadline every request gets from the classifier.
const DEADLINE: Duration = Duration::from_millis(100);
/// CPU before and after the wait, in chunks with `yield_now` between them.
const PHASE: Duration = Duration::from_micros(150);
const CHUNK: Duration = Duration::from_micros(50);
/// The database call.
const WAIT: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    NoAdmission,
    Defaults,
    ReleaseDuring,
    HighAlone,
}

impl Setup {
    const ALL: [Setup; 4] = [
        Setup::NoAdmission,
        Setup::Defaults,
        Setup::ReleaseDuring,
        Setup::HighAlone,
    ];

    fn name(self) -> &'static str {
        match self {
            Setup::NoAdmission => "no admission",
            Setup::Defaults => "admission defaults",
            Setup::ReleaseDuring => "admission + release_during",
            Setup::HighAlone => "/high alone",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Load {
    seconds: f64,
    bulk_connections: usize,
    high_connections: usize,
}

impl Load {
    const FULL: Load = Load {
        seconds: 15.0,
        bulk_connections: 200,
        high_connections: 4,
    };
    const QUICK: Load = Load {
        seconds: 1.0,
        bulk_connections: 50,
        high_connections: 4,
    };
}

/// Spins for `how_long` of CPU in chunks, yielding to tokio between them,
/// as tokio's docs teach for work of this length.
async fn compute(how_long: Duration) {
    let mut left = how_long;
    while !left.is_zero() {
        let chunk = left.min(CHUNK);
        let start = Instant::now();
        while start.elapsed() < chunk {
            std::hint::spin_loop();
        }
        left -= chunk;
        tokio::task::yield_now().await;
    }
}

/// The handler: parse, the database, render.
async fn handle(release_for_the_wait: bool) -> Result<&'static str, axum::http::StatusCode> {
    compute(PHASE).await;
    if release_for_the_wait {
        let ((), admitted) = admission::tower::release_during(tokio::time::sleep(WAIT)).await;
        if admitted.is_err() {
            return Err(axum::http::StatusCode::SERVICE_UNAVAILABLE);
        }
    } else {
        tokio::time::sleep(WAIT).await;
    }
    compute(PHASE).await;
    Ok("ok\n")
}

/// One route's answers, as the clients saw them.
#[derive(Debug)]
struct RouteStats {
    latency: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    /// Refusals (any status but 200) answered after the whole deadline.
    refused_after_deadline: u64,
}

impl RouteStats {
    fn new() -> Self {
        RouteStats {
            // Microseconds, up to a minute.
            latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            statuses: BTreeMap::new(),
            refused_after_deadline: 0,
        }
    }

    fn answers(&self) -> u64 {
        self.statuses.values().sum()
    }

    fn status(&self, code: u16) -> u64 {
        self.statuses.get(&code).copied().unwrap_or(0)
    }

    fn share(&self, count: u64) -> f64 {
        count as f64 / self.answers().max(1) as f64
    }

    fn p(&self, quantile: f64) -> Duration {
        Duration::from_micros(self.latency.value_at_quantile(quantile))
    }
}

/// What one configuration measured.
#[derive(Debug)]
struct RowResult {
    setup: Setup,
    seconds: f64,
    machine_busy: f64,
    workers_busy: f64,
    high: RouteStats,
    bulk: RouteStats,
    mean_total: Option<f64>,
}

impl RowResult {
    fn per_second(&self, count: u64) -> f64 {
        count as f64 / self.seconds
    }
}

/// Busy and total jiffies of the whole machine, from `/proc/stat`.
fn machine_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = cpu
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = fields.get(3).copied()? + fields.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

async fn connection(
    url: hyper::Uri,
    until: Instant,
    measuring: Arc<AtomicBool>,
    stats: Arc<Mutex<RouteStats>>,
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
        let took = start.elapsed();
        if !measuring.load(Ordering::Relaxed) {
            continue;
        }
        let mut stats = stats.lock().expect("not poisoned");
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        stats.latency.saturating_record(micros);
        *stats.statuses.entry(status).or_default() += 1;
        if status != 200 && took >= DEADLINE {
            stats.refused_after_deadline += 1;
        }
    }
}

fn run(setup: Setup, load: Load) -> Result<RowResult, Box<dyn std::error::Error>> {
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;

    let release = setup == Setup::ReleaseDuring;
    let router = Router::new()
        .route("/high", get(move || handle(release)))
        .route("/bulk", get(move || handle(release)));
    let mut queue = None;
    let router = if setup == Setup::NoAdmission {
        router
    } else {
        let controller = Controller::for_runtime(server.handle()).build()?;
        let classifier = HttpClassifier::new()
            .default_timeout(DEADLINE)?
            .route("/high", Priority::USER_HIGH)
            .route("/bulk", Priority::USER_LOW);
        let layer = AdmissionLayer::for_controller(controller, classifier).http();
        queue = Some(layer.admission().queue().clone());
        router.route_layer(layer)
    };
    let listener = server.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let address: SocketAddr = listener.local_addr()?;
    server.spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    // Warm up for a fifth of the run (at least half a second), then measure.
    let warm_up = Duration::from_secs_f64((load.seconds / 5.0).max(0.5));
    let measured = Duration::from_secs_f64(load.seconds);
    let until = Instant::now() + warm_up + measured;
    let measuring = Arc::new(AtomicBool::new(false));
    let (high, bulk) = (
        Arc::new(Mutex::new(RouteStats::new())),
        Arc::new(Mutex::new(RouteStats::new())),
    );
    let bulk_connections = if setup == Setup::HighAlone {
        0
    } else {
        load.bulk_connections
    };
    let mut tasks = Vec::new();
    for (route, stats, count) in [
        ("high", &high, load.high_connections),
        ("bulk", &bulk, bulk_connections),
    ] {
        for _ in 0..count {
            let url: hyper::Uri = format!("http://{address}/{route}").parse()?;
            tasks.push(client.spawn(connection(url, until, measuring.clone(), stats.clone())));
        }
    }

    // The controller's total, sampled every millisecond while measuring.
    let sampling = Arc::new(AtomicBool::new(true));
    let (total_sum, samples) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = queue.map(|queue| {
        let (sampling, total_sum, samples, measuring) = (
            sampling.clone(),
            total_sum.clone(),
            samples.clone(),
            measuring.clone(),
        );
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                if measuring.load(Ordering::Relaxed) {
                    total_sum.fetch_add(queue.granter_snapshot().total, Ordering::Relaxed);
                    samples.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    });

    std::thread::sleep(warm_up);
    let metrics = server.metrics();
    let busy = |m: &tokio::runtime::RuntimeMetrics| -> Duration {
        (0..m.num_workers())
            .map(|w| m.worker_total_busy_duration(w))
            .sum()
    };
    let (busy_before, jiffies_before, started) =
        (busy(&metrics), machine_jiffies(), Instant::now());
    measuring.store(true, Ordering::Relaxed);
    std::thread::sleep(measured);
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let (busy_after, jiffies_after) = (busy(&metrics), machine_jiffies());
    sampling.store(false, Ordering::Relaxed);
    if let Some(sampler) = sampler {
        let _ = sampler.join();
    }
    client.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
    });
    drop(client);
    server.shutdown_timeout(Duration::from_secs(1));

    let machine_busy = match (jiffies_before, jiffies_after) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
        _ => f64::NAN,
    };
    let workers_busy = (busy_after - busy_before).as_secs_f64() / (elapsed.as_secs_f64() * 2.0);
    let samples = samples.load(Ordering::Relaxed);
    let take = |stats: Arc<Mutex<RouteStats>>| {
        Arc::try_unwrap(stats)
            .expect("every connection has finished")
            .into_inner()
            .expect("not poisoned")
    };
    Ok(RowResult {
        setup,
        seconds: elapsed.as_secs_f64(),
        machine_busy,
        workers_busy,
        high: take(high),
        bulk: take(bulk),
        mean_total: (samples > 0)
            .then(|| total_sum.load(Ordering::Relaxed) as f64 / samples as f64),
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn print_table(rows: &[RowResult]) {
    println!(
        "| configuration | machine CPU busy | service workers busy | /high req/s | /high p50 / p99 ms \
         | /bulk 200/s | /bulk p50 ms | /bulk 503 | /bulk 504 | /bulk refused after the whole deadline \
         | mean slot total |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let bulk = &row.bulk;
        let has_bulk = bulk.answers() > 0;
        let or_blank = |s: String| if has_bulk { s } else { String::new() };
        println!(
            "| {} | {:.0}% | {:.0}% | {:.0} | {} / {} | {} | {} | {} | {} | {} | {} |",
            row.setup.name(),
            row.machine_busy * 100.0,
            row.workers_busy * 100.0,
            row.per_second(row.high.status(200)),
            ms(row.high.p(0.5)),
            ms(row.high.p(0.99)),
            or_blank(format!("{:.0}", row.per_second(bulk.status(200)))),
            or_blank(ms(bulk.p(0.5))),
            or_blank(format!("{:.1}%", bulk.share(bulk.status(503)) * 100.0)),
            or_blank(format!("{:.1}%", bulk.share(bulk.status(504)) * 100.0)),
            or_blank(format!(
                "{:.1}%",
                bulk.share(bulk.refused_after_deadline) * 100.0
            )),
            row.mean_total
                .map(|t| format!("{t:.1}"))
                .unwrap_or_default(),
        );
    }
}

/// How the defaults compare with the other rows of the same run.
#[derive(Debug)]
struct Comparison {
    /// Machine CPU busy, defaults minus no admission, in points.
    busy_points: f64,
    /// /high and /bulk answered 200 per second, defaults over release_during.
    served_vs_released: f64,
    /// /high p99, defaults over /high alone.
    high_p99_vs_alone: f64,
    /// /high p99, defaults over no admission.
    high_p99_vs_none: f64,
    /// The share of /bulk answered after its whole deadline, defaults.
    bulk_after_deadline: f64,
}

fn compare(rows: &[RowResult]) -> Comparison {
    let row = |setup| {
        rows.iter()
            .find(|r| r.setup == setup)
            .expect("every setup ran")
    };
    let (none, defaults, released, alone) = (
        row(Setup::NoAdmission),
        row(Setup::Defaults),
        row(Setup::ReleaseDuring),
        row(Setup::HighAlone),
    );
    let served = |r: &RowResult| r.per_second(r.high.status(200) + r.bulk.status(200));
    let p99 = |r: &RowResult| r.high.p(0.99).as_secs_f64();
    Comparison {
        busy_points: (defaults.machine_busy - none.machine_busy) * 100.0,
        served_vs_released: served(defaults) / served(released).max(f64::MIN_POSITIVE),
        high_p99_vs_alone: p99(defaults) / p99(alone).max(f64::MIN_POSITIVE),
        high_p99_vs_none: p99(defaults) / p99(none).max(f64::MIN_POSITIVE),
        bulk_after_deadline: defaults.bulk.share(defaults.bulk.refused_after_deadline),
    }
}

fn run_all(load: Load) -> Result<Vec<RowResult>, Box<dyn std::error::Error>> {
    Setup::ALL.iter().map(|&setup| run(setup, load)).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut load = Load::FULL;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => load = Load::QUICK,
            "--seconds" => {
                load.seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or("--seconds takes a positive number")?;
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    println!(
        "{} closed-loop connections on /bulk beside {} on /high, {:.0} s a configuration, \
         a two-worker service runtime",
        load.bulk_connections, load.high_connections, load.seconds
    );
    let rows = run_all(load)?;
    print_table(&rows);
    let c = compare(&rows);
    println!();
    println!(
        "defaults against the same run's other rows: machine CPU busy {:+.1} points from no \
         admission (target: within 10); /high and /bulk served {:.2}x release_during's \
         (target: at least 0.90); /high p99 {:.2}x alone (target: at most 1.25) and {:.2}x \
         no admission's; /bulk answered after its whole deadline {:.1}% (target: at most 5%)",
        c.busy_points,
        c.served_vs_released,
        c.high_p99_vs_alone,
        c.high_p99_vs_none,
        c.bulk_after_deadline * 100.0
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run of every configuration, checking directions only: the
    /// admission layer keeps the high class's tail below what it is without
    /// admission, and serves it more often.
    #[test]
    fn quick_run_points_the_right_way() {
        let rows = run_all(Load::QUICK).expect("every configuration runs");
        print_table(&rows);
        let c = compare(&rows);
        assert!(
            c.high_p99_vs_none < 1.0,
            "admission should shorten /high's tail: {c:?}"
        );
        for row in &rows {
            assert!(
                row.high.status(200) > 0,
                "{} served /high",
                row.setup.name()
            );
        }
    }
}
