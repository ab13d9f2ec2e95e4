//! The query service end to end on simulated devices: tickets and proofs,
//! the envelope transaction (failure at every step, cancellation at every
//! stage), release and drop, quarantine, close and observations.

mod gpu_rig;

use std::sync::Arc;

use admission::gpu::backend::sim::{SimBackend, SimDevice};
use admission::gpu::backend::{BackendError, BackendOp, FaultIsolation};
use admission::gpu::{BuildStep, DeviceFinding, Disposition};
use admission::gpu::{
    DeviceSet, GpuAdmitError, LedgerState, MemoryOwnership, ObservationKind, ProofIssuer,
    QueryAdmissionOutcome, QueryService, ReinstateError, ServiceError,
};
use futures::poll;
use gpu_rig::*;

fn one_device(slots: u32) -> Rig {
    Rig::new(vec![profile(0, 16, slots, &["hash_join"])], bounds(16, 4))
}

#[test]
fn construction_needs_every_profiled_ordinal_in_the_inventory() {
    let sim = Arc::new(SimBackend::new([SimDevice::new(0, 16 * GIB)]));
    let profiles = vec![profile(0, 16, 2, &[]), profile(2, 16, 2, &[])];
    let ownerships = vec![
        MemoryOwnership::exclusive(dev(0)),
        MemoryOwnership::exclusive(dev(2)),
    ];
    let devices = DeviceSet::new(profiles, ownerships).unwrap();
    let error = QueryService::builder(sim, devices, bounds(4, 1))
        .build()
        .unwrap_err();
    assert_eq!(
        error,
        ServiceError::DeviceNotInstalled {
            ordinal: dev(2),
            installed: vec![dev(0)],
        }
    );
}

#[tokio::test]
async fn a_lazy_ticket_reserves_nothing_and_a_foreign_proof_is_refused() {
    let rig = one_device(2);
    rig.sim.clear_log(); // construction listed the inventory
    let before = rig.reports();
    let proof = rig.proof(1, GIB, &["hash_join"]);
    let ticket = rig.service.ticket(&proof).unwrap();
    // Planning only (an explain): the ticket is dropped unused.
    drop(ticket);
    let snapshot = rig.service.admission_snapshot();
    assert_eq!(snapshot.queued + snapshot.pending_preflights, 0);
    assert_eq!(rig.reports(), before);
    assert!(rig.sim.ops().is_empty(), "no backend call");
    assert!(rig.observed.lock().unwrap().is_empty(), "nothing submitted");

    let foreign = ProofIssuer::new()
        .lower(&admission::gpu::PlanDescription::new(
            admission::gpu::PlanFingerprint(1),
        ))
        .unwrap();
    let error = rig.service.ticket(&foreign).unwrap_err();
    assert!(matches!(error, GpuAdmitError::ForeignProof { .. }));
    assert_eq!(error.outcome(), QueryAdmissionOutcome::Capability);
}

#[tokio::test]
async fn a_proof_ticket_admits_one_device_one_grant_and_release_returns_everything() {
    let started = std::time::Instant::now();
    let rig = one_device(2);
    let proof = rig.proof(7, 3 * GIB, &["hash_join"]);
    let handle = rig
        .service
        .ticket(&proof)
        .unwrap()
        .with_working_set_hint(5 * GIB)
        .admit()
        .await
        .unwrap();
    assert_eq!(handle.device(), dev(0));
    assert_eq!(handle.grant_bytes(), 5 * GIB);
    assert_eq!(handle.required_floor(), 3 * GIB);
    assert_eq!(handle.grant_bytes(), 5 * GIB);
    handle.authorize(&proof).unwrap();
    let r = rig.report(0);
    assert_eq!((r.live_grant_count, r.live_grants_bytes), (1, 5 * GIB));

    // The envelope's bounds come from the profile: two streams (root + one
    // context) and two source reads.
    let ctx = handle.execution_context().unwrap();
    assert!(handle.execution_context().is_err());
    let ptr = ctx.alloc(GIB).unwrap();
    ctx.free(ptr).unwrap();
    let permits = (
        handle.try_source_permit().unwrap(),
        handle.try_source_permit().unwrap(),
    );
    assert!(handle.try_source_permit().is_err());
    drop(permits);
    drop(ctx);

    let report = handle.release().await;
    assert!(report.ledger_released);
    assert_eq!(report.disposition, Disposition::Clean);
    assert_eq!(report.finding, DeviceFinding::Clean);
    assert_eq!(report.plan, Some(proof.fingerprint()));
    assert_eq!(report.grant_bytes, 5 * GIB);
    // Held from publication to the end of teardown: within the test's own
    // span, never zero.
    assert!(report.held > std::time::Duration::ZERO);
    assert!(report.held <= started.elapsed());
    rig.assert_idle();
    assert_eq!(
        rig.kinds_of(report.waiter.get()),
        vec![
            ObservationKind::Submitted,
            ObservationKind::Queued,
            ObservationKind::Admitted,
            ObservationKind::Published,
            ObservationKind::Sealed,
            ObservationKind::Released,
        ]
    );
}

