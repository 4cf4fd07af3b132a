/*
 * zs_store_io.c - writing and reading checkpoints (zs_store_write,
 * zs_store_read, zs_store_read_meta); layout and rationale in zs_store.c.
 *
 * Write: validate, refuse an existing step, drop stale chunks of an earlier
 * failed attempt, put each 1 MiB chunk (+ XXH3 seeded with its identity) in
 * its own batch with the WAL off, flush the chunk family (wait=1), then put
 * the marker with sync=1. Any failure drops the step again (best effort).
 * Read: verify the marker, then READ_THREADS threads each get (pinned; with
 * mmap reads the value points into the mapped SST, nothing is allocated),
 * copy a contiguous slice of the chunks into the caller's arrays, hashing
 * each piece right after copying it (size and XXH3 with identity checked);
 * the first failing chunk in order is reported.
 * A failed write marks the store degraded; the next write reopens it first
 * (zs_store_recover.c).
 * Does not: keep any state between calls (but the degraded mark), retry, or
 * allocate beyond one marker buffer and the reader threads.
 */
#include "zs_store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "zs_hash.h"
#include "zs_log.h"

#define READ_THREADS 4 /* concurrent chunk reads in zs_store_read: keeps the disk busy */

/* Seed of a chunk's XXH3: the hash of its identity and length. */
static uint64_t chunk_seed(uint64_t step, int t, uint64_t c, size_t len)
{
    unsigned char id[32];
    zs__put_le64(id, step);
    zs__put_le32(id + 8, (uint32_t)t);
    zs__put_le32(id + 12, HDR_MAGIC);
    zs__put_le64(id + 16, c);
    zs__put_le64(id + 24, (uint64_t)len);
    return XXH3_64bits(id, sizeof id);
}

static uint64_t chunk_sum(uint64_t step, int t, uint64_t c, const void *p, size_t len)
{
    return zs_hash64(p, len, chunk_seed(step, t, c, len));
}

/* dst := src and return chunk_sum of it, in one pass over memory (each
 * piece hashed from dst right after its copy, while it is in cache). */
static uint64_t copy_and_sum(uint64_t step, int t, uint64_t c, char *dst, const char *src,
                             size_t len)
{
    return zs_hash64_copy(dst, src, len, chunk_seed(step, t, c, len));
}

static uint64_t n_chunks(uint64_t n)
{
    uint64_t bytes = n * sizeof(float);
    return (bytes + ZS_STORE_CHUNK_BYTES - 1) / ZS_STORE_CHUNK_BYTES;
}

static size_t chunk_len(uint64_t n, uint64_t c)
{
    uint64_t left = n * sizeof(float) - c * ZS_STORE_CHUNK_BYTES;
    return (size_t)(left < ZS_STORE_CHUNK_BYTES ? left : ZS_STORE_CHUNK_BYTES);
}

static void encode_header(unsigned char *h, uint64_t step, uint64_t n, const void *meta,
                          size_t meta_len)
{
    zs__put_le32(h + 0, HDR_MAGIC);
    zs__put_le32(h + 4, HDR_VERSION);
    zs__put_le64(h + 8, n);
    zs__put_le32(h + 16, ZS_STORE_CHUNK_BYTES);
    zs__put_le32(h + 20, 0);
    zs__put_le64(h + 24, (uint64_t)meta_len);
    zs__put_le64(h + 32, XXH3_64bits(meta_len ? meta : "", meta_len));
    zs__put_le64(h + 40, XXH3_64bits_withSeed(h, 40, step));
}

/* 1 if any chunk key of `step` exists, 0 if none, <0 on error. */
static int range_has_keys(zs_store_t *st, uint64_t step, zs_err_t *err)
{
    char lo[ZS__KEY_MAX], hi[ZS__KEY_MAX], *e = NULL;
    size_t len = zs__step_range(step, lo, hi);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_readoptions_set_iterate_upper_bound(ro, hi, len);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(st->db, ro, st->cf[CF_DATA]);
    rocksdb_iter_seek(it, lo, len);
    int any = rocksdb_iter_valid(it) ? 1 : 0;
    rocksdb_iter_get_error(it, &e);
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    int rc = ZS_ROCKS_CHECK(e, err, "seek chunks", "is the store directory readable?");
    return rc ? rc : any;
}

/* ---- write --------------------------------------------------------------- */

