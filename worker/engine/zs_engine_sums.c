/*
 * zs_engine_sums.c - the checksums of pushed gradients computed where the
 * staging is written.
 *
 * Why. Over the shared staging (a co-located server) every pushed message
 * (4 MiB at most) carries an XXH3 of its bytes, which the server checks. Left
 * to the push, that hash is a second pass over the step's gradients, read
 * back from memory long after they were written: on a 2-core VM, 100 MB of
 * bf16 gradients cost the worker's core 4-8 ms per step, most of the
 * transfer budget. On a host-addressable device (the CPU device) the
 * staging is written by the host: the cast of a bucket into staging or the
 * copy of its partition. Here that write becomes one host function on the
 * copy stream (zs_engine_step.c moves the cast there, off the backward's
 * stream), which writes 64 KiB at a time and hashes each piece right
 * after, while it is in cache; the pusher hands the sums to
 * zs_client_push_sums.
 *
 * Where it does not apply: a device that is not host-addressable (CUDA: the
 * staging is written by the DMA engine, and the push hashes it as before),
 * pinned staging or a client that wants no push checksums
 * (zs_client_push_sums_wanted), MiCS groups that do not push.
 *
 * Data. Per segment, its push's messages (zs_client_push_msgs, listed at
 * each step's staging: the cut follows the servers' Hellos) and one sum
 * per message, written by the host function and read by the pusher after
 * the staging's event; `step` says which step's write was enqueued last
 * (engine thread only). A segment's sums (and its list) are rewritten only
 * by the next step's staging, after the pusher is done with them
 * (zs__eng_push_wait at the step's commit), as the staging itself.
 */
#include <stdlib.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_engine_internal.h"
#include "zs_hash.h"

#define PIECE ((uint64_t)64 << 10) /* bytes written, then hashed in cache */

struct zs__sums {
    int n;              /* messages of the segment's push */
    zs_client_msg_t *m; /* [n] */
    uint64_t *sum;      /* [n] XXH3 of each, seeded with the step */
    uint64_t step;      /* the step whose write was enqueued last; 0: none */
};

int zs__eng_sums_on(const zs_engine_t *e)
{
    return e->shm_staging && e->dev->host_addressable && e->rgroup == 0 &&
           zs_client_push_sums_wanted(e->client);
}

void zs__eng_sums_free(zs_engine_t *e)
{
    for (int j = 0; e->sums && j < e->ns; j++) {
        free(e->sums[j].m);
        free(e->sums[j].sum);
    }
    free(e->sums);
    e->sums = NULL;
}

/* Segment j's message list, listed again at each use: the cut follows
 * each server's last Hello (a server restarted as an older version cuts
 * at 4 MiB instead of 16). */
static int sums_of(zs_engine_t *e, int j, zs__sums_t **out, zs_err_t *err)
{
    if (!e->sums && !(e->sums = calloc((size_t)e->ns, sizeof *e->sums)))
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    zs__sums_t *u = &e->sums[j];
    const zs__seg_t *s = &e->s[j];
    if (s->ve > s->vb) {
        uint64_t lo = s->off + s->vb, hi = s->off + s->ve;
        int n;
        ZS_ENG_TRY(zs_client_push_msgs(e->client, lo, hi, e->dt, NULL, 0, &n, err));
        if (n != u->n || !u->m) {
            free(u->m);
            free(u->sum);
            u->n = 0;
            u->m = calloc((size_t)n, sizeof *u->m);
            u->sum = calloc((size_t)n, sizeof *u->sum);
            if (!u->m || !u->sum)
                return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        }
        ZS_ENG_TRY(zs_client_push_msgs(e->client, lo, hi, e->dt, u->m, n, &u->n, err));
    }
    *out = u;
    return ZS_OK;
}

/* One message being hashed: bytes [b, e) of the written range. */
typedef struct {
    uint64_t b, e;
    uint64_t *out;
} msg_t;

