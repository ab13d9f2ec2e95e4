//! The device worker: one OS thread per device for blocking backend calls.
//!
//! # Implementation notes
//!
//! A stream synchronization spins or sleeps the calling thread until the
//! device has drained the stream, and the destroys of a teardown wait for
//! the device too. Run on a tokio worker, such a call stalls every task
//! scheduled there. So each device gets one dedicated thread, fed by a FIFO
//! channel of jobs; async code submits a job and awaits its result through a
//! `tokio::sync::oneshot`.
//!
//! * **FIFO order is a guarantee callers rely on.** The envelope destroys a
//!   forked stream by submitting a job when its execution context drops, and
//!   submits its own teardown later: the fork is therefore destroyed before
//!   the root, without any further coordination.
//! * **`depth`** counts jobs submitted and not yet finished: a cheap,
//!   lock-free measure of how busy the device's blocking side is, used to
//!   rank devices. A job leaves it when its work is done, *before* its
//!   result is sent (or when it is dropped unrun, or unwinds): a caller
//!   that has the result never sees its own job still counted, and ranks
//!   devices on what is really queued.
//! * **Shutdown** happens when the handle drops: the channel closes, the
//!   thread finishes the jobs already queued, and the handle joins it. A
//!   handle dropped on its own thread (a job holding the last reference)
//!   does not join itself.
//! * **A panicking job does not end the thread.** Each job runs behind a
//!   panic boundary (`gpu_device_worker`): the panic is logged and counted, and the thread
//!   goes on with the next job. A dead worker would read as a fault of
//!   unknown reach (nothing could ever run on the device again, and its
//!   clean-ups would be abandoned), which is far worse than one lost job.
//! * **A lost result is typed, never a hang.** [`DeviceWorker::submit`]
//!   resolves to [`JobError::Panicked`] when its job panicked, and to
//!   [`JobError::Gone`] when the thread could not be started or was shut
//!   down: the reply is sent by a guard that also answers when the job
//!   unwinds.

use std::fmt;
use std::future::Future;
use std::thread::{JoinHandle, ThreadId};

use tokio::sync::oneshot;

use crate::gpu::backend::DeviceOrdinal;
use crate::health::Boundary;
use crate::sync::{mpsc, Arc, AtomicU64, Mutex, Ordering, StdArc};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The device worker thread is gone (it exited or could not be started):
/// the job did not run, or its result was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WorkerGone {
    /// The worker's device.
    pub device: DeviceOrdinal,
}

impl fmt::Display for WorkerGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the worker thread of {} is gone", self.device)
    }
}

impl std::error::Error for WorkerGone {}

/// Why a job submitted with [`DeviceWorker::submit`] has no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobError {
    /// The worker thread is gone: the job did not run.
    Gone(WorkerGone),
    /// The job panicked on the worker thread. The panic was caught there
    /// and the thread serves the next job; what the job had done before it
    /// panicked is unknown.
    Panicked {
        /// The worker's device.
        device: DeviceOrdinal,
    },
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Gone(gone) => write!(f, "{gone}"),
            JobError::Panicked { device } => {
                write!(f, "a job on the worker thread of {device} panicked")
            }
        }
    }
}

impl std::error::Error for JobError {}

impl From<WorkerGone> for JobError {
    fn from(gone: WorkerGone) -> Self {
        JobError::Gone(gone)
    }
}

/// The sending half of a job's reply: answers `None` if dropped unsent,
/// which happens only when the job unwinds, so the waiting side learns
/// that the result is lost instead of waiting for it.
pub(crate) struct Reply<T> {
    sender: Option<oneshot::Sender<Option<T>>>,
}

impl<T> Reply<T> {
    /// A reply and the receiver it answers.
    pub(crate) fn channel() -> (Self, oneshot::Receiver<Option<T>>) {
        let (sender, receiver) = oneshot::channel();
        (
            Reply {
                sender: Some(sender),
            },
            receiver,
        )
    }

    /// Sends `value`; gives it back if the receiver is gone (always as
    /// `Some`: the option is the channel's, not the caller's).
    pub(crate) fn send(mut self, value: T) -> Result<(), Option<T>> {
        match self.sender.take() {
            Some(sender) => sender.send(Some(value)),
            None => Err(Some(value)),
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send(None);
        }
    }
}

