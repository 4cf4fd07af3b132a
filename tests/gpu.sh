#!/usr/bin/env bash
# tests/gpu.sh - build and run every GPU check of zeroshard and the GPU
# benchmark, and write the figures to a results file. One command on each
# side:
#
#   here (a Debian 12 dev machine with nvcc, no GPU needed):
#     tests/gpu.sh pack [.gpu-carry]           # .gpu-carry/ is in .gitignore
#   builds the GPU binaries (build dir $ZS_BUILD, default build/: the GPU
#   tests, zs-train, zs-server, bench_gpt), copies them without debug
#   sections to .gpu-carry/bin, and fetches with `apt-get download` the
#   Debian packages of every shared library they load that a GPU machine
#   lacks: found with ldd on the binaries and dpkg -S (libc, libstdc++,
#   libgcc and zlib are left to the machine; CUDA's libraries are the
#   machine's), plus Open MPI's launcher and plugins and what they need
#   (libpmix, libmunge). About 31 MiB; the script refuses to pack more than
#   64 MiB. ZS_PACK_NO_BUILD=1 packs what is built without building.
#
#   and, still here, as root:
#     tests/gpu.sh check [.gpu-carry]
#   checks that the carry is self-contained (tests/gpu_carry_check.sh; ctest
#   test_gpu_carry packs and checks a temporary one): in a private mount
#   namespace with every file of the carried packages hidden, the carried
#   binaries must load (ldd) with only the carry, CUDA and glibc/libstdc++/
#   libgcc_s/libz, `run` must end each step PASS or SKIP, and the carried
#   orterun -np 2 zs-train --device cpu must train against the carried
#   zs-server. Nothing runs on a GPU; `tests/gpu.sh env` prints the
#   environment `run` sets, for such scripts.
#
#   With LLMC=DIR (a checkout of karpathy/llm.c, fetched by hand, never
#   committed), pack also builds llm.c's train_gpt2cu here with nvcc (its
#   Makefile, bf16, sm_90, no cuDNN, MPI, NCCL, OpenMP or NVML, and its
#   managed-memory fallback replaced by an error: see llmc_build) into
#   .gpu-carry/llmc/, with llm.c data shards of random GPT-2 token ids.
#
#   there (a machine with a GPU, CUDA 13 and a driver, no package registry):
#     tests/gpu.sh run [.gpu-carry] [--out FILE] [--only PART[,PART...]]
#   (PART: all, tests, bench, shm, fit, llmc, issue, xfer, prof, flash,
#   offload, model; several parts run in one call, in run()'s order)
#   unpacks the .deb files with `dpkg -x` under .gpu-carry/root (never into
#   /), sets LD_LIBRARY_PATH, OPAL_PREFIX and PMIX_PREFIX so the carried Open
#   MPI is used, finds the CUDA runtime, cuBLASLt and NCCL (/usr/local/cuda,
#   $NCCL_LIB_DIR, the nvidia-* Python wheels, or a search of /), runs every
#   GPU test, `bench_gpt --device cuda` and `bench_fit --device cuda`, and
#   writes FILE (default gpu-results.txt): date, GPU, driver, commit, then
#   each step's status, time and whole output (max errors, MFU, step splits).
#   --only splits the run in three (the tests take a few minutes, the
#   benchmark another few, bench_fit up to 9) for callers that limit one
#   command's time. With the lab's device tool:
#   carry [".gpu-carry"] and run
#     bash tests/gpu.sh run .gpu-carry --only tests --out $OUT/gpu-tests.txt
#     bash tests/gpu.sh run .gpu-carry --only bench --out $OUT/gpu-bench.txt
#     bash tests/gpu.sh run .gpu-carry --only fit --out $OUT/gpu-fit.txt
#     bash tests/gpu.sh run .gpu-carry --only shm --out $OUT/gpu-shm.txt
#   shm: the offload rows over the shared-memory transport to 2 local
#   zs-servers with speculation and streamed pulls (124M and 1.5B), and 1.5B
#   at gradient accumulation 8 against AdamW on the GPU at gas 8 (the
#   "offload / GPU AdamW" line: the goal is >= 0.9).
#   llmc: llm.c's train_gpt2cu (from the carry) at 124M and 1.5B, at the
#   micro-batches our bench_gpt rows used (the GPU-RESULT lines already in
#   FILE, else 16 and 4) and at its scripts' (64 and 16), one
#   `GPU-RESULT model=... impl=llmc tokens_per_s=X mfu=Y batch=B` line each
#   (median step time after 3 warm-up steps; mfu by llm.c's formula against
#   the same 989.4 TFLOP/s bf16 peak as ours).
#   offload: 1.5B at gas 8 over shm at the defaults, and again with the
#   delayed parameter update (--dpu 0), each against AdamW on the GPU.
#   issue: shm, 1.5B at gas 8 with and without speculation, llmc (not with
#   ZS_GPU_LLMC=0), test_dev_cuda, test_cuda_ops and the shm part of
#   test_train_cuda: one call's worth (about 5 minutes on an H200).
#
#   a GPU machine that has our build dependencies (grpc, protobuf-c, rocksdb,
#   openblas, Open MPI, cjson, xxhash, CUDA, NCCL):
#     tests/gpu.sh build [--out FILE]
#   configures build-gpu/ with CUDA, builds everything, runs ctest -L gpu
#   and the benchmark.
#
# With no command: `run` when .gpu-carry/bin exists, else `build`.
#
# Steps: test_dev_cuda; test_cuda_ops (every CUDA op vs its CPU twin); test_cuda_attn
# (the fused attention vs the CPU);
# test_gpt_cuda (the whole GPT on CUDA vs CPU, 10 AdamW steps, bitwise
# reruns); test_nccl_boot boot under mpirun -np 2 (one GPU: two ranks on it
# must be refused; two GPUs: collectives) and gpu under -np 1 (and -np N with
# N GPUs); test_nccl vsmpi (NCCL vs Open MPI on the same data) at -np 1;
# with N > 1 GPUs also test_nccl vsmpi and kill (a rank SIGKILLed
# mid-collective) at -np N and test_train_cuda at W = N (stages 0-3 x
# offload vs the CPU engine at N, bf16, kill -9 + zs-launch resume on N-1
# GPUs); test_train_cuda (zs-train --device cuda vs cpu, stages 0-3 x
# offload with 2 zs-servers, kill -9 + resume bitwise); bench_gpt --device
# cuda (GPT-2 124M and 1.5B with bf16 GEMMs, tokens/s, MFU, step split,
# optimizer on the GPU and on 2 local zs-servers; 124M with fp32 GEMMs);
# bench_fit --device cuda (the largest GPT that trains on the GPU with the
# optimizer on zs-servers, by measured memory). Exit status: 0 when no step failed (skips
# allowed), 1 otherwise. What has run on a GPU so far: see README.
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
[ $# -gt 0 ] && shift
carry=.gpu-carry
out=gpu-results.txt
only=all
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -*) echo "gpu.sh: unknown option $1" >&2; exit 2 ;;
    *) carry=$1; shift ;;
    esac
