/*
 * zs_engine_push.c - background gradient push for offload (ZeRO-Offload's
 * overlap of the gradient transfer with backward).
 *
 * On the last micro-batch of a step, a bucket's gradient partition is final
 * as soon as its reduction is done; the engine copies it to pinned staging
 * on the copy stream and queues it here with the event of that copy. One
 * pusher thread waits for the event and streams the staged bytes to the
 * shard servers while backward goes on. Before committing,
 * zs__eng_push_wait drains the queue and reports the first error. Nothing
 * writes the staging again until the step's pulls (after the wait). A push
 * starts only once the previous step's pulls are done (the delayed update
 * pulls them during this step's backward).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "zs_engine_internal.h"

typedef struct job {
    struct job *next;
    uint64_t step, lo, hi;
    const void *src;
    zs_event_t *ready; /* the staging copy; NULL: ready now */
    int has_expect;    /* offload_optimizer.super_offload: state the expected scalars */
    zs_step_scalars_t expect;
    const uint64_t *sums; /* the messages' checksums (zs_engine_sums.c), or NULL */
    int nsums;
} job_t;

struct zs__pusher {
    zs_engine_t *e;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_t *head, *tail;
    int busy, stop;
    int rc;
    zs_err_t err;
};

static void *pusher_main(void *arg)
{
    zs__pusher_t *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->head)
            break;
        job_t *j = p->head;
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        p->busy = 1;
        int skip = p->rc != ZS_OK; /* after an error, drop the rest */
        pthread_mutex_unlock(&p->mu);
        zs_err_t err;
        int rc = skip || !j->ready ? ZS_OK : zs_dev_event_sync(j->ready, &err);
        /* the last step's pulls first: with the delayed update they may
         * still run (zs_engine_delay.c); else a no-op */
        zs__eng_pull_wait(p->e, 0, NULL);
        if (!skip && rc == ZS_OK)
            rc = zs_client_push_sums(p->e->client, j->step, j->lo, j->hi, j->src, p->e->dt,
                                     j->has_expect ? &j->expect : NULL, j->sums, j->nsums, &err);
        free(j);
        pthread_mutex_lock(&p->mu);
        if (rc && p->rc == ZS_OK) {
            p->rc = rc;
            p->err = err;
        }
        p->busy = 0;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int zs__eng_pusher_start(zs_engine_t *e, zs_err_t *err)
{
    zs__pusher_t *p = calloc(1, sizeof *p);
    if (!p)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    p->e = e;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, pusher_main, p) != 0) {
        free(p);
        return zs_err_set(err, ZS_ERR_NOMEM, "cannot start the gradient pusher thread");
    }
    e->pusher = p;
    return ZS_OK;
}

void zs__eng_pusher_stop(zs_engine_t *e)
{
    zs__pusher_t *p = e->pusher;
    if (!p)
        return;
    zs__eng_thread_end(p->th, &p->mu, &p->cv, &p->stop);
    while (p->head) {
        job_t *j = p->head;
        p->head = j->next;
        free(j);
    }
    free(p);
    e->pusher = NULL;
}

int zs__eng_push_async(zs_engine_t *e, uint64_t step, uint64_t lo, uint64_t hi, const void *src,
                       zs_event_t *ready, int seg, zs_err_t *err)
{
    zs__pusher_t *p = e->pusher;
    job_t *j = malloc(sizeof *j);
    if (!j)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    *j = (job_t){NULL, step, lo, hi, src, ready, zs__eng_speculating(e), {0}, NULL, 0};
    if (seg >= 0 && !zs__eng_sums_get(e, seg, step, &j->sums, &j->nsums))
        j->sums = NULL;
    /* Computed here, on the engine's thread: the loss scale and t do not
     * change until the step's optimize, after every push. */
    if (j->has_expect)
        zs__eng_expect(e, step, &j->expect);
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return ZS_OK;
}

int zs__eng_push_wait(zs_engine_t *e, zs_err_t *err)
{
    zs__pusher_t *p = e->pusher;
    pthread_mutex_lock(&p->mu);
    while (p->head || p->busy)
        pthread_cond_wait(&p->cv, &p->mu);
    int rc = p->rc;
    if (rc && err)
        *err = p->err;
    p->rc = ZS_OK;
    pthread_mutex_unlock(&p->mu);
    return rc;
}
