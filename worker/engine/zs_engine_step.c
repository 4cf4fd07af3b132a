/*
 * zs_engine_step.c - one training step's compute and gradient reduction:
 * micro-batches of forward (stage 3 gathers buckets just in time, one
 * prefetched) and backward (gradients accumulate in a per-bucket fp32
 * scratch; a bucket is reduced as soon as the backward of its first layer
 * is done: stages 0-1 accumulate it into the full gradient, stages 2-3
 * start a non-blocking reduce-scatter, at most two in flight).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cast.h"
#include "zs_engine_internal.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

/* dst (dtype dt, n) += src (dtype sdt, n), summed in fp32, rounded to dt. */
static void accumulate(void *dst, zs_dtype_t dt, const void *src, zs_dtype_t sdt, uint64_t n)
{
    if (dt == ZS_DTYPE_F32 && sdt == ZS_DTYPE_F32) {
        float *d = dst;
        const float *s = src;
        for (uint64_t i = 0; i < n; i++)
            d[i] += s[i];
        return;
    }
    float a[256], b[256];
    for (uint64_t i = 0; i < n; i += 256) {
        size_t k = n - i < 256 ? (size_t)(n - i) : 256;
        size_t de = zs_dtype_size(dt), se = zs_dtype_size(sdt);
        zs_cast(a, ZS_DTYPE_F32, (char *)dst + i * de, dt, k);
        zs_cast(b, ZS_DTYPE_F32, (const char *)src + i * se, sdt, k);
        for (size_t j = 0; j < k; j++)
            a[j] += b[j];
        zs_cast((char *)dst + i * de, dt, a, ZS_DTYPE_F32, k);
    }
}

/* Finish bucket k's reduce-scatter: add this worker's part to its gradient. */
static int finish_rs(zs_engine_t *e, int k, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    int rc = zs_coll_wait(e->coll, b->rs_req, err);
    b->rs_req = NULL;
    if (rc == ZS_OK)
        accumulate(zs__at(e, e->grads, b->qbase), e->dt, b->rs_recv, e->dt, b->part);
    if (rc == ZS_OK && e->last_micro)
        rc = zs__eng_bucket_final(e, k, err);
    zs__eng_free(e, b->rs_send, b->n_pad * e->esz);
    zs__eng_free(e, b->rs_recv, b->part * e->esz);
    b->rs_send = b->rs_recv = NULL;
    return rc;
}

static int finish_oldest_rs(zs_engine_t *e, zs_err_t *err)
{
    int k = e->rs_order[0];
    e->rs_order[0] = e->rs_order[1];
    e->rs_inflight--;
    return finish_rs(e, k, err);
}

int zs__eng_bucket_final(zs_engine_t *e, int k, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    if (!e->pusher || b->ve <= b->vb)
        return ZS_OK;
    const void *src =
        e->stage < 2 ? zs__at(e, e->grads, b->pbase + b->vb) : zs__at(e, e->grads, b->qbase);
    return zs__eng_push_async(e, e->step + 1, b->off + b->vb, b->off + b->ve, src, err);
}

/* Bucket k's gradient of this micro-batch is complete (in gscratch). */
static int reduce_bucket(zs_engine_t *e, int k, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    if (!b->gscratch)
        return ZS_OK;
    int rc = ZS_OK;
    if (e->stage < 2) {
        accumulate(zs__at(e, e->grads, b->pbase), e->dt, b->gscratch, ZS_DTYPE_F32, b->n);
    } else {
        if (e->rs_inflight == 2 && (rc = finish_oldest_rs(e, err)))
            return rc;
        b->rs_send = zs__eng_alloc(e, b->n_pad * e->esz);
        b->rs_recv = zs__eng_alloc(e, b->part * e->esz);
        if (!b->rs_send || !b->rs_recv)
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory reducing bucket %d", k);
        zs_cast(b->rs_send, e->dt, b->gscratch, ZS_DTYPE_F32, b->n); /* padding stays 0 */
        rc = zs_coll_reduce_scatter(e->coll, b->rs_send, b->rs_recv, b->part, e->dt, &b->rs_req,
                                    err);
        if (rc)
            return rc;
        e->rs_order[e->rs_inflight++] = k;
    }
    zs__eng_free(e, b->gscratch, b->n * 4);
    b->gscratch = NULL;
    return rc;
}

/* fp32 gradient slot of layer i in its bucket's scratch (allocated zeroed). */
static float *grad_slot(zs_engine_t *e, int layer, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[e->layer_bucket[layer]];
    if (!b->gscratch && b->n) {
        b->gscratch = zs__eng_alloc(e, b->n * 4);
        if (!b->gscratch) {
            zs_err_set(err, ZS_ERR_NOMEM, "out of memory for gradients");
            return NULL;
        }
    }
    return b->gscratch ? b->gscratch + (e->layer_off[layer] - b->off) : NULL;
}

