#!/bin/sh
# fuzz_service.sh SRC_DIR BUILD_DIR [SECONDS] - build tests/fuzz_service.c
# with clang + libFuzzer (+ AddressSanitizer and UBSan), write the seed
# corpus, and fuzz zs-server's request handling for SECONDS (default 60).
# Exit 0: no crash, leak or sanitizer report; 77: skipped (no clang with
# libFuzzer here: apt-get install clang-14 libclang-rt-14-dev); else the
# fuzzer's failure, with the crashing input under BUILD_DIR/fuzz/.
# A longer run: tests/fuzz_service.sh . build 3600 (the corpus grows in
# BUILD_DIR/fuzz/corpus and is reused by the next run).
set -eu
SRC=$(cd "$1" && pwd)
BUILD=$(cd "$2" && pwd)
SECS=${3:-60}
OUT="$BUILD/fuzz"
mkdir -p "$OUT/corpus"

CC=
for c in clang-19 clang-14 clang; do
    if command -v "$c" >/dev/null 2>&1 &&
        printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n){return 0;}\n' |
        "$c" -fsanitize=fuzzer -x c - -o "$OUT/probe" >/dev/null 2>&1; then
        CC=$c
        break
    fi
done
if [ -z "$CC" ]; then
    echo "SKIP fuzz_service: no clang with libFuzzer (apt-get install clang-14 libclang-rt-14-dev)"
    exit 77
fi
PB="$BUILD/proto/zeroshard.pb-c.c"
if [ ! -f "$PB" ]; then
    echo "FAIL fuzz_service: $PB missing (build the zs_proto target first)"
    exit 1
fi

SRCS="$SRC/tests/fuzz_service.c $SRC/server/zs_service.c $SRC/server/zs_shard.c
 $SRC/server/zs_shard_push.c $SRC/server/zs_shard_spec.c $SRC/server/zs_shard_io.c $SRC/server/zs_shard_ckpt.c
 $SRC/server/zs_budget.c $SRC/server/zs_store.c $SRC/server/zs_store_io.c
 $SRC/server/zs_store_recover.c $SRC/proto/zs_frame.c $SRC/proto/zs_pbconv.c $PB
 $SRC/server/zs_service_shm.c $SRC/server/zs_shm_sessions.c $SRC/common/zs_shm.c
 $SRC/common/zs_shm_sock.c $SRC/common/zs_hash.c
 $SRC/server/zs_nvme.c $SRC/server/zs_nvme_pass.c $SRC/server/zs_shard_nvme.c
 $SRC/common/zs_status.c $SRC/common/zs_log.c $SRC/common/zs_layout.c $SRC/common/zs_pool.c
 $SRC/common/zs_file.c $SRC/kernels/zs_adam_groups.c
 $OUT/zs_adam.o $OUT/zs_cast.o $OUT/zs_simd.o"
INC="-I$SRC/tests -I$SRC/server -I$SRC/proto -I$BUILD/proto -I$SRC/common -I$SRC/kernels"
CFLAGS="-std=gnu11 -O1 -g -fno-omit-frame-pointer -ffp-contract=off -w $INC
 $(pkg-config --cflags grpc libprotobuf-c libxxhash liburing)"
LIBS="$(pkg-config --libs grpc libprotobuf-c libxxhash liburing) -lrocksdb -lpthread -lm"

echo "fuzz_service: building with $CC"
# The numeric kernels are not what is fuzzed: plain cc, no instrumentation
# (their CPU dispatch uses a feature name clang 14 does not know, f16c).
for k in zs_simd zs_adam zs_cast; do
    cc -std=gnu11 -O2 -ffp-contract=off -w $INC -c "$SRC/kernels/$k.c" -o "$OUT/$k.o"
done
# shellcheck disable=SC2086
"$CC" $CFLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    $SRCS $LIBS -o "$OUT/fuzz_service"
# shellcheck disable=SC2086
"$CC" $CFLAGS -DZS_FUZZ_SEEDS $SRCS $LIBS -o "$OUT/fuzz_seeds"
"$OUT/fuzz_seeds" "$OUT/seeds"

cd "$OUT"
echo "fuzz_service: fuzzing for $SECS s"
ASAN_OPTIONS=detect_leaks=1 "$OUT/fuzz_service" -max_total_time="$SECS" -max_len=65536 \
    -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 "$OUT/corpus" "$OUT/seeds"
