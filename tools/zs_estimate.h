/*
 * zs_estimate.h - `zs-ctl estimate`: model-state memory of ZeRO stages 0-3,
 * per GPU and per host, with and without offload.
 *
 * Mixed precision + Adam, Ψ parameters, N GPUs (the data-parallel world
 * size), bytes per parameter (seeds/003):
 *   params 2Ψ (fp16/bf16), grads 2Ψ, optimizer states 12Ψ
 *   (fp32 master weights + momentum + variance, 4 + 4 + 4)
 *   stage 0  2Ψ   + 2Ψ   + 12Ψ     = 16Ψ
 *   stage 1  2Ψ   + 2Ψ   + 12Ψ/N
 *   stage 2  2Ψ   + 2Ψ/N + 12Ψ/N
 *   stage 3  2Ψ/N + 2Ψ/N + 12Ψ/N   = 16Ψ/N
 * A partitioned term is computed on the largest partition, ceil(Ψ/N)
 * parameters, so it is exact when N divides Ψ (7B on 8 GPUs: 38.5, 26.25
 * and 14 GB per GPU for stages 1-3, 1 GB = 1e9 bytes).
 *
 * Offload (zeroshard): --nodes n hosts, the GPUs spread evenly over them and
 * one shard server per host (the deploy/ layout).
 *   offload_optimizer  the 12Ψ leaves the GPUs for the shard servers, which
 *                      split the parameter space by range: 12 * ceil(Ψ/n)
 *                      per host, whatever the stage.
 *   offload_param      (stage 3 only) each GPU's 2Ψ/N parameter partition
 *                      moves to its host's memory: ceil(N/n) GPUs per host,
 *                      2 * ceil(Ψ/N) each.
 * Activations, communication buffers, fragmentation and the servers'
 * gradient staging are not model states and are not counted there.
 *
 * Activations (zs_estimate_act, with a GPT shape: --layers --heads --width
 * --ctx --vocab --micro-batch): what zeroshard's GPT keeps on each GPU for
 * its backward, fp32 (4 bytes), B = micro-batch, T = ctx, C = width, NH =
 * heads, V = vocab, per block w = B·T·(15C + 4) + B·NH·T² (LayerNorm
 * outputs and statistics, qkv, attention probabilities and output, the
 * residual after attention, the MLP's pre-activation and GELU output),
 * head h = B·T·C (its input) + B·T·(C + 2) (final LayerNorm) + B·T·Vp
 * (logits, rows padded to Vp = V rounded up to 64) + 4·B·T (losses, token
 * ids):
 *   no checkpointing     L·w + L·B·T·C + h
 *   checkpointing        L·B·T·C (checkpoints) + w (one block's workspace) + h
 *   cpu_checkpointing    B·T·C + w + h on the GPU (two residual slices the
 *                        checkpoints are copied through: one is h's input),
 *                        L·B·T·C pinned on its host
 * (docs/engine.md, "Activation checkpointing"; the model allocates each
 * tensor 64-byte aligned, so it measures up to 21·64 bytes more).
 * With 16-bit activations (act16; docs/engine.md, "Precision") the saved
 * tensors and residual slots take 2 bytes, LayerNorm statistics and the
 * head stay fp32, and the ops run in one fp32 block workspace w plus one
 * fp32 residual slice B·T·C; with s = w - 4·B·T (a block's tensors less
 * its statistics) and h' = B·T·(C + Vp + 6) (the head less its input):
 *   no checkpointing     4w + 16·B·T·(L-1) + 2·L·s + 4·B·T·C + 2·(L+1)·B·T·C + 4h'
 *   checkpointing        4w + 4·B·T·C + 2·(L+1)·B·T·C + 4h'
 *   cpu_checkpointing    4w + 4·B·T·C + 4·B·T·C + 4h' on the GPU (two 16-bit
 *                        slices), 2·L·B·T·C pinned
 * (up to 32·64 bytes more measured: the 16-bit homes are aligned too).
 */
#ifndef ZS_ESTIMATE_H
#define ZS_ESTIMATE_H

#include <stdint.h>
#include <stdio.h>

#include "zs_status.h"

