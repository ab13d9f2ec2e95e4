//! GPU admission and device-memory governance.
//!
//! (The design overview is written as the module lands; see
//! `docs/ARCHITECTURE.md` and `../shared/seeds/001_07186211194acf4e.txt`.)

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
pub use scheduler::{AdmissionCore, AdmissionSnapshot, CoreEvent, DeviceSummary, WaiterSnapshot};
pub use service::{
    AdmissionTicket, PreflightFuture, PreflightRequest, QueryService, QueryServiceBuilder,
    ServiceError,
};
