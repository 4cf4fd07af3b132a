/*
 * zs_engine.h - the ZeRO engine every worker runs (libzeroshard).
 *
 * Model-agnostic: a model is a list of layers, each declaring how many
 * parameters it owns and which other layers' parameters it also reads (a
 * tied LM head reads the token embedding: the "external parameter" case).
 * The engine owns the parameter, gradient and optimizer buffers on the
 * worker's device (zs_dev.h: CPU now, CUDA next; the engine never touches
 * tensor memory directly), partitions them over the W workers, and
 * enqueues the collectives (zs_coll.h) and the shard client's transfers at
 * the right moments for ZeRO stages 0-3:
 *
 *   stage 0  all-reduce gradients; every worker updates all parameters
 *   stage 1  all-reduce gradients; each worker updates its partition, then
 *            all-gather parameters
 *   stage 2  each gradient bucket is reduce-scattered on the communication
 *            stream as soon as its backward is done (overlapping the rest of
 *            backward); a worker keeps gradients for its partition only
 *   stage 3  + parameters partitioned per layer (DeepSpeed's module
 *            granularity): a layer is all-gathered before its forward and
 *            backward, prefetched ahead within stage3_prefetch_bucket_size,
 *            kept while reused within stage3_max_reuse_distance and
 *            stage3_max_live_parameters, freed otherwise; layers of at most
 *            stage3_param_persistence_threshold elements stay gathered;
 *            offload_param keeps the partition in pinned host memory
 * With offload_optimizer the optimizer runs on the shard servers: each
 * bucket's reduced gradient partition is copied to pinned memory on a copy
 * stream and pushed while backward goes on, the step is committed with its
 * scalars, and the updated partition is pulled into pinned memory, copied
 * to the device and gathered. Without it the worker runs AdamW on its
 * partition on the device, and the servers (if given) only keep checkpoints.
 *
 * Layout and streams: see zs_engine_internal.h (segments, buckets, events).
 *
 * Numbers: parameters and gradients are stored in the configured dtype
 * (fp32, bf16 or fp16); layers compute on fp32 copies; fp32 master weights
 * and Adam moments live with the optimizer. The gradient of a step is
 *   sum over workers and micro-batches of d(loss_micro * loss_scale)/dtheta,
 * unscaled in the optimizer by grad_scale = 1 / (loss_scale * W * gas).
 *
 * Threading: one thread per worker process calls the engine; the device's
 * streams and the pusher run beside it. MPI must be initialised with
 * MPI_THREAD_SERIALIZED or higher (collectives run on the comm stream).
 */
#ifndef ZS_ENGINE_H
#define ZS_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zs_adam_groups.h"
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
     * order; DEVICE pointers to fp32 elements (or to the engine's dtype when
     * set_param_dtype accepted it), valid until the work enqueued now has
     * run. Activations live in self. */
    int (*forward)(void *self, int layer, void *const *params, zs_err_t *err);
    /* Mean loss of the micro-batch after the last forward; waits for the
     * compute stream. */
    int (*loss)(void *self, double *loss, zs_err_t *err);
    /* Backward of layer i (called from the last layer down): enqueue work
     * that ACCUMULATES (+=) d(dloss * loss)/d(params) into grads[0] (own)
     * and grads[1..] (deps), fp32 device pointers (always fp32, whatever
     * params are). dloss seeds the last layer's output gradient. */
    int (*backward)(void *self, int layer, void *const *params, float *const *grads, float dloss,
                    zs_err_t *err);
    /* Optional (NULL: the model reads fp32 only). Called once before bind
     * when the engine stores parameters in a 16-bit dtype (ZS_DTYPE_BF16 /
     * ZS_DTYPE_F16). Returning ZS_OK means the model reads them as they
     * are: forward and backward then get params[] pointing to elements of
     * dt, and the engine keeps no fp32 copy or view of them at any stage
     * (the model converts what it needs into its own scratch, counted at
     * bind). Any error fails engine creation. Without it the engine casts
     * each layer and its deps into one fp32 view before use (stages 0-2)
     * or keeps an fp32 copy of each gathered layer (stage 3). */
    int (*set_param_dtype)(void *self, int dt, zs_err_t *err);
    /* Optional [nlayers] (NULL: all 0). 1: layer i only READS its deps'
     * parameters; its backward gets grads[1..] NULL and writes gradients
     * to its own parameters only (the deps' gradients come from their own
     * backward), so a dep's gradient bucket is not held from layer i's
     * backward on. */
    const unsigned char *deps_read_only;
} zs_model_t;

typedef struct zs_engine zs_engine_t;

/* Test-only faults, to prove that the checks guarding them can fail. */
#define ZS_ENGINE_DEBUG_DROP_WAIT                                                                  \
    1u                                 /* skip event waits: the reduce-scatter does                \
                                        * not wait for the backward, nor compute for               \
                                        * a stage-3 gather */
#define ZS_ENGINE_DEBUG_LEAK        2u /* leak a scratch block every step */
#define ZS_ENGINE_DEBUG_GRAD_SCALE2 4u /* unscale gradients by 2x the right factor */
#define ZS_ENGINE_DEBUG_KEEP_GRADS                                                                 \
    8u /* stages 2-3 with offload_optimizer: keep a gradient partition on the                      \
        * device as well (what the engine did before issue 16) */
