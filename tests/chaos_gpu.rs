//! The GPU service under hostile callers and callbacks: panicking observers,
//! preflights, teardown hooks and backends, and absurd values at every
//! public setter. After each, the service still admits new work on idle
//! devices, every ledger drains to zero, and the panic is counted.

mod gpu_rig;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use admission::gpu::backend::sim::{SimBackend, SimDevice};
use admission::gpu::backend::{BackendError, BackendOp};
use admission::gpu::BuildStep;
use admission::gpu::{
    CacheChange, DeviceSet, GpuAdmitError, LedgerError, LedgerState, MemoryOwnership, Observation,
    ObservationKind, PreflightFuture, PreflightRequest, QueryService, QueueBounds,
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

/// Panics caught so far in `component`, from the service's snapshot.
fn panics_of(service: &QueryService, component: &str) -> u64 {
    let health = service.admission_snapshot().health;
    health
        .iter()
        .find(|h| h.component == component)
        .unwrap_or_else(|| panic!("no {component} in {health:?}"))
        .panics
}

/// New work is admitted and released on the idle device, and every ledger
/// is back to zero.
async fn still_admits(rig: &Rig) {
    let handle = rig
        .service
        .resource_ticket(GIB)
        .admit()
        .await
        .expect("an idle device admits new work");
    let report = handle.release().await;
    assert!(report.ledger_released);
    rig.service.settle().await;
    rig.assert_idle();
    for r in rig.reports() {
        assert_eq!(r.state, LedgerState::Admitting, "{r:?}");
    }
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

#[tokio::test(start_paused = true)]
async fn an_observer_panicking_on_submitted_leaves_no_pending_barrier() {
    let armed = Arc::new(AtomicBool::new(true));
    let observer = panicking_on(ObservationKind::Submitted, armed.clone());
    let rig = Rig::with(
        vec![profile(0, 16, 2, &["hash_join"])],
        bounds(16, 4),
        |b| b.observer(observer),
    );
    // Whatever the first submission makes of its observer's panic, it must
    // not leave a pending reservation behind.
    let first = tokio::spawn(rig.service.resource_ticket(GIB).admit());
    if let Ok(Ok(handle)) = first.await {
        handle.release().await;
    }
    armed.store(false, Ordering::SeqCst);
    assert_eq!(rig.service.admission_snapshot().pending_preflights, 0);
    // An idle device admits at once; a barrier left behind would hold this
    // until the queue's max_wait, which the paused clock runs to at once:
    // a DeadlineExceeded, not a hang.
    let next = rig
        .service
        .resource_ticket(GIB)
        .admit()
        .await
        .expect("admitted past no barrier");
    next.release().await;
    still_admits(&rig).await;
    assert_eq!(panics_of(&rig.service, "gpu_observer"), 1);
}

#[tokio::test]
async fn an_observer_panicking_on_the_worker_thread_does_not_kill_it() {
    let armed = Arc::new(AtomicBool::new(true));
    // `Released` is delivered on the device worker, right after teardown.
    let observer = panicking_on(ObservationKind::Released, armed.clone());
    let rig = Rig::with(
        vec![profile(0, 16, 2, &["hash_join"])],
        bounds(16, 4),
        |b| b.observer(observer),
    );
    let handle = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let report = handle.release().await;
    assert!(report.ledger_released);
    armed.store(false, Ordering::SeqCst);
    still_admits(&rig).await;
    assert_eq!(panics_of(&rig.service, "gpu_observer"), 1);
    assert_eq!(panics_of(&rig.service, "gpu_device_worker"), 0);
}

#[tokio::test]
async fn an_observer_panicking_on_every_record_never_changes_an_outcome() {
    let observer = |_: &Observation| panic!("observer panics on everything");
    let rig = Rig::with(
        vec![profile(0, 16, 1, &["hash_join"])],
        bounds(16, 0),
        |b| b.observer(observer),
    );
    // Submitted, queued, admitted, published, protected, removed, released,
    // rejected, quarantined: every kind goes through the panicking observer.
    let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let mut queued = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(futures::poll!(&mut queued).is_pending());
    drop(queued);
    let never = rig
        .service
        .resource_ticket(1 << 62)
        .admit()
        .await
        .unwrap_err();
    assert!(matches!(never, GpuAdmitError::FloorNeverFits { .. }));
    held.release().await;
    still_admits(&rig).await;
    assert!(panics_of(&rig.service, "gpu_observer") >= 8);
    rig.service.quarantine(dev(0), 7);
    assert!(matches!(
        rig.service.resource_ticket(GIB).admit().await,
        Err(GpuAdmitError::NoHealthyDevice { .. })
    ));
    let health = rig.service.admission_snapshot().health;
    let observer = health
        .iter()
        .find(|h| h.component == "gpu_observer")
        .unwrap();
    assert!(!observer.is_healthy());
    assert_eq!(
        observer.last_panic.as_deref(),
        Some("observer panics on everything")
    );
}

#[test]
fn a_wait_on_a_runtime_without_timers_is_a_typed_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let rig = one_device(1);
        // Admitted at once: no timer is needed.
        let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
        // This one would have to wait for its max_wait deadline.
        let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
        assert_eq!(error, GpuAdmitError::TimerUnavailable);
        assert!(error.to_string().contains("enable_time"), "{error}");
        let snapshot = rig.service.admission_snapshot();
        assert_eq!((snapshot.queued, snapshot.pending_preflights), (0, 0));
        held.release().await;
        rig.service.settle().await;
        rig.assert_idle();
        // The same wait without a deadline needs no timer.
        let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
        let unbounded = Rig::new(
            vec![profile(0, 16, 1, &[])],
            QueueBounds::new(16, Duration::MAX, 4).unwrap(),
        );
        let first = unbounded
            .service
            .resource_ticket(GIB)
            .admit()
            .await
            .unwrap();
        let mut second = Box::pin(unbounded.service.resource_ticket(GIB).admit());
        assert!(futures::poll!(&mut second).is_pending());
        first.release().await;
        second.await.unwrap().release().await;
        held.release().await;
        unbounded.service.settle().await;
        unbounded.assert_idle();
    });
}

