/*
 * test_shard.c - unit tests of the shard state machine (server/zs_shard.h),
 * driven directly (no gRPC) on a temp data dir.
 *
 * The shard is server 1 of 2 for P = 300007 (its range does not start at 0
 * and spans 3 optimizer chunks, the last one short). A local copy of the
 * state, updated with zs_adam_update, is the reference every accepted step is
 * compared with bitwise; every refusal is checked for its status, a key part
 * of its sentence, and a bitwise-unchanged state (all three tensors, steps).
 *
 * Covers: requests before Initialize; invalid identities and hyperparameters;
 * init chunks out of order, beyond the range, and a stream that ends early
 * (nothing installed, or the old model kept); ALREADY_EXISTS without
 * overwrite and replacement with it; push for past/future steps, outside the
 * range, count 0, unknown dtype, dtype mixed within a step; commit with
 * incomplete staging, wrong step, bad scalars, bad param_dtype; idempotent
 * commit (same scalars: nothing applied twice; different: refused); skip
 * commit; pull waiting for a step committed by another thread, and timing
 * out; bf16/fp16 pulls equal zs_cast of the fp32 pull; set/get state; checkpoint
 * of a wrong step, checkpoint + restore roundtrips, restore of a missing step,
 * of a corrupted checkpoint (DATA_LOSS, live state unchanged) and of another
 * model's checkpoint; delete refusals; reopening the data dir loads the newest
 * checkpoint, and the older one when the newest is corrupt; replay after that
 * is bitwise equal to the first run. Then, on a 4M-element shard with one
 * optimizer thread: pulls of step S-1 racing the pass of step S that switches
 * param_dtype between bf16 and fp16 return the right format's bits. Last, the
 * memory budget: a second state and the growth of the staged-range records
 * past the budget are refused (RESOURCE_EXHAUSTED), and a commit returns the
 * records' share; at ZS_SHARD_STEP_MAX no later step (nor step 0) is taken.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cast.h"
#include "zs_layout.h"
#include "zs_log.h"
#include "zs_shard_internal.h" /* sh->store: to corrupt a live checkpoint */
#include "zs_synth.h"
#include "zs_test.h"

#define P     300007ull
#define S     2u
#define INDEX 1u
#define MODEL "unit-model"

static uint64_t g_rb, g_re, g_n;
static zs_adam_hparams_t g_hp;

/* ---- the reference state ------------------------------------------------- */

typedef struct {
    float *t[3]; /* master, exp_avg, exp_avg_sq over [g_rb, g_re) */
    uint64_t applied, ostep;
} state_t;

static void state_alloc(state_t *s)
{
    for (int t = 0; t < 3; t++) {
        s->t[t] = calloc(g_n, 4);
        TEST_CHECK(s->t[t]);
    }
    s->applied = s->ostep = 0;
}

static void state_free(state_t *s)
{
    for (int t = 0; t < 3; t++)
        free(s->t[t]);
}

static void state_copy(state_t *dst, const state_t *src)
{
    for (int t = 0; t < 3; t++)
        memcpy(dst->t[t], src->t[t], g_n * 4);
    dst->applied = src->applied;
    dst->ostep = src->ostep;
}

/* The shard's state now, into s (the shard must hold a model). */
static void snapshot(zs_shard_t *sh, state_t *s)
{
    zs_err_t err;
    zs_err_clear(&err);
    for (int t = 0; t < 3; t++) {
        uint64_t step;
        TEST_OK(zs_shard_get_state(sh, (zs_tensor_t)t, g_rb, g_n, s->t[t], &step, &err), err);
    }
    zs_shard_info_t in;
    TEST_OK(zs_shard_info(sh, &in, &err), err);
    free(in.checkpoints);
    TEST_CHECK(in.initialized);
    s->applied = in.applied_step;
    s->ostep = in.optimizer_step;
}

/* The shard's state must equal `want` bitwise. */
static void expect_state(zs_shard_t *sh, const state_t *want, const char *what)
{
    state_t got;
    state_alloc(&got);
    snapshot(sh, &got);
    static const char *names[3] = {"master", "exp_avg", "exp_avg_sq"};
    for (int t = 0; t < 3; t++)
        for (uint64_t i = 0; i < g_n; i++)
            TEST_CHECKF(memcmp(&got.t[t][i], &want->t[t][i], 4) == 0,
                        "%s: %s[%llu] is %.9g, want %.9g", what, names[t],
                        (unsigned long long)(g_rb + i), got.t[t][i], want->t[t][i]);
    TEST_CHECKF(got.applied == want->applied && got.ostep == want->ostep,
                "%s: steps (%llu, %llu), want (%llu, %llu)", what, (unsigned long long)got.applied,
                (unsigned long long)got.ostep, (unsigned long long)want->applied,
                (unsigned long long)want->ostep);
    state_free(&got);
}

/* ---- helpers ------------------------------------------------------------- */

static void expect_refusal(int rc, const zs_err_t *err, int want, const char *needle,
                           const char *what)
{
    TEST_CHECKF(rc == want, "%s: got %s (%s), want %s", what, zs_status_name(rc), err->msg,
                zs_status_name(want));
    TEST_CHECKF(err->code == want && strstr(err->msg, needle), "%s: message '%s' lacks '%s'", what,
                err->msg, needle);
    printf("ok  %s: %s: %s\n", what, zs_status_name(rc), err->msg);
}

static zs_shard_identity_t identity(const char *name, uint64_t p, uint32_t s, uint32_t i)
{
    zs_shard_identity_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.model_name, sizeof id.model_name, "%s", name);
    id.num_params = p;
    id.num_servers = s;
    id.server_index = i;
    return id;
}

static zs_shard_info_t info(zs_shard_t *sh)
{
    zs_err_t err;
    zs_shard_info_t in;
    TEST_OK(zs_shard_info(sh, &in, &err), err);
    return in;
}

