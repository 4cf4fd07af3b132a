/*
 * zs_bench.c - timing and table printing behind zs_bench.h.
 */
#include "zs_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double zs_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double zs_bench_median(const double *x, int n)
{
    double tmp[ZS_BENCH_MAX_REPS];
    if (n <= 0)
        return 0.0;
    if (n > ZS_BENCH_MAX_REPS)
        n = ZS_BENCH_MAX_REPS;
    memcpy(tmp, x, (size_t)n * sizeof *x);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

int zs_bench_reps(int dflt)
{
    const char *s = getenv("ZS_BENCH_REPS");
    int r = s ? atoi(s) : dflt;
    return r < 1 ? 1 : r > ZS_BENCH_MAX_REPS ? ZS_BENCH_MAX_REPS : r;
}

static const char *g_unit = "GB/s";

void zs_bench_header(const char *title, const char *unit)
{
    g_unit = unit;
    printf("\n### %s\n\n", title);
    printf("| case | size | %s (median) | min..max | baseline %s | ratio |\n", unit, unit);
    printf("|---|---|---|---|---|---|\n");
    fflush(stdout);
}

static void min_max(const double *x, int n, double *lo, double *hi)
{
    *lo = *hi = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < *lo)
            *lo = x[i];
        if (x[i] > *hi)
            *hi = x[i];
    }
}

void zs_bench_row(const char *name, const char *size, const double *rates, int n,
                  const double *base, int nbase)
{
    double med = zs_bench_median(rates, n), lo, hi;
    min_max(rates, n, &lo, &hi);
    if (base && nbase > 0) {
        double bmed = zs_bench_median(base, nbase);
        printf("| %s | %s | %.3f | %.3f..%.3f | %.3f | %.2f |\n", name, size, med, lo, hi, bmed,
               bmed > 0 ? med / bmed : 0.0);
    } else {
        printf("| %s | %s | %.3f | %.3f..%.3f | - | - |\n", name, size, med, lo, hi);
    }
    (void)g_unit;
    fflush(stdout);
}

/* See zs_bench.h. */
void zs_bench_tokens(int n, int V, int32_t *in, int32_t *tg)
{
    uint64_t x = 12345;
    for (int i = 0; i <= n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t t = (int32_t)((x >> 33) % (uint64_t)V);
        if (i < n)
            in[i] = t;
        if (i > 0)
            tg[i - 1] = t;
    }
}
