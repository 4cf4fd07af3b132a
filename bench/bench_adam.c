/*
 * bench_adam.c - throughput of the fused AdamW kernel (kernels/zs_adam.c).
 *
 * What it measures, at 10M and 100M parameters, on 1 thread and on all
 * threads (zs_pool, chunks of CHUNK elements), median of ZS_BENCH_REPS reps:
 *
 *   - zs_adam_update, AdamW, fp32 grad, no output: GB/s at 28 B/param (reads
 *     p, g, m, v; writes p, m, v), against an "Adam-shaped" memory kernel in
 *     the same run that moves the same bytes with no math (p += g; m += g;
 *     v += g). The ratio is the share of the memory bound the kernel reaches.
 *   - the same with a bf16 gradient and a bf16 copy of p written (also
 *     28 B/param: 4 + 2 + 4 + 4 read, 12 + 2 written), same baseline.
 *   - at 10M on 1 thread, the fp32 row again on the avx2 and portable paths.
 *   - Mparams/s against torch.optim.AdamW (bench/bench_adam_torch.py, run
 *     with popen, torch.set_num_threads matching), foreach=False and True.
 *     Skipped with a note when torch cannot be imported.
 *
 * Usage: bench_adam [--quick] [--no-torch]   (--quick: 10M only)
 * What it does not do: assert speeds, or pin threads (the OS places them).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <immintrin.h>

#include "zs_adam.h"
#include "zs_bench.h"
#include "zs_cast.h"
#include "zs_pool.h"

#define CHUNK     (1u << 16) /* elements per pool task */
#define MAX_SIZES 2
#define MAX_THR   2 /* thread settings: 1 and all */

typedef struct {
    size_t n;
    float *p, *m, *v, *g;
    uint16_t *g16, *out16;
    zs_adam_hparams_t hp;
    zs_adam_step_t st;
    int which; /* 0 adam fp32, 1 adam bf16 grad + bf16 out, 2 memory kernel */
} job_t;

/* The memory baseline: reads p, g, m, v and writes p, m, v, with AVX-512
 * when the CPU has it (the widest loads and stores the kernel could use). */
__attribute__((target("avx512f"))) static void mem_avx512(float *restrict p, float *restrict m,
                                                          float *restrict v,
                                                          const float *restrict g, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_loadu_ps(g + i);
        _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), gi));
        _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), gi));
        _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), gi));
    }
    for (; i < n; i++) {
        p[i] += g[i];
        m[i] += g[i];
        v[i] += g[i];
    }
}

static void mem_plain(float *restrict p, float *restrict m, float *restrict v,
                      const float *restrict g, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p[i] += g[i];
        m[i] += g[i];
        v[i] += g[i];
    }
}

static void task(void *arg, size_t t, int thread)
{
    job_t *j = arg;
    size_t lo = t * CHUNK, len = j->n - lo < CHUNK ? j->n - lo : CHUNK;
    switch (j->which) {
    case 0:
        zs_adam_update(&j->hp, &j->st, j->p + lo, j->m + lo, j->v + lo, j->g + lo, ZS_DTYPE_F32,
                       NULL, ZS_DTYPE_NONE, len);
        break;
    case 1:
        zs_adam_update(&j->hp, &j->st, j->p + lo, j->m + lo, j->v + lo, j->g16 + lo, ZS_DTYPE_BF16,
                       j->out16 + lo, ZS_DTYPE_BF16, len);
        break;
    default:
        if (__builtin_cpu_supports("avx512f"))
            mem_avx512(j->p + lo, j->m + lo, j->v + lo, j->g + lo, len);
        else
            mem_plain(j->p + lo, j->m + lo, j->v + lo, j->g + lo, len);
        break;
    }
}

