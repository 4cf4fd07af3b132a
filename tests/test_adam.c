/*
 * test_adam.c - tests of kernels/zs_adam.c.
 *
 * Verifies:
 *  (1) zs_adam_update_ref follows the formula and scalars documented in
 *      zs_adam.c, recomputed here from scratch (bitwise);
 *  (2) every path the CPU has (avx512, avx2, portable) x grad dtype (fp32,
 *      bf16, fp16) x out dtype (fp32, bf16, fp16, none, NULL) x adam_w_mode x
 *      bias_correction x weight decay on/off, over odd lengths (all tails),
 *      with grad_scale and clip_coef != 1, is bitwise equal to the reference
 *      over several steps, and writes nothing past n;
 *  (3) 20 steps against torch.optim.AdamW and torch.optim.Adam (weight decay
 *      0.01) run by tests/ref/adam_torch.py: p, exp_avg, exp_avg_sq (and the
 *      16-bit output against torch's cast of p) agree within
 *      |a - b| <= ATOL + RTOL * |b|, ATOL 1e-6, RTOL 1e-5 (16-bit outputs: one
 *      unit in the last place of the format). Max errors are printed.
 *      python3 with torch is a required test dependency.
 *
 * Does not test speed (bench/bench_adam.c) or threading (callers split).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs_adam.h"
#include "zs_cast.h"
#include "zs_status.h"
#include "zs_test.h"

#define ATOL 1e-6
#define RTOL 1e-5

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Uniform in (-1, 1). */
static float rndu(void)
{
    return ((float)(rnd32() & 0xFFFFFF) - 8388608.0f) / 8388608.0f;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    TEST_CHECK(p != NULL);
    return p;
}

/* Random gradient of dtype gdt whose scaled value is O(1): raw values are
 * about 1/scale, as a loss-scaled fp16 gradient would be. Some zeros, signed
 * zeros and tiny values for the denominators' edge cases. */
static void fill_grad(void *g, zs_dtype_t gdt, size_t n, float inv_scale)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rnd32() % 16;
        float x = r == 0 ? 0.0f : r == 1 ? -0.0f : r == 2 ? rndu() * 1e-6f : rndu() * inv_scale;
        if (gdt == ZS_DTYPE_F32)
            ((float *)g)[i] = x;
        else if (gdt == ZS_DTYPE_BF16)
            ((uint16_t *)g)[i] = zs_f32_to_bf16(x);
        else
            ((uint16_t *)g)[i] = zs_f32_to_f16(x);
    }
}

static void fill_state(float *p, float *m, float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = rndu();
        m[i] = rnd32() % 8 == 0 ? 0.0f : rndu() * 0.1f;
        v[i] = rnd32() % 8 == 0 ? 0.0f : rndu() * rndu() * 0.01f + 0.01f;
    }
}

/* ---------------------------------------------- (1) ref vs the formula */

