/*
 * emu_nccl_p2p.c - the emulated NCCL's point-to-point calls: ncclSend and
 * ncclRecv, inside a group (ncclGroupStart/ncclGroupEnd) or alone (an
 * implicit group of one call), written from the NCCL user guide: API
 * "Point To Point Communication Functions" (ncclSend, ncclRecv) and Usage
 * "Point-to-point communication" (Sendrecv, One-to-all, All-to-one,
 * All-to-all, Neighbor exchange) and "Group Calls".
 *
 * Does:
 *  - call-time checks: peer in [0, nranks), a data type nccl.h defines
 *    (any: nothing is reduced), the buffer inside one device allocation of
 *    the communicator's device for count elements;
 *  - at the group's launch, the sends and receives of one communicator
 *    become one stream op (P2P), run in call order with the communicator's
 *    collectives (emu_nccl_exec.c). Refused there, loudly: p2p calls of one
 *    communicator on different streams in one group (not emulated), a send
 *    to self without its receive in the same group (and the reverse), a
 *    receive buffer overlapping another buffer of the group;
 *  - on the stream: every call of the group progresses independently
 *    ("calls within a group can be seen as progressing independently"),
 *    except calls to the same peer in the same direction, which run in
 *    call order ("point-to-point calls within a group targeting the same
 *    peer ... are executed in order"); the m-th send from i to j matches
 *    the m-th receive on j from i, and their counts and types must be
 *    equal ("with the same count and data type"): a mismatch fails both
 *    ranks with ncclInvalidUsage and a message naming both calls, before
 *    any data moves (real NCCL would truncate, overrun or hang);
 *  - data moves through the sender's staging area in the segment (slice j
 *    of rank i's area carries i -> j), one slice at a time, acknowledged by
 *    the receiver. A send is not complete until the receiver took all of
 *    it: no eager buffering (hostile: "This operation is blocking for the
 *    GPU"), so an ungrouped ring of sends waits for ever (the timeout);
 *  - the receive buffers are filled with 0xff when the stream reaches the
 *    group (their content is undefined until the stream work completes),
 *    and again after an error;
 *  - waits check abort, the peer's state and liveness and the timeout, as
 *    the collectives' barrier does (a dead, failed, aborted or destroyed
 *    peer: the op fails naming it).
 * Does not: ncclAlltoAll/Gather/Scatter (refused by emu_nccl_rest.c),
 * detect a cross-rank deadlock other than by the timeout (a rank in a
 * collective while its peer waits in a send), or run p2p of one group on
 * several streams.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu_nccl.h"

#define EXPORT_P(ret, name, params) ret p##name params __attribute__((alias(#name)));

/* One send or receive of a P2P op, with its progress on the executor. */
typedef struct {
    int send; /* 1: ncclSend, 0: ncclRecv */
    int peer, dtype;
    size_t count, bytes;
    void *buf;
    int phase;        /* 0 not started, 1 published, 2 data, 3 drained (sends), 4 done */
    uint64_t m;       /* message number with peer in this direction, from 1 */
    uint64_t base;    /* posted (send) / acked (recv) counter at the start */
    uint64_t nslices; /* at least 1: a count-0 message still handshakes */
    uint64_t slices;  /* posted (send) / consumed (recv) so far */
} p2p_item;

