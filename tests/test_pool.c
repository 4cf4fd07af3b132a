/*
 * test_pool.c - tests of common/zs_pool.c.
 *
 * Verifies: every task of a zs_pool_run runs exactly once and the run returns
 * only after all of them finished; thread indices lie in [0, zs_pool_threads)
 * and the spawned threads really take part; many repeated runs of varying
 * sizes (0, 1, fewer and more tasks than threads) on one pool; a pool of one
 * thread runs everything on the caller; nthreads <= 0 means the online CPUs;
 * two threads calling zs_pool_run on the same pool concurrently are
 * serialised (tasks of the two runs never overlap) and both complete.
 *
 * Does not test scheduling fairness or speed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs_pool.h"
#include "zs_test.h"

#define MAX_TASKS 4096

typedef struct {
    atomic_int count[MAX_TASKS]; /* runs of each task */
    atomic_int by_thread[64];    /* tasks run per thread index */
    atomic_int bad_thread;       /* thread index out of range seen */
    int nthreads;
    int spin; /* busy work per task, to let threads overlap */
} job_t;

static void spin_for(int iters)
{
    volatile uint32_t x = 1;
    for (int i = 0; i < iters; i++)
        x = x * 1664525u + 1013904223u;
}

static void count_task(void *arg, size_t task, int thread)
{
    job_t *j = arg;
    if (thread < 0 || thread >= j->nthreads || thread >= 64)
        atomic_store(&j->bad_thread, 1);
    else
        atomic_fetch_add(&j->by_thread[thread], 1);
    spin_for(j->spin);
    atomic_fetch_add(&j->count[task], 1);
}

static void job_reset(job_t *j, int nthreads, int spin)
{
    memset(j, 0, sizeof *j);
    j->nthreads = nthreads;
    j->spin = spin;
}

/* Run ntasks and check each ran exactly once, by an in-range thread. */
static void run_and_check(zs_pool_t *pool, job_t *j, size_t ntasks, int spin)
{
    job_reset(j, zs_pool_threads(pool), spin);
    zs_pool_run(pool, ntasks, count_task, j);
    TEST_CHECKF(!atomic_load(&j->bad_thread), "thread index out of range (ntasks %zu)", ntasks);
    for (size_t t = 0; t < MAX_TASKS; t++) {
        int want = t < ntasks ? 1 : 0;
        TEST_CHECKF(atomic_load(&j->count[t]) == want, "task %zu ran %d times (ntasks %zu)", t,
                    atomic_load(&j->count[t]), ntasks);
    }
}

static void test_basic(void)
{
    static job_t j;
    zs_pool_t *pool = zs_pool_create(4);
    TEST_CHECK(pool != NULL);
    TEST_CHECK(zs_pool_threads(pool) == 4);
    static const size_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 64, 1000, MAX_TASKS};
    for (int rep = 0; rep < 300; rep++)
        run_and_check(pool, &j, sizes[rep % 10], rep % 3 == 0 ? 200 : 0);

    /* With slow tasks, spawned threads (index > 0) take part. */
    int helpers = 0;
    for (int rep = 0; rep < 20 && !helpers; rep++) {
        run_and_check(pool, &j, 256, 20000);
        for (int t = 1; t < 4; t++)
            helpers += atomic_load(&j.by_thread[t]) > 0;
    }
    TEST_CHECKF(helpers > 0, "no task ever ran on a spawned thread");
    zs_pool_destroy(pool);
    zs_pool_destroy(NULL); /* no-op */
}

static void test_single_thread(void)
{
    static job_t j;
    zs_pool_t *pool = zs_pool_create(1);
    TEST_CHECK(pool != NULL);
    TEST_CHECK(zs_pool_threads(pool) == 1);
    for (int rep = 0; rep < 100; rep++) {
        run_and_check(pool, &j, (size_t)rep * 37 % MAX_TASKS, 0);
        TEST_CHECK(atomic_load(&j.by_thread[0]) == (int)((size_t)rep * 37 % MAX_TASKS));
    }
    zs_pool_destroy(pool);
}

static void test_default_threads(void)
{
    static job_t j;
    zs_pool_t *pool = zs_pool_create(0);
    TEST_CHECK(pool != NULL);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    TEST_CHECKF(zs_pool_threads(pool) == (cpus > 0 ? (int)cpus : 1), "%d threads, %ld cpus",
                zs_pool_threads(pool), cpus);
    run_and_check(pool, &j, 999, 10);
    zs_pool_destroy(pool);
}

/* ------------------------------------------------ concurrent callers */

typedef struct {
    zs_pool_t *pool;
    int id;               /* 0 or 1 */
    atomic_int *inflight; /* tasks of each caller running right now */
    atomic_int *overlap;  /* set when tasks of both callers overlapped */
    atomic_int count[512];
    int runs_done;
} caller_t;

static void caller_task(void *arg, size_t task, int thread)
{
    caller_t *c = arg;
    atomic_fetch_add(&c->inflight[c->id], 1);
    if (atomic_load(&c->inflight[1 - c->id]) != 0)
        atomic_store(c->overlap, 1);
    spin_for(300);
    if (atomic_load(&c->inflight[1 - c->id]) != 0)
        atomic_store(c->overlap, 1);
    atomic_fetch_sub(&c->inflight[c->id], 1);
    atomic_fetch_add(&c->count[task], 1);
}

static void *caller_main(void *arg)
{
    caller_t *c = arg;
    for (int r = 0; r < 400; r++) {
        size_t ntasks = 1 + (size_t)(r * 7 + c->id * 3) % 512;
        for (size_t t = 0; t < 512; t++)
            atomic_store(&c->count[t], 0);
        zs_pool_run(c->pool, ntasks, caller_task, c);
        for (size_t t = 0; t < 512; t++)
            if (atomic_load(&c->count[t]) != (t < ntasks ? 1 : 0))
                return (void *)1; /* checked by the joining thread */
        c->runs_done++;
    }
    return NULL;
}

static void test_concurrent_callers(void)
{
    zs_pool_t *pool = zs_pool_create(3);
    TEST_CHECK(pool != NULL);
    atomic_int inflight[2] = {0, 0};
    atomic_int overlap = 0;
    static caller_t c[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].pool = pool;
        c[i].id = i;
        c[i].inflight = inflight;
        c[i].overlap = &overlap;
        TEST_CHECK(pthread_create(&th[i], NULL, caller_main, &c[i]) == 0);
    }
    for (int i = 0; i < 2; i++) {
        void *ret = NULL;
        TEST_CHECK(pthread_join(th[i], &ret) == 0);
        TEST_CHECKF(ret == NULL, "caller %d: a task did not run exactly once", i);
        TEST_CHECK(c[i].runs_done == 400);
    }
    TEST_CHECKF(!atomic_load(&overlap), "tasks of two concurrent zs_pool_run calls overlapped");
    zs_pool_destroy(pool);
}

int main(void)
{
    test_basic();
    test_single_thread();
    test_default_threads();
    test_concurrent_callers();
    printf("test_pool: OK\n");
    return 0;
}
