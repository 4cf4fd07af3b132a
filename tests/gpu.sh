#!/usr/bin/env bash
# tests/gpu.sh - build and run zeroshard's GPU tests, write the figures to a
# results file. One command on each side:
#
#   here (a Debian 12 dev machine with nvcc, no GPU needed):
#     echo /.gpu-carry/ >> .git/info/exclude       # once: never commit it
#     tests/gpu.sh pack [.gpu-carry]
#   builds the GPU test binaries (build dir $ZS_BUILD, default build/), copies
#   them to .gpu-carry/bin, and fetches the Debian packages of the runtime
#   libraries they need that a GPU machine lacks (Open MPI and its
#   libraries: apt-get download libopenmpi3 openmpi-bin openmpi-common
#   libpmix2 libhwloc15 libevent-2.1-7 libevent-core-2.1-7
#   libevent-pthreads-2.1-7) into .gpu-carry/debs. About 10 MiB in all; the
#   script refuses to pack more than 64 MiB.
#
#   there (a machine with a GPU, CUDA 13 and a driver, no package registry):
#     tests/gpu.sh run [.gpu-carry] [--out FILE]
#   unpacks the .deb files with `dpkg -x` under .gpu-carry/root (never into
#   /), sets LD_LIBRARY_PATH, OPAL_PREFIX and PMIX_PREFIX so the carried Open
#   MPI is used, finds the CUDA runtime (/usr/local/cuda) and libnccl.so.2
#   ($NCCL_LIB_DIR, the toolkit, or the nvidia-nccl-cu13 Python wheel), runs
#   every GPU test and writes FILE (default gpu-results.txt): date, GPU,
#   driver, commit, then each test's status, time and output (the figures:
#   max errors, watchdog timing). With the lab's device tool: carry
#   [".gpu-carry"] and run `bash tests/gpu.sh run .gpu-carry --out
#   $OUT/gpu-results.txt`.
#
#   a GPU machine that has our build dependencies (grpc, protobuf-c, rocksdb,
#   openblas, Open MPI, cjson, CUDA, NCCL):
#     tests/gpu.sh build [--out FILE]
#   configures build-gpu/ with CUDA, builds the GPU tests, runs ctest -L gpu.
#
# With no command: `run` when .gpu-carry/bin exists, else `build`.
#
# Tests run: test_dev_cuda; test_nccl_boot boot under mpirun -np 2 (one GPU:
# two ranks on it must be refused; two GPUs: collectives); test_nccl_boot
# gpu under -np 1 and, with N > 1 GPUs, -np N. bench_gpt --device cuda runs
# too once it exists in the carry (not yet written). Exit status: 0 when no
# test failed (skips allowed), 1 otherwise.
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
[ $# -gt 0 ] && shift
carry=.gpu-carry
out=gpu-results.txt
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=$2; shift 2 ;;
    -*) echo "gpu.sh: unknown option $1" >&2; exit 2 ;;
    *) carry=$1; shift ;;
    esac
done
if [ -z "$cmd" ]; then
    if [ -d "$carry/bin" ]; then cmd=run; else cmd=build; fi
fi

GPU_BINS="test_dev_cuda test_nccl_boot"
DEBS="libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-2.1-7 \
libevent-core-2.1-7 libevent-pthreads-2.1-7"
MPI_ENV=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
         OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1)

die() { echo "gpu.sh: $*" >&2; exit 1; }

pack() {
    local build=${ZS_BUILD:-$here/build}
    command -v apt-get >/dev/null || die "pack needs apt-get (a Debian machine)"
    [ -f "$build/CMakeCache.txt" ] || cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        || die "configure failed"
    grep -q '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" || die "no nvcc: CUDA parts are off"
    cmake --build "$build" -j2 --target $GPU_BINS || die "build failed"
    rm -rf "$carry/bin" "$carry/debs" "$carry/root"
    mkdir -p "$carry/bin" "$carry/debs"
    for b in $GPU_BINS bench_gpt; do
        local f
        f=$(find "$build" -type f -name "$b" -perm -u+x | head -1)
        [ -n "$f" ] && cp "$f" "$carry/bin/"
    done
    [ -x "$carry/bin/test_dev_cuda" ] || die "test_dev_cuda was not built"
    (cd "$carry/debs" && apt-get download $DEBS) || die "apt-get download failed"
    {
        echo "packed $(date -u +%FT%TZ) on $(hostname)"
        echo "commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
        ls -l "$carry/bin" "$carry/debs"
    } > "$carry/MANIFEST"
    local kib
    kib=$(du -sk "$carry" | cut -f1)
    [ "$kib" -le 65536 ] || die "$carry is $((kib / 1024)) MiB, over the 64 MiB a GPU run can carry"
    echo "gpu.sh: packed $carry ($((kib / 1024)) MiB): $(ls "$carry/bin" | tr '\n' ' ')"
}

