/*
 * zs_engine.c - engine layout and lifecycle: buckets and partitions, model
 * state buffers, initial parameters, stage-3 gather/release, memory
 * accounting, parameter export. The step itself is in zs_engine_step.c and
 * zs_engine_optim.c; servers in zs_engine_ckpt.c.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cast.h"
#include "zs_engine_internal.h"
#include "zs_log.h"

void *zs__eng_alloc(zs_engine_t *e, size_t bytes)
{
    void *p = NULL;
    for (int i = 0; i < 8 && !p; i++)
        if (e->cache[i].p && e->cache[i].bytes == bytes) {
            p = e->cache[i].p;
            e->cache[i].p = NULL;
            memset(p, 0, bytes);
        }
    if (!p)
        p = calloc(1, bytes ? bytes : 1);
    if (p) {
        e->buffer_bytes += bytes;
        if (e->buffer_bytes > e->buffer_peak)
            e->buffer_peak = e->buffer_bytes;
    }
    return p;
}

void zs__eng_free(zs_engine_t *e, void *p, size_t bytes)
{
    if (!p)
        return;
    e->buffer_bytes -= bytes;
    for (int i = 0; i < 8; i++)
        if (!e->cache[i].p) {
            e->cache[i].p = p;
            e->cache[i].bytes = bytes;
            return;
        }
    free(p); /* cache full */
}

int zs__eng_agree(zs_engine_t *e, int rc, zs_err_t *err)
{
    float f = rc ? 1.0f : 0.0f;
    int r2 = zs_coll_all_reduce(e->coll, &f, &f, 1, ZS_DTYPE_F32, ZS_OP_MAX, NULL, rc ? NULL : err);
    if (rc)
        return rc;
    if (r2)
        return r2;
    return f > 0 ? zs_err_set(err, ZS_ERR_INTERNAL, "another worker failed (see its log)") : ZS_OK;
}

/* Group whole consecutive layers into buckets of about `cap` elements. */
static int make_buckets(zs_engine_t *e, uint64_t cap, zs_err_t *err)
{
    e->b = calloc((size_t)e->nlayers, sizeof *e->b);
    if (!e->b)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    int nb = 0;
    uint64_t off = 0;
    for (int i = 0; i < e->nlayers; i++) {
        size_t np = e->m.nparams[i];
        if (nb == 0 || (e->b[nb - 1].n > 0 && e->b[nb - 1].n + np > cap)) {
            zs__bucket_t *b = &e->b[nb++];
            b->first = i;
            b->off = off;
        }
        zs__bucket_t *b = &e->b[nb - 1];
        b->last = i;
        b->n += np;
        e->layer_off[i] = off;
        e->layer_bucket[i] = nb - 1;
        off += np;
    }
    e->nb = nb;
    e->P = off;
    uint64_t pbase = 0, W = (uint64_t)e->W;
    for (int k = 0; k < nb; k++) {
        zs__bucket_t *b = &e->b[k];
        b->n_pad = (b->n + W - 1) / W * W;
        b->part = b->n_pad / W;
        b->pbase = pbase;
        b->qbase = pbase / W;
        pbase += b->n_pad;
        uint64_t s = (uint64_t)e->rank * b->part, t = s + b->part;
        b->vb = s < b->n ? s : b->n;
        b->ve = t < b->n ? t : b->n;
        b->fwd_until = b->last;
        b->persistent = e->stage == 3 && (int64_t)b->n <= e->cfg.stage3_param_persistence_threshold;
    }
    e->Ppad = pbase;
    /* A bucket used by a later layer stays gathered until that layer. */
    for (int i = 0; i < e->nlayers; i++)
        for (int d = 0; e->deps[i][d] >= 0; d++) {
            zs__bucket_t *b = &e->b[e->layer_bucket[e->deps[i][d]]];
            if (i > b->fwd_until)
                b->fwd_until = i;
        }
    return ZS_OK;
}

