/*
 * zs_engine_internal.h - the engine's struct and the helpers its files
 * share. Not a public header.
 *
 *   zs_engine.c         layout (segments, buckets), lifecycle, initial state
 *   zs_engine_mem.c     measured memory, formulas, the memory table
 *   zs_engine_gather.c  stage 3: per-layer parameter fetch, prefetch, release
 *   zs_engine_step.c    micro-batches: forward, backward, gradient reduction
 *   zs_engine_optim.c   norm, clipping, optimizer or offload, parameter gather
 *   zs_engine_push.c    background push of staged gradient partitions
 *   zs_engine_pull.c    streamed pulls of updated parameters
 *   zs_engine_ckpt.c    start, checkpoint, resume
 *   zs_engine_recover.c going on after a lost shard server
 *
 * Two units of partitioning:
 *   segment  the unit a worker owns a slice of: padded to a multiple of
 *            W * ZS_SEG_ALIGN elements (n_pad), worker r owns [r*part,
 *            (r+1)*part) of it (part = n_pad / W), clipped to n for the valid
 *            part [vb, ve). Stages 0-2: a segment is a gradient bucket (whole
 *            consecutive layers up to reduce_bucket_size elements). Stage 3:
 *            a segment is one layer (DeepSpeed's module granularity).
 *   bucket   the gradient reduction unit: consecutive segments reduced
 *            together as soon as the backward of their first layer is done.
 *            Stages 0-2: one segment each; stage 3: consecutive layers up to
 *            reduce_bucket_size elements.
 * MiCS (mics_shard_size G < W, stage 3): W and rank below are the shard
 * group's (G, the place in it): everything is partitioned within the
 * group and replicated across the W / G groups; Wd and wrank are the
 * data-parallel world's (batches, the loss, the gradient scale, rank 0's
 * duties with the servers). Without MiCS they are equal.
 * Full buffers (Ppad elements) hold segment s at pbase[s]; partition
 * buffers (Ppad / W) at qbase[s] = pbase[s] / W. Flat (server) index of slot
 * k < n of segment s is off[s] + k.
 *
 * Streams: the model's compute stream, a copy stream (device <-> pinned
 * staging for the servers) and the communicator's stream (collectives).
 * Every cross-stream use of a buffer is ordered by an event; a buffer is
 * reused only after its last consumer's event.
 */
#ifndef ZS_ENGINE_INTERNAL_H
#define ZS_ENGINE_INTERNAL_H

#include <pthread.h>

#include "zs_client.h"
#include "zs_engine.h"
#include "zs_loss_scale.h"

#define ZS_SEG_ALIGN  16         /* elements: a segment's per-worker part is a multiple */
#define ZS_COMM_SLOTS 2          /* 16-bit reduce-scatter buffers in flight */
#define ZS_XFER_CHUNK (1u << 20) /* fp32 elements of init/export's device chunk */

typedef struct zs__pusher zs__pusher_t;
typedef struct zs__sums zs__sums_t;
typedef struct zs__puller zs__puller_t;
typedef struct zs__pnvme zs__pnvme_t;

typedef struct zs__seg {
    int first, last;      /* layers [first, last] */
    uint64_t off, n;      /* flat range [off, off + n) */
    uint64_t n_pad, part; /* padded size, per-worker part */
    uint64_t pbase, qbase;
    uint64_t vb, ve; /* this worker's valid part, segment-relative [vb, ve) */
    int bucket;      /* gradient bucket it belongs to */
    /* stage 3 */
    int persistent;  /* n <= stage3_param_persistence_threshold: always gathered */
    void *gbuf;      /* gathered: n_pad elements of dt, then (dt != fp32) n fp32 */
    size_t gbytes;   /* bytes of gbuf */
    float *g32;      /* fp32 view for the layers (== gbuf for fp32; NULL with params16) */
    zs_event_t *gev; /* recorded on the comm stream when gbuf is complete */
    int prefetched;  /* gathered ahead of use and not used yet */
    /* hpZ: this segment's slice of the secondary partition is at
     * e->sec + sbase elements (n_pad / L of them), valid while sec_gen ==
     * e->param_gen (filled by this step's first gather) */
    uint64_t sbase;
    uint64_t sec_gen;
} zs__seg_t;

typedef struct zs__bucket {
    int s0, s1;           /* segments [s0, s1] */
    int first, last;      /* layers [first, last] */
    uint64_t gbase, npad; /* full-buffer range [gbase, gbase + npad) */
    int slot;             /* gradient scratch slot while accumulating, else -1 */
    int early;            /* receives gradients through a dependency from another
                           * bucket (a tied head's embedding): its own slot pool */
} zs__bucket_t;

