#!/usr/bin/env bash
# test_prometheus.sh - a real Prometheus (Debian's `prometheus` package)
# scrapes a zs-server and a zs-train run on loopback, and its HTTP API
# returns their step.
#
# Starts, all on 127.0.0.1 with free ports and state in one temp dir:
#  - zs-server --metrics 127.0.0.1:0 (address from --metrics-ready-file);
#  - mpirun -np 2 zs-train against it (optimizer on the server, a checkpoint
#    every 20 steps) with --metrics 127.0.0.1:0 on rank 0, told to run far
#    longer than the test and stopped by it;
#  - prometheus with a prometheus.yml scraping both every second, a temp
#    TSDB and a free web port.
# The server requires a bearer token; zs-ctl calls it once without one. Then
# asks Prometheus' API until both targets are up with no scrape error,
# zs_train_step and zs_server_step are above 0, the server's Push calls,
# checkpoints and the refused Hello (code UNAUTHENTICATED) are counted, and
# the metadata API reports the types docs/metrics.md gives. Last, a taken
# --metrics port stops zs-server (exit 1) and zs-train (exit 2) at start. Everything is killed and removed on exit; the whole
# test is bounded (about 12 s here; every wait ends 50 s after the start).
# Usage: test_prometheus.sh ZS_SERVER ZS_TRAIN ZS_CTL ZS_TOKENIZE MPIEXEC SOURCE_DIR
# Exit 0 pass, 1 fail, 77 skipped (the reason is printed). PROMETHEUS=path
# picks another prometheus binary.
set -euo pipefail
[ $# -eq 6 ] || { echo "usage: $0 zs-server zs-train zs-ctl zs-tokenize mpiexec source-dir" >&2; exit 2; }
SERVER=$1 TRAIN=$2 CTL=$3 TOKENIZE=$4 MPIEXEC=$5 SRC=$6
PROM=${PROMETHEUS:-$(command -v prometheus || true)}

skip() { echo "SKIPPED: $*"; exit 77; }
[ -n "$PROM" ] && [ -x "$PROM" ] ||
  skip "prometheus not installed (Debian package prometheus, ~20 MB download, ~100 MB installed; deploy/install-deps.sh installs it with the test group)"
command -v python3 >/dev/null || skip "python3 not installed (used to query Prometheus' API)"

T=$(mktemp -d /tmp/zs-prom-test.XXXXXX)
PIDS=()
dump_logs() {
  for f in "$T"/*.log; do
    [ -f "$f" ] || continue
    echo "---- $f (last 30 lines)"
    tail -n 30 "$f"
  done
}
fail() { echo "FAIL: $* (${SECONDS}s)"; dump_logs; exit 1; }
cleanup() {
  set +e
  for ((k = ${#PIDS[@]} - 1; k >= 0; k--)); do kill -TERM "${PIDS[k]}" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  wait 2>/dev/null
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND exited with $?"; dump_logs' ERR

# Every wait ends by LIMIT seconds after the start, so the test fails (and
# cleans up) within about a minute whatever hangs.
LIMIT=50
# until T: the smaller of SECONDS + T and LIMIT
until_() { local e=$((SECONDS + $1)); echo $((e < LIMIT ? e : LIMIT)); }

# wait_file F SECONDS: until F exists and is not empty
wait_file() {
  local f=$1 end
  end=$(until_ "$2")
  until [ -s "$f" ]; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.2
  done
}

# query EXPR: Prometheus' instant query; prints "value" of the first result
# (empty when there is none).
query() {
  python3 - "$WEB" "$1" <<'EOF'
import json, sys, urllib.parse, urllib.request
url = "http://%s/api/v1/query?query=%s" % (sys.argv[1], urllib.parse.quote(sys.argv[2]))
try:
    r = json.load(urllib.request.urlopen(url, timeout=5))
except Exception:
    sys.exit(0)
res = r.get("data", {}).get("result", [])
if r.get("status") == "success" and res:
    print(res[0]["value"][1])
EOF
}

# api PATH: GET http://$WEB/PATH (JSON) to stdout.
api() {
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen("http://%s/%s" % (sys.argv[1], sys.argv[2]), timeout=5).read().decode())' "$WEB" "$1"
}

# 1. data, server, trainer
cat "$SRC"/README.md "$SRC"/docs/*.md > "$T/text.txt"
"$TOKENIZE" -q -o "$T/data.tok" "$T/text.txt"
echo "prom-test-token-$$" > "$T/token"
ZS_LOG_LEVEL=warn "$SERVER" --listen 127.0.0.1:0 --data "$T/db" --threads 1 --token-file "$T/token" \
  --ready-file "$T/server.addr" --metrics 127.0.0.1:0 --metrics-ready-file "$T/server.metrics" \
  > "$T/server.log" 2>&1 &
PIDS+=($!)
wait_file "$T/server.metrics" 20 && wait_file "$T/server.addr" 20 || fail "zs-server did not start"
# zs-train's default config with speculative updates on (issue 18)
cat > "$T/spec.json" <<'JSON'
{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": true}}}
JSON
ZS_LOG_LEVEL=warn "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -np 2 \
  "$TRAIN" --data "$T/data.tok" --servers "$(cat "$T/server.addr")" --layers 2 --width 64 \
  --config "$T/spec.json" --steps 1000000 --ckpt-every 20 --log-every 100 --token-file "$T/token" \
  --metrics 127.0.0.1:0 --metrics-ready-file "$T/train.metrics" > "$T/train.log" 2>&1 &
PIDS+=($!)
wait_file "$T/train.metrics" 30 || fail "zs-train did not start its metrics endpoint"
echo "zs-server metrics on $(cat "$T/server.metrics"), zs-train on $(cat "$T/train.metrics") (${SECONDS}s)"
# one refused call: Hello without the token
if "$CTL" --servers "$(cat "$T/server.addr")" status > "$T/ctl.log" 2>&1; then
  fail "zs-ctl status without the token was not refused"
fi

# 2. prometheus, scraping both every second
WEB=127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$T/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: zs-server
    static_configs:
      - targets: ["$(cat "$T/server.metrics")"]
  - job_name: zs-train
    static_configs:
      - targets: ["$(cat "$T/train.metrics")"]
EOF
"$PROM" --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
  --web.listen-address="$WEB" --log.level=warn > "$T/prometheus.log" 2>&1 &
PIDS+=($!)

# 3. ask until both steps are there (or time is up)
end=$(until_ 40)
train_step="" server_step=""
while [ $SECONDS -lt $end ]; do
  train_step=$(query 'zs_train_step{job="zs-train"}')
  server_step=$(query 'zs_server_step{job="zs-server"}')
  if [ -n "$train_step" ] && [ -n "$server_step" ] &&
    python3 -c 'import sys; sys.exit(not (float(sys.argv[1]) > 0 and float(sys.argv[2]) > 0))' \
      "$train_step" "$server_step"; then
    break
  fi
  sleep 0.5
done
echo "prometheus: zs_train_step = ${train_step:-none}, zs_server_step = ${server_step:-none} (${SECONDS}s)"
[ -n "$train_step" ] || fail "Prometheus has no zs_train_step"
[ -n "$server_step" ] || fail "Prometheus has no zs_server_step"
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "$train_step" || fail "zs_train_step is $train_step"
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "$server_step" || fail "zs_server_step is $server_step"

# 4. both targets healthy (an exposition Prometheus cannot parse fails the scrape)
api api/v1/targets > "$T/targets.json"
python3 - "$T/targets.json" <<'EOF' || fail "targets not healthy: $(cat "$T/targets.json")"
import json, sys
t = json.load(open(sys.argv[1]))["data"]["activeTargets"]
jobs = {x["labels"]["job"]: x for x in t}
for job in ("zs-server", "zs-train"):
    x = jobs[job]
    print("target %s: health %s, last error '%s'" % (job, x["health"], x["lastError"]))
    assert x["health"] == "up" and x["lastError"] == "", job
EOF

# 5. more than the step: counted calls (and the refusal) and checkpoints, labels, types
pushes=$(query 'zs_server_calls_total{job="zs-server",method="Push",code="OK"}')
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "${pushes:-0}" || fail "Push calls: ${pushes:-none}"
unauth=$(query 'zs_server_calls_total{job="zs-server",method="Hello",code="UNAUTHENTICATED"}')
[ "${unauth:-0}" = 1 ] || fail "refused Hello calls: ${unauth:-none}, want 1"
end=$(until_ 15)
ckpts=""
while [ $SECONDS -lt $end ]; do
  ckpts=$(query 'zs_server_checkpoints_written_total{job="zs-server"}')
  python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "${ckpts:-0}" && break
  sleep 0.5
done
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "${ckpts:-0}" || fail "checkpoints: ${ckpts:-none}"
# speculation (super_offload in the trainer's config): the
# server updated chunks before their commits, and kept or rolled them back
specs=$(query 'zs_server_speculation_hits_total{job="zs-server"} + zs_server_speculation_rollbacks_total{job="zs-server"}')
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "${specs:-0}" || fail "speculative steps: ${specs:-none}"
mem=$(query 'sum(zs_train_memory_bytes{job="zs-train",space="device"})')
python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "${mem:-0}" || fail "train memory: ${mem:-none}"
echo "prometheus: Push OK calls $pushes, Hello UNAUTHENTICATED $unauth, checkpoints written $ckpts, speculative steps $specs, train device memory $mem bytes"
# 6. docs/metrics.md: its tables name exactly the metrics Prometheus saw,
# with their types, and its queries run
api 'api/v1/metadata' > "$T/metadata.json"
python3 - "$T/metadata.json" "$SRC/docs/metrics.md" "$WEB" <<'EOF' || fail "docs/metrics.md and the metrics disagree"
import json, re, sys, urllib.parse, urllib.request
md = {k: v[0]["type"] for k, v in json.load(open(sys.argv[1]))["data"].items()
      if k.startswith("zs_")}
doc = open(sys.argv[2]).read()
rows = dict(re.findall(r"^\| `(zs_[a-z_]+)` \| (counter|gauge) \|", doc, re.M))
missing = sorted(set(md) - set(rows))
extra = sorted(set(rows) - set(md))
wrong = sorted(k for k in md if k in rows and rows[k] != md[k])
print("metadata: %d zs_ metrics; docs/metrics.md defines %d" % (len(md), len(rows)))
assert not missing, "not in docs/metrics.md: %s" % missing
assert not extra, "in docs/metrics.md, not served: %s" % extra
assert not wrong, "types differ: %s" % ["%s %s vs %s" % (k, rows[k], md[k]) for k in wrong]
block = re.search(r"```promql\n(.*?)```", doc, re.S).group(1)
queries = [l for l in block.splitlines() if l.strip() and not l.startswith("#")]
for q in queries:
    url = "http://%s/api/v1/query?query=%s" % (sys.argv[3], urllib.parse.quote(q))
    try:
        r = json.load(urllib.request.urlopen(url, timeout=5))
    except Exception as e:
        raise SystemExit("query %r: %s" % (q, e))
    assert r["status"] == "success", (q, r)
print("docs/metrics.md: %d queries run" % len(queries))
EOF
# 7. an endpoint that cannot be served stops the program at start: a taken
# port (the running trainer's) for zs-server (exit 1) and zs-train (exit 2,
# one line from rank 0)
rc=0 rc2=0
"$SERVER" --listen 127.0.0.1:0 --data "$T/db2" --metrics "$(cat "$T/train.metrics")" \
  > "$T/server2.log" 2>&1 || rc=$?
ZS_LOG_LEVEL=warn "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -q -np 2 \
  "$TRAIN" --data "$T/data.tok" --steps 1 --metrics "$(cat "$T/server.metrics")" \
  > "$T/train2.log" 2>&1 || rc2=$?
[ $rc = 1 ] || fail "zs-server with a taken --metrics port: exit $rc, want 1"
grep -q "ERROR --metrics: cannot serve metrics on" "$T/server2.log" || fail "zs-server: no --metrics error line"
[ $rc2 = 2 ] || fail "zs-train with a taken --metrics port: exit $rc2, want 2"
n=$(grep -c "zs-train: --metrics error: cannot serve metrics on" "$T/train2.log" || true)
[ "$n" = 1 ] || fail "zs-train: $n --metrics error lines, want 1"
echo "taken --metrics port: zs-server exit 1, zs-train exit 2 with one error line"
echo "PASS (${SECONDS}s)"
