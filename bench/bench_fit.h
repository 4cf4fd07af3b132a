/*
 * bench_fit.h - what the two files of bench_fit share: the options (one
 * command line for the search and for a trial) and one trial's result as
 * the trial prints it and the search reads it back.
 *
 * bench_fit.c      the search: command line, host RAM check, the trials as
 *                  child processes (fork + exec of itself with --trial), the
 *                  layer search per (stage, width), the progress lines and
 *                  the final table.
 * bench_fit_trial.c one trial: device (with its memory limit), shard
 *                  servers, model + engine, 2 train steps, the measurements,
 *                  printed as one "FIT-RESULT" line.
 * Not a library: nothing outside bench/ uses these.
 */
#ifndef BENCH_FIT_H
#define BENCH_FIT_H

#include <stdint.h>
#include <stdio.h>

#include "zs_dev.h"

#define FIT_MAX_WIDTHS 16
#define FIT_MSG_MAX    400

/* Exit status of a trial process (anything else: crashed). */
enum {
    FIT_EXIT_FIT = 0,       /* both steps ran, losses finite */
    FIT_EXIT_OOM = 10,      /* ZS_ERR_NOMEM "out of device memory" */
    FIT_EXIT_ERROR = 11,    /* any other failure (host memory included) */
    FIT_EXIT_NONFINITE = 12 /* a step ran but its loss is inf or NaN */
};

typedef struct zs__fit_opts {
    int cuda;           /* --device cuda */
    uint64_t mem_limit; /* --mem-limit bytes (cpu: required; cuda: optional) */
    int batch, ctx, vocab, head_size;
    int widths[FIT_MAX_WIDTHS], nwidths;
    int stages[2], nstages; /* 3 (offload_param + optimizer), 2 (optimizer) */
    double time_limit;      /* seconds, 0: none */
    const char *server_bin;
    int nservers, server_threads, threads;
    int bf16;           /* --dtype bf16 */
    int act_ckpt;       /* --act-ckpt: 0 off, 1 on the device (default), 2 cpu (pinned) */
    int split;          /* --split: 1 (default) engine layers split to the bucket, 0 not */
    int64_t bucket;     /* reduce_bucket_size elements (0: DeepSpeed's default; -1: auto,
                         * the largest block part, 4 C^2 + 4 C) */
    int64_t persist;    /* stage3_param_persistence_threshold (-1: default) */
    int64_t max_live;   /* stage3_max_live_parameters (0: default) */
    int max_layers;     /* upper end of the search */
    double host_margin; /* fraction of MemAvailable a trial may plan to use */
    /* --trial */
    int trial, stage, width, layers;
    const char *workdir; /* the trial's servers keep their data here */
} zs__fit_opts_t;

/* One trial. Sizes in bytes, times in seconds. */
typedef struct zs__fit_result {
    char status[16]; /* fit, oom, error, nonfinite (trial); crash, timeout,
                      * host-ram, skipped (search) */
    uint64_t params;
    int layers, width;
    uint64_t held_peak;              /* zs_dev_mem held_peak[ZS_SPACE_DEVICE] */
    uint64_t peak[ZS_MEM_NCATS];     /* peak[ZS_SPACE_DEVICE][cat] */
    uint64_t pinned_peak;            /* held_peak[ZS_SPACE_PINNED] */
    uint64_t dev_cap;                /* the limit, or free GPU memory at start */
    uint64_t gpu_used;               /* cudaMemGetInfo total - free after step 2 */
    uint64_t rss_hwm, srv_hwm;       /* VmHWM of the trial / sum of its servers */
    double init_s, step_s[2], tok_s; /* engine create + start; steps; B*T/step 2 */
    double start_s;                  /* zs_engine_start alone (init_params + Initialize) */
    double loss[2];
    double wall_s; /* whole trial as the search saw it */
    char msg[FIT_MSG_MAX];
} zs__fit_result_t;

/* Run one trial as o describes (o->trial set), print its FIT-RESULT line
 * to stdout and return its FIT_EXIT_* status (bench_fit_trial.c). */
int zs__fit_trial(const zs__fit_opts_t *o);

/* Print r as the one line "FIT-RESULT k=v ... msg=<rest of line>". */
void zs__fit_result_print(const zs__fit_result_t *r, FILE *f);

/* Parse such a line (after "FIT-RESULT "); 0 on success, -1 if it is not one. */
int zs__fit_result_parse(const char *line, zs__fit_result_t *r);

/* VmHWM of process pid (0: this one) in bytes, 0 if unknown. */
uint64_t zs__fit_vm_hwm(int pid);

#endif
