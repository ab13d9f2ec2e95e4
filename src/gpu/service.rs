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
//! `wait`): this file keeps the service, its builder, the ticket and the
//! one transaction (`transact`).
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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::Waker;

use tokio::time::Instant;

use super::backend::{BackendError, BackendOp, DeviceOrdinal, SharedBackend};
use super::guard::{Boundaries, GuardedBackend};
use super::handle::QueryHandle;
use super::ledger::{GrantRequest, LedgerError, LedgerHealth, LedgerReport, WaiterId};
use super::observe::{GpuEvent, Observation};
use super::outcome::GpuAdmitError;
use super::profile::{DeviceSet, QueueBounds};
use super::proof::{CapabilityProof, IssuerId, ProofIssuer};
use super::scheduler::{AdmissionCore, AdmissionSnapshot, CacheChange};
use super::worker::DeviceWorker;
use crate::error::ConfigError;
use crate::sync::{Mutex, StdArc};

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

/// Why a [`QueryService`] could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceError {
    /// The backend could not list its devices.
    Inventory(BackendError),
    /// A profile does not fit its device: managed capacity plus backend
    /// reserve exceed the device's total memory. The error names the field:
    /// `managed_capacity` when the pool alone exceeds the device, otherwise
    /// `backend_reserve`.
    ProfileExceedsDevice(ConfigError),
    /// A profiled ordinal is not a device of the backend.
    DeviceNotInstalled {
        /// The profiled ordinal.
        ordinal: DeviceOrdinal,
        /// The ordinals the backend manages.
        installed: Vec<DeviceOrdinal>,
    },
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::Inventory(error) => {
                write!(f, "cannot list the backend's devices: {error}")
            }
            ServiceError::ProfileExceedsDevice(error) => {
                write!(f, "a device profile does not fit its device: {error}")
            }
            ServiceError::DeviceNotInstalled { ordinal, installed } => {
                write!(
                    f,
                    "{ordinal} has a device profile but is not a device of the backend (it has "
                )?;
                for (i, device) in installed.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{device}")?;
                }
                f.write_str(")")
            }
        }
    }
}

impl std::error::Error for ServiceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServiceError::Inventory(error) => Some(error),
            ServiceError::ProfileExceedsDevice(error) => Some(error),
            ServiceError::DeviceNotInstalled { .. } => None,
        }
    }
}

/// Why [`QueryService::reinstate`] left a device out of service.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReinstateError {
    /// The ordinal is not one of the service's devices.
    NoSuchDevice {
        /// The ordinal.
        device: DeviceOrdinal,
    },
    /// The device is not quarantined: healthy already, or closed (a fault
    /// of unknown reach or the service's close, which only a restart
    /// undoes).
    NotQuarantined {
        /// The device.
        device: DeviceOrdinal,
        /// Its ledger's health.
        health: LedgerHealth,
    },
    /// The health probe failed; the device stays quarantined.
    ProbeFailed {
        /// The device.
        device: DeviceOrdinal,
        /// The probe's failing operation.
        op: BackendOp,
        /// Its error.
        error: BackendError,
    },
    /// The device's worker thread is gone, so no probe could run.
    WorkerGone {
        /// The device.
        device: DeviceOrdinal,
    },
}

impl fmt::Display for ReinstateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReinstateError::NoSuchDevice { device } => {
                write!(f, "{device} is not a device of this service")
            }
            ReinstateError::NotQuarantined { device, health } => {
                write!(f, "{device} is not quarantined (its ledger is {health:?})")
            }
            ReinstateError::ProbeFailed { device, op, error } => write!(
                f,
                "the health probe of {device} failed at `{op}`: {error}; it stays quarantined"
            ),
            ReinstateError::WorkerGone { device } => {
                write!(
                    f,
                    "the worker thread of {device} is gone; no probe could run"
                )
            }
        }
    }
}

impl std::error::Error for ReinstateError {}

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

/// Builds a [`QueryService`]; see [`QueryService::builder`].
pub struct QueryServiceBuilder {
    backend: SharedBackend,
    devices: DeviceSet,
    bounds: QueueBounds,
    preflight: Option<Box<PreflightHook>>,
    observer: Option<Box<ObserverHook>>,
    evictors: BTreeMap<DeviceOrdinal, Box<EvictorHook>>,
}

