//! The device ledger, profiles, proofs, placement and outcomes: the seed's
//! arithmetic as tables, protection and health as scenarios, absurd values
//! at every ledger and profile setter, and the conservation invariants as a
//! property test. In the crate because the ledger's mutators (`new`,
//! `commit`, `release`, `protect`) are crate-private.

use std::time::Duration;

use crate::gpu::backend::{BackendError, BackendOp, DeviceOrdinal};
use crate::gpu::ledger::{
    Decision, DeviceLedger, GrantId, GrantRequest, LaterReason, MemoryGrant, NeverReason,
};
use crate::gpu::placement::{compatible_devices, rank_devices, DeviceLoad};
use crate::gpu::{
    AllocationOwner, Capability, CapabilitySet, DeviceProfile, DeviceSet, GpuAdmitError,
    LedgerError, LedgerState, LoweringError, MemoryOwnership, PhaseRequirement, PlanDescription,
    PlanFingerprint, ProofIssuer, QueryAdmissionOutcome, QueueBounds, WaiterId,
};
use proptest::prelude::*;

const GB: u64 = 1_000_000_000;

fn dev(n: u32) -> DeviceOrdinal {
    DeviceOrdinal(n)
}

fn caps(names: &[&str]) -> CapabilitySet {
    names.iter().map(|n| Capability::new(*n)).collect()
}

/// 80 GB, four attempt slots, a 16 GB cache cap: the seed's device.
fn seed_profile(ordinal: u32) -> DeviceProfile {
    DeviceProfile::builder(dev(ordinal))
        .managed_capacity(80 * GB)
        .max_active_attempts(4)
        .cache_cap(16 * GB)
        .capabilities(caps(&["hash_join", "sort"]))
        .build()
        .expect("valid profile")
}

fn any_request() -> GrantRequest {
    GrantRequest::resource_only(0)
}

fn admitted(decision: Decision) -> u64 {
    match decision {
        Decision::Admit { grant_bytes } => grant_bytes,
        other => panic!("expected Admit, got {other:?}"),
    }
}

/// One running 30 GB grant, 8 GB evictable and 2 GB pinned cache.
fn seed_ledger() -> (DeviceLedger, MemoryGrant) {
    let mut ledger = DeviceLedger::new(seed_profile(0));
    let running = ledger
        .commit(&any_request().with_working_set_hint(30 * GB))
        .expect("first attempt fits");
    ledger.charge_cache(10 * GB).expect("cache fits");
    ledger.pin_cache(2 * GB).expect("pin");
    (ledger, running)
}

#[test]
fn the_seed_worked_example_grants_between_10_and_20_gb() {
    let (ledger, running) = seed_ledger();
    assert_eq!(running.bytes(), 30 * GB);
    let report = ledger.snapshot();
    assert_eq!(report.attempt_floor, 10 * GB);
    assert_eq!(report.cache_evictable_bytes, 8 * GB);
    assert_eq!(report.cache_pinned_bytes, 2 * GB);
    // max_new = 80 - 30 - 8 - 2 - 0 - (10 * 2)
    assert_eq!(report.max_new_bytes, Some(20 * GB));
    assert_eq!(admitted(ledger.decide(&any_request())), 20 * GB);
}

#[test]
fn the_attempt_floor_defaults_to_capacity_over_max_of_8_and_the_slot_limit() {
    for (max_active, floor) in [(4, 10 * GB), (8, 10 * GB), (16, 5 * GB)] {
        let profile = DeviceProfile::builder(dev(0))
            .managed_capacity(80 * GB)
            .max_active_attempts(max_active)
            .build()
            .expect("valid");
        assert_eq!(profile.attempt_floor(), floor, "max_active {max_active}");
    }
}

#[test]
fn a_hint_is_clamped_into_the_floor_to_max_new_interval() {
    let (ledger, _running) = seed_ledger();
    for (hint, grant) in [
        (None, 20 * GB),
        (Some(0), 10 * GB),
        (Some(5 * GB), 10 * GB),
        (Some(10 * GB), 10 * GB),
        (Some(15 * GB), 15 * GB),
        (Some(20 * GB), 20 * GB),
        (Some(25 * GB), 20 * GB),
        (Some(u64::MAX), 20 * GB),
    ] {
        let request = match hint {
            Some(h) => any_request().with_working_set_hint(h),
            None => any_request(),
        };
        assert_eq!(admitted(ledger.decide(&request)), grant, "hint {hint:?}");
    }
}

#[test]
fn the_required_floor_is_the_larger_of_the_profile_floor_and_the_phase_floor() {
    let (ledger, _running) = seed_ledger();
    let request = GrantRequest::resource_only(15 * GB).with_working_set_hint(0);
    assert_eq!(ledger.required_floor(&request), 15 * GB);
    assert_eq!(admitted(ledger.decide(&request)), 15 * GB);
    let too_big = GrantRequest::resource_only(25 * GB);
    assert_eq!(
        ledger.decide(&too_big),
        Decision::Later {
            reason: LaterReason::InsufficientBytes {
                required_floor: 25 * GB,
                max_new: 20 * GB
            }
        }
    );
}

