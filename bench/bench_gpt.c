/*
 * bench_gpt.c - training throughput of the reference GPT model on CPU
 * (worker/model/zs_gpt.h), in tokens/s of a full train step, like llm.c's
 * train_gpt2.c: forward, zero the gradients, backward, fused AdamW on every
 * parameter (lr 1e-4, betas 0.9/0.999, eps 1e-8, no weight decay, as
 * train_gpt2.c calls gpt2_update).
 *
 * Two ways of running the step, each a table row:
 *   model + AdamW  single process, no engine, on the CPU device: the
 *                  model bound to one compute stream, its layer callbacks
 *                  on one flat fp32 parameter/gradient device buffer, then
 *                  zs_dev_adamw over it on the same stream (the device's
 *                  threads); the stream is waited for after forward,
 *                  backward and AdamW so the split is real;
 *   engine W=1     zs_engine_step at W = 1 (MPI initialised here, no
 *                  mpirun), stage 0, fp32, no servers: the same work plus
 *                  what the engine adds (gradient "all-reduce" over one
 *                  rank, global norm, bookkeeping).
 * Shapes: GPT-2 124M (L=12, NH=12, C=768, V=50257, T=64, B=4) and small
 * (L=4, NH=4, C=256, V=256, T=64, B=8). Threads: 2 (--threads N): the
 * model's pool and the CPU device's threads (AdamW); OpenBLAS
 * single-threaded inside the pool (zs_gpt_ops.h). Rates are per step; the
 * median of ZS_BENCH_REPS steps (default 7 for 124M, 20 for small) after
 * one warm-up step.
 *
 * The baseline column is QUOTED, not measured here: llm.c's train_gpt2.c
 * (gcc, OpenMP, 2 threads) measured on a machine like this one on
 * 2026-11-23 (commit f1e2ace, its Makefile's flags): 62.7 tokens/s on 124M and
 * 2,770 tokens/s on the small shape. The same-run ratio that matters for
 * the engine is printed last: engine W=1 / model + AdamW, per shape: the
 * two run side by side, their steps alternating, and the ratio is the median
 * of the per-step ratios (robust to load changes on a shared machine).
 *
 * Usage: bench_gpt [--shape 124m|small|both] [--threads N] [--no-engine]
 *        bench_gpt --device cuda [...]: the GPU benchmark (bench_gpt_cuda.c:
 *        GPT-2 124M and 1.5B at T = 1024, tokens/s and MFU; exit 77 with
 *        "SKIPPED: <reason>" where no GPU is usable)
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench_gpt_cuda.h"
#include "zs_adam.h"
#include "zs_bench.h"
#include "zs_engine.h"
#include "zs_gpt.h"
#include "zs_dev.h"

typedef struct {
    const char *name;
    zs_gpt_config_t c;
    int B, reps;
    double llmc_tok_s; /* quoted baseline */
} shape_t;

