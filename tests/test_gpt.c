/*
 * test_gpt.c - the reference GPT model (worker/model/zs_gpt.h) as a whole,
 * on the CPU device (zs_dev_cpu_create) with one compute stream: parameters
 * and gradients live in device-space buffers (host memory on CPU, but only
 * reached through zs_dev_memcpy and a stream sync, as on a GPU), the model
 * enqueues every kernel on the stream.
 *
 *   0. binding: what bind allocates (activations, scratch, pinned staging,
 *      counted per category, freed by destroy), a device without GPT ops
 *      refused, calls out of order or before bind refused;
 *   1. finite differences through the whole tiny model (L=2, NH=2, C=16,
 *      T=8, V=32, B=2) on a sample of every parameter tensor, with the
 *      GPT-2 initialisation perturbed so every path carries gradient; also
 *      that backward accumulates and scales with dloss;
 *   2. against PyTorch: the weights (init_params of each layer into one
 *      flat buffer, the engine-free path) and a token batch go to a temp
 *      dir, tests/ref/gpt_torch.py builds the same model in torch (float32)
 *      and writes logits, loss and every parameter gradient back; logits,
 *      loss and each tensor's gradient must agree within abs + rel
 *      tolerances (max errors printed per tensor). Twice: the GPT-2 init
 *      with T = ctx, and perturbed weights with T < ctx on a wider model;
 *   3. the ZeRO engine at W = 1 (MPI initialised here, no mpirun needed),
 *      stage 0, fp32, no servers: a few AdamW steps on a fixed batch must
 *      lower the loss; load_batch without data fails with a clear message,
 *      and with a token file it loads what zs_data_sample gives. Built only
 *      with ZS_TEST_GPT_ENGINE (tests/gpt.cmake: it links libzeroshard).
 *
 * python3 with torch is a required test dependency (deploy/install-deps.sh).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef ZS_TEST_GPT_ENGINE
#include <mpi.h>
#endif

#include "zs_data.h"
#include "zs_dev.h"
#include "zs_engine.h"
#include "zs_gpt.h"
#include "zs_test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float urand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) * 0x1p-52 - 1.0);
}

/* The CPU device and its compute stream, shared by parts 0-2. */
static zs_dev_t *dev;
static zs_stream_t *stream;
/* GEMM precision of the models fixture_init makes (zs_gpt_set_compute). */
static int fixture_gemm_dt = ZS_DTYPE_F32;

typedef struct {
    zs_gpt_config_t c;
    zs_gpt_t *g;
    const zs_model_t *m;
    uint64_t P;
    uint64_t *off;     /* [nlayers + 1] layer offsets in the flat buffer */
    float *w, *grad;   /* host copies */
    float *dw, *dgrad; /* device buffers the model reads and writes */
    int B, T;
    int32_t *in, *tg;
} fixture_t;

static void wait_stream(void)
{
    zs_err_t err;
    TEST_OK(zs_dev_stream_sync(stream, &err), err);
}

/* Host -> device: n floats of the flat buffers from index i, then wait. */
static void push(float *dst_dev, const float *src, uint64_t i, uint64_t n)
{
    zs_err_t err;
    TEST_OK(zs_dev_memcpy(stream, dst_dev + i, src + i, n * sizeof(float), &err), err);
    wait_stream();
}

/* Device gradients -> f->grad, then wait. */
static void pull_grad(fixture_t *f)
{
    zs_err_t err;
    TEST_OK(zs_dev_memcpy(stream, f->grad, f->dgrad, f->P * sizeof(float), &err), err);
    wait_stream();
}

static void fixture_init(fixture_t *f, zs_gpt_config_t c, int B, int T, uint64_t seed)
{
    zs_err_t err;
    memset(f, 0, sizeof *f);
    f->c = c;
    f->B = B;
    f->T = T;
    TEST_OK(zs_gpt_create(&c, B, seed, &f->g, &err), err);
    TEST_OK(zs_gpt_set_threads(f->g, 2, &err), err);
    TEST_OK(zs_gpt_set_compute(f->g, fixture_gemm_dt, &err), err);
    f->m = zs_gpt_model(f->g);
    f->P = zs_gpt_num_params(&c);
    f->off = calloc((size_t)f->m->nlayers + 1, sizeof *f->off);
    for (int i = 0; i < f->m->nlayers; i++)
        f->off[i + 1] = f->off[i] + f->m->nparams[i];
    TEST_CHECK(f->off[f->m->nlayers] == f->P);
    f->w = malloc(f->P * sizeof(float));
    f->grad = malloc(f->P * sizeof(float));
    for (int i = 0; i < f->m->nlayers; i++)
        TEST_OK(f->m->init_params(f->m->self, i, f->w + f->off[i], &err), err);
    TEST_OK(f->m->bind(f->m->self, dev, stream, &err), err);
    void *p;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, f->P * sizeof(float), &p, &err), err);
    f->dw = p;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_GRADS, f->P * sizeof(float), &p, &err), err);
    f->dgrad = p;
    push(f->dw, f->w, 0, f->P);
    f->in = malloc((size_t)B * T * sizeof(int32_t));
    f->tg = malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) {
        f->in[i] = (int32_t)((i * 7 + 3) % c.vocab);
        f->tg[i] = (int32_t)((i * 13 + 5 + i / 3) % c.vocab);
    }
    TEST_OK(zs_gpt_set_tokens(f->g, f->in, f->tg, B, T, &err), err);
}

