//! loom models of the query service's synchronous core under its one
//! mutex: a commit racing a rollback with a third thread scheduling, and a
//! protection being consumed while a younger waiter and a release race it.
//!
//! The service keeps an `AdmissionCore` behind one lock and runs a
//! scheduling pass after every transaction; the models do the same with
//! loom's `Mutex` and check the ledger invariants inside every critical
//! section.

use std::time::Duration;

use super::model;
use crate::gpu::backend::DeviceOrdinal;
use crate::gpu::ledger::{GrantRequest, MemoryGrant};
use crate::gpu::observe::GpuEvent;
use crate::gpu::scheduler::AdmissionCore;
use crate::gpu::{
    DeviceProfile, DeviceSet, LedgerSnapshot, MemoryOwnership, QueueBounds, WaiterId,
};
use loom::sync::{Arc, Mutex};
use loom::thread;
use tokio::time::Instant;

const GIB: u64 = 1 << 30;
const D0: DeviceOrdinal = DeviceOrdinal(0);

/// One 16 GiB device with `slots` attempt slots (a 2 GiB floor).
fn core(slots: u32, overtake_budget: u32) -> AdmissionCore {
    let profile = DeviceProfile::builder(D0)
        .managed_capacity(16 * GIB)
        .max_active_attempts(slots)
        .build()
        .expect("valid profile");
    let devices =
        DeviceSet::new(vec![profile], vec![MemoryOwnership::exclusive(D0)]).expect("valid set");
    AdmissionCore::new(
        &devices,
        QueueBounds::new(8, Duration::from_secs(60), overtake_budget).expect("valid bounds"),
    )
}

fn no_depth(_: DeviceOrdinal) -> u64 {
    0
}

fn request(floor_gib: u64, hint_gib: Option<u64>) -> GrantRequest {
    let request = GrantRequest::resource_only(floor_gib * GIB);
    match hint_gib {
        Some(hint) => request.with_working_set_hint(hint * GIB),
        None => request,
    }
}

/// Submits a waiter (reserve, then resolve) and runs a scheduling pass.
fn submit(core: &mut AdmissionCore, floor_gib: u64, hint_gib: Option<u64>) -> WaiterId {
    let waiter = core.reserve(Instant::now()).expect("room in the queue");
    core.resolve(waiter, request(floor_gib, hint_gib), vec![D0])
        .expect("a healthy candidate");
    core.schedule(&no_depth);
    waiter
}

fn conserved(r: &LedgerSnapshot) {
    super::assert_ledger_conserved(r);
    if r.protection.is_some() {
        // The protected slot is never taken by anybody else.
        assert!(r.active_attempts < r.max_active_attempts, "{r:?}");
    }
}

fn check(core: &AdmissionCore) {
    for r in core.ledger_snapshots() {
        conserved(&r);
    }
}

fn assert_empty(core: &AdmissionCore) {
    assert_eq!(core.depth(), 0);
    for r in core.ledger_snapshots() {
        assert_eq!(
            (r.active_attempts, r.live_grants_bytes, r.live_grant_count),
            (0, 0, 0),
            "{r:?}"
        );
        assert_eq!(r.protected_bytes, 0, "{r:?}");
        assert!(r.protection.is_none(), "{r:?}");
    }
}

