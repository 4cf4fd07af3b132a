/*
 * zs_engine_step.c - one training step's compute and gradient reduction.
 *
 * Per micro-batch: the model's forward and backward are enqueued layer by
 * layer on the compute stream (stage 3 gathers each layer first, see
 * zs_engine_gather.c). Gradients of a bucket accumulate in an fp32 scratch
 * slot (zeroed when the bucket's first gradient arrives; stages 0-1 in fp32
 * accumulate straight into the full gradient instead). When the backward
 * of the bucket's first layer has been enqueued, the bucket is reduced:
 *   stages 0-1  the scratch is accumulated into the full gradient on the
 *               compute stream; the full gradient is all-reduced per bucket
 *               after the last micro-batch
 *   stages 2-3  the scratch (fp32) or its cast into a 16-bit comm slot is
 *               reduce-scattered in place, per segment, on the communication
 *               stream after an event of the compute stream; this worker's
 *               block is accumulated into its gradient partition on the same
 *               stream, overlapping the rest of backward
 *   stages 2-3  with offload_optimizer there is no gradient partition on the
 *   + offload   device: the block is summed into the norm on the last
 *               micro-batch and copied to pinned staging on the copy stream
 *               (stage_bucket), then pushed; with several micro-batches it
 *               is first accumulated into a device bucket partition (the
 *               earlier micro-batches' partial sums come back from staging)
 * Layers read their parameters in place (fp32, or 16-bit for a model that
 * accepts them: zs_model_t.set_param_dtype), or stages 0-2 in 16-bit cast
 * each layer (and its deps) into one view buffer just before its use
 * (zs__eng_layer_ptrs). With streamed pulls (stages 0-2) each layer's
 * segment is landed before its forward (zs_engine_pull.c).
 * A slot is reused only after the event recorded after its last consumer.
 * On the step's last micro-batch a bucket's partition is then final: with
 * offload (stages 0-1) it is copied to pinned staging on the copy stream and
 * queued for push (zs__eng_bucket_final).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zs_engine_internal.h"

/* Pick a free slot of `slots` (n) for owner k: round robin, waiting (on
 * stream `s`) for the event of its last use. */
static int take_slot(zs_engine_t *e, zs__slot_t *slots, int n, int *next, int k, zs_stream_t *s,
                     size_t bytes, int cat, int *out, zs_err_t *err)
{
    for (int t = 0; t < n; t++) {
        int i = (*next + t) % n;
        if (slots[i].owner >= 0)
            continue;
        if (!slots[i].p)
            ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, cat, bytes, &slots[i].p,
                                     cat == ZS_MEM_COMM    ? "reduce buffers"
                                     : cat == ZS_MEM_GRADS ? "gradient buckets"
                                                           : "gradient scratch",
                                     err));
        ZS_ENG_TRY(zs_dev_stream_wait(s, slots[i].ev, err));
        slots[i].owner = k;
        *next = (i + 1) % n;
        *out = i;
        return ZS_OK;
    }
    return zs_err_set(err, ZS_ERR_INTERNAL, "no free %s slot for bucket %d (of %d)",
                      cat == ZS_MEM_COMM ? "reduce" : "gradient", k, n);
}

/* Stages 0-1 in fp32 keep the full gradient in the layers' own precision:
 * no scratch slot and no accumulation pass are needed (the gradient is
 * zeroed at the start of the step and the layers accumulate into it). */
static int direct_grads(const zs_engine_t *e)
{
    return e->stage < 2 && e->dt == ZS_DTYPE_F32;
}

/* fp32 gradient pointer of layer i in its bucket's scratch slot (taking and
 * zeroing a slot on first use), or in the gradient itself (direct_grads). */
