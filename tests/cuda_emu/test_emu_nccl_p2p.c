/*
 * test_emu_nccl_p2p.c - the emulated NCCL's point-to-point test
 * (ncclSend/ncclRecv, emu_nccl_p2p.c), run under mpiexec at np 2 and 4;
 * written from NCCL's user guide ("Point To Point Communication
 * Functions", "Point-to-point communication", "Group Calls"), not from the
 * emulator's code. MPI only starts the ranks and broadcasts the unique id.
 *
 * Covers: a ring exchange; all-to-all with grouped sends and receives
 * (including self) in eight data types and several counts, several groups
 * in a row on one stream, on a blocking and a non-blocking communicator;
 * send to self and an unmatched send to self; a pairwise exchange without
 * a group, and an ungrouped ring that can only time out; two sends to the
 * same peer in one group arriving in order; a count and a data type
 * mismatch reported on both ranks (receive buffer poisoned); a receive
 * whose peer never sends (timeout), whose peer destroys its communicator,
 * and one released by ncclCommAbort; the receive buffer garbage (0xff)
 * while its receive waits; argument refusals; p2p between two
 * ranks followed by a collective of all; p2p on communicators made by
 * ncclCommSplit. Without MPI (--kill N: the test forks N ranks, since
 * mpiexec would kill the survivors): the last rank SIGKILLed 50 ms into a
 * large all-to-all that its own stream holds back (a host function that
 * never returns, queued before it), so the kill always lands mid-collective
 * for the others, however fast the copies run; the others must report
 * ncclRemoteError naming it within 2.5 s.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_emu_nccl.h"

int g_rank, g_size;

double test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

ncclResult_t test_settle(ncclComm_t c, int *polls)
{
    ncclResult_t st = ncclInProgress;
    int n = 0;
    double t0 = test_now();
    while (st == ncclInProgress) {
        NCCLOK(ncclCommGetAsyncError(c, &st));
        n++;
        CHECK(test_now() - t0 < 30, "never settled");
    }
    if (polls)
        *polls = n;
    return st;
}

ncclComm_t test_comm(int blocking)
{
    ncclUniqueId id;
    if (g_rank == 0)
        NCCLOK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c = NULL;
    if (blocking) {
        NCCLOK(ncclCommInitRank(&c, g_size, id, g_rank));
        return c;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c, g_size, id, g_rank, &cfg);
    CHECK(r == ncclSuccess || r == ncclInProgress, "init: %d", r);
    CHECK(test_settle(c, NULL) == ncclSuccess, "settle");
    return c;
}

static void expect_async(ncclComm_t c, ncclResult_t want, const char *needle)
{
    ncclResult_t st;
    NCCLOK(ncclCommGetAsyncError(c, &st));
    CHECK(st == want, "async error %d, want %d (%s)", st, want, ncclGetLastError(c));
    CHECK(!needle || strstr(ncclGetLastError(c), needle), "last error '%s' lacks '%s'",
          ncclGetLastError(c), needle);
}

/* The byte i of what rank src sends to rank dst (message salt). */
static unsigned char pat(int src, int dst, size_t i, int salt)
{
    uint32_t h = (uint32_t)(src * 7919 + dst * 104729 + i * 2654435761u + salt * 15485863u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return (unsigned char)h;
}

static void *dev_pattern(size_t bytes, int src, int dst, int salt)
{
    unsigned char *h = malloc(bytes ? bytes : 1);
    for (size_t i = 0; i < bytes; i++)
        h[i] = pat(src, dst, i, salt);
    void *d = NULL;
    CUDAOK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes)
        CUDAOK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* Device bytes [0, bytes) equal pat(src, dst, ., salt)? */
static void check_pattern(const void *d, size_t bytes, int src, int dst, int salt, const char *what)
{
    unsigned char *h = malloc(bytes ? bytes : 1);
    if (bytes)
        CUDAOK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bytes; i++)
        CHECK(h[i] == pat(src, dst, i, salt), "%s: byte %zu of %zu from rank %d is %#x, want %#x",
              what, i, bytes, src, h[i], pat(src, dst, i, salt));
    free(h);
}

