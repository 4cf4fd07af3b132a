/*
 * test_shard_spec.c - unit tests of speculative updates on the shard
 * (server/zs_shard_spec.c), driven directly (no gRPC) on temp data dirs.
 *
 * The shard is server 1 of 2 for P = 300007 (3 optimizer chunks, the last
 * one short). Every step pushes its range as two Push streams (as two
 * workers do) stating the expected scalars, waits until the optimizer
 * thread has speculated every chunk it may, then:
 *   - pulls step S-1 in fp32 and bf16 and gets the committed state (the
 *     pre-images), not the speculative one;
 *   - commits with the expected scalars (kept) or with others: clipping
 *     (clip_coef 0.5), another loss scale, another lr, another param_dtype,
 *     an fp16 overflow (skip), a chunk re-pushed after it was speculated;
 *   - compares all three tensors bitwise with a plain reference (one
 *     zs_adam_update over the whole range), and the bf16/fp16 pull with
 *     zs_cast of the reference, and counts hits and rollbacks.
 * Gradients in fp32, bf16 and fp16. Then: a checkpoint taken while step S
 * is speculated holds step S-1 (restored on a fresh shard: bitwise the
 * reference), and a shard destroyed mid-speculation reopens at the last
 * checkpoint; a window of one pre-image (smaller than the range) and a
 * memory budget too small for any pre-image speculate less and still
 * match; the pre-images are counted in the budget. Last, commits right
 * behind their pushes on 4M elements stop speculation part-way (a chunk
 * half-updated is undone) and still match.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cast.h"
#include "zs_layout.h"
#include "zs_log.h"
#include "zs_shard.h"
#include "zs_synth.h"
#include "zs_test.h"

#define P     300007ull
#define S     2u
#define INDEX 1u
#define MODEL "spec-model"
#define SLOT  (12ull * ZS_OPT_CHUNK) /* bytes of one chunk's pre-image */

static uint64_t g_P = P, g_rb, g_re, g_n;
static zs_adam_hparams_t g_hp;

typedef struct {
    float *t[3];
    uint64_t applied, ostep;
} state_t;

static void state_alloc(state_t *s)
{
    for (int t = 0; t < 3; t++)
        TEST_CHECK((s->t[t] = calloc(g_n, 4)));
    s->applied = s->ostep = 0;
}

static void state_free(state_t *s)
{
    for (int t = 0; t < 3; t++)
        free(s->t[t]);
}

static void state_copy(state_t *d, const state_t *s)
{
    for (int t = 0; t < 3; t++)
        memcpy(d->t[t], s->t[t], g_n * 4);
    d->applied = s->applied;
    d->ostep = s->ostep;
}

static zs_shard_info_t info(zs_shard_t *sh)
{
    zs_err_t err;
    zs_shard_info_t in;
    TEST_OK(zs_shard_info(sh, &in, &err), err);
    free(in.checkpoints);
    return in;
}

/* The shard's state must equal `want` bitwise (GetState: the committed
 * state). */
static void expect_state(zs_shard_t *sh, const state_t *want, const char *what)
{
    static const char *names[3] = {"master", "exp_avg", "exp_avg_sq"};
    float *got = malloc(g_n * 4);
    zs_err_t err;
    TEST_CHECK(got);
    for (int t = 0; t < 3; t++) {
        uint64_t step;
        TEST_OK(zs_shard_get_state(sh, (zs_tensor_t)t, g_rb, g_n, got, &step, &err), err);
        for (uint64_t i = 0; i < g_n; i++)
            TEST_CHECKF(memcmp(&got[i], &want->t[t][i], 4) == 0, "%s: %s[%llu] is %.9g, want %.9g",
                        what, names[t], (unsigned long long)(g_rb + i), got[i], want->t[t][i]);
    }
    zs_shard_info_t in = info(sh);
    TEST_CHECKF(in.applied_step == want->applied && in.optimizer_step == want->ostep,
                "%s: steps (%llu, %llu), want (%llu, %llu)", what,
                (unsigned long long)in.applied_step, (unsigned long long)in.optimizer_step,
                (unsigned long long)want->applied, (unsigned long long)want->ostep);
    free(got);
}

/* Pull [rb, re) at min_step in dt: it must be zs_cast of want's master and
 * say it reflects `step`. */