#[tokio::test]
async fn a_resource_only_handle_cannot_authorize_a_plan_and_a_handle_authorizes_only_its_own() {
    let rig = one_device(3);
    let proof = rig.proof(1, GIB, &[]);
    let manual = rig.service.resource_ticket(GIB).admit().await.unwrap();
    assert!(
        manual.proof().is_none(),
        "a resource-only admission carries no proof"
    );
    let error = manual.authorize(&proof).unwrap_err();
    assert_eq!(error, GpuAdmitError::ResourceOnlyHandle);
    assert_eq!(error.outcome(), QueryAdmissionOutcome::Capability);

    let handle = rig.service.ticket(&proof).unwrap().admit().await.unwrap();
    handle.authorize(&proof).unwrap();
    let other = rig.proof(2, GIB, &[]);
    assert!(matches!(
        handle.authorize(&other),
        Err(GpuAdmitError::ProofMismatch { .. })
    ));
    let foreign = ProofIssuer::new()
        .lower(&admission::gpu::PlanDescription::new(proof.fingerprint()))
        .unwrap();
    assert!(matches!(
        handle.authorize(&foreign),
        Err(GpuAdmitError::ForeignProof { .. })
    ));
    manual.release().await;
    handle.release().await;
    rig.assert_idle();
}

#[tokio::test]
async fn the_admitted_proof_is_bound_to_its_device_and_grant() {
    let rig = one_device(3);
    let proof = rig.proof(1, GIB, &[]);
    assert_eq!(
        proof.binding(),
        None,
        "the issuer's proof names no admission"
    );
    let first = rig.service.ticket(&proof).unwrap().admit().await.unwrap();
    let second = rig.service.ticket(&proof).unwrap().admit().await.unwrap();
    let bound = first.proof().expect("a plan handle").clone();
    let binding = bound.binding().expect("bound at publication");
    assert_eq!(
        (binding.device, binding.grant),
        (first.device(), first.grant_id())
    );
    first.authorize(&bound).unwrap();
    // The same plan, admitted twice: the first admission's proof does not
    // authorize the second handle, whose grant is another.
    assert_eq!(
        second.authorize(&bound),
        Err(GpuAdmitError::ProofBoundElsewhere {
            device: binding.device,
            grant: binding.grant,
        })
    );
    assert_eq!(
        second.authorize(&bound).unwrap_err().outcome(),
        QueryAdmissionOutcome::Capability
    );
    second.authorize(&proof).unwrap();
    first.release().await;
    second.release().await;
    rig.assert_idle();
}

#[tokio::test]
async fn a_service_built_without_handing_out_its_issuer_accepts_no_proof() {
    let sim = Arc::new(SimBackend::new([SimDevice::new(0, 64 * GIB)]));
    let devices = DeviceSet::new(
        vec![profile(0, 16, 2, &[])],
        vec![MemoryOwnership::exclusive(dev(0))],
    )
    .unwrap();
    let service = QueryService::builder(sim, devices, bounds(4, 1))
        .build()
        .unwrap();
    // Whoever holds the service holds no issuer: a proof from any issuer,
    // including one made in the same process, is foreign to it.
    let proof = ProofIssuer::new()
        .lower(&admission::gpu::PlanDescription::new(
            admission::gpu::PlanFingerprint(7),
        ))
        .unwrap();
    assert!(matches!(
        service.ticket(&proof),
        Err(GpuAdmitError::ForeignProof { .. })
    ));
    // Resource-only admission still works.
    service
        .resource_ticket(GIB)
        .admit()
        .await
        .unwrap()
        .release()
        .await;
}

