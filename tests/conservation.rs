//! Property test: whatever happens, every slot comes back and every request
//! settles exactly once.
//!
//! A random sequence of operations (admit, poll, drop a waiting future, drop
//! or complete a permit, move the total, advance the paused clock, close)
//! runs across tenants, priorities and deadlines. Throughout, the granter
//! never holds more slots than there are permits and unobserved grants; at
//! quiescence every slot is back, nothing waits, and the queue's counters
//! agree with what the test saw. Permits may also give their slots back
//! for a wait (`SlotPermit::release_during`) and ask again when the test
//! ends the wait, or offer them to higher priorities
//! (`SlotPermit::give_way`); at the end, the elastic share's count is back
//! to zero too. Permits may run work that gives its slots back by itself
//! while it waits (`SlotPermit::run`), once the runtime takes a turn, and
//! asks for them again when the test ends the wait. The same property is
//! run through the CPU pool, whose threads take the place of the permits.

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
    },
    SetTotal(u64),
    /// A permit gives its slots back for a wait the test ends later.
    Release(usize),
    /// Ends one such wait: the work asks for its slots again.
    EndWait(usize),
    DropReleased(usize),
    /// A permit offers its slots to waiting work of higher priority.
    GiveWay(usize),
    /// Drops a permit's offer while it asks for its slots again.
    DropGivingWay(usize),
    /// A permit runs work that waits for the test, yields, and completes.
    Run(usize),
    /// Ends one such wait.
    EndRunWait(usize),
    DropRun(usize),
    /// The runtime takes a turn: probes of runs still waiting give their
    /// slots back.
    Turn,
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
        4 => any::<usize>().prop_map(|index| Op::ReleasePermit { index }),
        1 => (0..5u64).prop_map(Op::SetTotal),
        2 => any::<usize>().prop_map(Op::Release),
        2 => any::<usize>().prop_map(Op::EndWait),
        1 => any::<usize>().prop_map(Op::DropReleased),
        2 => any::<usize>().prop_map(Op::GiveWay),
        1 => any::<usize>().prop_map(Op::DropGivingWay),
        2 => any::<usize>().prop_map(Op::Run),
        2 => any::<usize>().prop_map(Op::EndRunWait),
        1 => any::<usize>().prop_map(Op::DropRun),
        2 => Just(Op::Turn),
        2 => (0..15u64).prop_map(Op::Advance),
        1 => (1..4u64, 1..6u32).prop_map(|(tenant, weight)| Op::SetWeight { tenant, weight }),
        // Rare: closing ends the interesting part of a run.
        1 => prop::bool::weighted(0.1).prop_map(|close| if close { Op::Close } else { Op::PollAll }),
    ]
}

#[derive(Default)]
struct Seen {
    requested: u64,
    /// Of `requested`, work that released or gave way asking again.
    resumed: u64,
    admitted: u64,
    errored: u64,
    /// The refusals seen, by `AdmitError::reason`.
    refused: std::collections::BTreeMap<&'static str, u64>,
    /// Futures dropped before they saw an outcome.
    cancelled: u64,
}

impl Seen {
    fn settle(&mut self, result: Result<SlotPermit, AdmitError>, permits: &mut Vec<SlotPermit>) {
        match result {
            Ok(permit) => {
                self.admitted += 1;
                permits.push(permit);
            }
            Err(error) => {
                self.errored += 1;
                *self.refused.entry(error.reason()).or_default() += 1;
            }
        }
    }

    fn cancel(&mut self) {
        self.errored += 1;
        self.cancelled += 1;
    }
}

/// The queue's refusal counters over every priority, by reason, leaving out
/// the reasons never seen (as `Seen::refused` does) and cancellations
/// (`Seen::cancelled`).
fn refusals_by_reason(
    priorities: &[admission::observe::PrioritySnapshot],
) -> std::collections::BTreeMap<&'static str, u64> {
    let mut by_reason = std::collections::BTreeMap::new();
    for p in priorities {
        for (reason, count) in p.refusals.by_reason() {
            if count > 0 && reason != "cancelled" {
                *by_reason.entry(reason).or_default() += count;
            }
        }
    }
    by_reason
}

