//! The one GPU admission queue: FIFO order, oldest-runnable selection across
//! devices, overtaking and protection (with retargeting), the pending bound
//! and the preflight barrier, and deadlines under paused time. The property
//! test of the synchronous core lives in the crate
//! (`src/gpu/scheduler_tests.rs`): the core is crate-private.

mod gpu_rig;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::gpu::{
    GpuAdmitError, LedgerState, ObservationKind, PreflightRequest, QueryAdmissionOutcome,
    QueueBounds, WaiterId,
};
use futures::poll;
use gpu_rig::*;
use tokio::sync::watch;
use tokio::time::Instant;

#[tokio::test]
async fn waiters_are_admitted_in_fifo_order() {
    let rig = Rig::new(vec![profile(0, 16, 1, &[])], bounds(8, 4));
    let mut held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let mut waiting: Vec<_> = (0..3)
        .map(|_| Box::pin(rig.service.resource_ticket(GIB).admit()))
        .collect();
    for w in &mut waiting {
        assert!(poll!(w).is_pending());
    }
    let snapshot = rig.service.admission_snapshot();
    let queued: Vec<u64> = snapshot.waiters.iter().map(|w| w.waiter.get()).collect();
    assert_eq!(queued, [2, 3, 4]);
    for w in waiting {
        held.release().await;
        held = w.await.unwrap();
    }
    held.release().await;
    assert_eq!(rig.admitted_order(), [1, 2, 3, 4]);
    rig.assert_idle();
}

#[tokio::test]
async fn a_blocked_waiter_does_not_idle_another_device() {
    // Device 0 offers `x`; device 1 does not. Both run one attempt at a time.
    let rig = Rig::new(
        vec![profile(0, 16, 1, &["x"]), profile(1, 16, 1, &[])],
        bounds(8, 4),
    );
    let h0 = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let h1 = rig.service.resource_ticket(GIB).admit().await.unwrap();
    assert_eq!((h0.device(), h1.device()), (dev(0), dev(1)));
    let needs_x = rig.proof(1, GIB, &["x"]);
    let mut old = Box::pin(rig.service.ticket(&needs_x).unwrap().admit());
    let mut young = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut old).is_pending());
    assert!(poll!(&mut young).is_pending());

    // Device 1 frees: the older waiter cannot use it, the younger one runs.
    h1.release().await;
    let young = young.await.unwrap();
    assert_eq!(young.device(), dev(1));
    assert!(poll!(&mut old).is_pending());
    let snapshot = rig.service.admission_snapshot();
    assert_eq!(snapshot.waiters.len(), 1);
    // Overtaking counts only on devices the older waiter could use.
    assert_eq!(snapshot.waiters[0].overtakes, 0);

    h0.release().await;
    let old = old.await.unwrap();
    assert_eq!(old.device(), dev(0));
    old.release().await;
    young.release().await;
    rig.assert_idle();
}

#[tokio::test]
async fn the_oldest_runnable_waiter_goes_first_on_a_freed_device() {
    let rig = Rig::new(
        vec![profile(0, 16, 1, &[]), profile(1, 16, 1, &[])],
        bounds(8, 4),
    );
    let h0 = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let h1 = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let mut a = Box::pin(rig.service.resource_ticket(GIB).admit());
    let mut b = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut a).is_pending());
    assert!(poll!(&mut b).is_pending());
    h1.release().await;
    let a = a.await.unwrap();
    assert_eq!(a.device(), dev(1));
    assert!(poll!(&mut b).is_pending());
    h0.release().await;
    let b = b.await.unwrap();
    assert_eq!(b.device(), dev(0));
    assert_eq!(rig.admitted_order(), [1, 2, 3, 4]);
    a.release().await;
    b.release().await;
    rig.assert_idle();
}

/// One 16 GiB device with three slots (2 GiB floor): a 10 GiB attempt
/// runs, so a 5 GiB floor must wait while 2 GiB requests would still fit.
#[tokio::test]
async fn with_a_budget_of_zero_a_blocked_waiter_protects_instead_of_being_overtaken() {
    let rig = Rig::new(vec![profile(0, 16, 3, &[])], bounds(8, 0));
    let big = rig
        .service
        .resource_ticket(0)
        .with_working_set_hint(10 * GIB)
        .admit()
        .await
        .unwrap();
    let mut old = Box::pin(rig.service.resource_ticket(5 * GIB).admit());
    assert!(poll!(&mut old).is_pending());

    // A younger 2 GiB request would fit (a slot and 4 GiB are free), but
    // with a budget of 0 the older waiter protects a slot and bytes
    // instead of being passed, and the younger one waits behind it.
    let mut young = Box::pin(
        rig.service
            .resource_ticket(0)
            .with_working_set_hint(2 * GIB)
            .admit(),
    );
    assert!(poll!(&mut young).is_pending());
    let snapshot = rig.service.admission_snapshot();
    let old_waiter = &snapshot.waiters[0];
    assert_eq!(old_waiter.waiter, WaiterId::new(2));
    assert_eq!(old_waiter.overtakes, 0);
    assert_eq!(old_waiter.protected_on, Some(dev(0)));
    let protection = rig.report(0).protection.expect("protected");
    assert_eq!(protection.waiter, WaiterId::new(2));
    assert_eq!(protection.target_bytes, 5 * GIB);
    assert_eq!(protection.accumulated_bytes, 4 * GIB);
    assert!(rig.kinds_of(2).contains(&ObservationKind::Protected));

    // The release completes the protection: the protected waiter gets the
    // next grant on the device, consuming the protection, then the younger.
    big.release().await;
    let old = old.await.unwrap();
    assert_eq!(old.device(), dev(0));
    assert!(old.grant_bytes() >= 5 * GIB);
    let young = young.await.unwrap();
    assert_eq!(rig.admitted_order(), [1, 2, 3]);
    assert!(rig.report(0).protection.is_none());
    for h in [old, young] {
        h.release().await;
    }
    rig.assert_idle();
}

