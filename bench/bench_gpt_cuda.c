/*
 * bench_gpt_cuda.c - bench_gpt --device cuda: training throughput of the
 * reference GPT on one GPU (the model over the CUDA op table,
 * worker/model/zs_gpt_ops_cuda.c), in tokens/s of a full train step and
 * model-FLOPs utilisation, for the GPT-2 124M and 1.5B shapes at T = 1024.
 *
 * Rows (one Markdown table, zs_bench.h):
 *   model + AdamW   no engine: the model bound to a compute stream of the
 *                   CUDA device, its layers on one flat fp32 parameter /
 *                   gradient buffer, zs_dev_adamw over all of it on the same
 *                   stream; the stream is waited for after forward (the
 *                   loss), backward and AdamW, so the split is real;
 *   engine stage 0  zs_engine_step at W = 1 on an NCCL communicator of one
 *                   rank, AdamW on the GPU (in-process optimizer);
 *   engine offload  stage 2 with the optimizer on 2 zs-server processes
 *                   this program starts on 127.0.0.1 (--server-bin, default
 *                   $ZS_SERVER_BIN or the build tree's): gradients pushed
 *                   from pinned memory, AdamW on the servers' CPUs,
 *                   parameters pulled back. Left out, saying so, when no
 *                   server binary is found or with --no-engine.
 * Offload options, for ZeRO-Offload's way of running (large batches):
 * --gas N (gradient_accumulation_steps of every engine row, default 1;
 * tokens/s counts the N micro-batches of a step), --transport auto|shm|tcp
 * (how the offload row reaches its servers; auto: shared memory with the
 * local servers), --spec 0|1 (offload_optimizer.super_offload, default 0),
 * --stream 0|1 (offload_optimizer.stream_pulls, default 1), --dpu N
 * (offload_optimizer.delayed_update_after: each update reaches the GPU one
 * step late from step N + 1 on, so the servers' AdamW overlaps the next
 * step; default -1, off; the rows say "dpu"). With both
 * engine rows it prints the offload row's tokens/s over the GPU AdamW row's
 * ("offload / GPU AdamW").
 * The micro-batch is the largest of a list (124M: 64, 32, ..., 1; 1.5B: 16,
 * 8, ..., 1; --batch N: N, N/2, ..., 1) whose allocations succeed (the
 * largest B that fits this GPU, reported in each row); every row of a shape
 * uses the model row's (the engine rows halve it while they run out of
 * memory). Medians of ZS_BENCH_REPS steps (default 5 for 124M, 3 for 1.5B)
 * after one warm-up step.
 *
 * Numbers: --gemm bf16 (the default), fp16 or fp32 (zs_gpt_set_compute):
 * with bf16 / fp16 every GEMM reads its operands rounded to 16 bits and
 * accumulates in fp32 on the tensor cores (kernels/zs_mixed.h), the engine
 * rows store parameters and gradients in that dtype too (the config's
 * bf16 / fp16 section), activations and everything else stay fp32 unless
 * --activations bf16|fp16 stores the saved activations in 16 bits
 * (zs_gpt_set_activations; with the GEMM dtype equal, the GEMMs read them
 * as stored). fp32 is
 * cuBLASLt CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no tensor cores). MFU is
 * against the peak of the GEMM precision (dense bf16/fp16 tensor or fp32).
 *
 * MFU = tokens/s x FLOPs per token / peak, FLOPs per token = 6 P + 6 L C T
 * (llm.c's estimate: the weight GEMMs forward and backward, plus causal
 * attention, half of PaLM's 12 L C T). Peaks by device name (dense, no
 * sparsity): H100 SXM / H200 66.9 fp32 and 989.4 bf16 TFLOP/s, H100 PCIe
 * 51.2 / 756.0, H100 NVL 60.0 / 835.0, A100 19.5 / 312.0; --peak-tflops
 * F32,BF16 overrides. The baseline measured in the same run is the GEMM rate
 * of the same cuBLASLt path at the same precision on a 4096^3 product
 * (16-bit operands filled with a constant non-zero pattern): the ceiling a
 * GEMM-bound step could reach on this GPU.
 *
 * Each row also prints one machine-readable line, for tests/gpu.sh's side by
 * side with llm.c:
 *   GPU-RESULT model=124m|1.5b impl=zs tokens_per_s=X mfu=Y batch=B case=C act=A
 * (C: model, engine0 or offload; mfu a fraction of the 16-bit peak, as
 * llm.c prints it; batch the micro-batch; A the saved activations' dtype,
 * --activations).
 *
 * Without a usable GPU, or built without CUDA/NCCL, it prints "SKIPPED:
 * <reason>" and returns 77.
 */