type AskAgain = std::pin::Pin<
    Box<
        dyn std::future::Future<
            Output = (
                Result<(), tokio::sync::oneshot::error::RecvError>,
                Result<SlotPermit, AdmitError>,
            ),
        >,
    >,
>;

/// Work that gave its slots back for a wait, as the test sees it.
struct Released {
    future: tokio_test::task::Spawn<AskAgain>,
    /// Ends the wait; `None` once sent.
    end: Option<tokio::sync::oneshot::Sender<()>>,
    /// Polled since its wait ended: it has asked the queue again.
    asked: bool,
}

impl Released {
    /// Polls it; its admission's result once it has one.
    fn poll(&mut self, seen: &mut Seen) -> Option<Result<SlotPermit, AdmitError>> {
        let waiting = self.end.is_some();
        match self.future.poll() {
            std::task::Poll::Ready((_, result)) => {
                if !self.asked {
                    seen.requested += 1;
                    seen.resumed += 1;
                }
                Some(result)
            }
            std::task::Poll::Pending => {
                if !waiting && !self.asked {
                    self.asked = true;
                    seen.requested += 1;
                    seen.resumed += 1;
                }
                None
            }
        }
    }
}

type RunFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), AdmitError>>>>;

/// Work run by `SlotPermit::run`, as the test sees it.
struct Running {
    future: tokio_test::task::Spawn<RunFuture>,
    /// Ends its wait; `None` once sent.
    end: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Running {
    /// Polls it: `Some` with its outcome once it has completed.
    fn poll(&mut self) -> Option<Result<(), AdmitError>> {
        match self.future.poll() {
            std::task::Poll::Ready(result) => Some(result),
            std::task::Poll::Pending => None,
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
    let runtime = common::paused_runtime();
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
        let mut released: Vec<Released> = Vec::new();
        // Permits that gave way, asking for their slots again.
        let mut giving_way: Vec<tokio_test::task::Spawn<admission::GiveWay>> = Vec::new();
        let mut running: Vec<Running> = Vec::new();
        // Runs refused their slots when they asked again after a wait.
        let mut runs_refused = 0u64;
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
                    released.retain_mut(|work| match work.poll(&mut seen) {
                        Some(result) => {
                            seen.settle(result, &mut permits);
                            false
                        }
                        None => true,
                    });
                    giving_way.retain_mut(|work| match work.poll() {
                        std::task::Poll::Ready(result) => {
                            seen.settle(result, &mut permits);
                            false
                        }
                        std::task::Poll::Pending => true,
                    });
                    running.retain_mut(|work| match work.poll() {
                        Some(result) => {
                            runs_refused += u64::from(result.is_err());
                            false
                        }
                        None => true,
                    });
                }
                Op::Run(index) if !permits.is_empty() => {
                    let permit = permits.swap_remove(index % permits.len());
                    let (end, ended) = tokio::sync::oneshot::channel::<()>();
                    let future: RunFuture = Box::pin(permit.run(async move {
                        let _ = ended.await;
                        tokio::task::yield_now().await;
                    }));
                    let mut work = Running {
                        future: tokio_test::task::spawn(future),
                        end: Some(end),
                    };
                    prop_assert!(work.poll().is_none(), "it waits for the test");
                    running.push(work);
                }
                Op::EndRunWait(index) if !running.is_empty() => {
                    let count = running.len();
                    if let Some(end) = running[index % count].end.take() {
                        let _ = end.send(());
                    }
                }
                Op::DropRun(index) if !running.is_empty() => {
                    drop(running.swap_remove(index % running.len()));
                }
                Op::Turn => tokio::task::yield_now().await,
                Op::GiveWay(index) if !permits.is_empty() => {
                    let permit = permits.swap_remove(index % permits.len());
                    let gave_way = permit.give_way();
                    let asks_again = gave_way.gave_way();
                    let mut gave_way = tokio_test::task::spawn(gave_way);
                    match gave_way.poll() {
                        // Kept: the same permit, no admission.
                        std::task::Poll::Ready(Ok(permit)) if !asks_again => permits.push(permit),
                        std::task::Poll::Ready(result) => {
                            prop_assert!(asks_again, "a kept permit came back as {result:?}");
                            prop_assert!(
                                !matches!(result, Err(AdmitError::QueueFull { .. })),
                                "work that gave way found the queue full"
                            );
                            seen.requested += 1;
                            seen.resumed += 1;
                            seen.settle(result, &mut permits);
                        }
                        std::task::Poll::Pending => {
                            prop_assert!(asks_again, "a kept permit must come back at once");
                            seen.requested += 1;
                            seen.resumed += 1;
                            giving_way.push(gave_way);
                        }
                    }
                }
                Op::DropGivingWay(index) if !giving_way.is_empty() => {
                    drop(giving_way.swap_remove(index % giving_way.len()));
                    // Cancelled while it waited: counted as errored.
                    seen.cancel();
                }
                Op::Release(index) if !permits.is_empty() => {
                    let permit = permits.swap_remove(index % permits.len());
                    let (end, ended) = tokio::sync::oneshot::channel::<()>();
                    let future: AskAgain = Box::pin(permit.release_during(ended));
                    released.push(Released {
                        future: tokio_test::task::spawn(future),
                        end: Some(end),
                        asked: false,
                    });
                }
                Op::EndWait(index) if !released.is_empty() => {
                    let count = released.len();
                    if let Some(end) = released[index % count].end.take() {
                        let _ = end.send(());
                    }
                }
                Op::DropReleased(index) if !released.is_empty() => {
                    let work = released.swap_remove(index % released.len());
                    // Dropped while it waited in the queue: counted as
                    // errored by the queue, as a dropped `Admit` is.
                    if work.asked {
                        seen.cancel();
                    }
                }
                Op::DropWaiting(index) if !waiting.is_empty() => {
                    drop(waiting.swap_remove(index % waiting.len()));
                    // Cancelled: counted as errored by the queue.
                    seen.cancel();
                }
                Op::ReleasePermit { index } if !permits.is_empty() => {
                    drop(permits.swap_remove(index % permits.len()));
                }
                Op::SetTotal(total) => queue.set_total_slots(total).unwrap(),
                Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                Op::SetWeight { tenant, weight } => queue
                    .set_tenant_weight(
                        TenantId::new(tenant),
                        admission::TenantWeight::new(weight).unwrap(),
                    )
                    .unwrap(),
                Op::Close => queue.close(),
                Op::DropWaiting(_)
                | Op::ReleasePermit { .. }
                | Op::Release(_)
                | Op::EndWait(_)
                | Op::DropReleased(_)
                | Op::GiveWay(_)
                | Op::DropGivingWay(_)
                | Op::Run(_)
                | Op::EndRunWait(_)
                | Op::DropRun(_) => {}
            }
            let snapshot = queue.snapshot();
            // Slots held never exceed what permits and grants not yet
            // observed can hold (two units at most each).
            let asked = released.iter().filter(|work| work.asked).count()
                + giving_way.len()
                + running.len();
            prop_assert!(
                snapshot.granter.used <= 2 * (permits.len() + waiting.len() + asked) as u64
            );
            prop_assert!(snapshot.waiting <= waiting.len() + asked);
        }

