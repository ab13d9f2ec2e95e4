//! The admission ticket: a proof and the service, nothing reserved. Apart
//! from the service because planning holds tickets it never admits, so a
//! ticket stays plain data; the admit future that spends one is in
//! `release.rs`.

use std::future::Future;

use tokio::time::Instant;

use super::Inner;
use crate::gpu::handle::QueryHandle;
use crate::gpu::ledger::GrantRequest;
use crate::gpu::outcome::GpuAdmitError;
use crate::gpu::proof::CapabilityProof;
use crate::sync::StdArc;

/// A lazy admission ticket: a proof (or a resource-only minimum) and the
/// service, nothing reserved. [`admit`](Self::admit) submits it.
#[derive(Debug)]
pub struct AdmissionTicket {
    pub(crate) inner: StdArc<Inner>,
    pub(crate) proof: Option<CapabilityProof>,
    pub(crate) request: GrantRequest,
    pub(crate) deadline: Option<Instant>,
}

impl AdmissionTicket {
    /// This ticket as a first-use trigger: the first execution step that
    /// needs the device admits it ([`LazyAdmission`](crate::gpu::LazyAdmission)),
    /// and if none does, nothing is ever reserved.
    pub fn lazy(self) -> crate::gpu::lazy::LazyAdmission {
        crate::gpu::lazy::LazyAdmission::new(self)
    }

    /// Another ticket for the same request (a ticket reserves nothing, so a
    /// copy costs nothing either).
    pub(crate) fn duplicate(&self) -> Self {
        AdmissionTicket {
            inner: self.inner.clone(),
            proof: self.proof.clone(),
            request: self.request.clone(),
            deadline: self.deadline,
        }
    }

    /// A deadline of the request's own; the effective deadline is the
    /// earlier of this and the queue's `max_wait` from submission.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// A descriptive working-set estimate: the grant is this value clamped
    /// between the required floor and what the device has room for. Never a
    /// reason to admit.
    pub fn with_working_set_hint(mut self, bytes: u64) -> Self {
        self.request = self.request.with_working_set_hint(bytes);
        self
    }

    /// Submits the ticket and resolves to a published [`QueryHandle`] once
    /// a device is granted and its envelope validated.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future at any point loses no slot, byte or device
    /// resource, only its place in the queue: a pending or queued request is
    /// withdrawn, a grant it had not yet taken goes back to its ledger at
    /// once, and an envelope being built is rolled back on the device's
    /// worker before its grant returns.
    ///
    /// # Errors
    ///
    /// The future resolves to a [`GpuAdmitError`]: `DeadlinePassed` for a
    /// deadline already past; `Closed` or `QueueFull` at submission (and
    /// `Closed` while waiting); `NoCapableDevice` or `FloorNeverFits` when
    /// no device could ever run it; `PreflightFailed` when a candidate's
    /// preflight fails or panics; `NoHealthyDevice` when no candidate is
    /// healthy any more; `DeadlineExceeded` when the deadline (its own or
    /// the queue's `max_wait`) passes first; `TimerUnavailable` when it must
    /// wait without a tokio timer; `EnvelopeStepFailed`, `DeviceFault`,
    /// `WorkerGone` or `EnvelopeInvalid` when the envelope build fails, after
    /// it was rolled back and the grant returned.
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
    /// # .cache_cap(16 * GIB).streams_per_attempt(4).build()?;
    /// # let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)])?;
    /// # let bounds = QueueBounds::new(64, Duration::from_secs(30), 4)?;
    /// # let backend = Arc::new(SimBackend::new([SimDevice::new(0, 96 * GIB)]));
    /// # let service = QueryService::builder(backend, devices, bounds).build()?;
    /// let handle = service
    ///     .resource_ticket(GIB)
    ///     // More than the floor, when the device has room for it.
    ///     .with_working_set_hint(24 * GIB)
    ///     .admit()
    ///     .await?;
    /// assert_eq!(handle.grant_bytes(), 24 * GIB);
    /// handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit(
        self,
    ) -> impl Future<Output = Result<QueryHandle, GpuAdmitError>> + Send + 'static {
        crate::gpu::release::admit(self)
    }
}
