/*
 * zs_coll_topo.c - the job's topology over MPI (zs_coll_topo.h): node
 * numbers from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) or from
 * ZS_RANKS_PER_NODE, and the intra-node and inter-node splits.
 *
 * Agreement: the override is read on every rank and compared with one
 * MPI_Allreduce (min and max of the value, -1 for unset or malformed), so a
 * mismatch is one error on every rank rather than communicators that do
 * not match.
 *
 * What it does not do: hold any state; the communicators belong to the
 * caller.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_coll_topo.h"

/* ZS_RANKS_PER_NODE as a number: 0 unset, -1 malformed, else N >= 1. */
static int env_ranks_per_node(void)
{
    const char *v = getenv(ZS_RANKS_PER_NODE_ENV);
    if (!v || !*v)
        return 0;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 1 << 20)
        return -1;
    return (int)n;
}

static int mpi_err(int mrc, const char *call, int rank, zs_err_t *err)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mrc, text, &len) != MPI_SUCCESS || len <= 0)
        snprintf(text, sizeof text, "MPI error %d", mrc);
    return zs_err_set(err, ZS_ERR_INTERNAL, "topology: %s on rank %d: %s", call, rank, text);
}

/* ZS_TOPO_MPI(call, args...): one MPI call; on failure set rc and leave. */
#define ZS_TOPO_MPI(fn, ...)                                                                       \
    do {                                                                                           \
        int mrc_ = fn(__VA_ARGS__);                                                                \
        if (mrc_ != MPI_SUCCESS) {                                                                 \
            rc = mpi_err(mrc_, #fn, rank, err);                                                    \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

int zs__coll_topo_build(MPI_Comm world, zs_coll_topo_t *t, MPI_Comm *intra, MPI_Comm *inter,
                        zs_err_t *err)
{
    int rank = 0, size = 1, rc = ZS_OK;
    MPI_Comm shared = MPI_COMM_NULL;
    int *leaders = NULL;
    memset(t, 0, sizeof *t);
    *intra = *inter = MPI_COMM_NULL;
    ZS_TOPO_MPI(MPI_Comm_rank, world, &rank);
    ZS_TOPO_MPI(MPI_Comm_size, world, &size);
    int n = env_ranks_per_node(), mm[2] = {-n, n}, agreed[2];
    ZS_TOPO_MPI(MPI_Allreduce, mm, agreed, 2, MPI_INT, MPI_MAX, world);
    if (-agreed[0] != agreed[1] || n < 0) {
        rc = zs_err_set(err, ZS_ERR_INVALID,
                        "topology: %s must be the same whole number >= 1 on every rank (rank %d "
                        "has '%s')",
                        ZS_RANKS_PER_NODE_ENV, rank,
                        getenv(ZS_RANKS_PER_NODE_ENV) ? getenv(ZS_RANKS_PER_NODE_ENV) : "");
        goto out;
    }
    if (n > 0) {
        if (size % n != 0) {
            rc = zs_err_set(err, ZS_ERR_INVALID,
                            "topology: %s=%d does not divide the %d ranks into whole nodes",
                            ZS_RANKS_PER_NODE_ENV, n, size);
            goto out;
        }
        t->node = rank / n;
        t->nnodes = size / n;
        t->local_rank = rank % n;
        t->local_size = n;
        t->forced = 1;
    } else {
        ZS_TOPO_MPI(MPI_Comm_split_type, world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
        ZS_TOPO_MPI(MPI_Comm_rank, shared, &t->local_rank);
        ZS_TOPO_MPI(MPI_Comm_size, shared, &t->local_size);
        int leader = rank;
        ZS_TOPO_MPI(MPI_Allreduce, MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared);
        leaders = malloc((size_t)size * sizeof *leaders);
        if (!leaders) {
            rc = zs_err_set(err, ZS_ERR_NOMEM, "topology: no memory");
            goto out;
        }
        ZS_TOPO_MPI(MPI_Allgather, &leader, 1, MPI_INT, leaders, 1, MPI_INT, world);
        /* node number = how many distinct leaders are below ours; leaders
         * are the lowest rank of their node, so a rank r is a leader iff
         * leaders[r] == r */
        for (int r = 0; r < size; r++) {
            if (leaders[r] == r && r < leader)
                t->node++;
            if (leaders[r] == r)
                t->nnodes++;
        }
    }
    /* regular: equal nodes of consecutive ranks (qgZ's two hops need it) */
    int reg = t->local_size > 0 && t->node == rank / t->local_size &&
              t->local_rank == rank % t->local_size && size % t->local_size == 0;
    ZS_TOPO_MPI(MPI_Allreduce, &reg, &t->regular, 1, MPI_INT, MPI_MIN, world);
    ZS_TOPO_MPI(MPI_Comm_split, world, t->node, rank, intra);
    ZS_TOPO_MPI(MPI_Comm_set_errhandler, *intra, MPI_ERRORS_RETURN);
    ZS_TOPO_MPI(MPI_Comm_split, world, t->local_rank, t->node, inter);
    ZS_TOPO_MPI(MPI_Comm_set_errhandler, *inter, MPI_ERRORS_RETURN);
out:
    free(leaders);
    if (shared != MPI_COMM_NULL)
        MPI_Comm_free(&shared);
    if (rc) {
        if (*intra != MPI_COMM_NULL)
            MPI_Comm_free(intra);
        if (*inter != MPI_COMM_NULL)
            MPI_Comm_free(inter);
    }
    return rc;
}
