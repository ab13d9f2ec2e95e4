//! The admission envelope: the physical resources built around a committed
//! grant, as one transaction.
//!
//! # Implementation notes
//!
//! The ledger commits the attempt slot and the immutable grant under its
//! lock; the envelope is then built **outside** any lock, in five steps:
//!
//! 1. attempt lane ([`BackendOps::open_lane`](crate::gpu::backend::BackendOps::open_lane));
//! 2. root stream ([`BackendOps::create_root_stream`](crate::gpu::backend::BackendOps::create_root_stream));
//! 3. allocation domain, ceiling = grant ([`BackendOps::open_domain`](crate::gpu::backend::BackendOps::open_domain) and an
//!    [`AllocationDomain`]);
//! 4. root-stream membership in the domain ([`BackendOps::join_domain`](crate::gpu::backend::BackendOps::join_domain));
//! 5. device worker scope ([`BackendOps::open_worker_scope`](crate::gpu::backend::BackendOps::open_worker_scope)).
//!
//! **The build runs as one job on the device's worker thread**
//! ([`DeviceWorker`]). Creating a stream can synchronize the device, so it
//! must stay off tokio's workers anyway; and running the whole transaction
//! in one job makes it cancel-safe without any bookkeeping in the future:
//! dropping the build future sets a flag that the job checks after every
//! step, and a finished envelope that nobody receives any more is rolled
//! back by the job itself. [`AdmissionEnvelope`] values exist only after all
//! five steps succeeded, so partial admission is never visible.
//!
//! **Rollback** first waits for stream clean-up (it synchronizes the root
//! stream on the worker, when one was created), then undoes the completed
//! steps in exact reverse order. It runs every undo even when one fails and
//! collects the errors; a [`BackendError::Fault`] among them is surfaced
//! (with its isolation) so the caller can quarantine the device.
//!
//! **Execution** obtains [`ExecutionContext`]s (each a stream forked from the
//! root; the root counts against the stream bound) and [`SourcePermit`]s
//! (bounded by the source-work allowance). Both hold the envelope's shared
//! state alive. Allocations go through the context into the allocation
//! domain, so the grant is enforced before any driver call.
//!
//! **Teardown** ([`AdmissionEnvelope::teardown`]) waits until every context
//! and permit has been dropped (contexts are then idle), and then, on the
//! worker: synchronizes the root (a failure there is a device fault),
//! hands what that showed to the seal callback (below), then frees
//! allocations still outstanding (reported as leaks) and undoes the five
//! steps in reverse, the lane last. A dropped context destroys its forked stream by a
//! job on the same FIFO worker, so forks always go before the root.
//! Dropping an envelope without a teardown never blocks: when the last
//! holder of its shared state drops, the same teardown is queued on the
//! worker and its report goes to the spec's report sink, if any (and to
//! `tracing` when it is not clean). Releasing the lane, grant and slot in
//! the ledger is the caller's, and comes after the teardown.
//!
//! **Teardown callbacks** are how the caller learns that the physical
//! resources are gone, whichever way the teardown ran: they are called
//! once, with the report, right after either teardown (awaited or implicit)
//! finished on the worker, or in place of a teardown that could not run at
//! all (an abandoned report). Both are the query service's, set once when
//! it publishes a handle; nothing outside the crate can add, replace or
//! remove one, so nothing can come between a teardown and the return of
//! its grant:
//!
//! * the **seal callback**, set with the release callback (crate-private):
//!   called once between the synchronization and the first destruction,
//!   so the service seals the attempt report before any resource goes (or,
//!   when the teardown never got that far, first thing in the callbacks);
//! * the **release callback**, set once by the query service when it
//!   publishes a handle (crate-private): it returns the grant to the
//!   ledger, so a handle dropped without release still returns its grant,
//!   after its resources, and without blocking in `Drop`.
//!
//! The teardown job catches a panic of its own physical part (the crate's
//! bug, since every backend call is behind the `gpu_backend` boundary in a
//! service) and reports it as [`DeviceFinding::Interrupted`]: what was
//! released is unknown, so the device is quarantined, and the callbacks
//! still run.

