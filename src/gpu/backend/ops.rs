//! The operations a backend performs, behind the sealed [`GpuBackend`]
//! marker: reachable by the crate, not nameable by its users.

use std::fmt;

#[cfg(doc)]
use super::GpuBackend;
use super::{BackendError, DeviceOrdinal, DevicePtr, StreamId};

opaque_id!(
    /// An attempt lane: the backend's per-attempt execution context on one
    /// device, opened first and closed last.
    LaneId
);
opaque_id!(
    /// An allocation domain: the memory an attempt allocates from, whose
    /// ceiling is the attempt's immutable grant.
    DomainId
);
opaque_id!(
    /// A registration of the attempt with its device's worker thread.
    ScopeId
);

/// What a backend knows about one device. Diagnostic only: nothing here is
/// an admission input except through the operator-declared profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The device's ordinal.
    pub ordinal: DeviceOrdinal,
    /// The device's name as the driver reports it.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Total device memory in bytes.
    pub total_bytes: u64,
    /// Free device memory in bytes when the facts were read (telemetry).
    pub free_bytes: u64,
    /// Whether the device supports stream-ordered memory pools.
    pub memory_pools: bool,
}

/// The operations of a GPU backend (see the [module contract](super)).
///
/// Construction order of an envelope (each step undone in reverse on
/// failure): [`open_lane`](Self::open_lane),
/// [`create_root_stream`](Self::create_root_stream),
/// [`open_domain`](Self::open_domain), [`join_domain`](Self::join_domain),
/// [`open_worker_scope`](Self::open_worker_scope).
pub trait BackendOps: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs (`sim`, `cuda`).
    fn name(&self) -> &'static str;

    /// The devices this backend manages.
    ///
    /// # Errors
    ///
    /// [`BackendError::Driver`] or [`BackendError::Fault`] when the driver
    /// cannot report a device's facts.
    fn inventory(&self) -> Result<Vec<DeviceFacts>, BackendError>;

    /// Free and total device memory, as the driver reports them now.
    /// Telemetry only: never an admission input.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownDevice`] when `device` is not managed by this
    /// backend; [`BackendError::Driver`] or [`BackendError::Fault`] when the
    /// driver cannot report its memory.
    fn memory_info(&self, device: DeviceOrdinal) -> Result<(u64, u64), BackendError>;

    /// Opens an attempt lane on `device`.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownDevice`] when `device` is not managed by this
    /// backend; [`BackendError::Driver`] or [`BackendError::Fault`] when the
    /// driver cannot open the lane.
    fn open_lane(&self, device: DeviceOrdinal) -> Result<LaneId, BackendError>;

    /// Creates the lane's root stream.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `lane` is not an open lane;
    /// [`BackendError::Driver`] or [`BackendError::Fault`] when the driver
    /// cannot create the stream.
    fn create_root_stream(&self, lane: LaneId) -> Result<StreamId, BackendError>;

    /// Opens the lane's allocation domain with a ceiling of `ceiling_bytes`
    /// (the grant). The backend may enforce it in the driver as well.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `lane` is not an open lane;
    /// [`BackendError::Driver`] or [`BackendError::Fault`] when the driver
    /// cannot set up the domain (a capped memory pool, for example).
    fn open_domain(&self, lane: LaneId, ceiling_bytes: u64) -> Result<DomainId, BackendError>;

    /// Makes `stream` a member of `domain`: allocations on it come from the
    /// domain.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `domain` or `stream` is not
    /// open.
    fn join_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError>;

    /// Registers the lane with its device's worker thread.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `lane` is not an open lane.
    fn open_worker_scope(&self, lane: LaneId) -> Result<ScopeId, BackendError>;

    /// Forks a stream that first waits on `root`'s queued work.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `root` is not an open stream;
    /// [`BackendError::Driver`] or [`BackendError::Fault`] when the driver
    /// cannot create or order the fork.
    fn fork_stream(&self, root: StreamId) -> Result<StreamId, BackendError>;

    /// Allocates `bytes` from `domain`, ordered on `stream`. Called only after
    /// the domain's software ceiling reserved the bytes.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `domain` is not open or `stream`
    /// is not a member of it; [`BackendError::Driver`] when the driver fails
    /// the allocation (out of memory, including a driver-level cap under the
    /// ceiling); [`BackendError::Fault`] for a sticky error.
    fn alloc(
        &self,
        domain: DomainId,
        bytes: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, BackendError>;

    /// Frees an allocation of `domain`, ordered on `stream`.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `domain` or `stream` is not open
    /// or `ptr` is not a live allocation of `domain`; [`BackendError::Driver`]
    /// or [`BackendError::Fault`] when the driver fails the free. The
    /// allocation is forgotten either way.
    fn free(&self, domain: DomainId, ptr: DevicePtr, stream: StreamId) -> Result<(), BackendError>;

    /// Blocks until all work queued on `stream` has finished. Called only on
    /// the device's worker thread. A sticky error here is a
    /// [`BackendError::Fault`] isolated to the device.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `stream` is not open; any
    /// driver error while waiting is a [`BackendError::Fault`] isolated to
    /// the stream's device.
    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError>;

    /// Undoes [`open_worker_scope`](Self::open_worker_scope).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `scope` is not open.
    fn close_worker_scope(&self, scope: ScopeId) -> Result<(), BackendError>;

    /// Undoes [`join_domain`](Self::join_domain).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `domain` is not open or
    /// `stream` is not a member of it.
    fn leave_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError>;

    /// Undoes [`open_domain`](Self::open_domain), returning its memory to the
    /// device.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `domain` is not open;
    /// [`BackendError::Driver`] or [`BackendError::Fault`] when the driver
    /// fails to free the domain's memory. The id is forgotten either way.
    fn close_domain(&self, domain: DomainId) -> Result<(), BackendError>;

    /// Destroys a stream (root or forked).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `stream` is not open;
    /// [`BackendError::Driver`] or [`BackendError::Fault`] when the driver
    /// fails to order or destroy it. The id is forgotten either way.
    fn destroy_stream(&self, stream: StreamId) -> Result<(), BackendError>;

    /// Undoes [`open_lane`](Self::open_lane).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `lane` is not open;
    /// [`BackendError::Driver`] or [`BackendError::Fault`] for a deferred
    /// driver error of the lane's device surfacing here. The id is forgotten
    /// either way.
    fn close_lane(&self, lane: LaneId) -> Result<(), BackendError>;
}
