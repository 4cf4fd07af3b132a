/*
 * test_dev_cuda.c - the device interface on CUDA (worker/dev/zs_dev_cuda*.c).
 *
 * The behaviours every device shares are checked by the body in
 * zs_devtest.c (the one test_dev.c runs on the CPU device): in-order host
 * functions; event ordering across streams with a negative control;
 * never-recorded and re-recorded events; sticky host-function errors
 * through events, waits and syncs (both when the failure is known at
 * enqueue and when it happens behind a gate); arguments copied at enqueue;
 * memcpy/memset across spaces; caller memory registered as pinned
 * (cudaHostRegister) and counted; destroy drains; the vector ops against
 * their CPU twins (cast/accumulate/scale/adamw bitwise, sumsq within fp64
 * summation-order error, max error printed). This file adds what only the
 * CUDA device has: accounting with the caching allocator (cached/held
 * figures, block reuse and its fence: reuse only after the streams that
 * may still use a block have passed, OOM with trim) and ZS_CUDA_CHECK's
 * error record.
 *
 * Without a usable GPU it prints "SKIPPED: no GPU: <CUDA's reason>" and
 * exits 77 (ctest SKIP_RETURN_CODE), after checking that creating the
 * device fails cleanly with the same reason.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_dev.h"
#include "zs_cast.h"
#include "zs_cuda_vec.h"
#include "zs_dev_cuda.h"
#include "zs_devtest.h"
#include "zs_test.h"

#include <cuda_runtime.h>

static zs_err_t err;

/* ---- memory --------------------------------------------------------------- */

static uint64_t sum_cur(const zs_dev_mem_t *m, int space)
{
    uint64_t t = 0;
    for (int k = 0; k < ZS_MEM_NCATS; k++)
        t += m->cur[space][k];
    return t;
}

/* Run first, on a device with no stream: freed blocks are reusable at once. */
static void test_accounting(zs_dev_t *d)
{
    zs_dev_mem_t m0, m;
    zs_dev_mem_get(d, &m0);
    TEST_CHECK(m0.nallocs == 0 && m0.held[ZS_SPACE_DEVICE] == 0);
    void *a, *b, *c, *z1, *z2;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, 1000, &a, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_GRADS, 3000, &b, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_COMM, 500, &c, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_SCRATCH, 0, &z1, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 0, &z2, &err), err);
    TEST_CHECK(a && b && c && z1 && z2 && z2 != a && z2 != b);
    TEST_CHECK((uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0 && (uintptr_t)c % 64 == 0);
    memset(c, 7, 500); /* pinned memory is host-addressable */
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.nallocs == 5);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 1000);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_GRADS] == 3000);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH] == 0);
    TEST_CHECK(m.cur[ZS_SPACE_PINNED][ZS_MEM_COMM] == 500);
    TEST_CHECK(m.held[ZS_SPACE_DEVICE] == 4000 && m.held_peak[ZS_SPACE_DEVICE] == 4000);
    TEST_CHECK(m.held[ZS_SPACE_PINNED] == 500 && m.held[ZS_SPACE_HOST] == 0);
    for (int s = 0; s < ZS_NSPACES; s++)
        TEST_CHECK(m.cached[s] == 0);

    /* a freed device block is cached (its real size: 1000 -> 1024) */
    zs_dev_free(d, a);
    zs_dev_free(d, NULL);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 0);
    TEST_CHECK(m.peak[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 1000);
    TEST_CHECKF(m.cached[ZS_SPACE_DEVICE] == 1024, "cached %llu",
                (unsigned long long)m.cached[ZS_SPACE_DEVICE]);
    TEST_CHECK(m.held[ZS_SPACE_DEVICE] == 3000 + 1024);

    zs_dev_mem_reset_peak(d);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.peak[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 0);
    TEST_CHECK(m.peak[ZS_SPACE_DEVICE][ZS_MEM_GRADS] == 3000);
    TEST_CHECK(m.held_peak[ZS_SPACE_DEVICE] == 3000 + 1024);

    /* another size: a new block; the same rounded size: the cached one */
    void *a2, *a3;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, 200, &a2, &err), err);
    TEST_CHECK(a2 != a);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_ACTIVATIONS, 1010, &a3, &err), err);
    TEST_CHECKF(a3 == a, "block of 1024 not reused (%p, freed %p)", a3, a);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.cached[ZS_SPACE_DEVICE] == 0);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_ACTIVATIONS] == 1010);
    TEST_CHECK(m.held[ZS_SPACE_DEVICE] == 3000 + 200 + 1010);
    TEST_CHECK(m.nallocs == 7);

    /* refused arguments: nothing allocated, nothing counted */
    zs_devtest_alloc_refused(d);

    zs_dev_free(d, a2);
    zs_dev_free(d, a3);
    zs_dev_free(d, b);
    zs_dev_free(d, c);
    zs_dev_free(d, z1);
    zs_dev_free(d, z2);
    zs_dev_mem_get(d, &m);
    for (int s = 0; s < ZS_NSPACES; s++)
        TEST_CHECK(sum_cur(&m, s) == 0);
    TEST_CHECKF(m.cached[ZS_SPACE_DEVICE] == 512 + 1024 + 3072 + 512, "cached %llu",
                (unsigned long long)m.cached[ZS_SPACE_DEVICE]);
    TEST_CHECK(m.held[ZS_SPACE_DEVICE] == m.cached[ZS_SPACE_DEVICE]);
    TEST_CHECK(m.held[ZS_SPACE_PINNED] == 0 && m.cached[ZS_SPACE_PINNED] == 0);
    printf("accounting: ok (%s)\n", d->desc);
}

