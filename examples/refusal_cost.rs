//! What one refusal costs, end to end through the HTTP-mode layer, beside
//! the same request served without admission.
//!
//! ```text
//! cargo run --release --example refusal_cost --features tower [ITERATIONS]
//! ```
//!
//! An unpaced client that ignores `Retry-After` sends again as soon as it is
//! refused, so under overload the server's CPU goes to refusals: a refusal
//! must cost no more than serving a trivial request. The rows, each the
//! mean over `ITERATIONS` calls (default 200,000) on one thread, with heap
//! allocations per call counted by an instrumented allocator:
//!
//! * `decision`: the queue's refusal alone (`WorkQueue::admit` on a full
//!   queue, polled once);
//! * `baseline`: an axum router answering `"ok"` without admission;
//! * `admitted`: the same router behind the layer, with free slots;
//! * `refused`: the same router behind the layer, the queue full, with
//!   refusal pacing off (its hold is a deliberate wait, not a cost) and
//!   no report headers;
//! * `+level`: the same refusal with the admission level header (the
//!   layer's default, `x-admission-level`);
//! * `+load`: the same with load reports on (`endpoint-load-metrics`,
//!   opt-in), for a request that does not ask for one;
//! * `+asked`: the same for a request that asks (ORCA's per-request
//!   `endpoint-load-metrics-format`), which gets the report; its share is
//!   against the same asking request refused without reports.
//!
//! The last lines are the ratio refused / baseline and what each header
//! adds to the refusal path, as a share of `refused`, beside the floor of
//! any two headers on such a response whatever computes them: a refusal's
//! header map built as the layer builds it, with and without two fixed
//! values of the same names inserted. The `refused`, `+level`, `+load` and
//! `+asked` rows and the floor run interleaved, in rounds (their rows are medians
//! over the rounds, the shares medians of each round's ratio), so that a
//! machine's drift lands on all of them alike. Compare rows of one run,
//! not runs across machines.

use futures::FutureExt;
use std::future::Future;
use std::hint::black_box;
use std::time::{Duration, Instant};

use admission::tower::{AdmissionLayer, HttpClassifier, LEVEL_HEADER, LOAD_HEADER, REASON_HEADER};
use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, HeaderValue, Request};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::{Service, ServiceExt};

/// A load report as long as the layer's, for the floor.
const FIXED_LOAD: &str = "TEXT named_metrics.in_flight=64,named_metrics.queue_length=0";
const LEVEL: HeaderName = HeaderName::from_static(LEVEL_HEADER);
const LOAD: HeaderName = HeaderName::from_static(LOAD_HEADER);
const REASON: HeaderName = HeaderName::from_static(REASON_HEADER);

/// A refusal's answer as the layer builds it (a 503, its reason and
/// `Retry-After`), with two fixed headers of the reports' names or not.
fn answer(reports: bool) -> http::Response<Body> {
    let mut response = http::Response::new(Body::empty());
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(REASON, HeaderValue::from_static("queue_full"));
    headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    if reports {
        headers.insert(LEVEL, HeaderValue::from_static("0"));
        headers.insert(LOAD, HeaderValue::from_static(FIXED_LOAD));
    }
    response
}

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Mean nanoseconds and allocations per call of `call`, outside any
/// runtime (so that tokio's cooperative budget does not interleave yields).
fn measure_sync(iterations: u32, mut call: impl FnMut()) -> (f64, f64) {
    for _ in 0..iterations / 10 {
        call();
    }
    let region = Region::new(GLOBAL);
    let start = Instant::now();
    for _ in 0..iterations {
        call();
    }
    let elapsed = start.elapsed();
    let allocations = region.change().allocations;
    (
        elapsed.as_nanos() as f64 / f64::from(iterations),
        allocations as f64 / f64::from(iterations),
    )
}

/// Mean nanoseconds and allocations per call of `call`.
async fn measure<F: Future<Output = ()>>(
    iterations: u32,
    mut call: impl FnMut() -> F,
) -> (f64, f64) {
    // Warm up: first-time growth of tables and caches is not per call.
    for _ in 0..iterations / 10 {
        call().await;
    }
    let region = Region::new(GLOBAL);
    let start = Instant::now();
    for _ in 0..iterations {
        call().await;
    }
    let elapsed = start.elapsed();
    let allocations = region.change().allocations;
    (
        elapsed.as_nanos() as f64 / f64::from(iterations),
        allocations as f64 / f64::from(iterations),
    )
}

fn request() -> Request<Body> {
    Request::get("/")
        .body(Body::empty())
        .expect("a valid request")
}

/// A request that asks for a load report (ORCA's per-request header).
fn asking_request() -> Request<Body> {
    Request::get("/")
        .header(
            HeaderName::from_static("endpoint-load-metrics-format"),
            HeaderValue::from_static("TEXT"),
        )
        .body(Body::empty())
        .expect("a valid request")
}