/* A reusable buffer: free for reuse once `ev` (its last consumer) passed. */
typedef struct zs__slot {
    void *p;
    int owner; /* bucket using it, -1 free */
    zs_event_t *ev;
} zs__slot_t;

/* Stage 3 gather buffers kept for reuse (exact sizes: layers repeat). */
typedef struct zs__gfree {
    void *p;
    size_t bytes;
    zs_event_t *ev; /* last use */
} zs__gfree_t;

#define ZS_GFREE_MAX 64

struct zs_engine {
    zs_config_t cfg;
    zs_model_t m;
    zs_coll_t *coll; /* the world's: agreement, the loss, host values */
    /* what partitions: coll, or with MiCS the shard group's (reduce-scatter,
     * all-gather, the norm); rep: MiCS's replica group (the gradient
     * all-reduce of each partition across the groups), NULL off */
    zs_coll_t *pc, *rep;
    int mics;      /* G with MiCS, 0 off */
    int rgroup;    /* MiCS: this rank's shard group (wrank / G); only group 0 pushes */
    int Wd, wrank; /* the world (see the top); W, rank: the partition's */
    void *hbuf;    /* MiCS two-hop gathers (mics_hierarchical_params_gather over
                    * nodes): work of one gather, max_seg_pad elements of dt (comm);
                    * NULL: one-hop gathers */
    uint64_t hbuf_bytes;
    int mics_hier; /* gathers in two hops (hbuf) */
    zs_dev_t *dev;
    zs_stream_t *compute, *copy, *comm; /* comm is the communicator's */
    int rank, W, stage, offload, offload_param;
    unsigned debug;      /* ZS_ENGINE_DEBUG_* */
    zs_client_t *client; /* NULL without servers */
    char model_name[128];
    char *manifest;           /* opts->manifest copied (stored with checkpoints), or NULL */
    zs_group_range_t *groups; /* opts->groups copied (checked against P), or NULL */
    size_t ngroups;
    zs_dtype_t dt;
    size_t esz;
    int params16; /* dt != fp32 and the model reads dt (set_param_dtype): no fp32 views */

    int nlayers;
    uint64_t *layer_off; /* flat offset of each layer's own params */
    int *layer_seg;
    int **deps;             /* copies, -1 terminated */
    unsigned char *deps_ro; /* [nlayers] zs_model_t.deps_read_only (copied; 0 if none) */
    int maxdeps;            /* most deps of one layer */
    uint64_t P, Ppad;

    int ns, nb;
    zs__seg_t *s;
    zs__bucket_t *b;
    uint64_t max_bucket_pad, max_seg_pad;

    /* model state (device memory unless noted) */
    void *params;     /* stages 0-2: full (Ppad); stage 3: partition (pinned with offload_param;
                       * NULL with offload_param nvme: the partition is in pnv's file) */
    zs__pnvme_t *pnv; /* offload_param.device "nvme" (zs_engine_nvme.c), else NULL */
    /* stages 0-1: full; stages 2-3: partition, except with offload_optimizer
     * (grads_offloaded): NULL, each bucket's reduced partition goes to
     * pinned staging as it is reduced (ZS_ENGINE_DEBUG_KEEP_GRADS keeps a
     * partition here anyway, to prove the memory check sees it) */
    void *grads;
    float *master, *exp_avg, *exp_avg_sq; /* no offload: stage 0 full, else partition */
    /* qwZ (zero_quantized_weights, stage 3): the int8 records of one
     * gather, W * zs_quant_record_bytes(largest part) bytes of device
     * memory (comm), reused by every gather in comm-stream order; NULL off */
    void *qbuf;
    uint64_t qbuf_bytes;
    /* hpZ (zero_hpz_partition_size = the ranks per node, stage 3): hpz = L
     * (0 off); sec: this worker's secondary partition, Ppad / L elements of
     * dt (device memory, category hpz): its local rank's L-th of every
     * segment, copied out of the step's first (world) gather, so later
     * gathers of the step (backward's) all-gather it within the node;
     * param_gen: bumped when a step starts (the parameters may have
     * changed since the last gathers) */
    /* qgZ (zero_quantized_gradients, stage 3): the work buffer of one
     * quantized reduce-scatter (zs_coll_rsq8_work_bytes of the largest
     * part; comm), reused in comm-stream order; NULL off */
    void *rsq;
    uint64_t rsq_bytes;
    int hpz;
    void *sec;
    uint64_t sec_bytes, param_gen;

