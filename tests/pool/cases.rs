// The cases of `tests/pool.rs`, included once per hand-off mode
// (`COLLECT_GRANTS`, defined by the including module).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::pool::{CpuPool, CpuPoolBuilder, PoolError};
use admission::{AdmitError, Priority, TenantId, Usage, WorkInfo, WorkQueue};
use futures::poll;

/// The documented bounds of the pool's settings.
const MAX_THREADS: usize = 4096;
const MAX_SPIN_BEFORE_WAIT: Duration = Duration::from_millis(10);

/// A closure's start signal and the gate it waits at.
struct Gate {
    started: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

impl Gate {
    /// Blocks until the closure has started on a thread.
    fn wait_started(&self) {
        self.started.recv().expect("the closure never started");
    }

    /// Lets the closure return.
    fn open(&self) {
        self.release.send(()).expect("the closure is gone");
    }
}

/// A closure that reports its start, waits at its gate, then returns `value`.
fn gated<T: Send + 'static>(value: T) -> (impl FnOnce() -> T + Send + 'static, Gate) {
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let closure = move || {
        let _ = started_tx.send(());
        let _ = release_rx.recv();
        value
    };
    (closure, Gate { started, release })
}

fn work(tenant: u64, priority: Priority) -> WorkInfo {
    WorkInfo::new(TenantId::new(tenant), priority)
}

/// A pool builder in the hand-off mode of the enclosing module.
fn builder() -> CpuPoolBuilder {
    CpuPool::builder().collect_grants(COLLECT_GRANTS)
}

fn pool(threads: usize) -> CpuPool {
    builder().threads(threads).build().unwrap()
}

/// Occupies one pool thread with a gated closure and waits until it runs.
async fn occupy(
    pool: &CpuPool,
    tenant: u64,
) -> (std::pin::Pin<Box<admission::pool::PoolTask<&'static str>>>, Gate) {
    let (closure, gate) = gated("blocker");
    let mut task = Box::pin(pool.spawn(work(tenant, Priority::NORMAL), closure));
    assert!(poll!(&mut task).is_pending());
    gate.wait_started();
    (task, gate)
}

#[tokio::test]
async fn a_closure_runs_on_a_named_pool_thread_and_returns_its_value() {
    let pool = builder()
        .threads(2)
        .thread_name("parse")
        .build()
        .unwrap();
    let name = pool
        .spawn(work(1, Priority::NORMAL), || {
            std::thread::current().name().map(String::from)
        })
        .await
        .unwrap();
    assert!(name.is_some_and(|name| name.starts_with("parse-")));
    let snapshot = pool.snapshot();
    assert_eq!((snapshot.threads, snapshot.busy), (2, 0));
    assert_eq!((snapshot.completed, snapshot.panicked), (1, 0));
    assert_eq!(snapshot.queue.granter.used, 0);
}

#[tokio::test]
async fn waiting_work_starts_by_tenant_share_then_priority_then_arrival() {
    // Counting grants until a reset an hour away: the order below cannot
    // be disturbed by a reset however slow the machine.
    let pool = builder()
        .threads(1)
        .queue(
            WorkQueue::builder()
                .usage(Usage::Granted)
                .reset_period(Duration::from_secs(3600)),
        )
        .build()
        .unwrap();
    let (blocker, gate) = occupy(&pool, 1).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let record = |name: &'static str| {
        let order = order.clone();
        move || order.lock().unwrap().push(name)
    };
    // Arrival order: tenant 1's normal work first, then its high work,
    // then tenant 2's low work.
    let mut tasks = Vec::new();
    for (name, tenant, priority) in [
        ("t1-normal", 1, Priority::NORMAL),
        ("t1-high-first", 1, Priority::USER_HIGH),
        ("t1-high-second", 1, Priority::USER_HIGH),
        ("t2-low", 2, Priority::USER_LOW),
    ] {
        let mut task = Box::pin(pool.spawn(work(tenant, priority), record(name)));
        assert!(poll!(&mut task).is_pending(), "{name} should wait");
        tasks.push(task);
    }
    assert_eq!(pool.snapshot().queued, 4);
    gate.open();
    assert_eq!(blocker.await, Ok("blocker"));
    for result in futures::future::join_all(tasks).await {
        result.unwrap();
    }
    // Tenant 2 has been granted nothing, tenant 1 the blocker: tenant 2
    // first, whatever its priority; then tenant 1's work by priority, and
    // arrival within a priority.
    assert_eq!(
        *order.lock().unwrap(),
        ["t2-low", "t1-high-first", "t1-high-second", "t1-normal"]
    );
}

