/*
 * test_dev_cuda.c - the device interface on CUDA (worker/dev/zs_dev_cuda*.c):
 * the behaviours test_dev.c checks on the CPU device, through copies since
 * device memory is not host-addressable here, plus what only the CUDA device
 * has: the caching allocator (cached bytes, reuse only after the fence of
 * the streams that may still use a block, trim on allocation failure).
 *
 * Without a usable GPU it prints "SKIPPED: no GPU: <CUDA's reason>" and
 * exits 77 (ctest SKIP_RETURN_CODE), after checking that creating the
 * device fails cleanly with the same reason.
 *
 * Covers: accounting per space and category, cached/held figures, block
 * reuse and its fence, OOM with trim; in-order host functions; event
 * ordering across streams with a negative control (without the wait the
 * consumer sees the old value); never-recorded and re-recorded events;
 * sticky host-function errors through events, waits and syncs (both when
 * the failure is known at enqueue and when it happens behind a gate);
 * arguments copied at enqueue; memcpy/memset across spaces; destroy drains;
 * the vector ops against their CPU twins (cast/accumulate/scale/adamw
 * bitwise, sumsq within fp64 summation-order error, max error printed).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_adam.h"
#include "zs_cast.h"
#include "zs_dev.h"
#include "zs_dev_cuda.h"
#include "zs_rand.h"
#include "zs_test.h"

#include <cuda_runtime.h>

static zs_err_t err;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- host functions ----------------------------------------------------- */

static int fn_gate(void *args, zs_err_t *e)
{
    atomic_int *open = *(atomic_int **)args;
    while (!atomic_load(open))
        sleep_ms(1);
    return ZS_OK;
}

typedef struct {
    int *log;
    int *pos;
    int value;
} log_args_t;

static int fn_log(void *args, zs_err_t *e)
{
    log_args_t *a = args;
    a->log[(*a->pos)++] = a->value;
    return ZS_OK;
}

typedef struct {
    volatile int *dst;
    int value;
    int sleep_ms;
} write_args_t;

static int fn_write(void *args, zs_err_t *e)
{
    write_args_t *a = args;
    if (a->sleep_ms)
        sleep_ms(a->sleep_ms);
    *a->dst = a->value;
    return ZS_OK;
}

static int fn_sleep(void *args, zs_err_t *e)
{
    sleep_ms(*(int *)args);
    return ZS_OK;
}

static int fn_fail(void *args, zs_err_t *e)
{
    return zs_err_set(e, ZS_ERR_IO, "boom from a host function");
}

static void gate(zs_stream_t *s, atomic_int *open)
{
    TEST_OK(zs_dev_host_fn(s, fn_gate, &open, sizeof open, &err), err);
}

static void write_int(zs_stream_t *s, volatile int *dst, int value, int ms)
{
    write_args_t a = {dst, value, ms};
    TEST_OK(zs_dev_host_fn(s, fn_write, &a, sizeof a, &err), err);
}

/* Copy device bytes to the host and wait. */
static void d2h(zs_stream_t *s, void *host, const void *dev, size_t bytes)
{
    TEST_OK(zs_dev_memcpy(s, host, dev, bytes, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
}

/* A device copy of host bytes (category scratch). */
static void *h2d(zs_dev_t *d, zs_stream_t *s, const void *host, size_t bytes)
{
    void *p;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &p, &err), err);
    TEST_OK(zs_dev_memcpy(s, p, host, bytes, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    return p;
}

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
    void *x = (void *)1;
    TEST_CHECK(zs_dev_alloc(d, -1, ZS_MEM_PARAMS, 8, &x, &err) == ZS_ERR_INVALID && !x);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_NCATS, 8, &x, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_PARAMS, 8, NULL, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, SIZE_MAX, &x, &err) == ZS_ERR_NOMEM);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_PARAMS, SIZE_MAX / 2, &x, &err) ==
               ZS_ERR_NOMEM);
    zs_dev_mem_t m2;
    zs_dev_mem_get(d, &m2);
    TEST_CHECK(memcmp(&m, &m2, sizeof m) == 0);

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
    gate(s, &open);
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

/* ---- streams and events ------------------------------------------------------ */