    /* working buffers, allocated once */
    /* [ngslot] fp32 gradient scratch: [0, ngen) for the other buckets,
     * gen_pad elements each; [ngen, ngslot) one per early bucket, early_pad
     * elements each (a tied embedding's bucket is often the largest: the
     * blocks' slots need not be its size) */
    zs__slot_t *gslot;
    int ngslot, ngen, gnext, enext;
    uint64_t gen_pad, early_pad;
    zs__slot_t cslot[ZS_COMM_SLOTS]; /* dt reduce-scatter buffers (stages 2-3, dt != fp32) */
    int cnext;
    int ncslot; /* cslots and aslots used: ZS_COMM_SLOTS, or 1 with one bucket (a
                 * second would only ever hold the same bucket of the next step)
                 * or at W = 1 (the reduction is the identity) */
    /* grads_offloaded: a bucket's reduced partition (max_bucket_pad / W of
     * dt, on the device, category grads) where micro-batches accumulate on
     * the comm stream before the copy stream moves it to staging */
    zs__slot_t aslot[ZS_COMM_SLOTS];
    int anext;
    float *view;       /* stages 0-2, dt != fp32: fp32 view of one layer and its deps */
    uint64_t view_max; /* its elements: max over layers of own + deps' params */
    void *staging;     /* pinned, Ppad / W elements of dt: pushed grads, pulled params */
    int shm_staging;   /* staging is the client's shared segment (registered with the
                        * device, not allocated): pulls always land in it */
    double *normacc;   /* device, per segment k: [2k] sum of squares, [2k+1] non-finite */
    double *normhost;  /* pinned copy (2 * ns doubles) */
    zs_event_t *ev_compute, *ev_copy, *ev_reduced;
    zs_event_t **ev_staged; /* [nb] staging of bucket k complete (offload) */

    /* stage 3 fetch state (zs_engine_gather.c) */
    uint64_t live_elems;     /* gathered, non-persistent */
    uint64_t prefetch_elems; /* gathered ahead and not used yet */
    uint64_t need_max;       /* most elements one layer needs at once */
    zs__gfree_t gfree[ZS_GFREE_MAX];
    int ngfree;
    int *order; /* [2 * nlayers] pass order: forward 0..L-1 then backward L-1..0 */
    int pos;    /* current position in order */

    zs_loss_scale_t ls;
    uint64_t step; /* last completed step */
    uint64_t t;    /* Adam steps taken (non-skipped) */

    zs__pusher_t *pusher; /* offload: background gradient push */
    zs__sums_t *sums;     /* [ns] or NULL: push checksums made as the staging is written */
    zs__puller_t *puller; /* offload with stream_pulls or the delayed update: background pulls */
    void *pdelay;         /* delayed update: this worker's partition of the next parameters
                           * (Ppad / W of dt at each segment's qbase): with offload pinned
                           * (or after the staging in the shared segment), else on the device */
    int dpu_pending;      /* pdelay holds (offload: is being pulled) an update not landed */
    int land;             /* next segment to land (ns: none pending) */
    int pull_open;        /* a step's pulls were begun and not yet reported */
    int spec_miss;        /* super_offload: the last step's real scalars differed from the expected
                           * ones, so this step does not speculate (zs__eng_speculating) */
    double ms_land;       /* time the main thread waited landing them */
    int first_micro;      /* the current micro-batch is the step's first */
    int last_micro;       /* the current micro-batch is the step's last */
    void *leak;           /* ZS_ENGINE_DEBUG_LEAK: the last leaked block */
    int last_rc;          /* this worker's status of the last failed step/checkpoint */
    uint64_t model_scratch;     /* scratch bytes the model allocated at bind */
    uint64_t model_scratch_dev; /* ... of them in the device space */
};

/* Stages 2-3 with offload_optimizer: no gradient partition on the device. */
static inline int zs__eng_grads_offloaded(const zs_engine_t *e)
{
    return e->stage >= 2 && e->offload;
}

/* 1 when a 16-bit gradient bucket is cast straight into pinned staging:
 * one worker (the bucket is its own reduced block, at the same offset in
 * staging), gradients offloaded, one micro-batch per step, on a
 * host-addressable device (the CPU device, where the cast may write pinned
 * memory at no cost). It saves the reduce buffers and the staging copy
 * (zs_engine_step.c). The staging range is free then: the last step's
 * pushes ended before its Commit, and pulls land in place on such a device
 * (zs__eng_pull_in_place). */
