/*
 * zs_engine.h - the ZeRO engine every worker runs (libzeroshard).
 *
 * Model-agnostic: a model is a list of layers, each declaring how many
 * parameters it owns and which other layers' parameters it also reads (a
 * tied LM head reads the token embedding: the "external parameter" case).
 * The engine owns the flat parameter and gradient buffers, groups whole
 * consecutive layers into buckets, partitions every bucket evenly over the W
 * workers, and calls the collectives (zs_coll.h) and the shard client
 * (zs_client.h) at the right moments for ZeRO stages 0-3:
 *
 *   stage 0  all-reduce gradients; every worker updates all parameters
 *   stage 1  all-reduce gradients; each worker updates its partition, then
 *            all-gather parameters
 *   stage 2  each bucket is reduce-scattered as soon as its backward is
 *            done (non-blocking, overlapped with the rest of backward); a
 *            worker keeps gradients for its partition only
 *   stage 3  + parameters partitioned: a bucket is all-gathered just before
 *            its forward and its backward and freed after, unless it is
 *            not larger than stage3_param_persistence_threshold; the next
 *            buckets in compute order are prefetched (non-blocking) while
 *            they fit in stage3_prefetch_bucket_size elements (at least one,
 *            at most four ahead)
 * With offload_optimizer the optimizer runs on the shard servers: each
 * worker pushes its gradient partition, the step is committed with its
 * scalars, and each worker pulls its updated partition. Without it the
 * worker runs the same CPU AdamW kernel on its partition, and the servers
 * (if given) only receive checkpoints.
 *
 * Partition rule (one for every stage): a bucket of n elements is padded to
 * n_pad = ceil(n / W) * W; worker r owns [r * n_pad/W, (r+1) * n_pad/W) of
 * it, clipped to n (the padding is zeros, never sent to servers).
 *
 * Numbers: parameters and gradients are stored in the configured dtype
 * (fp32, bf16 or fp16) and computed in fp32 on CPU; fp32 master weights and
 * Adam moments live with the optimizer. The gradient of a step is
 *   sum over workers and micro-batches of d(loss_micro * loss_scale)/dtheta,
 * unscaled in the optimizer by grad_scale = 1 / (loss_scale * W * gas).
 *
 * Threading: one thread per worker process calls the engine (MPI FUNNELED).
 */
#ifndef ZS_ENGINE_H
#define ZS_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zs_coll.h"
#include "zs_config.h"
#include "zs_dev.h"
#include "zs_status.h"

/* Where a micro-batch sits in the global batch: the model's data loader
 * picks samples from this so the global batch of a step is the same for any
 * world size (see zs_batch_sample). */
typedef struct zs_batch_ctx {
    uint64_t step;        /* 1-based training step */
    int micro;            /* 0 .. gas-1 */
    int gas;              /* gradient_accumulation_steps */
    int rank, world;      /* this worker, W */
    int micro_batch;      /* samples per micro-batch per worker */
    int64_t global_batch; /* train_batch_size */
} zs_batch_ctx_t;

/* Global sample index of sample k (0 .. micro_batch-1) of this micro-batch:
 * (step-1) * global_batch + (micro * world + rank) * micro_batch + k. */
static inline int64_t zs_batch_sample(const zs_batch_ctx_t *b, int k)
{
    return (int64_t)(b->step - 1) * b->global_batch +
           ((int64_t)b->micro * b->world + b->rank) * b->micro_batch + k;
}

/* A model as the engine sees it. All callbacks return a zs status and run
 * on the thread that calls the engine. Tensor work is never done inside a
 * callback: it is ENQUEUED on the compute stream given to bind (kernels on
 * CUDA, host functions or CPU ops on the CPU device), so it runs in order
 * with the engine's own copies, gathers and reductions. */
typedef struct zs_model {
    void *self;
    int nlayers;
    const size_t *nparams; /* [nlayers] parameters each layer owns (may be 0) */
    /* [nlayers] other layers whose parameters layer i also uses, -1
     * terminated, or NULL for none. A layer may only depend on lower
     * layers. */
    const int *const *deps;
    /* Initial values of layer i's own parameters into HOST memory (fp32,
     * deterministic: every worker calls it and must get the same numbers). */
    int (*init_params)(void *self, int layer, float *params, zs_err_t *err);
    /* First call after init_params: the device every tensor lives on and
     * the compute stream every later call enqueues on (neither owned). The
     * model allocates activations and scratch through zs_dev_alloc with
     * categories ZS_MEM_ACTIVATIONS / ZS_MEM_SCRATCH so they are counted. */
    int (*bind)(void *self, zs_dev_t *dev, zs_stream_t *compute, zs_err_t *err);
    /* Load the samples of micro-batch b (enqueue their upload). */
    int (*load_batch)(void *self, const zs_batch_ctx_t *b, zs_err_t *err);
    /* Forward of layer i: params[0] = its own, params[1..] = its deps' in
     * order; fp32 DEVICE pointers, valid until the work enqueued now has
     * run. Activations live in self. */
    int (*forward)(void *self, int layer, float *const *params, zs_err_t *err);
    /* Mean loss of the micro-batch after the last forward; waits for the
     * compute stream. */
    int (*loss)(void *self, double *loss, zs_err_t *err);
    /* Backward of layer i (called from the last layer down): enqueue work
     * that ACCUMULATES (+=) d(dloss * loss)/d(params) into grads[0] (own)
     * and grads[1..] (deps), fp32 device pointers. dloss seeds the last
     * layer's output gradient. */
    int (*backward)(void *self, int layer, float *const *params, float *const *grads, float dloss,
                    zs_err_t *err);
} zs_model_t;

