/*
 * zs_shard.c - shard state, lifecycle, Initialize and the optimizer driver
 * (see zs_shard.h for the model). Push and Commit live in zs_shard_push.c,
 * Pull/GetState/SetState in zs_shard_io.c, checkpoints in zs_shard_ckpt.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs_cast.h"
#include "zs_layout.h"
#include "zs_log.h"
#include "zs_shard_internal.h"

int64_t zs_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- state arrays ------------------------------------------------------ */

uint64_t zs_shard_state_bytes(uint64_t n)
{
    uint64_t nchunks = (n + ZS_OPT_CHUNK - 1) / ZS_OPT_CHUNK;
    uint64_t tables = nchunks * (sizeof(pthread_mutex_t) + sizeof(uint64_t) + 1);
    return 22 * n + 6 * 64 + tables; /* 6 arrays, each rounded up to 64 bytes */
}

zs_budget_t *zs_shard_budget(zs_shard_t *sh)
{
    return &sh->budget;
}

static void *alloc_array(uint64_t bytes)
{
    if (bytes == 0)
        bytes = 64;
    size_t b = (size_t)((bytes + 63) & ~63ull);
    return aligned_alloc(64, b);
}

int zs__state_alloc(zs__state_t *s, uint64_t n)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 3; i++)
        s->t[i] = alloc_array(n * 4);
    s->staging[0] = alloc_array(n * 4);
    s->staging[1] = alloc_array(n * 4);
    s->lowp = alloc_array(n * 2);
    if (!s->t[0] || !s->t[1] || !s->t[2] || !s->staging[0] || !s->staging[1] || !s->lowp) {
        zs__state_free(s);
        return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}

void zs__state_free(zs__state_t *s)
{
    for (int i = 0; i < 3; i++)
        free(s->t[i]);
    free(s->staging[0]);
    free(s->staging[1]);
    free(s->lowp);
    zs_nvme_state_free(s->nv); /* removes its tile file */
    memset(s, 0, sizeof *s);
}

/* See zs_shard_internal.h. */
int zs__step_check(uint64_t step, const char *what, zs_err_t *err)
{
    if (step <= ZS_SHARD_STEP_MAX)
        return ZS_OK;
    return zs_err_set(err, ZS_ERR_INVALID, "%s %llu is above the largest step, %llu", what,
                      (unsigned long long)step, (unsigned long long)ZS_SHARD_STEP_MAX);
}

int zs__identity_check(const zs_shard_identity_t *id, uint64_t *rb, uint64_t *re, zs_err_t *err)
{
    size_t nl = strnlen(id->model_name, ZS_MODEL_NAME_MAX);
    if (nl == 0 || nl >= ZS_MODEL_NAME_MAX)
        return zs_err_set(err, ZS_ERR_INVALID, "model name must be 1..%d characters",
                          ZS_MODEL_NAME_MAX - 1);
    if (id->num_params == 0 || id->num_params > ZS_MAX_PARAMS)
        return zs_err_set(err, ZS_ERR_INVALID, "num_params %llu outside 1..%llu",
                          (unsigned long long)id->num_params, (unsigned long long)ZS_MAX_PARAMS);
    if (id->num_servers == 0 || id->num_servers > ZS_MAX_SERVERS)
        return zs_err_set(err, ZS_ERR_INVALID, "num_servers %u outside 1..%d", id->num_servers,
                          ZS_MAX_SERVERS);
    if (id->server_index >= id->num_servers)
        return zs_err_set(err, ZS_ERR_INVALID, "server_index %u must be below num_servers %u",
                          id->server_index, id->num_servers);
    *rb = zs_layout_begin(id->num_params, id->num_servers, id->server_index);
    *re = zs_layout_begin(id->num_params, id->num_servers, id->server_index + 1);
    return ZS_OK;
}

static int hparams_check(const zs_adam_hparams_t *hp, zs_err_t *err)
{
    if (!(hp->lr >= 0 && isfinite(hp->lr)))
        return zs_err_set(err, ZS_ERR_INVALID, "adam lr %g must be finite and >= 0", hp->lr);
    if (!(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1))
        return zs_err_set(err, ZS_ERR_INVALID, "adam betas (%g, %g) must be in [0, 1)", hp->beta1,
                          hp->beta2);
    if (!(hp->eps > 0 && isfinite(hp->eps)))
        return zs_err_set(err, ZS_ERR_INVALID, "adam eps %g must be finite and > 0", hp->eps);
    if (!(hp->weight_decay >= 0 && isfinite(hp->weight_decay)))
        return zs_err_set(err, ZS_ERR_INVALID, "adam weight_decay %g must be finite and >= 0",
                          hp->weight_decay);
    return ZS_OK;
}

