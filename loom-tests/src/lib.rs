//! loom models of the admission crate's concurrency core outside the GPU
//! module. The models live under `tests/` and compile only with
//! `RUSTFLAGS="--cfg loom"`; this library holds what they share. The GPU
//! models live in the crate (`src/gpu/tests/loom_*.rs`), where they reach
//! the service's crate-private code.

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
