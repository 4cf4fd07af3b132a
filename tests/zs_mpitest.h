/*
 * zs_mpitest.h - the check macros of the tests that run under mpirun
 * (test_coll.c, test_coll_stream.c, test_nccl_boot.c): a failed check
 * prints the rank, file:line and the expression, and stops the whole job
 * (MPI_Abort), so no rank waits forever in a collective for a failed one.
 * The including program defines int g_rank (its MPI rank). Header only.
 */
#ifndef ZS_MPITEST_H
#define ZS_MPITEST_H

#include <stdio.h>

#include <mpi.h>

extern int g_rank;

/* Stop the whole job (every rank) on a failed check. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL rank %d %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

/* expr returns a zs status; err is a zs_err_t (not a pointer). */
#define OK(expr, err)                                                                              \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        CHECK(rc_ == ZS_OK, "returned %d: %s", rc_, (err).msg);                                    \
    } while (0)

#endif