use std::fmt;

use tokio::sync::{mpsc as tokio_mpsc, oneshot, Notify};

use crate::gpu::backend::{
    BackendError, BackendOp, DeviceOrdinal, DomainId, LaneId, ScopeId, SharedBackend, StreamId,
};
use crate::gpu::domain::{AllocationDomain, LeakReport};

mod context;
mod report;

use crate::gpu::worker::{DeviceWorker, JobError, Reply, WorkerGone};
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering, StdArc};
pub use context::{ExecutionContext, SourcePermit};
pub(crate) use report::{BuildError, RollbackReport};
pub use report::{
    BuildStep, DeviceFinding, Disposition, EnvelopeError, StepOutcome, TeardownReport,
};

/// Per-attempt bounds on the physical resources an envelope may take, from
/// the device's resource profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttemptBounds {
    /// Streams the attempt may hold at once, the root included; at most
    /// `max_streams - 1` execution contexts can exist at once.
    pub max_streams: u32,
    /// Worker scopes the attempt may take (an envelope takes one).
    pub max_workers: u32,
    /// Attempt lanes the attempt may take (an envelope takes one).
    pub max_lanes: u32,
    /// Concurrent source reads the attempt may run
    /// ([`AdmissionEnvelope::try_source_permit`]).
    pub source_work_allowance: u32,
}

/// What an envelope is built from: plain values the ledger committed.
/// Crate-private: a spec carries grant bytes, which only a ledger commit
/// may produce.
#[derive(Clone, Debug)]
pub(crate) struct EnvelopeSpec {
    /// The selected device.
    pub(crate) device: DeviceOrdinal,
    /// The immutable grant's bytes: the allocation domain's ceiling.
    pub(crate) grant_bytes: u64,
    /// The per-attempt resource bounds.
    pub(crate) bounds: AttemptBounds,
    /// Where reports of clean-ups nobody awaits go: a teardown run because
    /// the envelope was dropped, or the rollback of a cancelled build.
    pub(crate) report_sink: Option<tokio_mpsc::UnboundedSender<TeardownReport>>,
}

/// What the build has created so far.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    lane: Option<LaneId>,
    root: Option<StreamId>,
    domain: Option<DomainId>,
    joined: bool,
    scope: Option<ScopeId>,
}

fn record(steps: &mut Vec<StepOutcome>, op: BackendOp, result: Result<(), BackendError>) {
    steps.push(StepOutcome {
        op,
        error: result.err(),
    });
}

/// Undoes `progress` in reverse order, after waiting for the root stream
/// when `wait_for_root` (a teardown has waited already). Runs on the worker.
fn undo(
    backend: &SharedBackend,
    progress: Progress,
    wait_for_root: bool,
    steps: &mut Vec<StepOutcome>,
) {
    if let (true, Some(root)) = (wait_for_root, progress.root) {
        record(steps, BackendOp::Synchronize, backend.synchronize(root));
    }
    if let Some(scope) = progress.scope {
        record(
            steps,
            BackendOp::CloseWorkerScope,
            backend.close_worker_scope(scope),
        );
    }
    if let (true, Some(domain), Some(root)) = (progress.joined, progress.domain, progress.root) {
        record(
            steps,
            BackendOp::LeaveDomain,
            backend.leave_domain(domain, root),
        );
    }
    if let Some(domain) = progress.domain {
        record(steps, BackendOp::CloseDomain, backend.close_domain(domain));
    }
    if let Some(root) = progress.root {
        record(
            steps,
            BackendOp::DestroyStream,
            backend.destroy_stream(root),
        );
    }
    if let Some(lane) = progress.lane {
        record(steps, BackendOp::CloseLane, backend.close_lane(lane));
    }
}