struct zs_emu_nccl_p2p {
    int n;
    p2p_item it[];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* nccl.h's types: p2p moves bytes, so every one is accepted. 0: not a type. */
static size_t type_size(int t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* ncclSend / ncclRecv: check, then record in the open group or launch as
 * an implicit group of one ("Group Calls": outside a group each call is
 * its own group). */
static ncclResult_t p2p_call(int kind, const char *fn, void *buf, size_t count,
                             ncclDataType_t dtype, int peer, ncclComm_t c, cudaStream_t stream)
{
    ncclResult_t rc = zs_emu_nccl_check(c, fn);
    if (rc != ncclSuccess) {
        zs_emu_nccl_group_error(rc);
        return rc;
    }
    size_t esz = type_size((int)dtype);
    if (!esz)
        return zs_emu_nccl_refuse(c, ncclInvalidArgument,
                                  "cuda-emu nccl: %s: rank %d: data type %d is not "
                                  "one of nccl.h's",
                                  fn, c->rank, (int)dtype);
    if (peer < 0 || peer >= c->nranks)
        return zs_emu_nccl_refuse(
            c, ncclInvalidArgument,
            "cuda-emu nccl: %s: rank %d: peer %d is not a rank of this communicator "
            "(%d ranks)",
            fn, c->rank, peer, c->nranks);
    if (count > SIZE_MAX / esz)
        return zs_emu_nccl_refuse(c, ncclInvalidArgument, "cuda-emu nccl: %s: count %zu too large",
                                  fn, count);
    size_t bytes = count * esz;
    if (bytes) {
        int dev = zs_emu_dev_ptr(buf, bytes);
        if (dev < 0)
            return zs_emu_nccl_refuse(
                c, ncclInvalidArgument,
                "cuda-emu nccl: %s: rank %d: %s %p (%zu bytes) is not inside one device "
                "allocation",
                fn, c->rank, kind == ZS_EMU_NCCL_SEND ? "sendbuff" : "recvbuff", buf, bytes);
        if (dev != c->dev)
            return zs_emu_nccl_refuse(c, ncclInvalidArgument,
                                      "cuda-emu nccl: %s: rank %d: %p is memory of device %d, the "
                                      "communicator's device is %d",
                                      fn, c->rank, buf, dev, c->dev);
    }
    zs_emu_nccl_op op = {
        .comm = c,
        .d = {.kind = kind, .dtype = dtype, .op = -1, .root = peer, .count = count},
        .send = kind == ZS_EMU_NCCL_SEND ? buf : NULL,
        .recv = kind == ZS_EMU_NCCL_RECV ? buf : NULL,
        .sbytes = kind == ZS_EMU_NCCL_SEND ? bytes : 0,
        .rbytes = kind == ZS_EMU_NCCL_RECV ? bytes : 0,
        .stream = stream};
    if (zs_emu_nccl_group_depth() > 0) {
        zs_emu_nccl_group_add(&op); /* launched by the outermost ncclGroupEnd */
        return ncclSuccess;
    }
    int n = 1;
    if ((rc = zs_emu_nccl_p2p_fold(&op, &n)) != ncclSuccess)
        return rc;
    return zs_emu_nccl_launch_group(&op, n);
}

/* api/p2p "ncclSend": count elements of datatype from sendbuff to rank
 * peer, matched by peer's ncclRecv with the same count and type. */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p_call(ZS_EMU_NCCL_SEND, "ncclSend", (void *)sendbuff, count, datatype, peer, comm,
                    stream);
}
EXPORT_P(ncclResult_t, ncclSend,
         (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
          cudaStream_t stream))

/* api/p2p "ncclRecv": count elements of datatype from rank peer into
 * recvbuff, matched by peer's ncclSend with the same count and type. */
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p_call(ZS_EMU_NCCL_RECV, "ncclRecv", recvbuff, count, datatype, peer, comm, stream);
}
EXPORT_P(ncclResult_t, ncclRecv,
         (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
          cudaStream_t stream))

/* Is op a recorded ncclSend/ncclRecv (not yet folded)? */
static int is_p2p(const zs_emu_nccl_op *op)
{
    return op->d.kind == ZS_EMU_NCCL_SEND || op->d.kind == ZS_EMU_NCCL_RECV;
}

/* Do [a, a+na) and [b, b+nb) share a byte? (Empty ranges never do.) */
static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* Checks one communicator's p2p calls of a group (ops[first..n), those
 * with comm c) and builds its P2P op. NULL batch and an error: refused. */
