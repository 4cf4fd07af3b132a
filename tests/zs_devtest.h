/*
 * zs_devtest.h - the device-behaviour checks shared by test_dev.c (the CPU
 * device) and test_dev_cuda.c (the CUDA device): one test body run against
 * any zs_dev_t, plus the small helpers both files use for their
 * device-specific checks.
 *
 * Everything goes through the device interface (copies to and from device
 * memory, never a host read of it), so the same body holds the CPU device
 * and the CUDA device to the same behaviour. What it does not check: what
 * only one device has (the CPU device's in-place accumulate and overlap
 * refusals, the CUDA caching allocator, accounting figures): those stay in
 * the two test files.
 *
 * Like all test code it stops the test (exit 1) on the first failure.
 */
#ifndef ZS_DEVTEST_H
#define ZS_DEVTEST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "zs_dev.h"

/* Sleep ms milliseconds (nanosleep). */
void zs_devtest_sleep_ms(int ms);

/* Enqueue on s a host function that blocks the stream until *open becomes
 * 1; it gives up after 10 s with ZS_ERR_TIMEOUT (a test that never opens
 * it then fails instead of hanging). *open must outlive the wait. */
void zs_devtest_gate(zs_stream_t *s, atomic_int *open);

/* Enqueue on s a host function that sleeps ms milliseconds. Unlike a gate
 * it depends on no other thread, so it is safe where this thread goes on
 * making CUDA calls before the stream is released: CUDA allows any call to
 * block on its callback thread (a gate deadlocked that way on an H100). */
void zs_devtest_hold(zs_stream_t *s, int ms);

/* Copy `bytes` of device memory to the host and wait for s. */
void zs_devtest_d2h(zs_stream_t *s, void *host, const void *dev, size_t bytes);

/* A new device buffer (category scratch) holding a copy of `bytes` host
 * bytes, copied on s and synchronised. Free with zs_dev_free. */
void *zs_devtest_h2d(zs_dev_t *d, zs_stream_t *s, const void *host, size_t bytes);

/* n host values of dt, uniform in [-scale, scale) from seed
 * (zs_rand_unit). Caller frees with free(). */
void *zs_devtest_rand_host(zs_dtype_t dt, size_t n, uint64_t seed, float scale);

/* zs_dev_alloc refuses bad spaces, categories, a NULL out and sizes no
 * machine has (ZS_ERR_INVALID / ZS_ERR_NOMEM), and a refusal changes no
 * figure of zs_dev_mem_get. Leaves the device as it found it. */
void zs_devtest_alloc_refused(zs_dev_t *d);

/* zs_dev_host_register: caller memory (page-aligned, 3 pages) counts as
 * pinned memory of its category (cur, peak, held; not nallocs) while
 * registered; async copies device -> registered -> device round-trip its
 * bytes; an overlapping range, NULL, 0 bytes and a bad category are
 * refused with no figure changed; unregister gives the figures back, and
 * an unknown pointer is ignored. Leaves the device as it found it. */
void zs_devtest_host_register(zs_dev_t *d);

/* Streams, events and host functions: in-order execution of order_n host
 * functions; event ordering across streams with a negative control (without
 * the wait the consumer sees the old value, proving streams run
 * concurrently); never-recorded and re-recorded events; sticky host
 * function errors through events, waits and syncs (failing behind a gate
 * and known at enqueue); host function arguments copied at enqueue;
 * memcpy/memset across spaces; stream destroy draining its queue. Frees
 * everything it allocates. */
void zs_devtest_streams(zs_dev_t *d, int order_n);

/* The vector ops on a new stream: cast/accumulate/scale and AdamW bitwise
 * against the scalar references (zs_cast.h, zs_adam_update_ref), AdamW's
 * structs copied at enqueue; sumsq against an fp64 sum in the documented
 * order (chunks of 32768, 8 lanes): bitwise when sumsq_bitwise (the CPU
 * device sums in that order), else within 1e-12 relative (another fp64
 * order), non-finite elements flagged and the flag never cleared; the
 * refusals every device shares. Prints the max errors. */
void zs_devtest_vector(zs_dev_t *d, int sumsq_bitwise);

#endif
