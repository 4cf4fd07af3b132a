/*
 * zs_train_device.h - zs-train's device choice (zs_train_device.c): what
 * --device resolves to on every rank, and the CUDA memory report. Internal
 * to zs-train.
 */
#ifndef ZS_TRAIN_DEVICE_H
#define ZS_TRAIN_DEVICE_H

#include "zs_dev.h"
#include "zs_status.h"

/* What --device resolved to, the same on every rank. */
typedef struct zs__train_pick {
    int cuda;       /* 1: CUDA device + NCCL; 0: CPU device + MPI */
    int ordinal;    /* this rank's GPU (cuda) */
    char note[280]; /* why auto chose the CPU ("" otherwise) */
} zs__train_pick_t;

/* Resolve `device` ("auto", "cpu" or "cuda") on every rank: collective on
 * MPI_COMM_WORLD, before anything else uses MPI. auto takes the GPUs only
 * when every rank has one of its own (a node with fewer GPUs than ranks is
 * not one GPU per rank: the CPU, saying so in p->note, unless "cuda"
 * insists). ZS_OK, or ZS_ERR_UNAVAILABLE on every rank for "cuda" when a
 * rank has no usable GPU, with err naming the first such rank and its
 * reason (the same text on every rank, so rank 0 prints it alone). */
int zs__train_pick_device(const char *device, int rank, zs__train_pick_t *p, zs_err_t *err);

/* After the memory table on CUDA: every rank's device memory as the driver
 * counts it (cudaMemGetInfo: all processes on the GPU, CUDA's context,
 * cuBLASLt and the kernels' stream-ordered temporaries included) beside
 * what the device allocator holds. Collective (MPI_Gather; the NCCL
 * communicator does not use MPI after its creation). Only in builds with
 * CUDA and NCCL. */
void zs__train_print_gpu_mem(zs_dev_t *dev, int rank, int W);

#endif