static void fixture_free(fixture_t *f)
{
    zs_gpt_destroy(f->g);
    zs_dev_free(dev, f->dw);
    zs_dev_free(dev, f->dgrad);
    free(f->off), free(f->w), free(f->grad), free(f->in), free(f->tg);
}

/* Forward through every layer with the device weights f->dw; returns the
 * loss (which waits for the stream). */
static double run_forward(fixture_t *f)
{
    zs_err_t err;
    int n = f->m->nlayers;
    for (int i = 0; i < n; i++) {
        void *p[2] = {f->dw + f->off[i], f->dw};
        TEST_OK(f->m->forward(f->m->self, i, p, &err), err);
    }
    double loss;
    TEST_OK(f->m->loss(f->m->self, &loss, &err), err);
    return loss;
}

/* Backward of every layer, accumulating into the device gradients. */
static void run_backward(fixture_t *f, float dloss)
{
    zs_err_t err;
    for (int i = f->m->nlayers - 1; i >= 0; i--) {
        void *p[2] = {f->dw + f->off[i], f->dw};
        float *g[2] = {f->dgrad + f->off[i], f->dgrad};
        TEST_OK(f->m->backward(f->m->self, i, p, g, dloss, &err), err);
    }
}

/* Scramble the GPT-2 init so LayerNorm gains/biases and every bias matter. */
static void perturb(fixture_t *f, float amount)
{
    int nt = zs_gpt_num_tensors(&f->c);
    for (int i = 0; i < nt; i++) {
        zs_gpt_tensor_t t;
        TEST_OK(zs_gpt_tensor(&f->c, i, &t), (zs_err_t){0});
        for (uint64_t k = 0; k < t.numel; k++)
            f->w[t.offset + k] += amount * urand();
    }
    push(f->dw, f->w, 0, f->P);
}

/* ---- 0. binding ---- */

