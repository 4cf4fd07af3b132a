/*
 * test_emu_nccl.h - what the two halves of the emulated NCCL's test share
 * (test_emu_nccl.c: results; test_emu_nccl_faults.c: refusals and faults).
 * MPI only starts the processes and broadcasts the unique id.
 */
#ifndef TEST_EMU_NCCL_H
#define TEST_EMU_NCCL_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern int g_rank, g_size;

/* A failed check stops this process with a message; mpiexec (or the kill
 * test's parent) then fails the run. No MPI call: a rank may be the child
 * of the kill test, which has no MPI. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL rank %d %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fflush(stderr);                                                                        \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

#define NCCLOK(expr)                                                                               \
    do {                                                                                           \
        ncclResult_t r_ = (expr);                                                                  \
        CHECK(r_ == ncclSuccess, "%s: %s", ncclGetErrorString(r_), ncclGetLastError(NULL));        \
    } while (0)

#define CUDAOK(expr)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        CHECK(e_ == cudaSuccess, "cuda error %d", (int)e_);                                        \
    } while (0)

/* A communicator over all MPI ranks (blocking, or settled non-blocking). */
ncclComm_t test_comm(int blocking);
/* Poll ncclCommGetAsyncError until it is no longer ncclInProgress; returns
 * the final state and the number of polls. */
ncclResult_t test_settle(ncclComm_t c, int *polls);
double test_now(void);

void test_faults(cudaStream_t s);
int test_kill_main(int nranks, int before);
int test_freed_main(void);

#endif
