/*
 * zs_coll_nccl_q8.c - ZeRO++'s quantized collectives on NCCL: qwZ's pack
 * and unpack, and qgZ's two-hop quantized reduce-scatter, with the CUDA
 * kernels of kernels/cuda/zs_cuda_quant.h and zs_cuda_vec.h on the world
 * communicator's stream (the node's and the cross-node communicators
 * share it, zs_coll_nccl.c).
 *
 * qgZ (zs_coll.h, zs_coll_reduce_scatter_q8) does what the MPI backend's
 * run_rsq8 does on the host, kernel for kernel, so the two give the same
 * bytes:
 *   hop 1 (L ranks per node > 1): the block of rank mm*L + i is packed
 *     into an int8 record for local rank i (records [i][mm]), an
 *     all-to-all within the node (ncclSend/ncclRecv), and the L records
 *     received for each node mm summed in local-rank order in fp32;
 *     L == 1: the node's own blocks cast to fp32 (exact);
 *   hop 2 (N nodes > 1): node mm's partial sum packed for node mm, an
 *     all-to-all across nodes, the N records summed in node order;
 *   the fp32 sum cast into this rank's block of buf.
 * work (zs_coll_rsq8_work_bytes, device memory) = send1 [L][N] records |
 * recv1 [L][N] | acc [N][count] fp32 | send2 [N] | recv2 [N].
 *
 * What it does not do: count bytes (zs_coll.c does), check the topology
 * (zs_coll.c refuses an irregular one), run inside a group.
 */
#include <string.h>

#include "zs_coll_nccl_internal.h"
#include "zs_cuda_quant.h"
#include "zs_cuda_vec.h"
#include "zs_dev_cuda.h"
#include "zs_quant.h"

/* The communicator usable and its device current, or the error. */
static int ready(zs__coll_nccl_t *c, const char *what, zs_err_t *err)
{
    int rc = zs__nccl_refuse(c, what, err);
    return rc ? rc
              : ZS_CUDA_CHECK(err, c->device, "was the device reset?", cudaSetDevice, c->device);
}

/* See zs_coll_nccl_internal.h. */
int zs__nccl_q8_pack(zs_coll_t *zc, void *rec, const void *src, zs_dtype_t dt, size_t n,
                     zs_err_t *err)
{
    zs__coll_nccl_t *c = (zs__coll_nccl_t *)zc;
    int rc = ready(c, "all_gather_q8", err);
    return rc ? rc : zs_cuda_quant_pack(c->cs, rec, src, dt, n, err);
}

/* See zs_coll_nccl_internal.h. */
int zs__nccl_q8_unpack(zs_coll_t *zc, void *dst, zs_dtype_t dt, const void *rec, size_t n,
                       size_t nrec, zs_err_t *err)
{
    zs__coll_nccl_t *c = (zs__coll_nccl_t *)zc;
    int rc = ready(c, "all_gather_q8", err);
    return rc ? rc : zs_cuda_quant_unpack(c->cs, dst, dt, rec, n, nrec, err);
}

/* See zs_coll_nccl_internal.h and the file comment. */
int zs__nccl_reduce_scatter_q8(zs_coll_t *zc, void *buf, size_t count, zs_dtype_t dt, void *work,
                               zs_err_t *err)
{
    zs__coll_nccl_t *c = (zs__coll_nccl_t *)zc;
    int rc = ready(c, "reduce_scatter_q8", err);
    if (rc)
        return rc;
    if (!zc->intra || !zc->inter)
        return zs_err_set(err, ZS_ERR_INVALID, "reduce_scatter_q8: not a world communicator");
    const zs_coll_topo_t *t = &zc->topo;
    size_t L = (size_t)t->local_size, N = (size_t)t->nnodes, n = count;
    size_t es = zs_dtype_size(dt), rb = zs_quant_record_bytes(n), W = (size_t)zc->size;
    char *b = buf, *send1 = work, *recv1 = send1 + W * rb;
    float *acc = (float *)(recv1 + W * rb);
    char *send2 = (char *)(acc + N * n), *recv2 = send2 + N * rb;
    void *cs = c->cs;
    if (L > 1) {
        for (size_t i = 0; !rc && i < L; i++)
            for (size_t mm = 0; !rc && mm < N; mm++)
                rc = zs_cuda_quant_pack(cs, send1 + (i * N + mm) * rb, b + (mm * L + i) * n * es,
                                        dt, n, err);
        if (!rc)
            rc = zs__nccl_all_to_all((zs__coll_nccl_t *)zc->intra, send1, recv1, N * rb, err);
        if (!rc)
            rc = zs_cuda_quant_unpack_sum(cs, acc, recv1, n, L, N, err);
    } else { /* one rank per node: its node's blocks are this rank's, exact */
        rc = zs_cuda_cast(cs, acc, ZS_DTYPE_F32, b, dt, N * n, err);
    }
    if (!rc && N > 1) { /* acc is packed before it is overwritten: stream order */
        for (size_t mm = 0; !rc && mm < N; mm++)
            rc = zs_cuda_quant_pack(cs, send2 + mm * rb, acc + mm * n, ZS_DTYPE_F32, n, err);
        if (!rc)
            rc = zs__nccl_all_to_all((zs__coll_nccl_t *)zc->inter, send2, recv2, rb, err);
        if (!rc)
            rc = zs_cuda_quant_unpack_sum(cs, acc, recv2, n, N, 1, err);
    }
    if (!rc)
        rc = zs_cuda_cast(cs, b + (size_t)zc->rank * n * es, dt, acc, ZS_DTYPE_F32, n, err);
    return rc;
}
