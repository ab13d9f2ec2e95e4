//! loom models of the device ledger under the service's one mutex: a commit
//! racing the release of another grant, and a protected waiter racing
//! another request and the release that completes its protection.
//!
//! The ledger is plain data; the service wraps all ledgers in one mutex, so
//! the models do the same with loom's `Mutex` and check the conservation
//! invariants inside every critical section.

use super::model;
use crate::gpu::backend::DeviceOrdinal;
use crate::gpu::ledger::{Decision, DeviceLedger, GrantRequest, MemoryGrant};
use crate::gpu::{DeviceProfile, WaiterId};
use loom::sync::{Arc, Mutex};
use loom::thread;

const GB: u64 = 1_000_000_000;

/// The seed's device: 80 GB, four slots, a 10 GB floor, a 16 GB cache cap.
fn ledger() -> DeviceLedger {
    DeviceLedger::new(
        DeviceProfile::builder(DeviceOrdinal(0))
            .managed_capacity(80 * GB)
            .max_active_attempts(4)
            .cache_cap(16 * GB)
            .build()
            .expect("valid profile"),
    )
}

fn hinted(bytes: u64) -> GrantRequest {
    GrantRequest::resource_only(0).with_working_set_hint(bytes)
}

/// A commit races the rollback of another attempt's grant: whichever lands
/// first, capacity is never exceeded and everything comes back.
pub fn a_commit_racing_a_rollback_never_exceeds_capacity() {
    model(|| {
        let shared = Arc::new(Mutex::new(ledger()));
        let (rolled_back, cached) = {
            let mut l = shared.lock().unwrap();
            l.charge_cache(8 * GB).expect("fits");
            let first = l.commit(&hinted(40 * GB)).expect("fits an empty device");
            let second = l.commit(&hinted(0)).expect("a floor fits");
            super::assert_ledger_conserved(&l.snapshot());
            (first, second)
        };

        let committer = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut l = shared.lock().unwrap();
                let before = l.snapshot();
                let grant = l.commit(&GrantRequest::resource_only(0)).ok();
                let after = l.snapshot();
                super::assert_ledger_conserved(&after);
                if grant.is_none() {
                    assert_eq!(before, after, "a refused commit changes nothing");
                }
                grant
            })
        };
        let rollback = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut l = shared.lock().unwrap();
                let outcome = l.release(rolled_back).expect("issued here");
                assert_eq!(outcome.bytes, 40 * GB);
                super::assert_ledger_conserved(&l.snapshot());
            })
        };

        let grant = committer.join().unwrap();
        rollback.join().unwrap();

        let mut l = shared.lock().unwrap();
        // Before the rollback: 80 - 40 - 10 - 8 - 10 * 1 = 12 GB; after it:
        // 80 - 10 - 8 - 10 * 2 = 42 GB. Either way a grant was admitted.
        let grant: MemoryGrant = grant.expect("a floor fits either way");
        assert!(grant.bytes() == 12 * GB || grant.bytes() == 42 * GB);
        l.release(grant).expect("issued here");
        l.release(cached).expect("issued here");
        l.evict_cache(8 * GB).expect("charged");
        let r = l.snapshot();
        assert_eq!(
            (r.active_attempts, r.live_grants_bytes, r.live_grant_count),
            (0, 0, 0)
        );
        assert_eq!(r.cache_evictable_bytes, 0);
    });
}

/// A protected waiter consumes its protection while another request and the
/// release that completes the protection race it: the other request never
/// takes the protected slot or bytes, and the waiter is admitted.
pub fn a_protected_waiter_keeps_its_slot_and_bytes_against_a_racing_request() {
    model(|| {
        let waiter = WaiterId::new(7);
        let shared = Arc::new(Mutex::new(ledger()));
        let (released, running) = {
            let mut l = shared.lock().unwrap();
            let mut grants: Vec<MemoryGrant> = (0..3)
                .map(|_| l.commit(&hinted(20 * GB)).expect("fits"))
                .collect();
            // 60 GB live, the last slot open: the protection claims the
            // free 20 GB at once and needs 10 GB more.
            let p = l.protect(waiter, 30 * GB).expect("healthy");
            assert_eq!(p.accumulated_bytes, 20 * GB);
            let released = grants.pop().expect("three grants");
            // The other two run for the whole model.
            (released, grants)
        };

        let release = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut l = shared.lock().unwrap();
                l.release(released).expect("issued here");
                super::assert_ledger_conserved(&l.snapshot());
                // The freed bytes went to the protection first.
                assert_eq!(l.snapshot().protected_bytes, 30 * GB);
            })
        };
        let other = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut l = shared.lock().unwrap();
                let before = l.snapshot();
                let result = l.commit(&GrantRequest::resource_only(0).for_waiter(WaiterId::new(8)));
                let after = l.snapshot();
                super::assert_ledger_conserved(&after);
                if let Ok(grant) = &result {
                    // Only the bytes beyond the protection: 80 - 40 - 30.
                    assert_eq!(grant.bytes(), 10 * GB);
                    assert_eq!(after.protection, before.protection, "protection untouched");
                }
                result.ok()
            })
        };

        let own = GrantRequest::resource_only(30 * GB).for_waiter(waiter);
        let early = {
            let mut l = shared.lock().unwrap();
            let decision = l.decide(&own);
            let result = l.commit(&own);
            super::assert_ledger_conserved(&l.snapshot());
            match (&decision, &result) {
                (Decision::Admit { grant_bytes }, Ok(grant)) => {
                    assert_eq!(*grant_bytes, grant.bytes());
                    assert_eq!(l.snapshot().protection, None, "consumed at commit");
                }
                (Decision::Admit { .. }, Err(e)) => panic!("decided Admit, commit failed: {e}"),
                _ => assert!(result.is_err()),
            }
            result.ok()
        };

        release.join().unwrap();
        let other_grant = other.join().unwrap();

        let mut l = shared.lock().unwrap();
        let grant = match early {
            Some(grant) => grant,
            // Once the release landed, the waiter's slot and bytes are there
            // whatever the other request took.
            None => l.commit(&own).expect("the protected waiter is admitted"),
        };
        assert_eq!(grant.bytes(), 30 * GB);
        assert_eq!(l.snapshot().protection, None);
        super::assert_ledger_conserved(&l.snapshot());
        l.release(grant).expect("issued here");
        if let Some(g) = other_grant {
            l.release(g).expect("issued here");
        }
        assert_eq!(l.snapshot().active_attempts, 2);
        for g in running {
            l.release(g).expect("issued here");
        }
        let r = l.snapshot();
        assert_eq!(
            (r.active_attempts, r.live_grants_bytes, r.protected_bytes),
            (0, 0, 0)
        );
    });
}
