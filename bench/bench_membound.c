/*
 * bench_membound.c - the memory bound of an AdamW pass on this core: a
 * STREAM-like kernel that moves the bytes the server's AdamW moves per
 * element and does no math, single-threaded, over N elements. bench_spec.sh
 * runs it on the server's core in the same run as the servers' passes, and
 * divides the server's AdamW pass by it (optim_over_membound).
 *
 * Bytes per element, as zs_adam_update moves them with a 16-bit gradient and
 * a 16-bit copy of the parameters written for the pulls (the bf16 runs):
 * read p (4), g (2), m (4), v (4); write p (4), m (4), v (4), p16 (2): 28.
 * With --dtype fp32: g is 4 bytes and no copy is written: 28 as well.
 *
 * Usage: bench_membound [--elements N (50M)] [--dtype bf16|fp32] [--reps R (5)]
 * Prints "membound elements=N bytes=B ms=MEDIAN gbps=G min_ms=.. max_ms=..".
 * Asserts nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_bench.h"

/* One pass: the same loads and stores as AdamW, additions instead of its
 * math (the compiler vectorizes it; no data-dependent branch). */
static void pass16(size_t n, float *p, const uint16_t *g, float *m, float *v, uint16_t *p16)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t gb = (uint32_t)g[i] << 16;
        float gf;
        memcpy(&gf, &gb, 4);
        float pi = p[i] + gf;
        m[i] += gf;
        v[i] += gf;
        p[i] = pi;
        uint32_t pb;
        memcpy(&pb, &pi, 4);
        p16[i] = (uint16_t)(pb >> 16);
    }
}

static void pass32(size_t n, float *p, const float *g, float *m, float *v)
{
    for (size_t i = 0; i < n; i++) {
        p[i] += g[i];
        m[i] += g[i];
        v[i] += g[i];
    }
}

int main(int argc, char **argv)
{
    size_t n = 50u * 1000 * 1000;
    int reps = 5, f32 = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--elements"))
            n = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--dtype"))
            f32 = !strcmp(argv[i + 1], "fp32");
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_membound: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!n || reps < 1 || reps > ZS_BENCH_MAX_REPS) {
        fprintf(stderr, "bench_membound: --elements >= 1, 1 <= --reps <= %d\n", ZS_BENCH_MAX_REPS);
        return 2;
    }
    float *p = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4), *g32 = NULL;
    uint16_t *g16 = NULL, *p16 = NULL;
    if (f32)
        g32 = malloc(n * 4);
    else
        g16 = malloc(n * 2), p16 = malloc(n * 2);
    if (!p || !m || !v || (f32 ? !g32 : !g16 || !p16)) {
        fprintf(stderr, "bench_membound: out of memory for %zu elements\n", n);
        return 1;
    }
    /* touch every page first: the server's state is resident too */
    memset(p, 0, n * 4), memset(m, 0, n * 4), memset(v, 0, n * 4);
    if (f32)
        memset(g32, 0, n * 4);
    else
        memset(g16, 0, n * 2), memset(p16, 0, n * 2);
    double ms[ZS_BENCH_MAX_REPS];
    for (int r = 0; r <= reps; r++) {
        double t0 = zs_bench_now();
        if (f32)
            pass32(n, p, g32, m, v);
        else
            pass16(n, p, g16, m, v, p16);
        double t = (zs_bench_now() - t0) * 1e3;
        if (r) /* the first pass warms up */
            ms[r - 1] = t;
    }
    double med = zs_bench_median(ms, reps), lo = ms[0], hi = ms[0];
    for (int r = 1; r < reps; r++)
        lo = ms[r] < lo ? ms[r] : lo, hi = ms[r] > hi ? ms[r] : hi;
    printf("membound elements=%zu bytes=%zu ms=%.2f gbps=%.2f min_ms=%.2f max_ms=%.2f\n", n, n * 28,
           med, n * 28 / med / 1e6, lo, hi);
    free(p), free(m), free(v), free(g32), free(g16), free(p16);
    return 0;
}
