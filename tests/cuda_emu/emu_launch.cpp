/*
 * emu_launch.cpp - kernel launches of the CUDA emulator (tests/cuda_emu/):
 * the schedule setting, launch validation (cudaFuncSetAttribute's dynamic
 * shared memory opt-in), the enqueue of a grid on its stream, the order of
 * blocks, dynamic shared memory.
 *
 * Does not: run a block's threads (emu_fiber.cpp), run blocks of one launch
 * concurrently, cooperative launches, cudaFuncSetAttribute beyond the
 * dynamic shared memory limit.
 */
#include "emu_fiber.h"

namespace zs_emu
{

namespace
{
pthread_mutex_t g_attr_lock = PTHREAD_MUTEX_INITIALIZER;
/* cudaFuncSetAttribute's dynamic shared memory limits, per kernel. */
std::vector<std::pair<const void *, int>> g_attrs;

/* 48 KiB unless raised by cudaFuncSetAttribute (Programming Guide,
 * Shared Memory: allocations above 48 KB per block need an explicit
 * opt-in). */
size_t max_dyn_shared(const void *func)
{
    size_t r = 48u << 10;
    pthread_mutex_lock(&g_attr_lock);
    for (auto &a : g_attrs)
        if (a.first == func)
            r = (size_t)a.second;
    pthread_mutex_unlock(&g_attr_lock);
    return r;
}
} // namespace

cudaError_t run_grid(void *p)
{
    launch *L = (launch *)p;
    if (!t_s)
        t_s = new sched();
    sched *s = t_s;
    s->L = L;
    zs_emu_bdim = L->block;
    zs_emu_gdim = L->grid;
#if ZS_ASAN
    /* Exactly the launch's bytes, so an overrun of dynamic shared memory
     * is a heap-buffer-overflow report. */
    free(s->dyn);
    s->dyn = (unsigned char *)malloc(L->shmem ? L->shmem : 1);
#else
    /* The buffer ends (16-byte aligned) at a guard page, so an overrun
     * faults and the SIGSEGV handler names it. */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), want = (L->shmem + pg - 1) / pg * pg + pg;
    if (want > s->dyn_map_len) {
        if (s->dyn_map)
            munmap(s->dyn_map, s->dyn_map_len);
        s->dyn_map = (unsigned char *)mmap(nullptr, want, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s->dyn_map == MAP_FAILED)
            zs_emu_fatal("kernel launch", "cannot map dynamic shared memory");
        s->dyn_map_len = want;
        mprotect(s->dyn_map + want - pg, pg, PROT_NONE);
    }
    s->dyn = s->dyn_map + s->dyn_map_len - pg - (L->shmem + 15) / 16 * 16;
#endif
    uint64_t rng = L->seed;
    uint64_t nb = (uint64_t)L->grid.x * L->grid.y * L->grid.z;
    std::vector<unsigned> ord;
    /* Block order: the schedule's, as a permutation of all blocks when the
     * grid is small enough to hold one; large random grids shuffle within
     * windows of 65536 blocks. The Programming Guide (Thread Hierarchy):
     * blocks "must be able to execute in any order". */
    std::vector<unsigned> bord;
    for (uint64_t b0 = 0; b0 < nb; b0 += 65536) {
        unsigned wn = (unsigned)(nb - b0 < 65536 ? nb - b0 : 65536);
        order(bord, wn, &rng);
        for (unsigned k = 0; k < wn; k++) {
            uint64_t b = g_schedule == 0   ? b0 + k
                         : g_schedule == 1 ? nb - 1 - (b0 + k)
                                           : b0 + bord[k];
            uint3 bid;
            bid.x = (unsigned)(b % L->grid.x);
            bid.y = (unsigned)(b / L->grid.x % L->grid.y);
            bid.z = (unsigned)(b / ((uint64_t)L->grid.x * L->grid.y));
            run_block(L, bid, &rng, ord);
        }
    }
    s->L = nullptr;
    return cudaSuccess;
}

void free_launch(void *p)
{
    launch *L = (launch *)p;
    L->free_closure(L->closure);
    delete L;
}

} // namespace zs_emu

using namespace zs_emu;