#[test]
fn a_preflight_that_must_wait_on_a_runtime_without_timers_is_a_typed_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let rig = Rig::with(vec![profile(0, 16, 1, &[])], bounds(16, 4), |b| {
            b.preflight(|_| {
                Box::pin(async {
                    tokio::task::yield_now().await;
                    Ok(())
                })
            })
        });
        let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
        assert_eq!(error, GpuAdmitError::TimerUnavailable);
        assert_eq!(rig.service.admission_snapshot().pending_preflights, 0);
        rig.assert_idle();
    });
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
    let outcome = tokio::spawn(rig.service.resource_ticket(GIB).admit()).await;
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
    rig.assert_idle();
    assert_eq!(panics_of(&rig.service, "gpu_preflight"), 1);
    armed.store(false, Ordering::SeqCst);
    still_admits(&rig).await;
    let health = rig.service.admission_snapshot().health;
    let preflight = health
        .iter()
        .find(|h| h.component == "gpu_preflight")
        .unwrap();
    assert!(preflight.is_healthy(), "a passing preflight ends the run");
}

#[tokio::test]
async fn a_preflight_panicking_when_called_is_a_failed_preflight() {
    a_panicking_preflight_is_a_failed_preflight(false).await;
}

#[tokio::test]
async fn a_preflight_future_panicking_when_polled_is_a_failed_preflight() {
    a_panicking_preflight_is_a_failed_preflight(true).await;
}

/// A service over a simulator told to panic in one operation at a time.
fn panicky_service() -> (Arc<SimBackend>, QueryService) {
    let backend = Arc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
    let devices = DeviceSet::new(
        vec![profile(0, 16, 2, &[])],
        vec![MemoryOwnership::exclusive(dev(0))],
    )
    .unwrap();
    let service = QueryService::builder(backend.clone(), devices, bounds(16, 4))
        .build()
        .unwrap();
    (backend, service)
}

