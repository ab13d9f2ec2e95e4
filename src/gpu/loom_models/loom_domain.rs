//! loom model of the allocation domain's ceiling: concurrent allocations,
//! sub-reservations and frees never take more than the grant, a request
//! fails only when the others really hold the bytes, and every byte comes
//! back.

use std::sync::Arc as StdArc;

use super::model;
use crate::gpu::backend::sim::{SimBackend, SimDevice};
use crate::gpu::backend::{BackendOps, DeviceOrdinal, SharedBackend};
use crate::gpu::domain::AllocationDomain;
use loom::sync::Arc;
use loom::thread;

const CEILING: u64 = 1024;

fn domain() -> (
    StdArc<SimBackend>,
    Arc<AllocationDomain>,
    crate::gpu::backend::StreamId,
) {
    let sim = StdArc::new(SimBackend::new([SimDevice::new(0, 1 << 20)]));
    let lane = sim.open_lane(DeviceOrdinal(0)).unwrap();
    let root = sim.create_root_stream(lane).unwrap();
    let id = sim.open_domain(lane, CEILING).unwrap();
    sim.join_domain(id, root).unwrap();
    let backend: SharedBackend = sim.clone();
    let domain = Arc::new(AllocationDomain::new(
        backend,
        id,
        DeviceOrdinal(0),
        CEILING,
    ));
    (sim, domain, root)
}

/// Two threads each allocate 512 bytes twice (freeing in between) while a
/// third holds a 512-byte sub-reservation for a moment: `used` never exceeds
/// the ceiling, and all bytes return.
pub fn concurrent_charges_never_exceed_the_ceiling_and_all_bytes_return() {
    model(|| {
        let (sim, domain, root) = domain();
        let mut handles = Vec::new();
        for _ in 0..2 {
            let domain = domain.clone();
            handles.push(thread::spawn(move || {
                if let Ok(ptr) = domain.alloc(512, root) {
                    assert!(domain.used_bytes() <= CEILING);
                    domain.free(ptr, root).unwrap();
                }
            }));
        }
        {
            let held = domain.reserve(512);
            assert!(domain.used_bytes() <= CEILING);
            drop(held);
        }
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(domain.used_bytes(), 0);
        assert!(domain.peak_bytes() <= CEILING);
        assert_eq!(sim.free_bytes(DeviceOrdinal(0)), Some(1 << 20));
    });
}

/// Two 512-byte requests against a 1024-byte ceiling both succeed in every
/// interleaving: the CAS loop never fails a request that fits (unlike
/// add-then-undo, where both could see the other's provisional charge).
pub fn two_requests_that_fit_together_never_fail() {
    model(|| {
        let (_sim, domain, root) = domain();
        let other = domain.clone();
        let handle = thread::spawn(move || other.alloc(512, root).is_ok());
        let mine = domain.alloc(512, root).is_ok();
        assert!(handle.join().unwrap());
        assert!(mine);
        assert_eq!(domain.used_bytes(), CEILING);
    });
}
