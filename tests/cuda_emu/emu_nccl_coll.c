/*
 * emu_nccl_coll.c - the emulated NCCL's collectives and group calls:
 * argument and pointer checks at call time, group bookkeeping, the launch
 * onto the caller's stream (zs_emu_enqueue) and the exchange through the
 * shared segment when the stream reaches the op.
 *
 * Does: ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast,
 * ncclBcast, ncclReduce; ncclGroupStart/End. Checks (user guide sections
 * cited at each): in-place pointer rules, other overlaps, device memory of
 * the communicator's device large enough, the same call on every rank in
 * the same order (compared before any data moves). Does not: point-to-point
 * (ncclSend/Recv), ncclAlltoAll, user-defined reduction ops.
 *
 * Exchange: every rank copies its chunk of the send buffer into its staging
 * area, barrier, every rank reads all staging areas and computes its own
 * output in rank order (emu_nccl_reduce.c), barrier (the staging may be
 * reused). A collective larger than the staging runs in chunks.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_nccl.h"

#define EXPORT_P(ret, name, params) ret p##name params __attribute__((alias(#name)));

/* Per thread, as NCCL's group state is ("Group Calls": group primitives
 * define the behaviour of the current thread). */
static _Thread_local struct {
    int depth;
    zs_emu_nccl_op *ops;
    int n, cap;
    ncclResult_t err;
} g_group;

int zs_emu_nccl_group_depth(void)
{
    return g_group.depth;
}

int zs_emu_nccl_group_has(struct ncclComm *c)
{
    for (int i = 0; i < g_group.n; i++)
        if (g_group.ops[i].comm == c)
            return 1;
    return 0;
}

static const char *kind_name(int k)
{
    static const char *n[] = {"?",         "AllReduce", "ReduceScatter",
                              "AllGather", "Broadcast", "Reduce"};
    return (k >= 1 && k <= 5) ? n[k] : "?";
}

void zs_emu_nccl_describe(const zs_emu_nccl_desc *d, char *buf, size_t cap)
{
    const char *t = zs_emu_nccl_dtype_name(d->dtype);
    unsigned long long n = (unsigned long long)d->count;
    switch (d->kind) {
    case ZS_EMU_NCCL_ALLREDUCE:
    case ZS_EMU_NCCL_REDUCESCATTER:
        snprintf(buf, cap, "%s(%llu x %s, %s)", kind_name(d->kind), n, t,
                 zs_emu_nccl_op_name(d->op));
        break;
    case ZS_EMU_NCCL_ALLGATHER:
        snprintf(buf, cap, "AllGather(%llu x %s)", n, t);
        break;
    case ZS_EMU_NCCL_BROADCAST:
        snprintf(buf, cap, "Broadcast(%llu x %s, root %d)", n, t, d->root);
        break;
    default:
        snprintf(buf, cap, "Reduce(%llu x %s, %s, root %d)", n, t, zs_emu_nccl_op_name(d->op),
                 d->root);
    }
}

static int desc_eq(const zs_emu_nccl_desc *a, const zs_emu_nccl_desc *b)
{
    return a->seq == b->seq && a->kind == b->kind && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root && a->count == b->count;
}

/* Mark the op's output as garbage: after an error "nothing can be assumed
 * about the completion or correctness of enqueued operations" (Fault
 * Tolerance), so the hostile emulator leaves NaNs (0xff bytes), never a
 * plausible half-result. */
static void poison_output(const zs_emu_nccl_op *op, size_t esz, int nranks, int rank)
{
    size_t n = op->d.count;
    if (op->d.kind == ZS_EMU_NCCL_ALLGATHER)
        n *= (size_t)nranks;
    if (op->d.kind == ZS_EMU_NCCL_REDUCE && rank != op->d.root)
        return;
    if (op->recv && n)
        memset(op->recv, 0xff, n * esz);
}

