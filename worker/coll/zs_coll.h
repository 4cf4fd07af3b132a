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
#include <stdint.h>

#include "zs_dev.h"
#include "zs_dtype.h"
#include "zs_status.h"

#define ZS_COLL_ALIGN 64 /* elements; a block alignment NCCL likes (not required) */

/* Collectives in one fused launch of a group (zs_coll_group_start): a longer
 * group is launched in pieces of this many. */
#define ZS_COLL_GROUP_MAX 64

typedef enum { ZS_OP_SUM = 0, ZS_OP_MAX = 1 } zs_coll_op_t;

typedef struct zs_coll zs_coll_t;

/* Topology (zs_coll_topo.c): which node each rank is on. Nodes are
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)'s, numbered by their lowest
 * world rank, or, with ZS_RANKS_PER_NODE=N in the environment (the same on
 * every rank), blocks of N consecutive ranks, so one machine can act as
 * several nodes (tests, benchmarks, clusters whose shared-memory view is
 * not their network's). */
typedef struct zs_coll_topo {
    int node, nnodes;           /* this rank's node, 0 .. nnodes-1 */
    int local_rank, local_size; /* this rank's place on its node */
    int forced;                 /* ZS_RANKS_PER_NODE set it */
    int regular;                /* every node has local_size ranks and rank = node * local_size +
                                 * local_rank (ZS_RANKS_PER_NODE always; MPI's view when ranks
                                 * are placed by node): what qgZ's two hops need */
} zs_coll_topo_t;

/* Byte counters: the bytes this rank's collectives send, split into
 * within its node and across nodes, per kind. Counted as if each
 * collective sent every peer its share directly (the backend's own routing,
 * rings or trees, is not seen): all-gather and reduce-scatter of a block of
 * b bytes send b to each other rank of the communicator; all-reduce of B
 * bytes counts as a reduce-scatter and an all-gather of B/W; broadcast
 * sends B from the root to each other rank; the quantized all-gather counts
 * its records. Counted when a collective is enqueued. */
typedef enum {
    ZS_COLL_K_REDUCE_SCATTER = 0,
    ZS_COLL_K_ALL_GATHER,
    ZS_COLL_K_ALL_REDUCE,
    ZS_COLL_K_BROADCAST,
    ZS_COLL_K_ALL_GATHER_Q8,     /* qwZ: int8 records (zs_coll_all_gather_q8) */
    ZS_COLL_K_REDUCE_SCATTER_Q8, /* qgZ: int8 records, two hops (zs_coll_reduce_scatter_q8) */
    ZS_COLL_NKINDS
} zs_coll_kind_t;

typedef struct zs_coll_bytes {
    uint64_t intra[ZS_COLL_NKINDS]; /* to ranks on this node */
    uint64_t inter[ZS_COLL_NKINDS]; /* to ranks on other nodes */
} zs_coll_bytes_t;

/* "reduce_scatter", "all_gather", "all_reduce", "broadcast", "all_gather_q8",
 * "reduce_scatter_q8" */
const char *zs_coll_kind_name(int kind);

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
    /* qwZ (zs_coll_all_gather_q8): enqueue on c->stream the packing of n
     * elements of dt at src into a record at rec (zs_quant.h), and the
     * unpacking of nrec records of n elements into dst; the CPU kernels
     * (MPI) or the CUDA ones (NCCL). */
    int (*q8_pack)(zs_coll_t *c, void *rec, const void *src, zs_dtype_t dt, size_t n,
                   zs_err_t *err);
    int (*q8_unpack)(zs_coll_t *c, void *dst, zs_dtype_t dt, const void *rec, size_t n, size_t nrec,
                     zs_err_t *err);
    /* qgZ (zs_coll_reduce_scatter_q8): the whole two-hop reduce-scatter on
     * c->stream, work as zs_coll_rsq8_work_bytes says. NULL: not available
     * on this backend (NCCL: the emulator has no ncclSend/ncclRecv to test
     * an all-to-all with). */
    int (*reduce_scatter_q8)(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *work,
                             zs_err_t *err);
    /* After zs_coll_sync's stream wait: errors the stream does not carry.
     * NCCL reports a failed collective (a dead peer) through
     * ncclCommGetAsyncError while its stream work completes; this asks.
     * NULL: the stream's status is the whole answer (MPI). */
    int (*sync_check)(zs_coll_t *c, zs_err_t *err);
    /* MiCS (zs_coll_mics): a sub-communicator of the ranks of world
     * communicator c with the same `color`, ordered by `key`, on c's
     * stream, with scope `scope` (zs_coll_t.scope). Collective over c;
     * called with nothing queued on c's stream. */
    int (*split)(zs_coll_t *c, int color, int key, int scope, zs_coll_t **out, zs_err_t *err);
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
    zs_coll_topo_t topo;                 /* set at create */
    zs_coll_bytes_t bytes;               /* counters, feeding thread only */
    int scope;    /* 0 world, 1 within a node, 2 across nodes, 3 mixed (peers_in) */
    int peers_in; /* scope 3: the other ranks of this communicator on this rank's node */
    /* The node's ranks and one rank per node (same local rank): built at
     * create, once per job; NULL on a sub-communicator itself. They run on
     * this communicator's stream, in order with its collectives. */
    zs_coll_t *intra, *inter;
    /* MiCS (zs_coll_mics, on a world communicator): the shard group's ranks
     * (rank = place in the group) and the replica group's (the ranks with
     * this shard rank in every group, rank = group number); NULL until
     * built. A shard group with two-hop gathers carries its own intra
     * (its ranks on this node) and inter (its ranks of this local rank)
     * for zs_coll_all_gather_hier. Owned: destroyed with c. */
    zs_coll_t *shard, *replica;
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

