/*
 * bench_fit_trial.c - one trial of bench_fit (bench_fit --trial ...): does a
 * GPT of `layers` x `width` train on this device within its memory, with
 * the optimizer offloaded to shard servers?
 *
 * In order: MPI (a singleton, W = 1), the device (CPU with its device
 * memory limit, or CUDA with an optional limit), the collectives (MPI or
 * NCCL), `nservers` zs-server processes on 127.0.0.1 (data under the
 * search's work dir, killed with this process), the GPT (fixed tokens),
 * the engine (stage 3 + offload_param + offload_optimizer, or stage 2 +
 * offload_optimizer) and its fresh start (Initialize on the servers), then
 * 2 full train steps (forward, backward, AdamW on the servers, parameters
 * back). Fits = both steps returned ZS_OK with a finite loss.
 *
 * Measured and printed as one FIT-RESULT line (bench_fit.h): the device
 * allocator's peaks (held and per category), on CUDA the driver's used
 * bytes after step 2, VmHWM of this process and of the servers, the init
 * and step times. An error with ZS_ERR_NOMEM whose message says "out of
 * device memory" (the CUDA allocator's) or naming the CPU device's limit is
 * the "oom" result; every other failure is "error" with its message.
 *
 * Does not: clean up after a failure (the process ends; the servers die
 * with it through PR_SET_PDEATHSIG, the search removes the work dir).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_fit.h"
#include "zs_bench.h"
#include "zs_engine.h"
#include "zs_gpt.h"

#if defined(ZS_WITH_CUDA) && defined(ZS_WITH_NCCL)
#include "zs_coll_nccl.h"
#include "zs_dev_cuda.h"
#define FIT_CUDA 1
#else
#define FIT_CUDA 0
#endif

#define MAX_SERVERS 8

/* ---- result line ---------------------------------------------------------- */

void zs__fit_result_print(const zs__fit_result_t *r, FILE *f)
{
    fprintf(f,
            "FIT-RESULT status=%s params=%llu layers=%d width=%d held_peak=%llu peak=", r->status,
            (unsigned long long)r->params, r->layers, r->width, (unsigned long long)r->held_peak);
    for (int k = 0; k < ZS_MEM_NCATS; k++)
        fprintf(f, "%s%llu", k ? "," : "", (unsigned long long)r->peak[k]);
    fprintf(f,
            " pinned_peak=%llu dev_cap=%llu gpu_used=%llu rss_hwm=%llu srv_hwm=%llu init_s=%.3f "
            "start_s=%.3f step1_s=%.3f step2_s=%.3f tok_s=%.1f loss1=%.6g loss2=%.6g msg=",
            (unsigned long long)r->pinned_peak, (unsigned long long)r->dev_cap,
            (unsigned long long)r->gpu_used, (unsigned long long)r->rss_hwm,
            (unsigned long long)r->srv_hwm, r->init_s, r->start_s, r->step_s[0], r->step_s[1],
            r->tok_s, r->loss[0], r->loss[1]);
    for (const char *p = r->msg; *p; p++) /* one line */
        fputc(*p == '\n' || *p == '\r' ? ' ' : *p, f);
    fputc('\n', f);
    fflush(f);
}

int zs__fit_result_parse(const char *line, zs__fit_result_t *r)
{
    memset(r, 0, sizeof *r);
    unsigned long long params, held, pin, cap, used, hwm, shwm;
    int n = 0;
    /* head, then ZS_MEM_NCATS comma-separated peaks (as many as the
     * allocator has categories), then the tail */
    if (sscanf(line, "status=%15s params=%llu layers=%d width=%d held_peak=%llu peak=%n", r->status,
               &params, &r->layers, &r->width, &held, &n) != 5 ||
        n == 0)
        return -1;
    const char *p = line + n;
    for (int k = 0; k < ZS_MEM_NCATS; k++) {
        char *end;
        if (k && *p++ != ',')
            return -1;
        r->peak[k] = strtoull(p, &end, 10);
        if (end == p)
            return -1;
        p = end;
    }
    n = 0;
    if (sscanf(p,
               " pinned_peak=%llu dev_cap=%llu gpu_used=%llu rss_hwm=%llu srv_hwm=%llu init_s=%lf "
               "start_s=%lf step1_s=%lf step2_s=%lf tok_s=%lf loss1=%lf loss2=%lf msg=%n",
               &pin, &cap, &used, &hwm, &shwm, &r->init_s, &r->start_s, &r->step_s[0],
               &r->step_s[1], &r->tok_s, &r->loss[0], &r->loss[1], &n) != 12 ||
        n == 0)
        return -1;
    r->params = params, r->held_peak = held, r->pinned_peak = pin, r->dev_cap = cap;
    r->gpu_used = used, r->rss_hwm = hwm, r->srv_hwm = shwm;
    snprintf(r->msg, sizeof r->msg, "%s", p + n);
    r->msg[strcspn(r->msg, "\n")] = '\0';
    return 0;
}