static size_t tsize(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

/* Grouped ring: send to the next rank, receive from the previous one. */
static void ring(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    int n = g_size, r = g_rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    size_t bytes = 3001 * 4; /* many 1 KiB / nranks slices */
    void *sb = dev_pattern(bytes, r, next, 1), *rb = NULL;
    CUDAOK(cudaMalloc(&rb, bytes));
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclSend(sb, 3001, ncclFloat32, next, c, s));
    NCCLOK(ncclRecv(rb, 3001, ncclFloat32, prev, c, s));
    NCCLOK(ncclGroupEnd());
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclSuccess, NULL);
    check_pattern(rb, bytes, prev, r, 1, "ring");
    /* A group mixing collectives and the ring ("Group Calls" merge any
     * calls): an all-reduce before and after, same order on every rank. */
    float h[16], *d1, *d2;
    for (int i = 0; i < 16; i++)
        h[i] = (float)(r + 1);
    CUDAOK(cudaMalloc((void **)&d1, sizeof h));
    CUDAOK(cudaMalloc((void **)&d2, sizeof h));
    CUDAOK(cudaMemcpy(d1, h, sizeof h, cudaMemcpyHostToDevice));
    CUDAOK(cudaMemcpy(d2, h, sizeof h, cudaMemcpyHostToDevice));
    void *sb2 = dev_pattern(bytes, r, next, 2);
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(d1, d1, 16, ncclFloat32, ncclSum, c, s));
    NCCLOK(ncclRecv(rb, 3001, ncclFloat32, prev, c, s));
    NCCLOK(ncclAllReduce(d2, d2, 16, ncclFloat32, ncclMax, c, s));
    NCCLOK(ncclSend(sb2, 3001, ncclFloat32, next, c, s));
    NCCLOK(ncclGroupEnd());
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclSuccess, NULL);
    check_pattern(rb, bytes, prev, r, 2, "ring in a group with collectives");
    CUDAOK(cudaMemcpy(h, d1, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[15] == (float)(n * (n + 1) / 2), "sum in a mixed group: %g", h[15]);
    CUDAOK(cudaMemcpy(h, d2, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[15] == (float)n, "max in a mixed group: %g", h[15]);
    cudaFree(d1);
    cudaFree(d2);
    cudaFree(sb2);
    NCCLOK(ncclCommDestroy(c));
    cudaFree(sb);
    cudaFree(rb);
}

/* All-to-all as the project does it: for every peer p (self included),
 * send chunk p of sendbuf and receive chunk p of recvbuf, in one group;
 * `rounds` groups in a row on the same stream before one sync. */
static void alltoall(ncclComm_t c, cudaStream_t s, ncclDataType_t t, size_t count, int rounds,
                     int salt)
{
    int n = g_size, r = g_rank;
    size_t chunk = count * tsize(t);
    enum { MAXR = 4 };
    unsigned char *sb[MAXR], *rb[MAXR];
    for (int k = 0; k < rounds; k++) {
        unsigned char *h = malloc(chunk * n + 1);
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < chunk; i++)
                h[p * chunk + i] = pat(r, p, i, salt + k);
        CUDAOK(cudaMalloc((void **)&sb[k], chunk * n + 1));
        CUDAOK(cudaMalloc((void **)&rb[k], chunk * n + 1));
        CUDAOK(cudaMemcpy(sb[k], h, chunk * n, cudaMemcpyHostToDevice));
        free(h);
    }
    for (int k = 0; k < rounds; k++) {
        NCCLOK(ncclGroupStart());
        for (int p = 0; p < n; p++) {
            NCCLOK(ncclSend(sb[k] + p * chunk, count, t, p, c, s));
            NCCLOK(ncclRecv(rb[k] + p * chunk, count, t, p, c, s));
        }
        ncclResult_t ge = ncclGroupEnd();
        CHECK(ge == ncclSuccess || ge == ncclInProgress, "group end %d: %s", ge,
              ncclGetLastError(c));
        if (ge == ncclInProgress)
            CHECK(test_settle(c, NULL) == ncclSuccess, "settle: %s", ncclGetLastError(c));
    }
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclSuccess, NULL);
    for (int k = 0; k < rounds; k++) {
        char what[96];
        for (int p = 0; p < n; p++) {
            snprintf(what, sizeof what, "all-to-all type %d count %zu round %d chunk %d", (int)t,
                     count, k, p);
            check_pattern(rb[k] + p * chunk, chunk, p, r, salt + k, what);
        }
        cudaFree(sb[k]);
        cudaFree(rb[k]);
    }
}

