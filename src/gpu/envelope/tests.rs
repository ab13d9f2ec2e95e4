//! The admission envelope on the simulated backend: build order, rollback
//! in exact reverse order (on failure, in rollback itself, and on
//! cancellation), the grant ceiling, the per-attempt bounds, sticky faults
//! and teardown order. Every test checks that simulated device memory and
//! the backend's handle tables return exactly to their baseline.

use std::sync::Arc;

use crate::gpu::backend::sim::{SimBackend, SimDevice};
use crate::gpu::backend::{BackendError, BackendOp, DeviceOrdinal, FaultIsolation, SharedBackend};
use crate::gpu::envelope::{
    AdmissionEnvelope, AttemptBounds, BuildError, BuildStep, DeviceFinding, Disposition,
    EnvelopeError, EnvelopeSpec, TeardownReport,
};
use crate::gpu::worker::DeviceWorker;
use tokio::sync::mpsc;

use BackendOp::*;

const DEVICE: DeviceOrdinal = DeviceOrdinal(0);
const TOTAL: u64 = 1 << 30;

struct Rig {
    sim: Arc<SimBackend>,
    backend: SharedBackend,
    worker: Arc<DeviceWorker>,
    reports: mpsc::UnboundedReceiver<TeardownReport>,
    sink: mpsc::UnboundedSender<TeardownReport>,
}

impl Rig {
    fn new() -> Self {
        let sim = Arc::new(SimBackend::new([SimDevice::new(0, TOTAL)]));
        let (sink, reports) = mpsc::unbounded_channel();
        Rig {
            backend: sim.clone(),
            sim,
            worker: Arc::new(DeviceWorker::spawn(DEVICE)),
            reports,
            sink,
        }
    }

    fn spec(&self, grant_bytes: u64, bounds: AttemptBounds) -> EnvelopeSpec {
        EnvelopeSpec {
            device: DEVICE,
            grant_bytes,
            bounds,
            report_sink: Some(self.sink.clone()),
        }
    }

    async fn build(&self, grant_bytes: u64) -> Result<AdmissionEnvelope, BuildError> {
        AdmissionEnvelope::build(
            self.backend.clone(),
            self.worker.clone(),
            self.spec(grant_bytes, bounds()),
        )
        .await
    }

    /// Waits until every job queued on the worker so far has run.
    async fn drain_worker(&self) {
        self.worker.submit(|| ()).await.unwrap();
    }

    fn assert_baseline(&self) {
        assert_eq!(self.sim.free_bytes(DEVICE), Some(TOTAL), "device memory");
        assert_eq!(self.sim.live_handles(), 0, "leaked ids");
    }
}

fn bounds() -> AttemptBounds {
    AttemptBounds {
        max_streams: 3,
        max_workers: 1,
        max_lanes: 1,
        source_work_allowance: 2,
    }
}

fn driver_error(op: BackendOp) -> BackendError {
    BackendError::Driver {
        op,
        code: 1,
        message: "invalid value".into(),
    }
}

const BUILD: [BackendOp; 5] = [
    OpenLane,
    CreateRootStream,
    OpenDomain,
    JoinDomain,
    OpenWorkerScope,
];

/// The rollback of the first `done` steps: wait for the root stream (if
/// created), then undo in reverse order.
fn rollback_of(done: usize) -> Vec<BackendOp> {
    let mut ops = Vec::new();
    if done >= 2 {
        ops.push(Synchronize);
    }
    let undo = [
        CloseLane,
        DestroyStream,
        CloseDomain,
        LeaveDomain,
        CloseWorkerScope,
    ];
    ops.extend(undo[..done].iter().rev());
    ops
}

