/*
 * zs_nvme_pass.c - one optimizer pass over a tile file (zs_nvme.h): reads
 * run ahead and writes behind the update, through the tier's io_uring.
 *
 * Pipeline. Tile c uses buffer c mod D (D = the tier's depth). The loop
 *   1. queues reads of the next tiles whose buffer is free (its previous
 *      tile's write landed): the current slot and the tile's staged
 *      gradient span (two reads), and submits them with the writes of step 3;
 *   2. takes the run of consecutive read tiles at the front (up to the
 *      pool's thread count), verifies and updates them on the pool, one
 *      update call per tile, while the ring's reads and writes proceed;
 *   3. seals them (header, checksums) and queues their writes to the slot
 *      that is not current;
 *   4. reaps completions: a tile's second read marks it ready, a write hands the
 *      tile to `landed` (which flips it under the caller's lock) and frees
 *      the buffer.
 * So the reads of tiles c+1.. and the writes of tiles ..c-1 overlap the
 * update of c. Without a ring (io_uring refused, zs_nvme.c) sync_pass does
 * the same steps one batch at a time with pread/pwrite. After an error nothing new is queued or
 * updated; operations in flight are reaped before returning (the buffers belong to the tier).
 *
 * Not here: the tile format (zs_nvme.c), AdamW (the caller's update).
 */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_log.h"
#include "zs_nvme.h"
#include "zs_pool.h"

enum { B_FREE = 0, B_READING, B_READY, B_WRITING };

typedef struct {
    zs_nvme_t *nv;
    zs_nvme_state_t *s;
    zs_nvme_buf_t *bufs;
    int D;
    unsigned char **gbufs; /* per buffer: its gradient span */
    unsigned char *bst;    /* per buffer: B_* */
    unsigned char *npend;  /* per buffer: reads in flight (B_READING) */
    uint64_t step;         /* the gradients staged for it, */
    zs_dtype_t gdt;        /* in this dtype */
    zs_nvme_update_fn fn;
    void *ud;
    size_t c0; /* first tile of the batch being updated */
    int *brc;  /* per batch slot: update/verify result */
    zs_err_t *berr;
} pass_t;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Verify then update tile p->c0 + i (on the pool). */
static void update_one(void *arg, size_t i, int thread)
{
    (void)thread;
    pass_t *p = arg;
    size_t c = p->c0 + i;
    zs_nvme_buf_t *b = &p->bufs[c % (size_t)p->D];
    const unsigned char *g = p->gbufs[c % (size_t)p->D];
    p->brc[i] = zs__nvme_check(p->s, b, c, 7, &p->berr[i]);
    if (p->brc[i] == ZS_OK)
        p->brc[i] = zs__nvme_grad_check(p->s, c, p->step, p->gdt, g, &p->berr[i]);
    if (p->brc[i] == ZS_OK &&
        p->fn(p->ud, c, b->t[0], b->t[1], b->t[2], g, zs_nvme_tile_len(p->s, c)))
        p->brc[i] = zs_err_set(&p->berr[i], ZS_ERR_INTERNAL, "nvme: update of tile %zu failed", c);
    long ms = zs__nvme_test_delay_ms(p->nv);
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
}

/* The pass without io_uring: tiles whose update was written aside land
 * first; then runs of up to B consecutive other tiles are read with pread,
 * verified and updated on the pool, written aside with pwrite and landed.
 * No overlap of I/O and update. */