#[tokio::test]
async fn a_composed_proof_is_one_ticket_one_device_one_grant() {
    let rig = one_device(3);
    let issuer = &rig.issuer;
    let producer = rig.proof(1, 2 * GIB, &[]);
    let consumer = rig.proof(2, 3 * GIB, &["hash_join"]);
    let composed = issuer
        .compose(std::slice::from_ref(&producer), &consumer)
        .unwrap();
    let handle = rig
        .service
        .ticket(&composed)
        .unwrap()
        .admit()
        .await
        .unwrap();
    handle.authorize(&composed).unwrap();
    assert!(handle.authorize(&consumer).is_err());
    assert_eq!(handle.required_floor(), 3 * GIB);
    assert_eq!(rig.report(0).live_grant_count, 1);
    handle.release().await;
    rig.assert_idle();
}

#[tokio::test]
async fn impossible_requests_are_rejected_at_once_and_never_queued() {
    let rig = one_device(2);
    let needs_gpu_sort = rig.proof(1, GIB, &["gpu_sort"]);
    let error = rig
        .service
        .ticket(&needs_gpu_sort)
        .unwrap()
        .admit()
        .await
        .unwrap_err();
    assert!(matches!(error, GpuAdmitError::NoCapableDevice { .. }));
    assert_eq!(error.outcome(), QueryAdmissionOutcome::Capability);

    // 16 GiB, two slots, 2 GiB floor: at most 14 GiB for one attempt.
    let error = rig
        .service
        .resource_ticket(15 * GIB)
        .admit()
        .await
        .unwrap_err();
    assert!(matches!(error, GpuAdmitError::FloorNeverFits { .. }));
    assert_eq!(error.outcome(), QueryAdmissionOutcome::Configuration);

    let observed = rig.observed.lock().unwrap().clone();
    assert!(observed.iter().all(|o| o.kind != ObservationKind::Queued));
    assert_eq!(
        observed
            .iter()
            .filter(|o| o.kind == ObservationKind::Rejected)
            .count(),
        2
    );
    drop(observed);
    rig.assert_idle();
}

fn driver_error(op: BackendOp) -> BackendError {
    BackendError::Driver {
        op,
        code: 1,
        message: "invalid value".into(),
    }
}

#[tokio::test]
async fn an_envelope_failure_at_each_step_releases_the_grant_and_publishes_nothing() {
    for step in BuildStep::ALL {
        let rig = one_device(2);
        let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
        let before = rig.reports();
        rig.sim.fail_nth(step.op(), 1, driver_error(step.op()));
        let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
        assert_eq!(
            error,
            GpuAdmitError::EnvelopeStepFailed {
                step: step.op(),
                error: driver_error(step.op()),
            },
            "{step:?}"
        );
        assert_eq!(error.outcome(), QueryAdmissionOutcome::DeviceFault);
        assert_eq!(
            rig.reports(),
            before,
            "ledger back to its prior state at {step:?}"
        );
        let kinds = rig.kinds_of(2);
        assert!(
            kinds.contains(&ObservationKind::EnvelopeFailed),
            "{kinds:?}"
        );
        assert!(!kinds.contains(&ObservationKind::Published));
        held.release().await;
        rig.assert_idle();
    }
}

#[tokio::test]
async fn a_fault_outside_a_stream_sync_while_building_closes_every_ledger() {
    let rig = Rig::new(
        vec![profile(0, 16, 2, &[]), profile(1, 16, 2, &[])],
        bounds(8, 4),
    );
    // A sticky code on the first step proves nothing about its reach, even
    // when the backend calls it device-local: only a synchronization does,
    // and no stream exists yet whose synchronization could. (A fault on a
    // later step is proven by the rollback's synchronization of the root
    // stream, and quarantines: see the envelope's tests.)
    rig.sim.fail_nth(
        BackendOp::OpenLane,
        1,
        BackendError::Fault {
            op: BackendOp::OpenLane,
            code: 700,
            isolation: FaultIsolation::Device(dev(0)),
        },
    );
    let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
    assert_eq!(error.outcome(), QueryAdmissionOutcome::DeviceFault);
    for r in rig.reports() {
        assert_eq!(r.state, LedgerState::Closed, "{r:?}");
        assert_eq!((r.live_grant_count, r.active_attempts), (0, 0));
    }
    assert!(matches!(
        rig.service.resource_ticket(GIB).admit().await,
        Err(GpuAdmitError::NoHealthyDevice { .. })
    ));
}