void zs__shard_wait_idle(zs_shard_t *sh)
{
    for (;;) {
        while (sh->job_pending || sh->opt_running || sh->ckpt_busy || sh->readers > 0 ||
               sh->stage[0].inflight > 0 || sh->stage[1].inflight > 0)
            pthread_cond_wait(&sh->cv, &sh->mu);
        /* Wholesale readers and writers see the committed state only. */
        if (!sh->spec.running && sh->spec.applied == 0 && sh->spec.queued == 0)
            return;
        zs__spec_cancel(sh); /* may wait: check everything again */
    }
}

static void free_chunk_tables(zs_shard_t *sh)
{
    for (size_t c = 0; c < sh->nchunks; c++)
        pthread_mutex_destroy(&sh->chunk_mu[c]);
    free(sh->chunk_mu);
    free((void *)sh->done);
    free(sh->lowp_ok);
    sh->chunk_mu = NULL;
    sh->done = NULL;
    sh->lowp_ok = NULL;
    sh->nchunks = 0;
    zs__spec_free(sh);
}

int zs__shard_install(zs_shard_t *sh, const zs_shard_identity_t *id, const zs_adam_hparams_t *hp,
                      const zs_group_range_t *groups, size_t ngroups, zs__state_t *st,
                      uint64_t step, uint64_t optimizer_step, zs_err_t *err)
{
    uint64_t rb, re;
    int rc = zs__identity_check(id, &rb, &re, err);
    if (!rc)
        rc = zs_groups_check(groups, ngroups, id->num_params, err);
    if (rc)
        return rc;
    zs_group_range_t *gcopy = NULL;
    if (ngroups) {
        gcopy = malloc(ngroups * sizeof *gcopy);
        if (!gcopy)
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu parameter group ranges",
                              ngroups);
        memcpy(gcopy, groups, ngroups * sizeof *gcopy);
    }
    size_t nchunks = (size_t)((re - rb + ZS_OPT_CHUNK - 1) / ZS_OPT_CHUNK);
    size_t alloc = nchunks ? nchunks : 1;
    pthread_mutex_t *mus = calloc(alloc, sizeof *mus);
    _Atomic uint64_t *done = calloc(alloc, sizeof *done);
    unsigned char *ok = calloc(alloc, 1);
    if (!mus || !done || !ok) {
        free(gcopy);
        free(mus);
        free((void *)done);
        free(ok);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu chunk records", nchunks);
    }
    free_chunk_tables(sh);
    if (zs__spec_resize(sh, nchunks) != ZS_OK) /* speculation off: correct, only slower */
        ZS_WARN("init: out of memory for the speculation tables: speculation is off");
    zs__state_free(&sh->st);
    sh->st = *st;
    memset(st, 0, sizeof *st);
    sh->chunk_mu = mus;
    sh->done = done;
    sh->lowp_ok = ok;
    sh->nchunks = nchunks;
    for (size_t c = 0; c < nchunks; c++) {
        pthread_mutex_init(&mus[c], NULL);
        atomic_store(&done[c], step);
    }
    sh->id = *id;
    sh->rb = rb;
    sh->re = re;
    sh->n = re - rb;
    sh->hp = *hp;
    free(sh->groups);
    sh->groups = gcopy;
    sh->ngroups = ngroups;
    sh->applied_step = step;
    sh->optimizer_step = optimizer_step;
    sh->lowp_dtype = ZS_DTYPE_NONE;
    for (int p = 0; p < 2; p++)
        zs__stage_reset(sh, p);
    sh->have_last_commit = 0;
    sh->initialized = 1;
    pthread_cond_broadcast(&sh->cv);
    return ZS_OK;
}

/* ---- optimizer driver -------------------------------------------------- */

