/*
 * zs_coll.h - the collectives the ZeRO engine needs, on a stream: in-place
 * reduce-scatter, all-gather and all-reduce, broadcast, barrier. Open MPI
 * implements them for CPU workers (zs_coll_mpi.c); NCCL for GPU workers
 * (zs_coll_nccl.c, built with CUDA), with the same buffer layout.
 *
 * Streams: a communicator owns one high-priority stream of its device
 * (zs_coll_stream) and every collective is enqueued there, in call order.
 * `after` (may be NULL) is a stream whose work enqueued so far must finish
 * before the collective starts (an event is recorded on it and waited for);
 * `done` (may be NULL) is recorded on the communicator's stream right after
 * the collective, for the consumer to wait on. zs_coll_sync blocks until
 * everything enqueued has run and returns the first error. Other work may
 * be enqueued on zs_coll_stream too (e.g. accumulating a reduced partition)
 * and runs in order with the collectives.
 *
 * Layout (NCCL's in place; buffers are device memory):
 *   reduce-scatter  buf holds size*count elements (block r for rank r); after
 *                   it, buf + rank*count holds this rank's block of the sum;
 *                   the other blocks are undefined
 *   all-gather      buf + rank*count holds this rank's block; after it, buf
 *                   (size*count) holds every rank's block in rank order
 *   all-reduce      buf (count) = op over ranks of buf
 * Callers pad buckets to size * ZS_COLL_ALIGN elements' multiples where they
 * want aligned blocks (the engine pads to a multiple of size only).
 *
 * Numbers: fp32, bf16 and fp16. Sums of bf16/fp16 are computed in fp32 per
 * pairwise step and rounded back (round to nearest even); results are
 * deterministic for a fixed world size. MAX is exact; a NaN wins.
 *
 * Threads: one thread feeds a communicator. The MPI implementation calls MPI
 * from the communicator's stream thread (and from the caller's thread in
 * create and destroy), so MPI must be initialised with
 * MPI_THREAD_SERIALIZED or higher (checked at create); under SERIALIZED the
 * program must not call MPI itself while work is queued on the
 * communicator's stream (zs_coll_sync first).
 */
#ifndef ZS_COLL_H
#define ZS_COLL_H

#include <stddef.h>

#include "zs_dev.h"
#include "zs_dtype.h"
#include "zs_status.h"

#define ZS_COLL_ALIGN 64 /* elements; a block alignment NCCL likes (not required) */

/* Collectives in one fused launch of a group (zs_coll_group_start): a longer
 * group is launched in pieces of this many. */
#define ZS_COLL_GROUP_MAX 64

typedef enum { ZS_OP_SUM = 0, ZS_OP_MAX = 1 } zs_coll_op_t;

typedef struct zs_coll zs_coll_t;

typedef struct zs_coll_vtable {
    const char *name; /* "mpi", "nccl" */
    /* Each enqueues on c->stream; arguments are checked before enqueueing. */
    int (*reduce_scatter)(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_err_t *err);
    int (*all_gather)(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_err_t *err);
    int (*all_reduce)(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_coll_op_t op,
                      zs_err_t *err);
    int (*broadcast)(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root, zs_err_t *err);
    int (*barrier)(zs_coll_t *c, zs_err_t *err);
    void (*destroy)(zs_coll_t *c);
    /* Launch the collectives enqueued since the group opened (or since the
     * last flush) together: NCCL defers them while c->grouped and launches
     * them here inside ncclGroupStart .. ncclGroupEnd. NULL: every
     * collective ran as it was enqueued (MPI), nothing to launch. */
    int (*group_flush)(zs_coll_t *c, zs_err_t *err);
    /* After zs_coll_sync's stream wait: errors the stream does not carry.
     * NCCL reports a failed collective (a dead peer) through
     * ncclCommGetAsyncError while its stream work completes; this asks.
     * NULL: the stream's status is the whole answer (MPI). */
    int (*sync_check)(zs_coll_t *c, zs_err_t *err);
} zs_coll_vtable_t;

struct zs_coll {
    const zs_coll_vtable_t *vt;
    int rank, size;
    zs_dev_t *dev;        /* not owned */
    zs_stream_t *stream;  /* owned: where the collectives run */
    zs_event_t *after_ev; /* owned: recorded on `after` streams */
    /* an open group (zs_coll_group_start); zs_coll.c keeps these */
    int grouped;                         /* a group is open */
    int ngroup;                          /* collectives enqueued since the last flush */
    int npend;                           /* `done` events waiting for the flush */
    zs_event_t *pend[ZS_COLL_GROUP_MAX]; /* not owned */
};