static void expect_pull(zs_shard_t *sh, uint64_t min_step, zs_dtype_t dt, const state_t *want,
                        const char *what)
{
    size_t esz = zs_dtype_size(dt);
    char *got = malloc(g_n * esz), *exp = malloc(g_n * esz);
    TEST_CHECK(got && exp);
    zs_err_t err;
    uint64_t step = 0;
    TEST_OK(zs_shard_pull(sh, min_step, g_rb, g_n, dt, got, zs_now_ms() + 20000, NULL, NULL, &step,
                          &err),
            err);
    zs_cast(exp, dt, want->t[0], ZS_DTYPE_F32, (size_t)g_n);
    for (uint64_t i = 0; i < g_n; i++)
        TEST_CHECKF(memcmp(got + i * esz, exp + i * esz, esz) == 0,
                    "%s: %s pull of element %llu differs from the committed state", what,
                    zs_dtype_name(dt), (unsigned long long)(g_rb + i));
    TEST_CHECKF(step == want->applied, "%s: pull says step %llu, want %llu", what,
                (unsigned long long)step, (unsigned long long)want->applied);
    free(got);
    free(exp);
}

static int init_model(zs_shard_t *sh)
{
    zs_shard_identity_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.model_name, sizeof id.model_name, "%s", MODEL);
    id.num_params = g_P;
    id.num_servers = S;
    id.server_index = INDEX;
    zs_err_t err;
    zs_shard_init_t *in;
    TEST_OK(zs_shard_init_begin(sh, &id, &g_hp, 0, 0, &in, &err), err);
    float *dst;
    TEST_OK(zs_shard_init_reserve(in, g_rb, g_n, &dst, &err), err);
    for (uint64_t i = 0; i < g_n; i++)
        dst[i] = zs_synth_weight(g_rb + i);
    return zs_shard_init_end(in, &err);
}

static void ref_init(state_t *r)
{
    for (uint64_t i = 0; i < g_n; i++) {
        r->t[0][i] = zs_synth_weight(g_rb + i);
        r->t[1][i] = r->t[2][i] = 0;
    }
    r->applied = r->ostep = 0;
}

static void ref_step(state_t *r, const zs_commit_t *c, const void *g, zs_dtype_t dt)
{
    r->applied = c->step;
    if (c->skip)
        return;
    r->ostep++;
    zs_adam_step_t st = {c->lr, (int64_t)r->ostep, c->grad_scale, c->clip_coef};
    zs_adam_update(&g_hp, &st, r->t[0], r->t[1], r->t[2], g, dt, NULL, ZS_DTYPE_NONE, (size_t)g_n);
}

/* Gradients of `step` over the range in dt (malloc'd); `salt` varies them. */
static void *grads(uint64_t step, zs_dtype_t dt, int salt)
{
    float *tmp = malloc(g_n * 4);
    void *g = malloc(g_n * 4);
    TEST_CHECK(tmp && g);
    for (uint64_t i = 0; i < g_n; i++)
        tmp[i] =
            0.5f * zs_rand_unit(step * 7 + (uint64_t)salt, g_rb + i) + 0.01f * (float)(step % 7);
    zs_cast(g, dt, tmp, ZS_DTYPE_F32, (size_t)g_n);
    free(tmp);
    return g;
}

/* One Push stream of [a, b) of g in 40000-element chunks, stating `expect`
 * (NULL: none). */
static void push_stream(zs_shard_t *sh, uint64_t step, uint64_t a, uint64_t b, const void *g,
                        zs_dtype_t dt, const zs_commit_t *expect)
{
    zs_err_t err;
    zs_shard_push_t *ps;
    TEST_OK(zs_shard_push_begin(sh, &ps, &err), err);
    if (expect)
        TEST_OK(zs_shard_push_expect(ps, expect, &err), err);
    size_t esz = zs_dtype_size(dt);
    for (uint64_t off = a; off < b; off += 40000) {
        uint64_t k = b - off < 40000 ? b - off : 40000;
        void *dst;
        TEST_OK(zs_shard_push_chunk(ps, step, off, k, dt, &dst, &err), err);
        memcpy(dst, (const char *)g + (off - g_rb) * esz, k * esz);
        zs_shard_push_chunk_done(ps);
    }
    uint64_t staged;
    TEST_OK(zs_shard_push_end(ps, 1, &staged, &err), err);
}

