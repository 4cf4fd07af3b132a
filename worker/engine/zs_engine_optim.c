/*
 * zs_engine_optim.c - the optimizer part of a step: global gradient norm and
 * overflow (sum of squares on the device, all-reduced), loss-scale update,
 * clipping coefficient, learning rate, then AdamW on this worker's
 * partition on the compute stream (same kernel as the servers) or, with
 * offload, push / commit / pull through the shard servers; finally the
 * parameter all-gather (stages 0-2) or the persistent re-gather (stage 3).
 * The layers read the 16-bit parameters themselves or fp32 views cast per
 * layer at use (zs__eng_layer_ptrs), so only the stored parameters are
 * brought up to date here. The norm is
 * one fp64 partial per segment (with offload at stages 2-3 summed as each
 * bucket was reduced), added on the host in segment order.
 *
 * With offload, rank 0 commits for everyone after every worker's pushes
 * are done; the servers' commit is idempotent, so a retry is harmless.
 * Pulled partitions land in pinned staging and are copied to the device on
 * the copy stream (they are pulled into place where the host can write the
 * partition: stage 3 with offload_param, a host-addressable device). With
 * stream_pulls the pulls go on in the background after the step and the
 * next step's forward lands them (zs_engine_pull.c); with the delayed
 * update (zs_engine_delay.c) an update lands at the end of the next step.
 * All workers agree on every
 * error (an all-reduce of failure flags), so no rank is left waiting in a
 * collective.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zs_engine_internal.h"
#include "zs_sched.h"

/* Make `s` wait for everything enqueued so far on the comm stream. */
static int wait_comm(zs_engine_t *e, zs_stream_t *s, zs_err_t *err)
{
    ZS_ENG_TRY(zs_dev_event_record(e->ev_reduced, e->comm, err));
    return zs_dev_stream_wait(s, e->ev_reduced, err);
}

/* AdamW over n elements of the flat space from global element g (state at
 * master/exp_avg/exp_avg_sq + o, gradients and parameters at grad/param),
 * one kernel call per parameter-group range it crosses, each with that
 * range's weight decay: bitwise what the servers compute for the same
 * elements (server/zs_shard.c cuts at the same ends). */
static int adamw_groups(zs_engine_t *e, const zs_adam_step_t *as, uint64_t g, uint64_t o,
                        char *grad, char *param, uint64_t n, zs_err_t *err)
{
    for (uint64_t i = 0; i < n;) {
        zs_adam_hparams_t hp;
        zs_adam_step_t st;
        uint64_t k = zs_groups_piece(e->groups, e->ngroups, NULL, 0, &e->cfg.adam, as, g + i, n - i,
                                     &hp, &st);
        ZS_ENG_TRY(zs_dev_adamw(e->compute, &hp, &st, e->master + o + i, e->exp_avg + o + i,
                                e->exp_avg_sq + o + i, grad + i * e->esz, e->dt, param + i * e->esz,
                                e->dt, (size_t)k, err));
        i += k;
    }
    return ZS_OK;
}

/* AdamW on this worker's partition; with the delayed update the new 16-bit
 * parameters go to pdelay (stages 1-2), landed at the end of the next
 * step. */
static int update_in_process(zs_engine_t *e, const zs_adam_step_t *as, int delayed, zs_err_t *err)
{
    ZS_ENG_TRY(wait_comm(e, e->compute, err));
    for (int k = 0; k < e->ns; k++) {
        zs__seg_t *s = &e->s[k];
        if (e->stage == 0) { /* replicated optimizer over the full segment */
            uint64_t o = s->pbase;
            ZS_ENG_TRY(adamw_groups(e, as, s->off, o, zs__at(e, e->grads, o),
                                    zs__at(e, e->params, o), s->n, err));
            continue;
        }
        uint64_t o = s->qbase, n = s->ve - s->vb;
        if (e->pnv) { /* offload_param nvme: read, update, write back */
            void *p;
            if (!n)
                continue;
            ZS_ENG_TRY(zs__pnv_begin(e, s, 1, &p, err));
            ZS_ENG_TRY(adamw_groups(e, as, s->off + s->vb, o, zs__eng_grad_part(e, s), p, n, err));
            ZS_ENG_TRY(zs_dev_stream_sync(e->compute, err));
            ZS_ENG_TRY(zs__pnv_end(e, s, p, 1, NULL, err));
            continue;
        }
        ZS_ENG_TRY(adamw_groups(e, as, s->off + s->vb, o, zs__eng_grad_part(e, s),
                                delayed ? zs__at(e, e->pdelay, o) : zs__eng_param_part(e, s), n,
                                err));
    }
    return zs_dev_stream_sync(e->compute, err);
}

