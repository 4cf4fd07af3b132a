/*
 * zs_coll_nccl.c - the zs_coll interface (zs_coll.h) on NCCL, for GPU
 * workers: the MPI bootstrap, the device check and agreement, the
 * non-blocking communicator, the collectives and destroy. The watchdog and
 * the tracking of outstanding collectives are in zs_coll_nccl_watchdog.c.
 *
 * Bootstrap (collective over MPI_COMM_WORLD, on a private dup with
 * MPI_ERRORS_RETURN): the node-local rank from MPI_Comm_split_type(SHARED);
 * rank 0 calls ncclGetUniqueId and broadcasts the 128 bytes with its status,
 * so a failure on rank 0 reaches every rank instead of a hang. Then every
 * rank checks its device (one GPU per rank, chosen by local rank; PCI bus
 * ids gathered on the node to refuse two ranks on one GPU) and all agree
 * with one MPI_Allreduce before any NCCL call, so either every rank goes on
 * to ncclCommInitRankConfig or every rank returns an error.
 *
 * Communicator: non-blocking (ncclConfig_t.blocking = 0); every NCCL call
 * that returns ncclInProgress is settled by polling ncclCommGetAsyncError
 * with the deadline before anything else is done on the communicator, as
 * NCCL requires. Every NCCL call goes through ZS_NCCL_CHECK and every CUDA
 * call through ZS_CUDA_CHECK; an NCCL error breaks the communicator (it is
 * aborted; later calls refuse with ZS_ERR_STATE).
 *
 * Collectives are NCCL's in place, enqueued on the communicator's own
 * high-priority stream (zs_coll.h's layouts): reduce-scatter
 * ncclReduceScatter(buf, buf + rank*count), all-gather
 * ncclAllGather(buf + rank*count, buf), all-reduce and broadcast with
 * send == recv. fp32/bf16/fp16 as ncclFloat32/ncclBfloat16/ncclFloat16,
 * SUM/MAX as ncclSum/ncclMax. count == 0 enqueues nothing. The barrier is an
 * all-reduce of one element followed by a wait with the deadline.
 *
 * Numerics (deviation from the MPI implementation): reduction order and the
 * rounding of bf16/fp16 partial sums are NCCL's (deterministic for a fixed
 * world size, topology and NCCL version and settings, not equal to the MPI
 * order), and MAX with a NaN follows NCCL's max (a NaN operand may lose).
 * The engine's MAX is over 0/1 flags, which is exact either way.
 *
 * Topology (zs_coll_topo.c, over the bootstrap's MPI world): the node's
 * ranks and one local rank across nodes get NCCL communicators of their
 * own, made once at create (an id from each group's first rank, broadcast
 * over the group's MPI split; ncclCommSplit is not used), each with its
 * own watchdog, on the world communicator's stream. ZS_RANKS_PER_NODE
 * changes only these groups: the GPU of a rank is still chosen by its
 * shared-memory local rank.
 *
 * All-to-all (qgZ's hops, zs__nccl_all_to_all): one ncclSend and one
 * ncclRecv per peer inside ncclGroupStart .. ncclGroupEnd, as NCCL's guide
 * writes an all-to-all. qwZ and qgZ themselves are in zs_coll_nccl_q8.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "zs_coll_nccl_internal.h"
#include "zs_coll_topo.h"
#include "zs_dev_cuda.h"

_Static_assert(ZS_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");

#define HINT_COLL                                                                                  \
    "all ranks must call the same collectives in the same order with the same counts and dtypes"

static const zs_coll_vtable_t nccl_vt;

/* ---- MPI bootstrap ------------------------------------------------------------- */

static int mpi_fail(int mrc, const char *call, int rank, zs_err_t *err)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mrc, text, &len) != MPI_SUCCESS || len <= 0)
        snprintf(text, sizeof text, "MPI error %d", mrc);
    return zs_err_set(err, ZS_ERR_INTERNAL,
                      "NCCL bootstrap: %s on rank %d: %s (hint: is mpirun running every rank?)",
                      call, rank, text);
}