/// A device's count of live streams, shared by its envelopes.
#[derive(Clone, Debug)]
pub(crate) struct StreamCounter(Arc<AtomicU64>);

impl StreamCounter {
    /// A stream was created.
    pub(crate) fn opened(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// A stream was destroyed. Saturating: a miscount must not wrap into
    /// a device that looks full forever.
    pub(crate) fn closed(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// One job in a worker's depth: leaves it when dropped.
struct Queued(Arc<AtomicU64>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One OS thread running a device's blocking backend calls in FIFO order.
/// See the [module documentation](self).
pub(crate) struct DeviceWorker {
    device: DeviceOrdinal,
    /// The boundary jobs run behind, also used by `submit` to record a
    /// panic before the waiting side hears of it.
    boundary: StdArc<Boundary>,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    depth: Arc<AtomicU64>,
    /// Streams the device's envelopes hold now: roots and forks, counted
    /// when created and when destroyed on this thread.
    streams: Arc<AtomicU64>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: Option<ThreadId>,
}

impl fmt::Debug for DeviceWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceWorker")
            .field("device", &self.device)
            .field("depth", &self.depth())
            .finish()
    }
}

impl DeviceWorker {
    /// Starts the worker thread of `device`. If the OS refuses a thread, the
    /// worker exists without one and every submission is [`WorkerGone`].
    /// Crate-private (tests and, with `gpu-tests`, the device checks): a
    /// device's worker is the service's, one per device.
    #[cfg(any(test, feature = "gpu-tests"))]
    #[cfg(test)]
    pub(crate) fn spawn(device: DeviceOrdinal) -> Self {
        Self::spawn_with(device, StdArc::new(crate::gpu::guard::worker_boundary()))
    }

    /// [`spawn`](Self::spawn), with the panic boundary each job runs behind
    /// (the service shares one among its workers).
    pub(crate) fn spawn_with(device: DeviceOrdinal, boundary: StdArc<Boundary>) -> Self {
        let (sender, receiver) = mpsc::channel::<Job>();
        let depth = Arc::new(AtomicU64::new(0));
        let spawned = std::thread::Builder::new()
            .name(format!("admission-{device}"))
            .spawn({
                let boundary = boundary.clone();
                move || {
                    while let Ok(job) = receiver.recv() {
                        // A panic is logged and counted by the boundary; the
                        // job's reply guard tells its waiter, and its
                        // `Queued` guard leaves the depth as it unwinds.
                        let _ = boundary.backstop(job);
                    }
                }
            });
        let (sender, thread) = match spawned {
            Ok(thread) => (Some(sender), Some(thread)),
            Err(error) => {
                tracing::error!(target: "admission", %device, %error, "cannot start a device worker thread");
                (None, None)
            }
        };
        Self {
            device,
            boundary,
            thread_id: thread.as_ref().map(|t| t.thread().id()),
            sender: Mutex::new(sender),
            depth,
            streams: Arc::new(AtomicU64::new(0)),
            thread: Mutex::new(thread),
        }
    }

    /// The device this worker serves.
    pub(crate) fn device(&self) -> DeviceOrdinal {
        self.device
    }

    /// Jobs submitted and not yet finished.
    pub(crate) fn depth(&self) -> u64 {
        self.depth.load(Ordering::Acquire)
    }

    /// Streams the device's envelopes hold now (roots and execution forks):
    /// the live stream load that device ranking reads.
    pub(crate) fn streams_in_use(&self) -> u64 {
        self.streams.load(Ordering::Acquire)
    }

    /// The counter behind [`streams_in_use`](Self::streams_in_use), for the
    /// envelope code that creates and destroys streams.
    pub(crate) fn stream_counter(&self) -> StreamCounter {
        StreamCounter(self.streams.clone())
    }

    /// Whether the calling thread is this worker's thread.
    pub(crate) fn is_current(&self) -> bool {
        self.thread_id == Some(std::thread::current().id())
    }

    /// Queues `job` without waiting for it. Fails if the thread is gone.
    pub(crate) fn submit_detached(
        &self,
        job: impl FnOnce() + Send + 'static,
    ) -> Result<(), WorkerGone> {
        self.queue(move |queued| {
            job();
            drop(queued);
        })
    }

    /// Queues `job`, counted in the depth until it drops the [`Queued`] it
    /// is given (when its work is done; also if it unwinds or is dropped
    /// unrun). Fails if the thread is gone.
    fn queue(&self, job: impl FnOnce(Queued) + Send + 'static) -> Result<(), WorkerGone> {
        let gone = WorkerGone {
            device: self.device,
        };
        let sender = self.sender.lock();
        let sender = sender.as_ref().ok_or(gone)?;
        self.depth.fetch_add(1, Ordering::AcqRel);
        let queued = Queued(self.depth.clone());
        // A failed send drops the job, and its `Queued` with it.
        sender.send(Box::new(move || job(queued))).map_err(|_| gone)
    }

    /// Queues `job` and returns a future of its result. The job is queued
    /// at once (not when the future is first polled); dropping the future
    /// does not cancel it. A job that panics resolves to
    /// [`JobError::Panicked`]; the thread goes on.
    pub(crate) fn submit<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, JobError>> + Send + 'static {
        let device = self.device;
        let (reply, rx) = Reply::channel();
        let boundary = self.boundary.clone();
        let queued = self.queue(move |queued| {
            // The panic is recorded before the reply is dropped unsent, so
            // a waiter that hears of it finds it in the health already.
            let value = boundary.call(job);
            // Out of the depth before the waiter hears of the result.
            drop(queued);
            if let Some(value) = value {
                // The receiver may be gone (a cancelled caller); the job
                // ran anyway, which is what the caller's rollback relies on.
                let _ = reply.send(value);
            }
        });
        async move {
            queued?;
            match rx.await {
                Ok(Some(value)) => Ok(value),
                Ok(None) => Err(JobError::Panicked { device }),
                // The job was dropped unrun: the thread is gone.
                Err(_) => Err(JobError::Gone(WorkerGone { device })),
            }
        }
    }

    /// Closes the queue and waits for the thread to finish the jobs already
    /// queued. Idempotent; also done on drop.
    pub(crate) fn shutdown(&self) {
        drop(self.sender.lock().take());
        if self.is_current() {
            return;
        }
        if let Some(thread) = self.thread.lock().take() {
            if thread.join().is_err() {
                tracing::error!(target: "admission", device = %self.device, "a device worker job panicked");
            }
        }
    }
}

impl Drop for DeviceWorker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_in_order_off_the_runtime_and_depth_drains() {
        let worker = DeviceWorker::spawn(DeviceOrdinal(0));
        let caller = std::thread::current().id();
        let a = worker.submit(move || std::thread::current().id() != caller);
        let b = worker.submit(|| 2);
        assert_eq!(a.await, Ok(true));
        assert_eq!(b.await, Ok(2));
        // A job leaves the depth before its result is sent: a caller that
        // has the result ranks devices without its own job counted.
        assert_eq!(worker.depth(), 0);
        let c = worker.submit(|| 3);
        assert_eq!(c.await, Ok(3));
        assert_eq!(worker.depth(), 0);
        worker.shutdown();
        assert_eq!(worker.depth(), 0);
    }

