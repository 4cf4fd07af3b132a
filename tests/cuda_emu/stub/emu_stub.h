/*
 * emu_stub.h - test-only controls of the stand-in runtime
 * (emu_stub_runtime.c). Not part of the emulator library.
 */
#ifndef ZS_EMU_STUB_H
#define ZS_EMU_STUB_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1: enqueued work waits for the next cudaStreamSynchronize /
 * cudaDeviceSynchronize / cudaMemcpy; 0: it runs at once. */
void zs_emu_stub_defer(int on);

/* The first error work returned since the last call (then cleared). */
cudaError_t zs_emu_stub_sticky(void);

#ifdef __cplusplus
}
#endif
#endif