#[test]
fn commit_takes_a_slot_and_the_grant_and_release_returns_both() {
    let (mut ledger, running) = seed_ledger();
    let grant = ledger.commit(&any_request()).expect("admissible");
    assert_eq!(grant.bytes(), 20 * GB);
    assert_eq!(grant.required_floor(), 10 * GB);
    assert_eq!(grant.device(), dev(0));
    let report = ledger.snapshot();
    assert_eq!(report.active_attempts, 2);
    assert_eq!(report.live_grants_bytes, 50 * GB);
    assert_eq!(report.live_grant_count, 2);
    let outcome = ledger.release(grant).expect("issued here");
    assert_eq!(outcome.bytes, 20 * GB);
    ledger.release(running).expect("issued here");
    let report = ledger.snapshot();
    assert_eq!((report.active_attempts, report.live_grants_bytes), (0, 0));
}

#[test]
fn a_full_device_is_later_and_an_impossible_request_is_never() {
    let mut ledger = DeviceLedger::new(seed_profile(0));
    let _grants: Vec<MemoryGrant> = (0..4)
        .map(|_| {
            ledger
                .commit(&any_request().with_working_set_hint(0))
                .expect("four floors fit")
        })
        .collect();
    assert_eq!(
        ledger.decide(&any_request()),
        Decision::Later {
            reason: LaterReason::SlotsFull {
                active: 4,
                protected_slots: 0,
                max_active: 4
            }
        }
    );
    assert!(matches!(
        ledger.commit(&any_request()),
        Err(LedgerError::Later(LaterReason::SlotsFull { .. }))
    ));

    let fresh = DeviceLedger::new(seed_profile(1));
    // Largest possible grant: 80 - 10 * 3 = 50 GB.
    assert_eq!(fresh.profile().largest_possible_grant(), 50 * GB);
    assert_eq!(
        admitted(fresh.decide(&GrantRequest::resource_only(50 * GB))),
        50 * GB
    );
    assert_eq!(
        fresh.decide(&GrantRequest::resource_only(50 * GB + 1)),
        Decision::Never {
            reason: NeverReason::FloorNeverFits {
                required_floor: 50 * GB + 1,
                largest_possible: 50 * GB
            }
        }
    );
}

#[test]
fn a_missing_capability_is_never_and_names_what_is_missing() {
    let issuer = ProofIssuer::new();
    let plan = PlanDescription::new(PlanFingerprint(1))
        .require(Capability::new("sort"))
        .require(Capability::new("fp64"))
        .phase(PhaseRequirement::new("scan", GB, "scan"));
    let proof = issuer.lower(&plan).expect("resolved");
    let ledger = DeviceLedger::new(seed_profile(0));
    assert_eq!(
        ledger.decide(&GrantRequest::for_proof(&proof)),
        Decision::Never {
            reason: NeverReason::MissingCapabilities {
                missing: caps(&["fp64"])
            }
        }
    );
}

#[test]
fn quarantine_and_close_issue_nothing_new_but_in_flight_grants_drain() {
    for close in [false, true] {
        let mut ledger = DeviceLedger::new(seed_profile(0));
        let grant = ledger.commit(&any_request()).expect("fits");
        ledger.charge_cache(GB).expect("fits");
        ledger.protect(WaiterId::new(9), 0).expect("healthy");
        let dropped = if close {
            ledger.close()
        } else {
            ledger.quarantine(700)
        };
        assert_eq!(dropped, Some(WaiterId::new(9)), "protection handed back");
        let reason = if close {
            NeverReason::Closed
        } else {
            NeverReason::Quarantined { code: 700 }
        };
        assert_eq!(
            ledger.decide(&any_request()),
            Decision::Never {
                reason: reason.clone()
            }
        );
        assert_eq!(
            ledger.commit(&any_request()).err(),
            Some(LedgerError::Never(reason.clone()))
        );
        assert_eq!(
            ledger.charge_cache(GB),
            Err(LedgerError::Never(reason.clone()))
        );
        assert_eq!(
            ledger.protect(WaiterId::new(1), 0).err(),
            Some(LedgerError::Never(reason))
        );
        ledger.release(grant).expect("drains");
        ledger.evict_cache(GB).expect("drains");
        let report = ledger.snapshot();
        assert_eq!(report.live_grants_bytes + report.cache_evictable_bytes, 0);
        assert_eq!(report.active_attempts, 0);
    }
}

#[test]
fn a_closed_ledger_stays_closed_and_a_quarantine_keeps_its_first_code() {
    let mut ledger = DeviceLedger::new(seed_profile(0));
    ledger.quarantine(1);
    ledger.quarantine(2);
    assert_eq!(ledger.state(), LedgerState::Quarantined { code: 1 });
    ledger.close();
    ledger.quarantine(3);
    assert_eq!(ledger.state(), LedgerState::Closed);
}

/// Three 20 GB grants on the seed device: 60 GB live, one slot open.
fn three_running() -> (DeviceLedger, Vec<MemoryGrant>) {
    let mut ledger = DeviceLedger::new(seed_profile(0));
    let grants = (0..3)
        .map(|_| {
            ledger
                .commit(&any_request().with_working_set_hint(20 * GB))
                .expect("fits")
        })
        .collect();
    (ledger, grants)
}

#[test]
fn protection_claims_free_bytes_at_once_and_takes_the_open_slot_from_others() {
    let (mut ledger, _grants) = three_running();
    let waiter = WaiterId::new(7);
    let protection = ledger.protect(waiter, 30 * GB).expect("healthy");
    // 80 - 60 live, no open unprotected slot left to keep headroom for.
    assert_eq!(protection.accumulated_bytes, 20 * GB);
    assert_eq!(protection.target_bytes, 30 * GB);
    assert_eq!(
        ledger.decide(&any_request()),
        Decision::Later {
            reason: LaterReason::SlotsFull {
                active: 3,
                protected_slots: 1,
                max_active: 4
            }
        }
    );
    // The holder sees its own slot and bytes: 80 - 60 = 20 < 30, so Later.
    let own = GrantRequest::resource_only(30 * GB).for_waiter(waiter);
    assert!(matches!(
        ledger.decide(&own),
        Decision::Later {
            reason: LaterReason::InsufficientBytes { .. }
        }
    ));
}