impl fmt::Debug for QueryServiceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryServiceBuilder")
            .field("backend", &self.backend.name())
            .field("devices", &self.devices.ordinals())
            .field("bounds", &self.bounds)
            .field("preflight", &self.preflight.is_some())
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl QueryServiceBuilder {
    /// An async device preflight, run for every compatible candidate device
    /// of every submission before it is queued (outside the service's
    /// lock). A failing preflight rejects the submission; a pending one
    /// holds back every younger submission. A panic (in the call, a poll of
    /// its future, or its drop) is caught and counts as that candidate's
    /// failed preflight; see the [failure model](super#failure-model).
    pub fn preflight<F>(mut self, preflight: F) -> Self
    where
        F: Fn(&PreflightRequest) -> PreflightFuture + Send + Sync + 'static,
    {
        self.preflight = Some(Box::new(preflight));
        self
    }

    /// The evictor of `device`'s resident cache: when the oldest runnable
    /// waiter is blocked there only by evictable cache bytes, the scheduler
    /// asks it for exactly the bytes missing ([`EvictionRequest`]), after
    /// the transaction, outside the lock, on whatever thread ran it (a
    /// tokio task or the device's worker): it must not block. The evictor
    /// reports what it evicted with [`QueryService::change_cache`], which
    /// reschedules. It is not asked again for bytes it was asked for and
    /// has not evicted yet. A panic is caught (`gpu_evictor` health) and the
    /// waiter waits as without an evictor.
    pub fn evictor<F>(mut self, device: DeviceOrdinal, evictor: F) -> Self
    where
        F: Fn(&EvictionRequest) + Send + Sync + 'static,
    {
        self.evictors.insert(device, Box::new(evictor));
        self
    }

    /// An observer of the admission lifecycle (see [`Observation`]). A
    /// panic is caught and drops that record only; see the
    /// [failure model](super#failure-model).
    pub fn observer<F>(mut self, observer: F) -> Self
    where
        F: Fn(&Observation) + Send + Sync + 'static,
    {
        self.observer = Some(Box::new(observer));
        self
    }

    /// Checks that every profiled ordinal is a device of the backend and
    /// that every profile's managed capacity plus backend reserve fit the
    /// device's total memory, then creates one ledger and one worker thread
    /// per device.
    ///
    /// The service accepts no plan proof: it admits resource-only tickets.
    /// A service for an engine's plans is built with
    /// [`build_with_issuer`](Self::build_with_issuer).
    ///
    /// # Errors
    ///
    /// [`ServiceError::Inventory`] when the backend cannot list its devices
    /// (or panics doing so); [`ServiceError::DeviceNotInstalled`] for a
    /// profiled ordinal the backend does not manage;
    /// [`ServiceError::ProfileExceedsDevice`] when a profile's managed
    /// capacity plus backend reserve exceed its device's total memory.
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
    /// let service = QueryService::builder(backend, devices, bounds)
    ///     // Told of every decision, as a log line or a metric would be.
    ///     .observer(|observation| tracing::debug!(?observation))
    ///     .build()?;
    /// assert_eq!(service.device_ledger_reports().len(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn build(self) -> Result<QueryService, ServiceError> {
        // An issuer nobody holds: no proof can ever carry its id.
        self.build_accepting(&ProofIssuer::new())
    }

    /// [`build`](Self::build), and the one [`ProofIssuer`] whose proofs the
    /// service accepts, handed out once: the capability to mint proofs
    /// belongs to the engine's lowering code, and nothing reachable from
    /// the service (or a clone of it) can mint one.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
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
    /// use admission::gpu::{PhaseRequirement, PlanDescription, PlanFingerprint};
    ///
    /// let (service, issuer) = QueryService::builder(backend, devices, bounds).build_with_issuer()?;
    /// // Only the holder of the issuer mints proofs this service accepts.
    /// let plan = PlanDescription::new(PlanFingerprint(7))
    ///     .phase(PhaseRequirement::new("scan", 4 * GIB, "scan"));
    /// let proof = issuer.lower(&plan)?;
    /// assert!(service.ticket(&proof).is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn build_with_issuer(self) -> Result<(QueryService, ProofIssuer), ServiceError> {
        let issuer = ProofIssuer::new();
        let service = self.build_accepting(&issuer)?;
        Ok((service, issuer))
    }

    fn build_accepting(self, issuer: &ProofIssuer) -> Result<QueryService, ServiceError> {
        let boundaries = Boundaries::new();
        // Every backend call of the service, on whatever thread, goes
        // through the `gpu_backend` boundary from here on.
        let backend: SharedBackend = StdArc::new(GuardedBackend::new(
            self.backend,
            boundaries.backend.clone(),
        ));
        let inventory = backend.inventory().map_err(ServiceError::Inventory)?;
        let installed: Vec<DeviceOrdinal> = inventory.iter().map(|f| f.ordinal).collect();
        for ordinal in self.devices.ordinals() {
            if !installed.contains(&ordinal) {
                return Err(ServiceError::DeviceNotInstalled { ordinal, installed });
            }
        }
        // Start-up is the one moment the device's real size is compared
        // with what the operator declared; after it, only the ledger's
        // arithmetic over the declared numbers decides.
        for facts in &inventory {
            if let Some(profile) = self.devices.profile(facts.ordinal) {
                profile
                    .check_device_memory(facts.total_bytes)
                    .map_err(ServiceError::ProfileExceedsDevice)?;
            }
        }
        let workers = self
            .devices
            .ordinals()
            .into_iter()
            .map(|d| {
                let worker = DeviceWorker::spawn_with(d, boundaries.worker.clone());
                (d, StdArc::new(worker))
            })
            .collect();
        let mut core = AdmissionCore::new(&self.devices, self.bounds);
        for device in self.evictors.keys() {
            core.enable_eviction(*device);
        }
        Ok(QueryService {
            inner: StdArc::new(Inner {
                backend,
                devices: self.devices,
                issuer: issuer.id(),
                workers,
                state: Mutex::new(State {
                    core,
                    wakers: HashMap::new(),
                }),
                preflight: self.preflight,
                observer: self.observer,
                evictors: self.evictors,
                boundaries,
                epoch: Instant::now(),
            }),
        })
    }
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
    /// assert_eq!(service.device_ledger_reports()[0].live_grants_bytes, 0);
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

    /// Every ledger's report, in ordinal order: the authoritative view of
    /// grants, protection, cache charges and device admission health.
    pub fn device_ledger_reports(&self) -> Vec<LedgerReport> {
        self.inner.state.lock().core.ledger_reports()
    }

    /// Sets the `admission_gpu_*` gauges of every device from its ledger's
    /// report (see [`export`](crate::export)). Nothing sets them on its
    /// own: call this from the scrape handler, as
    /// [`WorkQueue::record_metrics`](crate::WorkQueue::record_metrics) for a
    /// queue without a controller, or on a timer. Does nothing without the
    /// `metrics` feature (the ledgers' lock is not taken for nothing).
    pub fn record_metrics(&self) {
        #[cfg(feature = "metrics")]
        for report in self.device_ledger_reports() {
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
    /// use admission::gpu::LedgerHealth;
    ///
    /// // An operator takes the device out after an external health check failed...
    /// service.quarantine(gpu0, 700);
    /// assert!(matches!(service.device_ledger_reports()[0].health, LedgerHealth::Quarantined { .. }));
    /// // ...and brings it back once the device was reset.
    /// service.reinstate(gpu0).await?;
    /// assert_eq!(service.device_ledger_reports()[0].health, LedgerHealth::Healthy);
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
            .map(|ledger| ledger.health())
            .ok_or(ReinstateError::NoSuchDevice { device })?;
        if !matches!(health, LedgerHealth::Quarantined { .. }) {
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
                .map_or(LedgerHealth::Closed, |ledger| ledger.health());
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
    /// assert_eq!(service.device_ledger_reports()[0].cache_evictable_bytes, 8 * GIB);
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
    /// assert_eq!(service.device_ledger_reports()[0].live_grants_bytes, 0);
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
        use super::backend::sim::{SimBackend, SimDevice};
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

/// A lazy admission ticket: a proof (or a resource-only minimum) and the
/// service, nothing reserved. [`admit`](Self::admit) submits it.
#[derive(Debug)]
pub struct AdmissionTicket {
    pub(crate) inner: StdArc<Inner>,
    pub(crate) proof: Option<CapabilityProof>,
    pub(crate) request: GrantRequest,
    pub(crate) deadline: Option<Instant>,
}

impl AdmissionTicket {
    /// This ticket as a first-use trigger: the first execution step that
    /// needs the device admits it ([`LazyAdmission`](super::LazyAdmission)),
    /// and if none does, nothing is ever reserved.
    pub fn lazy(self) -> super::lazy::LazyAdmission {
        super::lazy::LazyAdmission::new(self)
    }

    /// Another ticket for the same request (a ticket reserves nothing, so a
    /// copy costs nothing either).
    pub(crate) fn duplicate(&self) -> Self {
        AdmissionTicket {
            inner: self.inner.clone(),
            proof: self.proof.clone(),
            request: self.request.clone(),
            deadline: self.deadline,
        }
    }

    /// A deadline of the request's own; the effective deadline is the
    /// earlier of this and the queue's `max_wait` from submission.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// A descriptive working-set estimate: the grant is this value clamped
    /// between the required floor and what the device has room for. Never a
    /// reason to admit.
    pub fn with_working_set_hint(mut self, bytes: u64) -> Self {
        self.request = self.request.with_working_set_hint(bytes);
        self
    }

    /// Submits the ticket and resolves to a published [`QueryHandle`] once
    /// a device is granted and its envelope validated.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses no slot, byte or device
    /// resource, only its place in the queue: a pending or queued request is
    /// withdrawn, a grant it had not yet taken goes back to its ledger at
    /// once, and an envelope being built is rolled back on the device's
    /// worker before its grant returns.
    ///
    /// # Errors
    ///
    /// The future resolves to a [`GpuAdmitError`]: `DeadlinePassed` for a
    /// deadline already past; `Closed` or `QueueFull` at submission (and
    /// `Closed` while waiting); `NoCapableDevice` or `FloorNeverFits` when
    /// no device could ever run it; `PreflightFailed` when a candidate's
    /// preflight fails or panics; `NoHealthyDevice` when no candidate is
    /// healthy any more; `DeadlineExceeded` when the deadline (its own or
    /// the queue's `max_wait`) passes first; `TimerUnavailable` when it must
    /// wait without a tokio timer; `EnvelopeStepFailed`, `DeviceFault`,
    /// `WorkerGone` or `EnvelopeInvalid` when the envelope build fails, after
    /// it was rolled back and the grant returned.
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
    /// # .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// let handle = service
    ///     .resource_ticket(GIB)
    ///     // More than the floor, when the device has room for it.
    ///     .with_working_set_hint(24 * GIB)
    ///     .admit()
    ///     .await?;
    /// assert_eq!(handle.grant_bytes(), 24 * GIB);
    /// handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit(
        self,
    ) -> impl Future<Output = Result<QueryHandle, GpuAdmitError>> + Send + 'static {
        super::release::admit(self)
    }
}

pub(crate) struct State {
    pub(crate) core: AdmissionCore,
    pub(crate) wakers: HashMap<u64, Waker>,
}

pub(crate) struct Inner {
    pub(crate) backend: SharedBackend,
    pub(crate) devices: DeviceSet,
    /// The id of the one issuer whose proofs tickets accept; the issuer
    /// itself went to the engine (`build_with_issuer`).
    issuer: IssuerId,
    pub(crate) workers: BTreeMap<DeviceOrdinal, StdArc<DeviceWorker>>,
    pub(crate) state: Mutex<State>,
    pub(crate) preflight: Option<Box<PreflightHook>>,
    observer: Option<Box<ObserverHook>>,
    evictors: BTreeMap<DeviceOrdinal, Box<EvictorHook>>,
    pub(crate) boundaries: Boundaries,
    epoch: Instant,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryServiceInner")
            .field("backend", &self.backend.name())
            .finish()
    }
}

