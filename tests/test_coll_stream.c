/*
 * test_coll_stream.c - the stream side of the collectives (worker/coll/
 * zs_coll.c and the enqueueing in zs_coll_mpi.c), part of test_coll (main in
 * test_coll.c, shared helpers in test_coll.h).
 *
 * `after`: a producer stream writes the data 30 ms late; the collective with
 * after = producer reduces the new data; without `after` it does not wait
 * for the producer (held back by a gate until the collective is done, so the
 * result is deterministic: the old data). `done`: the collective is held
 * back by a gate on the communicator's stream; its done event is pending and
 * a consumer stream waiting on it sees the reduced data. An error in earlier
 * work on the stream is sticky: the collective is skipped, `done` and
 * zs_coll_sync report it, the sync clears it. Host helpers: exact results,
 * ZS_MEM_COMM staging freed, refusals. Refusals of the collectives enqueue
 * nothing, record no `done`, and leave the communicator usable.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_coll.h"
#include "zs_coll.h"

/* ---- stream ordering ------------------------------------------------------------------ */

/* A gate a host function waits on (polling, up to timeout_ms) until the main
 * thread opens it. */
typedef struct {
    int *gate;
    int timeout_ms;
} gate_args_t;

static int gate_wait(int *gate, int timeout_ms, zs_err_t *err)
{
    for (int t = 0; t < timeout_ms; t++) {
        if (__atomic_load_n(gate, __ATOMIC_ACQUIRE))
            return ZS_OK;
        sleep_ms(1);
    }
    return zs_err_set(err, ZS_ERR_TIMEOUT, "gate not opened in %d ms", timeout_ms);
}

static int gate_fn(void *args, zs_err_t *err)
{
    const gate_args_t *a = args;
    return gate_wait(a->gate, a->timeout_ms, err);
}

static void gate_open(int *gate)
{
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
}

/* Producer: (optionally wait for a gate,) sleep, then write the new data. */
typedef struct {
    float *buf;
    size_t n;
    int sleep_ms;
    int *gate; /* NULL: none */
    int timeout_ms;
} produce_args_t;

static float old_val(int r, size_t i)
{
    return val(ZS_DTYPE_F32, r, i);
}

static float new_val(int r, size_t i)
{
    return val(ZS_DTYPE_F32, r + 100, i) + 0.5f;
}

static int produce_fn(void *args, zs_err_t *err)
{
    const produce_args_t *a = args;
    int rc = a->gate ? gate_wait(a->gate, a->timeout_ms, err) : ZS_OK;
    sleep_ms(a->sleep_ms);
    for (size_t i = 0; i < a->n; i++)
        a->buf[i] = new_val(g_rank, i);
    return rc;
}

/* How many elements of buf (n) equal the all-reduce sum of f over ranks. */
static size_t count_sum_of(const float *buf, size_t n, float (*f)(int, size_t))
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int r = 0; r < g_size; r++)
            s += f(r, i);
        k += buf[i] == s;
    }
    return k;
}

/* Snapshot (on a consumer or the communicator's stream): copy the
 * collective's result out of the device buffer as it is at that point. */
typedef struct {
    const float *src;
    float *dst;
    size_t n;
} snap_args_t;

static int snap_fn(void *args, zs_err_t *err)
{
    const snap_args_t *a = args;
    memcpy(a->dst, a->src, a->n * sizeof(float));
    return ZS_OK;
}

/* `after`: a producer stream writes the data 30 ms late; the all-reduce
 * with after = producer must reduce the new data (seen by a snapshot taken
 * on the communicator's stream right after it, so also with 1 rank).
 * Negative control (rank-local, deterministic): without `after`, the
 * collective does not wait for the producer, whose write is held back by a
 * gate until the collective has finished, so it reduces the old data.
 * `after` = the communicator's own stream is a no-op. */