static float *grad_slot(zs_engine_t *e, int layer, zs_err_t *err)
{
    zs__seg_t *s = &e->s[e->layer_seg[layer]];
    zs__bucket_t *b = &e->b[s->bucket];
    if (direct_grads(e)) /* the layers accumulate straight into the full gradient */
        return (float *)e->grads + s->pbase + (e->layer_off[layer] - s->off);
    if (b->slot < 0) {
        int i;
        /* early buckets (tied deps) have their own pool: see zs__bucket_t */
        int lo = b->early ? e->ngen : 0, n = b->early ? e->ngslot - e->ngen : e->ngen;
        if (take_slot(e, e->gslot + lo, n, b->early ? &e->enext : &e->gnext, s->bucket, e->compute,
                      (size_t)(b->early ? e->early_pad : e->gen_pad) * 4, ZS_MEM_SCRATCH, &i, err))
            return NULL;
        i += lo;
        if (zs_dev_memset(e->compute, e->gslot[i].p, 0, b->npad * 4, err))
            return NULL;
        b->slot = i;
    }
    return (float *)e->gslot[b->slot].p + (s->pbase - b->gbase) + (e->layer_off[layer] - s->off);
}

/* Copy n elements of segment j's pushed partition into staging on the copy
 * stream, hashing its push messages as they land when zs__eng_sums_on. */
static int stage_copy(zs_engine_t *e, void *to, const void *from, uint64_t n, int j, zs_err_t *err)
{
    if (zs__eng_sums_on(e))
        return zs__eng_sums_write(e, e->copy, to, from, e->dt, n, j, j, e->step + 1, err);
    return zs_dev_memcpy(e->copy, to, from, n * e->esz, err);
}

/* Queue the pushes of bucket k's staged partition (its valid part of each
 * segment) for the coming step, each waiting for ev_staged[k]. */
static int push_bucket(zs_engine_t *e, const zs__bucket_t *b, int k, zs_err_t *err)
{
    if (e->rgroup != 0) /* MiCS: shard group 0's pushes cover the flat space once */
        return ZS_OK;
    for (int j = b->s0; j <= b->s1; j++) {
        zs__seg_t *s = &e->s[j];
        if (s->ve > s->vb)
            ZS_ENG_TRY(zs__eng_push_async(e, e->step + 1, s->off + s->vb, s->off + s->ve,
                                          zs__at(e, e->staging, s->qbase), e->ev_staged[k], j,
                                          err));
    }
    return ZS_OK;
}

/* Release slot i: its last consumer is the work enqueued on `s` so far. */
static int free_slot(zs__slot_t *slot, zs_stream_t *s, zs_err_t *err)
{
    if (!slot) /* the bucket used no slot (cast straight into staging) */
        return ZS_OK;
    slot->owner = -1;
    return zs_dev_event_record(slot->ev, s, err);
}

int zs__eng_bucket_final(zs_engine_t *e, int k, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    if (!e->pusher)
        return ZS_OK;
    /* The partition was finished on the comm stream (reduce-scatter or
     * all-reduce); the copy stream stages it once that is done. */
    ZS_ENG_TRY(zs_dev_event_record(e->ev_reduced, e->comm, err));
    ZS_ENG_TRY(zs_dev_stream_wait(e->copy, e->ev_reduced, err));
    for (int j = b->s0; j <= b->s1; j++) {
        zs__seg_t *s = &e->s[j];
        if (s->ve > s->vb)
            ZS_ENG_TRY(stage_copy(e, zs__at(e, e->staging, s->qbase), zs__eng_grad_part(e, s),
                                  s->ve - s->vb, j, err));
    }
    ZS_ENG_TRY(zs_dev_event_record(e->ev_staged[k], e->copy, err));
    return push_bucket(e, b, k, err);
}

/* grads_offloaded (stages 2-3 with offload_optimizer): this micro-batch's
 * reduced blocks of bucket k (this worker's part of each segment, in the
 * reduce buffer `buf` of slot `used`, n_pad elements of dt per segment)
 * leave the device for pinned staging on the copy stream.
 *
 * One micro-batch per step (gas 1): straight from the reduce buffer, after
 * the comm stream summed each segment's squares into normacc; `used` is
 * freed after the copy's event. (The in-process path adds the block to a
 * zeroed partition; 0 + x == x except that -0 becomes +0, which AdamW and
 * the norm treat alike, so the parameters stay bitwise equal.)
 *
 * gas > 1: the blocks are added on the comm stream to the partial sums of
 * the earlier micro-batches in a device bucket partition (an aslot): zeroed
 * on the first micro-batch, else brought back from pinned staging
 * (DeepSpeed's offload does the same round trip,
 * async_accumulate_grad_in_cpu_via_gpu), so the arithmetic is the device's
 * dt += dt of the in-process path, bit for bit. On the last micro-batch
 * each segment's sum of squares goes to normacc there, before the gradient
 * leaves. The aslot is reused after its staging copy's event.
 *
 * On the last micro-batch the staged ranges are queued for push. */