/* spec_want of a window of one pre-image: one chunk, whichever was fully
 * staged first (a whole one or the short last one). */
#define ONE_CHUNK UINT64_MAX

/* Wait until the shard has speculated `want` more elements than `base`;
 * returns how many it did. */
static uint64_t wait_spec(zs_shard_t *sh, uint64_t base, uint64_t want, const char *what)
{
    int64_t t0 = zs_now_ms();
    uint64_t got = 0, last = g_n - 2 * ZS_OPT_CHUNK;
    while (zs_now_ms() - t0 < 20000) {
        got = info(sh).counters.spec_elements - base;
        if (want == ONE_CHUNK ? got > 0 : got >= want)
            break;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    if (want == ONE_CHUNK) {
        struct timespec ts = {0, 50000000}; /* and no second one comes */
        nanosleep(&ts, NULL);
        got = info(sh).counters.spec_elements - base;
        TEST_CHECKF(got == ZS_OPT_CHUNK || got == last,
                    "%s: %llu elements speculated, want one chunk (%u or %llu)", what,
                    (unsigned long long)got, ZS_OPT_CHUNK, (unsigned long long)last);
    } else
        TEST_CHECKF(got == want, "%s: %llu elements speculated, want %llu", what,
                    (unsigned long long)got, (unsigned long long)want);
    return got;
}

typedef enum {
    KEEP,      /* commit with the expected scalars */
    CLIP,      /* clipping triggered: clip_coef 0.5 */
    SCALE,     /* another grad_scale (the loss scale changed) */
    LR,        /* another lr */
    PDTYPE,    /* another param_dtype */
    SKIP,      /* fp16 overflow: skipped */
    REPUSH,    /* a speculated chunk re-pushed with other bytes before commit */
    NO_EXPECT, /* the streams state nothing: the plain path */
} how_t;

static const char *how_name(how_t h)
{
    static const char *n[] = {"kept",
                              "clipped",
                              "other grad_scale",
                              "other lr",
                              "other dtype",
                              "skipped (overflow)",
                              "chunk re-pushed",
                              "no expectation"};
    return n[h];
}

/* Step `step` with gradients in gdt, low-precision copy pdt, committed as
 * `how`; `spec_want` elements must be speculated first. */
static void spec_step(zs_shard_t *sh, state_t *ref, uint64_t step, zs_dtype_t gdt, zs_dtype_t pdt,
                      how_t how, uint64_t spec_want)
{
    char what[160];
    snprintf(what, sizeof what, "step %llu, %s grads, %s copy, %s", (unsigned long long)step,
             zs_dtype_name(gdt), pdt == ZS_DTYPE_NONE ? "no" : zs_dtype_name(pdt), how_name(how));
    zs_shard_info_t before = info(sh);
    void *g = grads(step, gdt, 0);
    zs_commit_t ex = {step, 1.0f / (1024.0f * 2), 1.0f, 1e-3f * (float)(1 + step % 3), 0, pdt};
    uint64_t mid = g_rb + g_n / 2 + 12345; /* two "workers", split inside a chunk */
    const zs_commit_t *e = how == NO_EXPECT ? NULL : &ex;
    push_stream(sh, step, mid, g_re, g, gdt, e);
    push_stream(sh, step, g_rb, mid, g, gdt, e);
    uint64_t nspec =
        wait_spec(sh, before.counters.spec_elements, how == NO_EXPECT ? 0 : spec_want, what);

    /* Before Commit, readers see step - 1. */
    expect_pull(sh, step - 1, ZS_DTYPE_F32, ref, what);
    expect_pull(sh, step - 1, ZS_DTYPE_BF16, ref, what);

    if (how == REPUSH) { /* chunk 0 again, other bytes: they are what commits */
        void *g2 = grads(step, gdt, 1);
        size_t esz = zs_dtype_size(gdt);
        memcpy(g, g2, ZS_OPT_CHUNK * esz);
        push_stream(sh, step, g_rb, g_rb + ZS_OPT_CHUNK, g, gdt, e);
        free(g2);
    }
    zs_commit_t c = ex;
    switch (how) {
    case CLIP:
        c.clip_coef = 0.5f;
        break;
    case SCALE:
        c.grad_scale *= 2.0f;
        break;
    case LR:
        c.lr = nextafterf(c.lr, 1.0f); /* one ulp: bitwise, not roughly */
        break;
    case PDTYPE:
        c.param_dtype = pdt == ZS_DTYPE_F16 ? ZS_DTYPE_BF16 : ZS_DTYPE_F16;
        break;
    case SKIP:
        c.skip = 1;
        break;
    default:
        break;
    }
    zs_err_t err;
    uint64_t applied, ostep;
    TEST_OK(zs_shard_commit(sh, &c, &applied, &ostep, &err), err);
    ref_step(ref, &c, g, gdt);
    TEST_CHECK(applied == ref->applied && ostep == ref->ostep);
    zs_dtype_t got_pdt = c.param_dtype == ZS_DTYPE_NONE ? ZS_DTYPE_BF16 : c.param_dtype;
    expect_pull(sh, step, got_pdt, ref, what);
    expect_pull(sh, step, ZS_DTYPE_F32, ref, what);
    expect_state(sh, ref, what);

    zs_shard_info_t after = info(sh);
    uint64_t hits = after.counters.spec_hits - before.counters.spec_hits;
    uint64_t rbs = after.counters.spec_rollbacks - before.counters.spec_rollbacks;
    int spec = how != NO_EXPECT && spec_want > 0;
    TEST_CHECKF(hits == (uint64_t)(spec && how == KEEP) && rbs == (uint64_t)(spec && how != KEEP),
                "%s: %llu hits, %llu rollbacks", what, (unsigned long long)hits,
                (unsigned long long)rbs);
    printf("ok  %s: %llu elements speculated, %s, bitwise the plain step\n", what,
           (unsigned long long)nspec,
           hits  ? "kept"
           : rbs ? "rolled back"
                 : "plain");
    free(g);
}

static zs_shard_t *open_shard(const char *dir, uint64_t window, uint64_t budget)
{
    zs_shard_opts_t o = {dir, 2, 2, "spec", budget, window};
    zs_shard_t *sh;
    zs_err_t err;
    TEST_OK(zs_shard_create(&o, &sh, &err), err);
    return sh;
}

static char g_dirs[4][32];

static void remove_dirs(void)
{
    for (int i = 0; i < 4; i++)
        if (g_dirs[i][0]) {
            char cmd[160];
            snprintf(cmd, sizeof cmd, "rm -rf %s", g_dirs[i]);
            if (system(cmd) != 0)
                fprintf(stderr, "cannot remove %s\n", g_dirs[i]);
        }
}

static const char *make_dir(int i)
{
    snprintf(g_dirs[i], sizeof g_dirs[i], "/tmp/zs-spec-XXXXXX");
    TEST_CHECK(mkdtemp(g_dirs[i]));
    return g_dirs[i];
}

/* Every way a commit can differ from the expectation, each dtype. */
static void all_cases(const char *dir)
{
    zs_shard_t *sh = open_shard(dir, ZS_SPEC_WINDOW_DEFAULT, 0);
    state_t ref;
    state_alloc(&ref);
    zs_err_t err;
    TEST_OK(init_model(sh), err);
    ref_init(&ref);
    uint64_t s = 1;
    const zs_dtype_t F32 = ZS_DTYPE_F32, BF = ZS_DTYPE_BF16, FH = ZS_DTYPE_F16, NO = ZS_DTYPE_NONE;
    spec_step(sh, &ref, s++, F32, NO, KEEP, g_n);
    spec_step(sh, &ref, s++, BF, BF, KEEP, g_n);
    spec_step(sh, &ref, s++, BF, BF, CLIP, g_n);
    spec_step(sh, &ref, s++, FH, FH, KEEP, g_n);
    spec_step(sh, &ref, s++, FH, FH, SKIP, g_n);
    spec_step(sh, &ref, s++, FH, FH, SCALE, g_n);
    spec_step(sh, &ref, s++, F32, NO, LR, g_n);
    spec_step(sh, &ref, s++, F32, BF, PDTYPE, g_n);
    spec_step(sh, &ref, s++, BF, BF, REPUSH, g_n);
    spec_step(sh, &ref, s++, F32, NO, NO_EXPECT, 0);
    spec_step(sh, &ref, s++, F32, FH, CLIP, g_n);
    spec_step(sh, &ref, s++, BF, BF, KEEP, g_n);
    zs_shard_info_t in = info(sh);
    TEST_CHECKF(in.counters.spec_window_bytes == 3 * SLOT,
                "pre-images hold %llu bytes, want 3 slots (%llu)",
                (unsigned long long)in.counters.spec_window_bytes, 3 * SLOT);
    TEST_CHECKF(in.mem_reserved >= in.mem_state + in.counters.spec_window_bytes,
                "pre-images are not counted in the budget: %llu reserved, %llu state + %llu",
                (unsigned long long)in.mem_reserved, (unsigned long long)in.mem_state,
                (unsigned long long)in.counters.spec_window_bytes);
    printf("ok  pre-images: %llu bytes, counted in the budget (%llu of %llu reserved)\n",
           (unsigned long long)in.counters.spec_window_bytes, (unsigned long long)in.mem_reserved,
           (unsigned long long)in.mem_budget);

    /* A checkpoint of step s-1 while step s is speculated holds step s-1. */
    state_t at_ckpt;
    state_alloc(&at_ckpt);
    state_copy(&at_ckpt, &ref);
    {
        zs_shard_info_t b = info(sh);
        void *g = grads(s, BF, 0);
        zs_commit_t ex = {s, 1.0f / 2048, 1.0f, 1e-3f, 0, BF};
        push_stream(sh, s, g_rb, g_re, g, BF, &ex);
        wait_spec(sh, b.counters.spec_elements, g_n, "checkpoint during speculation");
        double sec;
        TEST_OK(zs_shard_checkpoint(sh, s - 1, 0, &sec, &err), err);
        /* Cancelled: the commit takes the plain path and still matches. */
        uint64_t applied, ostep;
        TEST_OK(zs_shard_commit(sh, &ex, &applied, &ostep, &err), err);
        ref_step(&ref, &ex, g, BF);
        expect_state(sh, &ref, "commit after a checkpoint cancelled speculation");
        free(g);
        s++;
    }
    /* Mid-speculation "crash": the shard goes away before its commit. */
    {
        zs_shard_info_t b = info(sh);
        void *g = grads(s, F32, 0);
        zs_commit_t ex = {s, 1.0f / 2048, 1.0f, 1e-3f, 0, NO};
        push_stream(sh, s, g_rb, g_re, g, F32, &ex);
        wait_spec(sh, b.counters.spec_elements, g_n, "destroy during speculation");
        free(g);
    }
    zs_shard_destroy(sh);
    sh = open_shard(dir, ZS_SPEC_WINDOW_DEFAULT, 0);
    expect_state(sh, &at_ckpt, "reopened after a destroy mid-speculation: the checkpoint");
    expect_pull(sh, at_ckpt.applied, ZS_DTYPE_F32, &at_ckpt, "reopened");
    printf("ok  checkpoint during speculation holds step %llu; reopened mid-speculation: "
           "step %llu, bitwise\n",
           (unsigned long long)at_ckpt.applied, (unsigned long long)at_ckpt.applied);
    /* And training goes on from there, speculating. */
    state_copy(&ref, &at_ckpt);
    spec_step(sh, &ref, ref.applied + 1, BF, BF, KEEP, g_n);
    spec_step(sh, &ref, ref.applied + 1, BF, BF, CLIP, g_n);
    zs_shard_destroy(sh);
    state_free(&at_ckpt);
    state_free(&ref);
}

/* A window of one pre-image, and a budget with room for none. */
static void small_windows(const char *dir1, const char *dir2)
{
    zs_err_t err;
    state_t ref;
    state_alloc(&ref);
    zs_shard_t *sh = open_shard(dir1, SLOT + SLOT / 2, 0);
    TEST_OK(init_model(sh), err);
    ref_init(&ref);
    uint64_t s = 1;
    spec_step(sh, &ref, s++, ZS_DTYPE_F32, ZS_DTYPE_NONE, KEEP, ONE_CHUNK);
    spec_step(sh, &ref, s++, ZS_DTYPE_BF16, ZS_DTYPE_BF16, KEEP, ONE_CHUNK);
    spec_step(sh, &ref, s++, ZS_DTYPE_BF16, ZS_DTYPE_BF16, CLIP, ONE_CHUNK);
    spec_step(sh, &ref, s++, ZS_DTYPE_F16, ZS_DTYPE_F16, SKIP, ONE_CHUNK);
    TEST_CHECK(info(sh).counters.spec_window_bytes == SLOT);
    zs_shard_destroy(sh);
    printf("ok  window of one pre-image (1 of 3 chunks speculated): bitwise\n");

    /* Budget: the state fits, a pre-image does not. */
    uint64_t budget = zs_shard_state_bytes(g_n) + SLOT / 2;
    sh = open_shard(dir2, ZS_SPEC_WINDOW_DEFAULT, budget);
    TEST_OK(init_model(sh), err);
    ref_init(&ref);
    spec_step(sh, &ref, 1, ZS_DTYPE_F32, ZS_DTYPE_NONE, KEEP, 0);
    spec_step(sh, &ref, 2, ZS_DTYPE_BF16, ZS_DTYPE_BF16, CLIP, 0);
    zs_shard_info_t in = info(sh);
    TEST_CHECK(in.counters.spec_window_bytes == 0 && in.mem_reserved <= budget);
    zs_shard_destroy(sh);
    printf("ok  budget without room for a pre-image: nothing speculated, bitwise\n");
    state_free(&ref);
}

/* Commits right behind their pushes on a 4M-element range (61 chunks): the
 * commit stops the speculation batch wherever it is, a chunk part-way
 * included (its done blocks are undone), and everything still matches. */
static void commit_races(const char *dir)
{
    g_P = 8000000;
    g_rb = zs_layout_begin(g_P, S, INDEX);
    g_re = zs_layout_begin(g_P, S, INDEX + 1);
    g_n = g_re - g_rb;
    zs_err_t err;
    state_t ref;
    state_alloc(&ref);
    zs_shard_t *sh = open_shard(dir, ZS_SPEC_WINDOW_DEFAULT, 0);
    TEST_OK(init_model(sh), err);
    ref_init(&ref);
    uint64_t spec0 = info(sh).counters.spec_elements;
    for (uint64_t step = 1; step <= 8; step++) {
        void *g = grads(step, ZS_DTYPE_BF16, 0);
        zs_commit_t ex = {step, 1.0f / 2048, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
        push_stream(sh, step, g_rb, g_re, g, ZS_DTYPE_BF16, &ex);
        struct timespec ts = {0, (long)(step % 4) * 1000000L}; /* let it start, a little */
        nanosleep(&ts, NULL);
        zs_commit_t c = ex;
        if (step % 2 == 0)
            c.clip_coef = 0.5f;
        uint64_t applied, ostep;
        TEST_OK(zs_shard_commit(sh, &c, &applied, &ostep, &err), err);
        ref_step(&ref, &c, g, ZS_DTYPE_BF16);
        expect_pull(sh, step, ZS_DTYPE_BF16, &ref, "commit right behind its push");
        expect_state(sh, &ref, "commit right behind its push");
        free(g);
    }
    zs_shard_info_t in = info(sh);
    printf("ok  8 commits right behind their pushes (4M elements): %llu elements speculated in "
           "time, %llu kept, %llu rolled back, bitwise the plain steps\n",
           (unsigned long long)(in.counters.spec_elements - spec0),
           (unsigned long long)in.counters.spec_hits,
           (unsigned long long)in.counters.spec_rollbacks);
    zs_shard_destroy(sh);
    state_free(&ref);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    zs_log_set_level(ZS_LOG_WARN);
    g_rb = zs_layout_begin(P, S, INDEX);
    g_re = zs_layout_begin(P, S, INDEX + 1);
    g_n = g_re - g_rb;
    g_hp = zs_synth_hparams();
    TEST_CHECK(g_n > 2 * ZS_OPT_CHUNK && g_n < 3 * ZS_OPT_CHUNK);
    atexit(remove_dirs);
    all_cases(make_dir(0));
    small_windows(make_dir(1), make_dir(2));
    commit_races(make_dir(3));
    printf("PASS test_shard_spec\n");
    return 0;
}