/// A queue with no slots whose one waiting place is taken: every request
/// is refused at once.
fn full_queue() -> (WorkQueue, impl Future) {
    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(1)
        .build()
        .expect("valid settings");
    let mut waiter = Box::pin(queue.admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)));
    assert!(waiter.as_mut().now_or_never().is_none());
    (queue, waiter)
}

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000);
    let (queue, waiter) = full_queue();
    let work = WorkInfo::new(TenantId::new(7), Priority::NORMAL);
    let decision = measure_sync(iterations, || {
        let refused = queue.admit(black_box(work.clone())).now_or_never();
        assert!(matches!(refused, Some(Err(_))));
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(serve(iterations, queue, decision));
    drop(waiter);
}

async fn serve(iterations: u32, queue: WorkQueue, decision: (f64, f64)) {
    let routes = || Router::new().route("/", get(|| async { "ok" }));

    let mut baseline = routes();
    let baseline = measure(iterations, || {
        let call = baseline.call(request());
        async move {
            black_box(call.await.expect("infallible"));
        }
    })
    .await;

    let open = WorkQueue::new(1 << 20).expect("valid settings");
    let mut admitted =
        routes().route_layer(AdmissionLayer::new(open, HttpClassifier::new()).http());
    let admitted = measure(iterations, || {
        let call = admitted.call(request());
        async move {
            black_box(call.await.expect("infallible"));
        }
    })
    .await;

    // Pacing (the layer's default) holds each refusal's answer on purpose:
    // a wait, not CPU spent. The cost of a refusal is measured without it.
    let refusing = |level: bool, load: bool| {
        routes().route_layer(
            AdmissionLayer::new(queue.clone(), HttpClassifier::new())
                .http()
                .pace_refusals(Duration::ZERO)
                .admission_level_header(level)
                .load_reports(load),
        )
    };
    // (level header, load reports on, the request asks for one)
    // The last is the asking request's own refusal without reports, which
    // the report answering it is measured against.
    const VARIANTS: [(bool, bool, bool); 5] = [
        (false, false, false),
        (true, false, false),
        (true, true, false),
        (true, true, true),
        (true, false, true),
    ];
    let mut variants = VARIANTS.map(|(level, load, _)| refusing(level, load));
    let request_of = |asks: bool| if asks { asking_request() } else { request() };
    for (variant, (level, load, asks)) in variants.iter_mut().zip(VARIANTS) {
        let probe = variant
            .clone()
            .oneshot(request_of(asks))
            .await
            .expect("infallible");
        assert_eq!(probe.status(), 503, "the queue refuses");
        let headers = probe.headers();
        let carried = (
            headers.contains_key(LEVEL_HEADER),
            headers.contains_key(LOAD_HEADER),
        );
        assert_eq!(carried, (level, load && asks));
    }
    // Rounds of each variant in turn: each row is the median over its
    // rounds, and each header's share is the median of its ratio to the
    // bare refusal within a round, so that drift (another process taking
    // the core for a while) lands on both sides of each ratio.
    const ROUNDS: u32 = 40;
    let mut rounds: Vec<[(f64, f64); 5]> = Vec::new();
    let mut floors: Vec<f64> = Vec::new();
    for _ in 0..ROUNDS {
        let mut round = [(0.0, 0.0); 5];
        for ((variant, row), (_, _, asks)) in
            variants.iter_mut().zip(round.iter_mut()).zip(VARIANTS)
        {
            *row = measure(iterations / ROUNDS, || {
                let call = variant.call(request_of(asks));
                async move {
                    black_box(call.await.expect("infallible"));
                }
            })
            .await;
        }
        // The floor of any two headers: the refusal's own header map,
        // with and without two fixed values of the same names inserted.
        let bare = measure_sync(iterations / ROUNDS, || drop(black_box(answer(false))));
        let two = measure_sync(iterations / ROUNDS, || drop(black_box(answer(true))));
        floors.push((two.0 - bare.0) / round[0].0);
        rounds.push(round);
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let row = |at: usize| {
        (
            median(rounds.iter().map(|round| round[at].0).collect()),
            median(rounds.iter().map(|round| round[at].1).collect()),
        )
    };
    let share_of = |at: usize, of: usize| {
        median(
            rounds
                .iter()
                .map(|round| round[at].0 / round[of].0 - 1.0)
                .collect(),
        )
    };
    let share = |at: usize| share_of(at, 0);
    let (refused, level, load, asked) = (row(0), row(1), row(2), row(3));

    println!("{:<10} {:>10} {:>12}", "row", "ns/call", "allocs/call");
    for (name, (nanos, allocations)) in [
        ("decision", decision),
        ("baseline", baseline),
        ("admitted", admitted),
        ("refused", refused),
        ("+level", level),
        ("+load", load),
        ("+asked", asked),
    ] {
        println!("{name:<10} {nanos:>10.0} {allocations:>12.2}");
    }
    println!("refused / baseline: {:.2}", refused.0 / baseline.0);
    println!(
        "level header: {:+.1}% of a refusal; with load reports on, a request that does not \
         ask: {:+.1}%; the report that answers a request that asks: {:+.1}% of its refusal; two fixed headers: {:+.1}% \
         (medians of {ROUNDS} paired rounds)",
        100.0 * share(1),
        100.0 * share(2),
        100.0 * share_of(3, 4),
        100.0 * median(floors)
    );
}
