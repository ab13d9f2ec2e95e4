//! A CPU pool whose only queue is the admission queue: for work that does
//! not yield.
//!
//! A handler that computes for milliseconds without an `.await` (parsing a
//! large body, compressing, resizing an image, running a query operator)
//! holds its tokio worker for all of it. Admission in front of such a
//! handler can order who *starts*, but once started the work sits in the
//! worker, and every task queued behind that worker waits in tokio's FIFO
//! run queue, where priority and tenant mean nothing. The usual remedy,
//! `spawn_blocking` behind a semaphore, moves the work off the workers but
//! queues it twice: in the semaphore's FIFO and then in the blocking pool's.
//! [`CpuPool`] owns the scheduler instead, as CockroachDB's admission control
//! does for the goroutines it admits: a fixed set of OS threads, and **one
//! queue, a [`WorkQueue`](crate::WorkQueue)**, ordered by tenant fairness, then priority, then
//! create time, with deadlines, early rejection, epoch-LIFO and the elastic
//! share as on any queue.
//!
//! ```
//! use admission::pool::CpuPool;
//! use admission::{Priority, TenantId, WorkInfo};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = CpuPool::builder().threads(2).build()?;
//! let work = WorkInfo::new(TenantId::new(7), Priority::USER_HIGH);
//! let sum = pool.spawn(work, || (1..=1_000u64).sum::<u64>()).await?;
//! assert_eq!(sum, 500_500);
//! pool.close(); // or drop it: both join the threads
//! # Ok(())
//! # }
//! ```
//!
//! # Implementation notes
//!
//! **Slots are threads.** The pool's queue is a slot queue whose total is
//! the number of threads, and a slot is held from admission until the
//! closure has returned on a thread. So admitted work never outnumbers the
//! threads (bypass work aside), and the pool needs no scheduler of its own:
//! the grant loop the queue already has (direct hand-off in order, under
//! its lock, cancel-safe, checked by the loom models) *is* the scheduler.
//!
//! **The hand-off.** [`CpuPool::spawn`] returns a [`PoolTask`], polled by
//! the caller's task. Its admission (the queue's own
//! [`Admit`](crate::Admit) future) and its closure live in a small shared
//! cell, a `Handoff`, whose lock the caller's poll and a grant's wake-up
//! both take. When admission resolves, whoever saw it sends the admitted
//! job (the [`SlotPermit`](crate::SlotPermit), the closure, and the sender
//! of a `oneshot` channel for the result) down a `std::sync::mpsc` channel
//! that the threads take turns receiving from. Because every job in the
//! channel holds a slot, the channel holds at most as many jobs as there
//! are threads not yet back from their last job: it is a hand-off, not a
//! queue, and nothing in it is reordered. A thread runs the closure, drops
//! the permit (the queue grants the slot to the next waiter in order,
//! under its lock, before the result is even sent), updates the pool's
//! counters and sends the result. Cancellation before the start needs no
//! state of its own: a thread skips a job whose result receiver is gone.
//!
//! Who sees a grant is the pool's one choice
//! ([`CpuPoolBuilder::collect_grants`], made from the cores unless set).
//! Not collecting, the grant wakes the
//! caller's task, whose poll on a tokio worker collects it and sends the
//! job: one worker wake-up and one thread wake-up per job. Collecting, the
//! thread whose returned slot made the grant collects it itself, inside the
//! wake-up the grant makes, and the job is in the channel before that
//! thread looks for its next one: no worker takes part until the result is
//! sent. A wake-up never blocks on the cell's lock (it leaves a flag that
//! the holder handles when it lets go); the loom models in
//! `src/pool/loom_models.rs` race a grant against the caller's poll and
//! drop in both modes (one of them found a wake-up that the first version
//! lost, left unhandled by a poll that still held the lock).
//!
//! A job passes through:
//!
//! ```text
//!  PoolTask polled ──► admitting (Admit: waiting in the WorkQueue)
//!     │ admitted                    └─ deadline, early rejection, close,
//!     ▼                                  queue full ─► Err(PoolError), closure dropped
//!  dispatched (permit + closure in the channel, or a borrowed thread for bypass)
//!     │ a thread takes it
//!     ├─ receiver gone (PoolTask dropped) ─► skipped: never runs, permit returned
//!     ▼
//!  running (busy += 1) ─► returned or panicked ─► permit dropped, counted ─► result sent
//! ```
//!
//! **The cost of the hand-off.** By default, a granted job reaches a
//! thread only after the caller's task has been woken and polled on a
//! tokio worker: a few microseconds on an idle core, tens on a virtual
//! machine, and exposed twice to the OS scheduler on a contended one.
//! Collecting grants removes that hop, and where the threads have cores of
//! their own it is worth 8–11 points of C (table below). Where they share
//! the workers' cores, threads that never stop between jobs keep the
//! workers (which take in, refuse and answer every request) off the cores,
//! and a high-priority arrival reaches the queue only once a worker has
//! taken it in: goodput still rises a little, but the high class's tail
//! grows (W2-pool, four runs: p99 1.10–1.16x alone by default, 1.22–1.42x
//! collecting). An earlier build of the same idea, with a cell of another
//! design, lowered W2-pool's goodput outright (from 63–80% of C to
//! 52–57%: `perf sched` showed the pool threads sleeping on locks held by
//! preempted workers a quarter of the time). Hence the default is chosen
//! from the cores when the pool is built: on where the pool's threads and
//! the runtime's workers fit in them (the pool then has cores of its own),
//! off where they share them or the runtime's workers cannot be counted
//! (a pool built outside a runtime).
//!
//! Where the CPU goes with this design, sampled with `perf record` over a
//! W2-pool run (999 Hz on both cores, per second of the loaded run): pool
//! threads 86% of the machine, tokio workers 7.5% (about 13 µs of worker
//! time per request, taking in, refusing and answering 11,600 requests a
//! second), the generator under 0.1%, idle about 6%. Closures completed at
//! 77% of C (74.6% within the SLO). Since C is what both cores do with
//! nothing but the work, the workers' share and the idle time alone put
//! 95% of C out of reach on two cores: the target needs cores for the
//! workers beside the pool's.
//!
//! A pool thread returns slots outside any runtime, so the queue's clock
//! reads there (hold times, for early rejection) are the real clock even in
//! a test that paused tokio's; deadlines are timed by the caller's task, on
//! its runtime's clock.
//!
//! A future dropped while admitting leaves the queue as any `Admit` does;
//! dropped once dispatched, its closure never runs unless a thread had
//! already taken it (then it runs to the end, and its result is dropped).
//!
//! **The signal is exact.** The pool owns its scheduler, so it does not
//! sample anything: [`PoolSnapshot::busy`] counts threads inside a closure,
//! [`PoolSnapshot::queued`] the work waiting for a thread, both exactly.
//! No [`cpu::Controller`](crate::cpu::Controller) drives it: the right
//! number of slots for work that never yields is the number of threads.
//!
//! **Bypass work borrows a thread.** Work marked
//! [`bypass`](crate::work::WorkInfoBuilder::bypass) is admitted at once, past
//! the total; when every pool thread is taken it runs on a *borrowed*
//! thread, spawned for that one job and gone when it returns, at most
//! [`max_borrowed`](CpuPoolBuilder::max_borrowed) at a time (default 1).
//! Beyond that bound bypass work waits for the next pool thread, still
//! ahead of everything in the queue, and without a limit: bypass work is
//! the node's own (untrusted callers never get it, see the tower layer's
//! trust model), never refused, so how much of it is sent is the caller's
//! to bound, as on any [`WorkQueue`](crate::WorkQueue), which admits it
//! past the total.
//!
//! **Panics.** A closure runs under `catch_unwind`: its panic comes back as
//! [`PoolError::Panicked`] with the message, its slot is returned, and the
//! thread takes the next job. The thread's loop has a panic boundary of its
//! own as a backstop (component `cpu_pool_thread`, in
//! [`PoolSnapshot::thread_health`]), for a panic outside the closure (a
//! result whose `Drop` panics when nobody wants it).
//!
//! **Close.** [`CpuPool::close`] (and dropping the pool) closes the queue,
//! so that waiting work fails with [`PoolError::Closed`], lets the threads
//! finish work already admitted, and joins them, borrowed ones included.
//!
//! # Sharing the cores with tokio
//!
//! The pool's threads and the runtime's workers are all OS threads on the
//! same cores, and the OS scheduler, not admission, shares the cores
//! between them. Size the two so that the sum fits:
//!
//! * **All the heavy work goes through the pool.** The workers then only
//!   parse requests, await IO and hand work over: they are busy a small
//!   fraction of the time. Size the pool to the cores (the default,
//!   `available_parallelism`) and keep the runtime's default of one worker a
//!   core: the workers, mostly parked, take little from the pool's threads,
//!   and when a request does need a worker it gets one within an OS time
//!   slice instead of behind a 10 ms closure. This is the oversubscription
//!   to accept: up to twice as many runnable threads as cores, briefly.
//! * **Workers also compute.** Give the pool the cores the workers do not
//!   use: `cores − workers` threads (at least one), or fewer workers
//!   ([`tokio::runtime::Builder::worker_threads`]). Otherwise both sides
//!   believe they own every core, each thread runs at a fraction of a core,
//!   and the pool's latency (and its early rejection's estimate) stretches
//!   with the workers' load.
//!
//! Either way, do not also run heavy work on `spawn_blocking`: its threads
//! compete for the same cores without any ordering at all.
//!
//! What separate cores buy, measured by the overload suite on a 2-core VM
//! (W2 at 3x with handlers that never yield, each figure of C measured on
//! the runtime the scenario uses):
//!
//! | configuration | goodput / C | high in SLO | high p99 x alone |
//! |---|---|---|---|
//! | W2-pool: 2 pool threads beside 2 workers | 74.6–80.4% | 99.3–99.6% | 1.24–1.31x |
//! | W2-pool-split: 1 pool thread, 1 worker | 86.8%, 91.2%, 91.3%, 91.2% (once 97.2%, C calibrated low) | 98.8–99.6% | 1.23–1.26x |
//! | the same, threads spinning 100 µs before they sleep | 94.2%, 94.8%, 94.3% (once 101.9%, C low) | 99.3–99.8% | 1.16–1.17x |
//! | the same on a later, slower day (five runs) | 90.9–92.9% | 99.1–99.4% | 0.96–1.23x |
//! | W2-pool-split, four runs of each mode side by side: handed over by the task | 81.4–86.6% | 98.2–99.2% | 1.10–1.21x |
//! | the same, collecting grants ([`CpuPoolBuilder::collect_grants`]) | 90.1–97.8% (94.4, 97.8, 94.9, 90.1) | 98.4–99.8% | 1.03–1.18x |
//! | the same, collecting and spinning 100 µs | 92.0–97.5% | 99.0–99.6% | 1.01–1.17x |
//! | W2-pool, four runs: handed over by the task | 66.7–72.2% | 97.8–99.3% | 1.10–1.16x |
//! | W2-pool, collecting grants | 69.6–76.5% | 96.8–98.5% | 1.22–1.42x |
//! | `ideal(1)`, simulated (below) | 99.3–99.9% | 98.96–99.07% | 1.17–1.19x |
//! | `ideal(2)`, simulated | 99.7% | 99.93% | 1.19x |
//!
//! With a core each, the pool's thread is idle only while a job travels
//! through the worker; [`CpuPoolBuilder::collect_grants`] takes the worker
//! out of that trip, and [`CpuPoolBuilder::spin_before_wait`] the
//! pool-side wake-up. On shared cores both do harm (see there). So when
//! the workers also compute, give the pool cores of its own; built inside
//! the runtime, it then collects grants without being told:
//!
//! ```
//! use admission::pool::CpuPool;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
//! let workers = (cores / 2).max(1);
//! let runtime = tokio::runtime::Builder::new_multi_thread()
//!     .worker_threads(workers)
//!     .build()?;
//! let pool = runtime.block_on(async {
//!     CpuPool::builder()
//!         .threads(cores.saturating_sub(workers).max(1))
//!         .build()
//! })?;
//! // One worker and one thread fit on two cores, and so on up.
//! assert_eq!(pool.snapshot().collects_grants, cores >= 2);
//! # drop(pool);
//! # Ok(())
//! # }
//! ```
//!
//! What no pool can do: the suite also simulates, over each run's own
//! schedule, an ideal non-preemptive scheduler with the same number of
//! threads, no hand-off cost at all and the queue's policies applied with
//! exact knowledge (the `ideal(N)` row, `examples/overload/ideal.rs`). It
//! reaches 99.3–99.9% of C, but serves the high class within its SLO only
//! 99.0% of the time with one thread (99.9% with two), at a p99 1.17x
//! (one) and 1.19x (two) its own value alone: a high-priority request that
//! arrives under overload finds every thread busy with work that cannot be
//! interrupted, and waits out its remainder; alone, it mostly finds one
//! free. That price is the same for every order of the waiting work (the
//! simulation gives 1.18–1.24x with oldest first throughout). So for work
//! that never yields, "high p99 within 1.1x of alone" is beyond any
//! scheduler on this load with one or two threads (the pool's own ratios,
//! 0.96–1.31x in the runs above, are against its own run alone, which
//! pays the hand-off too), and what the pool leaves on the table is
//! goodput: the hand-offs, 2–10 points of C on cores of its own when
//! collecting grants, 20–30 on shared ones.
//!
//! The price falls as threads are added, because a high-priority arrival
//! waits only for the first of them to come free. The suite's `w2-ideal`
//! scenario simulates the same load on N threads: the high class's p99
//! is 1.18x alone with one, 1.17x with two, 1.13x with three, 1.10x with
//! four, 1.05x with six or eight, 1.03x with sixteen. With four or more
//! threads of its own, a pool has room under 1.1x; `scripts/cores-check.sh`
//! measures W2-pool-split at a machine's size.
//!
//! Preemption, which the ideal row does not have, was tried and rejected
//! on two cores. Linux gives a thread that wakes from sleep a core within
//! tens of microseconds even while every core runs a busy thread (a
//! standalone test on this VM: wake-up p99 59 µs beside two spinning
//! threads, a 500 µs burst not stretched), so a thread beyond the total for
//! high-priority work would not wait out anybody's remainder. Sending the
//! high class to a borrowed thread whenever the pool's thread was busy
//! (marking it `bypass`, in W2-pool-split) made its p99 5.7x alone and
//! goodput 64.7% against 76.7% the same run: the third runnable thread
//! takes its core from the tokio worker that takes the arrivals in.
//! Lowering the pool threads' OS priority (niceness 10) beside the workers
//! in W2-pool moved nothing beyond the runs' spread (goodput 56.8–73.0%
//! against 62.3–74.2%, two runs each).
//!
//! # When to prefer the pool
//!
//! Prefer the pool for work that cannot yield, or should not: a call into
//! a library that computes for a long time (`serde_json::from_slice` on a
//! large body, `flate2`, image codecs), or a loop whose yields would cost
//! more than they save. Such work in an async handler blocks its worker
//! whatever admission does; in the pool it waits in order and runs without
//! delaying the workers.
//!
//! Keep handlers that yield between short chunks, and handlers that mostly
//! await IO, on the runtime behind a [`cpu::Controller`](crate::cpu::Controller)
//! or a [`WorkQueue`](crate::WorkQueue): they need a worker only between awaits, and
//! moving them to a thread each would hold the thread through the awaits.
//!
//! # Why plain threads, not rayon
//!
//! The default is plain `std` threads, and there is no `rayon` feature.
//! rayon's pool has a scheduler of its own (work-stealing deques, LIFO per
//! thread), which would reorder the work admission has just ordered,
//! unless it were fed one job per free thread, which is all these threads
//! do; `rayon::spawn` aborts the process on a panic unless the pool has a
//! panic handler, which cannot hand the panic back to the one caller that
//! sent the closure; and rayon does not say how many of its threads are
//! busy, which is the signal this pool exists to make exact. A closure that
//! wants data parallelism can still call into a rayon pool of its own.