#define MPI_TRY(call, ...)                                                                         \
    do {                                                                                           \
        int mrc_ = call(__VA_ARGS__);                                                              \
        if (mrc_ != MPI_SUCCESS) {                                                                 \
            rc = mpi_fail(mrc_, #call, b->rank, err);                                              \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* The bootstrap; on success *world (a dup of MPI_COMM_WORLD) and *local
 * (this node's ranks) are the caller's to free. */
static int boot(zs_nccl_boot_t *b, MPI_Comm *world, MPI_Comm *local, zs_err_t *err)
{
    memset(b, 0, sizeof *b);
    *world = *local = MPI_COMM_NULL;
    int inited = 0, finalized = 0, rc = ZS_OK;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return zs_err_set(err, ZS_ERR_STATE,
                          "NCCL bootstrap: MPI is %s (hint: MPI_Init_thread first)",
                          finalized ? "already finalized" : "not initialised");
    MPI_Comm_rank(MPI_COMM_WORLD, &b->rank);
    MPI_TRY(MPI_Comm_dup, MPI_COMM_WORLD, world);
    MPI_TRY(MPI_Comm_set_errhandler, *world, MPI_ERRORS_RETURN);
    MPI_TRY(MPI_Comm_size, *world, &b->size);
    MPI_TRY(MPI_Comm_split_type, *world, MPI_COMM_TYPE_SHARED, b->rank, MPI_INFO_NULL, local);
    MPI_TRY(MPI_Comm_set_errhandler, *local, MPI_ERRORS_RETURN);
    MPI_TRY(MPI_Comm_rank, *local, &b->local_rank);
    MPI_TRY(MPI_Comm_size, *local, &b->local_size);
    struct {
        int status;
        char msg[ZS_ERR_MSG_MAX];
        ncclUniqueId id;
    } pkt;
    memset(&pkt, 0, sizeof pkt);
    if (b->rank == 0) {
        zs_err_t e;
        pkt.status = ZS_NCCL_CHECK(&e, 0, -1, "is NCCL's network reachable? (NCCL_SOCKET_IFNAME)",
                                   ncclGetUniqueId, &pkt.id);
        if (pkt.status)
            memcpy(pkt.msg, e.msg, sizeof pkt.msg);
    }
    MPI_TRY(MPI_Bcast, &pkt, (int)sizeof pkt, MPI_BYTE, 0, *world);
    if (pkt.status) {
        rc = zs_err_set(err, pkt.status,
                        "NCCL bootstrap: rank 0 could not make the unique id: %.260s", pkt.msg);
        goto out;
    }
    memcpy(b->id, &pkt.id, sizeof b->id);
out:
    if (rc) {
        if (*local != MPI_COMM_NULL)
            MPI_Comm_free(local);
        if (*world != MPI_COMM_NULL)
            MPI_Comm_free(world);
    }
    return rc;
}

int zs_coll_nccl_bootstrap(zs_nccl_boot_t *out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_coll_nccl_bootstrap: out is NULL");
    MPI_Comm world, local;
    int rc = boot(out, &world, &local, err);
    if (rc == ZS_OK) {
        MPI_Comm_free(&local);
        MPI_Comm_free(&world);
    }
    return rc;
}

/* This rank's device check (no MPI): ZS_OK, or an error saying why this
 * rank cannot take part. Fills busid (PCI bus id) on success. */
static int check_device(const zs_nccl_boot_t *b, zs_dev_t *dev, char *busid, size_t n,
                        zs_err_t *err)
{
    char why[200];
    int ndev = zs_dev_cuda_available(why, sizeof why);
    if (!dev)
        return ndev == 0 ? zs_err_set(err, ZS_ERR_UNAVAILABLE, "rank %d: %s", b->rank, why)
                         : zs_err_set(err, ZS_ERR_INVALID,
                                      "rank %d: no CUDA device given (dev is "
                                      "NULL; hint: zs_dev_cuda_create(local rank))",
                                      b->rank);
    int ord = zs__dev_cuda_ordinal(dev);
    if (ord < 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "rank %d: device '%s' is not a CUDA device (NCCL needs one)", b->rank,
                          dev->desc);
    int want = ndev >= b->local_size ? b->local_rank : ndev == 1 ? 0 : -1;
    if (want < 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "rank %d: %d ranks on this node but %d GPUs visible (NCCL needs one GPU "
                          "per rank)",
                          b->rank, b->local_size, ndev);
    if (ord != want)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "rank %d (local rank %d) was given cuda:%d, its GPU is cuda:%d (hint: "
                          "zs_dev_cuda_create(local rank))",
                          b->rank, b->local_rank, ord, want);
    int rc =
        ZS_CUDA_CHECK(err, ord, "is the GPU usable?", cudaDeviceGetPCIBusId, busid, (int)n, ord);
    if (rc)
        zs_err_prefix(err, "rank %d: ", b->rank);
    return rc;
}

/* Gather every local rank's bus id, refuse duplicates, then agree over the
 * world: returns this rank's error, or one naming the first failing rank. */
static int agree(const zs_nccl_boot_t *b, MPI_Comm world, MPI_Comm local, int own_rc,
                 const zs_err_t *own, const char *busid, zs_err_t *err)
{
    enum { BUS = 32 };
    char mine[BUS] = {0};
    int rc = own_rc;
    zs_err_t e = *own;
    if (!rc)
        snprintf(mine, sizeof mine, "%s", busid);
    char *all = calloc((size_t)b->local_size, BUS);
    if (!all)
        return zs_err_set(err, ZS_ERR_NOMEM, "NCCL bootstrap: no memory");
    int mrc = MPI_Allgather(mine, BUS, MPI_CHAR, all, BUS, MPI_CHAR, local);
    if (mrc != MPI_SUCCESS) {
        free(all);
        return mpi_fail(mrc, "MPI_Allgather", b->rank, err);
    }
    for (int i = 0; !rc && i < b->local_size; i++) {
        if (i != b->local_rank && all[i * BUS] && strncmp(all + i * BUS, mine, BUS) == 0)
            rc = zs_err_set(&e, ZS_ERR_INVALID,
                            "rank %d: local ranks %d and %d share GPU %s; NCCL needs one GPU "
                            "per rank (a one-GPU machine runs 1 rank)",
                            b->rank, i < b->local_rank ? i : b->local_rank,
                            i < b->local_rank ? b->local_rank : i, mine);
    }
    free(all);
    int flag = rc ? b->rank : b->size, first = b->size;
    mrc = MPI_Allreduce(&flag, &first, 1, MPI_INT, MPI_MIN, world);
    if (mrc != MPI_SUCCESS)
        return mpi_fail(mrc, "MPI_Allreduce", b->rank, err);
    if (rc) {
        if (err)
            *err = e;
        return zs_err_prefix(err, "zs_coll_nccl_create: ");
    }
    if (first < b->size)
        return zs_err_set(err, ZS_ERR_UNAVAILABLE,
                          "zs_coll_nccl_create: rank %d cannot use its GPU (its error says why); "
                          "no communicator on any rank",
                          first);
    return ZS_OK;
}

/* ---- collectives ----------------------------------------------------------------- */

enum { K_RS, K_AG, K_AR, K_BC, K_A2A };
static const char *const KIND_NAME[] = {"reduce_scatter", "all_gather", "all_reduce", "broadcast",
                                        "all_to_all"};

static ncclDataType_t nccl_type(zs_dtype_t dt)
{
    return dt == ZS_DTYPE_F32 ? ncclFloat32 : dt == ZS_DTYPE_BF16 ? ncclBfloat16 : ncclFloat16;
}

/* The NCCL call for k on c's stream (nccl_mu held); *call = its name. */
static ncclResult_t issue(zs__coll_nccl_t *c, const zs__nccl_call_t *k, const char **call)
{
    switch (k->kind) {
    case K_RS:
        *call = "ncclReduceScatter";
        return ncclReduceScatter(k->send, k->recv, k->count, k->type, ncclSum, c->comm, c->cs);
    case K_AG:
        *call = "ncclAllGather";
        return ncclAllGather(k->send, k->recv, k->count, k->type, c->comm, c->cs);
    case K_AR:
        *call = "ncclAllReduce";
        return ncclAllReduce(k->send, k->recv, k->count, k->type, k->op, c->comm, c->cs);
    case K_BC:
        *call = "ncclBroadcast";
        return ncclBroadcast(k->send, k->recv, k->count, k->type, k->root, c->comm, c->cs);
    default: { /* K_A2A: count bytes to and from each peer, peers in rank order */
        ncclResult_t r = ncclGroupStart(), r_end;
        *call = "ncclSend/ncclRecv";
        for (int p = 0; p < c->base.size && (r == ncclSuccess || r == ncclInProgress); p++) {
            r = ncclSend(k->send + (size_t)p * k->count, k->count, ncclInt8, p, c->comm, c->cs);
            if (r == ncclSuccess || r == ncclInProgress)
                r = ncclRecv(k->recv + (size_t)p * k->count, k->count, ncclInt8, p, c->comm, c->cs);
        }
        r_end = ncclGroupEnd(); /* closes the group whatever happened inside */
        if (r != ncclSuccess && r != ncclInProgress)
            return r;
        if (r_end != ncclSuccess)
            *call = "ncclGroupEnd";
        return r_end;
    }
    }
}

/* A failed NCCL call: the error (naming the call and `what`), the
 * communicator marked broken and aborted; returns the error's code. */
static int call_failed(zs__coll_nccl_t *c, ncclResult_t r, const char *call, const char *what,
                       zs_err_t *err)
{
    zs_err_t e;
    zs__nccl_check(r, call, __FILE__, __LINE__, c->base.rank, c->device, HINT_COLL, &e);
    zs_err_prefix(&e, "NCCL %s: ", what);
    zs__nccl_fail(c, &e);
    if (err)
        *err = e;
    return e.code;
}

/* Enqueue k on c's stream now (no group open): the NCCL call, settled,
 * then tracked by the watchdog. */
static int launch(zs__coll_nccl_t *c, const zs__nccl_call_t *k, const char *name, zs_err_t *err)
{
    int rc = ZS_CUDA_CHECK(err, c->device, "was the device reset?", cudaSetDevice, c->device);
    if (rc)
        return rc;
    const char *call = "ncclReduceScatter";
    pthread_mutex_lock(&c->nccl_mu);
    if (!c->comm) {
        pthread_mutex_unlock(&c->nccl_mu);
        return zs__nccl_refuse(c, name, err);
    }
    ncclResult_t r = issue(c, k, &call);
    if (r == ncclInProgress)
        r = zs__nccl_settle(c);
    pthread_mutex_unlock(&c->nccl_mu);
    if (r != ncclSuccess)
        return call_failed(c, r, call, k->what, err);
    return zs__nccl_track(c, k->what, err);
}

/* Check one in-place collective; outside a group enqueue it on c's stream,
 * settle and track it; inside one keep it for group_flush. */
static int enqueue(zs__coll_nccl_t *c, int kind, void *buf, size_t count, zs_dtype_t dt,
                   zs_coll_op_t op, int root, zs_err_t *err)
{
    const char *name = KIND_NAME[kind];
    int rc = zs__nccl_refuse(c, name, err);
    if (rc)
        return rc;
    size_t es = zs_dtype_size(dt);
    if (es == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "NCCL %s: dtype %d is not fp32, bf16 or fp16", name,
                          (int)dt);
    if (kind == K_AR && op != ZS_OP_SUM && op != ZS_OP_MAX)
        return zs_err_set(err, ZS_ERR_INVALID, "NCCL %s: op %d is not ZS_OP_SUM or ZS_OP_MAX", name,
                          (int)op);
    if (kind == K_BC && (root < 0 || root >= c->base.size))
        return zs_err_set(err, ZS_ERR_INVALID, "NCCL %s: root %d is not a rank (size %d)", name,
                          root, c->base.size);
    size_t mult = (kind == K_RS || kind == K_AG) ? (size_t)c->base.size : 1;
    if (count > SIZE_MAX / es / mult)
        return zs_err_set(err, ZS_ERR_RANGE, "NCCL %s: %zu x %zu elements overflow", name, mult,
                          count);
    if (count == 0)
        return ZS_OK;
    if (!buf)
        return zs_err_set(err, ZS_ERR_INVALID, "NCCL %s: buf is NULL for %zu elements", name,
                          count);
    zs__nccl_call_t k;
    char *b = buf;
    size_t block = count * es * (size_t)c->base.rank;
    k.kind = kind;
    k.send = kind == K_AG ? b + block : b; /* in place, NCCL's layouts (zs_coll.h) */
    k.recv = kind == K_RS ? b + block : b;
    k.count = count;
    k.type = nccl_type(dt);
    k.op = op == ZS_OP_MAX ? ncclMax : ncclSum;
    k.root = root;
    snprintf(k.what, sizeof k.what, "%s of %zu %s", name, count, zs_dtype_name(dt));
    if (c->base.grouped) {
        /* zs_coll.c flushes at ZS_COLL_GROUP_MAX, so there is room */
        if (c->ngq >= ZS_COLL_GROUP_MAX)
            return zs_err_set(err, ZS_ERR_INTERNAL, "NCCL %s: group queue full", name);
        c->gq[c->ngq++] = k;
        return ZS_OK;
    }
    return launch(c, &k, name, err);
}

/* See zs_coll_nccl_internal.h. */
int zs__nccl_all_to_all(zs__coll_nccl_t *c, const void *send, void *recv, size_t bytes,
                        zs_err_t *err)
{
    int rc = zs__nccl_refuse(c, "all_to_all", err);
    if (rc)
        return rc;
    if (c->base.grouped)
        return zs_err_set(err, ZS_ERR_STATE,
                          "NCCL all_to_all: called inside an open group (not supported)");
    if (bytes == 0)
        return ZS_OK;
    if (!send || !recv || send == recv)
        return zs_err_set(err, ZS_ERR_INVALID, "NCCL all_to_all: send or recv NULL, or the same");
    zs__nccl_call_t k;
    memset(&k, 0, sizeof k);
    k.kind = K_A2A;
    k.send = (char *)send;
    k.recv = recv;
    k.count = bytes;
    snprintf(k.what, sizeof k.what, "all_to_all of %zu bytes per rank", bytes);
    return launch(c, &k, "all_to_all", err);
}

/* The group's kept collectives in one ncclGroupStart .. ncclGroupEnd (a
 * fused launch; in non-blocking mode the end may return ncclInProgress,
 * settled like any call), then one watchdog entry for all of them. */
static int nccl_group_flush(zs_coll_t *zc, zs_err_t *err)
{
    zs__coll_nccl_t *c = (zs__coll_nccl_t *)zc;
    int n = c->ngq;
    c->ngq = 0;
    if (n == 0)
        return ZS_OK;
    char what[72];
    snprintf(what, sizeof what, "group of %d (%.40s, ...)", n, c->gq[0].what);
    int rc = zs__nccl_refuse(c, "group", err);
    if (rc == ZS_OK)
        rc = ZS_CUDA_CHECK(err, c->device, "was the device reset?", cudaSetDevice, c->device);
    if (rc)
        return rc;
    const char *call = "ncclGroupStart";
    pthread_mutex_lock(&c->nccl_mu);
    if (!c->comm) {
        pthread_mutex_unlock(&c->nccl_mu);
        return zs__nccl_refuse(c, "group", err);
    }
    ncclResult_t r = ncclGroupStart(), r_end = ncclSuccess;
    if (r == ncclSuccess) {
        for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++)
            r = issue(c, &c->gq[i], &call);
        if (r == ncclInProgress) /* inside a group the launch is at the end */
            r = ncclSuccess;
        r_end = ncclGroupEnd(); /* always closes the group NCCL opened */
        if (r_end == ncclInProgress)
            r_end = zs__nccl_settle(c);
    }
    pthread_mutex_unlock(&c->nccl_mu);
    if (r != ncclSuccess)
        return call_failed(c, r, call, what, err);
    if (r_end != ncclSuccess)
        return call_failed(c, r_end, "ncclGroupEnd", what, err);
    return zs__nccl_track(c, what, err);
}

static int nccl_reduce_scatter(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_err_t *err)
{
    return enqueue((zs__coll_nccl_t *)c, K_RS, buf, count, dt, ZS_OP_SUM, 0, err);
}

static int nccl_all_gather(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_err_t *err)
{
    return enqueue((zs__coll_nccl_t *)c, K_AG, buf, count, dt, ZS_OP_SUM, 0, err);
}

static int nccl_all_reduce(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_coll_op_t op,
                           zs_err_t *err)
{
    return enqueue((zs__coll_nccl_t *)c, K_AR, buf, count, dt, op, 0, err);
}

static int nccl_broadcast(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root,
                          zs_err_t *err)
{
    return enqueue((zs__coll_nccl_t *)c, K_BC, buf, count, dt, ZS_OP_SUM, root, err);
}

/* An all-reduce of one element, then wait (with the deadline) for it and
 * everything before it on the communicator's stream. */
static int nccl_barrier(zs_coll_t *zc, zs_err_t *err)
{
    zs__coll_nccl_t *c = (zs__coll_nccl_t *)zc;
    int rc = enqueue(c, K_AR, c->scratch, 1, ZS_DTYPE_F32, ZS_OP_SUM, 0, err);
    if (rc == ZS_OK)
        rc = zs__nccl_wait_all(c, err);
    if (rc)
        zs_err_prefix(err, "barrier: ");
    return rc;
}

/* Waits for the queued collectives (within the deadline), finalizes and
 * destroys the communicator (ncclCommAbort if that does not settle), then
 * frees the stream, event and scratch. */
static void nccl_destroy(zs_coll_t *zc)
{
    zs__coll_nccl_t *c = (zs__coll_nccl_t *)zc;
    zs_err_t e;
    /* the sub-communicators first: they borrow this one's stream */
    zs_coll_t *sub[4] = {zc->intra, zc->inter, zc->shard, zc->replica};
    for (int j = 0; j < 4; j++)
        if (sub[j])
            nccl_destroy(sub[j]);
    zc->intra = zc->inter = zc->shard = zc->replica = NULL;
    if (c->comm && zs__nccl_refuse(c, "destroy", &e) == ZS_OK)
        zs__nccl_wait_all(c, &e); /* on timeout it aborts the communicator */
    zs__nccl_watchdog_stop(c);
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->nccl_mu);
    if (c->comm) {
        ncclResult_t r = ncclCommFinalize(c->comm);
        if (r == ncclInProgress || r == ncclSuccess)
            r = zs__nccl_settle(c);
        if (r == ncclSuccess)
            r = ncclCommDestroy(c->comm);
        if (r != ncclSuccess)
            ncclCommAbort(c->comm);
        c->comm = NULL;
    }
    pthread_mutex_unlock(&c->nccl_mu);
    zs__nccl_ring_deinit(c);
    zs_dev_free(c->base.dev, c->scratch);
    zs_dev_event_destroy(c->base.after_ev);
    if (!c->borrowed)
        zs_dev_stream_destroy(c->base.stream);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->nccl_mu);
    free(c);
}

