//! The quota against a real `redis-server` started on a loopback port of
//! the test's own: the script's arithmetic under concurrent nodes (a
//! property test of conservation), Redis killed and restarted under a
//! live node, keys with their TTLs, leases returned at shutdown.
//!
//! Without `redis-server` the tests print a skip line and pass, unless
//! `ADMISSION_REQUIRE_REDIS=1` (as `scripts/test-all.sh` sets, after
//! installing it).

#![cfg(feature = "redis")]

#[path = "common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use admission::quota::{Lease, LeaseBatch, Leased, Quota, QuotaBackend, RedisBackend, TenantQuota};
use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use proptest::prelude::*;
use redis_server::RedisServer;

const SHARE_TTL: Duration = Duration::from_secs(3);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn exchange(backend: &RedisBackend, node: &str, leases: Vec<Lease>) -> Vec<Leased> {
    let batch = LeaseBatch::new(node, SHARE_TTL, leases);
    backend.exchange(&batch).await.expect("redis answers")
}

async fn connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Redis' clock, in microseconds.
async fn redis_time(connection: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(connection).await.unwrap();
    seconds * 1_000_000 + micros
}

/// Waits, a bounded while, for `condition`: what the node does on its own
/// thread after a change made here.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: never happened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_script_grants_the_burst_then_divides_the_refill_by_demand() {
    let Some(server) =
        RedisServer::start("the_script_grants_the_burst_then_divides_the_refill_by_demand")
    else {
        return;
    };
    runtime().block_on(async {
        let backend = RedisBackend::new(&server.url()).unwrap();
        let tenant = TenantId::new(1);
        let first = exchange(
            &backend,
            "a",
            vec![Lease::new(tenant, 1_000, 1_000, 600, 300)],
        )
        .await;
        assert_eq!(first[0].granted, 600);
        let rest = exchange(
            &backend,
            "a",
            vec![Lease::new(tenant, 1_000, 1_000, 10_000, 300)],
        )
        .await;
        // The rest of the burst, and the little refill since (how little
        // depends on how busy the machine is).
        assert!((400..=1_000).contains(&rest[0].granted), "{rest:?}");
        // Contended: a reports three times b's demand; both ask for more
        // than there is, in turn, for half a second.
        let (mut a, mut b) = (0, 0);
        for _ in 0..25 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            a += exchange(
                &backend,
                "a",
                vec![Lease::new(tenant, 1_000, 1_000, 10_000, 3_000)],
            )
            .await[0]
                .granted;
            b += exchange(
                &backend,
                "b",
                vec![Lease::new(tenant, 1_000, 1_000, 10_000, 1_000)],
            )
            .await[0]
                .granted;
        }
        let share = a as f64 / (a + b) as f64;
        assert!((0.65..=0.85).contains(&share), "a {a}, b {b}");
    });
}

