/*
 * test_emu_nccl.c - the emulated NCCL's own test, run under mpiexec at
 * np 2 and 4 (and with --kill / --kill-before without MPI: see
 * test_emu_nccl_faults.c). This half: every collective x data type x op,
 * out of place and in place, against a CPU reference computed here in the
 * documented order (rank 0's value, op rank 1's, ..., rounded to the type
 * after every step), compared bitwise; small staging so collectives run in
 * several chunks; a grouped launch of 128 collectives.
 */
#define _GNU_SOURCE
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <string.h>
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

/* --- the reference, written independently of emu_nccl_reduce.c --- */

static float bf(float f) /* round to bfloat16, nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static float rnd(ncclDataType_t t, float f)
{
    if (t == ncclFloat16)
        return (float)(_Float16)f;
    if (t == ncclBfloat16)
        return bf(f);
    return f;
}

static size_t esz(ncclDataType_t t)
{
    return t == ncclFloat32 ? 4 : 2;
}

static void put(ncclDataType_t t, void *buf, size_t i, float f)
{
    if (t == ncclFloat32) {
        ((float *)buf)[i] = f;
    } else if (t == ncclFloat16) {
        _Float16 h = (_Float16)f;
        memcpy((char *)buf + 2 * i, &h, 2);
    } else {
        uint32_t u;
        f = bf(f);
        memcpy(&u, &f, 4);
        uint16_t h = (uint16_t)(u >> 16);
        memcpy((char *)buf + 2 * i, &h, 2);
    }
}

/* Rank k's input element i: values with many fraction bits, so that the
 * order and the rounding of every step show in the result. */
