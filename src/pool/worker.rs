//! The pool's threads and the hand-off from admission to them.
//!
//! # Implementation notes
//!
//! **Structure.** [`PoolShared`] holds the pool's [`WorkQueue`] and one
//! leaf lock, [`Dispatch`]: the sending end of the jobs channel (`None`
//! once closed), the counters behind the exact signal, and the handles of
//! borrowed threads. The pool's own threads share the receiving end behind
//! a lock of its own: the thread holding it blocks in `recv`, the others
//! wait for the lock, so each job goes to exactly one thread.
//!
//! **Invariants.** `dispatched` counts jobs sent and not yet taken;
//! `busy` threads inside a closure (or about to enter one). Every job in
//! the channel holds a slot, so `dispatched + busy ≤ threads` apart from
//! bypass work, and the channel never holds a job for longer than it takes
//! a thread to come back from its last one.
//!
//! **Lock order.** The queue's lock is never taken while `Dispatch` is
//! held except to copy a snapshot after it was released; a thread drops
//! the permit (which takes the queue's lock and grants the next waiter)
//! before it takes `Dispatch` to count the job done. `Dispatch` is held
//! while a borrowed thread is spawned, so that `close` cannot miss its
//! handle; that is rare (bypass work with every thread taken) and bounded.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handoff::Dispatcher;
use super::task::PoolError;
use super::PoolSnapshot;
use crate::health::Boundary;
use crate::queue::{SlotPermit, WorkQueue};
use crate::sync::{mpsc, recover, StdArc, StdMutex};

/// The thread backstop's component name and fallback, for health records.
const THREAD: &str = "cpu_pool_thread";
const THREAD_ON_FAILURE: &str = "the job is lost, its slot returned; the thread takes the next job";

/// How a closure ended.
pub(super) enum Ran {
    Completed,
    Panicked,
}

/// A closure and the channel its result goes back on, with its type erased.
pub(super) trait Task: Send {
    /// Whether nobody waits for the result any more (the `PoolTask` was
    /// dropped): then the closure is not started.
    fn abandoned(&self) -> bool;

    /// Runs the closure, calls `settle` once it has returned or panicked
    /// (before the result is sent, so that a caller who has the result sees
    /// the pool's counters and the slot already settled), then sends it.
    fn run(self: Box<Self>, settle: &mut dyn FnMut(Ran));
}

/// An admitted job: the slot it holds and the work to run.
pub(super) struct Job {
    pub(super) permit: SlotPermit,
    pub(super) task: Box<dyn Task>,
}

/// The typed task behind `dyn Task`.
pub(super) struct Closure<F, T> {
    pub(super) f: F,
    pub(super) result: tokio::sync::oneshot::Sender<Result<T, PoolError>>,
}

impl<F, T> Task for Closure<F, T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    fn abandoned(&self) -> bool {
        self.result.is_closed()
    }

    fn run(self: Box<Self>, settle: &mut dyn FnMut(Ran)) {
        let Closure { f, result } = *self;
        let outcome = match catch_unwind(AssertUnwindSafe(f)) {
            Ok(value) => {
                settle(Ran::Completed);
                Ok(value)
            }
            Err(payload) => {
                let message = crate::health::panic_message(payload.as_ref());
                tracing::warn!(
                    target: "admission",
                    panic = %message,
                    "a CPU pool closure panicked; its caller gets PoolError::Panicked"
                );
                settle(Ran::Panicked);
                Err(PoolError::Panicked { message })
            }
        };
        // The caller may have gone since the closure started.
        let _ = result.send(outcome);
    }
}

/// Everything behind the dispatch lock.
#[derive(Default)]
struct Dispatch {
    /// `None` once the pool is closed: dropping it lets the threads drain
    /// the channel and end.
    sender: Option<mpsc::Sender<Job>>,
    dispatched: usize,
    busy: usize,
    borrowed: usize,
    completed: u64,
    panicked: u64,
    abandoned: u64,
    /// Handles of borrowed threads, finished ones pruned at each borrow.
    borrowed_threads: Vec<JoinHandle<()>>,
}