void test_after(zs_coll_t *c)
{
    zs_err_t err;
    const size_t n = 1000;
    zs_stream_t *prod = NULL;
    OK(zs_dev_stream_create(g_dev, 0, "producer", &prod, &err), err);
    dbuf_t b = dbuf_new(n, ZS_DTYPE_F32);
    float *p = b.p, *out = calloc(n, sizeof(float));
    CHECK(out, "calloc");

    for (size_t i = 0; i < n; i++)
        p[i] = old_val(g_rank, i);
    produce_args_t pa = {.buf = p, .n = n, .sleep_ms = 30};
    OK(zs_dev_host_fn(prod, produce_fn, &pa, sizeof pa, &err), err);
    OK(zs_coll_all_reduce(c, p, n, ZS_DTYPE_F32, ZS_OP_SUM, prod, NULL, &err), err);
    snap_args_t sa = {p, out, n}; /* the result as the collective left it (also with 1 rank) */
    OK(zs_dev_host_fn(zs_coll_stream(c), snap_fn, &sa, sizeof sa, &err), err);
    OK(zs_coll_sync(c, &err), err);
    OK(zs_dev_stream_sync(prod, &err), err);
    size_t got_new = count_sum_of(out, n, new_val);
    CHECK(got_new == n,
          "after=producer: %zu of %zu elements are the sum of the producer's new "
          "data (%zu the sum of the old data)",
          got_new, n, count_sum_of(out, n, old_val));

    /* negative control */
    int gate = 0;
    for (size_t i = 0; i < n; i++)
        p[i] = old_val(g_rank, i);
    pa = (produce_args_t){.buf = p, .n = n, .gate = &gate, .timeout_ms = 5000};
    OK(zs_dev_host_fn(prod, produce_fn, &pa, sizeof pa, &err), err);
    OK(zs_coll_all_reduce(c, p, n, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    OK(zs_coll_sync(c, &err), err);
    size_t got_old = count_sum_of(p, n, old_val);
    gate_open(&gate);
    OK(zs_dev_stream_sync(prod, &err), err);
    CHECK(got_old == n,
          "no after: %zu of %zu elements are the sum of the old data: the collective waited for "
          "an unrelated stream",
          got_old, n);

    /* after = own stream */
    for (size_t i = 0; i < n; i++)
        p[i] = old_val(g_rank, i);
    OK(zs_coll_all_reduce(c, p, n, ZS_DTYPE_F32, ZS_OP_SUM, zs_coll_stream(c), NULL, &err), err);
    OK(zs_coll_sync(c, &err), err);
    CHECK(count_sum_of(p, n, old_val) == n, "after = own stream");

    free(out);
    dbuf_free(&b, "after");
    zs_dev_stream_destroy(prod);
}

/* `done`: the collective is held back behind a gate on the communicator's
 * stream; its done event must be pending then, and a consumer stream waiting
 * on it must see the reduced data once the gate opens. */
void test_done(zs_coll_t *c)
{
    zs_err_t err;
    const size_t n = 777;
    zs_stream_t *cons = NULL;
    zs_event_t *ev = NULL;
    OK(zs_dev_stream_create(g_dev, 0, "consumer", &cons, &err), err);
    OK(zs_dev_event_create(g_dev, &ev, &err), err);
    dbuf_t b = dbuf_new(n, ZS_DTYPE_F32);
    float *p = b.p, *out = calloc(n, sizeof(float));
    CHECK(out, "calloc");
    for (size_t i = 0; i < n; i++)
        p[i] = old_val(g_rank, i);

    int gate = 0;
    gate_args_t ga = {&gate, 30000};
    OK(zs_dev_host_fn(zs_coll_stream(c), gate_fn, &ga, sizeof ga, &err), err);
    OK(zs_coll_all_reduce(c, p, n, ZS_DTYPE_F32, ZS_OP_SUM, NULL, ev, &err), err);
    OK(zs_dev_stream_wait(cons, ev, &err), err);
    snap_args_t sa = {p, out, n};
    OK(zs_dev_host_fn(cons, snap_fn, &sa, sizeof sa, &err), err);
    int early = zs_dev_event_query(ev);
    gate_open(&gate);
    CHECK(early == 0, "done event complete while the collective is held back");
    OK(zs_dev_stream_sync(cons, &err), err);
    size_t k = count_sum_of(out, n, old_val);
    CHECK(k == n, "consumer after done: %zu of %zu elements are the reduced sum", k, n);
    OK(zs_dev_event_sync(ev, &err), err);
    OK(zs_coll_sync(c, &err), err);

    free(out);
    dbuf_free(&b, "done");
    zs_dev_event_destroy(ev);
    zs_dev_stream_destroy(cons);
}

static int fail_fn(void *args, zs_err_t *err)
{
    return zs_err_set(err, ZS_ERR_IO, "injected failure before the collective");
}

/* An error in earlier work on the communicator's stream (every rank): the
 * collective behind it is skipped, its done event and zs_coll_sync report
 * the error, the sync clears it and the next collective works. */
void test_sticky(zs_coll_t *c)
{
    zs_err_t err;
    zs_event_t *ev = NULL;
    OK(zs_dev_event_create(g_dev, &ev, &err), err);
    dbuf_t b = dbuf_new(8, ZS_DTYPE_F32);
    float *p = b.p;
    for (int i = 0; i < 8; i++)
        p[i] = 1.0f;
    int unused = 0;
    OK(zs_dev_host_fn(zs_coll_stream(c), fail_fn, &unused, sizeof unused, &err), err);
    OK(zs_coll_all_reduce(c, p, 8, ZS_DTYPE_F32, ZS_OP_SUM, NULL, ev, &err), err);
    REFUSED(zs_dev_event_sync(ev, &e_), ZS_ERR_IO, "injected");
    REFUSED(zs_coll_sync(c, &e_), ZS_ERR_IO, "injected");
    for (int i = 0; i < 8; i++)
        CHECK(p[i] == 1.0f, "the collective behind the error ran: %g", (double)p[i]);
    OK(zs_coll_sync(c, &err), err);
    OK(zs_coll_all_reduce(c, p, 8, ZS_DTYPE_F32, ZS_OP_SUM, NULL, ev, &err), err);
    OK(zs_dev_event_sync(ev, &err), err);
    for (int i = 0; i < 8; i++)
        CHECK(p[i] == (float)g_size, "after the error: %g", (double)p[i]);
    dbuf_free(&b, "sticky");
    zs_dev_event_destroy(ev);
}

/* ---- host helpers ---------------------------------------------------------------------- */

static uint64_t comm_bytes(int peak)
{
    zs_dev_mem_t mem;
    zs_dev_mem_get(g_dev, &mem);
    return peak ? mem.peak[ZS_SPACE_DEVICE][ZS_MEM_COMM] : mem.cur[ZS_SPACE_DEVICE][ZS_MEM_COMM];
}

/* all_reduce_host / broadcast_host on ordinary host memory: exact results,
 * the staging buffer is ZS_MEM_COMM device memory and is freed, refusals. */
void test_host(zs_coll_t *c)
{
    zs_err_t err;
    const size_t counts[] = {0, 1, 7, 300};
    CHECK(comm_bytes(0) == 0, "comm bytes before: %llu", (unsigned long long)comm_bytes(0));
    for (size_t d = 0; d < 3; d++) {
        zs_dtype_t dt = DTYPES[d];
        size_t es = zs_dtype_size(dt);
        for (size_t k = 0; k < 4; k++) {
            size_t n = counts[k];
            unsigned char *h = malloc(n * es + 1);
            CHECK(h, "malloc");
            for (int op = 0; op < 2; op++) {
                for (size_t i = 0; i < n; i++)
                    put(h, dt, i, val(dt, g_rank, i));
                zs_dev_mem_reset_peak(g_dev);
                OK(zs_coll_all_reduce_host(c, h, n, dt, (zs_coll_op_t)op, &err), err);
                for (size_t i = 0; i < n; i++)
                    expect_eq(h, dt, i, op ? max_over_ranks(dt, i) : sum_over_ranks(dt, i),
                              op ? "all_reduce_host(max)" : "all_reduce_host(sum)", n);
                CHECK(comm_bytes(0) == 0 && comm_bytes(1) >= n * es,
                      "all_reduce_host staging: %llu bytes left, peak %llu (want >= %zu)",
                      (unsigned long long)comm_bytes(0), (unsigned long long)comm_bytes(1), n * es);
            }
            for (int root = 0; root < g_size; root++) {
                for (size_t i = 0; i < n; i++)
                    put(h, dt, i, g_rank == root ? val(dt, root, i) : -99.0f);
                OK(zs_coll_broadcast_host(c, h, n, dt, root, &err), err);
                for (size_t i = 0; i < n; i++)
                    expect_eq(h, dt, i, val(dt, root, i), "broadcast_host", n);
                CHECK(comm_bytes(0) == 0, "broadcast_host left %llu bytes",
                      (unsigned long long)comm_bytes(0));
            }
            free(h);
        }
    }
    float h[4] = {1, 2, 3, 4};
    REFUSED(zs_coll_all_reduce_host(c, h, 4, ZS_DTYPE_NONE, ZS_OP_SUM, &e_), ZS_ERR_INVALID,
            "dtype");
    REFUSED(zs_coll_all_reduce_host(c, NULL, 4, ZS_DTYPE_F32, ZS_OP_SUM, &e_), ZS_ERR_INVALID,
            "NULL");
    REFUSED(zs_coll_all_reduce_host(c, h, SIZE_MAX / 2, ZS_DTYPE_F32, ZS_OP_SUM, &e_), ZS_ERR_RANGE,
            "overflows");
    REFUSED(zs_coll_all_reduce_host(c, h, 4, ZS_DTYPE_F32, (zs_coll_op_t)9, &e_), ZS_ERR_INVALID,
            "op 9");
    REFUSED(zs_coll_broadcast_host(c, h, 4, ZS_DTYPE_F32, g_size, &e_), ZS_ERR_INVALID, "root");
    CHECK(comm_bytes(0) == 0, "refused host helpers left %llu bytes",
          (unsigned long long)comm_bytes(0));
    CHECK(h[0] == 1 && h[3] == 4, "refused helper changed the host buffer");
    OK(zs_coll_all_reduce_host(c, h, 4, ZS_DTYPE_F32, ZS_OP_SUM, &err), err);
    CHECK(h[0] == (float)g_size && h[3] == 4.0f * (float)g_size, "host helper after refusals");
}

/* ---- errors ---------------------------------------------------------------------- */

/* Refusals: checked on the calling thread, nothing enqueued. While a gate
 * holds the stream, a refused call given a done event must not record it
 * (it stays complete), and zs_coll_sync afterwards reports no error. */
void test_errors(zs_coll_t *c)
{
    zs_err_t err;
    dbuf_t b = dbuf_new(64, ZS_DTYPE_F32);
    float *buf = b.p;
    const zs_dtype_t none = ZS_DTYPE_NONE, bad = (zs_dtype_t)42;
    zs_event_t *ev = NULL;
    OK(zs_dev_event_create(g_dev, &ev, &err), err);
    int gate = 0;
    gate_args_t ga = {&gate, 30000};
    OK(zs_dev_host_fn(zs_coll_stream(c), gate_fn, &ga, sizeof ga, &err), err);

    REFUSED(zs_coll_all_reduce(c, buf, 4, none, ZS_OP_SUM, NULL, ev, &e_), ZS_ERR_INVALID, "dtype");
    REFUSED(zs_coll_all_reduce(c, buf, 4, bad, ZS_OP_SUM, NULL, ev, &e_), ZS_ERR_INVALID,
            "dtype 42");
    REFUSED(zs_coll_reduce_scatter(c, buf, 1, none, NULL, ev, &e_), ZS_ERR_INVALID, "dtype");
    REFUSED(zs_coll_all_gather(c, buf, 1, none, NULL, ev, &e_), ZS_ERR_INVALID, "dtype");
    REFUSED(zs_coll_broadcast(c, buf, 4, none, 0, NULL, ev, &e_), ZS_ERR_INVALID, "dtype");
    REFUSED(zs_coll_all_reduce(c, buf, 4, ZS_DTYPE_F32, (zs_coll_op_t)7, NULL, ev, &e_),
            ZS_ERR_INVALID, "op 7");
    REFUSED(zs_coll_broadcast(c, buf, 4, ZS_DTYPE_F32, g_size, NULL, ev, &e_), ZS_ERR_INVALID,
            "root");
    REFUSED(zs_coll_broadcast(c, buf, 4, ZS_DTYPE_F32, -1, NULL, ev, &e_), ZS_ERR_INVALID, "root");
    /* counts whose bytes overflow size_t (reduce-scatter/all-gather: times size) */
    REFUSED(zs_coll_all_reduce(c, buf, SIZE_MAX / 2, ZS_DTYPE_F32, ZS_OP_SUM, NULL, ev, &e_),
            ZS_ERR_RANGE, "overflows");
    REFUSED(zs_coll_reduce_scatter(c, buf, SIZE_MAX / 3, ZS_DTYPE_F32, NULL, ev, &e_), ZS_ERR_RANGE,
            "overflows");
    REFUSED(zs_coll_all_gather(c, buf, SIZE_MAX / 3, ZS_DTYPE_F32, NULL, ev, &e_), ZS_ERR_RANGE,
            "overflows");
    REFUSED(zs_coll_broadcast(c, buf, SIZE_MAX / 3, ZS_DTYPE_F32, 0, NULL, ev, &e_), ZS_ERR_RANGE,
            "overflows");
    if (g_size > 1) /* fits size_t alone, not times the world size */
        REFUSED(zs_coll_reduce_scatter(c, buf, SIZE_MAX / 2 / (size_t)g_size + 1, ZS_DTYPE_BF16,
                                       NULL, ev, &e_),
                ZS_ERR_RANGE, "overflows");
    /* buffers */
    REFUSED(zs_coll_all_reduce(c, NULL, 4, ZS_DTYPE_F32, ZS_OP_SUM, NULL, ev, &e_), ZS_ERR_INVALID,
            "NULL");
    REFUSED(zs_coll_reduce_scatter(c, NULL, 4, ZS_DTYPE_F32, NULL, ev, &e_), ZS_ERR_INVALID,
            "NULL");
    REFUSED(zs_coll_broadcast(c, NULL, 4, ZS_DTYPE_F32, 0, NULL, ev, &e_), ZS_ERR_INVALID, "NULL");
    /* a NULL error record is allowed */
    CHECK(zs_coll_all_reduce(c, buf, 4, none, ZS_OP_SUM, NULL, ev, NULL) == ZS_ERR_INVALID,
          "NULL err");
    int ev_untouched = zs_dev_event_query(ev);
    gate_open(&gate);
    CHECK(ev_untouched == 1, "a refused collective recorded its done event");
    OK(zs_coll_sync(c, &err), err); /* refusals are not stream errors */

    REFUSED(zs_coll_mpi_set_max_chunk(c, 0, &e_), ZS_ERR_INVALID, "outside");
    REFUSED(zs_coll_mpi_set_max_chunk(c, ((size_t)1 << 30) + 1, &e_), ZS_ERR_INVALID, "outside");
    REFUSED(zs_coll_mpi_set_max_chunk(NULL, 10, &e_), ZS_ERR_INVALID, "not an MPI");
    REFUSED(zs_coll_mpi_create(g_dev, NULL, &e_), ZS_ERR_INVALID, "out is NULL");
    {
        zs_coll_t *none_c = c;
        REFUSED(zs_coll_mpi_create(NULL, &none_c, &e_), ZS_ERR_INVALID, "dev is NULL");
        CHECK(none_c == NULL, "*out not cleared on refusal");
    }

    /* the communicator still works after all the refusals */
    dbuf_free(&b, "errors");
    zs_dev_event_destroy(ev);
    run_one(c, K_AR_SUM, ZS_DTYPE_F16, 5, 0);
    run_one(c, K_RS, ZS_DTYPE_BF16, 3, 0);
    OK(zs_coll_barrier(c, &err), err);
}

/* Groups (zs_coll_group_start / _end): 150 all-gathers in one group, so the
 * group is launched in pieces of ZS_COLL_GROUP_MAX, each on its own buffer,
 * give every rank's blocks. A `done` event given inside the group is not
 * recorded until its piece is launched: with the communicator's stream held
 * by a gate, the event (recorded earlier on an idle stream, so complete)
 * stays complete while the group is open and turns incomplete at the end,
 * when it is recorded behind the held collectives. Inside a group sync,
 * barrier, the host helpers and a nested start are refused, as is an end
 * without a start. */
void test_group(zs_coll_t *c)
{
    zs_err_t err;
    enum { NB = 150, CNT = 8 };
    size_t per = (size_t)g_size * CNT;
    dbuf_t b = dbuf_new(NB * per, ZS_DTYPE_F32);
    float *p = b.p;
    for (int k = 0; k < NB; k++)
        for (size_t i = 0; i < CNT; i++)
            p[k * per + (size_t)g_rank * CNT + i] = (float)(g_rank * 100000 + k * 100 + (int)i);
    zs_stream_t *idle = NULL;
    zs_event_t *ev = NULL;
    OK(zs_dev_stream_create(g_dev, 0, "idle", &idle, &err), err);
    OK(zs_dev_event_create(g_dev, &ev, &err), err);
    OK(zs_dev_event_record(ev, idle, &err), err);
    OK(zs_dev_event_sync(ev, &err), err);

    int gate = 0;
    gate_args_t ga = {&gate, 30000};
    OK(zs_dev_host_fn(zs_coll_stream(c), gate_fn, &ga, sizeof ga, &err), err);
    OK(zs_coll_group_start(c, &err), err);
    REFUSED(zs_coll_group_start(c, &e_), ZS_ERR_STATE, "open already");
    REFUSED(zs_coll_sync(c, &e_), ZS_ERR_STATE, "inside a collective group");
    REFUSED(zs_coll_barrier(c, &e_), ZS_ERR_STATE, "inside a collective group");
    float one = 1.0f;
    REFUSED(zs_coll_all_reduce_host(c, &one, 1, ZS_DTYPE_F32, ZS_OP_SUM, &e_), ZS_ERR_STATE,
            "inside a collective group");
    for (int k = 0; k < NB; k++) {
        /* the done event goes with the last collective: the third piece */
        OK(zs_coll_all_gather(c, p + k * per, CNT, ZS_DTYPE_F32, NULL, k == NB - 1 ? ev : NULL,
                              &err),
           err);
        if (k == NB - 1)
            CHECK(zs_dev_event_query(ev) == 1,
                  "a done event given inside a group was recorded before the group's launch");
    }
    OK(zs_coll_group_end(c, &err), err);
    int late = zs_dev_event_query(ev);
    gate_open(&gate);
    CHECK(late == 0, "after zs_coll_group_end the done event must follow the held collectives");
    OK(zs_dev_event_sync(ev, &err), err);
    OK(zs_coll_sync(c, &err), err);
    size_t bad = 0;
    for (int k = 0; k < NB; k++)
        for (int r = 0; r < g_size; r++)
            for (size_t i = 0; i < CNT; i++)
                bad += p[k * per + (size_t)r * CNT + i] != (float)(r * 100000 + k * 100 + (int)i);
    CHECK(bad == 0, "grouped all-gathers: %zu of %zu elements wrong", bad, (size_t)NB * per);
    REFUSED(zs_coll_group_end(c, &e_), ZS_ERR_STATE, "no group is open");
    dbuf_free(&b, "group");
    zs_dev_event_destroy(ev);
    zs_dev_stream_destroy(idle);
}