/// Two identical devices, one attempt of 4 GiB on each: spare bytes, load
/// and worker depth tie. Device 0's attempt runs an execution context (a
/// forked stream), so device 0 has fewer streams available, and the next
/// admission goes to device 1. Derived from open slots alone, the two would
/// tie and the lower ordinal would win.
#[tokio::test]
async fn ranking_reads_the_devices_live_stream_use() {
    let rig = Rig::new(
        vec![profile(0, 16, 3, &[]), profile(1, 16, 3, &[])],
        bounds(8, 4),
    );
    let hinted = |gib| {
        rig.service
            .resource_ticket(0)
            .with_working_set_hint(gib * GIB)
            .admit()
    };
    let a = hinted(4).await.unwrap();
    let b = hinted(4).await.unwrap();
    assert_eq!((a.device(), b.device()), (dev(0), dev(1)));
    let context = a.execution_context().unwrap();
    rig.service.settle().await;
    let next = hinted(4).await.unwrap();
    assert_eq!(next.device(), dev(1), "fewer streams in use on device 1");

    // Once the fork is gone, the devices tie again: the lower ordinal wins
    // between two devices with equal spare bytes (device 0 has one attempt
    // fewer now, so it wins on load as well).
    drop(context);
    rig.service.settle().await;
    let last = hinted(4).await.unwrap();
    assert_eq!(last.device(), dev(0));
    for h in [a, b, next, last] {
        h.release().await;
    }
    rig.assert_idle();
}

#[tokio::test]
async fn a_protection_moves_when_its_device_is_quarantined() {
    let rig = Rig::new(
        vec![profile(0, 16, 3, &[]), profile(1, 16, 3, &[])],
        bounds(8, 0),
    );
    let hinted = |gib| {
        rig.service
            .resource_ticket(0)
            .with_working_set_hint(gib * GIB)
            .admit()
    };
    let h0 = hinted(10).await.unwrap();
    let h1 = hinted(10).await.unwrap();
    assert_eq!((h0.device(), h1.device()), (dev(0), dev(1)));
    let mut old = Box::pin(rig.service.resource_ticket(5 * GIB).admit());
    assert!(poll!(&mut old).is_pending());
    let young = hinted(2).await.unwrap();
    // The old waiter protects before the younger one is placed (a budget of
    // 0): where it completes soonest, both devices running one attempt, so
    // the lower ordinal. The younger one may not pass it there and goes to
    // the other device.
    let protection = rig.report(0).protection.expect("protected on 0");
    assert_eq!(protection.waiter, WaiterId::new(3));
    assert_eq!(young.device(), dev(1));

    // A proven stream-sync fault at the release of device 0's attempt
    // quarantines it; the protection moves to device 1.
    rig.sim.inject_sync_fault(dev(0), 700);
    let report = h0.release().await;
    assert!(report.ledger_released);
    assert_eq!(rig.report(0).state, LedgerState::Quarantined { code: 700 });
    assert!(rig.report(0).protection.is_none());
    assert_eq!(
        rig.report(1).protection.map(|p| p.waiter),
        Some(WaiterId::new(3))
    );
    assert_eq!(
        rig.service.admission_snapshot().waiters[0].protected_on,
        Some(dev(1))
    );
    assert!(poll!(&mut old).is_pending());

    h1.release().await;
    let old = old.await.unwrap();
    assert_eq!(old.device(), dev(1));
    assert!(rig.report(1).protection.is_none());
    old.release().await;
    young.release().await;
    for r in rig.reports() {
        assert_eq!((r.live_grant_count, r.active_attempts), (0, 0));
    }
}

