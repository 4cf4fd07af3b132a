/*
 * bench_ckpt.c - checkpoint write and restore throughput of the RocksDB store
 * (zs_store.h) against raw write()+fsync() and read() of the same bytes to a
 * file in the same directory, in the same run, interleaved rep by rep.
 *
 * Usage: bench_ckpt [-d DIR] [STATE_MiB ...]   (default: -d . 256 1024)
 *   STATE_MiB is the whole checkpoint: three fp32 tensors of STATE_MiB/3 each.
 *   Repetitions: ZS_BENCH_REPS (default 5). Scratch files go to DIR/bench_ckpt.*
 *   and are removed at the end.
 * Per repetition: checkpoint write; untimed read (checked bit for bit) then a
 * timed warm read; close, drop the page cache (/proc/sys/vm/drop_caches,
 * needs root; if that fails the row says so), reopen and a timed cold read,
 * as a restarted server would do; then the same for the raw file (write +
 * fsync, untimed read, warm read, drop, cold read); then zs_store_delete.
 * Prints zs_bench rows (median GB/s, min..max, baseline, ratio) plus the
 * median time of zs_store_delete (marker + range delete + space reclaim).
 * Does not: assert a speed, or run under ctest.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_bench.h"
#include "zs_store.h"

#define GB 1e9

static int drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd < 0)
        return -1;
    int ok = write(fd, "3\n", 2) == 2;
    close(fd);
    return ok ? 0 : -1;
}

static void die(const char *what, const zs_err_t *err)
{
    fprintf(stderr, "bench_ckpt: %s: %s\n", what, err ? err->msg : strerror(errno));
    exit(1);
}

static double raw_write(const char *path, float *const t[3], size_t bytes)
{
    double t0 = zs_bench_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(path, NULL);
    for (int i = 0; i < 3; i++)
        for (size_t off = 0; off < bytes;) {
            size_t want = bytes - off < (64u << 20) ? bytes - off : (64u << 20);
            ssize_t w = write(fd, (const char *)t[i] + off, want);
            if (w <= 0)
                die("write", NULL);
            off += (size_t)w;
        }
    if (fsync(fd) != 0)
        die("fsync", NULL);
    close(fd);
    return zs_bench_now() - t0;
}

static double raw_read(const char *path, float *const t[3], size_t bytes)
{
    double t0 = zs_bench_now();
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die(path, NULL);
    for (int i = 0; i < 3; i++)
        for (size_t off = 0; off < bytes;) {
            size_t want = bytes - off < (64u << 20) ? bytes - off : (64u << 20);
            ssize_t r = read(fd, (char *)t[i] + off, want);
            if (r <= 0)
                die("read", NULL);
            off += (size_t)r;
        }
    close(fd);
    return zs_bench_now() - t0;
}

static void bench_size(const char *dir, size_t mib, int reps, int *cold_ok)
{
    uint64_t n = (uint64_t)mib * (1u << 20) / 3 / sizeof(float);
    size_t bytes = (size_t)n * sizeof(float);
    double total = 3.0 * (double)bytes;
    float *src[3], *dst[3];
    for (int t = 0; t < 3; t++) {
        src[t] = malloc(bytes);
        dst[t] = malloc(bytes);
        if (!src[t] || !dst[t])
            die("malloc", NULL);
        uint32_t *u = (uint32_t *)src[t], x = 0x9e3779b9u * (uint32_t)(t + 1);
        for (uint64_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            u[i] = x;
        }
        memset(dst[t], 0xa5, bytes); /* fault the pages in before timing (not 0: calloc) */
    }
    char sdir[4096], raw[4096];
    snprintf(sdir, sizeof sdir, "%s/bench_ckpt.store", dir);
    snprintf(raw, sizeof raw, "%s/bench_ckpt.raw", dir);
    zs_err_t err = {0};
    zs_store_t *st;
    if (zs_store_open(sdir, &st, &err))
        die("open", &err);

    double w[ZS_BENCH_MAX_REPS], rw[ZS_BENCH_MAX_REPS], rc[ZS_BENCH_MAX_REPS],
        rrc[ZS_BENCH_MAX_REPS], rh[ZS_BENCH_MAX_REPS], rrh[ZS_BENCH_MAX_REPS],
        del[ZS_BENCH_MAX_REPS];
    for (int r = 0; r < reps; r++) {
        zs_store_ckpt_t ck = {(uint64_t)r + 1, n, {src[0], src[1], src[2]}, "bench", 5};
        sync();
        double t0 = zs_bench_now();
        if (zs_store_write(st, &ck, &err))
            die("zs_store_write", &err);
        w[r] = total / (zs_bench_now() - t0) / GB;

        /* warm: one untimed pass (also the check), then the timed one */
        if (zs_store_read(st, ck.step, dst, n, &err))
            die("zs_store_read", &err);
        for (int t = 0; t < 3; t++)
            if (memcmp(src[t], dst[t], bytes) != 0) {
                fprintf(stderr, "bench_ckpt: restored tensor %d differs\n", t);
                exit(1);
            }
        t0 = zs_bench_now();
        if (zs_store_read(st, ck.step, dst, n, &err))
            die("zs_store_read", &err);
        rh[r] = total / (zs_bench_now() - t0) / GB;

        /* cold: as after a restart, a fresh open with nothing cached */
        zs_store_close(st);
        if (drop_caches() != 0)
            *cold_ok = 0;
        if (zs_store_open(sdir, &st, &err))
            die("open", &err);
        t0 = zs_bench_now();
        if (zs_store_read(st, ck.step, dst, n, &err))
            die("zs_store_read", &err);
        rc[r] = total / (zs_bench_now() - t0) / GB;

        sync();
        rw[r] = total / raw_write(raw, src, bytes) / GB;
        raw_read(raw, dst, bytes);
        rrh[r] = total / raw_read(raw, dst, bytes) / GB;
        if (drop_caches() != 0)
            *cold_ok = 0;
        rrc[r] = total / raw_read(raw, dst, bytes) / GB;

        t0 = zs_bench_now();
        if (zs_store_delete(st, ck.step, &err))
            die("zs_store_delete", &err);
        del[r] = zs_bench_now() - t0;
    }
    zs_store_close(st);

    char size[32];
    snprintf(size, sizeof size, "%zu MiB", mib);
    zs_bench_row("ckpt write (durable) vs write+fsync", size, w, reps, rw, reps);
    zs_bench_row(*cold_ok ? "ckpt read (cold) vs read (cold)" : "ckpt read (warm!) vs read", size,
                 rc, reps, rrc, reps);
    zs_bench_row("ckpt read (warm) vs read (warm)", size, rh, reps, rrh, reps);
    printf("<!-- %zu MiB: zs_store_delete incl. space reclaim, median %.3f s -->\n", mib,
           zs_bench_median(del, reps));
    fflush(stdout);

    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", sdir, raw);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_ckpt: could not remove %s\n", sdir);
    for (int t = 0; t < 3; t++) {
        free(src[t]);
        free(dst[t]);
    }
}

int main(int argc, char **argv)
{
    const char *dir = ".";
    int a = 1;
    if (a + 1 < argc && strcmp(argv[a], "-d") == 0) {
        dir = argv[a + 1];
        a += 2;
    }
    static const size_t dflt[] = {256, 1024};
    size_t sizes[16], ns = 0;
    for (; a < argc && ns < 16; a++) {
        long v = strtol(argv[a], NULL, 10);
        if (v < 3) {
            fprintf(stderr, "usage: bench_ckpt [-d DIR] [STATE_MiB >= 3 ...]\n");
            return 2;
        }
        sizes[ns++] = (size_t)v;
    }
    if (ns == 0)
        for (; ns < 2; ns++)
            sizes[ns] = dflt[ns];
    int reps = zs_bench_reps(5), cold_ok = 1;
    zs_bench_header("Checkpoint store: write and restore (3 fp32 tensors, GB = 1e9 B)", "GB/s");
    for (size_t i = 0; i < ns; i++)
        bench_size(dir, sizes[i], reps, &cold_ok);
    printf("\nreps=%d, cold reads %s\n", reps,
           cold_ok ? "after drop_caches" : "NOT cold (drop_caches failed)");
    return 0;
}
