//! The query service: one per process, one bounded queue across every
//! device, one ledger and one worker thread per device.
//!
//! # From proof to handle
//!
//! ```text
//! ProofIssuer::lower ──▶ CapabilityProof ──service.ticket──▶ AdmissionTicket   (reserves nothing)
//!        ticket.admit().await:
//!          reserve a pending slot + FIFO sequence   (QueueFull / Closed at once)
//!          resolve outside the lock: compatible devices, floor, preflights
//!          queue ──scheduler──▶ ledger commit (slot + immutable grant)
//!          build the AdmissionEnvelope outside the lock (five steps)
//!        ──▶ QueryHandle ──release().await──▶ AttemptReport
//! ```
//!
//! Planning may hold a ticket without ever admitting (an explain does
//! exactly that): a ticket is a proof and a service reference, nothing
//! more. [`AdmissionTicket::lazy`] makes the rule structural: the first
//! execution step through the returned [`LazyAdmission`](super::LazyAdmission)
//! admits, and a path that never executes never admits. A resource-only handle ([`QueryService::resource_ticket`]) has
//! bytes and a device but no proof, so it cannot authorize a native plan.
//!
//! # One lock, never across an await
//!
//! Every ledger and the queue live in one `AdmissionCore` behind one
//! mutex. The lock is held for plain arithmetic only: no `.await`, no
//! backend call and no observer call happens under it. Wakers of waiters
//! resolved by a transaction are collected under the lock and woken after
//! it is released, so woken futures never contend with the transaction
//! that woke them, and queued work always sees the ledger state that
//! already includes the release that woke it.
//!
//! # Cancel safety
//!
//! The admit future owns its progress through a guard whose `Drop` undoes
//! exactly what is held at that point:
//!
//! * pending or queued: the waiter is withdrawn (a protection it holds is
//!   returned) and the queue rescheduled;
//! * granted but not yet observed: the parked grant goes back to its ledger
//!   in the same transaction;
//! * building the envelope: the grant sits in a slot shared with the
//!   build. The build job rolls itself back on the device worker once it
//!   sees the cancellation; an outcome the worker already sent and nobody
//!   received (the future dropped after `Built` arrived, before its next
//!   poll) is rolled back on the worker by the value's own `Drop`. Either
//!   way the grant returns only after the physical rollback finished.
//!
//! # Release without blocking in `Drop`
//!
//! A published handle sets its envelope's seal and release callbacks
//! (crate-private: nothing outside the crate can add or replace one).
//! Whether the handle is released
//! (the teardown is awaited) or dropped (the envelope queues its own
//! teardown when the last execution context goes), the callback runs on the
//! device worker: the [`AttemptReport`](super::AttemptReport) is sealed after the root stream's
//! synchronization and before any resource is destroyed; after the
//! destruction (the lane last) one transaction quarantines the device on a
//! proven stream-sync fault (or closes every ledger when the fault's reach
//! is unknown), releases the grant and reschedules. `Drop` only queues
//! work. The order is the seed's; see the table in [`super::handle`]. Every
//! path that returns a grant (a parked one on cancel, an unpublished one
//! after a failed or unreceived build, a published one after its teardown)
//! is in `release.rs`, under a table of who releases when, and so is the
//! admit future that holds a grant between them (`admit`, its guard and
//! `wait`): this module keeps the service, its builder (`builder.rs`), the
//! ticket (`ticket.rs`) and the one transaction (`transact`, in `inner.rs`).
//!
//! # Faults
//!
//! The seed's rule (`proven_isolation` in the envelope's reports):
//! a fault that a stream synchronization reported as
//! [`FaultIsolation::Device`](super::backend::FaultIsolation::Device) quarantines that ledger; any other fault
//! (a sticky code on a create, close or destroy, whose reach nothing
//! proved), an abandoned clean-up or a gone worker is
//! [`FaultIsolation::Unknown`](super::backend::FaultIsolation::Unknown) and closes every ledger. An operator may
//! [`reinstate`](QueryService::reinstate) a quarantined device after a
//! reset, once a health probe passes (beyond the seed, which requires a
//! restart); a closed ledger stays closed. In-flight grants of a quarantined or closed ledger
//! stay valid and drain normally; nothing new is issued there, a protection
//! held there moves to another compatible healthy ledger, and a waiter
//! left without any healthy compatible device fails with
//! [`GpuAdmitError::NoHealthyDevice`].

