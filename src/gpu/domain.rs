//! The allocation domain: an attempt's software memory ceiling.
//!
//! # Implementation notes
//!
//! An [`AllocationDomain`] is opened around one attempt's immutable
//! `MemoryGrant`: its ceiling is the grant's bytes and never changes. It is
//! the authoritative enforcement of the grant, identical on every backend;
//! a backend may add a driver-level cap (a memory pool sized to the ceiling)
//! but the domain never relies on one.
//!
//! * **One counter, one CAS loop.** `used` counts every byte charged against
//!   the ceiling: device allocations and query-owned sub-reservations
//!   ([`SubReservation`], the seed's `live_reserved_bytes`). A charge is a
//!   compare-and-swap loop that checks `used + need <= ceiling` before it
//!   publishes anything, so a request that does not fit fails with
//!   [`BackendError::GrantExceeded`] without side effects, and two
//!   concurrent requests that each fit alone never both fail. (RMM's
//!   limiting adaptor adds first and undoes on overflow, which makes a
//!   concurrent request that would have fit fail spuriously.)
//! * **Reserve, then call the driver.** [`AllocationDomain::alloc`] charges
//!   the bytes first, so [`BackendOps::alloc`](crate::gpu::backend::BackendOps::alloc) is never called for a request
//!   over the ceiling, and un-charges them if the driver fails.
//! * **Sizes are aligned.** Every request is rounded up to [`ALIGN`] bytes
//!   before it is charged, so the ceiling bounds what the driver actually
//!   hands out rather than what was asked for.
//! * **Telemetry** follows RMM's statistics adaptor: `peak` is the highest
//!   `used` ever reached, `total` the sum of every charge (saturating).
//! * **Leaks are reported, not hidden.** The domain remembers each live
//!   allocation; the envelope's teardown frees whatever is still outstanding
//!   and reports it ([`AllocationDomain::free_outstanding`]).
//!
//! Arithmetic is checked: a request whose aligned size overflows `u64` is a
//! `GrantExceeded`, never a wrap-around.

use std::collections::HashMap;
use std::fmt;

use crate::gpu::backend::{
    BackendError, BackendOp, DeviceOrdinal, DevicePtr, DomainId, SharedBackend, StreamId,
};
use crate::sync::{AtomicU64, Mutex, Ordering};

/// The granularity every charge is rounded up to: 256 bytes, CUDA's
/// guaranteed allocation alignment (`cudaMalloc` and the stream-ordered
/// allocator return 256-byte aligned pointers, and RMM's
/// `CUDA_ALLOCATION_ALIGNMENT` is the same), so the ceiling counts the bytes
/// the driver really sets aside.
pub(super) const ALIGN: u64 = 256;

/// `n` rounded up to a multiple of [`ALIGN`], or `None` on overflow.
pub(super) fn align_up(n: u64) -> Option<u64> {
    n.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

/// One attempt's memory ceiling and its accounting. See the
/// [`gpu` module documentation](crate::gpu).
pub struct AllocationDomain {
    backend: SharedBackend,
    id: DomainId,
    device: DeviceOrdinal,
    ceiling: u64,
    used: AtomicU64,
    allocated: AtomicU64,
    peak: AtomicU64,
    total: AtomicU64,
    // Live allocations and their charged (aligned) sizes.
    allocations: Mutex<HashMap<DevicePtr, u64>>,
}

impl fmt::Debug for AllocationDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocationDomain")
            .field("id", &self.id)
            .field("device", &self.device)
            .field("ceiling", &self.ceiling)
            .field("used", &self.used_bytes())
            .field("peak", &self.peak_bytes())
            .finish()
    }
}

impl AllocationDomain {
    /// Wraps a domain the backend opened ([`BackendOps::open_domain`]) with
    /// a software ceiling of `ceiling` bytes (the grant). Crate-private: the
    /// ceiling must be a committed grant, which only the envelope build has.
    ///
    /// [`BackendOps::open_domain`]: crate::gpu::backend::BackendOps::open_domain
    pub(crate) fn new(
        backend: SharedBackend,
        id: DomainId,
        device: DeviceOrdinal,
        ceiling: u64,
    ) -> Self {
        Self {
            backend,
            id,
            device,
            ceiling,
            used: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            total: AtomicU64::new(0),
            allocations: Mutex::new(HashMap::new()),
        }
    }

    /// The backend's id of this domain.
    pub(crate) fn id(&self) -> DomainId {
        self.id
    }

    /// Bytes charged against the ceiling now.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Bytes still available under the ceiling.
    pub fn available_bytes(&self) -> u64 {
        self.ceiling.saturating_sub(self.used_bytes())
    }