static int nccl_split(zs_coll_t *zc, int color, int key, int scope, zs_coll_t **out, zs_err_t *err);

static const zs_coll_vtable_t nccl_vt = {
    .name = "nccl",
    .split = nccl_split,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .destroy = nccl_destroy,
    .group_flush = nccl_group_flush,
    .sync_check = zs__nccl_sync_check,
    .q8_pack = zs__nccl_q8_pack,
    .q8_unpack = zs__nccl_q8_unpack,
    .reduce_scatter_q8 = zs__nccl_reduce_scatter_q8,
};

/* ---- creation ---------------------------------------------------------------------- */

/* The communicator's own resources and the non-blocking NCCL init. */
static int bring_up(zs__coll_nccl_t *c, const zs_nccl_boot_t *b, zs_err_t *err)
{
    zs_dev_t *dev = c->base.dev;
    int rc = c->borrowed ? ZS_OK : zs_dev_stream_create(dev, 1, "comm", &c->base.stream, err);
    if (rc == ZS_OK && !c->borrowed) {
        zs__dev_cuda_stream_watch(c->base.stream);
        c->cs = (cudaStream_t)zs__dev_cuda_stream_handle(c->base.stream);
    }
    if (rc == ZS_OK)
        rc = zs_dev_event_create(dev, &c->base.after_ev, err);
    if (rc == ZS_OK)
        rc = zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, sizeof(float), (void **)&c->scratch,
                          err);
    if (rc == ZS_OK)
        rc = ZS_CUDA_CHECK(err, c->device, "was the device reset?", cudaSetDevice, c->device);
    if (rc)
        return rc;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId id;
    memcpy(&id, b->id, sizeof id);
    pthread_mutex_lock(&c->nccl_mu);
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, b->size, id, b->rank, &cfg);
    if ((r == ncclSuccess || r == ncclInProgress) && c->comm)
        r = zs__nccl_settle(c);
    if (r != ncclSuccess) {
        if (r == ncclInProgress)
            rc = zs_err_set(err, ZS_ERR_TIMEOUT,
                            "NCCL communicator init on rank %d (cuda:%d) did not finish in %d ms "
                            "(hint: are all %d ranks up and can they reach each other? "
                            "NCCL_DEBUG=WARN tells more)",
                            b->rank, c->device, c->timeout_ms, b->size);
        else
            rc = zs__nccl_check(r, "ncclCommInitRankConfig", __FILE__, __LINE__, b->rank, c->device,
                                "NCCL_DEBUG=WARN tells more", err);
        if (c->comm)
            ncclCommAbort(c->comm);
        c->comm = NULL;
    }
    pthread_mutex_unlock(&c->nccl_mu);
    if (rc == ZS_OK)
        rc = zs__nccl_watchdog_start(c, err);
    return rc;
}

