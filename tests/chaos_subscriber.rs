//! Property test: a `tracing` subscriber that panics now and then, wherever
//! admission calls it, loses no slot and wedges no queue.
//!
//! A subscriber is the application's code, called from inside admission:
//! as a wait begins (its span), as it settles (the span's fields), and when
//! a wait fails (an event). A random sequence of admissions, polls, drops,
//! releases, total changes and clock advances runs with a subscriber that
//! panics on every few calls. Every operation runs behind `catch_unwind`,
//! and a future whose poll panicked is dropped, as a runtime drops a task
//! that panicked. Afterwards, with every permit dropped, no request may
//! still wait while slots are free, and at the end every slot is back and
//! nothing waits.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use admission::{Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};
use common::{paused_runtime, Pending};
use proptest::prelude::*;
use tokio::time::Instant;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Panics on every `every`-th span creation, field record or event. Never
/// on entering, leaving or closing a span: those run in guards' drops,
/// where a panic would abort whatever admission did.
struct Flaky {
    calls: Arc<AtomicU64>,
    every: u64,
}

impl Flaky {
    fn call(&self) {
        if self.calls.fetch_add(1, Ordering::Relaxed) % self.every == self.every - 1 {
            panic!("subscriber down");
        }
    }
}

impl<S: Subscriber> Layer<S> for Flaky {
    fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        self.call();
    }
    fn on_record(&self, _: &Id, _: &Record<'_>, _: Context<'_, S>) {
        self.call();
    }
    fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
        self.call();
    }
}

#[derive(Clone, Debug)]
enum Op {
    Admit {
        tenant: u64,
        priority: i8,
        timeout_ms: Option<u64>,
    },
    PollAll,
    DropWaiting(usize),
    DropPermit(usize),
    SetTotal(u64),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1..4u64, prop::sample::select(vec![-50i8, 0, 50]),
              prop::option::weighted(0.5, 1..20u64))
            .prop_map(|(tenant, priority, timeout_ms)| Op::Admit { tenant, priority, timeout_ms }),
        4 => Just(Op::PollAll),
        1 => any::<usize>().prop_map(Op::DropWaiting),
        3 => any::<usize>().prop_map(Op::DropPermit),
        1 => (1..4u64).prop_map(Op::SetTotal),
        2 => (0..10u64).prop_map(Op::Advance),
    ]
}

thread_local! {
    /// Panics other than the subscriber's: admission's own, each a bug.
    static OWN_PANICS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f`; `None` if it panicked. The subscriber's panics are expected;
/// any other is kept for the test to fail on.
fn quietly<R>(f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => Some(value),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|m| m.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if message != "subscriber down" {
                OWN_PANICS.with(|own| own.borrow_mut().push(message));
            }
            None
        }
    }
}

/// Polls `admit`; `None` if the poll panicked (the future is then dropped).
fn poll(admit: &mut Pending) -> Option<Poll<Result<SlotPermit, admission::AdmitError>>> {
    quietly(|| admit.poll())
}

/// Polls every waiting future once: permits kept, the settled and the
/// panicked dropped.
fn poll_all(pending: &mut Vec<Pending>, permits: &mut Vec<SlotPermit>) {
    let mut still = Vec::new();
    for mut admit in pending.drain(..) {
        match poll(&mut admit) {
            Some(Poll::Pending) => still.push(admit),
            Some(Poll::Ready(Ok(permit))) => permits.push(permit),
            Some(Poll::Ready(Err(_))) => {}
            None => drop_quietly(admit),
        }
    }
    *pending = still;
}

/// Drops `value`, whose drop may reach the subscriber and panic.
fn drop_quietly<T>(value: T) {
    quietly(move || drop(value));
}

fn run(ops: Vec<Op>, every: u64) -> Result<(), TestCaseError> {
    common::quiet_panics_saying("subscriber down");
    let queue = WorkQueue::new(2).unwrap();
    let subscriber = tracing_subscriber::registry().with(Flaky {
        calls: Arc::default(),
        every,
    });
    let runtime = paused_runtime();
    let outcome = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let t0 = Instant::now();
            let mut pending: Vec<Pending> = Vec::new();
            let mut permits: Vec<SlotPermit> = Vec::new();
            for (at, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Admit {
                        tenant,
                        priority,
                        timeout_ms,
                    } => {
                        let mut work = WorkInfo::builder()
                            .tenant(TenantId::new(tenant))
                            .priority(Priority::new(priority))
                            .create_time(t0 + Duration::from_micros(at as u64));
                        if let Some(ms) = timeout_ms {
                            work = work.timeout(Duration::from_millis(ms));
                        }
                        let mut admit = tokio_test::task::spawn(queue.admit(work.build()));
                        match poll(&mut admit) {
                            Some(Poll::Pending) => pending.push(admit),
                            Some(Poll::Ready(Ok(permit))) => permits.push(permit),
                            Some(Poll::Ready(Err(_))) => {}
                            None => drop_quietly(admit),
                        }
                    }
                    Op::PollAll => poll_all(&mut pending, &mut permits),
                    Op::DropWaiting(i) if !pending.is_empty() => {
                        drop_quietly(pending.remove(i % pending.len()));
                    }
                    Op::DropPermit(i) if !permits.is_empty() => {
                        drop_quietly(permits.remove(i % permits.len()));
                    }
                    Op::SetTotal(total) => {
                        quietly(|| queue.set_total_slots(total));
                    }
                    Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                    Op::DropWaiting(_) | Op::DropPermit(_) => {}
                }
            }
            // With every permit gone, nothing may wait while a slot is free:
            // each round of polls must settle someone (a grant, a refusal,
            // or a poll that panicked) until nobody is left, since every
            // permit a round returns is dropped and grants the next waiter.
            for permit in permits.drain(..) {
                drop_quietly(permit);
            }
            let mut wedged = false;
            while !pending.is_empty() {
                let before = pending.len();
                poll_all(&mut pending, &mut permits);
                let settled = before - pending.len();
                for permit in permits.drain(..) {
                    drop_quietly(permit);
                }
                if settled == 0 {
                    wedged = true;
                    break;
                }
            }
            let slots = queue.granter_snapshot();
            for admit in pending {
                drop_quietly(admit);
            }
            (wedged, slots)
        })
    });
    let (wedged, slots) = outcome;
    let own = OWN_PANICS.with(|own| std::mem::take(&mut *own.borrow_mut()));
    prop_assert!(own.is_empty(), "admission itself panicked: {own:?}");
    prop_assert!(
        !wedged,
        "requests still waited with every permit gone: {slots:?}"
    );
    let snapshot = queue.snapshot();
    prop_assert_eq!(
        (snapshot.granter.used, snapshot.waiting),
        (0, 0),
        "a slot or a place was lost"
    );
    // And the queue still admits.
    let after = runtime.block_on(queue.admit(WorkInfo::new(TenantId::new(9), Priority::NORMAL)));
    prop_assert!(after.is_ok(), "{after:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_subscriber_that_panics_now_and_then_loses_no_slot_and_wedges_no_queue(
        ops in prop::collection::vec(op(), 1..60),
        every in 2..7u64,
    ) {
        run(ops, every)?;
    }
}