/* A block freed while queued work may still use it is not handed out again
 * until that work has passed; then it is. */
static void test_reuse_fence(zs_dev_t *d)
{
    enum { N = 3 << 20 };
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "user", &s, &err), err);
    void *x, *y, *z;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, N, &x, &err), err);
    atomic_int open = 0;
    zs_devtest_gate(s, &open);
    TEST_OK(zs_dev_memset(s, x, 1, N, &err), err); /* queued use of x */
    zs_dev_free(d, x);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, N, &y, &err), err);
    TEST_CHECKF(y != x, "block %p handed out while queued work still uses it", x);
    zs_dev_mem_t m;
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.cached[ZS_SPACE_DEVICE] >= (uint64_t)(4 << 20));
    atomic_store(&open, 1);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, N, &z, &err), err);
    TEST_CHECKF(z == x, "block %p not reused after its stream passed (got %p)", x, z);
    zs_dev_free(d, y);
    zs_dev_free(d, z);
    zs_dev_stream_destroy(s);
    printf("reuse after the fence: ok\n");
}

/* An allocation larger than the GPU fails cleanly and trims the cache. */
static void test_oom(zs_dev_t *d)
{
    void *p, *big = (void *)1;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 8 << 20, &p, &err), err);
    zs_dev_free(d, p);
    zs_dev_mem_t m;
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.cached[ZS_SPACE_DEVICE] > 0);
    size_t huge = (size_t)1 << 42; /* 4 TiB */
    zs_err_clear(&err);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, huge, &big, &err) == ZS_ERR_NOMEM);
    TEST_CHECK(big == NULL);
    TEST_CHECKF(strstr(err.msg, "out of device memory") && strstr(err.msg, "params"), "%s",
                err.msg);
    printf("  refused: %s\n", err.msg);
    zs_dev_mem_get(d, &m);
    TEST_CHECKF(m.cached[ZS_SPACE_DEVICE] == 0, "cache not trimmed: %llu",
                (unsigned long long)m.cached[ZS_SPACE_DEVICE]);
    /* and the device still works */
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 4096, &p, &err), err);
    zs_dev_free(d, p);
    printf("out of memory: ok\n");
}

/* "Not ready" from an event query (zs_dev_event_query, the allocator's
 * fence polling) is recorded by CUDA as the thread's last error; it must
 * not make the next kernel launch on the thread report a failure. */
static void test_not_ready_not_left(zs_dev_t *d)
{
    zs_stream_t *a, *b;
    zs_event_t *ev;
    TEST_OK(zs_dev_stream_create(d, 0, "held", &a, &err), err);
    TEST_OK(zs_dev_stream_create(d, 0, "free", &b, &err), err);
    TEST_OK(zs_dev_event_create(d, &ev, &err), err);
    float one = 1.0f, *x, *y;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, sizeof one, (void **)&x, &err), err);
    TEST_OK(zs_dev_memcpy(b, x, &one, sizeof one, &err), err);
    /* a held by a sleeping host function, not a gate opened from this
     * thread: with a gate this test deadlocked on an H100 (2026-11-25),
     * because a CUDA call below waited for the callback thread, which the
     * documentation allows ("any CUDA API call may block") */
    zs_devtest_hold(a, 1500);
    TEST_OK(zs_dev_event_record(ev, a, &err), err);
    TEST_CHECK(zs_dev_event_query(ev) == 0); /* cudaErrorNotReady */
    TEST_OK(zs_dev_scale(b, x, ZS_DTYPE_F32, 3.0f, 1, &err), err);
    /* a block freed behind the gate, then an allocation: the fence poll */
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 4096, (void **)&y, &err), err);
    TEST_OK(zs_dev_memset(a, y, 0, 4096, &err), err);
    zs_dev_free(d, y);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 8192, (void **)&y, &err), err);
    TEST_OK(zs_dev_scale(b, x, ZS_DTYPE_F32, 2.0f, 1, &err), err);
    TEST_OK(zs_dev_sumsq(b, x, ZS_DTYPE_F32, 1, (double *)y, &err), err);
    /* b is read only after a is done: an allocation between two commands
     * may serialise streams (CUDA's implicit synchronisation) */
    TEST_OK(zs_dev_stream_sync(a, &err), err);
    zs_devtest_d2h(b, &one, x, sizeof one);
    TEST_CHECKF(one == 6.0f, "%g", one);
    zs_dev_free(d, x);
    zs_dev_free(d, y);
    zs_dev_event_destroy(ev);
    zs_dev_stream_destroy(a);
    zs_dev_stream_destroy(b);
    printf("not-ready queries leave no error for the next launch: ok\n");
}