static ncclResult_t build(zs_emu_nccl_op *ops, int first, int n, zs_emu_nccl_op *out)
{
    struct ncclComm *c = ops[first].comm;
    int cnt = 0;
    for (int i = first; i < n; i++)
        if (ops[i].comm == c && is_p2p(&ops[i]))
            cnt++;
    int selfs = 0, selfr = 0;
    for (int i = first; i < n; i++) {
        const zs_emu_nccl_op *a = &ops[i];
        if (a->comm != c || !is_p2p(a))
            continue;
        if (a->stream != ops[first].stream)
            /* "Group Calls" allows several streams; the emulator runs a
             * group's p2p as one stream op, so it refuses rather than
             * order them wrongly. */
            return zs_emu_nccl_refuse(
                c, ncclInvalidUsage,
                "cuda-emu nccl: ncclGroupEnd: rank %d: point-to-point calls of one "
                "communicator on streams %p and %p in one group are not emulated",
                c->rank, (void *)ops[first].stream, (void *)a->stream);
        if (a->d.root == c->rank && a->d.kind == ZS_EMU_NCCL_SEND)
            selfs++;
        else if (a->d.root == c->rank)
            selfr++;
        if (a->d.kind != ZS_EMU_NCCL_RECV)
            continue;
        for (int k = first; k < n; k++) {
            const zs_emu_nccl_op *b = &ops[k];
            if (k == i || b->comm != c || !is_p2p(b))
                continue;
            const void *bp = b->d.kind == ZS_EMU_NCCL_SEND ? b->send : b->recv;
            size_t bb = b->d.kind == ZS_EMU_NCCL_SEND ? b->sbytes : b->rbytes;
            /* Calls of a group progress independently ("Point-to-point
             * communication"): a receive buffer that overlaps another
             * buffer of the group is written while the other is read or
             * written, in no defined order. */
            if (overlap(a->recv, a->rbytes, bp, bb))
                return zs_emu_nccl_refuse(
                    c, ncclInvalidArgument,
                    "cuda-emu nccl: ncclGroupEnd: rank %d: recvbuff %p (%zu bytes, "
                    "from peer %d) overlaps the %s buffer %p (%zu bytes, peer %d) of "
                    "the same group",
                    c->rank, a->recv, a->rbytes, a->d.root,
                    b->d.kind == ZS_EMU_NCCL_SEND ? "send" : "receive", bp, bb, b->d.root);
        }
    }
    if (selfs != selfr)
        /* A send to self completes only when its receive runs ("This
         * operation is blocking for the GPU"), so the two must be in one
         * group; unmatched, real NCCL would hang. */
        return zs_emu_nccl_refuse(
            c, ncclInvalidUsage,
            "cuda-emu nccl: rank %d: %d ncclSend to self and %d ncclRecv from self in "
            "one group: a send to self needs its receive in the same group",
            c->rank, selfs, selfr);
    struct zs_emu_nccl_p2p *b = calloc(1, sizeof *b + (size_t)cnt * sizeof(p2p_item));
    if (!b)
        return ncclSystemError;
    for (int i = first; i < n; i++) {
        const zs_emu_nccl_op *a = &ops[i];
        if (a->comm != c || !is_p2p(a))
            continue;
        p2p_item *it = &b->it[b->n++];
        it->send = a->d.kind == ZS_EMU_NCCL_SEND;
        it->peer = a->d.root;
        it->dtype = a->d.dtype;
        it->count = a->d.count;
        it->bytes = it->send ? a->sbytes : a->rbytes;
        it->buf = it->send ? (void *)a->send : a->recv;
    }
    *out = (zs_emu_nccl_op){
        .comm = c,
        .d = {.kind = ZS_EMU_NCCL_P2P, .dtype = -1, .op = -1, .root = -1, .count = (uint64_t)cnt},
        .stream = ops[first].stream,
        .p2p = b};
    return ncclSuccess;
}