static void die(const char *what, const zs_err_t *err)
{
    fprintf(stderr, "bench_gpt: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static void make_tokens(const shape_t *s, int32_t *in, int32_t *tg)
{
    uint64_t x = 12345;
    int n = s->B * s->c.ctx;
    for (int i = 0; i <= n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t t = (int32_t)((x >> 33) % (uint64_t)s->c.vocab);
        if (i < n)
            in[i] = t;
        if (i > 0)
            tg[i - 1] = t;
    }
}

static void *dev_buf(zs_dev_t *dev, int cat, size_t bytes)
{
    zs_err_t err;
    void *p;
    if (zs_dev_alloc(dev, ZS_SPACE_DEVICE, cat, bytes, &p, &err))
        die("alloc", &err);
    return p;
}

static void wait_stream(zs_stream_t *s)
{
    zs_err_t err;
    if (zs_dev_stream_sync(s, &err))
        die("stream", &err);
}

/* Model + AdamW without the engine, on the CPU device: parameters,
 * gradients and Adam moments in device buffers, the model bound to one
 * compute stream, zs_dev_adamw over the whole buffer on the same stream.
 * The stream is waited for after each phase so the split is real. */
typedef struct bare {
    const shape_t *s;
    zs_dev_t *dev;
    zs_stream_t *cs;
    zs_gpt_t *g;
    const zs_model_t *m;
    size_t P, *off;
    float *w, *gr, *am, *av;
    int32_t *in, *tg;
    int t; /* Adam steps taken */
    double first, last;
} bare_t;

static void bare_setup(bare_t *b, const shape_t *s, int threads)
{
    zs_err_t err;
    const zs_gpt_config_t *c = &s->c;
    memset(b, 0, sizeof *b);
    b->s = s;
    if (zs_dev_cpu_create(threads, &b->dev, &err) ||
        zs_dev_stream_create(b->dev, 0, "compute", &b->cs, &err))
        die("device", &err);
    if (zs_gpt_create(c, s->B, 1, &b->g, &err) || zs_gpt_set_threads(b->g, threads, &err))
        die("create", &err);
    b->m = zs_gpt_model(b->g);
    b->P = (size_t)zs_gpt_num_params(c);
    int nl = b->m->nlayers;
    b->off = calloc((size_t)nl + 1, sizeof *b->off);
    float *hw = malloc(b->P * 4);
    b->in = malloc((size_t)s->B * c->ctx * 4), b->tg = malloc((size_t)s->B * c->ctx * 4);
    if (!b->off || !hw || !b->in || !b->tg)
        die("out of memory", NULL);
    for (int i = 0; i < nl; i++)
        b->off[i + 1] = b->off[i] + b->m->nparams[i];
    for (int i = 0; i < nl; i++)
        if (b->m->init_params(b->m->self, i, hw + b->off[i], &err))
            die("init", &err);
    if (b->m->bind(b->m->self, b->dev, b->cs, &err))
        die("bind", &err);
    size_t P = b->P;
    b->w = dev_buf(b->dev, ZS_MEM_PARAMS, P * 4), b->gr = dev_buf(b->dev, ZS_MEM_GRADS, P * 4);
    b->am = dev_buf(b->dev, ZS_MEM_OPTIMIZER, P * 4);
    b->av = dev_buf(b->dev, ZS_MEM_OPTIMIZER, P * 4);
    if (zs_dev_memcpy(b->cs, b->w, hw, P * 4, &err) ||
        zs_dev_memset(b->cs, b->am, 0, P * 4, &err) || zs_dev_memset(b->cs, b->av, 0, P * 4, &err))
        die("upload", &err);
    wait_stream(b->cs);
    free(hw);
    make_tokens(s, b->in, b->tg);
}

/* One step; returns tokens/s, ms[3] = forward, backward, AdamW. */
static double bare_step(bare_t *b, double ms[3])
{
    zs_err_t err;
    const zs_gpt_config_t *c = &b->s->c;
    const zs_model_t *m = b->m;
    int nl = m->nlayers;
    zs_adam_hparams_t hp = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1};
    double t0 = zs_bench_now();
    if (zs_gpt_set_tokens(b->g, b->in, b->tg, b->s->B, c->ctx, &err))
        die("tokens", &err);
    for (int i = 0; i < nl; i++) {
        void *p[2] = {b->w + b->off[i], b->w};
        if (m->forward(m->self, i, p, &err))
            die("forward", &err);
    }
    double loss;
    if (m->loss(m->self, &loss, &err)) /* waits for the forward */
        die("loss", &err);
    double t1 = zs_bench_now();
    if (zs_dev_memset(b->cs, b->gr, 0, b->P * 4, &err))
        die("zero grads", &err);
    for (int i = nl - 1; i >= 0; i--) {
        void *p[2] = {b->w + b->off[i], b->w};
        float *gp[2] = {b->gr + b->off[i], b->gr};
        if (m->backward(m->self, i, p, gp, 1.0f, &err))
            die("backward", &err);
    }
    wait_stream(b->cs);
    double t2 = zs_bench_now();
    zs_adam_step_t st = {hp.lr, ++b->t, 1.0f, 1.0f};
    if (zs_dev_adamw(b->cs, &hp, &st, b->w, b->am, b->av, b->gr, ZS_DTYPE_F32, NULL, ZS_DTYPE_NONE,
                     b->P, &err))
        die("adamw", &err);
    wait_stream(b->cs);
    double t3 = zs_bench_now();
    if (b->t == 1)
        b->first = loss;
    b->last = loss;
    ms[0] = 1e3 * (t1 - t0), ms[1] = 1e3 * (t2 - t1), ms[2] = 1e3 * (t3 - t2);
    return (double)b->s->B * c->ctx / (t3 - t0);
}

static void bare_teardown(bare_t *b)
{
    fprintf(stderr, "bench_gpt: %s model+AdamW: loss %.4f -> %.4f over %d steps\n", b->s->name,
            b->first, b->last, b->t);
    zs_gpt_destroy(b->g);
    zs_dev_free(b->dev, b->w), zs_dev_free(b->dev, b->gr);
    zs_dev_free(b->dev, b->am), zs_dev_free(b->dev, b->av);
    zs_dev_stream_destroy(b->cs);
    zs_dev_destroy(b->dev);
    free(b->off), free(b->in), free(b->tg);
}

/* The same step through the engine at W = 1, stage 0, fp32, no servers. */
typedef struct eng {
    const shape_t *s;
    zs_gpt_t *g;
    zs_engine_t *e;
    int32_t *in, *tg;
    int steps;
    double first, last;
} eng_t;

static void eng_setup(eng_t *x, const shape_t *s, int threads, zs_coll_t *coll)
{
    zs_err_t err;
    const zs_gpt_config_t *c = &s->c;
    memset(x, 0, sizeof *x);
    x->s = s;
    if (zs_gpt_create(c, s->B, 1, &x->g, &err) || zs_gpt_set_threads(x->g, threads, &err))
        die("create", &err);
    x->in = malloc((size_t)s->B * c->ctx * 4), x->tg = malloc((size_t)s->B * c->ctx * 4);
    if (!x->in || !x->tg)
        die("out of memory", NULL);
    make_tokens(s, x->in, x->tg);
    if (zs_gpt_set_fixed_tokens(x->g, x->in, x->tg, s->B, &err))
        die("tokens", &err);
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4,"
             " \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.0}},"
             " \"zero_optimization\": {\"stage\": 0}}",
             s->B, s->B);
    zs_config_t cfg;
    if (zs_config_parse(json, &cfg, NULL, NULL, &err) || zs_config_resolve(&cfg, 1, &err))
        die("config", &err);
    zs_engine_opts_t eo = {&cfg, coll, NULL, NULL, "bench-gpt", 0};
    if (zs_engine_create(&eo, zs_gpt_model(x->g), &x->e, &err) || zs_engine_start(x->e, &err))
        die("engine", &err);
}