/* The launchers' own argument checks, as the CPU device's (run without a
 * GPU too: refused before any CUDA call). */
static void test_vec_args(void)
{
    zs_err_t e;
    float f[8];
    TEST_CHECKF(zs_cuda_cast(NULL, f, ZS_DTYPE_BF16, f + 1, ZS_DTYPE_F32, 4, &e) == ZS_ERR_INVALID,
                "%s", e.msg);
    TEST_CHECK(strstr(e.msg, "overlap"));
    printf("  refused: %s\n", e.msg);
    TEST_CHECK(zs_cuda_cast(NULL, f, ZS_DTYPE_F32, f, ZS_DTYPE_F32, 1, &e) == ZS_ERR_INVALID);
    size_t huge = SIZE_MAX / 4 + 1;
    TEST_CHECK(zs_cuda_cast(NULL, f, ZS_DTYPE_BF16, f + 4, ZS_DTYPE_F32, huge, &e) == ZS_ERR_RANGE);
    TEST_CHECK(zs_cuda_accumulate(NULL, f, ZS_DTYPE_F32, f, ZS_DTYPE_F32, huge, &e) ==
               ZS_ERR_RANGE);
    TEST_CHECK(zs_cuda_scale(NULL, f, ZS_DTYPE_F32, 2.0f, huge, &e) == ZS_ERR_RANGE);
    TEST_CHECK(zs_cuda_sumsq(NULL, f, ZS_DTYPE_F32, huge, (double *)f, &e) == ZS_ERR_RANGE);
    printf("  refused: %s\n", e.msg);
    printf("vector-op argument checks: ok\n");
}

/* x += x is allowed, as on the CPU device (zs_dev_cpu_ops.c). */
static void test_accumulate_in_place(zs_dev_t *d)
{
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "inplace", &s, &err), err);
    for (int k = 0; k < 3; k++) {
        zs_dtype_t dt = k == 0 ? ZS_DTYPE_F32 : k == 1 ? ZS_DTYPE_BF16 : ZS_DTYPE_F16;
        size_t n = 1000, bytes = n * zs_dtype_size(dt);
        void *h = zs_devtest_rand_host(dt, n, 31 + k, 3.0f), *got = malloc(bytes);
        void *x = zs_devtest_h2d(d, s, h, bytes);
        TEST_OK(zs_dev_accumulate(s, x, dt, x, dt, n, &err), err);
        zs_devtest_d2h(s, got, x, bytes);
        /* doubling is exact in every dtype (no overflow at |x| <= 3) */
        TEST_OK(zs_dev_memcpy(s, x, h, bytes, &err), err);
        TEST_OK(zs_dev_scale(s, x, dt, 2.0f, n, &err), err);
        zs_devtest_d2h(s, h, x, bytes);
        TEST_CHECKF(memcmp(got, h, bytes) == 0, "%s x += x is not 2x", zs_dtype_name(dt));
        zs_dev_free(d, x);
        free(h);
        free(got);
    }
    zs_dev_stream_destroy(s);
    printf("accumulate in place: ok\n");
}

/* Casts into pinned memory (the engine keeps stage 3 offloaded parameters
 * there): a same-dtype cast is a copy whose kind must not say device. */