#include "bench_gpt_cuda.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zs_bench.h"
#include "zs_client.h"
#include "zs_dev.h"
#include "zs_engine.h"
#include "zs_gpt.h"

#if defined(ZS_WITH_CUDA) && defined(ZS_WITH_NCCL)
#include "zs_coll_nccl.h"
#include "zs_cuda_count.h"
#include "zs_cuda_gpt.h"
#include "zs_dev_cuda.h"

#ifndef ZS_SERVER_PATH
#define ZS_SERVER_PATH ""
#endif

typedef struct {
    const char *name;
    zs_gpt_config_t c;
    int batches[8]; /* tried in order, 0-terminated */
    int reps;
} cshape_t;

typedef struct {
    double f32, bf16; /* TFLOP/s, dense */
    const char *what;
} peak_t;

/* One row's figures. */
typedef struct {
    int ok, B;
    double rates[ZS_BENCH_MAX_REPS];
    double ms[7]; /* medians: forward, backward, comm (engine) or 0, optimizer; with
                   * offload: push wait, commit, pull wait (streamed: landing) */
    double held_peak;
    double loss0, loss1;
    zs_cuda_counts_t launches; /* of one timed step (model rows; zero: not counted) */
} row_t;

static int g_gemm = ZS_DTYPE_BF16;       /* --gemm: GEMM operand dtype */
static int g_attn = ZS_GPT_ATTN_UNFUSED; /* --attention: unfused | flash (zs_gpt_set_attention) */
static int g_act = ZS_DTYPE_F32;         /* --activations: saved activations' dtype */
static int g_gas = 1;                    /* --gas: micro-batches per step (engine rows) */
static int g_transport = ZS_TRANSPORT_AUTO, g_spec = 0, g_stream = 1; /* offload row */
static int g_dpu = -1;  /* offload row: delayed_update_after (-1: off) */
static int g_batch = 0; /* --batch: largest micro-batch tried (0: the shape's list) */
/* --shm-streams N[,N...]: one offload row per value of ZS_SHM_STREAMS (the
 * client's concurrent streams per server); none: the default, one row */
#define MAX_VARIANTS 4
static int g_streams[MAX_VARIANTS], g_nstreams;

static void fail(const char *what, const zs_err_t *err)
{
    fprintf(stderr, "bench_gpt: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static double flops_per_token(const zs_gpt_config_t *c)
{
    return 6.0 * (double)zs_gpt_num_params(c) +
           6.0 * (double)c->layers * (double)c->width * (double)c->ctx;
}

static peak_t peak_for(const char *desc)
{
    if (strstr(desc, "H100") && strstr(desc, "PCIe"))
        return (peak_t){51.2, 756.0, "H100 PCIe"};
    if (strstr(desc, "H100") && strstr(desc, "NVL"))
        return (peak_t){60.0, 835.0, "H100 NVL"};
    if (strstr(desc, "H100"))
        return (peak_t){66.9, 989.4, "H100 SXM"};
    if (strstr(desc, "H200"))
        return (peak_t){66.9, 989.4, "H200"};
    if (strstr(desc, "A100"))
        return (peak_t){19.5, 312.0, "A100"};
    return (peak_t){0, 0, "unknown GPU (give --peak-tflops F32,BF16)"};
}

static int sync_s(zs_stream_t *s, zs_err_t *err)
{
    return zs_dev_stream_sync(s, err);
}

/* ---- the fp32 GEMM baseline ---- */

/* TFLOP/s of an n^3 product at the --gemm precision (median of 10). */
static double gemm_tflops(zs_dev_t *dev, int n)
{
    zs_err_t err;
    zs_stream_t *s;
    void *a = NULL, *b = NULL, *c = NULL, *ws = NULL;
    size_t bytes = (size_t)n * n * sizeof(float), wsb = (size_t)32 << 20;
    int val = g_gemm == ZS_DTYPE_F32 ? 0 : 0x3c; /* 16-bit: 0x3c3c, about 0.0115 in bf16 */
    zs_cuda_blas_t blas;
    memset(&blas, 0, sizeof blas);
    if (zs_dev_stream_create(dev, 0, "gemm", &s, &err))
        fail("stream", &err);
    if (zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &a, &err) ||
        zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &b, &err) ||
        zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &c, &err) ||
        zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, wsb, &ws, &err) ||
        zs_dev_memset(s, a, val, bytes, &err) || zs_dev_memset(s, b, val, bytes, &err) ||
        zs_cuda_blas_init(&blas, ws, wsb, &err))
        fail("GEMM baseline set-up", &err);
    void *cs = zs__dev_cuda_stream_handle(s);
    double t[10];
    for (int r = -2; r < 10; r++) {
        double t0 = zs_bench_now();
        if (zs_cuda_gemm_typed(cs, &blas, g_gemm, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n,
                               &err) ||
            sync_s(s, &err))
            fail("GEMM baseline", &err);
        if (r >= 0)
            t[r] = zs_bench_now() - t0;
    }
    if (blas.non_pedantic)
        printf("note: the GEMM baseline ran with CUBLAS_COMPUTE_32F (no pedantic algorithm)\n");
    zs_cuda_blas_deinit(&blas);
    zs_dev_free(dev, a), zs_dev_free(dev, b), zs_dev_free(dev, c), zs_dev_free(dev, ws);
    zs_dev_stream_destroy(s);
    return 2.0 * n * (double)n * n / zs_bench_median(t, 10) / 1e12;
}