/* Stream a whole init of `id` whose master weights are w(global index). */
static int init_model(zs_shard_t *sh, const zs_shard_identity_t *id, uint64_t start_step,
                      int overwrite, zs_err_t *err)
{
    zs_shard_init_t *in;
    int rc = zs_shard_init_begin(sh, id, &g_hp, start_step, overwrite, &in, err);
    if (rc)
        return rc;
    uint64_t rb = zs_layout_begin(id->num_params, id->num_servers, id->server_index);
    uint64_t re = zs_layout_begin(id->num_params, id->num_servers, id->server_index + 1);
    for (uint64_t off = rb; off < re; off += 70000) {
        uint64_t k = re - off < 70000 ? re - off : 70000;
        float *dst;
        rc = zs_shard_init_reserve(in, off, k, &dst, err);
        if (rc) {
            zs_shard_init_abort(in);
            return rc;
        }
        for (uint64_t i = 0; i < k; i++)
            dst[i] = zs_synth_weight(off + i);
    }
    return zs_shard_init_end(in, err);
}

/* Gradients of `step` over the whole range in dtype dt (malloc'd). */
static void *grads(uint64_t step, zs_dtype_t dt)
{
    float *tmp = malloc(g_n * 4);
    void *g = malloc(g_n * 4);
    TEST_CHECK(tmp && g);
    for (uint64_t i = 0; i < g_n; i++)
        tmp[i] = 0.5f * zs_rand_unit(step, g_rb + i) + 0.01f * (float)(step % 7);
    zs_cast(g, dt, tmp, ZS_DTYPE_F32, (size_t)g_n);
    free(tmp);
    return g;
}

/* Push [a, b) of g (whole-range gradients of dtype dt) in 50000-element
 * chunks; returns the staged total the shard reports. */
static uint64_t push_range(zs_shard_t *sh, uint64_t step, uint64_t a, uint64_t b, const void *g,
                           zs_dtype_t dt)
{
    zs_err_t err;
    size_t esz = zs_dtype_size(dt);
    uint64_t staged = 0;
    for (uint64_t off = a; off < b; off += 50000) {
        uint64_t k = b - off < 50000 ? b - off : 50000;
        void *dst;
        TEST_OK(zs_shard_push_reserve(sh, step, off, k, dt, &dst, &err), err);
        memcpy(dst, (const char *)g + (off - g_rb) * esz, k * esz);
        staged = zs_shard_push_done(sh, step, off, k, 1);
    }
    return staged;
}

static zs_commit_t scalars(uint64_t step, int skip, zs_dtype_t pdt)
{
    zs_commit_t c = {step, 0.5f, step % 2 ? 1.0f : 0.75f, 1e-3f * (float)(1 + step % 3), skip, pdt};
    return c;
}

/* Apply step `c` with gradients g (dtype dt) to the reference. */
static void ref_step(state_t *r, const zs_commit_t *c, const void *g, zs_dtype_t dt)
{
    r->applied = c->step;
    if (c->skip)
        return;
    r->ostep++;
    zs_adam_step_t st = {c->lr, (int64_t)r->ostep, c->grad_scale, c->clip_coef};
    zs_adam_update(&g_hp, &st, r->t[0], r->t[1], r->t[2], g, dt, NULL, ZS_DTYPE_NONE, (size_t)g_n);
}

/* Push the whole range, commit, and apply to the reference. */
static void full_step(zs_shard_t *sh, state_t *r, uint64_t step, zs_dtype_t dt, zs_dtype_t pdt)
{
    zs_err_t err;
    void *g = grads(step, dt);
    TEST_CHECK(push_range(sh, step, g_rb, g_re, g, dt) == g_n);
    zs_commit_t c = scalars(step, 0, pdt);
    uint64_t applied, ostep;
    TEST_OK(zs_shard_commit(sh, &c, &applied, &ostep, &err), err);
    ref_step(r, &c, g, dt);
    TEST_CHECK(applied == r->applied && ostep == r->ostep);
    free(g);
}

static zs_shard_t *open_shard(const char *dir)
{
    zs_shard_opts_t o = {dir, 2, 2, "unit"};
    zs_shard_t *sh;
    zs_err_t err;
    TEST_OK(zs_shard_create(&o, &sh, &err), err);
    return sh;
}

static int64_t now_ms(void)
{
    return zs_now_ms();
}

/* ---- sections ------------------------------------------------------------- */

