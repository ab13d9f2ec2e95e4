//! The systems compared, all serving the same requests on the same runtime.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission::cpu::{Controller, SignalSource};
use admission::grant::SlotGranter;
use admission::observe::Refusals;
use admission::pool::{CpuPool, PoolError};
use admission::{
    AdmitError, EpochLifo, Priority, TenantId, Usage, WorkInfo, WorkQueue, WorkQueueBuilder,
};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tower::limit::ConcurrencyLimit;
use tower::load_shed::LoadShed;
use tower::util::BoxCloneSyncService;
use tower::{service_fn, ServiceExt};

use crate::gate::{GateRefusal, StrictGate};
use crate::load::{Awaits, HandlerEnv};
use crate::stats::Outcome;

/// A system under test, as configured for a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum System {
    /// Every request runs at once.
    NoAdmission,
    /// `tokio::sync::Semaphore` with a fixed limit; requests wait in FIFO.
    SemaphoreWait { limit: usize },
    /// The hand-written yardstick of `gate.rs`: a fixed number of permits,
    /// strict priority, adaptive LIFO within a priority, and requests left
    /// with less than a mean service time refused.
    StrictGate { permits: usize },
    /// `tokio::sync::Semaphore` with a fixed limit; `try_acquire` or reject.
    SemaphoreTry { limit: usize },
    /// tower `ConcurrencyLimit` behind `LoadShed`.
    TowerShed { limit: usize },
    /// Refuses every request at the door, as cheaply as a refusal can be
    /// (`try_acquire` on a semaphore of no permits), while the runner keeps
    /// the workers busy beside it with the closed loop that measures C: not
    /// a system to use, but the measure of what taking the arrivals in
    /// costs a busy runtime by itself, which no admission decision can win
    /// back (the closed loop's completions, as a fraction of C, are what
    /// is left).
    RefuseAll,
    /// This crate: the CPU controller (or a fixed total), deadlines carried
    /// as admission deadlines, with the overload policies as configured.
    Admission {
        name: &'static str,
        fixed_slots: Option<u64>,
        epoch_lifo: bool,
        early_rejection: bool,
        /// `WorkQueueBuilder::elastic_share`.
        elastic_share: f64,
    },
    /// This crate as a new user gets it: `Controller::for_runtime(..).build()`
    /// and nothing else (deadlines still carried as admission deadlines).
    AdmissionDefaults,
    /// This crate's `CpuPool` of `threads` threads: the handler's
    /// computation runs on the pool, queued by the admission queue
    /// (`admission`'s queue settings, deadlines carried); `spin_us`
    /// microseconds of `CpuPoolBuilder::spin_before_wait`, and
    /// `CpuPoolBuilder::collect_grants` as `collect` says.
    Pool {
        threads: usize,
        spin_us: u64,
        collect: bool,
    },
    /// `spawn_blocking` behind a `tokio::sync::Semaphore` of `limit`
    /// permits: the computation on tokio's blocking pool, waiters in FIFO.
    BlockingSemaphore { limit: usize },
    /// `spawn` on a rayon pool of `threads` threads (what `rayon::spawn`
    /// does on the global pool), the result back through a oneshot: no
    /// bound, rayon's own queue.
    Rayon { threads: usize },
    /// Not a system but the reference row: the ideal non-preemptive
    /// scheduler of `servers` servers, simulated over the run's schedule
    /// (see `ideal.rs`). Nothing is built or run for it.
    Ideal { servers: usize },
}

impl System {
    /// The systems of the headline comparison, in table order.
    pub fn all(workers: usize) -> Vec<System> {
        vec![
            System::NoAdmission,
            System::SemaphoreWait { limit: workers },
            System::SemaphoreTry { limit: workers },
            System::TowerShed { limit: workers },
            System::admission(),
            System::admission_fixed("admission-fixed", workers as u64),
            System::StrictGate { permits: workers },
            System::Admission {
                name: "admission-fifo",
                fixed_slots: None,
                epoch_lifo: false,
                early_rejection: true,
                elastic_share: ELASTIC_SHARE,
            },
            System::AdmissionDefaults,
        ]
    }