static int copy_model(zs_engine_t *e, const zs_model_t *m, zs_err_t *err)
{
    e->m = *m;
    e->nlayers = m->nlayers;
    if (m->nlayers <= 0 || !m->nparams || !m->forward || !m->backward || !m->init_params ||
        !m->load_batch || !m->loss)
        return zs_err_set(err, ZS_ERR_INVALID, "model is incomplete (layers or callbacks missing)");
    e->layer_off = calloc((size_t)m->nlayers, sizeof *e->layer_off);
    e->layer_bucket = calloc((size_t)m->nlayers, sizeof *e->layer_bucket);
    e->deps = calloc((size_t)m->nlayers, sizeof *e->deps);
    if (!e->layer_off || !e->layer_bucket || !e->deps)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->nlayers; i++) {
        int n = 0;
        while (m->deps && m->deps[i] && m->deps[i][n] >= 0)
            n++;
        e->deps[i] = malloc((size_t)(n + 1) * sizeof **e->deps);
        if (!e->deps[i])
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        for (int k = 0; k < n; k++) {
            int d = m->deps[i][k];
            if (d < 0 || d >= i)
                return zs_err_set(err, ZS_ERR_INVALID,
                                  "layer %d depends on layer %d: only lower layers allowed", i, d);
            e->deps[i][k] = d;
        }
        e->deps[i][n] = -1;
        if (n > e->maxdeps)
            e->maxdeps = n;
    }
    return ZS_OK;
}

/* Fill the model state from the model's initial parameters. */
static int init_state(zs_engine_t *e, zs_err_t *err)
{
    float *w = malloc((e->P ? e->P : 1) * sizeof *w);
    if (!w)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %llu initial parameters",
                          (unsigned long long)e->P);
    int rc = ZS_OK;
    for (int i = 0; i < e->nlayers && !rc; i++)
        if (e->m.nparams[i])
            rc = e->m.init_params(e->m.self, i, w + e->layer_off[i], err);
    for (int k = 0; k < e->nb && !rc; k++) {
        zs__bucket_t *b = &e->b[k];
        const float *src = w + b->off;
        if (e->stage < 3)
            zs_cast(zs__at(e, e->params, b->pbase), e->dt, src, ZS_DTYPE_F32, b->n);
        else
            zs_cast(zs__at(e, e->params, b->qbase), e->dt, src + b->vb, ZS_DTYPE_F32,
                    b->ve - b->vb);
        if (e->master && e->stage == 0)
            memcpy(e->master + b->pbase, src, b->n * 4);
        else if (e->master)
            memcpy(e->master + b->qbase, src + b->vb, (b->ve - b->vb) * 4);
    }
    free(w);
    return rc;
}

/* Keys the config module reads but the engine does not act on: name each
 * one set away from its default (rank 0, once), so nothing is silently
 * misread. */
static void warn_unhonoured(const zs_engine_t *e)
{
    const zs_config_t *c = &e->cfg;
    zs_config_t d;
    zs_config_defaults(&d);
    if (e->rank != 0)
        return;
    if (!c->reduce_scatter && e->stage >= 2)
        ZS_WARN("zero_optimization.reduce_scatter=false not implemented: stage %d always "
                "reduce-scatters gradients",
                e->stage);
    if (!c->allgather_partitions)
        ZS_WARN("zero_optimization.allgather_partitions=false not implemented: parameters are "
                "all-gathered");
    if (c->round_robin_gradients)
        ZS_WARN("zero_optimization.round_robin_gradients not implemented: ignored");
    if (c->stage3_max_live_parameters != d.stage3_max_live_parameters ||
        c->stage3_max_reuse_distance != d.stage3_max_reuse_distance)
        ZS_WARN("zero_optimization.stage3_max_live_parameters / stage3_max_reuse_distance not "
                "implemented: buckets are freed after use, prefetch is bounded by "
                "stage3_prefetch_bucket_size");
    if (c->stage3_gather_16bit_weights_on_model_save)
        ZS_WARN("zero_optimization.stage3_gather_16bit_weights_on_model_save not implemented: "
                "checkpoints keep fp32 master weights on the servers");
    if (c->sub_group_size != d.sub_group_size)
        ZS_WARN("zero_optimization.sub_group_size not implemented: the optimizer runs per "
                "bucket partition");
    if (!c->contiguous_gradients)
        ZS_WARN("zero_optimization.contiguous_gradients=false not implemented: gradients are "
                "always contiguous per bucket");
}

