#!/usr/bin/env bash
# blas_coretype.sh COREBIN TESTDIR TEST... - runs the GPT and engine tests
# again under a second OpenBLAS kernel family (ctest: test_blas_coretype).
#
# OpenBLAS picks its kernels for the CPU it runs on (SKYLAKEX on AVX-512,
# HASWELL or ZEN on AVX2, ...), and those sum a dot product in their own
# order. A test that holds two computations bitwise equal is only right if
# the two issue the same BLAS calls; one that passes on the kernels of the
# machine that wrote it may fail on another's. Running the BLAS-heavy tests
# under a second family in every run keeps that from coming back:
#   CPU with AVX-512 (default SKYLAKEX):  HASWELL
#   CPU with AVX2 (default HASWELL/ZEN):  SANDYBRIDGE (AVX, no FMA)
#   older:                                PRESCOTT (SSE3)
# ZS_BLAS_CORETYPE overrides the choice. COREBIN (tests/blas_corename.c)
# proves OpenBLAS took the forced type; if it did not (an OpenBLAS built
# without DYNAMIC_ARCH), the test is skipped with the reason (exit 77).
set -uo pipefail
corebin=$1
testdir=$2
shift 2
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
if [[ -n ${ZS_BLAS_CORETYPE:-} ]]; then
  type=$ZS_BLAS_CORETYPE
elif [[ " $flags " == *" avx512f "* ]]; then
  type=HASWELL
elif [[ " $flags " == *" avx2 "* ]]; then
  type=SANDYBRIDGE
else
  type=PRESCOTT
fi
native=$("$corebin")
got=$(OPENBLAS_CORETYPE=$type "$corebin")
echo "blas_coretype: native kernels $native; running under OPENBLAS_CORETYPE=$type (OpenBLAS: $got)"
if [[ ${got,,} != "${type,,}" ]]; then
  echo "SKIPPED: OpenBLAS did not take OPENBLAS_CORETYPE=$type (it chose $got): no second kernel family here"
  exit 77
fi
if [[ ${got,,} == "${native,,}" ]]; then
  echo "SKIPPED: $type is this CPU's own kernel family; set ZS_BLAS_CORETYPE to another"
  exit 77
fi
failed=()
for t in "$@"; do
  start=$SECONDS
  if (cd "$testdir" && OPENBLAS_CORETYPE=$type "./$t" >"$t.blas_coretype.log" 2>&1); then
    echo "ok   $t under $type ($((SECONDS - start)) s)"
  else
    echo "FAIL $t under $type ($((SECONDS - start)) s); its output:"
    tail -n 30 "$testdir/$t.blas_coretype.log"
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "blas_coretype: ${#failed[@]} of $# failed under $type: ${failed[*]}"
  exit 1
fi
echo "blas_coretype: all $# passed under $type"
