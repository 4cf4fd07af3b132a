#!/usr/bin/env bash
# tests/cuda_emu/breaks.sh - break our CUDA code on purpose, one break at a
# time, and check that the emulated GPU tests fail (issue 14's list).
#
#   tests/cuda_emu/breaks.sh [BUILD] [ASAN_BUILD]
#
# BUILD / ASAN_BUILD: configured emulator builds (cmake -DZS_CUDA_EMU=ON,
# the second with -DZS_SANITIZE=ON), default build/emu and build/emu-asan
# (made by the normal build). Each break edits one source file with sed,
# rebuilds the test that should catch it, runs it (under timeout), restores
# the file with `git checkout`, and prints BROKEN-AND-CAUGHT with the first
# failure line, or NOT CAUGHT. Needs a clean tree for the files it edits.
# BREAKS_ONLY=REGEX runs only the breaks whose name matches.
# Exit status: the number of breaks not caught. Takes a few minutes (one
# incremental rebuild and one test run per break).
set -u
cd "$(dirname "$0")/../.."
build=${1:-build/emu}
asan=${2:-build/emu-asan}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_rmaps_base_oversubscribe=1 ASAN_OPTIONS=detect_leaks=0:quarantine_size_mb=0
missed=0

# brk NAME FILE SED_EXPR BUILD_DIR TARGET SCHEDULES [RUN]: apply, rebuild,
# run, restore. RUN: a shell command running the test binary, named $BIN
# (default: "$BIN" alone), e.g. under mpirun.
brk() {
    local name=$1 file=$2 expr=$3 dir=$4 target=$5 schedules=$6 run=${7:-'"$BIN"'} out caught=0 s bin
    if [ -n "${BREAKS_ONLY:-}" ] && ! grep -qE "$BREAKS_ONLY" <<< "$name"; then return; fi
    git diff --quiet -- "$file" || { echo "breaks.sh: $file has local changes" >&2; exit 100; }
    sed -i "$expr" "$file"
    if git diff --quiet -- "$file"; then
        echo "== $name: the sed expression changed nothing (stale break)"; missed=$((missed + 1))
        return
    fi
    if ! make -C "$dir" "$target" > /tmp/breaks-build.log 2>&1; then
        echo "== $name: BROKEN-AND-CAUGHT at build time"; sed -n '/error/{p;q}' /tmp/breaks-build.log
        git checkout -q -- "$file"; return
    fi
    for s in $schedules; do
        bin=$(find "$dir" -name "$target" -type f -perm -u+x | head -1)
        out=$(BIN=$bin ZS_EMU_SCHEDULE=$s timeout 600 bash -c "$run" 2>&1)
        if [ $? -ne 0 ]; then
            caught=1
            echo "== $name: BROKEN-AND-CAUGHT by $target (ZS_EMU_SCHEDULE=$s)"
            grep -v "^ZS_NCCL_CHECK: " <<< "$out" | grep -m2 -E "FAIL|cuda-emu|ERROR|AddressSanitizer|runtime error" | cut -c1-300
            break
        fi
    done
    [ $caught = 1 ] || { echo "== $name: NOT CAUGHT ($target, schedules: $schedules)"; missed=$((missed + 1)); }
    git checkout -q -- "$file"
    make -C "$dir" "$target" > /dev/null 2>&1
}

V=kernels/cuda/zs_cuda_vec.cu
brk "missing __syncthreads in the sumsq tree reduction" $V \
    '/sh\[threadIdx.x\] = __dadd_rn(sh\[threadIdx.x\], sh\[threadIdx.x + s\]);/{n;s/__syncthreads();/;/}' \
    "$build" test_cuda_ops "forward reverse random:1"
brk "off-by-one in the grid-stride bound (i <= n)" kernels/cuda/zs_cuda_util.cuh \
    's/i < (n);/i <= (n);/' "$asan" test_cuda_ops "forward"
