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
//! The module governs **device memory only**; host memory is the
//! application's own pool's concern.
//!
//! # Profiles and the ledger
//!
//! Every device has one immutable [`DeviceProfile`], declared by the
//! operator with a matching [`MemoryOwnership`]: the managed capacity the
//! ledger accounts for, a backend reserve kept out of it, a cache cap, the
//! attempt floor (the guaranteed minimum grant, by default
//! `capacity / max(8, max_active_attempts)`), the active-attempt limit and
//! the physical bounds of an attempt (streams, workers, lanes, concurrent
//! source reads). The device's ledger is the only capacity authority, in
//! checked integer arithmetic. A new attempt needs a free slot
//! (`active + 1 <= limit`, a slot protected for someone else counting as
//! taken) and
//!
//! ```text
//! max_new = capacity − live grants − evictable cache − pinned cache
//!         − protected bytes − floor × unprotected slots left open after it
//! required floor <= grant <= max_new
//! ```
//!
//! Keeping one floor per open slot stops one large grant from starving the
//! device's remaining concurrency. A working-set hint picks the grant inside
//! the interval; without one the grant is `max_new`. Free-memory samples
//! from the driver are telemetry and never admit anything. A
//! memory grant never changes after commit and is the ceiling of the
//! attempt's allocation domain, enforced in software by a compare-and-swap
//! before any driver call ([`AllocationDomain`]).
//!
//! # The queue
//!
//! One bounded queue serves every device. A submission first reserves a
//! pending slot and a FIFO sequence, then is resolved outside the lock:
//! which installed devices have every required capability, whether its
//! floor can ever fit, and the engine's optional per-device preflight. What
//! can never run is refused at once with a typed error (capability,
//! configuration), never queued; a pending preflight is an ordering barrier
//! that younger work cannot pass. The scheduler admits the oldest runnable
//! waiter, ranking its compatible devices by spare bytes after admission,
//! then load, then stream availability, then ordinal, and a waiter blocked
//! on its own devices does not idle another device. A waiter whose overtake
//! budget is spent (budget B allows B overtakes, 0 none) protects one
//! future slot and released bytes up to its floor on one compatible ledger; its grant consumes the protection, and
//! the protection moves if that device is quarantined or closed. Cancel,
//! deadline, close and the loss of every compatible device remove a waiter
//! with a structured [`GpuAdmitError`], which [`QueryAdmissionOutcome`]
//! classifies for the application (retry, queue, HTTP 429...).
//!
//! # The envelope transaction and release
//!
//! The ledger commits the slot and grant under the lock; the
//! admission envelope is then built outside
//! it, on the device's worker thread: attempt lane, root stream, allocation
//! domain, root-stream membership in the domain, worker scope. The
//! [`QueryHandle`] exists only once all five validated; any failure or
//! cancellation undoes the steps in exact reverse order (the stream's
//! clean-up awaited first) and returns the grant. Release waits for the
//! handle's execution contexts to go idle, synchronizes the root stream,
//! seals the [`AttemptReport`] on what that showed, destroys the resources
//! (the lane last), and only then returns the grant to the ledger and wakes
//! queued work. A stream-synchronization fault proven to be
//! device-local quarantines that device; one whose reach is unknown closes
//! every ledger. Grants in flight stay valid and drain; nothing new is
//! issued there.
//!
//! # Failure model
//!
//! Whatever callers pass and whatever callbacks do, the service neither
//! panics, nor wedges, nor keeps state that outlives the work it describes.
//! A caller's value that cannot be honoured is a typed error at once: a
//! byte count past any limit (a cache charge of `u64::MAX` is
//! [`LedgerError::CacheCapExceeded`]), a floor no device can ever hold or a
//! capability none has (refused before queueing), a deadline already
//! passed, a wait that needs a timer on a runtime without one
//! ([`GpuAdmitError::TimerUnavailable`]; a queue whose `max_wait` is
//! `Duration::MAX` has no deadline and needs none). Per-waiter state (the
//! pending and queued sets, parked outcomes, wakers) lives only as long as
//! its admit future.
//!
//! Code the application hands the service runs behind a panic boundary
//! per component, reported in
//! [`AdmissionSnapshot::health`]:
//!
//! * **`gpu_observer`** fails open: a panic drops that one record. Records
//!   are delivered after the transaction they describe, outside the lock,
//!   so no reservation, grant or wake-up depends on the observer returning.
//!   It is called again for the next record, however often it failed.
//! * **`gpu_preflight`** fails closed per submission: a panic in the call,
//!   in a poll of its future or in its drop is that candidate's failed
//!   preflight ([`GpuAdmitError::PreflightFailed`]), and the reservation is
//!   withdrawn like any rejection, so no ordering barrier is left behind.
//!   While it keeps panicking every submission is rejected: the preflight is
//!   the engine's own check, and skipping it could admit work it would
//!   refuse.
//! * **`gpu_backend`** fails the operation, not the device: a panic in any
//!   backend operation is
//!   [`BackendError::Panicked`](backend::BackendError::Panicked), a failed
//!   operation of that attempt. A build step that panics is rolled back and
//!   the attempt fails with
//!   [`GpuAdmitError::EnvelopeStepFailed`]; a teardown step that panics is
//!   recorded in the report and the grant is still returned. The device
//!   stays in service (a host-side panic is no evidence about device
//!   memory; only a [`BackendError::Fault`](backend::BackendError::Fault)
//!   reported by a stream synchronization quarantines, and any other fault
//!   closes every ledger: the [`TeardownReport`]'s
//!   [`finding`](TeardownReport::finding) names the fault), so a backend
//!   that always panics fails each attempt fast
//!   with a typed error, and the health shows it failing; an operator can
//!   [`quarantine`](QueryService::quarantine) the device.
//! * **`gpu_device_worker`** is a backstop around every job of a device's
//!   worker thread: a panic there loses only that job, its waiter gets a
//!   typed failure, and the thread goes on
//!   with the next job. A dead worker would read as a fault of unknown reach
//!   and close every ledger; a build or teardown job that unwinds part-way
//!   quarantines only its own device, since what it created or released
//!   there is unknown.
//!
//! A build with `panic = "abort"` has nothing to catch: a panic there ends
//! the process, as anywhere else.
//!
//! # Backends
//!
//! A [`backend::GpuBackend`] is the only code that touches a device: the
//! simulated [`backend::sim::SimBackend`] (deterministic, for machines
//! without a GPU; its fault injection and operation log, which the tests
//! use, come with the `test-util` feature) and, with the `cuda`
//! feature, a `cudarc` backend that loads the driver at run time, answers
//! `NoDriver` instead of panicking where there is none, and runs blocking
//! calls on the device's worker thread, never on a tokio worker.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use admission::gpu::backend::sim::{SimBackend, SimDevice};
//! use admission::gpu::backend::DeviceOrdinal;
//! use admission::gpu::{
//!     Capability, CapabilitySet, DeviceProfile, DeviceSet, MemoryOwnership, PhaseRequirement,
//!     PlanDescription, PlanFingerprint, QueryService, QueueBounds,
//! };
//!
//! const GIB: u64 = 1 << 30;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu0 = DeviceOrdinal(0);
//! let capabilities: CapabilitySet = [Capability::new("hash_join")].into_iter().collect();
//! let profile = DeviceProfile::builder(gpu0)
//!     .managed_capacity(80 * GIB)
//!     .max_active_attempts(4)
//!     .capabilities(capabilities)
//!     .build()?;
//! let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
//! let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
//! let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
//! // The issuer is handed out once, to the engine's lowering code: holding
//! // the service is not enough to mint a proof.
//! let (service, issuer) = QueryService::builder(backend, devices, bounds).build_with_issuer()?;
//!
//! // The engine lowers a plan into a proof; planning reserves nothing.
//! let plan = PlanDescription::new(PlanFingerprint(42))
//!     .require(Capability::new("hash_join"))
//!     .phase(PhaseRequirement::new("build", 12 * GIB, "join"));
//! let proof = issuer.lower(&plan)?;
//! let ticket = service.ticket(&proof)?;
//!
//! // Execution needs the device: admit, run, release.
//! let handle = ticket.with_working_set_hint(16 * GIB).admit().await?;
//! handle.authorize(&proof)?;
//! // The handle's own copy of the proof is bound to its device and grant.
//! let binding = handle.proof().and_then(|p| p.binding()).expect("bound");
//! assert_eq!((binding.device, binding.grant), (gpu0, handle.grant_id()));
//! assert_eq!(handle.grant_bytes(), 16 * GIB); // the hint, inside [12 GiB, max_new]
//! let report = handle.release().await;
//! assert_eq!(report.grant_bytes, 16 * GIB);
//! assert_eq!(service.ledger_snapshots()[0].live_grants_bytes, 0);
//! # Ok(())
//! # }
//! ```
//!
//! Inside, each device's ledger is plain data; a synchronous admission core
//! owns every ledger and the queue, and the [`QueryService`] keeps that core
//! behind one mutex that is never held across an await or a backend call.
//! Physical work (streams, domains, teardown) runs on one worker thread per
//! device through the [`backend`] trait. `docs/ARCHITECTURE.md` in the
//! repository maps the files; each opens with its part of the design.

