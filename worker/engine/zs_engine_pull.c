/*
 * zs_engine_pull.c - streamed parameter pulls (offload_optimizer,
 * offload_optimizer.stream_pulls): the next step starts its forward while
 * the servers' updated parameters are still arriving (issue 18).
 *
 * Once every worker agrees that Commit succeeded, zs__eng_pull_begin hands
 * the step's pulls to one puller thread, which pulls this worker's part of
 * each segment, in segment order, into pinned staging (or, on a
 * host-addressable device, straight into the parameters: every stream was
 * waited for first, zs__eng_pull_quiesce, and nothing enqueues work on them
 * until the next forward lands), and the step returns. The main thread
 * lands a segment (zs__eng_pull_land) when a layer needs it: wait until its
 * pull is done, copy it to the device on the copy stream (unless it landed
 * in place), all-gather it on the communication stream and make the
 * compute stream wait for that. The forward of the next step lands the
 * segments of each layer just before its use, so its first layers run
 * while later segments are pulled; every worker lands the same segments in
 * the same order (the all-gathers match). Every entry point that reads the
 * parameters or talks to the servers lands everything first.
 *
 * A failed pull is not reported where it happens: the thread skips the
 * rest, landing still runs every all-gather (so no worker is left waiting
 * in one), and zs__eng_pull_finish reports it with the agreement of every
 * worker (the step that landed fails everywhere, as a failed pull in the
 * step itself did before). Staging is written by pulls only between Commit
 * and the landing of the segment, and the next step's gradients reach
 * staging only in backward, after its forward landed every segment.
 *
 * Stage 3: the pulls land in this worker's parameter partition, and what
 * lands a segment is its gather (zs__eng_gather_seg, for a layer's use or a
 * prefetch) instead of the layer loop: no all-gather here, the gather does
 * it; a resident (persistent) segment is gathered again when it lands.
 *
 * With the delayed parameter update (zs_engine_delay.c) the same thread
 * pulls a step's parameters into the delayed copy instead, and nothing
 * lands them until the end of the next step.
 *
 * Not here: the pulls of resume and recovery (synchronous,
 * zs_engine_ckpt.c, zs_engine_recover.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "zs_engine_internal.h"

struct zs__puller {
    zs_engine_t *e;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t step; /* the pulls under way are this step's parameters */
    void *base;    /* they go to base at each segment's qbase; NULL: the partition itself */
    int next;      /* next segment the thread pulls; ns: all done */
    int *done;     /* [ns] 1: pulled into staging (or skipped after an error) */
    int stop;
    int rc; /* the first failed pull of this step */
    zs_err_t err;
};

static void *puller_main(void *arg)
{
    zs__puller_t *p = arg;
    zs_engine_t *e = p->e;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->next >= e->ns && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        int k = p->next, skip = p->rc != ZS_OK;
        uint64_t step = p->step;
        pthread_mutex_unlock(&p->mu);
        zs__seg_t *s = &e->s[k];
        zs_err_t err;
        int rc = ZS_OK;
        void *dst = p->base ? zs__at(e, p->base, s->qbase) : zs__eng_param_part(e, s);
        if (!skip && s->ve > s->vb)
            rc = zs_client_pull(e->client, step, s->off + s->vb, s->off + s->ve, dst, e->dt, NULL,
                                &err);
        pthread_mutex_lock(&p->mu);
        if (rc && p->rc == ZS_OK) {
            p->rc = rc;
            p->err = err;
        }
        p->done[k] = 1;
        p->next = k + 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int zs__eng_puller_start(zs_engine_t *e, zs_err_t *err)
{
    zs__puller_t *p = calloc(1, sizeof *p);
    int *done = calloc((size_t)e->ns, sizeof *done);
    if (!p || !done) {
        free(p), free(done);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    p->e = e;
    p->done = done;
    p->next = e->ns; /* nothing to pull */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, puller_main, p) != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(done), free(p);
        return zs_err_set(err, ZS_ERR_NOMEM, "cannot start the parameter puller thread");
    }
    e->puller = p;
    e->land = e->ns;
    return ZS_OK;
}

void zs__eng_puller_stop(zs_engine_t *e)
{
    zs__puller_t *p = e->puller;
    if (!p)
        return;
    zs__eng_thread_end(p->th, &p->mu, &p->cv, &p->stop);
    free(p->done);
    free(p);
    e->puller = NULL;
}