/// Nothing granted or running on any ledger.
fn ledgers_idle(service: &QueryService) {
    for r in service.ledger_snapshots() {
        assert_eq!(r.live_grants_bytes, 0, "{r:?}");
        assert_eq!(r.live_grant_count, 0, "{r:?}");
        assert_eq!(r.active_attempts, 0, "{r:?}");
    }
}

async fn service_still_admits(service: &QueryService) {
    let handle = service
        .resource_ticket(GIB)
        .admit()
        .await
        .expect("admits new work");
    assert!(handle.release().await.ledger_released);
    service.settle().await;
    ledgers_idle(service);
    for r in service.ledger_snapshots() {
        assert_eq!(r.state, LedgerState::Admitting, "{r:?}");
    }
}

#[tokio::test]
async fn a_backend_panicking_in_a_build_step_fails_that_attempt_only() {
    for step in BuildStep::ALL {
        let (backend, service) = panicky_service();
        backend.panic_on(Some(step.op()));
        let error = service.resource_ticket(GIB).admit().await.unwrap_err();
        assert_eq!(
            error,
            GpuAdmitError::EnvelopeStepFailed {
                step: step.op(),
                error: BackendError::Panicked { op: step.op() },
            },
            "{step:?}"
        );
        assert_eq!(panics_of(&service, "gpu_backend"), 1, "{step:?}");
        backend.panic_on(None);
        service.settle().await;
        ledgers_idle(&service);
        service_still_admits(&service).await;
        assert_eq!(backend.live_handles(), 0, "{step:?}");
    }
}

#[tokio::test]
async fn a_backend_panicking_in_teardown_still_returns_the_grant() {
    for op in [
        BackendOp::Synchronize,
        BackendOp::CloseDomain,
        BackendOp::CloseLane,
    ] {
        let (backend, service) = panicky_service();
        let handle = service.resource_ticket(GIB).admit().await.unwrap();
        backend.panic_on(Some(op));
        let report = handle.release().await;
        assert!(report.ledger_released, "{op:?}: {report:?}");
        assert!(
            report
                .teardown
                .errors
                .contains(&BackendError::Panicked { op }),
            "{op:?}: {report:?}"
        );
        assert_eq!(panics_of(&service, "gpu_backend"), 1, "{op:?}");
        backend.panic_on(None);
        service.settle().await;
        ledgers_idle(&service);
        service_still_admits(&service).await;
        assert_eq!(panics_of(&service, "gpu_device_worker"), 0);
    }
}

#[tokio::test]
async fn a_backend_panicking_on_the_caller_thread_is_a_failed_operation() {
    let (backend, service) = panicky_service();
    let handle = service.resource_ticket(GIB).admit().await.unwrap();
    backend.panic_on(Some(BackendOp::ForkStream));
    assert!(handle.execution_context().is_err());
    backend.panic_on(Some(BackendOp::Alloc));
    let ctx = {
        backend.panic_on(None);
        let ctx = handle.execution_context().unwrap();
        backend.panic_on(Some(BackendOp::Alloc));
        ctx
    };
    assert_eq!(
        ctx.alloc(4096),
        Err(BackendError::Panicked {
            op: BackendOp::Alloc
        })
    );
    // The charge taken before the backend call came back.
    assert_eq!(ctx.domain().used_bytes(), 0);
    backend.panic_on(None);
    drop(ctx);
    assert!(handle.release().await.ledger_released);
    assert_eq!(panics_of(&service, "gpu_backend"), 2);
    service_still_admits(&service).await;
}

#[test]
fn a_backend_panicking_in_its_inventory_is_a_service_error() {
    let backend = Arc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
    backend.panic_on(Some(BackendOp::Inventory));
    let devices = DeviceSet::new(
        vec![profile(0, 16, 2, &[])],
        vec![MemoryOwnership::exclusive(dev(0))],
    )
    .unwrap();
    let error = QueryService::builder(backend, devices, bounds(16, 4))
        .build()
        .unwrap_err();
    assert_eq!(
        error,
        admission::gpu::ServiceError::Inventory(BackendError::Panicked {
            op: BackendOp::Inventory
        })
    );
}

