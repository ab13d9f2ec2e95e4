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
use admission::grant::SlotGranter;
use admission::{
    AdmitError, EpochLifo, Priority, SlotPermit, TenantId, TenantWeight, Usage, WorkInfo, WorkQueue,
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

fn run(ops: Vec<Op>, setup: Setup) -> Result<(), TestCaseError> {
    common::quiet_panics_saying("flaky granter");
    let runtime = common::paused_runtime();
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
                Op::SetWeight { tenant, weight } => {
                    // Refused only once `max_tenants` (4) tenants have a
                    // weight of their own, and then by name.
                    let set = queue.set_tenant_weight(
                        TenantId::new(tenant),
                        TenantWeight::new(weight).unwrap(),
                    );
                    if let Err(error) = set {
                        prop_assert_eq!(error.field(), "tenant_weight");
                    }
                }
                Op::ReplaceWeights(n) => {
                    let replaced = queue.set_tenant_weights(
                        (0..n).map(|id| (TenantId::new(id), TenantWeight::new(2).unwrap())),
                    );
                    prop_assert_eq!(replaced.is_ok(), n <= 4, "{:?}", replaced);
                }
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

/// Token queues under the same kind of abuse: refills and corrections of
/// `u64::MAX`, requests of every size, bursts switched on and off (zero
/// refused). Throughout, no balance is ever above the largest burst it had
/// or in more debt than sixty of them (see the io module's failure model); at
/// quiescence nothing waits and every request settled exactly once.
mod tokens {
    use super::*;
    use admission::grant::TokenGranter;
    use admission::TokenQueues;

    #[derive(Clone, Debug)]
    enum TokenOp {
        Admit {
            tenant: u64,
            elastic: bool,
            requested: u64,
            timeout: Option<Duration>,
        },
        PollAll,
        DropWaiting(usize),
        Complete {
            index: usize,
            actual: u64,
        },
        Add {
            regular: u64,
            elastic: u64,
        },
        SetLimits {
            regular: Option<u64>,
            elastic: Option<u64>,
        },
        Advance(Duration),
    }

    fn amount() -> impl Strategy<Value = u64> {
        prop::sample::select(vec![0u64, 1, 100, 4096, 1 << 40, u64::MAX])
    }

    fn token_op() -> impl Strategy<Value = TokenOp> {
        let burst =
            prop::option::weighted(0.8, prop::sample::select(vec![0u64, 1, 4096, u64::MAX]));
        prop_oneof![
            6 => (0..6u64, any::<bool>(), amount(), prop::option::weighted(0.4, prop::sample::select(vec![
                Duration::ZERO, Duration::from_millis(5), Duration::MAX])))
                .prop_map(|(tenant, elastic, requested, timeout)| TokenOp::Admit { tenant, elastic, requested, timeout }),
            3 => Just(TokenOp::PollAll),
            1 => any::<usize>().prop_map(TokenOp::DropWaiting),
            3 => (any::<usize>(), amount()).prop_map(|(index, actual)| TokenOp::Complete { index, actual }),
            3 => (amount(), amount()).prop_map(|(regular, elastic)| TokenOp::Add { regular, elastic }),
            1 => (burst.clone(), burst).prop_map(|(regular, elastic)| TokenOp::SetLimits { regular, elastic }),
            1 => prop::sample::select(vec![Duration::from_millis(3), Duration::from_secs(2)]).prop_map(TokenOp::Advance),
        ]
    }

    type Admitted = (WorkInfo, SlotPermit<TokenGranter>);

    fn run_tokens(ops: Vec<TokenOp>) -> Result<(), TestCaseError> {
        let runtime = common::paused_runtime();
        runtime.block_on(async move {
            let queues = TokenQueues::new(4096, 4096).unwrap();
            let mut waiting: Vec<(WorkInfo, Spawn<admission::Admit<TokenGranter>>)> = Vec::new();
            let mut admitted: Vec<Admitted> = Vec::new();
            let (mut requested, mut granted, mut failed) = (0u64, 0u64, 0u64);
            // The largest burst each class has had: its debt bound.
            let mut largest_burst = 4096u64;
            for op in ops {
                match op {
                    TokenOp::Admit {
                        tenant,
                        elastic,
                        requested: units,
                        timeout,
                    } => {
                        let mut work = WorkInfo::builder()
                            .tenant(TenantId::new(tenant))
                            .priority(if elastic {
                                Priority::BULK_NORMAL
                            } else {
                                Priority::NORMAL
                            })
                            .requested(units);
                        if let Some(timeout) = timeout {
                            work = work.timeout(timeout);
                        }
                        let work = work.build();
                        let mut admit = tokio_test::task::spawn(queues.admit(work.clone()));
                        requested += 1;
                        match admit.poll() {
                            std::task::Poll::Ready(Ok(permit)) => {
                                granted += 1;
                                admitted.push((work, permit));
                            }
                            std::task::Poll::Ready(Err(_)) => failed += 1,
                            std::task::Poll::Pending => waiting.push((work, admit)),
                        }
                    }
                    TokenOp::PollAll => waiting.retain_mut(|(work, admit)| match admit.poll() {
                        std::task::Poll::Ready(Ok(permit)) => {
                            granted += 1;
                            admitted.push((work.clone(), permit));
                            false
                        }
                        std::task::Poll::Ready(Err(_)) => {
                            failed += 1;
                            false
                        }
                        std::task::Poll::Pending => true,
                    }),
                    TokenOp::DropWaiting(index) if !waiting.is_empty() => {
                        drop(waiting.swap_remove(index % waiting.len()));
                        failed += 1;
                    }
                    TokenOp::Complete { index, actual } if !admitted.is_empty() => {
                        let (work, permit) = admitted.swap_remove(index % admitted.len());
                        queues.correct_tokens(&work, work.requested(), actual);
                        drop(permit);
                    }
                    TokenOp::DropWaiting(_) | TokenOp::Complete { .. } => {}
                    TokenOp::Add { regular, elastic } => queues.add_tokens(regular, elastic),
                    TokenOp::SetLimits { regular, elastic } => {
                        let result = queues.set_limits(regular, elastic);
                        prop_assert_eq!(result.is_ok(), regular != Some(0) && elastic != Some(0));
                        if result.is_ok() {
                            largest_burst = largest_burst
                                .max(regular.unwrap_or(0))
                                .max(elastic.unwrap_or(0));
                        }
                    }
                    TokenOp::Advance(by) => tokio::time::advance(by).await,
                }
                for queue in [queues.regular(), queues.elastic()] {
                    let balance = queue.snapshot().granter;
                    if !balance.unlimited {
                        // A lowered burst does not cut a balance already
                        // banked: the bound is the largest burst so far.
                        prop_assert!(
                            i128::from(balance.available) <= i128::from(largest_burst),
                            "{balance:?}"
                        );
                        let bound = i128::from(largest_burst) * 61;
                        prop_assert!(i128::from(balance.available) >= -bound, "{balance:?}");
                    }
                }
            }
            // Quiescence: budgets off, every waiter granted or expired.
            queues.set_limits(None, None).unwrap();
            // A few rounds: a future first polled when this task's
            // cooperative budget had run out has not asked yet.
            for _ in 0..4 {
                tokio::time::advance(Duration::from_secs(1)).await;
                waiting.retain_mut(|(_, admit)| match admit.poll() {
                    std::task::Poll::Ready(Ok(_)) => {
                        granted += 1;
                        false
                    }
                    std::task::Poll::Ready(Err(_)) => {
                        failed += 1;
                        false
                    }
                    std::task::Poll::Pending => true,
                });
            }
            prop_assert!(
                waiting.is_empty(),
                "{} token requests still pending: {:?}; regular {:?}; elastic {:?}",
                waiting.len(),
                waiting
                    .iter()
                    .map(|(w, _)| (w.priority(), w.requested()))
                    .collect::<Vec<_>>(),
                queues.regular().snapshot(),
                queues.elastic().snapshot()
            );
            drop(admitted);
            let mut counted = (0u64, 0u64, 0u64);
            for queue in [queues.regular(), queues.elastic()] {
                let snapshot = queue.snapshot();
                prop_assert_eq!(snapshot.waiting, 0);
                for p in &snapshot.priorities {
                    counted.0 += p.requested;
                    counted.1 += p.admitted;
                    counted.2 += p.errored;
                }
            }
            prop_assert_eq!(counted, (requested, granted, failed));
            Ok(())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::default())]

        #[test]
        fn absurd_token_calls_keep_balances_bounded_and_settle_every_request(
            ops in prop::collection::vec(token_op(), 1..100),
        ) {
            run_tokens(ops)?;
        }
    }
}