static void test_order(zs_dev_t *d)
{
    enum { N = 2000 };
    int *log = calloc(N, sizeof *log);
    int pos = 0;
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "order", &s, &err), err);
    for (int i = 0; i < N; i++) {
        log_args_t a = {log, &pos, i};
        TEST_OK(zs_dev_host_fn(s, fn_log, &a, sizeof a, &err), err);
    }
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    TEST_CHECKF(pos == N, "%d of %d host functions ran", pos, N);
    for (int i = 0; i < N; i++)
        TEST_CHECKF(log[i] == i, "host function %d ran at position %d", log[i], i);
    zs_dev_stream_destroy(s);
    free(log);
    printf("order of %d host functions: ok\n", N);
}

/* Producer: 50 ms of host work, then sets buf to 2. Consumer: copies buf.
 * With the event wait it must see 2; without, 1 (streams run concurrently). */
static void test_cross_stream(zs_dev_t *d, int with_wait)
{
    zs_stream_t *prod, *cons;
    zs_event_t *ev;
    TEST_OK(zs_dev_stream_create(d, 0, "producer", &prod, &err), err);
    TEST_OK(zs_dev_stream_create(d, 1, "consumer", &cons, &err), err);
    TEST_OK(zs_dev_event_create(d, &ev, &err), err);
    unsigned char *buf, *out;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_COMM, 64, (void **)&buf, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_COMM, 64, (void **)&out, &err), err);
    TEST_OK(zs_dev_memset(prod, buf, 1, 64, &err), err);
    TEST_OK(zs_dev_stream_sync(prod, &err), err);
    int ms = 50;
    TEST_OK(zs_dev_host_fn(prod, fn_sleep, &ms, sizeof ms, &err), err);
    TEST_OK(zs_dev_memset(prod, buf, 2, 64, &err), err);
    TEST_OK(zs_dev_event_record(ev, prod, &err), err);
    if (with_wait)
        TEST_OK(zs_dev_stream_wait(cons, ev, &err), err);
    TEST_OK(zs_dev_memcpy(cons, out, buf, 64, &err), err);
    TEST_OK(zs_dev_stream_sync(cons, &err), err);
    int seen = out[63];
    TEST_OK(zs_dev_event_sync(ev, &err), err);
    TEST_CHECK(zs_dev_event_query(ev) == 1);
    if (with_wait)
        TEST_CHECKF(seen == 2, "consumer saw %d after waiting for the producer's event", seen);
    else
        TEST_CHECKF(seen == 1, "consumer saw %d without waiting: streams are not concurrent", seen);
    zs_dev_free(d, buf);
    zs_dev_free(d, out);
    zs_dev_event_destroy(ev);
    zs_dev_stream_destroy(prod);
    zs_dev_stream_destroy(cons);
    printf("cross-stream %s event wait: ok (consumer saw %d)\n", with_wait ? "with" : "without",
           seen);
}

static void test_never_recorded(zs_dev_t *d)
{
    zs_stream_t *s;
    zs_event_t *ev;
    TEST_OK(zs_dev_stream_create(d, 0, "never", &s, &err), err);
    TEST_OK(zs_dev_event_create(d, &ev, &err), err);
    TEST_CHECK(zs_dev_event_query(ev) == 1);
    TEST_OK(zs_dev_event_sync(ev, &err), err);
    volatile int x = 0;
    TEST_OK(zs_dev_stream_wait(s, ev, &err), err);
    write_int(s, &x, 5, 0);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    TEST_CHECK(x == 5);
    zs_dev_event_destroy(ev);
    zs_dev_stream_destroy(s);
    printf("never-recorded event: ok\n");
}

/* Record e behind a closed gate on A; B waits on it; re-record e on idle C:
 * e completes while B still waits for the old record. */
