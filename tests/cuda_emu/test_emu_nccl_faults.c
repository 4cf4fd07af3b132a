/*
 * test_emu_nccl_faults.c - the emulated NCCL's refusals and faults: wrong
 * in-place offsets and other overlaps refused, host and short buffers
 * refused, a mismatch named on every rank, a collective skipped on one
 * rank, a group left open at destroy, use after destroy/abort, the
 * ncclInProgress settle (and its omission refused), ncclCommAbort
 * releasing a blocked collective; and, without MPI (--kill N,
 * --kill-before N), a rank killed before or in the middle of a collective,
 * reported on the others within a deadline.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "test_emu_nccl.h"

enum { CNT = 256 };

static void expect_async(ncclComm_t c, ncclResult_t want, const char *needle)
{
    ncclResult_t st;
    NCCLOK(ncclCommGetAsyncError(c, &st));
    CHECK(st == want, "async error %d, want %d (%s)", st, want, ncclGetLastError(c));
    CHECK(!needle || strstr(ncclGetLastError(c), needle), "last error '%s' lacks '%s'",
          ncclGetLastError(c), needle);
}

/* Each refused call fails its communicator: one fresh communicator each. */
static void refusal(cudaStream_t s, int which)
{
    ncclComm_t c = test_comm(1);
    int n = g_size, r = g_rank, wrong = (r + 1) % n;
    float *buf, host[CNT];
    CUDAOK(cudaMalloc((void **)&buf, sizeof(float) * CNT * n));
    ncclResult_t rc = ncclSuccess;
    const char *needle = NULL;
    switch (which) {
    case 0: /* reduce-scatter's recv at another rank's offset */
        rc = ncclReduceScatter(buf, buf + wrong * CNT, CNT, ncclFloat32, ncclSum, c, s);
        needle = "sendbuff + rank * recvcount";
        break;
    case 1: /* all-gather's send at another rank's offset */
        rc = ncclAllGather(buf + wrong * CNT, buf, CNT, ncclFloat32, c, s);
        needle = "recvbuff + rank * sendcount";
        break;
    case 2: /* all-reduce with buffers overlapping, not equal */
        rc = ncclAllReduce(buf, buf + 1, CNT, ncclFloat32, ncclSum, c, s);
        needle = "overlap without being equal";
        break;
    case 3: /* host memory */
        rc = ncclAllReduce(host, buf, CNT, ncclFloat32, ncclSum, c, s);
        needle = "not inside one device allocation";
        break;
    case 4: /* all-gather's recv too short for nranks * sendcount */
        rc = ncclAllGather(buf, buf + CNT * (n - 1) + 1, CNT, ncclFloat32, c, s);
        needle = "not inside one device allocation";
        break;
    default: /* a data type the emulator does not do */
        rc = ncclAllReduce(buf, buf, CNT, ncclInt32, ncclSum, c, s);
        needle = "not supported";
    }
    CHECK(rc == ncclInvalidArgument, "refusal %d returned %d", which, rc);
    CHECK(strstr(ncclGetLastError(c), needle), "refusal %d: '%s' lacks '%s'", which,
          ncclGetLastError(c), needle);
    expect_async(c, ncclInvalidArgument, NULL);
    NCCLOK(ncclCommAbort(c));
    cudaFree(buf);
}

static void mismatch(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    void *a, *b;
    CUDAOK(cudaMalloc(&a, 4096 * 4));
    CUDAOK(cudaMalloc(&b, 4096 * 4));
    if (g_rank == 0)
        NCCLOK(ncclAllReduce(a, b, 1024, ncclFloat32, ncclSum, c, s));
    else
        NCCLOK(ncclAllGather(a, b, 512, ncclBfloat16, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    expect_async(c, ncclInvalidUsage,
                 "cuda-emu nccl: collective #1: rank 0 called AllReduce(1024 x float32, sum), "
                 "rank 1 called AllGather(512 x bfloat16)");
    NCCLOK(ncclCommAbort(c));
    cudaFree(a);
    cudaFree(b);
}

/* The last rank skips the second all-reduce and destroys its communicator:
 * the others' second all-reduce is refused, naming it. */
static void skipped(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    void *a;
    CUDAOK(cudaMalloc(&a, CNT * 4));
    NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    if (g_rank == g_size - 1) {
        NCCLOK(ncclCommDestroy(c));
    } else {
        NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
        CUDAOK(cudaStreamSynchronize(s));
        expect_async(c, ncclInvalidUsage, "destroyed the communicator after 1 collectives");
        NCCLOK(ncclCommAbort(c));
    }
    cudaFree(a);
}

static void group_rules(cudaStream_t s)
{
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "group end without start");
    ncclComm_t c = test_comm(1);
    void *a;
    CUDAOK(cudaMalloc(&a, CNT * 4));
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
    CHECK(ncclCommDestroy(c) == ncclInvalidUsage, "destroy with a group open");
    CHECK(strstr(ncclGetLastError(c), "group open"), "%s", ncclGetLastError(c));
    ncclGroupEnd();
    CUDAOK(cudaStreamSynchronize(s));
    NCCLOK(ncclCommAbort(c));
    /* After abort and destroy the handle is refused. */
    CHECK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s) == ncclInvalidUsage, "after abort");
    ncclComm_t d = test_comm(1);
    NCCLOK(ncclCommDestroy(d));
    int cnt;
    CHECK(ncclCommCount(d, &cnt) == ncclInvalidUsage, "after destroy");
    cudaFree(a);
}