        // Quiescence: open the gates, let every deadline pass, and poll
        // until everything settles (with pacing, grants go out as earlier
        // grantees observe theirs, or after the pacing timeout).
        queue.set_total_slots(1_000).unwrap();
        for work in &mut released {
            if let Some(end) = work.end.take() {
                let _ = end.send(());
            }
        }
        for work in &mut running {
            if let Some(end) = work.end.take() {
                let _ = end.send(());
            }
        }
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(1)).await;
            tokio::task::yield_now().await;
            queue.maintain();
            running.retain_mut(|work| match work.poll() {
                Some(result) => {
                    runs_refused += u64::from(result.is_err());
                    false
                }
                None => true,
            });
            waiting.retain_mut(|admit| match try_settle(admit) {
                Some(result) => {
                    seen.settle(result, &mut permits);
                    false
                }
                None => true,
            });
            released.retain_mut(|work| match work.poll(&mut seen) {
                Some(result) => {
                    seen.settle(result, &mut permits);
                    false
                }
                None => true,
            });
            giving_way.retain_mut(|work| match work.poll() {
                std::task::Poll::Ready(result) => {
                    seen.settle(result, &mut permits);
                    false
                }
                std::task::Poll::Pending => true,
            });
        }
        prop_assert!(waiting.is_empty(), "requests still pending at quiescence");
        prop_assert!(
            giving_way.is_empty(),
            "work that gave way still pending at quiescence"
        );
        prop_assert!(
            released.is_empty(),
            "released work still pending at quiescence"
        );
        prop_assert!(running.is_empty(), "runs still pending at quiescence");
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
        // Runs asked for their slots again after their waits (how many
        // times is the queue's own count): every other admission is one
        // the test made and saw settle.
        prop_assert!(sum(|p| p.resumed) >= seen.resumed);
        let resumed = sum(|p| p.resumed) - seen.resumed;
        prop_assert_eq!(sum(|p| p.requested), seen.requested + resumed);
        prop_assert_eq!(
            sum(|p| p.admitted) + sum(|p| p.errored),
            sum(|p| p.requested)
        );
        prop_assert!(sum(|p| p.admitted) >= seen.admitted);
        prop_assert!(sum(|p| p.errored) >= seen.errored + runs_refused);
        prop_assert!(
            sum(|p| p.admitted) + sum(|p| p.errored) <= seen.admitted + seen.errored + resumed
        );
        prop_assert_eq!(seen.requested, seen.admitted + seen.errored);
        // Every failure is counted once, under the reason its caller saw,
        // or as cancelled where the caller left first; runs' admissions
        // aside, which only the queue saw settle.
        prop_assert!(snapshot.priorities.iter().all(|p| p
            .refusals
            .by_reason()
            .iter()
            .map(|&(_, n)| n)
            .sum::<u64>()
            == p.errored));
        if resumed == 0 {
            prop_assert_eq!(
                refusals_by_reason(&snapshot.priorities),
                seen.refused.clone()
            );
            prop_assert_eq!(sum(|p| p.refusals.cancelled), seen.cancelled);
        }
        // Once nothing is held, no tenant is charged for anything.
        prop_assert!(
            snapshot.tenants.iter().all(|t| t.used == 0),
            "{:?}",
            snapshot.tenants
        );
        // Nor is any elastic work counted against the elastic share: on an
        // open queue with nothing held, bulk work is admitted at once, with
        // regular work about.
        if policies.elastic_share && !snapshot.closed {
            queue.set_total_slots(2).unwrap();
            let regular = WorkInfo::new(TenantId::new(1), Priority::NORMAL);
            let regular = try_settle(&mut tokio_test::task::spawn(queue.admit(regular)));
            prop_assert!(matches!(regular, Some(Ok(_))), "{regular:?}");
            let bulk = WorkInfo::new(TenantId::new(1), Priority::BULK_NORMAL);
            let bulk = try_settle(&mut tokio_test::task::spawn(queue.admit(bulk)));
            prop_assert!(
                matches!(bulk, Some(Ok(_))),
                "elastic units leaked: {bulk:?}"
            );
        }
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