    /// The highest [`used_bytes`](Self::used_bytes) ever reached.
    pub(crate) fn peak_bytes(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// The sum of every charge ever made (saturating).
    pub(crate) fn total_bytes(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Charges `bytes` (aligned) against the ceiling, or fails without side
    /// effects. Returns the aligned size charged.
    fn charge(&self, bytes: u64) -> Result<u64, BackendError> {
        let mut current = self.used.load(Ordering::Acquire);
        let Some(need) = align_up(bytes) else {
            return Err(BackendError::GrantExceeded {
                requested: bytes,
                available: self.ceiling.saturating_sub(current),
            });
        };
        loop {
            let available = self.ceiling.saturating_sub(current);
            if need > available {
                return Err(BackendError::GrantExceeded {
                    requested: need,
                    available,
                });
            }
            // `need <= ceiling - current`, so this cannot overflow.
            let next = current + need;
            match self.used.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::AcqRel);
                    let _ = self
                        .total
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                            Some(t.saturating_add(need))
                        });
                    return Ok(need);
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Returns `need` bytes charged earlier.
    fn uncharge(&self, need: u64) {
        let undone = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_sub(need));
        // Every uncharge follows its own charge, so this is the crate's bug;
        // it is logged, not a panic in the middle of a caller's free.
        if undone.is_err() {
            tracing::error!(target: "admission", domain = %self.id, "uncharged more than was charged");
        }
    }

    /// Allocates `bytes` on `stream` through the backend, after charging the
    /// aligned size against the ceiling. Over the ceiling it fails with
    /// [`BackendError::GrantExceeded`] and the backend is not called; if the
    /// backend fails, the charge is returned. Zero bytes are allocated and
    /// charged as the smallest aligned unit, so that every live allocation
    /// counts against the ceiling (otherwise a loop of empty allocations
    /// would grow the domain's table, and the device's, without bound).
    pub(crate) fn alloc(&self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        let need = self.charge(bytes.max(1))?;
        match self.backend.alloc(self.id, need, stream) {
            Ok(ptr) => {
                self.allocated.fetch_add(need, Ordering::AcqRel);
                self.allocations.lock().insert(ptr, need);
                Ok(ptr)
            }
            Err(error) => {
                self.uncharge(need);
                Err(error)
            }
        }
    }

    /// Frees an allocation of this domain on `stream` and returns its bytes
    /// to the ceiling. An allocation this domain did not make is
    /// [`BackendError::UnknownHandle`]. The bytes come back even when the
    /// backend reports an error, because the backend forgets the pointer
    /// either way (see the backend contract).
    pub(crate) fn free(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), BackendError> {
        let need = self
            .allocations
            .lock()
            .remove(&ptr)
            .ok_or(BackendError::UnknownHandle {
                op: BackendOp::Free,
                id: ptr.get(),
            })?;
        let result = self.backend.free(self.id, ptr, stream);
        self.allocated.fetch_sub(need, Ordering::AcqRel);
        self.uncharge(need);
        result
    }

    /// Charges `bytes` against the ceiling without allocating: query-owned
    /// accounting inside the grant (for memory the engine will obtain in
    /// pieces, or wants to be sure of before it starts). The charge is
    /// returned when the [`SubReservation`] drops.
    pub(crate) fn reserve(&self, bytes: u64) -> Result<SubReservation<'_>, BackendError> {
        let bytes = self.charge(bytes)?;
        Ok(SubReservation {
            domain: self,
            bytes,
        })
    }

    /// Frees every allocation still outstanding, on `stream`, and reports
    /// what it freed: the leak report of a teardown. Every free is
    /// attempted; errors are collected, not short-circuited.
    pub(crate) fn free_outstanding(&self, stream: StreamId) -> LeakReport {
        let mut leaked: Vec<(DevicePtr, u64)> = self.allocations.lock().drain().collect();
        leaked.sort_unstable();
        let mut errors = Vec::new();
        for &(ptr, need) in &leaked {
            if let Err(error) = self.backend.free(self.id, ptr, stream) {
                errors.push(error);
            }
            self.allocated.fetch_sub(need, Ordering::AcqRel);
            self.uncharge(need);
        }
        LeakReport {
            bytes: leaked
                .iter()
                .fold(0u64, |sum, (_, b)| sum.saturating_add(*b)),
            allocations: leaked,
            errors,
        }
    }
}

/// Bytes charged against a domain's ceiling without an allocation, returned
/// on drop.
#[derive(Debug)]
pub struct SubReservation<'d> {
    domain: &'d AllocationDomain,
    bytes: u64,
}

impl Drop for SubReservation<'_> {
    fn drop(&mut self) {
        self.domain.uncharge(self.bytes);
    }
}