// Profiles, the ledger and placement: pure integer accounting, no CUDA.
// Every module but `backend` is private: what a user names is re-exported
// below, at one path each.
#[cfg(feature = "config")]
mod config;
mod ledger;
mod outcome;
mod placement;
mod profile;
mod proof;

// The physical side: backends, allocation domains, device workers and the
// transactional envelope.
pub mod backend;
mod domain;
mod envelope;
mod guard;
mod worker;

// The query service: the one queue and its scheduler (a plain synchronous
// core), the async glue around it, handles and observation records.
mod handle;
mod lazy;
mod observe;
mod release;
mod scheduler;
mod service;

#[cfg(loom)]
#[doc(hidden)]
pub mod loom_models;

/// The synchronous admission core for `benches/gpu_admit.rs` only (feature
/// `bench-internals`, which exists for that benchmark): it commits and
/// releases ledger bytes without the service, which the crate's API
/// otherwise never allows. Not part of the API; no stability promise.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench_internals {
    use super::backend::DeviceOrdinal;
    use super::ledger::{GrantRequest, MemoryGrant, WaiterId};
    use super::observe::GpuEvent;
    use super::outcome::GpuAdmitError;
    use super::profile::{DeviceSet, QueueBounds};
    use super::scheduler::AdmissionCore;

    /// The core as the service holds it under its lock, with no worker
    /// depth (no backend runs).
    #[derive(Debug)]
    pub struct CoreBench {
        core: AdmissionCore,
    }

    /// A grant the core issued, to hand back with [`CoreBench::release`].
    #[derive(Debug)]
    pub struct BenchGrant(MemoryGrant);

    impl CoreBench {
        /// One empty ledger per device and an empty queue.
        pub fn new(devices: &DeviceSet, bounds: QueueBounds) -> Self {
            CoreBench {
                core: AdmissionCore::new(devices, bounds),
            }
        }

        /// Queues a resource-only request of `floor_bytes` (and an
        /// optional working-set hint) for `candidates`, as a submission
        /// does once its proof is checked.
        ///
        /// # Errors
        ///
        /// [`GpuAdmitError::Closed`] or [`GpuAdmitError::QueueFull`] when no
        /// pending slot can be reserved; [`GpuAdmitError::NoHealthyDevice`]
        /// when none of `candidates` is healthy.
        pub fn submit(
            &mut self,
            floor_bytes: u64,
            working_set_hint: Option<u64>,
            candidates: &[DeviceOrdinal],
        ) -> Result<WaiterId, GpuAdmitError> {
            let mut request = GrantRequest::resource_only(floor_bytes);
            if let Some(hint) = working_set_hint {
                request = request.with_working_set_hint(hint);
            }
            let waiter = self.core.reserve(tokio::time::Instant::now())?;
            self.core.resolve(waiter, request, candidates.to_vec())?;
            Ok(waiter)
        }

        /// One scheduling pass; the first waiter it admitted, if any.
        pub fn schedule(&mut self) -> Option<WaiterId> {
            let events = self.core.schedule(&|_| 0);
            events.iter().find_map(|event| match event {
                GpuEvent::Admitted { waiter, .. } => Some(*waiter),
                _ => None,
            })
        }

        /// The grant or error a pass parked for `waiter`.
        pub fn take_outcome(
            &mut self,
            waiter: WaiterId,
        ) -> Option<Result<BenchGrant, GpuAdmitError>> {
            self.core
                .take_outcome(waiter)
                .map(|outcome| outcome.map(BenchGrant))
        }

        /// Returns a grant to its ledger; false if the core did not issue
        /// it.
        pub fn release(&mut self, grant: BenchGrant) -> bool {
            self.core.release(grant.0).is_ok()
        }

        /// Waiters queued or reserved.
        pub fn depth(&self) -> usize {
            self.core.depth()
        }
    }
}