done
PARTS="tests bench shm fit llmc issue xfer prof flash offload model"
for part in ${only//,/ }; do
    case " all $PARTS " in *" $part "*) ;;
    *) echo "gpu.sh: --only takes a comma list of: all, ${PARTS// /, }" >&2; exit 2 ;; esac
done
# want PART: whether --only names PART (or is all, for the four parts that
# `all` means: tests, bench, shm, fit). Parts run in the order of run().
want() {
    case ",$only," in *",$1,"*) return 0 ;; esac
    [ "$only" = all ] && case "$1" in tests | bench | shm | fit) return 0 ;; esac
    return 1
}
if [ -z "$cmd" ]; then
    if [ -d "$carry/bin" ]; then cmd=run; else cmd=build; fi
fi

# bench_fit on a lent H100 (80 GB, 128 GiB host RAM) inside one 10-minute call
# (bench/README.md, "bench_fit").
FIT_ARGS="--widths 4096,2048 --ctx 1024 --batch 1 --time-limit 540"
GPU_TESTS="test_dev_cuda test_cuda_ops test_cuda_attn test_gpt_cuda test_nccl_boot test_nccl test_train_cuda"
GPU_BINS="$GPU_TESTS zs-train zs-server zs-launch bench_gpt bench_fit"
# Open MPI's launcher and plugins (dlopen'ed, so ldd does not see them), and
# what those plugins need: libpmix (with libmunge: without it mca_pmix_ext3x
# does not load and orterun stops in orte_init; `gpu.sh check` found it).
MPI_DEBS="libopenmpi3 openmpi-bin openmpi-common libpmix2 libmunge2 libhwloc15 libevent-2.1-7 \
libevent-core-2.1-7 libevent-pthreads-2.1-7"
# Present on any machine that runs CUDA; carrying them would shadow newer ones.
# libpcre2-8-0 (zs-train's GPT-2 tokenizer) is in every Debian/Ubuntu base
# system (grep and sed load it), with a stable soname.
SYSTEM_DEBS="libc6 libgcc-s1 libstdc++6 zlib1g libpcre2-8-0"
# Root-friendly, quiet Open MPI on one machine (shared memory and TCP only:
# the plugins for InfiniBand, UCX and OFI are not carried).
# shellcheck disable=SC2054 # the commas are Open MPI's list syntax
MPI_ENV=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
         OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
         OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
         OMPI_MCA_mca_base_component_show_load_errors=0)

