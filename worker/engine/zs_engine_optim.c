/*
 * zs_engine_optim.c - the optimizer part of a step: global gradient norm and
 * overflow (all-reduced), loss-scale update, clipping coefficient, learning
 * rate, then AdamW on this worker's partition (same kernel as the servers)
 * or, with offload, push / commit / pull through the shard servers; finally
 * the parameter all-gather (stages 0-2) or persistent re-gather (stage 3).
 *
 * With offload, rank 0 commits for everyone after a barrier (every worker
 * has pushed); the servers' commit is idempotent, so a retry is harmless.
 * All workers agree on every error (an all-reduce of failure flags), so no
 * rank is left waiting in a collective.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cast.h"
#include "zs_engine_internal.h"
#include "zs_sched.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

/* This worker's slice of bucket b in the gradient buffer. */
static void *grad_part(zs_engine_t *e, const zs__bucket_t *b)
{
    return e->stage < 2 ? zs__at(e, e->grads, b->pbase + b->vb) : zs__at(e, e->grads, b->qbase);
}

/* Where this worker's updated parameters of bucket b go. */
static void *param_part(zs_engine_t *e, const zs__bucket_t *b)
{
    return e->stage < 3 ? zs__at(e, e->params, b->pbase + b->vb) : zs__at(e, e->params, b->qbase);
}

static double sum_squares(const void *g, zs_dtype_t dt, uint64_t n)
{
    float buf[512];
    double s = 0;
    size_t esz = zs_dtype_size(dt);
    for (uint64_t i = 0; i < n; i += 512) {
        size_t k = n - i < 512 ? (size_t)(n - i) : 512;
        zs_cast(buf, ZS_DTYPE_F32, (const char *)g + i * esz, dt, k);
        for (size_t j = 0; j < k; j++)
            s += (double)buf[j] * buf[j];
    }
    return s;
}

static int update_in_process(zs_engine_t *e, const zs_adam_step_t *as)
{
    zs_dtype_t out_dt = e->dt;
    for (int k = 0; k < e->nb; k++) {
        zs__bucket_t *b = &e->b[k];
        if (e->stage == 0) { /* replicated optimizer over the full bucket */
            uint64_t o = b->pbase;
            zs_adam_update(&e->cfg.adam, as, e->master + o, e->exp_avg + o, e->exp_avg_sq + o,
                           zs__at(e, e->grads, o), e->dt, zs__at(e, e->params, o), out_dt,
                           (size_t)b->n);
            continue;
        }
        uint64_t o = b->qbase, n = b->ve - b->vb;
        if (n)
            zs_adam_update(&e->cfg.adam, as, e->master + o, e->exp_avg + o, e->exp_avg_sq + o,
                           grad_part(e, b), e->dt, param_part(e, b), out_dt, (size_t)n);
    }
    return ZS_OK;
}

static int update_offload(zs_engine_t *e, const zs_step_scalars_t *sc, zs_err_t *err)
{
    /* The gradient partitions were queued for push as each bucket became
     * final (zs_engine_step.c); wait for the last of them. */
    int rc = zs__eng_push_wait(e, err);
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    if (e->rank == 0)
        rc = zs_client_commit(e->client, sc, err);
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    for (int k = 0; k < e->nb && !rc && !sc->skip; k++) {
        zs__bucket_t *b = &e->b[k];
        if (b->ve > b->vb)
            rc = zs_client_pull(e->client, sc->step, b->off + b->vb, b->off + b->ve,
                                param_part(e, b), e->dt, NULL, err);
    }
    return zs__eng_agree(e, rc, err);
}

int zs__eng_optimize(zs_engine_t *e, zs_step_stats_t *st, zs_err_t *err)
{
    double t0 = now_ms();
    /* Global norm of the summed, still scaled gradient: each worker sums
     * its partition (stage 0 too, so nothing is counted twice). */
    double ss = 0;
    for (int k = 0; k < e->nb; k++)
        ss += sum_squares(grad_part(e, &e->b[k]), e->dt, e->b[k].ve - e->b[k].vb);
    float tot = (float)ss;
    ZS_ENG_TRY(zs_coll_all_reduce(e->coll, &tot, &tot, 1, ZS_DTYPE_F32, ZS_OP_SUM, NULL, err));
    double gas = (double)e->cfg.gradient_accumulation_steps;
    float grad_scale = (float)(1.0 / (e->ls.scale * e->W * gas));
    double norm = sqrt((double)tot) * grad_scale;
    int overflow = !isfinite(norm);
    st->grad_norm = norm;
    st->ms_comm += now_ms() - t0;

    int skip = overflow;
    if (e->dt == ZS_DTYPE_F16) {
        skip = zs_loss_scale_update(&e->ls, overflow);
        if (skip < 0) /* DeepSpeed raises here too: no smaller scale to try */
            return zs_err_set(err, ZS_ERR_RANGE,
                              "step %llu: gradient overflow at the minimum loss scale %g; "
                              "lower the learning rate or min_loss_scale",
                              (unsigned long long)st->step, e->ls.scale);
    }
    st->skipped = skip;
    double clip = e->cfg.gradient_clipping;
    float clip_coef = 1.0f;
    if (!skip && clip > 0 && clip / (norm + 1e-6) < 1.0)
        clip_coef = (float)(clip / (norm + 1e-6));
    double lr = zs_sched_lr(&e->cfg.sched, e->cfg.adam.lr, (int64_t)e->t);
    st->lr = lr;

    double t1 = now_ms();
    int rc = ZS_OK;
    zs_adam_step_t as = {(float)lr, (int64_t)e->t + 1, grad_scale, clip_coef};
    if (e->offload) {
        zs_step_scalars_t sc = {st->step,  grad_scale,
                                clip_coef, (float)lr,
                                skip,      e->dt == ZS_DTYPE_F32 ? ZS_DTYPE_NONE : e->dt};
        rc = update_offload(e, &sc, err);
    } else if (!skip) {
        rc = update_in_process(e, &as);
    }
    st->ms_optimizer += now_ms() - t1;
    if (rc)
        return rc;
    if (!skip)
        e->t++;
    double t2 = now_ms();
    rc = skip ? ZS_OK : zs__eng_after_update(e, err);
    st->ms_comm += now_ms() - t2;
    return rc;
}

int zs__eng_after_update(zs_engine_t *e, zs_err_t *err)
{
    for (int k = 0; k < e->nb; k++) {
        zs__bucket_t *b = &e->b[k];
        if (e->stage == 3) {
            if (b->persistent) { /* refresh the resident copy */
                if (b->gathered32 && b->gathered32 != b->gathered)
                    zs__eng_free(e, b->gathered32, b->n * 4);
                zs__eng_free(e, b->gathered, b->n_pad * e->esz);
                b->gathered = NULL;
                b->gathered32 = NULL;
                ZS_ENG_TRY(zs__eng_gather(e, k, -1, err));
            }
            continue;
        }
        if (e->stage > 0 || e->offload) {
            void *mine = zs__at(e, e->params, b->pbase + (uint64_t)e->rank * b->part);
            ZS_ENG_TRY(zs_coll_all_gather(e->coll, mine, zs__at(e, e->params, b->pbase), b->part,
                                          e->dt, NULL, err));
        }
        if (e->cparams)
            zs_cast(e->cparams + b->pbase, ZS_DTYPE_F32, zs__at(e, e->params, b->pbase), e->dt,
                    b->n);
    }
    return ZS_OK;
}
