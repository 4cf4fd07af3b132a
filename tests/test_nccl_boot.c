/*
 * test_nccl_boot.c - the NCCL collectives (worker/coll/zs_coll_nccl*.c)
 * under mpirun (tests/gpu.cmake).
 *
 *   test_nccl_boot boot   (any -np; runs without a GPU)
 *     The bootstrap: every rank gets the same 128-byte unique id, made on
 *     rank 0 and broadcast over MPI (and a fresh one on a second bootstrap),
 *     and distinct local ranks 0..n-1 (all ranks on this machine). Then the
 *     create: without a GPU it must fail on every rank, quickly and cleanly,
 *     with ZS_ERR_UNAVAILABLE and "no GPU: <CUDA's reason>"; with fewer GPUs
 *     than ranks (one GPU, np 2) every rank must refuse with a message that
 *     names the sharing; with a GPU per rank it runs the collective checks
 *     of `gpu` below.
 *   test_nccl_boot gpu    (-np <= number of GPUs; exit 77 without a GPU)
 *     In-place layouts of reduce-scatter, all-gather, all-reduce (sum, max)
 *     and broadcast from every root, fp32/bf16/fp16, on exact small-integer
 *     data, ordered through `after` streams and `done` events; barrier and
 *     the host helpers; refused arguments; then the watchdog: a host
 *     function blocks the communicator's stream longer than the timeout, a
 *     collective queued behind it cannot finish, zs_coll_sync must return
 *     ZS_ERR_TIMEOUT within the deadline (not when the block ends) naming
 *     the collective and the rank, later calls ZS_ERR_STATE, destroy returns.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>
#include <nccl.h>

#include "zs_cast.h"
#include "zs_coll.h"
#include "zs_coll_nccl.h"
#include "zs_dev.h"
#include "zs_dev_cuda.h"
#include "zs_dtypetest.h"
#include "zs_mpitest.h"

int g_rank; /* zs_mpitest.h */
static int g_size;

static zs_err_t err;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- bootstrap (no GPU needed) ----------------------------------------------- */

static void test_bootstrap(void)
{
    zs_nccl_boot_t b, b2;
    OK(zs_coll_nccl_bootstrap(&b, &err), err);
    CHECK(b.rank == g_rank && b.size == g_size, "rank %d/%d", b.rank, b.size);
    CHECK(b.local_size == g_size, "local size %d of %d ranks on one machine", b.local_size, g_size);
    CHECK(b.local_rank >= 0 && b.local_rank < b.local_size, "local rank %d", b.local_rank);
    unsigned char zero[ZS_NCCL_ID_BYTES] = {0};
    CHECK(memcmp(b.id, zero, sizeof zero) != 0, "unique id is all zeros");

    /* every rank holds rank 0's id; local ranks are a permutation */
    unsigned char *ids = malloc((size_t)g_size * ZS_NCCL_ID_BYTES);
    int *locals = malloc((size_t)g_size * sizeof(int));
    MPI_Gather(b.id, ZS_NCCL_ID_BYTES, MPI_BYTE, ids, ZS_NCCL_ID_BYTES, MPI_BYTE, 0,
               MPI_COMM_WORLD);
    MPI_Gather(&b.local_rank, 1, MPI_INT, locals, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
        for (int r = 1; r < g_size; r++)
            CHECK(memcmp(ids, ids + (size_t)r * ZS_NCCL_ID_BYTES, ZS_NCCL_ID_BYTES) == 0,
                  "rank %d holds another unique id than rank 0", r);
        for (int r = 0; r < g_size; r++)
            for (int q = r + 1; q < g_size; q++)
                CHECK(locals[r] != locals[q], "ranks %d and %d share local rank %d", r, q,
                      locals[r]);
    }
    /* a second bootstrap: a fresh id, again the same everywhere */
    OK(zs_coll_nccl_bootstrap(&b2, &err), err);
    CHECK(memcmp(b.id, b2.id, sizeof b.id) != 0, "second bootstrap gave the same id");
    MPI_Gather(b2.id, ZS_NCCL_ID_BYTES, MPI_BYTE, ids, ZS_NCCL_ID_BYTES, MPI_BYTE, 0,
               MPI_COMM_WORLD);
    if (g_rank == 0)
        for (int r = 1; r < g_size; r++)
            CHECK(memcmp(ids, ids + (size_t)r * ZS_NCCL_ID_BYTES, ZS_NCCL_ID_BYTES) == 0,
                  "second id differs on rank %d", r);
    free(ids);
    free(locals);
    CHECK(zs_coll_nccl_bootstrap(NULL, &err) == ZS_ERR_INVALID, "NULL out accepted");
    printf("rank %d: bootstrap ok (local rank %d of %d, id broadcast from rank 0)\n", g_rank,
           b.local_rank, b.local_size);
}