/// What a pool closure does once it starts.
#[derive(Clone, Copy, Debug)]
enum PoolClosure {
    /// Returns at once.
    Quick,
    /// Waits until the test opens its gate (or drops it).
    Gated,
    /// Panics.
    Panics,
}

#[derive(Clone, Debug)]
enum PoolOp {
    Spawn {
        tenant: u64,
        priority: i8,
        timeout_ms: Option<u64>,
        bypass: bool,
        closure: PoolClosure,
    },
    PollAll,
    DropTask(usize),
    OpenGate(usize),
    Advance(u64),
    Close,
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        6 => (1..4u64, prop::sample::select(vec![-128i8, -30, 0, 50, 127]),
              prop::option::weighted(0.3, 1..30u64), prop::bool::weighted(0.1),
              prop::sample::select(vec![PoolClosure::Quick, PoolClosure::Gated, PoolClosure::Gated, PoolClosure::Panics]))
            .prop_map(|(tenant, priority, timeout_ms, bypass, closure)| PoolOp::Spawn { tenant, priority, timeout_ms, bypass, closure }),
        3 => Just(PoolOp::PollAll),
        2 => any::<usize>().prop_map(PoolOp::DropTask),
        3 => any::<usize>().prop_map(PoolOp::OpenGate),
        2 => (0..15u64).prop_map(PoolOp::Advance),
        1 => prop::bool::weighted(0.1).prop_map(|close| if close { PoolOp::Close } else { PoolOp::PollAll }),
    ]
}