uint64_t zs__fit_vm_hwm(int pid)
{
    char path[64], line[256];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/status", pid);
    else
        snprintf(path, sizeof path, "/proc/self/status");
    FILE *f = fopen(path, "r");
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* ---- shard servers ----------------------------------------------------------- */

typedef struct {
    int n;
    pid_t pid[MAX_SERVERS];
    char list[MAX_SERVERS * 64];
} servers_t;

/* Start o->nservers zs-server processes on 127.0.0.1 (ports from the
 * kernel) with data under o->workdir; ZS_OK or an error naming why. */
static int servers_start(const zs__fit_opts_t *o, servers_t *sv, zs_err_t *err)
{
    memset(sv, 0, sizeof *sv);
    if (!o->server_bin || !*o->server_bin || access(o->server_bin, X_OK) != 0)
        return zs_err_set(err, ZS_ERR_INVALID, "no zs-server binary at \"%s\" (give --server-bin)",
                          o->server_bin ? o->server_bin : "");
    char threads[16];
    snprintf(threads, sizeof threads, "%d", o->server_threads);
    for (int i = 0; i < o->nservers; i++) {
        char data[512], ready[512], addr[64] = "";
        snprintf(data, sizeof data, "%s/s%d", o->workdir, i);
        snprintf(ready, sizeof ready, "%s/r%d", o->workdir, i);
        unlink(ready);
        pid_t p = fork();
        if (p < 0)
            return zs_err_set(err, ZS_ERR_IO, "fork: %s", strerror(errno));
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the trial */
            setenv("ZS_LOG_LEVEL", "warn", 1);
            execl(o->server_bin, o->server_bin, "--listen", "127.0.0.1:0", "--data", data,
                  "--ready-file", ready, "--threads", threads, (char *)NULL);
            _exit(127);
        }
        sv->pid[i] = p;
        sv->n = i + 1;
        for (int k = 0; k < 600 && !addr[0]; k++) { /* 30 s */
            FILE *f = fopen(ready, "r");
            if (f) {
                if (fgets(addr, sizeof addr, f))
                    addr[strcspn(addr, "\n")] = '\0';
                fclose(f);
            }
            if (!addr[0]) {
                if (waitpid(p, NULL, WNOHANG) == p) {
                    sv->pid[i] = 0;
                    return zs_err_set(err, ZS_ERR_UNAVAILABLE, "zs-server %d exited at start", i);
                }
                usleep(50000);
            }
        }
        if (!addr[0])
            return zs_err_set(err, ZS_ERR_TIMEOUT, "zs-server %d did not start in 30 s", i);
        size_t len = strlen(sv->list);
        snprintf(sv->list + len, sizeof sv->list - len, "%s%s", i ? "," : "", addr);
    }
    return ZS_OK;
}

static void servers_stop(servers_t *sv)
{
    for (int i = 0; i < sv->n; i++)
        if (sv->pid[i] > 0) {
            kill(sv->pid[i], SIGTERM);
            waitpid(sv->pid[i], NULL, 0);
            sv->pid[i] = 0;
        }
}

/* ---- the trial ------------------------------------------------------------------- */