static void test_ref_formula(void)
{
    enum { N = 257 };
    static const int64_t ts[] = {1, 2, 3, 5, 10, 37, 100, 1000, 12345};
    float p[N], m[N], v[N], g[N], rp[N], rm[N], rv[N];
    fill_state(p, m, v, N);
    fill_grad(g, ZS_DTYPE_F32, N, 1.0f);
    for (int wmode = 0; wmode < 2; wmode++) {
        for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
            int64_t t = ts[k];
            zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, wmode, 1};
            float lr = 3e-4f * (float)(1 + 37 * k);
            zs_adam_step_t st = {lr, t, 0.75f, 0.6f};
            memcpy(rp, p, sizeof p);
            memcpy(rm, m, sizeof m);
            memcpy(rv, v, sizeof v);
            zs_adam_update_ref(&hp, &st, rp, rm, rv, g, ZS_DTYPE_F32, NULL, ZS_DTYPE_NONE, N);
            /* The scalars as documented in zs_adam.c. */
            float ss = (float)(lr / (1.0 - pow(0.9f, (double)t)));
            float bc2s = (float)sqrt(1.0 - pow(0.999f, (double)t));
            float decay = (float)(1.0 - (double)lr * (double)0.05f);
            for (size_t i = 0; i < N; i++) {
                float gi = g[i] * 0.75f * 0.6f, pi = p[i];
                if (!wmode)
                    gi = gi + 0.05f * pi;
                float mi = 0.9f * m[i] + (1.0f - 0.9f) * gi;
                float vi = 0.999f * v[i] + (1.0f - 0.999f) * gi * gi;
                float denom = sqrtf(vi) / bc2s + 1e-8f;
                if (wmode)
                    pi = pi * decay;
                pi = pi - ss * mi / denom;
                TEST_CHECKF(memcmp(&pi, &rp[i], 4) == 0 && memcmp(&mi, &rm[i], 4) == 0 &&
                                memcmp(&vi, &rv[i], 4) == 0,
                            "ref differs from the documented formula at %zu (wmode %d, t %lld)", i,
                            wmode, (long long)t);
            }
        }
    }
}

/* ------------------------------------------- (2) every path vs the ref */

typedef struct {
    size_t n;
    float *p0, *m0, *v0;
    float *p, *m, *v, *rp, *rm, *rv;
    float *fp, *fm, *fv, *qp, *qm, *qv; /* zs_adam_update_from: from f* to q* */
    float *sp, *sm, *sv;                /* zs_adam_update_save: q* in place, old to s* */
    void *grad;
    uint8_t *out, *rout, *qout; /* n elements + guard */
} bufs_t;

static void bufs_init(bufs_t *b, size_t n)
{
    b->n = n;
    float **fs[] = {&b->p0, &b->m0, &b->v0, &b->p,  &b->m,  &b->v,  &b->rp, &b->rm, &b->rv,
                    &b->fp, &b->fm, &b->fv, &b->qp, &b->qm, &b->qv, &b->sp, &b->sm, &b->sv};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++)
        *fs[k] = xmalloc(n * sizeof(float));
    b->grad = xmalloc(n * sizeof(float));
    b->out = xmalloc(n * 4 + 64);
    b->rout = xmalloc(n * 4 + 64);
    b->qout = xmalloc(n * 4 + 64);
}

static void bufs_free(bufs_t *b)
{
    float *fs[] = {b->p0, b->m0, b->v0, b->p,  b->m,  b->v,  b->rp, b->rm, b->rv,
                   b->fp, b->fm, b->fv, b->qp, b->qm, b->qv, b->sp, b->sm, b->sv};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++)
        free(fs[k]);
    free(b->grad);
    free(b->out);
    free(b->rout);
    free(b->qout);
}

static void check_same(const char *what, const void *a, const void *b, size_t bytes,
                       const char *ctx)
{
    if (memcmp(a, b, bytes) == 0)
        return;
    const uint8_t *x = a, *y = b;
    size_t k = 0;
    while (x[k] == y[k])
        k++;
    TEST_CHECKF(0, "%s: %s differs from zs_adam_update_ref at byte %zu of %zu", ctx, what, k,
                bytes);
}

/* One configuration: 3 steps on `path` and on the reference, compared
 * bitwise after each step; out_null passes out = NULL. Each step also runs
 * zs_adam_update_from from a copy of the state into poisoned buffers (it
 * must leave the copy alone and give the in-place step's bits), then
 * zs_adam_update_save on that copy (the same bits, and the old state in
 * poisoned save buffers). */
