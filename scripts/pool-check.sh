#!/usr/bin/env bash
# Issue 16's targets where they can be met: W2 at 3x with handlers that
# never yield, through `CpuPool` with cores of its own (W2-pool-split: half
# the cores tokio workers that take the arrivals in, half pool threads),
# on a machine with cores to spare. On two cores the price of
# non-preemption alone (W2-ideal: the ideal scheduler's high-class p99 is
# 1.17x its value alone with two servers) is past the target of 1.1x; from
# four pool threads it is under it, so this runs the split at every core
# of the machine and at half of them, beside W2-ideal for reference.
#
# Builds the suite when cargo is present, or runs a prebuilt binary from
# .devbin/overload (the device machine has no cargo):
#   cargo build --release --example overload
#   mkdir -p .devbin && cp target/release/examples/overload .devbin/
# Each configuration's table, log and summary.json go to $OUT (or
# ./pool-check-out) under its own folder. Never hangs: every run is bounded.
#
#   bash scripts/pool-check.sh            # every core, then half of them
#   bash scripts/pool-check.sh 8 16       # --workers 8, then 16
set -u
cd "$(dirname "$0")/.."
out="${OUT:-pool-check-out}"
mkdir -p "$out"
log="$out/pool-check.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

bin=""
if command -v cargo >/dev/null 2>&1; then
  say "== build"
  if cargo build --release --example overload >>"$log" 2>&1; then
    bin=target/release/examples/overload
  fi
fi
if [ -z "$bin" ] && [ -x .devbin/overload ]; then
  bin=.devbin/overload
fi
if [ -z "$bin" ]; then
  say "no suite binary: the build failed (or there is no cargo) and .devbin/overload is missing"
  exit 2
fi

cores=$(nproc)
if [ "$#" -gt 0 ]; then
  sizes=("$@")
else
  sizes=("$cores" "$((cores / 2))")
fi
say "== $bin on $cores cores; --workers ${sizes[*]}"

status=0
run() { # run NAME LIMIT ARGS...: one bounded run of the suite into $out/NAME
  local name=$1 limit=$2
  shift 2
  say "+ $bin $* --out $out/$name"
  timeout --kill-after=10 "$limit" "$bin" "$@" --out "$out/$name" \
    >"$out/$name.out" 2>"$out/$name.err"
  local rc=$?
  say "  rc=$rc"
  cat "$out/$name.out" >>"$log"
  [ "$rc" -eq 0 ] || status=1
}

run ideal 60 --scenario w2-ideal --quick
for workers in "${sizes[@]}"; do
  [ "$workers" -ge 2 ] || continue
  run "split-$workers" 240 --scenario w2-pool-split --handler never-yields --workers "$workers"
done
grep -h -A12 '^w2-pool-split$' "$out"/split-*.out 2>/dev/null || true
exit "$status"
