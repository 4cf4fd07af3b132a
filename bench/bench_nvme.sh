#!/usr/bin/env bash
# bench_nvme.sh - the NVMe tier of zs-server (--nvme-path) against the
# drive it runs on, in one run:
#   1. fio on DIR with the tier's own I/O shape: O_DIRECT, io_uring, blocks
#      of one tile slot (772 KiB), queue depth = --nvme-buffers (16): a
#      sequential read, a sequential write, and a 50/50 mix (its read + write
#      bandwidth is the "combined" figure the tier is held to);
#   2. one zs-server with --nvme-path DIR/tiles and --mem-budget BUDGET,
#      driven by bench_nvme (one server, P elements, bf16 gradients and
#      pulls over TCP): the server's AdamW pass time (median), the whole
#      push -> update -> pull phase, and a checkpoint into RocksDB.
# Prints the figures, then
#   NVME-RESULT state_over_budget=X update_over_fio=Y ckpt_s=Z
# X: the fp32 state (p, m, v: 12 B/element) over --mem-budget; Y: the bytes
# the pass moved per second (a read and a write of every tile slot, and a
# read of every tile's staged bf16 gradient span) over fio's combined
# read+write bandwidth; Z: seconds of the checkpoint (the tiles copied into
# RocksDB, 12 B/element).
# Usage: bench/bench_nvme.sh [BUILD_DIR] [DIR] [P] [STEPS]
#   defaults: build, a fresh directory under /var/tmp, 50000000, 5.
#   BUDGET (env): --mem-budget, default 2 B/element + 40 MiB (what the
#   tier needs in RAM: the 16-bit copy, 2 B/element; the I/O buffers, about
#   23 MiB at depth 16; push and pull buffers; gradients are staged on the
#   drive).
# Needs fio (Debian: fio) on PATH. DIR must be on the drive to measure, not
# tmpfs (the server refuses it).
set -euo pipefail
B=${1:-build}
D=${2:-$(mktemp -d /var/tmp/zs-bench-nvme-XXXXXX)}
P=${3:-50000000}
STEPS=${4:-5}
SRV=${ZS_SERVER:-$B/server/zs-server}
DRV=${BENCH_NVME:-$B/bench/bench_nvme}
DEPTH=${NVME_BUFFERS:-16}
SLOT=790528 # bytes of one tile slot (server/zs_nvme.h: ZS_NVME_SLOT)
command -v fio >/dev/null || { echo "bench_nvme: fio not found (apt-get install fio)" >&2; exit 2; }
mkdir -p "$D"
T=$(mktemp -d "$D/run-XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$T"' EXIT
BUDGET=${BUDGET:-$((P * 2 + 40 * 1048576))}
GSPAN=131072 # bytes of one tile's staged bf16 gradient (65536 x 2)
FILE_BYTES=$(((P + 65535) / 65536 * 2 * SLOT))
echo "dir $D ($(df -h --output=source,fstype "$D" | tail -1)); P=$P, $STEPS steps, budget $BUDGET B, depth $DEPTH; $(nproc) cores"

fio_bw() { # rw mode -> "read_MBps write_MBps"
  fio --name=zs --filename="$T/fio.dat" --size="$FILE_BYTES" --bs="$SLOT" --direct=1 \
    --ioengine=io_uring --iodepth="$DEPTH" --rw="$1" --rwmixread=50 --time_based \
    --runtime="${FIO_SECONDS:-10}" --ramp_time=1 --output-format=terse --terse-version=3 2>/dev/null |
    awk -F';' '{printf "%.1f %.1f\n", $7/1024, $48/1024}' # KiB/s fields -> MiB/s
}
read -r R _ < <(fio_bw read)
read -r _ W < <(fio_bw write)
read -r MR MW < <(fio_bw rw)
rm -f "$T/fio.dat"
COMB=$(awk -v a="$MR" -v b="$MW" 'BEGIN{printf "%.1f", a + b}')
echo "fio (O_DIRECT, io_uring, bs $SLOT, iodepth $DEPTH): read $R MiB/s, write $W MiB/s, 50/50 mix $MR + $MW = $COMB MiB/s"

"$SRV" --listen 127.0.0.1:0 --data "$T/data" --nvme-path "$T/tiles" --nvme-buffers "$DEPTH" \
  --mem-budget "$BUDGET" --spec-window 0 --ready-file "$T/ready" 2>"$T/server.log" &
for _ in $(seq 200); do [ -s "$T/ready" ] && break; sleep 0.1; done
[ -s "$T/ready" ] || { echo "bench_nvme: zs-server did not start:" >&2; cat "$T/server.log" >&2; exit 1; }
OUT=$("$DRV" "$(cat "$T/ready")" "$P" "$STEPS")
echo "$OUT"
kill %1 2>/dev/null || true
wait 2>/dev/null || true
PASS=$(sed -n 's/.*pass_s=\([0-9.]*\).*/\1/p' <<<"$OUT")
CKPT=$(sed -n 's/.*ckpt_s=\([0-9.]*\).*/\1/p' <<<"$OUT")
RSS=$(sed -n 's/.*rss_mb=\([0-9.]*\).*/\1/p' <<<"$OUT")
awk -v p="$P" -v b="$BUDGET" -v pass="$PASS" -v comb="$COMB" -v slot="$SLOT" -v gs="$GSPAN" \
  -v ck="$CKPT" -v rss="$RSS" 'BEGIN{
  tiles = int((p + 65535) / 65536); moved = tiles * (2 * slot + gs) / 1048576 / pass;
  printf "pass moved %.1f MiB/s (%d tiles and their gradients read, tiles written, in %.3f s)\n", moved, tiles, pass;
  printf "server RSS after the checkpoint %.1f MB (gRPC, RocksDB and the heap included; see NVME-MEM) against a budget of %.1f MB\n", rss, b / 1e6;
  printf "NVME-RESULT state_over_budget=%.2f update_over_fio=%.2f ckpt_s=%.2f\n", 12 * p / b, moved / comb, ck }'
