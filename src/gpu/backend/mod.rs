//! The backend boundary: the only code that touches CUDA.
//!
//! Everything above this trait (profiles, the ledger, the queue, the envelope
//! transaction, handles) is backend-agnostic and works with the opaque ids
//! defined here. A backend is a table from those ids to physical objects: a
//! CUDA stream and memory pool in the `cudarc` backend, a few integers in the
//! simulated one. Keeping the boundary this narrow is what makes every side
//! effect loggable, every failure injectable, and the envelope's rollback
//! order testable on a machine without a GPU.
//!
//! # Contract
//!
//! * Methods are synchronous. The ones that may block the calling thread
//!   ([`GpuBackend::synchronize`] and the teardown calls that wait for the
//!   device) are only ever called from the device's worker thread, never from
//!   a tokio worker.
//! * A method never panics on bad input: an unknown id is
//!   [`BackendError::UnknownHandle`]. The query service still calls every
//!   method behind a panic boundary, and a panic that escapes one is
//!   [`BackendError::Panicked`], a failed operation of that attempt.
//! * [`GpuBackend::alloc`] is called only after the crate's allocation domain
//!   has reserved the bytes against the grant ceiling, so a backend does no
//!   byte arithmetic of its own; it may add a driver-level cap (a memory pool
//!   whose maximum size is the ceiling) as a second line of defence.
//! * An error that may have corrupted device state is reported as
//!   [`BackendError::Fault`], with how far the damage is known to reach. The
//!   service quarantines the device ([`FaultIsolation::Device`]) or closes
//!   every ledger of the backend ([`FaultIsolation::Unknown`]).
//! * Release operations (`close_*`, `leave_domain`, `destroy_stream`,
//!   `free`) forget the id even when they report an error: nothing a caller
//!   could retry would succeed, and keeping the host-side object alive would
//!   only leak it. The error is still reported, so a fault is not lost.
//!
//! # Implementations
//!
//! * [`sim::SimBackend`]: deterministic simulated devices with an operation
//!   log and fault injection, for tests on machines without a GPU.
//! * `cuda::CudaBackend` (feature `cuda`): the CUDA driver through `cudarc`,
//!   loaded at run time.

#[cfg(all(feature = "cuda", not(loom)))]
pub mod cuda;
pub mod sim;

// Checks on a real CUDA device (feature `gpu-tests`, which exists for them;
// CI only compiles them; scripts/gpu-check.sh runs them on a GPU). One of
// them loads a kernel through the driver's FFI, as the backend does.
#[cfg(all(test, feature = "gpu-tests", not(loom)))]
#[allow(unsafe_code)]
mod cuda_checks;

use std::error::Error;
use std::fmt;

macro_rules! opaque_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(u64);

        impl $name {
            /// Wraps a backend-chosen raw value.
            pub const fn new(raw: u64) -> Self {
                Self(raw)
            }

            /// The raw value the backend chose.
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}#{}", stringify!($name), self.0)
            }
        }
    };
}

opaque_id!(
    /// An attempt lane: the backend's per-attempt execution context on one
    /// device, opened first and closed last.
    LaneId
);
opaque_id!(
    /// A stream: the attempt's root stream or one forked from it.
    StreamId
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
opaque_id!(
    /// A device allocation made through a domain.
    DevicePtr
);

/// The index of a device as the backend numbers them (a CUDA ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceOrdinal(pub u32);

impl fmt::Display for DeviceOrdinal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu{}", self.0)
    }
}

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

/// Every operation of the [`GpuBackend`] trait, by name: the vocabulary of
/// the operation log, of fault injection and of error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum BackendOp {
    /// [`GpuBackend::inventory`].
    Inventory,
    /// [`GpuBackend::memory_info`].
    MemoryInfo,
    /// [`GpuBackend::open_lane`].
    OpenLane,
    /// [`GpuBackend::create_root_stream`].
    CreateRootStream,
    /// [`GpuBackend::open_domain`].
    OpenDomain,
    /// [`GpuBackend::join_domain`].
    JoinDomain,
    /// [`GpuBackend::open_worker_scope`].
    OpenWorkerScope,
    /// [`GpuBackend::fork_stream`].
    ForkStream,
    /// [`GpuBackend::alloc`].
    Alloc,
    /// [`GpuBackend::free`].
    Free,
    /// [`GpuBackend::synchronize`].
    Synchronize,
    /// [`GpuBackend::close_worker_scope`].
    CloseWorkerScope,
    /// [`GpuBackend::leave_domain`].
    LeaveDomain,
    /// [`GpuBackend::close_domain`].
    CloseDomain,
    /// [`GpuBackend::destroy_stream`].
    DestroyStream,
    /// [`GpuBackend::close_lane`].
    CloseLane,
}