#[test]
fn releases_top_the_protection_up_before_anybody_else_can_use_the_bytes() {
    let (mut ledger, mut grants) = three_running();
    let waiter = WaiterId::new(7);
    ledger.protect(waiter, 30 * GB).expect("healthy");
    let outcome = ledger.release(grants.remove(0)).expect("issued here");
    // Free after the release: 80 - 40 live - 20 protected - 10 for the open slot.
    assert_eq!(outcome.protection_top_up, 10 * GB);
    let report = ledger.snapshot();
    assert_eq!(report.protected_bytes, 30 * GB);
    assert_eq!(report.empty_unprotected_slots, 1);

    // Another request may take the one unprotected slot, but only the bytes
    // beyond the protection: 80 - 40 - 30 = 10 GB.
    assert_eq!(admitted(ledger.decide(&any_request())), 10 * GB);
    // The holder's own view counts its protected slot and bytes as available.
    let own = GrantRequest::resource_only(30 * GB).for_waiter(waiter);
    assert_eq!(admitted(ledger.decide(&own)), 30 * GB);
    let grant = ledger.commit(&own).expect("protected waiter admitted");
    assert_eq!(grant.bytes(), 30 * GB);
    let report = ledger.snapshot();
    assert_eq!(report.protection, None, "consumed by the holder's commit");
    assert_eq!(report.protected_bytes, 0);
    assert_eq!(report.active_attempts, 3);
    assert_eq!(report.live_grants_bytes, 70 * GB);
}

#[test]
fn evictions_top_up_a_protection_too() {
    let mut ledger = DeviceLedger::new(seed_profile(0));
    let _big = ledger.commit(&any_request()).expect("50 GB");
    ledger.charge_cache(16 * GB).expect("fits the cap");
    let waiter = WaiterId::new(1);
    // Free: 80 - 50 - 16 - 10 * 2 open slots < 0, so nothing yet.
    let protection = ledger.protect(waiter, 0).expect("healthy");
    assert_eq!(protection.accumulated_bytes, 0);
    ledger.evict_cache(16 * GB).expect("evictable");
    // 80 - 50 - 20 = 10: exactly the attempt floor.
    assert_eq!(ledger.snapshot().protected_bytes, 10 * GB);
}

#[test]
fn a_protection_is_one_per_ledger_and_can_be_retargeted() {
    let (mut a, _grants) = three_running();
    let mut b = DeviceLedger::new(seed_profile(1));
    let waiter = WaiterId::new(3);
    a.protect(waiter, 0).expect("healthy");
    assert_eq!(
        a.protect(WaiterId::new(4), 0).err(),
        Some(LedgerError::ProtectionHeld { holder: waiter })
    );
    assert_eq!(
        a.unprotect(WaiterId::new(4)),
        Err(LedgerError::NotProtected {
            waiter: WaiterId::new(4)
        })
    );
    assert_eq!(a.unprotect(waiter), Ok(10 * GB), "its bytes come back");
    assert_eq!(a.snapshot().protection, None);
    assert_eq!(a.snapshot().max_new_bytes, Some(20 * GB));
    let on_b = b.protect(waiter, 0).expect("retargeted");
    assert_eq!(on_b.accumulated_bytes, 10 * GB);
    assert_eq!(b.protection_holder(), Some(waiter));
}

#[test]
fn a_protection_that_can_never_fit_is_refused() {
    let mut ledger = DeviceLedger::new(seed_profile(0));
    assert_eq!(
        ledger.protect(WaiterId::new(1), 51 * GB).err(),
        Some(LedgerError::Never(NeverReason::FloorNeverFits {
            required_floor: 51 * GB,
            largest_possible: 50 * GB
        }))
    );
}

#[test]
fn cache_charges_are_checked_against_the_cap_the_pool_and_the_counters() {
    let mut ledger = DeviceLedger::new(seed_profile(0));
    assert_eq!(
        ledger.charge_cache(17 * GB),
        Err(LedgerError::CacheCapExceeded {
            requested: 17 * GB,
            resident: 0,
            cache_cap: 16 * GB
        })
    );
    let _a = ledger.commit(&any_request()).expect("50 GB");
    let _rest: Vec<MemoryGrant> = (0..3)
        .map(|_| ledger.commit(&any_request()).expect("10 GB each"))
        .collect();
    assert_eq!(
        ledger.charge_cache(GB),
        Err(LedgerError::CacheNoRoom {
            requested: GB,
            unclaimed: 0
        })
    );
    let mut ledger = DeviceLedger::new(seed_profile(0));
    ledger.charge_cache(4 * GB).expect("fits");
    assert_eq!(
        ledger.evict_cache(5 * GB),
        Err(LedgerError::CacheUnderflow {
            counter: "cache_evictable",
            requested: 5 * GB,
            available: 4 * GB
        })
    );
    assert!(matches!(
        ledger.pin_cache(5 * GB),
        Err(LedgerError::CacheUnderflow { .. })
    ));
    ledger.pin_cache(3 * GB).expect("evictable");
    assert_eq!(
        ledger.unpin_cache(4 * GB),
        Err(LedgerError::CacheUnderflow {
            counter: "cache_pinned",
            requested: 4 * GB,
            available: 3 * GB
        })
    );
    assert!(matches!(
        ledger.evict_cache(2 * GB),
        Err(LedgerError::CacheUnderflow { .. })
    ));
    ledger.unpin_cache(3 * GB).expect("pinned");
    ledger.evict_cache(4 * GB).expect("evictable");
    assert_eq!(ledger.snapshot().cache_evictable_bytes, 0);
}

