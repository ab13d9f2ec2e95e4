//! Property test of arrivals first: the conservation property
//! (`tests/conservation.rs`) over a queue whose releases keep a slot back
//! whenever the test says arrivals wait in the runtime. In the crate
//! because that check is crate-private; off a runtime it never fires, so
//! the integration tests cannot switch it at will.
//!
//! After every operation: the granter holds no more slots than permits and
//! grants not yet observed can hold; while requests wait, at most one slot
//! is free, and only while one is kept for arrivals; a slot is kept only
//! while the test says arrivals wait, and none is kept once a request has
//! asked, whatever it was answered. At quiescence every slot is back and
//! every request settled exactly once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use tokio_test::task::{spawn, Spawn};

use super::{Admit, GiveWay, WorkQueue};
use crate::grant::Granter;
use crate::{AdmitError, Priority, SlotPermit, TenantId, WorkInfo};

/// What the runtime would say about arrivals waiting in its global queue.
/// Only this test builds a queue that reads it.
static ARRIVALS_WAITING: AtomicBool = AtomicBool::new(false);

fn arrivals_waiting() -> bool {
    ARRIVALS_WAITING.load(Ordering::Relaxed)
}

#[derive(Clone, Copy, Debug)]
enum Ask {
    /// One slot, through the queue.
    Slot,
    /// More than the queue could ever grant: refused at the door.
    NeverFits,
    /// One slot, without the granter's permission.
    Bypass,
}

#[derive(Clone, Debug)]
enum Op {
    Admit {
        tenant: u64,
        priority: i8,
        timeout_ms: Option<u64>,
        ask: Ask,
    },
    PollAll,
    DropWaiting(usize),
    Release(usize),
    GiveWay(usize),
    ArrivalsWaiting(bool),
    Maintain,
    Advance(u64),
    SetTotal(u64),
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    let ask = prop_oneof![6 => Just(Ask::Slot), 2 => Just(Ask::NeverFits), 1 => Just(Ask::Bypass)];
    prop_oneof![
        8 => (1..4u64, prop::sample::select(vec![-30i8, 0, 0, 50]),
              prop::option::weighted(0.3, 1..20u64), ask)
            .prop_map(|(tenant, priority, timeout_ms, ask)| Op::Admit { tenant, priority, timeout_ms, ask }),
        3 => Just(Op::PollAll),
        2 => any::<usize>().prop_map(Op::DropWaiting),
        5 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::GiveWay),
        3 => any::<bool>().prop_map(Op::ArrivalsWaiting),
        1 => Just(Op::Maintain),
        1 => (0..10u64).prop_map(Op::Advance),
        1 => (0..4u64).prop_map(Op::SetTotal),
        1 => prop::bool::weighted(0.1).prop_map(|close| if close { Op::Close } else { Op::PollAll }),
    ]
}

/// What the test saw settle.
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

/// Polls every waiting request and every permit asking again after giving
/// way, and keeps what settled.
fn poll_all(
    waiting: &mut Vec<Spawn<Admit>>,
    giving_way: &mut Vec<Spawn<GiveWay>>,
    seen: &mut Seen,
    permits: &mut Vec<SlotPermit>,
) {
    waiting.retain_mut(|admit| match admit.poll() {
        Poll::Ready(result) => {
            seen.settle(result, permits);
            false
        }
        Poll::Pending => true,
    });
    giving_way.retain_mut(|work| match work.poll() {
        Poll::Ready(result) => {
            seen.settle(result, permits);
            false
        }
        Poll::Pending => true,
    });
}