int zs_engine_create(const zs_engine_opts_t *o, const zs_model_t *model, zs_engine_t **out,
                     zs_err_t *err)
{
    *out = NULL;
    zs_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    e->cfg = *o->cfg;
    e->coll = o->coll;
    e->rank = o->coll->rank;
    e->W = o->coll->size;
    e->stage = e->cfg.stage;
    e->offload = e->cfg.offload_optimizer;
    e->dt = e->cfg.dtype;
    e->esz = zs_dtype_size(e->dt);
    snprintf(e->model_name, sizeof e->model_name, "%s", o->model_name ? o->model_name : "zs-model");
    warn_unhonoured(e);
    int rc = copy_model(e, model, err);
    uint64_t cap = (uint64_t)(e->cfg.reduce_bucket_size < e->cfg.allgather_bucket_size
                                  ? e->cfg.reduce_bucket_size
                                  : e->cfg.allgather_bucket_size);
    if (!rc && (e->stage < 0 || e->stage > 3 || e->esz == 0))
        rc = zs_err_set(err, ZS_ERR_INVALID, "stage %d / dtype %d not supported", e->stage, e->dt);
    if (!rc && e->offload && !o->servers)
        rc = zs_err_set(err, ZS_ERR_INVALID,
                        "offload_optimizer needs shard servers (--servers host:port,...)");
    if (!rc)
        rc = make_buckets(e, cap ? cap : 1, err);
    if (rc)
        goto fail;
    uint64_t full = e->Ppad, part = e->Ppad / (uint64_t)e->W;
    e->params = calloc(e->stage < 3 ? full : part ? part : 1, e->esz);
    e->grads = calloc(e->stage < 2 ? full : part ? part : 1, e->esz);
    if (e->stage < 3 && e->dt != ZS_DTYPE_F32)
        e->cparams = zs__eng_alloc(e, full * 4);
    if (!e->offload) {
        uint64_t n = e->stage == 0 ? full : part;
        e->master = calloc(n ? n : 1, 4);
        e->exp_avg = calloc(n ? n : 1, 4);
        e->exp_avg_sq = calloc(n ? n : 1, 4);
    }
    if (!e->params || !e->grads || (e->stage < 3 && e->dt != ZS_DTYPE_F32 && !e->cparams) ||
        (!e->offload && (!e->master || !e->exp_avg || !e->exp_avg_sq))) {
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory for the model state of %llu params",
                        (unsigned long long)e->P);
        goto fail;
    }
    zs_loss_scale_init(&e->ls, e->dt == ZS_DTYPE_F16 ? &e->cfg.fp16 : NULL);
    rc = init_state(e, err);
    if (rc)
        goto fail;
    if (o->servers) {
        zs_client_opts_t co = {o->servers, o->token, NULL, o->server_timeout_ms, 0};
        rc = zs_client_create(&co, &e->client, err);
        if (!rc && e->offload)
            rc = zs__eng_pusher_start(e, err);
        if (rc)
            goto fail;
    }
    rc = zs__eng_after_update(e, err);
    if (rc)
        goto fail;
    *out = e;
    return ZS_OK;
fail:
    zs_engine_destroy(e);
    return rc;
}