/* Count a collective of `kind` just enqueued on c: `block` bytes per rank
 * (see the counters above; all-reduce and broadcast: the whole buffer). */
void zs__coll_count(zs_coll_t *c, int kind, uint64_t block, int root);

/* The topology and the counters so far (zs_coll_bytes_reset zeroes them). */
static inline const zs_coll_topo_t *zs_coll_topo(const zs_coll_t *c)
{
    return &c->topo;
}
/* This communicator's counters plus its sub-communicators' (node, MiCS,
 * and theirs). */
zs_coll_bytes_t zs_coll_bytes(const zs_coll_t *c);
void zs_coll_bytes_reset(zs_coll_t *c);
/* Sums over kinds. */
uint64_t zs_coll_bytes_intra(const zs_coll_bytes_t *b);
uint64_t zs_coll_bytes_inter(const zs_coll_bytes_t *b);

/* The node's ranks as a communicator (rank = local rank), and the ranks
 * with this local rank on every node (rank = node, where every node has
 * this local rank): built once per job at create, on the world
 * communicator's stream. Both exist for every world communicator (with one
 * node the inter one has size 1); NULL on a sub-communicator. */
static inline zs_coll_t *zs_coll_intra(zs_coll_t *c)
{
    return c->intra;
}
static inline zs_coll_t *zs_coll_inter(zs_coll_t *c)
{
    return c->inter;
}

/* MiCS: build c->shard (the G consecutive ranks [g*G, (g+1)*G) holding
 * rank, g = rank / G) and c->replica (the ranks r' with r' % G == rank % G,
 * ordered by rank) on world communicator c, once (ZS_ERR_STATE the second
 * time). Each counts its bytes per peer from where its members are
 * (scope 3). hier: when a shard group spans nodes, also its two-hop
 * communicators (shard->intra, shard->inter) for zs_coll_all_gather_hier;
 * that needs a regular topology (zs_coll_topo_t.regular) and G a multiple
 * of the ranks per node, else ZS_ERR_INVALID. *two_hop (may be NULL) = 1
 * when they were built (0: hier off, or every shard group lies within a
 * node, where one hop is all there is). Refused (ZS_ERR_INVALID, on every
 * rank alike) unless 1 <= G <= W and G divides W, or on a
 * sub-communicator, or where the backend cannot split. Collective over c;
 * waits for c's stream first. */
int zs_coll_mics(zs_coll_t *c, int G, int hier, int *two_hop, zs_err_t *err);

static inline zs_coll_t *zs_coll_shard(zs_coll_t *c)
{
    return c->shard;
}
static inline zs_coll_t *zs_coll_replica(zs_coll_t *c)
{
    return c->replica;
}

