/*
 * zs_coll.c - the parts of zs_coll.h every implementation shares: stream
 * ordering around a collective (`after`, `done`), groups (their done events
 * and when the implementation launches them), barrier and sync, the
 * blocking host-value helpers, the byte counters, qwZ's quantized
 * all-gather (pack, all-gather of the records, unpack), and MiCS's shard
 * and replica groups (built through the vtable's split) with their
 * two-hop all-gather. It only talks to
 * the device interface (zs_dev.h) and the communicator's vtable; it does
 * not call MPI or NCCL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zs_coll.h"
#include "zs_quant.h"

/* ---- byte counters --------------------------------------------------------- */

const char *zs_coll_kind_name(int kind)
{
    static const char *const names[ZS_COLL_NKINDS] = {"reduce_scatter", "all_gather",
                                                      "all_reduce",     "broadcast",
                                                      "all_gather_q8",  "reduce_scatter_q8"};
    return kind >= 0 && kind < ZS_COLL_NKINDS ? names[kind] : "?";
}

/* Peers of this rank on its node and elsewhere, in c: a world communicator
 * splits by the topology, a node's communicator is all within, one across
 * nodes all across. */
static void peers(const zs_coll_t *c, uint64_t *in, uint64_t *out)
{
    uint64_t others = c->size > 1 ? (uint64_t)c->size - 1 : 0;
    if (c->scope == 1) {
        *in = others, *out = 0;
    } else if (c->scope == 3) {
        *in = (uint64_t)c->peers_in < others ? (uint64_t)c->peers_in : others;
        *out = others - *in;
    } else if (c->scope == 2) {
        *in = 0, *out = others;
    } else {
        uint64_t local = c->topo.local_size > 0 ? (uint64_t)c->topo.local_size - 1 : 0;
        *in = local < others ? local : others;
        *out = others - *in;
    }
}

/* The model of zs_coll.h: per peer, a block (all-gather, reduce-scatter,
 * records); an all-reduce's B bytes as a reduce-scatter plus an all-gather
 * of B/W; a broadcast's B from the root only. */
void zs__coll_count(zs_coll_t *c, int kind, uint64_t block, int root)
{
    uint64_t in, out, w = c->size > 0 ? (uint64_t)c->size : 1;
    peers(c, &in, &out);
    if (kind == ZS_COLL_K_ALL_REDUCE) {
        c->bytes.intra[kind] += 2 * block * in / w;
        c->bytes.inter[kind] += 2 * block * out / w;
    } else if (kind != ZS_COLL_K_BROADCAST || c->rank == root) {
        c->bytes.intra[kind] += block * in;
        c->bytes.inter[kind] += block * out;
    }
}

zs_coll_bytes_t zs_coll_bytes(const zs_coll_t *c)
{
    zs_coll_bytes_t b = c->bytes;
    const zs_coll_t *sub[4] = {c->intra, c->inter, c->shard, c->replica};
    for (int j = 0; j < 4; j++) {
        if (!sub[j])
            continue;
        zs_coll_bytes_t x = zs_coll_bytes(sub[j]); /* a shard group's two hops too */
        for (int k = 0; k < ZS_COLL_NKINDS; k++) {
            b.intra[k] += x.intra[k];
            b.inter[k] += x.inter[k];
        }
    }
    return b;
}

void zs_coll_bytes_reset(zs_coll_t *c)
{
    memset(&c->bytes, 0, sizeof c->bytes);
    zs_coll_t *sub[4] = {c->intra, c->inter, c->shard, c->replica};
    for (int j = 0; j < 4; j++)
        if (sub[j])
            zs_coll_bytes_reset(sub[j]);
}

uint64_t zs_coll_bytes_intra(const zs_coll_bytes_t *b)
{
    uint64_t s = 0;
    for (int k = 0; k < ZS_COLL_NKINDS; k++)
        s += b->intra[k];
    return s;
}