static void inprogress(cudaStream_t s)
{
    setenv("ZS_EMU_NCCL_INPROGRESS", "always", 1);
    ncclUniqueId id;
    if (g_rank == 0)
        NCCLOK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c;
    /* Rank 0's init returns before the others even start theirs (the
     * rendezvous goes on while it settles). */
    if (g_rank == 0)
        CHECK(ncclCommInitRankConfig(&c, g_size, id, g_rank, &cfg) == ncclInProgress, "init");
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank != 0)
        CHECK(ncclCommInitRankConfig(&c, g_size, id, g_rank, &cfg) == ncclInProgress, "init");
    CHECK(test_settle(c, NULL) == ncclSuccess, "settle");
    float h[CNT], *a;
    for (int i = 0; i < CNT; i++)
        h[i] = (float)(g_rank + 1);
    CUDAOK(cudaMalloc((void **)&a, sizeof h));
    CUDAOK(cudaMemcpy(a, h, sizeof h, cudaMemcpyHostToDevice));
    CHECK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s) == ncclInProgress, "collective");
    /* Not settled: the emulator holds the op back, the stream has nothing. */
    CUDAOK(cudaStreamSynchronize(s));
    CUDAOK(cudaMemcpy(h, a, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[0] == (float)(g_rank + 1), "ran before the settle");
    CHECK(test_settle(c, NULL) == ncclSuccess, "settle: %s", ncclGetLastError(c));
    CUDAOK(cudaStreamSynchronize(s));
    CUDAOK(cudaMemcpy(h, a, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[CNT - 1] == (float)(g_size * (g_size + 1) / 2), "sum %g", h[CNT - 1]);
    if (ncclCommFinalize(c) == ncclInProgress)
        CHECK(test_settle(c, NULL) == ncclSuccess, "finalize");
    NCCLOK(ncclCommDestroy(c));

    /* A caller that does not settle is refused. */
    if (g_rank == 0)
        NCCLOK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(ncclCommInitRankConfig(&c, g_size, id, g_rank, &cfg) == ncclInProgress, "init");
    ncclResult_t ns = ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s);
    CHECK(ns == ncclInvalidUsage, "no settle: %d: %s", ns, ncclGetLastError(c));
    CHECK(strstr(ncclGetLastError(c), "ncclInProgress"), "%s", ncclGetLastError(c));
    /* Abort only once every rank made its call: an abort during the
     * background rendezvous fails the init of the ranks still attaching. */
    MPI_Barrier(MPI_COMM_WORLD);
    NCCLOK(ncclCommAbort(c));
    cudaFree(a);
    unsetenv("ZS_EMU_NCCL_INPROGRESS");
}

/* Rank 0 launches an all-reduce no one else joins; ncclCommAbort must
 * release it (the stream work finishes) promptly. */
