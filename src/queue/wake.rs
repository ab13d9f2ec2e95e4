//! Wakers and failed waits collected under the queue's lock, woken and
//! logged only once it is released. Apart from the state machine because
//! this is where the application's code (wakers, log subscribers) runs,
//! with the panic handling that needs; the state machine only collects.

use std::task::Waker;
use std::time::Duration;

use crate::work::{Priority, TenantId};

/// Wakers collected under the lock, woken after it is released; with the
/// waits that failed meanwhile, logged after that. A subscriber is the
/// application's code: a panic in it must not unwind through the grant
/// loop half-way, leaving free capacity beside waiters nobody will grant.
///
/// Every admission and release builds one and nearly always collects
/// nothing, so the empty list is two `None`s: nothing to drop, nothing to
/// wake, two compares. What grants beyond the first collect, and the failed
/// waits, live behind one allocation made when the first of them comes.
#[derive(Debug, Default)]
pub(crate) struct WakeList {
    first: Option<Waker>,
    more: Option<Box<MoreWakes>>,
}

#[derive(Debug, Default)]
struct MoreWakes {
    rest: Vec<Waker>,
    failed: Vec<FailedWait>,
}

/// A wait that failed under the lock, for the log.
#[derive(Debug)]
pub(super) struct FailedWait {
    pub(super) tenant: TenantId,
    pub(super) priority: Priority,
    pub(super) waited: Duration,
    pub(super) reason: &'static str,
}

impl WakeList {
    pub(super) fn push(&mut self, waker: Option<Waker>) {
        let Some(waker) = waker else { return };
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.more.get_or_insert_with(Box::default).rest.push(waker);
        }
    }

    pub(super) fn push_failed(&mut self, failed: FailedWait) {
        self.more
            .get_or_insert_with(Box::default)
            .failed
            .push(failed);
    }

    /// Wakes everything collected, then logs the failed waits. Call only
    /// after the lock is released: a woken task may run at once on another
    /// thread and ask for the lock.
    #[inline]
    pub(crate) fn wake_all(self) {
        if self.first.is_some() || self.more.is_some() {
            self.wake_and_log();
        }
    }

    #[inline(never)]
    fn wake_and_log(mut self) {
        self.wake_collected();
        let Some(more) = self.more.take() else {
            return;
        };
        // A permit dropped while its task unwinds gets here too; a second
        // panic (the subscriber's) would abort the process.
        if std::thread::panicking() {
            return;
        }
        for failed in more.failed {
            // The caller still has to act on what the critical section
            // decided (a waiter it removed, a grant it observed): a
            // subscriber's panic must not unwind through it. Its message
            // still reaches the panic hook.
            let _ = std::panic::catch_unwind(|| {
                tracing::debug!(
                    target: "admission",
                    tenant = %failed.tenant,
                    priority = %failed.priority,
                    waited_us = failed.waited.as_micros() as u64,
                    "{}",
                    failed.reason
                );
            });
        }
    }

    /// The failed waits alone; the wakers are dropped unwoken.
    pub(super) fn into_failed(mut self) -> Vec<FailedWait> {
        self.first = None;
        self.more.take().map(|more| more.failed).unwrap_or_default()
    }

    fn wake_collected(&mut self) {
        if let Some(first) = self.first.take() {
            first.wake();
        }
        if let Some(more) = &mut self.more {
            for waker in std::mem::take(&mut more.rest) {
                waker.wake();
            }
        }
    }
}

impl Drop for WakeList {
    /// A panic under the lock (granters' are caught there, so one in this
    /// crate) unwinds past `wake_all`; the waiters already granted or
    /// refused must still be woken, or those without a deadline would
    /// sleep on their grant. The list is declared before the lock is
    /// taken, so it drops after the lock is released. The failed waits are
    /// not logged while unwinding: a second panic there would abort.
    #[inline]
    fn drop(&mut self) {
        if self.first.is_some() || self.more.is_some() {
            self.wake_collected();
        }
    }
}