static void before_init(zs_shard_t *sh)
{
    zs_err_t err;
    zs_shard_info_t in = info(sh);
    TEST_CHECK(!in.initialized && in.ncheckpoints == 0);
    free(in.checkpoints);
    void *dst;
    int rc = zs_shard_push_reserve(sh, 1, g_rb, 10, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "no model", "push before init");
    zs_commit_t c = scalars(1, 0, ZS_DTYPE_NONE);
    uint64_t a, o;
    rc = zs_shard_commit(sh, &c, &a, &o, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "no model", "commit before init");
    float f[4];
    uint64_t step;
    rc = zs_shard_pull(sh, 0, g_rb, 4, ZS_DTYPE_F32, f, now_ms() + 1000, NULL, NULL, &step, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "no model", "pull before init");
    rc = zs_shard_get_state(sh, ZS_TENSOR_MASTER, g_rb, 4, f, &step, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "no model", "get_state before init");
    double sec;
    rc = zs_shard_checkpoint(sh, 0, 0, &sec, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "no model", "checkpoint before init");
    rc = zs_shard_restore(sh, 1, &err);
    expect_refusal(rc, &err, ZS_ERR_NOTFOUND, "step 1", "restore before init");

    /* Invalid identities and hyperparameters. */
    zs_shard_init_t *ini;
    struct {
        zs_shard_identity_t id;
        const char *needle, *what;
    } bad[] = {
        {identity("", P, S, INDEX), "model name", "init with an empty model name"},
        {identity(MODEL, 0, S, INDEX), "num_params 0", "init with P = 0"},
        {identity(MODEL, ZS_MAX_PARAMS + 1, S, INDEX), "num_params", "init with P too large"},
        {identity(MODEL, P, 0, 0), "num_servers 0", "init with S = 0"},
        {identity(MODEL, P, S, S), "server_index 2 must be below", "init with index >= S"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = zs_shard_init_begin(sh, &bad[i].id, &g_hp, 0, 0, &ini, &err);
        expect_refusal(rc, &err, ZS_ERR_INVALID, bad[i].needle, bad[i].what);
        TEST_CHECK(ini == NULL);
    }
    zs_shard_identity_t id = identity(MODEL, P, S, INDEX);
    zs_adam_hparams_t hp = g_hp;
    hp.beta1 = 1.0f;
    rc = zs_shard_init_begin(sh, &id, &hp, 0, 0, &ini, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "betas", "init with beta1 = 1");
    hp = g_hp;
    hp.eps = 0;
    rc = zs_shard_init_begin(sh, &id, &hp, 0, 0, &ini, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "eps", "init with eps = 0");

    /* Out of order, beyond the range, ended early: nothing is installed. */
    TEST_OK(zs_shard_init_begin(sh, &id, &g_hp, 0, 0, &ini, &err), err);
    float *dst32;
    TEST_OK(zs_shard_init_reserve(ini, g_rb, 1000, &dst32, &err), err);
    rc = zs_shard_init_reserve(ini, g_rb + 1001, 10, &dst32, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "contiguous", "init chunk after a gap");
    rc = zs_shard_init_reserve(ini, g_rb, 10, &dst32, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "contiguous", "init chunk sent twice");
    rc = zs_shard_init_reserve(ini, g_rb + 1000, g_n, &dst32, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside this server's range",
                   "init chunk beyond the range");
    rc = zs_shard_init_reserve(ini, g_rb + 1000, 0, &dst32, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside", "init chunk of count 0");
    rc = zs_shard_init_end(ini, &err); /* frees ini */
    expect_refusal(rc, &err, ZS_ERR_STATE, "nothing was changed", "init stream ended early");
    in = info(sh);
    TEST_CHECK(!in.initialized);
    free(in.checkpoints);
    rc = zs_shard_get_state(sh, ZS_TENSOR_MASTER, g_rb, 4, f, &step, &err);
    TEST_CHECK(rc == ZS_ERR_STATE);
}

static void init_and_replace(zs_shard_t *sh, state_t *ref)
{
    zs_err_t err;
    zs_shard_identity_t id = identity(MODEL, P, S, INDEX);
    TEST_OK(init_model(sh, &id, 0, 0, &err), err);
    for (uint64_t i = 0; i < g_n; i++)
        ref->t[0][i] = zs_synth_weight(g_rb + i);
    expect_state(sh, ref, "after init");
    zs_shard_info_t in = info(sh);
    TEST_CHECK(in.initialized && in.range_begin == g_rb && in.range_end == g_re &&
               strcmp(in.id.model_name, MODEL) == 0 && in.id.num_params == P);
    free(in.checkpoints);

    /* A different model without overwrite; each identity field on its own. */
    zs_shard_identity_t other[] = {identity("other", P, S, INDEX), identity(MODEL, P + 1, S, INDEX),
                                   identity(MODEL, P, 3, INDEX), identity(MODEL, P, S, 0)};
    for (int k = 0; k < 4; k++) {
        zs_shard_init_t *ini;
        int rc = zs_shard_init_begin(sh, &other[k], &g_hp, 0, 0, &ini, &err);
        expect_refusal(rc, &err, ZS_ERR_EXISTS, "already holds model 'unit-model'",
                       "init of a different model without overwrite");
        TEST_CHECK(ini == NULL);
    }
    expect_state(sh, ref, "after ALREADY_EXISTS");

    /* Re-init of the same model that ends early: the old state stays. */
    zs_shard_init_t *ini;
    TEST_OK(zs_shard_init_begin(sh, &id, &g_hp, 5, 0, &ini, &err), err);
    float *dst;
    TEST_OK(zs_shard_init_reserve(ini, g_rb, 100, &dst, &err), err);
    memset(dst, 0x7F, 400);
    int rc = zs_shard_init_end(ini, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "nothing was changed",
                   "re-init ended early keeps the old model");
    expect_state(sh, ref, "after an incomplete re-init");
    /* An aborted re-init (the stream broke) changes nothing either. */
    TEST_OK(zs_shard_init_begin(sh, &id, &g_hp, 5, 1, &ini, &err), err);
    TEST_OK(zs_shard_init_reserve(ini, g_rb, g_n, &dst, &err), err);
    memset(dst, 0x7F, g_n * 4);
    zs_shard_init_abort(ini);
    expect_state(sh, ref, "after an aborted re-init");

    /* Overwrite replaces it: server 0 of 1 for a small model at step 9. */
    zs_shard_identity_t small = identity("other", 1000, 1, 0);
    TEST_OK(init_model(sh, &small, 9, 1, &err), err);
    in = info(sh);
    TEST_CHECK(in.initialized && strcmp(in.id.model_name, "other") == 0 &&
               in.id.num_params == 1000 && in.range_begin == 0 && in.range_end == 1000 &&
               in.applied_step == 9 && in.optimizer_step == 0);
    free(in.checkpoints);
    printf("ok  init with overwrite replaced model '%s' by 'other'\n", MODEL);
    /* And back (overwrite again). */
    TEST_OK(init_model(sh, &id, 0, 1, &err), err);
    expect_state(sh, ref, "after re-init with overwrite");
}

static void push_and_commit(zs_shard_t *sh, state_t *ref)
{
    zs_err_t err;
    void *dst;
    int rc;
    /* Steps: applied is 0, so only step 1 is accepted. */
    rc = zs_shard_push_reserve(sh, 0, g_rb, 10, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "step 0 is already committed", "push for a past step");
    rc = zs_shard_push_reserve(sh, 2, g_rb, 10, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "expects the next step only", "push for a future step");
    rc = zs_shard_push_reserve(sh, 1, g_rb - 1, 10, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside this server's range",
                   "push starting below the range");
    rc = zs_shard_push_reserve(sh, 1, g_re - 5, 10, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside this server's range",
                   "push ending above the range");
    rc = zs_shard_push_reserve(sh, 1, g_re, 1, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside", "push at the range end");
    rc = zs_shard_push_reserve(sh, 1, g_rb + 1, UINT64_MAX, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside", "push with a wrapping count");
    rc = zs_shard_push_reserve(sh, 1, g_rb, 0, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "count 0", "push of count 0");
    rc = zs_shard_push_reserve(sh, 1, g_rb, 10, ZS_DTYPE_NONE, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "unknown gradient dtype 3", "push in dtype NONE");
    rc = zs_shard_push_reserve(sh, 1, g_rb, 10, (zs_dtype_t)9, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "unknown gradient dtype 9", "push in dtype 9");

    /* Step 1 in bf16: the first half, then an fp32 chunk is refused. */
    void *g = grads(1, ZS_DTYPE_BF16);
    uint64_t half = g_rb + g_n / 2;
    TEST_CHECK(push_range(sh, 1, g_rb, half, g, ZS_DTYPE_BF16) == half - g_rb);
    rc = zs_shard_push_reserve(sh, 1, half, 10, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "staged in bf16; a chunk in fp32 cannot be mixed",
                   "dtype mixed within a step");
    rc = zs_shard_push_reserve(sh, 1, half, 10, ZS_DTYPE_F16, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "cannot be mixed", "fp16 mixed into a bf16 step");

    /* Commit refusals with half the range staged. */
    uint64_t applied, ostep;
    zs_commit_t c = scalars(1, 0, ZS_DTYPE_BF16);
    rc = zs_shard_commit(sh, &c, &applied, &ostep, &err);
    char needle[96];
    snprintf(needle, sizeof needle, "%llu of %llu elements staged",
             (unsigned long long)(half - g_rb), (unsigned long long)g_n);
    expect_refusal(rc, &err, ZS_ERR_STATE, needle, "commit with incomplete staging");
    TEST_CHECK(applied == 0 && ostep == 0);
    c.step = 2;
    rc = zs_shard_commit(sh, &c, &applied, &ostep, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "expects step 1", "commit of a future step");
    c.step = 0;
    rc = zs_shard_commit(sh, &c, &applied, &ostep, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "expects step 1", "commit of step 0");
    struct {
        float gs, cc, lr;
        const char *what;
    } sc[] = {{NAN, 1, 1e-3f, "commit with NaN grad_scale"},
              {1, INFINITY, 1e-3f, "commit with infinite clip_coef"},
              {1, 1, -1e-3f, "commit with negative lr"},
              {-0.5f, 1, 1e-3f, "commit with negative grad_scale"}};
    for (int k = 0; k < 4; k++) {
        zs_commit_t b = scalars(1, 0, ZS_DTYPE_BF16);
        b.grad_scale = sc[k].gs;
        b.clip_coef = sc[k].cc;
        b.lr = sc[k].lr;
        rc = zs_shard_commit(sh, &b, &applied, &ostep, &err);
        expect_refusal(rc, &err, ZS_ERR_INVALID, "finite and >= 0", sc[k].what);
    }
    c = scalars(1, 0, ZS_DTYPE_F32); /* proto3's default: means no copy, like NONE */
    rc = zs_shard_commit(sh, &c, &applied, &ostep, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "elements staged",
                   "commit with param_dtype fp32 (no copy): only the staging is missing");
    c.param_dtype = (zs_dtype_t)7;
    rc = zs_shard_commit(sh, &c, &applied, &ostep, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "unknown param_dtype 7", "commit with param_dtype 7");
    expect_state(sh, ref, "after refused pushes and commits");

    /* Complete the step (re-pushing a staged range overwrites it) and commit. */
    TEST_CHECK(push_range(sh, 1, g_rb, g_rb + 1000, g, ZS_DTYPE_BF16) == half - g_rb);
    TEST_CHECK(push_range(sh, 1, half, g_re, g, ZS_DTYPE_BF16) == g_n);
    c = scalars(1, 0, ZS_DTYPE_BF16);
    TEST_OK(zs_shard_commit(sh, &c, &applied, &ostep, &err), err);
    ref_step(ref, &c, g, ZS_DTYPE_BF16);
    free(g);
    TEST_CHECK(applied == 1 && ostep == 1);
    expect_state(sh, ref, "after step 1");
    printf("ok  step 1 (bf16 gradients) bitwise equal to the reference\n");

    /* Idempotent: same scalars OK and nothing applied twice. */
    TEST_OK(zs_shard_commit(sh, &c, &applied, &ostep, &err), err);
    TEST_CHECK(applied == 1 && ostep == 1);
    expect_state(sh, ref, "after a repeated commit");
    printf("ok  repeated commit with the same scalars: OK, applied once\n");
    zs_commit_t d = c;
    d.lr *= 2;
    rc = zs_shard_commit(sh, &d, &applied, &ostep, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "already committed with different scalars",
                   "repeated commit with a different lr");
    d = c;
    d.skip = 1;
    rc = zs_shard_commit(sh, &d, &applied, &ostep, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "different scalars", "repeated commit with skip");
    d = c;
    d.param_dtype = ZS_DTYPE_F16;
    rc = zs_shard_commit(sh, &d, &applied, &ostep, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "different scalars",
                   "repeated commit with another param_dtype");
    rc = zs_shard_push_reserve(sh, 1, g_rb, 10, ZS_DTYPE_BF16, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "step 1 is already committed",
                   "push for the step just committed");
    expect_state(sh, ref, "after refused re-commits");
}

/* bf16 and fp16 pulls of [a, a+k) equal zs_cast of the fp32 pull. */
static void expect_lowp_pulls(zs_shard_t *sh, uint64_t a, uint64_t k, uint64_t want_step)
{
    zs_err_t err;
    float *f = malloc(k * 4);
    uint16_t *h = malloc(k * 2), *c = malloc(k * 2);
    TEST_CHECK(f && h && c);
    uint64_t step;
    TEST_OK(zs_shard_pull(sh, want_step, a, k, ZS_DTYPE_F32, f, now_ms() + 5000, NULL, NULL, &step,
                          &err),
            err);
    TEST_CHECK(step == want_step);
    zs_dtype_t lowp[2] = {ZS_DTYPE_BF16, ZS_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        TEST_OK(zs_shard_pull(sh, want_step, a, k, lowp[i], h, now_ms() + 5000, NULL, NULL, &step,
                              &err),
                err);
        zs_cast(c, lowp[i], f, ZS_DTYPE_F32, (size_t)k);
        TEST_CHECKF(memcmp(h, c, k * 2) == 0, "%s pull of [%llu, +%llu) != zs_cast(fp32 pull)",
                    zs_dtype_name(lowp[i]), (unsigned long long)a, (unsigned long long)k);
    }
    free(f);
    free(h);
    free(c);
}

typedef struct {
    zs_shard_t *sh;
    uint64_t step;
    zs_dtype_t dt;
    int delay_ms;
    void *g;
    int rc;
} later_t;

static void *commit_later(void *p)
{
    later_t *l = p;
    struct timespec ts = {0, (long)l->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
    zs_err_t err;
    void *dst;
    for (uint64_t off = g_rb; off < g_re; off += 50000) {
        uint64_t k = g_re - off < 50000 ? g_re - off : 50000;
        size_t esz = zs_dtype_size(l->dt);
        if ((l->rc = zs_shard_push_reserve(l->sh, l->step, off, k, l->dt, &dst, &err)))
            return NULL;
        memcpy(dst, (const char *)l->g + (off - g_rb) * esz, k * esz);
        zs_shard_push_done(l->sh, l->step, off, k, 1);
    }
    zs_commit_t c = scalars(l->step, 0, ZS_DTYPE_F16);
    uint64_t a, o;
    l->rc = zs_shard_commit(l->sh, &c, &a, &o, &err);
    return NULL;
}

/* zs_shard_cancel_fn: the caller "leaves" at the third poll. */
static int leave_after_3(void *ud)
{
    return ++*(int *)ud >= 3;
}

static void skip_pull_state(zs_shard_t *sh, state_t *ref)
{
    zs_err_t err;
    expect_lowp_pulls(sh, g_rb, g_n, 1);
    expect_lowp_pulls(sh, g_re - 77, 77, 1);
    printf("ok  bf16/fp16 pulls equal zs_cast of the fp32 pull (step 1)\n");

    /* Skip: applied moves, t does not, state bitwise unchanged. */
    zs_commit_t c = scalars(2, 1, ZS_DTYPE_BF16);
    uint64_t applied, ostep;
    TEST_OK(zs_shard_commit(sh, &c, &applied, &ostep, &err), err);
    TEST_CHECK(applied == 2 && ostep == 1);
    ref->applied = 2;
    expect_state(sh, ref, "after a skipped step");
    expect_lowp_pulls(sh, g_rb + 12345, 99999, 2);
    printf("ok  skip commit: applied 2, optimizer step 1, state bitwise unchanged\n");

    /* A pull of step 3 waits for another thread to push and commit it. */
    later_t l = {sh, 3, ZS_DTYPE_F16, 300, grads(3, ZS_DTYPE_F16), -1};
    pthread_t th;
    int64_t t0 = now_ms();
    TEST_CHECK(pthread_create(&th, NULL, commit_later, &l) == 0);
    float *f = malloc(g_n * 4);
    TEST_CHECK(f);
    uint64_t step;
    TEST_OK(
        zs_shard_pull(sh, 3, g_rb, g_n, ZS_DTYPE_F32, f, now_ms() + 20000, NULL, NULL, &step, &err),
        err);
    int64_t waited = now_ms() - t0;
    pthread_join(th, NULL);
    TEST_CHECKF(l.rc == ZS_OK, "commit thread failed: %d", l.rc);
    TEST_CHECKF(step == 3 && waited >= 250, "pull returned step %llu after %lld ms",
                (unsigned long long)step, (long long)waited);
    zs_commit_t c3 = scalars(3, 0, ZS_DTYPE_F16);
    ref_step(ref, &c3, l.g, ZS_DTYPE_F16);
    free(l.g);
    TEST_CHECK(memcmp(f, ref->t[0], g_n * 4) == 0);
    expect_state(sh, ref, "after step 3");
    expect_lowp_pulls(sh, g_rb, g_n, 3);
    printf("ok  pull waited %lld ms for step 3 (committed by another thread); bitwise equal\n",
           (long long)waited);

    /* A step never committed: ZS_ERR_TIMEOUT at the deadline. */
    t0 = now_ms();
    int rc =
        zs_shard_pull(sh, 4, g_rb, 10, ZS_DTYPE_F32, f, now_ms() + 300, NULL, NULL, &step, &err);
    waited = now_ms() - t0;
    expect_refusal(rc, &err, ZS_ERR_TIMEOUT, "step 4 not reached before the deadline",
                   "pull of a step never committed");
    TEST_CHECKF(waited >= 280 && waited < 5000, "timed out after %lld ms", (long long)waited);

    /* The same with a far deadline and a caller that leaves after ~300 ms:
     * ZS_ERR_CANCELLED soon after, polled while waiting. */
    int polls = 0;
    t0 = now_ms();
    rc = zs_shard_pull(sh, 4, g_rb, 10, ZS_DTYPE_F32, f, now_ms() + 3600 * 1000, leave_after_3,
                       &polls, &step, &err);
    waited = now_ms() - t0;
    expect_refusal(rc, &err, ZS_ERR_CANCELLED, "abandoned", "pull whose caller left");
    TEST_CHECKF(polls == 3 && waited >= 200 && waited < 2000, "cancelled after %lld ms, %d polls",
                (long long)waited, polls);

    /* Read refusals. */
    rc = zs_shard_pull(sh, 0, g_rb, 10, ZS_DTYPE_NONE, f, now_ms() + 1000, NULL, NULL, &step, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "unknown pull dtype 3", "pull in dtype NONE");
    rc = zs_shard_pull(sh, 0, g_rb - 10, 20, ZS_DTYPE_F32, f, now_ms() + 1000, NULL, NULL, &step,
                       &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside", "pull below the range");
    rc = zs_shard_pull(sh, 0, g_rb, 0, ZS_DTYPE_F32, f, now_ms() + 1000, NULL, NULL, &step, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "count 0", "pull of count 0");
    rc = zs_shard_get_state(sh, (zs_tensor_t)3, g_rb, 10, f, &step, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "unknown tensor 3", "get_state of tensor 3");
    rc = zs_shard_get_state(sh, ZS_TENSOR_EXP_AVG, g_re - 1, 2, f, &step, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside", "get_state past the range");
    rc = zs_shard_set_state(sh, (zs_tensor_t)-1, g_rb, 10, f, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "unknown tensor", "set_state of tensor -1");
    rc = zs_shard_set_state(sh, ZS_TENSOR_EXP_AVG_SQ, 0, 10, f, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside", "set_state of server 0's range");
    rc = zs_shard_check_range(sh, g_re, 1, &err);
    expect_refusal(rc, &err, ZS_ERR_RANGE, "outside", "check_range at the end");
    expect_state(sh, ref, "after refused reads and writes");

    /* set/get roundtrip on each tensor, then back. */
    uint64_t a = g_rb + 65000, k = 2000; /* crosses an optimizer chunk boundary */
    for (int t = 0; t < 3; t++) {
        for (uint64_t i = 0; i < k; i++)
            f[i] = (float)(t + 1) * 0.125f + (float)i;
        TEST_OK(zs_shard_set_state(sh, (zs_tensor_t)t, a, k, f, &err), err);
        float *got = malloc(k * 4);
        TEST_CHECK(got);
        TEST_OK(zs_shard_get_state(sh, (zs_tensor_t)t, a, k, got, &step, &err), err);
        TEST_CHECK(memcmp(got, f, k * 4) == 0 && step == 3);
        free(got);
        if (t == 0) /* the low-precision copy follows a master write */
            expect_lowp_pulls(sh, a - 10, k + 20, 3);
        TEST_OK(zs_shard_set_state(sh, (zs_tensor_t)t, a, k, ref->t[t] + (a - g_rb), &err), err);
    }
    expect_state(sh, ref, "after set_state roundtrips");
    expect_lowp_pulls(sh, g_rb, g_n, 3);
    printf("ok  set_state/get_state roundtrip on all tensors\n");
    free(f);
}

static void corrupt(zs_shard_t *sh, uint64_t step, int tensor)
{
    zs_err_t err;
    pthread_mutex_lock(&sh->store_mu);
    int rc = zs__store_corrupt_chunk(sh->store, step, tensor, 0, &err);
    pthread_mutex_unlock(&sh->store_mu);
    TEST_OK(rc, err);
}

/* Commit is idempotent across restarts and restores: step 4 again with its
 * scalars is OK and changes nothing; with another lr it is refused. */
static void expect_recommit(zs_shard_t *sh, const state_t *s4, const char *when)
{
    zs_err_t err;
    uint64_t a, o;
    zs_commit_t c = scalars(4, 0, ZS_DTYPE_NONE);
    TEST_OK(zs_shard_commit(sh, &c, &a, &o, &err), err);
    TEST_CHECK(a == 4 && o == s4->ostep);
    expect_state(sh, s4, when);
    c.lr *= 2;
    int rc = zs_shard_commit(sh, &c, &a, &o, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "already committed with different scalars", when);
    printf("ok  commit of step 4 repeated %s: OK, nothing applied\n", when);
}

static void checkpoints(zs_shard_t **shp, const char *dir, state_t *ref)
{
    zs_shard_t *sh = *shp;
    zs_err_t err;
    double sec;
    int rc = zs_shard_checkpoint(sh, 2, 0, &sec, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "server is at step 3", "checkpoint of a past step");
    rc = zs_shard_checkpoint(sh, 4, 0, &sec, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "server is at step 3", "checkpoint of a future step");
    TEST_OK(zs_shard_checkpoint(sh, 3, 0, &sec, &err), err);
    TEST_OK(zs_shard_checkpoint(sh, 3, 0, &sec, &err), err); /* idempotent */
    state_t s3;
    state_alloc(&s3);
    state_copy(&s3, ref);
    full_step(sh, ref, 4, ZS_DTYPE_F32, ZS_DTYPE_NONE);
    TEST_OK(zs_shard_checkpoint(sh, 4, 0, &sec, &err), err);
    state_t s4;
    state_alloc(&s4);
    state_copy(&s4, ref);
    zs_shard_info_t in = info(sh);
    TEST_CHECK(in.ncheckpoints == 2 && in.checkpoints[0] == 3 && in.checkpoints[1] == 4);
    free(in.checkpoints);

    TEST_OK(zs_shard_restore(sh, 3, &err), err);
    expect_state(sh, &s3, "after restore 3");
    TEST_OK(zs_shard_restore(sh, 4, &err), err);
    expect_state(sh, &s4, "after restore 4");
    printf("ok  checkpoint + restore roundtrips (steps 3 and 4) bitwise\n");
    expect_recommit(sh, &s4, "after restore 4");

    rc = zs_shard_restore(sh, 99, &err);
    expect_refusal(rc, &err, ZS_ERR_NOTFOUND, "99", "restore of a missing step");
    expect_state(sh, &s4, "after restore of a missing step");
    rc = zs_shard_delete(sh, 0, 0, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "keep must be >= 1", "delete with keep 0");
    rc = zs_shard_delete(sh, 98, 0, &err);
    expect_refusal(rc, &err, ZS_ERR_NOTFOUND, "step 98", "delete of a missing step");
    in = info(sh);
    TEST_CHECK(in.ncheckpoints == 2);
    free(in.checkpoints);

    /* Reopen: the newest checkpoint (4) is loaded. Step 5 first, so the
     * live state differs from every checkpoint. */
    full_step(sh, ref, 5, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
    zs_shard_destroy(sh);
    sh = *shp = open_shard(dir);
    expect_state(sh, &s4, "after reopening");
    printf("ok  reopened shard loaded the newest checkpoint (4)\n");
    expect_recommit(sh, &s4, "after reopening");

    /* A corrupted checkpoint is refused and the live state stays. */
    state_t s5;
    state_alloc(&s5);
    state_copy(&s5, &s4);
    full_step(sh, &s5, 5, ZS_DTYPE_BF16, ZS_DTYPE_BF16);
    TEST_CHECK(memcmp(s5.t[0], ref->t[0], g_n * 4) == 0); /* same as before the reopen */
    corrupt(sh, 4, 1);
    rc = zs_shard_restore(sh, 4, &err);
    expect_refusal(rc, &err, ZS_ERR_CORRUPT, "step 4", "restore of a corrupted checkpoint");
    expect_state(sh, &s5, "after restore of a corrupted checkpoint");
    expect_lowp_pulls(sh, g_rb, g_n, 5);

    /* Reopen with the newest corrupt: falls back to 3; replaying step 4
     * gives the same bits as the first time. */
    zs_shard_destroy(sh);
    sh = *shp = open_shard(dir);
    expect_state(sh, &s3, "after reopening with checkpoint 4 corrupt");
    printf("ok  reopened shard fell back to checkpoint 3 (4 is corrupt)\n");
    state_copy(ref, &s3);
    full_step(sh, ref, 4, ZS_DTYPE_F32, ZS_DTYPE_NONE);
    expect_state(sh, &s4, "after replaying step 4");
    printf("ok  replayed step 4 bitwise equal to the first run\n");
    state_free(&s5);

    /* A checkpoint of another model is refused (FAILED_PRECONDITION). */
    zs_shard_identity_t other = identity("other", 1000, 1, 0);
    TEST_OK(init_model(sh, &other, 0, 1, &err), err);
    rc = zs_shard_restore(sh, 3, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "is of model 'unit-model'",
                   "restore of another model's checkpoint");
    in = info(sh);
    TEST_CHECK(strcmp(in.id.model_name, "other") == 0 && in.applied_step == 0);
    free(in.checkpoints);
    state_free(&s3);
    state_free(&s4);
}

/* Pulls of step S-1 while the pass of step S, which switches param_dtype
 * (bf16 <-> fp16), is still running: every pull must return the cast of the
 * master weights of the step it reports, never the other format's bits. One
 * optimizer thread and 65 chunks, pulling the last chunk (updated last), so
 * most pulls land inside the pass. */
static void lowp_switch(const char *dir)
{
    /* The pulled range lies inside the last chunk: a pull spanning chunks
     * may return chunks of different steps (it reports the lowest), which
     * is allowed, and would make the expected bits ambiguous. */
    const uint64_t n = 64 * (uint64_t)ZS_OPT_CHUNK + 1123, k = 1000, a = n - k;
    zs_shard_opts_t o = {dir, 1, 2, "switch"};
    zs_shard_t *sh;
    zs_err_t err;
    TEST_OK(zs_shard_create(&o, &sh, &err), err);
    zs_shard_identity_t id = identity("switch", n, 1, 0);
    TEST_OK(init_model(sh, &id, 0, 0, &err), err);
    float *g = malloc(n * 4), before[1000], after[1000];
    uint16_t got[1000], want[1000];
    TEST_CHECK(g);
    int inside = 0;
    for (uint64_t step = 1; step <= 12; step++) {
        zs_dtype_t pdt = step % 2 ? ZS_DTYPE_BF16 : ZS_DTYPE_F16;
        uint64_t st, applied, ostep;
        TEST_OK(zs_shard_pull(sh, step - 1, a, k, ZS_DTYPE_F32, before, now_ms() + 5000, NULL, NULL,
                              &st, &err),
                err);
        for (uint64_t i = 0; i < n; i++)
            g[i] = 0.5f * zs_rand_unit(step, i);
        for (uint64_t off = 0; off < n; off += 1u << 20) {
            uint64_t c = n - off < (1u << 20) ? n - off : (1u << 20);
            void *dst;
            TEST_OK(zs_shard_push_reserve(sh, step, off, c, ZS_DTYPE_F32, &dst, &err), err);
            memcpy(dst, g + off, c * 4);
            zs_shard_push_done(sh, step, off, c, 1);
        }
        zs_commit_t c = {step, 1.0f, 1.0f, 1e-2f, 0, pdt};
        TEST_OK(zs_shard_commit(sh, &c, &applied, &ostep, &err), err);
        TEST_OK(zs_shard_pull(sh, step - 1, a, k, pdt, got, now_ms() + 5000, NULL, NULL, &st, &err),
                err);
        uint64_t st2;
        TEST_OK(zs_shard_pull(sh, step, a, k, ZS_DTYPE_F32, after, now_ms() + 5000, NULL, NULL,
                              &st2, &err),
                err);
        TEST_CHECK(st == step - 1 || st == step);
        inside += st == step - 1;
        zs_cast(want, pdt, st == step ? after : before, ZS_DTYPE_F32, (size_t)k);
        TEST_CHECKF(memcmp(got, want, sizeof got) == 0,
                    "step %llu: %s pull reporting step %llu is not the cast of that step's "
                    "master weights",
                    (unsigned long long)step, zs_dtype_name(pdt), (unsigned long long)st);
    }
    printf("ok  pulls during passes that switch param_dtype: right bits (%d of 12 inside the "
           "pass)\n",
           inside);
    free(g);
    zs_shard_destroy(sh);
}

/* A shard whose budget holds its state and 4 KiB more: a second state
 * (Initialize beside it) is refused, and so is the growth of the staged-range
 * records past 4 KiB (256 disjoint 1-element pushes); a skip commit of that
 * step returns their budget, and Hello's mem_reserved is the state's share
 * again. */
static void budget(const char *dir)
{
    zs_shard_opts_t o = {dir, 1, 2, "unit-budget", zs_shard_state_bytes(g_n) + 4096};
    zs_shard_t *sh;
    zs_err_t err;
    TEST_OK(zs_shard_create(&o, &sh, &err), err);
    zs_shard_identity_t id = identity(MODEL, P, S, INDEX);
    TEST_OK(init_model(sh, &id, 0, 0, &err), err);
    zs_shard_info_t in = info(sh);
    free(in.checkpoints);
    TEST_CHECK(in.mem_budget == o.mem_budget && in.mem_reserved == zs_shard_state_bytes(g_n));
    zs_shard_init_t *pending;
    int rc = zs_shard_init_begin(sh, &id, &g_hp, 0, 0, &pending, &err);
    expect_refusal(rc, &err, ZS_ERR_NOMEM, "memory budget", "init beside the installed state");
    rc = ZS_OK;
    int k = 0;
    void *dst;
    for (; k < 1000 && !rc; k++) {
        rc = zs_shard_push_reserve(sh, 1, g_rb + 2 * (uint64_t)k, 1, ZS_DTYPE_F32, &dst, &err);
        if (!rc) {
            memset(dst, 0, 4);
            zs_shard_push_done(sh, 1, g_rb + 2 * (uint64_t)k, 1, 1);
        }
    }
    expect_refusal(rc, &err, ZS_ERR_NOMEM, "staged-range records", "many disjoint pushes");
    TEST_CHECKF(k - 1 == 256, "refused at push %d, want 256 (records of 16 B, 4 KiB free)", k - 1);
    in = info(sh);
    free(in.checkpoints);
    TEST_CHECK(in.mem_reserved == zs_shard_state_bytes(g_n) + 4096);
    zs_commit_t c = scalars(1, 1, ZS_DTYPE_NONE);
    uint64_t a, os;
    TEST_OK(zs_shard_commit(sh, &c, &a, &os, &err), err);
    c.param_dtype = ZS_DTYPE_F32; /* the same commit: F32 means no copy */
    TEST_OK(zs_shard_commit(sh, &c, &a, &os, &err), err);
    in = info(sh);
    free(in.checkpoints);
    TEST_CHECK(in.mem_reserved == zs_shard_state_bytes(g_n));
    printf("ok  budget: records returned by the commit; %llu bytes reserved (the state)\n",
           (unsigned long long)in.mem_reserved);

    /* Push streams (step 2): one stages [rb, rb+100) in fp32 and stays open:
     * Commit is refused until it ends. A second re-pushes those elements and
     * is refused at its next chunk: staged count and bytes unchanged. */
    zs_shard_push_t *ps;
    uint64_t staged;
    float *g = calloc(g_n, 4), *got = calloc(g_n, 4);
    TEST_CHECK(g && got);
    for (uint64_t i = 0; i < g_n; i++)
        g[i] = 1.0f + (float)i;
    TEST_OK(zs_shard_push_begin(sh, &ps, &err), err);
    TEST_OK(zs_shard_push_chunk(ps, 2, g_rb, 100, ZS_DTYPE_F32, &dst, &err), err);
    memcpy(dst, g, 400);
    zs_shard_push_chunk_done(ps);
    c = scalars(2, 1, ZS_DTYPE_NONE);
    rc = zs_shard_commit(sh, &c, &a, &os, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "still open", "commit while a push stream is open");
    TEST_OK(zs_shard_push_end(ps, 1, &staged, &err), err);
    TEST_CHECK(staged == 100);
    TEST_OK(zs_shard_push_begin(sh, &ps, &err), err);
    TEST_OK(zs_shard_push_chunk(ps, 2, g_rb, 100, ZS_DTYPE_F32, &dst, &err), err);
    memset(dst, 0xFF, 400); /* must land in a buffer, not in the staged bytes */
    zs_shard_push_chunk_done(ps);
    rc = zs_shard_push_chunk(ps, 2, g_rb + 100, 10, ZS_DTYPE_BF16, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "cannot be mixed in", "re-push, then a bf16 chunk");
    TEST_CHECK(zs_shard_push_end(ps, 0, &staged, &err) == ZS_OK && staged == 100);
    TEST_CHECK(memcmp(sh->st.staging[0], g, 400) == 0); /* step 2: parity 0 */
    free(g);
    free(got);
    printf("ok  push streams: staged at their end; a refused re-push left the staged bytes\n");

    /* At the last step: nothing after it is taken, nothing wraps to 0. */
    TEST_OK(zs_shard_set_step(sh, ZS_SHARD_STEP_MAX, ZS_SHARD_STEP_MAX, &err), err);
    rc = zs_shard_push_reserve(sh, ZS_SHARD_STEP_MAX + 1, g_rb, 1, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "above the largest step", "push after the last step");
    rc = zs_shard_push_reserve(sh, 0, g_rb, 1, ZS_DTYPE_F32, &dst, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "already committed", "push of step 0 at the last step");
    c = scalars(ZS_SHARD_STEP_MAX + 1, 1, ZS_DTYPE_NONE);
    rc = zs_shard_commit(sh, &c, &a, &os, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "above the largest step",
                   "commit after the last step");
    c = scalars(0, 1, ZS_DTYPE_NONE);
    rc = zs_shard_commit(sh, &c, &a, &os, &err);
    expect_refusal(rc, &err, ZS_ERR_STATE, "expects step", "commit of step 0 at the last step");
    rc = zs_shard_set_step(sh, ZS_SHARD_STEP_MAX + 1, 0, &err);
    expect_refusal(rc, &err, ZS_ERR_INVALID, "above the largest step", "set-step past the last");
    in = info(sh);
    free(in.checkpoints);
    TEST_CHECK(in.applied_step == ZS_SHARD_STEP_MAX && in.optimizer_step == ZS_SHARD_STEP_MAX);
    zs_shard_destroy(sh);
}

/* Our temp dirs (made by mkdtemp in main), removed at exit, failures too. */
static char g_dirs[3][32];

static void remove_dirs(void)
{
    for (int i = 0; i < 3; i++)
        if (g_dirs[i][0]) {
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dirs[i]);
            if (system(cmd) != 0)
                fprintf(stderr, "warning: could not remove %s\n", g_dirs[i]);
            g_dirs[i][0] = '\0';
        }
}

static const char *make_dir(int i)
{
    snprintf(g_dirs[i], sizeof g_dirs[i], "/tmp/zs-shard-XXXXXX");
    TEST_CHECK(mkdtemp(g_dirs[i]));
    return g_dirs[i];
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    zs_log_set_level(ZS_LOG_WARN); /* the shard's INFO lines would drown ours */
    g_rb = zs_layout_begin(P, S, INDEX);
    g_re = zs_layout_begin(P, S, INDEX + 1);
    g_n = g_re - g_rb;
    g_hp = zs_synth_hparams();
    TEST_CHECK(g_rb > 0 && g_re == P && g_n > 2 * ZS_OPT_CHUNK && g_n % ZS_OPT_CHUNK != 0);
    atexit(remove_dirs);
    const char *dir = make_dir(0);
    printf("data dir %s; range [%llu, %llu)\n", dir, (unsigned long long)g_rb,
           (unsigned long long)g_re);

    zs_shard_t *sh = open_shard(dir);
    state_t ref;
    state_alloc(&ref);
    before_init(sh);
    init_and_replace(sh, &ref);
    push_and_commit(sh, &ref);
    skip_pull_state(sh, &ref);
    checkpoints(&sh, dir, &ref);
    zs_shard_destroy(sh);
    state_free(&ref);
    lowp_switch(make_dir(1));
    budget(make_dir(2));
    printf("PASS test_shard\n");
    return 0;
}
