/*
 * zs_pool.c - fixed thread pool for data-parallel loops (see zs_pool.h).
 *
 * Threads sleep on a condition variable between jobs. A job is (fn, arg,
 * ntasks) plus an atomic cursor; every thread, the caller included, claims
 * tasks from the cursor until it passes ntasks. The caller returns after all
 * spawned threads have reported the job finished. `generation` tells sleeping
 * threads that a new job arrived.
 */
#include "zs_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct zs_pool {
    int nthreads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* new job or shutdown */
    pthread_cond_t done;    /* a thread finished its share */
    pthread_mutex_t run_mu; /* serialises zs_pool_run callers */
    unsigned long generation;
    int busy; /* spawned threads still working on the current job */
    int stop;
    zs_pool_fn fn;
    void *arg;
    size_t ntasks;
    atomic_size_t cursor;
};

typedef struct {
    zs_pool_t *pool;
    int index;
} thread_arg_t;

static void drain(zs_pool_t *p, int thread)
{
    for (;;) {
        size_t t = atomic_fetch_add_explicit(&p->cursor, 1, memory_order_relaxed);
        if (t >= p->ntasks)
            break;
        p->fn(p->arg, t, thread);
    }
}

static void *thread_main(void *argp)
{
    thread_arg_t a = *(thread_arg_t *)argp;
    free(argp);
    zs_pool_t *p = a.pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, a.index);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

zs_pool_t *zs_pool_create(int nthreads)
{
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    zs_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        thread_arg_t *a = malloc(sizeof *a);
        if (a) {
            a->pool = p;
            a->index = i;
        }
        if (!a || pthread_create(&p->threads[i], NULL, thread_main, a) != 0) {
            free(a);
            p->nthreads = i; /* destroy joins the ones that started */
            zs_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

void zs_pool_destroy(zs_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->threads);
    free(p);
}

int zs_pool_threads(const zs_pool_t *p)
{
    return p->nthreads;
}

void zs_pool_run(zs_pool_t *p, size_t ntasks, zs_pool_fn fn, void *arg)
{
    if (ntasks == 0)
        return;
    pthread_mutex_lock(&p->run_mu);
    if (p->nthreads == 1 || ntasks == 1) {
        for (size_t t = 0; t < ntasks; t++)
            fn(arg, t, 0);
        pthread_mutex_unlock(&p->run_mu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    atomic_store(&p->cursor, 0);
    p->busy = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    drain(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->busy > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