static ncclResult_t exchange(struct ncclComm *c, zs_emu_nccl_op *op, char *msg, size_t cap)
{
    zs_emu_nccl_seg *s = c->seg;
    const zs_emu_nccl_desc *d = &op->d;
    int n = c->nranks, r = c->rank;
    size_t esz = zs_emu_nccl_dtype_size(d->dtype);
    size_t total = d->count; /* elements of the buffer each rank posts */
    if (d->kind == ZS_EMU_NCCL_REDUCESCATTER)
        total = d->count * (size_t)n;
    const unsigned char *post = op->send;
    if (d->kind == ZS_EMU_NCCL_BROADCAST && r != d->root)
        post = NULL; /* sendbuff only used on the root (api/colls) */
    unsigned char *recv = op->recv;
    size_t chunk_el = s->chunk / esz;
    size_t nchunks = total ? (total + chunk_el - 1) / chunk_el : 1;
    char what[256], me[96];
    zs_emu_nccl_describe(d, me, sizeof me);
    snprintf(what, sizeof what, "collective #%llu %s", (unsigned long long)d->seq, me);
    const void *src[ZS_EMU_NCCL_MAX_RANKS];
    uint64_t step = c->step;
    ncclResult_t rc;
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t c0 = ci * chunk_el, c1 = c0 + chunk_el < total ? c0 + chunk_el : total;
        size_t len = c1 - c0;
        if (nchunks > 1) /* a death names the chunk: proof it was mid-collective */
            snprintf(what, sizeof what, "collective #%llu %s, chunk %zu of %zu",
                     (unsigned long long)d->seq, me, ci + 1, nchunks);
        if (ci == 0)
            s->slot[r].desc = *d; /* published by the barrier's release store */
        if (post && len)
            memcpy(c->staging + (size_t)r * s->chunk, post + c0 * esz, len * esz);
        if ((rc = zs_emu_nccl_barrier(c, ++step, what, msg, cap)) != ncclSuccess)
            return rc;
        if (ci == 0) {
            for (int k = 1; k < n; k++) {
                if (desc_eq(&s->slot[0].desc, &s->slot[k].desc))
                    continue;
                /* Real NCCL hangs or corrupts here; the emulator names both
                 * calls, identically on every rank. */
                char a[96], b[96];
                zs_emu_nccl_describe(&s->slot[0].desc, a, sizeof a);
                zs_emu_nccl_describe(&s->slot[k].desc, b, sizeof b);
                snprintf(msg, cap,
                         "cuda-emu nccl: collective #%llu: rank 0 called %s, rank %d called %s",
                         (unsigned long long)d->seq, a, k, b);
                int zero = 0;
                if (!atomic_compare_exchange_strong(&s->printed, &zero, 1))
                    msg[cap - 1] = 1; /* mark: someone printed it already */
                return ncclInvalidUsage;
            }
        }
        for (int k = 0; k < n; k++)
            src[k] = c->staging + (size_t)k * s->chunk;
        switch (d->kind) {
        case ZS_EMU_NCCL_ALLREDUCE:
            zs_emu_nccl_reduce(recv + c0 * esz, src, n, len, d->dtype, d->op);
            break;
        case ZS_EMU_NCCL_REDUCE:
            if (r == d->root)
                zs_emu_nccl_reduce(recv + c0 * esz, src, n, len, d->dtype, d->op);
            break;
        case ZS_EMU_NCCL_REDUCESCATTER: {
            size_t lo = c0 > r * d->count ? c0 : r * d->count;
            size_t hi = c1 < (r + 1) * d->count ? c1 : (r + 1) * d->count;
            if (lo < hi) {
                const void *off[ZS_EMU_NCCL_MAX_RANKS];
                for (int k = 0; k < n; k++)
                    off[k] = (const unsigned char *)src[k] + (lo - c0) * esz;
                zs_emu_nccl_reduce(recv + (lo - r * d->count) * esz, off, n, hi - lo, d->dtype,
                                   d->op);
            }
            break;
        }
        case ZS_EMU_NCCL_ALLGATHER:
            for (int k = 0; k < n; k++)
                if (len)
                    memcpy(recv + ((size_t)k * d->count + c0) * esz, src[k], len * esz);
            break;
        case ZS_EMU_NCCL_BROADCAST:
            if (len)
                memcpy(recv + c0 * esz, src[d->root], len * esz);
            break;
        }
        if ((rc = zs_emu_nccl_barrier(c, ++step, what, msg, cap)) != ncclSuccess)
            return rc;
    }
    c->step = step;
    return ncclSuccess;
}

/* The stream work: runs when the stream reaches the op. NCCL errors do
 * not become CUDA errors (a real NCCL kernel that is aborted just exits);
 * they are reported by ncclCommGetAsyncError. */