static void test_bind(void)
{
    zs_err_t err;
    zs_gpt_config_t c = {2, 2, 16, 8, 32};
    const int B = 3;
    zs_gpt_t *g;
    zs_dev_mem_t m0, m;
    zs_dev_mem_get(dev, &m0);
    TEST_OK(zs_gpt_create(&c, B, 1, &g, &err), err);
    const zs_model_t *md = zs_gpt_model(g);
    zs_dev_mem_get(dev, &m);
    TEST_CHECK(memcmp(m.cur, m0.cur, sizeof m.cur) == 0); /* create allocates no tensors */

    /* before bind: refused, naming bind */
    int32_t tok[3 * 8] = {0};
    int rc = zs_gpt_set_tokens(g, tok, tok, B, 8, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE && strstr(err.msg, "bind"), "set_tokens unbound: %d '%s'", rc,
                err.msg);
    void *none[2] = {NULL, NULL};
    float *gnone[2] = {NULL, NULL};
    rc = md->forward(md->self, 0, none, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE && strstr(err.msg, "bind"), "forward unbound: %d '%s'", rc,
                err.msg);

    /* a device kind without GPT ops: the real CPU device under another name
     * (its stream is idle, so nothing reads the table meanwhile) */
    const zs_dev_vtable_t *real = dev->vt;
    zs_dev_vtable_t renamed = *real;
    renamed.name = "tpu";
    dev->vt = &renamed;
    rc = zs_gpt_bind(g, dev, stream, &err);
    dev->vt = real;
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "GPT ops for device tpu are not built"),
                "bind to tpu: rc %d '%s'", rc, err.msg);
    printf("  bind to another device kind: %s\n", err.msg);
    zs_dev_mem_get(dev, &m);
    TEST_CHECK(memcmp(m.cur, m0.cur, sizeof m.cur) == 0);

    /* bind allocates what the model's tensors need, by category (each tensor
     * rounded up to 16 floats: at most 15 floats of slack per tensor) */
    TEST_OK(md->bind(md->self, dev, stream, &err), err);
    uint64_t L = (uint64_t)c.layers, C = (uint64_t)c.width, V = (uint64_t)c.vocab;
    uint64_t N = (uint64_t)B * c.ctx, ATT = (uint64_t)B * c.heads * c.ctx * c.ctx;
    uint64_t VP = ZS_GPT_LOGITS_LD(V); /* logits rows padded (zs_gpt.h) */
    uint64_t act = 4 * (L * (15 * N * C + 4 * N + ATT) /* per block */
                        + (L + 1) * N * C              /* residual stream */
                        + N * C + 4 * N + N * VP       /* final LN, lse, losses, logits */
                        + 2 * N);                      /* token ids */
    /* scratch: no dlogits of its own (the head's gradient goes over the
     * logits), so N * VP fewer floats than before */
    uint64_t scr = 4 * (10 * N * C + ATT), pin = 4 * 3 * N;
    zs_dev_mem_get(dev, &m);
    uint64_t got_act =
        m.cur[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS] - m0.cur[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS];
    uint64_t got_scr =
        m.cur[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH] - m0.cur[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH];
    uint64_t got_pin =
        m.cur[ZS_SPACE_PINNED][ZS_MEM_SCRATCH] - m0.cur[ZS_SPACE_PINNED][ZS_MEM_SCRATCH];
    printf("  bind: activations %llu B (tensors %llu), scratch %llu B (%llu), pinned %llu B\n",
           (unsigned long long)got_act, (unsigned long long)act, (unsigned long long)got_scr,
           (unsigned long long)scr, (unsigned long long)got_pin);
    TEST_CHECK(got_act >= act && got_act <= act + 21 * 60);
    TEST_CHECK(got_scr >= scr && got_scr <= scr + 6 * 60);
    TEST_CHECK(got_pin >= pin && got_pin <= pin + 2 * 60);
    TEST_CHECK(m.cur[ZS_SPACE_HOST][ZS_MEM_ACTIVATIONS] ==
               m0.cur[ZS_SPACE_HOST][ZS_MEM_ACTIVATIONS]);
    rc = zs_gpt_bind(g, dev, stream, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE, "second bind: rc %d", rc);

    /* calls out of order are refused before anything is enqueued */
    double loss;
    rc = md->loss(md->self, &loss, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE, "loss without a batch: rc %d", rc);
    rc = md->forward(md->self, 0, none, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE && strstr(err.msg, "without a batch"), "forward: %d '%s'", rc,
                err.msg);
    TEST_OK(zs_gpt_set_tokens(g, tok, tok, B, 8, &err), err);
    rc = md->forward(md->self, 2, none, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE, "forward of layer 2 first: rc %d", rc);
    rc = md->backward(md->self, 3, none, gnone, 1.0f, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE, "backward before forward: rc %d", rc);
    float *lg = malloc((size_t)N * V * sizeof(float));
    rc = zs_gpt_copy_logits(g, lg, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE, "logits before forward: rc %d", rc);
    free(lg);

    zs_gpt_destroy(g);
    zs_dev_mem_get(dev, &m);
    TEST_CHECK(memcmp(m.cur, m0.cur, sizeof m.cur) == 0); /* destroy frees all of it */
    printf("  bind: state checks refuse out-of-order calls; destroy frees everything\n");
}

/* A host function that holds its stream until *open is set. */
static int gate_fn(void *args, zs_err_t *e)
{
    atomic_int *open = *(atomic_int **)args;
    while (!atomic_load(open)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return ZS_OK;
}

static void *open_gate_later(void *arg)
{
    struct timespec ts = {0, 100000000}; /* 100 ms */
    nanosleep(&ts, NULL);
    atomic_store((atomic_int *)arg, 1);
    return NULL;
}

/* Two batches A and B back to back without waiting, while the stream is held
 * at a gate so A's token upload has not run when B is set: the gradients
 * must be those of A then B (as when each batch is waited for). If B's
 * tokens overwrote the pinned staging buffer before A's upload ran, both
 * backward passes would see B. */
static void test_staging(void)
{
    zs_gpt_config_t c = {2, 2, 16, 8, 32};
    fixture_t f;
    uint64_t rng_saved = rng_state; /* parts 1-2 see the same numbers as without this */
    fixture_init(&f, c, 2, 8, 5);
    perturb(&f, 0.3f);
    rng_state = rng_saved;
    int n = f.B * f.T;
    int32_t *inB = malloc((size_t)n * sizeof(int32_t)), *tgB = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        inB[i] = (int32_t)((i * 11 + 1) % c.vocab);
        tgB[i] = (int32_t)((i * 3 + 2) % c.vocab);
    }
    float *ref = malloc(f.P * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        zs_err_t err;
        memset(f.grad, 0, f.P * sizeof(float));
        push(f.dgrad, f.grad, 0, f.P);
        atomic_int open = pass == 0; /* pass 0: reference, nothing held */
        atomic_int *openp = &open;
        pthread_t th;
        TEST_OK(zs_dev_host_fn(stream, gate_fn, &openp, sizeof openp, &err), err);
        if (pass == 1)
            TEST_CHECK(pthread_create(&th, NULL, open_gate_later, &open) == 0);
        TEST_OK(zs_gpt_set_tokens(f.g, f.in, f.tg, f.B, f.T, &err), err);
        for (int i = 0; i < f.m->nlayers; i++) {
            void *p[2] = {f.dw + f.off[i], f.dw};
            TEST_OK(f.m->forward(f.m->self, i, p, &err), err);
        }
        run_backward(&f, 1.0f);
        if (pass == 0)
            wait_stream();
        TEST_OK(zs_gpt_set_tokens(f.g, inB, tgB, f.B, f.T, &err), err);
        for (int i = 0; i < f.m->nlayers; i++) {
            void *p[2] = {f.dw + f.off[i], f.dw};
            TEST_OK(f.m->forward(f.m->self, i, p, &err), err);
        }
        run_backward(&f, 1.0f);
        pull_grad(&f);
        if (pass == 0) {
            memcpy(ref, f.grad, f.P * sizeof(float));
        } else {
            pthread_join(th, NULL);
            TEST_CHECK(memcmp(ref, f.grad, f.P * sizeof(float)) == 0);
        }
    }
    printf("  two batches queued behind a held stream: same gradients as waiting for each\n");
    free(ref), free(inB), free(tgB);
    fixture_free(&f);
}