static int update_offload(zs_engine_t *e, const zs_step_scalars_t *sc, zs_step_stats_t *st,
                          zs_err_t *err)
{
    /* The gradient partitions were queued for push as each bucket became
     * final (zs_engine_step.c); wait for the last of them. */
    double t0 = zs__eng_now_ms();
    int rc = zs__eng_push_wait(e, err);
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    double t1 = zs__eng_now_ms();
    if (e->wrank == 0)
        rc = zs_client_commit(e->client, sc, err);
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    double t2 = zs__eng_now_ms();
    st->ms_opt_push = t1 - t0;
    st->ms_opt_commit = t2 - t1;
    if (zs__eng_delayed(e, sc->step)) { /* land step - 1's; pull this one's meanwhile */
        ZS_ENG_TRY(zs__eng_delay_land(e, err));
        if (!sc->skip)
            zs__eng_delay_begin(e, sc->step);
        st->ms_opt_pull = zs__eng_now_ms() - t2;
        return ZS_OK;
    }
    int direct = zs__eng_pull_in_place(e);
    if (direct && !sc->skip)
        ZS_ENG_TRY(zs__eng_agree(e, zs__eng_pull_quiesce(e, err), err));
    if (e->cfg.offload_stream) { /* streamed: the next step's forward lands them */
        if (!sc->skip)
            zs__eng_pull_begin(e, sc->step);
        return ZS_OK;
    }
    for (int k = 0; k < e->ns && !rc && !sc->skip; k++) {
        zs__seg_t *s = &e->s[k];
        if (s->ve <= s->vb)
            continue;
        void *dst = direct ? zs__eng_param_part(e, s) : zs__at(e, e->staging, s->qbase);
        rc = zs_client_pull(e->client, sc->step, s->off + s->vb, s->off + s->ve, dst, e->dt, NULL,
                            err);
        if (!rc && !direct) /* to the device while the next segment is pulled */
            rc = zs__eng_param_set(e, s, dst, err);
    }
    if (!rc)
        rc = zs_dev_stream_sync(e->copy, err);
    st->ms_opt_pull = zs__eng_now_ms() - t2;
    return zs__eng_agree(e, rc, err);
}

/* Sum of squares of this worker's gradient partition (each worker sums its
 * partition, stage 0 too, so nothing is counted twice) and the non-finite
 * flag: per segment into normacc[2k..2k+1] on the comm stream after the
 * reductions (with grads_offloaded each bucket was summed as it was
 * reduced, zs_engine_step.c), then added on the host in segment order. */
static int local_sumsq(zs_engine_t *e, double *ss, int *nonfinite, zs_err_t *err)
{
    size_t nbytes = 2 * (size_t)e->ns * sizeof(double);
    if (!zs__eng_grads_offloaded(e)) {
        ZS_ENG_TRY(zs_dev_memset(e->comm, e->normacc, 0, nbytes, err));
        for (int k = 0; k < e->ns; k++) {
            zs__seg_t *s = &e->s[k];
            if (s->ve > s->vb)
                ZS_ENG_TRY(zs_dev_sumsq(e->comm, zs__eng_grad_part(e, s), e->dt, s->ve - s->vb,
                                        e->normacc + 2 * k, err));
        }
    }
    ZS_ENG_TRY(zs_dev_memcpy(e->comm, e->normhost, e->normacc, nbytes, err));
    ZS_ENG_TRY(zs_coll_sync(e->coll, err));
    *ss = 0;
    *nonfinite = 0;
    for (int k = 0; k < e->ns; k++) {
        *ss += e->normhost[2 * k];
        *nonfinite |= e->normhost[2 * k + 1] != 0.0;
    }
    return ZS_OK;
}

/* The step's gradient scale: 1 / (loss scale * W * accumulation). One
 * function for the real and the expected scalars (bitwise equal). */
static float step_grad_scale(const zs_engine_t *e)
{
    double gas = (double)e->cfg.gradient_accumulation_steps;
    float grad_scale = (float)(1.0 / (e->ls.scale * e->Wd * gas));
    if (e->debug & ZS_ENGINE_DEBUG_GRAD_SCALE2)
        grad_scale *= 2.0f;
    return grad_scale;
}

void zs__eng_expect(const zs_engine_t *e, uint64_t step, zs_step_scalars_t *sc)
{
    sc->step = step;
    sc->grad_scale = step_grad_scale(e);
    sc->clip_coef = 1.0f;
    sc->lr = (float)zs_sched_lr(&e->cfg.sched, e->cfg.adam.lr, (int64_t)e->t);
    sc->skip = 0;
    sc->param_dtype = e->dt == ZS_DTYPE_F32 ? ZS_DTYPE_NONE : e->dt;
}

