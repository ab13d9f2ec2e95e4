//! A yardstick for the admission systems: the plainest gate a careful
//! engineer would write for W2 by hand, with none of this crate's
//! machinery.
//!
//! A fixed number of permits (one per worker); waiters kept per priority
//! and granted strictly highest priority first; within a priority, oldest
//! first until the oldest has waited half the SLO, newest first from then
//! on (adaptive LIFO); a request left with less time than a mean service
//! time is refused instead of admitted, at the door and when a permit
//! comes back. No tenants, no controller, no estimate of the wait ahead.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::Priority;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The gate; see the module docs.
#[derive(Debug)]
pub struct StrictGate {
    state: Mutex<GateState>,
    /// A request left with less than this is refused: the mean service.
    skip_below: Duration,
    /// A priority whose oldest waiter has waited this long is served
    /// newest first.
    lifo_after: Duration,
}

#[derive(Debug)]
struct GateState {
    free: usize,
    waiting: BTreeMap<Reverse<Priority>, VecDeque<Waiter>>,
}

#[derive(Debug)]
struct Waiter {
    since: Instant,
    deadline: Instant,
    grant: oneshot::Sender<()>,
}

/// Why a request did not get a permit.
#[derive(Debug, PartialEq, Eq)]
pub enum GateRefusal {
    /// Too little time left to be worth serving.
    Skipped,
    /// Its deadline passed while it waited.
    Expired,
}

/// A permit; returned on drop.
#[derive(Debug)]
pub struct GatePermit {
    gate: Arc<StrictGate>,
}

impl Drop for GatePermit {
    fn drop(&mut self) {
        self.gate.release();
    }
}

impl StrictGate {
    pub fn new(permits: usize, mean_service: Duration, slo: Duration) -> Arc<Self> {
        Arc::new(StrictGate {
            state: Mutex::new(GateState {
                free: permits,
                waiting: BTreeMap::new(),
            }),
            skip_below: mean_service,
            lifo_after: slo / 2,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub async fn acquire(
        self: &Arc<Self>,
        priority: Priority,
        deadline: Instant,
    ) -> Result<GatePermit, GateRefusal> {
        let now = Instant::now();
        if now + self.skip_below > deadline {
            return Err(GateRefusal::Skipped);
        }
        let (grant, granted) = oneshot::channel();
        {
            let mut state = self.lock();
            if state.free > 0 && state.waiting.is_empty() {
                state.free -= 1;
                return Ok(GatePermit { gate: self.clone() });
            }
            state
                .waiting
                .entry(Reverse(priority))
                .or_default()
                .push_back(Waiter {
                    since: now,
                    deadline,
                    grant,
                });
        }
        let mut granted = granted;
        match tokio::time::timeout_at(deadline, &mut granted).await {
            Ok(Ok(())) => Ok(GatePermit { gate: self.clone() }),
            // The gate dropped the sender: skipped when a permit came back.
            Ok(Err(_)) => Err(GateRefusal::Skipped),
            Err(_) => {
                // A permit sent as the deadline fired is passed on.
                granted.close();
                if granted.try_recv().is_ok() {
                    drop(GatePermit { gate: self.clone() });
                }
                Err(GateRefusal::Expired)
            }
        }
    }

    /// A permit came back: to the first waiter worth serving, else free.
    fn release(&self) {
        let mut state = self.lock();
        let now = Instant::now();
        loop {
            let Some(mut entry) = state.waiting.first_entry() else {
                state.free += 1;
                return;
            };
            let queue = entry.get_mut();
            let lifo = queue
                .front()
                .is_some_and(|oldest| now.duration_since(oldest.since) >= self.lifo_after);
            let next = if lifo {
                queue.pop_back()
            } else {
                queue.pop_front()
            };
            if queue.is_empty() {
                entry.remove();
            }
            let Some(waiter) = next else {
                continue;
            };
            if now + self.skip_below > waiter.deadline {
                // Dropping the sender refuses it.
                continue;
            }
            if waiter.grant.send(()).is_ok() {
                return;
            }
            // Gone (its deadline fired): the next one.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn higher_priority_first_then_newest_once_behind_and_the_hopeless_skipped() {
        let gate = StrictGate::new(1, Duration::from_millis(1), Duration::from_millis(10));
        let t0 = Instant::now();
        let held = gate
            .acquire(Priority::NORMAL, t0 + Duration::from_secs(1))
            .await
            .expect("free");
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |name: &'static str, priority, deadline_ms| {
            let (gate, order) = (gate.clone(), order.clone());
            tokio::spawn(async move {
                let permit = gate
                    .acquire(priority, t0 + Duration::from_millis(deadline_ms))
                    .await?;
                order.lock().unwrap().push(name);
                drop(permit);
                Ok::<(), GateRefusal>(())
            })
        };
        let old = spawn("old", Priority::NORMAL, 100);
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(6)).await;
        let new = spawn("new", Priority::NORMAL, 100);
        let urgent = spawn("urgent", Priority::USER_HIGH, 100);
        // Waits, but has less than a mean service left once a permit frees.
        let hopeless = spawn("hopeless", Priority::USER_HIGH, 7);
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_micros(500)).await;
        // The oldest normal waiter has waited past half the SLO: newest
        // first among normals; high priority first of all, except the one
        // with too little time left.
        drop(held);
        for task in [old, new, urgent] {
            task.await.unwrap().expect("granted");
        }
        assert_eq!(hopeless.await.unwrap(), Err(GateRefusal::Skipped));
        assert_eq!(*order.lock().unwrap(), ["urgent", "new", "old"]);
    }
}
