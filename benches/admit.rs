//! Cost of admission itself, beside `tokio::sync::Semaphore` in the same run.
//!
//! * `uncontended`: one admit + release with free capacity and nobody
//!   waiting (the fast path), against the semaphore's `acquire` and
//!   `acquire_owned` (our permit owns an `Arc` like the latter) and
//!   `try_acquire`. Futures are polled once by hand with a no-op waker, so
//!   the numbers hold no runtime scheduling cost.
//! * `contended_two_threads`: two tasks on a two-worker runtime take turns
//!   on a single slot (every admission after the first waits and is handed
//!   the slot directly), per admission.
//! * `cancel_with_10k_waiters`: with 10,000 requests already waiting,
//!   enqueue one more and drop it.
//! * `give_way_kept`: a permit offering its slot (`SlotPermit::give_way`)
//!   that nobody outranks, with nobody waiting and with 1,000 requests of
//!   a lower priority waiting: the price of a preemption point that finds
//!   nothing to do.
//!
//! Run with `cargo bench --bench admit`; compare the lines of a group with
//! each other, not across machines.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use criterion::{criterion_group, criterion_main, Criterion};
use tokio::sync::Semaphore;

fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended");
    let queue = WorkQueue::new(1_000).unwrap();
    let work = WorkInfo::new(TenantId::new(7), Priority::NORMAL);
    group.bench_function("admission_admit_release", |b| {
        b.iter(|| match poll_once(queue.admit(black_box(work.clone()))) {
            Poll::Ready(Ok(permit)) => drop(black_box(permit)),
            _ => unreachable!("capacity is free"),
        })
    });
    let semaphore = Arc::new(Semaphore::new(1_000));
    group.bench_function("tokio_semaphore_acquire_release", |b| {
        b.iter(|| match poll_once(semaphore.acquire()) {
            Poll::Ready(Ok(permit)) => drop(black_box(permit)),
            _ => unreachable!("permits are free"),
        })
    });
    group.bench_function("tokio_semaphore_acquire_owned_release", |b| {
        b.iter(|| match poll_once(semaphore.clone().acquire_owned()) {
            Poll::Ready(Ok(permit)) => drop(black_box(permit)),
            _ => unreachable!("permits are free"),
        })
    });
    group.bench_function("tokio_semaphore_try_acquire_release", |b| {
        b.iter(|| drop(black_box(semaphore.try_acquire().unwrap())))
    });
    group.finish();
}

/// Time for `per_task` turns of each of two tasks on one slot, per turn.
fn two_task_turns<F, Fut>(runtime: &tokio::runtime::Runtime, iters: u64, turn: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    runtime.block_on(async move {
        let start = Instant::now();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let turn = turn.clone();
                tokio::spawn(async move {
                    for _ in 0..iters.div_ceil(2) {
                        turn().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        start.elapsed()
    })
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended_two_threads");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let queue = WorkQueue::new(1).unwrap();
    let work = WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL);
    group.bench_function("admission_one_slot", |b| {
        b.iter_custom(|iters| {
            let queue = queue.clone();
            let work = work.clone();
            two_task_turns(&runtime, iters, move || {
                let queue = queue.clone();
                let work = work.clone();
                async move {
                    let permit = queue.admit(work).await.unwrap();
                    tokio::task::yield_now().await;
                    drop(permit);
                }
            })
        })
    });
    let semaphore = Arc::new(Semaphore::new(1));
    group.bench_function("tokio_semaphore_one_permit", |b| {
        b.iter_custom(|iters| {
            let semaphore = semaphore.clone();
            two_task_turns(&runtime, iters, move || {
                let semaphore = semaphore.clone();
                async move {
                    let permit = semaphore.acquire().await.unwrap();
                    tokio::task::yield_now().await;
                    drop(permit);
                }
            })
        })
    });
    group.finish();
}

fn cancel_with_waiters(c: &mut Criterion) {
    const WAITERS: usize = 10_000;
    let mut group = c.benchmark_group("cancel_with_10k_waiters");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _guard = runtime.enter();

    let queue = WorkQueue::builder()
        .total_slots(0)
        .max_waiters(WAITERS + 1)
        .build()
        .unwrap();
    let waiting: Vec<_> = (0..WAITERS as u64)
        .map(|i| {
            let work = WorkInfo::new(TenantId::new(i % 16), Priority::new((i % 7) as i8 * 10));
            let mut admit = Box::pin(queue.admit(work));
            let polled = admit.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending());
            admit
        })
        .collect();
    let work = WorkInfo::new(TenantId::new(3), Priority::NORMAL);
    group.bench_function("admission_enqueue_and_cancel", |b| {
        b.iter(|| {
            let mut admit = pin!(queue.admit(black_box(work.clone())));
            let polled = admit.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending());
        })
    });
    assert_eq!(queue.waiting(), WAITERS);

    let semaphore = Semaphore::new(0);
    let semaphore_waiting: Vec<_> = (0..WAITERS)
        .map(|_| {
            let mut acquire = Box::pin(semaphore.acquire());
            let polled = acquire
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending());
            acquire
        })
        .collect();
    group.bench_function("tokio_semaphore_enqueue_and_cancel", |b| {
        b.iter(|| {
            let mut acquire = pin!(semaphore.acquire());
            let polled = acquire
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending());
        })
    });
    group.finish();
    drop(waiting);
    drop(semaphore_waiting);
}

fn give_way_kept(c: &mut Criterion) {
    let mut group = c.benchmark_group("give_way_kept");
    let queue = WorkQueue::new(1).unwrap();
    let bulk = WorkInfo::new(TenantId::new(1), Priority::BULK_NORMAL);
    let Poll::Ready(Ok(permit)) = poll_once(queue.admit(bulk)) else {
        unreachable!("capacity is free");
    };
    let mut permit = Some(permit);
    let mut offer = |b: &mut criterion::Bencher<'_>| {
        b.iter(|| {
            let held = permit.take().expect("kept every time");
            match poll_once(held.give_way()) {
                Poll::Ready(Ok(kept)) => permit = Some(black_box(kept)),
                _ => unreachable!("nobody outranks bulk work here"),
            }
        })
    };
    group.bench_function("nobody_waiting", &mut offer);
    let low = WorkInfo::new(TenantId::new(2), Priority::BULK_LOW);
    let mut waiting: Vec<_> = (0..1_000)
        .map(|_| Box::pin(queue.admit(low.clone())))
        .collect();
    for admit in &mut waiting {
        assert!(poll_once(admit.as_mut()).is_pending());
    }
    group.bench_function("1000_lower_waiting", &mut offer);
    group.finish();
    drop(waiting);
}

criterion_group!(
    benches,
    uncontended,
    contended,
    cancel_with_waiters,
    give_way_kept
);
criterion_main!(benches);