static void test_rerecord(zs_dev_t *d)
{
    zs_stream_t *a, *b, *c;
    zs_event_t *ev;
    TEST_OK(zs_dev_stream_create(d, 0, "A", &a, &err), err);
    TEST_OK(zs_dev_stream_create(d, 0, "B", &b, &err), err);
    TEST_OK(zs_dev_stream_create(d, 0, "C", &c, &err), err);
    TEST_OK(zs_dev_event_create(d, &ev, &err), err);
    atomic_int open = 0;
    unsigned char *buf, *out;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 16, (void **)&buf, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_SCRATCH, 16, (void **)&out, &err), err);
    TEST_OK(zs_dev_memset(c, buf, 0, 16, &err), err);
    TEST_OK(zs_dev_stream_sync(c, &err), err);
    gate(a, &open);
    TEST_OK(zs_dev_event_record(ev, a, &err), err);
    sleep_ms(20);
    TEST_CHECK(zs_dev_event_query(ev) == 0);
    TEST_OK(zs_dev_stream_wait(b, ev, &err), err);
    TEST_OK(zs_dev_memset(b, buf, 7, 16, &err), err);
    TEST_OK(zs_dev_event_record(ev, c, &err), err);
    TEST_OK(zs_dev_event_sync(ev, &err), err); /* the new point: C is idle */
    TEST_CHECK(zs_dev_event_query(ev) == 1);
    sleep_ms(30);
    TEST_OK(zs_dev_memcpy(c, out, buf, 16, &err), err);
    TEST_OK(zs_dev_stream_sync(c, &err), err);
    TEST_CHECKF(out[0] == 0, "B ran before the record it waited for (%d)", out[0]);
    atomic_store(&open, 1);
    TEST_OK(zs_dev_stream_sync(b, &err), err);
    d2h(c, out, buf, 16);
    TEST_CHECK(out[15] == 7);
    /* destroyed while its record is queued: the wait still holds */
    atomic_store(&open, 0);
    gate(a, &open);
    TEST_OK(zs_dev_event_record(ev, a, &err), err);
    TEST_OK(zs_dev_stream_wait(b, ev, &err), err);
    zs_dev_event_destroy(ev);
    atomic_store(&open, 1);
    TEST_OK(zs_dev_stream_sync(b, &err), err);
    TEST_OK(zs_dev_stream_sync(a, &err), err);
    zs_dev_free(d, buf);
    zs_dev_free(d, out);
    zs_dev_stream_destroy(a);
    zs_dev_stream_destroy(b);
    zs_dev_stream_destroy(c);
    printf("re-record: ok\n");
}

static void test_sticky(zs_dev_t *d)
{
    zs_stream_t *a, *b;
    zs_event_t *ev, *ev2;
    TEST_OK(zs_dev_stream_create(d, 0, "failing", &a, &err), err);
    TEST_OK(zs_dev_stream_create(d, 0, "waiter", &b, &err), err);
    TEST_OK(zs_dev_event_create(d, &ev, &err), err);
    TEST_OK(zs_dev_event_create(d, &ev2, &err), err);
    volatile int x = 0, y = 0, z = 0;
    unsigned char *buf, *out;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 64, (void **)&buf, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_SCRATCH, 64, (void **)&out, &err), err);
    TEST_OK(zs_dev_memset(a, buf, 0, 64, &err), err);
    TEST_OK(zs_dev_stream_sync(a, &err), err);

    /* 1. the failure happens behind a gate, after everything is enqueued:
     *    propagation at run time (host functions skipped, events and the
     *    waiting stream carry the error) */
    atomic_int open = 0;
    gate(a, &open);
    TEST_OK(zs_dev_host_fn(a, fn_fail, NULL, 0, &err), err);
    write_int(a, &x, 1, 0);                         /* skipped */
    TEST_OK(zs_dev_event_record(ev, a, &err), err); /* completes, carrying the error */
    TEST_OK(zs_dev_stream_wait(b, ev, &err), err);
    write_int(b, &y, 1, 0); /* skipped: b failed by waiting */
    TEST_OK(zs_dev_event_record(ev2, b, &err), err);
    atomic_store(&open, 1);
    zs_err_clear(&err);
    TEST_CHECK(zs_dev_event_sync(ev, &err) == ZS_ERR_IO);
    TEST_CHECKF(strstr(err.msg, "boom") && strstr(err.msg, "failing"), "%s", err.msg);
    TEST_CHECK(zs_dev_event_query(ev) == 1);
    zs_err_clear(&err);
    TEST_CHECK(zs_dev_event_sync(ev2, &err) == ZS_ERR_IO);
    TEST_CHECKF(strstr(err.msg, "boom") && strstr(err.msg, "waiter"), "%s", err.msg);
    printf("  event of the waiting stream: %s\n", err.msg);

    /* 2. the failure is known at enqueue: later work is skipped */
    TEST_OK(zs_dev_memset(a, buf, 0xff, 64, &err), err); /* skipped */
    TEST_OK(zs_dev_memset(b, buf, 0xee, 64, &err), err); /* skipped */
    zs_err_clear(&err);
    TEST_CHECK(zs_dev_stream_sync(b, &err) == ZS_ERR_IO);
    TEST_CHECK(strstr(err.msg, "boom"));
    zs_err_clear(&err);
    TEST_CHECK(zs_dev_stream_sync(a, &err) == ZS_ERR_IO);
    TEST_CHECKF(strstr(err.msg, "boom"), "%s", err.msg);
    printf("  stream sync: %s\n", err.msg);
    TEST_CHECK(x == 0 && y == 0);
    d2h(a, out, buf, 64);
    for (int i = 0; i < 64; i++)
        TEST_CHECKF(out[i] == 0, "skipped memset ran: byte %d is %#x", i, out[i]);

    /* cleared: both streams work again, and a new record is clean */
    TEST_OK(zs_dev_stream_sync(a, &err), err);
    TEST_OK(zs_dev_stream_sync(b, &err), err);
    write_int(a, &x, 2, 0);
    TEST_OK(zs_dev_event_record(ev, a, &err), err);
    TEST_OK(zs_dev_stream_wait(b, ev, &err), err);
    write_int(b, &z, 3, 0);
    TEST_OK(zs_dev_stream_sync(b, &err), err);
    TEST_OK(zs_dev_event_sync(ev, &err), err);
    TEST_CHECK(x == 2 && z == 3);

    /* 3. waiting on an event whose failed record already completed */
    TEST_OK(zs_dev_host_fn(a, fn_fail, NULL, 0, &err), err);
    TEST_OK(zs_dev_event_record(ev, a, &err), err);
    TEST_CHECK(zs_dev_event_sync(ev, &err) == ZS_ERR_IO);
    TEST_OK(zs_dev_stream_wait(b, ev, &err), err);
    TEST_CHECK(zs_dev_stream_sync(b, &err) == ZS_ERR_IO);
    TEST_CHECK(zs_dev_stream_sync(a, &err) == ZS_ERR_IO);

    zs_dev_free(d, buf);
    zs_dev_free(d, out);
    zs_dev_event_destroy(ev);
    zs_dev_event_destroy(ev2);
    zs_dev_stream_destroy(a);
    zs_dev_stream_destroy(b);
    printf("sticky errors: ok\n");
}

