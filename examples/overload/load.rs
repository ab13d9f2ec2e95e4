//! Open-loop load: handler work, the seeded schedule, and the generator.
//!
//! * **Work** is a calibrated loop of work units, never a spin to a
//!   wall-clock deadline: under contention a deadline spin hides the
//!   slowdown. Handlers compute in 50 µs chunks and give their worker back
//!   between them, as async code that computes between awaits does. How
//!   they give it back is one axis of the suite ([`Yielding`]): with
//!   `tokio::task::yield_now`, the style tokio's docs teach (the default);
//!   by waking themselves, as an await whose value is already there does;
//!   or never (a handler that never yields holds its worker for its whole
//!   service time, and new arrivals then wait in tokio's run queue where no
//!   admission queue can reorder them: the `never-yields` style shows that
//!   limit). What they await besides the CPU is the other ([`Awaits`]):
//!   nothing, a shared async mutex, or an IO wait.
//! * **The schedule** is computed before the run from a seed: Poisson
//!   arrivals per class (exponential gaps), each with its service time
//!   drawn up front, so every system sees exactly the same requests.
//! * **The generator** is a dedicated OS thread outside the runtime under
//!   test. It sleeps (never spins: a spinning generator takes a whole core
//!   of a 2-core machine) until the next intended send time, then sends
//!   every request that is due, catching up rather than skipping. Its
//!   lateness is recorded; latency is measured from the intended time, so
//!   lateness cannot hide as coordinated omission.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp};

use admission::{AdmitError, SlotPermit};

use crate::stats::{Outcome, Record};

/// One chunk of computation between two awaits.
pub const CHUNK: Duration = Duration::from_micros(50);

/// Loop iterations per microsecond of work on this machine.
#[derive(Clone, Copy, Debug)]
pub struct WorkUnits {
    per_micro: f64,
}

impl WorkUnits {
    /// Measures the loop against the clock for about 50 ms, taking the
    /// fastest of a few tries (the least disturbed).
    pub fn calibrate() -> Self {
        let mut best = f64::MAX;
        let iterations = 200_000u64;
        for _ in 0..5 {
            let start = Instant::now();
            spin(iterations);
            best = best.min(start.elapsed().as_secs_f64());
        }
        WorkUnits {
            per_micro: iterations as f64 / (best * 1e6),
        }
    }

    /// Does `work` worth of computation.
    pub fn run(&self, work: Duration) {
        spin((work.as_secs_f64() * 1e6 * self.per_micro) as u64);
    }
}

fn spin(iterations: u64) {
    let mut x = 0u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    std::hint::black_box(x);
}

/// How a handler gives its worker back between two chunks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Yielding {
    /// `tokio::task::yield_now().await`: what tokio's docs teach. The task
    /// waits in its worker's defer list, which no runtime metric shows,
    /// until the worker runs out of work or does its periodic maintenance,
    /// so a signal reading run-queue depths does not see this backlog.
    YieldNow,
    /// The task wakes itself and goes to the back of its worker's run
    /// queue, as when an await finds its value already there (see
    /// [`wake_self`]); the backlog is in the run queues, where
    /// `tokio_unstable`'s queue depths see it.
    SelfWake,
    /// Never: the whole service time in one poll.
    Never,
}

/// What a handler awaits besides the CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Awaits {
    /// Nothing: pure computation.
    Nothing,
    /// 30% of the service time is spent holding a shared async mutex (the
    /// bottleneck is not the CPU).
    SharedMutex,
    /// An IO wait (a timer standing in for a database call) about as long
    /// as the computation, half-way through.
    Io,
    /// The same wait, with the admission slot given back during it
    /// (`SlotPermit::release_during`) where the system has one; elsewhere
    /// the same as [`Awaits::Io`].
    IoReleased,
}

/// How a handler spends its service time: what it awaits, and how it
/// yields between the chunks it computes in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Handler {
    pub awaits: Awaits,
    pub yielding: Yielding,
}