typedef struct zs_engine zs_engine_t;

typedef struct zs_engine_opts {
    const zs_config_t *cfg; /* resolved for coll->size; copied */
    zs_coll_t *coll;        /* not owned */
    const char *servers;    /* "a:p,b:p" or NULL (required for offload/checkpoints) */
    const char *token;      /* bearer token or NULL */
    const char *model_name; /* identity on the servers (default "zs-model") */
    int server_timeout_ms;  /* deadline of each server call (default 120000) */
} zs_engine_opts_t;

/* Figures of one step (all workers agree on loss, lr, scale, skipped). */
typedef struct zs_step_stats {
    uint64_t step;
    double loss; /* mean over the global batch */
    double lr;
    double loss_scale;
    double grad_norm; /* global, unscaled, before clipping (inf/nan on overflow) */
    int skipped;      /* fp16 overflow: no update anywhere */
    double ms_forward, ms_backward, ms_comm, ms_optimizer; /* this worker */
} zs_step_stats_t;

/* Bytes this worker holds, by category. */
typedef struct zs_mem {
    uint64_t params;      /* compute-precision parameters (full or partition) */
    uint64_t host_params; /* offload_param (stage 3): the partition kept in host
                           * memory instead of device memory (then params = 0).
                           * On CPU workers the same RAM: bookkeeping only. */
    uint64_t grads;       /* gradients (full or partition) */
    uint64_t optimizer;   /* fp32 master + exp_avg + exp_avg_sq (0 with offload) */
    uint64_t buffers;     /* scratch: fp32 compute copies, gathered buckets, comm */
} zs_mem_t;

/* Lay out the model, create buffers, initialise parameters (every worker
 * computes the same init), connect to the servers. Does not talk to the
 * servers yet: call zs_engine_start (fresh) or zs_engine_resume. */
int zs_engine_create(const zs_engine_opts_t *opts, const zs_model_t *model, zs_engine_t **out,
                     zs_err_t *err);

/* Fresh start at step 0: with servers, Initialize them with the initial
 * weights (overwriting what they hold). Collective. */
int zs_engine_start(zs_engine_t *e, zs_err_t *err);

/* Resume from the newest checkpoint complete on every server (or `step` if
 * non-zero), with this run's world size (which may differ from the one that
 * wrote it). *step_out gets the step resumed at. Collective. */
int zs_engine_resume(zs_engine_t *e, uint64_t step, uint64_t *step_out, zs_err_t *err);

/* One training step: gas micro-batches of forward/backward, gradient
 * reduction, overflow check, clipping, optimizer, parameter gather.
 * Collective. */
int zs_engine_step(zs_engine_t *e, zs_step_stats_t *stats, zs_err_t *err);

/* Checkpoint the current step on the servers; returns when it is complete
 * on every server. Collective. */
int zs_engine_checkpoint(zs_engine_t *e, zs_err_t *err);

/* Current (last completed) step. */
uint64_t zs_engine_step_count(const zs_engine_t *e);

/* Total parameters P (sum of layers' own). */
uint64_t zs_engine_num_params(const zs_engine_t *e);

/* Bytes this worker holds, and what the seed formulas predict for this
 * stage and W with the engine's padded size (see zs_engine_mem_expected). */
void zs_engine_mem(const zs_engine_t *e, zs_mem_t *mem);

/* Model-state bytes per worker predicted by the ZeRO formulas for mixed
 * precision + Adam with Psi parameters, stage, W, offload: stage 0: 2+2+12,
 * 1: 2+2+12/W, 2: 2+(2+12)/W, 3: (2+2+12)/W (bytes per parameter; fp32
 * params: 4+4+12 likewise); with offload the 12 moves to the servers. */
void zs_engine_mem_expected(const zs_engine_t *e, zs_mem_t *mem);

/* Print a table of zs_engine_mem for every worker (collective; rank 0
 * prints to f). */
int zs_engine_print_mem(zs_engine_t *e, FILE *f, zs_err_t *err);

/* Full fp32 parameters (P floats) as this worker would compute with them:
 * gathers partitions in stage 3. Collective. For tests and export. */
int zs_engine_get_params(zs_engine_t *e, float *out, zs_err_t *err);

/* Free everything (not collective). NULL is a no-op. */
void zs_engine_destroy(zs_engine_t *e);

#endif
