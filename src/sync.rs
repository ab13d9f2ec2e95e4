//! The one place that chooses between `std` and `loom` synchronization types.
//!
//! Every lock and atomic in the concurrency core comes from here, so a build
//! with `RUSTFLAGS="--cfg loom"` swaps them all for loom's instrumented
//! versions and the `loom-tests` crate can explore their interleavings. Code
//! outside this module never names `std::sync` or `loom::sync` directly.
//!
//! [`Mutex::lock`] returns the guard directly. A poisoned lock is recovered
//! rather than propagated: every critical section in this crate leaves the
//! state consistent before it can panic (user code called under a lock, a
//! custom granter's methods, runs behind a panic boundary that catches the
//! panic inside the lock), so the data behind a poisoned lock is still
//! valid, and a panic in one handler must not turn every later admission
//! into a panic.

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc,
};

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc,
};

/// Shared ownership of a value that is not itself a synchronization point
/// (a backend behind a trait object, a worker handle). Always `std`'s `Arc`:
/// loom's cannot hold an unsized value, and what is shared here is either
/// immutable or synchronizes through the types above.
pub(crate) use std::sync::Arc as StdArc;

/// Channels to and from OS threads that loom does not model (the device
/// worker, the simulator's gates). Always `std`'s.
pub(crate) use std::sync::mpsc;

/// Health records, which are not part of the concurrency core: a
/// [`Boundary`](crate::health::Boundary)'s panic counters and the leaf lock
/// around its last panic message (held only to copy a value in or out, never
/// while calling anything). Always `std`'s: they decide nothing, and loom
/// instruments every atomic access as a scheduling point, which would
/// multiply the models' interleavings on every guarded call for no finding.
pub(crate) use std::sync::{
    atomic::{AtomicBool as StdAtomicBool, AtomicU64 as StdAtomicU64},
    Mutex as StdMutex,
};

/// A mutual-exclusion lock whose `lock` cannot fail.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(loom))]
    inner: std::sync::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

/// The guard of a [`Mutex`].
#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;
/// The guard of a [`Mutex`].
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(loom))]
            inner: std::sync::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The guard if the lock is free now; `None` if someone holds it (this
    /// thread included: it never blocks, so it cannot deadlock).
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// The guard of a poisoned [`StdMutex`]: what it protects is only ever
/// replaced whole, so it is valid whatever panicked while holding it.
pub(crate) fn recover<G>(poisoned: std::sync::PoisonError<G>) -> G {
    poisoned.into_inner()
}

/// Explores `f` under loom with the preemption bound from
/// `LOOM_MAX_PREEMPTIONS`, or 3 when it is unset: what every in-crate loom
/// model runs under.
#[cfg(loom)]
pub(crate) fn loom_model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}