/* zs_gpt_destroy waits for the work the model queued, and does so through
 * its own events, so the compute stream may be gone first (the engine
 * destroys its streams before the caller destroys the model). */
static void test_destroy(void)
{
    zs_err_t err;
    zs_gpt_config_t c = {2, 2, 16, 8, 32};
    for (int stream_first = 0; stream_first < 2; stream_first++) {
        fixture_t f;
        fixture_init(&f, c, 2, 8, 3);
        zs_gpt_t *g;
        zs_stream_t *s2;
        TEST_OK(zs_gpt_create(&c, 2, 3, &g, &err), err);
        TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
        TEST_OK(zs_dev_stream_create(dev, 0, "compute2", &s2, &err), err);
        TEST_OK(zs_gpt_bind(g, dev, s2, &err), err);
        atomic_int open = 0;
        atomic_int *openp = &open;
        pthread_t th;
        TEST_OK(zs_dev_host_fn(s2, gate_fn, &openp, sizeof openp, &err), err);
        TEST_OK(zs_gpt_set_tokens(g, f.in, f.tg, f.B, f.T, &err), err);
        const zs_model_t *m = zs_gpt_model(g);
        for (int i = 0; i < m->nlayers; i++) {
            void *p[2] = {f.dw + f.off[i], f.dw};
            TEST_OK(m->forward(m->self, i, p, &err), err);
        }
        TEST_CHECK(pthread_create(&th, NULL, open_gate_later, &open) == 0);
        if (stream_first) {
            /* engine order: the stream goes first (it drains), then the
             * model; a use of the freed stream shows under ZS_SANITIZE */
            zs_dev_stream_destroy(s2);
            zs_gpt_destroy(g);
        } else {
            zs_gpt_destroy(g); /* must block until the gate opens and the forward ran */
            TEST_CHECKF(atomic_load(&open) == 1, "zs_gpt_destroy returned with work queued");
            zs_dev_stream_destroy(s2);
        }
        pthread_join(th, NULL);
        fixture_free(&f);
    }
    printf("  destroy waits for the queued work, before or after the stream is destroyed\n");
}

/* ---- 1. finite differences through the whole model ---- */

static void test_fd(void)
{
    zs_gpt_config_t c = {2, 2, 16, 8, 32};
    fixture_t f;
    zs_err_t err;
    fixture_init(&f, c, 2, 8, 42);
    perturb(&f, 0.3f);
    double loss0 = run_forward(&f);
    /* accumulation: start from a known non-zero buffer */
    float *g0 = malloc(f.P * sizeof(float));
    for (uint64_t i = 0; i < f.P; i++)
        g0[i] = f.grad[i] = 0.25f * urand();
    push(f.dgrad, f.grad, 0, f.P);
    const float dloss = 1.5f;
    run_backward(&f, dloss);
    pull_grad(&f);
    double *an = malloc(f.P * sizeof(double));
    for (uint64_t i = 0; i < f.P; i++)
        an[i] = ((double)f.grad[i] - g0[i]) / dloss;
    /* the same with dloss = 1 from zero: must be an[] (scaling by dloss) */
    run_forward(&f);
    memset(f.grad, 0, f.P * sizeof(float));
    push(f.dgrad, f.grad, 0, f.P);
    run_backward(&f, 1.0f);
    pull_grad(&f);
    double scale_err = 0;
    for (uint64_t i = 0; i < f.P; i++)
        scale_err = fmax(scale_err, fabs(an[i] - f.grad[i]));
    printf("  backward: accumulate + dloss scaling vs dloss=1 from zero: max abs err %.3g\n",
           scale_err);
    TEST_CHECK(scale_err < 1e-6);

    const float h = 1e-2f;
    const double atol = 5e-5, rtol = 5e-3;
    int nt = zs_gpt_num_tensors(&c), checked = 0;
    double worst = 0;
    printf("  finite differences (h = %g, loss %.6f), per tensor max |analytic - fd|:\n", h, loss0);
    for (int ti = 0; ti < nt; ti++) {
        zs_gpt_tensor_t t;
        TEST_OK(zs_gpt_tensor(&c, ti, &t), err);
        uint64_t step = t.numel > 12 ? t.numel / 12 : 1;
        double maxe = 0, maxg = 0;
        for (uint64_t k = (uint64_t)ti % step; k < t.numel; k += step) {
            uint64_t at = t.offset + k;
            float *x = f.w + at, x0 = *x, xp = x0 + h, xm = x0 - h;
            *x = xp;
            push(f.dw, f.w, at, 1);
            double lp = run_forward(&f);
            *x = xm;
            push(f.dw, f.w, at, 1);
            double lm = run_forward(&f);
            *x = x0;
            push(f.dw, f.w, at, 1);
            double fd = (lp - lm) / ((double)xp - xm), a = an[t.offset + k];
            double e = fabs(a - fd);
            maxe = fmax(maxe, e);
            maxg = fmax(maxg, fabs(fd));
            TEST_CHECKF(e <= atol + rtol * fabs(fd), "%s[%llu]: analytic %.8g fd %.8g", t.name,
                        (unsigned long long)k, a, fd);
            checked++;
        }
        worst = fmax(worst, maxe);
        printf("    %-16s max err %.3g (max |grad| %.3g)\n", t.name, maxe, maxg);
    }
    printf("  finite differences: %d parameters checked, max abs err %.3g\n", checked, worst);
    free(g0);
    free(an);
    fixture_free(&f);
}