/// A commit (a scheduling pass admitting a queued waiter) races the
/// rollback of another attempt's grant, while a third thread cancels a
/// waiter that may be queued or already granted. Capacity is never
/// exceeded, and once everybody leaves every slot and byte is back.
pub fn a_commit_racing_a_rollback_and_a_cancel_returns_everything() {
    model(|| {
        let shared = Arc::new(Mutex::new(core(2, 4)));
        let (rolled_back, second, third) = {
            let mut c = shared.lock().unwrap();
            let first = submit(&mut c, 0, Some(14));
            let grant = c
                .take_outcome(first)
                .expect("admitted at once")
                .expect("granted");
            // Both wait: 2 GiB is left and each needs 4.
            let second = submit(&mut c, 4, Some(4));
            let third = submit(&mut c, 4, Some(4));
            assert!(c.take_outcome(second).is_none());
            check(&c);
            (grant, second, third)
        };

        let committer = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut c = shared.lock().unwrap();
                c.schedule(&no_depth);
                check(&c);
                c.take_outcome(second)
            })
        };
        let rollback = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut c = shared.lock().unwrap();
                let released = c.release(rolled_back).expect("issued here");
                assert_eq!(released.bytes, 14 * GIB);
                c.schedule(&no_depth);
                check(&c);
            })
        };
        let canceller = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut c = shared.lock().unwrap();
                c.cancel(third).expect("known waiter");
                c.schedule(&no_depth);
                check(&c);
            })
        };

        let taken = committer.join().unwrap();
        rollback.join().unwrap();
        canceller.join().unwrap();

        let mut c = shared.lock().unwrap();
        c.schedule(&no_depth);
        let mut grants: Vec<MemoryGrant> = Vec::new();
        match taken {
            Some(outcome) => grants.push(outcome.expect("granted")),
            None => {
                // The rollback landed after the committer's pass: the
                // rollback's own pass admitted it.
                let outcome = c.take_outcome(second).expect("admitted after the rollback");
                grants.push(outcome.expect("granted"));
            }
        }
        for grant in grants {
            assert_eq!(grant.bytes(), 4 * GIB, "the grant never changes");
            c.release(grant).expect("issued here");
        }
        check(&c);
        assert_empty(&c);
    });
}

/// A protected waiter's commit races a younger waiter's commit and the
/// release that completes the protection: the younger waiter never takes
/// the protected slot or bytes, and the protected waiter is admitted.
pub fn a_younger_waiter_never_takes_a_protected_slot_or_bytes() {
    model(|| {
        let shared = Arc::new(Mutex::new(core(3, 1)));
        let (big, old, young_grant) = {
            let mut c = shared.lock().unwrap();
            let first = submit(&mut c, 0, Some(10));
            let big = c.take_outcome(first).expect("admitted").expect("granted");
            // 5 GiB does not fit beside 10 GiB with a slot's headroom left.
            let old = submit(&mut c, 5, None);
            // A younger 2 GiB request is admitted past it: that spends a
            // budget of 1, so the old waiter protects a slot and 4 GiB at
            // once.
            let young = c.reserve(Instant::now()).expect("room");
            c.resolve(young, request(2, Some(2)), vec![D0])
                .expect("healthy");
            let events = c.schedule(&no_depth);
            assert!(events.iter().any(|e| matches!(
                e,
                GpuEvent::Protected { waiter, .. } if *waiter == old
            )));
            let young_grant = c.take_outcome(young).expect("admitted").expect("granted");
            check(&c);
            (big, old, young_grant)
        };

        let protected = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut c = shared.lock().unwrap();
                c.schedule(&no_depth);
                check(&c);
            })
        };
        let younger = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut c = shared.lock().unwrap();
                let before = c.ledger_snapshots();
                let waiter = c.reserve(Instant::now()).expect("room");
                c.resolve(waiter, request(2, Some(2)), vec![D0])
                    .expect("healthy");
                let events = c.schedule(&no_depth);
                check(&c);
                let protection = before[0].protection;
                let admitted_self = events.iter().any(|e| {
                    matches!(
                        e,
                        GpuEvent::Admitted { waiter: w, .. } if *w == waiter
                    )
                });
                if admitted_self {
                    // It was admitted only once the protected waiter had its
                    // grant: never on the protected slot or bytes.
                    assert!(
                        protection.is_none()
                            || events.iter().any(|e| matches!(
                                e,
                                GpuEvent::Admitted { waiter: w, .. } if *w == old
                            )),
                        "{before:?} {events:?}"
                    );
                }
                waiter
            })
        };
        let release = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut c = shared.lock().unwrap();
                c.release(big).expect("issued here");
                c.schedule(&no_depth);
                check(&c);
            })
        };

        protected.join().unwrap();
        let younger_waiter = younger.join().unwrap();
        release.join().unwrap();

        let mut c = shared.lock().unwrap();
        c.schedule(&no_depth);
        let old_grant = c
            .take_outcome(old)
            .expect("the protected waiter is admitted")
            .expect("granted");
        assert!(old_grant.bytes() >= 5 * GIB);
        let mut grants = vec![old_grant, young_grant];
        if let Some(outcome) = c.take_outcome(younger_waiter) {
            grants.push(outcome.expect("granted"));
        } else {
            c.cancel(younger_waiter).expect("queued");
        }
        for grant in grants {
            c.release(grant).expect("issued here");
        }
        check(&c);
        assert_empty(&c);
    });
}