enum BuildOutcome {
    Built(Progress),
    Failed {
        step: BuildStep,
        error: BackendError,
        rollback: RollbackReport,
    },
    Cancelled(RollbackReport),
}

/// The five steps, on the worker, checking for cancellation after each.
fn build_on_worker(
    backend: &SharedBackend,
    device: DeviceOrdinal,
    grant_bytes: u64,
    cancelled: &AtomicBool,
) -> BuildOutcome {
    let mut p = Progress::default();
    for step in BuildStep::ALL {
        if cancelled.load(Ordering::Acquire) {
            let mut rollback = RollbackReport::default();
            undo(backend, p, true, &mut rollback.steps);
            return BuildOutcome::Cancelled(rollback);
        }
        let done = match step {
            BuildStep::AttemptLane => backend.open_lane(device).map(|l| p.lane = Some(l)),
            BuildStep::RootStream => p
                .lane
                .ok_or(BackendError::UnknownHandle {
                    op: step.op(),
                    id: 0,
                })
                .and_then(|l| backend.create_root_stream(l))
                .map(|s| p.root = Some(s)),
            BuildStep::AllocationDomain => p
                .lane
                .ok_or(BackendError::UnknownHandle {
                    op: step.op(),
                    id: 0,
                })
                .and_then(|l| backend.open_domain(l, grant_bytes))
                .map(|d| p.domain = Some(d)),
            BuildStep::RootMembership => match (p.domain, p.root) {
                (Some(d), Some(r)) => backend.join_domain(d, r).map(|()| p.joined = true),
                _ => Err(BackendError::UnknownHandle {
                    op: step.op(),
                    id: 0,
                }),
            },
            BuildStep::WorkerScope => p
                .lane
                .ok_or(BackendError::UnknownHandle {
                    op: step.op(),
                    id: 0,
                })
                .and_then(|l| backend.open_worker_scope(l))
                .map(|s| p.scope = Some(s)),
        };
        if let Err(error) = done {
            let mut rollback = RollbackReport::default();
            undo(backend, p, true, &mut rollback.steps);
            return BuildOutcome::Failed {
                step,
                error,
                rollback,
            };
        }
    }
    if cancelled.load(Ordering::Acquire) {
        let mut rollback = RollbackReport::default();
        undo(backend, p, true, &mut rollback.steps);
        return BuildOutcome::Cancelled(rollback);
    }
    BuildOutcome::Built(p)
}

fn deliver(sink: Option<&tokio_mpsc::UnboundedSender<TeardownReport>>, report: TeardownReport) {
    if report.disposition != Disposition::Clean && report.disposition != Disposition::Cancelled {
        tracing::warn!(
            target: "admission",
            device = %report.device,
            disposition = ?report.disposition,
            errors = report.errors.len(),
            "GPU envelope clean-up nobody awaited did not finish cleanly"
        );
    }
    if let Some(sink) = sink {
        let _ = sink.send(report);
    }
}

/// Called once with the report of an envelope's teardown (or of a build
/// nobody received): the query service's seal and release paths.
pub(crate) type TeardownCallback = Box<dyn FnOnce(&TeardownReport) + Send + 'static>;

/// An envelope's teardown callbacks: the query service's seal and release
/// path. See the [module documentation](self).
struct Callbacks {
    seal: Mutex<Option<TeardownCallback>>,
    release: Mutex<Option<TeardownCallback>>,
}

impl Callbacks {
    /// Runs the seal callback with the facts known before destruction (the
    /// synchronization's), at most once over the envelope's life.
    fn seal(&self, report: &TeardownReport) {
        let seal = self.seal.lock().take();
        if let Some(seal) = seal {
            seal(report);
        }
    }