static inline int zs__eng_cast_into_staging(const zs_engine_t *e)
{
    return e->Wd == 1 && e->dt != ZS_DTYPE_F32 && zs__eng_grads_offloaded(e) &&
           e->cfg.gradient_accumulation_steps == 1 && e->dev->host_addressable;
}

/* Bytes per parameter of the fp32 views the layers read besides the
 * parameters themselves: 4 for 16-bit parameters of a model reading fp32
 * only, else 0 (fp32 parameters, or params16). */
static inline uint64_t zs__eng_view_esz(const zs_engine_t *e)
{
    return e->dt != ZS_DTYPE_F32 && !e->params16 ? 4 : 0;
}

/* End one of the engine's background threads (pusher, puller), which
 * waits on cv under mu until it has work or *stop: set *stop, wake it,
 * join it, destroy mu and cv. */
static inline void zs__eng_thread_end(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv,
                                      int *stop)
{
    pthread_mutex_lock(mu);
    *stop = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    pthread_join(th, NULL);
    pthread_mutex_destroy(mu);
    pthread_cond_destroy(cv);
}

/* Bucket k's full-buffer pointer of a dtype-sized buffer. */
static inline void *zs__at(const zs_engine_t *e, void *base, uint64_t slot)
{
    return (char *)base + slot * e->esz;
}

/* MiCS (zs_engine_mics.c): with mics_shard_size G (> 0, < W) build the
 * shard and replica groups (zs_coll_mics) and make the engine partition
 * within the shard group (W = G, rank = the place in it); refuses, with
 * the key named, a G not dividing W, stages 0-2, and hpZ, qgZ or qwZ
 * with it. Off (G <= 0 or G = W): pc = coll. Before the layout. */
int zs__eng_mics_setup(zs_engine_t *e, zs_err_t *err);

/* Stage 3: all-gather segment s's partitions (this worker's block in
 * place in gbuf) over the partition communicator: qwZ records, MiCS's
 * two hops, or the plain all-gather. On the comm stream. */
int zs__eng_gather_pc(zs_engine_t *e, zs__seg_t *s, zs_err_t *err);

/* Allocate with the engine's device; on failure fills err naming `what`. */
int zs__eng_alloc(zs_engine_t *e, int space, int cat, size_t bytes, void **out, const char *what,
                  zs_err_t *err);

/* Make every worker return an error if any worker failed (all-reduce of a
 * failure flag): returns rc if it is an error, else a sentence about the
 * other worker. Collective. */
int zs__eng_agree(zs_engine_t *e, int rc, zs_err_t *err);

/* Stage 3 (zs_engine_gather.c): before layer use at pass position pos,
 * make the layer's and its deps' segments available as fp32 on the compute
 * stream (gathering what is missing, then prefetching ahead); after it,
 * release what is not reused soon. */
int zs__eng_gather_layer(zs_engine_t *e, int pos, zs_err_t *err);
int zs__eng_release_layer(zs_engine_t *e, int pos, zs_err_t *err);
/* Gather segment s now into its own buffer (persistent segments, export). */
int zs__eng_gather_seg(zs_engine_t *e, int s, zs_err_t *err);
void zs__eng_drop_seg(zs_engine_t *e, int s);
/* Free every gathered buffer (destroy). */
void zs__eng_gather_free_all(zs_engine_t *e);

/* Device pointers to layer i's own params (ptrs[0]) and its deps'
 * (ptrs[1..]), valid for the work enqueued on the compute stream before the
 * next call. fp32, and 16-bit with params16: the parameters themselves
 * (stages 0-2) or the gathered buffers (stage 3), in e->dt. Otherwise fp32
 * views: stages 0-2 in 16-bit cast them into e->view on the compute stream
 * (stream order makes the next cast wait for this layer's work), stage 3
 * points into the gathered fp32 views. */
int zs__eng_layer_ptrs(zs_engine_t *e, int layer, void **ptrs, zs_err_t *err);

/* After the optimizer: bring every worker's parameters up to date (all-gather
 * for stages 0-2, re-gather persistent segments). */
int zs__eng_after_update(zs_engine_t *e, zs_err_t *err);

/* Norm, overflow, clipping, optimizer or offload for the step. */
int zs__eng_optimize(zs_engine_t *e, zs_step_stats_t *st, zs_err_t *err);

