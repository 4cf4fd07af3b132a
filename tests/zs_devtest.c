/*
 * zs_devtest.c - the device-behaviour checks shared by test_dev.c and
 * test_dev_cuda.c (see zs_devtest.h): one body, run against the CPU device
 * in every CI run and against the CUDA device where there is a GPU.
 *
 * Device memory is only ever reached through zs_dev_memcpy/zs_dev_memset
 * (pinned memory is host-addressable on every device), so nothing here
 * depends on the CPU device's memory being RAM. Timing-dependent checks use
 * gates (a host function that blocks until the test releases it) rather
 * than sleeps wherever they can; the sleeps left only make a wrong order
 * more likely to show, never decide a correct outcome.
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
#include "zs_devtest.h"
#include "zs_rand.h"
#include "zs_test.h"

static zs_err_t err;

void zs_devtest_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- host functions used by the checks ------------------------------------ */

/* Blocks its stream until *open becomes 1; gives up after 10 s. */
static int fn_gate(void *args, zs_err_t *e)
{
    atomic_int *open = *(atomic_int **)args;
    for (int ms = 0; !atomic_load(open); ms++) {
        if (ms == 10000)
            return zs_err_set(e, ZS_ERR_TIMEOUT, "gate not opened within 10 s");
        zs_devtest_sleep_ms(1);
    }
    return ZS_OK;
}

typedef struct {
    int *log;
    int *pos;
    int value;
} log_args_t;

/* Appends value to log (the stream's host functions are the only writers). */
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

/* Sleeps, then writes value (to host memory). */
static int fn_write(void *args, zs_err_t *e)
{
    write_args_t *a = args;
    if (a->sleep_ms)
        zs_devtest_sleep_ms(a->sleep_ms);
    *a->dst = a->value;
    return ZS_OK;
}

/* Sleeps *(int *)args milliseconds. */
static int fn_sleep(void *args, zs_err_t *e)
{
    zs_devtest_sleep_ms(*(int *)args);
    return ZS_OK;
}

static int fn_fail(void *args, zs_err_t *e)
{
    return zs_err_set(e, ZS_ERR_IO, "boom from a host function");
}

void zs_devtest_gate(zs_stream_t *s, atomic_int *open)
{
    TEST_OK(zs_dev_host_fn(s, fn_gate, &open, sizeof open, &err), err);
}

void zs_devtest_hold(zs_stream_t *s, int ms)
{
    TEST_OK(zs_dev_host_fn(s, fn_sleep, &ms, sizeof ms, &err), err);
}

static void write_int(zs_stream_t *s, volatile int *dst, int value, int ms)
{
    write_args_t a = {dst, value, ms};
    TEST_OK(zs_dev_host_fn(s, fn_write, &a, sizeof a, &err), err);
}

void zs_devtest_d2h(zs_stream_t *s, void *host, const void *dev, size_t bytes)
{
    TEST_OK(zs_dev_memcpy(s, host, dev, bytes, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
}

void *zs_devtest_h2d(zs_dev_t *d, zs_stream_t *s, const void *host, size_t bytes)
{
    void *p;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &p, &err), err);
    TEST_OK(zs_dev_memcpy(s, p, host, bytes, &err), err);
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    return p;
}

/* ---- values ------------------------------------------------------------------ */

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

void *zs_devtest_rand_host(zs_dtype_t dt, size_t n, uint64_t seed, float scale)
{
    void *p = malloc(n * zs_dtype_size(dt) + 1);
    for (size_t i = 0; i < n; i++)
        st(dt, p, i, scale * zs_rand_unit(seed, i));
    return p;
}

/* Index of the first differing element (elem bytes each), or -1. */
static long first_diff(const void *a, const void *b, size_t n, size_t elem)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem))
            return (long)i;
    return -1;
}

/* ---- memory ------------------------------------------------------------------- */

