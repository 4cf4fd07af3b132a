/*
 * bench_engine.c - step time of the ZeRO engine split into forward,
 * backward, collectives and optimizer (in-process AdamW, or push + commit +
 * pull through shard servers with offload), on a dense stack of ~50M
 * parameters. An MPI program: bench/bench_engine.sh starts the servers and
 * runs it for W = 1, 2, offload off/on, and prints the comparison.
 *
 *   mpirun -np W bench_engine --servers a:p,b:p [--offload 0|1] [--stage S]
 *          [--layers 8] [--width 2500] [--batch 4] [--steps 6] [--dtype bf16]
 *          [--spec 0|1|2] [--stream 0|1] [--clip C] [--bucket ELEMENTS]
 *          [--transport auto|shm|tcp]
 *
 * --spec sets offload_optimizer.super_offload (speculative updates on the
 * servers; 2: also speculate_every_step, so every clipped step rolls back;
 * default: the config's default), --stream
 * offload_optimizer.stream_pulls (the next step's forward lands the pulls;
 * default: the config's, on), --clip gradient_clipping (0:
 * none), --bucket reduce_bucket_size (default 20M), --transport how the
 * offloaded bytes travel (zs_engine_opts_t.transport; default auto: shared
 * memory with a co-located server). bench/bench_spec.sh
 * runs the speculation comparison (worker and servers on separate cores).
 *
 * Prints one line "result ..." with medians over the steps after the first
 * (warm-up). Nothing is asserted.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_bench.h"
#include "zs_client.h"
#include "zs_engine.h"

#define MAXL 64

typedef struct {
    zs_model_t model;
    int L, n, B;
    size_t nparams[MAXL];
    float *act[MAXL + 1]; /* [B, n] each */
    float *dact, *dtmp;
    double loss;
    zs_stream_t *stream; /* the engine's compute stream (bind) */
    int64_t first;       /* sample of the loaded batch */
} stack_t;

/* Each callback enqueues its work on the compute stream as a host function
 * (the device interface's CPU path), so it runs in order with the engine's
 * collectives and copies. */
typedef struct {
    stack_t *s;
    int l, bwd;
    float dloss;
    float *p, *g;
    int64_t first;
} call_t;

static int run_forward(stack_t *s, int l, const float *p);
static int run_backward(stack_t *s, int l, const float *p, float *g, float dloss);

static int call_fn(void *args, zs_err_t *err)
{
    call_t *c = args;
    if (c->l < 0) { /* load the batch */
        for (int i = 0; i < c->s->B * c->s->n; i++)
            c->s->act[0][i] = (float)((c->first * 31 + i) % 17) / 17.0f - 0.5f;
        return ZS_OK;
    }
    return c->bwd ? run_backward(c->s, c->l, c->p, c->g, c->dloss) : run_forward(c->s, c->l, c->p);
}

static int bind(void *self, zs_dev_t *dev, zs_stream_t *compute, zs_err_t *err)
{
    ((stack_t *)self)->stream = compute;
    return ZS_OK;
}

static int init_params(void *self, int layer, float *p, zs_err_t *err)
{
    stack_t *s = self;
    float sc = 1.0f / sqrtf((float)s->n);
    for (size_t i = 0; i < s->nparams[layer]; i++)
        p[i] =
            sc * (float)((int)((i * 2654435761u + (unsigned)layer * 97u) % 2001) - 1000) / 1000.0f;
    return ZS_OK;
}

static int load_batch(void *self, const zs_batch_ctx_t *b, zs_err_t *err)
{
    stack_t *s = self;
    call_t c = {s, -1, 0, 0, NULL, NULL, zs_batch_sample(b, 0)};
    return zs_dev_host_fn(s->stream, call_fn, &c, sizeof c, err);
}

static int forward(void *self, int l, void *const *p, zs_err_t *err)
{
    stack_t *s = self;
    call_t c = {s, l, 0, 0, p[0], NULL, 0};
    return zs_dev_host_fn(s->stream, call_fn, &c, sizeof c, err);
}

static int backward(void *self, int l, void *const *p, float *const *g, float dloss, zs_err_t *err)
{
    stack_t *s = self;
    call_t c = {s, l, 1, dloss, p[0], g[0], 0};
    return zs_dev_host_fn(s->stream, call_fn, &c, sizeof c, err);
}

