//! Settings of a [`CpuPool`], validated once by `build`.

use std::time::Duration;

use super::worker::PoolShared;
use super::CpuPool;
use crate::error::ConfigError;
use crate::queue::WorkQueueBuilder;
use crate::sync::{StdArc, StdMutex};

/// Settings for a [`CpuPool`], validated by [`build`](Self::build).
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct CpuPoolBuilder {
    threads: Option<usize>,
    max_borrowed: usize,
    thread_name: String,
    spin_before_wait: Duration,
    /// `None`: chosen at `build` from the cores (see `collect_grants`).
    collect_grants: Option<bool>,
    queue: WorkQueueBuilder,
}

impl Default for CpuPoolBuilder {
    fn default() -> Self {
        CpuPoolBuilder {
            threads: None,
            max_borrowed: Self::DEFAULT_MAX_BORROWED,
            thread_name: Self::DEFAULT_THREAD_NAME.to_owned(),
            spin_before_wait: Duration::ZERO,
            collect_grants: None,
            // The overload policies a CPU controller's queue starts from:
            // a pool's queue sees the same traffic (requests with
            // deadlines, bulk beside interactive work).
            queue: crate::cpu::ControllerBuilder::default_queue().name("cpu_pool"),
        }
    }
}

impl CpuPoolBuilder {
    /// The most threads a pool may have.
    pub(crate) const MAX_THREADS: usize = 4096;
    /// Default bound on threads borrowed for bypass work at once.
    pub(crate) const DEFAULT_MAX_BORROWED: usize = 1;
    /// Default name of the pool's threads (borrowed ones add `-borrowed`).
    pub(crate) const DEFAULT_THREAD_NAME: &'static str = "admission-pool";
    /// The longest [`spin_before_wait`](Self::spin_before_wait) accepted.
    pub(crate) const MAX_SPIN_BEFORE_WAIT: Duration = Duration::from_millis(10);

    /// The pool's threads, which are also its slot total (default: the
    /// available parallelism, as `std::thread::available_parallelism`
    /// reports it, or 1 where it cannot tell). Between 1 and
    /// 4,096. See the
    /// [module documentation](super#sharing-the-cores-with-tokio) for how
    /// to size it next to the runtime's workers.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// The most threads bypass work may borrow at once beyond the total
    /// (default 1): bypass
    /// work that finds every pool thread taken runs on a thread spawned for
    /// it, up to this many at a time, and otherwise waits for the next pool
    /// thread (still ahead of the queue). 0 borrows none. At most
    /// 4,096.
    pub fn max_borrowed(mut self, max: usize) -> Self {
        self.max_borrowed = max;
        self
    }

    /// The name of the pool's threads (default
    /// `"admission-pool"`); each gets its
    /// index appended. Must not contain a NUL byte.
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// How long a thread that finds no job polls for the next one before
    /// it sleeps (default zero: it sleeps at once). At most
    /// 10 ms.
    ///
    /// Unless [`collect_grants`](Self::collect_grants) is on, each job
    /// reaches a thread after the caller's task was woken and polled on a
    /// tokio worker; a thread asleep meanwhile then has to be woken too, and on a virtual machine each wake-up costs tens of
    /// microseconds of a 500 µs job. Spinning saves the second wake-up at
    /// the price of a core kept busy, so it pays only where the pool's
    /// threads have cores of their own (threads + tokio workers ≤ cores):
    /// in the overload suite's W2-pool-split (one worker and one pool
    /// thread on two cores, W2 at 3x with handlers that never yield)
    /// 100 µs raised goodput from 91.2% and 91.3% of C to 94.2% and 94.8%;
    /// in W2-pool (two threads beside two workers on the same two cores) it
    /// lowered it from 78.0% and 80.4% to 76.8% and 74.7%, as the spinning
    /// threads kept the workers that dispatch their jobs off the cores.
    pub fn spin_before_wait(mut self, spin: Duration) -> Self {
        self.spin_before_wait = spin;
        self
    }

