//! What building and tearing an envelope down reports: the steps, their
//! outcomes, the errors and the teardown report with the device's health.

use std::fmt;

use crate::gpu::backend::{BackendError, BackendOp, DeviceOrdinal, FaultIsolation};
use crate::gpu::domain::{AllocationDomain, LeakReport};
use crate::gpu::worker::WorkerGone;

/// One of the five build steps, in build order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BuildStep {
    /// 1: the attempt lane.
    AttemptLane,
    /// 2: the root stream.
    RootStream,
    /// 3: the allocation domain.
    AllocationDomain,
    /// 4: the root stream's membership in the domain.
    RootMembership,
    /// 5: the device worker scope.
    WorkerScope,
}

impl BuildStep {
    test_hook! {
        /// Every step, in build order.
        const ALL: [BuildStep; 5] = [
            BuildStep::AttemptLane,
            BuildStep::RootStream,
            BuildStep::AllocationDomain,
            BuildStep::RootMembership,
            BuildStep::WorkerScope,
        ];
    }

    test_hook! {
        /// The backend operation that performs the step.
        fn op(self) -> BackendOp {
            match self {
                BuildStep::AttemptLane => BackendOp::OpenLane,
                BuildStep::RootStream => BackendOp::CreateRootStream,
                BuildStep::AllocationDomain => BackendOp::OpenDomain,
                BuildStep::RootMembership => BackendOp::JoinDomain,
                BuildStep::WorkerScope => BackendOp::OpenWorkerScope,
            }
        }
    }
}

/// One clean-up call and its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOutcome {
    /// The operation.
    pub op: BackendOp,
    /// Its error, if it failed.
    pub error: Option<BackendError>,
}

/// Every clean-up call a rollback made, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RollbackReport {
    /// The calls, in the order they ran.
    pub steps: Vec<StepOutcome>,
}

impl RollbackReport {
    /// The errors the undo calls reported.
    pub(crate) fn errors(&self) -> impl Iterator<Item = &BackendError> {
        self.steps.iter().filter_map(|s| s.error.as_ref())
    }
}

/// The seed's rule for acting on device faults: only a fault that a
/// **stream synchronization** reported proves where it lies, so only such a
/// fault isolated to a device quarantines that device. Any other fault (a
/// sticky code on a create, a close, a destroy) does not establish its
/// reach, so its isolation is [`FaultIsolation::Unknown`] and every ledger
/// closes. A synchronization fault wins over the others: once a context is
/// poisoned, every later call repeats its code.
fn proven_isolation<'a>(
    errors: impl IntoIterator<Item = &'a BackendError>,
) -> Option<FaultIsolation> {
    let mut seen = None;
    for error in errors {
        if let BackendError::Fault { op, isolation, .. } = error {
            if *op == BackendOp::Synchronize {
                return Some(*isolation);
            }
            seen = Some(FaultIsolation::Unknown);
        }
    }
    seen
}

/// Why an envelope could not be built. Whatever was built is rolled back
/// before this is returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BuildError {
    /// A bound leaves no room for the envelope's own resources (it takes
    /// one lane, one stream and one worker scope). Nothing was called.
    InvalidBounds {
        /// The bound's name.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// The worker handed in serves another device. Nothing was called.
    WrongWorker {
        /// The worker's device.
        worker: DeviceOrdinal,
        /// The envelope's device.
        device: DeviceOrdinal,
    },
    /// A step failed; the steps before it were rolled back.
    Step {
        /// The step that failed.
        step: BuildStep,
        /// Its error.
        error: BackendError,
        /// The rollback.
        rollback: RollbackReport,
    },
    /// The device worker is gone, so the build's outcome (and any rollback)
    /// is unknown.
    WorkerGone(WorkerGone),
    /// The build job panicked on the device worker (caught there; the
    /// thread goes on). What it had built is unknown, so the device is to
    /// be quarantined; other devices are unaffected.
    Interrupted {
        /// The envelope's device.
        device: DeviceOrdinal,
    },
}

