/*
 * emu_runtime.c - the CUDA emulator's process state: initialisation from
 * the environment, devices, the current device, the thread's last error,
 * sticky context errors, the API entry guard and zs_emu_fatal.
 *
 * Does not do streams (emu_stream.c), memory (emu_mem.c) or kernels
 * (emu_launch.cpp, emu_fiber.cpp). Names and strings of errors are in emu_errors.c.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_core.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ndev;                     /* visible devices */
static int g_phys[ZS_EMU_MAX_DEVICES]; /* ordinal -> emulated physical index */
static size_t g_mem_limit;             /* bytes per device */
static pthread_mutex_t g_sticky_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaError_t g_sticky[ZS_EMU_MAX_DEVICES];

static _Thread_local int t_role;
static _Thread_local int t_device;
static _Thread_local cudaError_t t_last_error;

void zs_emu_fatal(const char *where, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda-emu: %s: %s\n", where, msg);
    fflush(stderr);
    abort();
}

static long env_long(const char *name, long def, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi)
        zs_emu_fatal("environment", "%s=%s: want an integer in [%ld, %ld]", name, v, lo, hi);
    return x;
}

static void init_once(void)
{
    int phys = (int)env_long("ZS_EMU_DEVICES", 1, 0, ZS_EMU_MAX_DEVICES);
    g_mem_limit = (size_t)env_long("ZS_EMU_MEM_MB", 4096, 1, 1L << 24) << 20;
    /* CUDA_VISIBLE_DEVICES: a comma-separated list of indices; as with the
     * real driver, the list stops at the first invalid entry (CUDA C++
     * Programming Guide, CUDA Environment Variables, CUDA_VISIBLE_DEVICES).
     * UUID and MIG forms are not emulated: an entry that is not an index
     * is invalid. */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis) {
        for (int i = 0; i < phys; i++)
            g_phys[i] = i;
        g_ndev = phys;
    } else {
        const char *p = vis;
        g_ndev = 0;
        while (*p && g_ndev < ZS_EMU_MAX_DEVICES) {
            char *end;
            long x = strtol(p, &end, 10);
            if (end == p || x < 0 || x >= phys)
                break;
            int dup = 0;
            for (int i = 0; i < g_ndev; i++)
                dup |= g_phys[i] == x;
            if (dup)
                break;
            g_phys[g_ndev++] = (int)x;
            if (*end != ',')
                break;
            p = end + 1;
        }
    }
    zs_emu_mem_init();
    zs_emu_kernel_init();
}

int zs_emu_role(void)
{
    return t_role;
}

void zs_emu_set_role(int role)
{
    t_role = role;
}

void zs_emu_api_enter(const char *api)
{
    if (t_role == ZS_EMU_ROLE_HOSTFN)
        /* CUDA Runtime API, 6.5 Stream Management, cudaLaunchHostFunc: "The
         * host function must not make any CUDA API calls." It "may result
         * in cudaErrorNotPermitted, but this is not required": the hostile
         * reading is a hang or worse, so the emulator stops here. */
        zs_emu_fatal(api, "CUDA runtime call from inside a host function (cudaLaunchHostFunc); "
                          "host functions must not make any CUDA API calls");
    if (t_role == ZS_EMU_ROLE_EXECUTOR)
        /* emu_internal.h: library work run through zs_emu_enqueue must not
         * call the CUDA runtime (as with host functions). */
        zs_emu_fatal(api, "CUDA runtime call from inside stream work (zs_emu_enqueue)");
    pthread_once(&g_once, init_once);
}

int zs_emu_device_count(void)
{
    pthread_once(&g_once, init_once);
    return g_ndev;
}

size_t zs_emu_mem_limit(void)
{
    return g_mem_limit;
}

int zs_emu_current_device(void)
{
    return t_device;
}

cudaError_t zs_emu_sticky(int dev)
{
    if (dev < 0 || dev >= ZS_EMU_MAX_DEVICES)
        return cudaSuccess;
    pthread_mutex_lock(&g_sticky_lock);
    cudaError_t e = g_sticky[dev];
    pthread_mutex_unlock(&g_sticky_lock);
    return e;
}

void zs_emu_set_sticky(int dev, cudaError_t err)
{
    if (dev < 0 || dev >= ZS_EMU_MAX_DEVICES || err == cudaSuccess)
        return;
    pthread_mutex_lock(&g_sticky_lock);
    if (g_sticky[dev] == cudaSuccess)
        g_sticky[dev] = err;
    pthread_mutex_unlock(&g_sticky_lock);
}

cudaError_t zs_emu_ret(cudaError_t err)
{
    if (err != cudaSuccess)
        t_last_error = err;
    return err;
}

/* CUDA Runtime API, 6.4 Error Handling, cudaGetLastError: returns the last
 * error of any runtime call in this host thread and resets it to
 * cudaSuccess. A sticky error (CUDA C++ Programming Guide, Error Checking:
 * errors that leave the context corrupted) cannot be reset: it is returned
 * every time. */
cudaError_t cudaGetLastError(void)
{
    zs_emu_api_enter("cudaGetLastError");
    cudaError_t st = zs_emu_sticky(t_device);
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return st != cudaSuccess ? st : e;
}

/* CUDA Runtime API, 6.4 Error Handling, cudaPeekAtLastError: as
 * cudaGetLastError without the reset. */
cudaError_t cudaPeekAtLastError(void)
{
    zs_emu_api_enter("cudaPeekAtLastError");
    cudaError_t st = zs_emu_sticky(t_device);
    return st != cudaSuccess ? st : t_last_error;
}