ncclResult_t zs_emu_nccl_p2p_fold(zs_emu_nccl_op *ops, int *n)
{
    int m = 0;
    ncclResult_t rc = ncclSuccess;
    for (int i = 0; i < *n; i++) {
        if (!is_p2p(&ops[i])) {
            ops[m++] = ops[i];
            continue;
        }
        int seen = 0; /* this communicator's batch was built at its first call */
        for (int k = 0; k < m && !seen; k++)
            seen = ops[k].d.kind == ZS_EMU_NCCL_P2P && ops[k].comm == ops[i].comm;
        if (seen)
            continue;
        zs_emu_nccl_op b;
        if ((rc = build(ops, i, *n, &b)) != ncclSuccess)
            break;
        ops[m++] = b;
    }
    if (rc != ncclSuccess) {
        /* Refused: nothing of the group launches; free what was built. */
        for (int k = 0; k < m; k++)
            zs_emu_nccl_p2p_free(&ops[k]);
        return rc;
    }
    *n = m;
    return ncclSuccess;
}

void zs_emu_nccl_p2p_free(zs_emu_nccl_op *op)
{
    if (op->d.kind == ZS_EMU_NCCL_P2P && op->p2p) {
        free(op->p2p);
        op->p2p = NULL;
    }
}

int zs_emu_nccl_p2p_live(struct ncclComm *c, const zs_emu_nccl_op *op, char *msg, size_t cap)
{
    const struct zs_emu_nccl_p2p *b = op->p2p;
    for (int i = 0; i < b->n; i++) {
        const p2p_item *it = &b->it[i];
        if (!it->bytes || zs_emu_dev_ptr(it->buf, it->bytes) == c->dev)
            continue;
        snprintf(msg, cap,
                 "cuda-emu nccl: %s(%zu x %s, peer %d): rank %d: %s %p is no longer device "
                 "memory of device %d when the stream runs it (freed before the call ran?)",
                 it->send ? "Send" : "Recv", it->count, zs_emu_nccl_dtype_name(it->dtype), it->peer,
                 c->rank, it->send ? "sendbuff" : "recvbuff", it->buf, c->dev);
        return 0;
    }
    return 1;
}

void zs_emu_nccl_p2p_poison(const zs_emu_nccl_op *op, int dev)
{
    const struct zs_emu_nccl_p2p *b = op->p2p;
    for (int i = 0; b && i < b->n; i++) {
        const p2p_item *it = &b->it[i];
        if (!it->send && it->bytes && zs_emu_dev_ptr(it->buf, it->bytes) == dev)
            memset(it->buf, 0xff, it->bytes);
    }
}

/* "rank r Send #m (count x type) to rank p": names the call in messages. */
static void describe_item(const struct ncclComm *c, const p2p_item *it, char *buf, size_t cap)
{
    snprintf(buf, cap, "rank %d %s #%llu (%zu x %s) %s rank %d", c->rank,
             it->send ? "Send" : "Recv", (unsigned long long)it->m, it->count,
             zs_emu_nccl_dtype_name(it->dtype), it->send ? "to" : "from", it->peer);
}

/* Advance one item as far as it goes without waiting. Sets *moved when it
 * changed anything. Returns an error (msg filled) on a mismatch. */
