//! Node-level tests of the quota: the leasing stepped by hand on tokio's
//! paused clock, against the in-process backend on a clock of its own.

use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_test::task;

use super::backend::{Lease, LeaseBatch, LeaseFuture, Leased};
use super::leaser::Leaser;
use super::*;
use crate::sync::StdAtomicU64;
use crate::{Priority, TenantId, WorkInfo, WorkQueue};

const T: TenantId = TenantId::new(7);
const MS: Duration = Duration::from_millis(1);

/// Tokio's paused clock and the backend's, moved together.
#[derive(Clone)]
struct Clock(StdArc<StdAtomicU64>);

impl Clock {
    fn new() -> Self {
        Clock(StdArc::new(StdAtomicU64::new(0)))
    }

    fn backend(&self) -> InMemoryBackend {
        InMemoryBackend::manual(self.0.clone(), Duration::from_secs(600))
    }

    async fn advance(&self, by: Duration) {
        tokio::time::advance(by).await;
        self.0.fetch_add(by.as_micros() as u64, Ordering::Relaxed);
    }
}

fn work(priority: Priority) -> WorkInfo {
    WorkInfo::new(T, priority)
}

fn node(builder: QuotaBuilder, backend: impl QuotaBackend, id: &str) -> (Quota, Leaser) {
    builder.backend(backend).node_id(id).assemble().unwrap()
}

fn tenant(quota: &Quota) -> TenantQuotaSnapshot {
    quota
        .snapshot()
        .tenants
        .into_iter()
        .find(|tenant| tenant.tenant == T)
        .expect("the tenant is in the table")
}

fn ask_backend(backend: &InMemoryBackend, node: &str, asked: u64, rate: u64, burst: u64) -> Leased {
    let lease = Lease::new(T, rate, burst, asked, asked);
    let batch = LeaseBatch::new(node, Duration::from_secs(3), vec![lease]);
    backend.exchange_now(&batch)[0]
}

#[tokio::test(start_paused = true)]
async fn requests_spend_the_lease_locally_and_only_the_first_waits_for_one() {
    let clock = Clock::new();
    let builder = Quota::builder().tenant(T, TenantQuota::new(1_000, 1_000).unwrap());
    let (quota, mut leaser) = node(builder, clock.backend(), "a");
    let capacity = WorkQueue::new(1_000).unwrap();

    let mut first = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(first.poll().is_pending(), "nothing leased yet");
    assert!(
        leaser.tick(Instant::now()).await,
        "a new tenant asks at once"
    );
    assert!(first.is_woken());
    let permits: Vec<_> = std::iter::once(first)
        .map(|mut first| match first.poll() {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("{other:?}"),
        })
        .collect();
    // One request in the first window is 10 units a second: a lease of a
    // second of it. The rest of the lease is spent with no exchange.
    let leased = tenant(&quota).leased;
    assert_eq!(leased, 10);
    for _ in 1..leased {
        let mut next = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
        assert!(matches!(next.poll(), Poll::Ready(Ok(_))));
    }
    let mut over = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(over.poll().is_pending(), "the lease is spent");
    clock.advance(50 * MS).await;
    assert!(leaser.tick(Instant::now()).await, "spent: it asks again");
    assert!(matches!(over.poll(), Poll::Ready(Ok(_))));
    drop(permits);
}

