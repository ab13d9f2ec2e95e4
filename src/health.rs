//! Panic boundaries around user code, and the health each component reports.
//!
//! Admission is a safety device: a panic in code the application hands it
//! (a [`CpuSignal`](crate::cpu::CpuSignal), an
//! [`LsmStatsSource`](crate::io::LsmStatsSource), a custom
//! [`Granter`](crate::grant::Granter), a GPU observer, preflight or teardown
//! hook, a tower classifier) must not take the service down with it. Every
//! place the crate calls such code goes through a panic boundary: the call runs
//! under [`std::panic::catch_unwind`], and a panic is
//!
//! * logged as a `tracing` error under the target `admission`, with the
//!   component and the panic's message;
//! * counted (and, with the `metrics` feature, exported as
//!   `admission_callback_panics_total{component}`);
//! * visible in the owning component's snapshot as a [`ComponentHealth`];
//! * answered by the component's documented fallback (its
//!   [`on_failure`](ComponentHealth::on_failure)), never by a poisoned lock,
//!   a dead thread, a wedged queue or leaked capacity.
//!
//! No user code runs under a lock of this crate in a state that a panic
//! could leave half-changed: where a callback runs under a lock (a custom
//! granter's methods run under its queue's lock), the boundary is inside the
//! lock and the caller treats the panic as the callback's most conservative
//! answer.
//!
//! A build with `panic = "abort"` has no unwinding to catch: a panic there
//! ends the process, as it would anywhere else in it.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::sync::{Ordering, StdAtomicU64, StdMutex};

/// The longest panic message kept in a [`ComponentHealth`]; longer ones are
/// cut (at a character boundary), so a callback cannot grow the record.
const MESSAGE_LIMIT: usize = 512;

/// How one component that calls user code is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ComponentHealth {
    /// The component, e.g. `cpu_signal` or `gpu_observer`.
    pub component: &'static str,
    /// Panics caught since the component was built.
    pub panics: u64,
    /// Panics since the last call that returned normally; 0 while healthy.
    pub consecutive_panics: u64,
    /// The message of the most recent panic, cut to 512 bytes.
    pub last_panic: Option<String>,
    /// What the component does while its callback fails.
    pub on_failure: &'static str,
}

impl ComponentHealth {
    /// Whether the last call of the component's callback returned normally
    /// (or it has not been called yet).
    pub fn is_healthy(&self) -> bool {
        self.consecutive_panics == 0
    }
}

impl fmt::Display for ComponentHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_healthy() {
            write!(
                f,
                "{}: healthy ({} panics caught)",
                self.component, self.panics
            )
        } else {
            write!(
                f,
                "{}: failing ({} panics in a row, {} in all; {}), last: {}",
                self.component,
                self.consecutive_panics,
                self.panics,
                self.on_failure,
                self.last_panic.as_deref().unwrap_or("(no message)")
            )
        }
    }
}

/// The panic boundary of one component: runs its user code, catches and
/// records panics.
pub(crate) struct Boundary {
    component: &'static str,
    on_failure: &'static str,
    panics: StdAtomicU64,
    consecutive: StdAtomicU64,
    /// A leaf lock: held only to copy a message in or out.
    last_panic: StdMutex<Option<String>>,
}

impl Boundary {
    /// A boundary for `component`, whose fallback while its callback fails
    /// is `on_failure` (a short phrase, shown in snapshots).
    pub(crate) fn new(component: &'static str, on_failure: &'static str) -> Self {
        Boundary {
            component,
            on_failure,
            panics: StdAtomicU64::new(0),
            consecutive: StdAtomicU64::new(0),
            last_panic: StdMutex::new(None),
        }
    }

    /// Runs `f`; `None` if it panicked, after the panic was logged and
    /// counted. A normal return ends a run of failures.
    ///
    /// `f` is asserted unwind-safe: callers pass user code together with
    /// borrows of state that the code itself owns (a signal, a source, a
    /// granter's state), which a panic leaves as the user's code left it.
    #[inline]
    pub(crate) fn call<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let value = self.backstop(f)?;
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.recovered();
        }
        Some(value)
    }

    /// A normal return after panics: out of line, so that the inlined
    /// `call` on every admission is a load and a compare.
    #[cold]
    #[inline(never)]
    fn recovered(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
        tracing::info!(
            target: "admission",
            component = self.component,
            "callback recovered"
        );
    }

    /// Like [`call`](Self::call), for a last-resort boundary around code
    /// that has boundaries of its own inside: a panic is recorded, but a
    /// normal return says nothing about the user code and ends no run of
    /// failures.
    #[inline]
    pub(crate) fn backstop<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(value) => Some(value),
            Err(payload) => {
                self.record(payload.as_ref());
                None
            }
        }
    }

    fn record(&self, payload: &(dyn Any + Send)) {
        let message = panic_message(payload);
        let panics = self
            .panics
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let consecutive = self
            .consecutive
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        tracing::error!(
            target: "admission",
            component = self.component,
            panic = %message,
            panics,
            consecutive,
            fallback = self.on_failure,
            "a callback panicked; the panic was caught"
        );
        crate::export::callback_panicked(self.component);
        *self.last_panic.lock().unwrap_or_else(crate::sync::recover) = Some(message);
    }

    /// The component's health now.
    pub(crate) fn health(&self) -> ComponentHealth {
        ComponentHealth {
            component: self.component,
            panics: self.panics.load(Ordering::Relaxed),
            consecutive_panics: self.consecutive.load(Ordering::Relaxed),
            last_panic: self
                .last_panic
                .lock()
                .unwrap_or_else(crate::sync::recover)
                .clone(),
            on_failure: self.on_failure,
        }
    }

    /// Panics in a row, without copying the message.
    pub(crate) fn consecutive_panics(&self) -> u64 {
        self.consecutive.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.health(), f)
    }
}

/// A panic's message, if it was a string, cut to [`MESSAGE_LIMIT`] bytes.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = if let Some(text) = payload.downcast_ref::<&'static str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.as_str()
    } else {
        "(a panic without a string message)"
    };
    let mut end = text.len().min(MESSAGE_LIMIT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_counted_and_ends_with_the_next_success() {
        let boundary = Boundary::new("test_hook", "skips the hook");
        assert_eq!(boundary.call(|| 7), Some(7));
        assert!(boundary.health().is_healthy());

        assert_eq!(boundary.call(|| -> u32 { panic!("first") }), None);
        assert_eq!(
            boundary.call(|| -> u32 { std::panic::panic_any(3u8) }),
            None
        );
        let failing = boundary.health();
        assert_eq!((failing.panics, failing.consecutive_panics), (2, 2));
        assert_eq!(
            failing.last_panic.as_deref(),
            Some("(a panic without a string message)")
        );
        assert!(!failing.is_healthy());
        assert!(failing.to_string().contains("skips the hook"));

        assert_eq!(boundary.call(|| 8), Some(8));
        let recovered = boundary.health();
        assert_eq!((recovered.panics, recovered.consecutive_panics), (2, 0));
        assert!(recovered.is_healthy());
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let boundary = Boundary::new("test_hook", "skips the hook");
        // 'é' is two bytes: 300 of them put byte 512 in the middle of none,
        // 301 one-byte characters first put it in the middle of one.
        let message = format!("{}{}", "x".repeat(301), "é".repeat(300));
        boundary.call(|| panic!("{message}"));
        let kept = boundary.health().last_panic.unwrap();
        assert!(kept.len() <= MESSAGE_LIMIT);
        assert!(message.starts_with(&kept));
        assert_eq!(kept.len(), MESSAGE_LIMIT - 1);
    }
}