static void alltoalls(cudaStream_t s)
{
    ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclFloat16, ncclInt8,
                              ncclUint8,   ncclInt32,    ncclInt64,   ncclFloat64};
    size_t counts[] = {1, 7, 1000};
    int salt = 100, nops = 0;
    for (int blocking = 1; blocking >= 0; blocking--) {
        ncclComm_t c = test_comm(blocking);
        for (int ti = 0; ti < 8; ti++)
            for (int ci = 0; ci < 3; ci++, nops++)
                alltoall(c, s, types[ti], counts[ci], ci == 1 ? 3 : 1, salt += 10);
        /* A collective after the p2p groups still matches across ranks. */
        float h[64], *d;
        for (int i = 0; i < 64; i++)
            h[i] = (float)(g_rank + 1);
        CUDAOK(cudaMalloc((void **)&d, sizeof h));
        CUDAOK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
        ncclResult_t ar = ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, c, s);
        CHECK(ar == ncclSuccess || ar == ncclInProgress, "allreduce %d", ar);
        if (ar == ncclInProgress)
            CHECK(test_settle(c, NULL) == ncclSuccess, "settle");
        CUDAOK(cudaStreamSynchronize(s));
        expect_async(c, ncclSuccess, NULL);
        CUDAOK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
        CHECK(h[63] == (float)(g_size * (g_size + 1) / 2), "allreduce after p2p: %g", h[63]);
        cudaFree(d);
        if (blocking) {
            NCCLOK(ncclCommDestroy(c));
        } else {
            ncclResult_t fr = ncclCommFinalize(c);
            CHECK(fr == ncclSuccess || fr == ncclInProgress, "finalize %d", fr);
            CHECK(test_settle(c, NULL) == ncclSuccess, "finalize settle");
            NCCLOK(ncclCommDestroy(c));
        }
    }
    if (g_rank == 0)
        printf("all-to-all: %d grouped all-to-alls (8 types, blocking and not) ok\n", nops);
}

/* Send to self inside a group; an unmatched send to self is refused. */
static void self(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    int r = g_rank;
    void *sb = dev_pattern(1000, r, r, 7), *rb;
    CUDAOK(cudaMalloc(&rb, 1000));
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclRecv(rb, 250, ncclFloat32, r, c, s)); /* the receive first: order is free */
    NCCLOK(ncclSend(sb, 250, ncclFloat32, r, c, s));
    NCCLOK(ncclGroupEnd());
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclSuccess, NULL);
    check_pattern(rb, 1000, r, r, 7, "self");
    /* Without its receive in the group, the send to self could only hang. */
    ncclResult_t rc = ncclSend(sb, 250, ncclFloat32, r, c, s);
    CHECK(rc == ncclInvalidUsage, "unmatched send to self returned %d", rc);
    CHECK(strstr(ncclGetLastError(c), "to self"), "%s", ncclGetLastError(c));
    NCCLOK(ncclCommAbort(c));
    cudaFree(sb);
    cudaFree(rb);
}

/* Two sends to the same peer in one group arrive in call order ("calls
 * within a group targeting the same peer ... are executed in order"),
 * with a receive from another peer interleaved on the receiving side. */
