#!/usr/bin/env bash
# test_slurm.sh - deploy/slurm/zeroshard.sbatch on a real Slurm cluster of two
# nodes on this machine, started and torn down by this test.
#
# Brings up munged (key generated here), slurmctld and two slurmd (nodes n0
# and n1 on 127.0.0.1, free ports, all state, spool, logs in one temp dir;
# proctrack/linuxproc, task/none: no cgroups needed), then submits the
# quickstart-sized job (GPT 4 layers x width 128, ctx 64, ZeRO stage 2, AdamW
# on the servers) four times against one data directory:
#  1. plain job on 2 nodes, 2 servers (one per node), 2 workers (srun
#     --mpi=pmix), steps 1..100, checkpoint every 10. Once a checkpoint is
#     complete on both servers the test requeues the running job (scontrol
#     requeue); the rerun (SLURM_RESTART_COUNT=1) must resume from that
#     checkpoint and reach step 100, with the loss going down. (The requeue
#     must land before step 100: a few seconds at ~0.1 s per step here; the
#     test says so when a machine is too fast for that.)
#  2. heterogeneous job (servers in component 0 on one node, 2 workers in
#     component 1): a new submission to step 110 must resume from 100.
#  3. plain job, ZS_LAUNCHER=mpirun, 1 worker: resume 110 -> 120 (elastic).
#  4. a server that cannot start (bad flag): the job fails at once, no training.
# The servers require a bearer token throughout (ZS_SERVER_ARGS, ZS_CTL_ARGS).
# Does not test: multi-host networking, node-local storage, preemption.
# Usage: test_slurm.sh ZS_SERVER ZS_TRAIN ZS_CTL ZS_TOKENIZE SOURCE_DIR
# Exit 0 pass, 1 fail, 77 skipped (the reason is printed).
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 zs-server zs-train zs-ctl zs-tokenize source-dir" >&2; exit 2; }
SERVER=$1 TRAIN=$2 CTL=$3 TOKENIZE=$4 SRC=$5

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; dump_logs; exit 1; }
step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

for b in munged mungekey slurmctld slurmd sbatch srun scontrol squeue sinfo; do
  command -v $b >/dev/null || skip "$b not installed (deploy/install-deps.sh installs munge, slurmctld, slurmd, slurm-client)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start job steps (it switches to the job's user); run as root"
compgen -G '/usr/lib/*/slurm-wlm/mpi_pmix*.so' >/dev/null ||
  skip "Slurm's PMIx plugin (mpi_pmix*.so, package slurmd) not found"

T=$(mktemp -d /tmp/zs-slurm-test.XXXXXX)
chmod 755 "$T"
PIDS=()
JOBS=()
# a test run inside a Slurm job must not hand that job's variables on
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)
export SLURM_CONF=$T/slurm.conf

dump_logs() {
  for f in "$T"/log/*.log "$T"/work/*.out "$T"/work/zs-run/*/servers.log; do
    [ -f "$f" ] || continue
    echo "---- $f (last 40 lines)"
    tail -n 40 "$f"
  done
}

