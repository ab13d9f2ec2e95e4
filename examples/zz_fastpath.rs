use admission::{Priority, TenantId, WorkInfo, WorkQueue};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

#[inline(never)]
fn one(queue: &WorkQueue, work: &WorkInfo) {
    match poll_once(queue.admit(black_box(work.clone()))) {
        Poll::Ready(Ok(permit)) => drop(black_box(permit)),
        _ => unreachable!(),
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let queue = WorkQueue::new(1_000).unwrap();
    let work = WorkInfo::new(TenantId::new(7), Priority::NORMAL);
    for _ in 0..n {
        one(&queue, &work);
    }
}