# libnccl.so.2's folder on a GPU machine, or nothing.
find_nccl() {
    local d
    for d in "${NCCL_LIB_DIR:-}" /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
        [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }
    done
    local py
    for py in python3 /opt/torch/.venv/bin/python3; do
        d=$("$py" -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' \
            2>/dev/null) && [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }
    done
    d=$(find / -xdev -name libnccl.so.2 2>/dev/null | head -1)
    [ -n "$d" ] && dirname "$d"
}

results_header() {
    {
        echo "# zeroshard GPU tests ($1)"
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
    timeout 600 "$@" > "$log" 2>&1
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

run() {
    [ -d "$carry/bin" ] || die "$carry/bin is missing: run 'tests/gpu.sh pack' on a dev machine"
    carry=$(cd "$carry" && pwd)
    local root=$carry/root
    if [ ! -d "$root/usr" ]; then
        mkdir -p "$root"
        for f in "$carry"/debs/*.deb; do dpkg -x "$f" "$root" || die "dpkg -x $f failed"; done
    fi
    local nccl cudart=/usr/local/cuda/lib64
    nccl=$(find_nccl)
    [ -n "$nccl" ] || echo "gpu.sh: libnccl.so.2 not found (set NCCL_LIB_DIR): NCCL tests will fail" >&2
    local ml=$root/usr/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=$ml:$ml/openmpi/lib:$cudart:${nccl:+$nccl:}${LD_LIBRARY_PATH:-}
    export OPAL_PREFIX=$root/usr PMIX_PREFIX=$ml/pmix2 PATH=$root/usr/bin:$PATH
    local mpirun=$root/usr/bin/orterun
    results_header "prebuilt binaries from $carry"
    echo "nccl: ${nccl:-not found}" >> "$out"
    local ngpu
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    local bin=$carry/bin
    run_one test_dev_cuda "$bin/test_dev_cuda"
    run_one test_nccl_boot_np2 env "${MPI_ENV[@]}" "$mpirun" -np 2 "$bin/test_nccl_boot" boot
    run_one test_nccl_np1 env "${MPI_ENV[@]}" "$mpirun" -np 1 "$bin/test_nccl_boot" gpu
    if [ "$ngpu" -gt 1 ]; then
        run_one "test_nccl_np$ngpu" env "${MPI_ENV[@]}" "$mpirun" -np "$ngpu" "$bin/test_nccl_boot" gpu
    fi
    if [ -x "$bin/bench_gpt" ]; then
        run_one bench_gpt_cuda "$bin/bench_gpt" --device cuda
    else
        echo -e "\n== bench_gpt --device cuda: not in the carry (not written yet)" >> "$out"
    fi
}

build() {
    local b=$here/build-gpu
    results_header "built here in $b"
    cmake -S "$here" -B "$b" -DCMAKE_BUILD_TYPE=Release > "$b.configure.log" 2>&1 \
        || die "configure failed (missing build dependencies? use pack/run): see $b.configure.log"
    grep -q '^CMAKE_CUDA_COMPILER:' "$b/CMakeCache.txt" || die "nvcc not found: CUDA parts are off"
    cmake --build "$b" -j"$(nproc)" --target $GPU_BINS || die "build failed"
    (cd "$b" && ctest -L gpu --output-on-failure -V) > "$b.ctest.log" 2>&1
    local rc=$?
    cat "$b.ctest.log" >> "$out"
    [ $rc -eq 0 ] || fails=1
}

case "$cmd" in
pack) pack; exit 0 ;;
run) run ;;
build) build ;;
*) die "usage: tests/gpu.sh [pack|run|build] [CARRY] [--out FILE]" ;;
esac
echo "gpu.sh: results in $out ($fails failed)"
[ "$fails" -eq 0 ]