static ncclResult_t step(struct ncclComm *c, p2p_item *it, int *moved, char *msg, size_t cap)
{
    zs_emu_nccl_seg *s = c->seg;
    int r = c->rank, p = it->peer;
    zs_emu_nccl_slot *me = &s->slot[r], *peer = &s->slot[p];
    size_t S = s->chunk / (size_t)c->nranks; /* slice r->p: bytes [p*S, (p+1)*S) of r's area */
    if (it->phase == 0) {
        /* Message numbers per ordered pair, in call order (the executor
         * runs ops in call order, and items in group order). */
        zs_emu_nccl_p2pdesc *d = it->send ? &me->sdesc[p] : &me->rdesc[p];
        it->m = it->send ? ++c->p2p_sent[p] : ++c->p2p_recvd[p];
        it->base = it->send ? atomic_load(&me->posted[p]) : atomic_load(&me->acked[p]);
        it->nslices = it->bytes ? (it->bytes + S - 1) / S : 1;
        d->count = it->count;
        d->dtype = it->dtype;
        atomic_store(&d->m, it->m); /* publishes count and dtype */
        zs_emu_nccl_ring(s);
        it->phase = 1;
        *moved = 1;
    }
    if (it->phase == 1) {
        /* The matching call's description, compared before any data moves
         * ("with the same count and data type"). It can not be ahead of
         * m: the other side's next message needs this one's data. */
        zs_emu_nccl_p2pdesc *o = it->send ? &peer->rdesc[r] : &peer->sdesc[r];
        if (atomic_load(&o->m) != it->m)
            return ncclSuccess;
        if (o->count != it->count || o->dtype != it->dtype) {
            int from = it->send ? r : p, to = it->send ? p : r;
            size_t sc = it->send ? it->count : o->count, rc = it->send ? o->count : it->count;
            int st = it->send ? it->dtype : o->dtype, rt = it->send ? o->dtype : it->dtype;
            snprintf(msg, cap,
                     "cuda-emu nccl: point-to-point message #%llu from rank %d to rank %d: rank "
                     "%d called ncclSend(%zu x %s), rank %d called ncclRecv(%zu x %s) (the "
                     "counts and data types must be equal)",
                     (unsigned long long)it->m, from, to, from, sc, zs_emu_nccl_dtype_name(st), to,
                     rc, zs_emu_nccl_dtype_name(rt));
            if (it->send && p != r)
                msg[cap - 1] = 1; /* the receiver prints it */
            return ncclInvalidUsage;
        }
        it->phase = 2;
        *moved = 1;
    }
    if (it->phase == 2 && it->send) {
        unsigned char *slice = c->staging + (size_t)r * s->chunk + (size_t)p * S;
        while (it->slices < it->nslices) {
            /* The slice is free once the receiver took the previous one. */
            if (atomic_load(&peer->acked[r]) != atomic_load(&me->posted[p]))
                return ncclSuccess;
            size_t off = (size_t)it->slices * S;
            size_t len = it->bytes - off < S ? it->bytes - off : S;
            if (len)
                memcpy(slice, (const unsigned char *)it->buf + off, len);
            atomic_fetch_add(&me->posted[p], 1); /* publishes the slice */
            it->slices++;
            zs_emu_nccl_ring(s);
            *moved = 1;
        }
        it->phase = 3;
    }
    if (it->phase == 3) {
        /* Hostile: the send completes only when the receiver has it all
         * (no eager buffering; "blocking for the GPU"). */
        if (atomic_load(&peer->acked[r]) < it->base + it->nslices)
            return ncclSuccess;
        it->phase = 4;
        *moved = 1;
    }
    if (it->phase == 2 && !it->send) {
        const unsigned char *slice = c->staging + (size_t)p * s->chunk + (size_t)r * S;
        while (it->slices < it->nslices) {
            if (atomic_load(&peer->posted[r]) <= it->base + it->slices)
                return ncclSuccess;
            size_t off = (size_t)it->slices * S;
            size_t len = it->bytes - off < S ? it->bytes - off : S;
            if (len)
                memcpy((unsigned char *)it->buf + off, slice, len);
            atomic_fetch_add(&me->acked[p], 1); /* the slice may be reused */
            it->slices++;
            zs_emu_nccl_ring(s);
            *moved = 1;
        }
        it->phase = 4;
    }
    return ncclSuccess;
}

/* One pass over the items. *pending: items not done; *active: peers of
 * the items that may move now (the first of each peer and direction). */
