#!/usr/bin/env bash
# tests/run.sh - install missing dependencies, build, and run the whole test
# suite with ctest. Usage: ./tests/run.sh [extra ctest args, e.g. -R test_server]
# Environment: BUILD_DIR (default build), JOBS (default: CPU count).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
# Serial on purpose: integration tests start servers and time kills.
ctest --output-on-failure --timeout 900 "$@"
