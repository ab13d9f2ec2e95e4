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