static ncclResult_t pass(struct ncclComm *c, struct zs_emu_nccl_p2p *b, int *moved, int *pending,
                         uint64_t *active, int *first_blocked, char *msg, size_t cap)
{
    uint64_t busy_s = 0, busy_r = 0;
    *pending = 0;
    *active = 0;
    *first_blocked = -1;
    for (int i = 0; i < b->n; i++) {
        p2p_item *it = &b->it[i];
        if (it->phase == 4)
            continue;
        ++*pending;
        uint64_t bit = 1ull << it->peer, *busy = it->send ? &busy_s : &busy_r;
        if (*busy & bit)
            continue; /* an earlier call to this peer, this direction: in order */
        *busy |= bit;
        int mv = 0;
        ncclResult_t rc = step(c, it, &mv, msg, cap);
        if (rc != ncclSuccess)
            return rc;
        *moved |= mv;
        if (it->phase != 4) {
            *active |= bit;
            if (*first_blocked < 0)
                *first_blocked = i;
        } else {
            --*pending;
        }
    }
    return ncclSuccess;
}

ncclResult_t zs_emu_nccl_p2p_run(struct ncclComm *c, zs_emu_nccl_op *op, char *msg, size_t cap)
{
    struct zs_emu_nccl_p2p *b = op->p2p;
    zs_emu_nccl_seg *s = c->seg;
    /* Hostile: a receive buffer's content is undefined until the stream
     * work completes; garbage from the start, not the old content. */
    zs_emu_nccl_p2p_poison(op, c->dev);
    double last = now_s(), limit = zs_emu_nccl_timeout_s();
    char what[160];
    for (;;) {
        uint32_t seen = atomic_load(&s->bell);
        int moved = 0, pending, fb;
        uint64_t active;
        ncclResult_t rc = pass(c, b, &moved, &pending, &active, &fb, msg, cap);
        if (rc != ncclSuccess)
            return rc;
        if (!pending)
            return ncclSuccess;
        if (moved) {
            last = now_s();
            continue;
        }
        if (atomic_load(&c->aborted)) {
            describe_item(c, &b->it[fb], what, sizeof what);
            snprintf(msg, cap, "cuda-emu nccl: %s: ncclCommAbort released the wait", what);
            return ncclInvalidUsage;
        }
        /* A peer that can not come any more; its state changes after its
         * last store, so one more pass after reading it tells whether it
         * did its part before going. */
        ncclResult_t gone = ncclSuccess;
        for (int k = 0; k < c->nranks && gone == ncclSuccess; k++) {
            if (k == c->rank || !(active >> k & 1))
                continue;
            int i = 0;
            while (b->it[i].phase == 4 || b->it[i].peer != k)
                i++;
            describe_item(c, &b->it[i], what, sizeof what);
            gone = zs_emu_nccl_peer_gone(c, k, what, msg, cap);
        }
        if (gone != ncclSuccess) {
            char keep[ZS_EMU_NCCL_MSG];
            snprintf(keep, sizeof keep, "%s", msg);
            moved = 0;
            if ((rc = pass(c, b, &moved, &pending, &active, &fb, msg, cap)) != ncclSuccess)
                return rc;
            if (!pending)
                return ncclSuccess;
            if (moved)
                continue;
            snprintf(msg, cap, "%s", keep);
            return gone;
        }
        if (now_s() - last > limit) {
            p2p_item *it = &b->it[fb];
            describe_item(c, it, what, sizeof what);
            snprintf(msg, cap,
                     "cuda-emu nccl: %s: waited %.0f s %s (ZS_EMU_NCCL_TIMEOUT; real NCCL would "
                     "hang here)",
                     what, limit,
                     it->phase == 1 ? (it->send ? "for the peer to post its matching ncclRecv"
                                                : "for the peer to post its matching ncclSend")
                                    : "for the peer to move the data");
            return ncclSystemError;
        }
        zs_emu_nccl_wait_bell(s, seen);
    }
}
