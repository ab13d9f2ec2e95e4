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
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Deadlines further out than this fire at this distance instead: tokio
/// rounds a deadline up to its next millisecond when the timer is first
/// polled, which overflows (and panics) within a millisecond of the
/// largest `Instant`. Thirty years is tokio's own "far future".
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// A timer firing at `deadline`, or `None` where no tokio timer is
/// available.
pub(crate) fn sleep_until(deadline: Instant) -> Option<Sleep> {
    // Outside any runtime there is no timer to find; no need to panic.
    tokio::runtime::Handle::try_current().ok()?;
    let deadline = Instant::now()
        .checked_add(FAR_FUTURE)
        .map_or(deadline, |far| deadline.min(far));
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