/* The device and its collectives, with the limit applied. */
static int make_device(const zs__fit_opts_t *o, zs_dev_t **dev, zs_coll_t **coll, uint64_t *cap,
                       zs_err_t *err)
{
    int rc;
    if (!o->cuda) {
        zs_dev_cpu_opts_t co = {o->threads, o->mem_limit};
        *cap = o->mem_limit;
        if ((rc = zs_dev_cpu_create_opts(&co, dev, err)))
            return rc;
        return zs_coll_mpi_create(*dev, coll, err);
    }
#if FIT_CUDA
    if ((rc = zs_dev_cuda_create(0, dev, err)))
        return rc;
    if (o->mem_limit && (rc = zs_dev_cuda_set_mem_limit(*dev, o->mem_limit, err)))
        return rc;
    if ((rc = zs_coll_nccl_create(*dev, 0, coll, err)))
        return rc;
    size_t fr = 0, tot = 0;
    if ((rc = zs_dev_cuda_mem_info(*dev, &fr, &tot, err)))
        return rc;
    *cap = o->mem_limit && o->mem_limit < fr ? o->mem_limit : fr;
    return ZS_OK;
#else
    return zs_err_set(err, ZS_ERR_UNAVAILABLE, "built without CUDA and NCCL");
#endif
}

/* What the trial does between MPI_Init and MPI_Finalize. Fills r; returns
 * the first error (r->status set by the caller from it). */
static int run(const zs__fit_opts_t *o, zs__fit_result_t *r, zs_err_t *err)
{
    zs_gpt_config_t c = {o->layers, o->width / o->head_size, o->width, o->ctx, o->vocab};
    zs_dev_t *dev = NULL;
    zs_coll_t *coll = NULL;
    zs_gpt_t *g = NULL;
    zs_engine_t *e = NULL;
    servers_t sv;
    memset(&sv, 0, sizeof sv);
    int B = o->batch, n = o->batch * o->ctx, rc;
    int32_t *in = malloc((size_t)n * 4), *tg = malloc((size_t)n * 4);
    if (!in || !tg)
        return zs_err_set(err, ZS_ERR_NOMEM, "no host memory for the tokens");
    zs_bench_tokens(n, o->vocab, in, tg);
    r->params = zs_gpt_num_params(&c);
    if ((rc = make_device(o, &dev, &coll, &r->dev_cap, err)))
        goto out;
    if ((rc = servers_start(o, &sv, err)))
        goto out;
    char json[1024], extra[256] = "";
    int len = 0;
    /* auto: one MLP weight and bias, the largest part of a split block */
    int64_t bucket = o->bucket < 0 ? 4 * (int64_t)o->width * o->width + 4 * o->width : o->bucket;
    if (bucket > 0)
        len += snprintf(extra + len, sizeof extra - len, ", \"reduce_bucket_size\": %lld",
                        (long long)bucket);
    if (o->max_live > 0)
        len += snprintf(extra + len, sizeof extra - len, ", \"stage3_max_live_parameters\": %lld",
                        (long long)o->max_live);
    if (o->persist >= 0)
        len += snprintf(extra + len, sizeof extra - len,
                        ", \"stage3_param_persistence_threshold\": %lld", (long long)o->persist);
    snprintf(json, sizeof json,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4,"
             " \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.0}},"
             " %s \"zero_optimization\": {\"stage\": %d,"
             " \"offload_optimizer\": {\"device\": \"cpu\"}%s%s}}",
             B, B, o->bf16 ? "\"bf16\": {\"enabled\": true}," : "", o->stage,
             o->stage == 3 ? ", \"offload_param\": {\"device\": \"cpu\"}" : "", extra);
    zs_config_t cfg;
    if ((rc = zs_config_parse(json, &cfg, NULL, NULL, err)) ||
        (rc = zs_config_resolve(&cfg, 1, err)))
        goto out;
    zs_dev_mem_reset_peak(dev);
    double t0 = zs_bench_now();
    if ((rc = zs_gpt_create(&c, B, 1, &g, err)) || (rc = zs_gpt_set_threads(g, o->threads, err)) ||
        (rc = zs_gpt_set_checkpointing(g, o->act_ckpt > 0, o->act_ckpt == 2, err)) ||
        (rc = zs_gpt_set_fixed_tokens(g, in, tg, B, err)))
        goto out;
    /* engine layers no larger than the bucket, so gradient buckets can be
     * that small; bf16: 16-bit saved activations, and on CUDA bf16 GEMMs
     * (tensor cores; the CPU's GEMMs stay fp32, reading the bf16 weights
     * exactly, since its rounded operand copies would cost 4 B each) */
    if (o->split && bucket > 0 && (rc = zs_gpt_set_split(g, (uint64_t)bucket, err)))
        goto out;
    if (o->bf16 && ((rc = zs_gpt_set_activations(g, ZS_DTYPE_BF16, err)) ||
                    (o->cuda && (rc = zs_gpt_set_compute(g, ZS_DTYPE_BF16, err)))))
        goto out;
    zs_engine_opts_t eo = {&cfg, coll, sv.list, NULL, "bench-fit", 600000, 0};
    if ((rc = zs_engine_create(&eo, zs_gpt_model(g), &e, err)))
        goto out;
    double t_start = zs_bench_now();
    if ((rc = zs_engine_start(e, err)))
        goto out;
    r->start_s = zs_bench_now() - t_start;
    r->init_s = zs_bench_now() - t0;
    for (int s = 0; s < 2; s++) {
        zs_step_stats_t st;
        double t1 = zs_bench_now();
        if ((rc = zs_engine_step(e, &st, err)))
            goto out;
        r->step_s[s] = zs_bench_now() - t1;
        r->loss[s] = st.loss;
    }
    r->tok_s = r->step_s[1] > 0 ? (double)n / r->step_s[1] : 0;
out:
    if (dev) {
        zs_dev_mem_t m;
        zs_dev_mem_get(dev, &m);
        r->held_peak = m.held_peak[ZS_SPACE_DEVICE];
        r->pinned_peak = m.held_peak[ZS_SPACE_PINNED];
        for (int k = 0; k < ZS_MEM_NCATS; k++)
            r->peak[k] = m.peak[ZS_SPACE_DEVICE][k];
#if FIT_CUDA
        size_t fr = 0, tot = 0;
        zs_err_t e2;
        if (o->cuda && zs_dev_cuda_mem_info(dev, &fr, &tot, &e2) == ZS_OK)
            r->gpu_used = tot - fr;
#endif
    }
    r->rss_hwm = zs__fit_vm_hwm(0);
    for (int i = 0; i < sv.n; i++)
        r->srv_hwm += zs__fit_vm_hwm(sv.pid[i]);
    if (rc == ZS_OK) { /* a clean end; after a failure the process just exits */
        zs_engine_destroy(e);
        zs_gpt_destroy(g);
        zs_coll_destroy(coll);
        zs_dev_destroy(dev);
    }
    servers_stop(&sv);
    free(in), free(tg);
    return rc;
}

