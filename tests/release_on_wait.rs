//! `SlotPermit::run`: the slot is held while the work computes or yields,
//! given back while it waits, and asked for again in order; nothing is lost
//! when the work is dropped or refused.
//!
//! The tests poll the run by hand on a current-thread runtime with a paused
//! clock, and let the runtime take a turn (wake its deferred wakers, the
//! probe's among them) by yielding the test's own task.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use admission::{AdmitError, Priority, TenantId, WorkInfo, WorkQueue};
use common::{admit_now, enqueue, try_settle, work};
use tokio::time::Instant;
use tokio_test::task;

/// Lets the runtime run its deferred wakers: the test's task yields, and
/// the scheduler wakes every deferred waker before polling it again.
async fn turn() {
    tokio::task::yield_now().await;
}

fn used(queue: &WorkQueue) -> u64 {
    queue.granter_snapshot().used
}

/// Yields `times` times, then completes.
async fn yields(times: usize) {
    for _ in 0..times {
        tokio::task::yield_now().await;
    }
}

/// Wakes itself at every poll, `times` times, then completes: a handler
/// that hands its worker back between chunks without `yield_now`.
struct SelfWaking(usize);

impl Future for SelfWaking {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Sets its flag when dropped: whether the work was dropped where it
/// waited.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_yield_keeps_the_slot() {
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let mut run = task::spawn(permit.run(yields(3)));
    let mut waiting = enqueue(&queue, WorkInfo::new(TenantId::new(2), Priority::NORMAL));
    for _ in 0..3 {
        assert!(run.poll().is_pending());
        turn().await;
        assert_eq!(used(&queue), 1, "a yield keeps the slot");
        assert!(try_settle(&mut waiting).is_none(), "nobody else gets it");
    }
    assert!(matches!(run.poll(), Poll::Ready(Ok(()))));
    assert!(try_settle(&mut waiting).expect("granted").is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_future_that_wakes_itself_keeps_the_slot() {
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let mut run = task::spawn(permit.run(SelfWaking(3)));
    let mut waiting = enqueue(&queue, WorkInfo::new(TenantId::new(2), Priority::NORMAL));
    for _ in 0..3 {
        assert!(run.poll().is_pending());
        assert!(run.is_woken());
        turn().await;
        assert_eq!(used(&queue), 1);
        assert!(try_settle(&mut waiting).is_none());
    }
    assert!(matches!(run.poll(), Poll::Ready(Ok(()))));
}

#[tokio::test(start_paused = true)]
async fn a_wait_gives_the_slot_back_and_asks_for_it_again_after() {
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let (answer, answered) = tokio::sync::oneshot::channel::<u32>();
    let mut run = task::spawn(permit.run(answered));
    assert!(run.poll().is_pending());
    assert_eq!(used(&queue), 1, "held until the runtime has taken a turn");
    turn().await;
    assert_eq!(used(&queue), 0, "nothing woke it in a whole turn: a wait");

    // Someone else computes on the slot meanwhile.
    let other = admit_now(&queue, WorkInfo::new(TenantId::new(2), Priority::NORMAL));
    answer.send(7).unwrap();
    assert!(run.is_woken());
    assert!(
        run.poll().is_pending(),
        "the slot is taken: it asks and waits"
    );
    drop(other);
    assert!(run.is_woken(), "granted its slot again");
    assert!(matches!(run.poll(), Poll::Ready(Ok(Ok(7)))));
    assert_eq!(used(&queue), 0, "returned as the work completed");
    let normal = &queue.snapshot().priorities[0];
    assert_eq!(normal.resumed, 1, "the second admission counts as resumed");
}

#[tokio::test(start_paused = true)]
async fn a_timer_wait_gives_the_slot_back() {
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
    let mut run = task::spawn(permit.run(tokio::time::sleep(Duration::from_millis(5))));
    assert!(run.poll().is_pending());
    turn().await;
    assert_eq!(used(&queue), 0);
    tokio::time::advance(Duration::from_millis(5)).await;
    assert!(run.is_woken());
    assert!(matches!(run.poll(), Poll::Ready(Ok(()))));
    assert_eq!(used(&queue), 0);
}

#[tokio::test(start_paused = true)]
async fn asking_again_goes_ahead_of_newer_work_and_behind_higher_priority() {
    // One tenant: the order within a tenant is priority, then create time.
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, work(1, 0, t0, 0));
    let (resume, resumed) = tokio::sync::oneshot::channel::<()>();
    let mut run = task::spawn(permit.run(resumed));
    assert!(run.poll().is_pending());
    turn().await;
    assert_eq!(used(&queue), 0);

    // While it waits: newer work of its priority takes the slot, more newer
    // work queues, and so does work of a higher priority.
    let holder = admit_now(&queue, work(1, 0, t0, 5));
    let mut newer = enqueue(&queue, work(1, 0, t0, 10));
    let mut urgent = enqueue(&queue, work(1, 50, t0, 20));
    tokio::time::advance(Duration::from_millis(30)).await;
    resume.send(()).unwrap();
    assert!(run.poll().is_pending(), "the slot is held");

    drop(holder);
    let urgent = try_settle(&mut urgent).expect("granted").unwrap();
    assert!(run.poll().is_pending());
    drop(urgent);
    assert!(matches!(run.poll(), Poll::Ready(Ok(Ok(())))));
    let newer = try_settle(&mut newer).expect("granted last").unwrap();
    drop(newer);
    assert_eq!(used(&queue), 0);
}

#[tokio::test(start_paused = true)]
async fn work_dropped_while_it_waits_or_asks_again_loses_nothing() {
    let queue = WorkQueue::new(1).unwrap();
    let run_work = || {
        let permit = admit_now(&queue, WorkInfo::new(TenantId::new(1), Priority::NORMAL));
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        (task::spawn(permit.run(answered)), answer)
    };

    // Dropped holding its slot.
    let (mut run, _answer) = run_work();
    assert!(run.poll().is_pending());
    drop(run);
    assert_eq!(used(&queue), 0);

    // Dropped while the slot is given back.
    let (mut run, _answer) = run_work();
    assert!(run.poll().is_pending());
    turn().await;
    assert_eq!(used(&queue), 0);
    drop(run);
    turn().await;
    assert_eq!(used(&queue), 0);

    // Dropped while it asks for the slot again.
    let (mut run, answer) = run_work();
    assert!(run.poll().is_pending());
    turn().await;
    let holder = admit_now(&queue, WorkInfo::new(TenantId::new(2), Priority::NORMAL));
    answer.send(()).unwrap();
    assert!(run.poll().is_pending());
    assert_eq!(queue.snapshot().waiting, 1);
    drop(run);
    assert_eq!(queue.snapshot().waiting, 0, "it left the queue");
    drop(holder);
    assert_eq!(used(&queue), 0);
    let _ = admit_now(&queue, WorkInfo::new(TenantId::new(3), Priority::NORMAL));
}

#[tokio::test(start_paused = true)]
async fn refused_when_asking_again_drops_the_work_where_it_waited() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let deadline = WorkInfo::builder()
        .tenant(TenantId::new(1))
        .create_time(t0)
        .timeout(Duration::from_millis(10))
        .build();
    let permit = admit_now(&queue, deadline);
    let dropped = Arc::new(AtomicBool::new(false));
    let (resume, resumed) = tokio::sync::oneshot::channel::<()>();
    let flag = DropFlag(dropped.clone());
    let mut run = task::spawn(permit.run(async move {
        let _flag = flag;
        let _ = resumed.await;
        "finished"
    }));
    assert!(run.poll().is_pending());
    turn().await;
    let holder = admit_now(&queue, WorkInfo::new(TenantId::new(2), Priority::NORMAL));
    resume.send(()).unwrap();
    assert!(
        run.poll().is_pending(),
        "asks again and waits for the holder"
    );
    tokio::time::advance(Duration::from_millis(10)).await;
    assert!(matches!(
        run.poll(),
        Poll::Ready(Err(AdmitError::DeadlineExceeded { .. }))
    ));
    assert!(dropped.load(Ordering::SeqCst), "the work was dropped");
    drop(holder);
    assert_eq!(used(&queue), 0);
    assert_eq!(queue.snapshot().waiting, 0);
}