/* See zs_shard_internal.h. */
void zs__shard_adam_from(const zs_shard_t *sh, const zs_adam_step_t *st, const float *lrs,
                         uint32_t nlrs, uint64_t a, const float *p0, const float *m0,
                         const float *v0, float *p, float *m, float *v, const void *grad,
                         zs_dtype_t gdt, void *out, zs_dtype_t pdt, size_t k)
{
    size_t gsz = zs_dtype_size(gdt), osz = out ? zs_dtype_size(pdt) : 0;
    for (size_t i = 0; i < k;) {
        zs_adam_hparams_t hp;
        zs_adam_step_t s;
        size_t n = (size_t)zs_groups_piece(sh->groups, sh->ngroups, lrs, nlrs, &sh->hp, st,
                                           sh->rb + a + i, k - i, &hp, &s);
        zs_adam_update_from(&hp, &s, p0 + i, m0 + i, v0 + i, p + i, m + i, v + i,
                            (const char *)grad + i * gsz, gdt, out ? (char *)out + i * osz : NULL,
                            pdt, n);
        i += n;
    }
}

/* See zs_shard_internal.h. */
void zs__shard_adam_save(const zs_shard_t *sh, const zs_adam_step_t *st, const float *lrs,
                         uint32_t nlrs, uint64_t a, float *p, float *m, float *v, float *sp,
                         float *sm, float *sv, const void *grad, zs_dtype_t gdt, void *out,
                         zs_dtype_t pdt, size_t k)
{
    size_t gsz = zs_dtype_size(gdt), osz = out ? zs_dtype_size(pdt) : 0;
    for (size_t i = 0; i < k;) {
        zs_adam_hparams_t hp;
        zs_adam_step_t s;
        size_t n = (size_t)zs_groups_piece(sh->groups, sh->ngroups, lrs, nlrs, &sh->hp, st,
                                           sh->rb + a + i, k - i, &hp, &s);
        zs_adam_update_save(&hp, &s, p + i, m + i, v + i, sp + i, sm + i, sv + i,
                            (const char *)grad + i * gsz, gdt, out ? (char *)out + i * osz : NULL,
                            pdt, n);
        i += n;
    }
}

static void opt_chunk(void *arg, size_t c, int thread)
{
    zs__opt_pass_t *op = arg;
    zs_shard_t *sh = op->sh;
    uint64_t a = (uint64_t)c * ZS_OPT_CHUNK;
    uint64_t k = sh->n - a < ZS_OPT_CHUNK ? sh->n - a : ZS_OPT_CHUNK;
    size_t gsz = zs_dtype_size(op->gdt);
    pthread_mutex_lock(&sh->chunk_mu[c]);
    /* Kept: the speculative update is this one (same kernel, inputs, order).
     * Rolled back: the update reads the chunk's pre-image. */
    const float *pre = NULL;
    if (!(op->spec != ZS__JOB_PLAIN && zs__spec_pass_chunk(sh, c, op->spec, &pre))) {
        float *p = sh->st.t[0] + a, *m = sh->st.t[1] + a, *v = sh->st.t[2] + a;
        zs__shard_adam_from(sh, &sh->job_step, sh->job.lrs, sh->job.nlrs, a, pre ? pre : p,
                            pre ? pre + ZS_OPT_CHUNK : m, pre ? pre + 2 * ZS_OPT_CHUNK : v, p, m, v,
                            (const char *)op->grad + a * gsz, op->gdt,
                            op->pdt == ZS_DTYPE_NONE ? NULL : sh->st.lowp + a, op->pdt, (size_t)k);
    }
    sh->lowp_ok[c] = op->pdt == ZS_DTYPE_NONE ? 0 : (unsigned char)(1 + op->pdt);
    atomic_store(&sh->done[c], op->step);
    pthread_mutex_unlock(&sh->chunk_mu[c]);
    /* Wake pulls waiting for this chunk. */
    pthread_mutex_lock(&sh->mu);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

static void *opt_main(void *arg)
{
    zs_shard_t *sh = arg;
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->job_pending && !sh->stopping)
            pthread_cond_wait(&sh->cv, &sh->mu);
        if (!sh->job_pending && sh->stopping)
            break;
        sh->job_pending = 0;
        sh->opt_running = 1;
        int p = (int)(sh->job.step & 1);
        zs__opt_pass_t op = {
            sh,          sh->job.step, sh->stage[p].dtype, sh->job.param_dtype, sh->st.staging[p],
            sh->job_spec};
        sh->lowp_dtype = sh->job.param_dtype;
        pthread_mutex_unlock(&sh->mu);

        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (sh->nvme) { /* a failure marks the shard failed (zs_shard_nvme.c) */
            zs_err_t e;
            zs__nvme_pass_run(sh, op.step, op.gdt, op.pdt, op.spec, &e);
        } else {
            zs_pool_run(sh->pool, sh->nchunks, opt_chunk, &op);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double sec = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);

        pthread_mutex_lock(&sh->mu);
        sh->opt_running = 0;
        zs__spec_pass_end(sh);
        sh->c.steps_applied++;
        sh->c.last_step_ms = sec * 1e3;
        sh->c.optimizer_gbps = sec > 0 ? 28.0 * (double)sh->n / sec / 1e9 : 0;
        sh->c.optimizer_seconds += sec;
        sh->c.optimizer_bytes += 28 * sh->n;
        ZS_INFO("commit: step %llu applied (Adam t=%lld) in %.1f ms, %.2f GB/s",
                (unsigned long long)op.step, (long long)sh->job_step.t, sec * 1e3,
                sh->c.optimizer_gbps);
        pthread_cond_broadcast(&sh->cv);
    }
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

