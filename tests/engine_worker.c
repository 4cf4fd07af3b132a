/*
 * engine_worker.c - an MPI program that trains the test model (zs_mlp.h)
 * with the ZeRO engine under a configuration given by flags; test_engine.c
 * runs it under mpirun with different stages, world sizes, dtypes and
 * offload settings. Not a test by itself.
 *
 * Rank 0 can also compute the single-process reference (--ref): the same
 * model and global batches, gradients summed over the whole global batch in
 * double, then fp32 AdamW (zs_adam_update_ref) - no buckets, partitions or
 * collectives - and compares the engine's final parameters with it.
 *
 * Output (rank 0): one "stat step=.. loss=.. scale=.. skipped=.. lr=.. norm=.."
 * line per step (and every rank a "bytes rank=.. step=.." line: its
 * collectives' bytes within and across nodes), "mem ..." lines, "maxerr ..." with --ref; --out
 * writes the final fp32 parameters. --transport auto|shm|tcp: how the offloaded gradients and
 * parameters reach the servers (zs_engine_opts_t.transport).
 * --mics G [--mics-hier 1]: MiCS (mics_shard_size, its hierarchical gather);
 * --qwz/--hpz/--qgz: the ZeRO++ keys (to see them refused beside MiCS).
 * --dpu N: offload_optimizer.delayed_update_after (the delayed parameter
 * update after step N; the reference follows it).
 */
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs_cast.h"
#include "zs_client.h"
#include "zs_engine.h"
#include "zs_mlp.h"
#include "zs_sched.h"

typedef struct {
    int stage, offload, steps, ckpt_every, resume, kill_at, kill_rank, gas, ref, mem_check;
    int64_t inject_nan, resume_step;
    const char *dtype, *servers, *out;
    double clip, atol, rtol;
    int timeout_ms, bucket, inject_count, persist, offload_param;
    int64_t live, prefetch, reuse; /* stage 3 budgets (elements) */
    unsigned debug;                /* ZS_ENGINE_DEBUG_* */
    int rss_check;                 /* fail if RSS grows after step 5 */
    int spec;   /* super_offload: 0/1, 2: with speculate_every_step; -1: the config's default */
    int stream; /* stream_pulls: 0/1; -1: the config's default */
    int spec_report;   /* rank 0 prints the servers' speculation counters */
    int transport;     /* zs_transport_t of --transport auto|shm|tcp (default auto) */
    int mics;          /* mics_shard_size (-1: off, the default) */
    int mics_hier;     /* mics_hierarchical_params_gather */
    int qwz, hpz, qgz; /* ZeRO++ keys (test_mics's refusals) */
    int dpu;           /* offload_optimizer.delayed_update_after (-1: left out) */
} args_t;

