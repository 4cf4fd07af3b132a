#!/usr/bin/env bash
# bench_spec.sh - speculative updates on the shard server (issue 18), with
# the worker and the server on separate cores (taskset), as separate hosts
# behave: the worker (bench_engine, W = 1) on core 0, one zs-server
# (--threads 1) on core 1. For each of RUNS rounds, in this order:
#   fwd+bwd     in-process optimizer: its forward + backward (+ collectives)
#               phases are the step without any optimizer;
#   plain       optimizer on the server, super_offload false, pulls inside
#               the step (stream_pulls false);
#   spec        optimizer on the server, super_offload true, pulls inside;
#   plain/clip  the same with gradient_clipping 0.01 (every step clips),
#   spec/clip   with speculate_every_step, so every speculative update is
#               rolled back (what a rollback costs);
#   spec/clip/held  clip 0.01 with speculate_every_step off (the default):
#               one rollback, then the steps after a clipped one run plain;
#   *_stream    the five again with stream_pulls true (the next step's
#               forward lands the pulls; its "pull" is the forward's wait).
# Every offload run is made once per transport (TRANSPORTS, default "tcp
# shm": gRPC over loopback TCP, and the shared-memory data plane to the same
# server), side by side in each round. Per round and transport it also
# measures the worker core's transfer cost per step with
# bench_worker_cpu.sh (in-process run vs speculative streamed offload run:
# the difference of their "xfer" lines), and once per round the memory bound
# of an AdamW pass on the server's core (bench_membound, same bytes).
# Prints each run's medians, then the median over the rounds, the ratios,
# and one line per transport:
#   SHM-RESULT transport=T worker_xfer_ms=X spec_over_fwdbwd=Y optim_over_membound=Z
# (X: the transfer's ms of the worker's core per step; Y: speculative
# streamed step / forward+backward+collectives; Z: the server's plain AdamW
# pass / the memory-bound pass over the same elements). Needs perf for X
# (NO_PERF=1 skips it: X is then "nan"). Usage:
#   bench/bench_spec.sh [BUILD_DIR] [RUNS] [bench_engine options...]
# e.g. bench/bench_spec.sh build 3 --batch 1 --steps 6 --bucket 2000000
set -euo pipefail
B=${1:-build}
R=${2:-3}
shift $(($# < 2 ? $# : 2))
T=$(mktemp -d /tmp/zs-bench-spec-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
WCPU=${WORKER_CPU:-0} SCPU=${SERVER_CPU:-1}
SRV=${ZS_SERVER:-$B/server/zs-server} ENG=${BENCH_ENGINE:-$B/bench/bench_engine}
MEMB=${BENCH_MEMBOUND:-$B/bench/bench_membound}
TRANSPORTS=${TRANSPORTS:-tcp shm}
echo "worker on core $WCPU, server on core $SCPU; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
taskset -c "$SCPU" "$SRV" --listen 127.0.0.1:0 --data "$T/s0" --threads 1 \
  --ready-file "$T/r0" 2>"$T/s0.log" &
for _ in $(seq 100); do [ -s "$T/r0" ] && break; sleep 0.1; done
S=$(cat "$T/r0")
run() { # name, bench_engine options
  local name=$1
  shift
  local out
  out=$(ZS_LOG_LEVEL=warn taskset -c "$WCPU" mpirun --allow-run-as-root --oversubscribe --bind-to none \
        -np 1 "$ENG" --servers "$S" "$@")
  echo "$name $(grep '^result' <<<"$out") $(grep '^servers' <<<"$out" || true)" | tee -a "$T/all"
}
xfer() { # name, bench_engine options: the worker core's transfer ms per step
  local name=$1 x=nan a=()
  shift
  while (($#)); do # bench_worker_cpu.sh sets --steps itself (two lengths)
    if [[ $1 == --steps ]]; then shift 2; else a+=("$1"); shift; fi
  done
  if [[ -z ${NO_PERF:-} ]]; then
    x=$(ZS_SERVER="$SRV" BENCH_ENGINE="$ENG" "$(dirname "$0")/bench_worker_cpu.sh" "$B" "${a[@]}" |
        awk '/^xfer/ {print $2}')
  fi
  echo "$name xfer=${x:-nan}" | tee -a "$T/all"
}
# the bytes of the server's AdamW pass: every element of the range once
P=$(ZS_LOG_LEVEL=warn mpirun --allow-run-as-root --oversubscribe -np 1 "$ENG" --servers "$S" \
    --offload 0 --steps 2 "$@" | sed -n 's/.* P=\([0-9]*\).*/\1/p')
for r in $(seq "$R"); do
  run fwdbwd --offload 0 "$@"
  echo "membound $(taskset -c "$SCPU" "$MEMB" --elements "$P" --reps 3)" | tee -a "$T/all"
  xfer xfer_inproc --offload 0 "$@"
  for tr in $TRANSPORTS; do
    for st in 0 1; do
      sfx=$([ $st = 1 ] && echo _stream || true)_$tr
      o=(--offload 1 --stream $st --transport "$tr")
      run plain$sfx "${o[@]}" --spec 0 "$@"
      run spec$sfx "${o[@]}" --spec 1 "$@"
      run plain_clip$sfx "${o[@]}" --spec 0 --clip 0.01 "$@"
      run spec_clip$sfx "${o[@]}" --spec 2 --clip 0.01 "$@"
      run spec_clip_held$sfx "${o[@]}" --spec 1 --clip 0.01 "$@"
    done
    xfer "xfer_$tr" --offload 1 --spec 1 --stream 1 --transport "$tr" "$@"
  done
done
python3 - "$T/all" "$TRANSPORTS" <<'PY'
import math, re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name = line.split()[0]
    kv = dict(re.findall(r"(\w+)=(-?[0-9.]+|nan)", line))
    runs.setdefault(name, []).append({k: float(v) for k, v in kv.items()})
transports = sys.argv[2].split()
med = lambda name, key: statistics.median(r[key] for r in runs[name])
fb = statistics.median(r["fwd"] + r["bwd"] + r["comm"] for r in runs["fwdbwd"])
mb = med("membound", "ms")
print("\n| run | step ms | forward | backward | collectives | optimizer wait | of it: push tail / commit / pull | server's last pass | kept / rolled back |")
print("|---|---|---|---|---|---|---|---|---|")
print("| forward+backward+collectives only (the in-process run's phases) | %.1f | %.1f | %.1f | %.1f | - | - | - | - |" % (fb, med("fwdbwd", "fwd"), med("fwdbwd", "bwd"), med("fwdbwd", "comm")))
for t in transports:
    for n in ["plain", "spec", "plain_clip", "spec_clip", "spec_clip_held", "plain_stream", "spec_stream", "plain_clip_stream", "spec_clip_stream", "spec_clip_held_stream"]:
        n = n + "_" + t
        print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f | %.1f | %d / %d |" % (n, med(n, "step_ms"), med(n, "fwd"), med(n, "bwd"), med(n, "comm"), med(n, "opt"), med(n, "opt_push"), med(n, "opt_commit"), med(n, "opt_pull"), med(n, "last_pass_ms"), med(n, "kept"), med(n, "rolled")))
print("\n(medians over %d rounds of each run's median step)" % len(runs["fwdbwd"]))
print("memory-bound pass over the range (%d elements, 28 B each) on the server's core: %.1f ms" % (runs["membound"][0]["elements"], mb))
res = []
for t in transports:
    adam = med("plain_" + t, "last_pass_ms")
    print("\n%s: server AdamW pass (plain): %.1f ms = %.2f of forward+backward+collectives, %.2f of the memory bound" % (t, adam, adam / fb, adam / mb))
    for n in ["plain", "spec", "plain_stream", "spec_stream"]:
        n = n + "_" + t
        exposed = med(n, "step_ms") - fb
        print("%-20s step / fwd+bwd = %.3f; exposed optimizer time %.1f ms = %.2f of the server's AdamW" % (n, med(n, "step_ms") / fb, exposed, exposed / adam))
    for sfx in ["", "_stream"]:
        sfx = sfx + "_" + t
        print("clip 0.01%s: spec / plain step = %.3f (every step rolled back), %.3f (speculate_every_step off)" % (sfx, med("spec_clip" + sfx, "step_ms") / med("plain_clip" + sfx, "step_ms"), med("spec_clip_held" + sfx, "step_ms") / med("plain_clip" + sfx, "step_ms")))
    x = statistics.median(a["xfer"] - b["xfer"] for a, b in zip(runs["xfer_" + t], runs["xfer_inproc"]))
    res.append("SHM-RESULT transport=%s worker_xfer_ms=%.1f spec_over_fwdbwd=%.3f optim_over_membound=%.2f" % (t, x, med("spec_stream_" + t, "step_ms") / fb, adam / mb))
print("(with _stream the pull is the next forward's wait: inside 'forward', shown as 'pull')\n")
for line in res:
    print(line)
PY
