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
# Prints each run's medians, then the median over the rounds and the ratios
# the issue asks for. Usage:
#   bench/bench_spec.sh [BUILD_DIR] [RUNS] [bench_engine options...]
# e.g. bench/bench_spec.sh build 3 --dtype fp32 --bucket 5000000
set -euo pipefail
B=${1:-build}
R=${2:-3}
shift $(($# < 2 ? $# : 2))
T=$(mktemp -d /tmp/zs-bench-spec-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
WCPU=${WORKER_CPU:-0} SCPU=${SERVER_CPU:-1}
SRV=${ZS_SERVER:-$B/server/zs-server} ENG=${BENCH_ENGINE:-$B/bench/bench_engine}
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
for r in $(seq "$R"); do
  run fwdbwd --offload 0 "$@"
  for st in 0 1; do
    sfx=$([ $st = 1 ] && echo _stream || true)
    run plain$sfx --offload 1 --spec 0 --stream $st "$@"
    run spec$sfx --offload 1 --spec 1 --stream $st "$@"
    run plain_clip$sfx --offload 1 --spec 0 --stream $st --clip 0.01 "$@"
    run spec_clip$sfx --offload 1 --spec 2 --stream $st --clip 0.01 "$@"
    run spec_clip_held$sfx --offload 1 --spec 1 --stream $st --clip 0.01 "$@"
  done
done
python3 - "$T/all" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name = line.split()[0]
    kv = dict(re.findall(r"(\w+)=([0-9.]+)", line))
    runs.setdefault(name, []).append({k: float(v) for k, v in kv.items()})
med = lambda name, key: statistics.median(r[key] for r in runs[name])
fb = statistics.median(r["fwd"] + r["bwd"] + r["comm"] for r in runs["fwdbwd"])
adam = med("plain", "last_pass_ms")
print("\n| run | step ms | forward | backward | collectives | optimizer wait | of it: push tail / commit / pull | server's last pass | kept / rolled back |")
print("|---|---|---|---|---|---|---|---|---|")
print("| forward+backward+collectives only (the in-process run's phases) | %.1f | %.1f | %.1f | %.1f | - | - | - | - |" % (fb, med("fwdbwd", "fwd"), med("fwdbwd", "bwd"), med("fwdbwd", "comm")))
for n in ["plain", "spec", "plain_clip", "spec_clip", "spec_clip_held", "plain_stream", "spec_stream", "plain_clip_stream", "spec_clip_stream", "spec_clip_held_stream"]:
    print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f | %.1f | %d / %d |" % (n, med(n, "step_ms"), med(n, "fwd"), med(n, "bwd"), med(n, "comm"), med(n, "opt"), med(n, "opt_push"), med(n, "opt_commit"), med(n, "opt_pull"), med(n, "last_pass_ms"), med(n, "kept"), med(n, "rolled")))
print("\n(medians over %d runs of each run's median step)" % len(runs["spec"]))
print("server AdamW pass (plain): %.1f ms = %.2f of forward+backward+collectives" % (adam, adam / fb))
for n in ["plain", "spec", "plain_stream", "spec_stream"]:
    exposed = med(n, "step_ms") - fb
    print("%-12s step / fwd+bwd = %.3f; exposed optimizer time %.1f ms = %.2f of the server's AdamW" % (n, med(n, "step_ms") / fb, exposed, exposed / adam))
for sfx in ["", "_stream"]:
    print("clip 0.01%s: spec / plain step = %.3f (every step rolled back), %.3f (speculate_every_step off)" % (sfx, med("spec_clip" + sfx, "step_ms") / med("plain_clip" + sfx, "step_ms"), med("spec_clip_held" + sfx, "step_ms") / med("plain_clip" + sfx, "step_ms")))
print("(with _stream the pull is the next forward's wait: inside 'forward', shown as 'pull')")
PY