static void run_case(bufs_t *b, const char *path, zs_dtype_t gdt, zs_dtype_t pdt, int wmode, int bc,
                     float wd, int out_null, size_t n)
{
    char ctx[200];
    snprintf(ctx, sizeof ctx, "path=%s grad=%s out=%s%s adam_w=%d bc=%d wd=%g n=%zu", path,
             zs_dtype_name(gdt), zs_dtype_name(pdt), out_null ? "(NULL)" : "", wmode, bc, wd, n);
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, wd, wmode, bc};
    fill_state(b->p, b->m, b->v, n);
    memcpy(b->p0, b->p, n * 4);
    memcpy(b->rp, b->p, n * 4);
    memcpy(b->rm, b->m, n * 4);
    memcpy(b->rv, b->v, n * 4);
    static const int64_t steps[] = {1, 2, 1000};
    for (int s = 0; s < 3; s++) {
        zs_adam_step_t st = {1e-3f * (float)(s + 1), steps[s], 1.0f / 3072.0f, 0.37f};
        if (s == 2) {
            st.grad_scale = 1.0f;
            st.clip_coef = 1.0f;
        }
        fill_grad(b->grad, gdt, n, 1.0f / (st.grad_scale * st.clip_coef));
        memset(b->out, 0xA5, n * 4 + 64);
        memset(b->rout, 0xA5, n * 4 + 64);
        memset(b->qout, 0xA5, n * 4 + 64);
        memcpy(b->fp, b->p, n * 4);
        memcpy(b->fm, b->m, n * 4);
        memcpy(b->fv, b->v, n * 4);
        memset(b->qp, 0x7F, n * 4);
        memset(b->qm, 0x7F, n * 4);
        memset(b->qv, 0x7F, n * 4);
        zs_adam_update_from(&hp, &st, b->fp, b->fm, b->fv, b->qp, b->qm, b->qv, b->grad, gdt,
                            out_null ? NULL : b->qout, pdt, n);
        check_same("from: p0", b->fp, b->rp, n * 4, ctx); /* the ref holds the old state */
        check_same("from: m0", b->fm, b->rm, n * 4, ctx);
        check_same("from: v0", b->fv, b->rv, n * 4, ctx);
        zs_adam_update(&hp, &st, b->p, b->m, b->v, b->grad, gdt, out_null ? NULL : b->out, pdt, n);
        zs_adam_update_ref(&hp, &st, b->rp, b->rm, b->rv, b->grad, gdt, out_null ? NULL : b->rout,
                           pdt, n);
        check_same("p", b->p, b->rp, n * 4, ctx);
        check_same("m", b->m, b->rm, n * 4, ctx);
        check_same("v", b->v, b->rv, n * 4, ctx);
        /* out: equal over the whole buffer, so also untouched past n (and
         * untouched entirely for NONE / NULL, where rout stays 0xA5) */
        check_same("out", b->out, b->rout, n * 4 + 64, ctx);
        check_same("from: p", b->qp, b->rp, n * 4, ctx);
        check_same("from: m", b->qm, b->rm, n * 4, ctx);
        check_same("from: v", b->qv, b->rv, n * 4, ctx);
        check_same("from: out", b->qout, b->rout, n * 4 + 64, ctx);
        memcpy(b->qp, b->fp, n * 4); /* the old state again */
        memcpy(b->qm, b->fm, n * 4);
        memcpy(b->qv, b->fv, n * 4);
        memset(b->sp, 0x7F, n * 4);
        memset(b->sm, 0x7F, n * 4);
        memset(b->sv, 0x7F, n * 4);
        memset(b->qout, 0xA5, n * 4 + 64);
        zs_adam_update_save(&hp, &st, b->qp, b->qm, b->qv, b->sp, b->sm, b->sv, b->grad, gdt,
                            out_null ? NULL : b->qout, pdt, n);
        check_same("save: p", b->qp, b->rp, n * 4, ctx);
        check_same("save: m", b->qm, b->rm, n * 4, ctx);
        check_same("save: v", b->qv, b->rv, n * 4, ctx);
        check_same("save: out", b->qout, b->rout, n * 4 + 64, ctx);
        check_same("save: old p", b->sp, b->fp, n * 4, ctx);
        check_same("save: old m", b->sm, b->fm, n * 4, ctx);
        check_same("save: old v", b->sv, b->fv, n * 4, ctx);
        size_t written = out_null || pdt == ZS_DTYPE_NONE ? 0 : n * zs_dtype_size(pdt);
        for (size_t k = written; k < n * 4 + 64; k++)
            TEST_CHECKF(b->out[k] == 0xA5, "%s: byte %zu past the output was written", ctx, k);
    }
    /* the steps moved p (so equal buffers do not just mean "untouched") */
    TEST_CHECKF(n < 7 || memcmp(b->p, b->p0, n * 4) != 0, "%s: p unchanged", ctx);
}

