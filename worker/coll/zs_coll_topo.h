/*
 * zs_coll_topo.h - the job's topology over MPI, for both backends
 * (zs_coll_mpi.c, zs_coll_nccl.c): which node each rank is on, and the
 * MPI communicators of a node's ranks and of one local rank across nodes.
 * Internal to worker/coll (it includes mpi.h).
 *
 * What it does not do: the NCCL communicators (the NCCL backend builds them
 * from these MPI ones), counting bytes (zs_coll.c).
 */
#ifndef ZS_COLL_TOPO_H
#define ZS_COLL_TOPO_H

#include <mpi.h>

#include "zs_coll.h"

/* The environment variable that overrides MPI's shared-memory view. */
#define ZS_RANKS_PER_NODE_ENV "ZS_RANKS_PER_NODE"

/* Collective over `world` (MPI_ERRORS_RETURN set on it): fill *t and split
 * world into *intra (the node's ranks, ordered by world rank) and *inter
 * (the ranks of this local rank on every node, ordered by node), both with
 * MPI_ERRORS_RETURN, the caller's to free. Nodes: MPI_COMM_TYPE_SHARED's,
 * numbered in the order of their lowest world rank; with
 * ZS_RANKS_PER_NODE=N, ranks r with the same r / N. Refused (every rank
 * returns the error) when N is not a whole number >= 1, does not divide
 * the world size, or differs between ranks. */
int zs__coll_topo_build(MPI_Comm world, zs_coll_topo_t *t, MPI_Comm *intra, MPI_Comm *inter,
                        zs_err_t *err);

#endif