static int sync_pass(pass_t *p, struct zs_pool *pool, int B, size_t N, unsigned char *skipped,
                     zs_nvme_skip_fn skip, zs_nvme_landed_fn landed, void *ud, zs_err_t *err)
{
    zs_nvme_state_t *s = p->s;
    for (size_t c = 0; skip && c < N; c++)
        if (skip(ud, c)) {
            skipped[c] = 1;
            landed(ud, c, zs__nvme_flip, s);
        }
    for (size_t c = 0; c < N;) {
        if (skipped[c]) {
            c++;
            continue;
        }
        size_t k = 0;
        int rc = ZS_OK;
        while (!rc && c + k < N && (int)k < B && !skipped[c + k]) {
            zs_nvme_buf_t *b = &p->bufs[(c + k) % (size_t)p->D];
            rc = zs__nvme_io(s, 0, b->mem, ZS_NVME_SLOT,
                             zs__nvme_slot_off(c + k, zs__nvme_cur(s, c + k)), err);
            if (!rc)
                rc = zs__nvme_io(s, 0, p->gbufs[(c + k) % (size_t)p->D],
                                 zs__nvme_grad_len(s, c + k, p->gdt),
                                 zs__nvme_grad_off(s, c + k, (int)(p->step & 1)), err);
            k++;
        }
        if (rc)
            return rc;
        p->c0 = c;
        zs_pool_run(pool, k, update_one, p);
        for (size_t i = 0; i < k; i++)
            if (p->brc[i]) {
                if (err)
                    *err = p->berr[i];
                return p->brc[i];
            }
        for (size_t i = 0; i < k; i++) {
            zs_nvme_buf_t *b = &p->bufs[(c + i) % (size_t)p->D];
            zs__nvme_seal(b, c + i, zs__nvme_seq(s, c + i) + 1, zs_nvme_tile_len(s, c + i));
            rc = zs__nvme_io(s, 1, b->mem, ZS_NVME_SLOT,
                             zs__nvme_slot_off(c + i, zs__nvme_cur(s, c + i) ^ 1), err);
            if (rc)
                return rc;
            landed(ud, c + i, zs__nvme_flip, s);
        }
        c += k;
    }
    return ZS_OK;
}