    /// This crate with the defaults the suite settled on.
    pub fn admission() -> System {
        System::Admission {
            name: "admission",
            fixed_slots: None,
            epoch_lifo: true,
            early_rejection: true,
            elastic_share: ELASTIC_SHARE,
        }
    }

    /// This crate with a fixed slot total instead of the controller, to
    /// separate adaptivity from ordering.
    pub fn admission_fixed(name: &'static str, slots: u64) -> System {
        System::Admission {
            name,
            fixed_slots: Some(slots),
            epoch_lifo: true,
            early_rejection: true,
            elastic_share: ELASTIC_SHARE,
        }
    }

    /// This system (one of `Admission`'s) with bulk work allowed `share`
    /// of the slots instead of the suite's half.
    pub fn with_elastic_share(self, name: &'static str, share: f64) -> System {
        match self {
            System::Admission {
                fixed_slots,
                epoch_lifo,
                early_rejection,
                ..
            } => System::Admission {
                name,
                fixed_slots,
                epoch_lifo,
                early_rejection,
                elastic_share: share,
            },
            other => other,
        }
    }

    /// Whether the CPU controller sets its slot total, reading the runtime
    /// through the run's signal.
    pub fn has_controller(&self) -> bool {
        matches!(
            self,
            System::Admission {
                fixed_slots: None,
                ..
            } | System::AdmissionDefaults
        )
    }

    /// Whether it admits waiting work in priority order (the others are
    /// FIFO or first come, first refused).
    pub fn orders_by_priority(&self) -> bool {
        matches!(
            self,
            System::Admission { .. }
                | System::AdmissionDefaults
                | System::StrictGate { .. }
                | System::Pool { .. }
                | System::Ideal { .. }
        )
    }

    pub fn name(&self) -> String {
        match self {
            System::NoAdmission => "no-admission".into(),
            System::SemaphoreWait { limit } => format!("semaphore-wait({limit})"),
            System::SemaphoreTry { limit } => format!("semaphore-try({limit})"),
            System::StrictGate { permits } => format!("strict-gate({permits})"),
            System::TowerShed { limit } => format!("tower-shed({limit})"),
            System::RefuseAll => "refuse-all".into(),
            System::Admission { name, .. } => (*name).into(),
            System::AdmissionDefaults => "admission-defaults".into(),
            System::Pool {
                threads,
                spin_us,
                collect,
            } => {
                let spin = if *spin_us > 0 {
                    format!(",spin{spin_us}us")
                } else {
                    String::new()
                };
                let collect = if *collect { ",collect" } else { "" };
                format!("cpu-pool({threads}{spin}{collect})")
            }
            System::BlockingSemaphore { limit } => format!("blocking-semaphore({limit})"),
            System::Rayon { threads } => format!("rayon-spawn({threads})"),
            System::Ideal { servers } => format!("ideal({servers})"),
        }
    }
}

/// What a request carries into the system.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub priority: Priority,
    pub tenant: TenantId,
    pub service: Duration,
    pub intended: Instant,
    pub deadline: Instant,
    /// Whether the handler gives its slot to waiting work of a higher
    /// priority between chunks (`SlotPermit::give_way`, on the admission
    /// systems; the others have no way to).
    pub gives_way: bool,
}

impl Request {
    /// Its admission request: created at its intended send time, with
    /// its deadline, so queueing delay counts from when it should have
    /// been sent.
    fn work_info(&self) -> WorkInfo {
        WorkInfo::builder()
            .tenant(self.tenant)
            .priority(self.priority)
            .create_time(tokio::time::Instant::from_std(self.intended))
            .deadline(tokio::time::Instant::from_std(self.deadline))
            .build()
    }
}

type Shed = BoxCloneSyncService<Duration, (), tower::BoxError>;