/* One step; returns tokens/s, part[4] = forward, backward, comm, optimizer ms. */
static double eng_step(eng_t *x, double part[4])
{
    zs_err_t err;
    zs_step_stats_t st;
    double t0 = zs_bench_now();
    if (zs_engine_step(x->e, &st, &err))
        die("step", &err);
    double t1 = zs_bench_now();
    if (++x->steps == 1)
        x->first = st.loss;
    x->last = st.loss;
    part[0] = st.ms_forward, part[1] = st.ms_backward, part[2] = st.ms_comm;
    part[3] = st.ms_optimizer;
    return (double)x->s->B * x->s->c.ctx / (t1 - t0);
}

static void eng_teardown(eng_t *x)
{
    fprintf(stderr, "bench_gpt: %s engine: loss %.4f -> %.4f over %d steps\n", x->s->name, x->first,
            x->last, x->steps);
    zs_engine_destroy(x->e);
    zs_gpt_destroy(x->g);
    free(x->in), free(x->tg);
}

int main(int argc, char **argv)
{
    const char *which = "both";
    int threads = 2, engine = 1;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cuda"))
            return zs__bench_gpt_cuda(argc, argv);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            which = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-engine"))
            engine = 0;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cpu"))
            i++;
        else {
            fprintf(stderr, "usage: bench_gpt [--device cpu] [--shape 124m|small|both] "
                            "[--threads N] [--no-engine]\n"
                            "       bench_gpt --device cuda [--shape 124m|1.5b|both] "
                            "[--server-bin PATH] [--no-engine] [--peak-tflops F32,BF16]\n");
            return 2;
        }
    }
    int provided;
    /* the MPI collectives call MPI from their stream's thread */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "bench_gpt: MPI gives thread level %d, SERIALIZED needed\n", provided);
        return 1;
    }
    zs_err_t err;
    zs_dev_t *dev = NULL; /* the engine's CPU device (the bare path makes its own) */
    zs_coll_t *coll = NULL;
    if (engine && (zs_dev_cpu_create(threads, &dev, &err) || zs_coll_mpi_create(dev, &coll, &err)))
        die("collectives", &err);
    shape_t shapes[2] = {
        {"124M", {12, 12, 768, 64, 50257}, 4, zs_bench_reps(7), 62.7},
        {"small", {4, 4, 256, 64, 256}, 8, zs_bench_reps(20), 2770.0},
    };
    char title[160];
    snprintf(title, sizeof title,
             "GPT train step, %d threads, tokens/s (baseline: llm.c train_gpt2.c, QUOTED)",
             threads);
    zs_bench_header(title, "tokens/s");
    double split[2][3], ratio[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const shape_t *s = &shapes[k];
        if (strcmp(which, "both") && strcasecmp(which, s->name))
            continue;
        char size[96];
        snprintf(size, sizeof size, "L%d C%d V%d T%d B%d", s->c.layers, s->c.width, s->c.vocab,
                 s->c.ctx, s->B);
        double rb[ZS_BENCH_MAX_REPS], re[ZS_BENCH_MAX_REPS], rr[ZS_BENCH_MAX_REPS];
        double tf[ZS_BENCH_MAX_REPS], tb[ZS_BENCH_MAX_REPS], ta[ZS_BENCH_MAX_REPS];
        double ep[4][ZS_BENCH_MAX_REPS], ms[3], part[4], base = s->llmc_tok_s;
        bare_t b;
        eng_t x;
        bare_setup(&b, s, threads);
        if (engine)
            eng_setup(&x, s, threads, coll);
        /* one warm-up step each, then the two alternate step by step, so
         * both see the same load on a shared machine */
        bare_step(&b, ms);
        if (engine)
            eng_step(&x, part);
        for (int r = 0; r < s->reps; r++) {
            rb[r] = bare_step(&b, ms);
            tf[r] = ms[0], tb[r] = ms[1], ta[r] = ms[2];
            if (!engine)
                continue;
            re[r] = eng_step(&x, part);
            rr[r] = re[r] / rb[r];
            for (int q = 0; q < 4; q++)
                ep[q][r] = part[q];
        }
        split[k][0] = zs_bench_median(tf, s->reps);
        split[k][1] = zs_bench_median(tb, s->reps);
        split[k][2] = zs_bench_median(ta, s->reps);
        char name[96];
        snprintf(name, sizeof name, "%s model + AdamW (no engine)", s->name);
        zs_bench_row(name, size, rb, s->reps, &base, 1);
        bare_teardown(&b);
        if (engine) {
            snprintf(name, sizeof name, "%s engine W=1 stage 0", s->name);
            zs_bench_row(name, size, re, s->reps, &base, 1);
            ratio[k] = zs_bench_median(rr, s->reps);
            fprintf(stderr,
                    "bench_gpt: %s engine median ms forward %.1f backward %.1f comm %.1f "
                    "optimizer %.1f\n",
                    s->name, zs_bench_median(ep[0], s->reps), zs_bench_median(ep[1], s->reps),
                    zs_bench_median(ep[2], s->reps), zs_bench_median(ep[3], s->reps));
            eng_teardown(&x);
        }
    }
    printf("\nMedian step split (model + AdamW, ms): ");
    for (int k = 0; k < 2; k++)
        if (!strcmp(which, "both") || !strcasecmp(which, shapes[k].name))
            printf("%s forward %.1f, backward %.1f, AdamW %.1f; ", shapes[k].name, split[k][0],
                   split[k][1], split[k][2]);
    printf("\n");
    for (int k = 0; k < 2; k++)
        if (ratio[k] > 0)
            printf("Same run: %s engine W=1 stage 0 / model + AdamW = %.2fx tokens/s (median of "
                   "per-step ratios, steps alternating)\n",
                   shapes[k].name, ratio[k]);
    if (coll)
        zs_coll_destroy(coll);
    zs_dev_destroy(dev);
    MPI_Finalize();
    return 0;
}
