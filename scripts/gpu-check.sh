#!/usr/bin/env bash
# GPU device checks (src/gpu/backend/cuda_checks.rs, unit tests of the CUDA
# backend). Builds the library's test binary when cargo
# is present, or runs a prebuilt one from .devbin/gpu_device (the GPU
# machine has no cargo). Runs the main checks, then the sticky-fault check
# alone in its own process (it poisons the CUDA context), and writes logs
# and the JSON result lines to $OUT (or ./gpu-check-out). Never hangs: every
# step runs under a timeout.
#
# Prebuild on a dev machine:
#   cargo test --release --lib --features cuda,gpu-tests --no-run
#   then copy the printed executable (target/release/deps/admission-*) to
#   .devbin/gpu_device
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
mkdir -p "$out"
log="$out/gpu-check.log"
results="$out/results.jsonl"
: >"$log"
: >"$results"
say() { echo "$*" | tee -a "$log"; }
run() { # run LIMIT CMD...: a bounded command, output to the log
  local limit=$1; shift
  say "+ $*"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  say "  rc=$rc"
  return $rc
}

say "== diagnostics"
run 20 nvidia-smi || true
run 10 uname -a || true
run 10 ldd --version || true
ldconfig -p 2>/dev/null | grep -E 'libcuda\.so' | tee -a "$log" || say "libcuda not in ldconfig cache"

bin=""
if command -v cargo >/dev/null 2>&1; then
  say "== build"
  # The checks are unit tests of the CUDA backend (src/gpu/backend/
  # cuda_checks.rs): the library's test binary, filtered to them below.
  if run 900 cargo test --release --lib --features cuda,gpu-tests --no-run; then
    bin=$(cargo test --release --lib --features cuda,gpu-tests --no-run \
      --message-format=json 2>/dev/null |
      sed -n 's/.*"executable":"\([^"]*\/deps\/admission-[^"]*\)".*/\1/p' | tail -n 1)
  fi
fi
if [ -z "$bin" ] && [ -x .devbin/gpu_device ]; then
  bin=.devbin/gpu_device
fi
if [ -z "$bin" ]; then
  say "no test binary: build failed and .devbin/gpu_device is missing"
  exit 2
fi
say "== binary $bin"
run 10 ldd "$bin" || true

status=0
say "== main checks"
checks=gpu::backend::cuda_checks::
timeout --kill-after=10 300 "$bin" "$checks" --test-threads=1 --nocapture --skip sticky_fault \
  >"$out/main.out" 2>&1 || status=$?
say "  main rc=$status"
say "== sticky fault (own process, last)"
sticky=0
timeout --kill-after=10 120 "$bin" --exact "${checks}sticky_fault_is_a_device_fault" --test-threads=1 \
  --nocapture >"$out/sticky.out" 2>&1 || sticky=$?
say "  sticky rc=$sticky"
grep -h '^{' "$out/main.out" "$out/sticky.out" >>"$results" || true
cat "$results" | tee -a "$log"
[ "$status" -eq 0 ] && [ "$sticky" -eq 0 ]