/* MiCS's hierarchical all-gather, in place like zs_coll_all_gather, on a
 * shard communicator c with two-hop communicators (zs_coll_mics, hier):
 * its ranks are n*L + l (n: node within the group, l: local rank). Hop 1,
 * across nodes: this rank's block is all-gathered with the group's ranks
 * of local rank l (c->inter), into work; hop 2, within the node: those N
 * blocks are all-gathered with the node's ranks of the group (c->intra);
 * then work's [l][n] blocks are copied to buf's [n][l]. Per rank, count
 * bytes cross nodes to N - 1 peers (L times fewer than a flat gather's G -
 * L), N * count stay in the node; counted as ZS_COLL_K_ALL_GATHER by the
 * two sub-communicators. work: c->size * count elements of dt, device
 * memory, the caller's (reusable after `done`). Not inside a group. */
int zs_coll_all_gather_hier(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *work,
                            zs_stream_t *after, zs_event_t *done, zs_err_t *err);

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
    if (rc == ZS_OK)
        zs__coll_count(c, ZS_COLL_K_REDUCE_SCATTER, (uint64_t)count * zs_dtype_size(dt), 0);
    return rc == ZS_OK ? zs__coll_done(c, done, err) : rc;
}

/* In place: buf (size*count) = every rank's buf + r*count block. */
static inline int zs_coll_all_gather(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt,
                                     zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->all_gather(c, buf, count, dt, err);
    if (rc == ZS_OK)
        zs__coll_count(c, ZS_COLL_K_ALL_GATHER, (uint64_t)count * zs_dtype_size(dt), 0);
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
    if (rc == ZS_OK)
        zs__coll_count(c, ZS_COLL_K_ALL_REDUCE, (uint64_t)count * zs_dtype_size(dt), 0);
    return rc == ZS_OK ? zs__coll_done(c, done, err) : rc;
}

static inline int zs_coll_broadcast(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root,
                                    zs_stream_t *after, zs_event_t *done, zs_err_t *err)
{
    int rc = zs__coll_after(c, after, err);
    if (rc == ZS_OK)
        rc = c->vt->broadcast(c, buf, count, dt, root, err);
    if (rc == ZS_OK)
        zs__coll_count(c, ZS_COLL_K_BROADCAST, (uint64_t)count * zs_dtype_size(dt), root);
    return rc == ZS_OK ? zs__coll_done(c, done, err) : rc;
}

/* qwZ's all-gather, in place like zs_coll_all_gather: buf + rank*count
 * holds this rank's block (dt); it is packed into int8 codes with one fp32
 * scale per ZS_QUANT_BLOCK elements (kernels/zs_quant.h) at qbuf +
 * rank*R (R = zs_quant_record_bytes(count)), the records are all-gathered
 * (as bytes), and every rank's record, this rank's included, is unpacked
 * into buf (size*count elements of dt), so every rank holds the same
 * values: each within half a quantization step of the original (inf and
 * NaN come back NaN). qbuf: size*R bytes of device memory, 4-aligned, the
 * caller's (reusable after `done`). Counted as ZS_COLL_K_ALL_GATHER_Q8
 * with R bytes per rank. Not inside a group. */
int zs_coll_all_gather_q8(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *qbuf,
                          zs_stream_t *after, zs_event_t *done, zs_err_t *err);

/* qgZ's reduce-scatter, in place like zs_coll_reduce_scatter (buf: size *
 * count elements of dt; after it, buf + rank*count holds this rank's block
 * of the sum), in two hops over the topology (regular: see
 * zs_coll_topo_t): within the node, an all-to-all sends each local rank j
 * the int8 records (zs_quant.h) of the blocks of the ranks with local rank
 * j on every node, and j sums what it gets in fp32 (sources in local-rank
 * order); across nodes, an all-to-all of those partial sums, quantized
 * again, to their owners, summed in fp32 (nodes in order) and rounded
 * once to dt. A hop with one rank (one rank per node, or one node) sends
 * nothing and quantizes nothing. Each element is within the sum of the
 * half-steps of the records it went through of the exact sum. Counted as
 * ZS_COLL_K_REDUCE_SCATTER_Q8: (L-1)*N records within the node and N-1
 * across, per rank. work: zs_coll_rsq8_work_bytes(c, count) bytes of
 * device memory, 4-aligned. ZS_ERR_INVALID where the backend has no qgZ or
 * the topology is not regular. Not inside a group. */
int zs_coll_reduce_scatter_q8(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *work,
                              zs_stream_t *after, zs_event_t *done, zs_err_t *err);

/* Bytes of qgZ's work buffer for blocks of count elements: 2 W records
 * (hop 1 out and in), N fp32 partial sums, 2 N records (hop 2). */
size_t zs_coll_rsq8_work_bytes(const zs_coll_t *c, size_t count);

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
