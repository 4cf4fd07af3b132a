/*
 * zs_engine_recover.c - going on after a lost shard server, the way an
 * elastic launcher would, without restarting the workers.
 *
 * A step or checkpoint that fails because a server went away (unreachable,
 * past its deadline, or back up but without the step's staged state) fails
 * on every worker at the same agreement point (zs__eng_agree). Every worker
 * then calls zs_engine_recover, which:
 *   1. quiets the worker: drains the pusher, waits for its streams, drops
 *      stage-3 gathers and gradient slots of the failed step;
 *   2. decides together (all-reduce) whether any worker saw a server loss;
 *      anything else is not recoverable here;
 *   3. waits (rank 0, logging once a few seconds) until every server
 *      answers Hello again, up to wait_ms (the server is restarted by
 *      systemd, Kubernetes, Slurm or a person, on the same address);
 *   4. restores the newest checkpoint complete on every server and pulls
 *      every worker's partition back (zs_engine_resume), or, when no
 *      checkpoint is complete yet, starts the run again from step 0 with
 *      the initial parameters.
 * Steps are deterministic, so a run that recovers ends bitwise equal to one
 * that never failed (test_chaos).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs_engine_internal.h"
#include "zs_log.h"

int zs__eng_is_server_loss(int rc)
{
    return rc == ZS_ERR_UNAVAILABLE || rc == ZS_ERR_TIMEOUT || rc == ZS_ERR_CANCELLED ||
           rc == ZS_ERR_STATE || rc == ZS_ERR_NOTFOUND;
}

/* Everything of the failed step that is still queued or held. */
static void quiet(zs_engine_t *e)
{
    if (e->pusher)
        zs__eng_push_wait(e, NULL);
    zs__eng_pull_drain(e);
    zs__eng_delay_forget(e);
    zs_dev_stream_sync(e->compute, NULL);
    zs_dev_stream_sync(e->copy, NULL);
    zs_coll_sync(e->coll, NULL);
    for (int k = 0; k < e->ns; k++)
        if (!e->s[k].persistent)
            zs__eng_drop_seg(e, k);
    for (int k = 0; k < e->nb; k++)
        e->b[k].slot = -1;
    for (int i = 0; i < e->ngslot; i++)
        e->gslot[i].owner = -1;
    for (int i = 0; i < ZS_COMM_SLOTS; i++) {
        e->cslot[i].owner = -1;
        e->aslot[i].owner = -1;
    }
}

/* Rank 0: Hello every server until none is unreachable, or wait_ms. */
static int wait_servers(zs_engine_t *e, int wait_ms, zs_err_t *err)
{
    double t0 = zs__eng_now_ms(), last_log = -1e9;
    for (;;) {
        zs_err_t herr;
        int rc = zs_client_hello(e->client, "", 0, NULL, &herr);
        if (rc == ZS_OK)
            return ZS_OK;
        double now = zs__eng_now_ms();
        if (rc != ZS_ERR_UNAVAILABLE && rc != ZS_ERR_TIMEOUT && rc != ZS_ERR_CANCELLED)
            return zs_err_set(err, rc, "servers answer but refuse Hello: %s", herr.msg);
        if (now - t0 > wait_ms)
            return zs_err_set(err, ZS_ERR_UNAVAILABLE,
                              "a shard server did not come back within %d s: %s", wait_ms / 1000,
                              herr.msg);
        if (now - last_log > 5000) {
            ZS_WARN("waiting for the shard servers to come back (%.0f of %d s): %s",
                    (now - t0) / 1e3, wait_ms / 1000, herr.msg);
            last_log = now;
        }
        usleep(200 * 1000);
    }
}

/* No checkpoint is complete anywhere: the run starts over from step 0. */
static int restart_fresh(zs_engine_t *e, zs_err_t *err)
{
    if (!e->offload) {
        size_t n = (size_t)(e->stage == 0 ? e->Ppad : e->Ppad / (uint64_t)e->W) * 4;
        ZS_ENG_TRY(zs_dev_memset(e->compute, e->exp_avg, 0, n, err));
        ZS_ENG_TRY(zs_dev_memset(e->compute, e->exp_avg_sq, 0, n, err));
    }
    ZS_ENG_TRY(zs__eng_init_state(e, err));
    zs_loss_scale_init(&e->ls, e->dt == ZS_DTYPE_F16 ? &e->cfg.fp16 : NULL);
    ZS_ENG_TRY(zs_engine_start(e, err));
    return zs__eng_after_update(e, err);
}

int zs_engine_recover(zs_engine_t *e, int wait_ms, uint64_t *step_out, zs_err_t *err)
{
    quiet(e);
    float lost = e->client && zs__eng_is_server_loss(e->last_rc) ? 1.0f : 0.0f;
    ZS_ENG_TRY(zs_coll_all_reduce_host(e->coll, &lost, 1, ZS_DTYPE_F32, ZS_OP_MAX, err));
    if (lost == 0.0f)
        return zs_err_set(err, ZS_ERR_STATE,
                          "the failure was not a lost shard server (%s): not recoverable",
                          zs_status_name(e->last_rc));
    if (e->wrank == 0)
        ZS_WARN("step %llu failed with a shard server lost: waiting for it, then rolling back to "
                "the newest checkpoint complete on every server",
                (unsigned long long)e->step + 1);
    int rc = e->wrank == 0 ? wait_servers(e, wait_ms, err) : ZS_OK;
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    /* Rank 0 looks for a complete checkpoint; everyone follows its answer. */
    float have = 0;
    if (e->wrank == 0) {
        uint64_t steps[ZS_CLIENT_MAX_CKPTS];
        size_t n = 0;
        rc = zs_client_checkpoints(e->client, steps, ZS_CLIENT_MAX_CKPTS, &n, err);
        have = n > 0 ? 1.0f : 0.0f;
    }
    ZS_ENG_TRY(zs__eng_agree(e, rc, err));
    ZS_ENG_TRY(zs_coll_broadcast_host(e->coll, &have, 1, ZS_DTYPE_F32, 0, err));
    uint64_t at = 0;
    if (have != 0.0f) {
        rc = zs_engine_resume(e, 0, &at, err);
    } else {
        if (e->wrank == 0)
            ZS_WARN("no checkpoint is complete on every server yet: starting again from step 0");
        rc = restart_fresh(e, err);
        rc = zs__eng_agree(e, rc, err);
    }
    if (rc)
        return rc;
    e->last_rc = ZS_OK;
    if (step_out)
        *step_out = at;
    if (e->wrank == 0)
        ZS_INFO("recovered: every worker and server is back at step %llu", (unsigned long long)at);
    return ZS_OK;
}
