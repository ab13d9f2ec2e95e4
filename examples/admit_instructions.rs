//! Instructions per admission, beside `tokio::sync::Semaphore`, counted
//! by callgrind rather than timed, so that a busy or noisy machine does
//! not move the numbers.
//!
//! ```text
//! cargo build --release --example admit_instructions
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*counted*' \
//!     target/release/examples/admit_instructions uncontended admission 100000
//! ```
//!
//! Callgrind prints the instructions executed inside `counted` (`Collected`,
//! or the `I refs` line); divide by the iteration count. The loop's own
//! setup (the queue, the runtime, the waiters) runs outside `counted` and is
//! not collected. Every case runs for `admission` and for `semaphore`:
//!
//! * `uncontended`: one admit + release on a `WorkQueue::new(1000)` that
//!   nobody waits on, the future polled once by hand with a no-op waker, as
//!   `benches/admit.rs` does; against the semaphore's `acquire_owned` and
//!   the permit's drop (an owned permit, like ours).
//! * `turns`: two tasks on a current-thread runtime taking turns on one
//!   slot (every admission after the first waits and is handed the slot),
//!   counted per turn; the runtime's scheduling is in both counts.
//! * `cancel`: with 10,000 requests waiting on a queue with no slots, one
//!   more enqueued (first poll) and dropped.
//!
//! Without valgrind it runs as a plain loop and prints the time per
//! iteration, which on a noisy machine says little.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use tokio::sync::Semaphore;

fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

/// The only code callgrind collects (`--toggle-collect='*counted*'`).
#[inline(never)]
fn counted(iterations: u64, step: &mut dyn FnMut()) {
    for _ in 0..iterations {
        step();
    }
}

fn uncontended(subject: &str, iterations: u64) {
    match subject {
        "admission" => {
            let queue = WorkQueue::new(1_000).expect("a valid total");
            let work = WorkInfo::new(TenantId::new(7), Priority::NORMAL);
            counted(
                iterations,
                &mut || match poll_once(queue.admit(black_box(work.clone()))) {
                    Poll::Ready(Ok(permit)) => drop(black_box(permit)),
                    _ => unreachable!("capacity is free"),
                },
            );
        }
        _ => {
            let semaphore = Arc::new(Semaphore::new(1_000));
            counted(
                iterations,
                &mut || match poll_once(semaphore.clone().acquire_owned()) {
                    Poll::Ready(Ok(permit)) => drop(black_box(permit)),
                    _ => unreachable!("permits are free"),
                },
            );
        }
    }
}

fn turns(subject: &str, iterations: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let per_task = iterations.div_ceil(2);
    match subject {
        "admission" => {
            let queue = WorkQueue::new(1).expect("a valid total");
            let work = WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL);
            counted(1, &mut || {
                runtime.block_on(async {
                    let tasks: Vec<_> = (0..2)
                        .map(|_| {
                            let (queue, work) = (queue.clone(), work.clone());
                            tokio::spawn(async move {
                                for _ in 0..per_task {
                                    let permit = queue.admit(work.clone()).await.unwrap();
                                    tokio::task::yield_now().await;
                                    drop(permit);
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.unwrap();
                    }
                })
            });
        }
        _ => {
            let semaphore = Arc::new(Semaphore::new(1));
            counted(1, &mut || {
                runtime.block_on(async {
                    let tasks: Vec<_> = (0..2)
                        .map(|_| {
                            let semaphore = semaphore.clone();
                            tokio::spawn(async move {
                                for _ in 0..per_task {
                                    let permit = semaphore.acquire().await.unwrap();
                                    tokio::task::yield_now().await;
                                    drop(permit);
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.unwrap();
                    }
                })
            });
        }
    }
}

fn cancel(subject: &str, iterations: u64) {
    const WAITERS: usize = 10_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let _guard = runtime.enter();
    match subject {
        "admission" => {
            let queue = WorkQueue::builder()
                .total_slots(0)
                .max_waiters(WAITERS + 1)
                .build()
                .expect("valid settings");
            let waiting: Vec<_> = (0..WAITERS as u64)
                .map(|i| {
                    let work =
                        WorkInfo::new(TenantId::new(i % 16), Priority::new((i % 7) as i8 * 10));
                    let mut admit = Box::pin(queue.admit(work));
                    assert!(poll_once(admit.as_mut()).is_pending());
                    admit
                })
                .collect();
            let work = WorkInfo::new(TenantId::new(3), Priority::NORMAL);
            counted(iterations, &mut || {
                assert!(poll_once(queue.admit(black_box(work.clone()))).is_pending());
            });
            assert_eq!(queue.waiting(), WAITERS);
            drop(waiting);
        }
        _ => {
            let semaphore = Semaphore::new(0);
            let waiting: Vec<_> = (0..WAITERS)
                .map(|_| {
                    let mut acquire = Box::pin(semaphore.acquire());
                    assert!(poll_once(acquire.as_mut()).is_pending());
                    acquire
                })
                .collect();
            counted(iterations, &mut || {
                assert!(poll_once(semaphore.acquire()).is_pending());
            });
            drop(waiting);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let case = args.first().map_or("uncontended", String::as_str);
    let subject = args.get(1).map_or("admission", String::as_str);
    let iterations: u64 = args
        .get(2)
        .map(|n| n.parse().expect("ITERATIONS is a number"))
        .unwrap_or(100_000);
    assert!(
        matches!(subject, "admission" | "semaphore"),
        "SUBJECT is admission or semaphore, not {subject}"
    );
    let start = Instant::now();
    match case {
        "uncontended" => uncontended(subject, iterations),
        "turns" => turns(subject, iterations),
        "cancel" => cancel(subject, iterations),
        other => panic!("CASE is uncontended, turns or cancel, not {other}"),
    }
    let elapsed = start.elapsed();
    println!(
        "{case} {subject}: {iterations} iterations, {:.1} ns each (wall clock, setup included)",
        elapsed.as_nanos() as f64 / iterations as f64
    );
}