/// The allocations a teardown found still live on a stream, and freed
/// (in [`TeardownReport::leaked`](crate::gpu::TeardownReport::leaked)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeakReport {
    /// The allocations still live at teardown, with their charged bytes.
    pub allocations: Vec<(DevicePtr, u64)>,
    /// Their total bytes.
    pub bytes: u64,
    /// Errors the backend reported while freeing them.
    pub errors: Vec<BackendError>,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::gpu::backend::sim::{SimBackend, SimDevice};
    use crate::gpu::backend::BackendOps;
    use std::sync::Arc;

    fn domain(ceiling: u64) -> (Arc<SimBackend>, AllocationDomain, StreamId) {
        let sim = Arc::new(SimBackend::new(vec![SimDevice::new(0, 1 << 30)]));
        let lane = sim.open_lane(DeviceOrdinal(0)).unwrap();
        let root = sim.create_root_stream(lane).unwrap();
        let id = sim.open_domain(lane, ceiling).unwrap();
        sim.join_domain(id, root).unwrap();
        let backend: SharedBackend = sim.clone();
        (
            sim,
            AllocationDomain::new(backend, id, DeviceOrdinal(0), ceiling),
            root,
        )
    }

    #[test]
    fn align_up_rounds_to_256_and_detects_overflow() {
        assert_eq!(align_up(0), Some(0));
        assert_eq!(align_up(1), Some(256));
        assert_eq!(align_up(256), Some(256));
        assert_eq!(align_up(257), Some(512));
        assert_eq!(align_up(u64::MAX), None);
    }

    #[test]
    fn an_allocation_over_the_ceiling_fails_before_the_driver_is_called() {
        let (sim, domain, root) = domain(1024);
        let a = domain.alloc(1000, root).unwrap();
        let calls = sim.calls(BackendOp::Alloc);
        assert_eq!(
            domain.alloc(1, root),
            Err(BackendError::GrantExceeded {
                requested: 256,
                available: 0
            })
        );
        assert_eq!(sim.calls(BackendOp::Alloc), calls);
        domain.free(a, root).unwrap();
        assert_eq!(domain.used_bytes(), 0);
        assert_eq!(domain.peak_bytes(), 1024);
        assert_eq!(domain.total_bytes(), 1024);
    }

    #[test]
    fn empty_allocations_count_against_the_ceiling() {
        let (_sim, domain, root) = domain(1024);
        let empty: Vec<_> = (0..4).map(|_| domain.alloc(0, root).unwrap()).collect();
        assert_eq!(domain.used_bytes(), 1024);
        assert!(matches!(
            domain.alloc(0, root),
            Err(BackendError::GrantExceeded { requested: 256, .. })
        ));
        for ptr in empty {
            domain.free(ptr, root).unwrap();
        }
        assert_eq!(domain.used_bytes(), 0);
    }

    #[test]
    fn a_failed_driver_allocation_returns_its_charge() {
        let (sim, domain, root) = domain(4096);
        sim.fail_nth(
            BackendOp::Alloc,
            1,
            BackendError::Driver {
                op: BackendOp::Alloc,
                code: 2,
                message: "out of memory".into(),
            },
        );
        assert!(matches!(
            domain.alloc(512, root),
            Err(BackendError::Driver { code: 2, .. })
        ));
        assert_eq!(domain.used_bytes(), 0);
    }

    #[test]
    fn sub_reservations_share_the_ceiling_and_return_on_drop() {
        let (_sim, domain, root) = domain(1024);
        let r = domain.reserve(700).unwrap();
        assert_eq!(r.bytes, 768, "aligned up");
        assert_eq!(domain.used_bytes(), 768);
        assert!(matches!(
            domain.alloc(512, root),
            Err(BackendError::GrantExceeded { available: 256, .. })
        ));
        drop(r);
        assert!(domain.alloc(1024, root).is_ok());
    }

    #[test]
    fn free_outstanding_reports_and_frees_leaks() {
        let (sim, domain, root) = domain(4096);
        let before = sim.free_bytes(DeviceOrdinal(0)).unwrap();
        domain.alloc(100, root).unwrap();
        domain.alloc(300, root).unwrap();
        let report = domain.free_outstanding(root);
        assert_eq!(report.allocations.len(), 2);
        assert_eq!(report.bytes, 768);
        assert_eq!(domain.used_bytes(), 0);
        assert_eq!(sim.free_bytes(DeviceOrdinal(0)).unwrap(), before);
    }

    #[test]
    fn freeing_a_foreign_pointer_is_an_unknown_handle() {
        let (_sim, domain, root) = domain(4096);
        assert_eq!(
            domain.free(DevicePtr::new(42), root),
            Err(BackendError::UnknownHandle {
                op: BackendOp::Free,
                id: 42
            })
        );
    }
}