/// What the pool, its threads and its tasks share.
pub(crate) struct PoolShared {
    queue: WorkQueue,
    threads: usize,
    max_borrowed: usize,
    thread_name: String,
    /// How long a thread that finds no job polls for one before it sleeps.
    spin_before_wait: Duration,
    collect_grants: bool,
    dispatch: StdMutex<Dispatch>,
    backstop: Boundary,
}

impl PoolShared {
    /// The shared state and the receiving end for the pool's threads.
    pub(super) fn new(
        queue: WorkQueue,
        threads: usize,
        max_borrowed: usize,
        thread_name: String,
        spin_before_wait: Duration,
        collect_grants: bool,
    ) -> (StdArc<Self>, mpsc::Receiver<Job>) {
        let (sender, receiver) = mpsc::channel();
        let shared = PoolShared {
            queue,
            threads,
            max_borrowed,
            thread_name,
            spin_before_wait,
            collect_grants,
            dispatch: StdMutex::new(Dispatch {
                sender: Some(sender),
                ..Dispatch::default()
            }),
            backstop: Boundary::new(THREAD, THREAD_ON_FAILURE),
        };
        (StdArc::new(shared), receiver)
    }

    pub(super) fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    pub(super) fn threads(&self) -> usize {
        self.threads
    }

    pub(super) fn thread_name(&self) -> &str {
        &self.thread_name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Dispatch> {
        self.dispatch.lock().unwrap_or_else(recover)
    }

    /// Whether a thread whose returned slot made a grant collects it (see
    /// `CpuPoolBuilder::collect_grants`).
    pub(super) fn collects_grants(&self) -> bool {
        self.collect_grants
    }
}

impl Dispatcher for PoolShared {
    /// Hands an admitted job to a thread: a borrowed one for bypass work
    /// when every pool thread is taken (and fewer than `max_borrowed` are
    /// out), otherwise the channel. A closed pool drops the job: its slot
    /// goes back, and its caller sees [`PoolError::Closed`].
    ///
    /// A job is only ever dropped after the dispatch lock is released: its
    /// permit's drop grants the next waiter, whose `Handoff` may be
    /// collected and dispatched right there, on this thread.
    fn dispatch(self: &StdArc<Self>, job: Job, bypass: bool) {
        let mut dispatch = self.lock();
        if dispatch.sender.is_none() {
            drop(dispatch);
            drop(job);
            return;
        }
        // Borrowed threads count in `busy` while they run: the pool's own
        // threads are taken when those busy beside them, and the jobs
        // already waiting for them, leave none free.
        let own_busy = dispatch.busy.saturating_sub(dispatch.borrowed);
        let job = if bypass
            && own_busy + dispatch.dispatched >= self.threads
            && dispatch.borrowed < self.max_borrowed
        {
            match self.borrow_thread(&mut dispatch, job) {
                None => return,
                Some(job) => job,
            }
        } else {
            job
        };
        let unsent = match &dispatch.sender {
            Some(sender) => match sender.send(job) {
                Ok(()) => {
                    dispatch.dispatched += 1;
                    None
                }
                // Every thread is gone: nothing will ever take it.
                Err(mpsc::SendError(job)) => Some(job),
            },
            None => Some(job),
        };
        drop(dispatch);
        drop(unsent);
    }
}

impl PoolShared {
    /// Runs `job` on a thread spawned for it; the job back if no thread
    /// could be spawned.
    fn borrow_thread(self: &StdArc<Self>, dispatch: &mut Dispatch, job: Job) -> Option<Job> {
        // The job goes through a channel of its own, sent only once the
        // thread exists: a failed spawn drops the thread's closure, and the
        // job must not go with it.
        let (sender, receiver) = mpsc::channel::<Job>();
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-borrowed", self.thread_name))
            .spawn(move || {
                if let Ok(job) = receiver.recv() {
                    shared.run_guarded(job);
                }
                shared.lock().borrowed -= 1;
            });
        match spawned {
            Ok(thread) => {
                dispatch.borrowed += 1;
                dispatch.borrowed_threads.retain(|t| !t.is_finished());
                dispatch.borrowed_threads.push(thread);
                // The thread has not run yet: it holds the receiver.
                let _ = sender.send(job);
                tracing::debug!(
                    target: "admission",
                    borrowed = dispatch.borrowed,
                    "CPU pool: bypass work borrowed a thread beyond the total"
                );
                None
            }
            Err(error) => {
                tracing::warn!(
                    target: "admission",
                    %error,
                    "CPU pool: no thread could be borrowed for bypass work; it waits for a pool thread"
                );
                Some(job)
            }
        }
    }

