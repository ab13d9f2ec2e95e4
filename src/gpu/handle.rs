//! The published admission result: [`QueryHandle`], and the sealed
//! [`AttemptReport`] its release returns.
//!
//! # Publication and release
//!
//! A handle exists only after the ledger committed its slot and grant *and*
//! all five envelope steps validated; nothing partial is ever visible. The
//! grant itself is not in the handle: at publication it moves into the
//! envelope's release callback (crate-private, beside a seal callback;
//! nothing outside the crate can add or replace either), which runs on the
//! device worker during the teardown, however that teardown came about:
//!
//! * [`QueryHandle::release`] waits until every execution context and
//!   source permit is dropped, tears the envelope down, and returns the
//!   report once the callback has released the grant;
//! * dropping the handle drops the envelope, which queues the same teardown
//!   when its last execution context goes, and the callback releases the
//!   grant then. `Drop` never blocks.
//!
//! Either way the order is the seed's:
//!
//! | step | what                                                   | where                         |
//! |------|--------------------------------------------------------|-------------------------------|
//! | 1    | execution contexts and source permits idle             | `AdmissionEnvelope::teardown` (awaited) or the last holder's drop |
//! | 2    | disposition and health: the root stream synchronized   | the teardown job, on the worker |
//! | 3    | the [`AttemptReport`] sealed on them                   | the seal callback             |
//! | 4    | physical resources destroyed (leaks freed, scope, membership, domain, root stream) | the teardown job |
//! | 5    | the lane closed, then the grant released (and the fault isolated) in one ledger transaction | the teardown job, then the release callback |
//! | 6    | queued work woken, after that transaction committed    | `transact`                    |
//!
//! The sealed disposition and health are what the synchronization showed;
//! [`AttemptReport::teardown`] then records what destruction did, and a
//! fault only destruction revealed is still isolated before the grant
//! returns.

use std::fmt;
use std::time::Duration;

use tokio::sync::oneshot;

use super::backend::DeviceOrdinal;
use super::envelope::{
    AdmissionEnvelope, DeviceFinding, Disposition, EnvelopeError, ExecutionContext, SourcePermit,
    TeardownReport,
};
use super::ledger::{GrantId, MemoryGrant, WaiterId};
use super::outcome::GpuAdmitError;
use super::proof::{CapabilityProof, PlanFingerprint};

/// The sealed record of one attempt, from admission to release.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptReport {
    /// The waiter (its FIFO sequence number).
    pub waiter: WaiterId,
    /// The device the attempt ran on.
    pub device: DeviceOrdinal,
    /// The grant's id on that device's ledger.
    pub grant: GrantId,
    /// The grant's bytes.
    pub grant_bytes: u64,
    /// The floor the grant was sized against.
    pub required_floor: u64,
    /// The admitted plan; `None` for a resource-only attempt.
    pub plan: Option<PlanFingerprint>,
    /// How long admission waited, from submission to grant.
    pub waited: Duration,
    /// How long the attempt held its grant, from the handle's publication
    /// until its report was sealed (its contexts idle, its root stream
    /// synchronized). Wall-clock time (`std::time`): the seal happens on
    /// the device worker thread, where a paused tokio clock does not apply.
    pub held: Duration,
    /// How the attempt ended, sealed before its resources were destroyed:
    /// from the root stream's synchronization and the errors its execution
    /// contexts deferred.
    pub disposition: Disposition,
    /// What that synchronization found on the device.
    pub finding: DeviceFinding,
    /// The teardown's record, attached after the seal: every clean-up call
    /// and its error, the leaks freed. Its own `disposition` and `finding`
    /// also count what destruction revealed.
    pub teardown: TeardownReport,
    /// Whether the grant went back to its ledger (false only on an
    /// accounting bug, which is logged).
    pub ledger_released: bool,
}

/// What an attempt's report is sealed from, fixed at publication.
pub(crate) struct Sealing {
    pub(crate) waiter: WaiterId,
    pub(crate) device: DeviceOrdinal,
    pub(crate) grant: GrantId,
    pub(crate) grant_bytes: u64,
    pub(crate) required_floor: u64,
    pub(crate) plan: Option<PlanFingerprint>,
    pub(crate) waited: Duration,
}

impl Sealing {
    /// The sealed report, from the teardown's facts before destruction.
    /// `teardown` and `ledger_released` are filled in after the destruction
    /// and the ledger's release.
    pub(crate) fn seal(
        &self,
        held: Duration,
        before_destruction: &TeardownReport,
    ) -> AttemptReport {
        AttemptReport {
            waiter: self.waiter,
            device: self.device,
            grant: self.grant,
            grant_bytes: self.grant_bytes,
            required_floor: self.required_floor,
            plan: self.plan,
            waited: self.waited,
            held,
            disposition: before_destruction.disposition,
            finding: before_destruction.finding,
            teardown: before_destruction.clone(),
            ledger_released: false,
        }
    }
}

