/*
 * zs_engine_delay.c - the delayed parameter update
 * (offload_optimizer.delayed_update_after = N; ZeRO-Offload's "one-step
 * delayed parameter update"): from the update of step N + 1 on, an update
 * reaches the device one step late, so the servers' AdamW and the pulls of
 * step t run while the workers compute step t + 1 (which therefore reads
 * the parameters of step t - 1).
 *
 * The cycle, at the end of each delayed step t (zs__eng_optimize):
 *   1. land the update of step t - 1, which sits complete in `pdelay`:
 *      copy it into the parameter partition and all-gather (stages 1-2);
 *   2. with offload, commit step t and pull its update into `pdelay` in the
 *      background (the puller thread, zs_engine_pull.c); in process, AdamW
 *      writes the new 16-bit parameters into `pdelay` instead of the
 *      partition.
 * Step t + 1's pushes wait until those pulls are done
 * (zs__eng_pull_wait in the pusher), so no server applies step t + 1
 * to a range whose step-t parameters are still being pulled, and the
 * client runs one call at a time as before.
 *
 * A flush (zs__eng_delay_land outside the cycle) lands what is pending at
 * once: every entry point that reads the parameters or saves them does it
 * (checkpoint, zs_engine_get_params: export and evaluation). So the step after a
 * checkpoint, an evaluation, a resume or a recovery reads the freshest
 * parameters, and a run resumed from checkpoint K is bitwise the
 * uninterrupted one. A skipped step (overflow) lands what is pending and
 * starts nothing new.
 *
 * What it does not do: stage 0 or 3 (refused at create, zs_engine.c), pull
 * in place (the delayed copy is always separate), decide the numbers'
 * meaning (the reference in tests/engine_worker.c: step t's gradients at
 * the parameters of step t - 2 unless step t - 1 was a warm-up step, a
 * flush or skipped).
 */
#include "zs_engine_internal.h"

int zs__eng_delayed(const zs_engine_t *e, uint64_t step)
{
    int64_t after = e->cfg.offload_delay_after;
    return after >= 0 && step > (uint64_t)after;
}

/* In process: the parameter partition := pdelay, on the compute stream
 * (the AdamW that wrote pdelay ran there). */
static int land_in_process(zs_engine_t *e, zs_err_t *err)
{
    for (int k = 0; k < e->ns; k++) {
        zs__seg_t *s = &e->s[k];
        if (s->ve > s->vb)
            ZS_ENG_TRY(zs_dev_memcpy(e->compute, zs__eng_param_part(e, s),
                                     zs__at(e, e->pdelay, s->qbase),
                                     (size_t)(s->ve - s->vb) * e->esz, err));
    }
    return ZS_OK;
}

/* Offload: wait for the pulls into pdelay, then copy each segment's part to
 * the device on the copy stream, after the compute stream is done with the
 * parameters it replaces. Returns the first failed pull. */
static int land_offload(zs_engine_t *e, zs_err_t *err)
{
    int rc = zs__eng_pull_wait(e, 1, err);
    if (rc)
        return rc;
    ZS_ENG_TRY(zs_dev_event_record(e->ev_compute, e->compute, err));
    ZS_ENG_TRY(zs_dev_stream_wait(e->copy, e->ev_compute, err));
    for (int k = 0; k < e->ns; k++) {
        zs__seg_t *s = &e->s[k];
        if (s->ve > s->vb)
            ZS_ENG_TRY(zs__eng_param_set(e, s, zs__eng_pull_src(e, e->pdelay, k), err));
    }
    /* the next pulls write pdelay again */
    return zs_dev_stream_sync(e->copy, err);
}

int zs__eng_delay_land(zs_engine_t *e, zs_err_t *err)
{
    if (!e->dpu_pending)
        return ZS_OK;
    e->dpu_pending = 0;
    int rc = e->offload ? land_offload(e, err) : land_in_process(e, err);
    /* every worker lands at the same point: agree before the gathers */
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    return zs__eng_after_update(e, err);
}

void zs__eng_delay_begin(zs_engine_t *e, uint64_t step)
{
    if (e->offload)
        zs__eng_pull_begin_into(e, step, e->pdelay);
    e->dpu_pending = 1;
}

void zs__eng_delay_forget(zs_engine_t *e)
{
    e->dpu_pending = 0;
}
