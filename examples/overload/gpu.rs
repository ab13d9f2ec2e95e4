//! W7: GPU query admission on a pool of simulated devices under 3x demand.
//!
//! * **Pool**: four simulated devices (by default) of 80 GiB managed
//!   capacity and four attempts each, with the default attempt floor
//!   (capacity / 8 = 10 GiB). Nothing touches a GPU: the simulated backend
//!   runs the real ledger, queue and envelope code, device worker threads
//!   included, which is why the run uses real time and short holds rather
//!   than tokio's paused clock.
//! * **Demand**: open-loop Poisson arrivals at `offered_x` times the pool's
//!   sustainable throughput ([`Settings::sustainable_per_sec`]), seeded, the
//!   same schedule for every system. 90% are *small* queries (phase floor =
//!   the attempt floor, a working-set hint of 10 to 24 GiB, held 10 to 70
//!   ms); 10% are *large* (phase floor 48 GiB, held 40 to 160 ms). 48 GiB is
//!   close to the largest grant a device can ever make (80 − 3 × 10 = 50
//!   GiB, since the three other slots keep their floors), so a large query
//!   needs a device that has nearly drained: the case where younger small
//!   work can starve it. Each query carries an admission deadline (small
//!   200 ms, large 1.5 s from its intended arrival); waits count from the
//!   intended arrival, so a late generator cannot hide queueing.
//! * **Systems**: `admission` (overtake budget 4: an overtaken large query
//!   protects a slot and bytes on one device), `admission-unbounded` (the
//!   same service with an effectively infinite budget: plain oldest-runnable-
//!   first, where large queries can starve) and `device-semaphore`, the
//!   naive baseline: one FIFO semaphore of four slots per device, the device
//!   with the most free slots at arrival, no byte accounting. It cannot
//!   starve anyone and cannot protect anything: it over-commits memory,
//!   which on a real GPU is an out-of-memory failure.
//!
//! Over-commit is checked two ways. Exactly: every admission adds the bytes
//! the query holds (its grant; the working set for the baseline) to its
//! device's counter and counts a violation if the sum passes the managed
//! capacity. Sampled: a thread reads every ledger's snapshot each millisecond
//! (live grants + cache + protected bytes over managed capacity, and active
//! attempts over the limit). Utilisation is the time average of the sampled
//! bytes held (capped at capacity, so an over-committed baseline is not
//! credited for memory it does not have) and of running attempts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use admission::gpu::backend::sim::{SimBackend, SimDevice};
use admission::gpu::backend::DeviceOrdinal;
use admission::gpu::{
    CapabilityProof, DeviceProfile, DeviceSet, MemoryOwnership, Observation, ObservationKind,
    PhaseRequirement, PlanDescription, PlanFingerprint, QueryAdmissionOutcome, QueryService,
    QueueBounds,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp};
use tokio::sync::Semaphore;

use crate::runner;
use crate::stats::{self, Percentiles};

const GIB: u64 = 1 << 30;
/// Class indices: small and large queries.
pub const SMALL: usize = 0;
pub const LARGE: usize = 1;
/// The class names, in index order, as the report's latency keys.
pub const CLASSES: [&str; 2] = ["small", "large"];

/// W7's knobs; [`Settings::full`] and [`Settings::smoke`] are the sizes
/// used.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Simulated devices in the pool.
    pub devices: u32,
    /// Managed capacity of each device.
    pub capacity: u64,
    /// Attempts per device.
    pub slots: u32,
    /// How long arrivals are generated; the run then drains.
    pub run: Duration,
    /// Offered load as a multiple of [`sustainable_per_sec`](Self::sustainable_per_sec).
    pub offered_x: f64,
    /// Share of large queries.
    pub large_frac: f64,
    /// Small queries' working-set hints, uniform in this range.
    pub small_hint: (u64, u64),
    /// Large queries' phase floor (and hint: they need exactly this).
    pub large_floor: u64,
    /// Hold times, uniform in these ranges, per class.
    pub hold: [(Duration, Duration); 2],
    /// Admission deadlines from the intended arrival, per class.
    pub deadline: [Duration; 2],
    /// The queue's bound on queued plus pending submissions.
    pub max_pending: usize,
    /// The overtake budget of the protected `admission` system.
    pub overtake_budget: u32,
    /// How often the sampler reads the ledgers.
    pub sample_every: Duration,
    /// Seed of the arrival schedule.
    pub seed: u64,
}