static void test_paths(void)
{
    static const char *paths[] = {"avx512", "avx2", "portable"};
    static const size_t lens[] = {1, 7, 8, 15, 16, 17, 31, 33, 63, 1001};
    bufs_t b;
    bufs_init(&b, 65537);
    int tested = 0, cases = 0;
    TEST_CHECK(zs_adam_force_path("sse9") == ZS_ERR_INVALID);
    for (int pi = 0; pi < 3; pi++) {
        if (zs_adam_force_path(paths[pi]) != ZS_OK) {
            printf("path %s: not supported by this CPU, skipped\n", paths[pi]);
            continue;
        }
        TEST_CHECK(strcmp(zs_adam_path(), paths[pi]) == 0);
        tested++;
        for (int g = 0; g < 3; g++)
            for (int o = 0; o < 5; o++) /* o == 4: out = NULL with pdt fp32 */
                for (int wmode = 0; wmode < 2; wmode++)
                    for (int bc = 0; bc < 2; bc++)
                        for (int wdi = 0; wdi < 2; wdi++) {
                            size_t n = lens[(size_t)cases % (sizeof lens / sizeof lens[0])];
                            zs_dtype_t pdt = o == 4 ? ZS_DTYPE_F32 : (zs_dtype_t)o;
                            run_case(&b, paths[pi], (zs_dtype_t)g, pdt, wmode, bc,
                                     wdi ? 0.01f : 0.0f, o == 4, n);
                            cases++;
                        }
        /* every length on one configuration, and a long odd one on each dtype pair */
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
            run_case(&b, paths[pi], ZS_DTYPE_BF16, ZS_DTYPE_F16, 1, 1, 0.01f, 0, lens[k]);
        for (int g = 0; g < 3; g++)
            for (int o = 0; o < 4; o++)
                run_case(&b, paths[pi], (zs_dtype_t)g, (zs_dtype_t)o, g & 1, 1, 0.01f, 0, 65537);
    }
    TEST_CHECK(zs_adam_force_path(NULL) == ZS_OK);
    printf("zs_adam automatic path: %s; %d paths bitwise equal to the reference (%d cases)\n",
           zs_adam_path(), tested, cases);
    TEST_CHECK(tested >= 1);
    bufs_free(&b);
}

/* ------------------------------------------------------ (3) vs PyTorch */

typedef struct {
    const char *name;
    int adam_w_mode;
    zs_dtype_t gdt, pdt;
} torch_case_t;

static const torch_case_t torch_cases[] = {
    {"adamw_f32", 1, ZS_DTYPE_F32, ZS_DTYPE_NONE},
    {"adam_f32", 0, ZS_DTYPE_F32, ZS_DTYPE_NONE},
    {"adamw_bf16", 1, ZS_DTYPE_BF16, ZS_DTYPE_BF16},
    {"adam_f16", 0, ZS_DTYPE_F16, ZS_DTYPE_F16},
};
#define NCASES   (sizeof torch_cases / sizeof torch_cases[0])
#define TORCH_N  4099
#define TORCH_ST 20

static void write_file(const char *dir, const char *name, const char *suffix, const void *data,
                       size_t bytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s%s", dir, name, suffix);
    FILE *f = fopen(path, "wb");
    TEST_CHECKF(f != NULL, "cannot create %s", path);
    TEST_CHECK(fwrite(data, 1, bytes, f) == bytes);
    TEST_CHECK(fclose(f) == 0);
}