static const char *scope_name(int scope)
{
    return scope == 1 ? "intra-node" : scope == 2 ? "inter-node" : "MiCS group";
}

/* A communicator of the ranks of `group` (an MPI split of the world) on
 * w's stream: the group's first rank makes the unique id and broadcasts it
 * with its status over the group, then every member inits its NCCL
 * communicator (collective over the group; every group is made by every
 * rank in the same order, so none waits for another's). */
static int make_sub(zs__coll_nccl_t *w, MPI_Comm group, int scope, zs_coll_t **out, zs_err_t *err)
{
    zs_nccl_boot_t b;
    memset(&b, 0, sizeof b);
    MPI_Comm_rank(group, &b.rank);
    MPI_Comm_size(group, &b.size);
    struct {
        int status;
        char msg[ZS_ERR_MSG_MAX];
        ncclUniqueId id;
    } pkt;
    memset(&pkt, 0, sizeof pkt);
    if (b.rank == 0) {
        zs_err_t e;
        pkt.status = ZS_NCCL_CHECK(&e, w->base.rank, w->device, "is NCCL's network reachable?",
                                   ncclGetUniqueId, &pkt.id);
        if (pkt.status)
            memcpy(pkt.msg, e.msg, sizeof pkt.msg);
    }
    int mrc = MPI_Bcast(&pkt, (int)sizeof pkt, MPI_BYTE, 0, group);
    if (mrc != MPI_SUCCESS)
        return mpi_fail(mrc, "MPI_Bcast (node communicators)", w->base.rank, err);
    if (pkt.status)
        return zs_err_set(err, pkt.status, "%s communicator: %.260s", scope_name(scope), pkt.msg);
    memcpy(b.id, &pkt.id, sizeof b.id);
    zs__coll_nccl_t *c = calloc(1, sizeof *c);
    if (!c)
        return zs_err_set(err, ZS_ERR_NOMEM, "no memory");
    c->base.vt = &nccl_vt;
    c->base.rank = b.rank;
    c->base.size = b.size;
    c->base.dev = w->base.dev;
    c->base.stream = w->base.stream;
    c->base.topo = w->base.topo;
    c->base.scope = scope;
    c->borrowed = 1;
    c->cs = w->cs;
    c->device = w->device;
    c->local_rank = w->local_rank;
    c->timeout_ms = w->timeout_ms;
    pthread_mutex_init(&c->nccl_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int rc = bring_up(c, &b, err);
    if (rc) {
        zs_err_prefix(err, "%s communicator: ", scope_name(scope));
        nccl_destroy(&c->base);
        return rc;
    }
    *out = &c->base;
    return ZS_OK;
}

/* MiCS's groups (zs_coll_vtable_t.split): an MPI split of MPI_COMM_WORLD
 * (whose ranks are this communicator's, see boot), then an NCCL
 * communicator of the group on the world's stream, as make_sub. From the
 * caller's thread; collective over every rank. */
static int nccl_split(zs_coll_t *zc, int color, int key, int scope, zs_coll_t **out, zs_err_t *err)
{
    zs__coll_nccl_t *w = (zs__coll_nccl_t *)zc;
    MPI_Comm g = MPI_COMM_NULL;
    int mrc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &g);
    if (mrc != MPI_SUCCESS)
        return mpi_fail(mrc, "MPI_Comm_split (MiCS groups)", zc->rank, err);
    int rc = make_sub(w, g, scope, out, err);
    MPI_Comm_free(&g);
    return rc;
}