    /// Whether a thread whose closure returned collects the grant its slot
    /// made, and so starts the next job itself (default: chosen by
    /// [`build`](Self::build), below).
    ///
    /// A returned slot is granted to the next waiter at once, under the
    /// queue's lock. Off, that grant wakes the waiter's task, which must be
    /// polled on a tokio worker before its closure reaches a thread: a
    /// worker wake-up (tens of microseconds on a virtual machine) per job,
    /// during which the thread has no work. On, the thread takes the
    /// granted job itself, on the spot: no worker takes part until the
    /// result is sent, and the task is not woken at all in between.
    ///
    /// It pays where the pool's threads have cores of their own (threads +
    /// tokio workers ≤ cores): the threads then run back to back. In the
    /// overload suite's W2-pool-split (one worker and one pool thread on
    /// two cores, W2 at 3x with handlers that never yield; four runs, the
    /// two modes side by side in each) goodput rose from 81.4–86.6% of C to
    /// 90.1–97.8%, the high class served within its SLO from 98.2–99.2%
    /// to 98.4–99.8%, its p99 from 1.10–1.21x its value alone to 1.03–1.18x.
    ///
    /// Where the threads share the workers' cores, it trades the high
    /// class's tail for goodput: in W2-pool (two threads beside
    /// two workers on two cores; four runs) goodput rose from 66.7–72.2% to
    /// 69.6–76.5%, but the high class within its SLO fell from 97.8–99.3%
    /// to 96.8–98.5% and its p99 rose from 1.10–1.16x to 1.22–1.42x alone.
    /// Threads that never stop between jobs keep the workers off the cores,
    /// and a high-priority request reaches the queue only once a worker has
    /// taken it in: meanwhile the grant goes to work already waiting.
    ///
    /// So unless this is called, [`build`](Self::build) chooses by the
    /// same rule: on when the pool is built inside a tokio runtime and its
    /// threads plus that runtime's workers fit in the available cores
    /// (`std::thread::available_parallelism`), off otherwise, which
    /// includes the default pool (a thread per core) beside the default
    /// runtime (a worker per core), and a pool built outside any runtime,
    /// whose workers it cannot count. [`PoolSnapshot::collects_grants`](super::PoolSnapshot::collects_grants)
    /// says what was chosen.
    pub fn collect_grants(mut self, on: bool) -> Self {
        self.collect_grants = Some(on);
        self
    }

    /// The settings of the pool's admission queue: waiter bound, deadlines
    /// policies (early rejection, epoch-LIFO), elastic share, usage and
    /// tenant table (default: those of
    /// [`ControllerBuilder::default_queue`](crate::cpu::ControllerBuilder::default_queue),
    /// early rejection, epoch-LIFO from the requests' deadlines,
    /// [`Usage::Granted`](crate::Usage::Granted), an elastic share of 0.5
    /// and newcomers behind, named `cpu_pool` for metrics). Its slot total is ignored: the
    /// pool's is its thread count.
    pub fn queue(mut self, queue: WorkQueueBuilder) -> Self {
        self.queue = queue;
        self
    }