/* ZS_NCCL_CHECK's record (no GPU needed): call, file:line, rank, device,
 * NCCL's text, the hint, and the code mapping. */
static void test_check_macro(void)
{
    zs_err_t e;
    int n = 0;
    int line = __LINE__ + 1;
    int rc = ZS_NCCL_CHECK(&e, 5, 2, "check the comm", ncclCommCount, NULL, &n);
    CHECK(rc == ZS_ERR_INVALID, "ncclCommCount(NULL) gave %d: %s", rc, e.msg);
    char want[80];
    snprintf(want, sizeof want, "ncclCommCount at test_nccl_boot.c:%d on rank 5 (cuda:2): ", line);
    CHECK(strstr(e.msg, want) && strstr(e.msg, "(hint: check the comm)"), "%s", e.msg);
    if (g_rank == 0)
        printf("ZS_NCCL_CHECK: %s\n", e.msg);
    CHECK(zs__nccl_check(6, "x", __FILE__, 1, 0, 0, NULL, &e) == ZS_ERR_UNAVAILABLE, "remote");
    CHECK(zs__nccl_check(1, "x", __FILE__, 1, 0, 0, NULL, &e) == ZS_ERR_INTERNAL, "unhandled");
    CHECK(zs__nccl_check(0, "x", __FILE__, 1, 0, 0, NULL, &e) == ZS_OK, "success");
}

/* Without a GPU: the create fails on every rank, fast, saying why. */
static void test_no_gpu(const char *why)
{
    zs_coll_t *c = (zs_coll_t *)1;
    double t0 = now_s();
    zs_err_clear(&err);
    int rc = zs_coll_nccl_create(NULL, 5000, &c, &err);
    double dt = now_s() - t0;
    CHECK(rc == ZS_ERR_UNAVAILABLE && c == NULL, "create without a GPU returned %d (%s)", rc,
          err.msg);
    CHECK(strstr(err.msg, "no GPU") && strstr(err.msg, why), "message: %s", err.msg);
    CHECK(dt < 5.0, "create took %.1f s", dt);
    printf("rank %d: create without a GPU refused in %.3f s: %s\n", g_rank, dt, err.msg);
}

/* ---- with GPUs ------------------------------------------------------------------- */

static const zs_dtype_t DTS[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};

typedef struct {
    zs_dev_t *d;
    zs_coll_t *c;
    zs_stream_t *compute;
    zs_event_t *done;
    void *pin; /* pinned staging, large enough for every case */
} ctx_t;

/* host pinned -> device on the compute stream; the collective runs after
 * it (`after` = compute) and the copy back waits for `done`. */
static void stage_in(ctx_t *x, void *dbuf, size_t bytes)
{
    OK(zs_dev_memcpy(x->compute, dbuf, x->pin, bytes, &err), err);
}

static void stage_out(ctx_t *x, void *dbuf, size_t bytes)
{
    OK(zs_dev_stream_wait(x->compute, x->done, &err), err);
    OK(zs_dev_memcpy(x->compute, x->pin, dbuf, bytes, &err), err);
    OK(zs_dev_stream_sync(x->compute, &err), err);
}

