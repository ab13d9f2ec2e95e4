//! The service's unit tests on the simulated backend: the order of backend
//! calls and observations around a cancelled build and a release, the
//! start-up check of a profile against its device, and wakers kept only for
//! live waiters. Apart so that the service reads without them.

use super::*;
use std::time::Duration;

use crate::gpu::backend::sim::{SimBackend, SimDevice};
use crate::gpu::envelope::Disposition;
use crate::gpu::observe::ObservationKind;
use crate::gpu::profile::{DeviceProfile, MemoryOwnership};

const GIB: u64 = 1 << 30;

/// Each observation's kind and the number of backend calls made before
/// it was delivered.
type Seen = StdArc<std::sync::Mutex<Vec<(ObservationKind, usize)>>>;

/// One 16 GiB device with `max_active` attempt slots, a simulated
/// backend, and an observer that stamps each record with the number of
/// backend calls made before it: what the ordering tests compare.
fn observed_service(
    max_active: u32,
    overtake_budget: u32,
) -> (QueryService, StdArc<SimBackend>, Seen) {
    let gpu0 = DeviceOrdinal(0);
    let profile = DeviceProfile::builder(gpu0)
        .managed_capacity(16 * GIB)
        .max_active_attempts(max_active)
        .streams_per_attempt(2)
        .build()
        .unwrap();
    let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)]).unwrap();
    let bounds = QueueBounds::new(64, Duration::from_secs(5), overtake_budget).unwrap();
    let sim = StdArc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
    let seen = StdArc::new(std::sync::Mutex::new(Vec::new()));
    let (observer_sim, observer_seen) = (sim.clone(), seen.clone());
    let backend: SharedBackend = sim.clone();
    let service = QueryService::builder(backend, devices, bounds)
        .observer(move |record| {
            let ops = observer_sim.ops().len();
            observer_seen.lock().unwrap().push((record.kind, ops));
        })
        .build()
        .unwrap();
    (service, sim, seen)
}

/// The ledger's view and the simulator's view of device 0 agree that
/// nothing is held.
fn assert_nothing_held(service: &QueryService, sim: &SimBackend) {
    let report = &service.ledger_snapshots()[0];
    assert_eq!(report.live_grants_bytes, 0);
    assert_eq!(report.active_attempts, 0);
    assert_eq!(
        sim.live_handles(),
        0,
        "lane, streams, domain or scope left open"
    );
}

#[tokio::test(start_paused = true)]
async fn an_admit_dropped_after_built_arrived_rolls_the_envelope_back_before_the_grant() {
    use crate::gpu::backend::BackendOp as Op;
    let (service, sim, seen) = observed_service(1, 4);
    // Hold the build at its first step so the first poll is certainly
    // still waiting for the outcome when the worker sends it.
    let gate = sim.gate(Op::OpenLane);
    let mut admit = Box::pin(service.resource_ticket(GIB).admit());
    assert!(futures::poll!(&mut admit).is_pending());
    assert!(gate.reached());
    gate.open();
    // The worker runs jobs in order: once this one ran, the build job
    // has finished all five steps and sent `Built` to the future, which
    // has not been polled since.
    service.inner.workers[&DeviceOrdinal(0)]
        .submit(|| ())
        .await
        .unwrap();
    assert_eq!(
        sim.live_handles(),
        4,
        "lane, root stream, domain and scope are built"
    );
    sim.clear_log();
    seen.lock().unwrap().clear();
    drop(admit);
    service.settle().await;

    assert_nothing_held(&service, &sim);
    assert_eq!(
        sim.ops(),
        [
            Op::Synchronize,
            Op::CloseWorkerScope,
            Op::LeaveDomain,
            Op::CloseDomain,
            Op::DestroyStream,
            Op::CloseLane,
        ],
        "the unreceived envelope is rolled back in reverse order"
    );
    // The grant went back once, and only after every rollback call.
    let returned: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|(kind, _)| *kind == ObservationKind::Removed)
        .collect();
    assert_eq!(returned, [(ObservationKind::Removed, 6)]);
    // And the slot is usable again.
    service
        .resource_ticket(GIB)
        .admit()
        .await
        .unwrap()
        .release()
        .await;
    assert_nothing_held(&service, &sim);
}

