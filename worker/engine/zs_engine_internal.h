/*
 * zs_engine_internal.h - the engine's struct and helpers shared by
 * zs_engine.c (layout, lifecycle, memory), zs_engine_step.c (forward,
 * backward, gradient reduction), zs_engine_optim.c (norm, clipping,
 * optimizer, parameter gather) and zs_engine_ckpt.c (start, resume,
 * checkpoint). Not a public header.
 *
 * Padded layout: bucket b (n elements) occupies n_pad = ceil(n/W)*W slots at
 * pbase[b] in "full" buffers (size Ppad) and part = n_pad/W slots at
 * qbase[b] = pbase[b]/W in "partition" buffers (size Ppad/W). Flat
 * (server) index of slot k of bucket b is off[b] + k for k < n.
 */
#ifndef ZS_ENGINE_INTERNAL_H
#define ZS_ENGINE_INTERNAL_H

#include "zs_client.h"
#include "zs_engine.h"
#include "zs_loss_scale.h"

typedef struct zs__pusher zs__pusher_t;

typedef struct zs__bucket {
    int first, last;      /* layers [first, last] */
    uint64_t off, n;      /* flat range [off, off + n) */
    uint64_t n_pad, part; /* padded size, per-worker part */
    uint64_t pbase, qbase;
    uint64_t vb, ve; /* valid part of this worker's partition, bucket-relative [vb, ve) */
    int fwd_until;   /* stage 3: release after the forward of this layer */
    int persistent;  /* stage 3: stays gathered */
    /* stage 3: gathered parameters (dtype, n_pad) and their fp32 view (n) */
    void *gathered;
    float *gathered32;
    zs_coll_req_t *gather_req;
    /* backward of one micro-batch: fp32 gradient accumulation (n) */
    float *gscratch;
    /* stages 2-3: reduce-scatter in flight */
    void *rs_send, *rs_recv;
    zs_coll_req_t *rs_req;
} zs__bucket_t;

struct zs_engine {
    zs_config_t cfg;
    zs_model_t m;
    zs_coll_t *coll;
    int rank, W, stage, offload;
    zs_client_t *client; /* NULL without servers */
    char model_name[128];
    zs_dtype_t dt;
    size_t esz;

    int nlayers;
    uint64_t *layer_off; /* flat offset of each layer's own params */
    int *layer_bucket;
    int **deps;  /* copies, -1 terminated */
    int maxdeps; /* most deps of one layer */
    uint64_t P, Ppad;

    int nb;
    zs__bucket_t *b;

    /* model state */
    void *params;   /* stages 0-2: full (Ppad); stage 3: partition (Ppad/W) */
    void *grads;    /* stages 0-1: full; stages 2-3: partition */
    float *cparams; /* stages 0-2, dtype != fp32: fp32 copy of params (Ppad) */
    float *master, *exp_avg, *exp_avg_sq; /* no offload: stage 0 full, else partition */

    zs_loss_scale_t ls;
    uint64_t step; /* last completed step */
    uint64_t t;    /* Adam steps taken (non-skipped) */
    int rs_inflight;
    int rs_order[2]; /* buckets whose reduce-scatter is in flight, oldest first */

    zs__pusher_t *pusher; /* offload: background gradient push (zs_engine_push.c) */
    int last_micro;       /* the current micro-batch is the step's last */
    double ms_gather;     /* stage 3: time in parameter gathers during compute */

    /* Freed scratch blocks kept for reuse: buckets ask for the same sizes
     * every micro-batch, and fresh large blocks cost a page fault per 4 KiB. */
    struct {
        void *p;
        size_t bytes;
    } cache[8];

    uint64_t buffer_bytes; /* scratch currently allocated */
    uint64_t buffer_peak;
};

/* Tracked scratch allocation (counted in zs_mem_t.buffers). */
void *zs__eng_alloc(zs_engine_t *e, size_t bytes);
void zs__eng_free(zs_engine_t *e, void *p, size_t bytes);

/* Bucket of a flat parameter range, pointer helpers. */
static inline void *zs__at(const zs_engine_t *e, void *base, uint64_t slot)
{
    return (char *)base + slot * e->esz;
}

/* Stage 3: make bucket b's parameters available as fp32 (blocking on a
 * prefetch if one is in flight); start a prefetch of bucket `next` (-1:
 * none). */
int zs__eng_gather(zs_engine_t *e, int b, int next, zs_err_t *err);
void zs__eng_release(zs_engine_t *e, int b);

/* fp32 pointer to layer i's own params (stages 0-2 from params/cparams,
 * stage 3 from the gathered bucket). */
float *zs__eng_layer_params(zs_engine_t *e, int layer);

/* After the optimizer: bring every worker's parameters up to date (all-gather
 * for stages 0-2, refresh fp32 copies, re-gather persistent buckets). */
int zs__eng_after_update(zs_engine_t *e, zs_err_t *err);

/* Norm, overflow, clipping, optimizer or offload for the step. */
int zs__eng_optimize(zs_engine_t *e, zs_step_stats_t *st, zs_err_t *err);

/* Make every worker return an error if any worker failed (all-reduce of a
 * failure flag): returns rc if it is an error, else a sentence about the
 * other worker. Collective. */
int zs__eng_agree(zs_engine_t *e, int rc, zs_err_t *err);

/* Background push of final gradient partitions (offload). */
int zs__eng_pusher_start(zs_engine_t *e, zs_err_t *err);
void zs__eng_pusher_stop(zs_engine_t *e);
int zs__eng_push_async(zs_engine_t *e, uint64_t step, uint64_t lo, uint64_t hi, const void *src,
                       zs_err_t *err);
int zs__eng_push_wait(zs_engine_t *e, zs_err_t *err);

/* Bucket k's gradient partition is final for this step: with offload,
 * queue its push. */
int zs__eng_bucket_final(zs_engine_t *e, int k, zs_err_t *err);

/* Check macro for callbacks into the model. */
#define ZS_ENG_TRY(expr)                                                                           \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != ZS_OK)                                                                          \
            return rc_;                                                                            \
    } while (0)

#endif
