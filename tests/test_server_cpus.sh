#!/usr/bin/env bash
# test_server_cpus.sh ZS_SERVER - zs-server --cpus LIST: every thread of the
# server (optimizer pool, gRPC, store) may run on exactly the listed CPUs,
# and the log names them with one optimizer thread per CPU; a CPU the
# process may not use, or a malformed list, is refused at start (exit 2)
# with the reason. One CPU is used where the machine has only one.
set -uo pipefail
srv=$1
T=$(mktemp -d /tmp/zs-test-cpus-XXXXXX)
pid=
cleanup() { [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
allowed=$(grep Cpus_allowed_list /proc/self/status | awk '{print $2}')
want=$(python3 -c "import os; print(max(os.sched_getaffinity(0)))")
"$srv" --listen 127.0.0.1:0 --data "$T/d" --cpus "$want" --ready-file "$T/r" 2>"$T/log" &
pid=$!
for _ in $(seq 100); do [[ -s $T/r ]] && break; sleep 0.1; done
[[ -s $T/r ]] || { cat "$T/log"; fail "server did not start"; }
n=0
for st in /proc/$pid/task/*/status; do
  got=$(awk '/Cpus_allowed_list/ {print $2}' "$st")
  [[ $got == "$want" ]] || fail "thread $(basename "$(dirname "$st")") may run on $got, want $want"
  n=$((n + 1))
done
grep -q "running on CPUs $want (--cpus), 1 optimizer threads" "$T/log" ||
  { cat "$T/log"; fail "the log does not name the CPUs"; }
echo "ok: all $n threads of zs-server --cpus $want run on CPU $want only (allowed here: $allowed)"
kill "$pid"
wait "$pid" 2>/dev/null
pid=
for bad in "99999" "1,x" "3-1" ""; do
  out=$("$srv" --listen 127.0.0.1:0 --data "$T/d" --cpus "$bad" 2>&1)
  rc=$?
  [[ $rc == 2 && $out == *"--cpus"* ]] || fail "--cpus '$bad': exit $rc, '$out' (want exit 2 with the reason)"
  echo "ok: --cpus '$bad' refused: $out"
done
echo "test_server_cpus: OK"