#[tokio::test]
async fn the_snapshot_counts_busy_threads_and_queued_work_exactly() {
    let pool = pool(2);
    let (first, first_gate) = occupy(&pool, 1).await;
    let (second, second_gate) = occupy(&pool, 1).await;
    let mut queued = Vec::new();
    for _ in 0..3 {
        let mut task = Box::pin(pool.spawn(work(1, Priority::NORMAL), || ()));
        assert!(poll!(&mut task).is_pending());
        queued.push(task);
    }
    let snapshot = pool.snapshot();
    assert_eq!(
        (snapshot.busy, snapshot.queued, snapshot.dispatched),
        (2, 3, 0)
    );
    assert_eq!(snapshot.queue.granter.used, 2);
    first_gate.open();
    second_gate.open();
    assert!(first.await.is_ok() && second.await.is_ok());
    for result in futures::future::join_all(queued).await {
        result.unwrap();
    }
    let snapshot = pool.snapshot();
    assert_eq!((snapshot.busy, snapshot.queued), (0, 0));
    assert_eq!(snapshot.completed, 5);
}

#[tokio::test]
async fn a_task_dropped_while_it_waits_never_runs_and_loses_no_slot() {
    let pool = pool(1);
    let (blocker, gate) = occupy(&pool, 1).await;
    let ran = Arc::new(AtomicBool::new(false));
    let mut dropped = Box::pin(pool.spawn(work(1, Priority::USER_HIGH), {
        let ran = ran.clone();
        move || ran.store(true, Ordering::SeqCst)
    }));
    assert!(poll!(&mut dropped).is_pending());
    drop(dropped);
    assert_eq!(pool.snapshot().queued, 0);
    gate.open();
    assert!(blocker.await.is_ok());
    // The slot the dropped task would have had is free: the next work runs.
    assert_eq!(pool.spawn(work(1, Priority::NORMAL), || 7).await, Ok(7));
    pool.close();
    assert!(!ran.load(Ordering::SeqCst), "a dropped task's closure ran");
    let snapshot = pool.snapshot();
    assert_eq!(snapshot.queue.granter.used, 0);
    assert_eq!(snapshot.abandoned, 0, "it never reached a thread");
}

