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
//! What every backend's operations guarantee (the sealed [`GpuBackend`]
//! trait carries them):
//!
//! * Operations are synchronous. The ones that may block the calling thread
//!   (`synchronize` and the teardown calls that wait for the
//!   device) are only ever called from the device's worker thread, never from
//!   a tokio worker.
//! * An operation never panics on bad input: an unknown id is
//!   [`BackendError::UnknownHandle`]. The query service still calls every
//!   operation behind a panic boundary, and a panic that escapes one is
//!   [`BackendError::Panicked`], a failed operation of that attempt.
//! * `alloc` is called only after the crate's allocation domain
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
//! * [`sim::SimBackend`]: deterministic simulated devices, to run a service
//!   on a machine without a GPU; with the `test-util` feature, an operation
//!   log and fault injection for tests.
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

// The raw value is crate-private unless the id names it `get: pub`: a
// stream or domain number means nothing outside the backend that chose it.
macro_rules! opaque_id {
    ($(#[$doc:meta])* $name:ident) => {
        opaque_id!($(#[$doc])* $name, get: pub(crate));
    };
    ($(#[$doc:meta])* $name:ident, get: $get:vis) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(u64);

        impl $name {
            /// Wraps a backend-chosen raw value.
            #[allow(dead_code)] // not every id is made outside its backend
            pub(crate) const fn new(raw: u64) -> Self {
                Self(raw)
            }

            /// The raw value the backend chose.
            $get const fn get(self) -> u64 {
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

// After the macro, which the module uses. Its items are reachable through
// `GpuBackend`'s supertrait and nameable only in the crate: that is what
// seals the trait.
#[allow(unnameable_types)]
mod ops;
pub(crate) use ops::{BackendOps, DeviceFacts, DomainId, LaneId, ScopeId};

opaque_id!(
    /// A stream: the attempt's root stream or one forked from it.
    StreamId
);
opaque_id!(
    /// A device allocation made through a domain. On the CUDA backend its
    /// [`get`](Self::get) is the device address (a `CUdeviceptr`), for a
    /// kernel's arguments.
    DevicePtr,
    get: pub
);

/// The index of a device as the backend numbers them (a CUDA ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceOrdinal(pub u32);

impl fmt::Display for DeviceOrdinal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu{}", self.0)
    }
}

/// Every operation a backend performs, by name: the vocabulary of error
/// messages, of the envelope's build steps and of the simulator's fault
/// injection. `Display` writes the operation's name (`open_lane`,
/// `synchronize`...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum BackendOp {
    /// `inventory`.
    Inventory,
    /// `memory_info`.
    MemoryInfo,
    /// `open_lane`.
    OpenLane,
    /// `create_root_stream`.
    CreateRootStream,
    /// `open_domain`.
    OpenDomain,
    /// `join_domain`.
    JoinDomain,
    /// `open_worker_scope`.
    OpenWorkerScope,
    /// `fork_stream`.
    ForkStream,
    /// `alloc`.
    Alloc,
    /// `free`.
    Free,
    /// `synchronize`.
    Synchronize,
    /// `close_worker_scope`.
    CloseWorkerScope,
    /// `leave_domain`.
    LeaveDomain,
    /// `close_domain`.
    CloseDomain,
    /// `destroy_stream`.
    DestroyStream,
    /// `close_lane`.
    CloseLane,
}

impl fmt::Display for BackendOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
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
        })
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

/// A GPU backend: the physical side of admission, the only code that touches
/// a device. The crate's backends are [`sim::SimBackend`] and, with the
/// `cuda` feature, `cuda::CudaBackend`; a service takes either as a
/// [`SharedBackend`].
///
/// The trait is sealed: its operations (the envelope's build and teardown
/// steps, allocation, synchronization) are the crate's to call, in the order
/// and under the panic boundary the module documentation describes. Opening
/// it to other backends later is a compatible change; sealing it after
/// release would not be.
pub trait GpuBackend: BackendOps {}

impl<T: BackendOps> GpuBackend for T {}