static void test_hook_before_marker(zs_store_t *st, uint64_t step)
{
    const char *s = getenv("ZS_STORE_TEST_MARKER_DELAY_MS");
    long ms = s ? strtol(s, NULL, 10) : 0;
    if (ms <= 0)
        return;
    ZS_WARN("store %s: test hook: step %llu chunks durable, waiting %ld ms before its marker",
            st->dir, (unsigned long long)step, ms);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int check_ckpt(const zs_store_t *st, const zs_store_ckpt_t *ck, zs_err_t *err)
{
    if (!st || !ck)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_write: store or checkpoint is NULL");
    if (ck->n == 0 || ck->n > N_MAX)
        return zs_err_set(err, ZS_ERR_RANGE, "zs_store_write: n=%llu outside 1..%llu",
                          (unsigned long long)ck->n, (unsigned long long)N_MAX);
    for (int t = 0; t < 3; t++)
        if (!ck->tensors[t] && !ck->fill)
            return zs_err_set(err, ZS_ERR_INVALID, "zs_store_write: tensor %s is NULL",
                              zs__tensor_name[t]);
    if (ck->meta_len > META_MAX)
        return zs_err_set(err, ZS_ERR_RANGE, "zs_store_write: meta_len %zu > %u", ck->meta_len,
                          META_MAX);
    if (ck->meta_len > 0 && !ck->meta)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_write: meta is NULL, meta_len %zu",
                          ck->meta_len);
    return ZS_OK;
}

static int write_chunks(zs_store_t *st, const zs_store_ckpt_t *ck, zs_err_t *err)
{
    char *fbuf = ck->fill ? malloc(ZS_STORE_CHUNK_BYTES) : NULL;
    if (ck->fill && !fbuf)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_store_write: out of memory for a chunk");
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    uint64_t nc = n_chunks(ck->n);
    int rc = ZS_OK;
    for (int t = 0; t < 3 && rc == ZS_OK; t++) {
        for (uint64_t c = 0; c < nc && rc == ZS_OK; c++) {
            char key[ZS__KEY_MAX], *e = NULL;
            unsigned char sum[SUM_BYTES];
            size_t klen = zs__chunk_key(key, ck->step, t, c), len = chunk_len(ck->n, c);
            const char *p = fbuf;
            if (!fbuf)
                p = (const char *)ck->tensors[t] + c * ZS_STORE_CHUNK_BYTES;
            else if ((rc = ck->fill(ck->fill_ud, t, c * ZS_STORE_CHUNK_BYTES, fbuf, len, err)))
                break;
            zs__put_le64(sum, chunk_sum(ck->step, t, c, p, len));
            const char *k[1] = {key}, *v[2] = {p, (const char *)sum};
            size_t kl[1] = {klen}, vl[2] = {len, SUM_BYTES};
            rocksdb_writebatch_clear(b);
            rocksdb_writebatch_putv_cf(b, st->cf[CF_DATA], 1, k, kl, 2, v, vl);
            rocksdb_write(st->db, st->wo_nowal, b, &e);
            rc = ZS_ROCKS_CHECK(e, err, "write chunk", "disk full or read-only?");
            if (rc)
                zs_err_prefix(err, "%s chunk %llu: ", zs__tensor_name[t], (unsigned long long)c);
        }
    }
    rocksdb_writebatch_destroy(b);
    free(fbuf);
    return rc;
}

/* Best effort after a failed write: drop this step's marker (should a failed
 * synced put have left one in the memtable) and chunks again. */
static void undo_step(zs_store_t *st, uint64_t step)
{
    zs_err_t e2;
    if (zs__delete_steps(st, &step, 1, &e2)) {
        ZS_WARN("store %s: could not drop the chunks of failed step %llu (%s); the next open "
                "removes them",
                st->dir, (unsigned long long)step, e2.msg);
        return;
    }
    zs__reclaim(st, step, step);
}