/// Collects observation records under the lock, stamped with the queue
/// depth of the transaction that produced them.
pub(crate) struct Recorder {
    epoch: Instant,
    records: Vec<Observation>,
    /// Core events the closure caused before the scheduling pass (a close,
    /// a quarantine): recorded and woken like the pass's own.
    events: Vec<GpuEvent>,
}

impl Recorder {
    /// Events the transaction's closure caused, to be recorded and woken
    /// with the scheduling pass's.
    pub(crate) fn caused(&mut self, events: Vec<GpuEvent>) {
        self.events.extend(events);
    }

    /// Records `event`, in transaction order.
    pub(crate) fn record(&mut self, event: &GpuEvent) {
        let elapsed = Instant::now().saturating_duration_since(self.epoch);
        self.records.push(event.observation(elapsed));
    }
}

impl Inner {
    /// Wakers kept for waiting admit futures.
    #[cfg(any(test, loom))]
    pub(crate) fn live_wakers(&self) -> usize {
        self.state.lock().wakers.len()
    }

    fn worker_depth(&self, device: DeviceOrdinal) -> u64 {
        self.workers.get(&device).map_or(0, |w| w.depth())
    }

    /// One transaction: `f` over the core, then a scheduling pass; wakers
    /// of resolved waiters are woken and observations delivered after the
    /// lock is released.
    pub(crate) fn transact<R>(&self, f: impl FnOnce(&mut AdmissionCore, &mut Recorder) -> R) -> R {
        let mut recorder = Recorder {
            epoch: self.epoch,
            records: Vec::new(),
            events: Vec::new(),
        };
        let mut wake = Vec::new();
        let mut evictions = Vec::new();
        let result = {
            let mut state = self.state.lock();
            let state = &mut *state;
            let result = f(&mut state.core, &mut recorder);
            // Ranking reads each device's live stream count, not a figure
            // derived from open slots.
            for (device, worker) in &self.workers {
                state.core.observe_streams(*device, worker.streams_in_use());
            }
            let depth = |d| self.worker_depth(d);
            let mut events = std::mem::take(&mut recorder.events);
            events.extend(state.core.schedule(&depth));
            for event in &events {
                recorder.record(event);
                if let GpuEvent::EvictionRequested { device, bytes } = event {
                    evictions.push(EvictionRequest {
                        device: *device,
                        bytes: *bytes,
                    });
                }
                if let Some(waiter) = event.resolves() {
                    if let Some(waker) = state.wakers.remove(&waiter.get()) {
                        wake.push(waker);
                    }
                }
            }
            let (depth, pending) = (state.core.depth(), state.core.pending_preflights());
            for record in &mut recorder.records {
                record.queue_depth = depth;
                record.pending_preflights = pending;
            }
            result
        };
        for waker in wake {
            waker.wake();
        }
        self.deliver(recorder.records);
        // Last, and outside the lock: an evictor may report its eviction
        // at once, which is a transaction of its own.
        for request in evictions {
            if let Some(evictor) = self.evictors.get(&request.device) {
                let _ = self.boundaries.evictor.call(|| evictor(&request));
            }
        }
        result
    }

