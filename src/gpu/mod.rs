//! GPU admission and device-memory governance.
//!
//! One admission per native query attempt: one selected device, one
//! immutable memory grant, one transactional envelope. Each arrow below has
//! exactly one owner, and nothing can be forged from outside:
//!
//! ```text
//! PlanDescription ─ProofIssuer::lower─▶ CapabilityProof      (proof)
//!   ─QueryService::ticket─▶ AdmissionTicket                   (service: reserves nothing)
//!   ─admit─▶ bounded FIFO queue and placement                 (scheduler)
//!   ─▶ DeviceLedger grant                                      (ledger)
//!   ─▶ AdmissionEnvelope                                       (envelope, on the device worker)
//!   ─▶ QueryHandle ─release─▶ AttemptReport                    (handle)
//! ```
//!
//! The [`ledger`] is the only capacity authority, and it is plain data: the
//! [`scheduler`]'s `AdmissionCore` owns every ledger and the queue, and the
//! [`service`] keeps that core behind one mutex that is never held across an
//! await or a backend call. Physical work (streams, domains, teardown) runs
//! on one [`worker`] thread per device through the [`backend`] trait. See
//! each module for its part of the design.

// Profiles, the ledger and placement: pure integer accounting, no CUDA.
#[cfg(feature = "config")]
pub mod config;
pub mod ledger;
pub mod outcome;
pub mod placement;
pub mod profile;
pub mod proof;

// The physical side: backends, allocation domains, device workers and the
// transactional envelope.
pub mod backend;
pub mod domain;
pub mod envelope;
pub mod worker;

// The query service: the one queue and its scheduler (a plain synchronous
// core), the async glue around it, handles and observation records.
pub mod handle;
pub mod observe;
pub mod scheduler;
pub mod service;

#[cfg(feature = "config")]
pub use config::{parse_byte_size, parse_device_selection, GpuConfig, DEVICES_ENV};
pub use handle::{AttemptReport, QueryHandle};
pub use ledger::{
    Decision, DeviceLedger, ForeignGrant, GrantId, GrantRequest, LaterReason, LedgerError,
    LedgerHealth, LedgerReport, MemoryGrant, NeverReason, ProtectionReport, ReleaseOutcome,
    WaiterId,
};
#[cfg(feature = "config")]
pub use observe::jsonl_observer;
pub use observe::{Observation, ObservationKind};
pub use outcome::{GpuAdmitError, QueryAdmissionOutcome};
pub use placement::{compatible_devices, rank_devices, DeviceLoad, RankedDevice};
pub use profile::{
    DeviceProfile, DeviceProfileBuilder, DeviceSet, MemoryOwnership, OwnershipMode, QueueBounds,
};
pub use proof::{
    AllocationOwner, Capability, CapabilityProof, CapabilitySet, IssuerId, LoweringError,
    PhaseRequirement, PlanDescription, PlanFingerprint, ProofIssuer,
};
pub use scheduler::{
    AdmissionCore, AdmissionSnapshot, CacheChange, CoreEvent, DeviceSummary, WaiterSnapshot,
};
pub use service::{
    AdmissionTicket, PreflightFuture, PreflightRequest, QueryService, QueryServiceBuilder,
    ServiceError,
};
