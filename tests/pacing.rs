//! Grant pacing (upstream's grant chain): at most a burst of grants may be
//! outstanding until their futures run and observe them.

mod common;

use std::time::Duration;

use admission::WorkQueue;
use common::*;
use tokio::time::Instant;

fn paced(burst: usize) -> WorkQueue {
    WorkQueue::builder()
        .total_slots(0)
        .grant_burst(burst)
        .grant_burst_timeout(Duration::from_millis(100))
        .build()
        .unwrap()
}

fn woken(waiters: &[(&'static str, Pending)]) -> Vec<&'static str> {
    waiters
        .iter()
        .filter(|(_, admit)| admit.is_woken())
        .map(|(name, _)| *name)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn freed_slots_go_out_a_burst_at_a_time_as_grantees_start_running() {
    let t0 = Instant::now();
    let queue = paced(2);
    let mut waiters: Vec<_> = ["a", "b", "c", "d", "e"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| (name, enqueue(&queue, work(1, 0, t0, i as u64))))
        .collect();

    queue.set_total_slots(5).unwrap();
    assert_eq!(woken(&waiters), ["a", "b"], "only a burst is handed out");
    assert_eq!(queue.snapshot().granter.used, 2);

    // `a` runs and observes its grant: one more place in the burst.
    let (_, mut a) = waiters.remove(0);
    let a = try_settle(&mut a).unwrap().unwrap();
    assert_eq!(woken(&waiters[1..]), ["c"]);
    assert_eq!(queue.snapshot().granter.used, 3);

    // The rest follow as each grantee starts.
    let mut permits = vec![a];
    permits.extend(granted(&mut waiters).into_iter().map(|(_, p)| p));
    permits.extend(granted(&mut waiters).into_iter().map(|(_, p)| p));
    assert!(waiters.is_empty());
    assert_eq!(queue.snapshot().granter.used, 5);
}

#[tokio::test(start_paused = true)]
async fn grants_nobody_observes_stop_holding_the_queue_back_after_the_timeout() {
    let t0 = Instant::now();
    let queue = paced(1);
    let waiters: Vec<_> = (0..3).map(|i| enqueue(&queue, work(1, 0, t0, i))).collect();
    queue.set_total_slots(3).unwrap();
    assert_eq!(queue.snapshot().granter.used, 1);

    // The first grantee never runs. Upkeep notices the stall, and once the
    // timeout has passed with no progress it lets the next burst out.
    queue.maintain();
    tokio::time::advance(Duration::from_millis(99)).await;
    queue.maintain();
    assert_eq!(queue.snapshot().granter.used, 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    queue.maintain();
    assert_eq!(queue.snapshot().granter.used, 2);
    assert!(waiters[1].is_woken());
    drop(waiters);
    assert_eq!(queue.snapshot().granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_grantee_frees_its_place_in_the_burst() {
    let t0 = Instant::now();
    let queue = paced(1);
    let first = enqueue(&queue, work(1, 0, t0, 0));
    let mut second = vec![("second", enqueue(&queue, work(1, 0, t0, 1)))];
    queue.set_total_slots(2).unwrap();
    assert!(first.is_woken());
    drop(first);
    assert_eq!(names(&granted(&mut second)), ["second"]);
}

#[test]
fn bad_pacing_settings_fail_at_construction() {
    let err = WorkQueue::builder().grant_burst(0).build().unwrap_err();
    assert_eq!(err.field(), "grant_burst");
    let err = WorkQueue::builder()
        .grant_burst_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "grant_burst_timeout");
}