/* See zs_store.h. */
int zs_store_write(zs_store_t *st, const zs_store_ckpt_t *ck, zs_err_t *err)
{
    int rc = check_ckpt(st, ck, err);
    if (!rc)
        rc = zs__store_recover(st, 3 * sizeof(float) * ck->n, err);
    if (rc)
        return rc;
    zs__marker_t m;
    rc = zs__load_marker(st, ck->step, &m, NULL, NULL, err);
    if (rc == ZS_OK || rc == ZS_ERR_CORRUPT)
        return zs_err_set(err, ZS_ERR_EXISTS,
                          "store %s: a checkpoint of step %llu exists already%s; delete it first",
                          st->dir, (unsigned long long)ck->step,
                          rc == ZS_OK ? "" : " (with a corrupt marker)");
    if (rc != ZS_ERR_NOTFOUND)
        return zs__store_failed(st, rc, err);

    /* Chunks of an earlier failed attempt at this step (n may have differed). */
    rc = range_has_keys(st, ck->step, err);
    if (rc < 0)
        return zs__store_failed(st, rc, err);
    char *e = NULL;
    if (rc == 1) {
        char lo[ZS__KEY_MAX], hi[ZS__KEY_MAX];
        size_t len = zs__step_range(ck->step, lo, hi);
        rocksdb_writebatch_t *b = rocksdb_writebatch_create();
        rocksdb_writebatch_delete_range_cf(b, st->cf[CF_DATA], lo, len, hi, len);
        rocksdb_write(st->db, st->wo_nowal, b, &e);
        rocksdb_writebatch_destroy(b);
        if ((rc = ZS_ROCKS_CHECK(e, err, "drop stale chunks", "disk full or read-only?")))
            return zs__store_failed(st, rc, err);
    }

    rc = write_chunks(st, ck, err);
    if (rc == ZS_OK) {
        rocksdb_flush_cf(st->db, st->fo, st->cf[CF_DATA], &e);
        rc = ZS_ROCKS_CHECK(e, err, "flush chunks", "disk full or read-only?");
    }
    if (rc == ZS_OK) {
        char lo[ZS__KEY_MAX], hi[ZS__KEY_MAX];
        size_t len = zs__step_range(ck->step, lo, hi);
        zs__settle(st, lo, len, hi, len); /* L0 -> L1, metadata only */
    }
    if (rc == ZS_OK) {
        test_hook_before_marker(st, ck->step);
        size_t vlen = HDR_BYTES + ck->meta_len;
        unsigned char *v = malloc(vlen);
        if (!v) {
            rc = zs_err_set(err, ZS_ERR_NOMEM, "zs_store_write: out of memory for the marker");
        } else {
            char key[ZS__KEY_MAX];
            size_t klen = zs__marker_key(key, ck->step);
            encode_header(v, ck->step, ck->n, ck->meta, ck->meta_len);
            if (ck->meta_len)
                memcpy(v + HDR_BYTES, ck->meta, ck->meta_len);
            rocksdb_put_cf(st->db, st->wo_sync, st->cf[CF_META], key, klen, (const char *)v, vlen,
                           &e);
            free(v);
            rc = ZS_ROCKS_CHECK(e, err, "put marker", "disk full or read-only?");
        }
    }
    if (rc) {
        zs_err_prefix(err, "store %s: checkpoint of step %llu not written: ", st->dir,
                      (unsigned long long)ck->step);
        undo_step(st, ck->step);
        zs__store_failed(st, rc, err);
    }
    return rc;
}

/* See zs_store.h. */
int zs_store_read_meta(zs_store_t *st, uint64_t step, void **meta, size_t *meta_len, uint64_t *n,
                       zs_err_t *err)
{
    if (!st || !meta || !meta_len || !n)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_read_meta: NULL argument");
    *meta = NULL;
    *meta_len = 0;
    zs__marker_t m;
    rocksdb_pinnableslice_t *pin = NULL;
    const unsigned char *blob = NULL;
    int rc = zs__load_marker(st, step, &m, &pin, &blob, err);
    if (rc)
        return rc;
    if (XXH3_64bits(m.meta_len ? (const void *)blob : "", m.meta_len) != m.meta_sum) {
        rocksdb_pinnableslice_destroy(pin);
        return zs_err_set(err, ZS_ERR_CORRUPT, "store %s: meta of step %llu fails its checksum",
                          st->dir, (unsigned long long)step);
    }
    void *copy = malloc(m.meta_len ? m.meta_len : 1);
    if (!copy) {
        rocksdb_pinnableslice_destroy(pin);
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_store_read_meta: out of memory");
    }
    if (m.meta_len)
        memcpy(copy, blob, m.meta_len);
    rocksdb_pinnableslice_destroy(pin);
    *meta = copy;
    *meta_len = (size_t)m.meta_len;
    *n = m.n;
    return ZS_OK;
}

static int read_chunk(zs_store_t *st, uint64_t step, int t, uint64_t c, char *dst, size_t len,
                      zs_err_t *err)
{
    char key[ZS__KEY_MAX], *e = NULL;
    size_t klen = zs__chunk_key(key, step, t, c), vlen = 0;
    rocksdb_pinnableslice_t *p =
        rocksdb_get_pinned_cf(st->db, st->ro_chunk, st->cf[CF_DATA], key, klen, &e);
    int rc = ZS_ROCKS_CHECK(e, err, "get chunk", "is the store directory readable?");
    if (rc)
        return zs_err_prefix(err, "step %llu %s chunk %llu: ", (unsigned long long)step,
                             zs__tensor_name[t], (unsigned long long)c);
    if (!p)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "store %s: step %llu: tensor %s chunk %llu is missing", st->dir,
                          (unsigned long long)step, zs__tensor_name[t], (unsigned long long)c);
    const char *v = rocksdb_pinnableslice_value(p, &vlen);
    if (vlen != len + SUM_BYTES)
        rc = zs_err_set(err, ZS_ERR_CORRUPT,
                        "store %s: step %llu: tensor %s chunk %llu has %zu bytes, expected %zu",
                        st->dir, (unsigned long long)step, zs__tensor_name[t],
                        (unsigned long long)c, vlen, len + SUM_BYTES);
    else if (zs__get_le64((const unsigned char *)v + len) != copy_and_sum(step, t, c, dst, v, len))
        rc =
            zs_err_set(err, ZS_ERR_CORRUPT,
                       "store %s: step %llu: tensor %s chunk %llu fails its XXH3 checksum", st->dir,
                       (unsigned long long)step, zs__tensor_name[t], (unsigned long long)c);
    rocksdb_pinnableslice_destroy(p);
    return rc;
}