uint64_t zs_coll_bytes_inter(const zs_coll_bytes_t *b)
{
    uint64_t s = 0;
    for (int k = 0; k < ZS_COLL_NKINDS; k++)
        s += b->inter[k];
    return s;
}

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
        zs__coll_count(c, kind == HOST_ALL_REDUCE ? ZS_COLL_K_ALL_REDUCE : ZS_COLL_K_BROADCAST,
                       bytes, root);
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

/* ---- qwZ: the quantized all-gather ----------------------------------------- */

/* Pack this rank's block, all-gather the records as 2-byte units (a record
 * is a multiple of 4 bytes; an all-gather of fp16 moves bytes and computes
 * nothing, on MPI and NCCL alike), unpack every record into buf. */
int zs_coll_all_gather_q8(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *qbuf,
                          zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = no_group(c, "zs_coll_all_gather_q8", err);
    if (rc)
        return rc;
    size_t es = zs_dtype_size(dt);
    if (es == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "all_gather_q8: dtype %d is not fp32, bf16 or fp16",
                          (int)dt);
    if (!c->vt->q8_pack || !c->vt->q8_unpack)
        return zs_err_set(err, ZS_ERR_INVALID, "all_gather_q8: the %s collectives cannot quantize",
                          c->vt->name);
    if (count == 0)
        return zs__coll_done(c, done, err);
    if (!buf || !qbuf || ((uintptr_t)qbuf & 3))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "all_gather_q8: buf or qbuf NULL, or qbuf not 4-byte aligned");
    size_t rb = zs_quant_record_bytes(count);
    char *own = (char *)buf + (size_t)c->rank * count * es;
    rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->q8_pack(c, (char *)qbuf + (size_t)c->rank * rb, own, dt, count, err);
    if (rc == ZS_OK)
        rc = c->vt->all_gather(c, qbuf, rb / 2, ZS_DTYPE_F16, err);
    if (rc == ZS_OK)
        rc = c->vt->q8_unpack(c, buf, dt, qbuf, count, (size_t)c->size, err);
    if (rc != ZS_OK)
        return zs_err_prefix(err, "all_gather_q8: ");
    zs__coll_count(c, ZS_COLL_K_ALL_GATHER_Q8, rb, 0);
    return zs__coll_done(c, done, err);
}

/* ---- qgZ: the quantized two-hop reduce-scatter -------------------------------- */

size_t zs_coll_rsq8_work_bytes(const zs_coll_t *c, size_t count)
{
    size_t rb = zs_quant_record_bytes(count), n = (size_t)(c->topo.nnodes > 0 ? c->topo.nnodes : 1);
    return 2 * (size_t)c->size * rb + n * count * 4 + 2 * n * rb;
}

int zs_coll_reduce_scatter_q8(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *work,
                              zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = no_group(c, "zs_coll_reduce_scatter_q8", err);
    if (rc)
        return rc;
    if (!c->vt->reduce_scatter_q8)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "reduce_scatter_q8: the %s collectives have no quantized "
                          "reduce-scatter (qgZ)",
                          c->vt->name);
    if (!c->topo.regular || c->scope != 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "reduce_scatter_q8: needs the world communicator over nodes of equal "
                          "size with consecutive ranks (ZS_RANKS_PER_NODE, or mpirun placing "
                          "ranks by node)");
    if (zs_dtype_size(dt) == 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "reduce_scatter_q8: dtype %d is not fp32, bf16 or fp16", (int)dt);
    if (count == 0)
        return zs__coll_done(c, done, err);
    if (!buf || !work || ((uintptr_t)work & 3))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "reduce_scatter_q8: buf or work NULL, or work not 4-byte aligned");
    rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->reduce_scatter_q8(c, buf, count, dt, work, err);
    if (rc != ZS_OK)
        return zs_err_prefix(err, "reduce_scatter_q8: ");
    uint64_t rb = zs_quant_record_bytes(count), l = (uint64_t)c->topo.local_size,
             n = (uint64_t)c->topo.nnodes;
    c->bytes.intra[ZS_COLL_K_REDUCE_SCATTER_Q8] += l > 1 ? (l - 1) * n * rb : 0;
    c->bytes.inter[ZS_COLL_K_REDUCE_SCATTER_Q8] += n > 1 ? (n - 1) * rb : 0;
    return zs__coll_done(c, done, err);
}