static void ordering(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    int r = g_rank, n = g_size;
    enum { B = 2000 };
    void *a = dev_pattern(B, r, 1, 21), *b = dev_pattern(B, r, 1, 22);
    void *x, *y, *z;
    CUDAOK(cudaMalloc(&x, B));
    CUDAOK(cudaMalloc(&y, B));
    CUDAOK(cudaMalloc(&z, B));
    NCCLOK(ncclGroupStart());
    if (r == 0) {
        NCCLOK(ncclSend(a, B / 4, ncclFloat32, 1, c, s));
        NCCLOK(ncclSend(b, B / 4, ncclFloat32, 1, c, s));
    } else if (r == 1) {
        NCCLOK(ncclRecv(x, B / 4, ncclFloat32, 0, c, s));
        NCCLOK(ncclRecv(z, B / 4, ncclFloat32, n - 1, c, s)); /* n == 2: from self */
        NCCLOK(ncclRecv(y, B / 4, ncclFloat32, 0, c, s));
    }
    if (r == n - 1)
        NCCLOK(ncclSend(a, B / 4, ncclFloat32, 1, c, s)); /* pat(n-1, 1, ., 21) */
    NCCLOK(ncclGroupEnd());
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclSuccess, NULL);
    if (r == 1) {
        check_pattern(x, B, 0, 1, 21, "first send to the same peer");
        check_pattern(y, B, 0, 1, 22, "second send to the same peer");
        check_pattern(z, B, n - 1, 1, 21, "interleaved receive");
    }
    NCCLOK(ncclCommDestroy(c));
    cudaFree(a);
    cudaFree(b);
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
}

/* Without a group: rank 0 sends then receives, rank 1 receives then
 * sends: fine. A ring of ungrouped sends can not complete (each send
 * blocks until its receive runs, "This operation is blocking for the
 * GPU"): the emulator's timeout reports it. */