mod builder;
mod handoff;
mod task;
mod worker;

#[cfg(loom)]
#[doc(hidden)]
pub mod loom_models;

pub use builder::CpuPoolBuilder;
pub use task::{PoolError, PoolTask};

use std::fmt;
use std::thread::JoinHandle;

use self::worker::PoolShared;
use crate::error::ConfigError;
use crate::grant::SlotSnapshot;
use crate::health::ComponentHealth;
use crate::observe::QueueSnapshot;
use crate::sync::{StdArc, StdMutex};
use crate::work::{TenantId, TenantWeight, WorkInfo};

/// A pool of OS threads whose only queue is a [`WorkQueue`](crate::WorkQueue):
/// see the [module documentation](self).
///
/// Built with [`CpuPool::builder`]. Not `Clone`: it owns its threads and
/// joins them when dropped; share it behind an `Arc`. The [`PoolTask`]s it
/// returns hold only what they need, and may outlive it (they then fail
/// with [`PoolError::Closed`] unless their closure had started).
pub struct CpuPool {
    shared: StdArc<PoolShared>,
    /// The pool's own threads, joined by `close`.
    threads: StdMutex<Vec<JoinHandle<()>>>,
}

/// A consistent-per-part copy of a pool's state.
///
/// The thread counters are copied under the pool's dispatch lock, the
/// queue's under the queue's lock, one after the other: each part is
/// exact, and the two may be a hand-off apart.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PoolSnapshot {
    /// The pool's own threads (the slot total).
    pub threads: usize,
    /// Whether a thread whose closure returned collects the grant its slot
    /// made: as set by [`CpuPoolBuilder::collect_grants`], or as `build`
    /// chose from the cores. Fixed when the pool is built.
    pub collects_grants: bool,
    /// Threads running a closure now, borrowed ones included.
    pub busy: usize,
    /// Borrowed threads alive now (bypass work beyond the total).
    pub borrowed: usize,
    /// Work admitted and handed over, not yet taken by a thread.
    pub dispatched: usize,
    /// Work waiting for admission in the queue (the queue length).
    pub queued: usize,
    /// Closures that returned.
    pub completed: u64,
    /// Closures that panicked (each came back as [`PoolError::Panicked`]).
    pub panicked: u64,
    /// Admitted work skipped because its [`PoolTask`] was dropped before a
    /// thread took it.
    pub abandoned: u64,
    /// Whether the pool has been closed ([`CpuPool::close`]).
    pub closed: bool,
    /// The admission queue's own snapshot (per priority, per tenant, slots).
    pub queue: QueueSnapshot<SlotSnapshot>,
    /// Panics caught outside closures by the threads' backstop (none
    /// expected: a closure's own panic is counted in `panicked`).
    pub thread_health: ComponentHealth,
}