/* ---- model + AdamW, no engine ---- */

/* One try at micro-batch B. ZS_ERR_NOMEM (everything freed) means: try a
 * smaller B; other errors end the program. */
static int run_model(zs_dev_t *dev, const cshape_t *s, int B, const float *hw, row_t *row)
{
    zs_err_t err;
    const zs_gpt_config_t *c = &s->c;
    const zs_model_t *m;
    zs_stream_t *cs = NULL;
    zs_gpt_t *g = NULL;
    size_t P = (size_t)zs_gpt_num_params(c), n = (size_t)B * c->ctx;
    void *w = NULL, *gr = NULL, *am = NULL, *av = NULL;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    size_t *off = calloc((size_t)c->layers + 3, sizeof *off);
    int rc;
    if (!in || !tg || !off)
        fail("out of host memory", NULL);
    zs_dev_mem_reset_peak(dev);
    if ((rc = zs_dev_stream_create(dev, 0, "compute", &cs, &err)) ||
        (rc = zs_gpt_create(c, B, 1, &g, &err)) || (rc = zs_gpt_set_compute(g, g_gemm, &err)) ||
        (rc = zs_gpt_set_attention(g, g_attn, &err)) ||
        (rc = zs_gpt_set_activations(g, g_act, &err)))
        goto out;
    m = zs_gpt_model(g);
    for (int i = 0; i < m->nlayers; i++)
        off[i + 1] = off[i] + m->nparams[i];
    if ((rc = zs_gpt_bind(g, dev, cs, &err)) ||
        (rc = zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, P * 4, &w, &err)) ||
        (rc = zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_GRADS, P * 4, &gr, &err)) ||
        (rc = zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_OPTIMIZER, P * 4, &am, &err)) ||
        (rc = zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_OPTIMIZER, P * 4, &av, &err)))
        goto out;
    if ((rc = zs_dev_memcpy(cs, w, hw, P * 4, &err)) ||
        (rc = zs_dev_memset(cs, am, 0, P * 4, &err)) ||
        (rc = zs_dev_memset(cs, av, 0, P * 4, &err)) || (rc = sync_s(cs, &err)))
        goto out;
    zs_bench_tokens((int)n, c->vocab, in, tg);
    zs_adam_hparams_t hp = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1};
    double tf[ZS_BENCH_MAX_REPS], tb[ZS_BENCH_MAX_REPS], ta[ZS_BENCH_MAX_REPS];
    float *wf = w, *gf = gr;
    for (int r = -1; r < s->reps; r++) {
        double t0 = zs_bench_now(), loss;
        zs_cuda_counts_t k0 = zs_cuda_counts();
        if ((rc = zs_gpt_set_tokens(g, in, tg, B, c->ctx, &err)))
            goto out;
        for (int i = 0; i < m->nlayers; i++) {
            void *p[2] = {wf + off[i], wf};
            if ((rc = m->forward(m->self, i, p, &err)))
                goto out;
        }
        if ((rc = m->loss(m->self, &loss, &err))) /* waits for the forward */
            goto out;
        double t1 = zs_bench_now();
        if ((rc = zs_dev_memset(cs, gr, 0, P * 4, &err)))
            goto out;
        for (int i = m->nlayers - 1; i >= 0; i--) {
            void *p[2] = {wf + off[i], wf};
            float *gp[2] = {gf + off[i], gf};
            if ((rc = m->backward(m->self, i, p, gp, 1.0f, &err)))
                goto out;
        }
        if ((rc = sync_s(cs, &err)))
            goto out;
        double t2 = zs_bench_now();
        zs_adam_step_t st = {hp.lr, r + 2, 1.0f, 1.0f};
        if ((rc = zs_dev_adamw(cs, &hp, &st, w, am, av, gr, ZS_DTYPE_F32, NULL, ZS_DTYPE_NONE, P,
                               &err)) ||
            (rc = sync_s(cs, &err)))
            goto out;
        double t3 = zs_bench_now();
        if (r == 0) { /* one step's kernels and GEMMs (the same every step) */
            zs_cuda_counts_t k1 = zs_cuda_counts();
            row->launches.kernels = k1.kernels - k0.kernels;
            row->launches.gemms = k1.gemms - k0.gemms;
        }
        if (r < 0)
            row->loss0 = loss;
        row->loss1 = loss;
        if (r >= 0) {
            row->rates[r] = (double)n / (t3 - t0);
            tf[r] = 1e3 * (t1 - t0);
            tb[r] = 1e3 * (t2 - t1);
            ta[r] = 1e3 * (t3 - t2);
        }
    }
    row->ms[0] = zs_bench_median(tf, s->reps);
    row->ms[1] = zs_bench_median(tb, s->reps);
    row->ms[2] = 0;
    row->ms[3] = zs_bench_median(ta, s->reps);
    zs_dev_mem_t mem;
    zs_dev_mem_get(dev, &mem);
    row->held_peak = (double)mem.held_peak[ZS_SPACE_DEVICE];
    row->ok = 1;
    row->B = B;