int zs_shard_create(const zs_shard_opts_t *opts, zs_shard_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_shard_t *sh = calloc(1, sizeof *sh);
    if (!sh)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    sh->data_dir = strdup(opts->data_dir);
    sh->server_id = strdup(opts->server_id ? opts->server_id : "");
    sh->keep = opts->keep > 0 ? opts->keep : 2;
    sh->lowp_dtype = ZS_DTYPE_NONE;
    sh->spec.window = opts->spec_window;
    zs_budget_init(&sh->budget, opts->mem_budget ? opts->mem_budget : zs_budget_default(NULL));
    pthread_mutex_init(&sh->mu, NULL);
    pthread_mutex_init(&sh->store_mu, NULL);
    pthread_cond_init(&sh->cv, NULL);
    int rc = zs_store_open(opts->data_dir, &sh->store, err);
    if (rc) {
        zs_err_prefix(err, "data dir %s: ", opts->data_dir);
        goto fail;
    }
    sh->pool = zs_pool_create(opts->threads);
    if (sh->spec.window) /* speculation's own threads, at low priority (zs_shard_spec.c) */
        sh->spec_pool = zs_pool_create(opts->threads);
    if (!sh->pool || (sh->spec.window && !sh->spec_pool)) {
        rc = zs_err_set(err, ZS_ERR_NOMEM, "cannot start %d optimizer threads", opts->threads);
        goto fail;
    }
    if (opts->nvme_path) {
        zs_nvme_opts_t no = {opts->nvme_path, opts->nvme_buffered, opts->nvme_depth};
        rc = zs_nvme_open(&no, &sh->nvme, err);
        if (rc) {
            zs_err_prefix(err, "--nvme-path: ");
            goto fail;
        }
        /* Its buffers, taken once here: the pass's depth; a Restore (a
         * store chunk per tensor and a tile) or an Initialize (a tile), a
         * checkpoint (a store chunk and a tile) and a GetState or SetState
         * (a tile) at once. Pull's tile buffer is reserved per call. */
        sh->nvme_budget =
            zs_nvme_ram_bytes(sh->nvme) + 4ull * ZS_STORE_CHUNK_BYTES + 3ull * ZS_NVME_SLOT;
        rc = zs_budget_take(&sh->budget, sh->nvme_budget, "the NVMe tier's I/O buffers", err);
        if (rc) {
            sh->nvme_budget = 0;
            goto fail;
        }
        /* Speculation's pre-images are the tiles' current slots: no RAM
         * slots, but a tile buffer for each of its threads at most. */
        if (sh->spec.window) {
            uint64_t b = (uint64_t)zs_pool_threads(sh->spec_pool) * (ZS_NVME_SLOT + ZS_NVME_GSPAN);
            rc = zs_budget_take(&sh->budget, b, "the NVMe tier's speculation buffers", err);
            if (rc)
                goto fail;
            sh->nvme_budget += b;
        }
    }
    rc = zs__shard_load_newest(sh, err);
    if (rc)
        goto fail;
    if (pthread_create(&sh->opt_thread, NULL, opt_main, sh) != 0) {
        rc = zs_err_set(err, ZS_ERR_NOMEM, "cannot start the optimizer thread");
        goto fail;
    }
    sh->spec_thread_ok =
        sh->spec_pool && pthread_create(&sh->spec_thread, NULL, zs__spec_main, sh) == 0;
    if (!sh->spec_thread_ok) { /* correct without it, only slower */
        if (sh->spec.window)
            ZS_WARN("cannot start the speculation thread: speculation is off");
        pthread_mutex_lock(&sh->mu);
        sh->spec.window = 0;
        sh->spec.maxslots = 0;
        pthread_mutex_unlock(&sh->mu);
    }
    *out = sh;
    return ZS_OK;
fail:
    free(sh->ckpts);
    zs_pool_destroy(sh->pool);
    zs_pool_destroy(sh->spec_pool);
    zs_store_close(sh->store);
    zs__state_free(&sh->st);
    free_chunk_tables(sh);
    zs_nvme_close(sh->nvme);
    zs_budget_deinit(&sh->budget);
    free(sh->data_dir);
    free(sh->server_id);
    free(sh);
    return rc;
}