die() { echo "gpu.sh: $*" >&2; exit 1; }

# Debian packages of the shared libraries the binaries in $1 load, less
# SYSTEM_DEBS and whatever is not from a package (CUDA's).
lib_debs() {
    local f l p
    for f in "$1"/*; do ldd "$f"; done | awk '/=> \// {print $3}' | sort -u | while read -r l; do
        p=$(dpkg -S "$l" 2>/dev/null || dpkg -S "$(readlink -f "$l")" 2>/dev/null \
            || dpkg -S "*/$(basename "$l")" 2>/dev/null | head -1)
        [ -n "$p" ] && echo "${p%%:*}"
    done | sort -u | grep -vxF -f <(tr ' ' '\n' <<< "$SYSTEM_DEBS")
}

pack() {
    local build=${ZS_BUILD:-$here/build}
    command -v apt-get >/dev/null || die "pack needs apt-get (a Debian machine)"
    [ -f "$build/CMakeCache.txt" ] || cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        || die "configure failed"
    grep -q '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" || die "no nvcc: CUDA parts are off"
    # (ZS_PACK_NO_BUILD=1: take what is built, as test_gpu_carry does)
    [ -n "${ZS_PACK_NO_BUILD:-}" ] || cmake --build "$build" -j2 --target $GPU_BINS || die "build failed"
    rm -rf "${carry:?}/bin" "${carry:?}/debs" "${carry:?}/root"
    mkdir -p "$carry/bin" "$carry/debs"
    local b f
    for b in $GPU_BINS; do
        # not build/emu*: the CUDA emulator's builds of the same names (tests/emu.cmake)
        f=$(find "$build" -path "$build/emu*" -prune -o -type f -name "$b" -perm -u+x -print | head -1)
        [ -n "$f" ] || die "$b was not built"
        objcopy --strip-debug "$f" "$carry/bin/$b" || cp "$f" "$carry/bin/$b"
    done
    local debs
    debs=$(lib_debs "$carry/bin" | tr '\n' ' ')
    echo "gpu.sh: libraries to carry: $debs$MPI_DEBS"
    (cd "$carry/debs" && apt-get download $debs $MPI_DEBS) || die "apt-get download failed"
    {
        echo "packed $(date -u +%FT%TZ) on $(hostname)"
        echo "commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
        ls -l "$carry/bin" "$carry/debs"
    } > "$carry/MANIFEST"
    [ -z "${LLMC:-}" ] || llmc_build "$LLMC" "$carry/llmc" || die "llm.c build failed"
    local kib
    kib=$(du -sk "$carry" | cut -f1)
    [ "$kib" -le 65536 ] || die "$carry is $((kib / 1024)) MiB, over the 64 MiB a GPU run can carry"
    echo "gpu.sh: packed $carry ($((kib / 1024)) MiB): $(ls "$carry/bin" | tr '\n' ' ')"
}