out:
    if (g)
        zs_gpt_destroy(g); /* waits for its own work */
    if (cs && rc)
        sync_s(cs, NULL);
    zs_dev_free(dev, w), zs_dev_free(dev, gr), zs_dev_free(dev, am), zs_dev_free(dev, av);
    if (cs)
        zs_dev_stream_destroy(cs);
    free(in), free(tg), free(off);
    if (rc && rc != ZS_ERR_NOMEM)
        fail("model + AdamW", &err);
    if (rc)
        fprintf(stderr, "bench_gpt: %s at B=%d: out of GPU memory, trying less (%s)\n", s->name, B,
                err.msg);
    return rc;
}

/* ---- through the engine ---- */

/* One engine run at micro-batch B: stage 0 with AdamW on the GPU, or
 * stage 2 with the optimizer on `servers`. ZS_ERR_NOMEM: try a smaller B;
 * other failures are printed and returned (the other rows go on). */
static int run_engine(zs_coll_t *coll, const cshape_t *s, int B, const char *servers, row_t *row)
{
    zs_err_t err;
    const zs_gpt_config_t *c = &s->c;
    zs_gpt_t *g = NULL;
    zs_engine_t *e = NULL;
    size_t n = (size_t)B * c->ctx;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    int rc;
    if (!in || !tg)
        fail("out of host memory", NULL);
    zs_bench_tokens((int)n, c->vocab, in, tg);
    char json[960], off[224];
    snprintf(off, sizeof off,
             "\"device\": \"cpu\", \"super_offload\": %s, \"stream_pulls\": %s,"
             " \"delayed_update_after\": %d",
             g_spec ? "true" : "false", g_stream ? "true" : "false", g_dpu);
    snprintf(json, sizeof json,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d,"
             " \"gradient_accumulation_steps\": %d,%s"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4,"
             " \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.0}},"
             " \"zero_optimization\": {\"stage\": %d, \"offload_optimizer\": {%s}}}",
             B * g_gas, B, g_gas,
             g_gemm == ZS_DTYPE_BF16  ? " \"bf16\": {\"enabled\": true},"
             : g_gemm == ZS_DTYPE_F16 ? " \"fp16\": {\"enabled\": true},"
                                      : "",
             servers ? 2 : 0, servers ? off : "\"device\": \"none\"");
    zs_config_t cfg;
    if (zs_config_parse(json, &cfg, NULL, NULL, &err) || zs_config_resolve(&cfg, 1, &err))
        fail("config", &err);
    zs_dev_mem_reset_peak(coll->dev);
    if ((rc = zs_gpt_create(c, B, 1, &g, &err)) || (rc = zs_gpt_set_compute(g, g_gemm, &err)) ||
        (rc = zs_gpt_set_attention(g, g_attn, &err)) ||
        (rc = zs_gpt_set_activations(g, g_act, &err)) ||
        (rc = zs_gpt_set_fixed_tokens(g, in, tg, B, &err)))
        goto out;
    zs_engine_opts_t eo = {&cfg, coll, servers, NULL, "bench-gpt-cuda", 600000, 0};
    eo.transport = g_transport;
    if ((rc = zs_engine_create(&eo, zs_gpt_model(g), &e, &err)) || (rc = zs_engine_start(e, &err)))
        goto out;
    double part[7][ZS_BENCH_MAX_REPS];
    for (int r = -1; r < s->reps; r++) {
        zs_step_stats_t st;
        double t0 = zs_bench_now();
        if ((rc = zs_engine_step(e, &st, &err)))
            goto out;
        double t1 = zs_bench_now();
        if (r < 0)
            row->loss0 = st.loss;
        row->loss1 = st.loss;
        if (r >= 0) {
            row->rates[r] = (double)n * g_gas / (t1 - t0);
            part[0][r] = st.ms_forward;
            part[1][r] = st.ms_backward;
            part[2][r] = st.ms_comm;
            part[3][r] = st.ms_optimizer;
            part[4][r] = st.ms_opt_push;
            part[5][r] = st.ms_opt_commit;
            part[6][r] = st.ms_opt_pull;
        }
    }
    for (int k = 0; k < 7; k++)
        row->ms[k] = zs_bench_median(part[k], s->reps);
    zs_dev_mem_t mem;
    zs_dev_mem_get(coll->dev, &mem);
    row->held_peak = (double)mem.held_peak[ZS_SPACE_DEVICE];
    row->ok = 1;
    row->B = B;
out:
    zs_engine_destroy(e);
    zs_gpt_destroy(g);
    free(in), free(tg);
    if (rc == ZS_ERR_NOMEM)
        fprintf(stderr, "bench_gpt: %s engine at B=%d: out of GPU memory, trying less (%s)\n",
                s->name, B, err.msg);
    else if (rc)
        printf("note: %s engine (%s) at B=%d failed: %s\n", s->name,
               servers ? "optimizer on the servers" : "AdamW on the GPU", B, err.msg);
    return rc;
}