    /// Hands each record to the observer behind its panic boundary: a
    /// panic drops that record and nothing else. Never called under the
    /// lock, and always after the transaction's effects are in place, so a
    /// panic here cannot leave a reservation or a grant behind.
    fn deliver(&self, records: Vec<Observation>) {
        if let Some(observer) = &self.observer {
            for record in &records {
                let _ = self.boundaries.observer.call(|| observer(record));
            }
        }
    }

    /// A handle exists: its whole envelope validated.
    pub(crate) fn observe_published(
        &self,
        waiter: WaiterId,
        device: DeviceOrdinal,
        grant_bytes: u64,
    ) {
        self.observe_outside_transaction(&GpuEvent::Published {
            waiter,
            device,
            grant_bytes,
        });
    }

    pub(crate) fn observe_rejection(&self, waiter: Option<WaiterId>, error: &GpuAdmitError) {
        self.observe_outside_transaction(&GpuEvent::Rejected {
            waiter,
            error: error.clone(),
        });
    }

    /// Delivers one record of something that happened outside a
    /// transaction, with the queue's depth read now.
    pub(crate) fn observe_outside_transaction(&self, event: &GpuEvent) {
        let elapsed = Instant::now().saturating_duration_since(self.epoch);
        let mut record = event.observation(elapsed);
        {
            let state = self.state.lock();
            record.queue_depth = state.core.depth();
            record.pending_preflights = state.core.pending_preflights();
        }
        self.deliver(vec![record]);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::gpu::backend::sim::{SimBackend, SimDevice};
    use crate::gpu::envelope::Disposition;
    use crate::gpu::observe::ObservationKind;
    use crate::gpu::profile::{DeviceProfile, MemoryOwnership};

    const GIB: u64 = 1 << 30;

    /// Each observation's kind and the number of backend calls made before
    /// it was delivered.
    type Seen = StdArc<std::sync::Mutex<Vec<(ObservationKind, usize)>>>;

    /// One 16 GiB device with `max_active` attempt slots, a simulated
    /// backend, and an observer that stamps each record with the number of
    /// backend calls made before it: what the ordering tests compare.
    fn observed_service(
        max_active: u32,
        overtake_budget: u32,
    ) -> (QueryService, StdArc<SimBackend>, Seen) {
        let gpu0 = DeviceOrdinal(0);
        let profile = DeviceProfile::builder(gpu0)
            .managed_capacity(16 * GIB)
            .max_active_attempts(max_active)
            .streams_per_attempt(2)
            .build()
            .unwrap();
        let devices =
            DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)]).unwrap();
        let bounds = QueueBounds::new(64, Duration::from_secs(5), overtake_budget).unwrap();
        let sim = StdArc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
        let seen = StdArc::new(std::sync::Mutex::new(Vec::new()));
        let (observer_sim, observer_seen) = (sim.clone(), seen.clone());
        let backend: SharedBackend = sim.clone();
        let service = QueryService::builder(backend, devices, bounds)
            .observer(move |record| {
                let ops = observer_sim.ops().len();
                observer_seen.lock().unwrap().push((record.kind, ops));
            })
            .build()
            .unwrap();
        (service, sim, seen)
    }

    /// The ledger's view and the simulator's view of device 0 agree that
    /// nothing is held.
    fn assert_nothing_held(service: &QueryService, sim: &SimBackend) {
        let report = &service.device_ledger_reports()[0];
        assert_eq!(report.live_grants_bytes, 0);
        assert_eq!(report.active_attempts, 0);
        assert_eq!(
            sim.live_handles(),
            0,
            "lane, streams, domain or scope left open"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_admit_dropped_after_built_arrived_rolls_the_envelope_back_before_the_grant() {
        use crate::gpu::backend::BackendOp as Op;
        let (service, sim, seen) = observed_service(1, 4);
        // Hold the build at its first step so the first poll is certainly
        // still waiting for the outcome when the worker sends it.
        let gate = sim.gate(Op::OpenLane);
        let mut admit = Box::pin(service.resource_ticket(GIB).admit());
        assert!(futures::poll!(&mut admit).is_pending());
        assert!(gate.reached());
        gate.open();
        // The worker runs jobs in order: once this one ran, the build job
        // has finished all five steps and sent `Built` to the future, which
        // has not been polled since.
        service.inner.workers[&DeviceOrdinal(0)]
            .submit(|| ())
            .await
            .unwrap();
        assert_eq!(
            sim.live_handles(),
            4,
            "lane, root stream, domain and scope are built"
        );
        sim.clear_log();
        seen.lock().unwrap().clear();
        drop(admit);
        service.settle().await;

        assert_nothing_held(&service, &sim);
        assert_eq!(
            sim.ops(),
            [
                Op::Synchronize,
                Op::CloseWorkerScope,
                Op::LeaveDomain,
                Op::CloseDomain,
                Op::DestroyStream,
                Op::CloseLane,
            ],
            "the unreceived envelope is rolled back in reverse order"
        );
        // The grant went back once, and only after every rollback call.
        let returned: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|(kind, _)| *kind == ObservationKind::Removed)
            .collect();
        assert_eq!(returned, [(ObservationKind::Removed, 6)]);
        // And the slot is usable again.
        service
            .resource_ticket(GIB)
            .admit()
            .await
            .unwrap()
            .release()
            .await;
        assert_nothing_held(&service, &sim);
    }

    #[tokio::test(start_paused = true)]
    async fn release_follows_the_seeds_order_from_idle_to_the_wake() {
        use crate::gpu::backend::BackendOp as Op;
        let (service, sim, seen) = observed_service(1, 4);
        let handle = service.resource_ticket(GIB).admit().await.unwrap();
        let mut next = Box::pin(service.resource_ticket(GIB).admit());
        assert!(futures::poll!(&mut next).is_pending());
        // One allocation left outstanding by an execution whose context is
        // gone: the teardown frees it, as part of destruction.
        let context = handle.execution_context().unwrap();
        context.alloc(1 << 20).unwrap();
        drop(context);
        service.settle().await;
        sim.clear_log();
        seen.lock().unwrap().clear();

        let report = handle.release().await;
        assert_eq!(
            sim.ops(),
            [
                Op::Synchronize,
                Op::Free,
                Op::CloseWorkerScope,
                Op::LeaveDomain,
                Op::CloseDomain,
                Op::DestroyStream,
                Op::CloseLane,
            ]
        );
        let seen = seen.lock().unwrap().clone();
        let kinds: Vec<_> = seen.iter().map(|(kind, _)| *kind).collect();
        assert_eq!(
            kinds,
            [
                ObservationKind::Sealed,
                ObservationKind::Released,
                ObservationKind::Admitted,
            ]
        );
        // Sealed after the synchronization decided disposition and health,
        // before anything was destroyed.
        assert_eq!(seen[0], (ObservationKind::Sealed, 1));
        // The grant went back after the lane closed, and the queued waiter
        // was admitted in that same ledger transaction, after the release.
        assert_eq!(seen[1], (ObservationKind::Released, 7));
        assert_eq!(seen[2], (ObservationKind::Admitted, 7));
        assert_eq!(report.disposition, Disposition::Clean);
        assert_eq!(report.teardown.leaked.allocations.len(), 1);
        assert!(report.ledger_released);
        next.await.unwrap().release().await;
        assert_nothing_held(&service, &sim);
    }

    #[test]
    fn start_up_refuses_a_profile_whose_reserve_does_not_fit_the_device() {
        let gpu0 = DeviceOrdinal(0);
        let service = |reserve: u64| {
            let profile = DeviceProfile::builder(gpu0)
                .managed_capacity(16 * GIB)
                .backend_reserve(reserve)
                .build()
                .unwrap();
            let devices =
                DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)]).unwrap();
            let bounds = QueueBounds::new(4, Duration::from_secs(5), 1).unwrap();
            let backend = StdArc::new(SimBackend::new([SimDevice::new(0, 20 * GIB)]));
            QueryService::builder(backend, devices, bounds).build()
        };
        assert!(service(4 * GIB).is_ok(), "16 + 4 GiB fit 20 GiB");
        let error = service(4 * GIB + 1).unwrap_err();
        let ServiceError::ProfileExceedsDevice(config) = &error else {
            panic!("unexpected error: {error}");
        };
        assert_eq!(config.field(), "backend_reserve");
        assert!(error.to_string().contains("20 GiB"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn wakers_are_kept_only_for_live_waiters() {
        let devices = DeviceSet::one_16_gib_device(1);
        let bounds = QueueBounds::new(64, Duration::from_secs(5), 4).unwrap();
        let backend = StdArc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
        let service = QueryService::builder(backend, devices, bounds)
            .build()
            .unwrap();
        let held = service.resource_ticket(GIB).admit().await.unwrap();
        let mut cancelled: Vec<_> = (0..8)
            .map(|_| Box::pin(service.resource_ticket(GIB).admit()))
            .collect();
        for future in &mut cancelled {
            assert!(futures::poll!(future).is_pending());
        }
        assert_eq!(service.inner.live_wakers(), 8);
        drop(cancelled);
        let expiring: Vec<_> = (0..8)
            .map(|_| tokio::spawn(service.resource_ticket(GIB).admit()))
            .collect();
        for task in expiring {
            assert!(task.await.unwrap().is_err());
        }
        let mut granted = Box::pin(service.resource_ticket(GIB).admit());
        assert!(futures::poll!(&mut granted).is_pending());
        held.release().await;
        granted.await.unwrap().release().await;
        assert_eq!(service.inner.live_wakers(), 0);
    }
}