#[test]
fn a_grant_from_another_ledger_is_handed_back_unreleased() {
    let mut a = DeviceLedger::new(seed_profile(0));
    let mut b = DeviceLedger::new(seed_profile(1));
    let grant = a.commit(&any_request()).expect("fits");
    let foreign = b.release(grant).expect_err("not issued by b");
    assert!(foreign.to_string().contains("gpu1"));
    a.release(foreign.into_grant())
        .expect("released where it belongs");
    assert_eq!(a.snapshot().active_attempts, 0);
}

#[test]
fn every_profile_validation_error_names_its_field() {
    let base = || DeviceProfile::builder(dev(1)).managed_capacity(80 * GB);
    let cases: Vec<(&str, Result<DeviceProfile, crate::ConfigError>)> = vec![
        ("managed_capacity", DeviceProfile::builder(dev(1)).build()),
        ("managed_capacity", base().managed_capacity(0).build()),
        ("max_active_attempts", base().max_active_attempts(0).build()),
        (
            "source_work_allowance",
            base().source_work_allowance(0).build(),
        ),
        ("streams_per_attempt", base().streams_per_attempt(0).build()),
        ("workers_per_attempt", base().workers_per_attempt(0).build()),
        ("lanes_per_attempt", base().lanes_per_attempt(0).build()),
        ("backend_reserve", base().backend_reserve(81 * GB).build()),
        ("cache_cap", base().cache_cap(81 * GB).build()),
        ("attempt_floor", base().attempt_floor(0).build()),
        ("attempt_floor", base().managed_capacity(7).build()),
        ("attempt_floor", base().attempt_floor(96 * GB).build()),
        (
            "attempt_floor",
            base().attempt_floor(30 * GB).max_active_attempts(3).build(),
        ),
    ];
    for (field, result) in cases {
        let error = result.expect_err(field);
        assert_eq!(error.field(), field, "{error}");
        assert!(error.to_string().contains("gpu1"), "{error}");
    }
    let message = base().attempt_floor(96 * GB).build().expect_err("too big");
    assert!(
        message
            .to_string()
            .contains("96000000000 bytes exceeds managed_capacity 80000000000 bytes"),
        "{message}"
    );
}

#[test]
fn a_device_set_needs_exactly_one_ownership_per_profile() {
    let profile = |n: u32| {
        DeviceProfile::builder(dev(n))
            .managed_capacity(80 * GB)
            .backend_reserve(2 * GB)
            .build()
            .expect("valid")
    };
    let cases: Vec<(&str, Result<DeviceSet, crate::ConfigError>)> = vec![
        ("device_profiles", DeviceSet::new(vec![], vec![])),
        (
            "device_profiles",
            DeviceSet::new(
                vec![profile(0), profile(0)],
                vec![MemoryOwnership::exclusive(dev(0))],
            ),
        ),
        (
            "memory_ownership",
            DeviceSet::new(
                vec![profile(0)],
                vec![
                    MemoryOwnership::exclusive(dev(0)),
                    MemoryOwnership::shared(dev(0), GB),
                ],
            ),
        ),
        (
            "memory_ownership",
            DeviceSet::new(
                vec![profile(0)],
                vec![
                    MemoryOwnership::exclusive(dev(0)),
                    MemoryOwnership::exclusive(dev(1)),
                ],
            ),
        ),
        (
            "memory_ownership",
            DeviceSet::new(
                vec![profile(0), profile(1)],
                vec![MemoryOwnership::exclusive(dev(0))],
            ),
        ),
        (
            "external_bytes",
            DeviceSet::new(
                vec![profile(0)],
                vec![MemoryOwnership::shared(dev(0), 3 * GB)],
            ),
        ),
    ];
    for (field, result) in cases {
        assert_eq!(result.expect_err(field).field(), field);
    }
    let set = DeviceSet::new(
        vec![profile(2), profile(0)],
        vec![
            MemoryOwnership::shared(dev(2), 2 * GB),
            MemoryOwnership::exclusive(dev(0)),
        ],
    )
    .expect("valid");
    assert_eq!(set.ordinals(), vec![dev(0), dev(2)]);
    assert_eq!(set.len(), 2);
    assert_eq!(set.profile(dev(2)).map(|p| p.ordinal()), Some(dev(2)));
    assert_eq!(
        set.ownership(dev(2)).map(|o| o.mode()),
        Some(crate::gpu::profile::OwnershipMode::Shared {
            external_bytes: 2 * GB
        })
    );
    assert!(set.profile(dev(1)).is_none());
}

#[test]
fn queue_bounds_refuse_zero_pending_and_zero_wait() {
    assert_eq!(
        QueueBounds::new(0, Duration::from_secs(1), 2)
            .unwrap_err()
            .field(),
        "max_pending"
    );
    assert_eq!(
        QueueBounds::new(1, Duration::ZERO, 2).unwrap_err().field(),
        "max_wait"
    );
    let bounds = QueueBounds::new(64, Duration::from_secs(30), 0).expect("strict FIFO is valid");
    assert_eq!(
        (
            bounds.max_pending(),
            bounds.max_wait(),
            bounds.overtake_budget()
        ),
        (64, Duration::from_secs(30), 0)
    );
}

