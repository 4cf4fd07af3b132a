#!/usr/bin/env bash
# bench_worker_cpu.sh - where the worker's core goes, per step: the setup of
# bench_spec.sh (one zs-server --threads 1 on core 1, bench_engine W = 1 on
# core 0) under `perf record`, once with STEPS_A and once with STEPS_B
# steps; the difference of the two profiles divided by STEPS_B - STEPS_A is
# one step's CPU time on the worker's core (setup and teardown cancel out),
# in milliseconds per category of symbol. Run it for the in-process
# optimizer and for the optimizer on the server and compare: what the
# offload run adds is the transfer's cost on the worker's core.
#
# Usage: bench/bench_worker_cpu.sh [BUILD_DIR] [bench_engine options...]
#   e.g. bench/bench_worker_cpu.sh build --offload 1 --spec 1 --stream 1 \
#          --batch 1 --bucket 2000000
# Env: STEPS_A (default 4), STEPS_B (default 34: with 14, the in-process
# run's xfer ranged from -10.9 to 8.8 ms over three rounds of one
# bench_spec.sh run; 30 steps of difference cut that noise), PERF_FREQ (Hz, default
# 1000: one sample is 1 ms of CPU).
# Needs perf (linux-perf) with permission to sample (root, or
# kernel.perf_event_paranoid <= 1). Prints the bench_engine result lines,
# then one line per category: "cpu <category> <ms per step>", then
# "xfer <ms>": the categories that move bytes to and from the servers
# (memcpy outside the copy stream, checksums, the kernel's TCP copies and stack,
# scheduling and wakeups, page faults, other kernel time, gRPC). The CPU
# device's copy stream ("zs-copy" threads: staging <-> device copies) is
# its own category: on a GPU those copies are the DMA engine's, not a core's.
# ZS_SERVER_ARGS: more zs-server flags (e.g. --shm-socket off).
# Samples under the model's init_params (call chains, -g) are setup and left
# out: how long the kernel takes to zero the model's fresh pages varies from
# run to run (huge pages or not) by more than a step's transfer, and the
# difference of two runs would count that as per-step time.
# Does not: assert anything, or attribute the server's core.
set -euo pipefail
B=${1:-build}
shift $(($# < 1 ? $# : 1))
A=${STEPS_A:-4} Z=${STEPS_B:-34} F=${PERF_FREQ:-1000}
command -v perf >/dev/null || { echo "bench_worker_cpu: perf not found (apt-get install linux-perf)" >&2; exit 2; }
T=$(mktemp -d /tmp/zs-bench-cpu-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
SRV=${ZS_SERVER:-$B/server/zs-server} ENG=${BENCH_ENGINE:-$B/bench/bench_engine}
# shellcheck disable=SC2086
taskset -c 1 "$SRV" --listen 127.0.0.1:0 --data "$T/s0" --threads 1 --ready-file "$T/r0" \
  ${ZS_SERVER_ARGS:-} 2>"$T/s0.log" &
for _ in $(seq 100); do [ -s "$T/r0" ] && break; sleep 0.1; done
S=$(cat "$T/r0")
for n in "$A" "$Z"; do
  ZS_LOG_LEVEL=warn taskset -c 0 perf record -q -g -F "$F" -o "$T/p$n.data" -- \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1 "$ENG" --servers "$S" \
    --steps "$n" "$@" | grep '^result'
  perf report -i "$T/p$n.data" -n --no-children --sort comm,dso,sym,parent --parent init_params \
    -g none 2>/dev/null | grep -v '^#' |
    awk 'NF > 5 && $NF != "init_params" {print $2 "\t" $3 "\t" $4 "\t" $(NF-1)}' >"$T/p$n.txt"
done
python3 - "$T/p$A.txt" "$T/p$Z.txt" $((Z - A)) "$F" <<'PY'
import re, sys
# (category, dso regex, symbol regex[, thread-name regex]): the first match wins.
CATS = [
    ("device copy stream (a GPU's DMA engine)", r".", r"memmove|memcpy", r"^zs-copy"),
    ("model host functions (GEMMs, elementwise)", r"bench_engine", r"^call_fn$"),
    ("casts (16-bit views, gradient casts)", r".", r"cast_avx|cast_avx512|^zs_cast$|cast_portable"),
    ("sum of squares (gradient norm)", r".", r"sumsq"),
    ("accumulate and other device vector ops", r".", r"vec_range|acc_"),
    ("in-process AdamW", r".", r"run_avx|adam_"),
    ("memcpy (staging, pull frames, landing)", r"libc", r"memmove|memcpy"),
    # libxxhash, or zs_hash's AVX2 form (common/zs_hash_avx2.c: xxhash's
    # inline functions, linked into the binary)
    ("checksums (XXH3 of pushed and pulled chunks)", r".", r"XXH|zs__hash|zs_hash", r"."),
    ("checksums (XXH3 of pushed and pulled chunks)", r"xxhash", r"."),
    ("memset (gradient scratch)", r"libc", r"memset"),
    ("kernel: TCP copies (send, receive)", r"kernel", r"_copy_from_iter|_copy_to_iter"),
    ("kernel: TCP/IP stack", r"kernel", r"tcp|skb|^ip_|inet|sock|net|loopback|softirq|__dev_queue|datagram"),
    ("kernel: scheduling and wakeups", r"kernel", r"finish_task_switch|spin_unlock|futex|schedule|irqentry|try_to_wake|pv_queued|select_task|enqueue_task|dequeue_task|update_curr"),
    ("kernel: page faults and memory", r"kernel", r"page|folio|pte|memcg|mm_|vma|mas_|lruvec|rmap|alloc_pages|clear_page|slab|kmem|kfree|kmalloc"),
    ("kernel: other", r"kernel", r"."),
    ("gRPC, protobuf, abseil", r"grpc|protobuf|absl|upb|libgpr|libaddress|libre2|libssl|libcrypto", r"."),
    ("engine, client and model setup (init_params...)", r"bench_engine", r"init_params"),
    ("other", r".", r"."),
]
def load(p):
    d = {}
    for line in open(p):
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 4:
            key = (parts[1], parts[2], parts[3])
            d[key] = d.get(key, 0) + int(parts[0])
    return d
a, z = load(sys.argv[1]), load(sys.argv[2])
steps, hz = int(sys.argv[3]), float(sys.argv[4])
tot = {}
for key in set(a) | set(z):
    comm, dso, sym = key
    ms = (z.get(key, 0) - a.get(key, 0)) / steps * 1000.0 / hz
    for cat in CATS:
        name, dre, sre = cat[:3]
        cre = cat[3] if len(cat) > 3 else r"."
        if re.search(dre, dso) and re.search(sre, sym) and re.search(cre, comm):
            tot[name] = tot.get(name, 0.0) + ms
            break
for name in dict.fromkeys(cat[0] for cat in CATS):  # a category may have several patterns
    print("cpu %-50s %7.1f" % (name, tot.get(name, 0.0)))
print("cpu %-50s %7.1f" % ("total (ms of the worker's core per step)", sum(tot.values())))
XFER = ["memcpy (staging, pull frames, landing)", "checksums (XXH3 of pushed and pulled chunks)",
        "kernel: TCP copies (send, receive)",
        "kernel: TCP/IP stack", "kernel: scheduling and wakeups", "kernel: page faults and memory",
        "kernel: other", "gRPC, protobuf, abseil"]
print("xfer %.1f" % sum(tot.get(c, 0.0) for c in XFER))
PY