/// (used, total, waiting, a slot kept now, slots kept so far).
fn state(queue: &WorkQueue) -> (u64, u64, usize, bool, u64) {
    let locked = queue.shared.lock();
    let granter = queue.shared.granter.snapshot(&locked.granter);
    (
        granter.used,
        granter.total,
        locked.queue.waiting(),
        locked.queue.holds_kept_slot(),
        locked.queue.kept_for_arrivals(),
    )
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    ARRIVALS_WAITING.store(false, Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let queue = WorkQueue::builder()
            .total_slots(2)
            .max_waiters(6)
            .arrivals_waiting_by(arrivals_waiting)
            .build()
            .unwrap();
        let mut waiting: Vec<Spawn<Admit>> = Vec::new();
        let mut giving_way: Vec<Spawn<GiveWay>> = Vec::new();
        let mut permits: Vec<SlotPermit> = Vec::new();
        let mut seen = Seen::default();

        for op in ops {
            let kept_before = state(&queue).4;
            let asks = matches!(op, Op::Admit { .. });
            match op {
                Op::Admit {
                    tenant,
                    priority,
                    timeout_ms,
                    ask,
                } => {
                    let mut work = WorkInfo::builder()
                        .tenant(TenantId::new(tenant))
                        .priority(Priority::new(priority));
                    work = match ask {
                        Ask::Slot => work,
                        Ask::NeverFits => work.requested(u64::MAX),
                        Ask::Bypass => work.bypass(true),
                    };
                    if let Some(ms) = timeout_ms {
                        work = work.timeout(Duration::from_millis(ms));
                    }
                    let mut admit = spawn(queue.admit(work.build()));
                    seen.requested += 1;
                    match admit.poll() {
                        Poll::Ready(result) => seen.settle(result, &mut permits),
                        Poll::Pending => waiting.push(admit),
                    }
                }
                Op::PollAll => poll_all(&mut waiting, &mut giving_way, &mut seen, &mut permits),
                Op::DropWaiting(index) if !waiting.is_empty() => {
                    drop(waiting.swap_remove(index % waiting.len()));
                    seen.errored += 1;
                }
                Op::Release(index) if !permits.is_empty() => {
                    drop(permits.swap_remove(index % permits.len()));
                }
                Op::GiveWay(index) if !permits.is_empty() => {
                    let permit = permits.swap_remove(index % permits.len());
                    let gave_way = permit.give_way();
                    let asks_again = gave_way.gave_way();
                    let mut gave_way = spawn(gave_way);
                    match gave_way.poll() {
                        Poll::Ready(Ok(permit)) if !asks_again => permits.push(permit),
                        Poll::Ready(result) => {
                            prop_assert!(asks_again, "a kept permit came back as {result:?}");
                            seen.requested += 1;
                            seen.settle(result, &mut permits);
                        }
                        Poll::Pending => {
                            prop_assert!(asks_again, "a kept permit must come back at once");
                            seen.requested += 1;
                            giving_way.push(gave_way);
                        }
                    }
                }
                Op::ArrivalsWaiting(on) => ARRIVALS_WAITING.store(on, Ordering::Relaxed),
                Op::Maintain => queue.maintain(),
                Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                Op::SetTotal(total) => queue.set_total_slots(total).unwrap(),
                Op::Close => queue.close(),
                Op::DropWaiting(_) | Op::Release(_) | Op::GiveWay(_) => {}
            }
            let (used, total, queued, kept_now, kept_so_far) = state(&queue);
            let holders = (permits.len() + waiting.len() + giving_way.len()) as u64;
            prop_assert!(used <= holders, "{used} used, {holders} holders");
            prop_assert!(queued <= waiting.len() + giving_way.len());
            if queued > 0 {
                // Capacity is never free while requests wait, but for the
                // one slot kept for arrivals.
                let free = total.saturating_sub(used);
                prop_assert!(
                    free <= u64::from(kept_now),
                    "{free} free with {queued} waiting (kept: {kept_now})"
                );
            }
            if asks {
                // The request asked, so a kept slot went out, whatever it
                // was answered.
                prop_assert!(!kept_now, "a slot still kept after a request asked");
            }
            if kept_so_far > kept_before {
                prop_assert_eq!(kept_so_far, kept_before + 1, "one slot kept at a time");
                prop_assert!(arrivals_waiting(), "kept with no arrivals waiting");
            }
        }

        // Quiescence: arrivals gone, the gates open, every deadline past.
        ARRIVALS_WAITING.store(false, Ordering::Relaxed);
        queue.set_total_slots(1_000).unwrap();
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(1)).await;
            queue.maintain();
            poll_all(&mut waiting, &mut giving_way, &mut seen, &mut permits);
        }
        prop_assert!(waiting.is_empty() && giving_way.is_empty(), "still pending");
        drop(permits);
        let snapshot = queue.snapshot();
        prop_assert_eq!(snapshot.granter.used, 0, "a slot leaked");
        prop_assert_eq!(snapshot.waiting, 0);
        let sum = |f: fn(&crate::observe::PrioritySnapshot) -> u64| {
            snapshot.priorities.iter().map(f).sum::<u64>()
        };
        prop_assert_eq!(sum(|p| p.requested), seen.requested);
        prop_assert_eq!(sum(|p| p.admitted), seen.admitted);
        prop_assert_eq!(sum(|p| p.errored), seen.errored);
        Ok(())
    })
}

proptest! {
    #[test]
    fn with_slots_kept_for_arrivals_every_slot_comes_back_and_none_idles(
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run(ops)?;
    }
}