#[tokio::test]
async fn admitted_work_dropped_before_a_thread_takes_it_never_runs() {
    // No borrowing: bypass work is admitted at once but has to wait in the
    // hand-off for the one pool thread.
    let pool = builder()
        .threads(1)
        .max_borrowed(0)
        .build()
        .unwrap();
    let (blocker, gate) = occupy(&pool, 1).await;
    let ran = Arc::new(AtomicBool::new(false));
    let bypass = WorkInfo::builder().bypass(true).build();
    let mut dispatched = Box::pin(pool.spawn(bypass, {
        let ran = ran.clone();
        move || ran.store(true, Ordering::SeqCst)
    }));
    assert!(poll!(&mut dispatched).is_pending());
    assert_eq!(pool.snapshot().dispatched, 1);
    drop(dispatched);
    gate.open();
    assert!(blocker.await.is_ok());
    pool.close();
    assert!(!ran.load(Ordering::SeqCst), "a dropped task's closure ran");
    let snapshot = pool.snapshot();
    assert_eq!((snapshot.abandoned, snapshot.completed), (1, 1));
    assert_eq!(snapshot.queue.granter.used, 0);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_passes_before_the_start_refuses_the_work() {
    let pool = pool(1);
    let (blocker, gate) = occupy(&pool, 1).await;
    let ran = Arc::new(AtomicBool::new(false));
    let flag = |ran: &Arc<AtomicBool>| {
        let ran = ran.clone();
        move || ran.store(true, Ordering::SeqCst)
    };

    let late = WorkInfo::builder()
        .deadline(tokio::time::Instant::now())
        .build();
    assert_eq!(
        pool.spawn(late, flag(&ran)).await,
        Err(PoolError::Admit(AdmitError::DeadlinePassed))
    );

    let timed = WorkInfo::builder()
        .timeout(Duration::from_millis(10))
        .build();
    let mut waiting = Box::pin(pool.spawn(timed, flag(&ran)));
    assert!(poll!(&mut waiting).is_pending());
    tokio::time::advance(Duration::from_millis(11)).await;
    match waiting.await {
        Err(PoolError::Admit(AdmitError::DeadlineExceeded { .. })) => {}
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    gate.open();
    assert!(blocker.await.is_ok());
    pool.close();
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(pool.snapshot().queue.granter.used, 0);
}

#[tokio::test]
async fn a_panic_comes_back_as_an_error_and_the_thread_takes_the_next_job() {
    let pool = pool(1);
    let thread_of = || std::thread::current().id();
    let before = pool.spawn(work(1, Priority::NORMAL), thread_of).await;
    let panicked = pool
        .spawn(work(1, Priority::NORMAL), || -> u32 {
            panic!("boom in a closure")
        })
        .await;
    match panicked {
        Err(PoolError::Panicked { message }) => assert_eq!(message, "boom in a closure"),
        other => panic!("expected Panicked, got {other:?}"),
    }
    let after = pool.spawn(work(1, Priority::NORMAL), thread_of).await;
    assert_eq!(before.unwrap(), after.unwrap(), "the thread was replaced");
    let snapshot = pool.snapshot();
    assert_eq!((snapshot.completed, snapshot.panicked), (2, 1));
    assert_eq!(snapshot.queue.granter.used, 0);
    assert!(snapshot.thread_health.is_healthy());
}

#[tokio::test]
async fn close_refuses_queued_work_lets_running_work_finish_and_joins() {
    let pool = Arc::new(pool(1));
    let (running, gate) = occupy(&pool, 1).await;
    let finished = Arc::new(AtomicBool::new(false));
    let mut queued = Box::pin(pool.spawn(work(1, Priority::USER_HIGH), || ()));
    assert!(poll!(&mut queued).is_pending());

    // close blocks until the running closure returns: call it elsewhere.
    let closer = std::thread::spawn({
        let (pool, finished) = (pool.clone(), finished.clone());
        move || {
            pool.close();
            finished.load(Ordering::SeqCst)
        }
    });
    assert_eq!(queued.await, Err(PoolError::Closed));
    assert_eq!(
        pool.spawn(work(1, Priority::NORMAL), || ()).await,
        Err(PoolError::Closed)
    );
    finished.store(true, Ordering::SeqCst);
    gate.open();
    assert!(
        closer.join().unwrap(),
        "close returned before the running closure did"
    );
    assert_eq!(running.await, Ok("blocker"));
    let snapshot = pool.snapshot();
    assert!(snapshot.closed);
    assert_eq!((snapshot.busy, snapshot.queue.granter.used), (0, 0));
}

#[tokio::test]
async fn threads_that_spin_before_waiting_run_every_job_and_close_joins_them() {
    let pool = builder()
        .threads(2)
        .spin_before_wait(MAX_SPIN_BEFORE_WAIT)
        .build()
        .unwrap();
    // One at a time (each thread spins after its job, and the next job
    // arrives while it does or after it slept), then a burst.
    for i in 0..20u64 {
        assert_eq!(
            pool.spawn(work(1, Priority::NORMAL), move || i * 2).await,
            Ok(i * 2)
        );
    }
    let burst: Vec<_> = (0..50u64)
        .map(|i| pool.spawn(work(i % 3, Priority::NORMAL), move || i))
        .collect();
    let results = futures::future::join_all(burst).await;
    assert_eq!(
        results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>()
    );
    // A thread spinning as the pool closes sees the closed channel, and
    // close joins it (this returns only once both threads are gone).
    pool.close();
    let snapshot = pool.snapshot();
    assert!(snapshot.closed);
    assert_eq!((snapshot.completed, snapshot.busy), (70, 0));
    assert_eq!(snapshot.queue.granter.used, 0);
}

/// Sends on its channel when dropped: at the end of the thread whose
/// thread-local it is.
struct OnThreadExit(mpsc::Sender<()>);

impl Drop for OnThreadExit {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

thread_local! {
    static EXIT: std::cell::RefCell<Option<OnThreadExit>> = const { std::cell::RefCell::new(None) };
}

#[tokio::test]
async fn dropping_the_pool_joins_every_thread() {
    let pool = pool(2);
    let (exited_tx, exited) = mpsc::channel();
    let (first, first_gate) = gated(());
    let (second, second_gate) = gated(());
    let mut tasks = Vec::new();
    for (closure, gate) in [(first, &first_gate), (second, &second_gate)] {
        let exited_tx = exited_tx.clone();
        let mut task = Box::pin(pool.spawn(work(1, Priority::NORMAL), move || {
            EXIT.with(|exit| *exit.borrow_mut() = Some(OnThreadExit(exited_tx)));
            closure()
        }));
        assert!(poll!(&mut task).is_pending());
        gate.wait_started();
        tasks.push(task);
    }
    // Both threads hold a thread-local that reports their exit.
    first_gate.open();
    second_gate.open();
    for task in tasks {
        task.await.unwrap();
    }
    drop(pool);
    // Joined threads have run their thread-local destructors.
    assert!(exited.try_recv().is_ok() && exited.try_recv().is_ok());
}

#[tokio::test]
async fn bypass_work_borrows_a_thread_while_every_pool_thread_is_taken() {
    let pool = pool(1);
    let (blocker, gate) = occupy(&pool, 1).await;
    let mut regular = Box::pin(pool.spawn(work(1, Priority::USER_HIGH), || "regular"));
    assert!(poll!(&mut regular).is_pending());

    let bypass = WorkInfo::builder().bypass(true).build();
    let name = pool
        .spawn(bypass, || std::thread::current().name().map(String::from))
        .await
        .unwrap();
    // It ran while the one pool thread was still held by the blocker.
    assert!(name.is_some_and(|name| name.ends_with("-borrowed")));
    assert!(poll!(&mut regular).is_pending(), "regular work must wait");

    gate.open();
    assert!(blocker.await.is_ok());
    assert_eq!(regular.await, Ok("regular"));
    pool.close();
    let snapshot = pool.snapshot();
    assert_eq!((snapshot.borrowed, snapshot.completed), (0, 3));
    assert_eq!(snapshot.queue.granter.used, 0);
}

#[tokio::test]
async fn queue_limits_refuse_with_the_queue_s_typed_errors() {
    let pool = builder()
        .threads(1)
        .queue(WorkQueue::builder().max_waiters(1))
        .build()
        .unwrap();
    let too_big = WorkInfo::builder().requested(2).build();
    assert_eq!(
        pool.spawn(too_big, || ()).await,
        Err(PoolError::Admit(AdmitError::NeverFits {
            requested: 2,
            capacity: 1
        }))
    );
    let (blocker, gate) = occupy(&pool, 1).await;
    let mut waiting = Box::pin(pool.spawn(work(1, Priority::NORMAL), || ()));
    assert!(poll!(&mut waiting).is_pending());
    let refused = pool.spawn(work(1, Priority::NORMAL), || ()).await;
    assert_eq!(
        refused,
        Err(PoolError::Admit(AdmitError::QueueFull { max_waiters: 1 }))
    );
    assert_eq!(refused.unwrap_err().reason(), "queue_full");
    gate.open();
    assert!(blocker.await.is_ok() && waiting.await.is_ok());
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let field = |builder: CpuPoolBuilder| builder.build().unwrap_err().field();
    assert_eq!(field(builder().threads(0)), "threads");
    assert_eq!(
        field(builder().threads(MAX_THREADS + 1)),
        "threads"
    );
    assert_eq!(
        field(builder().max_borrowed(MAX_THREADS + 1)),
        "max_borrowed"
    );
    assert_eq!(
        field(builder().thread_name("pool\0name")),
        "thread_name"
    );
    assert_eq!(
        field(
            builder()
                .spin_before_wait(MAX_SPIN_BEFORE_WAIT + Duration::from_nanos(1))
        ),
        "spin_before_wait"
    );
    assert_eq!(
        field(
            builder()
                .threads(1)
                .queue(WorkQueue::builder().max_waiters(0))
        ),
        "max_waiters"
    );
    let default = builder().build().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(default.threads(), cores);
}

#[tokio::test]
async fn a_granted_job_reaches_a_thread_as_the_hand_off_mode_says() {
    let pool = pool(1);
    let (blocker, gate) = occupy(&pool, 1).await;
    let (closure, next_gate) = gated("next");
    let mut next = Box::pin(pool.spawn(work(2, Priority::NORMAL), closure));
    assert!(poll!(&mut next).is_pending());
    gate.open();
    assert_eq!(blocker.await.unwrap(), "blocker");
    if COLLECT_GRANTS {
        // The thread whose slot made the grant took the job itself: it
        // starts though its task has not been polled since it queued.
        next_gate.wait_started();
        assert_eq!(pool.snapshot().busy, 1);
    } else {
        // The grant waits for the task: nothing runs until it is polled.
        let snapshot = pool.snapshot();
        assert_eq!((snapshot.busy, snapshot.dispatched), (0, 0));
        assert!(poll!(&mut next).is_pending());
        next_gate.wait_started();
    }
    next_gate.open();
    assert_eq!(next.await.unwrap(), "next");
    assert_eq!(pool.snapshot().queue.granter.used, 0);
}