static int stage_bucket(zs_engine_t *e, int k, void *buf, zs__slot_t *used, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    uint64_t W = (uint64_t)e->W;
    int direct = e->first_micro && e->last_micro, i = -1;
    void *src = buf;     /* what the copy stream stages: n_pad-strided blocks, or the aslot */
    uint64_t stride = W; /* segment s's block at (pbase - gbase) / W * stride + offset */
    if (!direct) {
        ZS_ENG_TRY(take_slot(e, e->aslot, e->ncslot, &e->anext, k, e->comm,
                             (size_t)(e->max_bucket_pad / W) * e->esz, ZS_MEM_GRADS, &i, err));
        src = e->aslot[i].p;
        stride = 1;
        if (!e->first_micro) /* the previous micro-batch's staging copy is complete */
            ZS_ENG_TRY(zs_dev_stream_wait(e->comm, e->ev_staged[k], err));
    }
    for (int j = b->s0; j <= b->s1; j++) {
        zs__seg_t *s = &e->s[j];
        uint64_t n = s->ve > s->vb ? s->ve - s->vb : 0;
        if (n == 0)
            continue;
        void *blk = zs__at(e, buf, s->pbase - b->gbase + (uint64_t)e->rank * s->part);
        void *dst = direct ? blk : zs__at(e, src, s->qbase - b->gbase / W);
        if (!direct) {
            if (e->first_micro)
                ZS_ENG_TRY(zs_dev_memset(e->comm, dst, 0, n * e->esz, err));
            else
                ZS_ENG_TRY(
                    zs_dev_memcpy(e->comm, dst, zs__at(e, e->staging, s->qbase), n * e->esz, err));
            ZS_ENG_TRY(zs_dev_accumulate(e->comm, dst, e->dt, blk, e->dt, n, err));
        }
        if (e->last_micro)
            ZS_ENG_TRY(zs_dev_sumsq(e->comm, dst, e->dt, n, e->normacc + 2 * j, err));
        if (e->grads) /* ZS_ENGINE_DEBUG_KEEP_GRADS: a partition kept on the device */
            ZS_ENG_TRY(zs_dev_memcpy(e->comm, zs__at(e, e->grads, s->qbase), dst, n * e->esz, err));
    }
    if (!direct) /* the reduce buffer was read by the accumulation */
        ZS_ENG_TRY(free_slot(used, e->comm, err));
    ZS_ENG_TRY(zs_dev_event_record(e->ev_reduced, e->comm, err));
    ZS_ENG_TRY(zs_dev_stream_wait(e->copy, e->ev_reduced, err));
    for (int j = b->s0; j <= b->s1; j++) {
        zs__seg_t *s = &e->s[j];
        uint64_t at =
            (s->pbase - b->gbase) / W * stride + (direct ? (uint64_t)e->rank * s->part : 0);
        void *to = zs__at(e, e->staging, s->qbase), *from = zs__at(e, src, at);
        if (s->ve > s->vb && to != from && e->last_micro) /* equal: cast into staging */
            ZS_ENG_TRY(stage_copy(e, to, from, s->ve - s->vb, j, err));
        else if (s->ve > s->vb && to != from)
            ZS_ENG_TRY(zs_dev_memcpy(e->copy, to, from, (s->ve - s->vb) * e->esz, err));
    }
    ZS_ENG_TRY(zs_dev_event_record(e->ev_staged[k], e->copy, err));
    ZS_ENG_TRY(free_slot(direct ? used : &e->aslot[i], e->copy, err));
    if (!e->last_micro)
        return ZS_OK;
    return push_bucket(e, b, k, err);
}

