//! The GPU service under hostile callers and callbacks: panicking observers,
//! preflights, teardown hooks and backends, and absurd values at every
//! public setter. After each, the service still admits new work on idle
//! devices, every ledger drains to zero, and the panic is counted.

mod gpu_rig;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::gpu::backend::sim::{SimBackend, SimDevice};
use admission::gpu::backend::{
    BackendError, BackendOp, DeviceFacts, DeviceOrdinal, DevicePtr, DomainId, GpuBackend, LaneId,
    ScopeId, StreamId,
};
use admission::gpu::envelope::BuildStep;
use admission::gpu::ledger::DeviceLedger;
use admission::gpu::{
    CacheChange, DeviceSet, GpuAdmitError, LedgerError, LedgerHealth, MemoryOwnership, Observation,
    ObservationKind, PreflightFuture, PreflightRequest, QueryService,
};
use gpu_rig::*;

fn one_device(slots: u32) -> Rig {
    Rig::new(vec![profile(0, 16, slots, &["hash_join"])], bounds(16, 4))
}

/// An observer that panics on every record of `kind` while `armed`.
fn panicking_on(
    kind: ObservationKind,
    armed: Arc<AtomicBool>,
) -> impl Fn(&Observation) + Send + Sync + 'static {
    move |o: &Observation| {
        if o.kind == kind && armed.load(Ordering::SeqCst) {
            panic!("observer panics on {kind:?}");
        }
    }
}

/// New work is admitted and released on the idle device, and every ledger
/// is back to zero.
async fn still_admits(rig: &Rig) {
    let handle = rig
        .service
        .admit_resources(GIB)
        .await
        .expect("an idle device admits new work");
    let report = handle.release().await;
    assert!(report.ledger_released);
    rig.service.settle().await;
    rig.assert_idle();
    for r in rig.reports() {
        assert_eq!(r.health, LedgerHealth::Healthy, "{r:?}");
    }
}

#[test]
fn an_overflowing_cache_charge_is_cache_cap_exceeded() {
    let profile = admission::gpu::DeviceProfile::builder(dev(0))
        .managed_capacity(16 * GIB)
        .cache_cap(4 * GIB)
        .build()
        .unwrap();
    let mut ledger = DeviceLedger::new(profile);
    ledger.charge_cache(GIB).unwrap();
    assert_eq!(
        ledger.charge_cache(u64::MAX),
        Err(LedgerError::CacheCapExceeded {
            requested: u64::MAX,
            resident: GIB,
            cache_cap: 4 * GIB,
        })
    );
    assert_eq!(ledger.report().cache_evictable_bytes, GIB);
}

#[tokio::test]
async fn an_overflowing_cache_charge_through_the_service_is_typed() {
    let rig = Rig::new(
        vec![admission::gpu::DeviceProfile::builder(dev(0))
            .managed_capacity(16 * GIB)
            .cache_cap(4 * GIB)
            .build()
            .unwrap()],
        bounds(16, 4),
    );
    rig.service
        .change_cache(dev(0), CacheChange::Charge(GIB))
        .unwrap();
    assert!(matches!(
        rig.service
            .change_cache(dev(0), CacheChange::Charge(u64::MAX)),
        Err(LedgerError::CacheCapExceeded { .. })
    ));
    rig.service
        .change_cache(dev(0), CacheChange::Evict(GIB))
        .unwrap();
    still_admits(&rig).await;
}

/// A preflight that panics while `armed`, either when called or when its
/// future is polled.
fn panicking_preflight(
    armed: Arc<AtomicBool>,
    in_future: bool,
) -> impl Fn(&PreflightRequest) -> PreflightFuture + Send + Sync + 'static {
    move |_: &PreflightRequest| {
        let armed = armed.load(Ordering::SeqCst);
        if armed && !in_future {
            panic!("preflight panics when called");
        }
        Box::pin(async move {
            if armed {
                panic!("preflight future panics when polled");
            }
            Ok(())
        }) as PreflightFuture
    }
}

async fn a_panicking_preflight_is_a_failed_preflight(in_future: bool) {
    let armed = Arc::new(AtomicBool::new(true));
    let preflight = panicking_preflight(armed.clone(), in_future);
    let rig = Rig::with(
        vec![profile(0, 16, 2, &["hash_join"])],
        bounds(16, 4),
        |b| b.preflight(preflight),
    );
    let outcome = tokio::spawn(rig.service.admit_resources(GIB)).await;
    assert!(
        matches!(
            outcome,
            Ok(Err(GpuAdmitError::PreflightFailed {
                device: Some(_),
                ..
            }))
        ),
        "{outcome:?}"
    );
    assert_eq!(rig.service.admission_snapshot().pending_preflights, 0);
    armed.store(false, Ordering::SeqCst);
    still_admits(&rig).await;
}