void zs_engine_destroy(zs_engine_t *e)
{
    if (!e)
        return;
    zs__eng_pusher_stop(e);
    for (int i = 0; i < 8; i++)
        free(e->cache[i].p);
    for (int k = 0; e->b && k < e->nb; k++) {
        zs__bucket_t *b = &e->b[k];
        if (b->gather_req)
            zs_coll_wait(e->coll, b->gather_req, NULL);
        if (b->rs_req)
            zs_coll_wait(e->coll, b->rs_req, NULL);
        if (b->gathered32 != b->gathered)
            free(b->gathered32);
        free(b->gathered);
        free(b->gscratch);
        free(b->rs_send);
        free(b->rs_recv);
    }
    zs_client_destroy(e->client);
    for (int i = 0; e->deps && i < e->nlayers; i++)
        free(e->deps[i]);
    free(e->deps);
    free(e->layer_off);
    free(e->layer_bucket);
    free(e->b);
    free(e->params);
    free(e->grads);
    free(e->cparams);
    free(e->master);
    free(e->exp_avg);
    free(e->exp_avg_sq);
    free(e);
}

uint64_t zs_engine_step_count(const zs_engine_t *e)
{
    return e->step;
}

uint64_t zs_engine_num_params(const zs_engine_t *e)
{
    return e->P;
}

/* ---- stage 3: gather and release -------------------------------------------- */

