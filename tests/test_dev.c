/*
 * test_dev.c - unit tests of the device interface on the CPU device
 * (worker/dev: zs_dev.h, zs_dev.c, zs_dev_cpu.c, zs_dev_cpu_ops.c).
 *
 * The behaviours every device shares (streams, events, sticky errors,
 * host functions, copies, the vector ops against scalar references) are
 * checked by the body in zs_devtest.c, which test_dev_cuda.c runs on the
 * CUDA device; sumsq is held bitwise to the documented order here. This
 * file adds what is the CPU device's own: exact memory figures (device
 * memory is RAM: the whole block is writable), caller memory registered
 * as pinned (zs_devtest_host_register, shared), the vector ops on pools of
 * 1 and 3 threads, accumulate in place, its refusals of overlapping
 * and oversized vector ops, and the optional device memory limit.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "zs_dev.h"
#include "zs_devtest.h"
#include "zs_test.h"

static zs_err_t err;

/* ---- memory ------------------------------------------------------------- */

static void test_accounting(zs_dev_t *d)
{
    zs_dev_mem_t m0, m;
    zs_dev_mem_get(d, &m0);
    void *a = NULL, *b = NULL, *c = NULL, *z1 = NULL, *z2 = NULL;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, 1000, &a, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_GRADS, 3000, &b, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_COMM, 500, &c, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_SCRATCH, 0, &z1, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_SCRATCH, 0, &z2, &err), err);
    TEST_CHECK(a && b && c && z1 && z2 && z1 != z2);
    TEST_CHECK((uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0 && (uintptr_t)c % 64 == 0);
    memset(a, 1, 1000); /* CPU device memory is RAM: the whole block is writable */
    memset(b, 2, 3000);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.nallocs == m0.nallocs + 5);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 1000);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_GRADS] == 3000);
    TEST_CHECK(m.cur[ZS_SPACE_PINNED][ZS_MEM_COMM] == 500);
    TEST_CHECK(m.cur[ZS_SPACE_HOST][ZS_MEM_SCRATCH] == 0);
    TEST_CHECK(m.cur[ZS_SPACE_PINNED][ZS_MEM_PARAMS] == 0);
    TEST_CHECK(m.held[ZS_SPACE_DEVICE] == 4000 && m.held_peak[ZS_SPACE_DEVICE] == 4000);
    TEST_CHECK(m.held[ZS_SPACE_PINNED] == 500 && m.held[ZS_SPACE_HOST] == 0);
    for (int s = 0; s < ZS_NSPACES; s++)
        TEST_CHECK(m.cached[s] == 0);

    zs_dev_free(d, a);
    zs_dev_free(d, NULL);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.cur[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 0);
    TEST_CHECK(m.peak[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 1000);
    TEST_CHECK(m.held[ZS_SPACE_DEVICE] == 3000 && m.held_peak[ZS_SPACE_DEVICE] == 4000);

    zs_dev_mem_reset_peak(d);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.peak[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 0);
    TEST_CHECK(m.peak[ZS_SPACE_DEVICE][ZS_MEM_GRADS] == 3000);
    TEST_CHECK(m.held_peak[ZS_SPACE_DEVICE] == 3000);
    TEST_CHECK(m.peak[ZS_SPACE_PINNED][ZS_MEM_COMM] == 500);

    /* peaks rise again with new allocations; nallocs counts every one */
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, 200, &a, &err), err);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.peak[ZS_SPACE_DEVICE][ZS_MEM_PARAMS] == 200);
    TEST_CHECK(m.held_peak[ZS_SPACE_DEVICE] == 3200);
    TEST_CHECK(m.nallocs == m0.nallocs + 6);

    /* refused arguments: nothing allocated, nothing counted */
    zs_devtest_alloc_refused(d);

    TEST_CHECK(strcmp(zs_memcat_name(ZS_MEM_GATHERED), "gathered") == 0);
    TEST_CHECK(strcmp(zs_memcat_name(ZS_MEM_SCRATCH), "scratch") == 0);
    TEST_CHECK(strcmp(zs_space_name(ZS_SPACE_PINNED), "pinned") == 0);
    TEST_CHECK(strcmp(zs_space_name(7), "?") == 0);

    zs_dev_free(d, a);
    zs_dev_free(d, b);
    zs_dev_free(d, c);
    zs_dev_free(d, z1);
    zs_dev_free(d, z2);
    zs_dev_mem_get(d, &m);
    for (int s = 0; s < ZS_NSPACES; s++) {
        TEST_CHECK(m.held[s] == 0);
        for (int k = 0; k < ZS_MEM_NCATS; k++)
            TEST_CHECK(m.cur[s][k] == 0);
    }
    printf("accounting: ok\n");
}

/* ---- the device memory limit ------------------------------------------------ */

typedef struct {
    zs_dev_t *d;
    void *p[64];
    int n;
} racer_t;

/* Allocate 1000-byte device blocks until the limit refuses one. */
static void *racer(void *arg)
{
    racer_t *r = arg;
    zs_err_t e;
    while (r->n < 64 &&
           zs_dev_alloc(r->d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 1000, &r->p[r->n], &e) == ZS_OK)
        r->n++;
    return NULL;
}

/* zs_dev_cpu_opts_t.device_limit: device blocks beyond the held limit are
 * refused with ZS_ERR_NOMEM "out of device memory" naming the limit,
 * nothing is counted for a refusal, the boundary is inclusive, pinned and
 * host memory are not limited, and threads racing for the last bytes
 * cannot overshoot it. */