#define ZS_ENGINE_DEBUG_MICS_NO_ALLREDUCE                                                          \
    16u /* MiCS: skip the gradient all-reduce across the replica groups */

typedef struct zs_engine_opts {
    const zs_config_t *cfg; /* resolved for coll->size; copied */
    zs_coll_t *coll;        /* not owned; its device is the engine's */
    const char *servers;    /* "a:p,b:p" or NULL (required for offload/checkpoints) */
    const char *token;      /* bearer token or NULL */
    const char *model_name; /* identity on the servers (default "zs-model") */
    int server_timeout_ms;  /* deadline of each server call (default 120000) */
    unsigned debug;         /* ZS_ENGINE_DEBUG_* (tests only; 0) */
    /* Model manifest (JSON text, copied; NULL: none) stored with every
     * checkpoint beside the engine's state, so tools read the model's
     * tensors from a checkpoint without model code (zs-ctl export; the
     * GPT's: zs_gpt_manifest). Last, so initialisers without it still work. */
    const char *manifest;
    /* How pushes and pulls reach the servers (zs_transport_t, zs_client.h;
     * 0: auto). With offload_optimizer and a transport other than tcp the
     * offload staging is a shared-memory segment every co-located server
     * maps (docs/engine.md, "Shared-memory transport"); with shm, a server
     * that does not take it fails zs_engine_create. */
    int transport;
    /* Parameter groups (kernels/zs_adam_groups.h; copied; 0: none): ranges
     * of the flat parameter space with their own weight decay (e.g. none
     * on biases and norms: zs_gpt_decay_groups). They must end at the
     * model's P and use lr index 0 only (one learning rate per step). The
     * engine's own AdamW and the servers apply them; the servers keep them
     * with every checkpoint, and a resume with other groups is refused. */
    const zs_group_range_t *groups;
    size_t ngroups;
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
    /* With offload, ms_optimizer is the time this worker waited for the
     * optimizer: the last pushes, the commit and the pulls. spec: with
     * offload_optimizer.super_offload, 1 if the commit carried the scalars the
     * pushes stated (the servers keep their speculative update), -1 if not
     * (they roll it back: clipping, overflow); 0 without speculation (off,
     * or held back after a step whose scalars differed: speculate_every_step). */
    int spec;
    /* With offload, ms_optimizer split: waiting for this worker's last
     * pushes, the commit call (rank 0; the servers accept it at once), and
     * the pulls (the servers' AdamW shows here: a pull waits per chunk).
     * With offload_optimizer.stream_pulls (the default) the pulls run after
     * the step: ms_opt_pull is then the time this step's forward waited for
     * the previous step's parameters (inside ms_forward). */
    double ms_opt_push, ms_opt_commit, ms_opt_pull;
    /* The bytes this worker's collectives sent during the step, within its
     * node and across nodes, per kind (zs_coll.h's counters and their
     * per-peer model; the topology: ZS_RANKS_PER_NODE or MPI's view). */
    zs_coll_bytes_t bytes;
    /* Of those, what the backward passes enqueued (stage 3's gathers for
     * backward, the gradient reduce-scatters that overlap it): with hpZ
     * its gathers stay within the node. */
    zs_coll_bytes_t bytes_bwd;
} zs_step_stats_t;

/* Memory of this worker, measured by the device allocator, beside what the
 * ZeRO formulas and the configuration say it should be. */
typedef struct zs_engine_mem {
    zs_dev_mem_t measured;          /* every allocation of this process's device */
    uint64_t formula[ZS_MEM_NCATS]; /* seed formulas: params, grads, optimizer (bytes) */
    uint64_t working[ZS_MEM_NCATS]; /* buffers the configuration allows on top (bytes) */
    /* Of formula + working, what may be in the DEVICE space (bytes): the
     * rest lives in pinned or host memory (offload staging, the stage-3
     * partition with offload_param, init and norm buffers on the host). */
    uint64_t device[ZS_MEM_NCATS];
    uint64_t rss; /* process resident set (bytes; 0 if unknown) */
} zs_engine_mem_t;

/* Lay out the model, create buffers, initialise parameters (every worker
 * computes the same init), connect to the servers. Changes nothing on the
 * servers yet: call zs_engine_start (fresh) or zs_engine_resume. (With
 * offload_optimizer and a transport other than tcp it says Hello to learn
 * which servers share this host, and hands them the shared staging: a
 * server that cannot be reached fails it then.) */
int zs_engine_create(const zs_engine_opts_t *opts, const zs_model_t *model, zs_engine_t **out,
                     zs_err_t *err);

/* Fresh start at step 0: with servers, Initialize them with the initial
 * weights (overwriting what they hold) and delete every checkpoint they
 * hold, so nothing of an earlier run can be restored into this one (see
 * zs_engine_newest_checkpoint to ask first). Collective. */
int zs_engine_start(zs_engine_t *e, zs_err_t *err);

