//! The fleet's three HTTP servers on 127.0.0.1: a frontend that computes
//! a little and then calls two backends in turn, A (a little more) and B
//! (the most: the fleet's bottleneck). Each has a runtime of its own (one
//! worker) and, where the setup admits, the HTTP-mode layer over a CPU
//! controller of its own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission::cpu::{configure_runtime, Controller};
use admission::tower::client::{DownstreamError, Downstreams};
use admission::tower::{current_work, AdmissionLayer, HttpClassifier, PropagateLayer};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::runtime::Runtime;
use tower::retry::RetryLayer;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

/// The header naming the attempt a request belongs to, for the ledger.
pub const ATTEMPT: &str = "x-fleet-attempt";
/// The propagation headers the frontend passes on.
const PRIORITY: &str = "x-admission-priority";
const TIMEOUT: &str = "grpc-timeout";

/// A `grpc-timeout` value as the fleet writes them: whole milliseconds
/// (rounded down, so the receiver never gets more time). gRPC allows other
/// units; the fleet's own client and frontend send only this one, and the
/// admission layer reads them all.
pub fn timeout_value(timeout: Duration) -> String {
    format!("{}m", timeout.as_millis())
}

/// The timeout in a value [`timeout_value`] wrote.
fn parse_timeout(value: &str) -> Option<Duration> {
    let millis = value.strip_suffix('m')?.parse().ok()?;
    Some(Duration::from_millis(millis))
}

/// The three servers, in call order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Frontend = 0,
    A = 1,
    B = 2,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Frontend => "frontend",
            Tier::A => "backend A",
            Tier::B => "backend B",
        }
    }
}

/// Busy-work of a fixed cost, calibrated once: the same CPU per unit
/// whatever else runs (a timed spin would grow with preemption).
#[derive(Clone, Copy, Debug)]
pub struct Spin {
    per_micro: u64,
}

impl Spin {
    /// The fastest of several tries: a try that was preempted (the
    /// machine is shared) reads slow, and a unit sized on it would be
    /// smaller than its nominal cost.
    pub fn calibrate() -> Self {
        let rounds = 200_000;
        let fastest = (0..7)
            .map(|_| {
                let start = Instant::now();
                spin(rounds);
                start.elapsed()
            })
            .min()
            .unwrap_or(Duration::from_millis(1));
        let micros = fastest.as_secs_f64() * 1e6;
        Spin {
            per_micro: ((rounds as f64 / micros.max(1.0)) as u64).max(1),
        }
    }