/* Largest Ψ accepted (16Ψ must fit in 64 bits with a wide margin). */
#define ZS_ESTIMATE_MAX_PARAMS 1000000000000000ull /* 1e15 */

/* One configuration and its model-state bytes. */
typedef struct zs_estimate {
    /* inputs */
    uint64_t params; /* Ψ */
    int gpus;        /* N, total over all hosts */
    int nodes;       /* hosts */
    int stage;       /* 0..3 */
    int offload_optimizer, offload_param;
    /* bytes held by each GPU (the largest partition) */
    uint64_t gpu_params, gpu_grads, gpu_optimizer, gpu_total;
    /* bytes of host memory on each host */
    uint64_t host_optimizer; /* shard server's optimizer states (offload_optimizer) */
    uint64_t host_params;    /* offloaded parameter partitions of its GPUs (offload_param) */
    uint64_t host_total;
} zs_estimate_t;

/* Fill *out for Ψ = params, N = gpus, n = nodes hosts, a stage and the
 * offload flags. Refuses params outside 1..ZS_ESTIMATE_MAX_PARAMS, gpus < 1,
 * nodes outside 1..gpus, stage outside 0..3 and offload_param below stage 3
 * (as zero_optimization does). */
int zs_estimate(uint64_t params, int gpus, int nodes, int stage, int offload_optimizer,
                int offload_param, zs_estimate_t *out, zs_err_t *err);

/* A GPT's activations per GPU (see the formulas above). */
typedef struct zs_estimate_act {
    /* inputs */
    int layers, heads, width, ctx, vocab, micro_batch;
    int ckpt, cpu; /* activation checkpointing, cpu_checkpointing */
    int act16;     /* saved activations in bf16/fp16 (zs-train --activations) */
    /* bytes on each GPU: checkpoints (0 with cpu), blocks (L or 1
     * workspaces), other (residual slots that are not checkpoints, head) */
    uint64_t gpu_checkpoints, gpu_blocks, gpu_other, gpu_total;
    uint64_t host_pinned; /* cpu: the checkpoints, pinned on the GPU's host */
} zs_estimate_act_t;

/* Fill *out for the GPT shape and micro-batch, with or without
 * checkpointing (cpu needs ckpt), activations fp32 or (act16) 16-bit.
 * Refuses shapes that are not positive or width not a multiple of heads. */
int zs_estimate_act(int layers, int heads, int width, int ctx, int vocab, int micro_batch, int ckpt,
                    int cpu, int act16, zs_estimate_act_t *out, zs_err_t *err);

/* Print the activations of the three modes for the shape of *a (marking
 * a's mode) with their formulas. */
void zs_estimate_print_act(const zs_estimate_act_t *a, FILE *f);

/* Parse a parameter count: an integer or decimal (exponent allowed) with an
 * optional suffix K, M, B (or G), T (x 1e3, 1e6, 1e9, 1e12), case-
 * insensitive: "7B", "1.5e9", "125M", "350000". The result must be a whole
 * number in 1..ZS_ESTIMATE_MAX_PARAMS. */
int zs_estimate_parse_count(const char *s, uint64_t *out, zs_err_t *err);

/* Print the per-GPU and per-host breakdown of one configuration, with its
 * formula, in bytes and GB. */
void zs_estimate_print(const zs_estimate_t *e, FILE *f);

/* Print one line per configuration (stages 0-3, then the offload variants)
 * for Ψ, N, n: the per-GPU formula, per-GPU GB and per-host GB. */
int zs_estimate_print_table(uint64_t params, int gpus, int nodes, FILE *f, zs_err_t *err);

/* `zs-ctl estimate` (argv[0] is "estimate"): --params N --gpus G
 * [--nodes n] [--stage s [--offload-optimizer] [--offload-param]]
 * [--layers L --heads NH --width C --ctx T --vocab V --micro-batch B
 * [--activation-checkpointing] [--cpu-checkpointing]]. Without --stage
 * prints the table of every configuration; with a GPT shape, the
 * activations too. Returns the exit status
 * (0, or 2 for a usage error). */
int zs_estimate_main(int argc, char **argv);

#endif