mod builder;
mod error;
mod inner;
mod ticket;

#[cfg(all(test, not(loom)))]
mod tests;

pub use self::builder::QueryServiceBuilder;
pub use self::error::{ReinstateError, ServiceError};
pub use self::ticket::AdmissionTicket;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;

pub(crate) use self::inner::Inner;
use super::backend::{BackendError, BackendOp, DeviceOrdinal, SharedBackend};
use super::ledger::{GrantRequest, LedgerError, LedgerSnapshot, LedgerState, WaiterId};
use super::observe::{GpuEvent, Observation};
use super::outcome::GpuAdmitError;
use super::profile::{DeviceSet, QueueBounds};
use super::proof::CapabilityProof;
use super::scheduler::{AdmissionSnapshot, CacheChange};
use crate::sync::StdArc;

/// The future a preflight hook returns: `Ok` when the device can run the
/// request, `Err(message)` when the preflight is unresolved (the request is
/// then rejected, never queued).
pub type PreflightFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>>;

pub(crate) type PreflightHook =
    dyn Fn(&PreflightRequest) -> PreflightFuture + Send + Sync + 'static;
type ObserverHook = dyn Fn(&Observation) + Send + Sync + 'static;
type EvictorHook = dyn Fn(&EvictionRequest) + Send + Sync + 'static;

/// What a cache owner's evictor is asked: evict `bytes` of evictable cache
/// on `device`, and report them with
/// [`QueryService::change_cache`]`(device, CacheChange::Evict(bytes))`
/// once they are gone; that change reschedules the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EvictionRequest {
    /// The device.
    pub device: DeviceOrdinal,
    /// Exactly the bytes the oldest runnable waiter lacks there (less what
    /// was asked for already and not evicted yet).
    pub bytes: u64,
}

/// What a preflight hook is asked about: one submission on one candidate
/// device.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PreflightRequest {
    /// The submission's waiter id (its FIFO sequence number).
    pub waiter: WaiterId,
    /// The candidate device.
    pub device: DeviceOrdinal,
    /// The plan's proof; `None` for a resource-only request.
    pub proof: Option<CapabilityProof>,
}

/// The health probe of a quarantined device, on its worker: a lane, a root
/// stream, a synchronization of it, and their release. The
/// synchronization is what proved the fault, so it is what must pass now.
fn probe(backend: &SharedBackend, device: DeviceOrdinal) -> Result<(), (BackendOp, BackendError)> {
    let lane = backend
        .open_lane(device)
        .map_err(|e| (BackendOp::OpenLane, e))?;
    let checked = backend
        .create_root_stream(lane)
        .map_err(|e| (BackendOp::CreateRootStream, e))
        .and_then(|stream| {
            let synced = backend
                .synchronize(stream)
                .map_err(|e| (BackendOp::Synchronize, e));
            let destroyed = backend
                .destroy_stream(stream)
                .map_err(|e| (BackendOp::DestroyStream, e));
            synced.and(destroyed)
        });
    let closed = backend
        .close_lane(lane)
        .map_err(|e| (BackendOp::CloseLane, e));
    checked.and(closed)
}

/// The process's GPU query service. Cheap to clone: clones share the queue,
/// ledgers and workers. See the [`gpu` module documentation](crate::gpu).
///
/// Holding the service does not let anyone mint a proof: the issuer is
/// handed out once by [`QueryServiceBuilder::build_with_issuer`] and is not
/// reachable from here.
///
/// ```compile_fail
/// fn mint(service: &admission::gpu::QueryService) {
///     let _ = service.issuer();
/// }
/// ```
#[derive(Clone)]
pub struct QueryService {
    pub(crate) inner: StdArc<Inner>,
}