impl BuildError {
    /// What the device faults seen while building or rolling back prove
    /// ([`proven_isolation`]: a device only from a stream synchronization,
    /// otherwise [`FaultIsolation::Unknown`]), or `Unknown` when the
    /// clean-up was abandoned: the caller quarantines the device or closes
    /// the backend's ledgers.
    pub(crate) fn fault(&self) -> Option<FaultIsolation> {
        match self {
            BuildError::Step {
                error, rollback, ..
            } => proven_isolation(rollback.errors().chain(std::iter::once(error))),
            BuildError::WorkerGone(_) => Some(FaultIsolation::Unknown),
            BuildError::Interrupted { device } => Some(FaultIsolation::Device(*device)),
            BuildError::InvalidBounds { .. } | BuildError::WrongWorker { .. } => None,
        }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::InvalidBounds { field, value } => {
                write!(
                    f,
                    "{field} {value} leaves no room for the envelope (it needs at least 1)"
                )
            }
            BuildError::WrongWorker { worker, device } => {
                write!(
                    f,
                    "the worker of {worker} cannot build an envelope on {device}"
                )
            }
            BuildError::Step {
                step,
                error,
                rollback,
            } => write!(
                f,
                "envelope step {step:?} failed: {error} ({} rollback errors)",
                rollback.errors().count()
            ),
            BuildError::WorkerGone(gone) => write!(f, "{gone}"),
            BuildError::Interrupted { device } => write!(
                f,
                "the envelope build on {device} panicked part-way; what it built is unknown"
            ),
        }
    }
}

impl std::error::Error for BuildError {}

/// Why an execution could not obtain a context or permit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvelopeError {
    /// Every stream the bound allows is in use.
    StreamBound {
        /// The bound (root stream included).
        max_streams: u32,
    },
    /// Every source read the allowance allows is running.
    SourceWorkExhausted {
        /// The allowance.
        allowance: u32,
    },
    /// The backend failed to fork a stream.
    Backend(BackendError),
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvelopeError::StreamBound { max_streams } => write!(
                f,
                "the attempt holds max_streams {max_streams} streams (root included)"
            ),
            EnvelopeError::SourceWorkExhausted { allowance } => write!(
                f,
                "the attempt runs source_work_allowance {allowance} source reads"
            ),
            EnvelopeError::Backend(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

/// How a clean-up ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Every step succeeded.
    Clean,
    /// Some steps failed, without a device fault.
    Errors,
    /// A device fault was seen: quarantine per the isolation.
    DeviceFault,
    /// The clean-up could not run (the worker is gone): the device's state
    /// is unknown.
    Abandoned,
    /// A build was cancelled and rolled back.
    Cancelled,
}

/// What a clean-up found on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceFinding {
    /// No fault was seen.
    Clean,
    /// A device fault was seen.
    Faulted {
        /// The operation that surfaced it.
        op: BackendOp,
        /// The driver's code.
        code: u32,
        /// How far it reaches.
        isolation: FaultIsolation,
    },
    /// The clean-up was abandoned; nothing is known.
    Unknown,
    /// The clean-up panicked part-way on the device worker (caught there):
    /// what it released on this device is unknown, so the device is
    /// quarantined.
    Interrupted,
}

/// What a teardown (or an unawaited rollback) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeardownReport {
    /// The envelope's device.
    pub device: DeviceOrdinal,
    /// How the clean-up ended.
    pub disposition: Disposition,
    /// What the clean-up found on the device.
    pub finding: DeviceFinding,
    /// Whether nobody awaited it (a dropped envelope or cancelled build).
    pub implicit: bool,
    /// The grant's bytes.
    pub grant_bytes: u64,
    /// The domain's peak charged bytes.
    pub peak_bytes: u64,
    /// The domain's total charged bytes.
    pub total_bytes: u64,
    /// Allocations still live at teardown, freed by it.
    pub leaked: LeakReport,
    /// Every clean-up call, in order.
    pub steps: Vec<StepOutcome>,
    /// Every error seen: clean-up calls, leak frees, and errors deferred
    /// from dropped execution contexts.
    pub errors: Vec<BackendError>,
}