impl AttemptReport {
    /// A report made at the release when the seal was lost (a bug, logged
    /// by the caller): the waiter and timings are unknown there.
    pub(crate) fn unsealed(grant: &MemoryGrant, teardown: &TeardownReport) -> Self {
        AttemptReport {
            waiter: WaiterId::new(0),
            device: grant.device(),
            grant: grant.id(),
            grant_bytes: grant.bytes(),
            required_floor: grant.required_floor(),
            plan: None,
            waited: Duration::ZERO,
            held: Duration::ZERO,
            disposition: teardown.disposition,
            finding: teardown.finding,
            teardown: teardown.clone(),
            ledger_released: false,
        }
    }
}

/// One admitted attempt: a device, an immutable grant and the envelope
/// built around it. See the [`gpu` module documentation](crate::gpu).
pub struct QueryHandle {
    envelope: AdmissionEnvelope,
    report: oneshot::Receiver<AttemptReport>,
    proof: Option<CapabilityProof>,
    waiter: WaiterId,
    grant: GrantId,
    grant_bytes: u64,
    required_floor: u64,
    waited: Duration,
    published_at: std::time::Instant,
}

impl fmt::Debug for QueryHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryHandle")
            .field("waiter", &self.waiter)
            .field("device", &self.envelope.device())
            .field("grant", &self.grant)
            .field("grant_bytes", &self.grant_bytes)
            .field("resource_only", &self.proof.is_none())
            .finish()
    }
}

impl QueryHandle {
    /// A handle over a validated envelope whose callbacks are armed
    /// already (`release::publish`): `report` answers once the release
    /// callback returned the grant.
    pub(crate) fn new_published(
        envelope: AdmissionEnvelope,
        report: oneshot::Receiver<AttemptReport>,
        proof: Option<CapabilityProof>,
        sealing: &Sealing,
        published_at: std::time::Instant,
    ) -> Self {
        QueryHandle {
            envelope,
            report,
            proof,
            waiter: sealing.waiter,
            grant: sealing.grant,
            grant_bytes: sealing.grant_bytes,
            required_floor: sealing.required_floor,
            waited: sealing.waited,
            published_at,
        }
    }

    /// The selected device.
    pub fn device(&self) -> DeviceOrdinal {
        self.envelope.device()
    }

    /// The grant's id on the device's ledger.
    pub fn grant_id(&self) -> GrantId {
        self.grant
    }

    /// The immutable grant's bytes: the allocation domain's ceiling.
    pub fn grant_bytes(&self) -> u64 {
        self.grant_bytes
    }

    test_hook! {
        /// The floor the grant was sized against.
        fn required_floor(&self) -> u64 {
            self.required_floor
        }
    }

    /// The admitted proof, bound to this device and grant; `None` for a
    /// resource-only handle.
    pub fn proof(&self) -> Option<&CapabilityProof> {
        self.proof.as_ref()
    }