static void abort_releases(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    void *a;
    CUDAOK(cudaMalloc(&a, CNT * 4));
    if (g_rank == 0) {
        NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double t0 = test_now();
        NCCLOK(ncclCommAbort(c));
        CUDAOK(cudaStreamSynchronize(s));
        CHECK(test_now() - t0 < 2.0, "abort took %.2f s", test_now() - t0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank != 0) {
        /* The peers of the aborted rank: their next collective fails. */
        NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
        CUDAOK(cudaStreamSynchronize(s));
        expect_async(c, ncclRemoteError, "rank 0 called ncclCommAbort");
        NCCLOK(ncclCommAbort(c));
    }
    cudaFree(a);
}

/* A live peer that never joins: after ZS_EMU_NCCL_TIMEOUT the wait ends
 * with ncclSystemError (real NCCL would hang). */
static void timeout(cudaStream_t s)
{
    ncclComm_t c = test_comm(1);
    void *a;
    CUDAOK(cudaMalloc(&a, CNT * 4));
    if (g_rank == 0) {
        setenv("ZS_EMU_NCCL_TIMEOUT", "1", 1);
        double t0 = test_now();
        NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
        CUDAOK(cudaStreamSynchronize(s));
        CHECK(test_now() - t0 < 3.0, "timeout took %.2f s", test_now() - t0);
        expect_async(c, ncclSystemError, "ZS_EMU_NCCL_TIMEOUT");
        setenv("ZS_EMU_NCCL_TIMEOUT", "60", 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    NCCLOK(ncclCommAbort(c));
    cudaFree(a);
}

void test_faults(cudaStream_t s)
{
    for (int i = 0; i < 6; i++)
        refusal(s, i);
    mismatch(s);
    skipped(s);
    group_rules(s);
    inprogress(s);
    abort_releases(s);
    timeout(s);
    if (g_rank == 0)
        printf("faults: refusals, mismatch, skipped, group rules, settle, abort, timeout ok\n");
}

/* --- kill test: nranks forked processes, no MPI --- */

static void *killer(void *arg)
{
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    raise(SIGKILL);
    return NULL;
}

static int kill_child(ncclUniqueId id, int before)
{
    cudaStream_t s;
    ncclComm_t c;
    CUDAOK(cudaStreamCreate(&s));
    NCCLOK(ncclCommInitRank(&c, g_size, id, g_rank));
    size_t big = (size_t)4 << 20; /* 16 MB in 1 KiB chunks: seconds of barriers */
    void *a;
    CUDAOK(cudaMalloc(&a, big * 4));
    NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    int victim = g_rank == g_size - 1;
    if (victim && before)
        raise(SIGKILL);
    pthread_t th;
    if (victim)
        pthread_create(&th, NULL, killer, NULL);
    double t0 = test_now();
    NCCLOK(ncclAllReduce(a, a, big, ncclFloat32, ncclSum, c, s));
    CUDAOK(cudaStreamSynchronize(s));
    CHECK(!victim, "the victim finished its collective");
    double dt = test_now() - t0;
    char want[64];
    snprintf(want, sizeof want, "rank %d (pid", g_size - 1);
    expect_async(c, ncclRemoteError, want);
    CHECK(strstr(ncclGetLastError(c), "died"), "%s", ncclGetLastError(c));
    /* The victim dies 50 ms in (or before): 2 s is the detection deadline. */
    CHECK(dt < 2.5, "detected after %.2f s", dt);
    NCCLOK(ncclCommAbort(c));
    printf("kill: rank %d saw '%s' after %.2f s\n", g_rank, ncclGetLastError(c), dt);
    fflush(stdout);
    return 0;
}

int test_kill_main(int nranks, int before)
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
            _exit(kill_child(id, before));
        }
    }
    alarm(90); /* hard timeout: SIGALRM ends the parent, failing the test */
    int bad = 0;
    /* Reap the survivors first: the victim stays a zombie meanwhile, which
     * kill(pid, 0) still finds (the emulator must see through it). */
    for (int k = 0; k < nranks; k++) {
        int st;
        waitpid(pids[k], &st, 0);
        int want_kill = k == nranks - 1;
        int ok = want_kill ? (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
                           : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
        if (!ok) {
            fprintf(stderr, "FAIL kill test: rank %d status 0x%x\n", k, st);
            bad = 1;
        }
    }
    printf("test_emu_nccl --kill%s %d: %s\n", before ? "-before" : "", nranks,
           bad ? "FAILED" : "passed");
    return bad;
}

/* --- freed test: one rank, no MPI (the sticky error ends the process's
 * device, so it runs alone) --- */

static void CUDART_CB sleepy(void *arg)
{
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* A buffer freed (cudaFreeAsync on another stream) before its collective
 * runs: the collective faults like an illegal address on a GPU (sticky
 * error of the device) and fails the communicator. */
int test_freed_main(void)
{
    g_rank = 0;
    g_size = 1;
    ncclUniqueId id;
    ncclComm_t c;
    cudaStream_t s, s2;
    void *a;
    NCCLOK(ncclGetUniqueId(&id));
    NCCLOK(ncclCommInitRank(&c, 1, id, 0));
    CUDAOK(cudaStreamCreate(&s));
    CUDAOK(cudaStreamCreate(&s2));
    CUDAOK(cudaMalloc(&a, CNT * 4));
    CUDAOK(cudaLaunchHostFunc(s, sleepy, NULL)); /* holds s back */
    NCCLOK(ncclAllReduce(a, a, CNT, ncclFloat32, ncclSum, c, s));
    CUDAOK(cudaFreeAsync(a, s2));
    CUDAOK(cudaStreamSynchronize(s2));
    cudaError_t e = cudaStreamSynchronize(s);
    CHECK(e == cudaErrorIllegalAddress, "stream sync returned %d", (int)e);
    expect_async(c, ncclUnhandledCudaError, "no longer device memory");
    NCCLOK(ncclCommAbort(c));
    printf("test_emu_nccl --freed: passed\n");
    return 0;
}