#[tokio::test]
async fn a_fault_outside_a_stream_sync_at_release_closes_every_ledger() {
    let rig = Rig::new(
        vec![profile(0, 16, 2, &[]), profile(1, 16, 2, &[])],
        bounds(8, 4),
    );
    let handle = rig.service.resource_ticket(GIB).admit().await.unwrap();
    rig.sim.fail_nth(
        BackendOp::CloseDomain,
        1,
        BackendError::Fault {
            op: BackendOp::CloseDomain,
            code: 700,
            isolation: FaultIsolation::Device(handle.device()),
        },
    );
    let report = handle.release().await;
    assert!(report.ledger_released);
    // Sealed before destruction: the synchronization was clean.
    assert_eq!(report.disposition, Disposition::Clean);
    assert_eq!(report.teardown.disposition, Disposition::DeviceFault);
    for r in rig.reports() {
        assert_eq!(r.state, LedgerState::Closed, "{r:?}");
    }
}

#[tokio::test]
async fn a_quarantined_device_is_reinstated_only_after_its_probe_passes() {
    let rig = one_device(2);
    let handle = rig.service.resource_ticket(GIB).admit().await.unwrap();
    rig.sim.inject_sync_fault(dev(0), 700);
    handle.release().await;
    assert_eq!(rig.report(0).state, LedgerState::Quarantined { code: 700 });

    // The device still faults: the probe fails and nothing changes.
    let error = rig.service.reinstate(dev(0)).await.unwrap_err();
    assert!(
        matches!(error, ReinstateError::ProbeFailed { device, .. } if device == dev(0)),
        "{error}"
    );
    assert_eq!(rig.report(0).state, LedgerState::Quarantined { code: 700 });
    assert_eq!(
        rig.service.reinstate(dev(5)).await,
        Err(ReinstateError::NoSuchDevice { device: dev(5) })
    );

    // After the operator's reset the probe passes and grants flow again.
    rig.sim.reset_device(dev(0));
    rig.service.reinstate(dev(0)).await.unwrap();
    assert_eq!(rig.report(0).state, LedgerState::Admitting);
    assert!(rig
        .observed
        .lock()
        .unwrap()
        .iter()
        .any(|o| o.kind == ObservationKind::Reinstated && o.device == Some(0)));
    let handle = rig.service.resource_ticket(GIB).admit().await.unwrap();
    assert_eq!(handle.device(), dev(0));
    handle.release().await;
    assert_eq!(
        rig.service.reinstate(dev(0)).await,
        Err(ReinstateError::NotQuarantined {
            device: dev(0),
            health: LedgerState::Admitting
        })
    );

    // A closed ledger is the whole backend's verdict: not reinstated.
    rig.service.close();
    assert!(matches!(
        rig.service.reinstate(dev(0)).await,
        Err(ReinstateError::NotQuarantined {
            health: LedgerState::Closed,
            ..
        })
    ));
    rig.assert_idle();
}

#[tokio::test]
async fn cancelling_while_queued_returns_everything() {
    let rig = one_device(1);
    let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let before = rig.reports();
    let mut queued = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut queued).is_pending());
    assert_eq!(rig.service.admission_snapshot().queued, 1);
    drop(queued);
    let snapshot = rig.service.admission_snapshot();
    assert_eq!((snapshot.queued, snapshot.pending_preflights), (0, 0));
    assert_eq!(rig.reports(), before);
    held.release().await;
    rig.assert_idle();
}

#[tokio::test]
async fn cancelling_after_the_grant_before_it_is_observed_releases_it() {
    let rig = one_device(1);
    let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let mut waiting = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut waiting).is_pending());
    held.release().await;
    // The release granted the waiter, whose future has not run since.
    let snapshot = rig.service.admission_snapshot();
    assert_eq!(snapshot.granted_unobserved, 1);
    assert_eq!(rig.report(0).live_grant_count, 1);
    drop(waiting);
    assert_eq!(rig.service.admission_snapshot().granted_unobserved, 0);
    rig.assert_idle();
}

#[tokio::test]
async fn cancelling_during_the_envelope_build_rolls_back_then_releases() {
    let rig = one_device(2);
    let before = rig.reports();
    let gate = rig.sim.gate(BackendOp::OpenDomain);
    let mut building = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut building).is_pending());
    assert!(gate.reached(), "the build is at step 3");
    assert_eq!(rig.report(0).live_grant_count, 1);
    drop(building);
    gate.open();
    rig.service.settle().await;
    assert_eq!(rig.reports(), before);
    rig.assert_idle();
}

