/*
 * test_emu_eager.cu - tests of the emulator's ZS_EMU_SCHEDULE=eager[:SEED]
 * (emu_fiber.cpp, eager_round), compiled by g++ through zs_emu_cu_sources.
 * The kernels are written from the CUDA C++ Programming Guide, not from our
 * kernels. Sources of the expectations:
 *  - SIMT Architecture, Independent Thread Scheduling: warps (and the
 *    threads of a warp) make progress independently; nothing orders one
 *    warp's accesses with another's but a barrier;
 *  - Synchronization Functions: __syncthreads "waits until all threads in
 *    the thread block have reached this point and all global and shared
 *    memory accesses made by these threads prior to __syncthreads() are
 *    visible to all threads in the block";
 *  - Warp Matrix Functions: load_matrix_sync / store_matrix_sync /
 *    mma_sync wait "until all warp lanes have arrived" (of their warp);
 *  - Warp Shuffle Functions, Warp Vote Functions: __shfl_sync and
 *    __ballot_sync wait for the threads named in the mask (of their warp).
 * Cases, each in a child process per schedule (forward, reverse, random:1,
 * random:7, eager, eager:1, eager:7):
 *  - 4 warps store a 16x16 float tile in shared memory (two elements per
 *    thread), then every warp loads the whole tile with
 *    wmma::load_matrix_sync and stores it to global memory:
 *    (a) with __syncthreads between: every warp reads the full tile under
 *        every schedule;
 *    (b) without it: under eager (lowest warp first) warp w reads exactly
 *        the 64 * (3 - w) elements of the later warps unwritten; under
 *        eager:SEED some warp reads unwritten elements; the old schedules
 *        keep their behaviour (a warp operation completes only once every
 *        thread of the block has stopped, so the race is not seen there);
 *  - the same with a __shfl_sync and a __ballot_sync as the warp
 *    operation, each thread then reading another warp's slot;
 *  - a mask naming an exited lane still dies under eager (the scheduler's
 *    diagnostics hold there too).
 */
#include <mma.h> /* NVIDIA's: empty under g++; emu_shim.h has nvcuda::wmma */

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "emu_test.h"

using namespace nvcuda;

#ifndef ZS_CUDA_LAUNCH /* what our code does; the shim defined it already */
#define ZS_CUDA_LAUNCH(k, g, b, sh, st, ...) k<<<g, b, sh, st>>>(__VA_ARGS__)
#endif

enum { WARPS = 4, NT = WARPS * 32, TILE = 16 * 16 };

/* ---- wmma: a tile stored by all warps, loaded by each ---- */
template <bool BAR> __global__ void k_tile(float *out)
{
    __shared__ __align__(32) float tile[TILE];
    unsigned t = threadIdx.x, w = t / 32;
    tile[2 * t] = (float)(2 * t + 1);
    tile[2 * t + 1] = (float)(2 * t + 2);
    if (BAR)
        __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, tile, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(out + w * TILE, acc, 16, wmma::mem_row_major);
}

/* Prints "warp W bad N" per warp: N elements not the stored value. */
static int child_tile(bool bar)
{
    float *d;
    EMU_CUDA(cudaMalloc(&d, WARPS * TILE * sizeof(float)));
    if (bar)
        ZS_CUDA_LAUNCH(k_tile<true>, 1, NT, 0, 0, d);
    else
        ZS_CUDA_LAUNCH(k_tile<false>, 1, NT, 0, 0, d);
    EMU_CUDA(cudaGetLastError());
    static float h[WARPS * TILE];
    EMU_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int w = 0; w < WARPS; w++) {
        int bad = 0;
        for (int i = 0; i < TILE; i++)
            bad += h[w * TILE + i] != (float)(i + 1);
        printf("warp %d bad %d\n", w, bad);
    }
    EMU_CUDA(cudaFree(d));
    return 0;
}

/* ---- shuffle / ballot: each thread stores its slot, takes part in a
 * warp operation, then reads the slot of the thread 32 further on (another
 * warp's). out[t]: 1 when that slot held its value, and the warp
 * operation's result was right. ---- */
template <bool BAR, bool BALLOT> __global__ void k_slots(int *out)
{
    __shared__ int slot[NT];
    unsigned t = threadIdx.x;
    slot[t] = (int)t + 1;
    if (BAR)
        __syncthreads();
    int ok;
    if (BALLOT)
        ok = __ballot_sync(0xffffffffu, 1) == 0xffffffffu;
    else
        ok = __shfl_sync(0xffffffffu, (int)t, 0) == (int)(t & ~31u);
    unsigned o = (t + 32) % NT;
    out[t] = ok && slot[o] == (int)o + 1;
}

/* Prints "warp W bad N" per warp: N threads that saw a wrong value. */
static int child_slots(bool bar, bool ballot)
{
    int *d;
    EMU_CUDA(cudaMalloc(&d, NT * sizeof(int)));
    if (bar && ballot)
        ZS_CUDA_LAUNCH((k_slots<true, true>), 1, NT, 0, 0, d);
    else if (bar)
        ZS_CUDA_LAUNCH((k_slots<true, false>), 1, NT, 0, 0, d);
    else if (ballot)
        ZS_CUDA_LAUNCH((k_slots<false, true>), 1, NT, 0, 0, d);
    else
        ZS_CUDA_LAUNCH((k_slots<false, false>), 1, NT, 0, 0, d);
    EMU_CUDA(cudaGetLastError());
    static int h[NT];
    EMU_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int w = 0; w < WARPS; w++) {
        int bad = 0;
        for (int l = 0; l < 32; l++)
            bad += h[w * 32 + l] != 1;
        printf("warp %d bad %d\n", w, bad);
    }
    EMU_CUDA(cudaFree(d));
    return 0;
}

