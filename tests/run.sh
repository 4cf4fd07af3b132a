#!/usr/bin/env bash
# tests/run.sh - install missing dependencies, build, and run the whole test
# suite with ctest (34-36 minutes on 2 cores, plus the build).
# Usage: ./tests/run.sh [--quick] [extra ctest args, e.g. -R test_server]
#   --quick  the smoke subset only (ctest label "quick": the unit tests, one
#            server integration test, one emulated-GPU test; under 3 minutes
#            once built; tests/quick.cmake lists it)
# Environment: BUILD_DIR (default build), JOBS (default: CPU count).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=()
if [[ ${1:-} == --quick ]]; then
  quick=(-L quick)
  shift
fi
./deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
# What the suite leaves behind is judged from here on (test_shm_leftovers):
# leftovers of runs killed before this one are not this run's.
touch .suite-start
export ZS_SUITE_START=$PWD/.suite-start
# Serial on purpose: integration tests start servers and time kills.
ctest --output-on-failure --timeout 900 "${quick[@]}" "$@"