impl Settings {
    /// The scenario: four 80 GiB devices of four slots, 3x demand for `run`.
    pub fn full(run: Duration) -> Self {
        Settings {
            devices: 4,
            capacity: 80 * GIB,
            slots: 4,
            run,
            offered_x: 3.0,
            large_frac: 0.1,
            small_hint: (10 * GIB, 24 * GIB),
            large_floor: 48 * GIB,
            hold: [
                (Duration::from_millis(10), Duration::from_millis(70)),
                (Duration::from_millis(40), Duration::from_millis(160)),
            ],
            deadline: [Duration::from_millis(200), Duration::from_millis(1500)],
            max_pending: 128,
            overtake_budget: 4,
            sample_every: Duration::from_millis(1),
            seed: 42,
        }
    }

    /// CI size (the smoke test's): two devices, arrivals for 250 ms, shorter
    /// deadlines so the drain is quick too.
    #[cfg(test)]
    pub fn smoke() -> Self {
        Settings {
            devices: 2,
            run: Duration::from_millis(250),
            deadline: [Duration::from_millis(80), Duration::from_millis(200)],
            seed: 7,
            ..Self::full(Duration::from_millis(250))
        }
    }

    /// The default attempt floor of the profiles built here.
    pub fn attempt_floor(&self) -> u64 {
        self.capacity / u64::from(self.slots.max(8))
    }

    /// A fluid estimate of the pool's throughput in queries per second:
    /// the pool's slot-seconds and byte-seconds per second over what the
    /// mix needs of each per query, whichever binds first. Every query
    /// holds one slot; its bytes are at least its floor (a small grant
    /// shrinks to the floor when the device is tight). Packing is ignored
    /// (two large queries never share a device; a large one needs a nearly
    /// drained device), so the estimate is optimistic and the offered load
    /// is at least `offered_x` times what the pool sustains.
    pub fn sustainable_per_sec(&self) -> f64 {
        let mean = |(lo, hi): (Duration, Duration)| (lo + hi).as_secs_f64() / 2.0;
        let share = |class: usize| {
            if class == LARGE {
                self.large_frac
            } else {
                1.0 - self.large_frac
            }
        };
        let floors = [self.attempt_floor(), self.large_floor];
        let (mut slot_seconds, mut byte_seconds) = (0.0, 0.0);
        for class in [SMALL, LARGE] {
            slot_seconds += share(class) * mean(self.hold[class]);
            byte_seconds += share(class) * mean(self.hold[class]) * floors[class] as f64;
        }
        let devices = f64::from(self.devices);
        let by_slots = devices * f64::from(self.slots) / slot_seconds;
        let by_bytes = devices * self.capacity as f64 / byte_seconds;
        by_slots.min(by_bytes)
    }

    fn schedule(&self) -> Vec<Query> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let rate = self.offered_x * self.sustainable_per_sec();
        let gaps = Exp::new(rate).expect("a positive rate");
        let uniform = |rng: &mut StdRng, (lo, hi): (Duration, Duration)| {
            lo + (hi - lo).mul_f64(rng.random::<f64>())
        };
        let mut plan = Vec::new();
        let mut at = 0.0;
        loop {
            at += gaps.sample(&mut rng);
            let when = Duration::from_secs_f64(at);
            if when >= self.run {
                return plan;
            }
            let class = if rng.random_bool(self.large_frac) {
                LARGE
            } else {
                SMALL
            };
            let working_set = match class {
                SMALL => rng.random_range(self.small_hint.0..=self.small_hint.1),
                _ => self.large_floor,
            };
            plan.push(Query {
                at: when,
                class,
                working_set,
                hold: uniform(&mut rng, self.hold[class]),
            });
        }
    }
}