#[tokio::test]
async fn a_dropped_handle_releases_its_grant_after_its_teardown() {
    let rig = one_device(2);
    let handle = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let ctx = handle.execution_context().unwrap();
    drop(handle);
    rig.service.settle().await;
    // A live execution context keeps the envelope and so the grant.
    assert_eq!(rig.report(0).live_grant_count, 1);
    drop(ctx);
    rig.service.settle().await;
    rig.assert_idle();
    let kinds: Vec<_> = rig.kinds_of(1);
    assert_eq!(kinds.last(), Some(&ObservationKind::Released));
}

#[tokio::test]
async fn a_sync_fault_at_release_quarantines_in_flight_work_drains_and_waiters_get_their_outcome() {
    let rig = Rig::new(
        vec![profile(0, 16, 2, &["x"]), profile(1, 16, 2, &[])],
        bounds(8, 4),
    );
    let needs_x = rig.proof(1, GIB, &["x"]);
    let a = rig.service.ticket(&needs_x).unwrap().admit().await.unwrap();
    let b = rig.service.ticket(&needs_x).unwrap().admit().await.unwrap();
    assert_eq!((a.device(), b.device()), (dev(0), dev(0)));
    let mut only_x = Box::pin(rig.service.ticket(&needs_x).unwrap().admit());
    assert!(poll!(&mut only_x).is_pending());

    rig.sim.inject_sync_fault(dev(0), 700);
    let report = a.release().await;
    assert!(report.ledger_released);
    assert_eq!(report.disposition, Disposition::DeviceFault);
    assert_eq!(rig.report(0).state, LedgerState::Quarantined { code: 700 });
    let error = only_x.await.unwrap_err();
    assert_eq!(
        error,
        GpuAdmitError::NoHealthyDevice {
            devices: vec![dev(0)]
        }
    );
    assert_eq!(error.outcome(), QueryAdmissionOutcome::DeviceFault);

    // The other in-flight handle drains normally; nothing new is granted
    // on the quarantined device.
    assert_eq!(rig.report(0).live_grant_count, 1);
    let report = b.release().await;
    assert!(report.ledger_released);
    assert_eq!(rig.report(0).live_grant_count, 0);
    let error = rig
        .service
        .ticket(&needs_x)
        .unwrap()
        .admit()
        .await
        .unwrap_err();
    assert!(matches!(error, GpuAdmitError::NoHealthyDevice { .. }));
    let elsewhere = rig.service.resource_ticket(GIB).admit().await.unwrap();
    assert_eq!(elsewhere.device(), dev(1));
    elsewhere.release().await;
    assert!(rig
        .observed
        .lock()
        .unwrap()
        .iter()
        .any(|o| o.kind == ObservationKind::Quarantined && o.code == Some(700)));
}

#[tokio::test]
async fn close_fails_waiters_and_new_submissions_while_handles_drain() {
    let rig = one_device(1);
    let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let mut queued = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut queued).is_pending());
    rig.service.close();
    assert_eq!(queued.await.unwrap_err(), GpuAdmitError::Closed);
    let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
    assert_eq!(error, GpuAdmitError::Closed);
    assert_eq!(error.outcome(), QueryAdmissionOutcome::Closed);
    assert_eq!(rig.report(0).state, LedgerState::Closed);
    let report = held.release().await;
    assert!(report.ledger_released);
    rig.assert_idle();
    assert!(rig.service.admission_snapshot().closed);
}

#[cfg(feature = "config")]
#[tokio::test]
async fn observations_are_written_as_jsonl() {
    use std::io::Write;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let buffer = Buffer::default();
    let writer = buffer.clone();
    let rig = Rig::with(vec![profile(0, 16, 2, &[])], bounds(4, 1), |b| {
        b.observer(admission::gpu::jsonl_observer(writer))
    });
    let handle = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let grant = handle.grant_bytes();
    handle.release().await;
    let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "submitted",
            "queued",
            "admitted",
            "published",
            "sealed",
            "released"
        ]
    );
    assert_eq!(lines[2]["device"], 0);
    assert_eq!(lines[2]["grant_bytes"], grant);
    assert_eq!(lines[2]["waiter"], 1);
}

/// Device 0 with room for resident cache: 16 GiB, two attempts of two
/// streams each, a 14 GiB cache cap.
fn cache_profile() -> admission::gpu::DeviceProfile {
    admission::gpu::DeviceProfile::builder(dev(0))
        .managed_capacity(16 * GIB)
        .max_active_attempts(2)
        .streams_per_attempt(2)
        .cache_cap(14 * GIB)
        .build()
        .unwrap()
}

