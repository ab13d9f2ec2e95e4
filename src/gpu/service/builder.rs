//! The builder of the query service: the hooks a service is built with and
//! the start-up checks of the declared devices against the backend's. Apart
//! from the service because it runs once, before any lock or worker exists,
//! and nothing of it is reachable from a built service.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use tokio::time::Instant;

use super::inner::{Inner, State};
use super::{
    EvictionRequest, EvictorHook, ObserverHook, PreflightFuture, PreflightHook, PreflightRequest,
    QueryService, ServiceError,
};
use crate::gpu::backend::{DeviceOrdinal, SharedBackend};
use crate::gpu::guard::{Boundaries, GuardedBackend};
use crate::gpu::observe::Observation;
use crate::gpu::profile::{DeviceSet, QueueBounds};
use crate::gpu::proof::ProofIssuer;
use crate::gpu::scheduler::AdmissionCore;
use crate::gpu::worker::DeviceWorker;
use crate::sync::{Mutex, StdArc};

/// Builds a [`QueryService`]; see [`QueryService::builder`].
pub struct QueryServiceBuilder {
    pub(super) backend: SharedBackend,
    pub(super) devices: DeviceSet,
    pub(super) bounds: QueueBounds,
    pub(super) preflight: Option<Box<PreflightHook>>,
    pub(super) observer: Option<Box<ObserverHook>>,
    pub(super) evictors: BTreeMap<DeviceOrdinal, Box<EvictorHook>>,
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
    /// failed preflight; see the [failure model](crate::gpu#failure-model).
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
    /// [failure model](crate::gpu#failure-model).
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
    /// assert_eq!(service.ledger_snapshots().len(), 1);
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