/// A system built on a runtime, ready to serve.
pub struct Sut {
    kind: Kind,
    handler: HandlerEnv,
}

enum Kind {
    Direct,
    Wait(Arc<Semaphore>),
    Try(Arc<Semaphore>),
    Gate(Arc<StrictGate>),
    Shed(Shed),
    Admission {
        queue: WorkQueue<SlotGranter>,
        // Kept alive for the run: dropping it stops the sampler.
        _controller: Option<Controller>,
    },
    Pool(CpuPool),
    Blocking(Arc<Semaphore>),
    Rayon {
        pool: rayon::ThreadPool,
        // Set when the run ends: closures still in rayon's queue then skip
        // their work, so that they do not eat into the next run's CPU.
        closed: Arc<AtomicBool>,
    },
}

/// The queue settings of `admission` (see `Sut::build`).
/// The elastic share of the suite's admission systems: bulk work may hold at
/// most half the slots, so that it never holds them all when user work
/// arrives.
const ELASTIC_SHARE: f64 = 0.5;

fn admission_queue(
    slo: Duration,
    epoch_lifo: bool,
    early_rejection: bool,
    elastic_share: f64,
) -> WorkQueueBuilder {
    // Tenants are admitted in proportion to their weights over each reset
    // period: with two slots, counting slots held would ignore the weights
    // (see `Usage`).
    let builder = WorkQueue::builder()
        .max_waiters(100_000)
        .usage(Usage::Granted)
        .elastic_share(elastic_share)
        .early_rejection(early_rejection);
    if epoch_lifo {
        builder.epoch_lifo(EpochLifo::for_deadline(slo))
    } else {
        builder
    }
}

impl Sut {
    /// Builds `system` on `runtime`; a controller reads the runtime with
    /// `signal`. An error names what could not be built (queue depths in a
    /// build without `tokio_unstable`, say).
    pub fn build(
        system: System,
        runtime: &Handle,
        handler: HandlerEnv,
        slo: Duration,
        signal: SignalSource,
        weights: &[(TenantId, admission::TenantWeight)],
    ) -> Result<Arc<Sut>, String> {
        let kind = match system {
            System::NoAdmission => Kind::Direct,
            System::SemaphoreWait { limit } => Kind::Wait(Arc::new(Semaphore::new(limit))),
            System::SemaphoreTry { limit } => Kind::Try(Arc::new(Semaphore::new(limit))),
            System::RefuseAll => Kind::Try(Arc::new(Semaphore::new(0))),
            // The suite's SLO is ten mean service times.
            System::StrictGate { permits } => Kind::Gate(StrictGate::new(permits, slo / 10, slo)),
            System::TowerShed { limit } => {
                let env = handler.clone();
                let inner = service_fn(move |service: Duration| {
                    let env = env.clone();
                    async move {
                        env.serve(service).await;
                        Ok::<(), Infallible>(())
                    }
                });
                Kind::Shed(BoxCloneSyncService::new(LoadShed::new(
                    ConcurrencyLimit::new(inner, limit),
                )))
            }
            System::Admission {
                fixed_slots,
                epoch_lifo,
                early_rejection,
                elastic_share,
                ..
            } => {
                let builder = admission_queue(slo, epoch_lifo, early_rejection, elastic_share);
                let refused = |error: admission::ConfigError| format!("{}: {error}", system.name());
                let (queue, controller) = match fixed_slots {
                    Some(total) => (builder.total_slots(total).build().map_err(refused)?, None),
                    None => {
                        let controller = Controller::for_runtime(runtime)
                            .signal_source(signal)
                            .queue(builder)
                            .build()
                            .map_err(refused)?;
                        (controller.queue().clone(), Some(controller))
                    }
                };
                queue
                    .set_tenant_weights(weights.iter().copied())
                    .map_err(|error| format!("{}: {error}", system.name()))?;
                Kind::Admission {
                    queue,
                    _controller: controller,
                }
            }
            System::AdmissionDefaults => {
                let refused = |error: admission::ConfigError| format!("{}: {error}", system.name());
                let controller = Controller::for_runtime(runtime)
                    .signal_source(signal)
                    .build()
                    .map_err(refused)?;
                let queue = controller.queue().clone();
                queue
                    .set_tenant_weights(weights.iter().copied())
                    .map_err(|error| format!("{}: {error}", system.name()))?;
                Kind::Admission {
                    queue,
                    _controller: Some(controller),
                }
            }
            System::Pool {
                threads,
                spin_us,
                collect,
            } => {
                let pool = CpuPool::builder()
                    .threads(threads)
                    .spin_before_wait(Duration::from_micros(spin_us))
                    .collect_grants(collect)
                    .queue(admission_queue(slo, true, true, ELASTIC_SHARE))
                    .build()
                    .map_err(|error| format!("{}: {error}", system.name()))?;
                pool.set_tenant_weights(weights.iter().copied())
                    .map_err(|error| format!("{}: {error}", system.name()))?;
                Kind::Pool(pool)
            }
            System::BlockingSemaphore { limit } => Kind::Blocking(Arc::new(Semaphore::new(limit))),
            System::Ideal { .. } => {
                return Err(format!(
                    "{} is simulated over the schedule, not built on a runtime",
                    system.name()
                ))
            }
            System::Rayon { threads } => Kind::Rayon {
                pool: rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .map_err(|error| format!("{}: {error}", system.name()))?,
                closed: Arc::new(AtomicBool::new(false)),
            },
        };
        Ok(Arc::new(Sut { kind, handler }))
    }

