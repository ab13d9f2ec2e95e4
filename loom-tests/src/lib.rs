//! Only the models under `tests/` matter; they compile with `--cfg loom`.
