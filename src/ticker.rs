//! A background OS thread that runs a tick function until stopped.
//!
//! Both controllers sample on their own thread rather than a tokio task (a
//! task would wait in the very run queue it measures), with the same
//! lifecycle: tick, sleep for the period the tick asks for, stop promptly
//! when told, and be joined before the controller is gone.

use std::thread::JoinHandle;
use std::time::Duration;

use crate::sync::{Arc, AtomicBool, Mutex, Ordering};

#[derive(Debug)]
pub(crate) struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Ticker {
    /// No thread: the owner ticks by hand.
    pub(crate) fn manual() -> Self {
        Ticker {
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        }
    }

    /// A thread named `name` calling `tick` until stopped, sleeping for the
    /// period each tick returns.
    pub(crate) fn spawn(
        name: &str,
        mut tick: impl FnMut() -> Duration + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) {
                    let period = tick();
                    // Woken early by `stop`; a spurious wake-up only means
                    // an extra tick.
                    std::thread::park_timeout(period);
                }
            })?;
        Ok(Ticker {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread and waits for it. Idempotent. A tick that panicked
    /// (only a user-supplied source can) is logged, not propagated.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.lock().take() {
            thread.thread().unpark();
            let name = thread.thread().name().unwrap_or("ticker").to_owned();
            if thread.join().is_err() {
                tracing::error!(target: "admission", thread = %name, "a controller thread panicked");
            }
        }
    }
}
