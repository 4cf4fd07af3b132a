#!/usr/bin/env bash
# bench_engine.sh - step-time split of the ZeRO engine, in-process AdamW vs
# optimizer offloaded to 2 shard servers on loopback, W = 1 and 2, ~50M
# parameters (8 dense layers of 2500). Usage: bench/bench_engine.sh [BUILD_DIR]
set -euo pipefail
B=${1:-build}
T=$(mktemp -d /tmp/zs-bench-engine-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
for i in 0 1; do
  "$B/server/zs-server" --listen 127.0.0.1:0 --data "$T/s$i" --ready-file "$T/r$i" 2>"$T/s$i.log" &
done
for _ in $(seq 100); do [ -s "$T/r0" ] && [ -s "$T/r1" ] && break; sleep 0.1; done
S="$(cat "$T/r0"),$(cat "$T/r1")"
echo "| W | optimizer | step ms | forward | backward | collectives | optimizer / push+commit+pull | step vs in-process |"
echo "|---|---|---|---|---|---|---|---|"
for W in 1 2; do
  base=""
  for off in 0 1; do
    line=$(ZS_LOG_LEVEL=warn mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$W" \
           "$B/bench/bench_engine" --servers "$S" --offload "$off" "${@:2}" | grep '^result')
    get() { sed -E "s/.* $1=([0-9.]+).*/\1/" <<<"$line"; }
    step=$(get step_ms)
    [ -z "$base" ] && base=$step
    ratio=$(awk -v a="$step" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
    echo "| $W | $([ "$off" = 1 ] && echo offload || echo in-process) | $step | $(get fwd) | $(get bwd) | $(get comm) | $(get opt) | $ratio |"
  done
done