void zs_devtest_alloc_refused(zs_dev_t *d)
{
    zs_dev_mem_t m, m2;
    zs_dev_mem_get(d, &m);
    void *x = (void *)1;
    TEST_CHECK(zs_dev_alloc(d, -1, ZS_MEM_PARAMS, 8, &x, &err) == ZS_ERR_INVALID && !x);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_alloc(d, ZS_NSPACES, ZS_MEM_PARAMS, 8, &x, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_NCATS, 8, &x, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, -1, 8, &x, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_PARAMS, 8, NULL, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, SIZE_MAX, &x, &err) == ZS_ERR_NOMEM);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_PARAMS, SIZE_MAX, &x, &err) == ZS_ERR_NOMEM);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_PARAMS, SIZE_MAX - 64, &x, &err) ==
               ZS_ERR_NOMEM);
    TEST_CHECK(zs_dev_alloc(d, ZS_SPACE_HOST, ZS_MEM_PARAMS, SIZE_MAX / 2, &x, &err) ==
               ZS_ERR_NOMEM);
    printf("  refused: %s\n", err.msg);
    zs_dev_mem_get(d, &m2);
    TEST_CHECK(memcmp(&m, &m2, sizeof m) == 0);
}

void zs_devtest_host_register(zs_dev_t *d)
{
    const size_t page = 4096, bytes = 3 * page;
    zs_dev_mem_t m0, m;
    zs_dev_mem_get(d, &m0);
    unsigned char *h = aligned_alloc(page, bytes + page), *back = malloc(bytes);
    TEST_CHECK(h && back);
    TEST_OK(zs_dev_host_register(d, h, bytes, ZS_MEM_COMM, &err), err);
    zs_dev_mem_get(d, &m);
    TEST_CHECKF(
        m.cur[ZS_SPACE_PINNED][ZS_MEM_COMM] == m0.cur[ZS_SPACE_PINNED][ZS_MEM_COMM] + bytes &&
            m.held[ZS_SPACE_PINNED] == m0.held[ZS_SPACE_PINNED] + bytes &&
            m.peak[ZS_SPACE_PINNED][ZS_MEM_COMM] >= bytes && m.nallocs == m0.nallocs,
        "registered %zu bytes: pinned comm %llu -> %llu, held %llu -> %llu", bytes,
        (unsigned long long)m0.cur[ZS_SPACE_PINNED][ZS_MEM_COMM],
        (unsigned long long)m.cur[ZS_SPACE_PINNED][ZS_MEM_COMM],
        (unsigned long long)m0.held[ZS_SPACE_PINNED], (unsigned long long)m.held[ZS_SPACE_PINNED]);
    /* refusals change nothing */
    TEST_CHECK(zs_dev_host_register(d, h + page, page, ZS_MEM_COMM, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_host_register(d, NULL, page, ZS_MEM_COMM, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_host_register(d, h + bytes, 0, ZS_MEM_COMM, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_host_register(d, h + bytes, page, ZS_MEM_NCATS, &err) == ZS_ERR_INVALID);
    zs_dev_mem_t m2;
    zs_dev_mem_get(d, &m2);
    TEST_CHECK(memcmp(&m, &m2, sizeof m) == 0);
    /* copies through it: host -> device -> registered -> device -> host */
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "registered", &s, &err), err);
    unsigned char *src = zs_devtest_rand_host(ZS_DTYPE_F32, bytes / 4, 91, 1.0f);
    void *x = zs_devtest_h2d(d, s, src, bytes), *y = NULL;
    TEST_OK(zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, bytes, &y, &err), err);
    memset(h, 0, bytes);
    TEST_OK(zs_dev_memcpy(s, h, x, bytes, &err), err);
    TEST_OK(zs_dev_memcpy(s, y, h, bytes, &err), err);
    zs_devtest_d2h(s, back, y, bytes);
    TEST_CHECK(memcmp(h, src, bytes) == 0 && memcmp(back, src, bytes) == 0);
    zs_dev_free(d, x);
    zs_dev_free(d, y);
    zs_dev_stream_destroy(s);
    zs_dev_host_unregister(d, h + page); /* not a registration: ignored */
    zs_dev_host_unregister(d, NULL);
    zs_dev_host_unregister(d, h);
    zs_dev_mem_get(d, &m);
    TEST_CHECK(m.cur[ZS_SPACE_PINNED][ZS_MEM_COMM] == m0.cur[ZS_SPACE_PINNED][ZS_MEM_COMM] &&
               m.held[ZS_SPACE_PINNED] == m0.held[ZS_SPACE_PINNED]);
    /* registered again after its end: the range is free */
    TEST_OK(zs_dev_host_register(d, h, bytes, ZS_MEM_ACTIVATIONS, &err), err);
    zs_dev_host_unregister(d, h);
    printf("  host register: %zu bytes counted as pinned while registered, copies through it\n",
           bytes);
    free(src);
    free(back);
    free(h);
}