/// One planned query.
#[derive(Clone, Copy, Debug)]
struct Query {
    at: Duration,
    class: usize,
    /// The hint for a small query, the floor for a large one; what the
    /// baseline, which has no grants, takes as the bytes it holds.
    working_set: u64,
    hold: Duration,
}

/// The systems compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    /// The query service with the settings' overtake budget.
    Admission,
    /// The query service with overtaking unbounded.
    Unbounded,
    /// Per-device slot semaphores, no ledger.
    DeviceSemaphore,
}

impl System {
    /// Every system, in report order.
    pub const ALL: [System; 3] = [
        System::Admission,
        System::Unbounded,
        System::DeviceSemaphore,
    ];

    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            System::Admission => "admission",
            System::Unbounded => "admission-unbounded",
            System::DeviceSemaphore => "device-semaphore",
        }
    }
}

/// How one query settled.
#[derive(Clone, Copy, Debug)]
enum Settled {
    /// Admitted after `wait` (from the intended arrival), `started` into
    /// the run, and held.
    Completed {
        class: usize,
        wait: Duration,
        started: Duration,
    },
    /// Refused, with the policy-neutral outcome.
    Refused {
        class: usize,
        outcome: QueryAdmissionOutcome,
    },
}

/// What one system did in one run.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Queries scheduled, per class.
    pub arrivals: [usize; 2],
    /// Queries that returned a settlement (must equal the arrivals).
    pub settled: usize,
    /// Queries admitted and held to release, per class.
    pub completed: [usize; 2],
    /// Completed queries admitted during the arrival window: the drain
    /// after it empties the queue, which would flatter the rate.
    pub started_in_window: usize,
    /// Admission waits of completed queries, per class.
    pub waits: [Vec<Duration>; 2],
    /// Refusals per class, by `QueryAdmissionOutcome` as it displays
    /// (`deadline` for the baseline's timeout).
    pub refusals: [BTreeMap<String, usize>; 2],
    /// Admissions that took a device's held bytes past its capacity
    /// (exact, from the workload's own counters).
    pub over_commit_admissions: usize,
    /// Admissions that took a device past its attempt limit.
    pub over_slot_admissions: usize,
    /// Largest sampled bytes held / capacity on any device.
    pub max_held_ratio: f64,
    /// Largest sampled (live grants + cache + protected) / managed
    /// capacity of any ledger; `None` for the baseline, which has none.
    pub ledger_max_ratio: Option<f64>,
    /// Ledger samples above capacity or above the attempt limit.
    pub ledger_violations: usize,
    /// Samples taken during the arrival window.
    pub samples: usize,
    /// Time-averaged bytes held / pool capacity (each device capped at its
    /// capacity).
    pub byte_util: f64,
    /// Time-averaged running attempts / pool slots.
    pub slot_util: f64,
    /// Largest overtake count seen in a queue snapshot (sampled, so a lower
    /// bound); `None` for the baseline.
    pub max_overtakes: Option<u32>,
    /// The same, among large queries only.
    pub max_overtakes_large: Option<u32>,
    /// Protections taken (`Protected` observations).
    pub protections: usize,
    /// Largest overtake count at which a protection was taken (exact).
    pub max_overtakes_at_protection: u32,
    /// Submissions whose count of terminal observations (published,
    /// rejected, removed) is not exactly one, plus published attempts never
    /// released. Zero when every query settles exactly once.
    pub settle_mismatches: usize,
    /// After the drain: every ledger back to no grants, attempts or
    /// protection; `None` for the baseline.
    pub ledgers_clear: Option<bool>,
    /// p99 of how late the generator released queries, in µs.
    pub generator_late_p99_us: f64,
    /// The arrival window.
    pub run: Duration,
    /// The pool's estimated sustainable throughput.
    pub sustainable_per_sec: f64,
}

impl Outcome {
    /// Admission-wait percentiles of a class's completed queries.
    pub fn wait(&self, class: usize) -> Percentiles {
        stats::percentiles_of(&self.waits[class])
    }