#[tokio::test]
async fn a_failure_at_each_build_step_rolls_back_in_exact_reverse_order() {
    for (k, step) in BuildStep::ALL.into_iter().enumerate() {
        let rig = Rig::new();
        rig.sim.fail_nth(step.op(), 1, driver_error(step.op()));
        let error = rig.build(4096).await.unwrap_err();
        let BuildError::Step {
            step: failed,
            rollback,
            ..
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(*failed, step);
        assert_eq!(rollback.errors().count(), 0);
        assert_eq!(error.fault(), None);
        let mut expected = BUILD[..=k].to_vec();
        expected.extend(rollback_of(k));
        assert_eq!(rig.sim.ops(), expected, "failure at {step:?}");
        rig.assert_baseline();
    }
}

#[tokio::test]
async fn a_failing_undo_does_not_stop_the_rollback() {
    let rig = Rig::new();
    rig.sim
        .fail_nth(OpenWorkerScope, 1, driver_error(OpenWorkerScope));
    rig.sim.fail_nth(CloseDomain, 1, driver_error(CloseDomain));
    rig.sim.fail_nth(Synchronize, 1, driver_error(Synchronize));
    let error = rig.build(4096).await.unwrap_err();
    let BuildError::Step { rollback, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(
        rollback.errors().cloned().collect::<Vec<_>>(),
        vec![driver_error(Synchronize), driver_error(CloseDomain)]
    );
    let mut expected = BUILD.to_vec();
    expected.extend(rollback_of(4));
    assert_eq!(rig.sim.ops(), expected);
    rig.assert_baseline();
}

#[tokio::test]
async fn a_fault_during_rollback_is_surfaced_with_its_isolation() {
    let rig = Rig::new();
    rig.sim.fail_nth(JoinDomain, 1, driver_error(JoinDomain));
    let fault = BackendError::Fault {
        op: DestroyStream,
        code: 700,
        isolation: FaultIsolation::Device(DEVICE),
    };
    rig.sim.fail_nth(DestroyStream, 1, fault);
    let error = rig.build(4096).await.unwrap_err();
    // A fault outside a stream synchronization proves nothing about its
    // reach, whatever the backend calls it.
    assert_eq!(error.fault(), Some(FaultIsolation::Unknown));
    // The fault is sticky: the lane's close reports it too, and still
    // releases the lane.
    let BuildError::Step { rollback, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(rollback.errors().count(), 2);
    rig.assert_baseline();
}

#[tokio::test]
async fn dropping_the_build_future_after_each_step_rolls_back() {
    for (k, step) in BuildStep::ALL.into_iter().enumerate() {
        let mut rig = Rig::new();
        let gate = rig.sim.gate(step.op());
        let mut build = Box::pin(rig.build(4096));
        assert!(futures::poll!(&mut build).is_pending());
        // The worker is inside step k now; cancel, then let the step finish.
        assert!(gate.reached());
        drop(build);
        gate.open();
        let report = rig.reports.recv().await.unwrap();
        assert_eq!(report.disposition, Disposition::Cancelled, "{step:?}");
        assert!(report.implicit);
        let mut expected = BUILD[..=k].to_vec();
        expected.extend(rollback_of(k + 1));
        assert_eq!(rig.sim.ops(), expected, "cancelled in {step:?}");
        rig.assert_baseline();
    }
}

#[tokio::test]
async fn the_grant_ceiling_is_enforced_exactly_at_the_boundary() {
    let rig = Rig::new();
    let envelope = rig.build(4096).await.unwrap();
    let ctx = envelope.execution_context().unwrap();
    let a = ctx.alloc(4096).unwrap();
    let allocs = rig.sim.calls(Alloc);
    assert_eq!(
        ctx.alloc(1),
        Err(BackendError::GrantExceeded {
            requested: 256,
            available: 0
        })
    );
    assert_eq!(
        rig.sim.calls(Alloc),
        allocs,
        "no driver call over the ceiling"
    );
    ctx.free(a).unwrap();
    let b = ctx.alloc(4095).unwrap();
    assert_eq!(envelope.domain().used_bytes(), 4096);
    ctx.free(b).unwrap();
    {
        let _held = ctx.reserve(4000).unwrap();
        assert!(matches!(
            ctx.alloc(256),
            Err(BackendError::GrantExceeded { available: 0, .. })
        ));
    }
    assert!(ctx.alloc(4096).is_ok());
    drop(ctx);
    let report = envelope.teardown().await;
    assert_eq!(report.disposition, Disposition::Clean);
    assert_eq!(report.peak_bytes, 4096);
    assert_eq!(report.total_bytes, 4 * 4096);
    assert_eq!(report.leaked.allocations.len(), 1);
    rig.assert_baseline();
}

#[tokio::test]
async fn the_stream_bound_and_source_work_allowance_are_enforced() {
    let rig = Rig::new();
    let envelope = rig.build(4096).await.unwrap();
    // max_streams 3: the root and two forks.
    let first = envelope.execution_context().unwrap();
    let _second = envelope.execution_context().unwrap();
    assert_eq!(
        envelope.execution_context().unwrap_err(),
        EnvelopeError::StreamBound { max_streams: 3 }
    );
    drop(first);
    let _third = envelope.execution_context().unwrap();

    let read = envelope.try_source_permit().unwrap();
    let _read2 = envelope.try_source_permit().unwrap();
    assert_eq!(
        envelope.try_source_permit().unwrap_err(),
        EnvelopeError::SourceWorkExhausted { allowance: 2 }
    );
    drop(read);
    assert!(envelope.try_source_permit().is_ok());
}

#[tokio::test]
async fn streams_waiting_to_be_destroyed_are_bounded_too() {
    let rig = Rig::new();
    let envelope = rig.build(4096).await.unwrap();
    // The worker stops inside the first fork's destroy; later destroys
    // queue behind it.
    let gate = rig.sim.gate(BackendOp::DestroyStream);
    drop(envelope.execution_context().unwrap());
    assert!(gate.reached());
    // max_streams 3: two live forks, and as many dropped ones waiting to
    // be destroyed; a dropped context frees its live place at once.
    drop(envelope.execution_context().unwrap());
    drop(envelope.execution_context().unwrap());
    assert_eq!(envelope.execution_contexts(), 0);
    assert_eq!(
        envelope.execution_context().unwrap_err(),
        EnvelopeError::StreamBound { max_streams: 3 },
        "three destroys pending: the device holds streams no context counts"
    );
    gate.open();
    // The worker's queue is FIFO: a job after the destroys runs after them.
    rig.worker.submit(|| ()).await.unwrap();
    let again = envelope.execution_context().unwrap();
    drop(again);
    let report = envelope.teardown().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    rig.assert_baseline();
}

#[tokio::test]
async fn zero_bounds_are_rejected_before_any_backend_call() {
    let rig = Rig::new();
    let spec = rig.spec(
        4096,
        AttemptBounds {
            max_streams: 0,
            ..bounds()
        },
    );
    let error = AdmissionEnvelope::build(rig.backend.clone(), rig.worker.clone(), spec)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        BuildError::InvalidBounds {
            field: "max_streams",
            value: 0
        }
    );
    assert!(rig.sim.ops().is_empty());
}

#[tokio::test]
async fn a_sticky_sync_fault_surfaces_with_device_isolation() {
    let rig = Rig::new();
    let envelope = rig.build(1 << 20).await.unwrap();
    let ctx = envelope.execution_context().unwrap();
    ctx.alloc(1000).unwrap();
    drop(ctx);
    rig.sim.inject_sync_fault(DEVICE, 700);
    let report = envelope.teardown().await;
    assert_eq!(report.disposition, Disposition::DeviceFault);
    assert_eq!(
        report.finding,
        DeviceFinding::Faulted {
            op: Synchronize,
            code: 700,
            isolation: FaultIsolation::Device(DEVICE)
        }
    );
    assert_eq!(
        report.fault_isolation(),
        Some(FaultIsolation::Device(DEVICE))
    );
    // Sticky: every later call on the device reports the same code.
    assert!(report
        .errors
        .iter()
        .all(|e| matches!(e, BackendError::Fault { code: 700, .. })));
    assert_eq!(rig.sim.sticky_fault(DEVICE), Some(700));
    rig.assert_baseline();
    // The next build on the device fails at once with the fault. On its
    // own it proves nothing about the fault's reach (it failed before any
    // stream existed to synchronize); in a service the device is already
    // quarantined by the teardown above, so no build gets this far.
    let error = rig.build(4096).await.unwrap_err();
    assert_eq!(error.fault(), Some(FaultIsolation::Unknown));
    rig.assert_baseline();
}

#[tokio::test]
async fn teardown_waits_for_idle_contexts_then_releases_in_reverse_order() {
    let rig = Rig::new();
    let envelope = rig.build(1 << 20).await.unwrap();
    let ctx = envelope.execution_context().unwrap();
    ctx.alloc(512).unwrap();
    rig.sim.clear_log();
    let mut teardown = Box::pin(envelope.teardown());
    assert!(futures::poll!(&mut teardown).is_pending());
    rig.drain_worker().await;
    assert!(
        rig.sim.ops().is_empty(),
        "nothing is released while a context lives"
    );
    drop(ctx);
    let report = teardown.await;
    assert_eq!(
        rig.sim.ops(),
        vec![
            DestroyStream, // the fork, queued when its context dropped
            Synchronize,
            Free, // the leaked allocation
            CloseWorkerScope,
            LeaveDomain,
            CloseDomain,
            DestroyStream,
            CloseLane,
        ]
    );
    assert_eq!(report.disposition, Disposition::Clean);
    assert_eq!(report.finding, DeviceFinding::Clean);
    assert!(!report.implicit);
    assert_eq!(report.leaked.bytes, 512);
    assert_eq!(report.peak_bytes, 512);
    rig.assert_baseline();
}

#[tokio::test]
async fn dropping_an_envelope_queues_its_teardown_on_the_worker() {
    let mut rig = Rig::new();
    let envelope = rig.build(1 << 20).await.unwrap();
    let ctx = envelope.execution_context().unwrap();
    ctx.alloc(300).unwrap();
    drop(envelope);
    // The context still holds the attempt: nothing is torn down yet.
    rig.drain_worker().await;
    assert!(rig.reports.try_recv().is_err());
    drop(ctx);
    let report = rig.reports.recv().await.unwrap();
    assert!(report.implicit);
    assert_eq!(report.disposition, Disposition::Clean);
    assert_eq!(report.leaked.allocations.len(), 1);
    rig.assert_baseline();
}

#[tokio::test]
async fn a_gone_worker_is_a_typed_error_with_unknown_isolation() {
    let rig = Rig::new();
    rig.worker.shutdown();
    let error = rig.build(4096).await.unwrap_err();
    assert!(matches!(error, BuildError::WorkerGone(_)));
    assert_eq!(error.fault(), Some(FaultIsolation::Unknown));
    assert!(rig.sim.ops().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_parked_teardown_does_not_time_out_on_its_own() {
    // Teardown waits on the contexts, not on a clock: with time paused and
    // advanced far, it is still waiting until the context drops.
    let rig = Rig::new();
    let envelope = rig.build(4096).await.unwrap();
    let ctx = envelope.execution_context().unwrap();
    let mut teardown = Box::pin(envelope.teardown());
    assert!(futures::poll!(&mut teardown).is_pending());
    tokio::time::advance(std::time::Duration::from_secs(3600)).await;
    assert!(futures::poll!(&mut teardown).is_pending());
    drop(ctx);
    assert_eq!(teardown.await.disposition, Disposition::Clean);
    rig.assert_baseline();
}