    /// Runs the seal callback if nothing sealed yet (a teardown that
    /// panicked before its synchronization, or could not run), then the
    /// release callback, each at most once over the envelope's life. No
    /// lock is held during a call, so callbacks may take other locks.
    fn run(&self, report: &TeardownReport) {
        self.seal(report);
        let release = self.release.lock().take();
        if let Some(release) = release {
            release(report);
        }
    }
}

/// The duty to tell the caller how a build it never received ended: the
/// query service's callback that returns the grant, called exactly once
/// with the rollback's report, after the rollback, unless the caller
/// received the outcome (and answers for it) and [disarmed](Self::disarm)
/// it. Dropped undischarged (the job was dropped unrun, the worker is gone)
/// it reports an abandoned clean-up, whose reach is unknown.
pub(crate) struct Unreceived {
    callback: Option<TeardownCallback>,
    device: DeviceOrdinal,
    grant_bytes: u64,
}

impl Unreceived {
    fn discharge(mut self, report: &TeardownReport) {
        if let Some(callback) = self.callback.take() {
            callback(report);
        }
    }

    fn disarm(mut self) {
        self.callback = None;
    }
}

impl Drop for Unreceived {
    fn drop(&mut self) {
        if let Some(callback) = self.callback.take() {
            callback(&TeardownReport::abandoned(
                self.device,
                self.grant_bytes,
                true,
            ));
        }
    }
}

/// A build's outcome on its way to the build future, owning what it built
/// until the future [claims](Self::claim) it. The worker sends it once the
/// five steps are done; the future may be dropped at any moment after that
/// and before it is polled again, and the value then dies unreceived inside
/// the channel. Its `Drop` is what rolls that envelope back (on the worker,
/// where clean-up may block) and only then discharges the duty, so the
/// grant returns after the physical resources, never before.
struct Delivered {
    outcome: Option<BuildOutcome>,
    duty: Option<Unreceived>,
    backend: SharedBackend,
    worker: StdArc<DeviceWorker>,
    sink: Option<tokio_mpsc::UnboundedSender<TeardownReport>>,
    device: DeviceOrdinal,
    grant_bytes: u64,
}

impl Delivered {
    /// Takes the outcome: the receiver answers for it from now on.
    fn claim(&mut self) -> Option<BuildOutcome> {
        if let Some(duty) = self.duty.take() {
            duty.disarm();
        }
        self.outcome.take()
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        let Some(outcome) = self.outcome.take() else {
            return;
        };
        let duty = self.duty.take();
        let (backend, sink) = (self.backend.clone(), self.sink.clone());
        let (device, grant) = (self.device, self.grant_bytes);
        let roll_back = move || {
            let rollback = match outcome {
                BuildOutcome::Built(progress) => {
                    let mut rollback = RollbackReport::default();
                    undo(&backend, progress, true, &mut rollback.steps);
                    rollback
                }
                BuildOutcome::Failed { rollback, .. } | BuildOutcome::Cancelled(rollback) => {
                    rollback
                }
            };
            let mut report =
                TeardownReport::finish(device, grant, true, rollback.steps, Vec::new(), None);
            if report.disposition == Disposition::Clean {
                report.disposition = Disposition::Cancelled;
            }
            if let Some(duty) = duty {
                duty.discharge(&report);
            }
            deliver(sink.as_ref(), report);
        };
        if self.worker.is_current() {
            roll_back();
        } else if self.worker.submit_detached(roll_back).is_err() {
            // The job was dropped unrun with the duty in it: the abandoned
            // report went to the callback already.
            tracing::error!(target: "admission", %device, "cannot roll back an unreceived GPU envelope: the worker is gone");
        }
    }
}