/* ---- streams and events ------------------------------------------------------- */

static void test_order(zs_dev_t *d, int n)
{
    int *log = calloc(n, sizeof *log);
    int pos = 0;
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "order", &s, &err), err);
    for (int i = 0; i < n; i++) {
        log_args_t a = {log, &pos, i};
        TEST_OK(zs_dev_host_fn(s, fn_log, &a, sizeof a, &err), err);
    }
    TEST_OK(zs_dev_stream_sync(s, &err), err);
    TEST_CHECKF(pos == n, "%d of %d host functions ran", pos, n);
    for (int i = 0; i < n; i++)
        TEST_CHECKF(log[i] == i, "host function %d ran at position %d", log[i], i);
    zs_dev_stream_destroy(s);
    free(log);
    printf("order of %d host functions: ok\n", n);
}

/* The producer stream waits at a gate, sleeps 20 ms, sets the 64 device
 * bytes of buf (old value 1) to 2, then records ev; the consumer stream
 * copies buf to pinned memory.
 *   with the wait: the consumer must not copy while the gate is closed, and
 *     sees 2 once it opens;
 *   without it (negative control): the consumer's copy completes while the
 *     producer is still held at the gate, so it sees the old 1. This proves
 *     streams run concurrently: a missing wait gives a wrong result.
 * No sleeps decide the outcome, so the check holds on a loaded machine (and
 * has no data race for ThreadSanitizer). */
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
    memset(out, 0, 64); /* pinned memory is host-addressable */
    TEST_OK(zs_dev_memset(prod, buf, 1, 64, &err), err);
    TEST_OK(zs_dev_stream_sync(prod, &err), err);
    atomic_int open = 0;
    zs_devtest_gate(prod, &open);
    int ms = 20;
    TEST_OK(zs_dev_host_fn(prod, fn_sleep, &ms, sizeof ms, &err), err);
    TEST_OK(zs_dev_memset(prod, buf, 2, 64, &err), err);
    TEST_OK(zs_dev_event_record(ev, prod, &err), err);
    if (with_wait)
        TEST_OK(zs_dev_stream_wait(cons, ev, &err), err);
    TEST_OK(zs_dev_memcpy(cons, out, buf, 64, &err), err);
    if (with_wait) {
        zs_devtest_sleep_ms(20);
        TEST_CHECKF(((volatile unsigned char *)out)[63] == 0,
                    "consumer copied before the producer's event");
        TEST_CHECK(zs_dev_event_query(ev) == 0);
        atomic_store(&open, 1);
    }
    TEST_OK(zs_dev_stream_sync(cons, &err), err);
    int seen = out[63];
    if (!with_wait) /* the producer is still held at its gate */
        TEST_CHECKF(zs_dev_event_query(ev) == 0, "consumer finished only after the producer");
    atomic_store(&open, 1);
    TEST_OK(zs_dev_event_sync(ev, &err), err);
    if (with_wait)
        TEST_CHECKF(seen == 2, "consumer saw %d after waiting for the producer's event", seen);
    else
        TEST_CHECKF(seen == 1, "consumer saw %d without waiting: streams are not concurrent", seen);
    TEST_CHECK(zs_dev_event_query(ev) == 1);
    zs_devtest_d2h(prod, out, buf, 64);
    TEST_CHECK(out[0] == 2 && out[63] == 2);
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