void zs_shard_shutdown(zs_shard_t *sh)
{
    pthread_mutex_lock(&sh->mu);
    sh->stopping = 1;
    sh->spec.abort = 1; /* a running speculative batch stops at its next block */
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

void zs_shard_destroy(zs_shard_t *sh)
{
    if (!sh)
        return;
    zs_shard_shutdown(sh);
    pthread_join(sh->opt_thread, NULL); /* finishes a pending pass first */
    if (sh->spec_thread_ok)
        pthread_join(sh->spec_thread, NULL);
    zs_pool_destroy(sh->pool);
    zs_pool_destroy(sh->spec_pool);
    pthread_mutex_lock(&sh->store_mu);
    zs_store_close(sh->store);
    pthread_mutex_unlock(&sh->store_mu);
    zs__state_free(&sh->st);
    while (sh->nv_reserved) { /* reserved and never done */
        zs__nvbounce_t *b = sh->nv_reserved;
        sh->nv_reserved = b->next;
        zs_nvme_mem_free(b->data, b->bytes);
        free(b);
    }
    free_chunk_tables(sh);
    zs_nvme_close(sh->nvme); /* after its state's file is gone; releases the lock */
    for (int p = 0; p < 2; p++)
        zs__stage_reset(sh, p);
    free(sh->user_meta);
    free(sh->ckpts);
    free(sh->groups);
    pthread_mutex_destroy(&sh->mu);
    pthread_mutex_destroy(&sh->store_mu);
    pthread_cond_destroy(&sh->cv);
    zs_budget_deinit(&sh->budget);
    free(sh->data_dir);
    free(sh->server_id);
    free(sh);
}

int zs_shard_info(zs_shard_t *sh, zs_shard_info_t *info, zs_err_t *err)
{
    memset(info, 0, sizeof *info);
    int rc = zs_shard_list(sh, &info->checkpoints, &info->ncheckpoints, err);
    if (rc)
        return rc;
    pthread_mutex_lock(&sh->mu);
    info->initialized = sh->initialized;
    info->id = sh->id;
    info->range_begin = sh->rb;
    info->range_end = sh->re;
    info->applied_step = sh->applied_step;
    info->optimizer_step = sh->optimizer_step;
    info->adam = sh->hp;
    info->counters = sh->c;
    info->counters.bytes_in = atomic_load_explicit(&sh->bytes_in, memory_order_relaxed);
    info->counters.bytes_out = atomic_load_explicit(&sh->bytes_out, memory_order_relaxed);
    info->counters.refused = atomic_load_explicit(&sh->refused, memory_order_relaxed);
    info->counters.spec_window_bytes = sh->spec.budget;
    if (sh->nvme) {
        zs_nvme_totals_t t;
        zs_nvme_totals(sh->nvme, &t);
        info->counters.nvme_read_bytes = t.read_bytes;
        info->counters.nvme_written_bytes = t.written_bytes;
        info->counters.nvme_grad_written_bytes = t.grad_written_bytes;
        info->counters.nvme_passes = t.passes;
        info->counters.nvme_pass_seconds = t.pass_seconds;
        info->counters.nvme_io_wait_seconds = t.io_wait_seconds;
    }
    info->mem_state = sh->budget_live;
    info->server_id = sh->server_id;
    zs_budget_get(&sh->budget, &info->mem_reserved, &info->mem_budget);
    info->nvme = sh->nvme != NULL;
    info->store_degraded = sh->store_degraded;
    memcpy(info->store_error, sh->store_error, sizeof info->store_error);
    info->ngroups = sh->ngroups;
    if (sh->ngroups)
        memcpy(info->groups, sh->groups, sh->ngroups * sizeof *sh->groups);
    pthread_mutex_unlock(&sh->mu);
    return ZS_OK;
}

static int identity_matches_locked(zs_shard_t *sh, const char *name, uint64_t P, zs_err_t *err)
{
    if (!sh->initialized)
        return ZS_OK;
    if (name && name[0] && strcmp(name, sh->id.model_name) != 0)
        return zs_err_set(err, ZS_ERR_STATE, "this server holds model '%s', not '%s'",
                          sh->id.model_name, name);
    if (P && P != sh->id.num_params)
        return zs_err_set(err, ZS_ERR_STATE, "this server holds %llu parameters of '%s', not %llu",
                          (unsigned long long)sh->id.num_params, sh->id.model_name,
                          (unsigned long long)P);
    return ZS_OK;
}

int zs_shard_check_identity(zs_shard_t *sh, const char *model_name, uint64_t num_params,
                            zs_err_t *err)
{
    pthread_mutex_lock(&sh->mu);
    int rc = identity_matches_locked(sh, model_name, num_params, err);
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

int zs_shard_has_nvme(const zs_shard_t *sh)
{
    return sh->nvme != NULL; /* fixed at create */
}

void zs_shard_count_refusal(zs_shard_t *sh)
{
    atomic_fetch_add_explicit(&sh->refused, 1, memory_order_relaxed);
}

void zs_shard_count_bytes(zs_shard_t *sh, uint64_t in, uint64_t out)
{
    atomic_fetch_add_explicit(&sh->bytes_in, in, memory_order_relaxed);
    atomic_fetch_add_explicit(&sh->bytes_out, out, memory_order_relaxed);
}

/* ---- Initialize ----------------------------------------------------------- */

struct zs_shard_init {
    zs_shard_t *sh;
    zs_shard_identity_t id;
    zs_adam_hparams_t hp;
    zs_group_range_t *groups; /* zs_shard_init_groups; NULL: none */
    size_t ngroups;
    uint64_t start_step, rb, re, next;
    zs__state_t st;
    uint64_t budget; /* bytes reserved for st */
    /* NVMe tier: the last reserved chunk waits in pend until the next call
     * (its caller fills it after zs_shard_init_reserve returns), then goes
     * into the tiles in order through fill. */
    float *pend;
    uint64_t pend_n, pend_cap, pend_budget; /* elements in pend, its room, its bytes of budget */
    zs__nvme_fill_t fill;
    int filling;
};

/* The NVMe tier: write the pending chunk's master weights into the tiles
 * (m and v zero). */
static int init_flush(zs_shard_init_t *in, zs_err_t *err)
{
    if (!in->pend_n)
        return ZS_OK;
    const float *const src[3] = {in->pend, NULL, NULL};
    int rc = zs__nvme_fill_add(&in->fill, src, in->pend_n, err);
    in->pend_n = 0;
    return rc;
}

int zs_shard_init_begin(zs_shard_t *sh, const zs_shard_identity_t *id, const zs_adam_hparams_t *hp,
                        uint64_t start_step, int overwrite, zs_shard_init_t **out, zs_err_t *err)
{
    *out = NULL;
    uint64_t rb, re;
    int rc = zs__identity_check(id, &rb, &re, err);
    if (!rc)
        rc = hparams_check(hp, err);
    if (!rc)
        rc = zs__step_check(start_step, "start_step", err);
    if (rc)
        return rc;
    pthread_mutex_lock(&sh->mu);
    if (sh->initialized && !overwrite &&
        (strcmp(sh->id.model_name, id->model_name) || sh->id.num_params != id->num_params ||
         sh->id.num_servers != id->num_servers || sh->id.server_index != id->server_index))
        rc = zs_err_set(err, ZS_ERR_EXISTS,
                        "this server already holds model '%s' (%llu params, server %u of %u); "
                        "set overwrite to replace it",
                        sh->id.model_name, (unsigned long long)sh->id.num_params,
                        sh->id.server_index, sh->id.num_servers);
    if (!rc && sh->initialized && overwrite &&
        (strcmp(sh->id.model_name, id->model_name) || sh->id.num_params != id->num_params ||
         sh->id.num_servers != id->num_servers || sh->id.server_index != id->server_index))
        ZS_WARN("init: overwrite: replacing model '%s' (%llu params, server %u of %u) by '%s' "
                "(%llu params, server %u of %u) once the stream completes",
                sh->id.model_name, (unsigned long long)sh->id.num_params, sh->id.server_index,
                sh->id.num_servers, id->model_name, (unsigned long long)id->num_params,
                id->server_index, id->num_servers);
    pthread_mutex_unlock(&sh->mu);
    if (rc)
        return rc;
    /* Both states exist until the swap: the new one must fit beside the old. */
    uint64_t bytes;
    int lowp;
    char what[96];
    snprintf(what, sizeof what, "a new state of %llu elements for Initialize",
             (unsigned long long)(re - rb));
    rc = zs__state_reserve(sh, re - rb, what, &bytes, &lowp, err);
    if (rc)
        return rc;
    zs_shard_init_t *in = calloc(1, sizeof *in);
    if (!in || zs__state_alloc_tier(sh, &in->st, re - rb, lowp, err)) {
        if (!in)
            zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        free(in);
        zs_budget_give(&sh->budget, bytes);
        zs_err_prefix(err, "Initialize of %llu elements: ", (unsigned long long)(re - rb));
        return err ? err->code : ZS_ERR_NOMEM;
    }
    if (in->st.nv && zs__nvme_fill_begin(&in->fill, in->st.nv, err)) {
        zs__state_free(&in->st);
        free(in);
        zs_budget_give(&sh->budget, bytes);
        return ZS_ERR_NOMEM;
    }
    in->filling = in->st.nv != NULL;
    in->budget = bytes;
    in->sh = sh;
    in->id = *id;
    in->hp = *hp;
    in->start_step = start_step;
    in->rb = rb;
    in->re = re;
    in->next = rb;
    *out = in;
    return ZS_OK;
}

int zs_shard_init_reserve(zs_shard_init_t *in, uint64_t offset, uint64_t count, float **dst,
                          zs_err_t *err)
{
    if (offset != in->next)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "init chunks must be contiguous: expected offset %llu, got %llu",
                          (unsigned long long)in->next, (unsigned long long)offset);
    if (count == 0 || count > in->re - offset)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "init chunk [%llu, +%llu) outside this server's range [%llu, %llu)",
                          (unsigned long long)offset, (unsigned long long)count,
                          (unsigned long long)in->rb, (unsigned long long)in->re);
    if (in->filling) { /* NVMe: the previous chunk to the tiles, this one to pend */
        int rc = init_flush(in, err);
        if (!rc && count > in->pend_cap) {
            rc = zs_budget_take(&in->sh->budget, count * 4 - in->pend_budget,
                                "an Initialize chunk for the NVMe tier", err);
            float *np = rc ? NULL : realloc(in->pend, count * 4);
            if (!rc && !np) {
                zs_budget_give(&in->sh->budget, count * 4 - in->pend_budget);
                rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory for an init chunk");
            }
            if (!rc) {
                in->pend = np;
                in->pend_cap = count;
                in->pend_budget = count * 4;
            }
        }
        if (rc)
            return rc;
        *dst = in->pend;
        in->pend_n = count;
        in->next = offset + count;
        return ZS_OK;
    }
    *dst = in->st.t[0] + (offset - in->rb);
    in->next = offset + count;
    return ZS_OK;
}