impl BackendOp {
    /// A short, stable name (`open_lane`, `synchronize`, ...).
    pub fn name(self) -> &'static str {
        match self {
            BackendOp::Inventory => "inventory",
            BackendOp::MemoryInfo => "memory_info",
            BackendOp::OpenLane => "open_lane",
            BackendOp::CreateRootStream => "create_root_stream",
            BackendOp::OpenDomain => "open_domain",
            BackendOp::JoinDomain => "join_domain",
            BackendOp::OpenWorkerScope => "open_worker_scope",
            BackendOp::ForkStream => "fork_stream",
            BackendOp::Alloc => "alloc",
            BackendOp::Free => "free",
            BackendOp::Synchronize => "synchronize",
            BackendOp::CloseWorkerScope => "close_worker_scope",
            BackendOp::LeaveDomain => "leave_domain",
            BackendOp::CloseDomain => "close_domain",
            BackendOp::DestroyStream => "destroy_stream",
            BackendOp::CloseLane => "close_lane",
        }
    }
}

impl fmt::Display for BackendOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How far the damage of a device fault is known to reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultIsolation {
    /// The fault is proven to be confined to one device (a stream
    /// synchronization reported a sticky error on that device's context):
    /// that device is quarantined.
    Device(DeviceOrdinal),
    /// The fault's reach cannot be established (abandoned clean-up, a
    /// process-wide driver error): every ledger of the backend closes.
    Unknown,
}

/// Why a backend operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendError {
    /// No CUDA driver library could be loaded on this machine.
    NoDriver,
    /// The driver loaded but reports no usable device.
    NoDevice,
    /// The ordinal is not a device this backend manages.
    UnknownDevice {
        /// The ordinal asked for.
        ordinal: DeviceOrdinal,
    },
    /// An id that the backend did not issue, or that was already closed.
    UnknownHandle {
        /// The operation that received it.
        op: BackendOp,
        /// The raw id.
        id: u64,
    },
    /// An allocation would exceed the domain's ceiling (the attempt's grant).
    GrantExceeded {
        /// Bytes asked for (after alignment).
        requested: u64,
        /// Bytes left under the ceiling.
        available: u64,
    },
    /// The driver failed the operation without corrupting device state (an
    /// out-of-memory allocation, an invalid value): an attempt-level error.
    Driver {
        /// The operation that failed.
        op: BackendOp,
        /// The driver's error code (a `CUresult`).
        code: u32,
        /// The driver's description of the code.
        message: String,
    },
    /// The backend panicked in this operation. The panic was caught (see
    /// the GPU module's failure model): the operation counts as failed for
    /// the attempt that made it, like a [`Driver`](Self::Driver) error, and
    /// is not taken as evidence about the device.
    Panicked {
        /// The operation that panicked.
        op: BackendOp,
    },
    /// An error that may have corrupted device state (a sticky CUDA error
    /// such as an illegal address seen at stream synchronization).
    Fault {
        /// The operation that surfaced the fault.
        op: BackendOp,
        /// The driver's error code (a `CUresult`).
        code: u32,
        /// How far the damage is known to reach.
        isolation: FaultIsolation,
    },
}

impl BackendError {
    /// The fault's isolation when this error is a device fault.
    pub fn fault_isolation(&self) -> Option<FaultIsolation> {
        match self {
            BackendError::Fault { isolation, .. } => Some(*isolation),
            _ => None,
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::NoDriver => {
                f.write_str("no CUDA driver library (libcuda) could be loaded on this machine")
            }
            BackendError::NoDevice => f.write_str("the CUDA driver reports no usable device"),
            BackendError::UnknownDevice { ordinal } => {
                write!(f, "{ordinal} is not a device managed by this backend")
            }
            BackendError::UnknownHandle { op, id } => {
                write!(
                    f,
                    "{op}: id {id} was not issued by this backend or is already closed"
                )
            }
            BackendError::GrantExceeded {
                requested,
                available,
            } => write!(
                f,
                "allocation of {requested} bytes exceeds the grant ceiling ({available} bytes left)"
            ),
            BackendError::Driver { op, code, message } => {
                write!(f, "{op} failed with driver error {code}: {message}")
            }
            BackendError::Panicked { op } => {
                write!(f, "the backend panicked in {op}; the operation failed")
            }
            BackendError::Fault {
                op,
                code,
                isolation,
            } => match isolation {
                FaultIsolation::Device(ordinal) => write!(
                    f,
                    "{op} surfaced device fault {code}; {ordinal} must be quarantined"
                ),
                FaultIsolation::Unknown => write!(
                    f,
                    "{op} surfaced fault {code} whose isolation cannot be established"
                ),
            },
        }
    }
}

impl Error for BackendError {}

/// How a backend is shared between the ledger's service, envelopes, their
/// execution contexts and the device worker.
pub type SharedBackend = crate::sync::StdArc<dyn GpuBackend>;

/// A GPU backend: the physical side of admission.
///
/// Construction order of an envelope (each step undone in reverse on
/// failure): [`open_lane`](Self::open_lane),
/// [`create_root_stream`](Self::create_root_stream),
/// [`open_domain`](Self::open_domain), [`join_domain`](Self::join_domain),
/// [`open_worker_scope`](Self::open_worker_scope).
pub trait GpuBackend: Send + Sync + fmt::Debug + 'static {
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
