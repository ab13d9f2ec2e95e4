#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy with warnings as
# errors, unit, integration and doc tests, rustdoc without broken links, and
# the loom models. Needs only a Rust toolchain (rustfmt and clippy included);
# every crate comes from crates.io through Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# Disk: every integration test, example and bench links the whole
# dependency tree, and the suite builds it in two target directories (with
# and without tokio_unstable) plus loom's. With full debug info and
# incremental caches that is about 10 GB each, more than some CI machines
# have free. Line tables keep panics' backtraces readable; incremental
# caches only pay off across repeated local edits.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only
step "disk before the build"
df -h . | tail -n 1

# Every test runner's output also goes to a log, so that the run can end on
# one line that totals them.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
tests() { "$@" 2>&1 | tee -a "$log"; }

for component in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    step "installing $component"
    rustup component add "$component"
  fi
done

# The quota's Redis tests (tests/quota_redis.rs, examples/fleet_quota.rs)
# start a redis-server of their own on a loopback port. Installed here
# where missing (Debian's package), and required: without it those tests
# fail instead of printing their skip line.
if ! command -v redis-server >/dev/null 2>&1; then
  step "installing redis-server"
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
  fi
fi
export ADMISSION_REQUIRE_REDIS=1

# Every feature except `gpu-tests`, whose tests need a CUDA device (run
# them with scripts/gpu-check.sh on a GPU machine). `cuda` is built and its
# no-driver path tested: the backend loads the driver at run time.
# `bench-internals` only lets benches/gpu_admit.rs (the GPU core, which is
# crate-private) build, so its bench-smoke test runs here too. `redis`
# brings the quota's Redis backend and its tests.
FEATURES="--features tower,axum,metrics,config,cuda,fjall,bench-internals,redis"

step "format"
cargo fmt --all -- --check

# The repository's .cargo/config.toml builds with --cfg tokio_unstable (the
# CPU signal then reads per-worker queue depths). The library must also work
# on stable tokio, with its fallback signal: everything that compiles
# differently is checked both ways. An explicitly empty RUSTFLAGS overrides
# the config's flags; the second build gets its own target directory.
stable() { RUSTFLAGS="" CARGO_TARGET_DIR=target/stable "$@"; }

step "clippy with tokio_unstable (all targets, warnings are errors)"
cargo clippy --locked --workspace --all-targets $FEATURES -- -D warnings

step "clippy on stable tokio"
stable cargo clippy --locked --workspace --all-targets $FEATURES -- -D warnings

# The device checks need a CUDA device to run; CI keeps them compiling.
step "GPU device checks compile (run them with scripts/gpu-check.sh on a GPU)"
cargo clippy --locked --lib --tests --features cuda,gpu-tests -- -D warnings

step "unit, integration and bench-smoke tests, with tokio_unstable"
tests cargo test --locked --workspace --all-targets $FEATURES

step "unit, integration and bench-smoke tests, on stable tokio"
tests stable cargo test --locked --workspace --all-targets $FEATURES

step "doc tests"
tests cargo test --locked --workspace --doc $FEATURES

step "rustdoc (broken links are errors)"
# rustdoc leaves the pages of items that no longer exist: start clean, so
# that the public-item list below reads only what is there.
rm -rf target/doc/admission
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --workspace $FEATURES

# Every public item, from the rustdoc just built, against the committed
# list: an addition or removal is a visible diff (regenerate the list with
# `python3 scripts/public-items.py > docs/public-items.txt`).
step "public items (docs/public-items.txt)"
if ! command -v python3 >/dev/null 2>&1; then
  step "installing python3"
  sudo=""
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-minimal >/dev/null
fi
python3 scripts/public-items.py --check docs/public-items.txt

# loom models: a separate target directory, because --cfg loom rebuilds every
# dependency. LOOM_MAX_PREEMPTIONS may be raised for a deeper (slower) search.
# loom-tests/tests/gpu.rs, pool.rs and part of queue.rs run the GPU, CPU
# pool and arrivals-first models that live in the crate (src/gpu/loom_models/,
# src/pool/loom_models.rs, src/queue/loom_models.rs, compiled only under
# --cfg loom) so that they can drive crate-private code.
step "loom models (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3})"
RUSTFLAGS="--cfg loom -D warnings" \
  LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
  CARGO_TARGET_DIR=target/loom \
  tests cargo test --locked --release -p loom-tests --test '*'

step "disk after the build"
df -h . | tail -n 1
du -sh target/* 2>/dev/null | sort -h | tail -n 4

passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
step "all checks passed"
echo "all: $passed passed, $failed failed"
