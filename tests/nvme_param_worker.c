/*
 * nvme_param_worker.c - the MPI worker of test_nvme_param: the engine at
 * stage 3 on the test MLP (tests/zs_mlp.c), with offload_param.device
 * "cpu" or "nvme" (docs/nvme.md), CPU device and MPI collectives.
 *
 *   --nvme DIR        offload_param nvme with nvme_path DIR (default: cpu)
 *   --buffer-count N, --buffer-size N, --max-in-cpu N   offload_param keys
 *   --dtype fp32|bf16 --steps N --servers LIST (offload_optimizer cpu;
 *   without: the engine's own AdamW) --stream 0|1 (stream_pulls)
 *   --ckpt-every N --resume (resume from the newest checkpoint)
 *   --out FILE        rank 0 writes the final parameters (fp32, P of them)
 *
 * Prints per step "loss step=S bits=%a" (rank 0) and at the end, per
 * rank, "params-mem rank=R peak=BYTES" (the allocator's peak of category
 * params over every space) and "partition rank=R bytes=BYTES" (this rank's
 * part of the padded parameters, dt bytes). An engine that does not
 * create prints "FAIL engine create: MSG" and exits 3.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_engine.h"
#include "zs_mlp.h"

typedef struct {
    const char *nvme, *dtype, *servers, *out;
    long long bcount, bsize, maxcpu;
    int steps, stream, ckpt_every, resume;
} args_t;

static void fail(int rank, const char *what, const zs_err_t *err)
{
    printf("FAIL rank %d %s: %s\n", rank, what, err ? err->msg : "");
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    args_t a = {NULL, "fp32", NULL, NULL, 5, 100000000, 1000000000, 6, 1, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
#define OPT(name) (!strcmp(k, name) && ++i)
        if (OPT("--nvme"))
            a.nvme = v;
        else if (OPT("--dtype"))
            a.dtype = v;
        else if (OPT("--servers"))
            a.servers = v;
        else if (OPT("--out"))
            a.out = v;
        else if (OPT("--buffer-count"))
            a.bcount = atoll(v);
        else if (OPT("--buffer-size"))
            a.bsize = atoll(v);
        else if (OPT("--max-in-cpu"))
            a.maxcpu = atoll(v);
        else if (OPT("--steps"))
            a.steps = atoi(v);
        else if (OPT("--stream"))
            a.stream = atoi(v);
        else if (OPT("--ckpt-every"))
            a.ckpt_every = atoi(v);
        else if (!strcmp(k, "--resume"))
            a.resume = 1;
        else {
            fprintf(stderr, "nvme_param_worker: unknown flag %s\n", k);
            return 2;
        }
#undef OPT
    }
    zs_err_t err;
    zs_dev_t *dev;
    if (zs_dev_cpu_create(1, &dev, &err))
        fail(-1, "device", &err);
    zs_coll_t *coll;
    if (zs_coll_mpi_create(dev, &coll, &err))
        fail(-1, "collectives", &err);
    int rank = coll->rank, W = coll->size;

    char param[1024], json[4096];
    if (a.nvme)
        snprintf(param, sizeof param,
                 "{\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_count\": %lld, "
                 "\"buffer_size\": %lld, \"max_in_cpu\": %lld}",
                 a.nvme, a.bcount, a.bsize, a.maxcpu);
    else
        snprintf(param, sizeof param, "{\"device\": \"cpu\"}");
    snprintf(json, sizeof json,
             "{\"train_batch_size\": 16, \"gradient_accumulation_steps\": 2,"
             " \"gradient_clipping\": 1.0,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.002,"
             "   \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.01}},"
             " \"bf16\": {\"enabled\": %s},"
             " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 2000,"
             "   \"stage3_param_persistence_threshold\": 0,"
             "   \"stage3_prefetch_bucket_size\": 4000,"
             "   \"offload_param\": %s,"
             "   \"offload_optimizer\": {\"device\": \"%s\", \"stream_pulls\": %s}}}",
             strcmp(a.dtype, "bf16") == 0 ? "true" : "false", param, a.servers ? "cpu" : "none",
             a.stream ? "true" : "false");
    zs_config_t cfg;
    zs_config_defaults(&cfg);
    if (zs_config_parse(json, &cfg, NULL, NULL, &err) || zs_config_resolve(&cfg, W, &err))
        fail(rank, "config", &err);
    zs_mlp_t *m = malloc(sizeof *m);
    zs_mlp_init(m);
    zs_engine_opts_t eo = {&cfg, coll, a.servers, NULL, "mlp-nvme-param", 60000, 0};
    zs_engine_t *e;
    if (zs_engine_create(&eo, &m->model, &e, &err)) {
        printf("FAIL engine create: %s\n", err.msg);
        fflush(NULL);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (a.resume) {
        uint64_t at;
        if (zs_engine_resume(e, 0, &at, &err))
            fail(rank, "resume", &err);
        if (rank == 0)
            printf("resumed at step %llu\n", (unsigned long long)at);
    } else if (zs_engine_start(e, &err)) {
        fail(rank, "start", &err);
    }
    while (zs_engine_step_count(e) < (uint64_t)a.steps) {
        zs_step_stats_t st;
        if (zs_engine_step(e, &st, &err))
            fail(rank, "step", &err);
        if (rank == 0)
            printf("loss step=%llu bits=%a\n", (unsigned long long)st.step, (double)st.loss);
        if (a.ckpt_every && st.step % (uint64_t)a.ckpt_every == 0 && zs_engine_checkpoint(e, &err))
            fail(rank, "checkpoint", &err);
    }
    uint64_t P = zs_engine_num_params(e);
    float *w = malloc(P * sizeof *w);
    if (!w || zs_engine_get_params(e, w, &err))
        fail(rank, "get params", &err);
    zs_engine_mem_t mm;
    zs_engine_mem(e, &mm);
    uint64_t peak = 0;
    for (int sp = 0; sp < ZS_NSPACES; sp++)
        peak += mm.measured.peak[sp][ZS_MEM_PARAMS];
    printf("params-mem rank=%d peak=%llu\n", rank, (unsigned long long)peak);
    printf("partition rank=%d bytes=%llu\n", rank, (unsigned long long)mm.formula[ZS_MEM_PARAMS]);
    if (zs_engine_mem_check(e, &err))
        fail(rank, "memory check", &err);
    if (rank == 0 && a.out) {
        FILE *f = fopen(a.out, "wb");
        if (!f || fwrite(w, sizeof *w, P, f) != P || fclose(f) != 0) {
            printf("FAIL cannot write %s\n", a.out);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    free(w);
    zs_engine_destroy(e);
    zs_coll_destroy(coll);
    zs_dev_destroy(dev);
    free(m);
    fflush(NULL);
    MPI_Finalize();
    return 0;
}
