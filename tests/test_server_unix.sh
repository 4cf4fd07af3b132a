#!/usr/bin/env bash
# test_server_unix.sh ZS_SERVER ZS_CTL - zs-server --listen unix:PATH: it
# serves gRPC on the Unix socket, its --ready-file names that address
# (unix:PATH, not a port), and a client reaches it there (zs-ctl status
# answers: the model is not initialized yet).
set -uo pipefail
srv=$1 ctl=$2
T=$(mktemp -d /tmp/zs-test-unix-XXXXXX)
pid=
cleanup() { [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$srv" --listen "unix:$T/g.sock" --data "$T/d" --ready-file "$T/r" 2>"$T/log" &
pid=$!
for _ in $(seq 100); do [[ -s $T/r ]] && break; sleep 0.1; done
[[ -s $T/r ]] || { cat "$T/log"; fail "server did not start"; }
addr=$(cat "$T/r")
[[ $addr == "unix:$T/g.sock" ]] || fail "--ready-file says '$addr', want unix:$T/g.sock"
echo "ok: --ready-file names $addr"
out=$("$ctl" --servers "$addr" status 2>&1)
echo "$out" | grep -q "$addr" || fail "zs-ctl status over $addr: '$out'"
echo "ok: zs-ctl status reached the server over $addr"
echo "test_server_unix: OK"