    /// Completed queries admitted within the arrival window, per second of
    /// it, as a fraction of the sustainable throughput. Every admission is
    /// within its query's deadline (the service and the baseline enforce
    /// it), so these are all good. It counts queries, not work: a system
    /// that starves the long large queries completes more short ones, so
    /// read it beside utilisation and the large class's figures.
    pub fn goodput_frac(&self) -> f64 {
        self.started_in_window as f64 / self.run.as_secs_f64().max(1e-9) / self.sustainable_per_sec
    }

    /// Completed large queries over scheduled ones.
    pub fn large_success(&self) -> f64 {
        self.completed[LARGE] as f64 / self.arrivals[LARGE].max(1) as f64
    }

    /// Refused queries, every class and outcome.
    pub fn refused(&self) -> usize {
        self.refusals.iter().flat_map(BTreeMap::values).sum()
    }

    /// Refused queries over scheduled ones.
    pub fn refused_frac(&self) -> f64 {
        self.refused() as f64 / (self.arrivals[SMALL] + self.arrivals[LARGE]).max(1) as f64
    }
}

/// The workload's own view of each device: bytes and attempts held by
/// running queries, updated around every hold.
struct Held {
    bytes: Vec<AtomicU64>,
    attempts: Vec<AtomicU32>,
    capacity: u64,
    slots: u32,
    over_commit: AtomicUsize,
    over_slot: AtomicUsize,
}

impl Held {
    fn new(settings: &Settings) -> Self {
        Held {
            bytes: (0..settings.devices).map(|_| AtomicU64::new(0)).collect(),
            attempts: (0..settings.devices).map(|_| AtomicU32::new(0)).collect(),
            capacity: settings.capacity,
            slots: settings.slots,
            over_commit: AtomicUsize::new(0),
            over_slot: AtomicUsize::new(0),
        }
    }

