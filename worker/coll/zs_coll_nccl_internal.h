/*
 * zs_coll_nccl_internal.h - the NCCL communicator object, shared by
 * zs_coll_nccl.c (bootstrap, collectives, destroy) and
 * zs_coll_nccl_watchdog.c (tracking of outstanding collectives, the
 * watchdog thread, failure and abort). Not for use outside worker/coll.
 *
 * Locks: `nccl_mu` is held around every NCCL call on `comm` and around
 * ncclCommAbort, so the watchdog can never free the communicator under a
 * call in progress (all calls are non-blocking, so it is held briefly;
 * an ncclInProgress wait holds it for at most the timeout). `mu` guards the
 * ring, `broken` and `stop`. The two are never held together.
 */
#ifndef ZS_COLL_NCCL_INTERNAL_H
#define ZS_COLL_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "zs_coll_nccl.h"

#define ZS_NCCL_RING 1024 /* outstanding collectives tracked at once */

/* One collective in flight: an event recorded right after it on the
 * communicator's stream, when it was enqueued, and its name for messages. */
typedef struct zs__nccl_op {
    cudaEvent_t ev; /* created on first use of the slot */
    uint64_t t0_ns; /* CLOCK_MONOTONIC at enqueue */
    uint64_t seq;   /* 1-based count of collectives on this communicator */
    char what[72];  /* "reduce_scatter of 4096 bf16" */
} zs__nccl_op_t;

/* One collective as NCCL is called with it (in place: send and recv are
 * inside the same buffer), kept while a group is open (zs_coll.h). */
typedef struct zs__nccl_call {
    int kind; /* zs_coll_nccl.c's K_RS, K_AG, K_AR, K_BC, K_A2A (count: bytes per peer) */
    char *send, *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
    char what[72];
} zs__nccl_call_t;

typedef struct zs__coll_nccl {
    zs_coll_t base; /* first: zs_coll_t * points here */
    int device, local_rank;
    int timeout_ms;
    int borrowed;    /* a sub-communicator (intra/inter node): base.stream is the world's */
    cudaStream_t cs; /* base.stream's handle */
    float *scratch;  /* one fp32 of device memory (barrier) */

    pthread_mutex_t nccl_mu;
    ncclComm_t comm; /* NULL once aborted or destroyed */

    /* the open group's collectives, launched by the flush (feeding thread only) */
    zs__nccl_call_t gq[ZS_COLL_GROUP_MAX];
    int ngq;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    zs__nccl_op_t ring[ZS_NCCL_RING];
    size_t head, n; /* oldest outstanding, count */
    uint64_t seq;
    char last_what[72]; /* the newest retired collective (messages) */
    uint64_t last_seq;
    int broken;
    zs_err_t broken_err;
    int stop, wd_started;
    pthread_t wd;
} zs__coll_nccl_t;

/* Monotonic nanoseconds. */
uint64_t zs__nccl_now_ns(void);

/* ZS_OK, or ZS_ERR_STATE naming the error that broke the communicator. */
int zs__nccl_refuse(zs__coll_nccl_t *c, const char *what, zs_err_t *err);

/* Record `e` as the communicator's fatal error (first wins), end waits on
 * its stream (zs__dev_cuda_stream_abort) and ncclCommAbort it. Any thread;
 * call with no lock held. */
void zs__nccl_fail(zs__coll_nccl_t *c, const zs_err_t *e);

/* After an NCCL call returned ncclInProgress (with nccl_mu held): poll
 * ncclCommGetAsyncError until the state settles or timeout_ms passes.
 * Returns the settled ncclResult_t, or ncclInProgress on timeout. */
ncclResult_t zs__nccl_settle(zs__coll_nccl_t *c);

/* Track the collective just enqueued: record an event after it on the
 * stream and wake the watchdog. Waits (within the deadline) when
 * ZS_NCCL_RING collectives are already outstanding. */
int zs__nccl_track(zs__coll_nccl_t *c, const char *what, zs_err_t *err);

/* zs_coll_sync's last step (the stream has drained): one round of the
 * watchdog's checks now, so an asynchronous NCCL error of a collective
 * whose stream work completed is returned here rather than at the
 * watchdog's next poll; then the error that broke the communicator, if
 * any, with its own code. vtable sync_check. */
int zs__nccl_sync_check(zs_coll_t *zc, zs_err_t *err);

/* Block until every tracked collective has finished, or the communicator
 * broke (its error, with the watchdog's deadline applying). */
int zs__nccl_wait_all(zs__coll_nccl_t *c, zs_err_t *err);

/* The watchdog thread: start after the communicator is up; stop joins it. */
int zs__nccl_watchdog_start(zs__coll_nccl_t *c, zs_err_t *err);
void zs__nccl_watchdog_stop(zs__coll_nccl_t *c);

/* Destroy the ring's events (after the watchdog stopped). */
void zs__nccl_ring_deinit(zs__coll_nccl_t *c);

/* All-to-all on c's stream (zs_coll_nccl.c): `bytes` from send + p*bytes
 * to rank p, and from rank p into recv + p*bytes, for every rank p of c
 * (itself included); send and recv device memory, not overlapping. Not
 * inside a group. Settled and tracked like any collective; bytes == 0
 * enqueues nothing. */
int zs__nccl_all_to_all(zs__coll_nccl_t *c, const void *send, void *recv, size_t bytes,
                        zs_err_t *err);

/* qwZ's and qgZ's vtable entries (zs_coll_nccl_q8.c; zs_coll.h's
 * q8_pack, q8_unpack and reduce_scatter_q8). */
int zs__nccl_q8_pack(zs_coll_t *zc, void *rec, const void *src, zs_dtype_t dt, size_t n,
                     zs_err_t *err);
int zs__nccl_q8_unpack(zs_coll_t *zc, void *dst, zs_dtype_t dt, const void *rec, size_t n,
                       size_t nrec, zs_err_t *err);
int zs__nccl_reduce_scatter_q8(zs_coll_t *zc, void *buf, size_t count, zs_dtype_t dt, void *work,
                               zs_err_t *err);

#endif