    /// Serves one request to its outcome; latency from its intended time.
    pub async fn serve(&self, request: Request) -> Outcome {
        let since = |instant: Instant| instant.saturating_duration_since(request.intended);
        // A deadline that passed is an expiry; any other refusal, a rejection.
        let refused = |error: AdmitError| match error {
            AdmitError::DeadlineExceeded { .. } | AdmitError::DeadlinePassed => Outcome::Expired {
                latency: since(Instant::now()),
            },
            _ => Outcome::Rejected {
                latency: since(Instant::now()),
            },
        };
        match &self.kind {
            Kind::Direct => {
                self.handler.serve(request.service).await;
            }
            Kind::Wait(semaphore) => {
                // The runner closes the semaphore when the run ends: a
                // request still waiting then was never served.
                let Ok(_permit) = semaphore.acquire().await else {
                    return Outcome::Unfinished;
                };
                self.handler.serve(request.service).await;
            }
            Kind::Try(semaphore) => match semaphore.try_acquire() {
                Ok(_permit) => self.handler.serve(request.service).await,
                Err(_) => {
                    return Outcome::Rejected {
                        latency: since(Instant::now()),
                    }
                }
            },
            Kind::Gate(gate) => match gate
                .acquire(
                    request.priority,
                    tokio::time::Instant::from_std(request.deadline),
                )
                .await
            {
                Ok(_permit) => self.handler.serve(request.service).await,
                Err(GateRefusal::Expired) => {
                    return Outcome::Expired {
                        latency: since(Instant::now()),
                    }
                }
                Err(GateRefusal::Skipped) => {
                    return Outcome::Rejected {
                        latency: since(Instant::now()),
                    }
                }
            },
            Kind::Shed(service) => {
                if service.clone().oneshot(request.service).await.is_err() {
                    return Outcome::Rejected {
                        latency: since(Instant::now()),
                    };
                }
            }
            Kind::Admission { queue, .. } if self.handler.kind.awaits == Awaits::IoReleased => {
                let service = request.service;
                let before = HandlerEnv::before_io(service);
                let permit = match queue.admit(request.work_info()).await {
                    Ok(permit) => permit,
                    Err(error) => return refused(error),
                };
                self.handler.chunks(before).await;
                let ((), again) = permit.release_during(tokio::time::sleep(service)).await;
                match again {
                    Ok(permit) => {
                        self.handler.chunks(service - before).await;
                        drop(permit);
                    }
                    Err(error) => return refused(error),
                }
            }
            Kind::Admission { queue, .. } if request.gives_way => {
                let permit = match queue.admit(request.work_info()).await {
                    Ok(permit) => permit,
                    Err(error) => return refused(error),
                };
                match self
                    .handler
                    .chunks_giving_way(request.service, permit)
                    .await
                {
                    Ok(permit) => drop(permit),
                    Err(error) => return refused(error),
                }
            }
            Kind::Admission { queue, .. } => {
                let work = request.work_info();
                // As the crate's docs hold a permit: the slot given back
                // while the handler waits (on IO, on a lock), held while it
                // computes and yields.
                match queue.admit(work).await {
                    Ok(permit) => {
                        if let Err(error) = permit.run(self.handler.serve(request.service)).await {
                            return refused(error);
                        }
                    }
                    Err(error) => return refused(error),
                }
            }
            Kind::Pool(pool) => {
                let work = request.work_info();
                let units = self.handler.units;
                let service = request.service;
                match pool.spawn(work, move || units.run(service)).await {
                    Ok(()) => {}
                    Err(PoolError::Admit(error)) => return refused(error),
                    // Closed when the run ended: never served.
                    Err(PoolError::Closed) => return Outcome::Unfinished,
                    Err(_) => {
                        return Outcome::Rejected {
                            latency: since(Instant::now()),
                        }
                    }
                }
            }
            Kind::Blocking(semaphore) => {
                let Ok(permit) = semaphore.clone().acquire_owned().await else {
                    return Outcome::Unfinished;
                };
                let units = self.handler.units;
                let service = request.service;
                let ran = tokio::task::spawn_blocking(move || {
                    units.run(service);
                    drop(permit);
                })
                .await;
                if ran.is_err() {
                    return Outcome::Unfinished;
                }
            }
            Kind::Rayon { pool, closed } => {
                let (done, finished) = tokio::sync::oneshot::channel();
                let (units, service, closed) =
                    (self.handler.units, request.service, closed.clone());
                pool.spawn(move || {
                    if !closed.load(Ordering::Relaxed) {
                        units.run(service);
                        let _ = done.send(());
                    }
                });
                if finished.await.is_err() {
                    return Outcome::Unfinished;
                }
            }
        }
        Outcome::Completed {
            latency: since(Instant::now()),
        }
    }