#[tokio::test(start_paused = true)]
async fn release_follows_the_seeds_order_from_idle_to_the_wake() {
    use crate::gpu::backend::BackendOp as Op;
    let (service, sim, seen) = observed_service(1, 4);
    let handle = service.resource_ticket(GIB).admit().await.unwrap();
    let mut next = Box::pin(service.resource_ticket(GIB).admit());
    assert!(futures::poll!(&mut next).is_pending());
    // One allocation left outstanding by an execution whose context is
    // gone: the teardown frees it, as part of destruction.
    let context = handle.execution_context().unwrap();
    context.alloc(1 << 20).unwrap();
    drop(context);
    service.settle().await;
    sim.clear_log();
    seen.lock().unwrap().clear();

    let report = handle.release().await;
    assert_eq!(
        sim.ops(),
        [
            Op::Synchronize,
            Op::Free,
            Op::CloseWorkerScope,
            Op::LeaveDomain,
            Op::CloseDomain,
            Op::DestroyStream,
            Op::CloseLane,
        ]
    );
    let seen = seen.lock().unwrap().clone();
    let kinds: Vec<_> = seen.iter().map(|(kind, _)| *kind).collect();
    assert_eq!(
        kinds,
        [
            ObservationKind::Sealed,
            ObservationKind::Released,
            ObservationKind::Admitted,
        ]
    );
    // Sealed after the synchronization decided disposition and health,
    // before anything was destroyed.
    assert_eq!(seen[0], (ObservationKind::Sealed, 1));
    // The grant went back after the lane closed, and the queued waiter
    // was admitted in that same ledger transaction, after the release.
    assert_eq!(seen[1], (ObservationKind::Released, 7));
    assert_eq!(seen[2], (ObservationKind::Admitted, 7));
    assert_eq!(report.disposition, Disposition::Clean);
    assert_eq!(report.teardown.leaked.allocations.len(), 1);
    assert!(report.ledger_released);
    next.await.unwrap().release().await;
    assert_nothing_held(&service, &sim);
}

#[test]
fn start_up_refuses_a_profile_whose_reserve_does_not_fit_the_device() {
    let gpu0 = DeviceOrdinal(0);
    let service = |reserve: u64| {
        let profile = DeviceProfile::builder(gpu0)
            .managed_capacity(16 * GIB)
            .backend_reserve(reserve)
            .build()
            .unwrap();
        let devices =
            DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(gpu0)]).unwrap();
        let bounds = QueueBounds::new(4, Duration::from_secs(5), 1).unwrap();
        let backend = StdArc::new(SimBackend::new([SimDevice::new(0, 20 * GIB)]));
        QueryService::builder(backend, devices, bounds).build()
    };
    assert!(service(4 * GIB).is_ok(), "16 + 4 GiB fit 20 GiB");
    let error = service(4 * GIB + 1).unwrap_err();
    let ServiceError::ProfileExceedsDevice(config) = &error else {
        panic!("unexpected error: {error}");
    };
    assert_eq!(config.field(), "backend_reserve");
    assert!(error.to_string().contains("20 GiB"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn wakers_are_kept_only_for_live_waiters() {
    let devices = DeviceSet::one_16_gib_device(1);
    let bounds = QueueBounds::new(64, Duration::from_secs(5), 4).unwrap();
    let backend = StdArc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
    let service = QueryService::builder(backend, devices, bounds)
        .build()
        .unwrap();
    let held = service.resource_ticket(GIB).admit().await.unwrap();
    let mut cancelled: Vec<_> = (0..8)
        .map(|_| Box::pin(service.resource_ticket(GIB).admit()))
        .collect();
    for future in &mut cancelled {
        assert!(futures::poll!(future).is_pending());
    }
    assert_eq!(service.inner.live_wakers(), 8);
    drop(cancelled);
    let expiring: Vec<_> = (0..8)
        .map(|_| tokio::spawn(service.resource_ticket(GIB).admit()))
        .collect();
    for task in expiring {
        assert!(task.await.unwrap().is_err());
    }
    let mut granted = Box::pin(service.resource_ticket(GIB).admit());
    assert!(futures::poll!(&mut granted).is_pending());
    held.release().await;
    granted.await.unwrap().release().await;
    assert_eq!(service.inner.live_wakers(), 0);
}