    #[tokio::test]
    async fn a_panicking_job_is_a_typed_error_and_the_thread_goes_on() {
        let boundary = StdArc::new(crate::gpu::guard::worker_boundary());
        let worker = DeviceWorker::spawn_with(DeviceOrdinal(3), boundary.clone());
        let panicked = worker.submit(|| -> u32 { panic!("job panics") });
        assert_eq!(
            panicked.await,
            Err(JobError::Panicked {
                device: DeviceOrdinal(3)
            })
        );
        assert_eq!(boundary.health().panics, 1);
        // The thread serves the next job, in order.
        assert_eq!(worker.submit(|| 1).await, Ok(1));
        assert!(boundary.health().is_healthy());
    }

    #[tokio::test]
    async fn a_shut_down_worker_is_a_typed_error() {
        let worker = DeviceWorker::spawn(DeviceOrdinal(3));
        worker.shutdown();
        assert_eq!(
            worker.submit(|| 1).await,
            Err(JobError::Gone(WorkerGone {
                device: DeviceOrdinal(3)
            }))
        );
    }

    #[test]
    fn shutdown_joins_after_queued_jobs() {
        let worker = DeviceWorker::spawn(DeviceOrdinal(0));
        let (tx, rx) = std::sync::mpsc::channel();
        worker.submit_detached(move || tx.send(7).unwrap()).unwrap();
        drop(worker);
        assert_eq!(rx.try_recv(), Ok(7));
    }
}