void zs__eng_pull_begin_into(zs_engine_t *e, uint64_t step, void *base)
{
    zs__puller_t *p = e->puller;
    pthread_mutex_lock(&p->mu);
    p->step = step;
    p->base = base;
    p->rc = ZS_OK;
    memset(p->done, 0, (size_t)e->ns * sizeof *p->done);
    p->next = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void zs__eng_pull_begin(zs_engine_t *e, uint64_t step)
{
    zs__eng_pull_begin_into(e, step, zs__eng_pull_in_place(e) ? NULL : e->staging);
    e->land = 0;
    e->pull_open = 1;
}

int zs__eng_pull_wait(zs_engine_t *e, int take, zs_err_t *err)
{
    zs__puller_t *p = e->puller;
    if (!p)
        return ZS_OK;
    pthread_mutex_lock(&p->mu);
    while (p->next < e->ns)
        pthread_cond_wait(&p->cv, &p->mu);
    int rc = take ? p->rc : ZS_OK;
    if (rc && err)
        *err = p->err;
    if (take)
        p->rc = ZS_OK;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int zs__eng_pull_land(zs_engine_t *e, int upto, zs_err_t *err)
{
    zs__puller_t *p = e->puller;
    if (!p || e->land > upto || e->land >= e->ns)
        return ZS_OK;
    double t0 = zs__eng_now_ms();
    while (e->land <= upto && e->land < e->ns) {
        int k = e->land++, failed; /* landed from here on: stage 3's refresh gathers it */
        zs__seg_t *s = &e->s[k];
        pthread_mutex_lock(&p->mu);
        while (!p->done[k])
            pthread_cond_wait(&p->cv, &p->mu);
        failed = p->rc != ZS_OK;
        pthread_mutex_unlock(&p->mu);
        if (s->n == 0)
            continue;
        /* a failed step's parameters are garbage but every worker still
         * all-gathers them; zs__eng_pull_finish fails the step everywhere */
        if (!failed && s->ve > s->vb && !zs__eng_pull_in_place(e))
            ZS_ENG_TRY(zs__eng_param_set(e, s, zs__at(e, e->staging, s->qbase), err));
        if (e->stage == 3) {
            /* The gathers read the partition (after the copy stream's
             * event); a resident segment is gathered again now. */
            if (s->persistent && s->gbuf) {
                zs__eng_drop_seg(e, k);
                ZS_ENG_TRY(zs__eng_gather_seg(e, k, err));
            }
            continue;
        }
        ZS_ENG_TRY(zs_dev_event_record(e->ev_copy, e->copy, err));
        ZS_ENG_TRY(zs_dev_stream_wait(e->comm, e->ev_copy, err));
        ZS_ENG_TRY(zs_coll_all_gather(e->pc, zs__at(e, e->params, s->pbase), s->part, e->dt, NULL,
                                      NULL, err));
    }
    /* the layers read the landed parameters (stage 3: through the gathers) */
    if (e->stage < 3) {
        ZS_ENG_TRY(zs_dev_event_record(e->ev_reduced, e->comm, err));
        ZS_ENG_TRY(zs_dev_stream_wait(e->compute, e->ev_reduced, err));
    }
    e->ms_land += zs__eng_now_ms() - t0;
    return ZS_OK;
}

int zs__eng_pull_finish(zs_engine_t *e, int agree, zs_err_t *err)
{
    zs__puller_t *p = e->puller;
    if (!p || !e->pull_open)
        return ZS_OK;
    int rc = zs__eng_pull_land(e, e->ns - 1, err);
    if (rc == ZS_OK) {
        pthread_mutex_lock(&p->mu);
        rc = p->rc;
        if (rc && err)
            *err = p->err;
        p->rc = ZS_OK;
        pthread_mutex_unlock(&p->mu);
    }
    e->pull_open = 0;
    return agree ? zs__eng_agree(e, rc, err) : rc;
}

void zs__eng_pull_drain(zs_engine_t *e)
{
    zs__puller_t *p = e->puller;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    while (p->next < e->ns)
        pthread_cond_wait(&p->cv, &p->mu);
    p->rc = ZS_OK;
    pthread_mutex_unlock(&p->mu);
    e->land = e->ns;
    e->pull_open = 0;
}