#[test]
fn keys_carry_a_ttl_of_at_least_the_refill_and_come_back_full_after_it() {
    let Some(server) =
        RedisServer::start("keys_carry_a_ttl_of_at_least_the_refill_and_come_back_full_after_it")
    else {
        return;
    };
    runtime().block_on(async {
        let backend = RedisBackend::builder(&server.url())
            .key_ttl(Duration::from_secs(2))
            .build()
            .unwrap();
        let mut redis = connection(&server).await;
        let quick = TenantId::new(1);
        let slow = TenantId::new(2);
        exchange(
            &backend,
            "a",
            vec![
                Lease::new(quick, 1_000, 1_000, 1_000, 10),
                Lease::new(slow, 1, 100, 100, 1),
            ],
        )
        .await;
        let pttl = |tenant| redis::cmd("PTTL").arg(backend.key(tenant)).clone();
        let quick_ttl: i64 = pttl(quick).query_async(&mut redis).await.unwrap();
        let slow_ttl: i64 = pttl(slow).query_async(&mut redis).await.unwrap();
        assert!((1..=2_000).contains(&quick_ttl), "{quick_ttl}");
        assert!(
            (98_000..=100_000).contains(&slow_ttl),
            "100 units at 1/s: {slow_ttl}"
        );
        // Expired (made to, at once): the next exchange finds a full bucket.
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(backend.key(quick))
            .arg(1)
            .query_async(&mut redis)
            .await
            .unwrap();
        let mut gone = false;
        for _ in 0..200 {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(backend.key(quick))
                .query_async(&mut redis)
                .await
                .unwrap();
            if exists == 0 {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(gone, "the key expired");
        let again = exchange(
            &backend,
            "a",
            vec![Lease::new(quick, 1_000, 1_000, 1_000, 10)],
        )
        .await;
        assert_eq!(again[0].granted, 1_000);
    });
}

/// One node's random exchange with the shared bucket.
#[derive(Clone, Debug)]
struct Step {
    asked: u64,
    demand: u64,
    returned: u64,
    charge: u64,
}

fn steps() -> impl Strategy<Value = Vec<Vec<Step>>> {
    let step = (
        0..400u64,
        0..3_000u64,
        prop_oneof![4 => Just(0u64), 1 => 0..100u64],
        prop_oneof![4 => Just(0u64), 1 => 0..300u64],
    )
        .prop_map(|(asked, demand, returned, charge)| Step {
            asked,
            demand,
            returned,
            charge,
        });
    prop::collection::vec(prop::collection::vec(step, 10..40), 4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Four nodes exchange at once, at random, with one tenant's bucket:
    /// the units granted less those returned never exceed the burst plus
    /// the refill over the time Redis' own clock saw pass.
    #[test]
    fn concurrent_nodes_never_lease_more_than_refill_plus_burst(nodes in steps(), rate in 100..5_000u64, burst in 1..2_000u64) {
        let Some(server) = RedisServer::start("concurrent_nodes_never_lease_more_than_refill_plus_burst") else {
            return Ok(());
        };
        let (granted, returned, elapsed_us) = runtime().block_on(async {
            let backend = std::sync::Arc::new(RedisBackend::new(&server.url()).unwrap());
            let mut redis = connection(&server).await;
            let tenant = TenantId::new(9);
            let start = redis_time(&mut redis).await;
            let tasks: Vec<_> = nodes.into_iter().enumerate().map(|(i, steps)| {
                let backend = backend.clone();
                tokio::spawn(async move {
                    let node = format!("n{i}");
                    let (mut granted, mut returned) = (0u64, 0u64);
                    for step in steps {
                        let mut lease = Lease::new(tenant, rate, burst, step.asked, step.demand);
                        lease.returned = step.returned;
                        lease.charge = step.charge;
                        let answer = exchange(&backend, &node, vec![lease]).await;
                        assert!(answer[0].granted <= step.asked);
                        granted += answer[0].granted;
                        returned += step.returned;
                        tokio::task::yield_now().await;
                    }
                    (granted, returned)
                })
            }).collect();
            let (mut granted, mut returned) = (0, 0);
            for task in tasks {
                let (g, r) = task.await.unwrap();
                granted += g;
                returned += r;
            }
            let end = redis_time(&mut redis).await;
            (granted, returned, end - start)
        });
        let bound = burst as f64 + rate as f64 * elapsed_us as f64 / 1e6 + returned as f64;
        prop_assert!(granted as f64 <= bound + 1.0, "granted {granted} > {bound}");
    }
}

#[test]
fn a_node_degrades_when_redis_dies_and_resyncs_when_it_is_back() {
    let Some(mut server) =
        RedisServer::start("a_node_degrades_when_redis_dies_and_resyncs_when_it_is_back")
    else {
        return;
    };
    let tenant = TenantId::new(3);
    let quota = Quota::builder()
        .backend(RedisBackend::new(&server.url()).unwrap())
        .node_id("a")
        .expected_nodes(2)
        .retry_interval(Duration::from_millis(50))
        .tenant(tenant, TenantQuota::new(1_000, 1_000).unwrap())
        .build()
        .unwrap();
    let capacity = WorkQueue::new(64).unwrap();
    let runtime = runtime();
    let admit = |count: usize| {
        runtime.block_on(async {
            for _ in 0..count {
                let work = WorkInfo::builder()
                    .tenant(tenant)
                    .priority(Priority::NORMAL)
                    .timeout(Duration::from_secs(5))
                    .build();
                drop(quota.admit(&capacity, work).await.expect("admitted"));
            }
        })
    };
    admit(50);
    let healthy = quota.snapshot();
    assert!(!healthy.degraded);
    assert!(healthy.tenants[0].leased >= 50);

    server.kill();
    // A request wakes the leasing thread; its next exchange fails.
    eventually("the node notices", || {
        admit(1);
        quota.snapshot().degraded
    });
    // It keeps admitting on the fallback trickle (500 a second).
    admit(200);
    assert!(quota.snapshot().tenants[0].fallback > 0);
    let failures = quota.snapshot().failures;
    assert!(failures >= 1);

    server.restart();
    eventually("the node resyncs", || {
        admit(1);
        !quota.snapshot().degraded
    });
    let back = quota.snapshot();
    assert!(back.last_error.is_some(), "it remembers why it fell back");
    runtime.block_on(async {
        let mut redis = connection(&server).await;
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("admission:quota:{}", tenant.get()))
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(exists, 1, "the bucket is made again in the new server");
    });
}

#[test]
fn shutdown_returns_the_unspent_lease_to_redis() {
    let Some(server) = RedisServer::start("shutdown_returns_the_unspent_lease_to_redis") else {
        return;
    };
    let tenant = TenantId::new(4);
    // A slow refill, so that what comes back is what was returned.
    let limit = TenantQuota::new(1, 1_000).unwrap();
    let quota = Quota::builder()
        .backend(RedisBackend::new(&server.url()).unwrap())
        .node_id("a")
        .tenant(tenant, limit)
        .build()
        .unwrap();
    let capacity = WorkQueue::new(8).unwrap();
    let runtime = runtime();
    runtime.block_on(async {
        drop(
            quota
                .admit(&capacity, WorkInfo::new(tenant, Priority::NORMAL))
                .await
                .unwrap(),
        );
    });
    let held = quota.snapshot().tenants[0].balance;
    assert!(held > 0, "{held}");
    drop(quota);
    runtime.block_on(async {
        let backend = RedisBackend::new(&server.url()).unwrap();
        let after = exchange(&backend, "b", vec![Lease::new(tenant, 1, 1_000, 1_000, 1)]).await;
        // 1,000 less the one spent, and a second or so of refill at 1/s.
        assert!((999..=1_000).contains(&after[0].granted), "{after:?}");
    });
}
