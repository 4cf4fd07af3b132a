/*
 * emu_fiber.h - private to emu_fiber.cpp and emu_launch.cpp: the kernel
 * side's types (launch, fiber, per-executor scheduler state) and the few
 * functions and settings the two files share. Not for other files.
 */
#ifndef ZS_EMU_FIBER_H
#define ZS_EMU_FIBER_H

#include <cuda_runtime_api.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include "emu_core.h"

#if !defined(__x86_64__)
#error "emu_fiber.h: the fiber switch is written for x86-64"
#endif

#if ZS_EMU_PROTECT == 0
#include <sanitizer/asan_interface.h>
#define ZS_ASAN 1
#else
#define ZS_ASAN 0
#endif

/* The kernel-side interface; emu_shim.h declares the same. */
struct zs_emu_tview {
    uint3 tid;
    unsigned lane;
};
#include "emu_kernel_api.h"

/* The built-in variables of the running fiber (emu_shim.h's threadIdx,
 * blockIdx, blockDim, gridDim), defined in emu_fiber.cpp. */
extern __thread zs_emu_tview *zs_emu_tv;
extern __thread uint3 zs_emu_bid, zs_emu_bdim, zs_emu_gdim;

namespace zs_emu
{

enum { F_RUN, F_BAR, F_WARP, F_DONE };
static const char *const warp_op_name[] = {"__syncwarp",       "__shfl_sync",     "__shfl_up_sync",
                                           "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync"};
/* Same values as emu_shim.h's ZS_EMU_W_* and ZS_EMU_BAR_*. */
enum { W_SYNC, W_IDX, W_UP, W_DOWN, W_XOR, W_BALLOT };
enum { ZS_BAR_PLAIN, ZS_BAR_COUNT, ZS_BAR_AND, ZS_BAR_OR };
static const char *const bar_name[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                       "__syncthreads_or"};

struct launch {
    const char *name, *file;
    int line;
    uint3 grid, block;
    size_t shmem;
    void (*run)(void *);
    void *closure;
    void (*free_closure)(void *);
    uint64_t seed;
};

struct fiber {
    zs_emu_tview tv;
    unsigned idx;
    void *sp;
    char *map;
    size_t map_len;
    int state;
    const char *file;
    int line;
    int op;        /* barrier kind or warp op */
    unsigned mask; /* warp op */
    uint64_t val, result;
    int arg, width;
    void *asan_fake;
};

/* Per executor thread. */
struct sched {
    void *sp; /* the scheduler's saved context */
    std::vector<fiber *> pool;
    const launch *L;
    unsigned nthreads;
    unsigned char *dyn;     /* this launch's dynamic shared memory */
    unsigned char *dyn_map; /* protected build: mapping, guard page last */
    size_t dyn_map_len;
    uint64_t epoch; /* block counter, for shared-memory poisoning */
    const void *main_bottom;
    size_t main_size;
    void *main_fake;
    /* shared-variable notes: address -> epoch of last poisoning */
    std::vector<std::pair<void *, uint64_t>> notes;
};

extern thread_local sched *t_s;
extern int g_schedule;      /* 0 forward, 1 reverse, 2 random, 3 eager */
extern uint64_t g_seed;     /* ZS_EMU_SCHEDULE=random:SEED or eager:SEED */
extern int g_eager_seeded;  /* eager:SEED: a random warp order per round */
extern uint64_t g_launches; /* launches so far, for per-launch seeds */
extern size_t g_stack;      /* fiber stack bytes */

/* A permutation of [0, n) in schedule order. */
void order(std::vector<unsigned> &o, unsigned n, uint64_t *rng);
/* Run one block of t_s->L to completion (or zs_emu_fatal). */
void run_block(const launch *L, uint3 bid, uint64_t *rng, std::vector<unsigned> &ord);

} // namespace zs_emu
#endif