/* ---- two local shard servers ---- */

typedef struct {
    pid_t pid[2];
    char dir[64], list[160];
} servers_t;

/* Start 2 zs-server processes on 127.0.0.1 (free ports) with data under a
 * temp dir; 0 on success, else -1 with a reason printed. */
static int servers_start(const char *bin, servers_t *sv)
{
    memset(sv, 0, sizeof sv->pid);
    snprintf(sv->dir, sizeof sv->dir, "/tmp/zs-bench-gpt-XXXXXX");
    if (!bin || !*bin || access(bin, X_OK) != 0) {
        printf("note: no zs-server binary (%s): the offload rows are left out (give "
               "--server-bin)\n",
               bin && *bin ? bin : "none given");
        return -1;
    }
    if (!mkdtemp(sv->dir)) {
        printf("note: mkdtemp: %s: the offload rows are left out\n", strerror(errno));
        return -1;
    }
    char addr[2][64] = {"", ""};
    for (int i = 0; i < 2; i++) {
        char data[96], ready[96];
        snprintf(data, sizeof data, "%s/s%d", sv->dir, i);
        snprintf(ready, sizeof ready, "%s/r%d", sv->dir, i);
        pid_t p = fork();
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the benchmark */
            /* quiet unless asked (ZS_BENCH_SERVER_LOG=info: their totals at exit) */
            const char *lvl = getenv("ZS_BENCH_SERVER_LOG");
            setenv("ZS_LOG_LEVEL", lvl && *lvl ? lvl : "warn", 1);
            /* ZS_BENCH_SERVER_ARGS: more options, split at spaces (e.g.
             * "--spec-window 12G"); at most 8 */
            char *argv_[24] = {(char *)bin,    "--listen", "127.0.0.1:0", "--data", data,
                               "--ready-file", ready,      "--threads",   "8"};
            int na = 9;
            const char *more = getenv("ZS_BENCH_SERVER_ARGS");
            char *dup = more ? strdup(more) : NULL, *save = NULL;
            for (char *t = dup ? strtok_r(dup, " ", &save) : NULL; t && na < 17;
                 t = strtok_r(NULL, " ", &save))
                argv_[na++] = t;
            argv_[na] = NULL;
            execv(bin, argv_);
            _exit(127);
        }
        sv->pid[i] = p;
        for (int k = 0; k < 400 && !addr[i][0]; k++) { /* 20 s */
            FILE *f = fopen(ready, "r");
            if (f) {
                if (fgets(addr[i], sizeof addr[i], f))
                    addr[i][strcspn(addr[i], "\n")] = '\0';
                fclose(f);
            }
            if (!addr[i][0])
                usleep(50000);
        }
        if (!addr[i][0]) {
            printf("note: zs-server %d did not start: the offload rows are left out\n", i);
            return -1;
        }
    }
    snprintf(sv->list, sizeof sv->list, "%s,%s", addr[0], addr[1]);
    return 0;
}

static void servers_stop(servers_t *sv)
{
    for (int i = 0; i < 2; i++)
        if (sv->pid[i] > 0) {
            kill(sv->pid[i], SIGTERM);
            waitpid(sv->pid[i], NULL, 0);
            sv->pid[i] = 0;
        }
    if (sv->dir[0] && !strstr(sv->dir, "XXXXXX")) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", sv->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_gpt: could not remove %s\n", sv->dir);
    }
}

/* ---- output ---- */