    /// Checks that this handle authorizes the native plan `proof` proves:
    /// the handle must have been admitted for that exact proof (same issuer,
    /// same fingerprint), and a proof already bound to an admission must be
    /// bound to this one (same device, same grant). A resource-only handle
    /// authorizes nothing.
    ///
    /// # Errors
    ///
    /// In this order: [`GpuAdmitError::ResourceOnlyHandle`] for a
    /// resource-only handle; [`GpuAdmitError::ForeignProof`] when `proof`
    /// comes from another issuer than the admitted proof;
    /// [`GpuAdmitError::ProofBoundElsewhere`] when `proof` is bound to
    /// another device or grant; [`GpuAdmitError::ProofMismatch`] when its
    /// plan fingerprint differs from the admitted one.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # use admission::gpu::{PhaseRequirement, PlanDescription, PlanFingerprint};
    /// # let (service, issuer) = QueryService::builder(backend, devices, bounds).build_with_issuer()?;
    /// let plan = PlanDescription::new(PlanFingerprint(1))
    ///     .phase(PhaseRequirement::new("build", 2 * GIB, "join"));
    /// let proof = issuer.lower(&plan)?;
    /// let handle = service.ticket(&proof)?.admit().await?;
    /// handle.authorize(&proof)?;
    /// // A proof of another plan does not authorize this admission.
    /// let other = issuer.lower(&PlanDescription::new(PlanFingerprint(2))
    ///     .phase(PhaseRequirement::new("build", 2 * GIB, "join")))?;
    /// assert!(handle.authorize(&other).is_err());
    /// handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn authorize(&self, proof: &CapabilityProof) -> Result<(), GpuAdmitError> {
        let Some(admitted) = &self.proof else {
            return Err(GpuAdmitError::ResourceOnlyHandle);
        };
        if admitted.issuer_id() != proof.issuer_id() {
            return Err(GpuAdmitError::ForeignProof {
                expected: admitted.issuer_id(),
                found: proof.issuer_id(),
            });
        }
        if let Some(binding) = proof.binding() {
            if (binding.device, binding.grant) != (self.device(), self.grant) {
                return Err(GpuAdmitError::ProofBoundElsewhere {
                    device: binding.device,
                    grant: binding.grant,
                });
            }
        }
        if admitted.fingerprint() != proof.fingerprint() {
            return Err(GpuAdmitError::ProofMismatch {
                admitted: admitted.fingerprint(),
                presented: proof.fingerprint(),
            });
        }
        Ok(())
    }

    /// The envelope: lane, root stream, allocation domain, worker scope.
    pub(crate) fn envelope(&self) -> &AdmissionEnvelope {
        &self.envelope
    }

    /// A stream forked from the root for one execution, within the
    /// profile's stream bound; allocations through it are charged to the
    /// grant.
    ///
    /// # Errors
    ///
    /// [`EnvelopeError::StreamBound`] when the live contexts (or the streams
    /// of dropped ones the device's worker has not destroyed yet) already
    /// fill `streams_per_attempt`; [`EnvelopeError::Backend`] when the
    /// backend fails to fork the stream.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// let handle = service.resource_ticket(4 * GIB).admit().await?;
    /// let ctx = handle.execution_context()?;
    /// let ptr = ctx.alloc(GIB)?;
    /// assert_eq!(ctx.domain().used_bytes(), GIB);
    /// ctx.free(ptr)?;
    /// // The teardown waits for every context to be dropped.
    /// drop(ctx);
    /// handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn execution_context(&self) -> Result<ExecutionContext, EnvelopeError> {
        self.envelope.execution_context()
    }

    /// A permit for one concurrent source read, within the profile's
    /// source-work allowance.
    ///
    /// # Errors
    ///
    /// [`EnvelopeError::SourceWorkExhausted`] when `source_work_allowance`
    /// permits are live already.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// let handle = service.resource_ticket(GIB).admit().await?;
    /// let permit = handle.try_source_permit()?;
    /// // ... read the attempt's input while holding the permit ...
    /// drop(permit);
    /// handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_source_permit(&self) -> Result<SourcePermit, EnvelopeError> {
        self.envelope.try_source_permit()
    }

    /// Releases the attempt: waits until every execution context and source
    /// permit is dropped, tears the envelope down, seals the report, isolates
    /// a device fault, and only then releases the grant and wakes queued
    /// work.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses only the [`AttemptReport`]:
    /// the teardown still runs on the device's worker once every execution
    /// context and source permit is dropped, and the grant is released after
    /// it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use admission::gpu::backend::sim::{SimBackend, SimDevice};
    /// # use admission::gpu::backend::DeviceOrdinal;
    /// # use admission::gpu::{DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds};
    /// # const GIB: u64 = 1 << 30;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let gpu0 = DeviceOrdinal(0);
    /// # let profile = DeviceProfile::builder(gpu0).managed_capacity(80 * GIB).max_active_attempts(4)
    /// #     .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// let handle = service.resource_ticket(GIB).admit().await?;
    /// let grant = handle.grant_bytes();
    /// let report = handle.release().await;
    /// assert_eq!(report.grant_bytes, grant);
    /// assert!(report.ledger_released);
    /// assert!(report.teardown.errors.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn release(self) -> AttemptReport {
        let QueryHandle {
            envelope,
            report,
            proof,
            waiter,
            grant,
            grant_bytes,
            required_floor,
            waited,
            published_at,
        } = self;
        let teardown = envelope.teardown().await;
        match report.await {
            Ok(report) => report,
            // The callback was dropped without running: the teardown ran
            // but the grant's fate is unknown here (logged where it was lost).
            Err(_) => AttemptReport {
                waiter,
                device: teardown.device,
                grant,
                grant_bytes,
                required_floor,
                plan: proof.as_ref().map(CapabilityProof::fingerprint),
                waited,
                held: published_at.elapsed(),
                disposition: teardown.disposition,
                finding: teardown.finding,
                teardown,
                ledger_released: false,
            },
        }
    }
}