typedef struct {
    zs_engine_t *e;
    char *dst;
    const char *src;
    zs_dtype_t ddt, sdt;
    uint64_t n; /* elements */
    int j0, j1;
    uint64_t step;
} write_args_t;

/* The host function: write args->n elements in pieces, hashing each
 * message of segments [j0, j1] as its bytes are written. */
static int write_hash(void *argp, zs_err_t *err)
{
    const write_args_t *a = argp;
    zs_engine_t *e = a->e;
    size_t dsz = zs_dtype_size(a->ddt), ssz = zs_dtype_size(a->sdt);
    uint64_t total = a->n * dsz;
    int nm = 0;
    for (int j = a->j0; j <= a->j1; j++)
        nm += e->sums[j].n;
    msg_t *m = calloc((size_t)nm + 1, sizeof *m);
    if (!m)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    /* Segments lie in the staging in order, and so do a segment's messages:
     * the list comes out sorted, which the walk below needs. */
    nm = 0;
    uint64_t prev = 0;
    for (int j = a->j0; j <= a->j1; j++) {
        const zs__seg_t *s = &e->s[j];
        const zs__sums_t *u = &e->sums[j];
        /* element x of the segment's push lies at staging slot qbase + (x - off - vb) */
        char *seg = zs__at(e, e->staging, s->qbase);
        for (int k = 0; k < u->n; k++) {
            int64_t b = (seg - a->dst) + (int64_t)((u->m[k].begin - s->off - s->vb) * dsz);
            uint64_t len = u->m[k].count * dsz;
            if (b < (int64_t)prev || (uint64_t)b + len > total) {
                free(m);
                return zs_err_set(err, ZS_ERR_INTERNAL,
                                  "segment %d's message %d lies outside the staging write or "
                                  "before the message ahead of it",
                                  j, k);
            }
            m[nm++] = (msg_t){(uint64_t)b, (uint64_t)b + len, &u->sum[k]};
            prev = (uint64_t)b + len;
        }
    }
    zs_hash_stream_t hs, *h = &hs;
    int cur = 0, open = 0; /* m[cur] is the next message to finish; open: h is reset for it */
    for (uint64_t at = 0; at < total; at += PIECE) {
        uint64_t k = total - at < PIECE ? total - at : PIECE; /* a multiple of dsz */
        if (a->ddt == a->sdt)
            memcpy(a->dst + at, a->src + at, k);
        else
            zs_cast(a->dst + at, a->ddt, a->src + at / dsz * ssz, a->sdt, k / dsz);
        while (cur < nm && m[cur].b < at + k) {
            if (!open) {
                zs_hash_stream_reset(h, a->step);
                open = 1;
            }
            uint64_t b = m[cur].b > at ? m[cur].b : at;
            uint64_t z = m[cur].e < at + k ? m[cur].e : at + k;
            zs_hash_stream_update(h, a->dst + b, z - b);
            if (m[cur].e > at + k)
                break; /* it goes on in the next piece */
            *m[cur].out = zs_hash_stream_digest(h);
            open = 0;
            cur++;
        }
    }
    free(m); /* every message ended inside the write (checked above) */
    return ZS_OK;
}

int zs__eng_sums_write(zs_engine_t *e, zs_stream_t *s, void *dst, const void *src, zs_dtype_t sdt,
                       uint64_t n, int j0, int j1, uint64_t step, zs_err_t *err)
{
    for (int j = j0; j <= j1; j++) {
        zs__sums_t *u = NULL;
        ZS_ENG_TRY(sums_of(e, j, &u, err));
        u->step = step;
    }
    write_args_t a = {e, dst, src, e->dt, sdt, n, j0, j1, step};
    return zs_dev_host_fn(s, write_hash, &a, sizeof a, err);
}

int zs__eng_sums_get(const zs_engine_t *e, int j, uint64_t step, const uint64_t **sums, int *n)
{
    const zs__sums_t *u = e->sums ? &e->sums[j] : NULL;
    if (!u || u->step != step || !u->sum)
        return 0;
    *sums = u->sum;
    *n = u->n;
    return 1;
}