static void fail(int rank, const char *what, const zs_err_t *err)
{
    fprintf(stderr, "FAIL rank %d: %s: %s\n", rank, what, err ? err->msg : "");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static void parse(int argc, char **argv, args_t *a)
{
    memset(a, 0, sizeof *a);
    a->steps = 10;
    a->gas = 2;
    a->dtype = "fp32";
    a->kill_rank = 1;
    a->atol = 1e-5;
    a->rtol = 1e-4;
    a->timeout_ms = 60000;
    a->bucket = 2000;
    a->live = 1000000000;
    a->prefetch = 4000;
    a->reuse = 1000000000;
    a->spec = -1;
    a->stream = -1;
    a->mics = -1;
    a->hpz = 1;
    a->dpu = -1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
#define OPT(name) (!strcmp(k, name) && ++i)
        if (OPT("--stage"))
            a->stage = atoi(v);
        else if (OPT("--offload"))
            a->offload = atoi(v);
        else if (OPT("--dtype"))
            a->dtype = v;
        else if (OPT("--steps"))
            a->steps = atoi(v);
        else if (OPT("--servers"))
            a->servers = v;
        else if (OPT("--ckpt-every"))
            a->ckpt_every = atoi(v);
        else if (OPT("--kill-at"))
            a->kill_at = atoi(v);
        else if (OPT("--kill-rank"))
            a->kill_rank = atoi(v);
        else if (OPT("--gas"))
            a->gas = atoi(v);
        else if (OPT("--out"))
            a->out = v;
        else if (OPT("--inject-nan"))
            a->inject_nan = atoll(v);
        else if (OPT("--resume-step"))
            a->resume_step = atoll(v);
        else if (OPT("--inject-count"))
            a->inject_count = atoi(v);
        else if (OPT("--persist"))
            a->persist = atoi(v);
        else if (OPT("--offload-param"))
            a->offload_param = atoi(v);
        else if (OPT("--clip"))
            a->clip = atof(v);
        else if (OPT("--atol"))
            a->atol = atof(v);
        else if (OPT("--rtol"))
            a->rtol = atof(v);
        else if (OPT("--timeout-ms"))
            a->timeout_ms = atoi(v);
        else if (OPT("--bucket"))
            a->bucket = atoi(v);
        else if (OPT("--live"))
            a->live = atoll(v);
        else if (OPT("--prefetch"))
            a->prefetch = atoll(v);
        else if (OPT("--reuse"))
            a->reuse = atoll(v);
        else if (OPT("--debug"))
            a->debug = (unsigned)atoi(v);
        else if (OPT("--spec"))
            a->spec = atoi(v);
        else if (OPT("--stream"))
            a->stream = atoi(v);
        else if (OPT("--mics"))
            a->mics = atoi(v);
        else if (OPT("--mics-hier"))
            a->mics_hier = atoi(v);
        else if (OPT("--qwz"))
            a->qwz = atoi(v);
        else if (OPT("--hpz"))
            a->hpz = atoi(v);
        else if (OPT("--qgz"))
            a->qgz = atoi(v);
        else if (OPT("--dpu"))
            a->dpu = atoi(v);
        else if (OPT("--transport")) {
            a->transport = zs_transport_parse(v);
            if (a->transport < 0) {
                fprintf(stderr, "engine_worker: --transport %s: auto, shm or tcp\n", v);
                exit(2);
            }
        } else if (!strcmp(k, "--spec-report"))
            a->spec_report = 1;
        else if (!strcmp(k, "--rss-check"))
            a->rss_check = 1;
        else if (!strcmp(k, "--resume"))
            a->resume = 1;
        else if (!strcmp(k, "--ref"))
            a->ref = 1;
        else if (!strcmp(k, "--mem-check"))
            a->mem_check = 1;
        else {
            fprintf(stderr, "engine_worker: unknown flag %s\n", k);
            exit(2);
        }
#undef OPT
    }
}

