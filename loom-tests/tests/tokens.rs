//! loom models of the token queue: refills and corrections racing each
//! other and the admissions they should unblock.

#![cfg(loom)]

use std::future::Future;
use std::task::{Context, Poll, Waker};

use admission::{TenantId, WorkInfo, WorkQueue};
use loom::thread;
use loom_tests::model;

fn write(tenant: u64, bytes: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .requested(bytes)
        .build()
}

/// A refill and a credit race; the waiting writer is granted exactly once,
/// whichever lands first, and the balance adds up.
#[test]
fn refill_and_correction_race_a_waiting_take() {
    model(|| {
        let queue = WorkQueue::tokens(100).unwrap();
        queue.set_token_limit(Some(100)).unwrap();
        let mut waiter = Box::pin(queue.admit(write(1, 3)));
        let polled = waiter
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending(), "no tokens yet");

        let refill = {
            let queue = queue.clone();
            thread::spawn(move || queue.add_tokens(5))
        };
        let credit = {
            let queue = queue.clone();
            thread::spawn(move || queue.correct_tokens(TenantId::new(2), 10, 4))
        };
        refill.join().unwrap();
        credit.join().unwrap();

        match waiter
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(permit)) => drop(permit),
            other => panic!("the writer was not granted: {other:?}"),
        }
        // 5 refilled + 6 credited − 3 taken, however the two raced.
        assert_eq!(queue.snapshot().granter.available, 8);
    });
}

/// A writer blocks on admission while a refill arrives: it must be granted
/// (a lost wake-up would be a loom deadlock).
#[test]
fn a_refill_wakes_a_blocked_writer() {
    model(|| {
        let queue = WorkQueue::tokens(100).unwrap();
        queue.set_token_limit(Some(100)).unwrap();
        let writer = {
            let queue = queue.clone();
            thread::spawn(move || {
                let permit = loom::future::block_on(queue.admit(write(1, 7))).unwrap();
                drop(permit);
            })
        };
        let refill = {
            let queue = queue.clone();
            thread::spawn(move || queue.add_tokens(1))
        };
        writer.join().unwrap();
        refill.join().unwrap();
        assert_eq!(queue.snapshot().granter.available, 1 - 7);
    });
}

fn work(tenant: u64, priority: admission::Priority, bytes: u64) -> WorkInfo {
    WorkInfo::builder()
        .tenant(TenantId::new(tenant))
        .priority(priority)
        .requested(bytes)
        .build()
}

/// Regular and elastic queues share one bucket: a refill of both classes
/// races a blocked elastic writer and a regular take. Whatever the order,
/// the elastic writer is granted (no lost wake-up across the two queues)
/// and both balances add up: every admission paid from both.
#[test]
fn a_two_class_refill_wakes_a_blocked_elastic_writer() {
    use admission::Priority;
    use admission::TokenQueues;

    model(|| {
        let queues = TokenQueues::new(100, 100).unwrap();
        queues.set_limits(Some(100), Some(100)).unwrap();
        let bulk = {
            let queues = queues.clone();
            thread::spawn(move || {
                let permit =
                    loom::future::block_on(queues.admit(work(1, Priority::BULK_NORMAL, 4)))
                        .unwrap();
                drop(permit);
            })
        };
        let refill = {
            let queues = queues.clone();
            thread::spawn(move || queues.add_tokens(10, 5))
        };
        let foreground = {
            let queues = queues.clone();
            thread::spawn(move || {
                let mut admit = Box::pin(queues.admit(work(2, Priority::NORMAL, 2)));
                // Granted at once or queued; a queued take is withdrawn by
                // the drop, and a grant it never saw is not charged twice.
                matches!(
                    admit.as_mut().poll(&mut Context::from_waker(Waker::noop())),
                    Poll::Ready(Ok(_))
                )
            })
        };
        bulk.join().unwrap();
        refill.join().unwrap();
        let foreground_admitted = foreground.join().unwrap();
        let foreground_paid = if foreground_admitted { 2 } else { 0 };
        assert_eq!(
            queues.regular().snapshot().granter.available,
            10 - 4 - foreground_paid
        );
        assert_eq!(
            queues.elastic().snapshot().granter.available,
            5 - 4 - foreground_paid
        );
    });
}
