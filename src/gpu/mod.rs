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

#[cfg(feature = "config")]
pub use config::{parse_byte_size, parse_device_selection, GpuConfig, DEVICES_ENV};
pub use ledger::{
    Decision, DeviceLedger, ForeignGrant, GrantId, GrantRequest, LaterReason, LedgerError,
    LedgerHealth, LedgerReport, MemoryGrant, NeverReason, ProtectionReport, ReleaseOutcome,
    WaiterId,
};
pub use outcome::{GpuAdmitError, QueryAdmissionOutcome};
pub use placement::{compatible_devices, rank_devices, DeviceLoad, RankedDevice};
pub use profile::{
    DeviceProfile, DeviceProfileBuilder, DeviceSet, MemoryOwnership, OwnershipMode, QueueBounds,
};
pub use proof::{
    AllocationOwner, Capability, CapabilityProof, CapabilitySet, IssuerId, LoweringError,
    PhaseRequirement, PlanDescription, PlanFingerprint, ProofIssuer,
};
