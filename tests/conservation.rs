//! Property test: whatever happens, every slot comes back and every request
//! settles exactly once.
//!
//! A random sequence of operations (admit, poll, drop a waiting future, drop
//! or complete a permit, move the total, advance the paused clock, close)
//! runs across tenants, priorities and deadlines. Throughout, the granter
//! never holds more slots than there are permits and unobserved grants; at
//! quiescence every slot is back, nothing waits, and the queue's counters
//! agree with what the test saw.

mod common;

use std::time::Duration;

use admission::{AdmitError, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};
use common::{try_settle, Pending};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Admit {
        tenant: u64,
        priority: i8,
        timeout_ms: Option<u64>,
        bypass: bool,
        units: u64,
    },
    PollAll,
    DropWaiting(usize),
    ReleasePermit {
        index: usize,
        explicitly: bool,
    },
    SetTotal(u64),
    Advance(u64),
    SetWeight {
        tenant: u64,
        weight: u32,
    },
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1..4u64, prop::sample::select(vec![-128i8, -30, 0, 0, 50, 127]),
              prop::option::weighted(0.3, 1..30u64), prop::bool::weighted(0.05),
              prop::sample::select(vec![1u64, 1, 1, 2]))
            .prop_map(|(tenant, priority, timeout_ms, bypass, units)| Op::Admit { tenant, priority, timeout_ms, bypass, units }),
        3 => Just(Op::PollAll),
        2 => any::<usize>().prop_map(Op::DropWaiting),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(index, explicitly)| Op::ReleasePermit { index, explicitly }),
        1 => (0..5u64).prop_map(Op::SetTotal),
        2 => (0..15u64).prop_map(Op::Advance),
        1 => (1..4u64, 1..6u32).prop_map(|(tenant, weight)| Op::SetWeight { tenant, weight }),
        // Rare: closing ends the interesting part of a run.
        1 => prop::bool::weighted(0.1).prop_map(|close| if close { Op::Close } else { Op::PollAll }),
    ]
}

#[derive(Default)]
struct Seen {
    requested: u64,
    admitted: u64,
    errored: u64,
}

impl Seen {
    fn settle(&mut self, result: Result<SlotPermit, AdmitError>, permits: &mut Vec<SlotPermit>) {
        match result {
            Ok(permit) => {
                self.admitted += 1;
                permits.push(permit);
            }
            Err(_) => self.errored += 1,
        }
    }
}

/// Queue policies switched on for a run.
#[derive(Clone, Copy, Debug)]
struct Policies {
    grant_burst: Option<usize>,
    epoch_lifo: bool,
    early_rejection: bool,
    elastic_share: bool,
}

fn run(ops: Vec<Op>, policies: Policies) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut builder = WorkQueue::builder()
            .total_slots(2)
            .max_waiters(6)
            .early_rejection(policies.early_rejection);
        if let Some(burst) = policies.grant_burst {
            builder = builder.grant_burst(burst);
        }
        if policies.elastic_share {
            builder = builder.elastic_share(0.5);
        }
        if policies.epoch_lifo {
            builder = builder.epoch_lifo(admission::EpochLifo {
                epoch: Duration::from_millis(5),
                closing_delta: Duration::from_millis(1),
                lifo_delay: Duration::from_millis(4),
            });
        }
        let queue = builder.build().unwrap();
        let mut waiting: Vec<Pending> = Vec::new();
        let mut permits: Vec<SlotPermit> = Vec::new();
        let mut seen = Seen::default();

        for op in ops {
            match op {
                Op::Admit {
                    tenant,
                    priority,
                    timeout_ms,
                    bypass,
                    units,
                } => {
                    let mut work = WorkInfo::builder()
                        .tenant(TenantId::new(tenant))
                        .priority(Priority::new(priority))
                        .requested(units)
                        .bypass(bypass);
                    if let Some(ms) = timeout_ms {
                        work = work.timeout(Duration::from_millis(ms));
                    }
                    let mut admit = tokio_test::task::spawn(queue.admit(work.build()));
                    seen.requested += 1;
                    match try_settle(&mut admit) {
                        Some(result) => seen.settle(result, &mut permits),
                        None => waiting.push(admit),
                    }
                }
                Op::PollAll => {
                    waiting.retain_mut(|admit| match try_settle(admit) {
                        Some(result) => {
                            seen.settle(result, &mut permits);
                            false
                        }
                        None => true,
                    });
                }
                Op::DropWaiting(index) if !waiting.is_empty() => {
                    drop(waiting.swap_remove(index % waiting.len()));
                    // Cancelled: counted as errored by the queue.
                    seen.errored += 1;
                }
                Op::ReleasePermit { index, explicitly } if !permits.is_empty() => {
                    let permit = permits.swap_remove(index % permits.len());
                    if explicitly {
                        permit.done();
                    } else {
                        drop(permit);
                    }
                }
                Op::SetTotal(total) => queue.set_total_slots(total).unwrap(),
                Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                Op::SetWeight { tenant, weight } => queue.set_tenant_weight(
                    TenantId::new(tenant),
                    admission::TenantWeight::new(weight).unwrap(),
                ),
                Op::Close => queue.close(),
                Op::DropWaiting(_) | Op::ReleasePermit { .. } => {}
            }
            let snapshot = queue.snapshot();
            // Slots held never exceed what permits and grants not yet
            // observed can hold (two units at most each).
            prop_assert!(snapshot.granter.used <= 2 * (permits.len() + waiting.len()) as u64);
            prop_assert!(snapshot.waiting <= waiting.len());
        }

        // Quiescence: open the gates, let every deadline pass, and poll
        // until everything settles (with pacing, grants go out as earlier
        // grantees observe theirs, or after the pacing timeout).
        queue.set_total_slots(1_000).unwrap();
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(1)).await;
            queue.maintain();
            waiting.retain_mut(|admit| match try_settle(admit) {
                Some(result) => {
                    seen.settle(result, &mut permits);
                    false
                }
                None => true,
            });
        }
        prop_assert!(waiting.is_empty(), "requests still pending at quiescence");
        let snapshot = queue.snapshot();
        prop_assert!(snapshot.granter.used >= permits.len() as u64);
        prop_assert!(snapshot.granter.used <= 2 * permits.len() as u64);
        drop(permits);

        let snapshot = queue.snapshot();
        prop_assert_eq!(snapshot.granter.used, 0, "a slot leaked");
        prop_assert_eq!(snapshot.waiting, 0);
        let sum = |f: fn(&admission::observe::PrioritySnapshot) -> u64| {
            snapshot.priorities.iter().map(f).sum::<u64>()
        };
        prop_assert_eq!(sum(|p| p.requested), seen.requested);
        prop_assert_eq!(sum(|p| p.admitted), seen.admitted);
        prop_assert_eq!(sum(|p| p.errored), seen.errored);
        prop_assert_eq!(seen.requested, seen.admitted + seen.errored);
        // Once nothing is held, no tenant is charged for anything.
        prop_assert!(
            snapshot.tenants.iter().all(|t| t.used == 0),
            "{:?}",
            snapshot.tenants
        );
        Ok(())
    })
}

proptest! {
    // 256 cases by default; PROPTEST_CASES raises it for a longer search.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn every_slot_comes_back_and_every_request_settles_once(
        ops in prop::collection::vec(op(), 1..80),
        grant_burst in prop::option::of(1..3usize),
        epoch_lifo in any::<bool>(),
        early_rejection in any::<bool>(),
        elastic_share in any::<bool>(),
    ) {
        run(ops, Policies { grant_burst, epoch_lifo, early_rejection, elastic_share })?;
    }
}
