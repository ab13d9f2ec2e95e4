//! Structured GPU admission errors and their policy-neutral classification.
//!
//! Every way a GPU admission can end without a handle is one
//! [`GpuAdmitError`] variant carrying the facts at fault (the missing
//! capabilities, the floor against the largest possible grant, the queue
//! bound, the device and fault code). [`GpuAdmitError::outcome`] folds them
//! into a [`QueryAdmissionOutcome`], a small classification an application
//! can switch on.
//!
//! # Policy-neutral
//!
//! This crate does not decide what an outcome means to a client. Capacity
//! pressure may become a retry with back-off, a queue of the application's
//! own, an HTTP 429 or a gRPC `RESOURCE_EXHAUSTED`; a capability or
//! configuration outcome is never fixed by waiting and usually maps to a
//! client or operator error. The application owns that mapping.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use super::backend::{BackendError, BackendOp, DeviceOrdinal};
use super::ledger::GrantId;
use super::profile::fmt_bytes;
use super::proof::{CapabilitySet, IssuerId, LoweringError, PlanFingerprint};

/// The policy-neutral class of a [`GpuAdmitError`]. `Display` writes a
/// short, stable snake_case name (`capacity_pressure`, `deadline`...), the
/// one [`Observation::outcome`](super::Observation::outcome) carries, for
/// metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueryAdmissionOutcome {
    /// The request could run, but not now: the queue or device is full.
    CapacityPressure,
    /// The plan needs capabilities (or proof) no installed device or handle
    /// offers: waiting will not help.
    Capability,
    /// The plan or the installed profiles cannot fit together (unresolved
    /// owners, a floor that never fits, a failed preflight): waiting will
    /// not help.
    Configuration,
    /// The caller cancelled the request.
    Cancelled,
    /// The request's deadline passed.
    Deadline,
    /// The service is closed.
    Closed,
    /// A device failed or no healthy compatible device is left.
    DeviceFault,
}

impl QueryAdmissionOutcome {
    /// A short, stable snake_case name, for the observation records' metric
    /// labels; users read it through `Display`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            QueryAdmissionOutcome::CapacityPressure => "capacity_pressure",
            QueryAdmissionOutcome::Capability => "capability",
            QueryAdmissionOutcome::Configuration => "configuration",
            QueryAdmissionOutcome::Cancelled => "cancelled",
            QueryAdmissionOutcome::Deadline => "deadline",
            QueryAdmissionOutcome::Closed => "closed",
            QueryAdmissionOutcome::DeviceFault => "device_fault",
        }
    }
}

impl fmt::Display for QueryAdmissionOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Why a GPU admission did not produce a handle.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuAdmitError {
    /// No installed device supports every required capability.
    NoCapableDevice {
        /// The required capabilities missing on the closest installed
        /// device (the one lacking fewest).
        missing: CapabilitySet,
    },
    /// A plan phase's allocation owner is unresolved.
    UnresolvedOwner {
        /// The phase's name.
        phase: String,
    },
    /// A plan phase's minimum working bytes are unknown.
    UnresolvedPhase {
        /// The phase's name.
        phase: String,
    },
    /// A device-specific preflight failed.
    PreflightFailed {
        /// The device the preflight ran for, if any.
        device: Option<DeviceOrdinal>,
        /// What the preflight reported.
        message: String,
    },
    /// The required floor exceeds the largest grant any compatible device
    /// could ever issue.
    FloorNeverFits {
        /// The request's required floor in bytes.
        required_floor: u64,
        /// The largest grant a compatible device could issue when empty.
        largest_possible: u64,
    },
    /// The queue already held its bound of queued plus pending-preflight
    /// requests.
    QueueFull {
        /// The configured bound.
        max_pending: usize,
    },
    /// The deadline had passed before the request was queued.
    DeadlinePassed,
    /// The deadline passed while the request waited.
    DeadlineExceeded {
        /// How long the request waited.
        waited: Duration,
    },
    /// The request had to wait with a deadline (its own or the queue's
    /// `max_wait`), but the task polling it is not on a tokio runtime with
    /// timers enabled (`enable_time`), so the deadline could not be kept.
    /// The request was withdrawn; nothing is held.
    TimerUnavailable,
    /// The caller cancelled the request.
    Cancelled,
    /// The service closed before the request was admitted.
    Closed,
    /// Every compatible device is lost, quarantined or closed.
    NoHealthyDevice {
        /// The compatible devices, none of them healthy.
        devices: Vec<DeviceOrdinal>,
    },
    /// A device reported a fault during admission, or the envelope build
    /// on it panicked part-way (code 0; the device is quarantined).
    DeviceFault {
        /// The device.
        device: DeviceOrdinal,
        /// The driver's fault code; 0 when there is none.
        code: u32,
    },
    /// A step of the admission envelope failed and the transaction was
    /// rolled back.
    EnvelopeStepFailed {
        /// The backend operation of the failing step.
        step: BackendOp,
        /// The backend's error.
        error: BackendError,
    },
    /// The capability proof was issued by another service's engine.
    ForeignProof {
        /// This service's issuer.
        expected: IssuerId,
        /// The proof's issuer.
        found: IssuerId,
    },
    /// A resource-only handle (manual admission) was presented to authorize
    /// a native plan; only an engine-issued proof can.
    ResourceOnlyHandle,
    /// A proof bound to another admission (another handle's device and
    /// grant) was presented to authorize this handle.
    ProofBoundElsewhere {
        /// The device the presented proof was admitted on.
        device: DeviceOrdinal,
        /// The grant it was admitted with.
        grant: GrantId,
    },
    /// A handle admitted for one plan was presented to authorize another.
    ProofMismatch {
        /// The fingerprint of the plan the handle was admitted for.
        admitted: PlanFingerprint,
        /// The fingerprint of the plan presented.
        presented: PlanFingerprint,
    },
    /// The selected device's worker thread is gone, so the envelope's state
    /// is unknown; the backend's ledgers were closed.
    WorkerGone {
        /// The device.
        device: DeviceOrdinal,
    },
    /// The device profile's bounds leave no room for an envelope (a
    /// configuration error; nothing was built).
    EnvelopeInvalid {
        /// What was wrong.
        message: String,
    },
}