static float gen(ncclDataType_t t, int k, size_t i, int salt)
{
    uint32_t h = (uint32_t)(k * 7919 + i * 104729 + salt * 15485863u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return rnd(t, ((float)(h % 20001) - 10000.0f) / 1237.0f);
}

static float opf(ncclRedOp_t op, float a, float b)
{
    if (op == ncclSum)
        return a + b;
    if (op == ncclProd)
        return a * b;
    if (op == ncclMax)
        return a > b ? a : b;
    return a < b ? a : b;
}

static float reduce_ref(ncclDataType_t t, ncclRedOp_t op, size_t i, int salt)
{
    ncclRedOp_t step = op == ncclAvg ? ncclSum : op;
    float v = gen(t, 0, i, salt);
    for (int k = 1; k < g_size; k++)
        v = rnd(t, opf(step, v, gen(t, k, i, salt)));
    return op == ncclAvg ? rnd(t, v / (float)g_size) : v;
}

enum { AR, RS, AG, BC, RD };
static const char *names[] = {"AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce"};

/* One collective, out of place or in place; checks the result bitwise. */
static void one(ncclComm_t c, cudaStream_t s, int kind, ncclDataType_t t, ncclRedOp_t op,
                size_t count, int inplace, int salt)
{
    int n = g_size, r = g_rank, root = kind == BC ? n - 1 : 0;
    size_t e = esz(t);
    size_t sn = kind == RS ? n * count : count; /* send elements */
    size_t rn = kind == AG ? n * count : count; /* recv elements */
    size_t big = sn > rn ? sn : rn;
    char *h_in = malloc(big * e + 1), *h_out = malloc(big * e + 1), *h_exp = malloc(big * e + 1);
    for (size_t i = 0; i < sn; i++)
        put(t, h_in, i, gen(t, r, i, salt));
    void *d_a = NULL, *d_b = NULL, *send, *recv;
    CUDAOK(cudaMalloc(&d_a, big * e));
    if (!inplace)
        CUDAOK(cudaMalloc(&d_b, rn * e));
    memset(h_out, 0x55, big * e);
    if (inplace) {
        /* "In-place Operations": RS recv at send + rank * recvcount; AG send
         * at recv + rank * sendcount; the others send == recv. */
        if (kind == AG) {
            CUDAOK(cudaMemcpy(d_a, h_out, big * e, cudaMemcpyHostToDevice));
            recv = d_a;
            send = (char *)d_a + (size_t)r * count * e;
        } else {
            send = d_a;
            recv = kind == RS ? (char *)d_a + (size_t)r * count * e : d_a;
        }
        CUDAOK(cudaMemcpy(send, h_in, sn * e, cudaMemcpyHostToDevice));
    } else {
        send = d_a;
        recv = d_b;
        CUDAOK(cudaMemcpy(send, h_in, sn * e, cudaMemcpyHostToDevice));
        CUDAOK(cudaMemcpy(recv, h_out, rn * e, cudaMemcpyHostToDevice));
    }
    switch (kind) {
    case AR:
        NCCLOK(ncclAllReduce(send, recv, count, t, op, c, s));
        break;
    case RS:
        NCCLOK(ncclReduceScatter(send, recv, count, t, op, c, s));
        break;
    case AG:
        NCCLOK(ncclAllGather(send, recv, count, t, c, s));
        break;
    case BC:
        NCCLOK(ncclBroadcast(send, recv, count, t, root, c, s));
        break;
    default:
        NCCLOK(ncclReduce(send, recv, count, t, op, root, c, s));
    }
    CUDAOK(cudaStreamSynchronize(s));
    ncclResult_t st;
    NCCLOK(ncclCommGetAsyncError(c, &st));
    CHECK(st == ncclSuccess, "async %d: %s", st, ncclGetLastError(c));
    if (rn)
        CUDAOK(cudaMemcpy(h_out, recv, rn * e, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < rn; i++) {
        float v;
        if (kind == AR || kind == RD)
            v = reduce_ref(t, op, i, salt);
        else if (kind == RS)
            v = reduce_ref(t, op, (size_t)r * count + i, salt);
        else if (kind == AG)
            v = gen(t, (int)(i / count), i % count, salt);
        else
            v = gen(t, root, i, salt);
        put(t, h_exp, i, v);
    }
    if (!(kind == RD && r != root))
        CHECK(rn == 0 || memcmp(h_out, h_exp, rn * e) == 0,
              "%s(%zu, type %d, op %d, %s) differs from the reference", names[kind], count, t, op,
              inplace ? "in place" : "out of place");
    cudaFree(d_a);
    if (d_b)
        cudaFree(d_b);
    free(h_in);
    free(h_out);
    free(h_exp);
}

static void test_results(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    int cnt = 0, rank = -1, dev = -1;
    NCCLOK(ncclCommCount(c, &cnt));
    NCCLOK(ncclCommUserRank(c, &rank));
    NCCLOK(ncclCommCuDevice(c, &dev));
    CHECK(cnt == g_size && rank == g_rank && dev == 0, "%d %d %d", cnt, rank, dev);
    ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclFloat16};
    ncclRedOp_t ops[] = {ncclSum, ncclMax, ncclMin, ncclProd, ncclAvg};
    size_t counts[] = {1, 7, 1000, 3001}; /* staging of 1 KiB: up to 47 chunks */
    int salt = 0, nops = 0;
    for (int kind = AR; kind <= RD; kind++)
        for (int ti = 0; ti < 3; ti++)
            for (int oi = 0; oi < 5; oi++) {
                if ((kind == AG || kind == BC) && oi > 0)
                    continue;
                if (kind != AR && oi > 1)
                    continue; /* min, prod and avg: all-reduce only */
                for (int ci = 0; ci < 4; ci++)
                    for (int ip = 0; ip < 2; ip++, nops++)
                        one(c, s, kind, types[ti], ops[oi], counts[ci], ip, ++salt);
            }
    /* The legacy in-place broadcast. */
    float hb[64], *db;
    for (int i = 0; i < 64; i++)
        hb[i] = (float)(g_rank * 100 + i);
    CUDAOK(cudaMalloc((void **)&db, sizeof hb));
    CUDAOK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
    NCCLOK(ncclBcast(db, 64, ncclFloat32, 1, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    CUDAOK(cudaMemcpy(hb, db, sizeof hb, cudaMemcpyDeviceToHost));
    CHECK(hb[0] == 100.0f && hb[63] == 163.0f, "bcast %g %g", hb[0], hb[63]);
    cudaFree(db);
    /* count 0 is a collective too (matched across ranks), any pointers. */
    NCCLOK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    NCCLOK(ncclCommDestroy(c));
    if (g_rank == 0)
        printf("results: %d collectives bitwise equal to the reference\n", nops);
}

/* 128 collectives in one group (with a nested group inside), launched at
 * the outermost ncclGroupEnd, on a non-blocking communicator whose group
 * end may answer ncclInProgress. */
static void test_group(cudaStream_t s)
{
    ncclComm_t c = test_comm(0);
    enum { N = 128, CNT = 300 };
    int n = g_size, r = g_rank;
    float *h = malloc(sizeof(float) * CNT * n);
    void *d[N];
    for (int j = 0; j < N; j++) {
        CUDAOK(cudaMalloc(&d[j], sizeof(float) * CNT * n));
        for (int i = 0; i < CNT * n; i++)
            h[i] = gen(ncclFloat32, r, (size_t)i, 5000 + j);
        CUDAOK(cudaMemcpy(d[j], h, sizeof(float) * CNT * n, cudaMemcpyHostToDevice));
    }
    NCCLOK(ncclGroupStart());
    for (int j = 0; j < N; j++) {
        if (j == N / 2)
            NCCLOK(ncclGroupStart());
        if (j % 3 == 0)
            NCCLOK(ncclAllReduce(d[j], d[j], CNT, ncclFloat32, ncclSum, c, s));
        else if (j % 3 == 1)
            NCCLOK(
                ncclReduceScatter(d[j], (float *)d[j] + r * CNT, CNT, ncclFloat32, ncclSum, c, s));
        else
            NCCLOK(ncclAllGather((float *)d[j] + r * CNT, d[j], CNT, ncclFloat32, c, s));
        if (j == N / 2 + 10)
            NCCLOK(ncclGroupEnd()); /* inner end: launches nothing yet */
    }
    ncclResult_t ge = ncclGroupEnd();
    CHECK(ge == ncclSuccess || ge == ncclInProgress, "group end %d", ge);
    CHECK(test_settle(c, NULL) == ncclSuccess, "settle: %s", ncclGetLastError(c));
    CUDAOK(cudaStreamSynchronize(s));
    for (int j = 0; j < N; j++) {
        CUDAOK(cudaMemcpy(h, d[j], sizeof(float) * CNT * n, cudaMemcpyDeviceToHost));
        for (int i = 0; i < CNT; i++) {
            float v;
            if (j % 3 == 0)
                v = reduce_ref(ncclFloat32, ncclSum, (size_t)i, 5000 + j);
            else if (j % 3 == 1)
                v = reduce_ref(ncclFloat32, ncclSum, (size_t)(r * CNT + i), 5000 + j);
            else
                v = gen(ncclFloat32, n - 1, (size_t)(n - 1) * CNT + i, 5000 + j);
            float got = j % 3 == 1 ? h[r * CNT + i] : j % 3 == 2 ? h[(n - 1) * CNT + i] : h[i];
            CHECK(memcmp(&got, &v, 4) == 0, "group op %d element %d: %g != %g", j, i, got, v);
        }
        cudaFree(d[j]);
    }
    ncclResult_t fr = ncclCommFinalize(c);
    CHECK(fr == ncclSuccess || fr == ncclInProgress, "finalize %d", fr);
    CHECK(test_settle(c, NULL) == ncclSuccess, "finalize settle");
    NCCLOK(ncclCommDestroy(c));
    free(h);
    if (g_rank == 0)
        printf("group: %d collectives in one group ok\n", N);
}

/* Collectives of one communicator alternating between two streams: they
 * run in call order on every rank (the cross-rank order is the call
 * order), although the streams' executors run concurrently. */
static void test_streams(cudaStream_t s)
{
    enum { N = 24, CNT = 2000 };
    ncclComm_t c = test_comm(1);
    cudaStream_t s2;
    CUDAOK(cudaStreamCreate(&s2));
    float *h = malloc(sizeof(float) * CNT);
    void *d[N];
    for (int j = 0; j < N; j++) {
        CUDAOK(cudaMalloc(&d[j], sizeof(float) * CNT));
        for (int i = 0; i < CNT; i++)
            h[i] = gen(ncclFloat32, g_rank, (size_t)i, 9000 + j);
        CUDAOK(cudaMemcpy(d[j], h, sizeof(float) * CNT, cudaMemcpyHostToDevice));
    }
    /* Rank-dependent stream choice: the order must come from the calls. */
    for (int j = 0; j < N; j++) {
        size_t cnt = CNT - (size_t)j * 10; /* a different count each: a swap is a mismatch */
        NCCLOK(
            ncclAllReduce(d[j], d[j], cnt, ncclFloat32, ncclSum, c, ((j + g_rank) & 1) ? s2 : s));
    }
    CUDAOK(cudaStreamSynchronize(s));
    CUDAOK(cudaStreamSynchronize(s2));
    ncclResult_t st;
    NCCLOK(ncclCommGetAsyncError(c, &st));
    CHECK(st == ncclSuccess, "two streams: %s", ncclGetLastError(c));
    for (int j = 0; j < N; j++) {
        CUDAOK(cudaMemcpy(h, d[j], sizeof(float) * CNT, cudaMemcpyDeviceToHost));
        for (int i = 0; i < CNT - j * 10; i++) {
            float v = reduce_ref(ncclFloat32, ncclSum, (size_t)i, 9000 + j);
            CHECK(memcmp(&h[i], &v, 4) == 0, "two streams: op %d element %d", j, i);
        }
        cudaFree(d[j]);
    }
    NCCLOK(ncclCommDestroy(c));
    CUDAOK(cudaStreamDestroy(s2));
    free(h);
    if (g_rank == 0)
        printf("streams: %d collectives on two streams in call order ok\n", N);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--freed") == 0)
        return test_freed_main();
    if (argc >= 2 && strncmp(argv[1], "--kill", 6) == 0)
        return test_kill_main(argc >= 3 ? atoi(argv[2]) : 3, strcmp(argv[1], "--kill-before") == 0);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    setenv("ZS_EMU_NCCL_CHUNK", "1024", 1); /* many chunks per collective */
    setenv("ZS_EMU_NCCL_TIMEOUT", "60", 0);
    cudaStream_t s;
    CUDAOK(cudaStreamCreate(&s));
    test_results(s);
    test_group(s);
    test_streams(s);
    test_faults(s);
    CUDAOK(cudaStreamDestroy(s));
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_emu_nccl: np %d passed\n", g_size);
    MPI_Finalize();
    return 0;
}