/* Communicator over MPI_COMM_WORLD on device `dev` (the CPU device; buffers
 * are host memory). MPI_Init_thread must have given MPI_THREAD_SERIALIZED
 * or higher. Free with zs_coll_destroy. */
int zs_coll_mpi_create(zs_dev_t *dev, zs_coll_t **out, zs_err_t *err);

/* MPI only: the most elements one MPI call carries (default and maximum
 * 1 << 30); larger collectives are split into pieces. Same value on every
 * rank; applies to collectives enqueued after the call (queued ones keep
 * theirs); enqueues nothing. Tests lower it to reach the split paths. */
int zs_coll_mpi_set_max_chunk(zs_coll_t *c, size_t elems, zs_err_t *err);

/* The communicator's stream (owned by it). */
static inline zs_stream_t *zs_coll_stream(zs_coll_t *c)
{
    return c->stream;
}

/* Make c's stream wait for `after`'s work so far (no-op for NULL). */
int zs__coll_after(zs_coll_t *c, zs_stream_t *after, zs_err_t *err);

/* After a collective was enqueued: record `done` on c's stream (no-op for
 * NULL); inside a group, count it and keep `done` for the flush, flushing
 * when ZS_COLL_GROUP_MAX have gathered. */
int zs__coll_done(zs_coll_t *c, zs_event_t *done, zs_err_t *err);

/* In place (see the layout above): buf + rank*count = this rank's block of
 * the sum of every rank's buf (size*count elements). */
static inline int zs_coll_reduce_scatter(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt,
                                         zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->reduce_scatter(c, buf, count, dt, err);
    return rc == ZS_OK ? zs__coll_done(c, done, err) : rc;
}

/* In place: buf (size*count) = every rank's buf + r*count block. */
static inline int zs_coll_all_gather(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt,
                                     zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->all_gather(c, buf, count, dt, err);
    return rc == ZS_OK ? zs__coll_done(c, done, err) : rc;
}

/* In place: buf (count) = op over ranks of buf. */
static inline int zs_coll_all_reduce(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt,
                                     zs_coll_op_t op, zs_stream_t *after, zs_event_t *done,
                                     zs_err_t *err)
{
    int rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->all_reduce(c, buf, count, dt, op, err);
    return rc == ZS_OK ? zs__coll_done(c, done, err) : rc;
}

static inline int zs_coll_broadcast(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root,
                                    zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->broadcast(c, buf, count, dt, root, err);
    return rc == ZS_OK ? zs__coll_done(c, done, err) : rc;
}

/* Groups: the collectives enqueued between zs_coll_group_start and
 * zs_coll_group_end may be launched together (NCCL: one fused launch per
 * ZS_COLL_GROUP_MAX of them, ncclGroupStart .. ncclGroupEnd; MPI: one after
 * the other as enqueued). Their `after` waits take effect in call order;
 * their `done` events are recorded when the group (or a piece of it) is
 * launched, after all of its collectives, so a consumer never sees a done
 * before the collective. Inside a group: do not enqueue other work on
 * zs_coll_stream (NCCL would run it before the deferred collectives), and
 * zs_coll_sync, zs_coll_barrier and the host helpers are refused
 * (ZS_ERR_STATE), as are a nested start and an end without a start. If
 * zs_coll_group_end fails the group is closed anyway and its done events are
 * not recorded. */
int zs_coll_group_start(zs_coll_t *c, zs_err_t *err);
int zs_coll_group_end(zs_coll_t *c, zs_err_t *err);

/* Enqueue a barrier and wait for it (and everything before it). */
int zs_coll_barrier(zs_coll_t *c, zs_err_t *err);

/* Block until everything enqueued on c's stream has run; first error,
 * including one the backend only reports asynchronously (NCCL: a peer died
 * during a collective whose stream work still completed). */
int zs_coll_sync(zs_coll_t *c, zs_err_t *err);

/* Blocking convenience for small host values (loss, flags, norms): copies
 * `count` elements from host memory into a device buffer of c, all-reduces,
 * copies back and waits. */
int zs_coll_all_reduce_host(zs_coll_t *c, void *host, size_t count, zs_dtype_t dt, zs_coll_op_t op,
                            zs_err_t *err);

/* Likewise a broadcast of host memory from root. */
int zs_coll_broadcast_host(zs_coll_t *c, void *host, size_t count, zs_dtype_t dt, int root,
                           zs_err_t *err);

/* Waits for queued work (collective: every rank), then frees. NULL ok. */
static inline void zs_coll_destroy(zs_coll_t *c)
{
    if (c)
        c->vt->destroy(c);
}

#endif