/* Small integers: every partial sum is exact in fp32, bf16 and fp16. */
static float val(int r, size_t j, size_t i)
{
    return (float)((r + 2 * (int)j + (int)(i % 5)) % 16 + 1);
}

static void test_layouts(ctx_t *x)
{
    const size_t counts[] = {1, 1000, 4096 + 3};
    int cases = 0;
    for (int k = 0; k < 3; k++)
        for (int t = 0; t < 3; t++) {
            size_t n = counts[k], es = zs_dtype_size(DTS[t]), total = n * (size_t)g_size;
            zs_dtype_t dt = DTS[t];
            void *buf;
            OK(zs_dev_alloc(x->d, ZS_SPACE_DEVICE, ZS_MEM_COMM, total * es, &buf, &err), err);
            /* reduce-scatter: block j of rank r holds val(r, j, i) */
            for (int j = 0; j < g_size; j++)
                for (size_t i = 0; i < n; i++)
                    st(dt, x->pin, (size_t)j * n + i, val(g_rank, (size_t)j, i));
            stage_in(x, buf, total * es);
            OK(zs_coll_reduce_scatter(x->c, buf, n, dt, x->compute, x->done, &err), err);
            stage_out(x, buf, total * es);
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int r = 0; r < g_size; r++)
                    want += val(r, (size_t)g_rank, i);
                float got = ld(dt, x->pin, (size_t)g_rank * n + i);
                CHECK(got == want, "reduce_scatter %s n=%zu [%zu]: %g, want %g", zs_dtype_name(dt),
                      n, i, got, want);
            }
            /* all-gather: this rank's block, everyone's blocks after */
            for (size_t i = 0; i < total; i++)
                st(dt, x->pin, i, -1.0f);
            for (size_t i = 0; i < n; i++)
                st(dt, x->pin, (size_t)g_rank * n + i, val(g_rank, 7, i));
            stage_in(x, buf, total * es);
            OK(zs_coll_all_gather(x->c, buf, n, dt, x->compute, x->done, &err), err);
            stage_out(x, buf, total * es);
            for (int j = 0; j < g_size; j++)
                for (size_t i = 0; i < n; i++)
                    CHECK(ld(dt, x->pin, (size_t)j * n + i) == val(j, 7, i),
                          "all_gather %s n=%zu block %d [%zu]", zs_dtype_name(dt), n, j, i);
            /* all-reduce sum and max */
            for (int op = 0; op < 2; op++) {
                for (size_t i = 0; i < n; i++)
                    st(dt, x->pin, i, val(g_rank, 3, i));
                stage_in(x, buf, n * es);
                OK(zs_coll_all_reduce(x->c, buf, n, dt, op ? ZS_OP_MAX : ZS_OP_SUM, x->compute,
                                      x->done, &err),
                   err);
                stage_out(x, buf, n * es);
                for (size_t i = 0; i < n; i++) {
                    float want = op ? 0.0f : 0.0f;
                    for (int r = 0; r < g_size; r++)
                        want =
                            op ? (val(r, 3, i) > want ? val(r, 3, i) : want) : want + val(r, 3, i);
                    CHECK(ld(dt, x->pin, i) == want, "all_reduce %s %s n=%zu [%zu]: %g want %g",
                          op ? "max" : "sum", zs_dtype_name(dt), n, i, ld(dt, x->pin, i), want);
                }
            }
            /* broadcast from every root */
            for (int root = 0; root < g_size; root++) {
                for (size_t i = 0; i < n; i++)
                    st(dt, x->pin, i, val(g_rank, (size_t)root + 11, i));
                stage_in(x, buf, n * es);
                OK(zs_coll_broadcast(x->c, buf, n, dt, root, x->compute, x->done, &err), err);
                stage_out(x, buf, n * es);
                for (size_t i = 0; i < n; i++)
                    CHECK(ld(dt, x->pin, i) == val(root, (size_t)root + 11, i),
                          "broadcast %s from %d n=%zu [%zu]", zs_dtype_name(dt), root, n, i);
            }
            zs_dev_free(x->d, buf);
            cases++;
        }
    printf("rank %d: in-place layouts ok (%d count/dtype cases x RS, AG, AR sum/max, BC)\n", g_rank,
           cases);
}