int zs__eng_optimize(zs_engine_t *e, zs_step_stats_t *st, zs_err_t *err)
{
    double t0 = zs__eng_now_ms(), ss;
    int nonfinite;
    ZS_ENG_TRY(local_sumsq(e, &ss, &nonfinite, err));
    float tot[2] = {(float)ss, (float)nonfinite};
    /* over the partitions: with MiCS the shard group's (its replicas hold
     * the same partitions) */
    ZS_ENG_TRY(zs_coll_all_reduce_host(e->pc, tot, 2, ZS_DTYPE_F32, ZS_OP_SUM, err));
    float grad_scale = step_grad_scale(e);
    double norm = sqrt((double)tot[0]) * grad_scale;
    int overflow = !isfinite(norm) || tot[1] != 0.0f;
    st->grad_norm = overflow && isfinite(norm) ? INFINITY : norm;
    st->ms_comm += zs__eng_now_ms() - t0;

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

    double t1 = zs__eng_now_ms();
    int rc = ZS_OK;
    zs_adam_step_t as = {(float)lr, (int64_t)e->t + 1, grad_scale, clip_coef};
    int delayed = zs__eng_delayed(e, st->step);
    if (e->offload) {
        zs_step_scalars_t sc = {st->step,  grad_scale,
                                clip_coef, (float)lr,
                                skip,      e->dt == ZS_DTYPE_F32 ? ZS_DTYPE_NONE : e->dt};
        /* What the pushes stated: equal scalars keep the servers' speculative
         * update (a hit), others roll it back. */
        zs_step_scalars_t ex;
        zs__eng_expect(e, st->step, &ex);
        int match = memcmp(&ex.grad_scale, &sc.grad_scale, 4) == 0 &&
                    memcmp(&ex.clip_coef, &sc.clip_coef, 4) == 0 &&
                    memcmp(&ex.lr, &sc.lr, 4) == 0 && !sc.skip;
        if (zs__eng_speculating(e))
            st->spec = match ? 1 : -1;
        /* Every worker agrees on the scalars, so on this too. */
        e->spec_miss = !match;
        rc = update_offload(e, &sc, st, err);
    } else {
        if (delayed) /* step - 1's update first (a skipped step too) */
            rc = zs__eng_delay_land(e, err);
        if (!rc && !skip)
            rc = update_in_process(e, &as, delayed, err);
        if (!rc && !skip && delayed)
            zs__eng_delay_begin(e, st->step);
    }
    st->ms_optimizer += zs__eng_now_ms() - t1;
    if (rc)
        return rc;
    if (!skip)
        e->t++;
    double t2 = zs__eng_now_ms();
    /* streamed pulls all-gather each segment as it lands, a delayed update
     * when it lands (zs__eng_delay_land) */
    rc = skip || delayed || (e->offload && e->cfg.offload_stream) ? ZS_OK
                                                                  : zs__eng_after_update(e, err);
    st->ms_comm += zs__eng_now_ms() - t2;
    return rc;
}

int zs__eng_after_update(zs_engine_t *e, zs_err_t *err)
{
    if (e->stage == 3) { /* refresh the resident copies */
        for (int k = 0; k < e->ns; k++)
            if (e->s[k].persistent && e->s[k].n) {
                zs__eng_drop_seg(e, k);
                ZS_ENG_TRY(zs__eng_gather_seg(e, k, err));
            }
        return ZS_OK;
    }
    /* The partitions were written by the optimizer (compute) or by pulled
     * parameters (copy): the gathers wait for both. */
    ZS_ENG_TRY(zs_dev_event_record(e->ev_compute, e->compute, err));
    ZS_ENG_TRY(zs_dev_event_record(e->ev_copy, e->copy, err));
    ZS_ENG_TRY(zs_dev_stream_wait(e->comm, e->ev_compute, err));
    ZS_ENG_TRY(zs_dev_stream_wait(e->comm, e->ev_copy, err));
    if (e->stage > 0 || e->offload) {
        /* every segment at once: one group (NCCL fuses the launches) */
        ZS_ENG_TRY(zs_coll_group_start(e->pc, err));
        int rc = ZS_OK;
        for (int k = 0; k < e->ns && rc == ZS_OK; k++) {
            zs__seg_t *s = &e->s[k];
            if (s->n)
                rc = zs_coll_all_gather(e->pc, zs__at(e, e->params, s->pbase), s->part, e->dt, NULL,
                                        NULL, err);
        }
        int rc_end = zs_coll_group_end(e->pc, rc ? NULL : err);
        ZS_ENG_TRY(rc ? rc : rc_end);
    }
    /* The next step's forward reads the gathered parameters. */
    return wait_comm(e, e->compute, err);
}