static cudaError_t run_op(void *arg)
{
    zs_emu_nccl_op *op = arg;
    struct ncclComm *c = op->comm;
    char msg[ZS_EMU_NCCL_MSG];
    size_t esz = zs_emu_nccl_dtype_size(op->d.dtype);
    /* The same order on every rank is the order of the calls, even when
     * they go to different streams: run in launch order. */
    pthread_mutex_lock(&c->mu);
    while (c->exec_seq != op->d.seq && !atomic_load(&c->aborted) &&
           atomic_load(&c->async_err) == ncclSuccess)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    ncclResult_t rc = ncclSuccess;
    msg[0] = 0;
    msg[sizeof msg - 1] = 0;
    if (atomic_load(&c->aborted) || atomic_load(&c->async_err) != ncclSuccess)
        rc = ncclInvalidUsage; /* an earlier error or the abort: skip */
    else
        rc = exchange(c, op, msg, sizeof msg);
    if (rc != ncclSuccess) {
        poison_output(op, esz, c->nranks, c->rank);
        if (msg[0] && !atomic_load(&c->aborted)) {
            int printed = msg[sizeof msg - 1] == 1;
            msg[sizeof msg - 1] = 0;
            if (!printed)
                fprintf(stderr, "%s\n", msg);
            zs_emu_nccl_fail(c, rc, msg);
        }
    }
    pthread_mutex_lock(&c->mu);
    if (c->exec_seq <= op->d.seq)
        c->exec_seq = op->d.seq + 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return cudaSuccess;
}

static void free_op(void *arg)
{
    zs_emu_nccl_op *op = arg;
    struct ncclComm *c = op->comm;
    pthread_mutex_lock(&c->mu);
    c->inflight--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    zs_emu_nccl_unref(c);
    free(op);
}

