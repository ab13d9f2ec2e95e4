//! Property test: random API calls with absurd values never panic, never
//! wedge a queue and never lose a unit.
//!
//! Like `conservation.rs`, but the operations reach for the edges: requests
//! for zero or `u64::MAX` units, deadlines of zero and `Duration::MAX`,
//! tenant ids at both ends, totals from zero to the maximum (and past it,
//! which must be refused), clock jumps of days, weight tables replaced
//! wholesale, and a custom granter that starts and stops panicking. At
//! quiescence every unit is back with the granter, nothing waits, and
//! every request settled exactly once.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission::grant::Granter;
use admission::{
    AdmitError, EpochLifo, Priority, SlotGranter, SlotPermit, TenantId, TenantWeight, Usage,
    WorkInfo, WorkQueue,
};
use proptest::prelude::*;
use tokio_test::task::Spawn;

#[derive(Clone, Debug)]
enum Op {
    Admit {
        tenant: u64,
        priority: i8,
        timeout: Option<Duration>,
        bypass: bool,
        units: u64,
    },
    PollAll,
    DropWaiting(usize),
    ReleasePermit(usize),
    SetTotal(u64),
    Advance(Duration),
    Maintain,
    SetWeight {
        tenant: u64,
        weight: u32,
    },
    ReplaceWeights(u64),
    /// Only with the flaky granter: start or stop panicking.
    Break(bool),
}

fn op() -> impl Strategy<Value = Op> {
    let tenant = prop_oneof![4 => 0..4u64, 2 => 4..40u64, 1 => Just(u64::MAX)];
    let units = prop::sample::select(vec![0u64, 1, 1, 1, 2, 3, 1 << 40, u64::MAX]);
    let timeout = prop::option::weighted(
        0.4,
        prop::sample::select(vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(3),
            Duration::from_millis(20),
            Duration::from_secs(3600 * 24 * 365),
            Duration::MAX,
        ]),
    );
    prop_oneof![
        8 => (tenant, any::<i8>(), timeout, prop::bool::weighted(0.05), units)
            .prop_map(|(tenant, priority, timeout, bypass, units)| Op::Admit { tenant, priority, timeout, bypass, units }),
        4 => Just(Op::PollAll),
        2 => any::<usize>().prop_map(Op::DropWaiting),
        4 => any::<usize>().prop_map(Op::ReleasePermit),
        1 => prop::sample::select(vec![0u64, 1, 2, 3, SlotGranter::MAX_TOTAL, SlotGranter::MAX_TOTAL + 1, u64::MAX]).prop_map(Op::SetTotal),
        2 => prop::sample::select(vec![
            Duration::from_millis(1),
            Duration::from_millis(7),
            Duration::from_secs(2),
            Duration::from_secs(3 * 24 * 3600),
        ]).prop_map(Op::Advance),
        1 => Just(Op::Maintain),
        1 => (prop::sample::select(vec![0u64, 1, u64::MAX]), prop::sample::select(vec![1u32, 7, 1000]))
            .prop_map(|(tenant, weight)| Op::SetWeight { tenant, weight }),
        1 => (0..500u64).prop_map(Op::ReplaceWeights),
        1 => any::<bool>().prop_map(Op::Break),
    ]
}

/// A slot granter whose every method panics while broken.
#[derive(Debug)]
struct Flaky {
    slots: SlotGranter,
    broken: AtomicBool,
}

impl Flaky {
    fn check(&self) {
        if self.broken.load(Ordering::SeqCst) {
            panic!("flaky granter");
        }
    }
}

impl Granter for Flaky {
    type State = admission::grant::SlotState;
    type Snapshot = admission::grant::SlotSnapshot;
    fn initial_state(&self) -> Self::State {
        self.slots.initial_state()
    }
    fn try_get(&self, state: &mut Self::State, count: u64) -> bool {
        self.check();
        self.slots.try_get(state, count)
    }
    fn return_grant(&self, state: &mut Self::State, count: u64) {
        self.check();
        self.slots.return_grant(state, count)
    }
    fn took_without_permission(&self, state: &mut Self::State, count: u64) {
        self.check();
        self.slots.took_without_permission(state, count)
    }
    fn snapshot(&self, state: &Self::State) -> Self::Snapshot {
        self.slots.snapshot(state)
    }
    fn capacity(&self, state: &Self::State) -> Option<u64> {
        self.check();
        self.slots.capacity(state)
    }
    fn max_request(&self, state: &Self::State) -> Option<u64> {
        self.check();
        self.slots.max_request(state)
    }
}

#[derive(Default)]
struct Seen {
    requested: u64,
    admitted: u64,
    errored: u64,
}

impl Seen {
    fn settle(
        &mut self,
        result: Result<SlotPermit<Flaky>, AdmitError>,
        permits: &mut Vec<SlotPermit<Flaky>>,
    ) {
        match result {
            Ok(permit) => {
                self.admitted += 1;
                permits.push(permit);
            }
            Err(_) => self.errored += 1,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    flaky: bool,
    epoch_lifo: bool,
    early_rejection: bool,
    granted_usage: bool,
    grant_burst: Option<usize>,
}

/// The flaky granter's panics are expected by the hundred: keep them off
/// stderr, and every other panic on it.
fn quiet_flaky_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&"flaky granter") {
                default(info);
            }
        }));
    });
}

