//! loom models of the slot granter's overrun mark, compiled only with
//! `RUSTFLAGS="--cfg loom"` and run by `loom-tests/tests/controller.rs`
//! (in the crate, like the GPU models, because the mark is crate-private).
//!
//! The mark is the one piece of state the CPU controller's tick shares with
//! every grant: a grant past the total while enforcement is off sets it
//! (and rings the alarm that wakes the sampler), the tick takes it to leave
//! idle mode, and clears it when it goes idle. Each model races one grant
//! against one of the tick's two uses and checks that an overrun is never
//! lost, and that the alarm rings once for it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::{loom_model as model, Arc, AtomicU64, Ordering};
use crate::{Admit, Priority, SlotPermit, TenantId, WorkInfo, WorkQueue};

/// Polls `admit` once with a waker that does nothing: the permit, or the
/// request back if it waits.
fn poll_once(mut admit: Pin<Box<Admit>>) -> Result<SlotPermit, Pin<Box<Admit>>> {
    match admit.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => Ok(result.expect("admitted")),
        Poll::Pending => Err(admit),
    }
}

/// Asks `queue` for a slot and polls once.
fn admit_now(queue: &WorkQueue) -> Result<SlotPermit, Pin<Box<Admit>>> {
    poll_once(Box::pin(
        queue.admit(WorkInfo::new(TenantId::SYSTEM, Priority::NORMAL)),
    ))
}

/// A queue of one slot, held, with an alarm that counts its rings.
fn held_queue() -> (WorkQueue, SlotPermit, Arc<AtomicU64>) {
    let queue = WorkQueue::new(1).expect("a valid total");
    let rings = Arc::new(AtomicU64::new(0));
    let counter = rings.clone();
    queue.granter().set_overrun_alarm(move || {
        counter.fetch_add(1, Ordering::Relaxed);
    });
    let held = admit_now(&queue).unwrap_or_else(|_| panic!("a free slot"));
    (queue, held, rings)
}

/// Idle (not enforcing): a grant past the total races the tick that looks
/// for an overrun and, finding one, enforces again. The overrun is seen by
/// the tick or still marked for the next one, and the alarm rang once.
pub fn an_overrun_racing_the_idle_tick_is_never_lost() {
    model(|| {
        let (queue, held, rings) = held_queue();
        queue.set_enforcing(false);
        let granting = {
            let queue = queue.clone();
            loom::thread::spawn(move || admit_now(&queue))
        };
        let tick = {
            let queue = queue.clone();
            loom::thread::spawn(move || {
                let woke = queue.granter().take_overrun();
                if woke {
                    queue.set_enforcing(true);
                }
                woke
            })
        };
        let extra = granting
            .join()
            .unwrap()
            .unwrap_or_else(|_| panic!("not enforcing: admitted at once"));
        let woke = tick.join().unwrap();
        assert!(
            woke || queue.granter().take_overrun(),
            "the overrun was lost"
        );
        assert_eq!(rings.load(Ordering::Relaxed), 1);
        assert_eq!(queue.granter_snapshot().used, 2);
        drop((held, extra));
        assert_eq!(queue.granter_snapshot().used, 0);
    });
}

/// A request past the total races the tick that goes idle (clears the
/// mark, then stops enforcing). Whether it got in at once or waited and was
/// granted when enforcement stopped, its overrun is marked for the idle
/// spell, and the alarm rang once.
pub fn an_overrun_racing_the_tick_that_goes_idle_is_marked() {
    model(|| {
        let (queue, held, rings) = held_queue();
        let granting = {
            let queue = queue.clone();
            loom::thread::spawn(move || admit_now(&queue))
        };
        let tick = {
            let queue = queue.clone();
            loom::thread::spawn(move || {
                queue.granter().take_overrun();
                queue.set_enforcing(false);
            })
        };
        let first = granting.join().unwrap();
        tick.join().unwrap();
        let extra = first
            .or_else(poll_once)
            .unwrap_or_else(|_| panic!("enforcement is off: the waiter must be granted"));
        assert!(
            queue.granter().take_overrun(),
            "the idle spell's overrun is not marked"
        );
        assert_eq!(rings.load(Ordering::Relaxed), 1);
        drop((held, extra));
        assert_eq!(queue.granter_snapshot().used, 0);
    });
}