/* Resume from the newest checkpoint complete on every server (or `step` if
 * non-zero), with this run's world size (which may differ from the one that
 * wrote it). *step_out gets the step resumed at. Collective. */
int zs_engine_resume(zs_engine_t *e, uint64_t step, uint64_t *step_out, zs_err_t *err);

/* One training step: gas micro-batches of forward/backward, gradient
 * reduction, overflow check, clipping, optimizer, parameter gather.
 * Collective. */
int zs_engine_step(zs_engine_t *e, zs_step_stats_t *stats, zs_err_t *err);

/* The newest checkpoint complete on every server (0: none). Collective. */
int zs_engine_newest_checkpoint(zs_engine_t *e, uint64_t *step, zs_err_t *err);

/* Checkpoint the current step on the servers; returns when it is complete
 * on every server. Collective. */
int zs_engine_checkpoint(zs_engine_t *e, zs_err_t *err);

/* After a failed zs_engine_step or zs_engine_checkpoint, on every worker
 * (collective): if any worker lost a shard server (unreachable, past its
 * deadline, or restarted without the step's state), wait up to wait_ms
 * for every server to answer again, restore the newest checkpoint complete
 * on all of them and roll every worker back to it (*step_out; 0 when none
 * was complete: the run starts over). Other failures are refused with
 * ZS_ERR_STATE; servers that stay away give ZS_ERR_UNAVAILABLE. See
 * zs_engine_recover.c. */
int zs_engine_recover(zs_engine_t *e, int wait_ms, uint64_t *step_out, zs_err_t *err);

/* Current (last completed) step. */
uint64_t zs_engine_step_count(const zs_engine_t *e);

/* Total parameters P (sum of layers' own). */
uint64_t zs_engine_num_params(const zs_engine_t *e);

/* How the offloaded gradients and parameters travel, in words, into buf
 * (n bytes): "shared memory with all 2 servers", or "TCP with server 1
 * (addr): <why>" naming the first server not on shared memory; "" without
 * offload_optimizer. For the start-up lines of a trainer. */
void zs_engine_transport_line(const zs_engine_t *e, char *buf, size_t n);

/* The engine's state as stored with a checkpoint (its user_meta on the
 * servers), parsed: for tools that read checkpoints (zs-ctl export,
 * reshard). manifest points into the caller's meta (not NUL-terminated;
 * NULL with manifest_len 0 when the checkpoint carries none, e.g. one
 * written before manifests existed). */
typedef struct zs_engine_ckpt_meta {
    uint64_t step;   /* the checkpoint's training step */
    uint64_t adam_t; /* Adam steps taken */
    const char *manifest;
    size_t manifest_len;
} zs_engine_ckpt_meta_t;

/* Parse `len` bytes of a checkpoint's user_meta into *out. ZS_ERR_CORRUPT
 * ("not written by the zeroshard engine") unless the layout is exactly the
 * engine's: magic, step, Adam t, loss-scaler state, then optionally a
 * 32-bit length and that many bytes of manifest. */
int zs_engine_meta_parse(const void *meta, size_t len, zs_engine_ckpt_meta_t *out, zs_err_t *err);

/* Measured memory, formulas and working set (see zs_engine_mem_t). The
 * formulas for mixed precision + Adam with Psi = padded parameters, bytes
 * per parameter (k = 2 for bf16/fp16, 4 for fp32): params k (stage 3: k/W),
 * grads k (stages 2-3: k/W), optimizer 12 (stages 1-3: 12/W; 0 with
 * offload_optimizer). The working set: per-layer fp32 views (stages 0-2
 * in 16-bit: the largest layer with its deps), stage-3 gathers within
 * stage3_max_live_parameters + stage3_prefetch_bucket_size + the largest
 * layer, gradient scratch and reduce buffers of the largest bucket, offload
 * staging of one partition (pinned). Device bound per category (device[]):
 * with offload_optimizer at stages 2-3 the device holds no gradient
 * partition (the reduced gradient goes to pinned staging as each bucket is
 * reduced), only, with gradient accumulation, up to 2 bucket partitions
 * where micro-batches add up. Init and export use a 4 MiB device chunk. */
void zs_engine_mem(zs_engine_t *e, zs_engine_mem_t *out);

/* Check every category: measured peak (all spaces) <= formula + working
 * set, and the device space's peak <= device[]. Returns ZS_OK or
 * ZS_ERR_RANGE naming the first category over it. */
int zs_engine_mem_check(zs_engine_t *e, zs_err_t *err);

/* Print the memory table of every worker (collective; rank 0 prints to
 * f): per category the peak of all spaces / formula / working set, then a
 * device section (per category the device peak / device bound) and the
 * held peak of each space (device, pinned, host), RSS. */
int zs_engine_print_mem(zs_engine_t *e, FILE *f, zs_err_t *err);

/* Full fp32 parameters (P floats) as this worker would compute with them:
 * gathers partitions in stage 3. Collective. For tests and export. */
int zs_engine_get_params(zs_engine_t *e, float *out, zs_err_t *err);

/* Free everything (not collective). NULL is a no-op. */
void zs_engine_destroy(zs_engine_t *e);

#endif