fn load(worker_depth: u32, available_streams: u32) -> DeviceLoad {
    DeviceLoad {
        worker_depth,
        available_streams,
    }
}

fn ranked_order(request: &GrantRequest, candidates: &[(&DeviceLedger, DeviceLoad)]) -> Vec<u32> {
    rank_devices(request, candidates.iter().copied())
        .iter()
        .map(|d| d.device.0)
        .collect()
}

#[test]
fn placement_ranks_by_spare_bytes_then_load_then_streams_then_ordinal() {
    let request = any_request().with_working_set_hint(0);
    let idle = |n| DeviceLedger::new(seed_profile(n));

    // 1. Spare bytes after admission, descending.
    let a = idle(0);
    let mut b = idle(1);
    b.charge_cache(GB).expect("fits");
    assert_eq!(
        ranked_order(&request, &[(&b, load(0, 1)), (&a, load(0, 1))]),
        [0, 1]
    );

    // 2a. Active attempts, ascending (spare bytes equal: a grant against
    // the same bytes of cache).
    let mut a = idle(0);
    a.charge_cache(10 * GB).expect("fits");
    let mut b = idle(1);
    let _held = b
        .commit(&any_request().with_working_set_hint(10 * GB))
        .expect("fits");
    assert_eq!(
        ranked_order(&request, &[(&b, load(0, 1)), (&a, load(0, 1))]),
        [0, 1]
    );

    // 2b. Live grants, ascending (same active count and spare bytes).
    let mut a = idle(0);
    let _a1 = a
        .commit(&any_request().with_working_set_hint(10 * GB))
        .expect("fits");
    a.charge_cache(5 * GB).expect("fits");
    let mut b = idle(1);
    let _b1 = b
        .commit(&any_request().with_working_set_hint(15 * GB))
        .expect("fits");
    assert_eq!(
        ranked_order(&request, &[(&b, load(0, 1)), (&a, load(0, 1))]),
        [0, 1]
    );

    // 2c. Worker depth, ascending.
    let (a, b) = (idle(0), idle(1));
    assert_eq!(
        ranked_order(&request, &[(&a, load(3, 1)), (&b, load(2, 1))]),
        [1, 0]
    );

    // 3. Stream availability, descending.
    assert_eq!(
        ranked_order(&request, &[(&a, load(0, 1)), (&b, load(0, 4))]),
        [1, 0]
    );

    // 4. Ordinal, ascending.
    assert_eq!(
        ranked_order(&request, &[(&b, load(0, 1)), (&a, load(0, 1))]),
        [0, 1]
    );

    // Only admissible devices take part.
    let mut closed = idle(2);
    closed.close();
    let ranked = rank_devices(&request, [(&closed, load(0, 9)), (&a, load(0, 1))]);
    assert_eq!(ranked.len(), 1);
    assert_eq!(ranked[0].grant_bytes, 10 * GB);
    assert_eq!(ranked[0].spare_bytes_after, 70 * GB);
}

#[test]
fn submission_checks_capabilities_and_whether_the_floor_can_ever_fit() {
    let small = DeviceProfile::builder(dev(0))
        .managed_capacity(40 * GB)
        .capabilities(caps(&["sort"]))
        .build()
        .expect("valid");
    let big = seed_profile(1);
    let profiles = [small.clone(), big.clone()];

    let needs = |names: &[&str], floor: u64| {
        let mut plan = PlanDescription::new(PlanFingerprint(9));
        for name in names {
            plan = plan.require(Capability::new(*name));
        }
        let plan = plan.phase(PhaseRequirement::new("p", floor, "op"));
        GrantRequest::for_proof(&ProofIssuer::new().lower(&plan).expect("resolved"))
    };
    assert_eq!(
        compatible_devices(&needs(&["sort"], GB), &profiles),
        Ok(vec![dev(0), dev(1)])
    );
    assert_eq!(
        compatible_devices(&needs(&["sort"], 30 * GB), &profiles),
        Ok(vec![dev(1)])
    );
    assert_eq!(
        compatible_devices(&needs(&["sort", "hash_join", "fp64"], GB), &profiles),
        Err(GpuAdmitError::NoCapableDevice {
            missing: caps(&["fp64"])
        })
    );
    assert_eq!(
        compatible_devices(&needs(&["sort"], 60 * GB), &profiles),
        Err(GpuAdmitError::FloorNeverFits {
            required_floor: 60 * GB,
            largest_possible: 50 * GB
        })
    );
}

#[test]
fn lowering_refuses_unresolved_owners_and_phases() {
    let issuer = ProofIssuer::new();
    let unresolved_owner = PlanDescription::new(PlanFingerprint(1)).phase(PhaseRequirement {
        name: "build".into(),
        min_working_bytes: Some(GB),
        owner: AllocationOwner::Unresolved,
    });
    assert_eq!(
        issuer.lower(&unresolved_owner),
        Err(LoweringError::UnresolvedOwner {
            phase: "build".into()
        })
    );
    let unresolved_phase = PlanDescription::new(PlanFingerprint(1)).phase(PhaseRequirement {
        name: "probe".into(),
        min_working_bytes: None,
        owner: AllocationOwner::Resolved("join".into()),
    });
    let error = issuer.lower(&unresolved_phase).expect_err("unresolved");
    assert_eq!(GpuAdmitError::from(error).reason(), "unresolved_phase");
}