# llmc_build SRC DEST: llm.c's train_gpt2cu built from a copy of SRC, and
# data shards (llm.c's format: 256 int32 header, magic 20240520, version 1,
# token count, then uint16 ids) of random GPT-2 ids, into DEST. Two changes
# to the copy, none to its kernels: CUDA 13's cudaMemAdvise takes a
# cudaMemLocation (its managed-memory fallback no longer compiles), and the
# fallback is replaced by an error anyway: a lent GPU must never get more
# managed memory than it has, and a run that does not fit must say so.
llmc_build() {
    local src=$1 dest=$2 tmp
    [ -f "$src/train_gpt2.cu" ] || { echo "gpu.sh: LLMC=$src holds no train_gpt2.cu" >&2; return 1; }
    tmp=$(mktemp -d)
    cp -r "$src/." "$tmp/" && rm -rf "$tmp/.git"
    python3 - "$tmp/llmc/cuda_utils.cuh" <<'PY' || return 1
import re, sys
p = sys.argv[1]
s = open(p).read()
new = ('fprintf(stderr, "cudaMalloc of %zu bytes failed (%s:%d): no managed-memory '
       'fallback on a lent GPU\\n", bytes, file, line);\n        exit(EXIT_FAILURE);')
s2 = re.sub(r"cudaCheck_\(cudaMallocManaged\(out, bytes\), file, line\);.*?return 1;",
            lambda m: new, s, count=1, flags=re.S)
if s2 == s:
    sys.exit("gpu.sh: llm.c's managed-memory fallback not found in " + p)
open(p, "w").write(s2)
PY
    (cd "$tmp" && PATH=/usr/local/cuda/bin:$PATH make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 \
        NO_OMP=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY=90 PRECISION=BF16 \
        NVCC_LDFLAGS="-lcublas -lcublasLt") > "$tmp.log" 2>&1 \
        || { tail -20 "$tmp.log" >&2; return 1; }
    mkdir -p "$dest"
    cp "$tmp/train_gpt2cu" "$dest/"
    echo "llm.c $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)" > "$dest/VERSION"
    python3 - "$dest" <<'PY' || return 1
import random, struct, sys
rng = random.Random(20240520)
for name, n in (("train.bin", 1 << 21), ("val.bin", 1 << 18)):
    with open(sys.argv[1] + "/" + name, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *(rng.randrange(50257) for _ in range(n))))
PY
    rm -rf "$tmp" "$tmp.log"
}

# llmc_row SHAPE B: one GPU-RESULT line for llm.c's train_gpt2cu at B x 1024.
llmc_row() {
    local shape=$1 B=$2 d steps P=0 L C log
    case $shape in
    124m) d=d12 steps=20 L=12 C=768 ;;
    1.5b) d=d48 steps=10 L=48 C=1600 ;;
    esac
    log=$(mktemp)
    (cd "$carry/llmc" && ./train_gpt2cu -i train.bin -j val.bin -e "$d" -b "$B" -t 1024 \
        -x "$steps" -v 100000 -m 1 -s 0 -h 0 -y 0 -n 0) > "$log" 2>&1
    local rc=$?
    grep -E '^step|num_parameters|rror|fail' "$log" | tail -n 25
    # P: llm.c's own count (its padded vocabulary), as its MFU uses
    P=$(awk -F'|' '/num_parameters/ {gsub(/ /, "", $3); print $3; exit}' "$log")
    # median step time after 3 warm-up steps: "step k/N | ... | X ms | ..."
    awk '/^step/ { for (i = 1; i < NF; i++) if ($(i + 1) == "ms" && ++n > 3) print $i }' "$log" |
        sort -g | awk -v B="$B" -v P="$P" -v L="$L" -v C="$C" -v s="$shape" -v rc="$rc" '
        { t[++m] = $1 }
        END {
            if (rc != 0 || m == 0 || P == 0) { printf "GPU-RESULT model=%s impl=llmc failed batch=%d\n", s, B; exit 1 }
            med = m % 2 ? t[(m + 1) / 2] : (t[m / 2] + t[m / 2 + 1]) / 2
            tps = B * 1024 / (med / 1000)
            printf "GPU-RESULT model=%s impl=llmc tokens_per_s=%.0f mfu=%.4f batch=%d\n",
                   s, tps, tps * (6 * P + 6 * L * C * 1024) / 989.4e12, B
        }'
    rc=$?
    rm -f "$log"
    return $rc
}

# llmc_rows: llm.c at our rows' micro-batches (from $out) and its scripts'.
llmc_rows() {
    [ -x "$carry/llmc/train_gpt2cu" ] || { echo "SKIP: no llm.c in the carry (pack with LLMC=DIR)"; return 77; }
    cat "$carry/llmc/VERSION"
    local shape b bs fails=0
    for shape in 124m 1.5b; do
        bs=$(sed -n "s/^GPU-RESULT model=$shape impl=zs .* batch=\([0-9]*\) case=model.*/\1/p" "$out" | head -1)
        [ -n "$bs" ] || { [ $shape = 124m ] && bs=16 || bs=4; }
        [ $shape = 124m ] && bs="$bs 64" || bs="$bs 16"
        for b in $bs; do llmc_row $shape "$b" || fails=$((fails + 1)); done
    done
    [ "$fails" -eq 0 ]
}