/// A backend that delegates to a simulator, panicking on `op` while set.
#[derive(Debug)]
struct PanickyBackend {
    sim: Arc<SimBackend>,
    panic_on: Mutex<Option<BackendOp>>,
}

impl PanickyBackend {
    fn arm(&self, op: Option<BackendOp>) {
        *self.panic_on.lock().unwrap() = op;
    }

    fn maybe_panic(&self, op: BackendOp) {
        if *self.panic_on.lock().unwrap() == Some(op) {
            panic!("backend panics in {op}");
        }
    }
}

impl GpuBackend for PanickyBackend {
    fn name(&self) -> &'static str {
        "panicky"
    }
    fn inventory(&self) -> Result<Vec<DeviceFacts>, BackendError> {
        self.maybe_panic(BackendOp::Inventory);
        self.sim.inventory()
    }
    fn memory_info(&self, device: DeviceOrdinal) -> Result<(u64, u64), BackendError> {
        self.maybe_panic(BackendOp::MemoryInfo);
        self.sim.memory_info(device)
    }
    fn open_lane(&self, device: DeviceOrdinal) -> Result<LaneId, BackendError> {
        self.maybe_panic(BackendOp::OpenLane);
        self.sim.open_lane(device)
    }
    fn create_root_stream(&self, lane: LaneId) -> Result<StreamId, BackendError> {
        self.maybe_panic(BackendOp::CreateRootStream);
        self.sim.create_root_stream(lane)
    }
    fn open_domain(&self, lane: LaneId, ceiling_bytes: u64) -> Result<DomainId, BackendError> {
        self.maybe_panic(BackendOp::OpenDomain);
        self.sim.open_domain(lane, ceiling_bytes)
    }
    fn join_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::JoinDomain);
        self.sim.join_domain(domain, stream)
    }
    fn open_worker_scope(&self, lane: LaneId) -> Result<ScopeId, BackendError> {
        self.maybe_panic(BackendOp::OpenWorkerScope);
        self.sim.open_worker_scope(lane)
    }
    fn fork_stream(&self, root: StreamId) -> Result<StreamId, BackendError> {
        self.maybe_panic(BackendOp::ForkStream);
        self.sim.fork_stream(root)
    }
    fn alloc(
        &self,
        domain: DomainId,
        bytes: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, BackendError> {
        self.maybe_panic(BackendOp::Alloc);
        self.sim.alloc(domain, bytes, stream)
    }
    fn free(&self, domain: DomainId, ptr: DevicePtr, stream: StreamId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::Free);
        self.sim.free(domain, ptr, stream)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::Synchronize);
        self.sim.synchronize(stream)
    }
    fn close_worker_scope(&self, scope: ScopeId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::CloseWorkerScope);
        self.sim.close_worker_scope(scope)
    }
    fn leave_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::LeaveDomain);
        self.sim.leave_domain(domain, stream)
    }
    fn close_domain(&self, domain: DomainId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::CloseDomain);
        self.sim.close_domain(domain)
    }
    fn destroy_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::DestroyStream);
        self.sim.destroy_stream(stream)
    }
    fn close_lane(&self, lane: LaneId) -> Result<(), BackendError> {
        self.maybe_panic(BackendOp::CloseLane);
        self.sim.close_lane(lane)
    }
}

fn panicky_service() -> (Arc<PanickyBackend>, QueryService) {
    let sim = Arc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
    let backend = Arc::new(PanickyBackend {
        sim,
        panic_on: Mutex::new(None),
    });
    let devices = DeviceSet::new(
        vec![profile(0, 16, 2, &[])],
        vec![MemoryOwnership::exclusive(dev(0))],
    )
    .unwrap();
    let service = QueryService::new(backend.clone(), devices, bounds(16, 4)).unwrap();
    (backend, service)
}

/// Nothing granted or running on any ledger.
fn ledgers_idle(service: &QueryService) {
    for r in service.device_ledger_reports() {
        assert_eq!(r.live_grants_bytes, 0, "{r:?}");
        assert_eq!(r.live_grant_count, 0, "{r:?}");
        assert_eq!(r.active_attempts, 0, "{r:?}");
    }
}

async fn service_still_admits(service: &QueryService) {
    let handle = service.admit_resources(GIB).await.expect("admits new work");
    assert!(handle.release().await.ledger_released);
    service.settle().await;
    ledgers_idle(service);
    for r in service.device_ledger_reports() {
        assert_eq!(r.health, LedgerHealth::Healthy, "{r:?}");
    }
}