/* Bucket k's gradient of this micro-batch is complete in its scratch slot. */
static int reduce_bucket(zs_engine_t *e, int k, zs_err_t *err)
{
    zs__bucket_t *b = &e->b[k];
    if (b->slot < 0)
        return ZS_OK; /* no gradient (no parameters) */
    zs__slot_t *gs = &e->gslot[b->slot];
    b->slot = -1;
    if (e->stage < 2) {
        ZS_ENG_TRY(zs_dev_accumulate(e->compute, zs__at(e, e->grads, b->gbase), e->dt, gs->p,
                                     ZS_DTYPE_F32, b->npad, err));
        return free_slot(gs, e->compute, err);
    }
    void *buf = gs->p;
    zs__slot_t *used = gs;
    zs_stream_t *wrote = e->compute; /* the stream that wrote what is reduced */
    if (zs__eng_cast_into_staging(e) && zs__eng_sums_on(e)) {
        /* One micro-batch: this is the pushed gradient. The cast and its
         * checksums run on the copy stream, beside the backward, as the
         * pusher's hash did before. */
        buf = zs__at(e, e->staging, b->gbase); /* W = 1: gbase is the bucket's qbase */
        ZS_ENG_TRY(zs_dev_event_record(e->ev_compute, e->compute, err));
        ZS_ENG_TRY(zs_dev_stream_wait(e->copy, e->ev_compute, err));
        ZS_ENG_TRY(zs__eng_sums_write(e, e->copy, buf, gs->p, ZS_DTYPE_F32, b->npad, b->s0, b->s1,
                                      e->step + 1, err));
        ZS_ENG_TRY(free_slot(gs, e->copy, err));
        used = NULL;
        wrote = e->copy;
    } else if (zs__eng_cast_into_staging(e)) {
        buf = zs__at(e, e->staging, b->gbase);
        ZS_ENG_TRY(zs_dev_cast(e->compute, buf, e->dt, gs->p, ZS_DTYPE_F32, b->npad, err));
        ZS_ENG_TRY(free_slot(gs, e->compute, err));
        used = NULL;
    } else if (e->dt != ZS_DTYPE_F32) {
        int i;
        ZS_ENG_TRY(take_slot(e, e->cslot, e->ncslot, &e->cnext, k, e->compute,
                             (size_t)e->max_bucket_pad * e->esz, ZS_MEM_COMM, &i, err));
        ZS_ENG_TRY(
            zs_dev_cast(e->compute, e->cslot[i].p, e->dt, gs->p, ZS_DTYPE_F32, b->npad, err));
        ZS_ENG_TRY(free_slot(gs, e->compute, err));
        buf = e->cslot[i].p;
        used = &e->cslot[i];
    }
    /* The reduce-scatter waits for the backward (or the copy stream's cast)
     * that wrote the bucket (the debug knob drops this wait to prove the
     * tests catch it). */
    zs_stream_t *after = (e->debug & ZS_ENGINE_DEBUG_DROP_WAIT) ? NULL : wrote;
    int offl = zs__eng_grads_offloaded(e);
    for (int j = b->s0; j <= b->s1; j++) {
        zs__seg_t *s = &e->s[j];
        if (s->n == 0)
            continue;
        void *sbuf = zs__at(e, buf, s->pbase - b->gbase);
        if (e->rsq) /* qgZ: int8 records in two hops, fp32 sums */
            ZS_ENG_TRY(
                zs_coll_reduce_scatter_q8(e->coll, sbuf, s->part, e->dt, e->rsq, after, NULL, err));
        else
            ZS_ENG_TRY(zs_coll_reduce_scatter(e->pc, sbuf, s->part, e->dt, after, NULL, err));
        after = NULL;
        /* MiCS: this block summed over the shard group, now over the replica
         * groups too (the debug knob skips it, to prove the tests catch it) */
        if (e->rep && !(e->debug & ZS_ENGINE_DEBUG_MICS_NO_ALLREDUCE))
            ZS_ENG_TRY(zs_coll_all_reduce(e->rep, zs__at(e, sbuf, (uint64_t)e->rank * s->part),
                                          s->part, e->dt, ZS_OP_SUM, NULL, NULL, err));
        if (!offl)
            ZS_ENG_TRY(zs_dev_accumulate(e->comm, zs__at(e, e->grads, s->qbase), e->dt,
                                         zs__at(e, sbuf, (uint64_t)e->rank * s->part), e->dt,
                                         s->part, err));
    }
    if (offl) /* frees `used` after its last reader */
        return stage_bucket(e, k, buf, used, err);
    ZS_ENG_TRY(free_slot(used, e->comm, err));
    return e->last_micro ? zs__eng_bucket_final(e, k, err) : ZS_OK;
}

