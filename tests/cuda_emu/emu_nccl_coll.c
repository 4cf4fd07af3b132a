/*
 * emu_nccl_coll.c - the emulated NCCL's collective calls: argument and
 * pointer checks at call time, then the op is recorded in the open group
 * or launched (emu_nccl_group.c).
 *
 * Does: ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast,
 * ncclBcast, ncclReduce. Checks (user guide sections cited at each):
 * in-place pointer rules, other overlaps, device memory of the
 * communicator's device large enough, supported type, op and root. Does
 * not: move data (emu_nccl_exec.c), compare calls across ranks (done there,
 * before any data moves), point-to-point, ncclAlltoAll, user ops.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_nccl.h"

#define EXPORT_P(ret, name, params) ret p##name params __attribute__((alias(#name)));

/* See emu_nccl.h. */
ncclResult_t zs_emu_nccl_refuse(struct ncclComm *c, ncclResult_t rc, const char *fmt, ...)
{
    char m[ZS_EMU_NCCL_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", m);
    /* Hostile: a refused call also fails the communicator (its peers would
     * otherwise wait for a collective this rank never launches). */
    zs_emu_nccl_fail(c, rc, m);
    zs_emu_nccl_group_error(rc);
    return rc;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

static ncclResult_t check_buf(struct ncclComm *c, const char *fn, const char *which, const void *p,
                              size_t bytes)
{
    if (!bytes)
        return ncclSuccess;
    int dev = zs_emu_dev_ptr(p, bytes);
    if (dev == c->dev)
        return ncclSuccess;
    if (dev < 0)
        return zs_emu_nccl_refuse(c, ncclInvalidArgument,
                                  "cuda-emu nccl: %s: rank %d: %s %p (%zu bytes) is not inside one "
                                  "device allocation",
                                  fn, c->rank, which, p, bytes);
    return zs_emu_nccl_refuse(c, ncclInvalidArgument,
                              "cuda-emu nccl: %s: rank %d: %s %p is memory of device %d, the "
                              "communicator's device is %d",
                              fn, c->rank, which, p, dev, c->dev);
}

static ncclResult_t coll(int kind, const char *fn, const void *send, void *recv, size_t count,
                         ncclDataType_t dtype, ncclRedOp_t redop, int root, ncclComm_t c,
                         cudaStream_t stream)
{
    ncclResult_t rc = zs_emu_nccl_check(c, fn);
    if (rc != ncclSuccess) {
        zs_emu_nccl_group_error(rc);
        return rc;
    }
    int n = c->nranks, r = c->rank;
    size_t esz = zs_emu_nccl_dtype_size(dtype);
    if (!esz)
        return zs_emu_nccl_refuse(c, ncclInvalidArgument,
                                  "cuda-emu nccl: %s: rank %d: data type %d not "
                                  "supported by the emulator",
                                  fn, r, (int)dtype);
    int reduces = kind == ZS_EMU_NCCL_ALLREDUCE || kind == ZS_EMU_NCCL_REDUCESCATTER ||
                  kind == ZS_EMU_NCCL_REDUCE;
    if (reduces && !zs_emu_nccl_op_ok(redop))
        return zs_emu_nccl_refuse(
            c, ncclInvalidArgument,
            "cuda-emu nccl: %s: rank %d: reduction op %d not supported by the "
            "emulator",
            fn, r, (int)redop);
    int rooted = kind == ZS_EMU_NCCL_BROADCAST || kind == ZS_EMU_NCCL_REDUCE;
    if (rooted && (root < 0 || root >= n))
        return zs_emu_nccl_refuse(c, ncclInvalidArgument,
                                  "cuda-emu nccl: %s: rank %d: root %d of %d ranks", fn, r, root,
                                  n);
    if (count > SIZE_MAX / esz / (size_t)n)
        return zs_emu_nccl_refuse(c, ncclInvalidArgument, "cuda-emu nccl: %s: count %zu too large",
                                  fn, count);
    size_t one = count * esz, all = one * (size_t)n;
    size_t sbytes = one, rbytes = one;
    int use_send = 1, use_recv = 1;
    if (kind == ZS_EMU_NCCL_REDUCESCATTER)
        sbytes = all; /* sendbuff holds nranks * recvcount (api/colls) */
    if (kind == ZS_EMU_NCCL_ALLGATHER)
        rbytes = all; /* recvbuff holds nranks * sendcount */
    if (kind == ZS_EMU_NCCL_BROADCAST && r != root)
        use_send = 0; /* "sendbuff is only used on rank root" */
    if (kind == ZS_EMU_NCCL_REDUCE && r != root)
        use_recv = 0; /* "recvbuff is only used on rank root" */
    if (use_send && (rc = check_buf(c, fn, "sendbuff", send, sbytes)) != ncclSuccess)
        return rc;
    if (use_recv && (rc = check_buf(c, fn, "recvbuff", recv, rbytes)) != ncclSuccess)
        return rc;
    /* "In-place Operations": AllReduce, Broadcast, Reduce are in place when
     * sendbuff == recvbuff; ReduceScatter when recvbuff == sendbuff +
     * rank * recvcount; AllGather when sendbuff == recvbuff + rank *
     * sendcount. Nothing else is documented for overlapping buffers, so the
     * hostile reading refuses any other overlap. */
    if (use_send && use_recv && overlap(send, sbytes, recv, rbytes)) {
        const unsigned char *s = send, *d = recv;
        if (kind == ZS_EMU_NCCL_REDUCESCATTER) {
            if (d != s + (size_t)r * one)
                return zs_emu_nccl_refuse(
                    c, ncclInvalidArgument,
                    "cuda-emu nccl: %s: rank %d: recvbuff %p overlaps sendbuff %p "
                    "but is not the in-place position sendbuff + rank * recvcount "
                    "= %p (In-place Operations)",
                    fn, r, recv, send, (const void *)(s + (size_t)r * one));
        } else if (kind == ZS_EMU_NCCL_ALLGATHER) {
            if (s != d + (size_t)r * one)
                return zs_emu_nccl_refuse(
                    c, ncclInvalidArgument,
                    "cuda-emu nccl: %s: rank %d: sendbuff %p overlaps recvbuff %p "
                    "but is not the in-place position recvbuff + rank * sendcount "
                    "= %p (In-place Operations)",
                    fn, r, send, recv, (const void *)(d + (size_t)r * one));
        } else if (s != d) {
            return zs_emu_nccl_refuse(
                c, ncclInvalidArgument,
                "cuda-emu nccl: %s: rank %d: sendbuff %p and recvbuff %p overlap "
                "without being equal (In-place Operations)",
                fn, r, send, recv);
        }
    }
    zs_emu_nccl_op op = {.comm = c,
                         .d = {.kind = kind,
                               .dtype = dtype,
                               .op = reduces ? (int)redop : -1,
                               .root = rooted ? root : -1,
                               .count = count},
                         .send = use_send ? send : NULL,
                         .recv = use_recv ? recv : NULL,
                         .sbytes = use_send ? sbytes : 0,
                         .rbytes = use_recv ? rbytes : 0,
                         .stream = stream};
    if (zs_emu_nccl_group_depth() > 0) {
        /* "Group Calls": inside a group the call only records; the op is
         * launched by the outermost ncclGroupEnd. */
        zs_emu_nccl_group_add(&op);
        return ncclSuccess;
    }
    return zs_emu_nccl_launch_group(&op, 1); /* an implicit group of one */
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_ALLREDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0,
                comm, stream);
}
EXPORT_P(ncclResult_t, ncclAllReduce,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_REDUCESCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount,
                datatype, op, 0, comm, stream);
}
EXPORT_P(ncclResult_t, ncclReduceScatter,
         (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_ALLGATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype,
                ncclSum, 0, comm, stream);
}
EXPORT_P(ncclResult_t, ncclAllGather,
         (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
          ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype,
                ncclSum, root, comm, stream);
}
EXPORT_P(ncclResult_t, ncclBroadcast,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
          ncclComm_t comm, cudaStream_t stream))

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_BROADCAST, "ncclBcast", buff, buff, count, datatype, ncclSum, root,
                comm, stream);
}
EXPORT_P(ncclResult_t, ncclBcast,
         (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
          cudaStream_t stream))

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll(ZS_EMU_NCCL_REDUCE, "ncclReduce", sendbuff, recvbuff, count, datatype, op, root,
                comm, stream);
}
EXPORT_P(ncclResult_t, ncclReduce,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))