/// Sets the flag when the build future is dropped.
struct CancelOnDrop(StdArc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The built resources of one attempt. See the [module documentation](self).
///
/// An envelope exists only around a grant the ledger committed, and its
/// teardown always returns that grant: from outside the crate it can be
/// neither built nor given a teardown callback.
///
/// ```compile_fail,E0624
/// use admission::gpu::envelope::AdmissionEnvelope;
/// // Building is crate-private: no grant bytes can skip the ledger.
/// let _ = AdmissionEnvelope::build;
/// ```
///
/// ```compile_fail,E0599
/// fn hook(handle: &admission::gpu::QueryHandle) {
///     // No callback can be added to, or replace, the one that returns the
///     // grant.
///     handle.envelope().on_teardown(|_| {});
/// }
/// ```
#[derive(Debug)]
pub(crate) struct AdmissionEnvelope {
    shared: StdArc<Shared>,
}

struct Shared {
    backend: SharedBackend,
    worker: StdArc<DeviceWorker>,
    spec: EnvelopeSpec,
    lane: LaneId,
    root: StreamId,
    scope: ScopeId,
    domain: StdArc<AllocationDomain>,
    forks: AtomicU64,
    /// Dropped forks whose destroy job has not run yet.
    destroying: StdArc<AtomicU64>,
    source_reads: AtomicU64,
    active: AtomicU64,
    idle: Notify,
    torn_down: AtomicBool,
    deferred: StdArc<Mutex<Vec<BackendError>>>,
    callbacks: StdArc<Callbacks>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("device", &self.spec.device)
            .field("grant_bytes", &self.spec.grant_bytes)
            .field("lane", &self.lane)
            .field("root", &self.root)
            .field("domain", &self.domain)
            .field("forks", &self.forks.load(Ordering::Relaxed))
            .field("source_reads", &self.source_reads.load(Ordering::Relaxed))
            .finish()
    }
}

impl Shared {
    fn release_activity(&self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_one();
        }
    }

    /// The teardown job: runs on the worker.
    fn teardown_job(&self, implicit: bool) -> impl FnOnce() -> TeardownReport + Send + 'static {
        let backend = self.backend.clone();
        let domain = self.domain.clone();
        let deferred = self.deferred.clone();
        let callbacks = self.callbacks.clone();
        let streams = self.worker.stream_counter();
        let (device, grant, lane, root, scope) = (
            self.spec.device,
            self.spec.grant_bytes,
            self.lane,
            self.root,
            self.scope,
        );
        move || {
            let physical = || {
                // The seed's release order: the contexts are idle (awaited
                // before this job was queued); the synchronization decides
                // disposition and health; the report is sealed on those;
                // only then are the resources destroyed, the lane last, and
                // the grant returned by the release callback after that.
                let mut steps = Vec::new();
                record(
                    &mut steps,
                    BackendOp::Synchronize,
                    backend.synchronize(root),
                );
                let mut errors = std::mem::take(&mut *deferred.lock());
                let sealed = TeardownReport::finish(
                    device,
                    grant,
                    implicit,
                    steps.clone(),
                    errors.clone(),
                    Some((&domain, LeakReport::default())),
                );
                callbacks.seal(&sealed);
                let leaked = domain.free_outstanding(root);
                let progress = Progress {
                    lane: Some(lane),
                    root: Some(root),
                    domain: Some(domain.id()),
                    joined: true,
                    scope: Some(scope),
                };
                let before = steps.len();
                undo(&backend, progress, false, &mut steps);
                // A failed destroy still forgets the id (the backend
                // contract), so the stream leaves the count either way.
                let root_released = steps
                    .get(before..)
                    .unwrap_or_default()
                    .iter()
                    .any(|s| s.op == BackendOp::DestroyStream);
                if root_released {
                    streams.closed();
                }
                errors.extend(std::mem::take(&mut *deferred.lock()));
                TeardownReport::finish(
                    device,
                    grant,
                    implicit,
                    steps,
                    errors,
                    Some((&domain, leaked)),
                )
            };
            // The callbacks must run whatever the physical part did: the
            // release callback is what returns the grant.
            let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(physical))
                .unwrap_or_else(|_| {
                    tracing::error!(target: "admission", %device, "a GPU envelope teardown panicked part-way");
                    TeardownReport::interrupted(device, grant, implicit)
                });
            callbacks.run(&report);
            report
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.torn_down.load(Ordering::Acquire) {
            return;
        }
        let job = self.teardown_job(true);
        let sink = self.spec.report_sink.clone();
        let submitted = self.worker.submit_detached(move || {
            let report = job();
            deliver(sink.as_ref(), report);
        });
        if submitted.is_err() {
            let report = TeardownReport::abandoned(self.spec.device, self.spec.grant_bytes, true);
            self.callbacks.run(&report);
            deliver(self.spec.report_sink.as_ref(), report);
        }
    }
}

