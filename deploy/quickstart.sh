#!/usr/bin/env bash
# quickstart.sh - zeroshard's main job on an embedded default, on this machine.
#
# Installs missing packages, builds, turns the text in /usr/share/common-licenses
# into a byte-level token file, starts 2 shard servers on 127.0.0.1 (RocksDB in
# ./quickstart-out/data), trains a small GPT with 2 MPI workers (ZeRO stage 2,
# AdamW offloaded to the servers, deploy/ds_quickstart.json) for 200 steps with
# a checkpoint every 50, stops, resumes with 1 worker from the newest
# checkpoint complete on both servers (the elastic restart) up to step 300,
# stops the servers and plots loss and step time.
# Environment: OUT (default ./quickstart-out), STEPS1 (200), STEPS2 (300).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/quickstart-out}
STEPS1=${STEPS1:-200}
STEPS2=${STEPS2:-300}
BUILD=$ROOT/build
MODEL=(--layers 4 --heads 4 --width 128 --ctx 64)
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1/7 dependencies"
./deploy/install-deps.sh

say "2/7 build ($BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target zs-server zs-ctl zs-train zs-tokenize 2>&1 |
  grep -E "error|warning|Built target" || true

rm -rf "$OUT"
mkdir -p "$OUT/logs"
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

say "3/7 demo corpus: /usr/share/common-licenses -> $OUT/corpus.tok"
"$BUILD/tools/zs-tokenize" -o "$OUT/corpus.tok" $(find /usr/share/common-licenses -maxdepth 1 -type f | sort)

say "4/7 two shard servers on loopback"
declare -a ADDR
for i in 0 1; do
  "$BUILD/server/zs-server" --listen 127.0.0.1:0 --data "$OUT/data/s$i" --keep 2 \
      --ready-file "$OUT/s$i.addr" >>"$OUT/logs/server$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1; do
  for _ in $(seq 100); do [ -s "$OUT/s$i.addr" ] && break; sleep 0.1; done
  [ -s "$OUT/s$i.addr" ] || { echo "server $i did not start; see $OUT/logs/server$i.log"; exit 1; }
  ADDR[$i]=$(cat "$OUT/s$i.addr")
done
SERVERS="${ADDR[0]},${ADDR[1]}"
echo "servers: $SERVERS   (logs: $OUT/logs/server{0,1}.log)"

say "5/7 train with 2 workers: steps 1..$STEPS1 (stage 2, optimizer on the servers)"
ZS_LOG_LEVEL=warn "${MPIRUN[@]}" -np 2 "$BUILD/worker/zs-train" --config deploy/ds_quickstart.json \
    --servers "$SERVERS" --data "$OUT/corpus.tok" "${MODEL[@]}" --steps "$STEPS1" \
    --ckpt-every 50 --log-every 10 --csv "$OUT/train.csv" | tee "$OUT/logs/train-w2.log"
"$BUILD/tools/zs-ctl" --servers "$SERVERS" status

say "6/7 elastic restart: resume with 1 worker from the newest checkpoint, up to step $STEPS2"
ZS_LOG_LEVEL=warn "${MPIRUN[@]}" -np 1 "$BUILD/worker/zs-train" --config deploy/ds_quickstart.json \
    --servers "$SERVERS" --data "$OUT/corpus.tok" "${MODEL[@]}" --steps "$STEPS2" \
    --ckpt-every 50 --log-every 10 --resume --csv "$OUT/train.csv" | tee "$OUT/logs/train-w1.log"

say "7/7 stop the servers (SIGTERM: graceful), plot"
"$BUILD/tools/zs-ctl" --servers "$SERVERS" checkpoints
cleanup
PIDS=()
./deploy/plot.sh "$OUT/train.csv" "$OUT/train.png" || echo "(no plot: gnuplot failed)"
cat <<MSG

Done. Results in $OUT:
  train.csv          step, loss, lr, loss scale, tokens/s, ms per phase, workers
  train.csv.config.txt  the resolved configuration of each start (the log has its digest)
  train.png          loss and step time (deploy/plot.sh)
  logs/train-w2.log  2-worker run; logs/train-w1.log the 1-worker resume
  logs/server*.log   one line per server event
  data/s0, data/s1   RocksDB checkpoints (restart servers on them and --resume)
MSG
