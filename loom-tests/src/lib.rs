//! loom models of the admission crate's concurrency core. The models live
//! under `tests/` and compile only with `RUSTFLAGS="--cfg loom"`; this
//! library holds what they share.

/// Explores `f` under loom with the preemption bound from
/// `LOOM_MAX_PREEMPTIONS`, or 3 when it is unset.
#[cfg(loom)]
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// Asserts a ledger's conservation invariant: what is spoken for (grants,
/// cache, protection and one floor per open unprotected slot) fits the
/// pool, and no more attempts run than the limit.
#[cfg(loom)]
pub fn assert_ledger_conserved(r: &admission::gpu::LedgerReport) {
    let spoken = r.live_grants_bytes
        + r.cache_evictable_bytes
        + r.cache_pinned_bytes
        + r.protected_bytes
        + r.attempt_floor * u64::from(r.empty_unprotected_slots);
    assert!(spoken <= r.managed_capacity, "{r:?}");
    assert!(r.active_attempts <= r.max_active_attempts, "{r:?}");
}