/* ---- A death: a shuffle whose mask names exited lanes ---- */
__global__ void k_exited(int *o)
{
    if (threadIdx.x % 32 >= 16)
        return;
    o[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

static int child_exited(void)
{
    int *d;
    EMU_CUDA(cudaMalloc(&d, NT * sizeof(int)));
    ZS_CUDA_LAUNCH(k_exited, 1, NT, 0, 0, d);
    cudaDeviceSynchronize();
    return 0;
}

/* ---- The parent ---- */
static const char *const old_schedules[] = {"ZS_EMU_SCHEDULE=forward", "ZS_EMU_SCHEDULE=reverse",
                                            "ZS_EMU_SCHEDULE=random:1", "ZS_EMU_SCHEDULE=random:7",
                                            NULL};
static const char *const eager_schedules[] = {"ZS_EMU_SCHEDULE=eager", "ZS_EMU_SCHEDULE=eager:1",
                                              "ZS_EMU_SCHEDULE=eager:7", NULL};
static const char *const all_zero = "warp 0 bad 0\nwarp 1 bad 0\nwarp 2 bad 0\nwarp 3 bad 0\n";

static void run(emu_child *c, const char *name, const char *sched)
{
    const char *env[] = {sched, NULL};
    emu_run_child(c, name, env);
    EMU_CHECK(c->exited && c->code == 0, "%s under %s: %s", name, sched, c->out);
}

/* name: a case printing "warp W bad N"; eager_lowest: what eager (lowest
 * warp first) must print for it without the barrier. */
static void test_case(const char *what, const char *bar, const char *nobar,
                      const char *eager_lowest)
{
    emu_child c;
    printf("%s with __syncthreads: every warp reads every store, under every schedule\n", what);
    for (int i = 0; old_schedules[i]; i++) {
        run(&c, bar, old_schedules[i]);
        EMU_CHECK(!strcmp(c.out, all_zero), "%s: %s", old_schedules[i], c.out);
    }
    for (int i = 0; eager_schedules[i]; i++) {
        run(&c, bar, eager_schedules[i]);
        EMU_CHECK(!strcmp(c.out, all_zero), "%s: %s", eager_schedules[i], c.out);
    }
    printf("%s without it: the old schedules do not see the race (every thread stops before "
           "a warp operation completes)\n",
           what);
    for (int i = 0; old_schedules[i]; i++) {
        run(&c, nobar, old_schedules[i]);
        EMU_CHECK(!strcmp(c.out, all_zero), "%s: %s", old_schedules[i], c.out);
    }
    printf("%s without it: eager exposes it (a warp reads before later warps store)\n", what);
    run(&c, nobar, "ZS_EMU_SCHEDULE=eager");
    EMU_CHECK(!strcmp(c.out, eager_lowest), "eager: got\n%swant\n%s", c.out, eager_lowest);
    for (int i = 1; eager_schedules[i]; i++) {
        run(&c, nobar, eager_schedules[i]);
        EMU_CHECK(strcmp(c.out, all_zero), "%s: the race went unseen", eager_schedules[i]);
        printf("  %s:\n%s", eager_schedules[i], c.out);
    }
}

int main(int argc, char **argv)
{
    emu_self = argv[0];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 3 && !strcmp(argv[1], "child")) {
        const char *n = argv[2];
        if (!strcmp(n, "tile") || !strcmp(n, "tile_nobar"))
            return child_tile(!strcmp(n, "tile"));
        if (!strncmp(n, "shfl", 4) || !strncmp(n, "ballot", 6))
            return child_slots(!strstr(n, "nobar"), n[0] == 'b');
        if (!strcmp(n, "exited"))
            return child_exited();
        return 2;
    }
    /* Warp w (lowest first) runs before w + 1 ... 3 store: it reads their
     * 64 elements each as poison. */
    test_case("wmma::load_matrix_sync of a shared tile", "tile", "tile_nobar",
              "warp 0 bad 192\nwarp 1 bad 128\nwarp 2 bad 64\nwarp 3 bad 0\n");
    /* Warps 0-2 read the next warp's slots before it stores; warp 3 reads
     * warp 0's, stored long before. */
    test_case("__shfl_sync then another warp's slot", "shfl", "shfl_nobar",
              "warp 0 bad 32\nwarp 1 bad 32\nwarp 2 bad 32\nwarp 3 bad 0\n");
    test_case("__ballot_sync then another warp's slot", "ballot", "ballot_nobar",
              "warp 0 bad 32\nwarp 1 bad 32\nwarp 2 bad 32\nwarp 3 bad 0\n");
    printf("a __shfl_sync whose mask names exited lanes dies under eager too\n");
    for (int i = 0; eager_schedules[i]; i++) {
        const char *env[] = {eager_schedules[i], NULL};
        emu_child c;
        emu_run_child(&c, "exited", env);
        EMU_CHECK(emu_died(&c) && emu_has(&c, "__shfl_sync(mask 0xffffffff)") &&
                      emu_has(&c, "has exited"),
                  "%s: %s", eager_schedules[i], c.out);
    }
    printf("test_emu_eager: all passed\n");
    return 0;
}