static void print_row(const char *name, const cshape_t *s, int B, const row_t *row)
{
    char size[96];
    snprintf(size, sizeof size, "L%d C%d V%d T%d B%d", s->c.layers, s->c.width, s->c.vocab,
             s->c.ctx, B);
    zs_bench_row(name, size, row->rates, s->reps, NULL, 0);
}

static void print_mfu(const char *name, const cshape_t *s, const row_t *row, peak_t pk, double gemm)
{
    double tps = zs_bench_median(row->rates, s->reps);
    double tf = tps * flops_per_token(&s->c) / 1e12;
    printf("- %s: %.0f tokens/s x %.3g FLOP/token = %.2f TFLOP/s", name, tps,
           flops_per_token(&s->c), tf);
    double peak = g_gemm == ZS_DTYPE_F32 ? pk.f32 : pk.bf16;
    if (peak > 0)
        printf("; MFU %.1f%% of the %s %s peak %.1f", 100 * tf / peak, pk.what,
               g_gemm == ZS_DTYPE_F32 ? "fp32" : "dense 16-bit tensor", peak);
    else
        printf("; MFU n/a (%s)", pk.what);
    printf("; %.0f%% of the measured %s GEMM rate %.1f\n", 100 * tf / gemm, zs_dtype_name(g_gemm),
           gemm);
    printf("  median step split, ms: forward %.1f, backward %.1f, collectives %.1f, optimizer "
           "%.1f; device memory held (allocator peak) %.2f GiB; loss %.4f -> %.4f\n",
           row->ms[0], row->ms[1], row->ms[2], row->ms[3], row->held_peak / 1073741824.0,
           row->loss0, row->loss1);
    if (row->launches.kernels)
        printf("  launches per step: %llu kernels + %llu cuBLASLt matmuls\n",
               (unsigned long long)row->launches.kernels, (unsigned long long)row->launches.gemms);
    if (row->ms[4] + row->ms[5] + row->ms[6] > 0)
        printf("  offload split, ms: waiting for the pushes %.1f, commit %.1f, waiting for the "
               "pulls %.1f (streamed: inside forward)\n",
               row->ms[4], row->ms[5], row->ms[6]);
}

/* The dtype a --gemm or --activations value names (bf16, fp16 or fp32),
 * or -1. */
static int dtype_arg(const char *s)
{
    return !strcmp(s, "bf16")   ? ZS_DTYPE_BF16
           : !strcmp(s, "fp16") ? ZS_DTYPE_F16
           : !strcmp(s, "fp32") ? ZS_DTYPE_F32
                                : -1;
}

