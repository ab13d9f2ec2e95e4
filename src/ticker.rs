//! A background OS thread that runs a tick function until stopped.
//!
//! Both controllers sample on their own thread rather than a tokio task (a
//! task would wait in the very run queue it measures), with the same
//! lifecycle: tick, sleep for the period the tick asks for, stop promptly
//! when told, and be joined before the controller is gone.
//!
//! The thread outlives any panic in a tick. The controllers put every call
//! of user code behind its own [`Boundary`] with its own fallback, so a
//! tick should never panic; this thread's boundary is the last resort for
//! one that does anyway (a bug in this crate): the panic is logged and
//! counted in [`health`](Ticker::health), and the thread tries again after
//! its retry period, instead of ending and leaving the controller frozen in
//! whatever state it was in (no more tokens, no more slot changes).

use std::thread::JoinHandle;
use std::time::Duration;

use crate::health::{Boundary, ComponentHealth};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering, StdArc};

#[derive(Debug)]
pub(crate) struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    boundary: StdArc<Boundary>,
}

/// What a ticker does when a tick panics, for health records.
const ON_FAILURE: &str = "the tick is skipped and retried after the retry period";

impl Ticker {
    /// No thread: the owner ticks by hand.
    pub(crate) fn manual(component: &'static str) -> Self {
        Ticker {
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            boundary: StdArc::new(Boundary::new(component, ON_FAILURE)),
        }
    }

    /// A thread named `name` calling `tick` until stopped, sleeping for the
    /// period each tick returns, or for `retry` after a tick that panicked.
    /// `component` names the thread in health records and metrics.
    pub(crate) fn spawn(
        name: &str,
        component: &'static str,
        retry: Duration,
        mut tick: impl FnMut() -> Duration + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let boundary = StdArc::new(Boundary::new(component, ON_FAILURE));
        let guard = boundary.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) {
                    let period = guard.call(&mut tick).unwrap_or(retry);
                    // Woken early by `stop`; a spurious wake-up only means
                    // an extra tick.
                    std::thread::park_timeout(period);
                }
            })?;
        Ok(Ticker {
            stop,
            thread: Mutex::new(Some(thread)),
            boundary,
        })
    }

    /// Panics caught in the thread's ticks (none for a manual ticker).
    /// The thread's handle, to wake it before its period is up; `None`
    /// for a manual ticker or once stopped.
    pub(crate) fn thread(&self) -> Option<std::thread::Thread> {
        self.thread
            .lock()
            .as_ref()
            .map(|handle| handle.thread().clone())
    }

    pub(crate) fn health(&self) -> ComponentHealth {
        self.boundary.health()
    }

    /// Stops the thread and waits for it. Idempotent.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.lock().take() {
            // Stopped from its own tick (a callback that closes its own
            // controller): the loop sees the flag when the tick returns,
            // and a thread cannot join itself.
            if thread.thread().id() == std::thread::current().id() {
                return;
            }
            thread.thread().unpark();
            let name = thread.thread().name().unwrap_or("ticker").to_owned();
            // The loop catches every tick's panic; only one that escapes
            // catching (a panic while reporting a panic) ends up here.
            if thread.join().is_err() {
                tracing::error!(target: "admission", thread = %name, "a controller thread panicked");
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::mpsc;

    #[test]
    fn a_tick_that_panics_does_not_end_the_thread() {
        let (ticked, ticks) = mpsc::channel();
        let mut count = 0u32;
        let ticker = Ticker::spawn("test-ticker", "test_ticker", Duration::ZERO, move || {
            count += 1;
            let _ = ticked.send(count);
            assert!(count != 2 && count != 3, "tick {count} broke");
            Duration::ZERO
        })
        .unwrap();
        // Ticks 2 and 3 panic; the thread is still there to run tick 4.
        let seen: Vec<u32> = ticks.iter().take(4).collect();
        assert_eq!(seen, [1, 2, 3, 4]);
        ticker.stop();
        let health = ticker.health();
        assert_eq!(health.component, "test_ticker");
        assert_eq!(health.panics, 2);
        assert!(health.is_healthy(), "tick 4 returned normally");
    }
}