fn run(ops: Vec<Op>, setup: Setup) -> Result<(), TestCaseError> {
    quiet_flaky_panics();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut builder = WorkQueue::builder()
            .max_waiters(8)
            .max_tenants(4)
            .early_rejection(setup.early_rejection)
            .usage(if setup.granted_usage {
                Usage::Granted
            } else {
                Usage::Held
            });
        if setup.epoch_lifo {
            builder = builder.epoch_lifo(EpochLifo::for_deadline(Duration::from_millis(5)));
        }
        if let Some(burst) = setup.grant_burst {
            builder = builder.grant_burst(burst);
        }
        let queue = builder
            .build_with(Flaky {
                slots: SlotGranter::new(2).unwrap(),
                broken: AtomicBool::new(false),
            })
            .unwrap();
        let mut waiting: Vec<Spawn<admission::Admit<Flaky>>> = Vec::new();
        let mut permits: Vec<SlotPermit<Flaky>> = Vec::new();
        let mut seen = Seen::default();
        for op in ops {
            match op {
                Op::Admit {
                    tenant,
                    priority,
                    timeout,
                    bypass,
                    units,
                } => {
                    let mut work = WorkInfo::builder()
                        .tenant(TenantId::new(tenant))
                        .priority(Priority::new(priority))
                        .requested(units)
                        .bypass(bypass);
                    if let Some(timeout) = timeout {
                        work = work.timeout(timeout);
                    }
                    let mut admit = tokio_test::task::spawn(queue.admit(work.build()));
                    seen.requested += 1;
                    match admit.poll() {
                        std::task::Poll::Ready(result) => seen.settle(result, &mut permits),
                        std::task::Poll::Pending => waiting.push(admit),
                    }
                }
                Op::PollAll => waiting.retain_mut(|admit| match admit.poll() {
                    std::task::Poll::Ready(result) => {
                        seen.settle(result, &mut permits);
                        false
                    }
                    std::task::Poll::Pending => true,
                }),
                Op::DropWaiting(index) if !waiting.is_empty() => {
                    drop(waiting.swap_remove(index % waiting.len()));
                    seen.errored += 1;
                }
                Op::ReleasePermit(index) if !permits.is_empty() => {
                    drop(permits.swap_remove(index % permits.len()));
                }
                Op::DropWaiting(_) | Op::ReleasePermit(_) => {}
                Op::SetTotal(total) => {
                    let result = queue.granter().slots.set_total(total);
                    prop_assert_eq!(result.is_ok(), total <= SlotGranter::MAX_TOTAL);
                    // What `set_total_slots` does for a slot queue: grant
                    // what a raise opened.
                    admission::grant::Requester::granted(&queue);
                }
                Op::Advance(by) => tokio::time::advance(by).await,
                Op::Maintain => queue.maintain(),
                Op::SetWeight { tenant, weight } => queue
                    .set_tenant_weight(TenantId::new(tenant), TenantWeight::new(weight).unwrap()),
                Op::ReplaceWeights(n) => queue.set_tenant_weights(
                    (0..n).map(|id| (TenantId::new(id), TenantWeight::new(2).unwrap())),
                ),
                Op::Break(broken) if setup.flaky => {
                    queue.granter().broken.store(broken, Ordering::SeqCst)
                }
                Op::Break(_) => {}
            }
            prop_assert!(queue.waiting() <= waiting.len());
            let tenants = queue.snapshot().tenants;
            // The cap (4), exceeded only by tenants that had waiting work at
            // the last sweep: at most twice `max_waiters`.
            prop_assert!(
                tenants.len() <= 16,
                "{} tenant records, {} waiting: {:?}",
                tenants.len(),
                waiting.len(),
                tenants
            );
        }

        // Quiescence: repair, open the gates, let every deadline pass.
        queue.granter().broken.store(false, Ordering::SeqCst);
        queue
            .granter()
            .slots
            .set_total(SlotGranter::MAX_TOTAL)
            .unwrap();
        admission::grant::Requester::granted(&queue);
        for _ in 0..10 {
            // Work completes (a bypass may hold more than any total).
            permits.clear();
            tokio::time::advance(Duration::from_secs(1)).await;
            queue.maintain();
            waiting.retain_mut(|admit| match admit.poll() {
                std::task::Poll::Ready(result) => {
                    seen.settle(result, &mut permits);
                    false
                }
                std::task::Poll::Pending => true,
            });
        }
        // A request without a deadline for more than the granter can ever
        // give was refused, not left waiting: nothing is pending.
        prop_assert!(
            waiting.is_empty(),
            "{} requests still pending",
            waiting.len()
        );
        drop(permits);
        // One more take settles any return still owed from a panic.
        drop(
            queue
                .admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL))
                .await,
        );
        seen.requested += 1;
        seen.admitted += 1;
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
        if !setup.flaky {
            prop_assert!(snapshot.granter_health.is_healthy());
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn absurd_calls_never_panic_wedge_or_lose_a_unit(
        ops in prop::collection::vec(op(), 1..100),
        flaky in any::<bool>(),
        epoch_lifo in any::<bool>(),
        early_rejection in any::<bool>(),
        granted_usage in any::<bool>(),
        grant_burst in prop::option::of(1..3usize),
    ) {
        run(ops, Setup { flaky, epoch_lifo, early_rejection, granted_usage, grant_burst })?;
    }
}