int zs__fit_trial(const zs__fit_opts_t *o)
{
    zs__fit_result_t r;
    memset(&r, 0, sizeof r);
    r.layers = o->layers;
    r.width = o->width;
    int provided, argc = 0;
    char **argv = NULL;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    zs_err_t err;
    zs_err_clear(&err);
    int rc = provided < MPI_THREAD_SERIALIZED
                 ? zs_err_set(&err, ZS_ERR_INTERNAL, "MPI gives thread level %d", provided)
                 : run(o, &r, &err);
    int status = FIT_EXIT_FIT;
    /* out of memory = the device's: the CPU limit's refusal, or on CUDA the
     * allocator's (a cudaMalloc that failed, or the optional limit); a host
     * or pinned allocation that failed is an error */
    if (rc == ZS_ERR_NOMEM && (o->cuda ? strstr(err.msg, "cuda:0: out of device memory") != NULL
                                       : strstr(err.msg, "the device memory limit is") != NULL))
        status = FIT_EXIT_OOM;
    else if (rc)
        status = FIT_EXIT_ERROR;
    else if (!isfinite(r.loss[0]) || !isfinite(r.loss[1]))
        status = FIT_EXIT_NONFINITE;
    static const char *names[] = {"fit", "oom", "error", "nonfinite"};
    snprintf(r.status, sizeof r.status, "%s",
             names[status == FIT_EXIT_FIT ? 0 : status - FIT_EXIT_OOM + 1]);
    if (rc)
        snprintf(r.msg, sizeof r.msg, "%s: %s", zs_status_name(rc), err.msg);
    zs__fit_result_print(&r, stdout);
    if (rc == ZS_OK)
        MPI_Finalize();
    return status;
}
