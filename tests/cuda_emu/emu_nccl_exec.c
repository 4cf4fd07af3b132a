/*
 * emu_nccl_exec.c - the emulated NCCL's stream side: the work item each
 * collective becomes on the caller's stream (zs_emu_enqueue), run in call
 * order, and the exchange through the shared segment.
 *
 * Does: per chunk, every rank copies its chunk of the send buffer into its
 * staging area, barrier, every rank reads all staging areas and computes
 * its own output in rank order (emu_nccl_reduce.c), barrier (the staging
 * may be reused). Before any data moves, the calls of all ranks are
 * compared (a mismatch names both). On any error the output is poisoned
 * and the error recorded on the communicator. Does not: check arguments
 * (emu_nccl_coll.c) or decide when ops launch (emu_nccl_group.c).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_nccl.h"

static const char *kind_name(int k)
{
    static const char *n[] = {"?",      "AllReduce", "ReduceScatter", "AllGather", "Broadcast",
                              "Reduce", "Send",      "Recv",          "SendRecv",  "CommSplit"};
    return (k >= 1 && k <= 9) ? n[k] : "?";
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
    case ZS_EMU_NCCL_SEND:
    case ZS_EMU_NCCL_RECV:
        snprintf(buf, cap, "%s(%llu x %s, peer %d)", kind_name(d->kind), n, t, d->root);
        break;
    case ZS_EMU_NCCL_SPLIT:
        snprintf(buf, cap, "CommSplit");
        break;
    case ZS_EMU_NCCL_P2P:
        snprintf(buf, cap, "a group of %llu point-to-point calls", n);
        break;
    default:
        snprintf(buf, cap, "Reduce(%llu x %s, %s, root %d)", n, t, zs_emu_nccl_op_name(d->op),
                 d->root);
    }
}

static int desc_eq(const zs_emu_nccl_desc *a, const zs_emu_nccl_desc *b)
{
    return a->cseq == b->cseq && a->kind == b->kind && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root && a->count == b->count;
}

/* Mark the op's output as garbage: after an error "nothing can be assumed
 * about the completion or correctness of enqueued operations" (Fault
 * Tolerance), so the hostile emulator leaves NaNs (0xff bytes), never a
 * plausible half-result. */
static void poison_output(const zs_emu_nccl_op *op, int dev)
{
    if (op->d.kind == ZS_EMU_NCCL_P2P) {
        zs_emu_nccl_p2p_poison(op, dev);
        return;
    }
    /* Only while still allocated: after an error the caller may free. */
    if (op->rbytes && zs_emu_dev_ptr(op->recv, op->rbytes) == dev)
        memset(op->recv, 0xff, op->rbytes);
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
    snprintf(what, sizeof what, "collective #%llu %s", (unsigned long long)d->cseq, me);
    const void *src[ZS_EMU_NCCL_MAX_RANKS];
    uint64_t step = c->step;
    ncclResult_t rc;
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t c0 = ci * chunk_el, c1 = c0 + chunk_el < total ? c0 + chunk_el : total;
        size_t len = c1 - c0;
        if (nchunks > 1) /* a death names the chunk: proof it was mid-collective */
            snprintf(what, sizeof what, "collective #%llu %s, chunk %zu of %zu",
                     (unsigned long long)d->cseq, me, ci + 1, nchunks);
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
                int n0 =
                    snprintf(msg, cap,
                             "cuda-emu nccl: collective #%llu: rank 0 called %s, rank %d called %s",
                             (unsigned long long)d->cseq, a, k, b);
                if (s->slot[0].desc.cseq != s->slot[k].desc.cseq && n0 > 0 && (size_t)n0 < cap)
                    snprintf(msg + n0, cap - (size_t)n0,
                             " as its collective #%llu, rank 0 as #%llu (a collective or "
                             "ncclCommSplit skipped on one of them?)",
                             (unsigned long long)s->slot[k].desc.cseq,
                             (unsigned long long)s->slot[0].desc.cseq);
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

/* Are the op's buffers still device memory of the communicator's device
 * when the stream reaches it? Checked at the call too; freed since (e.g.
 * cudaFreeAsync ahead of it) is what a GPU would fault on. */
static int buffers_live(struct ncclComm *c, const zs_emu_nccl_op *op, char *msg, size_t cap)
{
    const char *which = NULL;
    const void *p = NULL;
    if (op->d.kind == ZS_EMU_NCCL_P2P)
        return zs_emu_nccl_p2p_live(c, op, msg, cap);
    if (op->sbytes && zs_emu_dev_ptr(op->send, op->sbytes) != c->dev)
        which = "sendbuff", p = op->send;
    else if (op->rbytes && zs_emu_dev_ptr(op->recv, op->rbytes) != c->dev)
        which = "recvbuff", p = op->recv;
    if (!which)
        return 1;
    char me[96];
    zs_emu_nccl_describe(&op->d, me, sizeof me);
    snprintf(msg, cap,
             "cuda-emu nccl: collective #%llu %s: rank %d: %s %p is no longer device memory of "
             "device %d when the stream runs it (freed before the collective ran?)",
             (unsigned long long)op->d.cseq, me, c->rank, which, p, c->dev);
    return 0;
}

/* The stream work: runs when the stream reaches the op. NCCL errors do
 * not become CUDA errors (a real NCCL kernel that is aborted just exits);
 * they are reported by ncclCommGetAsyncError. */
static cudaError_t run_op(void *arg)
{
    zs_emu_nccl_op *op = arg;
    struct ncclComm *c = op->comm;
    char msg[ZS_EMU_NCCL_MSG];
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
    else if (!buffers_live(c, op, msg, sizeof msg)) {
        /* An illegal address on a GPU: a sticky CUDA error of the device,
         * and the peers see this rank fail. Nothing written. */
        fprintf(stderr, "%s\n", msg);
        zs_emu_nccl_fail(c, ncclUnhandledCudaError, msg);
        pthread_mutex_lock(&c->mu);
        if (c->exec_seq <= op->d.seq)
            c->exec_seq = op->d.seq + 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return cudaErrorIllegalAddress;
    } else if (op->d.kind == ZS_EMU_NCCL_P2P)
        rc = zs_emu_nccl_p2p_run(c, op, msg, sizeof msg);
    else
        rc = exchange(c, op, msg, sizeof msg);
    if (op->d.kind != ZS_EMU_NCCL_P2P)
        c->colls_done++; /* executor side only, in call order */
    if (rc != ncclSuccess) {
        poison_output(op, c->dev);
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
    zs_emu_nccl_p2p_free(op);
    free(op);
}

ncclResult_t zs_emu_nccl_launch(zs_emu_nccl_op *in)
{
    struct ncclComm *c = in->comm;
    zs_emu_nccl_op *op = malloc(sizeof *op);
    if (!op) {
        zs_emu_nccl_p2p_free(in);
        return ncclSystemError;
    }
    *op = *in;
    pthread_mutex_lock(&c->mu);
    op->d.seq = c->next_seq++;
    /* Ranks match collectives by their number among collectives: a rank's
     * point-to-point groups involve only some of its peers. */
    op->d.cseq = op->d.kind == ZS_EMU_NCCL_P2P ? 0 : c->next_cseq++;
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
