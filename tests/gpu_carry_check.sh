#!/usr/bin/env bash
# tests/gpu_carry_check.sh - check on this (Debian 12, no GPU) machine that a
# carry packed by `tests/gpu.sh pack` is self-contained: that on a machine
# without our Debian libraries its binaries and its Open MPI still load and
# run. Called as `tests/gpu.sh check [CARRY]` (which unpacks the carry
# first), or as `tests/gpu_carry_check.sh --selftest BUILD_DIR` (ctest's
# test_gpu_carry: pack into a temporary folder, check it, remove it).
#
# How: in a private mount namespace (`unshare -m`, so nothing is changed
# outside it and every mount vanishes with its last process), every file
# that the carried packages installed on this machine is hidden: an empty
# tmpfs over the folders that only those packages own (Open MPI's, PMIx's,
# their docs), /dev/null bound over each other file (the .so files in
# /usr/lib/x86_64-linux-gnu, orterun, ...; the alternatives symlinks such as
# /usr/bin/mpirun then end on an empty file). Inside, with the environment
# `gpu.sh run` sets (`gpu.sh env`):
#   0. control: zs-server without that environment must NOT load (else the
#      hiding did not work and nothing below proves anything);
#   1. ldd of the carried binaries and Open MPI's launcher: no "not found",
#      and each library resolved is in the carry, in the CUDA install, or one
#      that any GPU machine has (glibc's, libstdc++, libgcc_s, libz,
#      libpcre2-8: grep's); the
#      offenders are printed. Open MPI's and PMIx's plugins (dlopen'ed) are
#      listed when they need a library that is not carried (the InfiniBand,
#      UCX, OFI transports: left out on purpose, they are skipped);
#   2. `gpu.sh run`: every step must PASS or SKIP (exit 77, its reason is
#      printed); a binary that cannot load fails it;
#   3. CPU smoke: the carried zs-server on 127.0.0.1 (a free port) and the
#      carried `orterun -np 2 zs-train --device cpu` for 10 steps of a tiny
#      GPT (optimizer offloaded to the server, a checkpoint at steps 5 and
#      10) must finish and write its CSV.
# Exit 0: self-contained; 1: not (the reasons are printed); 77: cannot check
# here (not root, unshare refused, no dpkg; with --selftest also: the GPU
# binaries not built, apt-get download failed).
#
# What it does not prove: nothing runs on a GPU here; the GPU machine's
# glibc is newer than Debian 12's (fine for binaries built here, but its own
# tools then meet the carried libraries through LD_LIBRARY_PATH only inside
# the steps of `gpu.sh run`); and its CUDA libraries are found by find_lib
# there, here /usr/local/cuda's are.
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }

# --selftest BUILD_DIR: pack into a temporary folder and check it.
if [ "${1:-}" = --selftest ]; then
    build=${2:?--selftest BUILD_DIR}
    [ "$(id -u)" -eq 0 ] || skip "needs root (unshare -m and mount)"
    unshare -m true 2> /dev/null || skip "unshare -m is refused here"
    command -v apt-get > /dev/null || skip "no apt-get (pack needs a Debian machine)"
    grep -q '^CMAKE_CUDA_COMPILER:' "$build/CMakeCache.txt" 2> /dev/null \
        || skip "no nvcc in $build: the CUDA parts are off"
    for b in zs-train zs-server test_nccl_boot bench_gpt; do
        [ -n "$(find "$build" -type f -name "$b" -perm -u+x | head -1)" ] \
            || skip "$b is not built in $build (build the GPU targets first)"
    done
    tmp=$(mktemp -d /tmp/zs-carry.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    t0=$(date +%s)
    ZS_BUILD=$build ZS_PACK_NO_BUILD=1 "$here/tests/gpu.sh" pack "$tmp/carry" > "$tmp/pack.log" 2>&1
    rc=$?
    t1=$(date +%s)
    if [ $rc -ne 0 ]; then
        cat "$tmp/pack.log"
        grep -q 'apt-get download failed' "$tmp/pack.log" && skip "apt-get download failed (no network or no mirror?)"
        echo "FAIL: pack failed"
        exit 1
    fi
    grep '^gpu.sh: packed' "$tmp/pack.log"
    echo "pack: $((t1 - t0)) s"
    "$here/tests/gpu.sh" check "$tmp/carry"
    rc=$?
    echo "check: $(($(date +%s) - t1)) s"
    exit $rc
fi

carry=$(cd "${1:?usage: tests/gpu_carry_check.sh CARRY}" && pwd) || exit 1
root=$carry/root

# The libraries a GPU machine has without the carry: glibc's, the C++ and gcc
# runtimes, zlib, PCRE2 (grep and sed need it), and CUDA's (its install, or
# the nvidia-* wheels).
cuda_real=$(readlink -f /usr/local/cuda 2> /dev/null)
sys_re='^(libc|libm|libmvec|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|libz|libpcre2-8)\.so'
cuda_re='^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvJitLink|nvidia-[a-z-]+)\.so'
# ldd_foreign FILE: with the environment of `gpu.sh run` ($env_sh), print
# "NAME PATH" for each library of FILE that is resolved outside the carry and
# that allowlist, "NAME not-found" for one not found, and "? LINE" for any
# other complaint of ldd (a hidden library reads as an empty file).
ldd_foreign() {
    (eval "$env_sh" && ldd "$1" 2>&1) | while IFS= read -r l; do
        l=${l#"${l%%[![:space:]]*}"}
        case "$l" in
        *" => not found"*) echo "${l%% *} not-found" ;;
        *" => /"*" (0x"*)
            local name=${l%% *} path real
            path=${l#* => } path=${path%% (0x*}
            real=$(readlink -f "$path")
            case "$real" in "$carry"/*) continue ;; esac
            [ -n "$cuda_real" ] && case "$real" in "$cuda_real"/*) continue ;; esac
            case "$real" in /usr/local/cuda*/*) continue ;; esac
            [[ $name =~ $sys_re || $name =~ $cuda_re ]] && continue
            echo "$name $real"
            ;;
        linux-vdso* | /lib64/ld-linux-x86-64.so.2*) ;;
        "") ;;
        *) echo "? $l" ;;
        esac
    done
}
# The carried executables (ours and Open MPI's launcher) and the plugins
# Open MPI and PMIx dlopen.
carried_bins() { printf '%s\n' "$carry"/bin/* "$root"/usr/bin/orterun "$root"/usr/bin/orted; }
carried_plugins() {
    printf '%s\n' "$root"/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
        "$root"/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so
}

if [ -z "${ZS_CARRY_NS:-}" ]; then
    # --- outside: what to hide, then the namespace -------------------------
    [ "$(id -u)" -eq 0 ] || skip "needs root (unshare -m and mount)"
    command -v dpkg-deb > /dev/null || skip "no dpkg here"
    unshare -m true 2> /dev/null || skip "unshare -m is refused here"
    ls "$carry"/debs/*.deb > /dev/null 2>&1 || { echo "FAIL: no .deb in $carry/debs"; exit 1; }
    [ -d "$root/usr" ] || { echo "FAIL: $carry is not unpacked (use tests/gpu.sh check)"; exit 1; }
    work=$(mktemp -d /tmp/zs-carry-check.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    pkgs=()
    for deb in "$carry"/debs/*.deb; do pkgs+=("$(dpkg-deb -f "$deb" Package)"); done
    printf '%s\n' "${pkgs[@]}" | sort -u > "$work/pkgs"
    : > "$work/owned"
    while read -r p; do
        dpkg -L "$p" >> "$work/owned" 2> /dev/null || echo "(not installed here, nothing to hide: $p)"
    done < "$work/pkgs"
    sort -u -o "$work/owned" "$work/owned"
    # Folders owned by carried packages only (dpkg -S names every owner) and
    # holding nothing else: hidden whole, the top-most ones.
    while read -r d; do [ -d "$d" ] && [ ! -L "$d" ] && echo "$d"; done < "$work/owned" > "$work/cand"
    : > "$work/dirs"
    xargs -d '\n' -r dpkg -S < "$work/cand" 2> /dev/null | while IFS= read -r line; do
        d=${line#*: } owners=${line%%: *}
        sed 's/, /\n/g; s/:[^\n]*//g' <<< "$owners" | grep -qvxF -f "$work/pkgs" && continue
        [ -z "$(find "$d" -mindepth 1 | grep -vxF -f "$work/owned" | head -1)" ] || continue
        echo "$d"
    done | sort | awk 'top == "" || index($0, top "/") != 1 { print; top = $0 }' > "$work/dirs"
    # Plugin folders that carried libraries read at a fixed path but whose
    # package is not carried (libhwloc15 loads libhwloc-plugins' hwloc_pci,
    # ...): a GPU machine need not have them either.
    d=/usr/lib/x86_64-linux-gnu/hwloc
    [ -d "$d" ] && ! grep -qxF "$d" "$work/dirs" && echo "$d" >> "$work/dirs"
    while read -r f; do
        if [ ! -f "$f" ] || [ -L "$f" ]; then continue; fi
        awk -v f="$f" 'index(f, $0 "/") == 1 { found = 1 } END { exit !found }' "$work/dirs" || echo "$f"
    done < "$work/owned" > "$work/files"
    # Libraries that the carried executables and plugins resolve to files of
    # this machine outside the carry and the allowlist (libmunge, libnuma,
    # libibverbs, ...): a GPU machine need not have them, so they are hidden
    # too, last (after the mounts that need none of them).
    env_sh=$("$here/tests/gpu.sh" env "$carry") || { echo "FAIL: gpu.sh env $carry failed"; exit 1; }
    while read -r f; do
        [ -e "$f" ] || continue
        ldd_foreign "$f" | while read -r name path; do echo "$f $name $path"; done
    done < <(carried_bins; carried_plugins) > "$work/foreign"
    awk '$3 ~ /^\// { print $3 }' "$work/foreign" | sort -u | grep -vxF -f "$work/files" > "$work/files2"
    echo "gpu.sh check: hiding $(wc -l < "$work/pkgs") carried packages ($(wc -l < "$work/dirs")" \
        "folders under tmpfs, $(wc -l < "$work/files") files under /dev/null) and" \
        "$(wc -l < "$work/files2") libraries of this machine that the carry's plugins or binaries load:" \
        "$(xargs -r -n1 basename < "$work/files2" | paste -sd ' ')"
    ZS_CARRY_NS=$work unshare -m --propagation private "$BASH" "$0" "$carry"
    exit $?
fi

# --- inside the namespace --------------------------------------------------
work=$ZS_CARRY_NS
problems=()
problem() { problems+=("$*"); echo "PROBLEM: $*"; }
srv_pid=""
cleanup() {
    [ -n "$srv_pid" ] || return 0
    kill -TERM "$srv_pid" 2> /dev/null
    for _ in $(seq 50); do kill -0 "$srv_pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$srv_pid" 2> /dev/null
    wait "$srv_pid" 2> /dev/null
    srv_pid=""
}
trap cleanup EXIT
trap 'exit 1' INT TERM

nm=0
while read -r d; do mount -t tmpfs -o size=64k,mode=755 zs-hidden "$d" && nm=$((nm + 1)); done < "$work/dirs"
while read -r f; do mount --bind /dev/null "$f" && nm=$((nm + 1)); done < <(cat "$work/files" "$work/files2")
[ "$nm" -eq "$(cat "$work/dirs" "$work/files" "$work/files2" | wc -l)" ] || problem "some mounts failed"

# 0. control: without the carry's environment the binaries must not load.
if env -u LD_LIBRARY_PATH "$carry/bin/zs-server" --help > "$work/control.log" 2>&1; then
    problem "control: zs-server loaded without the carry (the hiding did not work)"
else
    echo "0. control: without the carry zs-server does not load: $(grep -m1 -i 'error\|not found' "$work/control.log")"
fi

# 1. ldd, with the environment of `gpu.sh run`: what the binaries resolved
# to this machine before the hiding (the clearer report), and what ldd
# says now.
env_sh=$("$here/tests/gpu.sh" env "$carry" 2> "$work/env.err") || problem "gpu.sh env failed: $(cat "$work/env.err")"
nbad=0
while read -r f; do
    bad=$(awk -v f="$f" '$1 == f { print "  " $2 " => " $3 }' "$work/foreign" | while read -r l; do
        echo "  $l (package $(dpkg -S "${l##* }" 2> /dev/null | cut -d: -f1 | head -1))"
    done)
    bad=$bad${bad:+$'\n'}$(ldd_foreign "$f" | sed 's/^/  now: /')
    [ -n "${bad//[[:space:]]/}" ] || continue
    nbad=$((nbad + 1))
    problem "ldd $(basename "$f") loads what the carry lacks:"$'\n'"$bad"
done < <(carried_bins)
[ $nbad -eq 0 ] && echo "1. ldd: the $(find "$carry/bin" -type f | wc -l) binaries, orterun and orted load only the" \
    "carry's, CUDA's and glibc/libstdc++/libgcc_s/libz/libpcre2-8"
plug=$(carried_plugins | while read -r f; do
    b=$(awk -v f="$f" '$1 == f { print $2 }' "$work/foreign" | paste -sd ' ')
    [ -n "$b" ] && echo "$(basename "$f" .so) ($b)"
done | paste -sd ',' | sed 's/,/, /g')
echo "   plugins that do not load without these (hidden; Open MPI skips them): ${plug:-none}"

# 2. gpu.sh run: every step PASS or SKIP.
ZS_GPU_STEP_TIMEOUT=${ZS_GPU_STEP_TIMEOUT:-180} "$here/tests/gpu.sh" run "$carry" \
    --out "$work/gpu-results.txt" > "$work/run.log" 2>&1
nsteps=0
while IFS= read -r h; do
    name=${h#== } name=${name%%:*}
    st=${h#*: } st=${st%,*}
    nsteps=$((nsteps + 1))
    body=$(awk -v h="$h" '$0 == h { on = 1; next } /^== / { on = 0 } on' "$work/gpu-results.txt")
    case "$st" in
    PASS) echo "2. $name: PASS" ;;
    SKIP) echo "2. $name: SKIP: $(grep -m1 'SKIPPED' <<< "$body" || echo '(no SKIPPED line)')" ;;
    *) problem "gpu.sh run: $name: $st:"$'\n'"$(tail -15 <<< "$body")" ;;
    esac
done < <(grep '^== ' "$work/gpu-results.txt" 2> /dev/null)
[ $nsteps -gt 0 ] || problem "gpu.sh run ran no step: $(tail -5 "$work/run.log")"

# 3. CPU smoke: the carried zs-server and orterun -np 2 zs-train.
(
    eval "$env_sh"
    le() { local i; for ((i = 0; i < $2; i++)); do printf '%b' "\\x$(printf %02x $((($1 >> (8 * i)) & 255)))"; done; }
    text="the carried binaries train a small model on a machine without our libraries. "
    text=$text$text$text$text$text$text$text$text
    n=${#text}
    {
        printf ZSTOKENS; le 1 4; le 256 4; le $((n * 8)) 8; le 2 4; le 0 36
        for _ in 1 2 3 4 5 6 7 8; do printf '%s' "$text" | sed 's/./&\x00/g'; done
    } > "$work/corpus.tok"
    cat > "$work/cfg.json" << 'JSON'
{ "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
  "optimizer": { "type": "AdamW", "params": { "lr": 0.002 } },
  "zero_optimization": { "stage": 2, "offload_optimizer": { "device": "cpu" } } }
JSON
) || problem "smoke: could not write the token file"
echo "3. smoke: token file $(stat -c %s "$work/corpus.tok") bytes"
eval "$env_sh"
timeout -k 5 300 "$carry/bin/zs-server" --listen 127.0.0.1:0 --data "$work/srv" --keep 2 \
    --ready-file "$work/srv.addr" > "$work/server.log" 2>&1 &
srv_pid=$!
for _ in $(seq 100); do [ -s "$work/srv.addr" ] && break; kill -0 $srv_pid 2> /dev/null || break; sleep 0.1; done
if [ ! -s "$work/srv.addr" ]; then
    problem "smoke: the carried zs-server did not start:"$'\n'"$(tail -5 "$work/server.log")"
else
    addr=$(cat "$work/srv.addr")
    ZS_LOG_LEVEL=warn timeout -k 5 300 "$root/usr/bin/orterun" -np 2 --bind-to none \
        "$carry/bin/zs-train" --device cpu --config "$work/cfg.json" --data "$work/corpus.tok" \
        --servers "$addr" --layers 2 --heads 2 --width 32 --ctx 16 --steps 10 --ckpt-every 5 \
        --log-every 5 --csv "$work/train.csv" > "$work/train.log" 2>&1
    rc=$?
    last=$(grep -E '^10,' "$work/train.csv" 2> /dev/null)
    first=$(grep -E '^1,' "$work/train.csv" 2> /dev/null)
    if [ $rc -ne 0 ] || [ -z "$last" ]; then
        problem "smoke: orterun -np 2 zs-train --device cpu: exit $rc, CSV ${last:+has step 10}${last:-has no step 10}:"$'\n'"$(tail -15 "$work/train.log")"
    else
        echo "3. smoke: zs-server on $addr, orterun -np 2 zs-train --device cpu: 10 steps," \
            "loss $(cut -d, -f2 <<< "$first") -> $(cut -d, -f2 <<< "$last"), CSV written"
    fi
fi
cleanup

# When Open MPI failed, say which of its plugins did not load and why (the
# run above keeps those errors quiet: the skipped transports would flood it).
if grep -qs 'orte_init failed' "$work/train.log" "$work/gpu-results.txt"; then
    echo "Open MPI's plugins that failed to load (orterun -np 1 true, load errors shown):"
    OMPI_MCA_mca_base_component_show_load_errors=1 timeout 60 "$root/usr/bin/orterun" -np 1 true 2>&1 \
        | grep -B1 -A1 'file too short\|cannot open\|not found' | grep -v '^--$' \
        | grep -iv 'ucx\|ofi\|openib\|psm' | sed 's/^/  /' | head -20
fi

if [ ${#problems[@]} -gt 0 ]; then
    echo "gpu.sh check: FAIL: $carry is not self-contained (${#problems[@]} problems above)"
    exit 1
fi
echo "gpu.sh check: OK: $carry is self-contained ($(du -cm "$carry/bin" "$carry/debs" | tail -1 | cut -f1)" \
    "MiB packed, $(du -sm "$root" | cut -f1) MiB unpacked)"