static int forward(zs_engine_t *e, void **ptrs, zs_err_t *err)
{
    for (int i = 0; i < e->nlayers; i++) {
        if (e->stage == 3)
            ZS_ENG_TRY(zs__eng_gather_layer(e, i, err));
        else /* the last step's streamed pulls, up to this layer's segment */
            ZS_ENG_TRY(zs__eng_pull_land(e, e->layer_seg[i], err));
        ZS_ENG_TRY(zs__eng_layer_ptrs(e, i, ptrs, err));
        ZS_ENG_TRY(e->m.forward(e->m.self, i, ptrs, err));
        if (e->stage == 3)
            ZS_ENG_TRY(zs__eng_release_layer(e, i, err));
    }
    return ZS_OK;
}

static int backward(zs_engine_t *e, float dloss, void **ptrs, float **gptrs, zs_err_t *err)
{
    for (int i = e->nlayers - 1; i >= 0; i--) {
        int pos = 2 * e->nlayers - 1 - i;
        if (e->stage == 3)
            ZS_ENG_TRY(zs__eng_gather_layer(e, pos, err));
        ZS_ENG_TRY(zs__eng_layer_ptrs(e, i, ptrs, err));
        gptrs[0] = e->m.nparams[i] ? grad_slot(e, i, err) : NULL;
        if (e->m.nparams[i] && !gptrs[0])
            return err->code;
        for (int d = 0; e->deps[i][d] >= 0; d++) {
            int dl = e->deps[i][d];
            int want = e->m.nparams[dl] && !e->deps_ro[i];
            gptrs[1 + d] = want ? grad_slot(e, dl, err) : NULL;
            if (want && !gptrs[1 + d])
                return err->code;
        }
        ZS_ENG_TRY(e->m.backward(e->m.self, i, ptrs, gptrs, dloss, err));
        if (e->stage == 3)
            ZS_ENG_TRY(zs__eng_release_layer(e, pos, err));
        int k = e->s[e->layer_seg[i]].bucket;
        if (i == e->b[k].first)
            ZS_ENG_TRY(reduce_bucket(e, k, err));
    }
    return ZS_OK;
}