int zs__bench_gpt_cuda(int argc, char **argv)
{
    const char *which = "both", *server_bin = getenv("ZS_SERVER_BIN");
    int engine = 1;
    peak_t over = {0, 0, "--peak-tflops"};
    if (!server_bin || !*server_bin)
        server_bin = ZS_SERVER_PATH;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            i++;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            which = argv[++i];
        else if (!strcmp(argv[i], "--server-bin") && i + 1 < argc)
            server_bin = argv[++i];
        else if (!strcmp(argv[i], "--no-engine"))
            engine = 0;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc && atoi(argv[i + 1]) >= 1)
            g_batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gas") && i + 1 < argc && atoi(argv[i + 1]) >= 1)
            g_gas = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--transport") && i + 1 < argc &&
                 zs_transport_parse(argv[i + 1]) >= 0)
            g_transport = zs_transport_parse(argv[++i]);
        else if (!strcmp(argv[i], "--spec") && i + 1 < argc)
            g_spec = atoi(argv[++i]) != 0;
        else if (!strcmp(argv[i], "--stream") && i + 1 < argc)
            g_stream = atoi(argv[++i]) != 0;
        else if (!strcmp(argv[i], "--dpu") && i + 1 < argc && atoi(argv[i + 1]) >= -1)
            g_dpu = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shm-streams") && i + 1 < argc) {
            char *p = argv[++i];
            for (g_nstreams = 0; *p && g_nstreams < MAX_VARIANTS; g_nstreams++) {
                g_streams[g_nstreams] = (int)strtol(p, &p, 10);
                if (*p == ',')
                    p++;
            }
        } else if (!strcmp(argv[i], "--gemm") && i + 1 < argc && dtype_arg(argv[i + 1]) >= 0)
            g_gemm = dtype_arg(argv[++i]);
        else if (!strcmp(argv[i], "--activations") && i + 1 < argc && dtype_arg(argv[i + 1]) >= 0)
            g_act = dtype_arg(argv[++i]);
        else if (!strcmp(argv[i], "--attention") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "flash") || !strcmp(argv[i + 1], "unfused"))) {
            i++;
            g_attn = !strcmp(argv[i], "flash") ? ZS_GPT_ATTN_FLASH : ZS_GPT_ATTN_UNFUSED;
        } else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc &&
                   sscanf(argv[i + 1], "%lf,%lf", &over.f32, &over.bf16) == 2)
            i++;
        else {
            fprintf(stderr, "usage: bench_gpt --device cuda [--shape 124m|1.5b|both] "
                            "[--gemm bf16|fp16|fp32] [--activations fp32|bf16|fp16] "
                            "[--attention unfused|flash] "
                            "[--server-bin PATH] [--no-engine] "
                            "[--peak-tflops F32,BF16] [--gas N] [--transport auto|shm|tcp] "
                            "[--spec 0|1] [--stream 0|1] [--dpu N] [--batch N] "
                            "[--shm-streams N,N,...]\n");
            return 2;
        }
    }
    char why[200];
    if (!zs_dev_cuda_available(why, sizeof why)) {
        printf("SKIPPED: %s\n", why);
        return 77;
    }
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    zs_err_t err;
    zs_dev_t *dev;
    zs_coll_t *coll = NULL;
    if (zs_dev_cuda_create(0, &dev, &err))
        fail("CUDA device", &err);
    if (engine && zs_coll_nccl_create(dev, 0, &coll, &err))
        fail("NCCL", &err);
    peak_t pk = over.f32 > 0 ? over : peak_for(dev->desc);
    cshape_t shapes[2] = {
        {"124M", {12, 12, 768, 1024, 50257}, {64, 32, 16, 8, 4, 2, 1, 0}, zs_bench_reps(5)},
        {"1.5B", {48, 25, 1600, 1024, 50257}, {16, 8, 4, 2, 1, 0}, zs_bench_reps(3)},
    };
    if (g_batch) /* N, N/2, ..., 1 (at most 7 entries before the 0) */
        for (int k = 0; k < 2; k++) {
            int n = 0;
            for (int b = g_batch; b >= 1 && n < 7; b /= 2)
                shapes[k].batches[n++] = b;
            shapes[k].batches[n] = 0;
        }
    servers_t sv;
    memset(&sv, 0, sizeof sv);
    int have_servers = engine && servers_start(server_bin, &sv) == 0;
    double gemm = gemm_tflops(dev, 4096);
    char title[300];
    snprintf(title, sizeof title,
             "GPT train step on %s, %s GEMM operands (fp32 accumulation), %s saved "
             "activations, tokens/s; baseline: %s GEMM %.1f TFLOP/s measured in this run",
             dev->desc, zs_dtype_name(g_gemm), zs_dtype_name(g_act), zs_dtype_name(g_gemm), gemm);
    zs_bench_header(title, "tokens/s");
    int nvar = g_nstreams ? g_nstreams : 1; /* offload rows: modes 2 .. 1 + nvar */
    row_t rows[2][2 + MAX_VARIANTS];
    memset(rows, 0, sizeof rows);
    for (int k = 0; k < 2; k++) {
        const cshape_t *s = &shapes[k];
        if (strcmp(which, "both") && strcasecmp(which, s->name))
            continue;
        size_t P = (size_t)zs_gpt_num_params(&s->c);
        float *hw = malloc(P * sizeof *hw);
        zs_gpt_t *g0;
        if (!hw || zs_gpt_create(&s->c, 1, 1, &g0, &err))
            fail("host weights", hw ? &err : NULL);
        const zs_model_t *m0 = zs_gpt_model(g0);
        size_t o = 0;
        for (int i = 0; i < m0->nlayers; i++) {
            if (m0->init_params(m0->self, i, hw + o, &err))
                fail("init", &err);
            o += m0->nparams[i];
        }
        zs_gpt_destroy(g0);
        int B = 0;
        for (int bi = 0; s->batches[bi]; bi++)
            if (run_model(dev, s, s->batches[bi], hw, &rows[k][0]) == ZS_OK) {
                B = s->batches[bi];
                break;
            }
        free(hw);
        if (!B) {
            printf("| %s model + AdamW | - | does not fit at B=1 | - | - | - |\n", s->name);
            continue;
        }
        char name[96];
        snprintf(name, sizeof name, "%s model + AdamW on the GPU (no engine)", s->name);
        print_row(name, s, B, &rows[k][0]);
        for (int mode = 1; mode <= 1 + nvar && engine; mode++) {
            if (mode >= 2 && !have_servers)
                break;
            char sstr[48] = "";
            if (mode >= 2 && g_nstreams) {
                char v[16];
                snprintf(v, sizeof v, "%d", g_streams[mode - 2]);
                setenv("ZS_SHM_STREAMS", v, 1);
                snprintf(sstr, sizeof sstr, ", %d shm streams", g_streams[mode - 2]);
            }
            int b = B, rc = ZS_ERR_NOMEM;
            while (b >= 1 && (rc = run_engine(coll, s, b, mode >= 2 ? sv.list : NULL,
                                              &rows[k][mode])) == ZS_ERR_NOMEM)
                b /= 2;
            if (mode == 1)
                snprintf(name, sizeof name, "%s engine W=1 stage 0, AdamW on the GPU, gas %d",
                         s->name, g_gas);
            else
                snprintf(name, sizeof name,
                         "%s engine W=1 stage 2, AdamW on 2 servers (%s%s), gas %d, spec %d%s",
                         s->name, zs_transport_name(g_transport), sstr, g_gas, g_spec,
                         g_dpu >= 0 ? ", dpu" : "");
            if (rc == ZS_OK)
                print_row(name, s, b, &rows[k][mode]);
            else
                printf("| %s | - | %s | - | - | - |\n", name,
                       rc == ZS_ERR_NOMEM ? "does not fit at B=1" : "failed (see the note)");
        }
    }
    printf("\nModel FLOPs utilisation (FLOPs per token 6P + 6LCT, llm.c's estimate; %s):\n",
           g_gemm == ZS_DTYPE_F32 ? "fp32 pedantic GEMMs: no TF32, no tensor cores"
                                  : "16-bit GEMM operands on the tensor cores, fp32 accumulation");
    static const char *mode_name[3] = {"model + AdamW", "engine stage 0 (AdamW on the GPU)",
                                       "engine stage 2 (AdamW on 2 servers: optimizer = "
                                       "commit, the servers' AdamW and the pull)"};
    char var[MAX_VARIANTS][32];
    for (int v = 0; v < nvar; v++)
        snprintf(var[v], sizeof var[v], g_nstreams ? "-s%d" : "", g_streams[v]);
    for (int k = 0; k < 2; k++)
        for (int mode = 0; mode < 2 + nvar; mode++)
            if (rows[k][mode].ok) {
                char name[192];
                snprintf(name, sizeof name, "%s %s%s%s (B=%d)", shapes[k].name,
                         mode_name[mode < 2 ? mode : 2], mode < 2 || !g_nstreams ? "" : ", streams",
                         mode < 2 ? "" : var[mode - 2], rows[k][mode].B);
                print_mfu(name, &shapes[k], &rows[k][mode], pk, gemm);
            }
    const char *case_name[3] = {"model", "engine0", g_dpu >= 0 ? "offload-dpu" : "offload"};
    for (int k = 0; k < 2; k++)
        for (int mode = 0; mode < 2 + nvar; mode++)
            if (rows[k][mode].ok) {
                double tps = zs_bench_median(rows[k][mode].rates, shapes[k].reps);
                double peak = g_gemm == ZS_DTYPE_F32 ? pk.f32 : pk.bf16;
                printf("GPU-RESULT model=%s impl=zs tokens_per_s=%.0f mfu=%.4f batch=%d case=%s%s "
                       "act=%s\n",
                       k ? "1.5b" : "124m", tps,
                       peak > 0 ? tps * flops_per_token(&shapes[k].c) / 1e12 / peak : 0.0,
                       rows[k][mode].B, case_name[mode < 2 ? mode : 2],
                       mode < 2 ? "" : var[mode - 2], zs_dtype_name(g_act));
            }
    for (int k = 0; k < 2; k++)
        for (int v = 0; v < nvar; v++)
            if (rows[k][1].ok && rows[k][2 + v].ok)
                printf("%s offload%s / GPU AdamW (gas %d, transport %s): %.3f of the tokens/s\n",
                       shapes[k].name, var[v], g_gas, zs_transport_name(g_transport),
                       zs_bench_median(rows[k][2 + v].rates, shapes[k].reps) /
                           zs_bench_median(rows[k][1].rates, shapes[k].reps));
    printf("\nNot measured here: more than one GPU%s.\n",
           g_act == ZS_DTYPE_F32 ? "; 16-bit activations (--activations bf16)" : "");
    if (have_servers || sv.pid[0])
        servers_stop(&sv);
    zs_coll_destroy(coll);
    zs_dev_destroy(dev);
    MPI_Finalize();
    return 0;
}

#else /* no CUDA or no NCCL in this build */

int zs__bench_gpt_cuda(int argc, char **argv)
{
    (void)argc, (void)argv;
#ifdef ZS_WITH_CUDA
    printf("SKIPPED: bench_gpt was built without NCCL (nccl.h/libnccl not found at configure)\n");
#else
    printf("SKIPPED: bench_gpt was built without CUDA (nvcc not found at configure)\n");
#endif
    return 77;
}

#endif