impl GpuAdmitError {
    /// The policy-neutral class of this error.
    pub fn outcome(&self) -> QueryAdmissionOutcome {
        use QueryAdmissionOutcome as O;
        match self {
            GpuAdmitError::NoCapableDevice { .. }
            | GpuAdmitError::ForeignProof { .. }
            | GpuAdmitError::ResourceOnlyHandle
            | GpuAdmitError::ProofMismatch { .. }
            | GpuAdmitError::ProofBoundElsewhere { .. } => O::Capability,
            GpuAdmitError::EnvelopeInvalid { .. } => O::Configuration,
            GpuAdmitError::WorkerGone { .. } => O::DeviceFault,
            GpuAdmitError::UnresolvedOwner { .. }
            | GpuAdmitError::UnresolvedPhase { .. }
            | GpuAdmitError::PreflightFailed { .. }
            | GpuAdmitError::FloorNeverFits { .. }
            | GpuAdmitError::TimerUnavailable => O::Configuration,
            GpuAdmitError::QueueFull { .. } => O::CapacityPressure,
            GpuAdmitError::DeadlinePassed | GpuAdmitError::DeadlineExceeded { .. } => O::Deadline,
            GpuAdmitError::Cancelled => O::Cancelled,
            GpuAdmitError::Closed => O::Closed,
            GpuAdmitError::NoHealthyDevice { .. } | GpuAdmitError::DeviceFault { .. } => {
                O::DeviceFault
            }
            GpuAdmitError::EnvelopeStepFailed { error, .. } => match error {
                // The machine has no usable CUDA: an operator problem.
                BackendError::NoDriver
                | BackendError::NoDevice
                | BackendError::UnknownDevice { .. } => O::Configuration,
                BackendError::GrantExceeded { .. } => O::CapacityPressure,
                _ => O::DeviceFault,
            },
        }
    }

    /// A short, stable snake_case name for metric labels and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            GpuAdmitError::NoCapableDevice { .. } => "no_capable_device",
            GpuAdmitError::UnresolvedOwner { .. } => "unresolved_owner",
            GpuAdmitError::UnresolvedPhase { .. } => "unresolved_phase",
            GpuAdmitError::PreflightFailed { .. } => "preflight_failed",
            GpuAdmitError::FloorNeverFits { .. } => "floor_never_fits",
            GpuAdmitError::QueueFull { .. } => "queue_full",
            GpuAdmitError::DeadlinePassed => "deadline_passed",
            GpuAdmitError::DeadlineExceeded { .. } => "deadline_exceeded",
            GpuAdmitError::TimerUnavailable => "timer_unavailable",
            GpuAdmitError::Cancelled => "cancelled",
            GpuAdmitError::Closed => "closed",
            GpuAdmitError::NoHealthyDevice { .. } => "no_healthy_device",
            GpuAdmitError::DeviceFault { .. } => "device_fault",
            GpuAdmitError::EnvelopeStepFailed { .. } => "envelope_step_failed",
            GpuAdmitError::ForeignProof { .. } => "foreign_proof",
            GpuAdmitError::ResourceOnlyHandle => "resource_only_handle",
            GpuAdmitError::ProofMismatch { .. } => "proof_mismatch",
            GpuAdmitError::ProofBoundElsewhere { .. } => "proof_bound_elsewhere",
            GpuAdmitError::WorkerGone { .. } => "worker_gone",
            GpuAdmitError::EnvelopeInvalid { .. } => "envelope_invalid",
        }
    }
}