static void ungrouped(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    int r = g_rank, n = g_size;
    void *sb = dev_pattern(4000, r, r ^ 1, 31), *rb;
    CUDAOK(cudaMalloc(&rb, 4000));
    if (r < 2) {
        if (r == 0) {
            NCCLOK(ncclSend(sb, 1000, ncclInt32, 1, c, s));
            NCCLOK(ncclRecv(rb, 1000, ncclInt32, 1, c, s));
        } else {
            NCCLOK(ncclRecv(rb, 1000, ncclInt32, 0, c, s));
            NCCLOK(ncclSend(sb, 1000, ncclInt32, 0, c, s));
        }
        CUDAOK(cudaStreamSynchronize(s));
        expect_async(c, ncclSuccess, NULL);
        check_pattern(rb, 4000, r ^ 1, r, 31, "ungrouped pair");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    setenv("ZS_EMU_NCCL_TIMEOUT", "1", 1);
    double t0 = test_now();
    /* One slice: what blocks each send is its receive not being posted
     * (no eager completion). */
    NCCLOK(ncclSend(sb, 25, ncclInt32, (r + 1) % n, c, s));
    NCCLOK(ncclRecv(rb, 25, ncclInt32, (r + n - 1) % n, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    CHECK(test_now() - t0 < 5.0, "ungrouped ring took %.2f s", test_now() - t0);
    /* The first rank to time out fails; a peer may see that first
     * (ncclRemoteError, naming it) before its own timeout. */
    ncclResult_t st;
    NCCLOK(ncclCommGetAsyncError(c, &st));
    CHECK(st == ncclSystemError || st == ncclRemoteError, "ungrouped ring: async %d (%s)", st,
          ncclGetLastError(c));
    CHECK(strstr(ncclGetLastError(c), "waited 1 s for the peer to post its matching ncclRecv"),
          "%s", ncclGetLastError(c));
    setenv("ZS_EMU_NCCL_TIMEOUT", "60", 1);
    MPI_Barrier(MPI_COMM_WORLD);
    NCCLOK(ncclCommAbort(c));
    cudaFree(sb);
    cudaFree(rb);
}

/* Count and data type mismatches ("with the same count and data type"):
 * both ranks fail with a message naming both calls; the receive buffer
 * holds no plausible data. */
static void mismatch(cudaStream_t s, int types)
{
    ncclComm_t c = test_comm(1);
    int r = g_rank;
    void *sb = dev_pattern(400, r, 1, 41), *rb;
    CUDAOK(cudaMalloc(&rb, 400));
    const char *want = types ? "rank 0 called ncclSend(100 x float32), rank 1 called "
                               "ncclRecv(200 x bfloat16)"
                             : "rank 0 called ncclSend(100 x float32), rank 1 called "
                               "ncclRecv(99 x float32)";
    if (r == 0)
        NCCLOK(ncclSend(sb, 100, ncclFloat32, 1, c, s));
    else if (r == 1)
        NCCLOK(types ? ncclRecv(rb, 200, ncclBfloat16, 0, c, s)
                     : ncclRecv(rb, 99, ncclFloat32, 0, c, s));
    if (r < 2) {
        CUDAOK(cudaStreamSynchronize(s));
        expect_async(c, ncclInvalidUsage, want);
    }
    if (r == 1) {
        unsigned char h[400];
        CUDAOK(cudaMemcpy(h, rb, 400, cudaMemcpyDeviceToHost));
        for (int i = 0; i < (types ? 400 : 396); i++)
            CHECK(h[i] == 0xff, "mismatched receive left byte %d = %#x", i, h[i]);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    NCCLOK(ncclCommAbort(c));
    cudaFree(sb);
    cudaFree(rb);
}

/* A receive whose peer never sends: how=0 the peer stays alive (timeout),
 * 1 the peer destroys its communicator, 2 the receiver aborts. */
static void missing(cudaStream_t s, int how)
{
    ncclComm_t c = test_comm(1);
    void *rb;
    CUDAOK(cudaMalloc(&rb, 4096));
    if (g_rank == 0) {
        if (how == 0)
            setenv("ZS_EMU_NCCL_TIMEOUT", "1", 1);
        double t0 = test_now();
        NCCLOK(ncclGroupStart());
        NCCLOK(ncclRecv(rb, 1024, ncclFloat32, 1, c, s));
        NCCLOK(ncclGroupEnd());
        if (how == 2) {
            struct timespec ts = {0, 300 * 1000 * 1000};
            nanosleep(&ts, NULL);
            t0 = test_now();
            NCCLOK(ncclCommAbort(c));
            CUDAOK(cudaStreamSynchronize(s));
            CHECK(test_now() - t0 < 2.0, "abort took %.2f s", test_now() - t0);
        } else {
            CUDAOK(cudaStreamSynchronize(s));
            CHECK(test_now() - t0 < 5.0, "missing send took %.2f s", test_now() - t0);
            if (how == 0)
                expect_async(c, ncclSystemError, "rank 0 Recv #1 (1024 x float32) from rank 1");
            else
                expect_async(c, ncclInvalidUsage, "rank 1 destroyed the communicator");
            setenv("ZS_EMU_NCCL_TIMEOUT", "60", 1);
        }
    }
    if (g_rank == 1 && how == 1) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        NCCLOK(ncclCommDestroy(c));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (!(g_rank == 1 && how == 1) && !(g_rank == 0 && how == 2))
        NCCLOK(ncclCommAbort(c));
    cudaFree(rb);
}

/* The receive buffer's content is undefined until the stream work
 * completes: while rank 1's receive waits for a send rank 0 posts only
 * later, a copy on an independent stream sees garbage (0xff), not the
 * buffer's old content. */
static void undefined(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    int r = g_rank;
    void *sb = dev_pattern(512, r, 1, 61), *rb = dev_pattern(512, 9, 9, 62);
    cudaStream_t side;
    CUDAOK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    if (r == 1) {
        NCCLOK(ncclRecv(rb, 128, ncclFloat32, 0, c, s));
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL); /* the stream reached the receive; it waits for rank 0 */
        unsigned char h[512];
        CUDAOK(cudaMemcpyAsync(h, rb, 512, cudaMemcpyDeviceToHost, side));
        CUDAOK(cudaStreamSynchronize(side));
        for (int i = 0; i < 512; i++)
            CHECK(h[i] == 0xff, "receive buffer before the send: byte %d = %#x", i, h[i]);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0)
        NCCLOK(ncclSend(sb, 128, ncclFloat32, 1, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclSuccess, NULL);
    if (r == 1)
        check_pattern(rb, 512, 0, 1, 61, "receive after the send");
    NCCLOK(ncclCommDestroy(c));
    CUDAOK(cudaStreamDestroy(side));
    cudaFree(sb);
    cudaFree(rb);
}

/* Call-time refusals, each on a fresh communicator (a refusal fails it). */
static void refusals(cudaStream_t s)
{
    for (int which = 0; which < 5; which++) {
        ncclComm_t c = test_comm(1);
        char *d, host[64];
        CUDAOK(cudaMalloc((void **)&d, 1024));
        ncclResult_t rc, want = ncclInvalidArgument;
        const char *needle;
        if (which == 0) {
            rc = ncclSend(d, 16, ncclFloat32, g_size, c, s);
            needle = "is not a rank";
        } else if (which == 1) {
            rc = ncclRecv(host, 16, ncclFloat32, 0, c, s);
            needle = "not inside one device allocation";
        } else if (which == 2) {
            rc = ncclRecv(d, 257, ncclFloat32, 0, c, s); /* 1028 bytes of 1024 */
            needle = "not inside one device allocation";
        } else if (which == 3) {
            /* One group's p2p of one communicator on two streams: not
             * emulated, refused loudly. */
            cudaStream_t s2;
            CUDAOK(cudaStreamCreate(&s2));
            NCCLOK(ncclGroupStart());
            NCCLOK(ncclSend(d, 16, ncclFloat32, g_rank, c, s));
            NCCLOK(ncclRecv(d + 512, 16, ncclFloat32, g_rank, c, s2));
            rc = ncclGroupEnd();
            want = ncclInvalidUsage;
            needle = "not emulated";
            CUDAOK(cudaStreamDestroy(s2));
        } else {
            /* Two receives of one group into overlapping memory. */
            NCCLOK(ncclGroupStart());
            NCCLOK(ncclRecv(d, 64, ncclFloat32, g_rank, c, s));
            NCCLOK(ncclRecv(d + 128, 64, ncclFloat32, g_rank, c, s));
            NCCLOK(ncclSend(d + 512, 64, ncclFloat32, g_rank, c, s));
            NCCLOK(ncclSend(d + 768, 64, ncclFloat32, g_rank, c, s));
            rc = ncclGroupEnd();
            needle = "overlaps";
        }
        CHECK(rc == want, "refusal %d returned %d", which, rc);
        CHECK(strstr(ncclGetLastError(c), needle), "refusal %d: '%s' lacks '%s'", which,
              ncclGetLastError(c), needle);
        NCCLOK(ncclCommAbort(c));
        cudaFree(d);
    }
}

/* P2P between ranks 0 and 1 only, then a collective of every rank: the
 * ranks outside the exchange do not get out of step. */
static void partial(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    int r = g_rank;
    void *sb = dev_pattern(800, r, r ^ 1, 51), *rb;
    float *d, h[32];
    CUDAOK(cudaMalloc(&rb, 800));
    CUDAOK(cudaMalloc((void **)&d, sizeof h));
    for (int i = 0; i < 32; i++)
        h[i] = 1.0f;
    CUDAOK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    if (r < 2) {
        NCCLOK(ncclGroupStart());
        NCCLOK(ncclSend(sb, 200, ncclFloat32, r ^ 1, c, s));
        NCCLOK(ncclRecv(rb, 200, ncclFloat32, r ^ 1, c, s));
        NCCLOK(ncclGroupEnd());
    }
    NCCLOK(ncclAllReduce(d, d, 32, ncclFloat32, ncclSum, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclSuccess, NULL);
    CUDAOK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[31] == (float)g_size, "allreduce after a partial p2p: %g", h[31]);
    if (r < 2)
        check_pattern(rb, 800, r ^ 1, r, 51, "partial p2p");
    NCCLOK(ncclCommDestroy(c));
    cudaFree(sb);
    cudaFree(rb);
    cudaFree(d);
}

/* P2P on sub-communicators (ncclCommSplit): colour rank % 2 at np 4 (two
 * communicators of 2), one colour with reversed keys at np 2. An
 * all-to-all on each, several groups in a row. */
static void split(cudaStream_t s)
{
    ncclComm_t c = test_comm(1), sub = NULL;
    int color = g_size >= 4 ? g_rank % 2 : 0, key = g_size - g_rank;
    NCCLOK(ncclCommSplit(c, color, key, &sub, NULL));
    int sn = 0, sr = -1;
    NCCLOK(ncclCommCount(sub, &sn));
    NCCLOK(ncclCommUserRank(sub, &sr));
    int want_n = g_size >= 4 ? g_size / 2 : g_size;
    int want_r = g_size >= 4 ? (want_n - 1 - g_rank / 2) : g_size - 1 - g_rank;
    CHECK(sn == want_n && sr == want_r, "split: %d of %d, want %d of %d", sr, sn, want_r, want_n);
    /* The all-to-all on the sub-communicator: ranks are sub ranks. */
    int save_r = g_rank, save_n = g_size;
    g_rank = sr;
    g_size = sn;
    alltoall(sub, s, ncclFloat32, 333, 3, 900 + color);
    alltoall(sub, s, ncclBfloat16, 1000, 2, 950 + color);
    g_rank = save_r;
    g_size = save_n;
    /* A non-blocking config: the split may answer ncclInProgress (settle),
     * then a count-0 exchange (any pointer) and a small ring on it. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nb = NULL;
    ncclResult_t sr2 = ncclCommSplit(c, 0, g_rank, &nb, &cfg);
    CHECK(sr2 == ncclSuccess || sr2 == ncclInProgress, "non-blocking split %d", sr2);
    CHECK(test_settle(nb, NULL) == ncclSuccess, "split settle: %s", ncclGetLastError(nb));
    {
        int n = g_size, r = g_rank, next = (r + 1) % n, prev = (r + n - 1) % n;
        void *sb = dev_pattern(64, r, next, 77), *rb;
        CUDAOK(cudaMalloc(&rb, 64));
        NCCLOK(ncclGroupStart());
        NCCLOK(ncclSend(NULL, 0, ncclInt8, next, nb, s));
        NCCLOK(ncclRecv(NULL, 0, ncclInt8, prev, nb, s));
        NCCLOK(ncclSend(sb, 64, ncclUint8, next, nb, s));
        NCCLOK(ncclRecv(rb, 64, ncclUint8, prev, nb, s));
        ncclResult_t ge = ncclGroupEnd();
        CHECK(ge == ncclSuccess || ge == ncclInProgress, "group end %d", ge);
        CHECK(test_settle(nb, NULL) == ncclSuccess, "settle: %s", ncclGetLastError(nb));
        CUDAOK(cudaStreamSynchronize(s));
        expect_async(nb, ncclSuccess, NULL);
        check_pattern(rb, 64, prev, r, 77, "ring after count 0 on a non-blocking split");
        cudaFree(sb);
        cudaFree(rb);
    }
    ncclResult_t fr = ncclCommFinalize(nb);
    CHECK(fr == ncclSuccess || fr == ncclInProgress, "finalize %d", fr);
    CHECK(test_settle(nb, NULL) == ncclSuccess, "finalize settle");
    NCCLOK(ncclCommDestroy(nb));
    /* NCCL_SPLIT_NOCOLOR: no communicator. */
    ncclComm_t none = (ncclComm_t)1;
    NCCLOK(ncclCommSplit(c, g_rank == 0 ? NCCL_SPLIT_NOCOLOR : 0, g_rank, &none, NULL));
    if (g_rank == 0)
        CHECK(none == NULL, "NOCOLOR gave a communicator");
    else
        NCCLOK(ncclCommDestroy(none));
    NCCLOK(ncclCommDestroy(sub));
    NCCLOK(ncclCommDestroy(c));
    if (g_rank == 0)
        printf("split: p2p all-to-all on split communicators ok\n");
}

/* cudaLaunchHostFunc on the victim's stream: the work queued after it
 * never runs (CUDA Runtime API, Stream Management: a host function runs in
 * stream order and later work waits for it to return). */
static void CUDART_CB hold_forever(void *arg)
{
    (void)arg;
    for (;;)
        pause();
}

static void *killer(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    raise(SIGKILL);
    return NULL;
}

static int kill_child(ncclUniqueId id)
{
    cudaStream_t s;
    ncclComm_t c;
    CUDAOK(cudaStreamCreate(&s));
    NCCLOK(ncclCommInitRank(&c, g_size, id, g_rank));
    size_t count = (size_t)1 << 20; /* 4 MB per peer in 1 KiB / N slices: seconds */
    char *sb, *rb;
    CUDAOK(cudaMalloc((void **)&sb, count * 4 * g_size));
    CUDAOK(cudaMalloc((void **)&rb, count * 4 * g_size));
    int victim = g_rank == g_size - 1;
    pthread_t th;
    if (victim) { /* its share never starts: the survivors wait on it until it dies */
        CUDAOK(cudaLaunchHostFunc(s, hold_forever, NULL));
        pthread_create(&th, NULL, killer, NULL);
    }
    double t0 = test_now();
    NCCLOK(ncclGroupStart());
    for (int p = 0; p < g_size; p++) {
        NCCLOK(ncclSend(sb + p * count * 4, count, ncclFloat32, p, c, s));
        NCCLOK(ncclRecv(rb + p * count * 4, count, ncclFloat32, p, c, s));
    }
    NCCLOK(ncclGroupEnd());
    CUDAOK(cudaStreamSynchronize(s));
    CHECK(!victim, "the victim finished its all-to-all");
    double dt = test_now() - t0;
    char want[64];
    snprintf(want, sizeof want, "rank %d (pid", g_size - 1);
    expect_async(c, ncclRemoteError, want);
    CHECK(strstr(ncclGetLastError(c), "died"), "%s", ncclGetLastError(c));
    CHECK(dt < 2.5, "detected after %.2f s", dt);
    NCCLOK(ncclCommAbort(c));
    printf("kill: rank %d saw '%s' after %.2f s\n", g_rank, ncclGetLastError(c), dt);
    fflush(stdout);
    return 0;
}

static int kill_main(int nranks)
{
    g_rank = -1;
    g_size = nranks;
    setenv("ZS_EMU_NCCL_CHUNK", "1024", 1);
    ncclUniqueId id;
    NCCLOK(ncclGetUniqueId(&id));
    pid_t pids[64];
    for (int k = 0; k < nranks; k++) {
        pids[k] = fork();
        if (pids[k] == 0) {
            g_rank = k;
            alarm(60); /* a child never outlives the test */
            _exit(kill_child(id));
        }
    }
    alarm(90);
    int bad = 0;
    for (int k = 0; k < nranks; k++) {
        int st;
        waitpid(pids[k], &st, 0);
        int ok = k == nranks - 1 ? (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
                                 : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
        if (!ok) {
            fprintf(stderr, "FAIL p2p kill test: rank %d status 0x%x\n", k, st);
            bad = 1;
        }
    }
    printf("test_emu_nccl_p2p --kill %d: %s\n", nranks, bad ? "FAILED" : "passed");
    return bad;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--kill") == 0)
        return kill_main(atoi(argv[2]));
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    setenv("ZS_EMU_NCCL_CHUNK", "1024", 1); /* many slices per message */
    setenv("ZS_EMU_NCCL_TIMEOUT", "60", 0);
    cudaStream_t s;
    CUDAOK(cudaStreamCreate(&s));
    const char *only = getenv("ZS_TEST_P2P_ONLY"); /* parts to run (substring match) */
    if (only && !*only)
        only = NULL;
#define PART(name, call)                                                                           \
    do {                                                                                           \
        if (!only || strstr(name, only)) {                                                         \
            call;                                                                                  \
            MPI_Barrier(MPI_COMM_WORLD);                                                           \
            if (g_rank == 0)                                                                       \
                printf("p2p: %s ok\n", name);                                                      \
        }                                                                                          \
    } while (0)
    PART("ring", ring(s));
    PART("alltoall", alltoalls(s));
    PART("self", self(s));
    PART("ordering", ordering(s));
    PART("ungrouped", ungrouped(s));
    PART("mismatch-count", mismatch(s, 0));
    PART("mismatch-type", mismatch(s, 1));
    PART("missing-timeout", missing(s, 0));
    PART("missing-destroyed", missing(s, 1));
    PART("missing-abort", missing(s, 2));
    PART("undefined", undefined(s));
    PART("refusals", refusals(s));
    PART("partial", partial(s));
    PART("split", split(s));
    CUDAOK(cudaStreamDestroy(s));
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_emu_nccl_p2p: np %d passed\n", g_size);
    MPI_Finalize();
    return 0;
}