    /// Validates the settings, builds the queue and starts the threads.
    /// A [`ConfigError`] names the field at fault; `threads` also when the
    /// OS refuses to start a thread (those started are joined first).
    ///
    /// Called inside a tokio runtime, it also counts that runtime's workers
    /// to choose [`collect_grants`](Self::collect_grants) when it was not
    /// set.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first setting out of its range (`threads`,
    /// `max_borrowed`, `spin_before_wait`, `thread_name`, the queue's
    /// settings), or `threads` if the OS refuses to start a thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::pool::CpuPool;
    ///
    /// let pool = CpuPool::builder().threads(2).build()?;
    /// assert_eq!(pool.threads(), 2);
    /// assert_eq!(pool.snapshot().queue.granter.total, 2);
    ///
    /// let err = CpuPool::builder().threads(0).build().unwrap_err();
    /// assert_eq!(err.field(), "threads");
    /// # Ok::<(), admission::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<CpuPool, ConfigError> {
        let threads = match self.threads {
            Some(threads) => threads,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if threads == 0 || threads > Self::MAX_THREADS {
            return Err(ConfigError::out_of_range(
                "threads",
                threads,
                1,
                Self::MAX_THREADS,
            ));
        }
        if self.max_borrowed > Self::MAX_THREADS {
            return Err(ConfigError::out_of_range(
                "max_borrowed",
                self.max_borrowed,
                0,
                Self::MAX_THREADS,
            ));
        }
        if self.spin_before_wait > Self::MAX_SPIN_BEFORE_WAIT {
            return Err(ConfigError::new(
                "spin_before_wait",
                format!(
                    "{:?} is above the accepted {:?}: a thread that finds no work should sleep",
                    self.spin_before_wait,
                    Self::MAX_SPIN_BEFORE_WAIT
                ),
            ));
        }
        if self.thread_name.contains('\0') {
            return Err(ConfigError::new(
                "thread_name",
                "contains a NUL byte, which no OS thread name may hold",
            ));
        }
        let collect_grants = self.collect_grants.unwrap_or_else(|| {
            let workers = tokio::runtime::Handle::try_current()
                .ok()
                .map(|runtime| runtime.metrics().num_workers());
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let collect = threads_have_cores(threads, workers, cores);
            tracing::debug!(
                target: "admission",
                threads,
                runtime_workers = workers,
                cores,
                collect,
                "CPU pool: collect_grants chosen from the cores"
            );
            collect
        });
        let queue = self.queue.total_slots(threads as u64).build()?;
        let (shared, receiver) = PoolShared::new(
            queue,
            threads,
            self.max_borrowed,
            self.thread_name,
            self.spin_before_wait,
            collect_grants,
        );
        let receiver = StdArc::new(StdMutex::new(receiver));
        let pool = CpuPool {
            shared: shared.clone(),
            threads: StdMutex::new(Vec::with_capacity(threads)),
        };
        for index in 0..threads {
            let (shared, receiver) = (shared.clone(), receiver.clone());
            let started = std::thread::Builder::new()
                .name(format!("{}-{index}", shared.thread_name()))
                .spawn(move || shared.thread_loop(receiver));
            match started {
                Ok(thread) => pool
                    .threads
                    .lock()
                    .unwrap_or_else(crate::sync::recover)
                    .push(thread),
                Err(error) => {
                    // Dropping the pool closes it and joins those started.
                    drop(pool);
                    return Err(ConfigError::new(
                        "threads",
                        format!(
                            "the OS refused to start pool thread {index} of {threads}: {error}"
                        ),
                    ));
                }
            }
        }
        Ok(pool)
    }
}

/// Whether a pool of `threads` threads beside a runtime of `workers`
/// workers (`None`: not known) has cores of its own among `cores`: the
/// case in which collecting grants was measured to pay (see
/// [`CpuPoolBuilder::collect_grants`]).
pub(super) fn threads_have_cores(threads: usize, workers: Option<usize>, cores: usize) -> bool {
    workers
        .and_then(|workers| threads.checked_add(workers))
        .is_some_and(|both| both <= cores)
}

#[cfg(test)]
mod tests {
    use super::threads_have_cores;

    #[test]
    fn threads_have_cores_only_when_both_sides_fit_and_the_workers_are_known() {
        // threads, runtime workers, cores: have they cores of their own?
        let table = [
            (1, Some(1), 2, true),
            (4, Some(4), 8, true),
            (7, Some(1), 8, true),
            (2, Some(2), 2, false), // the default pool beside the default runtime
            (8, Some(8), 8, false),
            (1, Some(2), 2, false),
            (1, None, 64, false), // built outside a runtime: not known
            (usize::MAX, Some(1), usize::MAX, false),
        ];
        for (threads, workers, cores, expected) in table {
            assert_eq!(
                threads_have_cores(threads, workers, cores),
                expected,
                "{threads} threads, {workers:?} workers, {cores} cores"
            );
        }
    }
}
