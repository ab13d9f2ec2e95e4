//! The execution side of an admitted attempt: a context per execution (a
//! forked stream and the allocation domain) and the permits for source
//! reads, both bounded by the attempt's profile.

use super::Shared;
use crate::gpu::backend::{BackendError, DevicePtr, StreamId};
use crate::gpu::domain::{AllocationDomain, SubReservation};
use crate::sync::{Ordering, StdArc};

/// One execution's stream (forked from the envelope's root) and its access
/// to the allocation domain. Dropping it destroys the stream on the worker
/// and lets a waiting teardown proceed.
#[derive(Debug)]
pub struct ExecutionContext {
    pub(super) shared: StdArc<Shared>,
    pub(super) stream: StreamId,
}

impl ExecutionContext {
    /// The context's stream.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The attempt's allocation domain.
    pub fn domain(&self) -> &AllocationDomain {
        &self.shared.domain
    }

    /// Allocates `bytes` on this context's stream, within the grant.
    ///
    /// # Errors
    ///
    /// [`BackendError::GrantExceeded`] when the aligned size does not fit
    /// under the grant's remaining bytes (the backend is not called);
    /// otherwise the backend's error ([`BackendError::Driver`] for out of
    /// memory, [`BackendError::Fault`], [`BackendError::Panicked`], ...),
    /// with the charge returned to the grant.
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
    /// # let handle = service.resource_ticket(4 * GIB).admit().await?;
    /// # let ctx = handle.execution_context()?;
    /// use admission::gpu::backend::BackendError;
    ///
    /// let ptr = ctx.alloc(GIB)?;
    /// assert_eq!(ctx.domain().used_bytes(), GIB);
    /// // The grant is a ceiling: past it, nothing reaches the driver.
    /// let too_much = handle.grant_bytes();
    /// assert!(matches!(ctx.alloc(too_much), Err(BackendError::GrantExceeded { .. })));
    /// ctx.free(ptr)?;
    /// # drop(ctx);
    /// # handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn alloc(&self, bytes: u64) -> Result<DevicePtr, BackendError> {
        self.shared.domain.alloc(bytes, self.stream)
    }

    /// Frees an allocation of the attempt on this context's stream.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnknownHandle`] when `ptr` is not a live allocation
    /// of the attempt; otherwise the backend's error for the free, after
    /// which the allocation is forgotten and its bytes are back under the
    /// grant all the same.
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
    /// # let handle = service.resource_ticket(4 * GIB).admit().await?;
    /// # let ctx = handle.execution_context()?;
    /// let ptr = ctx.alloc(GIB)?;
    /// ctx.free(ptr)?;
    /// assert_eq!(ctx.domain().used_bytes(), 0);
    /// // A pointer freed already is not this domain's any more.
    /// assert!(ctx.free(ptr).is_err());
    /// # drop(ctx);
    /// # handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn free(&self, ptr: DevicePtr) -> Result<(), BackendError> {
        self.shared.domain.free(ptr, self.stream)
    }

    /// Charges `bytes` against the grant without allocating.
    ///
    /// # Errors
    ///
    /// [`BackendError::GrantExceeded`] when the aligned size does not fit
    /// under the grant's remaining bytes; nothing is charged then.
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
    /// # let handle = service.resource_ticket(4 * GIB).admit().await?;
    /// # let ctx = handle.execution_context()?;
    /// // Room for a library's own workspace, charged against the grant.
    /// let workspace = ctx.reserve(GIB)?;
    /// assert_eq!(ctx.domain().used_bytes(), GIB);
    /// drop(workspace);
    /// assert_eq!(ctx.domain().used_bytes(), 0);
    /// # drop(ctx);
    /// # handle.release().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn reserve(&self, bytes: u64) -> Result<SubReservation<'_>, BackendError> {
        self.shared.domain.reserve(bytes)
    }
}

impl Drop for ExecutionContext {
    fn drop(&mut self) {
        // Only what the destroy needs: the job must not keep the envelope
        // alive, whose last drop queues its teardown behind this job.
        let backend = self.shared.backend.clone();
        let deferred = self.shared.deferred.clone();
        let destroying = self.shared.destroying.clone();
        let stream = self.stream;
        let streams = self.shared.worker.stream_counter();
        // The stream is destroyed on the device's worker, later. Until
        // then it counts as a pending destroy, which `execution_context`
        // bounds: a loop that makes and drops contexts while the worker is
        // busy elsewhere must not pile up streams nobody bounds.
        self.shared.destroying.fetch_add(1, Ordering::AcqRel);
        let queued = self.shared.worker.submit_detached(move || {
            if let Err(error) = backend.destroy_stream(stream) {
                let mut deferred = deferred.lock();
                if deferred.len() < MAX_DEFERRED_ERRORS {
                    deferred.push(error);
                }
            }
            // Either way the backend has forgotten the id (it leaves its
            // tables before the driver call), so the device's stream count
            // drops too; a failure is reported at teardown.
            streams.closed();
            destroying.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(gone) = queued {
            tracing::error!(target: "admission", %gone, %stream, "cannot destroy an execution stream");
            self.shared.destroying.fetch_sub(1, Ordering::AcqRel);
        }
        self.shared.forks.fetch_sub(1, Ordering::AcqRel);
        self.shared.release_activity();
    }
}

/// The most execution-stream destroy failures kept for the teardown report
/// (later ones are dropped: the report needs the first, not all of them).
const MAX_DEFERRED_ERRORS: usize = 64;

/// One running source read of the attempt, within its source-work
/// allowance; returned on drop.
#[derive(Debug)]
pub struct SourcePermit {
    pub(super) shared: StdArc<Shared>,
}

impl Drop for SourcePermit {
    fn drop(&mut self) {
        self.shared.source_reads.fetch_sub(1, Ordering::AcqRel);
        self.shared.release_activity();
    }
}