/* ---- 2. against PyTorch ---- */

static void require_torch(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", ZS_PYTHON);
    if (system(cmd) != 0) {
        fprintf(stderr,
                "FAIL: %s cannot import torch. python3-torch is a required test dependency: "
                "run deploy/install-deps.sh\n",
                ZS_PYTHON);
        exit(1);
    }
}

/* torch's logits, loss and gradients for f's weights and tokens at GEMM
 * precision `gemm` ("fp32", "bf16", "fp16"), through a temp dir. */
static void torch_ref(const fixture_t *f, const char *gemm, float *rlogits, double *rloss,
                      float *rgrad)
{
    zs_gpt_config_t c = f->c;
    int B = f->B, T = f->T;
    char dir[] = "/tmp/zs_test_gpt_XXXXXX";
    TEST_CHECK(mkdtemp(dir) != NULL);
    char cfg[128];
    int n = snprintf(cfg, sizeof cfg, "%d %d %d %d %d %d %d\n", c.layers, c.heads, c.width, c.ctx,
                     c.vocab, B, T);
    zs_test_write_file(dir, "config.txt", cfg, (size_t)n);
    zs_test_write_file(dir, "params.bin", f->w, f->P * sizeof(float));
    int32_t *tok = malloc(2 * (size_t)B * T * sizeof(int32_t));
    memcpy(tok, f->in, (size_t)B * T * sizeof(int32_t));
    memcpy(tok + (size_t)B * T, f->tg, (size_t)B * T * sizeof(int32_t));
    zs_test_write_file(dir, "tokens.bin", tok, 2 * (size_t)B * T * sizeof(int32_t));
    free(tok);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/gpt_torch.py %s %s", ZS_PYTHON, ZS_SOURCE_DIR, dir,
             gemm);
    int rc = system(cmd);
    TEST_CHECKF(rc == 0, "%s failed (%d); torch missing? run deploy/install-deps.sh", cmd, rc);
    zs_test_read_file(dir, "logits.bin", rlogits, (size_t)B * T * c.vocab * sizeof(float));
    zs_test_read_file(dir, "loss.bin", rloss, sizeof *rloss);
    zs_test_read_file(dir, "grads.bin", rgrad, f->P * sizeof(float));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    TEST_CHECK(system(cmd) == 0);
}

/* Mixed-precision GEMMs against torch doing the same rounding (MixedMM in
 * gpt_torch.py) and against torch with fp32 GEMMs. Two fp32 implementations
 * differ by an ulp here and there, and where such a value sits near a
 * rounding tie the two round it to different 16-bit neighbours; the model
 * amplifies that (measured with torch alone: the same model in float32 and
 * in float64, both rounding their GEMM operands to fp16, differ by about a
 * quarter of what fp16 vs fp32 GEMMs differ by). So the checks are: the RMS
 * difference from the same-rounding reference is at least min_ratio times
 * below the RMS difference from fp32 GEMMs (the rounding happens, at the
 * same points: with the GPT-2 init's small weights no tie is crossed in
 * bf16 and the two agree to ~1e-9), and the largest differences stay
 * within a few 16-bit unit roundoffs of the values involved. */
