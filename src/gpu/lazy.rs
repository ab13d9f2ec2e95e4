//! The lazy ticket's first-use trigger: [`LazyAdmission`].
//!
//! # Why a wrapper
//!
//! Planning may hold a ticket without ever touching the device (an explain
//! does exactly that), so admission must happen when execution first needs
//! the device, not when the plan is made. An engine that has to remember to
//! call [`AdmissionTicket::admit`] before its first device call will, on
//! some path, forget it or call it from planning. The wrapper turns the
//! rule into structure: every execution call goes through
//! [`LazyAdmission::handle`], the first one
//! admits, the others share the handle it published, and a wrapper that no
//! execution ever used is dropped without having reserved anything.
//!
//! # States
//!
//! ```text
//! unused ──first use──▶ admitting ──▶ admitted (one handle, shared)
//!                          │    └───▶ failed (the error, to every later use)
//!                          └─ the first use dropped part-way: unused again
//! ```
//!
//! The cell is a `tokio::sync::OnceCell`: concurrent first uses run one
//! admission and the others wait for it; a first use dropped while it waits
//! leaves the cell empty (the admit future's own guard returned what it
//! held), so the next use admits afresh from the same ticket.

use std::fmt;

use tokio::sync::OnceCell;

use super::handle::{AttemptReport, QueryHandle};
use super::outcome::GpuAdmitError;
use super::service::AdmissionTicket;

/// An [`AdmissionTicket`] that admits on its first use. See the
/// [`gpu` module documentation](crate::gpu).
pub struct LazyAdmission {
    ticket: AdmissionTicket,
    admitted: OnceCell<Result<QueryHandle, GpuAdmitError>>,
}

impl fmt::Debug for LazyAdmission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyAdmission")
            .field("ticket", &self.ticket)
            .field("admitted", &self.admitted.get())
            .finish()
    }
}

impl LazyAdmission {
    pub(crate) fn new(ticket: AdmissionTicket) -> Self {
        LazyAdmission {
            ticket,
            admitted: OnceCell::new(),
        }
    }

    /// The published handle, admitting on the first call: queue, grant and
    /// envelope, exactly as [`AdmissionTicket::admit`]. Later calls return
    /// the same handle, or the same error if that admission failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping a first call part-way withdraws its admission as dropping
    /// [`AdmissionTicket::admit`] does and leaves the wrapper unadmitted; the
    /// next call (or a concurrent one that was waiting for it) admits afresh,
    /// at the back of the queue. Dropping any other call changes nothing.
    ///
    /// # Errors
    ///
    /// The [`GpuAdmitError`] the admission failed with (see
    /// [`AdmissionTicket::admit`]); every later call returns a clone of it.
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
    /// let lazy = service.resource_ticket(GIB).lazy();
    /// assert_eq!(service.ledger_snapshots()[0].live_grant_count, 0);
    /// // Admitted at the first step that needs the device, then reused.
    /// let grant = lazy.handle().await?.grant_bytes();
    /// assert_eq!(lazy.handle().await?.grant_bytes(), grant);
    /// assert_eq!(service.ledger_snapshots()[0].live_grant_count, 1);
    /// lazy.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn handle(&self) -> Result<&QueryHandle, GpuAdmitError> {
        let outcome = self
            .admitted
            .get_or_init(|| self.ticket.duplicate().admit())
            .await;
        outcome.as_ref().map_err(Clone::clone)
    }

    /// Whether a first use has admitted (successfully or not).
    #[cfg(test)]
    fn is_admitted(&self) -> bool {
        self.admitted.initialized()
    }

    /// Releases the attempt if execution ever admitted one; `None` when no
    /// execution needed the device (nothing was reserved) or admission
    /// failed.
    ///
    /// # Cancel safety
    ///
    /// As [`QueryHandle::release`]: dropping the future part-way loses only
    /// the report; the teardown still runs and the grant is released after
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
    /// // A query that never needed the device held nothing: no report.
    /// let unused = service.resource_ticket(GIB).lazy();
    /// assert!(unused.release().await.is_none());
    ///
    /// let used = service.resource_ticket(GIB).lazy();
    /// used.handle().await?;
    /// assert!(used.release().await.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn release(self) -> Option<AttemptReport> {
        match self.admitted.into_inner() {
            Some(Ok(handle)) => Some(handle.release().await),
            Some(Err(_)) | None => None,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::gpu::backend::sim::{SimBackend, SimDevice};
    use crate::gpu::{DeviceSet, QueryService, QueueBounds};

    const GIB: u64 = 1 << 30;

    /// One 16 GiB device with one attempt slot.
    fn service() -> (QueryService, Arc<SimBackend>) {
        let devices = DeviceSet::one_16_gib_device(1);
        let bounds = QueueBounds::new(8, Duration::from_secs(60), 1).unwrap();
        let sim = Arc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
        let service = QueryService::builder(sim.clone(), devices, bounds)
            .build()
            .unwrap();
        (service, sim)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lazy_admission_no_execution_used_reserves_nothing() {
        let (service, sim) = service();
        sim.clear_log();
        let before = service.ledger_snapshots();
        let lazy = service.resource_ticket(GIB).lazy();
        assert!(!lazy.is_admitted());
        assert_eq!(lazy.release().await, None);
        assert_eq!(service.ledger_snapshots(), before);
        assert!(sim.ops().is_empty(), "no backend call");
        assert_eq!(service.admission_snapshot().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_execution_step_admits_once_and_later_steps_share_the_handle() {
        let (service, sim) = service();
        let lazy = service.resource_ticket(GIB).lazy();
        let first = lazy.handle().await.map(QueryHandle::grant_id).unwrap();
        assert!(lazy.is_admitted());
        let second = lazy.handle().await.map(QueryHandle::grant_id).unwrap();
        assert_eq!(first, second, "one admission, one grant");
        assert_eq!(service.ledger_snapshots()[0].live_grant_count, 1);
        let report = lazy.release().await.expect("admitted");
        assert!(report.ledger_released);
        assert_eq!(report.grant, first);
        service.settle().await;
        assert_eq!(service.ledger_snapshots()[0].live_grant_count, 0);
        assert_eq!(sim.live_handles(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_use_dropped_while_queued_admits_again_on_the_next() {
        let (service, _sim) = service();
        let blocker = service.resource_ticket(GIB).admit().await.unwrap();
        let lazy = service.resource_ticket(GIB).lazy();
        {
            let mut first = Box::pin(lazy.handle());
            assert!(futures::poll!(&mut first).is_pending(), "queued");
        }
        assert!(!lazy.is_admitted(), "the dropped first use left nothing");
        assert_eq!(service.admission_snapshot().queued, 0);
        blocker.release().await;
        let grant = lazy.handle().await.map(QueryHandle::grant_id).unwrap();
        assert_eq!(service.ledger_snapshots()[0].live_grant_count, 1);
        assert_eq!(lazy.release().await.map(|r| r.grant), Some(grant));
    }
}