/* Record e behind a closed gate on A; B waits on that record; re-record e
 * on idle C: e completes (the new point) while B still waits for the old
 * record, and runs only when the gate opens. */
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
    zs_devtest_gate(a, &open);
    TEST_OK(zs_dev_event_record(ev, a, &err), err);
    zs_devtest_sleep_ms(20);
    TEST_CHECK(zs_dev_event_query(ev) == 0);
    TEST_OK(zs_dev_stream_wait(b, ev, &err), err);
    TEST_OK(zs_dev_memset(b, buf, 7, 16, &err), err);
    TEST_OK(zs_dev_event_record(ev, c, &err), err);
    TEST_OK(zs_dev_event_sync(ev, &err), err); /* the new point: C is idle */
    TEST_CHECK(zs_dev_event_query(ev) == 1);
    zs_devtest_sleep_ms(30);
    zs_devtest_d2h(c, out, buf, 16);
    TEST_CHECKF(out[0] == 0, "B ran before the record it waited for (%d)", out[0]);
    atomic_store(&open, 1);
    TEST_OK(zs_dev_stream_sync(b, &err), err);
    zs_devtest_d2h(c, out, buf, 16);
    TEST_CHECK(out[15] == 7);
    /* re-record on A behind a new gate: the event is pending again */
    atomic_store(&open, 0);
    zs_devtest_gate(a, &open);
    TEST_OK(zs_dev_event_record(ev, a, &err), err);
    zs_devtest_sleep_ms(10);
    TEST_CHECK(zs_dev_event_query(ev) == 0);
    atomic_store(&open, 1);
    TEST_OK(zs_dev_event_sync(ev, &err), err);
    TEST_CHECK(zs_dev_event_query(ev) == 1);
    /* an event destroyed while its record is queued: the record still runs
     * and the wait on it still holds */
    atomic_store(&open, 0);
    zs_devtest_gate(a, &open);
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
     *    waiting stream carry the error). Kernels and copies enqueued
     *    before a failure is known may still run on CUDA (zs_dev_cuda.c),
     *    so none are enqueued here. */
    atomic_int open = 0;
    zs_devtest_gate(a, &open);
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
    zs_devtest_d2h(a, out, buf, 64);
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

    /* 3. waiting on an event whose failed record already completed fails too */
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
    zs_devtest_gate(s, &open);
    log_args_t a = {log, &pos, 11};
    TEST_OK(zs_dev_host_fn(s, fn_log, &a, sizeof a, &err), err);
    a.value = 22; /* the queued host function must keep 11 */
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
    TEST_OK(zs_dev_memset(s, pin, 0, 1, &err), err);  /* pinned: set in stream order */
    TEST_OK(zs_dev_memcpy(s, pin, dv, 0, &err), err); /* zero bytes: nothing */
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

/* Destroy with work still queued behind a slow host function: all of it
 * runs, in order. */
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
    for (int i = 0; i < N; i++)
        TEST_CHECK(log[i] == i);
    printf("destroy drains: ok\n");
}

void zs_devtest_streams(zs_dev_t *d, int order_n)
{
    test_order(d, order_n);
    test_cross_stream(d, 1);
    test_cross_stream(d, 0);
    test_never_recorded(d);
    test_rerecord(d);
    test_sticky(d);
    test_args_copied(d);
    test_copy_set(d);
    test_destroy_drains(d);
}

