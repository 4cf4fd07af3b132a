/*
 * emu_nccl_rest.c - the rest of nccl.h's API for the emulated NCCL, so a
 * program using any of it links: the cheap ones done (ncclMemAlloc/Free on
 * the emulated runtime; buffer registration as a no-op, which the docs
 * allow: registration is an optimisation), everything else refused loudly
 * at run time with ncclInvalidUsage ("not emulated"), never silently.
 *
 * Does not: AllToAll (ncclSend/ncclRecv are emulated in emu_nccl_p2p.c), Gather/Scatter,
 * communicator shrink / revoke / InitAll / scalable init, user reduction ops, windows, group
 * simulation.
 */
#include <stdio.h>

#include "emu_nccl.h"

#define EXPORT_P(ret, name, params) ret p##name params __attribute__((alias(#name)));

static ncclResult_t refuse(const char *fn)
{
    zs_emu_nccl_set_last("cuda-emu nccl: %s is not emulated", fn);
    fprintf(stderr, "cuda-emu nccl: %s is not emulated\n", fn);
    return ncclInvalidUsage;
}

/* "NCCL malloc and free function ... The actual allocated size might be
 * larger than requested": device memory from the emulated runtime. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return ncclInvalidArgument;
    return cudaMalloc(ptr, size) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}
EXPORT_P(ncclResult_t, ncclMemAlloc, (void **ptr, size_t size))

ncclResult_t ncclMemFree(void *ptr)
{
    return cudaFree(ptr) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}
EXPORT_P(ncclResult_t, ncclMemFree, (void *ptr))

/* Registration only speeds real NCCL up; the emulator copies anyway. The
 * buffer must still be device memory of the communicator's device. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    ncclResult_t rc = zs_emu_nccl_check(comm, "ncclCommRegister");
    if (rc != ncclSuccess)
        return rc;
    if (!handle || zs_emu_dev_ptr(buff, size) != comm->dev) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclCommRegister: %p (%zu bytes) is not device "
                             "memory of the communicator's device",
                             buff, size);
        return ncclInvalidArgument;
    }
    *handle = buff;
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclCommRegister,
         (const ncclComm_t comm, void *buff, size_t size, void **handle))

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    return zs_emu_nccl_check(comm, "ncclCommDeregister");
}
EXPORT_P(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle))

#define REFUSE(name, params)                                                                       \
    ncclResult_t name params                                                                       \
    {                                                                                              \
        return refuse(#name);                                                                      \
    }                                                                                              \
    EXPORT_P(ncclResult_t, name, params)

REFUSE(ncclCommInitAll, (ncclComm_t * comm, int ndev, const int *devlist))
REFUSE(ncclCommShrink, (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                        ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags))
REFUSE(ncclCommRevoke, (ncclComm_t comm, int revokeFlags))
REFUSE(ncclCommInitRankScalable, (ncclComm_t * newcomm, int nranks, int myrank, int nId,
                                  ncclUniqueId *commIds, ncclConfig_t *config))
REFUSE(ncclCommWindowRegister,
       (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags))
REFUSE(ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))
REFUSE(ncclRedOpCreatePreMulSum, (ncclRedOp_t * op, void *scalar, ncclDataType_t datatype,
                                  ncclScalarResidence_t residence, ncclComm_t comm))
REFUSE(ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))
REFUSE(ncclAlltoAll, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                      ncclComm_t comm, cudaStream_t stream))
REFUSE(ncclGather, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                    int root, ncclComm_t comm, cudaStream_t stream))
REFUSE(ncclScatter, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                     int root, ncclComm_t comm, cudaStream_t stream))
REFUSE(ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo))