    /// The slot total now, for systems that have one.
    pub fn slot_total(&self) -> Option<u64> {
        match &self.kind {
            // The total is an atomic: sampled every millisecond during a
            // run, it must not contend for the queue's lock with the
            // admissions being measured.
            Kind::Admission { queue, .. } => Some(queue.granter().total()),
            Kind::Pool(pool) => Some(pool.threads() as u64),
            _ => None,
        }
    }

    /// Why the admission queue (the controller's, a fixed total's or the
    /// pool's) refused requests so far, per priority; empty for the systems
    /// without one.
    pub fn refusals(&self) -> Vec<(Priority, Refusals)> {
        let priorities = match &self.kind {
            Kind::Admission { queue, .. } => queue.snapshot().priorities,
            Kind::Pool(pool) => pool.snapshot().queue.priorities,
            _ => return Vec::new(),
        };
        priorities
            .into_iter()
            .map(|entry| (entry.priority, entry.refusals))
            .collect()
    }

    /// Closes what can be closed, so that the run's waiters finish.
    pub fn close(&self) {
        match &self.kind {
            Kind::Wait(semaphore) | Kind::Try(semaphore) | Kind::Blocking(semaphore) => {
                semaphore.close()
            }
            Kind::Admission { queue, .. } => queue.close(),
            // Joins the pool's threads once the closures running return.
            Kind::Pool(pool) => pool.close(),
            Kind::Rayon { closed, .. } => closed.store(true, Ordering::Relaxed),
            // The gate's waiters leave by their deadlines.
            Kind::Direct | Kind::Shed(_) | Kind::Gate(_) => {}
        }
    }
}
