#!/usr/bin/env bash
# test_k8s.sh - deploy/k8s without a cluster: what can be checked offline,
# and the parts of the manifests that are programs, run for real.
#  1. yamllint -s with deploy/k8s/.yamllint (all files).
#  2. kubectl kustomize deploy/k8s renders (when a kubectl is installed;
#     kubectl's apply/create --dry-run=client need an API server for
#     discovery and OpenAPI, so they are not used).
#  3. tests/k8s_check.py: schema (python3-kubernetes models) and wiring.
#  4. The StatefulSet's zs-server args (listen/data pointed at loopback and a
#     temp dir) start 2 servers; its readiness probe command passes against
#     a running server and fails against a stopped one; the ConfigMap's
#     train.sh with its ds.json trains 2 workers (the Job's ZS_MPIRUN_ARGS) and
#     a second run resumes from the checkpoint; SIGTERM stops a server with
#     exit status 0 (what the pod's grace period waits for).
# Not checked: scheduling, PVC binding, DNS of the headless Service, GPUs,
# the container image (no cluster or container runtime here).
# Usage: test_k8s.sh ZS_SERVER ZS_TRAIN ZS_CTL ZS_TOKENIZE SOURCE_DIR
# Exit 0 pass, 1 fail, 77 skipped (reason printed).
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 zs-server zs-train zs-ctl zs-tokenize source-dir" >&2; exit 2; }
SERVER=$1 TRAIN=$2 CTL=$3 TOKENIZE=$4 SRC=$5
K8S=$SRC/deploy/k8s
PY=/usr/bin/python3

fail() { echo "FAIL: $*"; exit 1; }
step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

command -v yamllint >/dev/null || { echo "SKIPPED: yamllint not installed (deploy/install-deps.sh installs it)"; exit 77; }
T=$(mktemp -d /tmp/zs-k8s-test.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND exited with $?"' ERR

step "yamllint"
yamllint -s -c "$K8S/.yamllint" "$K8S"
echo "yamllint: $(find "$K8S" -name '*.yaml' | wc -l) files clean"

step "kubectl kustomize"
if command -v kubectl >/dev/null; then
  kubectl kustomize "$K8S" >"$T/all.yaml"
  n=$(grep -c '^kind:' "$T/all.yaml")
  [ "$n" = 4 ] || fail "kustomize rendered $n objects, expected 4"
  echo "kubectl kustomize: $n objects ($(kubectl version --client 2>/dev/null | head -1))"
else
  echo "kubectl not installed: kustomization not rendered"
fi

step "schema and wiring (k8s_check.py)"
rc=0
$PY "$SRC/tests/k8s_check.py" "$K8S" "$T/x" || rc=$?
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || fail "k8s_check.py found problems"

step "the StatefulSet's zs-server command: 2 servers"
mkdir -p "$T/bin"
ln -s "$SERVER" "$T/bin/zs-server"
ln -s "$TRAIN" "$T/bin/zs-train"
ln -s "$CTL" "$T/bin/zs-ctl"
export PATH=$T/bin:$PATH
mapfile -t SARGS <"$T/x/server.args"
declare -a ADDR
for i in 0 1; do
  a=("${SARGS[@]}")
  for k in "${!a[@]}"; do
    case "${a[k]}" in
      --listen) a[k + 1]=127.0.0.1:0 ;;
      --data) a[k + 1]=$T/data/zs-server-$i ;;
    esac
  done
  zs-server "${a[@]}" --ready-file "$T/s$i.addr" >"$T/server$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1; do
  for _ in $(seq 100); do [ -s "$T/s$i.addr" ] && break; sleep 0.1; done
  [ -s "$T/s$i.addr" ] || fail "server $i did not start: $(cat "$T/server$i.log")"
  ADDR[i]=$(cat "$T/s$i.addr")
done
SERVERS="${ADDR[0]},${ADDR[1]}"
echo "servers $SERVERS (args: ${SARGS[*]})"

step "readiness probe command"
mapfile -t PROBE <"$T/x/probe.cmd"
probe() { # probe HOST:PORT: the probe's command aimed at that address
  local p=("${PROBE[@]}")
  for k in "${!p[@]}"; do [[ "${p[k]}" == 127.0.0.1:* ]] && p[k]=$1; done
  "${p[@]}" >/dev/null 2>&1
}
probe "${ADDR[0]}" || fail "readiness probe fails against a running server"
probe "${ADDR[1]}" || fail "readiness probe fails against a running server"
# a port that was just free: nothing listens there
dead=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if probe "127.0.0.1:$dead"; then fail "readiness probe passes with no server"; fi
echo "probe: ready on both servers, not ready on 127.0.0.1:$dead"

step "the ConfigMap's train.sh and ds.json: 2 workers, then resume"
"$TOKENIZE" -o "$T/corpus.tok" /usr/share/common-licenses/GPL-3 >/dev/null
MPIARGS=$(sed -n 's/^ZS_MPIRUN_ARGS=//p' "$T/x/job.env")
MPIARGS="$MPIARGS --oversubscribe"
[ "$(id -u)" -ne 0 ] || MPIARGS="$MPIARGS --allow-run-as-root"
run_train() { # run_train STEPS LOG
  ZS_SERVERS=$SERVERS ZS_WORKERS=2 ZS_CONFIG=$T/x/ds.json ZS_MPIRUN_ARGS=$MPIARGS \
    ZS_GPT_THREADS=1 ZS_LOG_LEVEL=warn ZS_WAIT_TIMEOUT=30 \
    ZS_TRAIN_ARGS="--data $T/corpus.tok --layers 2 --heads 2 --width 64 --ctx 32 --steps $1 --ckpt-every 3 --log-every 1" \
    bash "$T/x/train.sh" >"$2" 2>&1 || { cat "$2"; fail "train.sh exited with an error"; }
}
run_train 6 "$T/train1.log"
grep -q "done: steps 1..6" "$T/train1.log" || { cat "$T/train1.log"; fail "first run did not train steps 1..6"; }
! grep -q "resuming" "$T/train1.log" || fail "first run resumed from nothing"
grep -q "W=2" "$T/train1.log" || fail "first run did not have 2 workers"
grep -q "^config [0-9a-f]*: .* bf16.enabled=true " "$T/train1.log" || fail "ds.json's bf16 not used"
run_train 9 "$T/train2.log"
grep -q "train.sh: resuming from checkpoint 6" "$T/train2.log" || { cat "$T/train2.log"; fail "second run did not resume from 6"; }
grep -q "done: steps 7..9" "$T/train2.log" || { cat "$T/train2.log"; fail "second run did not train 7..9"; }
grep -h "^done:" "$T/train1.log" "$T/train2.log"

step "SIGTERM: graceful stop"
for i in 0 1; do
  kill -TERM "${PIDS[i]}"
  rc=0
  wait "${PIDS[i]}" || rc=$?
  PIDS[i]=
  [ $rc = 0 ] || fail "server $i exited with $rc on SIGTERM"
done
echo "both servers exited 0 on SIGTERM"
echo "PASS test_k8s in ${SECONDS}s"