int zs_nvme_pass(zs_nvme_t *nv, zs_nvme_state_t *s, uint64_t step, zs_dtype_t gdt,
                 struct zs_pool *pool, zs_nvme_update_fn fn, zs_nvme_skip_fn skip,
                 zs_nvme_landed_fn landed, void *ud, double *io_seconds, zs_err_t *err)
{
    struct io_uring *ring = zs__nvme_ring(nv);
    int D = zs_nvme_depth(nv), T = zs_pool_threads(pool);
    size_t N = zs_nvme_ntiles(s);
    int B = T < D - 2 ? T : D - 2; /* batch: leave buffers for read-ahead and write-behind */
    if (B < 1)
        B = 1;
    pass_t p = {nv,
                s,
                zs__nvme_bufs(nv),
                D,
                zs__nvme_gbufs(nv),
                calloc((size_t)D, 1),
                calloc((size_t)D, 1),
                step,
                gdt,
                fn,
                ud,
                0,
                calloc((size_t)B, sizeof(int)),
                calloc((size_t)B, sizeof(zs_err_t))};
    unsigned char *skipped = calloc(N ? N : 1, 1);
    if (!p.bst || !p.npend || !p.brc || !p.berr || !skipped) {
        free(p.bst);
        free(p.npend);
        free(p.brc);
        free(p.berr);
        free(skipped);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for a pass");
    }
    double t0 = now_s();
    if (!ring) { /* no io_uring: one batch at a time, read, update, write */
        int rc = sync_pass(&p, pool, B, N, skipped, skip, landed, ud, err);
        zs__nvme_count_pass(nv, now_s() - t0, 0);
        free(p.bst);
        free(p.npend);
        free(p.brc);
        free(p.berr);
        free(skipped);
        if (io_seconds)
            *io_seconds = 0;
        return rc;
    }
    size_t next_read = 0, next_upd = 0, nlanded = 0;
    /* Tiles whose update was written aside already land first; the others
     * never use their buffer (c mod D), so the pipeline steps over them. */
    for (size_t c = 0; skip && c < N; c++)
        if (skip(ud, c)) {
            skipped[c] = 1;
            landed(ud, c, zs__nvme_flip, s);
            nlanded++;
        }
    int inflight = 0, rc = ZS_OK, fd = zs__nvme_fd(s);
    double io_wait = 0;
    while (nlanded < N && !(rc && inflight == 0)) {
        /* 1. reads of the next tiles whose buffer is free */
        while (next_read < N && skipped[next_read])
            next_read++;
        while (!rc && next_read < N && p.bst[next_read % (size_t)D] == B_FREE) {
            if (skipped[next_read]) {
                next_read++;
                continue;
            }
            if (io_uring_sq_space_left(ring) < 2)
                break;
            size_t bi = next_read % (size_t)D;
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            io_uring_prep_read(sqe, fd, p.bufs[bi].mem, ZS_NVME_SLOT,
                               zs__nvme_slot_off(next_read, zs__nvme_cur(s, next_read)));
            io_uring_sqe_set_data64(sqe, (uint64_t)next_read << 2);
            sqe = io_uring_get_sqe(ring);
            io_uring_prep_read(sqe, fd, p.gbufs[bi], (unsigned)zs__nvme_grad_len(s, next_read, gdt),
                               zs__nvme_grad_off(s, next_read, (int)(step & 1)));
            io_uring_sqe_set_data64(sqe, (uint64_t)next_read << 2 | 2);
            p.bst[bi] = B_READING;
            p.npend[bi] = 2;
            next_read++;
            inflight += 2;
        }
        io_uring_submit(ring);
        /* 2-3. update the ready run at the front, then write it behind */
        while (next_upd < next_read && skipped[next_upd])
            next_upd++;
        size_t k = 0;
        while (!rc && next_upd + k < N && (int)k < B && next_upd + k < next_read &&
               !skipped[next_upd + k] && p.bst[(next_upd + k) % (size_t)D] == B_READY)
            k++;
        if (k > 0) {
            p.c0 = next_upd;
            zs_pool_run(pool, k, update_one, &p);
            for (size_t i = 0; i < k && !rc; i++)
                if (p.brc[i]) {
                    rc = p.brc[i];
                    if (err)
                        *err = p.berr[i];
                }
            for (size_t i = 0; i < k && !rc; i++) {
                size_t c = next_upd + i;
                zs_nvme_buf_t *b = &p.bufs[c % (size_t)D];
                zs__nvme_seal(b, c, zs__nvme_seq(s, c) + 1, zs_nvme_tile_len(s, c));
                struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
                if (!sqe) { /* cannot happen: the ring has 2 D entries */
                    io_uring_submit(ring);
                    sqe = io_uring_get_sqe(ring);
                }
                io_uring_prep_write(sqe, fd, b->mem, ZS_NVME_SLOT,
                                    zs__nvme_slot_off(c, zs__nvme_cur(s, c) ^ 1));
                io_uring_sqe_set_data64(sqe, (uint64_t)c << 2 | 1);
                p.bst[c % (size_t)D] = B_WRITING;
                inflight++;
            }
            if (!rc)
                next_upd += k;
            io_uring_submit(ring);
            continue; /* queue more reads before waiting */
        }
        if (inflight == 0)
            break; /* nothing ready, nothing pending: only after an error */
        /* 4. reap: wait for one, then take all that are there */
        struct io_uring_cqe *cqe;
        double w0 = now_s();
        int r = io_uring_wait_cqe(ring, &cqe);
        io_wait += now_s() - w0;
        if (r < 0) {
            if (r == -EINTR)
                continue;
            if (!rc)
                rc = zs_err_set(err, ZS_ERR_IO, "nvme %s: io_uring_wait_cqe: %s",
                                zs_nvme_state_path(s), strerror(-r));
            break; /* the ring is broken: nothing more will complete */
        }
        unsigned head, seen = 0;
        io_uring_for_each_cqe(ring, head, cqe)
        {
            seen++;
            inflight--;
            uint64_t d = io_uring_cqe_get_data64(cqe);
            size_t c = (size_t)(d >> 2), bi = c % (size_t)D;
            int wr = (int)(d & 1), gr = (int)(d >> 1 & 1);
            int want = gr ? (int)zs__nvme_grad_len(s, c, gdt) : (int)ZS_NVME_SLOT;
            if (cqe->res != want) {
                if (!rc)
                    rc = zs_err_set(err, cqe->res == -ENOSPC ? ZS_ERR_NOMEM : ZS_ERR_IO,
                                    "nvme %s: %s of tile %zu: %s", zs_nvme_state_path(s),
                                    wr   ? "write"
                                    : gr ? "read of the gradient"
                                         : "read",
                                    c, cqe->res < 0 ? strerror(-cqe->res) : "short transfer");
                if (wr || --p.npend[bi] == 0)
                    p.bst[bi] = B_FREE;
                continue;
            }
            zs__nvme_count(nv, wr, (uint64_t)want);
            if (wr) {
                landed(ud, c, zs__nvme_flip, s);
                nlanded++;
                p.bst[bi] = B_FREE;
            } else if (--p.npend[bi] == 0) {
                p.bst[bi] = B_READY;
            }
        }
        io_uring_cq_advance(ring, seen);
    }
    free(p.bst);
    free(p.npend);
    free(p.brc);
    free(p.berr);
    free(skipped);
    zs__nvme_count_pass(nv, now_s() - t0, io_wait);
    if (io_seconds)
        *io_seconds = io_wait;
    return rc;
}