impl fmt::Debug for QueryService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryService")
            .field("backend", &self.inner.backend.name())
            .field("devices", &self.inner.devices.ordinals())
            .finish()
    }
}

impl QueryService {
    /// A builder over `backend`, the installed `devices` and the queue's
    /// `bounds`.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// let service = QueryService::builder(backend, devices, bounds).build()?;
    /// assert_eq!(service.ledger_snapshots()[0].live_grants_bytes, 0);
    ///
    /// // A profile that promises more memory than the device has is refused.
    /// let small = Arc::new(SimBackend::new([SimDevice::new(0, 16 * GIB)]));
    /// let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).build()?;
    /// let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// assert!(QueryService::builder(small, devices, bounds).build().is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(
        backend: SharedBackend,
        devices: DeviceSet,
        bounds: QueueBounds,
    ) -> QueryServiceBuilder {
        QueryServiceBuilder {
            backend,
            devices,
            bounds,
            preflight: None,
            observer: None,
            evictors: BTreeMap::new(),
        }
    }

    /// A lazy admission ticket for the plan `proof` proves. Reserves
    /// nothing; dropping it unused costs nothing.
    ///
    /// # Errors
    ///
    /// [`GpuAdmitError::ForeignProof`] when `proof` was issued by another
    /// issuer than the one this service accepts.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # use admission::gpu::{PhaseRequirement, PlanDescription, PlanFingerprint};
    /// # let (service, issuer) = QueryService::builder(backend, devices, bounds).build_with_issuer()?;
    /// let plan = PlanDescription::new(PlanFingerprint(1))
    ///     .phase(PhaseRequirement::new("probe", 2 * GIB, "join"));
    /// let proof = issuer.lower(&plan)?;
    /// let handle = service.ticket(&proof)?.admit().await?;
    /// assert!(handle.grant_bytes() >= 2 * GIB);
    /// handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn ticket(&self, proof: &CapabilityProof) -> Result<AdmissionTicket, GpuAdmitError> {
        if proof.issuer_id() != self.inner.issuer {
            return Err(GpuAdmitError::ForeignProof {
                expected: self.inner.issuer,
                found: proof.issuer_id(),
            });
        }
        Ok(AdmissionTicket {
            inner: self.inner.clone(),
            proof: Some(proof.clone()),
            request: GrantRequest::for_proof(proof),
            deadline: None,
        })
    }

    /// A lazy resource-only ticket: at least `min_bytes` (raised to the
    /// attempt floor) on any healthy device. Its handle cannot authorize a
    /// native plan.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// let handle = service.resource_ticket(4 * GIB).admit().await?;
    /// assert!(handle.proof().is_none());
    /// assert!(handle.grant_bytes() >= 4 * GIB);
    /// let report = handle.release().await;
    /// assert!(report.ledger_released);
    /// # Ok(())
    /// # }
    /// ```
    pub fn resource_ticket(&self, min_bytes: u64) -> AdmissionTicket {
        AdmissionTicket {
            inner: self.inner.clone(),
            proof: None,
            request: GrantRequest::resource_only(min_bytes),
            deadline: None,
        }
    }

    /// The queue and devices now: depth, pending preflights, every waiter's
    /// sequence, age, overtakes and protection, a summary per device, and
    /// the health of every component that calls user code (observer,
    /// preflight, backend, device workers).
    pub fn admission_snapshot(&self) -> AdmissionSnapshot {
        let inner = &self.inner;
        let now = Instant::now();
        let depth = |d| inner.worker_depth(d);
        let mut snapshot = inner.state.lock().core.snapshot(now, &depth);
        snapshot.health = inner.boundaries.health();
        snapshot
    }

    /// A snapshot of every ledger, in ordinal order: the authoritative view of
    /// grants, protection, cache charges and device admission health.
    pub fn ledger_snapshots(&self) -> Vec<LedgerSnapshot> {
        self.inner.state.lock().core.ledger_snapshots()
    }

    /// Sets the `admission_gpu_*` gauges of every device from its ledger's
    /// report (see [`export`](crate::export)). Nothing sets them on its
    /// own: call this from the scrape handler, as
    /// [`WorkQueue::record_metrics`](crate::WorkQueue::record_metrics) for a
    /// queue without a controller, or on a timer. Does nothing without the
    /// `metrics` feature (the ledgers' lock is not taken for nothing).
    pub fn record_metrics(&self) {
        #[cfg(feature = "metrics")]
        for report in self.ledger_snapshots() {
            crate::export::gpu_ledger(
                report.device.0,
                report.managed_capacity,
                report.live_grants_bytes,
                report
                    .cache_evictable_bytes
                    .saturating_add(report.cache_pinned_bytes),
                report.active_attempts,
            );
        }
    }

    /// Quarantines `device` (an operator's or a health check's decision):
    /// nothing new is issued there, in-flight grants drain, a protection
    /// there is retargeted, waiters left without a healthy device fail.
    pub fn quarantine(&self, device: DeviceOrdinal, code: u32) {
        self.inner
            .transact(|core, recorder| recorder.caused(core.quarantine(device, code)));
    }

    /// Returns a quarantined `device` to service after the operator reset
    /// it: a health probe (lane, root stream, synchronization, release) runs
    /// on the device's worker, and only if every step passes does the
    /// ledger issue grants again; queued work is rescheduled. A closed
    /// ledger (a fault of unknown reach, or [`close`](Self::close)) is not
    /// reinstated: its verdict covers the whole backend.
    ///
    /// Beyond the seed, which ends a quarantine only with a process
    /// restart.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes leaves the device
    /// quarantined: a probe already queued on the device's worker still runs
    /// (and cleans up after itself), but its result is discarded and the
    /// ledger is not reinstated. Calling again probes afresh.
    ///
    /// # Errors
    ///
    /// [`ReinstateError::NoSuchDevice`] when `device` is not one of the
    /// service's devices; [`ReinstateError::NotQuarantined`] when its ledger
    /// is healthy or closed (before the probe, or closed while it ran);
    /// [`ReinstateError::WorkerGone`] when the device's worker could not run
    /// the probe; [`ReinstateError::ProbeFailed`] with the failing step when
    /// the probe fails, and the device stays quarantined.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// use admission::gpu::LedgerState;
    ///
    /// // An operator takes the device out after an external health check failed...
    /// service.quarantine(gpu0, 700);
    /// assert!(matches!(service.ledger_snapshots()[0].state, LedgerState::Quarantined { .. }));
    /// // ...and brings it back once the device was reset.
    /// service.reinstate(gpu0).await?;
    /// assert_eq!(service.ledger_snapshots()[0].state, LedgerState::Admitting);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reinstate(&self, device: DeviceOrdinal) -> Result<(), ReinstateError> {
        let inner = &self.inner;
        let health = inner
            .state
            .lock()
            .core
            .ledger(device)
            .map(|ledger| ledger.state())
            .ok_or(ReinstateError::NoSuchDevice { device })?;
        if !matches!(health, LedgerState::Quarantined { .. }) {
            return Err(ReinstateError::NotQuarantined { device, health });
        }
        let worker = inner
            .workers
            .get(&device)
            .ok_or(ReinstateError::WorkerGone { device })?;
        let backend = inner.backend.clone();
        let probed = worker
            .submit(move || probe(&backend, device))
            .await
            .map_err(|_| ReinstateError::WorkerGone { device })?;
        if let Err((op, error)) = probed {
            return Err(ReinstateError::ProbeFailed { device, op, error });
        }
        let reinstated = inner.transact(|core, recorder| {
            let reinstated = core.reinstate(device);
            if reinstated {
                recorder.record(&GpuEvent::Reinstated { device });
            }
            reinstated
        });
        if reinstated {
            Ok(())
        } else {
            // Closed meanwhile (a fault of unknown reach, or close).
            let health = inner
                .state
                .lock()
                .core
                .ledger(device)
                .map_or(LedgerState::Closed, |ledger| ledger.state());
            Err(ReinstateError::NotQuarantined { device, health })
        }
    }

    /// Charges, evicts, pins or unpins resident cache bytes on `device`'s
    /// ledger, the one authority for device bytes; queued work is
    /// rescheduled afterwards, since evicted bytes may admit a waiter.
    ///
    /// # Errors
    ///
    /// A [`LedgerError`], the ledger unchanged: `NoSuchDevice` when `device`
    /// has no ledger here; for a charge, `Never` on a quarantined or closed
    /// ledger, `CacheCapExceeded` over the cache cap and `CacheNoRoom` over
    /// the unclaimed bytes; for an evict, pin or unpin, `CacheUnderflow` for
    /// more bytes than the counter holds; `Accounting` if a counter would
    /// overflow.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// use admission::gpu::CacheChange;
    ///
    /// // The engine keeps 8 GiB of its own cache resident on the device.
    /// service.change_cache(gpu0, CacheChange::Charge(8 * GIB))?;
    /// assert_eq!(service.ledger_snapshots()[0].cache_evictable_bytes, 8 * GIB);
    /// service.change_cache(gpu0, CacheChange::Evict(8 * GIB))?;
    /// // More than the counter holds is refused, the ledger unchanged.
    /// assert!(service.change_cache(gpu0, CacheChange::Evict(1)).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn change_cache(
        &self,
        device: DeviceOrdinal,
        change: CacheChange,
    ) -> Result<(), LedgerError> {
        self.inner
            .transact(|core, _| core.change_cache(device, change))
    }

    /// Closes the service: new submissions and every queued waiter fail
    /// with [`GpuAdmitError::Closed`], every ledger closes. In-flight
    /// handles keep working and release normally.
    pub fn close(&self) {
        self.inner
            .transact(|core, recorder| recorder.caused(core.close()));
    }

    /// Waits until every job queued on the device workers so far has run:
    /// teardowns of dropped handles, rollbacks of cancelled builds, and the
    /// grant releases queued after them.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future only stops the wait; it holds nothing. Once it
    /// has been polled, the empty marker jobs it queued still run on the
    /// workers, which changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// let handle = service.resource_ticket(GIB).admit().await?;
    /// // Dropped without `release`: the teardown runs on the device's worker.
    /// drop(handle);
    /// service.settle().await;
    /// assert_eq!(service.ledger_snapshots()[0].live_grants_bytes, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn settle(&self) {
        let jobs: Vec<_> = self
            .inner
            .workers
            .values()
            .map(|w| w.submit(|| ()))
            .collect();
        for job in jobs {
            // A gone worker has nothing left to run.
            let _ = job.await;
        }
    }
}

