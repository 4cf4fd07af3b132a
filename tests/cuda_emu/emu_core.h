/*
 * emu_core.h - private declarations shared by the emulator's runtime files
 * (emu_runtime.c, emu_stream.c, emu_event.c, emu_mem.c, emu_copy.c,
 * emu_launch.cpp, emu_fiber.cpp). Not for the libraries built on the
 * runtime: they use emu_internal.h only.
 *
 * What is here: the API entry guard, the thread's last error, sticky
 * context errors, the stream/work-item plumbing, the device-memory access
 * window (protected build). What is not: any CUDA declaration (those come
 * from NVIDIA's headers, included first).
 */
#ifndef ZS_EMU_CORE_H
#define ZS_EMU_CORE_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "emu_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The protected build maps device memory PROT_NONE while no work of its
 * device runs; the ASan build keeps device memory as heap memory so ASan's
 * redzones catch out-of-bounds kernel accesses instead. */
#if defined(__SANITIZE_ADDRESS__)
#define ZS_EMU_PROTECT 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZS_EMU_PROTECT 0
#endif
#endif
#ifndef ZS_EMU_PROTECT
#define ZS_EMU_PROTECT 1
#endif

#define ZS_EMU_MAX_DEVICES 16
/* sm_90's cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB. */
#define ZS_EMU_SMEM_OPTIN (227 << 10)
/* Poison byte for uninitialised or freed device memory and shared memory:
 * 0xFF bytes are NaN in fp32/fp16/bf16/fp64 and -1 in integers. */
#define ZS_EMU_POISON 0xFF

/* Roles of OS threads: user threads may call the runtime; executor threads
 * (stream work) and the host-function thread may not (CUDA Runtime API,
 * 6.5 Stream Management, cudaLaunchHostFunc: "The host function must not
 * make any CUDA API calls"). */
enum { ZS_EMU_ROLE_USER = 0, ZS_EMU_ROLE_EXECUTOR = 1, ZS_EMU_ROLE_HOSTFN = 2 };
void zs_emu_set_role(int role);
/* The calling thread's role (ZS_EMU_ROLE_*). */
int zs_emu_role(void);

/* Every exported runtime function starts with this: initialises the
 * emulator once, dies when called from a host function or stream work. */
void zs_emu_api_enter(const char *api);
/* Record err as the thread's last error (unless cudaSuccess) and return
 * it: every runtime error is also reported by cudaGetLastError (CUDA
 * Runtime API, 6.4 Error Handling, cudaGetLastError). */
cudaError_t zs_emu_ret(cudaError_t err);
/* Sticky error of device dev's context, cudaSuccess if none. */
cudaError_t zs_emu_sticky(int dev);
void zs_emu_set_sticky(int dev, cudaError_t err);
int zs_emu_device_count(void);
size_t zs_emu_mem_limit(void);

/* --- streams (emu_stream.c) --- */
typedef struct zs_emu_stream zs_emu_stream;
/* Resolve a user handle (NULL, cudaStreamLegacy, cudaStreamPerThread or
 * a created stream) to the stream; NULL if invalid. */
zs_emu_stream *zs_emu_stream_get(cudaStream_t s);
int zs_emu_stream_device(zs_emu_stream *st);
/* Item flags for zs_emu_stream_push. */
enum {
    ZS_EMU_WORK_DEVICE = 1, /* fn touches device memory: open the window */
    ZS_EMU_WORK_HOSTFN = 2  /* run on the single host-function thread */
};
/* Enqueue fn on st. Returns the item's sequence number in st (>0), 0 on
 * a sticky error (then free_arg was called). extra_dev: a second device
 * whose memory fn touches (peer copy), or -1. */
uint64_t zs_emu_stream_push(zs_emu_stream *st, int flags, int extra_dev, zs_emu_work_fn fn,
                            void *arg, void (*free_arg)(void *));
/* The stream lock (one for all stream state); zs_emu_stream_done_seq
 * wants it held. */
void zs_emu_lock(void);
void zs_emu_unlock(void);
uint64_t zs_emu_stream_done_seq(const zs_emu_stream *st);
/* A dependency: item seq of stream st. */
typedef struct zs_emu_dep {
    zs_emu_stream *st;
    uint64_t seq;
} zs_emu_dep;
/* zs_emu_stream_push with a dependency on another stream's item (extra,
 * may be NULL) and a hook called under the stream lock with the new item's
 * seq before the item can run (on_seq, may be NULL). */
uint64_t zs_emu_stream_push_ex(zs_emu_stream *st, int flags, int extra_dev, zs_emu_work_fn fn,
                               void *arg, void (*free_arg)(void *), const zs_emu_dep *extra,
                               void (*on_seq)(void *, uint64_t), void *on_seq_arg);
/* Wait until item seq of st has completed. */
void zs_emu_stream_wait(zs_emu_stream *st, uint64_t seq);
/* Wait until all work enqueued so far on every stream of device dev has
 * completed. */
void zs_emu_device_wait(int dev);
/* Wait while a host function runs (kernel launches, cudaFree and
 * cudaFreeHost do, as on an H100: emu_stream.c). */
void zs_emu_hostfn_wait_idle(void);

/* --- device memory window (emu_mem.c) --- */
/* Open/close access to device dev's memory around a piece of stream work
 * (protected build: mprotect RW while any work of dev runs). */
void zs_emu_window_open(int dev);
void zs_emu_window_close(int dev);
void zs_emu_mem_init(void);
/* Where [p, p + n) lies (emu_mem.c's allocation table); *dev gets the
 * device of device memory, else -1. */
enum { ZS_EMU_P_PAGEABLE, ZS_EMU_P_PINNED, ZS_EMU_P_DEVICE, ZS_EMU_P_BAD };
int zs_emu_classify(const void *p, size_t n, int *dev);

/* --- kernels (emu_launch.cpp, emu_fiber.cpp) --- */
void zs_emu_kernel_init(void);
/* If addr is in a guard page of this thread's kernel state (a fiber
 * stack overflow, an overrun of dynamic shared memory), write the
 * diagnostic to msg and return its length, else 0. */
int zs_emu_kernel_fault(const void *addr, char *msg, size_t n);
/* An executor thread ends: release its fibers. */
void zs_emu_kernel_thread_exit(void);

#ifdef __cplusplus
}
#endif
#endif
