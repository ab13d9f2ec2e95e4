//! Arrivals first: a returned slot waits for requests the runtime has not
//! yet shown the queue.
//!
//! Admission orders a request from its first poll; until then its task
//! waits where tokio put it. A task spawned or woken from outside the
//! runtime waits in tokio's global queue, which a worker with local work
//! looks at once every ~200 µs of polling. The grant loop, run as a slot
//! comes back, wakes the next waiter from the worker that returned the
//! slot, so tokio puts it in that worker's LIFO slot: the worker always has
//! local work, and when handlers wake themselves between chunks (an await
//! whose value is ready) no worker ever runs out of it. Under overload the
//! global queue then fills with arrivals that wait, unordered, past their
//! deadlines, while every slot goes to a request that was already queued:
//! W2 at 3x with self-waking handlers served the high class within its SLO
//! 98.2–98.9% of the time at a p99 1.5–1.6x its value alone, whatever the
//! slot total (a fixed total did no better).
//!
//! So a controller's queue keeps a returned slot back, instead of granting
//! it at once, when the task returning it runs on a runtime whose global
//! queue holds a task a worker or more. That worker then has nothing local
//! to run, and tokio has it take a batch from the global queue; the first
//! of those arrivals to ask for admission runs the grant loop, which gives
//! the slot to whoever is first in the queue's order, the newcomer
//! included if it queued. Whatever the arrival is answered: under overload
//! most arrivals taken in are refused at the door (their deadline spent in
//! the global queue, early rejection), and when only an arrival that
//! queued gave the slot out, it sat idle meanwhile (W2 with self-waking
//! handlers: the workers 95.6–95.9% busy against 97.1–98.1% with a fixed
//! total; 97.4–97.9% once any arrival gives it out). What bounds the cost:
//!
//! * one slot at a time: while one is kept back, other releases grant as
//!   usual;
//! * the next request to ask, or the next grant loop, whatever runs it
//!   (another release, a change of the total, the controller's tick every
//!   millisecond), gives it out, so a slot kept for tasks that were not
//!   requests waits at most one tick;
//! * only a release on a runtime worker (a permit dropped elsewhere frees
//!   no worker to look), only with requests waiting in the queue, and only
//!   while the runtime's global queue holds a task a worker or more.
//!
//! Tokio's metrics say how many tasks wait in the global queue
//! (`RuntimeMetrics::global_queue_depth`, stable), not what they are: a
//! release may keep its slot for tasks that are not requests, and then the
//! slot is idle until the next grant loop. Hence the line of a task a
//! worker: at one task or more, a slot was also kept for a lone task that
//! was not a request (the stable signal's probe, woken by the sampler
//! thread, is one), and in four pairs of W2 runs side by side the
//! defaults' goodput came to 0.95 of the fixed total's in the same run on
//! average, against 0.99 at a task a worker, with the high class served
//! alike (99.5–99.8% within the SLO, p99 3.5–4.2 ms, both lines). The
//! measurements, against the queue without it: `docs/OVERLOAD.md`, "Arrivals first".
//!
//! The queue state decides through a plain `fn` (`Limits::arrivals_waiting`)
//! so that it stays free of the runtime and its tests can say what the
//! runtime holds: the loom models (`loom_models.rs`) say arrivals always
//! wait, and race a keeping release against a refusal, a cancellation and
//! a second release; the property test (`arrivals_tests.rs`) switches it
//! between random operations.

/// Whether the runtime of the calling thread holds a task a worker or more
/// in its global queue; `false` off a runtime.
pub(super) fn waiting_in_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|handle| {
        let metrics = handle.metrics();
        metrics.global_queue_depth() >= metrics.num_workers()
    })
}