    /// `micros` of work in chunks of [`CHUNK_MICROS`], yielding to the
    /// runtime between them, as a handler that computes in steps does:
    /// meanwhile other requests reach admission and wait there, in order,
    /// rather than in tokio's run queue, where admission cannot see them.
    /// `done` is told each chunk's µs as it completes: a request dropped
    /// half-way (its caller gave up) has spent what it computed.
    pub async fn run(self, micros: u64, mut done: impl FnMut(u64)) {
        let mut left = micros;
        while left > 0 {
            let chunk = left.min(CHUNK_MICROS);
            spin(self.per_micro.saturating_mul(chunk));
            done(chunk);
            left -= chunk;
            if left > 0 {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// The longest a handler computes without yielding.
const CHUNK_MICROS: u64 = 100;

fn spin(rounds: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..rounds {
        x = std::hint::black_box(x.rotate_left(5) ^ 0xA5A5);
    }
    std::hint::black_box(x);
}

/// Where the servers write the work they did for each attempt, and
/// whether a backend refused the attempt after the frontend (and A) had
/// worked on it. Indexed by attempt id; lock-free.
pub struct Ledger {
    units: Vec<[AtomicU32; 3]>,
    refused_downstream: Vec<AtomicBool>,
}

impl Ledger {
    pub fn new(attempts: usize) -> Self {
        Ledger {
            units: (0..attempts).map(|_| Default::default()).collect(),
            refused_downstream: (0..attempts).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn worked(&self, attempt: Option<usize>, tier: Tier, micros: u64) {
        if let Some(units) = attempt.and_then(|at| self.units.get(at)) {
            units[tier as usize].fetch_add(micros as u32, Ordering::Relaxed);
        }
    }

    fn refused_downstream(&self, attempt: Option<usize>) {
        if let Some(flag) = attempt.and_then(|at| self.refused_downstream.get(at)) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// The work each tier did for `attempt`, in µs of nominal CPU.
    pub fn units(&self, attempt: usize) -> [u64; 3] {
        let units = &self.units[attempt];
        [0, 1, 2].map(|tier| u64::from(units[tier].load(Ordering::Relaxed)))
    }

    pub fn was_refused_downstream(&self, attempt: usize) -> bool {
        self.refused_downstream[attempt].load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.units.len()
    }
}

fn attempt_of(headers: &HeaderMap) -> Option<usize> {
    headers.get(ATTEMPT)?.to_str().ok()?.parse().ok()
}

/// One server: its runtime, and where it listens.
pub struct Server {
    pub address: SocketAddr,
    runtime: Runtime,
}

impl Server {
    fn start(name: &str, app: impl FnOnce(&Runtime) -> Router) -> Server {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        configure_runtime(&mut builder);
        let runtime = builder
            .worker_threads(1)
            .thread_name(format!("fleet-{name}"))
            .enable_all()
            .build()
            .expect("a runtime");
        let router = app(&runtime);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a loopback port");
        let address = listener.local_addr().expect("an address");
        runtime.spawn(async move { axum::serve(listener, router).await });
        Server { address, runtime }
    }

    pub fn stop(self) {
        self.runtime.shutdown_background();
    }
}

/// The layer of a server that admits: over a controller of its own
/// runtime, believing the propagation headers (every caller is the
/// fleet's own, on loopback).
fn admission(
    runtime: &Runtime,
    slo: Duration,
) -> admission::tower::HttpAdmissionLayer<HttpClassifier> {
    let controller = Controller::for_runtime(runtime.handle())
        .build()
        .expect("a controller");
    let classifier = HttpClassifier::new()
        .trust_all()
        .default_timeout(slo)
        .expect("a timeout");
    AdmissionLayer::for_controller(controller, classifier).http()
}

/// A backend: `micros` of work per request, behind admission or not.
pub fn backend(
    tier: Tier,
    micros: u64,
    admits: bool,
    slo: Duration,
    spin: Spin,
    ledger: Arc<Ledger>,
) -> Server {
    Server::start(tier.name(), |runtime| {
        let handler = move |request: Request| {
            let ledger = ledger.clone();
            async move {
                let attempt = attempt_of(request.headers());
                spin.run(micros, |chunk| ledger.worked(attempt, tier, chunk))
                    .await;
                StatusCode::OK
            }
        };
        let routes = Router::new().route("/work", get(handler));
        if admits {
            routes.route_layer(admission(runtime, slo))
        } else {
            routes
        }
    })
}

type Outbound =
    BoxCloneSyncService<http::Request<Full<Bytes>>, http::Response<hyper::body::Incoming>, String>;

/// How the frontend calls the backends.
pub struct FrontendSetup {
    pub admits: bool,
    /// The whole loop: the backends' levels learned and checked before any
    /// work, throttling, the retry policy, the slot given back during
    /// calls, and the backends' levels reported upstream.
    pub downstreams: Option<Downstreams>,
}

/// The frontend: `micros` of work, then a call to A, then one to B.
pub fn frontend(
    setup: FrontendSetup,
    micros: u64,
    backends: [SocketAddr; 2],
    slo: Duration,
    spin: Spin,
    ledger: Arc<Ledger>,
) -> Server {
    Server::start(Tier::Frontend.name(), |runtime| {
        let transport: Client<HttpConnector, Full<Bytes>> = {
            let _inside = runtime.enter();
            Client::builder(TokioExecutor::new()).build_http()
        };
        let outbound: Outbound = match &setup.downstreams {
            Some(downstreams) => BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .map_err(
                        |error: DownstreamError<hyper_util::client::legacy::Error>| {
                            error.to_string()
                        },
                    )
                    .layer(RetryLayer::new(downstreams.retry_policy()))
                    .layer(downstreams.layer())
                    .layer(PropagateLayer)
                    .service(transport),
            ),
            None => BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .map_err(|error: hyper_util::client::legacy::Error| error.to_string())
                    .service(transport),
            ),
        };
        let downstreams = setup.downstreams.clone();
        let handler = move |request: Request| {
            let (outbound, ledger, downstreams) =
                (outbound.clone(), ledger.clone(), downstreams.clone());
            async move {
                serve_frontend(
                    request,
                    outbound,
                    backends,
                    downstreams,
                    micros,
                    spin,
                    &ledger,
                )
                .await
            }
        };
        let routes = Router::new().route("/", get(handler));
        if !setup.admits {
            return routes;
        }
        let mut layer = admission(runtime, slo);
        if let Some(downstreams) = &setup.downstreams {
            layer = layer.report_downstream_levels(downstreams);
        }
        routes.route_layer(layer)
    })
}

fn refused() -> Response {
    let mut response = StatusCode::SERVICE_UNAVAILABLE.into_response();
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

async fn serve_frontend(
    request: Request,
    outbound: Outbound,
    backends: [SocketAddr; 2],
    downstreams: Option<Downstreams>,
    micros: u64,
    spin: Spin,
    ledger: &Ledger,
) -> Response {
    let arrived = tokio::time::Instant::now();
    let headers = request.headers();
    let attempt = attempt_of(headers);
    // The whole loop: work the backends would refuse is refused before any
    // of the frontend's own.
    if let (Some(downstreams), Some(work)) = (&downstreams, current_work()) {
        let below = backends.iter().any(|backend| {
            downstreams
                .level(&backend.to_string())
                .is_some_and(|level| work.priority() < level)
        });
        if below {
            return refused();
        }
    }
    // Half the frontend's work before the calls, half on A's answer.
    let half = micros / 2;
    spin.run(micros - half, |chunk| {
        ledger.worked(attempt, Tier::Frontend, chunk)
    })
    .await;
    // What the caller asked, passed on (the whole loop's PropagateLayer
    // stamps the same from the admitted request).
    let priority = headers.get(PRIORITY).cloned();
    let timeout = headers
        .get(TIMEOUT)
        .and_then(|value| value.to_str().ok())
        .and_then(parse_timeout);
    let attempt_header = headers.get(ATTEMPT).cloned();
    for (index, backend) in backends.into_iter().enumerate() {
        let last = index + 1 == backends.len();
        if last {
            // Only waiting is left: the slot goes back for good (the
            // whole loop's client layer gives it back during the call to
            // A, and takes it again for the work on A's answer).
            admission::tower::release_slot();
        }
        let mut call = http::Request::get(format!("http://{backend}/work"));
        if let Some(priority) = &priority {
            call = call.header(PRIORITY, priority);
        }
        if let Some(timeout) = timeout {
            let left = timeout.saturating_sub(arrived.elapsed());
            call = call.header(TIMEOUT, timeout_value(left));
        }
        if let Some(attempt) = &attempt_header {
            call = call.header(ATTEMPT, attempt);
        }
        let call = call.body(Full::new(Bytes::new())).expect("a request");
        match outbound.clone().oneshot(call).await {
            Ok(answer) if answer.status() == StatusCode::OK => {}
            Ok(_) | Err(_) => {
                ledger.refused_downstream(attempt);
                return refused();
            }
        }
        if !last {
            spin.run(half, |chunk| ledger.worked(attempt, Tier::Frontend, chunk))
                .await;
        }
    }
    Response::new(Body::from("ok"))
}
