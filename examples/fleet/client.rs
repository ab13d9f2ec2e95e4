//! The open-loop client: a seeded Poisson schedule of three priority
//! classes through a steady load, a 3x spike and back, each request sent
//! at its planned time whatever happened to the ones before (latency runs
//! from that time: no coordinated omission). Naive callers retry a refused
//! or timed-out attempt at once, up to three times; the whole loop's
//! caller goes through `admission::tower::client`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use admission::tower::client::{DownstreamError, Downstreams};
use admission::Priority;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp};
use tokio::time::Instant;
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};

use crate::servers::ATTEMPT;

/// The classes: name, priority, share of the requests.
pub const CLASSES: [(&str, Priority, f64); 3] = [
    ("high", Priority::USER_HIGH, 0.2),
    ("normal", Priority::NORMAL, 0.3),
    ("low", Priority::USER_LOW, 0.5),
];

/// Attempt ids per request: the first and three retries.
pub const ATTEMPTS: usize = 4;

/// The load over time, as multiples of the fleet's nominal capacity:
/// after the warm-up, `spikes` times `before` at the steady load and then
/// `spike` at the spike's, and `after` at the steady load again.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    pub warmup: Duration,
    pub before: Duration,
    pub spike: Duration,
    pub after: Duration,
    pub steady_load: f64,
    pub spike_load: f64,
    pub spikes: u32,
}

impl Phases {
    /// One stretch at the steady load and the spike after it.
    fn cycle(&self) -> Duration {
        self.before + self.spike
    }

    /// When spike `k` (from 0) begins.
    pub fn spike_start_of(&self, k: u32) -> Duration {
        self.warmup + self.before + self.cycle() * k
    }

    /// When the first spike begins.
    pub fn spike_start(&self) -> Duration {
        self.spike_start_of(0)
    }

    /// When the first spike ends.
    pub fn spike_end(&self) -> Duration {
        self.spike_start() + self.spike
    }

    pub fn length(&self) -> Duration {
        self.warmup + self.cycle() * self.spikes + self.after
    }

    fn load_at(&self, at: Duration) -> f64 {
        let Some(since) = at.checked_sub(self.warmup) else {
            return self.steady_load;
        };
        let cycle = self.cycle().as_nanos().max(1);
        let k = since.as_nanos() / cycle;
        let into = since.as_nanos() % cycle;
        if k < u128::from(self.spikes) && into >= self.before.as_nanos() {
            self.spike_load
        } else {
            self.steady_load
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Planned {
    pub at: Duration,
    pub class: usize,
}

/// The planned requests, time-ordered: Poisson arrivals at the phase's
/// rate (capacity × load), each of a class drawn by share.
pub fn schedule(phases: &Phases, capacity: f64, seed: u64) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    let mut at = 0.0;
    let length = phases.length().as_secs_f64();
    loop {
        let rate = capacity * phases.load_at(Duration::from_secs_f64(at));
        let gap = Exp::new(rate).expect("a positive rate").sample(&mut rng);
        at += gap;
        if at >= length {
            break;
        }
        let draw: f64 = rng.random();
        let mut class = 0;
        let mut cumulative = 0.0;
        for (index, (_, _, share)) in CLASSES.iter().enumerate() {
            cumulative += share;
            class = index;
            if draw < cumulative {
                break;
            }
        }
        plan.push(Planned {
            at: Duration::from_secs_f64(at),
            class,
        });
    }
    plan
}

/// How the client calls the frontend.
#[derive(Clone)]
pub enum Caller {
    /// Retries a refused or timed-out attempt at once, this many times.
    Naive { retries: u32 },
    /// Levels, throttling and the budgeted retry policy toward the
    /// frontend.
    Whole(Downstreams),
}

/// What became of one planned request.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub planned: Planned,
    /// When the answer that ended it came, since the run's start, and
    /// whether it was a success within the SLO.
    pub answered: Option<(Duration, bool)>,
    /// Attempts sent by the client itself (naive retries included).
    pub attempts: u32,
    /// Refused by the client's own layer, nothing sent.
    pub refused_here: bool,
}

/// Each attempt that delivered a success within the SLO.
pub struct Delivered(Vec<AtomicBool>);

impl Delivered {
    pub fn new(attempts: usize) -> Self {
        Delivered((0..attempts).map(|_| AtomicBool::new(false)).collect())
    }

