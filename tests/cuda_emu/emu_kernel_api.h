/*
 * emu_kernel_api.h - the calls the kernel shim (emu_shim.h, compiled into
 * our .cu files) makes into the emulator's fibers and launcher
 * (emu_fiber.cpp, emu_launch.cpp): one declaration for both sides. C++ only;
 * needs NVIDIA's cuda_runtime.h (dim3, cudaStream_t) included first.
 */
#ifndef ZS_EMU_KERNEL_API_H
#define ZS_EMU_KERNEL_API_H

#include <stddef.h>
#include <stdint.h>

extern "C" {
void zs_emu_syncthreads(const char *file, int line);
int zs_emu_syncthreads_op(int op, int pred, const char *file, int line);
void zs_emu_syncwarp(unsigned mask, const char *file, int line);
uint64_t zs_emu_warp_op(int op, unsigned mask, uint64_t bits, int arg, int width, const char *file,
                        int line);
void *zs_emu_dyn_shared(void);
int zs_emu_shared_note(void *p, size_t n);
cudaError_t zs_emu_launch(const void *func, const char *name, const char *file, int line, dim3 grid,
                          dim3 block, size_t shmem, cudaStream_t s, void (*run)(void *),
                          void *closure, void (*free_closure)(void *));
}

#endif