#[tokio::test]
async fn absurd_request_values_are_typed_errors_or_work() {
    let rig = Rig::new(
        vec![profile(0, 16, 2, &["hash_join"])],
        QueueBounds::new(usize::MAX, Duration::MAX, u32::MAX).unwrap(),
    );
    // A floor no device can ever hold is refused at once, never queued.
    assert!(matches!(
        rig.service.resource_ticket(u64::MAX).admit().await,
        Err(GpuAdmitError::FloorNeverFits { .. })
    ));
    // Zero is raised to the attempt floor; the largest hint is clamped.
    for hint in [0, u64::MAX] {
        let handle = rig
            .service
            .resource_ticket(0)
            .with_working_set_hint(hint)
            .admit()
            .await
            .unwrap();
        assert!(handle.grant_bytes() >= handle.required_floor());
        let ctx = handle.execution_context().unwrap();
        assert!(matches!(
            ctx.alloc(u64::MAX),
            Err(BackendError::GrantExceeded { .. })
        ));
        assert!(matches!(
            ctx.reserve(u64::MAX),
            Err(BackendError::GrantExceeded { .. })
        ));
        drop(ctx);
        assert!(handle.release().await.ledger_released);
    }
    // A capability no device has is refused at once.
    let proof = rig.proof(1, GIB, &["fp128"]);
    assert!(matches!(
        rig.service.ticket(&proof).unwrap().admit().await,
        Err(GpuAdmitError::NoCapableDevice { .. })
    ));
    // Deadlines: long past and far future.
    let now = tokio::time::Instant::now();
    let past = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
    assert_eq!(
        rig.service
            .resource_ticket(GIB)
            .with_deadline(past)
            .admit()
            .await
            .unwrap_err(),
        GpuAdmitError::DeadlinePassed
    );
    let far = now
        .checked_add(Duration::from_secs(1 << 40))
        .expect("a far-future instant");
    let handle = rig
        .service
        .resource_ticket(GIB)
        .with_deadline(far)
        .admit()
        .await
        .unwrap();
    handle.release().await;
    // Cache changes past every counter, and on devices that do not exist.
    for change in [
        CacheChange::Charge(u64::MAX),
        CacheChange::Evict(u64::MAX),
        CacheChange::Pin(u64::MAX),
        CacheChange::Unpin(u64::MAX),
    ] {
        assert!(rig.service.change_cache(dev(0), change).is_err());
        assert_eq!(
            rig.service.change_cache(dev(u32::MAX), change),
            Err(LedgerError::NoSuchDevice {
                device: dev(u32::MAX)
            })
        );
    }
    rig.service.quarantine(dev(u32::MAX), u32::MAX);
    still_admits(&rig).await;
}

#[tokio::test(start_paused = true)]
async fn cancelled_expired_and_rejected_submissions_leave_no_per_waiter_state() {
    let rig = Rig::new(
        vec![profile(0, 16, 1, &[])],
        QueueBounds::new(64, Duration::from_secs(5), 4).unwrap(),
    );
    let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    for round in 0..4 {
        let mut cancelled: Vec<_> = (0..8)
            .map(|_| Box::pin(rig.service.resource_ticket(GIB).admit()))
            .collect();
        for future in &mut cancelled {
            assert!(futures::poll!(future).is_pending());
        }
        drop(cancelled);
        let expiring: Vec<_> = (0..8)
            .map(|_| tokio::spawn(rig.service.resource_ticket(GIB).admit()))
            .collect();
        for task in expiring {
            assert!(
                matches!(
                    task.await.unwrap(),
                    Err(GpuAdmitError::DeadlineExceeded { .. })
                ),
                "round {round}"
            );
        }
        assert!(rig.service.resource_ticket(u64::MAX).admit().await.is_err());
        let snapshot = rig.service.admission_snapshot();
        assert_eq!(
            (
                snapshot.queued,
                snapshot.pending_preflights,
                snapshot.granted_unobserved,
                snapshot.waiters.len()
            ),
            (0, 0, 0, 0),
            "round {round}"
        );
    }
    held.release().await;
    still_admits(&rig).await;
}