static void test_args_copied(zs_dev_t *d)
{
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "args", &s, &err), err);
    atomic_int open = 0;
    int log[2] = {0, 0}, pos = 0;
    gate(s, &open);
    log_args_t a = {log, &pos, 11};
    TEST_OK(zs_dev_host_fn(s, fn_log, &a, sizeof a, &err), err);
    a.value = 22;
    TEST_OK(zs_dev_host_fn(s, fn_log, &a, sizeof a, &err), err);
    a.value = 33;
    atomic_store(&open, 1);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    TEST_CHECKF(pos == 2 && log[0] == 11 && log[1] == 22, "log %d %d", log[0], log[1]);
    unsigned char big[ZS_DEV_MAX_ARGS + 1] = {0};
    TEST_CHECK(zs_dev_host_fn(s, fn_log, big, sizeof big, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_host_fn(s, NULL, NULL, 0, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_host_fn(s, fn_log, NULL, 8, &err) == ZS_ERR_INVALID);
    zs_dev_stream_destroy(s);
    printf("host fn args copied: ok\n");
}

static void test_copy_set(zs_dev_t *d)
{
    enum { N = 100000 };
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "copy", &s, &err), err);
    unsigned char *dv, *pin, *host;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_COMM, N, (void **)&dv, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_PINNED, ZS_MEM_COMM, N, (void **)&pin, &err), err);
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_COMM, N, (void **)&host, &err), err);
    for (int i = 0; i < N; i++)
        host[i] = (unsigned char)(i * 7 + 3);
    TEST_OK(zs_dev_memset(s, dv, 0xab, N, &err), err);
    TEST_OK(zs_dev_memcpy(s, pin, dv, N, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    for (int i = 0; i < N; i++)
        TEST_CHECK(pin[i] == 0xab);
    TEST_OK(zs_dev_memcpy(s, dv, host, N, &err), err);
    TEST_OK(zs_dev_memcpy(s, pin + 1, dv + 2, N - 2, &err), err);
    TEST_OK(zs_dev_memset(s, pin, 0, 1, &err), err); /* pinned: set in stream order */
    TEST_OK(zs_dev_memcpy(s, pin, dv, 0, &err), err);
    TEST_OK(zs_dev_memset(s, NULL, 0, 0, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    TEST_CHECK(pin[0] == 0 && pin[N - 1] == 0xab);
    for (int i = 1; i < N - 1; i++)
        TEST_CHECK(pin[i] == host[i + 1]);
    /* device to device, then to pageable host; memset of pageable host */
    unsigned char *dv2;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_COMM, N, (void **)&dv2, &err), err);
    TEST_OK(zs_dev_memcpy(s, dv2, dv, N, &err), err);
    TEST_OK(zs_dev_memset(s, host, 0x11, N, &err), err);
    TEST_OK(zs_dev_memcpy(s, host, dv2, N / 2, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    for (int i = 0; i < N / 2; i++)
        TEST_CHECK(host[i] == (unsigned char)(i * 7 + 3));
    for (int i = N / 2; i < N; i++)
        TEST_CHECK(host[i] == 0x11);
    TEST_CHECK(zs_dev_memcpy(s, NULL, dv, 4, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_memcpy(s, dv, NULL, 4, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_memset(s, NULL, 0, 4, &err) == ZS_ERR_INVALID);
    zs_dev_free(d, dv);
    zs_dev_free(d, dv2);
    zs_dev_free(d, pin);
    zs_dev_free(d, host);
    zs_dev_stream_destroy(s);
    printf("memcpy/memset: ok\n");
}

static void test_destroy_drains(zs_dev_t *d)
{
    enum { N = 200 };
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "drain", &s, &err), err);
    int log[N], pos = 0;
    volatile int x = 0;
    write_int(s, &x, 1, 30);
    for (int i = 0; i < N; i++) {
        log_args_t a = {log, &pos, i};
        TEST_OK(zs_dev_host_fn(s, fn_log, &a, sizeof a, &err), err);
    }
    zs_dev_stream_destroy(s);
    TEST_CHECKF(x == 1 && pos == N, "x=%d, %d of %d host functions ran", x, pos, N);
    printf("destroy drains: ok\n");
}

/* ---- vector ops against the CPU twins -------------------------------------------- */

static const zs_dtype_t DTS[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};

static float ld(zs_dtype_t dt, const void *p, size_t i)
{
    if (dt == ZS_DTYPE_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == ZS_DTYPE_BF16 ? zs_bf16_to_f32(h) : zs_f16_to_f32(h);
}

static void st(zs_dtype_t dt, void *p, size_t i, float x)
{
    if (dt == ZS_DTYPE_F32)
        ((float *)p)[i] = x;
    else
        ((uint16_t *)p)[i] = dt == ZS_DTYPE_BF16 ? zs_f32_to_bf16(x) : zs_f32_to_f16(x);
}

/* n random host values of dt in [-scale, scale). Free with free(). */
static void *rand_host(zs_dtype_t dt, size_t n, uint64_t seed, float scale)
{
    void *p = malloc(n * zs_dtype_size(dt) + 1);
    for (size_t i = 0; i < n; i++)
        st(dt, p, i, scale * zs_rand_unit(seed, i));
    return p;
}

static long first_diff(const void *a, const void *b, size_t n, size_t elem)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem))
            return (long)i;
    return -1;
}

static const size_t NS[] = {0, 1, 7, 255, 256, 257, 1000, 3 * 32768 + 129};
#define NNS (sizeof NS / sizeof NS[0])

static void test_cast_acc_scale(zs_dev_t *d, zs_stream_t *s)
{
    int cases = 0;
    for (size_t k = 0; k < NNS; k++) {
        size_t n = NS[k];
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) {
                zs_dtype_t ddt = DTS[a], sdt = DTS[b];
                size_t dsz = zs_dtype_size(ddt), bytes = n * dsz;
                void *hsrc = rand_host(sdt, n, 100 + k, 3.0f);
                void *hdst = rand_host(ddt, n, 200 + k, 2.0f);
                void *got = malloc(bytes + 1), *ref = malloc(bytes + 1);
                void *src = h2d(d, s, hsrc, n * zs_dtype_size(sdt));
                void *dst = h2d(d, s, hdst, bytes);
                TEST_OK(zs_dev_cast(s, dst, ddt, src, sdt, n, &err), err);
                d2h(s, got, dst, bytes);
                for (size_t i = 0; i < n; i++)
                    st(ddt, ref, i, ld(sdt, hsrc, i));
                long bad = first_diff(got, ref, n, dsz);
                TEST_CHECKF(bad < 0, "cast %s->%s n=%zu differs at %ld", zs_dtype_name(sdt),
                            zs_dtype_name(ddt), n, bad);
                /* accumulate onto fresh values: one fp32 sum, one rounding */
                TEST_OK(zs_dev_memcpy(s, dst, hdst, bytes, &err), err);
                TEST_OK(zs_dev_accumulate(s, dst, ddt, src, sdt, n, &err), err);
                d2h(s, got, dst, bytes);
                for (size_t i = 0; i < n; i++)
                    st(ddt, ref, i, ld(ddt, hdst, i) + ld(sdt, hsrc, i));
                bad = first_diff(got, ref, n, dsz);
                TEST_CHECKF(bad < 0, "accumulate %s+=%s n=%zu differs at %ld", zs_dtype_name(ddt),
                            zs_dtype_name(sdt), n, bad);
                if (b == 0) {
                    float alpha = -0.37f;
                    TEST_OK(zs_dev_scale(s, dst, ddt, alpha, n, &err), err);
                    d2h(s, got, dst, bytes);
                    for (size_t i = 0; i < n; i++)
                        st(ddt, ref, i, ld(ddt, ref, i) * alpha);
                    bad = first_diff(got, ref, n, dsz);
                    TEST_CHECKF(bad < 0, "scale %s n=%zu differs at %ld", zs_dtype_name(ddt), n,
                                bad);
                }
                free(hsrc);
                free(hdst);
                free(got);
                free(ref);
                zs_dev_free(d, src);
                zs_dev_free(d, dst);
                cases++;
            }
    }
    TEST_CHECK(zs_dev_scale(s, NULL, ZS_DTYPE_F32, 1.0f, 2, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    printf("cast/accumulate/scale: %d cases bitwise equal to the CPU twins (max error 0)\n", cases);
}

static void test_sumsq(zs_dev_t *d, zs_stream_t *s)
{
    double *acc, hacc[2], maxrel = 0.0;
    TEST_OK(
        zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 2 * sizeof(double), (void **)&acc, &err),
        err);
    for (size_t k = 0; k < NNS; k++) {
        size_t n = NS[k];
        for (int a = 0; a < 3; a++) {
            zs_dtype_t dt = DTS[a];
            void *hx = rand_host(dt, n, 400 + k, 10.0f);
            void *x = h2d(d, s, hx, n * zs_dtype_size(dt));
            double init[2] = {0.25, 0.0};
            TEST_OK(zs_dev_memcpy(s, acc, init, sizeof init, &err), err);
            TEST_OK(zs_dev_sumsq(s, x, dt, n, acc, &err), err);
            TEST_OK(zs_dev_sumsq(s, x, dt, n, acc, &err), err); /* accumulates */
            d2h(s, hacc, acc, sizeof hacc);
            double r = 0.0;
            for (size_t i = 0; i < n; i++) {
                float v = ld(dt, hx, i);
                r += (double)v * v;
            }
            double want = 0.25 + r + r, rel = fabs(hacc[0] - want) / want;
            if (rel > maxrel)
                maxrel = rel;
            /* fp64 sums of <= 1e5 terms in another order: ~1e-13 relative */
            TEST_CHECKF(rel <= 1e-12, "sumsq %s n=%zu: %.17g, want %.17g", zs_dtype_name(dt), n,
                        hacc[0], want);
            TEST_CHECK(hacc[1] == 0.0);
            if (n >= 7) {
                st(dt, hx, n / 2, k % 2 ? INFINITY : NAN);
                TEST_OK(zs_dev_memcpy(s, x, hx, n * zs_dtype_size(dt), &err), err);
                TEST_OK(zs_dev_memset(s, acc, 0, sizeof hacc, &err), err);
                TEST_OK(zs_dev_sumsq(s, x, dt, n, acc, &err), err);
                d2h(s, hacc, acc, sizeof hacc);
                TEST_CHECKF(hacc[1] == 1.0, "sumsq %s n=%zu: non-finite not flagged",
                            zs_dtype_name(dt), n);
                TEST_CHECK(!isfinite(hacc[0]));
            }
            free(hx);
            zs_dev_free(d, x);
        }
    }
    zs_dev_free(d, acc);
    printf("sumsq: max relative error %.3g vs the fp64 CPU sum (tolerance 1e-12), non-finite "
           "flagged\n",
           maxrel);
}

static void test_adamw(zs_dev_t *d, zs_stream_t *s)
{
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    zs_adam_step_t stp = {2e-3f, 3, 0.5f, 0.8f};
    const zs_dtype_t ODTS[4] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16, ZS_DTYPE_NONE};
    const size_t ns[] = {0, 1, 257, 3 * 32768 + 129};
    int cases = 0;
    for (size_t k = 0; k < 4; k++) {
        size_t n = ns[k];
        for (int g = 0; g < 3; g++)
            for (int o = 0; o < 4; o++) {
                zs_dtype_t gdt = DTS[g], odt = ODTS[o];
                size_t osz = zs_dtype_size(odt);
                float *rp = rand_host(ZS_DTYPE_F32, n, 500 + k, 1.0f);
                float *rm = rand_host(ZS_DTYPE_F32, n, 600 + k, 0.1f);
                float *rv = rand_host(ZS_DTYPE_F32, n, 700 + k, 0.01f);
                for (size_t i = 0; i < n; i++)
                    rv[i] = fabsf(rv[i]);
                void *hg = rand_host(gdt, n, 800 + k, 4.0f);
                void *rout = odt == ZS_DTYPE_NONE ? NULL : rand_host(odt, n, 900, 1.0f);
                float *p = h2d(d, s, rp, n * 4), *m = h2d(d, s, rm, n * 4),
                      *v = h2d(d, s, rv, n * 4);
                void *gr = h2d(d, s, hg, n * zs_dtype_size(gdt));
                void *out = rout ? h2d(d, s, rout, n * osz) : NULL;
                hp.adam_w_mode = (int)(k + g) % 2;
                TEST_OK(zs_dev_adamw(s, &hp, &stp, p, m, v, gr, gdt, out, odt, n, &err), err);
                zs_adam_update_ref(&hp, &stp, rp, rm, rv, hg, gdt, rout, odt, n);
                float *got = malloc(n * 4 + 1);
                void *gout = malloc(n * 4 + 1);
                long bad = -1;
                float *const dv[3] = {p, m, v}, *const hv[3] = {rp, rm, rv};
                for (int j = 0; j < 3 && bad < 0; j++) {
                    d2h(s, got, dv[j], n * 4);
                    bad = first_diff(got, hv[j], n, 4);
                }
                if (bad < 0 && out) {
                    d2h(s, gout, out, n * osz);
                    bad = first_diff(gout, rout, n, osz);
                }
                TEST_CHECKF(bad < 0, "adamw grad %s out %s n=%zu differs at %ld",
                            zs_dtype_name(gdt), zs_dtype_name(odt), n, bad);
                free(got);
                free(gout);
                free(rp);
                free(rm);
                free(rv);
                free(hg);
                free(rout);
                zs_dev_free(d, p);
                zs_dev_free(d, m);
                zs_dev_free(d, v);
                zs_dev_free(d, gr);
                zs_dev_free(d, out);
                cases++;
            }
    }
    printf("adamw: %d cases bitwise equal to zs_adam_update_ref (max error 0)\n", cases);
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
    }
    printf("ZS_CUDA_CHECK: %s\n", e.msg);
}

int main(void)
{
    char why[256];
    zs_dev_t *d = NULL;
    int ngpu = zs_dev_cuda_available(why, sizeof why);
    test_check_macro(ngpu > 0);
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
    test_order(d);
    test_cross_stream(d, 1);
    test_cross_stream(d, 0);
    test_never_recorded(d);
    test_rerecord(d);
    test_sticky(d);
    test_args_copied(d);
    test_copy_set(d);
    test_destroy_drains(d);
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "compute", &s, &err), err);
    test_cast_acc_scale(d, s);
    test_sumsq(d, s);
    test_adamw(d, s);
    zs_dev_stream_destroy(s);
    zs_dev_mem_t m;
    zs_dev_mem_get(d, &m);
    for (int sp = 0; sp < ZS_NSPACES; sp++)
        TEST_CHECK(sum_cur(&m, sp) == 0);
    zs_dev_destroy(d);
    printf("test_dev_cuda: all passed\n");
    return 0;
}