/* The common prologue of calls that touch the current device's context:
 * a sticky error is returned by every later call (CUDA Runtime API, 6.3
 * Error Handling; the Programming Guide's Error Checking section). */
static cudaError_t ctx_check(void)
{
    return zs_emu_ret(zs_emu_sticky(t_device));
}

/* CUDA Runtime API, 6.1 Device Management, cudaGetDeviceCount. No device
 * visible is cudaErrorNoDevice, as the real runtime reports it. */
cudaError_t cudaGetDeviceCount(int *count)
{
    zs_emu_api_enter("cudaGetDeviceCount");
    if (!count)
        return zs_emu_ret(cudaErrorInvalidValue);
    *count = g_ndev;
    return g_ndev ? cudaSuccess : zs_emu_ret(cudaErrorNoDevice);
}

/* CUDA Runtime API, 6.1 Device Management, cudaSetDevice: per host
 * thread. */
cudaError_t cudaSetDevice(int device)
{
    zs_emu_api_enter("cudaSetDevice");
    if (device < 0 || device >= g_ndev)
        return zs_emu_ret(cudaErrorInvalidDevice);
    t_device = device;
    return ctx_check();
}

cudaError_t cudaGetDevice(int *device)
{
    zs_emu_api_enter("cudaGetDevice");
    if (!device)
        return zs_emu_ret(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

/* CUDA Runtime API, 6.1 Device Management, cudaGetDeviceProperties: the
 * header maps the name to cudaGetDeviceProperties_v2, which is what we
 * define here. Values: an sm_90-like device with the launch limits of the
 * Programming Guide's Compute Capabilities table (1024 threads per block,
 * block z <= 64, grid y/z <= 65535, 48 KiB static shared memory). */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    zs_emu_api_enter("cudaGetDeviceProperties");
    if (!prop)
        return zs_emu_ret(cudaErrorInvalidValue);
    if (device < 0 || device >= g_ndev)
        return zs_emu_ret(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "zeroshard CUDA emulator");
    int phys = g_phys[device];
    for (int i = 0; i < 16; i++)
        prop->uuid.bytes[i] = (char)(0x5a ^ (i * 17) ^ phys);
    prop->totalGlobalMem = g_mem_limit;
    prop->sharedMemPerBlock = 48 << 10;
    prop->sharedMemPerBlockOptin = ZS_EMU_SMEM_OPTIN; /* via cudaFuncSetAttribute */
    prop->sharedMemPerMultiprocessor = 228 << 10;
    prop->regsPerBlock = 65536;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = (size_t)1 << 31;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 64 << 10;
    prop->major = 9;
    prop->minor = 0;
    prop->textureAlignment = 512;
    prop->multiProcessorCount = 4;
    prop->canMapHostMemory = 1;
    prop->concurrentKernels = 1;
    prop->pciBusID = 0x10 + phys;
    prop->pciDeviceID = 0;
    prop->pciDomainID = 0;
    prop->asyncEngineCount = 2;
    prop->unifiedAddressing = 1;
    /* cudaHostRegister (emu_mem.c): supported, the host pointer is the
     * device pointer, cudaHostRegisterReadOnly is not supported, and
     * pageable memory is not accessed through the host's page tables
     * (pageableMemoryAccessUsesHostPageTables stays 0). */
    prop->hostRegisterSupported = 1;
    prop->canUseHostPointerForRegisteredMem = 1;
    prop->hostRegisterReadOnlySupported = 0;
    prop->memoryBusWidth = 5120;
    prop->l2CacheSize = 50 << 20;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->streamPrioritiesSupported = 1;
    prop->memoryPoolsSupported = 1;
    prop->hostNumaId = -1;
    prop->deviceNumaId = -1;
    return cudaSuccess;
}

/* CUDA Runtime API, 6.1 Device Management, cudaDeviceGetStreamPriorityRange:
 * lower numbers are higher priorities; [-5, 0] as on sm_90. Priorities are
 * recorded but do not change the emulator's scheduling. */
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    zs_emu_api_enter("cudaDeviceGetStreamPriorityRange");
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return cudaSuccess;
}

/* CUDA Runtime API, 6.1 Device Management, cudaDeviceGetPCIBusId:
 * "[domain]:[bus]:[device].[function]". The bus follows the emulated
 * physical index, so the same physical device has the same id in every
 * process whatever CUDA_VISIBLE_DEVICES says. */
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    zs_emu_api_enter("cudaDeviceGetPCIBusId");
    if (!pciBusId || len <= 0)
        return zs_emu_ret(cudaErrorInvalidValue);
    if (device < 0 || device >= g_ndev)
        return zs_emu_ret(cudaErrorInvalidDevice);
    snprintf(pciBusId, (size_t)len, "00000000:%02X:00.0", 0x10 + g_phys[device]);
    return cudaSuccess;
}

/* CUDA Runtime API, 6.1 Device Management, cudaDeviceSynchronize: blocks
 * until the current device has completed all preceding requested tasks,
 * and returns an error if one of them failed. */
cudaError_t cudaDeviceSynchronize(void)
{
    zs_emu_api_enter("cudaDeviceSynchronize");
    zs_emu_device_wait(t_device);
    return ctx_check();
}

cudaError_t cudaDeviceReset(void)
{
    zs_emu_api_enter("cudaDeviceReset");
    /* Not emulated beyond a synchronize: resetting would have to invalidate
     * every handle, and our code does not call it. */
    zs_emu_device_wait(t_device);
    return cudaSuccess;
}