/* A group of 100 all-gathers (two fused launches: ZS_COLL_GROUP_MAX, then
 * the rest) of bf16 blocks in one device buffer, `after` the upload and the
 * done event on the last: every block of every rank arrives. */
static void test_group(ctx_t *x)
{
    enum { NB = 100, CNT = 5 };
    size_t per = (size_t)g_size * CNT, total = NB * per, es = 2;
    void *buf;
    OK(zs_dev_alloc(x->d, ZS_SPACE_DEVICE, ZS_MEM_COMM, total * es, &buf, &err), err);
    void *pin;
    OK(zs_dev_alloc(x->d, ZS_SPACE_PINNED, ZS_MEM_COMM, total * es, &pin, &err), err);
    for (size_t i = 0; i < total; i++)
        st(ZS_DTYPE_BF16, pin, i, -1.0f);
    for (int k = 0; k < NB; k++)
        for (size_t i = 0; i < CNT; i++)
            st(ZS_DTYPE_BF16, pin, k * per + (size_t)g_rank * CNT + i, val(g_rank, (size_t)k, i));
    OK(zs_dev_memcpy(x->compute, buf, pin, total * es, &err), err);
    OK(zs_coll_group_start(x->c, &err), err);
    for (int k = 0; k < NB; k++)
        OK(zs_coll_all_gather(x->c, (char *)buf + k * per * es, CNT, ZS_DTYPE_BF16,
                              k == 0 ? x->compute : NULL, k == NB - 1 ? x->done : NULL, &err),
           err);
    OK(zs_coll_group_end(x->c, &err), err);
    OK(zs_dev_stream_wait(x->compute, x->done, &err), err);
    OK(zs_dev_memcpy(x->compute, pin, buf, total * es, &err), err);
    OK(zs_dev_stream_sync(x->compute, &err), err);
    for (int k = 0; k < NB; k++)
        for (int r = 0; r < g_size; r++)
            for (size_t i = 0; i < CNT; i++)
                CHECK(ld(ZS_DTYPE_BF16, pin, k * per + (size_t)r * CNT + i) == val(r, (size_t)k, i),
                      "grouped all_gather %d block %d [%zu]", k, r, i);
    zs_dev_free(x->d, pin);
    zs_dev_free(x->d, buf);
    printf("rank %d: a group of %d all-gathers (fused launches of %d) ok\n", g_rank, NB,
           ZS_COLL_GROUP_MAX);
}