cleanup() {
  set +e
  if [ ${#JOBS[@]} -gt 0 ]; then
    scancel "${JOBS[@]}" 2>/dev/null
    # let the job steps (and the zs-server processes in them) end before
    # slurmd goes away; KillWait is 5 s below
    for _ in $(seq 40); do
      [ -z "$(squeue -h -j "$(IFS=,; echo "${JOBS[*]}")" 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for ((k = ${#PIDS[@]} - 1; k >= 0; k--)); do kill -TERM "${PIDS[k]}" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  wait 2>/dev/null
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND exited with $?"; dump_logs' ERR

free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

step "munge"
mkdir -p "$T/munge" "$T/mungekey" "$T/state" "$T/spool/n0" "$T/spool/n1" "$T/tmp/n0" "$T/tmp/n1" "$T/log" "$T/work" "$T/bin"
chmod 700 "$T/mungekey"
mungekey -c -k "$T/mungekey/munge.key"
munged -F --force -S "$T/munge/sock" --key-file="$T/mungekey/munge.key" \
  --log-file="$T/log/munged.log" --pid-file="$T/munge/pid" --seed-file="$T/munge/seed" \
  >>"$T/log/munged.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do [ -S "$T/munge/sock" ] && break; sleep 0.1; done
munge -S "$T/munge/sock" -n | unmunge -S "$T/munge/sock" >/dev/null || fail "munged does not answer"

step "slurm.conf, slurmctld, 2 x slurmd"
read -r PCTLD PD0 PD1 < <(free_ports 3)
H=$(hostname -s)
# 4 CPUs per node declared (config_overrides: not checked against the 2
# real ones) so both the workers and the servers' step fit.
cat >"$SLURM_CONF" <<EOF
ClusterName=zstest
SlurmctldHost=$H(127.0.0.1)
SlurmctldPort=$PCTLD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's restart (default 120 s)
AuthInfo=socket=$T/munge/sock,cred_expire=5
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
# per node: srun --mpi=pmix puts spmix_appdir_JOB.STEP there, and two slurmd
# on one host would collide in /tmp
TmpFS=$T/tmp/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MailProg=/bin/true
MpiDefault=none
# heterogeneous jobs are scheduled only by the backfill scheduler
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1,sched_min_interval=100000
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
NodeName=n0 NodeHostname=$H NodeAddr=127.0.0.1 Port=$PD0 CPUs=4 RealMemory=1000
NodeName=n1 NodeHostname=$H NodeAddr=127.0.0.1 Port=$PD1 CPUs=4 RealMemory=1000
PartitionName=zs Nodes=n0,n1 Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -c >>"$T/log/slurmctld.out.log" 2>&1 &
PIDS+=($!)
for n in n0 n1; do
  slurmd -D -N $n >>"$T/log/slurmd-$n.out.log" 2>&1 &
  PIDS+=($!)
done
for _ in $(seq 100); do
  st=$(sinfo -h -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')
  [ "$st" = "idle " ] && break
  sleep 0.2
done
[ "$st" = "idle " ] || {
  grep -h -i error "$T"/log/slurmd-n0*.log | head -5
  skip "slurmd nodes did not become idle here (state: '${st:-none}'); see the errors above"
}
srun -N2 -n2 true || fail "srun on two nodes failed"

step "corpus, job environment"
ln -s "$SERVER" "$T/bin/zs-server"
ln -s "$TRAIN" "$T/bin/zs-train"
ln -s "$CTL" "$T/bin/zs-ctl"
"$TOKENIZE" -o "$T/corpus.tok" "$(find /usr/share/common-licenses -maxdepth 1 -name 'GPL-3')" \
  "$(find /usr/share/common-licenses -maxdepth 1 -name 'Apache-2.0')" >/dev/null
export ZS_BIN=$T/bin ZS_DATA_DIR=$T/data ZS_LISTEN_HOST=127.0.0.1 ZS_SERVER_ADDR_CMD="echo 127.0.0.1"
# the servers require a bearer token: the script's zs-ctl calls (ZS_CTL_ARGS)
# and zs-train (its arguments) must pass it
echo "zs-test-token-$RANDOM$RANDOM" >"$T/token"
export ZS_GPT_THREADS=1 ZS_LOG_LEVEL=info ZS_SERVER_ARGS="--threads 1 --token-file $T/token"
export ZS_CTL_ARGS="--token-file $T/token"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS=(--data "$T/corpus.tok" --config "$SRC/deploy/ds_quickstart.json" --layers 4 --heads 4
  --width 128 --ctx 64 --ckpt-every 10 --log-every 5 --csv "$T/train.csv" --token-file "$T/token")
SBATCH=(sbatch --parsable --chdir="$T/work" --output="$T/work/job-%j.out")

jobstate() { scontrol -o show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -1 | cut -d= -f2; }
restarts() { scontrol -o show job "$1" 2>/dev/null | grep -o 'Restarts=[0-9]*' | head -1 | cut -d= -f2; }
# wait_done JOB SECONDS: until the job is COMPLETED; fail on any other end
wait_done() {
  local s
  for _ in $(seq $(($2 * 4))); do
    s=$(jobstate "$1")
    case "$s" in
      COMPLETED) return 0 ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        fail "job $1 ended $s" ;;
    esac
    sleep 0.25
  done
  fail "job $1 not done after $2 s (state $s)"
}
newest_ckpt() {
  local f=$T/work/zs-run/$1/servers
  [ -s "$f" ] || return 0
  "$CTL" --servers "$(cat "$f")" --token-file "$T/token" checkpoints 2>/dev/null |
    sed -n 's/^complete on all [0-9]* servers: *//p' | awk '$0 != "none" { print $NF }'
}
# servers_stopped JOB N: the job's N servers ended on SIGTERM, not killed
servers_stopped() {
  local f=$T/work/zs-run/$1/servers.log n
  n=$(grep -c 'stopped$' "$f" || true)
  [ "$n" = "$2" ] || fail "job $1: $n of $2 servers stopped gracefully (see $f)"
  ! grep -q 'Killed' "$f" || fail "job $1: a server task was killed (see $f)"
}
# csv_loss STEP: loss column of the last CSV row of that step
csv_loss() { awk -F, -v s="$1" '$1 == s { l = $2 } END { print l }' "$T/train.csv"; }

step "submission 1: 2 nodes, 2 servers, 2 workers (srun --mpi=pmix), steps 1..100; requeue after a checkpoint"
J1=$("${SBATCH[@]}" -N 2 --ntasks-per-node=1 "$SRC/deploy/slurm/zeroshard.sbatch" "${ARGS[@]}" --steps 100)
JOBS+=("$J1")
ck=
for _ in $(seq 240); do
  ck=$(newest_ckpt "$J1" || true)
  [ -n "$ck" ] && break
  case "$(jobstate "$J1")" in PENDING | RUNNING | CONFIGURING) ;; *) break ;; esac
  sleep 0.25
done
[ -n "$ck" ] || fail "no checkpoint from job $J1 (state $(jobstate "$J1"), waited up to 60 s)"
[ "$ck" -lt 100 ] || fail "job $J1 reached its last step before the requeue (checkpoint $ck): the machine is too slow for this test"
echo "checkpoint $ck complete on both servers: requeueing job $J1"
scontrol requeue "$J1"
# a requeued job waits cred_expire seconds before it may start again
wait_done "$J1" 90
out1=$T/work/job-$J1.out
servers_stopped "$J1" 2
[ "$(restarts "$J1")" = 1 ] || fail "job $J1: Restarts=$(restarts "$J1"), expected 1"
grep -q "job $J1 restart 1:" "$out1" || fail "the rerun did not see SLURM_RESTART_COUNT=1"
r=$(sed -n 's/.*resuming from checkpoint \([0-9]*\).*/\1/p' "$out1" | tail -1)
{ [ -n "$r" ] && [ "$r" -ge "$ck" ] && [ "$r" -lt 100 ]; } || fail "job $J1 after requeue did not resume from checkpoint >= $ck (got '${r}')"
grep -q "done: steps $((r + 1))..100" "$out1" || fail "job $J1 after requeue did not train steps $((r + 1))..100"
grep -q "resumed from checkpoint $r" "$out1" || fail "zs-train did not report resuming from $r"
l1=$(csv_loss 1) l100=$(csv_loss 100)
echo "job $J1: requeued after checkpoint $ck, resumed from $r; loss step 1 $l1 -> step 100 $l100"
awk -v a="$l1" -v b="$l100" 'BEGIN { exit !(b < a - 0.5) }' || fail "loss did not fall by 0.5 over 100 steps ($l1 -> $l100)"

step "submission 2: heterogeneous (servers: component 0, workers: component 1), resume 100 -> 110"
J2=$(ZS_SERVERS=2 "${SBATCH[@]}" -N 1 -n 1 : -N 1 -n 2 "$SRC/deploy/slurm/zeroshard.sbatch" "${ARGS[@]}" --steps 110)
JOBS+=("$J2")
wait_done "$J2" 60
out2=$T/work/job-$J2.out
servers_stopped "$J2" 2
grep -q "heterogeneous job" "$out2" || fail "job $J2 did not run as a heterogeneous job"
grep -q "resuming from checkpoint 100" "$out2" || fail "job $J2 did not resume from checkpoint 100"
grep -q "done: steps 101..110" "$out2" || fail "job $J2 did not train steps 101..110"
grep -q "W=2" "$out2" || fail "job $J2 did not run 2 workers"

step "submission 3: mpirun launcher, 1 worker (elastic), resume 110 -> 120"
J3=$(ZS_LAUNCHER=mpirun ZS_WORKERS=1 ZS_MPIRUN_ARGS="--bind-to none" \
  "${SBATCH[@]}" -N 2 --ntasks-per-node=1 "$SRC/deploy/slurm/zeroshard.sbatch" "${ARGS[@]}" --steps 120)
JOBS+=("$J3")
wait_done "$J3" 60
out3=$T/work/job-$J3.out
servers_stopped "$J3" 2
grep -q "resuming from checkpoint 110" "$out3" || fail "job $J3 did not resume from checkpoint 110"
grep -q "done: steps 111..120" "$out3" || fail "job $J3 did not train steps 111..120"
grep -q "W=1" "$out3" || fail "job $J3 did not run 1 worker"
l120=$(csv_loss 120)
echo "loss: step 1 $l1, step 100 $l100, step 120 $l120"

step "submission 4: a server that cannot start fails the job at once"
J4=$(ZS_SERVER_ARGS="--no-such-flag" "${SBATCH[@]}" -N 2 --ntasks-per-node=1 \
  "$SRC/deploy/slurm/zeroshard.sbatch" "${ARGS[@]}" --steps 130)
JOBS+=("$J4")
for _ in $(seq 120); do
  case "$(jobstate "$J4")" in PENDING | RUNNING | CONFIGURING | COMPLETING | "") sleep 0.25 ;; *) break ;; esac
done
[ "$(jobstate "$J4")" = FAILED ] || fail "job $J4: state $(jobstate "$J4"), expected FAILED"
grep -q "did not start" "$T/work/job-$J4.out" || fail "job $J4 did not report the server that failed"
! grep -q "steps 121" "$T/work/job-$J4.out" || fail "job $J4 trained without its servers"

echo "PASS test_slurm in ${SECONDS}s"