/// A preflight that holds every submission whose waiter is in `held` until
/// the watch flips to true.
fn gated_preflight(
    held: Arc<Mutex<HashSet<u64>>>,
    open: watch::Receiver<bool>,
) -> impl Fn(&PreflightRequest) -> admission::gpu::PreflightFuture + Send + Sync + 'static {
    move |request: &PreflightRequest| {
        let hold = held.lock().unwrap().contains(&request.waiter.get());
        let mut open = open.clone();
        Box::pin(async move {
            if hold {
                open.wait_for(|o| *o).await.map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }
}

#[tokio::test]
async fn pending_preflights_count_against_the_bound_and_hold_back_younger_work() {
    let held = Arc::new(Mutex::new(HashSet::from([2])));
    let (open_tx, open_rx) = watch::channel(false);
    let rig = Rig::with(vec![profile(0, 16, 1, &[])], bounds(2, 4), |b| {
        b.preflight(gated_preflight(held.clone(), open_rx))
    });
    let first = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let mut slow = Box::pin(rig.service.resource_ticket(GIB).admit());
    let mut fast = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut slow).is_pending());
    assert!(poll!(&mut fast).is_pending());
    let snapshot = rig.service.admission_snapshot();
    assert_eq!((snapshot.pending_preflights, snapshot.queued), (1, 1));

    // Queued plus pending is at the bound: refused at once.
    let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
    assert_eq!(error, GpuAdmitError::QueueFull { max_pending: 2 });
    assert_eq!(error.outcome(), QueryAdmissionOutcome::CapacityPressure);

    // The device frees, but the younger waiter may not pass the pending one.
    first.release().await;
    assert!(poll!(&mut fast).is_pending());
    assert_eq!(rig.report(0).active_attempts, 0);

    // The preflight resolves: the older submission goes first.
    open_tx.send(true).unwrap();
    let slow = slow.await.unwrap();
    assert!(poll!(&mut fast).is_pending());
    slow.release().await;
    let fast = fast.await.unwrap();
    fast.release().await;
    assert_eq!(rig.admitted_order(), [1, 2, 3]);
    rig.assert_idle();
}

#[tokio::test]
async fn a_failed_preflight_rejects_and_lifts_the_barrier() {
    let rig = Rig::with(vec![profile(0, 16, 1, &[])], bounds(4, 4), |b| {
        b.preflight(|r: &PreflightRequest| {
            let fail = r.waiter.get() == 1;
            Box::pin(async move {
                if fail {
                    Err("no kernel for this device".to_string())
                } else {
                    Ok(())
                }
            })
        })
    });
    let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
    assert!(matches!(
        error,
        GpuAdmitError::PreflightFailed { device: Some(d), .. } if d == dev(0)
    ));
    assert_eq!(error.outcome(), QueryAdmissionOutcome::Configuration);
    let handle = rig.service.resource_ticket(GIB).admit().await.unwrap();
    handle.release().await;
    rig.assert_idle();
}

#[tokio::test(start_paused = true)]
async fn max_wait_and_request_deadlines_remove_waiters() {
    let rig = Rig::new(
        vec![profile(0, 16, 1, &[])],
        QueueBounds::new(8, Duration::from_secs(10), 4).unwrap(),
    );
    let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let before = rig.reports();

    let error = rig.service.resource_ticket(GIB).admit().await.unwrap_err();
    assert_eq!(
        error,
        GpuAdmitError::DeadlineExceeded {
            waited: Duration::from_secs(10)
        }
    );
    assert_eq!(error.outcome(), QueryAdmissionOutcome::Deadline);

    let own = Instant::now() + Duration::from_secs(3);
    let error = rig
        .service
        .resource_ticket(GIB)
        .with_deadline(own)
        .admit()
        .await
        .unwrap_err();
    assert_eq!(
        error,
        GpuAdmitError::DeadlineExceeded {
            waited: Duration::from_secs(3)
        }
    );

    let error = rig
        .service
        .resource_ticket(GIB)
        .with_deadline(Instant::now())
        .admit()
        .await
        .unwrap_err();
    assert_eq!(error, GpuAdmitError::DeadlinePassed);

    let snapshot = rig.service.admission_snapshot();
    assert_eq!((snapshot.queued, snapshot.pending_preflights), (0, 0));
    assert_eq!(rig.reports(), before);
    held.release().await;
    rig.assert_idle();
}

#[tokio::test(start_paused = true)]
async fn snapshot_ages_follow_tokio_time() {
    let rig = Rig::new(vec![profile(0, 16, 1, &[])], bounds(8, 4));
    let held = rig.service.resource_ticket(GIB).admit().await.unwrap();
    let mut waiting = Box::pin(rig.service.resource_ticket(GIB).admit());
    assert!(poll!(&mut waiting).is_pending());
    tokio::time::advance(Duration::from_secs(5)).await;
    let snapshot = rig.service.admission_snapshot();
    assert_eq!(snapshot.waiters[0].age, Duration::from_secs(5));
    assert_eq!(snapshot.devices[0].active_attempts, 1);
    drop(waiting);
    held.release().await;
}