    /// A pool thread's loop: takes jobs until the pool is closed and the
    /// channel drained.
    pub(super) fn thread_loop(self: StdArc<Self>, jobs: StdArc<StdMutex<mpsc::Receiver<Job>>>) {
        loop {
            let job = self.next_job(&jobs.lock().unwrap_or_else(recover));
            let Ok(job) = job else { return };
            {
                let mut dispatch = self.lock();
                dispatch.dispatched = dispatch.dispatched.saturating_sub(1);
            }
            self.run_guarded(job);
        }
    }

    /// The next job, or an error once the pool is closed and the channel
    /// drained. With a spin set, the channel is polled for that long before
    /// the thread sleeps in `recv` (see `CpuPoolBuilder::spin_before_wait`).
    fn next_job(&self, jobs: &mpsc::Receiver<Job>) -> Result<Job, mpsc::RecvError> {
        if !self.spin_before_wait.is_zero() {
            let started = Instant::now();
            loop {
                match jobs.try_recv() {
                    Ok(job) => return Ok(job),
                    Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
                    Err(mpsc::TryRecvError::Empty) => {}
                }
                if started.elapsed() >= self.spin_before_wait {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        jobs.recv()
    }

    /// Runs one job behind the thread's backstop.
    fn run_guarded(&self, job: Job) {
        self.backstop.backstop(|| self.run(job));
    }

    /// Runs one job: skipped if abandoned, else the closure, the permit
    /// returned, the counters settled, then the result sent.
    fn run(&self, job: Job) {
        let Job { permit, task } = job;
        {
            let mut dispatch = self.lock();
            if task.abandoned() {
                dispatch.abandoned += 1;
                drop(dispatch);
                drop(permit);
                drop(task);
                crate::export::pool_task(crate::export::POOL_ABANDONED);
                return;
            }
            dispatch.busy += 1;
        }
        let mut permit = Some(permit);
        task.run(&mut |ran| {
            // The slot goes to the next waiter before the result is sent.
            drop(permit.take());
            let mut dispatch = self.lock();
            dispatch.busy = dispatch.busy.saturating_sub(1);
            match ran {
                Ran::Completed => dispatch.completed += 1,
                Ran::Panicked => dispatch.panicked += 1,
            }
            drop(dispatch);
            crate::export::pool_task(match ran {
                Ran::Completed => crate::export::POOL_COMPLETED,
                Ran::Panicked => crate::export::POOL_PANICKED,
            });
        });
    }

    /// Closes the queue and the channel; the borrowed threads' handles, to
    /// join.
    pub(super) fn close(&self) -> Vec<JoinHandle<()>> {
        self.queue.close();
        let mut dispatch = self.lock();
        dispatch.sender = None;
        std::mem::take(&mut dispatch.borrowed_threads)
    }

    pub(super) fn is_closed(&self) -> bool {
        self.lock().sender.is_none()
    }

    pub(super) fn snapshot(&self) -> PoolSnapshot {
        let (busy, borrowed, dispatched, completed, panicked, abandoned, closed) = {
            let d = self.lock();
            (
                d.busy,
                d.borrowed,
                d.dispatched,
                d.completed,
                d.panicked,
                d.abandoned,
                d.sender.is_none(),
            )
        };
        let queue = self.queue.snapshot();
        PoolSnapshot {
            threads: self.threads,
            collects_grants: self.collects_grants(),
            busy,
            borrowed,
            dispatched,
            queued: queue.waiting,
            completed,
            panicked,
            abandoned,
            closed,
            queue,
            thread_health: self.backstop.health(),
        }
    }
}
