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
//!   rank devices.
//! * **Shutdown** happens when the handle drops: the channel closes, the
//!   thread finishes the jobs already queued, and the handle joins it. A
//!   handle dropped on its own thread (a job holding the last reference)
//!   does not join itself.
//! * **A gone thread is an error, not a panic.** If the thread has exited
//!   (a job panicked), [`DeviceWorker::submit`] resolves to
//!   [`WorkerGone`].

use std::fmt;
use std::future::Future;
use std::thread::{JoinHandle, ThreadId};

use tokio::sync::oneshot;

use crate::gpu::backend::DeviceOrdinal;
use crate::sync::{mpsc, Arc, AtomicU64, Mutex, Ordering};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The device worker thread is gone (it exited or could not be started):
/// the job did not run, or its result was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerGone {
    /// The worker's device.
    pub device: DeviceOrdinal,
}

impl fmt::Display for WorkerGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the worker thread of {} is gone", self.device)
    }
}

impl std::error::Error for WorkerGone {}

/// One OS thread running a device's blocking backend calls in FIFO order.
/// See the [module documentation](self).
pub struct DeviceWorker {
    device: DeviceOrdinal,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    depth: Arc<AtomicU64>,
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
    pub fn spawn(device: DeviceOrdinal) -> Self {
        let (sender, receiver) = mpsc::channel::<Job>();
        let depth = Arc::new(AtomicU64::new(0));
        let thread_depth = depth.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("admission-{device}"))
            .spawn(move || {
                while let Ok(job) = receiver.recv() {
                    job();
                    thread_depth.fetch_sub(1, Ordering::AcqRel);
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
            thread_id: thread.as_ref().map(|t| t.thread().id()),
            sender: Mutex::new(sender),
            depth,
            thread: Mutex::new(thread),
        }
    }

    /// The device this worker serves.
    pub fn device(&self) -> DeviceOrdinal {
        self.device
    }

    /// Jobs submitted and not yet finished.
    pub fn depth(&self) -> u64 {
        self.depth.load(Ordering::Acquire)
    }

    /// Whether the calling thread is this worker's thread.
    pub fn is_current(&self) -> bool {
        self.thread_id == Some(std::thread::current().id())
    }

    /// Queues `job` without waiting for it. Fails if the thread is gone.
    pub fn submit_detached(&self, job: impl FnOnce() + Send + 'static) -> Result<(), WorkerGone> {
        let gone = WorkerGone {
            device: self.device,
        };
        let sender = self.sender.lock();
        let sender = sender.as_ref().ok_or(gone)?;
        self.depth.fetch_add(1, Ordering::AcqRel);
        if sender.send(Box::new(job)).is_err() {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            return Err(gone);
        }
        Ok(())
    }

    /// Queues `job` and returns a future of its result. The job is queued
    /// at once (not when the future is first polled); dropping the future
    /// does not cancel it.
    pub fn submit<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, WorkerGone>> + Send + 'static {
        let device = self.device;
        let (tx, rx) = oneshot::channel();
        let queued = self.submit_detached(move || {
            // The receiver may be gone (a cancelled caller); the job ran
            // anyway, which is what the caller's rollback relies on.
            let _ = tx.send(job());
        });
        async move {
            queued?;
            rx.await.map_err(|_| WorkerGone { device })
        }
    }

    /// Closes the queue and waits for the thread to finish the jobs already
    /// queued. Idempotent; also done on drop.
    pub fn shutdown(&self) {
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
        // A job counts until the thread has finished it, which is just after
        // it sent its result; joining the thread is what proves it drained.
        worker.shutdown();
        assert_eq!(worker.depth(), 0);
    }

    #[tokio::test]
    async fn a_dead_thread_is_a_typed_error() {
        let worker = DeviceWorker::spawn(DeviceOrdinal(3));
        let panicked = worker.submit(|| -> u32 { panic!("job panics") });
        assert_eq!(
            panicked.await,
            Err(WorkerGone {
                device: DeviceOrdinal(3)
            })
        );
        // The thread is gone now: later jobs fail instead of hanging.
        let later = worker.submit(|| 1);
        assert!(later.await.is_err());
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
