#!/usr/bin/env bash
# Runs two builds of the overload suite alternately, each N times, under
# scripts/quiet.sh, and keeps every run's log and summary. On a shared VM C
# drifts by several percent over minutes, so a change is judged by
# comparisons within each run (the defaults against the fixed total, the
# workers' busy fraction: `cpu_busy_frac` in the summary) across builds
# run side by side, not by one run of each.
#
#   cp target/release/examples/overload /tmp/before    # build, copy, change,
#   cp target/release/examples/overload /tmp/after     # build, copy again
#   bash scripts/alternate.sh /tmp/before /tmp/after 4 \
#     --handler self-wake --system admission-defaults --system admission-fixed
#
# Writes target/admission-report/alternate/{before,after}-K.{log,json} and
# prints each run's table.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 BEFORE AFTER RUNS [overload arguments...]" >&2
  exit 2
fi
before=$1 after=$2 runs=$3
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/target/admission-report/alternate"
mkdir -p "$out"
cd "$here"
for k in $(seq 1 "$runs"); do
  for build in before after; do
    binary=$before
    [ "$build" = after ] && binary=$after
    log="$out/$build-$k.log"
    bash scripts/quiet.sh "$binary" "$@" > "$log" 2>&1 || {
      echo "$build run $k failed; see $log" >&2
      exit 1
    }
    cp target/admission-report/summary.json "$out/$build-$k.json"
    echo "== $build, run $k"
    # The table: from its header to the line that closes the run.
    sed -n '/^\(system\|handler\) /,/^calibrating again/p' "$log" | grep -v '^calibrating again'
    grep -E '^(C before|run:|RUN INVALID)' "$log" || true
  done
done
