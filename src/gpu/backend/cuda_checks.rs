//! Checks on a real CUDA device (feature `gpu-tests`; CI never enables it).
//! Each test prints one JSON line of results to stdout (run with
//! `--nocapture`). `sticky_fault_is_a_device_fault` poisons the device's
//! context: run it last, alone, in its own process
//! (`scripts/gpu-check.sh` does).

use std::ffi::CString;
use std::sync::Arc;

use super::cuda::{driver_present, CudaBackend, CudaOptions};
use super::{
    BackendError, BackendOp, BackendOps, DeviceFacts, DeviceOrdinal, DevicePtr, DomainId,
    FaultIsolation, LaneId, ScopeId, SharedBackend, StreamId,
};
use crate::gpu::envelope::{
    AdmissionEnvelope, AttemptBounds, BuildError, BuildStep, DeviceFinding, Disposition,
    EnvelopeSpec,
};
use crate::gpu::worker::DeviceWorker;
use crate::gpu::{
    DeviceProfile, DeviceSet, MemoryOwnership, QueryService, QueueBounds, ServiceError,
};
use cudarc::driver::result;
use serde_json::json;

const DEVICE: DeviceOrdinal = DeviceOrdinal(0);
const MIB: u64 = 1 << 20;

fn backend(options: CudaOptions) -> Arc<CudaBackend> {
    assert!(driver_present(), "no CUDA driver library");
    Arc::new(CudaBackend::with_options([DEVICE], options).expect("open device 0"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Builds an envelope for a `grant_bytes` grant no ledger committed (which
/// the crate's API never allows), on `worker`.
async fn build(
    backend: SharedBackend,
    worker: Arc<DeviceWorker>,
    grant_bytes: u64,
) -> Result<AdmissionEnvelope, BuildError> {
    let bounds = AttemptBounds {
        max_streams: 4,
        max_workers: 1,
        max_lanes: 1,
        source_work_allowance: 2,
    };
    let spec = EnvelopeSpec {
        device: DEVICE,
        grant_bytes,
        bounds,
        report_sink: None,
    };
    AdmissionEnvelope::build(backend, worker, spec).await
}

fn free_bytes(backend: &dyn BackendOps) -> u64 {
    backend.memory_info(DEVICE).expect("memory_info").0
}

/// Builds and tears down one envelope with an allocation, so that lazy
/// driver state (module loading, the first stream's implicit sync, the
/// default pool) is in place before a baseline is taken.
async fn warm_up(backend: &SharedBackend, worker: &Arc<DeviceWorker>) {
    let envelope = build(backend.clone(), worker.clone(), 64 * MIB)
        .await
        .expect("warm-up build");
    let ctx = envelope.execution_context().expect("context");
    let ptr = ctx.alloc(MIB).expect("alloc");
    ctx.free(ptr).expect("free");
    drop(ctx);
    assert_eq!(envelope.teardown().await.disposition, Disposition::Clean);
}

#[test]
fn probe_reports_the_device_and_the_backend_reserve() {
    let present = driver_present();
    let count = cudarc::driver::CudaContext::device_count().expect("device_count");
    let cuda = backend(CudaOptions::default());
    // Right after the context is created, nothing of ours is allocated:
    // what is used is the context and the driver (the backend reserve).
    let (free, total) = cuda.memory_info(DEVICE).expect("memory_info");
    let facts: Vec<DeviceFacts> = cuda.inventory().expect("inventory");
    let f = &facts[0];
    println!(
        "{}",
        json!({
            "test": "probe",
            "driver_present": present,
            "device_count": count,
            "name": f.name,
            "compute_capability": [f.compute_capability.0, f.compute_capability.1],
            "total_bytes": total,
            "free_bytes_after_context": free,
            "backend_reserve_bytes": total - free,
            "memory_pools": f.memory_pools,
        })
    );
    assert!(count >= 1);
}

/// At start-up the service compares each profile with the CUDA device's
/// total memory: a profile whose managed capacity plus backend reserve
/// exceed it is refused naming `backend_reserve`; one that fits (sized from
/// the memory the context left free) is accepted.
#[test]
fn start_up_refuses_a_profile_whose_reserve_does_not_fit_the_device() {
    let cuda = backend(CudaOptions::default());
    let (free, total) = cuda.memory_info(DEVICE).expect("memory_info");
    let service = |capacity: u64, reserve: u64| {
        let profile = DeviceProfile::builder(DEVICE)
            .managed_capacity(capacity)
            .max_active_attempts(1)
            .backend_reserve(reserve)
            .build()
            .expect("a valid profile");
        let devices = DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(DEVICE)])
            .expect("one profile, one ownership");
        let bounds = QueueBounds::new(4, std::time::Duration::from_secs(5), 1).expect("bounds");
        let shared: SharedBackend = cuda.clone();
        QueryService::builder(shared, devices, bounds).build()
    };
    let too_big = service(total, 64 * MIB).expect_err("capacity + reserve > total");
    let field = match &too_big {
        ServiceError::ProfileExceedsDevice(error) => error.field(),
        other => panic!("unexpected error: {other}"),
    };
    let reserve = total - free;
    let fits = service(free, reserve);
    println!(
        "{}",
        json!({
            "test": "backend_reserve_check",
            "total_bytes": total,
            "refused_field": field,
            "refused": too_big.to_string(),
            "accepted_capacity": free,
            "accepted_reserve": reserve,
            "accepted": fits.is_ok(),
        })
    );
    assert_eq!(field, "backend_reserve");
    fits.expect("capacity + reserve == total fits");
}

#[test]
fn a_capped_domain_pool_refuses_past_its_ceiling() {
    let cuda = backend(CudaOptions {
        domain_pools: true,
        blocking_sync: true,
    });
    let baseline = free_bytes(&*cuda);
    let lane = cuda.open_lane(DEVICE).unwrap();
    let root = cuda.create_root_stream(lane).unwrap();
    let domain = cuda.open_domain(lane, 1024 * MIB).unwrap();
    cuda.join_domain(domain, root).unwrap();
    // Straight to the backend: this measures the driver cap, not the
    // software ceiling.
    let half = cuda.alloc(domain, 512 * MIB, root);
    let past = cuda.alloc(domain, 600 * MIB, root);
    let mut ptrs: Vec<DevicePtr> = half.iter().copied().collect();
    ptrs.extend(past.iter().copied());
    let mut one_mib_allocs = 0u32;
    let mut stop_error = None;
    while one_mib_allocs < 4096 {
        match cuda.alloc(domain, MIB, root) {
            Ok(p) => {
                ptrs.push(p);
                one_mib_allocs += 1;
            }
            Err(e) => {
                stop_error = Some(format!("{e:?}"));
                break;
            }
        }
    }
    for p in ptrs {
        cuda.free(domain, p, root).unwrap();
    }
    cuda.synchronize(root).unwrap();
    cuda.leave_domain(domain, root).unwrap();
    cuda.close_domain(domain).unwrap();
    cuda.destroy_stream(root).unwrap();
    cuda.close_lane(lane).unwrap();
    let after = free_bytes(&*cuda);
    println!(
        "{}",
        json!({
            "test": "pool_cap",
            "ceiling_bytes": 1024 * MIB,
            "alloc_512_mib": format!("{:?}", half.as_ref().map(|_| ())),
            "alloc_600_mib_more": format!("{:?}", past.as_ref().map(|_| ())),
            "one_mib_allocs_after": one_mib_allocs,
            "stop_error": stop_error,
            "free_baseline": baseline,
            "free_after_close": after,
            "delta_bytes": baseline as i128 - after as i128,
        })
    );
    assert!(half.is_ok());
}

/// Delegates to the CUDA backend, failing one build step.
#[derive(Debug)]
struct FailAt {
    inner: Arc<CudaBackend>,
    step: BuildStep,
}

impl FailAt {
    fn check(&self, op: BackendOp) -> Result<(), BackendError> {
        if op == self.step.op() {
            Err(BackendError::Driver {
                op,
                code: 1,
                message: "injected".into(),
            })
        } else {
            Ok(())
        }
    }
}

impl BackendOps for FailAt {
    fn name(&self) -> &'static str {
        "cuda-fail-at"
    }
    fn inventory(&self) -> Result<Vec<DeviceFacts>, BackendError> {
        self.inner.inventory()
    }
    fn memory_info(&self, device: DeviceOrdinal) -> Result<(u64, u64), BackendError> {
        self.inner.memory_info(device)
    }
    fn open_lane(&self, device: DeviceOrdinal) -> Result<LaneId, BackendError> {
        self.check(BackendOp::OpenLane)?;
        self.inner.open_lane(device)
    }
    fn create_root_stream(&self, lane: LaneId) -> Result<StreamId, BackendError> {
        self.check(BackendOp::CreateRootStream)?;
        self.inner.create_root_stream(lane)
    }
    fn open_domain(&self, lane: LaneId, ceiling: u64) -> Result<DomainId, BackendError> {
        self.check(BackendOp::OpenDomain)?;
        self.inner.open_domain(lane, ceiling)
    }
    fn join_domain(&self, domain: DomainId, stream: StreamId) -> Result<(), BackendError> {
        self.check(BackendOp::JoinDomain)?;
        self.inner.join_domain(domain, stream)
    }
    fn open_worker_scope(&self, lane: LaneId) -> Result<ScopeId, BackendError> {
        self.check(BackendOp::OpenWorkerScope)?;
        self.inner.open_worker_scope(lane)
    }
    fn fork_stream(&self, root: StreamId) -> Result<StreamId, BackendError> {
        self.inner.fork_stream(root)
    }
    fn alloc(&self, d: DomainId, bytes: u64, s: StreamId) -> Result<DevicePtr, BackendError> {
        self.inner.alloc(d, bytes, s)
    }
    fn free(&self, d: DomainId, p: DevicePtr, s: StreamId) -> Result<(), BackendError> {
        self.inner.free(d, p, s)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), BackendError> {
        self.inner.synchronize(stream)
    }
    fn close_worker_scope(&self, scope: ScopeId) -> Result<(), BackendError> {
        self.inner.close_worker_scope(scope)
    }
    fn leave_domain(&self, d: DomainId, s: StreamId) -> Result<(), BackendError> {
        self.inner.leave_domain(d, s)
    }
    fn close_domain(&self, d: DomainId) -> Result<(), BackendError> {
        self.inner.close_domain(d)
    }
    fn destroy_stream(&self, s: StreamId) -> Result<(), BackendError> {
        self.inner.destroy_stream(s)
    }
    fn close_lane(&self, lane: LaneId) -> Result<(), BackendError> {
        self.inner.close_lane(lane)
    }
}

#[test]
fn rollback_at_each_step_returns_device_memory_to_baseline() {
    let cuda = backend(CudaOptions {
        domain_pools: true,
        blocking_sync: true,
    });
    let shared: SharedBackend = cuda.clone();
    let worker = Arc::new(DeviceWorker::spawn(DEVICE));
    runtime().block_on(async {
        warm_up(&shared, &worker).await;
        let baseline = free_bytes(&*cuda);
        let mut rows = Vec::new();
        for step in BuildStep::ALL {
            let failing: SharedBackend = Arc::new(FailAt {
                inner: cuda.clone(),
                step,
            });
            let error = build(failing, worker.clone(), 256 * MIB).await.unwrap_err();
            let rollback_errors = match &error {
                BuildError::Step { rollback, .. } => rollback.errors().count(),
                other => panic!("{other:?}"),
            };
            let free = free_bytes(&*cuda);
            rows.push(json!({
                "step": format!("{step:?}"),
                "rollback_errors": rollback_errors,
                "free_delta_bytes": baseline as i128 - free as i128,
            }));
        }
        println!(
            "{}",
            json!({"test": "rollback_baseline", "free_baseline": baseline, "steps": rows})
        );
        for row in &rows {
            assert_eq!(row["rollback_errors"], 0);
            assert_eq!(row["free_delta_bytes"], 0, "{row}");
        }
    });
}

#[test]
fn sixty_four_concurrent_attempts_stay_within_their_grants() {
    const ATTEMPTS: usize = 64;
    const GRANT: u64 = 64 * MIB;
    const CHUNK: u64 = 8 * MIB;
    let cuda = backend(CudaOptions::default());
    let shared: SharedBackend = cuda.clone();
    let worker = Arc::new(DeviceWorker::spawn(DEVICE));
    runtime().block_on(async {
        warm_up(&shared, &worker).await;
        let baseline = free_bytes(&*cuda);
        let started = std::time::Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..ATTEMPTS {
            let (backend, worker) = (shared.clone(), worker.clone());
            tasks.push(tokio::spawn(async move {
                let envelope = build(backend, worker, GRANT).await.expect("build");
                let ctx = envelope.execution_context().expect("context");
                let mut held = 0;
                while ctx.alloc(CHUNK).is_ok() {
                    held += CHUNK;
                }
                let exceeded = matches!(
                    ctx.alloc(1),
                    Err(BackendError::GrantExceeded { available: 0, .. })
                );
                drop(ctx);
                let report = envelope.teardown().await;
                (held, exceeded, report.disposition, report.peak_bytes)
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.expect("task"));
        }
        let after = free_bytes(&*cuda);
        let all_at_ceiling = results.iter().all(|r| r.0 == GRANT && r.1 && r.3 == GRANT);
        let all_clean = results.iter().all(|r| r.2 == Disposition::Clean);
        println!(
            "{}",
            json!({
                "test": "concurrency",
                "attempts": ATTEMPTS,
                "grant_bytes": GRANT,
                "all_filled_to_ceiling_then_grant_exceeded": all_at_ceiling,
                "all_teardowns_clean": all_clean,
                "free_baseline": baseline,
                "free_after": after,
                "delta_bytes": baseline as i128 - after as i128,
                "elapsed_ms": started.elapsed().as_millis(),
                "worker_depth_after": worker.depth(),
            })
        );
        assert!(all_at_ceiling && all_clean);
        assert_eq!(baseline, after);
    });
}

/// A kernel that stores to address 0x10: an illegal address, a sticky
/// error that poisons the context.
const POISON_PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry poison()
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    mov.u64 %rd1, 16;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"#;

#[test]
fn sticky_fault_is_a_device_fault() {
    let cuda = backend(CudaOptions::default());
    let shared: SharedBackend = cuda.clone();
    let worker = Arc::new(DeviceWorker::spawn(DEVICE));
    runtime().block_on(async {
        let envelope = build(shared.clone(), worker.clone(), 64 * MIB)
            .await
            .expect("build");
        let stream = cuda.stream(envelope.root_stream()).expect("root stream");
        cuda.context(DEVICE).unwrap().bind_to_thread().unwrap();
        let image = CString::new(POISON_PTX).unwrap();
        // SAFETY: a NUL-terminated PTX image; the context is bound.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }.expect("load");
        // SAFETY: the module is loaded and exports `poison`.
        let function = unsafe { result::module::get_function(module, CString::new("poison").unwrap()) }
            .expect("function");
        // SAFETY: `poison` takes no parameters; the stream is alive.
        let launched = unsafe {
            result::launch_kernel(function, (1, 1, 1), (1, 1, 1), 0, stream.cu_stream(), &mut [])
        };
        drop(stream);
        let report = envelope.teardown().await;
        let next = build(shared.clone(), worker.clone(), MIB).await;
        let check_err = cuda.context(DEVICE).unwrap().check_err();
        println!(
            "{}",
            json!({
                "test": "sticky_fault",
                "launch": format!("{launched:?}"),
                "disposition": format!("{:?}", report.disposition),
                "finding": format!("{:?}", report.finding),
                "errors": report.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                "next_build": format!("{:?}", next.as_ref().map(|_| ())),
                "next_build_fault": format!("{:?}", next.as_ref().err().and_then(BuildError::fault)),
                "check_err_after": format!("{check_err:?}"),
            })
        );
        assert!(matches!(
            report.finding,
            DeviceFinding::Faulted {
                op: BackendOp::Synchronize,
                isolation: FaultIsolation::Device(DEVICE),
                ..
            }
        ));
    });
}
