#!/usr/bin/env bash
# bench_torch.sh - step time of zeroshard.torch.ShardOptimizer against
# torch.optim.AdamW (foreach) on the CPU, same model, same run
# (bench/bench_torch.py says what is timed). Starts S zs-servers on
# 127.0.0.1 with THREADS optimizer threads each (shared memory with this
# host's Python process), runs the bench with the build's Python package,
# stops them. Ends with
#   TORCH-RESULT params=N zs_step_ms=X torch_step_ms=Y ratio=Z
# Usage: bench/bench_torch.sh [BUILD_DIR] [PARAMS] [STEPS]
#   defaults: build, 50000000, 5; env S (servers, default 2), THREADS
#   (per server, default nproc / S, at least 1). Needs python3-torch and the
#   extension built (python3-dev).
set -euo pipefail
B=${1:-build}
P=${2:-50000000}
STEPS=${3:-5}
S=${S:-2}
THREADS=${THREADS:-$(($(nproc) / S > 0 ? $(nproc) / S : 1))}
SRV=${ZS_SERVER:-$B/server/zs-server}
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d /tmp/zs-bench-torch-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$T"' EXIT
LIST=""
for i in $(seq 0 $((S - 1))); do
  "$SRV" --listen 127.0.0.1:0 --data "$T/s$i" --threads "$THREADS" --ready-file "$T/r$i" \
    >"$T/s$i.log" 2>&1 &
done
for i in $(seq 0 $((S - 1))); do
  for _ in $(seq 200); do [ -s "$T/r$i" ] && break; sleep 0.05; done
  [ -s "$T/r$i" ] || { echo "bench_torch: server $i did not start:"; cat "$T/s$i.log"; exit 1; }
  LIST="$LIST${LIST:+,}$(cat "$T/r$i")"
done
echo "$S servers x $THREADS threads, $(nproc) cores; P=$P, $STEPS steps"
PYTHONPATH="$B/python" /usr/bin/python3 "$HERE/bench_torch.py" "$LIST" "$P" "$STEPS" 2>"$T/py.log" ||
  { cat "$T/py.log"; exit 1; }