impl AdmissionEnvelope {
    /// Builds the envelope of an attempt whose slot and grant the ledger has
    /// committed: the five steps on `worker` (the device's worker), rolled
    /// back in reverse on failure or when this future is dropped.
    /// Crate-private (the envelope's own tests and, with `gpu-tests`, the
    /// device checks): anything else would build an envelope around bytes
    /// no ledger granted.
    #[cfg(any(test, feature = "gpu-tests"))]
    #[cfg(test)]
    pub(crate) async fn build(
        backend: SharedBackend,
        worker: StdArc<DeviceWorker>,
        spec: EnvelopeSpec,
    ) -> Result<Self, BuildError> {
        Self::build_with(backend, worker, spec, None).await
    }

    /// [`build`](Self::build), with the callback that learns of a rollback
    /// nobody received (see [`Unreceived`]).
    ///
    /// Not an `async fn`: the checks run and the build job is queued when
    /// this is called, so even a future dropped before its first poll has a
    /// job on the worker that sees the cancellation and answers for the
    /// callback.
    pub(crate) fn build_with(
        backend: SharedBackend,
        worker: StdArc<DeviceWorker>,
        spec: EnvelopeSpec,
        on_unreceived: Option<TeardownCallback>,
    ) -> impl std::future::Future<Output = Result<Self, BuildError>> + Send + 'static {
        let (device, grant) = (spec.device, spec.grant_bytes);
        let duty = Unreceived {
            callback: on_unreceived,
            device,
            grant_bytes: grant,
        };
        let started = Self::start_build(&backend, &worker, &spec, duty);
        async move {
            let (rx, _cancel_on_drop) = started?;
            let mut delivered = match rx.await {
                Ok(Some(delivered)) => delivered,
                // The job unwound: the worker caught the panic and goes on.
                Ok(None) => return Err(BuildError::Interrupted { device }),
                Err(_) => return Err(BuildError::WorkerGone(WorkerGone { device })),
            };
            // Received: from here the caller answers for the outcome, and
            // nothing below awaits, so it cannot be lost again.
            let outcome = delivered.claim();
            match outcome {
                Some(BuildOutcome::Built(p)) => Self::assemble(backend, worker, spec, p),
                Some(BuildOutcome::Failed {
                    step,
                    error,
                    rollback,
                }) => Err(BuildError::Step {
                    step,
                    error,
                    rollback,
                }),
                // Only reachable if this future was dropped, which it was
                // not; `None` only once claimed, and it was claimed here.
                Some(BuildOutcome::Cancelled(rollback)) => Err(BuildError::Step {
                    step: BuildStep::AttemptLane,
                    error: BackendError::UnknownHandle {
                        op: BackendOp::OpenLane,
                        id: 0,
                    },
                    rollback,
                }),
                None => Err(BuildError::Interrupted { device }),
            }
        }
    }

    /// Validates the spec and queues the build job; what the future then
    /// awaits, and the flag its drop raises.
    #[allow(clippy::type_complexity)]
    fn start_build(
        backend: &SharedBackend,
        worker: &StdArc<DeviceWorker>,
        spec: &EnvelopeSpec,
        duty: Unreceived,
    ) -> Result<(oneshot::Receiver<Option<Delivered>>, CancelOnDrop), BuildError> {
        for (field, value) in [
            ("max_streams", spec.bounds.max_streams),
            ("max_workers", spec.bounds.max_workers),
            ("max_lanes", spec.bounds.max_lanes),
        ] {
            if value == 0 {
                // The caller hears of it, so the duty is its own again.
                duty.disarm();
                return Err(BuildError::InvalidBounds { field, value });
            }
        }
        if worker.device() != spec.device {
            duty.disarm();
            return Err(BuildError::WrongWorker {
                worker: worker.device(),
                device: spec.device,
            });
        }
        let cancelled = StdArc::new(AtomicBool::new(false));
        let cancel_on_drop = CancelOnDrop(cancelled.clone());
        let (reply, rx) = Reply::channel();
        let job_backend = backend.clone();
        let job_worker = worker.clone();
        let (device, grant) = (spec.device, spec.grant_bytes);
        let sink = spec.report_sink.clone();
        worker
            .submit_detached(move || {
                let outcome = build_on_worker(&job_backend, device, grant, &cancelled);
                let delivered = Delivered {
                    outcome: Some(outcome),
                    duty: Some(duty),
                    backend: job_backend,
                    worker: job_worker,
                    sink,
                    device,
                    grant_bytes: grant,
                };
                // A refused send hands the value back: dropping it here, on
                // the worker, rolls it back in place.
                let _ = reply.send(delivered);
            })
            // A refused job was dropped unrun, and its duty with it, which
            // reported the abandoned build to the callback already.
            .map_err(BuildError::WorkerGone)?;
        Ok((rx, cancel_on_drop))
    }

    /// The envelope around the five built resources.
    fn assemble(
        backend: SharedBackend,
        worker: StdArc<DeviceWorker>,
        spec: EnvelopeSpec,
        p: Progress,
    ) -> Result<Self, BuildError> {
        let (Some(lane), Some(root), Some(domain), Some(scope)) =
            (p.lane, p.root, p.domain, p.scope)
        else {
            // `build_on_worker` returns `Built` only with every step done.
            return Err(BuildError::Step {
                step: BuildStep::WorkerScope,
                error: BackendError::UnknownHandle {
                    op: BackendOp::OpenWorkerScope,
                    id: 0,
                },
                rollback: RollbackReport::default(),
            });
        };
        let domain = StdArc::new(AllocationDomain::new(
            backend.clone(),
            domain,
            spec.device,
            spec.grant_bytes,
        ));
        // The root stream is live from here until the teardown destroys it.
        worker.stream_counter().opened();
        Ok(Self {
            shared: StdArc::new(Shared {
                backend,
                worker,
                spec,
                lane,
                root,
                scope,
                domain,
                forks: AtomicU64::new(0),
                destroying: StdArc::new(AtomicU64::new(0)),
                source_reads: AtomicU64::new(0),
                active: AtomicU64::new(0),
                idle: Notify::new(),
                torn_down: AtomicBool::new(false),
                deferred: StdArc::new(Mutex::new(Vec::new())),
                callbacks: StdArc::new(Callbacks {
                    seal: Mutex::new(None),
                    release: Mutex::new(None),
                }),
            }),
        })
    }

    /// The device.
    pub(crate) fn device(&self) -> DeviceOrdinal {
        self.shared.spec.device
    }

    /// Sets the crate's callbacks, once, when the service publishes a
    /// handle: `seal` runs on the worker after the teardown's
    /// synchronization and before anything is destroyed, with the
    /// disposition and health known then; `release` runs after the
    /// destruction.
    pub(crate) fn set_callbacks(
        &self,
        seal: impl FnOnce(&TeardownReport) + Send + 'static,
        release: impl FnOnce(&TeardownReport) + Send + 'static,
    ) {
        let callbacks = &self.shared.callbacks;
        *callbacks.seal.lock() = Some(Box::new(seal));
        *callbacks.release.lock() = Some(Box::new(release));
    }

    /// The root stream.
    #[cfg(all(test, feature = "gpu-tests"))]
    pub(crate) fn root_stream(&self) -> StreamId {
        self.shared.root
    }

    /// The allocation domain.
    #[cfg(test)]
    pub(crate) fn domain(&self) -> &AllocationDomain {
        &self.shared.domain
    }

    /// Execution contexts alive now.
    #[cfg(test)]
    pub(crate) fn execution_contexts(&self) -> u64 {
        self.shared.forks.load(Ordering::Acquire)
    }

    /// Forks a stream from the root for one execution, within the stream
    /// bound (the root counts as one stream).
    pub(crate) fn execution_context(&self) -> Result<ExecutionContext, EnvelopeError> {
        let shared = &self.shared;
        let max_streams = shared.spec.bounds.max_streams;
        let limit = u64::from(max_streams.saturating_sub(1));
        // Dropped contexts whose streams the device worker has not yet
        // destroyed are bounded too, by as many again: beyond that the
        // device holds streams that no live context counts.
        if shared.destroying.load(Ordering::Acquire) > limit {
            return Err(EnvelopeError::StreamBound { max_streams });
        }
        take_bounded(&shared.forks, limit)
            .map_err(|()| EnvelopeError::StreamBound { max_streams })?;
        match shared.backend.fork_stream(shared.root) {
            Ok(stream) => {
                shared.worker.stream_counter().opened();
                shared.active.fetch_add(1, Ordering::AcqRel);
                Ok(ExecutionContext {
                    shared: shared.clone(),
                    stream,
                })
            }
            Err(error) => {
                shared.forks.fetch_sub(1, Ordering::AcqRel);
                Err(EnvelopeError::Backend(error))
            }
        }
    }

    /// A permit for one concurrent source read, within the source-work
    /// allowance.
    pub(crate) fn try_source_permit(&self) -> Result<SourcePermit, EnvelopeError> {
        let shared = &self.shared;
        let allowance = shared.spec.bounds.source_work_allowance;
        take_bounded(&shared.source_reads, u64::from(allowance))
            .map_err(|()| EnvelopeError::SourceWorkExhausted { allowance })?;
        shared.active.fetch_add(1, Ordering::AcqRel);
        Ok(SourcePermit {
            shared: shared.clone(),
        })
    }

    /// Releases the envelope: waits until every execution context and
    /// source permit is dropped, then synchronizes the root stream, frees
    /// outstanding allocations and destroys the resources in reverse order,
    /// on the worker. The caller then releases the grant and slot in the
    /// ledger (and quarantines per [`TeardownReport::fault_isolation`]).
    ///
    /// Dropping this future after the contexts went idle does not stop the
    /// teardown; dropping it before leaves the envelope to its drop path.
    pub(crate) async fn teardown(self) -> TeardownReport {
        let shared = &self.shared;
        while shared.active.load(Ordering::Acquire) != 0 {
            shared.idle.notified().await;
        }
        shared.torn_down.store(true, Ordering::Release);
        let job = shared.teardown_job(false);
        let (device, grant) = (shared.spec.device, shared.spec.grant_bytes);
        match shared.worker.submit(job).await {
            Ok(report) => report,
            // The job never ran: the callbacks still learn the outcome once.
            Err(JobError::Gone(_)) => {
                let report = TeardownReport::abandoned(device, grant, false);
                shared.callbacks.run(&report);
                report
            }
            // The job ran but unwound in its callbacks; those that did not
            // run yet run here, once.
            Err(JobError::Panicked { .. }) => {
                let report = TeardownReport::interrupted(device, grant, false);
                shared.callbacks.run(&report);
                report
            }
        }
    }
}

/// Takes one unit of `counter` if it is below `limit`.
fn take_bounded(counter: &AtomicU64, limit: u64) -> Result<(), ()> {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .map(|_| ())
        .map_err(|_| ())
}

#[cfg(all(test, not(loom)))]
mod tests;