#[test]
fn a_proof_records_its_issuer_and_the_largest_phase_floor() {
    let issuer = ProofIssuer::new();
    let plan = PlanDescription::new(PlanFingerprint(42))
        .require(Capability::new("sort"))
        .phase(PhaseRequirement::new("build", 3 * GB, "join"))
        .phase(PhaseRequirement::new("probe", 5 * GB, "join"))
        .phase(PhaseRequirement::new("sort", 2 * GB, "sort"));
    let proof = issuer.lower(&plan).expect("resolved");
    assert_eq!(proof.issuer_id(), issuer.id());
    assert_eq!(proof.fingerprint(), PlanFingerprint(42));
    assert_eq!(proof.required_floor_bytes(), 5 * GB);
    assert_eq!(proof.required_capabilities(), &caps(&["sort"]));
    assert_eq!(
        proof.allocation_owners().collect::<Vec<_>>(),
        ["join", "sort"]
    );
    assert_eq!(proof.bound_plans(), 1);
    assert_eq!(issuer.verify(&proof), Ok(()));

    let other = ProofIssuer::new();
    assert_ne!(other.id(), issuer.id());
    assert_eq!(
        other.verify(&proof),
        Err(LoweringError::ForeignProof {
            expected: other.id(),
            found: issuer.id()
        })
    );
}

#[test]
fn composition_binds_producers_and_consumer_into_one_proof() {
    let issuer = ProofIssuer::new();
    let lower = |fp: u64, cap: &str, floor: u64, owner: &str| {
        issuer
            .lower(
                &PlanDescription::new(PlanFingerprint(fp))
                    .require(Capability::new(cap))
                    .phase(PhaseRequirement::new("p", floor, owner)),
            )
            .expect("resolved")
    };
    let p1 = lower(1, "scan", 2 * GB, "scan_a");
    let p2 = lower(2, "scan", 6 * GB, "scan_b");
    let consumer = lower(3, "hash_join", 4 * GB, "join");
    let composed = issuer
        .compose(&[p1.clone(), p2.clone()], &consumer)
        .expect("same issuer");
    assert_eq!(
        composed.required_capabilities(),
        &caps(&["hash_join", "scan"])
    );
    assert_eq!(composed.required_floor_bytes(), 6 * GB);
    assert_eq!(
        composed.allocation_owners().collect::<Vec<_>>(),
        ["join", "scan_a", "scan_b"]
    );
    assert_eq!(composed.bound_plans(), 3);
    let swapped = issuer
        .compose(&[p2, p1.clone()], &consumer)
        .expect("same issuer");
    assert_ne!(
        composed.fingerprint(),
        swapped.fingerprint(),
        "order matters"
    );
    for part in [&p1, &consumer] {
        assert_ne!(composed.fingerprint(), part.fingerprint());
    }

    let foreign = ProofIssuer::new()
        .lower(&PlanDescription::new(PlanFingerprint(4)))
        .expect("empty plan");
    assert!(matches!(
        issuer.compose(&[p1, foreign], &consumer),
        Err(LoweringError::ForeignProof { .. })
    ));
}

#[test]
fn every_admission_error_has_an_outcome_and_a_stable_reason() {
    use QueryAdmissionOutcome as O;
    let table: Vec<(GpuAdmitError, O, &str)> = vec![
        (
            GpuAdmitError::NoCapableDevice {
                missing: caps(&["fp64"]),
            },
            O::Capability,
            "no_capable_device",
        ),
        (
            GpuAdmitError::UnresolvedOwner { phase: "p".into() },
            O::Configuration,
            "unresolved_owner",
        ),
        (
            GpuAdmitError::UnresolvedPhase { phase: "p".into() },
            O::Configuration,
            "unresolved_phase",
        ),
        (
            GpuAdmitError::PreflightFailed {
                device: Some(dev(0)),
                message: "m".into(),
            },
            O::Configuration,
            "preflight_failed",
        ),
        (
            GpuAdmitError::FloorNeverFits {
                required_floor: 2,
                largest_possible: 1,
            },
            O::Configuration,
            "floor_never_fits",
        ),
        (
            GpuAdmitError::QueueFull { max_pending: 8 },
            O::CapacityPressure,
            "queue_full",
        ),
        (
            GpuAdmitError::DeadlinePassed,
            O::Deadline,
            "deadline_passed",
        ),
        (
            GpuAdmitError::DeadlineExceeded {
                waited: Duration::from_millis(5),
            },
            O::Deadline,
            "deadline_exceeded",
        ),
        (
            GpuAdmitError::TimerUnavailable,
            O::Configuration,
            "timer_unavailable",
        ),
        (GpuAdmitError::Cancelled, O::Cancelled, "cancelled"),
        (GpuAdmitError::Closed, O::Closed, "closed"),
        (
            GpuAdmitError::NoHealthyDevice {
                devices: vec![dev(0), dev(1)],
            },
            O::DeviceFault,
            "no_healthy_device",
        ),
        (
            GpuAdmitError::DeviceFault {
                device: dev(1),
                code: 700,
            },
            O::DeviceFault,
            "device_fault",
        ),
        (
            GpuAdmitError::EnvelopeStepFailed {
                step: BackendOp::CreateRootStream,
                error: BackendError::Driver {
                    op: BackendOp::CreateRootStream,
                    code: 2,
                    message: "out of memory".into(),
                },
            },
            O::DeviceFault,
            "envelope_step_failed",
        ),
        (
            GpuAdmitError::EnvelopeStepFailed {
                step: BackendOp::OpenLane,
                error: BackendError::NoDriver,
            },
            O::Configuration,
            "envelope_step_failed",
        ),
        (
            GpuAdmitError::ForeignProof {
                expected: ProofIssuer::new().id(),
                found: ProofIssuer::new().id(),
            },
            O::Capability,
            "foreign_proof",
        ),
        (
            GpuAdmitError::ResourceOnlyHandle,
            O::Capability,
            "resource_only_handle",
        ),
    ];
    for (error, outcome, reason) in table {
        assert_eq!(error.outcome(), outcome, "{error}");
        assert_eq!(error.reason(), reason);
        assert!(!error.to_string().is_empty());
    }
    let step = GpuAdmitError::EnvelopeStepFailed {
        step: BackendOp::OpenDomain,
        error: BackendError::NoDevice,
    };
    assert!(step.to_string().contains("open_domain"));
    assert!(std::error::Error::source(&step).is_some());
    assert_eq!(O::CapacityPressure.name(), "capacity_pressure");
    let floor = GpuAdmitError::FloorNeverFits {
        required_floor: 96 << 30,
        largest_possible: 50 << 30,
    };
    assert!(floor.to_string().contains("96 GiB"), "{floor}");
}