/* ---- vector ops ------------------------------------------------------------------ */

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
                void *hsrc = zs_devtest_rand_host(sdt, n, 100 + k, 3.0f);
                void *hdst = zs_devtest_rand_host(ddt, n, 200 + k, 2.0f);
                void *got = malloc(bytes + 1), *ref = malloc(bytes + 1);
                void *src = zs_devtest_h2d(d, s, hsrc, n * zs_dtype_size(sdt));
                void *dst = zs_devtest_h2d(d, s, hdst, bytes);
                /* cast */
                TEST_OK(zs_dev_cast(s, dst, ddt, src, sdt, n, &err), err);
                zs_devtest_d2h(s, got, dst, bytes);
                for (size_t i = 0; i < n; i++)
                    st(ddt, ref, i, ld(sdt, hsrc, i));
                long bad = first_diff(got, ref, n, dsz);
                TEST_CHECKF(bad < 0, "cast %s->%s n=%zu differs at %ld", zs_dtype_name(sdt),
                            zs_dtype_name(ddt), n, bad);
                /* accumulate onto fresh values: one fp32 sum, one rounding */
                TEST_OK(zs_dev_memcpy(s, dst, hdst, bytes, &err), err);
                TEST_OK(zs_dev_accumulate(s, dst, ddt, src, sdt, n, &err), err);
                zs_devtest_d2h(s, got, dst, bytes);
                for (size_t i = 0; i < n; i++)
                    st(ddt, ref, i, ld(ddt, hdst, i) + ld(sdt, hsrc, i));
                bad = first_diff(got, ref, n, dsz);
                TEST_CHECKF(bad < 0, "accumulate %s+=%s n=%zu differs at %ld", zs_dtype_name(ddt),
                            zs_dtype_name(sdt), n, bad);
                /* scale (once per dtype) */
                if (b == 0) {
                    float alpha = -0.37f;
                    TEST_OK(zs_dev_scale(s, dst, ddt, alpha, n, &err), err);
                    zs_devtest_d2h(s, got, dst, bytes);
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
    /* refused by every device, before any buffer is touched */
    float f[4];
    TEST_CHECK(zs_dev_cast(s, f, ZS_DTYPE_NONE, f + 2, ZS_DTYPE_F32, 2, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_accumulate(s, f, ZS_DTYPE_F32, f + 2, (zs_dtype_t)9, 2, &err) ==
               ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_scale(s, NULL, ZS_DTYPE_F32, 1.0f, 2, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    printf("cast/accumulate/scale: %d cases bitwise equal to the scalar references (max error "
           "0)\n",
           cases);
}

static void test_sumsq(zs_dev_t *d, zs_stream_t *s, int bitwise)
{
    double *acc, hacc[2], maxrel = 0.0;
    TEST_OK(
        zs_dev_alloc(d, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, 2 * sizeof(double), (void **)&acc, &err),
        err);
    for (size_t k = 0; k < NNS; k++) {
        size_t n = NS[k];
        for (int a = 0; a < 3; a++) {
            zs_dtype_t dt = DTS[a];
            void *hx = zs_devtest_rand_host(dt, n, 400 + k, 10.0f);
            void *x = zs_devtest_h2d(d, s, hx, n * zs_dtype_size(dt));
            double init[2] = {0.25, 0.0};
            TEST_OK(zs_dev_memcpy(s, acc, init, sizeof init, &err), err);
            TEST_OK(zs_dev_sumsq(s, x, dt, n, acc, &err), err);
            TEST_OK(zs_dev_sumsq(s, x, dt, n, acc, &err), err); /* accumulates */
            zs_devtest_d2h(s, hacc, acc, sizeof hacc);
            /* the documented order: chunks of 32768 in order, 8 lanes each */
            double r = 0.0;
            long double exact = 0.0L;
            for (size_t c = 0; c < n; c += 32768) {
                double lane[8] = {0}, cs = 0.0;
                for (size_t i = c; i < n && i < c + 32768; i++) {
                    float v = ld(dt, hx, i);
                    lane[(i - c) & 7] += (double)v * v;
                    exact += (long double)v * v;
                }
                for (int l = 0; l < 8; l++)
                    cs += lane[l];
                r += cs;
            }
            double want = 0.25 + r + r, rel = fabs(hacc[0] - want) / want;
            if (rel > maxrel)
                maxrel = rel;
            /* bitwise in the documented order; other fp64 orders of <= 1e5
             * terms: ~1e-13 relative */
            TEST_CHECKF(bitwise ? hacc[0] == want : rel <= 1e-12,
                        "sumsq %s n=%zu: %.17g, want %.17g", zs_dtype_name(dt), n, hacc[0], want);
            double rref = fabs(r - (double)exact) / (exact > 0 ? (double)exact : 1.0);
            TEST_CHECKF(rref < 1e-13, "sumsq %s n=%zu: reference off long double by %.3g",
                        zs_dtype_name(dt), n, rref);
            TEST_CHECK(hacc[1] == 0.0);
            /* one non-finite element sets the flag */
            if (n >= 7) {
                st(dt, hx, n / 2, k % 2 ? INFINITY : NAN);
                TEST_OK(zs_dev_memcpy(s, x, hx, n * zs_dtype_size(dt), &err), err);
                TEST_OK(zs_dev_memset(s, acc, 0, sizeof hacc, &err), err);
                TEST_OK(zs_dev_sumsq(s, x, dt, n, acc, &err), err);
                zs_devtest_d2h(s, hacc, acc, sizeof hacc);
                TEST_CHECKF(hacc[1] == 1.0, "sumsq %s n=%zu: non-finite not flagged",
                            zs_dtype_name(dt), n);
                TEST_CHECK(!isfinite(hacc[0]));
            }
            free(hx);
            zs_dev_free(d, x);
        }
    }
    /* the flag is never cleared by a finite call */
    float ok[3] = {1, 2, 3};
    float *dok = zs_devtest_h2d(d, s, ok, sizeof ok);
    double init[2] = {0.0, 1.0};
    TEST_OK(zs_dev_memcpy(s, acc, init, sizeof init, &err), err);
    TEST_OK(zs_dev_sumsq(s, dok, ZS_DTYPE_F32, 3, acc, &err), err);
    zs_devtest_d2h(s, hacc, acc, sizeof hacc);
    TEST_CHECKF(hacc[0] == 14.0 && hacc[1] == 1.0, "%g %g", hacc[0], hacc[1]);
    TEST_CHECK(zs_dev_sumsq(s, dok, ZS_DTYPE_F32, 3, NULL, &err) == ZS_ERR_INVALID);
    zs_dev_free(d, dok);
    zs_dev_free(d, acc);
    printf("sumsq: %s, max relative error %.3g, non-finite flagged\n",
           bitwise ? "bitwise in the documented order" : "within 1e-12 of the documented order",
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
                float *rp = zs_devtest_rand_host(ZS_DTYPE_F32, n, 500 + k, 1.0f);
                float *rm = zs_devtest_rand_host(ZS_DTYPE_F32, n, 600 + k, 0.1f);
                float *rv = zs_devtest_rand_host(ZS_DTYPE_F32, n, 700 + k, 0.01f);
                for (size_t i = 0; i < n; i++)
                    rv[i] = fabsf(rv[i]);
                void *hg = zs_devtest_rand_host(gdt, n, 800 + k, 4.0f);
                void *rout = odt == ZS_DTYPE_NONE ? NULL : zs_devtest_rand_host(odt, n, 900, 1.0f);
                float *p = zs_devtest_h2d(d, s, rp, n * 4), *m = zs_devtest_h2d(d, s, rm, n * 4),
                      *v = zs_devtest_h2d(d, s, rv, n * 4);
                void *gr = zs_devtest_h2d(d, s, hg, n * zs_dtype_size(gdt));
                void *out = rout ? zs_devtest_h2d(d, s, rout, n * osz) : NULL;
                hp.adam_w_mode = (int)(k + g) % 2;
                /* behind a sleeping host function, so the op runs after the
                 * caller changed its structs: it must use its own copies.
                 * Not a gate opened from this thread: a kernel launch may
                 * wait while a host function runs (it does on an H100, and
                 * on the CUDA emulator), and would wait for the gate. */
                zs_devtest_hold(s, 100);
                TEST_OK(zs_dev_adamw(s, &hp, &stp, p, m, v, gr, gdt, out, odt, n, &err), err);
                zs_adam_hparams_t hp_run = hp;
                zs_adam_step_t st_run = stp;
                hp.beta1 = 0.5f;
                hp.eps = 1.0f;
                stp.lr = 1.0f;
                stp.t += 100;
                TEST_OK(zs_dev_stream_sync(s, &err), err);
                hp = hp_run;
                stp = st_run;
                zs_adam_update_ref(&hp, &stp, rp, rm, rv, hg, gdt, rout, odt, n);
                float *got = malloc(n * 4 + 1);
                void *gout = malloc(n * 4 + 1);
                long bad = -1;
                float *const dv[3] = {p, m, v}, *const hv[3] = {rp, rm, rv};
                for (int j = 0; j < 3 && bad < 0; j++) {
                    zs_devtest_d2h(s, got, dv[j], n * 4);
                    bad = first_diff(got, hv[j], n, 4);
                }
                if (bad < 0 && out) {
                    zs_devtest_d2h(s, gout, out, n * osz);
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
    float f[4] = {0};
    TEST_CHECK(zs_dev_adamw(s, NULL, &stp, f, f, f, f, ZS_DTYPE_F32, NULL, ZS_DTYPE_NONE, 1,
                            &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_adamw(s, &hp, &stp, f, f, f, f, ZS_DTYPE_NONE, NULL, ZS_DTYPE_NONE, 1,
                            &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    printf("adamw: %d cases bitwise equal to zs_adam_update_ref (max error 0)\n", cases);
}

/* zs_dev_cast_rows: rows of ids in [lo, hi) converted (duplicates too),
 * rows of ids outside keep their old contents; then the refusals. */
static void test_cast_rows(zs_dev_t *d, zs_stream_t *s)
{
    const size_t w = 37, n = 300;
    const int32_t lo = 40, hi = 90;
    int32_t ids[300];
    for (size_t i = 0; i < n; i++) /* 0..119: below, inside and above [lo, hi), repeats */
        ids[i] = (int32_t)((i * 53) % 120);
    for (int a = 0; a < 3; a++) {
        zs_dtype_t sdt = DTS[a];
        size_t ss = zs_dtype_size(sdt), bytes = n * w * 4;
        void *hsrc = zs_devtest_rand_host(sdt, (size_t)(hi - lo) * w, 300 + a, 5.0f);
        float *hdst = zs_devtest_rand_host(ZS_DTYPE_F32, n * w, 400 + a, 1.0f);
        float *got = malloc(bytes), *ref = malloc(bytes);
        void *src = zs_devtest_h2d(d, s, hsrc, (size_t)(hi - lo) * w * ss);
        void *dst = zs_devtest_h2d(d, s, hdst, bytes);
        void *idx = zs_devtest_h2d(d, s, ids, sizeof ids);
        TEST_OK(zs_dev_cast_rows(s, dst, src, sdt, idx, n, lo, hi, w, &err), err);
        zs_devtest_d2h(s, got, dst, bytes);
        memcpy(ref, hdst, bytes);
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= lo && ids[i] < hi)
                for (size_t c = 0; c < w; c++)
                    ref[i * w + c] = ld(sdt, hsrc, (size_t)(ids[i] - lo) * w + c);
        long bad = first_diff(got, ref, n * w, 4);
        TEST_CHECKF(bad < 0, "cast_rows %s differs at %ld", zs_dtype_name(sdt), bad);
        free(hsrc), free(hdst), free(got), free(ref);
        zs_dev_free(d, src), zs_dev_free(d, dst), zs_dev_free(d, idx);
    }
    float f[4];
    int32_t i4[1] = {0};
    TEST_CHECK(zs_dev_cast_rows(s, f, f + 2, ZS_DTYPE_NONE, i4, 1, 0, 1, 1, &err) ==
               ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_cast_rows(s, f, f + 2, ZS_DTYPE_F32, i4, 1, 5, 4, 1, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_cast_rows(s, f, f + 2, ZS_DTYPE_F32, NULL, 1, 0, 1, 1, &err) ==
               ZS_ERR_INVALID);
    TEST_CHECK(zs_dev_cast_rows(s, f, f + 2, ZS_DTYPE_F32, i4, 2, 0, 1, SIZE_MAX / 2, &err) ==
               ZS_ERR_RANGE);
    printf("  refused: %s\n", err.msg);
    printf("cast_rows: 3 source dtypes bitwise equal to the scalar reference, other rows "
           "untouched\n");
}

/* zs_dev_round: h = x rounded, x = h widened, bitwise the two host casts
 * (zs_cast), on a size that spans several of the CPU device's chunks, with
 * NaN, infinities, -0, fp16's overflow edge (65519 rounds to 65504, 65520 to
 * inf), a bf16 tie and subnormals; the refusals. */
static void test_round(zs_dev_t *d, zs_stream_t *s)
{
    const size_t n = 100003;
    static const uint32_t special[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x80000000u,
                                       0x477FEF00u, 0x477FF000u, 0x3F808000u, 0x3F818000u,
                                       0x00000001u, 0x38800001u, 0x33800000u};
    for (int a = 1; a < 3; a++) {
        zs_dtype_t dt = DTS[a];
        float *hx = zs_devtest_rand_host(ZS_DTYPE_F32, n, 500 + a, 1e5f);
        for (size_t i = 0; i < sizeof special / sizeof *special; i++)
            memcpy(&hx[i * 997], &special[i], 4);
        float *gx = malloc(n * 4), *rx = malloc(n * 4);
        uint16_t *gh = malloc(n * 2), *rh = malloc(n * 2);
        TEST_CHECK(gx && rx && gh && rh);
        float *x = zs_devtest_h2d(d, s, hx, n * 4);
        void *h = zs_devtest_h2d(d, s, rh, n * 2); /* contents overwritten */
        TEST_OK(zs_dev_round(s, x, h, dt, n, &err), err);
        zs_devtest_d2h(s, gx, x, n * 4);
        zs_devtest_d2h(s, gh, h, n * 2);
        zs_cast(rh, dt, hx, ZS_DTYPE_F32, n);
        zs_cast(rx, ZS_DTYPE_F32, rh, dt, n);
        long bh = first_diff(gh, rh, n, 2), bx = first_diff(gx, rx, n, 4);
        TEST_CHECKF(bh < 0 && bx < 0, "round %s: h differs at %ld, x at %ld", zs_dtype_name(dt), bh,
                    bx);
        free(hx), free(gx), free(rx), free(gh), free(rh);
        zs_dev_free(d, x), zs_dev_free(d, h);
    }
    float f[8];
    TEST_CHECK(zs_dev_round(s, f, f + 4, ZS_DTYPE_F32, 2, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_round(s, f, f + 1, ZS_DTYPE_BF16, 4, &err) == ZS_ERR_INVALID);
    printf("  refused: %s\n", err.msg);
    TEST_CHECK(zs_dev_round(s, f, f + 4, ZS_DTYPE_BF16, SIZE_MAX / 2, &err) == ZS_ERR_RANGE);
    TEST_CHECK(zs_dev_round(s, f, NULL, ZS_DTYPE_BF16, 2, &err) == ZS_ERR_INVALID);
    printf("round: bf16 and fp16, %zu elements with specials, bitwise the two casts\n", n);
}

void zs_devtest_vector(zs_dev_t *d, int sumsq_bitwise)
{
    zs_stream_t *s;
    TEST_OK(zs_dev_stream_create(d, 0, "compute", &s, &err), err);
    test_cast_acc_scale(d, s);
    test_cast_rows(d, s);
    test_round(d, s);
    test_sumsq(d, s, sumsq_bitwise);
    test_adamw(d, s);
    zs_dev_stream_destroy(s);
}