static void test_misc(ctx_t *x)
{
    OK(zs_coll_barrier(x->c, &err), err);
    float h[3] = {1.0f, (float)g_rank, 2.0f};
    OK(zs_coll_all_reduce_host(x->c, h, 3, ZS_DTYPE_F32, ZS_OP_SUM, &err), err);
    CHECK(h[0] == (float)g_size && h[1] == (float)(g_size * (g_size - 1) / 2) &&
              h[2] == 2.0f * (float)g_size,
          "all_reduce_host %g %g %g", h[0], h[1], h[2]);
    float bc = (float)(g_rank + 5);
    OK(zs_coll_broadcast_host(x->c, &bc, 1, ZS_DTYPE_F32, g_size - 1, &err), err);
    CHECK(bc == (float)(g_size + 4), "broadcast_host %g", bc);
    /* refused before anything is enqueued (same on every rank) */
    void *buf;
    OK(zs_dev_alloc(x->d, ZS_SPACE_DEVICE, ZS_MEM_COMM, 64, &buf, &err), err);
    CHECK(zs_coll_all_reduce(x->c, buf, 4, ZS_DTYPE_NONE, ZS_OP_SUM, NULL, NULL, &err) ==
              ZS_ERR_INVALID,
          "dtype none");
    printf("rank %d: refused: %s\n", g_rank, err.msg);
    CHECK(zs_coll_all_reduce(x->c, buf, 4, ZS_DTYPE_F32, (zs_coll_op_t)7, NULL, NULL, &err) ==
              ZS_ERR_INVALID,
          "op 7");
    CHECK(zs_coll_broadcast(x->c, buf, 4, ZS_DTYPE_F32, g_size, NULL, NULL, &err) == ZS_ERR_INVALID,
          "root %d", g_size);
    CHECK(zs_coll_all_gather(x->c, NULL, 4, ZS_DTYPE_F32, NULL, NULL, &err) == ZS_ERR_INVALID,
          "NULL buf");
    CHECK(zs_coll_reduce_scatter(x->c, buf, SIZE_MAX / 2, ZS_DTYPE_F32, NULL, NULL, &err) ==
              ZS_ERR_RANGE,
          "overflow");
    OK(zs_coll_all_reduce(x->c, buf, 0, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    OK(zs_coll_sync(x->c, &err), err);
    zs_dev_free(x->d, buf);
    printf("rank %d: barrier, host helpers, refusals ok\n", g_rank);
}

static int fn_block(void *args, zs_err_t *e)
{
    atomic_int *open = *(atomic_int **)args;
    double t0 = now_s();
    while (!atomic_load(open) && now_s() - t0 < 30.0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return ZS_OK;
}

/* The comm stream is blocked longer than the timeout: the watchdog must
 * abort and zs_coll_sync must return its error at the deadline. */
static void test_watchdog(ctx_t *x, int timeout_ms)
{
    atomic_int open = 0;
    atomic_int *p = &open;
    void *buf;
    OK(zs_dev_alloc(x->d, ZS_SPACE_DEVICE, ZS_MEM_COMM, 64, &buf, &err), err);
    OK(zs_dev_memset(x->compute, buf, 0, 64, &err), err);
    OK(zs_dev_stream_sync(x->compute, &err), err);
    OK(zs_dev_host_fn(zs_coll_stream(x->c), fn_block, &p, sizeof p, &err), err);
    double t0 = now_s();
    OK(zs_coll_all_reduce(x->c, buf, 1, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err), err);
    zs_err_clear(&err);
    int rc = zs_coll_sync(x->c, &err);
    double dt = now_s() - t0;
    atomic_store(&open, 1);
    CHECK(rc == ZS_ERR_TIMEOUT, "sync returned %d (%s)", rc, err.msg);
    char want_rank[32], want_ms[48];
    snprintf(want_rank, sizeof want_rank, "on rank %d", g_rank);
    snprintf(want_ms, sizeof want_ms, "did not finish in %d ms", timeout_ms);
    CHECK(strstr(err.msg, "all_reduce of 1 fp32") && strstr(err.msg, want_rank) &&
              strstr(err.msg, want_ms),
          "message: %s", err.msg);
    CHECK(dt >= timeout_ms / 1000.0 && dt < timeout_ms / 1000.0 + 5.0,
          "sync returned after %.2f s (timeout %d ms)", dt, timeout_ms);
    printf("rank %d: watchdog fired after %.2f s: %s\n", g_rank, dt, err.msg);
    zs_err_clear(&err);
    rc = zs_coll_all_reduce(x->c, buf, 1, ZS_DTYPE_F32, ZS_OP_SUM, NULL, NULL, &err);
    CHECK(rc == ZS_ERR_STATE && strstr(err.msg, "aborted"), "after abort: %d %s", rc, err.msg);
    CHECK(zs_coll_barrier(x->c, &err) == ZS_ERR_STATE, "barrier after abort: %s", err.msg);
    double t1 = now_s();
    zs_coll_destroy(x->c);
    x->c = NULL;
    printf("rank %d: after the abort: refused (%s); destroy took %.2f s\n", g_rank,
           zs_status_name(ZS_ERR_STATE), now_s() - t1);
    zs_dev_free(x->d, buf);
}

/* Collectives with one GPU per rank. */
static void run_gpu(int ngpu)
{
    zs_nccl_boot_t b;
    OK(zs_coll_nccl_bootstrap(&b, &err), err);
    ctx_t x = {0};
    OK(zs_dev_cuda_create(ngpu >= b.local_size ? b.local_rank : 0, &x.d, &err), err);
    /* a NULL device with GPUs present: refused on every rank, no hang */
    zs_coll_t *bad = NULL;
    CHECK(zs_coll_nccl_create(NULL, 5000, &bad, &err) != ZS_OK && !bad, "NULL dev accepted");
    printf("rank %d: refused: %s\n", g_rank, err.msg);
    const int timeout_ms = 3000;
    OK(zs_coll_nccl_create(x.d, timeout_ms, &x.c, &err), err);
    CHECK(x.c->rank == g_rank && x.c->size == g_size && strcmp(x.c->vt->name, "nccl") == 0,
          "communicator %d/%d", x.c->rank, x.c->size);
    OK(zs_dev_stream_create(x.d, 0, "compute", &x.compute, &err), err);
    OK(zs_dev_event_create(x.d, &x.done, &err), err);
    OK(zs_dev_alloc(x.d, ZS_SPACE_PINNED, ZS_MEM_COMM, (size_t)(4096 + 3) * g_size * 4, &x.pin,
                    &err),
       err);
    printf("rank %d: communicator on %s\n", g_rank, x.d->desc);
    test_layouts(&x);
    test_group(&x);
    test_misc(&x);
    test_watchdog(&x, timeout_ms);
    zs_dev_free(x.d, x.pin);
    zs_dev_event_destroy(x.done);
    zs_dev_stream_destroy(x.compute);
    zs_dev_destroy(x.d);
}

/* One GPU, several ranks: every rank must refuse, naming the sharing. */
static void test_shared_gpu(void)
{
    zs_dev_t *d;
    OK(zs_dev_cuda_create(0, &d, &err), err);
    zs_coll_t *c = NULL;
    double t0 = now_s();
    int rc = zs_coll_nccl_create(d, 5000, &c, &err);
    CHECK(rc == ZS_ERR_INVALID && !c && strstr(err.msg, "share GPU"), "got %d: %s", rc, err.msg);
    printf("rank %d: one GPU for %d ranks refused in %.2f s: %s\n", g_rank, g_size, now_s() - t0,
           err.msg);
    zs_dev_destroy(d);
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *mode = argc > 1 ? argv[1] : "boot";
    char why[256];
    int ngpu = zs_dev_cuda_available(why, sizeof why);
    int status = 0;
    if (strcmp(mode, "boot") == 0) {
        test_check_macro();
        test_bootstrap();
        if (ngpu == 0)
            test_no_gpu(why);
        else if (ngpu < g_size)
            test_shared_gpu();
        else
            run_gpu(ngpu);
    } else if (strcmp(mode, "gpu") == 0) {
        if (ngpu == 0) {
            if (g_rank == 0)
                printf("SKIPPED: %s\n", why);
            status = 77;
        } else if (ngpu < g_size) {
            if (g_rank == 0)
                printf("SKIPPED: %d ranks but %d GPU(s) (one GPU per rank)\n", g_size, ngpu);
            status = 77;
        } else {
            run_gpu(ngpu);
        }
    } else {
        CHECK(0, "unknown mode '%s' (boot | gpu)", mode);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0 && status == 0)
        printf("test_nccl_boot %s: all passed on %d rank(s)\n", mode, g_size);
    MPI_Finalize();
    return status;
}
