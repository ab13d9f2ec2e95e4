#!/usr/bin/env bash
# Runs a measurement ("$@") while every other scheduler autogroup on the
# machine is niced to 19, so that builds and tests running beside it (in
# other sessions) take CPU only when the measurement leaves some.
#
# Why autogroups: with CONFIG_SCHED_AUTOGROUP (most distributions), the
# scheduler first shares the CPU between sessions' autogroups and only then
# between processes within one, so `nice` on another session's processes
# changes nothing; the autogroup's own nice (/proc/PID/autogroup) does.
# Needs permission to write other processes' autogroup files (root, or the
# same user). The overload suite still checks C before and after a run,
# which tells whether this was enough.
#
#   bash scripts/quiet.sh cargo run --release --example overload
set -euo pipefail
"$@" &
main=$!
mine=$(awk '{print $1}' "/proc/$main/autogroup" 2>/dev/null || echo none)
(
  while kill -0 "$main" 2>/dev/null; do
    for f in /proc/[0-9]*/autogroup; do
      read -r group _ nice < "$f" 2>/dev/null || continue
      [ "$group" = "$mine" ] && continue
      [ "$nice" = 19 ] && continue
      echo 19 > "$f" 2>/dev/null || true
    done
    sleep 0.5
  done
) &
wait "$main"