/// A yield is not a preemption point, even for waiting work of a higher
/// priority: preempted there, admitted work would be abandoned half done
/// whenever more important work queues. `give_way` is the explicit one.
#[tokio::test(start_paused = true)]
async fn a_yield_keeps_the_slot_when_higher_priority_work_waits() {
    let t0 = Instant::now();
    let queue = WorkQueue::new(1).unwrap();
    let permit = admit_now(&queue, work(1, -50, t0, 0));
    let mut bulk = task::spawn(permit.run(yields(2)));
    assert!(bulk.poll().is_pending());
    let mut urgent = enqueue(&queue, work(1, 50, t0, 2));
    turn().await;
    assert!(try_settle(&mut urgent).is_none());
    assert!(bulk.poll().is_pending());
    turn().await;
    assert!(try_settle(&mut urgent).is_none());
    assert!(matches!(bulk.poll(), Poll::Ready(Ok(()))));
    assert!(try_settle(&mut urgent).expect("granted").is_ok());
}

#[test]
fn outside_a_runtime_nothing_is_given_back() {
    let queue = WorkQueue::new(1).unwrap();
    let permit =
        futures::executor::block_on(queue.admit(WorkInfo::new(TenantId::new(1), Priority::NORMAL)))
            .unwrap();
    let (answer, answered) = std::sync::mpsc::channel::<()>();
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    let observer = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            // The run is waiting on `rx` by now, off any runtime.
            answered.recv().unwrap();
            let held = queue.granter_snapshot().used;
            tx.send(()).unwrap();
            held
        })
    };
    futures::executor::block_on(permit.run(async {
        answer.send(()).unwrap();
        rx.await.unwrap();
    }))
    .unwrap();
    assert_eq!(observer.join().unwrap(), 1, "held through the wait");
    assert_eq!(used(&queue), 0);
}