impl TeardownReport {
    /// The isolation the service acts on: a synchronization fault's own,
    /// any other fault's [`FaultIsolation::Unknown`] (only a synchronization
    /// proves where a fault lies), or `Unknown` when the clean-up was
    /// abandoned. The service's rule, not the report's data: a user reads
    /// the [`finding`](Self::finding) and the ledger states it led to.
    pub(crate) fn fault_isolation(&self) -> Option<FaultIsolation> {
        match self.finding {
            DeviceFinding::Clean => None,
            // Only a synchronization proves where a fault lies; see
            // `proven_isolation`.
            DeviceFinding::Faulted {
                op: BackendOp::Synchronize,
                isolation,
                ..
            } => Some(isolation),
            DeviceFinding::Faulted { .. } => Some(FaultIsolation::Unknown),
            DeviceFinding::Unknown => Some(FaultIsolation::Unknown),
            DeviceFinding::Interrupted => Some(FaultIsolation::Device(self.device)),
        }
    }

    pub(super) fn finish(
        device: DeviceOrdinal,
        grant_bytes: u64,
        implicit: bool,
        steps: Vec<StepOutcome>,
        mut errors: Vec<BackendError>,
        domain: Option<(&AllocationDomain, LeakReport)>,
    ) -> Self {
        let (peak_bytes, total_bytes, leaked) = match domain {
            Some((d, leaked)) => (d.peak_bytes(), d.total_bytes(), leaked),
            None => (0, 0, LeakReport::default()),
        };
        errors.extend(steps.iter().filter_map(|s| s.error.clone()));
        errors.extend(leaked.errors.iter().cloned());
        // A fault proven by a stream synchronization is the one to act on
        // (it is isolated to the device); later calls only repeat it.
        let mut sync_first = errors
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    BackendError::Fault {
                        op: BackendOp::Synchronize,
                        ..
                    }
                )
            })
            .chain(errors.iter());
        let finding = sync_first
            .find_map(|e| match e {
                BackendError::Fault {
                    op,
                    code,
                    isolation,
                } => Some(DeviceFinding::Faulted {
                    op: *op,
                    code: *code,
                    isolation: *isolation,
                }),
                _ => None,
            })
            .unwrap_or(DeviceFinding::Clean);
        let disposition = match (finding, errors.is_empty()) {
            (DeviceFinding::Faulted { .. }, _) => Disposition::DeviceFault,
            (_, false) => Disposition::Errors,
            _ => Disposition::Clean,
        };
        Self {
            device,
            disposition,
            finding,
            implicit,
            grant_bytes,
            peak_bytes,
            total_bytes,
            leaked,
            steps,
            errors,
        }
    }

    pub(super) fn abandoned(device: DeviceOrdinal, grant_bytes: u64, implicit: bool) -> Self {
        Self::unfinished(device, grant_bytes, implicit, DeviceFinding::Unknown)
    }

    pub(super) fn interrupted(device: DeviceOrdinal, grant_bytes: u64, implicit: bool) -> Self {
        Self::unfinished(device, grant_bytes, implicit, DeviceFinding::Interrupted)
    }

    fn unfinished(
        device: DeviceOrdinal,
        grant_bytes: u64,
        implicit: bool,
        finding: DeviceFinding,
    ) -> Self {
        Self {
            device,
            disposition: Disposition::Abandoned,
            finding,
            implicit,
            grant_bytes,
            peak_bytes: 0,
            total_bytes: 0,
            leaked: LeakReport::default(),
            steps: Vec::new(),
            errors: Vec::new(),
        }
    }
}
