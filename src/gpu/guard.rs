//! The GPU service's panic boundaries, and the backend wrapper that puts
//! every backend call behind one.
//!
//! # Implementation notes
//!
//! The service calls four kinds of code it does not own: the observer, the
//! preflight hook, cache evictors, and the backend itself. Each gets one
//! [`Boundary`] per service, so a snapshot shows one [`ComponentHealth`]
//! per component however many devices, envelopes or threads call it:
//!
//! | component           | called from                       | on a panic                              |
//! |---------------------|-----------------------------------|-----------------------------------------|
//! | `gpu_observer`      | any thread, after the lock        | the record is dropped                   |
//! | `gpu_preflight`     | the admit future (call and poll)  | that candidate's preflight failed       |
//! | `gpu_evictor`       | any thread, after the lock        | that eviction request is skipped        |
//! | `gpu_backend`       | worker and execution threads      | the operation failed ([`BackendError::Panicked`]) |
//! | `gpu_device_worker` | the device worker, around a job   | the job's result is lost, typed         |
//!
//! The last is a backstop: every job the crate queues calls user code only
//! through the boundaries above, so a panic caught there is the crate's own
//! bug; it still must not end the thread, because a dead worker reads as a
//! fault of unknown reach and closes every ledger.
//!
//! [`GuardedBackend`] converts a panic inside any backend method into
//! [`BackendError::Panicked`], an attempt-level error: the envelope build
//! rolls back and fails the attempt, a teardown records the error and still
//! returns the grant. Nothing above the backend ever sees the unwind.

use std::fmt;

use super::backend::{
    BackendError, BackendOp, BackendOps, DeviceFacts, DeviceOrdinal, DevicePtr, DomainId, LaneId,
    ScopeId, SharedBackend, StreamId,
};
use crate::health::{Boundary, ComponentHealth};
use crate::sync::StdArc;

/// The service's boundaries, one per component that calls user code.
#[derive(Debug)]
pub(crate) struct Boundaries {
    pub(crate) observer: Boundary,
    pub(crate) preflight: Boundary,
    pub(crate) evictor: Boundary,
    pub(crate) backend: StdArc<Boundary>,
    pub(crate) worker: StdArc<Boundary>,
}

impl Boundaries {
    pub(crate) fn new() -> Self {
        Boundaries {
            observer: Boundary::new(
                "gpu_observer",
                "drops the record; admission goes on (fails open)",
            ),
            preflight: Boundary::new(
                "gpu_preflight",
                "fails that candidate's preflight, so the submission is rejected, never queued unchecked (fails closed)",
            ),
            evictor: Boundary::new(
                "gpu_evictor",
                "skips that eviction request; the waiter waits as without an evictor (fails open)",
            ),
            backend: StdArc::new(backend_boundary()),
            worker: StdArc::new(worker_boundary()),
        }
    }

    /// Every component's health, in a fixed order.
    pub(crate) fn health(&self) -> Vec<ComponentHealth> {
        vec![
            self.observer.health(),
            self.preflight.health(),
            self.evictor.health(),
            self.backend.health(),
            self.worker.health(),
        ]
    }
}

/// The boundary of a [`GuardedBackend`].
pub(crate) fn backend_boundary() -> Boundary {
    Boundary::new(
        "gpu_backend",
        "fails the operation: the attempt's envelope is rolled back or torn down and its grant returned; the device stays in service",
    )
}

/// The boundary around each job of a device worker, when no service shares
/// one with it.
pub(crate) fn worker_boundary() -> Boundary {
    Boundary::new(
        "gpu_device_worker",
        "loses that job's result, reported to its waiter as a typed failure; the thread runs the next job",
    )
}

/// A backend whose every call runs behind a [`Boundary`]: a panic
/// is [`BackendError::Panicked`]. See the [module documentation](self).
pub(crate) struct GuardedBackend {
    inner: SharedBackend,
    boundary: StdArc<Boundary>,
}

impl GuardedBackend {
    pub(crate) fn new(inner: SharedBackend, boundary: StdArc<Boundary>) -> Self {
        GuardedBackend { inner, boundary }
    }

    fn guard<T>(
        &self,
        op: BackendOp,
        call: impl FnOnce(&dyn BackendOps) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let inner = &*self.inner;
        self.boundary
            .call(|| call(inner))
            .unwrap_or(Err(BackendError::Panicked { op }))
    }
}

impl fmt::Debug for GuardedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The inner backend's own `Debug` is user code too.
        f.debug_struct("GuardedBackend")
            .field("name", &self.name())
            .field("boundary", &self.boundary)
            .finish()
    }
}

impl BackendOps for GuardedBackend {
    fn name(&self) -> &'static str {
        self.boundary
            .call(|| self.inner.name())
            .unwrap_or("(backend name panicked)")
    }

    fn inventory(&self) -> Result<Vec<DeviceFacts>, BackendError> {
        self.guard(BackendOp::Inventory, |b| b.inventory())
    }

    fn memory_info(&self, device: DeviceOrdinal) -> Result<(u64, u64), BackendError> {
        self.guard(BackendOp::MemoryInfo, |b| b.memory_info(device))
    }

    fn open_lane(&self, device: DeviceOrdinal) -> Result<LaneId, BackendError> {
        self.guard(BackendOp::OpenLane, |b| b.open_lane(device))
    }

    fn create_root_stream(&self, lane: LaneId) -> Result<StreamId, BackendError> {
        self.guard(BackendOp::CreateRootStream, |b| b.create_root_stream(lane))
    }

    fn open_domain(&self, lane: LaneId, ceiling_bytes: u64) -> Result<DomainId, BackendError> {
        self.guard(BackendOp::OpenDomain, |b| {
            b.open_domain(lane, ceiling_bytes)
        })
    }

    fn join_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        self.guard(BackendOp::JoinDomain, |b| b.join_domain(domain, stream))
    }

    fn open_worker_scope(&self, lane: LaneId) -> Result<ScopeId, BackendError> {
        self.guard(BackendOp::OpenWorkerScope, |b| b.open_worker_scope(lane))
    }

    fn fork_stream(&self, root: StreamId) -> Result<StreamId, BackendError> {
        self.guard(BackendOp::ForkStream, |b| b.fork_stream(root))
    }

    fn alloc(
        &self,
        domain: DomainId,
        bytes: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, BackendError> {
        self.guard(BackendOp::Alloc, |b| b.alloc(domain, bytes, stream))
    }

    fn free(&self, domain: DomainId, ptr: DevicePtr, stream: StreamId) -> Result<(), BackendError> {
        self.guard(BackendOp::Free, |b| b.free(domain, ptr, stream))
    }

    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        self.guard(BackendOp::Synchronize, |b| b.synchronize(stream))
    }

    fn close_worker_scope(&self, scope: ScopeId) -> Result<(), BackendError> {
        self.guard(BackendOp::CloseWorkerScope, |b| b.close_worker_scope(scope))
    }

    fn leave_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        self.guard(BackendOp::LeaveDomain, |b| b.leave_domain(domain, stream))
    }

    fn close_domain(&self, domain: DomainId) -> Result<(), BackendError> {
        self.guard(BackendOp::CloseDomain, |b| b.close_domain(domain))
    }

    fn destroy_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.guard(BackendOp::DestroyStream, |b| b.destroy_stream(stream))
    }

    fn close_lane(&self, lane: LaneId) -> Result<(), BackendError> {
        self.guard(BackendOp::CloseLane, |b| b.close_lane(lane))
    }
}