/* ---- MiCS: shard and replica groups, the two-hop gather ----------------------- */

/* Every rank's node number (world communicator c): an all-gather of
 * fp32 values (node numbers are exact) through a device buffer. */
static int all_nodes(zs_coll_t *c, int *nodes, zs_err_t *err)
{
    size_t W = (size_t)c->size;
    float *host = calloc(W, sizeof *host), *dbuf = NULL;
    if (!host)
        return zs_err_set(err, ZS_ERR_NOMEM, "mics: no memory");
    int rc =
        zs_dev_alloc(c->dev, ZS_SPACE_DEVICE, ZS_MEM_COMM, W * sizeof *host, (void **)&dbuf, err);
    host[c->rank] = (float)c->topo.node;
    if (rc == ZS_OK)
        rc = zs_dev_memcpy(c->stream, dbuf, host, W * sizeof *host, err);
    if (rc == ZS_OK)
        rc = c->vt->all_gather(c, dbuf, 1, ZS_DTYPE_F32, err);
    if (rc == ZS_OK)
        rc = zs_dev_memcpy(c->stream, host, dbuf, W * sizeof *host, err);
    int src = zs_dev_stream_sync(c->stream, rc ? NULL : err);
    if (rc == ZS_OK)
        rc = src;
    for (size_t r = 0; rc == ZS_OK && r < W; r++)
        nodes[r] = (int)host[r];
    zs_dev_free(c->dev, dbuf);
    free(host);
    return rc;
}

/* A split of world c (vt->split) with peers_in counted from nodes[]:
 * members are the ranks r with color_of(r) == color. */
static int split_counted(zs_coll_t *c, const int *nodes, int G, int replica, zs_coll_t **out,
                         zs_err_t *err)
{
    int color = replica ? c->rank % G : c->rank / G;
    int rc = c->vt->split(c, color, c->rank, 3, out, err);
    if (rc)
        return rc;
    int in = 0;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && (replica ? r % G : r / G) == color && nodes[r] == c->topo.node)
            in++;
    (*out)->peers_in = in;
    return ZS_OK;
}

