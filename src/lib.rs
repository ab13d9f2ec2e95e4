//! Node-level admission control for tokio applications.
//!
//! # The problem
//!
//! A service that saturates does not stop queueing: it queues somewhere it
//! cannot see. Every accepted request becomes a task, every task lands in
//! tokio's run queues, and those are FIFO and blind to priority and tenant.
//! A backup job's thousand tasks sit in front of a user's one; a noisy tenant
//! takes every worker; latency grows for everybody alike.
//!
//! # The move
//!
//! Admission control does not remove the wait; it **moves the queue out of
//! the runtime into code that can reorder it**, while keeping the CPU busy.
//! Handlers `await` admission before doing their work. While the node has
//! capacity the await completes at once; when it does not, requests wait in
//! a [`WorkQueue`] ordered by
//!
//! 1. **tenant fairness**: the tenant using the least capacity relative to
//!    its [`TenantWeight`] goes first,
//! 2. **priority** within a tenant ([`Priority`], an `i8` ladder), and
//! 3. **create time** within a priority (older first),
//!
//! and only as much work as the resource can take is let through to the
//! runtime. The design follows CockroachDB's `pkg/util/admission` and keeps
//! its vocabulary. It is deliberately node-local: only the node can see its
//! own overload in time; cross-service schemes complement it, and the
//! tower layer carries the node's decision to its callers on every
//! response (DAGOR's admission level), for them to act on before sending.
//!
//! ```text
//!  without admission control:            with admission control:
//!
//!  reqs ──▶ tasks ──▶ tokio run queues   reqs ──▶ WorkQueue ──▶ few tasks running
//!                     (FIFO, blind to            (tenant, priority,
//!                      priority, tenant)          create time)
//!                                                      ▲
//!                                        grant when a slot or token frees
//! ```
//!
//! # Two currencies: slots and tokens
//!
//! * A **slot** is a unit of concurrency, held while work runs and returned
//!   when it completes: the right currency for CPU, where completion is
//!   observable. [`SlotGranter`](grant::SlotGranter) has a total that a controller can move; the
//!   [`SlotPermit`] returned by admission gives the slot back on drop.
//! * A **token** is a unit of rate, consumed at admission and never returned,
//!   refilled from a capacity model: the right currency for IO, where a
//!   write's true cost lands later, when compactions rewrite its bytes.
//!
//! # Under overload
//!
//! Ordering alone does not save a saturated node: work that waits past its
//! deadline is wasted capacity. Every request may carry a deadline; the queue
//! never grants a slot to expired work and removes it as soon as its deadline
//! passes. Optional policies turn ordering into goodput:
//! **early rejection** fails a request at once when the work ahead of it
//! would outlast its deadline, **epoch-LIFO** (after CockroachDB) serves a
//! priority that has fallen behind newest-first, by epoch, until it catches
//! up, and an **elastic share** keeps bulk work from holding every slot
//! (bulk work that gives way, below, is exempt: it hands its slot over
//! when asked). `cargo run --release --example overload` measures them against the
//! alternatives (tokio's semaphore, tower's concurrency limit with load
//! shedding, nothing at all).
//!
//! # The CPU signal
//!
//! How many slots a node can sustain depends on the work, so the
//! [`cpu::Controller`] finds out: a dedicated OS thread samples tokio's
//! run-queue depth per worker every millisecond (tasks that are ready but
//! not running: the direct sign of CPU overload, unlike utilization) and
//! moves the slot total one step at a time, down when runnable per worker
//! reaches a threshold, up when it is at most half of it and every slot is
//! in use, and not at all in between. That signal cannot see a task parked
//! by `yield_now` or an exhausted cooperative budget, so a second one is
//! read off the admitted work itself: how much longer work holds its slot
//! than it does with a worker to itself. Holds grown twofold cut the total
//! at once in proportion, by 40% (or higher-priority work finishing late
//! while lower-priority work completes) take a slot, and the first rule may
//! add a slot only after windows of holds near their unloaded value
//! (see [`cpu`]), and only while a worker is parked: with every
//! worker busy, another admitted task could only share one. When freed
//! slots come back in a burst, only a few grants go out until their tasks
//! have actually started
//! running (grant pacing). When the node is idle, sampling slows down and
//! admission stops enforcing. See [`cpu`] for the measurements behind the
//! defaults and for what the stable-tokio fallback signal can and cannot see.
//!
//! Admission orders a request only once its task has been polled and asked.
//! Before that the task waits where tokio put it: a task spawned or woken
//! from outside the runtime waits in tokio's global queue, which a busy
//! worker looks at only every few hundred microseconds. So a controller's
//! queue keeps a slot returned on a worker while a task a worker or more
//! waits there free for the next request to ask ([`cpu::ControllerBuilder::arrivals_first`], on by
//! default): the worker that returned it runs out of local work, takes the
//! arrivals in, and the queue orders them before the slot is given out.
//! The controller also reports a backlog there
//! ([`cpu::GlobalQueueBacklog`]) and logs a warning while one lasts; a
//! runtime built through [`cpu::configure_runtime`] has workers look there
//! first. See [`cpu::configure_runtime`] for when to use it.
//!
//! # Work that does not yield: the CPU pool
//!
//! Admission orders who starts; it cannot reorder work that, once started,
//! holds a tokio worker for milliseconds without an `.await` (parsing,
//! compression, image work): everything queued behind that worker waits in
//! tokio's FIFO again. For such work the strongest answer is to own the
//! scheduler: a [`CpuPool`](pool::CpuPool) is a set of OS threads, one per core by
//! default, whose only queue is a [`WorkQueue`] whose slots are the
//! threads. [`CpuPool::spawn`](pool::CpuPool::spawn) returns a cancel-safe [`PoolTask`](pool::PoolTask) that waits
//! in that queue (tenant, priority, create time; deadlines, early rejection
//! and epoch-LIFO as on any queue) and resolves to the closure's value; a
//! panic comes back as [`PoolError::Panicked`](pool::PoolError::Panicked). Its signal is exact (threads
//! busy, work queued), with nothing to sample. See [`pool`] for how to share
//! the cores with the runtime's workers: where the pool's threads have
//! cores of their own, a thread that frees a slot starts the job it grants
//! itself, without a trip through a worker (chosen when the pool is built).
//!
//! # The IO signal
//!
//! An LSM's writes are cheap now and expensive later: the debt shows as
//! files and sub-levels piling up in L0, and an engine left alone stalls
//! every writer alike once L0 is deep. The [`io::Controller`] reads the
//! engine every interval (15 s; through [`io::LsmStatsSource`], with a
//! [fjall](https://docs.rs/fjall) adapter behind the `fjall` feature) and
//! turns L0's state and the smoothed compaction throughput into byte tokens
//! for the next interval, dripped into the queues every millisecond once the
//! store is loaded: unlimited while L0 is healthy, then budgets sized so
//! that compactions pay the debt down. **Elastic** work (priority below
//! zero) has a budget of its own inside the regular one that shrinks from a
//! lower threshold, and waits in a queue of its own, so bulk ingest yields
//! first and never blocks a foreground writer. Writes carry an estimate and
//! settle the actual bytes afterwards, without blocking.
//!
//! # GPU governance
//!
//! GPUs are governed by bytes and attempts rather than by a rate: the
//! [`gpu`] module admits one query attempt at a time onto one device with one
//! immutable memory grant. A per-device ledger (integer,
//! checked arithmetic) is the only capacity authority: a grant lies between
//! the attempt floor and what is left after live grants, resident cache, a
//! protected waiter's bytes and one floor for every slot still open. One
//! bounded queue serves every device in FIFO order of the oldest runnable
//! waiter, with an overtake budget after which an overtaken waiter protects
//! a slot and bytes on one device. The physical envelope around a grant
//! (lane, stream, allocation domain, membership, worker scope) is built
//! outside the lock and rolled back in reverse on any failure; a proven
//! stream-synchronization fault quarantines the device. CUDA comes in
//! through `cudarc` behind the `cuda` feature; a deterministic simulated
//! backend with fault injection is what the tests run on.
//!
//! # Across a fleet: tenant quotas
//!
//! Admission is node-local; a tenant's plan is not. A [`quota::Quota`]
//! bounds each tenant's rate fleet-wide while keeping every decision on
//! the node: per tenant, a token bucket in a store the fleet already has
//! (Redis, feature `redis`; in-process for one node), leased in batches by
//! a thread of the quota's own into a token queue per tenant on the node.
//! [`Quota::admit`](quota::Quota::admit) takes the tenant's units there
//! (waiting in priority order when they run out, refused with
//! [`AdmitError::OverQuota`] and a `retry_after` from the refill), then
//! waits for the node's capacity as ever. When the store is out of reach,
//! each node falls back to a fixed trickle and says so in its snapshot.
//!
//! # Never the failure
//!
//! An admission controller is a safety device: when it fails, it takes the
//! service down with it. So every piece of code the application hands the
//! crate (a [`CpuSignal`](cpu::CpuSignal), an
//! [`LsmStatsSource`](io::LsmStatsSource), a custom
//! [`Granter`](grant::Granter), a classifier, GPU observers, preflights,
//! cache evictors and backends) runs behind a panic boundary: a
//! panic is logged, counted, shown as a [`ComponentHealth`] in the
//! component's snapshot, and answered by that component's documented
//! fallback, never by a dead thread, a wedged queue or lost capacity. Time
//! arithmetic saturates; a request that can never be satisfied is refused
//! at once with a typed error ([`AdmitError::NeverFits`],
//! [`AdmitError::TimerUnavailable`]); every per-key table (tenants above
//! all, whose ids arrive in request headers) is bounded on the queue's own
//! schedule. `docs/ARCHITECTURE.md` has the failure model of each component;
//! the chaos tests and a ten-minute soak run check it.
//!
//! # Requester and granter
//!
//! Two small interfaces in [`grant`] keep *who wants to run* apart from
//! *what is free*. A [`Granter`](grant::Granter) owns one resource's capacity
//! (`try_get`, `return_grant`, `took_without_permission`); a
//! [`Requester`](grant::Requester) (the [`WorkQueue`]) holds waiting work and
//! accepts grants in order. Signals (the CPU and IO load), policy (the
//! priority ladder and tenant weights) and mechanism (this grant loop) are
//! separate, so adding a resource means writing a granter, not a scheduler.
//!
//! # One request's path
//!
//! [`WorkQueue::admit`] returns an [`Admit`] future. On its first poll it
//! takes the queue's lock once: on a closed queue it fails; bypass work is
//! admitted and counted; work whose deadline has passed fails at once; if
//! nobody is waiting and the granter has capacity, the request is admitted
//! on the fast path; a request larger than the granter can ever give, a
//! full queue, and (with early rejection) a request that would miss its
//! deadline are refused; otherwise it is enqueued. When capacity
//! comes back, the queue grants it **directly** to the first waiter in order,
//! under the lock, and wakes that waiter after releasing it, so no
//! newcomer can barge in between and no herd is woken. The admitted work
//! holds a [`SlotPermit`] while it runs; work that waits on IO in the
//! middle gives the slot back for the wait and is admitted again in its
//! own order ([`SlotPermit::run`], which the tower layer uses for every
//! request: it tells a wait from a `yield_now` without a timer, by the turn
//! of the worker's event loop; or [`SlotPermit::release_during`] around one
//! wait), so that slots stay about one per worker and every phase of
//! computation is admitted by priority. Long
//! work (a bulk job's batch) can offer its slot between chunks to waiting
//! work of a higher priority ([`SlotPermit::give_way`]): the queue cannot
//! take a slot back from a holder, but a holder can hand it over, so that
//! an urgent request waits one chunk rather than one batch.
//!
//! **Cancel safety.** Dropping an [`Admit`] while it waits removes it from the
//! queue; dropping it after it was granted but before it saw the grant passes
//! the slot to the next waiter. Dropping a [`SlotPermit`], including during a
//! panic, returns its slot. Nothing leaks, and the `loom-tests` crate checks
//! those races exhaustively.
//!
//! # Quick start
//!
//! ```
//! use admission::{Priority, TenantId, WorkInfo, WorkQueue};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two slots: at most two handlers run their work at once.
//! let queue = WorkQueue::new(2)?;
//!
//! let work = WorkInfo::new(TenantId::new(7), Priority::USER_HIGH);
//! let permit = queue.admit(work).await?;
//! // ... do the work while holding `permit` ...
//! drop(permit); // the slot goes to the next waiter in order
//!
//! assert_eq!(queue.snapshot().granter.used, 0);
//! # Ok(())
//! # }
//! ```
//!
//! # In a service
//!
//! With the `tower` and `axum` features, [`AdmissionLayer`](tower::AdmissionLayer)
//! over a [`cpu::Controller`] admits every request of a router. Its HTTP
//! mode answers refusals itself (`503` with `Retry-After`; `grpc-status`
//! for gRPC calls); the classifier maps routes to priorities and gives every
//! request a deadline. Handlers need no annotation: the slot is given back
//! while a handler waits (on a database, a downstream call) and asked for
//! again, in order, when it computes.
//!
//! ```
//! # #[cfg(all(feature = "tower", feature = "axum"))]
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! use admission::cpu::Controller;
//! use admission::tower::{AdmissionLayer, HttpClassifier};
//! use admission::Priority;
//! use axum::{routing::get, Router};
//!
//! let controller = Controller::for_runtime(&tokio::runtime::Handle::current()).build()?;
//! let classifier = HttpClassifier::new()
//!     .default_timeout(Duration::from_millis(100))?
//!     .route("/search", Priority::USER_HIGH)
//!     .route("/export", Priority::USER_LOW);
//! let app: Router = Router::new()
//!     .route("/search", get(|| async { "results" }))
//!     .route("/export", get(|| async { "a large file" }))
//!     .route_layer(AdmissionLayer::for_controller(controller, classifier).http());
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # drop((listener, app)); return Ok(());
//! # #[allow(unreachable_code)]
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Which entry point
//!
//! | the work | the entry point |
//! |---|---|
//! | handlers that compute and yield, behind tower (axum, tonic, hyper) | [`cpu::Controller`] behind [`tower::AdmissionLayer`] (features `tower`, `axum` for routes) |
//! | handlers of your own, without tower | [`cpu::Controller::admit`], or a plain [`WorkQueue`] with a fixed total |
//! | work that never yields (parsing, compression) | [`pool::CpuPool`] |
//! | writes to an LSM (byte tokens from its debt) | [`io::Controller`] (feature `fjall` for fjall) |
//! | GPU queries (memory grants per device) | [`gpu::QueryService`] |
//! | a tenant's rate across a fleet | [`quota::Quota`] (feature `redis` for Redis) |
//! | calls to other services (their levels, retry budgets) | `tower::client` (feature `tower`) |
//! | a resource of your own | a [`Granter`](grant::Granter) under a [`WorkQueue`] |
//!
//! Build the documentation with `cargo doc --all-features --open` to see
//! the feature-gated modules.
//!
//! # Modules
//!
//! At the crate root, the vocabulary every user meets: [`WorkQueue`] and its
//! [`Admit`] future, [`SlotPermit`], [`WorkInfo`] ([`Priority`],
//! [`TenantId`], [`TenantWeight`]), [`AdmitError`] and [`ConfigError`].
//!
//! * [`cpu`]: the CPU signal, the slot adjuster, the hold-inflation signal,
//!   [`cpu::configure_runtime`] and the [`cpu::Controller`].
//! * [`io`]: LSM debt turned into byte tokens: [`io::Controller`] and the
//!   fjall adapter.
//! * [`gpu`]: device ledgers and memory grants, the GPU query service,
//!   transactional envelopes, backends (simulated; `cudarc` with `cuda`).
//! * [`pool`]: [`pool::CpuPool`], OS threads whose only queue is a
//!   [`WorkQueue`], for work that does not yield.
//! * [`grant`]: the [`Granter`](grant::Granter) and
//!   [`Requester`](grant::Requester) interfaces and the slot and token
//!   granters: a resource of your own is a granter.
//! * [`quota`]: tenant quotas across a fleet: [`Quota`](quota::Quota)
//!   leases units of per-tenant token buckets from a backend (in-process;
//!   Redis with feature `redis`) on a thread of its own and admits
//!   locally, composed in front of a node's capacity.
//! * [`observe`]: snapshots and wait-time histograms.
//! * [`export`]: metrics through the `metrics` facade (feature `metrics`).
//! * `tower` (feature `tower`): `AdmissionLayer`, admission as tower
//!   middleware, whose responses carry the queue's admission level; and
//!   `tower::client`, the outbound side (levels learned per downstream,
//!   adaptive throttling, a retry policy with a budget).
//!
//! `docs/ARCHITECTURE.md` in the repository draws the modules and the path of
//! one request through them.