int zs_shard_init_groups(zs_shard_init_t *in, const zs_group_range_t *r, size_t n, zs_err_t *err)
{
    int rc = zs_groups_check(r, n, in->id.num_params, err);
    if (rc)
        return rc;
    zs_group_range_t *g = NULL;
    if (n && !(g = malloc(n * sizeof *g)))
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu parameter group ranges", n);
    if (n)
        memcpy(g, r, n * sizeof *g);
    free(in->groups);
    in->groups = g;
    in->ngroups = n;
    return ZS_OK;
}

void zs_shard_init_abort(zs_shard_init_t *in)
{
    if (!in)
        return;
    free(in->groups);
    if (in->filling)
        zs__nvme_fill_end(&in->fill);
    free(in->pend);
    zs_budget_give(&in->sh->budget, in->pend_budget);
    zs__state_free(&in->st);
    zs_budget_give(&in->sh->budget, in->budget);
    free(in);
}

int zs_shard_init_end(zs_shard_init_t *in, zs_err_t *err)
{
    zs_shard_t *sh = in->sh;
    int rc;
    if (in->next != in->re) {
        rc = zs_err_set(err, ZS_ERR_STATE,
                        "init stream ended at element %llu of this server's range [%llu, %llu); "
                        "nothing was changed",
                        (unsigned long long)in->next, (unsigned long long)in->rb,
                        (unsigned long long)in->re);
        zs_shard_init_abort(in);
        return rc;
    }
    /* Zeroed only now: a stream that never completes never touches them. */
    if (in->filling) {
        rc = init_flush(in, err); /* the last chunk: every tile is written */
        if (rc) {
            zs_err_prefix(err, "Initialize: ");
            zs_shard_init_abort(in);
            return rc;
        }
    } else {
        memset(in->st.t[1], 0, (in->re - in->rb) * 4);
        memset(in->st.t[2], 0, (in->re - in->rb) * 4);
    }
    pthread_mutex_lock(&sh->mu);
    zs__shard_wait_idle(sh);
    rc = zs__shard_install(sh, &in->id, &in->hp, in->groups, in->ngroups, &in->st, in->start_step,
                           0, err);
    if (rc == ZS_OK) { /* the new state's reservation replaces the old one's */
        zs_budget_give(&sh->budget, sh->budget_live);
        sh->budget_live = in->budget;
        in->budget = 0;
    }
    if (rc == ZS_OK) { /* a new run: its checkpoints replace same-step ones of older runs */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sh->run_id = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
                     ((uint64_t)getpid() << 40) ^ (sh->run_id * 0x9E3779B97F4A7C15ull);
    }
    pthread_mutex_unlock(&sh->mu);
    if (rc == ZS_OK)
        ZS_INFO("init: model '%s', %llu params, server %u of %u owns [%llu, %llu), step %llu",
                in->id.model_name, (unsigned long long)in->id.num_params, in->id.server_index,
                in->id.num_servers, (unsigned long long)in->rb, (unsigned long long)in->re,
                (unsigned long long)in->start_step);
    zs_shard_init_abort(in);
    return rc;
}

