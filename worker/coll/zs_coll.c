/*
 * zs_coll.c - the parts of zs_coll.h every implementation shares: stream
 * ordering around a collective (`after`, `done`), groups (their done events
 * and when the implementation launches them), barrier and sync, and the
 * blocking host-value helpers. It only talks to the device interface
 * (zs_dev.h) and the communicator's vtable; it does not call MPI or NCCL.
 */
#include <stdint.h>

#include "zs_coll.h"

/* Make c's stream wait for the work enqueued on `after` so far: record
 * c->after_ev there and wait for it on c's stream. The one event is reused:
 * the wait is enqueued right after the record, and a wait takes the record
 * that is current when it is enqueued (zs_dev.h), so re-recording it for the
 * next collective does not disturb this one. `after` == c's own stream (or
 * NULL) needs nothing: a stream is ordered already. */
int zs__coll_after(zs_coll_t *c, zs_stream_t *after, zs_err_t *err)
{
    if (!after || after == c->stream)
        return ZS_OK;
    int rc = zs_dev_event_record(c->after_ev, after, err);
    if (rc == ZS_OK)
        rc = zs_dev_stream_wait(c->stream, c->after_ev, err);
    if (rc != ZS_OK)
        zs_err_prefix(err, "collective after stream: ");
    return rc;
}

/* Record `done` (owned by the caller) on c's stream. */
static int record_done(zs_coll_t *c, zs_event_t *done, zs_err_t *err)
{
    int rc = zs_dev_event_record(done, c->stream, err);
    if (rc != ZS_OK)
        zs_err_prefix(err, "collective done event: ");
    return rc;
}

/* Launch what the open group holds (the implementation's flush), then
 * record the done events kept for it, in call order. The group stays open. */
static int flush(zs_coll_t *c, zs_err_t *err)
{
    int rc = ZS_OK;
    if (c->ngroup && c->vt->group_flush)
        rc = c->vt->group_flush(c, err);
    for (int i = 0; i < c->npend && rc == ZS_OK; i++)
        rc = record_done(c, c->pend[i], err);
    c->ngroup = c->npend = 0;
    return rc;
}

/* Behind the collective just enqueued: record `done` now, or inside a group
 * keep it for the flush (flushing a full group). */
int zs__coll_done(zs_coll_t *c, zs_event_t *done, zs_err_t *err)
{
    if (!c->grouped)
        return done ? record_done(c, done, err) : ZS_OK;
    if (done)
        c->pend[c->npend++] = done;
    return ++c->ngroup >= ZS_COLL_GROUP_MAX ? flush(c, err) : ZS_OK;
}

/* ZS_ERR_STATE for `what` while a group is open. */
static int no_group(zs_coll_t *c, const char *what, zs_err_t *err)
{
    if (!c->grouped)
        return ZS_OK;
    return zs_err_set(err, ZS_ERR_STATE,
                      "%s inside a collective group: call zs_coll_group_end first", what);
}

int zs_coll_group_start(zs_coll_t *c, zs_err_t *err)
{
    if (c->grouped)
        return zs_err_set(err, ZS_ERR_STATE, "zs_coll_group_start: a group is open already");
    c->grouped = 1;
    c->ngroup = c->npend = 0;
    return ZS_OK;
}

int zs_coll_group_end(zs_coll_t *c, zs_err_t *err)
{
    if (!c->grouped)
        return zs_err_set(err, ZS_ERR_STATE, "zs_coll_group_end: no group is open");
    int rc = flush(c, err);
    c->grouped = 0;
    if (rc != ZS_OK)
        zs_err_prefix(err, "collective group: ");
    return rc;
}

/* Enqueue the implementation's barrier, then wait for the stream: returns
 * when every rank has reached the barrier and everything enqueued before it
 * here has run (its first error, if any). */
int zs_coll_barrier(zs_coll_t *c, zs_err_t *err)
{
    int rc = no_group(c, "zs_coll_barrier", err);
    if (rc == ZS_OK)
        rc = c->vt->barrier(c, err);
    if (rc != ZS_OK)
        return rc;
    return zs_coll_sync(c, err);
}

int zs_coll_sync(zs_coll_t *c, zs_err_t *err)
{
    int rc = no_group(c, "zs_coll_sync", err);
    if (rc == ZS_OK)
        rc = zs_dev_stream_sync(c->stream, err);
    if (rc == ZS_OK && c->vt->sync_check)
        rc = c->vt->sync_check(c, err);
    return rc;
}

/* Which of the two collectives a host helper runs. */
typedef enum { HOST_ALL_REDUCE, HOST_BROADCAST } host_kind_t;

/* Stage `count` elements of `host` in a ZS_MEM_COMM device buffer, run the
 * collective on c's stream, copy back, wait, free. The buffer is freed only
 * after the stream has been synchronised, also on errors, because work
 * already enqueued may still use it. */
static int host_coll(zs_coll_t *c, host_kind_t kind, void *host, size_t count, zs_dtype_t dt,
                     zs_coll_op_t op, int root, zs_err_t *err)
{
    const char *what = kind == HOST_ALL_REDUCE ? "all_reduce_host" : "broadcast_host";
    int grc = no_group(c, what, err);
    if (grc)
        return grc;
    size_t es = zs_dtype_size(dt);
    if (es == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: dtype %d (%s) is not fp32, bf16 or fp16", what,
                          (int)dt, zs_dtype_name(dt));
    if (count > SIZE_MAX / es)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "%s: %zu elements x %zu bytes overflows the address space", what, count,
                          es);
    if (count && !host)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL host buffer with count %zu", what, count);
    size_t bytes = count * es;
    void *dbuf = NULL;
    int rc = zs_dev_alloc(c->dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, bytes, &dbuf, err);
    if (rc != ZS_OK) {
        zs_err_prefix(err, "%s: ", what);
        return rc;
    }
    int enq = zs_dev_memcpy(c->stream, dbuf, host, bytes, err);
    if (enq == ZS_OK)
        enq = kind == HOST_ALL_REDUCE ? c->vt->all_reduce(c, dbuf, count, dt, op, err)
                                      : c->vt->broadcast(c, dbuf, count, dt, root, err);
    if (enq == ZS_OK)
        enq = zs_dev_memcpy(c->stream, host, dbuf, bytes, err);
    /* Sync even when an enqueue was refused: earlier pieces may be queued. */
    zs_err_t serr;
    zs_err_clear(&serr);
    rc = zs_dev_stream_sync(c->stream, &serr);
    /* the value copied back is garbage if the collective failed
     * asynchronously (NCCL: a peer died): ask, as zs_coll_sync does */
    if (rc == ZS_OK && enq == ZS_OK && c->vt->sync_check)
        rc = c->vt->sync_check(c, &serr);
    zs_dev_free(c->dev, dbuf);
    if (enq != ZS_OK)
        return enq; /* err holds the refusal */
    if (rc != ZS_OK) {
        if (err)
            *err = serr;
        zs_err_prefix(err, "%s: ", what);
    }
    return rc;
}

int zs_coll_all_reduce_host(zs_coll_t *c, void *host, size_t count, zs_dtype_t dt, zs_coll_op_t op,
                            zs_err_t *err)
{
    return host_coll(c, HOST_ALL_REDUCE, host, count, dt, op, 0, err);
}

int zs_coll_broadcast_host(zs_coll_t *c, void *host, size_t count, zs_dtype_t dt, int root,
                           zs_err_t *err)
{
    return host_coll(c, HOST_BROADCAST, host, count, dt, ZS_OP_SUM, root, err);
}