/* The scalars the commit of the coming step carries when neither clipping
 * nor an overflow intervenes (the current loss scale's gradient scale, the
 * scheduled lr, clip 1, no skip), computed exactly as zs__eng_optimize
 * computes the real ones, so equal steps are bitwise equal. With
 * offload_optimizer.super_offload the pushes state them (speculation). */
void zs__eng_expect(const zs_engine_t *e, uint64_t step, zs_step_scalars_t *sc);

/* 1 when this step's pushes state the expected scalars (the servers
 * speculate): offload_optimizer.super_offload, unless the last step's real
 * scalars differed from its expected ones (clipping, overflow: the next
 * step would most likely roll back too) and speculate_every_step is off,
 * or a server speaks a protocol version before speculation (the client
 * warned at Hello; the step is then the plain one, bitwise).
 * Constant within a step: spec_miss changes only in zs__eng_optimize, after
 * every push, and the version only at a Hello. */
static inline int zs__eng_speculating(const zs_engine_t *e)
{
    return e->cfg.offload_speculate && (e->cfg.offload_speculate_every || !e->spec_miss) &&
           e->client && zs_client_speculates(e->client);
}

/* Bucket k's gradient partition is final for this step in e->grads (stages
 * 0-1 after the all-reduce): with offload, copy it to pinned staging on the
 * copy stream and queue its push. (Stages 2-3 with offload stage it as it
 * is reduced, zs_engine_step.c.) */
int zs__eng_bucket_final(zs_engine_t *e, int k, zs_err_t *err);

/* Push checksums computed where the staging is written (zs_engine_sums.c).
 * on: the shared staging on a host-addressable device with a client that
 * wants them. write: enqueue on s the write of n elements into dst (the
 * staging; e->dt) from src (sdt: a copy when equal to e->dt, else a cast),
 * hashing the push messages of segments [j0, j1] of `step`, which must lie
 * inside it. get: 1 and segment j's sums when a write for `step` was
 * enqueued (read them only after that write's event), else 0. free: at
 * engine destroy. */
int zs__eng_sums_on(const zs_engine_t *e);
int zs__eng_sums_write(zs_engine_t *e, zs_stream_t *s, void *dst, const void *src, zs_dtype_t sdt,
                       uint64_t n, int j0, int j1, uint64_t step, zs_err_t *err);
int zs__eng_sums_get(const zs_engine_t *e, int j, uint64_t step, const uint64_t **sums, int *n);
void zs__eng_sums_free(zs_engine_t *e);

/* Background push (zs_engine_push.c): push [lo, hi) from pinned `src` once
 * `ready` (may be NULL) has completed, with segment j's sums when
 * zs__eng_sums_get has them (j < 0: none). */
int zs__eng_pusher_start(zs_engine_t *e, zs_err_t *err);
void zs__eng_pusher_stop(zs_engine_t *e);
int zs__eng_push_async(zs_engine_t *e, uint64_t step, uint64_t lo, uint64_t hi, const void *src,
                       zs_event_t *ready, int j, zs_err_t *err);
int zs__eng_push_wait(zs_engine_t *e, zs_err_t *err);

/* Streamed pulls (zs_engine_pull.c). start/stop: the puller thread.
 * begin: after every worker agreed Commit succeeded, pull this worker's
 * part of every segment of `step`, in order, in the background. land: make
 * segments up to `upto` available to the compute stream (wait for their
 * pull, copy, all-gather: collective, in the same order on every worker);
 * returns only enqueue errors. finish: land everything and report a failed
 * pull (agree: with every worker's agreement, collective); ZS_OK when no
 * pulls are open. drain: wait for the thread and forget what is open
 * (resume, recovery, destroy). */
int zs__eng_puller_start(zs_engine_t *e, zs_err_t *err);
void zs__eng_puller_stop(zs_engine_t *e);
void zs__eng_pull_begin(zs_engine_t *e, uint64_t step);
/* begin_into: pull `step` into base (NULL: the partition itself) without
 * opening anything to land (the delayed update). src: where segment k's
 * pulled part lies in base (its qbase, or before it where one call pulled
 * a run of segments packed), once k is pulled and until the next begin.
 * wait: until the thread has pulled everything begun; take 1: return and
 * forget its first failure, 0: leave it to whoever takes it. */
