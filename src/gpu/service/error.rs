//! Why a query service could not be built, or could not reinstate a device.
//! Apart from the service so that its public error vocabulary reads on its
//! own, with nothing of the service's locking around it.

use std::fmt;

use crate::error::ConfigError;
use crate::gpu::backend::{BackendError, BackendOp, DeviceOrdinal};
use crate::gpu::ledger::LedgerState;

/// Why a [`QueryService`](super::QueryService) could not be built.
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

/// Why [`QueryService::reinstate`](super::QueryService::reinstate) left a device out of service.
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
        health: LedgerState,
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