/// Resident cache sits in the same arithmetic as grants: charged (or
/// pinned) cache holds a waiter back, and evicting it admits the waiter at
/// once, through the service's own transaction.
#[tokio::test]
async fn an_evictor_is_asked_for_exactly_the_bytes_the_oldest_waiter_lacks() {
    use admission::gpu::{CacheChange, EvictionRequest};

    let with_cache = cache_profile();
    let asked: Arc<std::sync::Mutex<Vec<(u32, u64)>>> = Arc::default();
    let log = asked.clone();
    let rig = Rig::with(vec![with_cache], bounds(16, 4), move |builder| {
        builder.evictor(dev(0), move |request: &EvictionRequest| {
            log.lock().unwrap().push((request.device.0, request.bytes));
        })
    });
    let asked = || asked.lock().unwrap().clone();
    // 16 GiB, floor 2 GiB: 13 GiB of cache leave 16 - 13 - 2 (one open
    // slot's floor) = 1 GiB; a 3 GiB floor lacks exactly 2 GiB.
    rig.service
        .change_cache(dev(0), CacheChange::Charge(13 * GIB))
        .unwrap();
    let mut older = Box::pin(rig.service.resource_ticket(3 * GIB).admit());
    assert!(poll!(older.as_mut()).is_pending());
    assert_eq!(asked(), [(0, 2 * GIB)]);

    // A younger waiter's transaction asks nothing more: the older one is
    // still the oldest, and its 2 GiB are asked for already.
    let mut younger = Box::pin(rig.service.resource_ticket(3 * GIB).admit());
    assert!(poll!(younger.as_mut()).is_pending());
    assert_eq!(asked(), [(0, 2 * GIB)]);

    // The owner evicts what it was asked for and says so: the older waiter
    // is admitted by that change's own pass, and the younger, now the
    // oldest, lacks 3 - (16 - 3 - 11) = 1 GiB.
    rig.service
        .change_cache(dev(0), CacheChange::Evict(2 * GIB))
        .unwrap();
    let older = older.await.unwrap();
    assert_eq!(older.grant_bytes(), 3 * GIB);
    assert_eq!(asked(), [(0, 2 * GIB), (0, GIB)]);
    rig.service
        .change_cache(dev(0), CacheChange::Evict(GIB))
        .unwrap();
    let younger = younger.await.unwrap();
    assert!(rig
        .observed
        .lock()
        .unwrap()
        .iter()
        .any(|o| o.kind == ObservationKind::EvictionRequested && o.grant_bytes == Some(2 * GIB)));
    older.release().await;
    younger.release().await;
    rig.service
        .change_cache(dev(0), CacheChange::Evict(10 * GIB))
        .unwrap();
    rig.assert_idle();
}

#[tokio::test]
async fn evicting_cache_admits_the_waiter_it_held_back() {
    use admission::gpu::{CacheChange, LedgerError};

    let with_cache = cache_profile();
    let rig = Rig::new(vec![with_cache], bounds(16, 4));
    // 16 GiB, floor 2 GiB: 13 GiB of cache leave 16 - 13 - 2 (one open
    // slot's floor) = 1 GiB, below the floor.
    rig.service
        .change_cache(dev(0), CacheChange::Charge(13 * GIB))
        .unwrap();
    let mut waiting = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(waiting.as_mut()).is_pending());

    rig.service
        .change_cache(dev(0), CacheChange::Pin(GIB))
        .unwrap();
    assert!(
        poll!(waiting.as_mut()).is_pending(),
        "pinned cache counts too"
    );
    rig.service
        .change_cache(dev(0), CacheChange::Unpin(GIB))
        .unwrap();
    let report = rig.report(0);
    assert_eq!(
        (report.cache_evictable_bytes, report.cache_pinned_bytes),
        (13 * GIB, 0)
    );

    rig.service
        .change_cache(dev(0), CacheChange::Evict(GIB))
        .unwrap();
    let handle = waiting.await.unwrap();
    assert_eq!(handle.grant_bytes(), 2 * GIB, "max_new, exactly the floor");

    assert_eq!(
        rig.service.change_cache(dev(9), CacheChange::Charge(1)),
        Err(LedgerError::NoSuchDevice { device: dev(9) })
    );
    assert!(matches!(
        rig.service
            .change_cache(dev(0), CacheChange::Evict(100 * GIB)),
        Err(LedgerError::CacheUnderflow { .. })
    ));
    handle.release().await;
    rig.service
        .change_cache(dev(0), CacheChange::Evict(12 * GIB))
        .unwrap();
    rig.assert_idle();
}