#[cfg(feature = "config")]
pub use config::GpuConfig;
pub use domain::{AllocationDomain, LeakReport, SubReservation};
pub use envelope::{
    BuildStep, DeviceFinding, Disposition, EnvelopeError, ExecutionContext, SourcePermit,
    StepOutcome, TeardownReport,
};
pub use handle::{AttemptReport, QueryHandle};
pub use lazy::LazyAdmission;
pub use ledger::{
    GrantId, LaterReason, LedgerError, LedgerSnapshot, LedgerState, NeverReason,
    ProtectionSnapshot, WaiterId,
};
#[cfg(feature = "config")]
pub use observe::jsonl_observer;
pub use observe::{Observation, ObservationKind};
pub use outcome::{GpuAdmitError, QueryAdmissionOutcome};
pub use profile::{DeviceProfile, DeviceProfileBuilder, DeviceSet, MemoryOwnership, QueueBounds};
pub use proof::{
    AllocationOwner, Capability, CapabilityProof, CapabilitySet, IssuerId, LoweringError,
    PhaseRequirement, PlanDescription, PlanFingerprint, ProofBinding, ProofIssuer,
};
pub use scheduler::{AdmissionSnapshot, CacheChange, DeviceSummary, WaiterSnapshot};
pub use service::{
    AdmissionTicket, EvictionRequest, PreflightFuture, PreflightRequest, QueryService,
    QueryServiceBuilder, ReinstateError, ServiceError,
};