/// One spawned closure as the test sees it.
struct Spawned {
    closure: PoolClosure,
    /// Times the closure started.
    ran: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

fn run_pool(
    ops: Vec<PoolOp>,
    max_borrowed: usize,
    early_rejection: bool,
    epoch_lifo: bool,
    collect_grants: bool,
) -> Result<(), TestCaseError> {
    use admission::pool::{CpuPool, PoolError, PoolTask};
    use std::pin::Pin;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{mpsc, Arc};

    const THREADS: usize = 2;
    let runtime = common::paused_runtime();
    runtime.block_on(async move {
        let mut queue = WorkQueue::builder()
            .max_waiters(6)
            .early_rejection(early_rejection);
        if epoch_lifo {
            queue = queue.epoch_lifo(admission::EpochLifo {
                epoch: Duration::from_millis(5),
                closing_delta: Duration::from_millis(1),
                lifo_delay: Duration::from_millis(4),
            });
        }
        let pool = CpuPool::builder()
            .threads(THREADS)
            .max_borrowed(max_borrowed)
            .collect_grants(collect_grants)
            .queue(queue)
            .build()
            .unwrap();
        let mut spawned: Vec<Spawned> = Vec::new();
        // Futures not yet settled, by spawn index.
        let mut live: Vec<(usize, Pin<Box<PoolTask<usize>>>)> = Vec::new();
        let mut gates: Vec<Option<mpsc::Sender<()>>> = Vec::new();
        let mut settled: Vec<(usize, Result<usize, PoolError>)> = Vec::new();

        let check = |result: &Result<usize, PoolError>, id: usize, spawned: &[Spawned]| {
            let ran = spawned[id].ran.load(Ordering::SeqCst);
            match result {
                Ok(value) => *value == id && ran == 1,
                Err(PoolError::Panicked { .. }) => {
                    matches!(spawned[id].closure, PoolClosure::Panics) && ran == 1
                }
                Err(_) => ran == 0,
            }
        };

        for op in ops {
            match op {
                PoolOp::Spawn {
                    tenant,
                    priority,
                    timeout_ms,
                    bypass,
                    closure,
                } => {
                    let id = spawned.len();
                    let ran = Arc::new(AtomicU32::new(0));
                    let (gate, wait) = mpsc::channel::<()>();
                    gates.push(Some(gate));
                    spawned.push(Spawned {
                        closure,
                        ran: ran.clone(),
                    });
                    let mut work = WorkInfo::builder()
                        .tenant(TenantId::new(tenant))
                        .priority(Priority::new(priority))
                        .bypass(bypass);
                    if let Some(ms) = timeout_ms {
                        work = work.timeout(Duration::from_millis(ms));
                    }
                    let task = pool.spawn(work.build(), move || {
                        ran.fetch_add(1, Ordering::SeqCst);
                        match closure {
                            PoolClosure::Quick => {}
                            PoolClosure::Gated => {
                                let _ = wait.recv();
                            }
                            PoolClosure::Panics => panic!("closure {id} panics"),
                        }
                        id
                    });
                    live.push((id, Box::pin(task)));
                }
                PoolOp::PollAll => {
                    let mut still = Vec::new();
                    for (id, mut task) in live.drain(..) {
                        match futures::poll!(&mut task) {
                            std::task::Poll::Ready(result) => settled.push((id, result)),
                            std::task::Poll::Pending => still.push((id, task)),
                        }
                    }
                    live = still;
                }
                PoolOp::DropTask(index) if !live.is_empty() => {
                    drop(live.swap_remove(index % live.len()));
                }
                PoolOp::OpenGate(index) if !gates.is_empty() => {
                    let at = index % gates.len();
                    gates[at] = None;
                }
                PoolOp::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                PoolOp::Close => {
                    // close waits for running closures: let them return.
                    gates.iter_mut().for_each(|gate| *gate = None);
                    pool.close();
                }
                PoolOp::DropTask(_) | PoolOp::OpenGate(_) => {}
            }
            let snapshot = pool.snapshot();
            prop_assert!(snapshot.busy <= THREADS + max_borrowed);
            prop_assert!(snapshot.borrowed <= max_borrowed);
            // A slot is held only by work spawned and not yet settled.
            prop_assert!(snapshot.queue.granter.used as usize <= spawned.len() - settled.len());
            for (id, result) in &settled {
                prop_assert!(check(result, *id, &spawned), "task {id}: {result:?}");
            }
        }

        // Quiescence: every gate open, every live future awaited (deadlines
        // fire as the paused clock moves on), then the pool joined.
        gates.iter_mut().for_each(|gate| *gate = None);
        let ids: Vec<usize> = live.iter().map(|(id, _)| *id).collect();
        let results = futures::future::join_all(live.into_iter().map(|(_, task)| task)).await;
        settled.extend(ids.into_iter().zip(results));
        pool.close();
        // Grants are charged to their tenants until the usage reset (the
        // default `Usage::Granted`): past it, nobody is charged.
        tokio::time::advance(Duration::from_secs(2)).await;
        pool.maintain();

        let snapshot = pool.snapshot();
        prop_assert_eq!(snapshot.queue.granter.used, 0, "a slot leaked");
        prop_assert_eq!((snapshot.busy, snapshot.borrowed), (0, 0));
        prop_assert_eq!((snapshot.queued, snapshot.dispatched), (0, 0));
        for (id, result) in &settled {
            prop_assert!(check(result, *id, &spawned), "task {id}: {result:?}");
        }
        let ran: u32 = spawned.iter().map(|s| s.ran.load(Ordering::SeqCst)).sum();
        prop_assert!(
            spawned.iter().all(|s| s.ran.load(Ordering::SeqCst) <= 1),
            "a closure ran twice"
        );
        prop_assert_eq!(u64::from(ran), snapshot.completed + snapshot.panicked);
        let panicked = spawned
            .iter()
            .filter(|s| {
                matches!(s.closure, PoolClosure::Panics) && s.ran.load(Ordering::SeqCst) == 1
            })
            .count() as u64;
        prop_assert_eq!(panicked, snapshot.panicked);
        let sum = |f: fn(&admission::observe::PrioritySnapshot) -> u64| {
            snapshot.queue.priorities.iter().map(f).sum::<u64>()
        };
        prop_assert_eq!(
            sum(|p| p.requested),
            sum(|p| p.admitted) + sum(|p| p.errored)
        );
        prop_assert!(snapshot.queue.tenants.iter().all(|t| t.used == 0));
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    /// The same property through the CPU pool: whatever is spawned, dropped,
    /// released, timed out or closed, every slot comes back, every thread
    /// ends idle, no closure runs twice, and every future that settles says
    /// truly whether its closure ran; with the caller's task handing jobs
    /// over and with the threads collecting grants.
    #[test]
    fn through_the_pool_every_slot_comes_back_and_no_closure_runs_twice(
        ops in prop::collection::vec(pool_op(), 1..60),
        max_borrowed in 0..2usize,
        early_rejection in any::<bool>(),
        epoch_lifo in any::<bool>(),
        collect_grants in any::<bool>(),
    ) {
        run_pool(ops, max_borrowed, early_rejection, epoch_lifo, collect_grants)?;
    }
}

#[derive(Clone, Debug)]
enum BookOp {
    Admit {
        tenant: u64,
        priority: i8,
        units: u64,
    },
    PollAll,
    Release(usize),
    DropWaiting(usize),
    SetTotal(u64),
    /// Takes the books (a snapshot, which takes the lock).
    Look,
}

fn book_op() -> impl Strategy<Value = BookOp> {
    prop_oneof![
        4 => (0u64..3, prop::sample::select(vec![-10i8, 0, 10]), 1u64..3)
            .prop_map(|(tenant, priority, units)| BookOp::Admit { tenant, priority, units }),
        2 => Just(BookOp::PollAll),
        3 => any::<usize>().prop_map(BookOp::Release),
        1 => any::<usize>().prop_map(BookOp::DropWaiting),
        1 => (0u64..4).prop_map(BookOp::SetTotal),
        1 => Just(BookOp::Look),
    ]
}

/// Runs `ops` on `queue`, returning its snapshot's books at every `Look`
/// and at the end. (Only there: a snapshot takes the lock, after which the
/// next admission takes it too.)
fn books_after_each(queue: &WorkQueue, ops: &[BookOp]) -> Vec<String> {
    let mut permits: Vec<SlotPermit> = Vec::new();
    let mut waiting: Vec<Pending> = Vec::new();
    let mut books = Vec::new();
    for op in ops {
        match op {
            &BookOp::Admit {
                tenant,
                priority,
                units,
            } => {
                let work = WorkInfo::builder()
                    .tenant(TenantId::new(tenant))
                    .priority(Priority::new(priority))
                    .requested(units)
                    .build();
                let mut admit = tokio_test::task::spawn(queue.admit(work));
                match admit.poll() {
                    std::task::Poll::Ready(Ok(permit)) => permits.push(permit),
                    std::task::Poll::Ready(Err(_)) => {}
                    std::task::Poll::Pending => waiting.push(admit),
                }
            }
            BookOp::PollAll => {
                let mut still = Vec::new();
                for mut admit in waiting.drain(..) {
                    match try_settle(&mut admit) {
                        Some(Ok(permit)) => permits.push(permit),
                        Some(Err(_)) => {}
                        None => still.push(admit),
                    }
                }
                waiting = still;
            }
            &BookOp::Release(index) if !permits.is_empty() => {
                drop(permits.swap_remove(index % permits.len()));
            }
            &BookOp::DropWaiting(index) if !waiting.is_empty() => {
                drop(waiting.swap_remove(index % waiting.len()));
            }
            &BookOp::SetTotal(total) => queue.set_total_slots(total).unwrap(),
            BookOp::Look => books.push(books_of(queue)),
            _ => {}
        }
    }
    books.push(books_of(queue));
    drop(permits);
    drop(waiting);
    books.push(books_of(queue));
    books
}

fn books_of(queue: &WorkQueue) -> String {
    let snapshot = queue.snapshot();
    format!(
        "{:?} {:?} {:?} {}",
        snapshot.priorities, snapshot.tenants, snapshot.granter, snapshot.waiting
    )
}

proptest! {
    /// Admissions and releases taken without the lock, while nobody waits,
    /// keep the same books as the same ones under it: a queue whose holds
    /// are timed (early rejection, which without deadlines refuses
    /// nothing) never admits without its lock, and after every step of the
    /// same requests both snapshots agree on every count, every tenant's
    /// usage and the slots in use.
    #[test]
    fn admissions_without_the_lock_keep_the_books_of_admissions_under_it(
        ops in prop::collection::vec(book_op(), 1..120),
    ) {
        let runtime = common::paused_runtime();
        let _entered = runtime.enter();
        let lane = WorkQueue::builder().total_slots(2).build().unwrap();
        let locked = WorkQueue::builder()
            .total_slots(2)
            .early_rejection(true)
            .build()
            .unwrap();
        let with_lane = books_after_each(&lane, &ops);
        let under_lock = books_after_each(&locked, &ops);
        prop_assert_eq!(with_lane, under_lock);
    }
}