/// Waits until [`Gates::open`] wakes it, then records its name.
struct Gated {
    name: &'static str,
    gates: Arc<Gates>,
    registered: bool,
}

#[derive(Default)]
struct Gates {
    wakers: std::sync::Mutex<Vec<std::task::Waker>>,
    computed: std::sync::Mutex<Vec<&'static str>>,
}

impl Gates {
    fn gated(self: &Arc<Self>, name: &'static str) -> Gated {
        Gated {
            name,
            gates: self.clone(),
            registered: false,
        }
    }

    /// Wakes every gated future, in the order they first waited.
    fn open(&self) {
        for waker in self.wakers.lock().unwrap().drain(..) {
            waker.wake();
        }
    }

    fn computed(&self) -> Vec<&'static str> {
        self.computed.lock().unwrap().clone()
    }
}

impl Future for Gated {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.registered {
            self.gates.computed.lock().unwrap().push(self.name);
            return Poll::Ready(());
        }
        self.registered = true;
        self.gates.wakers.lock().unwrap().push(cx.waker().clone());
        Poll::Pending
    }
}

/// Two held runs, admitted and spawned in this order, that wait at their
/// gates without their slots and are then woken in the same (FIFO) order:
/// the order in which they computed.
async fn computed_order(
    first: (&'static str, i8),
    second: (&'static str, i8),
) -> Vec<&'static str> {
    let t0 = Instant::now();
    let queue = WorkQueue::new(2).unwrap();
    let gates = Arc::new(Gates::default());
    let runs: Vec<_> = [first, second]
        .into_iter()
        .enumerate()
        .map(|(at, (name, priority))| {
            let at = at as u64;
            let admitted = admit_now(&queue, work(at + 1, priority, t0, at));
            tokio::spawn(admitted.run(gates.gated(name)))
        })
        .collect();
    turn().await;
    turn().await;
    assert_eq!(used(&queue), 0, "both wait without their slots");
    gates.open();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    assert_eq!(used(&queue), 0);
    gates.computed()
}

/// Tokio's run queue is FIFO: held bulk work woken first would compute
/// first. It steps aside for held work of a higher priority that is
/// runnable too, so the high work computes first.
#[tokio::test(start_paused = true)]
async fn held_work_steps_aside_for_runnable_work_of_a_higher_priority() {
    let order = computed_order(("bulk", -50), ("urgent", 50)).await;
    assert_eq!(order, ["urgent", "bulk"]);
}

/// Two holds of one priority are not reordered: they compute in the run
/// queue's order.
#[tokio::test(start_paused = true)]
async fn held_work_of_one_priority_computes_in_the_run_queues_order() {
    let order = computed_order(("first", 0), ("second", 0)).await;
    assert_eq!(order, ["first", "second"]);
}

/// A held run of `priority` admitted on `queue` now, its task polled by
/// hand.
fn run_now<F: Future>(
    queue: &WorkQueue,
    (tenant, priority, created_ms): (u64, i8, u64),
    body: F,
) -> task::Spawn<admission::Run<F>> {
    let admitted = admit_now(queue, work(tenant, priority, Instant::now(), created_ms));
    task::spawn(admitted.run(body))
}

/// Higher-priority work that is runnable but never polled (its task is
/// stuck, or gone without dropping it) holds lower work back for a few
/// polls only; dropping it stops it holding anything back.
#[tokio::test(start_paused = true)]
async fn stepping_aside_is_bounded_and_ends_with_the_higher_work() {
    let queue = WorkQueue::new(2).unwrap();
    let gates = Arc::new(Gates::default());
    let mut urgent = run_now(&queue, (2, 50, 0), gates.gated("urgent"));
    assert!(urgent.poll().is_pending());
    gates.open();
    assert!(urgent.is_woken(), "runnable, and never polled again");

    let mut bulk = run_now(&queue, (1, -50, 1), async {});
    let mut polls = 1;
    while bulk.poll().is_pending() {
        assert!(polls < 10, "bulk work is not held back for good");
        polls += 1;
        turn().await;
    }
    assert!(polls > 1, "it stepped aside at first");

    drop(urgent);
    let mut bulk = run_now(&queue, (1, -50, 2), async {});
    assert!(
        matches!(bulk.poll(), Poll::Ready(Ok(()))),
        "nothing is runnable above it once the urgent work is dropped"
    );
    assert_eq!(used(&queue), 0);
}

/// Waiting work of a higher priority does not hold lower work back: a
/// holder of something the higher work waits for (a lock) must run.
#[tokio::test(start_paused = true)]
async fn waiting_work_of_a_higher_priority_holds_nothing_back() {
    let queue = WorkQueue::new(2).unwrap();
    let gates = Arc::new(Gates::default());
    let mut urgent = run_now(&queue, (2, 50, 0), gates.gated("urgent"));
    assert!(urgent.poll().is_pending());
    let mut bulk = run_now(&queue, (1, -50, 1), async {});
    assert!(matches!(bulk.poll(), Poll::Ready(Ok(()))));
}