static void mixed_vs_torch(const fixture_t *f, double min_ratio, double loss, const float *logits,
                           double rloss, const float *rlogits, const float *rgrad)
{
    size_t nlog = (size_t)f->B * f->T * f->c.vocab;
    int bf = fixture_gemm_dt == ZS_DTYPE_BF16;
    double ulp = bf ? 0x1p-8 : 0x1p-11; /* half the spacing at 1: unit roundoff */
    float *plog = malloc(nlog * sizeof(float)), *pgrad = malloc(f->P * sizeof(float));
    double ploss;
    torch_ref(f, "fp32", plog, &ploss, pgrad);
    double lmax, lrms, pmax, prms, gmax, grms, qmax, qrms;
    zs_test_diff_stats(logits, rlogits, nlog, &lmax, &lrms);
    zs_test_diff_stats(logits, plog, nlog, &pmax, &prms);
    zs_test_diff_stats(f->grad, rgrad, f->P, &gmax, &grms);
    zs_test_diff_stats(f->grad, pgrad, f->P, &qmax, &qrms);
    double gscale = 0;
    for (uint64_t k = 0; k < f->P; k++)
        gscale = fmax(gscale, fabs(rgrad[k]));
    printf("    loss      vs fp32-GEMM torch %.7f: diff %.3g\n", ploss, fabs(loss - ploss));
    printf("    logits    vs same rounding: max %.3g rms %.3g | vs fp32 GEMMs: max %.3g rms %.3g "
           "(%.0fx)\n",
           lmax, lrms, pmax, prms, prms / fmax(lrms, 1e-30));
    printf("    grads     vs same rounding: max %.3g rms %.3g | vs fp32 GEMMs: max %.3g rms %.3g "
           "(%.0fx; max |g| %.3g)\n",
           gmax, grms, qmax, qrms, qrms / fmax(grms, 1e-30), gscale);
    TEST_CHECKF(lrms * min_ratio <= prms,
                "logits: rms %.3g from the same rounding, %.3g from fp32 GEMMs (want %gx)", lrms,
                prms, min_ratio);
    TEST_CHECKF(grms * min_ratio <= qrms,
                "grads: rms %.3g from the same rounding, %.3g from fp32 GEMMs (want %gx)", grms,
                qrms, min_ratio);
    TEST_CHECKF(fabs(loss - rloss) <= 4 * ulp * fabs(rloss) / 16, "loss %.8g vs %.8g", loss, rloss);
    TEST_CHECKF(lmax <= 4 * ulp, "logits: max diff %.3g > 4 x %.3g", lmax, ulp);
    TEST_CHECKF(gmax <= 4 * ulp * gscale, "grads: max diff %.3g > 4 x %.3g x %.3g", gmax, ulp,
                gscale);
    free(plog), free(pgrad);
}

/* The model against torch at GEMM precision fixture_gemm_dt; min_ratio is
 * what mixed precision needs (mixed_vs_torch). */
static void test_torch(const char *label, zs_gpt_config_t c, int B, int T, float perturb_amt,
                       double min_ratio)
{
    fixture_t f;
    zs_err_t err;
    fixture_init(&f, c, B, T, 7);
    if (perturb_amt > 0)
        perturb(&f, perturb_amt);
    double loss = run_forward(&f);
    /* the logits of the forward, before the backward writes their gradient
     * over them (copy_logits refuses afterwards, checked below) */
    size_t nlog = (size_t)B * T * c.vocab;
    float *logits = malloc(nlog * sizeof(float)), *rlogits = malloc(nlog * sizeof(float));
    TEST_OK(zs_gpt_copy_logits(f.g, logits, &err), err);
    memset(f.grad, 0, f.P * sizeof(float));
    push(f.dgrad, f.grad, 0, f.P);
    run_backward(&f, 1.0f);
    pull_grad(&f);
    TEST_CHECKF(zs_gpt_copy_logits(f.g, rlogits, &err) == ZS_ERR_STATE,
                "copy_logits after the backward must be refused (the logits are gone)");

    float *rgrad = malloc(f.P * sizeof(float));
    double rloss;
    torch_ref(&f, zs_dtype_name(fixture_gemm_dt), rlogits, &rloss, rgrad);

    printf("  vs torch, %s, %s GEMMs: L=%d NH=%d C=%d ctx=%d V=%d B=%d T=%d\n", label,
           zs_dtype_name(fixture_gemm_dt), c.layers, c.heads, c.width, c.ctx, c.vocab, B, T);
    double le = fabs(loss - rloss);
    printf("    loss      zs %.7f torch %.7f  abs err %.3g\n", loss, rloss, le);
    if (fixture_gemm_dt != ZS_DTYPE_F32) {
        mixed_vs_torch(&f, min_ratio, loss, logits, rloss, rlogits, rgrad);
        free(logits), free(rlogits), free(rgrad);
        fixture_free(&f);
        return;
    }
    TEST_CHECK(le <= 1e-5 + 1e-5 * fabs(rloss));
    double lmax = 0;
    for (size_t i = 0; i < nlog; i++) {
        TEST_CHECKF(zs_test_close(logits[i], rlogits[i], 2e-5, 1e-4, &lmax),
                    "logit %zu: zs %.8g torch %.8g", i, logits[i], rlogits[i]);
    }
    printf("    logits    max abs err %.3g\n", lmax);
    /* each gradient tensor: |zs - torch| <= 2e-5 * max|torch tensor| + 1e-3 |torch| */
    int nt = zs_gpt_num_tensors(&c);
    double worst_rel = 0;
    for (int ti = 0; ti < nt; ti++) {
        zs_gpt_tensor_t t;
        TEST_OK(zs_gpt_tensor(&c, ti, &t), err);
        const float *a = f.grad + t.offset, *r = rgrad + t.offset;
        double scale = 0, maxe = 0;
        for (uint64_t k = 0; k < t.numel; k++)
            scale = fmax(scale, fabs(r[k]));
        double atol = 2e-5 * scale + 1e-9;
        for (uint64_t k = 0; k < t.numel; k++)
            TEST_CHECKF(zs_test_close(a[k], r[k], atol, 1e-3, &maxe),
                        "grad %s[%llu]: zs %.8g torch %.8g (tensor max |g| %.3g)", t.name,
                        (unsigned long long)k, a[k], r[k], scale);
        double rel = scale > 0 ? maxe / scale : 0;
        worst_rel = fmax(worst_rel, rel);
        printf("    d%-16s max abs err %.3g  (max |g| %.3g, err/max %.3g)\n", t.name, maxe, scale,
               rel);
    }
    printf("    gradients: worst max-err / max|g| over tensors %.3g\n", worst_rel);
    free(logits), free(rlogits), free(rgrad);
    fixture_free(&f);
}