impl From<LoweringError> for GpuAdmitError {
    fn from(error: LoweringError) -> Self {
        match error {
            LoweringError::UnresolvedOwner { phase } => GpuAdmitError::UnresolvedOwner { phase },
            LoweringError::UnresolvedPhase { phase } => GpuAdmitError::UnresolvedPhase { phase },
            LoweringError::ForeignProof { expected, found } => {
                GpuAdmitError::ForeignProof { expected, found }
            }
        }
    }
}

impl fmt::Display for GpuAdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuAdmitError::NoCapableDevice { missing } => write!(
                f,
                "no installed device supports every required capability (missing {missing})"
            ),
            GpuAdmitError::UnresolvedOwner { phase } => {
                write!(f, "phase `{phase}` has an unresolved allocation owner")
            }
            GpuAdmitError::UnresolvedPhase { phase } => {
                write!(f, "phase `{phase}` has no known minimum working bytes")
            }
            GpuAdmitError::PreflightFailed { device, message } => match device {
                Some(device) => write!(f, "preflight on {device} failed: {message}"),
                None => write!(f, "preflight failed: {message}"),
            },
            GpuAdmitError::FloorNeverFits {
                required_floor,
                largest_possible,
            } => write!(
                f,
                "required floor {} can never fit: the largest possible grant on a compatible device is {}",
                fmt_bytes(*required_floor),
                fmt_bytes(*largest_possible)
            ),
            GpuAdmitError::QueueFull { max_pending } => write!(
                f,
                "GPU admission queue is full ({max_pending} queued or pending preflight)"
            ),
            GpuAdmitError::DeadlinePassed => {
                f.write_str("deadline had already passed before queueing for GPU admission")
            }
            GpuAdmitError::DeadlineExceeded { waited } => {
                write!(f, "deadline expired after waiting {waited:?} for GPU admission")
            }
            GpuAdmitError::TimerUnavailable => f.write_str(
                "GPU admission had to wait with a deadline, but the task is not on a tokio \
                 runtime with timers enabled (build the runtime with enable_time or enable_all)",
            ),
            GpuAdmitError::Cancelled => f.write_str("GPU admission was cancelled"),
            GpuAdmitError::Closed => f.write_str("the GPU query service is closed"),
            GpuAdmitError::NoHealthyDevice { devices } => {
                f.write_str("every compatible device is lost, quarantined or closed (")?;
                for (i, device) in devices.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{device}")?;
                }
                f.write_str(")")
            }
            GpuAdmitError::DeviceFault { device, code } => {
                write!(f, "{device} reported device fault {code}")
            }
            GpuAdmitError::EnvelopeStepFailed { step, error } => {
                write!(f, "admission envelope step `{step}` failed: {error}")
            }
            GpuAdmitError::ForeignProof { expected, found } => write!(
                f,
                "capability proof was issued by {found}, not by this service's {expected}"
            ),
            GpuAdmitError::ResourceOnlyHandle => f.write_str(
                "a resource-only admission handle cannot authorize a native plan; \
                 an engine-issued capability proof is required",
            ),
            GpuAdmitError::ProofMismatch {
                admitted,
                presented,
            } => write!(
                f,
                "the handle was admitted for plan {admitted}, not for plan {presented}"
            ),
            GpuAdmitError::ProofBoundElsewhere { device, grant } => write!(
                f,
                "the proof was admitted with grant {grant} on {device}, not with this handle"
            ),
            GpuAdmitError::WorkerGone { device } => write!(
                f,
                "the worker thread of {device} is gone; the backend's ledgers are closed"
            ),
            GpuAdmitError::EnvelopeInvalid { message } => {
                write!(f, "cannot build an admission envelope: {message}")
            }
        }
    }
}

impl Error for GpuAdmitError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            GpuAdmitError::EnvelopeStepFailed { error, .. } => Some(error),
            _ => None,
        }
    }
}