// Unsafe code is confined to the CUDA backend (FFI through cudarc), which
// opts back in with `#[allow(unsafe_code)]`; every other build forbids it.
#![cfg_attr(not(feature = "cuda"), forbid(unsafe_code))]
#![cfg_attr(feature = "cuda", deny(unsafe_code))]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unnameable_types,
    rust_2018_idioms
)]

// A hook the integration tests drive (fault injection at every step, the
// floor a grant was sized against): public where `test-util` is on (the
// crate's own dev-dependency turns it on), crate-private in a user's build,
// so it is neither part of the API nor a second definition to keep in step.
macro_rules! test_hook {
    ($(#[$meta:meta])* $kind:ident $($item:tt)*) => {
        #[cfg(any(test, loom, feature = "test-util"))]
        $(#[$meta])*
        pub $kind $($item)*

        #[cfg(not(any(test, loom, feature = "test-util")))]
        #[allow(dead_code)]
        $(#[$meta])*
        pub(crate) $kind $($item)*
    };
}

pub mod cpu;
mod error;
pub mod export;
pub mod gpu;
pub mod grant;
mod health;
pub mod io;
pub mod observe;
mod policy;
pub mod pool;
mod queue;
pub mod quota;
mod sync;
mod ticker;
mod timer;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
mod work;

pub use error::{AdmitError, ConfigError};
pub use health::ComponentHealth;
pub use policy::EpochLifo;
pub use queue::{
    Admit, GiveWay, ReleaseDuring, Run, SlotPermit, TokenQueues, Usage, WorkQueue, WorkQueueBuilder,
};
pub use work::{Priority, TenantId, TenantWeight, WorkInfo, WorkInfoBuilder};

/// The loom models of the queue, which drive crate-private code: run by
/// `loom-tests` under `--cfg loom` only.
#[cfg(loom)]
#[doc(hidden)]
pub use queue::loom_models as queue_loom_models;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