# --only prof: where a step's GPU time goes, per op and shape: bench_gpt's
# model row (bf16 GEMMs, 124M at B=16 and 1.5B at B=4, activations saved
# in fp32 then in bf16) with ZS_GPT_PROFILE=1
# (worker/model/zs_gpt_ops_prof.c: each op of the model timed with its
# stream waited for; the rows are printed when the model is destroyed,
# summed over the warm-up and the timed steps). Nsight Compute is not used:
# on the H200 of 2026-11-28 it profiled no kernel of bench_gpt in 200 s.
prof_rows() {
    local shape b rc=0
    for shape in 124m:16:fp32 1.5b:4:fp32 124m:16:bf16 1.5b:4:bf16; do
        local act=${shape##*:}
        shape=${shape%:*}
        b=${shape#*:}
        shape=${shape%:*}
        echo "-- $shape B=$b activations $act (ZS_GPT_PROFILE=1)"
        local tmp r
        tmp=$(mktemp)
        timeout "${ZS_GPU_STEP_TIMEOUT:-300}" env ZS_GPT_PROFILE=1 "$carry/bin/bench_gpt" \
            --device cuda --shape "$shape" --batch "$b" --no-engine --activations "$act" \
            > "$tmp" 2>&1
        r=$?
        grep -v 'PMIx\|pcompress\|MCA\|^-----\|compression\|memory footprints\|continue, but\|comparable' "$tmp"
        rm -f "$tmp"
        [ $r -eq 0 ] || rc=1
    done
    return $rc
}

# The folder of shared library $1 on a GPU machine, or nothing: the usual
# CUDA folders, then the nvidia-* Python wheels, then a search of /.
find_lib() {
    local name=$1 d py
    for d in "${NCCL_LIB_DIR:-}" "${CUDA_LIB_DIR:-}" /usr/local/cuda/lib64 /usr/local/cuda/lib \
        /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
        [ -n "$d" ] && [ -e "$d/$name" ] && { echo "$d"; return; }
    done
    for py in python3 /opt/torch/.venv/bin/python3; do
        d=$("$py" -c 'import nvidia, os, sys
for p in nvidia.__path__:
    for r, _, fs in os.walk(p):
        if sys.argv[1] in fs: print(r); raise SystemExit' "$name" 2>/dev/null | head -1)
        [ -n "$d" ] && { echo "$d"; return; }
    done
    d=$(find / -xdev -name "$name" 2>/dev/null | head -1)
    [ -n "$d" ] && dirname "$d"
}

results_header() {
    {
        echo "# zeroshard GPU checks ($1)"
        echo "date: $(date -u +%FT%TZ)"
        echo "host: $(hostname)"
        if command -v nvidia-smi > /dev/null; then
            echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | paste -sd ';')"
        else
            echo "gpu: none (no nvidia-smi)"
        fi
        [ -f "$carry/MANIFEST" ] && sed -n 's/^commit /commit: /p' "$carry/MANIFEST"
        git -C "$here" rev-parse --short HEAD 2>/dev/null | sed 's/^/tree: /'
    } > "$out"
}

fails=0
# run_one NAME CMD...: run, record status, time and output in the results.
run_one() {
    local name=$1; shift
    local t0 t1 rc log
    log=$(mktemp)
    t0=$(date +%s.%N)
    if [ "$(type -t "$1")" = function ]; then
        "$@" > "$log" 2>&1 # (llmc_rows: each of its runs is short)
    else
        timeout "${ZS_GPU_STEP_TIMEOUT:-900}" "$@" > "$log" 2>&1
    fi
    rc=$?
    t1=$(date +%s.%N)
    local st=PASS
    [ $rc -eq 77 ] && st=SKIP
    [ $rc -ne 0 ] && [ $rc -ne 77 ] && { st="FAIL (exit $rc)"; fails=$((fails + 1)); }
    {
        printf '\n== %s: %s, %s s\n' "$name" "$st" "$(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")"
        cat "$log"
    } >> "$out"
    printf '%-28s %s\n' "$name" "$st"
    rm -f "$log"
}

# Unpack the carry's .deb files under $carry/root (once; pack removes it).
unpack() {
    [ -d "$carry/bin" ] || die "$carry/bin is missing: run 'tests/gpu.sh pack' on a dev machine"
    carry=$(cd "$carry" && pwd)
    root=$carry/root
    [ -d "$root/usr" ] && return
    local f
    mkdir -p "$root"
    for f in "$carry"/debs/*.deb; do dpkg -x "$f" "$root" || die "dpkg -x $f failed"; done
}

# Export the environment that makes the carried libraries and Open MPI the
# ones loaded: LD_LIBRARY_PATH (the carry's library folders first, then the
# machine's CUDA folders found by find_lib), OPAL_PREFIX, PMIX_PREFIX, PATH
# and MPI_ENV. Sets cuda_dirs and cuda_missing for the results file.
carry_env() {
    local lib f
    cuda_dirs="" cuda_missing=""
    for lib in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
        f=$(find_lib "$lib")
        if [ -n "$f" ]; then
            case ":$cuda_dirs:" in *":$f:"*) ;; *) cuda_dirs=$cuda_dirs${cuda_dirs:+:}$f ;; esac
        else
            cuda_missing="$cuda_missing $lib"
        fi
    done
    [ -z "$cuda_missing" ] || echo "gpu.sh: not found:$cuda_missing (set CUDA_LIB_DIR / NCCL_LIB_DIR)" >&2
    local ml=$root/usr/lib/x86_64-linux-gnu
    # (Debian 12 still ships a few libraries in /lib: libbz2, ...)
    # (no empty entry at the end: that would mean the current folder)
    export LD_LIBRARY_PATH=$ml:$root/lib/x86_64-linux-gnu:$ml/openmpi/lib:$ml/openblas-pthread${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OPAL_PREFIX=$root/usr PMIX_PREFIX=$ml/pmix2 PATH=$root/usr/bin:$PATH
    export "${MPI_ENV[@]}"
}

run() {
    unpack
    carry_env
    local f dirs=$cuda_dirs missing=$cuda_missing
    local mpirun=$root/usr/bin/orterun bin=$carry/bin
    results_header "prebuilt binaries from $carry, --only $only"
    {
        echo "cuda/nccl libraries: ${dirs:-not found}${missing:+ (missing:$missing)}"
        echo "ldd of the binaries (not found):"
        for f in "$bin"/*; do ldd "$f" | grep 'not found' | sed "s|^|  $(basename "$f"): |"; done
    } >> "$out"
    if want issue; then
        run_one bench_gpt_cuda_shm env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" \
            --device cuda --transport shm --spec 1 --stream 1
        run_one bench_gpt_cuda_shm_gas8 env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" \
            --device cuda --shape 1.5b --gas 8 --transport shm --spec 1 --stream 1
        run_one bench_gpt_cuda_shm_gas8_nospec env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" \
            --device cuda --shape 1.5b --gas 8 --transport shm --spec 0 --stream 1
        [ "${ZS_GPU_LLMC:-1}" = 0 ] || run_one llmc llmc_rows
        run_one test_dev_cuda "$bin/test_dev_cuda"
        run_one test_cuda_ops "$bin/test_cuda_ops"
        run_one test_train_cuda_shm env ZS_TRAIN_BIN="$bin/zs-train" ZS_MPIEXEC_BIN="$mpirun" \
            ZS_SERVER_BIN="$bin/zs-server" ZS_TEST_TRAIN_CUDA_PART=shm "$bin/test_train_cuda"
        grep -h '^GPU-RESULT\|offload / GPU AdamW\|totals:' "$out"
    fi
    if want llmc; then
        run_one llmc llmc_rows
    fi
    if want model; then
        # the bare model's tokens/s at the micro-batches llm.c was compared
        # at (124M B=16, 1.5B B=4), and the ops against the CPU on this GPU
        run_one test_cuda_ops "$bin/test_cuda_ops"
        run_one bench_gpt_model_124m "$bin/bench_gpt" --device cuda --shape 124m --batch 16 \
            --no-engine
        run_one bench_gpt_model_1.5b "$bin/bench_gpt" --device cuda --shape 1.5b --batch 4 \
            --no-engine
        # the same with the saved activations in bf16: the GEMMs read them
        # as stored (no rounding pass per operand)
        run_one bench_gpt_model_124m_act16 "$bin/bench_gpt" --device cuda --shape 124m \
            --batch 16 --no-engine --activations bf16
        run_one bench_gpt_model_1.5b_act16 "$bin/bench_gpt" --device cuda --shape 1.5b \
            --batch 4 --no-engine --activations bf16
        grep -h '^GPU-RESULT' "$out"
    fi
    if want offload; then
        # the offload row at the defaults (streams per server from the
        # cores, push-only checksums), 1.5B at gas 8: issue 25's GPU goal
        run_one bench_gpt_offload_1.5b_gas8 env ZS_BENCH_SERVER_LOG=info \
            ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" --device cuda --shape 1.5b \
            --batch 4 --gas 8 --transport shm --spec 1 --stream 1
        # the same with the delayed parameter update from step 1 on: the
        # servers' AdamW and the pulls overlap the next step
        run_one bench_gpt_offload_1.5b_gas8_dpu env ZS_BENCH_SERVER_LOG=info \
            ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" --device cuda --shape 1.5b \
            --batch 4 --gas 8 --transport shm --spec 1 --stream 1 --dpu 0
        grep -h '^GPU-RESULT\|offload.*/ GPU AdamW\|offload split\|totals:' "$out"
    fi
    if want flash; then
        # the model rows with fused attention: tokens/s and the largest B
        run_one bench_gpt_flash "$bin/bench_gpt" --device cuda --shape 124m --attention flash \
            --no-engine
        grep -h '^GPU-RESULT' "$out"
    fi
    if want prof; then
        run_one gpt_op_profile prof_rows
    fi
    if want xfer; then
        # the offload transfer path: concurrent shm streams per server (1 =
        # one stream, as before), then the servers' speculation window
        # covering a whole 1.5B range (12 B/element of pre-images)
        run_one bench_gpt_xfer_1.5b env ZS_BENCH_SERVER_LOG=info ZS_SERVER_BIN="$bin/zs-server" \
            "$bin/bench_gpt" --device cuda --shape 1.5b --batch 4 --gas 8 --transport shm \
            --spec 1 --stream 1 --shm-streams 1,4,8
        run_one bench_gpt_xfer_1.5b_window env ZS_BENCH_SERVER_LOG=info \
            ZS_BENCH_SERVER_ARGS="--spec-window 10G" ZS_SERVER_BIN="$bin/zs-server" \
            "$bin/bench_gpt" --device cuda --shape 1.5b --batch 4 --gas 8 --transport shm \
            --spec 1 --stream 1 --shm-streams 4
        run_one bench_gpt_xfer_124m env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" \
            --device cuda --shape 124m --batch 16 --transport shm --spec 1 --stream 1 \
            --shm-streams 1,4
        grep -h '^GPU-RESULT\|offload.*/ GPU AdamW\|offload split\|totals:' "$out"
    fi
    if want tests; then
        local ngpu
        ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        run_one test_dev_cuda "$bin/test_dev_cuda"
        run_one test_cuda_ops "$bin/test_cuda_ops"
        run_one test_cuda_attn "$bin/test_cuda_attn"
        run_one test_gpt_cuda "$bin/test_gpt_cuda"
        run_one test_nccl_boot_np2 "$mpirun" -np 2 "$bin/test_nccl_boot" boot
        run_one test_nccl_np1 "$mpirun" -np 1 "$bin/test_nccl_boot" gpu
        run_one test_nccl_vsmpi_np1 "$mpirun" -np 1 "$bin/test_nccl" vsmpi
        if [ "$ngpu" -gt 1 ]; then
            # several GPUs (issue 15): what the CUDA emulator runs at 2 and 4
            run_one "test_nccl_np$ngpu" "$mpirun" -np "$ngpu" "$bin/test_nccl_boot" gpu
            run_one "test_nccl_vsmpi_np$ngpu" "$mpirun" -np "$ngpu" "$bin/test_nccl" vsmpi
            run_one "test_nccl_kill_np$ngpu" env ZS_MPIEXEC_BIN="$mpirun" "$bin/test_nccl" kill \
                "$ngpu"
            run_one "test_train_cuda_w$ngpu" env ZS_TRAIN_BIN="$bin/zs-train" \
                ZS_MPIEXEC_BIN="$mpirun" ZS_SERVER_BIN="$bin/zs-server" \
                ZS_LAUNCH_BIN="$bin/zs-launch" ZS_TEST_TRAIN_CUDA_NP="$ngpu" "$bin/test_train_cuda"
        fi
        run_one test_train_cuda env ZS_TRAIN_BIN="$bin/zs-train" ZS_MPIEXEC_BIN="$mpirun" \
            ZS_SERVER_BIN="$bin/zs-server" "$bin/test_train_cuda"
        # the delayed parameter update: offload == in process on the GPU
        run_one test_train_cuda_dpu env ZS_TRAIN_BIN="$bin/zs-train" ZS_MPIEXEC_BIN="$mpirun" \
            ZS_SERVER_BIN="$bin/zs-server" ZS_TEST_TRAIN_CUDA_PART=dpu "$bin/test_train_cuda"
    fi
    if want bench; then
        run_one bench_gpt_cuda env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" --device cuda
        run_one bench_gpt_cuda_fp32 env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" \
            --device cuda --shape 124m --gemm fp32 --no-engine
    fi
    if want shm; then
        run_one bench_gpt_cuda_shm env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" \
            --device cuda --transport shm --spec 1 --stream 1
        run_one bench_gpt_cuda_shm_gas8 env ZS_SERVER_BIN="$bin/zs-server" "$bin/bench_gpt" \
            --device cuda --shape 1.5b --gas 8 --transport shm --spec 1 --stream 1
    fi
    if want fit; then
        run_one bench_fit_cuda "$bin/bench_fit" --device cuda --server-bin "$bin/zs-server" \
            $FIT_ARGS
    fi
}

build() {
    local b=$here/build-gpu
    results_header "built here in $b"
    cmake -S "$here" -B "$b" -DCMAKE_BUILD_TYPE=Release > "$b.configure.log" 2>&1 \
        || die "configure failed (missing build dependencies? use pack/run): see $b.configure.log"
    grep -q '^CMAKE_CUDA_COMPILER:' "$b/CMakeCache.txt" || die "nvcc not found: CUDA parts are off"
    cmake --build "$b" -j"$(nproc)" --target $GPU_BINS || die "build failed"
    export "${MPI_ENV[@]}"
    if want tests; then
        (cd "$b" && ctest -L gpu --output-on-failure -V) > "$b.ctest.log" 2>&1
        local rc=$?
        cat "$b.ctest.log" >> "$out"
        [ $rc -eq 0 ] || fails=1
    fi
    if want bench; then
        run_one bench_gpt_cuda "$b/bench/bench_gpt" --device cuda
        run_one bench_gpt_cuda_fp32 "$b/bench/bench_gpt" --device cuda --shape 124m --gemm fp32 \
            --no-engine
    fi
    if want shm; then
        run_one bench_gpt_cuda_shm "$b/bench/bench_gpt" --device cuda --transport shm --spec 1 \
            --stream 1
        run_one bench_gpt_cuda_shm_gas8 "$b/bench/bench_gpt" --device cuda --shape 1.5b --gas 8 \
            --transport shm --spec 1 --stream 1
    fi
    if want fit; then
        run_one bench_fit_cuda "$b/bench/bench_fit" --device cuda --server-bin "$b/server/zs-server" \
            $FIT_ARGS
    fi
}

case "$cmd" in
pack) pack; exit 0 ;;
env)
    # For scripts: `eval "$(tests/gpu.sh env CARRY)"` sets what run sets.
    unpack
    carry_env
    for v in LD_LIBRARY_PATH OPAL_PREFIX PMIX_PREFIX PATH "${MPI_ENV[@]%%=*}"; do
        printf 'export %s=%q\n' "$v" "${!v}"
    done
    exit 0 ;;
check)
    # The unpacked root (~100 MiB) is removed again when check made it: the
    # carry must stay under 64 MiB to travel.
    fresh=1
    [ -d "$carry/root/usr" ] && fresh=
    unpack
    "$here/tests/gpu_carry_check.sh" "$carry"
    rc=$?
    [ -n "$fresh" ] && rm -rf "${carry:?}/root"
    exit $rc ;;
run) run ;;
build) build ;;
*) die "usage: tests/gpu.sh [pack|check|run|build|env] [CARRY] [--out FILE] [--only PART[,PART...]]" ;;
esac
echo "gpu.sh: results in $out ($fails failed)"
[ "$fails" -eq 0 ]