impl CpuPool {
    /// A builder with the default settings: one thread per available core.
    pub fn builder() -> CpuPoolBuilder {
        CpuPoolBuilder::default()
    }

    /// Runs `f` on a pool thread once `work` is admitted.
    ///
    /// Nothing happens until the returned future is polled; it resolves to
    /// what `f` returned or to a [`PoolError`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the task before `f` has started means `f` never runs and its
    /// slot goes to the next waiter; dropping it after `f` started lets `f`
    /// finish on its thread and drops its result.
    ///
    /// # Errors
    ///
    /// The task resolves to [`PoolError::Admit`] with the queue's
    /// [`AdmitError`](crate::AdmitError) when `work` is not admitted,
    /// [`PoolError::Panicked`] when `f` panicked, or [`PoolError::Closed`] when
    /// the pool shut down first.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::pool::{CpuPool, PoolError};
    /// use admission::{Priority, TenantId, WorkInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = CpuPool::builder().threads(1).build()?;
    /// let work = || WorkInfo::new(TenantId::new(7), Priority::NORMAL);
    /// let sum = pool.spawn(work(), || (1..=100u64).sum::<u64>()).await?;
    /// assert_eq!(sum, 5_050);
    ///
    /// // A panic comes back as an error; the thread goes on to the next job.
    /// let panicked = pool.spawn(work(), || -> u64 { panic!("bad input") }).await;
    /// assert!(matches!(panicked, Err(PoolError::Panicked { .. })));
    /// assert_eq!(pool.spawn(work(), || 1).await?, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn<F, T>(&self, work: WorkInfo, f: F) -> PoolTask<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        PoolTask::new(self.shared.clone(), work, f)
    }

    /// The pool's own threads (the slot total), fixed when it is built.
    /// Lock-free, unlike [`snapshot`](Self::snapshot).
    pub fn threads(&self) -> usize {
        self.shared.threads()
    }

    /// Sets one tenant's weight in the pool's queue, effective for the next
    /// grant; see [`WorkQueue::set_tenant_weight`](crate::WorkQueue::set_tenant_weight)
    /// (at most `max_tenants` weights other than the default).
    ///
    /// # Errors
    ///
    /// As [`WorkQueue::set_tenant_weight`](crate::WorkQueue::set_tenant_weight):
    /// a [`ConfigError`] naming `tenant_weight` when the weight would be one
    /// more than `max_tenants` other than the default.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::pool::CpuPool;
    /// use admission::{Priority, TenantId, TenantWeight, WorkInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = CpuPool::builder().threads(2).build()?;
    /// let tenant = TenantId::new(7);
    /// pool.spawn(WorkInfo::new(tenant, Priority::NORMAL), || ()).await?;
    /// // Under backlog, tenant 7 now gets three threads for every one of an
    /// // unweighted tenant's.
    /// pool.set_tenant_weight(tenant, TenantWeight::new(3)?)?;
    /// let seen = pool.snapshot().queue.tenants;
    /// let weight = seen.iter().find(|t| t.tenant == tenant).map(|t| t.weight);
    /// assert_eq!(weight, Some(TenantWeight::new(3)?));
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_tenant_weight(
        &self,
        tenant: TenantId,
        weight: TenantWeight,
    ) -> Result<(), ConfigError> {
        self.shared.queue().set_tenant_weight(tenant, weight)
    }

    /// Replaces every tenant's weight in the pool's queue; see
    /// [`WorkQueue::set_tenant_weights`](crate::WorkQueue::set_tenant_weights).
    ///
    /// # Errors
    ///
    /// As [`WorkQueue::set_tenant_weights`](crate::WorkQueue::set_tenant_weights):
    /// a [`ConfigError`] naming `tenant_weight` when more than `max_tenants`
    /// of `weights` are not the default, the table then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::pool::CpuPool;
    /// use admission::{Priority, TenantId, TenantWeight, WorkInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = CpuPool::builder().threads(2).build()?;
    /// let (a, b) = (TenantId::new(1), TenantId::new(2));
    /// for tenant in [a, b] {
    ///     pool.spawn(WorkInfo::new(tenant, Priority::NORMAL), || ()).await?;
    /// }
    /// pool.set_tenant_weight(a, TenantWeight::new(3)?)?;
    /// // A tenant left out goes back to the default weight.
    /// pool.set_tenant_weights([(b, TenantWeight::new(2)?)])?;
    /// let tenants = pool.snapshot().queue.tenants;
    /// let weights: Vec<_> = tenants.iter().map(|t| (t.tenant, t.weight.get())).collect();
    /// assert_eq!(weights, [(a, 1), (b, 2)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_tenant_weights(
        &self,
        weights: impl IntoIterator<Item = (TenantId, TenantWeight)>,
    ) -> Result<(), ConfigError> {
        self.shared.queue().set_tenant_weights(weights)
    }

    /// Periodic upkeep of the pool's queue; see
    /// [`WorkQueue::maintain`](crate::WorkQueue::maintain). Optional: the
    /// queue bounds its own tables without it.
    pub fn maintain(&self) {
        self.shared.queue().maintain();
    }

    /// The pool's state now: threads busy and work queued, exactly.
    pub fn snapshot(&self) -> PoolSnapshot {
        self.shared.snapshot()
    }

    /// Sets the pool's gauges and the queue's in the
    /// [`export`](crate::export) module. Call it on a timer; it does nothing
    /// without the `metrics` feature.
    pub fn record_metrics(&self) {
        #[cfg(feature = "metrics")]
        {
            let snapshot = self.snapshot();
            crate::export::pool_levels(snapshot.threads, snapshot.busy, snapshot.borrowed);
            // The work waiting for a thread: the queue's own gauges, under
            // its `queue` label.
            self.shared.queue().record_metrics();
        }
    }

    /// Closes the pool: work waiting in the queue, and every later spawn,
    /// fails with [`PoolError::Closed`]; work already admitted runs; then
    /// the threads, borrowed ones included, are joined. Blocks until every
    /// running closure has returned. Idempotent.
    ///
    /// Called from one of the pool's own threads (a closure that closes its
    /// pool), it joins every thread but that one, which ends when the
    /// closure returns.
    pub fn close(&self) {
        let borrowed = self.shared.close();
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(crate::sync::recover));
        let current = std::thread::current().id();
        for thread in threads.into_iter().chain(borrowed) {
            if thread.thread().id() == current {
                continue;
            }
            // A thread's loop catches every panic (see `worker.rs`), so a
            // join error is impossible; nothing would be left to clean up.
            let _ = thread.join();
        }
        tracing::debug!(target: "admission", "CPU pool closed and its threads joined");
    }
}

impl Drop for CpuPool {
    fn drop(&mut self) {
        self.close();
    }
}

impl fmt::Debug for CpuPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuPool")
            .field("threads", &self.shared.threads())
            .field("collects_grants", &self.shared.collects_grants())
            .field("closed", &self.shared.is_closed())
            .finish_non_exhaustive()
    }
}