static void test_cast_to_pinned(zs_dev_t *d)
{
    enum { N = 777 };
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "pinned", &s, &err), err);
    float *h = zs_devtest_rand_host(ZS_DTYPE_F32, N, 77, 2.0f), *pin;
    uint16_t *pin16;
    void *x = zs_devtest_h2d(d, s, h, N * 4);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_PARAMS, N * 4, (void **)&pin, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_PARAMS, N * 2, (void **)&pin16, &err), err);
    TEST_OK(zs_dev_cast(s, pin, ZS_DTYPE_F32, x, ZS_DTYPE_F32, N, &err), err);
    TEST_OK(zs_dev_cast(s, pin16, ZS_DTYPE_BF16, x, ZS_DTYPE_F32, N, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    TEST_CHECK(memcmp(pin, h, N * 4) == 0);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += pin16[i] != zs_f32_to_bf16(h[i]);
    TEST_CHECKF(bad == 0, "%d of %d bf16 values differ", bad, N);
    zs_dev_free(d, x);
    zs_dev_free(d, pin);
    zs_dev_free(d, pin16);
    free(h);
    zs_dev_stream_destroy(s);
    printf("casts into pinned memory: ok\n");
}

/* ZS_CUDA_CHECK's record (runs without a GPU too): code mapping, call,
 * file:line, device, CUDA's text and the hint. */
static void test_check_macro(int have_gpu)
{
    zs_err_t e;
    TEST_CHECK(zs__cuda_check(0, "cudaFoo", __FILE__, __LINE__, 3, "h", &e) == ZS_OK);
    int line = __LINE__ + 1;
    TEST_CHECK(zs__cuda_check(2, "cudaMalloc", __FILE__, line, 3, "free some", &e) == ZS_ERR_NOMEM);
    char want[64];
    snprintf(want, sizeof want, "cudaMalloc at test_dev_cuda.c:%d on cuda:3: ", line);
    TEST_CHECKF(strstr(e.msg, want) && strstr(e.msg, "cudaErrorMemoryAllocation") &&
                    strstr(e.msg, "(hint: free some)"),
                "%s", e.msg);
    TEST_CHECK(zs__cuda_check(35, "cudaX", __FILE__, 1, 0, NULL, &e) == ZS_ERR_UNAVAILABLE);
    TEST_CHECK(zs__cuda_check(700, "cudaX", __FILE__, 1, 0, NULL, &e) == ZS_ERR_INTERNAL);
    if (!have_gpu) { /* a real call through the macro */
        TEST_CHECK(ZS_CUDA_CHECK(&e, 0, "is there a driver?", cudaSetDevice, 0) != ZS_OK);
        TEST_CHECKF(strstr(e.msg, "cudaSetDevice at test_dev_cuda.c:") &&
                        strstr(e.msg, "(hint: is there a driver?)"),
                    "%s", e.msg);
    } else {
        /* a non-sticky failure, reported, is no longer the thread's last
         * error: a kernel launch checked with cudaGetLastError must not fail
         * with it (without a driver every call fails: not checkable there) */
        TEST_CHECK(ZS_CUDA_CHECK(&e, 0, "bad ordinal", cudaSetDevice, -1) != ZS_OK);
        cudaError_t last = cudaPeekAtLastError();
        TEST_CHECKF(last == cudaSuccess, "last error left set: %s", cudaGetErrorName(last));
    }
    printf("ZS_CUDA_CHECK: %s\n", e.msg);
}

int main(void)
{
    char why[256];
    zs_dev_t *d = NULL;
    int ngpu = zs_dev_cuda_available(why, sizeof why);
    test_check_macro(ngpu > 0);
    test_vec_args();
    if (ngpu == 0) {
        /* creating the device must fail cleanly with the same reason */
        TEST_CHECK(zs_dev_cuda_create(0, &d, &err) == ZS_ERR_UNAVAILABLE && d == NULL);
        TEST_CHECKF(strstr(err.msg, "no GPU") && strstr(err.msg, why), "%s", err.msg);
        printf("SKIPPED: %s\n", why);
        return 77;
    }
    TEST_CHECK(zs_dev_cuda_create(-1, &d, &err) == ZS_ERR_RANGE);
    printf("  refused: %s\n", err.msg);
    TEST_OK(zs_dev_cuda_create(0, &d, &err), err);
    TEST_CHECKF(strncmp(d->desc, "cuda:0 ", 7) == 0 && strstr(d->desc, "GiB"), "desc '%s'",
                d->desc);
    TEST_CHECK(strcmp(d->vt->name, "cuda") == 0);
    printf("device: %s\n", d->desc);
    test_accounting(d);
    test_reuse_fence(d);
    test_oom(d);
    test_not_ready_not_left(d);
    test_accumulate_in_place(d);
    test_cast_to_pinned(d);
    zs_devtest_host_register(d); /* cudaHostRegister of caller memory, counted as pinned */
    zs_devtest_streams(d, 2000);
    zs_devtest_vector(d, 0);
    zs_dev_mem_t m;
    zs_dev_mem_get(d, &m);
    for (int sp = 0; sp < ZS_NSPACES; sp++)
        TEST_CHECK(sum_cur(&m, sp) == 0);
    zs_dev_destroy(d);
    printf("test_dev_cuda: all passed\n");
    return 0;
}