static int loss(void *self, double *out, zs_err_t *err)
{
    stack_t *s = self;
    int rc = zs_dev_stream_sync(s->stream, err);
    *out = s->loss;
    return rc;
}

/* y[B, n] = tanh(x[B, n] W[n, n] + bias) */
static int run_forward(stack_t *s, int l, const float *p)
{
    int n = s->n;
    const float *W = p, *bias = p + (size_t)n * n;
    for (int b = 0; b < s->B; b++) {
        float *y = s->act[l + 1] + (size_t)b * n;
        const float *x = s->act[l] + (size_t)b * n;
        memcpy(y, bias, (size_t)n * 4);
        for (int i = 0; i < n; i++) {
            float xi = x[i];
            const float *w = W + (size_t)i * n;
            for (int o = 0; o < n; o++)
                y[o] += xi * w[o];
        }
        for (int o = 0; o < n; o++)
            y[o] = tanhf(y[o]);
    }
    if (l == s->L - 1) {
        double loss = 0;
        for (int i = 0; i < s->B * n; i++)
            loss += 0.5 * (double)s->act[s->L][i] * s->act[s->L][i];
        s->loss = loss / s->B;
    }
    return ZS_OK;
}

static int run_backward(stack_t *s, int l, const float *p, float *g, float dloss)
{
    int n = s->n;
    const float *W = p;
    float *dW = g, *db = g + (size_t)n * n;
    if (l == s->L - 1)
        for (int i = 0; i < s->B * n; i++)
            s->dact[i] = dloss * s->act[s->L][i] / (float)s->B;
    for (int b = 0; b < s->B; b++) {
        float *dy = s->dact + (size_t)b * n, *dx = s->dtmp + (size_t)b * n;
        const float *y = s->act[l + 1] + (size_t)b * n, *x = s->act[l] + (size_t)b * n;
        for (int o = 0; o < n; o++) {
            dy[o] *= 1.0f - y[o] * y[o];
            db[o] += dy[o];
        }
        for (int i = 0; i < n; i++) {
            float xi = x[i], acc = 0;
            float *dw = dW + (size_t)i * n;
            const float *w = W + (size_t)i * n;
            for (int o = 0; o < n; o++) {
                dw[o] += xi * dy[o];
                acc += w[o] * dy[o];
            }
            dx[i] = acc;
        }
    }
    float *t = s->dact;
    s->dact = s->dtmp;
    s->dtmp = t;
    return ZS_OK;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    const char *servers = NULL, *dtype = "bf16";
    int offload = 0, stage = 2, L = 8, n = 2500, B = 4, steps = 6, spec = -1, stream = -1,
        transport = ZS_TRANSPORT_AUTO;
    double clip = 0;
    long bucket = 20000000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--servers"))
            servers = argv[i + 1];
        else if (!strcmp(argv[i], "--offload"))
            offload = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--stage"))
            stage = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers"))
            L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--width"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--spec"))
            spec = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--stream"))
            stream = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--clip"))
            clip = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--bucket"))
            bucket = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--transport") &&
                 (transport = zs_transport_parse(argv[i + 1])) < 0) {
            fprintf(stderr, "bench_engine: --transport %s: auto, shm or tcp\n", argv[i + 1]);
            return 2;
        }
    }
    if (L > MAXL || steps < 2 || steps > ZS_BENCH_MAX_REPS) {
        fprintf(stderr, "bench_engine: layers <= %d, 2 <= steps <= %d\n", MAXL, ZS_BENCH_MAX_REPS);
        return 2;
    }
    zs_err_t err;
    zs_dev_t *dev;
    zs_coll_t *coll;
    if (zs_dev_cpu_create(1, &dev, &err) || zs_coll_mpi_create(dev, &coll, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    stack_t *s = calloc(1, sizeof *s);
    s->L = L;
    s->n = n;
    s->B = B;
    for (int l = 0; l <= L; l++)
        s->act[l] = calloc((size_t)B * n, 4);
    s->dact = calloc((size_t)B * n, 4);
    s->dtmp = calloc((size_t)B * n, 4);
    for (int l = 0; l < L; l++)
        s->nparams[l] = (size_t)n * n + (size_t)n;
    s->model = (zs_model_t){s,    L,          s->nparams, NULL, init_params,
                            bind, load_batch, forward,    loss, backward};
    char json[768];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1,"
             " \"gradient_clipping\": %g,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}},"
             " \"bf16\": {\"enabled\": %s}, \"zero_optimization\": {\"stage\": %d,"
             " \"reduce_bucket_size\": %ld,"
             " \"offload_optimizer\": {\"device\": \"%s\"%s%s}}}",
             B, clip, strcmp(dtype, "bf16") ? "false" : "true", stage, bucket,
             offload ? "cpu" : "none",
             !offload || spec < 0 ? ""
             : spec == 2          ? ", \"super_offload\": true, \"speculate_every_step\": true"
             : spec               ? ", \"super_offload\": true"
                                  : ", \"super_offload\": false",
             !offload || stream < 0 ? ""
             : stream               ? ", \"stream_pulls\": true"
                                    : ", \"stream_pulls\": false");
    zs_config_t cfg;
    if (zs_config_parse(json, &cfg, NULL, NULL, &err) ||
        zs_config_resolve(&cfg, coll->size, &err)) {
        fprintf(stderr, "config: %s\n", err.msg);
        return 1;
    }
    zs_engine_opts_t eo = {&cfg, coll, offload ? servers : NULL, NULL, "bench-stack", 300000, 0};
    eo.transport = transport;
    zs_engine_t *e;
    if (zs_engine_create(&eo, &s->model, &e, &err) || zs_engine_start(e, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return 1;
    }
    double tot[ZS_BENCH_MAX_REPS], fw[ZS_BENCH_MAX_REPS], bw[ZS_BENCH_MAX_REPS],
        cm[ZS_BENCH_MAX_REPS], op[ZS_BENCH_MAX_REPS], opu[ZS_BENCH_MAX_REPS],
        oco[ZS_BENCH_MAX_REPS], opl[ZS_BENCH_MAX_REPS];
    int k = 0, kept = 0, rolled = 0;
    for (int i = 0; i < steps; i++) {
        zs_step_stats_t st;
        double t0 = zs_bench_now();
        if (zs_engine_step(e, &st, &err)) {
            fprintf(stderr, "step: %s\n", err.msg);
            return 1;
        }
        double t = (zs_bench_now() - t0) * 1e3;
        if (i == 0)
            continue; /* warm-up */
        tot[k] = t;
        fw[k] = st.ms_forward;
        bw[k] = st.ms_backward;
        cm[k] = st.ms_comm;
        op[k] = st.ms_optimizer;
        opu[k] = st.ms_opt_push;
        oco[k] = st.ms_opt_commit;
        opl[k] = st.ms_opt_pull;
        kept += st.spec > 0;
        rolled += st.spec < 0;
        k++;
    }
    if (coll->rank == 0)
        printf("result W=%d stage=%d offload=%d P=%llu step_ms=%.1f fwd=%.1f bwd=%.1f comm=%.1f "
               "opt=%.1f opt_push=%.1f opt_commit=%.1f opt_pull=%.1f kept=%d rolled=%d\n",
               coll->size, stage, offload, (unsigned long long)zs_engine_num_params(e),
               zs_bench_median(tot, k), zs_bench_median(fw, k), zs_bench_median(bw, k),
               zs_bench_median(cm, k), zs_bench_median(op, k), zs_bench_median(opu, k),
               zs_bench_median(oco, k), zs_bench_median(opl, k), kept, rolled);
    if (coll->rank == 0 && offload) {
        /* The servers' own view: the last commit pass (a whole AdamW over
         * the range without speculation; only what was left with it) and
         * the speculation counters. */
        zs_client_opts_t co = {servers, NULL, NULL, 20000, 0};
        zs_client_t *c = NULL;
        zs_server_info_t in[8];
        if (zs_client_create(&co, &c, &err) == ZS_OK && zs_client_nservers(c) <= 8 &&
            zs_client_hello(c, NULL, 0, in, &err) == ZS_OK) {
            double pass = 0;
            unsigned long long h = 0, r = 0;
            for (int i = 0; i < zs_client_nservers(c); i++) {
                pass = in[i].last_step_ms > pass ? in[i].last_step_ms : pass;
                h += in[i].spec_hits;
                r += in[i].spec_rollbacks;
            }
            printf("servers last_pass_ms=%.1f spec_hits=%llu spec_rollbacks=%llu\n", pass, h, r);
        }
        zs_client_destroy(c);
    }
    zs_engine_destroy(e);
    zs_coll_destroy(coll);
    zs_dev_destroy(dev);
    MPI_Finalize();
    return 0;
}