brk "wrong transpose flag in one GEMM (matmul backward dinp)" kernels/cuda/zs_cuda_gpt.cu \
    's/zs_cuda_gemm(stream, blas, 0, 1, N, IC, OC/zs_cuda_gemm(stream, blas, 0, 0, N, IC, OC/' \
    "$build" test_cuda_ops "forward"
brk "dropped event wait between two streams of the CUDA device" worker/dev/zs_dev_cuda.c \
    's/ZS_CUDA_CHECK(err, dev_of(zs)->device, HINT_STICKY, cudaStreamWaitEvent, s->h, e->h, 0);/ZS_OK;/' \
    "$build" test_dev_cuda "forward"
brk "a CUDA call inside a host function" worker/dev/zs_dev_cuda.c \
    's/^    hostcall_t \*h = p;$/    hostcall_t *h = p; (void)cudaGetLastError();/' \
    "$build" test_dev_cuda "forward"
brk "a shuffle with a partial warp (softmax block of 24 lanes per warp)" kernels/cuda/zs_cuda_attn.cu \
    's/ZS_CUDA_LAUNCH(fk, sm_blocks(rows), SM_WARPS \* 32,/ZS_CUDA_LAUNCH(fk, sm_blocks(rows), SM_WARPS * 32 - 8,/' \
    "$build" test_cuda_ops "forward"
brk "a buffer read after cudaFreeAsync on another stream without ordering" $V \
    's/cudaError_t ef = cudaFreeAsync(tmp, cs);/cudaError_t ef = cudaSuccess; (void)ef;/; s/    ZS_DISPATCH_ONE(k_sumsq_part, dt, k)/    cudaFreeAsync(tmp, cudaStreamPerThread);\n    ZS_DISPATCH_ONE(k_sumsq_part, dt, k)/' \
    "$build" test_cuda_ops "forward"

# Issue 15: our NCCL code (several emulated GPUs, MPI ranks)
N=worker/coll/zs_coll_nccl.c
NP2='ZS_EMU_DEVICES=2 ZS_EMU_NCCL_TIMEOUT=60 mpirun -np 2 --oversubscribe "$BIN" boot'
brk "wrong in-place offset (the rank's block without the element size)" $N \
    's/size_t block = count \* es \* (size_t)c->base.rank;/size_t block = count * (size_t)c->base.rank;/' \
    "$build" test_nccl_boot "random:5" "$NP2"
brk "a collective skipped on one rank (rank 1 drops its broadcasts)" $N \
    's/^    if (count == 0)$/    if (count == 0 || (kind == K_BC \&\& c->base.rank == 1))/' \
    "$build" test_nccl_boot "random:5" "$NP2"
brk "a group left open (ncclGroupEnd not called)" $N \
    's/r_end = ncclGroupEnd(); \/\* always closes/r_end = ncclSuccess; \/\* never closes/' \
    "$build" test_nccl_boot "random:5" "$NP2"
brk "a missing settle of ncclInProgress after a collective" $N \
    '/ncclResult_t r = issue(c, \&k, \&call);/,+2s/r = zs__nccl_settle(c);/r = ncclSuccess;/' \
    "$build" test_nccl_boot "random:5" "$NP2"
brk "a watchdog that never aborts" worker/coll/zs_coll_nccl_watchdog.c \
    '/^static void \*watchdog_main/,/^}/s/if (check_once(c, \&fire))/if (0 \&\& check_once(c, \&fire))/' \
    "$build" test_nccl_boot "random:5" "$NP2"
brk "zs_coll_sync without asking ncclCommGetAsyncError (a dead peer's all-reduce looks done)" \
    worker/coll/zs_coll.c 's/if (rc == ZS_OK \&\& c->vt->sync_check)$/if (0)/' \
    "$build" test_nccl "forward" 'ZS_EMU_DEVICES=2 ZS_EMU_NCCL_CHUNK=16384 "$BIN" kill 2'