// --- The conservation property -------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Commit {
        floor: u64,
        hint: Option<u64>,
        waiter: Option<u64>,
    },
    Release(usize),
    Charge(u64),
    Evict(u64),
    Pin(u64),
    Unpin(u64),
    Protect {
        waiter: u64,
        floor: u64,
    },
    Unprotect(u64),
    Quarantine,
}

fn op(capacity: u64) -> impl Strategy<Value = Op> {
    let bytes = 0..=capacity;
    prop_oneof![
        16 => (0..=capacity / 2, proptest::option::of(0..=capacity), proptest::option::of(0..3u64))
            .prop_map(|(floor, hint, waiter)| Op::Commit { floor, hint, waiter }),
        12 => any::<usize>().prop_map(Op::Release),
        8 => bytes.clone().prop_map(Op::Charge),
        8 => bytes.clone().prop_map(Op::Evict),
        4 => bytes.clone().prop_map(Op::Pin),
        4 => bytes.clone().prop_map(Op::Unpin),
        8 => (0..3u64, 0..=capacity / 2).prop_map(|(waiter, floor)| Op::Protect { waiter, floor }),
        4 => (0..3u64).prop_map(Op::Unprotect),
        // Rare: after it nothing more is admitted.
        1 => Just(Op::Quarantine),
    ]
}