/* First touch and values: p, g in (-0.5, 0.5), m = 0, v small positive. */
static void init_task(void *arg, size_t t, int thread)
{
    job_t *j = arg;
    size_t lo = t * CHUNK, hi = j->n - lo < CHUNK ? j->n : lo + CHUNK;
    uint32_t s = (uint32_t)t * 2654435761u + 1u;
    for (size_t i = lo; i < hi; i++) {
        s = s * 1664525u + 1013904223u;
        float r = (float)(s >> 8) / 16777216.0f - 0.5f;
        j->p[i] = r;
        j->g[i] = -r * 0.5f;
        j->g16[i] = zs_f32_to_bf16(j->g[i]);
        j->out16[i] = 0;
        j->m[i] = 0.0f;
        j->v[i] = 1e-4f;
    }
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_adam: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* Seconds of one pass of job kind `which` over the arrays. */
static double time_pass(zs_pool_t *pool, job_t *j, int which)
{
    j->which = which;
    double t0 = zs_bench_now();
    zs_pool_run(pool, (j->n + CHUNK - 1) / CHUNK, task, j);
    return zs_bench_now() - t0;
}

/* The fp32 row again on the slower paths (what a CPU without AVX-512 gets). */
static void bench_other_paths(zs_pool_t *pool, job_t *j, const char *label, int reps,
                              const double *mem)
{
    static const char *const paths[] = {"avx2", "portable"};
    const char *best = zs_adam_path();
    for (int k = 0; k < 2; k++) {
        if (strcmp(paths[k], best) == 0 || zs_adam_force_path(paths[k]) != 0)
            continue;
        double rate[ZS_BENCH_MAX_REPS];
        time_pass(pool, j, 0);
        for (int r = 0; r < reps; r++)
            rate[r] = 28.0 * (double)j->n / time_pass(pool, j, 0) / 1e9;
        char name[128];
        snprintf(name, sizeof name, "adamw fp32 grad, no out, 1 thr, %s path", paths[k]);
        zs_bench_row(name, label, rate, reps, mem, reps);
    }
    zs_adam_force_path(NULL);
}

/* zeroshard's Mparams/s per rep, kept for the torch comparison. */
static double zs_mps[MAX_SIZES][MAX_THR][ZS_BENCH_MAX_REPS];
static int zs_threads[MAX_THR];

static void bench_size(int si, size_t n, const char *label, int nthr_all, int reps)
{
    job_t j = {.n = n};
    j.p = xalloc(n * 4);
    j.m = xalloc(n * 4);
    j.v = xalloc(n * 4);
    j.g = xalloc(n * 4);
    j.g16 = xalloc(n * 2);
    j.out16 = xalloc(n * 2);
    j.hp = (zs_adam_hparams_t){1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    j.st = (zs_adam_step_t){1e-3f, 1, 1.0f, 1.0f};
    const double bytes = 28.0 * (double)n;

    for (int ti = 0; ti < MAX_THR; ti++) {
        int nthr = ti == 0 ? 1 : nthr_all;
        zs_threads[ti] = nthr;
        zs_pool_t *pool = zs_pool_create(nthr);
        if (!pool) {
            fprintf(stderr, "bench_adam: cannot create a pool of %d threads\n", nthr);
            exit(1);
        }
        zs_pool_run(pool, (n + CHUNK - 1) / CHUNK, init_task, &j);
        time_pass(pool, &j, 0); /* warm caches, TLB, frequency */
        time_pass(pool, &j, 2);
        double adam[ZS_BENCH_MAX_REPS], adam16[ZS_BENCH_MAX_REPS], mem[ZS_BENCH_MAX_REPS];
        for (int r = 0; r < reps; r++) { /* interleaved, so drift hits all alike */
            j.st.t = r + 2;
            double ta = time_pass(pool, &j, 0);
            double tm = time_pass(pool, &j, 2);
            double t16 = time_pass(pool, &j, 1);
            adam[r] = bytes / ta / 1e9;
            mem[r] = bytes / tm / 1e9;
            adam16[r] = bytes / t16 / 1e9;
            zs_mps[si][ti][r] = (double)n / ta / 1e6;
        }
        char name[128];
        snprintf(name, sizeof name, "adamw fp32 grad, no out, %d thr", nthr);
        zs_bench_row(name, label, adam, reps, mem, reps);
        snprintf(name, sizeof name, "adamw bf16 grad + bf16 out, %d thr", nthr);
        zs_bench_row(name, label, adam16, reps, mem, reps);
        snprintf(name, sizeof name, "memory kernel (baseline), %d thr", nthr);
        zs_bench_row(name, label, mem, reps, NULL, 0);
        if (si == 0 && ti == 0)
            bench_other_paths(pool, &j, label, reps, mem);
        zs_pool_destroy(pool);
    }
    free(j.p);
    free(j.m);
    free(j.v);
    free(j.g);
    free(j.g16);
    free(j.out16);
}

/* Run the torch script; print one row per (variant, threads, size) with
 * zeroshard's rates as the case and torch's as the baseline. */
static void bench_torch(const size_t *sizes, const char *const *labels, int nsizes, int reps)
{
    char cmd[1024], sz[128] = "";
    for (int i = 0; i < nsizes; i++)
        snprintf(sz + strlen(sz), sizeof sz - strlen(sz), "%s%zu", i ? "," : "", sizes[i]);
    snprintf(cmd, sizeof cmd,
             "%s -c 'import torch' >/dev/null 2>&1 && %s %s/bench/bench_adam_torch.py --sizes %s "
             "--threads %d,%d --reps %d",
             ZS_PYTHON, ZS_PYTHON, ZS_SOURCE_DIR, sz, zs_threads[0], zs_threads[1], reps);
    FILE *f = popen(cmd, "r");
    char line[4096];
    int rows = 0;
    zs_bench_header("AdamW vs torch.optim.AdamW (zeroshard = case, torch = baseline)", "Mparams/s");
    while (f && fgets(line, sizeof line, f)) {
        char variant[32];
        int thr, off = 0;
        size_t n;
        if (strncmp(line, "INFO ", 5) == 0) {
            printf("<!-- %.*s -->\n", (int)strcspn(line + 5, "\n"), line + 5);
            continue;
        }
        if (sscanf(line, "ROW %31s %d %zu %n", variant, &thr, &n, &off) != 3)
            continue;
        double tr[ZS_BENCH_MAX_REPS];
        int nt = 0, used;
        char *s = line + off;
        while (nt < ZS_BENCH_MAX_REPS && sscanf(s, "%lf%n", &tr[nt], &used) == 1) {
            nt++;
            s += used;
        }
        for (int si = 0; si < nsizes; si++)
            for (int ti = 0; ti < MAX_THR; ti++)
                if (sizes[si] == n && zs_threads[ti] == thr && nt > 0) {
                    char name[128];
                    snprintf(name, sizeof name, "zs adamw vs torch %s, %d thr", variant, thr);
                    zs_bench_row(name, labels[si], zs_mps[si][ti], reps, tr, nt);
                    rows++;
                    ti = MAX_THR; /* 1 thread == all threads on a 1-CPU machine */
                }
    }
    int st = f ? pclose(f) : -1;
    if (rows == 0)
        printf("| torch AdamW | - | skipped: %s cannot import torch (status %d) | - | - | - |\n",
               ZS_PYTHON, st);
}

int main(int argc, char **argv)
{
    int quick = 0, torch = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--no-torch") == 0)
            torch = 0;
        else {
            fprintf(stderr, "usage: bench_adam [--quick] [--no-torch]\n");
            return 2;
        }
    }
    static const size_t sizes[MAX_SIZES] = {10000000, 100000000};
    static const char *const labels[MAX_SIZES] = {"10M", "100M"};
    int nsizes = quick ? 1 : 2;
    int reps = zs_bench_reps(9);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nthr_all = ncpu > 0 ? (int)ncpu : 1;

    char title[256];
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    snprintf(title, sizeof title,
             "AdamW kernel: zs_adam_update (path %s) vs memory kernel, 28 B/param, %d reps, "
             "%d CPUs, %s",
             zs_adam_path(), reps, nthr_all, date);
    zs_bench_header(title, "GB/s");
    for (int si = 0; si < nsizes; si++)
        bench_size(si, sizes[si], labels[si], nthr_all, reps);
    if (torch)
        bench_torch(sizes, labels, nsizes, reps < 3 ? reps : 3);
    return 0;
}