# The emulated NCCL's point-to-point (tests/cuda_emu/emu_nccl_p2p.c): each
# ncclSend/ncclRecv recorded with its peer shifted by one must fail its own
# test (README "Breaks seen failing" lists the others, run by hand).
brk "p2p: ncclSend/ncclRecv record the peer shifted by one (emulator)" tests/cuda_emu/emu_nccl_p2p.c \
    's/\.root = peer, \.count = count}/.root = (peer + 1) % c->nranks, .count = count}/' \
    "$build" test_emu_nccl_p2p "forward" 'ZS_EMU_NCCL_TIMEOUT=60 mpirun -np 4 --oversubscribe "$BIN"'

# Issue 26: the fused (flash) attention, caught by test_cuda_attn (its
# small cases and the masked-block checks, about 10 s a run)
F=kernels/cuda/zs_cuda_flash.cu
ATTN='"$BIN" small skip'
# The forward's __syncthreads after its K / V tile loads, dropped, is NOT
# caught under forward, reverse and random:1 (2026-11-28): those schedules
# complete a warp operation only once every thread of the block has
# stopped, so each thread's stores before its first wmma call are always
# done (README, "What it cannot tell"). ZS_EMU_SCHEDULE=eager completes a
# warp operation per warp (README, "The eager schedule"), so a warp's
# loads come before later warps' stores: it catches the break. The barrier
# before the next Q / dO tile is caught by every schedule (the diagonal
# tile gives the warps different numbers of wmma calls), eager included.
brk "flash: missing __syncthreads after the forward's K / V tile loads" $F \
    '/^    k_flash_fwd(/,/^}/{/fl_load_tile(Vs, lde, base + 2 \* C, ld, k0, T, hs);/{n;s|__syncthreads();|; /* (break) */|}}' \
    "$build" test_cuda_attn "eager" "$ATTN"
brk "flash: missing __syncthreads before the next Q / dO tile (backward dK dV)" $F \
    's|__syncthreads(); /\* the previous tile.s Q / dO reads are done \*/|; /* (break) */|' \
    "$build" test_cuda_attn "forward reverse random:1" "$ATTN"
brk "flash: causal mask off by one (forward: key q + 1 attended)" $F \
    's/k0 + lane <= q/k0 + lane <= q + 1/g; s/k0 + lane + 32 <= q/k0 + lane + 32 <= q + 1/g' \
    "$build" test_cuda_attn "forward" "$ATTN"
brk "flash: causal mask off by one (backward dK dV: the diagonal dropped)" $F \
    's/if (q < T \&\& key <= q)/if (q < T \&\& key < q)/g' \
    "$build" test_cuda_attn "forward" "$ATTN"
brk "flash: an accumulator fragment's x[] read as if row-major by lane (layout unspecified)" $F \
    '/^static __device__ void fl_mm_abt/,/^}/s/wmma::store_matrix_sync(c + nt \* 16, acc, (unsigned)ldc, wmma::mem_row_major);/for (int i_ = 0; i_ < acc.num_elements; i_++) c[nt * 16 + ((threadIdx.x \& 31) * 8 + i_) \/ 16 * ldc + ((threadIdx.x \& 31) * 8 + i_) % 16] = acc.x[i_];/' \
    "$build" test_cuda_attn "forward" "$ATTN"
brk "flash: matrix_b loaded col_major where it is row-major (p v, dS k)" $F \
    '/^static __device__ void fl_mm_acc/,/^}/s/wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> fb;/wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> fb;/' \
    "$build" test_cuda_attn "forward" "$ATTN"
brk "flash: masked key blocks of the diagonal tile multiplied (forward, p masked after)" $F \
    '/^    k_flash_fwd(/,/^}/s/int nkb = kt == qt ? w + 1 : FL_BK \/ 16;/int nkb = FL_BK \/ 16;/' \
    "$build" test_cuda_attn "forward" "$ATTN"
brk "flash: masked query blocks of the diagonal tile multiplied (backward dK dV)" $F \
    's/int nq0 = qt == kt ? w : 0;/int nq0 = 0;/' \
    "$build" test_cuda_attn "forward" "$ATTN"

echo "breaks.sh: $missed break(s) not caught"
exit $missed
