//! The synchronous core under random operation sequences: it never
//! overcommits a ledger, grants only on healthy ledgers, leaves no
//! admissible waiter behind a pass, and everything comes back. In the crate
//! because the core is crate-private.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use crate::gpu::backend::DeviceOrdinal;
use crate::gpu::ledger::{Decision, GrantRequest, MemoryGrant};
use crate::gpu::observe::GpuEvent;
use crate::gpu::scheduler::AdmissionCore;
use crate::gpu::{DeviceProfile, DeviceSet, LedgerState, MemoryOwnership, QueueBounds, WaiterId};

const GIB: u64 = 1 << 30;

fn dev(n: u32) -> DeviceOrdinal {
    DeviceOrdinal(n)
}

/// One device's profile: `capacity_gib` GiB and `slots` attempts, as the
/// service tests' rig builds it.
fn profile(ordinal: u32, capacity_gib: u64, slots: u32) -> DeviceProfile {
    DeviceProfile::builder(dev(ordinal))
        .managed_capacity(capacity_gib * GIB)
        .max_active_attempts(slots)
        .streams_per_attempt(2)
        .source_work_allowance(2)
        .build()
        .expect("valid profile")
}

#[derive(Clone, Debug)]
enum Op {
    Submit {
        floor_gib: u64,
        hint_gib: Option<u64>,
        only: Option<u32>,
    },
    Take(usize),
    Release(usize),
    Cancel(usize),
    Quarantine(u32),
    CloseLedgers,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..14, proptest::option::of(0u64..16), proptest::option::of(0u32..3))
            .prop_map(|(floor_gib, hint_gib, only)| Op::Submit { floor_gib, hint_gib, only }),
        3 => (0usize..16).prop_map(Op::Take),
        3 => (0usize..16).prop_map(Op::Release),
        2 => (0usize..16).prop_map(Op::Cancel),
        1 => (0u32..3).prop_map(Op::Quarantine),
        1 => Just(Op::CloseLedgers),
    ]
}

fn core() -> AdmissionCore {
    let profiles = vec![profile(0, 16, 3), profile(1, 16, 2), profile(2, 8, 4)];
    let ownerships = profiles
        .iter()
        .map(|p| MemoryOwnership::exclusive(p.ordinal()))
        .collect();
    AdmissionCore::new(
        &DeviceSet::new(profiles, ownerships).unwrap(),
        QueueBounds::new(12, Duration::from_secs(60), 1).unwrap(),
    )
}

fn assert_within_capacity(core: &AdmissionCore) {
    for r in core.ledger_snapshots() {
        let spoken = r.live_grants_bytes
            + r.cache_evictable_bytes
            + r.cache_pinned_bytes
            + r.protected_bytes
            + if r.state == LedgerState::Admitting {
                r.attempt_floor * u64::from(r.empty_unprotected_slots)
            } else {
                0
            };
        assert!(
            r.live_grants_bytes + r.protected_bytes <= r.managed_capacity,
            "{r:?}"
        );
        if r.state == LedgerState::Admitting {
            assert!(spoken <= r.managed_capacity, "{r:?}");
        }
        assert!(r.active_attempts <= r.max_active_attempts, "{r:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_core_never_overcommits_and_everything_comes_back(ops in proptest::collection::vec(op(), 1..80)) {
        let mut core = core();
        let now = Instant::now();
        let no_depth = |_: DeviceOrdinal| 0u64;
        let mut waiters: Vec<WaiterId> = Vec::new();
        // Grants taken by their waiters, with the bytes they had at commit.
        let mut running: Vec<(MemoryGrant, u64)> = Vec::new();
        let mut admitted_bytes = std::collections::HashMap::new();
        for op in ops {
            let mut events = Vec::new();
            match op {
                Op::Submit { floor_gib, hint_gib, only } => {
                    if let Ok(w) = core.reserve(now) {
                        let mut request = GrantRequest::resource_only(floor_gib * GIB);
                        if let Some(h) = hint_gib {
                            request = request.with_working_set_hint(h * GIB);
                        }
                        let candidates = match only {
                            Some(d) => vec![dev(d)],
                            None => vec![dev(0), dev(1), dev(2)],
                        };
                        let candidates: Vec<_> = candidates
                            .into_iter()
                            .filter(|d| core.ledger(*d).unwrap().profile().largest_possible_grant() >= floor_gib * GIB)
                            .collect();
                        if candidates.is_empty() {
                            core.cancel(w);
                        } else if core.resolve(w, request, candidates).is_ok() {
                            waiters.push(w);
                        }
                    }
                }
                Op::Take(i) => {
                    if !waiters.is_empty() {
                        let w = waiters[i % waiters.len()];
                        if let Some(outcome) = core.take_outcome(w) {
                            waiters.retain(|x| *x != w);
                            if let Ok(grant) = outcome {
                                let bytes = grant.bytes();
                                prop_assert_eq!(admitted_bytes.get(&w).copied(), Some(bytes));
                                running.push((grant, bytes));
                            }
                        }
                    }
                }
                Op::Release(i) => {
                    if !running.is_empty() {
                        let (grant, bytes) = running.swap_remove(i % running.len());
                        prop_assert_eq!(grant.bytes(), bytes, "grants never change");
                        let released = core.release(grant).expect("issued here");
                        prop_assert_eq!(released.bytes, bytes);
                    }
                }
                Op::Cancel(i) => {
                    if !waiters.is_empty() {
                        let w = waiters.remove(i % waiters.len());
                        core.cancel(w);
                    }
                }
                Op::Quarantine(d) => events.extend(core.quarantine(dev(d), 700)),
                Op::CloseLedgers => events.extend(core.close_ledgers()),
            }
            events.extend(core.schedule(&no_depth));
            for event in &events {
                if let GpuEvent::Admitted { waiter, grant_bytes, device, .. } = event {
                    prop_assert_eq!(
                        core.ledger(*device).unwrap().state(),
                        LedgerState::Admitting,
                        "grants only on healthy ledgers"
                    );
                    admitted_bytes.insert(*waiter, *grant_bytes);
                }
            }
            assert_within_capacity(&core);
            prop_assert!(core.depth() <= core.bounds().max_pending());
            // Work-conserving: after a pass, no queued waiter is admissible
            // on any of its devices, except one where an older waiter holds
            // a protection (younger work may not pass it there).
            let mut fenced = Vec::new();
            for w in core.snapshot(now, &no_depth).waiters {
                let request = GrantRequest::resource_only(w.phase_floor).for_waiter(w.waiter);
                for d in w.candidates.iter().filter(|d| !fenced.contains(*d)) {
                    let decision = core.ledger(*d).unwrap().decide(&request);
                    prop_assert!(
                        !matches!(decision, Decision::Admit { .. }),
                        "{:?} is admissible on {} after a pass", w.waiter, d
                    );
                }
                fenced.extend(w.protected_on);
            }
        }
        // Everybody leaves: cancel the waiters (releasing untaken grants),
        // release the running grants.
        for w in waiters {
            core.cancel(w);
        }
        for (grant, bytes) in running {
            prop_assert_eq!(core.release(grant).expect("issued here").bytes, bytes);
        }
        prop_assert_eq!(core.depth(), 0);
        for r in core.ledger_snapshots() {
            prop_assert_eq!(r.live_grants_bytes, 0);
            prop_assert_eq!(r.live_grant_count, 0);
            prop_assert_eq!(r.active_attempts, 0);
            prop_assert_eq!(r.protected_bytes, 0);
            prop_assert!(r.protection.is_none());
        }
    }
}
