//! loom model of the CPU controller moving the slot total while a release
//! grants the freed slot.

#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use admission::cpu::{Adjustment, Controller, CpuLoad};
use admission::{Admit, AdmitError, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};
use loom::sync::Arc;
use loom::thread;
use loom_tests::model;

fn poll_once(admit: &mut Pin<Box<Admit>>) -> Poll<Result<SlotPermit, AdmitError>> {
    admit.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

fn admit(queue: &WorkQueue) -> Pin<Box<Admit>> {
    Box::pin(queue.admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)))
}

/// An overloaded tick (decrease 2 → 1) races the release of one of the two
/// held slots, which would grant the waiter under the old total. Either the
/// waiter got in before the decrease (2 used of 1: allowed, nothing is
/// revoked) or it waits; in both cases it is admitted once the other slot
/// comes back, and every slot is returned at the end.
#[test]
fn a_tick_moves_the_total_while_a_release_grants() {
    model(|| {
        let controller = Arc::new(
            Controller::with_signal(|| CpuLoad::new(5, 1))
                .threshold(1)
                .min_slots(1)
                .max_slots(3)
                .initial_slots(2)
                .manual()
                .build()
                .unwrap(),
        );
        let queue = controller.queue().clone();
        let mut held = Vec::new();
        for _ in 0..2 {
            match poll_once(&mut admit(&queue)) {
                Poll::Ready(Ok(permit)) => held.push(permit),
                other => panic!("expected the fast path, got {other:?}"),
            }
        }
        let mut waiter = admit(&queue);
        assert!(poll_once(&mut waiter).is_pending());

        let ticker = {
            let controller = controller.clone();
            thread::spawn(move || controller.step())
        };
        let first = held.pop().unwrap();
        let releaser = thread::spawn(move || drop(first));
        let tick = ticker.join().unwrap();
        releaser.join().unwrap();

        assert_eq!(tick.adjustment, Adjustment::Decrease);
        let slots = queue.granter_snapshot();
        assert_eq!(slots.total, 1);
        let early = poll_once(&mut waiter);
        match &early {
            Poll::Ready(Ok(_)) => assert_eq!(slots.used, 2),
            Poll::Pending => assert_eq!(slots.used, 1),
            Poll::Ready(Err(error)) => panic!("the waiter failed: {error}"),
        }

        drop(held);
        let permit = match early {
            Poll::Ready(result) => result.unwrap(),
            Poll::Pending => match poll_once(&mut waiter) {
                Poll::Ready(result) => result.unwrap(),
                Poll::Pending => panic!("the freed slot did not reach the waiter"),
            },
        };
        assert_eq!(queue.granter_snapshot().used, 1);
        drop(permit);
        assert_eq!(queue.granter_snapshot().used, 0);
    });
}

#[test]
fn an_overrun_racing_the_idle_tick_is_never_lost() {
    admission::grant::loom_models::an_overrun_racing_the_idle_tick_is_never_lost();
}

#[test]
fn an_overrun_racing_the_tick_that_goes_idle_is_marked() {
    admission::grant::loom_models::an_overrun_racing_the_tick_that_goes_idle_is_marked();
}
