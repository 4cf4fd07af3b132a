/*
 * zs_dev_cpu_internal.h - what the two files of the CPU device share
 * (zs_dev_cpu.c: memory, streams, events; zs_dev_cpu_ops.c: the vector
 * ops). Not part of the device interface: nothing outside worker/dev/
 * includes it.
 */
#ifndef ZS_DEV_CPU_INTERNAL_H
#define ZS_DEV_CPU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "zs_dev.h"
#include "zs_pool.h"

/* A caller's memory registered as pinned (zs_dev_host_register). */
typedef struct zs_cpu_reg {
    char *p;
    size_t bytes;
    int cat;
    struct zs_cpu_reg *next;
} zs_cpu_reg_t;

typedef struct zs_cpu_dev {
    zs_dev_t base;
    int threads;
    uint64_t ram;    /* bytes of physical memory: no single block may exceed it */
    uint64_t limit;  /* device memory limit (zs_dev_cpu_opts_t.device_limit; 0: none) */
    zs_pool_t *pool; /* NULL when threads == 1: vector ops run on the stream thread */
    pthread_mutex_t mem_mu;
    zs_dev_mem_t mem;      /* under mem_mu */
    uint64_t reserved;     /* under mem_mu: device bytes being allocated under a limit */
    zs_cpu_reg_t *regs;    /* under mem_mu: registered caller memory */
    pthread_mutex_t ev_mu; /* every zs_cpu_rec_t and every cpu_event_t.last */
    pthread_cond_t ev_cv;  /* broadcast when a record completes */
} zs_cpu_dev_t;

/* Kinds of task, and the task: one unit of work on a stream's queue. */
enum {
    ZS_CPU_T_HOST,
    ZS_CPU_T_MEMCPY,
    ZS_CPU_T_MEMSET,
    ZS_CPU_T_RECORD,
    ZS_CPU_T_WAIT,
    ZS_CPU_T_CAST,
    ZS_CPU_T_ACC,
    ZS_CPU_T_SCALE,
    ZS_CPU_T_SUMSQ,
    ZS_CPU_T_ADAMW,
    ZS_CPU_T_ROWS,
    ZS_CPU_T_ROUND, /* zs_dev_round: vec.dst is x (fp32), vec.src is h, vec.sdt its dtype */
};

typedef struct zs_cpu_task {
    struct zs_cpu_task *next;
    int kind;
    union {
        struct {
            zs_host_fn_t fn;
        } host;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } copy;
        struct {
            void *dst;
            int byte;
            size_t bytes;
        } set;
        struct zs_cpu_rec
            *rec; /* ZS_CPU_T_RECORD, ZS_CPU_T_WAIT: one reference owned by the task */
        struct {
            void *dst;
            const void *src;
            zs_dtype_t ddt, sdt;
            float alpha; /* ZS_CPU_T_SCALE: dst is x, src unused */
            size_t n;
            double *acc; /* ZS_CPU_T_SUMSQ: src is x */
        } vec;
        struct {
            zs_adam_hparams_t hp;
            zs_adam_step_t st;
            float *p, *m, *v;
            const void *grad;
            zs_dtype_t gdt, odt;
            void *out;
            size_t n;
        } adam;
        struct {
            float *dst;
            const void *src;
            zs_dtype_t sdt;
            const int32_t *idx;
            size_t n, width;
            int32_t lo, hi;
        } rows; /* ZS_CPU_T_ROWS: zs_dev_cast_rows */
    } u;
    _Alignas(16) unsigned char args[]; /* ZS_CPU_T_HOST: the copied arguments */
} zs_cpu_task_t;

/* A zeroed task of `kind` with `extra` bytes of host-function arguments;
 * NULL (ZS_ERR_NOMEM set) when out of memory. Freed by the stream thread. */
zs_cpu_task_t *zs__cpu_task_new(int kind, size_t extra, zs_err_t *err);

/* Append t to stream s's queue; takes ownership of t (freed on error too).
 * ZS_ERR_STATE when the stream is being destroyed. */
int zs__cpu_enqueue(zs_stream_t *s, zs_cpu_task_t *t, zs_err_t *err);

/* Run a vector task (CAST, ACC, SCALE, SUMSQ, ADAMW, ROWS) to completion on the
 * calling thread, elementwise ones split over dev->pool. */
void zs__cpu_vec_exec(zs_cpu_dev_t *dev, const zs_cpu_task_t *t);

/* The table entries for the vector ops (see zs_dev.h): validate, then queue. */
int zs__cpu_cast(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                 size_t n, zs_err_t *err);
int zs__cpu_accumulate(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                       size_t n, zs_err_t *err);
int zs__cpu_scale(zs_stream_t *s, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err);
int zs__cpu_sumsq(zs_stream_t *s, const void *x, zs_dtype_t dt, size_t n, double *acc,
                  zs_err_t *err);
int zs__cpu_round(zs_stream_t *s, float *x, void *h, zs_dtype_t dt, size_t n, zs_err_t *err);
int zs__cpu_cast_rows(zs_stream_t *s, float *dst, const void *src, zs_dtype_t sdt,
                      const int32_t *idx, size_t n, int32_t lo, int32_t hi, size_t width,
                      zs_err_t *err);
int zs__cpu_adamw(zs_stream_t *s, const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p,
                  float *m, float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t odt,
                  size_t n, zs_err_t *err);

#endif