void zs__eng_pull_begin_into(zs_engine_t *e, uint64_t step, void *base);
void *zs__eng_pull_src(zs_engine_t *e, void *base, int k);
int zs__eng_pull_wait(zs_engine_t *e, int take, zs_err_t *err);
int zs__eng_pull_land(zs_engine_t *e, int upto, zs_err_t *err);
int zs__eng_pull_finish(zs_engine_t *e, int agree, zs_err_t *err);
void zs__eng_pull_drain(zs_engine_t *e);

/* The delayed parameter update (zs_engine_delay.c). delayed: 1 when the
 * update of `step` reaches the device one step late. land: put the pending
 * update (if any) in the parameters and all-gather them (collective; every
 * worker agrees on a failed pull first). begin: after step's Commit (or its
 * AdamW into pdelay in process), mark it pending (offload: pull it into
 * pdelay in the background); land also flushes (checkpoint, export).
 * forget: drop what is pending (resume, recovery: the parameters are
 * replaced). */
int zs__eng_delayed(const zs_engine_t *e, uint64_t step);
int zs__eng_delay_land(zs_engine_t *e, zs_err_t *err);
void zs__eng_delay_begin(zs_engine_t *e, uint64_t step);
void zs__eng_delay_forget(zs_engine_t *e);

/* Where this worker's slice of segment s lives in the gradient / parameter
 * buffers. */
void *zs__eng_grad_part(zs_engine_t *e, const zs__seg_t *s);
void *zs__eng_param_part(zs_engine_t *e, const zs__seg_t *s);

/* 1 when pulls land in the parameter partition itself: stage 3 with
 * offload_param (the partition is pinned memory) or a host-addressable
 * device (the CPU device, zs_dev_t.host_addressable), unless the staging is
 * shared memory (the servers write it in place: the copy to the partition
 * is then the only one); else they land in pinned staging and are copied
 * to the device. */
int zs__eng_pull_in_place(const zs_engine_t *e);

/* Before pulls write the parameters in place (zs__eng_pull_in_place): wait
 * for every stream, so no queued work still reads them. ZS_OK otherwise. */
int zs__eng_pull_quiesce(zs_engine_t *e, zs_err_t *err);

/* Initial parameters (and master weights) from the model (zs_engine.c). */
int zs__eng_init_state(zs_engine_t *e, zs_err_t *err);

/* A status a lost or restarted shard server gives (zs_engine_recover.c). */
int zs__eng_is_server_loss(int rc);

/* Milliseconds on the monotonic clock. */
double zs__eng_now_ms(void);

/* Check macro for calls returning a zs status. */
#define ZS_ENG_TRY(expr)                                                                           \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != ZS_OK)                                                                          \
            return rc_;                                                                            \
    } while (0)

/* Keep a copy of the model manifest stored with every checkpoint
 * (zs_engine_opts_t.manifest; NULL: none). One that does not fit the
 * checkpoint's user_meta beside the engine's state is dropped with a
 * warning (checkpoints then carry none). zs_engine_ckpt.c. */
int zs__eng_set_manifest(zs_engine_t *e, const char *manifest, zs_err_t *err);

/* offload_param.device "nvme" (zs_engine_nvme.c). zs__pnv_create sets
 * e->pnv and lays the partition out (host memory for the first max_in_cpu
 * elements, the rest in the file); errors name nvme_path. zs__pnv_begin:
 * a host pointer holding segment s's part of the partition (load: its
 * values; else zeros, to be written), in the host region or the next free
 * buffer; zs__pnv_end: dirty writes a buffer back to the file; consumer
 * (may be NULL) is the stream still reading p, which the buffer waits for
 * before its next use. zs__pnv_host_bytes: the host bytes it allocated. */
int zs__pnv_create(zs_engine_t *e, zs_err_t *err);
void zs__pnv_destroy(zs_engine_t *e);
int zs__pnv_begin(zs_engine_t *e, const zs__seg_t *s, int load, void **out, zs_err_t *err);
int zs__pnv_end(zs_engine_t *e, const zs__seg_t *s, void *p, int dirty, zs_stream_t *consumer,
                zs_err_t *err);
uint64_t zs__pnv_host_bytes(const zs_engine_t *e);
/* Segment s's part of this worker's parameter partition := the (ve - vb)
 * elements of dt at host memory src (pulled parameters in staging): a copy
 * on the copy stream, or with offload_param nvme into its host region or
 * its file (written before the call returns). */
int zs__eng_param_set(zs_engine_t *e, zs__seg_t *s, const void *src, zs_err_t *err);

#endif