/* DeepSpeed JSON for these flags (the engine reads it like a user's file). */
static void make_config(const args_t *a, int W, zs_config_t *cfg)
{
    char json[2048], dpu[64] = "";
    int f16 = !strcmp(a->dtype, "fp16"), b16 = !strcmp(a->dtype, "bf16");
    if (a->dpu >= 0)
        snprintf(dpu, sizeof dpu, ", \"delayed_update_after\": %d", a->dpu);
    snprintf(json, sizeof json,
             "{\"train_batch_size\": 16, \"gradient_accumulation_steps\": %d,"
             " \"gradient_clipping\": %g,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.002,"
             "   \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.01}},"
             " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,"
             "   \"warmup_max_lr\": 0.002, \"warmup_num_steps\": 5, \"warmup_type\": \"linear\"}},"
             " \"fp16\": {\"enabled\": %s, \"initial_scale_power\": 10, \"loss_scale_window\": 4,"
             "   \"hysteresis\": 2, \"min_loss_scale\": 1},"
             " \"bf16\": {\"enabled\": %s},"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %d,"
             "   \"stage3_param_persistence_threshold\": %d,"
             "   \"stage3_prefetch_bucket_size\": %lld, \"stage3_max_live_parameters\": %lld,"
             "   \"stage3_max_reuse_distance\": %lld,"
             "   \"mics_shard_size\": %d, \"mics_hierarchical_params_gather\": %s,"
             "   \"zero_quantized_weights\": %s, \"zero_hpz_partition_size\": %d,"
             "   \"zero_quantized_gradients\": %s,"
             "   \"offload_param\": {\"device\": \"%s\"},"
             "   \"offload_optimizer\": {\"device\": \"%s\"%s%s%s}}}",
             a->gas, a->clip, f16 ? "true" : "false", b16 ? "true" : "false", a->stage, a->bucket,
             a->persist, (long long)a->prefetch, (long long)a->live, (long long)a->reuse, a->mics,
             a->mics_hier ? "true" : "false", a->qwz ? "true" : "false", a->hpz,
             a->qgz ? "true" : "false", a->offload_param ? "cpu" : "none",
             a->offload ? "cpu" : "none",
             a->spec < 0    ? ""
             : a->spec == 2 ? ", \"super_offload\": true, \"speculate_every_step\": true"
             : a->spec > 0  ? ", \"super_offload\": true"
                            : ", \"super_offload\": false",
             a->stream < 0   ? ""
             : a->stream > 0 ? ", \"stream_pulls\": true"
                             : ", \"stream_pulls\": false",
             dpu);
    zs_err_t err;
    zs_config_defaults(cfg);
    if (zs_config_parse(json, cfg, NULL, NULL, &err) || zs_config_resolve(cfg, W, &err))
        fail(0, "config", &err);
}

/* The servers' counters summed: speculation hits, rollbacks, elements;
 * bytes received (with --transport tcp: the pushed gradients among them). */
static void spec_counters(const char *servers, uint64_t out[4])
{
    zs_client_opts_t o = {servers, NULL, NULL, 20000, 0};
    zs_client_t *c;
    zs_err_t err;
    zs_server_info_t info[8];
    if (zs_client_create(&o, &c, &err))
        fail(0, "spec report client", &err);
    int n = zs_client_nservers(c);
    if (n > 8 || zs_client_hello(c, NULL, 0, info, &err))
        fail(0, "spec report hello", &err);
    out[0] = out[1] = out[2] = out[3] = 0;
    for (int i = 0; i < n; i++) {
        out[0] += info[i].spec_hits;
        out[1] += info[i].spec_rollbacks;
        out[2] += info[i].spec_elements;
        out[3] += info[i].bytes_in;
    }
    zs_client_destroy(c);
}

/* Measured peak of category c over every space (the allocator's table). */
static uint64_t zs__peak_cat(const zs_engine_mem_t *mm, int c)
{
    uint64_t n = 0;
    for (int sp = 0; sp < ZS_NSPACES; sp++)
        n += mm->measured.peak[sp][c];
    return n;
}

#define MAX_STEPS 256

/* Single-process reference: returns final fp32 params (P floats) and the
 * global gradient norm of every step in norms[1..steps]. With --dpu N (the
 * delayed parameter update) step s computes at the parameters of step s - 2
 * when the update of step s - 1 was delayed (s - 1 > N) and no checkpoint
 * (--ckpt-every) flushed it; else at those of step s - 1. */