fn scenario() -> impl Strategy<Value = (u64, u32, Option<u64>, u64, Vec<Op>)> {
    (1_000u64..100_000, 1u32..7, any::<bool>(), 0u64..=100).prop_flat_map(
        |(capacity, max_active, custom_floor, cache_pct)| {
            let floor = if custom_floor {
                Just(Some(capacity / u64::from(max_active) / 2 + 1)).boxed()
            } else {
                Just(None).boxed()
            };
            (
                Just(capacity),
                Just(max_active),
                floor,
                Just(capacity * cache_pct / 100),
                proptest::collection::vec(op(capacity), 1..60),
            )
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ledger_conserves_slots_and_bytes(
        (capacity, max_active, floor, cache_cap, ops) in scenario()
    ) {
        let mut builder = DeviceProfile::builder(dev(0))
            .managed_capacity(capacity)
            .max_active_attempts(max_active)
            .cache_cap(cache_cap);
        if let Some(floor) = floor {
            builder = builder.attempt_floor(floor);
        }
        let profile = builder.build().expect("valid by construction");
        let floor = profile.attempt_floor();
        let mut ledger = DeviceLedger::new(profile);
        // Each grant beside what it was at commit: (id, bytes, floor).
        let mut grants: Vec<(MemoryGrant, (GrantId, u64, u64))> = Vec::new();

        for op in ops {
            match op {
                Op::Commit { floor: phase, hint, waiter } => {
                    let mut request = GrantRequest::resource_only(phase);
                    if let Some(hint) = hint {
                        request = request.with_working_set_hint(hint);
                    }
                    if let Some(waiter) = waiter {
                        request = request.for_waiter(WaiterId::new(waiter));
                    }
                    let before = ledger.snapshot();
                    let decision = ledger.decide(&request);
                    match ledger.commit(&request) {
                        Ok(grant) => {
                            prop_assert_eq!(decision, Decision::Admit { grant_bytes: grant.bytes() });
                            prop_assert!(grant.bytes() >= ledger.required_floor(&request));
                            let r = ledger.snapshot();
                            let spoken = r.live_grants_bytes
                                + r.cache_evictable_bytes
                                + r.cache_pinned_bytes
                                + r.protected_bytes
                                + floor * u64::from(r.empty_unprotected_slots);
                            prop_assert!(spoken <= capacity, "{r:?}");
                            // Another waiter's protection is untouched.
                            if let Some(p) = before.protection {
                                if Some(p.waiter) != request.waiter() {
                                    prop_assert_eq!(r.protection, Some(p));
                                } else {
                                    prop_assert_eq!(r.protection, None);
                                }
                            }
                            let facts = (grant.id(), grant.bytes(), grant.required_floor());
                            grants.push((grant, facts));
                        }
                        Err(error) => {
                            prop_assert!(!matches!(decision, Decision::Admit { .. }), "{error}");
                            prop_assert_eq!(ledger.snapshot(), before);
                        }
                    }
                }
                Op::Release(i) => {
                    if !grants.is_empty() {
                        let (grant, facts) = grants.swap_remove(i % grants.len());
                        prop_assert_eq!(
                            (grant.id(), grant.bytes(), grant.required_floor()),
                            facts
                        );
                        let outcome = ledger.release(grant).expect("issued here");
                        prop_assert_eq!(outcome.bytes, facts.1);
                    }
                }
                Op::Charge(b) => { let _ = ledger.charge_cache(b); }
                Op::Evict(b) => { let _ = ledger.evict_cache(b); }
                Op::Pin(b) => { let _ = ledger.pin_cache(b); }
                Op::Unpin(b) => { let _ = ledger.unpin_cache(b); }
                Op::Protect { waiter, floor } => {
                    if let Ok(p) = ledger.protect(WaiterId::new(waiter), floor) {
                        prop_assert!(p.accumulated_bytes <= p.target_bytes);
                    }
                }
                Op::Unprotect(w) => { let _ = ledger.unprotect(WaiterId::new(w)); }
                Op::Quarantine => { ledger.quarantine(1); }
            }
            let r = ledger.snapshot();
            prop_assert!(r.active_attempts <= max_active);
            prop_assert_eq!(r.active_attempts as usize, grants.len());
            prop_assert_eq!(r.live_grant_count, grants.len());
            prop_assert_eq!(r.live_grants_bytes, grants.iter().map(|(_, f)| f.1).sum::<u64>());
            prop_assert!(r.cache_evictable_bytes + r.cache_pinned_bytes <= cache_cap);
            prop_assert!(
                r.live_grants_bytes + r.cache_evictable_bytes + r.cache_pinned_bytes
                    + r.protected_bytes <= capacity
            );
            if let Some(p) = r.protection {
                prop_assert!(p.accumulated_bytes <= p.target_bytes);
            }
        }

        for (grant, facts) in grants.drain(..) {
            prop_assert_eq!((grant.id(), grant.bytes(), grant.required_floor()), facts);
            ledger.release(grant).expect("issued here");
        }
        let r = ledger.snapshot();
        ledger.unpin_cache(r.cache_pinned_bytes).expect("pinned");
        ledger.evict_cache(r.cache_evictable_bytes + r.cache_pinned_bytes).expect("evictable");
        if let Some(p) = r.protection {
            ledger.unprotect(p.waiter).expect("held");
        }
        let r = ledger.snapshot();
        prop_assert_eq!(
            (r.active_attempts, r.live_grants_bytes, r.live_grant_count),
            (0, 0, 0)
        );
        prop_assert_eq!(
            (r.cache_evictable_bytes, r.cache_pinned_bytes, r.protected_bytes),
            (0, 0, 0)
        );
        prop_assert_eq!(r.protection, None);
    }
}

// ---------------------------------------------------------------------------
// Absurd values at the ledger's setters (from the GPU chaos suite).

const GIB: u64 = 1 << 30;

#[test]
fn an_overflowing_cache_charge_is_cache_cap_exceeded() {
    let profile = DeviceProfile::builder(dev(0))
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
    assert_eq!(ledger.snapshot().cache_evictable_bytes, GIB);
}

#[test]
fn absurd_profile_and_bounds_values_are_typed_errors_or_work() {
    let build = |capacity: u64, slots: u32| {
        DeviceProfile::builder(dev(0))
            .managed_capacity(capacity)
            .max_active_attempts(slots)
            .build()
    };
    assert!(build(0, 4).is_err());
    assert!(build(GIB, 0).is_err());
    // A capacity too small to give each of u32::MAX slots a byte.
    assert!(build(GIB, u32::MAX).is_err());
    assert!(DeviceProfile::builder(dev(0))
        .managed_capacity(GIB)
        .attempt_floor(u64::MAX)
        .build()
        .is_err());
    assert!(DeviceProfile::builder(dev(0))
        .managed_capacity(GIB)
        .cache_cap(u64::MAX)
        .build()
        .is_err());
    assert!(DeviceProfile::builder(dev(0))
        .managed_capacity(GIB)
        .backend_reserve(u64::MAX)
        .build()
        .is_err());
    let huge = build(u64::MAX, u32::MAX).expect("every slot gets a floor");
    assert_eq!(huge.managed_capacity(), u64::MAX);
    let mut ledger = DeviceLedger::new(huge);
    let report = ledger.snapshot();
    assert!(report.max_new_bytes.is_some());
    let request = GrantRequest::resource_only(0).with_working_set_hint(u64::MAX);
    let grant = ledger.commit(&request).expect("an empty ledger admits");
    assert!(ledger.protect(WaiterId::new(9), u64::MAX).is_err());
    ledger
        .protect(WaiterId::new(9), 0)
        .expect("a floor-sized protection");
    ledger.release(grant).expect("issued here");
    assert_eq!(
        ledger.charge_cache(u64::MAX),
        Err(LedgerError::CacheCapExceeded {
            requested: u64::MAX,
            resident: 0,
            cache_cap: 0,
        })
    );
    for change in [u64::MAX, 1] {
        assert!(matches!(
            ledger.evict_cache(change),
            Err(LedgerError::CacheUnderflow { .. })
        ));
        assert!(ledger.pin_cache(change).is_err());
        assert!(ledger.unpin_cache(change).is_err());
    }

    assert!(QueueBounds::new(0, Duration::from_secs(1), 0).is_err());
    assert!(QueueBounds::new(1, Duration::ZERO, 0).is_err());
    let bounds = QueueBounds::new(usize::MAX, Duration::MAX, u32::MAX).unwrap();
    assert_eq!(bounds.max_wait(), Duration::MAX);
}