static int gather_start(zs_engine_t *e, int k, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    if (b->gathered || b->n == 0)
        return ZS_OK;
    b->gathered = zs__eng_alloc(e, b->n_pad * e->esz);
    if (!b->gathered)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory gathering bucket %d", k);
    return zs_coll_all_gather(e->coll, zs__at(e, e->params, b->qbase), b->gathered, b->part, e->dt,
                              &b->gather_req, err);
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

static int gather(zs_engine_t *e, int k, int next, zs_err_t *err);

int zs__eng_gather(zs_engine_t *e, int k, int next, zs_err_t *err)
{
    double t0 = mono_ms();
    int rc = gather(e, k, next, err);
    e->ms_gather += mono_ms() - t0;
    return rc;
}

static int gather(zs_engine_t *e, int k, int next, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    if (b->n == 0)
        return ZS_OK;
    ZS_ENG_TRY(gather_start(e, k, err));
    if (b->gather_req) {
        int rc = zs_coll_wait(e->coll, b->gather_req, err);
        b->gather_req = NULL;
        if (rc)
            return rc;
    }
    if (!b->gathered32) {
        if (e->dt == ZS_DTYPE_F32) {
            b->gathered32 = b->gathered; /* the gathered buffer is already fp32 */
        } else {
            b->gathered32 = zs__eng_alloc(e, b->n * 4);
            if (!b->gathered32)
                return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
            zs_cast(b->gathered32, ZS_DTYPE_F32, b->gathered, e->dt, b->n);
        }
    }
    /* Prefetch in the direction of `next` (forward or backward order) while
     * the buckets fit in stage3_prefetch_bucket_size: at least one, at most
     * four ahead, so a bounded number of requests is in flight. */
    if (next >= 0 && next < e->nb) {
        int dir = next > k ? 1 : -1, ahead = 0;
        uint64_t budget = (uint64_t)e->cfg.stage3_prefetch_bucket_size, used = 0;
        for (int j = next; j >= 0 && j < e->nb && ahead < 4; j += dir, ahead++) {
            if (ahead > 0 && used + e->b[j].n > budget)
                break;
            used += e->b[j].n;
            ZS_ENG_TRY(gather_start(e, j, err));
        }
    }
    return ZS_OK;
}

void zs__eng_release(zs_engine_t *e, int k)
{
    zs__bucket_t *b = &e->b[k];
    if (e->stage < 3 || b->persistent || !b->gathered || b->gather_req)
        return;
    if (b->gathered32 != b->gathered)
        zs__eng_free(e, b->gathered32, b->n * 4);
    zs__eng_free(e, b->gathered, b->n_pad * e->esz);
    b->gathered = NULL;
    b->gathered32 = NULL;
}

float *zs__eng_layer_params(zs_engine_t *e, int layer)
{
    zs__bucket_t *b = &e->b[e->layer_bucket[layer]];
    uint64_t rel = e->layer_off[layer] - b->off;
    if (e->stage == 3)
        return b->gathered32 ? b->gathered32 + rel : NULL;
    if (e->dt == ZS_DTYPE_F32)
        return (float *)e->params + b->pbase + rel;
    return e->cparams + b->pbase + rel;
}

/* ---- memory accounting -------------------------------------------------------- */

void zs_engine_mem(const zs_engine_t *e, zs_mem_t *mem)
{
    uint64_t full = e->Ppad, part = e->Ppad / (uint64_t)e->W;
    mem->params = (e->stage < 3 ? full : part) * e->esz;
    mem->grads = (e->stage < 2 ? full : part) * e->esz;
    mem->optimizer = e->offload ? 0 : (e->stage == 0 ? full : part) * 12;
    mem->buffers = e->buffer_peak;
    mem->host_params = 0;
    if (e->stage == 3 && e->cfg.offload_param) {
        mem->host_params = mem->params;
        mem->params = 0;
    }
}

void zs_engine_mem_expected(const zs_engine_t *e, zs_mem_t *mem)
{
    /* The seed formulas, bytes per parameter with Psi = Ppad: params 2 (or
     * 4 for fp32), grads likewise, optimizer 12 (fp32 master + m + v), each
     * divided by W where the stage partitions it. */
    double psi = (double)e->Ppad, W = (double)e->W, k = (double)e->esz;
    mem->params = (uint64_t)(e->stage >= 3 ? k * psi / W : k * psi);
    mem->grads = (uint64_t)(e->stage >= 2 ? k * psi / W : k * psi);
    mem->optimizer = e->offload ? 0 : (uint64_t)(e->stage >= 1 ? 12 * psi / W : 12 * psi);
    mem->buffers = 0;
    mem->host_params = 0;
    if (e->stage == 3 && e->cfg.offload_param) { /* 2 Psi / N moves to host memory */
        mem->host_params = mem->params;
        mem->params = 0;
    }
}

int zs_engine_print_mem(zs_engine_t *e, FILE *f, zs_err_t *err)
{
    zs_mem_t m;
    zs_engine_mem(e, &m);
    float mine[5] = {(float)m.params, (float)m.grads, (float)m.optimizer, (float)m.buffers,
                     (float)m.host_params};
    float *all = e->rank == 0 ? calloc((size_t)e->W * 5, sizeof *all) : NULL;
    float *recv = calloc((size_t)e->W * 5, sizeof *recv);
    if (!recv || (e->rank == 0 && !all)) {
        free(all);
        free(recv);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    int rc = zs_coll_all_gather(e->coll, mine, recv, 5, ZS_DTYPE_F32, NULL, err);
    if (rc == ZS_OK && e->rank == 0) {
        fprintf(f, "memory per worker (MB): stage %d, W=%d, %s, optimizer %s, P=%llu\n", e->stage,
                e->W, zs_dtype_name(e->dt), e->offload ? "on servers" : "in-process",
                (unsigned long long)e->P);
        fprintf(f, "  %-6s %10s %10s %10s %10s %10s %12s\n", "rank", "params", "grads", "optimizer",
                "buffers", "total", "host params");
        for (int r = 0; r < e->W; r++) {
            float *x = recv + 5 * r;
            fprintf(f, "  %-6d %10.2f %10.2f %10.2f %10.2f %10.2f %12.2f\n", r, x[0] / 1e6,
                    x[1] / 1e6, x[2] / 1e6, x[3] / 1e6, (x[0] + x[1] + x[2] + x[3]) / 1e6,
                    x[4] / 1e6);
        }
    }
    free(all);
    free(recv);
    return rc;
}

int zs_engine_get_params(zs_engine_t *e, float *out, zs_err_t *err)
{
    for (int k = 0; k < e->nb; k++) {
        zs__bucket_t *b = &e->b[k];
        if (e->stage < 3) {
            zs_cast(out + b->off, ZS_DTYPE_F32, zs__at(e, e->params, b->pbase), e->dt, b->n);
            continue;
        }
        int was = b->gathered != NULL;
        ZS_ENG_TRY(zs__eng_gather(e, k, -1, err));
        if (b->n)
            memcpy(out + b->off, b->gathered32, b->n * 4);
        if (!was)
            zs__eng_release(e, k);
    }
    return ZS_OK;
}
