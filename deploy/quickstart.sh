#!/usr/bin/env bash
# quickstart.sh - zeroshard's main job on an embedded default, on this machine.
#
# Installs missing packages, builds, starts 2 shard servers on 127.0.0.1 (data
# in ./quickstart-out/), and drives a training loop through them with zs-demo:
# push gradients, commit (AdamW runs on the servers), pull parameters,
# checkpoint every 20 steps. Then it kills one server with SIGKILL mid-run,
# restarts it, resumes from the newest checkpoint complete on both servers,
# and checks that the replayed steps reproduce the first run bit for bit.
#
# NOTE: until the ZeRO engine and zs-train land (issues 3 and 4), the trainer
# here is zs-demo (one client process, synthetic objective), not the GPT model
# under MPI. Environment: PARAMS (default 4194304), OUT (default quickstart-out).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/quickstart-out}
PARAMS=${PARAMS:-4194304}
BUILD=$ROOT/build

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1/6 dependencies"
./deploy/install-deps.sh

say "2/6 build ($BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target zs-server zs-ctl zs-demo 2>&1 | grep -E "error|warning|Built target" || true

rm -rf "$OUT"
mkdir -p "$OUT/logs"
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# start_server INDEX [ADDR]: start server INDEX (port picked free, or ADDR).
start_server() {
  local i=$1 listen=${2:-127.0.0.1:0}
  rm -f "$OUT/s$i.addr"
  "$BUILD/server/zs-server" --listen "$listen" --data "$OUT/data/s$i" --keep 2 \
      --ready-file "$OUT/s$i.addr" >>"$OUT/logs/server$i.log" 2>&1 &
  SRV_PID[$i]=$!
  PIDS+=("${SRV_PID[$i]}")
  for _ in $(seq 100); do [ -s "$OUT/s$i.addr" ] && break; sleep 0.1; done
  [ -s "$OUT/s$i.addr" ] || { echo "server $i did not start; see $OUT/logs/server$i.log"; exit 1; }
  ADDR[$i]=$(cat "$OUT/s$i.addr")
}

say "3/6 two shard servers on loopback"
declare -a SRV_PID ADDR
start_server 0
start_server 1
SERVERS="${ADDR[0]},${ADDR[1]}"
echo "servers: $SERVERS   (logs: $OUT/logs/server{0,1}.log)"

say "4/6 train 50 steps ($PARAMS parameters, AdamW on the servers, checkpoint every 20)"
"$BUILD/tools/zs-demo" --servers "$SERVERS" --params "$PARAMS" --steps 50 --ckpt-every 20 \
    --csv "$OUT/train.csv" | tee "$OUT/logs/run1.log"
"$BUILD/tools/zs-ctl" --servers "$SERVERS" status

say "5/6 kill -9 server 1, restart it, resume from the newest complete checkpoint"
kill -KILL "${SRV_PID[1]}"; wait "${SRV_PID[1]}" 2>/dev/null || true
echo "server 1 killed (SIGKILL); restarting on ${ADDR[1]}"
start_server 1 "${ADDR[1]}"
"$BUILD/tools/zs-ctl" --servers "$SERVERS" checkpoints
"$BUILD/tools/zs-demo" --servers "$SERVERS" --params "$PARAMS" --steps 60 --ckpt-every 20 \
    --resume --csv "$OUT/train-resumed.csv" | tee "$OUT/logs/run2.log"

# The replayed steps 41..50 must match the first run exactly.
a=$(awk '$1==50 {print $NF}' "$OUT/logs/run1.log")
b=$(awk '$1==50 {print $NF}' "$OUT/logs/run2.log")
if [ -n "$a" ] && [ "$a" = "$b" ]; then
  echo "step 50 checksum after resume: $b == first run: bitwise identical"
else
  echo "step 50 checksum differs after resume ($a vs $b)"; exit 1
fi

say "6/6 stop the servers (SIGTERM: graceful)"
"$BUILD/tools/zs-ctl" --servers "$SERVERS" status
cleanup
PIDS=()
cat <<MSG

Done. Results in $OUT:
  train.csv, train-resumed.csv   step, loss, push/commit+pull ms, checksum
  logs/run1.log, logs/run2.log   the trainer's output
  logs/server0.log, server1.log  one line per server event
  data/s0, data/s1               RocksDB checkpoints (restart a server on them to resume)
MSG