int zs_coll_nccl_create(zs_dev_t *dev, int timeout_ms, zs_coll_t **out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_coll_nccl_create: out is NULL");
    *out = NULL;
    zs_nccl_boot_t b;
    MPI_Comm world, local;
    int rc = boot(&b, &world, &local, err);
    if (rc)
        return rc;
    zs_err_t own;
    zs_err_clear(&own);
    char busid[32] = {0};
    int own_rc = check_device(&b, dev, busid, sizeof busid, &own);
    rc = agree(&b, world, local, own_rc, &own, busid, err);
    MPI_Comm_free(&local);
    zs_coll_topo_t topo;
    MPI_Comm mintra = MPI_COMM_NULL, minter = MPI_COMM_NULL;
    if (rc == ZS_OK)
        rc = zs__coll_topo_build(world, &topo, &mintra, &minter, err);
    MPI_Comm_free(&world);
    if (rc)
        return rc;

    zs__coll_nccl_t *c = calloc(1, sizeof *c);
    if (!c)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_coll_nccl_create: no memory");
    c->base.vt = &nccl_vt;
    c->base.rank = b.rank;
    c->base.size = b.size;
    c->base.dev = dev;
    c->device = zs__dev_cuda_ordinal(dev);
    c->local_rank = b.local_rank;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : ZS_NCCL_DEFAULT_TIMEOUT;
    pthread_mutex_init(&c->nccl_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->base.topo = topo;
    rc = bring_up(c, &b, err);
    if (rc == ZS_OK)
        rc = make_sub(c, mintra, 1, &c->base.intra, err);
    if (rc == ZS_OK)
        rc = make_sub(c, minter, 2, &c->base.inter, err);
    MPI_Comm_free(&mintra);
    MPI_Comm_free(&minter);
    if (rc) {
        zs_err_prefix(err, "zs_coll_nccl_create: ");
        nccl_destroy(&c->base);
        return rc;
    }
    *out = &c->base;
    return ZS_OK;
}