    fn mark(&self, attempt: usize) {
        if let Some(flag) = self.0.get(attempt) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    pub fn get(&self, attempt: usize) -> bool {
        self.0[attempt].load(Ordering::Relaxed)
    }
}

type Transport = Client<HttpConnector, Full<Bytes>>;

/// Rungs per class: a request's priority is its class's minus a hash of
/// the request (its user, in a real service) below eight, DAGOR's compound
/// priority, so that a level can cut through a class and shed part of it
/// rather than all or nothing.
const RUNGS: usize = 8;

/// The priority of request `id` of `class`.
pub fn priority_of(class: usize, id: usize) -> i8 {
    let rung = (id.wrapping_mul(0x9E37_79B9) >> 7) % RUNGS;
    CLASSES[class].1.get() - rung as i8
}

fn request(
    frontend: SocketAddr,
    class: usize,
    attempt: usize,
    timeout: Duration,
) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://{frontend}/"))
        .header(
            "x-admission-priority",
            priority_of(class, attempt / ATTEMPTS).to_string(),
        )
        .header("grpc-timeout", crate::servers::timeout_value(timeout))
        .header(ATTEMPT, attempt.to_string())
        .body(Full::new(Bytes::new()))
        .expect("a request")
}

/// Sends every planned request at its time; returns once each has its
/// outcome (an answer, or its last attempt's timeout).
pub async fn drive(
    plan: Arc<Vec<Planned>>,
    caller: Caller,
    frontend: SocketAddr,
    slo: Duration,
    start: Instant,
    delivered: Arc<Delivered>,
) -> Vec<Outcome> {
    let transport: Transport = Client::builder(TokioExecutor::new()).build_http();
    let whole = match &caller {
        Caller::Whole(downstreams) => Some(
            ServiceBuilder::new()
                .layer(RetryLayer::new(downstreams.retry_policy()))
                .layer(downstreams.layer())
                .service(transport.clone()),
        ),
        Caller::Naive { .. } => None,
    };
    let mut requests = Vec::with_capacity(plan.len());
    for (id, &planned) in plan.iter().enumerate() {
        tokio::time::sleep_until(start + planned.at).await;
        let delivered = delivered.clone();
        let transport = transport.clone();
        let whole = whole.clone();
        let caller = caller.clone();
        requests.push(tokio::spawn(async move {
            match (caller, whole) {
                (Caller::Naive { retries }, _) => {
                    naive(
                        id, planned, retries, transport, frontend, slo, start, &delivered,
                    )
                    .await
                }
                (Caller::Whole(_), Some(service)) => {
                    let sent =
                        service.oneshot(request(frontend, planned.class, id * ATTEMPTS, slo));
                    whole_loop(id, planned, sent, slo, start, &delivered).await
                }
                (Caller::Whole(_), None) => unreachable!("built above"),
            }
        }));
    }
    let mut outcomes = Vec::with_capacity(requests.len());
    for request in requests {
        outcomes.push(request.await.expect("a request task"));
    }
    outcomes
}

/// Completions a second of `concurrency` callers each sending the next
/// request as soon as the last is answered, high priority with a long
/// deadline (nothing is refused), for `length` after `warmup`: the fleet's
/// capacity as this machine gives it (its cores are shared by the three
/// servers and the client, so the bottleneck's work runs slower than it
/// does alone).
pub async fn closed_loop(
    frontend: SocketAddr,
    concurrency: usize,
    warmup: Duration,
    length: Duration,
) -> f64 {
    let transport: Transport = Client::builder(TokioExecutor::new()).build_http();
    let start = Instant::now();
    let (from, to) = (start + warmup, start + warmup + length);
    let callers: Vec<_> = (0..concurrency)
        .map(|_| {
            let transport = transport.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < to {
                    let sent = request(frontend, 0, usize::MAX, Duration::from_secs(1));
                    let ok = status_of(transport.request(sent).await).await == Some(200);
                    let now = Instant::now();
                    if ok && now >= from && now < to {
                        done += 1;
                    }
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for caller in callers {
        done += caller.await.unwrap_or(0);
    }
    done as f64 / length.as_secs_f64()
}

/// The status of a response, read to its end (so that its connection can
/// be reused).
async fn status_of(
    answer: Result<http::Response<hyper::body::Incoming>, impl std::fmt::Debug>,
) -> Option<u16> {
    let response = answer.ok()?;
    let status = response.status().as_u16();
    response.into_body().collect().await.ok()?;
    Some(status)
}

#[allow(clippy::too_many_arguments)]
async fn naive(
    id: usize,
    planned: Planned,
    retries: u32,
    transport: Transport,
    frontend: SocketAddr,
    slo: Duration,
    start: Instant,
    delivered: &Delivered,
) -> Outcome {
    let deadline = start + planned.at + slo;
    let mut attempts = 0;
    for retry in 0..=retries as usize {
        attempts += 1;
        let attempt = id * ATTEMPTS + retry;
        // A naive client's per-try timeout: the whole SLO again. An
        // attempt it stops waiting for is dropped, which closes its
        // connection, and the servers drop their part of it when they see
        // that (its work so far is spent).
        let sent = request(frontend, planned.class, attempt, slo);
        let call = async { status_of(transport.request(sent).await).await };
        if let Ok(Some(200)) = tokio::time::timeout(slo, call).await {
            let now = Instant::now();
            let on_time = now <= deadline;
            if on_time {
                delivered.mark(attempt);
            }
            return Outcome {
                planned,
                answered: Some((now - start, on_time)),
                attempts,
                refused_here: false,
            };
        }
    }
    Outcome {
        planned,
        answered: None,
        attempts,
        refused_here: false,
    }
}

async fn whole_loop<F>(
    id: usize,
    planned: Planned,
    sent: F,
    slo: Duration,
    start: Instant,
    delivered: &Delivered,
) -> Outcome
where
    F: std::future::Future<
            Output = Result<
                http::Response<hyper::body::Incoming>,
                DownstreamError<hyper_util::client::legacy::Error>,
            >,
        > + Send
        + 'static,
{
    let deadline = start + planned.at + slo;
    let call = async move {
        match sent.await {
            Err(error) if error.is_local_refusal() => Err(()),
            answer => Ok(status_of(answer).await),
        }
    };
    let mut outcome = Outcome {
        planned,
        answered: None,
        attempts: 1,
        refused_here: false,
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Err(())) => {
            outcome.attempts = 0;
            outcome.refused_here = true;
        }
        Ok(Ok(Some(200))) => {
            let now = Instant::now();
            let on_time = now <= deadline;
            if on_time {
                delivered.mark(id * ATTEMPTS);
            }
            outcome.answered = Some((now - start, on_time));
        }
        _ => {}
    }
    outcome
}