#[cfg(loom)]
impl QueryService {
    /// A service over a simulated backend with no device workers, for the
    /// loom models of the admission path up to the grant: a worker's OS
    /// thread is not something loom can schedule, so nothing here may
    /// reach an envelope build.
    pub(crate) fn for_model(devices: DeviceSet, bounds: QueueBounds) -> Self {
        use std::collections::HashMap;

        use self::inner::State;
        use super::backend::sim::{SimBackend, SimDevice};
        use super::guard::Boundaries;
        use super::proof::ProofIssuer;
        use super::scheduler::AdmissionCore;
        use crate::sync::Mutex;
        let sim = SimBackend::new(
            devices
                .ordinals()
                .into_iter()
                .map(|d| SimDevice::new(d.0, u64::MAX)),
        );
        let core = AdmissionCore::new(&devices, bounds);
        QueryService {
            inner: StdArc::new(Inner {
                backend: StdArc::new(sim),
                devices,
                issuer: ProofIssuer::new().id(),
                workers: BTreeMap::new(),
                state: Mutex::new(State {
                    core,
                    wakers: HashMap::new(),
                }),
                preflight: None,
                observer: None,
                evictors: BTreeMap::new(),
                boundaries: Boundaries::new(),
                epoch: Instant::now(),
            }),
        }
    }
}
