//! loom models of the GPU module, compiled only with `RUSTFLAGS="--cfg
//! loom"`. They live in the crate, the way tokio keeps
//! `src/sync/tests/loom_*.rs`, so that they drive the crate's own
//! crate-private code under loom's scheduler through `crate::sync`, the one
//! place that picks loom's types. They are not `#[cfg(test)]`: the crate's
//! unit-test build pulls in dev-dependencies (hyper, axum) that do not
//! compile against tokio built with `--cfg loom`. So each model is a
//! hidden public function, and `loom-tests/tests/gpu.rs` runs each one as
//! a test (`scripts/test-all.sh`'s loom step):
//!
//! * `loom_service`: the query service's `transact`, `wait` and the admit
//!   future's guard (`AdmitGuard::drop`) racing a release, with the
//!   service's own mutex and waker bookkeeping;
//! * `loom_core`: the scheduler core's transactions (reserve, resolve,
//!   schedule, cancel, release) interleaved under one mutex;
//! * `loom_ledger`: the ledger's commit, release and protection;
//! * `loom_domain`: the allocation domain's compare-and-swap ceiling.
//!
//! The device worker runs OS threads loom cannot schedule, so no model
//! builds an envelope: the service models stop at the grant.

pub mod loom_core;
pub mod loom_domain;
pub mod loom_ledger;
pub mod loom_service;

use crate::sync::loom_model as model;

/// Asserts a ledger's conservation invariant: what is spoken for (grants,
/// cache, protection and one floor per open unprotected slot) fits the
/// pool, and no more attempts run than the limit.
fn assert_ledger_conserved(r: &crate::gpu::LedgerSnapshot) {
    let spoken = r.live_grants_bytes
        + r.cache_evictable_bytes
        + r.cache_pinned_bytes
        + r.protected_bytes
        + r.attempt_floor * u64::from(r.empty_unprotected_slots);
    assert!(spoken <= r.managed_capacity, "{r:?}");
    assert!(r.active_attempts <= r.max_active_attempts, "{r:?}");
}
