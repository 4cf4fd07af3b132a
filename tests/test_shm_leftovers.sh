#!/usr/bin/env bash
# test_shm_leftovers.sh - runs last in the suite: no shared-memory segment
# and no shared-memory socket of zeroshard outlives the tests.
#   1. No process maps a segment: zs_shm_create names its memfds "zs-shm",
#      which /proc/PID/maps shows as "/memfd:zs-shm (deleted)". A memfd
#      lives exactly as long as a process holds it, so a segment left over
#      means a server or worker a test started is still running.
#   2. No socket file of a server that is gone: a shm.sock under /tmp (where
#      the tests keep their data directories) with no listener behind it is
#      a temp directory a test did not clean up after killing its server.
# Skipped (exit 77) with ZS_TEST_KEEP set, which keeps the tests' temp
# directories on purpose.
set -uo pipefail
if [[ -n ${ZS_TEST_KEEP:-} ]]; then
  echo "SKIPPED: ZS_TEST_KEEP is set: the tests keep their temp directories"
  exit 77
fi
bad=0
for maps in /proc/[0-9]*/maps; do
  pid=${maps#/proc/}
  pid=${pid%/maps}
  [[ $pid == "$$" ]] && continue
  if grep -q '/memfd:zs-shm' "$maps" 2>/dev/null; then
    echo "FAIL: process $pid ($(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-120)) still maps a zeroshard segment"
    bad=1
  fi
done
while IFS= read -r sock; do
  if ! python3 - "$sock" <<'PY' 2>/dev/null; then
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(1)
s.connect(sys.argv[1])
PY
    echo "FAIL: $sock: a shared-memory socket with no server behind it (a test left its temp dir)"
    bad=1
  fi
done < <(find /tmp -maxdepth 5 -name shm.sock -type s 2>/dev/null)
if ((bad)); then
  exit 1
fi
echo "test_shm_leftovers: no process maps a zs-shm segment, no stale shm.sock under /tmp"