static void test_limit(void)
{
    zs_dev_t *d;
    zs_dev_cpu_opts_t o = {1, 10000};
    TEST_OK(zs_dev_cpu_create_opts(&o, &d, &err), err);
    printf("limited device: %s\n", d->desc);
    TEST_CHECK(strstr(d->desc, "10000") != NULL);
    void *a = NULL, *b = NULL, *c = NULL, *x = (void *)1;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, 6000, &a, &err), err);
    zs_dev_mem_t m0, m;
    zs_dev_mem_get(d, &m0);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_ACTIVATIONS, 4001, &x, &err) ==
               ZS_ERR_NOMEM);
    TEST_CHECK(x == NULL);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(strstr(err.msg, "out of device memory") != NULL);
    TEST_CHECK(strstr(err.msg, "limit is 10000 bytes") != NULL);
    TEST_CHECK(strstr(err.msg, "6000 bytes") != NULL && strstr(err.msg, "activations") != NULL);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(memcmp(&m, &m0, sizeof m) == 0);
    /* not limited: pinned and host memory */
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_COMM, 50000, &b, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_SCRATCH, 50000, &c, &err), err);
    /* exactly up to the limit, then not one byte more */
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_ACTIVATIONS, 4000, &x, &err), err);
    void *y = (void *)1;
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 1, &y, &err) == ZS_ERR_NOMEM);
    TEST_CHECK(y == NULL);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 0, &y, &err), err);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.held[ZS_SPACE_DEVICE] == 10000 && m.held_peak[ZS_SPACE_DEVICE] == 10000);
    /* freed bytes are available again */
    zs_dev_free(d, a);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, 6000, &a, &err), err);
    zs_dev_free(d, a), zs_dev_free(d, b), zs_dev_free(d, c), zs_dev_free(d, x), zs_dev_free(d, y);
    /* 4 threads race for 10 blocks of 1000 bytes: exactly 10 win */
    racer_t r[4];
    pthread_t th[4];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 4; i++) {
        r[i].d = d;
        TEST_CHECK(pthread_create(&th[i], NULL, racer, &r[i]) == 0);
    }
    int won = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        won += r[i].n;
    }
    zs_dev_mem_get(d, &m);
    TEST_CHECKF(won == 10 && m.held_peak[ZS_SPACE_DEVICE] == 10000,
                "%d blocks of 1000 bytes under a 10000-byte limit, held peak %llu", won,
                (unsigned long long)m.held_peak[ZS_SPACE_DEVICE]);
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < r[i].n; k++)
            zs_dev_free(d, r[i].p[k]);
    zs_dev_destroy(d);
    /* no limit: zs_dev_cpu_create's device takes the same block */
    TEST_OK(zs_dev_cpu_create(1, &d, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, 20000, &a, &err), err);
    zs_dev_free(d, a);
    zs_dev_destroy(d);
    TEST_CHECK(zs_dev_cpu_create_opts(NULL, &d, &err) == ZS_ERR_INVALID);
    printf("device memory limit: ok\n");
}

/* ---- the CPU device's own vector-op behaviour ------------------------------ */

/* Accumulate in place (dst == src doubles every element; the CUDA device
 * refuses it) and the CPU device's extra refusals: overlapping cast
 * buffers and element counts that overflow the address space. */
static void test_cpu_vec_extras(zs_dev_t *d)
{
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "extras", &s, &err), err);
    size_t n = 1000;
    float *ref = zs_devtest_rand_host(ZS_DTYPE_F32, n, 5, 1.0f);
    float *x = zs_devtest_h2d(d, s, ref, n * 4), *got = malloc(n * 4);
    TEST_OK(zs_dev_accumulate(s, x, ZS_DTYPE_F32, x, ZS_DTYPE_F32, n, &err), err);
    zs_devtest_d2h(s, got, x, n * 4);
    for (size_t i = 0; i < n; i++)
        TEST_CHECKF(got[i] == 2.0f * ref[i], "in-place accumulate differs at %zu", i);
    free(got);
    free(ref);
    zs_dev_free(d, x);

    float f[4];
    TEST_CHECK(zs_dev_cast(s, f, ZS_DTYPE_F32, f + 1, ZS_DTYPE_F32, 2, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_cast(s, f, ZS_DTYPE_F32, f + 2, ZS_DTYPE_F32, SIZE_MAX / 2, &err) ==
               ZS_ERR_RANGE);
    printf("  refused: %s\n", err.msg);
    zs_dev_stream_destroy(s);
    printf("accumulate in place, overlap and range refusals: ok\n");
}

static void test_vector(int threads)
{
    zs_dev_t *d;
    TEST_OK(zs_dev_cpu_create(threads, &d, &err), err);
    printf("vector ops on %s\n", d->desc);
    zs_devtest_vector(d, 1);
    test_cpu_vec_extras(d);
    zs_dev_mem_t m;
    zs_dev_mem_get(d, &m);
    for (int sp = 0; sp < ZS_NSPACES; sp++)
        TEST_CHECK(m.held[sp] == 0);
    zs_dev_destroy(d);
}

int main(void)
{
    zs_dev_t *d;
    TEST_CHECK(zs_dev_cpu_create(1, NULL, &err) == ZS_ERR_INVALID);
    TEST_OK(zs_dev_cpu_create(2, &d, &err), err);
    printf("device: %s\n", d->desc);
    TEST_CHECK(strcmp(d->vt->name, "cpu") == 0);
    test_accounting(d);
    zs_devtest_host_register(d);
    zs_devtest_streams(d, 10000);
    zs_dev_destroy(d);
    test_limit();
    test_vector(1);
    test_vector(3);
    printf("test_dev: all ok\n");
    return 0;
}