ncclResult_t zs_emu_nccl_launch(zs_emu_nccl_op *in)
{
    struct ncclComm *c = in->comm;
    zs_emu_nccl_op *op = malloc(sizeof *op);
    if (!op)
        return ncclSystemError;
    *op = *in;
    pthread_mutex_lock(&c->mu);
    op->d.seq = c->next_seq++;
    c->inflight++;
    c->refs++;
    pthread_mutex_unlock(&c->mu);
    cudaError_t e = zs_emu_enqueue(op->stream, run_op, op, free_op); /* frees op on failure */
    if (e != cudaSuccess) {
        char m[ZS_EMU_NCCL_MSG];
        snprintf(m, sizeof m, "cuda-emu nccl: rank %d: enqueue on stream %p failed: %s", c->rank,
                 (void *)in->stream, cudaGetErrorName(e));
        zs_emu_nccl_fail(c, ncclUnhandledCudaError, m);
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

static void stash(struct ncclComm *c, const zs_emu_nccl_op *op)
{
    pthread_mutex_lock(&c->mu);
    if (c->nstash == c->capstash) {
        c->capstash = c->capstash ? 2 * c->capstash : 16;
        c->stash = realloc(c->stash, (size_t)c->capstash * sizeof(zs_emu_nccl_op));
    }
    ((zs_emu_nccl_op *)c->stash)[c->nstash++] = *op;
    pthread_mutex_unlock(&c->mu);
}

void zs_emu_nccl_flush_stash(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    zs_emu_nccl_op *ops = c->stash;
    int n = c->nstash;
    c->stash = NULL;
    c->nstash = c->capstash = 0;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) {
        if (atomic_load(&c->async_err) == ncclSuccess && !atomic_load(&c->aborted))
            zs_emu_nccl_launch(&ops[i]); /* else dropped (abort, error) */
        zs_emu_nccl_unref(c);            /* the stash's reference */
    }
    free(ops);
}

/* Launch a group (or one call: an implicit group). A non-blocking
 * communicator may answer ncclInProgress: its ops then launch only when
 * ncclCommGetAsyncError settles ("Non-blocking communicators": do not use
 * the streams until then; the hostile reading really holds them back). */
static ncclResult_t launch_group(zs_emu_nccl_op *ops, int n)
{
    ncclResult_t ret = ncclSuccess;
    for (int i = 0; i < n; i++) {
        struct ncclComm *c = ops[i].comm;
        int stashed = c->nstash > 0;
        if (!c->blocking && !stashed) {
            int polls = zs_emu_nccl_draw_polls(c->rank);
            if (polls > 0) {
                pthread_mutex_lock(&c->mu);
                c->pending_polls = polls;
                pthread_mutex_unlock(&c->mu);
                stashed = 1;
            }
        }
        if (stashed) {
            pthread_mutex_lock(&c->mu);
            c->refs++;
            pthread_mutex_unlock(&c->mu);
            stash(c, &ops[i]);
            ret = ncclInProgress;
            continue;
        }
        ncclResult_t rc = zs_emu_nccl_launch(&ops[i]);
        if (rc != ncclSuccess && ret == ncclSuccess)
            ret = rc;
    }
    return ret;
}

static ncclResult_t group_fail(struct ncclComm *c, ncclResult_t rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t group_fail(struct ncclComm *c, ncclResult_t rc, const char *fmt, ...)
{
    char m[ZS_EMU_NCCL_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", m);
    /* Hostile: a refused call also fails the communicator (its peers would
     * otherwise wait for a collective this rank never launches). */
    zs_emu_nccl_fail(c, rc, m);
    if (g_group.depth > 0 && g_group.err == ncclSuccess)
        g_group.err = rc;
    return rc;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

static ncclResult_t check_buf(struct ncclComm *c, const char *fn, const char *which, const void *p,
                              size_t bytes)
{
    if (!bytes)
        return ncclSuccess;
    int dev = zs_emu_dev_ptr(p, bytes);
    if (dev == c->dev)
        return ncclSuccess;
    if (dev < 0)
        return group_fail(c, ncclInvalidArgument,
                          "cuda-emu nccl: %s: rank %d: %s %p (%zu bytes) is not inside one "
                          "device allocation",
                          fn, c->rank, which, p, bytes);
    return group_fail(c, ncclInvalidArgument,
                      "cuda-emu nccl: %s: rank %d: %s %p is memory of device %d, the "
                      "communicator's device is %d",
                      fn, c->rank, which, p, dev, c->dev);
}

static ncclResult_t coll(int kind, const char *fn, const void *send, void *recv, size_t count,
                         ncclDataType_t dtype, ncclRedOp_t redop, int root, ncclComm_t c,
                         cudaStream_t stream)
{
    ncclResult_t rc = zs_emu_nccl_check(c, fn);
    if (rc != ncclSuccess) {
        if (g_group.depth > 0 && g_group.err == ncclSuccess)
            g_group.err = rc;
        return rc;
    }
    int n = c->nranks, r = c->rank;
    size_t esz = zs_emu_nccl_dtype_size(dtype);
    if (!esz)
        return group_fail(c, ncclInvalidArgument,
                          "cuda-emu nccl: %s: rank %d: data type %d not "
                          "supported by the emulator",
                          fn, r, (int)dtype);
    int reduces = kind == ZS_EMU_NCCL_ALLREDUCE || kind == ZS_EMU_NCCL_REDUCESCATTER ||
                  kind == ZS_EMU_NCCL_REDUCE;
    if (reduces && !zs_emu_nccl_op_ok(redop))
        return group_fail(c, ncclInvalidArgument,
                          "cuda-emu nccl: %s: rank %d: reduction op %d not supported by the "
                          "emulator",
                          fn, r, (int)redop);
    int rooted = kind == ZS_EMU_NCCL_BROADCAST || kind == ZS_EMU_NCCL_REDUCE;
    if (rooted && (root < 0 || root >= n))
        return group_fail(c, ncclInvalidArgument, "cuda-emu nccl: %s: rank %d: root %d of %d ranks",
                          fn, r, root, n);
    if (count > SIZE_MAX / esz / (size_t)n)
        return group_fail(c, ncclInvalidArgument, "cuda-emu nccl: %s: count %zu too large", fn,
                          count);
    size_t one = count * esz, all = one * (size_t)n;
    size_t sbytes = one, rbytes = one;
    int use_send = 1, use_recv = 1;
    if (kind == ZS_EMU_NCCL_REDUCESCATTER)
        sbytes = all; /* sendbuff holds nranks * recvcount (api/colls) */
    if (kind == ZS_EMU_NCCL_ALLGATHER)
        rbytes = all; /* recvbuff holds nranks * sendcount */
    if (kind == ZS_EMU_NCCL_BROADCAST && r != root)
        use_send = 0; /* "sendbuff is only used on rank root" */
    if (kind == ZS_EMU_NCCL_REDUCE && r != root)
        use_recv = 0; /* "recvbuff is only used on rank root" */
    if (use_send && (rc = check_buf(c, fn, "sendbuff", send, sbytes)) != ncclSuccess)
        return rc;
    if (use_recv && (rc = check_buf(c, fn, "recvbuff", recv, rbytes)) != ncclSuccess)
        return rc;
    /* "In-place Operations": AllReduce, Broadcast, Reduce are in place when
     * sendbuff == recvbuff; ReduceScatter when recvbuff == sendbuff +
     * rank * recvcount; AllGather when sendbuff == recvbuff + rank *
     * sendcount. Nothing else is documented for overlapping buffers, so the
     * hostile reading refuses any other overlap. */
    if (use_send && use_recv && overlap(send, sbytes, recv, rbytes)) {
        const unsigned char *s = send, *d = recv;
        if (kind == ZS_EMU_NCCL_REDUCESCATTER) {
            if (d != s + (size_t)r * one)
                return group_fail(c, ncclInvalidArgument,
                                  "cuda-emu nccl: %s: rank %d: recvbuff %p overlaps sendbuff %p "
                                  "but is not the in-place position sendbuff + rank * recvcount "
                                  "= %p (In-place Operations)",
                                  fn, r, recv, send, (const void *)(s + (size_t)r * one));
        } else if (kind == ZS_EMU_NCCL_ALLGATHER) {
            if (s != d + (size_t)r * one)
                return group_fail(c, ncclInvalidArgument,
                                  "cuda-emu nccl: %s: rank %d: sendbuff %p overlaps recvbuff %p "
                                  "but is not the in-place position recvbuff + rank * sendcount "
                                  "= %p (In-place Operations)",
                                  fn, r, send, recv, (const void *)(d + (size_t)r * one));
        } else if (s != d) {
            return group_fail(c, ncclInvalidArgument,
                              "cuda-emu nccl: %s: rank %d: sendbuff %p and recvbuff %p overlap "
                              "without being equal (In-place Operations)",
                              fn, r, send, recv);
        }
    }
    zs_emu_nccl_op op = {.comm = c,
                         .d = {.kind = kind,
                               .dtype = dtype,
                               .op = reduces ? (int)redop : -1,
                               .root = rooted ? root : -1,
                               .count = count},
                         .send = use_send ? send : NULL,
                         .recv = use_recv ? recv : NULL,
                         .stream = stream};
    if (g_group.depth > 0) {
        /* "Group Calls": inside a group the call only records; the op is
         * launched by the outermost ncclGroupEnd. */
        if (g_group.n == g_group.cap) {
            g_group.cap = g_group.cap ? 2 * g_group.cap : 64;
            g_group.ops = realloc(g_group.ops, (size_t)g_group.cap * sizeof *g_group.ops);
        }
        pthread_mutex_lock(&c->mu);
        c->refs++;
        pthread_mutex_unlock(&c->mu);
        g_group.ops[g_group.n++] = op;
        return ncclSuccess;
    }
    return launch_group(&op, 1);
}

ncclResult_t ncclGroupStart(void)
{
    g_group.depth++; /* groups nest ("Group Calls") */
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclGroupStart, (void))

ncclResult_t ncclGroupEnd(void)
{
    if (g_group.depth == 0) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclGroupEnd without ncclGroupStart");
        fprintf(stderr, "cuda-emu nccl: ncclGroupEnd without ncclGroupStart\n");
        return ncclInvalidUsage;
    }
    if (--g_group.depth > 0)
        return ncclSuccess; /* only the outermost end launches */
    zs_emu_nccl_op *ops = g_group.ops;
    int n = g_group.n;
    ncclResult_t err = g_group.err;
    g_group.ops = NULL;
    g_group.n = g_group.cap = 0;
    g_group.err = ncclSuccess;
    ncclResult_t rc = err;
    if (err == ncclSuccess) {
        /* A communicator destroyed or aborted while its calls sat in the
         * group: refuse the whole group. */
        for (int i = 0; i < n && rc == ncclSuccess; i++)
            if (ops[i].comm->magic != ZS_EMU_COMM_LIVE)
                rc = zs_emu_nccl_check(ops[i].comm, "ncclGroupEnd");
        if (rc == ncclSuccess)
            rc = launch_group(ops, n);
    }
    /* Hostile: a group with a refused call launches none of its calls. */
    for (int i = 0; i < n; i++)
        zs_emu_nccl_unref(ops[i].comm);
    free(ops);
    return rc;
}
EXPORT_P(ncclResult_t, ncclGroupEnd, (void))

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_ALLREDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0,
                comm, stream);
}
EXPORT_P(ncclResult_t, ncclAllReduce,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_REDUCESCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount,
                datatype, op, 0, comm, stream);
}
EXPORT_P(ncclResult_t, ncclReduceScatter,
         (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_ALLGATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype,
                ncclSum, 0, comm, stream);
}
EXPORT_P(ncclResult_t, ncclAllGather,
         (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
          ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype,
                ncclSum, root, comm, stream);
}
EXPORT_P(ncclResult_t, ncclBroadcast,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
          ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_BROADCAST, "ncclBcast", buff, buff, count, datatype, ncclSum, root,
                comm, stream);
}
EXPORT_P(ncclResult_t, ncclBcast,
         (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
          cudaStream_t stream))

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_REDUCE, "ncclReduce", sendbuff, recvbuff, count, datatype, op, root,
                comm, stream);
}
EXPORT_P(ncclResult_t, ncclReduce,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))