static void read_file(const char *dir, const char *name, const char *suffix, void *data,
                      size_t bytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s%s", dir, name, suffix);
    FILE *f = fopen(path, "rb");
    TEST_CHECKF(f != NULL, "torch reference wrote no %s", path);
    TEST_CHECKF(fread(data, 1, bytes, f) == bytes, "%s is short", path);
    fclose(f);
}

static void remove_file(const char *dir, const char *name, const char *suffix)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s%s", dir, name, suffix);
    unlink(path);
}

static double to_f32(const void *buf, zs_dtype_t dt, size_t i)
{
    if (dt == ZS_DTYPE_BF16)
        return zs_bf16_to_f32(((const uint16_t *)buf)[i]);
    if (dt == ZS_DTYPE_F16)
        return zs_f16_to_f32(((const uint16_t *)buf)[i]);
    return ((const float *)buf)[i];
}

static void require_torch(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", ZS_PYTHON);
    if (system(cmd) != 0) {
        fprintf(stderr,
                "FAIL: %s cannot import torch. python3-torch is a required test dependency: "
                "run deploy/install-deps.sh\n",
                ZS_PYTHON);
        exit(1);
    }
}

static void test_vs_torch(void)
{
    const size_t n = TORCH_N;
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    const float gscale = 0.25f, clip = 0.8f;
    require_torch();

    char dir[] = "/tmp/zs_test_adam_XXXXXX";
    TEST_CHECK(mkdtemp(dir) != NULL);
    char list[512];
    snprintf(list, sizeof list, "%s/cases.txt", dir);
    FILE *lf = fopen(list, "w");
    TEST_CHECK(lf != NULL);

    float *p0 = xmalloc(n * 4), *grads = xmalloc(TORCH_ST * n * 4);
    uint16_t *g16 = xmalloc(TORCH_ST * n * 2);
    float *p = xmalloc(n * 4), *m = xmalloc(n * 4), *v = xmalloc(n * 4), *tv = xmalloc(3 * n * 4);
    uint16_t *out16 = xmalloc(n * 2), *tout16 = xmalloc(n * 2);
    static float results[NCASES][3 * TORCH_N];
    static uint16_t outs[NCASES][TORCH_N];

    /* Write the inputs; run our side while we are at it. */
    for (size_t c = 0; c < NCASES; c++) {
        const torch_case_t *tc = &torch_cases[c];
        for (size_t i = 0; i < n; i++)
            p0[i] = rndu();
        for (size_t i = 0; i < TORCH_ST * n; i++) {
            float x = rndu() * 4.0f; /* times gscale*clip = 0.2: O(1) gradients */
            if (tc->gdt == ZS_DTYPE_F32)
                grads[i] = x;
            else
                g16[i] = tc->gdt == ZS_DTYPE_BF16 ? zs_f32_to_bf16(x) : zs_f32_to_f16(x);
        }
        const void *gbuf = tc->gdt == ZS_DTYPE_F32 ? (const void *)grads : (const void *)g16;
        size_t gsz = zs_dtype_size(tc->gdt);
        write_file(dir, tc->name, "_p0.bin", p0, n * 4);
        write_file(dir, tc->name, "_grads.bin", gbuf, TORCH_ST * n * gsz);
        fprintf(lf, "%s %s %s %zu %d %a %a %a %a %a %a %a\n", tc->name,
                tc->adam_w_mode ? "adamw" : "adam", zs_dtype_name(tc->gdt), n, TORCH_ST, (double)lr,
                (double)b1, (double)b2, (double)eps, (double)wd, (double)gscale, (double)clip);

        zs_adam_hparams_t hp = {lr, b1, b2, eps, wd, tc->adam_w_mode, 1};
        memcpy(p, p0, n * 4);
        memset(m, 0, n * 4);
        memset(v, 0, n * 4);
        for (int s = 0; s < TORCH_ST; s++) {
            zs_adam_step_t st = {lr, s + 1, gscale, clip};
            zs_adam_update(&hp, &st, p, m, v, (const char *)gbuf + (size_t)s * n * gsz, tc->gdt,
                           out16, tc->pdt, n);
        }
        memcpy(results[c], p, n * 4);
        memcpy(results[c] + n, m, n * 4);
        memcpy(results[c] + 2 * n, v, n * 4);
        memcpy(outs[c], out16, n * 2);
    }
    TEST_CHECK(fclose(lf) == 0);

    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/adam_torch.py %s", ZS_PYTHON, ZS_SOURCE_DIR, dir);
    int rc = system(cmd);
    TEST_CHECKF(rc == 0, "%s failed (status %d)", cmd, rc);

    for (size_t c = 0; c < NCASES; c++) {
        const torch_case_t *tc = &torch_cases[c];
        read_file(dir, tc->name, "_out.bin", tv, 3 * n * 4);
        static const char *names[] = {"p", "exp_avg", "exp_avg_sq"};
        printf("torch %-10s (%s, %d steps, n=%zu, path %s):", tc->name,
               tc->adam_w_mode ? "AdamW" : "Adam", TORCH_ST, n, zs_adam_path());
        for (int k = 0; k < 3; k++) {
            double maxerr = 0.0, maxrel = 0.0;
            size_t same = 0;
            for (size_t i = 0; i < n; i++) {
                double a = results[c][k * n + i], t = tv[k * n + i];
                TEST_CHECKF(zs_test_close(a, t, ATOL, RTOL, &maxerr),
                            "%s %s[%zu]: zeroshard %.9g torch %.9g", tc->name, names[k], i, a, t);
                if (t != 0.0 && fabs(a - t) / fabs(t) > maxrel)
                    maxrel = fabs(a - t) / fabs(t);
                same += a == t;
            }
            printf(" %s max abs %.3g rel %.3g (%zu/%zu bitwise);", names[k], maxerr, maxrel, same,
                   n);
        }
        if (tc->pdt != ZS_DTYPE_NONE) {
            /* 16-bit output vs torch's p.to(dtype): within one unit in the last place */
            read_file(dir, tc->name, "_out16.bin", tout16, n * 2);
            double ulp_rel = tc->pdt == ZS_DTYPE_BF16 ? ldexp(1.0, -7) : ldexp(1.0, -10);
            double maxerr = 0.0;
            size_t same = 0;
            for (size_t i = 0; i < n; i++) {
                double a = to_f32(outs[c], tc->pdt, i), t = to_f32(tout16, tc->pdt, i);
                TEST_CHECKF(zs_test_close(a, t, 1e-6, ulp_rel, &maxerr), "%s out[%zu]: %g vs %g",
                            tc->name, i, a, t);
                same += outs[c][i] == tout16[i];
            }
            printf(" out %s max abs %.3g (%zu/%zu bitwise)", zs_dtype_name(tc->pdt), maxerr, same,
                   n);
        }
        printf("\n");
        remove_file(dir, tc->name, "_p0.bin");
        remove_file(dir, tc->name, "_grads.bin");
        remove_file(dir, tc->name, "_out.bin");
        remove_file(dir, tc->name, "_out16.bin");
    }
    printf("tolerance: |a - b| <= %g + %g * |b|\n", ATOL, RTOL);
    remove_file(dir, "cases", ".txt");
    TEST_CHECKF(rmdir(dir) == 0, "temp dir %s not empty", dir);
    free(p0);
    free(grads);
    free(g16);
    free(p);
    free(m);
    free(v);
    free(tv);
    free(out16);
    free(tout16);
}

int main(void)
{
    test_ref_formula();
    test_paths();
    test_vs_torch();
    printf("test_adam: OK\n");
    return 0;
}