extern "C" {

void zs_emu_kernel_init(void)
{
    const char *s = getenv("ZS_EMU_SCHEDULE");
    if (s && *s) {
        if (!strcmp(s, "forward"))
            g_schedule = 0;
        else if (!strcmp(s, "reverse"))
            g_schedule = 1;
        else if (!strncmp(s, "random", 6) && (s[6] == 0 || s[6] == ':')) {
            g_schedule = 2;
            if (s[6] == ':')
                g_seed = strtoull(s + 7, nullptr, 10);
        } else if (!strncmp(s, "eager", 5) && (s[5] == 0 || s[5] == ':')) {
            /* emu_fiber.cpp, eager_round: warps run ahead of each other. */
            g_schedule = 3;
            if (s[5] == ':') {
                g_eager_seeded = 1;
                g_seed = strtoull(s + 6, nullptr, 10);
            }
        } else
            zs_emu_fatal("environment",
                         "ZS_EMU_SCHEDULE=%s: want forward, reverse, random[:SEED] or "
                         "eager[:SEED]",
                         s);
    }
    const char *k = getenv("ZS_EMU_STACK_KB");
    g_stack = (size_t)(k && *k ? atol(k) : (ZS_ASAN ? 512 : 256)) << 10;
    if (g_stack < (64u << 10))
        g_stack = 64u << 10;
}

/* CUDA Runtime API, 6.8 Execution Control, cudaFuncSetAttribute:
 * cudaFuncAttributeMaxDynamicSharedMemorySize may raise a kernel's dynamic
 * shared memory up to cudaDevAttrMaxSharedMemoryPerBlockOptin (227 KiB on
 * sm_90; the emulator does not know a kernel's static shared memory, so it
 * does not subtract it). The carveout is a hint: accepted and ignored.
 * Other attributes are not emulated: cudaErrorInvalidValue. */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    zs_emu_api_enter("cudaFuncSetAttribute");
    if (!func)
        return zs_emu_ret(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return value >= -1 && value <= 100 ? cudaSuccess : zs_emu_ret(cudaErrorInvalidValue);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > ZS_EMU_SMEM_OPTIN)
        return zs_emu_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_attr_lock);
    for (auto &a : g_attrs)
        if (a.first == func) {
            a.second = value;
            pthread_mutex_unlock(&g_attr_lock);
            return cudaSuccess;
        }
    g_attrs.emplace_back(func, value);
    pthread_mutex_unlock(&g_attr_lock);
    return cudaSuccess;
}

void *zs_emu_dyn_shared(void)
{
    return t_s ? t_s->dyn : nullptr;
}

cudaError_t zs_emu_launch(const void *func, const char *name, const char *file, int line, dim3 grid,
                          dim3 block, size_t shmem, cudaStream_t s, void (*run)(void *),
                          void *closure, void (*free_closure)(void *))
{
    zs_emu_api_enter("kernel launch");
    zs_emu_hostfn_wait_idle(); /* as on an H100: see emu_stream.c */
    cudaError_t e = cudaSuccess;
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || threads > 1024 ||
        block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x > 0x7fffffffu ||
        grid.y > 65535 || grid.z > 65535 || shmem > max_dyn_shared(func))
        e = cudaErrorInvalidConfiguration;
    zs_emu_stream *st = nullptr;
    if (e == cudaSuccess) {
        st = zs_emu_stream_get(s);
        /* "A kernel launch will fail if it is issued to a stream that is
         * not associated to the current device" (CUDA C++ Programming
         * Guide, Multi-Device System, Stream and Event Behavior). */
        if (!st || zs_emu_stream_device(st) != zs_emu_current_device())
            e = cudaErrorInvalidResourceHandle;
    }
    if (e == cudaSuccess)
        e = zs_emu_sticky(zs_emu_stream_device(st));
    if (e != cudaSuccess) {
        free_closure(closure);
        return zs_emu_ret(e);
    }
    launch *L = new launch();
    L->name = name;
    L->file = file;
    L->line = line;
    L->grid = {grid.x, grid.y, grid.z};
    L->block = {block.x, block.y, block.z};
    L->shmem = shmem;
    L->run = run;
    L->closure = closure;
    L->free_closure = free_closure;
    L->seed = g_seed * 0x9e3779b97f4a7c15ull + __atomic_fetch_add(&g_launches, 1, __ATOMIC_RELAXED);
    if (!zs_emu_stream_push(st, ZS_EMU_WORK_DEVICE, -1, run_grid, L, free_launch))
        return zs_emu_ret(zs_emu_sticky(zs_emu_stream_device(st)));
    return cudaSuccess;
}

} // extern "C"