static int forward(zs_engine_t *e, float **ptrs, zs_err_t *err)
{
    for (int i = 0; i < e->nlayers; i++) {
        int k = e->layer_bucket[i];
        if (e->stage == 3) {
            if (i == e->b[k].first)
                ZS_ENG_TRY(zs__eng_gather(e, k, k + 1, err));
            for (int d = 0; e->deps[i][d] >= 0; d++)
                ZS_ENG_TRY(zs__eng_gather(e, e->layer_bucket[e->deps[i][d]], -1, err));
        }
        ptrs[0] = zs__eng_layer_params(e, i);
        for (int d = 0; e->deps[i][d] >= 0; d++)
            ptrs[1 + d] = zs__eng_layer_params(e, e->deps[i][d]);
        ZS_ENG_TRY(e->m.forward(e->m.self, i, ptrs, err));
        if (e->stage == 3 && i < e->nlayers - 1)
            for (int kb = 0; kb <= k; kb++)
                if (e->b[kb].fwd_until == i)
                    zs__eng_release(e, kb);
    }
    return ZS_OK;
}

static int backward(zs_engine_t *e, float dloss, float **ptrs, float **gptrs, zs_err_t *err)
{
    for (int i = e->nlayers - 1; i >= 0; i--) {
        int k = e->layer_bucket[i];
        if (e->stage == 3) {
            if (i == e->b[k].last)
                ZS_ENG_TRY(zs__eng_gather(e, k, k - 1, err));
            for (int d = 0; e->deps[i][d] >= 0; d++)
                ZS_ENG_TRY(zs__eng_gather(e, e->layer_bucket[e->deps[i][d]], -1, err));
        }
        ptrs[0] = zs__eng_layer_params(e, i);
        gptrs[0] = grad_slot(e, i, err);
        if (e->m.nparams[i] && !gptrs[0])
            return err->code;
        for (int d = 0; e->deps[i][d] >= 0; d++) {
            ptrs[1 + d] = zs__eng_layer_params(e, e->deps[i][d]);
            gptrs[1 + d] = grad_slot(e, e->deps[i][d], err);
            if (e->m.nparams[e->deps[i][d]] && !gptrs[1 + d])
                return err->code;
        }
        ZS_ENG_TRY(e->m.backward(e->m.self, i, ptrs, gptrs, dloss, err));
        if (i == e->b[k].first) {
            ZS_ENG_TRY(reduce_bucket(e, k, err));
            zs__eng_release(e, k);
        }
    }
    return ZS_OK;
}

int zs_engine_step(zs_engine_t *e, zs_step_stats_t *st, zs_err_t *err)
{
    memset(st, 0, sizeof *st);
    st->step = e->step + 1;
    st->loss_scale = e->ls.scale;
    memset(e->grads, 0, (e->stage < 2 ? e->Ppad : e->Ppad / (uint64_t)e->W) * e->esz);
    float **ptrs = calloc((size_t)(e->maxdeps + 1), sizeof *ptrs);
    float **gptrs = calloc((size_t)(e->maxdeps + 1), sizeof *gptrs);
    if (!ptrs || !gptrs) {
        free(ptrs);
        free(gptrs);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    int gas = (int)e->cfg.gradient_accumulation_steps, rc = ZS_OK;
    double loss = 0;
    for (int micro = 0; micro < gas && !rc; micro++) {
        e->last_micro = micro == gas - 1;
        zs_batch_ctx_t bc = {st->step,
                             micro,
                             gas,
                             e->rank,
                             e->W,
                             (int)e->cfg.micro_batch_per_gpu,
                             e->cfg.train_batch_size};
        double t0 = now_ms();
        e->ms_gather = 0;
        rc = e->m.load_batch(e->m.self, &bc, err);
        if (!rc)
            rc = forward(e, ptrs, err);
        if (!rc)
            loss += e->m.loss(e->m.self);
        double t1 = now_ms(), g_fwd = e->ms_gather;
        if (!rc)
            rc = backward(e, (float)e->ls.scale, ptrs, gptrs, err);
        /* A bucket's reduce-scatter must finish before the next micro-batch
         * starts another one for the same bucket. */
        while (e->rs_inflight > 0) {
            int r = finish_oldest_rs(e, err);
            if (!rc)
                rc = r;
        }
        /* Stage 3 gathers inside the passes count as collectives. */
        st->ms_forward += t1 - t0 - g_fwd;
        st->ms_backward += now_ms() - t1 - (e->ms_gather - g_fwd);
        st->ms_comm += e->ms_gather;
    }
    free(ptrs);
    free(gptrs);
    double t2 = now_ms();
    while (e->rs_inflight > 0) {
        int r = finish_oldest_rs(e, err);
        if (!rc)
            rc = r;
    }
    if (rc)
        return rc;
    if (e->stage < 2) /* DeepSpeed stages 0-1: one all-reduce of the full gradient */
        for (int k = 0; k < e->nb && !rc; k++) {
            rc = zs_coll_all_reduce(e->coll, zs__at(e, e->grads, e->b[k].pbase),
                                    zs__at(e, e->grads, e->b[k].pbase), e->b[k].n_pad, e->dt,
                                    ZS_OP_SUM, NULL, err);
            if (!rc) /* overlaps the push of bucket k with the next all-reduce */
                rc = zs__eng_bucket_final(e, k, err);
        }
    float l = (float)loss;
    if (!rc)
        rc = zs_coll_all_reduce(e->coll, &l, &l, 1, ZS_DTYPE_F32, ZS_OP_SUM, NULL, err);
    st->ms_comm += now_ms() - t2;
    if (rc)
        return rc;
    st->loss = (double)l / ((double)e->W * gas);
    rc = zs__eng_optimize(e, st, err);
    if (rc == ZS_OK)
        e->step = st->step;
    return rc;
}