static float *reference(const args_t *a, const zs_config_t *cfg, uint64_t P, double *norms)
{
    zs_mlp_t *m = malloc(sizeof *m);
    zs_mlp_init(m);
    float *master = malloc(P * 4), *mm = calloc(P, 4), *vv = calloc(P, 4), *w = malloc(P * 4);
    float *g32 = malloc(P * 4), *prev = malloc(P * 4); /* prev: master before the last update */
    double *g = malloc(P * sizeof *g);
    uint64_t off[4] = {0};
    for (int i = 1; i < 4; i++)
        off[i] = off[i - 1] + m->nparams[i - 1];
    zs_err_t err;
    for (int i = 0; i < 3; i++)
        m->model.init_params(m, i, master + off[i], &err);
    zs_dtype_t dt = !strcmp(a->dtype, "bf16")   ? ZS_DTYPE_BF16
                    : !strcmp(a->dtype, "fp16") ? ZS_DTYPE_F16
                                                : ZS_DTYPE_F32;
    int64_t tbs = cfg->train_batch_size, chunk = 4, t = 0;
    for (int s = 1; s <= a->steps; s++) {
        /* compute with the parameters as the workers hold them */
        int late =
            a->dpu >= 0 && s - 1 > a->dpu && !(a->ckpt_every && (s - 1) % a->ckpt_every == 0);
        zs_cast(w, dt, late ? prev : master, ZS_DTYPE_F32, P); /* round trip through dt */
        zs_cast(g32, ZS_DTYPE_F32, w, dt, P);
        memcpy(w, g32, P * 4);
        memset(g, 0, P * sizeof *g);
        for (int64_t first = (s - 1) * tbs; first < s * tbs; first += chunk) {
            zs_mlp_load_samples(m, first, (int)chunk);
            float *p[2];
            for (int i = 0; i < 4; i++) {
                p[0] = w + off[i];
                p[1] = w;
                zs_mlp_forward_host(m, i, p, &err);
            }
            memset(g32, 0, P * 4);
            float *gp[2];
            for (int i = 3; i >= 0; i--) {
                p[0] = w + off[i];
                p[1] = w;
                gp[0] = g32 + off[i];
                gp[1] = g32;
                zs_mlp_backward_host(m, i, p, gp, 1.0f, &err);
            }
            for (uint64_t j = 0; j < P; j++)
                g[j] += (double)g32[j] * chunk / tbs;
        }
        double ss = 0;
        for (uint64_t j = 0; j < P; j++) {
            g32[j] = (float)g[j];
            ss += g[j] * g[j];
        }
        double norm = sqrt(ss);
        if (s < MAX_STEPS)
            norms[s] = norm;
        float coef =
            a->clip > 0 && a->clip / (norm + 1e-6) < 1 ? (float)(a->clip / (norm + 1e-6)) : 1.0f;
        double lr = zs_sched_lr(&cfg->sched, cfg->adam.lr, t);
        zs_adam_step_t st = {(float)lr, ++t, 1.0f, coef};
        memcpy(prev, master, P * 4);
        zs_adam_update_ref(&cfg->adam, &st, master, mm, vv, g32, ZS_DTYPE_F32, NULL, ZS_DTYPE_NONE,
                           P);
    }
    free(mm);
    free(vv);
    free(w);
    free(g32);
    free(prev);
    free(g);
    free(m);
    return master;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    args_t a;
    parse(argc, argv, &a);
    zs_err_t err;
    zs_dev_t *dev;
    if (zs_dev_cpu_create(1, &dev, &err))
        fail(-1, "device", &err);
    zs_coll_t *coll;
    if (zs_coll_mpi_create(dev, &coll, &err))
        fail(-1, "collectives", &err);
    int rank = coll->rank, W = coll->size;
    zs_config_t cfg;
    make_config(&a, W, &cfg);
    zs_mlp_t *m = malloc(sizeof *m);
    zs_mlp_init(m);
    m->inject_nan_step = a.inject_nan;
    m->inject_nan_count = a.inject_count ? a.inject_count : 1;
    m->inject_rank = 0;
    zs_engine_opts_t eo = {&cfg, coll, a.servers, NULL, "mlp-test", a.timeout_ms, a.debug};
    eo.transport = a.transport;
    zs_engine_t *e;
    if (zs_engine_create(&eo, &m->model, &e, &err))
        fail(rank, "engine create", &err);
    uint64_t P = zs_engine_num_params(e), rss5 = 0, held5 = 0;
    double norms[MAX_STEPS] = {0}, ref_norms[MAX_STEPS] = {0};
    if (a.ref && a.steps >= MAX_STEPS)
        fail(rank, "--ref needs --steps below 256", NULL);
    if (a.resume) {
        uint64_t at;
        if (zs_engine_resume(e, (uint64_t)a.resume_step, &at, &err))
            fail(rank, "resume", &err);
        if (rank == 0)
            printf("resumed at step %llu\n", (unsigned long long)at);
    } else if (zs_engine_start(e, &err)) {
        fail(rank, "start", &err);
    }
    uint64_t spec0[4] = {0};
    if (rank == 0 && a.spec_report)
        spec_counters(a.servers, spec0);
    while (zs_engine_step_count(e) < (uint64_t)a.steps) {
        uint64_t next = zs_engine_step_count(e) + 1;
        if (a.kill_at && (int)next == a.kill_at && rank == a.kill_rank) {
            fflush(NULL);
            raise(SIGKILL); /* a worker dies mid-run */
        }
        zs_step_stats_t st;
        if (zs_engine_step(e, &st, &err))
            fail(rank, "step", &err);
        if (st.step < MAX_STEPS)
            norms[st.step] = st.grad_norm;
        if (rank == 0)
            printf("stat step=%llu loss=%.7f scale=%g skipped=%d lr=%.6g norm=%.6g spec=%d\n",
                   (unsigned long long)st.step, st.loss, st.loss_scale, st.skipped, st.lr,
                   st.grad_norm, st.spec);
        /* this rank's collectives' bytes of the step (test_mics) */
        printf("bytes rank=%d step=%llu intra=%llu inter=%llu all_gather_inter=%llu "
               "all_reduce_inter=%llu reduce_scatter_inter=%llu\n",
               rank, (unsigned long long)st.step,
               (unsigned long long)zs_coll_bytes_intra(&st.bytes),
               (unsigned long long)zs_coll_bytes_inter(&st.bytes),
               (unsigned long long)st.bytes.inter[ZS_COLL_K_ALL_GATHER],
               (unsigned long long)st.bytes.inter[ZS_COLL_K_ALL_REDUCE],
               (unsigned long long)st.bytes.inter[ZS_COLL_K_REDUCE_SCATTER]);
        if (a.ckpt_every && st.step % (uint64_t)a.ckpt_every == 0 && zs_engine_checkpoint(e, &err))
            fail(rank, "checkpoint", &err);
        if (a.rss_check && st.step == 5) {
            zs_engine_mem_t mm;
            zs_engine_mem(e, &mm);
            rss5 = mm.rss;
            held5 = mm.measured.held[ZS_SPACE_DEVICE] + mm.measured.held[ZS_SPACE_PINNED] +
                    mm.measured.held[ZS_SPACE_HOST];
        }
    }
    if (a.mem_check) {
        /* measured peak of every category within formula + working set */
        zs_engine_mem_t mm;
        zs_engine_mem(e, &mm);
        uint64_t model = 0;
        for (int c = ZS_MEM_PARAMS; c <= ZS_MEM_OPTIMIZER; c++)
            for (int sp = 0; sp < ZS_NSPACES; sp++)
                model += mm.measured.peak[sp][c];
        printf("modelstate rank=%d bytes=%llu params=%llu grads=%llu optimizer=%llu\n", rank,
               (unsigned long long)model, (unsigned long long)zs__peak_cat(&mm, ZS_MEM_PARAMS),
               (unsigned long long)zs__peak_cat(&mm, ZS_MEM_GRADS),
               (unsigned long long)zs__peak_cat(&mm, ZS_MEM_OPTIMIZER));
        if (zs_engine_print_mem(e, stdout, &err))
            fail(rank, "print mem", &err);
        if (zs_engine_mem_check(e, &err)) {
            fprintf(stderr, "FAIL memcheck: %s\n", err.msg);
            fflush(NULL);
            MPI_Abort(MPI_COMM_WORLD, 4);
        }
        printf("memcheck rank=%d ok\n", rank);
    }
    if (a.rss_check) {
        zs_engine_mem_t mm;
        zs_engine_mem(e, &mm);
        uint64_t held = mm.measured.held[ZS_SPACE_DEVICE] + mm.measured.held[ZS_SPACE_PINNED] +
                        mm.measured.held[ZS_SPACE_HOST];
        double grow = ((double)mm.rss - (double)rss5) / 1e6;
        printf("rss rank=%d step5=%.2fMB end=%.2fMB growth=%.2fMB held step5=%llu end=%llu\n", rank,
               rss5 / 1e6, mm.rss / 1e6, grow, (unsigned long long)held5, (unsigned long long)held);
        /* Flat: the engine holds the same bytes, and the process grew by
         * less than 4 MB (allocator noise) over the remaining steps. */
        if (held != held5 || grow > 4.0) {
            fprintf(stderr, "FAIL rss: not flat after step 5 (held %llu -> %llu, rss +%.2f MB)\n",
                    (unsigned long long)held5, (unsigned long long)held, grow);
            fflush(NULL);
            MPI_Abort(MPI_COMM_WORLD, 6);
        }
    }
    if (rank == 0 && a.spec_report) {
        uint64_t spec1[4];
        spec_counters(a.servers, spec1);
        printf("spec hits=%llu rollbacks=%llu elements=%llu\n",
               (unsigned long long)(spec1[0] - spec0[0]), (unsigned long long)(spec1[1] - spec0[1]),
               (unsigned long long)(spec1[2] - spec0[2]));
        printf("servers bytes_in=%llu\n", (unsigned long long)(spec1[3] - spec0[3]));
    }
    float *w = malloc(P * 4);
    if (zs_engine_get_params(e, w, &err))
        fail(rank, "get params", &err);
    if (rank == 0 && a.out) {
        FILE *f = fopen(a.out, "wb");
        if (!f || fwrite(w, 4, P, f) != P || fclose(f))
            fail(rank, "write --out", NULL);
    }
    if (rank == 0 && a.ref) {
        float *r = reference(&a, &cfg, P, ref_norms);
        /* The engine's global gradient norm of each step it ran (unscaled:
         * a wrong grad_scale shows here even where Adam's scale invariance
         * hides it in the parameters). */
        double nerr = 0;
        int nbad = 0;
        for (int s = 1; s <= a.steps; s++)
            if (norms[s] > 0) {
                double d = fabs(norms[s] - ref_norms[s]);
                nerr = d / ref_norms[s] > nerr ? d / ref_norms[s] : nerr;
                nbad += d > 10 * a.rtol * ref_norms[s];
            }
        printf("normerr %.3g (relative, limit %g)%s\n", nerr, 10 * a.rtol, nbad ? ": FAIL" : "");
        if (nbad) {
            fflush(stdout);
            MPI_Abort(MPI_COMM_WORLD, 5);
        }
        double maxerr = 0;
        uint64_t bad = 0;
        for (uint64_t j = 0; j < P; j++) {
            double d = fabs((double)w[j] - r[j]);
            if (d > maxerr)
                maxerr = d;
            bad += d > a.atol + a.rtol * fabs((double)r[j]);
        }
        printf("maxerr %.3g over %llu params (atol %g, rtol %g): %s\n", maxerr,
               (unsigned long long)P, a.atol, a.rtol, bad ? "FAIL" : "ok");
        if (bad) {
            fflush(stdout);
            MPI_Abort(MPI_COMM_WORLD, 5);
        }
        free(r);
    }
    free(w);
    zs_engine_destroy(e);
    zs_coll_destroy(coll);
    zs_dev_destroy(dev);
    free(m);
    MPI_Finalize();
    return 0;
}