/* ---- Push ------------------------------------------------------------------ */

int zs__shard_require_init(zs_shard_t *sh, zs_err_t *err)
{
    if (sh->stopping)
        return zs_err_set(err, ZS_ERR_CANCELLED, "server shutting down");
    if (sh->tier_failed)
        return zs_err_set(err, ZS_ERR_IO, "%s", sh->tier_error);
    if (!sh->initialized)
        return zs_err_set(err, ZS_ERR_STATE,
                          "server holds no model yet: call Initialize or Restore first");
    return ZS_OK;
}

int zs__shard_check_range(zs_shard_t *sh, uint64_t offset, uint64_t count, zs_err_t *err)
{
    if (count == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "empty range (count 0)");
    if (offset < sh->rb || offset >= sh->re || count > sh->re - offset)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "%llu elements from %llu reach outside this server's range [%llu, %llu)",
                          (unsigned long long)count, (unsigned long long)offset,
                          (unsigned long long)sh->rb, (unsigned long long)sh->re);
    return ZS_OK;
}

int zs_shard_check_range(zs_shard_t *sh, uint64_t offset, uint64_t count, zs_err_t *err)
{
    pthread_mutex_lock(&sh->mu);
    int rc = zs__shard_require_init(sh, err);
    if (!rc)
        rc = zs__shard_check_range(sh, offset, count, err);
    pthread_mutex_unlock(&sh->mu);
    return rc;
}