static int step(zs_engine_t *e, zs_step_stats_t *st, zs_err_t *err)
{
    memset(st, 0, sizeof *st);
    st->step = e->step + 1;
    e->param_gen++; /* hpZ: the secondary partition is refilled by the step's first gathers */
    e->ms_land = 0;
    st->loss_scale = e->ls.scale;
    int rc = ZS_OK;
    if (e->grads)
        rc = zs_dev_memset(e->compute, e->grads, 0,
                           (e->stage < 2 ? e->Ppad : e->Ppad / (uint64_t)e->W) * e->esz, err);
    /* offloaded buckets add their sums of squares as they are reduced */
    if (!rc && zs__eng_grads_offloaded(e))
        rc = zs_dev_memset(e->comm, e->normacc, 0, 2 * (size_t)e->ns * sizeof(double), err);
    if (rc)
        return rc;
    if (e->debug & ZS_ENGINE_DEBUG_LEAK) { /* a block nobody frees */
        rc = zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, (size_t)e->max_bucket_pad * 4,
                           &e->leak, "debug leak", err);
        if (rc)
            return rc;
    }
    void **ptrs = calloc((size_t)(e->maxdeps + 1), sizeof *ptrs);
    float **gptrs = calloc((size_t)(e->maxdeps + 1), sizeof *gptrs);
    if (!ptrs || !gptrs) {
        free(ptrs);
        free(gptrs);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    int gas = (int)e->cfg.gradient_accumulation_steps;
    double loss = 0;
    for (int micro = 0; micro < gas && !rc; micro++) {
        e->first_micro = micro == 0;
        e->last_micro = micro == gas - 1;
        zs_batch_ctx_t bc = {st->step,
                             micro,
                             gas,
                             e->wrank,
                             e->Wd,
                             (int)e->cfg.micro_batch_per_gpu,
                             e->cfg.train_batch_size};
        double t0 = zs__eng_now_ms(), l = 0;
        rc = e->m.load_batch(e->m.self, &bc, err);
        if (!rc)
            rc = forward(e, ptrs, err);
        if (!rc && micro == 0) /* every segment landed: did every pull succeed? */
            rc = zs__eng_pull_finish(e, 1, err);
        if (!rc)
            rc = e->m.loss(e->m.self, &l, err); /* waits for the forward */
        loss += l;
        double t1 = zs__eng_now_ms();
        zs_coll_bytes_t b0 = zs_coll_bytes(e->coll);
        if (!rc)
            rc = backward(e, (float)e->ls.scale, ptrs, gptrs, err);
        zs_coll_bytes_t b1 = zs_coll_bytes(e->coll);
        for (int k = 0; k < ZS_COLL_NKINDS; k++) {
            st->bytes_bwd.intra[k] += b1.intra[k] - b0.intra[k];
            st->bytes_bwd.inter[k] += b1.inter[k] - b0.inter[k];
        }
        if (!rc)
            rc = zs_dev_stream_sync(e->compute, err);
        st->ms_forward += t1 - t0;
        st->ms_backward += zs__eng_now_ms() - t1;
    }
    free(ptrs);
    free(gptrs);
    if (e->puller) /* the forward's waits for the last step's streamed pulls */
        st->ms_opt_pull = e->ms_land;
    double t2 = zs__eng_now_ms();
    if (rc) {
        zs_coll_sync(e->coll, NULL);
        return rc;
    }
    if (e->stage < 2) /* DeepSpeed stages 0-1: one all-reduce of the full gradient */
        for (int k = 0; k < e->nb && !rc; k++) {
            zs__bucket_t *b = &e->b[k];
            rc = zs_coll_all_reduce(e->coll, zs__at(e, e->grads, b->gbase), b->npad, e->dt,
                                    ZS_OP_SUM, k == 0 ? e->compute : NULL, NULL, err);
            if (!rc) /* overlaps the push of bucket k with the next all-reduce */
                rc = zs__eng_bucket_final(e, k, err);
        }
    float lf = (float)loss;
    if (!rc)
        rc = zs_coll_sync(e->coll, err);
    if (!rc)
        rc = zs_coll_all_reduce_host(e->coll, &lf, 1, ZS_DTYPE_F32, ZS_OP_SUM, err);
    st->ms_comm += zs__eng_now_ms() - t2;
    if (rc)
        return rc;
    st->loss = (double)lf / ((double)e->Wd * gas);
    rc = zs__eng_optimize(e, st, err);
    if (rc == ZS_OK)
        e->step = st->step;
    return rc;
}

int zs_engine_step(zs_engine_t *e, zs_step_stats_t *st, zs_err_t *err)
{
    /* the collectives count at enqueue: the step's bytes are the difference */
    zs_coll_bytes_t b0 = zs_coll_bytes(e->coll);
    int rc = step(e, st, err);
    zs_coll_bytes_t b1 = zs_coll_bytes(e->coll);
    for (int k = 0; k < ZS_COLL_NKINDS; k++) {
        st->bytes.intra[k] = b1.intra[k] - b0.intra[k];
        st->bytes.inter[k] = b1.inter[k] - b0.inter[k];
    }
    if (rc)
        e->last_rc = rc;
    return rc;
}