impl Handler {
    /// The default: computes, with `yield_now` between chunks.
    pub const YIELD: Handler = Handler::computing(Yielding::YieldNow);
    pub const SELF_WAKE: Handler = Handler::computing(Yielding::SelfWake);
    pub const NEVER_YIELDS: Handler = Handler::computing(Yielding::Never);
    pub const MUTEX: Handler = Handler {
        awaits: Awaits::SharedMutex,
        yielding: Yielding::YieldNow,
    };
    pub const IO: Handler = Handler {
        awaits: Awaits::Io,
        yielding: Yielding::YieldNow,
    };
    pub const IO_RELEASED: Handler = Handler {
        awaits: Awaits::IoReleased,
        yielding: Yielding::YieldNow,
    };

    /// The styles `--handler` names, by name.
    pub const STYLES: [(&'static str, Handler); 6] = [
        ("yield", Handler::YIELD),
        ("self-wake", Handler::SELF_WAKE),
        ("mutex", Handler::MUTEX),
        ("io", Handler::IO),
        ("io-released", Handler::IO_RELEASED),
        ("never-yields", Handler::NEVER_YIELDS),
    ];

    pub const fn computing(yielding: Yielding) -> Handler {
        Handler {
            awaits: Awaits::Nothing,
            yielding,
        }
    }

    /// The style named `name` on the command line.
    pub fn named(name: &str) -> Option<Handler> {
        Handler::STYLES
            .iter()
            .find(|(style, _)| *style == name)
            .map(|&(_, handler)| handler)
    }

    /// This handler awaiting `awaits`, yielding as it does.
    pub fn awaiting(self, awaits: Awaits) -> Handler {
        Handler { awaits, ..self }
    }

    /// The name `--handler` knows it by; a combination no flag names (W8's
    /// mutex with self-waking chunks) joins the two.
    pub fn name(&self) -> String {
        if let Some((style, _)) = Handler::STYLES.iter().find(|(_, h)| h == self) {
            return (*style).to_string();
        }
        let awaits = match self.awaits {
            Awaits::Nothing => "compute",
            Awaits::SharedMutex => "mutex",
            Awaits::Io => "io",
            Awaits::IoReleased => "io-released",
        };
        let yielding = match self.yielding {
            Yielding::YieldNow => "yield",
            Yielding::SelfWake => "self-wake",
            Yielding::Never => "never-yields",
        };
        format!("{awaits}+{yielding}")
    }
}

/// What a handler needs at run time.
#[derive(Clone, Debug)]
pub struct HandlerEnv {
    pub units: WorkUnits,
    pub kind: Handler,
    pub mutex: Arc<tokio::sync::Mutex<()>>,
}

impl HandlerEnv {
    pub fn new(units: WorkUnits, kind: Handler) -> Self {
        HandlerEnv {
            units,
            kind,
            mutex: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Serves one request of `service` time.
    pub async fn serve(&self, service: Duration) {
        match self.kind.awaits {
            Awaits::Nothing => self.chunks(service).await,
            Awaits::SharedMutex => {
                let locked = service.mul_f64(0.3);
                {
                    let _guard = self.mutex.lock().await;
                    self.chunks(locked).await;
                }
                self.chunks(service.saturating_sub(locked)).await;
            }
            Awaits::Io | Awaits::IoReleased => {
                let first = Self::before_io(service);
                self.chunks(first).await;
                tokio::time::sleep(service).await;
                self.chunks(service - first).await;
            }
        }
    }

    /// What an IO handler computes before its wait (the rest comes after).
    pub fn before_io(service: Duration) -> Duration {
        service / 2
    }

    /// [`chunks`](Self::chunks), with the slot offered to waiting work of a
    /// higher priority between chunks (`SlotPermit::give_way`): the permit
    /// it holds at the end, or the refusal of asking for it again.
    pub async fn chunks_giving_way(
        &self,
        mut left: Duration,
        mut permit: SlotPermit,
    ) -> Result<SlotPermit, AdmitError> {
        while let Some(rest) = self.one_chunk(left) {
            left = rest;
            let give_way = permit.give_way();
            if !give_way.gave_way() {
                // Kept: the worker is given back all the same.
                self.pause().await;
            }
            permit = give_way.await?;
        }
        Ok(permit)
    }

    /// Computes for `left`, giving the worker back between chunks as the
    /// style says.
    pub async fn chunks(&self, mut left: Duration) {
        while let Some(rest) = self.one_chunk(left) {
            left = rest;
            self.pause().await;
        }
    }

    /// Computes the next chunk of `left`; what is left after it, if any.
    fn one_chunk(&self, left: Duration) -> Option<Duration> {
        let chunk = match self.kind.yielding {
            Yielding::YieldNow | Yielding::SelfWake => left.min(CHUNK),
            // Its one chunk is all of it.
            Yielding::Never => left,
        };
        self.units.run(chunk);
        Some(left - chunk).filter(|rest| !rest.is_zero())
    }

    /// Gives the worker back between chunks, as the style says.
    async fn pause(&self) {
        match self.kind.yielding {
            Yielding::YieldNow => tokio::task::yield_now().await,
            Yielding::SelfWake => wake_self().await,
            Yielding::Never => {}
        }
    }
}

/// Lets the worker run something else, the way an await does when what it
/// waits for is already there: the task wakes itself and goes to the back
/// of its worker's run queue (unlike `yield_now`, see [`Yielding`]).
async fn wake_self() {
    let mut woken = false;
    std::future::poll_fn(|cx| {
        if woken {
            return std::task::Poll::Ready(());
        }
        woken = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// How service times are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Service {
    /// Exponential around the mean.
    Exponential,
    /// Always the mean.
    Constant,
    /// 90% at half the mean, 10% at 5.5 times it (same mean).
    Bimodal,
}

impl Service {
    fn draw(self, mean: Duration, rng: &mut StdRng) -> Duration {
        match self {
            Service::Constant => mean,
            Service::Exponential => {
                let exp = Exp::new(1.0).expect("a positive rate");
                // Capped at 20x the mean so one draw cannot dominate a run.
                let draw: f64 = exp.sample(rng);
                mean.mul_f64(draw.min(20.0))
            }
            Service::Bimodal => {
                if rng.random_bool(0.9) {
                    mean / 2
                } else {
                    mean.mul_f64(5.5)
                }
            }
        }
    }
}

/// One stream of requests: a class at a tenant, with a rate that may change
/// over the run (a list of `(from, per second)` steps).
#[derive(Clone, Debug)]
pub struct Stream {
    pub class: usize,
    pub tenant: usize,
    pub steps: Vec<(Duration, f64)>,
}

/// One request as planned before the run.
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    pub at: Duration,
    pub class: usize,
    pub tenant: usize,
    pub service: Duration,
}

/// The merged, time-ordered schedule of every stream for `length`.
pub fn schedule(
    streams: &[Stream],
    length: Duration,
    mean_service: Duration,
    service: Service,
    seed: u64,
) -> Vec<Planned> {
    let mut plan = Vec::new();
    for (index, stream) in streams.iter().enumerate() {
        let mut rng =
            StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for (step, &(from, rate)) in stream.steps.iter().enumerate() {
            let until = stream
                .steps
                .get(step + 1)
                .map_or(length, |&(next, _)| next.min(length));
            // A rate from a C that failed to calibrate (zero, NaN or
            // infinite) schedules nothing rather than panic or never end.
            let gaps = match Exp::new(rate) {
                Ok(gaps) if rate.is_finite() && rate > 0.0 && from < until => gaps,
                _ => continue,
            };
            let mut at = from.as_secs_f64();
            loop {
                at += gaps.sample(&mut rng);
                let when = Duration::from_secs_f64(at);
                if when >= until {
                    break;
                }
                plan.push(Planned {
                    at: when,
                    class: stream.class,
                    tenant: stream.tenant,
                    service: service.draw(mean_service, &mut rng),
                });
            }
        }
    }
    plan.sort_by_key(|p| p.at);
    plan
}

/// Where a finished request writes its outcome: one word per planned
/// request, the outcome in the top two bits and the latency in nanoseconds
/// below, so recording takes no lock.
pub struct Outcomes {
    slots: Vec<AtomicU64>,
}

const COMPLETED: u64 = 1 << 62;
const REJECTED: u64 = 2 << 62;
const EXPIRED: u64 = 3 << 62;
const LATENCY: u64 = (1 << 62) - 1;

impl Outcomes {
    pub fn new(len: usize) -> Arc<Self> {
        Arc::new(Outcomes {
            slots: (0..len).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn record(&self, index: usize, outcome: Outcome) {
        let (tag, latency) = match outcome {
            Outcome::Completed { latency } => (COMPLETED, latency),
            Outcome::Rejected { latency } => (REJECTED, latency),
            Outcome::Expired { latency } => (EXPIRED, latency),
            Outcome::Unfinished => return,
        };
        let nanos = u64::try_from(latency.as_nanos())
            .unwrap_or(LATENCY)
            .min(LATENCY);
        self.slots[index].store(tag | nanos, Ordering::Release);
    }

    /// The records of the run as they stand now; requests not settled yet
    /// are unfinished (censored), never dropped.
    pub fn records(&self, plan: &[Planned]) -> Vec<Record> {
        plan.iter()
            .zip(&self.slots)
            .map(|(planned, slot)| {
                let word = slot.load(Ordering::Acquire);
                let latency = Duration::from_nanos(word & LATENCY);
                let outcome = match word & !LATENCY {
                    COMPLETED => Outcome::Completed { latency },
                    REJECTED => Outcome::Rejected { latency },
                    EXPIRED => Outcome::Expired { latency },
                    _ => Outcome::Unfinished,
                };
                Record {
                    class: planned.class,
                    tenant: planned.tenant,
                    intended: planned.at,
                    outcome,
                }
            })
            .collect()
    }
}

/// How requests enter the runtime under test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dispatch {
    /// `Handle::spawn` from the generator thread: through tokio's global
    /// (inject) queue, as work from outside the runtime arrives.
    Remote,
    /// Handed to a forwarding task inside the runtime that spawns it: into
    /// a worker's local queue, as a server's accept loop does.
    Local,
    /// Written as a four-byte frame on one of [`SOCKET_CONNECTIONS`]
    /// loopback TCP connections; a task per connection reads the frames and
    /// spawns a handler per request, as an HTTP/2 or gRPC server spawns a
    /// task per stream. The reading task is woken by tokio's IO driver, so
    /// arrivals enter the runtime the way a network service's do.
    Socket,
}

/// Client connections of [`Dispatch::Socket`]: requests are spread over
/// them in turn, as over a service's clients.
pub const SOCKET_CONNECTIONS: usize = 16;

/// What the generator saw.
#[derive(Debug)]
pub struct Delivery {
    /// Dispatch time minus intended time, per request sent.
    pub lateness: Vec<Duration>,
    /// Requests sent before the run ended, over requests scheduled before it.
    pub delivered_frac: f64,
}

/// Runs the generator on its own thread: calls `send(index, intended)` for
/// every planned request at (or as soon as possible after) its time,
/// through `dispatch`. Returns when the last request is sent or `end` is
/// reached; an error if the thread cannot start.
pub fn generate(
    plan: Arc<Vec<Planned>>,
    start: Instant,
    end: Instant,
    send: impl Fn(usize, Instant) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<Delivery>> {
    std::thread::Builder::new()
        .name("overload-generator".into())
        .spawn(move || {
            let mut lateness = Vec::with_capacity(plan.len());
            let mut sent = 0usize;
            let mut next = 0usize;
            while next < plan.len() {
                let due = start + plan[next].at;
                let now = Instant::now();
                if now >= end {
                    break;
                }
                if due > now {
                    std::thread::sleep(due - now);
                    continue;
                }
                // Catch up: send everything already due, never skip.
                while next < plan.len() && start + plan[next].at <= Instant::now() {
                    let intended = start + plan[next].at;
                    send(next, intended);
                    lateness.push(Instant::now().saturating_duration_since(intended));
                    next += 1;
                    sent += 1;
                }
            }
            let scheduled = plan.iter().filter(|p| start + p.at < end).count();
            Delivery {
                lateness,
                delivered_frac: if scheduled == 0 {
                    1.0
                } else {
                    sent.min(scheduled) as f64 / scheduled as f64
                },
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_deterministic_sorted_and_near_its_rate() {
        let streams = [
            Stream {
                class: 0,
                tenant: 0,
                steps: vec![(Duration::ZERO, 1000.0)],
            },
            Stream {
                class: 1,
                tenant: 1,
                steps: vec![(Duration::ZERO, 0.0), (Duration::from_secs(1), 2000.0)],
            },
        ];
        let length = Duration::from_secs(2);
        let mean = Duration::from_micros(500);
        let a = schedule(&streams, length, mean, Service::Exponential, 7);
        let b = schedule(&streams, length, mean, Service::Exponential, 7);
        assert_eq!(a.len(), b.len());
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.at == y.at && x.service == y.service));
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        let class0 = a.iter().filter(|p| p.class == 0).count() as f64;
        let class1 = a.iter().filter(|p| p.class == 1).count() as f64;
        // Poisson counts: within five standard deviations of the mean.
        assert!((class0 - 2000.0).abs() < 5.0 * 2000f64.sqrt(), "{class0}");
        assert!((class1 - 2000.0).abs() < 5.0 * 2000f64.sqrt(), "{class1}");
        assert!(a
            .iter()
            .filter(|p| p.class == 1)
            .all(|p| p.at >= Duration::from_secs(1)));
    }

    #[test]
    fn a_rate_that_is_not_a_positive_number_schedules_nothing() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let streams = [Stream {
                class: 0,
                tenant: 0,
                steps: vec![(Duration::ZERO, rate)],
            }];
            let mean = Duration::from_micros(500);
            let plan = schedule(&streams, Duration::from_secs(1), mean, Service::Constant, 1);
            assert!(plan.is_empty(), "{rate}");
        }
    }

    #[test]
    fn handler_styles_are_named_as_the_command_line_names_them() {
        assert_eq!(Handler::named("yield"), Some(Handler::YIELD));
        assert_eq!(Handler::named("chunked"), None);
        assert_eq!(Handler::MUTEX.awaits, Awaits::SharedMutex);
        assert_eq!(Handler::IO.yielding, Yielding::YieldNow);
        let w8_self_waking = Handler::SELF_WAKE.awaiting(Awaits::SharedMutex);
        assert_eq!(w8_self_waking.name(), "mutex+self-wake");
        assert_eq!(Handler::YIELD.awaiting(Awaits::Io), Handler::IO);
        assert_eq!(Handler::IO.name(), "io");
    }

    #[test]
    fn service_variants_keep_their_mean() {
        let mean = Duration::from_micros(500);
        let mut rng = StdRng::seed_from_u64(1);
        for service in [Service::Exponential, Service::Constant, Service::Bimodal] {
            let n = 20_000;
            let total: f64 = (0..n)
                .map(|_| service.draw(mean, &mut rng).as_secs_f64())
                .sum();
            let observed = total / n as f64;
            assert!(
                (observed / mean.as_secs_f64() - 1.0).abs() < 0.05,
                "{service:?}: {observed}"
            );
        }
    }

    #[test]
    fn outcomes_round_trip_and_unsettled_requests_are_unfinished() {
        let plan: Vec<Planned> = (0..4)
            .map(|i| Planned {
                at: Duration::from_millis(i),
                class: i as usize % 2,
                tenant: 0,
                service: Duration::ZERO,
            })
            .collect();
        let outcomes = Outcomes::new(plan.len());
        let ms = Duration::from_millis;
        outcomes.record(0, Outcome::Completed { latency: ms(3) });
        outcomes.record(1, Outcome::Rejected { latency: ms(0) });
        outcomes.record(2, Outcome::Expired { latency: ms(5) });
        let records = outcomes.records(&plan);
        assert_eq!(records[0].outcome, Outcome::Completed { latency: ms(3) });
        assert_eq!(records[1].outcome, Outcome::Rejected { latency: ms(0) });
        assert_eq!(records[2].outcome, Outcome::Expired { latency: ms(5) });
        assert_eq!(records[3].outcome, Outcome::Unfinished);
        assert_eq!((records[3].class, records[3].intended), (1, ms(3)));
    }
}