    /// Holds `bytes` on `device` for `hold`. For the service, the add comes
    /// after the ledger's commit and the subtraction before its release, so
    /// this view never exceeds the ledger's; an overflow here is a real
    /// over-commit.
    async fn hold(&self, device: usize, bytes: u64, hold: Duration) {
        let before = self.bytes[device].fetch_add(bytes, Ordering::SeqCst);
        if before + bytes > self.capacity {
            self.over_commit.fetch_add(1, Ordering::Relaxed);
        }
        if self.attempts[device].fetch_add(1, Ordering::SeqCst) + 1 > self.slots {
            self.over_slot.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(hold).await;
        self.attempts[device].fetch_sub(1, Ordering::SeqCst);
        self.bytes[device].fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// What the sampler accumulates.
#[derive(Default)]
struct Samples {
    count: usize,
    byte_util_sum: f64,
    slot_util_sum: f64,
    max_held_ratio: f64,
    ledger_max_ratio: f64,
    ledger_violations: usize,
    max_overtakes: u32,
    max_overtakes_large: u32,
}

/// The system under test, as the query tasks see it.
enum Under {
    Service {
        service: QueryService,
        proofs: [CapabilityProof; 2],
    },
    Semaphores(Vec<Arc<Semaphore>>),
}

fn service(
    settings: &Settings,
    budget: u32,
    observed: Arc<Mutex<Vec<Observation>>>,
) -> Result<Under, String> {
    let refused = |what: &str, error: &dyn std::fmt::Display| format!("w7 {what}: {error}");
    let ordinals: Vec<u32> = (0..settings.devices).collect();
    // The simulated devices are larger than the managed capacity: the
    // backend reserve and the unmanaged rest live outside the ledger.
    let sim = Arc::new(SimBackend::new(
        ordinals
            .iter()
            .map(|&o| SimDevice::new(o, settings.capacity + 8 * GIB)),
    ));
    let profiles = ordinals
        .iter()
        .map(|&o| {
            DeviceProfile::builder(DeviceOrdinal(o))
                .managed_capacity(settings.capacity)
                .max_active_attempts(settings.slots)
                .build()
                .map_err(|error| refused("device profile", &error))
        })
        .collect::<Result<_, _>>()?;
    let ownerships = ordinals
        .iter()
        .map(|&o| MemoryOwnership::exclusive(DeviceOrdinal(o)))
        .collect();
    let devices =
        DeviceSet::new(profiles, ownerships).map_err(|error| refused("devices", &error))?;
    // The queue's max_wait is the longest class deadline; each query's own
    // deadline is the binding one.
    let max_wait = settings.deadline[SMALL].max(settings.deadline[LARGE]);
    let bounds = QueueBounds::new(settings.max_pending, max_wait, budget)
        .map_err(|error| refused("queue bounds", &error))?;
    let (service, issuer) = QueryService::builder(sim, devices, bounds)
        .observer(move |o: &Observation| {
            if let Ok(mut log) = observed.lock() {
                log.push(o.clone());
            }
        })
        .build_with_issuer()
        .map_err(|error| refused("query service", &error))?;
    let proof = |fingerprint, floor| {
        let plan = PlanDescription::new(PlanFingerprint(fingerprint))
            .phase(PhaseRequirement::new("scan", floor, "scan"));
        issuer.lower(&plan).map_err(|error| refused("plan", &error))
    };
    let proofs = [
        proof(1, settings.attempt_floor())?,
        proof(2, settings.large_floor)?,
    ];
    Ok(Under::Service { service, proofs })
}

/// Runs one query against the system under test.
async fn query(
    under: Arc<Under>,
    held: Arc<Held>,
    settings: Arc<Settings>,
    query: Query,
    run_start: Instant,
    next: Arc<AtomicUsize>,
) -> Settled {
    let intended = run_start + query.at;
    let class = query.class;
    let deadline = tokio::time::Instant::from_std(intended + settings.deadline[class]);
    match &*under {
        Under::Service { service, proofs } => {
            let ticket = match service.ticket(&proofs[class]) {
                Ok(ticket) => ticket,
                Err(error) => {
                    return Settled::Refused {
                        class,
                        outcome: error.outcome(),
                    }
                }
            };
            // Small queries describe their working set, so the grant lands
            // between the floor and the hint instead of everything free.
            let ticket = ticket
                .with_deadline(deadline)
                .with_working_set_hint(query.working_set);
            match ticket.admit().await {
                Ok(handle) => {
                    let (wait, started) = (intended.elapsed(), run_start.elapsed());
                    let device = handle.device().0 as usize;
                    held.hold(device, handle.grant_bytes(), query.hold).await;
                    handle.release().await;
                    Settled::Completed {
                        class,
                        wait,
                        started,
                    }
                }
                Err(error) => Settled::Refused {
                    class,
                    outcome: error.outcome(),
                },
            }
        }
        Under::Semaphores(semaphores) => {
            // The device with the most free slots now; ties rotate, so an
            // idle pool spreads work.
            let start = next.fetch_add(1, Ordering::Relaxed);
            let count = semaphores.len();
            let device = (0..count)
                .map(|i| (start + i) % count)
                .max_by_key(|&d| (semaphores[d].available_permits(), usize::MAX - d))
                .unwrap_or(0);
            let acquired =
                tokio::time::timeout_at(deadline, semaphores[device].clone().acquire_owned()).await;
            match acquired {
                Ok(Ok(permit)) => {
                    let (wait, started) = (intended.elapsed(), run_start.elapsed());
                    held.hold(device, query.working_set, query.hold).await;
                    drop(permit);
                    Settled::Completed {
                        class,
                        wait,
                        started,
                    }
                }
                Ok(Err(_closed)) => Settled::Refused {
                    class,
                    outcome: QueryAdmissionOutcome::Closed,
                },
                Err(_elapsed) => Settled::Refused {
                    class,
                    outcome: QueryAdmissionOutcome::Deadline,
                },
            }
        }
    }
}

/// One sample of the devices, into `samples`; utilisation only while
/// `in_window`.
fn sample(under: &Under, held: &Held, settings: &Settings, in_window: bool, samples: &mut Samples) {
    let capacity = settings.capacity as f64;
    let mut bytes = 0.0;
    let mut attempts = 0.0;
    for (b, a) in held.bytes.iter().zip(&held.attempts) {
        let b = b.load(Ordering::SeqCst) as f64;
        samples.max_held_ratio = samples.max_held_ratio.max(b / capacity);
        bytes += b.min(capacity);
        attempts += f64::from(a.load(Ordering::SeqCst).min(settings.slots));
    }
    if in_window {
        samples.count += 1;
        samples.byte_util_sum += bytes / (capacity * f64::from(settings.devices));
        samples.slot_util_sum += attempts / f64::from(settings.slots * settings.devices);
    }
    if let Under::Service { service, .. } = under {
        for r in service.ledger_snapshots() {
            let accounted = r.live_grants_bytes
                + r.cache_evictable_bytes
                + r.cache_pinned_bytes
                + r.protected_bytes;
            let ratio = accounted as f64 / r.managed_capacity as f64;
            samples.ledger_max_ratio = samples.ledger_max_ratio.max(ratio);
            if accounted > r.managed_capacity || r.active_attempts > r.max_active_attempts {
                samples.ledger_violations += 1;
            }
        }
        for w in service.admission_snapshot().waiters {
            samples.max_overtakes = samples.max_overtakes.max(w.overtakes);
            if w.phase_floor >= settings.large_floor {
                samples.max_overtakes_large = samples.max_overtakes_large.max(w.overtakes);
            }
        }
    }
}

/// Counts submissions that did not settle exactly once, from the
/// observation log: each submitted waiter must end in exactly one of
/// admitted, rejected or removed, and an admitted one must be released
/// exactly once. (`Admitted` stands for the handle here: this service
/// emits no `Published` record, and a simulated envelope cannot fail.)
fn settle_mismatches(log: &[Observation]) -> usize {
    // Per waiter: (admitted + rejected + removed, admitted, released).
    let mut ends: BTreeMap<u64, (usize, usize, usize)> = BTreeMap::new();
    for o in log {
        // A rejection before a sequence was reserved (queue full) has no
        // waiter and no submission to match.
        let Some(w) = o.waiter else { continue };
        let entry = ends.entry(w).or_default();
        match o.kind {
            ObservationKind::Admitted => {
                entry.0 += 1;
                entry.1 += 1;
            }
            ObservationKind::Rejected | ObservationKind::Removed => entry.0 += 1,
            ObservationKind::Released => entry.2 += 1,
            _ => {}
        }
    }
    ends.values()
        .filter(|&&(ends, admitted, released)| ends != 1 || admitted != released)
        .count()
}

/// Runs `system` on the settings' schedule: arrivals for `settings.run`,
/// then a drain until every query has settled; an error if the run could
/// not be set up.
pub fn run(settings: &Settings, system: System) -> Result<Outcome, String> {
    let settings = Arc::new(settings.clone());
    let plan = settings.schedule();
    let observed = Arc::new(Mutex::new(Vec::new()));
    let runtime = runner::runtime(runner::DEFAULT_WORKERS, runner::RuntimeSetup::Tokio)?;
    // The service spawns nothing on tokio at build, but its futures need a
    // runtime context; building inside one keeps that true if it changes.
    let under = Arc::new(runtime.block_on(async {
        match system {
            System::Admission => service(&settings, settings.overtake_budget, observed.clone()),
            System::Unbounded => service(&settings, u32::MAX, observed.clone()),
            System::DeviceSemaphore => Ok(Under::Semaphores(
                (0..settings.devices)
                    .map(|_| Arc::new(Semaphore::new(settings.slots as usize)))
                    .collect(),
            )),
        }
    })?);
    let held = Arc::new(Held::new(&settings));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let sampler = {
        let (under, held, settings, stop) =
            (under.clone(), held.clone(), settings.clone(), stop.clone());
        thread::Builder::new()
            .name("w7-sampler".into())
            .spawn(move || {
                let mut samples = Samples::default();
                while !stop.load(Ordering::Relaxed) {
                    let in_window = start.elapsed() < settings.run;
                    sample(&under, &held, &settings, in_window, &mut samples);
                    thread::sleep(settings.sample_every);
                }
                samples
            })
            .map_err(|error| format!("cannot start the w7 sampler thread: {error}"))?
    };
    let (settled, lateness) = runtime.block_on(async {
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::with_capacity(plan.len());
        let mut lateness = Vec::with_capacity(plan.len());
        for q in &plan {
            let intended = start + q.at;
            tokio::time::sleep_until(tokio::time::Instant::from_std(intended)).await;
            lateness.push(intended.elapsed());
            tasks.push(tokio::spawn(query(
                under.clone(),
                held.clone(),
                settings.clone(),
                *q,
                start,
                next.clone(),
            )));
        }
        let mut settled = Vec::with_capacity(tasks.len());
        for task in tasks {
            if let Ok(s) = task.await {
                settled.push(s);
            }
        }
        if let Under::Service { service, .. } = &*under {
            // Teardowns and grant releases run on the device workers after
            // `release` returns its report; wait for them before checking
            // the ledgers.
            service.settle().await;
        }
        (settled, lateness)
    });
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap_or_default();

    let mut outcome = Outcome {
        run: settings.run,
        sustainable_per_sec: settings.sustainable_per_sec(),
        settled: settled.len(),
        over_commit_admissions: held.over_commit.load(Ordering::Relaxed),
        over_slot_admissions: held.over_slot.load(Ordering::Relaxed),
        max_held_ratio: samples.max_held_ratio,
        samples: samples.count,
        byte_util: samples.byte_util_sum / samples.count.max(1) as f64,
        slot_util: samples.slot_util_sum / samples.count.max(1) as f64,
        generator_late_p99_us: stats::percentiles_of(&lateness).p99_ms * 1e3,
        ..Outcome::default()
    };
    for q in &plan {
        outcome.arrivals[q.class] += 1;
    }
    for s in settled {
        match s {
            Settled::Completed {
                class,
                wait,
                started,
            } => {
                outcome.completed[class] += 1;
                outcome.waits[class].push(wait);
                if started < settings.run {
                    outcome.started_in_window += 1;
                }
            }
            Settled::Refused {
                class,
                outcome: name,
            } => {
                *outcome.refusals[class].entry(name.to_string()).or_insert(0) += 1;
            }
        }
    }
    if let Under::Service { service, .. } = &*under {
        outcome.ledger_max_ratio = Some(samples.ledger_max_ratio);
        outcome.ledger_violations = samples.ledger_violations;
        outcome.max_overtakes = Some(samples.max_overtakes);
        outcome.max_overtakes_large = Some(samples.max_overtakes_large);
        outcome.ledgers_clear = Some(service.ledger_snapshots().iter().all(|r| {
            r.live_grants_bytes == 0
                && r.live_grant_count == 0
                && r.active_attempts == 0
                && r.protected_bytes == 0
                && r.protection.is_none()
        }));
        let log = observed.lock().map(|log| log.clone()).unwrap_or_default();
        outcome.settle_mismatches = settle_mismatches(&log);
        for o in &log {
            if o.kind == ObservationKind::Protected {
                outcome.protections += 1;
                outcome.max_overtakes_at_protection = outcome
                    .max_overtakes_at_protection
                    .max(o.overtakes.unwrap_or(0));
            }
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_seeded_and_mixes_both_classes() {
        let settings = Settings::full(Duration::from_secs(2));
        let a = settings.schedule();
        let b = settings.schedule();
        assert_eq!(a.len(), b.len());
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.at == y.at && x.class == y.class));
        let large = a.iter().filter(|q| q.class == LARGE).count();
        assert!(large > 0 && large < a.len());
        // Offered: offered_x times the estimate, within Poisson noise.
        let rate = a.len() as f64 / 2.0;
        let expected = settings.offered_x * settings.sustainable_per_sec();
        assert!((rate / expected - 1.0).abs() < 0.15, "{rate} vs {expected}");
    }

    #[test]
    fn a_large_floor_fits_an_empty_device_only_just() {
        let settings = Settings::full(Duration::from_secs(1));
        let largest = settings.capacity - settings.attempt_floor() * u64::from(settings.slots - 1);
        assert!(settings.large_floor <= largest);
        assert!(settings.large_floor * 10 >= largest * 9);
    }
}
