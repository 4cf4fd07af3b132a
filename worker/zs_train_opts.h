/*
 * zs_train_opts.h - zs-train's options (zs_train_opts.c parses them) and
 * exit codes. Internal to the zs-train program.
 */
#ifndef ZS_TRAIN_OPTS_H
#define ZS_TRAIN_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "zs_dtype.h"
#include "zs_gpt.h"

/* Exit codes; one per thing that can be wrong, documented in usage() and README. */
enum {
    ZS_EXIT_OTHER = 1,  /* anything not below (device, MPI, model, CSV or --save-params file) */
    ZS_EXIT_USAGE = 2,  /* command line, --token-file unreadable, --metrics not servable */
    ZS_EXIT_CONFIG = 3, /* --config unreadable or refused, or not valid for this world size */
    ZS_EXIT_DATA = 4,   /* --data unreadable or not a token file */
    ZS_EXIT_ENGINE = 5, /* the engine or the shard servers (connect, resume, step, checkpoint) */
    ZS_EXIT_DEVICE = 6, /* --device cuda: no usable GPU, or its device / NCCL set-up failed */
};

typedef struct {
    const char *config, *servers, *data, *csv, *token_file, *name, *save_params, *device;
    const char *gemm;                       /* --gemm: auto, fp32, bf16, fp16 */
    const char *acts;                       /* --activations: auto, fp32, bf16, fp16 */
    const char *attention;                  /* --attention: unfused, flash */
    const char *metrics, *metrics_ready;    /* rank 0's Prometheus endpoint, its address file */
    const char *init_from;                  /* --init-from: pretrained weights (zs_init_from.h) */
    const char *transport;                  /* --transport: auto, shm, tcp (zs_client.h) */
    const char *decay;                      /* --decay: all, 2d, matmul (zs_gpt_decay_t) */
    int given_l, given_h, given_c, given_t; /* shape flags given on the command line */
    const char *val_data, *prompt, *vocab_dir; /* --val-data, --prompt, --vocab-dir */
    int val_every, sample_every, sample_tokens, top_k;
    uint64_t val_tokens;
    double temperature;
    zs_gpt_config_t g;
    int steps, ckpt_every, resume, log_every, micro, mem_every, allow_unknown;
    int act_ckpt;     /* --activation-checkpointing */
    int split;        /* --split-layers */
    int print_config; /* --print-config: the resolved table at start, not only its digest */
    int resume_auto, server_timeout, server_wait, max_recoveries, fresh;
    uint64_t seed;
} zs__train_opts_t;

/* The usage text (--help) into f. */
void zs__train_usage(FILE *f);

/* Parse the command line into *o. Returns 0, 1 for --help (printed), or
 * ZS_EXIT_USAGE (reason printed). Only `loud` (rank 0) prints: every rank
 * sees the same argv. */
int zs__train_parse(int argc, char **argv, zs__train_opts_t *o, int loud);

/* The GEMM dtype of --gemm `name`: auto picks the config's dtype `cfg_dt` on
 * CUDA and fp32 on the CPU. -1 for an unknown name. */
int zs__train_gemm_dtype(const char *name, int cfg_dt, int cuda);

/* The activation dtype of --activations `name`: auto picks the config's
 * dtype `cfg_dt` (fp32, bf16 or fp16) on every device. -1 for an unknown
 * name. */
int zs__train_act_dtype(const char *name, int cfg_dt);

#endif