#[tokio::test(start_paused = true)]
async fn requests_that_arrive_while_the_first_lease_is_in_flight_wait_for_its_burst() {
    let clock = Clock::new();
    let backend = clock.backend();
    // One unit a second, two banked: the refill alone could not serve a
    // request with 200 ms to live, the first lease's burst does.
    let builder = Quota::builder().tenant(T, TenantQuota::new(1, 2).unwrap());
    let (quota, mut leaser) = node(builder, backend.clone(), "a");
    let capacity = WorkQueue::new(10).unwrap();
    let within = || {
        WorkInfo::builder()
            .tenant(T)
            .timeout(Duration::from_millis(200))
            .build()
    };

    let mut first = task::spawn(quota.admit(&capacity, within()));
    assert!(first.poll().is_pending(), "nothing leased yet");
    // The leasing thread takes the tenant in (its assumed rate is now
    // published) and sends the first lease; the second request comes
    // before the answer.
    let batch = leaser
        .step(Instant::now())
        .expect("a new tenant asks at once");
    let mut second = task::spawn(quota.admit(&capacity, within()));
    assert!(
        second.poll().is_pending(),
        "it waits for the first lease instead of being weighed against a refill not yet begun"
    );
    clock.advance(20 * MS).await;
    let answer = backend.exchange_now(&batch);
    leaser.settle(Instant::now(), &batch, Ok(answer));
    assert!(matches!(first.poll(), Poll::Ready(Ok(_))));
    assert!(matches!(second.poll(), Poll::Ready(Ok(_))));
    assert_eq!(tenant(&quota).refused, 0);

    // Once the lease is answered the refill is known: a third request,
    // which one unit a second cannot serve within 200 ms, is refused at
    // once.
    let mut third = task::spawn(quota.admit(&capacity, within()));
    match third.poll() {
        Poll::Ready(Err(AdmitError::OverQuota { retry_after })) => {
            assert!(retry_after > Duration::from_millis(200), "{retry_after:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_tenant_over_quota_waits_in_priority_order_and_blocks_no_other_tenant() {
    let clock = Clock::new();
    let builder = Quota::builder().tenant(T, TenantQuota::new(1_000, 1).unwrap());
    let (quota, mut leaser) = node(builder, clock.backend(), "a");
    let capacity = WorkQueue::new(10).unwrap();

    let mut low = task::spawn(quota.admit(&capacity, work(Priority::LOW)));
    let mut high = task::spawn(quota.admit(&capacity, work(Priority::HIGH)));
    assert!(low.poll().is_pending());
    assert!(high.poll().is_pending());
    // Another tenant, without a quota, goes straight to capacity.
    let other = WorkInfo::new(TenantId::new(8), Priority::LOW);
    let mut free = task::spawn(quota.admit(&capacity, other));
    assert!(matches!(free.poll(), Poll::Ready(Ok(_))));
    assert_eq!(quota.snapshot().tenants.len(), 1, "no record for it");

    // The burst is one unit: each lease admits one waiter, the higher first.
    leaser.tick(Instant::now()).await;
    assert!(matches!(high.poll(), Poll::Ready(Ok(_))));
    assert!(low.poll().is_pending());
    clock.advance(50 * MS).await;
    leaser.tick(Instant::now()).await;
    assert!(matches!(low.poll(), Poll::Ready(Ok(_))));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_over_quota_carries_a_retry_after_from_the_refill() {
    let clock = Clock::new();
    let builder = Quota::builder().tenant(T, TenantQuota::new(10, 1).unwrap());
    let (quota, mut leaser) = node(builder, clock.backend(), "a");
    let capacity = WorkQueue::new(10).unwrap();

    let mut first = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(first.poll().is_pending());
    leaser.tick(Instant::now()).await;
    assert!(matches!(first.poll(), Poll::Ready(Ok(_))));

    // Nothing measured yet, the node's refill is taken as the tenant's
    // rate (one node): one unit is 100 ms away. A request that cannot wait
    // that long is refused at once, one that can waits and is served.
    let within = |ms| {
        WorkInfo::builder()
            .tenant(T)
            .timeout(Duration::from_millis(ms))
            .build()
    };
    let mut hurried = task::spawn(quota.admit(&capacity, within(40)));
    match hurried.poll() {
        Poll::Ready(Err(AdmitError::OverQuota { retry_after })) => {
            assert!(
                (Duration::from_millis(50)..=Duration::from_millis(200)).contains(&retry_after),
                "{retry_after:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tenant(&quota).waiting, 0, "it left the queue");
    let mut patient = task::spawn(quota.admit(&capacity, within(1_000)));
    assert!(patient.poll().is_pending());
    for _ in 0..20 {
        clock.advance(10 * MS).await;
        leaser.tick(Instant::now()).await;
    }
    assert!(matches!(patient.poll(), Poll::Ready(Ok(_))));
    // One that waited past its deadline (no lease came) is over quota too.
    let mut late = task::spawn(quota.admit(&capacity, within(1_000)));
    while late.poll().is_ready() {
        // A unit was left from the refill: spend it.
        late = task::spawn(quota.admit(&capacity, within(1_000)));
    }
    clock.advance(1_100 * MS).await;
    match late.poll() {
        Poll::Ready(Err(AdmitError::OverQuota { .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(tenant(&quota).refused, 2);
}

#[tokio::test(start_paused = true)]
async fn units_taken_by_a_request_that_capacity_refuses_are_refunded() {
    let clock = Clock::new();
    let builder = Quota::builder().tenant(T, TenantQuota::new(1_000, 1_000).unwrap());
    let (quota, mut leaser) = node(builder, clock.backend(), "a");
    let capacity = WorkQueue::builder()
        .total_slots(1)
        .max_waiters(1)
        .build()
        .unwrap();
    let mut first = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(first.poll().is_pending());
    leaser.tick(Instant::now()).await;
    let Poll::Ready(Ok(_held)) = first.poll() else {
        panic!("the first request is admitted")
    };
    let balance = tenant(&quota).balance;
    assert!(balance > 2, "{balance}");

    // The only slot is held: the next request takes its unit and waits
    // for capacity; dropped there, the unit comes back.
    let mut waiting = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(waiting.poll().is_pending());
    assert_eq!(tenant(&quota).balance, balance - 1);
    // And a third, with capacity's queue full, is refused by capacity
    // after its unit was taken: refunded at once.
    let mut refused = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(matches!(
        refused.poll(),
        Poll::Ready(Err(AdmitError::QueueFull { .. }))
    ));
    assert_eq!(tenant(&quota).balance, balance - 1);
    drop(waiting);
    assert_eq!(
        tenant(&quota).balance,
        balance,
        "dropped while waiting for capacity"
    );
    assert_eq!(tenant(&quota).refunded, 2);
    assert_eq!(capacity.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_waiting_for_quota_leaves_no_waiter_and_takes_nothing() {
    let clock = Clock::new();
    let builder = Quota::builder().tenant(T, TenantQuota::new(1_000, 1).unwrap());
    let (quota, mut leaser) = node(builder, clock.backend(), "a");
    let capacity = WorkQueue::new(10).unwrap();
    let mut waiting = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(waiting.poll().is_pending());
    assert_eq!(tenant(&quota).waiting, 1);
    drop(waiting);
    assert_eq!(tenant(&quota).waiting, 0);
    leaser.tick(Instant::now()).await;
    assert_eq!(tenant(&quota).balance, 1, "the lease is there for the next");
}

/// A backend that fails while told to, or panics.
#[derive(Debug, Clone)]
struct Flaky {
    inner: InMemoryBackend,
    failing: StdArc<AtomicBool>,
    panics: bool,
}

impl QuotaBackend for Flaky {
    fn exchange<'a>(&'a self, batch: &'a LeaseBatch) -> LeaseFuture<'a> {
        if self.panics {
            panic!("the backend's own bug");
        }
        if self.failing.load(Ordering::Relaxed) {
            return Box::pin(std::future::ready(Err(BackendError::Unavailable(
                "connection refused".into(),
            ))));
        }
        self.inner.exchange(batch)
    }
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_backend_degrades_to_the_trickle_and_resyncs_with_a_charge() {
    let clock = Clock::new();
    let failing = StdArc::new(AtomicBool::new(true));
    let backend = clock.backend();
    let flaky = Flaky {
        inner: backend.clone(),
        failing: failing.clone(),
        panics: false,
    };
    let builder = Quota::builder()
        .expected_nodes(2)
        .tenant(T, TenantQuota::new(100, 100).unwrap());
    let (quota, mut leaser) = node(builder, flaky, "a");
    let capacity = WorkQueue::new(10).unwrap();
    let mut first = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(first.poll().is_pending());
    leaser.tick(Instant::now()).await;
    assert!(leaser.is_degraded());
    let snapshot = quota.snapshot();
    assert!(snapshot.degraded);
    assert_eq!(snapshot.failures, 1);
    assert!(matches!(
        snapshot.last_error,
        Some(BackendError::Unavailable(_))
    ));

    // A second at the fallback trickle, 100 / 2 nodes a second: the
    // waiter is admitted, and the balance banks one period of it.
    for _ in 0..100 {
        clock.advance(10 * MS).await;
        leaser.tick(Instant::now()).await;
    }
    assert!(matches!(first.poll(), Poll::Ready(Ok(_))));
    let trickled = tenant(&quota);
    assert_eq!(trickled.fallback, 50);
    assert_eq!(trickled.balance, 49);
    assert_eq!(
        quota.snapshot().failures,
        5,
        "the first, then one every 250 ms"
    );

    // Back: the next try succeeds, and charges what the trickle added.
    failing.store(false, Ordering::Relaxed);
    for _ in 0..25 {
        clock.advance(10 * MS).await;
        leaser.tick(Instant::now()).await;
    }
    assert!(!leaser.is_degraded());
    assert!(!quota.snapshot().degraded);
    let resynced = tenant(&quota);
    assert!(
        resynced.balance <= resynced.leased as i64,
        "the trickle's unspent units, charged to the bucket, are not kept: {resynced:?}"
    );
    let other = ask_backend(&backend, "b", 100, 100, 100);
    assert!(
        other.granted <= 50,
        "the outage's 50 units were charged: {other:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_backend_is_a_failed_exchange() {
    let clock = Clock::new();
    let flaky = Flaky {
        inner: clock.backend(),
        failing: StdArc::new(AtomicBool::new(false)),
        panics: true,
    };
    let builder = Quota::builder().tenant(T, TenantQuota::new(100, 100).unwrap());
    let (quota, mut leaser) = node(builder, flaky, "a");
    let capacity = WorkQueue::new(10).unwrap();
    let mut first = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(first.poll().is_pending());
    leaser.tick(Instant::now()).await;
    let snapshot = quota.snapshot();
    assert!(snapshot.degraded);
    assert_eq!(snapshot.last_error, Some(BackendError::Panicked));
    assert_eq!(snapshot.backend_health.panics, 1);
}

#[tokio::test(start_paused = true)]
async fn three_nodes_share_the_quota_in_proportion_to_their_demand() {
    let clock = Clock::new();
    let backend = clock.backend();
    let quota_of = TenantQuota::new(1_000, 1_000).unwrap();
    let demands = [2_100u64, 600, 300];
    let mut nodes: Vec<(Quota, Leaser, StdArc<Record>)> = ["a", "b", "c"]
        .into_iter()
        .map(|id| {
            let (quota, leaser) = node(Quota::builder().tenant(T, quota_of), backend.clone(), id);
            let record = quota.record(T).unwrap().unwrap();
            (quota, leaser, record)
        })
        .collect();
    let mut leased_at_one_second = [0u64; 3];
    for tick in 0..300 {
        if tick == 100 {
            for (i, (_, _, record)) in nodes.iter().enumerate() {
                leased_at_one_second[i] = record.leased.load(Ordering::Relaxed);
            }
        }
        for (i, (_, leaser, record)) in nodes.iter_mut().enumerate() {
            // Each node's requests ask for its demand and spend whatever
            // it holds.
            record.asked(demands[i] / 100);
            let balance = record.balance();
            if balance > 0 {
                record.local.charge(balance as u64);
            }
            leaser.tick(Instant::now()).await;
        }
        clock.advance(10 * MS).await;
    }
    let shares: Vec<u64> = nodes
        .iter()
        .enumerate()
        .map(|(i, (_, _, record))| record.leased.load(Ordering::Relaxed) - leased_at_one_second[i])
        .collect();
    let total: u64 = shares.iter().sum();
    // Two seconds at 1,000 a second.
    assert!((1_900..=2_050).contains(&total), "{shares:?}");
    for (share, expected) in shares.iter().zip([0.7, 0.2, 0.1]) {
        let fraction = *share as f64 / total as f64;
        assert!(
            (fraction - expected).abs() < 0.03,
            "{shares:?}: {fraction} for {expected}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_tenant_table_is_bounded_and_idle_tenants_are_forgotten_with_their_balance() {
    let clock = Clock::new();
    let backend = clock.backend();
    let builder = Quota::builder()
        .max_tenants(2)
        .default_quota(TenantQuota::new(100, 100).unwrap());
    let (quota, mut leaser) = node(builder, backend.clone(), "a");
    let capacity = WorkQueue::new(10).unwrap();
    let admit = |tenant: u64| {
        task::spawn(quota.admit(
            &capacity,
            WorkInfo::new(TenantId::new(tenant), Priority::NORMAL),
        ))
    };
    let (mut one, mut two) = (admit(1), admit(2));
    assert!(one.poll().is_pending());
    assert!(two.poll().is_pending());
    let mut three = admit(3);
    assert!(matches!(
        three.poll(),
        Poll::Ready(Err(AdmitError::OverQuota { .. }))
    ));
    assert_eq!(quota.snapshot().refused_tenants, 1);
    leaser.tick(Instant::now()).await;
    assert!(matches!(one.poll(), Poll::Ready(Ok(_))));
    assert!(matches!(two.poll(), Poll::Ready(Ok(_))));
    // Each holds the rest of its lease. Idle for a lease period while the
    // table is full: both are forgotten and their balances given back.
    for _ in 0..11 {
        clock.advance(100 * MS).await;
        leaser.tick(Instant::now()).await;
    }
    assert_eq!(quota.snapshot().tenants.len(), 0);
    assert_eq!(quota.snapshot().pending_returns, 0, "returned");
    let mut three = admit(3);
    assert!(three.poll().is_pending(), "room again");
    // Tenant 1's bucket got its unspent units back.
    let lease = Lease::new(TenantId::new(1), 100, 100, 100, 100);
    let batch = LeaseBatch::new("b", Duration::from_secs(3), vec![lease]);
    assert_eq!(backend.exchange_now(&batch)[0].granted, 100);
}

#[tokio::test(start_paused = true)]
async fn shutdown_returns_the_unspent_balance_and_closes_the_quota() {
    let clock = Clock::new();
    let backend = clock.backend();
    let builder = Quota::builder().tenant(T, TenantQuota::new(100, 100).unwrap());
    let (quota, mut leaser) = node(builder, backend.clone(), "a");
    let capacity = WorkQueue::new(10).unwrap();
    let mut first = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(first.poll().is_pending());
    leaser.tick(Instant::now()).await;
    assert!(matches!(first.poll(), Poll::Ready(Ok(_))));
    let held = tenant(&quota).balance;
    assert_eq!(held, 9, "a lease of 10, one spent");
    // The bucket has 90 left; the node gives its 9 back.
    leaser.shut_down().await;
    assert_eq!(ask_backend(&backend, "b", 100, 100, 100).granted, 99);
    let mut after = task::spawn(quota.admit(&capacity, work(Priority::NORMAL)));
    assert!(matches!(after.poll(), Poll::Ready(Err(AdmitError::Closed))));
}

#[test]
fn the_leasing_thread_leases_returns_and_stops_with_the_last_handle() {
    let backend = InMemoryBackend::new();
    let quota = Quota::builder()
        .backend(backend.clone())
        .node_id("a")
        .tenant(T, TenantQuota::new(1_000, 1_000).unwrap())
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let capacity = WorkQueue::new(10).unwrap();
    runtime.block_on(async {
        for _ in 0..20 {
            drop(
                quota
                    .admit(&capacity, work(Priority::NORMAL))
                    .await
                    .unwrap(),
            );
        }
    });
    assert!(tenant(&quota).leased >= 20, "{:?}", quota.snapshot());
    assert!(quota.snapshot().exchanges >= 1);
    drop(quota);
    // Whatever was leased and not spent is back: 980 of the burst, and a
    // little refill.
    let left = ask_backend(&backend, "b", 1_000, 1_000, 1_000);
    assert!(left.granted >= 980, "{left:?}");
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    type Change = fn(QuotaBuilder) -> QuotaBuilder;
    let rows: &[(&str, Change)] = &[
        ("lease_period", |b| b.lease_period(Duration::ZERO)),
        ("min_lease_interval", |b| {
            b.min_lease_interval(Duration::from_secs(2))
        }),
        ("lease_timeout", |b| b.lease_timeout(Duration::ZERO)),
        ("retry_interval", |b| {
            b.retry_interval(Duration::from_secs(3_600))
        }),
        ("idle_after", |b| b.idle_after(Duration::from_millis(1))),
        ("expected_nodes", |b| b.expected_nodes(0)),
        ("max_tenants", |b| b.max_tenants(0)),
        ("max_waiters", |b| b.max_waiters(0)),
        ("node_id", |b| b.node_id("")),
        ("node_id", |b| b.node_id("two words")),
    ];
    for &(field, change) in rows {
        let error = change(Quota::builder()).assemble().unwrap_err();
        assert_eq!(error.field(), field);
    }
    assert_eq!(TenantQuota::new(0, 1).unwrap_err().field(), "rate");
    assert_eq!(TenantQuota::new(1, 0).unwrap_err().field(), "burst");
    assert_eq!(
        TenantQuota::new(TenantQuota::MAX_UNITS + 1, 1)
            .unwrap_err()
            .field(),
        "rate"
    );
}

#[tokio::test(start_paused = true)]
async fn a_correction_charges_the_local_balance_and_makes_no_record() {
    let clock = Clock::new();
    let builder = Quota::builder().default_quota(TenantQuota::new(1_000, 1_000).unwrap());
    let (quota, mut leaser) = node(builder, clock.backend(), "a");
    let capacity = WorkQueue::new(10).unwrap();
    let mut first = task::spawn(quota.admit_units(&capacity, work(Priority::NORMAL), 5));
    assert!(first.poll().is_pending());
    leaser.tick(Instant::now()).await;
    assert!(matches!(first.poll(), Poll::Ready(Ok(_))));
    let before = tenant(&quota).balance;
    // Estimated 5, cost 25: 20 more, into debt if need be.
    quota.correct(T, 5, 25);
    assert_eq!(tenant(&quota).balance, before - 20);
    quota.correct(TenantId::new(99), 5, 25);
    assert_eq!(
        quota.snapshot().tenants.len(),
        1,
        "no record for a stranger"
    );
}
