/*
 * zs_train_device.c - which device each zs-train rank trains on (--device
 * auto|cpu|cuda), agreed by all ranks, and the CUDA memory report printed
 * after the memory table. Does not create the device or the communicator
 * (zs_train_main.c does, from the pick).
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_train_device.h"
#if defined(ZS_WITH_CUDA) && defined(ZS_WITH_NCCL)
#include "zs_dev_cuda.h"
#define ZS_TRAIN_CUDA 1 /* --device cuda can work in this build */
#endif

/* Can this rank use a GPU of its own? 1 with *ordinal (its node-local rank,
 * or 0 when it sees exactly one GPU: CUDA_VISIBLE_DEVICES per rank), else 0
 * with `why`. Two ranks that see the same single GPU pass here; the NCCL
 * communicator refuses them (zs_coll_nccl_create compares PCI bus ids). */
static int gpu_usable(int lrank, int lsize, int *ordinal, char *why, size_t n)
{
#ifdef ZS_TRAIN_CUDA
    char r[200];
    int count = zs_dev_cuda_available(r, sizeof r);
    if (count == 0) {
        snprintf(why, n, "%s", r);
        return 0;
    }
    if (count >= lsize || count == 1) {
        *ordinal = count >= lsize ? lrank : 0;
        return 1;
    }
    snprintf(why, n, "%d ranks on this node but %d GPUs visible (one GPU per rank)", lsize, count);
    return 0;
#else
    (void)lrank, (void)lsize, (void)ordinal;
#ifdef ZS_WITH_CUDA
    snprintf(why, n, "zs-train was built without NCCL (found no nccl.h/libnccl at configure)");
#else
    snprintf(why, n, "zs-train was built without CUDA (nvcc not found at configure)");
#endif
    return 0;
#endif
}

int zs__train_pick_device(const char *device, int rank, zs__train_pick_t *p, zs_err_t *err)
{
    memset(p, 0, sizeof *p);
    if (!strcmp(device, "cpu"))
        return ZS_OK;
    MPI_Comm local;
    int lrank = 0, lsize = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &lrank);
    MPI_Comm_size(local, &lsize);
    MPI_Comm_free(&local);
    char why[200] = "";
    int ok = gpu_usable(lrank, lsize, &p->ordinal, why, sizeof why);
    int mine = ok ? INT_MAX : rank, first = INT_MAX;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == INT_MAX) {
        p->cuda = 1;
        return ZS_OK;
    }
    MPI_Bcast(why, (int)sizeof why, MPI_CHAR, first, MPI_COMM_WORLD);
    char who[32] = "";
    if (first != 0)
        snprintf(who, sizeof who, "rank %d: ", first);
    if (!strcmp(device, "cuda"))
        return zs_err_set(err, ZS_ERR_UNAVAILABLE,
                          "--device cuda: %s%s (hint: --device cpu, or auto, trains on the CPU)",
                          who, why);
    snprintf(p->note, sizeof p->note, " (--device auto: %s%s)", who, why);
    return ZS_OK;
}

#ifdef ZS_TRAIN_CUDA
void zs__train_print_gpu_mem(zs_dev_t *dev, int rank, int W)
{
    size_t fr = 0, tot = 0;
    zs_err_t err;
    zs_dev_mem_t m;
    zs_dev_mem_get(dev, &m);
    double mine[4] = {-1, -1, (double)m.held[ZS_SPACE_DEVICE],
                      (double)m.held_peak[ZS_SPACE_DEVICE]};
    if (zs_dev_cuda_mem_info(dev, &fr, &tot, &err) == ZS_OK) {
        mine[0] = (double)(tot - fr);
        mine[1] = (double)tot;
    } else {
        fprintf(stderr, "zs-train: rank %d: %s\n", rank, err.msg);
    }
    double *all = rank == 0 ? malloc((size_t)W * sizeof mine) : NULL;
    MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank != 0 || !all)
        return;
    const double MiB = 1048576.0;
    printf("device memory (cudaMemGetInfo: everything on the GPU; allocator: zeroshard's device "
           "blocks, live + cached):\n");
    for (int r = 0; r < W; r++) {
        const double *a = all + 4 * r;
        if (a[1] < 0)
            printf("  rank %d: cudaMemGetInfo failed; allocator holds %.1f MiB (peak %.1f)\n", r,
                   a[2] / MiB, a[3] / MiB);
        else
            printf("  rank %d: used %.1f MiB of %.1f MiB; allocator holds %.1f MiB (peak %.1f)\n",
                   r, a[0] / MiB, a[1] / MiB, a[2] / MiB, a[3] / MiB);
    }
    free(all);
}
#endif