int zs_coll_mics(zs_coll_t *c, int G, int hier, int *two_hop, zs_err_t *err)
{
    if (two_hop)
        *two_hop = 0;
    if (c->scope != 0 || !c->intra)
        return zs_err_set(err, ZS_ERR_INVALID, "mics: not a world communicator");
    if (c->shard || c->replica)
        return zs_err_set(err, ZS_ERR_STATE, "mics: the shard groups are built already");
    if (G < 1 || G > c->size || c->size % G != 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "mics_shard_size %d must divide the %d ranks (shard groups of equal "
                          "size; %d is plain ZeRO)",
                          G, c->size, c->size);
    if (!c->vt->split)
        return zs_err_set(err, ZS_ERR_INVALID, "mics: the %s collectives cannot split",
                          c->vt->name);
    const zs_coll_topo_t *t = &c->topo;
    int L = t->local_size > 0 ? t->local_size : 1;
    /* does any shard group span nodes? the same answer on every rank */
    int *nodes = malloc((size_t)c->size * sizeof *nodes);
    if (!nodes)
        return zs_err_set(err, ZS_ERR_NOMEM, "mics: no memory");
    int rc = zs_coll_sync(c, err);
    if (rc == ZS_OK)
        rc = all_nodes(c, nodes, err);
    int spans = 0;
    for (int r = 0; rc == ZS_OK && r < c->size; r++)
        spans |= nodes[r] != nodes[r / G * G];
    int hop2 = hier && spans;
    if (rc == ZS_OK && hop2 && (!t->regular || G % L != 0))
        rc = zs_err_set(err, ZS_ERR_INVALID,
                        "mics_hierarchical_params_gather: the two-hop gather needs nodes of "
                        "equal size with consecutive ranks (ZS_RANKS_PER_NODE, or mpirun "
                        "placing ranks by node) and mics_shard_size %d a multiple of the %d "
                        "ranks per node",
                        G, L);
    if (rc == ZS_OK)
        rc = split_counted(c, nodes, G, 0, &c->shard, err);
    if (rc == ZS_OK)
        rc = split_counted(c, nodes, G, 1, &c->replica, err);
    /* two hops: the group's ranks on this node (rank l), and its ranks of
     * this local rank on its nodes (rank n); shard rank = n * L + l */
    if (rc == ZS_OK && hop2)
        rc = c->vt->split(c, c->rank / L, c->rank, 1, &c->shard->intra, err);
    if (rc == ZS_OK && hop2)
        rc = c->vt->split(c, (c->rank / G) * L + c->rank % L, c->rank, 2, &c->shard->inter, err);
    if (rc == ZS_OK && hop2) {
        zs_coll_t *s = c->shard;
        if (s->intra->size != L || s->inter->size != G / L ||
            s->rank != s->inter->rank * L + s->intra->rank)
            rc = zs_err_set(err, ZS_ERR_INTERNAL,
                            "mics: two-hop groups do not match the shard group (rank %d: %d = "
                            "%d * %d + %d?)",
                            c->rank, s->rank, s->inter->rank, L, s->intra->rank);
    }
    free(nodes);
    if (rc == ZS_OK && two_hop)
        *two_hop = hop2;
    if (rc) {
        /* a failed split leaves the job's collective state unknown; what was
         * built goes with c */
        zs_err_prefix(err, "mics: ");
    }
    return rc;
}

int zs_coll_all_gather_hier(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *work,
                            zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = no_group(c, "zs_coll_all_gather_hier", err);
    if (rc)
        return rc;
    if (!c->intra || !c->inter)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "all_gather_hier: not a shard group with two-hop communicators");
    size_t es = zs_dtype_size(dt);
    if (es == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "all_gather_hier: dtype %d", (int)dt);
    if (count == 0)
        return zs__coll_done(c, done, err);
    if (!buf || !work)
        return zs_err_set(err, ZS_ERR_INVALID, "all_gather_hier: buf or work NULL");
    size_t L = (size_t)c->intra->size, N = (size_t)c->inter->size;
    size_t l = (size_t)c->intra->rank, n = (size_t)c->inter->rank, blk = count * es;
    char *w = work, *b = buf;
    rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK) /* hop 1 (across nodes): work's row l, column n is this block */
        rc = zs_dev_memcpy(c->stream, w + (l * N + n) * blk, b + (size_t)c->rank * blk, blk, err);
    if (rc == ZS_OK)
        rc = zs_coll_all_gather(c->inter, w + l * N * blk, count, dt, NULL, NULL, err);
    if (rc == ZS_OK) /* hop 2 (within the node): the rows */
        rc = zs_coll_all_gather(c->intra, w, N * count, dt, NULL, NULL, err);
    for (size_t ll = 0; ll < L && rc == ZS_OK; ll++)
        for (size_t nn = 0; nn < N && rc == ZS_OK; nn++)
            rc = zs_dev_memcpy(c->stream, b + (nn * L + ll) * blk, w + (ll * N + nn) * blk, blk,
                               err);
    if (rc != ZS_OK)
        return zs_err_prefix(err, "all_gather_hier: ");
    return zs__coll_done(c, done, err);
}