/* ---- 3. the engine at W = 1 ---- */

#ifdef ZS_TEST_GPT_ENGINE
/* Forward of every layer on the host weights w (pushed to the device first)
 * and the logits copied back to out. */
static void forward_logits(zs_gpt_t *g, const float *w, float *dw, uint64_t P, float *out)
{
    zs_err_t err;
    const zs_model_t *m = zs_gpt_model(g);
    TEST_OK(zs_dev_memcpy(stream, dw, w, P * sizeof(float), &err), err);
    uint64_t off = 0;
    for (int i = 0; i < m->nlayers; i++) {
        void *p[2] = {dw + off, dw};
        TEST_OK(m->forward(m->self, i, p, &err), err);
        off += m->nparams[i];
    }
    TEST_OK(zs_gpt_copy_logits(g, out, &err), err);
}

static void test_engine(void)
{
    zs_err_t err;
    zs_gpt_config_t c = {2, 2, 32, 16, 64};
    const int B = 4;
    zs_gpt_t *g;
    TEST_OK(zs_gpt_create(&c, B, 11, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    const zs_model_t *m = zs_gpt_model(g);
    TEST_OK(zs_gpt_bind(g, dev, stream, &err), err);

    /* no data: load_batch refuses clearly */
    zs_batch_ctx_t bc = {1, 0, 1, 0, 1, B, B};
    int rc = m->load_batch(m->self, &bc, &err);
    TEST_CHECKF(rc == ZS_ERR_STATE && strstr(err.msg, "zs_gpt_set_data"),
                "load_batch without data: rc %d msg '%s'", rc, err.msg);
    printf("  load_batch without data: %s\n", err.msg);

    /* with a token file: the samples zs_data_sample gives */
    char dir[] = "/tmp/zs_test_gpt_XXXXXX", path[600];
    TEST_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/tokens.zst", dir);
    uint16_t toks[1000];
    for (int i = 0; i < 1000; i++)
        toks[i] = (uint16_t)((i * 31 + i / 7) % c.vocab);
    TEST_OK(zs_data_write(path, (uint32_t)c.vocab, toks, 1000, &err), err);
    zs_data_t *data;
    TEST_OK(zs_data_open(path, &data, &err), err);
    TEST_OK(zs_gpt_set_data(g, data, &err), err);
    bc.step = 3;
    TEST_OK(m->load_batch(m->self, &bc, &err), err);
    uint64_t P = zs_gpt_num_params(&c);
    float *w = malloc(P * sizeof(float));
    void *dwp;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, P * sizeof(float), &dwp, &err), err);
    float *dw = dwp;
    uint64_t off = 0;
    for (int i = 0; i < m->nlayers; i++) {
        TEST_OK(m->init_params(m->self, i, w + off, &err), err);
        off += m->nparams[i];
    }
    /* the inputs loaded are observable through the logits: compare with set_tokens */
    size_t nlog = (size_t)B * c.ctx * c.vocab;
    float *l1 = malloc(nlog * sizeof(float)), *l2 = malloc(nlog * sizeof(float));
    forward_logits(g, w, dw, P, l1);
    int32_t in[B * 16], tg[B * 16];
    for (int k = 0; k < B; k++)
        TEST_OK(zs_data_sample(data, zs_batch_sample(&bc, k), c.ctx, in + k * c.ctx, tg + k * c.ctx,
                               &err),
                err);
    TEST_OK(zs_gpt_set_tokens(g, in, tg, B, c.ctx, &err), err);
    forward_logits(g, w, dw, P, l2);
    TEST_CHECK(memcmp(l1, l2, nlog * sizeof(float)) == 0);
    printf("  load_batch with a token file: same batch as zs_data_sample\n");
    TEST_OK(zs_gpt_set_data(g, NULL, &err), err);
    zs_data_close(data);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    TEST_CHECK(system(path) == 0);
    free(l1), free(l2), free(w);
    zs_dev_free(dev, dw);
    zs_gpt_destroy(g);

    /* engine, W = 1, stage 0, fp32, fixed batch, on a fresh model: the
     * engine binds it to the communicator's device */
    TEST_OK(zs_gpt_create(&c, B, 11, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    m = zs_gpt_model(g);
    for (int i = 0; i < B * c.ctx; i++) {
        in[i] = (int32_t)((i * 5 + 1) % c.vocab);
        tg[i] = (int32_t)((i * 5 + 6) % c.vocab); /* a learnable map of the input */
    }
    TEST_OK(zs_gpt_set_fixed_tokens(g, in, tg, B, &err), err);
    zs_coll_t *coll;
    TEST_OK(zs_coll_mpi_create(dev, &coll, &err), err);
    TEST_CHECK(coll->size == 1);
    zs_config_t cfg;
    const char *json = "{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": 4,"
                       " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003,"
                       " \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.0}},"
                       " \"zero_optimization\": {\"stage\": 0}}";
    TEST_OK(zs_config_parse(json, &cfg, NULL, NULL, &err), err);
    TEST_OK(zs_config_resolve(&cfg, 1, &err), err);
    zs_engine_opts_t eo = {&cfg, coll, NULL, NULL, "gpt-test", 0};
    zs_engine_t *e;
    TEST_OK(zs_engine_create(&eo, m, &e, &err), err);
    TEST_CHECK(zs_engine_num_params(e) == zs_gpt_num_params(&c));
    TEST_OK(zs_engine_start(e, &err), err);
    double first = 0, last = 0;
    for (int s = 0; s < 12; s++) {
        zs_step_stats_t st;
        TEST_OK(zs_engine_step(e, &st, &err), err);
        if (s == 0)
            first = st.loss;
        last = st.loss;
        printf("  engine step %2llu loss %.5f grad norm %.4g\n", (unsigned long long)st.step,
               st.loss, st.grad_norm);
        TEST_CHECK(isfinite(st.loss));
    }
    TEST_CHECKF(last < 0.8 * first, "loss %.5f -> %.5f did not decrease", first, last);
    printf("  engine W=1 stage 0: loss %.5f -> %.5f\n", first, last);
    /* the engine destroys its compute stream; the model then waits for its
     * work through its own events (test_destroy) */
    zs_engine_destroy(e);
    zs_gpt_destroy(g);
    zs_coll_destroy(coll);
}
#endif

int main(int argc, char **argv)
{
    zs_err_t err;
#ifdef ZS_TEST_GPT_ENGINE
    /* the MPI collectives call MPI from their stream's thread */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    TEST_CHECK(provided >= MPI_THREAD_SERIALIZED);
#endif
    require_torch();
    TEST_OK(zs_dev_cpu_create(2, &dev, &err), err);
    TEST_OK(zs_dev_stream_create(dev, 0, "compute", &stream, &err), err);
    printf("test_gpt: 0. binding to the CPU device\n");
    test_bind();
    test_staging();
    test_destroy();
    printf("test_gpt: 1. finite differences through the model\n");
    test_fd();
    printf("test_gpt: 2. against PyTorch\n");
    zs_gpt_config_t wide = {2, 4, 64, 24, 96};
    test_torch("GPT-2 init", (zs_gpt_config_t){2, 2, 16, 8, 32}, 2, 8, 0.0f, 0);
    test_torch("perturbed, T < ctx", wide, 3, 17, 0.2f, 0);
    /* mixed precision (measured ratios: 2e5 / 3e4, 30 / 6, 3 / 2) */
    fixture_gemm_dt = ZS_DTYPE_BF16;
    test_torch("GPT-2 init", wide, 3, 17, 0.0f, 1000);
    test_torch("perturbed, T < ctx", wide, 3, 17, 0.2f, 3);
    fixture_gemm_dt = ZS_DTYPE_F16;
    test_torch("perturbed, T < ctx", wide, 3, 17, 0.2f, 1.4);
    fixture_gemm_dt = ZS_DTYPE_F32;
#ifdef ZS_TEST_GPT_ENGINE
    printf("test_gpt: 3. the engine at W=1\n");
    test_engine();
#else
    printf("test_gpt: 3. the engine at W=1: NOT BUILT (ZS_GPT_TEST_ENGINE=OFF)\n");
#endif
    zs_dev_stream_destroy(stream);
    zs_dev_destroy(dev);
#ifdef ZS_TEST_GPT_ENGINE
    MPI_Finalize();
#endif
    printf("test_gpt: OK\n");
    return 0;
}
