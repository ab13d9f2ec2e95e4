//! Deadline timers that cannot take the service down.
//!
//! A request that waits with a deadline arms a tokio timer. tokio panics
//! when a timer is created on a runtime built without `enable_time` (or
//! outside any runtime), and there is no way to ask first, so the timer is
//! created behind a panic boundary: where it cannot be had, the caller gets
//! `None` and refuses the request with a typed error, instead of the
//! request's task panicking under load, the only time a request waits.
//! tokio's panic message still reaches the panic hook (stderr by default),
//! which says what to change.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tokio::time::{Instant, Sleep};

/// A timer firing at `deadline`, or `None` where no tokio timer is
/// available.
pub(crate) fn sleep_until(deadline: Instant) -> Option<Sleep> {
    // Outside any runtime there is no timer to find; no need to panic.
    tokio::runtime::Handle::try_current().ok()?;
    match catch_unwind(AssertUnwindSafe(|| tokio::time::sleep_until(deadline))) {
        Ok(sleep) => Some(sleep),
        Err(_) => {
            tracing::error!(
                target: "admission",
                "a request with a deadline had to wait on a tokio runtime without timers; \
                 it was refused (build the runtime with `enable_time()`)"
            );
            None
        }
    }
}