/* See zs_store.h. */
int zs_store_read_chunk(zs_store_t *st, uint64_t step, uint64_t n, int t, uint64_t c, void *dst,
                        size_t *len, zs_err_t *err)
{
    zs__marker_t m;
    int rc = zs__load_marker(st, step, &m, NULL, NULL, err);
    if (rc)
        return rc;
    if (m.n != n || t < 0 || t > 2 || c >= n_chunks(n))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "store %s: step %llu holds n=%llu elements per tensor; caller asked "
                          "for chunk %llu of tensor %d of n=%llu",
                          st->dir, (unsigned long long)step, (unsigned long long)m.n,
                          (unsigned long long)c, t, (unsigned long long)n);
    *len = chunk_len(n, c);
    return read_chunk(st, step, t, c, dst, *len, err);
}

typedef struct {
    zs_store_t *st;
    float *const *dst;
    uint64_t step, n, nc, fail_at; /* fail_at: tensor * nc + chunk of its first failure */
    int id, nthreads, rc;
    zs_err_t err;
    pthread_t tid;
} reader_t;

/* Reads the id-th of nthreads contiguous slices of the 3 * nc chunks: each
 * thread streams through its own SST files, so kernel readahead keeps up
 * (interleaving chunks across threads measured ~20% slower cold). */
static void *read_worker(void *arg)
{
    reader_t *r = arg;
    uint64_t tot = 3 * r->nc;
    uint64_t lo = tot * (uint64_t)r->id / (uint64_t)r->nthreads;
    uint64_t hi = tot * (uint64_t)(r->id + 1) / (uint64_t)r->nthreads;
    for (uint64_t i = lo; i < hi; i++) {
        int t = (int)(i / r->nc);
        uint64_t c = i % r->nc;
        r->rc = read_chunk(r->st, r->step, t, c, (char *)r->dst[t] + c * ZS_STORE_CHUNK_BYTES,
                           chunk_len(r->n, c), &r->err);
        if (r->rc) {
            r->fail_at = i;
            break;
        }
    }
    return NULL;
}

/* See zs_store.h. */
int zs_store_read(zs_store_t *st, uint64_t step, float *const dst[3], uint64_t n, zs_err_t *err)
{
    if (!st || !dst || !dst[0] || !dst[1] || !dst[2])
        return zs_err_set(err, ZS_ERR_INVALID, "zs_store_read: NULL argument");
    zs__marker_t m;
    int rc = zs__load_marker(st, step, &m, NULL, NULL, err);
    if (rc)
        return rc;
    if (m.n != n)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "store %s: step %llu holds n=%llu elements per tensor, caller asked "
                          "for %llu",
                          st->dir, (unsigned long long)step, (unsigned long long)m.n,
                          (unsigned long long)n);
    reader_t r[READ_THREADS];
    bool started[READ_THREADS] = {false};
    uint64_t nc = n_chunks(n);
    int nt = READ_THREADS;
    if ((uint64_t)nt > 3 * nc)
        nt = (int)(3 * nc);
    for (int i = 0; i < nt; i++)
        r[i] = (reader_t){.st = st,
                          .dst = dst,
                          .step = step,
                          .n = n,
                          .nc = nc,
                          .fail_at = UINT64_MAX,
                          .id = i,
                          .nthreads = nt};
    for (int i = 1; i < nt; i++)
        started[i] = pthread_create(&r[i].tid, NULL, read_worker, &r[i]) == 0;
    read_worker(&r[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(r[i].tid, NULL);
        else
            read_worker(&r[i]); /* no thread for this slice: read it here */
    }
    int first = -1;
    for (int i = 0; i < nt; i++)
        if (r[i].rc && (first < 0 || r[i].fail_at < r[first].fail_at))
            first = i;
    if (first < 0)
        return ZS_OK;
    if (err)
        *err = r[first].err;
    return r[first].rc;
}
