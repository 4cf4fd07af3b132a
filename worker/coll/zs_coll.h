/*
 * zs_coll.h - the collectives the ZeRO engine needs, behind one small
 * interface: reduce-scatter, all-gather, all-reduce, broadcast, barrier,
 * blocking or non-blocking. Implemented on Open MPI now (zs_coll_mpi.c) for
 * CPU workers; the NCCL implementation for GPU workers provides the same
 * table, with device pointers and a stream in place of host memory.
 *
 * Buffers: `send`/`recv` are host pointers for MPI (device pointers for
 * NCCL). Counts are in elements of `dt`. Sums of bf16/fp16 are computed in
 * fp32 per pairwise step and rounded back (round to nearest even), so they
 * are deterministic for a fixed world size.
 *
 * Non-blocking: pass a zs_coll_req_t * to get a handle, then zs_coll_wait.
 * Pass NULL for a blocking call. At most ZS_COLL_MAX_INFLIGHT requests are
 * outstanding per communicator.
 */
#ifndef ZS_COLL_H
#define ZS_COLL_H

#include <stddef.h>

#include "zs_dtype.h"
#include "zs_status.h"

#define ZS_COLL_MAX_INFLIGHT 16

typedef enum { ZS_OP_SUM = 0, ZS_OP_MAX = 1 } zs_coll_op_t;

typedef struct zs_coll zs_coll_t;
typedef struct zs_coll_req zs_coll_req_t; /* opaque; owned by the communicator */

typedef struct zs_coll_vtable {
    const char *name; /* "mpi", "nccl" */
    int (*reduce_scatter)(zs_coll_t *c, const void *send, void *recv, size_t recvcount,
                          zs_dtype_t dt, zs_coll_req_t **req, zs_err_t *err);
    int (*all_gather)(zs_coll_t *c, const void *send, void *recv, size_t sendcount, zs_dtype_t dt,
                      zs_coll_req_t **req, zs_err_t *err);
    int (*all_reduce)(zs_coll_t *c, const void *send, void *recv, size_t count, zs_dtype_t dt,
                      zs_coll_op_t op, zs_coll_req_t **req, zs_err_t *err);
    int (*broadcast)(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root,
                     zs_coll_req_t **req, zs_err_t *err);
    int (*barrier)(zs_coll_t *c, zs_err_t *err);
    int (*wait)(zs_coll_t *c, zs_coll_req_t *req, zs_err_t *err);
    void (*destroy)(zs_coll_t *c);
} zs_coll_vtable_t;

struct zs_coll {
    const zs_coll_vtable_t *vt;
    int rank, size;
};

/* Communicator over MPI_COMM_WORLD (the caller has called MPI_Init, with
 * MPI_THREAD_FUNNELED or higher). Free with zs_coll_destroy. */
int zs_coll_mpi_create(zs_coll_t **out, zs_err_t *err);

/* MPI only: the most elements one MPI call carries (default and maximum
 * 1 << 30); larger collectives are split into pieces (see zs_coll_mpi.c).
 * Same value on every rank, no request in flight. Tests lower it to reach
 * the split paths with small buffers. */
int zs_coll_mpi_set_max_chunk(zs_coll_t *c, size_t elems, zs_err_t *err);

/* recv (recvcount elements) = this rank's block of sum over ranks of send
 * (size * recvcount elements, block r for rank r). send == recv not allowed. */
static inline int zs_coll_reduce_scatter(zs_coll_t *c, const void *send, void *recv,
                                         size_t recvcount, zs_dtype_t dt, zs_coll_req_t **req,
                                         zs_err_t *err)
{
    return c->vt->reduce_scatter(c, send, recv, recvcount, dt, req, err);
}

/* recv (size * sendcount) = concatenation of every rank's send in rank
 * order. send may alias recv + rank * sendcount (in place). */
static inline int zs_coll_all_gather(zs_coll_t *c, const void *send, void *recv, size_t sendcount,
                                     zs_dtype_t dt, zs_coll_req_t **req, zs_err_t *err)
{
    return c->vt->all_gather(c, send, recv, sendcount, dt, req, err);
}

/* recv = op over ranks of send (count elements); send == recv allowed. */
static inline int zs_coll_all_reduce(zs_coll_t *c, const void *send, void *recv, size_t count,
                                     zs_dtype_t dt, zs_coll_op_t op, zs_coll_req_t **req,
                                     zs_err_t *err)
{
    return c->vt->all_reduce(c, send, recv, count, dt, op, req, err);
}

static inline int zs_coll_broadcast(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root,
                                    zs_coll_req_t **req, zs_err_t *err)
{
    return c->vt->broadcast(c, buf, count, dt, root, req, err);
}

static inline int zs_coll_barrier(zs_coll_t *c, zs_err_t *err)
{
    return c->vt->barrier(c, err);
}

/* Wait for a request from a non-blocking call and release it. */
static inline int zs_coll_wait(zs_coll_t *c, zs_coll_req_t *req, zs_err_t *err)
{
    return c->vt->wait(c, req, err);
}

static inline void zs_coll_destroy(zs_coll_t *c)
{
    if (c)
        c->vt->destroy(c);
}

#endif
