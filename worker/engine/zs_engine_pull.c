/*
 * zs_engine_pull.c - streamed parameter pulls (offload_optimizer,
 * offload_optimizer.stream_pulls): the next step starts its forward while
 * the servers' updated parameters are still arriving (issue 18).
 *
 * Once every worker agrees that Commit succeeded, zs__eng_pull_begin hands
 * the step's pulls to one puller thread, which pulls this worker's part of
 * each segment, in segment order (one call for a run of segments whose
 * parts follow each other, each segment marked as its last chunk lands:
 * run_end says when), into pinned staging (or, on a
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
    uint64_t step;  /* the pulls under way are this step's parameters */
    void *base;     /* they go to base at `at`; NULL: the partition itself */
    int next;       /* next segment the thread pulls; ns: all done */
    int *done;      /* [ns] 1: pulled into staging (or skipped after an error) */
    uint64_t *left; /* [ns] elements of a segment still to land in a run's pull */
    uint64_t *at;   /* [ns] where in base segment k's part landed (elements) */
    int stop;
    int rc; /* the first failed pull of this step */
    zs_err_t err;
};

/* The last segment of the run that starts at k: one pull can serve
 * segments k..m when each one's part of the flat space follows the
 * previous one's (W = 1; stage 3's partitions where contiguous). Into
 * staging (base), the run lands packed from segment k's place: segment j
 * at k's qbase + (its flat start - k's), before its own qbase (the
 * segments' padding is skipped), and `at` says where. In place (base
 * NULL), the partitions themselves must follow each other. Runs only
 * where the client pulls a server's range in one stream
 * (zs_client_pull_streams == 1): with several streams per server, a call
 * per segment gives the first layers every stream, which a run's call
 * would spread over its whole range. Empty segments join a run. */
static int run_end(const zs__puller_t *p, int k)
{
    zs_engine_t *e = p->e;
    if (zs_client_pull_streams(e->client) != 1)
        return k;
    uint64_t fb = e->s[k].off + e->s[k].vb, n = e->s[k].ve - e->s[k].vb;
    const char *db = p->base ? NULL : zs__eng_param_part(e, &e->s[k]);
    int m = k;
    while (m + 1 < e->ns) {
        zs__seg_t *s = &e->s[m + 1];
        if (s->ve > s->vb && (s->off + s->vb != fb + n ||
                              (db && (char *)zs__eng_param_part(e, s) != db + n * e->esz)))
            break;
        n += s->ve - s->vb;
        m++;
    }
    return m;
}

/* Where segment k's part of the step's pull goes (set by pull_run). */
static void *seg_dst(const zs__puller_t *p, int k)
{
    zs_engine_t *e = p->e;
    return p->base ? zs__at(e, p->base, p->at[k]) : zs__eng_param_part(e, &e->s[k]);
}

typedef struct {
    zs__puller_t *p;
    int k, m; /* the run's segments */
} run_t;

/* zs_client_landed_fn of a run's pull: segments whose every element has
 * landed are done. Chunks arrive from the client's per-server threads. */
static void run_landed(void *arg, uint64_t b, uint64_t end)
{
    run_t *r = arg;
    zs__puller_t *p = r->p;
    zs_engine_t *e = p->e;
    int woke = 0;
    pthread_mutex_lock(&p->mu);
    for (int j = r->k; j <= r->m; j++) {
        const zs__seg_t *s = &e->s[j];
        uint64_t lo = s->off + s->vb, hi = s->off + s->ve;
        if (hi <= b || s->ve == s->vb)
            continue;
        if (lo >= end)
            break;
        uint64_t n = (hi < end ? hi : end) - (lo > b ? lo : b);
        p->left[j] -= n < p->left[j] ? n : p->left[j];
        if (p->left[j] == 0 && !p->done[j])
            p->done[j] = woke = 1;
    }
    if (woke)
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Pull segments k..m of `step` (one run, run_end) with one call; mark each
 * done as it lands (mu not held). */
static int pull_run(zs__puller_t *p, int k, int m, uint64_t step, zs_err_t *err)
{
    zs_engine_t *e = p->e;
    uint64_t b = e->s[k].off + e->s[k].vb, n = 0;
    pthread_mutex_lock(&p->mu);
    for (int j = k; j <= m; j++) {
        p->at[j] = e->s[k].qbase + n; /* packed from k's place */
        p->left[j] = e->s[j].ve - e->s[j].vb;
        n += p->left[j];
        if (!p->left[j])
            p->done[j] = 1;
    }
    pthread_mutex_unlock(&p->mu);
    if (n == 0)
        return ZS_OK;
    if (k == m) /* one segment: the plain call, nothing to report early */
        return zs_client_pull(e->client, step, b, b + n, seg_dst(p, k), e->dt, NULL, err);
    run_t r = {p, k, m};
    int rc =
        zs_client_pull_each(e->client, step, b, b + n, seg_dst(p, k), e->dt, run_landed, &r, err);
    for (int j = k; !rc && j <= m; j++)
        if (p->left[j]) /* the client checks that the answers tile the range */
            rc = zs_err_set(err, ZS_ERR_INTERNAL, "pull of [%llu, %llu): segment %d not covered",
                            (unsigned long long)b, (unsigned long long)(b + n), j);
    return rc;
}

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
        int m = skip ? k : run_end(p, k);
        zs_err_t err;
        int rc = skip ? ZS_OK : pull_run(p, k, m, step, &err);
        pthread_mutex_lock(&p->mu);
        if (rc && p->rc == ZS_OK) {
            p->rc = rc;
            p->err = err;
        }
        for (int j = k; j <= m; j++)
            p->done[j] = 1;
        p->next = m + 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int zs__eng_puller_start(zs_engine_t *e, zs_err_t *err)
{
    zs__puller_t *p = calloc(1, sizeof *p);
    int *done = calloc((size_t)e->ns, sizeof *done);
    uint64_t *left = calloc((size_t)e->ns, sizeof *left);
    uint64_t *at = calloc((size_t)e->ns, sizeof *at);
    if (!p || !done || !left || !at) {
        free(p), free(done), free(left), free(at);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    p->e = e;
    p->done = done;
    p->left = left;
    p->at = at;
    p->next = e->ns; /* nothing to pull */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, puller_main, p) != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(done), free(left), free(at), free(p);
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
    free(p->left);
    free(p->at);
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

void *zs__eng_pull_src(zs_engine_t *e, void *base, int k)
{
    return zs__at(e, base, e->puller->at[k]);
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
            ZS_ENG_TRY(zs__eng_param_set(e, s, zs__eng_pull_src(e, e->staging, k), err));
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
